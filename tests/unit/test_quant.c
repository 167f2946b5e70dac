/*
 * test_quant.c: engine/kernels/quant.h. fp16/bf16 conversions (exhaustive over the 65536 halves, random floats
 * against a nearest-value reference), quantize -> dequantize against the documented formulas, dequantize
 * of random k-quant blocks against an element-by-element re-derivation of the layout, and differential tests
 * of every SIMD level this CPU has against the scalar kernels (vec_dot and eng_gemm).
 *
 * Tolerances:
 *  - "integer mode": every block scale is 1 (and mins 1), so each dot product is a sum of integers that
 *    stays far below 2^24 in magnitude: every level must return exactly the scalar result, and the scalar
 *    result must equal the exact (double) sum of dequantized products.
 *  - random scales: levels may sum blocks in another order (several accumulators, fused multiply-add), so
 *    |level - scalar| <= 1e-5 * sum |w_i * x_i| (computed in double from the dequantized rows). The scalar
 *    result must be within the same bound of the exact sum of dequantized products, except for Q4_1/Q5_1
 *    whose min term uses the activation's fp16 sum (s), allowed 2e-3 * sum |w_i * x_i|.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kernels/quant.h"

typedef struct { uint64_t s; } rng_t;
static uint64_t rng_next(rng_t *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1DULL;
}
static uint32_t rng_u32(rng_t *r) { return (uint32_t)(rng_next(r) >> 32); }
static int rng_int(rng_t *r, int lo, int hi) { return lo + (int)(rng_u32(r) % (uint32_t)(hi - lo + 1)); }
static float rng_float(rng_t *r, float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_u32(r) >> 8) * (1.0 / 16777216.0));
}
static float rng_normal(rng_t *r) {
    double u1 = ((rng_u32(r) >> 8) + 1) * (1.0 / 16777217.0), u2 = (rng_u32(r) >> 8) * (1.0 / 16777216.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bitsf(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- conversions ---------------------------------------------------------------------------------------- */
/* The value of a half, straight from the IEEE definition. */
static double half_value(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return sign ? -v : v;
}

Test(quant, fp16_exhaustive_roundtrip) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = eng_fp16_to_f32((uint16_t)h);
        int e = (h >> 10) & 31;
        if (e == 31) {
            if (h & 1023) {
                cr_assert(isnan(f), "half %04x should be nan", h);
                cr_assert_eq(eng_f32_to_fp16(f), h | 0x200, "nan %04x round trip", h); /* quieted */
            } else {
                cr_assert(isinf(f) && (signbit(f) != 0) == ((h >> 15) != 0), "half %04x should be inf", h);
                cr_assert_eq(eng_f32_to_fp16(f), h);
            }
            continue;
        }
        cr_assert_eq((double)f, half_value((uint16_t)h), "half %04x -> %.9g", h, (double)f);
        cr_assert_eq(signbit(f) != 0, (h >> 15) != 0);
        cr_assert_eq(eng_f32_to_fp16(f), h, "half %04x round trip gives %04x", h, eng_f32_to_fp16(f));
    }
}

/* Nearest half to a finite float, ties to even, by search over the positive finite halves. */
static uint16_t ref_f32_to_fp16(float f) {
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a >= 65520.0) return sign | 0x7C00;
    int lo = 0, hi = 0x7BFF; /* largest half with value <= a */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (half_value((uint16_t)mid) <= a) lo = mid;
        else hi = mid - 1;
    }
    if (lo == 0x7BFF) return sign | 0x7BFF; /* a in [65504, 65520) */
    double d0 = a - half_value((uint16_t)lo), d1 = half_value((uint16_t)(lo + 1)) - a;
    int pick = d0 < d1 ? lo : d1 < d0 ? lo + 1 : ((lo & 1) ? lo + 1 : lo);
    return (uint16_t)(sign | pick);
}

Test(quant, fp16_random_vs_reference) {
    rng_t r = {0x1234567};
    for (int i = 0; i < 300000; i++) {
        float f;
        if (i % 3 == 0) f = bitsf(rng_u32(&r));                                 /* any float */
        else f = ldexpf(rng_float(&r, 1.f, 2.f), rng_int(&r, -27, 17)) * (i & 1 ? -1.f : 1.f);
        if (i % 7 == 0) f = bitsf(fbits(f) & 0xFFFFE000u) + 0.f;                  /* near ties */
        if (i % 11 == 0) f = bitsf((fbits(f) & 0xFFFFE000u) | 0x1000u);           /* exact ties */
        if (isnan(f)) {
            uint16_t h = eng_f32_to_fp16(f);
            cr_assert(isnan(eng_fp16_to_f32(h)), "nan %08x -> %04x", fbits(f), h);
            continue;
        }
        uint16_t want = ref_f32_to_fp16(f), got = eng_f32_to_fp16(f);
        cr_assert_eq(got, want, "f32 %08x (%.9g): got %04x want %04x (seed 0x1234567, i %d)", fbits(f), (double)f,
                     got, want, i);
    }
}

Test(quant, bf16_exhaustive_and_random) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = eng_bf16_to_f32((uint16_t)h);
        cr_assert_eq(fbits(f), h << 16);
        if (isnan(f)) cr_assert_eq(eng_f32_to_bf16(f), h | 0x40, "nan %04x", h);
        else cr_assert_eq(eng_f32_to_bf16(f), h, "bf16 %04x round trip", h);
    }
    rng_t r = {99};
    for (int i = 0; i < 300000; i++) {
        uint32_t u = rng_u32(&r);
        if (i % 5 == 0) u = (u & 0xFFFF0000u) | 0x8000u; /* exact ties */
        float f = bitsf(u);
        uint16_t got = eng_f32_to_bf16(f);
        if (isnan(f)) {
            cr_assert(isnan(eng_bf16_to_f32(got)));
            continue;
        }
        /* reference: the two bf16 neighbours (truncated magnitude and the next one up), nearest, ties even */
        uint32_t lo = u & 0xFFFF0000u, hi = lo + 0x10000u;
        double a = fabs((double)f), vlo = fabs((double)bitsf(lo));
        double vhi = ((hi & 0x7FFFFFFFu) >= 0x7F800000u) ? INFINITY : fabs((double)bitsf(hi));
        uint32_t want;
        if ((lo & 0x7FFFFFFFu) == 0x7F800000u) want = lo; /* infinity */
        else if (isinf(vhi)) {
            /* above the largest finite bf16: overflows to inf when at or past the midpoint 2^128 - 2^119 */
            want = (a - vlo < ldexp(1.0, 127 - 8)) ? lo : hi;
            if (a - vlo == ldexp(1.0, 127 - 8)) want = ((lo >> 16) & 1) ? hi : lo;
        } else {
            double d0 = a - vlo, d1 = vhi - a;
            want = d0 < d1 ? lo : d1 < d0 ? hi : (((lo >> 16) & 1) ? hi : lo);
        }
        cr_assert_eq(got, (uint16_t)(want >> 16), "f32 %08x: got %04x want %04x", u, got, want >> 16);
    }
}

