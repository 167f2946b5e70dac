/*
 * test_kv_group.c: the KV cache's sliding-window group (kvc_params.swa_layers: the global layers in the main pool,
 * every position kept; the sliding layers in a second pool bounded by the window), under random operations.
 *
 * A plain reference keeps each sequence's token ids and "value positions" (where a token's row came from, which a
 * context shift changes). Rows are a pure function of (token, value position, layer, K/V, head) (helper_kvc.h),
 * written into both pools through the slots of each forward. After every operation: kvc_check passes (it also
 * checks that the pools agree on every sequence's length), every position of every sequence reads right through
 * the main pool's table, every position the group still holds reads right through its table, the window of a
 * sequence that can resume is held, a sequence holds at most ceil(window / block_size) + 2 blocks of the group,
 * and the group never makes a call fail: a forward is refused as full only when the main pool is full.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kv_cache.h"
#include "helper_kvc.h"

enum { SEQS = 6, STREAMS = 3, STREAM_LEN = 400, CAP = 512 };

typedef struct gseq {
    bool live;
    int32_t len, stream;
    int32_t tok[CAP], vpos[CAP];
} gseq;

typedef struct gtest {
    kvc_cache *c;
    kvc_layout lay, glay;
    int32_t window, bs, batch;
    uint64_t rng;
    int32_t streams[STREAMS][STREAM_LEN];
    gseq s[SEQS];
    long n_full, n_shift, n_not_supported, n_attach_tokens, n_forward;
} gtest;

static void verify(gtest *t, int op) {
    char msg[256];
    cr_assert_eq(kvc_check(t->c, msg, sizeof msg), KVC_OK, "op %d: kvc_check: %s", op, msg);
    const kvc_cache *g = kvc_swa_group(t->c);
    for (int32_t id = 0; id < SEQS; id++) {
        gseq *r = &t->s[id];
        cr_assert_eq(kvc_seq_is_live(t->c, id), r->live, "op %d: seq %d liveness", op, id);
        if (!r->live) continue;
        cr_assert_eq(kvc_seq_len(t->c, id), r->len, "op %d: seq %d length", op, id);
        const int32_t *tab, *gtab;
        int32_t nb, gnb, len, glen;
        cr_assert_eq(kvc_block_table(t->c, id, &tab, &nb, &len), 0);
        cr_assert_eq(kvc_block_table(g, id, &gtab, &gnb, &glen), 0);
        cr_assert(len == r->len && glen == r->len && nb == gnb, "op %d: seq %d tables differ in length", op, id);
        int32_t held = 0;
        for (int32_t i = 0; i < gnb; i++) held += gtab[i] >= 0;
        cr_assert_leq(held, (t->window + t->bs - 1) / t->bs + 2, "op %d: seq %d holds %d blocks of the group at "
                      "length %d", op, id, held, r->len);
        bool resumable = kvc_can_resume(t->c, id, r->len);
        for (int32_t p = 0; p < r->len; p++) {
            int32_t b = tab[p / t->bs], gb = gtab[p / t->bs];
            cr_assert_geq(b, 0, "op %d: seq %d position %d released from the main pool", op, id, p);
            cr_assert_eq(kvct_check_slot(&t->lay, b * t->bs + p % t->bs, r->tok[p], r->vpos[p]), 0,
                         "op %d: seq %d position %d: wrong row in the main pool", op, id, p);
            if (resumable && p >= r->len - t->window)
                cr_assert_geq(gb, 0, "op %d: seq %d can resume but position %d of its window is released", op, id, p);
            if (gb >= 0)
                cr_assert_eq(kvct_check_slot(&t->glay, gb * t->bs + p % t->bs, r->tok[p], r->vpos[p]), 0,
                             "op %d: seq %d position %d: wrong row in the sliding group", op, id, p);
        }
    }
}

static int32_t pick_live(gtest *t) {
    int32_t n = 0, ids[SEQS];
    for (int32_t i = 0; i < SEQS; i++)
        if (t->s[i].live) ids[n++] = i;
    return n ? ids[kvct_range(&t->rng, n)] : -1;
}

static int32_t open_seq(gtest *t) {
    int32_t id;
    int rc = kvc_seq_alloc(t->c, &id);
    if (rc == KVC_ERR_NO_SLOT) return -1;
    cr_assert_eq(rc, 0);
    cr_assert(!t->s[id].live);
    t->s[id] = (gseq){.live = true, .len = 0, .stream = kvct_range(&t->rng, STREAMS)};
    return id;
}

static void close_seq(gtest *t, int32_t id) {
    cr_assert_eq(kvc_seq_free(t->c, id), 0);
    t->s[id].live = false;
}

/* A forward of 1..3 sequences that can resume; rolled back one time in eight. */
static void op_forward(gtest *t) {
    kvc_entry e[64];
    int32_t slots[64], n = 0, need = 0;
    bool used[SEQS] = {false};
    for (int k = 0; k < 3; k++) {
        int32_t id = pick_live(t);
        if (id < 0 || used[id]) continue;
        gseq *r = &t->s[id];
        if (!kvc_can_resume(t->c, id, r->len)) { /* a tail removal into the released part: start over */
            cr_assert_eq(kvc_remove(t->c, id, 0, INT32_MAX, NULL), 0);
            r->len = 0;
        }
        int32_t k_tok = 1 + kvct_range(&t->rng, t->batch / 2);
        if (n + k_tok > t->batch) k_tok = t->batch - n;
        if (r->len + k_tok > STREAM_LEN) k_tok = STREAM_LEN - r->len;
        if (k_tok <= 0) continue;
        used[id] = true;
        need += kvc_blocks_needed(t->c, id, k_tok);
        for (int32_t i = 0; i < k_tok; i++) {
            int32_t pos = r->len + i;
            e[n++] = (kvc_entry){id, pos, t->streams[r->stream][pos]};
        }
    }
    if (n == 0) return;
    int rc = kvc_start_forward(t->c, e, n, slots);
    if (rc == KVC_ERR_FULL) {
        cr_assert_gt(need, kvc_blocks_available(t->c), "the sliding group refused a forward the main pool holds");
        t->n_full++;
        int32_t id = pick_live(t); /* make room */
        if (id >= 0) close_seq(t, id);
        return;
    }
    cr_assert_eq(rc, 0, "start_forward: %d", rc);
    const int32_t *gslots = kvc_swa_slots(t->c);
    cr_assert_not_null(gslots);
    for (int32_t i = 0; i < n; i++) {
        kvct_write_slot(&t->lay, slots[i], e[i].token, e[i].pos);
        kvct_write_slot(&t->glay, gslots[i], e[i].token, e[i].pos);
    }
    bool ok = kvct_range(&t->rng, 8) != 0;
    cr_assert_eq(kvc_finish_forward(t->c, ok), 0);
    cr_assert_null(kvc_swa_slots(t->c));
    if (!ok) return;
    t->n_forward++;
    for (int32_t i = 0; i < n; i++) {
        gseq *r = &t->s[e[i].seq];
        r->tok[e[i].pos] = e[i].token;
        r->vpos[e[i].pos] = e[i].pos;
        r->len = e[i].pos + 1;
    }
}

