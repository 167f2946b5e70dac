/* api_single.c: what the one-choice routes built on chat's preparation (POST /v1/responses, POST /v1/messages)
 * share around the scheduler: submitting the prepared prompt and beginning the stream, a scheduler event's
 * bookkeeping, and the end of the request (the cancellation's error, the metrics, the stream's close or the
 * answer, the request log). Each route keeps its own output: its events, its body, its error shape. Loop thread. */
#include "server/api/api_gen_internal.h"

#include <stdlib.h>
#include <string.h>

int api_single_start(api_call *c, srv_sched_event_cb cb, bool stream, void (*adjust)(srv_api_error *e)) {
    srv_api *api = c->api;
    srv_http_req *req = c->req;
    srv_api_error e = c->prep_error;
    bool fail = c->prep_failed;
    const char *extra = NULL;
    if (!fail && c->shutdown) {
        srv_api_set_error(&e, 503, "server_error", NULL, NULL, "the server is shutting down");
        extra = "Retry-After: 1\r\n";
        fail = true;
    }
    if (!fail) {
        srv_sched_request sr;
        api_fill_request(api, c, c->prep_toks[0], c->prep_ntok[0], 0, &sr);
        sr.cb = cb;
        sr.user = &c->subs[0];
        int rc = api->be.submit(api->be.ctx, &sr, &c->subs[0].id);
        if (rc != 0) {
            int st = api_submit_error(rc, &e, api->n_ctx, c->prep_ntok[0]);
            if (st == 503 || st == 429) extra = "Retry-After: 1\r\n";
            if (adjust) adjust(&e);
            fail = true;
        } else {
            c->subs[0].submitted = true;
            c->n_live = 1;
        }
    }
    if (fail) {
        srv_http_set_abort(req, NULL, NULL);
        c->req = NULL;
        api_reply_error(api, req, &e, extra);
        api_call_free(c);
        return 0;
    }
    c->stream = stream;
    return stream && api_stream_begin(c, req) == 0;
}

int api_single_event(api_call *c, api_sub *sub, const srv_sched_event *ev) {
    if (ev->type == SRV_SCHED_EV_DONE) {
        sub->done = true;
        c->n_live--;
        c->usage = ev->usage;
        if (ev->timings.t_first_token) c->t_first_token = ev->timings.t_first_token;
        return API_SINGLE_DONE;
    }
    int r = 0;
    api_choice *ch = &c->choices[0];
    bool split = c->rsn_syntax != SRV_REASONING_OFF;
    bool end = ev->type == SRV_SCHED_EV_CHOICE_END && ev->finish != SRV_SCHED_FINISH_ERROR &&
               ev->finish != SRV_SCHED_FINISH_CANCELLED;
    const bool was_inside = split && srv_reasoning_inside(&ch->rsn);
    size_t t0 = ch->text.len, r0 = ch->reasoning.len;
    if (ev->text_len > 0 || (split && end)) {
        /* kept as valid UTF-8, so that every cut of it (streamed deltas, text before a call) is valid too; the
         * reasoning parser cuts only at ASCII markers and whitespace */
        char *d = api_utf8_sanitize(ev->text, ev->text_len);
        int rc = !d ? KVS_ERR_NOMEM : !split ? kvs_buf_puts(&ch->text, d)
                                             : srv_reasoning_feed(&ch->rsn, d, strlen(d), &ch->reasoning, &ch->text);
        if (rc == 0 && split && end) rc = srv_reasoning_finish(&ch->rsn, &ch->reasoning, &ch->text);
        if ((rc != 0 || ch->text.oom || ch->reasoning.oom) && !c->has_error) {
            c->has_error = true;
            srv_api_set_nomem(&c->error);
        }
        free(d);
        if (c->stream && !c->has_error && (ch->text.len > t0 || ch->reasoning.len > r0)) r = API_SINGLE_TEXT;
    }
    if (split) api_count_reasoning(c, &ch->rsn, was_inside, ch->reasoning.len > r0, ch->text.len > t0, ev->n_samples);
    if (ev->type == SRV_SCHED_EV_CHOICE_END && ev->finish == SRV_SCHED_FINISH_ERROR && !c->has_error) {
        c->has_error = true;
        srv_api_set_error(&c->error, 500, "server_error", NULL, NULL, "%s", ev->error ? ev->error : "generation failed");
    }
    return r;
}

bool api_single_error(const api_call *c, srv_sched_finish finish, srv_api_error *e) {
    *e = c->error;
    if (c->has_error) return true;
    if (finish != SRV_SCHED_FINISH_CANCELLED) return false;
    srv_api_set_error(e, c->shutdown ? 503 : 500, "server_error", NULL, NULL, "%s",
                      c->shutdown ? "the server is shutting down" : "the request was cancelled");
    return true;
}

void api_single_end(api_call *c, srv_sched_finish finish, const srv_api_error *e, cJSON *body) {
    srv_api *api = c->api;
    if (api->metrics) {
        if (e) api->metrics->requests_finished_error++;
        else if (finish == SRV_SCHED_FINISH_LENGTH) api->metrics->requests_finished_length++;
        else api->metrics->requests_finished_stop++;
    }
    double ttft = c->t_first_token ? (double)(c->t_first_token - c->t_arrival) / 1e6 : -1;
    if (c->req && c->stream) {
        if (api->metrics) srv_metrics_count_http(api->metrics, 200);
        srv_http_stream_end(c->req);
        api_log_request(api, c->method, c->path, 200, &c->usage, ttft, api_ms_since(c->t_arrival));
    } else if (c->req) {
        srv_http_set_abort(c->req, NULL, NULL);
        if (e) api_reply_error(api, c->req, e, NULL);
        else api_reply_json(api, c->req, 200, body, &c->usage, ttft);
    }
    cJSON_Delete(body);
    c->req = NULL;
}
