/*
 * test_quant_kpacked.c: engine/quant_kpacked.h, the packed Q4_K / Q5_K / Q6_K (and widened Q4_0 / Q5_0) matrices.
 *
 * Randomized differential tests against the scalar row kernels (eng_gemm at ENG_SIMD_SCALAR):
 *  - Q4_K / Q5_K / Q6_K: the scalar kernel over the packed layout and every SIMD level this CPU has give exactly the
 *    row kernel's floats (the integer sums are exact and the float operations the same), for any activation
 *    batch (rows alone give the same floats as in a batch: batch invariance) and any split of the rows into
 *    ranges; only y in the row range is written. Extreme iterations use the largest codes, scales and mins
 *    and activations of +-127 in runs of one sign, so that any 16-bit saturation or int32 overflow shows.
 *  - Q4_0 / Q5_0 / MXFP4 (widened into the Q8_0 layout): scalar exact; SIMD levels equal each other bit for bit and
 *    stay within 1e-5 * sum |w_i * x_i| of the scalar result (fused multiply-adds round differently).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kernels/quant.h"
#include "engine/kernels/quant_kpacked.h"
#include "helper_rng.h"

static int rint_in(rng *r, int lo, int hi) { return lo + rng_int(r, hi - lo + 1); }

/* A random finite fp16 of magnitude in [2^-12, 2^-4] and random sign (or positive). */
static uint16_t rand_half(rng *r, bool positive) {
    float v = ldexpf(1.f + rng_uniform(r, 0.5f), -rint_in(r, 4, 12));
    if (!positive && rng_int(r, 2)) v = -v;
    return eng_f32_to_fp16(v);
}

/* One random weight row of type (k values); extreme: the largest codes, scales and mins. */
static void random_wrow(rng *r, uint32_t type, int64_t k, uint8_t *row, bool extreme) {
    const eng_qtype_info *ti = eng_qtype_get(type);
    int64_t nb = k / ti->block_elems;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = row + b * ti->block_bytes;
        for (int i = 0; i < ti->block_bytes; i++) blk[i] = (uint8_t)rng_next(r);
        uint16_t d = rand_half(r, false), d2 = rand_half(r, true);
        int pat = rng_int(r, 3);
        switch (type) {
        case ENG_Q_Q4_K: /* d, dmin, scales[12], qs[128] */
            if (extreme) memset(blk + 4, 0xFF, 140); /* scales and mins 63, codes 15 */
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &d2, 2);
            break;
        case ENG_Q_Q5_K: /* d, dmin, scales[12], qh[32], qs[128] */
            if (extreme) memset(blk + 4, 0xFF, 172); /* scales and mins 63, codes 31 */
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &d2, 2);
            break;
        case ENG_Q_Q6_K: /* ql[128], qh[64], scales[16], d */
            if (extreme) {
                memset(blk, pat == 0 ? 0x00 : 0xFF, 192); /* codes 0 (value -32) or 63 (31) */
                for (int g = 0; g < 16; g++) blk[192 + g] = (uint8_t)(pat == 2 ? (g % 2 ? 0x80 : 0x7F) : 0x80);
            }
            memcpy(blk + 208, &d, 2);
            break;
        case ENG_Q_Q4_0:
            if (extreme) memset(blk + 2, pat == 0 ? 0x00 : 0xFF, 16);
            memcpy(blk, &d, 2);
            break;
        case ENG_Q_MXFP4: /* e, qs[16]; extreme: codes 7 (+12) or 15 (-12), the largest magnitudes; exponents across
                           * the subnormal scales (0, 1) and the normal ones, products far from overflow */
            if (extreme) memset(blk + 1, pat == 0 ? 0x77 : 0xFF, 16);
            blk[0] = (uint8_t)(pat == 2 ? rng_int(r, 2) : 100 + rng_int(r, 40));
            break;
        default: /* Q5_0: d, qh[4], qs[16] */
            if (extreme) memset(blk + 2, pat == 0 ? 0x00 : 0xFF, 20);
            memcpy(blk, &d, 2);
            break;
        }
    }
}

/* One activation row quantized by eng_quantize_row; extreme: values of one magnitude (codes +-127), in runs
 * of one sign per 32 values. */
