/*
 * quant_packed.c: Q8_0 weight matrices repacked 16 rows at a time for the AVX-512 VNNI and AVX2 kernels (see
 * quant.h for the contract).
 *
 * Layout. Rows are taken 16 at a time (a group; rows past n_out are zero). A group of a matrix with nb =
 * k / 32 blocks per row is ENG_PACK_GROUP_BYTES(k) bytes, 64-byte aligned:
 *   codes  [nb][8][16][4] uint8: for block b, quad t (values 4t..4t+3 of the block) and row i, the four
 *                                codes (q + 128) of row i: one 64-byte line per (b, t) covers all 16 rows;
 *   scales [nb][16] uint16:      the fp16 scale d of block b of each row;
 *   padding to a multiple of 64 bytes.
 * Kernel. For one block b and activation row x, vpdpbusd multiplies the 64-byte line of quad t by x's quad t
 * broadcast to all 16 lanes, so after the 8 quads lane i holds sum((q_i + 128) * x) for row i: every lane is
 * one whole block's integer dot of its own row, with no horizontal sums. Starting the lanes at
 * -128 * sum(x) (computed once per activation block) makes that exactly sum(q_i * x). One conversion to
 * float and one fused multiply-add by d_w[i] * d_x finish the block for all 16 rows. Up to 8 activation rows
 * share each weight line load. The AVX2 kernel reads the same layout with 16-bit products (see its section).
 */
#include <string.h>

#include "engine/engine.h"
#include "engine/kernels/quant_impl.h"

#define GROUP 16

size_t eng_packed_q8_0_bytes(int64_t n_out, int64_t k) {
    if (n_out < 1 || k < ENG_QK || k % ENG_QK != 0 || k > ENG_PACK_MAX_K) return 0;
    int64_t groups = (n_out + GROUP - 1) / GROUP;
    return (size_t)groups * ENG_PACK_GROUP_BYTES(k);
}

int eng_pack_q8_0(const void *W, int64_t n_out, int64_t k, void *dst) {
    size_t total = eng_packed_q8_0_bytes(n_out, k);
    if (!W || !dst || total == 0) return ENG_ERR_INVALID;
    const int64_t nb = k / ENG_QK, groups = (n_out + GROUP - 1) / GROUP;
    const size_t gbytes = ENG_PACK_GROUP_BYTES(k), rb = (size_t)nb * sizeof(eng_blk_q8_0);
    memset(dst, 0, total);
    for (int64_t g = 0; g < groups; g++) {
        uint8_t *codes = (uint8_t *)dst + (size_t)g * gbytes;
        uint16_t *scales = (uint16_t *)(codes + (size_t)nb * 512);
        for (int i = 0; i < GROUP; i++) {
            int64_t row = g * GROUP + i;
            if (row >= n_out) break;
            const eng_blk_q8_0 *blk = (const eng_blk_q8_0 *)((const uint8_t *)W + (size_t)row * rb);
            for (int64_t b = 0; b < nb; b++) {
                scales[b * GROUP + i] = blk[b].d;
                for (int t = 0; t < 8; t++)
                    for (int e = 0; e < 4; e++)
                        codes[(size_t)b * 512 + (size_t)t * 64 + (size_t)i * 4 + (size_t)e] =
                            (uint8_t)(blk[b].qs[4 * t + e] + 128);
            }
        }
    }
    return 0;
}

int eng_packed_q8_0_row(const void *P, int64_t n_out, int64_t k, int64_t j, void *row) {
    if (!P || !row || j < 0 || j >= n_out || eng_packed_q8_0_bytes(n_out, k) == 0) return ENG_ERR_INVALID;
    const int64_t nb = k / ENG_QK;
    const uint8_t *codes = (const uint8_t *)P + (size_t)(j / GROUP) * ENG_PACK_GROUP_BYTES(k);
    const uint8_t *scales = codes + (size_t)nb * 512;
    const int i = (int)(j % GROUP);
    eng_blk_q8_0 *blk = row;
    for (int64_t b = 0; b < nb; b++) {
        memcpy(&blk[b].d, scales + (size_t)(b * GROUP + i) * 2, 2);
        for (int t = 0; t < 8; t++)
            for (int e = 0; e < 4; e++)
                blk[b].qs[4 * t + e] = (int8_t)(codes[(size_t)b * 512 + (size_t)t * 64 + (size_t)i * 4 + (size_t)e] - 128);
    }
    return 0;
}

