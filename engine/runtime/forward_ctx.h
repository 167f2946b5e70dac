/*
 * forward_ctx.h: the CPU engine context (struct eng_ctx, which engine.h keeps opaque), shared by context.c (its
 * creation, scratch buffers and release) and forward.c (the forward pass that runs over it). Internal to the
 * engine module; forward.c describes how a forward pass uses these fields.
 */
#ifndef KVSERVE_ENGINE_FORWARD_CTX_H
#define KVSERVE_ENGINE_FORWARD_CTX_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache/kv_cache.h"
#include "engine/engine.h"
#include "engine/kernels/quant.h"
#include "engine/kernels/sampler_kernels.h"
#include "engine/runtime/forward_cuda.h"
#include "engine/runtime/threadpool.h"

enum {
    MAX_GROUP = 3,
    /* stages split dynamically, per layer: Q/K/V, wo, gate/up, w_down; an MoE layer's router, experts' gate/up and
     * experts' down */
    DYN_QKV = 0, DYN_WO = 1, DYN_GU = 2, DYN_DOWN = 3, DYN_ROUTER = 4, DYN_XGU = 5, DYN_XDOWN = 6, N_DYN = 7,
    /* An MoE stage's work units: MOE_COLS columns of an expert's gate/up (rounded up to whole blocks of its down's
     * activation format), MOE_ROWS output rows of its down (a multiple of the packed groups of 16). */
    MOE_COLS = 64, MOE_ROWS = 64,
    /* Attention tiles: at most ATT_MAX_Q queries (rows x heads of one KV head) per unit, at most ATT_MAX_R rows;
     * fewer queries when their scores over the whole context would pass ATT_SCORES_BYTES per thread. */
    ATT_MAX_Q = 48,
    ATT_SCORES_BYTES = 4 << 20,
    ATT_MAX_R = 16,
    /* The cost of a unit is estimated as rows x heads x (positions read + ATT_UNIT_COST). */
    ATT_UNIT_COST = 32,
    /* A batch with fewer than ATT_MIN_UNITS units per thread splits the query heads of a KV head into smaller
     * groups (single-sequence decode would otherwise have n_head_kv units for all the threads). */
    ATT_MIN_UNITS = 2,
    /* Blocks read ahead (prefetched) by an attention unit. */
    ATT_PREFETCH = 2,
    /* Batches of at most SMALL_M rows: every thread normalizes and quantizes all rows itself (into its own
     * buffers) instead of splitting the rows and meeting at a barrier. */
    SMALL_M = 8,
};

/* One thread's routing of an MoE layer's step (forward_moe.c). */
typedef struct eng_moe_route {
    float *w;         /* [max_batch][n_expert_used] each row's routing weights by rank */
    int32_t *sel;     /* [max_batch][n_expert_used] each row's experts by rank */
    int32_t *slot;    /* [max_batch][n_expert_used] the slot of each (row, rank) */
    int32_t *row;     /* [max_batch * n_expert_used] the batch row of each slot */
    int32_t *off;     /* [n_expert + 1] expert e owns slots [off[e], off[e + 1]) */
    int32_t *active;  /* [n_expert] the experts with slots in this layer's step, ascending */
    int32_t n_active;
    int32_t x_expert; /* the expert whose input rows are in x, or -1 */
    void *x[2];       /* [max_batch][xq_row_cap] expert x_expert's input rows (its slots in order) for gate, up */
} eng_moe_route;

struct eng_ctx {
    eng_model *model;
    const eng_hparams *hp;
    int32_t n_threads, n_ctx, max_seqs, max_batch;
    kvc_cache *cache;
    kvc_layout lay;       /* the cache's main pool: every layer, or the global layers when the sliding ones have the
                             cache's sliding group */
    kvc_layout lay_swa;   /* the sliding group (n_layer 0 when the cache has none) */
    int32_t *kv_layer;    /* [n_layer] the layer's index in its pool */
    bool *kv_in_swa;      /* [n_layer] the layer's KV is in the sliding group */
    eng_pool *pool;
    eng_simd_level simd;  /* gemm kernel level */
    int attn_level;       /* attention kernel level (ENG_OPS_*) */
    eng_smp_kernels smp;  /* vectorized max and exp-sum, for the attention softmax */
    float *inv_freq;      /* [n_rot/2]: theta_i = pos * inv_freq[i] */
    float *inv_freq_swa;  /* [n_rot/2]: the same for the sliding-window layers (their own rope base) */
    float rope_mscale;    /* cos and sin of the forward pass are multiplied by it (init_rope) */

