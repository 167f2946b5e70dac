/*
 * http.h: the public header of server/http/: kvserve's HTTP/1.1 connection layer (http.c, prefix srv_http_),
 * CORS (cors.c, srv_cors_) and the built-in chat page with GET /props (web.c, srv_web_). Used by server/api/
 * and serve.c; includes no other server folder.
 *
 * The connection layer: a libuv TCP listener; one llhttp parser per connection. Requests on one connection are handled
 * one at a time in arrival order (pipelined requests wait, buffered, until the previous response is complete), so a
 * handler never sees two requests of one connection at once. Keep-alive follows HTTP/1.1 rules (Connection: close,
 * HTTP/1.0 without keep-alive).
 *
 * Limits, answered by the layer itself before any handler runs:
 *   body larger than body_limit (Content-Length or chunked)     -> 413, connection closed
 *   request line + headers larger than header_limit             -> 431, connection closed
 *   a request started but not complete within read_timeout_ms   -> 408, connection closed
 *   malformed HTTP                                              -> 400, connection closed
 *   more than max_connections open                              -> 503 to the new connection, closed
 *   request bodies of all connections would hold more than max_body_bytes_total (reserved at the
 *   Content-Length when announced, else as a chunked body grows) -> 503 with Retry-After, closed
 *   with srv_http_set_bearer_key: a request announcing a body (Content-Length > 0 or chunked) to a
 *   non-public path without "Authorization: Bearer <key>" (or
 *   "x-api-key: <key>")                                          -> 401 when its headers are complete, before
 *                                                                  any of the body is read; closed
 *   idle keep-alive connection for idle_timeout_ms               -> closed silently
 * Every answer the layer sends itself is reported to the callback of srv_http_set_log (so that the request
 * counter and the request log see 400/401/408/413/431/503 too).
 * HEAD requests reach the handler as method HTTP_GET (method_name "HEAD"); the layer sends the handler's status
 * and headers (Content-Length of the body it gave) without the body, and drops streamed chunks.
 * Half-close: a client that shuts down its write side after sending requests still gets every answer to the
 * complete requests it sent (an incomplete one is dropped); the connection closes after the last answer.
 * Writes: every write is queued with libuv (partial sends handled by libuv); the bytes queued but not yet
 * sent on a connection are tracked and streaming writes past max_pending_write are refused
 * (SRV_HTTP_ERR_BACKPRESSURE), so a client that stops reading cannot make the server buffer without bound; after
 * any answer, a connection past max_pending_write is not read and its pipelined requests are not parsed until
 * its unsent bytes fall to half of it.
 *
 * Threads: everything here runs on the loop thread (the thread that runs the uv_loop given to
 * srv_http_create). No function may be called from another thread except srv_http_wakeup-style helpers of
 * callers (use uv_async_t).
 *
 * Request lifetime: the handler receives a srv_http_req that stays valid until the handler finishes it
 * (srv_http_respond or srv_http_stream_end) or until the abort callback set with srv_http_set_abort runs
 * (the client disconnected or the server is closing it); after either, the handler must not touch it.
 */
#ifndef KVSERVE_SERVER_HTTP_H
#define KVSERVE_SERVER_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include <uv.h>

#include "common/common.h"

enum {
    SRV_HTTP_OK = KVS_OK,
    SRV_HTTP_ERR_INVALID = KVS_ERR_INVALID,           /* bad argument or call in the wrong state */
    SRV_HTTP_ERR_NOMEM = KVS_ERR_NOMEM,
    SRV_HTTP_ERR_BIND = KVS_ERR_BIND,                 /* the address could not be bound / listened on */
    SRV_HTTP_ERR_BACKPRESSURE = KVS_ERR_BACKPRESSURE, /* the connection already holds max_pending_write unsent bytes */
    SRV_HTTP_ERR_CLOSED = KVS_ERR_CLOSED,             /* the connection is closed or closing */
};

