/*
 * quant.h: tensor formats and CPU kernels (internal to the engine module; prefix eng_).
 *
 * Formats use ggml's type ids and block layouts (facts from the GGUF spec), so GGUF tensors are used in
 * place. Dequantization is exact: the float32 values equal llama.cpp's bit for bit.
 *
 * Kernels come in levels: a plain scalar version (the reference, always available), AVX2+FMA and AVX-512
 * (F/BW/VL, with VNNI where present), chosen at run time from the CPU's features. Tests force each level
 * and compare it with the scalar one. All kernels are pure functions of their arguments, safe to call from
 * any thread.
 */
#ifndef KVSERVE_ENGINE_QUANT_H
#define KVSERVE_ENGINE_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

/* ggml type ids, as stored in GGUF tensor infos. */
typedef enum eng_qtype {
    ENG_Q_F32 = 0, ENG_Q_F16 = 1, ENG_Q_Q4_0 = 2, ENG_Q_Q4_1 = 3, ENG_Q_Q5_0 = 6, ENG_Q_Q5_1 = 7,
    ENG_Q_Q8_0 = 8, ENG_Q_Q8_1 = 9, ENG_Q_Q2_K = 10, ENG_Q_Q3_K = 11, ENG_Q_Q4_K = 12, ENG_Q_Q5_K = 13,
    ENG_Q_Q6_K = 14, ENG_Q_Q8_K = 15, ENG_Q_BF16 = 30, ENG_Q_MXFP4 = 39,
    ENG_Q_COUNT = 40,
} eng_qtype;

typedef struct eng_qtype_info {
    const char *name;     /* "f32", "q8_0", ... (NULL for ids this engine does not know) */
    int32_t block_elems;  /* values per block (1 for f32/f16/bf16, 32, or 256 for k-quants) */
    int32_t block_bytes;  /* bytes per block */
    bool supported;       /* dequantize + dot available */
    eng_qtype dot_type;   /* the format activations are quantized to for eng_gemm with this weight type */
} eng_qtype_info;

/* Info for a type id; returns NULL for an unknown id (>= ENG_Q_COUNT or a gap). */
const eng_qtype_info *eng_qtype_get(uint32_t type);
/* Bytes of n values of type (n must be a multiple of block_elems; returns 0 otherwise or for bad types). */
size_t eng_qtype_row_bytes(uint32_t type, int64_t n);

/* fp16 / bf16 conversions (round to nearest even; exact for the reverse direction). */
float eng_fp16_to_f32(uint16_t h);
uint16_t eng_f32_to_fp16(float f);
float eng_bf16_to_f32(uint16_t h);
uint16_t eng_f32_to_bf16(float f);

/* Dequantizes n values (a multiple of the block size) of src in type to dst. Exact (bit-identical to
 * llama.cpp); Q8_0 and Q4_0 use AVX2 when the CPU has it (same float operations, same bits).
 * Returns 0 or ENG_ERR_UNSUPPORTED / ENG_ERR_INVALID. */
int eng_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);

/* Quantizes n values to type: supported for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q8_K and MXFP4
 * (ggml's reference rounding rules; Q8_0/Q8_1/Q8_K codes are always in [-127, 127], and Q8_K's bsums are
 * the sums of its 16-element groups, which the k-quant dot kernels rely on). K-quant weight types (Q2_K..Q6_K)
 * have no quantizer: ENG_ERR_UNSUPPORTED. Inputs must be finite. Returns 0 or ENG_ERR_UNSUPPORTED /
 * ENG_ERR_INVALID. */
int eng_quantize_row(uint32_t type, const float *src, void *dst, int64_t n);

/* ---- weight quantization (quantize.c) ------------------------------------------------------------------------
 * The rounding rules of ggml's reference quantizers, which llama.cpp's llama-quantize runs when it has no
 * importance matrix: the same input floats give the same bytes, block for block (Q4_K/Q5_K fit a scale and a
 * min per 32 values with the weighted least-squares search, Q6_K a scale per 16 values with the 19-step
 * search; the super-block scales are then quantized to 6 or 8 bits). Q8_0 rounds half away from zero here,
 * unlike eng_quantize_row's activation Q8_0 (half to even), because llama-quantize does. Pure functions,
 * safe from any thread; rows are independent, so any split of a matrix across threads gives the same bytes. */

