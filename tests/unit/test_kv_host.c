/* test_kv_host.c: the host-memory tier below the KV pool (cache/kv_host.h) against a simple model of what it must
 * hold: random prompts with shared heads prefilled through a small pool (which evicts), and random lookups that
 * continue a sequence from the pool, then the host tier. The model is an LRU list of block identities driven by
 * the same cache events the tier sees; after every operation the tier must hold exactly the model's blocks, every
 * load must load exactly the blocks the model predicts, and every loaded row must be its token's (helper_kvc.h rows
 * are a pure function of token and position). Also: the device-neutral copies (kvh_io), a failed copy, the spill
 * into the disk tier, the events (medium "CPU" in the server) and bad arguments. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/kv_host.h"
#include "cache/kv_tier.h"
#include "cache/kvc_internal.h"
#include "helper_kvc.h"
#include "helper_tmpdir.h"

enum { BS = 4, NB = 32, MAXP = 80, NSTEM = 3 };

/* ---- the model ------------------------------------------------------------------------------------------------- */
typedef struct mblock {
    uint64_t hash, parent;
    bool has_parent;
    int32_t tok[BS];
} mblock;

typedef struct model {
    mblock v[512]; /* v[0] least recently used */
    int32_t n, cap;
    /* a load in progress: the prompt, its chain hashes and the next block expected from the host */
    bool loading;
    const int32_t *ltok;
    uint64_t lh[MAXP / BS + 1];
    int32_t lk, lnb, lhits;
    bool lexpect;          /* block lk was held when the tier looked for it */
    kvh_tier *h;
} model;

static int32_t mfind(const model *m, uint64_t hash, bool hp, uint64_t parent, const int32_t *tok) {
    for (int32_t i = 0; i < m->n; i++)
        if (m->v[i].hash == hash && m->v[i].has_parent == hp && (!hp || m->v[i].parent == parent) &&
            !memcmp(m->v[i].tok, tok, sizeof m->v[i].tok))
            return i;
    return -1;
}

static void mtouch(model *m, int32_t i) {
    mblock b = m->v[i];
    memmove(m->v + i, m->v + i + 1, (size_t)(m->n - i - 1) * sizeof b);
    m->v[m->n - 1] = b;
}

static int32_t mfind_k(const model *m, int32_t k) {
    return mfind(m, m->lh[k], k > 0, k > 0 ? m->lh[k - 1] : 0, m->ltok + k * BS);
}

/* The tier starts a load: every held block of the run from lk on becomes most recently used, in order. */
static void mstart(model *m) {
    for (int32_t k = m->lk, i; k < m->lnb && (i = mfind_k(m, k)) >= 0; k++) mtouch(m, i);
}

/* The tier looks for block lk of the prompt being loaded. */
static void mlook(model *m) { m->lexpect = m->lk < m->lnb && mfind_k(m, m->lk) >= 0; }

static void on_event(void *ctx, const kvc_event *ev) {
    model *m = ctx;
    if (ev->kind == KVC_EVENT_REMOVED && ev->evicted) {
        int32_t i = mfind(m, ev->hash, ev->has_parent, ev->parent_hash, ev->tokens);
        if (i >= 0) mtouch(m, i);
        else {
            if (m->n == m->cap) { /* the least recently used block leaves, never the one being placed */
                int32_t v = 0;
                if (m->loading && m->lexpect && v == mfind_k(m, m->lk)) v = 1;
                memmove(m->v + v, m->v + v + 1, (size_t)(m->n - v - 1) * sizeof m->v[0]);
                m->n--;
            }
            mblock *b = &m->v[m->n++];
            b->hash = ev->hash;
            b->has_parent = ev->has_parent;
            b->parent = ev->has_parent ? ev->parent_hash : 0;
            memcpy(b->tok, ev->tokens, sizeof b->tok);
        }
    }
    kvh_on_cache_event(m->h, ev);
    if (ev->kind == KVC_EVENT_STORED && m->loading && m->lk < m->lnb && ev->hash == m->lh[m->lk]) {
        cr_assert(m->lexpect, "block %d was loaded from the host tier, which should not hold it", m->lk);
        m->lhits++;
        m->lk++;
        mlook(m);
    }
}

