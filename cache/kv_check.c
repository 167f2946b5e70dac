/* kv_check.c: the pool's statistics and its invariant checker (kvc_get_stats, kvc_check; see kv_cache.h). */
#include "cache/kvc_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- accounting ------------------------------------------------------------------------------------------------------ */
void kvc_pool_get_stats(const kvc_cache *c, kvc_stats *o) {
    if (!c || !o) return;
    memset(o, 0, sizeof *o);
    o->blocks_total = c->lay.n_blocks;
    o->blocks_used = c->n_used;
    o->blocks_cached = c->n_cached;
    o->blocks_free = c->n_free;
    o->block_size = c->lay.block_size;
    o->seqs_live = c->seqs_live;
    o->bytes_total = c->bytes_total;
    o->bytes_per_block = c->bytes_per_block;
    o->usage = (double)c->n_used / (double)c->lay.n_blocks;
    o->tokens_live = c->tokens_live;
    o->prefix_query_tokens = c->prefix_query_tokens;
    o->prefix_hit_tokens = c->prefix_hit_tokens;
    o->evictions = c->evictions;
    o->cow_copies = c->cow_copies;
}

#define FAIL(...)                                         \
    do {                                                  \
        if (msg && msg_len > 0) snprintf(msg, msg_len, __VA_ARGS__); \
        rc = KVC_ERR_STATE;                               \
        goto out;                                         \
    } while (0)

/* The checks of one live sequence: length, table, published identity chain; counts its block references in
 * refs. Each check function returns KVC_OK or KVC_ERR_STATE with the first broken invariant in msg. */
static int check_seq(const kvc_cache *c, int32_t sid, int32_t *refs, char *msg, size_t msg_len) {
    int rc = KVC_OK;
    int32_t nb = c->lay.n_blocks, bs = c->lay.block_size;
    const kvc_seq *s = &c->seqs[sid];
    if (s->len < 0 || s->pending < 0 || (!c->pending && s->pending))
        FAIL("seq %d: bad len %d / pending %d", sid, s->len, s->pending);
    if (s->in_batch != (c->pending && s->pending > 0)) FAIL("seq %d: batch flag mismatch", sid);
    if (s->n_table != ceil_div(s->len + s->pending, bs))
        FAIL("seq %d: %d table entries for %d tokens", sid, s->n_table, s->len + s->pending);
    if (s->n_pub < 0 || s->n_pub > s->len / bs) FAIL("seq %d: n_pub %d", sid, s->n_pub);
    if (c->p.max_seq_len > 0 && s->len + s->pending > c->p.max_seq_len) FAIL("seq %d: too long", sid);
    bool released = true;
    for (int32_t i = 0; i < s->n_table; i++) {
        int32_t b = s->table[i];
        if (b < -1 || b >= nb) FAIL("seq %d: table[%d] = %d out of range", sid, i, b);
        if (b == -1) {
            if (c->p.sliding_window <= 0) FAIL("seq %d: released block without a window", sid);
            if (!released) FAIL("seq %d: released block %d after a held one", sid, i);
            continue;
        }
        released = false;
        refs[b]++;
    }
    if (s->cow_idx >= 0 && s->cow_orig >= 0) refs[s->cow_orig]++;
    if (!c->pending && s->cow_idx >= 0) FAIL("seq %d: CoW record without a forward", sid);
    for (int32_t i = 0; i < s->n_pub; i++) {
        int32_t b = s->pub_block[i];
        if (b < 0 || b >= nb) FAIL("seq %d: pub[%d] = %d", sid, i, b);
        const kvc_block *bl = &c->blocks[b];
        bool valid = bl->hashed && bl->gen == s->pub_gen[i];
        if (s->table[i] >= 0 && s->table[i] != b && !(c->pending && i == s->cow_idx))
            FAIL("seq %d: block %d at %d differs from its published identity %d", sid, s->table[i], i, b);
        if (s->table[i] >= 0 && !valid) FAIL("seq %d: held published block %d lost its hash", sid, b);
        if (valid) {
            if (memcmp(c->btok + (size_t)b * bs, s->tokens + (size_t)i * bs, (size_t)bs * 4) != 0)
                FAIL("seq %d: block %d tokens differ from the sequence", sid, b);
            int32_t want_parent = i ? s->pub_block[i - 1] : -1;
            if (bl->parent != want_parent) FAIL("seq %d: block %d has parent %d, chain says %d", sid, b,
                                                bl->parent, want_parent);
        }
        if ((int64_t)(i + 1) * bs > s->dirty_from) FAIL("seq %d: dirty block %d published", sid, i);
    }
out:
    return rc;
}

/* Every sequence, then the pool's counters of sequences and tokens; counts block references in refs. */
static int check_seqs(const kvc_cache *c, int32_t *refs, char *msg, size_t msg_len) {
    int rc = KVC_OK;
    int32_t live = 0, batch = 0;
    int64_t tokens = 0;
    for (int32_t sid = 0; sid < c->p.max_seqs; sid++) {
        const kvc_seq *s = &c->seqs[sid];
        if (!s->live) {
            if (s->len || s->pending || s->n_table || s->in_batch) FAIL("seq %d: dead but not empty", sid);
            continue;
        }
        live++;
        tokens += s->len;
        if (s->in_batch) batch++;
        if ((rc = check_seq(c, sid, refs, msg, msg_len)) != KVC_OK) goto out;
    }
    if (live != c->seqs_live) FAIL("seqs_live %d, counted %d", c->seqs_live, live);
    if (tokens != c->tokens_live) FAIL("tokens_live %lld, counted %lld", (long long)c->tokens_live,
                                       (long long)tokens);
    if (batch != (c->pending ? c->n_batch_seqs : 0)) FAIL("batch list has %d, flags %d", c->n_batch_seqs, batch);
out:
    return rc;
}

