/*
 * fuzz_http.c: the HTTP request path of server/http/http.c (llhttp parsing, limits, keep-alive, pipelining,
 * half-close, HEAD, header-time authentication, the request-body budget) fed raw bytes through one connection
 * (srv_http_adopt_fd over a socketpair: no network).
 *
 * Input: byte 0 = options (bit 0: close fully instead of half-closing; bit 1: require an API key "k"; bits 2-4:
 * send in pieces of 1, 7, 64 or all bytes at once), then the bytes the client sends.
 * The handler answers /d... later from a timer, /s... as a 3-chunk stream, everything else at once (an echo).
 * Checks: the output is a sequence of well-formed HTTP/1.1 responses; every request handed to the handler is
 * answered, in order, before at most one answer of the layer itself (4xx/5xx, last); the layer's answers are
 * the ones reported to the log callback; afterwards no connection, request or body byte is left.
 */
#define FZ_WITH_HTTP
#include "fuzz_util.h"

#include <llhttp.h>

typedef struct fz_delay { uv_timer_t t; srv_http_req *req; int kind; int left; struct fz_ctx *ctx; } fz_delay;

typedef struct fz_ctx {
    uv_loop_t loop;
    srv_http *h;
    int dispatched, handled_head, layer_logged, layer_status, timers_open;
} fz_ctx;

static fz_ctx *G; /* libFuzzer calls LLVMFuzzerTestOneInput without a user pointer: the harness's one state */

static void delay_closed(uv_handle_t *hd) {
    fz_delay *d = hd->data;
    d->ctx->timers_open--;
    free(d);
}

static void delay_abort(void *ud, srv_http_req *req) {
    (void)req;
    fz_delay *d = ud;
    d->req = NULL;
    uv_close((uv_handle_t *)&d->t, delay_closed);
}

static void delay_fire(uv_timer_t *t) {
    fz_delay *d = t->data;
    if (d->kind == 0) {
        srv_http_respond(d->req, 200, "text/plain", NULL, "late", 4);
    } else if (d->left-- > 0) {
        srv_http_stream_write(d->req, "chunk", 5);
        uv_timer_start(&d->t, delay_fire, 0, 0);
        return;
    } else {
        srv_http_stream_end(d->req);
    }
    uv_close((uv_handle_t *)&d->t, delay_closed);
}

static void handler(void *ud, srv_http_req *req) {
    fz_ctx *c = ud;
    c->dispatched++;
    FZ_CHECK(req->path && req->query && req->body && req->method_name, "request fields missing");
    FZ_CHECK(strlen(req->body) <= req->body_len, "body not NUL-terminated within its length");
    if (!strcmp(req->method_name, "HEAD")) {
        FZ_CHECK(req->method == HTTP_GET, "HEAD not presented as GET");
        c->handled_head++;
    }
    if (req->path[0] == '/' && (req->path[1] == 'd' || req->path[1] == 's')) {
        fz_delay *d = calloc(1, sizeof *d);
        FZ_CHECK(d, "out of memory");
        d->req = req;
        d->ctx = c;
        d->kind = req->path[1] == 's';
        d->left = 3;
        uv_timer_init(&c->loop, &d->t);
        d->t.data = d;
        c->timers_open++;
        srv_http_set_abort(req, delay_abort, d);
        if (d->kind) srv_http_stream_begin(req, 200, "text/event-stream", NULL);
        uv_timer_start(&d->t, delay_fire, 0, 0);
        return;
    }
    char head[96];
    int hl = snprintf(head, sizeof head, "%s %zu:", req->method_name, req->body_len);
    kvs_buf b = {0};
    kvs_buf_append(&b, head, (size_t)hl);
    kvs_buf_append(&b, req->body, req->body_len);
    FZ_CHECK(!b.oom, "out of memory");
    srv_http_respond(req, strcmp(req->path, "/missing") ? 200 : 404, "text/plain", NULL, b.data, b.len);
    kvs_buf_free(&b);
}

