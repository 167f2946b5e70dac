/*
 * test_kv_cache.c: randomized differential test of the paged KV cache against a simple reference model.
 *
 * The reference keeps, per sequence, plain arrays of token ids and "value positions" (the position whose
 * K/V a token holds: its own position, except after a context shift, which moves values). Row contents are
 * a pure function of (token, value position, layer, K/V, head) (helper_kvc.h), written by the test into the
 * slots kvc_start_forward returns, so sequences with the same prefix hold the same data.
 *
 * After every operation: every live sequence read through its block table equals the reference, kvc_check
 * passes, refcounts equal the table references counted from outside, stats agree. Failing calls must leave
 * everything unchanged (snapshots compared). A failure message names the seed and the operation index.
 */
#ifndef KVCT_FUZZ /* fuzz/fuzz_kv_cache.c includes this file with its own assertions instead of Criterion's */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#endif
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/kv_cache.h"
#include "helper_kvc.h"

#define MAX_SEQS 10
#define N_STREAM 4
#define STREAM_LEN 4096
#define VOCAB 40

#ifndef KVCT_SUITE
#define KVCT_SUITE kv_cache_random
#endif
/* Where the operations' choices come from: the seeded generator here; the fuzz harness draws them from its
 * input instead (the streams' contents always come from the generator). */
#ifndef KVCT_PICK
#define KVCT_PICK(t, n) kvct_range(&(t)->rng, (n))
#endif

typedef struct rseq {
    bool live;
    int32_t len;
    int32_t *tok, *vpos; /* [cap] */
    int32_t cap;
    int32_t dirty_from; /* first position filled by a context shift (INT32_MAX: none) */
    int32_t released;   /* leading blocks released by the sliding window */
    int32_t stream;     /* token stream the sequence follows */
} rseq;

typedef struct rcfg {
    const char *name;
    uint64_t seed;
    int ops;
    kvc_dtype dtype;
    int32_t head_dim, block_size, n_blocks, max_seqs, max_batch, max_seq_len, window;
    bool prefix;
} rcfg;

typedef struct snap {
    bool live[MAX_SEQS];
    int32_t len[MAX_SEQS], nb[MAX_SEQS];
    int32_t *table[MAX_SEQS];
    int32_t *refs;
    kvc_stats st;
} snap;

typedef struct tctx {
    rcfg cfg;
    kvc_cache *c;
    kvc_layout lay;
    uint64_t rng;
    long op;
    rseq s[MAX_SEQS];
    int32_t streams[N_STREAM][STREAM_LEN];
    int32_t *count; /* [n_blocks] scratch */
    snap sn;
    long n_forward, n_full, n_rollback, n_attach, n_hit_tokens, n_shift, n_not_supported, n_copy;
} tctx;

#define REQ(cond, ...)                                                                                   \
    do {                                                                                                 \
        if (!(cond)) {                                                                                   \
            char m_[512];                                                                                \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                                        \
            cr_assert_fail("[%s seed %llu op %ld] %s (%s:%d)", t->cfg.name, (unsigned long long)t->cfg.seed, \
                     t->op, m_, __FILE__, __LINE__);                                                     \
        }                                                                                                \
    } while (0)

/* ---- reference helpers ---------------------------------------------------------------------------------- */
static void rs_reserve(rseq *r, int32_t n) {
    if (n <= r->cap) return;
    int32_t cap = r->cap ? r->cap : 64;
    while (cap < n) cap *= 2;
    r->tok = realloc(r->tok, (size_t)cap * sizeof(int32_t));
    r->vpos = realloc(r->vpos, (size_t)cap * sizeof(int32_t));
    cr_assert(r->tok && r->vpos);
    r->cap = cap;
}

static int32_t rceil(int32_t a, int32_t b) { return (a + b - 1) / b; }

/* The next token a sequence produces at pos: mostly its stream, sometimes something else. */
static int32_t next_token(tctx *t, const rseq *r, int32_t pos) {
    if (KVCT_PICK(t, 100) < 3) return KVCT_PICK(t, VOCAB);
    return t->streams[r->stream][pos % STREAM_LEN];
}

static void take_snap(tctx *t) {
    snap *sn = &t->sn;
    for (int32_t i = 0; i < t->cfg.max_seqs; i++) {
        sn->live[i] = kvc_seq_is_live(t->c, i);
        sn->len[i] = sn->nb[i] = 0;
        if (!sn->live[i]) continue;
        const int32_t *tab;
        REQ(kvc_block_table(t->c, i, &tab, &sn->nb[i], &sn->len[i]) == 0, "block_table");
        sn->table[i] = realloc(sn->table[i], (size_t)(sn->nb[i] + 1) * sizeof(int32_t));
        if (sn->nb[i]) memcpy(sn->table[i], tab, (size_t)sn->nb[i] * sizeof(int32_t));
    }
    for (int32_t b = 0; b < t->lay.n_blocks; b++) sn->refs[b] = kvc_block_refcount(t->c, b);
    kvc_get_stats(t->c, &sn->st);
}

