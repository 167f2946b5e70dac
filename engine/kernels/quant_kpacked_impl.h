/*
 * quant_kpacked_impl.h: private to engine/quant_kpacked*.c. The packed Q4_K and Q6_K layouts (described in
 * quant_kpacked.c) and the per-level kernel entry points.
 */
#ifndef KVSERVE_ENGINE_QUANT_KPACKED_IMPL_H
#define KVSERVE_ENGINE_QUANT_KPACKED_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/kernels/quant_impl.h"

#define KP_ROWS 16 /* rows per group */

/* Q4_K / Q5_K (q5): one record per super-block (256 values) of a group of 16 rows, 2368 / 2880 bytes: per
 * sub-block j at KP45_SUB * j its 4 code lines (Q5_K: then its fifth-bit line), then the scales [8][16] and mins
 * [4][16][2] (min 2p + s of row i at 32 p + 2 i + s) as bytes, d [16] and dmin [16] as fp16. */
#define KP4_REC 2368
#define KP5_REC 2880
#define KP45_SUB(q5) ((q5) ? 320 : 256)
#define KP45_SC(q5) (8 * KP45_SUB(q5))
#define KP45_MN(q5) (KP45_SC(q5) + 128)
#define KP45_D(q5) (KP45_SC(q5) + 256)
#define KP45_DMIN(q5) (KP45_SC(q5) + 288)

/* Q6_K: one record per super-block of a group, 3392 bytes (53 lines). */
#define KP6_REC 3392
#define KP6_SUB 192 /* per sub-block g at 192 g: two lines of low 4 bits, one line of high 2 bits */
#define KP6_SC 3072 /* scales [16 sub-blocks][16 rows] int8 */
#define KP6_D 3328  /* d [16] float */

/* Q4_0 / Q5_0 / MXFP4: per 32-value block of a group, 4 code lines (Q5_0: and a line of fifth bits), codes of all
 * the blocks first, then the scales [nb][16] in 2-byte slots (fp16 d; MXFP4: the e8m0 exponent, then 0), the group
 * padded to 64 bytes. */
static inline int64_t kp0_code_bytes(uint32_t type) { return type == ENG_Q_Q5_0 ? 320 : 256; }
/* Whether type has the 32-value packed layout above. */
static inline bool kp0_type(uint32_t type) {
    return type == ENG_Q_Q4_0 || type == ENG_Q_Q5_0 || type == ENG_Q_MXFP4;
}
static inline int64_t kp0_group_bytes(uint32_t type, int64_t nb) { return (nb * (kp0_code_bytes(type) + 32) + 63) / 64 * 64; }

#define KP_MAX_SB (ENG_PACK_MAX_K / ENG_QKK) /* super-blocks per row at most */

/* Byte offset of block b's fields in a Q8_K activation row. */
#define KX_BYTES 292
#define KX_QS 4
#define KX_BSUMS 260

static inline int64_t kp_rec_bytes(uint32_t type) {
    return type == ENG_Q_Q4_K ? KP4_REC : type == ENG_Q_Q5_K ? KP5_REC : KP6_REC;
}

/* The rows of group g inside [jb, je) as a bit mask (bit i: row 16 g + i); the group must meet the range. */
static inline unsigned kp_group_rows(int64_t g, int64_t jb, int64_t je) {
    int64_t lo = g * KP_ROWS > jb ? g * KP_ROWS : jb, hi = g * KP_ROWS + KP_ROWS < je ? g * KP_ROWS + KP_ROWS : je;
    return ((1u << (hi - lo)) - 1u) << (lo - g * KP_ROWS);
}

/* m = 1 kernels: a group streams more weight bytes between two reads of the same activations than L1 holds (108 KB
 * for a Q6_K row of 8192 values), so those loads missed L1 and held the weight stream back; the kernels prefetch the
 * activations they read next into L1 (hint 3: all cache levels).
 * kp_prefetch_sb: one Q8_K activation block (xblk, KX_BYTES) and the 64-byte line of its prepared sums at xp.
 * kp_prefetch_q0: Q8_0 activation block b of row xq (34 bytes, two lines at most) and its prepared d_x and sum at
 * xd / xp + b * stride. */
static inline void kp_prefetch_sb(const uint8_t *xblk, const int32_t *xp) {
    for (int l = 0; l < KX_BYTES; l += 64) __builtin_prefetch(xblk + l, 0, 3);
    __builtin_prefetch(xp, 0, 3);
}
static inline void kp_prefetch_q0(const uint8_t *xq, const float *xd, const int32_t *xp, int64_t b, int stride) {
    __builtin_prefetch(xq + (size_t)b * sizeof(eng_blk_q8_0), 0, 3);
    __builtin_prefetch(xq + (size_t)b * sizeof(eng_blk_q8_0) + sizeof(eng_blk_q8_0) - 1, 0, 3);
    __builtin_prefetch(xd + b * stride, 0, 3);
    __builtin_prefetch(xp + b * stride, 0, 3);
}

/* The kernel table index of type (0..5: Q4_0, Q5_0, Q4_K, Q5_K, Q6_K, MXFP4; -1 for other types) and, for rows of
 * k values: *nb blocks (Q4_0 / Q5_0 / MXFP4) or super-blocks per row, *gbytes bytes per packed group and *xb bytes per
 * activation row. */
int eng_kp_shape(uint32_t type, int64_t k, int64_t *nb, size_t *gbytes, size_t *xb);

/* Prepares rn activation rows (xr, row stride xb) of nb blocks (Q4_0 / Q5_0: 32 values, Q8_0 rows) or
 * super-blocks (K-quants, Q8_K rows) for the SIMD kernels, maxc rows per block:
 *   Q4_0 / Q5_0 / MXFP4: xd[b * maxc + c] = d_x, xp[b * maxc + c] = -offset * sum(x) (offset 8 / 16 / 12: MXFP4's
 *   kernels multiply the code's doubled e2m1 value + 12, looked up, and start from -12 * sum(x));
 *   K-quants: xd[b * maxc + c] = d_x and KP_XP int32 at xp[(b * maxc + c) * KP_XP]: Q4_K / Q5_K the 4 pairs
 *   (B_2p, B_2p+1) of 32-value sums as int16 (B_j = bsums 2j + 2j+1); Q6_K the 16 values -32 * bsum_g, or with
 *   pairs16 the int16 pairs (-16 bsum_g, -16 bsum_g) (|16 bsum| <= 16 * 16 * 127 fits). */
#define KP_XP 16
/* MXFP4: a code's doubled e2m1 value + 12 (0..24), the unsigned byte the kernels multiply. */
#define KP_MX_OFFSET 12
void eng_kp_prep(uint32_t type, bool pairs16, const uint8_t *xr, size_t xb, int rn, int64_t nb, int maxc, float *xd,
                 int32_t *xp);

/* The SIMD kernels (eng_kp_gemm_avx2, eng_kp_gemm_avx512) are declared with the per-type table in quant_impl.h. */

#endif /* KVSERVE_ENGINE_QUANT_KPACKED_IMPL_H */
