/* api_internal.h: the low level of server/api/ (private to the folder): the srv_api object, a call's state, and
 * the two files that every route uses and that use no route:
 *   api_base.c      error bodies and the replies that carry them, JSON kind names and the one field() helper
 *                   (srv_api_json_kind, srv_api_json_field: in api.h), UTF-8 sanitizing, the strict JSON pass
 *                   into an object, the request log
 *   api_call.c      a call's lifecycle: ids, tokenizing, the call registry (and freeing what a call holds, its
 *                   parsed request included), abort and cancel, the KV-fit check, submission errors, the work
 *                   done off the loop (api_offload)
 * Above them, api_gen_internal.h declares the generation pipeline (parse, response_format, prompts, the
 * preparation, rendering, tool calls) and api_routes_internal.h the routes api_routes.c dispatches to. Arrows
 * point down only: routes -> pipeline -> api_call.c -> api_base.c; the mappings with their own prefix (chat.c,
 * tool_call.c, tool_format.c, responses_map.c, json_check.c, grammar_cache.c) use at most api_base.c, which uses
 * only json_check.c of them (scripts/check-includes.py checks that no circle forms).
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

#include "server/api/api.h"
#include "server/api/reasoning_internal.h"

typedef struct api_call api_call;
typedef struct api_resp_store api_resp_store;

typedef struct api_choice {
    kvs_buf text;                           /* non-stream: accumulated text (with reasoning: the content only) */
    srv_reasoning rsn;    /* chat: the split of the output into reasoning and content (syntax OFF: none) */
    kvs_buf reasoning;    /* the reasoning so far (non-stream: all of it; the one-choice routes: all of it) */
    cJSON *lp;            /* non-stream logprobs: completions {tokens, ...} object; chat {content: [...]} */
    size_t lp_offset;     /* completions text_offset of the next token */
    srv_sched_finish finish;
    size_t sent;          /* stream with tools: bytes of `text` already sent as content */
    size_t r_sent;        /* the one-choice routes' streams: bytes of `reasoning` already sent */
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
    bool text;            /* a text job (api_offload_text): counted against limits.text_jobs */
    api_job *next_q;      /* the text jobs waiting for a slot (loop thread) */
};
struct api_call {
    api_job job;          /* preparation: parse, render, tokenize (api_prepare.c) */
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
    int32_t reasoning_tokens; /* generated tokens that went to reasoning (api_count_reasoning), all choices */
    uint64_t t_first_token;
    bool stream, shutdown;
    bool gone;            /* the client left: the 499 line is logged when the call is freed, with its usage */
    bool has_error; srv_api_error error;
    const char *method, *path;
    /* /v1/embeddings (api_embed.c) and /v1/rerank (api_rerank.c): one pooled request per input, submitted a
     * window at a time by api_pooled.c */
    const struct api_pooled_ops *pooled; /* the route's part (static storage) */
    float *embd;          /* [n_subs][n_embd]: a vector (embeddings) or a score (rerank, n_embd 1) per input */
    int32_t n_embd, next_sub;
    bool embd_b64;
    void (*ext_free)(api_call *c); /* frees what a route's larger call struct owns (api_responses.c), or NULL */
    struct srv_grammar_cache_entry *grammar; /* response_format's compiled grammar (a reference), or NULL */
    int32_t priority;     /* /v1/embeddings, /v1/responses: the request's `priority` (generation: gen.priority) */
    srv_reasoning_syntax rsn_syntax; /* chat: how the output is split into reasoning and content (OFF: not) */
    bool rsn_open;        /* chat: the rendered prompt ends inside a <think> block */
};

