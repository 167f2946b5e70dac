/*
 * kv_cache.h: the paged KV block pool shared by every sequence (kvserve's cache module, prefix kvc_).
 *
 * What it is: the bookkeeping of the KV memory: blocks, per-sequence block tables, reference counts, the
 * prefix-cache index, and the storage itself (one allocation through a kvc_allocator).
 * Owns: the pool's storage and every table; nothing global. Files: kv_cache.c (the pool), kv_check.c (stats and
 * the invariant checker), kv_group.c (the public calls over the pool and its sliding-window group), host_alloc.c
 * (host memory), kvc_internal.h (the private layout).
 * Must never: compute attention or know a model (it stores rows of head_dim values, whatever they mean),
 * decide which request runs (the server's scheduler does, through server/sched/block_manager.c), or allocate device
 * memory itself (the engine hands it an allocator).
 *
 * One pool of fixed-size blocks holds the keys and values of all sequences. Each sequence (a "slot", id 0 ..
 * max_seqs-1) owns an ordered block table: token i of a sequence lives in table[i / block_size] at offset
 * i % block_size. Blocks are reference counted, so sequences can share them (CopyPrefix, prefix caching);
 * a write into a shared block copies it first (copy-on-write).
 *
 * Automatic prefix caching: a full block is identified by a chained hash, hash(parent block's hash, the
 * block's token ids). When no sequence references a hashed block any more it stays cached (its contents
 * intact) on an LRU list and is evicted only when the pool needs a block. A new sequence whose prompt starts
 * with cached blocks attaches them (kvc_attach_prefix) instead of recomputing them.
 *
 * Block states: every block is exactly one of
 *   used    refcount > 0 (in at least one sequence's table),
 *   cached  refcount == 0, hashed, on the LRU list (reusable by a prefix match, evictable),
 *   free    refcount == 0, not hashed.
 * used + cached + free == total at all times.
 *
 * The forward protocol mirrors ollama's kvcache.Cache: kvc_start_forward() reserves a cache slot for each
 * batch entry (allocating, evicting and copying-on-write as needed, all or nothing); the engine then writes
 * K and V for every entry into its slot and reads attention through the block tables; finally
 * kvc_finish_forward() commits the batch (the new tokens become part of their sequences and full blocks are
 * published to the prefix cache) or rolls it back.
 *
 * Storage layout (kvc_layout): one region per layer and per K/V, each [n_blocks][n_kv_head][block_size][row],
 * where a row is one token of one head in the storage dtype (head_dim f32, head_dim f16, or head_dim/32 Q8_0
 * blocks of 34 bytes). So one block of one head is contiguous: block_size rows, which is what attention reads.
 * Memory comes from a kvc_allocator: host memory by default, device memory for the CUDA engine, a mock in tests.
 *
 * Sliding-window group (kvc_params.swa_layers > 0, for models that mix sliding-window and global layers, as
 * Gemma 3 does, like llama.cpp's iSWA cache): the cache then holds two pools of the same block size, dtype and
 * head shape, with the same sequence ids and lengths: the main pool (n_layer global layers, no window: every
 * position stays) and the sliding group (swa_layers layers, blocks wholly before a sequence's window released as
 * it advances, so its memory is bounded by the window whatever the context). Every call below acts on both in
 * lockstep and keeps its all-or-nothing contract over both; block tables, layout, stats and events describe the
 * main pool unless they say otherwise, and the sliding group is reached for reading through kvc_swa_group (its
 * layout and block tables) and kvc_swa_slots (its slots of the pending forward). The group is sized so that it
 * never runs out (see swa_blocks): admission looks at the main pool alone.
 *
 * Threads: a cache is single-writer. It belongs to the scheduler thread: every call on one cache must come
 * from one thread at a time (no internal locking). kvc_get_stats() reads plain counters and is the only call
 * that another thread may make, accepting a momentarily inconsistent snapshot.
 *
 * Errors: functions return 0 (KVC_OK) or a negative KVC_ERR_* code and write results through pointers. On
 * error nothing observable changes (every mutating call is all or nothing) unless the call says otherwise.
 */
