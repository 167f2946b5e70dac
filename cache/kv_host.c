/* kv_host.c: the host-memory tier below the KV pool: its region, index and LRU list, stores on eviction, loads back
 * into the pool, its events (see kv_host.h). */
#include "cache/kv_host.h"
#include "cache/kvc_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* One slot of the region. */
typedef struct kvh_slot {
    uint64_t hash, parent_hash;
    bool used, has_parent;
    int32_t hnext;            /* next slot of the hash bucket, -1 */
    int32_t lprev, lnext;     /* LRU list of used slots (head: least recently used), or the free list (lnext) */
} kvh_slot;

/* A recorded tier event (kvh_events_enable). */
typedef struct kvh_ev {
    kvc_event_kind kind;
    bool has_parent;
    uint64_t hash, parent;
    size_t tok;               /* STORED: block_size tokens at ev_tok + tok */
} kvh_ev;

struct kvh_tier {
    kvh_params p;
    kvc_cache *cache;         /* borrowed */
    kvc_layout lay;
    size_t block_bytes;
    int32_t n_slots;
    kvh_slot *slots;          /* [n_slots] */
    int32_t *tok;             /* [n_slots][block_size] token ids */
    uint8_t *data;            /* [n_slots][block_bytes] keys and values (the layout's order: layer, K/V) */
    int32_t *buckets;         /* [bucket_mask + 1] first slot, -1 */
    uint32_t bucket_mask;
    int32_t lru_head, lru_tail, free_head;
    int32_t pinned;           /* the slot kvh_load is copying from (never reused meanwhile), -1 */
    uint64_t *hbuf;           /* [hcap] chain hashes of kvh_load */
    int32_t hcap;
    bool events_on;
    kvs_buf ev, ev_tok;       /* recorded events (kvh_ev) and their tokens (int32) */
    pthread_mutex_t mu;       /* guards stats */
    kvh_stats stats;
};

#define STAT(h, expr)                                                                                                \
    do {                                                                                                             \
        pthread_mutex_lock(&(h)->mu);                                                                                \
        expr;                                                                                                        \
        pthread_mutex_unlock(&(h)->mu);                                                                              \
    } while (0)

/* ---- the host pool's own copies --------------------------------------------------------------------------------- */
static int host_copy_out(void *ctx, int32_t block, void *dst) {
    const kvc_layout *l = ctx;
    for (int32_t i = 0; i < 2 * l->n_layer; i++)
        memcpy((uint8_t *)dst + (size_t)i * l->block_stride,
               (const uint8_t *)l->base + (size_t)i * l->layer_bytes + (size_t)block * l->block_stride, l->block_stride);
    return 0;
}

static int host_copy_in(void *ctx, int32_t block, const void *src) {
    const kvc_layout *l = ctx;
    for (int32_t i = 0; i < 2 * l->n_layer; i++)
        memcpy((uint8_t *)l->base + (size_t)i * l->layer_bytes + (size_t)block * l->block_stride,
               (const uint8_t *)src + (size_t)i * l->block_stride, l->block_stride);
    return 0;
}

/* ---- events ------------------------------------------------------------------------------------------------------ */
static void record(kvh_tier *h, kvc_event_kind kind, int32_t s) {
    if (!h->events_on) return;
    if (h->ev.len / sizeof(kvh_ev) >= KVH_EVENTS_MAX) {
        STAT(h, h->stats.events_dropped++);
        return;
    }
    size_t bs = (size_t)h->lay.block_size;
    const kvh_slot *sl = &h->slots[s];
    kvh_ev e = {.kind = kind, .hash = sl->hash, .has_parent = sl->has_parent, .parent = sl->parent_hash,
                .tok = h->ev_tok.len / sizeof(int32_t)};
    if (kind == KVC_EVENT_STORED &&
        kvs_buf_append(&h->ev_tok, h->tok + (size_t)s * bs, bs * sizeof(int32_t)) != KVS_OK) {
        STAT(h, h->stats.events_dropped++);
        return;
    }
    if (kvs_buf_append(&h->ev, &e, sizeof e) != KVS_OK) STAT(h, h->stats.events_dropped++);
}

void kvh_events_enable(kvh_tier *h) {
    if (!h || h->events_on) return;
    h->events_on = true;
    for (int32_t s = h->lru_head; s >= 0; s = h->slots[s].lnext) record(h, KVC_EVENT_STORED, s);
}