/* ---- type table ----------------------------------------------------------------------------------------- */
static const uint32_t k_weight_types[] = {ENG_Q_F32,  ENG_Q_F16,  ENG_Q_BF16, ENG_Q_Q4_0, ENG_Q_Q4_1,
                                          ENG_Q_Q5_0, ENG_Q_Q5_1, ENG_Q_Q8_0, ENG_Q_Q2_K, ENG_Q_Q3_K,
                                          ENG_Q_Q4_K, ENG_Q_Q5_K, ENG_Q_Q6_K, ENG_Q_Q8_K, ENG_Q_MXFP4};
#define N_WTYPES (sizeof k_weight_types / sizeof k_weight_types[0])

Test(quant, type_table) {
    for (uint32_t t = 0; t < 40; t++) {
        const eng_qtype_info *i = eng_qtype_get(t);
        if (t >= ENG_Q_COUNT) cr_assert_null(i);
        if (!i) {
            cr_assert_eq(eng_qtype_row_bytes(t, 256), 0);
            continue;
        }
        cr_assert_gt(i->block_elems, 0);
        cr_assert_eq(eng_qtype_row_bytes(t, 512), (size_t)(512 / i->block_elems) * (size_t)i->block_bytes);
        if (i->block_elems > 1) cr_assert_eq(eng_qtype_row_bytes(t, i->block_elems + 1), 0);
        cr_assert_eq(eng_qtype_row_bytes(t, -i->block_elems), 0);
    }
    for (size_t i = 0; i < N_WTYPES; i++) {
        const eng_qtype_info *t = eng_qtype_get(k_weight_types[i]);
        cr_assert(t && t->supported, "type %u", k_weight_types[i]);
        cr_assert_not_null(eng_qtype_get(t->dot_type));
        cr_assert_eq(eng_qtype_get(t->dot_type)->block_elems > 1 ? 0 : 1, t->block_elems > 1 ? 0 : 1);
    }
    cr_assert_eq(eng_qtype_get(ENG_Q_Q8_0)->block_bytes, 34);
    cr_assert_eq(eng_qtype_get(ENG_Q_Q4_K)->block_bytes, 144);
    cr_assert_eq(eng_qtype_get(ENG_Q_Q6_K)->block_bytes, 210);
    cr_assert_eq(eng_dequantize_row(4, NULL, NULL, 0), ENG_ERR_UNSUPPORTED);
    float v[33] = {0};
    uint8_t buf[64];
    cr_assert_eq(eng_quantize_row(ENG_Q_Q8_0, v, buf, 33), ENG_ERR_INVALID);
    cr_assert_eq(eng_quantize_row(ENG_Q_Q6_K, v, buf, 0), ENG_ERR_UNSUPPORTED);
}

/* ---- quantize -> dequantize ----------------------------------------------------------------------------- */
static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)rd16(p) | ((uint32_t)rd16(p + 2) << 16); }
static float rdf(const uint8_t *p) { return bitsf(rd32(p)); }
static float h2f(const uint8_t *p) { return eng_fp16_to_f32(rd16(p)); }

