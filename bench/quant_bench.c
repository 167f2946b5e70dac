/*
 * quant_bench.c: micro-benchmark of eng_gemm (not a test: no assertions, timing only).
 *
 *   kvquant-bench [type] [seconds-per-case] [gemv]     type: q8_0 (default), q4_0, q4_K, q6_K, f16, ...
 *
 * With "gemv": only m = 1 on bench-1b's shapes, see gemv_1b ("gemv-shapes": without the weight pass; "gemv-cache":
 * the shapes cut to rows that stay in L2, without the weight pass: the kernel's arithmetic limit).
 *
 * Every figure is the best of 5 rounds, timed in thread CPU time (the machine may be shared).
 *
 * For each kernel level this CPU has, on matrices shaped like bench-135m's ([576 -> 1536] ffn up,
 * [1536 -> 576] ffn down, [576 -> 50257] vocabulary), one thread:
 *   m = 1:  GB/s of weights streamed (the weights are cycled through ~160 MB of copies so they come from
 *           memory, not cache, as in decoding a model larger than the caches);
 *   m = 1, 4, 16, 32, 128: GFLOP/s (2*m*k*n per call) and activation rows per second for that matrix.
 * Then a projection for bench-135m (30 layers: per layer [576->576] x2, [576->192] x2, [576->1536] x2,
 * [1536->576], plus the [576->50257] output): tokens/s of one thread if every matrix ran at the measured
 * rate of the closest shape (decode: m = 1 from memory; prefill: m = 128 with the output for 1 row).
 * For types whose block does not divide 576 (k-quants), k is rounded up to the next multiple (768).
 * For the types with a packed layout (Q8_0, Q4_0, Q5_0, Q4_K, Q6_K: eng_wpack, the layout the engine runs from
 * AVX2 up) at every level with a packed kernel, shown as "packed-avx2", "packed-avx512".
 * Finally a full bench-135m weight pass (all 30 layers' 7 matrices and the output, ~144 MB for Q8_0, every
 * matrix split by rows over T threads, T = 1 and 2; wall time, best of 5 passes): decode (m = 1) and prefill
 * (m = 128, output for 1 row) tokens/s; for Q8_0 at each packed level, for other types at the best level.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/kernels/quant.h"
#include "engine/kernels/quant_kpacked.h"

/* CPU time of this thread: on a shared machine, time spent descheduled does not count (memory contention
 * from other processes still does). */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 88172645463325252ULL;
static float frand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f;
}

typedef struct {
    const char *name;
    int64_t k, n;
} shape;

static uint32_t parse_type(const char *s) {
    for (uint32_t t = 0; t < ENG_Q_COUNT; t++) {
        const eng_qtype_info *i = eng_qtype_get(t);
        if (i && strcmp(i->name, s) == 0) return t;
    }
    return ENG_Q_COUNT;
}

/* quantized random weights: n_rows rows of k values */
static uint8_t *make_weights(uint32_t type, int64_t k, int64_t n_rows, float *tmp) {
    size_t rb = eng_qtype_row_bytes(type, k);
    uint8_t *w = malloc(rb * (size_t)n_rows);
    if (!w) return NULL;
    /* one random row pattern per 64 rows is enough for timing: quantize a few rows, copy around */
    for (int64_t j = 0; j < n_rows; j++) {
        if (j < 64) {
            for (int64_t i = 0; i < k; i++) tmp[i] = frand() * 0.05f;
            if (eng_quantize_row(type, tmp, w + (size_t)j * rb, k) != 0) {
                /* types without a quantizer: random bytes with a small f16 scale in the first 2 bytes */
                for (size_t b = 0; b < rb; b++) w[(size_t)j * rb + b] = (uint8_t)(frand() * 127.f);
            }
        } else {
            memcpy(w + (size_t)j * rb, w + (size_t)(j % 64) * rb, rb);
        }
    }
    return w;
}

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Packs n rows of a matrix (the layout the engine runs from AVX2 up). */
static uint8_t *pack(uint32_t type, const uint8_t *w, int64_t k, int64_t n) {
    size_t bytes = eng_wpack_bytes(type, n, k);
    uint8_t *p = eng_wpack_alloc(bytes); /* huge pages, as the engine's */
    if (p && eng_wpack(type, w, n, k, p) != 0) {
        free(p);
        return NULL;
    }
    return p;
}