/* Whether eng_quantize_weights handles type: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4
 * (MXFP4: the shared exponent floor(log2(max |x|)) - 2, each value the nearest of the 16 e2m1 levels times it,
 * the first level on ties, as ggml's reference quantizer). */
bool eng_quantize_weights_supported(uint32_t type);
/* Quantizes nrows rows of n_per_row values (src, row r at src + r * n_per_row) to type, rows packed one after
 * the other in dst (eng_qtype_row_bytes(type, n_per_row) bytes each). n_per_row must be a positive multiple of
 * the type's block size. Inputs should be finite (llama-quantize refuses others; here they give unspecified
 * bytes, never a crash); a block too large for the fp16 scale gets an infinite scale, which
 * eng_check_row_data reports. Returns 0, ENG_ERR_UNSUPPORTED (type) or ENG_ERR_INVALID (shape, NULL). */
int eng_quantize_weights(uint32_t type, const float *src, void *dst, int64_t nrows, int64_t n_per_row);
/* Checks n values of type in data (n a multiple of the block size) as llama.cpp's loader does: no NaN or
 * infinity among F32/F16/BF16 values, nor among the fp16 scales (d, and dmin/m where the format has one) of
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K blocks (Q8_K's float d too), nor an MXFP4 exponent of 0xFF (NaN).
 * Returns 0, ENG_ERR_FORMAT (the index of the first bad value, or of the first value of the bad block, goes to
 * *bad_at when not NULL), ENG_ERR_UNSUPPORTED (a type without a check) or ENG_ERR_INVALID. */
int eng_check_row_data(uint32_t type, const void *data, int64_t n, int64_t *bad_at);

/* ---- kernel levels ------------------------------------------------------------------------------------- */
typedef enum { ENG_SIMD_SCALAR = 0, ENG_SIMD_AVX2 = 1, ENG_SIMD_AVX512 = 2 } eng_simd_level;

/* eng_quantize_row at a given kernel level (l must not exceed eng_simd_detect()). Every level writes the same
 * bytes as the scalar one for finite inputs (Q8_0 and Q8_K have AVX2 versions; other types use scalar).
 * eng_quantize_row itself uses the best level the CPU has. (Added by the quant module.) */
int eng_quantize_row_l(eng_simd_level l, uint32_t type, const float *src, void *dst, int64_t n);
/* eng_dequantize_row at a given level (l must not exceed eng_simd_detect()); same bits at every level.
 * (Added by the quant module.) */
int eng_dequantize_row_l(eng_simd_level l, uint32_t type, const void *src, float *dst, int64_t n);

/* The best level this CPU supports (cpuid + OS support for the registers, via xgetbv). Executes cpuid:
 * call once and keep the result. Test hook: the environment variable KVSERVE_SIMD_MAX=avx2 (or scalar)
 * caps the result, so that the engine (gemm and attention kernels, weight packing) and the tests run as on
 * a CPU with only that level; other values, or a level above the CPU's, change nothing. */
eng_simd_level eng_simd_detect(void);
const char *eng_simd_name(eng_simd_level l);

/* Dot product of one weight row (n values of wtype) with one activation row already quantized to
 * eng_qtype_get(wtype)->dot_type, which is: F32 for F32/F16/BF16 weights; Q8_0 for Q4_0, Q5_0, Q8_0, MXFP4;
 * Q8_1 for Q4_1, Q5_1; Q8_K for Q2_K..Q6_K and Q8_K. Activation rows must come from eng_quantize_row (the
 * AVX2 kernels assume int8 codes in [-127, 127] and consistent Q8_K bsums).
 * Levels: l must not exceed eng_simd_detect() (a higher level executes unsupported instructions); a type
 * with no kernel at level l runs the next lower level's. The integer part of every block is exact at every
 * level; levels differ from scalar only in the order of float accumulation across blocks (tests allow
 * 1e-5 * sum |w_i * x_i|). ENG_SIMD_AVX512 requires AVX-512 F/BW/VL/DQ and VNNI. */
float eng_vec_dot(eng_simd_level l, uint32_t wtype, int64_t n, const void *w_row, const void *x_row);

