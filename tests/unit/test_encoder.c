/* test_encoder.c: the encoder models (bert, nomic-bert, jina-bert-v2; engine/model/encoder.c,
 * engine/runtime/encoder_fwd.c) and the WordPiece tokenizer (engine/text/tok_wpm.c). Models are written by
 * `kvserve mkmodel --arch bert|nomic-bert|jina-bert-v2`
 * into a temporary directory. The forward pass is checked against a plain reference in double written here from
 * the GGUF's tensors (randomized sequences and batches), for batch invariance bit for bit, and for the batch
 * contract; the tokenizer against hand-checked cases of the built-in vocabulary. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/kv_cache.h"
#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "engine/kernels/quant.h"
#include "helper_rng.h"
#include "helper_shared.h"

typedef struct tmpmodel {
    char dir[64];
    char path[128];
} tmpmodel;

static void make_model(tmpmodel *t, const char *arch, bool rerank, const char *type) {
    snprintf(t->dir, sizeof t->dir, "/tmp/kvs-encoder-XXXXXX");
    cr_assert_not_null(mkdtemp(t->dir));
    snprintf(t->path, sizeof t->path, "%s/m.gguf", t->dir);
    const char *args[] = {"mkmodel", "-o", t->path, "--arch", arch, "--embd", "64", "--layers", "2", "--heads", "4",
                          "--ff", "96", "--ctx", "64", "--type", type, "--rope-base", "1000", "--seed", "7",
                          rerank ? "--rerank" : NULL, NULL};
    cr_assert_eq(kvt_run_kvserve(t->dir, args, NULL), 0, "kvserve mkmodel --arch %s failed", arch);
}

static void drop_model(tmpmodel *t) {
    char log[160];
    snprintf(log, sizeof log, "%s/log", t->dir);
    unlink(log);
    unlink(t->path);
    rmdir(t->dir);
}

/* ---- the reference: the tensors in double, the math written plainly ----------------------------------------- */
typedef struct ref {
    eng_gguf *g;
    int64_t E, F, H, L;
    bool nomic;
    bool alibi; /* jina-bert-v2: ALiBi (max bias 8), GEGLU */
    float eps;
} ref;

/* Tensor `name` as doubles [ne1][ne0] (malloc'd), or NULL when absent. */
static double *tens(const ref *r, const char *name, int64_t *ne0, int64_t *ne1) {
    const eng_gguf_tensor *t = eng_gguf_find_tensor(r->g, name);
    if (!t) return NULL;
    int64_t n0 = t->ne[0], n1 = t->ne[1];
    double *d = malloc((size_t)(n0 * n1) * sizeof *d);
    float *row = malloc((size_t)n0 * sizeof *row);
    cr_assert(d && row);
    size_t rb = eng_qtype_row_bytes(t->type, n0);
    for (int64_t j = 0; j < n1; j++) {
        cr_assert_eq(eng_dequantize_row(t->type, (const char *)t->data + (size_t)j * rb, row, n0), 0);
        for (int64_t i = 0; i < n0; i++) d[j * n0 + i] = row[i];
    }
    free(row);
    if (ne0) *ne0 = n0;
    if (ne1) *ne1 = n1;
    return d;
}

static double *ltens(const ref *r, int l, const char *suffix) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", l, suffix);
    return tens(r, name, NULL, NULL);
}

/* y[n] = W x (+ b): W [n][k] */
static void matvec(const double *W, const double *b, const double *x, int64_t k, int64_t n, double *y) {
    for (int64_t j = 0; j < n; j++) {
        double s = b ? b[j] : 0.0;
        for (int64_t t = 0; t < k; t++) s += W[j * k + t] * x[t];
        y[j] = s;
    }
}

static void lnorm(double *x, const double *w, const double *b, int64_t n, double eps) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < n; i++) m += x[i];
    m /= (double)n;
    for (int64_t i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
    v /= (double)n;
    for (int64_t i = 0; i < n; i++) x[i] = (x[i] - m) / sqrt(v + eps) * w[i] + b[i];
}

