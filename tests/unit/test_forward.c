/*
 * test_forward.c: the engine's forward pass against a deliberately simple dense reference written here (f32
 * weights, one sequence, no cache, plain loops), on small random models built in the test with the GGUF
 * writer: llama (partial rotary, rope_freqs factors, separate output), qwen2 (Q/K/V biases, MQA, tied
 * embeddings), qwen3 (per-head Q/K norms, explicit head size). The engine runs paged (block size 4), batched,
 * with chunked prefill of random chunk sizes and several sequences interleaved. Also: forked sequences
 * (kvc_copy_prefix), attached cached prefixes, context shift (eng_seq_remove), batch-size invariance,
 * error cases (bad token, KV full), and model-loading errors. Every randomized test prints its seed.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "engine/model/model.h"
#include "engine/kernels/ops.h"
#include "engine/kernels/quant.h"

#include "helper_rng.h"

/* ---- the random model ---- */
enum { N_VOCAB = 272, MAX_L = 3 };

typedef struct rlayer {
    float *an, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *qn, *kn, *fn, *wg, *wu, *wd; /* matrices [n_out][k] */
} rlayer;

typedef struct rmodel {
    const char *arch;
    int E, L, H, HKV, HD, F, V, n_rot;
    bool explicit_hd, neox, tied, rope_freqs, biases, qknorm;
    float base, scale_linear, eps;
    uint32_t wtype; /* storage type of every matrix (norms and biases stay F32) */
    float *tok, *out, *onorm, *rf;
    rlayer ly[MAX_L];
    char path[256];
} rmodel;

static float *rand_vec(rng *r, size_t n, float center, float a) {
    float *v = malloc(n * sizeof *v);
    cr_assert_not_null(v);
    for (size_t i = 0; i < n; i++) v[i] = center + rng_uniform(r, a);
    return v;
}

static void add_vector(eng_gguf_writer *w, const char *name, const float *data, int64_t n) {
    int64_t ne[1] = {n};
    cr_assert_eq(eng_gguf_add_tensor(w, name, ENG_Q_F32, 1, ne, data, (size_t)n * sizeof(float)), 0, "%s", name);
}

/* A matrix [ne1 rows][ne0] stored as type. */
static void add_matrix(eng_gguf_writer *w, const char *name, uint32_t type, const float *data, int64_t ne0, int64_t ne1) {
    int64_t ne[2] = {ne0, ne1};
    size_t rb = eng_qtype_row_bytes(type, ne0);
    cr_assert_gt(rb, 0, "%s", name);
    char *buf = malloc(rb * (size_t)ne1);
    cr_assert_not_null(buf);
    for (int64_t r = 0; r < ne1; r++) cr_assert_eq(eng_quantize_row(type, data + r * ne0, buf + (size_t)r * rb, ne0), 0);
    cr_assert_eq(eng_gguf_add_tensor(w, name, type, 2, ne, buf, rb * (size_t)ne1), 0, "%s", name);
    free(buf);
}

/* Rounds a matrix to what type stores, so that the reference sees the weights the engine reads. */
static void round_matrix(uint32_t type, float *data, int64_t ne0, int64_t ne1) {
    if (type == ENG_Q_F32) return;
    size_t rb = eng_qtype_row_bytes(type, ne0);
    char *buf = malloc(rb);
    cr_assert_not_null(buf);
    for (int64_t r = 0; r < ne1; r++) {
        cr_assert_eq(eng_quantize_row(type, data + r * ne0, buf, ne0), 0);
        cr_assert_eq(eng_dequantize_row(type, buf, data + r * ne0, ne0), 0);
    }
    free(buf);
}