typedef struct srv_http_limits {
    size_t body_limit;          /* bytes; default 16 MiB */
    size_t header_limit;        /* bytes of request line + header fields and values; default 16 KiB */
    uint64_t read_timeout_ms;   /* a started request must be complete within this; default 30000 */
    uint64_t idle_timeout_ms;   /* idle keep-alive connections are closed after this; default 60000 */
    int32_t max_connections;    /* default 1024 */
    size_t max_pending_write;   /* unsent bytes per connection before streaming writes are refused; 4 MiB */
    int32_t max_headers;        /* number of header lines; default 100 (more: 431) */
    size_t max_body_bytes_total;/* request-body bytes held across all connections (bodies being read and
                                 * bodies of requests being handled); default 256 MiB; raised to
                                 * body_limit + 1 when smaller, so that one largest body always fits */
} srv_http_limits;

void srv_http_limits_default(srv_http_limits *l);

typedef struct srv_http_header { char *name; char *value; } srv_http_header; /* name lower-cased */

typedef struct srv_http_req {
    int method;                 /* llhttp_method_t (HTTP_GET, HTTP_POST, ...) */
    const char *method_name;    /* "GET", ... (static) */
    char *path;                 /* URL path without the query string, NUL-terminated */
    char *query;                /* query string without '?', "" when none */
    srv_http_header *headers; int32_t n_headers;
    char *body; size_t body_len;/* body bytes, NUL-terminated (the NUL is not counted) */
    uint64_t t_start_ns;        /* uv_hrtime() when the first byte of the request arrived */
    void *conn;                 /* internal */
} srv_http_req;

/* Case-insensitive header lookup; NULL when absent. */
const char *srv_http_header_get(const srv_http_req *req, const char *name);

typedef struct srv_http srv_http;
typedef void (*srv_http_handler)(void *ud, srv_http_req *req);
typedef void (*srv_http_abort_cb)(void *ud, srv_http_req *req);

/* Creates the server on loop (not yet listening). handler is called on the loop thread for every complete
 * request. The limits are copied. */
int srv_http_create(uv_loop_t *loop, const srv_http_limits *limits, srv_http_handler handler, void *ud,
                    srv_http **out);
/* Binds host:port (port 0: an ephemeral port, read it back with srv_http_port) and starts listening.
 * SRV_HTTP_ERR_BIND with a message in err on failure. */
int srv_http_listen(srv_http *h, const char *host, int port, char *err, size_t err_len);
int srv_http_port(const srv_http *h);
/* Stops accepting new connections (graceful shutdown, step 1). Idle keep-alive connections are closed;
 * connections with a request in progress stay until their response is done and are then closed. */
void srv_http_stop_accepting(srv_http *h);
/* Keep-alive on (the default) or off. Off (graceful drain): every response from then on says "Connection:
 * close" and its connection closes once the response is sent, so that clients reconnect (through their load
 * balancer, to another replica); the listener stays open, and idle keep-alive connections stay until their next
 * request is answered or idle_timeout_ms passes. A stream that began before keeps its head (keep-alive) but its
 * connection still closes after it ends. Loop thread. */
void srv_http_set_keep_alive(srv_http *h, bool allow);
/* Number of requests being handled now (dispatched, not yet finished). */
int32_t srv_http_active_requests(const srv_http *h);
int32_t srv_http_open_connections(const srv_http *h);
/* Bytes received on all connections since the server started (monotonic): activity, even from clients that
 * leave before a request is complete. Loop thread. */
uint64_t srv_http_bytes_read(const srv_http *h);
/* Closes every connection (abort callbacks run for requests in progress) and the listener. The loop then
 * runs down; call srv_http_free after uv_run returns. */
void srv_http_close(srv_http *h);
/* Frees the server; all handles must be closed (run the loop after srv_http_close). NULL is a no-op. */
void srv_http_free(srv_http *h);