/* eng_gemm at level l, or the packed kernel when packed */
static void gemm_any(eng_simd_level l, bool packed, uint32_t type, const void *w, int64_t k, int64_t n, const void *x,
                     int m, float *y, int64_t jb, int64_t je) {
    if (packed) eng_gemm_wpacked(l, type, w, n, k, x, m, y, n, jb, je);
    else eng_gemm(l, type, w, k, x, m, y, n, jb, je);
}

/* One timed case: the gemm on m rows, cycling through `copies` copies of the matrix (mat bytes apart). */
typedef struct {
    eng_simd_level level;
    bool packed;
    uint32_t type;
    const uint8_t *w;
    size_t mat;
    int copies;
    int64_t k, n;
    const void *x;
    int m;
    float *y;
} gemm_case;

/* Seconds per call, the best of 5 rounds of secs/5 each (at least 2 calls a round): the machine is shared, the
 * best round is the least disturbed one. */
static double best_per_call(const gemm_case *g, double secs) {
    double per = 1e30;
    int calls = 0;
    for (int round = 0; round < 5; round++) {
        int rc = 0;
        double t0 = now_s(), t;
        do {
            const uint8_t *wm = g->w + (size_t)(calls++ % g->copies) * g->mat;
            gemm_any(g->level, g->packed, g->type, wm, g->k, g->n, g->x, g->m, g->y, 0, g->n);
            rc++;
            t = now_s() - t0;
        } while (t < secs / 5 || rc < 2);
        if (t / rc < per) per = t / rc;
    }
    return per;
}

/* ---- full model pass ---------------------------------------------------------------------------------- */
typedef struct {
    uint32_t type;
    eng_simd_level level;
    bool packed;      /* w holds packed matrices (eng_wpack) */
    int n_mats;
    uint8_t **w;      /* n_mats matrices */
    int64_t *k, *n;   /* their shapes */
    const uint8_t *x576, *x1536;
    float *y;         /* 128 x 50257 */
    int m;
    int tid, nthreads;
} pass_args;

static void *pass_worker(void *p) {
    pass_args *a = p;
    for (int i = 0; i < a->n_mats; i++) {
        int64_t n = a->n[i], k = a->k[i];
        int64_t groups = (n + 15) / 16, jb = groups * a->tid / a->nthreads * 16;
        int64_t je = groups * (a->tid + 1) / a->nthreads * 16;
        if (je > n) je = n;
        const uint8_t *x = k == 576 ? a->x576 : a->x1536;
        int m = (i == a->n_mats - 1) ? 1 : a->m; /* output projection: last row only */
        gemm_any(a->level, a->packed, a->type, a->w[i], k, n, x, m, a->y, jb, je);
    }
    return NULL;
}