/* A minimal SentencePiece-style vocabulary: <unk>, <s>, </s>, 256 byte tokens and a few words. */
static void add_vocab(eng_gguf_writer *w) {
    static char texts[N_VOCAB][16];
    eng_gguf_str strs[N_VOCAB];
    float scores[N_VOCAB];
    int32_t types[N_VOCAB];
    for (int i = 0; i < N_VOCAB; i++) {
        if (i == 0) snprintf(texts[i], sizeof texts[i], "<unk>");
        else if (i == 1) snprintf(texts[i], sizeof texts[i], "<s>");
        else if (i == 2) snprintf(texts[i], sizeof texts[i], "</s>");
        else if (i < 259) snprintf(texts[i], sizeof texts[i], "<0x%02X>", i - 3);
        else snprintf(texts[i], sizeof texts[i], "\xe2\x96\x81w%d", i - 259);
        strs[i] = (eng_gguf_str){texts[i], strlen(texts[i])};
        scores[i] = i < 259 ? 0.0f : -(float)(i - 259);
        types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
    }
    cr_assert_eq(eng_gguf_add_str(w, "tokenizer.ggml.model", "llama", 5), 0);
    cr_assert_eq(eng_gguf_add_str_arr(w, "tokenizer.ggml.tokens", strs, N_VOCAB), 0);
    cr_assert_eq(eng_gguf_add_arr(w, "tokenizer.ggml.scores", ENG_GGUF_FLOAT32, scores, N_VOCAB), 0);
    cr_assert_eq(eng_gguf_add_arr(w, "tokenizer.ggml.token_type", ENG_GGUF_INT32, types, N_VOCAB), 0);
    cr_assert_eq(eng_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", 1), 0);
    cr_assert_eq(eng_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", 2), 0);
    cr_assert_eq(eng_gguf_add_u32(w, "tokenizer.ggml.unknown_token_id", 0), 0);
}

/* Which tensor a writer leaves out or distorts (for the loading-error tests). */
typedef enum { DEFECT_NONE, DEFECT_MISSING_FFN_UP1, DEFECT_BAD_DIMS_WK0 } defect;

static void write_model(rmodel *m, defect d) {
    eng_gguf_writer *w = NULL;
    cr_assert_eq(eng_gguf_writer_create(&w), 0);
    char key[128];
#define K(s) (snprintf(key, sizeof key, "%s.%s", m->arch, s), key)
    cr_assert_eq(eng_gguf_add_str(w, "general.architecture", m->arch, strlen(m->arch)), 0);
    cr_assert_eq(eng_gguf_add_str(w, "general.name", "random test model", 17), 0);
    cr_assert_eq(eng_gguf_add_u32(w, K("context_length"), 256), 0);
    cr_assert_eq(eng_gguf_add_u32(w, K("embedding_length"), (uint32_t)m->E), 0);
    cr_assert_eq(eng_gguf_add_u32(w, K("block_count"), (uint32_t)m->L), 0);
    cr_assert_eq(eng_gguf_add_u32(w, K("feed_forward_length"), (uint32_t)m->F), 0);
    cr_assert_eq(eng_gguf_add_u32(w, K("attention.head_count"), (uint32_t)m->H), 0);
    cr_assert_eq(eng_gguf_add_u32(w, K("attention.head_count_kv"), (uint32_t)m->HKV), 0);
    if (m->explicit_hd) cr_assert_eq(eng_gguf_add_u32(w, K("attention.key_length"), (uint32_t)m->HD), 0);
    if (m->n_rot != m->HD) cr_assert_eq(eng_gguf_add_u32(w, K("rope.dimension_count"), (uint32_t)m->n_rot), 0);
    cr_assert_eq(eng_gguf_add_f32(w, K("rope.freq_base"), m->base), 0);
    if (m->scale_linear != 1.0f) cr_assert_eq(eng_gguf_add_f32(w, K("rope.scale_linear"), m->scale_linear), 0);
    cr_assert_eq(eng_gguf_add_f32(w, K("attention.layer_norm_rms_epsilon"), m->eps), 0);
#undef K
    add_vocab(w);
    int QD = m->H * m->HD, KD = m->HKV * m->HD;
    add_matrix(w, "token_embd.weight", m->wtype, m->tok, m->E, m->V);
    if (!m->tied) add_matrix(w, "output.weight", m->wtype, m->out, m->E, m->V);
    add_vector(w, "output_norm.weight", m->onorm, m->E);
    if (m->rope_freqs) add_vector(w, "rope_freqs.weight", m->rf, m->n_rot / 2);
    char name[96];
    for (int l = 0; l < m->L; l++) {
        rlayer *y = &m->ly[l];
#define N(s) (snprintf(name, sizeof name, "blk.%d.%s", l, s), name)
        add_vector(w, N("attn_norm.weight"), y->an, m->E);
        add_matrix(w, N("attn_q.weight"), m->wtype, y->wq, m->E, QD);
        if (d == DEFECT_BAD_DIMS_WK0 && l == 0) add_matrix(w, N("attn_k.weight"), m->wtype, y->wk, KD, m->E);
        else add_matrix(w, N("attn_k.weight"), m->wtype, y->wk, m->E, KD);
        add_matrix(w, N("attn_v.weight"), m->wtype, y->wv, m->E, KD);
        add_matrix(w, N("attn_output.weight"), m->wtype, y->wo, QD, m->E);
        if (m->biases) {
            add_vector(w, N("attn_q.bias"), y->bq, QD);
            add_vector(w, N("attn_k.bias"), y->bk, KD);
            add_vector(w, N("attn_v.bias"), y->bv, KD);
        }
        if (m->qknorm) {
            add_vector(w, N("attn_q_norm.weight"), y->qn, m->HD);
            add_vector(w, N("attn_k_norm.weight"), y->kn, m->HD);
        }
        add_vector(w, N("ffn_norm.weight"), y->fn, m->E);
        add_matrix(w, N("ffn_gate.weight"), m->wtype, y->wg, m->E, m->F);
        if (!(d == DEFECT_MISSING_FFN_UP1 && l == 1)) add_matrix(w, N("ffn_up.weight"), m->wtype, y->wu, m->E, m->F);
        add_matrix(w, N("ffn_down.weight"), m->wtype, y->wd, m->F, m->E);
#undef N
    }
    snprintf(m->path, sizeof m->path, "/tmp/kvserve-test-forward-%d-%s-%d.gguf", (int)getpid(), m->arch, (int)d);
    char err[256];
    cr_assert_eq(eng_gguf_write(w, m->path, err, sizeof err), 0, "%s", err);
    eng_gguf_writer_free(w);
}

typedef enum { CFG_LLAMA, CFG_QWEN2, CFG_QWEN3, CFG_LLAMA_1L, CFG_LLAMA_HD32, CFG_GQA3 } cfg_kind;

static void make_model(rmodel *m, cfg_kind kind, uint64_t seed, uint32_t wtype) {
    memset(m, 0, sizeof *m);
    m->wtype = wtype;
    rng r = {seed * 0x9E3779B97F4A7C15ull + 1};
    m->V = N_VOCAB;
    m->base = 10000.0f;
    m->scale_linear = 1.0f;
    m->eps = 1e-5f;
    switch (kind) {
    case CFG_LLAMA: /* GQA 2:1, partial rotary, frequency factors, linear rope scaling */
    case CFG_LLAMA_1L:
        m->arch = "llama"; m->E = 48; m->L = kind == CFG_LLAMA_1L ? 1 : 2; m->H = 4; m->HKV = 2; m->HD = 12;
        m->F = 80; m->n_rot = 8; m->rope_freqs = true; m->scale_linear = 2.0f;
        break;
    case CFG_LLAMA_HD32: /* head size 32 (for Q8_0 KV rows), MHA */
        m->arch = "llama"; m->E = 64; m->L = 2; m->H = 2; m->HKV = 2; m->HD = 32; m->F = 64; m->n_rot = 32;
        break;
    case CFG_GQA3: /* GQA 3:1 with a head size of 32 (the vector attention kernels' sizes), like bench-135m */
        m->arch = "llama"; m->E = 48; m->L = 2; m->H = 6; m->HKV = 2; m->HD = 32; m->F = 64; m->n_rot = 32;
        m->explicit_hd = true;
        break;
    case CFG_QWEN2: /* MQA, biases, tied embeddings, NEOX rope */
        m->arch = "qwen2"; m->E = 64; m->L = 2; m->H = 4; m->HKV = 1; m->HD = 16; m->F = 96; m->n_rot = 16;
        m->biases = true; m->tied = true; m->neox = true; m->eps = 1e-6f; m->base = 1000000.0f;
        break;
    case CFG_QWEN3: /* explicit head size != E / H, per-head Q/K norms */
        m->arch = "qwen3"; m->E = 48; m->L = 2; m->H = 4; m->HKV = 2; m->HD = 24; m->F = 64; m->n_rot = 24;
        m->explicit_hd = true; m->qknorm = true; m->neox = true; m->eps = 1e-6f;
        break;
    }
    int QD = m->H * m->HD, KD = m->HKV * m->HD;
    float ws = 0.5f / sqrtf((float)m->E);
    m->tok = rand_vec(&r, (size_t)m->V * m->E, 0.0f, 1.0f);
    m->out = m->tied ? m->tok : rand_vec(&r, (size_t)m->V * m->E, 0.0f, 0.3f);
    m->onorm = rand_vec(&r, (size_t)m->E, 1.0f, 0.2f);
    if (m->rope_freqs) m->rf = rand_vec(&r, (size_t)m->n_rot / 2, 2.0f, 1.0f);
    for (int l = 0; l < m->L; l++) {
        rlayer *y = &m->ly[l];
        y->an = rand_vec(&r, (size_t)m->E, 1.0f, 0.2f);
        y->wq = rand_vec(&r, (size_t)QD * m->E, 0.0f, 3 * ws);
        y->wk = rand_vec(&r, (size_t)KD * m->E, 0.0f, 3 * ws);
        y->wv = rand_vec(&r, (size_t)KD * m->E, 0.0f, 3 * ws);
        y->wo = rand_vec(&r, (size_t)m->E * QD, 0.0f, ws);
        if (m->biases) {
            y->bq = rand_vec(&r, (size_t)QD, 0.0f, 0.5f);
            y->bk = rand_vec(&r, (size_t)KD, 0.0f, 0.5f);
            y->bv = rand_vec(&r, (size_t)KD, 0.0f, 0.5f);
        }
        if (m->qknorm) {
            y->qn = rand_vec(&r, (size_t)m->HD, 1.0f, 0.3f);
            y->kn = rand_vec(&r, (size_t)m->HD, 1.0f, 0.3f);
        }
        y->fn = rand_vec(&r, (size_t)m->E, 1.0f, 0.2f);
        y->wg = rand_vec(&r, (size_t)m->F * m->E, 0.0f, 2 * ws);
        y->wu = rand_vec(&r, (size_t)m->F * m->E, 0.0f, 2 * ws);
        y->wd = rand_vec(&r, (size_t)m->E * m->F, 0.0f, ws);
        round_matrix(wtype, y->wq, m->E, QD);
        round_matrix(wtype, y->wk, m->E, KD);
        round_matrix(wtype, y->wv, m->E, KD);
        round_matrix(wtype, y->wo, QD, m->E);
        round_matrix(wtype, y->wg, m->E, m->F);
        round_matrix(wtype, y->wu, m->E, m->F);
        round_matrix(wtype, y->wd, m->F, m->E);
    }
    round_matrix(wtype, m->tok, m->E, m->V);
    if (!m->tied) round_matrix(wtype, m->out, m->E, m->V);
    write_model(m, DEFECT_NONE);
}

static void free_rmodel(rmodel *m) {
    unlink(m->path);
    free(m->tok);
    if (!m->tied) free(m->out);
    free(m->onorm);
    free(m->rf);
    for (int l = 0; l < m->L; l++) {
        rlayer *y = &m->ly[l];
        float *ps[] = {y->an, y->wq, y->wk, y->wv, y->wo, y->bq, y->bk, y->bv, y->qn, y->kn, y->fn, y->wg, y->wu, y->wd};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) free(ps[i]);
    }
}

/* ---- the dense reference forward: logits[t][V] for every position of one sequence ---- */
static void ref_rmsnorm(double *y, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * s * w[i];
}
static void ref_matvec(double *y, const float *W, const double *x, int n_out, int k) {
    for (int j = 0; j < n_out; j++) {
        double s = 0;
        for (int i = 0; i < k; i++) s += (double)W[(size_t)j * k + i] * x[i];
        y[j] = s;
    }
}
static void ref_rope(const rmodel *m, double *v, int pos) {
    for (int i = 0; i < m->n_rot / 2; i++) {
        double theta = pos * pow(m->base, -2.0 * i / m->n_rot) / m->scale_linear;
        if (m->rope_freqs) theta /= m->rf[i];
        int a = m->neox ? i : 2 * i, b = m->neox ? i + m->n_rot / 2 : 2 * i + 1;
        double x0 = v[a], x1 = v[b];
        v[a] = x0 * cos(theta) - x1 * sin(theta);
        v[b] = x0 * sin(theta) + x1 * cos(theta);
    }
}

/* The dense reference: logits [T][V] and, when hidden is not NULL, the normed final hidden states [T][E]. */
static void ref_forward_h(const rmodel *m, const int32_t *toks, int T, float *logits, float *hidden) {
    int E = m->E, F = m->F, HD = m->HD, QD = m->H * HD, KD = m->HKV * HD;
    double *x = calloc((size_t)T * E, sizeof *x), *xn = calloc((size_t)E, sizeof *xn);
    double *q = calloc((size_t)T * QD, sizeof *q), *k = calloc((size_t)T * KD, sizeof *k);
    double *v = calloc((size_t)T * KD, sizeof *v), *att = calloc((size_t)QD, sizeof *att);
    double *o = calloc((size_t)E, sizeof *o), *g = calloc((size_t)F, sizeof *g), *u = calloc((size_t)F, sizeof *u);
    double *sc = calloc((size_t)T, sizeof *sc), *lg = calloc((size_t)m->V, sizeof *lg);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < E; i++) x[(size_t)t * E + i] = m->tok[(size_t)toks[t] * E + i];
    for (int l = 0; l < m->L; l++) {
        const rlayer *y = &m->ly[l];
        for (int t = 0; t < T; t++) {
            ref_rmsnorm(xn, x + (size_t)t * E, y->an, E, m->eps);
            double *qt = q + (size_t)t * QD, *kt = k + (size_t)t * KD, *vt = v + (size_t)t * KD;
            ref_matvec(qt, y->wq, xn, QD, E);
            ref_matvec(kt, y->wk, xn, KD, E);
            ref_matvec(vt, y->wv, xn, KD, E);
            if (m->biases) {
                for (int i = 0; i < QD; i++) qt[i] += y->bq[i];
                for (int i = 0; i < KD; i++) kt[i] += y->bk[i], vt[i] += y->bv[i];
            }
            for (int h = 0; h < m->H; h++) {
                if (m->qknorm) ref_rmsnorm(qt + h * HD, qt + h * HD, y->qn, HD, m->eps);
                ref_rope(m, qt + h * HD, t);
            }
            for (int h = 0; h < m->HKV; h++) {
                if (m->qknorm) ref_rmsnorm(kt + h * HD, kt + h * HD, y->kn, HD, m->eps);
                ref_rope(m, kt + h * HD, t);
            }
        }
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < m->H; h++) {
                int kh = h / (m->H / m->HKV);
                double mx = -1e300, sum = 0;
                for (int s = 0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < HD; i++) d += q[(size_t)t * QD + h * HD + i] * k[(size_t)s * KD + kh * HD + i];
                    sc[s] = d / sqrt((double)HD);
                    if (sc[s] > mx) mx = sc[s];
                }
                for (int s = 0; s <= t; s++) sum += (sc[s] = exp(sc[s] - mx));
                for (int i = 0; i < HD; i++) {
                    double a = 0;
                    for (int s = 0; s <= t; s++) a += sc[s] / sum * v[(size_t)s * KD + kh * HD + i];
                    att[h * HD + i] = a;
                }
            }
            ref_matvec(o, y->wo, att, E, QD);
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += o[i];
            ref_rmsnorm(xn, x + (size_t)t * E, y->fn, E, m->eps);
            ref_matvec(g, y->wg, xn, F, E);
            ref_matvec(u, y->wu, xn, F, E);
            for (int i = 0; i < F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ref_matvec(o, y->wd, g, E, F);
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += o[i];
        }
    }
    for (int t = 0; t < T; t++) {
        ref_rmsnorm(xn, x + (size_t)t * E, m->onorm, E, m->eps);
        for (int i = 0; hidden && i < E; i++) hidden[(size_t)t * E + i] = (float)xn[i];
        ref_matvec(lg, m->out, xn, m->V, E);
        for (int i = 0; i < m->V; i++) logits[(size_t)t * m->V + i] = (float)lg[i];
    }
    free(x); free(xn); free(q); free(k); free(v); free(att); free(o); free(g); free(u); free(sc); free(lg);
}