/* The reference: the scalar Q8_0 dot of each row, read from the packed layout (same operations in the
 * same order as eng_vec_dot at ENG_SIMD_SCALAR, so the same floats). */
static void gemm_packed_scalar(const uint8_t *P, int64_t n_out, int64_t k, const uint8_t *xq, int64_t m, float *y,
                               int64_t ldy, int64_t jb, int64_t je) {
    const int64_t nb = k / ENG_QK;
    const size_t gbytes = ENG_PACK_GROUP_BYTES(k), xb = (size_t)nb * sizeof(eng_blk_q8_0);
    for (int64_t j = jb; j < je && j < n_out; j++) {
        const uint8_t *codes = P + (size_t)(j / GROUP) * gbytes;
        const uint16_t *scales = (const uint16_t *)(codes + (size_t)nb * 512);
        const int i = (int)(j % GROUP);
        for (int64_t r = 0; r < m; r++) {
            const eng_blk_q8_0 *x = (const eng_blk_q8_0 *)(xq + (size_t)r * xb);
            float s = 0.f;
            for (int64_t b = 0; b < nb; b++) {
                int isum = 0;
                for (int t = 0; t < 8; t++)
                    for (int e = 0; e < 4; e++)
                        isum += ((int)codes[(size_t)b * 512 + (size_t)t * 64 + (size_t)i * 4 + (size_t)e] - 128) *
                                x[b].qs[4 * t + e];
                s += (float)isum * (eng_fp16_to_f32(scales[b * GROUP + i]) * eng_fp16_to_f32(x[b].d));
            }
            y[r * ldy + j] = s;
        }
    }
}

/* The rows of group g inside [jb, je) as a bit mask (bit i: row 16 g + i); the group must meet the range. */
static inline unsigned group_rows(int64_t g, int64_t jb, int64_t je) {
    int64_t lo = g * GROUP > jb ? g * GROUP : jb, hi = g * GROUP + GROUP < je ? g * GROUP + GROUP : je;
    return ((1u << (hi - lo)) - 1u) << (lo - g * GROUP);
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
/* Fully unrolls a loop over the activation rows (or quads) of a call, so that the accumulator arrays live in
 * registers (clang keeps them in memory with a GCC unroll count above the trip count). */
#ifdef __clang__
#define UNROLL_RN _Pragma("clang loop unroll(full)")
#else
#define UNROLL_RN _Pragma("GCC unroll 8")
#endif
#define MAXC 8      /* activation rows per kernel call */
/* No software prefetch of the weights: the hardware prefetcher already streams the groups (prefetching 1-4 KiB
 * ahead measured 5-30% slower in bench/quant_bench.c); m = 1 prefetches the activations (gemv_packed_avx512). */
#define GCHUNK 16   /* groups computed per preparation of the activation rows (their weights stay in L2) */

/* Per activation block and row: d_x as float and -128 * sum(q_x). */
TGT static void prep_x(const uint8_t *xq, size_t xb, int rn, int64_t nb, float *xd, int32_t *xc) {
    const __m256i ones = _mm256_set1_epi8(1);
    for (int c = 0; c < rn; c++) {
        const eng_blk_q8_0 *x = (const eng_blk_q8_0 *)(xq + (size_t)c * xb);
        for (int64_t b = 0; b < nb; b++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)x[b].qs);
            /* sum(q) = sum((q + 128) * 1) - 4096: vpdpbusd wants its unsigned operand first */
            __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)), ones);
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
            xc[b * MAXC + c] = -128 * (_mm_cvtsi128_si32(h) - 4096);
            xd[b * MAXC + c] = _cvtsh_ss(x[b].d);
        }
    }
}

