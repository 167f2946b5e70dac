/*
 * test_kv_cache_prefix.c: memory efficiency of the paged pool under a mixed workload, and automatic prefix
 * caching: hits for a repeated prompt, kvc_prefix_match, LRU eviction order (least recently used first,
 * children before parents), eviction only under pressure, and deduplication of identical blocks.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kv_cache.h"
#include "helper_kvc.h"

static void check(const kvc_cache *c) {
    char msg[256];
    int rc = kvc_check(c, msg, sizeof msg);
    cr_assert_eq(rc, KVC_OK, "kvc_check: %s", msg);
}

static kvc_cache *make(int32_t n_blocks, int32_t block_size, int32_t max_seqs, int32_t max_batch) {
    kvc_cache *c = kvct_make(n_blocks, block_size, max_seqs, max_batch);
    cr_assert(c);
    return c;
}

/* Appends tokens[len..len+n) of a sequence (whose tokens array holds its whole content) in one batch. */
static int append(kvc_cache *c, int32_t seq, const int32_t *tokens, int32_t n) {
    int rc = kvct_append(c, seq, tokens, n);
    cr_assert_neq(rc, KVC_ERR_NOMEM);
    return rc;
}

static void expect_data(kvc_cache *c, int32_t seq, const int32_t *tokens) {
    kvc_layout l;
    kvc_get_layout(c, &l);
    const int32_t *tab;
    int32_t len;
    cr_assert_eq(kvc_block_table(c, seq, &tab, NULL, &len), 0);
    for (int32_t pos = 0; pos < len; pos++)
        cr_assert_eq(kvct_check_slot(&l, tab[pos / l.block_size] * l.block_size + pos % l.block_size, tokens[pos],
                                     pos),
                     0, "seq %d pos %d", seq, pos);
}

static int32_t alloc_seq(kvc_cache *c) {
    int32_t s = -1;
    cr_assert_eq(kvc_seq_alloc(c, &s), 0);
    return s;
}

/* 64 sequences of 1..2000 tokens grown through mixed batches (prefill chunks and decode tokens): the pool
 * wastes less than one block per live sequence. */
Test(kv_cache_prefix, memory_efficiency) {
    enum { NSEQ = 64, BS = 16, MAXLEN = 2000, BATCH = 512 };
    kvc_params p;
    kvc_params_default(&p);
    p.n_layer = 1;
    p.n_kv_head = 1;
    p.head_dim = 4;
    p.dtype = KVC_DTYPE_F32;
    p.block_size = BS;
    p.n_blocks = NSEQ * (MAXLEN / BS + 1);
    p.max_seqs = NSEQ;
    p.max_batch_tokens = BATCH;
    kvc_cache *c = NULL;
    cr_assert_eq(kvc_create(&p, &c), 0);
    uint64_t rng = 4242;
    int32_t target[NSEQ], len[NSEQ] = {0};
    int64_t want = 0;
    for (int i = 0; i < NSEQ; i++) {
        int32_t id = alloc_seq(c);
        cr_assert_eq(id, i);
        target[i] = 1 + kvct_range(&rng, MAXLEN);
        want += target[i];
    }
    kvc_entry *e = malloc(BATCH * sizeof *e);
    int32_t *slots = malloc(BATCH * sizeof *slots);
    cr_assert(e && slots);
    double worst_pct = 0;
    int64_t worst_waste = 0;
    int batches = 0;
    for (;;) {
        /* a batch: every unfinished sequence gets a decode token or a prefill chunk, until BATCH is full */
        int32_t n = 0;
        for (int i = 0; i < NSEQ && n < BATCH; i++) {
            int32_t left = target[i] - len[i];
            if (left <= 0) continue;
            int32_t k = kvct_range(&rng, 3) == 0 ? 1 + kvct_range(&rng, 200) : 1;
            if (k > left) k = left;
            if (k > BATCH - n) k = BATCH - n;
            for (int32_t j = 0; j < k; j++) e[n++] = (kvc_entry){i, len[i] + j, (i * 7919 + len[i] + j) % 32000};
            len[i] += k;
        }
        if (n == 0) break;
        cr_assert_eq(kvc_start_forward(c, e, n, slots), 0);
        cr_assert_eq(kvc_finish_forward(c, true), 0);
        batches++;
        kvc_stats st;
        kvc_get_stats(c, &st);
        int64_t waste = (int64_t)st.blocks_used * BS - st.tokens_live;
        cr_assert_geq(waste, 0);
        cr_assert_lt(waste, (int64_t)st.seqs_live * BS, "waste %lld tokens with %d sequences", (long long)waste,
                     st.seqs_live);
        double pct = 100.0 * (double)waste / ((double)st.blocks_used * BS);
        if (pct > worst_pct && st.tokens_live > want / 2) worst_pct = pct;
        if (waste > worst_waste) worst_waste = waste;
    }
    check(c);
    kvc_stats st;
    kvc_get_stats(c, &st);
    cr_assert_eq(st.tokens_live, want);
    int64_t waste = (int64_t)st.blocks_used * BS - st.tokens_live;
    double pct = 100.0 * (double)waste / ((double)st.blocks_used * BS);
    cr_assert_lt(pct, 4.0);
    cr_log_info("memory efficiency: %d sequences, %lld tokens in %d blocks of %d (%d batches): %lld slots unused "
                "= %.2f%% of the allocated slots (%.1f per sequence; worst during growth after half: %.2f%%, "
                "max %lld slots)",
                NSEQ, (long long)st.tokens_live, st.blocks_used, BS, batches, (long long)waste, pct,
                (double)waste / NSEQ, worst_pct, (long long)worst_waste);
    /* freeing half the sequences returns exactly their blocks */
    for (int i = 0; i < NSEQ; i += 2) cr_assert_eq(kvc_seq_free(c, i), 0);
    kvc_get_stats(c, &st);
    int32_t blocks = 0;
    for (int i = 1; i < NSEQ; i += 2) blocks += (target[i] + BS - 1) / BS;
    cr_assert_eq(st.blocks_used, blocks);
    check(c);
    free(e);
    free(slots);
    kvc_free(c);
}

