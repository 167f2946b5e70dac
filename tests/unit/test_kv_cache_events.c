/*
 * test_kv_cache_events.c: the prefix-cache event callback (kvc_set_event_cb). A mirror rebuilt from the events
 * alone (a multiset of chained hashes, recomputed here with XXH3 from the documented seed rule) must predict
 * exactly what kvc_prefix_match finds, under a random workload of prompts with shared prefixes, frees, tail
 * removals, prefix attaches and evictions from a small pool. Also: STORED carries the parent's hash and the
 * block's tokens, REMOVED follows eviction, CLEARED follows kvc_reset_prefix_cache.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cache/kv_cache.h"
#include "helper_kvc.h"

/* ---- the mirror: open-addressing hash -> count ------------------------------------------------------------ */
enum { MIRROR_CAP = 1 << 14 };
typedef struct mirror {
    uint64_t key[MIRROR_CAP];
    int32_t count[MIRROR_CAP];
    bool used[MIRROR_CAP];
    int64_t n_stored, n_removed, n_cleared;
    int32_t block_size;
    bool bad_parent; /* a STORED whose parent was not in the mirror */
} mirror;

static int32_t *mirror_slot(mirror *m, uint64_t h) {
    uint32_t i = (uint32_t)(h ^ (h >> 29)) & (MIRROR_CAP - 1);
    while (m->used[i] && m->key[i] != h) i = (i + 1) & (MIRROR_CAP - 1);
    if (!m->used[i]) {
        m->used[i] = true;
        m->key[i] = h;
        m->count[i] = 0;
    }
    return &m->count[i];
}

static uint64_t block_hash(uint64_t parent, const int32_t *tokens, int32_t bs) {
    return XXH3_64bits_withSeed(tokens, (size_t)bs * sizeof(int32_t), parent);
}

static void on_event(void *ctx, const kvc_event *ev) {
    mirror *m = ctx;
    switch (ev->kind) {
    case KVC_EVENT_STORED: {
        cr_assert_eq(ev->block_size, m->block_size);
        uint64_t seed = ev->has_parent ? ev->parent_hash : KVC_HASH_ROOT;
        cr_assert_eq(block_hash(seed, ev->tokens, ev->block_size), ev->hash, "hash rule");
        if (ev->has_parent && *mirror_slot(m, ev->parent_hash) <= 0) m->bad_parent = true;
        (*mirror_slot(m, ev->hash))++;
        m->n_stored++;
        break;
    }
    case KVC_EVENT_REMOVED: {
        int32_t *c = mirror_slot(m, ev->hash);
        cr_assert_gt(*c, 0, "REMOVED for a hash never stored");
        (*c)--;
        m->n_removed++;
        break;
    }
    case KVC_EVENT_CLEARED:
        memset(m->used, 0, sizeof m->used);
        m->n_cleared++;
        break;
    default: cr_assert_fail("unknown event kind %d", ev->kind);
    }
}

/* Tokens of tokens[0..n) the mirror says are cached: whole blocks along the hash chain. */
static int32_t mirror_match(mirror *m, const int32_t *tokens, int32_t n) {
    int32_t bs = m->block_size, i = 0;
    uint64_t h = KVC_HASH_ROOT;
    for (; (i + 1) * bs <= n; i++) {
        h = block_hash(h, tokens + (size_t)i * bs, bs);
        if (*mirror_slot(m, h) <= 0) break;
    }
    return i * bs;
}

static kvc_cache *make(int32_t n_blocks, int32_t bs, int32_t max_seqs, int32_t max_batch) {
    kvc_cache *c = kvct_make(n_blocks, bs, max_seqs, max_batch);
    cr_assert(c);
    return c;
}

/* A prompt from a few shared stems: stems make common prefixes of whole and partial blocks. */
static int32_t make_prompt(uint64_t *rng, int32_t *out, int32_t cap) {
    int32_t stem = kvct_range(rng, 4), stem_len = 8 + kvct_range(rng, 40);
    int32_t n = stem_len + kvct_range(rng, 30);
    if (n > cap) n = cap;
    for (int32_t i = 0; i < n; i++)
        out[i] = i < stem_len ? (stem * 131 + i * 7) % 50 : (int32_t)kvct_range(rng, 50);
    return n;
}

