/*
 * kv_cache.c: the paged KV block pool (see kv_cache.h for the contract).
 *
 * Bookkeeping, all O(1) per block operation:
 *   - blocks[]: refcount, prefix-cache identity (hash, parent block + its generation), links for the hash
 *     index (chained, doubly linked per bucket) and for the LRU list of cached blocks;
 *   - a free stack of block ids (refcount 0, not hashed);
 *   - the LRU list (refcount 0, hashed): head = least recently used, evicted first;
 *   - per sequence: token ids, block table, the chain of published block identities, pending batch state.
 *
 * Prefix identity. A hashed block stands for "these block_size tokens following exactly this parent
 * block". Its key in the index is the chained hash XXH3_64bits_withSeed(tokens, parent hash). Lookups do
 * not trust the hash alone: a candidate must have the same token ids (kept per block in btok[]) and the same
 * parent block id and generation. A block's generation is bumped every time it loses its hash, so a parent
 * reference is valid only while the parent still holds the identity it had when the child was published.
 * By induction from the first block (parent -1) a match is exact, whatever 64-bit hash collisions occur.
 * (Generations are 32-bit; a stale reference could only revive after 2^32 unhash events of one block.)
 *
 * Publishing (kvc_finish_forward ok): a sequence's full blocks are published in order, each only when its
 * parent is published. If an identical block is already hashed, the sequence switches to that block and
 * drops its own copy (deduplication), so concurrent identical prompts converge on one chain. Blocks whose
 * contents came from a context shift (kvc_remove from the middle) are never published (dirty_from).
 *
 * References: a block's refcount counts the sequence tables that hold it plus, while a forward is pending,
 * the original of a copy-on-write (held so a rollback can restore it).
 */
#include "cache/kvc_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers --------------------------------------------------------------------------------------- */

size_t kvc_row_bytes(kvc_dtype dtype, int32_t head_dim) {
    if (head_dim < 1) return 0;
    switch (dtype) {
    case KVC_DTYPE_F32: return (size_t)head_dim * 4;
    case KVC_DTYPE_F16: return (size_t)head_dim * 2;
    case KVC_DTYPE_Q8_0: return head_dim % 32 == 0 ? (size_t)(head_dim / 32) * 34 : 0;
    default: return 0;
    }
}

void kvc_params_default(kvc_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->block_size = 16;
    p->dtype = KVC_DTYPE_F16;
    p->prefix_caching = true;
    p->max_seq_len = 0;
    p->sliding_window = 0;
    p->allocator = NULL;
}

static bool mul_ok(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return false;
    *out = a * b;
    return true;
}


static bool seq_ok(const kvc_cache *c, int32_t seq) {
    return c && seq >= 0 && seq < c->p.max_seqs && c->seqs[seq].live;
}

/* A capacity of at least need: cap doubled (first when cap is 0), at most INT32_MAX. */
static int64_t grown_cap(int32_t cap, int32_t need, int32_t first) {
    int64_t c = cap ? (int64_t)cap * 2 : first;
    if (c < need) c = need;
    return c > INT32_MAX ? INT32_MAX : c;
}

/* Grows a sequence's arrays to hold n_tokens tokens (table entries follow). All or nothing. */
static int seq_reserve(kvc_seq *s, int32_t n_tokens, int32_t block_size) {
    if (n_tokens > s->tok_cap) {
        int64_t cap = grown_cap(s->tok_cap, n_tokens, 64);
        int32_t *t = realloc(s->tokens, (size_t)cap * sizeof *t);
        if (!t) return KVC_ERR_NOMEM;
        s->tokens = t;
        s->tok_cap = (int32_t)cap;
    }
    int32_t n_tab = ceil_div(n_tokens, block_size);
    if (n_tab > s->tab_cap) {
        int64_t cap = grown_cap(s->tab_cap, n_tab, 8);
        int32_t *t = realloc(s->table, (size_t)cap * sizeof *t);
        if (!t) return KVC_ERR_NOMEM;
        s->table = t;
        int32_t *pb = realloc(s->pub_block, (size_t)cap * sizeof *pb);
        if (!pb) return KVC_ERR_NOMEM; /* table grew, harmless: capacity is tracked by tab_cap */
        s->pub_block = pb;
        uint32_t *pg = realloc(s->pub_gen, (size_t)cap * sizeof *pg);
        if (!pg) return KVC_ERR_NOMEM;
        s->pub_gen = pg;
        s->tab_cap = (int32_t)cap;
    }
    return KVC_OK;
}

/* ---- hash index ----------------------------------------------------------------------------------------- */
static void index_insert(kvc_cache *c, int32_t b) {
    kvc_block *bl = &c->blocks[b];
    uint32_t k = (uint32_t)(bl->hash ^ (bl->hash >> 32)) & c->bucket_mask;
    bl->hprev = -1;
    bl->hnext = c->buckets[k];
    if (bl->hnext >= 0) c->blocks[bl->hnext].hprev = b;
    c->buckets[k] = b;
    bl->hashed = true;
    c->n_hashed++;
}


