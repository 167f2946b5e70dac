/*
 * test_kv_cache_collide.c: the whole randomized differential test (test_kv_cache.c) again, against a build
 * of the cache whose prefix hashes keep only 2 bits, so nearly every lookup meets colliding hashes. Results
 * must stay exact: the cache verifies a candidate's tokens and parent identity, never the hash alone.
 *
 * This file compiles cache/kv_cache.c, cache/kv_check.c and cache/kv_group.c itself (with KVC_TEST_HASH_MASK);
 * its definitions take precedence over the kvcache library's, whose objects the linker then does not pull in.
 */
#define KVC_TEST_HASH_MASK 0x3ULL
#include "../../cache/kv_cache.c"
#include "../../cache/kv_check.c"
#include "../../cache/kv_group.c"

#define KVCT_SUITE kv_cache_collide
#include "test_kv_cache.c"

/* The hook is in effect: prefix hashes of this build have 2 bits, so collisions are everywhere. */
Test(kv_cache_collide, hashes_are_narrow) {
    kvc_params p;
    kvc_params_default(&p);
    p.n_layer = p.n_kv_head = 1;
    p.head_dim = 4;
    p.block_size = 2;
    p.n_blocks = 4;
    p.max_seqs = 1;
    p.max_batch_tokens = 4;
    kvc_cache *c = NULL;
    cr_assert_eq(kvc_create(&p, &c), 0);
    int32_t toks[2] = {0, 0};
    bool seen[4] = {false};
    for (int32_t i = 0; i < 64; i++) {
        toks[0] = i;
        uint64_t h = chain_hash(c, KVC_HASH_ROOT, toks);
        cr_assert_lt(h, 4u);
        seen[h] = true;
    }
    cr_assert(seen[0] && seen[1] && seen[2] && seen[3]);
    kvc_free(c);
}
