/* api_routes.c: request dispatch (auth, method, path), the simple routes and the srv_api lifetime (see api.h and
 * api_routes_internal.h). */
#include "server/api/api_gen_internal.h"
#include "server/api/api_routes_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <llhttp.h>

/* ---- simple routes --------------------------------------------------------------------------------------- */
static void route_health(srv_api *api, srv_http_req *req) {
    cJSON *o = cJSON_CreateObject();
    const char *st = api->draining ? "draining" : api->has_backend ? "ok" : "loading";
    if (o) cJSON_AddStringToObject(o, "status", st);
    api_reply_json(api, req, api->has_backend && !api->draining ? 200 : 503, o, NULL, -1);
    cJSON_Delete(o);
}

static cJSON *model_json(const srv_api *api) {
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    cJSON_AddStringToObject(m, "id", api->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)api->created);
    cJSON_AddStringToObject(m, "owned_by", "kvserve");
    if (api->n_ctx > 0) cJSON_AddNumberToObject(m, "max_model_len", api->n_ctx);
    return m;
}

/* GET /v1/models/{id} */
static void route_model(srv_api *api, srv_http_req *req, const char *id) {
    if (strcmp(id, api->model_id)) {
        api_reply_err(api, req, 404, NULL, "model", "model_not_found", NULL, "The model '%s' does not exist; this "
                  "server serves '%s'", id, api->model_id);
        return;
    }
    cJSON *m = model_json(api);
    api_reply_json(api, req, 200, m, NULL, -1);
    cJSON_Delete(m);
}

static void route_models(srv_api *api, srv_http_req *req) {
    cJSON *o = cJSON_CreateObject(), *data = cJSON_CreateArray(), *m = model_json(api);
    if (!o || !data || !m) { cJSON_Delete(o); cJSON_Delete(data); cJSON_Delete(m); api_reply_json(api, req, 500, NULL, NULL, -1); return; }
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToObject(o, "data", data);
    cJSON_AddItemToArray(data, m);
    api_reply_json(api, req, 200, o, NULL, -1);
    cJSON_Delete(o);
}

static void route_metrics(srv_api *api, srv_http_req *req) {
    srv_sched_stats st;
    bool have = api->has_backend && api->be.stats;
    if (have) api->be.stats(api->be.ctx, &st);
    srv_metrics empty;
    if (!api->metrics) srv_metrics_init(&empty);
    char *text = NULL;
    size_t len = 0;
    if (srv_metrics_render(api->metrics ? api->metrics : &empty, have ? &st : NULL, &text, &len) != 0) {
        api_reply_json(api, req, 500, NULL, NULL, -1);
        return;
    }
    api_reply(api, req, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, text, len, NULL, -1);
    free(text);
}

/* /tokenize and /detokenize run off the loop (api_offload): a multi-megabyte body would otherwise hold every
 * connection while it is parsed and tokenized. Their work fills `raw` (the 200 body) or `err`; done replies.
 * Answers are written straight into one buffer (no cJSON tree: a tree of one object per token held ~250 bytes a
 * token) and bounded by srv_api_limits.text_answer_bytes (issue 30: a 7.7 MB body peaked 1.9 GB above baseline
 * with pieces). */
typedef struct text_job {
    api_job job;
    bool detok;
    kvs_buf raw;          /* the 200 body, or empty with err set */
    bool failed;
    srv_api_error err;
} text_job;

/* 413 naming the limit of text answers; -1. */
static int answer_too_large(srv_api *api, const char *what, srv_api_error *e) {
    srv_api_set_error(e, 413, NULL, NULL, "answer_too_large", "the %s would pass the %zu-byte limit of /tokenize and "
                      "/detokenize answers (text_answer_mb): send less text per request", what,
                      api->limits.text_answer_bytes);
    return -1;
}

/* Appends s as a JSON string (quotes included; ", \\ and control characters escaped). */
static void json_string(kvs_buf *b, const char *s) {
    kvs_buf_putc(b, '"');
    for (const char *p = s; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch == '"' || ch == '\\') {
            kvs_buf_putc(b, '\\');
            kvs_buf_putc(b, (char)ch);
        } else if (ch < 0x20) {
            kvs_buf_printf(b, "\\u%04x", ch);
        } else {
            kvs_buf_putc(b, (char)ch);
        }
    }
    kvs_buf_putc(b, '"');
}