/* Everything observable equals the snapshot. tables_only: after a rollback, only tables, lengths and the
 * refcounts of blocks in them must be back (evictions during the batch are allowed). */
static void expect_snap(tctx *t, bool tables_only, const char *what) {
    snap *sn = &t->sn;
    for (int32_t i = 0; i < t->cfg.max_seqs; i++) {
        REQ(kvc_seq_is_live(t->c, i) == sn->live[i], "%s: seq %d liveness changed", what, i);
        if (!sn->live[i]) continue;
        const int32_t *tab;
        int32_t nb, len;
        REQ(kvc_block_table(t->c, i, &tab, &nb, &len) == 0, "block_table");
        REQ(nb == sn->nb[i] && len == sn->len[i], "%s: seq %d table %d/%d -> %d/%d", what, i, sn->nb[i],
            sn->len[i], nb, len);
        for (int32_t j = 0; j < nb; j++) {
            REQ(tab[j] == sn->table[i][j], "%s: seq %d table[%d] %d -> %d", what, i, j, sn->table[i][j], tab[j]);
            if (tab[j] >= 0)
                REQ(kvc_block_refcount(t->c, tab[j]) == sn->refs[tab[j]], "%s: block %d refcount changed", what,
                    tab[j]);
        }
    }
    if (tables_only) return;
    for (int32_t b = 0; b < t->lay.n_blocks; b++)
        REQ(kvc_block_refcount(t->c, b) == sn->refs[b], "%s: block %d refcount %d -> %d", what, b, sn->refs[b],
            kvc_block_refcount(t->c, b));
    kvc_stats st;
    kvc_get_stats(t->c, &st);
    REQ(st.blocks_used == sn->st.blocks_used && st.blocks_cached == sn->st.blocks_cached &&
            st.blocks_free == sn->st.blocks_free && st.seqs_live == sn->st.seqs_live &&
            st.tokens_live == sn->st.tokens_live && st.evictions == sn->st.evictions &&
            st.cow_copies == sn->st.cow_copies && st.prefix_hit_tokens == sn->st.prefix_hit_tokens,
        "%s: stats changed", what);
}

/* The full verification after every step. */
static void verify(tctx *t) {
    char msg[256];
    int rc = kvc_check(t->c, msg, sizeof msg);
    REQ(rc == KVC_OK, "kvc_check: %s", msg);
    int32_t bs = t->lay.block_size, W = t->cfg.window;
    memset(t->count, 0, (size_t)t->lay.n_blocks * sizeof(int32_t));
    int32_t live = 0;
    int64_t tokens = 0;
    for (int32_t i = 0; i < t->cfg.max_seqs; i++) {
        rseq *r = &t->s[i];
        REQ(kvc_seq_is_live(t->c, i) == r->live, "seq %d liveness", i);
        if (!r->live) {
            REQ(kvc_seq_len(t->c, i) == 0, "dead seq %d has a length", i);
            continue;
        }
        live++;
        tokens += r->len;
        const int32_t *tab;
        int32_t nb, len;
        REQ(kvc_block_table(t->c, i, &tab, &nb, &len) == 0, "block_table");
        REQ(len == r->len && kvc_seq_len(t->c, i) == r->len, "seq %d len %d, reference %d", i, len, r->len);
        REQ(nb == rceil(r->len, bs), "seq %d: %d blocks for %d tokens", i, nb, r->len);
        for (int32_t j = 0; j < nb; j++) {
            if (j < r->released) {
                REQ(tab[j] == -1, "seq %d block %d should be released (window)", i, j);
                continue;
            }
            REQ(tab[j] >= 0 && tab[j] < t->lay.n_blocks, "seq %d table[%d] = %d", i, j, tab[j]);
            t->count[tab[j]]++;
        }
        for (int32_t p = r->released * bs; p < r->len; p++) {
            int32_t slot = tab[p / bs] * bs + p % bs;
            int bad = kvct_check_slot(&t->lay, slot, r->tok[p], r->vpos[p]);
            REQ(bad == 0, "seq %d pos %d (token %d vpos %d, block %d): row %d differs", i, p, r->tok[p], r->vpos[p],
                tab[p / bs], bad - 1);
        }
        if (W > 0) REQ(kvc_can_resume(t->c, i, r->len) || r->released * bs > r->len - W,
                       "seq %d cannot resume at its end", i);
    }
    int32_t used = 0;
    for (int32_t b = 0; b < t->lay.n_blocks; b++) {
        REQ(kvc_block_refcount(t->c, b) == t->count[b], "block %d refcount %d, tables hold it %d times", b,
            kvc_block_refcount(t->c, b), t->count[b]);
        used += t->count[b] > 0;
    }
    kvc_stats st;
    kvc_get_stats(t->c, &st);
    REQ(st.seqs_live == live && st.tokens_live == tokens, "stats seqs %d/%d tokens %lld/%lld", st.seqs_live, live,
        (long long)st.tokens_live, (long long)tokens);
    REQ(st.blocks_used == used, "stats used %d, counted %d", st.blocks_used, used);
    REQ(st.blocks_used + st.blocks_cached + st.blocks_free == st.blocks_total, "used+cached+free != total");
    REQ(kvc_blocks_available(t->c) == st.blocks_free + st.blocks_cached, "available");
    if (!t->cfg.prefix) REQ(st.blocks_cached == 0, "cached blocks without prefix caching");
}