/* Blocks: refcounts against the references counted, hashes against their parents and tokens. */
static int check_blocks(const kvc_cache *c, const int32_t *refs, char *msg, size_t msg_len) {
    int rc = KVC_OK;
    int32_t nb = c->lay.n_blocks, bs = c->lay.block_size, used = 0, hashed = 0;
    for (int32_t b = 0; b < nb; b++) {
        const kvc_block *bl = &c->blocks[b];
        if (bl->ref != refs[b]) FAIL("block %d: refcount %d, referenced %d times", b, bl->ref, refs[b]);
        if (bl->ref > 0) used++;
        if (bl->hashed) {
            hashed++;
            if (!c->p.prefix_caching) FAIL("block %d hashed without prefix caching", b);
            if (bl->parent >= nb || bl->parent < -1) FAIL("block %d: parent %d", b, bl->parent);
            uint64_t ph = KVC_HASH_ROOT;
            bool known = true;
            if (bl->parent >= 0) {
                const kvc_block *pb = &c->blocks[bl->parent];
                known = pb->hashed && pb->gen == bl->parent_gen;
                ph = pb->hash;
            }
            if (known && chain_hash(c, ph, c->btok + (size_t)b * bs) != bl->hash)
                FAIL("block %d: stored hash does not match parent and tokens", b);
        }
    }
    if (used != c->n_used) FAIL("n_used %d, counted %d", c->n_used, used);
    if (hashed != c->n_hashed) FAIL("n_hashed %d, counted %d", c->n_hashed, hashed);
out:
    return rc;
}

/* The LRU list and the free stack: every unreferenced block in exactly one of them (seen marks them). */
static int check_lists(const kvc_cache *c, uint8_t *seen, char *msg, size_t msg_len) {
    int rc = KVC_OK;
    int32_t nb = c->lay.n_blocks, ncached = 0, prev = -1;
    for (int32_t b = c->lru_head; b >= 0; b = c->blocks[b].lnext) {
        if (b >= nb || seen[b]) FAIL("LRU list: block %d repeated or out of range", b);
        seen[b] = 1;
        const kvc_block *bl = &c->blocks[b];
        if (bl->ref != 0 || !bl->hashed) FAIL("LRU block %d: ref %d hashed %d", b, bl->ref, bl->hashed);
        if (bl->lprev != prev) FAIL("LRU block %d: prev link %d, expected %d", b, bl->lprev, prev);
        prev = b;
        ncached++;
    }
    if (prev != c->lru_tail) FAIL("LRU tail %d, walked to %d", c->lru_tail, prev);
    if (ncached != c->n_cached) FAIL("n_cached %d, LRU holds %d", c->n_cached, ncached);
    if (c->n_free < 0 || c->n_free > nb) FAIL("n_free %d", c->n_free);
    for (int32_t i = 0; i < c->n_free; i++) {
        int32_t b = c->free_stack[i];
        if (b < 0 || b >= nb || seen[b]) FAIL("free stack: block %d repeated or out of range", b);
        seen[b] = 2;
        if (c->blocks[b].ref != 0 || c->blocks[b].hashed) FAIL("free block %d is referenced or hashed", b);
    }
    for (int32_t b = 0; b < nb; b++) {
        const kvc_block *bl = &c->blocks[b];
        if (bl->ref == 0 && !seen[b]) FAIL("block %d: unreferenced but neither cached nor free", b);
    }
    if (c->n_used + c->n_cached + c->n_free != nb)
        FAIL("used %d + cached %d + free %d != total %d", c->n_used, c->n_cached, c->n_free, nb);
out:
    return rc;
}

/* The hash index: every chained block hashed and in the right bucket, links consistent. */
static int check_index(const kvc_cache *c, char *msg, size_t msg_len) {
    int rc = KVC_OK;
    int32_t nb = c->lay.n_blocks, indexed = 0;
    for (uint32_t k = 0; k <= c->bucket_mask; k++) {
        int32_t hp = -1;
        for (int32_t b = c->buckets[k]; b >= 0; b = c->blocks[b].hnext) {
            if (b >= nb || indexed > nb) FAIL("hash chain %u broken", k);
            const kvc_block *bl = &c->blocks[b];
            if (!bl->hashed || bucket_of(c, bl->hash) != k || bl->hprev != hp)
                FAIL("hash chain %u: block %d misplaced", k, b);
            hp = b;
            indexed++;
        }
    }
    if (indexed != c->n_hashed) FAIL("index holds %d blocks, %d hashed", indexed, c->n_hashed);
out:
    return rc;
}

int kvc_pool_check(const kvc_cache *c, char *msg, size_t msg_len) {
    if (!c) return KVC_ERR_INVALID;
    if (msg && msg_len > 0) msg[0] = '\0';
    int32_t nb = c->lay.n_blocks;
    int32_t *refs = calloc((size_t)nb, sizeof *refs);
    uint8_t *seen = calloc((size_t)nb, 1);
    int rc = !refs || !seen ? KVC_ERR_NOMEM : check_seqs(c, refs, msg, msg_len);
    if (rc == KVC_OK) rc = check_blocks(c, refs, msg, msg_len);
    if (rc == KVC_OK) rc = check_lists(c, seen, msg, msg_len);
    if (rc == KVC_OK) rc = check_index(c, msg, msg_len);
    free(refs);
    free(seen);
    return rc;
}
