/*
 * quant_impl.h: private to engine/quant*.c. Block layouts of the ggml formats (facts from the GGUF spec) and
 * the per-type table of kernels.
 *
 * All block structs contain only 1-, 2- (and for Q8_K 4-) byte members, so their sizes equal the on-disk
 * sizes without packing pragmas (checked by static asserts in quant.c). GGUF rows are at least 2-byte
 * aligned (tensor data is 32-aligned and every block size is even); Q8_K rows (292 bytes) need 4.
 */
#ifndef KVSERVE_ENGINE_QUANT_IMPL_H
#define KVSERVE_ENGINE_QUANT_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>
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
/* MXFP4 (OCP microscaling, as ggml stores it): e is an e8m0 exponent (2^(e - 127); 0xFF is NaN and refused), qs
 * the 32 e2m1 codes, element j < 16 in the low nibble of qs[j], element j + 16 in its high nibble.
 * x = eng_mxfp4_kvalues[code] * eng_e8m0_half(e): the table holds twice the e2m1 values (integers), the scale
 * half the exponent's value, so the product is the e2m1 value times 2^(e - 127). 17 bytes: MXFP4 rows may be
 * at odd addresses (kernels read them bytewise). */
typedef struct { uint8_t e; uint8_t qs[16]; } eng_blk_mxfp4;

/* Twice the e2m1 values of the 16 codes (bit 3 the sign; the format's facts). */
static const int8_t eng_mxfp4_kvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e - 128) as a float (half of the e8m0 value; e = 0 and 1 give the subnormals 2^-128 and 2^-127), built from
 * its bits exactly as ggml does (e = 0xFF gives 2^127, never NaN: the loader refuses that code). */
static inline float eng_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? (uint32_t)0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* A float converted to int8 the way the reference quantizers' casts run on x86-64 (cvttss2si, then the low
 * byte): truncation toward zero, and NaN or values outside int32 give INT32_MIN's low byte (0). Defined for
 * every input, so a degenerate block (an infinite inverse scale) gives the same bytes as llama.cpp instead
 * of undefined behaviour. */
static inline int eng_trunc_i8(float v) {
    int32_t i = (v >= -2147483648.f && v < 2147483648.f) ? (int32_t)v : INT32_MIN;
    return (int)(int8_t)(uint8_t)((uint32_t)i & 0xFF);
}

/* max |x| over n values (to *amax_out) and the signed value that has it (the first one on ties) */
static inline float eng_absmax_signed(const float *x, int n, float *amax_out) {
    float amax = 0.f, mx = 0.f;
    for (int j = 0; j < n; j++) {
        float a = fabsf(x[j]);
        if (a > amax) {
            amax = a;
            mx = x[j];
        }
    }
    *amax_out = amax;
    return mx;
}

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

/* ---- the per-type table ----------------------------------------------------------------------------------
 * Every per-type choice of quant*.c goes through one table, as ggml keeps one table of type traits: quant.c's
 * row of each type (eng_qtraits_get) holds its layout (eng_qtype_info), its scalar kernels, its weight
 * quantizer (quantize.c) and where its scales are; each SIMD level exports the kernels it has per type
 * (eng_qlevel_avx2, eng_qlevel_avx512; a NULL entry means "use the next lower level"). Kernels count in
 * blocks: nb = n / block_elems (values for F32 / F16 / BF16). */
typedef void (*eng_deq_fn)(const void *src, float *dst, int64_t nb);
typedef void (*eng_quant_fn)(const float *src, void *dst, int64_t nb);
/* One weight row with one activation row in the type's dot_type. */
typedef float (*eng_dot_fn)(int64_t nb, const void *w_row, const void *x_row);
/* An RM x RN register tile of eng_gemm: y[c * ldy + r] = dot(W row r, X row c) for r < RM, c < RN. */
typedef void (*eng_tile_fn)(const uint8_t *W, size_t wb, const uint8_t *X, size_t xb, int64_t nb, float *y,
                            int64_t ldy);

/* eng_gemm_wpacked's kernel over a packed matrix (quant_kpacked.h) for rows [jb, je) (already clipped to
 * n_out); returns false when it does not handle the type. */
