/*
 * test_kv_cache_edge.c: edge cases and error paths of the KV cache: creation parameters and size overflow,
 * allocator mocks (failing alloc, failing and counting copy), full pool, zero-length and out-of-range
 * arguments, double free, positions, batch and sequence limits, forward state, sliding window.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kv_cache.h"
#include "helper_kvc.h"

/* ---- allocator mock: host memory, counts calls, can fail alloc or copy ----------------------------------- */
typedef struct mock {
    int allocs, frees, copies;
    size_t copied_bytes;
    bool fail_alloc, fail_copy;
    int fail_copy_after; /* copies that succeed before fail_copy takes effect */
} mock;

static void *m_alloc(void *ctx, size_t bytes) {
    mock *m = ctx;
    if (m->fail_alloc) return NULL;
    m->allocs++;
    return calloc(1, bytes ? bytes : 1);
}
static int m_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    mock *m = ctx;
    if (m->fail_copy) {
        if (m->fail_copy_after <= 0) return -1;
        m->fail_copy_after--;
    }
    m->copies++;
    m->copied_bytes += bytes;
    memmove(dst, src, bytes);
    return 0;
}
static void m_free(void *ctx, void *ptr) {
    mock *m = ctx;
    if (ptr) m->frees++;
    free(ptr);
}

static kvc_params small_params(void) { return kvct_params(8, 4, 4, 16); }

static kvc_cache *make(const kvc_params *p) {
    kvc_cache *c = NULL;
    cr_assert_eq(kvc_create(p, &c), KVC_OK);
    cr_assert_not_null(c);
    return c;
}

static void check(const kvc_cache *c) {
    char msg[256];
    int rc = kvc_check(c, msg, sizeof msg);
    cr_assert_eq(rc, KVC_OK, "kvc_check: %s", msg);
}

/* Appends n tokens (token ids tok0, tok0+1, ...) to seq in one batch, writing their rows; returns the rc. */
static int append(kvc_cache *c, int32_t seq, int32_t n, int32_t tok0) {
    kvc_entry e[64];
    int32_t slots[64];
    cr_assert(n <= 64);
    int32_t len = kvc_seq_len(c, seq);
    for (int32_t i = 0; i < n; i++) e[i] = (kvc_entry){seq, len + i, tok0 + i};
    int rc = kvc_start_forward(c, e, n, slots);
    if (rc) return rc;
    kvc_layout l;
    kvc_get_layout(c, &l);
    for (int32_t i = 0; i < n; i++) kvct_write_slot(&l, slots[i], e[i].token, e[i].pos);
    cr_assert_eq(kvc_finish_forward(c, true), 0);
    check(c);
    return 0;
}

static int32_t alloc_seq(kvc_cache *c) {
    int32_t s = -1;
    cr_assert_eq(kvc_seq_alloc(c, &s), 0);
    return s;
}

Test(kv_cache_edge, params_default_and_strings) {
    kvc_params p;
    memset(&p, 0x5a, sizeof p);
    kvc_params_default(&p);
    cr_assert_eq(p.block_size, 16);
    cr_assert_eq(p.dtype, KVC_DTYPE_F16);
    cr_assert(p.prefix_caching);
    cr_assert_eq(p.max_seq_len, 0);
    cr_assert_eq(p.sliding_window, 0);
    cr_assert_null(p.allocator);
    cr_assert_eq(p.n_layer, 0);
    cr_assert_eq(p.n_blocks, 0);
    cr_assert_eq(p.mem_bytes, 0);
    cr_assert_eq(p.max_seqs, 0);
    for (int e = 0; e >= -12; e--) cr_assert_not_null(kvs_strerror(e));
    cr_assert_str_neq(kvs_strerror(KVC_ERR_FULL), kvs_strerror(KVC_ERR_NOMEM));
    cr_assert_eq(kvc_row_bytes(KVC_DTYPE_F32, 64), 256);
    cr_assert_eq(kvc_row_bytes(KVC_DTYPE_F16, 64), 128);
    cr_assert_eq(kvc_row_bytes(KVC_DTYPE_Q8_0, 64), 68);
    cr_assert_eq(kvc_row_bytes(KVC_DTYPE_Q8_0, 48), 0);
    cr_assert_eq(kvc_row_bytes(KVC_DTYPE_F16, 0), 0);
    cr_assert_eq(kvc_row_bytes((kvc_dtype)7, 64), 0);
    kvc_free(NULL);
}