void kvh_drain_events(kvh_tier *h, kvc_event_cb cb, void *ctx) {
    if (!h || !cb || !h->ev.len) return;
    kvs_buf ev = h->ev, tok = h->ev_tok;
    memset(&h->ev, 0, sizeof h->ev);
    memset(&h->ev_tok, 0, sizeof h->ev_tok);
    const kvh_ev *e = (const kvh_ev *)(const void *)ev.data;
    for (size_t i = 0; i < ev.len / sizeof *e; i++) {
        kvc_event k = {.kind = e[i].kind, .block = -1, .hash = e[i].hash, .has_parent = e[i].has_parent,
                       .parent_hash = e[i].parent, .block_size = h->lay.block_size,
                       .tokens = e[i].kind == KVC_EVENT_STORED ? (const int32_t *)(const void *)tok.data + e[i].tok
                                                               : NULL};
        cb(ctx, &k);
    }
    kvs_buf_free(&ev);
    kvs_buf_free(&tok);
}

/* ---- the index and the LRU list -------------------------------------------------------------------------------- */
static uint32_t bucket(const kvh_tier *h, uint64_t x) { return (uint32_t)(x ^ (x >> 31)) & h->bucket_mask; }

static int32_t find(const kvh_tier *h, uint64_t hash, bool has_parent, uint64_t parent, const int32_t *tokens) {
    size_t bs = (size_t)h->lay.block_size;
    for (int32_t s = h->buckets[bucket(h, hash)]; s >= 0; s = h->slots[s].hnext) {
        const kvh_slot *sl = &h->slots[s];
        if (sl->hash != hash || sl->has_parent != has_parent || (has_parent && sl->parent_hash != parent)) continue;
        if (memcmp(h->tok + (size_t)s * bs, tokens, bs * sizeof *tokens)) continue;
        return s;
    }
    return -1;
}

bool kvh_holds(const kvh_tier *h, uint64_t hash, bool has_parent, uint64_t parent_hash, const int32_t *tokens) {
    return h && tokens && find(h, hash, has_parent, parent_hash, tokens) >= 0;
}

static void lru_unlink(kvh_tier *h, int32_t s) {
    kvh_slot *sl = &h->slots[s];
    if (sl->lprev >= 0) h->slots[sl->lprev].lnext = sl->lnext;
    else h->lru_head = sl->lnext;
    if (sl->lnext >= 0) h->slots[sl->lnext].lprev = sl->lprev;
    else h->lru_tail = sl->lprev;
    sl->lprev = sl->lnext = -1;
}

static void lru_push_mru(kvh_tier *h, int32_t s) {
    kvh_slot *sl = &h->slots[s];
    sl->lnext = -1;
    sl->lprev = h->lru_tail;
    if (h->lru_tail >= 0) h->slots[h->lru_tail].lnext = s;
    else h->lru_head = s;
    h->lru_tail = s;
}

static void touch(kvh_tier *h, int32_t s) {
    lru_unlink(h, s);
    lru_push_mru(h, s);
}

/* Empties used slot s: out of the index and the LRU list, onto the free list. */
static void slot_drop(kvh_tier *h, int32_t s) {
    kvh_slot *sl = &h->slots[s];
    int32_t *pp = &h->buckets[bucket(h, sl->hash)];
    while (*pp != s) pp = &h->slots[*pp].hnext;
    *pp = sl->hnext;
    lru_unlink(h, s);
    record(h, KVC_EVENT_REMOVED, s);
    sl->used = false;
    sl->lnext = h->free_head;
    h->free_head = s;
    STAT(h, h->stats.blocks--; h->stats.bytes -= h->block_bytes);
}

/* A free slot: the free list's, else the least recently used one's (spilled first), never the pinned one; -1 when
 * there is none (a region of one slot, pinned). */
static int32_t slot_take(kvh_tier *h) {
    if (h->free_head < 0) {
        int32_t v = h->lru_head;
        if (v >= 0 && v == h->pinned) v = h->slots[v].lnext;
        if (v < 0) return -1;
        kvh_slot *sl = &h->slots[v];
        bool spill = h->p.spill != NULL;
        if (spill) {
            kvh_block b = {.hash = sl->hash, .has_parent = sl->has_parent, .parent_hash = sl->parent_hash,
                           .tokens = h->tok + (size_t)v * (size_t)h->lay.block_size,
                           .data = h->data + (size_t)v * h->block_bytes, .bytes = h->block_bytes};
            h->p.spill(h->p.spill_ctx, &b);
        }
        slot_drop(h, v);
        STAT(h, h->stats.evicted++; h->stats.spilled += spill);
    }
    int32_t s = h->free_head;
    h->free_head = h->slots[s].lnext;
    h->slots[s].lnext = -1;
    return s;
}

