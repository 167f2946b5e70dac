/*
 * test_quant_mxfp4.c: the MXFP4 tensor type (GGML type 39; engine/kernels/quant_mxfp4.c and the tiles of
 * quant_avx2.c / quant_avx512.c).
 *   - bit-exact with llama.cpp: the blocks and floats of scripts/ref-mxfp4-gen.c (regenerated here with the same
 *     xorshift64 stream) dequantized and quantized at every level hash as ggml's did (tests/reference/mxfp4-ggml.json,
 *     recorded by scripts/ref-mxfp4.py through llama.cpp's libggml-base);
 *   - the quantizer against a brute-force reference of its rule on random blocks (ties, zeros, tiny and huge
 *     magnitudes): the exponent is floor(log2(max |x|)) - 2, each code a nearest level, the first on ties;
 *   - the dot product (scalar, then every SIMD level through eng_vec_dot and eng_gemm, which test_quant.c also
 *     covers) against the dequantized rows in double;
 *   - eng_check_row_data refuses the NaN exponent 0xFF and only it;
 *   - `kvserve quantize IN OUT MXFP4_MOE` tensor-exact against llama-quantize (tests/reference/mxfp4-moe-quantize.json,
 *     recorded by scripts/ref-mxfp4.py --quantize): a mkmodel f32 llama model with 3-D expert tensors added
 *     (helper_moe_input.h): the experts become MXFP4, the other matrices Q8_0 (output included), 1-D tensors and
 *     norms stay f32, a 3-D tensor whose rows are not whole MXFP4 blocks falls back to f16.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine/engine.h"
#include "engine/kernels/quant.h"
#include "helper_moe_input.h"
#include "helper_shared.h"
#include <unistd.h>

/* ---- the generator of scripts/ref-mxfp4-gen.c (see there) ------------------------------------------------------ */
static uint64_t next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float gen_value(uint64_t *s, int64_t b, int exp) {
    uint64_t d = next(s);
    float sc = ldexpf(1.f, exp);
    switch (b % 4) {
    case 0: return ((float)(d >> 40) / 16777216.f * 2.f - 1.f) * sc;
    case 1: return (d & 3) == 0 ? 0.f : ((float)(d >> 40) / 16777216.f * 2.f - 1.f) * sc;
    case 2: return ((float)(d % 16) * 0.25f + 0.125f) * ((d >> 20) & 1 ? -sc : sc);
    default: return b % 16 == 3 ? 0.f : ((float)(d >> 40) / 16777216.f * 2.f - 1.f) * sc;
    }
}

static void gen_inputs(int64_t nb, uint8_t *blk, float *f) {
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < nb * 17; i++) {
        uint64_t d = next(&s);
        blk[i] = (uint8_t)(i % 17 == 0 ? d % 255 : d & 0xFF);
    }
    for (int64_t b = 0; b < nb; b++) {
        int exp = (int)(next(&s) % 61) - 30;
        for (int j = 0; j < 32; j++) f[b * 32 + j] = gen_value(&s, b, exp);
    }
}

static void hex(const uint8_t *p, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", p[i]);
}

Test(quant_mxfp4, type_facts) {
    const eng_qtype_info *t = eng_qtype_get(ENG_Q_MXFP4);
    cr_assert_not_null(t);
    cr_assert_str_eq(t->name, "mxfp4");
    cr_assert_eq(t->block_elems, 32);
    cr_assert_eq(t->block_bytes, 17);
    cr_assert(t->supported);
    cr_assert_eq(t->dot_type, ENG_Q_Q8_0);
    cr_assert_eq(eng_qtype_row_bytes(ENG_Q_MXFP4, 2880), (size_t)90 * 17);
    cr_assert(eng_quantize_weights_supported(ENG_Q_MXFP4));
}

