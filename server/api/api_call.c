/* api_call.c: a call's lifecycle, which every route uses and which uses no route: ids, tokenizing, the call registry,
 * abort and cancel, the KV-fit check, submission errors and the work done off the loop (see api_internal.h). */
#include "server/api/api_internal.h"

#include <inttypes.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/api/chat_internal.h"
#include "server/api/grammar_cache_internal.h"

/* ---- ids and tokens --------------------------------------------------------------------------------------- */
uint64_t api_random(srv_api *api) {
    uint64_t x = api->rng;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    api->rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

void api_make_id(srv_api *api, const char *prefix, char *out, size_t cap) {
    snprintf(out, cap, "%s%016" PRIx64 "%08" PRIx32, prefix, api_random(api), (uint32_t)api_random(api));
}

/* Tokenizes with a growing buffer; *out malloc'd. */
int api_tokenize(srv_api *api, const char *text, size_t len, bool add_special, bool parse_special,
                 int32_t **out, int32_t *n_out) {
    int32_t cap = (int32_t)(len < 1000000 ? len : 1000000) + 16, n = 0;
    for (int tries = 0; tries < 3; tries++) {
        int32_t *buf = malloc((size_t)cap * sizeof *buf);
        if (!buf) return ENG_ERR_NOMEM;
        int r = api->be.tokenize(api->be.ctx, text, len, add_special, parse_special, buf, cap, &n);
        if (r == ENG_OK) { *out = buf; *n_out = n; return 0; }
        free(buf);
        if (r != ENG_ERR_TOO_LARGE || n <= cap) return r;
        cap = n;
    }
    return ENG_ERR_NOMEM;
}

/* A token's text (render_special) as raw bytes into buf; returns length or -1. */
int api_piece(srv_api *api, int32_t tok, char *buf, size_t cap) {
    size_t n = 0;
    if (api->be.token_piece(api->be.ctx, tok, true, buf, cap, &n) != ENG_OK) return -1;
    return (int)n;
}

/* ---- the registry, abort and cancel ----------------------------------------------------------------------- */
void api_cancel_subs(api_call *c) {
    for (int32_t i = 0; i < c->n_subs; i++)
        if (c->subs[i].submitted && !c->subs[i].done) c->api->be.cancel(c->api->be.ctx, c->subs[i].id);
}

/* The client left before the answer was complete: counted as an abort now, and logged as 499 (nginx's convention)
 * when the call is freed, after its cancelled scheduler requests have reported the tokens they used (issue 27:
 * the line said prompt=0 completion=0 when it was written at the disconnect). */
static void log_gone(api_call *c) {
    if (c->api->metrics) c->api->metrics->requests_finished_abort++;
    c->gone = true;
}

/* srv_http abort callback of a call (ud): the client left; its scheduler requests are cancelled. */
static void on_abort(void *ud, srv_http_req *req) {
    (void)req;
    api_call *c = ud;
    c->req = NULL;
    atomic_store(&c->job.cancel, true); /* a preparation still out stops rendering (its result is dropped) */
    log_gone(c);
    api_cancel_subs(c);
}

/* Registers a new call on the loop thread: in the API's list (so shutdown waits for it), its timing and path for
 * the request log, and the abort callback (so a disconnect during its work off the loop is noticed). */
void api_call_register(srv_api *api, api_call *c, srv_http_req *req, const char *path) {
    c->api = api;
    c->next = api->calls;
    if (api->calls) api->calls->prev = c;
    api->calls = c;
    api->n_calls++;
    c->t_arrival = req->t_start_ns ? req->t_start_ns : uv_hrtime();
    c->method = req->method_name;
    c->path = path;
    c->created = (int64_t)time(NULL);
    c->req = req;
    c->job.req = req;
    srv_http_set_abort(req, on_abort, c);
}

void api_stream_client_gone(api_call *c) {
    srv_http_req *req = c->req;
    c->req = NULL;
    log_gone(c);
    srv_http_abort(req);
    api_cancel_subs(c);
}

static void release_grammar(api_call *c) {
    if (!c->grammar) return;
    srv_grammar_cache_release(c->api->gcache, c->grammar);
    c->grammar = NULL;
}

void api_call_free(api_call *c) {
    if (!c) return;
    if (c->ext_free) c->ext_free(c);
    srv_api *api = c->api;
    if (c->gone) {
        double ttft = c->t_first_token ? (double)(c->t_first_token - c->t_arrival) / 1e6 : -1;
        api_log_request(api, c->method, c->path, 499, &c->usage, ttft, api_ms_since(c->t_arrival));
    }
    if (c->prev) c->prev->next = c->next; else if (api->calls == c) api->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    api->n_calls--;
    for (int32_t i = 0; c->choices && i < c->n_choices; i++) {
        kvs_buf_free(&c->choices[i].text);
        kvs_buf_free(&c->choices[i].reasoning);
        srv_reasoning_free(&c->choices[i].rsn);
        cJSON_Delete(c->choices[i].lp);
    }
    for (int32_t i = 0; c->subs && i < c->n_subs; i++) free(c->subs[i].echo);
    free(c->choices);
    free(c->subs);
    for (int32_t i = 0; c->prep_toks && i < c->n_subs; i++) free(c->prep_toks[i]);
    free(c->prep_toks);
    free(c->prep_ntok);
    free(c->embd);
    release_grammar(c);
    srv_api_gen_free(&c->gen);
    free(c);
}

/* The parsed request a call holds (api.h; api_parse.c fills it). */
void srv_api_gen_free(srv_api_gen *g) {
    if (!g) return;
    free(g->model);
    for (int32_t i = 0; i < g->n_prompts; i++) { free(g->prompts[i].text); free(g->prompts[i].tokens); }
    free(g->prompts);
    for (int32_t i = 0; i < g->n_msgs; i++) { free(g->msgs[i].role); free(g->msgs[i].content); }
    free(g->msgs);
    for (int32_t i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop);
    free(g->logit_bias);
    free(g->user);
    free(g->suffix);
    free(g->rf_schema);
    if (g->chat) { srv_chat_req_free(g->chat); free(g->chat); }
    memset(g, 0, sizeof *g);
}

/* ---- admission checks ------------------------------------------------------------------------------------- */
int api_check_kv_fit(const srv_api *api, int32_t n_prompt, int32_t n, const char *param, srv_api_error *e) {
    if (api->kv_blocks <= 0 || api->kv_block_size <= 0 || n_prompt < 1 || n < 1) return 0;
    int64_t bs = api->kv_block_size;
    /* as the scheduler's admission counts a fresh request: the prompt and one generated token in the first
     * choice's sequence; every other choice shares the prompt's full blocks */
    int64_t first = ((int64_t)n_prompt + 1 + bs - 1) / bs, other = first - (int64_t)n_prompt / bs;
    int64_t need = first + (int64_t)(n - 1) * other;
    if (need <= api->kv_blocks) return 0;
    if (n > 1)
        srv_api_set_error(e, 400, NULL, param, "context_length_exceeded",
                          "The prompt has %d tokens and needs %lld KV-cache blocks of %d tokens for n=%d choices "
                          "(the prompt and one generated token each), but the server's whole KV cache is %d blocks "
                          "(%lld tokens). Reduce the prompt or n.", (int)n_prompt, (long long)need, (int)bs, (int)n,
                          (int)api->kv_blocks, (long long)api->kv_blocks * bs);
    else
        srv_api_set_error(e, 400, NULL, param, "context_length_exceeded",
                          "The prompt has %d tokens and needs %lld KV-cache blocks of %d tokens (the prompt and one "
                          "generated token), but the server's whole KV cache is %d blocks (%lld tokens). Reduce the "
                          "prompt.", (int)n_prompt, (long long)need, (int)bs, (int)api->kv_blocks,
                          (long long)api->kv_blocks * bs);
    return -1;
}

/* n choices that together cannot fit the whole pool are refused up front (issue 30: n=64 on a small pool came
 * back cut "truncated" after ~60 tokens although max_tokens was 300). */
int api_check_kv_fit_choices(const srv_api *api, int32_t n_prompt, int32_t n, int32_t max_tokens,
                             srv_api_error *e) {
    if (api->kv_blocks <= 0 || api->kv_block_size <= 0 || n_prompt < 1 || n < 2 || max_tokens < 1) return 0;
    int64_t bs = api->kv_block_size;
    int64_t len = (int64_t)n_prompt + max_tokens; /* the longest context one choice reaches */
    if (api->n_ctx > 0 && len > api->n_ctx) len = api->n_ctx; /* a shifted context stays within n_ctx */
    /* every choice's sequence holds its whole context (+1 token, as admission counts); the others share the
     * prompt's full blocks with the first */
    int64_t first = (len + 1 + bs - 1) / bs, other = first - (int64_t)n_prompt / bs;
    int64_t need = first + (int64_t)(n - 1) * other;
    if (need <= api->kv_blocks) return 0;
    srv_api_set_error(e, 400, NULL, "n", "context_length_exceeded",
                      "n=%d choices of up to %lld tokens each (%d in the prompt, max_tokens %d) need %lld KV-cache "
                      "blocks of %d tokens, but the server's whole KV cache is %d blocks (%lld tokens), so the "
                      "choices would be cut short. Reduce n or max_tokens.", (int)n, (long long)len, (int)n_prompt,
                      (int)max_tokens, (long long)need, (int)bs, (int)api->kv_blocks,
                      (long long)api->kv_blocks * bs);
    return -1;
}

int api_submit_error(int r, srv_api_error *e, int32_t n_ctx, int32_t n_prompt) {
    switch (r) {
    case SRV_SCHED_ERR_QUEUE_FULL:
        srv_api_set_error(e, 429, "rate_limit_error", NULL, "queue_full",
                          "the server is overloaded: the request queue is full; retry later");
        return 429;
    case SRV_SCHED_ERR_TOO_LONG:
        srv_api_set_error(e, 400, NULL, "messages", "context_length_exceeded",
                          "This model's maximum context length is %d tokens, but the prompt has %d tokens", (int)n_ctx,
                          (int)n_prompt);
        return 400;
    case SRV_SCHED_ERR_STOPPED:
        srv_api_set_error(e, 503, "server_error", NULL, NULL, "the server is shutting down");
        return 503;
    case KVS_ERR_UNSUPPORTED: /* the scheduler takes no generation for an encoder model */
        srv_api_set_error(e, 501, "server_error", NULL, "not_implemented", "this model cannot generate text (an "
                          "encoder: use /v1/embeddings, or /v1/rerank for a reranker)");
        return 501;
    default:
        srv_api_set_error(e, 500, "server_error", NULL, NULL, "could not queue the request: %s", kvs_strerror(r));
        return 500;
    }
}

/* ---- work off the loop ------------------------------------------------------------------------------------ */
/* Runs `work` and drops the body it read. A job whose client has already left (cancel, set by the abort
 * callbacks; `done` then answers nothing) is not run at all: twelve clients that send 4 MB bodies and leave
 * no longer hold the pool for seconds each (issue 30). */
static void run_work(api_job *j) {
    if (!atomic_load(&j->cancel)) j->work(j);
    free(j->body);
    j->body = NULL;
    j->body_len = 0;
}
static void offload_work(uv_work_t *w) { run_work((api_job *)w); }

static void trim_work(uv_work_t *w) {
    (void)w;
#ifdef __GLIBC__
    malloc_trim(0); /* every arena: the workers' too */
#endif
}
static void trim_after(uv_work_t *w, int status) {
    (void)status;
    srv_api *api = w->data;
    api->trim_out = false;
    api->n_jobs--;
}
/* Once nothing is out, a trim after a large body (on the pool: trimming gigabytes is not the loop's work). */
static void maybe_trim(srv_api *api) {
    if (!api->trim_wanted || api->trim_out || api->n_jobs > 0 || !api->loop) return;
    api->trim_wanted = false;
    api->trim_w.data = api;
    api->n_jobs++;
    api->trim_out = true;
    if (uv_queue_work(api->loop, &api->trim_w, trim_work, trim_after) != 0) {
        api->trim_out = false;
        api->n_jobs--;
    }
}

void srv_api_request_trim(srv_api *api) {
    if (!api) return;
    api->trim_wanted = true;
    maybe_trim(api);
}

static void queue_job(srv_api *api, api_job *j);

/* How many text jobs may hold a pool thread at once (at least one). */
static int32_t text_cap(const srv_api *api) { return api->limits.text_jobs > 0 ? api->limits.text_jobs : 1; }

static void offload_after(uv_work_t *w, int status) {
    (void)status; /* UV_ECANCELED cannot happen: jobs are never cancelled, and work always ran */
    api_job *j = (api_job *)w;
    srv_api *api = j->api;
    api->n_jobs--;
    if (j->text) {
        api->text_running--;
        while (api->text_head && api->text_running < text_cap(api)) { /* the next waiting text job */
            api_job *n = api->text_head;
            api->text_head = n->next_q;
            if (!api->text_head) api->text_tail = NULL;
            api->text_queued--;
            api->n_jobs--; /* queue_job counts it again */
            queue_job(api, n);
        }
    }
    j->done(j); /* may free j */
    maybe_trim(api);
}

/* Takes the request's body into j (the request may die while `work` reads it). */
static void take_body(api_job *j) {
    if (!j->req) return;
    j->body = j->req->body;
    j->body_len = j->req->body_len;
    j->req->body = NULL;
    j->req->body_len = 0;
    if (j->body_len >= SRV_API_TRIM_BYTES) j->api->trim_wanted = true;
}

static void queue_job(srv_api *api, api_job *j) {
    if (api->loop) {
        api->n_jobs++;
        if (j->text) api->text_running++;
        if (uv_queue_work(api->loop, &j->w, offload_work, offload_after) == 0) return;
        api->n_jobs--;
        if (j->text) api->text_running--;
    }
    run_work(j);
    j->done(j);
}

void api_offload(srv_api *api, api_job *j) {
    j->api = api;
    take_body(j);
    queue_job(api, j);
}

int api_offload_text(srv_api *api, api_job *j) {
    j->api = api;
    j->text = true;
    if (!api->loop || api->text_running < text_cap(api)) {
        take_body(j);
        queue_job(api, j);
        return 0;
    }
    if (api->text_queued >= api->limits.text_queue) return -1;
    take_body(j); /* the body waits with the job: the request may go */
    j->next_q = NULL;
    if (api->text_tail) api->text_tail->next_q = j; else api->text_head = j;
    api->text_tail = j;
    api->text_queued++;
    api->n_jobs++; /* a waiting job is out too: the drain waits for it */
    return 0;
}
