/*
 * forward_moe.c: a layer's Mixture-of-Experts feed-forward in the CPU forward pass (forward.c calls eng_fwd_moe in
 * place of the dense gate/up/down, on every thread of the pass). The stages, each ended by a barrier:
 *   1. the router's product: f32 logits for every row and expert (+ the router's bias), in chunks of outputs;
 *   2. routing, by every thread for all rows into its own eng_moe_route (a few hundred operations per row, the same
 *      numbers in every thread's copy, so no thread waits for another here): softmax over the experts, the
 *      n_expert_used highest probabilities in descending order (ties to the lower expert id), their weights divided
 *      by their sum (clamped below at 2^-14, the smallest normal fp16) and multiplied by expert_weights_scale when
 *      that is neither 0 nor 1: the facts of llama.cpp's build_moe_ffn for qwen3moe; or (gpt-oss, hp.moe_gating
 *      ENG_MOE_SOFTMAX_WEIGHT) the n_expert_used highest logits, weighted by a softmax over them alone. Then the
 *      step's slots (one per row and rank) are grouped by expert, the rows of an expert in batch order;
 *      then, with no barrier, per active expert in units of MOE_COLS columns: its gate and up products over all its
 *      slots at once (so each selected expert's weights are read once per step, whatever the number of rows routed
 *      to it, by the packed kernels' tiles of up to 8 rows per weight load; the experts no row chose are not read),
 *      their biases, act(gate) * up (the layer's activation: SiLU, GELU or the clamped SwiGLU), quantized for down.
 *      A thread gathers an expert's input rows (quantized once per row by forward.c) into its own buffer when it
 *      starts on that expert's units;
 *   3. per active expert, in units of MOE_ROWS output rows: down over all its slots, + its bias;
 *   4. per row: its experts' outputs times their weights, summed in rank order, into tmp.
 * The units of 2 and 3 are handed out from shared counters (eng_fwd_next_chunk), in expert order, so each thread
 * streams runs of consecutive weights and none idles while units are left.
 * Batch invariance: a slot's products do not depend on the other rows of the product (the kernels give a row the
 * same floats at any m and in any position: quant.h, quant_kpacked.h), and a row's sum runs in rank order whatever
 * the grouping, so a token's result is the same bit for bit whichever rows share its experts in the step.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine/kernels/ops.h"
#include "engine/kernels/quant.h"
#include "engine/model/model.h"
#include "engine/runtime/forward_ctx.h"

static inline void split_range(int64_t n, int ith, int nth, int64_t *b, int64_t *e) {
    *b = n * ith / nth;
    *e = n * (ith + 1) / nth;
}

/* The buffer of the group {router, gate, up} (forward.c's group_slot numbering: one per distinct dot type, in order
 * of first appearance) holding the rows quantized to dot type t. */
static int input_slot(const eng_moe *x, uint32_t t) {
    if (t == x->router.dot_type) return 0;
    return x->gate[0].dot_type == x->router.dot_type || t == x->gate[0].dot_type ? 1 : 2;
}

/* The k highest of p[0..ne) in descending order (ties to the lower expert id) into sel and w. */
static void top_k(const float *p, int32_t ne, int32_t k, int32_t *sel, float *w) {
    uint8_t taken[ENG_MAX_EXPERTS];
    memset(taken, 0, (size_t)ne);
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < ne; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        taken[best] = 1;
        sel[j] = best;
        w[j] = p[best];
    }
}

/* gpt-oss's gating (ENG_MOE_SOFTMAX_WEIGHT): the k highest logits, their weights the softmax over those k alone
 * (max first, a double sum, one float reciprocal, as the full softmax below). */
static void route_row_topk_softmax(const eng_hparams *hp, const float *p, int32_t *sel, float *w) {
    const int32_t k = hp->n_expert_used;
    top_k(p, hp->n_expert, k, sel, w);
    const float mx = w[0];
    double sum = 0.0;
    for (int32_t j = 0; j < k; j++) {
        w[j] = expf(w[j] - mx);
        sum += w[j];
    }
    const float inv = (float)(1.0 / sum);
    for (int32_t j = 0; j < k; j++) w[j] *= inv;
}

/* A row's routing (logits: its n_expert router outputs, read only): sel and w get the experts and their weights by
 * rank. */
