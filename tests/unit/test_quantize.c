/*
 * test_quantize.c: the weight quantizers (engine/quantize.c) and `kvserve quantize`.
 *   - llama-quantize's output on shared/models/synthetic/syn-llama-f16.gguf: every tensor's type and the SHA-256 of
 *     its bytes (shared/reference/quantize/syn-llama-f16.<TYPE>.json) for Q4_0, Q8_0, Q4_K_M, Q5_K_M and Q6_K
 *     (skipped without shared/);
 *   - every quantizer round-trips through the engine's dequantizer within its format's error on random data,
 *     rows are independent (a matrix at once = row by row), and edge blocks (zeros, constants, huge and tiny
 *     magnitudes, NaN) behave;
 *   - the per-tensor type policy on models made here (layer order, tied embeddings, fallbacks, 1-D tensors),
 *     the metadata and alignment of the output, thread-count independence;
 *   - the command's error paths: nonzero exit, a message naming the file (and tensor), no output or temporary
 *     file left behind.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "engine/kernels/quant.h"
#include "helper_rng.h"
#include "common/common.h"
#include "helper_shared.h"

/* ---- helpers ------------------------------------------------------------------------------------------------ */
static void tmpdir(char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/kvs-quantize-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void rmtree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* Names in dir that start with prefix (the output and its temporary files). */
static int count_prefixed(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
    closedir(d);
    return n;
}

/* A normal-ish value: the sum of 4 uniforms (variance 4/3 * a^2 / ... enough for shapes of real weights). */
static float rng_normalish(rng *r, float a) {
    return (rng_uniform(r, a) + rng_uniform(r, a) + rng_uniform(r, a) + rng_uniform(r, a)) * 0.5f;
}

/* A synthetic model description for the writer. */
typedef struct mk_tensor {
    const char *name;
    uint32_t type;        /* F32, F16 or BF16 (values are random), or another type (zeros) */
    int64_t ne0, ne1;     /* ne1 = 1: a 1-D tensor */
} mk_tensor;

/* Writes a llama GGUF with these tensors (in this order) and n_layer blocks to path. nan_in, when not NULL, names
 * a tensor whose value 7 is a NaN. align 0: the default. */
static void write_model(const char *path, const mk_tensor *t, int n, int n_layer, uint32_t align, const char *nan_in) {
    eng_gguf_writer *w;
    cr_assert_eq(eng_gguf_writer_create(&w), 0);
    cr_assert_eq(eng_gguf_add_str(w, "general.architecture", "llama", 5), 0);
    cr_assert_eq(eng_gguf_add_str(w, "general.name", "quantize-test", 13), 0);
    if (align) cr_assert_eq(eng_gguf_add_u32(w, "general.alignment", align), 0);
    cr_assert_eq(eng_gguf_add_u32(w, "llama.block_count", (uint32_t)n_layer), 0);
    cr_assert_eq(eng_gguf_add_u32(w, "llama.attention.head_count", 4), 0);
    cr_assert_eq(eng_gguf_add_u32(w, "llama.attention.head_count_kv", 2), 0);
    cr_assert_eq(eng_gguf_add_u32(w, "general.file_type", 1), 0);
    cr_assert_eq(eng_gguf_add_f32(w, "test.marker", 1.25f), 0);
    rng r = {0x9e3779b97f4a7c15ull};
    for (int i = 0; i < n; i++) {
        int64_t ne[2] = {t[i].ne0, t[i].ne1};
        uint32_t nd = t[i].ne1 > 1 ? 2 : 1;
        size_t nbytes = eng_gguf_tensor_bytes(t[i].type, nd, ne);
        cr_assert_gt(nbytes, 0, "%s", t[i].name);
        uint8_t *data = calloc(1, nbytes);
        cr_assert_not_null(data);
        int64_t nv = t[i].ne0 * t[i].ne1;
        if (t[i].type == ENG_Q_F32 || t[i].type == ENG_Q_F16 || t[i].type == ENG_Q_BF16) {
            float *v = malloc((size_t)nv * sizeof *v);
            cr_assert_not_null(v);
            for (int64_t k = 0; k < nv; k++) v[k] = rng_normalish(&r, 0.05f);
            if (nan_in && !strcmp(nan_in, t[i].name)) v[7] = NAN;
            cr_assert_eq(eng_quantize_row(t[i].type, v, data, nv), 0);
            free(v);
        }
        cr_assert_eq(eng_gguf_add_tensor(w, t[i].name, t[i].type, nd, ne, data, nbytes), 0, "%s", t[i].name);
        free(data);
    }
    char err[512];
    cr_assert_eq(eng_gguf_write(w, path, err, sizeof err), 0, "%s", err);
    eng_gguf_writer_free(w);
}

static int run_quantize(const char *dir, const char *in, const char *out, const char *type, const char *threads,
                        char **log) {
    const char *args[] = {"quantize", in, out, type, threads ? "--threads" : NULL, threads, NULL};
    return kvt_run_kvserve(dir, args, log);
}

static bool name_is(const eng_gguf_tensor *t, const char *name) {
    return t->name.len == strlen(name) && !memcmp(t->name.ptr, name, t->name.len);
}

static uint32_t out_type(const eng_gguf *g, const char *name) {
    const eng_gguf_tensor *t = eng_gguf_find_tensor(g, name);
    cr_assert_not_null(t, "no tensor %s", name);
    return t->type;
}

/* ---- llama-quantize's hashes -------------------------------------------------------------------------------- */
/* The file at out against want ({tensor name: [stored type, sha256 of its bytes]}, every tensor of the file);
 * returns the number of tensors matched. */
static int compare_hashes(const char *out, const cJSON *want, const char *type) {
    eng_gguf *g;
    char err[512];
    cr_assert_eq(eng_gguf_open(out, &g, err, sizeof err), 0, "%s", err);
    cr_assert_eq(eng_gguf_n_tensors(g), cJSON_GetArraySize(want));
    int matched = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, want) {
        const eng_gguf_tensor *t = eng_gguf_find_tensor(g, e->string);
        cr_assert_not_null(t, "%s: no tensor %s", type, e->string);
        const char *wt = cJSON_GetStringValue(cJSON_GetArrayItem(e, 0));
        const char *wh = cJSON_GetStringValue(cJSON_GetArrayItem(e, 1));
        cr_assert(wt && wh);
        cr_assert(!strcasecmp(eng_gguf_type_name(t->type), wt), "%s %s: type %s, llama-quantize %s", type,
                  e->string, eng_gguf_type_name(t->type), wt);
        char hex[65];
        uint8_t d[32];
        kvs_sha256(t->data, t->nbytes, d);
        for (int k = 0; k < 32; k++) snprintf(hex + 2 * k, 3, "%02x", d[k]);
        cr_assert_str_eq(hex, wh, "%s %s: bytes differ from llama-quantize's", type, e->string);
        matched++;
    }
    eng_gguf_close(g);
    return matched;
}

