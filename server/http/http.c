/* http.c: HTTP/1.1 connections on libuv + llhttp. See http.h for the contract. */
#include "server/http/http.h"

#include <ctype.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include <llhttp.h>

#define READ_CHUNK 65536
#define MAX_BUFFERED_WHILE_BUSY (256u * 1024u) /* pipelined input held while a request runs */
#define LINGER_MS 2000

typedef enum {
    C_IDLE = 0,   /* waiting for a request (keep-alive idle) */
    C_READING,    /* a request has started */
    C_HANDLING,   /* dispatched to the handler */
    C_DRAINING,   /* final bytes queued; shut down the write side when they are sent */
    C_LINGER,     /* write side shut down; discarding input until EOF or a timeout */
    C_CLOSED,     /* uv_close issued */
} conn_state;

typedef struct sbuf { char *p; size_t len, cap; } sbuf;

typedef struct conn conn;
struct srv_http {
    uv_loop_t *loop;
    uv_tcp_t listener;
    bool listening, listener_closed;
    srv_http_limits lim;
    srv_http_handler handler;
    void *ud;
    llhttp_settings_t settings;
    srv_http_header_hook hook; void *hook_ud;
    conn *conns;               /* doubly linked list of open connections */
    int32_t n_conns, n_active;
    uint64_t bytes_read;          /* bytes received on every connection since start (srv_http_bytes_read) */
    bool stopping;
    bool no_keep_alive;        /* srv_http_set_keep_alive(false): every answer closes its connection */
    size_t body_bytes;         /* request-body memory reserved across all connections */
    char *bearer_key;          /* header-time authentication (NULL: off) */
    char **public_paths; int32_t n_public;
    srv_http_log_cb log_cb; void *log_ud;
};

struct conn {
    union { uv_tcp_t tcp; uv_pipe_t pipe; } io; /* a TCP connection, or an adopted socket (srv_http_adopt_fd) */
    uv_timer_t timer;
    int handles_open;
    srv_http *srv;
    conn *prev, *next;
    llhttp_t parser;
    conn_state state;
    char rbuf[READ_CHUNK];
    bool reading;
    /* unparsed input */
    char *in; size_t in_len, in_off, in_cap;
    bool in_process, reprocess;
    /* request under construction */
    srv_http_req req;
    sbuf url, field, value;
    bool last_was_value;
    int32_t hdr_cap;
    size_t header_bytes;
    sbuf body;
    int fail_status;           /* set by a parser callback to answer with this status */
    size_t body_expect;        /* Content-Length of the request being read (0: none or chunked) */
    size_t body_reserved;      /* this connection's share of srv->body_bytes */
    bool keep_alive, chunked_out, streaming, head_sent;
    bool head_only;            /* a HEAD request: headers are sent, bodies are not */
    bool peer_eof;             /* the client half-closed: answer what is buffered, then close */
    size_t pending_write;
    bool write_paused;         /* unsent bytes passed max_pending_write between requests: no reading, no next
                                  pipelined request until they fall to half of it (write_backpressure) */
    srv_http_abort_cb abort_cb; void *abort_ud;
};

typedef struct wreq { uv_write_t w; conn *c; size_t len; char data[]; } wreq;

static void conn_close(conn *c);
static void conn_process(conn *c);
static void start_reading(conn *c);
static void on_timer(uv_timer_t *t);

static uv_stream_t *conn_stream(conn *c) { return (uv_stream_t *)&c->io; }

void srv_http_limits_default(srv_http_limits *l) {
    l->body_limit = 16u << 20;
    l->header_limit = 16u << 10;
    l->read_timeout_ms = 30000;
    l->idle_timeout_ms = 60000;
    l->max_connections = 1024;
    l->max_pending_write = 4u << 20;
    l->max_headers = 100;
    l->max_body_bytes_total = 256u << 20;
}

const char *srv_http_reason(int s) {
    switch (s) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Unknown";
    }
}

/* ---- small buffers ------------------------------------------------------------------------------------- */
static int sb_add(sbuf *b, const char *p, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return -1;
        b->p = q; b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}
/* Grows the capacity to exactly cap bytes (no-op when already as large). */
static int sb_reserve(sbuf *b, size_t cap) {
    if (cap <= b->cap) return 0;
    char *q = realloc(b->p, cap);
    if (!q) return -1;
    b->p = q; b->cap = cap;
    return 0;
}
static void sb_free(sbuf *b) { free(b->p); b->p = NULL; b->len = b->cap = 0; }
static char *sb_take(sbuf *b) { /* returns a NUL-terminated malloc'd string (or NULL on OOM) */
    if (!b->p && sb_add(b, "", 0)) return NULL;
    char *p = b->p; b->p = NULL; b->len = b->cap = 0;
    return p;
}