/* The /tokenize answer of toks[0..n) into out ({"tokens":[...]}, ids or {"id","piece"} objects): 0, or -1 with
 * e set (413 past the answer limit, 500 out of memory). */
static int tokenize_answer(srv_api *api, const int32_t *toks, int32_t n, bool pieces, kvs_buf *out,
                           srv_api_error *e) {
    size_t limit = api->limits.text_answer_bytes;
    kvs_buf_puts(out, "{\"tokens\":[");
    for (int32_t i = 0; i < n && !out->oom; i++) {
        if (i) kvs_buf_putc(out, ',');
        if (pieces) {
            char buf[256];
            int l = api_piece(api, toks[i], buf, sizeof buf);
            char *s = api_utf8_sanitize(buf, l > 0 ? (size_t)l : 0);
            if (!s) {
                srv_api_set_nomem(e);
                return -1;
            }
            kvs_buf_printf(out, "{\"id\":%d,\"piece\":", (int)toks[i]);
            json_string(out, s);
            kvs_buf_putc(out, '}');
            free(s);
        } else {
            kvs_buf_printf(out, "%d", (int)toks[i]);
        }
        if (limit > 0 && out->len > limit) return answer_too_large(api, "answer", e);
    }
    kvs_buf_puts(out, "]}");
    if (out->oom) { srv_api_set_nomem(e); return -1; }
    if (limit > 0 && out->len > limit) return answer_too_large(api, "answer", e);
    return 0;
}

static int tokenize_body(srv_api *api, const api_job *j, kvs_buf *out, srv_api_error *e) {
    cJSON *root = api_parse_body_object(j->body, j->body_len, e);
    if (!root) return -1;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(root, "content");
    const cJSON *as = cJSON_GetObjectItemCaseSensitive(root, "add_special");
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(root, "parse_special");
    const cJSON *wp = cJSON_GetObjectItemCaseSensitive(root, "with_pieces");
    const char *bad = !cJSON_IsString(content) ? "content" : (as && !cJSON_IsBool(as) && !cJSON_IsNull(as)) ? "add_special" :
                      (ps && !cJSON_IsBool(ps) && !cJSON_IsNull(ps)) ? "parse_special" :
                      (wp && !cJSON_IsBool(wp) && !cJSON_IsNull(wp)) ? "with_pieces" : NULL;
    if (bad) {
        srv_api_set_error(e, 400, NULL, bad, NULL, "'%s' %s", bad,
                          !strcmp(bad, "content") ? "is required and must be a string" : "must be a boolean");
        cJSON_Delete(root);
        return -1;
    }
    int32_t *toks = NULL, n = 0;
    const char *text = content->valuestring;
    int r = api_tokenize(api, text, strlen(text), cJSON_IsTrue(as), ps ? !cJSON_IsFalse(ps) : true, &toks, &n);
    bool pieces = cJSON_IsTrue(wp);
    cJSON_Delete(root);
    if (r != 0) {
        srv_api_set_error(e, 500, "server_error", NULL, NULL, "tokenization failed: %s", kvs_strerror(r));
        return -1;
    }
    r = tokenize_answer(api, toks, n, pieces, out, e);
    free(toks);
    return r;
}