static void ref_forward(const rmodel *m, const int32_t *toks, int T, float *logits) {
    ref_forward_h(m, toks, T, logits, NULL);
}

/* ---- engine helpers ---- */
typedef struct engine { eng_model *model; eng_ctx *ctx; kvc_cache *kv; } engine;

static void open_engine_bs(engine *e, const rmodel *m, kvc_dtype dtype, int32_t max_seqs, int32_t kv_blocks,
                           bool prefix_caching, int32_t n_threads, int32_t block_size, int32_t n_ctx) {
    char err[512];
    cr_assert_eq(eng_model_load(m->path, NULL, &e->model, err, sizeof err), 0, "%s", err);
    eng_ctx_params p;
    eng_ctx_params_default(&p);
    p.n_threads = n_threads;
    p.n_ctx = n_ctx;
    p.max_seqs = max_seqs;
    p.max_batch_tokens = 64;
    p.kv_block_size = block_size;
    p.kv_blocks = kv_blocks;
    p.kv_dtype = dtype;
    p.prefix_caching = prefix_caching;
    cr_assert_eq(eng_ctx_create(e->model, &p, &e->ctx, err, sizeof err), 0, "%s", err);
    e->kv = eng_ctx_cache(e->ctx);
}

static void open_engine(engine *e, const rmodel *m, kvc_dtype dtype, int32_t max_seqs, int32_t kv_blocks,
                        bool prefix_caching, int32_t n_threads) {
    open_engine_bs(e, m, dtype, max_seqs, kv_blocks, prefix_caching, n_threads, 4, 128);
}