/* Matrix product on a row range: for every activation row r in [0, m) and weight row j in
 * [j_begin, j_end): y[r * ldy + j] = dot(W row j, x row r). W is [n_out][k] in wtype (row j at
 * W + j * row_bytes(wtype, k)); x is m rows of k values quantized to dot_type (row r at
 * xq + r * row_bytes(dot_type, k)). Threads split [0, n_out) into ranges (any split; results do not depend
 * on it). Only y[r * ldy + j] for j in the range is written; nothing is written for an unsupported wtype.
 * Q8_0 / Q4_0 / Q5_0 / MXFP4 weights use register tiles of several weight x activation rows (AVX2, AVX-512); the
 * other types compute one vec_dot per output. */
void eng_gemm(eng_simd_level l, uint32_t wtype, const void *W, int64_t k, const void *xq, int64_t m,
              float *y, int64_t ldy, int64_t j_begin, int64_t j_end);

/* ---- Q8_0 matrices repacked for the AVX-512 VNNI and AVX2 kernels (quant_packed.c) -------------------------
 * Rows are interleaved 16 at a time so that one vpdpbusd lane accumulates one row's block: see quant_packed.c
 * for the layout. A packed matrix holds the same information as the Q8_0 rows (codes and fp16 scales) in
 * the same number of bytes per 16 rows (plus padding to 64 bytes per group and to 16 rows). */
#define ENG_PACK_MAX_K 16384 /* longest row that can be packed (the kernel keeps per-block activation sums) */
/* Bytes of one group of 16 packed rows of k values: (k / 32) * 544, rounded up to a multiple of 64. */
#define ENG_PACK_GROUP_BYTES(k) ((size_t)((((k) / 32) * 544 + 63) / 64 * 64))

/* Bytes of the packed form of a Q8_0 matrix [n_out][k]; 0 when it cannot be packed (n_out < 1, k not a
 * positive multiple of 32, or k > ENG_PACK_MAX_K). */
size_t eng_packed_q8_0_bytes(int64_t n_out, int64_t k);
/* Packs the Q8_0 matrix W ([n_out][k], rows of k / 32 blocks) into dst, which must hold
 * eng_packed_q8_0_bytes(n_out, k) bytes and be 64-byte aligned. Returns 0, or ENG_ERR_INVALID for a NULL
 * pointer or a shape that cannot be packed. */
int eng_pack_q8_0(const void *W, int64_t n_out, int64_t k, void *dst);
/* Row j (0 <= j < n_out) of a packed Q8_0 matrix P (eng_pack_q8_0 with the same n_out and k) written back as its
 * GGUF bytes (k / 32 Q8_0 blocks) into row: the same bytes as the row that was packed. Returns 0, or
 * ENG_ERR_INVALID for a NULL pointer, a shape that cannot be packed or j out of range. */
int eng_packed_q8_0_row(const void *P, int64_t n_out, int64_t k, int64_t j, void *row);
/* eng_gemm over a packed matrix P (from eng_pack_q8_0 with the same n_out and k): for r in [0, m) and
 * j in [j_begin, min(j_end, n_out)): y[r * ldy + j] = dot(W row j, x row r), x rows in Q8_0 as for eng_gemm.
 * Levels ENG_SIMD_AVX512 (VNNI) and ENG_SIMD_AVX2 run SIMD kernels whose integer block dots are exact (results
 * differ from the scalar ones only in the order of float accumulation); ENG_SIMD_SCALAR runs the scalar
 * reference, which gives eng_vec_dot's scalar floats exactly. The two SIMD kernels give identical floats (same
 * float operations in the same order), so ENG_SIMD_AVX512 runs the AVX2 one for m = 1, where it streams the
 * weights faster (it reads half of every line first; decode of one sequence measured 8-18% faster).
 * Any split of the rows across threads gives the same results (ranges that share a group of 16 rows each
 * compute it and write only their own rows). Nothing is written for invalid arguments. */
void eng_gemm_packed_q8_0(eng_simd_level l, const void *P, int64_t n_out, int64_t k, const void *xq, int64_t m,
                          float *y, int64_t ldy, int64_t j_begin, int64_t j_end);

#endif /* KVSERVE_ENGINE_QUANT_H */
