/*
 * quant_kpacked_avx2.c: AVX2 kernels for the packed Q4_K, Q5_K and Q6_K layouts (quant_kpacked.c).
 *
 * A call works on one half of a group (rows 8h..8h+7: bytes 32h..32h+31 of every 64-byte line) and up to MAXC
 * activation rows. Without VNNI, vpmaddubsw multiplies the unsigned codes by the activation quad (broadcast)
 * into int16 pairs, so that row i owns int16 lanes 2i and 2i+1; vpmaddwd with the row's sub-block scale as an
 * int16 pair then gives one exact int32 per row. No int16 sum can saturate: Q4_K adds 16 products of a code
 * <= 15 and |x| <= 127 per lane (<= 30480) before the scale is applied; Q6_K adds 4 products of a code <= 63
 * (<= 32004). Q4_K mins: vpmaddwd of the mins (int16 pairs) with the activation's sub-block sums. Q6_K codes
 * are value + 32: vpmaddwd of the scale pair with (-16 bsum, -16 bsum) adds -32 * scale * bsum per sub-block.
 * The float work per super-block repeats the scalar row kernel's operations in its order, so the results equal
 * it (and the AVX-512 kernels) bit for bit.
 */
#include "engine/kernels/quant_kpacked_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline)) TGT
#ifdef __clang__
#define UNROLL _Pragma("clang loop unroll(full)")
#else
#define UNROLL _Pragma("GCC unroll 8")
#endif
#define MAXC 4   /* activation rows per kernel call (16 ymm registers) */
#define GCHUNK 8 /* groups per preparation of the activation rows */

INL int32_t ld32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}
INL __m256i bq(const uint8_t *p) { return _mm256_set1_epi32(ld32(p)); }


/* 8 bytes (one per row) as int16 pairs (v, v) in 8 int32 lanes; sgn: the bytes are int8. */
INL __m256i pair8(const uint8_t *p, bool sgn) {
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    __m256i v = sgn ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
}

/* v << n (n = -3..4; negative: right shift) in 16-bit lanes, n a constant after unrolling. */
INL __m256i shift16(__m256i v, int n) {
    switch (n) {
    case 4: return _mm256_slli_epi16(v, 4);
    case 3: return _mm256_slli_epi16(v, 3);
    case 2: return _mm256_slli_epi16(v, 2);
    case 1: return _mm256_slli_epi16(v, 1);
    case -1: return _mm256_srli_epi16(v, 1);
    case -2: return _mm256_srli_epi16(v, 2);
    case -3: return _mm256_srli_epi16(v, 3);
    default: return v;
    }
}

/* Q4_K, or Q5_K (q5: fifth bits or-ed into the codes as in the AVX-512 kernel; codes up to 31 allow only 8
 * products per int16 lane, so the scale is applied after every two lines). */
