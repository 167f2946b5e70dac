/*
 * forward.c: the multi-sequence forward pass of a CPU engine context over the paged KV cache (the context itself,
 * struct eng_ctx, is in forward_ctx.h; context.c creates and frees it).
 *
 * One eng_decode runs as one parallel region on the context's thread pool. Every stage splits its work
 * across the threads and ends in a barrier; per layer:
 *   1. residual add, RMSNorm, quantize the rows (split by rows; batches of <= SMALL_M rows: every thread
 *      does all rows into its own buffers, no barrier),
 *   2. Q/K/V products in chunks of head units, then bias / q-k norm / RoPE / cache writes of the same heads,
 *   3. attention split by units of (tile, KV head): a tile is up to tile_r rows of one sequence at
 *      consecutive positions (a prefill run; a decode row is a tile of 1), and a unit computes all the query
 *      heads sharing one KV head for all the tile's rows, so every K and V row it reads is loaded and
 *      converted once for tile rows x heads queries; units are split across threads by their estimated cost;
 *      each unit's output is quantized in place for wo,
 *   4. wo product (in chunks of output rows), 5. as 1 with the FFN norm,
 *   6. gate/up products in chunks of columns (whole blocks of w_down's activation format), silu(gate) * up
 *      (GELU for gemma3, clamped SwiGLU for gpt-oss) and its quantization on the same columns, 7. w_down product
 *      (an MoE layer runs forward_moe.c's router and grouped experts in place of 6 and 7).
 * Optional per-model parts: attn_output biases (added by the thread computing the wo chunk), attention sinks
 * (in the softmax's denominator, eng_attn_softmax_inv), YaRN's rotation frequencies and scale (context.c).
 * The matrix stages (2, 4, 6, 7 and the output projection) hand out their chunks from shared counters
 * (next_chunk), so a thread that falls behind leaves its remaining chunks to the others.
 * Activations are quantized once per matrix input (per distinct dot type of the matrices reading it). The
 * output projection runs only for the rows that want logits. All scratch memory is allocated in
 * eng_ctx_create (context.c) for max_batch_tokens rows (the logits buffer grows when a batch wants more rows than
 * min(max_seqs, max_batch_tokens) rows).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/runtime/batch.h"
#include "engine/runtime/forward_cuda.h"
#include "engine/runtime/kv_pool.h"
#include "common/common.h"
#include "engine/model/model.h"
#include "engine/kernels/ops.h"
#include "engine/kernels/quant.h"
#include "engine/kernels/quant_kpacked.h"
#include "engine/kernels/sampler_kernels.h"
#include "engine/runtime/threadpool.h"
#include "engine/runtime/forward_ctx.h"
#include "engine/runtime/encoder_fwd.h"

/* ---- the parallel forward ------------------------------------------------------------------------------ */
static inline void split(int64_t n, int ith, int nth, int64_t *b, int64_t *e) {
    *b = n * ith / nth;
    *e = n * (ith + 1) / nth;
}

/* Whether matrix i of a group is the first with its dot type. */
static bool first_of_type(const eng_matrix *const *ms, int i) {
    for (int j = 0; j < i; j++)
        if (ms[j]->dot_type == ms[i]->dot_type) return false;
    return true;
}

/* The buffer index (0..MAX_GROUP-1) holding the input quantized for matrix i of a group: one per distinct
 * dot type, in order of first appearance. */
static int group_slot(const eng_matrix *const *ms, int i) {
    int slot = 0;
    for (int j = 0; j < i; j++) {
        if (!first_of_type(ms, j)) continue;
        if (ms[j]->dot_type == ms[i]->dot_type) return slot;
        slot++;
    }
    return slot;
}

/* Quantizes rows [rb, re) of src (row stride ld floats) for every distinct dot type of the group. */
static void quantize_rows(void *const *bufs, const eng_matrix *const *ms, int n_ms, const float *src, int64_t ld,
                          int64_t rb, int64_t re) {
    for (int i = 0; i < n_ms; i++) {
        if (!first_of_type(ms, i)) continue;
        int slot = group_slot(ms, i);
        size_t rbytes = eng_qtype_row_bytes(ms[i]->dot_type, ms[i]->k);
        for (int64_t r = rb; r < re; r++)
            eng_quantize_row(ms[i]->dot_type, src + r * ld, (char *)bufs[slot] + (size_t)r * rbytes, ms[i]->k);
    }
}

/* y[r * ldy + j] = dot(w row j, x row r) for r < m and j in [jb, je): the packed rows when the context's
 * kernel level reads them, else the GGUF rows. */
void eng_fwd_mat_gemm(const eng_ctx *c, const eng_matrix *w, const void *xq, int64_t m, float *y, int64_t ldy,
                     int64_t jb, int64_t je) {
    if (w->packed && c->simd >= ENG_SIMD_AVX2)
        eng_gemm_wpacked(c->simd, w->type, w->packed, w->n_out, w->k, xq, m, y, ldy, jb, je);
    else
        eng_gemm(c->simd, w->type, w->data, w->k, xq, m, y, ldy, jb, je);
}

/* Stages are split into chunks that threads take from a shared counter (the next unit to hand out): a thread that
 * falls behind (descheduled while another process runs, as a load client on the same cores does) leaves its
 * remaining chunks to the others instead of making them spin at the barrier. Small batches (m <= SMALL_M, reading
 * the weights at memory speed) take guided chunks: the remaining units over 2 x nth, at least min_units, so that
 * the threads reach the barrier within one small chunk of each other (at a token's end the output matrix alone is
 * hundreds of megabytes; in bench-1b's single-sequence decode the threads' time waiting at barriers fell from 5% to
 * under 2%). Larger batches take chunks of n / (4 nth) units (at least min_units), whose fewer calls amortize the
 * per-call preparation of m activation rows. Results do not depend on who computes what. */
