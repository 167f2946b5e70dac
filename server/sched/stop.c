/* stop.c: streaming stop-string matcher (see stop_internal.h). */
#include "server/sched/stop_internal.h"

#include <stdlib.h>
#include <string.h>

struct srv_stop {
    char **stops;      /* non-empty stop strings */
    size_t *lens;
    int32_t *index;    /* their index in the caller's list */
    size_t n;
    size_t max_len;
    char *buf;         /* held-back text, then (transiently) the emitted part */
    size_t len, cap;
    char *out;         /* the text returned by the last call */
    size_t out_cap;
    bool stopped;
    int32_t matched;
};

int srv_stop_create(const char *const *stops, size_t n_stops, srv_stop **out) {
    if (!out || (n_stops > 0 && !stops)) return SRV_STOP_ERR_INVALID;
    *out = NULL;
    srv_stop *s = calloc(1, sizeof *s);
    if (!s) return SRV_STOP_ERR_NOMEM;
    s->matched = -1;
    if (n_stops > 0) {
        s->stops = calloc(n_stops, sizeof *s->stops);
        s->lens = calloc(n_stops, sizeof *s->lens);
        s->index = calloc(n_stops, sizeof *s->index);
        if (!s->stops || !s->lens || !s->index) goto nomem;
        for (size_t i = 0; i < n_stops; i++) {
            if (!stops[i] || !stops[i][0]) continue;
            size_t l = strlen(stops[i]);
            char *c = malloc(l);
            if (!c) goto nomem;
            memcpy(c, stops[i], l);
            s->stops[s->n] = c;
            s->lens[s->n] = l;
            s->index[s->n] = (int32_t)i;
            s->n++;
            if (l > s->max_len) s->max_len = l;
        }
    }
    *out = s;
    return SRV_STOP_OK;
nomem:
    srv_stop_free(s);
    return SRV_STOP_ERR_NOMEM;
}

void srv_stop_free(srv_stop *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) free(s->stops[i]);
    KVS_FREE_ALL(s->stops, s->lens, s->index, s->buf, s->out, s);
}

static int reserve(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    char *n = realloc(*p, c);
    if (!n) return -1;
    *p = n;
    *cap = c;
    return 0;
}

/* Moves buf[0..k) to the output buffer and shifts the rest down. */
static void emit(srv_stop *s, size_t k, const char **out, size_t *out_len) {
    if (k > 0) {
        memcpy(s->out, s->buf, k);
        memmove(s->buf, s->buf + k, s->len - k);
        s->len -= k;
    }
    *out = k ? s->out : NULL;
    *out_len = k;
}

/* Whether buf[p..len) is a proper prefix of some stop string. */
static bool is_partial(const srv_stop *s, size_t p) {
    size_t rest = s->len - p;
    for (size_t i = 0; i < s->n; i++)
        if (s->lens[i] > rest && memcmp(s->buf + p, s->stops[i], rest) == 0) return true;
    return false;
}

int srv_stop_push(srv_stop *s, const char *text, size_t len, const char **out, size_t *out_len, bool *stopped) {
    if (!s || !out || !out_len || (len > 0 && !text)) return SRV_STOP_ERR_INVALID;
    *out = NULL;
    *out_len = 0;
    if (stopped) *stopped = s->stopped;
    if (s->stopped) return SRV_STOP_OK;
    if (s->len + len < s->len) return SRV_STOP_ERR_INVALID;
    if (reserve(&s->buf, &s->cap, s->len + len) || reserve(&s->out, &s->out_cap, s->len + len))
        return SRV_STOP_ERR_NOMEM;
    if (len) memcpy(s->buf + s->len, text, len);
    s->len += len;
    /* Earliest full match. Everything before the held-back start was already emitted and cannot begin a
     * match (it was not a partial prefix), so a match can only start inside buf. */
    size_t best = SIZE_MAX;
    int32_t best_i = -1;
    for (size_t i = 0; i < s->n; i++) {
        if (s->lens[i] > s->len) continue;
        const char *m = memmem(s->buf, s->len, s->stops[i], s->lens[i]);
        if (m && (size_t)(m - s->buf) < best) {
            best = (size_t)(m - s->buf);
            best_i = s->index[i];
        }
    }
    if (best_i >= 0) {
        emit(s, best, out, out_len);
        s->len = 0; /* the stop string and what follows are dropped */
        s->stopped = true;
        s->matched = best_i;
        if (stopped) *stopped = true;
        return SRV_STOP_OK;
    }
    /* Hold back the earliest suffix that is a proper prefix of a stop string. Only the last max_len - 1
     * bytes can be one. */
    size_t k = s->len;
    size_t from = s->max_len > 0 && s->len > s->max_len - 1 ? s->len - (s->max_len - 1) : 0;
    for (size_t p = from; p < s->len; p++) {
        if (is_partial(s, p)) {
            k = p;
            break;
        }
    }
    emit(s, k, out, out_len);
    return SRV_STOP_OK;
}

int srv_stop_flush(srv_stop *s, const char **out, size_t *out_len) {
    if (!s || !out || !out_len) return SRV_STOP_ERR_INVALID;
    *out = NULL;
    *out_len = 0;
    if (s->stopped || s->len == 0) {
        s->len = 0;
        return SRV_STOP_OK;
    }
    if (reserve(&s->out, &s->out_cap, s->len)) return SRV_STOP_ERR_NOMEM;
    emit(s, s->len, out, out_len);
    return SRV_STOP_OK;
}

bool srv_stop_is_stopped(const srv_stop *s) { return s && s->stopped; }
int32_t srv_stop_matched_index(const srv_stop *s) { return s ? s->matched : -1; }
size_t srv_stop_held(const srv_stop *s) { return s ? s->len : 0; }