/* Removes b's hash (it must be hashed); bumps its generation so children referring to it go stale. evicted: the
 * block is being taken for reuse with its contents still intact (the event then carries its identity, so that a
 * lower tier may copy it). */
static void index_remove(kvc_cache *c, int32_t b, bool evicted) {
    kvc_block *bl = &c->blocks[b];
    if (bl->hprev >= 0) c->blocks[bl->hprev].hnext = bl->hnext;
    else c->buckets[bucket_of(c, bl->hash)] = bl->hnext;
    if (bl->hnext >= 0) c->blocks[bl->hnext].hprev = bl->hprev;
    bl->hprev = bl->hnext = -1;
    bl->hashed = false;
    bl->gen++;
    c->n_hashed--;
    if (c->event_cb) {
        kvc_event ev = {.kind = KVC_EVENT_REMOVED, .block = b, .hash = bl->hash, .block_size = c->lay.block_size};
        if (evicted) {
            ev.evicted = true;
            ev.has_parent = bl->parent >= 0;
            ev.parent_hash = bl->parent >= 0 ? bl->parent_hash : 0;
            ev.tokens = c->btok + (size_t)b * c->lay.block_size;
        }
        c->event_cb(c->event_ctx, &ev);
    }
}

/* The hashed block with identity (parent, parent_gen, tokens), or -1. */
static int32_t index_find(const kvc_cache *c, uint64_t h, int32_t parent, uint32_t parent_gen,
                          const int32_t *tokens) {
    int32_t bs = c->lay.block_size;
    for (int32_t b = c->buckets[bucket_of(c, h)]; b >= 0; b = c->blocks[b].hnext) {
        const kvc_block *bl = &c->blocks[b];
        if (bl->hash != h || bl->parent != parent) continue;
        if (parent >= 0 && bl->parent_gen != parent_gen) continue;
        if (memcmp(c->btok + (size_t)b * bs, tokens, (size_t)bs * sizeof(int32_t)) != 0) continue;
        return b;
    }
    return -1;
}


/* ---- LRU list and block states ---------------------------------------------------------------------------- */
static void lru_unlink(kvc_cache *c, int32_t b) {
    kvc_block *bl = &c->blocks[b];
    if (bl->lprev >= 0) c->blocks[bl->lprev].lnext = bl->lnext;
    else c->lru_head = bl->lnext;
    if (bl->lnext >= 0) c->blocks[bl->lnext].lprev = bl->lprev;
    else c->lru_tail = bl->lprev;
    bl->lprev = bl->lnext = -1;
}

static void lru_push_mru(kvc_cache *c, int32_t b) {
    kvc_block *bl = &c->blocks[b];
    bl->lnext = -1;
    bl->lprev = c->lru_tail;
    if (c->lru_tail >= 0) c->blocks[c->lru_tail].lnext = b;
    else c->lru_head = b;
    c->lru_tail = b;
}

/* Takes a block for exclusive use (refcount 1, unhashed): a free one, else the least recently used cached
 * one. Returns -1 when none is available. */
static int32_t block_take(kvc_cache *c) {
    int32_t b;
    if (c->n_free > 0) {
        b = c->free_stack[--c->n_free];
    } else if (c->lru_head >= 0) {
        b = c->lru_head;
        lru_unlink(c, b);
        index_remove(c, b, true);
        c->n_cached--;
        c->evictions++;
    } else {
        return -1;
    }
    c->blocks[b].ref = 1;
    c->n_used++;
    return b;
}

/* Adds a reference to a used or cached block. */
static void block_ref(kvc_cache *c, int32_t b) {
    kvc_block *bl = &c->blocks[b];
    if (bl->ref == 0) { /* cached: leaves the LRU list */
        lru_unlink(c, b);
        c->n_cached--;
        c->n_used++;
    }
    bl->ref++;
}

/* Drops a reference; at zero a hashed block becomes cached (most recently used), others free. */
static void block_unref(kvc_cache *c, int32_t b) {
    kvc_block *bl = &c->blocks[b];
    if (--bl->ref > 0) return;
    c->n_used--;
    if (bl->hashed) {
        lru_push_mru(c, b);
        c->n_cached++;
    } else {
        c->free_stack[c->n_free++] = b;
    }
}

/* Copies block src to dst in every layer, K and V. */
static int block_copy(kvc_cache *c, int32_t dst, int32_t src) {
    const kvc_layout *l = &c->lay;
    for (int32_t i = 0; i < 2 * l->n_layer; i++) {
        char *region = (char *)l->base + (size_t)i * l->layer_bytes;
        if (c->alloc->copy(c->alloc->ctx, region + (size_t)dst * l->block_stride,
                           region + (size_t)src * l->block_stride, l->block_stride) != 0)
            return KVC_ERR_NOMEM;
    }
    c->cow_copies++;
    return KVC_OK;
}