static void check_reference(const char *type) {
    char in[1024], ref[1024];
    snprintf(in, sizeof in, "%s/models/synthetic/syn-llama-f16.gguf", kvt_shared_dir());
    snprintf(ref, sizeof ref, "%s/reference/quantize/syn-llama-f16.%s.json", kvt_shared_dir(), type);
    if (access(in, R_OK) != 0 || access(ref, R_OK) != 0) {
        cr_skip_test("shared material absent (%s or %s): the llama-quantize hash check is skipped", in, ref);
        return;
    }
    char dir[64], out[256];
    tmpdir(dir, sizeof dir);
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    char *log = NULL;
    cr_assert_eq(run_quantize(dir, in, out, type, "2", &log), 0, "%s", log);
    free(log);
    cJSON *want = kvt_read_json(ref);
    cr_assert_eq(compare_hashes(out, want, type), 39);
    cJSON_Delete(want);
    rmtree(dir);
}

Test(quantize, llama_quantize_hashes_q4_0) { check_reference("Q4_0"); }
Test(quantize, llama_quantize_hashes_q8_0) { check_reference("Q8_0"); }
Test(quantize, llama_quantize_hashes_q4_k_m) { check_reference("Q4_K_M"); }
Test(quantize, llama_quantize_hashes_q5_k_m) { check_reference("Q5_K_M"); }
Test(quantize, llama_quantize_hashes_q6_k) { check_reference("Q6_K"); }

/* A model made by mkmodel with the reference's mkmodel_args, quantized to type by `kvserve quantize`, against
 * llama-quantize's output for the same file (tests/reference/quantize/<stem>.json, recorded by
 * scripts/ref-mkmodel.py): every tensor's stored type and bytes. */
static void check_mk_reference(const char *stem, const char *type, int min_tensors) {
    char ref[1024], dir[64], in[256], out[256];
    snprintf(ref, sizeof ref, "%s/tests/reference/quantize/%s.json", KVSERVE_SOURCE_DIR, stem);
    cJSON *root = kvt_read_json(ref);
    tmpdir(dir, sizeof dir);
    snprintf(in, sizeof in, "%s/in.gguf", dir);
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    const char *args[64] = {"mkmodel", "-o", in};
    int n = 3;
    const cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItem(root, "mkmodel_args")) {
        cr_assert(cJSON_IsString(a) && n < 63);
        args[n++] = a->valuestring;
    }
    args[n] = NULL;
    cr_assert_eq(kvt_run_kvserve(dir, args, NULL), 0, "kvserve mkmodel failed");
    char *log = NULL;
    cr_assert_eq(run_quantize(dir, in, out, type, "2", &log), 0, "%s", log);
    free(log);
    const cJSON *want = cJSON_GetObjectItem(root, "tensors");
    int matched = compare_hashes(out, want, type);
    cr_assert_eq(matched, cJSON_GetArraySize(want));
    cr_assert_gt(matched, min_tensors);
    cJSON_Delete(root);
    rmtree(dir);
}

