/* ops.c: f32 kernels of the forward pass, scalar, AVX2+FMA+F16C and (attention) AVX-512. */
#include "engine/kernels/ops.h"
#include "common/common.h"

#include <math.h>
#include <string.h>

#include "engine/kernels/quant.h"
#include "engine/kernels/sampler_kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1
#endif

bool eng_ops_simd_available(void) {
    /* AVX2 + FMA + F16C with the OS saving YMM state: common's KVS_CPU_AVX2 level */
    return kvs_cpu_detect() >= KVS_CPU_AVX2;
}

void eng_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale * w[i];
}

void eng_rope(float *x, int32_t n_rot, const float *cs, bool neox) {
    int32_t half = n_rot / 2;
    for (int32_t i = 0; i < half; i++) {
        int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float c = cs[2 * i], s = cs[2 * i + 1];
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

/* ---- scalar ---- */
static float dot_f32_scalar(const float *a, const float *b, int32_t n) {
    float s = 0.0f;
    for (int32_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
static float dot_f16_scalar(const float *a, const uint16_t *b, int32_t n) {
    float s = 0.0f;
    for (int32_t i = 0; i < n; i++) s += a[i] * eng_fp16_to_f32(b[i]);
    return s;
}
static void axpy_f32_scalar(float *y, float s, const float *x, int32_t n) {
    for (int32_t i = 0; i < n; i++) y[i] += s * x[i];
}
static void axpy_f16_scalar(float *y, float s, const uint16_t *x, int32_t n) {
    for (int32_t i = 0; i < n; i++) y[i] += s * eng_fp16_to_f32(x[i]);
}

/* Tile kernels, scalar: the reference the vector versions are tested against (per query and cache row: a dot
 * product then the scale; one axpy per cache row). */
static void tile_scores_f32_scalar(const float *q, int32_t m, const float *k, int32_t n, int32_t hd, float scale,
                                   float *s, int32_t lds) {
    for (int32_t i = 0; i < m; i++)
        for (int32_t t = 0; t < n; t++)
            s[(size_t)i * lds + t] = dot_f32_scalar(q + (size_t)i * hd, k + (size_t)t * hd, hd) * scale;
}
static void tile_scores_f16_scalar(const float *q, int32_t m, const uint16_t *k, int32_t n, int32_t hd, float scale,
                                   float *s, int32_t lds) {
    for (int32_t i = 0; i < m; i++)
        for (int32_t t = 0; t < n; t++)
            s[(size_t)i * lds + t] = dot_f16_scalar(q + (size_t)i * hd, k + (size_t)t * hd, hd) * scale;
}
static void tile_accum_f32_scalar(float *o, int32_t m, const float *p, int32_t ldp, const float *v, int32_t n,
                                  int32_t hd) {
    for (int32_t i = 0; i < m; i++)
        for (int32_t t = 0; t < n; t++) axpy_f32_scalar(o + (size_t)i * hd, p[(size_t)i * ldp + t], v + (size_t)t * hd, hd);
}
static void tile_accum_f16_scalar(float *o, int32_t m, const float *p, int32_t ldp, const uint16_t *v, int32_t n,
                                  int32_t hd) {
    for (int32_t i = 0; i < m; i++)
        for (int32_t t = 0; t < n; t++) axpy_f16_scalar(o + (size_t)i * hd, p[(size_t)i * ldp + t], v + (size_t)t * hd, hd);
}

static double expsum_scalar(float *s, int32_t n, float mx) {
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += (s[i] = eng_smp_exp(s[i] - mx));
    return sum;
}

#ifdef HAVE_X86
#define TGT __attribute__((target("avx2,fma,f16c")))
TGT static float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}
TGT static float dot_f32_avx2(const float *a, const float *b, int32_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    float s = hsum8(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}
TGT static float dot_f16_avx2(const float *a, const uint16_t *b, int32_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 b0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i)));
        __m256 b1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i + 8)));
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), b0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), b1, acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i))),
                               acc0);
    float s = hsum8(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) s += a[i] * eng_fp16_to_f32(b[i]);
    return s;
}
/* o[c0 .. c0 + 8 * NACC) += sum_t p[t] * V[t][same columns], accumulators in registers across the rows */
#define ACCUM_CHUNK(LOADV)                                                                                       \
    int32_t c0 = 0;                                                                                              \
    for (; c0 + 64 <= hd; c0 += 64) { /* 8 accumulators: 8 independent FMA chains per row */                   \
        __m256 a0 = _mm256_loadu_ps(o + c0), a1 = _mm256_loadu_ps(o + c0 + 8);                                   \
        __m256 a2 = _mm256_loadu_ps(o + c0 + 16), a3 = _mm256_loadu_ps(o + c0 + 24);                             \
        __m256 a4 = _mm256_loadu_ps(o + c0 + 32), a5 = _mm256_loadu_ps(o + c0 + 40);                             \
        __m256 a6 = _mm256_loadu_ps(o + c0 + 48), a7 = _mm256_loadu_ps(o + c0 + 56);                             \
        for (int32_t t = 0; t < n; t++) {                                                                        \
            __m256 pv = _mm256_set1_ps(p[t]);                                                                    \
            const size_t b = (size_t)t * hd + c0;                                                                \
            a0 = _mm256_fmadd_ps(pv, LOADV(b), a0);                                                              \
            a1 = _mm256_fmadd_ps(pv, LOADV(b + 8), a1);                                                          \
            a2 = _mm256_fmadd_ps(pv, LOADV(b + 16), a2);                                                         \
            a3 = _mm256_fmadd_ps(pv, LOADV(b + 24), a3);                                                         \
            a4 = _mm256_fmadd_ps(pv, LOADV(b + 32), a4);                                                         \
            a5 = _mm256_fmadd_ps(pv, LOADV(b + 40), a5);                                                         \
            a6 = _mm256_fmadd_ps(pv, LOADV(b + 48), a6);                                                         \
            a7 = _mm256_fmadd_ps(pv, LOADV(b + 56), a7);                                                         \
        }                                                                                                        \
        _mm256_storeu_ps(o + c0, a0);                                                                            \
        _mm256_storeu_ps(o + c0 + 8, a1);                                                                        \
        _mm256_storeu_ps(o + c0 + 16, a2);                                                                       \
        _mm256_storeu_ps(o + c0 + 24, a3);                                                                       \
        _mm256_storeu_ps(o + c0 + 32, a4);                                                                       \
        _mm256_storeu_ps(o + c0 + 40, a5);                                                                       \
        _mm256_storeu_ps(o + c0 + 48, a6);                                                                       \
        _mm256_storeu_ps(o + c0 + 56, a7);                                                                       \
    }                                                                                                            \
    for (; c0 + 32 <= hd; c0 += 32) {                                                                            \
        __m256 a0 = _mm256_loadu_ps(o + c0), a1 = _mm256_loadu_ps(o + c0 + 8);                                   \
        __m256 a2 = _mm256_loadu_ps(o + c0 + 16), a3 = _mm256_loadu_ps(o + c0 + 24);                             \
        for (int32_t t = 0; t < n; t++) {                                                                        \
            __m256 pv = _mm256_set1_ps(p[t]);                                                                    \
            const size_t b = (size_t)t * hd + c0;                                                                \
            a0 = _mm256_fmadd_ps(pv, LOADV(b), a0);                                                              \
            a1 = _mm256_fmadd_ps(pv, LOADV(b + 8), a1);                                                          \
            a2 = _mm256_fmadd_ps(pv, LOADV(b + 16), a2);                                                         \
            a3 = _mm256_fmadd_ps(pv, LOADV(b + 24), a3);                                                         \
        }                                                                                                        \
        _mm256_storeu_ps(o + c0, a0);                                                                            \
        _mm256_storeu_ps(o + c0 + 8, a1);                                                                        \
        _mm256_storeu_ps(o + c0 + 16, a2);                                                                       \
        _mm256_storeu_ps(o + c0 + 24, a3);                                                                       \
    }                                                                                                            \
    for (; c0 + 8 <= hd; c0 += 8) {                                                                              \
        __m256 a0 = _mm256_loadu_ps(o + c0);                                                                     \
        for (int32_t t = 0; t < n; t++) a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), LOADV((size_t)t * hd + c0), a0); \
        _mm256_storeu_ps(o + c0, a0);                                                                            \
    }

