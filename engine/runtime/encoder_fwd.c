/*
 * encoder_fwd.c: the forward pass of bert and nomic-bert (see encoder_fwd.h for the batch contract). The math, as
 * llama.cpp's bert graph computes it:
 *   x = LayerNorm(token_embd[t] + token_types[0] + position_embd[pos])          (nomic-bert: no position row)
 *   per layer: q, k, v = x Wq + bq, ...; nomic-bert rotates q and k (neox halves);
 *              a = softmax(q k^T / sqrt(head_dim)) v over every row of the sequence (bidirectional);
 *              h = LayerNorm(a Wo + bo + x)
 *              f = GELU(h Wup + bup) Wdown + bdown  (nomic-bert: (silu(h Wgate) * h Wup) Wdown); GELU through the
 *              fp16 table ggml's CPU backend uses (encoder.h)
 *              x = LayerNorm(f + h)
 *   jina-bert-v2: no position row; ALiBi, -slope_h |i - j| added to the scaled scores; the FFN is
 *              GELU(h Wgate + bgate) * (h Wup + bup) (GEGLU) when the model is gated
 *   rank head: tanh(x0 Wcls + bcls) Wout + bout for the sequence's first row (either layer optional).
 * The matrices run through the engine's gemm kernels (packed when the model is), split over the context's thread
 * pool by output rows; attention by (sequence, head) pairs; element-wise work by rows. Nothing depends on how a
 * batch is composed, so a row's numbers are the same whatever ran with it.
 */
#include "engine/runtime/encoder_fwd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/ops.h"
#include "engine/kernels/quant.h"
#include "engine/kernels/quant_kpacked.h"
#include "engine/model/encoder.h"
#include "engine/model/rank_head.h"
#include "engine/runtime/batch.h"
#include "engine/runtime/forward_ctx.h"
#include "engine/runtime/kv_pool.h"

/* Per-batch state shared by the workers. */
typedef struct enc_run {
    eng_ctx *c;
    const eng_batch *b;
    int32_t m;
    int32_t n_units;     /* (sequence, head) attention units */
    int32_t *seq_start;  /* [m] first row of each sequence run, in order (n_seqs entries used) */
    int32_t *seq_len;    /* [m] its rows */
    int32_t n_seqs;
    int rc;              /* set by thread 0 when the embedding rows cannot be read */
} enc_run;

static inline void split(int64_t n, int ith, int nth, int64_t *b, int64_t *e) {
    *b = n * ith / nth;
    *e = n * (ith + 1) / nth;
}

/* GELU (tanh approximation) as ggml's CPU backend evaluates it: from the model's table over the fp16 input for
 * |x| < 10 (engine/model/encoder.h), 0 below and x above. */
static float gelu(const float *tab, float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return tab[eng_f32_to_fp16(x)];
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* ALiBi slope of head h (ggml's soft_max with max_bias > 0). */
static float alibi_slope(float max_bias, int32_t n_head, int32_t h) {
    uint32_t n2 = 1u << (uint32_t)floor(log2((double)n_head));
    float m0 = powf(2.0f, -max_bias / (float)n2), m1 = powf(2.0f, -(max_bias / 2.0f) / (float)n2);
    return (uint32_t)h < n2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - (int32_t)n2) + 1));
}

/* y = (x - mean) / sqrt(var + eps) * w + b over n values (y may equal x); sums in double, in four interleaved
 * partial sums (a fixed order: a row's result depends on the row only). */
static void layer_norm(float *y, const float *x, const float *w, const float *b, int64_t n, float eps) {
    double s4[4] = {0, 0, 0, 0}, q4[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) s4[k] += x[i + k];
    for (; i < n; i++) s4[0] += x[i];
    double mean = (s4[0] + s4[1] + s4[2] + s4[3]) / (double)n;
    for (i = 0; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) {
            double d = x[i + k] - mean;
            q4[k] += d * d;
        }
    for (; i < n; i++) q4[0] += (x[i] - mean) * (x[i] - mean);
    double ss = q4[0] + q4[1] + q4[2] + q4[3];
    float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps)), mf = (float)mean;
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mf) * inv * w[i] + b[i];
}