static int detokenize_body(srv_api *api, const api_job *j, kvs_buf *ans, srv_api_error *e) {
    cJSON *root = api_parse_body_object(j->body, j->body_len, e);
    if (!root) return -1;
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!cJSON_IsArray(toks)) {
        srv_api_set_error(e, 400, NULL, "tokens", NULL, "'tokens' is required and must be an array of token ids");
        cJSON_Delete(root);
        return -1;
    }
    kvs_buf out = {0};
    int i = 0;
    for (const cJSON *t = toks->child; t; t = t->next, i++) {
        double v = cJSON_IsNumber(t) ? t->valuedouble : -1;
        /* the range first: converting a double beyond int64 (1e54) is undefined (found by fuzz_api) */
        if (!(v >= 0 && v <= INT32_MAX) || v != (double)(int32_t)v ||
            (api->limits.n_vocab > 0 && v >= api->limits.n_vocab)) {
            srv_api_set_error(e, 400, NULL, "tokens", NULL, "'tokens' item %d is not a valid token id", i);
            kvs_buf_free(&out);
            cJSON_Delete(root);
            return -1;
        }
        char buf[256];
        int l = api_piece(api, (int32_t)v, buf, sizeof buf);
        if (l > 0) kvs_buf_append(&out, buf, (size_t)l);
        /* the answer is at least the text: stop once the text alone passes the limit */
        if (api->limits.text_answer_bytes > 0 && out.len > api->limits.text_answer_bytes) {
            kvs_buf_free(&out);
            cJSON_Delete(root);
            return answer_too_large(api, "detokenized text", e);
        }
    }
    cJSON_Delete(root);
    char *s = out.oom ? NULL : api_utf8_sanitize(out.data ? out.data : "", out.len);
    kvs_buf_free(&out);
    if (!s) {
        srv_api_set_nomem(e);
        return -1;
    }
    kvs_buf_puts(ans, "{\"content\":");
    json_string(ans, s);
    kvs_buf_putc(ans, '}');
    free(s);
    if (ans->oom) { srv_api_set_nomem(e); return -1; }
    if (api->limits.text_answer_bytes > 0 && ans->len > api->limits.text_answer_bytes)
        return answer_too_large(api, "answer", e);
    return 0;
}

static void text_work(api_job *j) {
    text_job *t = (text_job *)j;
    int r = t->detok ? detokenize_body(j->api, j, &t->raw, &t->err) : tokenize_body(j->api, j, &t->raw, &t->err);
    t->failed = r != 0;
    if (t->failed) kvs_buf_free(&t->raw); /* a refused answer gives its bytes back at once */
}

static void text_done(api_job *j) {
    text_job *t = (text_job *)j;
    if (j->req && !j->api->closing) {
        srv_http_set_abort(j->req, NULL, NULL);
        if (t->failed) api_reply_error(j->api, j->req, &t->err, NULL);
        else api_reply(j->api, j->req, 200, "application/json", NULL, t->raw.data, t->raw.len, NULL, -1);
    }
    kvs_buf_free(&t->raw);
    free(t);
}

/* The client left while its /tokenize or /detokenize was out: 499 in the log (nginx's convention), and the work,
 * if it has not started, is skipped (api_offload). */
static void text_abort(void *ud, srv_http_req *req) {
    text_job *t = ud;
    t->job.req = NULL;
    atomic_store(&t->job.cancel, true);
    if (t->job.api->metrics) t->job.api->metrics->requests_finished_abort++;
    api_log_request(t->job.api, req->method_name, req->path, 499, NULL, -1, api_ms_since(req->t_start_ns));
}

static void route_text(srv_api *api, srv_http_req *req, bool detok) {
    text_job *t = calloc(1, sizeof *t);
    if (!t) { api_reply_json(api, req, 500, NULL, NULL, -1); return; }
    t->detok = detok;
    t->job.req = req;
    t->job.work = text_work;
    t->job.done = text_done;
    srv_http_set_abort(req, text_abort, t);
    if (api_offload_text(api, &t->job) == 0) return;
    srv_http_set_abort(req, NULL, NULL);
    free(t);
    api_reply_err(api, req, 503, "server_error", NULL, "text_queue_full", "Retry-After: 1\r\n",
                  "the server is busy: %d /tokenize and /detokenize requests are already waiting (text_queue); "
                  "retry later", (int)api->limits.text_queue);
}

/* ---- dispatch --------------------------------------------------------------------------------------------- */
static bool auth_ok(const srv_api *api, const srv_http_req *req) { return srv_http_bearer_ok(req, api->api_key); }