struct srv_api {
    char *model_id;
    int32_t n_ctx;
    int32_t kv_blocks, kv_block_size; /* the whole KV pool (srv_api_set_kv_pool; 0: unchecked) */
    srv_api_limits limits;
    char *api_key;
    srv_api_log_format log_format;
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
    int32_t n_jobs;       /* jobs out on the thread pool, queued text jobs and a pending trim included */
    int32_t text_running; /* text jobs on the thread pool now (at most limits.text_jobs) */
    int32_t text_queued;  /* text jobs waiting for a slot (at most limits.text_queue) */
    api_job *text_head, *text_tail; /* their FIFO */
    bool trim_wanted;     /* a large body or answer was freed since the last trim (api_offload) */
    bool trim_out;        /* a malloc_trim job is on the thread pool */
    uv_work_t trim_w;
    bool closing;         /* srv_api_free is waiting for them */
    bool draining;        /* srv_api_set_draining: /health 503 "draining", new requests 503 */
    uint64_t rng;
    int64_t created;
    srv_sched_pooling pooling; /* /v1/embeddings (srv_api_set_pooling) */
    api_resp_store *resp_store; /* /v1/responses kept for previous_response_id (thread-safe) */
    int32_t n_embd;
    int32_t n_rank;       /* /v1/rerank: the classification head's outputs (0: the model cannot rerank) */
    int32_t rank_tok[3];  /* /v1/rerank: BOS, EOS and SEP of the pair prompt, -1 each when not added */
    char *rank_prompt;    /* /v1/rerank: the model's rerank prompt ({query}, {document}) or NULL (owned) */
    int32_t fim[3];       /* fill-in-the-middle tokens: prefix, suffix, middle (-1: none) */
    bool context_shift;   /* srv_api_set_context_shift: max_tokens may pass n_ctx */
    int32_t n_keep;       /* the default of the request field n_keep */
    int32_t bos;          /* the model's BOS token (-1: none) */
    srv_reasoning_format reasoning_format; /* the default of the request field reasoning_format */
    struct srv_grammar_cache *gcache; /* response_format grammars (NULL: not available) */
};

/* ---- api_base.c ------------------------------------------------------------------------------------------- */
/* Copies bytes into a valid UTF-8 string: invalid sequences (and NUL) become U+FFFD. Returns malloc'd or NULL. */
char *api_utf8_sanitize(const char *s, size_t n);
/* The body as a JSON object after the strict pass (NULL with e set: 400). */
cJSON *api_parse_body_object(const char *body, size_t body_len, srv_api_error *e);
/* One line of the request log (text or JSON, per srv_api_config.log_format; nothing for NONE). */
void api_log_request(srv_api *api, const char *method, const char *path, int status, const srv_sched_usage *u,
                     double ttft_ms, double total_ms);
/* Logs that choice idx of call c was cut by the KV pool (a warning line in the request log). */
void api_log_truncated(srv_api *api, const api_call *c, int32_t idx);
double api_ms_since(uint64_t t0);
/* Sends a complete response, counts and logs it. Takes ownership of nothing. */
void api_reply(srv_api *api, srv_http_req *req, int status, const char *ctype, const char *extra, const char *body,
               size_t len, const srv_sched_usage *u, double ttft_ms);
/* obj as the body (NULL: a 500 "out of memory" body); obj stays the caller's. */
void api_reply_json(srv_api *api, srv_http_req *req, int status, cJSON *obj, const srv_sched_usage *u, double ttft_ms);
/* The error body is OpenAI's, or Anthropic's on the paths srv_api_path_anthropic names. */
void api_reply_error(srv_api *api, srv_http_req *req, const srv_api_error *e, const char *extra);
void api_reply_err(srv_api *api, srv_http_req *req, int status, const char *type, const char *param, const char *code,
                   const char *extra, const char *fmt, ...) __attribute__((format(printf, 8, 9)));

/* ---- api_call.c ------------------------------------------------------------------------------------------- */
/* The API's random numbers (xorshift; ids and unseeded sampling). Loop thread. */
uint64_t api_random(srv_api *api);
/* A random id with the prefix ("chatcmpl-..."). */
void api_make_id(srv_api *api, const char *prefix, char *out, size_t cap);
/* Tokenizes with the backend into a malloc'd *out. 0 or the engine's error. Any thread. */
int api_tokenize(srv_api *api, const char *text, size_t len, bool add_special, bool parse_special, int32_t **out,
                 int32_t *n_out);
/* A token's text (special tokens rendered) as raw bytes into buf; its length, or -1. Any thread. */
int api_piece(srv_api *api, int32_t tok, char *buf, size_t cap);
/* Links a new call into api->calls (so shutdown waits for it) and sets its arrival, method, path, request and
 * abort callback (a disconnect cancels its scheduler requests; the 499 line is logged by api_call_free with the
 * tokens they used). */