static void check_same(model *m) {
    kvh_stats st;
    kvh_get_stats(m->h, &st);
    cr_assert_eq(st.blocks, (uint64_t)m->n, "the tier holds %llu blocks, the model %d", (unsigned long long)st.blocks,
                 m->n);
    for (int32_t i = 0; i < m->n; i++)
        cr_assert(kvh_holds(m->h, m->v[i].hash, m->v[i].has_parent, m->v[i].parent, m->v[i].tok),
                  "the tier lost block %d of the model", i);
}

/* ---- helpers ------------------------------------------------------------------------------------------------------ */
static void prefill(kvc_cache *c, const int32_t *tokens, int32_t n, uint64_t *rng) {
    int32_t seq;
    cr_assert_eq(kvc_seq_alloc(c, &seq), KVC_OK);
    for (int32_t at = 0; at < n;) {
        int32_t k = 1 + kvct_range(rng, 24);
        if (k > n - at) k = n - at;
        cr_assert_eq(kvct_append(c, seq, tokens, k), KVC_OK);
        at += k;
    }
    cr_assert_eq(kvc_seq_free(c, seq), KVC_OK);
}

/* Attaches tokens[0..n) from the pool, then loads from the host tier, checking the model's prediction, the rows and
 * the pool's invariants; returns the tokens loaded from the host. */
static int32_t lookup(kvc_cache *c, model *m, const int32_t *tokens, int32_t n) {
    int32_t seq, have = 0, got = -1;
    cr_assert_eq(kvc_seq_alloc(c, &seq), KVC_OK);
    cr_assert_eq(kvc_attach_prefix(c, seq, tokens, n, &have), KVC_OK);
    m->ltok = tokens;
    m->lnb = n / BS;
    uint64_t p = KVC_HASH_ROOT;
    for (int32_t i = 0; i < m->lnb; i++) p = m->lh[i] = chain_hash(c, p, tokens + i * BS);
    m->lk = have / BS;
    m->lhits = 0;
    m->loading = true;
    kvh_stats before;
    kvh_get_stats(m->h, &before);
    if (before.blocks > 0 && m->lk < m->lnb) {
        mstart(m);
        mlook(m);
    } else {
        m->lexpect = false;
    }
    cr_assert_eq(kvh_load(m->h, seq, tokens, n, have, NB, &got), KVS_OK);
    m->loading = false;
    cr_assert_eq(got, m->lhits * BS);
    cr_assert(!m->lexpect || kvc_blocks_available(c) == 0, "the load stopped at block %d, which the tier holds", m->lk);
    cr_assert_eq(kvc_seq_len(c, seq), have + got);
    kvc_layout lay;
    kvc_get_layout(c, &lay);
    const int32_t *blocks;
    int32_t nbk, len;
    cr_assert_eq(kvc_block_table(c, seq, &blocks, &nbk, &len), KVC_OK);
    for (int32_t pos = 0; pos < len; pos++) {
        int bad = kvct_check_slot(&lay, blocks[pos / BS] * BS + pos % BS, tokens[pos], pos);
        cr_assert_eq(bad, 0, "position %d (of %d, %d from the host) holds a wrong row", pos, len, got);
    }
    char msg[256];
    cr_assert_eq(kvc_check(c, msg, sizeof msg), KVC_OK, "%s", msg);
    cr_assert_eq(kvc_seq_free(c, seq), KVC_OK);
    return got;
}

static void make_prompts(uint64_t *rng, int32_t np, int32_t (*pr)[MAXP], int32_t *len) {
    int32_t stems[NSTEM][MAXP];
    for (int s = 0; s < NSTEM; s++)
        for (int i = 0; i < MAXP; i++) stems[s][i] = kvct_range(rng, 40);
    for (int32_t i = 0; i < np; i++) {
        int32_t head = kvct_range(rng, MAXP), s = kvct_range(rng, NSTEM);
        len[i] = 1 + kvct_range(rng, MAXP - 1);
        for (int32_t j = 0; j < len[i]; j++) pr[i][j] = j < head ? stems[s][j] : kvct_range(rng, 40);
    }
}

static size_t block_bytes(kvc_cache *c) {
    kvc_layout l;
    kvc_get_layout(c, &l);
    return 2 * (size_t)l.n_layer * l.block_stride;
}

