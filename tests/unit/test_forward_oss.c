/*
 * test_forward_oss.c: the gpt-oss parts of the CPU forward pass (issue 26 item 2) against a plain double reference
 * written here: attention sinks (a per-head logit in the softmax's denominator), attn_output biases and the clamped
 * SwiGLU, on a small f32 llama model made by `kvserve mkmodel --biases` (Q/K/V/O biases). The sinks and the
 * activation are switched on in the loaded model (as the gpt-oss loader will), with a limit small enough that the
 * clamps bite; two sequences run interleaved in ragged chunks (paged, block size 4), each row's logits compared
 * with the reference. Also: the same model without the parts gives other logits (the parts take effect).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/model/model.h"
#include "helper_rng.h"
#include "helper_shared.h"

enum { T_MAX = 24 };

/* Row j of an f32 matrix [n_out][k]. */
static const float *mrow(const eng_matrix *w, int64_t j) {
    cr_assert_eq(w->type, 0u, "f32 matrices expected");
    return (const float *)w->data + (size_t)j * (size_t)w->k;
}

static void matvec(double *y, const eng_matrix *w, const double *x) {
    for (int64_t j = 0; j < w->n_out; j++) {
        const float *r = mrow(w, j);
        double s = 0;
        for (int64_t i = 0; i < w->k; i++) s += (double)r[i] * x[i];
        y[j] = s;
    }
}

static void rmsnorm(double *y, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * s * w[i];
}

static void rope(const eng_hparams *hp, double *v, int pos) { /* llama: pairs (2i, 2i + 1) */
    for (int i = 0; i < hp->n_rot / 2; i++) {
        double th = pos * pow(hp->rope_freq_base, -2.0 * i / hp->n_rot), a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * cos(th) - b * sin(th);
        v[2 * i + 1] = a * sin(th) + b * cos(th);
    }
}

/* Logits [T][V] of the tokens at positions 0..T-1 (one sequence). */
static void reference(const eng_model *m, const int32_t *toks, int T, float *logits) {
    const eng_hparams *hp = &m->hp;
    const int E = hp->n_embd, F = hp->n_ff, HD = hp->head_dim, QD = hp->n_head * HD, KD = hp->n_head_kv * HD;
    const int V = hp->n_vocab, G = hp->n_head / hp->n_head_kv;
    static double x[T_MAX][512], q[T_MAX][512], k[T_MAX][512], v[T_MAX][512];
    double xn[512], att[512], o[512], g[512], u[512], sc[T_MAX], *lg = malloc((size_t)V * sizeof *lg);
    cr_assert(E <= 512 && QD <= 512 && F <= 512 && T <= T_MAX && lg);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < E; i++) x[t][i] = mrow(&m->tok_embd, toks[t])[i];
    for (int l = 0; l < hp->n_layer; l++) {
        const eng_layer *ly = &m->layers[l];
        for (int t = 0; t < T; t++) {
            rmsnorm(xn, x[t], ly->attn_norm, E, hp->rms_eps);
            matvec(q[t], &ly->wq, xn);
            matvec(k[t], &ly->wk, xn);
            matvec(v[t], &ly->wv, xn);
            for (int i = 0; i < QD; i++) q[t][i] += ly->bq[i];
            for (int i = 0; i < KD; i++) k[t][i] += ly->bk[i], v[t][i] += ly->bv[i];
            for (int h = 0; h < hp->n_head; h++) rope(hp, q[t] + h * HD, t);
            for (int h = 0; h < hp->n_head_kv; h++) rope(hp, k[t] + h * HD, t);
        }
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < hp->n_head; h++) {
                const int kh = h / G;
                double mx = ly->attn_sinks[h], den;
                for (int s = 0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < HD; i++) d += q[t][h * HD + i] * k[s][kh * HD + i];
                    sc[s] = d * hp->attn_scale;
                    mx = sc[s] > mx ? sc[s] : mx;
                }
                den = exp(ly->attn_sinks[h] - mx); /* the sink joins the denominator only */
                for (int s = 0; s <= t; s++) den += (sc[s] = exp(sc[s] - mx));
                for (int i = 0; i < HD; i++) {
                    double a = 0;
                    for (int s = 0; s <= t; s++) a += sc[s] / den * v[s][kh * HD + i];
                    att[h * HD + i] = a;
                }
            }
            matvec(o, &ly->wo, att);
            for (int i = 0; i < E; i++) x[t][i] += o[i] + ly->bo[i];
            rmsnorm(xn, x[t], ly->ffn_norm, E, hp->rms_eps);
            matvec(g, &ly->w_gate, xn);
            matvec(u, &ly->w_up, xn);
            const double lim = hp->swiglu_limit;
            for (int i = 0; i < F; i++) {
                double a = g[i] < lim ? g[i] : lim, b = u[i] < -lim ? -lim : u[i] > lim ? lim : u[i];
                g[i] = a / (1.0 + exp(-hp->swiglu_alpha * a)) * (b + 1.0);
            }
            matvec(o, &ly->w_down, g);
            for (int i = 0; i < E; i++) x[t][i] += o[i];
        }
    }
    for (int t = 0; t < T; t++) {
        rmsnorm(xn, x[t], m->output_norm, E, hp->rms_eps);
        matvec(lg, &m->output, xn);
        for (int i = 0; i < V; i++) logits[(size_t)t * V + i] = (float)lg[i];
    }
    free(lg);
}