typedef enum { R_HEALTH, R_MODELS, R_METRICS, R_COMPL, R_CHAT, R_TOK, R_DETOK, R_PROPS, R_PAGE, R_EMBED, R_RESP, R_INFILL, R_MSG, R_MSG_COUNT, R_RERANK } route_id;
typedef struct route { const char *path; int method; route_id id; bool needs_model; } route;
static const route ROUTES[] = {
    {"/health", HTTP_GET, R_HEALTH, false},
    {"/v1/health", HTTP_GET, R_HEALTH, false},
    {"/v1/models", HTTP_GET, R_MODELS, false},
    {"/models", HTTP_GET, R_MODELS, false},
    {"/metrics", HTTP_GET, R_METRICS, false},
    {"/v1/completions", HTTP_POST, R_COMPL, true},
    {"/completions", HTTP_POST, R_COMPL, true},
    {"/v1/chat/completions", HTTP_POST, R_CHAT, true},
    {"/chat/completions", HTTP_POST, R_CHAT, true},
    {"/infill", HTTP_POST, R_INFILL, true},
    {"/v1/responses", HTTP_POST, R_RESP, true},
    {"/responses", HTTP_POST, R_RESP, true},
    {"/v1/messages", HTTP_POST, R_MSG, true},
    {"/v1/messages/count_tokens", HTTP_POST, R_MSG_COUNT, true},
    {"/messages", HTTP_POST, R_MSG, true},
    {"/messages/count_tokens", HTTP_POST, R_MSG_COUNT, true},
    {"/v1/embeddings", HTTP_POST, R_EMBED, true},
    {"/embeddings", HTTP_POST, R_EMBED, true},
    {"/v1/rerank", HTTP_POST, R_RERANK, true},
    {"/rerank", HTTP_POST, R_RERANK, true},
    {"/v2/rerank", HTTP_POST, R_RERANK, true},
    {"/tokenize", HTTP_POST, R_TOK, true},
    {"/detokenize", HTTP_POST, R_DETOK, true},
    {"/props", HTTP_GET, R_PROPS, true},
    {"/", HTTP_GET, R_PAGE, false},
    {"/index.html", HTTP_GET, R_PAGE, false},
};

/* GET /props and GET / come from server/http/web.c; no srv_web: 404. */
static void route_web(srv_api *api, srv_http_req *req, route_id id) {
    if (!api->web) {
        api_reply_err(api, req, 404, NULL, NULL, "not_found", NULL, "no route for %s %s", req->method_name, req->path);
        return;
    }
    if (id == R_PROPS) {
        char *s = srv_web_props_json(api->web);
        if (s) api_reply(api, req, 200, "application/json", NULL, s, strlen(s), NULL, -1);
        else api_reply_json(api, req, 500, NULL, NULL, -1);
        free(s);
        return;
    }
    int status;
    const char *ctype, *headers, *body;
    size_t len;
    srv_web_page(api->web, req, &status, &ctype, &headers, &body, &len);
    api_reply(api, req, status, ctype, headers, body, len, NULL, -1);
}

/* POST /infill: the body translated into a /v1/completions one (api_fim.c), then that route. */
static void route_infill(srv_api *api, srv_http_req *req) {
    srv_api_error e;
    if (api_fim_infill_body(req, &e) != 0) {
        api_reply_error(api, req, &e, NULL);
        return;
    }
    api_route_generate(api, req, SRV_API_COMPLETION);
}

/* OPTIONS: a CORS preflight for a route allowing `methods`. */
static void route_preflight(srv_api *api, srv_http_req *req, const char *methods) {
    char h[1024];
    size_t n = srv_cors_preflight(api->cors, req, methods, h, sizeof h);
    api_reply(api, req, 204, NULL, n < sizeof h ? h : NULL, "", 0, NULL, -1);
}