bool eng_fwd_next_chunk(_Atomic int64_t *ctr, int64_t n, int nth, int64_t min_units, bool guided, int64_t *b,
                       int64_t *e) {
    int64_t pos = atomic_load_explicit(ctr, memory_order_relaxed);
    for (;;) {
        if (pos >= n) return false;
        int64_t per = guided ? (n - pos) / (2 * (int64_t)nth) : n / (4 * (int64_t)nth);
        if (per < min_units) per = min_units;
        if (per > n - pos) per = n - pos;
        if (atomic_compare_exchange_weak_explicit(ctr, &pos, pos + per, memory_order_relaxed, memory_order_relaxed)) {
            *b = pos;
            *e = pos + per;
            return true;
        }
    }
}

/* A matrix product shared by the threads in chunks of whole groups of 16 output rows (a packed group is then
 * computed by one thread; small batches take small chunks, large ones chunks long enough to amortize the
 * packed kernel's per-call preparation of the activations). */
void eng_fwd_gemm_part(eng_ctx *c, const eng_matrix *w, const void *xq, int64_t m, float *y, int64_t ldy,
                      _Atomic int64_t *ctr, int nth) {
    int64_t groups = (w->n_out + 15) / 16, gb, ge;
    while (eng_fwd_next_chunk(ctr, groups, nth, m <= SMALL_M ? 4 : 16, m <= SMALL_M, &gb, &ge)) {
        int64_t jb = gb * 16, je = ge * 16 < w->n_out ? ge * 16 : w->n_out;
        eng_fwd_mat_gemm(c, w, xq, m, y, ldy, jb, je);
    }
}

/* gemm_part with a bias (bias[n_out], or NULL: none) added to the outputs of each chunk by the thread that computed
 * them. */
static void gemm_part_bias(eng_ctx *c, const eng_matrix *w, const float *bias, const void *xq, int64_t m, float *y,
                           int64_t ldy, _Atomic int64_t *ctr, int nth) {
    if (!bias) {
        eng_fwd_gemm_part(c, w, xq, m, y, ldy, ctr, nth);
        return;
    }
    int64_t groups = (w->n_out + 15) / 16, gb, ge;
    while (eng_fwd_next_chunk(ctr, groups, nth, m <= SMALL_M ? 4 : 16, m <= SMALL_M, &gb, &ge)) {
        int64_t jb = gb * 16, je = ge * 16 < w->n_out ? ge * 16 : w->n_out;
        eng_fwd_mat_gemm(c, w, xq, m, y, ldy, jb, je);
        for (int64_t r = 0; r < m; r++)
            for (int64_t j = jb; j < je; j++) y[r * ldy + j] += bias[j];
    }
}

