/*
 * gpu_backend.h: the narrow interface through which the engine drives a GPU backend (prefix cud_). The engine
 * owns this header; the backend (cuda/, which includes it) implements it. The engine never includes a header
 * of cuda/, so the dependency points one way: cuda/ -> engine/.
 *
 * What crosses it: a description of the model (host pointers into the mapped GGUF, uploaded once), the
 * backend's parameters, the KV pool's allocator (the engine creates its kvc_cache in device memory through
 * it), and one batch at a time with the cache slots and block tables the engine obtained from the cache.
 *
 * Threads: a backend belongs to one thread (the engine's owner). Errors: kvs_err codes (engine.h's ENG_*);
 * every CUDA call is checked and a failure is reported on stderr with the call and the CUDA error string,
 * then returned as ENG_ERR_DEVICE (or ENG_ERR_NOMEM for out-of-memory, with the sizes in err).
 * In a build without CUDA, cud_available reports no device and cud_backend_create ENG_ERR_UNSUPPORTED.
 */
#ifndef KVSERVE_ENGINE_GPU_BACKEND_H
#define KVSERVE_ENGINE_GPU_BACKEND_H

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

/* ---- the device backend ----------------------------------------------------------------------------------- */
typedef struct cud_backend cud_backend;

/* Number of usable CUDA devices (0 without a driver, without a device, or in a build without CUDA) and the
 * first one's name. Never fails. */
int32_t cud_available(char *name, size_t name_len);
/* As cud_available; when it finds no usable device, also writes the reason into why (the CUDA runtime's error
 * and the driver / runtime versions, e.g. a driver too old for this runtime; "built without CUDA" in a build
 * without CUDA). why may be NULL. Never fails. */
int32_t cud_available_why(char *name, size_t name_len, char *why, size_t why_len);

/* The memory bandwidth of device `device`, measured once: the best of a few device-to-device copies of
 * 1 GiB (or a quarter of the free memory, when less), in bytes moved (read + written) per second, into
 * *bytes_per_s. For `kvserve bench --device cuda`'s fraction of the bandwidth limit. Errors:
 * KVS_ERR_UNSUPPORTED (no CUDA in this build, no such device), KVS_ERR_NOMEM, KVS_ERR_DEVICE. */
int cud_measure_bandwidth(int32_t device, double *bytes_per_s);

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
#endif /* KVSERVE_ENGINE_GPU_BACKEND_H */