/* ---- the randomized differential test ----------------------------------------------------------------------------- */
Test(kv_host, random_stores_evictions_and_loads_match_the_model) {
    uint64_t total_hits = 0, total_evicted = 0;
    for (uint64_t seed = 1; seed <= 40; seed++) {
        uint64_t rng = seed * 7919;
        kvc_cache *c = kvct_make(NB, BS, 4, 256);
        cr_assert_not_null(c);
        static model m;
        memset(&m, 0, sizeof m);
        m.cap = 2 + kvct_range(&rng, 60);
        kvh_params p = {.max_bytes = (uint64_t)m.cap * block_bytes(c) + kvct_range(&rng, (int32_t)block_bytes(c))};
        cr_assert_eq(kvh_open(&p, c, &m.h), KVS_OK);
        kvc_set_event_cb(c, on_event, &m);
        int32_t pr[16][MAXP], len[16];
        make_prompts(&rng, 16, pr, len);
        for (int op = 0; op < 120; op++) {
            int32_t i = kvct_range(&rng, 16);
            if (kvct_range(&rng, 3) == 0) prefill(c, pr[i], len[i], &rng);
            else total_hits += (uint64_t)lookup(c, &m, pr[i], len[i]);
            check_same(&m);
        }
        kvh_stats st;
        kvh_get_stats(m.h, &st);
        cr_assert_eq(st.capacity_blocks, (uint64_t)m.cap);
        cr_assert_eq(st.copy_errors, 0);
        total_evicted += st.evicted;
        kvc_set_event_cb(c, NULL, NULL);
        kvh_close(m.h);
        kvc_free(c);
    }
    cr_assert_gt(total_hits, 0, "no lookup was served from the host tier: the test tests nothing");
    cr_assert_gt(total_evicted, 0, "the tier never had to make room");
}

/* ---- device-neutral copies ------------------------------------------------------------------------------------- */
typedef struct xio {
    kvc_layout lay;
    int outs, ins, fail_in;
} xio;

/* A "device" whose bytes reach the tier inverted: the tier must only move them through the callbacks. */
static int x_out(void *ctx, int32_t block, void *dst) {
    xio *x = ctx;
    x->outs++;
    for (int32_t l = 0; l < 2 * x->lay.n_layer; l++) {
        const uint8_t *s = (const uint8_t *)x->lay.base + (size_t)l * x->lay.layer_bytes + (size_t)block * x->lay.block_stride;
        uint8_t *d = (uint8_t *)dst + (size_t)l * x->lay.block_stride;
        for (size_t i = 0; i < x->lay.block_stride; i++) d[i] = (uint8_t)~s[i];
    }
    return 0;
}

static int x_in(void *ctx, int32_t block, const void *src) {
    xio *x = ctx;
    x->ins++;
    if (x->fail_in) return -1;
    for (int32_t l = 0; l < 2 * x->lay.n_layer; l++) {
        uint8_t *d = (uint8_t *)x->lay.base + (size_t)l * x->lay.layer_bytes + (size_t)block * x->lay.block_stride;
        const uint8_t *s = (const uint8_t *)src + (size_t)l * x->lay.block_stride;
        for (size_t i = 0; i < x->lay.block_stride; i++) d[i] = (uint8_t)~s[i];
    }
    return 0;
}

static void fill_pool_with_others(kvc_cache *c, uint64_t *rng) {
    int32_t other[MAXP];
    for (int r = 0; r < 4; r++) {
        for (int32_t j = 0; j < MAXP; j++) other[j] = 1000 + r * 100 + j;
        prefill(c, other, MAXP, rng);
    }
}