static int32_t pick_live(tctx *t) {
    int32_t ids[MAX_SEQS], n = 0;
    for (int32_t i = 0; i < t->cfg.max_seqs; i++)
        if (t->s[i].live) ids[n++] = i;
    return n ? ids[KVCT_PICK(t, n)] : -1;
}

static void ref_alloc(tctx *t, int32_t id) {
    rseq *r = &t->s[id];
    r->live = true;
    r->len = 0;
    r->dirty_from = INT32_MAX;
    r->released = 0;
    r->stream = KVCT_PICK(t, N_STREAM);
}

/* Applies the window release to the reference after a commit or an attach. */
static void ref_window(tctx *t, rseq *r) {
    int32_t W = t->cfg.window, bs = t->lay.block_size;
    if (W <= 0 || r->len <= W) return;
    int32_t lim = (r->len - W) / bs;
    if (lim > r->released) r->released = lim;
}

static void ref_truncate(tctx *t, rseq *r, int32_t len) {
    int32_t bs = t->lay.block_size;
    r->len = len;
    if (r->released > rceil(len, bs)) r->released = rceil(len, bs);
    if (len <= r->dirty_from) r->dirty_from = INT32_MAX;
}

/* ---- operations ------------------------------------------------------------------------------------------ */
static int32_t op_alloc(tctx *t) {
    take_snap(t);
    int32_t id = -1, expect = -1;
    for (int32_t i = 0; i < t->cfg.max_seqs; i++)
        if (!t->s[i].live) { expect = i; break; }
    int rc = kvc_seq_alloc(t->c, &id);
    if (expect < 0) {
        REQ(rc == KVC_ERR_NO_SLOT, "alloc with all slots used: %d", rc);
        expect_snap(t, false, "alloc NO_SLOT");
        return -1;
    }
    REQ(rc == 0 && id == expect, "alloc: rc %d id %d, expected %d", rc, id, expect);
    ref_alloc(t, id);
    return id;
}

static void op_free(tctx *t) {
    if (KVCT_PICK(t, 5) == 0) { /* a dead or out-of-range id */
        int32_t id = KVCT_PICK(t, t->cfg.max_seqs + 2) - 1;
        if (id >= 0 && id < t->cfg.max_seqs && t->s[id].live) return;
        take_snap(t);
        REQ(kvc_seq_free(t->c, id) == KVC_ERR_BAD_SEQ, "free of dead id %d", id);
        expect_snap(t, false, "double free");
        return;
    }
    int32_t id = pick_live(t);
    if (id < 0) return;
    REQ(kvc_seq_free(t->c, id) == 0, "free %d", id);
    t->s[id].live = false;
    t->s[id].len = 0;
}