/* A qwen3moe model made by mkmodel (3-D stacked expert tensors, 3 layers: ffn_down_exps of the last one raised to
 * Q6_K by Q4_K_M's policy, the router kept in f32) against llama-quantize's Q4_K_M of the same file. */
Test(quantize, llama_quantize_hashes_qwen3moe_q4_k_m) { check_mk_reference("mk-qwen3moe-f16.Q4_K_M", "Q4_K_M", 20); }
/* A gpt-oss model (4 layers: experts MXFP4, the other matrices Q8_0; the router, its and the experts' biases, the
 * sinks and the norms kept in f32) against llama-quantize's MXFP4_MOE of the same file. */
Test(quantize, llama_quantize_hashes_gpt_oss_mxfp4_moe) {
    check_mk_reference("mk-gpt-oss-f16.MXFP4_MOE", "MXFP4_MOE", 70);
}

/* ---- quantizers ---------------------------------------------------------------------------------------------- */
/* Per format: the largest error of one value relative to its block's max |x| (the group one scale covers; the
 * super-block for the k-quants, whose 6-bit sub-block scales are relative to it), and the largest relative RMS
 * error over a row of normal-ish data. The 32-value bounds follow from the formats (half a step of 2^bits - 1
 * levels over the block's range, a full step for Q4_0/Q5_0's clamped extreme code, plus the fp16 scale's
 * rounding); the k-quant ones and the RMS ones are measured on these seeds (q4_K 0.094 / 0.073, q5_K 0.057 /
 * 0.035, q6_K 0.016 / 0.018) with margin. */
typedef struct type_bound { uint32_t type; double max_rel, rms_rel; } type_bound;
static const type_bound k_bounds[] = {
    {ENG_Q_Q8_0, 0.0045, 0.007}, {ENG_Q_Q4_0, 0.13, 0.1},   {ENG_Q_Q4_1, 0.07, 0.09},  {ENG_Q_Q5_0, 0.065, 0.05},
    {ENG_Q_Q5_1, 0.036, 0.045},  {ENG_Q_Q4_K, 0.11, 0.085}, {ENG_Q_Q5_K, 0.065, 0.045}, {ENG_Q_Q6_K, 0.025, 0.022},
};

Test(quantize, round_trip_within_format_error) {
    enum { NCOL = 1024, NROW = 24 };
    float *x = malloc(sizeof(float) * NCOL * NROW), *y = malloc(sizeof(float) * NCOL * NROW);
    uint8_t *q = malloc(NCOL * NROW * 2);
    cr_assert(x && y && q);
    for (size_t bi = 0; bi < sizeof k_bounds / sizeof k_bounds[0]; bi++) {
        const type_bound *b = &k_bounds[bi];
        const eng_qtype_info *ti = eng_qtype_get(b->type);
        rng r = {0x1234567ull + bi};
        for (int row = 0; row < NROW; row++) {
            float *xr = x + row * NCOL;
            /* rows of several shapes: normal-ish, uniform, shifted (all positive), sparse outliers */
            for (int i = 0; i < NCOL; i++) {
                float v = rng_normalish(&r, 1.f);
                switch (row % 4) {
                case 1: v = rng_uniform(&r, 3.f); break;
                case 2: v = 2.f + rng_uniform(&r, 1.f); break;
                case 3: v = rng_int(&r, 50) == 0 ? v * 20.f : v; break;
                default: break;
                }
                xr[i] = v * (row < 12 ? 0.02f : 300.f);
            }
        }
        cr_assert_eq(eng_quantize_weights(b->type, x, q, NROW, NCOL), 0, "%s", ti->name);
        size_t rb = eng_qtype_row_bytes(b->type, NCOL);
        for (int row = 0; row < NROW; row++) {
            cr_assert_eq(eng_dequantize_row(b->type, q + row * rb, y + row * NCOL, NCOL), 0);
            const float *xr = x + row * NCOL, *yr = y + row * NCOL;
            int group = b->type == ENG_Q_Q6_K ? 16 : 32; /* the group one scale covers */
            double se = 0, sx = 0;
            for (int g0 = 0; g0 < NCOL; g0 += group) {
                float amax = 0;
                for (int i = g0; i < g0 + group; i++) amax = fmaxf(amax, fabsf(xr[i]));
                /* the k-quants' super-block scale limits small groups beside large ones: bound by the
                 * super-block's max for them */
                if (ti->block_elems == 256) {
                    int s0 = g0 / 256 * 256;
                    amax = 0;
                    for (int i = s0; i < s0 + 256; i++) amax = fmaxf(amax, fabsf(xr[i]));
                }
                for (int i = g0; i < g0 + group; i++) {
                    double e = fabs((double)xr[i] - yr[i]);
                    cr_assert_leq(e, b->max_rel * amax + 1e-30, "%s row %d value %d: %g -> %g (block max %g)",
                                  ti->name, row, i, xr[i], yr[i], amax);
                    se += e * e;
                    sx += (double)xr[i] * xr[i];
                }
            }
            if (row % 4 == 0)
                cr_assert_leq(sqrt(se / sx), b->rms_rel, "%s row %d: relative RMS error %g", ti->name, row,
                              sqrt(se / sx));
        }
        /* rows are independent: row by row gives the same bytes as the whole matrix */
        uint8_t *one = malloc(rb);
        cr_assert_not_null(one);
        for (int row = 0; row < NROW; row++) {
            cr_assert_eq(eng_quantize_weights(b->type, x + row * NCOL, one, 1, NCOL), 0);
            cr_assert(!memcmp(one, q + row * rb, rb), "%s row %d differs when quantized alone", ti->name, row);
        }
        free(one);
    }
    free(x);
    free(y);
    free(q);
}