static void close_engine(engine *e) {
    eng_ctx_free(e->ctx);
    eng_model_free(e->model);
}

static double max_abs_diff(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) {
        double x = fabs((double)a[i] - (double)b[i]);
        if (!(x <= d)) d = x; /* NaN propagates */
    }
    return d;
}

/* Runs tokens[0..n) of seq at positions [p0, p0 + n) as one batch with logits for every row; compares each
 * row with ref[(p0 + i) * V] (when ref is not NULL); returns the largest difference. */
static double run_and_compare(engine *e, int32_t seq, const int32_t *tokens, int32_t p0, int32_t n, const float *ref,
                              int V) {
    int32_t pos[64], sq[64];
    bool want[64];
    cr_assert(n <= 64);
    for (int32_t i = 0; i < n; i++) pos[i] = p0 + i, sq[i] = seq, want[i] = true;
    eng_batch b = {n, tokens, pos, sq, want, NULL};
    cr_assert_eq(eng_decode(e->ctx, &b), 0);
    double d = 0;
    for (int32_t i = 0; ref && i < n; i++) {
        double x = max_abs_diff(eng_get_logits(e->ctx, i), ref + (size_t)(p0 + i) * V, V);
        if (!(x <= d)) d = x;
    }
    return d;
}

/* ---- tests ---- */
enum { N_SEQ = 3, MAX_T = 40 };

/* Several sequences interleaved in ragged batches of random chunks, against the dense reference. */
static void interleaved_vs_reference(cfg_kind kind, uint32_t wtype, kvc_dtype dtype, double tol, uint64_t seed,
                                     int32_t n_threads) {
    rmodel m;
    make_model(&m, kind, seed, wtype);
    engine e;
    open_engine(&e, &m, dtype, N_SEQ, 0, true, n_threads);
    rng r = {seed * 7919 + 3};
    int32_t toks[N_SEQ][MAX_T], len[N_SEQ], done[N_SEQ] = {0}, seq[N_SEQ];
    static float ref[N_SEQ][MAX_T * N_VOCAB];
    for (int s = 0; s < N_SEQ; s++) {
        len[s] = 8 + rng_int(&r, MAX_T - 8);
        for (int i = 0; i < len[s]; i++) toks[s][i] = rng_int(&r, N_VOCAB);
        ref_forward(&m, toks[s], len[s], ref[s]);
        cr_assert_eq(kvc_seq_alloc(e.kv, &seq[s]), 0);
    }
    double worst = 0, scale = 0;
    for (int s = 0; s < N_SEQ; s++)
        for (int i = 0; i < len[s] * N_VOCAB; i++)
            if (fabs(ref[s][i]) > scale) scale = fabs(ref[s][i]);
    for (int iter = 0; iter < 1000; iter++) {
        int32_t bt[64], bp[64], bs[64], src[64];
        bool want[64];
        int32_t n = 0;
        for (int s = 0; s < N_SEQ; s++) {
            if (done[s] == len[s] || rng_int(&r, 3) == 0) continue;
            int chunk = 1 + rng_int(&r, 7);
            for (int i = 0; i < chunk && done[s] < len[s]; i++, done[s]++) {
                bt[n] = toks[s][done[s]];
                bp[n] = done[s];
                bs[n] = seq[s];
                src[n] = s;
                want[n] = rng_int(&r, 4) != 0;
                n++;
            }
        }
        if (n == 0) {
            bool all = true;
            for (int s = 0; s < N_SEQ; s++) all = all && done[s] == len[s];
            if (all) break;
            continue;
        }
        eng_batch b = {n, bt, bp, bs, want, NULL};
        cr_assert_eq(eng_decode(e.ctx, &b), 0, "seed %llu", (unsigned long long)seed);
        for (int32_t i = 0; i < n; i++) {
            const float *lg = eng_get_logits(e.ctx, i);
            if (!want[i]) {
                cr_assert_null(lg);
                continue;
            }
            double d = max_abs_diff(lg, ref[src[i]] + (size_t)bp[i] * N_VOCAB, N_VOCAB);
            if (!(d <= worst)) worst = d;
        }
    }
    for (int s = 0; s < N_SEQ; s++) cr_assert_eq(kvc_seq_len(e.kv, seq[s]), len[s]);
    char msg[256];
    cr_assert_eq(kvc_check(e.kv, msg, sizeof msg), 0, "%s", msg);
    cr_log_info("%s weights %s, KV dtype %d, seed %llu, %d threads: max |logit - reference| = %.3g (max |logit| %.3g)",
                m.arch, eng_qtype_get(wtype)->name, (int)dtype, (unsigned long long)seed, n_threads, worst, scale);
    /* f32 weights: an absolute tolerance; quantized weights: relative to the largest reference logit (the engine
     * quantizes activations too, so the error grows with the logits' scale) */
    double limit = wtype == ENG_Q_F32 ? tol : tol * scale;
    cr_expect_leq(worst, limit, "%s seed %llu: logits differ from the reference by %g (limit %g)", m.arch,
                  (unsigned long long)seed, worst, limit);
    close_engine(&e);
    free_rmodel(&m);
}

TestSuite(forward, .timeout = 120);

Test(forward, llama_interleaved_f32_kv) {
    for (uint64_t seed = 1; seed <= 3; seed++) interleaved_vs_reference(CFG_LLAMA, ENG_Q_F32, KVC_DTYPE_F32, 1e-3, seed, 2);
}
Test(forward, qwen2_interleaved_f32_kv) {
    for (uint64_t seed = 11; seed <= 13; seed++) interleaved_vs_reference(CFG_QWEN2, ENG_Q_F32, KVC_DTYPE_F32, 1e-3, seed, 2);
}
Test(forward, qwen3_interleaved_f32_kv) {
    for (uint64_t seed = 21; seed <= 23; seed++) interleaved_vs_reference(CFG_QWEN3, ENG_Q_F32, KVC_DTYPE_F32, 1e-3, seed, 2);
}
Test(forward, one_thread_f32_kv) { interleaved_vs_reference(CFG_QWEN3, ENG_Q_F32, KVC_DTYPE_F32, 1e-3, 31, 1); }
Test(forward, f16_kv) {
    interleaved_vs_reference(CFG_LLAMA, ENG_Q_F32, KVC_DTYPE_F16, 3e-2, 41, 2);
    interleaved_vs_reference(CFG_QWEN2, ENG_Q_F32, KVC_DTYPE_F16, 3e-2, 42, 2);
}
/* Quantized weights: the reference uses the same (dequantized) weights in f32; the engine also quantizes the
 * activations to 8 bits, hence a tolerance relative to the logits' scale (1.5% of the largest; a real bug
 * gives errors of the order of the logits themselves). Head size 32 quantizes attention heads in place for
 * wo; head size 16 (qwen2 config) takes the whole-row path. */