/* What the block manager does: a copied or attached prefix the new sequence cannot resume from is dropped. */
static void drop_if_stuck(gtest *t, int32_t id) {
    if (kvc_can_resume(t->c, id, t->s[id].len)) return;
    cr_assert_eq(kvc_remove(t->c, id, 0, INT32_MAX, NULL), 0);
    t->s[id].len = 0;
}

static void op_copy(gtest *t) {
    int32_t src = pick_live(t);
    if (src < 0) return;
    int32_t dst = open_seq(t);
    if (dst < 0) return;
    gseq *s = &t->s[src], *d = &t->s[dst];
    int32_t len = kvct_range(&t->rng, s->len + 1);
    int rc = kvc_copy_prefix(t->c, src, dst, len);
    if (rc == KVC_ERR_FULL) {
        close_seq(t, dst);
        return;
    }
    cr_assert_eq(rc, 0);
    memcpy(d->tok, s->tok, (size_t)len * sizeof *d->tok);
    memcpy(d->vpos, s->vpos, (size_t)len * sizeof *d->vpos);
    d->len = len;
    d->stream = s->stream;
    drop_if_stuck(t, dst);
}

static void op_attach(gtest *t) {
    int32_t id = open_seq(t);
    if (id < 0) return;
    gseq *r = &t->s[id];
    int32_t n = kvct_range(&t->rng, STREAM_LEN), got = -1, matched = -1;
    const int32_t *toks = t->streams[r->stream];
    cr_assert_eq(kvc_prefix_match(t->c, toks, n, &matched), 0);
    cr_assert_eq(kvc_attach_prefix(t->c, id, toks, n, &got), 0);
    cr_assert(got >= 0 && got <= n && got % t->bs == 0 && got <= matched, "attached %d of %d (matched %d)", got, n,
              matched);
    for (int32_t p = 0; p < got; p++) {
        r->tok[p] = toks[p];
        r->vpos[p] = p;
    }
    r->len = got;
    t->n_attach_tokens += got;
    cr_assert(kvc_can_resume(t->c, id, got), "an attached prefix of %d tokens cannot resume", got);
}

static void op_remove(gtest *t, bool middle) {
    int32_t id = pick_live(t);
    if (id < 0) return;
    gseq *r = &t->s[id];
    if (!middle || r->len < 3) {
        int32_t begin = kvct_range(&t->rng, r->len + 1);
        cr_assert_eq(kvc_remove(t->c, id, begin, INT32_MAX, NULL), 0);
        if (begin < r->len) r->len = begin;
        return;
    }
    int32_t begin = kvct_range(&t->rng, r->len - 1), end = begin + 1 + kvct_range(&t->rng, r->len - 1 - begin);
    kvc_shift sh;
    bool could_resume = kvc_can_resume(t->c, id, r->len);
    int rc = kvc_remove(t->c, id, begin, end, &sh);
    if (rc == KVC_ERR_NOT_SUPPORTED) {
        t->n_not_supported++;
        return;
    }
    cr_assert_eq(rc, 0);
    int32_t d = end - begin;
    cr_assert(sh.pos == begin && sh.n == r->len - end && sh.delta == -d, "shift report");
    memmove(r->tok + begin, r->tok + end, (size_t)(r->len - end) * sizeof *r->tok);
    memmove(r->vpos + begin, r->vpos + end, (size_t)(r->len - end) * sizeof *r->vpos);
    r->len -= d;
    t->n_shift++;
    cr_assert(!could_resume || kvc_can_resume(t->c, id, r->len), "a shift left seq %d unable to resume", id);
}