/* ---- stores (cache thread, inside the cache's eviction) ---------------------------------------------------------- */
void kvh_on_cache_event(void *ctx, const kvc_event *ev) {
    kvh_tier *h = ctx;
    if (!h || !ev || ev->kind != KVC_EVENT_REMOVED || !ev->evicted || !ev->tokens ||
        ev->block_size != h->lay.block_size || ev->block < 0 || ev->block >= h->lay.n_blocks)
        return;
    int32_t s = find(h, ev->hash, ev->has_parent, ev->parent_hash, ev->tokens);
    if (s >= 0) {
        touch(h, s);
        STAT(h, h->stats.refreshed++);
        return;
    }
    if ((s = slot_take(h)) < 0) return;
    kvh_slot *sl = &h->slots[s];
    if (h->p.io.copy_out(h->p.io.ctx, ev->block, h->data + (size_t)s * h->block_bytes) != 0) {
        sl->lnext = h->free_head;
        h->free_head = s;
        STAT(h, h->stats.copy_errors++);
        return;
    }
    size_t bs = (size_t)h->lay.block_size;
    memcpy(h->tok + (size_t)s * bs, ev->tokens, bs * sizeof *ev->tokens);
    sl->hash = ev->hash;
    sl->has_parent = ev->has_parent;
    sl->parent_hash = ev->has_parent ? ev->parent_hash : 0;
    sl->used = true;
    uint32_t k = bucket(h, sl->hash);
    sl->hnext = h->buckets[k];
    h->buckets[k] = s;
    lru_push_mru(h, s);
    record(h, KVC_EVENT_STORED, s);
    STAT(h, h->stats.stored++; h->stats.blocks++; h->stats.bytes += h->block_bytes;
         h->stats.bytes_in += h->block_bytes);
}

/* ---- loads (cache thread) -------------------------------------------------------------------------------------- */
/* Puts slot s's block into seq at position pos through the forward protocol. */
static int place(kvh_tier *h, int32_t seq, int32_t pos, const int32_t *tok, int32_t s) {
    int32_t bs = h->lay.block_size;
    kvc_entry ent[1024];
    int32_t slots[1024];
    if (bs < 1 || bs > 1024) return KVS_ERR_UNSUPPORTED;
    for (int32_t i = 0; i < bs; i++) ent[i] = (kvc_entry){.seq = seq, .pos = pos + i, .token = tok[i]};
    h->pinned = s; /* the pool's evictions below may store blocks here: never into s */
    int rc = kvc_start_forward(h->cache, ent, bs, slots);
    h->pinned = -1;
    if (rc != KVC_OK) return rc;
    int32_t blk = slots[0] / bs;
    bool whole = true;
    for (int32_t i = 0; i < bs; i++) whole = whole && slots[i] == blk * bs + i;
    if (!whole) {
        kvc_finish_forward(h->cache, false);
        return KVS_ERR_STATE;
    }
    if (h->p.io.copy_in(h->p.io.ctx, blk, h->data + (size_t)s * h->block_bytes) != 0) {
        kvc_finish_forward(h->cache, false);
        STAT(h, h->stats.copy_errors++);
        return KVS_ERR_IO;
    }
    return kvc_finish_forward(h->cache, true);
}

