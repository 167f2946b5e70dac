/*
 * quant_avx512.c: AVX-512 (F/BW/VL/DQ + VNNI) kernels. Compiled for any x86-64 target: every function that
 * uses the instructions carries __attribute__((target(...))) and is only called when eng_simd_detect()
 * reported ENG_SIMD_AVX512.
 *
 * The 32-element formats whose weights are "unsigned code - offset" times d (Q8_0: int8 = (int8 ^ 0x80) -
 * 128; Q4_0: nibble - 8; Q5_0: 5-bit code - 16; MXFP4: looked-up doubled e2m1 value + 12, minus 12, with the
 * half e8m0 exponent as d) share one tiled kernel: the weight block is turned into 32
 * unsigned bytes u once per tile step, and for every activation row x (int8) vpdpbusd accumulates
 * sum(u * x) onto -offset * sum(x) (precomputed per activation block), which is exactly the block's integer
 * dot sum(q_w * q_x). That integer is converted to float and multiplied by d_w * d_x (fused multiply-add
 * into 8 float lanes per output). Two blocks go through one zmm register per step. A tile is TM weight rows
 * x TN activation rows (4 x 4), so each weight block is loaded once per TN activation rows and each
 * activation block once per TM weight rows. With m = 1 the weights are prefetched PF_DIST bytes ahead.
 *
 * Other weight types have no entry in eng_qlevel_avx512, so the dispatcher uses the AVX2 kernels.
 */
#include "engine/kernels/quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
#define INL static inline __attribute__((always_inline)) TGT

#ifndef TM
#define TM 4 /* weight rows per tile (<= 4) */
#endif
#ifndef TN
#define TN 4 /* activation rows per tile (<= 4) */
#endif
#define PF_DIST 2048 /* bytes ahead to prefetch weights when streaming them once (m = 1); measured 768..3072 */

INL float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* Weight block -> 32 unsigned codes; q_w = code - offset. */
INL __m256i w_codes(uint32_t type, const uint8_t *blk) {
    switch (type) {
    case ENG_Q_Q8_0:
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), _mm256_set1_epi8((char)0x80));
    case ENG_Q_Q4_0: {
        __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2));
        __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
        return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
    }
    case ENG_Q_MXFP4: { /* e, qs[16]: the code's doubled e2m1 value + 12, looked up */
        __m128i q = _mm_loadu_si128((const __m128i *)(blk + 1));
        __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
        v = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
        return _mm256_shuffle_epi8(
            _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0)), v);
    }
    default: { /* Q5_0: d, qh[4], qs[16] */
        __m128i q = _mm_loadu_si128((const __m128i *)(blk + 6));
        __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
        v = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
        uint32_t qh;
        memcpy(&qh, blk + 2, 4);
        __m256i hb = _mm256_and_si256(_mm256_movm_epi8((__mmask32)qh), _mm256_set1_epi8(0x10));
        return _mm256_or_si256(v, hb);
    }
    }
}
INL int w_offset(uint32_t type) {
    return type == ENG_Q_Q8_0 ? 128 : type == ENG_Q_Q4_0 ? 8 : type == ENG_Q_MXFP4 ? 12 : 16;
}
INL size_t w_bsz(uint32_t type) {
    return type == ENG_Q_Q8_0 ? 34 : type == ENG_Q_Q4_0 ? 18 : type == ENG_Q_MXFP4 ? 17 : 22;
}

INL float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Two consecutive blocks' codes in one zmm (block b in the low half). */
INL __m512i w_codes2(uint32_t type, const uint8_t *blk) {
    const size_t bs = w_bsz(type);
    return _mm512_inserti64x4(_mm512_castsi256_si512(w_codes(type, blk)), w_codes(type, blk + bs), 1);
}
/* [f(d0) x 8, f(d1) x 8] from the fp16 scales at p and p + stride */
INL __m512 scales2(const uint8_t *p, size_t stride) {
    uint16_t d0, d1;
    memcpy(&d0, p, 2);
    memcpy(&d1, p + stride, 2);
    __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)d0 | ((uint32_t)d1 << 16))));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castps128_ps512(f));
}

/* The weight scales of blocks at p and p + stride as scales2 lays them out: fp16 d, or MXFP4's half e8m0. */
INL __m512 wscales2(uint32_t type, const uint8_t *p, size_t stride) {
    if (type != ENG_Q_MXFP4) return scales2(p, stride);
    return _mm512_insertf32x8(_mm512_set1_ps(eng_e8m0_half(p[0])), _mm256_set1_ps(eng_e8m0_half(p[stride])), 1);
}
INL float wscale(uint32_t type, const uint8_t *p) {
    uint16_t dh;
    memcpy(&dh, p, 2);
    return type == ENG_Q_MXFP4 ? eng_e8m0_half(p[0]) : h2f(dh);
}

