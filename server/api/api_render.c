/* api_render.c: what the API sends: JSON bodies, SSE chunks, logprobs, final responses, error replies and the
 * access log (see api.h). */
#include "server/api/api_internal.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <llhttp.h>

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

/* The request log's UTC timestamp, e.g. 2026-11-24T21:04:33Z. */
static void log_timestamp(char ts[32]) {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

void api_log_request(srv_api *api, const char *method, const char *path, int status,
                        const srv_sched_usage *u, double ttft_ms, double total_ms) {
    if (api->log_format == SRV_LOG_NONE) return;
    FILE *f = api->log ? api->log : stderr;
    char ts[32];
    log_timestamp(ts);
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

void api_log_truncated(srv_api *api, const api_call *c, int32_t idx) {
    if (api->log_format == SRV_LOG_NONE) return;
    FILE *f = api->log ? api->log : stderr;
    char ts[32];
    log_timestamp(ts);
    long long tokens = (long long)api->kv_blocks * api->kv_block_size;
    if (api->log_format == SRV_LOG_JSON)
        fprintf(f, "{\"ts\":\"%s\",\"level\":\"warning\",\"event\":\"kv_pool_truncated\",\"id\":\"%s\","
                   "\"choice\":%d,\"kv_pool_tokens\":%lld}\n", ts, c->id, (int)idx, tokens);
    else
        fprintf(f, "%s warning: %s choice %d cut with finish_reason length: its context outgrew the whole KV cache "
                   "(%lld tokens)\n", ts, c->id, (int)idx, tokens);
    fflush(f);
}

double api_ms_since(uint64_t t0) { return t0 ? (double)(uv_hrtime() - t0) / 1e6 : 0.0; }

/* Sends a complete response, counts and logs it. Takes ownership of nothing. */
void api_reply(srv_api *api, srv_http_req *req, int status, const char *ctype, const char *extra,
                  const char *body, size_t len, const srv_sched_usage *u, double ttft_ms) {
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
    char *s = srv_api_error_json(e);
    if (!s) { api_reply_json(api, req, 500, NULL, NULL, -1); return; }
    api_reply(api, req, e->status, "application/json", extra, s, strlen(s), NULL, -1);
    free(s);
}

void api_reply_err(srv_api *api, srv_http_req *req, int status, const char *type, const char *param,
                      const char *code, const char *extra, const char *fmt, ...) __attribute__((format(printf, 8, 9)));
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

/* Tokenizes with a growing buffer; *out malloc'd. */
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

cJSON *api_chunk_base(api_call *c) {
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
void api_sse_send(api_call *c, cJSON *obj, const char *literal) {
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
    if (r != 0) api_stream_client_gone(c);
}

void api_stream_client_gone(api_call *c) {
    srv_http_req *req = c->req;
    c->req = NULL;
    if (c->api->metrics) c->api->metrics->requests_finished_abort++;
    api_log_request(c->api, c->method, c->path, 499, &c->usage, -1, api_ms_since(c->t_arrival));
    srv_http_abort(req);
    api_cancel_subs(c);
}

int api_stream_begin(api_call *c, srv_http_req *req) {
    if (srv_http_stream_begin(req, 200, "text/event-stream", "Cache-Control: no-cache\r\n") == 0) return 0;
    c->req = NULL;
    srv_http_abort(req);
    api_cancel_subs(c);
    return -1;
}

static cJSON *bytes_array(const char *p, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)p[i]));
    return a;
}

