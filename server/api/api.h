/*
 * api.h: the public header of server/api/: the OpenAI-compatible API layer (prefix srv_api_; the daemon's other
 * folders and tests include this header only).
 *
 * Three parts:
 *   1. Request validation (api_parse.c, api_base.c): pure functions that turn a JSON body into a srv_api_gen or
 *      an srv_api_error (HTTP status, message naming the field, OpenAI error type, param). No I/O, no engine.
 *   2. What the daemon sets up for it: the model's tool-call format (tool_format.c) and its grammar cache
 *      (grammar_cache.c).
 *   3. Routing and responses (api_routes.c and the route files): an srv_http handler that serves
 *      /v1/completions, /v1/chat/completions, /v1/responses, /v1/embeddings, /v1/models (and the same without
 *      /v1), /v1/messages and /v1/messages/count_tokens (Anthropic's API, errors in its shape; also without /v1), /infill, /health (and /v1/health), /metrics, /tokenize, /detokenize, /props and the chat page at /
 *      over a srv_api_backend (the scheduler and the model in the daemon; a fake in tests). OPTIONS on any of
 *      them is a CORS preflight, answered 204 (server/http/http.h).
 * Inside the folder (its private headers: api_internal.h, api_gen_internal.h, api_routes_internal.h, and one
 * *_internal.h per mapping), files depend downward only: routes -> the generation pipeline -> a call's lifecycle
 * (api_call.c) -> the base (api_base.c).
 *
 * Threads: everything runs on the loop thread (the backend's callbacks too: srv_sched delivers its events
 * there), except the preparation of requests, which runs on libuv's thread pool.
 */
#ifndef KVSERVE_SERVER_API_H
#define KVSERVE_SERVER_API_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "common/common.h"

#include "engine/engine.h"
#include "server/http/http.h"
#include "server/obs/obs.h"
#include "server/sched/sched.h"
#include "grammar/grammar.h"

enum {
    SRV_API_OK = KVS_OK,
    SRV_API_ERR_INVALID = KVS_ERR_INVALID, /* the request is invalid: see the srv_api_error */
    SRV_API_ERR_NOMEM = KVS_ERR_NOMEM,
};

/* ---- 1. validation ---------------------------------------------------------------------------------------- */
typedef enum { SRV_API_COMPLETION = 0, SRV_API_CHAT = 1 } srv_api_kind;

typedef struct srv_api_error {
    int status;                 /* HTTP status: 400, 401, 404, 405, 413, 500, 503 */
    const char *type;           /* "invalid_request_error", "authentication_error", "server_error", ... */
    char message[512];
    char param[64];             /* the offending field ("" when none: JSON null) */
    const char *code;           /* NULL or e.g. "context_length_exceeded", "invalid_api_key" */
} srv_api_error;

typedef struct srv_api_prompt {
    char *text;                 /* a text prompt (NULL when tokens) */
    int32_t *tokens;            /* a token-id prompt (NULL when text) */
    int32_t n_tokens;
} srv_api_prompt;

/* response_format (server/api/api_structured.c): text (no constraint), json_object (any JSON object), json_schema
 * (a JSON Schema; compiled through grammar/ before the request is queued). */
typedef enum { SRV_API_RF_TEXT = 0, SRV_API_RF_JSON_OBJECT = 1, SRV_API_RF_JSON_SCHEMA = 2 } srv_api_rf;

typedef struct srv_api_msg { char *role; char *content; } srv_api_msg;

typedef struct srv_api_limits {
    int32_t n_vocab;            /* token ids must be < n_vocab (0: unchecked) */
    int32_t max_n;              /* most choices per prompt (n), >= 1 */
    int32_t max_stop;           /* most stop strings (default 16) */
    int32_t max_prompts;        /* most prompts in one /v1/completions array (default 64) */
    bool priority_scheduling;   /* scheduling_policy "priority": a request's `priority` may be any int32;
                                   false (default, "fcfs"): only 0 is accepted (400 otherwise, as vLLM) */
    uint32_t template_ms;       /* wall-clock budget of one chat-template render (default 5000; 0: none) */
    size_t template_bytes;      /* bytes one render may allocate in all (default 1 GiB; 0: none) */
    int32_t text_jobs;          /* /tokenize, /detokenize jobs on the thread pool at once (default 1; libuv's pool
                                   has UV_THREADPOOL_SIZE, default 4, threads: the rest stay for generation) */
    int32_t text_queue;         /* text jobs waiting for a slot; past it a 503 with Retry-After (default 16) */
    size_t text_answer_bytes;   /* largest /tokenize or /detokenize answer: past it the request is a 413 naming the
                                   limit (default 32 MiB; 0: none). Bounds what a body may amplify to (pieces) */
} srv_api_limits;