Test(kv_host, copies_go_through_the_io_callbacks_and_a_failed_copy_places_nothing) {
    kvc_cache *c = kvct_make(NB, BS, 4, 256);
    xio x = {0};
    kvc_get_layout(c, &x.lay);
    kvh_params p = {.max_bytes = 128 * block_bytes(c), .io = {x_out, x_in, &x, block_bytes(c)}};
    kvh_tier *h;
    cr_assert_eq(kvh_open(&p, c, &h), KVS_OK);
    kvc_set_event_cb(c, kvh_on_cache_event, h);
    uint64_t rng = 5;
    int32_t a[MAXP];
    for (int32_t j = 0; j < MAXP; j++) a[j] = j % 37;
    prefill(c, a, MAXP, &rng);
    fill_pool_with_others(c, &rng); /* a's blocks leave the pool for the host */
    cr_assert_gt(x.outs, 0);
    int32_t seq, have, got;
    cr_assert_eq(kvc_seq_alloc(c, &seq), KVC_OK);
    cr_assert_eq(kvc_attach_prefix(c, seq, a, MAXP - 1, &have), KVC_OK);
    cr_assert_eq(have, 0);
    x.fail_in = 1;
    cr_assert_eq(kvh_load(h, seq, a, MAXP - 1, 0, NB, &got), KVS_ERR_IO);
    cr_assert_eq(got, 0);
    cr_assert_eq(kvc_seq_len(c, seq), 0);
    x.fail_in = 0;
    cr_assert_eq(kvh_load(h, seq, a, MAXP - 1, 0, NB, &got), KVS_OK);
    cr_assert_eq(got, (MAXP - 1) / BS * BS);
    const int32_t *blocks;
    int32_t nbk, len;
    cr_assert_eq(kvc_block_table(c, seq, &blocks, &nbk, &len), KVC_OK);
    for (int32_t pos = 0; pos < len; pos++)
        cr_assert_eq(kvct_check_slot(&x.lay, blocks[pos / BS] * BS + pos % BS, a[pos], pos), 0);
    kvh_stats st;
    kvh_get_stats(h, &st);
    cr_assert_eq(st.copy_errors, 1);
    cr_assert_eq(st.hit_tokens, (uint64_t)got);
    cr_assert_eq(kvc_seq_free(c, seq), KVC_OK);
    kvc_set_event_cb(c, NULL, NULL);
    kvh_close(h);
    kvc_free(c);
}

/* ---- spill into the disk tier ----------------------------------------------------------------------------------- */
static void spill_to_disk(void *ctx, const kvh_block *b) {
    kvt_save(ctx, b->hash, b->has_parent, b->parent_hash, b->tokens, b->data, b->bytes);
}

static char dir[256];

static void rm_dir(void) { tmpt_rm_flat(dir); }

static void quiet(void *ctx, const char *msg) {
    (void)ctx;
    (void)msg;
}

