/* api.c: routes, generation requests over the scheduler, responses and SSE (see api.h). */
#include "server/api.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <llhttp.h>

typedef struct api_call api_call;

typedef struct api_choice {
    char *text; size_t text_len, text_cap;  /* non-stream: accumulated text */
    cJSON *lp;            /* non-stream logprobs: completions {tokens, ...} object; chat {content: [...]} */
    size_t lp_offset;     /* completions text_offset of the next token */
    srv_sched_finish finish;
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

struct api_call {
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
};

struct srv_api {
    char *model_id;
    int32_t n_ctx;
    srv_api_limits limits;
    char *api_key;
    srv_log_format log_format;
    FILE *log;
    srv_metrics *metrics;
    srv_api_backend be;
    bool has_backend;
    api_call *calls;
    int32_t n_calls;
    uint64_t rng;
    int64_t created;
};

/* ---- helpers ---------------------------------------------------------------------------------------------- */
static uint64_t rng_next(srv_api *api) {
    uint64_t x = api->rng;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    api->rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static void make_id(srv_api *api, const char *prefix, char *out, size_t cap) {
    snprintf(out, cap, "%s%016" PRIx64 "%08" PRIx32, prefix, rng_next(api), (uint32_t)rng_next(api));
}

/* Copies bytes into a valid UTF-8 string: invalid sequences become U+FFFD. Returns malloc'd or NULL. */
static char *utf8_sanitize(const char *s, size_t n) {
    char *o = malloc(n * 3 + 1);
    if (!o) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++) ok = ((unsigned char)s[i + k] >> 6) == 2;
        if (ok && len == 2 && c < 0xC2) ok = false;
        if (ok && len == 3) {
            unsigned cp = ((c & 15u) << 12) | (((unsigned char)s[i + 1] & 63u) << 6) | ((unsigned char)s[i + 2] & 63u);
            if (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000)) ok = false;
        }
        if (ok && len == 4) {
            unsigned cp = ((c & 7u) << 18) | (((unsigned char)s[i + 1] & 63u) << 12) |
                          (((unsigned char)s[i + 2] & 63u) << 6) | ((unsigned char)s[i + 3] & 63u);
            if (cp < 0x10000 || cp > 0x10FFFF) ok = false;
        }
        if (ok && c == 0) ok = false; /* no NUL inside C strings */
        if (ok) { memcpy(o + j, s + i, len); j += len; i += len; }
        else { memcpy(o + j, "\xEF\xBF\xBD", 3); j += 3; i++; }
    }
    o[j] = 0;
    return o;
}

static void log_request(srv_api *api, const char *method, const char *path, int status,
                        const srv_sched_usage *u, double ttft_ms, double total_ms) {
    if (api->log_format == SRV_LOG_NONE) return;
    FILE *f = api->log ? api->log : stderr;
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int32_t p = u ? u->prompt_tokens : 0, c = u ? u->completion_tokens : 0, k = u ? u->cached_tokens : 0;
    if (api->log_format == SRV_LOG_JSON) {
        cJSON *o = cJSON_CreateObject();
        if (!o) return;
        cJSON_AddStringToObject(o, "ts", ts);
        cJSON_AddStringToObject(o, "method", method ? method : "?");
        cJSON_AddStringToObject(o, "path", path ? path : "?");
        cJSON_AddNumberToObject(o, "status", status);
        cJSON_AddNumberToObject(o, "prompt_tokens", p);
        cJSON_AddNumberToObject(o, "completion_tokens", c);
        cJSON_AddNumberToObject(o, "cached_tokens", k);
        if (ttft_ms >= 0) cJSON_AddNumberToObject(o, "ttft_ms", ttft_ms); else cJSON_AddNullToObject(o, "ttft_ms");
        cJSON_AddNumberToObject(o, "total_ms", total_ms);
        char *s = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (s) fprintf(f, "%s\n", s);
        free(s);
    } else {
        char tt[32] = "-";
        if (ttft_ms >= 0) snprintf(tt, sizeof tt, "%.1fms", ttft_ms);
        fprintf(f, "%s %s %s %d prompt=%d completion=%d cached=%d ttft=%s total=%.1fms\n", ts,
                method ? method : "?", path ? path : "?", status, (int)p, (int)c, (int)k, tt, total_ms);
    }
    fflush(f);
}

static double ms_since(uint64_t t0) { return t0 ? (double)(uv_hrtime() - t0) / 1e6 : 0.0; }

/* Sends a complete response, counts and logs it. Takes ownership of nothing. */
static void reply(srv_api *api, srv_http_req *req, int status, const char *ctype, const char *extra,
                  const char *body, size_t len, const srv_sched_usage *u, double ttft_ms) {
    const char *method = req->method_name;
    char path[256];
    snprintf(path, sizeof path, "%s", req->path ? req->path : "?");
    uint64_t t0 = req->t_start_ns;
    if (api->metrics) srv_metrics_count_http(api->metrics, status);
    srv_http_respond(req, status, ctype, extra, body, len);
    log_request(api, method, path, status, u, ttft_ms, ms_since(t0));
}