/* ggml's GELU: of the fp16 input, rounded to fp16, for |x| < 10 */
static double gelu_ref(double x) {
    double xr = eng_fp16_to_f32(eng_f32_to_fp16((float)x));
    double g = 0.5 * xr * (1.0 + tanh(sqrt(2.0 / M_PI) * (xr + 0.044715 * xr * xr * xr)));
    return x <= -10.0 ? 0.0 : x >= 10.0 ? x : eng_fp16_to_f32(eng_f32_to_fp16((float)g));
}

/* ALiBi's slope of head h for max bias 8 (ALiBi's geometric sequence, split at the largest power of two <= H). */
static double alibi_slope_ref(int64_t H, int64_t h) {
    int64_t n2 = 1;
    while (n2 * 2 <= H) n2 *= 2;
    return h < n2 ? pow(2.0, -8.0 / (double)n2 * (double)(h + 1))
                  : pow(2.0, -4.0 / (double)n2 * (double)(2 * (h - n2) + 1));
}

static void rope_neox(double *x, int64_t hd, int32_t pos, double base) {
    for (int64_t i = 0; i < hd / 2; i++) {
        double th = pos * pow(base, -2.0 * (double)i / (double)hd);
        double a = x[i], b = x[i + hd / 2];
        x[i] = a * cos(th) - b * sin(th);
        x[i + hd / 2] = a * sin(th) + b * cos(th);
    }
}