/* A batch over a few sequences: decode tokens and prefill chunks, interleaved; errors injected at times. */
static void op_forward(tctx *t) {
    int32_t bs = t->lay.block_size, W = t->cfg.window;
    int32_t ids[MAX_SEQS], nid = 0, cnt[MAX_SEQS] = {0};
    int32_t want = 1 + KVCT_PICK(t, 4);
    for (int k = 0; k < 8 && nid < want; k++) {
        int32_t id = pick_live(t);
        if (id < 0) break;
        bool dup = false;
        for (int j = 0; j < nid; j++) dup |= ids[j] == id;
        if (!dup) ids[nid++] = id;
    }
    if (nid == 0) return;
    int32_t total = 0;
    for (int j = 0; j < nid; j++) {
        cnt[j] = KVCT_PICK(t, 2) ? 1 : 1 + KVCT_PICK(t, 3 * bs);
        total += cnt[j];
    }
    int inject = KVCT_PICK(t, 25); /* 0: bad position, 1: over max_batch_tokens */
    if (inject == 1) {
        cnt[0] += t->cfg.max_batch + 1 - total;
        total = t->cfg.max_batch + 1;
    }
    kvc_entry *e = malloc((size_t)total * sizeof *e);
    int32_t *slots = malloc((size_t)total * sizeof *slots);
    cr_assert(e && slots);
    /* interleave: repeatedly pick a sequence with entries left */
    int32_t next[MAX_SEQS], left[MAX_SEQS];
    for (int j = 0; j < nid; j++) {
        next[j] = t->s[ids[j]].len;
        left[j] = cnt[j];
    }
    for (int32_t i = 0; i < total; i++) {
        int j;
        do j = KVCT_PICK(t, nid); while (left[j] == 0);
        rseq *r = &t->s[ids[j]];
        e[i].seq = ids[j];
        e[i].pos = next[j];
        e[i].token = next_token(t, r, next[j]);
        next[j]++;
        left[j]--;
    }
    if (inject == 0) e[KVCT_PICK(t, total)].pos += KVCT_PICK(t, 2) ? 1 : -1;
    /* expected outcome, in the contract's order */
    int expect = 0;
    if (total > t->cfg.max_batch) expect = KVC_ERR_TOO_LARGE;
    else {
        int32_t seen[MAX_SEQS] = {0};
        for (int32_t i = 0; i < total && !expect; i++) {
            rseq *r = &t->s[e[i].seq];
            if (e[i].pos != r->len + seen[e[i].seq]) expect = KVC_ERR_POSITION;
            else if (seen[e[i].seq] == 0 && W > 0 && r->len > 0 &&
                     (r->len > W ? r->len - W : 0) / bs < r->released)
                expect = KVC_ERR_POSITION; /* cannot resume: part of its window was released */
            else if (t->cfg.max_seq_len > 0 && e[i].pos >= t->cfg.max_seq_len) expect = KVC_ERR_TOO_LARGE;
            seen[e[i].seq]++;
        }
        if (!expect) {
            int64_t need = 0;
            for (int j = 0; j < nid; j++) {
                rseq *r = &t->s[ids[j]];
                int32_t nb = kvc_blocks_needed(t->c, ids[j], cnt[j]);
                int32_t fresh = rceil(r->len + cnt[j], bs) - rceil(r->len, bs);
                bool rel_last = r->len % bs != 0 && r->released == rceil(r->len, bs);
                if (r->len % bs == 0) REQ(nb == fresh, "blocks_needed %d, expected %d", nb, fresh);
                else if (rel_last) REQ(nb == fresh + 1, "blocks_needed %d, expected %d", nb, fresh + 1);
                else REQ(nb == fresh || nb == fresh + 1, "blocks_needed %d, expected %d or +1", nb, fresh);
                need += nb;
            }
            if (need > kvc_blocks_available(t->c)) expect = KVC_ERR_FULL;
        }
    }
    take_snap(t);
    int rc = kvc_start_forward(t->c, e, total, slots);
    REQ(rc == expect, "start_forward: %d (%s), expected %d", rc, kvs_strerror(rc), expect);
    if (rc != 0) {
        if (rc == KVC_ERR_FULL) t->n_full++;
        expect_snap(t, false, "start_forward error");
        free(e);
        free(slots);
        return;
    }
    t->n_forward++;
    /* pending: slots match tables, blocks written are exclusive, calls that need no forward are refused */
    char msg[256];
    REQ(kvc_check(t->c, msg, sizeof msg) == 0, "kvc_check (pending): %s", msg);
    for (int32_t i = 0; i < total; i++) {
        const int32_t *tab;
        int32_t nb, len;
        REQ(kvc_block_table(t->c, e[i].seq, &tab, &nb, &len) == 0, "block_table");
        REQ(slots[i] / bs == tab[e[i].pos / bs] && slots[i] % bs == e[i].pos % bs, "slot %d != table", i);
        REQ(kvc_block_refcount(t->c, slots[i] / bs) == 1, "write into a shared block %d (refcount %d)",
            slots[i] / bs, kvc_block_refcount(t->c, slots[i] / bs));
        for (int32_t k = 0; k < i; k++) REQ(slots[k] != slots[i], "slot %d repeated", slots[i]);
    }
    for (int j = 0; j < nid; j++) {
        int32_t len = 0;
        kvc_block_table(t->c, ids[j], NULL, NULL, &len);
        REQ(len == t->s[ids[j]].len + cnt[j], "pending length %d, expected %d", len, t->s[ids[j]].len + cnt[j]);
    }
    if (KVCT_PICK(t, 20) == 0) {
        int32_t id;
        REQ(kvc_start_forward(t->c, e, total, slots) == KVC_ERR_STATE, "second start_forward");
        REQ(kvc_seq_alloc(t->c, &id) == KVC_ERR_STATE, "alloc while pending");
        REQ(kvc_remove(t->c, ids[0], 0, INT32_MAX, NULL) == KVC_ERR_STATE, "remove while pending");
        REQ(kvc_seq_free(t->c, ids[0]) == KVC_ERR_STATE, "free while pending");
    }
    for (int32_t i = 0; i < total; i++) kvct_write_slot(&t->lay, slots[i], e[i].token, e[i].pos);
    bool ok = KVCT_PICK(t, 10) != 0;
    REQ(kvc_finish_forward(t->c, ok) == 0, "finish_forward");
    if (!ok) {
        t->n_rollback++;
        expect_snap(t, true, "rollback");
    } else {
        for (int32_t i = 0; i < total; i++) {
            rseq *r = &t->s[e[i].seq];
            rs_reserve(r, r->len + 1);
            r->tok[r->len] = e[i].token;
            r->vpos[r->len] = e[i].pos;
            r->len++;
        }
        for (int j = 0; j < nid; j++) ref_window(t, &t->s[ids[j]]);
    }
    (void)W;
    REQ(kvc_finish_forward(t->c, true) == KVC_ERR_STATE, "finish without a forward");
    free(e);
    free(slots);
}

