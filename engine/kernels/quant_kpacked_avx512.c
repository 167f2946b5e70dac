/*
 * quant_kpacked_avx512.c: AVX-512 VNNI kernels for the packed Q4_K, Q5_K and Q6_K layouts (quant_kpacked.c).
 *
 * One group (16 weight rows) times up to MAXC activation rows per call: each 64-byte code line is loaded and
 * unpacked to unsigned bytes once and multiplied with every activation row's quad (broadcast) by vpdpbusd, so
 * lane i holds row i's integer sum of a sub-block; vpmulld applies the row's sub-block scale and the super-block
 * sums stay exact int32. Q5_K adds the fifth bits to the Q4_K codes (bit 4) before the products. Q4_K / Q5_K mins: vpdpwssd of the mins (int16 pairs) with the activation's sub-block sums
 * (pairs prepared once per call). Q6_K codes are value + 32: each sub-block's sum starts at -32 * bsum, so it
 * is exactly sum((code - 32) * x). The float work per super-block and row repeats the scalar row kernel's
 * operations in its order (multiplies, subtract, add: no fused multiply-add), so the results equal it bit for bit.
 */
#include "engine/kernels/quant_kpacked_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
#define INL static inline __attribute__((always_inline)) TGT
#ifdef __clang__
#define UNROLL _Pragma("clang loop unroll(full)")
#else
#define UNROLL _Pragma("GCC unroll 8")
#endif
#define MAXC 8   /* activation rows per kernel call */
#define GCHUNK 8 /* groups per preparation of the activation rows */

INL int32_t ld32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}
INL __m512i bq(const uint8_t *p) { return _mm512_set1_epi32(ld32(p)); }


/* v << n (n = -3..4; negative: right shift) in 16-bit lanes, n a constant after unrolling. */
INL __m512i shift16(__m512i v, int n) {
    switch (n) {
    case 4: return _mm512_slli_epi16(v, 4);
    case 3: return _mm512_slli_epi16(v, 3);
    case 2: return _mm512_slli_epi16(v, 2);
    case 1: return _mm512_slli_epi16(v, 1);
    case -1: return _mm512_srli_epi16(v, 1);
    case -2: return _mm512_srli_epi16(v, 2);
    case -3: return _mm512_srli_epi16(v, 3);
    default: return v;
    }
}

/* Q4_K, or Q5_K (q5: the fifth bits of line t of sub-block j are bits t (low nibbles) and 4 + t (high nibbles) of
 * the sub-block's high-bit line, moved to bit 4 and or-ed into the codes). */