INL void q45k_half(const bool q5, const int RN, const uint8_t *grp, int64_t nsb, int h, const uint8_t *xq, size_t xb, const float *xd,
                  const int32_t *xp, float *y, int64_t ldy, __m256i mask) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m10 = _mm256_set1_epi8(0x10);
    __m256 acc[MAXC];
    UNROLL
    for (int c = 0; c < RN; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *rec = grp + sb * (q5 ? KP5_REC : KP4_REC), *xs = xq + (size_t)sb * KX_BYTES + KX_QS;
        if (RN == 1 && !q5 && sb + 1 < nsb) /* m = 1; Q5_K measured slower with it (14.5 -> 11.6 GB/s) */
            kp_prefetch_sb(xs + KX_BYTES - KX_QS, xp + (sb + 1) * MAXC * KP_XP);
        __m256i sumi[MAXC];
        UNROLL
        for (int c = 0; c < RN; c++) sumi[c] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            __m256i p[MAXC];
            UNROLL
            for (int c = 0; c < RN; c++) p[c] = _mm256_setzero_si256();
            const __m256i sc = pair8(rec + KP45_SC(q5) + 16 * j + 8 * h, false);
            const __m256i H = q5 ? _mm256_load_si256((const __m256i *)(rec + KP45_SUB(q5) * j + 256 + 32 * h)) : m4;
            UNROLL
            for (int t = 0; t < 4; t++) {
                __m256i L = _mm256_load_si256((const __m256i *)(rec + KP45_SUB(q5) * j + 64 * t + 32 * h));
                __m256i lo = _mm256_and_si256(L, m4), hi = _mm256_and_si256(_mm256_srli_epi16(L, 4), m4);
                if (q5) {
                    lo = _mm256_or_si256(lo, _mm256_and_si256(shift16(H, 4 - t), m10));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(shift16(H, -t), m10));
                }
                UNROLL
                for (int c = 0; c < RN; c++) {
                    const uint8_t *xc = xs + (size_t)c * xb + 32 * j + 4 * t;
                    p[c] = _mm256_add_epi16(p[c], _mm256_maddubs_epi16(lo, bq(xc)));
                    p[c] = _mm256_add_epi16(p[c], _mm256_maddubs_epi16(hi, bq(xc + 16)));
                }
                if (q5 && t == 1) {
                    UNROLL
                    for (int c = 0; c < RN; c++) {
                        sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p[c], sc));
                        p[c] = _mm256_setzero_si256();
                    }
                }
            }
            UNROLL
            for (int c = 0; c < RN; c++) sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(p[c], sc));
        }
        __m256i summ[MAXC];
        UNROLL
        for (int c = 0; c < RN; c++) summ[c] = _mm256_setzero_si256();
        UNROLL
        for (int q = 0; q < 4; q++) {
            __m256i mn = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(rec + KP45_MN(q5) + 32 * q + 16 * h)));
            UNROLL
            for (int c = 0; c < RN; c++)
                summ[c] = _mm256_add_epi32(summ[c],
                                           _mm256_madd_epi16(mn, _mm256_set1_epi32(xp[(sb * MAXC + c) * KP_XP + q])));
        }
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + KP45_D(q5) + 16 * h)));
        __m256 dmw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + KP45_DMIN(q5) + 16 * h)));
        UNROLL
        for (int c = 0; c < RN; c++) {
            __m256 xdv = _mm256_set1_ps(xd[sb * MAXC + c]);
            __m256 t = _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(dw, xdv), _mm256_cvtepi32_ps(sumi[c])),
                                     _mm256_mul_ps(_mm256_mul_ps(dmw, xdv), _mm256_cvtepi32_ps(summ[c])));
            acc[c] = _mm256_add_ps(acc[c], t);
        }
    }
    UNROLL
    for (int c = 0; c < RN; c++) _mm256_maskstore_ps(y + c * ldy + 8 * h, mask, acc[c]);
}

INL void q6k_half(const int RN, const uint8_t *grp, int64_t nsb, int h, const uint8_t *xq, size_t xb, const float *xd,
                  const int32_t *xp, float *y, int64_t ldy, __m256i mask) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256 acc[MAXC];
    UNROLL
    for (int c = 0; c < RN; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *rec = grp + sb * KP6_REC, *xs = xq + (size_t)sb * KX_BYTES + KX_QS;
        if (RN == 1 && sb + 1 < nsb) kp_prefetch_sb(xs + KX_BYTES - KX_QS, xp + (sb + 1) * MAXC * KP_XP); /* m = 1 */
        __m256i sumi[MAXC];
        UNROLL
        for (int c = 0; c < RN; c++) sumi[c] = _mm256_setzero_si256();
        for (int g = 0; g < 16; g++) {
            __m256i L0 = _mm256_load_si256((const __m256i *)(rec + KP6_SUB * g + 32 * h));
            __m256i L1 = _mm256_load_si256((const __m256i *)(rec + KP6_SUB * g + 64 + 32 * h));
            __m256i H = _mm256_load_si256((const __m256i *)(rec + KP6_SUB * g + 128 + 32 * h));
            __m256i q0 = _mm256_or_si256(_mm256_and_si256(L0, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
            __m256i q1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L0, 4), m4),
                                         _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
            __m256i q2 = _mm256_or_si256(_mm256_and_si256(L1, m4), _mm256_and_si256(H, m30));
            __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L1, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
            __m256i sc = pair8(rec + KP6_SC + 16 * g + 8 * h, true);
            UNROLL
            for (int c = 0; c < RN; c++) {
                const uint8_t *xc = xs + (size_t)c * xb + 16 * g;
                __m256i pa = _mm256_add_epi16(_mm256_maddubs_epi16(q0, bq(xc)), _mm256_maddubs_epi16(q1, bq(xc + 4)));
                __m256i pb = _mm256_add_epi16(_mm256_maddubs_epi16(q2, bq(xc + 8)), _mm256_maddubs_epi16(q3, bq(xc + 12)));
                __m256i corr = _mm256_madd_epi16(sc, _mm256_set1_epi32(xp[(sb * MAXC + c) * KP_XP + g]));
                __m256i s = _mm256_add_epi32(_mm256_madd_epi16(pa, sc), _mm256_madd_epi16(pb, sc));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(s, corr));
            }
        }
        __m256 dw = _mm256_loadu_ps((const float *)(rec + KP6_D + 32 * h));
        UNROLL
        for (int c = 0; c < RN; c++)
            acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xd[sb * MAXC + c])),
                                                         _mm256_cvtepi32_ps(sumi[c])));
    }
    UNROLL
    for (int c = 0; c < RN; c++) _mm256_maskstore_ps(y + c * ldy + 8 * h, mask, acc[c]);
}

