/*
 * quant.c: the type table, fp16/bf16 conversions, scalar (reference) dequantization, quantization, dot
 * products and the level dispatcher. See quant.h for the contracts.
 *
 * Dequantization reproduces ggml's float operations in the same order (products of floats, e.g.
 * (d * scale) * q, then - (dmin * m)), with no fused multiply-add, so the results are bit-identical to
 * llama.cpp's.
 *
 * Dot products (scalar reference, which the SIMD levels must reproduce): the integer part of every block
 * (sum of q_w * q_x, with the format's offsets and sub-block scales applied in integers) is exact; the
 * block's float scale product is then applied and the blocks are summed in float.
 */
#include "engine/kernels/quant.h"
#include "common/common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kernels/quant_impl.h"

_Static_assert(sizeof(eng_blk_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(eng_blk_q4_1) == 20, "q4_1 block");
_Static_assert(sizeof(eng_blk_q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(eng_blk_q5_1) == 24, "q5_1 block");
_Static_assert(sizeof(eng_blk_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(eng_blk_q8_1) == 36, "q8_1 block");
_Static_assert(sizeof(eng_blk_q2_K) == 84, "q2_K block");
_Static_assert(sizeof(eng_blk_q3_K) == 110, "q3_K block");
_Static_assert(sizeof(eng_blk_q4_K) == 144, "q4_K block");
_Static_assert(sizeof(eng_blk_q5_K) == 176, "q5_K block");
_Static_assert(sizeof(eng_blk_q6_K) == 210, "q6_K block");
_Static_assert(sizeof(eng_blk_q8_K) == 292, "q8_K block");

/* ---- fp16 / bf16 ----------------------------------------------------------------------------------------- */
static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float eng_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t man = h & 0x3FF;
    if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (man << 13)); /* inf / nan (payload kept) */
    if (exp == 0) {
        if (man == 0) return f32_from_bits(sign);
        /* subnormal: man * 2^-24, exact in float */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t eng_f32_to_fp16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) { /* inf or nan */
        if (a == 0x7F800000u) return sign | 0x7C00;
        return (uint16_t)(sign | 0x7E00 | ((a >> 13) & 0x3FF)); /* quiet nan, top payload bits kept */
    }
    if (a >= 0x477FF000u) return sign | 0x7C00; /* rounds to >= 65520: overflow to inf */
    if (a < 0x38800000u) {                      /* below the smallest normal half (2^-14) */
        if (a < 0x33000000u) return sign;       /* < 2^-25: rounds to zero (2^-25 is a tie: even = 0) */
        uint32_t e = a >> 23;                   /* 102..112 */
        uint32_t m = (a & 0x7FFFFF) | 0x800000; /* 24-bit significand */
        uint32_t shift = 126 - e;               /* value = m * 2^(e-150); half units 2^-24: m >> (126-e) */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias the exponent and round the 13 dropped bits to nearest even (a carry into the
     * exponent is the right answer) */
    uint32_t r = a + 0xFFF + ((a >> 13) & 1);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float eng_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t eng_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet nan */
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

static inline float h2f(uint16_t h) { return eng_fp16_to_f32(h); }

/* ---- dequantization --------------------------------------------------------------------------------------- */
static void deq_f32(const void *src, float *y, int64_t n) { memmove(y, src, (size_t)n * 4); }
static void deq_f16(const void *src, float *y, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) y[i] = eng_fp16_to_f32(h[i]);
}
static void deq_bf16(const void *src, float *y, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) y[i] = eng_bf16_to_f32(h[i]);
}
static void deq_q4_0(const void *src, float *y, int64_t nb) {
    const eng_blk_q4_0 *b = src;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        float d = h2f(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((b[i].qs[j] & 0xF) - 8) * d;
            y[j + 16] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}
static void deq_q4_1(const void *src, float *y, int64_t nb) {
    const eng_blk_q4_1 *b = src;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        float d = h2f(b[i].d), m = h2f(b[i].m);
        for (int j = 0; j < 16; j++) {
            float lo = (float)(b[i].qs[j] & 0xF) * d;
            float hi = (float)(b[i].qs[j] >> 4) * d;
            y[j] = lo + m;
            y[j + 16] = hi + m;
        }
    }
}
static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static void deq_q5_0(const void *src, float *y, int64_t nb) {
    const eng_blk_q5_0 *b = src;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        float d = h2f(b[i].d);
        uint32_t qh = le32(b[i].qh);
        for (int j = 0; j < 16; j++) {
            int lo = (b[i].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            int hi = (b[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = (float)(lo - 16) * d;
            y[j + 16] = (float)(hi - 16) * d;
        }
    }
}
static void deq_q5_1(const void *src, float *y, int64_t nb) {
    const eng_blk_q5_1 *b = src;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        float d = h2f(b[i].d), m = h2f(b[i].m);
        uint32_t qh = le32(b[i].qh);
        for (int j = 0; j < 16; j++) {
            int lo = (b[i].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            int hi = (b[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            float a = (float)lo * d, c = (float)hi * d;
            y[j] = a + m;
            y[j + 16] = c + m;
        }
    }
}
static void deq_q8_0(const void *src, float *y, int64_t nb) {
    const eng_blk_q8_0 *b = src;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        float d = h2f(b[i].d);
        for (int j = 0; j < 32; j++) y[j] = (float)b[i].qs[j] * d;
    }
}
static void deq_q8_1(const void *src, float *y, int64_t nb) {
    const eng_blk_q8_1 *b = src;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        float d = h2f(b[i].d);
        for (int j = 0; j < 32; j++) y[j] = (float)b[i].qs[j] * d;
    }
}
static void deq_q2_K(const void *src, float *y, int64_t nb) {
    const eng_blk_q2_K *b = src;
    for (int64_t i = 0; i < nb; i++) {
        float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        const uint8_t *q = b[i].qs;
        int is = 0;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int part = 0; part < 2; part++) {
                    uint8_t sc = b[i].scales[is++];
                    float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
                    for (int l = 0; l < 16; l++) {
                        float t = dl * (float)((q[l + 16 * part] >> shift) & 3);
                        *y++ = t - ml;
                    }
                }
            }
        }
    }
}
static void deq_q3_K(const void *src, float *y, int64_t nb) {
    const eng_blk_q3_K *b = src;
    for (int64_t i = 0; i < nb; i++) {
        float d = h2f(b[i].d);
        int8_t sc[16];
        eng_k3_scales(b[i].scales, sc);
        const uint8_t *q = b[i].qs;
        uint8_t m = 1;
        int is = 0;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1)) {
                for (int part = 0; part < 2; part++) {
                    float dl = d * (float)sc[is++];
                    for (int l = 0; l < 16; l++) {
                        int ll = l + 16 * part;
                        int v = ((q[ll] >> shift) & 3) - ((b[i].hmask[ll] & m) ? 0 : 4);
                        *y++ = dl * (float)v;
                    }
                }
            }
        }
    }
}
static void deq_q4_K(const void *src, float *y, int64_t nb) {
    const eng_blk_q4_K *b = src;
    for (int64_t i = 0; i < nb; i++) {
        float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        const uint8_t *q = b[i].qs;
        for (int j = 0; j < 8; j += 2, q += 32) {
            uint8_t s0, m0, s1, m1;
            eng_k4_scale_min(j, b[i].scales, &s0, &m0);
            eng_k4_scale_min(j + 1, b[i].scales, &s1, &m1);
            float d0 = d * (float)s0, mm0 = dmin * (float)m0;
            float d1 = d * (float)s1, mm1 = dmin * (float)m1;
            for (int l = 0; l < 32; l++) {
                float t = d0 * (float)(q[l] & 0xF);
                *y++ = t - mm0;
            }
            for (int l = 0; l < 32; l++) {
                float t = d1 * (float)(q[l] >> 4);
                *y++ = t - mm1;
            }
        }
    }
}
static void deq_q5_K(const void *src, float *y, int64_t nb) {
    const eng_blk_q5_K *b = src;
    for (int64_t i = 0; i < nb; i++) {
        float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        const uint8_t *q = b[i].qs;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < 8; j += 2, q += 32, u1 = (uint8_t)(u1 << 2), u2 = (uint8_t)(u2 << 2)) {
            uint8_t s0, m0, s1, m1;
            eng_k4_scale_min(j, b[i].scales, &s0, &m0);
            eng_k4_scale_min(j + 1, b[i].scales, &s1, &m1);
            float d0 = d * (float)s0, mm0 = dmin * (float)m0;
            float d1 = d * (float)s1, mm1 = dmin * (float)m1;
            for (int l = 0; l < 32; l++) {
                float t = d0 * (float)((q[l] & 0xF) + ((b[i].qh[l] & u1) ? 16 : 0));
                *y++ = t - mm0;
            }
            for (int l = 0; l < 32; l++) {
                float t = d1 * (float)((q[l] >> 4) + ((b[i].qh[l] & u2) ? 16 : 0));
                *y++ = t - mm1;
            }
        }
    }
}
static void deq_q6_K(const void *src, float *y, int64_t nb) {
    const eng_blk_q6_K *b = src;
    for (int64_t i = 0; i < nb; i++) {
        float d = h2f(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int n = 0; n < 2; n++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}
static void deq_q8_K(const void *src, float *y, int64_t nb) {
    const eng_blk_q8_K *b = src;
    for (int64_t i = 0; i < nb; i++, y += 256)
        for (int j = 0; j < 256; j++) y[j] = b[i].d * (float)b[i].qs[j];
}

/* ---- quantization ----------------------------------------------------------------------------------------- */
/* Round to nearest, ties to even, for |v| < 2^22 (the float magic-number trick, exact in that range). */
static inline int nearest_int(float v) {
    float t = v + 12582912.f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007FFFFF) - 0x00400000;
}

static void quant_f32(const float *x, void *dst, int64_t n) { memmove(dst, x, (size_t)n * 4); }
static void quant_f16(const float *x, void *dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = eng_f32_to_fp16(x[i]);
}
static void quant_bf16(const float *x, void *dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = eng_f32_to_bf16(x[i]);
}
static void quant_q4_0(const float *x, void *dst, int64_t nb) {
    eng_blk_q4_0 *b = dst;
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float amax;
        float mx = eng_absmax_signed(x, 32, &amax);
        float d = mx / -8.f;
        float id = d != 0.f ? 1.f / d : 0.f;
        b[i].d = eng_f32_to_fp16(d);
        for (int j = 0; j < 16; j++) {
            int a = eng_trunc_i8(x[j] * id + 8.5f), c = eng_trunc_i8(x[j + 16] * id + 8.5f);
            if (a > 15) a = 15;
            if (c > 15) c = 15;
            b[i].qs[j] = (uint8_t)(a | (c << 4));
        }
    }
}
static void minmax(const float *x, int n, float *mn, float *mx) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}
static void quant_q4_1(const float *x, void *dst, int64_t nb) {
    eng_blk_q4_1 *b = dst;
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float lo, hi;
        minmax(x, 32, &lo, &hi);
        float d = (hi - lo) / 15.f;
        float id = d != 0.f ? 1.f / d : 0.f;
        b[i].d = eng_f32_to_fp16(d);
        b[i].m = eng_f32_to_fp16(lo);
        for (int j = 0; j < 16; j++) {
            int a = eng_trunc_i8((x[j] - lo) * id + 0.5f), c = eng_trunc_i8((x[j + 16] - lo) * id + 0.5f);
            if (a > 15) a = 15;
            if (c > 15) c = 15;
            b[i].qs[j] = (uint8_t)(a | (c << 4));
        }
    }
}
static void put_le32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static void quant_q5_0(const float *x, void *dst, int64_t nb) {
    eng_blk_q5_0 *b = dst;
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float amax;
        float mx = eng_absmax_signed(x, 32, &amax);
        float d = mx / -16.f;
        float id = d != 0.f ? 1.f / d : 0.f;
        b[i].d = eng_f32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int a = eng_trunc_i8(x[j] * id + 16.5f), c = eng_trunc_i8(x[j + 16] * id + 16.5f);
            if (a > 31) a = 31;
            if (c > 31) c = 31;
            b[i].qs[j] = (uint8_t)((a & 0xF) | ((c & 0xF) << 4));
            qh |= (uint32_t)((a >> 4) & 1) << j;
            qh |= (uint32_t)((c >> 4) & 1) << (j + 16);
        }
        put_le32(b[i].qh, qh);
    }
}
static void quant_q5_1(const float *x, void *dst, int64_t nb) {
    eng_blk_q5_1 *b = dst;
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float lo, hi;
        minmax(x, 32, &lo, &hi);
        float d = (hi - lo) / 31.f;
        float id = d != 0.f ? 1.f / d : 0.f;
        b[i].d = eng_f32_to_fp16(d);
        b[i].m = eng_f32_to_fp16(lo);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int a = eng_trunc_i8((x[j] - lo) * id + 0.5f), c = eng_trunc_i8((x[j + 16] - lo) * id + 0.5f);
            if (a > 31) a = 31;
            if (c > 31) c = 31;
            b[i].qs[j] = (uint8_t)((a & 0xF) | ((c & 0xF) << 4));
            qh |= (uint32_t)((a >> 4) & 1) << j;
            qh |= (uint32_t)((c >> 4) & 1) << (j + 16);
        }
        put_le32(b[i].qh, qh);
    }
}
/* Q8_0 / Q8_1: d = max|x| / 127, q = round(x / d) in [-127, 127]. Returns d (float, before fp16). */
static float quant_32_q8(const float *x, int8_t *qs, int *sum) {
    float amax;
    (void)eng_absmax_signed(x, 32, &amax);
    float d = amax / 127.f;
    float id = d != 0.f ? 1.f / d : 0.f;
    int s = 0;
    for (int j = 0; j < 32; j++) {
        int v = nearest_int(x[j] * id);
        if (v > 127) v = 127;
        if (v < -127) v = -127;
        qs[j] = (int8_t)v;
        s += v;
    }
    *sum = s;
    return d;
}
static void quant_q8_0(const float *x, void *dst, int64_t nb) {
    eng_blk_q8_0 *b = dst;
    for (int64_t i = 0; i < nb; i++, x += 32) {
        int s;
        b[i].d = eng_f32_to_fp16(quant_32_q8(x, b[i].qs, &s));
    }
}
static void quant_q8_1(const float *x, void *dst, int64_t nb) {
    eng_blk_q8_1 *b = dst;
    for (int64_t i = 0; i < nb; i++, x += 32) {
        int s;
        uint16_t dh = eng_f32_to_fp16(quant_32_q8(x, b[i].qs, &s));
        b[i].d = dh;
        /* s is the sum of the dequantized values with the stored (fp16) scale, so that the dot products'
         * min terms use exactly what dequantization gives */
        b[i].s = eng_f32_to_fp16(eng_fp16_to_f32(dh) * (float)s);
    }
}
static void quant_q8_K(const float *x, void *dst, int64_t nb) {
    eng_blk_q8_K *b = dst;
    for (int64_t i = 0; i < nb; i++, x += 256) {
        float amax;
        float mx = eng_absmax_signed(x, 256, &amax);
        if (amax == 0.f) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        float iscale = -127.f / mx;
        for (int j = 0; j < 256; j++) {
            int v = nearest_int(iscale * x[j]);
            if (v > 127) v = 127;
            if (v < -127) v = -127;
            b[i].qs[j] = (int8_t)v;
        }
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += b[i].qs[16 * g + j];
            b[i].bsums[g] = (int16_t)s;
        }
        b[i].d = 1.f / iscale;
    }
}