/* Rows [rb, re) of src (stride ld) quantized for w's dot type into the context's activation buffer. */
static void quantize(const eng_ctx *c, const eng_matrix *w, const float *src, int64_t ld, int64_t rb, int64_t re) {
    size_t rbytes = eng_qtype_row_bytes(w->dot_type, w->k);
    for (int64_t r = rb; r < re; r++)
        eng_quantize_row(w->dot_type, src + r * ld, (char *)c->xq[0] + (size_t)r * rbytes, w->k);
}

/* This thread's share (whole groups of 16 output rows) of y = xq W for m rows. */
static void gemm_share(const eng_ctx *c, const eng_matrix *w, int64_t m, float *y, int64_t ldy, int ith, int nth) {
    int64_t groups = (w->n_out + 15) / 16, gb, ge;
    split(groups, ith, nth, &gb, &ge);
    int64_t jb = gb * 16, je = ge * 16 < w->n_out ? ge * 16 : w->n_out;
    if (jb >= je) return;
    if (w->packed && c->simd >= ENG_SIMD_AVX2)
        eng_gemm_wpacked(c->simd, w->type, w->packed, w->n_out, w->k, c->xq[0], m, y, ldy, jb, je);
    else
        eng_gemm(c->simd, w->type, w->data, w->k, c->xq[0], m, y, ldy, jb, je);
}

/* The input rows: token + type + position embeddings, LayerNorm. */
static void embed_rows(enc_run *R, int ith, int nth) {
    eng_ctx *c = R->c;
    const eng_model *md = c->model;
    const eng_encoder *enc = md->enc;
    const int64_t E = c->hp->n_embd;
    int64_t rb, re;
    split(R->m, ith, nth, &rb, &re);
    void *scratch = (char *)c->th_embd + (size_t)ith * c->embd_row_cap;
    float *pos_row = c->th_xn + (size_t)ith * SMALL_M * (size_t)E;
    for (int64_t r = rb; r < re; r++) {
        float *x = c->x + r * E;
        if (eng_model_embd_row(md, R->b->token[r], x, scratch) != 0) {
            R->rc = ENG_ERR_INVALID;
            continue;
        }
        if (enc->type_row)
            for (int64_t j = 0; j < E; j++) x[j] += enc->type_row[j];
        if (enc->pos_embd.data) {
            const void *pr = (const char *)enc->pos_embd.data + (size_t)R->b->pos[r] * enc->pos_embd.row_bytes;
            eng_dequantize_row(enc->pos_embd.type, pr, pos_row, E);
            for (int64_t j = 0; j < E; j++) x[j] += pos_row[j];
        }
        layer_norm(x, x, enc->embd_ln_w, enc->embd_ln_b, E, enc->ln_eps);
    }
}

/* q, k, v biases and (nomic-bert) the rotation of q and k, for this thread's rows. */
static void qkv_post(enc_run *R, const eng_enc_layer *el, int ith, int nth) {
    eng_ctx *c = R->c;
    const eng_hparams *hp = c->hp;
    const int64_t E = hp->n_embd, HD = hp->head_dim;
    int64_t rb, re;
    split(R->m, ith, nth, &rb, &re);
    float *cs = c->th_o + (size_t)ith * (size_t)c->att_q * (size_t)HD; /* this thread's angles of one row */
    for (int64_t r = rb; r < re; r++) {
        float *q = c->q + r * E, *k = c->k + r * E, *v = c->v + r * E;
        for (int64_t j = 0; j < E; j++) {
            if (el->bq) q[j] += el->bq[j];
            if (el->bk) k[j] += el->bk[j];
            if (el->bv) v[j] += el->bv[j];
        }
        if (!c->model->enc->rope) continue;
        for (int32_t i = 0; i < hp->n_rot / 2; i++) {
            double th = (double)R->b->pos[r] * (double)c->inv_freq[i];
            cs[2 * i] = (float)cos(th);
            cs[2 * i + 1] = (float)sin(th);
        }
        for (int32_t h = 0; h < hp->n_head; h++) {
            eng_rope(q + h * HD, hp->n_rot, cs, true);
            eng_rope(k + h * HD, hp->n_rot, cs, true);
        }
    }
}

/* Bidirectional attention of this thread's (sequence, head) units into c->att, with the engine's tile kernels:
 * the head's K and V rows are gathered into this thread's scratch, then the queries go through in tiles of up to
 * att_q rows (a query's numbers do not depend on its tile: see ops.h). */
