/*
 * quant_avx2.c: AVX2 + FMA + F16C kernels (also used by the AVX-512 level for the types it has no kernel of).
 * Every function using the instructions carries __attribute__((target(...))) and is only called when
 * eng_simd_detect() reported ENG_SIMD_AVX2 or better.
 *
 * Q8_0 / Q4_0 / Q5_0 / MXFP4 weights (activations Q8_0): tiles of TM weight rows x TN activation rows. A weight
 * block becomes 32 signed bytes q once per tile step (MXFP4: its codes looked up in the doubled e2m1 table); per
 * activation row, maddubs(|q|, sign(x, q)) gives int16 pair sums (|q| <= 128 and |x| <= 127, so they cannot
 * saturate; activations come from eng_quantize_row, which never writes -128), madd with ones gives int32 lanes
 * whose sum is the block's exact integer dot, converted to float and multiplied by d_w * d_x into 8 float lanes.
 *
 * Q4_K / Q6_K (activations Q8_K): the super-block's integer sum (sub-block scales applied with madd) is
 * reduced exactly to one int, then scaled in the same float operations as the scalar kernel.
 * F32 / F16 / BF16 weights with F32 activations: 4 x 8-lane FMA accumulators.
 */
#include "engine/kernels/quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
#define INL static inline __attribute__((always_inline)) TGT

#ifndef TM
#define TM 2 /* weight rows per tile (<= 4); 2x4 measured as good as 3x2, 2x3, 2x2, 4x2, 4x3 */
#endif
#ifndef TN
#define TN 4 /* activation rows per tile (<= 4) */
#endif
#define PF_DIST 2048 /* bytes ahead to prefetch weights when m = 1 */

INL float h2f(uint16_t h) { return _cvtsh_ss(h); }
INL uint16_t ld16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

INL float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
INL int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* 32 nibbles of 16 bytes: low nibbles are elements 0..15, high nibbles 16..31 */
INL __m256i nibbles32(const uint8_t *p) {
    __m128i q = _mm_loadu_si128((const __m128i *)p);
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* Weight block -> 32 signed values. */
INL __m256i w_signed(uint32_t type, const uint8_t *blk) {
    switch (type) {
    case ENG_Q_Q8_0: return _mm256_loadu_si256((const __m256i *)(blk + 2));
    case ENG_Q_Q4_0: return _mm256_sub_epi8(nibbles32(blk + 2), _mm256_set1_epi8(8));
    case ENG_Q_MXFP4: /* e, qs[16]: each code looked up in the table of doubled e2m1 values */
        return _mm256_shuffle_epi8(
            _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)),
            nibbles32(blk + 1));
    default: { /* Q5_0: d, qh[4], qs[16]; bit i of qh is the 5th bit of element i */
        __m256i v = nibbles32(blk + 6);
        uint32_t qh;
        memcpy(&qh, blk + 2, 4);
        __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                        _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                                          0x0101010101010101LL, 0x0000000000000000LL));
        const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, bits), bits), _mm256_set1_epi8(0x10));
        return _mm256_sub_epi8(_mm256_or_si256(v, hi), _mm256_set1_epi8(16));
    }
    }
}
INL size_t w_bsz(uint32_t type) {
    return type == ENG_Q_Q8_0 ? 34 : type == ENG_Q_Q4_0 ? 18 : type == ENG_Q_MXFP4 ? 17 : 22;
}
/* The weight block's scale: its fp16 d, or MXFP4's half e8m0 exponent (the scalar kernels' factor). */
INL float w_scale(uint32_t type, const uint8_t *blk) {
    return type == ENG_Q_MXFP4 ? eng_e8m0_half(blk[0]) : h2f(ld16(blk));
}

INL void tile(uint32_t type, const int RM, const int RN, const uint8_t *W, size_t wb, const uint8_t *X, size_t xb,
              int64_t nb, float *y, int64_t ldy) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++)
#pragma GCC unroll 4
        for (int c = 0; c < RN; c++) acc[r][c] = _mm256_setzero_ps();
    const size_t bs = w_bsz(type);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        __m256i xv[4];
        __m256 dx[4];