/* ---- scalar dot products ------------------------------------------------------------------------------------ */
/* The float rows: w's elements as floats (TO_F32; empty for f32) times x's, summed in order. */
#define DOT_FLOAT_ROW(NAME, T, TO_F32)                                                                           \
    static float NAME(int64_t n, const void *wv, const void *xv) {                                               \
        const T *w = wv;                                                                                         \
        const float *x = xv;                                                                                     \
        float s = 0.f;                                                                                           \
        for (int64_t i = 0; i < n; i++) s += TO_F32(w[i]) * x[i];                                                \
        return s;                                                                                                \
    }
DOT_FLOAT_ROW(dot_f32, float, )
DOT_FLOAT_ROW(dot_f16, uint16_t, eng_fp16_to_f32)
DOT_FLOAT_ROW(dot_bf16, uint16_t, eng_bf16_to_f32)
#undef DOT_FLOAT_ROW
static float dot_q4_0(int64_t nb, const void *wv, const void *xv) {
    const eng_blk_q4_0 *w = wv;
    const eng_blk_q8_0 *x = xv;
    float s = 0.f;
    for (int64_t i = 0; i < nb; i++) {
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            isum += ((w[i].qs[j] & 0xF) - 8) * x[i].qs[j];
            isum += ((w[i].qs[j] >> 4) - 8) * x[i].qs[j + 16];
        }
        s += (float)isum * (h2f(w[i].d) * h2f(x[i].d));
    }
    return s;
}
static float dot_q4_1(int64_t nb, const void *wv, const void *xv) {
    const eng_blk_q4_1 *w = wv;
    const eng_blk_q8_1 *x = xv;
    float s = 0.f;
    for (int64_t i = 0; i < nb; i++) {
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            isum += (w[i].qs[j] & 0xF) * x[i].qs[j];
            isum += (w[i].qs[j] >> 4) * x[i].qs[j + 16];
        }
        s += (float)isum * (h2f(w[i].d) * h2f(x[i].d)) + h2f(w[i].m) * h2f(x[i].s);
    }
    return s;
}
static float dot_q5_0(int64_t nb, const void *wv, const void *xv) {
    const eng_blk_q5_0 *w = wv;
    const eng_blk_q8_0 *x = xv;
    float s = 0.f;
    for (int64_t i = 0; i < nb; i++) {
        uint32_t qh = le32(w[i].qh);
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            int lo = (w[i].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            int hi = (w[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            isum += (lo - 16) * x[i].qs[j] + (hi - 16) * x[i].qs[j + 16];
        }
        s += (float)isum * (h2f(w[i].d) * h2f(x[i].d));
    }
    return s;
}
static float dot_q5_1(int64_t nb, const void *wv, const void *xv) {
    const eng_blk_q5_1 *w = wv;
    const eng_blk_q8_1 *x = xv;
    float s = 0.f;
    for (int64_t i = 0; i < nb; i++) {
        uint32_t qh = le32(w[i].qh);
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            int lo = (w[i].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            int hi = (w[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            isum += lo * x[i].qs[j] + hi * x[i].qs[j + 16];
        }
        s += (float)isum * (h2f(w[i].d) * h2f(x[i].d)) + h2f(w[i].m) * h2f(x[i].s);
    }
    return s;
}
static float dot_q8_0(int64_t nb, const void *wv, const void *xv) {
    const eng_blk_q8_0 *w = wv;
    const eng_blk_q8_0 *x = xv;
    float s = 0.f;
    for (int64_t i = 0; i < nb; i++) {
        int isum = 0;
        for (int j = 0; j < 32; j++) isum += w[i].qs[j] * x[i].qs[j];
        s += (float)isum * (h2f(w[i].d) * h2f(x[i].d));
    }
    return s;
}
/* K-quants: per super-block an integer sum with the sub-block scales (sumi) and, for the formats with
 * mins, an integer sum of mins times the activation's 16-element sums (summ); then
 * s += (d_w * d_x) * sumi - (dmin_w * d_x) * summ. */
static float dot_q2_K(int64_t nb, const void *wv, const void *xv) {
    const eng_blk_q2_K *w = wv;
    const eng_blk_q8_K *x = xv;
    float s = 0.f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0, summ = 0;
        for (int g = 0; g < 16; g++) summ += (w[i].scales[g] >> 4) * x[i].bsums[g];
        const uint8_t *q = w[i].qs;
        const int8_t *qx = x[i].qs;
        int is = 0;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int part = 0; part < 2; part++) {
                    int sub = 0;
                    for (int l = 0; l < 16; l++) sub += ((q[l + 16 * part] >> shift) & 3) * qx[l];
                    qx += 16;
                    sumi += (w[i].scales[is++] & 0xF) * sub;
                }
            }
        }
        float dd = h2f(w[i].d) * x[i].d, dm = h2f(w[i].dmin) * x[i].d;
        s += dd * (float)sumi - dm * (float)summ;
    }
    return s;
}
static float dot_q3_K(int64_t nb, const void *wv, const void *xv) {
    const eng_blk_q3_K *w = wv;
    const eng_blk_q8_K *x = xv;
    float s = 0.f;
    for (int64_t i = 0; i < nb; i++) {
        int8_t sc[16];
        eng_k3_scales(w[i].scales, sc);
        int sumi = 0;
        const uint8_t *q = w[i].qs;
        const int8_t *qx = x[i].qs;
        uint8_t m = 1;
        int is = 0;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1)) {
                for (int part = 0; part < 2; part++) {
                    int sub = 0;
                    for (int l = 0; l < 16; l++) {
                        int ll = l + 16 * part;
                        int v = ((q[ll] >> shift) & 3) - ((w[i].hmask[ll] & m) ? 0 : 4);
                        sub += v * qx[l];
                    }
                    qx += 16;
                    sumi += sc[is++] * sub;
                }
            }
        }
        s += (h2f(w[i].d) * x[i].d) * (float)sumi;
    }
    return s;
}
/* One Q4_K or Q5_K super-block against a Q8_K one: d * sum(scale * q * x) - dmin * sum(min * bsum). qh is the
 * Q5_K block's fifth bits, NULL for Q4_K (the two formats differ only there). */