Test(kv_cache_events, mirror_predicts_prefix_match) {
    enum { BS = 4, NSEQ = 6, CAP = 96 };
    static mirror m;
    memset(&m, 0, sizeof m);
    m.block_size = BS;
    kvc_cache *c = make(48, BS, NSEQ, 256);
    kvc_set_event_cb(c, on_event, &m);
    uint64_t rng = 77;
    int32_t toks[NSEQ][CAP], len[NSEQ] = {0};
    bool live[NSEQ] = {false};
    int32_t probe[CAP];
    int checks = 0, hits = 0;
    for (int it = 0; it < 3000; it++) {
        int32_t s = kvct_range(&rng, NSEQ);
        int op = kvct_range(&rng, 10);
        if (!live[s]) {
            int32_t id = -1;
            if (kvc_seq_alloc(c, &id) != 0) continue;
            live[id] = true;
            len[id] = make_prompt(&rng, toks[id], CAP);
            int32_t nc = 0;
            cr_assert_eq(kvc_attach_prefix(c, id, toks[id], len[id] - 1, &nc), 0);
            int32_t done = nc;
            while (done < len[id]) {
                int32_t k = 1 + kvct_range(&rng, 12);
                if (k > len[id] - done) k = len[id] - done;
                if (kvct_append(c, id, toks[id], k) != 0) break;
                done += k;
            }
            len[id] = kvc_seq_len(c, id);
        } else if (op < 3) {
            cr_assert_eq(kvc_seq_free(c, s), 0);
            live[s] = false;
        } else if (op < 5 && len[s] > 0) {
            int32_t cut = kvct_range(&rng, len[s]);
            cr_assert_eq(kvc_remove(c, s, cut, INT32_MAX, NULL), 0);
            len[s] = cut;
        } else if (len[s] < CAP - 4) {
            int32_t k = 1 + kvct_range(&rng, 4);
            for (int32_t i = 0; i < k; i++) toks[s][len[s] + i] = (int32_t)kvct_range(&rng, 50);
            if (kvct_append(c, s, toks[s], k) == 0) len[s] += k;
        }
        /* probes: fresh prompts and the live sequences' own contents */
        int32_t n = make_prompt(&rng, probe, CAP);
        int32_t want = 0;
        cr_assert_eq(kvc_prefix_match(c, probe, n, &want), 0);
        cr_assert_eq(mirror_match(&m, probe, n), want, "iteration %d: mirror disagrees with the cache", it);
        hits += want > 0;
        checks++;
        for (int32_t q = 0; q < NSEQ; q++) {
            if (!live[q]) continue;
            cr_assert_eq(kvc_prefix_match(c, toks[q], len[q], &want), 0);
            cr_assert_eq(mirror_match(&m, toks[q], len[q]), want, "iteration %d seq %d", it, q);
            checks++;
        }
    }
    char msg[256];
    cr_assert_eq(kvc_check(c, msg, sizeof msg), 0, "%s", msg);
    cr_assert(!m.bad_parent, "a block was stored before its parent");
    kvc_stats st;
    kvc_get_stats(c, &st);
    cr_assert_gt(st.evictions, 0, "the workload must evict");
    cr_assert_geq(m.n_removed, (int64_t)st.evictions);
    cr_assert_gt(hits, 100, "the probes must hit the cache often (%d of %d)", hits, checks);
    kvc_free(c);
}

Test(kv_cache_events, stored_then_evicted_then_cleared) {
    enum { BS = 4 };
    static mirror m;
    memset(&m, 0, sizeof m);
    m.block_size = BS;
    kvc_cache *c = make(3, BS, 2, 64);
    kvc_set_event_cb(c, on_event, &m);
    int32_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    int32_t s = -1;
    cr_assert_eq(kvc_seq_alloc(c, &s), 0);
    cr_assert_eq(kvct_append(c, s, a, 9), 0); /* 2 full blocks stored, the third is partial */
    cr_assert_eq(m.n_stored, 2);
    cr_assert_eq(mirror_match(&m, a, 12), 8);
    cr_assert_eq(kvc_reset_prefix_cache(c), KVC_ERR_STATE, "blocks in use");
    cr_assert_eq(kvc_seq_free(c, s), 0);
    /* a different prompt needs all 3 blocks: both cached blocks are evicted */
    int32_t b[12] = {21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
    cr_assert_eq(kvc_seq_alloc(c, &s), 0);
    cr_assert_eq(kvct_append(c, s, b, 12), 0);
    cr_assert_eq(m.n_removed, 2);
    cr_assert_eq(mirror_match(&m, a, 12), 0);
    cr_assert_eq(mirror_match(&m, b, 12), 12);
    cr_assert_eq(kvc_seq_free(c, s), 0);
    cr_assert_eq(kvc_reset_prefix_cache(c), 0);
    cr_assert_eq(m.n_cleared, 1);
    cr_assert_eq(mirror_match(&m, b, 12), 0);
    int32_t got = -1;
    cr_assert_eq(kvc_prefix_match(c, b, 12, &got), 0);
    cr_assert_eq(got, 0);
    char msg[256];
    cr_assert_eq(kvc_check(c, msg, sizeof msg), 0, "%s", msg);
    kvc_set_event_cb(c, NULL, NULL);
    cr_assert_eq(kvc_seq_alloc(c, &s), 0);
    cr_assert_eq(kvct_append(c, s, a, 12), 0);
    cr_assert_eq(m.n_stored, 5, "no events after the callback is cleared");
    cr_assert_eq(kvc_reset_prefix_cache(NULL), KVC_ERR_INVALID);
    kvc_free(c);
}