/* Extra header lines for every response head the layer writes (srv_http_respond, srv_http_stream_begin and the
 * layer's own 4xx/503 answers), e.g. CORS. The hook writes "Name: value\r\n" lines into buf (NUL-terminated)
 * and returns their length; 0 adds nothing, and so does a length >= cap (the lines did not fit). req may be
 * partly parsed (an early 4xx): its headers are those read so far. Loop thread; NULL removes the hook. */
typedef size_t (*srv_http_header_hook)(void *ud, const srv_http_req *req, char *buf, size_t cap);
void srv_http_set_header_hook(srv_http *h, srv_http_header_hook hook, void *ud);

/* ---- answering (loop thread only) ---------------------------------------------------------------------- */
/* Sends a complete response and finishes the request. extra_headers: "Name: value\r\n" lines or NULL.
 * 204 and 304 answers carry no body and no Content-Length. */
int srv_http_respond(srv_http_req *req, int status, const char *content_type, const char *extra_headers,
                     const char *body, size_t body_len);
/* Starts a chunked streaming response (e.g. text/event-stream). */
int srv_http_stream_begin(srv_http_req *req, int status, const char *content_type, const char *extra_headers);
/* Queues one chunk; SRV_HTTP_ERR_BACKPRESSURE (nothing queued) when the client is not reading. */
int srv_http_stream_write(srv_http_req *req, const char *data, size_t len);
/* Ends the stream and finishes the request. */
int srv_http_stream_end(srv_http_req *req);
/* Finishes the request by closing the connection (e.g. after refusing a stalled stream). */
void srv_http_abort(srv_http_req *req);
/* Registers a callback run when the connection goes away before the request is finished. */
void srv_http_set_abort(srv_http_req *req, srv_http_abort_cb cb, void *ud);
/* Unsent bytes queued on the request's connection. */
size_t srv_http_pending_write(const srv_http_req *req);

/* ---- authentication, logging, tests ------------------------------------------------------------------------- */
/* Header-time authentication. key NULL or "": off (the default). public_paths[0..n_public) are paths (compared
 * with trailing slashes ignored, query excluded) that need no key. Copies everything. Requests without a body
 * are never refused here: the handler answers them (it must check the key itself too). SRV_HTTP_ERR_NOMEM,
 * SRV_HTTP_ERR_INVALID (n_public < 0, or paths NULL with n_public > 0). */
int srv_http_set_bearer_key(srv_http *h, const char *key, const char *const *public_paths, int32_t n_public);
/* Whether req carries "Authorization: Bearer <key>" (scheme case-insensitive) or "x-api-key: <key>" (as
 * Anthropic's clients send it), the key compared in time independent of where it differs. true when key is NULL
 * or "". */
bool srv_http_bearer_ok(const srv_http_req *req, const char *key);

/* Called for every answer the layer sends itself (method and path "-" when the request line was not
 * complete; t_start_ns 0 when no request had started), on the loop thread. */
typedef void (*srv_http_log_cb)(void *ud, const char *method, const char *path, int status, uint64_t t_start_ns);
void srv_http_set_log(srv_http *h, srv_http_log_cb cb, void *ud);

/* Request-body bytes reserved now across all connections (<= max_body_bytes_total). */
size_t srv_http_body_bytes(const srv_http *h);

/* Serves an already connected stream socket (e.g. one end of socketpair(AF_UNIX, SOCK_STREAM)) exactly like
 * an accepted TCP connection: the whole HTTP path without a listener, for tests and fuzzing. Takes ownership
 * of fd (closed with the connection, or at once on failure). SRV_HTTP_ERR_INVALID, SRV_HTTP_ERR_NOMEM. */
int srv_http_adopt_fd(srv_http *h, int fd);

/* Standard reason phrase ("OK", "Not Found", ...). */
const char *srv_http_reason(int status);