INL void q45k_group(const bool q5, const int RN, const uint8_t *grp, int64_t nsb, const uint8_t *xq, size_t xb, const float *xd,
                   const int32_t *xp, float *y, int64_t ldy, __mmask16 mask) {
    const bool two = RN <= 4; /* two dpbusd chains per row when few rows cover the latency */
    const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
    __m512 acc[MAXC];
    UNROLL
    for (int c = 0; c < RN; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *rec = grp + sb * (q5 ? KP5_REC : KP4_REC), *xs = xq + (size_t)sb * KX_BYTES + KX_QS;
        __m512i sumi[MAXC];
        UNROLL
        for (int c = 0; c < RN; c++) sumi[c] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            __m512i a0[MAXC], a1[MAXC];
            UNROLL
            for (int c = 0; c < RN; c++) a0[c] = a1[c] = _mm512_setzero_si512();
            const __m512i H = q5 ? _mm512_load_si512((const void *)(rec + KP45_SUB(q5) * j + 256)) : m4;
            UNROLL
            for (int t = 0; t < 4; t++) {
                __m512i L = _mm512_load_si512((const void *)(rec + KP45_SUB(q5) * j + 64 * t));
                __m512i lo = _mm512_and_si512(L, m4), hi = _mm512_and_si512(_mm512_srli_epi16(L, 4), m4);
                if (q5) { /* imm 0xF8: a | (b & c) */
                    lo = _mm512_ternarylogic_epi32(lo, shift16(H, 4 - t), m10, 0xF8);
                    hi = _mm512_ternarylogic_epi32(hi, shift16(H, -t), m10, 0xF8);
                }
                UNROLL
                for (int c = 0; c < RN; c++) {
                    const uint8_t *xc = xs + (size_t)c * xb + 32 * j + 4 * t;
                    a0[c] = _mm512_dpbusd_epi32(a0[c], lo, bq(xc));
                    if (two) a1[c] = _mm512_dpbusd_epi32(a1[c], hi, bq(xc + 16));
                    else a0[c] = _mm512_dpbusd_epi32(a0[c], hi, bq(xc + 16));
                }
            }
            __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(rec + KP45_SC(q5) + 16 * j)));
            UNROLL
            for (int c = 0; c < RN; c++)
                sumi[c] = _mm512_add_epi32(sumi[c], _mm512_mullo_epi32(two ? _mm512_add_epi32(a0[c], a1[c]) : a0[c], sc));
        }
        __m512i summ[MAXC];
        UNROLL
        for (int c = 0; c < RN; c++) summ[c] = _mm512_setzero_si512();
        UNROLL
        for (int p = 0; p < 4; p++) {
            __m512i mn = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(rec + KP45_MN(q5) + 32 * p)));
            UNROLL
            for (int c = 0; c < RN; c++)
                summ[c] = _mm512_dpwssd_epi32(summ[c], mn, _mm512_set1_epi32(xp[(sb * MAXC + c) * KP_XP + p]));
        }
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + KP45_D(q5))));
        __m512 dmw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + KP45_DMIN(q5))));
        UNROLL
        for (int c = 0; c < RN; c++) {
            __m512 xdv = _mm512_set1_ps(xd[sb * MAXC + c]);
            __m512 t = _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(dw, xdv), _mm512_cvtepi32_ps(sumi[c])),
                                     _mm512_mul_ps(_mm512_mul_ps(dmw, xdv), _mm512_cvtepi32_ps(summ[c])));
            acc[c] = _mm512_add_ps(acc[c], t);
        }
    }
    UNROLL
    for (int c = 0; c < RN; c++) _mm512_mask_storeu_ps(y + c * ldy, mask, acc[c]);
}

/* The 6-bit codes of the 4 quads of one Q6_K sub-block (its 3 lines at p) as unsigned bytes:
 * code = low 4 bits | high 2 bits << 4 (ternary-logic imm 0xF8: a | (b & c)). */
INL void q6_codes(const uint8_t *p, __m512i *q0, __m512i *q1, __m512i *q2, __m512i *q3) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m512i L0 = _mm512_load_si512((const void *)p), L1 = _mm512_load_si512((const void *)(p + 64));
    __m512i H = _mm512_load_si512((const void *)(p + 128));
    *q0 = _mm512_ternarylogic_epi32(_mm512_and_si512(L0, m4), _mm512_slli_epi16(H, 4), m30, 0xF8);
    *q1 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(L0, 4), m4), _mm512_slli_epi16(H, 2), m30, 0xF8);
    *q2 = _mm512_ternarylogic_epi32(_mm512_and_si512(L1, m4), H, m30, 0xF8);
    *q3 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(L1, 4), m4), _mm512_srli_epi16(H, 2), m30, 0xF8);
}