/* The documented value of element i of a block (the GGUF layouts, element by element). */
static float formula(uint32_t type, const uint8_t *b, int i) {
    switch (type) {
    case ENG_Q_Q4_0: {
        int q = i < 16 ? (b[2 + i] & 15) : (b[2 + i - 16] >> 4);
        return (float)(q - 8) * h2f(b);
    }
    case ENG_Q_Q4_1: {
        int q = i < 16 ? (b[4 + i] & 15) : (b[4 + i - 16] >> 4);
        return (float)q * h2f(b) + h2f(b + 2);
    }
    case ENG_Q_Q5_0: {
        int q = (i < 16 ? (b[6 + i] & 15) : (b[6 + i - 16] >> 4)) | (int)(((rd32(b + 2) >> i) & 1) << 4);
        return (float)(q - 16) * h2f(b);
    }
    case ENG_Q_Q5_1: {
        int q = (i < 16 ? (b[8 + i] & 15) : (b[8 + i - 16] >> 4)) | (int)(((rd32(b + 4) >> i) & 1) << 4);
        return (float)q * h2f(b) + h2f(b + 2);
    }
    case ENG_Q_Q8_0: return (float)(int8_t)b[2 + i] * h2f(b);
    case ENG_Q_MXFP4: { /* e, qs[16]: the e2m1 code (sign, 2-bit exponent, 1-bit mantissa) times 2^(e - 127) */
        int c = i < 16 ? (b[1 + i] & 15) : (b[1 + i - 16] >> 4), ex = (c >> 1) & 3, man = c & 1;
        double mag = ex == 0 ? 0.5 * man : ldexp(1.0 + 0.5 * man, ex - 1);
        return (float)((c & 8 && mag != 0.0 ? -mag : mag) * ldexp(1.0, b[0] - 127)); /* code 8 is +0 too */
    }
    case ENG_Q_Q8_1: return (float)(int8_t)b[4 + i] * h2f(b);
    case ENG_Q_Q8_K: return rdf(b) * (float)(int8_t)b[4 + i];
    case ENG_Q_Q2_K: { /* scales[16] qs[64] d dmin */
        int half = i / 128, r = i % 128, sh = r / 32, part = (r % 32) / 16, l = r % 16;
        int v = (b[16 + half * 32 + part * 16 + l] >> (2 * sh)) & 3;
        uint8_t sc = b[half * 8 + sh * 2 + part];
        float dl = h2f(b + 80) * (float)(sc & 15), ml = h2f(b + 82) * (float)(sc >> 4);
        return dl * (float)v - ml;
    }
    case ENG_Q_Q3_K: { /* hmask[32] qs[64] scales[12] d */
        int half = i / 128, r = i % 128, sh = r / 32, part = (r % 32) / 16, l = r % 16;
        int j = half * 8 + sh * 2 + part;
        int low = (b[32 + half * 32 + part * 16 + l] >> (2 * sh)) & 3;
        int hbit = (b[part * 16 + l] >> (half * 4 + sh)) & 1;
        const uint8_t *s = b + 96;
        int s6 = (j < 8 ? (s[j] & 15) : (s[j - 8] >> 4)) | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
        return (h2f(b + 108) * (float)(s6 - 32)) * (float)(low - (hbit ? 0 : 4));
    }
    case ENG_Q_Q4_K:
    case ENG_Q_Q5_K: { /* d dmin scales[12] (qh[32]) qs[128] */
        int c = i / 64, r = i % 64, j = 2 * c + (r >= 32);
        const uint8_t *s = b + 4, *qs = b + (type == ENG_Q_Q4_K ? 16 : 48);
        int q = r < 32 ? (qs[c * 32 + r] & 15) : (qs[c * 32 + r - 32] >> 4);
        if (type == ENG_Q_Q5_K) q += ((b[16 + r % 32] >> j) & 1) * 16;
        int sc = j < 4 ? (s[j] & 63) : ((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        int mn = j < 4 ? (s[j + 4] & 63) : ((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
        return (h2f(b) * (float)sc) * (float)q - h2f(b + 2) * (float)mn;
    }
    case ENG_Q_Q6_K: { /* ql[128] qh[64] scales[16] d */
        int n = i / 128, r = i % 128, qd = r / 32, l = r % 32;
        uint8_t lb = b[n * 64 + (qd & 1) * 32 + l];
        int q = ((qd < 2 ? (lb & 15) : (lb >> 4)) | (((b[128 + n * 32 + l] >> (2 * qd)) & 3) << 4)) - 32;
        return h2f(b + 208) * (float)(int8_t)b[192 + n * 8 + l / 16 + 2 * qd] * (float)q;
    }
    }
    return NAN;
}

static void random_fp16(rng_t *r, uint8_t *p, float lo, float hi) {
    uint16_t h = eng_f32_to_fp16(rng_float(r, lo, hi));
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* Random bytes for a block, with scale fields set to finite values. */
static void random_block(rng_t *r, uint32_t type, uint8_t *b) {
    const eng_qtype_info *t = eng_qtype_get(type);
    for (int i = 0; i < t->block_bytes; i++) b[i] = (uint8_t)rng_u32(r);
    switch (type) {
    case ENG_Q_Q4_1: case ENG_Q_Q5_1: random_fp16(r, b, -0.1f, 0.1f); random_fp16(r, b + 2, -1.f, 1.f); break;
    case ENG_Q_Q4_0: case ENG_Q_Q5_0: case ENG_Q_Q8_0: case ENG_Q_Q8_1: random_fp16(r, b, -0.1f, 0.1f); break;
    case ENG_Q_Q2_K: random_fp16(r, b + 80, -0.1f, 0.1f); random_fp16(r, b + 82, -0.1f, 0.1f); break;
    case ENG_Q_Q3_K: random_fp16(r, b + 108, -0.1f, 0.1f); break;
    case ENG_Q_Q4_K: case ENG_Q_Q5_K: random_fp16(r, b, 0.f, 0.1f); random_fp16(r, b + 2, 0.f, 0.1f); break;
    case ENG_Q_Q6_K: random_fp16(r, b + 208, -0.1f, 0.1f); break;
    case ENG_Q_MXFP4: b[0] = (uint8_t)rng_int(r, 110, 132); break; /* products stay far from overflow */
    case ENG_Q_Q8_K: {
        float d = rng_float(r, -0.1f, 0.1f);
        memcpy(b, &d, 4);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += (int8_t)b[4 + 16 * g + j];
            b[260 + 2 * g] = (uint8_t)(s & 0xFF);
            b[261 + 2 * g] = (uint8_t)((s >> 8) & 0xFF);
        }
        break;
    }
    }
}

Test(quant, dequantize_random_blocks_match_layout) {
    static const uint32_t types[] = {ENG_Q_Q4_0, ENG_Q_Q4_1, ENG_Q_Q5_0, ENG_Q_Q5_1, ENG_Q_Q8_0,
                                     ENG_Q_Q8_1, ENG_Q_Q2_K, ENG_Q_Q3_K, ENG_Q_Q4_K, ENG_Q_Q5_K,
                                     ENG_Q_Q6_K, ENG_Q_Q8_K, ENG_Q_MXFP4};
    rng_t r = {7};
    uint8_t blk[4 * 292];
    float out[4 * 256];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t type = types[ti];
        const eng_qtype_info *t = eng_qtype_get(type);
        for (int iter = 0; iter < 200; iter++) {
            for (int b = 0; b < 4; b++) random_block(&r, type, blk + b * t->block_bytes);
            if (type == ENG_Q_MXFP4) /* every exponent but NaN's 0xFF, the subnormal scales of 0 and 1 too */
                for (int b = 0; b < 4; b++) /* iterations 0..3: exponents 0, 1, 85, 86, 170, 171, 253, 254 */
                    blk[b * 17] = (uint8_t)(iter < 4 ? iter * 85 - 2 * (iter == 3) + b % 2 : rng_int(&r, 0, 254));
            cr_assert_eq(eng_dequantize_row(type, blk, out, 4 * t->block_elems), 0);
            for (int b = 0; b < 4; b++)
                for (int i = 0; i < t->block_elems; i++) {
                    float want = formula(type, blk + b * t->block_bytes, i);
                    cr_assert_eq(fbits(out[b * t->block_elems + i]), fbits(want),
                                 "%s block %d elem %d: %.9g vs %.9g (seed 7, iter %d)", t->name, b, i,
                                 (double)out[b * t->block_elems + i], (double)want, iter);
                }
        }
    }
}

Test(quant, quantize_then_dequantize) {
    static const uint32_t types[] = {ENG_Q_F32,  ENG_Q_F16,  ENG_Q_BF16, ENG_Q_Q4_0, ENG_Q_Q4_1,
                                     ENG_Q_Q5_0, ENG_Q_Q5_1, ENG_Q_Q8_0, ENG_Q_Q8_1, ENG_Q_Q8_K};
    rng_t r = {2024};
    enum { N = 1024 };
    float x[N], y[N];
    uint8_t q[N * 4 + 64];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t type = types[ti];
        const eng_qtype_info *t = eng_qtype_get(type);
        for (int iter = 0; iter < 50; iter++) {
            float scale = ldexpf(1.f, rng_int(&r, -8, 4));
            for (int i = 0; i < N; i++) x[i] = rng_normal(&r) * scale + (type == ENG_Q_Q4_1 ? 0.3f * scale : 0.f);
            if (iter == 0) memset(x, 0, sizeof x);         /* all-zero blocks */
            if (iter == 1) for (int i = 0; i < 32; i++) x[i] = 0.f;
            cr_assert_eq(eng_quantize_row(type, x, q, N), 0, "%s", t->name);
            cr_assert_eq(eng_dequantize_row(type, q, y, N), 0);
            for (int b = 0; b < N / t->block_elems; b++) {
                const uint8_t *blk = q + (size_t)b * t->block_bytes;
                /* step of the block's grid, for the error bound */
                float amax = 0.f, lo = INFINITY, hi = -INFINITY;
                for (int i = 0; i < t->block_elems; i++) {
                    float v = x[b * t->block_elems + i];
                    amax = fmaxf(amax, fabsf(v));
                    lo = fminf(lo, v);
                    hi = fmaxf(hi, v);
                }
                float step;
                switch (type) {
                case ENG_Q_F32: step = 0.f; break;
                case ENG_Q_F16: step = 0.f; break;
                case ENG_Q_BF16: step = 0.f; break;
                case ENG_Q_Q4_0: step = amax / 8.f; break;
                case ENG_Q_Q5_0: step = amax / 16.f; break;
                case ENG_Q_Q4_1: step = (hi - lo) / 15.f; break;
                case ENG_Q_Q5_1: step = (hi - lo) / 31.f; break;
                default: step = amax / 127.f; break;
                }
                for (int i = 0; i < t->block_elems; i++) {
                    int e = b * t->block_elems + i;
                    if (t->block_elems > 1) {
                        float want = formula(type, blk, i);
                        cr_assert_eq(fbits(y[e]), fbits(want), "%s elem %d", t->name, e);
                    }
                    float err = fabsf(y[e] - x[e]), bound;
                    if (type == ENG_Q_F32) bound = 0.f;
                    else if (type == ENG_Q_F16) bound = fabsf(x[e]) * 0x1p-11f + 0x1p-25f;
                    else if (type == ENG_Q_BF16) bound = fabsf(x[e]) * 0x1p-8f;
                    /* half a step (a full step for Q4_0/Q5_0, whose grid is asymmetric: the side opposite the
                     * signed max clamps at +7 / +15 steps), plus the fp16 rounding of the scale (and min) times the
                     * largest level */
                    else bound = ((type == ENG_Q_Q4_0 || type == ENG_Q_Q5_0) ? 1.f : 0.5f) * step + 40.f * step * 0x1p-11f + fabsf(lo) * 0x1p-11f + 1e-30f;
                    cr_assert_leq(err, bound, "%s elem %d: x %.9g y %.9g (seed 2024, iter %d)", t->name, e,
                                  (double)x[e], (double)y[e], iter);
                }
            }
            if (type == ENG_Q_Q8_K) { /* bsums are the sums of the 16-element groups */
                for (int b = 0; b < N / 256; b++) {
                    const uint8_t *blk = q + (size_t)b * 292;
                    for (int g = 0; g < 16; g++) {
                        int s = 0;
                        for (int j = 0; j < 16; j++) s += (int8_t)blk[4 + 16 * g + j];
                        cr_assert_eq((int16_t)rd16(blk + 260 + 2 * g), s);
                    }
                }
            }
            if (type == ENG_Q_Q8_1) { /* s = d * sum(q) (fp16) */
                for (int b = 0; b < N / 32; b++) {
                    const uint8_t *blk = q + (size_t)b * 36;
                    int s = 0;
                    for (int j = 0; j < 32; j++) s += (int8_t)blk[4 + j];
                    cr_assert_eq(rd16(blk + 2), eng_f32_to_fp16(h2f(blk) * (float)s));
                }
            }
        }
    }
}

/* ---- dot products and gemm: every level against scalar ---------------------------------------------------- */
/* A random weight row of n values (nb blocks); in integer mode every scale/min field is 1. */
static void random_wrow(rng_t *r, uint32_t type, int64_t n, uint8_t *w, bool int_mode) {
    const eng_qtype_info *t = eng_qtype_get(type);
    int64_t nb = n / t->block_elems;
    if (t->block_elems == 1) {
        for (int64_t i = 0; i < n; i++) {
            float v = int_mode ? (float)rng_int(r, -8, 8) : rng_normal(r);
            if (type == ENG_Q_F32) memcpy(w + 4 * i, &v, 4);
            else {
                uint16_t h = type == ENG_Q_F16 ? eng_f32_to_fp16(v) : eng_f32_to_bf16(v);
                memcpy(w + 2 * i, &h, 2);
            }
        }
        return;
    }
    static const uint8_t one[2] = {0x00, 0x3C};
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * t->block_bytes;
        random_block(r, type, p);
        if (!int_mode) continue;
        switch (type) {
        case ENG_Q_Q4_1: case ENG_Q_Q5_1: memcpy(p, one, 2); memcpy(p + 2, one, 2); break;
        case ENG_Q_Q4_0: case ENG_Q_Q5_0: case ENG_Q_Q8_0: memcpy(p, one, 2); break;
        case ENG_Q_Q2_K: memcpy(p + 80, one, 2); memcpy(p + 82, one, 2); break;
        case ENG_Q_Q3_K: memcpy(p + 108, one, 2); break;
        case ENG_Q_Q4_K: case ENG_Q_Q5_K: memcpy(p, one, 2); memcpy(p + 2, one, 2); break;
        case ENG_Q_Q6_K: memcpy(p + 208, one, 2); break;
        case ENG_Q_Q8_K: { float d1 = 1.f; memcpy(p, &d1, 4); break; }
        case ENG_Q_MXFP4: p[0] = 128; break; /* half of 2^(128 - 127): the doubled table values, times 1 */
        }
    }
}

/* A random activation row in dot_type. Integer mode: q in [-127, 127] with d = 1 built directly; otherwise
 * random floats quantized with eng_quantize_row. */
static void random_xrow(rng_t *r, uint32_t dtype, int64_t n, uint8_t *x, float *tmp, bool int_mode) {
    if (!int_mode || dtype == ENG_Q_F32) {
        for (int64_t i = 0; i < n; i++) tmp[i] = int_mode ? (float)rng_int(r, -8, 8) : rng_normal(r);
        cr_assert_eq(eng_quantize_row(dtype, tmp, x, n), 0);
        return;
    }
    const eng_qtype_info *t = eng_qtype_get(dtype);
    for (int64_t b = 0; b < n / t->block_elems; b++) {
        uint8_t *p = x + b * t->block_bytes;
        int sum = 0;
        if (dtype == ENG_Q_Q8_K) {
            float d1 = 1.f;
            memcpy(p, &d1, 4);
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int j = 0; j < 16; j++) {
                    int v = rng_int(r, -127, 127);
                    p[4 + 16 * g + j] = (uint8_t)(int8_t)v;
                    s += v;
                }
                int16_t s16 = (int16_t)s;
                memcpy(p + 260 + 2 * g, &s16, 2);
            }
        } else {
            int off = dtype == ENG_Q_Q8_1 ? 4 : 2;
            for (int j = 0; j < 32; j++) {
                int v = rng_int(r, -127, 127);
                p[off + j] = (uint8_t)(int8_t)v;
                sum += v;
            }
            uint16_t one = 0x3C00, s = eng_f32_to_fp16((float)sum);
            memcpy(p, &one, 2);
            if (dtype == ENG_Q_Q8_1) memcpy(p + 2, &s, 2);
        }
    }
}