/* The hidden states [n][E] of one sequence; head[n_head] (when not NULL and the model has one) the rank head. */
static void ref_forward(const ref *r, const int32_t *tok, int32_t n, double *out, double *head) {
    const int64_t E = r->E, F = r->F, H = r->H, HD = E / H;
    double *x = calloc((size_t)(n * E), sizeof *x), *q = calloc((size_t)(n * E), sizeof *q);
    double *k = calloc((size_t)(n * E), sizeof *k), *v = calloc((size_t)(n * E), sizeof *v);
    double *a = calloc((size_t)(n * E), sizeof *a), *t = calloc((size_t)(E > F ? E : F) * 2, sizeof *t);
    double *s = calloc((size_t)n, sizeof *s), *u = calloc((size_t)F * 2, sizeof *u), *gt = calloc((size_t)F, sizeof *gt);
    cr_assert(x && q && k && v && a && t && s && u && gt);
    double *te = tens(r, "token_embd.weight", NULL, NULL), *tt = tens(r, "token_types.weight", NULL, NULL);
    double *pe = tens(r, "position_embd.weight", NULL, NULL);
    double *lw = tens(r, "token_embd_norm.weight", NULL, NULL), *lb = tens(r, "token_embd_norm.bias", NULL, NULL);
    for (int32_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < E; j++)
            x[i * E + j] = te[(int64_t)tok[i] * E + j] + (tt ? tt[j] : 0.0) + (pe ? pe[(int64_t)i * E + j] : 0.0);
        lnorm(x + i * E, lw, lb, E, r->eps);
    }
    for (int l = 0; l < r->L; l++) {
        double *wq = NULL, *wk = NULL, *wv = NULL, *bq = NULL, *bk = NULL, *bv = NULL;
        double *qkv = ltens(r, l, "attn_qkv.weight");
        if (qkv) {
            wq = qkv;
            wk = qkv + E * E;
            wv = qkv + 2 * E * E;
        } else {
            wq = ltens(r, l, "attn_q.weight"); wk = ltens(r, l, "attn_k.weight"); wv = ltens(r, l, "attn_v.weight");
            bq = ltens(r, l, "attn_q.bias"); bk = ltens(r, l, "attn_k.bias"); bv = ltens(r, l, "attn_v.bias");
        }
        double *wo = ltens(r, l, "attn_output.weight"), *bo = ltens(r, l, "attn_output.bias");
        double *aw = ltens(r, l, "attn_output_norm.weight"), *ab = ltens(r, l, "attn_output_norm.bias");
        double *wu = ltens(r, l, "ffn_up.weight"), *bu = ltens(r, l, "ffn_up.bias");
        char upn[64];
        int64_t up_rows = 0;
        snprintf(upn, sizeof upn, "blk.%d.ffn_up.weight", l);
        free(tens(r, upn, NULL, &up_rows));
        double *wg = ltens(r, l, "ffn_gate.weight");
        double *wd = ltens(r, l, "ffn_down.weight"), *bd = ltens(r, l, "ffn_down.bias");
        double *ow = ltens(r, l, "layer_output_norm.weight"), *ob = ltens(r, l, "layer_output_norm.bias");
        for (int32_t i = 0; i < n; i++) {
            matvec(wq, bq, x + i * E, E, E, q + i * E);
            matvec(wk, bk, x + i * E, E, E, k + i * E);
            matvec(wv, bv, x + i * E, E, E, v + i * E);
            for (int64_t h = 0; r->nomic && h < H; h++) {
                rope_neox(q + i * E + h * HD, HD, i, 1000.0);
                rope_neox(k + i * E + h * HD, HD, i, 1000.0);
            }
        }
        for (int64_t h = 0; h < H; h++)
            for (int32_t i = 0; i < n; i++) {
                double mx = -INFINITY, sum = 0;
                for (int32_t j = 0; j < n; j++) {
                    double d = 0;
                    for (int64_t e = 0; e < HD; e++) d += q[i * E + h * HD + e] * k[j * E + h * HD + e];
                    s[j] = d / sqrt((double)HD) - (r->alibi ? alibi_slope_ref(H, h) * abs(i - j) : 0.0);
                    if (s[j] > mx) mx = s[j];
                }
                for (int32_t j = 0; j < n; j++) sum += (s[j] = exp(s[j] - mx));
                for (int64_t e = 0; e < HD; e++) {
                    double o = 0;
                    for (int32_t j = 0; j < n; j++) o += s[j] / sum * v[j * E + h * HD + e];
                    a[i * E + h * HD + e] = o;
                }
            }
        for (int32_t i = 0; i < n; i++) {
            double *xi = x + i * E;
            matvec(wo, bo, a + i * E, E, E, t);
            for (int64_t j = 0; j < E; j++) t[j] += xi[j];
            lnorm(t, aw, ab, E, r->eps); /* h */
            matvec(wu, bu, t, E, up_rows, u);
            if (up_rows == 2 * F) { /* jina-bert-v2's GEGLU: the gate half first */
                for (int64_t j = 0; j < F; j++) u[j] = gelu_ref(u[j]) * u[F + j];
            } else if (wg) {
                matvec(wg, NULL, t, E, F, gt);
                for (int64_t j = 0; j < F; j++) u[j] = gt[j] / (1.0 + exp(-gt[j])) * u[j];
            } else {
                for (int64_t j = 0; j < F; j++) u[j] = gelu_ref(u[j]);
            }
            matvec(wd, bd, u, F, E, xi);
            for (int64_t j = 0; j < E; j++) xi[j] += t[j];
            lnorm(xi, ow, ob, E, r->eps);
        }
        free(qkv ? qkv : wq);
        if (!qkv) { free(wk); free(wv); }
        double *fr[] = {bq, bk, bv, wo, bo, aw, ab, wu, bu, wg, wd, bd, ow, ob};
        for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) free(fr[i]);
    }
    memcpy(out, x, (size_t)(n * E) * sizeof *out);
    double *cw = tens(r, "cls.weight", NULL, NULL), *cb = tens(r, "cls.bias", NULL, NULL);
    double *cow = tens(r, "cls.output.weight", NULL, NULL), *cob = tens(r, "cls.output.bias", NULL, NULL);
    if (head && cw && cow) {
        matvec(cw, cb, x, E, E, t);
        for (int64_t j = 0; j < E; j++) t[j] = tanh(t[j]);
        matvec(cow, cob, t, E, 1, head);
    } else if (head && cw) { /* jina-reranker-v1: cls [E, 1] alone, tanh */
        matvec(cw, cb, x, E, 1, head);
        head[0] = tanh(head[0]);
    }
    double *fr[] = {x, q, k, v, a, t, s, u, gt, te, tt, pe, lw, lb, cw, cb, cow, cob};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) free(fr[i]);
}