Test(quant_mxfp4, matches_ggml) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/reference/mxfp4-ggml.json", KVSERVE_SOURCE_DIR);
    cJSON *ref = kvt_read_json(path);
    const int64_t nb = (int64_t)cJSON_GetObjectItem(ref, "n_blocks")->valuedouble;
    cr_assert(nb > 0 && nb <= 1 << 20);
    uint8_t *blk = malloc((size_t)nb * 17), *q = malloc((size_t)nb * 17);
    float *f = malloc((size_t)nb * 32 * 4), *y = malloc((size_t)nb * 32 * 4);
    cr_assert(blk && q && f && y);
    gen_inputs(nb, blk, f);
    uint8_t h[32];
    char hx[65];
    for (int l = ENG_SIMD_SCALAR; l <= (int)eng_simd_detect(); l++) {
        cr_assert_eq(eng_dequantize_row_l((eng_simd_level)l, ENG_Q_MXFP4, blk, y, nb * 32), 0);
        kvs_sha256(y, (size_t)nb * 32 * 4, h);
        hex(h, 32, hx);
        cr_assert_str_eq(hx, cJSON_GetObjectItem(ref, "dequant_sha256")->valuestring, "dequantized (%s)",
                         eng_simd_name((eng_simd_level)l));
        memset(q, 0xAB, (size_t)nb * 17);
        cr_assert_eq(eng_quantize_row_l((eng_simd_level)l, ENG_Q_MXFP4, f, q, nb * 32), 0);
        kvs_sha256(q, (size_t)nb * 17, h);
        hex(h, 32, hx);
        if (strcmp(hx, cJSON_GetObjectItem(ref, "quant_sha256")->valuestring)) {
            cJSON *first = cJSON_GetObjectItem(ref, "quant_first4_hex");
            for (int b = 0; b < 4; b++) {
                char bh[35];
                hex(q + 17 * b, 17, bh);
                cr_log_error("block %d: %s (ggml %s)", b, bh, cJSON_GetArrayItem(first, b)->valuestring);
            }
            cr_assert_fail("quantized blocks differ from ggml's (%s)", eng_simd_name((eng_simd_level)l));
        }
    }
    /* the weight quantizer (llama-quantize's) writes the same bytes, in any split of rows */
    memset(q, 0, (size_t)nb * 17);
    cr_assert_eq(eng_quantize_weights(ENG_Q_MXFP4, f, q, nb / 4, 128), 0);
    kvs_sha256(q, (size_t)nb * 17, h);
    hex(h, 32, hx);
    cr_assert_str_eq(hx, cJSON_GetObjectItem(ref, "quant_sha256")->valuestring);
    double sum = 0;
    for (int64_t i = 0; i < nb * 32; i++)
        if (isfinite(y[i])) sum += y[i];
    double want = cJSON_GetObjectItem(ref, "dequant_finite_sum")->valuedouble;
    cr_assert_leq(fabs(sum - want), 1e-9 * fabs(want), "sum %.17g vs %.17g", sum, want);
    cJSON *f8 = cJSON_GetObjectItem(ref, "dequant_first8");
    for (int i = 0; i < 8; i++) cr_assert_eq((double)y[i], cJSON_GetArrayItem(f8, i)->valuedouble);
    free(blk); free(q); free(f); free(y);
    cJSON_Delete(ref);
}

/* The value of code c times 2^(e - 127), from the e2m1 definition (sign, 2 exponent bits, 1 mantissa bit). */
static double level(int c, int e) {
    int ex = (c >> 1) & 3, man = c & 1;
    double mag = ex == 0 ? 0.5 * man : ldexp(1.0 + 0.5 * man, ex - 1);
    return (c & 8 ? -mag : mag) * ldexp(1.0, e - 127);
}