static void store_row(const kvc_layout *lay, void *dst, const float *src, int32_t n) {
    switch (lay->dtype) {
    case KVC_DTYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case KVC_DTYPE_F16:
        for (int32_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = eng_f32_to_fp16(src[i]);
        break;
    case KVC_DTYPE_Q8_0: eng_quantize_row(ENG_Q_Q8_0, src, dst, n); break;
    }
}

static void load_row(const kvc_layout *lay, float *dst, const void *src, int32_t n) {
    switch (lay->dtype) {
    case KVC_DTYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case KVC_DTYPE_F16:
        for (int32_t i = 0; i < n; i++) dst[i] = eng_fp16_to_f32(((const uint16_t *)src)[i]);
        break;
    case KVC_DTYPE_Q8_0: eng_dequantize_row(ENG_Q_Q8_0, src, dst, n); break;
    }
}

/* Quantizes n values of src to type at value offset j0 (a multiple of the type's block size) of row r of a
 * quantized buffer whose rows hold k values. */
void eng_fwd_quantize_part(uint32_t type, int64_t k, const float *src, void *buf, int64_t r, int64_t j0, int64_t n) {
    const eng_qtype_info *qi = eng_qtype_get(type);
    char *row = (char *)buf + (size_t)r * eng_qtype_row_bytes(type, k);
    eng_quantize_row(type, src, row + (size_t)(j0 / qi->block_elems) * (size_t)qi->block_bytes, n);
}

/* Asks the CPU to start loading n cache rows at p (the block after next of a KV head, while this one is
 * computed: a unit reads each block once, so the rows would otherwise arrive only when the kernels need
 * them). */
static void prefetch_rows(const eng_ctx *c, const char *p, int32_t n) {
    size_t bytes = (size_t)n * c->lay.row_bytes;
    for (size_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i);
}

/* The nt Q8_0 cache rows at p dequantized into this thread's th_kv. */
static const float *dequant_rows(eng_ctx *c, const char *p, int32_t nt, int ith) {
    const int32_t hd = c->hp->head_dim;
    float *rows = c->th_kv + (size_t)ith * c->lay.block_size * hd;
    for (int32_t t = 0; t < nt; t++)
        eng_dequantize_row(ENG_Q_Q8_0, p + (size_t)t * c->lay.row_bytes, rows + (size_t)t * hd, hd);
    return rows;
}

/* Scores of the m queries q[m][hd] against the nt cache rows at kb (one block of one KV head's K), written to
 * s[i * lds + t]. */
static void tile_scores(eng_ctx *c, const float *q, int32_t m, const char *kb, int32_t nt, float scale, float *s,
                        int32_t lds, int ith) {
    const kvc_layout *lay = &c->lay;
    int32_t hd = c->hp->head_dim;
    float *work = c->th_work + (size_t)ith * ENG_ATTN_WORK(hd);
    if (lay->dtype == KVC_DTYPE_F16) {
        eng_attn_tile_scores_f16(c->attn_level, q, m, (const uint16_t *)kb, nt, hd, scale, s, lds, work);
    } else if (lay->dtype == KVC_DTYPE_F32) {
        eng_attn_tile_scores_f32(c->attn_level, q, m, (const float *)kb, nt, hd, scale, s, lds, work);
    } else { /* Q8_0 rows: the block dequantized first */
        eng_attn_tile_scores_f32(c->attn_level, q, m, dequant_rows(c, kb, nt, ith), nt, hd, scale, s, lds, work);
    }
}

/* o[i] += sum_t p[i * ldp + t] V[t] over the nt cache rows at vb (one block of one KV head's V). */
static void tile_accum(eng_ctx *c, float *o, int32_t m, const float *p, int32_t ldp, const char *vb, int32_t nt,
                       int ith) {
    const kvc_layout *lay = &c->lay;
    int32_t hd = c->hp->head_dim;
    float *work = c->th_work + (size_t)ith * ENG_ATTN_WORK(hd);
    if (lay->dtype == KVC_DTYPE_F16) {
        eng_attn_tile_accum_f16(c->attn_level, o, m, p, ldp, (const uint16_t *)vb, nt, hd, work);
    } else if (lay->dtype == KVC_DTYPE_F32) {
        eng_attn_tile_accum_f32(c->attn_level, o, m, p, ldp, (const float *)vb, nt, hd, work);
    } else {
        eng_attn_tile_accum_f32(c->attn_level, o, m, p, ldp, dequant_rows(c, vb, nt, ith), nt, hd, work);
    }
}

/* Attention unit u in layer l (see the unit fields of eng_ctx): for each row r of the tile and each query
 * head h of the group, softmax(q K^T * attn_scale) V over positions 0..pos[r] of the tile's sequence (only the
 * last n_swa of them in a sliding-window layer: blocks wholly before the tile's first window are not read), read
 * block by block through its block table; every block is read once for all rows x heads of the unit (rows
 * of the tile read up to the last row's position, positions past a row's own are masked out). The scores
 * are kept for the whole context (two-pass softmax: max, then the exponentials and their sum). With
 * wo_type >= 0, each row's outputs of the group's heads are quantized for wo at once. */
static void attend_unit(eng_ctx *c, int32_t l, int64_t u, int wo_type, int ith) {
    const eng_hparams *hp = c->hp;
    const bool in_swa = c->kv_in_swa[l];
    const kvc_layout *lay = in_swa ? &c->lay_swa : &c->lay;
    const int32_t hd = hp->head_dim, bs = lay->block_size, G = hp->n_head / hp->n_head_kv;
    const int32_t qd = hp->n_head * hd, lds = c->n_ctx;
    const int64_t n_g = (int64_t)hp->n_head_kv * c->n_grp;
    const int32_t tile = (int32_t)(u / n_g), grp = (int32_t)(u % n_g);
    const int32_t kvh = grp / c->n_grp, g0 = grp % c->n_grp * c->grp_heads;
    const int32_t gs = G - g0 < c->grp_heads ? G - g0 : c->grp_heads, h0 = kvh * G + g0;
    const int32_t *rows = c->tile_rows + (size_t)tile * ATT_MAX_R;
    const int32_t nr = c->tile_len[tile], m = nr * gs;
    const int32_t *pos = c->batch->pos, *blocks = (in_swa ? c->row_blocks_swa : c->row_blocks)[rows[0]];
    const int32_t len = pos[rows[nr - 1]] + 1; /* positions the tile reads */
    float *q = c->th_q + (size_t)ith * c->att_q * hd, *o = c->th_o + (size_t)ith * c->att_q * hd;
    float *scores = c->th_scores + (size_t)ith * c->att_q * lds;
    const float scale = hp->attn_scale;
    const bool swa = c->model->layers[l].swa && hp->n_swa > 0;
    const float *sinks = c->model->layers[l].attn_sinks; /* [n_head] or NULL */
    const int32_t win0 = swa && pos[rows[0]] + 1 > hp->n_swa ? pos[rows[0]] + 1 - hp->n_swa : 0;
    const int32_t tb = win0 / bs * bs; /* the first position read: the start of the block holding win0 */
    const char *kbase = (const char *)lay->base + (size_t)(2 * c->kv_layer[l]) * lay->layer_bytes +
                        (size_t)kvh * lay->head_stride;
    const char *vbase = kbase + lay->layer_bytes;

    for (int32_t r = 0; r < nr; r++) /* query i = r * gs + g */
        memcpy(q + (size_t)r * gs * hd, c->q + (size_t)rows[r] * qd + (size_t)h0 * hd, (size_t)gs * hd * sizeof *q);
    const int32_t nb = (len + bs - 1) / bs;
    for (int32_t t0 = tb, bi = tb / bs; t0 < len; t0 += bs, bi++) {
        int32_t nt = len - t0 < bs ? len - t0 : bs;
        if (bi + ATT_PREFETCH < nb) prefetch_rows(c, kbase + (size_t)blocks[bi + ATT_PREFETCH] * lay->block_stride, bs);
        tile_scores(c, q, m, kbase + (size_t)blocks[bi] * lay->block_stride, nt, scale, scores + t0, lds, ith);
    }
    /* Softmax numerators in place (one exp per position and query: a large part of the cost over long
     * contexts, hence the vector kernel); positions past a row's own get weight 0. */
    float inv[ATT_MAX_Q];
    for (int32_t i = 0; i < m; i++) {
        float *s = scores + (size_t)i * lds;
        int32_t n = pos[rows[i / gs]] + 1, lo = swa && n > hp->n_swa ? n - hp->n_swa : 0;
        float mx = c->smp.max(s + lo, n - lo);
        float sink = sinks ? sinks[h0 + i % gs] : -INFINITY;
        inv[i] = eng_attn_softmax_inv(c->attn_level, s + lo, n - lo, mx, sink);
        if (lo > tb) memset(s + tb, 0, (size_t)(lo - tb) * sizeof *s);
        if (n < len) memset(s + n, 0, (size_t)(len - n) * sizeof *s);
    }
    memset(o, 0, (size_t)m * hd * sizeof *o);
    for (int32_t t0 = tb, bi = tb / bs; t0 < len; t0 += bs, bi++) {
        int32_t nt = len - t0 < bs ? len - t0 : bs;
        if (bi + ATT_PREFETCH < nb) prefetch_rows(c, vbase + (size_t)blocks[bi + ATT_PREFETCH] * lay->block_stride, bs);
        tile_accum(c, o, m, scores + t0, lds, vbase + (size_t)blocks[bi] * lay->block_stride, nt, ith);
    }
    for (int32_t r = 0; r < nr; r++) {
        float *out = c->att + (size_t)rows[r] * qd + (size_t)h0 * hd;
        for (int32_t g = 0; g < gs; g++) {
            const float *oi = o + (size_t)(r * gs + g) * hd;
            float f = inv[r * gs + g];
            for (int32_t d = 0; d < hd; d++) out[(size_t)g * hd + d] = oi[d] * f;
        }
        if (wo_type >= 0)
            eng_fwd_quantize_part((uint32_t)wo_type, qd, out, c->xq_att, rows[r], (int64_t)h0 * hd, (int64_t)gs * hd);
    }
}

/* The cache row of K (kv = 0) or V (kv = 1) of layer l, head h for batch row r, in the layer's pool. Both pools
 * share dtype, head size and block size, so store_row and load_row take either layout. */
static void *kv_row(const eng_ctx *c, int32_t l, int kv, int32_t r, int32_t h) {
    if (c->kv_in_swa[l]) return kvc_row_ptr(&c->lay_swa, c->kv_layer[l], kv, c->slots_swa[r], h);
    return kvc_row_ptr(&c->lay, c->kv_layer[l], kv, c->slots[r], h);
}

/* Post-processing of head unit u of row r, u in [0, n_head + 2 n_head_kv): u < n_head: Q head u (bias, q norm,
 * RoPE); then K head u - n_head (bias, k norm, RoPE, written to the cache); then V head u - n_head - n_head_kv
 * (bias, written to the cache). */
static void qkv_post(eng_ctx *c, const eng_layer *ly, int32_t l, int32_t r, int32_t u) {
    const eng_hparams *hp = c->hp;
    int32_t hd = hp->head_dim, H = hp->n_head, HKV = hp->n_head_kv;
    const float *cs = (ly->swa ? c->rope_cs_swa : c->rope_cs) + (size_t)r * hp->n_rot;
    if (u < H) {
        float *q = c->q + (size_t)r * H * hd + (size_t)u * hd;
        if (ly->bq)
            for (int32_t i = 0; i < hd; i++) q[i] += ly->bq[(size_t)u * hd + i];
        if (ly->q_norm) eng_rmsnorm(q, q, ly->q_norm, hd, hp->rms_eps);
        eng_rope(q, hp->n_rot, cs, hp->neox_rope);
    } else if (u < H + HKV) {
        int32_t h = u - H;
        float *k = c->k + (size_t)r * HKV * hd + (size_t)h * hd;
        if (ly->bk)
            for (int32_t i = 0; i < hd; i++) k[i] += ly->bk[(size_t)h * hd + i];
        if (ly->k_norm) eng_rmsnorm(k, k, ly->k_norm, hd, hp->rms_eps);
        eng_rope(k, hp->n_rot, cs, hp->neox_rope);
        store_row(&c->lay, kv_row(c, l, 0, r, h), k, hd);
    } else {
        int32_t h = u - H - HKV;
        float *v = c->v + (size_t)r * HKV * hd + (size_t)h * hd;
        if (ly->bv)
            for (int32_t i = 0; i < hd; i++) v[i] += ly->bv[(size_t)h * hd + i];
        store_row(&c->lay, kv_row(c, l, 1, r, h), v, hd);
    }
}

/* The Q, K and V products, shared by the threads in chunks of head units (n_head + 2 n_head_kv units of
 * head_dim output rows, Q heads first, then K, then V), each chunk followed by the post-processing of its units,
 * so that no barrier is needed between the products and RoPE. */
static void qkv_part(eng_ctx *c, const eng_layer *ly, int32_t l, void *const *xq, int64_t m, int nth) {
    const eng_hparams *hp = c->hp;
    const int64_t hd = hp->head_dim, H = hp->n_head, HKV = hp->n_head_kv;
    const eng_matrix *ms[3] = {&ly->wq, &ly->wk, &ly->wv};
    float *ys[3] = {c->q, c->k, c->v};
    const int64_t first[3] = {0, H, H + HKV}, count[3] = {H, HKV, HKV};
    int64_t ub, ue;
    while (eng_fwd_next_chunk(&c->dyn[(size_t)l * N_DYN + DYN_QKV], H + 2 * HKV, nth, 1, m <= SMALL_M, &ub, &ue)) {
        for (int i = 0; i < 3; i++) {
            int64_t lo = (ub > first[i] ? ub : first[i]) - first[i];
            int64_t hi = (ue < first[i] + count[i] ? ue : first[i] + count[i]) - first[i];
            if (hi > lo) eng_fwd_mat_gemm(c, ms[i], xq[group_slot(ms, i)], m, ys[i], ms[i]->n_out, lo * hd, hi * hd);
        }
        for (int64_t u = ub; u < ue; u++)
            for (int64_t r = 0; r < m; r++) qkv_post(c, ly, l, (int32_t)r, (int32_t)u);
    }
}

/* The (cos, sin) pairs of a rotation by pos positions, both times mscale: the context's rope_mscale for the
 * forward pass, 1 for a pure re-rotation (context shift). */
static void rope_angles(const eng_ctx *c, float *cs, double pos, bool swa, float mscale) {
    const float *inv_freq = swa ? c->inv_freq_swa : c->inv_freq;
    for (int32_t i = 0; i < c->hp->n_rot / 2; i++) {
        double th = pos * (double)inv_freq[i];
        cs[2 * i] = (float)cos(th) * mscale;
        cs[2 * i + 1] = (float)sin(th) * mscale;
    }
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) */
static float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
}