Test(forward, quantized_weights) {
    interleaved_vs_reference(CFG_LLAMA_HD32, ENG_Q_Q8_0, KVC_DTYPE_F32, 1.5e-2, 121, 2);
    interleaved_vs_reference(CFG_QWEN2, ENG_Q_Q8_0, KVC_DTYPE_F32, 1.5e-2, 122, 2);
    interleaved_vs_reference(CFG_LLAMA_HD32, ENG_Q_Q4_0, KVC_DTYPE_F32, 1.5e-2, 123, 2);
    interleaved_vs_reference(CFG_LLAMA_HD32, ENG_Q_MXFP4, KVC_DTYPE_F32, 1.5e-2, 125, 2); /* packed MXFP4 */
    interleaved_vs_reference(CFG_QWEN2, ENG_Q_F16, KVC_DTYPE_F32, 1e-4, 124, 1);
}
Test(forward, q8_0_kv) { interleaved_vs_reference(CFG_LLAMA_HD32, ENG_Q_F32, KVC_DTYPE_Q8_0, 1.5e-1, 51, 2); }

/* Batches that mix prefill runs (longer than one attention tile: up to 16 rows per tile) and decode rows of
 * several sequences, with GQA (3 query heads per KV head, and MQA), each sequence's rows sometimes adjacent
 * in the batch, sometimes interleaved with another sequence's, against the dense reference: every KV dtype,
 * 1 and 2 threads, cache blocks of 4 and 16 rows. A huge context (n_ctx) makes the engine use fewer queries
 * per attention unit (1-row tiles, and a KV head's query heads split into groups). */
enum { MIX_SEQ = 4, MIX_T = 100 };
static void mixed_vs_reference(cfg_kind kind, kvc_dtype dtype, double tol, uint64_t seed, int32_t n_threads,
                               int32_t block_size, int32_t n_ctx) {
    rmodel m;
    make_model(&m, kind, seed, ENG_Q_F32);
    engine e;
    /* enough blocks for every sequence (a huge n_ctx would otherwise size the pool after it) */
    int32_t blocks = MIX_SEQ * ((MIX_T + block_size - 1) / block_size + 1);
    open_engine_bs(&e, &m, dtype, MIX_SEQ, blocks, false, n_threads, block_size, n_ctx);
    rng r = {seed * 104729 + 5};
    static int32_t toks[MIX_SEQ][MIX_T];
    static float ref[MIX_SEQ][MIX_T * N_VOCAB];
    int32_t len[MIX_SEQ], done[MIX_SEQ] = {0}, seq[MIX_SEQ];
    for (int s = 0; s < MIX_SEQ; s++) {
        len[s] = MIX_T / 2 + rng_int(&r, MIX_T / 2 + 1);
        for (int i = 0; i < len[s]; i++) toks[s][i] = rng_int(&r, N_VOCAB);
        ref_forward(&m, toks[s], len[s], ref[s]);
        cr_assert_eq(kvc_seq_alloc(e.kv, &seq[s]), 0);
    }
    double worst = 0;
    int n_batches = 0, n_mixed = 0;
    for (int iter = 0; iter < 200; iter++) {
        /* each sequence: nothing, one decode row, or a prefill run of 2..40 rows (rows of a run past the first
         * 40 wait for the next batch); sequences in random order */
        int32_t order[MIX_SEQ], cnt[MIX_SEQ], total = 0;
        for (int s = 0; s < MIX_SEQ; s++) order[s] = s;
        for (int s = MIX_SEQ - 1; s > 0; s--) {
            int j = rng_int(&r, s + 1), t = order[s];
            order[s] = order[j];
            order[j] = t;
        }
        int n_decode = 0, n_run = 0;
        for (int k = 0; k < MIX_SEQ; k++) {
            int s = order[k], left = len[s] - done[s], kind_s = rng_int(&r, 3);
            int c = kind_s == 0 ? 0 : kind_s == 1 ? 1 : 2 + rng_int(&r, 39);
            if (c > left) c = left;
            if (total + c > 64) c = 64 - total;
            cnt[s] = c;
            total += c;
            n_decode += c == 1;
            n_run += c > 1;
        }
        if (total == 0) {
            bool all = true;
            for (int s = 0; s < MIX_SEQ; s++) all = all && done[s] == len[s];
            if (all) break;
            continue;
        }
        /* lay the rows out: sequence by sequence, except that the first two sequences' rows alternate half the
         * time (a run's rows then sit anywhere in the batch) */
        int32_t bt[64], bp[64], bs[64], src[64];
        bool want[64];
        int32_t n = 0, next[MIX_SEQ];
        for (int s = 0; s < MIX_SEQ; s++) next[s] = done[s];
        bool alternate = rng_int(&r, 2) == 0;
        for (int k = 0; k < MIX_SEQ; k++) {
            int s = order[k];
            if (alternate && k == 1) continue; /* taken with k == 0 */
            int s2 = alternate && k == 0 ? order[1] : -1;
            while (next[s] < done[s] + cnt[s] || (s2 >= 0 && next[s2] < done[s2] + cnt[s2])) {
                int pick[2] = {s, s2};
                for (int j = 0; j < 2; j++) {
                    int t = pick[j];
                    if (t < 0 || next[t] >= done[t] + cnt[t]) continue;
                    bt[n] = toks[t][next[t]];
                    bp[n] = next[t];
                    bs[n] = seq[t];
                    src[n] = t;
                    want[n] = rng_int(&r, 3) != 0;
                    next[t]++;
                    n++;
                }
            }
        }
        cr_assert_eq(n, total);
        eng_batch b = {n, bt, bp, bs, want, NULL};
        cr_assert_eq(eng_decode(e.ctx, &b), 0, "seed %llu", (unsigned long long)seed);
        for (int32_t i = 0; i < n; i++) {
            if (!want[i]) continue;
            double d = max_abs_diff(eng_get_logits(e.ctx, i), ref[src[i]] + (size_t)bp[i] * N_VOCAB, N_VOCAB);
            if (!(d <= worst)) worst = d;
        }
        for (int s = 0; s < MIX_SEQ; s++) done[s] += cnt[s];
        n_batches++;
        n_mixed += n_decode > 0 && n_run > 0;
    }
    for (int s = 0; s < MIX_SEQ; s++) cr_assert_eq(kvc_seq_len(e.kv, seq[s]), len[s]);
    cr_log_info("mixed %s (%d/%d heads), KV dtype %d, block %d, n_ctx %d, seed %llu, %d threads: %d batches (%d "
                "mixing runs and decode rows), max |logit - reference| = %.3g",
                m.arch, m.H, m.HKV, (int)dtype, block_size, n_ctx, (unsigned long long)seed, n_threads, n_batches,
                n_mixed, worst);
    cr_expect_gt(n_mixed, 0, "no batch mixed prefill runs and decode rows");
    cr_expect_leq(worst, tol, "seed %llu: logits differ from the reference by %g (limit %g)", (unsigned long long)seed,
                  worst, tol);
    close_engine(&e);
    free_rmodel(&m);
}