/* Wall time of the pass a describes on nt (1 or 2) threads, best of 5. */
static double time_pass(pass_args a0, int nt) {
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[2];
        pass_args a[2];
        double t0 = wall_s();
        for (int t = 0; t < nt; t++) {
            a[t] = a0;
            a[t].tid = t;
            a[t].nthreads = nt;
            if (t > 0) pthread_create(&th[t], NULL, pass_worker, &a[t]);
        }
        pass_worker(&a[0]);
        for (int t = 1; t < nt; t++) pthread_join(th[t], NULL);
        double dt = wall_s() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

/* The matrices of a model's weight pass: n_layer x the 7 of a layer (shapes lk[i] -> ln[i]) and the output
 * [k_out -> n_out], random, packed when packed. *total gets their bytes (packed bytes when count_packed).
 * Returns 0, or -1 (what was made before is freed). */
static int make_pass(uint32_t type, int n_layer, const int64_t lk[7], const int64_t ln[7], int64_t k_out,
                     int64_t n_out, bool packed, bool count_packed, float *tmp, uint8_t **w, int64_t *k, int64_t *n,
                     size_t *total) {
    const int nm = n_layer * 7 + 1;
    *total = 0;
    for (int i = 0; i < nm; i++) {
        k[i] = i == nm - 1 ? k_out : lk[i % 7];
        n[i] = i == nm - 1 ? n_out : ln[i % 7];
        uint8_t *rows = make_weights(type, k[i], n[i], tmp);
        w[i] = packed && rows ? pack(type, rows, k[i], n[i]) : rows;
        if (packed) free(rows);
        if (!w[i]) {
            while (i-- > 0) free(w[i]);
            return -1;
        }
        *total += count_packed ? eng_wpack_bytes(type, n[i], k[i]) : eng_qtype_row_bytes(type, k[i]) * (size_t)n[i];
    }
    return 0;
}

static void model_pass(uint32_t type, eng_simd_level level, bool packed, float *tmp) {
    const eng_qtype_info *ti = eng_qtype_get(type);
    if (576 % ti->block_elems) return;
    enum { NL = 30, NM = NL * 7 + 1 };
    static const int64_t lk[7] = {576, 576, 576, 576, 576, 576, 1536}, ln[7] = {576, 192, 192, 576, 1536, 1536, 576};
    uint8_t *w[NM];
    int64_t k[NM], n[NM];
    size_t total;
    if (make_pass(type, NL, lk, ln, 576, 50257, packed, false, tmp, w, k, n, &total) != 0) return;
    size_t xb576 = eng_qtype_row_bytes(ti->dot_type, 576), xb1536 = eng_qtype_row_bytes(ti->dot_type, 1536);
    uint8_t *x576 = malloc(xb576 * 128), *x1536 = malloc(xb1536 * 128);
    float *y = malloc(sizeof(float) * 50257 * 128);
    if (!x576 || !x1536 || !y) return;
    for (int64_t i = 0; i < 1536 * 128; i++) tmp[i] = frand();
    for (int r = 0; r < 128; r++) {
        eng_quantize_row(ti->dot_type, tmp + r * 1536, x1536 + r * xb1536, 1536);
        eng_quantize_row(ti->dot_type, tmp + r * 1536, x576 + r * xb576, 576);
    }
    printf("\nfull bench-135m weight pass (%.1f MB of %s), level %s%s, wall time, best of 5:\n", total / 1e6, ti->name,
           packed ? "packed-" : "", eng_simd_name(level));
    for (int nt = 1; nt <= 2; nt++) {
        for (int mi = 0; mi < 2; mi++) {
            int m = mi == 0 ? 1 : 128;
            double best = time_pass((pass_args){.type = type, .level = level, .packed = packed, .n_mats = NM, .w = w,
                                                .k = k, .n = n, .x576 = x576, .x1536 = x1536, .y = y, .m = m},
                                    nt);
            if (m == 1)
                printf("  %d thread(s), decode  m=1:   %7.2f ms/pass  %7.1f tok/s  %6.2f GB/s\n", nt, best * 1e3,
                       1.0 / best, total / best * 1e-9);
            else
                printf("  %d thread(s), prefill m=128: %7.2f ms/pass  %7.1f tok/s\n", nt, best * 1e3, 128.0 / best);
        }
    }
    for (int i = 0; i < NM; i++) free(w[i]);
    free(x576);
    free(x1536);
    free(y);
}

/* ---- gemv mode: m = 1 on bench-1b's shapes ------------------------------------------------------------------ */
/* One thread, thread CPU time: GB/s of packed weights streamed at m = 1 for each packed level, on bench-1b's
 * [2048 -> 2048] (wq, wo), [2048 -> 8192] (gate, up) and [8192 -> 2048] (down) matrices cycled through >= 320 MB
 * of copies; then a bench-1b weight pass (16 layers x 7 matrices and the [2048 -> 128256] output, all in type),
 * T = 1 and 2 threads, each matrix split by whole groups in halves, wall time (best of 5). */
static int gemv_1b(uint32_t type, double secs, float *tmp, bool pass, bool cached) {
    const eng_qtype_info *ti = eng_qtype_get(type);
    eng_simd_level top = eng_simd_detect();
    if (eng_wpack_bytes(type, 16, 2048) == 0 || top < ENG_SIMD_AVX2) {
        fprintf(stderr, "gemv mode: %s has no packed kernel on this CPU\n", ti->name);
        return 2;
    }
    const shape shapes[] = {{"2048->2048", 2048, 2048}, {"2048->8192", 2048, 8192}, {"8192->2048", 8192, 2048}};
    size_t xb = eng_qtype_row_bytes(ti->dot_type, 8192);
    uint8_t *x = malloc(xb);
    float *y = malloc(sizeof(float) * 128256);
    if (!x || !y) return 1;
    for (int64_t i = 0; i < 8192; i++) tmp[i] = frand();
    printf("kvquant-bench gemv: %s weights packed, m = 1, one thread, thread CPU time (best of 5)\n", ti->name);
    for (int l = ENG_SIMD_AVX2; l <= (int)top; l++)
        for (int si = 0; si < 3; si++) {
            shape sh = shapes[si];
            const shape *s = &sh;
            if (cached) /* the arithmetic's limit: few enough rows (whole groups) for the matrix to stay in L2 */
                while (sh.n > 16 && eng_wpack_bytes(type, sh.n, sh.k) > (768u << 10)) sh.n /= 2;
            eng_quantize_row(ti->dot_type, tmp, x, s->k);
            size_t mat = eng_wpack_bytes(type, s->n, s->k);
            int copies = cached ? 1 : (int)((320u << 20) / mat) + 1;
            uint8_t *w = make_weights(type, s->k, s->n, tmp + 8192), *p = eng_wpack_alloc(mat * (size_t)copies);
            if (!w || !p) return 1;
            for (int cp = 0; cp < copies; cp++) eng_wpack(type, w, s->n, s->k, p + (size_t)cp * mat);
            free(w);
            double per = best_per_call(&(gemm_case){.level = (eng_simd_level)l, .packed = true, .type = type, .w = p,
                                                    .mat = mat, .copies = copies, .k = s->k, .n = s->n, .x = x,
                                                    .m = 1, .y = y},
                                       secs);
            printf("  packed-%-7s %-11s %6lld rows %8.3f ms/call %7.2f GB/s\n", eng_simd_name((eng_simd_level)l), s->name,
                   (long long)s->n, per * 1e3, mat / per * 1e-9);
            free(p);
        }
    if (!pass) {
        free(x);
        free(y);
        return 0;
    }
    /* the bench-1b weight pass */
    enum { NL = 16, NM = NL * 7 + 1 };
    static const int64_t lk[7] = {2048, 2048, 2048, 2048, 2048, 2048, 8192}, ln[7] = {2048, 512, 512, 2048, 8192, 8192, 2048};
    uint8_t *w[NM];
    int64_t k[NM], n[NM];
    size_t total;
    if (make_pass(type, NL, lk, ln, 2048, 128256, true, true, tmp + 8192, w, k, n, &total) != 0) return 1;
    eng_quantize_row(ti->dot_type, tmp, x, 8192); /* its first 2048 values' blocks serve the k = 2048 matrices */
    printf("bench-1b weight pass (%.1f MB of packed %s), m = 1, level %s, wall time, best of 5:\n", total / 1e6, ti->name,
           eng_simd_name(top));
    for (int nt = 1; nt <= 2; nt++) {
        double best = time_pass((pass_args){.type = type, .level = top, .packed = true, .n_mats = NM, .w = w, .k = k,
                                            .n = n, .x576 = x, .x1536 = x, .y = y, .m = 1},
                                nt);
        printf("  %d thread(s): %7.2f ms/pass  %6.1f tok/s  %6.2f GB/s\n", nt, best * 1e3, 1.0 / best, total / best * 1e-9);
    }
    for (int i = 0; i < NM; i++) free(w[i]);
    free(x);
    free(y);
    return 0;
}

/* One level (packed: on the packed layout) over the three bench-135m shapes and every m; the GFLOP/s go to
 * gflops[shape][m index], then the bench-135m projection is printed. Returns 0 or 1 (out of memory). */
static int bench_level(uint32_t type, int l, bool packed, double secs, float *tmp, double gflops[3][5]) {
    const eng_qtype_info *ti = eng_qtype_get(type);
    const shape shapes[] = {{"576->1536", 576, 1536}, {"1536->576", 1536, 576}, {"576->50257", 576, 50257}};
    const int ms[] = {1, 4, 16, 32, 128};
    printf("\n== level %s%s ==\n", packed ? "packed-" : "", eng_simd_name((eng_simd_level)l));
    printf("%-11s %5s %10s %10s %12s %12s\n", "matrix", "m", "ms/call", "GFLOP/s", "rows/s", "weight GB/s");
    for (int si = 0; si < 3; si++) {
        shape sh = shapes[si];
        const shape *s = &sh;
        if (sh.k % ti->block_elems) { /* e.g. k-quants: 576 is not a multiple of 256 */
            sh.k = (sh.k + ti->block_elems - 1) / ti->block_elems * ti->block_elems;
            if (si == 0 || si == 2) printf("(k rounded up to %lld for this type)\n", (long long)sh.k);
        }
        size_t rb = eng_qtype_row_bytes(type, s->k), mat = rb * (size_t)s->n;
        /* enough copies for >= 160 MB so m = 1 streams from memory */
        int copies = (int)((160u << 20) / mat) + 1;
        uint8_t *w = make_weights(type, s->k, s->n * copies, tmp);
        if (w && packed) {
            mat = eng_wpack_bytes(type, s->n, s->k);
            uint8_t *p = aligned_alloc(64, mat * (size_t)copies + 64);
            for (int cp = 0; p && cp < copies; cp++)
                eng_wpack(type, w + (size_t)cp * rb * (size_t)s->n, s->n, s->k, p + (size_t)cp * mat);
            free(w);
            w = p;
        }
        size_t xb = eng_qtype_row_bytes(ti->dot_type, s->k);
        uint8_t *x = malloc(xb * 128);
        float *y = malloc(sizeof(float) * (size_t)s->n * 128);
        if (!w || !x || !y) return 1;
        for (int64_t i = 0; i < s->k * 128; i++) tmp[i] = frand();
        for (int r = 0; r < 128; r++) eng_quantize_row(ti->dot_type, tmp + r * s->k, x + r * xb, s->k);
        for (int mi = 0; mi < 5; mi++) {
            int m = ms[mi];
            if (l == ENG_SIMD_SCALAR && m > 4) continue; /* too slow to be interesting */
            double per = best_per_call(&(gemm_case){.level = (eng_simd_level)l, .packed = packed, .type = type,
                                                    .w = w, .mat = mat, .copies = m == 1 ? copies : 1, .k = s->k,
                                                    .n = s->n, .x = x, .m = m, .y = y},
                                       secs);
            double gf = 2.0 * m * s->k * s->n / per * 1e-9;
            gflops[si][mi] = gf;
            printf("%-11s %5d %10.3f %10.1f %12.0f", s->name, m, per * 1e3, gf, m / per);
            if (m == 1) printf(" %12.2f", mat / per * 1e-9);
            printf("\n");
        }
        free(w);
        free(x);
        free(y);
    }
    /* projection for bench-135m */
    double layer_small = 2.0 * 576 * 576 * 2 + 2.0 * 576 * 192 * 2; /* flops per row, q/o and k/v */
    double layer_up = 2.0 * 576 * 1536 * 2, layer_down = 2.0 * 1536 * 576, outp = 2.0 * 576 * 50257;
    double dec = 30 * ((layer_small + layer_up) / (gflops[0][0] * 1e9) + layer_down / (gflops[1][0] * 1e9)) +
                 outp / (gflops[2][0] * 1e9);
    printf("projection bench-135m, 1 thread: decode %.1f tok/s", 1.0 / dec);
    if (l != ENG_SIMD_SCALAR) {
        double pre = 30 * ((layer_small + layer_up) / (gflops[0][4] * 1e9) + layer_down / (gflops[1][4] * 1e9)) +
                     outp / 128 / (gflops[2][0] * 1e9);
        printf(", prefill (m=128, matrices only) %.0f tok/s", 1.0 / pre);
    }
    printf("\n");
    return 0;
}

/* The cost of quantizing activations to type's dot type. Returns 0 or 1 (out of memory). */
static int bench_quantize(uint32_t type, double secs, float *tmp) {
    const uint32_t dt = eng_qtype_get(type)->dot_type;
    const eng_qtype_info *di = eng_qtype_get(dt);
    int64_t k = 1536, rows = 128;
    size_t xb = eng_qtype_row_bytes(dt, k);
    uint8_t *x = malloc(xb * (size_t)rows);
    if (!x) return 1;
    for (int64_t i = 0; i < k * rows; i++) tmp[i] = frand();
    int calls = 0;
    double t0 = now_s(), t;
    do {
        for (int64_t r = 0; r < rows; r++) eng_quantize_row(dt, tmp + r * k, x + r * xb, k);
        calls++;
        t = now_s() - t0;
    } while (t < secs);
    printf("\nquantize activations to %s: %.1f M values/s\n", di->name, (double)k * rows * calls / t * 1e-6);
    free(x);
    return 0;
}

int main(int argc, char **argv) {
    uint32_t type = argc > 1 ? parse_type(argv[1]) : ENG_Q_Q8_0;
    double secs = argc > 2 ? atof(argv[2]) : 0.25;
    const eng_qtype_info *ti = eng_qtype_get(type);
    if (!ti || !ti->supported) {
        fprintf(stderr, "unknown or unsupported type\n");
        return 2;
    }
    if (argc > 3 && strncmp(argv[3], "gemv", 4) == 0) {
        float *t = malloc(sizeof(float) * 8192 * 2);
        const bool cached = strcmp(argv[3], "gemv-cache") == 0;
        int rc = t ? gemv_1b(type, secs, t, strcmp(argv[3], "gemv") == 0, cached) : 1;
        free(t);
        return rc;
    }
    const eng_qtype_info *di = eng_qtype_get(ti->dot_type);
    eng_simd_level top = eng_simd_detect();
    printf("kvquant-bench: weights %s, activations %s, best level %s, one thread\n", ti->name, di->name,
           eng_simd_name(top));
    float *tmp = malloc(sizeof(float) * 4096 * 128);
    if (!tmp) return 1;
    /* cases: every level on the rows, then (packed types) every level with a packed kernel on the packed layout */
    enum { MAX_CASES = 8 };
    int case_level[MAX_CASES], n_cases = 0;
    bool case_packed[MAX_CASES];
    for (int l = ENG_SIMD_SCALAR; l <= (int)top; l++) case_level[n_cases] = l, case_packed[n_cases++] = false;
    const bool packable = eng_wpack_bytes(type, 16, 1536) > 0;
    for (int l = ENG_SIMD_AVX2; packable && l <= (int)top; l++)
        case_level[n_cases] = l, case_packed[n_cases++] = true;
    double gflops[MAX_CASES][3][5] = {{{0}}}; /* case, shape, m */
    for (int li = 0; li < n_cases; li++)
        if (bench_level(type, case_level[li], case_packed[li], secs, tmp, gflops[li]) != 0) return 1;
    if (bench_quantize(type, secs, tmp) != 0) return 1;
    if (packable && top >= ENG_SIMD_AVX2)
        for (int l = ENG_SIMD_AVX2; l <= (int)top; l++) model_pass(type, (eng_simd_level)l, true, tmp);
    else
        model_pass(type, top, false, tmp);
    free(tmp);
    return 0;
}
