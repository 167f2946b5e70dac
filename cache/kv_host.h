/*
 * kv_host.h: the host-memory tier below the KV block pool (part of the cache module, prefix kvh_; llama.cpp calls
 * the idea --cache-ram, vLLM CPU offloading).
 *
 * What it is: a bounded region of host RAM holding full prefix blocks that the pool evicted (their keys and values,
 * byte for byte as the pool stores them, with their chained hashes and token ids), so that a prefix pushed out of
 * the pool by other work is copied back instead of recomputed. The lookup order of a new sequence is pool ->
 * host -> disk (cache/kv_tier.h); the server's block manager interleaves kvh_load and kvt_load.
 * Owns: the region (allocated whole at kvh_open), its index (hash -> slot) and LRU list, its event record.
 * Borrows the cache. Must never: place a block whose tokens or parent do not match the prompt's (the 64-bit hash
 * only finds candidates), block the cache's thread on anything but memory copies.
 *
 * How blocks arrive: the cache reports an LRU eviction as a KVC_EVENT_REMOVED with `evicted` set, while the block's
 * storage still holds its data (kv_cache.h); kvh_on_cache_event then copies it into a slot (the least recently used
 * slot is reused when none is free: that block leaves the tier through params.spill, e.g. into the disk tier when
 * the disk does not hold it yet). A block already held is only marked most recently used. A host hit copied back
 * into the pool keeps its slot (the pool and the tier may both hold a block: the next eviction then costs no copy).
 *
 * Device-neutral copies: the tier moves a block between the pool and its region only through kvh_io (copy_out:
 * pool block -> region bytes, copy_in: region bytes -> pool block, block_bytes each way). NULL callbacks select the
 * host pool's own copy (the layout's base pointer, each layer's K then V block, as the disk tier's files store
 * them), which needs the pool to use kvc_host_allocator(). A GPU pool would pass device-to-host copies into pinned
 * memory here; kvserve does not build that yet (the server refuses kv_host_gb with a GPU pool).
 *
 * Threads: everything but kvh_get_stats runs on the cache's thread (the scheduler's). kvh_get_stats may be called
 * from any thread (the counters are guarded by a mutex).
 *
 * Errors: 0 or a negative kvs_err code, each named at its function.
 */
#ifndef KVSERVE_KV_HOST_H
#define KVSERVE_KV_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/kv_cache.h"
#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How bytes move between the pool and the tier's region (see above). Both return 0, or a negative value when the
 * copy failed (then the block is not stored, or not placed). Called on the cache's thread. */
typedef struct kvh_io {
    int (*copy_out)(void *ctx, int32_t block, void *dst);       /* pool block -> dst[block_bytes] */
    int (*copy_in)(void *ctx, int32_t block, const void *src);  /* src[block_bytes] -> pool block */
    void *ctx;
    size_t block_bytes;       /* bytes of one block in the region; with NULL callbacks it is derived (0 here) */
} kvh_io;

/* A block leaving the tier (params.spill): valid during the call only. */
typedef struct kvh_block {
    uint64_t hash;            /* its chained hash (kv_cache.h) */
    bool has_parent;          /* false: the first block of a chain */
    uint64_t parent_hash;     /* when has_parent */
    const int32_t *tokens;    /* [block_size] */
    const void *data;         /* [block_bytes], as the region holds it */
    size_t bytes;
} kvh_block;

typedef struct kvh_params {
    uint64_t max_bytes;       /* the region: max_bytes / block_bytes slots, at least 1 */
    kvh_io io;                /* zeroed: the host pool's own copies */
    void (*spill)(void *ctx, const kvh_block *b); /* optional: a block evicted from the tier (cache thread; it must
                                 not call into the tier or the cache) */
    void *spill_ctx;
} kvh_params;