static void route_row(const eng_hparams *hp, const float *bias, const float *logits, int32_t *sel, float *w) {
    const int32_t ne = hp->n_expert, k = hp->n_expert_used;
    float p[ENG_MAX_EXPERTS];
    for (int32_t e = 0; e < ne; e++) p[e] = bias ? logits[e] + bias[e] : logits[e];
    if (hp->moe_gating == ENG_MOE_SOFTMAX_WEIGHT) {
        route_row_topk_softmax(hp, p, sel, w);
        return;
    }
    float mx = p[0];
    for (int32_t e = 1; e < ne; e++) mx = p[e] > mx ? p[e] : mx;
    double sum = 0.0;
    for (int32_t e = 0; e < ne; e++) {
        p[e] = expf(p[e] - mx);
        sum += p[e];
    }
    const float inv = (float)(1.0 / sum);
    for (int32_t e = 0; e < ne; e++) p[e] *= inv;
    top_k(p, ne, k, sel, w);
    float ws = 0.0f;
    for (int32_t j = 0; j < k; j++) ws += w[j];
    if (ws < 6.103515625e-5f) ws = 6.103515625e-5f;
    const float scale = hp->expert_weights_scale;
    for (int32_t j = 0; j < k; j++) {
        w[j] /= ws;
        if (scale != 0.0f && scale != 1.0f) w[j] *= scale;
    }
}

/* Stage 2's routing of all m rows into rt: the slots grouped by expert and the list of active experts. */
static void route_all(const eng_ctx *c, const eng_moe *x, eng_moe_route *rt, int64_t m) {
    const eng_hparams *hp = c->hp;
    const int32_t ne = hp->n_expert, k = hp->n_expert_used;
    int32_t *off = rt->off, *cur = rt->active; /* the active list is built after the slots: cursors first */
    memset(off, 0, (size_t)(ne + 1) * sizeof *off);
    for (int64_t r = 0; r < m; r++) {
        route_row(hp, x->router_b, c->moe_probs + r * ne, rt->sel + r * k, rt->w + r * k);
        for (int32_t j = 0; j < k; j++) off[rt->sel[r * k + j] + 1]++;
    }
    for (int32_t e = 0; e < ne; e++) {
        off[e + 1] += off[e];
        cur[e] = off[e];
    }
    for (int64_t r = 0; r < m; r++)
        for (int32_t j = 0; j < k; j++) {
            int32_t s = cur[rt->sel[r * k + j]]++;
            rt->slot[r * k + j] = s;
            rt->row[s] = (int32_t)r;
        }
    int32_t na = 0;
    for (int32_t e = 0; e < ne; e++)
        if (off[e + 1] > off[e]) rt->active[na++] = e;
    rt->n_active = na;
    rt->x_expert = -1;
}

/* Expert e's input rows for gate (and for up when it reads another dot type) gathered into rt->x, once per run of
 * the expert's units on this thread. */
static void gather_expert(eng_moe_route *rt, int32_t e, const char *in_g, size_t rb_g, const char *in_u, size_t rb_u,
                          bool one_input) {
    if (rt->x_expert == e) return;
    for (int32_t s = rt->off[e], i = 0; s < rt->off[e + 1]; s++, i++) {
        const size_t r = (size_t)rt->row[s];
        memcpy((char *)rt->x[0] + (size_t)i * rb_g, in_g + r * rb_g, rb_g);
        if (!one_input) memcpy((char *)rt->x[1] + (size_t)i * rb_u, in_u + r * rb_u, rb_u);
    }
    rt->x_expert = e;
}

/* Stage 2, one unit: columns [jb, je) of expert e's gate and up over its slots (inputs gathered in rt->x), then
 * act(gate) * up quantized. */
