/*
 * test_generate.c: `kvserve generate` end to end (it runs its prompts through the server's scheduler).
 * Differential: several random prompts generated together (-f, one batch, a repeated prompt among them so the
 * scheduler shares its prefix) must give, prompt by prompt, the same tokens, log-probabilities and text as each
 * prompt generated alone (-p). Greedy and sampled (fixed seed). Needs ../shared/models/stories260K.gguf.
 */
#include <criterion/criterion.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helper_rng.h"
#include "helper_shared.h"

#define N_PROMPTS 5

/* Runs the binary with args (a shell-quoted string); returns its stdout (malloc'd) or NULL when it failed. */
static char *run(const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' generate %s 2>/dev/null", KVSERVE_BINARY, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t cap = 4096, n = 0;
    char *out = malloc(cap);
    cr_assert_not_null(out);
    size_t k;
    while ((k = fread(out + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (cap - n < 2) {
            cap *= 2;
            out = realloc(out, cap);
            cr_assert_not_null(out);
        }
    }
    out[n] = 0;
    if (pclose(p) != 0) {
        free(out);
        return NULL;
    }
    return out;
}

/* The fields of one --json line that must agree. */
static void expect_same(const cJSON *a, const cJSON *b, int i) {
    static const char *const keys[] = {"prompt_tokens", "tokens", "logprobs", "top_logprobs", "text"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(a, keys[k]);
        const cJSON *y = cJSON_GetObjectItemCaseSensitive(b, keys[k]);
        cr_assert(x && y, "prompt %d: %s missing", i, keys[k]);
        cr_expect(cJSON_Compare(x, y, true), "prompt %d: %s differs between the batch and the prompt alone", i,
                  keys[k]);
    }
}

static void check_batch_equals_alone(unsigned seed, const char *sampling) {
    char model[1024];
    snprintf(model, sizeof model, "%s/models/stories260K.gguf", kvt_shared_dir());
    if (access(model, R_OK) != 0) cr_skip_test("%s not found (shared test material absent)", model);
    if (access(KVSERVE_BINARY, X_OK) != 0) cr_skip_test("kvserve binary unavailable");

    static const char *const words[] = {"Once", "upon", "a", "time", "there", "was", "little", "dog", "Lily",
                                        "Tom", "park", "ball", "happy", "big", "red", "sun", "tree", "and"};
    rng r = {0x9E3779B97F4A7C15ULL ^ seed};
    char prompts[N_PROMPTS][256];
    for (int i = 0; i < N_PROMPTS; i++) {
        if (i == N_PROMPTS - 1) { /* a repeat: the scheduler shares its prefix with the first */
            strcpy(prompts[i], prompts[0]);
            break;
        }
        prompts[i][0] = 0;
        int nw = 1 + (int)rng_int(&r, 12);
        for (int w = 0; w < nw; w++) {
            if (w) strcat(prompts[i], " ");
            strcat(prompts[i], words[rng_int(&r, (int)(sizeof words / sizeof words[0]))]);
        }
    }
    int n_predict = 8 + (int)rng_int(&r, 25);

    char path[] = "/tmp/kvserve-test-generate-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < N_PROMPTS; i++) fprintf(f, "\"%s\"\n", prompts[i]);
    fclose(f);

    char args[4096];
    snprintf(args, sizeof args, "-m '%s' -f '%s' -n %d %s --top-logprobs 3 --json --threads 2", model, path,
             n_predict, sampling);
    char *batch = run(args);
    unlink(path);
    cr_assert_not_null(batch, "generate -f failed");

    char *line = batch;
    for (int i = 0; i < N_PROMPTS; i++) {
        char *nl = strchr(line, '\n');
        cr_assert_not_null(nl, "prompt %d: no output line", i);
        *nl = 0;
        cJSON *got = cJSON_Parse(line);
        cr_assert_not_null(got, "prompt %d: not JSON: %s", i, line);
        line = nl + 1;
        int n_tok = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(got, "tokens"));
        cr_expect(n_tok >= 1 && n_tok <= n_predict, "prompt %d: %d tokens for -n %d", i, n_tok, n_predict);

        snprintf(args, sizeof args, "-m '%s' -p '%s' -n %d %s --top-logprobs 3 --json --threads 2", model,
                 prompts[i], n_predict, sampling);
        char *alone = run(args);
        cr_assert_not_null(alone, "generate -p failed for prompt %d", i);
        cJSON *want = cJSON_Parse(alone);
        cr_assert_not_null(want);
        expect_same(got, want, i);
        cJSON_Delete(want);
        cJSON_Delete(got);
        free(alone);
    }
    free(batch);
}

Test(generate, batch_equals_alone_greedy) {
    for (unsigned seed = 1; seed <= 2; seed++) check_batch_equals_alone(seed, "--temp 0");
}

Test(generate, batch_equals_alone_sampled) {
    for (unsigned seed = 11; seed <= 12; seed++) check_batch_equals_alone(seed, "--temp 0.9 --top-k 40 --seed 5");
}