static void random_xrow(rng *r, uint32_t dot_type, int64_t k, uint8_t *row, float *tmp, bool extreme) {
    float scale = ldexpf(1.f, rint_in(r, -3, 3));
    for (int64_t i = 0; i < k; i += 32) {
        int pat = rng_int(r, 3);
        for (int64_t e = i; e < i + 32; e++)
            tmp[e] = extreme ? (pat == 0 ? -1.f : pat == 1 ? 1.f : (rng_int(r, 2) ? 1.f : -1.f)) * scale
                             : rng_uniform(r, scale);
    }
    cr_assert_eq(eng_quantize_row(dot_type, tmp, row, k), 0);
}

/* sum |w_i * x_i| of row j and activation row i, from the dequantized rows */
static double abs_dot(uint32_t type, uint32_t dot_type, int64_t k, const uint8_t *w, const uint8_t *x) {
    float *wf = malloc((size_t)k * 4), *xf = malloc((size_t)k * 4);
    cr_assert(wf && xf);
    cr_assert_eq(eng_dequantize_row(type, w, wf, k), 0);
    cr_assert_eq(eng_dequantize_row(dot_type, x, xf, k), 0);
    double s = 0;
    for (int64_t i = 0; i < k; i++) s += fabs((double)wf[i] * xf[i]);
    free(wf);
    free(xf);
    return s;
}

static bool same_float(float a, float b) { return memcmp(&a, &b, 4) == 0; }

static void run_type(uint32_t type, uint64_t seed, int iters) {
    const eng_qtype_info *ti = eng_qtype_get(type);
    const uint32_t dt = ti->dot_type;
    const bool exact = type == ENG_Q_Q4_K || type == ENG_Q_Q5_K || type == ENG_Q_Q6_K;
    const eng_simd_level top = eng_simd_detect();
    rng r = {seed};
    for (int iter = 0; iter < iters; iter++) {
        const bool extreme = iter % 4 == 1, long_rows = iter >= iters - 4;
        const int64_t be = ti->block_elems;
        int64_t k = be * rint_in(&r, 1, be == 256 ? 8 : 40), n_out = rint_in(&r, 1, 70);
        int64_t m = iter % 5 == 0 ? rint_in(&r, 9, 40) : rint_in(&r, 1, 8);
        if (long_rows) {
            k = iter == iters - 1 ? ENG_PACK_MAX_K : be * rint_in(&r, (int)(4096 / be), (int)(ENG_PACK_MAX_K / be));
            n_out = rint_in(&r, 1, 40);
            m = rint_in(&r, 1, 10);
        }
        int64_t jb = rint_in(&r, 0, (int)n_out - 1), je = rint_in(&r, (int)jb + 1, (int)n_out + 5);
        const int64_t jend = je < n_out ? je : n_out, ldy = n_out + rint_in(&r, 0, 20);
        size_t wb = eng_qtype_row_bytes(type, k), xb = eng_qtype_row_bytes(dt, k), pb = eng_wpack_bytes(type, n_out, k);
        cr_assert_gt(pb, 0);
        uint8_t *W = malloc(wb * (size_t)n_out), *X = malloc(xb * (size_t)m);
        void *P = aligned_alloc(64, (pb + 63) / 64 * 64);
        float *tmp = malloc((size_t)k * 4), *yref = malloc((size_t)(m * ldy) * 4), *y = malloc((size_t)(m * ldy) * 4);
        float *ys = malloc((size_t)(m * ldy) * 4), *y1 = malloc((size_t)(m * ldy) * 4), *ysimd = malloc((size_t)(m * ldy) * 4);
        cr_assert(W && X && P && tmp && yref && y && ys && y1 && ysimd);
        for (int64_t j = 0; j < n_out; j++) random_wrow(&r, type, k, W + j * wb, extreme);
        for (int64_t i = 0; i < m; i++) random_xrow(&r, dt, k, X + i * xb, tmp, extreme);
        cr_assert_eq(eng_wpack(type, W, n_out, k, P), 0);
        for (int64_t i = 0; i < m * ldy; i++) yref[i] = -12345.f;
        eng_gemm(ENG_SIMD_SCALAR, type, W, k, X, m, yref, ldy, jb, jend);
        bool have_simd = false;
        for (int l = ENG_SIMD_SCALAR; l <= (int)top; l++) {
            for (int64_t i = 0; i < m * ldy; i++) y[i] = ys[i] = y1[i] = -12345.f;
            eng_gemm_wpacked((eng_simd_level)l, type, P, n_out, k, X, m, y, ldy, jb, je);
            for (int64_t a = jb; a < je;) { /* the same rows in random pieces */
                int64_t b = a + rint_in(&r, 1, 20);
                if (b > je) b = je;
                eng_gemm_wpacked((eng_simd_level)l, type, P, n_out, k, X, m, ys, ldy, a, b);
                a = b;
            }
            for (int64_t i = 0; i < m; i++) /* every activation row alone (m = 1) */
                eng_gemm_wpacked((eng_simd_level)l, type, P, n_out, k, X + i * xb, 1, y1 + i * ldy, ldy, jb, je);
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < ldy; j++) {
                    float a = y[i * ldy + j], b = yref[i * ldy + j];
                    cr_assert(same_float(a, ys[i * ldy + j]), "%s %s split y[%lld][%lld] %.9g vs %.9g (iter %d)",
                              ti->name, eng_simd_name(l), (long long)i, (long long)j, (double)a,
                              (double)ys[i * ldy + j], iter);
                    cr_assert(same_float(a, y1[i * ldy + j]), "%s %s m=1 y[%lld][%lld] %.9g vs batched %.9g (iter %d)",
                              ti->name, eng_simd_name(l), (long long)i, (long long)j, (double)y1[i * ldy + j],
                              (double)a, iter);
                    if (exact || l == ENG_SIMD_SCALAR || j < jb || j >= jend) {
                        cr_assert(same_float(a, b), "%s %s m %lld k %lld n_out %lld rows [%lld,%lld) y[%lld][%lld] "
                                  "%.9g vs rows %.9g (iter %d)", ti->name, eng_simd_name(l), (long long)m,
                                  (long long)k, (long long)n_out, (long long)jb, (long long)je, (long long)i,
                                  (long long)j, (double)a, (double)b, iter);
                    } else {
                        double as = abs_dot(type, dt, k, W + j * wb, X + i * xb);
                        cr_assert_leq(fabs((double)a - b), 1e-5 * as + 1e-30, "%s %s y[%lld][%lld] %.9g vs %.9g (iter %d)",
                                      ti->name, eng_simd_name(l), (long long)i, (long long)j, (double)a, (double)b,
                                      iter);
                        if (have_simd)
                            cr_assert(same_float(a, ysimd[i * ldy + j]), "%s: the SIMD levels differ (iter %d)",
                                      ti->name, iter);
                    }
                }
            if (l > ENG_SIMD_SCALAR) {
                memcpy(ysimd, y, (size_t)(m * ldy) * 4);
                have_simd = true;
            }
        }
        free(W); free(X); free(P); free(tmp); free(yref); free(y); free(ys); free(y1); free(ysimd);
    }
}