/* The 8 sums of a0..a7 as one vector [sum(a0), ..., sum(a7)]: pairwise adds, then the two 128-bit halves. */
TGT static __m256 reduce8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
    __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}
/* Scores of n key rows: 8 rows at a time, so 8 independent FMA chains run and one reduction serves 8 rows
 * (one row at a time, the FMA latency and a horizontal sum per row dominated). The last group repeats the
 * last row and keeps only the valid lanes, so every row is summed in the same order whatever n (a key's
 * score must not depend on how many keys follow it: see ops.h). Columns past the last multiple of 8 are
 * added one by one after the reduction; head sizes under 8 take the one-row path for every key. */
#define SCORES8(LOADK, DOT, ELEM)                                                                                \
    int32_t t = 0;                                                                                               \
    const int32_t hd8 = hd & ~7;                                                                                 \
    const __m256 vscale = _mm256_set1_ps(scale);                                                                 \
    for (; hd8 > 0 && t < n; t += 8) {                                                                           \
        size_t rr[8];                                                                                            \
        for (int32_t j = 0; j < 8; j++) rr[j] = (size_t)(t + j < n ? t + j : n - 1) * hd;                        \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;           \
        for (int32_t c = 0; c < hd8; c += 8) {                                                                   \
            const __m256 qv = _mm256_loadu_ps(q + c);                                                            \
            a0 = _mm256_fmadd_ps(qv, LOADK(rr[0] + c), a0);                                                      \
            a1 = _mm256_fmadd_ps(qv, LOADK(rr[1] + c), a1);                                                      \
            a2 = _mm256_fmadd_ps(qv, LOADK(rr[2] + c), a2);                                                      \
            a3 = _mm256_fmadd_ps(qv, LOADK(rr[3] + c), a3);                                                      \
            a4 = _mm256_fmadd_ps(qv, LOADK(rr[4] + c), a4);                                                      \
            a5 = _mm256_fmadd_ps(qv, LOADK(rr[5] + c), a5);                                                      \
            a6 = _mm256_fmadd_ps(qv, LOADK(rr[6] + c), a6);                                                      \
            a7 = _mm256_fmadd_ps(qv, LOADK(rr[7] + c), a7);                                                      \
        }                                                                                                        \
        __m256 r = reduce8(a0, a1, a2, a3, a4, a5, a6, a7);                                                      \
        if (hd8 < hd) {                                                                                          \
            float tail[8];                                                                                       \
            for (int32_t j = 0; j < 8; j++) {                                                                    \
                tail[j] = 0.0f;                                                                                  \
                for (int32_t c = hd8; c < hd; c++) tail[j] += q[c] * ELEM(rr[j] + c);                          \
            }                                                                                                    \
            r = _mm256_add_ps(r, _mm256_loadu_ps(tail));                                                         \
        }                                                                                                        \
        r = _mm256_mul_ps(r, vscale);                                                                            \
        if (n - t >= 8) {                                                                                        \
            _mm256_storeu_ps(out + t, r);                                                                        \
        } else {                                                                                                 \
            float tmp[8];                                                                                        \
            _mm256_storeu_ps(tmp, r);                                                                            \
            memcpy(out + t, tmp, (size_t)(n - t) * sizeof *out);                                                 \
        }                                                                                                        \
    }                                                                                                            \
    for (; t < n; t++) out[t] = DOT(q, k + (size_t)t * hd, hd) * scale;