static void on_log(void *ud, const char *method, const char *path, int status, uint64_t t0) {
    (void)t0;
    fz_ctx *c = ud;
    FZ_CHECK(method && path && status >= 400 && status <= 599, "bad log call");
    c->layer_logged++;
    c->layer_status = status;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    FZ_HTTP_STATE_NEW(G);
    srv_http_limits l;
    srv_http_limits_default(&l);
    l.body_limit = 2048;
    l.header_limit = 1024;
    l.max_headers = 16;
    l.read_timeout_ms = 2000;
    l.max_pending_write = 1 << 20;
    if (srv_http_create(&G->loop, &l, handler, G, &G->h) != 0) abort();
    srv_http_set_log(G->h, on_log, G);
    return 0;
}

/* Response parsing: counts complete responses and the statuses of the layer's own answers. */
typedef struct rp { int n, n_layer, last_status; bool head_next; fz_ctx *c; } rp;
static int rp_headers(llhttp_t *p) {
    rp *r = p->data;
    return r->head_next ? 1 : 0; /* 1: this answer has no body (HEAD) */
}
static int rp_done(llhttp_t *p) {
    rp *r = p->data;
    if (p->status_code < 200) return 0; /* an interim answer (100 Continue) */
    r->n++;
    r->last_status = p->status_code;
    if (p->status_code >= 400 && p->status_code != 404) r->n_layer++;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!G) LLVMFuzzerInitialize(NULL, NULL);
    fz_ctx *c = G;
    if (size < 1) return 0;
    uint8_t opt = data[0];
    static const size_t pieces[8] = {0, 1, 7, 64, 0, 0, 3, 512};
    c->dispatched = c->handled_head = c->layer_logged = c->layer_status = 0;
    static const char *const pub[] = {"/health"};
    FZ_CHECK(srv_http_set_bearer_key(c->h, (opt & 2) ? "k" : NULL, pub, 1) == 0, "set key");
    kvs_buf out = {0};
    fz_http_exchange(&c->loop, c->h, data + 1, size - 1, pieces[(opt >> 2) & 7], opt & 1, &out);
    FZ_CHECK(c->timers_open == 0, "%d handler timers left", c->timers_open);
    FZ_CHECK(srv_http_active_requests(c->h) == 0, "%d requests still active", srv_http_active_requests(c->h));
    FZ_CHECK(srv_http_body_bytes(c->h) == 0, "%zu body bytes still reserved", srv_http_body_bytes(c->h));
    FZ_CHECK(c->layer_logged <= 1, "%d layer answers on one connection", c->layer_logged);
    if (!(opt & 1) && c->handled_head == 0 && out.len > 0) {
        /* half-close: everything dispatched is answered; the layer's own answer (if any) comes last */
        llhttp_settings_t s;
        llhttp_settings_init(&s);
        s.on_headers_complete = rp_headers;
        s.on_message_complete = rp_done;
        llhttp_t p;
        llhttp_init(&p, HTTP_RESPONSE, &s);
        rp r = {0};
        r.c = c;
        p.data = &r;
        llhttp_errno_t e = llhttp_execute(&p, out.data, out.len);
        if (e == HPE_OK) e = llhttp_finish(&p);
        FZ_CHECK(e == HPE_OK, "the server's output is not valid HTTP (%s): %.*s", llhttp_errno_name(e),
                 (int)(out.len < 400 ? out.len : 400), out.data);
        FZ_CHECK(r.n == c->dispatched + c->layer_logged, "%d answers for %d requests and %d layer answers", r.n,
                 c->dispatched, c->layer_logged);
        FZ_CHECK(r.n_layer == c->layer_logged, "layer answers %d, logged %d", r.n_layer, c->layer_logged);
        if (c->layer_logged) FZ_CHECK(r.last_status == c->layer_status, "the layer's answer is not the last");
    }
    kvs_buf_free(&out);
    return 0;
}