typedef struct run {
    eng_model *m;
    eng_ctx *ctx;
    ref r;
} run;

static void open_run(run *R, const tmpmodel *t, const char *arch) {
    char err[256];
    cr_assert_eq(eng_model_load(t->path, NULL, &R->m, err, sizeof err), 0, "%s", err);
    eng_ctx_params p;
    eng_ctx_params_default(&p);
    p.n_threads = 2;
    p.max_seqs = 8;
    p.max_batch_tokens = 256;
    p.n_ctx = 64;
    p.device = ENG_DEVICE_CPU;
    cr_assert_eq(eng_ctx_create(R->m, &p, &R->ctx, err, sizeof err), 0, "%s", err);
    cr_assert_eq(eng_gguf_open(t->path, &R->r.g, err, sizeof err), 0, "%s", err);
    const eng_hparams *hp = eng_model_hparams(R->m);
    R->r.E = hp->n_embd;
    R->r.F = hp->n_ff;
    R->r.H = hp->n_head;
    R->r.L = hp->n_layer;
    R->r.nomic = !strcmp(arch, "nomic-bert");
    R->r.alibi = !strcmp(arch, "jina-bert-v2");
    R->r.eps = 1e-12f;
}

static void close_run(run *R) {
    eng_gguf_close(R->r.g);
    eng_ctx_free(R->ctx);
    eng_model_free(R->m);
}

/* Runs sequences (tokens concatenated, lengths lens[]) in one batch; outputs [rows][E] into out, the head values of
 * each sequence's first row into rank (when not NULL). */
static int run_batch(run *R, const int32_t *tok, const int32_t *lens, int ns, float *out, float *rank) {
    int32_t n = 0, seqs[16];
    for (int s = 0; s < ns; s++) n += lens[s];
    int32_t *pos = malloc((size_t)n * sizeof *pos), *seq = malloc((size_t)n * sizeof *seq);
    bool *we = malloc((size_t)n), *wl = calloc((size_t)n, 1);
    cr_assert(pos && seq && we && wl);
    kvc_cache *kv = eng_ctx_cache(R->ctx);
    for (int s = 0, r = 0; s < ns; s++) {
        cr_assert_eq(kvc_seq_alloc(kv, &seqs[s]), 0);
        for (int32_t i = 0; i < lens[s]; i++, r++) {
            pos[r] = i;
            seq[r] = seqs[s];
            we[r] = true;
        }
    }
    eng_batch b = {.n = n, .token = tok, .pos = pos, .seq = seq, .want_logits = wl, .want_embd = we};
    int rc = eng_decode(R->ctx, &b);
    const int64_t E = R->r.E;
    for (int32_t r = 0; rc == 0 && r < n; r++) {
        const float *e = eng_get_embeddings(R->ctx, r);
        cr_assert_not_null(e);
        memcpy(out + r * E, e, (size_t)E * sizeof *e);
    }
    for (int s = 0, r = 0; rc == 0 && rank && s < ns; r += lens[s], s++) {
        const float *h = eng_get_rank(R->ctx, r);
        cr_assert_not_null(h);
        rank[s] = h[0];
        if (lens[s] > 1) cr_assert_null(eng_get_rank(R->ctx, r + 1), "only a sequence's first row has a score");
    }
    for (int s = 0; s < ns; s++) kvc_seq_free(kv, seqs[s]);
    free(pos); free(seq); free(we); free(wl);
    return rc;
}