#define LOADK_F32(i) _mm256_loadu_ps(k + (i))
#define LOADK_F16(i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + (i))))
#define ELEM_F32(i) k[i]
#define ELEM_F16(i) eng_fp16_to_f32(k[i])
TGT static void scores_f32_avx2(const float *q, const float *k, int32_t n, int32_t hd, float scale, float *out) {
    SCORES8(LOADK_F32, dot_f32_avx2, ELEM_F32)
}
TGT static void scores_f16_avx2(const float *q, const uint16_t *k, int32_t n, int32_t hd, float scale, float *out) {
    SCORES8(LOADK_F16, dot_f16_avx2, ELEM_F16)
}

#define LOAD_F32(i) _mm256_loadu_ps(v + (i))
#define LOAD_F16(i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + (i))))
TGT static void accum_f32_avx2(float *o, const float *p, const float *v, int32_t n, int32_t hd) {
    ACCUM_CHUNK(LOAD_F32)
    for (; c0 < hd; c0++)
        for (int32_t t = 0; t < n; t++) o[c0] += p[t] * v[(size_t)t * hd + c0];
}
TGT static void accum_f16_avx2(float *o, const float *p, const uint16_t *v, int32_t n, int32_t hd) {
    ACCUM_CHUNK(LOAD_F16)
    for (; c0 < hd; c0++)
        for (int32_t t = 0; t < n; t++) o[c0] += p[t] * eng_fp16_to_f32(v[(size_t)t * hd + c0]);
}

/* Tile kernels, AVX2: a chunk of f16 cache rows is converted once into `work` and then serves every query
 * of the tile (the f16 conversion is shared by the tile's queries). */
TGT static void cvt_f16_avx2(const uint16_t *x, int32_t n, float *y) {
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = eng_fp16_to_f32(x[i]);
}
TGT static void tile_scores_f32_avx2(const float *q, int32_t m, const float *k, int32_t n, int32_t hd, float scale,
                                     float *s, int32_t lds) {
    for (int32_t i = 0; i < m; i++) scores_f32_avx2(q + (size_t)i * hd, k, n, hd, scale, s + (size_t)i * lds);
}
TGT static void tile_scores_f16_avx2(const float *q, int32_t m, const uint16_t *k, int32_t n, int32_t hd, float scale,
                                     float *s, int32_t lds, float *work) {
    if (m == 1) {
        scores_f16_avx2(q, k, n, hd, scale, s);
        return;
    }
    for (int32_t t0 = 0; t0 < n; t0 += ENG_ATTN_CHUNK) {
        int32_t nt = n - t0 < ENG_ATTN_CHUNK ? n - t0 : ENG_ATTN_CHUNK;
        cvt_f16_avx2(k + (size_t)t0 * hd, nt * hd, work);
        tile_scores_f32_avx2(q, m, work, nt, hd, scale, s + t0, lds);
    }
}
TGT static void tile_accum_f32_avx2(float *o, int32_t m, const float *p, int32_t ldp, const float *v, int32_t n,
                                    int32_t hd) {
    for (int32_t i = 0; i < m; i++) accum_f32_avx2(o + (size_t)i * hd, p + (size_t)i * ldp, v, n, hd);
}
TGT static void tile_accum_f16_avx2(float *o, int32_t m, const float *p, int32_t ldp, const uint16_t *v, int32_t n,
                                    int32_t hd, float *work) {
    if (m == 1) {
        accum_f16_avx2(o, p, v, n, hd);
        return;
    }
    for (int32_t t0 = 0; t0 < n; t0 += ENG_ATTN_CHUNK) {
        int32_t nt = n - t0 < ENG_ATTN_CHUNK ? n - t0 : ENG_ATTN_CHUNK;
        cvt_f16_avx2(v + (size_t)t0 * hd, nt * hd, work);
        tile_accum_f32_avx2(o, m, p + t0, ldp, work, nt, hd);
    }
}

/* The softmax exponentials with FMA: eng_smp_exp's range reduction and polynomial (Cephes expf), the same
 * constants, each mul + add fused (so within about 1 ulp of the scalar, not bit-exact), sums in double. */