Test(forward, mixed_prefill_decode_gqa) {
    for (int32_t th = 1; th <= 2; th++) {
        mixed_vs_reference(CFG_GQA3, KVC_DTYPE_F32, 1e-3, 141, th, 16, 128);
        mixed_vs_reference(CFG_GQA3, KVC_DTYPE_F16, 3e-2, 142, th, 4, 128);
        mixed_vs_reference(CFG_GQA3, KVC_DTYPE_Q8_0, 1.5e-1, 143, th, 16, 128);
        mixed_vs_reference(CFG_QWEN2, KVC_DTYPE_F16, 3e-2, 144, th, 16, 128); /* MQA: 4 query heads per KV head */
        mixed_vs_reference(CFG_LLAMA, KVC_DTYPE_F32, 1e-3, 145, th, 4, 128); /* head size 12: the AVX2 kernels */
        /* 4 MiB of scores per thread: 3 queries per unit (MQA: groups of 3 and 1 heads), then 1 */
        mixed_vs_reference(CFG_QWEN2, KVC_DTYPE_F32, 1e-3, 146, th, 16, 300000);
        mixed_vs_reference(CFG_GQA3, KVC_DTYPE_F16, 3e-2, 147, th, 16, 600000);
    }
}

/* A sequence forked with kvc_copy_prefix from a common prompt continues exactly as the independently
 * computed one. */
Test(forward, fork_copy_prefix) {
    for (uint64_t seed = 61; seed <= 62; seed++) {
        rmodel m;
        make_model(&m, seed == 61 ? CFG_LLAMA : CFG_QWEN2, seed, ENG_Q_F32);
        engine e;
        open_engine(&e, &m, KVC_DTYPE_F32, 4, 0, false, 2);
        rng r = {seed};
        int P = 9 + rng_int(&r, 6), C = 7;
        int32_t a[MAX_T], b[MAX_T];
        for (int i = 0; i < P + C; i++) a[i] = b[i] = rng_int(&r, N_VOCAB);
        for (int i = P; i < P + C; i++) b[i] = rng_int(&r, N_VOCAB);
        static float ra[MAX_T * N_VOCAB], rb[MAX_T * N_VOCAB];
        ref_forward(&m, a, P + C, ra);
        ref_forward(&m, b, P + C, rb);
        int32_t sa, sb;
        cr_assert_eq(kvc_seq_alloc(e.kv, &sa), 0);
        cr_assert_eq(kvc_seq_alloc(e.kv, &sb), 0);
        double d = run_and_compare(&e, sa, a, 0, P, ra, N_VOCAB);
        cr_assert_eq(kvc_copy_prefix(e.kv, sa, sb, P), 0);
        /* both continue in one batch, one token at a time */
        for (int i = P; i < P + C; i++) {
            int32_t t[2] = {a[i], b[i]}, p[2] = {i, i}, s[2] = {sa, sb};
            bool w[2] = {true, true};
            eng_batch bt = {2, t, p, s, w, NULL};
            cr_assert_eq(eng_decode(e.ctx, &bt), 0);
            double da = max_abs_diff(eng_get_logits(e.ctx, 0), ra + (size_t)i * N_VOCAB, N_VOCAB);
            double db = max_abs_diff(eng_get_logits(e.ctx, 1), rb + (size_t)i * N_VOCAB, N_VOCAB);
            if (!(da <= d)) d = da;
            if (!(db <= d)) d = db;
        }
        cr_expect_leq(d, 1e-3, "seed %llu: forked sequences differ from the reference by %g", (unsigned long long)seed, d);
        /* a sequence that shares blocks cannot shift its context */
        cr_expect_eq(eng_seq_remove(e.ctx, sb, 1, 3), ENG_ERR_UNSUPPORTED);
        cr_expect_eq(kvc_seq_len(e.kv, sb), P + C);
        cr_expect_eq(eng_seq_remove(e.ctx, 99, 0, 1), ENG_ERR_INVALID);
        close_engine(&e);
        free_rmodel(&m);
    }
}

/* A new sequence that attaches cached prefix blocks gives the same logits as recomputing them. */
Test(forward, attach_prefix) {
    rmodel m;
    make_model(&m, CFG_QWEN3, 71, ENG_Q_F32);
    engine e;
    open_engine(&e, &m, KVC_DTYPE_F32, 2, 0, true, 2);
    rng r = {71};
    int T = 19;
    int32_t toks[MAX_T];
    for (int i = 0; i < T; i++) toks[i] = rng_int(&r, N_VOCAB);
    static float ref[MAX_T * N_VOCAB];
    ref_forward(&m, toks, T, ref);
    int32_t s0, s1, n_cached = 0;
    cr_assert_eq(kvc_seq_alloc(e.kv, &s0), 0);
    run_and_compare(&e, s0, toks, 0, T, NULL, N_VOCAB);
    cr_assert_eq(kvc_seq_free(e.kv, s0), 0);
    cr_assert_eq(kvc_seq_alloc(e.kv, &s1), 0);
    cr_assert_eq(kvc_attach_prefix(e.kv, s1, toks, T - 1, &n_cached), 0);
    cr_assert_eq(n_cached, 16, "attached %d tokens", n_cached); /* 4 full blocks of 4 */
    double d = run_and_compare(&e, s1, toks + n_cached, n_cached, T - n_cached, ref, N_VOCAB);
    cr_expect_leq(d, 1e-3, "logits after an attached prefix differ from the reference by %g", d);
    close_engine(&e);
    free_rmodel(&m);
}

/* Context shift: with one layer a token's K and V depend only on the token and its position, so after
 * removing positions from the middle (and re-rotating the moved keys) the cache must equal a fresh
 * sequence of the remaining tokens, and decoding continues exactly as the reference over them. */
Test(forward, context_shift) {
    for (uint64_t seed = 81; seed <= 83; seed++) {
        rmodel m;
        make_model(&m, CFG_LLAMA_1L, seed, ENG_Q_F32);
        if (seed == 83) { /* NEOX pairing too */
            m.neox = true;
            m.arch = "qwen2";
            m.biases = true;
            rng rb = {seed};
            for (int l = 0; l < m.L; l++) {
                m.ly[l].bq = rand_vec(&rb, (size_t)m.H * m.HD, 0.0f, 0.5f);
                m.ly[l].bk = rand_vec(&rb, (size_t)m.HKV * m.HD, 0.0f, 0.5f);
                m.ly[l].bv = rand_vec(&rb, (size_t)m.HKV * m.HD, 0.0f, 0.5f);
            }
            unlink(m.path);
            write_model(&m, DEFECT_NONE);
        }
        engine e;
        open_engine(&e, &m, KVC_DTYPE_F32, 2, 0, false, 2);
        rng r = {seed};
        int L = 26, b0 = 5 + rng_int(&r, 5), e0 = b0 + 3 + rng_int(&r, 7), C = 6;
        int32_t toks[MAX_T], rest[MAX_T];
        for (int i = 0; i < L + C; i++) toks[i] = rng_int(&r, N_VOCAB);
        int nr = 0;
        for (int i = 0; i < L; i++)
            if (i < b0 || i >= e0) rest[nr++] = toks[i];
        for (int i = 0; i < C; i++) rest[nr++] = toks[L + i];
        static float ref[2 * MAX_T * N_VOCAB];
        ref_forward(&m, rest, nr, ref);
        int32_t s;
        cr_assert_eq(kvc_seq_alloc(e.kv, &s), 0);
        run_and_compare(&e, s, toks, 0, L, NULL, N_VOCAB);
        cr_assert_eq(eng_seq_remove(e.ctx, s, b0, e0), 0);
        int32_t kept = L - (e0 - b0);
        cr_assert_eq(kvc_seq_len(e.kv, s), kept);
        double d = 0;
        for (int i = 0; i < C; i++) {
            double x = run_and_compare(&e, s, toks + L + i, kept + i, 1, ref, N_VOCAB);
            if (!(x <= d)) d = x;
        }
        cr_log_info("context shift seed %llu: removed [%d, %d) of %d, max diff %.3g", (unsigned long long)seed, b0, e0,
                    L, d);
        cr_expect_leq(d, 1e-3, "seed %llu: after a context shift logits differ by %g", (unsigned long long)seed, d);
        /* tail removal then continuing with other tokens */
        cr_assert_eq(eng_seq_remove(e.ctx, s, kept, INT32_MAX), 0);
        cr_assert_eq(kvc_seq_len(e.kv, s), kept);
        close_engine(&e);
        free_rmodel(&m);
    }
}

