/* api_internal.h: what the API layer's files share; only server/api_*.c include it.
 *
 *   api_routes.c    dispatch (auth, method, path), the simple routes (health, models, metrics, tokenize,
 *                   detokenize) and the srv_api lifetime
 *   api_generate.c  completions and chat completions: prompts, submission to the scheduler, its events
 *   api_render.c    responses: JSON bodies, SSE chunks, logprobs, final responses, error replies, the access log
 *   api_parse.c     request bodies -> srv_api_request (validation)
 *   api_responses.c /v1/responses: the body mapped onto a chat one (responses_map.h), then the chat path
 *                   (api_prepare_gen, api_fill_request); Response objects with message and function_call items,
 *                   typed SSE events; the in-memory store behind previous_response_id
 *   api_fim.c       fill-in-the-middle prompts (`suffix` of /v1/completions)
 *   api_embed.c     /v1/embeddings: inputs as embedding requests of the scheduler, vectors as float or base64
 *
 * Everything here runs on the event-loop thread, except the preparation of generation requests and the
 * tokenize/detokenize routes (api_offload): those run on libuv's thread pool and may touch only their own
 * job and the read-only parts of srv_api (limits, n_ctx, the backend's tokenize/token_piece/chat_render,
 * which are safe from any thread).
 */
#ifndef KVSERVE_API_INTERNAL_H
#define KVSERVE_API_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>

#include <cjson/cJSON.h>

#include "server/api.h"

typedef struct api_call api_call;
typedef struct api_resp_store api_resp_store;

typedef struct api_choice {
    kvs_buf text;                           /* non-stream: accumulated text */
    cJSON *lp;            /* non-stream logprobs: completions {tokens, ...} object; chat {content: [...]} */
    size_t lp_offset;     /* completions text_offset of the next token */
    srv_sched_finish finish;
    size_t sent;          /* stream with tools: bytes of `text` already sent as content */
    bool held;            /* stream with tools: the rest of the text is held until the end */
    bool tool_calls;      /* the choice ended in tool calls (finish_reason "tool_calls") */
    bool truncated;       /* ended with "length" because the whole KV pool could not hold its context */
    uint64_t last_t;      /* time of the previous DELTA (inter-token latency) */
    bool ended;
} api_choice;

typedef struct api_sub {  /* one scheduler request: one prompt with its n choices */
    api_call *call;
    int32_t prompt_index;
    uint64_t id;
    bool submitted, done;
    char *echo;           /* prompt text to prepend (echo), or NULL */
    size_t echo_len;
} api_sub;

/* Work done off the loop (api_offload): `work` runs on a pool thread, then `done` on the loop thread. While
 * the job is out, the request's abort callback clears `req`; `done` must then answer nothing. `work` must not
 * touch `req` at all (the client may leave and the HTTP layer free the request meanwhile): api_offload moves
 * the request's body into the job (`body`, owned by the job, freed once `work` has run), and that is all
 * `work` reads of the request. */
typedef struct api_job api_job;
struct api_job {
    uv_work_t w;
    srv_api *api;
    srv_http_req *req;    /* NULL once the client is gone; loop thread only */
    char *body;           /* the request's body, taken over by api_offload for `work`; NULL after it */
    size_t body_len;
    void (*work)(api_job *j);
    void (*done)(api_job *j);
    _Atomic bool cancel;  /* set on the loop thread when the client leaves or the API drains: `work` may stop
                             early (template renders read it); its result is then discarded */
};
/* Runs j->work on the thread pool (inline when the API has no loop) and then j->done on the loop thread. */
void api_offload(srv_api *api, api_job *j);

struct api_call {
    api_job job;          /* preparation: parse, render, tokenize (api_generate.c) */
    int32_t **prep_toks;  /* [n_subs] prompt tokens from the preparation */
    int32_t *prep_ntok;
    bool prep_failed; srv_api_error prep_error;
    srv_api_kind kind;
    srv_api *api;
    api_call *prev, *next;
    srv_http_req *req;    /* NULL once the client is gone */
    srv_api_gen gen;
    char id[48];
    int64_t created;
    uint64_t t_arrival;
    api_sub *subs; int32_t n_subs, n_live;
    api_choice *choices; int32_t n_choices;
    srv_sched_usage usage;
    uint64_t t_first_token;
    bool stream, shutdown;
    bool has_error; srv_api_error error;
    const char *method, *path;
    /* /v1/embeddings (api_embed.c): one vector per input, submitted a window at a time */
    float *embd;          /* [n_subs][n_embd] */
    int32_t n_embd, next_sub;
    bool embd_b64;
    void (*ext_free)(api_call *c); /* frees what a route's larger call struct owns (api_responses.c), or NULL */
    struct srv_gcache_entry *grammar; /* response_format's compiled grammar (a reference), or NULL */
    int32_t priority;     /* /v1/embeddings, /v1/responses: the request's `priority` (generation: gen.priority) */
};

