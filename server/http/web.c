/* web.c: the embedded chat page with its Content-Security-Policy, and GET /props (see http.h). */
#include "server/http/http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/common.h"

#ifndef KVSERVE_VERSION
#define KVSERVE_VERSION "dev"
#endif

/* Generated at build time from web/index.html (cmake/embed.cmake). */
extern const unsigned char srv_web_index_html[];
extern const size_t srv_web_index_html_len;

struct srv_web {
    char csp[512];
    char etag[32];              /* quoted */
    char headers_200[1024];
    char headers_304[128];
    bool have_model;
    srv_web_model model;        /* what srv_web_set_model was given; its strings (never NULL) point into strings */
    char *strings;              /* one block holding the model's strings */
};

const unsigned char *srv_web_page_bytes(size_t *len) {
    if (len) *len = srv_web_index_html_len;
    return srv_web_index_html;
}

/* 'sha256-<base64>' of the text between the first <tag> and the </tag> after it; -1 when absent. */
static int element_hash(const char *page, size_t len, const char *tag, char *out, size_t cap) {
    char open[16], close[16];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *a = memmem(page, len, open, strlen(open));
    if (!a) return -1;
    a += strlen(open);
    const char *b = memmem(a, len - (size_t)(a - page), close, strlen(close));
    if (!b) return -1;
    uint8_t d[32];
    kvs_sha256(a, (size_t)(b - a), d);
    char b64[48];
    if (kvs_base64_encode(d, sizeof d, b64, sizeof b64) < 0) return -1;
    return snprintf(out, cap, "'sha256-%s'", b64) < (int)cap ? 0 : -1;
}

int srv_web_create(srv_web **out) {
    if (!out) return SRV_WEB_ERR_INVALID;
    *out = NULL;
    const char *page = (const char *)srv_web_index_html;
    size_t len = srv_web_index_html_len;
    char script[64], style[64];
    if (element_hash(page, len, "script", script, sizeof script) ||
        element_hash(page, len, "style", style, sizeof style))
        return SRV_WEB_ERR_INVALID;
    srv_web *w = calloc(1, sizeof *w);
    if (!w) return SRV_WEB_ERR_NOMEM;
    snprintf(w->csp, sizeof w->csp,
             "default-src 'none'; script-src %s; style-src %s; connect-src 'self'; img-src data:; "
             "base-uri 'none'; form-action 'none'; frame-ancestors 'none'", script, style);
    uint8_t d[32];
    kvs_sha256(page, len, d);
    snprintf(w->etag, sizeof w->etag, "\"%02x%02x%02x%02x%02x%02x%02x%02x\"", d[0], d[1], d[2], d[3], d[4], d[5],
             d[6], d[7]);
    snprintf(w->headers_200, sizeof w->headers_200,
             "Cache-Control: no-cache\r\nETag: %s\r\nContent-Security-Policy: %s\r\n"
             "X-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\nX-Frame-Options: DENY\r\n",
             w->etag, w->csp);
    snprintf(w->headers_304, sizeof w->headers_304, "Cache-Control: no-cache\r\nETag: %s\r\n", w->etag);
    *out = w;
    return SRV_WEB_OK;
}

static void clear_model(srv_web *w) {
    free(w->strings);
    w->strings = NULL;
    w->model = (srv_web_model){0};
    w->have_model = false;
}

void srv_web_free(srv_web *w) {
    if (!w) return;
    clear_model(w);
    free(w);
}

int srv_web_set_model(srv_web *w, const srv_web_model *m) {
    if (!w || !m) return SRV_WEB_ERR_INVALID;
    clear_model(w);
    srv_web_model c = *m;
    if (!c.scheduling_policy) c.scheduling_policy = "fcfs";
    const char **str[] = {&c.model_id, &c.model_path, &c.chat_template, &c.chat_family,
                          &c.device,   &c.simd,       &c.scheduling_policy};
    enum { N_STR = sizeof str / sizeof str[0] };
    size_t total = 0;
    for (size_t i = 0; i < N_STR; i++) total += strlen(*str[i] ? *str[i] : "") + 1;
    char *p = malloc(total);
    if (!p) return SRV_WEB_ERR_NOMEM;
    w->strings = p;
    for (size_t i = 0; i < N_STR; i++) {
        const char *s = *str[i] ? *str[i] : "";
        size_t n = strlen(s) + 1;
        memcpy(p, s, n);
        *str[i] = p;
        p += n;
    }
    w->model = c;
    w->have_model = true;
    return SRV_WEB_OK;
}