typedef struct kvh_stats {
    uint64_t capacity_blocks;          /* slots of the region */
    uint64_t blocks, bytes;            /* held now */
    uint64_t stored;                   /* blocks copied in from the pool (evictions) */
    uint64_t refreshed;                /* evictions of blocks already held (no copy) */
    uint64_t evicted;                  /* blocks that left the tier to make room */
    uint64_t spilled;                  /* of those, handed to params.spill */
    uint64_t lookups;                  /* kvh_load calls that looked for at least one block */
    uint64_t hit_blocks, hit_tokens;   /* blocks (tokens) copied back into the pool */
    uint64_t bytes_in, bytes_out;      /* bytes copied pool -> tier, tier -> pool */
    uint64_t copy_errors;              /* failed kvh_io copies */
    uint64_t events_dropped;           /* tier events not recorded (KVH_EVENTS_MAX waiting) */
} kvh_stats;

#define KVH_EVENTS_MAX 65536 /* most tier events waiting for kvh_drain_events */

typedef struct kvh_tier kvh_tier;

/* Opens the tier over cache and allocates its region. The cache must outlive the tier; route its events to
 * kvh_on_cache_event. Errors: KVS_ERR_INVALID (NULL, max_bytes below one block, io with one callback but not the
 * other or without block_bytes), KVS_ERR_UNSUPPORTED (a sliding-window cache; or NULL callbacks over a pool whose
 * allocator is not kvc_host_allocator()), KVS_ERR_NOMEM. */
int kvh_open(const kvh_params *params, kvc_cache *cache, kvh_tier **out);

/* Frees the tier and its region (its blocks are not spilled). NULL is a no-op. */
void kvh_close(kvh_tier *h);

/* kvc_event_cb: ctx is the tier. A REMOVED event with `evicted` stores the block (see above); other events are
 * ignored. Cache thread, inside the cache call that evicts. */
void kvh_on_cache_event(void *ctx, const kvc_event *ev);

/* Continues seq (allocated, holding exactly the first `have` tokens of tokens[0..n), have a multiple of the block
 * size) with the next full blocks of tokens the tier holds, at most max_blocks of them: each is written into a new
 * pool block through the forward protocol (kvc_start_forward, kvh_io.copy_in, kvc_finish_forward: published like
 * a computed block). Stops at the first block not held or not placeable (the pool is full). Writes the tokens added
 * to *n_loaded (a multiple of the block size). Cache thread, no forward pending.
 * Errors: KVS_ERR_INVALID (NULL, have not a multiple of the block size or not seq's length, n < have), or the
 * cache's error from the forward protocol other than KVC_ERR_FULL, or KVS_ERR_IO (copy_in failed); *n_loaded then
 * tells what was loaded before it, and the sequence holds exactly have + *n_loaded tokens either way. */
int kvh_load(kvh_tier *h, int32_t seq, const int32_t *tokens, int32_t n, int32_t have, int32_t max_blocks,
             int32_t *n_loaded);

/* Whether the tier holds the block with this identity (tests, and the disk tier's spill path). Cache thread. */
bool kvh_holds(const kvh_tier *h, uint64_t hash, bool has_parent, uint64_t parent_hash, const int32_t *tokens);

/* Tier events (KV-cache events with medium "CPU"): once enabled, every block the tier gains is recorded as a
 * KVC_EVENT_STORED (with its parent and tokens) and every block it loses as a KVC_EVENT_REMOVED. Past KVH_EVENTS_MAX
 * waiting they are dropped (stats.events_dropped). Cache thread. NULL is a no-op. */
void kvh_events_enable(kvh_tier *h);

/* Calls cb(ctx, ev) for every recorded event, in order, and forgets them (ev->block is -1; ev->tokens valid during
 * the call). Cache thread; cb must not call into the tier. */
void kvh_drain_events(kvh_tier *h, kvc_event_cb cb, void *ctx);

/* The counters (any thread; zeroes for NULL). */
void kvh_get_stats(kvh_tier *h, kvh_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* KVSERVE_KV_HOST_H */