/* ---- CORS (http/cors.c, prefix srv_cors_) ---------------------------------------------------------------------
 * Cross-Origin Resource Sharing for kvserve's HTTP API.
 *
 * Lets a page served from another origin (a browser app, a notebook, an IDE's webview) call the API. Built from
 * the `cors_origins` setting:
 *   ""            automatic: "*" when the server listens on a loopback address (127.0.0.0/8, ::1, localhost),
 *                 no CORS headers otherwise
 *   "none"        no CORS headers (browsers then refuse cross-origin calls)
 *   "*"           any origin: Access-Control-Allow-Origin: * on every response
 *   a list        origins separated by commas (spaces around them are ignored), each "*", "null" or
 *                 scheme://host[:port] without a path, e.g. "http://localhost:3000, https://app.example.com".
 *                 A request whose Origin matches one (ASCII case-insensitively) gets it echoed in
 *                 Access-Control-Allow-Origin; every response carries Vary: Origin so that caches keep them
 *                 apart. A "*" anywhere in the list means any origin.
 * A response that allows the origin also says Access-Control-Expose-Headers: Retry-After, WWW-Authenticate (the
 * headers besides the CORS-safelisted ones that clients read). Credentials (cookies) are never allowed: the API
 * authenticates with a bearer key.
 *
 * Preflight (OPTIONS with Access-Control-Request-Method) is answered by the API layer with 204 and the lines of
 * srv_cors_preflight: the route's methods, the request headers the browser asked for (echoed when they are a
 * plain comma list of header names; otherwise Authorization, Content-Type) and Access-Control-Max-Age.
 *
 * Ownership: a srv_cors is created once (srv_cors_create) and read-only afterwards, so any thread may read it. */
enum {
    SRV_CORS_OK = 0,
    SRV_CORS_ERR_INVALID = -1,  /* the setting is malformed: err names the entry and why */
    SRV_CORS_ERR_NOMEM = -2,
};

#define SRV_CORS_MAX_ORIGINS 64     /* entries in one list */
#define SRV_CORS_MAX_ORIGIN_LEN 255 /* bytes of one entry */
#define SRV_CORS_MAX_AGE 7200       /* seconds a browser may cache a preflight answer (Chromium's cap) */

typedef struct srv_cors srv_cors;

/* Checks a cors_origins value without keeping it (what configuration loading calls). SRV_CORS_OK or
 * SRV_CORS_ERR_INVALID with a message in err (err_len may be 0). NULL is "". */
int srv_cors_check(const char *setting, char *err, size_t err_len);

/* Builds the policy from the setting and the listen address (for the automatic rule). Errors as
 * srv_cors_check, plus SRV_CORS_ERR_NOMEM. Free with srv_cors_free. */
int srv_cors_create(const char *setting, const char *host, srv_cors **out, char *err, size_t err_len);
void srv_cors_free(srv_cors *c);

/* True when host (an address literal or "localhost") is a loopback address. */
bool srv_cors_is_loopback(const char *host);
/* True when the policy adds any CORS header at all. */
bool srv_cors_enabled(const srv_cors *c);

/* The srv_http_header_hook (ud: the srv_cors, may be NULL): the Access-Control-Allow-Origin, Vary and
 * Access-Control-Expose-Headers lines this request's response needs. Returns their length (0: none; >= cap:
 * did not fit, buf then holds ""). */
size_t srv_cors_headers(void *ud, const srv_http_req *req, char *buf, size_t cap);

/* The preflight answer's lines for a route allowing `methods` (e.g. "POST"): Access-Control-Allow-Methods
 * (methods plus OPTIONS), Access-Control-Allow-Headers and Access-Control-Max-Age; without CORS (c NULL or
 * disabled) only "Allow: <methods>, OPTIONS". Same return convention as srv_cors_headers. */
size_t srv_cors_preflight(const srv_cors *c, const srv_http_req *req, const char *methods, char *buf, size_t cap);

/* ---- the chat page and GET /props (http/web.c, prefix srv_web_) -----------------------------------------------
 * The built-in chat page and GET /props.
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
 * Threads: srv_web_set_model and the answering functions run on the loop thread; srv_web_create/free anywhere. */
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

#endif /* KVSERVE_SERVER_HTTP_H */