static void reply_json(srv_api *api, srv_http_req *req, int status, cJSON *obj, const srv_sched_usage *u,
                       double ttft_ms) {
    char *s = obj ? cJSON_PrintUnformatted(obj) : NULL;
    if (!s) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                  "\"param\":null,\"code\":null}}";
        reply(api, req, 500, "application/json", NULL, oom, sizeof oom - 1, NULL, -1);
        return;
    }
    reply(api, req, status, "application/json", NULL, s, strlen(s), u, ttft_ms);
    free(s);
}

static void reply_error(srv_api *api, srv_http_req *req, const srv_api_error *e, const char *extra) {
    char *s = srv_api_error_json(e);
    if (!s) { reply_json(api, req, 500, NULL, NULL, -1); return; }
    reply(api, req, e->status, "application/json", extra, s, strlen(s), NULL, -1);
    free(s);
}

static void reply_err(srv_api *api, srv_http_req *req, int status, const char *type, const char *param,
                      const char *code, const char *extra, const char *fmt, ...) __attribute__((format(printf, 8, 9)));
static void reply_err(srv_api *api, srv_http_req *req, int status, const char *type, const char *param,
                      const char *code, const char *extra, const char *fmt, ...) {
    srv_api_error e;
    srv_api_set_error(&e, status, type, param, code, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    reply_error(api, req, &e, extra);
}

/* Tokenizes with a growing buffer; *out malloc'd. */
static int tokenize(srv_api *api, const char *text, size_t len, bool add_special, bool parse_special,
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
static int piece(srv_api *api, int32_t tok, char *buf, size_t cap) {
    size_t n = 0;
    if (api->be.token_piece(api->be.ctx, tok, true, buf, cap, &n) != ENG_OK) return -1;
    return (int)n;
}

/* ---- simple routes --------------------------------------------------------------------------------------- */
static void route_health(srv_api *api, srv_http_req *req) {
    cJSON *o = cJSON_CreateObject();
    if (o) cJSON_AddStringToObject(o, "status", api->has_backend ? "ok" : "loading");
    reply_json(api, req, api->has_backend ? 200 : 503, o, NULL, -1);
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
        reply_err(api, req, 404, NULL, "model", "model_not_found", NULL, "The model '%s' does not exist; this "
                  "server serves '%s'", id, api->model_id);
        return;
    }
    cJSON *m = model_json(api);
    reply_json(api, req, 200, m, NULL, -1);
    cJSON_Delete(m);
}

static void route_models(srv_api *api, srv_http_req *req) {
    cJSON *o = cJSON_CreateObject(), *data = cJSON_CreateArray(), *m = model_json(api);
    if (!o || !data || !m) { cJSON_Delete(o); cJSON_Delete(data); cJSON_Delete(m); reply_json(api, req, 500, NULL, NULL, -1); return; }
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToObject(o, "data", data);
    cJSON_AddItemToArray(data, m);
    reply_json(api, req, 200, o, NULL, -1);
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
        reply_json(api, req, 500, NULL, NULL, -1);
        return;
    }
    reply(api, req, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, text, len, NULL, -1);
    free(text);
}

static cJSON *parse_body_object(srv_api *api, srv_http_req *req) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(req->body ? req->body : "", req->body_len, &end, false);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        reply_err(api, req, 400, NULL, NULL, NULL, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

static void route_tokenize(srv_api *api, srv_http_req *req) {
    cJSON *root = parse_body_object(api, req);
    if (!root) return;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(root, "content");
    const cJSON *as = cJSON_GetObjectItemCaseSensitive(root, "add_special");
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(root, "parse_special");
    const cJSON *wp = cJSON_GetObjectItemCaseSensitive(root, "with_pieces");
    const char *bad = !cJSON_IsString(content) ? "content" : (as && !cJSON_IsBool(as) && !cJSON_IsNull(as)) ? "add_special" :
                      (ps && !cJSON_IsBool(ps) && !cJSON_IsNull(ps)) ? "parse_special" :
                      (wp && !cJSON_IsBool(wp) && !cJSON_IsNull(wp)) ? "with_pieces" : NULL;
    if (bad) {
        reply_err(api, req, 400, NULL, bad, NULL, NULL, "'%s' %s", bad,
                  !strcmp(bad, "content") ? "is required and must be a string" : "must be a boolean");
        cJSON_Delete(root);
        return;
    }
    int32_t *toks = NULL, n = 0;
    const char *text = content->valuestring;
    int r = tokenize(api, text, strlen(text), cJSON_IsTrue(as), ps ? !cJSON_IsFalse(ps) : true, &toks, &n);
    if (r != 0) {
        reply_err(api, req, 500, "server_error", NULL, NULL, NULL, "tokenization failed: %s", eng_strerror(r));
        cJSON_Delete(root);
        return;
    }
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "tokens");
    for (int32_t i = 0; arr && i < n; i++) {
        if (cJSON_IsTrue(wp)) {
            char buf[256];
            int l = piece(api, toks[i], buf, sizeof buf);
            char *s = utf8_sanitize(buf, l > 0 ? (size_t)l : 0);
            cJSON *t = cJSON_CreateObject();
            cJSON_AddNumberToObject(t, "id", toks[i]);
            cJSON_AddStringToObject(t, "piece", s ? s : "");
            free(s);
            cJSON_AddItemToArray(arr, t);
        } else {
            cJSON_AddItemToArray(arr, cJSON_CreateNumber(toks[i]));
        }
    }
    free(toks);
    reply_json(api, req, 200, o, NULL, -1);
    cJSON_Delete(o);
    cJSON_Delete(root);
}

