/*
 * kvt_internal.h: what the disk tier's files share (kv_tier.c: the index, lookups and loads; kv_tier_file.c: the
 * file format, the start-up scan and the writer thread). Private to cache/ (and its tests).
 */
#ifndef KVSERVE_KVT_INTERNAL_H
#define KVSERVE_KVT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <pthread.h>

#include "cache/kv_tier.h"

#define KVT_MAGIC "KVSTIER1"
#define KVT_VERSION 1u
#define KVT_ENDIAN 0x01020304u

/* The fixed header at offset 0 of every file (native byte order; KVT_ENDIAN tells a foreign order). */
typedef struct kvt_file_header {
    char magic[8];            /* KVT_MAGIC, not NUL-terminated */
    uint32_t version;         /* KVT_VERSION */
    uint32_t endian;          /* KVT_ENDIAN as written */
    uint8_t identity[32];     /* kvt_params.identity of the writer */
    int32_t dtype, block_size, n_layer, n_kv_head, head_dim; /* the pool's layout */
    int32_t n_blocks;         /* blocks of the run, 1 .. KVT_RUN_MAX */
    uint64_t row_bytes, block_stride;
    uint64_t parent_hash;     /* the hash of the block before the run's first (when has_parent) */
    uint32_t has_parent, reserved;
    uint64_t table_checksum;  /* XXH3-64 of the table */
    uint64_t header_checksum; /* XXH3-64 of every byte of the header before this field */
} kvt_file_header;

/* One file in the index. */
typedef struct kvt_file {
    uint64_t id;              /* <id>.kvt */
    int32_t n_blocks;
    uint64_t bytes;           /* the file's size */
    uint64_t tick;            /* last write or load (LRU) */
    uint64_t parent_hash;
    bool has_parent;
    uint64_t *hashes;         /* [n_blocks] */
    uint64_t *sums;           /* [n_blocks] data checksums */
    int32_t *tokens;          /* [n_blocks][block_size] */
} kvt_file;

/* An index entry: block blk of files[file]. */
typedef struct kvt_entry {
    uint64_t hash;
    int32_t file, blk;
    int32_t next;             /* next entry of the bucket, -1 */
} kvt_entry;

/* A run of consecutive blocks waiting for the writer. */
typedef struct kvt_run {
    struct kvt_run *next;
    int32_t n, cap;           /* blocks held, allocated */
    uint64_t parent_hash;
    bool has_parent;
    uint64_t hashes[KVT_RUN_MAX];
    int32_t *tokens;          /* [cap][block_size] */
    uint8_t *data;            /* [cap][block_bytes] */
} kvt_run;

struct kvt_tier {
    kvt_params p;
    char *dir;
    kvc_cache *cache;         /* borrowed */
    kvc_layout lay;
    size_t table_entry;       /* bytes of one table entry: 16 + 4 * block_size */
    size_t block_bytes;       /* data of one block: 2 * n_layer * block_stride */

    pthread_mutex_t mu;            /* guards everything below up to `stats`, and the queue */
    pthread_cond_t cv;             /* queue changes, writer idle */
    kvt_file **files;         /* [n_files] (NULL: a free slot) */
    int32_t n_files, cap_files;
    kvt_entry *ents;          /* [cap_ents] */
    int32_t cap_ents, free_ent; /* free entries chained through next */
    int32_t *buckets;         /* [n_buckets] */
    uint32_t bucket_mask;
    uint64_t next_id, tick, total_bytes;
    kvt_stats stats;
    kvt_run *q_head, *q_tail; /* the writer's queue */
    uint64_t q_bytes;
    bool writing, stop;
    bool events_on;           /* tier events are recorded (kvt_events_enable) */
    kvs_buf ev, ev_tok;       /* recorded events (kvt_ev) and their tokens (int32) */
    pthread_t thread;
    bool thread_started;
    /* the loader thread (kv_tier_fetch.c): its queue and state, guarded by mu */
    pthread_cond_t lcv;       /* the loader's queue changed, or it must stop */
    pthread_cond_t dcv;       /* a fetch finished */
    struct kvt_fetch *lq_head, *lq_tail;
    bool lstop, loader_started;
    pthread_t loader;

