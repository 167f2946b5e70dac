/* fuzz_util.h: what the fuzz harnesses share: a check that aborts (libFuzzer and the corpus driver both
 * report an abort as a failure), a reader that takes decisions from the input's bytes, and a way to push raw
 * bytes through one HTTP connection of a srv_http (srv_http_adopt_fd over a socketpair, no network). */
#ifndef KVSERVE_FUZZ_UTIL_H
#define KVSERVE_FUZZ_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"

#define FZ_CHECK(cond, ...)                                                                         \
    do {                                                                                            \
        if (!(cond)) {                                                                              \
            fprintf(stderr, "fuzz check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond);         \
            fprintf(stderr, __VA_ARGS__);                                                           \
            fputc('\n', stderr);                                                                    \
            abort();                                                                                \
        }                                                                                           \
    } while (0)

/* Decisions from the input: each call consumes bytes; past the end it reads zeros. */
typedef struct fz_in { const uint8_t *p; size_t n, off; } fz_in;

static inline uint32_t fz_byte(fz_in *in) { return in->off < in->n ? in->p[in->off++] : 0; }
static inline uint32_t fz_u16(fz_in *in) { uint32_t a = fz_byte(in); return a | fz_byte(in) << 8; }
static inline size_t fz_left(const fz_in *in) { return in->n - in->off; }

static inline double fz_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#ifdef FZ_WITH_HTTP
#include <uv.h>
#include "server/http/http.h"

/* Sends req[0..n) to a new connection of h (whose loop is loop) in pieces of at most `piece` bytes (0: all at
 * once), then half-closes (or closes fully when full_close), runs the loop and collects everything the server
 * sends until it closes the connection. Aborts when the server does not finish within 10 s (a hang). */
static inline void fz_http_exchange(uv_loop_t *loop, srv_http *h, const uint8_t *req, size_t n, size_t piece,
                                    bool full_close, kvs_buf *out) {
    int sv[2];
    FZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair: %s", strerror(errno));
    int big = 1 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    int32_t conns_before = srv_http_open_connections(h);
    FZ_CHECK(srv_http_adopt_fd(h, sv[1]) == 0, "adopt_fd");
    size_t off = 0;
    bool shut = false, eof = false;
    double t0 = fz_now();
    char buf[16384];
    while (!eof) {
        if (off < n) {
            size_t k = n - off;
            if (piece && k > piece) k = piece;
            ssize_t w = send(sv[0], req + off, k, MSG_NOSIGNAL);
            if (w > 0) off += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EINTR) off = n; /* the server closed: stop sending */
        }
        if (off == n && !shut) {
            shut = true;
            if (full_close) break;
            shutdown(sv[0], SHUT_WR);
        }
        uv_run(loop, UV_RUN_NOWAIT);
        for (;;) {
            ssize_t r = recv(sv[0], buf, sizeof buf, 0);
            if (r > 0) { FZ_CHECK(kvs_buf_append(out, buf, (size_t)r) == 0, "out of memory"); continue; }
            if (r == 0 || (errno != EAGAIN && errno != EINTR)) eof = true;
            break;
        }
        FZ_CHECK(fz_now() - t0 < 10.0, "the server did not finish the connection within 10 s (%zu of %zu bytes sent)",
                 off, n);
    }
    close(sv[0]);
    while (srv_http_open_connections(h) > conns_before) {
        uv_run(loop, UV_RUN_NOWAIT);
        FZ_CHECK(fz_now() - t0 < 10.0, "the server did not close the connection after the client closed");
    }
}

/* How each HTTP harness's LLVMFuzzerInitialize starts: SIGPIPE ignored (as the daemon does: a write to a closed
 * peer must not kill the process), then G (a pointer to the harness's state struct, which has a uv_loop_t loop)
 * set to a zeroed allocation with its loop initialised. Aborts when either fails. A macro: the struct differs. */
#define FZ_HTTP_STATE_NEW(G)                                                                        \
    do {                                                                                            \
        signal(SIGPIPE, SIG_IGN);                                                                   \
        (G) = calloc(1, sizeof *(G));                                                               \
        if (!(G) || uv_loop_init(&(G)->loop) != 0) abort();                                         \
    } while (0)
#endif

#endif /* KVSERVE_FUZZ_UTIL_H */