/* exact-ish reference from dequantized rows: sum and sum of |terms| in double */
static void ref_dot(uint32_t wtype, int64_t n, const void *w, const void *x, float *wf, float *xf, double *sum,
                    double *abs_sum) {
    const eng_qtype_info *t = eng_qtype_get(wtype);
    cr_assert_eq(eng_dequantize_row(wtype, w, wf, n), 0);
    cr_assert_eq(eng_dequantize_row(t->dot_type, x, xf, n), 0);
    double s = 0, a = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)wf[i] * xf[i];
        a += fabs((double)wf[i] * xf[i]);
    }
    *sum = s;
    *abs_sum = a;
}

static int64_t random_k(rng_t *r, uint32_t type) {
    const eng_qtype_info *t = eng_qtype_get(type);
    if (t->block_elems == 256) return 256 * rng_int(r, 1, 6);
    if (t->block_elems == 32) return 32 * rng_int(r, 1, 40);
    return rng_int(r, 1, 300); /* float types: any length, odd ones included */
}

Test(quant, vec_dot_levels_vs_scalar) {
    eng_simd_level top = eng_simd_detect();
    cr_log_info("simd level: %s", eng_simd_name(top));
    enum { KMAX = 6 * 256 + 64 };
    uint8_t *w = malloc(KMAX * 4), *x = malloc(KMAX * 4 + 512);
    float *wf = malloc(KMAX * 4), *xf = malloc(KMAX * 4), *tmp = malloc(KMAX * 4);
    cr_assert(w && x && wf && xf && tmp);
    for (size_t ti = 0; ti < N_WTYPES; ti++) {
        uint32_t wtype = k_weight_types[ti];
        const eng_qtype_info *t = eng_qtype_get(wtype);
        uint64_t seed = 1000 + ti;
        rng_t r = {seed};
        for (int iter = 0; iter < 300; iter++) {
            bool int_mode = iter % 2 == 0;
            int64_t n = random_k(&r, wtype);
            random_wrow(&r, wtype, n, w, int_mode);
            random_xrow(&r, t->dot_type, n, x, tmp, int_mode);
            double exact, abs_sum;
            ref_dot(wtype, n, w, x, wf, xf, &exact, &abs_sum);
            float sc = eng_vec_dot(ENG_SIMD_SCALAR, wtype, n, w, x);
            bool minterm = wtype == ENG_Q_Q4_1 || wtype == ENG_Q_Q5_1;
            if (int_mode) {
                cr_assert_eq((double)sc, exact, "%s scalar int-mode n %lld: %.9g vs %.9g (seed %llu iter %d)",
                             t->name, (long long)n, (double)sc, exact, (unsigned long long)seed, iter);
            } else {
                double tol = (minterm ? 2e-3 : 1e-5) * abs_sum + 1e-30;
                cr_assert_leq(fabs(sc - exact), tol, "%s scalar n %lld: %.9g vs %.9g (seed %llu iter %d)",
                              t->name, (long long)n, (double)sc, exact, (unsigned long long)seed, iter);
            }
            for (int l = ENG_SIMD_AVX2; l <= (int)top; l++) {
                float v = eng_vec_dot((eng_simd_level)l, wtype, n, w, x);
                if (int_mode)
                    cr_assert_eq(v, sc, "%s %s int-mode n %lld: %.9g vs scalar %.9g (seed %llu iter %d)", t->name,
                                 eng_simd_name(l), (long long)n, (double)v, (double)sc, (unsigned long long)seed,
                                 iter);
                else
                    cr_assert_leq(fabs((double)v - sc), 1e-5 * abs_sum + 1e-30,
                                  "%s %s n %lld: %.9g vs scalar %.9g (seed %llu iter %d)", t->name,
                                  eng_simd_name(l), (long long)n, (double)v, (double)sc, (unsigned long long)seed,
                                  iter);
            }
        }
    }
    free(w); free(x); free(wf); free(xf); free(tmp);
}

