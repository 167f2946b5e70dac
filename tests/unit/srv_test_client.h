/* srv_test_client.h: a blocking HTTP/1.1 test client and a loop-thread runner for the server tests
 * (test_http.c, test_api.c). Responses are parsed with llhttp in response mode. Header-only (static). */
#ifndef KVSERVE_TESTS_SRV_TEST_CLIENT_H
#define KVSERVE_TESTS_SRV_TEST_CLIENT_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <llhttp.h>
#include <uv.h>

/* ---- connecting and sending ------------------------------------------------------------------------------- */
static __attribute__((unused)) int tc_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); return -1; }
    struct timeval tv = {10, 0}; /* no test should ever wait this long: it means a hang */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static __attribute__((unused)) int tc_send(int fd, const void *p, size_t n) {
    const char *s = p;
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w < 0) { if (errno == EINTR) continue; return -1; }
        s += w; n -= (size_t)w;
    }
    return 0;
}
static __attribute__((unused)) int tc_sends(int fd, const char *s) { return tc_send(fd, s, strlen(s)); }

/* ---- responses -------------------------------------------------------------------------------------------- */
typedef struct tc_resp {
    int status;
    char *body; size_t body_len, body_cap;
    char headers[4096]; size_t headers_len; /* "name: value\n" lines, names lower-cased */
    bool complete;
    bool keep_alive;
} tc_resp;

typedef struct tc_conn {
    int fd;
    llhttp_t parser;
    llhttp_settings_t settings;
    tc_resp *cur;
    char buf[65536]; size_t len, off;  /* received, not yet parsed */
    bool eof;
} tc_conn;

static __attribute__((unused)) int tc_on_body(llhttp_t *p, const char *at, size_t n) {
    tc_resp *r = ((tc_conn *)p->data)->cur;
    if (r->body_len + n + 1 > r->body_cap) {
        size_t cap = r->body_cap ? r->body_cap : 1024;
        while (cap < r->body_len + n + 1) cap *= 2;
        r->body = realloc(r->body, cap);
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, at, n);
    r->body_len += n;
    r->body[r->body_len] = 0;
    return 0;
}
static __attribute__((unused)) int tc_on_hfield(llhttp_t *p, const char *at, size_t n) {
    tc_resp *r = ((tc_conn *)p->data)->cur;
    for (size_t i = 0; i < n && r->headers_len + 2 < sizeof r->headers; i++) {
        char c = at[i];
        r->headers[r->headers_len++] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
    }
    r->headers[r->headers_len] = 0;
    return 0;
}
static __attribute__((unused)) int tc_on_hfield_done(llhttp_t *p) {
    tc_resp *r = ((tc_conn *)p->data)->cur;
    if (r->headers_len + 3 < sizeof r->headers) { memcpy(r->headers + r->headers_len, ": ", 3); r->headers_len += 2; }
    return 0;
}
static __attribute__((unused)) int tc_on_hvalue(llhttp_t *p, const char *at, size_t n) {
    tc_resp *r = ((tc_conn *)p->data)->cur;
    for (size_t i = 0; i < n && r->headers_len + 2 < sizeof r->headers; i++) r->headers[r->headers_len++] = at[i];
    r->headers[r->headers_len] = 0;
    return 0;
}
static __attribute__((unused)) int tc_on_hvalue_done(llhttp_t *p) {
    tc_resp *r = ((tc_conn *)p->data)->cur;
    if (r->headers_len + 2 < sizeof r->headers) { r->headers[r->headers_len++] = '\n'; r->headers[r->headers_len] = 0; }
    return 0;
}
static __attribute__((unused)) int tc_on_headers_done(llhttp_t *p) {
    tc_resp *r = ((tc_conn *)p->data)->cur;
    r->status = p->status_code;
    if (r->status == 100) return 0;
    return 0;
}
static __attribute__((unused)) int tc_on_done(llhttp_t *p) {
    tc_conn *c = p->data;
    if (p->status_code == 100) { /* interim: keep reading */
        c->cur->headers_len = 0;
        return 0;
    }
    c->cur->complete = true;
    c->cur->keep_alive = llhttp_should_keep_alive(p) != 0;
    return HPE_PAUSED;
}

static __attribute__((unused)) void tc_init(tc_conn *c, int fd) {
    memset(c, 0, sizeof *c);
    c->fd = fd;
    llhttp_settings_init(&c->settings);
    c->settings.on_body = tc_on_body;
    c->settings.on_header_field = tc_on_hfield;
    c->settings.on_header_field_complete = tc_on_hfield_done;
    c->settings.on_header_value = tc_on_hvalue;
    c->settings.on_header_value_complete = tc_on_hvalue_done;
    c->settings.on_headers_complete = tc_on_headers_done;
    c->settings.on_message_complete = tc_on_done;
    llhttp_init(&c->parser, HTTP_RESPONSE, &c->settings);
    c->parser.data = c;
}

