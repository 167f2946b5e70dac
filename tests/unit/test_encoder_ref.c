/* test_encoder_ref.c: kvserve's encoders against llama.cpp v0.5.0 on the same mkmodel models
 * (tests/reference/mk-encoders.json, recorded by scripts/ref-encoder.py): the WordPiece token ids exactly, the
 * pooled L2-normalized embeddings with cosine >= 0.9999 each, and the reranker's scores within 1e-3 in the same
 * order. The models are made again with the recorded mkmodel arguments; their SHA-256 must match the record. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/kv_cache.h"
#include "common/common.h"
#include "engine/engine.h"
#include "helper_shared.h"

typedef struct model_run {
    char dir[64], path[128];
    eng_model *m;
    eng_ctx *ctx;
} model_run;

static void open_model(model_run *R, const cJSON *args) {
    snprintf(R->dir, sizeof R->dir, "/tmp/kvs-encref-XXXXXX");
    cr_assert_not_null(mkdtemp(R->dir));
    snprintf(R->path, sizeof R->path, "%s/m.gguf", R->dir);
    const char *argv[40] = {"mkmodel", "-o", R->path};
    int n = 3;
    for (const cJSON *a = args->child; a && n < 38; a = a->next) argv[n++] = a->valuestring;
    argv[n] = NULL;
    cr_assert_eq(kvt_run_kvserve(R->dir, argv, NULL), 0);
    char err[256];
    cr_assert_eq(eng_model_load(R->path, NULL, &R->m, err, sizeof err), 0, "%s", err);
    eng_ctx_params p;
    eng_ctx_params_default(&p);
    p.n_threads = 2;
    p.max_batch_tokens = 512;
    p.device = ENG_DEVICE_CPU;
    cr_assert_eq(eng_ctx_create(R->m, &p, &R->ctx, err, sizeof err), 0, "%s", err);
}

static void close_model(model_run *R) {
    eng_ctx_free(R->ctx);
    eng_model_free(R->m);
    char log[160];
    snprintf(log, sizeof log, "%s/log", R->dir);
    unlink(log);
    unlink(R->path);
    rmdir(R->dir);
}

static void check_sha(const model_run *R, const char *want) {
    size_t len = 0;
    char *data = kvt_read_file(R->path, &len);
    cr_assert_not_null(data);
    uint8_t h[32];
    kvs_sha256(data, len, h);
    free(data);
    char hex[65];
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
    cr_assert_str_eq(hex, want, "mkmodel wrote a different model than the one recorded");
}

/* One sequence through the encoder: every row's hidden state wanted. Returns the rows' outputs [n][E] or (rank)
 * the head's first value in *score. */
static void encode(model_run *R, const int32_t *tok, int32_t n, float *out, float *score) {
    const int32_t E = eng_model_hparams(R->m)->n_embd;
    kvc_cache *kv = eng_ctx_cache(R->ctx);
    int32_t seq, pos[512], seqs[512];
    bool wl[512], we[512];
    cr_assert(n <= 512);
    cr_assert_eq(kvc_seq_alloc(kv, &seq), 0);
    for (int32_t i = 0; i < n; i++) {
        pos[i] = i;
        seqs[i] = seq;
        wl[i] = false;
        we[i] = true;
    }
    eng_batch b = {.n = n, .token = tok, .pos = pos, .seq = seqs, .want_logits = wl, .want_embd = we};
    cr_assert_eq(eng_decode(R->ctx, &b), 0);
    for (int32_t i = 0; out && i < n; i++) memcpy(out + (size_t)i * E, eng_get_embeddings(R->ctx, i), (size_t)E * 4);
    if (score) {
        const float *h = eng_get_rank(R->ctx, 0);
        cr_assert_not_null(h);
        *score = h[0];
    }
    kvc_seq_free(kv, seq);
}

static int32_t tokenize(const eng_model *m, const char *text, bool add_special, int32_t *ids, int32_t cap) {
    int32_t n = 0;
    cr_assert_eq(eng_tokenize(m, text, strlen(text), add_special, true, ids, cap, &n), 0);
    return n;
}

static cJSON *load_ref(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/tests/reference/mk-encoders.json", KVSERVE_SOURCE_DIR);
    return kvt_read_json(path);
}

