/*
 * test_moe.c: Mixture-of-Experts models (qwen3moe) beyond the reference completions (test_reference.c): a token's
 * logits are the same bit for bit whichever other rows share its experts in a step (random prompts decoded alone,
 * then as random interleaved batches with other sequences, in random chunks), whatever the thread count; a one-row
 * decode computes only the experts its token selected; the experts of a stacked tensor are packed into one buffer
 * with every row intact; malformed files (expert counts, used > count, stacked
 * tensor shapes) are refused with a message naming the key or tensor. The models are made by `kvserve mkmodel`
 * (tiny-moe preset) in a temporary directory; no shared material is needed.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <criterion/logging.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "engine/kernels/quant_kpacked.h"
#include "engine/model/model.h"
#include "engine/runtime/forward_ctx.h"
#include "tests/unit/helper_rng.h"
#include "tests/unit/helper_shared.h"

enum { N_PROMPT = 12, N_SEQ = 4, MAX_ROWS = 64 };

typedef struct tmpdir { char dir[64], model[128]; } tmpdir;

/* A tiny-moe (or with oss, a tiny-oss: gpt-oss, its block 0 sliding over 8 positions) model in type (f32 | q8_0;
 * "q4_k_m" and "mxfp4": the f16 model through kvserve quantize Q4_K_M or MXFP4_MOE) made in a new temporary
 * directory. */
static void make_model_arch(tmpdir *t, const char *type, bool oss) {
    snprintf(t->dir, sizeof t->dir, "/tmp/kvserve-moe-XXXXXX");
    cr_assert_not_null(mkdtemp(t->dir));
    snprintf(t->model, sizeof t->model, "%s/m.gguf", t->dir);
    bool q4k = !strcmp(type, "q4_k_m"), mx = !strcmp(type, "mxfp4");
    /* Q4_K rows need multiples of 256 */
    const char *args[] = {"mkmodel", "-o", t->model, "--preset", oss ? "tiny-oss" : "tiny-moe", "--type",
                          q4k || mx ? "f16" : type, "--embd", q4k ? "256" : "64", "--expert-ff", q4k ? "256" : "64",
                          "--heads", "4", "--experts", "8", "--experts-used", "3", oss ? "--swa" : NULL, "8", NULL};
    cr_assert_eq(kvt_run_kvserve(t->dir, args, NULL), 0, "kvserve mkmodel failed");
    if (q4k || mx) {
        char q[160];
        snprintf(q, sizeof q, "%s.q", t->model);
        const char *qa[] = {"quantize", t->model, q, mx ? "MXFP4_MOE" : "Q4_K_M", NULL};
        cr_assert_eq(kvt_run_kvserve(t->dir, qa, NULL), 0, "kvserve quantize failed");
        cr_assert_eq(rename(q, t->model), 0);
    }
}

static void make_model(tmpdir *t, const char *type) { make_model_arch(t, type, false); }

/* The test's temporary directory, removed by its .fini whether it passed or failed. */
static tmpdir made;
static void made_cleanup(void) {
    if (!made.dir[0]) return;
    const char *names[] = {"log", "m.gguf", "m.gguf.q", "bad.gguf"};
    char path[160];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", made.dir, names[i]);
        unlink(path);
    }
    rmdir(made.dir);
}

static eng_ctx *open_ctx(eng_model *m, int32_t n_threads) {
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_ctx = 64;
    cp.max_seqs = N_SEQ;
    cp.max_batch_tokens = MAX_ROWS;
    cp.n_threads = n_threads;
    cp.kv_dtype = KVC_DTYPE_F32;
    cp.device = ENG_DEVICE_CPU;
    eng_ctx *c = NULL;
    char err[256];
    cr_assert_eq(eng_ctx_create(m, &cp, &c, err, sizeof err), 0, "%s", err);
    return c;
}

/* Every sequence's prompt decoded one token at a time, alone (logits of every position into alone), then all
 * sequences again in one context as random interleaved chunks, which must give the same logits bit for bit. */