    /* cache thread only */
    kvt_run *cur;             /* the run being filled */
    uint8_t *rbuf;            /* [KVT_RUN_MAX * block_bytes] read buffer of kvt_load */
    uint64_t *hbuf;           /* [hcap] chain hashes of kvt_load */
    int32_t hcap;
};

/* A recorded tier event (kvt_events_enable). */
typedef struct kvt_ev {
    kvc_event_kind kind;
    bool has_parent;
    uint64_t hash, parent;
    size_t tok;               /* STORED: its block_size tokens at ev_tok + tok */
} kvt_ev;

/* kv_tier.c: the index (call with mu held). */
int kvt_index_add(kvt_tier *t, kvt_file *f);           /* adds f (owned from now on); KVS_ERR_NOMEM */
void kvt_index_drop(kvt_tier *t, int32_t slot, bool unlink_it); /* removes files[slot] (and its file) */
void kvt_index_trim(kvt_tier *t);                      /* drops LRU files while total_bytes > max_bytes */
/* The entry holding the block with this hash, parent (when has_parent) and tokens; -1 when none. */
int32_t kvt_index_find(const kvt_tier *t, uint64_t hash, bool has_parent, uint64_t parent, const int32_t *tok);
void kvt_file_free(kvt_file *f);
void kvt_warn(kvt_tier *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int kvt_path(const kvt_tier *t, uint64_t id, const char *suffix, char *out, size_t cap);

/* kv_tier.c: lookups and loads, shared with kv_tier_fetch.c. */
/* The longest run of blocks k0.. (hashes h[k0..kmax)) held by one file, consecutively: its slot, first block, file id
 * and the data checksums; returns the count (0: not found). mu held. */
int32_t kvt_find_run(kvt_tier *t, const uint64_t *h, const int32_t *tokens, int32_t k0, int32_t kmax, int32_t *slot,
                     int32_t *blk, uint64_t *path_id, uint64_t *sums);
/* Reads m blocks from block b of file id into buf and checks their checksums; returns the count of good ones (a bad
 * one makes its file go). -1 when the file cannot be read at all (gone: deleted meanwhile). Any thread, mu not held. */
int32_t kvt_read_run(kvt_tier *t, int32_t slot, uint64_t id, int32_t b, int32_t m, const uint64_t *sums, uint8_t *buf);
/* Puts block data[0..block_bytes) into seq at position pos through the forward protocol. Cache thread. */
int kvt_place_block(kvt_tier *t, int32_t seq, int32_t pos, const int32_t *tok, const uint8_t *data);
/* t->hbuf[0..nb) = the chain hashes of tokens' first nb blocks. Cache thread. */
int kvt_chain_hashes(kvt_tier *t, const int32_t *tokens, int32_t nb);

/* kv_tier_fetch.c: the loader thread of kvt_fetch_start. */
int kvt_loader_start(kvt_tier *t);
void kvt_loader_stop(kvt_tier *t);

/* kv_tier_file.c */
uint64_t kvt_file_bytes(const kvt_tier *t, int32_t n_blocks);
void kvt_fill_header(const kvt_tier *t, kvt_file_header *h, int32_t n_blocks); /* magic, identity, layout */
/* Reads the header and table of the file at path (checked: identity, layout, size, checksums, hash chain) into a
 * kvt_file named id; NULL with *why set ("out of memory", "cannot be read", or what is wrong) when not usable. */
kvt_file *kvt_file_load(kvt_tier *t, const char *path, uint64_t id, const char **why);
int kvt_write_all(int fd, const void *p, size_t n); /* KVS_OK or KVS_ERR_IO (errno set) */
int kvt_scan(kvt_tier *t);                            /* the start-up scan */
int kvt_writer_start(kvt_tier *t);
void kvt_writer_stop(kvt_tier *t);
void kvt_run_free(kvt_run *r);

#endif