typedef bool (*eng_packed_gemm_fn)(uint32_t type, const uint8_t *P, int64_t k, const uint8_t *xq, int64_t m,
                                   float *y, int64_t ldy, int64_t jb, int64_t je);

/* A type's kernels at one level (NULL: none at this level). */
typedef struct eng_qkernels {
    eng_deq_fn dequantize;         /* the same bits as the scalar one */
    eng_quant_fn quantize;         /* activations: the same bytes as the scalar one */
    eng_dot_fn vec_dot;
    const eng_tile_fn (*tiles)[4]; /* [RM - 1][RN - 1] for RM <= tile_m, RN <= tile_n: eng_gemm uses tiles */
    eng_packed_gemm_fn packed_gemm; /* the packed layout of Q4_0, Q5_0, MXFP4, Q4_K, Q5_K, Q6_K (quant_kpacked*.c);
                                     * NULL at the scalar level: eng_gemm_wpacked then runs quant_kpacked.c's
                                     * reference */
} eng_qkernels;

/* One SIMD level's kernels (quant_avx2.c, quant_avx512.c; all NULL on other architectures). */
typedef struct eng_qlevel {
    int tile_m, tile_n;            /* the tile shape of this level's gemm */
    eng_qkernels k[ENG_Q_COUNT];
} eng_qlevel;
extern const eng_qlevel eng_qlevel_avx2, eng_qlevel_avx512;

/* A block field that llama.cpp's loader requires finite (eng_check_row_data). */
typedef enum { ENG_QF_NONE = 0, ENG_QF_F16, ENG_QF_BF16, ENG_QF_F32, ENG_QF_E8M0 } eng_qfield_kind;
typedef struct eng_qfield {
    uint8_t kind;                  /* eng_qfield_kind */
    uint8_t off;                   /* byte offset in the block */
} eng_qfield;

/* A type's row of the table (quant.c). */
typedef struct eng_qtraits {
    eng_qtype_info info;
    eng_qkernels scalar;           /* the reference kernels (dequantize exact, quantize with ggml's rules) */
    eng_quant_fn quantize_weights; /* llama-quantize's rounding rules (quantize.c), or NULL */
    eng_qfield finite[2];          /* the fields eng_check_row_data checks (ENG_QF_NONE: unused) */
} eng_qtraits;

/* The table's row of type, or NULL for an unknown id. */
const eng_qtraits *eng_qtraits_get(uint32_t type);
/* The kernels of a known type (eng_qtraits_get not NULL) at level l: the level's table, the scalar ones in
 * quant.c's. */
const eng_qkernels *eng_qkernels_at(eng_simd_level l, uint32_t type);

/* The packed kernels of quant_kpacked_avx2.c and quant_kpacked_avx512.c (x86 only; see eng_packed_gemm_fn). */
bool eng_kp_gemm_avx512(uint32_t type, const uint8_t *P, int64_t k, const uint8_t *xq, int64_t m, float *y,
                        int64_t ldy, int64_t jb, int64_t je);
bool eng_kp_gemm_avx2(uint32_t type, const uint8_t *P, int64_t k, const uint8_t *xq, int64_t m, float *y,
                      int64_t ldy, int64_t jb, int64_t je);

/* The weight quantizers of quantize.c with their own rounding rules (the others are the scalar quantize). */
void eng_weights_q8_0(const float *x, void *dst, int64_t nb);
void eng_weights_q4_K(const float *x, void *dst, int64_t nb);
void eng_weights_q5_K(const float *x, void *dst, int64_t nb);
void eng_weights_q6_K(const float *x, void *dst, int64_t nb);

/* MXFP4's scalar kernels (quant_mxfp4.c): exact dequantization, ggml's reference quantizer (also the weight
 * quantizer: llama-quantize runs the same one), and the dot product with a Q8_0 activation row (per block the
 * exact integer sum of kvalue * q, then (float)sum * (eng_e8m0_half(e) * d_x), summed over blocks in float). */
void eng_deq_mxfp4(const void *src, float *dst, int64_t nb);
void eng_quant_mxfp4(const float *src, void *dst, int64_t nb);
float eng_dot_mxfp4(int64_t nb, const void *w_row, const void *x_row);

#endif /* KVSERVE_ENGINE_QUANT_IMPL_H */