static void invariance_arch(const char *type, int32_t n_threads, uint64_t seed, bool oss) {
    tmpdir *tp = &made, t;
    make_model_arch(tp, type, oss);
    t = *tp;
    eng_model *m = NULL;
    char err[256];
    cr_assert_eq(eng_model_load(t.model, NULL, &m, err, sizeof err), 0, "%s", err);
    const int32_t V = eng_model_hparams(m)->n_vocab;
    rng r = {seed};
    int32_t toks[N_SEQ][N_PROMPT];
    for (int s = 0; s < N_SEQ; s++)
        for (int i = 0; i < N_PROMPT; i++) toks[s][i] = (int32_t)rng_int(&r, V);
    float *alone = malloc(sizeof(float) * (size_t)V * N_SEQ * N_PROMPT);
    cr_assert_not_null(alone);

    eng_ctx *c = open_ctx(m, 1);
    for (int s = 0; s < N_SEQ; s++) {
        int32_t seq;
        cr_assert_eq(kvc_seq_alloc(eng_ctx_cache(c), &seq), 0);
        for (int32_t i = 0; i < N_PROMPT; i++) {
            bool w = true;
            eng_batch b = {1, &toks[s][i], &i, &seq, &w, NULL};
            cr_assert_eq(eng_decode(c, &b), 0);
            /* one row: only its own n_expert_used experts were computed in the last layer */
            cr_assert_eq(c->moe_rt[0].n_active, eng_model_hparams(m)->n_expert_used);
            memcpy(alone + ((size_t)s * N_PROMPT + i) * V, eng_get_logits(c, 0), sizeof(float) * (size_t)V);
        }
        cr_assert_eq(kvc_seq_free(eng_ctx_cache(c), seq), 0);
    }
    eng_ctx_free(c);

    c = open_ctx(m, n_threads);
    int32_t seqs[N_SEQ], done[N_SEQ] = {0};
    for (int s = 0; s < N_SEQ; s++) cr_assert_eq(kvc_seq_alloc(eng_ctx_cache(c), &seqs[s]), 0);
    int left = N_SEQ * N_PROMPT;
    while (left > 0) {
        int32_t bt[MAX_ROWS], bp[MAX_ROWS], bs[MAX_ROWS], who[MAX_ROWS];
        bool w[MAX_ROWS];
        int n = 0;
        for (int s = 0; s < N_SEQ; s++) { /* a random chunk of each sequence, rows of the sequences interleaved */
            int take = rng_int(&r, 5);
            for (int k = 0; k < take && done[s] < N_PROMPT; k++) {
                bt[n] = toks[s][done[s]], bp[n] = done[s], bs[n] = seqs[s], w[n] = true, who[n] = s;
                done[s]++, n++, left--;
            }
        }
        if (n == 0) continue;
        eng_batch b = {n, bt, bp, bs, w, NULL};
        cr_assert_eq(eng_decode(c, &b), 0);
        for (int i = 0; i < n; i++)
            cr_assert(memcmp(eng_get_logits(c, i), alone + ((size_t)who[i] * N_PROMPT + bp[i]) * V,
                             sizeof(float) * (size_t)V) == 0,
                      "%s, %d threads: sequence %d position %d: batched logits differ from alone", type, n_threads,
                      who[i], bp[i]);
    }
    eng_ctx_free(c);
    free(alone);
    eng_model_free(m);
}

static void invariance(const char *type, int32_t n_threads, uint64_t seed) {
    invariance_arch(type, n_threads, seed, false);
}

TestSuite(moe, .timeout = 120);

Test(moe, batch_invariance_f32, .fini = made_cleanup) { invariance("f32", 2, 11); }
Test(moe, batch_invariance_q8_0, .fini = made_cleanup) { invariance("q8_0", 3, 12); }
Test(moe, batch_invariance_q4_k_m, .fini = made_cleanup) { invariance("q4_k_m", 2, 13); }
/* gpt-oss: top-k-then-softmax gating, biased router and experts, the clamped SwiGLU, sinks, a sliding block */
Test(moe, batch_invariance_gpt_oss_f32, .fini = made_cleanup) { invariance_arch("f32", 2, 14, true); }
Test(moe, batch_invariance_gpt_oss_mxfp4, .fini = made_cleanup) { invariance_arch("mxfp4", 3, 15, true); }

/* eng_model_pack_cpu packs an MoE layer's stacked gate / up / down into one buffer each: expert e's packed rows at e
 * times the packed size rounded up to 64 bytes, and every row of every expert reads back (eng_wpack_row) as exactly
 * the file's bytes. Q4_K_M: Q4_K gate/up, Q6_K down in the last layer. */