Test(quant_mxfp4, quantizer_is_nearest_level) {
    uint64_t s = 12345;
    float x[32];
    uint8_t b[17];
    for (int iter = 0; iter < 20000; iter++) {
        int exp = (int)(next(&s) % 200) - 130, kind = iter % 5;
        for (int j = 0; j < 32; j++) {
            uint64_t d = next(&s);
            float u = (float)(d >> 40) / 16777216.f * 2.f - 1.f;
            x[j] = kind == 0 ? 0.f                                                       /* all zero */
                   : kind == 1 ? (float)level((int)(d % 16), 127) * ldexpf(1.f, exp % 60) /* on the grid */
                   : kind == 2 ? ((float)(d % 16) * 0.25f + 0.125f) * ldexpf(1.f, exp % 60) /* midpoints */
                               : ldexpf(u, exp);                                          /* anything */
        }
        cr_assert_eq(eng_quantize_row(ENG_Q_MXFP4, x, b, 32), 0);
        float amax = 0.f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        int want_e = 0;
        if (amax > 0.f) {
            int fe;
            (void)frexpf(amax, &fe); /* amax = m * 2^fe, m in [0.5, 1): floor(log2 amax) = fe - 1 */
            want_e = (fe - 1 + 125) & 0xFF;
        }
        /* log2f may round up just below a power of two; the exact floor is what ggml's rule means there */
        cr_assert(b[0] == want_e || (amax > 0.f && b[0] == ((want_e + 1) & 0xFF) && log2f(amax) == ceilf(log2f(amax))),
                  "iter %d: e %d, want %d (amax %a)", iter, b[0], want_e, (double)amax);
        float d = ldexpf(1.f, b[0] - 128);
        if (b[0] < 2) d = b[0] == 0 ? 0x1p-128f : 0x1p-127f;
        for (int j = 0; j < 32; j++) {
            int c = j < 16 ? (b[1 + j] & 15) : (b[1 + j - 16] >> 4);
            /* the first code (in 0..15 order) whose level is nearest, in the quantizer's float arithmetic */
            static const int8_t kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
            int best = 0;
            for (int k = 1; k < 16; k++)
                if (fabsf((float)kv[k] * d - x[j]) < fabsf((float)kv[best] * d - x[j])) best = k;
            cr_assert_eq(c, best, "iter %d elem %d: code %d, want %d (x %a, e %d)", iter, j, c, best, (double)x[j],
                         b[0]);
        }
    }
}

Test(quant_mxfp4, dot_levels_against_double) {
    uint64_t s = 777;
    enum { KMAX = 32 * 96 };
    uint8_t w[KMAX / 32 * 17], xq[KMAX / 32 * 34];
    float wf[KMAX], xf[KMAX], tmp[KMAX];
    for (int iter = 0; iter < 400; iter++) {
        int64_t n = 32 * (int64_t)(1 + next(&s) % 96);
        for (int64_t i = 0; i < n / 32 * 17; i++) w[i] = (uint8_t)next(&s);
        for (int64_t b = 0; b < n / 32; b++) w[b * 17] = (uint8_t)(110 + next(&s) % 30);
        for (int64_t i = 0; i < n; i++) tmp[i] = (float)((int64_t)(next(&s) % 2001) - 1000) / 250.f;
        cr_assert_eq(eng_quantize_row(ENG_Q_Q8_0, tmp, xq, n), 0);
        cr_assert_eq(eng_dequantize_row(ENG_Q_MXFP4, w, wf, n), 0);
        cr_assert_eq(eng_dequantize_row(ENG_Q_Q8_0, xq, xf, n), 0);
        double exact = 0, abs_sum = 0;
        for (int64_t i = 0; i < n; i++) {
            exact += (double)wf[i] * xf[i];
            abs_sum += fabs((double)wf[i] * xf[i]);
        }
        float sc = eng_vec_dot(ENG_SIMD_SCALAR, ENG_Q_MXFP4, n, w, xq);
        cr_assert_leq(fabs(sc - exact), 1e-5 * abs_sum + 1e-30, "scalar n %lld: %.9g vs %.9g", (long long)n,
                      (double)sc, exact);
        for (int l = ENG_SIMD_AVX2; l <= (int)eng_simd_detect(); l++) {
            float v = eng_vec_dot((eng_simd_level)l, ENG_Q_MXFP4, n, w, xq);
            cr_assert_leq(fabs((double)v - sc), 1e-5 * abs_sum + 1e-30, "%s n %lld: %.9g vs %.9g",
                          eng_simd_name((eng_simd_level)l), (long long)n, (double)v, (double)sc);
        }
    }
}