/* Two sequences with the same prompt: the second attaches every full block the first computed. */
Test(kv_cache_prefix, repeated_prompt_hits) {
    enum { BS = 16, PROMPT = 100 };
    kvc_cache *c = make(32, BS, 4, 256);
    int32_t prompt[PROMPT + 8];
    for (int i = 0; i < PROMPT + 8; i++) prompt[i] = 1000 + i * 3;
    int32_t a = alloc_seq(c), b = alloc_seq(c);
    int32_t n_cached = -1;
    cr_assert_eq(kvc_attach_prefix(c, a, prompt, PROMPT - 1, &n_cached), 0);
    cr_assert_eq(n_cached, 0, "cold cache");
    cr_assert_eq(append(c, a, prompt, PROMPT), 0);
    int32_t m;
    cr_assert_eq(kvc_prefix_match(c, prompt, PROMPT, &m), 0);
    cr_assert_eq(m, 96);
    cr_assert_eq(kvc_prefix_match(c, prompt, 95, &m), 0);
    cr_assert_eq(m, 80);
    int32_t other[PROMPT];
    memcpy(other, prompt, sizeof other);
    other[50] = 7; /* differs in block 3 */
    cr_assert_eq(kvc_prefix_match(c, other, PROMPT, &m), 0);
    cr_assert_eq(m, 48);
    other[50] = prompt[50];
    other[0] = 7; /* the first block differs: nothing after it can match either */
    cr_assert_eq(kvc_prefix_match(c, other, PROMPT, &m), 0);
    cr_assert_eq(m, 0);
    kvc_stats st0, st1;
    kvc_get_stats(c, &st0);
    cr_assert_eq(kvc_attach_prefix(c, b, prompt, PROMPT - 1, &n_cached), 0);
    cr_assert_eq(n_cached, 96);
    kvc_get_stats(c, &st1);
    cr_assert_eq(st1.prefix_query_tokens - st0.prefix_query_tokens, PROMPT - 1);
    cr_assert_eq(st1.prefix_hit_tokens - st0.prefix_hit_tokens, 96);
    cr_assert_eq(st1.blocks_used, st0.blocks_used, "attaching allocates nothing");
    cr_log_info("repeated prompt: %d of %d prompt tokens attached from the cache", n_cached, PROMPT - 1);
    const int32_t *ta, *tb;
    kvc_block_table(c, a, &ta, NULL, NULL);
    kvc_block_table(c, b, &tb, NULL, NULL);
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(ta[i], tb[i]);
        cr_assert_eq(kvc_block_refcount(c, ta[i]), 2);
    }
    cr_assert_eq(kvc_seq_len(c, b), 96);
    expect_data(c, b, prompt);
    /* b computes the rest of the prompt itself; its block 6 is partial and private */
    cr_assert_eq(append(c, b, prompt, 4), 0);
    expect_data(c, b, prompt);
    kvc_block_table(c, b, &tb, NULL, NULL);
    cr_assert_neq(tb[6], ta[6]);
    check(c);
    /* both go: the 6 full blocks stay cached, the partial ones are freed */
    cr_assert_eq(kvc_seq_free(c, a), 0);
    cr_assert_eq(kvc_seq_free(c, b), 0);
    kvc_get_stats(c, &st0);
    cr_assert_eq(st0.blocks_used, 0);
    cr_assert_eq(st0.blocks_cached, 6);
    cr_assert_eq(st0.blocks_free, 26);
    cr_assert_eq(kvc_blocks_available(c), 32);
    /* a third request with the same prompt plus more text attaches them again */
    int32_t d = alloc_seq(c);
    cr_assert_eq(kvc_attach_prefix(c, d, prompt, PROMPT + 7, &n_cached), 0);
    cr_assert_eq(n_cached, 96);
    kvc_get_stats(c, &st0);
    cr_assert_eq(st0.blocks_cached, 0);
    cr_assert_eq(st0.blocks_used, 6);
    expect_data(c, d, prompt);
    check(c);
    kvc_free(c);
}