/* The logits of a sequence do not depend on what else is in the batch or how it is chunked. */
Test(forward, batch_invariance) {
    rmodel m;
    make_model(&m, CFG_LLAMA, 91, ENG_Q_F32);
    engine e1, e2;
    open_engine(&e1, &m, KVC_DTYPE_F16, 4, 0, false, 2);
    open_engine(&e2, &m, KVC_DTYPE_F16, 4, 0, false, 2);
    rng r = {91};
    int T = 20;
    int32_t toks[MAX_T], other[MAX_T];
    for (int i = 0; i < T; i++) toks[i] = rng_int(&r, N_VOCAB), other[i] = rng_int(&r, N_VOCAB);
    static float alone[MAX_T * N_VOCAB];
    int32_t s1, s2, s3;
    cr_assert_eq(kvc_seq_alloc(e1.kv, &s1), 0);
    /* e1: one token at a time, alone */
    for (int i = 0; i < T; i++) {
        run_and_compare(&e1, s1, toks + i, i, 1, NULL, N_VOCAB);
        memcpy(alone + (size_t)i * N_VOCAB, eng_get_logits(e1.ctx, 0), N_VOCAB * sizeof(float));
    }
    /* e2: the whole prompt in one batch with another sequence's rows interleaved */
    cr_assert_eq(kvc_seq_alloc(e2.kv, &s2), 0);
    cr_assert_eq(kvc_seq_alloc(e2.kv, &s3), 0);
    int32_t bt[64], bp[64], bs[64];
    bool w[64];
    int n = 0;
    for (int i = 0; i < T; i++) {
        bt[n] = other[i], bp[n] = i, bs[n] = s3, w[n] = false, n++;
        bt[n] = toks[i], bp[n] = i, bs[n] = s2, w[n] = true, n++;
    }
    eng_batch b = {n, bt, bp, bs, w, NULL};
    cr_assert_eq(eng_decode(e2.ctx, &b), 0);
    double d = 0;
    for (int i = 0; i < T; i++) {
        double x = max_abs_diff(eng_get_logits(e2.ctx, 2 * i + 1), alone + (size_t)i * N_VOCAB, N_VOCAB);
        if (!(x <= d)) d = x;
    }
    cr_expect_leq(d, 1e-4, "batched logits differ from one-at-a-time logits by %g", d);
    close_engine(&e1);
    close_engine(&e2);
    free_rmodel(&m);
}

/* eng_get_embeddings: the normed final hidden state of each row that asked, equal to the dense reference's and
 * the same whether a row runs alone or in a batch with another sequence (rows that did not ask give NULL). */
/* A tied output matrix, once packed, serves the embedding lookups from its packed copy (its mapped rows are
 * released): every token's embedding is still exactly its dequantized row (bit for bit). F16 has no packed
 * layout: its lookups read the mapped rows. */
Test(forward, tied_embeddings_from_packed_rows) {
    const uint32_t types[] = {ENG_Q_Q8_0, ENG_Q_Q4_0, ENG_Q_F16};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        rmodel m;
        make_model(&m, CFG_QWEN2, 131 + ti, types[ti]);
        eng_model *mdl = NULL;
        char err[256];
        cr_assert_eq(eng_model_load(m.path, NULL, &mdl, err, sizeof err), 0, "%s", err);
        cr_assert_eq(eng_model_pack_cpu(mdl), 0);
        cr_assert_eq(mdl->output.packed != NULL, types[ti] != ENG_Q_F16);
        cr_assert_eq(mdl->output.data, mdl->tok_embd.data);
        float row[64];
        char scratch[512];
        cr_assert(m.E <= 64 && mdl->tok_embd.row_bytes <= sizeof scratch);
        for (int32_t t = 0; t < m.V; t++) {
            cr_assert_eq(eng_model_embd_row(mdl, t, row, scratch), 0);
            cr_assert(memcmp(row, m.tok + (size_t)t * m.E, (size_t)m.E * sizeof(float)) == 0,
                      "type %u: token %d's embedding differs", types[ti], t);
        }
        cr_assert_eq(eng_model_embd_row(mdl, -1, row, scratch), ENG_ERR_INVALID);
        cr_assert_eq(eng_model_embd_row(mdl, m.V, row, scratch), ENG_ERR_INVALID);
        eng_model_free(mdl);
        free_rmodel(&m);
    }
}

Test(forward, embeddings_match_reference_and_batching) {
    rmodel m;
    make_model(&m, CFG_QWEN2, 97, ENG_Q_F32);
    engine e1, e2;
    open_engine(&e1, &m, KVC_DTYPE_F32, 4, 0, false, 2);
    open_engine(&e2, &m, KVC_DTYPE_F32, 4, 0, false, 2);
    rng r = {97};
    enum { T = 18 };
    int32_t toks[T], other[T];
    for (int i = 0; i < T; i++) toks[i] = rng_int(&r, N_VOCAB), other[i] = rng_int(&r, N_VOCAB);
    static float ref_lg[T * N_VOCAB], alone[T * 512];
    float *ref_h = malloc((size_t)T * m.E * sizeof *ref_h);
    cr_assert(m.E <= 512 && ref_h);
    ref_forward_h(&m, toks, T, ref_lg, ref_h);
    int32_t s1, s2, s3;
    cr_assert_eq(kvc_seq_alloc(e1.kv, &s1), 0);
    double d = 0;
    for (int i = 0; i < T; i++) { /* e1: one row at a time */
        int32_t pos = i;
        bool want = false, embd = true;
        eng_batch b = {1, toks + i, &pos, &s1, &want, &embd};
        cr_assert_eq(eng_decode(e1.ctx, &b), 0);
        const float *h = eng_get_embeddings(e1.ctx, 0);
        cr_assert_not_null(h);
        memcpy(alone + (size_t)i * m.E, h, (size_t)m.E * sizeof *h);
        double x = max_abs_diff(h, ref_h + (size_t)i * m.E, m.E);
        if (!(x <= d)) d = x;
    }
    cr_expect_leq(d, 1e-3, "hidden states differ from the reference by %g", d);
    /* e2: the whole prompt interleaved with another sequence's rows, which do not ask */
    cr_assert_eq(kvc_seq_alloc(e2.kv, &s2), 0);
    cr_assert_eq(kvc_seq_alloc(e2.kv, &s3), 0);
    int32_t bt[2 * T], bp[2 * T], bs[2 * T];
    bool w[2 * T], we[2 * T];
    int n = 0;
    for (int i = 0; i < T; i++) {
        bt[n] = other[i], bp[n] = i, bs[n] = s3, w[n] = i == T - 1, we[n] = false, n++;
        bt[n] = toks[i], bp[n] = i, bs[n] = s2, w[n] = false, we[n] = true, n++;
    }
    eng_batch b = {n, bt, bp, bs, w, we};
    cr_assert_eq(eng_decode(e2.ctx, &b), 0);
    d = 0;
    for (int i = 0; i < T; i++) {
        cr_assert_null(eng_get_embeddings(e2.ctx, 2 * i), "row %d did not ask", 2 * i);
        double x = max_abs_diff(eng_get_embeddings(e2.ctx, 2 * i + 1), alone + (size_t)i * m.E, m.E);
        if (!(x <= d)) d = x;
    }
    cr_expect_leq(d, 1e-5, "batched hidden states differ from one-at-a-time ones by %g", d);
    cr_assert_not_null(eng_get_logits(e2.ctx, 2 * T - 2), "logits of another row in the same batch still come");
    cr_assert_null(eng_get_embeddings(e2.ctx, -1));
    cr_assert_null(eng_get_embeddings(e2.ctx, n));
    free(ref_h);
    close_engine(&e1);
    close_engine(&e2);
    free_rmodel(&m);
}

