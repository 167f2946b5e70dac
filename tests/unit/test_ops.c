/*
 * test_ops.c: the attention tile kernels (engine/kernels/ops.h): the scalar versions against a plain double
 * reference written here, then every vector level this CPU runs against the scalar versions, on random
 * shapes (query counts across the vector kernels' group sizes and the transpose threshold, cache-row counts
 * across the 16-row chunks, head sizes that are multiples of 16 and odd ones, padded row strides). Also
 * checks that the kernels write nothing outside the rows and columns they own. The softmax exponentials
 * likewise (scalar against exp() in double, vector levels against scalar). Every test prints its seed.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/ops.h"
#include "engine/kernels/quant.h"
#include "engine/kernels/sampler_kernels.h"

#include "helper_rng.h"

enum { MAX_M = 40, MAX_N = 40, MAX_HD = 136, MAX_LD = MAX_N + 8 };
static const float SENTINEL = 12345.0f;

/* One random problem: q[m][hd], cache rows kf[n][hd] (and the same values as f16 in kh, kf holding the f16
 * values rounded back so that both dtypes see the same numbers), weights p[m][ldp]. */
typedef struct problem {
    int m, n, hd, lds, ldp;
    float scale;
    float q[MAX_M * MAX_HD], kf[MAX_N * MAX_HD], p[MAX_M * MAX_LD];
    uint16_t kh[MAX_N * MAX_HD];
} problem;

static void make_problem(problem *pr, rng *r, int m, int n, int hd) {
    pr->m = m;
    pr->n = n;
    pr->hd = hd;
    pr->lds = n + rng_int(r, 8);
    pr->ldp = n + rng_int(r, 8);
    pr->scale = 0.1f + rng_uniform(r, 0.05f);
    for (int i = 0; i < m * hd; i++) pr->q[i] = rng_uniform(r, 1.0f);
    for (int i = 0; i < n * hd; i++) {
        pr->kh[i] = eng_f32_to_fp16(rng_uniform(r, 2.0f));
        pr->kf[i] = eng_fp16_to_f32(pr->kh[i]);
    }
    for (int i = 0; i < m * pr->ldp; i++) pr->p[i] = rng_uniform(r, 1.0f);
}

/* Fills s[m][lds] with SENTINEL, o[m][hd] with random values (copied to o2 when not NULL). */
static void reset_out(const problem *pr, rng *r, float *s, float *o, float *o2) {
    for (int i = 0; i < pr->m * pr->lds; i++) s[i] = SENTINEL;
    for (int i = 0; i < pr->m * pr->hd; i++) {
        o[i] = rng_uniform(r, 1.0f);
        if (o2) o2[i] = o[i];
    }
}

/* The padding of s (columns n..lds) still holds SENTINEL. */
static void check_padding(const problem *pr, const float *s, const char *what) {
    for (int i = 0; i < pr->m; i++)
        for (int t = pr->n; t < pr->lds; t++)
            cr_assert_eq(s[i * pr->lds + t], SENTINEL, "%s wrote past n: m %d n %d hd %d i %d t %d", what, pr->m,
                         pr->n, pr->hd, i, t);
}

static float work[ENG_ATTN_CHUNK * MAX_HD + 16];
static float s1[MAX_M * MAX_LD], s2[MAX_M * MAX_LD], o1[MAX_M * MAX_HD], o2[MAX_M * MAX_HD], o0[MAX_M * MAX_HD];

