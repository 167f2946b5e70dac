/*
 * test_quant_ref.c: dequantization is bit-exact with llama.cpp. For every tensor of every
 * .gguf file in shared/models/synthetic, dequantize it with eng_dequantize_row and compare with
 * shared/reference/dequant/<model>.json: the SHA-256 of the little-endian float32 values, the first 8
 * values (exactly) and the float64 sum. Skips when shared/ is absent.
 */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "engine/kernels/quant.h"
#include "helper_shared.h"

/* ---- SHA-256 (FIPS 180-4), enough for the test ----------------------------------------------------------- */
typedef struct {
    uint32_t h[8];
    uint8_t buf[64];
    size_t n;
    uint64_t len;
} sha256_ctx;

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha256_block(sha256_ctx *c, const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = ((uint32_t)p[4 * i] << 24) | ((uint32_t)p[4 * i + 1] << 16) | ((uint32_t)p[4 * i + 2] << 8) | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = c->h[0], b = c->h[1], cc = c->h[2], d = c->h[3], e = c->h[4], f = c->h[5], g = c->h[6], h = c->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & cc) ^ (b & cc));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = cc;
        cc = b;
        b = a;
        a = t1 + t2;
    }
    c->h[0] += a; c->h[1] += b; c->h[2] += cc; c->h[3] += d;
    c->h[4] += e; c->h[5] += f; c->h[6] += g; c->h[7] += h;
}
static void sha256_init(sha256_ctx *c) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->n = 0;
    c->len = 0;
}
static void sha256_update(sha256_ctx *c, const void *data, size_t n) {
    const uint8_t *p = data;
    c->len += n;
    while (n > 0) {
        size_t take = 64 - c->n < n ? 64 - c->n : n;
        memcpy(c->buf + c->n, p, take);
        c->n += take;
        p += take;
        n -= take;
        if (c->n == 64) {
            sha256_block(c, c->buf);
            c->n = 0;
        }
    }
}
static void sha256_hex(sha256_ctx *c, char out[65]) {
    uint64_t bits = c->len * 8;
    uint8_t pad = 0x80, zero = 0;
    sha256_update(c, &pad, 1);
    while (c->n != 56) sha256_update(c, &zero, 1);
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_update(c, lenb, 8);
    for (int i = 0; i < 8; i++) snprintf(out + 8 * i, 9, "%08x", c->h[i]);
}

Test(quant_ref, sha256_known_vectors) {
    char hex[65];
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, "abc", 3);
    sha256_hex(&c, hex);
    cr_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    sha256_init(&c);
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    for (size_t i = 0; i < strlen(m); i++) sha256_update(&c, m + i, 1);
    sha256_hex(&c, hex);
    cr_assert_str_eq(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

/* ---- the reference check --------------------------------------------------------------------------------- */
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Checks one model; returns the number of tensors matched and writes the total. */
static int check_model(const char *dir, const char *file, int *total) {
    char path[1024], jpath[1024], err[512];
    snprintf(path, sizeof path, "%s/models/synthetic/%s", dir, file);
    snprintf(jpath, sizeof jpath, "%s/reference/dequant/%.*s.json", dir, (int)(strlen(file) - 5), file);
    char *js = kvt_read_file(jpath, NULL);
    cr_assert_not_null(js, "cannot read %s", jpath);
    cJSON *root = cJSON_Parse(js);
    free(js);
    cr_assert_not_null(root, "cannot parse %s", jpath);
    cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    cr_assert(cJSON_IsArray(tensors), "%s: no tensors array", jpath);

    eng_gguf *g = NULL;
    int rc = eng_gguf_open(path, &g, err, sizeof err);
    cr_assert_eq(rc, 0, "open %s: %s", path, err);
    cr_assert_eq(eng_gguf_n_tensors(g), cJSON_GetArraySize(tensors), "%s: tensor count", file);

    int matched = 0;
    *total = cJSON_GetArraySize(tensors);
    cJSON *t;
    cJSON_ArrayForEach(t, tensors) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(t, "name"));
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(t, "sha256_f32"));
        cJSON *first8 = cJSON_GetObjectItemCaseSensitive(t, "first8");
        cJSON *sumj = cJSON_GetObjectItemCaseSensitive(t, "sum");
        cr_assert(name && want && cJSON_IsArray(first8) && cJSON_IsNumber(sumj), "%s: bad entry", jpath);
        const eng_gguf_tensor *ti = eng_gguf_find_tensor(g, name);
        cr_assert_not_null(ti, "%s: tensor %s missing from the model", file, name);
        int64_t n = ti->ne[0] * ti->ne[1] * ti->ne[2] * ti->ne[3];
        cr_assert_eq(eng_qtype_row_bytes(ti->type, n), ti->nbytes, "%s %s: size", file, name);
        float *v = malloc((size_t)n * sizeof(float));
        cr_assert_not_null(v);
        cr_assert_eq(eng_dequantize_row(ti->type, ti->data, v, n), 0, "%s %s: type %u", file, name, ti->type);
        sha256_ctx c;
        sha256_init(&c);
        sha256_update(&c, v, (size_t)n * sizeof(float)); /* x86 is little-endian */
        char hex[65];
        sha256_hex(&c, hex);
        double sum = 0;
        for (int64_t i = 0; i < n; i++) sum += v[i];
        bool ok = strcmp(hex, want) == 0;
        int i = 0;
        cJSON *f;
        cJSON_ArrayForEach(f, first8) {
            if (i < n && (float)f->valuedouble != v[i]) ok = false;
            i++;
        }
        if (fabs(sum - sumj->valuedouble) > 1e-9 * (1.0 + fabs(sumj->valuedouble))) ok = false;
        if (ok) matched++;
        else cr_log_error("%s %s (%s): sha %s want %s, sum %.17g want %.17g, v[0] %.9g", file, name,
                          eng_qtype_get(ti->type) ? eng_qtype_get(ti->type)->name : "?", hex, want, sum,
                          sumj->valuedouble, (double)v[0]);
        free(v);
    }
    eng_gguf_close(g);
    cJSON_Delete(root);
    return matched;
}

Test(quant_ref, dequant_matches_llama_cpp) {
    const char *dir = kvt_shared_dir();
    char sdir[1024];
    snprintf(sdir, sizeof sdir, "%s/models/synthetic", dir);
    DIR *d = opendir(sdir);
    if (!d) cr_skip_test("shared test material not found at %s (set KVSERVE_SHARED): reference check skipped", sdir);
    char *files[64];
    int nf = 0;
    struct dirent *e;
    while ((e = readdir(d)) && nf < 64) {
        size_t l = strlen(e->d_name);
        if (l > 5 && strcmp(e->d_name + l - 5, ".gguf") == 0) files[nf++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(files, (size_t)nf, sizeof files[0], cmp_str);
    cr_assert_gt(nf, 0, "no .gguf in %s", sdir);
    int all_ok = 1;
    for (int i = 0; i < nf; i++) {
        int total = 0, matched = check_model(dir, files[i], &total);
        cr_log_info("%s: %d / %d tensors match llama.cpp", files[i], matched, total);
        printf("dequant reference %s: %d / %d tensors match\n", files[i], matched, total);
        if (matched != total) all_ok = 0;
        free(files[i]);
    }
    cr_assert(all_ok, "some tensors differ from llama.cpp's dequantization (see the log)");
}