Test(kv_host, blocks_leaving_the_host_tier_go_to_disk) {
    snprintf(dir, sizeof dir, "/tmp/kvs-host-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    kvc_cache *c = kvct_make(NB, BS, 4, 256);
    kvt_params tp = {.dir = dir, .max_bytes = 1 << 30, .warn = quiet};
    kvt_tier *t;
    cr_assert_eq(kvt_open(&tp, c, &t), KVS_OK);
    /* only the host tier sees the cache's events: the disk gets what the host tier spills, nothing else */
    kvh_params p = {.max_bytes = 4 * block_bytes(c), .spill = spill_to_disk, .spill_ctx = t};
    kvh_tier *h;
    cr_assert_eq(kvh_open(&p, c, &h), KVS_OK);
    kvc_set_event_cb(c, kvh_on_cache_event, h);
    uint64_t rng = 9;
    int32_t a[MAXP];
    for (int32_t j = 0; j < MAXP; j++) a[j] = 3 + j % 29;
    prefill(c, a, MAXP, &rng);
    fill_pool_with_others(c, &rng); /* a: pool -> host (4 blocks) -> disk */
    kvt_step_end(t);
    kvt_flush(t);
    kvh_stats hs;
    kvh_get_stats(h, &hs);
    cr_assert_gt(hs.spilled, 0);
    kvt_stats ts;
    kvt_get_stats(t, &ts);
    cr_assert_eq(ts.blocks_written, hs.spilled, "every spilled block is written once (%llu of %llu)",
                 (unsigned long long)ts.blocks_written, (unsigned long long)hs.spilled);
    kvc_set_event_cb(c, NULL, NULL);
    kvh_close(h);
    kvt_close(t);
    kvc_free(c);
    /* a new process: its pool and host tier are empty, a's blocks come from the files */
    c = kvct_make(NB, BS, 4, 256);
    cr_assert_eq(kvt_open(&tp, c, &t), KVS_OK);
    int32_t seq, got;
    cr_assert_eq(kvc_seq_alloc(c, &seq), KVC_OK);
    cr_assert_eq(kvt_load(t, seq, a, MAXP - 1, 0, NB, &got), KVS_OK);
    cr_assert_eq(got, (MAXP - 1) / BS * BS, "a's blocks all went pool -> host -> disk: %d loaded", got);
    kvc_layout lay;
    kvc_get_layout(c, &lay);
    const int32_t *blocks;
    int32_t nbk, len;
    cr_assert_eq(kvc_block_table(c, seq, &blocks, &nbk, &len), KVC_OK);
    for (int32_t pos = 0; pos < len; pos++)
        cr_assert_eq(kvct_check_slot(&lay, blocks[pos / BS] * BS + pos % BS, a[pos], pos), 0);
    cr_assert_eq(kvc_seq_free(c, seq), KVC_OK);
    kvt_close(t);
    kvc_free(c);
    rm_dir();
}

/* ---- events ------------------------------------------------------------------------------------------------------ */
typedef struct evlog {
    int32_t held;     /* STORED - REMOVED */
    int stored, removed;
} evlog;

static void count_ev(void *ctx, const kvc_event *ev) {
    evlog *l = ctx;
    cr_assert_eq(ev->block, -1);
    if (ev->kind == KVC_EVENT_STORED) {
        cr_assert_not_null(ev->tokens);
        l->held++;
        l->stored++;
    } else if (ev->kind == KVC_EVENT_REMOVED) {
        l->held--;
        l->removed++;
    }
}

Test(kv_host, events_mirror_what_the_tier_holds) {
    kvc_cache *c = kvct_make(NB, BS, 4, 256);
    kvh_params p = {.max_bytes = 6 * block_bytes(c)};
    kvh_tier *h;
    cr_assert_eq(kvh_open(&p, c, &h), KVS_OK);
    kvc_set_event_cb(c, kvh_on_cache_event, h);
    uint64_t rng = 3;
    int32_t a[MAXP];
    for (int32_t j = 0; j < MAXP; j++) a[j] = j;
    prefill(c, a, MAXP, &rng);
    fill_pool_with_others(c, &rng);
    evlog l = {0};
    kvh_events_enable(h); /* announces what is held */
    kvh_drain_events(h, count_ev, &l);
    cr_assert_eq(l.stored, 6);
    fill_pool_with_others(c, &rng);
    prefill(c, a, MAXP, &rng);
    fill_pool_with_others(c, &rng);
    kvh_drain_events(h, count_ev, &l);
    kvh_stats st;
    kvh_get_stats(h, &st);
    cr_assert_gt(l.removed, 0);
    cr_assert_eq((uint64_t)l.held, st.blocks);
    cr_assert_eq(st.events_dropped, 0);
    kvc_set_event_cb(c, NULL, NULL);
    kvh_close(h);
    kvc_free(c);
}

Test(kv_host, bad_arguments) {
    kvc_cache *c = kvct_make(NB, BS, 4, 256);
    kvh_tier *h = (kvh_tier *)1;
    kvh_params p = {.max_bytes = block_bytes(c) - 1};
    cr_assert_eq(kvh_open(&p, c, &h), KVS_ERR_INVALID);
    cr_assert_null(h);
    cr_assert_eq(kvh_open(NULL, c, &h), KVS_ERR_INVALID);
    p.max_bytes = 4 * block_bytes(c);
    p.io.copy_out = x_out; /* one callback without the other */
    cr_assert_eq(kvh_open(&p, c, &h), KVS_ERR_INVALID);
    p.io.copy_out = NULL;
    cr_assert_eq(kvh_open(&p, c, &h), KVS_OK);
    int32_t seq, got = 7, tok[8] = {0};
    cr_assert_eq(kvc_seq_alloc(c, &seq), KVC_OK);
    cr_assert_eq(kvh_load(h, seq, tok, 8, 1, 4, &got), KVS_ERR_INVALID); /* have not a whole block */
    cr_assert_eq(got, 0);
    cr_assert_eq(kvh_load(h, seq, tok, 8, 4, 4, &got), KVS_ERR_INVALID); /* have is not seq's length */
    cr_assert_eq(kvh_load(h, seq, tok, 2, 4, 4, &got), KVS_ERR_INVALID); /* n < have */
    cr_assert_eq(kvh_load(NULL, seq, tok, 8, 0, 4, &got), KVS_ERR_INVALID);
    cr_assert_eq(kvh_load(h, seq, tok, 8, 0, 4, &got), KVS_OK); /* nothing held */
    cr_assert_eq(got, 0);
    kvh_stats st;
    kvh_get_stats(NULL, &st);
    cr_assert_eq(st.blocks, 0);
    kvh_close(NULL);
    kvh_close(h);
    kvc_free(c);
}