Test(quant_kpacked, sizes_and_errors) {
    cr_assert_eq(eng_wpack_bytes(ENG_Q_Q4_K, 0, 256), 0);
    cr_assert_eq(eng_wpack_bytes(ENG_Q_Q4_K, 16, 128), 0);
    cr_assert_eq(eng_wpack_bytes(ENG_Q_Q6_K, 16, 384), 0);
    cr_assert_eq(eng_wpack_bytes(ENG_Q_Q6_K, 16, ENG_PACK_MAX_K + 256), 0);
    cr_assert_eq(eng_wpack_bytes(ENG_Q_Q2_K, 16, 256), 0);
    cr_assert_eq(eng_wpack_bytes(ENG_Q_F16, 16, 256), 0);
    /* the packed bytes per 16 rows: Q4_K 2368 per super-block (GGUF 2304), Q6_K 3392 (GGUF 3360) */
    cr_assert_eq(eng_wpack_bytes(ENG_Q_Q4_K, 17, 512), 2 * 2 * 2368);
    cr_assert_eq(eng_wpack_bytes(ENG_Q_Q6_K, 16, 256), 3392);
    /* Q4_0: 18 bytes per row and block, as in GGUF; Q5_0: 22; each group padded to 64 bytes */
    cr_assert_eq(eng_wpack_bytes(ENG_Q_Q4_0, 16, 64), 576);
    cr_assert_eq(eng_wpack_bytes(ENG_Q_Q5_0, 20, 128), 2 * 1408);
    /* MXFP4: 18 bytes per row and block (GGUF 17: the exponent takes a 2-byte scale slot) */
    cr_assert_eq(eng_wpack_bytes(ENG_Q_MXFP4, 16, 64), 576);
    uint8_t w[144] = {0};
    cr_assert_eq(eng_wpack(ENG_Q_Q4_K, NULL, 1, 256, w), ENG_ERR_INVALID);
    cr_assert_eq(eng_wpack(ENG_Q_Q4_K, w, 1, 256, NULL), ENG_ERR_INVALID);
    cr_assert_eq(eng_wpack(ENG_Q_Q4_K, w, 1, 128, w), ENG_ERR_INVALID);
    /* eng_wpack_alloc: nothing for 0 bytes or a size that cannot be rounded up; 64-byte alignment below 2 MiB,
     * 2 MiB alignment from there (whole huge pages), the whole size writable */
    cr_assert_null(eng_wpack_alloc(0));
    cr_assert_null(eng_wpack_alloc(SIZE_MAX));
    const size_t sizes[3] = {100, (size_t)3 << 20, (size_t)2 << 20};
    for (int i = 0; i < 3; i++) {
        uint8_t *p = eng_wpack_alloc(sizes[i]);
        cr_assert_not_null(p);
        cr_assert_eq((uintptr_t)p % (sizes[i] < ((size_t)2 << 20) ? 64 : ((size_t)2 << 20)), 0);
        memset(p, 1, sizes[i]);
        free(p);
    }
}