void srv_api_handle(void *ud, srv_http_req *req) {
    srv_api *api = ud;
    const route *rt = NULL;
    size_t plen = strlen(req->path);
    while (plen > 1 && req->path[plen - 1] == '/') req->path[--plen] = 0; /* "/v1/models/" == "/v1/models" */
    for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0]; i++)
        if (!strcmp(req->path, ROUTES[i].path)) { rt = &ROUTES[i]; break; }
    const char *model_id = !strncmp(req->path, "/v1/models/", 11) ? req->path + 11
                           : !strncmp(req->path, "/models/", 8) ? req->path + 8 : NULL;
    if (api->draining && !(rt && (rt->id == R_HEALTH || rt->id == R_METRICS))) {
        /* readiness already fails (/health); a request that still arrives is turned away at once, and its
         * connection closes after the answer (srv_http_set_keep_alive), so the client reconnects elsewhere */
        if (api->metrics) api->metrics->requests_refused_draining++;
        api_reply_err(api, req, 503, "server_error", NULL, "server_draining", "Retry-After: 1\r\n",
                      "the server is shutting down (draining) and accepts no new requests; "
                      "retry on another replica");
        return;
    }
    if (req->method == HTTP_OPTIONS && (rt || (model_id && *model_id))) {
        route_preflight(api, req, rt && rt->method == HTTP_POST ? "POST" : "GET");
        return;
    }
    if (!rt && model_id && *model_id) {
        if (req->method != HTTP_GET) {
            api_reply_err(api, req, 405, NULL, NULL, "method_not_allowed", "Allow: GET\r\n", "%s %s is not allowed; use GET",
                      req->method_name, req->path);
        } else if (!auth_ok(api, req)) {
            api_reply_err(api, req, 401, "invalid_request_error", NULL, "invalid_api_key", "WWW-Authenticate: Bearer\r\n",
                      "Incorrect or missing API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>')");
        } else {
            route_model(api, req, model_id);
        }
        return;
    }
    if (!rt && !strncmp(req->path, "/slots/", 7) && req->path[7]) { /* llama.cpp's slot API (api_slots.c) */
        if (req->method == HTTP_OPTIONS) route_preflight(api, req, "POST");
        else if (req->method != HTTP_POST)
            api_reply_err(api, req, 405, NULL, NULL, "method_not_allowed", "Allow: POST\r\n",
                          "%s %s is not allowed; use POST", req->method_name, req->path);
        else if (!auth_ok(api, req))
            api_reply_err(api, req, 401, "invalid_request_error", NULL, "invalid_api_key", "WWW-Authenticate: Bearer\r\n",
                          "Incorrect or missing API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>')");
        else if (!api->has_backend)
            api_reply_err(api, req, 503, "server_error", NULL, NULL, "Retry-After: 5\r\n", "the model is still loading");
        else
            api_route_slots(api, req, req->path + 7);
        return;
    }
    if (!rt) {
        api_reply_err(api, req, 404, NULL, NULL, "not_found", NULL, "no route for %s %s", req->method_name, req->path);
        return;
    }
    if (rt->method != req->method) {
        char allow[64];
        snprintf(allow, sizeof allow, "Allow: %s\r\n", rt->method == HTTP_GET ? "GET" : "POST");
        api_reply_err(api, req, 405, NULL, NULL, "method_not_allowed", allow, "%s %s is not allowed; use %s",
                  req->method_name, req->path, rt->method == HTTP_GET ? "GET" : "POST");
        return;
    }
    if (rt->id != R_HEALTH && rt->id != R_PAGE && !auth_ok(api, req)) {
        api_reply_err(api, req, 401, "invalid_request_error", NULL, "invalid_api_key", "WWW-Authenticate: Bearer\r\n",
                  "Incorrect or missing API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>')");
        return;
    }
    if (rt->needs_model && !api->has_backend) {
        api_reply_err(api, req, 503, "server_error", NULL, NULL, "Retry-After: 5\r\n", "the model is still loading");
        return;
    }
    switch (rt->id) {
    case R_HEALTH: route_health(api, req); break;
    case R_MODELS: route_models(api, req); break;
    case R_METRICS: route_metrics(api, req); break;
    case R_COMPL: api_route_generate(api, req, SRV_API_COMPLETION); break;
    case R_CHAT: api_route_generate(api, req, SRV_API_CHAT); break;
    case R_EMBED: api_route_embeddings(api, req); break;
    case R_RERANK: api_route_rerank(api, req); break;
    case R_RESP: api_route_responses(api, req); break;
    case R_MSG: api_route_messages(api, req, false); break;
    case R_MSG_COUNT: api_route_messages(api, req, true); break;
    case R_INFILL: route_infill(api, req); break;
    case R_TOK: route_text(api, req, false); break;
    case R_DETOK: route_text(api, req, true); break;
    case R_PROPS: case R_PAGE: route_web(api, req, rt->id); break;
    }
}