static float dot_k45_block(const uint8_t *scales, const uint8_t *q, const uint8_t *qh, uint16_t d, uint16_t dmin,
                           const eng_blk_q8_K *x) {
    int sumi = 0, summ = 0;
    const int8_t *qx = x->qs;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < 8; j += 2, q += 32, qx += 64, u1 = (uint8_t)(u1 << 2), u2 = (uint8_t)(u2 << 2)) {
        uint8_t s0, m0, s1, m1;
        eng_k4_scale_min(j, scales, &s0, &m0);
        eng_k4_scale_min(j + 1, scales, &s1, &m1);
        int a = 0, c = 0;
        for (int l = 0; l < 32; l++) {
            a += ((q[l] & 0xF) + (qh && (qh[l] & u1) ? 16 : 0)) * qx[l];
            c += ((q[l] >> 4) + (qh && (qh[l] & u2) ? 16 : 0)) * qx[l + 32];
        }
        sumi += s0 * a + s1 * c;
        summ += m0 * (x->bsums[2 * j] + x->bsums[2 * j + 1]) + m1 * (x->bsums[2 * j + 2] + x->bsums[2 * j + 3]);
    }
    float dd = h2f(d) * x->d, dm = h2f(dmin) * x->d;
    return dd * (float)sumi - dm * (float)summ;
}
static float dot_q4_K(int64_t nb, const void *wv, const void *xv) {
    const eng_blk_q4_K *w = wv;
    const eng_blk_q8_K *x = xv;
    float s = 0.f;
    for (int64_t i = 0; i < nb; i++) s += dot_k45_block(w[i].scales, w[i].qs, NULL, w[i].d, w[i].dmin, &x[i]);
    return s;
}
static float dot_q5_K(int64_t nb, const void *wv, const void *xv) {
    const eng_blk_q5_K *w = wv;
    const eng_blk_q8_K *x = xv;
    float s = 0.f;
    for (int64_t i = 0; i < nb; i++) s += dot_k45_block(w[i].scales, w[i].qs, w[i].qh, w[i].d, w[i].dmin, &x[i]);
    return s;
}
static float dot_q6_K(int64_t nb, const void *wv, const void *xv) {
    const eng_blk_q6_K *w = wv;
    const eng_blk_q8_K *x = xv;
    float s = 0.f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        const uint8_t *ql = w[i].ql, *qh = w[i].qh;
        const int8_t *sc = w[i].scales, *qx = x[i].qs;
        for (int n = 0; n < 2; n++, ql += 64, qh += 32, sc += 8, qx += 128) {
            int sub[8] = {0};
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                sub[is + 0] += q1 * qx[l];
                sub[is + 2] += q2 * qx[l + 32];
                sub[is + 4] += q3 * qx[l + 64];
                sub[is + 6] += q4 * qx[l + 96];
            }
            for (int g = 0; g < 8; g++) sumi += sc[g] * sub[g];
        }
        s += (h2f(w[i].d) * x[i].d) * (float)sumi;
    }
    return s;
}
static float dot_q8_K(int64_t nb, const void *wv, const void *xv) {
    const eng_blk_q8_K *w = wv;
    const eng_blk_q8_K *x = xv;
    float s = 0.f;
    for (int64_t i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < 256; j++) sumi += w[i].qs[j] * x[i].qs[j];
        s += (w[i].d * x[i].d) * (float)sumi;
    }
    return s;
}