/* ---- creation -------------------------------------------------------------------------------------------- */
int kvc_pool_create(const kvc_params *params, kvc_cache **out) {
    if (!params || !out) return KVC_ERR_INVALID;
    *out = NULL;
    kvc_params p = *params;
    if (p.block_size == 0) p.block_size = 16;
    if (p.n_layer < 1 || p.n_kv_head < 1 || p.head_dim < 1 || p.block_size < 1 || p.n_blocks < 0 ||
        p.max_seqs < 1 || p.max_batch_tokens < 1 || p.max_seq_len < 0 || p.sliding_window < 0)
        return KVC_ERR_INVALID;
    if (p.dtype != KVC_DTYPE_F32 && p.dtype != KVC_DTYPE_F16 && p.dtype != KVC_DTYPE_Q8_0)
        return KVC_ERR_INVALID;
    size_t row = kvc_row_bytes(p.dtype, p.head_dim);
    if (row == 0) return KVC_ERR_INVALID;
    size_t head_stride, block_stride, per_block;
    if (!mul_ok(row, (size_t)p.block_size, &head_stride) ||
        !mul_ok(head_stride, (size_t)p.n_kv_head, &block_stride) ||
        !mul_ok(block_stride, 2 * (size_t)p.n_layer, &per_block))
        return KVC_ERR_INVALID;
    /* Slots (block * block_size + offset) are int32. */
    int32_t max_blocks = INT32_MAX / p.block_size;
    if (p.n_blocks == 0) {
        size_t nb = p.mem_bytes / per_block;
        if (nb < 1) return KVC_ERR_INVALID;
        p.n_blocks = nb > (size_t)max_blocks ? max_blocks : (int32_t)nb;
    }
    if (p.n_blocks > max_blocks) return KVC_ERR_INVALID;
    size_t layer_bytes, total;
    if (!mul_ok(block_stride, (size_t)p.n_blocks, &layer_bytes) ||
        !mul_ok(per_block, (size_t)p.n_blocks, &total))
        return KVC_ERR_INVALID;
    const kvc_allocator *a = p.allocator ? p.allocator : kvc_host_allocator();
    if (!a->alloc || !a->copy || !a->free) return KVC_ERR_INVALID;
    p.allocator = a;

    kvc_cache *c = calloc(1, sizeof *c);
    if (!c) return KVC_ERR_NOMEM;
    c->p = p;
    c->alloc = a;
    c->bytes_per_block = per_block;
    c->bytes_total = total;
    c->lru_head = c->lru_tail = -1;
    uint32_t nbuckets = 1;
    while (nbuckets < (uint32_t)p.n_blocks && nbuckets < (1u << 30)) nbuckets <<= 1;
    c->bucket_mask = nbuckets - 1;
    c->blocks = calloc((size_t)p.n_blocks, sizeof *c->blocks);
    c->free_stack = malloc((size_t)p.n_blocks * sizeof *c->free_stack);
    c->buckets = malloc((size_t)nbuckets * sizeof *c->buckets);
    c->seqs = calloc((size_t)p.max_seqs, sizeof *c->seqs);
    c->batch_seqs = malloc((size_t)p.max_seqs * sizeof *c->batch_seqs);
    if (p.prefix_caching) {
        size_t n;
        if (mul_ok((size_t)p.n_blocks, (size_t)p.block_size * sizeof(int32_t), &n)) c->btok = malloc(n);
    }
    if (!c->blocks || !c->free_stack || !c->buckets || !c->seqs || !c->batch_seqs ||
        (p.prefix_caching && !c->btok)) {
        kvc_pool_free(c);
        return KVC_ERR_NOMEM;
    }
    void *base = a->alloc(a->ctx, total);
    if (!base) {
        kvc_pool_free(c);
        return KVC_ERR_NOMEM;
    }
    c->lay = (kvc_layout){p.n_layer, p.n_kv_head, p.head_dim, p.block_size, p.n_blocks, p.dtype,
                          row, head_stride, block_stride, layer_bytes, base};
    for (uint32_t i = 0; i < nbuckets; i++) c->buckets[i] = -1;
    for (int32_t b = 0; b < p.n_blocks; b++) {
        c->blocks[b] = (kvc_block){0, 0, false, 0, -1, 0, 0, -1, -1, -1, -1};
        c->free_stack[b] = p.n_blocks - 1 - b; /* pops give 0, 1, 2, ... */
    }
    c->n_free = p.n_blocks;
    for (int32_t s = 0; s < p.max_seqs; s++) {
        c->seqs[s].dirty_from = INT32_MAX;
        c->seqs[s].cow_idx = -1;
        c->seqs[s].cow_orig = -1;
    }
    *out = c;
    return KVC_OK;
}

