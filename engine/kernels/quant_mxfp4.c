/*
 * quant_mxfp4.c: MXFP4's scalar (reference) kernels, the rows of the per-type table for GGML type 39 (see
 * quant_impl.h for the block layout and quant.h for the contracts).
 *
 * Dequantization: one product per value, (float)kvalue * eng_e8m0_half(e), the same float operation as ggml's,
 * so the floats are bit-identical to llama.cpp's.
 * Quantization (ggml's reference rule, which llama-quantize applies to MXFP4 tensors): per block of 32 values,
 * amax = max |x|; e = floor(log2f(amax)) - 2 + 127 (0 for an all-zero block), converted to 8 bits as x86-64's
 * float-to-integer conversion does; each value takes the first code whose |kvalue * eng_e8m0_half(e) - x| is
 * the smallest. log2f is the C library's, which llama.cpp's build calls too.
 */
#include <math.h>
#include <stdint.h>

#include "engine/kernels/quant_impl.h"

_Static_assert(sizeof(eng_blk_mxfp4) == 17, "mxfp4 block");

static inline float h2f(uint16_t h) { return eng_fp16_to_f32(h); }

void eng_deq_mxfp4(const void *src, float *y, int64_t nb) {
    const eng_blk_mxfp4 *b = src;
    for (int64_t i = 0; i < nb; i++, y += 32) {
        const float d = eng_e8m0_half(b[i].e);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)eng_mxfp4_kvalues[b[i].qs[j] & 0x0F] * d;
            y[j + 16] = (float)eng_mxfp4_kvalues[b[i].qs[j] >> 4] * d;
        }
    }
}

/* The code whose level (kvalue * d) is nearest to v; the first one on ties. */
static int nearest_code(float v, float d) {
    int best = 0;
    float best_err = fabsf((float)eng_mxfp4_kvalues[0] * d - v);
    for (int i = 1; i < 16; i++) {
        float err = fabsf((float)eng_mxfp4_kvalues[i] * d - v);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

/* The block's exponent code for amax > 0: floor(log2f(amax)) + 125 as a float, then its low 8 bits the way
 * x86-64 converts a float to an 8-bit integer (cvttss2si, then the low byte): defined for every amax, even a
 * subnormal one whose exponent would be negative, or an infinite one. */
static uint8_t exponent_code(float amax) {
    float v = floorf(log2f(amax)) - 2.f + 127.f;
    int32_t i = (v >= -2147483648.f && v < 2147483648.f) ? (int32_t)v : INT32_MIN;
    return (uint8_t)((uint32_t)i & 0xFF);
}

void eng_quant_mxfp4(const float *x, void *dst, int64_t nb) {
    eng_blk_mxfp4 *b = dst;
    for (int64_t i = 0; i < nb; i++, x += 32) {
        float amax = 0.f;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        const uint8_t e = amax > 0.f ? exponent_code(amax) : 0;
        const float d = eng_e8m0_half(e);
        b[i].e = e;
        for (int j = 0; j < 16; j++)
            b[i].qs[j] = (uint8_t)(nearest_code(x[j], d) | (nearest_code(x[j + 16], d) << 4));
    }
}

float eng_dot_mxfp4(int64_t nb, const void *wv, const void *xv) {
    const eng_blk_mxfp4 *w = wv;
    const eng_blk_q8_0 *x = xv;
    float s = 0.f;
    for (int64_t i = 0; i < nb; i++) {
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            isum += eng_mxfp4_kvalues[w[i].qs[j] & 0x0F] * x[i].qs[j];
            isum += eng_mxfp4_kvalues[w[i].qs[j] >> 4] * x[i].qs[j + 16];
        }
        s += (float)isum * (eng_e8m0_half(w[i].e) * h2f(x[i].d));
    }
    return s;
}