static __attribute__((unused)) void tc_resp_free(tc_resp *r) { free(r->body); memset(r, 0, sizeof *r); }

/* Reads one response. Returns 0 when complete, -1 on EOF/timeout/parse error before completion. */
static __attribute__((unused)) int tc_read(tc_conn *c, tc_resp *r) {
    memset(r, 0, sizeof *r);
    c->cur = r;
    for (;;) {
        if (c->off < c->len) {
            const char *start = c->buf + c->off;
            llhttp_errno_t e = llhttp_execute(&c->parser, start, c->len - c->off);
            if (e == HPE_PAUSED) {
                c->off = (size_t)(llhttp_get_error_pos(&c->parser) - c->buf);
                llhttp_resume(&c->parser);
                return 0;
            }
            c->off = c->len = 0;
            if (e != HPE_OK) return -1;
        }
        if (c->eof) {
            llhttp_finish(&c->parser); /* completes a body delimited by the end of the connection */
            if (r->complete) return 0;
            return -1;
        }
        ssize_t n = recv(c->fd, c->buf, sizeof c->buf, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) { c->eof = true; continue; }
        c->len = (size_t)n;
        c->off = 0;
    }
}

/* Whether the response has header name (lower case) containing value (substring match). */
static __attribute__((unused)) bool tc_has_header(const tc_resp *r, const char *name, const char *value) {
    char key[128];
    snprintf(key, sizeof key, "%s: ", name);
    const char *p = r->headers;
    while ((p = strstr(p, key)) != NULL) {
        if (p == r->headers || p[-1] == '\n') {
            const char *e = strchr(p, '\n');
            size_t l = e ? (size_t)(e - p) : strlen(p);
            char line[1024];
            snprintf(line, sizeof line, "%.*s", (int)l, p);
            if (!value || strstr(line + strlen(key), value)) return true;
        }
        p += strlen(key);
    }
    return false;
}

/* Whether the peer closed the connection (within timeout_ms): reads and discards. */
/* Reads raw bytes until the server closes the connection (or SO_RCVTIMEO passes); NUL-terminates; returns the
 * count. For answers the response parser cannot frame alone (HEAD, several at once). */
static __attribute__((unused)) size_t tc_read_to_eof(int fd, char *buf, size_t cap) {
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
        if (r <= 0) break;
        n += (size_t)r;
    }
    buf[n] = 0;
    return n;
}

static __attribute__((unused)) bool tc_wait_closed(int fd, int timeout_ms) {
    char b[4096];
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = poll(&pfd, 1, 10);
        if (r > 0) {
            ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
            if (n == 0) return true;
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return true;
        }
    }
    return false;
}

/* One request on a new connection: send raw, read one response. Returns the status (or -1). */
static __attribute__((unused)) int tc_roundtrip(int port, const char *raw, tc_resp *out) {
    int fd = tc_connect(port);
    if (fd < 0) return -1;
    tc_conn *c = malloc(sizeof *c);
    tc_init(c, fd);
    int r = tc_sends(fd, raw) == 0 ? tc_read(c, out) : -1;
    free(c);
    close(fd);
    return r == 0 ? out->status : -1;
}

/* ---- running a loop on its own thread ------------------------------------------------------------------------ */
typedef void (*tc_loop_fn)(uv_loop_t *loop, void *ud);

typedef struct tc_loop {
    uv_loop_t loop;
    uv_async_t stop;
    pthread_t thread;
    tc_loop_fn on_stop;   /* runs on the loop thread when tc_loop_stop is called: close your handles */
    void *ud;
} tc_loop;

static __attribute__((unused)) void tc_loop_stop_cb(uv_async_t *a) {
    tc_loop *l = a->data;
    if (l->on_stop) l->on_stop(&l->loop, l->ud);
    uv_close((uv_handle_t *)&l->stop, NULL);
}

static void *tc_loop_main(void *p) {
    tc_loop *l = p;
    uv_run(&l->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* Call tc_loop_init, create your handles on l->loop, then tc_loop_start. */
static __attribute__((unused)) int tc_loop_init(tc_loop *l, tc_loop_fn on_stop, void *ud) {
    memset(l, 0, sizeof *l);
    if (uv_loop_init(&l->loop) != 0) return -1;
    l->on_stop = on_stop;
    l->ud = ud;
    l->stop.data = l;
    return uv_async_init(&l->loop, &l->stop, tc_loop_stop_cb);
}
static __attribute__((unused)) int tc_loop_start(tc_loop *l) { return pthread_create(&l->thread, NULL, tc_loop_main, l); }
static __attribute__((unused)) void tc_loop_stop(tc_loop *l) {
    uv_async_send(&l->stop);
    pthread_join(l->thread, NULL);
    uv_run(&l->loop, UV_RUN_DEFAULT);
    uv_loop_close(&l->loop);
}

#endif