Test(quantize, edge_blocks) {
    enum { N = 512 };
    static const uint32_t types[] = {ENG_Q_Q8_0, ENG_Q_Q4_0, ENG_Q_Q4_1, ENG_Q_Q5_0, ENG_Q_Q5_1,
                                     ENG_Q_Q4_K, ENG_Q_Q5_K, ENG_Q_Q6_K};
    float x[N], y[N];
    uint8_t q[N * 4]; /* room for f32 rows too */
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t t = types[ti];
        const char *name = eng_qtype_get(t)->name;
        /* all zeros: exact zeros back, finite scales */
        memset(x, 0, sizeof x);
        cr_assert_eq(eng_quantize_weights(t, x, q, 1, N), 0);
        cr_assert_eq(eng_check_row_data(t, q, N, NULL), 0, "%s zeros", name);
        cr_assert_eq(eng_dequantize_row(t, q, y, N), 0);
        for (int i = 0; i < N; i++) cr_assert_eq(y[i], 0.f, "%s zeros: %g at %d", name, y[i], i);
        /* constants, positive and negative: within 1% */
        for (int s = -1; s <= 1; s += 2) {
            for (int i = 0; i < N; i++) x[i] = 0.37f * (float)s;
            cr_assert_eq(eng_quantize_weights(t, x, q, 1, N), 0);
            cr_assert_eq(eng_dequantize_row(t, q, y, N), 0);
            for (int i = 0; i < N; i++)
                cr_assert_leq(fabsf(y[i] - x[i]), 0.01f * 0.37f, "%s constant %g: %g", name, x[i], y[i]);
        }
        /* the largest fp16 magnitudes (an f16 model's extreme weights): finite scales, right signs */
        for (int i = 0; i < N; i++) x[i] = (i % 3 == 0 ? -65504.f : i % 3 == 1 ? 65504.f : 1000.f);
        cr_assert_eq(eng_quantize_weights(t, x, q, 1, N), 0);
        cr_assert_eq(eng_check_row_data(t, q, N, NULL), 0, "%s: fp16 extremes give a non-finite scale", name);
        cr_assert_eq(eng_dequantize_row(t, q, y, N), 0);
        /* (Q4_0 / Q5_0 map the first largest magnitude to the extreme code -8 / -16 and clamp the other sign) */
        for (int i = 0; i < N; i += 3)
            cr_assert(y[i] < -50000.f && y[i + 1] > 50000.f, "%s: %g %g", name, y[i], y[i + 1]);
        /* f32 values too large for an fp16 scale: the check reports the block (llama-quantize fails there) */
        for (int i = 0; i < N; i++) x[i] = (i & 1) ? 3e9f : -2e9f;
        cr_assert_eq(eng_quantize_weights(t, x, q, 1, N), 0);
        int64_t bad = -1;
        cr_assert_eq(eng_check_row_data(t, q, N, &bad), ENG_ERR_FORMAT, "%s: huge values not reported", name);
        cr_assert_eq(bad, 0);
        /* tiny magnitudes, normal and subnormal float32: no trap, and they dequantize to (almost) zero */
        for (float mag = 1e-30f; mag > 1e-44f; mag *= 1e-5f) {
            for (int i = 0; i < N; i++) x[i] = (i % 5 - 2) * mag;
            cr_assert_eq(eng_quantize_weights(t, x, q, 1, N), 0);
            cr_assert_eq(eng_check_row_data(t, q, N, NULL), 0);
            cr_assert_eq(eng_dequantize_row(t, q, y, N), 0);
            for (int i = 0; i < N; i++) cr_assert_leq(fabsf(y[i]), 1e-20f, "%s tiny %g: %g", name, x[i], y[i]);
        }
        /* NaN and infinity: garbage in, but no crash or undefined behaviour (the sanitizer build checks) */
        for (int i = 0; i < N; i++) x[i] = i == 5 ? NAN : i == 300 ? INFINITY : 0.1f;
        cr_assert_eq(eng_quantize_weights(t, x, q, 1, N), 0);
    }
    /* the input check finds NaN and infinity in f32, f16 and bf16 rows */
    static const uint32_t ftypes[] = {ENG_Q_F32, ENG_Q_F16, ENG_Q_BF16};
    for (size_t i = 0; i < 3; i++) {
        for (int k = 0; k < N; k++) x[k] = 0.5f;
        cr_assert_eq(eng_quantize_row(ftypes[i], x, q, N), 0);
        cr_assert_eq(eng_check_row_data(ftypes[i], q, N, NULL), 0);
        x[77] = (i == 1) ? -INFINITY : NAN;
        cr_assert_eq(eng_quantize_row(ftypes[i], x, q, N), 0);
        int64_t bad = -1;
        cr_assert_eq(eng_check_row_data(ftypes[i], q, N, &bad), ENG_ERR_FORMAT);
        cr_assert_eq(bad, 77);
    }
    /* arguments */
    cr_assert_eq(eng_quantize_weights(ENG_Q_Q4_K, x, q, 1, 100), ENG_ERR_INVALID);
    cr_assert_eq(eng_quantize_weights(ENG_Q_Q8_K, x, q, 1, 256), ENG_ERR_UNSUPPORTED);
    cr_assert_eq(eng_quantize_weights(ENG_Q_Q4_0, NULL, q, 1, 32), ENG_ERR_INVALID);
    cr_assert_eq(eng_quantize_weights(ENG_Q_Q4_0, x, q, 0, 32), 0);
}