/* Identical prompts computed at the same time converge on one set of blocks when they are published. */
Test(kv_cache_prefix, concurrent_identical_prompts_dedup) {
    enum { BS = 4 };
    kvc_cache *c = make(16, BS, 4, 64);
    int32_t prompt[10];
    for (int i = 0; i < 10; i++) prompt[i] = 50 + i;
    int32_t a = alloc_seq(c), b = alloc_seq(c);
    kvc_entry e[20];
    int32_t slots[20];
    for (int i = 0; i < 10; i++) {
        e[2 * i] = (kvc_entry){a, i, prompt[i]};
        e[2 * i + 1] = (kvc_entry){b, i, prompt[i]};
    }
    cr_assert_eq(kvc_start_forward(c, e, 20, slots), 0);
    kvc_stats st;
    kvc_get_stats(c, &st);
    cr_assert_eq(st.blocks_used, 6, "while pending each has its own blocks");
    kvc_layout l;
    kvc_get_layout(c, &l);
    for (int i = 0; i < 20; i++) kvct_write_slot(&l, slots[i], e[i].token, e[i].pos);
    cr_assert_eq(kvc_finish_forward(c, true), 0);
    kvc_get_stats(c, &st);
    cr_assert_eq(st.blocks_used, 4, "the two full blocks are shared after publishing");
    const int32_t *ta, *tb;
    kvc_block_table(c, a, &ta, NULL, NULL);
    kvc_block_table(c, b, &tb, NULL, NULL);
    cr_assert_eq(ta[0], tb[0]);
    cr_assert_eq(ta[1], tb[1]);
    cr_assert_neq(ta[2], tb[2]);
    expect_data(c, a, prompt);
    expect_data(c, b, prompt);
    check(c);
    kvc_free(c);
}

/* Three cached prompts; the pool evicts the least recently used one first, its last block before its first,
 * and only when no free block is left. */
Test(kv_cache_prefix, lru_eviction_order) {
    enum { BS = 4, NB = 10 };
    kvc_cache *c = make(NB, BS, 4, 64);
    int32_t P[3][8];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 8; i++) P[k][i] = 100 * (k + 1) + i;
    /* compute and release P0, P1, P2 in that order: 6 cached blocks, 4 free */
    for (int k = 0; k < 3; k++) {
        int32_t s = alloc_seq(c);
        cr_assert_eq(append(c, s, P[k], 8), 0);
        cr_assert_eq(kvc_seq_free(c, s), 0);
    }
    kvc_stats st;
    kvc_get_stats(c, &st);
    cr_assert_eq(st.blocks_cached, 6);
    cr_assert_eq(st.blocks_free, 4);
    /* touch P0 again: attach it and release it, so P1 becomes the least recently used */
    int32_t s = alloc_seq(c), n_cached;
    cr_assert_eq(kvc_attach_prefix(c, s, P[0], 8, &n_cached), 0);
    cr_assert_eq(n_cached, 8);
    cr_assert_eq(kvc_seq_free(c, s), 0);
    int32_t m;
#define MATCH(k) (kvc_prefix_match(c, P[k], 8, &m), m)
    cr_assert_eq(MATCH(0), 8);
    cr_assert_eq(MATCH(1), 8);
    cr_assert_eq(MATCH(2), 8);
    /* a new sequence takes the 4 free blocks first: nothing is evicted */
    int32_t fresh[64];
    for (int i = 0; i < 64; i++) fresh[i] = 9000 + i;
    int32_t x = alloc_seq(c);
    cr_assert_eq(append(c, x, fresh, 16), 0);
    kvc_get_stats(c, &st);
    cr_assert_eq(st.evictions, 0);
    cr_assert_eq(st.blocks_cached, 6);
    cr_assert_eq(st.blocks_free, 0);
    cr_assert_eq(MATCH(1), 8);
    /* one more block: P1's last block goes (P1 is least recently used; children before parents) */
    cr_assert_eq(append(c, x, fresh, 1), 0);
    kvc_get_stats(c, &st);
    cr_assert_eq(st.evictions, 1);
    cr_assert_eq(MATCH(1), 4);
    cr_assert_eq(MATCH(0), 8);
    cr_assert_eq(MATCH(2), 8);
    cr_assert_eq(append(c, x, fresh, 4), 0); /* 17 -> 21: one more block */
    cr_assert_eq(MATCH(1), 0);
    cr_assert_eq(MATCH(0), 8);
    cr_assert_eq(MATCH(2), 8);
    /* then P2 (released before P0 was touched), then P0 */
    cr_assert_eq(append(c, x, fresh, 4), 0);
    cr_assert_eq(MATCH(2), 4);
    cr_assert_eq(MATCH(0), 8);
    cr_assert_eq(append(c, x, fresh, 8), 0);
    cr_assert_eq(MATCH(2), 0);
    cr_assert_eq(MATCH(0), 4);
    kvc_get_stats(c, &st);
    cr_assert_eq(st.evictions, 5);
    cr_assert_eq(st.blocks_cached, 1);
    /* an in-use hashed block is never evicted: the pool is full */
    cr_assert_eq(append(c, x, fresh, 4), 0);
    cr_assert_eq(MATCH(0), 0);
    cr_assert_eq(append(c, x, fresh, 3), 0); /* 37 -> 40 fills the last block */
    cr_assert_eq(append(c, x, fresh, 1), KVC_ERR_FULL);
    check(c);
    expect_data(c, x, fresh);