Test(kv_cache_edge, create_bad_params) {
    kvc_cache *c = (kvc_cache *)0x1;
    kvc_params p = small_params();
    cr_assert_eq(kvc_create(NULL, &c), KVC_ERR_INVALID);
    cr_assert_eq(kvc_create(&p, NULL), KVC_ERR_INVALID);
#define BAD(field, value)                                                        \
    do {                                                                         \
        kvc_params q = small_params();                                           \
        q.field = value;                                                         \
        c = (kvc_cache *)0x1;                                                    \
        cr_assert_eq(kvc_create(&q, &c), KVC_ERR_INVALID, #field " = " #value); \
        cr_assert_null(c);                                                       \
    } while (0)
    BAD(n_layer, 0);
    BAD(n_kv_head, -1);
    BAD(head_dim, 0);
    BAD(block_size, -4);
    BAD(n_blocks, -1);
    BAD(max_seqs, 0);
    BAD(max_batch_tokens, 0);
    BAD(max_seq_len, -1);
    BAD(sliding_window, -1);
    BAD(dtype, (kvc_dtype)9);
    /* Q8_0 needs head_dim % 32 == 0 */
    {
        kvc_params q = small_params();
        q.dtype = KVC_DTYPE_Q8_0;
        cr_assert_eq(kvc_create(&q, &c), KVC_ERR_INVALID);
        q.head_dim = 64;
        c = make(&q);
        kvc_layout l;
        kvc_get_layout(c, &l);
        cr_assert_eq(l.row_bytes, 68);
        kvc_free(c);
    }
    /* budget below one block; exactly one block */
    {
        kvc_params q = small_params();
        q.n_blocks = 0;
        size_t per_block = 2 * 2 * (2 * 4 * 16); /* n_layer*2 * n_kv_head*block_size*row */
        q.mem_bytes = per_block - 1;
        cr_assert_eq(kvc_create(&q, &c), KVC_ERR_INVALID);
        q.mem_bytes = 0;
        cr_assert_eq(kvc_create(&q, &c), KVC_ERR_INVALID);
        q.mem_bytes = per_block;
        c = make(&q);
        kvc_stats st;
        kvc_get_stats(c, &st);
        cr_assert_eq(st.blocks_total, 1);
        cr_assert_eq(st.bytes_per_block, per_block);
        cr_assert_eq(st.bytes_total, per_block);
        kvc_free(c);
        q.mem_bytes = 10 * per_block + per_block / 2;
        c = make(&q);
        kvc_get_stats(c, &st);
        cr_assert_eq(st.blocks_total, 10);
        kvc_free(c);
    }
    /* size_t overflow of the storage size is an invalid shape, not a huge allocation */
    {
        kvc_params q = small_params();
        q.n_layer = INT32_MAX;
        q.n_kv_head = INT32_MAX;
        q.head_dim = INT32_MAX;
        q.block_size = INT32_MAX;
        q.n_blocks = 1;
        cr_assert_eq(kvc_create(&q, &c), KVC_ERR_INVALID);
        q = small_params();
        q.head_dim = INT32_MAX / 2;
        q.n_kv_head = INT32_MAX;
        q.block_size = 1 << 20;
        cr_assert_eq(kvc_create(&q, &c), KVC_ERR_INVALID);
        /* slots must fit int32: n_blocks * block_size */
        q = small_params();
        q.block_size = 1 << 16;
        q.n_blocks = 1 << 16;
        cr_assert_eq(kvc_create(&q, &c), KVC_ERR_INVALID);
    }
}

Test(kv_cache_edge, allocator_failure_is_nomem) {
    mock m = {0};
    m.fail_alloc = true;
    kvc_allocator a = {m_alloc, m_copy, m_free, &m};
    kvc_params p = small_params();
    p.allocator = &a;
    kvc_cache *c = (kvc_cache *)0x1;
    cr_assert_eq(kvc_create(&p, &c), KVC_ERR_NOMEM);
    cr_assert_null(c);
    /* a huge but representable size that the allocator refuses */
    p.n_blocks = 1 << 20;
    cr_assert_eq(kvc_create(&p, &c), KVC_ERR_NOMEM);
    kvc_allocator incomplete = {m_alloc, NULL, m_free, &m};
    p = small_params();
    p.allocator = &incomplete;
    cr_assert_eq(kvc_create(&p, &c), KVC_ERR_INVALID);
    /* storage is allocated once and freed once */
    m.fail_alloc = false;
    p.allocator = &a;
    c = make(&p);
    cr_assert_eq(m.allocs, 1);
    kvc_free(c);
    cr_assert_eq(m.frees, 1);
}

Test(kv_cache_edge, layout_and_host_allocator) {
    kvc_params p = small_params();
    p.dtype = KVC_DTYPE_F16;
    p.head_dim = 8;
    kvc_cache *c = make(&p);
    kvc_layout l;
    kvc_get_layout(c, &l);
    cr_assert_eq(l.row_bytes, 16);
    cr_assert_eq(l.head_stride, 4 * 16);
    cr_assert_eq(l.block_stride, 2 * 4 * 16);
    cr_assert_eq(l.layer_bytes, 8 * l.block_stride);
    cr_assert_eq((uintptr_t)l.base % 64, 0);
    /* the last row of the last block of V of the last layer ends exactly at the end of the storage */
    char *last = kvc_row_ptr(&l, 1, 1, 8 * 4 - 1, 1);
    kvc_stats st;
    kvc_get_stats(c, &st);
    cr_assert_eq(last + l.row_bytes, (char *)l.base + st.bytes_total);
    cr_assert_eq((char *)kvc_row_ptr(&l, 0, 1, 0, 0), (char *)l.base + l.layer_bytes);
    const kvc_allocator *h = kvc_host_allocator();
    cr_assert_not_null(h);
    void *x = h->alloc(h->ctx, 100);
    cr_assert_eq((uintptr_t)x % 64, 0);
    h->free(h->ctx, x);
    h->free(h->ctx, NULL);
    kvc_free(c);
}

Test(kv_cache_edge, slots_and_double_free) {
    kvc_params p = small_params();
    kvc_cache *c = make(&p);
    int32_t ids[4];
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(kvc_seq_alloc(c, &ids[i]), 0);
        cr_assert_eq(ids[i], i);
        cr_assert(kvc_seq_is_live(c, i));
    }
    int32_t x = -1;
    cr_assert_eq(kvc_seq_alloc(c, &x), KVC_ERR_NO_SLOT);
    cr_assert_eq(kvc_seq_alloc(c, NULL), KVC_ERR_INVALID);
    cr_assert_eq(kvc_seq_free(c, 2), 0);
    cr_assert_eq(kvc_seq_free(c, 2), KVC_ERR_BAD_SEQ);
    cr_assert_eq(kvc_seq_free(c, -1), KVC_ERR_BAD_SEQ);
    cr_assert_eq(kvc_seq_free(c, 4), KVC_ERR_BAD_SEQ);
    cr_assert_not(kvc_seq_is_live(c, 2));
    cr_assert_not(kvc_seq_is_live(c, 99));
    cr_assert_eq(kvc_seq_len(c, 99), 0);
    cr_assert_eq(kvc_seq_alloc(c, &x), 0);
    cr_assert_eq(x, 2); /* the lowest free id */
    const int32_t *tab;
    int32_t nb, len;
    cr_assert_eq(kvc_block_table(c, 7, &tab, &nb, &len), KVC_ERR_BAD_SEQ);
    cr_assert_eq(kvc_block_table(c, 2, &tab, &nb, &len), 0);
    cr_assert_eq(nb, 0);
    cr_assert_eq(len, 0);
    kvc_stats st;
    kvc_get_stats(c, &st);
    cr_assert_eq(st.seqs_live, 4);
    check(c);
    kvc_free(c);
}