static void route_detokenize(srv_api *api, srv_http_req *req) {
    cJSON *root = parse_body_object(api, req);
    if (!root) return;
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!cJSON_IsArray(toks)) {
        reply_err(api, req, 400, NULL, "tokens", NULL, NULL, "'tokens' is required and must be an array of token ids");
        cJSON_Delete(root);
        return;
    }
    size_t cap = 256, len = 0;
    char *out = malloc(cap);
    int i = 0;
    for (const cJSON *t = toks->child; out && t; t = t->next, i++) {
        double v = cJSON_IsNumber(t) ? t->valuedouble : -1;
        if (v < 0 || v != (double)(int64_t)v || (api->limits.n_vocab > 0 && v >= api->limits.n_vocab) ||
            v > INT32_MAX) {
            reply_err(api, req, 400, NULL, "tokens", NULL, NULL, "'tokens' item %d is not a valid token id", i);
            free(out);
            cJSON_Delete(root);
            return;
        }
        char buf[256];
        int l = piece(api, (int32_t)v, buf, sizeof buf);
        if (l < 0) continue;
        if (len + (size_t)l + 1 > cap) {
            while (len + (size_t)l + 1 > cap) cap *= 2;
            char *p = realloc(out, cap);
            if (!p) { free(out); out = NULL; break; }
            out = p;
        }
        memcpy(out + len, buf, (size_t)l);
        len += (size_t)l;
    }
    char *s = out ? utf8_sanitize(out, len) : NULL;
    free(out);
    cJSON *o = cJSON_CreateObject();
    if (o && s) cJSON_AddStringToObject(o, "content", s);
    free(s);
    reply_json(api, req, 200, s || !out ? o : NULL, NULL, -1);
    cJSON_Delete(o);
    cJSON_Delete(root);
}

/* ---- generation ---------------------------------------------------------------------------------------------- */
static void call_free(api_call *c) {
    if (!c) return;
    srv_api *api = c->api;
    if (c->prev) c->prev->next = c->next; else if (api->calls == c) api->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    api->n_calls--;
    for (int32_t i = 0; i < c->n_choices; i++) { free(c->choices[i].text); cJSON_Delete(c->choices[i].lp); }
    for (int32_t i = 0; i < c->n_subs; i++) free(c->subs[i].echo);
    free(c->choices);
    free(c->subs);
    srv_api_gen_free(&c->gen);
    free(c);
}

static void cancel_subs(api_call *c) {
    for (int32_t i = 0; i < c->n_subs; i++)
        if (c->subs[i].submitted && !c->subs[i].done) c->api->be.cancel(c->api->be.ctx, c->subs[i].id);
}

static void on_abort(void *ud, srv_http_req *req) {
    (void)req;
    api_call *c = ud;
    c->req = NULL;
    if (c->api->metrics) c->api->metrics->requests_finished_abort++;
    /* 499: the client closed the connection before the answer was complete (nginx's convention) */
    log_request(c->api, c->method, c->path, 499, &c->usage, -1, ms_since(c->t_arrival));
    cancel_subs(c);
}

static cJSON *usage_json(const srv_sched_usage *u) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(o, "total_tokens", (double)u->prompt_tokens + u->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(o, "prompt_tokens_details");
    if (d) cJSON_AddNumberToObject(d, "cached_tokens", u->cached_tokens);
    return o;
}

static cJSON *chunk_base(api_call *c) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", c->gen.kind == SRV_API_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddStringToObject(o, "model", c->api->model_id);
    return o;
}

/* Writes `data: <json>\n\n` (or the literal [DONE]); on a stalled or closed client, drops the stream and
 * cancels the generation. Consumes obj. */