/* ---- the per-type table (quant_impl.h) ----------------------------------------------------------------------- */
#define F16_AT(o) {ENG_QF_F16, o}
#define SCALAR(deq, quant, dot) {.dequantize = deq, .quantize = quant, .vec_dot = dot}
#define NO_FIELD {ENG_QF_NONE, 0}
/* Per type: {name, values per block, bytes per block, usable as weights, activation type}, the scalar
 * {dequantize, quantize, vec_dot}, the weight quantizer and the fields that must be finite. */
static const eng_qtraits k_types[ENG_Q_COUNT] = {
    [ENG_Q_F32] = {{"f32", 1, 4, true, ENG_Q_F32}, SCALAR(deq_f32, quant_f32, dot_f32), quant_f32,
                   {{ENG_QF_F32, 0}, NO_FIELD}},
    [ENG_Q_F16] = {{"f16", 1, 2, true, ENG_Q_F32}, SCALAR(deq_f16, quant_f16, dot_f16), quant_f16,
                   {F16_AT(0), NO_FIELD}},
    [ENG_Q_Q4_0] = {{"q4_0", 32, 18, true, ENG_Q_Q8_0}, SCALAR(deq_q4_0, quant_q4_0, dot_q4_0), quant_q4_0,
                    {F16_AT(0), NO_FIELD}},
    [ENG_Q_Q4_1] = {{"q4_1", 32, 20, true, ENG_Q_Q8_1}, SCALAR(deq_q4_1, quant_q4_1, dot_q4_1), quant_q4_1,
                    {F16_AT(0), F16_AT(2)}},
    [ENG_Q_Q5_0] = {{"q5_0", 32, 22, true, ENG_Q_Q8_0}, SCALAR(deq_q5_0, quant_q5_0, dot_q5_0), quant_q5_0,
                    {F16_AT(0), NO_FIELD}},
    [ENG_Q_Q5_1] = {{"q5_1", 32, 24, true, ENG_Q_Q8_1}, SCALAR(deq_q5_1, quant_q5_1, dot_q5_1), quant_q5_1,
                    {F16_AT(0), F16_AT(2)}},
    [ENG_Q_Q8_0] = {{"q8_0", 32, 34, true, ENG_Q_Q8_0}, SCALAR(deq_q8_0, quant_q8_0, dot_q8_0), eng_weights_q8_0,
                    {F16_AT(0), NO_FIELD}},
    /* Q8_1 is an activation format only: it can be quantized and dequantized, not used as weights. */
    [ENG_Q_Q8_1] = {{"q8_1", 32, 36, false, ENG_Q_Q8_1}, SCALAR(deq_q8_1, quant_q8_1, NULL), NULL,
                    {NO_FIELD, NO_FIELD}},
    /* K-quant weight types have no activation quantizer */
    [ENG_Q_Q2_K] = {{"q2_K", 256, 84, true, ENG_Q_Q8_K}, SCALAR(deq_q2_K, NULL, dot_q2_K), NULL,
                    {F16_AT(80), F16_AT(82)}},
    [ENG_Q_Q3_K] = {{"q3_K", 256, 110, true, ENG_Q_Q8_K}, SCALAR(deq_q3_K, NULL, dot_q3_K), NULL,
                    {F16_AT(108), NO_FIELD}},
    [ENG_Q_Q4_K] = {{"q4_K", 256, 144, true, ENG_Q_Q8_K}, SCALAR(deq_q4_K, NULL, dot_q4_K), eng_weights_q4_K,
                    {F16_AT(0), F16_AT(2)}},
    [ENG_Q_Q5_K] = {{"q5_K", 256, 176, true, ENG_Q_Q8_K}, SCALAR(deq_q5_K, NULL, dot_q5_K), eng_weights_q5_K,
                    {F16_AT(0), F16_AT(2)}},
    [ENG_Q_Q6_K] = {{"q6_K", 256, 210, true, ENG_Q_Q8_K}, SCALAR(deq_q6_K, NULL, dot_q6_K), eng_weights_q6_K,
                    {F16_AT(208), NO_FIELD}},
    [ENG_Q_Q8_K] = {{"q8_K", 256, 292, true, ENG_Q_Q8_K}, SCALAR(deq_q8_K, quant_q8_K, dot_q8_K), NULL,
                    {{ENG_QF_F32, 0}, NO_FIELD}},
    [ENG_Q_BF16] = {{"bf16", 1, 2, true, ENG_Q_F32}, SCALAR(deq_bf16, quant_bf16, dot_bf16), quant_bf16,
                    {{ENG_QF_BF16, 0}, NO_FIELD}},
    /* MXFP4 (quant_mxfp4.c): its reference quantizer is also llama-quantize's */
    [ENG_Q_MXFP4] = {{"mxfp4", 32, 17, true, ENG_Q_Q8_0}, SCALAR(eng_deq_mxfp4, eng_quant_mxfp4, eng_dot_mxfp4),
                     eng_quant_mxfp4, {{ENG_QF_E8M0, 0}, NO_FIELD}},
};

