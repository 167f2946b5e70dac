/* test_stop.c: the streaming stop-string matcher against a naive whole-text reference. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/sched/stop_internal.h"

/* Reference: the length of text that may be emitted after seeing t[0..n): the earliest start of a full
 * match, else the earliest start of a suffix that is a proper prefix of a stop string, else n. */
static size_t ref_emit(const char *t, size_t n, char **stops, size_t n_stops, bool *matched) {
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < n_stops; i++) {
        size_t l = strlen(stops[i]);
        if (l == 0 || l > n) continue;
        for (size_t p = 0; p + l <= n; p++)
            if (memcmp(t + p, stops[i], l) == 0) {
                if (p < best) best = p;
                break;
            }
    }
    *matched = best != SIZE_MAX;
    if (*matched) return best;
    for (size_t p = 0; p < n; p++)
        for (size_t i = 0; i < n_stops; i++) {
            size_t l = strlen(stops[i]);
            if (l > n - p && memcmp(t + p, stops[i], n - p) == 0) return p;
        }
    return n;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

/* Random strings over a small alphabet (so that matches and partial matches are frequent), including a
 * multi-byte UTF-8 character kept whole. */
static size_t rand_text(uint64_t *r, char *out, size_t max_units) {
    static const char *const units[] = {"a", "b", "c", "\xc3\xa9", " "};
    size_t n = 0, k = 1 + rng_next(r) % max_units;
    for (size_t i = 0; i < k; i++) {
        const char *u = units[rng_next(r) % 5];
        size_t l = strlen(u);
        memcpy(out + n, u, l);
        n += l;
    }
    out[n] = 0;
    return n;
}

Test(stop, randomized_vs_reference) {
    for (uint64_t seed = 1; seed <= 20000; seed++) {
        uint64_t r = seed * 0x9E3779B97F4A7C15ull;
        char text[512];
        size_t n = rand_text(&r, text, 60);
        size_t n_stops = rng_next(&r) % 4;
        char sbuf[4][32];
        char *stops[4];
        for (size_t i = 0; i < n_stops; i++) {
            if (rng_next(&r) % 8 == 0) sbuf[i][0] = 0; /* empty stop: ignored */
            else rand_text(&r, sbuf[i], 4);
            stops[i] = sbuf[i];
        }
        srv_stop *s = NULL;
        cr_assert_eq(srv_stop_create((const char *const *)stops, n_stops, &s), SRV_STOP_OK);
        char emitted[512];
        size_t n_emit = 0, pos = 0;
        bool stopped = false;
        while (pos < n && !stopped) {
            size_t piece = 1 + rng_next(&r) % 6;
            if (rng_next(&r) % 10 == 0) piece = 0; /* empty pieces happen (held UTF-8, special tokens) */
            if (piece > n - pos) piece = n - pos;
            const char *o;
            size_t ol;
            cr_assert_eq(srv_stop_push(s, text + pos, piece, &o, &ol, &stopped), SRV_STOP_OK);
            if (ol) memcpy(emitted + n_emit, o, ol);
            n_emit += ol;
            pos += piece;
            bool m;
            size_t want = ref_emit(text, pos, stops, n_stops, &m);
            if (n_emit != want || memcmp(emitted, text, n_emit) != 0 || m != stopped)
                cr_assert_fail("seed %llu: after %zu bytes emitted %zu, reference %zu (matched %d/%d)",
                         (unsigned long long)seed, pos, n_emit, want, stopped, m);
            cr_assert_eq(srv_stop_held(s), stopped ? 0 : pos - n_emit, "seed %llu", (unsigned long long)seed);
        }
        const char *o;
        size_t ol;
        cr_assert_eq(srv_stop_flush(s, &o, &ol), SRV_STOP_OK);
        if (ol) memcpy(emitted + n_emit, o, ol);
        n_emit += ol;
        bool m;
        size_t want = stopped ? ref_emit(text, pos, stops, n_stops, &m) : n;
        if (n_emit != want || memcmp(emitted, text, n_emit) != 0)
            cr_assert_fail("seed %llu: final %zu bytes, reference %zu", (unsigned long long)seed, n_emit, want);
        if (stopped) {
            int32_t mi = srv_stop_matched_index(s);
            cr_assert(mi >= 0 && (size_t)mi < n_stops);
            size_t l = strlen(stops[mi]);
            cr_assert(l > 0 && memcmp(text + n_emit, stops[mi], l) == 0, "seed %llu", (unsigned long long)seed);
        } else {
            cr_assert_eq(srv_stop_matched_index(s), -1);
        }
        srv_stop_free(s);
    }
}

