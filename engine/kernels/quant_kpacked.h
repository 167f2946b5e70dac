/*
 * quant_kpacked.h: weight matrices repacked 16 rows at a time for the AVX-512 VNNI and AVX2 kernels, for every
 * weight type that has a packed layout (internal to the engine module; prefix eng_wpack / eng_gemm_wpacked).
 *
 * One entry point for all packed types: Q8_0 (the layout of quant_packed.c, eng_pack_q8_0), and Q4_0, Q5_0, Q4_K,
 * Q5_K and Q6_K (the layouts of quant_kpacked.c, in the GGUF rows' bytes plus at most 3%), and MXFP4 (Q4_0's layout:
 * 18 bytes per row and block, GGUF's 17 plus 6%). The model repacks its
 * matrices once at load (eng_model_pack_cpu) and the forward pass calls eng_gemm_wpacked.
 *
 * Results. Q4_K, Q5_K and Q6_K: every level (scalar reference, AVX2, AVX-512) gives exactly the floats of the scalar
 * row kernel (eng_vec_dot at ENG_SIMD_SCALAR): the integer sums of a super-block are exact and the same float
 * operations follow in the same order (no fused multiply-add), so a row's result never depends on the batch
 * size, on the kernel (m = 1 or tiled) or on the split of rows across threads. Q8_0 / Q4_0 / Q5_0 / MXFP4: as
 * eng_gemm_packed_q8_0 (the scalar reference gives the row kernel's floats; the SIMD kernels, with the packed
 * Q8_0 kernels' float operations, agree with each other bit for bit at every m and differ from the scalar one
 * only in the rounding of their fused multiply-adds).
 */
#ifndef KVSERVE_ENGINE_QUANT_KPACKED_H
#define KVSERVE_ENGINE_QUANT_KPACKED_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kernels/quant.h"

/* Bytes of the packed form of a matrix [n_out][k] of type; 0 when type has no packed layout or the shape
 * cannot be packed (n_out < 1, k not a positive multiple of the type's block, k > ENG_PACK_MAX_K). */
size_t eng_wpack_bytes(uint32_t type, int64_t n_out, int64_t k);

/* A buffer for a packed matrix of bytes bytes (eng_wpack_bytes), to be released with free(): 64-byte aligned, and
 * when it is 2 MiB or more, 2 MiB aligned with transparent huge pages asked for over its whole 2 MiB pages (the tail
 * stays in small pages, so nothing beyond the matrix becomes resident). Decoding one sequence streams every matrix
 * once per token, and a plain two-thread read loop over such pages runs 3-11% faster here than over 4 KiB pages
 * (fewer TLB misses). The advice is only advice: without THP it changes nothing. NULL when bytes is 0 or the
 * allocation fails. */
void *eng_wpack_alloc(size_t bytes);

/* Packs the matrix W ([n_out][k] rows of type, as in GGUF) into dst, which must hold eng_wpack_bytes bytes and
 * be 64-byte aligned. Returns 0, or ENG_ERR_INVALID for a NULL pointer or a type / shape that cannot be packed. */
int eng_wpack(uint32_t type, const void *W, int64_t n_out, int64_t k, void *dst);

/* Row j (0 <= j < n_out) of the packed matrix P (eng_wpack with the same type, n_out and k) written back as its
 * GGUF bytes (eng_qtype_row_bytes(type, k) of them) into row: exactly the bytes of the row that was packed, so
 * eng_dequantize_row of it gives that row's values bit for bit (embedding lookups of a tied output matrix read the
 * packed copy this way). Returns 0, or ENG_ERR_INVALID for a NULL pointer, a type / shape that cannot be packed or
 * j out of range. */
int eng_wpack_row(uint32_t type, const void *P, int64_t n_out, int64_t k, int64_t j, void *row);

/* y[r * ldy + j] = dot(W row j, x row r) for r in [0, m) and j in [j_begin, min(j_end, n_out)), over the packed
 * matrix P (eng_wpack with the same type, n_out and k); x rows are quantized to the type's dot_type (Q8_K for
 * Q4_K / Q5_K / Q6_K, Q8_0 for Q8_0 / Q4_0 / Q5_0 / MXFP4) as for eng_gemm. l must not exceed eng_simd_detect().
 * Only rows in the range are written (ranges that share a group of 16 rows each compute it); nothing is written
 * for invalid arguments. */
void eng_gemm_wpacked(eng_simd_level l, uint32_t type, const void *P, int64_t n_out, int64_t k, const void *xq,
                      int64_t m, float *y, int64_t ldy, int64_t j_begin, int64_t j_end);

#endif /* KVSERVE_ENGINE_QUANT_KPACKED_H */