/* y[c * ldy + r] = dot(W row r, x row c) for r < RM, c < RN, over nb blocks: two blocks per step in zmm
 * registers (16 int32 lanes: 8 per block), an odd last block in ymm. */
INL void tile(uint32_t type, const int RM, const int RN, const uint8_t *W, size_t wb, const uint8_t *X, size_t xb,
              int64_t nb, float *y, int64_t ldy) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++)
#pragma GCC unroll 4
        for (int c = 0; c < RN; c++) acc[r][c] = _mm512_setzero_ps();
    const size_t bs = w_bsz(type);
    const __m512i offv = _mm512_set1_epi8((char)w_offset(type));
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m512i xv[4], ncorr[4];
        __m512 dx[4];
#pragma GCC unroll 4
        for (int c = 0; c < RN; c++) {
            const uint8_t *xp = X + (size_t)c * xb + (size_t)b * 34;
            xv[c] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(xp + 2))),
                                       _mm256_loadu_si256((const __m256i *)(xp + 36)), 1);
            ncorr[c] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), offv, xv[c]));
            dx[c] = scales2(xp, 34);
        }
#pragma GCC unroll 4
        for (int r = 0; r < RM; r++) {
            const uint8_t *wp = W + (size_t)r * wb + (size_t)b * bs;
            if (RN == 1) _mm_prefetch((const char *)wp + PF_DIST, _MM_HINT_T0);
            __m512i u = w_codes2(type, wp);
            __m512 dw = wscales2(type, wp, bs);
#pragma GCC unroll 4
            for (int c = 0; c < RN; c++) {
                __m512i p = _mm512_dpbusd_epi32(ncorr[c], u, xv[c]);
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, dx[c]), acc[r][c]);
            }
        }
    }
    __m256 acc8[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++)
#pragma GCC unroll 4
        for (int c = 0; c < RN; c++)
            acc8[r][c] = _mm256_add_ps(_mm512_castps512_ps256(acc[r][c]), _mm512_extractf32x8_ps(acc[r][c], 1));
    if (b < nb) { /* odd last block */
        const __m256i offv8 = _mm256_set1_epi8((char)w_offset(type));
        __m256i xv[4], ncorr[4];
        __m256 dx[4];
#pragma GCC unroll 4
        for (int c = 0; c < RN; c++) {
            const uint8_t *xp = X + (size_t)c * xb + (size_t)b * 34;
            xv[c] = _mm256_loadu_si256((const __m256i *)(xp + 2));
            ncorr[c] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                        _mm256_dpbusd_epi32(_mm256_setzero_si256(), offv8, xv[c]));
            uint16_t dh;
            memcpy(&dh, xp, 2);
            dx[c] = _mm256_set1_ps(h2f(dh));
        }
#pragma GCC unroll 4
        for (int r = 0; r < RM; r++) {
            const uint8_t *wp = W + (size_t)r * wb + (size_t)b * bs;
            __m256i u = w_codes(type, wp);
            __m256 dw = _mm256_set1_ps(wscale(type, wp));
#pragma GCC unroll 4
            for (int c = 0; c < RN; c++) {
                __m256i p = _mm256_dpbusd_epi32(ncorr[c], u, xv[c]);
                acc8[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw, dx[c]), acc8[r][c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++)
#pragma GCC unroll 4
        for (int c = 0; c < RN; c++) y[c * ldy + r] = hsum256(acc8[r][c]);
}

#include "engine/kernels/quant_tiles.h"

/* The other types run the AVX2 kernels (eng_qlevel_avx2). */
const eng_qlevel eng_qlevel_avx512 = {
    .tile_m = TM, .tile_n = TN,
    .k = {
        [ENG_Q_Q4_0] = {.tiles = t_q4_0_tab, .packed_gemm = eng_kp_gemm_avx512},
        [ENG_Q_Q5_0] = {.tiles = t_q5_0_tab, .packed_gemm = eng_kp_gemm_avx512},
        [ENG_Q_Q8_0] = {.tiles = t_q8_0_tab},
        [ENG_Q_MXFP4] = {.tiles = t_mxfp4_tab, .packed_gemm = eng_kp_gemm_avx512},
        [ENG_Q_Q4_K] = {.packed_gemm = eng_kp_gemm_avx512},
        [ENG_Q_Q5_K] = {.packed_gemm = eng_kp_gemm_avx512},
        [ENG_Q_Q6_K] = {.packed_gemm = eng_kp_gemm_avx512},
    },
};

#else /* not x86: no kernels at this level */
const eng_qlevel eng_qlevel_avx512 = {0};
#endif
