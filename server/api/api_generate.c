/* api_generate.c: the routes /v1/completions and /v1/chat/completions (and /infill, translated by api_fim.c):
 * the call is registered, prepared off the loop (api_prepare.c), queued on the scheduler, and its events become
 * SSE chunks or the final body (see api_routes_internal.h). */
#include "server/api/api_gen_internal.h"
#include "server/api/api_routes_internal.h"

#include <stdlib.h>
#include <string.h>

/* The call's last event: the end of its stream, or its whole body (or its error). */
static void finish_call(api_call *c) {
    srv_api *api = c->api;
    double ttft_ms = c->t_first_token ? (double)(c->t_first_token - c->t_arrival) / 1e6 : -1;
    if (!c->req) { api_call_free(c); return; }
    srv_http_req *req = c->req;
    c->req = NULL;
    bool error = c->has_error;
    srv_api_error e = c->error;
    if (!error) {
        for (int32_t i = 0; i < c->n_choices; i++)
            if (c->choices[i].finish == SRV_SCHED_FINISH_CANCELLED) {
                error = true;
                if (c->shutdown)
                    srv_api_set_error(&e, 503, "server_error", NULL, NULL, "the server is shutting down");
                else
                    srv_api_set_error(&e, 500, "server_error", NULL, NULL, "the request was cancelled");
                break;
            }
    }
    if (api->metrics) {
        if (error) api->metrics->requests_finished_error++;
        else {
            bool len = false;
            for (int32_t i = 0; i < c->n_choices; i++) len |= c->choices[i].finish == SRV_SCHED_FINISH_LENGTH;
            if (len) api->metrics->requests_finished_length++; else api->metrics->requests_finished_stop++;
        }
    }
    if (c->stream) {
        c->req = req;
        if (error) {
            char *s = srv_api_error_json(&e);
            if (s) {
                char *msg = malloc(strlen(s) + 1);
                if (msg) { strcpy(msg, s); api_sse_send(c, NULL, msg); free(msg); }
                free(s);
            }
        } else if (c->gen.include_usage) {
            cJSON *o = api_chunk_base(c);
            cJSON_AddArrayToObject(o, "choices");
            int32_t rt = c->gen.kind == SRV_API_CHAT ? c->reasoning_tokens : -1; /* chat's field only */
            cJSON_AddItemToObject(o, "usage", api_usage_json(&c->usage, rt));
            api_sse_send(c, o, NULL);
        }
        api_sse_send(c, NULL, "[DONE]");
        if (c->req) {
            if (api->metrics) srv_metrics_count_http(api->metrics, 200);
            srv_http_stream_end(c->req);
            api_log_request(api, c->method, c->path, 200, &c->usage, ttft_ms, api_ms_since(c->t_arrival));
        }
        c->req = NULL;
        api_call_free(c);
        return;
    }
    if (error) {
        api_reply_error(api, req, &e, c->shutdown && e.status == 503 ? "Retry-After: 1\r\n" : NULL);
        api_call_free(c);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", c->gen.kind == SRV_API_CHAT ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddStringToObject(o, "model", api->model_id);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (int32_t i = 0; i < c->n_choices; i++) {
        api_choice *ch = &c->choices[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddItemToArray(choices, j);
        cJSON_AddNumberToObject(j, "index", i);
        char *s = api_utf8_sanitize(ch->text.data ? ch->text.data : "", ch->text.len);
        if (c->gen.kind == SRV_API_CHAT) {
            cJSON *m = cJSON_AddObjectToObject(j, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", s ? s : "");
            if (ch->reasoning.len > 0) {
                char *r = api_utf8_sanitize(ch->reasoning.data, ch->reasoning.len);
                cJSON_AddStringToObject(m, "reasoning_content", r ? r : "");
                free(r);
            }
            if (api_tools_active(c)) api_tools_message(c, i, m, ch);
        } else {
            cJSON_AddStringToObject(j, "text", s ? s : "");
        }
        free(s);
        if (ch->lp) { cJSON_AddItemToObject(j, "logprobs", ch->lp); ch->lp = NULL; }
        else cJSON_AddNullToObject(j, "logprobs");
        const char *fn = ch->finish != SRV_SCHED_FINISH_NONE ? srv_sched_finish_name(ch->finish) : "stop";
        if (ch->tool_calls) fn = "tool_calls";
        cJSON_AddStringToObject(j, "finish_reason", fn);
        if (ch->truncated) cJSON_AddTrueToObject(j, "truncated"); /* cut by the KV pool (as llama.cpp's field) */
    }
    int32_t rt = c->gen.kind == SRV_API_CHAT ? c->reasoning_tokens : -1; /* chat's field only */
    cJSON_AddItemToObject(o, "usage", api_usage_json(&c->usage, rt));
    api_reply_json(api, req, 200, o, &c->usage, ttft_ms);
    cJSON_Delete(o);
    api_call_free(c);
}

/* Text of choice idx (content only, when the output is split) as a stream chunk or into the final body. */
static void deliver_delta(api_call *c, int32_t idx, const char *text, size_t len, const eng_sample *smp,
                          int32_t n_smp) {
    api_choice *ch = &c->choices[idx];
    if (c->stream && api_tools_active(c)) {
        api_tools_stream_delta(c, idx, text, len, smp, n_smp);
    } else if (c->stream) {
        if (len > 0 || (c->gen.logprobs && n_smp > 0))
            api_stream_chunk(c, idx, text, len, smp, n_smp, SRV_SCHED_FINISH_NONE, false);
    } else {
        if (kvs_buf_append(&ch->text, text, len)) { c->has_error = true; srv_api_set_nomem(&c->error); }
        if (c->gen.logprobs && n_smp > 0) {
            if (!ch->lp) ch->lp = api_new_logprobs(c);
            if (ch->lp) api_add_logprobs(c, ch, ch->lp, smp, n_smp);
        }
    }
}

static void deliver_end(api_call *c, int32_t idx, const char *text, size_t len, srv_sched_finish finish) {
    bool ok = finish != SRV_SCHED_FINISH_ERROR && finish != SRV_SCHED_FINISH_CANCELLED;
    if (c->stream && api_tools_active(c)) {
        if (ok) api_tools_stream_end(c, idx, text, len, finish);
    } else if (c->stream) {
        if (len > 0) api_stream_chunk(c, idx, text, len, NULL, 0, SRV_SCHED_FINISH_NONE, false);
        if (ok) api_stream_chunk(c, idx, NULL, 0, NULL, 0, finish, false);
    } else {
        kvs_buf_append(&c->choices[idx].text, text, len);
    }
}

/* The output split into reasoning and content (c->rsn_syntax): the reasoning is kept in the choice and streamed
 * as delta.reasoning_content (with the samples when no content came with it); the content goes on as text. end:
 * the choice's last text, after which the parser gives out what it held. */
static void split_event(api_call *c, int32_t idx, const srv_sched_event *ev, bool end) {
    api_choice *ch = &c->choices[idx];
    kvs_buf content = {0};
    size_t r0 = ch->reasoning.len;
    const bool was_inside = srv_reasoning_inside(&ch->rsn);
    int rc = srv_reasoning_feed(&ch->rsn, ev->text, ev->text_len, &ch->reasoning, &content);
    if (rc == 0 && end) rc = srv_reasoning_finish(&ch->rsn, &ch->reasoning, &content);
    api_count_reasoning(c, &ch->rsn, was_inside, ch->reasoning.len > r0, content.len > 0, ev->n_samples);
    if ((rc != 0 || ch->reasoning.oom || content.oom) && !c->has_error) {
        c->has_error = true;
        srv_api_set_nomem(&c->error);
    }
    const eng_sample *smp = ev->samples;
    int32_t n_smp = ev->n_samples;
    if (c->stream && ch->reasoning.len > r0) {
        bool with_samples = content.len == 0 && !end;
        api_stream_reasoning(c, idx, ch->reasoning.data + r0, ch->reasoning.len - r0, with_samples ? smp : NULL,
                             with_samples ? n_smp : 0);
        if (with_samples) n_smp = 0;
    }
    if (end) deliver_end(c, idx, content.data, content.len, ev->finish);
    else deliver_delta(c, idx, content.data, content.len, smp, n_smp);
    kvs_buf_free(&content);
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
            if (t->t_first_token)
                srv_metrics_histogram_observe(&m->ttft, (double)(t->t_first_token - c->t_arrival) / 1e9);
            if (t->t_end) srv_metrics_histogram_observe(&m->e2e, (double)(t->t_end - c->t_arrival) / 1e9);
            if (t->t_start && t->t_submit)
                srv_metrics_histogram_observe(&m->queue, (double)(t->t_start - t->t_submit) / 1e9);
            srv_metrics_histogram_observe(&m->prompt_len, ev->usage.prompt_tokens);
            srv_metrics_histogram_observe(&m->gen_len, ev->usage.completion_tokens);
        }
        if (c->n_live == 0) finish_call(c);
        return;
    }
    if (ev->choice < 0 || ev->choice >= c->gen.n) return;
    int32_t idx = sub->prompt_index * c->gen.n + ev->choice;
    api_choice *ch = &c->choices[idx];
    bool split = c->rsn_syntax != SRV_REASONING_OFF;
    if (ev->type == SRV_SCHED_EV_DELTA) {
        if (api->metrics && ch->last_t && ev->n_samples > 0 && ev->t > ch->last_t) {
            double dt = (double)(ev->t - ch->last_t) / 1e9 / ev->n_samples;
            for (int32_t i = 0; i < ev->n_samples; i++) srv_metrics_histogram_observe(&api->metrics->itl, dt);
        }
        if (ev->n_samples > 0) ch->last_t = ev->t;
        if (split) split_event(c, idx, ev, false);
        else deliver_delta(c, idx, ev->text, ev->text_len, ev->samples, ev->n_samples);
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
        if (split) split_event(c, idx, ev, true);
        else deliver_end(c, idx, ev->text, ev->text_len, ev->finish);
    }
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
