/*
 * kv_tier.h: the disk tier below the KV block pool (part of the cache module, prefix kvt_).
 *
 * What it is: a bounded directory of files holding full prefix blocks of a kvc_cache (their keys and values,
 * byte for byte as the pool stores them), so that a prefix evicted from the pool, or lost with the process, is
 * loaded back instead of recomputed. Files: kv_tier.c (the index, the lookup and the load), kv_tier_file.c (the
 * file format, the start-up scan and the writer thread), kvt_internal.h (what they share).
 * Owns: the directory's *.kvt files (it creates, renames and deletes them; it also deletes what it finds there
 * that is truncated, corrupt, foreign or left half-written), the writer thread, the index. Borrows the cache.
 * Must never: block the pool's thread on disk writes (writes go to the writer thread through a bounded queue;
 * when the queue is full blocks are simply not saved), load a block whose bytes, tokens or identity do not
 * check out.
 *
 * What is saved: every full block the cache publishes to its prefix index (KVC_EVENT_STORED), when the index
 * does not hold it yet, is copied at once into a run; a run is a chain of consecutive blocks (each the parent
 * of the next) published by one sequence, closed when the chain breaks, when it holds KVT_RUN_MAX blocks or at
 * kvt_step_end, and then queued for the writer. So the disk holds what the pool evicts (write-through: a block
 * is saved when it is published, so a crash loses at most the queue).
 *
 * File format (native byte order, written as <dir>/.tmp-<n>.part, fdatasync'ed, renamed to <dir>/<n>.kvt;
 * a crash mid-write leaves a .part file, which the next start-up deletes):
 *   header   kvt_file_header (magic, version, the identity, the layout, the run's parent hash, n_blocks,
 *            a checksum of the header and of the table)
 *   table    n_blocks x { u64 hash; u64 data checksum; i32 tokens[block_size] }
 *   data     n_blocks x { for each layer l: K bytes, V bytes of the block (block_stride each) }
 * Checksums are XXH3-64. The hash of a block is the cache's chained hash (kv_cache.h: XXH3 of its tokens
 * seeded with its parent's hash, KVC_HASH_ROOT for the first block), so a block is found by the same key the
 * pool uses; a match also requires equal tokens and an equal parent hash, and the data's checksum is checked
 * before a byte of it enters the pool.
 *
 * Identity: kvt_params.identity (32 bytes the caller derives from the model file and every setting that changes
 * what K and V hold: rope, head shapes...) plus the layout (dtype, block size, layer and head shapes, row
 * bytes). A file whose identity or layout differ is foreign: skipped with a warning and deleted.
 *
 * Threads: kvt_on_cache_event, kvt_step_end and kvt_load are called on the cache's thread (the scheduler's);
 * the writer thread writes files, the loader thread reads them for kvt_fetch_start (kv_tier_fetch.c); kvt_get_stats
 * may be called from any thread. An internal mutex guards the
 * index (the loader reads it, the writer adds to it and deletes files from it).
 *
 * Limits: a host pool only (the tier reads and writes the storage through kvc_get_layout's base pointer: a
 * device pool is refused with KVS_ERR_UNSUPPORTED), and no sliding-window group (refused likewise).
 *
 * Errors: 0 or a negative kvs_err code, each named at its function.
 */
#ifndef KVSERVE_KV_TIER_H
#define KVSERVE_KV_TIER_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "cache/kv_cache.h"
#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_RUN_MAX 64            /* most blocks of one file the writer writes (a run) */
#define KVT_FILE_MAX_BLOCKS 65536 /* most blocks of any file (a saved session: kvt_export) */

typedef struct kvt_params {
    const char *dir;          /* the directory (created when missing, one level); required */
    uint64_t max_bytes;       /* the most bytes of *.kvt files kept (least recently used files deleted first);
                                 >= one block's file */
    uint8_t identity[32];     /* the model and its settings (see above) */
    uint64_t queue_bytes;     /* the most bytes of runs waiting for the writer; 0: 256 MiB */
    void (*warn)(void *ctx, const char *msg); /* warnings (skipped files, write errors); NULL: stderr. Called on
                                 the thread that found the problem */
    void *warn_ctx;
    void (*read_hook)(void *ctx); /* tests: called before each read of a run of blocks (a slow disk); NULL: none.
                                 Called on the thread that reads (the loader's for kvt_fetch_start) */
    void *read_hook_ctx;
} kvt_params;