static void attend(enc_run *R, int ith, int nth) {
    eng_ctx *c = R->c;
    const eng_hparams *hp = c->hp;
    const int64_t E = hp->n_embd, HD = hp->head_dim, lds = c->n_ctx;
    const float scale = 1.0f / sqrtf((float)HD);
    float *s = c->th_scores + (size_t)ith * (size_t)c->att_q * (size_t)c->n_ctx;
    float *kh = c->enc_kv + (size_t)ith * 2 * (size_t)c->n_ctx * (size_t)HD, *vh = kh + (size_t)c->n_ctx * HD;
    float *tq = c->th_q + (size_t)ith * (size_t)c->att_q * (size_t)HD;
    float *to = c->th_o + (size_t)ith * (size_t)c->att_q * (size_t)HD;
    float *work = c->th_work + (size_t)ith * ENG_ATTN_WORK(HD);
    int64_t ub, ue;
    split(R->n_units, ith, nth, &ub, &ue);
    for (int64_t u = ub; u < ue; u++) {
        int32_t si = (int32_t)(u / hp->n_head), h = (int32_t)(u % hp->n_head);
        int32_t r0 = R->seq_start[si], n = R->seq_len[si];
        const eng_encoder *enc = c->model->enc;
        const float slope = enc->alibi ? alibi_slope(enc->alibi_max_bias, hp->n_head, h) : 0.0f;
        for (int32_t j = 0; j < n; j++) {
            memcpy(kh + (size_t)j * HD, c->k + (int64_t)(r0 + j) * E + h * HD, (size_t)HD * sizeof(float));
            memcpy(vh + (size_t)j * HD, c->v + (int64_t)(r0 + j) * E + h * HD, (size_t)HD * sizeof(float));
        }
        for (int32_t i0 = 0; i0 < n; i0 += c->att_q) {
            int32_t m = n - i0 < c->att_q ? n - i0 : c->att_q;
            for (int32_t i = 0; i < m; i++)
                memcpy(tq + (size_t)i * HD, c->q + (int64_t)(r0 + i0 + i) * E + h * HD, (size_t)HD * sizeof(float));
            eng_attn_tile_scores_f32(c->attn_level, tq, m, kh, n, (int32_t)HD, scale, s, (int32_t)lds, work);
            for (int32_t i = 0; i < m && slope != 0.0f; i++) { /* ALiBi: -slope |i - j| */
                float *si_ = s + (size_t)i * (size_t)lds;
                for (int32_t j = 0; j < n; j++) si_[j] += slope * (float)(-abs(i0 + i - j));
            }
            for (int32_t i = 0; i < m; i++) {
                float *si_ = s + (size_t)i * (size_t)lds, mx = -INFINITY;
                for (int32_t j = 0; j < n; j++) mx = si_[j] > mx ? si_[j] : mx;
                double sum = eng_attn_expsum(c->attn_level, si_, n, mx);
                tq[i] = (float)(1.0 / sum); /* the tile's queries are consumed: their first slots hold 1 / sum */
            }
            memset(to, 0, (size_t)m * (size_t)HD * sizeof(float));
            eng_attn_tile_accum_f32(c->attn_level, to, m, s, (int32_t)lds, vh, n, (int32_t)HD, work);
            for (int32_t i = 0; i < m; i++) {
                float *o = c->att + (int64_t)(r0 + i0 + i) * E + h * HD, inv = tq[i];
                for (int64_t t = 0; t < HD; t++) o[t] = to[(size_t)i * HD + t] * inv;
            }
        }
    }
}

/* dst[r] = LayerNorm(a[r] + bias + res[r]) for this thread's rows. */
static void add_norm(enc_run *R, float *dst, const float *a, const float *bias, const float *res, const float *w,
                     const float *b, int ith, int nth) {
    const int64_t E = R->c->hp->n_embd;
    int64_t rb, re;
    split(R->m, ith, nth, &rb, &re);
    for (int64_t r = rb; r < re; r++) {
        float *y = dst + r * E;
        for (int64_t j = 0; j < E; j++) y[j] = a[r * E + j] + (bias ? bias[j] : 0.0f) + res[r * E + j];
        layer_norm(y, y, w, b, E, R->c->model->enc->ln_eps);
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
/* gelu() over u[0..n) + b (b may be NULL), 8 at a time: the same conversion (round to nearest even) and lookups. */
__attribute__((target("avx2,fma,f16c"))) static void gelu_avx2(const float *tab, float *u, const float *b, int64_t n) {
    const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f), zero = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_loadu_ps(u + j);
        if (b) x = _mm256_add_ps(x, _mm256_loadu_ps(b + j));
        __m256i idx = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m256 g = _mm256_i32gather_ps(tab, idx, 4);
        g = _mm256_blendv_ps(g, zero, _mm256_cmp_ps(x, lo, _CMP_LE_OQ));
        g = _mm256_blendv_ps(g, x, _mm256_cmp_ps(x, hi, _CMP_GE_OQ));
        _mm256_storeu_ps(u + j, g);
    }
    for (; j < n; j++) u[j] = gelu(tab, u[j] + (b ? b[j] : 0.0f));
}
#endif