static inline __attribute__((always_inline)) TGT int32_t load_quad(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* One group (16 weight rows) times RN activation rows: y[c * ldy + i] for the rows i set in mask. */
static inline __attribute__((always_inline)) TGT void group_kernel(const int RN, const uint8_t *codes, int64_t nb,
                                                                   const uint8_t *xq, size_t xb, const float *xd,
                                                                   const int32_t *xc, float *y, int64_t ldy,
                                                                   __mmask16 mask) {
    /* Two integer chains per row when there are few rows, so that vpdpbusd's latency is covered. */
    const bool two = RN <= 4;
    const uint16_t *scales = (const uint16_t *)(codes + (size_t)nb * 512);
    __m512 acc[MAXC];
UNROLL_RN
    for (int c = 0; c < RN; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *line = codes + (size_t)b * 512;
        __m512i a0[MAXC], a1[MAXC];
UNROLL_RN
        for (int c = 0; c < RN; c++) {
            a0[c] = _mm512_set1_epi32(xc[b * MAXC + c]);
            a1[c] = _mm512_setzero_si512();
        }
UNROLL_RN
        for (int t = 0; t < 8; t++) {
            __m512i w = _mm512_load_si512((const void *)(line + t * 64));
UNROLL_RN
            for (int c = 0; c < RN; c++) {
                __m512i xv = _mm512_set1_epi32(load_quad(xq + (size_t)c * xb + (size_t)b * 34 + 2 + 4 * t));
                if (two && (t & 1)) a1[c] = _mm512_dpbusd_epi32(a1[c], w, xv);
                else a0[c] = _mm512_dpbusd_epi32(a0[c], w, xv);
            }
        }
        __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(scales + b * GROUP)));
UNROLL_RN
        for (int c = 0; c < RN; c++) {
            __m512i s = two ? _mm512_add_epi32(a0[c], a1[c]) : a0[c];
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(xd[b * MAXC + c])), acc[c]);
        }
    }
UNROLL_RN
    for (int c = 0; c < RN; c++) _mm512_mask_storeu_ps(y + c * ldy, mask, acc[c]);
}

typedef void (*group_fn)(const uint8_t *, int64_t, const uint8_t *, size_t, const float *, const int32_t *, float *,
                         int64_t, __mmask16);
#define GROUP_FN(RN)                                                                                             \
    TGT static void group_##RN(const uint8_t *codes, int64_t nb, const uint8_t *xq, size_t xb, const float *xd, \
                               const int32_t *xc, float *y, int64_t ldy, __mmask16 mask) {                      \
        group_kernel(RN, codes, nb, xq, xb, xd, xc, y, ldy, mask);                                              \
    }
GROUP_FN(1)
GROUP_FN(2)
GROUP_FN(3)
GROUP_FN(4)
GROUP_FN(5)
GROUP_FN(6)
GROUP_FN(7)
GROUP_FN(8)
static const group_fn k_group[MAXC] = {group_1, group_2, group_3, group_4, group_5, group_6, group_7, group_8};

/* One activation row (m = 1): group_kernel's operations with RN = 1, in the same order (so the same floats bit for
 * bit), one group after another so that a thread reads one stream, with d_x and -128 * sum(x) per block side by
 * side (xdc[2b], xdc[2b + 1]) and the activations a few blocks ahead prefetched into L1: a group streams 544
 * bytes per block, 35-139 KB between two reads of the same activations on bench-1b's shapes, more than L1
 * holds, and activation loads that missed L1 held the stream back. kvquant-bench q8_0 gemv-shapes, one thread:
 * 17 GB/s (this level's m = 1 then ran the AVX2 kernel) -> 24.5 (k = 2048) and 29.6 (k = 8192); rows under 1024
 * values keep the AVX2 kernel (see eng_gemm_packed_q8_0). */
TGT static void gemv_packed_avx512(const uint8_t *codes, int64_t nb, const uint8_t *xq, const int32_t *xdc, float *y,
                                   __mmask16 mask) {
    enum { AHEAD = 4 }; /* blocks */
    const uint16_t *scales = (const uint16_t *)(codes + (size_t)nb * 512);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (b + AHEAD < nb) {
            _mm_prefetch((const char *)(xq + (size_t)(b + AHEAD) * 34), _MM_HINT_T0);
            _mm_prefetch((const char *)(xq + (size_t)(b + AHEAD) * 34 + 33), _MM_HINT_T0);
            _mm_prefetch((const char *)(xdc + 2 * (b + 2 * AHEAD)), _MM_HINT_T0);
        }
        const uint8_t *line = codes + (size_t)b * 512, *xb = xq + (size_t)b * 34 + 2;
        __m512i a0 = _mm512_set1_epi32(xdc[2 * b + 1]), a1 = _mm512_setzero_si512();
UNROLL_RN
        for (int t = 0; t < 8; t++) {
            __m512i w = _mm512_load_si512((const void *)(line + t * 64)), xv = _mm512_set1_epi32(load_quad(xb + 4 * t));
            if (t & 1) a1 = _mm512_dpbusd_epi32(a1, w, xv);
            else a0 = _mm512_dpbusd_epi32(a0, w, xv);
        }
        __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(scales + b * GROUP)));
        float xd;
        memcpy(&xd, &xdc[2 * b], 4);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)), _mm512_mul_ps(dw, _mm512_set1_ps(xd)), acc);
    }
    _mm512_mask_storeu_ps(y, mask, acc);
}