Test(kv_cache_edge, positions_limits_and_state) {
    kvc_params p = small_params();
    p.max_seq_len = 10;
    p.max_batch_tokens = 6;
    kvc_cache *c = make(&p);
    int32_t a = alloc_seq(c), b = alloc_seq(c);
    kvc_entry e[8];
    int32_t slots[8];
    /* skip and repeat */
    e[0] = (kvc_entry){a, 1, 5};
    cr_assert_eq(kvc_start_forward(c, e, 1, slots), KVC_ERR_POSITION);
    e[0] = (kvc_entry){a, 0, 5};
    e[1] = (kvc_entry){a, 0, 6};
    cr_assert_eq(kvc_start_forward(c, e, 2, slots), KVC_ERR_POSITION);
    e[1] = (kvc_entry){a, 2, 6};
    cr_assert_eq(kvc_start_forward(c, e, 2, slots), KVC_ERR_POSITION);
    e[1] = (kvc_entry){a, -1, 6};
    cr_assert_eq(kvc_start_forward(c, e, 2, slots), KVC_ERR_POSITION);
    /* bad sequence in the middle of a valid batch: nothing happens */
    e[1] = (kvc_entry){3, 0, 6};
    cr_assert_eq(kvc_start_forward(c, e, 2, slots), KVC_ERR_BAD_SEQ);
    e[1] = (kvc_entry){-2, 0, 6};
    cr_assert_eq(kvc_start_forward(c, e, 2, slots), KVC_ERR_BAD_SEQ);
    /* over max_batch_tokens */
    for (int i = 0; i < 7; i++) e[i] = (kvc_entry){a, i, i};
    cr_assert_eq(kvc_start_forward(c, e, 7, slots), KVC_ERR_TOO_LARGE);
    cr_assert_eq(kvc_start_forward(c, e, 0, slots), KVC_ERR_INVALID);
    cr_assert_eq(kvc_start_forward(c, e, -3, slots), KVC_ERR_INVALID);
    cr_assert_eq(kvc_start_forward(c, e, 1, NULL), KVC_ERR_INVALID);
    kvc_stats st;
    kvc_get_stats(c, &st);
    cr_assert_eq(st.blocks_used, 0);
    cr_assert_eq(kvc_seq_len(c, a), 0);
    check(c);
    /* up to max_seq_len is fine, one more is not */
    cr_assert_eq(append(c, a, 6, 100), 0);
    cr_assert_eq(append(c, a, 4, 200), 0);
    cr_assert_eq(kvc_seq_len(c, a), 10);
    cr_assert_eq(append(c, a, 1, 300), KVC_ERR_TOO_LARGE);
    /* a batch mixing a valid entry of b and an over-long entry of a changes nothing */
    e[0] = (kvc_entry){b, 0, 1};
    e[1] = (kvc_entry){a, 10, 1};
    cr_assert_eq(kvc_start_forward(c, e, 2, slots), KVC_ERR_TOO_LARGE);
    cr_assert_eq(kvc_seq_len(c, b), 0);
    /* state: start twice, finish twice, mutations while pending */
    cr_assert_eq(kvc_finish_forward(c, true), KVC_ERR_STATE);
    cr_assert_eq(kvc_finish_forward(c, false), KVC_ERR_STATE);
    cr_assert_eq(kvc_start_forward(c, e, 1, slots), 0);
    int32_t nb, len;
    cr_assert_eq(kvc_block_table(c, b, NULL, &nb, &len), 0);
    cr_assert_eq(len, 1); /* includes the pending batch */
    cr_assert_eq(nb, 1);
    cr_assert_eq(kvc_seq_len(c, b), 0); /* committed length */
    cr_assert_eq(kvc_start_forward(c, e, 1, slots), KVC_ERR_STATE);
    int32_t x;
    cr_assert_eq(kvc_seq_alloc(c, &x), KVC_ERR_STATE);
    cr_assert_eq(kvc_seq_free(c, a), KVC_ERR_STATE);
    cr_assert_eq(kvc_remove(c, a, 0, INT32_MAX, NULL), KVC_ERR_STATE);
    cr_assert_eq(kvc_copy_prefix(c, a, 2, 4), KVC_ERR_BAD_SEQ);
    int32_t n_cached;
    int32_t toks[4] = {1, 2, 3, 4};
    cr_assert_eq(kvc_attach_prefix(c, b, toks, 4, &n_cached), KVC_ERR_STATE);
    check(c);
    cr_assert_eq(kvc_finish_forward(c, true), 0);
    cr_assert_eq(kvc_finish_forward(c, true), KVC_ERR_STATE);
    cr_assert_eq(kvc_seq_len(c, b), 1);
    check(c);
    kvc_free(c);
}