#undef MATCH
    kvc_free(c);
}

/* A cached block attached by one sequence while another sequence also uses it just gains a reference. */
Test(kv_cache_prefix, attach_in_use_blocks) {
    enum { BS = 4 };
    kvc_cache *c = make(8, BS, 4, 64);
    int32_t prompt[12];
    for (int i = 0; i < 12; i++) prompt[i] = 7 * i + 1;
    int32_t a = alloc_seq(c), b = alloc_seq(c);
    cr_assert_eq(append(c, a, prompt, 12), 0);
    int32_t n_cached;
    cr_assert_eq(kvc_attach_prefix(c, b, prompt, 11, &n_cached), 0);
    cr_assert_eq(n_cached, 8);
    const int32_t *ta;
    kvc_block_table(c, a, &ta, NULL, NULL);
    cr_assert_eq(kvc_block_refcount(c, ta[0]), 2);
    cr_assert_eq(kvc_block_refcount(c, ta[1]), 2);
    cr_assert_eq(kvc_block_refcount(c, ta[2]), 1);
    /* b writes its own third block; a's stays intact */
    cr_assert_eq(append(c, b, prompt, 4), 0);
    expect_data(c, a, prompt);
    expect_data(c, b, prompt);
    /* b's third block duplicates a's: after publishing b uses a's block */
    const int32_t *tb;
    kvc_block_table(c, b, &tb, NULL, NULL);
    cr_assert_eq(tb[2], ta[2]);
    cr_assert_eq(kvc_block_refcount(c, ta[2]), 2);
    /* a context shift in a is refused while it shares those blocks */
    kvc_shift sh;
    cr_assert_eq(kvc_remove(c, a, 2, 5, &sh), KVC_ERR_NOT_SUPPORTED);
    /* a tail removal of b only drops references */
    cr_assert_eq(kvc_remove(c, b, 0, INT32_MAX, NULL), 0);
    cr_assert_eq(kvc_block_refcount(c, ta[0]), 1);
    cr_assert_eq(kvc_seq_len(c, b), 0);
    expect_data(c, a, prompt);
    check(c);
    kvc_free(c);
}

/* Without prefix caching nothing is hashed: released blocks are free at once and attach finds nothing. */
Test(kv_cache_prefix, disabled) {
    kvc_params p;
    kvc_params_default(&p);
    p.n_layer = 1;
    p.n_kv_head = 1;
    p.head_dim = 4;
    p.dtype = KVC_DTYPE_F32;
    p.block_size = 4;
    p.n_blocks = 8;
    p.max_seqs = 2;
    p.max_batch_tokens = 32;
    p.prefix_caching = false;
    kvc_cache *c = NULL;
    cr_assert_eq(kvc_create(&p, &c), 0);
    int32_t prompt[12];
    for (int i = 0; i < 12; i++) prompt[i] = i;
    int32_t a = alloc_seq(c), b = alloc_seq(c), n_cached = -1, m = -1;
    cr_assert_eq(append(c, a, prompt, 12), 0);
    cr_assert_eq(kvc_prefix_match(c, prompt, 12, &m), 0);
    cr_assert_eq(m, 0);
    cr_assert_eq(kvc_attach_prefix(c, b, prompt, 11, &n_cached), 0);
    cr_assert_eq(n_cached, 0);
    cr_assert_eq(kvc_seq_free(c, a), 0);
    kvc_stats st;
    kvc_get_stats(c, &st);
    cr_assert_eq(st.blocks_cached, 0);
    cr_assert_eq(st.blocks_free, 8);
    cr_assert_eq(st.prefix_query_tokens, 11);
    check(c);
    kvc_free(c);
}