/* Gives this connection's request-body reservation back to the server-wide budget. */
static void body_release(conn *c) {
    c->srv->body_bytes -= c->body_reserved;
    c->body_reserved = 0;
}

/* Makes this connection's reservation cover cap bytes; false when the server-wide budget does not allow it. */
static bool body_reserve(conn *c, size_t cap) {
    if (cap <= c->body_reserved) return true;
    size_t more = cap - c->body_reserved;
    if (c->srv->body_bytes + more > c->srv->lim.max_body_bytes_total) return false;
    c->srv->body_bytes += more;
    c->body_reserved = cap;
    return true;
}

static void req_clear(conn *c) {
    srv_http_req *r = &c->req;
    free(r->path); free(r->query);
    for (int32_t i = 0; i < r->n_headers; i++) { free(r->headers[i].name); free(r->headers[i].value); }
    free(r->headers); free(r->body);
    memset(r, 0, sizeof *r);
    r->conn = c;
    sb_free(&c->url); sb_free(&c->field); sb_free(&c->value); sb_free(&c->body);
    body_release(c);
    c->body_expect = 0;
    c->head_only = false;
    c->last_was_value = false;
    c->hdr_cap = 0;
    c->header_bytes = 0;
    c->fail_status = 0;
    c->streaming = c->head_sent = false;
    c->abort_cb = NULL; c->abort_ud = NULL;
}

const char *srv_http_header_get(const srv_http_req *req, const char *name) {
    for (int32_t i = 0; i < req->n_headers; i++)
        if (!strcasecmp(req->headers[i].name, name)) return req->headers[i].value;
    return NULL;
}

/* ---- writing --------------------------------------------------------------------------------------------- */
static void on_shutdown(uv_shutdown_t *s, int status) {
    conn *c = s->data;
    free(s);
    if (c->state == C_CLOSED) return;
    if (status < 0 || c->peer_eof) { conn_close(c); return; } /* nothing more will come: no linger */
    c->state = C_LINGER;
    uv_timer_start(&c->timer, on_timer, LINGER_MS, 0);
}

static void begin_shutdown(conn *c) {
    uv_shutdown_t *s = malloc(sizeof *s);
    if (!s) { conn_close(c); return; }
    s->data = c;
    if (uv_shutdown(s, conn_stream(c), on_shutdown) < 0) { free(s); conn_close(c); }
}

/* The connection ends once the bytes queued are sent (write side shut down, then a short linger). */
static void drain_and_close(conn *c) {
    c->state = C_DRAINING;
    if (c->pending_write == 0) begin_shutdown(c);
}

/* ---- backpressure on every answer (issue 30) ------------------------------------------------------------- *
 * A client that pipelines requests and never reads made the server queue every answer (366 MB for 20,000
 * pipelined GETs). Between requests, a connection whose unsent bytes pass max_pending_write stops being read and
 * its buffered pipelined requests wait; once the unsent bytes fall to half of it, reading and parsing resume.
 * (A stalled stream is handled by srv_http_stream_write, which refuses writes past the same limit.) */
static bool write_backpressure(conn *c) {
    if (c->pending_write <= c->srv->lim.max_pending_write) return false;
    c->write_paused = true;
    if (c->reading) {
        uv_read_stop(conn_stream(c));
        c->reading = false;
    }
    return true;
}

static void write_resume(conn *c) {
    if (!c->write_paused || c->pending_write > c->srv->lim.max_pending_write / 2) return;
    c->write_paused = false;
    if (c->state != C_IDLE) return;
    if (!c->peer_eof) start_reading(c);
    if (!c->in_process) conn_process(c);
}

static void on_write(uv_write_t *w, int status) {
    wreq *q = (wreq *)w;
    conn *c = q->c;
    c->pending_write -= q->len;
    free(q);
    if (c->state == C_CLOSED) return;
    if (status < 0) { conn_close(c); return; }
    if (c->state == C_DRAINING && c->pending_write == 0) begin_shutdown(c);
    else if (c->write_paused) write_resume(c);
}

static int write_raw(conn *c, const char *a, size_t alen, const char *b, size_t blen, const char *t,
                     size_t tlen) {
    if (c->state == C_CLOSED || c->state == C_LINGER) return SRV_HTTP_ERR_CLOSED;
    size_t n = alen + blen + tlen;
    wreq *q = malloc(sizeof *q + n);
    if (!q) return SRV_HTTP_ERR_NOMEM;
    if (alen) memcpy(q->data, a, alen);
    if (blen) memcpy(q->data + alen, b, blen);
    if (tlen) memcpy(q->data + alen + blen, t, tlen);
    q->c = c; q->len = n;
    uv_buf_t buf = uv_buf_init(q->data, (unsigned)n);
    if (uv_write(&q->w, conn_stream(c), &buf, 1, on_write) < 0) {
        free(q);
        conn_close(c);
        return SRV_HTTP_ERR_CLOSED;
    }
    c->pending_write += n;
    return SRV_HTTP_OK;
}

