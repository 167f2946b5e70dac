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
#include "engine/gguf.h"
#include "engine/quant.h"
#include "helper_sha256.h"
#include "helper_shared.h"

Test(quant_ref, sha256_known_vectors) {
    char hex[65];
    kvt_sha256 c;
    kvt_sha256_init(&c);
    kvt_sha256_update(&c, "abc", 3);
    kvt_sha256_hex(&c, hex);
    cr_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    kvt_sha256_init(&c);
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    for (size_t i = 0; i < strlen(m); i++) kvt_sha256_update(&c, m + i, 1);
    kvt_sha256_hex(&c, hex);
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
        kvt_sha256 c;
        kvt_sha256_init(&c);
        kvt_sha256_update(&c, v, (size_t)n * sizeof(float)); /* x86 is little-endian */
        char hex[65];
        kvt_sha256_hex(&c, hex);
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