/* ---- the type policy ----------------------------------------------------------------------------------------- */
/* 12 blocks written in a scrambled order: llama-quantize visits them by layer number, so use_more_bits(i, 12)
 * raises layers 0, 3, 6, 9, 10 and 11 (alphabetical order would pick others). Tied embeddings. */
static void policy_model(const char *path, uint32_t align) {
    enum { L = 12 };
    static char names[L * 6][40];
    mk_tensor t[L * 6 + 2];
    int n = 0;
    static const int order[L] = {7, 2, 11, 0, 5, 9, 1, 10, 3, 8, 6, 4};
    for (int k = 0; k < L; k++) {
        int l = order[k];
        static const char *const parts[6] = {"attn_norm.weight", "attn_q.weight", "attn_v.weight", "ffn_down.weight",
                                             "ffn_up.weight", "attn_output.weight"};
        for (int p = 0; p < 6; p++) {
            char *nm = names[k * 6 + p];
            snprintf(nm, 40, "blk.%d.%s", l, parts[p]);
            int64_t ne0 = p == 3 ? 512 : 256, ne1 = p == 0 ? 1 : 64;
            if (p == 5) ne0 = 288; /* 288 = 9 * 32: Q4_K falls back to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0 */
            t[n++] = (mk_tensor){nm, p == 1 ? ENG_Q_BF16 : p == 4 ? ENG_Q_F32 : ENG_Q_F16, ne0, ne1};
        }
    }
    t[n++] = (mk_tensor){"token_embd.weight", ENG_Q_F16, 256, 40};
    t[n++] = (mk_tensor){"output_norm.weight", ENG_Q_F32, 256, 1};
    write_model(path, t, n, L, align, NULL);
}

static bool more_bits_12(int l) { return l == 0 || l == 3 || l == 6 || l == 9 || l == 10 || l == 11; }