int kvh_load(kvh_tier *h, int32_t seq, const int32_t *tokens, int32_t n, int32_t have, int32_t max_blocks,
             int32_t *n_loaded) {
    if (n_loaded) *n_loaded = 0;
    if (!h || !n_loaded || n < have || have < 0 || (n > 0 && !tokens)) return KVS_ERR_INVALID;
    int32_t bs = h->lay.block_size;
    if (have % bs || !kvc_seq_is_live(h->cache, seq) || kvc_seq_len(h->cache, seq) != have) return KVS_ERR_INVALID;
    int32_t k = have / bs, nb = n / bs;
    if (k >= nb || max_blocks <= 0 || h->lru_head < 0) return KVS_OK; /* nothing to find */
    if (nb - k > max_blocks) nb = k + max_blocks;
    if (nb > h->hcap) {
        uint64_t *nh = realloc(h->hbuf, (size_t)nb * sizeof *nh);
        if (!nh) return KVS_ERR_NOMEM;
        h->hbuf = nh;
        h->hcap = nb;
    }
    uint64_t parent = KVC_HASH_ROOT;
    for (int32_t i = 0; i < nb; i++) parent = h->hbuf[i] = chain_hash(h->cache, parent, tokens + (size_t)i * bs);
    STAT(h, h->stats.lookups++);
    /* first mark every block of the run most recently used, in order: the pool's evictions while they are placed
     * push blocks into the tier, which must not make room by dropping the run's next blocks */
    for (int32_t j = k; j < nb; j++) {
        int32_t s = find(h, h->hbuf[j], j > 0, j > 0 ? h->hbuf[j - 1] : 0, tokens + (size_t)j * bs);
        if (s < 0) break;
        touch(h, s);
    }
    int rc = KVS_OK;
    for (; k < nb; k++) {
        const int32_t *tk = tokens + (size_t)k * bs;
        int32_t s = find(h, h->hbuf[k], k > 0, k > 0 ? h->hbuf[k - 1] : 0, tk);
        if (s < 0) break;
        rc = place(h, seq, k * bs, tk, s);
        if (rc != KVS_OK) break;
        *n_loaded += bs;
        STAT(h, h->stats.hit_blocks++; h->stats.hit_tokens += (uint64_t)bs; h->stats.bytes_out += h->block_bytes);
    }
    return rc == KVC_ERR_FULL ? KVS_OK : rc;
}

/* ---- life -------------------------------------------------------------------------------------------------------- */
int kvh_open(const kvh_params *params, kvc_cache *cache, kvh_tier **out) {
    if (!params || !cache || !out) return KVS_ERR_INVALID;
    *out = NULL;
    bool own = !params->io.copy_out && !params->io.copy_in;
    if (!own && (!params->io.copy_out || !params->io.copy_in || !params->io.block_bytes)) return KVS_ERR_INVALID;
    if (cache->swa || cache->p.sliding_window > 0) return KVS_ERR_UNSUPPORTED;
    if (own && cache->alloc != kvc_host_allocator()) return KVS_ERR_UNSUPPORTED;
    kvh_tier *h = calloc(1, sizeof *h);
    if (!h) return KVS_ERR_NOMEM;
    h->p = *params;
    h->cache = cache;
    kvc_get_layout(cache, &h->lay);
    h->block_bytes = own ? 2 * (size_t)h->lay.n_layer * h->lay.block_stride : params->io.block_bytes;
    if (own) h->p.io = (kvh_io){host_copy_out, host_copy_in, &h->lay, h->block_bytes};
    uint64_t n = params->max_bytes / h->block_bytes;
    if (n < 1 || n > INT32_MAX / 2) {
        free(h);
        return KVS_ERR_INVALID;
    }
    h->n_slots = (int32_t)n;
    uint32_t nbk = 16;
    while (nbk < (uint32_t)h->n_slots) nbk *= 2;
    h->bucket_mask = nbk - 1;
    h->slots = calloc((size_t)h->n_slots, sizeof *h->slots);
    h->tok = malloc((size_t)h->n_slots * (size_t)h->lay.block_size * sizeof *h->tok);
    h->data = malloc((size_t)h->n_slots * h->block_bytes);
    h->buckets = malloc(nbk * sizeof *h->buckets);
    if (!h->slots || !h->tok || !h->data || !h->buckets) {
        KVS_FREE_ALL(h->slots, h->tok, h->data, h->buckets);
        free(h);
        return KVS_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < nbk; i++) h->buckets[i] = -1;
    for (int32_t s = 0; s < h->n_slots; s++)
        h->slots[s] = (kvh_slot){.hnext = -1, .lprev = -1, .lnext = s + 1 < h->n_slots ? s + 1 : -1};
    h->free_head = 0;
    h->lru_head = h->lru_tail = h->pinned = -1;
    h->stats.capacity_blocks = (uint64_t)h->n_slots;
    pthread_mutex_init(&h->mu, NULL);
    *out = h;
    return KVS_OK;
}

void kvh_close(kvh_tier *h) {
    if (!h) return;
    KVS_FREE_ALL(h->slots, h->tok, h->data, h->buckets, h->hbuf);
    kvs_buf_free(&h->ev);
    kvs_buf_free(&h->ev_tok);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

void kvh_get_stats(kvh_tier *h, kvh_stats *out) {
    memset(out, 0, sizeof *out);
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    *out = h->stats;
    pthread_mutex_unlock(&h->mu);
}