INL void q6k_group(const int RN, const uint8_t *grp, int64_t nsb, const uint8_t *xq, size_t xb, const float *xd,
                   const int32_t *xp, float *y, int64_t ldy, __mmask16 mask) {
    const bool two = RN <= 4;
    __m512 acc[MAXC];
    UNROLL
    for (int c = 0; c < RN; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *rec = grp + sb * KP6_REC, *xs = xq + (size_t)sb * KX_BYTES + KX_QS;
        __m512i sumi[MAXC];
        UNROLL
        for (int c = 0; c < RN; c++) sumi[c] = _mm512_setzero_si512();
        for (int g = 0; g < 16; g++) {
            __m512i q0, q1, q2, q3;
            q6_codes(rec + KP6_SUB * g, &q0, &q1, &q2, &q3);
            __m512i a0[MAXC], a1[MAXC];
            UNROLL
            for (int c = 0; c < RN; c++) {
                const uint8_t *xc = xs + (size_t)c * xb + 16 * g;
                a0[c] = _mm512_set1_epi32(xp[(sb * MAXC + c) * KP_XP + g]);
                a1[c] = _mm512_setzero_si512();
                a0[c] = _mm512_dpbusd_epi32(a0[c], q0, bq(xc));
                if (two) a1[c] = _mm512_dpbusd_epi32(a1[c], q1, bq(xc + 4));
                else a0[c] = _mm512_dpbusd_epi32(a0[c], q1, bq(xc + 4));
                a0[c] = _mm512_dpbusd_epi32(a0[c], q2, bq(xc + 8));
                if (two) a1[c] = _mm512_dpbusd_epi32(a1[c], q3, bq(xc + 12));
                else a0[c] = _mm512_dpbusd_epi32(a0[c], q3, bq(xc + 12));
            }
            __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(rec + KP6_SC + 16 * g)));
            UNROLL
            for (int c = 0; c < RN; c++)
                sumi[c] = _mm512_add_epi32(sumi[c], _mm512_mullo_epi32(two ? _mm512_add_epi32(a0[c], a1[c]) : a0[c], sc));
        }
        __m512 dw = _mm512_loadu_ps((const float *)(rec + KP6_D));
        UNROLL
        for (int c = 0; c < RN; c++)
            acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xd[sb * MAXC + c])),
                                                         _mm512_cvtepi32_ps(sumi[c])));
    }
    UNROLL
    for (int c = 0; c < RN; c++) _mm512_mask_storeu_ps(y + c * ldy, mask, acc[c]);
}

/* Q4_0 / Q5_0 (q5) blocks: eng_kp_prep gives per block b and activation row c xd[b * MAXC + c] = d_x and
 * xp[b * MAXC + c] = -offset * sum(x): each row's block sum starts there, so it ends at sum((code - offset) * x);
 * then the float operations of the packed Q8_0 kernel (quant_packed.c), so that the results equal its. */

INL void q0_group(const bool q5, const bool mx, const int RN, const uint8_t *grp, int64_t nb, const uint8_t *xq,
                  size_t xb, const float *xd, const int32_t *xp, float *y, int64_t ldy, __mmask16 mask) {
    const bool two = RN <= 4;
    /* MXFP4: a code's doubled e2m1 value + 12, looked up per byte */
    const __m512i mxtab =
        _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
    const int64_t cb = q5 ? 320 : 256;
    const uint8_t *scales = grp + nb * cb;
    __m512 acc[MAXC];
    UNROLL
    for (int c = 0; c < RN; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (RN == 1 && b + 4 < nb) kp_prefetch_q0(xq, xd, xp, b + 4, MAXC); /* m = 1: 4 blocks ahead */
        const uint8_t *code = grp + b * cb;
        const __m512i H = q5 ? _mm512_load_si512((const void *)(code + 256)) : m4;
        __m512i a0[MAXC], a1[MAXC];
        UNROLL
        for (int c = 0; c < RN; c++) {
            a0[c] = _mm512_set1_epi32(xp[b * MAXC + c]);
            a1[c] = _mm512_setzero_si512();
        }
        UNROLL
        for (int t = 0; t < 4; t++) {
            __m512i L = _mm512_load_si512((const void *)(code + 64 * t));
            __m512i lo = _mm512_and_si512(L, m4), hi = _mm512_and_si512(_mm512_srli_epi16(L, 4), m4);
            if (q5) {
                lo = _mm512_ternarylogic_epi32(lo, shift16(H, 4 - t), m10, 0xF8);
                hi = _mm512_ternarylogic_epi32(hi, shift16(H, -t), m10, 0xF8);
            }
            if (mx) {
                lo = _mm512_shuffle_epi8(mxtab, lo);
                hi = _mm512_shuffle_epi8(mxtab, hi);
            }
            UNROLL
            for (int c = 0; c < RN; c++) {
                const uint8_t *xc = xq + (size_t)c * xb + (size_t)b * sizeof(eng_blk_q8_0) + 2 + 4 * t;
                a0[c] = _mm512_dpbusd_epi32(a0[c], lo, bq(xc));
                if (two) a1[c] = _mm512_dpbusd_epi32(a1[c], hi, bq(xc + 16));
                else a0[c] = _mm512_dpbusd_epi32(a0[c], hi, bq(xc + 16));
            }
        }
        __m512 dw;
        if (mx) { /* 2^(e - 128) from the exponent's bits, as eng_e8m0_half */
            __m512i e = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(scales + 32 * b)));
            __m512i nrm = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
            __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
            __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
            dw = _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, nrm, sub));
        } else {
            dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scales + 32 * b)));
        }
        UNROLL
        for (int c = 0; c < RN; c++) {
            __m512i s = two ? _mm512_add_epi32(a0[c], a1[c]) : a0[c];
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(xd[b * MAXC + c])), acc[c]);
        }
    }
    UNROLL
    for (int c = 0; c < RN; c++) _mm512_mask_storeu_ps(y + c * ldy, mask, acc[c]);
}