float eng_fwd_act(eng_ffn_act act, float x) { return act == ENG_ACT_GELU_TANH ? gelu_tanh(x) : silu(x); }

/* tmp = RMSNorm(tmp) with w for this thread's rows, then a barrier: gemma3's norms of the attention and FFN
 * outputs before they join the residual stream. */
static void post_norm(eng_ctx *c, const float *w, int64_t rb, int64_t re) {
    const int64_t E = c->hp->n_embd;
    for (int64_t r = rb; r < re; r++) eng_rmsnorm(c->tmp + r * E, c->tmp + r * E, w, E, c->hp->rms_eps);
    eng_pool_barrier(c->pool);
}

/* xnext = xcur + tmp (the pending residual), then RMSNorm with w and quantization for the matrix group ms into
 * xq, for the rows [rb, re) of this thread followed by a barrier, or, for small batches, for every row by every
 * thread into its own buffers without a barrier (each thread still writes only its own rows of xnext, and
 * nobody writes xcur or tmp before the next barrier). Swaps *xcur and *xnext. */
static void residual_norm(eng_ctx *c, float **xcur, float **xnext, const float *w, const eng_matrix *const *ms,
                          int n_ms, void *const *xq, int64_t rb, int64_t re, int ith) {
    const int64_t E = c->hp->n_embd, m = c->m;
    const bool small = m <= SMALL_M;
    float *xn = small ? c->th_xn + (size_t)ith * SMALL_M * E : c->xn;
    int64_t qb = small ? 0 : rb, qe = small ? m : re;
    for (int64_t r = qb; r < qe; r++) {
        const float *x = *xcur + r * E, *t = c->tmp + r * E;
        float *y = xn + r * E;
        for (int64_t i = 0; i < E; i++) y[i] = x[i] + t[i];
        if (r >= rb && r < re) memcpy(*xnext + r * E, y, (size_t)E * sizeof(float));
        eng_rmsnorm(y, y, w, E, c->hp->rms_eps);
    }
    quantize_rows(xq, ms, n_ms, xn, E, qb, qe);
    if (!small) eng_pool_barrier(c->pool);
    float *t = *xcur;
    *xcur = *xnext;
    *xnext = t;
}