/* Q4_0 / Q5_0 (q5) / MXFP4 (mx) blocks: as the AVX-512 kernel (eng_kp_prep, then the packed Q8_0 kernel's float
 * operations); int16 lanes take 16 products of codes <= 15 (Q4_0) or 8 of codes <= 31 (Q5_0) or <= 24 (MXFP4's
 * looked-up values) before vpmaddwd by ones. */

INL void q0_half(const bool q5, const bool mx, const int RN, const uint8_t *grp, int64_t nb, int h, const uint8_t *xq,
                 size_t xb, const float *xd, const int32_t *xp, float *y, int64_t ldy, __m256i mask) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m10 = _mm256_set1_epi8(0x10), ones = _mm256_set1_epi16(1);
    /* MXFP4: a code's doubled e2m1 value + 12, looked up per byte */
    const __m256i mxtab =
        _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    const int64_t cb = q5 ? 320 : 256;
    const uint8_t *scales = grp + nb * cb;
    __m256 acc[MAXC];
    UNROLL
    for (int c = 0; c < RN; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (RN == 1 && b + 4 < nb) kp_prefetch_q0(xq, xd, xp, b + 4, MAXC); /* m = 1: 4 blocks ahead */
        const uint8_t *code = grp + b * cb;
        const __m256i H = q5 ? _mm256_load_si256((const __m256i *)(code + 256 + 32 * h)) : m4;
        __m256i p[MAXC], s[MAXC];
        UNROLL
        for (int c = 0; c < RN; c++) {
            p[c] = _mm256_setzero_si256();
            s[c] = _mm256_set1_epi32(xp[b * MAXC + c]);
        }
        UNROLL
        for (int t = 0; t < 4; t++) {
            __m256i L = _mm256_load_si256((const __m256i *)(code + 64 * t + 32 * h));
            __m256i lo = _mm256_and_si256(L, m4), hi = _mm256_and_si256(_mm256_srli_epi16(L, 4), m4);
            if (q5) {
                lo = _mm256_or_si256(lo, _mm256_and_si256(shift16(H, 4 - t), m10));
                hi = _mm256_or_si256(hi, _mm256_and_si256(shift16(H, -t), m10));
            }
            if (mx) {
                lo = _mm256_shuffle_epi8(mxtab, lo);
                hi = _mm256_shuffle_epi8(mxtab, hi);
            }
            UNROLL
            for (int c = 0; c < RN; c++) {
                const uint8_t *xc = xq + (size_t)c * xb + (size_t)b * sizeof(eng_blk_q8_0) + 2 + 4 * t;
                p[c] = _mm256_add_epi16(p[c], _mm256_maddubs_epi16(lo, bq(xc)));
                p[c] = _mm256_add_epi16(p[c], _mm256_maddubs_epi16(hi, bq(xc + 16)));
            }
            if ((q5 || mx) && t == 1) { /* codes up to 31 (Q5_0) or 24 (MXFP4): 4 steps fill the int16 lanes */
                UNROLL
                for (int c = 0; c < RN; c++) {
                    s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(p[c], ones));
                    p[c] = _mm256_setzero_si256();
                }
            }
        }
        __m256 dw;
        if (mx) { /* 2^(e - 128) from the exponent's bits, as eng_e8m0_half */
            __m256i e = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(scales + 32 * b + 16 * h)));
            __m256i nrm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
            __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
            dw = _mm256_castsi256_ps(_mm256_blendv_epi8(nrm, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
        } else {
            dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales + 32 * b + 16 * h)));
        }
        UNROLL
        for (int c = 0; c < RN; c++) {
            __m256i v = _mm256_add_epi32(s[c], _mm256_madd_epi16(p[c], ones));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(dw, _mm256_set1_ps(xd[b * MAXC + c])), acc[c]);
        }
    }
    UNROLL
    for (int c = 0; c < RN; c++) _mm256_maskstore_ps(y + c * ldy + 8 * h, mask, acc[c]);
}
INL void q40_half(const int RN, const uint8_t *grp, int64_t nb, int h, const uint8_t *xq, size_t xb, const float *xd,
                  const int32_t *xp, float *y, int64_t ldy, __m256i mask) {
    q0_half(false, false, RN, grp, nb, h, xq, xb, xd, xp, y, ldy, mask);
}
INL void qmx_half(const int RN, const uint8_t *grp, int64_t nb, int h, const uint8_t *xq, size_t xb, const float *xd,
                  const int32_t *xp, float *y, int64_t ldy, __m256i mask) {
    q0_half(false, true, RN, grp, nb, h, xq, xb, xd, xp, y, ldy, mask);
}
INL void q50_half(const int RN, const uint8_t *grp, int64_t nb, int h, const uint8_t *xq, size_t xb, const float *xd,
                  const int32_t *xp, float *y, int64_t ldy, __m256i mask) {
    q0_half(true, false, RN, grp, nb, h, xq, xb, xd, xp, y, ldy, mask);
}