/* Bad token ids, bad positions and a full pool fail without changing the cache; the context stays usable. */
Test(forward, errors_leave_cache_unchanged) {
    rmodel m;
    make_model(&m, CFG_QWEN2, 101, ENG_Q_F32);
    engine e;
    open_engine(&e, &m, KVC_DTYPE_F32, 2, 4, false, 2); /* 4 blocks of 4 tokens */
    rng r = {101};
    int32_t toks[MAX_T];
    for (int i = 0; i < MAX_T; i++) toks[i] = rng_int(&r, N_VOCAB);
    static float ref[MAX_T * N_VOCAB];
    ref_forward(&m, toks, 14, ref);
    int32_t s;
    cr_assert_eq(kvc_seq_alloc(e.kv, &s), 0);
    run_and_compare(&e, s, toks, 0, 6, NULL, N_VOCAB);
    kvc_stats before, after;
    kvc_get_stats(e.kv, &before);
    char msg[256];

    int32_t bad_tok[2] = {toks[6], N_VOCAB}, pos[2] = {6, 7}, sq[2] = {s, s};
    bool w[2] = {true, true};
    eng_batch b = {2, bad_tok, pos, sq, w, NULL};
    cr_expect_eq(eng_decode(e.ctx, &b), ENG_ERR_INVALID);
    bad_tok[1] = -1;
    cr_expect_eq(eng_decode(e.ctx, &b), ENG_ERR_INVALID);
    cr_expect_null(eng_get_logits(e.ctx, 0));
    int32_t gap_pos[2] = {7, 8};
    eng_batch g = {2, toks + 6, gap_pos, sq, w, NULL};
    int rc = eng_decode(e.ctx, &g);
    cr_expect(rc == ENG_ERR_KV || rc == ENG_ERR_INVALID, "gap in positions: %d", rc);
    eng_batch empty = {0, toks, pos, sq, w, NULL};
    cr_expect_eq(eng_decode(e.ctx, &empty), ENG_ERR_INVALID);

    /* 6 tokens held in 2 blocks; 11 more need 3 more blocks but only 2 are left */
    int32_t p11[11], s11[11];
    bool w11[11];
    for (int i = 0; i < 11; i++) p11[i] = 6 + i, s11[i] = s, w11[i] = true;
    eng_batch full = {11, toks + 6, p11, s11, w11, NULL};
    cr_expect_eq(eng_decode(e.ctx, &full), ENG_ERR_KV_FULL);
    kvc_get_stats(e.kv, &after);
    cr_expect_eq(kvc_seq_len(e.kv, s), 6);
    cr_expect_eq(after.blocks_used, before.blocks_used);
    cr_expect_eq(after.blocks_free, before.blocks_free);
    cr_assert_eq(kvc_check(e.kv, msg, sizeof msg), 0, "%s", msg);

    /* still correct afterwards */
    double d = run_and_compare(&e, s, toks + 6, 6, 8, ref, N_VOCAB);
    cr_expect_leq(d, 1e-3, "after failed decodes logits differ by %g", d);
    close_engine(&e);
    free_rmodel(&m);
}

/* Loading errors name the file and the tensor; unknown architectures are refused by name. */
Test(forward, load_errors) {
    rmodel m;
    make_model(&m, CFG_LLAMA, 111, ENG_Q_F32);
    char err[512];
    eng_model *mdl = NULL;
    char ok_path[256];
    snprintf(ok_path, sizeof ok_path, "%s", m.path);

    write_model(&m, DEFECT_MISSING_FFN_UP1);
    cr_expect_eq(eng_model_load(m.path, NULL, &mdl, err, sizeof err), ENG_ERR_FORMAT);
    cr_expect_null(mdl);
    cr_expect(strstr(err, "blk.1.ffn_up.weight") && strstr(err, m.path), "message: %s", err);
    unlink(m.path);

    write_model(&m, DEFECT_BAD_DIMS_WK0);
    cr_expect_eq(eng_model_load(m.path, NULL, &mdl, err, sizeof err), ENG_ERR_FORMAT);
    cr_expect(strstr(err, "blk.0.attn_k.weight") != NULL, "message: %s", err);
    unlink(m.path);

    m.arch = "gpt9";
    write_model(&m, DEFECT_NONE);
    cr_expect_eq(eng_model_load(m.path, NULL, &mdl, err, sizeof err), ENG_ERR_UNSUPPORTED);
    cr_expect(strstr(err, "unsupported architecture gpt9") != NULL, "message: %s", err);
    /* a vocab-only load does not need the architecture or tensors */
    eng_load_params lp;
    eng_load_params_default(&lp);
    lp.vocab_only = true;
    cr_expect_eq(eng_model_load(m.path, &lp, &mdl, err, sizeof err), 0, "%s", err);
    eng_model_free(mdl);
    mdl = NULL;
    unlink(m.path);

    cr_expect_neq(eng_model_load("/nonexistent/model.gguf", NULL, &mdl, err, sizeof err), 0);
    m.arch = "llama";
    snprintf(m.path, sizeof m.path, "%s", ok_path);
    /* no mmap: same hparams */
    eng_load_params_default(&lp);
    lp.use_mmap = false;
    cr_assert_eq(eng_model_load(m.path, &lp, &mdl, err, sizeof err), 0, "%s", err);
    const eng_hparams *hp = eng_model_hparams(mdl);
    cr_expect_eq(hp->n_embd, m.E);
    cr_expect_eq(hp->head_dim, m.HD);
    cr_expect_eq(hp->n_rot, m.n_rot);
    cr_expect_eq(hp->n_vocab, N_VOCAB);
    cr_expect(!hp->tied_embeddings && !hp->neox_rope);
    cr_expect_float_eq(hp->rope_freq_scale, 0.5f, 1e-7);
    eng_model_free(mdl);
    free_rmodel(&m);
}