#pragma GCC unroll 4
        for (int c = 0; c < RN; c++) {
            const uint8_t *xp = X + (size_t)c * xb + (size_t)b * 34;
            xv[c] = _mm256_loadu_si256((const __m256i *)(xp + 2));
            dx[c] = _mm256_set1_ps(h2f(ld16(xp)));
        }
#pragma GCC unroll 4
        for (int r = 0; r < RM; r++) {
            const uint8_t *wp = W + (size_t)r * wb + (size_t)b * bs;
            if (RN == 1) _mm_prefetch((const char *)wp + PF_DIST, _MM_HINT_T0);
            __m256i q = w_signed(type, wp);
            __m256i aq = _mm256_sign_epi8(q, q);
            __m256 dw = _mm256_set1_ps(w_scale(type, wp));
#pragma GCC unroll 4
            for (int c = 0; c < RN; c++) {
                __m256i p16 = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(xv[c], q));
                __m256i p = _mm256_madd_epi16(p16, ones);
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw, dx[c]), acc[r][c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++)
#pragma GCC unroll 4
        for (int c = 0; c < RN; c++) y[c * ldy + r] = hsum256(acc[r][c]);
}

#include "engine/kernels/quant_tiles.h"

/* ---- k-quants ------------------------------------------------------------------------------------------- */
/* The 8 scales (bytes 0..7) and 8 mins (bytes 8..15) of a Q4_K/Q5_K block's packed 12 bytes: scale/min j < 4
 * are the low 6 bits of bytes j / j+4; for j >= 4 the low 4 bits come from byte j+4 (low nibble: scale, high
 * nibble: min) and the top 2 bits from the top bits of bytes j-4 (scale) / j (min). */
INL __m128i k4_scales_mins(const uint8_t *packed) {
    uint32_t u[3], o[4];
    memcpy(u, packed, 12);
    o[0] = u[0] & 0x3F3F3F3Fu;
    o[1] = (u[2] & 0x0F0F0F0Fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    o[2] = u[1] & 0x3F3F3F3Fu;
    o[3] = ((u[2] >> 4) & 0x0F0F0F0Fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    return _mm_loadu_si128((const __m128i *)o);
}

static TGT float dot_q4_K(int64_t nb, const void *wv, const void *xv) {
    const eng_blk_q4_K *w = wv;
    const eng_blk_q8_K *x = xv;
    float s = 0.f;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < nb; i++) {
        __m128i sm = k4_scales_mins(w[i].scales);
        /* mins . (pairwise sums of the 16 bsums) */
        __m128i bs0 = _mm_loadu_si128((const __m128i *)x[i].bsums);
        __m128i bs1 = _mm_loadu_si128((const __m128i *)(x[i].bsums + 8));
        __m128i pairs = _mm_hadd_epi16(bs0, bs1); /* 8 int16: bsums[2j] + bsums[2j+1] (|.| <= 2 * 2032) */
        __m128i mins16 = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
        __m128i pm = _mm_madd_epi16(mins16, pairs);
        pm = _mm_add_epi32(pm, _mm_shuffle_epi32(pm, 0x4E));
        pm = _mm_add_epi32(pm, _mm_shuffle_epi32(pm, 0xB1));
        int summ = _mm_cvtsi128_si32(pm);
        /* scales as int16 in both lanes; scale j broadcast by a byte shuffle */
        __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
        __m256i acc = _mm256_setzero_si256();
        const uint8_t *q = w[i].qs;
        const int8_t *qx = x[i].qs;
        for (int c = 0; c < 4; c++, q += 32, qx += 64) {
            __m256i qb = _mm256_loadu_si256((const __m256i *)q);
            __m256i lo = _mm256_and_si256(qb, m4), hi = _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4);
            __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)qx));
            __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(qx + 32)));
            __m256i s0 = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * 2 * c)));
            __m256i s1 = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * c + 1))));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p0, s0));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p1, s1));
        }
        int sumi = hsum_epi32(acc);
        float dd = h2f(w[i].d) * x[i].d, dm = h2f(w[i].dmin) * x[i].d;
        s += dd * (float)sumi - dm * (float)summ;
    }
    return s;
}