static void check_against_reference(const char *arch, bool rerank) {
    tmpmodel t;
    make_model(&t, arch, rerank, "f32");
    run R;
    open_run(&R, &t, arch);
    cr_assert(eng_model_is_encoder(R.m));
    cr_assert_eq(eng_model_n_cls_out(R.m), rerank ? 1 : 0);
    rng rng = {11};
    const int32_t V = eng_model_hparams(R.m)->n_vocab;
    const int64_t E = R.r.E;
    for (int trial = 0; trial < 3; trial++) {
        int ns = 1 + (int)(rng_next(&rng) % 4);
        int32_t lens[4], tok[4 * 40], n = 0;
        for (int s = 0; s < ns; s++) {
            lens[s] = 1 + (int32_t)(rng_next(&rng) % 40);
            for (int32_t i = 0; i < lens[s]; i++) tok[n++] = (int32_t)(rng_next(&rng) % (uint64_t)V);
        }
        float *out = malloc((size_t)(n * E) * sizeof *out), rank[4];
        double *want = malloc((size_t)(40 * E) * sizeof *want), head[1] = {0};
        cr_assert(out && want);
        cr_assert_eq(run_batch(&R, tok, lens, ns, out, rerank ? rank : NULL), 0);
        for (int s = 0, r0 = 0; s < ns; r0 += lens[s], s++) {
            ref_forward(&R.r, tok + r0, lens[s], want, rerank ? head : NULL);
            for (int64_t i = 0; i < lens[s] * E; i++)
                cr_assert(fabs(out[r0 * E + i] - want[i]) < 2e-4, "%s trial %d seq %d value %lld: %g vs %g", arch, trial,
                          s, (long long)i, out[r0 * E + i], want[i]);
            if (rerank) cr_assert(fabs(rank[s] - head[0]) < 2e-4, "score %g vs %g", rank[s], head[0]);
        }
        free(out);
        free(want);
    }
    close_run(&R);
    drop_model(&t);
}

Test(encoder, bert_matches_reference) { check_against_reference("bert", false); }
Test(encoder, nomic_bert_matches_reference) { check_against_reference("nomic-bert", false); }
Test(encoder, bert_reranker_head_matches_reference) { check_against_reference("bert", true); }
Test(encoder, jina_bert_v2_alibi_geglu_matches_reference) { check_against_reference("jina-bert-v2", false); }
Test(encoder, jina_bert_v2_reranker_head_matches_reference) { check_against_reference("jina-bert-v2", true); }

/* A sequence's hidden states are the same bits alone and in any batch (q8_0 weights: the packed kernels). */
Test(encoder, batch_invariant) {
    const char *arches[] = {"bert", "nomic-bert", "jina-bert-v2"};
    for (int a = 0; a < 3; a++) {
        tmpmodel t;
        make_model(&t, arches[a], true, "q8_0");
        run R;
        open_run(&R, &t, arches[a]);
        rng rng = {5 + (uint64_t)a};
        const int32_t V = eng_model_hparams(R.m)->n_vocab;
        const int64_t E = R.r.E;
        int32_t lens[5], tok[5 * 50], n = 0;
        for (int s = 0; s < 5; s++) {
            lens[s] = 1 + (int32_t)(rng_next(&rng) % 50);
            for (int32_t i = 0; i < lens[s]; i++) tok[n++] = (int32_t)(rng_next(&rng) % (uint64_t)V);
        }
        float *all = malloc((size_t)(n * E) * sizeof *all), *one = malloc((size_t)(50 * E) * sizeof *one);
        float rank_all[5], rank_one[1];
        cr_assert(all && one);
        cr_assert_eq(run_batch(&R, tok, lens, 5, all, rank_all), 0);
        for (int s = 0, r0 = 0; s < 5; r0 += lens[s], s++) {
            cr_assert_eq(run_batch(&R, tok + r0, &lens[s], 1, one, rank_one), 0);
            cr_assert(!memcmp(one, all + r0 * E, (size_t)(lens[s] * E) * sizeof *one), "%s seq %d differs", arches[a], s);
            cr_assert(!memcmp(&rank_one[0], &rank_all[s], sizeof(float)));
        }
        free(all);
        free(one);
        close_run(&R);
        drop_model(&t);
    }
}