Test(quant, gemm_levels_vs_scalar) {
    eng_simd_level top = eng_simd_detect();
    for (size_t ti = 0; ti < N_WTYPES; ti++) {
        uint32_t wtype = k_weight_types[ti];
        const eng_qtype_info *t = eng_qtype_get(wtype);
        uint64_t seed = 5000 + ti;
        rng_t r = {seed};
        for (int iter = 0; iter < 24; iter++) {
            bool int_mode = iter % 2 == 0;
            int64_t k = random_k(&r, wtype);
            int64_t n_out = rng_int(&r, 1, 37), m = iter < 4 ? rng_int(&r, 1, 3) : rng_int(&r, 1, 20);
            if (iter == 5) m = 128;
            int64_t jb = rng_int(&r, 0, (int)n_out - 1), je = rng_int(&r, (int)jb + 1, (int)n_out);
            int64_t ldy = n_out + rng_int(&r, 0, 3);
            size_t wb = eng_qtype_row_bytes(wtype, k), xb = eng_qtype_row_bytes(t->dot_type, k);
            uint8_t *W = malloc(wb * (size_t)n_out), *X = malloc(xb * (size_t)m);
            float *tmp = malloc((size_t)k * 4), *y = malloc((size_t)(m * ldy) * 4);
            float *yref = malloc((size_t)(m * ldy) * 4);
            cr_assert(W && X && tmp && y && yref);
            for (int64_t j = 0; j < n_out; j++) random_wrow(&r, wtype, k, W + j * wb, int_mode);
            for (int64_t i = 0; i < m; i++) random_xrow(&r, t->dot_type, k, X + i * xb, tmp, int_mode);
            for (int64_t i = 0; i < m * ldy; i++) yref[i] = -12345.f;
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = jb; j < je; j++)
                    yref[i * ldy + j] = eng_vec_dot(ENG_SIMD_SCALAR, wtype, k, W + j * wb, X + i * xb);
            for (int l = ENG_SIMD_SCALAR; l <= (int)top; l++) {
                for (int64_t i = 0; i < m * ldy; i++) y[i] = -12345.f;
                eng_gemm((eng_simd_level)l, wtype, W, k, X, m, y, ldy, jb, je);
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < ldy; j++) {
                        float a = y[i * ldy + j], b = yref[i * ldy + j];
                        if (int_mode || j < jb || j >= je) {
                            cr_assert_eq(a, b, "%s %s gemm m %lld k %lld rows [%lld,%lld) y[%lld][%lld] %.9g vs %.9g "
                                         "(seed %llu iter %d)", t->name, eng_simd_name(l), (long long)m,
                                         (long long)k, (long long)jb, (long long)je, (long long)i, (long long)j,
                                         (double)a, (double)b, (unsigned long long)seed, iter);
                        } else {
                            float *wf = malloc((size_t)k * 4), *xf = malloc((size_t)k * 4);
                            double ex, as;
                            ref_dot(wtype, k, W + j * wb, X + i * xb, wf, xf, &ex, &as);
                            free(wf);
                            free(xf);
                            cr_assert_leq(fabs((double)a - b), 1e-5 * as + 1e-30,
                                          "%s %s gemm y[%lld][%lld] %.9g vs %.9g (seed %llu iter %d)", t->name,
                                          eng_simd_name(l), (long long)i, (long long)j, (double)a, (double)b,
                                          (unsigned long long)seed, iter);
                        }
                    }
            }
            free(W); free(X); free(tmp); free(y); free(yref);
        }
    }
}