typedef struct srv_api_gen {
    srv_api_kind kind;
    char *model;                /* NULL when absent */
    srv_api_prompt *prompts; int32_t n_prompts;    /* completions: >= 1 */
    srv_api_msg *msgs; int32_t n_msgs;              /* chat: >= 1 */
    int32_t max_tokens;         /* >= 1; -1 when absent (chat: until the context ends) */
    int32_t n;                  /* 1 .. max_n */
    eng_sampling_params sampling; /* the request's sampler settings (eng_sampling_params_default, then from the
                                   body): temperature 0 .. 2, top_p [0, 1], top_k -1 or 0: off, min_p 0 .. 1,
                                   presence/frequency_penalty -2 .. 2, repetition_penalty (0, 10]. Its seed,
                                   logit_bias and n_top_logprobs are api_fill_request's (from the fields below) */
    bool has_seed; uint64_t seed;
    char **stop; int32_t n_stop;
    eng_logit_bias *logit_bias; int32_t n_logit_bias;
    bool logprobs;              /* completions: "logprobs" given; chat: "logprobs": true */
    int32_t top_logprobs;       /* 0..KVS_MAX_TOP_LOGPROBS (completions: the logprobs value) */
    bool stream, include_usage, ignore_eos, echo;
    bool has_n_keep; int32_t n_keep; /* "n_keep" (llama.cpp's): prompt tokens a context shift keeps, BOS not
                                        counted; -1: the whole prompt. Absent: the server's default */
    int32_t spec_n_max, spec_n_min; /* "speculative.n_max" / "speculative.n_min" (llama.cpp's flat keys): the most /
                                       fewest tokens guessed per step when the server speculates (--spec-type),
                                       0..32 (n_max 0: no speculation for this request); -1 when absent */
    char *user;
    char *suffix;               /* completions: fill-in-the-middle suffix (NULL when absent); the prompt is then
                                   the model's FIM prompt (server/api/api_fim.c) */
    srv_api_rf rf;              /* response_format (SRV_API_RF_TEXT when absent) */
    char *rf_schema;            /* json_schema: the schema as unformatted JSON (the grammar cache's key) */
    struct srv_chat_req *chat;  /* chat: messages, tools and tool_choice for the template (api/chat_internal.h) */
    int32_t priority;           /* vLLM's `priority` (lower is more urgent), default 0; nonzero only when
                                   limits.priority_scheduling */
    bool has_reasoning_format;  /* chat: the request's `reasoning_format` (llama.cpp's field) was given */
    int reasoning_format;       /* then: a srv_reasoning_format (declared below) */
} srv_api_gen;

void srv_api_limits_default(srv_api_limits *l);

/* Parses and validates a request body of the given kind. On success fills *out (free with srv_api_gen_free)
 * and returns SRV_API_OK; otherwise fills *err and returns SRV_API_ERR_INVALID (or SRV_API_ERR_NOMEM, err
 * then says so with status 500). Never reads past body[len]. */
int srv_api_parse_gen(srv_api_kind kind, const char *body, size_t len, const srv_api_limits *lim,
                      srv_api_gen *out, srv_api_error *err);
/* The same from a parsed body (root: a cJSON object, not modified; /v1/responses maps its body onto a chat one,
 * server/api/responses_map_internal.h). */
struct cJSON;
int srv_api_parse_gen_json(srv_api_kind kind, const struct cJSON *root, const srv_api_limits *lim,
                           srv_api_gen *out, srv_api_error *err);
/* A JSON value's type for error messages: "a string", "a number", "a boolean", "an array", "an object", "null". */
const char *srv_api_json_kind(const struct cJSON *j);
/* The member `name` of object o; NULL when o is not an object, has no such member or it is JSON null (which every
 * field of a request body reads as absent). */
