/*
 * web.h: the built-in chat page and GET /props (internal to server/, prefix srv_web_).
 *
 * The page is web/index.html, embedded in the binary at build time (cmake/embed.cmake turns it into a C array;
 * nothing is read from disk or fetched at run time). It must hold exactly one inline <script> and one inline
 * <style> element without attributes: srv_web_create hashes their text (SHA-256, base64) into the page's
 * Content-Security-Policy, so the browser runs that script and nothing else (no other script, no eval, no
 * connection but to this server). The page is answered with an ETag (If-None-Match gives 304) and
 * Cache-Control: no-cache, so a rebuilt server is seen at the next load.
 *
 * /props describes the server as llama.cpp's server does under the same names, where kvserve can honour them:
 * default_generation_settings.n_ctx, total_slots, model_alias, model_path, chat_template, modalities,
 * build_info, plus kvserve's own chat_template_family, batch_tokens and build {version, simd, cuda, device}.
 *
 * Threads: srv_web_set_model and the answering functions run on the loop thread; srv_web_create/free anywhere.
 */
#ifndef KVSERVE_SERVER_WEB_H
#define KVSERVE_SERVER_WEB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/http/http.h"

enum {
    SRV_WEB_OK = 0,
    SRV_WEB_ERR_INVALID = -1,  /* the embedded page lacks its <script> or <style> element, or a bad argument */
    SRV_WEB_ERR_NOMEM = -2,
};

/* The model and server facts /props reports (strings copied; NULL is ""). */
typedef struct srv_web_model {
    const char *model_id;       /* model_alias, and the id of /v1/models */
    const char *model_path;     /* the GGUF path as configured */
    const char *chat_template;  /* the model's tokenizer.chat_template text, or NULL when it has none */
    const char *chat_family;    /* the template family kvserve renders with ("chatml", "llama3", ...) */
    int32_t n_ctx;              /* context length of one sequence */
    int32_t parallel;           /* sequences generating at once (total_slots) */
    int32_t batch_tokens;       /* token budget of one engine step */
    int32_t threads;            /* engine threads */
    const char *device;         /* "cpu" or "cuda" */
    const char *simd;           /* CPU kernel level in use ("scalar", "avx2", "avx512") */
    const char *scheduling_policy; /* "fcfs" or "priority" (NULL: "fcfs") */
    bool context_shift;         /* the server's context_shift setting */
    int32_t n_keep;             /* the default n_keep of requests */
} srv_web_model;

typedef struct srv_web srv_web;

/* Creates the page server: hashes the embedded page's script and style into its CSP. */
int srv_web_create(srv_web **out);
void srv_web_free(srv_web *w);
/* Sets what /props reports (once the model is loaded; before that srv_web_props_json says so). */
int srv_web_set_model(srv_web *w, const srv_web_model *m);

/* The answer to GET / for req: *status 200 (body = the page) or 304 (If-None-Match matched; no body), the
 * content type, the extra header lines (CSP, Cache-Control, ETag, ...; owned by w) and the body (owned by w). */
void srv_web_page(const srv_web *w, const srv_http_req *req, int *status, const char **content_type,
                  const char **headers, const char **body, size_t *len);
/* The page's Content-Security-Policy value (owned by w). */
const char *srv_web_csp(const srv_web *w);

/* The /props JSON (malloc'd; NULL on OOM or before srv_web_set_model). */
char *srv_web_props_json(const srv_web *w);

/* The embedded page (web/index.html as built into the binary). */
const unsigned char *srv_web_page_bytes(size_t *len);

#endif /* KVSERVE_SERVER_WEB_H */
