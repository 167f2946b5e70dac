/* ops.c: f32 kernels of the forward pass, scalar and AVX2+FMA+F16C. */
#include "engine/ops.h"

#include <math.h>

#include "engine/quant.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1
#endif

bool eng_ops_simd_available(void) {
#ifdef HAVE_X86
    /* AVX2 + FMA (and the OS saving YMM state) as quant.h detects them, plus F16C (CPUID.1:ECX bit 29). */
    unsigned a, b, c, d;
    if (eng_simd_detect() < ENG_SIMD_AVX2 || !__get_cpuid(1, &a, &b, &c, &d)) return false;
    return (c >> 29) & 1u;
#else
    return false;
#endif
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
TGT static void axpy_f32_avx2(float *y, float s, const float *x, int32_t n) {
    __m256 vs = _mm256_set1_ps(s);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vs, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += s * x[i];
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
 * (one row at a time, the FMA latency and a horizontal sum per row dominated). Columns past the last multiple
 * of 8 and rows past the last multiple of 8 take the one-row path. */
#define SCORES8(LOADK, DOT, ELEM)                                                                                \
    int32_t t = 0;                                                                                               \
    const int32_t hd8 = hd & ~7;                                                                                 \
    const __m256 vscale = _mm256_set1_ps(scale);                                                                 \
    for (; hd8 > 0 && t + 8 <= n; t += 8) {                                                                      \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;           \
        for (int32_t c = 0; c < hd8; c += 8) {                                                                   \
            const __m256 qv = _mm256_loadu_ps(q + c);                                                            \
            const size_t b = (size_t)t * hd + c;                                                                 \
            a0 = _mm256_fmadd_ps(qv, LOADK(b), a0);                                                              \
            a1 = _mm256_fmadd_ps(qv, LOADK(b + (size_t)hd), a1);                                                 \
            a2 = _mm256_fmadd_ps(qv, LOADK(b + 2 * (size_t)hd), a2);                                             \
            a3 = _mm256_fmadd_ps(qv, LOADK(b + 3 * (size_t)hd), a3);                                             \
            a4 = _mm256_fmadd_ps(qv, LOADK(b + 4 * (size_t)hd), a4);                                             \
            a5 = _mm256_fmadd_ps(qv, LOADK(b + 5 * (size_t)hd), a5);                                             \
            a6 = _mm256_fmadd_ps(qv, LOADK(b + 6 * (size_t)hd), a6);                                             \
            a7 = _mm256_fmadd_ps(qv, LOADK(b + 7 * (size_t)hd), a7);                                             \
        }                                                                                                        \
        __m256 r = reduce8(a0, a1, a2, a3, a4, a5, a6, a7);                                                      \
        if (hd8 < hd) {                                                                                          \
            float tail[8];                                                                                       \
            for (int32_t j = 0; j < 8; j++) {                                                                    \
                tail[j] = 0.0f;                                                                                  \
                for (int32_t c = hd8; c < hd; c++) tail[j] += q[c] * ELEM((size_t)(t + j) * hd + c);            \
            }                                                                                                    \
            r = _mm256_add_ps(r, _mm256_loadu_ps(tail));                                                         \
        }                                                                                                        \
        _mm256_storeu_ps(out + t, _mm256_mul_ps(r, vscale));                                                     \
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

/* ---- AVX-512: 16 values per instruction; head sizes that are multiples of 16 ---------------------------- */
#define TGT512 __attribute__((target("avx512f,avx2,fma,f16c")))
/* The sum of v's 16 lanes folded to 8 (lane i + lane i + 8), for reduce8. */
TGT512 static __m256 fold512(__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
#define SCORES8_512(LOADK)                                                                                       \
    int32_t t = 0;                                                                                               \
    const __m256 vscale = _mm256_set1_ps(scale);                                                                 \
    for (; t + 8 <= n; t += 8) {                                                                                 \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;           \
        for (int32_t c = 0; c < hd; c += 16) {                                                                   \
            const __m512 qv = _mm512_loadu_ps(q + c);                                                            \
            const size_t b = (size_t)t * hd + c;                                                                 \
            a0 = _mm512_fmadd_ps(qv, LOADK(b), a0);                                                              \
            a1 = _mm512_fmadd_ps(qv, LOADK(b + (size_t)hd), a1);                                                 \
            a2 = _mm512_fmadd_ps(qv, LOADK(b + 2 * (size_t)hd), a2);                                             \
            a3 = _mm512_fmadd_ps(qv, LOADK(b + 3 * (size_t)hd), a3);                                             \
            a4 = _mm512_fmadd_ps(qv, LOADK(b + 4 * (size_t)hd), a4);                                             \
            a5 = _mm512_fmadd_ps(qv, LOADK(b + 5 * (size_t)hd), a5);                                             \
            a6 = _mm512_fmadd_ps(qv, LOADK(b + 6 * (size_t)hd), a6);                                             \
            a7 = _mm512_fmadd_ps(qv, LOADK(b + 7 * (size_t)hd), a7);                                             \
        }                                                                                                        \
        __m256 r = reduce8(fold512(a0), fold512(a1), fold512(a2), fold512(a3), fold512(a4), fold512(a5),         \
                           fold512(a6), fold512(a7));                                                            \
        _mm256_storeu_ps(out + t, _mm256_mul_ps(r, vscale));                                                     \
    }                                                                                                            \
    for (; t < n; t++) {                                                                                         \
        __m512 a = _mm512_setzero_ps();                                                                          \
        for (int32_t c = 0; c < hd; c += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + c), LOADK((size_t)t * hd + c), a); \
        out[t] = _mm512_reduce_add_ps(a) * scale;                                                                \
    }
/* o += sum_t p[t] V[t]: 4 columns-of-16 at a time with two accumulator sets (even and odd rows), so 8 FMA
 * chains run. */
#define ACCUM_512(LOADV)                                                                                         \
    int32_t c0 = 0;                                                                                              \
    for (; c0 + 64 <= hd; c0 += 64) {                                                                            \
        __m512 a0 = _mm512_loadu_ps(o + c0), a1 = _mm512_loadu_ps(o + c0 + 16);                                   \
        __m512 a2 = _mm512_loadu_ps(o + c0 + 32), a3 = _mm512_loadu_ps(o + c0 + 48);                             \
        __m512 b0 = _mm512_setzero_ps(), b1 = b0, b2 = b0, b3 = b0;                                              \
        int32_t t = 0;                                                                                           \
        for (; t + 2 <= n; t += 2) {                                                                             \
            const __m512 pa = _mm512_set1_ps(p[t]), pb = _mm512_set1_ps(p[t + 1]);                               \
            const size_t x = (size_t)t * hd + c0, y = x + (size_t)hd;                                            \
            a0 = _mm512_fmadd_ps(pa, LOADV(x), a0);                                                              \
            a1 = _mm512_fmadd_ps(pa, LOADV(x + 16), a1);                                                         \
            a2 = _mm512_fmadd_ps(pa, LOADV(x + 32), a2);                                                         \
            a3 = _mm512_fmadd_ps(pa, LOADV(x + 48), a3);                                                         \
            b0 = _mm512_fmadd_ps(pb, LOADV(y), b0);                                                              \
            b1 = _mm512_fmadd_ps(pb, LOADV(y + 16), b1);                                                         \
            b2 = _mm512_fmadd_ps(pb, LOADV(y + 32), b2);                                                         \
            b3 = _mm512_fmadd_ps(pb, LOADV(y + 48), b3);                                                         \
        }                                                                                                        \
        if (t < n) {                                                                                             \
            const __m512 pa = _mm512_set1_ps(p[t]);                                                              \
            const size_t x = (size_t)t * hd + c0;                                                                \
            a0 = _mm512_fmadd_ps(pa, LOADV(x), a0);                                                              \
            a1 = _mm512_fmadd_ps(pa, LOADV(x + 16), a1);                                                         \
            a2 = _mm512_fmadd_ps(pa, LOADV(x + 32), a2);                                                         \
            a3 = _mm512_fmadd_ps(pa, LOADV(x + 48), a3);                                                         \
        }                                                                                                        \
        _mm512_storeu_ps(o + c0, _mm512_add_ps(a0, b0));                                                         \
        _mm512_storeu_ps(o + c0 + 16, _mm512_add_ps(a1, b1));                                                    \
        _mm512_storeu_ps(o + c0 + 32, _mm512_add_ps(a2, b2));                                                    \
        _mm512_storeu_ps(o + c0 + 48, _mm512_add_ps(a3, b3));                                                    \
    }                                                                                                            \
    for (; c0 < hd; c0 += 16) {                                                                                  \
        __m512 a = _mm512_loadu_ps(o + c0);                                                                      \
        for (int32_t t = 0; t < n; t++) a = _mm512_fmadd_ps(_mm512_set1_ps(p[t]), LOADV((size_t)t * hd + c0), a); \
        _mm512_storeu_ps(o + c0, a);                                                                             \
    }

#define LOADK512_F32(i) _mm512_loadu_ps(k + (i))
#define LOADK512_F16(i) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k + (i))))
#define LOADV512_F32(i) _mm512_loadu_ps(v + (i))
#define LOADV512_F16(i) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + (i))))
TGT512 static void scores_f32_avx512(const float *q, const float *k, int32_t n, int32_t hd, float scale, float *out) {
    SCORES8_512(LOADK512_F32)
}
TGT512 static void scores_f16_avx512(const float *q, const uint16_t *k, int32_t n, int32_t hd, float scale,
                                     float *out) {
    SCORES8_512(LOADK512_F16)
}
TGT512 static void accum_f32_avx512(float *o, const float *p, const float *v, int32_t n, int32_t hd) {
    ACCUM_512(LOADV512_F32)
}
TGT512 static void accum_f16_avx512(float *o, const float *p, const uint16_t *v, int32_t n, int32_t hd) {
    ACCUM_512(LOADV512_F16)
}
#endif

int eng_ops_attn_level(void) {
#ifdef HAVE_X86
    if (!eng_ops_simd_available()) return ENG_OPS_SCALAR;
    /* AVX-512 with the OS saving its state (eng_simd_detect checks XCR0) */
    return eng_simd_detect() >= ENG_SIMD_AVX512 ? ENG_OPS_AVX512 : ENG_OPS_AVX2;
#else
    return ENG_OPS_SCALAR;
#endif
}

void eng_attn_scores_f32(int level, const float *q, const float *k, int32_t n, int32_t hd, float scale, float *out) {
#ifdef HAVE_X86
    if (level >= ENG_OPS_AVX512 && hd % 16 == 0) {
        scores_f32_avx512(q, k, n, hd, scale, out);
        return;
    }
    if (level >= ENG_OPS_AVX2) {
        scores_f32_avx2(q, k, n, hd, scale, out);
        return;
    }
#endif
    (void)level;
    for (int32_t t = 0; t < n; t++) out[t] = dot_f32_scalar(q, k + (size_t)t * hd, hd) * scale;
}
void eng_attn_scores_f16(int level, const float *q, const uint16_t *k, int32_t n, int32_t hd, float scale,
                         float *out) {
#ifdef HAVE_X86
    if (level >= ENG_OPS_AVX512 && hd % 16 == 0) {
        scores_f16_avx512(q, k, n, hd, scale, out);
        return;
    }
    if (level >= ENG_OPS_AVX2) {
        scores_f16_avx2(q, k, n, hd, scale, out);
        return;
    }
#endif
    (void)level;
    for (int32_t t = 0; t < n; t++) out[t] = dot_f16_scalar(q, k + (size_t)t * hd, hd) * scale;
}
void eng_attn_accum_f32(int level, float *o, const float *p, const float *v, int32_t n, int32_t hd) {
#ifdef HAVE_X86
    if (level >= ENG_OPS_AVX512 && hd % 16 == 0) {
        accum_f32_avx512(o, p, v, n, hd);
        return;
    }
    if (level >= ENG_OPS_AVX2) {
        accum_f32_avx2(o, p, v, n, hd);
        return;
    }
#endif
    (void)level;
    for (int32_t t = 0; t < n; t++) axpy_f32_scalar(o, p[t], v + (size_t)t * hd, hd);
}
void eng_attn_accum_f16(int level, float *o, const float *p, const uint16_t *v, int32_t n, int32_t hd) {
#ifdef HAVE_X86
    if (level >= ENG_OPS_AVX512 && hd % 16 == 0) {
        accum_f16_avx512(o, p, v, n, hd);
        return;
    }
    if (level >= ENG_OPS_AVX2) {
        accum_f16_avx2(o, p, v, n, hd);
        return;
    }
#endif
    (void)level;
    for (int32_t t = 0; t < n; t++) axpy_f16_scalar(o, p[t], v + (size_t)t * hd, hd);
}

float eng_dot_f32(bool simd, const float *a, const float *b, int32_t n) {
#ifdef HAVE_X86
    if (simd) return dot_f32_avx2(a, b, n);
#endif
    (void)simd;
    return dot_f32_scalar(a, b, n);
}
float eng_dot_f16(bool simd, const float *a, const uint16_t *b, int32_t n) {
#ifdef HAVE_X86
    if (simd) return dot_f16_avx2(a, b, n);
#endif
    (void)simd;
    return dot_f16_scalar(a, b, n);
}
void eng_axpy_f32(bool simd, float *y, float s, const float *x, int32_t n) {
#ifdef HAVE_X86
    if (simd) {
        axpy_f32_avx2(y, s, x, n);
        return;
    }
#endif
    (void)simd;
    axpy_f32_scalar(y, s, x, n);
}