static void gate_up_unit(eng_ctx *c, const eng_moe *x, const eng_moe_route *rt, int32_t e, int64_t jb, int64_t je,
                         bool one_input) {
    const int64_t F = c->hp->n_ff_exp, s0 = rt->off[e], n = rt->off[e + 1] - s0;
    eng_fwd_mat_gemm(c, &x->gate[e], rt->x[0], n, c->moe_g + s0 * F, F, jb, je);
    eng_fwd_mat_gemm(c, &x->up[e], one_input ? rt->x[0] : rt->x[1], n, c->moe_u + s0 * F, F, jb, je);
    const float *gb = x->gate_b ? x->gate_b + (size_t)e * F : NULL, *ub = x->up_b ? x->up_b + (size_t)e * F : NULL;
    const eng_hparams *hp = c->hp;
    for (int64_t s = s0; s < s0 + n; s++) {
        float *g = c->moe_g + s * F, *u = c->moe_u + s * F;
        for (int64_t i = jb; gb && i < je; i++) g[i] += gb[i];
        for (int64_t i = jb; ub && i < je; i++) u[i] += ub[i];
        if (x->act == ENG_ACT_SWIGLU_OAI) /* gpt-oss's clamped SwiGLU */
            eng_swiglu_oai(g + jb, u + jb, je - jb, hp->swiglu_alpha, hp->swiglu_limit);
        else
            for (int64_t i = jb; i < je; i++) g[i] = eng_fwd_act(x->act, g[i]) * u[i];
        eng_fwd_quantize_part(x->down[e].dot_type, F, g + jb, c->moe_xd, s, jb, je - jb);
    }
}

/* Stage 3, one unit: output rows [jb, je) of expert e's down over its slots, + its bias. */
static void down_unit(eng_ctx *c, const eng_moe *x, const eng_moe_route *rt, int32_t e, int64_t jb, int64_t je,
                      size_t rb_d) {
    const int64_t E = c->hp->n_embd, s0 = rt->off[e], n = rt->off[e + 1] - s0;
    eng_fwd_mat_gemm(c, &x->down[e], (const char *)c->moe_xd + (size_t)s0 * rb_d, n, c->moe_out + s0 * E, E, jb, je);
    if (!x->down_b) return;
    const float *db = x->down_b + (size_t)e * E;
    for (int64_t s = s0; s < s0 + n; s++)
        for (int64_t i = jb; i < je; i++) c->moe_out[s * E + i] += db[i];
}

void eng_fwd_moe(eng_ctx *c, int32_t l, void *const *xq_in, int ith, int nth) {
    const eng_hparams *hp = c->hp;
    const eng_moe *x = &c->model->layers[l].moe;
    const int64_t m = c->m, E = hp->n_embd, F = hp->n_ff_exp, k = hp->n_expert_used;
    _Atomic int64_t *dyn = &c->dyn[(size_t)l * N_DYN];
    const bool small = m <= SMALL_M;
    eng_pool *pool = c->pool;
    eng_moe_route *rt = &c->moe_rt[ith];

    eng_fwd_gemm_part(c, &x->router, xq_in[0], m, c->moe_probs, hp->n_expert, &dyn[DYN_ROUTER], nth);
    eng_pool_barrier(pool);
    route_all(c, x, rt, m);

    /* the experts' gate and up, each thread gathering an expert's inputs as it starts on its units */
    const uint32_t tg = x->gate[0].dot_type, tu = x->up[0].dot_type, td = x->down[0].dot_type;
    const size_t rb_g = eng_qtype_row_bytes(tg, E), rb_u = eng_qtype_row_bytes(tu, E);
    const size_t rb_d = eng_qtype_row_bytes(td, F);
    const char *in_g = xq_in[input_slot(x, tg)], *in_u = xq_in[input_slot(x, tu)];
    const bool one_input = tg == tu;
    const int64_t cols = c->moe_cols, upe = (F + cols - 1) / cols, dpe = (E + MOE_ROWS - 1) / MOE_ROWS;
    const int64_t na = rt->n_active;
    int64_t ub, ue;
    while (eng_fwd_next_chunk(&dyn[DYN_XGU], na * upe, nth, 1, small, &ub, &ue))
        for (int64_t u = ub; u < ue; u++) {
            const int32_t e = rt->active[u / upe];
            int64_t jb = u % upe * cols, je = jb + cols < F ? jb + cols : F;
            gather_expert(rt, e, in_g, rb_g, in_u, rb_u, one_input);
            gate_up_unit(c, x, rt, e, jb, je, one_input);
        }
    eng_pool_barrier(pool);
    while (eng_fwd_next_chunk(&dyn[DYN_XDOWN], na * dpe, nth, 1, small, &ub, &ue))
        for (int64_t u = ub; u < ue; u++) {
            int64_t jb = u % dpe * MOE_ROWS, je = jb + MOE_ROWS < E ? jb + MOE_ROWS : E;
            down_unit(c, x, rt, rt->active[u / dpe], jb, je, rb_d);
        }
    eng_pool_barrier(pool);

    /* each row's experts weighted and summed in rank order: out_0 w_0 + out_1 w_1 + ... */
    int64_t rb, re;
    split_range(m, ith, nth, &rb, &re);
    for (int64_t r = rb; r < re; r++) {
        float *t = c->tmp + r * E;
        const float *w = rt->w + r * k;
        const int32_t *slot = rt->slot + r * k;
        const float *o0 = c->moe_out + (size_t)slot[0] * E;
        for (int64_t i = 0; i < E; i++) t[i] = o0[i] * w[0];
        for (int64_t j = 1; j < k; j++) {
            const float *o = c->moe_out + (size_t)slot[j] * E;
            const float wj = w[j];
            for (int64_t i = 0; i < E; i++) t[i] = t[i] + o[i] * wj;
        }
    }
    eng_pool_barrier(pool);
}