/* The model of mkmodel with sinks (random in [-2, 2] per head) and the clamped SwiGLU switched on. */
static eng_model *load_oss(const char *path, uint64_t seed) {
    eng_model *m = NULL;
    char err[512];
    cr_assert_eq(eng_model_load(path, NULL, &m, err, sizeof err), 0, "%s", err);
    rng r = {seed};
    for (int l = 0; l < m->hp.n_layer; l++) {
        cr_assert(m->layers[l].bo && m->layers[l].bq, "mkmodel --biases writes Q/K/V/O biases");
        float *s = malloc((size_t)m->hp.n_head * sizeof *s);
        cr_assert_not_null(s);
        for (int h = 0; h < m->hp.n_head; h++) s[h] = rng_uniform(&r, 2.0f);
        m->layers[l].attn_sinks = s; /* freed with the model */
    }
    m->hp.ffn_act = ENG_ACT_SWIGLU_OAI;
    m->hp.swiglu_limit = 0.05f; /* the gate and up values here are about 0.05 to 0.2: both clamps bite */
    return m;
}

Test(forward_oss, sinks_bias_swiglu_vs_reference, .timeout = 120) {
    char dir[] = "/tmp/kvs-fwd-oss-XXXXXX", path[256];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    const char *args[] = {"mkmodel", "-o", path, "--arch", "llama", "--embd", "64", "--layers", "2", "--heads", "4",
                          "--kv-heads", "2", "--ff", "96", "--type", "f32", "--biases", "--std", "0.2", "--seed", "3",
                          NULL};
    cr_assert_eq(kvt_run_kvserve(dir, args, NULL), 0, "kvserve mkmodel failed");
    eng_model *m = load_oss(path, 99);
    const int V = m->hp.n_vocab;
    eng_ctx_params p;
    eng_ctx_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = 64;
    p.max_seqs = 2;
    p.kv_block_size = 4;
    p.kv_dtype = KVC_DTYPE_F32;
    p.device = ENG_DEVICE_CPU;
    eng_ctx *c = NULL;
    char err[512];
    cr_assert_eq(eng_ctx_create(m, &p, &c, err, sizeof err), 0, "%s", err);
    rng r = {2026};
    int32_t toks[2][T_MAX], seq[2], done[2] = {0, 0};
    float *ref = malloc((size_t)2 * T_MAX * V * sizeof *ref);
    cr_assert_not_null(ref);
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < T_MAX; i++) toks[s][i] = 3 + rng_int(&r, V - 3);
        reference(m, toks[s], T_MAX, ref + (size_t)s * T_MAX * V);
        cr_assert_eq(kvc_seq_alloc(eng_ctx_cache(c), &seq[s]), 0);
    }
    double worst = 0;
    while (done[0] < T_MAX || done[1] < T_MAX) {
        int32_t bt[16], bp[16], bs[16], src[16], n = 0;
        bool want[16];
        for (int s = 0; s < 2; s++)
            for (int i = 0, chunk = 1 + rng_int(&r, 5); i < chunk && done[s] < T_MAX; i++, done[s]++, n++) {
                bt[n] = toks[s][done[s]], bp[n] = done[s], bs[n] = seq[s], src[n] = s, want[n] = true;
            }
        eng_batch b = {n, bt, bp, bs, want, NULL};
        cr_assert_eq(eng_decode(c, &b), 0);
        for (int i = 0; i < n; i++) {
            const float *lg = eng_get_logits(c, i), *rf = ref + ((size_t)src[i] * T_MAX + (size_t)bp[i]) * V;
            for (int j = 0; j < V; j++) worst = fmax(worst, fabs((double)lg[j] - rf[j]));
        }
    }
    cr_log_info("gpt-oss parts: max |logit - reference| = %.3g", worst);
    cr_assert_leq(worst, 1e-3, "logits differ from the reference by %g", worst);
    eng_ctx_free(c);
    /* without the sinks and the activation the same file gives other logits: the parts take effect */
    for (int l = 0; l < m->hp.n_layer; l++) {
        free(m->layers[l].attn_sinks);
        m->layers[l].attn_sinks = NULL;
    }
    m->hp.ffn_act = ENG_ACT_SILU;
    cr_assert_eq(eng_ctx_create(m, &p, &c, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvc_seq_alloc(eng_ctx_cache(c), &seq[0]), 0);
    int32_t pos[T_MAX], sq[T_MAX];
    bool want[T_MAX];
    for (int i = 0; i < T_MAX; i++) pos[i] = i, sq[i] = seq[0], want[i] = true;
    eng_batch b = {T_MAX, toks[0], pos, sq, want, NULL};
    cr_assert_eq(eng_decode(c, &b), 0);
    double diff = 0;
    for (int i = 0; i < T_MAX; i++)
        for (int j = 0; j < V; j++) diff = fmax(diff, fabs((double)eng_get_logits(c, i)[j] - ref[(size_t)i * V + j]));
    cr_assert_gt(diff, 0.05, "the sinks and the clamped SwiGLU change nothing (%g)", diff);
    eng_ctx_free(c);
    eng_model_free(m);
    free(ref);
    unlink(path);
    rmdir(dir);
}