/* The header hook's lines for this connection's request into out[HOOK_CAP] ("" when none or too long). */
#define HOOK_CAP 1024
static void hook_headers(conn *c, char *out) {
    out[0] = 0;
    if (!c->srv->hook) return;
    size_t n = c->srv->hook(c->srv->hook_ud, &c->req, out, HOOK_CAP);
    if (n == 0 || n >= HOOK_CAP) out[0] = 0;
}

/* Queues an error answer from the layer itself and closes the connection once it is sent. msg and code are
 * constant ASCII without quotes or backslashes (they go into the JSON as they are); code may be NULL. The
 * answer is reported to the log callback (request counter and request log). */
static void fail_and_close(conn *c, int status, const char *msg, const char *code) {
    char body[512], head[256 + HOOK_CAP], hook[HOOK_CAP], codebuf[64] = "null";
    if (code) snprintf(codebuf, sizeof codebuf, "\"%s\"", code);
    bool server = status >= 500 && status != 503;
    int bl = snprintf(body, sizeof body,
                      "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":%s}}", msg,
                      server ? "server_error" : "invalid_request_error", codebuf);
    hook_headers(c, hook);
    int hl = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\n%s%s%sConnection: close\r\n\r\n", status, srv_http_reason(status), bl,
                      status == 503 ? "Retry-After: 1\r\n" : "",
                      status == 401 ? "WWW-Authenticate: Bearer\r\n" : "", hook);
    if (c->srv->log_cb)
        c->srv->log_cb(c->srv->log_ud, c->req.method_name ? c->req.method_name : "-",
                       c->req.path ? c->req.path : "-", status, c->req.t_start_ns);
    if (c->state == C_HANDLING) { /* the handler's request dies with the connection */
        c->srv->n_active--;
        if (c->abort_cb) c->abort_cb(c->abort_ud, &c->req);
        c->abort_cb = NULL;
    }
    uv_timer_stop(&c->timer);
    if (c->state != C_HANDLING) { sb_free(&c->body); body_release(c); } /* a body being read is dropped */
    if (write_raw(c, head, (size_t)hl, body, (size_t)bl, NULL, 0) != 0) return;
    drain_and_close(c);
}

/* ---- the request is done: next one or close ------------------------------------------------------------ */
static void finish_request(conn *c, bool close_conn) {
    c->srv->n_active--;
    req_clear(c);
    if (close_conn || !c->keep_alive || c->srv->stopping || c->srv->no_keep_alive) {
        drain_and_close(c);
        return;
    }
    c->state = C_IDLE;
    llhttp_resume(&c->parser);
    uv_timer_start(&c->timer, on_timer, c->srv->lim.idle_timeout_ms, 0);
    if (write_backpressure(c)) return; /* on_write resumes */
    if (!c->peer_eof) start_reading(c);
    if (c->in_process) c->reprocess = true;
    else conn_process(c);
}

/* ---- parser callbacks ------------------------------------------------------------------------------------ */
static int count_header(conn *c, size_t n) {
    c->header_bytes += n;
    if (c->header_bytes > c->srv->lim.header_limit) { c->fail_status = 431; return HPE_USER; }
    return 0;
}

static int push_header(conn *c) {
    srv_http_req *r = &c->req;
    if (r->n_headers >= c->srv->lim.max_headers) { c->fail_status = 431; return HPE_USER; }
    if (r->n_headers == c->hdr_cap) {
        int32_t cap = c->hdr_cap ? c->hdr_cap * 2 : 16;
        srv_http_header *h = realloc(r->headers, (size_t)cap * sizeof *h);
        if (!h) { c->fail_status = 500; return HPE_USER; }
        r->headers = h; c->hdr_cap = cap;
    }
    char *name = sb_take(&c->field), *value = sb_take(&c->value);
    if (!name || !value) { free(name); free(value); c->fail_status = 500; return HPE_USER; }
    for (char *p = name; *p; p++) *p = (char)tolower((unsigned char)*p);
    r->headers[r->n_headers].name = name;
    r->headers[r->n_headers].value = value;
    r->n_headers++;
    c->last_was_value = false;
    return 0;
}