int eng_fwd_moe_alloc(eng_ctx *c) {
    const eng_hparams *hp = c->hp;
    if (hp->n_expert < 1) return 0;
    const size_t MB = (size_t)c->max_batch, K = (size_t)hp->n_expert_used, S = MB * K;
    const size_t E = (size_t)hp->n_embd, F = (size_t)hp->n_ff_exp, NE = (size_t)hp->n_expert;
    /* every layer's experts may have their own types: the largest row of each input */
    size_t rb[3] = {0, 0, 0};
    int64_t be = 1;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const eng_moe *y = &c->model->layers[l].moe;
        if (!y->gate) continue;
        const size_t b[3] = {eng_qtype_row_bytes(y->gate[0].dot_type, (int64_t)E),
                             eng_qtype_row_bytes(y->up[0].dot_type, (int64_t)E),
                             eng_qtype_row_bytes(y->down[0].dot_type, (int64_t)F)};
        for (int i = 0; i < 3; i++) rb[i] = b[i] > rb[i] ? b[i] : rb[i];
        int64_t lbe = eng_qtype_get(y->down[0].dot_type)->block_elems; /* 1, 32 or 256: each divides the next */
        be = lbe > be ? lbe : be;
    }
    c->moe_cols = (int32_t)((MOE_COLS + be - 1) / be * be);
    c->moe_probs = calloc(MB * NE, sizeof(float));
    c->moe_rt = calloc((size_t)c->n_threads, sizeof *c->moe_rt);
    c->moe_g = calloc(S * F, sizeof(float));
    c->moe_u = calloc(S * F, sizeof(float));
    c->moe_xd = calloc(S, rb[2]);
    c->moe_out = calloc(S * E, sizeof(float));
    if (!c->moe_probs || !c->moe_rt || !c->moe_g || !c->moe_u || !c->moe_xd || !c->moe_out) return ENG_ERR_NOMEM;
    for (int32_t t = 0; t < c->n_threads; t++) {
        eng_moe_route *rt = &c->moe_rt[t];
        rt->w = calloc(S, sizeof(float));
        rt->sel = calloc(S, sizeof(int32_t));
        rt->slot = calloc(S, sizeof(int32_t));
        rt->row = calloc(S, sizeof(int32_t));
        rt->off = calloc(NE + 1, sizeof(int32_t));
        rt->active = calloc(NE, sizeof(int32_t));
        rt->x[0] = calloc(MB, rb[0]); /* an expert has at most one slot per row */
        rt->x[1] = calloc(MB, rb[1]);
        if (!rt->w || !rt->sel || !rt->slot || !rt->row || !rt->off || !rt->active || !rt->x[0] || !rt->x[1])
            return ENG_ERR_NOMEM;
    }
    return 0;
}

void eng_fwd_moe_free(eng_ctx *c) {
    for (int32_t t = 0; c->moe_rt && t < c->n_threads; t++) {
        eng_moe_route *rt = &c->moe_rt[t];
        KVS_FREE_ALL(rt->w, rt->sel, rt->slot, rt->row, rt->off, rt->active, rt->x[0], rt->x[1]);
    }
    KVS_FREE_ALL(c->moe_probs, c->moe_rt, c->moe_g, c->moe_u, c->moe_xd, c->moe_out);
}