TGT static void gemm_packed_avx512(const uint8_t *P, int64_t k, const uint8_t *xq, int64_t m,
                                   float *y, int64_t ldy, int64_t jb, int64_t je) {
    const int64_t nb = k / ENG_QK;
    const size_t gbytes = ENG_PACK_GROUP_BYTES(k), xb = (size_t)nb * sizeof(eng_blk_q8_0);
    const int64_t g_begin = jb / GROUP, g_end = (je + GROUP - 1) / GROUP;
    float xd[(ENG_PACK_MAX_K / ENG_QK) * MAXC];
    int32_t xc[(ENG_PACK_MAX_K / ENG_QK) * MAXC];
    if (m == 1) {
        _Alignas(64) int32_t xdc[2 * (ENG_PACK_MAX_K / ENG_QK)]; /* (d_x, -128 * sum) per block */
        prep_x(xq, xb, 1, nb, xd, xc);
        for (int64_t b = 0; b < nb; b++) {
            memcpy(&xdc[2 * b], &xd[b * MAXC], 4);
            xdc[2 * b + 1] = xc[b * MAXC];
        }
        for (int64_t g = g_begin; g < g_end; g++)
            gemv_packed_avx512(P + (size_t)g * gbytes, nb, xq, xdc, y + g * GROUP, (__mmask16)group_rows(g, jb, je));
        return;
    }
    for (int64_t g0 = g_begin; g0 < g_end; g0 += GCHUNK) {
        int64_t g1 = g0 + GCHUNK < g_end ? g0 + GCHUNK : g_end;
        for (int64_t c0 = 0; c0 < m; c0 += MAXC) {
            int rn = (int)(m - c0 < MAXC ? m - c0 : MAXC);
            const uint8_t *xr = xq + (size_t)c0 * xb;
            prep_x(xr, xb, rn, nb, xd, xc);
            for (int64_t g = g0; g < g1; g++) {
                __mmask16 mask = (__mmask16)group_rows(g, jb, je);
                k_group[rn - 1](P + (size_t)g * gbytes, nb, xr, xb, xd, xc, y + c0 * ldy + g * GROUP, ldy, mask);
            }
        }
    }
}

/* ---- AVX2 ----------------------------------------------------------------------------------------------------
 * Without VNNI there is no u8 x s8 -> int32 dot: vpmaddubsw (u8 x s8 -> saturating s16 pairs) would overflow on
 * codes up to 255. Instead both sides are widened to 16 bits and vpmaddwd (s16 x s16 -> exact int32 pairs) does
 * the products: a 32-byte half line (rows 8h..8h+7 of a quad) zero-extended with vpunpcklbw / vpunpckhbw gives
 * per 128-bit lane the codes of rows {0,1} and {2,3} (lane 0; {4,5} and {6,7} in lane 1) as 16-bit values;
 * vpmaddwd with the activation quad broadcast as 4 int16 leaves two int32 lanes per row (values 0-1 and 2-3).
 * After the 8 quads of a block, vphaddd of the two accumulators sums each row's two lanes, in row order 0..7.
 * All sums are exact: |code * x| <= 255 * 128, a lane adds 16 such products, and adding -128 * sum(x) (computed
 * once per activation block) turns the codes back into q. Measured alternative: q = code ^ 0x80 as signed
 * bytes with vpmaddubsw(|q|, sign(x, q)) and vpmaddwd with ones, as the row kernels do (3 multiplier-port
 * instructions per 32 products instead of 2), 10% slower on Zen 4.
 * A call works on halves of groups (8 rows) so that each activation row needs 1 float and 2 int accumulators
 * and 6 rows fit in the 16 ymm registers; reading the first half of every line first also keeps more memory
 * loads in flight when m = 1. The activation rows are converted to int16 once per call and group chunk, in
 * pieces of XBUF blocks x rows (the sums carry across pieces through y, in the same float operations). */