Test(quantize, type_policy_and_metadata) {
    char dir[64], in[256], out[256];
    tmpdir(dir, sizeof dir);
    snprintf(in, sizeof in, "%s/in.gguf", dir);
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    policy_model(in, 64);
    static const struct { const char *type; uint32_t base, raised, emb; uint32_t ftype; } cases[] = {
        {"Q4_K_M", ENG_Q_Q4_K, ENG_Q_Q6_K, ENG_Q_Q6_K, 15}, {"Q5_K_M", ENG_Q_Q5_K, ENG_Q_Q6_K, ENG_Q_Q6_K, 17},
        {"Q6_K", ENG_Q_Q6_K, ENG_Q_Q6_K, ENG_Q_Q6_K, 18},   {"Q4_0", ENG_Q_Q4_0, ENG_Q_Q4_0, ENG_Q_Q6_K, 2},
        {"q8_0", ENG_Q_Q8_0, ENG_Q_Q8_0, ENG_Q_Q8_0, 7},    {"Q4_K_S", ENG_Q_Q4_K, ENG_Q_Q4_K, ENG_Q_Q6_K, 14},
        {"Q5_K_S", ENG_Q_Q5_K, ENG_Q_Q5_K, ENG_Q_Q6_K, 16},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *log = NULL;
        cr_assert_eq(run_quantize(dir, in, out, cases[c].type, "2", &log), 0, "%s: %s", cases[c].type, log);
        free(log);
        eng_gguf *g;
        char err[512];
        cr_assert_eq(eng_gguf_open(out, &g, err, sizeof err), 0, "%s", err);
        cr_assert_eq(eng_gguf_alignment(g), 64, "the input's alignment is kept");
        uint32_t ft = 0, qv = 0;
        cr_assert_eq(eng_gguf_get_u32(g, "general.file_type", &ft), 0);
        cr_assert_eq(ft, cases[c].ftype, "%s: file type %u", cases[c].type, ft);
        cr_assert_eq(eng_gguf_get_u32(g, "general.quantization_version", &qv), 0);
        cr_assert_eq(qv, 2);
        float marker = 0;
        cr_assert_eq(eng_gguf_get_f32(g, "test.marker", &marker), 0, "input keys are copied");
        cr_assert_eq(marker, 1.25f);
        /* tensors are written by layer number, then name */
        cr_assert(name_is(eng_gguf_tensor_at(g, 0), "output_norm.weight"));
        cr_assert(name_is(eng_gguf_tensor_at(g, 1), "token_embd.weight"));
        cr_assert(name_is(eng_gguf_tensor_at(g, 2), "blk.0.attn_norm.weight"));
        cr_assert(name_is(eng_gguf_tensor_at(g, eng_gguf_n_tensors(g) - 1), "blk.11.ffn_up.weight"));
        cr_assert_eq(out_type(g, "token_embd.weight"), cases[c].emb, "%s: tied token_embd", cases[c].type);
        cr_assert_eq(out_type(g, "output_norm.weight"), ENG_Q_F32);
        for (int l = 0; l < 12; l++) {
            char nm[64];
            bool s_first = !strcmp(cases[c].type, "Q4_K_S");
            snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", l);
            cr_assert_eq(out_type(g, nm), ENG_Q_F16, "1-D tensors keep their type");
            snprintf(nm, sizeof nm, "blk.%d.attn_q.weight", l);
            cr_assert_eq(out_type(g, nm), cases[c].base, "%s %s", cases[c].type, nm);
            snprintf(nm, sizeof nm, "blk.%d.ffn_up.weight", l);
            cr_assert_eq(out_type(g, nm), cases[c].base, "%s %s", cases[c].type, nm);
            uint32_t v_want = more_bits_12(l) ? cases[c].raised : cases[c].base;
            uint32_t d_want = v_want;
            if (s_first) {
                v_want = l < 4 ? ENG_Q_Q5_K : ENG_Q_Q4_K;  /* the first 4 attn_v */
                d_want = l < 1 ? ENG_Q_Q5_K : ENG_Q_Q4_K;  /* the first eighth of ffn_down */
            }
            snprintf(nm, sizeof nm, "blk.%d.attn_v.weight", l);
            cr_assert_eq(out_type(g, nm), v_want, "%s %s: %s", cases[c].type, nm, eng_qtype_get(out_type(g, nm))->name);
            snprintf(nm, sizeof nm, "blk.%d.ffn_down.weight", l);
            cr_assert_eq(out_type(g, nm), d_want, "%s %s: %s", cases[c].type, nm, eng_qtype_get(out_type(g, nm))->name);
            snprintf(nm, sizeof nm, "blk.%d.attn_output.weight", l);
            uint32_t fb = cases[c].base == ENG_Q_Q4_K ? ENG_Q_Q5_0 : cases[c].base == ENG_Q_Q5_K ? ENG_Q_Q5_1
                        : cases[c].base == ENG_Q_Q6_K ? ENG_Q_Q8_0 : cases[c].base;
            cr_assert_eq(out_type(g, nm), fb, "%s %s: fallback %s", cases[c].type, nm,
                         eng_qtype_get(out_type(g, nm))->name);
        }
        /* the output loads and dequantizes: every tensor's bytes are where the header says */
        for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
            const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
            cr_assert_eq(eng_check_row_data(t->type, t->data, t->ne[0] * t->ne[1], NULL), 0);
        }
        eng_gguf_close(g);
    }
    rmtree(dir);
}

