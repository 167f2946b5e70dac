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
    /* stages split dynamically, per layer: Q/K/V, wo, gate/up, w_down */
    DYN_QKV = 0, DYN_WO = 1, DYN_GU = 2, DYN_DOWN = 3, N_DYN = 4,
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

#endif /* KVSERVE_ENGINE_FORWARD_CTX_H */