#define TGT2 __attribute__((target("avx2,fma,f16c")))
#define MAXC2 6   /* activation rows per kernel call (measured: 4 and 5 slower, 8 no faster) */
#define XBUF 192  /* activation blocks x rows converted at a time (64 bytes each: 12 KiB stays in L1) */
/* Hides v's value from the compiler: GCC otherwise reassociates the accumulations of a fully unrolled block
 * into trees of independent products that no longer fit in the 16 ymm registers. */
#define PIN(v) __asm__("" : "+x"(v))

/* Activation blocks [kb, ke) of rn rows: for i = (b - kb) * rn + c, xw[i] the 32 codes of block b of row c as
 * int16, xd[i] its d as float and xc[i] = -128 * sum of its codes. */
TGT2 static void prep_x2(const uint8_t *xq, size_t xb, int rn, int64_t kb, int64_t ke, int16_t (*xw)[32], float *xd,
                         int32_t *xc) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = kb; b < ke; b++) {
        for (int c = 0; c < rn; c++) {
            const eng_blk_q8_0 *x = (const eng_blk_q8_0 *)(xq + (size_t)c * xb) + b;
            const size_t i = (size_t)(b - kb) * (size_t)rn + (size_t)c;
            __m256i lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->qs));
            __m256i hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x->qs + 16)));
            _mm256_store_si256((__m256i *)xw[i], lo);
            _mm256_store_si256((__m256i *)(xw[i] + 16), hi);
            __m256i s = _mm256_madd_epi16(_mm256_add_epi16(lo, hi), ones);
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
            xc[i] = -128 * _mm_cvtsi128_si32(h);
            xd[i] = _cvtsh_ss(x->d);
        }
    }
}

static inline __attribute__((always_inline)) TGT2 int64_t load_qword(const void *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Rows 8h..8h+7 of one group times RN activation rows over blocks [kb, ke) (xw, xd, xc from prep_x2 for that
 * range): y[c * ldy + 8h + i] for the lanes i set in mask, continuing the sums already there unless kb == 0. */
static inline __attribute__((always_inline)) TGT2 void half_kernel(const int RN, const uint8_t *codes, int64_t nb,
                                                                   int64_t kb, int64_t ke, int h,
                                                                   const int16_t (*xw)[32], const float *xd,
                                                                   const int32_t *xc, float *y, int64_t ldy,
                                                                   __m256i mask) {
    const uint16_t *scales = (const uint16_t *)(codes + (size_t)nb * 512);
    __m256 acc[MAXC2];
    UNROLL_RN
    for (int c = 0; c < RN; c++)
        acc[c] = kb == 0 ? _mm256_setzero_ps() : _mm256_maskload_ps(y + c * ldy + h * 8, mask);
    for (int64_t b = kb; b < ke; b++) {
        const uint8_t *line = codes + (size_t)b * 512 + h * 32;
        const size_t xi = (size_t)(b - kb) * (size_t)RN;
        __m256i lo[MAXC2], hi[MAXC2]; /* lane pairs of rows {0,1,4,5} and {2,3,6,7} */
        UNROLL_RN
        for (int c = 0; c < RN; c++) lo[c] = hi[c] = _mm256_setzero_si256();
        UNROLL_RN
        for (int t = 0; t < 8; t++) {
            __m256i w = _mm256_load_si256((const __m256i *)(line + t * 64));
            __m256i wl = _mm256_unpacklo_epi8(w, _mm256_setzero_si256());
            __m256i wh = _mm256_unpackhi_epi8(w, _mm256_setzero_si256());
            UNROLL_RN
            for (int c = 0; c < RN; c++) {
                __m256i xv = _mm256_set1_epi64x(load_qword(xw[xi + c] + 4 * t));
                lo[c] = _mm256_add_epi32(lo[c], _mm256_madd_epi16(wl, xv));
                hi[c] = _mm256_add_epi32(hi[c], _mm256_madd_epi16(wh, xv));
                PIN(lo[c]);
                PIN(hi[c]);
            }
        }
        __m256 dw = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(scales + b * GROUP + h * 8)));
        UNROLL_RN
        for (int c = 0; c < RN; c++) {
            __m256i s = _mm256_add_epi32(_mm256_hadd_epi32(lo[c], hi[c]), _mm256_set1_epi32(xc[xi + c]));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(xd[xi + c])), acc[c]);
        }
    }
    UNROLL_RN
    for (int c = 0; c < RN; c++) _mm256_maskstore_ps(y + c * ldy + h * 8, mask, acc[c]);
}