#define EXP_LO_F (-87.3365478515625f) /* below: 0 (the result would be denormal) */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO (-2.12194440e-4f)
#define EXP_P0 1.9875691500E-4f
#define EXP_P1 1.3981999507E-3f
#define EXP_P2 8.3334519073E-3f
#define EXP_P3 4.1665795894E-2f
#define EXP_P4 1.6666665459E-1f
#define EXP_P5 5.0000001201E-1f
/* exp(x) = 2^n * (1 + r + r^2 * poly(r)) with r = x - n * ln 2 (ln 2 in two parts): y = the bracket, at vector
 * width W (256 or 512; the same operations at both, so the same floats per lane). */
#define EXP_MANTISSA(W, x, n, y)                                                                          \
    do {                                                                                                  \
        __m##W r_ = _mm##W##_fnmadd_ps(n, _mm##W##_set1_ps(EXP_LN2_HI), x);                               \
        r_ = _mm##W##_fnmadd_ps(n, _mm##W##_set1_ps(EXP_LN2_LO), r_);                                     \
        __m##W p_ = _mm##W##_fmadd_ps(_mm##W##_set1_ps(EXP_P0), r_, _mm##W##_set1_ps(EXP_P1));            \
        p_ = _mm##W##_fmadd_ps(p_, r_, _mm##W##_set1_ps(EXP_P2));                                         \
        p_ = _mm##W##_fmadd_ps(p_, r_, _mm##W##_set1_ps(EXP_P3));                                         \
        p_ = _mm##W##_fmadd_ps(p_, r_, _mm##W##_set1_ps(EXP_P4));                                         \
        p_ = _mm##W##_fmadd_ps(p_, r_, _mm##W##_set1_ps(EXP_P5));                                         \
        y = _mm##W##_add_ps(_mm##W##_fmadd_ps(p_, _mm##W##_mul_ps(r_, r_), r_), _mm##W##_set1_ps(1.0f));  \
    } while (0)
TGT static __m256 exp8_fma(__m256 x) { /* x <= 0 or NaN */
    const __m256 valid = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO_F), _CMP_GE_OQ); /* false for NaN */
    x = _mm256_max_ps(x, _mm256_set1_ps(EXP_LO_F));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 y;
    EXP_MANTISSA(256, x, n, y);
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(bits)), valid);
}
TGT static double expsum_avx2(float *s, int32_t n, float mx) {
    const __m256 vm = _mm256_set1_ps(mx);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0;
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8_fma(_mm256_sub_ps(_mm256_loadu_ps(s + i), vm));
        _mm256_storeu_ps(s + i, e);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(s0, s1));
    double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    return sum + expsum_scalar(s + i, n - i, mx);
}

/* ---- AVX-512: 16 values per instruction; head sizes that are multiples of 16 ---------------------------- */
#define TGT512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define LOADK512_F32(i) _mm512_loadu_ps(k + (i))
#define LOADK512_F16(i) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + (i))))

/* exp8_fma sixteen at a time; 2^n applied with scalef, the tail with masks. */
TGT512 static double expsum_avx512(float *s, int32_t n, float mx) {
    const __m512 vm = _mm512_set1_ps(mx);
    __m512d s0 = _mm512_setzero_pd(), s1 = s0;
    for (int32_t i = 0; i < n; i += 16) {
        const __mmask16 live = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(live, s + i), vm);
        const __mmask16 valid = _mm512_mask_cmp_ps_mask(live, x, _mm512_set1_ps(EXP_LO_F), _CMP_GE_OQ);
        x = _mm512_max_ps(x, _mm512_set1_ps(EXP_LO_F));
        const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 y;
        EXP_MANTISSA(512, x, k, y);
        const __m512 e = _mm512_maskz_mov_ps(valid, _mm512_scalef_ps(y, k));
        _mm512_mask_storeu_ps(s + i, live, e);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

/* Tile kernels, AVX-512 (head sizes that are multiples of 16). On the CPUs this was tuned on (Zen 4), an
 * f16 -> f32 conversion of 16 values and a 16-float store each take about two FMA slots, so the kernels
 * convert a cache row once and use it from registers for several queries:
 * - scores: 4 queries x 4 keys per step, 16 accumulators, each converted key chunk feeding 4 FMAs, then one
 *   16-way reduction for the 16 dot products. Every (query, key) pair is summed in the same order whatever
 *   m and n (remainders repeat the last query or key and drop the copies), so a token's scores are the same
 *   in a decode step and in a prefill tile. (A transposed-keys variant for many queries was faster for long
 *   prefills but summed in another order, which made recomputed sequences drift from decoded ones.)
 * - accumulation: 4 queries x 64 columns per step (16 accumulators), each converted V chunk feeding 4 FMAs;
 *   with many queries (m >= CONVERT_MIN) each 16-row chunk of f16 V is converted once into work first
 *   (conversion is exact, so the sums are unchanged). */
enum { CONVERT_MIN = 8 };
#define TGT512VL __attribute__((target("avx512f,avx512vl,avx2,fma,f16c")))
#define INLINE512 static inline __attribute__((always_inline)) TGT512VL

/* [sum(x0), ..., sum(x15)]: pairs of inputs share a register after each of 4 stages (unpack ps, unpack pd,
 * then two exchanges of 128-bit lanes), so that lane i ends up holding the full sum of xi. */
INLINE512 __m512 reduce16(__m512 x0, __m512 x1, __m512 x2, __m512 x3, __m512 x4, __m512 x5, __m512 x6, __m512 x7,
                          __m512 x8, __m512 x9, __m512 x10, __m512 x11, __m512 x12, __m512 x13, __m512 x14,
                          __m512 x15) {
#define RPS(a, b) _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
#define RPD(a, b)                                                                                                \
    _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))),                 \
                  _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))))