static void sse_send(api_call *c, cJSON *obj, const char *literal) {
    if (!c->req) { cJSON_Delete(obj); return; }
    char *s = literal ? NULL : (obj ? cJSON_PrintUnformatted(obj) : NULL);
    cJSON_Delete(obj);
    const char *payload = literal ? literal : s;
    if (!payload) return;
    size_t pl = strlen(payload);
    char *msg = malloc(pl + 9);
    if (!msg) { free(s); return; }
    memcpy(msg, "data: ", 6);
    memcpy(msg + 6, payload, pl);
    memcpy(msg + 6 + pl, "\n\n", 3);
    free(s);
    int r = srv_http_stream_write(c->req, msg, pl + 8);
    free(msg);
    if (r != 0 && !c->req) return; /* the write found the connection gone: on_abort already cleaned up */
    if (r != 0) { /* the client does not read (or is gone): stop generating for it */
        srv_http_req *req = c->req;
        c->req = NULL;
        if (c->api->metrics) c->api->metrics->requests_finished_abort++;
        log_request(c->api, c->method, c->path, 499, &c->usage, -1, ms_since(c->t_arrival));
        srv_http_abort(req);
        cancel_subs(c);
    }
}

static cJSON *bytes_array(const char *p, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)p[i]));
    return a;
}

/* Appends the logprobs of samples to lp (the choice's accumulator or a chunk's logprobs object). */
static void add_logprobs(api_call *c, api_choice *ch, cJSON *lp, const eng_sample *smp, int32_t n) {
    srv_api *api = c->api;
    char buf[256];
    if (c->gen.kind == SRV_API_CHAT) {
        cJSON *content = cJSON_GetObjectItemCaseSensitive(lp, "content");
        for (int32_t i = 0; content && i < n; i++) {
            int l = piece(api, smp[i].token, buf, sizeof buf);
            if (l < 0) l = 0;
            char *s = utf8_sanitize(buf, (size_t)l);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "token", s ? s : "");
            cJSON_AddNumberToObject(e, "logprob", smp[i].logprob);
            cJSON_AddItemToObject(e, "bytes", bytes_array(buf, l));
            free(s);
            cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
            int32_t nt = smp[i].n_top < c->gen.top_logprobs ? smp[i].n_top : c->gen.top_logprobs;
            for (int32_t k = 0; tops && k < nt; k++) {
                int tl = piece(api, smp[i].top_token[k], buf, sizeof buf);
                if (tl < 0) tl = 0;
                char *ts = utf8_sanitize(buf, (size_t)tl);
                cJSON *t = cJSON_CreateObject();
                cJSON_AddStringToObject(t, "token", ts ? ts : "");
                cJSON_AddNumberToObject(t, "logprob", smp[i].top_logprob[k]);
                cJSON_AddItemToObject(t, "bytes", bytes_array(buf, tl));
                free(ts);
                cJSON_AddItemToArray(tops, t);
            }
            cJSON_AddItemToArray(content, e);
        }
        return;
    }
    cJSON *tokens = cJSON_GetObjectItemCaseSensitive(lp, "tokens");
    cJSON *tlp = cJSON_GetObjectItemCaseSensitive(lp, "token_logprobs");
    cJSON *tops = cJSON_GetObjectItemCaseSensitive(lp, "top_logprobs");
    cJSON *offs = cJSON_GetObjectItemCaseSensitive(lp, "text_offset");
    if (!tokens || !tlp || !tops || !offs) return;
    for (int32_t i = 0; i < n; i++) {
        int l = piece(api, smp[i].token, buf, sizeof buf);
        if (l < 0) l = 0;
        char *s = utf8_sanitize(buf, (size_t)l);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(s ? s : ""));
        free(s);
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(smp[i].logprob));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)ch->lp_offset));
        ch->lp_offset += (size_t)l;
        cJSON *m = cJSON_CreateObject();
        int32_t nt = smp[i].n_top < c->gen.top_logprobs ? smp[i].n_top : c->gen.top_logprobs;
        for (int32_t k = 0; m && k < nt; k++) {
            int tl = piece(api, smp[i].top_token[k], buf, sizeof buf);
            if (tl < 0) tl = 0;
            char *ts = utf8_sanitize(buf, (size_t)tl);
            if (ts && !cJSON_GetObjectItemCaseSensitive(m, ts))
                cJSON_AddNumberToObject(m, ts, smp[i].top_logprob[k]);
            free(ts);
        }
        cJSON_AddItemToArray(tops, m ? m : cJSON_CreateNull());
    }
}

static cJSON *new_logprobs(api_call *c) {
    cJSON *lp = cJSON_CreateObject();
    if (!lp) return NULL;
    if (c->gen.kind == SRV_API_CHAT) {
        cJSON_AddArrayToObject(lp, "content");
        cJSON_AddNullToObject(lp, "refusal");
    } else {
        cJSON_AddArrayToObject(lp, "tokens");
        cJSON_AddArrayToObject(lp, "token_logprobs");
        cJSON_AddArrayToObject(lp, "top_logprobs");
        cJSON_AddArrayToObject(lp, "text_offset");
    }
    return lp;
}