static int on_message_begin(llhttp_t *p) {
    conn *c = p->data;
    req_clear(c);
    c->req.t_start_ns = uv_hrtime();
    c->state = C_READING;
    uv_timer_start(&c->timer, on_timer, c->srv->lim.read_timeout_ms, 0);
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t n) {
    conn *c = p->data;
    if (count_header(c, n)) return HPE_USER;
    if (sb_add(&c->url, at, n)) { c->fail_status = 500; return HPE_USER; }
    return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t n) {
    conn *c = p->data;
    if (count_header(c, n)) return HPE_USER;
    if (c->last_was_value && push_header(c)) return HPE_USER;
    if (sb_add(&c->field, at, n)) { c->fail_status = 500; return HPE_USER; }
    return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t n) {
    conn *c = p->data;
    if (count_header(c, n)) return HPE_USER;
    c->last_was_value = true;
    if (sb_add(&c->value, at, n)) { c->fail_status = 500; return HPE_USER; }
    return 0;
}

/* Whether path (trailing slashes ignored) is one of the paths that need no API key. */
static bool is_public_path(const srv_http *h, const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    for (int32_t i = 0; i < h->n_public; i++)
        if (strlen(h->public_paths[i]) == n && !memcmp(h->public_paths[i], path, n)) return true;
    return false;
}

static int on_headers_complete(llhttp_t *p) {
    conn *c = p->data;
    srv_http_req *r = &c->req;
    if (c->last_was_value && push_header(c)) return -1;
    r->method = p->method;
    r->method_name = llhttp_method_name((llhttp_method_t)p->method);
    if (p->method == HTTP_HEAD) { /* answered like GET, without the body */
        r->method = HTTP_GET;
        c->head_only = true;
    }
    char *url = sb_take(&c->url);
    if (!url) { c->fail_status = 500; return -1; }
    char *q = strchr(url, '?');
    r->query = strdup(q ? q + 1 : "");
    if (q) *q = 0;
    r->path = url;
    if (!r->query) { c->fail_status = 500; return -1; }
    bool has_len = (p->flags & F_CONTENT_LENGTH) != 0, chunked = (p->flags & F_CHUNKED) != 0;
    if (has_len && p->content_length > c->srv->lim.body_limit) {
        c->fail_status = 413;
        return -1;
    }
    /* A request that brings a body without the API key is refused before one byte of the body is read. */
    bool has_body = chunked || (has_len && p->content_length > 0);
    if (has_body && c->srv->bearer_key && !is_public_path(c->srv, r->path) &&
        !srv_http_bearer_ok(r, c->srv->bearer_key)) {
        c->fail_status = 401;
        return -1;
    }
    if (has_len && p->content_length > 0) {
        c->body_expect = (size_t)p->content_length;
        if (!body_reserve(c, c->body_expect + 1)) { c->fail_status = 503; return -1; }
    }
    const char *expect = srv_http_header_get(r, "expect");
    if (expect && !strcasecmp(expect, "100-continue") && p->http_major == 1 && p->http_minor >= 1) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        write_raw(c, cont, sizeof cont - 1, NULL, 0, NULL, 0);
    }
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t n) {
    conn *c = p->data;
    if (c->body.len + n > c->srv->lim.body_limit) { c->fail_status = 413; return HPE_USER; }
    size_t need = c->body.len + n + 1;
    if (need > c->body.cap) { /* grow within the server-wide budget: to the announced length, else doubling */
        size_t cap = c->body_expect ? c->body_expect + 1 : (c->body.cap ? c->body.cap : 4096);
        while (cap < need) cap *= 2;
        if (cap > c->srv->lim.body_limit + 1) cap = need > c->srv->lim.body_limit + 1 ? need : c->srv->lim.body_limit + 1;
        if (!body_reserve(c, cap)) { c->fail_status = 503; return HPE_USER; }
        if (sb_reserve(&c->body, cap)) { c->fail_status = 500; return HPE_USER; }
    }
    if (sb_add(&c->body, at, n)) { c->fail_status = 500; return HPE_USER; }
    return 0;
}

static int on_message_complete(llhttp_t *p) {
    conn *c = p->data;
    srv_http_req *r = &c->req;
    r->body_len = c->body.len;
    r->body = sb_take(&c->body);
    if (!r->body) { c->fail_status = 500; return HPE_USER; }
    c->keep_alive = llhttp_should_keep_alive(p) != 0;
    c->chunked_out = p->http_major == 1 && p->http_minor >= 1;
    c->state = C_HANDLING;
    return HPE_PAUSED;
}

/* ---- reading ----------------------------------------------------------------------------------------------- */
static void dispatch(conn *c) {
    uv_timer_stop(&c->timer);
    c->srv->n_active++;
    c->req.conn = c;
    c->srv->handler(c->srv->ud, &c->req);
}