Test(kv_cache_edge, full_pool_is_all_or_nothing) {
    kvc_params p = small_params(); /* 8 blocks of 4 */
    kvc_cache *c = make(&p);
    int32_t a = alloc_seq(c), b = alloc_seq(c);
    cr_assert_eq(append(c, a, 14, 0), 0); /* 4 blocks */
    cr_assert_eq(append(c, b, 10, 50), 0); /* 3 blocks */
    kvc_stats st0, st1;
    kvc_get_stats(c, &st0);
    cr_assert_eq(st0.blocks_free + st0.blocks_cached, 1);
    /* a needs 0 new blocks for 2 tokens, b needs 2 for 7: the batch fails as a whole */
    kvc_entry e[9];
    int32_t slots[9];
    e[0] = (kvc_entry){a, 14, 1};
    e[1] = (kvc_entry){a, 15, 1};
    for (int i = 0; i < 7; i++) e[2 + i] = (kvc_entry){b, 10 + i, 1};
    cr_assert_eq(kvc_blocks_needed(c, a, 2), 0);
    cr_assert_eq(kvc_blocks_needed(c, b, 6), 1);
    cr_assert_eq(kvc_blocks_needed(c, b, 7), 2);
    cr_assert_eq(kvc_blocks_available(c), 1);
    const int32_t *ta;
    int32_t ta_copy[4];
    kvc_block_table(c, a, &ta, NULL, NULL);
    memcpy(ta_copy, ta, sizeof ta_copy);
    cr_assert_eq(kvc_start_forward(c, e, 9, slots), KVC_ERR_FULL);
    kvc_get_stats(c, &st1);
    cr_assert_eq(memcmp(&st0, &st1, sizeof st0), 0);
    cr_assert_eq(kvc_seq_len(c, a), 14);
    cr_assert_eq(kvc_seq_len(c, b), 10);
    kvc_block_table(c, a, &ta, NULL, NULL);
    cr_assert_arr_eq(ta, ta_copy, sizeof ta_copy);
    check(c);
    /* the same batch without b's overflow fits exactly */
    cr_assert_eq(kvc_start_forward(c, e, 5, slots), 0);
    cr_assert_eq(kvc_finish_forward(c, true), 0);
    kvc_get_stats(c, &st1);
    cr_assert_eq(st1.blocks_used, 8);
    cr_assert_eq(kvc_blocks_available(c), 0);
    cr_assert_eq(append(c, b, 1, 1), 0); /* 13 -> 14 still fits in b's last block */
    cr_assert_eq(append(c, b, 3, 1), KVC_ERR_FULL);
    check(c);
    kvc_free(c);
}