/* The FFN's activation for this thread's rows (into c->up), then its quantization for w_down. */
static void ffn_act(enc_run *R, const eng_layer *ly, const eng_enc_layer *el, int ith, int nth) {
    eng_ctx *c = R->c;
    const int64_t F = c->hp->n_ff;
    int64_t rb, re;
    split(R->m, ith, nth, &rb, &re);
    for (int64_t r = rb; r < re; r++) {
        float *u = c->up + r * F;
        if (c->model->enc->swiglu) {
            const float *g = c->gate + r * F;
            for (int64_t j = 0; j < F; j++) u[j] = silu(g[j]) * (u[j] + (el->b_up ? el->b_up[j] : 0.0f));
        } else if (c->model->enc->geglu) { /* ggml's geglu: gelu() of the gate (its table), times the up value */
            const float *g = c->gate + r * F, *tab = c->model->enc->gelu_tab;
            for (int64_t j = 0; j < F; j++) {
                float gj = g[j] + (el->b_gate ? el->b_gate[j] : 0.0f), uj = u[j] + (el->b_up ? el->b_up[j] : 0.0f);
                u[j] = gelu(tab, gj) * uj;
            }
        } else {
            const float *tab = c->model->enc->gelu_tab;
#if defined(__x86_64__) || defined(__i386__)
            if (c->simd >= ENG_SIMD_AVX2) { /* AVX2 implies F16C and FMA here (quant.h's levels) */
                gelu_avx2(tab, u, el->b_up, F);
                continue;
            }
#endif
            for (int64_t j = 0; j < F; j++) u[j] = gelu(tab, u[j] + (el->b_up ? el->b_up[j] : 0.0f));
        }
    }
    quantize(c, &ly->w_down, c->up, F, rb, re);
}

static void layer(enc_run *R, int32_t l, int ith, int nth) {
    eng_ctx *c = R->c;
    eng_pool *P = c->pool;
    const eng_layer *ly = &c->model->layers[l];
    const eng_enc_layer *el = &c->model->enc->layers[l];
    const int64_t E = c->hp->n_embd, F = c->hp->n_ff, m = R->m;
    int64_t rb, re;
    split(m, ith, nth, &rb, &re);
    quantize(c, &ly->wq, c->x, E, rb, re);
    eng_pool_barrier(P);
    gemm_share(c, &ly->wq, m, c->q, E, ith, nth);
    gemm_share(c, &ly->wk, m, c->k, E, ith, nth);
    gemm_share(c, &ly->wv, m, c->v, E, ith, nth);
    eng_pool_barrier(P);
    qkv_post(R, el, ith, nth);
    eng_pool_barrier(P);
    attend(R, ith, nth);
    eng_pool_barrier(P);
    quantize(c, &ly->wo, c->att, E, rb, re);
    eng_pool_barrier(P);
    gemm_share(c, &ly->wo, m, c->tmp, E, ith, nth);
    eng_pool_barrier(P);
    add_norm(R, c->x2, c->tmp, el->bo, c->x, el->attn_ln_w, el->attn_ln_b, ith, nth);
    quantize(c, &ly->w_up, c->x2, E, rb, re);
    eng_pool_barrier(P);
    gemm_share(c, &ly->w_up, m, c->up, F, ith, nth);
    if (c->model->enc->swiglu || c->model->enc->geglu) gemm_share(c, &ly->w_gate, m, c->gate, F, ith, nth);
    eng_pool_barrier(P);
    ffn_act(R, ly, el, ith, nth);
    eng_pool_barrier(P);
    gemm_share(c, &ly->w_down, m, c->tmp, E, ith, nth);
    eng_pool_barrier(P);
    add_norm(R, c->x, c->tmp, el->b_down, c->x2, el->out_ln_w, el->out_ln_b, ith, nth);
    eng_pool_barrier(P);
}