static void op_copy_prefix(tctx *t) {
    int32_t src = pick_live(t), bs = t->lay.block_size;
    if (src < 0) return;
    rseq *rs = &t->s[src];
    int32_t len = KVCT_PICK(t, rs->len + 1);
    take_snap(t);
    REQ(kvc_copy_prefix(t->c, src, src, len) == KVC_ERR_INVALID, "copy onto itself");
    if (rs->len > 0) {
        int32_t other = pick_live(t);
        if (other != src && t->s[other].len > 0)
            REQ(kvc_copy_prefix(t->c, src, other, 1) == KVC_ERR_INVALID, "copy onto a non-empty sequence");
    }
    expect_snap(t, false, "copy_prefix errors");
    int32_t dst = op_alloc(t);
    if (dst < 0) return;
    take_snap(t);
    REQ(kvc_copy_prefix(t->c, src, dst, rs->len + 1) == KVC_ERR_INVALID, "copy past the end");
    bool partial = len % bs != 0 && rs->released <= len / bs;
    int expect = partial && kvc_blocks_available(t->c) == 0 ? KVC_ERR_FULL : 0;
    int rc = kvc_copy_prefix(t->c, src, dst, len);
    REQ(rc == expect, "copy_prefix %d, expected %d", rc, expect);
    if (rc) {
        expect_snap(t, false, "copy_prefix FULL");
        return;
    }
    t->n_copy++;
    rseq *rd = &t->s[dst];
    rs_reserve(rd, len);
    if (len) {
        memcpy(rd->tok, rs->tok, (size_t)len * sizeof(int32_t));
        memcpy(rd->vpos, rs->vpos, (size_t)len * sizeof(int32_t));
    }
    rd->len = len;
    rd->stream = rs->stream;
    rd->dirty_from = rs->dirty_from < len ? rs->dirty_from : INT32_MAX;
    rd->released = rs->released < rceil(len, bs) ? rs->released : rceil(len, bs);
    const int32_t *ts = NULL, *td = NULL;
    kvc_block_table(t->c, src, &ts, NULL, NULL);
    kvc_block_table(t->c, dst, &td, NULL, NULL);
    for (int32_t i = 0; i < len / bs; i++) REQ(ts[i] == td[i], "copy_prefix did not share full block %d", i);
    if (partial) REQ(ts[len / bs] != td[len / bs], "copy_prefix shared the partial block");
}

/* Full blocks of tokens[0..n) that live sequence r holds with clean, present blocks. */
static int32_t held_prefix_blocks(tctx *t, const rseq *r, const int32_t *tokens, int32_t n) {
    int32_t bs = t->lay.block_size;
    if (r->released > 0) return 0;
    int32_t lim = r->len < n ? r->len : n;
    if (r->dirty_from < lim) lim = r->dirty_from;
    int32_t i = 0;
    while (i < lim && r->tok[i] == tokens[i]) i++;
    return i / bs;
}

static void op_attach(tctx *t) {
    int32_t bs = t->lay.block_size;
    int32_t id = op_alloc(t);
    if (id < 0) return;
    rseq *r = &t->s[id];
    int32_t n = KVCT_PICK(t, 12 * bs + 2);
    if (t->cfg.max_seq_len > 0 && n > t->cfg.max_seq_len) n = t->cfg.max_seq_len;
    int32_t *tokens = malloc((size_t)(n + 1) * sizeof *tokens);
    cr_assert(tokens);
    /* usually a prefix of some live sequence or of a stream, sometimes with a difference */
    int32_t like = pick_live(t);
    for (int32_t i = 0; i < n; i++) {
        if (like >= 0 && like != id && i < t->s[like].len && t->s[like].dirty_from > i)
            tokens[i] = t->s[like].tok[i];
        else tokens[i] = t->streams[r->stream][i];
    }
    if (n > 0 && KVCT_PICK(t, 4) == 0) tokens[KVCT_PICK(t, n)] = KVCT_PICK(t, VOCAB);
    int32_t m0 = -1, m = -1, lower = 0;
    REQ(kvc_prefix_match(t->c, tokens, n, &m0) == 0, "prefix_match");
    if (t->cfg.prefix)
        for (int32_t i = 0; i < t->cfg.max_seqs; i++)
            if (t->s[i].live && i != id) {
                int32_t h = held_prefix_blocks(t, &t->s[i], tokens, n);
                if (h > lower) lower = h;
            }
    kvc_stats before, after;
    kvc_get_stats(t->c, &before);
    REQ(kvc_attach_prefix(t->c, id, tokens, n, &m) == 0, "attach_prefix");
    kvc_get_stats(t->c, &after);
    REQ(m == m0, "attach %d != prefix_match %d", m, m0);
    REQ(m % bs == 0 && m <= n && m >= 0, "attach count %d of %d", m, n);
    REQ(m >= lower * bs, "attach %d, but a live sequence holds %d matching full blocks", m, lower);
    if (!t->cfg.prefix) REQ(m == 0, "attach without prefix caching");
    REQ(after.prefix_query_tokens == before.prefix_query_tokens + (uint64_t)n &&
            after.prefix_hit_tokens == before.prefix_hit_tokens + (uint64_t)m,
        "prefix stats");
    t->n_attach++;
    t->n_hit_tokens += m;
    rs_reserve(r, m + 1);
    for (int32_t i = 0; i < m; i++) {
        r->tok[i] = tokens[i];
        r->vpos[i] = i;
    }
    r->len = m;
    ref_window(t, r);
    if (m > 0) {
        int32_t x = 0;
        take_snap(t);
        REQ(kvc_attach_prefix(t->c, id, tokens, n, &x) == KVC_ERR_INVALID, "attach to a non-empty sequence");
        expect_snap(t, false, "attach error");
    }
    free(tokens);
}