const eng_qtraits *eng_qtraits_get(uint32_t type) {
    if (type >= ENG_Q_COUNT || k_types[type].info.name == NULL) return NULL;
    return &k_types[type];
}

const eng_qtype_info *eng_qtype_get(uint32_t type) {
    const eng_qtraits *t = eng_qtraits_get(type);
    return t ? &t->info : NULL;
}

size_t eng_qtype_row_bytes(uint32_t type, int64_t n) {
    const eng_qtype_info *t = eng_qtype_get(type);
    if (!t || n < 0 || n % t->block_elems != 0) return 0;
    return (size_t)(n / t->block_elems) * (size_t)t->block_bytes;
}

/* ---- levels and dispatch ------------------------------------------------------------------------------------ */
eng_simd_level eng_simd_detect(void) { return (eng_simd_level)kvs_cpu_detect(); }

const char *eng_simd_name(eng_simd_level l) {
    switch (l) {
    case ENG_SIMD_SCALAR: return "scalar";
    case ENG_SIMD_AVX2: return "avx2";
    case ENG_SIMD_AVX512: return "avx512";
    }
    return "unknown";
}

const eng_qkernels *eng_qkernels_at(eng_simd_level l, uint32_t type) {
    return l >= ENG_SIMD_AVX512 ? &eng_qlevel_avx512.k[type]
           : l >= ENG_SIMD_AVX2 ? &eng_qlevel_avx2.k[type]
                                : &k_types[type].scalar;
}