#define RLN(a, b) _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD))
    /* per 128-bit lane: y holds 2 partial sums of each input of its pair, z one of each of its 4 inputs */
    const __m512 z0 = RPD(RPS(x0, x1), RPS(x2, x3)), z1 = RPD(RPS(x4, x5), RPS(x6, x7));
    const __m512 z2 = RPD(RPS(x8, x9), RPS(x10, x11)), z3 = RPD(RPS(x12, x13), RPS(x14, x15));
    return RLN(RLN(z0, z1), RLN(z2, z3));
#undef RPS
#undef RPD
#undef RLN
}

/* Scores of J <= 4 queries (q + j * hd) against the 4 keys k0..k3 (hd values each): lane 4j + i of the
 * result = q_j . k_i (lanes of queries j >= J are 0). LOADK(ptr) loads 16 values as floats. */
#define DOT4X4(LOADK)                                                                                            \
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,          \
           a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;    \
    for (int32_t c = 0; c < hd; c += 16) {                                                                       \
        const __m512 k0 = LOADK(k0p + c), k1 = LOADK(k1p + c), k2 = LOADK(k2p + c), k3 = LOADK(k3p + c);        \
        __m512 qv = _mm512_loadu_ps(q + c);                                                                      \
        a00 = _mm512_fmadd_ps(qv, k0, a00), a01 = _mm512_fmadd_ps(qv, k1, a01);                                  \
        a02 = _mm512_fmadd_ps(qv, k2, a02), a03 = _mm512_fmadd_ps(qv, k3, a03);                                  \
        if (J > 1) {                                                                                             \
            qv = _mm512_loadu_ps(q + (size_t)hd + c);                                                            \
            a10 = _mm512_fmadd_ps(qv, k0, a10), a11 = _mm512_fmadd_ps(qv, k1, a11);                              \
            a12 = _mm512_fmadd_ps(qv, k2, a12), a13 = _mm512_fmadd_ps(qv, k3, a13);                              \
        }                                                                                                        \
        if (J > 2) {                                                                                             \
            qv = _mm512_loadu_ps(q + 2 * (size_t)hd + c);                                                        \
            a20 = _mm512_fmadd_ps(qv, k0, a20), a21 = _mm512_fmadd_ps(qv, k1, a21);                              \
            a22 = _mm512_fmadd_ps(qv, k2, a22), a23 = _mm512_fmadd_ps(qv, k3, a23);                              \
        }                                                                                                        \
        if (J > 3) {                                                                                             \
            qv = _mm512_loadu_ps(q + 3 * (size_t)hd + c);                                                        \
            a30 = _mm512_fmadd_ps(qv, k0, a30), a31 = _mm512_fmadd_ps(qv, k1, a31);                              \
            a32 = _mm512_fmadd_ps(qv, k2, a32), a33 = _mm512_fmadd_ps(qv, k3, a33);                              \
        }                                                                                                        \
    }                                                                                                            \
    return reduce16(a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33);
#define LOADK_PTR_F32(p) _mm512_loadu_ps(p)
#define LOADK_PTR_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
INLINE512 __m512 dot4x4_f32(const float *q, int J, const float *k0p, const float *k1p, const float *k2p,
                            const float *k3p, int32_t hd) {
    DOT4X4(LOADK_PTR_F32)
}
INLINE512 __m512 dot4x4_f16(const float *q, int J, const uint16_t *k0p, const uint16_t *k1p, const uint16_t *k2p,
                            const uint16_t *k3p, int32_t hd) {
    DOT4X4(LOADK_PTR_F16)
}

/* Scores of J <= 4 queries against all n keys, 4 keys per step (the last step repeats the last key and
 * stores only the valid lanes). */
#define SCORES_J(DOT)                                                                                            \
    const __m512 vs = _mm512_set1_ps(scale);                                                                     \
    for (int32_t t = 0; t < n; t += 4) {                                                                         \
        const int32_t nk = n - t < 4 ? n - t : 4;                                                                \
        const size_t r0 = (size_t)t * hd, r1 = (size_t)(t + (nk > 1)) * hd, r2 = (size_t)(t + (nk > 2 ? 2 : nk - 1)) * hd, \
                     r3 = (size_t)(t + nk - 1) * hd;                                                             \
        const __m512 r = _mm512_mul_ps(DOT(q, J, k + r0, k + r1, k + r2, k + r3, hd), vs);                       \
        const __mmask8 mk = (__mmask8)((1u << nk) - 1u);                                                         \
        _mm_mask_storeu_ps(s + t, mk, _mm512_castps512_ps128(r));                                                \
        if (J > 1) _mm_mask_storeu_ps(s + (size_t)lds + t, mk, _mm512_extractf32x4_ps(r, 1));                    \
        if (J > 2) _mm_mask_storeu_ps(s + 2 * (size_t)lds + t, mk, _mm512_extractf32x4_ps(r, 2));                \
        if (J > 3) _mm_mask_storeu_ps(s + 3 * (size_t)lds + t, mk, _mm512_extractf32x4_ps(r, 3));                \
    }