static const char *finish_name(srv_sched_finish f) {
    switch (f) {
    case SRV_SCHED_FINISH_STOP: return "stop";
    case SRV_SCHED_FINISH_LENGTH: return "length";
    case SRV_SCHED_FINISH_CANCELLED: return "abort";
    case SRV_SCHED_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

/* One streamed chunk for choice idx: text (may be NULL), logprob samples, finish reason (NONE: null). */
static void stream_chunk(api_call *c, int32_t idx, const char *text, size_t len, const eng_sample *smp,
                         int32_t n_smp, srv_sched_finish finish, bool role) {
    cJSON *o = chunk_base(c);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", idx);
    char *s = text ? utf8_sanitize(text, len) : NULL;
    if (c->gen.kind == SRV_API_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (role) { cJSON_AddStringToObject(d, "role", "assistant"); cJSON_AddStringToObject(d, "content", ""); }
        if (s) cJSON_AddStringToObject(d, "content", s);
    } else {
        cJSON_AddStringToObject(ch, "text", s ? s : "");
    }
    free(s);
    if (c->gen.logprobs && n_smp > 0) {
        cJSON *lp = new_logprobs(c);
        add_logprobs(c, &c->choices[idx], lp, smp, n_smp);
        cJSON_AddItemToObject(ch, "logprobs", lp);
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    const char *fn = finish_name(finish);
    if (fn) cJSON_AddStringToObject(ch, "finish_reason", fn); else cJSON_AddNullToObject(ch, "finish_reason");
    if (c->gen.include_usage) cJSON_AddNullToObject(o, "usage");
    sse_send(c, o, NULL);
}

static int append_text(api_choice *ch, const char *t, size_t n) {
    if (!n) return 0;
    if (ch->text_len + n + 1 > ch->text_cap) {
        size_t cap = ch->text_cap ? ch->text_cap : 256;
        while (cap < ch->text_len + n + 1) cap *= 2;
        char *p = realloc(ch->text, cap);
        if (!p) return -1;
        ch->text = p; ch->text_cap = cap;
    }
    memcpy(ch->text + ch->text_len, t, n);
    ch->text_len += n;
    ch->text[ch->text_len] = 0;
    return 0;
}

static void finish_call(api_call *c) {
    srv_api *api = c->api;
    double ttft_ms = c->t_first_token ? (double)(c->t_first_token - c->t_arrival) / 1e6 : -1;
    if (!c->req) { call_free(c); return; }
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
                if (msg) { strcpy(msg, s); sse_send(c, NULL, msg); free(msg); }
                free(s);
            }
        } else if (c->gen.include_usage) {
            cJSON *o = chunk_base(c);
            cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToObject(o, "usage", usage_json(&c->usage));
            sse_send(c, o, NULL);
        }
        sse_send(c, NULL, "[DONE]");
        if (c->req) {
            if (api->metrics) srv_metrics_count_http(api->metrics, 200);
            srv_http_stream_end(c->req);
            log_request(api, c->method, c->path, 200, &c->usage, ttft_ms, ms_since(c->t_arrival));
        }
        c->req = NULL;
        call_free(c);
        return;
    }
    if (error) {
        reply_error(api, req, &e, NULL);
        call_free(c);
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
        char *s = utf8_sanitize(ch->text ? ch->text : "", ch->text_len);
        if (c->gen.kind == SRV_API_CHAT) {
            cJSON *m = cJSON_AddObjectToObject(j, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON_AddStringToObject(m, "content", s ? s : "");
        } else {
            cJSON_AddStringToObject(j, "text", s ? s : "");
        }
        free(s);
        if (ch->lp) { cJSON_AddItemToObject(j, "logprobs", ch->lp); ch->lp = NULL; }
        else cJSON_AddNullToObject(j, "logprobs");
        const char *fn = finish_name(ch->finish);
        cJSON_AddStringToObject(j, "finish_reason", fn ? fn : "stop");
    }
    cJSON_AddItemToObject(o, "usage", usage_json(&c->usage));
    reply_json(api, req, 200, o, &c->usage, ttft_ms);
    cJSON_Delete(o);
    call_free(c);
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
        if (c->n_live == 0) finish_call(c);
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
        if (c->stream) {
            if (ev->text_len > 0 || (c->gen.logprobs && ev->n_samples > 0))
                stream_chunk(c, idx, ev->text, ev->text_len, ev->samples, ev->n_samples, SRV_SCHED_FINISH_NONE,
                             false);
        } else {
            if (append_text(ch, ev->text, ev->text_len)) { c->has_error = true; srv_api_set_error(&c->error, 500, "server_error", NULL, NULL, "out of memory"); }
            if (c->gen.logprobs && ev->n_samples > 0) {
                if (!ch->lp) ch->lp = new_logprobs(c);
                if (ch->lp) add_logprobs(c, ch, ch->lp, ev->samples, ev->n_samples);
            }
        }
        return;
    }
    if (ev->type == SRV_SCHED_EV_CHOICE_END) {
        ch->ended = true;
        ch->finish = ev->finish;
        if (ev->finish == SRV_SCHED_FINISH_ERROR && !c->has_error) {
            c->has_error = true;
            const char *msg = ev->error ? ev->error : "generation failed";
            bool client = strstr(msg, "does not fit") != NULL;
            srv_api_set_error(&c->error, client ? 400 : 500, client ? "invalid_request_error" : "server_error",
                              NULL, NULL, "%s", msg);
        }
        if (c->stream) {
            if (ev->text_len > 0) stream_chunk(c, idx, ev->text, ev->text_len, NULL, 0, SRV_SCHED_FINISH_NONE, false);
            if (ev->finish != SRV_SCHED_FINISH_ERROR && ev->finish != SRV_SCHED_FINISH_CANCELLED)
                stream_chunk(c, idx, NULL, 0, NULL, 0, ev->finish, false);
        } else {
            append_text(ch, ev->text, ev->text_len);
        }
    }
}