/* If-None-Match names our ETag (or is "*"). */
static bool etag_matches(const char *inm, const char *etag) {
    if (!inm) return false;
    const char *bare = etag + 1;          /* compare without the quotes: W/"x" and "x" both match */
    size_t n = strlen(bare) - 1;
    for (const char *p = inm; *p; p++) {
        if (*p == '*') return true;
        if (!strncmp(p, bare, n) && p > inm && p[-1] == '"' && p[n] == '"') return true;
    }
    return false;
}

void srv_web_page(const srv_web *w, const srv_http_req *req, int *status, const char **content_type,
                  const char **headers, const char **body, size_t *len) {
    *content_type = "text/html; charset=utf-8";
    if (req && etag_matches(srv_http_header_get(req, "if-none-match"), w->etag)) {
        *status = 304;
        *headers = w->headers_304;
        *body = "";
        *len = 0;
        return;
    }
    *status = 200;
    *headers = w->headers_200;
    *body = (const char *)srv_web_index_html;
    *len = srv_web_index_html_len;
}

const char *srv_web_csp(const srv_web *w) { return w ? w->csp : ""; }

char *srv_web_props_json(const srv_web *w) {
    if (!w || !w->have_model) return NULL;
    const srv_web_model *m = &w->model;
#ifdef KVSERVE_HAVE_CUDA
    const bool cuda = true;
#else
    const bool cuda = false;
#endif
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON *dgs = cJSON_AddObjectToObject(o, "default_generation_settings");
    if (dgs) {
        cJSON_AddNumberToObject(dgs, "n_ctx", m->n_ctx);
        cJSON *params = cJSON_AddObjectToObject(dgs, "params");
        if (params) cJSON_AddNumberToObject(params, "n_keep", m->n_keep);
    }
    cJSON_AddBoolToObject(o, "context_shift", m->context_shift);
    cJSON_AddStringToObject(o, "scheduling_policy", m->scheduling_policy);
    cJSON_AddNumberToObject(o, "total_slots", m->parallel);
    cJSON_AddStringToObject(o, "model_alias", m->model_id);
    cJSON_AddStringToObject(o, "model_path", m->model_path);
    cJSON_AddStringToObject(o, "chat_template", m->chat_template);
    cJSON_AddStringToObject(o, "chat_template_family", m->chat_family);
    cJSON *mod = cJSON_AddObjectToObject(o, "modalities");
    if (mod) { cJSON_AddFalseToObject(mod, "vision"); cJSON_AddFalseToObject(mod, "audio"); }
    char info[160];
    snprintf(info, sizeof info, "kvserve %s (%s%s%s, cuda %s)", KVSERVE_VERSION, m->device,
             strcmp(m->device, "cpu") ? "" : " ", strcmp(m->device, "cpu") ? "" : m->simd,
             cuda ? "built" : "not built");
    cJSON_AddStringToObject(o, "build_info", info);
    cJSON_AddFalseToObject(o, "is_sleeping");
    cJSON_AddNumberToObject(o, "batch_tokens", m->batch_tokens);
    cJSON *b = cJSON_AddObjectToObject(o, "build");
    if (b) {
        cJSON_AddStringToObject(b, "version", KVSERVE_VERSION);
        cJSON_AddStringToObject(b, "simd", m->simd);
        cJSON_AddBoolToObject(b, "cuda", cuda);
        cJSON_AddStringToObject(b, "device", m->device);
        cJSON_AddNumberToObject(b, "threads", m->threads);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}