INLINE512 void scores_j_f32(const float *q, int J, const float *k, int32_t n, int32_t hd, float scale, float *s,
                            int32_t lds) {
    SCORES_J(dot4x4_f32)
}
INLINE512 void scores_j_f16(const float *q, int J, const uint16_t *k, int32_t n, int32_t hd, float scale, float *s,
                            int32_t lds) {
    SCORES_J(dot4x4_f16)
}
/* Scores of m queries, 4 at a time (the remainder with J = m % 4). */
#define SCORES_FEW(FN)                                                                                           \
    int32_t i = 0;                                                                                               \
    for (; i + 4 <= m; i += 4) FN(q + (size_t)i * hd, 4, k, n, hd, scale, s + (size_t)i * lds, lds);              \
    switch (m - i) {                                                                                             \
    case 3: FN(q + (size_t)i * hd, 3, k, n, hd, scale, s + (size_t)i * lds, lds); break;                          \
    case 2: FN(q + (size_t)i * hd, 2, k, n, hd, scale, s + (size_t)i * lds, lds); break;                          \
    case 1: FN(q + (size_t)i * hd, 1, k, n, hd, scale, s + (size_t)i * lds, lds); break;                          \
    default: break;                                                                                              \
    }
TGT512VL static void scores_few_f32(const float *q, int32_t m, const float *k, int32_t n, int32_t hd, float scale,
                                    float *s, int32_t lds) {
    SCORES_FEW(scores_j_f32)
}
TGT512VL static void scores_few_f16(const float *q, int32_t m, const uint16_t *k, int32_t n, int32_t hd, float scale,
                                    float *s, int32_t lds) {
    SCORES_FEW(scores_j_f16)
}

TGT512 static void tile_scores_f32_avx512(const float *q, int32_t m, const float *k, int32_t n, int32_t hd, float scale,
                                          float *s, int32_t lds) {
    scores_few_f32(q, m, k, n, hd, scale, s, lds);
}
TGT512 static void tile_scores_f16_avx512(const float *q, int32_t m, const uint16_t *k, int32_t n, int32_t hd,
                                          float scale, float *s, int32_t lds) {
    scores_few_f16(q, m, k, n, hd, scale, s, lds);
}

/* o_j += sum_t p_j[t] V[t] for J <= 4 queries j (o_j = o + j * hd, p_j = p + j * ldp): 64 columns at a time
 * with 4J accumulators, then 16 at a time; each converted V chunk feeds J FMAs. LOADV(ptr) loads 16 values. */
