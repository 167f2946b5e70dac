/* test_encoder_ref.c: kvserve's encoders and decoder reranker against llama.cpp v0.5.0 on the same mkmodel models
 * (tests/reference/mk-encoders.json, recorded by scripts/ref-encoder.py): the WordPiece token ids exactly, the
 * pooled L2-normalized embeddings with cosine >= 0.9999 each, and the rerankers' scores within 1e-3 in the same
 * order (a Qwen3-Reranker-style qwen3: its rerank prompt's tokens exactly too, and its score equal to p(yes) of
 * its own logits). The models are made again with the recorded mkmodel arguments; their SHA-256 must match the
 * record. */
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

/* Makes the model of the recorded mkmodel arguments ("@SHARED/...": a file of the shared test material; the test
 * is skipped when it is absent) and opens it. Returns false after a skip. */
static bool open_model(model_run *R, const cJSON *args) {
    static char shared_arg[512];
    const char *argv[40] = {"mkmodel", "-o", R->path};
    int n = 3;
    for (const cJSON *a = args->child; a && n < 38; a = a->next) {
        argv[n] = a->valuestring;
        if (!strncmp(a->valuestring, "@SHARED/", 8)) {
            snprintf(shared_arg, sizeof shared_arg, "%s/%s", kvt_shared_dir(), a->valuestring + 8);
            if (access(shared_arg, R_OK) != 0) {
                cr_skip_test("%s is absent (the shared test material)", shared_arg);
                return false;
            }
            argv[n] = shared_arg;
        }
        n++;
    }
    argv[n] = NULL;
    snprintf(R->dir, sizeof R->dir, "/tmp/kvs-encref-XXXXXX");
    cr_assert_not_null(mkdtemp(R->dir));
    snprintf(R->path, sizeof R->path, "%s/m.gguf", R->dir);
    argv[2] = R->path;
    cr_assert_eq(kvt_run_kvserve(R->dir, argv, NULL), 0);
    char err[256];
    cr_assert_eq(eng_model_load(R->path, NULL, &R->m, err, sizeof err), 0, "%s", err);
    eng_ctx_params p;
    eng_ctx_params_default(&p);
    p.n_threads = 2;
    p.max_batch_tokens = 512;
    p.device = ENG_DEVICE_CPU;
    cr_assert_eq(eng_ctx_create(R->m, &p, &R->ctx, err, sizeof err), 0, "%s", err);
    return true;
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

/* One sequence through the model: every row's hidden state wanted. Returns the rows' outputs [n][E] or (rank)
 * the head's first value in *score: over the first row (an encoder) or the last (a decoder reranker), whose
 * logits (a decoder) are then wanted too and go to logits[n_vocab] when it is not NULL. */
static void encode_ex(model_run *R, const int32_t *tok, int32_t n, float *out, float *score, float *logits) {
    const int32_t E = eng_model_hparams(R->m)->n_embd;
    kvc_cache *kv = eng_ctx_cache(R->ctx);
    int32_t seq, pos[512], seqs[512];
    bool wl[512], we[512];
    cr_assert(n <= 512);
    cr_assert_eq(kvc_seq_alloc(kv, &seq), 0);
    for (int32_t i = 0; i < n; i++) {
        pos[i] = i;
        seqs[i] = seq;
        wl[i] = !eng_model_is_encoder(R->m) && i == n - 1;
        we[i] = true;
    }
    eng_batch b = {.n = n, .token = tok, .pos = pos, .seq = seqs, .want_logits = wl, .want_embd = we};
    cr_assert_eq(eng_decode(R->ctx, &b), 0);
    for (int32_t i = 0; out && i < n; i++) memcpy(out + (size_t)i * E, eng_get_embeddings(R->ctx, i), (size_t)E * 4);
    if (score) {
        const float *h = eng_get_rank(R->ctx, eng_model_rank_last(R->m) ? n - 1 : 0);
        cr_assert_not_null(h);
        *score = h[0];
    }
    if (logits) {
        const float *l = eng_get_logits(R->ctx, n - 1);
        cr_assert_not_null(l);
        memcpy(logits, l, (size_t)eng_model_hparams(R->m)->n_vocab * sizeof *logits);
    }
    kvc_seq_free(kv, seq);
}

static void encode(model_run *R, const int32_t *tok, int32_t n, float *out, float *score) {
    encode_ex(R, tok, n, out, score, NULL);
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
    if (!open_model(&R, cJSON_GetObjectItem(mr, "mkmodel_args"))) {
        cJSON_Delete(ref);
        return;
    }
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
Test(encoder_ref, jina_bert_v2_alibi_geglu_embeddings) { check_embeddings("jina-bert-v2"); }

/* A decoder reranker's prompt for (query, doc): the model's rerank prompt with {query}, then {document} replaced
 * (llama.cpp's server's order), tokenized with special tokens parsed and none added. */
static int32_t rerank_prompt_tokens(const eng_model *m, const char *query, const char *doc, int32_t *ids, int32_t cap) {
    char text[4096] = "";
    const char *t = eng_model_rerank_prompt(m);
    size_t len = 0;
    while (*t) {
        const char *v = !strncmp(t, "{query}", 7) ? query : !strncmp(t, "{document}", 10) ? doc : NULL;
        size_t add = v ? strlen(v) : 1;
        cr_assert(len + add < sizeof text);
        memcpy(text + len, v ? v : t, add);
        len += add;
        t += v == query ? 7 : v == doc ? 10 : 1;
    }
    text[len] = 0;
    return tokenize(m, text, false, ids, cap);
}

static void check_reranker(const char *name) {
    cJSON *ref = load_ref();
    const cJSON *mr = cJSON_GetObjectItem(cJSON_GetObjectItem(ref, "models"), name);
    cr_assert_not_null(mr);
    model_run R;
    if (!open_model(&R, cJSON_GetObjectItem(mr, "mkmodel_args"))) {
        cJSON_Delete(ref);
        return;
    }
    check_sha(&R, cJSON_GetObjectItem(mr, "model_sha256")->valuestring);
    int32_t bos, eos, sep;
    eng_rerank_tokens(R.m, &bos, &eos, &sep);
    const char *query = cJSON_GetObjectItem(ref, "query")->valuestring;
    int32_t q[256], nq = tokenize(R.m, query, false, q, 256);
    const cJSON *docs = cJSON_GetObjectItem(ref, "documents"), *pt = cJSON_GetObjectItem(mr, "pair_tokens");
    const cJSON *ptd = pt ? pt->child : NULL;
    float score[64];
    int nd = 0;
    for (const cJSON *d = docs->child; d && nd < 64; d = d->next, nd++, ptd = ptd ? ptd->next : NULL) {
        int32_t t[512], n = 0;
        if (eng_model_rerank_prompt(R.m)) {
            n = rerank_prompt_tokens(R.m, query, d->valuestring, t, 512);
        } else {
            if (bos >= 0) t[n++] = bos;
            memcpy(t + n, q, (size_t)nq * sizeof *t);
            n += nq;
            if (eos >= 0) t[n++] = eos;
            if (sep >= 0) t[n++] = sep;
            n += tokenize(R.m, d->valuestring, false, t + n, 512 - n - 1);
            if (eos >= 0) t[n++] = eos;
        }
        if (ptd) { /* the pair's prompt as llama.cpp's server builds it */
            cr_assert_eq(n, cJSON_GetArraySize(ptd), "%s pair %d: %d tokens, llama.cpp %d", name, nd, n,
                         cJSON_GetArraySize(ptd));
            int i = 0;
            for (const cJSON *x = ptd->child; x; x = x->next, i++)
                cr_assert_eq(t[i], x->valueint, "%s pair %d token %d: %d, llama.cpp %d", name, nd, i, t[i], x->valueint);
        }
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
Test(encoder_ref, jina_bert_v2_reranker_scores_and_order) { check_reranker("jina-bert-v2-reranker"); }
Test(encoder_ref, qwen3_reranker_prompt_scores_and_order) { check_reranker("qwen3-reranker"); }

/* The decoder reranker's score is vLLM's: p(yes) = softmax over the yes / no logits of the model's own output at the
 * last position (mkmodel writes cls.output from the tied output's rows of "yes" and "no"). */
Test(encoder_ref, qwen3_reranker_score_is_p_yes_of_the_logits) {
    cJSON *ref = load_ref();
    const cJSON *mr = cJSON_GetObjectItem(cJSON_GetObjectItem(ref, "models"), "qwen3-reranker");
    cr_assert_not_null(mr);
    model_run R;
    if (!open_model(&R, cJSON_GetObjectItem(mr, "mkmodel_args"))) {
        cJSON_Delete(ref);
        return;
    }
    cr_assert(eng_model_rank_last(R.m));
    cr_assert_eq(eng_model_n_cls_out(R.m), 2);
    int32_t yes = -1, no = -1, t[512];
    cr_assert_eq(tokenize(R.m, "yes", false, t, 4), 1);
    yes = t[0];
    cr_assert_eq(tokenize(R.m, "no", false, t, 4), 1);
    no = t[0];
    const int32_t V = eng_model_hparams(R.m)->n_vocab;
    float *logits = malloc((size_t)V * sizeof *logits);
    cr_assert_not_null(logits);
    int k = 0;
    for (const cJSON *d = cJSON_GetObjectItem(ref, "documents")->child; d; d = d->next, k++) {
        int32_t n = rerank_prompt_tokens(R.m, cJSON_GetObjectItem(ref, "query")->valuestring, d->valuestring, t, 512);
        float score;
        encode_ex(&R, t, n, NULL, &score, logits);
        double p_yes = 1.0 / (1.0 + exp((double)logits[no] - (double)logits[yes]));
        cr_assert(fabs(score - p_yes) < 1e-5, "document %d: score %.7f, p(yes) from the logits %.7f", k, score, p_yes);
    }
    free(logits);
    close_model(&R);
    cJSON_Delete(ref);
}