/* The level the row conversions use by default. Their output is the same bytes at every level, so this
 * only picks speed. libgcc / compiler-rt fill in __builtin_cpu_supports at startup (cpuid + the OS's xgetbv
 * check): a load, no cpuid per call. */
static eng_simd_level row_level(void) {
#if defined(__x86_64__) || defined(__i386__)
    if (__builtin_cpu_supports("avx2")) return ENG_SIMD_AVX2;
#endif
    return ENG_SIMD_SCALAR;
}

/* The checks both row conversions make (a known type, n a whole number of blocks, buffers when n > 0), then the
 * kernels at the best level <= l (the scalar level when n is 0) that convert a row of type to float (to_float)
 * or from float, into *k with the block count in *nb. Returns 0, ENG_ERR_INVALID or ENG_ERR_UNSUPPORTED. */
static int row_kernels(eng_simd_level l, uint32_t type, bool to_float, const void *src, const void *dst, int64_t n,
                       const eng_qkernels **k, int64_t *nb) {
    const eng_qtype_info *t = eng_qtype_get(type);
    if (!t) return ENG_ERR_UNSUPPORTED;
    if (n < 0 || n % t->block_elems != 0 || (n > 0 && (!src || !dst))) return ENG_ERR_INVALID;
    *nb = n / t->block_elems;
    for (int lv = n > 0 ? (int)l : ENG_SIMD_SCALAR; lv >= ENG_SIMD_SCALAR; lv--) {
        *k = eng_qkernels_at((eng_simd_level)lv, type);
        if (to_float ? (*k)->dequantize != NULL : (*k)->quantize != NULL) return ENG_OK;
    }
    return ENG_ERR_UNSUPPORTED;
}