#ifndef KVSERVE_KV_CACHE_H
#define KVSERVE_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- error codes ---------------------------------------------------------------------------------------- */
enum {
    KVC_OK = KVS_OK,
    KVC_ERR_INVALID = KVS_ERR_INVALID,           /* an argument is out of range or NULL where it may not be */
    KVC_ERR_NOMEM = KVS_ERR_NOMEM,               /* a host allocation or the storage allocator failed */
    KVC_ERR_FULL = KVS_ERR_KV_FULL,              /* the pool cannot supply the blocks this call needs (after
                                                    eviction) */
    KVC_ERR_NO_SLOT = KVS_ERR_NO_SLOT,           /* every sequence id is in use */
    KVC_ERR_BAD_SEQ = KVS_ERR_BAD_SEQ,           /* the sequence id is out of range or not allocated */
    KVC_ERR_POSITION = KVS_ERR_POSITION,         /* a batch position does not continue its sequence */
    KVC_ERR_NOT_SUPPORTED = KVS_ERR_UNSUPPORTED, /* the operation is valid but this cache cannot do it (see
                                                    kvc_remove) */
    KVC_ERR_STATE = KVS_ERR_STATE,               /* a forward is pending (or none is, for kvc_finish_forward) */
    KVC_ERR_TOO_LARGE = KVS_ERR_TOO_LARGE,       /* a batch exceeds max_batch_tokens, or a sequence would exceed
                                                    max_seq_len */
};

/* ---- storage ------------------------------------------------------------------------------------------------ */
typedef enum {
    KVC_DTYPE_F32 = 0,  /* row = head_dim floats */
    KVC_DTYPE_F16 = 1,  /* row = head_dim IEEE half floats (the default) */
    KVC_DTYPE_Q8_0 = 2, /* row = head_dim/32 blocks of {f16 scale, int8 q[32]} (34 bytes); head_dim % 32 == 0 */
} kvc_dtype;

/* Bytes of one row (one token of one head) of head_dim values in dtype; 0 when the combination is invalid. */
size_t kvc_row_bytes(kvc_dtype dtype, int32_t head_dim);

/* Where the pool's storage lives. alloc returns zero-filled-or-not memory of `bytes` (NULL on failure);
 * copy copies bytes between two places inside storage it returned (regions may not overlap; for device
 * memory it is a device-to-device copy) and returns 0 or a negative value on failure. free releases what
 * alloc returned. ctx is passed through untouched. All three are called only from the cache's thread. */