/* Appends the logprobs of samples to lp (the choice's accumulator or a chunk's logprobs object). */
void api_add_logprobs(api_call *c, api_choice *ch, cJSON *lp, const eng_sample *smp, int32_t n) {
    srv_api *api = c->api;
    char buf[256];
    if (c->gen.kind == SRV_API_CHAT) {
        cJSON *content = cJSON_GetObjectItemCaseSensitive(lp, "content");
        for (int32_t i = 0; content && i < n; i++) {
            int l = api_piece(api, smp[i].token, buf, sizeof buf);
            if (l < 0) l = 0;
            char *s = api_utf8_sanitize(buf, (size_t)l);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "token", s ? s : "");
            cJSON_AddNumberToObject(e, "logprob", smp[i].logprob);
            cJSON_AddItemToObject(e, "bytes", bytes_array(buf, l));
            free(s);
            cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
            int32_t nt = smp[i].n_top < c->gen.top_logprobs ? smp[i].n_top : c->gen.top_logprobs;
            for (int32_t k = 0; tops && k < nt; k++) {
                int tl = api_piece(api, smp[i].top_token[k], buf, sizeof buf);
                if (tl < 0) tl = 0;
                char *ts = api_utf8_sanitize(buf, (size_t)tl);
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
        int l = api_piece(api, smp[i].token, buf, sizeof buf);
        if (l < 0) l = 0;
        char *s = api_utf8_sanitize(buf, (size_t)l);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(s ? s : ""));
        free(s);
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(smp[i].logprob));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)ch->lp_offset));
        ch->lp_offset += (size_t)l;
        cJSON *m = cJSON_CreateObject();
        int32_t nt = smp[i].n_top < c->gen.top_logprobs ? smp[i].n_top : c->gen.top_logprobs;
        for (int32_t k = 0; m && k < nt; k++) {
            int tl = api_piece(api, smp[i].top_token[k], buf, sizeof buf);
            if (tl < 0) tl = 0;
            char *ts = api_utf8_sanitize(buf, (size_t)tl);
            if (ts && !cJSON_GetObjectItemCaseSensitive(m, ts))
                cJSON_AddNumberToObject(m, ts, smp[i].top_logprob[k]);
            free(ts);
        }
        cJSON_AddItemToArray(tops, m ? m : cJSON_CreateNull());
    }
}

cJSON *api_new_logprobs(api_call *c) {
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

/* One streamed chunk for choice idx: text (may be NULL), logprob samples, finish reason (NONE: null). */
void api_stream_chunk(api_call *c, int32_t idx, const char *text, size_t len, const eng_sample *smp,
                         int32_t n_smp, srv_sched_finish finish, bool role) {
    cJSON *o = api_chunk_base(c);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", idx);
    char *s = text ? api_utf8_sanitize(text, len) : NULL;
    if (c->gen.kind == SRV_API_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (role) { cJSON_AddStringToObject(d, "role", "assistant"); cJSON_AddStringToObject(d, "content", ""); }
        if (s) cJSON_AddStringToObject(d, "content", s);
    } else {
        cJSON_AddStringToObject(ch, "text", s ? s : "");
    }
    free(s);
    if (c->gen.logprobs && n_smp > 0) {
        cJSON *lp = api_new_logprobs(c);
        api_add_logprobs(c, &c->choices[idx], lp, smp, n_smp);
        cJSON_AddItemToObject(ch, "logprobs", lp);
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    const char *fn = finish != SRV_SCHED_FINISH_NONE ? srv_sched_finish_name(finish) : NULL;
    if (fn && c->choices[idx].tool_calls) fn = "tool_calls";
    if (fn) cJSON_AddStringToObject(ch, "finish_reason", fn); else cJSON_AddNullToObject(ch, "finish_reason");
    if (fn && c->choices[idx].truncated) cJSON_AddTrueToObject(ch, "truncated");
    if (c->gen.include_usage) cJSON_AddNullToObject(o, "usage");
    api_sse_send(c, o, NULL);
}

void api_finish_call(api_call *c) {
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
            cJSON_AddItemToObject(o, "usage", usage_json(&c->usage));
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
    cJSON_AddItemToObject(o, "usage", usage_json(&c->usage));
    api_reply_json(api, req, 200, o, &c->usage, ttft_ms);
    cJSON_Delete(o);
    api_call_free(c);
}