struct srv_api {
    char *model_id;
    int32_t n_ctx;
    int32_t kv_blocks, kv_block_size; /* the whole KV pool (srv_api_set_kv_pool; 0: unchecked) */
    srv_api_limits limits;
    char *api_key;
    srv_log_format log_format;
    FILE *log;
    srv_metrics *metrics;
    const srv_cors *cors; /* preflight answers (NULL: no CORS) */
    const srv_web *web;   /* the chat page and /props (NULL: 404) */
    srv_api_backend be;
    bool has_backend;
    bool parse_special_in_content;
    api_call *calls;
    int32_t n_calls;
    uv_loop_t *loop;      /* NULL: offloaded work runs inline */
    int32_t n_jobs;       /* jobs out on the thread pool */
    bool closing;         /* srv_api_free is waiting for them */
    bool draining;        /* srv_api_set_draining: /health 503 "draining", new requests 503 */
    uint64_t rng;
    int64_t created;
    srv_sched_pooling pooling; /* /v1/embeddings (srv_api_set_pooling) */
    api_resp_store *resp_store; /* /v1/responses kept for previous_response_id (thread-safe) */
    int32_t n_embd;
    int32_t fim[3];       /* fill-in-the-middle tokens: prefix, suffix, middle (-1: none) */
    bool context_shift;   /* srv_api_set_context_shift: max_tokens may pass n_ctx */
    int32_t n_keep;       /* the default of the request field n_keep */
    int32_t bos;          /* the model's BOS token (-1: none) */
    struct srv_gcache *gcache; /* response_format grammars (NULL: not available) */
};

/* ---- shared between the files ---------------------------------------------------------------------------- */

/* api_generate.c */
void api_call_free(api_call *c);
void api_cancel_subs(api_call *c);
/* srv_http abort callback of a call (ud): the client left; logs 499 and cancels its scheduler requests */
void api_on_abort(void *ud, srv_http_req *req);
/* api_generate.c: links a new call into api->calls and sets its arrival, method, path, request and abort */
void api_call_register(srv_api *api, api_call *c, srv_http_req *req, const char *path);
int api_piece(srv_api *api, int32_t tok, char *buf, size_t cap);
/* The srv_sched_request.n_keep of a prompt: the request's n_keep (has: given) or the server's default, plus the
 * BOS token when the prompt starts with it; the whole prompt for -1. */
int32_t api_n_keep(const srv_api *api, const int32_t *toks, int32_t n, bool has, int32_t n_keep);
/* Whether a prompt of n tokens with max_tokens (<= 0: none) passes the context: the prompt must leave room
 * for one token, and without the context shift the prompt + max_tokens must fit. */
bool api_ctx_exceeded(const srv_api *api, int32_t n, int32_t max_tokens);
void api_route_generate(srv_api *api, srv_http_req *req, srv_api_kind kind);
/* Whether a prompt of n_prompt tokens with n choices fits the whole KV pool (the blocks the scheduler's
 * admission counts for it); when it does not, fills e with a 400 naming the sizes (param: the request field)
 * and returns -1. Any thread (reads only the pool size). */
int api_check_kv_fit(const srv_api *api, int32_t n_prompt, int32_t n, const char *param, srv_api_error *e);
/* n > 1 choices with max_tokens (api_budget.c): each choice's context grows to n_prompt + max_tokens (at most
 * n_ctx); when the n of them together (prompt blocks shared) cannot fit the whole KV pool the request could only
 * finish with choices cut short ("truncated"), so it is refused up front: -1 with a 400 context_length_exceeded
 * (param "n") in *e naming the sizes; 0 when it fits, n == 1, max_tokens is absent or the pool is unknown. */
int api_check_kv_fit_choices(const srv_api *api, int32_t n_prompt, int32_t n, int32_t max_tokens,
                             srv_api_error *e);
/* api_render.c: logs that choice idx of call c was cut by the KV pool (a warning line in the request log) */
void api_log_truncated(srv_api *api, const api_call *c, int32_t idx);
int api_tokenize(srv_api *api, const char *text, size_t len, bool add_special, bool parse_special, int32_t **out, int32_t *n_out);
/* Pool thread: after c->gen is parsed, everything else the preparation does for chat and completions (the
 * response_format grammar, subs and choices, every prompt built and checked against the context) into
 * c->prep_toks / prep_ntok; -1 with e set (the param of a prompt error is "messages" or "prompt"). */
int api_prepare_gen(srv_api *api, api_call *c, srv_api_error *e);
/* Loop thread: the scheduler request of prompt i (toks[0..n_toks)) from c->gen and c->grammar: sampling, seed,
 * stops, grammar; the caller sets cb and user. */