Test(quantize, untied_rows_not_multiple_of_32_and_threads) {
    char dir[64], in[256], a[256], b[256];
    tmpdir(dir, sizeof dir);
    snprintf(in, sizeof in, "%s/in.gguf", dir);
    snprintf(a, sizeof a, "%s/a.gguf", dir);
    snprintf(b, sizeof b, "%s/b.gguf", dir);
    const mk_tensor t[] = {
        {"token_embd.weight", ENG_Q_F16, 512, 70},   {"output.weight", ENG_Q_F32, 512, 70},
        {"blk.0.attn_q.weight", ENG_Q_F16, 100, 64}, {"blk.0.attn_k.weight", ENG_Q_BF16, 512, 300},
        {"blk.0.ffn_gate_inp.weight", ENG_Q_F32, 512, 8}, {"blk.0.attn_q.bias", ENG_Q_F32, 512, 1},
    };
    write_model(in, t, sizeof t / sizeof t[0], 1, 0, NULL);
    char *log = NULL;
    cr_assert_eq(run_quantize(dir, in, a, "Q4_K_M", "1", &log), 0, "%s", log);
    cr_assert(strstr(log, "blk.0.attn_q.weight"), "the fallback is reported: %s", log);
    free(log);
    cr_assert_eq(run_quantize(dir, in, b, "Q4_K_M", "3", NULL), 0);
    size_t na, nb;
    char *fa = kvt_read_file(a, &na), *fb = kvt_read_file(b, &nb);
    cr_assert(fa && fb);
    cr_assert(na == nb && !memcmp(fa, fb, na), "1 and 3 threads give different files");
    free(fa);
    free(fb);
    eng_gguf *g;
    char err[512];
    cr_assert_eq(eng_gguf_open(a, &g, err, sizeof err), 0, "%s", err);
    cr_assert_eq(out_type(g, "token_embd.weight"), ENG_Q_Q4_K, "untied embeddings keep the base type");
    cr_assert_eq(out_type(g, "output.weight"), ENG_Q_Q6_K);
    cr_assert_eq(out_type(g, "blk.0.attn_q.weight"), ENG_Q_F16, "100 columns: no 32-block fits");
    cr_assert_eq(out_type(g, "blk.0.attn_k.weight"), ENG_Q_Q4_K);
    cr_assert_eq(out_type(g, "blk.0.ffn_gate_inp.weight"), ENG_Q_F32, "expert gates are not quantized");
    cr_assert_eq(out_type(g, "blk.0.attn_q.bias"), ENG_Q_F32);
    /* the bytes are the quantizer's on the input's values */
    eng_gguf *gi;
    cr_assert_eq(eng_gguf_open(in, &gi, err, sizeof err), 0, "%s", err);
    const eng_gguf_tensor *src = eng_gguf_find_tensor(gi, "blk.0.attn_k.weight");
    float *v = malloc(512 * 300 * sizeof *v);
    uint8_t *q = malloc(eng_qtype_row_bytes(ENG_Q_Q4_K, 512) * 300);
    cr_assert(v && q);
    cr_assert_eq(eng_dequantize_row(ENG_Q_BF16, src->data, v, 512 * 300), 0);
    cr_assert_eq(eng_quantize_weights(ENG_Q_Q4_K, v, q, 300, 512), 0);
    const eng_gguf_tensor *dst = eng_gguf_find_tensor(g, "blk.0.attn_k.weight");
    cr_assert(!memcmp(q, dst->data, dst->nbytes));
    free(v);
    free(q);
    eng_gguf_close(gi);
    eng_gguf_close(g);
    rmtree(dir);
}

/* ---- error paths ----------------------------------------------------------------------------------------------- */
/* Runs a quantize that must fail: exit 1 (2 for usage errors), the message names `must_name`, and no out.gguf*
 * file is left in dir (an existing out.gguf keeps its bytes). */
static void expect_failure(const char *dir, const char *in, const char *out, const char *type, int status,
                           const char *must_name, const char *must_name2) {
    char *log = NULL;
    int st = run_quantize(dir, in, out, type, "2", &log);
    cr_assert_eq(st, status, "quantize %s %s %s: exit %d: %s", in, out, type, st, log);
    cr_assert(strstr(log, must_name), "the message does not name %s: %s", must_name, log);
    if (must_name2) cr_assert(strstr(log, must_name2), "the message does not name %s: %s", must_name2, log);
    free(log);
}

