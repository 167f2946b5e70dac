/* api_pooled.c: the calls whose inputs each run as one pooled scheduler request (api_internal.h): /v1/embeddings
 * and /v1/rerank. Inputs go in a window at a time; each result is kept by the route's store(); once every
 * submitted input has ended the call answers the route's body() (or the first error) and is freed. */
#include "server/api/api_internal.h"

#include <stdlib.h>
#include <string.h>

static void pooled_event(const srv_sched_event *ev, void *user);

/* Submits input i. Returns 0 or a scheduler error (then nothing was queued). */
static int pooled_submit(api_call *c, int32_t i) {
    srv_api *api = c->api;
    srv_sched_request sr;
    memset(&sr, 0, sizeof sr);
    sr.prompt = c->prep_toks[i];
    sr.n_prompt = c->prep_ntok[i];
    sr.n = 1;
    eng_sampling_params_default(&sr.sampling);
    sr.embed = true;
    sr.pooling = c->pooled->pooling(c);
    sr.priority = c->priority;
    sr.cb = pooled_event;
    sr.user = &c->subs[i];
    int r = api->be.submit(api->be.ctx, &sr, &c->subs[i].id);
    if (r == 0) {
        c->subs[i].submitted = true;
        c->n_live++;
    }
    free(c->prep_toks[i]);
    c->prep_toks[i] = NULL;
    return r;
}

static void pooled_submit_error(api_call *c, int r) {
    if (c->has_error) return;
    c->has_error = true;
    const api_pooled_ops *ops = c->pooled;
    if (r == KVS_ERR_UNSUPPORTED)
        srv_api_set_error(&c->error, 501, "server_error", NULL, "not_implemented", "%s", ops->unsupported);
    else if (r == SRV_SCHED_ERR_QUEUE_FULL)
        srv_api_set_error(&c->error, 503, "server_error", NULL, NULL, "the server is overloaded: the request "
                          "queue is full; retry later");
    else if (r == SRV_SCHED_ERR_STOPPED)
        srv_api_set_error(&c->error, 503, "server_error", NULL, NULL, "the server is shutting down");
    else
        srv_api_set_error(&c->error, r == SRV_SCHED_ERR_TOO_LONG ? 400 : 500, "server_error", ops->param, NULL,
                          "could not queue an item of '%s': %s", ops->param, kvs_strerror(r));
}

/* The next inputs of the window, unless the call has failed or the client left. */
static void submit_window(api_call *c) {
    while (!c->has_error && c->req && !c->shutdown && c->next_sub < c->n_subs && c->n_live < c->pooled->window) {
        int r = pooled_submit(c, c->next_sub++);
        if (r != 0) pooled_submit_error(c, r);
    }
}

/* Every submitted input has ended: answer (when the client is still there) and free the call. */
static void pooled_finish(api_call *c) {
    srv_api *api = c->api;
    srv_http_req *req = c->req;
    if (!req) { api_call_free(c); return; }
    srv_http_set_abort(req, NULL, NULL);
    if (!c->has_error && c->shutdown) {
        c->has_error = true;
        srv_api_set_error(&c->error, 503, "server_error", NULL, NULL, "the server is shutting down");
    }
    if (c->has_error) {
        if (api->metrics) api->metrics->requests_finished_error++;
        api_reply_error(api, req, &c->error, NULL);
    } else {
        if (api->metrics) api->metrics->requests_finished_stop++;
        cJSON *o = c->pooled->body(c);
        srv_sched_usage u = c->usage;
        api_reply_json(api, req, 200, o, &u, -1);
        cJSON_Delete(o);
    }
    api_call_free(c);
}

static void pooled_event(const srv_sched_event *ev, void *user) {
    api_sub *sub = user;
    api_call *c = sub->call;
    if (ev->type != SRV_SCHED_EV_DONE) return;
    sub->done = true;
    c->n_live--;
    if (ev->finish == SRV_SCHED_FINISH_STOP && c->pooled->store(c, sub->prompt_index, ev)) {
        /* kept */
    } else if (!c->has_error) {
        c->has_error = true;
        if (ev->finish == SRV_SCHED_FINISH_CANCELLED)
            srv_api_set_error(&c->error, c->shutdown ? 503 : 500, "server_error", NULL, NULL, "%s",
                              c->shutdown ? "the server is shutting down" : "the request was cancelled");
        else
            srv_api_set_error(&c->error, 500, "server_error", NULL, NULL, "%s: %s", c->pooled->failed,
                              ev->error ? ev->error : "no result");
    }
    submit_window(c);
    if (c->n_live == 0) pooled_finish(c);
}

void api_pooled_done(api_job *j) {
    api_call *c = (api_call *)j;
    srv_api *api = c->api;
    if (!c->req || api->closing) { api_call_free(c); return; }
    if (c->prep_failed) {
        c->has_error = true;
        c->error = c->prep_error;
        pooled_finish(c);
        return;
    }
    submit_window(c);
    if (c->n_live == 0) pooled_finish(c);
}