#define ACCUM_J(LOADV)                                                                                           \
    const float *p0 = p, *p1 = p + ldp, *p2 = p + 2 * (size_t)ldp, *p3 = p + 3 * (size_t)ldp;                    \
    float *o0 = o, *o1 = o + hd, *o2 = o + 2 * (size_t)hd, *o3 = o + 3 * (size_t)hd;                             \
    int32_t c0 = 0;                                                                                              \
    for (; c0 + 64 <= hd; c0 += 64) {                                                                            \
        __m512 z = _mm512_setzero_ps();                                                                          \
        __m512 a0 = _mm512_loadu_ps(o0 + c0), a1 = _mm512_loadu_ps(o0 + c0 + 16);                                 \
        __m512 a2 = _mm512_loadu_ps(o0 + c0 + 32), a3 = _mm512_loadu_ps(o0 + c0 + 48);                           \
        __m512 b0 = z, b1 = z, b2 = z, b3 = z, e0 = z, e1 = z, e2 = z, e3 = z, f0 = z, f1 = z, f2 = z, f3 = z;   \
        if (J > 1) b0 = _mm512_loadu_ps(o1 + c0), b1 = _mm512_loadu_ps(o1 + c0 + 16),                            \
                   b2 = _mm512_loadu_ps(o1 + c0 + 32), b3 = _mm512_loadu_ps(o1 + c0 + 48);                       \
        if (J > 2) e0 = _mm512_loadu_ps(o2 + c0), e1 = _mm512_loadu_ps(o2 + c0 + 16),                            \
                   e2 = _mm512_loadu_ps(o2 + c0 + 32), e3 = _mm512_loadu_ps(o2 + c0 + 48);                       \
        if (J > 3) f0 = _mm512_loadu_ps(o3 + c0), f1 = _mm512_loadu_ps(o3 + c0 + 16),                            \
                   f2 = _mm512_loadu_ps(o3 + c0 + 32), f3 = _mm512_loadu_ps(o3 + c0 + 48);                       \
        for (int32_t t = 0; t < n; t++) {                                                                        \
            const size_t x = (size_t)t * hd + c0;                                                                \
            const __m512 v0 = LOADV(v + x), v1 = LOADV(v + x + 16), v2 = LOADV(v + x + 32), v3 = LOADV(v + x + 48); \
            __m512 pb = _mm512_set1_ps(p0[t]);                                                                   \
            a0 = _mm512_fmadd_ps(pb, v0, a0), a1 = _mm512_fmadd_ps(pb, v1, a1);                                  \
            a2 = _mm512_fmadd_ps(pb, v2, a2), a3 = _mm512_fmadd_ps(pb, v3, a3);                                  \
            if (J > 1) {                                                                                         \
                pb = _mm512_set1_ps(p1[t]);                                                                      \
                b0 = _mm512_fmadd_ps(pb, v0, b0), b1 = _mm512_fmadd_ps(pb, v1, b1);                              \
                b2 = _mm512_fmadd_ps(pb, v2, b2), b3 = _mm512_fmadd_ps(pb, v3, b3);                              \
            }                                                                                                    \
            if (J > 2) {                                                                                         \
                pb = _mm512_set1_ps(p2[t]);                                                                      \
                e0 = _mm512_fmadd_ps(pb, v0, e0), e1 = _mm512_fmadd_ps(pb, v1, e1);                              \
                e2 = _mm512_fmadd_ps(pb, v2, e2), e3 = _mm512_fmadd_ps(pb, v3, e3);                              \
            }                                                                                                    \
            if (J > 3) {                                                                                         \
                pb = _mm512_set1_ps(p3[t]);                                                                      \
                f0 = _mm512_fmadd_ps(pb, v0, f0), f1 = _mm512_fmadd_ps(pb, v1, f1);                              \
                f2 = _mm512_fmadd_ps(pb, v2, f2), f3 = _mm512_fmadd_ps(pb, v3, f3);                              \
            }                                                                                                    \
        }                                                                                                        \
        _mm512_storeu_ps(o0 + c0, a0), _mm512_storeu_ps(o0 + c0 + 16, a1);                                       \
        _mm512_storeu_ps(o0 + c0 + 32, a2), _mm512_storeu_ps(o0 + c0 + 48, a3);                                  \
        if (J > 1) _mm512_storeu_ps(o1 + c0, b0), _mm512_storeu_ps(o1 + c0 + 16, b1),                            \
                   _mm512_storeu_ps(o1 + c0 + 32, b2), _mm512_storeu_ps(o1 + c0 + 48, b3);                       \
        if (J > 2) _mm512_storeu_ps(o2 + c0, e0), _mm512_storeu_ps(o2 + c0 + 16, e1),                            \
                   _mm512_storeu_ps(o2 + c0 + 32, e2), _mm512_storeu_ps(o2 + c0 + 48, e3);                       \
        if (J > 3) _mm512_storeu_ps(o3 + c0, f0), _mm512_storeu_ps(o3 + c0 + 16, f1),                            \
                   _mm512_storeu_ps(o3 + c0 + 32, f2), _mm512_storeu_ps(o3 + c0 + 48, f3);                       \
    }                                                                                                            \
    for (; c0 < hd; c0 += 16) {                                                                                  \
        __m512 a = _mm512_loadu_ps(o0 + c0), b = a, e = a, f = a;                                                \
        if (J > 1) b = _mm512_loadu_ps(o1 + c0);                                                                 \
        if (J > 2) e = _mm512_loadu_ps(o2 + c0);                                                                 \
        if (J > 3) f = _mm512_loadu_ps(o3 + c0);                                                                 \
        for (int32_t t = 0; t < n; t++) {                                                                        \
            const __m512 vv = LOADV(v + (size_t)t * hd + c0);                                                    \
            a = _mm512_fmadd_ps(_mm512_set1_ps(p0[t]), vv, a);                                                   \
            if (J > 1) b = _mm512_fmadd_ps(_mm512_set1_ps(p1[t]), vv, b);                                        \
            if (J > 2) e = _mm512_fmadd_ps(_mm512_set1_ps(p2[t]), vv, e);                                        \
            if (J > 3) f = _mm512_fmadd_ps(_mm512_set1_ps(p3[t]), vv, f);                                        \
        }                                                                                                        \
        _mm512_storeu_ps(o0 + c0, a);                                                                            \
        if (J > 1) _mm512_storeu_ps(o1 + c0, b);                                                                 \
        if (J > 2) _mm512_storeu_ps(o2 + c0, e);                                                                 \
        if (J > 3) _mm512_storeu_ps(o3 + c0, f);                                                                 \
    }
INLINE512 void accum_j_f32(float *o, int J, const float *p, int32_t ldp, const float *v, int32_t n, int32_t hd) {
    ACCUM_J(LOADK_PTR_F32)
}
INLINE512 void accum_j_f16(float *o, int J, const float *p, int32_t ldp, const uint16_t *v, int32_t n, int32_t hd) {
    ACCUM_J(LOADK_PTR_F16)
}
/* All m queries, 4 at a time (the remainder with J = m % 4: the same operations for each query). */
#define ACCUM_TILE(FN)                                                                                           \
    int32_t i = 0;                                                                                               \
    for (; i + 4 <= m; i += 4) FN(o + (size_t)i * hd, 4, p + (size_t)i * ldp, ldp, v, n, hd);                     \
    switch (m - i) {                                                                                             \
    case 3: FN(o + (size_t)i * hd, 3, p + (size_t)i * ldp, ldp, v, n, hd); break;                                 \
    case 2: FN(o + (size_t)i * hd, 2, p + (size_t)i * ldp, ldp, v, n, hd); break;                                 \
    case 1: FN(o + (size_t)i * hd, 1, p + (size_t)i * ldp, ldp, v, n, hd); break;                                 \
    default: break;                                                                                              \
    }