void kvc_pool_free(kvc_cache *c) {
    if (!c) return;
    if (c->lay.base) c->alloc->free(c->alloc->ctx, c->lay.base);
    if (c->seqs) {
        for (int32_t s = 0; s < c->p.max_seqs; s++) {
            KVS_FREE_ALL(c->seqs[s].tokens, c->seqs[s].table, c->seqs[s].pub_block, c->seqs[s].pub_gen);
        }
    }
    KVS_FREE_ALL(c->seqs, c->batch_seqs, c->blocks, c->btok, c->free_stack, c->buckets, c);
}

void kvc_get_layout(const kvc_cache *c, kvc_layout *out) {
    if (!c || !out) return;
    *out = c->lay;
}

/* ---- slots ------------------------------------------------------------------------------------------------- */
int kvc_pool_seq_alloc(kvc_cache *c, int32_t *seq_out) {
    if (!c || !seq_out) return KVC_ERR_INVALID;
    if (c->pending) return KVC_ERR_STATE;
    for (int32_t s = 0; s < c->p.max_seqs; s++) {
        kvc_seq *q = &c->seqs[s];
        if (q->live) continue;
        q->live = true;
        q->len = q->pending = q->n_table = q->n_pub = 0;
        q->dirty_from = INT32_MAX;
        q->cow_idx = q->cow_orig = -1;
        q->in_batch = false;
        c->seqs_live++;
        *seq_out = s;
        return KVC_OK;
    }
    return KVC_ERR_NO_SLOT;
}

/* Releases table entries [from, n_table), last first (so earlier blocks end up more recently used and
 * children are evicted before their parents). */
static void seq_release_from(kvc_cache *c, kvc_seq *s, int32_t from) {
    for (int32_t i = s->n_table - 1; i >= from; i--)
        if (s->table[i] >= 0) block_unref(c, s->table[i]);
    if (s->n_table > from) s->n_table = from;
}

int kvc_pool_seq_free(kvc_cache *c, int32_t seq) {
    if (!c) return KVC_ERR_INVALID;
    if (!seq_ok(c, seq)) return KVC_ERR_BAD_SEQ;
    if (c->pending) return KVC_ERR_STATE;
    kvc_seq *s = &c->seqs[seq];
    seq_release_from(c, s, 0);
    c->tokens_live -= s->len;
    s->len = s->pending = s->n_pub = 0;
    s->live = false;
    c->seqs_live--;
    /* Give back memory of very long sequences; small arrays are kept for reuse. */
    if (s->tok_cap > 65536) {
        KVS_FREE_ALL(s->tokens, s->table, s->pub_block, s->pub_gen);
        s->tokens = s->table = s->pub_block = NULL;
        s->pub_gen = NULL;
        s->tok_cap = s->tab_cap = 0;
    }
    return KVC_OK;
}

bool kvc_seq_is_live(const kvc_cache *c, int32_t seq) { return seq_ok(c, seq); }

int32_t kvc_seq_len(const kvc_cache *c, int32_t seq) { return seq_ok(c, seq) ? c->seqs[seq].len : 0; }

/* ---- publishing and the sliding window -------------------------------------------------------------------- */
/* Publishes the sequence's full committed blocks after its known identity chain (see the file comment). */
static void seq_publish(kvc_cache *c, kvc_seq *s) {
    if (!c->p.prefix_caching) return;
    int32_t bs = c->lay.block_size;
    int32_t limit = s->len < s->dirty_from ? s->len : s->dirty_from;
    while ((int64_t)(s->n_pub + 1) * bs <= limit) {
        int32_t i = s->n_pub;
        int32_t b = s->table[i];
        if (b < 0) return; /* released by the window before it could be published */
        int32_t parent = -1;
        uint32_t pgen = 0;
        uint64_t phash = KVC_HASH_ROOT;
        if (i > 0) {
            parent = s->pub_block[i - 1];
            pgen = s->pub_gen[i - 1];
            const kvc_block *pb = &c->blocks[parent];
            if (!pb->hashed || pb->gen != pgen) return; /* parent lost its identity: chain ends here */
            phash = pb->hash;
        }
        kvc_block *bl = &c->blocks[b];
        const int32_t *toks = s->tokens + (size_t)i * bs;
        if (bl->hashed) {
            /* Shared with a sequence that published it first: adopt its identity if it is ours. */
            if (bl->parent != parent || (parent >= 0 && bl->parent_gen != pgen) ||
                memcmp(c->btok + (size_t)b * bs, toks, (size_t)bs * sizeof(int32_t)) != 0)
                return;
        } else {
            uint64_t h = chain_hash(c, phash, toks);
            int32_t same = index_find(c, h, parent, pgen, toks);
            if (same >= 0) { /* deduplicate onto the existing block */
                block_ref(c, same);
                s->table[i] = same;
                block_unref(c, b);
                b = same;
            } else {
                bl->hash = h;
                bl->parent = parent;
                bl->parent_gen = pgen;
                bl->parent_hash = parent >= 0 ? phash : 0;
                memcpy(c->btok + (size_t)b * bs, toks, (size_t)bs * sizeof(int32_t));
                index_insert(c, b);
                if (c->event_cb) {
                    kvc_event ev = {.kind = KVC_EVENT_STORED, .block = b, .hash = h, .has_parent = parent >= 0,
                                    .parent_hash = parent >= 0 ? phash : 0, .tokens = c->btok + (size_t)b * bs,
                                    .block_size = bs};
                    c->event_cb(c->event_ctx, &ev);
                }
            }
        }
        s->pub_block[i] = b;
        s->pub_gen[i] = c->blocks[b].gen;
        s->n_pub++;
    }
}