/* Pushes pieces and returns everything emitted (flushing at the end). */
static void run(const char *const *stops, size_t n_stops, const char *const *pieces, size_t n_pieces,
                char *out, bool *stopped) {
    srv_stop *s = NULL;
    cr_assert_eq(srv_stop_create(stops, n_stops, &s), SRV_STOP_OK);
    size_t n = 0;
    *stopped = false;
    for (size_t i = 0; i < n_pieces; i++) {
        const char *o;
        size_t ol;
        cr_assert_eq(srv_stop_push(s, pieces[i], strlen(pieces[i]), &o, &ol, stopped), SRV_STOP_OK);
        if (ol) memcpy(out + n, o, ol);
        n += ol;
    }
    const char *o;
    size_t ol;
    cr_assert_eq(srv_stop_flush(s, &o, &ol), SRV_STOP_OK);
    if (ol) memcpy(out + n, o, ol);
    n += ol;
    out[n] = 0;
    srv_stop_free(s);
}

Test(stop, cases) {
    char out[256];
    bool st;
    /* inside one piece */
    run((const char *const[]){"STOP"}, 1, (const char *const[]){"abcSTOPdef"}, 1, out, &st);
    cr_assert_str_eq(out, "abc");
    cr_assert(st);
    /* across pieces */
    run((const char *const[]){"\n\nUser:"}, 1, (const char *const[]){"hi\n", "\nUs", "er", ": x"}, 4, out, &st);
    cr_assert_str_eq(out, "hi");
    cr_assert(st);
    /* a partial match that turns out not to be one is released */
    run((const char *const[]){"abc"}, 1, (const char *const[]){"xab", "d"}, 2, out, &st);
    cr_assert_str_eq(out, "xabd");
    cr_assert(!st);
    /* overlapping partial: "aab" inside "aaab" */
    run((const char *const[]){"aab"}, 1, (const char *const[]){"a", "a", "a", "b", "z"}, 5, out, &st);
    cr_assert_str_eq(out, "a");
    cr_assert(st);
    /* the earliest-starting of several stops wins, whatever the list order */
    run((const char *const[]){"cd", "bcdx"}, 2, (const char *const[]){"abcdx"}, 1, out, &st);
    cr_assert_str_eq(out, "a");
    run((const char *const[]){"bcdx", "cd"}, 2, (const char *const[]){"abc", "dy"}, 2, out, &st);
    cr_assert_str_eq(out, "ab");
    /* held-back tail flushed at the end */
    run((const char *const[]){"END"}, 1, (const char *const[]){"fin", "EN"}, 2, out, &st);
    cr_assert_str_eq(out, "finEN");
    cr_assert(!st);
    /* no stops: pass-through */
    run(NULL, 0, (const char *const[]){"a", "", "b"}, 3, out, &st);
    cr_assert_str_eq(out, "ab");
}

Test(stop, errors) {
    srv_stop *s = NULL;
    cr_assert_eq(srv_stop_create(NULL, 1, &s), SRV_STOP_ERR_INVALID);
    cr_assert_eq(srv_stop_create(NULL, 0, NULL), SRV_STOP_ERR_INVALID);
    cr_assert_eq(srv_stop_create(NULL, 0, &s), SRV_STOP_OK);
    const char *o;
    size_t ol;
    cr_assert_eq(srv_stop_push(s, NULL, 3, &o, &ol, NULL), SRV_STOP_ERR_INVALID);
    cr_assert_eq(srv_stop_push(NULL, "a", 1, &o, &ol, NULL), SRV_STOP_ERR_INVALID);
    srv_stop_free(s);
    srv_stop_free(NULL);
}