Test(quant_mxfp4, check_row_data_refuses_nan_exponent) {
    uint8_t b[3 * 17];
    memset(b, 0x77, sizeof b);
    for (int e = 0; e < 256; e++) {
        b[17] = (uint8_t)e;
        int64_t bad = -1;
        int rc = eng_check_row_data(ENG_Q_MXFP4, b, 96, &bad);
        if (e == 0xFF) {
            cr_assert_eq(rc, ENG_ERR_FORMAT);
            cr_assert_eq(bad, 32);
        } else {
            cr_assert_eq(rc, 0, "e %d", e);
        }
    }
}

Test(quant_mxfp4, moe_quantize_matches_llama_quantize) {
    char path[4096], dir[] = "/tmp/kvs-mxfp4-moe-XXXXXX", base[256], in[256], out[256], err[512];
    snprintf(path, sizeof path, "%s/tests/reference/mxfp4-moe-quantize.json", KVSERVE_SOURCE_DIR);
    cJSON *ref = kvt_read_json(path);
    cr_assert_not_null(mkdtemp(dir));
    snprintf(base, sizeof base, "%s/base.gguf", dir);
    snprintf(in, sizeof in, "%s/in.gguf", dir);
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    const char *args[40];
    int n = 0;
    args[n++] = "mkmodel";
    args[n++] = "-o";
    args[n++] = base;
    cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItem(ref, "mkmodel_args")) {
        cr_assert(cJSON_IsString(a) && n < 38);
        args[n++] = a->valuestring;
    }
    args[n] = NULL;
    cr_assert_eq(kvt_run_kvserve(dir, args, NULL), 0, "kvserve mkmodel failed");
    cr_assert_eq(kvt_moe_input(base, in, err, sizeof err), 0, "%s", err);
    size_t len = 0;
    char *data = kvt_read_file(in, &len);
    cr_assert_not_null(data);
    uint8_t h[32];
    char hx[65];
    kvs_sha256(data, len, h);
    free(data);
    hex(h, 32, hx);
    cr_assert_str_eq(hx, cJSON_GetObjectItem(ref, "input_sha256")->valuestring,
                     "the input model changed: regenerate with scripts/ref-mxfp4.py --quantize");
    const char *qargs[] = {"quantize", in, out, "MXFP4_MOE", "--threads", "2", NULL};
    cr_assert_eq(kvt_run_kvserve(dir, qargs, NULL), 0, "kvserve quantize failed");
    eng_gguf *g = NULL;
    cr_assert_eq(eng_gguf_open(out, &g, err, sizeof err), 0, "%s", err);
    cJSON *want = cJSON_GetObjectItem(ref, "tensors");
    cr_assert_eq(eng_gguf_n_tensors(g), cJSON_GetArraySize(want));
    int n_mxfp4 = 0, bad = 0;
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        cJSON *w = cJSON_GetObjectItem(want, name);
        cr_assert_not_null(w, "tensor %s is not in the reference", name);
        const char *wt = cJSON_GetArrayItem(w, 0)->valuestring, *wh = cJSON_GetArrayItem(w, 1)->valuestring;
        kvt_tensor_sha256(t, hx);
        if (strcmp(eng_gguf_type_name(t->type), wt) || strcmp(hx, wh)) {
            cr_log_error("%s: %s %s, llama-quantize %s %s", name, eng_gguf_type_name(t->type), hx, wt, wh);
            bad++;
        }
        n_mxfp4 += t->type == ENG_Q_MXFP4;
    }
    cr_assert_eq(bad, 0, "%d tensors differ from llama-quantize's", bad);
    cr_assert_eq(n_mxfp4, 6, "the 6 expert tensors are MXFP4");
    const eng_gguf_kv *ft = eng_gguf_find(g, "general.file_type");
    cr_assert(ft && ft->v.u64 == 38, "general.file_type is llama.cpp's MXFP4_MOE (38)");
    eng_gguf_close(g);
    unlink(base);
    unlink(in);
    unlink(out);
    rmdir(dir);
    cJSON_Delete(ref);
}
