/* api_generate.c: completions and chat completions over the scheduler: prompts, submission, the scheduler's
 * events, cancellation when the client goes away (see api.h). */
#include "server/api_internal.h"
#include "server/grammar_cache.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <llhttp.h>

/* ---- helpers ---------------------------------------------------------------------------------------------- */
static uint64_t rng_next(srv_api *api) {
    uint64_t x = api->rng;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    api->rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

void api_make_id(srv_api *api, const char *prefix, char *out, size_t cap) {
    snprintf(out, cap, "%s%016" PRIx64 "%08" PRIx32, prefix, rng_next(api), (uint32_t)rng_next(api));
}

/* Copies bytes into a valid UTF-8 string: invalid sequences become U+FFFD. Returns malloc'd or NULL. */
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

/* ---- generation ---------------------------------------------------------------------------------------------- */
void api_call_free(api_call *c) {
    if (!c) return;
    if (c->ext_free) c->ext_free(c);
    srv_api *api = c->api;
    if (c->prev) c->prev->next = c->next; else if (api->calls == c) api->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    api->n_calls--;
    for (int32_t i = 0; c->choices && i < c->n_choices; i++) { kvs_buf_free(&c->choices[i].text); cJSON_Delete(c->choices[i].lp); }
    for (int32_t i = 0; c->subs && i < c->n_subs; i++) free(c->subs[i].echo);
    free(c->choices);
    free(c->subs);
    for (int32_t i = 0; c->prep_toks && i < c->n_subs; i++) free(c->prep_toks[i]);
    free(c->prep_toks);
    free(c->prep_ntok);
    free(c->embd);
    api_release_grammar(c);
    srv_api_gen_free(&c->gen);
    free(c);
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
    srv_http_set_abort(req, api_on_abort, c);
}

void api_cancel_subs(api_call *c) {
    for (int32_t i = 0; i < c->n_subs; i++)
        if (c->subs[i].submitted && !c->subs[i].done) c->api->be.cancel(c->api->be.ctx, c->subs[i].id);
}

void api_on_abort(void *ud, srv_http_req *req) {
    (void)req;
    api_call *c = ud;
    c->req = NULL;
    atomic_store(&c->job.cancel, true); /* a preparation still out stops rendering (its result is dropped) */
    if (c->api->metrics) c->api->metrics->requests_finished_abort++;
    /* 499: the client closed the connection before the answer was complete (nginx's convention) */
    api_log_request(c->api, c->method, c->path, 499, &c->usage, -1, api_ms_since(c->t_arrival));
    api_cancel_subs(c);
}

static void on_sched_event(const srv_sched_event *ev, void *user) {
    api_sub *sub = user;
    api_call *c = sub->call;
    srv_api *api = c->api;
    if (ev->type == SRV_SCHED_EV_DONE) {
        sub->done = true;
        c->n_live--;
        c->usage.prompt_tokens += ev->usage.prompt_tokens;
        c->usage.completion_tokens += ev->usage.completion_tokens;
        c->usage.cached_tokens += ev->usage.cached_tokens;
        const srv_sched_timings *t = &ev->timings;
        if (t->t_first_token && (!c->t_first_token || t->t_first_token < c->t_first_token))
            c->t_first_token = t->t_first_token;
        if (api->metrics) {
            srv_metrics *m = api->metrics;
            if (t->t_first_token) srv_histogram_observe(&m->ttft, (double)(t->t_first_token - c->t_arrival) / 1e9);
            if (t->t_end) srv_histogram_observe(&m->e2e, (double)(t->t_end - c->t_arrival) / 1e9);
            if (t->t_start && t->t_submit) srv_histogram_observe(&m->queue, (double)(t->t_start - t->t_submit) / 1e9);
            srv_histogram_observe(&m->prompt_len, ev->usage.prompt_tokens);
            srv_histogram_observe(&m->gen_len, ev->usage.completion_tokens);
        }
        if (c->n_live == 0) api_finish_call(c);
        return;
    }
    if (ev->choice < 0 || ev->choice >= c->gen.n) return;
    int32_t idx = sub->prompt_index * c->gen.n + ev->choice;
    api_choice *ch = &c->choices[idx];
    if (ev->type == SRV_SCHED_EV_DELTA) {
        if (api->metrics && ch->last_t && ev->n_samples > 0 && ev->t > ch->last_t) {
            double dt = (double)(ev->t - ch->last_t) / 1e9 / ev->n_samples;
            for (int32_t i = 0; i < ev->n_samples; i++) srv_histogram_observe(&api->metrics->itl, dt);
        }
        if (ev->n_samples > 0) ch->last_t = ev->t;
        if (c->stream && api_tools_active(c)) {
            api_tools_stream_delta(c, idx, ev->text, ev->text_len, ev->samples, ev->n_samples);
        } else if (c->stream) {
            if (ev->text_len > 0 || (c->gen.logprobs && ev->n_samples > 0))
                api_stream_chunk(c, idx, ev->text, ev->text_len, ev->samples, ev->n_samples, SRV_SCHED_FINISH_NONE,
                             false);
        } else {
            if (kvs_buf_append(&ch->text, ev->text, ev->text_len)) { c->has_error = true; srv_api_set_error(&c->error, 500, "server_error", NULL, NULL, "out of memory"); }
            if (c->gen.logprobs && ev->n_samples > 0) {
                if (!ch->lp) ch->lp = api_new_logprobs(c);
                if (ch->lp) api_add_logprobs(c, ch, ch->lp, ev->samples, ev->n_samples);
            }
        }
        return;
    }
    if (ev->type == SRV_SCHED_EV_CHOICE_END) {
        ch->ended = true;
        ch->finish = ev->finish;
        if (ev->truncated && ev->finish == SRV_SCHED_FINISH_LENGTH) {
            ch->truncated = true;
            api_log_truncated(api, c, idx);
        }
        if (ev->finish == SRV_SCHED_FINISH_ERROR && !c->has_error) {
            c->has_error = true;
            const char *msg = ev->error ? ev->error : "generation failed";
            bool client = strstr(msg, "does not fit") != NULL;
            srv_api_set_error(&c->error, client ? 400 : 500, client ? "invalid_request_error" : "server_error",
                              NULL, NULL, "%s", msg);
        }
        if (c->stream && api_tools_active(c)) {
            if (ev->finish != SRV_SCHED_FINISH_ERROR && ev->finish != SRV_SCHED_FINISH_CANCELLED)
                api_tools_stream_end(c, idx, ev->text, ev->text_len, ev->finish);
        } else if (c->stream) {
            if (ev->text_len > 0) api_stream_chunk(c, idx, ev->text, ev->text_len, NULL, 0, SRV_SCHED_FINISH_NONE, false);
            if (ev->finish != SRV_SCHED_FINISH_ERROR && ev->finish != SRV_SCHED_FINISH_CANCELLED)
                api_stream_chunk(c, idx, NULL, 0, NULL, 0, ev->finish, false);
        } else {
            kvs_buf_append(&ch->text, ev->text, ev->text_len);
        }
    }
}

int api_submit_error(int r, srv_api_error *e, int32_t n_ctx, int32_t n_prompt) {
    switch (r) {
    case SRV_SCHED_ERR_QUEUE_FULL:
        srv_api_set_error(e, 429, "rate_limit_error", NULL, "queue_full",
                          "the server is overloaded: the request queue is full; retry later");
        return 429;
    case SRV_SCHED_ERR_TOO_LONG:
        srv_api_set_error(e, 400, NULL, "messages", "context_length_exceeded",
                          "This model's maximum context length is %d tokens, but the prompt has %d tokens", (int)n_ctx, (int)n_prompt);
        return 400;
    case SRV_SCHED_ERR_STOPPED:
        srv_api_set_error(e, 503, "server_error", NULL, NULL, "the server is shutting down");
        return 503;
    default:
        srv_api_set_error(e, 500, "server_error", NULL, NULL, "could not queue the request: %s", kvs_strerror(r));
        return 500;
    }
}

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

/* Builds the prompt tokens of prompt i (chat: the rendered conversation). */
static int build_prompt(srv_api *api, api_call *c, int32_t i, int32_t **toks, int32_t *n, srv_api_error *e) {
    srv_api_gen *g = &c->gen;
    if (g->kind == SRV_API_CHAT) return api_chat_prompt(api, c, toks, n, e);
    srv_api_prompt *p = &g->prompts[i];
    if (g->suffix) {
        if (api_fim_prompt(api, p, g->suffix, toks, n, e) != 0) return -1;
    } else if (p->tokens) {
        if (!(*toks = malloc((size_t)p->n_tokens * sizeof **toks))) goto oom;
        memcpy(*toks, p->tokens, (size_t)p->n_tokens * sizeof **toks);
        *n = p->n_tokens;
    } else {
        int r = api_tokenize(api, p->text, strlen(p->text), true, true, toks, n);
        if (r != 0) goto tokfail;
    }
    if (g->echo) {
        api_sub *s = &c->subs[i];
        if (p->text) {
            if (!(s->echo = strdup(p->text))) goto oom;
            s->echo_len = strlen(p->text);
        } else {
            size_t cap = (size_t)p->n_tokens * 8 + 1, len = 0;
            char *buf = malloc(cap), tb[256];
            if (!buf) goto oom;
            for (int32_t k = 0; k < p->n_tokens; k++) {
                int l = api_piece(api, p->tokens[k], tb, sizeof tb);
                if (l <= 0) continue;
                if (len + (size_t)l + 1 > cap) {
                    cap = (len + (size_t)l + 1) * 2;
                    char *q = realloc(buf, cap);
                    if (!q) { free(buf); goto oom; }
                    buf = q;
                }
                memcpy(buf + len, tb, (size_t)l);
                len += (size_t)l;
            }
            s->echo = buf;
            s->echo_len = len;
        }
    }
    return 0;
oom:
    srv_api_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
tokfail:
    srv_api_set_error(e, 500, "server_error", NULL, NULL, "tokenization failed");
    return -1;
}

int32_t api_n_keep(const srv_api *api, const int32_t *toks, int32_t n, bool has, int32_t n_keep) {
    int32_t k = has ? n_keep : api->n_keep;
    if (k < 0) return n;
    int64_t keep = (int64_t)k + (n > 0 && api->bos >= 0 && toks[0] == api->bos);
    return keep > n ? n : (int32_t)keep;
}

bool api_ctx_exceeded(const srv_api *api, int32_t n, int32_t max_tokens) {
    if (api->n_ctx <= 0) return false;
    if (n >= api->n_ctx) return true;
    return !api->context_shift && max_tokens > 0 && (int64_t)n + max_tokens > api->n_ctx;
}

/* Pool thread: parse the body, render and tokenize every prompt and check it against the context, before
 * anything is queued. Touches only the call and read-only parts of the API. */
static void prepare_work(api_job *j) {
    api_call *c = (api_call *)j;
    srv_api *api = c->api;
    srv_api_error *e = &c->prep_error;
    c->prep_failed = true;
    if (srv_api_parse_gen(c->kind, c->job.body, c->job.body_len, &api->limits, &c->gen, e) != 0) return;
    if (api_prepare_gen(api, c, e) == 0) c->prep_failed = false;
}

int api_prepare_gen(srv_api *api, api_call *c, srv_api_error *e) {
    srv_api_kind kind = c->kind;
    srv_api_gen *g = &c->gen;
    if (api_prepare_grammar(api, c, e) != 0) return -1;
    c->n_subs = kind == SRV_API_CHAT ? 1 : g->n_prompts;
    c->n_choices = c->n_subs * g->n;
    c->subs = calloc((size_t)c->n_subs, sizeof *c->subs);
    c->choices = calloc((size_t)c->n_choices, sizeof *c->choices);
    c->prep_toks = calloc((size_t)c->n_subs, sizeof *c->prep_toks);
    c->prep_ntok = calloc((size_t)c->n_subs, sizeof *c->prep_ntok);
    if (!c->subs || !c->choices || !c->prep_toks || !c->prep_ntok) {
        srv_api_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    int32_t **toks = c->prep_toks, *ntok = c->prep_ntok;
    for (int32_t i = 0; i < c->n_subs; i++) {
        c->subs[i].call = c;
        c->subs[i].prompt_index = i;
        if (build_prompt(api, c, i, &toks[i], &ntok[i], e)) return -1;
        const char *param = kind == SRV_API_CHAT ? "messages" : "prompt";
        if (ntok[i] < 1) {
            srv_api_set_error(e, 400, NULL, param, NULL, "the prompt is empty (0 tokens)");
            return -1;
        }
        if (api_ctx_exceeded(api, ntok[i], g->max_tokens)) {
            if (g->max_tokens > 0 && ntok[i] < api->n_ctx)
                srv_api_set_error(e, 400, NULL, param, "context_length_exceeded",
                                  "This model's maximum context length is %d tokens. However, you requested %lld "
                                  "tokens (%d in the prompt, %d for the completion). Please reduce the prompt or "
                                  "max_tokens.", (int)api->n_ctx, (long long)ntok[i] + g->max_tokens,
                                  (int)ntok[i], (int)g->max_tokens);
            else
                srv_api_set_error(e, 400, NULL, param, "context_length_exceeded",
                                  "This model's maximum context length is %d tokens. However, the prompt has %d "
                                  "tokens.", (int)api->n_ctx, (int)ntok[i]);
            return -1;
        }
        if (api_check_kv_fit(api, ntok[i], g->n, param, e) != 0) return -1;
        if (api_check_kv_fit_choices(api, ntok[i], g->n, g->max_tokens, e) != 0) return -1;
    }
    return 0;
}

void api_fill_request(srv_api *api, api_call *c, const int32_t *toks, int32_t n_toks, int32_t i,
                      srv_sched_request *sr) {
    const srv_api_gen *g = &c->gen;
    memset(sr, 0, sizeof *sr);
    sr->prompt = toks;
    sr->n_prompt = n_toks;
    sr->n = g->n;
    sr->max_tokens = g->max_tokens;
    sr->n_keep = api_n_keep(api, toks, n_toks, g->has_n_keep, g->n_keep);
    eng_sampling_params_default(&sr->sampling);
    sr->sampling.temperature = g->temperature;
    sr->sampling.top_k = g->top_k;
    sr->sampling.top_p = g->top_p;
    sr->sampling.min_p = g->min_p;
    sr->sampling.repetition_penalty = g->repetition_penalty;
    sr->sampling.presence_penalty = g->presence_penalty;
    sr->sampling.frequency_penalty = g->frequency_penalty;
    sr->sampling.seed = g->has_seed ? g->seed + (uint64_t)i * (uint64_t)g->n : rng_next(api);
    sr->sampling.logit_bias = g->logit_bias;
    sr->sampling.n_logit_bias = (size_t)g->n_logit_bias;
    sr->sampling.n_top_logprobs = g->logprobs ? g->top_logprobs : 0;
    sr->stop = (const char *const *)g->stop;
    sr->n_stop = (size_t)g->n_stop;
    sr->ignore_eos = g->ignore_eos;
    /* repetition_penalty (llama.cpp/vLLM meaning) also looks at the prompt; OpenAI's presence/frequency
     * penalties alone look only at generated tokens */
    sr->penalize_prompt = g->repetition_penalty != 1.0f;
    sr->grammar = c->grammar ? srv_gcache_matcher(c->grammar) : NULL;
    sr->priority = g->priority;
}

static void prepare_done(api_job *j);

/* Loop thread: the call is registered (so shutdown waits for it and a disconnect is noticed), then prepared
 * off the loop (prepare_work), then queued (prepare_done). */
void api_route_generate(srv_api *api, srv_http_req *req, srv_api_kind kind) {
    api_call *c = calloc(1, sizeof *c);
    if (!c) { api_reply_json(api, req, 500, NULL, NULL, -1); return; }
    c->kind = kind;
    api_call_register(api, c, req, kind == SRV_API_CHAT ? "/v1/chat/completions" : "/v1/completions");
    api_make_id(api, kind == SRV_API_CHAT ? "chatcmpl-" : "cmpl-", c->id, sizeof c->id);
    c->job.work = prepare_work;
    c->job.done = prepare_done;
    api_offload(api, &c->job);
}

static void prepare_done(api_job *j) {
    api_call *c = (api_call *)j;
    srv_api *api = c->api;
    srv_http_req *req = c->req;
    srv_api_gen *g = &c->gen;
    srv_api_kind kind = c->kind;
    int32_t **toks = c->prep_toks, *ntok = c->prep_ntok;
    c->prep_toks = NULL;
    c->prep_ntok = NULL;
    srv_api_error e = c->prep_error;
    bool fail = c->prep_failed;
    int r;
    if (!req || api->closing) { /* the client left (logged by on_abort), or the API is being freed */
        for (int32_t i = 0; toks && i < c->n_subs; i++) free(toks[i]);
        free(toks);
        free(ntok);
        api_call_free(c);
        return;
    }
    const char *extra = NULL;
    if (!fail && c->shutdown) {
        srv_api_set_error(&e, 503, "server_error", NULL, NULL, "the server is shutting down");
        extra = "Retry-After: 1\r\n";
        fail = true;
    }
    c->stream = !fail && g->stream;
    /* Queue one scheduler request per prompt. */
    for (int32_t i = 0; !fail && i < c->n_subs; i++) {
        srv_sched_request sr;
        api_fill_request(api, c, toks[i], ntok[i], i, &sr);
        sr.cb = on_sched_event;
        sr.user = &c->subs[i];
        r = api->be.submit(api->be.ctx, &sr, &c->subs[i].id);
        if (r != 0) {
            int st = api_submit_error(r, &e, api->n_ctx, ntok[i]);
            if (st == 503 || st == 429) extra = "Retry-After: 1\r\n";
            fail = true;
            break;
        }
        c->subs[i].submitted = true;
        c->n_live++;
    }
    for (int32_t i = 0; toks && i < c->n_subs; i++) free(toks[i]);
    free(toks);
    free(ntok);
    if (fail) {
        if (c->n_live == 0) {
            srv_http_set_abort(req, NULL, NULL);
            c->req = NULL;
            api_reply_error(api, req, &e, extra);
            api_call_free(c);
            return;
        }
        /* Some prompts were queued: cancel them, answer with the error once they are gone. */
        c->has_error = true;
        c->error = e;
        c->stream = false;
        api_cancel_subs(c);
        return;
    }
    if (c->stream) {
        if (api_stream_begin(c, req) != 0) return;
        for (int32_t i = 0; i < c->n_choices && c->req; i++) {
            api_sub *s = &c->subs[i / g->n];
            if (kind == SRV_API_CHAT) api_stream_chunk(c, i, NULL, 0, NULL, 0, SRV_SCHED_FINISH_NONE, true);
            else if (s->echo) api_stream_chunk(c, i, s->echo, s->echo_len, NULL, 0, SRV_SCHED_FINISH_NONE, false);
        }
    } else {
        for (int32_t i = 0; i < c->n_choices; i++) {
            api_sub *s = &c->subs[i / g->n];
            if (s->echo) {
                kvs_buf_append(&c->choices[i].text, s->echo, s->echo_len);
                c->choices[i].lp_offset = s->echo_len;
            }
        }
    }
}