/* The kernels of the sets below: Q4_0 / Q5_0 and Q4_K / Q5_K share one body each (q5: the fifth bit). */
#define q40_group(...) q0_group(false, false, __VA_ARGS__)
#define q50_group(...) q0_group(true, false, __VA_ARGS__)
#define qmx_group(...) q0_group(false, true, __VA_ARGS__)
#define q4k_group(...) q45k_group(false, __VA_ARGS__)
#define q5k_group(...) q45k_group(true, __VA_ARGS__)
typedef void (*group_fn)(const uint8_t *, int64_t, const uint8_t *, size_t, const float *, const int32_t *, float *,
                         int64_t, __mmask16);
#define GROUP_FN(T, RN)                                                                                          \
    TGT static void T##_##RN(const uint8_t *grp, int64_t nsb, const uint8_t *xq, size_t xb, const float *xd,     \
                             const int32_t *xp, float *y, int64_t ldy, __mmask16 mask) {                       \
        T##_group(RN, grp, nsb, xq, xb, xd, xp, y, ldy, mask);                                                   \
    }
#define GROUP_SET(T)                                                                                             \
    GROUP_FN(T, 1) GROUP_FN(T, 2) GROUP_FN(T, 3) GROUP_FN(T, 4) GROUP_FN(T, 5) GROUP_FN(T, 6) GROUP_FN(T, 7)     \
    GROUP_FN(T, 8)                                                                                               \
    static const group_fn T##_tab[MAXC] = {T##_1, T##_2, T##_3, T##_4, T##_5, T##_6, T##_7, T##_8};
GROUP_SET(q40)
GROUP_SET(q50)
GROUP_SET(qmx)
GROUP_SET(q4k)
GROUP_SET(q5k)
GROUP_SET(q6k)

/* ---- one activation row (m = 1), one group at a time ------------------------------------------------------
 * A row's integer sums and float operations are those of q45k_group / q6k_group with one activation row (RN = 1),
 * in the same order, so the results are the same bit for bit. What differs is how memory is met:
 *  - one group at a time, so each thread reads its rows as one sequential stream (the hardware prefetcher follows
 *    one stream better than the 4 side by side of an earlier version);
 *  - the activations are prepared with one row per block (xd[sb], xp[sb * KP_XP], 64 bytes per super-block), and
 *    the next super-block's activations and sums are prefetched into L1 at each super-block: a group of a row of
 *    8192 values streams 108 KB of weights between two reads of the same activations, more than L1 holds, and loads
 *    that missed L1 held the stream back.
 * Measured with kvquant-bench gemv-shapes (one thread, Q6_K, bench-1b's shapes): 18-21 GB/s before, 31-33 GB/s
 * after, the speed of a plain read loop; two threads reach the machine's two-thread read bandwidth. */