Test(moe, experts_packed_per_stack, .fini = made_cleanup) {
    make_model(&made, "q4_k_m");
    eng_model *m = NULL;
    char err[256];
    cr_assert_eq(eng_model_load(made.model, NULL, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(eng_model_pack_cpu(m), 0);
    const int32_t ne = m->hp.n_expert;
    int types_seen = 0;
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const eng_moe *x = &m->layers[l].moe;
        const eng_matrix *sets[3] = {x->gate, x->up, x->down};
        for (int s = 0; s < 3; s++) {
            const eng_matrix *w = sets[s];
            const size_t each = eng_wpack_bytes(w[0].type, w[0].n_out, w[0].k), stride = (each + 63) / 64 * 64;
            cr_assert_gt(each, 0, "layer %d stack %d: type %u has a packed layout", l, s, w[0].type);
            cr_assert_not_null(x->packed_exps[s]);
            types_seen |= w[0].type == ENG_Q_Q6_K ? 2 : 1;
            char *row = malloc(w[0].row_bytes);
            cr_assert_not_null(row);
            for (int32_t e = 0; e < ne; e++) {
                cr_assert_eq((const char *)w[e].packed, (const char *)x->packed_exps[s] + (size_t)e * stride);
                for (int64_t j = 0; j < w[e].n_out; j++) {
                    cr_assert_eq(eng_wpack_row(w[e].type, w[e].packed, w[e].n_out, w[e].k, j, row), 0);
                    cr_assert(memcmp(row, (const char *)w[e].data + (size_t)j * w[e].row_bytes, w[e].row_bytes) == 0,
                              "layer %d stack %d expert %d row %lld differs from the file", l, s, e, (long long)j);
                }
            }
            free(row);
        }
    }
    cr_expect_eq(types_seen, 3, "both Q4_K and Q6_K expert stacks were checked");
    eng_model_free(m);
}

/* The model at src rewritten into dst with key `key` (an arch key, u32) set to value (drop: left out), or with
 * tensor `tensor`'s ne[2] halved (drop: left out): a malformed file for the loader. */
static void rewrite_ex(const char *src, const char *dst, const char *key, int64_t value, const char *tensor,
                       bool drop) {
    eng_gguf *g = NULL;
    char err[256];
    cr_assert_eq(eng_gguf_open(src, &g, err, sizeof err), 0, "%s", err);
    eng_gguf_writer *w = NULL;
    cr_assert_eq(eng_gguf_writer_create(&w), 0);
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++) {
        const eng_gguf_kv *kv = eng_gguf_kv_at(g, i);
        if (key && kv->key.len == strlen(key) && !memcmp(kv->key.ptr, key, kv->key.len)) continue;
        if (kv->key.len == 17 && !memcmp(kv->key.ptr, "general.alignment", 17)) continue;
        cr_assert_eq(eng_gguf_add_kv_from(w, kv), 0);
    }
    if (key && !drop) cr_assert_eq(eng_gguf_add_u32(w, key, (uint32_t)value), 0);
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        size_t nb = t->nbytes;
        if (tensor && !strcmp(name, tensor) && drop) continue;
        if (tensor && !strcmp(name, tensor)) {
            ne[2] /= 2;
            nb /= 2;
        }
        cr_assert_eq(eng_gguf_add_tensor(w, name, t->type, t->n_dims, ne, t->data, nb), 0);
    }
    cr_assert_eq(eng_gguf_write(w, dst, err, sizeof err), 0, "%s", err);
    eng_gguf_writer_free(w);
    eng_gguf_close(g);
}

static void rewrite(const char *src, const char *dst, const char *key, int64_t value, const char *tensor) {
    rewrite_ex(src, dst, key, value, tensor, false);
}

static void expect_load_error(const char *path, int want, const char *needle) {
    eng_model *m = NULL;
    char err[512] = "";
    int rc = eng_model_load(path, NULL, &m, err, sizeof err);
    cr_expect_eq(rc, want, "load gave %d (%s), expected %d", rc, err, want);
    cr_expect_null(m);
    cr_expect(strstr(err, needle) != NULL, "message '%s' does not name '%s'", err, needle);
    eng_model_free(m);
}