Test(quant_kpacked, q4_K_vs_rows) { run_type(ENG_Q_Q4_K, 0x9E3779B97F4A7C15ULL, 44); }
Test(quant_kpacked, q5_K_vs_rows) { run_type(ENG_Q_Q5_K, 0x3C6EF372FE94F82BULL, 44); }
Test(quant_kpacked, q6_K_vs_rows) { run_type(ENG_Q_Q6_K, 0xD1B54A32D192ED03ULL, 44); }
Test(quant_kpacked, q4_0_vs_rows) { run_type(ENG_Q_Q4_0, 0x8CB92BA72F3D8DD7ULL, 30); }
Test(quant_kpacked, q5_0_vs_rows) { run_type(ENG_Q_Q5_0, 0xABCDEF0123456789ULL, 30); }
Test(quant_kpacked, mxfp4_vs_rows) { run_type(ENG_Q_MXFP4, 0x5851F42D4C957F2DULL, 30); }

/* eng_wpack_row: every row read back from the packed layout is the packed row's bytes, so it dequantizes to the
 * same floats (embedding lookups of a tied output matrix read the packed copy); rows of a last partial group
 * too. Q8_0 random codes include -128. */
static void row_back(uint32_t type, uint64_t seed) {
    const eng_qtype_info *ti = eng_qtype_get(type);
    rng r = {seed};
    for (int iter = 0; iter < 12; iter++) {
        const int64_t be = ti->block_elems;
        const int64_t k = iter == 11 ? ENG_PACK_MAX_K : be * rint_in(&r, 1, be == 256 ? 8 : 40);
        const int64_t n_out = rint_in(&r, 1, 50);
        size_t wb = eng_qtype_row_bytes(type, k), pb = eng_wpack_bytes(type, n_out, k);
        cr_assert_gt(pb, 0);
        uint8_t *W = malloc(wb * (size_t)n_out), *row = malloc(wb);
        void *P = aligned_alloc(64, (pb + 63) / 64 * 64);
        float *a = malloc((size_t)k * 4), *b = malloc((size_t)k * 4);
        cr_assert(W && row && P && a && b);
        for (int64_t j = 0; j < n_out; j++) {
            if (type == ENG_Q_Q8_0)
                for (int64_t blk = 0; blk < k / 32; blk++) {
                    uint8_t *p = W + j * wb + blk * 34;
                    for (int e = 0; e < 34; e++) p[e] = (uint8_t)rng_next(&r);
                    uint16_t d = rand_half(&r, false);
                    memcpy(p, &d, 2);
                }
            else
                random_wrow(&r, type, k, W + j * wb, iter % 3 == 1);
        }
        cr_assert_eq(eng_wpack(type, W, n_out, k, P), 0);
        for (int64_t j = 0; j < n_out; j++) {
            memset(row, 0xA5, wb);
            cr_assert_eq(eng_wpack_row(type, P, n_out, k, j, row), 0);
            cr_assert(memcmp(row, W + j * wb, wb) == 0, "%s: row %lld of %lld (k %lld) read back differs (iter %d)",
                      ti->name, (long long)j, (long long)n_out, (long long)k, iter);
            cr_assert_eq(eng_dequantize_row(type, row, a, k), 0);
            cr_assert_eq(eng_dequantize_row(type, W + j * wb, b, k), 0);
            cr_assert(memcmp(a, b, (size_t)k * 4) == 0, "%s: row %lld dequantizes differently", ti->name, (long long)j);
        }
        cr_assert_eq(eng_wpack_row(type, P, n_out, k, n_out, row), ENG_ERR_INVALID);
        cr_assert_eq(eng_wpack_row(type, P, n_out, k, -1, row), ENG_ERR_INVALID);
        cr_assert_eq(eng_wpack_row(type, NULL, n_out, k, 0, row), ENG_ERR_INVALID);
        free(W); free(row); free(P); free(a); free(b);
    }
}