static void op_remove(tctx *t, bool middle) {
    int32_t id = pick_live(t), bs = t->lay.block_size;
    if (id < 0) return;
    rseq *r = &t->s[id];
    kvc_shift sh = {-7, -7, -7};
    if (!middle || r->len < 2) {
        int32_t begin = KVCT_PICK(t, r->len + 2);
        int32_t end = KVCT_PICK(t, 2) ? INT32_MAX : begin > r->len ? begin : r->len + KVCT_PICK(t, 3);
        REQ(kvc_remove(t->c, id, begin, end, &sh) == 0, "tail remove");
        REQ(sh.n == 0 && sh.pos == begin && sh.delta == 0, "tail shift");
        if (begin < r->len) ref_truncate(t, r, begin);
        return;
    }
    int32_t begin = KVCT_PICK(t, r->len - 1);
    int32_t end = begin + 1 + KVCT_PICK(t, r->len - 1 - begin);
    bool ok = r->released <= begin / bs;
    if (ok) {
        const int32_t *tab = NULL;
        int32_t nb = 0;
        kvc_block_table(t->c, id, &tab, &nb, NULL);
        for (int32_t i = begin / bs; i < nb; i++) ok &= kvc_block_refcount(t->c, tab[i]) == 1;
    }
    take_snap(t);
    int rc = kvc_remove(t->c, id, begin, end, &sh);
    if (!ok) {
        REQ(rc == KVC_ERR_NOT_SUPPORTED, "middle remove of shared blocks: %d", rc);
        expect_snap(t, false, "remove NOT_SUPPORTED");
        t->n_not_supported++;
        return;
    }
    REQ(rc == 0, "middle remove: %d", rc);
    int32_t delta = end - begin, moved = r->len - end;
    REQ(sh.pos == begin && sh.n == moved && sh.delta == -delta, "shift {%d,%d,%d}, expected {%d,%d,%d}", sh.pos,
        sh.n, sh.delta, begin, moved, -delta);
    memmove(r->tok + begin, r->tok + end, (size_t)moved * sizeof(int32_t));
    memmove(r->vpos + begin, r->vpos + end, (size_t)moved * sizeof(int32_t));
    r->len -= delta;
    if (begin < r->dirty_from) r->dirty_from = begin;
    t->n_shift++;
}