TGT512VL static void tile_accum_f32_avx512(float *o, int32_t m, const float *p, int32_t ldp, const float *v, int32_t n,
                                           int32_t hd) {
    ACCUM_TILE(accum_j_f32)
}
TGT512VL static void tile_accum_f16_avx512(float *o, int32_t m, const float *p, int32_t ldp, const uint16_t *v,
                                           int32_t n, int32_t hd, float *work) {
    if (m < CONVERT_MIN) {
        ACCUM_TILE(accum_j_f16)
        return;
    }
    for (int32_t t0 = 0; t0 < n; t0 += ENG_ATTN_CHUNK) {
        int32_t nt = n - t0 < ENG_ATTN_CHUNK ? n - t0 : ENG_ATTN_CHUNK;
        for (int32_t i = 0; i < nt * hd; i += 16)
            _mm512_storeu_ps(work + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + (size_t)t0 * hd + i))));
        tile_accum_f32_avx512(o, m, p + t0, ldp, work, nt, hd);
    }
}
#endif

int eng_ops_attn_level_for(int simd) {
#ifdef HAVE_X86
    if (simd >= KVS_CPU_AVX512) return ENG_OPS_AVX512;
    return simd >= KVS_CPU_AVX2 ? ENG_OPS_AVX2 : ENG_OPS_SCALAR;
#else
    (void)simd;
    return ENG_OPS_SCALAR;
#endif
}

int eng_ops_attn_level(void) { return eng_ops_attn_level_for(kvs_cpu_detect()); }

/* Runs one of three calls by level: the AVX-512 one when the level allows it and hd is a multiple of 16, the
 * AVX2 one when the level allows that, the scalar one otherwise (always, off x86). */
#ifdef HAVE_X86
#define TILE_DISPATCH(level, hd, call_avx512, call_avx2, call_scalar)                                              \
    do {                                                                                                           \
        if ((level) >= ENG_OPS_AVX512 && (hd) % 16 == 0) call_avx512;                                              \
        else if ((level) >= ENG_OPS_AVX2) call_avx2;                                                               \
        else call_scalar;                                                                                          \
    } while (0)
#else
#define TILE_DISPATCH(level, hd, call_avx512, call_avx2, call_scalar)                                              \
    do {                                                                                                           \
        (void)(level);                                                                                             \
        call_scalar;                                                                                               \
    } while (0)
#endif

void eng_attn_tile_scores_f32(int level, const float *q, int32_t m, const float *k, int32_t n, int32_t hd, float scale,
                              float *s, int32_t lds, float *work) {
    (void)work;
    TILE_DISPATCH(level, hd, tile_scores_f32_avx512(q, m, k, n, hd, scale, s, lds),
                  tile_scores_f32_avx2(q, m, k, n, hd, scale, s, lds),
                  tile_scores_f32_scalar(q, m, k, n, hd, scale, s, lds));
}
void eng_attn_tile_scores_f16(int level, const float *q, int32_t m, const uint16_t *k, int32_t n, int32_t hd,
                              float scale, float *s, int32_t lds, float *work) {
    (void)work;
    TILE_DISPATCH(level, hd, tile_scores_f16_avx512(q, m, k, n, hd, scale, s, lds),
                  tile_scores_f16_avx2(q, m, k, n, hd, scale, s, lds, work),
                  tile_scores_f16_scalar(q, m, k, n, hd, scale, s, lds));
}
void eng_attn_tile_accum_f32(int level, float *o, int32_t m, const float *p, int32_t ldp, const float *v, int32_t n,
                             int32_t hd, float *work) {
    (void)work;
    TILE_DISPATCH(level, hd, tile_accum_f32_avx512(o, m, p, ldp, v, n, hd), tile_accum_f32_avx2(o, m, p, ldp, v, n, hd),
                  tile_accum_f32_scalar(o, m, p, ldp, v, n, hd));
}
void eng_attn_tile_accum_f16(int level, float *o, int32_t m, const float *p, int32_t ldp, const uint16_t *v, int32_t n,
                             int32_t hd, float *work) {
    (void)work;
    TILE_DISPATCH(level, hd, tile_accum_f16_avx512(o, m, p, ldp, v, n, hd, work),
                  tile_accum_f16_avx2(o, m, p, ldp, v, n, hd, work), tile_accum_f16_scalar(o, m, p, ldp, v, n, hd));
}

double eng_attn_expsum(int level, float *s, int32_t n, float mx) {
#ifdef HAVE_X86
    if (level >= ENG_OPS_AVX512) return expsum_avx512(s, n, mx);
    if (level >= ENG_OPS_AVX2) return expsum_avx2(s, n, mx);
#endif
    (void)level;
    return expsum_scalar(s, n, mx);
}

float eng_attn_softmax_inv(int level, float *s, int32_t n, float mx, float sink) {
    if (sink == -INFINITY) return 1.0f / (float)eng_attn_expsum(level, s, n, mx);
    const float top = mx > sink ? mx : sink;
    double sum = eng_attn_expsum(level, s, n, top) + (double)expf(sink - top);
    return 1.0f / (float)sum;
}

void eng_swiglu_oai(float *g, const float *u, int64_t n, float alpha, float limit) {
    for (int64_t i = 0; i < n; i++) {
        const float x = limit < g[i] ? limit : g[i];
        const float y = u[i] < -limit ? -limit : (limit < u[i] ? limit : u[i]);
        g[i] = x / (1.0f + expf(alpha * (-x))) * (y + 1.0f);
    }
}