Test(quant_kpacked, rows_read_back) {
    row_back(ENG_Q_Q8_0, 11);
    row_back(ENG_Q_Q4_0, 12);
    row_back(ENG_Q_Q5_0, 13);
    row_back(ENG_Q_MXFP4, 17);
    row_back(ENG_Q_Q4_K, 14);
    row_back(ENG_Q_Q5_K, 15);
    row_back(ENG_Q_Q6_K, 16);
    uint8_t row[256];
    cr_assert_eq(eng_wpack_row(ENG_Q_F16, row, 1, 64, 0, row), ENG_ERR_INVALID);
}

/* m = 1 over many whole groups (the kernels' one-row path, which prefetches each next super-block's activations):
 * every level equals the scalar row kernel bit for bit, for the whole range and for ranges that start and end
 * inside groups. */
Test(quant_kpacked, single_row_many_groups) {
    const uint32_t types[] = {ENG_Q_Q4_K, ENG_Q_Q5_K, ENG_Q_Q6_K};
    rng r = {77};
    for (size_t ti = 0; ti < 3; ti++)
        for (int iter = 0; iter < 4; iter++) {
            const uint32_t type = types[ti], dt = eng_qtype_get(type)->dot_type;
            const int64_t k = iter < 2 ? 4096 : 2048 * iter, n_out = 16 * rint_in(&r, 9, 14) + rint_in(&r, 0, 15);
            size_t wb = eng_qtype_row_bytes(type, k), xb = eng_qtype_row_bytes(dt, k), pb = eng_wpack_bytes(type, n_out, k);
            uint8_t *W = malloc(wb * (size_t)n_out), *X = malloc(xb);
            void *P = aligned_alloc(64, (pb + 63) / 64 * 64);
            float *tmp = malloc((size_t)k * 4), *yref = malloc((size_t)n_out * 4), *y = malloc((size_t)n_out * 4);
            cr_assert(W && X && P && tmp && yref && y);
            for (int64_t j = 0; j < n_out; j++) random_wrow(&r, type, k, W + j * wb, iter == 1);
            random_xrow(&r, dt, k, X, tmp, iter == 1);
            cr_assert_eq(eng_wpack(type, W, n_out, k, P), 0);
            eng_gemm(ENG_SIMD_SCALAR, type, W, k, X, 1, yref, n_out, 0, n_out);
            for (int l = ENG_SIMD_SCALAR; l <= (int)eng_simd_detect(); l++) {
                const int64_t jb = iter % 2 ? rint_in(&r, 1, 40) : 0, je = n_out - (iter % 2 ? rint_in(&r, 0, 40) : 0);
                for (int64_t j = 0; j < n_out; j++) y[j] = -1.f;
                eng_gemm_wpacked((eng_simd_level)l, type, P, n_out, k, X, 1, y, n_out, jb, je);
                for (int64_t j = 0; j < n_out; j++)
                    cr_assert(j < jb || j >= je ? y[j] == -1.f : same_float(y[j], yref[j]),
                              "%s %s k %lld row %lld of [%lld, %lld): %.9g vs %.9g", eng_qtype_get(type)->name,
                              eng_simd_name(l), (long long)k, (long long)j, (long long)jb, (long long)je, (double)y[j],
                              (double)yref[j]);
            }
            free(W); free(X); free(P); free(tmp); free(yref); free(y);
        }
}