static void worker(void *arg, int ith, int nth) {
    enc_run *R = arg;
    embed_rows(R, ith, nth);
    eng_pool_barrier(R->c->pool);
    for (int32_t l = 0; l < R->c->hp->n_layer; l++) layer(R, l, ith, nth);
}

/* y[n_out] = x W (+ b), W's rows dequantized one at a time (the head runs once per sequence). */
static int head_matvec(const eng_matrix *w, const float *b, const float *x, float *y, float *row) {
    for (int64_t j = 0; j < w->n_out; j++) {
        int rc = eng_dequantize_row(w->type, (const char *)w->data + (size_t)j * w->row_bytes, row, w->k);
        if (rc != 0) return rc;
        double d = 0;
        for (int64_t t = 0; t < w->k; t++) d += (double)row[t] * (double)x[t];
        y[j] = (float)d + (b ? b[j] : 0.0f);
    }
    return 0;
}

/* The classification head over row r's hidden state into out[n_cls_out]. */
static int rank_head(eng_ctx *c, int32_t r, float *out) {
    const eng_encoder *enc = c->model->enc;
    const int64_t E = c->hp->n_embd;
    float *row = c->th_xn, *h = c->th_xn + E; /* thread 0's scratch (at least 2 x n_embd floats) */
    const float *x = c->x + (int64_t)r * E;
    int rc = 0;
    if (enc->cls.data) {
        if ((rc = head_matvec(&enc->cls, enc->cls_b, x, h, row)) != 0) return rc;
        for (int64_t j = 0; j < enc->cls.n_out; j++) h[j] = tanhf(h[j]);
        x = h;
    }
    if (enc->cls_out.data) return head_matvec(&enc->cls_out, enc->cls_out_b, x, out, row);
    memcpy(out, x, (size_t)enc->n_cls_out * sizeof *out);
    return 0;
}

/* Checks the batch contract and lists its sequences' runs. */
static int plan(enc_run *R) {
    const eng_batch *b = R->b;
    const eng_hparams *hp = R->c->hp;
    R->n_seqs = 0;
    for (int32_t i = 0; i < b->n; i++) {
        /* positions past the context would overrun the per-thread score and K/V rows (n_ctx each) */
        if (b->pos[i] < 0 || b->pos[i] >= hp->n_ctx_train || b->pos[i] >= R->c->n_ctx || b->token[i] < 0 ||
            b->token[i] >= hp->n_vocab)
            return ENG_ERR_INVALID;
        bool cont = i > 0 && b->seq[i] == b->seq[i - 1];
        if (cont ? b->pos[i] != b->pos[i - 1] + 1 : b->pos[i] != 0) return ENG_ERR_INVALID;
        if (!cont) {
            R->seq_start[R->n_seqs] = i;
            R->seq_len[R->n_seqs++] = 0;
        }
        R->seq_len[R->n_seqs - 1]++;
    }
    for (int32_t s = 0; s < R->n_seqs; s++) /* a sequence appears once */
        for (int32_t t = s + 1; t < R->n_seqs; t++)
            if (b->seq[R->seq_start[s]] == b->seq[R->seq_start[t]]) return ENG_ERR_INVALID;
    R->n_units = R->n_seqs * hp->n_head;
    return 0;
}

/* The outputs the rows asked for: hidden states and the head's values. */
static int outputs(eng_ctx *c, const eng_batch *b) {
    const int64_t E = c->hp->n_embd;
    const int32_t nc = c->model->enc->n_cls_out;
    for (int32_t i = 0; i < b->n; i++) {
        c->embd_rows[i] = b->want_embd && b->want_embd[i];
        c->enc_seq[2 * c->max_batch + i] = 0; /* row i has head values */
        if (!c->embd_rows[i]) continue;
        memcpy(c->embd + (size_t)i * (size_t)E, c->x + (size_t)i * (size_t)E, (size_t)E * sizeof(float));
        if (nc > 0 && b->pos[i] == 0) {
            int rc = rank_head(c, i, c->enc_rank + (size_t)i * (size_t)nc);
            if (rc != 0) return rc;
            c->enc_seq[2 * c->max_batch + i] = 1;
        }
    }
    return 0;
}