    /* per-batch bookkeeping, [max_batch] each */
    kvc_entry *entries;
    int32_t *slots;             /* cache slot of each row */
    const int32_t **row_blocks; /* block table of each row's sequence */
    const int32_t *slots_swa;   /* cache slot of each row in the sliding group (when there is one) */
    const int32_t **row_blocks_swa; /* block table of each row's sequence there */
    float *rope_cs;             /* [max_batch][n_rot]: (cos, sin) pairs of each row's position */
    float *rope_cs_swa;         /* [max_batch][n_rot]: the same for the sliding-window layers */
    int32_t *logit_idx;         /* [max_batch]: row -> logits row, or -1 */
    int32_t *logit_src;         /* [max_batch]: logits row -> batch row */

    /* activations */
    float *x;    /* [max_batch][n_embd] residual stream */
    float *x2;   /* [max_batch][n_embd] the next residual stream (the two alternate) */
    float *xn;   /* [max_batch][n_embd] normed input of a matrix group */
    float *q;    /* [max_batch][n_head * head_dim] */
    float *k;    /* [max_batch][n_head_kv * head_dim] */
    float *v;    /* [max_batch][n_head_kv * head_dim] */
    float *att;  /* [max_batch][n_head * head_dim] attention output */
    float *tmp;  /* [max_batch][n_embd] output of wo / w_down */
    float *gate; /* [max_batch][n_ff] */
    float *up;   /* [max_batch][n_ff] */
    void *xq[MAX_GROUP]; /* [max_batch][xq_row_cap] quantized activations, one buffer per distinct dot type */
    void *th_xq;         /* [n_threads][MAX_GROUP][SMALL_M][xq_row_cap] per-thread quantized rows (small batches) */
    float *th_xn;        /* [n_threads][SMALL_M][n_embd] per-thread normed rows (small batches) */
    void *th_embd;       /* [n_threads][embd_row_cap] a token_embd row read back from the packed output matrix */
    size_t embd_row_cap;
    void *xq_att;        /* [max_batch][xq_row_cap] the attention output quantized for wo */
    void *xq_ffn;        /* [max_batch][xq_row_cap] silu(gate) * up quantized for w_down */
    size_t xq_row_cap;
    /* attention scratch, per thread */
    int32_t att_q;       /* queries per attention unit at most: ATT_MAX_Q, less for long contexts */
    float *th_scores;    /* [n_threads][att_q][n_ctx] scores, then softmax numerators, of a unit's queries */
    float *th_q;         /* [n_threads][att_q][head_dim] a unit's queries (row-major: tile row, then head) */
    float *th_o;         /* [n_threads][att_q][head_dim] their unnormalized outputs */
    float *th_work;      /* [n_threads][ENG_ATTN_WORK(head_dim)] tile kernel scratch (converted K/V rows) */
    float *th_kv;        /* [n_threads][kv_block_size][head_dim] dequantized cache rows (q8_0; one row in
                            eng_seq_remove) */

    /* attention units of the batch being run (planned in eng_decode): unit u is tile u / (n_head_kv * n_grp)
     * with head group g = u % (n_head_kv * n_grp): KV head g / n_grp and its query heads from
     * (g % n_grp) * grp_heads on (at most grp_heads of them). Tile-major, so that the units reading one
     * sequence's blocks run one after the other. */
    int32_t grp_max;     /* query heads per unit at most: min(n_head / n_head_kv, att_q) */
    int32_t tile_r;      /* rows per tile: min(ATT_MAX_R, att_q / grp_max) */
    int32_t grp_heads;   /* query heads per unit in this batch: grp_max, or fewer when there are few tiles */
    int32_t n_grp;       /* head groups per KV head: ceil(n_head / n_head_kv / grp_heads) */
    int32_t n_tiles;
    int32_t *tile_rows;  /* [max_batch][ATT_MAX_R] batch rows of each tile: one sequence, consecutive positions */
    int32_t *tile_len;   /* [max_batch] rows of each tile */
    int32_t *seq_tile;   /* [max_seqs] the tile a sequence is filling while tiles are formed, else -1 */
    int64_t *th_units;   /* [n_threads + 1] thread i runs units [th_units[i], th_units[i + 1]) */

