/*
 * test_tok_gpt4o.c: the gpt-4o (o200k) pre-tokenizer gpt-oss's vocabulary names, against llama.cpp v0.5.0. No o200k
 * vocabulary is in ../shared, so (as scripts/ref-tok-gpt4o.py recorded it) the shared gpt-2 BPE vocabulary is
 * rewritten with tokenizer.ggml.pre = "gpt-4o": the pre-tokenizer splits the texts into words (by letter case,
 * contractions, digit groups of three, punctuation runs with '/', whitespace) and the gpt-2 merges act within them.
 * Every text of tests/reference/tok-gpt4o.json (llama.cpp's tokenizer test strings and case-split cases) must give
 * llama.cpp's ids. Skips without ../shared.
 */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "engine/model/model.h"
#include "engine/text/tokenizer.h"
#include "helper_shared.h"

static char dir[64], vocab_path[128];

static void cleanup(void) {
    if (!dir[0]) return;
    unlink(vocab_path);
    rmdir(dir);
}

/* src's metadata into dst with tokenizer.ggml.pre set to pre (a vocabulary file: no tensors). */
static void set_pre(const char *src, const char *dst, const char *pre) {
    eng_gguf *g = NULL;
    char err[256];
    cr_assert_eq(eng_gguf_open(src, &g, err, sizeof err), 0, "%s", err);
    cr_assert_eq(eng_gguf_n_tensors(g), 0);
    eng_gguf_writer *w = NULL;
    cr_assert_eq(eng_gguf_writer_create(&w), 0);
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++) {
        const eng_gguf_kv *kv = eng_gguf_kv_at(g, i);
        if (kv->key.len == 18 && !memcmp(kv->key.ptr, "tokenizer.ggml.pre", 18))
            cr_assert_eq(eng_gguf_add_str(w, "tokenizer.ggml.pre", pre, strlen(pre)), 0);
        else if (!(kv->key.len == 17 && !memcmp(kv->key.ptr, "general.alignment", 17)))
            cr_assert_eq(eng_gguf_add_kv_from(w, kv), 0);
    }
    cr_assert_eq(eng_gguf_write(w, dst, err, sizeof err), 0, "%s", err);
    eng_gguf_writer_free(w);
    eng_gguf_close(g);
}

Test(tok_gpt4o, llama_cpp_ids, .fini = cleanup) {
    char src[1024], ref[1024];
    snprintf(src, sizeof src, "%s/models/vocab-only/ggml-vocab-gpt-2.gguf", kvt_shared_dir());
    struct stat st;
    if (stat(src, &st) != 0) cr_skip_test("%s not present: shared test material unavailable", src);
    snprintf(ref, sizeof ref, "%s/tests/reference/tok-gpt4o.json", KVSERVE_SOURCE_DIR);
    cJSON *root = kvt_read_json(ref);
    snprintf(dir, sizeof dir, "/tmp/kvserve-gpt4o-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(vocab_path, sizeof vocab_path, "%s/gpt4o.gguf", dir);
    set_pre(src, vocab_path, "gpt-4o");
    eng_load_params lp;
    eng_load_params_default(&lp);
    lp.vocab_only = true;
    eng_model *m = NULL;
    char err[256];
    cr_assert_eq(eng_model_load(vocab_path, &lp, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(eng_vocab_pre(eng_model_vocab(m)), ENG_PRE_GPT4O);
    static int32_t toks[1 << 14];
    int n_cases = 0;
    cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(c, "text"));
        cJSON *want = cJSON_GetObjectItem(c, "tokens");
        cr_assert(text && cJSON_IsArray(want));
        int32_t n = 0;
        cr_assert_eq(eng_tokenize(m, text, strlen(text), false, false, toks, 1 << 14, &n), 0);
        cr_expect_eq(n, cJSON_GetArraySize(want), "[%s]: %d tokens, llama.cpp %d", text, n, cJSON_GetArraySize(want));
        for (int32_t i = 0; i < n && i < cJSON_GetArraySize(want); i++)
            if (toks[i] != cJSON_GetArrayItem(want, i)->valueint) {
                cr_expect_fail("[%s]: token %d is %d, llama.cpp %d", text, i, toks[i],
                               cJSON_GetArrayItem(want, i)->valueint);
                break;
            }
        n_cases++;
    }
    cr_assert_gt(n_cases, 50);
    eng_model_free(m);
    cJSON_Delete(root);
}