/* The error answer (and its status: 429, 400, 503, 500) for a srv_sched_submit failure r. */
int api_submit_error(int r, srv_api_error *e, int32_t n_ctx, int32_t n_prompt);
void api_fill_request(srv_api *api, api_call *c, const int32_t *toks, int32_t n_toks, int32_t i,
                      srv_sched_request *sr);

/* api_routes.c: the body as a JSON object after the strict pass (NULL with e set: 400) */
cJSON *api_parse_body_object(const char *body, size_t body_len, srv_api_error *e);

/* api_responses.c */
void api_route_responses(srv_api *api, srv_http_req *req);
api_resp_store *api_resp_store_create(void); /* NULL on failure */
void api_resp_store_free(api_resp_store *s);

/* api_fim.c: prompt p with the suffix in the model's FIM order (PSM); -1 with e set (400 without FIM tokens) */
int api_fim_prompt(srv_api *api, const srv_api_prompt *p, const char *suffix, int32_t **toks, int32_t *n,
                   srv_api_error *e);

/* POST /infill: llama.cpp's infill fields translated into a /v1/completions body with suffix */
void api_route_infill(srv_api *api, srv_http_req *req);

/* api_embed.c */
void api_route_embeddings(srv_api *api, srv_http_req *req);
/* api_generate.c: a random id with the prefix ("chatcmpl-...") */
void api_make_id(srv_api *api, const char *prefix, char *out, size_t cap);
/* api_chat_prompt.c: the tokens of a chat request's prompt (template, content spans, prefill). */
int api_chat_prompt(srv_api *api, api_call *c, int32_t **toks, int32_t *n, srv_api_error *e);
/* api_tools.c: tool calls in chat responses */
bool api_tools_active(const api_call *c);
void api_tools_stream_delta(api_call *c, int32_t idx, const char *text, size_t len, const eng_sample *smp, int32_t n_smp);
void api_tools_stream_end(api_call *c, int32_t idx, const char *text, size_t len, srv_sched_finish finish);
void api_tools_message(api_call *c, int32_t idx, cJSON *message, api_choice *ch);
cJSON *api_chunk_base(api_call *c);
void api_sse_send(api_call *c, cJSON *o, const char *raw);
/* api_parse.c: "a boolean", "a number", ... "null" (for messages about a field's JSON type) */
const char *api_json_kind(const cJSON *j);
/* api_parse.c: the body's `priority` (an int32; absent or null: 0) into *out. 1 set, 0 absent, -1 with a 400 in
 * err naming the field: not an integer, out of range, or nonzero without lim->priority_scheduling. */
int api_parse_priority(const cJSON *root, const srv_api_limits *lim, int32_t *out, srv_api_error *err);

/* api_structured.c: response_format */
/* Parses response_format into g (1 set, 0 absent, -1 invalid with err, -2 out of memory). */
int api_parse_response_format(const cJSON *root, srv_api_gen *g, srv_api_error *err);
/* Pool thread (prepare_work): compiles or finds c->gen's response grammar (or its tool-call grammar) into
 * c->grammar. -1 with err set. */
int api_prepare_grammar(srv_api *api, api_call *c, srv_api_error *err);
/* Whether c's output is constrained to tool calls (chat, tools, tool_choice "required" or a named function). */
bool api_tools_constrained(const api_call *c);
/* Releases c->grammar (api_call_free). */
void api_release_grammar(api_call *c);

/* api_render.c */
void api_add_logprobs(api_call *c, api_choice *ch, cJSON *lp, const eng_sample *smp, int32_t n);
void api_finish_call(api_call *c);
void api_log_request(srv_api *api, const char *method, const char *path, int status, const srv_sched_usage *u, double ttft_ms, double total_ms);
double api_ms_since(uint64_t t0);
cJSON *api_new_logprobs(api_call *c);
void api_reply(srv_api *api, srv_http_req *req, int status, const char *ctype, const char *extra, const char *body, size_t len, const srv_sched_usage *u, double ttft_ms);
void api_reply_err(srv_api *api, srv_http_req *req, int status, const char *type, const char *param, const char *code, const char *extra, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
void api_reply_error(srv_api *api, srv_http_req *req, const srv_api_error *e, const char *extra);
void api_reply_json(srv_api *api, srv_http_req *req, int status, cJSON *obj, const srv_sched_usage *u, double ttft_ms);
/* Starts c's SSE answer on req (200, text/event-stream). -1 when the connection is gone: then c->req is
 * cleared, the request aborted and c's scheduler requests cancelled. Loop thread. */
int api_stream_begin(api_call *c, srv_http_req *req);
/* A stream write failed while c->req is still set (the client does not read): logs 499, counts an abort,
 * clears c->req, aborts the request and cancels c's scheduler requests. Loop thread. */
void api_stream_client_gone(api_call *c);
void api_stream_chunk(api_call *c, int32_t idx, const char *text, size_t len, const eng_sample *smp, int32_t n_smp, srv_sched_finish finish, bool role);
char *api_utf8_sanitize(const char *s, size_t n);

#endif