Test(moe, malformed_files_are_refused, .fini = made_cleanup) {
    tmpdir *tp = &made, t;
    make_model(tp, "f32");
    t = *tp;
    char bad[160];
    snprintf(bad, sizeof bad, "%s/bad.gguf", t.dir);
    rewrite(t.model, bad, "qwen3moe.expert_count", 0, NULL);
    expect_load_error(bad, ENG_ERR_FORMAT, "qwen3moe.expert_count");
    rewrite(t.model, bad, "qwen3moe.expert_used_count", 0, NULL);
    expect_load_error(bad, ENG_ERR_FORMAT, "qwen3moe.expert_used_count");
    rewrite(t.model, bad, "qwen3moe.expert_used_count", 9, NULL);
    expect_load_error(bad, ENG_ERR_FORMAT, "qwen3moe.expert_used_count");
    rewrite(t.model, bad, "qwen3moe.expert_count", 16, NULL); /* the tensors hold 8 */
    expect_load_error(bad, ENG_ERR_FORMAT, "ffn_gate_inp.weight");
    rewrite(t.model, bad, NULL, -1, "blk.1.ffn_down_exps.weight");
    expect_load_error(bad, ENG_ERR_FORMAT, "blk.1.ffn_down_exps.weight");
    rewrite(t.model, bad, "qwen3moe.expert_feed_forward_length", 32, NULL);
    expect_load_error(bad, ENG_ERR_FORMAT, "blk.0.ffn_gate_exps.weight");
    /* the untouched file loads, with its expert counts */
    eng_model *m = NULL;
    char err[256];
    cr_assert_eq(eng_model_load(t.model, NULL, &m, err, sizeof err), 0, "%s", err);
    const eng_hparams *hp = eng_model_hparams(m);
    cr_expect_eq(hp->arch, ENG_ARCH_QWEN3MOE);
    cr_expect_eq(hp->n_expert, 8);
    cr_expect_eq(hp->n_expert_used, 3);
    cr_expect_eq(hp->n_ff_exp, 64);
    eng_model_free(m);
}

/* gpt-oss: what llama.cpp requires is required (the window, the expert ff length, sinks, the attention output's and
 * the router's biases, a separate output), with a message naming it; the untouched file loads with gpt-oss's
 * hyper-parameters (alternating sliding blocks, top-k-then-softmax gating, the clamped SwiGLU, 1/sqrt(n_rot)). */
Test(moe, gpt_oss_malformed_files_are_refused, .fini = made_cleanup) {
    tmpdir *tp = &made, t;
    make_model_arch(tp, "f32", true);
    t = *tp;
    char bad[160];
    snprintf(bad, sizeof bad, "%s/bad.gguf", t.dir);
    rewrite(t.model, bad, "gpt-oss.attention.sliding_window", 0, NULL);
    expect_load_error(bad, ENG_ERR_FORMAT, "sliding_window");
    rewrite_ex(t.model, bad, "gpt-oss.expert_feed_forward_length", 0, NULL, true);
    expect_load_error(bad, ENG_ERR_FORMAT, "expert_feed_forward_length");
    static const char *const need[] = {"blk.0.attn_sinks.weight", "blk.1.attn_output.bias", "blk.1.ffn_gate_inp.bias",
                                       "blk.0.ffn_down_exps.bias", "blk.1.post_attention_norm.weight", "output.weight"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        rewrite_ex(t.model, bad, NULL, 0, need[i], true);
        expect_load_error(bad, ENG_ERR_FORMAT, need[i]);
    }
    eng_model *m = NULL;
    char err[256];
    cr_assert_eq(eng_model_load(t.model, NULL, &m, err, sizeof err), 0, "%s", err);
    const eng_hparams *hp = eng_model_hparams(m);
    cr_expect_eq(hp->arch, ENG_ARCH_GPT_OSS);
    cr_expect_eq(hp->n_swa, 8);
    cr_expect(m->layers[0].swa && !m->layers[1].swa, "block 0 slides, block 1 is global");
    cr_expect_eq(hp->moe_gating, ENG_MOE_SOFTMAX_WEIGHT);
    cr_expect_eq(hp->ffn_act, ENG_ACT_SWIGLU_OAI);
    cr_expect_float_eq(hp->attn_scale, 1.0f / sqrtf((float)hp->n_rot), 1e-7f);
    cr_expect_eq(hp->expert_weights_scale, 0.0f);
    for (int l = 0; l < 2; l++) {
        const eng_layer *ly = &m->layers[l];
        cr_expect(ly->attn_sinks && ly->bo && ly->bq && ly->ffn_norm && ly->moe.router_b && ly->moe.gate_b,
                  "layer %d: sinks, biases, pre-FFN norm", l);
        cr_expect_null(ly->post_attn_norm, "post_attention_norm is the pre-FFN norm, not a norm of the attention");
    }
    eng_model_free(m);
}