static void op_probe(tctx *t) {
    int32_t id = pick_live(t), bs = t->lay.block_size, W = t->cfg.window;
    take_snap(t);
    switch (KVCT_PICK(t, 6)) {
    case 0: { /* can_resume against the reference */
        if (id < 0) break;
        rseq *r = &t->s[id];
        for (int32_t pos = -1; pos <= r->len + 1; pos++) {
            bool exp = pos >= 0 && pos <= r->len;
            if (exp && W > 0 && pos > 0) {
                int32_t lo = pos > W ? pos - W : 0;
                exp = lo / bs >= r->released;
            }
            REQ(kvc_can_resume(t->c, id, pos) == exp, "can_resume(%d) at len %d (released %d)", pos, r->len,
                r->released);
        }
        break;
    }
    case 1:
        REQ(kvc_remove(t->c, id < 0 ? 0 : id, -1, 3, NULL) == (id < 0 ? KVC_ERR_BAD_SEQ : KVC_ERR_INVALID),
            "remove begin < 0");
        if (id >= 0) REQ(kvc_remove(t->c, id, 3, 2, NULL) == KVC_ERR_INVALID, "remove end < begin");
        break;
    case 2: {
        kvc_entry e = {id < 0 ? 0 : id, 0, 1};
        int32_t slot;
        REQ(kvc_start_forward(t->c, &e, 0, &slot) == KVC_ERR_INVALID, "n = 0");
        REQ(kvc_start_forward(t->c, NULL, 1, &slot) == KVC_ERR_INVALID, "NULL entries");
        e.seq = t->cfg.max_seqs;
        REQ(kvc_start_forward(t->c, &e, 1, &slot) == KVC_ERR_BAD_SEQ, "bad seq");
        break;
    }
    case 3:
        REQ(kvc_finish_forward(t->c, false) == KVC_ERR_STATE, "finish without a forward");
        REQ(kvc_block_refcount(t->c, -1) == KVC_ERR_INVALID && kvc_block_refcount(t->c, t->lay.n_blocks) ==
            KVC_ERR_INVALID, "refcount of a bad block");
        break;
    case 4:
        if (id >= 0) {
            int32_t n = KVCT_PICK(t, 3 * bs), nb = kvc_blocks_needed(t->c, id, n);
            rseq *r = &t->s[id];
            int32_t fresh = rceil(r->len + n, bs) - rceil(r->len, bs);
            REQ(nb == fresh || (n > 0 && r->len % bs != 0 && nb == fresh + 1), "blocks_needed");
        }
        REQ(kvc_blocks_needed(t->c, -1, 1) < 0, "blocks_needed bad id");
        break;
    case 5: {
        int32_t m;
        REQ(kvc_prefix_match(t->c, NULL, 3, &m) == KVC_ERR_INVALID, "prefix_match NULL");
        if (id >= 0) REQ(kvc_copy_prefix(t->c, id, t->cfg.max_seqs, 0) == KVC_ERR_BAD_SEQ, "copy to bad id");
        break;
    }
    }
    expect_snap(t, false, "probe");
}

static void run_random(const rcfg *cfg, long *ops_done) {
    tctx *t = calloc(1, sizeof *t);
    cr_assert(t);
    t->cfg = *cfg;
    t->rng = cfg->seed;
    kvc_params p;
    kvc_params_default(&p);
    p.n_layer = 2;
    p.n_kv_head = 2;
    p.head_dim = cfg->head_dim;
    p.block_size = cfg->block_size;
    p.n_blocks = cfg->n_blocks;
    p.max_seqs = cfg->max_seqs;
    p.max_batch_tokens = cfg->max_batch;
    p.max_seq_len = cfg->max_seq_len;
    p.sliding_window = cfg->window;
    p.dtype = cfg->dtype;
    p.prefix_caching = cfg->prefix;
    cr_assert_eq(kvc_create(&p, &t->c), 0);
    kvc_get_layout(t->c, &t->lay);
    t->count = calloc((size_t)t->lay.n_blocks, sizeof(int32_t));
    t->sn.refs = calloc((size_t)t->lay.n_blocks, sizeof(int32_t));
    cr_assert(t->count && t->sn.refs);
    /* streams share long prefixes with each other so that prefixes collide in the cache */
    for (int s = 0; s < N_STREAM; s++)
        for (int i = 0; i < STREAM_LEN; i++)
            t->streams[s][i] = (s > 0 && i < 8 * s) ? t->streams[0][i] : kvct_range(&t->rng, VOCAB);
    for (t->op = 0; t->op < cfg->ops; t->op++) {
        int k = KVCT_PICK(t, 100);
        if (k < 8) op_alloc(t);
        else if (k < 14) op_free(t);
        else if (k < 58) op_forward(t);
        else if (k < 64) op_copy_prefix(t);
        else if (k < 74) op_attach(t);
        else if (k < 81) op_remove(t, false);
        else if (k < 89) op_remove(t, true);
        else op_probe(t);
        verify(t);
    }
    /* free everything: nothing used, every block cached or free */
    for (int32_t i = 0; i < t->cfg.max_seqs; i++)
        if (t->s[i].live) {
            REQ(kvc_seq_free(t->c, i) == 0, "final free");
            t->s[i].live = false;
        }
    verify(t);
    kvc_stats st;
    kvc_get_stats(t->c, &st);
    REQ(st.blocks_used == 0 && st.blocks_cached + st.blocks_free == st.blocks_total, "blocks leaked at the end");
    /* every block can still be had: one sequence fills the whole pool (evicting all cached blocks) */
    int32_t id = -1, bs = t->lay.block_size;
    REQ(kvc_seq_alloc(t->c, &id) == 0, "alloc");
    ref_alloc(t, id);
    int64_t cap = (int64_t)t->lay.n_blocks * bs;
    if (t->cfg.max_seq_len > 0 && cap > t->cfg.max_seq_len) cap = t->cfg.max_seq_len;
    int32_t chunk = t->cfg.max_batch;
    kvc_entry *e = malloc((size_t)chunk * sizeof *e);
    int32_t *slots = malloc((size_t)chunk * sizeof *slots);
    cr_assert(e && slots);
    for (int32_t pos = 0; pos < cap;) {
        int32_t n = (int32_t)(cap - pos < chunk ? cap - pos : chunk);
        for (int32_t i = 0; i < n; i++) e[i] = (kvc_entry){id, pos + i, 1000 + (pos + i) % 7};
        REQ(kvc_start_forward(t->c, e, n, slots) == 0, "filling the pool at %d", pos);
        REQ(kvc_finish_forward(t->c, true) == 0, "finish");
        pos += n;
    }
    char msg[256];
    REQ(kvc_check(t->c, msg, sizeof msg) == 0, "kvc_check after filling: %s", msg);
    kvc_get_stats(t->c, &st);
    if (t->cfg.window == 0 && cap == (int64_t)t->lay.n_blocks * bs)
        REQ(st.blocks_used == st.blocks_total, "full pool: %d of %d used", st.blocks_used, st.blocks_total);
    REQ(kvc_seq_free(t->c, id) == 0, "free");
    cr_log_info("%s seed %llu: %d ops, %ld forwards (%ld rolled back, %ld FULL), %ld attaches (%ld hit tokens), "
                "%ld copies, %ld shifts (%ld not supported), %llu evictions, %llu cow copies",
                cfg->name, (unsigned long long)cfg->seed, cfg->ops, t->n_forward, t->n_rollback, t->n_full,
                t->n_attach, t->n_hit_tokens, t->n_copy, t->n_shift, t->n_not_supported,
                (unsigned long long)st.evictions, (unsigned long long)st.cow_copies);
    *ops_done += cfg->ops;
    free(e);
    free(slots);
    for (int32_t i = 0; i < MAX_SEQS; i++) {
        free(t->s[i].tok);
        free(t->s[i].vpos);
        free(t->sn.table[i]);
    }
    free(t->sn.refs);
    free(t->count);
    kvc_free(t->c);
    free(t);
}