/* The dense feed-forward of layer l after its norm (x quantized in xq_in): gate and up in chunks of columns
 * (whole blocks of w_down's activation format), each followed by act(gate) * up and its quantization for w_down
 * on the same columns, then w_down into c->tmp. */
static void dense_ffn(eng_ctx *c, const eng_layer *ly, int32_t l, void *const *xq_in, const eng_matrix *const *gu,
                      int64_t m, int nth) {
    const eng_hparams *hp = c->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff;
    const eng_qtype_info *down_in = eng_qtype_get(ly->w_down.dot_type);

    int64_t be = down_in->block_elems, jb, je;
    while (eng_fwd_next_chunk(&c->dyn[(size_t)l * N_DYN + DYN_GU], F / be, nth,
                              m <= SMALL_M ? 1 : (256 + be - 1) / be, m <= SMALL_M, &jb, &je)) {
        jb *= be;
        je *= be;
        eng_fwd_mat_gemm(c, &ly->w_gate, xq_in[group_slot(gu, 0)], m, c->gate, F, jb, je);
        eng_fwd_mat_gemm(c, &ly->w_up, xq_in[group_slot(gu, 1)], m, c->up, F, jb, je);
        for (int64_t r = 0; r < m; r++) {
            float *g = c->gate + r * F;
            const float *u = c->up + r * F;
            if (hp->ffn_act == ENG_ACT_GELU_TANH)
                for (int64_t i = jb; i < je; i++) g[i] = gelu_tanh(g[i]) * u[i];
            else if (hp->ffn_act == ENG_ACT_SWIGLU_OAI)
                eng_swiglu_oai(g + jb, u + jb, je - jb, hp->swiglu_alpha, hp->swiglu_limit);
            else
                for (int64_t i = jb; i < je; i++) g[i] = silu(g[i]) * u[i];
            eng_fwd_quantize_part(ly->w_down.dot_type, F, g + jb, c->xq_ffn, r, jb, je - jb);
        }
    }
    eng_pool_barrier(c->pool);
    eng_fwd_gemm_part(c, &ly->w_down, c->xq_ffn, m, c->tmp, E, &c->dyn[(size_t)l * N_DYN + DYN_DOWN], nth);
    eng_pool_barrier(c->pool);
}