typedef struct kvt_stats {
    uint64_t files, blocks, bytes;         /* what the index holds now */
    uint64_t lookups;                      /* kvt_load calls that looked for at least one block */
    uint64_t hit_blocks, hit_tokens;       /* blocks (tokens) loaded into the pool */
    uint64_t bytes_read, bytes_written;    /* data moved (files' whole size for writes) */
    uint64_t blocks_written;               /* blocks saved in files */
    uint64_t blocks_dropped;               /* blocks not saved: the queue was full, or the write failed */
    uint64_t write_errors;                 /* files that could not be written */
    uint64_t files_rejected;               /* files deleted as truncated, corrupt or foreign (scan or load) */
    uint64_t files_evicted;                /* files deleted to stay under max_bytes */
    uint64_t events_dropped;               /* tier events not recorded: KVT_EVENTS_MAX were waiting */
} kvt_stats;

#define KVT_EVENTS_MAX 65536 /* most tier events waiting for kvt_drain_events */

typedef struct kvt_tier kvt_tier;

/* Opens the tier over cache: creates dir when missing, deletes its *.part files, reads every *.kvt file's
 * header and table into the index (a file that is truncated, corrupt or foreign is deleted with a warning), then
 * deletes least recently written files while the total passes max_bytes, and starts the writer thread.
 * The cache must outlive the tier; route its events to kvt_on_cache_event (kvc_set_event_cb directly, or from
 * the callback that already receives them).
 * Errors: KVS_ERR_INVALID (NULL, no dir, max_bytes below one block's file), KVS_ERR_UNSUPPORTED (a sliding-window
 * group, or a pool whose allocator is not kvc_host_allocator()), KVS_ERR_IO (dir cannot be created or read: the
 * message says which, through warn), KVS_ERR_NOMEM, KVS_ERR_THREAD. */
int kvt_open(const kvt_params *params, kvc_cache *cache, kvt_tier **out);

/* Writes what is queued (waits for the writer), stops the threads and frees the tier. Every fetch (kvt_fetch_start)
 * must have been placed or cancelled before. NULL is a no-op. */
void kvt_close(kvt_tier *t);

/* kvc_event_cb: ctx is the tier. STORED blocks the index does not hold are copied into the current run. Cache
 * thread, inside the cache call that published them. */
void kvt_on_cache_event(void *ctx, const kvc_event *ev);

/* Saves one block given by its bytes (`bytes` == 2 * n_layer * block_stride of the pool, each layer's K then V block,
 * as the files hold them) unless the index or the current run holds it: the host tier's blocks leaving RAM
 * (cache/kv_host.h, kvh_params.spill). Appended to the current run like a published block. Cache thread. NULL, or
 * a size that is not one block's, is a no-op. */
void kvt_save(kvt_tier *t, uint64_t hash, bool has_parent, uint64_t parent_hash, const int32_t *tokens,
              const void *data, size_t bytes);

/* Closes the current run and queues it for the writer (a full queue drops it, counted). Cache thread, between
 * forwards (the scheduler calls it at the end of every step). NULL is a no-op. */
void kvt_step_end(kvt_tier *t);

/* Continues seq (allocated, holding exactly the first `have` tokens of tokens[0..n), have a multiple of the
 * block size) with the next full blocks of tokens found on disk, at most max_blocks of them: each is read,
 * checked (tokens, parent, checksum) and written into new pool blocks through the forward protocol
 * (kvc_start_forward, the bytes copied into the slots, kvc_finish_forward: they are published like computed
 * blocks). Stops at the first block not found, not valid (its file is then deleted, counted in files_rejected)
 * or not placeable (the pool is full). Writes the tokens added to *n_loaded (a multiple of the block size).
 * Cache thread, no forward pending. Errors: KVS_ERR_INVALID (NULL, have not a multiple of the block size or
 * not seq's length, n < have), or the cache's error from the forward protocol (then *n_loaded tells what was
 * loaded before it; the sequence holds exactly have + *n_loaded tokens either way). */
int kvt_load(kvt_tier *t, int32_t seq, const int32_t *tokens, int32_t n, int32_t have, int32_t max_blocks,
             int32_t *n_loaded);