/* Releases blocks wholly before the window of the next position (len): block i goes when
 * (i + 1) * block_size <= len - sliding_window. Released entries read -1 and form a leading run. */
static void seq_window_release(kvc_cache *c, kvc_seq *s) {
    int32_t w = c->p.sliding_window;
    if (w <= 0 || s->len <= w) return;
    int32_t limit = (s->len - w) / c->lay.block_size; /* blocks [0, limit) are wholly outside */
    if (limit > s->n_table) limit = s->n_table;
    for (int32_t i = limit - 1; i >= 0 && s->table[i] >= 0; i--) {
        block_unref(c, s->table[i]);
        s->table[i] = -1;
    }
}

/* ---- the forward protocol ------------------------------------------------------------------------------------ */
static int32_t seq_blocks_needed(const kvc_cache *c, const kvc_seq *s, int32_t n_tokens) {
    if (n_tokens <= 0) return 0;
    int32_t bs = c->lay.block_size;
    int64_t cur = (int64_t)s->len + s->pending;
    int64_t new_tab = (cur + n_tokens + bs - 1) / bs;
    int64_t need = new_tab - s->n_table;
    if (cur % bs != 0) {
        int32_t last = s->table[s->n_table - 1];
        if (last < 0 || c->blocks[last].ref > 1 || c->blocks[last].hashed) need++;
    }
    return need > INT32_MAX ? INT32_MAX : (int32_t)need;
}

static void batch_clear_flags(kvc_cache *c) {
    for (int32_t i = 0; i < c->n_batch_seqs; i++) {
        kvc_seq *s = &c->seqs[c->batch_seqs[i]];
        s->in_batch = false;
        s->batch_n = 0;
    }
    c->n_batch_seqs = 0;
}

/* Undoes whatever the pending batch applied (tables, pending tokens, CoW). */
static void batch_rollback(kvc_cache *c) {
    for (int32_t k = c->n_batch_seqs - 1; k >= 0; k--) {
        kvc_seq *s = &c->seqs[c->batch_seqs[k]];
        seq_release_from(c, s, s->old_n_table);
        if (s->cow_idx >= 0) {
            int32_t copy = s->table[s->cow_idx];
            if (copy >= 0) block_unref(c, copy);
            s->table[s->cow_idx] = s->cow_orig; /* its reference was held for this */
        }
        s->cow_idx = s->cow_orig = -1;
        s->pending = 0;
    }
    batch_clear_flags(c);
    c->pending = false;
}