static void run(uint64_t seed, int32_t window, int32_t bs, int32_t n_blocks, int32_t swa_blocks, int ops) {
    gtest *t = calloc(1, sizeof *t);
    cr_assert_not_null(t);
    t->window = window;
    t->bs = bs;
    t->batch = 24;
    t->rng = seed;
    kvc_params p = kvct_params(n_blocks, bs, SEQS, t->batch);
    p.sliding_window = window;
    p.swa_layers = 1;
    p.swa_blocks = swa_blocks;
    cr_assert_eq(kvc_create(&p, &t->c), 0);
    kvc_get_layout(t->c, &t->lay);
    cr_assert_not_null(kvc_swa_group(t->c));
    kvc_get_layout(kvc_swa_group(t->c), &t->glay);
    cr_assert_eq(t->glay.n_layer, 1);
    cr_assert_eq(t->lay.n_layer, p.n_layer);
    for (int s = 0; s < STREAMS; s++)
        for (int i = 0; i < STREAM_LEN; i++)
            t->streams[s][i] = (s > 0 && i < 12 * s) ? t->streams[0][i] : 1 + kvct_range(&t->rng, 30);
    for (int op = 0; op < ops; op++) {
        int k = kvct_range(&t->rng, 100);
        if (k < 10) (void)open_seq(t);
        else if (k < 16) {
            int32_t id = pick_live(t);
            if (id >= 0) close_seq(t, id);
        } else if (k < 66) op_forward(t);
        else if (k < 74) op_copy(t);
        else if (k < 84) op_attach(t);
        else if (k < 92) op_remove(t, false);
        else op_remove(t, true);
        verify(t, op);
    }
    kvc_stats st;
    kvc_get_stats(t->c, &st);
    cr_assert_eq(st.swa_blocks_total, t->glay.n_blocks);
    cr_assert_leq(st.swa_blocks_used, st.swa_blocks_total);
    cr_log_info("seed %llu window %d bs %d: %ld forwards, %ld full, %ld shifts (%ld not supported), %ld tokens "
                "attached; group %d blocks, main %d", (unsigned long long)seed, window, bs, t->n_forward, t->n_full,
                t->n_shift, t->n_not_supported, t->n_attach_tokens, st.swa_blocks_total, st.blocks_total);
    for (int32_t id = 0; id < SEQS; id++)
        if (t->s[id].live) close_seq(t, id);
    kvc_get_stats(t->c, &st);
    cr_assert_eq(st.blocks_used, 0);
    cr_assert_eq(st.swa_blocks_used, 0);
    kvc_free(t->c);
    free(t);
}

/* The group's default size: it never fills, however the operations go. */
Test(kv_group, random_default_size, .timeout = 120) {
    run(1, 7, 4, 96, 0, 6000);
    run(2, 16, 4, 80, 0, 6000);
    run(3, 5, 2, 160, 0, 6000);
    run(4, 9, 8, 48, 0, 4000);
}

/* A large group keeps released blocks cached, so attached prefixes reach far; a small one evicts them, so the
 * main pool's longer match is cut to what the group still holds. */
Test(kv_group, random_group_sizes, .timeout = 120) {
    run(5, 7, 4, 96, 400, 5000);
    run(6, 7, 4, 96, 24 /* close to the bound: evictions */, 5000);
}

Test(kv_group, create_checks) {
    kvc_params p = kvct_params(16, 4, 2, 8);
    kvc_cache *c = NULL;
    p.swa_layers = 1; /* no window */
    cr_expect_eq(kvc_create(&p, &c), KVC_ERR_INVALID);
    p.sliding_window = 8;
    p.swa_layers = -1;
    cr_expect_eq(kvc_create(&p, &c), KVC_ERR_INVALID);
    p.swa_layers = 1;
    p.swa_blocks = -1;
    cr_expect_eq(kvc_create(&p, &c), KVC_ERR_INVALID);
    p.swa_blocks = 0;
    cr_assert_eq(kvc_create(&p, &c), 0);
    kvc_stats st;
    kvc_get_stats(c, &st);
    /* default: max_seqs * (ceil(8 / 4) + 4) + ceil(8 / 4) */
    cr_expect_eq(st.swa_blocks_total, 2 * 6 + 2);
    cr_expect_eq(st.blocks_total, 16);
    kvc_free(c);
    p.swa_layers = 0; /* a plain cache has no group */
    cr_assert_eq(kvc_create(&p, &c), 0);
    cr_expect_null(kvc_swa_group(c));
    kvc_get_stats(c, &st);
    cr_expect_eq(st.swa_blocks_total, 0);
    kvc_free(c);
}
