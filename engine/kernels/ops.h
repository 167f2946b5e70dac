/*
 * ops.h: small f32 kernels of the CPU forward pass (internal to the engine): RMSNorm, RoPE, clamped SwiGLU and the
 * attention kernels over KV-cache rows (f32 or f16): tiles of many queries and the softmax exponentials. Each
 * attention kernel has a scalar version, an AVX2+FMA+F16C version and an AVX-512 version, selected by a level.
 * Pure functions, safe from any thread.
 */
#ifndef KVSERVE_ENGINE_OPS_H
#define KVSERVE_ENGINE_OPS_H

#include <stdbool.h>
#include <stdint.h>

/* Whether this CPU runs the AVX2+FMA+F16C kernels. */
bool eng_ops_simd_available(void);

/* y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i] for i < n (y may equal x). */
void eng_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps);

/* Rotates the first n_rot values of one head vector x[head_dim] by the angles whose cos/sin are given
 * (cs[2i] = cos theta_i, cs[2i+1] = sin theta_i, i < n_rot/2). neox: pairs (i, i + n_rot/2), else (2i, 2i+1). */
void eng_rope(float *x, int32_t n_rot, const float *cs, bool neox);

/* Kernel levels of the attention kernels: 0 scalar, 1 AVX2+FMA+F16C, 2 AVX-512 (used for hd % 16 == 0; other
 * head sizes run the AVX2 code). A level above what the CPU runs must not be passed. */
enum { ENG_OPS_SCALAR = 0, ENG_OPS_AVX2 = 1, ENG_OPS_AVX512 = 2 };
/* The best attention level this CPU runs. */
int eng_ops_attn_level(void);
/* The attention kernel level for a CPU level (kvs_cpu_level / eng_simd_level) detected once by the caller. */
int eng_ops_attn_level_for(int simd);

/* Tile kernels: m queries at once over n consecutive cache rows of hd values (row t at k + t * hd), so that a
 * cache row is loaded and converted once for all the queries of a tile (the query heads sharing a KV head,
 * times the rows of a prefill run). Queries are rows of q ([m][hd]); outputs rows of o ([m][hd]).
 * scores: s[i * lds + t] = scale * sum_d q[i][d] * K[t][d]   (i < m, t < n);
 * accum:  o[i][d] += sum_t p[i * ldp + t] * V[t][d].
 * work: scratch of ENG_ATTN_WORK(hd) floats, not overlapping the other arguments (unused by some levels).
 * Every level computes the same sums as the scalar kernels up to float rounding (summation order).
 * Batch invariance: for a given level, hd and row data, a query's results are the same bit for bit whatever
 * the other queries of the tile (m) and however many keys follow (n): the score of query i against key t
 * depends only on q[i] and K[t], and accumulating rows whose weight is 0 leaves o unchanged. So a token's
 * attention is the same in a decode step, in any prefill tile and when recomputed after preemption. */
enum {
    ENG_ATTN_CHUNK = 16, /* cache rows the vector kernels convert at a time */
};
#define ENG_ATTN_WORK(hd) ((size_t)ENG_ATTN_CHUNK * (size_t)(hd))
void eng_attn_tile_scores_f32(int level, const float *q, int32_t m, const float *k, int32_t n, int32_t hd, float scale,
                              float *s, int32_t lds, float *work);
void eng_attn_tile_scores_f16(int level, const float *q, int32_t m, const uint16_t *k, int32_t n, int32_t hd,
                              float scale, float *s, int32_t lds, float *work);
void eng_attn_tile_accum_f32(int level, float *o, int32_t m, const float *p, int32_t ldp, const float *v, int32_t n,
                             int32_t hd, float *work);
void eng_attn_tile_accum_f16(int level, float *o, int32_t m, const float *p, int32_t ldp, const uint16_t *v, int32_t n,
                             int32_t hd, float *work);

/* Softmax numerators in place: s[i] = e^(s[i] - mx) for i < n (every s[i] <= mx or NaN; 0 for NaN and where
 * the result would be denormal); returns their sum, accumulated in double. Scalar: eng_smp_exp (relative
 * error < 3.6e-7); the vector levels evaluate the same polynomial with fused multiply-adds (within a few
 * ulp of the scalar). */
double eng_attn_expsum(int level, float *s, int32_t n, float mx);

/* One attention row's softmax with an optional sink (gpt-oss: a learned logit per head that joins the denominator
 * only, as llama.cpp's soft_max does with sinks): with M = max(mx, sink), s[i] = e^(s[i] - M) in place (as
 * eng_attn_expsum; every s[i] <= mx), and returns 1 / (sum + e^(sink - M)), the factor that turns the numerators
 * into the probabilities. sink = -INFINITY means none: then exactly 1 / (float)eng_attn_expsum(level, s, n, mx). */
float eng_attn_softmax_inv(int level, float *s, int32_t n, float mx, float sink);

/* gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai) in place for i < n: x = min(g[i], limit),
 * y = clamp(u[i], -limit, limit), g[i] = x / (1 + e^(-alpha x)) * (y + 1), in float with expf, the min and the
 * clamp ordered as C++'s std::min / std::clamp (a NaN gate stays NaN, a NaN up gives NaN). Scalar. */
void eng_swiglu_oai(float *g, const float *u, int64_t n, float alpha, float limit);

#endif
