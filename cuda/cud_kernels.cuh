// cud_kernels.cuh: the CUDA backend's kernels and their launchers (internal to the cuda module).
// Formats follow ggml's block layouts; dequantization uses explicitly rounded operations (__fmul_rn,
// __fadd_rn, __fsub_rn) in the same order as the CPU engine, so values are bit-identical to it.
#ifndef KVSERVE_CUD_KERNELS_CUH
#define KVSERVE_CUD_KERNELS_CUH

#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_fp16.h>

#include "cuda/cud_deq.cuh" // ggml type ids and dequantization


// Values per block and bytes per block of a type; 0 for types the kernels lack.
int cud_type_block_elems(uint32_t type);
int cud_type_block_bytes(uint32_t type);

// y[r][j] for rows [0, rows) of a [rows][k] matrix in type -> f32 or f16 output (any number of rows).
cudaError_t cud_dequant_f32(uint32_t type, const void *w, int64_t rows, int64_t k, float *y, cudaStream_t st);
cudaError_t cud_dequant_f16(uint32_t type, const void *w, int64_t rows, int64_t k, __half *y, cudaStream_t st);

// Embedding rows: y[i][:] = dequant(table row ids[i]), table [n_vocab][k] in type.
cudaError_t cud_get_rows(uint32_t type, const void *table, int64_t k, const int32_t *ids, int32_t n, float *y,
                         cudaStream_t st);

// y[r][j] = sum_i W[j][i] * x[r][i] for r < m (small m: one warp per output row, weights read once).
cudaError_t cud_matvec(uint32_t type, const void *w, int64_t n_out, int64_t k, const float *x, int32_t m,
                       float *y, cudaStream_t st);

// Elementwise and normalization. RMSNorm follows the CPU engine (engine/kernels/ops.c): the sum of squares in double,
// scale = (float)(1 / sqrt(ss / n + eps)), y = (x * scale) * w with every operation rounded as on the CPU.
cudaError_t cud_rmsnorm(const float *x, const float *w, float *y, int32_t rows, int32_t n, float eps,
                        cudaStream_t st);
// Per-head RMSNorm over head_dim (qwen3 q/k norms): x [rows][n_heads][hd] in place.
cudaError_t cud_head_rmsnorm(float *x, const float *w, int32_t rows, int32_t n_heads, int32_t hd, float eps,
                             cudaStream_t st);
cudaError_t cud_add_bias(float *x, const float *b, int32_t rows, int32_t n, cudaStream_t st);
cudaError_t cud_add(float *x, const float *y, int64_t n, cudaStream_t st);
// g[i] = silu(g[i]) * u[i]
cudaError_t cud_swiglu(float *g, const float *u, int64_t n, cudaStream_t st);
// y[i][:] = x[rows[i]][:] for i < n_rows; rows of n floats.
cudaError_t cud_gather_rows(const float *x, int64_t n, const int32_t *rows, int32_t n_rows, float *y,
                            cudaStream_t st);
cudaError_t cud_f32_to_f16(const float *x, __half *y, int64_t n, cudaStream_t st);

typedef struct cud_rope_params {
    int32_t n_rot, head_dim;
    bool neox;                 // rotate pairs (i, i + n_rot/2) instead of (2i, 2i+1)
} cud_rope_params;

// RoPE angles as the CPU engine computes them: theta_i = pos * inv_freq[i] in double, cs[r][2i] = (float)
// cos(theta_i), cs[r][2i+1] = (float)sin(theta_i). inv_freq [n_rot/2] is the engine's f32 table
// (freq_scale * base^(-2i/n_rot) / rope_freqs[i], computed in double on the host).
cudaError_t cud_rope_cs(const int32_t *pos, const float *inv_freq, int32_t rows, int32_t n_rot, float *cs,
                        cudaStream_t st);
// Rotates x [rows][n_heads][head_dim] in place with the angles cs [rows][n_rot] (the first n_rot dims of
// each head; x0' = x0 c - x1 s, x1' = x0 s + x1 c, rounded as on the CPU).
cudaError_t cud_rope(float *x, const float *cs, int32_t rows, int32_t n_heads, const cud_rope_params *rp,
                     cudaStream_t st);

typedef struct cud_kv_view {
    void *base;            // storage base (kvc_layout.base)
    size_t layer_bytes, block_stride, head_stride, row_bytes;
    int32_t block_size, n_kv_head, head_dim;
    bool f16;              // else f32
} cud_kv_view;

// Writes k, v [rows][n_kv*hd] of layer into the cache at slot[rows] (slot < 0: skipped, padding rows).
cudaError_t cud_kv_store(const cud_kv_view *kv, int32_t layer, const float *k, const float *v,
                         const int32_t *slot, int32_t rows, cudaStream_t st);

