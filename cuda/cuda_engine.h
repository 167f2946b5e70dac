/*
 * cuda_engine.h: the GPU backend of kvserve's engine (prefix cud_).
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
 *     ENG_ERR_UNSUPPORTED.
 *
 * Threads: a backend belongs to one thread (the engine's owner). Errors: ENG_ERR_* codes of engine/engine.h;
 * every CUDA call is checked and a failure is reported on stderr with the call and the CUDA error string,
 * then returned as ENG_ERR_DEVICE (or ENG_ERR_NOMEM for out-of-memory, with the sizes in err).
 */
#ifndef KVSERVE_CUDA_ENGINE_H
#define KVSERVE_CUDA_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "cache/kv_cache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- model description (host pointers into the mapped GGUF; copied to the device at creation) ---------- */
typedef struct cud_tensor {
    const void *data;   /* host bytes in the GGUF type; NULL when the tensor is absent (optional tensors) */
    size_t nbytes;
    uint32_t type;      /* ggml type id (engine/kernels/quant.h) */
    int64_t ne0, ne1;   /* ne0 = row length (input dim), ne1 = rows (output dim); vectors have ne1 = 1 */
} cud_tensor;

typedef struct cud_layer_desc {
    cud_tensor attn_norm;            /* [n_embd] f32 */
    cud_tensor wq, wk, wv, wo;       /* [n_embd -> n_head*hd], [n_embd -> n_kv*hd] x2, [n_head*hd -> n_embd] */
    cud_tensor bq, bk, bv;           /* qwen2 biases [n_head*hd], [n_kv*hd] x2 (absent otherwise) */
    cud_tensor q_norm, k_norm;       /* qwen3 per-head RMSNorm weights [hd] (absent otherwise) */
    cud_tensor ffn_norm;             /* [n_embd] f32 */
    cud_tensor w_gate, w_up, w_down; /* [n_embd -> n_ff] x2, [n_ff -> n_embd] */
} cud_layer_desc;

typedef struct cud_model_desc {
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_rot;
    float rope_freq_base, rope_freq_scale, rms_eps;
    bool neox_rope;                  /* rotate pairs (i, i + n_rot/2) instead of (2i, 2i+1) */
    cud_tensor tok_embd;             /* [n_embd x n_vocab] */
    cud_tensor output_norm;          /* [n_embd] f32 */
    cud_tensor output;               /* [n_embd -> n_vocab]; may alias tok_embd (tied) */
    cud_tensor rope_freqs;           /* [n_rot/2] f32 frequency factors, optional */
    const cud_layer_desc *layers;    /* [n_layer] */
} cud_model_desc;

typedef struct cud_params {
    int32_t device;             /* CUDA device ordinal */
    float memory_fraction;      /* share of the device's memory for weights + activations + KV (0, 1] */
    int32_t max_batch_tokens;   /* largest batch */
    int32_t max_seqs;           /* most sequences in one batch */
    int32_t max_blocks_per_seq; /* ceil(n_ctx / block_size) */
    int32_t block_size;         /* KV block size in tokens */
    kvc_dtype kv_dtype;         /* F16 or F32 on the GPU */
    bool use_graphs;            /* capture decode steps as CUDA graphs */
} cud_params;

/* ---- a batch, as the engine hands it over --------------------------------------------------------------- */
typedef struct cud_batch {
    int32_t n;                  /* rows */
    const int32_t *token;       /* [n] */
    const int32_t *pos;         /* [n] */
    const int32_t *seq_index;   /* [n] index into the batch's sequence list (0 .. n_seqs-1) */
    const int32_t *slot;        /* [n] cache slot of each row (kvc_start_forward) */
    int32_t n_seqs;
    const int32_t *seq_len;     /* [n_seqs] sequence length including this batch */
    const int32_t *const *block_tables; /* [n_seqs] -> the sequence's block ids (kvc_block_table) */
    const int32_t *n_blocks;    /* [n_seqs] */
    int32_t n_out;              /* rows that want logits */
    const int32_t *out_rows;    /* [n_out] row indices, ascending */
} cud_batch;

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
 * Errors: ENG_ERR_INVALID (a table shorter than ceil(seq_len / block_size), a row pointing outside the
 * sequence list, n_seqs < 1), ENG_ERR_NOMEM. */
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
 * n_sm multiprocessors. Errors: ENG_ERR_INVALID for non-positive sizes. */
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
 * [rows][k] (for tests: the values must equal the CPU engine's bit for bit). ENG_ERR_UNSUPPORTED without
 * a device or for a type the kernels lack. */
int cud_dequantize_host(uint32_t type, const void *data, size_t nbytes, int64_t rows, int64_t k, float *out);

/* ---- the device backend ----------------------------------------------------------------------------------- */
typedef struct cud_backend cud_backend;

/* Number of usable CUDA devices (0 without a driver, without a device, or in a build without CUDA) and the
 * first one's name. Never fails. */
int32_t cud_available(char *name, size_t name_len);
/* As cud_available; when it finds no usable device, also writes the reason into why (the CUDA runtime's error
 * and the driver / runtime versions, e.g. a driver too old for this runtime; "built without CUDA" in a build
 * without CUDA). why may be NULL. Never fails. */
int32_t cud_available_why(char *name, size_t name_len, char *why, size_t why_len);

/* Uploads the weights and prepares activations and cuBLAS; reports in *kv_budget_bytes how much device memory
 * remains for the KV pool under memory_fraction. Errors: ENG_ERR_UNSUPPORTED (no CUDA in this build, or a
 * tensor type the kernels lack), ENG_ERR_NOMEM (device memory: err gives the sizes), ENG_ERR_DEVICE. */
int cud_backend_create(const cud_model_desc *model, const cud_params *params, cud_backend **out,
                       size_t *kv_budget_bytes, char *err, size_t err_len);
void cud_backend_free(cud_backend *be);

/* The allocator through which the engine creates its kvc_cache in device memory (valid for the backend's
 * lifetime). After creating the cache, the engine passes its layout with cud_backend_set_kv. */
const kvc_allocator *cud_kv_allocator(cud_backend *be);
int cud_backend_set_kv(cud_backend *be, const kvc_layout *layout);

/* Runs one batch: K/V are written at the batch's slots and attention reads through the block tables. Logits
 * of the out rows are copied to logits[n_out][n_vocab] (host). */
int cud_forward(cud_backend *be, const cud_batch *batch, float *logits);

/* Re-rotates the cached keys at slots[0..n) by delta positions (context shift: a key rotated for position p
 * now sits at p + delta), in every layer. */
int cud_rerotate(cud_backend *be, const int32_t *slots, int32_t n, int32_t delta);

#ifdef __cplusplus
}
#endif
#endif /* KVSERVE_CUDA_ENGINE_H */