static TGT float dot_q6_K(int64_t nb, const void *wv, const void *xv) {
    const eng_blk_q6_K *w = wv;
    const eng_blk_q8_K *x = xv;
    float s = 0.f;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x03);
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *sc = w[i].scales;
        /* codes are 0..63 (value + 32): subtract 32 * sum(scale * group sum of x) at the end */
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        __m256i cm = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)x[i].bsums));
        int corr = hsum_epi32(cm);
        __m256i acc = _mm256_setzero_si256();
        const uint8_t *ql = w[i].ql, *qh = w[i].qh;
        const int8_t *qx = x[i].qs;
        for (int n = 0; n < 2; n++, ql += 64, qh += 32, qx += 128) {
            /* this half's 8 scales as int16 in both lanes */
            __m256i sch = n == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00) : _mm256_permute2x128_si256(sc16, sc16, 0x11);
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m3), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m3), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m3), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m3), 4));
            for (int qd = 0; qd < 4; qd++) {
                __m256i p = _mm256_maddubs_epi16(q[qd], _mm256_loadu_si256((const __m256i *)(qx + 32 * qd)));
                /* low lane: scale 2qd of the half, high lane: 2qd + 1 */
                __m256i scv = _mm256_shuffle_epi8(sch, _mm256_setr_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * 2 * qd)),
                                                                         _mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * qd + 1)))));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scv));
            }
        }
        int sumi = hsum_epi32(acc) - 32 * corr;
        s += (h2f(w[i].d) * x[i].d) * (float)sumi;
    }
    return s;
}