/* Scalar tile kernels against the double reference: scores = scale * q.k, accum = o + sum_t p * v. */
Test(ops, tile_scalar_vs_reference) {
    rng r = {0x5eed01};
    cr_log_info("seed 0x5eed01");
    static problem pr;
    for (int iter = 0; iter < 300; iter++) {
        make_problem(&pr, &r, 1 + rng_int(&r, MAX_M), 1 + rng_int(&r, MAX_N), 1 + rng_int(&r, MAX_HD));
        const int m = pr.m, n = pr.n, hd = pr.hd;
        for (int dt = 0; dt < 2; dt++) {
            reset_out(&pr, &r, s1, o1, o0);
            if (dt == 0) {
                eng_attn_tile_scores_f32(ENG_OPS_SCALAR, pr.q, m, pr.kf, n, hd, pr.scale, s1, pr.lds, work);
                eng_attn_tile_accum_f32(ENG_OPS_SCALAR, o1, m, pr.p, pr.ldp, pr.kf, n, hd, work);
            } else {
                eng_attn_tile_scores_f16(ENG_OPS_SCALAR, pr.q, m, pr.kh, n, hd, pr.scale, s1, pr.lds, work);
                eng_attn_tile_accum_f16(ENG_OPS_SCALAR, o1, m, pr.p, pr.ldp, pr.kh, n, hd, work);
            }
            check_padding(&pr, s1, "scalar scores");
            for (int i = 0; i < m; i++) {
                for (int t = 0; t < n; t++) {
                    double d = 0, a = 0;
                    for (int c = 0; c < hd; c++) {
                        double x = (double)pr.q[i * hd + c] * pr.kf[t * hd + c];
                        d += x;
                        a += fabs(x);
                    }
                    cr_assert_float_eq(s1[i * pr.lds + t], d * pr.scale, 1e-6 * (a + 1), "dt %d m %d n %d hd %d", dt, m,
                                       n, hd);
                }
                for (int c = 0; c < hd; c++) {
                    double d = o0[i * hd + c], a = fabs(d);
                    for (int t = 0; t < n; t++) {
                        double x = (double)pr.p[i * pr.ldp + t] * pr.kf[t * hd + c];
                        d += x;
                        a += fabs(x);
                    }
                    cr_assert_float_eq(o1[i * hd + c], d, 1e-6 * (a + 1), "dt %d m %d n %d hd %d", dt, m, n, hd);
                }
            }
        }
    }
}

/* Every vector level against the scalar kernels. */
Test(ops, tile_simd_vs_scalar) {
    int top = eng_ops_attn_level();
    if (top == ENG_OPS_SCALAR) cr_skip_test("this CPU runs only the scalar attention kernels");
    rng r = {0x5eed02};
    cr_log_info("seed 0x5eed02, levels 1..%d", top);
    static problem pr;
    for (int iter = 0; iter < 600 * top; iter++) {
        int level = 1 + iter % top;
        /* query counts: small ones (1..7, around the transpose threshold and the 4- and 8-query groups) half the
         * time; head sizes: multiples of 16 (the AVX-512 kernels) half the time */
        int m = iter % 4 < 2 ? 1 + rng_int(&r, 7) : 1 + rng_int(&r, MAX_M);
        int hd = (iter / 2) % 2 ? 16 * (1 + rng_int(&r, MAX_HD / 16)) : 1 + rng_int(&r, MAX_HD);
        make_problem(&pr, &r, m, 1 + rng_int(&r, MAX_N), hd);
        const int n = pr.n;
        for (int dt = 0; dt < 2; dt++) {
            reset_out(&pr, &r, s1, o1, o2);
            for (int i = 0; i < m * pr.lds; i++) s2[i] = SENTINEL;
            if (dt == 0) {
                eng_attn_tile_scores_f32(level, pr.q, m, pr.kf, n, hd, pr.scale, s1, pr.lds, work);
                eng_attn_tile_scores_f32(ENG_OPS_SCALAR, pr.q, m, pr.kf, n, hd, pr.scale, s2, pr.lds, work);
                eng_attn_tile_accum_f32(level, o1, m, pr.p, pr.ldp, pr.kf, n, hd, work);
                eng_attn_tile_accum_f32(ENG_OPS_SCALAR, o2, m, pr.p, pr.ldp, pr.kf, n, hd, work);
            } else {
                eng_attn_tile_scores_f16(level, pr.q, m, pr.kh, n, hd, pr.scale, s1, pr.lds, work);
                eng_attn_tile_scores_f16(ENG_OPS_SCALAR, pr.q, m, pr.kh, n, hd, pr.scale, s2, pr.lds, work);
                eng_attn_tile_accum_f16(level, o1, m, pr.p, pr.ldp, pr.kh, n, hd, work);
                eng_attn_tile_accum_f16(ENG_OPS_SCALAR, o2, m, pr.p, pr.ldp, pr.kh, n, hd, work);
            }
            check_padding(&pr, s1, "vector scores");
            /* |q| <= 1, |k| <= 2: a score sums hd products of at most 2, an output n products of at most 2 */
            double ts = 1e-6 * 2 * hd * pr.scale + 1e-6, to = 1e-6 * (2 * n + 1);
            for (int i = 0; i < m; i++) {
                for (int t = 0; t < n; t++)
                    cr_assert_float_eq(s1[i * pr.lds + t], s2[i * pr.lds + t], ts,
                                       "level %d dt %d m %d n %d hd %d i %d t %d", level, dt, m, n, hd, i, t);
                for (int c = 0; c < hd; c++)
                    cr_assert_float_eq(o1[i * hd + c], o2[i * hd + c], to, "level %d dt %d m %d n %d hd %d i %d c %d",
                                       level, dt, m, n, hd, i, c);
            }
        }
    }
}