/* Batches that break the contract fail with ENG_ERR_INVALID and change nothing. */
Test(encoder, batch_contract) {
    tmpmodel t;
    make_model(&t, "bert", false, "f32");
    run R;
    open_run(&R, &t, "bert");
    kvc_cache *kv = eng_ctx_cache(R.ctx);
    int32_t s0;
    cr_assert_eq(kvc_seq_alloc(kv, &s0), 0);
    int32_t tok[3] = {5, 6, 7}, pos[3] = {1, 2, 3}, seq[3] = {s0, s0, s0};
    bool wl[3] = {false, false, false}, we[3] = {true, true, true};
    eng_batch b = {.n = 3, .token = tok, .pos = pos, .seq = seq, .want_logits = wl, .want_embd = we};
    cr_assert_eq(eng_decode(R.ctx, &b), ENG_ERR_INVALID, "a sequence not starting at position 0");
    pos[0] = 0; pos[1] = 1; pos[2] = 2;
    wl[2] = true;
    cr_assert_eq(eng_decode(R.ctx, &b), ENG_ERR_INVALID, "logits from an encoder");
    wl[2] = false;
    tok[1] = 1 << 30;
    cr_assert_eq(eng_decode(R.ctx, &b), ENG_ERR_INVALID, "a token outside the vocabulary");
    tok[1] = 6;
    int32_t many_tok[65] = {0}, many_pos[65], many_seq[65];
    bool many_wl[65] = {false}, many_we[65];
    for (int i = 0; i < 65; i++) {
        many_pos[i] = i;
        many_seq[i] = s0;
        many_we[i] = true;
    }
    eng_batch many = {.n = 65, .token = many_tok, .pos = many_pos, .seq = many_seq, .want_logits = many_wl,
                      .want_embd = many_we};
    cr_assert_eq(eng_decode(R.ctx, &many), ENG_ERR_INVALID, "a sequence longer than the context (64)");
    cr_assert_eq(kvc_seq_len(kv, s0), 0);
    cr_assert_eq(eng_decode(R.ctx, &b), 0);
    cr_assert_not_null(eng_get_embeddings(R.ctx, 2));
    cr_assert_null(eng_get_rank(R.ctx, 0), "no head: no score");
    kvc_seq_free(kv, s0);
    close_run(&R);
    drop_model(&t);
}

/* The pieces of text's tokens (with the special tokens), joined by '|', into got (512 bytes). */
static void pieces_of(const eng_model *m, const char *text, char got[512]) {
    int32_t ids[64], n = 0;
    cr_assert_eq(eng_tokenize(m, text, strlen(text), true, false, ids, 64, &n), 0);
    got[0] = 0;
    for (int32_t k = 0; k < n; k++) {
        char piece[64];
        size_t pl = 0;
        cr_assert_eq(eng_token_to_piece(m, ids[k], true, piece, sizeof piece - 1, &pl), 0);
        piece[pl] = 0;
        cr_assert_lt(strlen(got) + pl + 2, 512);
        if (k) strcat(got, "|");
        strcat(got, piece);
    }
}

/* The built-in WordPiece vocabulary: [CLS] pieces [SEP], lowercased, punctuation split, longest match first,
 * unknown words as [UNK]. */