/* Packed Q8_0 matrices: the scalar kernel over the packed layout gives exactly the scalar eng_gemm floats
 * of the original rows (so the packing loses nothing), every SIMD level stays within the accumulation-order
 * bound of them (exact in integer mode), only rows in [jb, je) are written, and any split of the rows into
 * ranges (as threads do) gives the same floats as one call, and each activation row alone (m = 1: its own kernel
 * on AVX-512) gives the floats it gets in the batch. Shapes include n_out not a multiple of 16, odd
 * block counts, every activation tile size up to 8 and beyond, and long rows up to ENG_PACK_MAX_K (the AVX2
 * kernel converts the activations in pieces). Extreme iterations (integer mode) use only the codes -128, -127
 * and 127 (weights; -128 occurs in GGUF files) and +-127 (activations), in runs of one sign, so that block
 * sums reach +-32 * 128 * 127: any 16-bit saturation or overflow in a kernel shows as an exact mismatch. */
Test(quant, packed_q8_0_vs_rows) {
    eng_simd_level top = eng_simd_detect();
    rng_t r = {777};
    cr_assert_eq(eng_packed_q8_0_bytes(0, 32), 0);
    cr_assert_eq(eng_packed_q8_0_bytes(16, 48), 0);
    cr_assert_eq(eng_packed_q8_0_bytes(16, ENG_PACK_MAX_K + 32), 0);
    cr_assert_eq(eng_packed_q8_0_bytes(17, 64), 2 * ENG_PACK_GROUP_BYTES(64));
    cr_assert_eq(ENG_PACK_GROUP_BYTES(96) % 64, 0);
    cr_assert_eq(eng_pack_q8_0(NULL, 16, 32, NULL), ENG_ERR_INVALID);
    for (int iter = 0; iter < 72; iter++) {
        bool extreme = iter % 5 == 2, int_mode = iter % 3 == 0 || extreme, long_rows = iter >= 64;
        int64_t k = 32 * rng_int(&r, 1, iter < 10 ? 5 : 60), n_out = rng_int(&r, 1, 70);
        int64_t m = iter % 7 == 0 ? rng_int(&r, 9, 40) : rng_int(&r, 1, 8);
        if (long_rows) {
            k = iter == 64 ? ENG_PACK_MAX_K : 32 * rng_int(&r, 150, ENG_PACK_MAX_K / 32);
            n_out = rng_int(&r, 1, 40);
            m = iter == 65 ? 1 : rng_int(&r, 1, 13);
        }
        int64_t jb = rng_int(&r, 0, (int)n_out - 1), je = rng_int(&r, (int)jb + 1, (int)n_out + 5);
        int64_t ldy = n_out + rng_int(&r, 0, 20);
        size_t wb = eng_qtype_row_bytes(ENG_Q_Q8_0, k), pbytes = eng_packed_q8_0_bytes(n_out, k);
        uint8_t *W = malloc(wb * (size_t)n_out), *X = malloc(wb * (size_t)m);
        void *P = aligned_alloc(64, (pbytes + 63) / 64 * 64);
        float *tmp = malloc((size_t)k * 4), *y = malloc((size_t)(m * ldy) * 4), *yref = malloc((size_t)(m * ldy) * 4);
        float *ysplit = malloc((size_t)(m * ldy) * 4), *y1 = malloc((size_t)(m * ldy) * 4);
        cr_assert(W && X && P && tmp && y && yref && ysplit && y1);
        for (int64_t j = 0; j < n_out; j++) random_wrow(&r, ENG_Q_Q8_0, k, W + j * wb, int_mode);
        for (int64_t i = 0; i < m; i++) random_xrow(&r, ENG_Q_Q8_0, k, X + i * wb, tmp, int_mode);
        if (extreme) { /* codes after the 2-byte scale (1.0 in integer mode) of each 34-byte block */
            for (int64_t j = 0; j < n_out; j++)
                for (int64_t b = 0; b < k / 32; b++) {
                    int pat = rng_int(&r, 0, 3);
                    for (int e = 0; e < 32; e++) {
                        static const int8_t wv[3] = {-128, -127, 127};
                        int8_t v = pat < 3 ? wv[pat] : wv[rng_int(&r, 0, 2)];
                        W[j * wb + b * 34 + 2 + e] = (uint8_t)v;
                    }
                }
            for (int64_t i = 0; i < m; i++)
                for (int64_t b = 0; b < k / 32; b++) {
                    int pat = rng_int(&r, 0, 2);
                    for (int e = 0; e < 32; e++) {
                        int8_t v = pat == 0 ? -127 : pat == 1 ? 127 : (rng_int(&r, 0, 1) ? 127 : -127);
                        X[i * wb + b * 34 + 2 + e] = (uint8_t)v;
                    }
                }
        }
        cr_assert_eq(eng_pack_q8_0(W, n_out, k, P), 0);
        for (int64_t i = 0; i < m * ldy; i++) yref[i] = -12345.f;
        eng_gemm(ENG_SIMD_SCALAR, ENG_Q_Q8_0, W, k, X, m, yref, ldy, jb, je < n_out ? je : n_out);
        for (int l = ENG_SIMD_SCALAR; l <= (int)top; l++) {
            for (int64_t i = 0; i < m * ldy; i++) y[i] = ysplit[i] = y1[i] = -12345.f;
            eng_gemm_packed_q8_0((eng_simd_level)l, P, n_out, k, X, m, y, ldy, jb, je);
            for (int64_t i = 0; i < m; i++)
                eng_gemm_packed_q8_0((eng_simd_level)l, P, n_out, k, X + i * wb, 1, y1 + i * ldy, ldy, jb, je);
            /* the same rows in random pieces */
            for (int64_t a = jb; a < je;) {
                int64_t b = a + rng_int(&r, 1, 20);
                if (b > je) b = je;
                eng_gemm_packed_q8_0((eng_simd_level)l, P, n_out, k, X, m, ysplit, ldy, a, b);
                a = b;
            }
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < ldy; j++) {
                    float a = y[i * ldy + j], b = yref[i * ldy + j];
                    cr_assert_eq(a, ysplit[i * ldy + j], "%s packed split y[%lld][%lld] (iter %d)",
                                 eng_simd_name(l), (long long)i, (long long)j, iter);
                    cr_assert_eq(fbits(a), fbits(y1[i * ldy + j]), "%s packed m=1 y[%lld][%lld] %.9g vs batched %.9g "
                                 "(iter %d)", eng_simd_name(l), (long long)i, (long long)j, (double)y1[i * ldy + j],
                                 (double)a, iter);
                    if (l == ENG_SIMD_SCALAR || int_mode || j < jb || j >= je || j >= n_out) {
                        cr_assert_eq(a, b, "%s packed m %lld k %lld n_out %lld rows [%lld,%lld) y[%lld][%lld] "
                                     "%.9g vs %.9g (iter %d)", eng_simd_name(l), (long long)m, (long long)k,
                                     (long long)n_out, (long long)jb, (long long)je, (long long)i, (long long)j,
                                     (double)a, (double)b, iter);
                    } else {
                        float *wf = malloc((size_t)k * 4), *xf = malloc((size_t)k * 4);
                        double ex, as;
                        ref_dot(ENG_Q_Q8_0, k, W + j * wb, X + i * wb, wf, xf, &ex, &as);
                        free(wf);
                        free(xf);
                        cr_assert_leq(fabs((double)a - b), 1e-5 * as + 1e-30, "%s packed y[%lld][%lld] %.9g vs "
                                      "%.9g (iter %d)", eng_simd_name(l), (long long)i, (long long)j, (double)a,
                                      (double)b, iter);
                    }
                }
        }
        free(W); free(X); free(P); free(tmp); free(y); free(yref); free(ysplit); free(y1);
    }
}