/* The vector kernels leave work's neighbours alone and accept n = 0 (no rows: nothing changes). */
Test(ops, tile_edges) {
    rng r = {0x5eed03};
    static problem pr;
    make_problem(&pr, &r, 9, 16, 64);
    for (int level = 0; level <= eng_ops_attn_level(); level++) {
        reset_out(&pr, &r, s1, o1, o2);
        eng_attn_tile_scores_f16(level, pr.q, pr.m, pr.kh, 0, pr.hd, pr.scale, s1, pr.lds, work);
        eng_attn_tile_accum_f16(level, o1, pr.m, pr.p, pr.ldp, pr.kh, 0, pr.hd, work);
        for (int i = 0; i < pr.m * pr.lds; i++) cr_assert_eq(s1[i], SENTINEL, "level %d", level);
        cr_assert_eq(memcmp(o1, o2, sizeof(float) * (size_t)(pr.m * pr.hd)), 0, "level %d", level);
        work[ENG_ATTN_WORK(pr.hd)] = SENTINEL;
        eng_attn_tile_scores_f16(level, pr.q, pr.m, pr.kh, pr.n, pr.hd, pr.scale, s1, pr.lds, work);
        eng_attn_tile_accum_f16(level, o1, pr.m, pr.p, pr.ldp, pr.kh, pr.n, pr.hd, work);
        cr_assert_eq(work[ENG_ATTN_WORK(pr.hd)], SENTINEL, "level %d wrote past its work buffer", level);
    }
}

/* Softmax numerators: the scalar kernel is eng_smp_exp (checked against exp() in double), every vector level
 * within a few ulp of it, on random lengths (vector tails), values down past the flush-to-zero bound, and
 * NaN / -inf entries (0). */
Test(ops, expsum_levels) {
    rng r = {0x5eed04};
    cr_log_info("seed 0x5eed04");
    enum { N = 300 };
    static float x[N], y[N], z[N];
    for (int iter = 0; iter < 400; iter++) {
        int n = rng_int(&r, N + 1);
        float spread = iter % 3 == 0 ? 120.0f : iter % 3 == 1 ? 10.0f : 1.0f;
        float mx = rng_uniform(&r, 5.0f);
        for (int i = 0; i < n; i++) {
            x[i] = mx - fabsf(rng_uniform(&r, spread));
            if (rng_int(&r, 50) == 0) x[i] = mx;
            if (rng_int(&r, 100) == 0) x[i] = NAN;
            if (rng_int(&r, 100) == 0) x[i] = -INFINITY;
        }
        memcpy(y, x, sizeof(float) * (size_t)n);
        double s0 = eng_attn_expsum(ENG_OPS_SCALAR, y, n, mx), ref = 0;
        for (int i = 0; i < n; i++) {
            double d = x[i] - mx, e = x[i] != x[i] || d < -87.3365478515625 ? 0.0 : exp(d); /* difference in float */
            /* denormal results and the flush bound: absolute 2e-38 */
            cr_assert_float_eq(y[i], e, 4e-7 * e + 2e-38, "scalar n %d i %d x - mx %g", n, i, d);
            cr_assert_eq(y[i], eng_smp_exp(x[i] - mx), "n %d i %d", n, i);
            ref += y[i];
        }
        cr_assert_float_eq(s0, ref, 1e-12 * (ref + 1), "scalar sum n %d", n);
        for (int level = 1; level <= eng_ops_attn_level(); level++) {
            memcpy(z, x, sizeof(float) * (size_t)n);
            double s1 = eng_attn_expsum(level, z, n, mx);
            for (int i = 0; i < n; i++)
                cr_assert_float_eq(z[i], y[i], 5e-7 * y[i] + 2e-38, "level %d n %d i %d x - mx %g", level, n, i,
                                   (double)(x[i] - mx));
            cr_assert_float_eq(s1, s0, 5e-7 * s0 + 1e-37, "level %d sum n %d", level, n);
        }
    }
}