Test(kv_cache_edge, zero_length_and_ranges) {
    kvc_params p = small_params();
    kvc_cache *c = make(&p);
    int32_t a = alloc_seq(c), b = alloc_seq(c), d = alloc_seq(c);
    /* copy from an empty sequence: only len 0 */
    cr_assert_eq(kvc_copy_prefix(c, a, b, 0), 0);
    cr_assert_eq(kvc_copy_prefix(c, a, b, 1), KVC_ERR_INVALID);
    cr_assert_eq(kvc_copy_prefix(c, a, a, 0), KVC_ERR_INVALID);
    cr_assert_eq(kvc_copy_prefix(c, a, b, -1), KVC_ERR_INVALID);
    cr_assert_eq(kvc_copy_prefix(c, a, 9, 0), KVC_ERR_BAD_SEQ);
    cr_assert_eq(kvc_copy_prefix(c, -1, b, 0), KVC_ERR_BAD_SEQ);
    cr_assert_eq(append(c, a, 6, 0), 0);
    cr_assert_eq(kvc_copy_prefix(c, a, a, 2), KVC_ERR_INVALID);
    cr_assert_eq(kvc_copy_prefix(c, a, b, 7), KVC_ERR_INVALID);
    cr_assert_eq(kvc_copy_prefix(c, a, b, 0), 0);
    cr_assert_eq(kvc_seq_len(c, b), 0);
    cr_assert_eq(kvc_copy_prefix(c, a, b, 6), 0);
    cr_assert_eq(kvc_copy_prefix(c, a, b, 2), KVC_ERR_INVALID); /* b not empty */
    /* attach: n = 0, n < 0, NULL, non-empty target */
    int32_t n_cached = -1;
    int32_t toks[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    cr_assert_eq(kvc_attach_prefix(c, d, toks, 0, &n_cached), 0);
    cr_assert_eq(n_cached, 0);
    cr_assert_eq(kvc_attach_prefix(c, d, NULL, 0, &n_cached), 0);
    cr_assert_eq(kvc_attach_prefix(c, d, NULL, 3, &n_cached), KVC_ERR_INVALID);
    cr_assert_eq(kvc_attach_prefix(c, d, toks, -1, &n_cached), KVC_ERR_INVALID);
    cr_assert_eq(kvc_attach_prefix(c, a, toks, 4, &n_cached), KVC_ERR_INVALID);
    cr_assert_eq(kvc_attach_prefix(c, 9, toks, 4, &n_cached), KVC_ERR_BAD_SEQ);
    int32_t m = -1;
    cr_assert_eq(kvc_prefix_match(c, toks, 0, &m), 0);
    cr_assert_eq(m, 0);
    cr_assert_eq(kvc_prefix_match(c, toks, -1, &m), KVC_ERR_INVALID);
    cr_assert_eq(kvc_prefix_match(c, toks, 8, &m), 0);
    cr_assert_eq(m, 4); /* a's first block (tokens 0..3) is published */
    /* remove: past the end, empty range, bad ranges */
    kvc_shift sh = {9, 9, 9};
    cr_assert_eq(kvc_remove(c, a, 6, INT32_MAX, &sh), 0);
    cr_assert_eq(sh.n, 0);
    cr_assert_eq(kvc_remove(c, a, 100, 200, &sh), 0);
    cr_assert_eq(sh.n, 0);
    cr_assert_eq(kvc_remove(c, a, 2, 2, &sh), 0);
    cr_assert_eq(sh.n, 0);
    cr_assert_eq(kvc_seq_len(c, a), 6);
    cr_assert_eq(kvc_remove(c, a, -1, 2, &sh), KVC_ERR_INVALID);
    cr_assert_eq(kvc_remove(c, a, 3, 2, &sh), KVC_ERR_INVALID);
    cr_assert_eq(kvc_remove(c, 9, 0, 2, &sh), KVC_ERR_BAD_SEQ);
    cr_assert_eq(kvc_remove(c, d, 0, INT32_MAX, NULL), 0); /* empty sequence */
    /* can_resume without a window: 0..len */
    cr_assert(kvc_can_resume(c, a, 0));
    cr_assert(kvc_can_resume(c, a, 6));
    cr_assert_not(kvc_can_resume(c, a, 7));
    cr_assert_not(kvc_can_resume(c, a, -1));
    cr_assert_not(kvc_can_resume(c, 9, 0));
    /* blocks_needed and refcount ranges */
    cr_assert_lt(kvc_blocks_needed(c, 9, 1), 0);
    cr_assert_lt(kvc_blocks_needed(c, a, -1), 0);
    cr_assert_eq(kvc_blocks_needed(c, a, 0), 0);
    cr_assert_eq(kvc_block_refcount(c, -1), KVC_ERR_INVALID);
    cr_assert_eq(kvc_block_refcount(c, 8), KVC_ERR_INVALID);
    check(c);
    kvc_free(c);
}

/* CopyPrefix of full blocks copies no data; a partial last block copies one block (2 * n_layer regions). */
Test(kv_cache_edge, copy_prefix_copies) {
    mock m = {0};
    kvc_allocator al = {m_alloc, m_copy, m_free, &m};
    kvc_params p = small_params();
    p.allocator = &al;
    kvc_cache *c = make(&p);
    kvc_layout l;
    kvc_get_layout(c, &l);
    int32_t a = alloc_seq(c), b = alloc_seq(c), d = alloc_seq(c);
    cr_assert_eq(append(c, a, 10, 0), 0);
    cr_assert_eq(m.copies, 0);
    cr_assert_eq(kvc_copy_prefix(c, a, b, 8), 0);
    cr_assert_eq(m.copies, 0, "full blocks must be shared, not copied");
    const int32_t *ta, *tb, *td;
    kvc_block_table(c, a, &ta, NULL, NULL);
    kvc_block_table(c, b, &tb, NULL, NULL);
    cr_assert_eq(ta[0], tb[0]);
    cr_assert_eq(ta[1], tb[1]);
    cr_assert_eq(kvc_block_refcount(c, ta[0]), 2);
    cr_assert_eq(kvc_copy_prefix(c, a, d, 10), 0);
    cr_assert_eq(m.copies, 2 * p.n_layer, "one block copied: K and V of each layer");
    cr_assert_eq(m.copied_bytes, 2 * p.n_layer * l.block_stride);
    kvc_block_table(c, d, &td, NULL, NULL);
    cr_assert_neq(td[2], ta[2]);
    cr_assert_eq(kvc_block_refcount(c, ta[0]), 3);
    cr_assert_eq(kvc_block_refcount(c, td[2]), 1);
    for (int32_t pos = 0; pos < 10; pos++)
        cr_assert_eq(kvct_check_slot(&l, td[pos / 4] * 4 + pos % 4, pos, pos), 0, "pos %d", pos);
    kvc_stats st;
    kvc_get_stats(c, &st);
    cr_assert_eq(st.cow_copies, 1);
    cr_assert_eq(st.tokens_live, 28);
    /* b continues at 8: a new block, no copy; d continues at 10: its own partial block, no copy */
    int before = m.copies;
    cr_assert_eq(append(c, b, 1, 500), 0);
    cr_assert_eq(append(c, d, 1, 600), 0);
    cr_assert_eq(m.copies, before);
    /* a continues at 10: its partial block is exclusive (d got a copy), written in place */
    cr_assert_eq(append(c, a, 1, 700), 0);
    cr_assert_eq(m.copies, before);
    /* truncating b into a shared full block makes it partial and shared: the next write copies it */
    cr_assert_eq(kvc_remove(c, b, 6, INT32_MAX, NULL), 0);
    cr_assert_eq(kvc_blocks_needed(c, b, 1), 1);
    cr_assert_eq(append(c, b, 1, 800), 0);
    cr_assert_eq(m.copies, before + 2 * p.n_layer);
    kvc_block_table(c, a, &ta, NULL, NULL);
    kvc_block_table(c, b, &tb, NULL, NULL);
    cr_assert_neq(ta[1], tb[1]);
    cr_assert_eq(kvct_check_slot(&l, ta[1] * 4 + 2, 6, 6), 0, "a's data survived b's write");
    cr_assert_eq(kvct_check_slot(&l, tb[1] * 4 + 2, 800, 6), 0);
    cr_assert_eq(kvct_check_slot(&l, tb[1] * 4 + 1, 5, 5), 0);
    check(c);
    kvc_free(c);
    cr_assert_eq(m.frees, 1);
}

/* A failing copy: copy_prefix and start_forward report NOMEM and change nothing; a context shift reports
 * NOMEM and leaves the sequence truncated to begin (documented). */
Test(kv_cache_edge, copy_failure) {
    mock m = {0};
    kvc_allocator al = {m_alloc, m_copy, m_free, &m};
    kvc_params p = small_params();
    p.allocator = &al;
    kvc_cache *c = make(&p);
    kvc_layout l;
    kvc_get_layout(c, &l);
    int32_t a = alloc_seq(c), b = alloc_seq(c);
    cr_assert_eq(append(c, a, 10, 0), 0);
    kvc_stats st0, st1;
    kvc_get_stats(c, &st0);
    m.fail_copy = true;
    m.fail_copy_after = 1; /* the second region copy fails */
    cr_assert_eq(kvc_copy_prefix(c, a, b, 10), KVC_ERR_NOMEM);
    kvc_get_stats(c, &st1);
    cr_assert_eq(st1.blocks_used, st0.blocks_used);
    cr_assert_eq(kvc_seq_len(c, b), 0);
    check(c);
    /* share the full blocks, then truncate b to make its last block shared and partial */
    m.fail_copy = false;
    cr_assert_eq(kvc_copy_prefix(c, a, b, 8), 0);
    cr_assert_eq(kvc_remove(c, b, 5, INT32_MAX, NULL), 0);
    const int32_t *tb;
    int32_t tb1;
    kvc_block_table(c, b, &tb, NULL, NULL);
    tb1 = tb[1];
    kvc_get_stats(c, &st0);
    m.fail_copy = true;
    m.fail_copy_after = 0;
    kvc_entry e = {b, 5, 42};
    int32_t slot;
    cr_assert_eq(kvc_start_forward(c, &e, 1, &slot), KVC_ERR_NOMEM);
    kvc_get_stats(c, &st1);
    cr_assert_eq(st1.blocks_used, st0.blocks_used);
    kvc_block_table(c, b, &tb, NULL, NULL);
    cr_assert_eq(tb[1], tb1);
    cr_assert_eq(kvc_seq_len(c, b), 5);
    cr_assert_eq(kvc_finish_forward(c, false), KVC_ERR_STATE);
    check(c);
    /* a context shift whose copy fails */
    cr_assert_eq(kvc_seq_free(c, b), 0);
    kvc_shift sh;
    cr_assert_eq(kvc_remove(c, a, 1, 3, &sh), KVC_ERR_NOMEM);
    cr_assert_eq(kvc_seq_len(c, a), 1);
    cr_assert_eq(sh.n, 0);
    check(c);
    m.fail_copy = false;
    const int32_t *ta;
    kvc_block_table(c, a, &ta, NULL, NULL);
    cr_assert_eq(kvct_check_slot(&l, ta[0] * 4, 0, 0), 0, "the prefix before begin is intact");
    kvc_free(c);
}

/* Middle removal: moves rows (all layers, K and V, all heads), reports the shift, drops moved-into hashes;
 * refused while a block from the one holding begin on is shared. */
Test(kv_cache_edge, context_shift) {
    kvc_params p = small_params();
    p.n_blocks = 16;
    kvc_cache *c = make(&p);
    kvc_layout l;
    kvc_get_layout(c, &l);
    int32_t a = alloc_seq(c), b = alloc_seq(c);
    cr_assert_eq(append(c, a, 14, 0), 0); /* tokens 0..13 at positions 0..13 */
    cr_assert_eq(kvc_copy_prefix(c, a, b, 8), 0); /* shares blocks 0 and 1 */
    kvc_shift sh;
    cr_assert_eq(kvc_remove(c, a, 5, 9, &sh), KVC_ERR_NOT_SUPPORTED); /* block 1 is shared */
    cr_assert_eq(kvc_seq_len(c, a), 14);
    /* from block 2 on nothing is shared: allowed even though blocks 0-1 are */
    cr_assert_eq(kvc_remove(c, a, 9, 12, &sh), 0);
    cr_assert_eq(sh.pos, 9);
    cr_assert_eq(sh.n, 2);
    cr_assert_eq(sh.delta, -3);
    cr_assert_eq(kvc_seq_len(c, a), 11);
    const int32_t *ta;
    kvc_block_table(c, a, &ta, NULL, NULL);
    for (int32_t pos = 0; pos < 11; pos++) {
        int32_t src = pos < 9 ? pos : pos + 3; /* token == original position here */
        cr_assert_eq(kvct_check_slot(&l, ta[pos / 4] * 4 + pos % 4, src, src), 0, "pos %d", pos);
    }
    /* the moved-into block is no longer in the prefix cache, the untouched ones are */
    int32_t toks[14];
    for (int i = 0; i < 14; i++) toks[i] = i;
    int32_t m;
    kvc_prefix_match(c, toks, 14, &m);
    cr_assert_eq(m, 8);
    int32_t shifted[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 0};
    kvc_prefix_match(c, shifted, 12, &m);
    cr_assert_eq(m, 8);
    check(c);
    /* after b goes, a shares nothing: a larger shift inside one block and across blocks */
    cr_assert_eq(kvc_seq_free(c, b), 0);
    cr_assert_eq(append(c, a, 9, 100), 0); /* len 20 */
    cr_assert_eq(kvc_remove(c, a, 1, 3, &sh), 0);
    cr_assert_eq(sh.pos, 1);
    cr_assert_eq(sh.n, 17);
    cr_assert_eq(sh.delta, -2);
    cr_assert_eq(kvc_seq_len(c, a), 18);
    kvc_block_table(c, a, &ta, NULL, NULL);
    /* expected (token, vpos) per position */
    int32_t et[18], ev[18], k = 0;
    int32_t t0[20], v0[20];
    for (int i = 0; i < 11; i++) {
        t0[i] = i < 9 ? i : i + 3;
        v0[i] = t0[i];
    }
    for (int i = 11; i < 20; i++) {
        t0[i] = 100 + i - 11;
        v0[i] = i;
    }
    for (int i = 0; i < 20; i++)
        if (i < 1 || i >= 3) {
            et[k] = t0[i];
            ev[k] = v0[i];
            k++;
        }
    for (int32_t pos = 0; pos < 18; pos++)
        cr_assert_eq(kvct_check_slot(&l, ta[pos / 4] * 4 + pos % 4, et[pos], ev[pos]), 0, "pos %d", pos);
    kvc_prefix_match(c, toks, 14, &m);
    cr_assert_eq(m, 0, "block 0 changed: nothing of the old prefix remains reachable");
    /* new full blocks of a shifted sequence are never published */
    cr_assert_eq(append(c, a, 6, 300), 0);
    int32_t now[24];
    for (int i = 0; i < 18; i++) now[i] = et[i];
    for (int i = 0; i < 6; i++) now[18 + i] = 300 + i;
    kvc_prefix_match(c, now, 24, &m);
    cr_assert_eq(m, 0);
    /* truncating back below the shift point makes it clean again */
    cr_assert_eq(kvc_remove(c, a, 1, INT32_MAX, NULL), 0);
    cr_assert_eq(append(c, a, 7, 1), 0); /* tokens 0, 1..7 at 0..7 */
    for (int i = 0; i < 8; i++) toks[i] = i;
    kvc_prefix_match(c, toks, 8, &m);
    cr_assert_eq(m, 8);
    check(c);
    kvc_free(c);
}

Test(kv_cache_edge, sliding_window) {
    kvc_params p = small_params();
    p.sliding_window = 8;
    p.n_blocks = 6;
    kvc_cache *c = make(&p);
    kvc_layout l;
    kvc_get_layout(c, &l);
    int32_t a = alloc_seq(c);
    cr_assert_eq(append(c, a, 12, 0), 0);
    const int32_t *ta;
    int32_t nb, len;
    kvc_block_table(c, a, &ta, &nb, &len);
    cr_assert_eq(nb, 3);
    cr_assert_eq(ta[0], -1); /* (0+1)*4 <= 12-8 */
    cr_assert_geq(ta[1], 0);
    cr_assert_eq(append(c, a, 8, 12), 0); /* len 20: blocks with (i+1)*4 <= 12 go: 0, 1, 2 */
    kvc_block_table(c, a, &ta, &nb, &len);
    cr_assert_eq(nb, 5);
    cr_assert_eq(len, 20);
    cr_assert_eq(ta[0], -1);
    cr_assert_eq(ta[1], -1);
    cr_assert_eq(ta[2], -1);
    cr_assert_geq(ta[3], 0);
    kvc_stats st;
    kvc_get_stats(c, &st);
    cr_assert_eq(st.blocks_used, 2);
    cr_assert_eq(st.tokens_live, 20);
    /* the window of the next position [12, 20) is held */
    cr_assert(kvc_can_resume(c, a, 20));
    cr_assert_not(kvc_can_resume(c, a, 16)); /* needs [8, 16): block 2 is gone */
    cr_assert_not(kvc_can_resume(c, a, 14)); /* needs [6, 14): block 1 is gone */
    cr_assert(kvc_can_resume(c, a, 0));
    cr_assert_not(kvc_can_resume(c, a, 21));
    for (int32_t pos = 12; pos < 20; pos++)
        cr_assert_eq(kvct_check_slot(&l, ta[pos / 4] * 4 + pos % 4, pos, pos), 0);
    /* a long sequence runs in a small pool: only the window's blocks stay */
    cr_assert_eq(append(c, a, 16, 20), 0);
    cr_assert_eq(append(c, a, 16, 36), 0);
    cr_assert_eq(append(c, a, 16, 52), 0);
    kvc_get_stats(c, &st);
    cr_assert_leq(st.blocks_used, 3);
    /* middle removal touching a released block is refused */
    kvc_shift sh;
    cr_assert_eq(kvc_remove(c, a, 2, 4, &sh), KVC_ERR_NOT_SUPPORTED);
    /* truncating into released blocks: the sequence cannot continue there */
    cr_assert_eq(kvc_remove(c, a, 30, INT32_MAX, NULL), 0);
    cr_assert_not(kvc_can_resume(c, a, 30));
    cr_assert_eq(append(c, a, 1, 9), KVC_ERR_POSITION);
    check(c);
    kvc_free(c);
}

/* Every entry point tolerates a NULL cache (and NULL out-pointers where documented). */
Test(kv_cache_edge, null_arguments) {
    int32_t x = 0;
    kvc_entry e = {0, 0, 0};
    kvc_stats st;
    memset(&st, 0x11, sizeof st);
    kvc_layout l;
    memset(&l, 0x22, sizeof l);
    char msg[8];
    cr_assert_eq(kvc_seq_alloc(NULL, &x), KVC_ERR_INVALID);
    cr_assert_lt(kvc_seq_free(NULL, 0), 0);
    cr_assert_not(kvc_seq_is_live(NULL, 0));
    cr_assert_eq(kvc_seq_len(NULL, 0), 0);
    cr_assert_eq(kvc_start_forward(NULL, &e, 1, &x), KVC_ERR_INVALID);
    cr_assert_lt(kvc_finish_forward(NULL, true), 0);
    cr_assert_lt(kvc_block_table(NULL, 0, NULL, NULL, NULL), 0);
    cr_assert_eq(kvc_block_refcount(NULL, 0), KVC_ERR_INVALID);
    cr_assert_lt(kvc_copy_prefix(NULL, 0, 1, 0), 0);
    cr_assert_lt(kvc_attach_prefix(NULL, 0, &x, 1, &x), 0);
    cr_assert_eq(kvc_prefix_match(NULL, &x, 1, &x), KVC_ERR_INVALID);
    cr_assert_lt(kvc_remove(NULL, 0, 0, 1, NULL), 0);
    cr_assert_not(kvc_can_resume(NULL, 0, 0));
    cr_assert_lt(kvc_blocks_needed(NULL, 0, 1), 0);
    cr_assert_eq(kvc_blocks_available(NULL), 0);
    cr_assert_eq(kvc_check(NULL, msg, sizeof msg), KVC_ERR_INVALID);
    kvc_get_stats(NULL, &st);
    kvc_get_layout(NULL, &l);
    kvc_params_default(NULL);
    kvc_params p = small_params();
    kvc_cache *c = make(&p);
    kvc_get_stats(c, NULL);
    kvc_get_layout(c, NULL);
    int32_t a = alloc_seq(c);
    cr_assert_eq(kvc_attach_prefix(c, a, &x, 1, NULL), KVC_ERR_INVALID);
    cr_assert_eq(kvc_prefix_match(c, &x, 1, NULL), KVC_ERR_INVALID);
    cr_assert_eq(kvc_check(c, NULL, 0), KVC_OK);
    cr_assert_eq(kvc_check(c, msg, 0), KVC_OK);
    kvc_free(c);
}