typedef void (*half_fn)(const uint8_t *, int64_t, int, const uint8_t *, size_t, const float *, const int32_t *,
                        float *, int64_t, __m256i);
#define HALF_FN(T, RN)                                                                                           \
    TGT static void T##_##RN(const uint8_t *grp, int64_t nsb, int h, const uint8_t *xq, size_t xb, const float *xd, \
                             const int32_t *xp, float *y, int64_t ldy, __m256i mask) {                           \
        T##_half(RN, grp, nsb, h, xq, xb, xd, xp, y, ldy, mask);                                                 \
    }
#define HALF_SET(T)                                                                                              \
    HALF_FN(T, 1) HALF_FN(T, 2) HALF_FN(T, 3) HALF_FN(T, 4)                                                      \
    static const half_fn T##_tab[MAXC] = {T##_1, T##_2, T##_3, T##_4};
INL void q4k_half(const int RN, const uint8_t *grp, int64_t nsb, int h, const uint8_t *xq, size_t xb, const float *xd,
                  const int32_t *xp, float *y, int64_t ldy, __m256i mask) {
    q45k_half(false, RN, grp, nsb, h, xq, xb, xd, xp, y, ldy, mask);
}
INL void q5k_half(const int RN, const uint8_t *grp, int64_t nsb, int h, const uint8_t *xq, size_t xb, const float *xd,
                  const int32_t *xp, float *y, int64_t ldy, __m256i mask) {
    q45k_half(true, RN, grp, nsb, h, xq, xb, xd, xp, y, ldy, mask);
}
HALF_SET(q40)
HALF_SET(q50)
HALF_SET(qmx)
HALF_SET(q4k)
HALF_SET(q5k)
HALF_SET(q6k)

/* bits (8 rows of a half group) as a vmaskmov mask: lane i all ones when bit i is set. */
TGT static __m256i lane_mask(unsigned bits) {
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), sel), sel);
}

TGT bool eng_kp_gemm_avx2(uint32_t type, const uint8_t *P, int64_t k, const uint8_t *xq, int64_t m, float *y,
                          int64_t ldy, int64_t jb, int64_t je) {
    static const half_fn *const tabs[6] = {q40_tab, q50_tab, q4k_tab, q5k_tab, q6k_tab, qmx_tab};
    int64_t nsb;
    size_t gbytes, xb;
    const int ti = eng_kp_shape(type, k, &nsb, &gbytes, &xb);
    if (ti < 0) return false;
    const half_fn *tab = tabs[ti];
    const int64_t g_begin = jb / KP_ROWS, g_end = (je + KP_ROWS - 1) / KP_ROWS;
    float xd[ENG_PACK_MAX_K / ENG_QK * MAXC];
    int32_t xp[KP_MAX_SB * MAXC * KP_XP];
    _Static_assert(KP_MAX_SB * KP_XP >= ENG_PACK_MAX_K / ENG_QK, "xp holds the Q4_0 / Q5_0 block sums");
    for (int64_t g0 = g_begin; g0 < g_end; g0 += GCHUNK) {
        int64_t g1 = g0 + GCHUNK < g_end ? g0 + GCHUNK : g_end;
        for (int64_t c0 = 0; c0 < m; c0 += MAXC) {
            const int rn = (int)(m - c0 < MAXC ? m - c0 : MAXC);
            const uint8_t *xr = xq + (size_t)c0 * xb;
            eng_kp_prep(type, true, xr, xb, rn, nsb, MAXC, xd, xp);
            for (int64_t g = g0; g < g1; g++) {
                unsigned rows = kp_group_rows(g, jb, je);
                for (int h = 0; h < 2; h++)
                    if ((rows >> (8 * h)) & 0xFFu)
                        tab[rn - 1](P + (size_t)g * gbytes, nsb, h, xr, xb, xd, xp, y + c0 * ldy + g * KP_ROWS, ldy,
                                    lane_mask((rows >> (8 * h)) & 0xFFu));
            }
        }
    }
    return true;
}

#endif /* x86: other architectures have no entries for it in the level tables */