int eng_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n) {
    return eng_dequantize_row_l(row_level(), type, src, dst, n);
}

/* One row converted by the best kernel at or below level l: to floats (dequantize) or from them (quantize). */
static int convert_row(eng_simd_level l, uint32_t type, bool to_float, const void *src, void *dst, int64_t n) {
    const eng_qkernels *k;
    int64_t nb;
    int rc = row_kernels(l, type, to_float, src, dst, n, &k, &nb);
    if (rc == ENG_OK && to_float) k->dequantize(src, dst, nb);
    else if (rc == ENG_OK) k->quantize(src, dst, nb);
    return rc;
}

int eng_dequantize_row_l(eng_simd_level l, uint32_t type, const void *src, float *dst, int64_t n) {
    return convert_row(l, type, true, src, dst, n);
}

int eng_quantize_row(uint32_t type, const float *src, void *dst, int64_t n) {
    return eng_quantize_row_l(row_level(), type, src, dst, n);
}

int eng_quantize_row_l(eng_simd_level l, uint32_t type, const float *src, void *dst, int64_t n) {
    return convert_row(l, type, false, src, dst, n);
}

/* The best kernels at or below level l that multiply wtype's rows (tiles or vec_dot), with their level in
 * *at; NULL when there are none (an unknown or activation-only type). */