const struct cJSON *srv_api_json_field(const struct cJSON *o, const char *name);
/* The string value of member `name` of object o (srv_api_json_field), or NULL when absent or not a string. */
const char *srv_api_json_str(const struct cJSON *o, const char *name);
void srv_api_gen_free(srv_api_gen *g);
/* The strict JSON pass every body goes through before cJSON (server/api/json_check_internal.h): invalid escapes, lone
 * surrogates, \u0000, raw control characters, invalid UTF-8 and bad grammar are rejected. Returns SRV_API_OK,
 * or SRV_API_ERR_INVALID with a 400 in *err whose message names the problem and its byte offset. */
int srv_api_check_json(const char *body, size_t len, srv_api_error *err);
/* Duplicate keys in a parsed body (json_check.c, srv_json_check_dup_keys): SRV_API_OK, or
 * SRV_API_ERR_INVALID with a 400 naming the key and where it is (SRV_API_ERR_NOMEM, a 500, when out of memory).
 * Every body goes through it after cJSON. */
int srv_api_check_dup_keys(const struct cJSON *root, srv_api_error *err);

/* Fills an error (printf-style message). */
void srv_api_set_error(srv_api_error *err, int status, const char *type, const char *param, const char *code,
                       const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Fills err with the 500 "out of memory" answer (type server_error); returns SRV_API_ERR_NOMEM. */
int srv_api_set_nomem(srv_api_error *err);
/* The OpenAI error JSON {"error":{"message","type","param","code"}}; malloc'd, NULL on OOM. */
char *srv_api_error_json(const srv_api_error *err);
/* Anthropic's error JSON {"type":"error","error":{"type","message"}}, the type from the status: 400 (and other
 * 4xx not below) invalid_request_error, 401 authentication_error, 403 permission_error, 404 not_found_error,
 * 408 timeout_error, 413 request_too_large, 429 rate_limit_error, 503 and 529 overloaded_error, other 5xx
 * api_error. malloc'd, NULL on OOM. */
char *srv_api_error_json_anthropic(const srv_api_error *err);
/* Whether errors on this path are written in Anthropic's shape: /v1/messages, /messages and the paths under
 * them. */
bool srv_api_path_anthropic(const char *path);

/* ---- 2. what the daemon sets up for the API ------------------------------------------------------------------
 * How the model writes tool calls (api/tool_format.c; the rest of it is private: api/tool_format_internal.h).
 * Formats (what constrained output looks like; N a tool's name as a JSON string, A its arguments, a JSON
 * object valid against its `parameters` schema):
 *   HERMES   <tool_call>\n{"name": N, "arguments": A}\n</tool_call>          (Qwen, Hermes; several: joined by \n)
 *   LLAMA3   {"name": N, "parameters": A}                                  (Llama 3.x JSON tool calling; several:
 *                                                                          a JSON array of them)
 *   MISTRAL  [TOOL_CALLS][{"name": N, "arguments": A}, ...]
 *   GENERIC  {"name": N, "arguments": A}                                   (several: a JSON array of them)
 * Mistral's [TOOL_CALLS] and, in some vocabularies, <tool_call> are special tokens that a grammar never allows:
 * the constrained output spells them out in ordinary tokens (the same text). */
typedef enum {
    SRV_TOOL_FORMAT_GENERIC = 0,
    SRV_TOOL_FORMAT_HERMES = 1,
    SRV_TOOL_FORMAT_LLAMA3 = 2,
    SRV_TOOL_FORMAT_MISTRAL = 3,
} srv_tool_format;

/* The format for a chat template text (NULL: none) rendered as `family` when it is not run as Jinja
 * (ENG_CHAT_AUTO: the family eng_chat_detect finds in the text, ChatML when none). The markers the parser
 * knows decide first: "<tool_call>" Hermes, "[TOOL_CALLS]" Mistral, "<|python_tag|>" or a Llama 3 header
 * Llama 3; otherwise the family: ChatML (and the ChatML fallback) Hermes, llama3 Llama 3, mistral Mistral,
 * the others generic. */
srv_tool_format srv_tool_format_detect(const char *template_text, eng_chat_family family);
/* "generic", "hermes", "llama3", "mistral" */
const char *srv_tool_format_name(srv_tool_format f);

/* How the model thinks (api/reasoning.c; the streaming parser is private: api/reasoning_internal.h):
 *   OFF      no thinking markers: the output is all content
 *   THINK    Qwen3 / DeepSeek-R1 style: <think>REASONING</think>CONTENT (the generation prompt may open <think>
 *            itself, as DeepSeek-R1-distill's and QwQ's templates do: the output then starts inside the block)
 *   HARMONY  gpt-oss's channels: <|channel|>analysis<|message|>REASONING<|end|>, <|start|>assistant<|channel|>final
 *            <|message|>CONTENT, tool calls on the commentary channel with to=functions.NAME */
typedef enum { SRV_REASONING_OFF = 0, SRV_REASONING_THINK = 1, SRV_REASONING_HARMONY = 2 } srv_reasoning_syntax;
/* The syntax a chat template's text (NULL: none) writes: "<|channel|>" with "analysis" HARMONY, "<think>" or
 * "</think>" THINK, else OFF. */
srv_reasoning_syntax srv_reasoning_detect(const char *template_text);
/* "off", "think", "harmony" */
const char *srv_reasoning_syntax_name(srv_reasoning_syntax s);
/* --reasoning-format (llama.cpp's names): AUTO (the default) splits where the template thinks; DEEPSEEK splits
 * also a <think> block at the start of the output of a template without markers; NONE leaves the thinking in the
 * content. */
typedef enum {
    SRV_REASONING_FORMAT_AUTO = 0,
    SRV_REASONING_FORMAT_DEEPSEEK = 1,
    SRV_REASONING_FORMAT_NONE = 2,
} srv_reasoning_format;
/* "auto" | "deepseek" | "none" into *out: 0, or KVS_ERR_INVALID for any other name (*out unchanged). */
int srv_reasoning_format_from_name(const char *name, srv_reasoning_format *out);
const char *srv_reasoning_format_name(srv_reasoning_format f);
/* The syntax the output of a template with syntax `tmpl` is parsed with under format f: NONE gives OFF;
 * DEEPSEEK gives THINK where the template has no syntax; AUTO the template's own. */
srv_reasoning_syntax srv_reasoning_effective(srv_reasoning_format f, srv_reasoning_syntax tmpl);

/* The model's compiled response grammars (api/grammar_cache.c; lookups are private:
 * api/grammar_cache_internal.h). One per loaded model: it owns the model's gmr_vocab and a bounded LRU of
 * compiled grammars; any thread. */
typedef struct srv_grammar_cache srv_grammar_cache;
/* Builds the vocabulary index of a loaded model: each token's piece (special tokens not rendered, so they are
 * never allowed), eog and special flags. Errors: KVS_ERR_INVALID, KVS_ERR_NOMEM, or the engine's error. */
int srv_grammar_cache_vocab_from_model(const eng_model *model, gmr_vocab **out);

/* Takes ownership of vocab (freed by srv_grammar_cache_free, also on failure). max_entries >= 1 grammars kept while
 * unreferenced (LRU); mask_cache_bytes bounds each grammar's mask cache (0: 16 MiB).
 * Errors: KVS_ERR_INVALID, KVS_ERR_NOMEM, KVS_ERR_THREAD. */
int srv_grammar_cache_create(gmr_vocab *vocab, int32_t max_entries, size_t mask_cache_bytes, srv_grammar_cache **out);
/* Every entry must have been released. NULL is a no-op. */
void srv_grammar_cache_free(srv_grammar_cache *c);

/* ---- 3. routes -------------------------------------------------------------------------------------------- */
/* A saved-session action of POST /slots/{id}?action=... */
typedef enum { SRV_API_SLOT_SAVE = 0, SRV_API_SLOT_RESTORE = 1, SRV_API_SLOT_ERASE = 2 } srv_api_slot_action;
typedef struct srv_api_slot_op {
    srv_api_slot_action action;
    int32_t id;              /* the slot (a sequence id) */
    const char *filename;    /* save, restore: a validated file name (no directory, no path separator) */
    int32_t n_tokens;        /* out: tokens saved, restored or erased */
    uint64_t n_bytes;        /* out: bytes written or read */
    char err[512];           /* out: the message of a failure */
} srv_api_slot_op;

/* What the API layer needs from the engine and the scheduler. The functions follow the semantics of the
 * engine/scheduler calls named in the comments; submit's callback events arrive on the loop thread. */
typedef struct srv_api_backend {
    void *ctx;
    int (*submit)(void *ctx, const srv_sched_request *req, uint64_t *id);          /* srv_sched_submit */
    int (*cancel)(void *ctx, uint64_t id);                                         /* srv_sched_cancel */
    void (*stats)(void *ctx, srv_sched_stats *out);                                /* srv_sched_get_stats */
    int (*tokenize)(void *ctx, const char *text, size_t len, bool add_special, bool parse_special,
                    int32_t *out, int32_t cap, int32_t *n_out);                     /* eng_tokenize */
    int (*token_piece)(void *ctx, int32_t token, bool render_special, char *buf, size_t cap,
                       size_t *n_out);                                             /* eng_token_to_piece */
    int (*chat_render)(void *ctx, const eng_chat_msg *msgs, size_t n, char **out); /* eng_chat_render */
    /* The model's Jinja chat template (or the --chat-template file), compiled; NULL: chat_render's built-in
     * families. Rendered off the loop (any thread); the caller's, must outlive the backend. */
    const struct tpl_template *chat_tpl;
    const char *bos_text, *eos_text; /* the BOS / EOS token texts for the template (NULL: "") */
    /* How the model writes tool calls (srv_tool_format_detect over the template text or the built-in family): the
     * format of grammar-constrained calls (tool_choice "required" or a named function) and of the tools
     * described in the prompt of a built-in family (which has no template to print them). 0: generic JSON. */
    srv_tool_format tool_format;
    /* How the template's model thinks (srv_reasoning_detect over the Jinja template text; OFF for the built-in
     * families): the syntax a chat output is split with into reasoning and content (srv_api_config's format). */
    srv_reasoning_syntax reasoning;
    /* Optional (NULL: POST /slots answers 501): a saved-session action (llama.cpp's slot API), run on libuv's thread
     * pool. Returns 0 with op's results set, or KVS_ERR_UNSUPPORTED (501: no slot_save_path or no disk tier),
     * KVS_ERR_INVALID (400: slot out of range), KVS_ERR_NOT_FOUND (404: nothing to save, no such file),
     * KVS_ERR_FORMAT (400: not a session of this model), another code (500); op->err says why. */
    int (*slot)(void *ctx, srv_api_slot_op *op);
} srv_api_backend;


typedef enum { SRV_API_LOG_TEXT = 0, SRV_API_LOG_JSON = 1, SRV_API_LOG_NONE = 2 } srv_api_log_format;

typedef struct srv_api_config {
    const char *model_id;       /* /v1/models id and the "model" of responses (copied) */
    int32_t n_ctx;              /* context length for the prompt check (0: unchecked) */
    srv_api_limits limits;
    const char *api_key;        /* NULL or "": no authentication (copied) */
    srv_api_log_format log_format;
    void *log_stream;           /* FILE * for request logs (NULL: stderr) */
    uv_loop_t *loop;            /* the loop srv_api_handle runs on: request bodies are parsed, chat templates
                                   rendered and prompts tokenized on libuv's thread pool, so the loop stays
                                   responsive under any single request (NULL: done inline, for tests) */
    const srv_cors *cors;       /* preflight answers (NULL: no CORS); the caller's, must outlive the srv_api */
    const srv_web *web;         /* GET / (the chat page) and GET /props (NULL: both 404); the caller's, likewise */
    bool parse_special_in_content; /* true: text like <|im_start|> in chat message contents becomes control
                                      tokens (the old behaviour); false (default): contents are plain text */
    srv_reasoning_format reasoning_format; /* --reasoning-format: the default of the request field
                                              reasoning_format (AUTO: split where the template thinks) */
} srv_api_config;

typedef struct srv_api srv_api;

/* The backend may be NULL until the model is loaded (srv_api_set_backend): meanwhile /health answers 503
 * {"status":"loading"} and the model routes 503. metrics is the caller's (may be NULL). */
int srv_api_create(const srv_api_config *cfg, srv_metrics *metrics, srv_api **out);
void srv_api_free(srv_api *api);
void srv_api_set_backend(srv_api *api, const srv_api_backend *backend);
/* Updates the model facts once the model is loaded: id (copied; NULL keeps the current one), the context
 * length (0: unchecked) and the vocabulary size for token-id validation (0: unchecked). */
int srv_api_set_model(srv_api *api, const char *model_id, int32_t n_ctx, int32_t n_vocab);
/* The KV pool the scheduler runs on: n_blocks blocks of block_size tokens (0: unchecked). A prompt whose
 * blocks (plus room for one generated token per choice, as the scheduler's admission counts) exceed the whole
 * pool is answered 400 context_length_exceeded naming the sizes, before it is queued. Loop thread, before the
 * backend is set. */
void srv_api_set_kv_pool(srv_api *api, int32_t n_blocks, int32_t block_size);
/* The context shift (sched/sched.h, "Context shift"): on: a request's max_tokens may pass the context (only the
 * prompt must fit); n_keep: the default of the request field n_keep (-1: the whole prompt); bos: the model's BOS
 * token (-1: none), which n_keep does not count and a shift always keeps when the prompt starts with it.
 * Default: off, n_keep 0, bos -1. Loop thread, before requests arrive. */
void srv_api_set_context_shift(srv_api *api, bool on, int32_t n_keep, int32_t bos);
/* Fill-in-the-middle tokens of the model (eng_token_fim; -1: the model has none, `suffix` is then a 400). */
void srv_api_set_fim(srv_api *api, int32_t pre, int32_t suf, int32_t mid);
/* /v1/embeddings: how inputs are pooled and the vector size (the model's n_embd). Loop thread. */
void srv_api_set_pooling(srv_api *api, srv_sched_pooling pooling, int32_t n_embd);
/* /v1/rerank: the model's classification head outputs (0: rerank answers 501) and the special tokens of the pair
 * prompt [bos] query [eos] [sep] document [eos] (-1: not added). Loop thread. */
void srv_api_set_rerank(srv_api *api, int32_t n_rank, int32_t bos, int32_t eos, int32_t sep);
/* /v1/rerank: the model's rerank prompt (eng_model_rerank_prompt: text with the placeholders {query} and {document},
 * a decoder reranker's), copied; NULL (the default): the pair of special tokens above. 0 or KVS_ERR_NOMEM (the
 * prompt is then unchanged). Loop thread, before requests arrive. */
int srv_api_set_rerank_prompt(srv_api *api, const char *prompt);
/* The srv_http handler (ud = the srv_api). */
void srv_api_handle(void *ud, srv_http_req *req);
/* A srv_http_log_cb (ud = the srv_api): counts and logs the answers the HTTP layer sends itself. */
void srv_api_log_http(void *ud, const char *method, const char *path, int status, uint64_t t_start_ns);
/* The model's grammar cache for response_format (section 2; the caller's, must outlive the srv_api; NULL:
 * response_format json_object/json_schema answer 400 "not available"). Loop thread. */
void srv_api_set_grammar_cache(srv_api *api, srv_grammar_cache *gc);
/* Graceful drain (SIGTERM): from now on GET/HEAD /health (and /v1/health) answer 503 {"status":"draining"},
 * /metrics answers as before (with kvserve:draining 1), and every other request gets 503 with "Retry-After: 1"
 * and an OpenAI error JSON (code "server_draining"); requests already accepted, including those still being
 * prepared off the loop, run on. One way: there is no undraining. Loop thread. */
void srv_api_set_draining(srv_api *api);
/* Requests still generating. */
int32_t srv_api_in_flight(const srv_api *api);
/* Jobs out on the thread pool (parsing, rendering, tokenizing, detokenizing): they call the backend, so the
 * backend must not be cleared (srv_api_set_backend NULL) nor freed while this is above 0 (issue 30: a drain that
 * did so crashed a /tokenize still running). Loop thread. */
int32_t srv_api_jobs_out(const srv_api *api);
/* Asks for the heap to be given back to the system (malloc_trim on the thread pool) as soon as no job is out:
 * the daemon calls it when the server turns idle after work, so that what large requests, deep write buffers and
 * preemptions left in the allocator's arenas does not stay resident (issue 30). Cheap when nothing is held. Loop
 * thread. */
void srv_api_request_trim(srv_api *api);
/* Cancels every generating request (shutdown after the grace period): streams end with an error event and
 * [DONE], others answer 503 with Retry-After. */
void srv_api_cancel_all(srv_api *api);

#endif /* KVSERVE_SERVER_API_H */
