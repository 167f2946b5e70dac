/*
 * quant_impl.h: private to engine/quant*.c. Block layouts of the ggml formats (facts from the GGUF spec) and
 * the per-level kernel entry points.
 *
 * All block structs contain only 1-, 2- (and for Q8_K 4-) byte members, so their sizes equal the on-disk
 * sizes without packing pragmas (checked by static asserts in quant.c). GGUF rows are at least 2-byte
 * aligned (tensor data is 32-aligned and every block size is even); Q8_K rows (292 bytes) need 4.
 */
#ifndef KVSERVE_ENGINE_QUANT_IMPL_H
#define KVSERVE_ENGINE_QUANT_IMPL_H

#include <stdint.h>
#include <stdbool.h>

#include "engine/kernels/quant.h"

#define ENG_QK 32     /* elements per block of the 32-element formats */
#define ENG_QKK 256   /* elements per k-quant super-block */

typedef struct { uint16_t d; uint8_t qs[16]; } eng_blk_q4_0;                 /* x = (q - 8) * d */
typedef struct { uint16_t d, m; uint8_t qs[16]; } eng_blk_q4_1;              /* x = q * d + m */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } eng_blk_q5_0;  /* x = (q - 16) * d */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } eng_blk_q5_1; /* x = q * d + m */
typedef struct { uint16_t d; int8_t qs[32]; } eng_blk_q8_0;                  /* x = q * d */
typedef struct { uint16_t d, s; int8_t qs[32]; } eng_blk_q8_1;               /* s = d * sum(q) */
typedef struct { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; } eng_blk_q2_K;
typedef struct { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; } eng_blk_q3_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } eng_blk_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } eng_blk_q5_K;
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } eng_blk_q6_K;
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } eng_blk_q8_K;  /* bsums: sums of 16 qs */

/* The 6-bit scale j (0..7) and min of a Q4_K / Q5_K block's packed 12-byte scales. */
static inline void eng_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The 16 signed 6-bit scales (already minus 32) of a Q3_K block. */
static inline void eng_k3_scales(const uint8_t *packed, int8_t out[16]) {
    for (int j = 0; j < 16; j++) {
        int lo = (j < 8) ? (packed[j] & 0xF) : (packed[j - 8] >> 4);
        int hi = (packed[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        out[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

/* Scalar kernels (quant.c). */
float eng_vec_dot_scalar(uint32_t wtype, int64_t n, const void *w_row, const void *x_row);

/* SIMD kernels. Each returns true when it handled the call and false when the type has no kernel at that
 * level (the dispatcher then falls back to the next lower level). */
bool eng_vec_dot_avx2(uint32_t wtype, int64_t n, const void *w_row, const void *x_row, float *out);
bool eng_gemm_avx2(uint32_t wtype, const void *W, int64_t k, const void *xq, int64_t m, float *y, int64_t ldy,
                   int64_t j_begin, int64_t j_end);
/* Dequantizers bit-identical to the scalar ones (Q8_0, Q4_0); false for other types. Need AVX2 only. */
bool eng_dequantize_row_avx2(uint32_t type, const void *src, float *dst, int64_t n);
/* Activation quantizers, bit-identical to the scalar ones (Q8_0, Q8_K); false for other types. */
bool eng_quantize_row_avx2(uint32_t type, const float *src, void *dst, int64_t n);
bool eng_vec_dot_avx512(uint32_t wtype, int64_t n, const void *w_row, const void *x_row, float *out);
bool eng_gemm_avx512(uint32_t wtype, const void *W, int64_t k, const void *xq, int64_t m, float *y,
                     int64_t ldy, int64_t j_begin, int64_t j_end);

#endif /* KVSERVE_ENGINE_QUANT_IMPL_H */