static const eng_qkernels *dot_kernels(eng_simd_level l, uint32_t wtype, eng_simd_level *at) {
    if (!eng_qtraits_get(wtype)) return NULL;
    for (int lv = (int)l; lv >= ENG_SIMD_SCALAR; lv--) {
        const eng_qkernels *k = eng_qkernels_at((eng_simd_level)lv, wtype);
        if (k->tiles || k->vec_dot) {
            *at = (eng_simd_level)lv;
            return k;
        }
    }
    return NULL;
}

float eng_vec_dot(eng_simd_level l, uint32_t wtype, int64_t n, const void *w_row, const void *x_row) {
    eng_simd_level at;
    const eng_qkernels *k = dot_kernels(l, wtype, &at);
    if (!k) return NAN;
    int64_t nb = n / k_types[wtype].info.block_elems;
    if (!k->tiles) return k->vec_dot(nb, w_row, x_row);
    float r;
    k->tiles[0][0](w_row, 0, x_row, 0, nb, &r, 1);
    return r;
}

void eng_gemm(eng_simd_level l, uint32_t wtype, const void *W, int64_t k, const void *xq, int64_t m, float *y,
              int64_t ldy, int64_t j_begin, int64_t j_end) {
    if (m <= 0 || j_end <= j_begin) return;
    eng_simd_level at;
    const eng_qkernels *kn = dot_kernels(l, wtype, &at);
    const eng_qtype_info *t = eng_qtype_get(wtype);
    if (!kn || !t->supported) return;
    const size_t wb = eng_qtype_row_bytes(wtype, k), xb = eng_qtype_row_bytes(t->dot_type, k);
    const int64_t nb = k / t->block_elems;
    const uint8_t *Wp = W, *Xp = xq;
    if (kn->tiles) {
        const eng_qlevel *lv = at >= ENG_SIMD_AVX512 ? &eng_qlevel_avx512 : &eng_qlevel_avx2;
        const int TM = lv->tile_m, TN = lv->tile_n;
        for (int64_t j = j_begin; j < j_end; j += TM) {
            int rm = (int)(j_end - j < TM ? j_end - j : TM);
            for (int64_t c = 0; c < m; c += TN) {
                int rn = (int)(m - c < TN ? m - c : TN);
                kn->tiles[rm - 1][rn - 1](Wp + (size_t)j * wb, wb, Xp + (size_t)c * xb, xb, nb, y + c * ldy + j, ldy);
            }
        }
        return;
    }
    for (int64_t j = j_begin; j < j_end; j++) {
        const uint8_t *wr = Wp + (size_t)j * wb;
        for (int64_t r = 0; r < m; r++) y[r * ldy + j] = kn->vec_dot(nb, wr, Xp + (size_t)r * xb);
    }
}