/* Batch invariance (ops.h): a query's scores and accumulated output are the same bit for bit whatever the
 * other queries of the tile (any count: a decode step has 1-3, a prefill tile up to 48) and however many cache
 * rows follow (a decode step reads up to its own position, a prefill tile up to its last row's; the rows
 * past a query's own carry weight 0). */
Test(ops, tile_batch_invariance) {
    rng r = {0x5eed05};
    cr_log_info("seed 0x5eed05");
    static problem pr, one;
    static float so[MAX_M * MAX_LD], oo[MAX_M * MAX_HD];
    for (int iter = 0; iter < 200; iter++) {
        int level = iter % (eng_ops_attn_level() + 1);
        int hd = iter % 4 ? 16 * (1 + rng_int(&r, MAX_HD / 16)) : 2 + 2 * rng_int(&r, MAX_HD / 2);
        make_problem(&pr, &r, 1 + rng_int(&r, MAX_M), 1 + rng_int(&r, MAX_N), hd);
        const int m = pr.m, n = pr.n;
        bool f16 = iter % 2;
        reset_out(&pr, &r, s1, o1, NULL);
        memset(o1, 0, sizeof(float) * (size_t)(m * hd));
        if (f16) {
            eng_attn_tile_scores_f16(level, pr.q, m, pr.kh, n, hd, pr.scale, s1, pr.lds, work);
            eng_attn_tile_accum_f16(level, o1, m, pr.p, pr.ldp, pr.kh, n, hd, work);
        } else {
            eng_attn_tile_scores_f32(level, pr.q, m, pr.kf, n, hd, pr.scale, s1, pr.lds, work);
            eng_attn_tile_accum_f32(level, o1, m, pr.p, pr.ldp, pr.kf, n, hd, work);
        }
        for (int i = 0; i < m; i++) {
            /* query i first, then up to MAX_M - 1 other queries of the tile, over the first no <= n rows */
            int mo = 1 + rng_int(&r, MAX_M), no = 1 + rng_int(&r, n);
            one = pr;
            one.m = mo;
            for (int j = 0; j < mo; j++) {
                int src = j == 0 ? i : rng_int(&r, m);
                memcpy(one.q + j * hd, pr.q + src * hd, sizeof(float) * (size_t)hd);
                memcpy(one.p + j * pr.ldp, pr.p + src * pr.ldp, sizeof(float) * (size_t)pr.ldp);
            }
            memset(oo, 0, sizeof(float) * (size_t)(mo * hd));
            if (f16) {
                eng_attn_tile_scores_f16(level, one.q, mo, pr.kh, no, hd, pr.scale, so, pr.lds, work);
                eng_attn_tile_accum_f16(level, oo, mo, one.p, pr.ldp, pr.kh, n, hd, work);
            } else {
                eng_attn_tile_scores_f32(level, one.q, mo, pr.kf, no, hd, pr.scale, so, pr.lds, work);
                eng_attn_tile_accum_f32(level, oo, mo, one.p, pr.ldp, pr.kf, n, hd, work);
            }
            cr_assert_eq(memcmp(so, s1 + i * pr.lds, sizeof(float) * (size_t)no), 0,
                         "scores: level %d f16 %d m %d (vs %d) n %d (vs %d) hd %d query %d", level, f16, m, mo, n, no,
                         hd, i);
            cr_assert_eq(memcmp(oo, o1 + i * hd, sizeof(float) * (size_t)hd), 0,
                         "accum: level %d f16 %d m %d (vs %d) n %d hd %d query %d", level, f16, m, mo, n, hd, i);
            /* rows past a query's own position carry weight 0: reading them changes nothing */
            static float oa[MAX_M * MAX_HD], ob[MAX_M * MAX_HD];
            for (int j = 0; j < mo; j++)
                for (int t = no; t < n; t++) one.p[j * pr.ldp + t] = 0.0f;
            memset(oa, 0, sizeof(float) * (size_t)(mo * hd));
            memset(ob, 0, sizeof(float) * (size_t)(mo * hd));
            if (f16) {
                eng_attn_tile_accum_f16(level, oa, mo, one.p, pr.ldp, pr.kh, no, hd, work);
                eng_attn_tile_accum_f16(level, ob, mo, one.p, pr.ldp, pr.kh, n, hd, work);
            } else {
                eng_attn_tile_accum_f32(level, oa, mo, one.p, pr.ldp, pr.kf, no, hd, work);
                eng_attn_tile_accum_f32(level, ob, mo, one.p, pr.ldp, pr.kf, n, hd, work);
            }
            cr_assert_eq(memcmp(oa, ob, sizeof(float) * (size_t)(mo * hd)), 0,
                         "accum over %d vs %d rows (zero weights past %d): level %d f16 %d m %d hd %d", no, n, no,
                         level, f16, mo, hd);
        }
    }
}