int kvc_pool_start_forward(kvc_cache *c, const kvc_entry *entries, int32_t n, int32_t *slots_out) {
    if (!c || !entries || !slots_out || n < 1) return KVC_ERR_INVALID;
    if (c->pending) return KVC_ERR_STATE;
    if (n > c->p.max_batch_tokens) return KVC_ERR_TOO_LARGE;
    int32_t bs = c->lay.block_size;
    int rc = KVC_OK;
    c->n_batch_seqs = 0;
    /* 1. validate every entry */
    for (int32_t i = 0; i < n; i++) {
        int32_t sid = entries[i].seq;
        if (!seq_ok(c, sid)) { rc = KVC_ERR_BAD_SEQ; break; }
        kvc_seq *s = &c->seqs[sid];
        if (!s->in_batch) {
            s->in_batch = true;
            s->batch_n = 0;
            c->batch_seqs[c->n_batch_seqs++] = sid;
        }
        if ((int64_t)entries[i].pos != (int64_t)s->len + s->batch_n) { rc = KVC_ERR_POSITION; break; }
        if (s->batch_n == 0 && !kvc_pool_can_resume(c, sid, s->len)) { rc = KVC_ERR_POSITION; break; }
        if (entries[i].pos == INT32_MAX ||
            (c->p.max_seq_len > 0 && entries[i].pos >= c->p.max_seq_len)) { rc = KVC_ERR_TOO_LARGE; break; }
        s->batch_n++;
    }
    /* 2. count blocks and reserve host memory */
    int64_t need = 0;
    for (int32_t k = 0; rc == KVC_OK && k < c->n_batch_seqs; k++) {
        kvc_seq *s = &c->seqs[c->batch_seqs[k]];
        need += seq_blocks_needed(c, s, s->batch_n);
        rc = seq_reserve(s, s->len + s->batch_n, bs);
    }
    if (rc == KVC_OK && need > (int64_t)c->n_free + c->n_cached) rc = KVC_ERR_FULL;
    if (rc != KVC_OK) {
        batch_clear_flags(c);
        return rc;
    }
    /* 3. apply: copy-on-write of partial last blocks, then slots (new blocks on demand) */
    c->pending = true;
    for (int32_t k = 0; k < c->n_batch_seqs; k++) {
        kvc_seq *s = &c->seqs[c->batch_seqs[k]];
        s->old_n_table = s->n_table;
        s->cow_idx = s->cow_orig = -1;
        s->pending = 0;
    }
    for (int32_t k = 0; k < c->n_batch_seqs; k++) {
        kvc_seq *s = &c->seqs[c->batch_seqs[k]];
        if (s->len % bs == 0) continue;
        int32_t idx = s->n_table - 1, last = s->table[idx];
        if (last >= 0 && c->blocks[last].ref == 1 && !c->blocks[last].hashed) continue;
        int32_t nb = block_take(c); /* cannot fail: counted above */
        s->cow_idx = idx;
        s->cow_orig = last;
        s->table[idx] = nb;
        if (last >= 0 && block_copy(c, nb, last) != KVC_OK) {
            batch_rollback(c);
            return KVC_ERR_NOMEM;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        kvc_seq *s = &c->seqs[entries[i].seq];
        int32_t pos = entries[i].pos, idx = pos / bs;
        if (idx == s->n_table) s->table[s->n_table++] = block_take(c);
        s->tokens[pos] = entries[i].token;
        s->pending++;
        slots_out[i] = s->table[idx] * bs + pos % bs;
    }
    return KVC_OK;
}

int kvc_pool_finish_forward(kvc_cache *c, bool ok) {
    if (!c) return KVC_ERR_INVALID;
    if (!c->pending) return KVC_ERR_STATE;
    if (!ok) {
        batch_rollback(c);
        return KVC_OK;
    }
    for (int32_t k = 0; k < c->n_batch_seqs; k++) {
        kvc_seq *s = &c->seqs[c->batch_seqs[k]];
        if (s->cow_idx >= 0 && s->cow_orig >= 0) block_unref(c, s->cow_orig);
        s->cow_idx = s->cow_orig = -1;
        s->len += s->pending;
        c->tokens_live += s->pending;
        s->pending = 0;
        seq_publish(c, s);
        seq_window_release(c, s);
    }
    batch_clear_flags(c);
    c->pending = false;
    return KVC_OK;
}

/* ---- block tables ----------------------------------------------------------------------------------------------- */
int kvc_block_table(const kvc_cache *c, int32_t seq, const int32_t **blocks, int32_t *n_blocks, int32_t *len) {
    if (!seq_ok(c, seq)) return KVC_ERR_BAD_SEQ;
    const kvc_seq *s = &c->seqs[seq];
    if (blocks) *blocks = s->table;
    if (n_blocks) *n_blocks = s->n_table;
    if (len) *len = s->len + s->pending;
    return KVC_OK;
}

int32_t kvc_block_refcount(const kvc_cache *c, int32_t block) {
    if (!c || block < 0 || block >= c->lay.n_blocks) return KVC_ERR_INVALID;
    return c->blocks[block].ref;
}

/* ---- sharing ---------------------------------------------------------------------------------------------------- */
int kvc_pool_copy_prefix(kvc_cache *c, int32_t src, int32_t dst, int32_t len) {
    if (!c) return KVC_ERR_INVALID;
    if (!seq_ok(c, src) || !seq_ok(c, dst)) return KVC_ERR_BAD_SEQ;
    if (c->pending) return KVC_ERR_STATE;
    kvc_seq *s = &c->seqs[src], *d = &c->seqs[dst];
    if (src == dst || d->len != 0 || len < 0 || len > s->len) return KVC_ERR_INVALID;
    if (len == 0) return KVC_OK;
    int32_t bs = c->lay.block_size;
    int32_t nfull = len / bs, ntab = ceil_div(len, bs);
    if (seq_reserve(d, len, bs) != KVC_OK) return KVC_ERR_NOMEM;
    int32_t copy = -1;
    if (ntab > nfull && s->table[nfull] >= 0) { /* partial last block: private copy */
        copy = block_take(c);
        if (copy < 0) return KVC_ERR_FULL;
        if (block_copy(c, copy, s->table[nfull]) != KVC_OK) {
            block_unref(c, copy);
            return KVC_ERR_NOMEM;
        }
    }
    for (int32_t i = 0; i < nfull; i++) {
        d->table[i] = s->table[i];
        if (d->table[i] >= 0) block_ref(c, d->table[i]);
    }
    if (ntab > nfull) d->table[nfull] = copy;
    d->n_table = ntab;
    memcpy(d->tokens, s->tokens, (size_t)len * sizeof(int32_t));
    d->n_pub = s->n_pub < nfull ? s->n_pub : nfull;
    memcpy(d->pub_block, s->pub_block, (size_t)d->n_pub * sizeof(int32_t));
    memcpy(d->pub_gen, s->pub_gen, (size_t)d->n_pub * sizeof(uint32_t));
    d->dirty_from = s->dirty_from < len ? s->dirty_from : INT32_MAX;
    d->len = len;
    c->tokens_live += len;
    return KVC_OK;
}

/* Walks the cached chain for tokens: writes up to max_blocks matching block ids to out (may be NULL) and
 * returns how many matched. */
static int32_t prefix_walk(const kvc_cache *c, const int32_t *tokens, int32_t n, int32_t *out) {
    if (!c->p.prefix_caching || n <= 0) return 0;
    int32_t bs = c->lay.block_size;
    int32_t nb = n / bs;
    if (c->p.max_seq_len > 0 && nb > c->p.max_seq_len / bs) nb = c->p.max_seq_len / bs;
    int32_t parent = -1;
    uint32_t pgen = 0;
    uint64_t phash = KVC_HASH_ROOT;
    int32_t i = 0;
    for (; i < nb; i++) {
        const int32_t *toks = tokens + (size_t)i * bs;
        uint64_t h = chain_hash(c, phash, toks);
        int32_t b = index_find(c, h, parent, pgen, toks);
        if (b < 0) break;
        if (out) out[i] = b;
        parent = b;
        pgen = c->blocks[b].gen;
        phash = h;
    }
    return i;
}

int kvc_pool_attach_prefix(kvc_cache *c, int32_t seq, const int32_t *tokens, int32_t n, int32_t *n_cached) {
    if (!c || !n_cached) return KVC_ERR_INVALID;
    if (!seq_ok(c, seq)) return KVC_ERR_BAD_SEQ;
    if (c->pending) return KVC_ERR_STATE;
    kvc_seq *s = &c->seqs[seq];
    if (s->len != 0 || n < 0 || (n > 0 && !tokens)) return KVC_ERR_INVALID;
    *n_cached = 0;
    c->prefix_query_tokens += (uint64_t)n;
    if (n == 0 || !c->p.prefix_caching) return KVC_OK;
    int32_t bs = c->lay.block_size;
    /* Reserve for every block that could match, then walk straight into the table. */
    int32_t cap = n / bs * bs;
    if (c->p.max_seq_len > 0 && cap > c->p.max_seq_len / bs * bs) cap = c->p.max_seq_len / bs * bs;
    if (cap == 0) return KVC_OK;
    if (seq_reserve(s, cap, bs) != KVC_OK) return KVC_ERR_NOMEM;
    int32_t m = prefix_walk(c, tokens, cap, s->table);
    for (int32_t i = 0; i < m; i++) {
        block_ref(c, s->table[i]);
        s->pub_block[i] = s->table[i];
        s->pub_gen[i] = c->blocks[s->table[i]].gen;
    }
    s->n_table = s->n_pub = m;
    s->len = m * bs;
    memcpy(s->tokens, tokens, (size_t)s->len * sizeof(int32_t));
    s->dirty_from = INT32_MAX;
    c->tokens_live += s->len;
    c->prefix_hit_tokens += (uint64_t)s->len;
    *n_cached = s->len;
    seq_window_release(c, s);
    return KVC_OK;
}

int kvc_pool_prefix_match(const kvc_cache *c, const int32_t *tokens, int32_t n, int32_t *n_matched) {
    if (!c || !n_matched || n < 0 || (n > 0 && !tokens)) return KVC_ERR_INVALID;
    *n_matched = prefix_walk(c, tokens, n, NULL) * c->lay.block_size;
    return KVC_OK;
}

/* ---- removal and resumption ---------------------------------------------------------------------------------------- */
static void seq_truncate(kvc_cache *c, kvc_seq *s, int32_t new_len) {
    int32_t bs = c->lay.block_size;
    seq_release_from(c, s, ceil_div(new_len, bs));
    if (s->n_pub > new_len / bs) s->n_pub = new_len / bs;
    if (new_len <= s->dirty_from) s->dirty_from = INT32_MAX;
    c->tokens_live -= s->len - new_len;
    s->len = new_len;
}

static void *slot_row(const kvc_layout *l, int32_t region, int32_t block, int32_t head, int32_t off) {
    return (char *)l->base + (size_t)region * l->layer_bytes + (size_t)block * l->block_stride +
           (size_t)head * l->head_stride + (size_t)off * l->row_bytes;
}

bool kvc_pool_can_move(const kvc_cache *c, int32_t seq, int32_t begin) {
    /* Middle removal: every block from the one holding begin on must be present and exclusive. */
    const kvc_seq *s = &c->seqs[seq];
    for (int32_t i = begin / c->lay.block_size; i < s->n_table; i++) {
        int32_t b = s->table[i];
        if (b < 0 || c->blocks[b].ref != 1) return false;
    }
    return true;
}

int kvc_pool_remove(kvc_cache *c, int32_t seq, int32_t begin, int32_t end, kvc_shift *shift) {
    if (!c) return KVC_ERR_INVALID;
    if (!seq_ok(c, seq)) return KVC_ERR_BAD_SEQ;
    if (c->pending) return KVC_ERR_STATE;
    if (begin < 0 || end < begin) return KVC_ERR_INVALID;
    kvc_seq *s = &c->seqs[seq];
    int32_t len = s->len, bs = c->lay.block_size;
    if (shift) *shift = (kvc_shift){begin, 0, 0};
    if (begin >= len || end == begin) return KVC_OK;
    if (end >= len) {
        seq_truncate(c, s, begin);
        return KVC_OK;
    }
    if (!kvc_pool_can_move(c, seq, begin)) return KVC_ERR_NOT_SUPPORTED;
    int32_t first = begin / bs;
    int32_t delta = end - begin, n_move = len - end;
    /* Contents from `first` on change (or the blocks go away): drop their hashes. */
    for (int32_t i = first; i < s->n_table; i++)
        if (c->blocks[s->table[i]].hashed) index_remove(c, s->table[i], false);
    if (s->n_pub > first) s->n_pub = first;
    if (s->dirty_from > begin) s->dirty_from = begin;
    const kvc_layout *l = &c->lay;
    int rc = KVC_OK;
    int32_t p = end;
    while (p < len && rc == KVC_OK) {
        int32_t q = p - delta;
        int32_t so = p % bs, dof = q % bs;
        int32_t run = bs - so;
        if (bs - dof < run) run = bs - dof;
        if (len - p < run) run = len - p;
        if (delta < run) run = delta; /* same block: keeps source and destination apart */
        int32_t sb = s->table[p / bs], db = s->table[q / bs];
        for (int32_t r = 0; r < 2 * l->n_layer && rc == KVC_OK; r++)
            for (int32_t h = 0; h < l->n_kv_head; h++) {
                if (c->alloc->copy(c->alloc->ctx, slot_row(l, r, db, h, dof), slot_row(l, r, sb, h, so),
                                   (size_t)run * l->row_bytes) != 0) {
                    rc = KVC_ERR_NOMEM;
                    break;
                }
            }
        if (rc == KVC_OK) {
            memmove(s->tokens + q, s->tokens + p, (size_t)run * sizeof(int32_t));
            p += run;
        }
    }
    if (rc != KVC_OK) {
        /* Rows [begin, q) hold moved data, the rest is mixed: keep only the untouched prefix. */
        seq_truncate(c, s, begin);
        return rc;
    }
    seq_truncate(c, s, len - delta);
    if (shift) *shift = (kvc_shift){begin, n_move, -delta};
    return KVC_OK;
}

bool kvc_pool_can_resume(const kvc_cache *c, int32_t seq, int32_t pos) {
    if (!seq_ok(c, seq) || pos < 0) return false;
    const kvc_seq *s = &c->seqs[seq];
    if (pos > s->len) return false;
    int32_t w = c->p.sliding_window;
    if (w <= 0 || pos == 0) return true;
    /* Released entries form a leading run of the table, so the first block of the window decides. */
    int32_t lo = pos > w ? pos - w : 0;
    return s->table[lo / c->lay.block_size] >= 0;
}

int32_t kvc_blocks_needed(const kvc_cache *c, int32_t seq, int32_t n_tokens) {
    if (!seq_ok(c, seq)) return KVC_ERR_BAD_SEQ;
    if (n_tokens < 0) return KVC_ERR_INVALID;
    return seq_blocks_needed(c, &c->seqs[seq], n_tokens);
}

int32_t kvc_blocks_available(const kvc_cache *c) { return c ? c->n_free + c->n_cached : 0; }

/* ---- prefix-cache events ------------------------------------------------------------------------------------------- */
void kvc_set_event_cb(kvc_cache *c, kvc_event_cb cb, void *ctx) {
    if (!c) return;
    c->event_cb = cb;
    c->event_ctx = cb ? ctx : NULL;
}

int kvc_pool_reset_prefix_cache(kvc_cache *c) {
    if (!c) return KVC_ERR_INVALID;
    if (c->pending || c->n_used > 0) return KVC_ERR_STATE;
    /* Unhash quietly (one CLEARED stands for all of them), then the blocks join the free stack. */
    kvc_event_cb cb = c->event_cb;
    c->event_cb = NULL;
    while (c->lru_head >= 0) {
        int32_t b = c->lru_head;
        lru_unlink(c, b);
        index_remove(c, b, false);
        c->n_cached--;
        c->free_stack[c->n_free++] = b;
    }
    c->event_cb = cb;
    if (cb) {
        kvc_event ev = {.kind = KVC_EVENT_CLEARED, .block = -1, .block_size = c->lay.block_size};
        cb(c->event_ctx, &ev);
    }
    return KVC_OK;
}