#ifndef KVCT_FUZZ
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void run_set(const rcfg *cfgs, int n, const char *what) {
    long ops = 0;
    double t0 = now_s();
    for (int i = 0; i < n; i++) run_random(&cfgs[i], &ops);
    cr_log_info("%s: %ld random operations in %.2f s", what, ops, now_s() - t0);
}

/* f32, exact compare: the bulk of the operations, over block sizes, pool sizes and options. */
Test(KVCT_SUITE, f32) {
    static const rcfg cfgs[] = {
        /* name    seed ops   dtype          hd  bs  nblk seqs batch maxlen win prefix */
        {"f32", 1, 12000, KVC_DTYPE_F32, 4, 4, 48, 8, 24, 0, 0, true},
        {"f32", 2, 12000, KVC_DTYPE_F32, 4, 4, 24, 8, 16, 0, 0, true},
        {"f32", 3, 10000, KVC_DTYPE_F32, 4, 1, 64, 6, 12, 0, 0, true},
        {"f32", 4, 10000, KVC_DTYPE_F32, 4, 3, 40, 8, 20, 0, 0, true},
        {"f32", 5, 10000, KVC_DTYPE_F32, 4, 8, 20, 8, 32, 96, 0, true},
        {"f32-noprefix", 6, 8000, KVC_DTYPE_F32, 4, 4, 32, 8, 24, 0, 0, false},
        {"f32-window", 7, 10000, KVC_DTYPE_F32, 4, 4, 40, 8, 24, 0, 10, true},
        {"f32-window", 8, 10000, KVC_DTYPE_F32, 4, 2, 40, 8, 16, 0, 5, true},
        {"f32-window-noprefix", 9, 6000, KVC_DTYPE_F32, 4, 4, 24, 8, 16, 0, 7, false},
        {"f32-tight", 10, 6000, KVC_DTYPE_F32, 4, 4, 6, 4, 12, 0, 0, true},
    };
    run_set(cfgs, (int)(sizeof cfgs / sizeof cfgs[0]), "f32 set");
}

/* f16 with exactly representable values (the cache only moves bytes, so compares are exact). */
Test(KVCT_SUITE, f16) {
    static const rcfg cfgs[] = {
        {"f16", 11, 5000, KVC_DTYPE_F16, 8, 4, 32, 8, 24, 0, 0, true},
        {"f16", 12, 5000, KVC_DTYPE_F16, 8, 16, 8, 6, 40, 0, 0, true},
    };
    run_set(cfgs, (int)(sizeof cfgs / sizeof cfgs[0]), "f16 set");
}

/* q8_0 rows (34-byte blocks): the structure (row size, strides, moves) is right. */
Test(KVCT_SUITE, q8_0) {
    static const rcfg cfgs[] = {
        {"q8_0", 13, 2500, KVC_DTYPE_Q8_0, 32, 4, 24, 6, 16, 0, 0, true},
        {"q8_0", 14, 2500, KVC_DTYPE_Q8_0, 64, 4, 16, 6, 16, 0, 6, true},
    };
    run_set(cfgs, (int)(sizeof cfgs / sizeof cfgs[0]), "q8_0 set");
}
#endif /* KVCT_FUZZ */