static void forward_worker(void *arg, int ith, int nth) {
    eng_ctx *c = arg;
    const eng_model *mdl = c->model;
    const eng_hparams *hp = c->hp;
    const eng_batch *b = c->batch;
    const int64_t m = c->m, E = hp->n_embd;
    const int64_t QD = (int64_t)hp->n_head * hp->head_dim;
    int64_t rb, re;
    split(m, ith, nth, &rb, &re);

    /* embeddings and rotation angles */
    for (int64_t r = rb; r < re; r++) {
        (void)eng_model_embd_row(mdl, b->token[r], c->x + r * E, (char *)c->th_embd + (size_t)ith * c->embd_row_cap);
        if (hp->embd_scale != 1.0f)
            for (int64_t i = 0; i < E; i++) c->x[r * E + i] *= hp->embd_scale;
        memset(c->tmp + r * E, 0, (size_t)E * sizeof(float));
        rope_angles(c, c->rope_cs + r * hp->n_rot, (double)b->pos[r], false, c->rope_mscale);
        if (hp->n_swa > 0)
            rope_angles(c, c->rope_cs_swa + r * hp->n_rot, (double)b->pos[r], true, c->rope_mscale);
    }
    eng_pool_barrier(c->pool);

    const int64_t hd = hp->head_dim;
    float *xcur = c->x, *xnext = c->x2;
    void *xq_in[MAX_GROUP];
    for (int i = 0; i < MAX_GROUP; i++)
        xq_in[i] = m <= SMALL_M ? (char *)c->th_xq + ((size_t)ith * MAX_GROUP + i) * SMALL_M * c->xq_row_cap : c->xq[i];
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const eng_layer *ly = &mdl->layers[l];
        const eng_matrix *qkv[3] = {&ly->wq, &ly->wk, &ly->wv};
        const eng_matrix *gu[2] = {&ly->w_gate, &ly->w_up};
        const eng_qtype_info *wo_in = eng_qtype_get(ly->wo.dot_type);

        /* residual of the previous layer's FFN, attention norm, quantize */
        residual_norm(c, &xcur, &xnext, ly->attn_norm, qkv, 3, xq_in, rb, re, ith);

        /* Q, K, V products; biases, q/k norms, RoPE and cache writes of the same heads */
        qkv_part(c, ly, l, xq_in, m, nth);
        eng_pool_barrier(c->pool);

        /* attention by units (tile, KV head group), split by estimated cost (eng_decode planned them); the
         * output of a unit is quantized for wo at once when a head is a whole number of the activation
         * format's blocks */
        bool fuse_wo = hd % wo_in->block_elems == 0;
        for (int64_t u = c->th_units[ith]; u < c->th_units[ith + 1]; u++)
            attend_unit(c, l, u, fuse_wo ? (int)ly->wo.dot_type : -1, ith);
        eng_pool_barrier(c->pool);
        if (!fuse_wo) {
            for (int64_t r = rb; r < re; r++)
                eng_fwd_quantize_part(ly->wo.dot_type, QD, c->att + r * QD, c->xq_att, r, 0, QD);
            eng_pool_barrier(c->pool);
        }
        gemm_part_bias(c, &ly->wo, ly->bo, c->xq_att, m, c->tmp, E, &c->dyn[(size_t)l * N_DYN + DYN_WO], nth);
        eng_pool_barrier(c->pool);
        if (ly->post_attn_norm) post_norm(c, ly->post_attn_norm, rb, re);

        if (ly->moe.gate) { /* Mixture of Experts: router, then the selected experts grouped (forward_moe.c) */
            const eng_matrix *rgu[3] = {&ly->moe.router, &ly->moe.gate[0], &ly->moe.up[0]};
            residual_norm(c, &xcur, &xnext, ly->ffn_norm, rgu, 3, xq_in, rb, re, ith);
            eng_fwd_moe(c, l, xq_in, ith, nth);
            if (ly->post_ffn_norm) post_norm(c, ly->post_ffn_norm, rb, re);
            continue;
        }
        residual_norm(c, &xcur, &xnext, ly->ffn_norm, gu, 2, xq_in, rb, re, ith);
        dense_ffn(c, ly, l, (void *const *)xq_in, gu, m, nth);
        if (ly->post_ffn_norm) post_norm(c, ly->post_ffn_norm, rb, re);
    }

    /* hidden states asked for (want_embd): final residual and norm into embd, x left as it is; the barrier
     * keeps the logit rows' in-place residual below from racing with these reads */
    if (b->want_embd) {
        for (int64_t r = rb; r < re; r++) {
            if (!b->want_embd[r]) continue;
            float *e = c->embd + r * E;
            const float *x = xcur + r * E, *t = c->tmp + r * E;
            for (int64_t j = 0; j < E; j++) e[j] = x[j] + t[j];
            eng_rmsnorm(e, e, mdl->output_norm, E, hp->rms_eps);
        }
        eng_pool_barrier(c->pool);
    }

    /* final residual, norm and output projection for the rows that want logits */
    if (c->n_logits == 0) return;
    const eng_matrix *outm[1] = {&mdl->output};
    int64_t lb, le;
    split(c->n_logits, ith, nth, &lb, &le);
    for (int64_t i = lb; i < le; i++) {
        int64_t r = c->logit_src[i];
        float *x = xcur + r * E;
        for (int64_t j = 0; j < E; j++) x[j] += c->tmp[r * E + j];
        eng_rmsnorm(c->xn + i * E, x, mdl->output_norm, E, hp->rms_eps);
    }
    quantize_rows(c->xq, outm, 1, c->xn, E, lb, le);
    eng_pool_barrier(c->pool);
    eng_fwd_gemm_part(c, &mdl->output, c->xq[0], c->n_logits, c->logits, mdl->output.n_out,
              &c->dyn[(size_t)hp->n_layer * N_DYN], nth);
    if (hp->logit_softcap > 0.0f) { /* final soft-capping: cap * tanh(logit / cap) */
        eng_pool_barrier(c->pool);
        const float cap = hp->logit_softcap;
        for (int64_t i = lb; i < le; i++) {
            float *lg = c->logits + i * mdl->output.n_out;
            for (int64_t j = 0; j < mdl->output.n_out; j++) lg[j] = cap * tanhf(lg[j] / cap);
        }
    }
}

