/* api_base.c: the base of server/api/, which every file of the folder may use and which uses none of them (only
 * the strict JSON checker, json_check.c): error bodies and the replies that carry them, JSON kind names and the
 * one field() helper, UTF-8 sanitizing, the strict JSON pass, the request log (see api_internal.h). */
#include "server/api/api_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/api/json_check_internal.h"

/* ---- errors and JSON -------------------------------------------------------------------------------------- */
void srv_api_set_error(srv_api_error *err, int status, const char *type, const char *param, const char *code,
                       const char *fmt, ...) {
    if (!err) return;
    err->status = status;
    err->type = type ? type : "invalid_request_error";
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

int srv_api_set_nomem(srv_api_error *err) {
    srv_api_set_error(err, 500, "server_error", NULL, NULL, "out of memory");
    return SRV_API_ERR_NOMEM;
}

char *srv_api_error_json(const srv_api_error *err) {
    cJSON *root = cJSON_CreateObject(), *e = cJSON_CreateObject();
    if (!root || !e) { cJSON_Delete(root); cJSON_Delete(e); return NULL; }
    cJSON_AddItemToObject(root, "error", e);
    /* A message quoting the request may be cut inside a UTF-8 sequence (or quote a raw URL byte): the JSON must
     * stay valid UTF-8 (found by fuzz_api). */
    char *msg = api_utf8_sanitize(err->message, strlen(err->message));
    char *param = api_utf8_sanitize(err->param, strlen(err->param));
    if (!msg || !param) { free(msg); free(param); cJSON_Delete(root); return NULL; }
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", err->type ? err->type : "invalid_request_error");
    if (param[0]) cJSON_AddStringToObject(e, "param", param); else cJSON_AddNullToObject(e, "param");
    if (err->code) cJSON_AddStringToObject(e, "code", err->code); else cJSON_AddNullToObject(e, "code");
    free(msg);
    free(param);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static const char *anthropic_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 408: return "timeout_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *srv_api_error_json_anthropic(const srv_api_error *err) {
    char *msg = api_utf8_sanitize(err->message, strlen(err->message));
    cJSON *root = cJSON_CreateObject(), *e = cJSON_CreateObject();
    if (!msg || !root || !e) { free(msg); cJSON_Delete(root); cJSON_Delete(e); return NULL; }
    cJSON_AddStringToObject(root, "type", "error");
    cJSON_AddItemToObject(root, "error", e);
    bool ok = cJSON_AddStringToObject(e, "type", anthropic_type(err->status)) &&
              cJSON_AddStringToObject(e, "message", msg);
    free(msg);
    char *s = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

bool srv_api_path_anthropic(const char *path) {
    if (path && !strncmp(path, "/v1", 3)) path += 3;
    return path && !strncmp(path, "/messages", 9) && (path[9] == 0 || path[9] == '/' || path[9] == '?');
}

const char *srv_api_json_kind(const cJSON *j) {
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "null";
}

const cJSON *srv_api_json_field(const cJSON *o, const char *name) {
    const cJSON *f = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, name) : NULL;
    return (f && !cJSON_IsNull(f)) ? f : NULL;
}

const char *srv_api_json_str(const cJSON *o, const char *name) {
    const cJSON *f = srv_api_json_field(o, name);
    return cJSON_IsString(f) ? f->valuestring : NULL;
}

/* Copies bytes into a valid UTF-8 string: invalid sequences (and NUL) become U+FFFD. Returns malloc'd or NULL. */
char *api_utf8_sanitize(const char *s, size_t n) {
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

int srv_api_check_json(const char *body, size_t len, srv_api_error *err) {
    srv_json_check_result res;
    if (len == 0 || !body) {
        srv_api_set_error(err, 400, NULL, NULL, NULL, "the request body is empty (expected a JSON object)");
        return SRV_API_ERR_INVALID;
    }
    if (srv_json_check(body, len, SRV_JSON_CHECK_MAX_DEPTH, &res) != 0) {
        srv_api_set_error(err, 400, NULL, NULL, NULL, "the request body is not valid JSON: %s", res.message);
        return SRV_API_ERR_INVALID;
    }
    return SRV_API_OK;
}

int srv_api_check_dup_keys(const cJSON *root, srv_api_error *err) {
    srv_json_check_result res;
    int r = srv_json_check_dup_keys(root, &res);
    if (r == KVS_ERR_NOMEM) {
        srv_api_set_nomem(err);
        return SRV_API_ERR_NOMEM;
    }
    if (r != 0) {
        srv_api_set_error(err, 400, NULL, NULL, NULL, "the request body is not accepted: %s (a key may appear "
                          "once per object)", res.message);
        return SRV_API_ERR_INVALID;
    }
    return SRV_API_OK;
}

cJSON *api_parse_body_object(const char *body, size_t body_len, srv_api_error *e) {
    if (srv_api_check_json(body, body_len, e) != SRV_API_OK) return NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body ? body : "", body_len, &end, false);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        srv_api_set_error(e, 400, NULL, NULL, NULL, "the request body must be a JSON object");
        return NULL;
    }
    if (srv_api_check_dup_keys(root, e) != SRV_API_OK) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* ---- the request log -------------------------------------------------------------------------------------- */
/* The request log's UTC timestamp, e.g. 2026-11-24T21:04:33Z. */
static void log_timestamp(char ts[32]) {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

void api_log_request(srv_api *api, const char *method, const char *path, int status, const srv_sched_usage *u,
                     double ttft_ms, double total_ms) {
    if (api->log_format == SRV_API_LOG_NONE) return;
    FILE *f = api->log ? api->log : stderr;
    char ts[32];
    log_timestamp(ts);
    int32_t p = u ? u->prompt_tokens : 0, c = u ? u->completion_tokens : 0, k = u ? u->cached_tokens : 0;
    if (api->log_format == SRV_API_LOG_JSON) {
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

void api_log_truncated(srv_api *api, const api_call *c, int32_t idx) {
    if (api->log_format == SRV_API_LOG_NONE) return;
    FILE *f = api->log ? api->log : stderr;
    char ts[32];
    log_timestamp(ts);
    long long tokens = (long long)api->kv_blocks * api->kv_block_size;
    if (api->log_format == SRV_API_LOG_JSON)
        fprintf(f, "{\"ts\":\"%s\",\"level\":\"warning\",\"event\":\"kv_pool_truncated\",\"id\":\"%s\","
                   "\"choice\":%d,\"kv_pool_tokens\":%lld}\n", ts, c->id, (int)idx, tokens);
    else
        fprintf(f, "%s warning: %s choice %d cut with finish_reason length: its context outgrew the whole KV cache "
                   "(%lld tokens)\n", ts, c->id, (int)idx, tokens);
    fflush(f);
}

double api_ms_since(uint64_t t0) { return t0 ? (double)(uv_hrtime() - t0) / 1e6 : 0.0; }

/* ---- replies ---------------------------------------------------------------------------------------------- */
/* Sends a complete response, counts and logs it. Takes ownership of nothing. */
void api_reply(srv_api *api, srv_http_req *req, int status, const char *ctype, const char *extra, const char *body,
               size_t len, const srv_sched_usage *u, double ttft_ms) {
    const char *method = req->method_name;
    char path[256];
    snprintf(path, sizeof path, "%s", req->path ? req->path : "?");
    uint64_t t0 = req->t_start_ns;
    if (api->metrics) srv_metrics_count_http(api->metrics, status);
    srv_http_respond(req, status, ctype, extra, body, len);
    api_log_request(api, method, path, status, u, ttft_ms, api_ms_since(t0));
}

/* srv_http_log_cb: the answers the HTTP layer sends itself are counted and logged like the routes' own. */
void srv_api_log_http(void *ud, const char *method, const char *path, int status, uint64_t t_start_ns) {
    srv_api *api = ud;
    if (api->metrics) srv_metrics_count_http(api->metrics, status);
    api_log_request(api, method, path, status, NULL, -1, api_ms_since(t_start_ns));
}

void api_reply_json(srv_api *api, srv_http_req *req, int status, cJSON *obj, const srv_sched_usage *u,
                    double ttft_ms) {
    char *s = obj ? cJSON_PrintUnformatted(obj) : NULL;
    if (!s) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                  "\"param\":null,\"code\":null}}";
        api_reply(api, req, 500, "application/json", NULL, oom, sizeof oom - 1, NULL, -1);
        return;
    }
    api_reply(api, req, status, "application/json", NULL, s, strlen(s), u, ttft_ms);
    free(s);
}

void api_reply_error(srv_api *api, srv_http_req *req, const srv_api_error *e, const char *extra) {
    /* the Anthropic routes answer every error in Anthropic's shape (the dispatch's 401, 405, 503 included) */
    char *s = srv_api_path_anthropic(req->path) ? srv_api_error_json_anthropic(e) : srv_api_error_json(e);
    if (!s) { api_reply_json(api, req, 500, NULL, NULL, -1); return; }
    api_reply(api, req, e->status, "application/json", extra, s, strlen(s), NULL, -1);
    free(s);
}

void api_reply_err(srv_api *api, srv_http_req *req, int status, const char *type, const char *param,
                   const char *code, const char *extra, const char *fmt, ...) {
    srv_api_error e;
    srv_api_set_error(&e, status, type, param, code, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    api_reply_error(api, req, &e, extra);
}