/* ---- lifetime -------------------------------------------------------------------------------------------- */
int srv_api_create(const srv_api_config *cfg, srv_metrics *metrics, srv_api **out) {
    if (!cfg || !out) return SRV_API_ERR_INVALID;
    srv_api *api = calloc(1, sizeof *api);
    if (!api) return SRV_API_ERR_NOMEM;
    api->model_id = strdup(cfg->model_id ? cfg->model_id : "kvserve");
    api->api_key = cfg->api_key && cfg->api_key[0] ? strdup(cfg->api_key) : NULL;
    if (!api->model_id || (cfg->api_key && cfg->api_key[0] && !api->api_key)) { srv_api_free(api); return SRV_API_ERR_NOMEM; }
    api->n_ctx = cfg->n_ctx;
    api->limits = cfg->limits;
    if (api->limits.max_n < 1) api->limits.max_n = 1;
    if (api->limits.max_stop < 0) api->limits.max_stop = 0;
    if (api->limits.max_prompts < 1) api->limits.max_prompts = 1;
    api->log_format = cfg->log_format;
    api->log = cfg->log_stream;
    api->metrics = metrics;
    api->cors = cfg->cors;
    api->web = cfg->web;
    api->parse_special_in_content = cfg->parse_special_in_content;
    api->reasoning_format = cfg->reasoning_format;
    api->loop = cfg->loop;
    api->rng = uv_hrtime() ^ ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid() ^ 0x9E3779B97F4A7C15ULL;
    if (!api->rng) api->rng = 1;
    api->created = (int64_t)time(NULL);
    api->fim[0] = api->fim[1] = api->fim[2] = -1;
    api->bos = -1;
    if (!(api->resp_store = api_resp_store_create())) { srv_api_free(api); return SRV_API_ERR_NOMEM; }
    *out = api;
    return SRV_API_OK;
}

void srv_api_free(srv_api *api) {
    if (!api) return;
    /* Jobs still on the thread pool use their calls: let them finish (their done callbacks see `closing` and
     * only free what they own). */
    api->closing = true;
    while (api->n_jobs > 0 && uv_run(api->loop, UV_RUN_ONCE) >= 0) {}
    while (api->calls) api_call_free(api->calls);
    api_resp_store_free(api->resp_store);
    free(api->model_id);
    free(api->api_key);
    free(api->rank_prompt);
    free(api);
}

void srv_api_set_backend(srv_api *api, const srv_api_backend *be) {
    if (!api) return;
    if (be) { api->be = *be; api->has_backend = true; }
    else { memset(&api->be, 0, sizeof api->be); api->has_backend = false; }
}

void srv_api_set_context_shift(srv_api *api, bool on, int32_t n_keep, int32_t bos) {
    if (!api) return;
    api->context_shift = on;
    api->n_keep = n_keep < -1 ? -1 : n_keep;
    api->bos = bos;
}

int srv_api_set_model(srv_api *api, const char *model_id, int32_t n_ctx, int32_t n_vocab) {
    if (!api) return SRV_API_ERR_INVALID;
    if (model_id) {
        char *id = strdup(model_id);
        if (!id) return SRV_API_ERR_NOMEM;
        free(api->model_id);
        api->model_id = id;
    }
    api->n_ctx = n_ctx;
    api->limits.n_vocab = n_vocab;
    return SRV_API_OK;
}

void srv_api_set_kv_pool(srv_api *api, int32_t n_blocks, int32_t block_size) {
    if (!api) return;
    api->kv_blocks = n_blocks > 0 && block_size > 0 ? n_blocks : 0;
    api->kv_block_size = n_blocks > 0 && block_size > 0 ? block_size : 0;
}

void srv_api_set_draining(srv_api *api) {
    if (!api) return;
    api->draining = true;
    if (api->metrics) api->metrics->draining = true;
}

int32_t srv_api_in_flight(const srv_api *api) { return api ? api->n_calls : 0; }

int32_t srv_api_jobs_out(const srv_api *api) { return api ? api->n_jobs : 0; }

void srv_api_cancel_all(srv_api *api) {
    if (!api) return;
    for (api_call *c = api->calls, *n; c; c = n) {
        n = c->next;
        c->shutdown = true;
        api_cancel_subs(c);
    }
}