static int ensure_buffers(eng_ctx *c) {
    if (c->embd && c->enc_rank && c->enc_seq && c->enc_kv) return 0;
    const int32_t nc = c->model->enc->n_cls_out > 0 ? c->model->enc->n_cls_out : 1;
    if (!c->embd) c->embd = malloc((size_t)c->max_batch * (size_t)c->hp->n_embd * sizeof(float));
    if (!c->embd_rows) c->embd_rows = malloc((size_t)c->max_batch * sizeof(bool));
    if (!c->enc_rank) c->enc_rank = malloc((size_t)c->max_batch * (size_t)nc * sizeof(float));
    if (!c->enc_seq) c->enc_seq = malloc((size_t)c->max_batch * 3 * sizeof(int32_t));
    if (!c->enc_kv)
        c->enc_kv = malloc((size_t)c->n_threads * 2 * (size_t)c->n_ctx * (size_t)c->hp->head_dim * sizeof(float));
    return c->embd && c->embd_rows && c->enc_rank && c->enc_seq && c->enc_kv ? 0 : ENG_ERR_NOMEM;
}

int eng_encoder_decode(eng_ctx *c, const eng_batch *b) {
    c->last_n = 0;
    c->n_logits = 0;
    c->embd_valid = false;
    if (b->n < 1 || b->n > c->max_batch || !b->token || !b->pos || !b->seq) return ENG_ERR_INVALID;
    for (int32_t i = 0; i < b->n; i++)
        if (b->want_logits && b->want_logits[i]) return ENG_ERR_INVALID; /* an encoder has no logits */
    int rc = ensure_buffers(c);
    if (rc != 0) return rc;
    enc_run R = {.c = c, .b = b, .m = b->n, .seq_start = c->enc_seq, .seq_len = c->enc_seq + c->max_batch};
    if ((rc = plan(&R)) != 0) return rc;
    /* the cache's bookkeeping as for a decoder (slots reserved and committed), though no K/V is kept */
    for (int32_t i = 0; i < b->n; i++) c->entries[i] = (kvc_entry){.seq = b->seq[i], .pos = b->pos[i], .token = b->token[i]};
    if ((rc = kvc_start_forward(c->cache, c->entries, b->n, c->slots)) != 0) return eng_kv_err(rc);
    eng_pool_run(c->pool, worker, &R);
    if (R.rc == 0) R.rc = outputs(c, b);
    int frc = kvc_finish_forward(c->cache, R.rc == 0);
    if (R.rc != 0) return R.rc;
    if (frc != 0) return eng_kv_err(frc);
    c->last_n = b->n;
    c->embd_valid = true;
    return 0;
}

/* A decoder reranker (rank_head.h): the head over row i's hidden state (the caller's last row of a sequence),
 * computed on demand into row i of enc_rank. */
static float *decoder_rank(eng_ctx *c, int32_t i) {
    const eng_rank_head *h = c->model->rank;
    const float *x = eng_get_embeddings(c, i);
    if (!x) return NULL;
    if (!c->enc_rank && !(c->enc_rank = malloc((size_t)c->max_batch * (size_t)h->n_out * sizeof(float))))
        return NULL;
    float *out = c->enc_rank + (size_t)i * (size_t)h->n_out;
    return eng_rank_head_apply(h, x, out) == 0 ? out : NULL;
}

float *eng_get_rank(eng_ctx *c, int32_t i) {
    if (c && !c->cuda && c->model->rank) return decoder_rank(c, i);
    if (!c || c->cuda || !c->model->enc || c->model->enc->n_cls_out < 1 || !c->embd_valid || i < 0 ||
        i >= c->last_n || !c->embd_rows[i] || !c->enc_seq[2 * c->max_batch + i])
        return NULL;
    return c->enc_rank + (size_t)i * (size_t)c->model->enc->n_cls_out;
}

int32_t eng_model_n_cls_out(const eng_model *m) {
    return !m ? 0 : m->enc ? m->enc->n_cls_out : m->rank ? m->rank->n_out : 0;
}
bool eng_model_is_encoder(const eng_model *m) { return m && m->enc; }
bool eng_model_rank_last(const eng_model *m) { return m && !m->enc && m->rank; }
const char *eng_model_rerank_prompt(const eng_model *m) { return m && m->rank ? m->rank->prompt : NULL; }

void eng_encoder_ctx_free(eng_ctx *c) {
    if (!c) return;
    KVS_FREE_ALL(c->enc_rank, c->enc_seq, c->enc_kv);
    c->enc_rank = NULL;
    c->enc_seq = NULL;
    c->enc_kv = NULL;
}