static void conn_process(conn *c) {
    c->in_process = true;
    do {
        c->reprocess = false;
        while ((c->state == C_IDLE && !c->write_paused) || c->state == C_READING) {
            if (c->in_off >= c->in_len) { c->in_off = c->in_len = 0; break; }
            const char *start = c->in + c->in_off;
            llhttp_errno_t e = llhttp_execute(&c->parser, start, c->in_len - c->in_off);
            if (e == HPE_OK) { c->in_off = c->in_len = 0; break; }
            if (e == HPE_PAUSED && c->state == C_HANDLING) {
                c->in_off = (size_t)(llhttp_get_error_pos(&c->parser) - c->in);
                dispatch(c);
                continue; /* the handler may have answered at once: parse the next pipelined request */
            }
            int st = c->fail_status ? c->fail_status : 400;
            const char *msg = st == 413 ? "request body too large" :
                              st == 431 ? "request header fields too large" :
                              st == 401 ? "Incorrect or missing API key: send the header 'Authorization: Bearer "
                                          "<key>' (or 'x-api-key: <key>')" :
                              st == 503 ? "too many request bodies in flight on this server; retry later" :
                              st == 500 ? "out of memory" : "malformed HTTP request";
            if (st == 400 && e == HPE_INVALID_METHOD) msg = "unknown HTTP method";
            c->in_off = c->in_len = 0;
            fail_and_close(c, st, msg, st == 401 ? "invalid_api_key" : NULL);
            break;
        }
    } while (c->reprocess && c->state != C_CLOSED);
    c->in_process = false;
    /* The client half-closed and no complete request is left: close once the answers are sent. */
    if (c->peer_eof && !c->write_paused && (c->state == C_IDLE || c->state == C_READING))
        drain_and_close(c); /* the running idle/read timer still bounds a client that never reads */
    if (c->state == C_HANDLING && c->in_len - c->in_off > MAX_BUFFERED_WHILE_BUSY && c->reading) {
        uv_read_stop(conn_stream(c));
        c->reading = false;
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    conn *c = h->data;
    *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    (void)buf;
    conn *c = s->data;
    if (c->state == C_CLOSED) return;
    if (nread == UV_EOF && (c->state == C_HANDLING || c->state == C_DRAINING || c->state == C_IDLE ||
                            c->state == C_READING)) {
        /* A half-close: the client sent everything it will send but may still read. Requests already
         * buffered are answered; an incomplete one is dropped; then the connection closes. */
        c->peer_eof = true;
        uv_read_stop(conn_stream(c));
        c->reading = false;
        if ((c->state == C_IDLE || c->state == C_READING) && !c->in_process) conn_process(c);
        return;
    }
    if (nread < 0) { conn_close(c); return; } /* an error, or EOF while lingering: the client is gone */
    if (nread == 0) return;
    c->srv->bytes_read += (uint64_t)nread;
    if (c->state == C_LINGER || c->state == C_DRAINING) return; /* discard */
    if (c->in_len + (size_t)nread > c->in_cap) {
        size_t cap = c->in_cap ? c->in_cap : READ_CHUNK;
        while (cap < c->in_len + (size_t)nread) cap *= 2;
        char *p = realloc(c->in, cap);
        if (!p) { conn_close(c); return; }
        c->in = p; c->in_cap = cap;
    }
    memcpy(c->in + c->in_len, c->rbuf, (size_t)nread);
    c->in_len += (size_t)nread;
    if (!c->in_process) conn_process(c);
}

static void start_reading(conn *c) {
    if (c->reading || c->state == C_CLOSED) return;
    if (uv_read_start(conn_stream(c), on_alloc, on_read) == 0) c->reading = true;
}

static void on_timer(uv_timer_t *t) {
    conn *c = t->data;
    switch (c->state) {
    case C_READING: fail_and_close(c, 408, "request not received in time", NULL); break;
    case C_HANDLING: break;
    default: conn_close(c); break;
    }
}

/* ---- connection lifetime --------------------------------------------------------------------------------- */
static void on_handle_closed(uv_handle_t *h) {
    conn *c = h->data;
    if (--c->handles_open > 0) return;
    srv_http *srv = c->srv;
    if (c->prev) c->prev->next = c->next; else srv->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    srv->n_conns--;
    req_clear(c);
    free(c->in);
    free(c);
}

static void conn_close(conn *c) {
    if (c->state == C_CLOSED) return;
    if (c->state == C_HANDLING) {
        c->srv->n_active--;
        if (c->abort_cb) c->abort_cb(c->abort_ud, &c->req);
        c->abort_cb = NULL;
    }
    c->state = C_CLOSED;
    uv_close((uv_handle_t *)&c->io, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

/* A new connection whose stream handle (TCP or pipe) the caller has already initialized in c->io; adds the
 * timer and links it into the server. NULL-safe on failure: the stream is closed. */
static conn *conn_link(srv_http *srv, conn *c) {
    c->srv = srv;
    c->req.conn = c;
    c->io.tcp.data = c;
    c->handles_open = 1;
    if (uv_timer_init(srv->loop, &c->timer) != 0) {
        c->state = C_CLOSED;
        uv_close((uv_handle_t *)&c->io, (uv_close_cb)free);
        return NULL;
    }
    c->timer.data = c;
    c->handles_open = 2;
    c->next = srv->conns;
    if (srv->conns) srv->conns->prev = c;
    srv->conns = c;
    srv->n_conns++;
    return c;
}

/* Starts serving a linked connection whose stream is connected. */
static void conn_start(conn *c) {
    srv_http *srv = c->srv;
    llhttp_init(&c->parser, HTTP_REQUEST, &srv->settings);
    c->parser.data = c;
    c->state = C_IDLE;
    start_reading(c);
    if (srv->n_conns > srv->lim.max_connections || srv->stopping) {
        fail_and_close(c, 503, "too many connections", NULL);
        return;
    }
    uv_timer_start(&c->timer, on_timer, srv->lim.idle_timeout_ms, 0);
}

static void on_connection(uv_stream_t *server, int status) {
    srv_http *srv = server->data;
    if (status < 0) return;
    conn *c = calloc(1, sizeof *c);
    if (!c) return;
    if (uv_tcp_init(srv->loop, &c->io.tcp) != 0) { free(c); return; }
    if (!conn_link(srv, c)) return;
    if (uv_accept(server, conn_stream(c)) != 0) { conn_close(c); return; }
    uv_tcp_nodelay(&c->io.tcp, 1);
    conn_start(c);
}

int srv_http_adopt_fd(srv_http *h, int fd) {
    if (!h || fd < 0) { if (fd >= 0) close(fd); return SRV_HTTP_ERR_INVALID; }
    conn *c = calloc(1, sizeof *c);
    if (!c) { close(fd); return SRV_HTTP_ERR_NOMEM; }
    if (uv_pipe_init(h->loop, &c->io.pipe, 0) != 0) { free(c); close(fd); return SRV_HTTP_ERR_INVALID; }
    if (uv_pipe_open(&c->io.pipe, fd) != 0) {
        close(fd);
        c->state = C_CLOSED;
        uv_close((uv_handle_t *)&c->io, (uv_close_cb)free);
        return SRV_HTTP_ERR_INVALID;
    }
    if (!conn_link(h, c)) return SRV_HTTP_ERR_NOMEM;
    conn_start(c);
    return SRV_HTTP_OK;
}

/* ---- server ------------------------------------------------------------------------------------------------ */
int srv_http_create(uv_loop_t *loop, const srv_http_limits *limits, srv_http_handler handler, void *ud,
                    srv_http **out) {
    if (!loop || !handler || !out) return SRV_HTTP_ERR_INVALID;
    srv_http *h = calloc(1, sizeof *h);
    if (!h) return SRV_HTTP_ERR_NOMEM;
    h->loop = loop;
    if (limits) h->lim = *limits; else srv_http_limits_default(&h->lim);
    if (h->lim.max_connections < 1) h->lim.max_connections = 1;
    if (h->lim.max_headers < 1) h->lim.max_headers = 1;
    if (h->lim.max_body_bytes_total < h->lim.body_limit + 1) h->lim.max_body_bytes_total = h->lim.body_limit + 1;
    h->handler = handler;
    h->ud = ud;
    llhttp_settings_init(&h->settings);
    h->settings.on_message_begin = on_message_begin;
    h->settings.on_url = on_url;
    h->settings.on_header_field = on_header_field;
    h->settings.on_header_value = on_header_value;
    h->settings.on_headers_complete = on_headers_complete;
    h->settings.on_body = on_body;
    h->settings.on_message_complete = on_message_complete;
    h->listener_closed = true;
    *out = h;
    return SRV_HTTP_OK;
}

static void on_listener_closed(uv_handle_t *hd) {
    srv_http *h = hd->data;
    h->listener_closed = true;
}

int srv_http_listen(srv_http *h, const char *host, int port, char *err, size_t err_len) {
    if (!h || !host || port < 0 || port > 65535 || h->listening) return SRV_HTTP_ERR_INVALID;
    struct sockaddr_storage ss;
    int r;
    if (strchr(host, ':')) r = uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss);
    else r = uv_ip4_addr(host, port, (struct sockaddr_in *)&ss);
    if (r != 0) {
        if (err_len) snprintf(err, err_len, "invalid host address '%s' (an IPv4 or IPv6 literal)", host);
        return SRV_HTTP_ERR_BIND;
    }
    if ((r = uv_tcp_init(h->loop, &h->listener)) != 0) {
        if (err_len) snprintf(err, err_len, "uv_tcp_init: %s", uv_strerror(r));
        return SRV_HTTP_ERR_BIND;
    }
    h->listener.data = h;
    h->listener_closed = false;
    if ((r = uv_tcp_bind(&h->listener, (const struct sockaddr *)&ss, 0)) != 0 ||
        (r = uv_listen((uv_stream_t *)&h->listener, 511, on_connection)) != 0) {
        if (err_len) snprintf(err, err_len, "cannot listen on %s:%d: %s", host, port, uv_strerror(r));
        uv_close((uv_handle_t *)&h->listener, on_listener_closed);
        return SRV_HTTP_ERR_BIND;
    }
    h->listening = true;
    return SRV_HTTP_OK;
}

int srv_http_port(const srv_http *h) {
    if (!h || !h->listening) return -1;
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getsockname(&h->listener, (struct sockaddr *)&ss, &len) != 0) return -1;
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

void srv_http_stop_accepting(srv_http *h) {
    if (!h || h->stopping) return;
    h->stopping = true;
    if (h->listening) {
        h->listening = false;
        uv_close((uv_handle_t *)&h->listener, on_listener_closed);
    }
    for (conn *c = h->conns, *n; c; c = n) {
        n = c->next;
        if (c->state == C_IDLE || c->state == C_READING) conn_close(c);
    }
}

void srv_http_set_header_hook(srv_http *h, srv_http_header_hook hook, void *ud) {
    if (!h) return;
    h->hook = hook;
    h->hook_ud = ud;
}

void srv_http_set_keep_alive(srv_http *h, bool allow) {
    if (h) h->no_keep_alive = !allow;
}

int32_t srv_http_active_requests(const srv_http *h) { return h ? h->n_active : 0; }
int32_t srv_http_open_connections(const srv_http *h) { return h ? h->n_conns : 0; }
uint64_t srv_http_bytes_read(const srv_http *h) { return h ? h->bytes_read : 0; }

void srv_http_close(srv_http *h) {
    if (!h) return;
    srv_http_stop_accepting(h);
    for (conn *c = h->conns, *n; c; c = n) {
        n = c->next;
        conn_close(c);
    }
}

void srv_http_free(srv_http *h) {
    if (!h) return;
    free(h->bearer_key);
    for (int32_t i = 0; i < h->n_public; i++) free(h->public_paths[i]);
    free(h->public_paths);
    free(h);
}

int srv_http_set_bearer_key(srv_http *h, const char *key, const char *const *public_paths, int32_t n_public) {
    if (!h || n_public < 0 || (n_public > 0 && !public_paths)) return SRV_HTTP_ERR_INVALID;
    char *k = key && key[0] ? strdup(key) : NULL;
    char **pp = n_public ? calloc((size_t)n_public, sizeof *pp) : NULL;
    bool oom = (key && key[0] && !k) || (n_public && !pp);
    for (int32_t i = 0; !oom && i < n_public; i++) oom = !(pp[i] = strdup(public_paths[i] ? public_paths[i] : ""));
    if (oom) {
        free(k);
        for (int32_t i = 0; pp && i < n_public; i++) free(pp[i]);
        free(pp);
        return SRV_HTTP_ERR_NOMEM;
    }
    free(h->bearer_key);
    for (int32_t i = 0; i < h->n_public; i++) free(h->public_paths[i]);
    free(h->public_paths);
    h->bearer_key = k;
    h->public_paths = pp;
    h->n_public = n_public;
    return SRV_HTTP_OK;
}

/* v == key (key not empty), in time independent of where they differ. */
static bool key_equal(const char *v, const char *key) {
    size_t a = strlen(v), b = strlen(key);
    unsigned diff = (unsigned)(a ^ b); /* compares every byte whatever the first difference (timing) */
    for (size_t i = 0; i < a; i++) diff |= (unsigned char)v[i] ^ (unsigned char)key[i % b];
    return diff == 0;
}

bool srv_http_bearer_ok(const srv_http_req *req, const char *key) {
    if (!key || !key[0]) return true;
    const char *x = srv_http_header_get(req, "x-api-key"); /* Anthropic's clients send the key this way */
    if (x && key_equal(x, key)) return true;
    const char *v = srv_http_header_get(req, "authorization");
    if (!v || strncasecmp(v, "Bearer ", 7)) return false;
    v += 7;
    while (*v == ' ') v++;
    return key_equal(v, key);
}

void srv_http_set_log(srv_http *h, srv_http_log_cb cb, void *ud) {
    if (!h) return;
    h->log_cb = cb;
    h->log_ud = ud;
}

size_t srv_http_body_bytes(const srv_http *h) { return h ? h->body_bytes : 0; }

/* ---- answering ---------------------------------------------------------------------------------------------- */
static conn *req_conn(const srv_http_req *req) {
    if (!req || !req->conn) return NULL;
    conn *c = req->conn;
    if (c->state != C_HANDLING) return NULL;
    return c;
}

static int head(conn *c, int status, const char *ctype, const char *extra, bool has_len, size_t len,
                char *buf, size_t cap) {
    bool close = !c->keep_alive || c->srv->stopping || c->srv->no_keep_alive;
    char lenbuf[64] = "", ctbuf[160] = "", hook[HOOK_CAP];
    bool bodiless = status == 204 || status == 304;
    if (has_len && !bodiless) snprintf(lenbuf, sizeof lenbuf, "Content-Length: %zu\r\n", len);
    else if (!has_len && c->chunked_out) snprintf(lenbuf, sizeof lenbuf, "Transfer-Encoding: chunked\r\n");
    if (!has_len && !c->chunked_out) close = true, c->keep_alive = false;
    if (!bodiless) snprintf(ctbuf, sizeof ctbuf, "Content-Type: %s\r\n", ctype ? ctype : "application/json");
    hook_headers(c, hook);
    int n = snprintf(buf, cap, "HTTP/1.1 %d %s\r\n%s%s%s%sConnection: %s\r\n\r\n", status, srv_http_reason(status),
                     ctbuf, lenbuf, extra ? extra : "", hook, close ? "close" : "keep-alive");
    return (n < 0 || (size_t)n >= cap) ? -1 : n;
}

int srv_http_respond(srv_http_req *req, int status, const char *ctype, const char *extra, const char *body,
                     size_t body_len) {
    conn *c = req_conn(req);
    if (!c || c->streaming) return SRV_HTTP_ERR_INVALID;
    if (status == 204 || status == 304) body_len = 0;
    char hb[2048 + HOOK_CAP];
    int hl = head(c, status, ctype, extra, true, body_len, hb, sizeof hb);
    if (hl < 0) return SRV_HTTP_ERR_INVALID;
    int r = write_raw(c, hb, (size_t)hl, c->head_only ? NULL : body, c->head_only ? 0 : body_len, NULL, 0);
    if (c->state == C_CLOSED) return r ? r : SRV_HTTP_ERR_CLOSED;
    finish_request(c, r != 0);
    return r;
}

int srv_http_stream_begin(srv_http_req *req, int status, const char *ctype, const char *extra) {
    conn *c = req_conn(req);
    if (!c || c->streaming) return SRV_HTTP_ERR_INVALID;
    char hb[2048 + HOOK_CAP];
    int hl = head(c, status, ctype, extra, false, 0, hb, sizeof hb);
    if (hl < 0) return SRV_HTTP_ERR_INVALID;
    c->streaming = true;
    return write_raw(c, hb, (size_t)hl, NULL, 0, NULL, 0);
}

int srv_http_stream_write(srv_http_req *req, const char *data, size_t len) {
    conn *c = req_conn(req);
    if (!c || !c->streaming) return SRV_HTTP_ERR_INVALID;
    if (len == 0 || c->head_only) return SRV_HTTP_OK; /* a zero-length chunk would end the stream */
    if (c->pending_write > c->srv->lim.max_pending_write) return SRV_HTTP_ERR_BACKPRESSURE;
    if (!c->chunked_out) return write_raw(c, data, len, NULL, 0, NULL, 0);
    char pre[32];
    int pl = snprintf(pre, sizeof pre, "%zx\r\n", len);
    return write_raw(c, pre, (size_t)pl, data, len, "\r\n", 2);
}

int srv_http_stream_end(srv_http_req *req) {
    conn *c = req_conn(req);
    if (!c || !c->streaming) return SRV_HTTP_ERR_INVALID;
    int r = c->chunked_out && !c->head_only ? write_raw(c, "0\r\n\r\n", 5, NULL, 0, NULL, 0) : 0;
    if (c->state == C_CLOSED) return r ? r : SRV_HTTP_ERR_CLOSED;
    finish_request(c, r != 0);
    return r;
}

void srv_http_abort(srv_http_req *req) {
    conn *c = req_conn(req);
    if (!c) return;
    c->abort_cb = NULL;
    conn_close(c);
}

void srv_http_set_abort(srv_http_req *req, srv_http_abort_cb cb, void *ud) {
    conn *c = req_conn(req);
    if (!c) return;
    c->abort_cb = cb;
    c->abort_ud = ud;
}

size_t srv_http_pending_write(const srv_http_req *req) {
    conn *c = req_conn(req);
    return c ? c->pending_write : 0;
}