void api_call_register(srv_api *api, api_call *c, srv_http_req *req, const char *path);
/* Unlinks and frees a call: its choices, prompts, parsed request, grammar reference (and ext_free's part); for a
 * call whose client left, logs the 499 line with the usage its requests reported. */
void api_call_free(api_call *c);
void api_cancel_subs(api_call *c);
/* A stream write failed while c->req is still set (the client does not read): marks it gone (499), counts an abort,
 * clears c->req, aborts the request and cancels c's scheduler requests. Loop thread. */
void api_stream_client_gone(api_call *c);
/* Whether a prompt of n_prompt tokens with n choices fits the whole KV pool (the blocks the scheduler's
 * admission counts for it); when it does not, fills e with a 400 naming the sizes (param: the request field)
 * and returns -1. Any thread (reads only the pool size). */
int api_check_kv_fit(const srv_api *api, int32_t n_prompt, int32_t n, const char *param, srv_api_error *e);
/* n > 1 choices with max_tokens: each choice's context grows to n_prompt + max_tokens (at most n_ctx); when the n
 * of them together (prompt blocks shared) cannot fit the whole KV pool the request could only finish with choices
 * cut short ("truncated"), so it is refused up front: -1 with a 400 context_length_exceeded (param "n") in *e
 * naming the sizes; 0 when it fits, n == 1, max_tokens is absent or the pool is unknown. Any thread. */
int api_check_kv_fit_choices(const srv_api *api, int32_t n_prompt, int32_t n, int32_t max_tokens,
                             srv_api_error *e);
/* The error answer (and its status: 429, 400, 503, 500) for a srv_sched_submit failure r. */
int api_submit_error(int r, srv_api_error *e, int32_t n_ctx, int32_t n_prompt);
/* Runs j->work on the thread pool (inline when the API has no loop) and then j->done on the loop thread. After a
 * job whose body passed SRV_API_TRIM_BYTES, once no job is out, the heap is given back to the system
 * (malloc_trim, on the thread pool; issue 30: eight refused 14 MB bodies left +2.2 GB held by an idle server). */
void api_offload(srv_api *api, api_job *j);
/* A text job (/tokenize, /detokenize): as api_offload, but at most limits.text_jobs of them hold threads of the
 * pool at once, so that text work never takes every thread from generation requests (issue 30: twelve 4 MB
 * /tokenize bodies delayed a 2-token completion by 25 s); the others wait in a FIFO of at most limits.text_queue.
 * 0 when taken (its done will run), -1 when the FIFO is full (the caller answers 503; nothing was taken).
 * Loop thread. */
int api_offload_text(srv_api *api, api_job *j);
/* A body or answer of at least this many bytes makes the next idle moment trim the heap. */
#define SRV_API_TRIM_BYTES ((size_t)1 << 20)

/* ---- pooled requests (api_pooled.c) ---------------------------------------------------------------------------
 * A call whose inputs (c->prep_toks after the preparation) each run as one pooled scheduler request, at most
 * `window` at a time, the next when one ends: /v1/embeddings (a vector per input) and /v1/rerank (a score per
 * pair). The route sets c->pooled and c->job.done = api_pooled_done; the rest (submitting, collecting, answering,
 * freeing) happens here. Loop thread. */
typedef struct api_pooled_ops {
    int32_t window;       /* inputs in the scheduler at once */
    srv_sched_pooling (*pooling)(const api_call *c); /* the pooling of the requests */
    bool (*store)(api_call *c, int32_t i, const srv_sched_event *ev); /* keeps input i's result; false: none */
    cJSON *(*body)(api_call *c);                     /* the 200 body; NULL when out of memory */
    const char *param;    /* the request field named in errors ("input", "documents") */
    const char *failed;   /* "embedding failed", "reranking failed" */
    const char *unsupported; /* the 501 message when the model cannot serve the route */
} api_pooled_ops;
void api_pooled_done(api_job *j);

#endif /* KVSERVE_API_INTERNAL_H */