/* The estimated cost of attention unit u (see attend_unit): rows x heads x (positions read + a constant). */
static int64_t unit_cost(const eng_ctx *c, const eng_batch *b, int64_t u) {
    const int32_t G = c->hp->n_head / c->hp->n_head_kv;
    const int64_t n_g = (int64_t)c->hp->n_head_kv * c->n_grp;
    const int32_t t = (int32_t)(u / n_g), g0 = (int32_t)(u % n_g % c->n_grp) * c->grp_heads;
    const int32_t gs = G - g0 < c->grp_heads ? G - g0 : c->grp_heads, nr = c->tile_len[t];
    return (int64_t)nr * gs * (b->pos[c->tile_rows[(size_t)t * ATT_MAX_R + nr - 1]] + 1 + ATT_UNIT_COST);
}

/* Forms the attention tiles of batch b (rows of one sequence in batch order have consecutive positions;
 * they are cut into tiles of up to tile_r rows, wherever they sit in the batch), picks the query heads per
 * unit, and splits the units (n_head_kv * n_grp per tile) across the threads by cost: each thread gets a
 * contiguous range of units holding about 1/nth of the total (unit_cost). */
static void plan_attention(eng_ctx *c, const eng_batch *b) {
    int32_t nt = 0;
    for (int32_t i = 0; i < b->n; i++) {
        int32_t s = b->seq[i], t = c->seq_tile[s];
        if (t < 0 || c->tile_len[t] == c->tile_r ||
            b->pos[c->tile_rows[(size_t)t * ATT_MAX_R + c->tile_len[t] - 1]] + 1 != b->pos[i]) {
            t = nt++;
            c->tile_len[t] = 0;
            c->seq_tile[s] = t;
        }
        c->tile_rows[(size_t)t * ATT_MAX_R + c->tile_len[t]++] = i;
    }
    for (int32_t i = 0; i < b->n; i++) c->seq_tile[b->seq[i]] = -1;
    c->n_tiles = nt;

    /* Smaller head groups when there are few tiles: the tile kernels give every query the same result
     * whatever the other queries of its unit (ops.h), so this changes no sequence's logits. */
    const int32_t G = c->hp->n_head / c->hp->n_head_kv;
    const int64_t nth = c->n_threads;
    int32_t gh = c->grp_max;
    while (gh > 1 && (int64_t)nt * c->hp->n_head_kv * ((G + gh - 1) / gh) < ATT_MIN_UNITS * nth) gh = (gh + 1) / 2;
    c->grp_heads = gh;
    c->n_grp = (G + gh - 1) / gh;

    const int64_t n_units = (int64_t)nt * c->hp->n_head_kv * c->n_grp;
    int64_t total = 0;
    for (int64_t u = 0; u < n_units; u++) total += unit_cost(c, b, u);
    int64_t acc = 0, th = 1;
    c->th_units[0] = 0;
    for (int64_t u = 0; u < n_units; u++) {
        int64_t cost = unit_cost(c, b, u);
        /* the unit goes to the thread whose share holds the middle of its cost */
        while (th < nth && (2 * acc + cost) * nth >= 2 * total * th) c->th_units[th++] = u;
        acc += cost;
    }
    while (th <= nth) c->th_units[th++] = n_units;
}