static void check_embeddings(const char *name) {
    cJSON *ref = load_ref();
    const cJSON *mr = cJSON_GetObjectItem(cJSON_GetObjectItem(ref, "models"), name);
    cr_assert_not_null(mr, "no model %s in the reference", name);
    model_run R;
    open_model(&R, cJSON_GetObjectItem(mr, "mkmodel_args"));
    check_sha(&R, cJSON_GetObjectItem(mr, "model_sha256")->valuestring);
    const eng_hparams *hp = eng_model_hparams(R.m);
    const int32_t E = hp->n_embd;
    float *rows = malloc((size_t)512 * E * sizeof *rows);
    cr_assert_not_null(rows);
    const cJSON *prompts = cJSON_GetObjectItem(ref, "prompts"), *toks = cJSON_GetObjectItem(mr, "tokens");
    const cJSON *embs = cJSON_GetObjectItem(mr, "embeddings");
    int k = 0;
    for (const cJSON *p = prompts->child, *t = toks->child, *e = embs ? embs->child : NULL; p;
         p = p->next, t = t->next, e = e ? e->next : NULL, k++) {
        int32_t ids[512];
        int32_t n = tokenize(R.m, p->valuestring, true, ids, 512);
        cr_assert_eq(n, cJSON_GetArraySize(t), "%s prompt %d: %d tokens, llama.cpp %d", name, k, n,
                     cJSON_GetArraySize(t));
        int i = 0;
        for (const cJSON *x = t->child; x; x = x->next, i++)
            cr_assert_eq(ids[i], x->valueint, "%s prompt %d token %d: %d, llama.cpp %d", name, k, i, ids[i], x->valueint);
        if (!e) continue;
        encode(&R, ids, n, rows, NULL);
        double v[1024] = {0}, dot = 0, na = 0, nb = 0;
        for (int32_t r = 0; r < n; r++) {
            bool take = hp->pooling_type == 2 ? r == 0 : true; /* cls, or mean */
            for (int32_t j = 0; take && j < E; j++) v[j] += rows[(size_t)r * E + j];
        }
        i = 0;
        for (const cJSON *x = e->child; x; x = x->next, i++) {
            dot += v[i] * x->valuedouble;
            na += v[i] * v[i];
            nb += x->valuedouble * x->valuedouble;
        }
        cr_assert_eq(i, E);
        double cos = dot / sqrt(na * nb);
        cr_assert(cos >= 0.9999, "%s prompt %d: cosine %.7f with llama.cpp's embedding", name, k, cos);
    }
    free(rows);
    close_model(&R);
    cJSON_Delete(ref);
}


Test(encoder_ref, bert_tokens_and_embeddings) { check_embeddings("bert"); }
Test(encoder_ref, nomic_bert_tokens_and_embeddings) { check_embeddings("nomic-bert"); }
Test(encoder_ref, bert_cls_pooling) { check_embeddings("bert-cls"); }
Test(encoder_ref, xlmr_unigram_tokens_and_cls_embeddings) { check_embeddings("xlmr-cls"); }

static void check_reranker(const char *name) {
    cJSON *ref = load_ref();
    const cJSON *mr = cJSON_GetObjectItem(cJSON_GetObjectItem(ref, "models"), name);
    cr_assert_not_null(mr);
    model_run R;
    open_model(&R, cJSON_GetObjectItem(mr, "mkmodel_args"));
    check_sha(&R, cJSON_GetObjectItem(mr, "model_sha256")->valuestring);
    int32_t bos, eos, sep;
    eng_rerank_tokens(R.m, &bos, &eos, &sep);
    int32_t q[256], nq = tokenize(R.m, cJSON_GetObjectItem(ref, "query")->valuestring, false, q, 256);
    const cJSON *docs = cJSON_GetObjectItem(ref, "documents");
    float score[64];
    int nd = 0;
    for (const cJSON *d = docs->child; d && nd < 64; d = d->next, nd++) {
        int32_t t[512], n = 0;
        if (bos >= 0) t[n++] = bos;
        memcpy(t + n, q, (size_t)nq * sizeof *t);
        n += nq;
        if (eos >= 0) t[n++] = eos;
        if (sep >= 0) t[n++] = sep;
        n += tokenize(R.m, d->valuestring, false, t + n, 512 - n - 1);
        if (eos >= 0) t[n++] = eos;
        encode(&R, t, n, NULL, &score[nd]);
    }
    const cJSON *toks = cJSON_GetObjectItem(mr, "tokens"), *prompts = cJSON_GetObjectItem(ref, "prompts");
    int k = 0;
    for (const cJSON *p = prompts->child, *t = toks->child; p; p = p->next, t = t->next, k++) { /* the tokenizer */
        int32_t ids[512], n = tokenize(R.m, p->valuestring, true, ids, 512), i = 0;
        cr_assert_eq(n, cJSON_GetArraySize(t), "%s prompt %d: %d tokens, llama.cpp %d", name, k, n, cJSON_GetArraySize(t));
        for (const cJSON *x = t->child; x; x = x->next, i++) cr_assert_eq(ids[i], x->valueint, "%s prompt %d", name, k);
    }
    const cJSON *res = cJSON_GetObjectItem(mr, "rerank");
    cr_assert_eq(cJSON_GetArraySize(res), nd);
    float prev = INFINITY;
    for (const cJSON *r = res->child; r; r = r->next) { /* llama.cpp's order is by score: ours must agree */
        int idx = cJSON_GetObjectItem(r, "index")->valueint;
        double want = cJSON_GetObjectItem(r, "relevance_score")->valuedouble;
        cr_assert(idx >= 0 && idx < nd);
        cr_assert(fabs(score[idx] - want) < 1e-3, "document %d: score %.6f, llama.cpp %.6f", idx, score[idx], want);
        cr_assert(score[idx] <= prev, "document %d is out of llama.cpp's order", idx);
        prev = score[idx];
    }
    close_model(&R);
    cJSON_Delete(ref);
}

Test(encoder_ref, bert_reranker_scores_and_order) { check_reranker("bert-reranker"); }
Test(encoder_ref, xlmr_reranker_scores_and_order) { check_reranker("xlmr-reranker"); }