/* ---- float weights -------------------------------------------------------------------------------------- */
INL __m256 load8_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
INL __m256 load8_bf16(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
INL __m256 load8_w(uint32_t type, const void *w, int64_t i) {
    switch (type) {
    case ENG_Q_F16: return load8_f16((const uint16_t *)w + i);
    case ENG_Q_BF16: return load8_bf16((const uint16_t *)w + i);
    default: return _mm256_loadu_ps((const float *)w + i);
    }
}
INL float w_at(uint32_t type, const void *w, int64_t i) {
    switch (type) {
    case ENG_Q_F16: return h2f(((const uint16_t *)w)[i]);
    case ENG_Q_BF16: return eng_bf16_to_f32(((const uint16_t *)w)[i]);
    default: return ((const float *)w)[i];
    }
}
INL float dot_float(uint32_t type, int64_t n, const void *w, const float *x) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(load8_w(type, w, i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(load8_w(type, w, i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(load8_w(type, w, i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(load8_w(type, w, i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(load8_w(type, w, i), _mm256_loadu_ps(x + i), a0);
    float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += w_at(type, w, i) * x[i];
    return s;
}
static TGT float dot_f32(int64_t n, const void *w, const void *x) { return dot_float(ENG_Q_F32, n, w, x); }
static TGT float dot_f16(int64_t n, const void *w, const void *x) { return dot_float(ENG_Q_F16, n, w, x); }
static TGT float dot_bf16(int64_t n, const void *w, const void *x) { return dot_float(ENG_Q_BF16, n, w, x); }

/* ---- activation quantization (bit-identical to the scalar quantizers) ------------------------------------ */
INL float hmax256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
/* 32 floats times id, rounded to nearest even (the default MXCSR mode, like the scalar nearest_int), clamped to
 * [-127, 127], stored as 32 int8 in element order; returns the int32 vectors in v[4] */
INL void round_store32(const float *x, __m256 id, int8_t *out, __m256i v[4]) {
    const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
    for (int k = 0; k < 4; k++) {
        __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), id));
        v[k] = _mm256_max_epi32(_mm256_min_epi32(q, hi), lo);
    }
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)out, p);
}
static TGT void quant_q8_0(const float *x, void *dst, int64_t nb) {
    eng_blk_q8_0 *b = dst;
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (int64_t i = 0; i < nb; i++, x += 32) {
        __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x));
        for (int k = 1; k < 4; k++) a = _mm256_max_ps(a, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * k)));
        float amax = hmax256(a);
        float d = amax / 127.f;
        float id = d != 0.f ? 1.f / d : 0.f;
        __m256i v[4];
        round_store32(x, _mm256_set1_ps(id), b[i].qs, v);
        b[i].d = eng_f32_to_fp16(d);
    }
}
static TGT void quant_q8_K(const float *x, void *dst, int64_t nb) {
    eng_blk_q8_K *b = dst;
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (int64_t i = 0; i < nb; i++, x += 256) {
        __m256 a = _mm256_setzero_ps();
        for (int k = 0; k < 32; k++) a = _mm256_max_ps(a, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * k)));
        float amax = hmax256(a);
        if (amax == 0.f) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        /* the signed value of the first element with the largest magnitude */
        __m256 am = _mm256_set1_ps(amax);
        float mx = 0.f;
        for (int k = 0; k < 32; k++) {
            int msk = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * k)), am, _CMP_EQ_OQ));
            if (msk) {
                mx = x[8 * k + __builtin_ctz((unsigned)msk)];
                break;
            }
        }
        float iscale = -127.f / mx;
        __m256 is = _mm256_set1_ps(iscale);
        for (int c = 0; c < 8; c++) {
            __m256i v[4];
            round_store32(x + 32 * c, is, b[i].qs + 32 * c, v);
            b[i].bsums[2 * c] = (int16_t)hsum_epi32(_mm256_add_epi32(v[0], v[1]));
            b[i].bsums[2 * c + 1] = (int16_t)hsum_epi32(_mm256_add_epi32(v[2], v[3]));
        }
        b[i].d = 1.f / iscale;
    }
}
/* ---- dequantization (the same float operations as the scalar code: one product per value) -------------- */
static __attribute__((target("avx2"))) void deq_q8_0(const void *src, float *y, int64_t nb) {
    const eng_blk_q8_0 *b = src;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        __m256 d = _mm256_set1_ps(eng_fp16_to_f32(b[i].d));
        for (int k = 0; k < 4; k++) {
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b[i].qs + 8 * k)));
            _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
    }
}
static __attribute__((target("avx2"))) void deq_q4_0(const void *src, float *y, int64_t nb) {
    const eng_blk_q4_0 *b = src;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        __m256 d = _mm256_set1_ps(eng_fp16_to_f32(b[i].d));
        __m128i q = _mm_loadu_si128((const __m128i *)b[i].qs);
        __m128i lo = _mm_sub_epi8(_mm_and_si128(q, _mm_set1_epi8(0x0F)), _mm_set1_epi8(8));
        __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0F)), _mm_set1_epi8(8));
        __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int k = 0; k < 4; k++)
            _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])), d));
    }
}
/* NULL entries use the scalar kernels. */
const eng_qlevel eng_qlevel_avx2 = {
    .tile_m = TM, .tile_n = TN,
    .k = {
        [ENG_Q_F32] = {.vec_dot = dot_f32},
        [ENG_Q_F16] = {.vec_dot = dot_f16},
        [ENG_Q_BF16] = {.vec_dot = dot_bf16},
        [ENG_Q_Q4_0] = {.dequantize = deq_q4_0, .tiles = t_q4_0_tab, .packed_gemm = eng_kp_gemm_avx2},
        [ENG_Q_Q5_0] = {.tiles = t_q5_0_tab, .packed_gemm = eng_kp_gemm_avx2},
        [ENG_Q_Q8_0] = {.dequantize = deq_q8_0, .quantize = quant_q8_0, .tiles = t_q8_0_tab},
        [ENG_Q_Q4_K] = {.vec_dot = dot_q4_K, .packed_gemm = eng_kp_gemm_avx2},
        [ENG_Q_Q5_K] = {.packed_gemm = eng_kp_gemm_avx2},
        [ENG_Q_Q6_K] = {.vec_dot = dot_q6_K, .packed_gemm = eng_kp_gemm_avx2},
        [ENG_Q_Q8_K] = {.quantize = quant_q8_K},
        [ENG_Q_MXFP4] = {.tiles = t_mxfp4_tab, .packed_gemm = eng_kp_gemm_avx2},
    },
};

#else /* not x86: no kernels at this level */
const eng_qlevel eng_qlevel_avx2 = {0};
#endif