int eng_decode(eng_ctx *c, const eng_batch *b) {
    if (!c || !b) return ENG_ERR_INVALID;
    if (c->cuda && b->want_embd) return ENG_ERR_UNSUPPORTED;
    if (c->cuda) return eng_cuda_decode(c->cuda, c->cache, b);
    if (c->model->enc) return eng_encoder_decode(c, b); /* bert, nomic-bert: encoder_fwd.c */
    c->last_n = 0;
    c->n_logits = 0;
    c->embd_valid = false;
    if (b->want_embd && !c->embd) {
        c->embd = malloc((size_t)c->max_batch * (size_t)c->hp->n_embd * sizeof(float));
        c->embd_rows = malloc((size_t)c->max_batch * sizeof(bool));
        if (!c->embd || !c->embd_rows) {
            free(c->embd);
            free(c->embd_rows);
            c->embd = NULL;
            c->embd_rows = NULL;
            return ENG_ERR_NOMEM;
        }
    }
    int32_t n_logits = 0;
    int rc = eng_batch_map(b, c->max_batch, c->hp->n_vocab, c->entries, c->logit_idx, c->logit_src, &n_logits,
                           &c->logits, &c->logits_cap);
    if (rc != 0) return rc;
    rc = kvc_start_forward(c->cache, c->entries, b->n, c->slots);
    if (rc != 0) return eng_kv_err(rc);
    const kvc_cache *group = kvc_swa_group(c->cache);
    c->slots_swa = kvc_swa_slots(c->cache);
    for (int32_t i = 0; i < b->n; i++) {
        int32_t nb, len;
        rc = kvc_block_table(c->cache, b->seq[i], &c->row_blocks[i], &nb, &len);
        if (rc == 0 && group) rc = kvc_block_table(group, b->seq[i], &c->row_blocks_swa[i], &nb, &len);
        if (rc != 0 || b->pos[i] >= len || b->pos[i] >= c->n_ctx) {
            kvc_finish_forward(c->cache, false);
            return rc != 0 ? eng_kv_err(rc) : ENG_ERR_KV;
        }
    }
    c->batch = b;
    c->m = b->n;
    c->n_logits = n_logits;
    plan_attention(c, b);
    for (size_t i = 0; i < (size_t)c->hp->n_layer * N_DYN + 1; i++)
        atomic_store_explicit(&c->dyn[i], 0, memory_order_relaxed); /* published by eng_pool_run's start */
    eng_pool_run(c->pool, forward_worker, c);
    c->batch = NULL;
    rc = kvc_finish_forward(c->cache, true);
    if (rc != 0) {
        c->n_logits = 0;
        return eng_kv_err(rc);
    }
    c->last_n = b->n;
    if (b->want_embd) memcpy(c->embd_rows, b->want_embd, (size_t)b->n * sizeof(bool));
    c->embd_valid = b->want_embd != NULL;
    return 0;
}

float *eng_get_embeddings(eng_ctx *c, int32_t i) {
    if (!c || c->cuda || !c->embd_valid || i < 0 || i >= c->last_n || !c->embd_rows[i])
        return NULL;
    return c->embd + (size_t)i * (size_t)c->hp->n_embd;
}

float *eng_get_logits(eng_ctx *c, int32_t i) {
    if (c && c->cuda) return eng_cuda_get_logits(c->cuda, i);
    if (!c || i < 0 || i >= c->last_n || c->logit_idx[i] < 0) return NULL;
    return c->logits + (size_t)c->logit_idx[i] * (size_t)c->hp->n_vocab;
}

int eng_seq_remove(eng_ctx *c, int32_t seq, int32_t begin, int32_t end) {
    if (!c) return ENG_ERR_INVALID;
    if (c->cuda) return eng_cuda_seq_remove(c->cuda, c->cache, seq, begin, end);
    kvc_shift sh = {0};
    int rc = kvc_remove(c->cache, seq, begin, end, &sh);
    if (rc == KVC_ERR_NOT_SUPPORTED) return ENG_ERR_UNSUPPORTED;
    if (rc == KVC_ERR_BAD_SEQ) return ENG_ERR_INVALID;
    if (rc != 0) return eng_kv_err(rc);
    if (sh.n <= 0 || sh.delta == 0) return 0;
    /* Context shift: keys are rotated by pos * theta, so moving a key by delta positions is one more
     * rotation by delta * theta. */
    const eng_hparams *hp = c->hp;
    const int32_t *blocks, *blocks_swa = NULL;
    int32_t nb, len;
    if (kvc_block_table(c->cache, seq, &blocks, &nb, &len) != 0) return ENG_ERR_KV;
    if (kvc_swa_group(c->cache) && kvc_block_table(kvc_swa_group(c->cache), seq, &blocks_swa, &nb, &len) != 0)
        return ENG_ERR_KV;
    float *cs = c->rope_cs, *cs_swa = c->rope_cs_swa, *row = c->th_kv; /* scratch outside a decode */
    rope_angles(c, cs, (double)sh.delta, false, 1.0f); /* keys carry the attention factor already */
    rope_angles(c, cs_swa, (double)sh.delta, true, 1.0f);
    int32_t bs = c->lay.block_size;
    for (int32_t p = sh.pos; p < sh.pos + sh.n && p < len; p++)
        for (int32_t l = 0; l < hp->n_layer; l++) {
            const bool in_swa = c->kv_in_swa[l];
            const int32_t blk = (in_swa ? blocks_swa : blocks)[p / bs];
            if (blk < 0) continue; /* released by a sliding window */
            for (int32_t h = 0; h < hp->n_head_kv; h++) {
                void *ptr = kvc_row_ptr(in_swa ? &c->lay_swa : &c->lay, c->kv_layer[l], 0, blk * bs + p % bs, h);
                load_row(&c->lay, row, ptr, hp->head_dim);
                eng_rope(row, hp->n_rot, c->model->layers[l].swa ? cs_swa : cs, hp->neox_rope);
                store_row(&c->lay, ptr, row, hp->head_dim);
            }
        }
    return 0;
}