// Re-rotates the cached keys at slots[n], in every layer, by the angles cs [n_rot] (those of delta positions).
cudaError_t cud_kv_rerotate(const cud_kv_view *kv, int32_t n_layer, const int32_t *slots, int32_t n,
                            const float *cs, const cud_rope_params *rp, cudaStream_t st);

typedef struct cud_attn_args {
    const float *q;            // [rows][n_head][hd]
    float *out;                // [rows][n_head][hd]
    const int32_t *pos;        // [rows]  a row attends to positions 0..pos of its sequence
    const int32_t *seq_index;  // [rows]
    const int32_t *tables;     // [n_seqs][stride]
    int32_t stride;
    int32_t rows, n_head, n_kv_head, hd;
    int32_t partition_tokens, partitions; // split over the context (see cud_attn_plan)
    float *part_acc;           // [rows][n_head][partitions][hd]   (partitions > 1)
    float *part_ml;            // [rows][n_head][partitions][2]    running max, sum
    float scale;
} cud_attn_args;

// Paged attention over the block tables, one layer; rows may be decode tokens or prefill chunks of many
// sequences (causality from pos: the chunk's earlier rows are already in the cache).
cudaError_t cud_paged_attention(const cud_kv_view *kv, int32_t layer, const cud_attn_args *a, cudaStream_t st);

// ---- split-KV decode attention (cud_attn.cuh) ----
// Whether cud_attn_split takes the shape: n_head / n_kv_head <= 8 query heads per KV head, a K/V row of a
// power-of-two count of 16-byte words (head_dim 8, 16, ..., 256 in an f16 cache; 4, ..., 256 in f32).
bool cud_attn_split_supported(int32_t n_head, int32_t n_kv_head, int32_t head_dim, bool f16);
// The `partitions` to pass for rows whose contexts (pos + 1) are at most max_ctx (<= 32).
int cud_attn_split_grid(int32_t max_ctx);
// The same attention as cud_paged_attention, one block per (split, KV head, row) with the query heads of a
// GQA group sharing every K/V word read. A row's splits depend on its own context only (attn_n_split), never
// on the batch. a->partitions: cud_attn_split_grid of the longest context; part_acc [rows][n_head][32][hd]
// and part_ml [rows][n_head][32][2] (the split stride is always 32) when it is > 1. partition_tokens unused.
cudaError_t cud_attn_split(const cud_kv_view *kv, int32_t layer, const cud_attn_args *a, cudaStream_t st);

// ---- decode products (m <= 8 activation rows; see cud_mmv.cuh) ----
// Quantized activation rows (device buffers of at least m rows): f32 copy, Q8_0 and Q8_K forms.
typedef struct cud_act_bufs {
    float *xf;   // [m][k]
    int8_t *q8;  // [m][k]
    float *d8;   // [m][k/32]
    int8_t *qk;  // [m][k]      (written when k % 256 == 0)
    float *dk;   // [m][k/256]
    int16_t *bk; // [m][k/16]
} cud_act_bufs;

// Whether cud_mmv takes a [*][k] matrix of type (Q4_0, Q5_0, Q8_0 with k % 32 == 0; Q4_K, Q5_K, Q6_K with
// k % 256 == 0; F16, BF16 with k % 32 == 0: cud_act_quant needs it).
bool cud_mmv_supported(uint32_t type, int64_t k);
// x [m][k] f32 -> o: RMSNorm with weights norm_w first when norm_w is not NULL (k_rmsnorm's arithmetic), then
// the CPU engine's Q8_0 and (k % 256 == 0) Q8_K activation quantization. k % 32 == 0, 1 <= m.
cudaError_t cud_act_quant(const float *x, const float *norm_w, float eps, int32_t m, int64_t k,
                          const cud_act_bufs *o, cudaStream_t st);
// y[a][j] = sum_i W[j][i] * x[a][i] for a < m <= 8 from the activations cud_act_quant wrote. The allocation
// of w must be padded to a multiple of 16 bytes (k_mmv reads aligned 16-byte words).
cudaError_t cud_mmv(uint32_t type, const void *w, int64_t n_out, int64_t k, const cud_act_bufs *x, int32_t m,
                    float *y, int n_sm, cudaStream_t st);

// The opening of a self-test (cud_fattn_selftest, cud_sample_selftest): when *msg is NULL or *msg_len 0 they
// are pointed at scratch (scratch_len > 0); *msg is emptied. 0 when a CUDA device is present, else
// KVS_ERR_UNSUPPORTED with "no CUDA device" in *msg.
int cud_selftest_open(char **msg, size_t *msg_len, char *scratch, size_t scratch_len);

#endif