typedef void (*half_fn)(const uint8_t *, int64_t, int64_t, int64_t, int, const int16_t (*)[32], const float *,
                        const int32_t *, float *, int64_t, __m256i);
#define HALF_FN(RN)                                                                                              \
    TGT2 static void half_##RN(const uint8_t *codes, int64_t nb, int64_t kb, int64_t ke, int h,                   \
                               const int16_t (*xw)[32], const float *xd, const int32_t *xc, float *y, int64_t ldy, \
                               __m256i mask) {                                                                   \
        half_kernel(RN, codes, nb, kb, ke, h, xw, xd, xc, y, ldy, mask);                                         \
    }
HALF_FN(1)
HALF_FN(2)
HALF_FN(3)
HALF_FN(4)
HALF_FN(5)
HALF_FN(6)
static const half_fn k_half[MAXC2] = {half_1, half_2, half_3, half_4, half_5, half_6};

/* bits (8 rows of a half group) as a vmaskmov mask: lane i all ones when bit i is set. */
TGT2 static __m256i lane_mask(unsigned bits) {
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), sel), sel);
}

TGT2 static void gemm_packed_avx2(const uint8_t *P, int64_t k, const uint8_t *xq, int64_t m, float *y, int64_t ldy,
                                  int64_t jb, int64_t je) {
    const int64_t nb = k / ENG_QK;
    const size_t gbytes = ENG_PACK_GROUP_BYTES(k), xb = (size_t)nb * sizeof(eng_blk_q8_0);
    const int64_t g_begin = jb / GROUP, g_end = (je + GROUP - 1) / GROUP;
    int16_t xw[XBUF][32] __attribute__((aligned(32)));
    float xd[XBUF];
    int32_t xc[XBUF];
    for (int64_t g0 = g_begin; g0 < g_end; g0 += GCHUNK) {
        int64_t g1 = g0 + GCHUNK < g_end ? g0 + GCHUNK : g_end;
        for (int64_t c0 = 0; c0 < m; c0 += MAXC2) {
            const int rn = (int)(m - c0 < MAXC2 ? m - c0 : MAXC2);
            const int64_t kc = XBUF / rn; /* blocks per conversion */
            const uint8_t *xr = xq + (size_t)c0 * xb;
            for (int64_t kb = 0; kb < nb; kb += kc) {
                const int64_t ke = kb + kc < nb ? kb + kc : nb;
                prep_x2(xr, xb, rn, kb, ke, xw, xd, xc);
                for (int64_t g = g0; g < g1; g++) {
                    unsigned mask = group_rows(g, jb, je);
                    for (int h = 0; h < 2; h++)
                        if ((mask >> (8 * h)) & 0xFFu)
                            k_half[rn - 1](P + (size_t)g * gbytes, nb, kb, ke, h, (const int16_t (*)[32])xw, xd, xc,
                                           y + c0 * ldy + g * GROUP, ldy, lane_mask((mask >> (8 * h)) & 0xFFu));
                }
            }
        }
    }
}
#endif

void eng_gemm_packed_q8_0(eng_simd_level l, const void *P, int64_t n_out, int64_t k, const void *xq, int64_t m,
                          float *y, int64_t ldy, int64_t j_begin, int64_t j_end) {
    if (j_end > n_out) j_end = n_out;
    if (!P || m <= 0 || j_end <= j_begin || j_begin < 0 || eng_packed_q8_0_bytes(n_out, k) == 0) return;
#if defined(__x86_64__) || defined(__i386__)
    /* m = 1 with short rows (groups under 17 KB keep the activations in L1 anyway): the AVX2 kernel, which reads
     * the first half of every line first, measured faster there (kvquant-bench q8_0, one thread, [576 -> 1536]:
     * 21 GB/s against 14 for gemv_packed_avx512; [1536 -> 576] 16 against 22, so the AVX-512 one from k = 1024) */
    if (l >= ENG_SIMD_AVX512 && (m > 1 || k >= 1024)) {
        gemm_packed_avx512(P, k, xq, m, y, ldy, j_begin, j_end);
        return;
    }
    if (l >= ENG_SIMD_AVX2) {
        gemm_packed_avx2(P, k, xq, m, y, ldy, j_begin, j_end);
        return;
    }
#endif
    gemm_packed_scalar(P, n_out, k, xq, m, y, ldy, j_begin, j_end);
}