static int submit_error_status(int r, srv_api_error *e, int32_t n_ctx, int32_t n_prompt) {
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
        srv_api_set_error(e, 500, "server_error", NULL, NULL, "could not queue the request (scheduler error %d)", r);
        return 500;
    }
}

/* Builds the prompt tokens of prompt i (chat: the rendered conversation). */
static int build_prompt(srv_api *api, api_call *c, int32_t i, int32_t **toks, int32_t *n, srv_api_error *e) {
    srv_api_gen *g = &c->gen;
    if (g->kind == SRV_API_CHAT) {
        eng_chat_msg *m = calloc((size_t)g->n_msgs, sizeof *m);
        if (!m) goto oom;
        for (int32_t k = 0; k < g->n_msgs; k++) { m[k].role = g->msgs[k].role; m[k].content = g->msgs[k].content; }
        char *text = NULL;
        int r = api->be.chat_render(api->be.ctx, m, (size_t)g->n_msgs, &text);
        free(m);
        if (r != 0) {
            srv_api_set_error(e, r == ENG_ERR_NOMEM ? 500 : 400, r == ENG_ERR_NOMEM ? "server_error" : NULL,
                              "messages", NULL, "the messages could not be rendered with the chat template: %s",
                              eng_strerror(r));
            return -1;
        }
        r = tokenize(api, text, strlen(text), true, true, toks, n);
        free(text);
        if (r != 0) goto tokfail;
        return 0;
    }
    srv_api_prompt *p = &g->prompts[i];
    if (p->tokens) {
        if (!(*toks = malloc((size_t)p->n_tokens * sizeof **toks))) goto oom;
        memcpy(*toks, p->tokens, (size_t)p->n_tokens * sizeof **toks);
        *n = p->n_tokens;
    } else {
        int r = tokenize(api, p->text, strlen(p->text), true, true, toks, n);
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
                int l = piece(api, p->tokens[k], tb, sizeof tb);
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

static void route_generate(srv_api *api, srv_http_req *req, srv_api_kind kind) {
    srv_api_error e;
    api_call *c = calloc(1, sizeof *c);
    if (!c) { reply_json(api, req, 500, NULL, NULL, -1); return; }
    c->api = api;
    c->next = api->calls;
    if (api->calls) api->calls->prev = c;
    api->calls = c;
    api->n_calls++;
    c->t_arrival = req->t_start_ns ? req->t_start_ns : uv_hrtime();
    c->method = req->method_name;
    c->path = kind == SRV_API_CHAT ? "/v1/chat/completions" : "/v1/completions";
    int r = srv_api_parse_gen(kind, req->body, req->body_len, &api->limits, &c->gen, &e);
    if (r != 0) { reply_error(api, req, &e, NULL); call_free(c); return; }
    srv_api_gen *g = &c->gen;
    c->n_subs = kind == SRV_API_CHAT ? 1 : g->n_prompts;
    c->n_choices = c->n_subs * g->n;
    c->subs = calloc((size_t)c->n_subs, sizeof *c->subs);
    c->choices = calloc((size_t)c->n_choices, sizeof *c->choices);
    if (!c->subs || !c->choices) { reply_json(api, req, 500, NULL, NULL, -1); call_free(c); return; }
    make_id(api, kind == SRV_API_CHAT ? "chatcmpl-" : "cmpl-", c->id, sizeof c->id);
    c->created = (int64_t)time(NULL);
    c->stream = g->stream;
    /* Tokenize and check every prompt before queueing anything. */
    int32_t **toks = calloc((size_t)c->n_subs, sizeof *toks);
    int32_t *ntok = calloc((size_t)c->n_subs, sizeof *ntok);
    bool fail = !toks || !ntok;
    if (fail) srv_api_set_error(&e, 500, "server_error", NULL, NULL, "out of memory");
    for (int32_t i = 0; !fail && i < c->n_subs; i++) {
        c->subs[i].call = c;
        c->subs[i].prompt_index = i;
        if (build_prompt(api, c, i, &toks[i], &ntok[i], &e)) { fail = true; break; }
        const char *param = kind == SRV_API_CHAT ? "messages" : "prompt";
        if (ntok[i] < 1) {
            srv_api_set_error(&e, 400, NULL, param, NULL, "the prompt is empty (0 tokens)");
            fail = true;
        } else if (api->n_ctx > 0 && (ntok[i] >= api->n_ctx ||
                                      (g->max_tokens > 0 && (int64_t)ntok[i] + g->max_tokens > api->n_ctx))) {
            if (g->max_tokens > 0)
                srv_api_set_error(&e, 400, NULL, param, "context_length_exceeded",
                                  "This model's maximum context length is %d tokens. However, you requested %lld "
                                  "tokens (%d in the prompt, %d for the completion). Please reduce the prompt or "
                                  "max_tokens.", (int)api->n_ctx, (long long)ntok[i] + g->max_tokens,
                                  (int)ntok[i], (int)g->max_tokens);
            else
                srv_api_set_error(&e, 400, NULL, param, "context_length_exceeded",
                                  "This model's maximum context length is %d tokens. However, the prompt has %d "
                                  "tokens.", (int)api->n_ctx, (int)ntok[i]);
            fail = true;
        }
    }
    /* Queue one scheduler request per prompt. */
    const char *extra = NULL;
    for (int32_t i = 0; !fail && i < c->n_subs; i++) {
        srv_sched_request sr;
        memset(&sr, 0, sizeof sr);
        sr.prompt = toks[i];
        sr.n_prompt = ntok[i];
        sr.n = g->n;
        sr.max_tokens = g->max_tokens;
        eng_sampling_params_default(&sr.sampling);
        sr.sampling.temperature = g->temperature;
        sr.sampling.top_k = g->top_k;
        sr.sampling.top_p = g->top_p;
        sr.sampling.min_p = g->min_p;
        sr.sampling.repetition_penalty = g->repetition_penalty;
        sr.sampling.presence_penalty = g->presence_penalty;
        sr.sampling.frequency_penalty = g->frequency_penalty;
        sr.sampling.seed = g->has_seed ? g->seed + (uint64_t)i * (uint64_t)g->n : rng_next(api);
        sr.sampling.logit_bias = g->logit_bias;
        sr.sampling.n_logit_bias = (size_t)g->n_logit_bias;
        sr.sampling.n_top_logprobs = g->logprobs ? g->top_logprobs : 0;
        sr.stop = (const char *const *)g->stop;
        sr.n_stop = (size_t)g->n_stop;
        sr.ignore_eos = g->ignore_eos;
        /* repetition_penalty (llama.cpp/vLLM meaning) also looks at the prompt; OpenAI's presence/frequency
         * penalties alone look only at generated tokens */
        sr.penalize_prompt = g->repetition_penalty != 1.0f;
        sr.cb = on_sched_event;
        sr.user = &c->subs[i];
        r = api->be.submit(api->be.ctx, &sr, &c->subs[i].id);
        if (r != 0) {
            int st = submit_error_status(r, &e, api->n_ctx, ntok[i]);
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
        if (c->n_live == 0) { reply_error(api, req, &e, extra); call_free(c); return; }
        /* Some prompts were queued: cancel them, answer with the error once they are gone. */
        c->req = req;
        c->has_error = true;
        c->error = e;
        c->stream = false;
        srv_http_set_abort(req, on_abort, c);
        cancel_subs(c);
        return;
    }
    c->req = req;
    srv_http_set_abort(req, on_abort, c);
    if (c->stream) {
        if (srv_http_stream_begin(req, 200, "text/event-stream", "Cache-Control: no-cache\r\n") != 0) {
            c->req = NULL;
            srv_http_abort(req);
            cancel_subs(c);
            return;
        }
        for (int32_t i = 0; i < c->n_choices && c->req; i++) {
            api_sub *s = &c->subs[i / g->n];
            if (kind == SRV_API_CHAT) stream_chunk(c, i, NULL, 0, NULL, 0, SRV_SCHED_FINISH_NONE, true);
            else if (s->echo) stream_chunk(c, i, s->echo, s->echo_len, NULL, 0, SRV_SCHED_FINISH_NONE, false);
        }
    } else {
        for (int32_t i = 0; i < c->n_choices; i++) {
            api_sub *s = &c->subs[i / g->n];
            if (s->echo) {
                append_text(&c->choices[i], s->echo, s->echo_len);
                c->choices[i].lp_offset = s->echo_len;
            }
        }
    }
}

/* ---- dispatch --------------------------------------------------------------------------------------------- */
static bool auth_ok(const srv_api *api, const srv_http_req *req) {
    if (!api->api_key || !api->api_key[0]) return true;
    const char *h = srv_http_header_get(req, "authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    size_t a = strlen(h), b = strlen(api->api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a; i++) diff |= (unsigned char)h[i] ^ (unsigned char)api->api_key[i % (b ? b : 1)];
    return diff == 0;
}

typedef enum { R_HEALTH, R_MODELS, R_METRICS, R_COMPL, R_CHAT, R_TOK, R_DETOK } route_id;
typedef struct route { const char *path; int method; route_id id; bool needs_model; } route;
static const route ROUTES[] = {
    {"/health", HTTP_GET, R_HEALTH, false},
    {"/v1/models", HTTP_GET, R_MODELS, false},
    {"/metrics", HTTP_GET, R_METRICS, false},
    {"/v1/completions", HTTP_POST, R_COMPL, true},
    {"/v1/chat/completions", HTTP_POST, R_CHAT, true},
    {"/tokenize", HTTP_POST, R_TOK, true},
    {"/detokenize", HTTP_POST, R_DETOK, true},
};

void srv_api_handle(void *ud, srv_http_req *req) {
    srv_api *api = ud;
    const route *rt = NULL;
    size_t plen = strlen(req->path);
    while (plen > 1 && req->path[plen - 1] == '/') req->path[--plen] = 0; /* "/v1/models/" == "/v1/models" */
    for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0]; i++)
        if (!strcmp(req->path, ROUTES[i].path)) { rt = &ROUTES[i]; break; }
    if (!rt && !strncmp(req->path, "/v1/models/", 11) && req->path[11]) {
        if (req->method != HTTP_GET) {
            reply_err(api, req, 405, NULL, NULL, "method_not_allowed", "Allow: GET\r\n", "%s %s is not allowed; use GET",
                      req->method_name, req->path);
        } else if (!auth_ok(api, req)) {
            reply_err(api, req, 401, "invalid_request_error", NULL, "invalid_api_key", "WWW-Authenticate: Bearer\r\n",
                      "Incorrect or missing API key: send the header 'Authorization: Bearer <key>'");
        } else {
            route_model(api, req, req->path + 11);
        }
        return;
    }
    if (!rt) {
        reply_err(api, req, 404, NULL, NULL, "not_found", NULL, "no route for %s %s", req->method_name, req->path);
        return;
    }
    if (rt->method != req->method) {
        char allow[64];
        snprintf(allow, sizeof allow, "Allow: %s\r\n", rt->method == HTTP_GET ? "GET" : "POST");
        reply_err(api, req, 405, NULL, NULL, "method_not_allowed", allow, "%s %s is not allowed; use %s",
                  req->method_name, req->path, rt->method == HTTP_GET ? "GET" : "POST");
        return;
    }
    if (rt->id != R_HEALTH && !auth_ok(api, req)) {
        reply_err(api, req, 401, "invalid_request_error", NULL, "invalid_api_key", "WWW-Authenticate: Bearer\r\n",
                  "Incorrect or missing API key: send the header 'Authorization: Bearer <key>'");
        return;
    }
    if (rt->needs_model && !api->has_backend) {
        reply_err(api, req, 503, "server_error", NULL, NULL, "Retry-After: 5\r\n", "the model is still loading");
        return;
    }
    switch (rt->id) {
    case R_HEALTH: route_health(api, req); break;
    case R_MODELS: route_models(api, req); break;
    case R_METRICS: route_metrics(api, req); break;
    case R_COMPL: route_generate(api, req, SRV_API_COMPLETION); break;
    case R_CHAT: route_generate(api, req, SRV_API_CHAT); break;
    case R_TOK: route_tokenize(api, req); break;
    case R_DETOK: route_detokenize(api, req); break;
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
    api->rng = uv_hrtime() ^ ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid() ^ 0x9E3779B97F4A7C15ULL;
    if (!api->rng) api->rng = 1;
    api->created = (int64_t)time(NULL);
    *out = api;
    return SRV_API_OK;
}

void srv_api_free(srv_api *api) {
    if (!api) return;
    while (api->calls) call_free(api->calls);
    free(api->model_id);
    free(api->api_key);
    free(api);
}

void srv_api_set_backend(srv_api *api, const srv_api_backend *be) {
    if (!api) return;
    if (be) { api->be = *be; api->has_backend = true; }
    else { memset(&api->be, 0, sizeof api->be); api->has_backend = false; }
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

int32_t srv_api_in_flight(const srv_api *api) { return api ? api->n_calls : 0; }

void srv_api_cancel_all(srv_api *api) {
    if (!api) return;
    for (api_call *c = api->calls, *n; c; c = n) {
        n = c->next;
        c->shutdown = true;
        cancel_subs(c);
    }
}