Test(quant, quantize_levels_identical) {
    eng_simd_level top = eng_simd_detect();
    static const uint32_t types[] = {ENG_Q_Q8_0, ENG_Q_Q8_K, ENG_Q_Q8_1, ENG_Q_Q4_0, ENG_Q_F16};
    rng_t r = {4242};
    enum { N = 2048 };
    float *x = malloc(N * sizeof(float));
    uint8_t *a = malloc(N * 4 + 64), *b = malloc(N * 4 + 64);
    cr_assert(x && a && b);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const eng_qtype_info *t = eng_qtype_get(types[ti]);
        for (int iter = 0; iter < 200; iter++) {
            int64_t n = (int64_t)t->block_elems * rng_int(&r, 1, N / t->block_elems);
            float scale = ldexpf(1.f, rng_int(&r, -20, 10));
            for (int64_t i = 0; i < n; i++) x[i] = rng_normal(&r) * scale;
            if (iter % 5 == 1) /* ties and repeated maxima: small integers (+-max twice) */
                for (int64_t i = 0; i < n; i++) x[i] = (float)rng_int(&r, -254, 254) * 0.5f;
            if (iter % 5 == 2) memset(x, 0, (size_t)n * sizeof(float));
            size_t rb = eng_qtype_row_bytes(types[ti], n);
            cr_assert_eq(eng_quantize_row_l(ENG_SIMD_SCALAR, types[ti], x, a, n), 0);
            for (int l = ENG_SIMD_AVX2; l <= (int)top; l++) {
                memset(b, 0xAB, rb);
                cr_assert_eq(eng_quantize_row_l((eng_simd_level)l, types[ti], x, b, n), 0);
                cr_assert_eq(memcmp(a, b, rb), 0, "%s level %s n %lld differs from scalar (seed 4242 iter %d)",
                             t->name, eng_simd_name(l), (long long)n, iter);
            }
            memset(b, 0xAB, rb);
            cr_assert_eq(eng_quantize_row(types[ti], x, b, n), 0);
            cr_assert_eq(memcmp(a, b, rb), 0, "%s eng_quantize_row differs from scalar", t->name);
        }
    }
    free(x); free(a); free(b);
}