INL void q45k_gemv(const bool q5, const uint8_t *grp, int64_t nsb, const uint8_t *xq, const float *xd, const int32_t *xp,
                   float *y, __mmask16 mask) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
    const int64_t rb = q5 ? KP5_REC : KP4_REC;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *xs = xq + (size_t)sb * KX_BYTES + KX_QS, *rec = grp + sb * rb;
        if (sb + 1 < nsb) kp_prefetch_sb(xs + KX_BYTES - KX_QS, xp + (sb + 1) * KP_XP);
        __m512i sumi = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            const __m512i H = q5 ? _mm512_load_si512((const void *)(rec + KP45_SUB(q5) * j + 256)) : m4;
            __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
            UNROLL
            for (int t = 0; t < 4; t++) {
                __m512i L = _mm512_load_si512((const void *)(rec + KP45_SUB(q5) * j + 64 * t));
                __m512i lo = _mm512_and_si512(L, m4), hi = _mm512_and_si512(_mm512_srli_epi16(L, 4), m4);
                if (q5) {
                    lo = _mm512_ternarylogic_epi32(lo, shift16(H, 4 - t), m10, 0xF8);
                    hi = _mm512_ternarylogic_epi32(hi, shift16(H, -t), m10, 0xF8);
                }
                a0 = _mm512_dpbusd_epi32(a0, lo, bq(xs + 32 * j + 4 * t));
                a1 = _mm512_dpbusd_epi32(a1, hi, bq(xs + 32 * j + 16 + 4 * t));
            }
            __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(rec + KP45_SC(q5) + 16 * j)));
            sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(_mm512_add_epi32(a0, a1), sc));
        }
        __m512i summ = _mm512_setzero_si512();
        UNROLL
        for (int p = 0; p < 4; p++) {
            __m512i mn = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(rec + KP45_MN(q5) + 32 * p)));
            summ = _mm512_dpwssd_epi32(summ, mn, _mm512_set1_epi32(xp[sb * KP_XP + p]));
        }
        const __m512 xdv = _mm512_set1_ps(xd[sb]);
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + KP45_D(q5))));
        __m512 dmw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + KP45_DMIN(q5))));
        __m512 t = _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(dw, xdv), _mm512_cvtepi32_ps(sumi)),
                                 _mm512_mul_ps(_mm512_mul_ps(dmw, xdv), _mm512_cvtepi32_ps(summ)));
        acc = _mm512_add_ps(acc, t);
    }
    _mm512_mask_storeu_ps(y, mask, acc);
}

INL void q6k_gemv(const uint8_t *grp, int64_t nsb, const uint8_t *xq, const float *xd, const int32_t *xp, float *y,
                  __mmask16 mask) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *xs = xq + (size_t)sb * KX_BYTES + KX_QS, *rec = grp + sb * KP6_REC;
        if (sb + 1 < nsb) kp_prefetch_sb(xs + KX_BYTES - KX_QS, xp + (sb + 1) * KP_XP);
        __m512i sumi = _mm512_setzero_si512();
        for (int s = 0; s < 16; s++) {
            __m512i q0, q1, q2, q3;
            q6_codes(rec + KP6_SUB * s, &q0, &q1, &q2, &q3);
            const uint8_t *xc = xs + 16 * s;
            __m512i a0 = _mm512_dpbusd_epi32(_mm512_set1_epi32(xp[sb * KP_XP + s]), q0, bq(xc));
            __m512i a1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q1, bq(xc + 4));
            a0 = _mm512_dpbusd_epi32(a0, q2, bq(xc + 8));
            a1 = _mm512_dpbusd_epi32(a1, q3, bq(xc + 12));
            __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(rec + KP6_SC + 16 * s)));
            sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(_mm512_add_epi32(a0, a1), sc));
        }
        __m512 dw = _mm512_loadu_ps((const float *)(rec + KP6_D));
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xd[sb])), _mm512_cvtepi32_ps(sumi)));
    }
    _mm512_mask_storeu_ps(y, mask, acc);
}

