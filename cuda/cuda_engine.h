/*
 * cuda_engine.h: the GPU backend of kvserve's engine (prefix cud_).
 *
 * What it is: the CUDA implementation of engine/gpu_backend.h plus the host-side logic its kernels use.
 * Owns: everything in device memory (weights, activations, the KV pool's storage, cuBLAS handles, graphs).
 * Must never: be included by engine/ (the engine sees only engine/gpu_backend.h), manage the KV bookkeeping
 * (cache/ does, the engine drives it), or tokenize, sample or schedule.
 *
 * Implements engine/gpu_backend.h (the model description, the batch and the backend's functions are declared
 * there: the engine includes no header of this module). This header adds the host-side logic the kernels
 * use and the tests check.
 *
 * The engine (engine/) owns the model file, the tokenizer and the KV cache bookkeeping (cache/); this module
 * owns what lives on the GPU: the weights, uploaded once in their GGUF formats; the KV block pool, allocated
 * in device memory through the cache's allocator interface (cud_kv_allocator); activations; cuBLAS handles;
 * CUDA graphs. The engine calls cud_forward with a batch whose cache slots and block tables it has already
 * obtained from the cache (kvc_start_forward); the kernels read the block tables from device memory.
 *
 * Two parts:
 *   - host-side logic in plain C (cud_host.c, always built, tested without a GPU): block-table marshalling,
 *     launch geometry, graph bookkeeping;
 *   - the device part (cud_*.cu, built when KVSERVE_CUDA is on): kernels, cuBLAS, memory management.
 *     Without CUDA in the build, cud_available() reports no device and cud_backend_create returns
 *     KVS_ERR_UNSUPPORTED.
 *
 * Threads: a backend belongs to one thread (the engine's owner). Errors: KVS_ERR_* codes of common/common.h;
 * every CUDA call is checked and a failure is reported on stderr with the call and the CUDA error string,
 * then returned as KVS_ERR_DEVICE (or KVS_ERR_NOMEM for out-of-memory, with the sizes in err).
 */
#ifndef KVSERVE_CUDA_ENGINE_H
#define KVSERVE_CUDA_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "cache/kv_cache.h"
#include "common/common.h"
#include "engine/engine.h"
#include "engine/gpu_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- host-side logic (no GPU needed) ---------------------------------------------------------------------- */

/* Block tables flattened for the kernels: tables[s * stride + b] = block b of sequence s, -1 past its end. */
typedef struct cud_tables {
    int32_t n_seqs;
    int32_t stride;             /* max blocks over the batch's sequences (>= 1) */
    int32_t *tables;            /* [n_seqs][stride] */
    int32_t *seq_len;           /* [n_seqs] */
    size_t cap;                 /* capacity of tables in elements */
    size_t seq_cap;             /* capacity of seq_len */
} cud_tables;

/* Flattens b's block tables into t (growing its buffers; t zero-initialized before first use).
 * Errors: KVS_ERR_INVALID (a table shorter than ceil(seq_len / block_size), a row pointing outside the
 * sequence list, n_seqs < 1), KVS_ERR_NOMEM. */
int cud_tables_build(cud_tables *t, const cud_batch *b, int32_t block_size);
void cud_tables_free(cud_tables *t);

/* Launch geometry of paged attention for one batch. Decode-style rows (one query per sequence) are split
 * over the sequence into partitions of `partition_tokens` when a sequence is long, so that enough blocks run
 * to fill the GPU; a second kernel reduces the partitions. */
typedef struct cud_attn_geometry {
    int32_t partition_tokens;   /* tokens per partition (a multiple of block_size) */
    int32_t max_partitions;     /* partitions of the longest sequence */
    int32_t grid_x, grid_y, grid_z; /* x: q heads, y: rows, z: partitions */
    int32_t threads;            /* threads per block */
    size_t shmem_bytes;         /* dynamic shared memory per block */
    bool needs_reduce;          /* max_partitions > 1 */
} cud_attn_geometry;

/* Chooses the geometry for n_rows query rows whose longest context is max_ctx tokens, on a device with
 * n_sm multiprocessors. Errors: KVS_ERR_INVALID for non-positive sizes. */
int cud_attn_plan(int32_t n_rows, int32_t n_head, int32_t head_dim, int32_t block_size, int32_t max_ctx,
                  int32_t n_sm, cud_attn_geometry *out);

/* Graph bookkeeping: a decode step is captured once per batch-size bucket and replayed while the shapes
 * repeat (the per-step values — tokens, positions, slots, tables — live in fixed device buffers). */
typedef struct cud_graph_key {
    int32_t n_rows;             /* batch rows (all decode: one per sequence) */
    int32_t table_stride;       /* block-table stride captured */
} cud_graph_key;

/* Bucket for a batch: rows rounded up to 1, 2, 4, 8, then multiples of 8; stride rounded up to a power of two
 * (so that a growing context re-captures rarely). Returns false when the batch is not graph-eligible
 * (n_out != n: a prefill row in it, or beyond the limits). */
bool cud_graph_bucket(const cud_batch *b, int32_t max_rows, int32_t max_stride, cud_graph_key *out);

/* Dequantizes rows x k values of a host tensor in type on the GPU and copies the f32 result to out
 * [rows][k] (for tests: the values must equal the CPU engine's bit for bit). KVS_ERR_UNSUPPORTED without
 * a device or for a type the kernels lack. */
int cud_dequantize_host(uint32_t type, const void *data, size_t nbytes, int64_t rows, int64_t k, float *out);

#ifdef __cplusplus
}
#endif
#endif /* KVSERVE_CUDA_ENGINE_H */