Test(encoder, wordpiece_tokenizer) {
    tmpmodel t;
    make_model(&t, "bert", false, "f32");
    eng_model *m;
    char err[256];
    eng_load_params lp;
    eng_load_params_default(&lp);
    lp.vocab_only = true;
    cr_assert_eq(eng_model_load(t.path, &lp, &m, err, sizeof err), 0, "%s", err);
    struct { const char *text; const char *pieces; } cases[] = {
        {"Hello, World!", "[CLS]| hello| ,| world| !|[SEP]"},
        {"  the\tdogs\n", "[CLS]| the| dog|s|[SEP]"},
        {"caf\xc3\xa9 na\xc3\xafve", "[CLS]| c|a|f|e| n|a|i|v|e|[SEP]"},
        {"don't", "[CLS]| do|n| '| t|[SEP]"},
        {"x\xe2\x82\xacy", "[CLS]|[UNK]|[SEP]"},
        {"", "[CLS]|[SEP]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char got[512];
        pieces_of(m, cases[i].text, got);
        cr_assert_str_eq(got, cases[i].pieces, "text %zu: %s", i, got);
    }
    eng_model_free(m);
    drop_model(&t);
}

/* mkmodel's unigram vocabulary (--vocab ugm): <s> ... </s>, the charsmap's replacements (the fi ligature, the
 * ellipsis, the ideographic space), spaces merged, the best-scoring segmentation, runs of unknowns as one <unk>. */
Test(encoder, unigram_tokenizer) {
    char dir[64] = "/tmp/kvs-ugm-XXXXXX", path[128], log[128];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/u.gguf", dir);
    const char *args[] = {"mkmodel", "-o", path, "--arch", "bert", "--vocab", "ugm", "--embd", "64", "--layers", "1",
                          "--heads", "4", "--ff", "64", "--ctx", "64", "--type", "f32", NULL};
    cr_assert_eq(kvt_run_kvserve(dir, args, NULL), 0);
    eng_load_params lp;
    eng_load_params_default(&lp);
    lp.vocab_only = true;
    eng_model *m;
    char err[256];
    cr_assert_eq(eng_model_load(path, &lp, &m, err, sizeof err), 0, "%s", err);
    struct { const char *text; const char *pieces; } cases[] = {
        {"dogs \xef\xac\x81\xe2\x80\xa6 water", "<s>| dog|s| fi|.|.|.| water|</s>"},
        {"a\xef\xac\x81" "b", "<s>| af|i|b|</s>"},
        {"a\xe3\x80\x80" "b", "<s>| a| b|</s>"},
        {"  many   spaces ", "<s>| many| sp|ace|s|</s>"},
        {"x\xe2\x82\xac\xe2\x82\xacy", "<s>| x|<unk>|y|</s>"},
        {"", "<s>|</s>"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char got[512];
        pieces_of(m, cases[i].text, got);
        cr_assert_str_eq(got, cases[i].pieces, "text %zu: %s", i, got);
    }
    eng_model_free(m);
    snprintf(log, sizeof log, "%s/log", dir);
    unlink(log);
    unlink(path);
    rmdir(dir);
}

/* The SIMD levels (AVX-512, AVX2: the tile attention kernels, the vector GELU, the packed gemm) agree with the
 * scalar level within float summation order (KVSERVE_SIMD_MAX caps the level a context detects). */
Test(encoder, simd_levels_agree_with_scalar) {
    tmpmodel t;
    make_model(&t, "bert", true, "q8_0");
    static const char *const caps[] = {"scalar", "avx2", NULL};
    rng rng = {21};
    int32_t lens[3] = {37, 5, 60}, tok[102];
    float *out[3], rank[3][3];
    for (int i = 0; i < 102; i++) tok[i] = 5 + (int32_t)(rng_next(&rng) % 400);
    for (int c = 0; c < 3; c++) {
        if (caps[c]) setenv("KVSERVE_SIMD_MAX", caps[c], 1);
        else unsetenv("KVSERVE_SIMD_MAX");
        run R;
        open_run(&R, &t, "bert");
        out[c] = malloc((size_t)102 * 64 * sizeof(float));
        cr_assert_not_null(out[c]);
        cr_assert_eq(run_batch(&R, tok, lens, 3, out[c], rank[c]), 0);
        close_run(&R);
    }
    unsetenv("KVSERVE_SIMD_MAX");
    for (int c = 1; c < 3; c++) {
        for (int i = 0; i < 102 * 64; i++)
            cr_assert(fabsf(out[c][i] - out[0][i]) < 1e-3f, "level %s value %d: %g, scalar %g", caps[c] ? caps[c] : "best",
                      i, out[c][i], out[0][i]);
        for (int s = 0; s < 3; s++) cr_assert(fabsf(rank[c][s] - rank[0][s]) < 1e-3f);
    }
    for (int c = 0; c < 3; c++) free(out[c]);
    drop_model(&t);
}
