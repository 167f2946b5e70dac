/* kvc_internal.h: the KV block pool's private layout, shared by cache/kv_cache.c (the pool) and cache/kv_check.c
 * (statistics and the invariant checker). Not a public header: only those files include it. */
#ifndef KVSERVE_KVC_INTERNAL_H
#define KVSERVE_KVC_INTERNAL_H

#include <stdint.h>
#include <xxhash.h>

#include "cache/kv_cache.h"


/* Test hook: a test may compile this file with a narrow mask to force hash collisions (lookups stay exact
 * because identities are verified, see above). Production builds keep all 64 bits. */
#ifndef KVC_TEST_HASH_MASK
#define KVC_TEST_HASH_MASK UINT64_MAX
#endif

typedef struct kvc_block {
    int32_t ref;         /* references (tables + pending CoW originals) */
    uint32_t gen;        /* bumped whenever the block loses its hash */
    bool hashed;         /* in the hash index (used or cached) */
    uint64_t hash;       /* chained hash, valid when hashed */
    int32_t parent;      /* parent block of the identity (-1: first block of a chain), valid when hashed */
    uint32_t parent_gen; /* the parent's generation when this block was published */
    uint64_t parent_hash; /* the parent's chained hash when published (0 for the first block of a chain) */
    int32_t hprev, hnext; /* hash bucket chain */
    int32_t lprev, lnext; /* LRU list (cached blocks only) */
} kvc_block;

typedef struct kvc_seq {
    bool live;
    int32_t len;      /* committed tokens */
    int32_t pending;  /* tokens of the pending batch (appended after len) */
    int32_t *tokens;  /* [len + pending] token ids */
    int32_t tok_cap;
    int32_t *table;   /* [n_table] block ids, -1 = released by the sliding window (a leading run) */
    int32_t *pub_block; /* [n_pub] identity chain: block published at index i ... */
    uint32_t *pub_gen;  /* ... and its generation then */
    int32_t tab_cap;  /* capacity of table, pub_block, pub_gen */
    int32_t n_table;  /* == ceil((len + pending) / block_size) */
    int32_t n_pub;    /* leading blocks whose identity is known (published) */
    int32_t dirty_from; /* first position whose contents came from a context shift; INT32_MAX = none */
    /* pending forward */
    bool in_batch;
    int32_t batch_n;      /* scratch: entries seen while validating */
    int32_t old_n_table;  /* table length before the batch */
    int32_t cow_idx;      /* table index replaced at the batch start (-1: none) */
    int32_t cow_orig;     /* the block that was there (held by one reference), or -1 (a released block) */
} kvc_seq;

struct kvc_cache {
    kvc_params p;
    kvc_layout lay;
    const kvc_allocator *alloc;
    size_t bytes_per_block;
    size_t bytes_total;

    kvc_block *blocks;   /* [n_blocks] */
    int32_t *btok;       /* [n_blocks][block_size] token ids of hashed blocks (prefix caching only) */
    int32_t *free_stack; /* [n_blocks] */
    int32_t n_free;
    int32_t lru_head, lru_tail; /* head = least recently used */
    int32_t n_cached, n_used, n_hashed;
    int32_t *buckets;    /* [n_buckets] first block of each hash chain, -1 empty */
    uint32_t bucket_mask;

    kvc_seq *seqs;       /* [max_seqs] */
    int32_t seqs_live;
    int64_t tokens_live; /* committed tokens of live sequences */

    bool pending;
    int32_t *batch_seqs; /* [max_seqs] sequences of the pending batch */
    int32_t n_batch_seqs;

    uint64_t prefix_query_tokens, prefix_hit_tokens, evictions, cow_copies;

    kvc_event_cb event_cb; /* optional, see kvc_set_event_cb */
    void *event_ctx;

    /* The sliding-window group (kv_group.c): a second pool for the swa_layers layers, kept in lockstep with this
     * one (same sequence ids and lengths) by the public calls; NULL when the cache has none. */
    struct kvc_cache *swa;
    int32_t *swa_slots;  /* [max_batch_tokens] its slots of the pending forward */
    bool swa_slots_valid;
};

/* The pool itself (kv_cache.c, kv_check.c): the public calls of kv_cache.h for one group of layers. kv_group.c's
 * public calls run them on the main pool and, in lockstep, on the sliding-window group. */
int kvc_pool_create(const kvc_params *params, kvc_cache **out);
void kvc_pool_free(kvc_cache *c);
int kvc_pool_seq_alloc(kvc_cache *c, int32_t *seq_out);
int kvc_pool_seq_free(kvc_cache *c, int32_t seq);
int kvc_pool_start_forward(kvc_cache *c, const kvc_entry *entries, int32_t n, int32_t *slots_out);
int kvc_pool_finish_forward(kvc_cache *c, bool ok);
int kvc_pool_copy_prefix(kvc_cache *c, int32_t src, int32_t dst, int32_t len);
int kvc_pool_attach_prefix(kvc_cache *c, int32_t seq, const int32_t *tokens, int32_t n, int32_t *n_cached);
int kvc_pool_prefix_match(const kvc_cache *c, const int32_t *tokens, int32_t n, int32_t *n_matched);
int kvc_pool_remove(kvc_cache *c, int32_t seq, int32_t begin, int32_t end, kvc_shift *shift);
/* Whether a removal from the middle starting at begin can move the tokens after it (seq valid, begin < len):
 * every block from the one holding begin on is present and held by seq alone. */
bool kvc_pool_can_move(const kvc_cache *c, int32_t seq, int32_t begin);
bool kvc_pool_can_resume(const kvc_cache *c, int32_t seq, int32_t pos);
int kvc_pool_reset_prefix_cache(kvc_cache *c);
void kvc_pool_get_stats(const kvc_cache *c, kvc_stats *o);
int kvc_pool_check(const kvc_cache *c, char *msg, size_t msg_len);

static inline int32_t ceil_div(int32_t a, int32_t b) { return a / b + (a % b != 0); }

static inline uint32_t bucket_of(const kvc_cache *c, uint64_t h) {
    return (uint32_t)(h ^ (h >> 32)) & c->bucket_mask;
}

static inline uint64_t chain_hash(const kvc_cache *c, uint64_t parent_hash, const int32_t *tokens) {
    return XXH3_64bits_withSeed(tokens, (size_t)c->lay.block_size * sizeof(int32_t), parent_hash) &
           (uint64_t)KVC_TEST_HASH_MASK;
}

#endif