    /* work counters of the stages whose chunks threads take dynamically: [n_layer][N_DYN] + 1 for the output
     * projection, zeroed by eng_decode before each forward */
    _Atomic int64_t *dyn;

    /* Mixture-of-Experts scratch (NULL for a dense model): a step's (row, rank) pairs are its slots, grouped by
     * expert (forward_moe.c). Every thread routes all rows into its own eng_moe_route (the same numbers in each), so
     * that no thread waits for another between the router's product and the experts. */
    float *moe_probs;     /* [max_batch][n_expert] router outputs */
    struct eng_moe_route *moe_rt; /* [n_threads] each thread's routing of the step and its gathered expert inputs */
    int32_t moe_cols;     /* columns of a gate/up unit */
    float *moe_g;         /* [max_batch * n_expert_used][n_ff_exp] gate outputs, then act(gate) * up */
    float *moe_u;         /* [max_batch * n_expert_used][n_ff_exp] up outputs */
    void *moe_xd;         /* [max_batch * n_expert_used][xq_row_cap] act(gate) * up quantized for down */
    float *moe_out;       /* [max_batch * n_expert_used][n_embd] down outputs */

    float *logits;       /* [logits_cap][n_vocab] */
    int32_t logits_cap;
    float *embd;         /* [max_batch][n_embd] normed final hidden states (allocated at the first batch that
                            wants them) */
    bool *embd_rows;     /* [max_batch] the want_embd flags of the last successful decode */
    bool embd_valid;     /* the last successful decode filled embd for its embd_rows */
    float *enc_rank;     /* encoders: [max_batch][n_cls_out] the classification head's values (encoder_fwd.c) */
    int32_t *enc_seq;    /* encoders: [3][max_batch] sequence runs (first row, rows) and rows with head values */
    float *enc_kv;       /* encoders: [n_threads][2][n_ctx][head_dim] one head's K and V rows of a sequence */

    /* the batch being run */
    const eng_batch *batch;
    int32_t m;
    int32_t n_logits;    /* rows with logits in the last successful decode */
    int32_t last_n;      /* rows of the last successful decode (0 after a failure) */

    eng_cuda *cuda;      /* non-NULL: the context runs on the GPU (forward_cuda.c); the CPU fields are unused */
};

struct eng_matrix;
/* Shared by forward.c and forward_moe.c (defined in forward.c; see there). */
bool eng_fwd_next_chunk(_Atomic int64_t *ctr, int64_t n, int nth, int64_t min_units, bool guided, int64_t *b,
                        int64_t *e);
void eng_fwd_mat_gemm(const eng_ctx *c, const struct eng_matrix *w, const void *xq, int64_t m, float *y, int64_t ldy,
                      int64_t jb, int64_t je);
void eng_fwd_quantize_part(uint32_t type, int64_t k, const float *src, void *buf, int64_t r, int64_t j0, int64_t n);
void eng_fwd_gemm_part(eng_ctx *c, const struct eng_matrix *w, const void *xq, int64_t m, float *y, int64_t ldy,
                       _Atomic int64_t *ctr, int nth);
float eng_fwd_act(eng_ffn_act act, float x);

/* forward_moe.c: layer l's Mixture-of-Experts feed-forward on the normed rows (xq_in: quantized for the group
 * {router, gate[0], up[0]}, slots as group_slot numbers them), its result in c->tmp for every row; called by every
 * thread of the forward pass, ends with a barrier. */
void eng_fwd_moe(eng_ctx *c, int32_t l, void *const *xq_in, int ith, int nth);
/* The MoE scratch of a context (context.c calls it for an MoE model): 0 or ENG_ERR_NOMEM. */
int eng_fwd_moe_alloc(eng_ctx *c);
void eng_fwd_moe_free(eng_ctx *c);

#endif /* KVSERVE_ENGINE_FORWARD_CTX_H */
