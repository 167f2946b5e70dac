/*
 * block_manager_internal.h: the scheduler's one door to the KV cache (sched/block_manager.c, prefix srv_block_manager_;
 * private to server/sched/). The scheduler decides who runs;
 * the block manager answers what the pool can hold and gives sequences their blocks: a sequence per choice,
 * its prefix (from the prefix cache, or copied from a running sequence that holds more of it), forks for n > 1,
 * and the block arithmetic admission needs. Everything else the cache does (the forward protocol, block
 * tables) belongs to the engine.
 *
 * Owns: nothing; it borrows the engine's kvc_cache (srv_engine_ops.cache) for the scheduler's lifetime.
 * Must never: run a forward pass, sample, or be called from another thread than the scheduler's (except
 * srv_block_manager_stats, which the cache allows from any thread).
 * Errors: 0 or a kvs_err code (KVS_ERR_NO_SLOT when every sequence id is in use, KVS_ERR_NOMEM, ...).
 */
#ifndef KVSERVE_SERVER_BLOCK_MANAGER_INTERNAL_H
#define KVSERVE_SERVER_BLOCK_MANAGER_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/kv_cache.h"
#include "cache/kv_host.h"
#include "cache/kv_tier.h"
#include "common/common.h"

#define SRV_BLOCK_MANAGER_FETCH_MAX 32 /* most sequences loading from the disk tier at once */

typedef struct srv_block_manager {
    kvc_cache *cache; /* borrowed */
    int32_t block_size;
    int32_t n_blocks;
    kvt_tier *tier;   /* borrowed, NULL: none (set after srv_block_manager_init) */
    kvh_tier *host;   /* borrowed, NULL: none (likewise) */
    struct {
        int32_t seq;      /* the sequence waiting for ... */
        kvt_fetch *f;     /* ... this fetch of the disk tier */
    } fetch[SRV_BLOCK_MANAGER_FETCH_MAX];
    int32_t n_fetch;
} srv_block_manager;

/* Binds the manager to a cache (reads its layout). */
void srv_block_manager_init(srv_block_manager *bm, kvc_cache *cache);

/* A new empty sequence in *seq; KVS_ERR_NO_SLOT when none is free. */
int srv_block_manager_seq_open(srv_block_manager *bm, int32_t *seq);
/* Releases a sequence: its blocks go back to the pool or the prefix cache; a fetch it waits for is cancelled. */
void srv_block_manager_seq_close(srv_block_manager *bm, int32_t seq);
/* Committed tokens of a sequence (0 for one not open). */
int32_t srv_block_manager_seq_len(const srv_block_manager *bm, int32_t seq);

/* Gives the empty sequence `seq` the longest known prefix of tokens[0..n): `shared` tokens copied from the
 * running sequence `donor` (full blocks shared, the partial block copied) when that is more than the prefix
 * cache holds, else the cached full blocks. Returns the tokens attached; *copied tells which way. A prefix the
 * sequence could not resume from (kvc_can_resume false: a sliding-window cache that released blocks the next
 * positions still attend to) is dropped (0 returned, the sequence left empty) so that it is recomputed. */
int32_t srv_block_manager_attach_prefix(srv_block_manager *bm, int32_t seq, const int32_t *tokens, int32_t n,
                                        int32_t donor, int32_t shared, bool *copied);
/* Continues seq (holding exactly the first `have` tokens of tokens[0..n)) with the full blocks the lower tiers hold,
 * at most max_blocks of them: from the host tier while it has the next block (kvh_load), then from the disk
 * (kvt_load), and so on while either adds some; returns the tokens added (0 without tiers, when have is not a whole
 * number of blocks, or on any error: the sequence then holds what was loaded before it). */
int32_t srv_block_manager_load_tier(srv_block_manager *bm, int32_t seq, const int32_t *tokens, int32_t n,
                                    int32_t have, int32_t max_blocks);
/* Asynchronous loads from the disk tier (kvt_fetch_*): fetch_start continues seq (holding exactly `have` tokens of
 * tokens[0..n), have a whole number of blocks) with the host tier's blocks at once (kvh_load), then, when the disk
 * holds the next block, starts a fetch of at most max_blocks - (what the host gave) blocks for seq; returns the tokens
 * added at once and sets *pending when a fetch runs (false without a disk tier, when the disk lacks the next block, or
 * when SRV_BLOCK_MANAGER_FETCH_MAX fetches run already: the disk's blocks are then read at once, as load_tier does).
 * fetch_poll: 0 when seq waits for no fetch (*added 0); 1 while its fetch runs; else places what the fetch read (and
 * then the host tier's next blocks), at most max_blocks in all, writes the tokens added to *added and returns 2. fetch_wait: waits up to
 * timeout_ns for a fetch to finish; false when none runs. */
int32_t srv_block_manager_fetch_start(srv_block_manager *bm, int32_t seq, const int32_t *tokens, int32_t n,
                                      int32_t have, int32_t max_blocks, bool *pending);
int srv_block_manager_fetch_poll(srv_block_manager *bm, int32_t seq, const int32_t *tokens, int32_t n, int32_t max_blocks,
                                 int32_t *added);
bool srv_block_manager_fetch_wait(srv_block_manager *bm, uint64_t timeout_ns);

/* A new sequence in *dst holding the first len tokens of src (n > 1 fan-out). KVS_ERR_NO_SLOT, or the cache's
 * error; nothing is left allocated on failure. */
int srv_block_manager_fork(srv_block_manager *bm, int32_t src, int32_t len, int32_t *dst);

/* Drops positions len.. of seq (speculative decoding's rejected guesses; tail removal). 0 when the sequence can
 * go on at len; KVS_ERR_UNSUPPORTED when it cannot (a sliding window released blocks it would need: the caller
 * closes it and recomputes), or the cache's error. */
int srv_block_manager_truncate(srv_block_manager *bm, int32_t seq, int32_t len);

/* Blocks free or evictable right now. */
int32_t srv_block_manager_available(const srv_block_manager *bm);
/* Blocks seq needs to grow by n_tokens (see kvc_blocks_needed). */
int32_t srv_block_manager_needed(const srv_block_manager *bm, int32_t seq, int32_t n_tokens);
/* The pool's counters (any thread). */
void srv_block_manager_stats(const srv_block_manager *bm, kvc_stats *out);

#endif