/* Attention sinks: the probabilities s[i] * inv of eng_attn_softmax_inv against a softmax over the scores and the
 * sink in double, at every level; without a sink (-INFINITY) the result is bit for bit the plain expsum path. */
Test(ops, softmax_sink_vs_reference) {
    rng r = {20260126};
    float s[300], s0[300], plain[300];
    for (int iter = 0; iter < 400; iter++) {
        int n = 1 + rng_int(&r, 300);
        float spread = iter % 3 == 0 ? 30.0f : 4.0f;
        for (int i = 0; i < n; i++) s0[i] = rng_uniform(&r, spread);
        float mx = s0[0];
        for (int i = 1; i < n; i++) mx = s0[i] > mx ? s0[i] : mx;
        /* sinks below, near and far above the scores' max */
        float sink = iter % 4 == 0 ? mx + 20.0f : iter % 4 == 1 ? mx - 3.0f : rng_uniform(&r, spread);
        double top = sink > mx ? sink : mx, den = exp((double)sink - top);
        for (int i = 0; i < n; i++) den += exp((double)s0[i] - top);
        for (int lv = ENG_OPS_SCALAR; lv <= eng_ops_attn_level(); lv++) {
            memcpy(s, s0, (size_t)n * sizeof *s);
            float inv = eng_attn_softmax_inv(lv, s, n, mx, sink);
            for (int i = 0; i < n; i++) {
                double want = exp((double)s0[i] - top) / den, got = (double)s[i] * inv;
                /* relative for the large probabilities, absolute (of their sum, 1) for the tiny ones */
                cr_assert(fabs(got - want) <= 2e-6 * want + 1e-9, "level %d n %d i %d: %.9g vs %.9g (seed 20260126 "
                          "iter %d)", lv, n, i, got, want, iter);
            }
            memcpy(s, s0, (size_t)n * sizeof *s);
            memcpy(plain, s0, (size_t)n * sizeof *s);
            float a = eng_attn_softmax_inv(lv, s, n, mx, -INFINITY);
            float b = 1.0f / (float)eng_attn_expsum(lv, plain, n, mx);
            cr_assert(a == b && memcmp(s, plain, (size_t)n * sizeof *s) == 0, "level %d: no-sink path differs", lv);
        }
    }
}

/* gpt-oss's clamped SwiGLU against its definition in double (min, clamp, sigmoid), across the clamps. */
Test(ops, swiglu_oai_vs_reference) {
    rng r = {1702};
    float g[257], u[257], g0[257];
    for (int iter = 0; iter < 200; iter++) {
        int n = 1 + rng_int(&r, 257);
        float alpha = iter % 2 ? 1.702f : 0.5f + rng_uniform(&r, 0.4f), limit = iter % 2 ? 7.0f : 3.0f;
        for (int i = 0; i < n; i++) {
            g0[i] = g[i] = rng_uniform(&r, 12.0f);
            u[i] = rng_uniform(&r, 12.0f);
        }
        eng_swiglu_oai(g, u, n, alpha, limit);
        for (int i = 0; i < n; i++) {
            double x = g0[i] < limit ? g0[i] : limit, y = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];
            double want = x / (1.0 + exp(-(double)alpha * x)) * (y + 1.0);
            cr_assert(fabs(g[i] - want) <= 1e-5 * fabs(want) + 1e-6, "n %d i %d: g %g u %g: %.9g vs %.9g (seed 1702 "
                      "iter %d)", n, i, (double)g0[i], (double)u[i], (double)g[i], want, iter);
        }
    }
    float gn = NAN, un = 0.5f; /* a NaN gate stays NaN, as std::min(NaN, limit) keeps it */
    eng_swiglu_oai(&gn, &un, 1, 1.702f, 7.0f);
    cr_assert(isnan(gn));
}