/* Asynchronous loads (the scheduler's): the reads and checksum checks of kvt_load on the tier's loader thread, the
 * placing into the pool on the cache thread, so that other sequences keep stepping meanwhile.
 * kvt_fetch_start looks up (cache thread, a hash-index lookup only) the full blocks of tokens[0..n) from block
 * have / block_size on, at most max_blocks, and when the tier holds at least the first of them queues a fetch of
 * them for the loader thread: *out gets it. Errors: KVS_ERR_NOT_FOUND (the tier holds not even the first block: no
 * fetch), KVS_ERR_INVALID (NULL, have not a multiple of the block size, n < have, max_blocks < 1), KVS_ERR_NOMEM.
 * kvt_fetch_done: whether the loader has finished with f (any thread).
 * kvt_fetch_place: once done, places the blocks the loader read and checked (at most max_blocks) into seq, which must
 * hold exactly the
 * `have` tokens given to kvt_fetch_start (checked: KVS_ERR_INVALID, nothing placed), through the forward protocol as
 * kvt_load does; *n_loaded gets the tokens added (the pool may take fewer than were read: KVC_ERR_FULL stops it
 * quietly). Frees f, whatever it returns. Cache thread. Errors: KVS_ERR_STATE (not done yet: f is kept), the cache's.
 * kvt_fetch_cancel: forgets f (done or not: the loader drops it). Cache thread. NULL is a no-op.
 * kvt_fetch_wait: waits until a fetch finishes or timeout_ns pass (any thread). */
typedef struct kvt_fetch kvt_fetch;
int kvt_fetch_start(kvt_tier *t, const int32_t *tokens, int32_t n, int32_t have, int32_t max_blocks, kvt_fetch **out);
bool kvt_fetch_done(kvt_tier *t, const kvt_fetch *f);
int kvt_fetch_place(kvt_tier *t, kvt_fetch *f, int32_t seq, int32_t max_blocks, int32_t *n_loaded);
void kvt_fetch_cancel(kvt_tier *t, kvt_fetch *f);
void kvt_fetch_wait(kvt_tier *t, uint64_t timeout_ns);

/* Tier events, for a mirror of what can be served from the disk (KV-cache events with medium "DISK"): once
 * enabled, every block the index gains (a file written) is recorded as a KVC_EVENT_STORED (parents first, with its
 * tokens) and every block it loses (a file deleted: evicted, corrupt) as a KVC_EVENT_REMOVED; enabling records a
 * STORED for every block already indexed. Events past KVT_EVENTS_MAX waiting are dropped (stats.events_dropped).
 * Any thread. NULL is a no-op. */
void kvt_events_enable(kvt_tier *t);

/* Calls cb(ctx, ev) for every recorded event, in order, and forgets them (ev->block is -1; ev->tokens valid during
 * the call). The caller's thread (the cache thread in the server); cb must not call into the tier. */
void kvt_drain_events(kvt_tier *t, kvc_event_cb cb, void *ctx);

/* Saved sessions (the server's /slots API). kvt_export writes the longest chain of full blocks of tokens[0..n) that
 * the tier holds, from the first block on (after kvt_flush: what the pool published is on disk), into one file at
 * `path` in the tier's file format (written as <path>.part, synced, renamed; every block's data checked against its
 * checksum on the way); *n_saved gets its tokens (a multiple of the block size), *bytes its size. At most
 * KVT_FILE_MAX_BLOCKS blocks. Errors: KVS_ERR_INVALID (NULL, n < 0), KVS_ERR_NOT_FOUND (the tier holds not even the
 * first block: no file is written), KVS_ERR_IO (path cannot be written, or a block's file went away or is corrupt
 * meanwhile: no file is left), KVS_ERR_NOMEM. Any thread but the writer's; slow (reads and writes files). */
int kvt_export(kvt_tier *t, const int32_t *tokens, int32_t n, const char *path, int32_t *n_saved, uint64_t *bytes);

/* Checks the file at `path` whole (this tier's identity and layout, the header's, the table's and every block's
 * checksum, the hash chain from the root) and adds a copy of it to the tier, so that a prompt starting with its tokens
 * is served from disk. *tokens (malloc'd, the caller frees) and *n_tokens get its blocks' tokens, *bytes its size.
 * Errors: KVS_ERR_INVALID (NULL), KVS_ERR_IO (cannot be read, or the copy cannot be written), KVS_ERR_FORMAT (not
 * a file of this tier: another model or setting, truncated, corrupt, not a chain from the first block; warn says
 * which), KVS_ERR_TOO_LARGE (larger than max_bytes), KVS_ERR_NOMEM. Any thread but the writer's; slow. */
int kvt_import(kvt_tier *t, const char *path, int32_t **tokens, int32_t *n_tokens, uint64_t *bytes);

/* Waits until every queued run is written (or dropped). For tests and shutdown. NULL is a no-op. */
void kvt_flush(kvt_tier *t);

/* The counters (any thread). */
void kvt_get_stats(kvt_tier *t, kvt_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* KVSERVE_KV_TIER_H */