Test(quantize, error_paths) {
    char dir[64], in[256], out[256], p[256];
    tmpdir(dir, sizeof dir);
    snprintf(in, sizeof in, "%s/in.gguf", dir);
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    const mk_tensor ok[] = {{"token_embd.weight", ENG_Q_F16, 256, 16}, {"blk.0.attn_q.weight", ENG_Q_F16, 256, 32}};
    write_model(in, ok, 2, 1, 0, NULL);

    snprintf(p, sizeof p, "%s/missing.gguf", dir);
    expect_failure(dir, p, out, "Q4_K_M", 1, p, NULL);
    cr_assert_eq(count_prefixed(dir, "out.gguf"), 0);

    snprintf(p, sizeof p, "%s/text.gguf", dir);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fputs("this is not a gguf file, just some text long enough to be read\n", f);
    fclose(f);
    expect_failure(dir, p, out, "Q4_K_M", 1, p, NULL);
    cr_assert_eq(count_prefixed(dir, "out.gguf"), 0);

    /* an already quantized matrix: llama-quantize does not requantize either */
    snprintf(p, sizeof p, "%s/q8.gguf", dir);
    const mk_tensor q8[] = {{"token_embd.weight", ENG_Q_F16, 256, 16}, {"blk.0.attn_q.weight", ENG_Q_Q8_0, 256, 32}};
    write_model(p, q8, 2, 1, 0, NULL);
    expect_failure(dir, p, out, "Q4_K_M", 1, p, "blk.0.attn_q.weight");
    cr_assert_eq(count_prefixed(dir, "out.gguf"), 0);

    /* a NaN in a weight, and in a norm that is only copied: both rejected, naming the tensor */
    snprintf(p, sizeof p, "%s/nan.gguf", dir);
    const mk_tensor nan_t[] = {{"token_embd.weight", ENG_Q_F16, 256, 16}, {"blk.0.attn_q.weight", ENG_Q_F32, 256, 32},
                               {"blk.0.attn_norm.weight", ENG_Q_F32, 256, 1}};
    write_model(p, nan_t, 3, 1, 0, "blk.0.attn_q.weight");
    expect_failure(dir, p, out, "Q6_K", 1, p, "blk.0.attn_q.weight");
    cr_assert_eq(count_prefixed(dir, "out.gguf"), 0);
    write_model(p, nan_t, 3, 1, 0, "blk.0.attn_norm.weight");
    expect_failure(dir, p, out, "Q8_0", 1, p, "blk.0.attn_norm.weight");
    cr_assert_eq(count_prefixed(dir, "out.gguf"), 0);

    /* weights too large for an fp16 scale: the quantized block check fails, naming the tensor */
    snprintf(p, sizeof p, "%s/huge.gguf", dir);
    {
        eng_gguf_writer *w;
        cr_assert_eq(eng_gguf_writer_create(&w), 0);
        cr_assert_eq(eng_gguf_add_str(w, "general.architecture", "llama", 5), 0);
        cr_assert_eq(eng_gguf_add_u32(w, "llama.block_count", 1), 0);
        float v[256 * 2];
        for (int i = 0; i < 512; i++) v[i] = (i & 1) ? 1e9f : -1e9f;
        const int64_t ne[2] = {256, 2};
        cr_assert_eq(eng_gguf_add_tensor(w, "blk.0.ffn_up.weight", ENG_Q_F32, 2, ne, v, sizeof v), 0);
        char err[256];
        cr_assert_eq(eng_gguf_write(w, p, err, sizeof err), 0, "%s", err);
        eng_gguf_writer_free(w);
    }
    expect_failure(dir, p, out, "Q4_0", 1, p, "blk.0.ffn_up.weight");
    cr_assert_eq(count_prefixed(dir, "out.gguf"), 0);

    /* a bad TYPE and bad options are usage errors */
    expect_failure(dir, in, out, "Q3_K_M", 2, "Q3_K_M", NULL);
    {
        const char *args[] = {"quantize", in, out, "Q4_0", "--threads", "0", NULL};
        cr_assert_eq(kvt_run_kvserve(dir, args, NULL), 2);
        const char *args2[] = {"quantize", in, out, NULL};
        cr_assert_eq(kvt_run_kvserve(dir, args2, NULL), 2);
    }
    cr_assert_eq(count_prefixed(dir, "out.gguf"), 0);

    /* an output folder that cannot be written (a path under a regular file: fails even for root) */
    snprintf(p, sizeof p, "%s/text.gguf/out.gguf", dir);
    expect_failure(dir, in, p, "Q4_K_M", 1, p, NULL);

    /* an existing output is replaced only by a complete file: a failed run leaves it as it was */
    f = fopen(out, "w");
    cr_assert_not_null(f);
    fputs("old", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/q8.gguf", dir);
    expect_failure(dir, p, out, "Q4_K_M", 1, p, NULL);
    cr_assert_eq(count_prefixed(dir, "out.gguf"), 1, "a temporary file is left");
    char *old = kvt_read_file(out, NULL);
    cr_assert_str_eq(old, "old");
    free(old);
    char *log = NULL;
    cr_assert_eq(run_quantize(dir, in, out, "Q4_K_M", "2", &log), 0, "%s", log);
    cr_assert(strstr(log, "MiB") && strstr(log, " s with 2 threads"), "no summary: %s", log);
    free(log);
    cr_assert_eq(count_prefixed(dir, "out.gguf"), 1);
    struct stat st;
    cr_assert_eq(stat(out, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0644);
    rmtree(dir);
}