TGT static void q4k_gemv(const uint8_t *grp, int64_t nsb, const uint8_t *xq, const float *xd, const int32_t *xp,
                         float *y, __mmask16 mask) {
    q45k_gemv(false, grp, nsb, xq, xd, xp, y, mask);
}
TGT static void q5k_gemv(const uint8_t *grp, int64_t nsb, const uint8_t *xq, const float *xd, const int32_t *xp,
                         float *y, __mmask16 mask) {
    q45k_gemv(true, grp, nsb, xq, xd, xp, y, mask);
}
TGT static void q6k_gemv_fn(const uint8_t *grp, int64_t nsb, const uint8_t *xq, const float *xd, const int32_t *xp,
                            float *y, __mmask16 mask) {
    q6k_gemv(grp, nsb, xq, xd, xp, y, mask);
}
typedef void (*gemv_fn)(const uint8_t *, int64_t, const uint8_t *, const float *, const int32_t *, float *, __mmask16);

bool eng_kp_gemm_avx512(uint32_t type, const uint8_t *P, int64_t k, const uint8_t *xq, int64_t m, float *y,
                        int64_t ldy, int64_t jb, int64_t je) {
    static const group_fn *const tabs[6] = {q40_tab, q50_tab, q4k_tab, q5k_tab, q6k_tab, qmx_tab};
    int64_t nsb;
    size_t gbytes, xb;
    const int ti = eng_kp_shape(type, k, &nsb, &gbytes, &xb);
    if (ti < 0) return false;
    const group_fn *tab = tabs[ti];
    const int64_t g_begin = jb / KP_ROWS, g_end = (je + KP_ROWS - 1) / KP_ROWS;
    float xd[ENG_PACK_MAX_K / ENG_QK * MAXC];
    _Alignas(64) int32_t xp[KP_MAX_SB * MAXC * KP_XP];
    _Static_assert(KP_MAX_SB * KP_XP >= ENG_PACK_MAX_K / ENG_QK, "xp holds the Q4_0 / Q5_0 block sums");
    static const gemv_fn gemvs[6] = {NULL, NULL, q4k_gemv, q5k_gemv, q6k_gemv_fn, NULL};
    if (m == 1 && gemvs[ti]) { /* one row per block in xd / xp (see q6k_gemv) */
        eng_kp_prep(type, false, xq, xb, 1, nsb, 1, xd, xp);
        for (int64_t g = g_begin; g < g_end; g++)
            gemvs[ti](P + (size_t)g * gbytes, nsb, xq, xd, xp, y + g * KP_ROWS, (__mmask16)kp_group_rows(g, jb, je));
        return true;
    }
    for (int64_t g0 = g_begin; g0 < g_end; g0 += GCHUNK) {
        int64_t g1 = g0 + GCHUNK < g_end ? g0 + GCHUNK : g_end;
        for (int64_t c0 = 0; c0 < m; c0 += MAXC) {
            const int rn = (int)(m - c0 < MAXC ? m - c0 : MAXC);
            const uint8_t *xr = xq + (size_t)c0 * xb;
            eng_kp_prep(type, false, xr, xb, rn, nsb, MAXC, xd, xp);
            for (int64_t g = g0; g < g1; g++)
                tab[rn - 1](P + (size_t)g * gbytes, nsb, xr, xb, xd, xp, y + c0 * ldy + g * KP_ROWS, ldy,
                            (__mmask16)kp_group_rows(g, jb, je));
        }
    }
    return true;
}

#endif /* x86: other architectures have no entries for it in the level tables */