Test(quant, dequantize_levels_identical) {
    eng_simd_level top = eng_simd_detect();
    rng_t r = {777};
    for (size_t ti = 0; ti < N_WTYPES; ti++) {
        uint32_t type = k_weight_types[ti];
        const eng_qtype_info *t = eng_qtype_get(type);
        for (int iter = 0; iter < 50; iter++) {
            int64_t n = random_k(&r, type);
            size_t rb = eng_qtype_row_bytes(type, n);
            uint8_t *w = malloc(rb);
            float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
            cr_assert(w && a && b);
            random_wrow(&r, type, n, w, false);
            cr_assert_eq(eng_dequantize_row_l(ENG_SIMD_SCALAR, type, w, a, n), 0);
            for (int l = ENG_SIMD_AVX2; l <= (int)top; l++) {
                cr_assert_eq(eng_dequantize_row_l((eng_simd_level)l, type, w, b, n), 0);
                cr_assert_eq(memcmp(a, b, (size_t)n * 4), 0, "%s %s dequant differs (seed 777 iter %d)", t->name,
                             eng_simd_name(l), iter);
            }
            cr_assert_eq(eng_dequantize_row(type, w, b, n), 0);
            cr_assert_eq(memcmp(a, b, (size_t)n * 4), 0);
            free(w); free(a); free(b);
        }
    }
}

/* Batch invariance: an output does not depend on which other activation rows or weight rows were in the same
 * call (so a sequence decodes to the same bits alone or in a batch, and with any thread split). */
Test(quant, gemm_batch_and_split_invariant) {
    eng_simd_level top = eng_simd_detect();
    for (size_t ti = 0; ti < N_WTYPES; ti++) {
        uint32_t wtype = k_weight_types[ti];
        const eng_qtype_info *t = eng_qtype_get(wtype);
        uint64_t seed = 9000 + ti;
        rng_t r = {seed};
        for (int iter = 0; iter < 6; iter++) {
            int64_t k = random_k(&r, wtype), n_out = rng_int(&r, 1, 29), m = rng_int(&r, 1, 13);
            size_t wb = eng_qtype_row_bytes(wtype, k), xb = eng_qtype_row_bytes(t->dot_type, k);
            uint8_t *W = malloc(wb * (size_t)n_out), *X = malloc(xb * (size_t)m);
            float *tmp = malloc((size_t)k * 4), *y = malloc((size_t)(m * n_out) * 4), *y1 = malloc((size_t)n_out * 4);
            cr_assert(W && X && tmp && y && y1);
            for (int64_t j = 0; j < n_out; j++) random_wrow(&r, wtype, k, W + j * wb, false);
            for (int64_t i = 0; i < m; i++) random_xrow(&r, t->dot_type, k, X + i * xb, tmp, false);
            for (int l = ENG_SIMD_SCALAR; l <= (int)top; l++) {
                eng_gemm((eng_simd_level)l, wtype, W, k, X, m, y, n_out, 0, n_out);
                for (int64_t i = 0; i < m; i++) {
                    /* row i alone, weights split at a random point */
                    int64_t split = rng_int(&r, 0, (int)n_out);
                    eng_gemm((eng_simd_level)l, wtype, W, k, X + i * xb, 1, y1, n_out, 0, split);
                    eng_gemm((eng_simd_level)l, wtype, W, k, X + i * xb, 1, y1, n_out, split, n_out);
                    for (int64_t j = 0; j < n_out; j++)
                        cr_assert_eq(fbits(y1[j]), fbits(y[i * n_out + j]),
                                     "%s %s: row %lld col %lld differs alone vs batch of %lld (seed %llu iter %d)",
                                     t->name, eng_simd_name(l), (long long)i, (long long)j, (long long)m,
                                     (unsigned long long)seed, iter);
                    cr_assert_eq(fbits(eng_vec_dot((eng_simd_level)l, wtype, k, W, X + i * xb)), fbits(y[i * n_out]),
                                 "%s %s: vec_dot differs from gemm", t->name, eng_simd_name(l));
                }
            }
            free(W); free(X); free(tmp); free(y); free(y1);
        }
    }
}