typedef struct kvc_allocator {
    void *(*alloc)(void *ctx, size_t bytes);
    int (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    void (*free)(void *ctx, void *ptr);
    void *ctx;
} kvc_allocator;

/* The host-memory allocator (64-byte aligned). */
const kvc_allocator *kvc_host_allocator(void);

/* ---- creation --------------------------------------------------------------------------------------------- */
typedef struct kvc_params {
    int32_t n_layer;          /* >= 1 */
    int32_t n_kv_head;        /* >= 1 */
    int32_t head_dim;         /* >= 1 (multiple of 32 for Q8_0) */
    int32_t block_size;       /* tokens per block, >= 1; 0 means the default, 16 */
    int32_t n_blocks;         /* number of blocks; 0 means: derive it from mem_bytes */
    size_t mem_bytes;         /* storage budget in bytes when n_blocks == 0 (must give at least 1 block) */
    int32_t max_seqs;         /* number of sequence ids (slots), >= 1 */
    int32_t max_batch_tokens; /* largest batch kvc_start_forward accepts, >= 1 */
    int32_t max_seq_len;      /* longest sequence in tokens (the model context); 0 means unlimited */
    int32_t sliding_window;   /* 0 = none; else attention sees only the last sliding_window positions, and
                                 blocks wholly before a sequence's window are released as it advances (in the
                                 sliding group alone when swa_layers > 0) */
    int32_t swa_layers;       /* 0 = no sliding group; else (sliding_window > 0 required) the layers of the
                                 sliding group, stored apart from the n_layer layers of the main pool */
    int32_t swa_blocks;       /* blocks of the sliding group; 0 = enough that it can never be full: max_seqs *
                                 (ceil(sliding_window / block_size) + 4) + ceil(max_batch_tokens / block_size)
                                 (each sequence holds at most its window's blocks plus one, a batch adds its
                                 own tokens' blocks and one copy-on-write per sequence) */
    kvc_dtype dtype;          /* storage type of K and V */
    bool prefix_caching;      /* keep full blocks hashed for reuse (automatic prefix caching) */
    const kvc_allocator *allocator; /* NULL = kvc_host_allocator(); must outlive the cache */
} kvc_params;

/* Fills *p with defaults: block_size 16, dtype F16, prefix_caching true, max_seq_len 0, sliding_window 0,
 * swa_layers 0, swa_blocks 0, allocator NULL; the shape fields, n_blocks/mem_bytes, max_seqs and
 * max_batch_tokens are zeroed and must be set by the caller. */
void kvc_params_default(kvc_params *p);

typedef struct kvc_cache kvc_cache;

/* Creates a cache and allocates its whole storage up front (both pools with a sliding group; mem_bytes is the
 * main pool's budget). Returns KVC_OK and sets *out, or KVC_ERR_INVALID (a field out of range: the shape, a
 * budget below one block, Q8_0 with head_dim % 32 != 0, swa_layers > 0 without a sliding window), KVC_ERR_NOMEM.
 * The caller owns *out and frees it with kvc_free. */
int kvc_create(const kvc_params *params, kvc_cache **out);

/* Frees the cache and its storage. NULL is a no-op. */
void kvc_free(kvc_cache *cache);

/* ---- layout (for the attention kernels) --------------------------------------------------------------------- */
typedef struct kvc_layout {
    int32_t n_layer, n_kv_head, head_dim, block_size, n_blocks;
    kvc_dtype dtype;
    size_t row_bytes;    /* bytes of one token of one head */
    size_t head_stride;  /* bytes between heads inside a block = block_size * row_bytes */
    size_t block_stride; /* bytes between blocks = n_kv_head * head_stride */
    size_t layer_bytes;  /* bytes of one layer's K (or V) region = n_blocks * block_stride */
    void *base;          /* storage start: K of layer l at base + (2l) * layer_bytes, V at (2l+1) * layer_bytes */
} kvc_layout;

/* Writes the storage layout (fixed for the cache's lifetime) to *out. */
void kvc_get_layout(const kvc_cache *cache, kvc_layout *out);

/* Address of the row of (layer, kv: 0 = K / 1 = V, slot, head), where slot = block * block_size + offset as
 * returned by kvc_start_forward. No bounds checks: the caller passes values from this cache. */
static inline void *kvc_row_ptr(const kvc_layout *l, int32_t layer, int kv, int32_t slot, int32_t head) {
    int32_t block = slot / l->block_size, off = slot % l->block_size;
    return (char *)l->base + (size_t)(2 * layer + kv) * l->layer_bytes + (size_t)block * l->block_stride +
           (size_t)head * l->head_stride + (size_t)off * l->row_bytes;
}

/* The sliding group of a cache created with swa_layers > 0, else NULL. For reading only (kvc_get_layout: its
 * layout, whose n_layer is swa_layers; kvc_block_table: a sequence's table there, released leading blocks -1):
 * every mutating call goes through the owning cache. Valid for the cache's lifetime. */
const kvc_cache *kvc_swa_group(const kvc_cache *cache);

/* The sliding group's slot of each entry of the pending forward (in the order given to kvc_start_forward; the
 * group's own layout applies), or NULL when the cache has no sliding group or no forward is pending. */
const int32_t *kvc_swa_slots(const kvc_cache *cache);

/* ---- slots (sequence ids) ------------------------------------------------------------------------------------ */
/* Allocates the lowest free sequence id; the new sequence is empty. KVC_ERR_NO_SLOT when all are in use;
 * KVC_ERR_STATE while a forward is pending. */
int kvc_seq_alloc(kvc_cache *cache, int32_t *seq_out);

/* Releases a sequence id and all its blocks (hashed blocks stay cached). The id is reusable at once.
 * KVC_ERR_BAD_SEQ for an id that is not allocated (a double free is reported, not fatal);
 * KVC_ERR_STATE while a forward is pending. */
int kvc_seq_free(kvc_cache *cache, int32_t seq);

/* Whether seq is a currently allocated id. */
bool kvc_seq_is_live(const kvc_cache *cache, int32_t seq);

/* Number of committed tokens in seq (0 for an empty or unallocated sequence). */
int32_t kvc_seq_len(const kvc_cache *cache, int32_t seq);

/* ---- the forward protocol -------------------------------------------------------------------------------------- */
typedef struct kvc_entry {
    int32_t seq;   /* an allocated sequence id */
    int32_t pos;   /* its position: entries of one sequence must be len, len+1, ... in batch order */
    int32_t token; /* the token id at that position (feeds the prefix-cache hash) */
} kvc_entry;

/* Reserves a slot for each of the n entries (any mix of sequences, prefill chunks and decode tokens) and
 * writes it to slots_out[i] (slot = block * block_size + offset, see kvc_row_ptr). Allocates blocks on
 * demand (evicting LRU cached blocks when no block is free) and copies a shared or hashed block before the
 * batch writes into it (copy-on-write). All or nothing: on any error nothing changes.
 * Errors: KVC_ERR_INVALID (n < 1, NULL pointers), KVC_ERR_TOO_LARGE (n > max_batch_tokens, or a sequence
 * would pass max_seq_len), KVC_ERR_BAD_SEQ, KVC_ERR_POSITION (positions of a sequence must continue it
 * without gaps, starting at its length; also when the sequence cannot resume at its length, i.e.
 * !kvc_can_resume(seq, len), which happens only with a sliding window after a tail removal into released
 * blocks), KVC_ERR_FULL (the pool cannot hold the batch), KVC_ERR_STATE (a forward is already pending),
 * KVC_ERR_NOMEM (host memory, or allocator->copy failed during copy-on-write: then tables are unchanged but
 * cached blocks evicted for the batch stay evicted). Errors are checked entry by entry in batch order; the
 * first failing entry decides the code, then KVC_ERR_FULL is checked for the whole batch.
 * While the forward is pending, kvc_block_table() already includes the batch's blocks and reports the
 * sequence length including the batch, so attention can read them (kvc_seq_len() stays the committed
 * length). The original of a copy-on-write keeps one reference until kvc_finish_forward (so a rollback can
 * restore it); kvc_block_refcount() counts it. */
int kvc_start_forward(kvc_cache *cache, const kvc_entry *entries, int32_t n, int32_t *slots_out);

/* Ends the pending forward. ok = true: the batch's tokens are committed and every block they filled is
 * published to the prefix cache. A block is published only after its parent (the previous block of the
 * sequence) and never when its contents came from a context shift. If an identical block (same tokens, same
 * parent) is already cached or in use, the sequence switches to that block and releases its own copy
 * (deduplication): block ids in tables may change here, which is why kvc_block_table() pointers and ids
 * are valid only until the next mutating call. With a sliding window, blocks wholly before
 * len - sliding_window are then released. ok = false: the batch is rolled back (sequence lengths and
 * tables as before kvc_start_forward; blocks it allocated are freed; copy-on-write copies are undone;
 * blocks evicted to make room stay evicted). KVC_ERR_STATE when no forward is pending. */
int kvc_finish_forward(kvc_cache *cache, bool ok);

/* ---- block tables ---------------------------------------------------------------------------------------------- */
/* The ordered block ids of seq and its length in tokens (including a pending batch). *blocks points into
 * the cache and stays valid until the next mutating call; *n_blocks == ceil(len / block_size). With a
 * sliding window, released leading blocks read as -1. KVC_ERR_BAD_SEQ for a bad id. */
int kvc_block_table(const kvc_cache *cache, int32_t seq, const int32_t **blocks, int32_t *n_blocks,
                    int32_t *len);

/* Reference count of a block (0 for a cached or free block), or KVC_ERR_INVALID for a bad block id. */
int32_t kvc_block_refcount(const kvc_cache *cache, int32_t block);

/* ---- sharing ------------------------------------------------------------------------------------------------- */
/* Makes dst (an allocated, empty sequence) hold the first len tokens of src: src's full blocks among them
 * are shared (refcounts incremented, no token data copied); a partially used last block is copied.
 * len == 0 is a no-op. Errors: KVC_ERR_BAD_SEQ, KVC_ERR_INVALID (src == dst, dst not empty, len < 0 or
 * len > src's committed length), KVC_ERR_FULL (no block for the partial copy), KVC_ERR_STATE. */
int kvc_copy_prefix(kvc_cache *cache, int32_t src, int32_t dst, int32_t len);

/* Attaches to seq (allocated and empty) the longest run of cached full blocks matching the start of
 * tokens[0..n): only whole blocks, found by their chained hashes. Writes the number of tokens attached
 * (a multiple of block_size, <= n) to *n_cached. An engine must still compute at least the last prompt
 * token to get its logits, so callers pass n = prompt length - 1. Counts queries and hits for the stats.
 * Attaches at most max_seq_len tokens. With a sliding window, attached blocks wholly before the window are
 * released right away (they stay cached).
 * Errors: KVC_ERR_BAD_SEQ, KVC_ERR_INVALID (seq not empty, n < 0, NULL with n > 0), KVC_ERR_STATE,
 * KVC_ERR_NOMEM. */
int kvc_attach_prefix(kvc_cache *cache, int32_t seq, const int32_t *tokens, int32_t n, int32_t *n_cached);

/* Counts, without attaching or touching the LRU order or the stats, how many leading tokens of tokens[0..n)
 * are held by hashed blocks (cached or in use): a multiple of block_size. Errors: KVC_ERR_INVALID (NULL
 * cache or n_matched, n < 0, NULL tokens with n > 0).
 *
 * Prefix identity (both calls): a block matches when its block_size token ids and its parent block are the
 * ones looked for; the 64-bit chained hash only finds candidates, so a hash collision never yields a wrong
 * match. */
int kvc_prefix_match(const kvc_cache *cache, const int32_t *tokens, int32_t n, int32_t *n_matched);

/* ---- removal and resumption ------------------------------------------------------------------------------------ */
typedef struct kvc_shift {
    int32_t pos;   /* first position whose token moved (== begin of the removal) */
    int32_t n;     /* number of moved tokens, now at [pos, pos + n) */
    int32_t delta; /* how far they moved (negative: begin - end); the engine re-rotates RoPE by delta */
} kvc_shift;

/* Removes positions [begin, end) of seq; end == INT32_MAX (or any end >= length) means to the end.
 * Tail removal (end >= length) always works and frees blocks no longer needed (shared blocks just lose a
 * reference; a shared or cached block that becomes the partial last block is copied on the next write).
 * Removal from the middle moves later tokens down by end - begin (context shift): all layers, K and V,
 * all heads, through allocator->copy. It is supported when every block from the one holding `begin` to
 * the end of seq is held by seq alone (blocks wholly before begin, which do not change, may be shared, e.g.
 * a cached system prompt) and none of them was released by a sliding window; then *shift (if not NULL)
 * says which positions moved, so the engine can re-rotate RoPE for them; blocks from the one holding
 * begin on lose their prefix hashes, and the sequence publishes no block at or after begin again until it
 * is truncated back to begin or below. Otherwise it returns KVC_ERR_NOT_SUPPORTED and changes nothing: the
 * caller removes the whole sequence and recomputes. begin >= length or begin == end is a no-op.
 * shift->n == 0 when nothing moved (shift->pos = begin, shift->delta = 0).
 * Errors: KVC_ERR_BAD_SEQ, KVC_ERR_INVALID (begin < 0 or end < begin), KVC_ERR_NOT_SUPPORTED,
 * KVC_ERR_STATE, KVC_ERR_NOMEM (allocator->copy failed while moving: the sequence is then left truncated
 * to begin, the only state that is still consistent). With a sliding group, a removal from the middle must be
 * possible in both pools and leave a sequence the group can resume (its window after the removal may not reach
 * positions before begin that it released); else KVC_ERR_NOT_SUPPORTED, nothing changed. A failed move leaves
 * both truncated to begin. */
int kvc_remove(kvc_cache *cache, int32_t seq, int32_t begin, int32_t end, kvc_shift *shift);

/* Whether seq can continue at position pos with what is cached: pos <= length (committed), and with a
 * sliding window every position in [pos - sliding_window, pos) is still held. False for a bad id or
 * pos < 0. To continue at pos < length, kvc_remove(seq, pos, INT32_MAX) first. With a sliding group the window
 * is checked there. */
bool kvc_can_resume(const kvc_cache *cache, int32_t seq, int32_t pos);

/* Blocks that a new batch of n_tokens tokens appended to seq would need from the pool (new blocks plus
 * copy-on-write copies), for admission decisions. 0 for n_tokens == 0. Returns KVC_ERR_BAD_SEQ on a bad
 * id, KVC_ERR_INVALID for n_tokens < 0. The needs of several sequences add up (kvc_start_forward
 * compares the sum with kvc_blocks_available()). */
int32_t kvc_blocks_needed(const kvc_cache *cache, int32_t seq, int32_t n_tokens);

/* Blocks that can be had right now: free plus cached (evictable). */
int32_t kvc_blocks_available(const kvc_cache *cache);

/* ---- prefix-cache events ---------------------------------------------------------------------------------------
 * For consumers that mirror the prefix index elsewhere (KV-cache events for routers). A block's identity is its
 * 64-bit chained hash: XXH3_64bits_withSeed(the block's block_size token ids as little-endian int32, seed = the
 * parent block's hash), and for the first block of a chain seed = KVC_HASH_ROOT. Two blocks may carry the same
 * hash (a 64-bit collision, or a block whose parent was evicted under a sliding window and that a new chain
 * publishes again), so a mirror should count hashes rather than keep a set. */
#define KVC_HASH_ROOT 0x6b76736572766531ULL /* seed of the first block of every chain ("kvserve1") */

typedef enum {
    KVC_EVENT_STORED = 1,  /* a full block got its hash (it entered the prefix index) */
    KVC_EVENT_REMOVED = 2, /* a block lost its hash (evicted, or its contents changed by kvc_remove) */
    KVC_EVENT_CLEARED = 3, /* every cached block left the index at once (kvc_reset_prefix_cache) */
} kvc_event_kind;

typedef struct kvc_event {
    kvc_event_kind kind;
    int32_t block;          /* STORED, REMOVED: the block id */
    uint64_t hash;          /* STORED, REMOVED: its chained hash */
    bool has_parent;        /* STORED: false for the first block of a chain */
    uint64_t parent_hash;   /* STORED: the parent's hash when has_parent */
    const int32_t *tokens;  /* STORED: the block's block_size token ids (valid during the call only) */
    int32_t block_size;
    bool evicted;           /* REMOVED: the pool is taking the block for reuse (LRU eviction) and its storage still
                               holds its keys and values during the call (a lower tier may copy them: see
                               cache/kv_host.h); has_parent, parent_hash and tokens are then set as for STORED */
} kvc_event;

/* Called on the cache owner's thread, synchronously, from inside the call that changed the index
 * (kvc_finish_forward publishes: STORED, in chain order, parents first; kvc_start_forward, kvc_copy_prefix evict:
 * REMOVED with evicted set, before anything is written into the block; kvc_remove: REMOVED; kvc_reset_prefix_cache:
 * CLEARED). A deduplicated block (an identical one was already hashed) produces no event. The callback must not call into the cache. ctx is passed through. */
typedef void (*kvc_event_cb)(void *ctx, const kvc_event *ev);

/* Sets (or, with cb == NULL, clears) the event callback. Call it from the owner's thread (or before that thread
 * starts). NULL cache is a no-op. */
void kvc_set_event_cb(kvc_cache *cache, kvc_event_cb cb, void *ctx);

/* Drops the hash of every cached (unreferenced) block, which become free, then reports KVC_EVENT_CLEARED.
 * Only when no block is in use (as vLLM's reset_prefix_cache): KVC_ERR_STATE when a block is referenced or a
 * forward is pending; KVC_ERR_INVALID for NULL. */
int kvc_reset_prefix_cache(kvc_cache *cache);

/* ---- accounting -------------------------------------------------------------------------------------------------- */
typedef struct kvc_stats {
    int32_t blocks_total, blocks_used, blocks_cached, blocks_free;
    int32_t block_size;
    int32_t seqs_live;
    size_t bytes_total;        /* storage bytes (both pools with a sliding group) */
    size_t bytes_per_block;    /* all layers, K and V */
    double usage;              /* blocks_used / blocks_total */
    int64_t tokens_live;       /* sum of live sequence lengths (committed tokens) */
    uint64_t prefix_query_tokens; /* tokens offered to kvc_attach_prefix, total */
    uint64_t prefix_hit_tokens;   /* tokens it attached, total */
    uint64_t evictions;           /* cached blocks evicted */
    uint64_t cow_copies;          /* blocks copied on write or by kvc_copy_prefix */
    int32_t swa_blocks_total, swa_blocks_used; /* the sliding group's blocks (0 without one) */
} kvc_stats;

/* Writes the counters (O(1)) to *out. */
void kvc_get_stats(const kvc_cache *cache, kvc_stats *out);

/* Checks every internal invariant (refcounts equal table references, used + cached + free == total, hash
 * index consistent, LRU list consistent). O(blocks + tokens). Returns KVC_OK or KVC_ERR_STATE; writes a
 * description of the first violation into msg (if msg != NULL and msg_len > 0). KVC_ERR_INVALID for a NULL
 * cache, KVC_ERR_NOMEM when its scratch memory cannot be allocated. For tests and debugging. */
int kvc_check(const kvc_cache *cache, char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif
#endif /* KVSERVE_KV_CACHE_H */
