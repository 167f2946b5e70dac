/*
 * model.h: the loaded model (internal to the engine module). Defines struct eng_model, which engine.h keeps
 * opaque, so that the forward pass (runtime/) and engine.h's token functions (model/tok_api.c, through
 * eng_model_vocab) can read it. A model is read-only after eng_model_load returns: any thread may read it
 * concurrently.
 *
 * Matrices stay in their GGUF format (in the mapping, not copied); small vectors (norm weights, biases,
 * rope frequency factors) are dequantized to f32 at load time into memory the model owns.
 * GGUF dims are innermost first: a matrix "[k -> n]" has ne[0] = k (input length, the row length) and
 * ne[1] = n (output rows).
 */
#ifndef KVSERVE_ENGINE_MODEL_H
#define KVSERVE_ENGINE_MODEL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/format/gguf.h"

struct eng_vocab;
struct eng_encoder;

/* One weight matrix: n_out rows of k values in `type`, row j at data + j * row_bytes. */
typedef struct eng_matrix {
    const void *data;   /* [n_out][k] in type, inside the GGUF mapping */
    uint32_t type;      /* enum eng_qtype; supported by quant.h */
    uint32_t dot_type;  /* the type activations are quantized to for eng_gemm with this matrix */
    int64_t k;          /* input length (ne[0]) */
    int64_t n_out;      /* output rows (ne[1]) */
    size_t row_bytes;   /* bytes of one row */
    void *packed;       /* the rows repacked 16 at a time for the AVX2 and AVX-512 kernels (eng_wpack, for Q8_0,
                         * Q4_0, Q5_0, MXFP4, Q4_K, Q5_K and Q6_K; owned by the model), or NULL: set by
                         * eng_model_pack_cpu */
} eng_matrix;

/* A layer's Mixture-of-Experts feed-forward (qwen3moe; written for any such family): the router ranks the n_expert
 * experts for each token, and the n_expert_used highest, weighted, each compute act(gate x [+ gate_b]) * (up x
 * [+ up_b]) -> down [+ down_b]. The experts' matrices are views into the stacked 3-D tensors (ne2 = experts): expert
 * e's rows start at e x n_out rows. The arrays are owned by the layer; the rows are in the mapping (or packed). */
typedef struct eng_moe {
    eng_matrix router;  /* [n_embd -> n_expert] ffn_gate_inp */
    float *router_b;    /* [n_expert] f32 or NULL */
    eng_matrix *gate;   /* [n_expert] of [n_embd -> n_ff_exp] (ffn_gate_exps), or NULL for a dense layer (owned) */
    eng_matrix *up;     /* [n_expert] of [n_embd -> n_ff_exp] (ffn_up_exps) (owned) */
    eng_matrix *down;   /* [n_expert] of [n_ff_exp -> n_embd] (ffn_down_exps) (owned) */
    float *gate_b;      /* [n_expert][n_ff_exp] f32 or NULL (owned) */
    float *up_b;        /* [n_expert][n_ff_exp] f32 or NULL (owned) */
    float *down_b;      /* [n_expert][n_embd] f32 or NULL (owned) */
    eng_ffn_act act;    /* the experts' activation of gate */
    void *packed_exps[3]; /* gate, up, down: one buffer per stacked tensor holding every expert's packed rows, expert
                           * after expert (eng_model_pack_cpu; owned), so that a step reading most experts streams
                           * huge pages; the experts' `packed` point into it (not owned). NULL: not packed. */
} eng_moe;

typedef struct eng_layer {
    float *attn_norm;   /* [n_embd] f32 (owned) */
    eng_matrix wq;      /* [n_embd -> n_head * head_dim] */
    eng_matrix wk;      /* [n_embd -> n_head_kv * head_dim] */
    eng_matrix wv;      /* [n_embd -> n_head_kv * head_dim] */
    eng_matrix wo;      /* [n_head * head_dim -> n_embd] */
    float *bq;          /* [n_head * head_dim] f32 or NULL (qwen2 biases; owned) */
    float *bk;          /* [n_head_kv * head_dim] f32 or NULL */
    float *bv;          /* [n_head_kv * head_dim] f32 or NULL */
    float *bo;          /* [n_embd] f32 or NULL: attn_output.bias (llama, gpt-oss; owned) */
    float *attn_sinks;  /* [n_head] f32 or NULL: per-head logits that join the softmax's denominator (gpt-oss) */
    float *q_norm;      /* [head_dim] f32 or NULL (qwen3 per-head RMSNorm of Q; owned) */
    float *k_norm;      /* [head_dim] f32 or NULL (qwen3 per-head RMSNorm of K) */
    float *ffn_norm;    /* [n_embd] f32 (owned; gpt-oss: its post_attention_norm.weight) */
    eng_matrix w_gate;  /* [n_embd -> n_ff] */
    eng_matrix w_up;    /* [n_embd -> n_ff] */
    eng_matrix w_down;  /* [n_ff -> n_embd] */
    float *post_attn_norm; /* [n_embd] f32 or NULL: RMSNorm of the attention output before the residual (gemma3) */
    float *post_ffn_norm;  /* [n_embd] f32 or NULL: RMSNorm of the FFN output before the residual (gemma3) */
    bool swa;           /* a sliding-window layer: attends to the last hp.n_swa positions, rope base
                           hp.rope_freq_base_swa */
    bool fused;         /* wq/wk/wv are row ranges of one attn_qkv tensor, w_gate/w_up of one ffn_up (phi3) */
    eng_moe moe;        /* the experts (moe.gate non-NULL) in place of w_gate/w_up/w_down (then unset) */
} eng_layer;

struct eng_model {
    eng_hparams hp;
    char *path;                 /* the file loaded (owned) */
    eng_gguf *gguf;             /* the open file; tensors point into it */
    void *file_buf;             /* the file read into memory when use_mmap is false (owned), else NULL */
    struct eng_vocab *vocab;    /* the tokenizer (owned; eng_vocab_load) */
    char *chat_template;        /* tokenizer.chat_template, NUL-terminated (owned), or NULL */
    bool vocab_only;            /* loaded without tensors: no forward pass possible */

    eng_matrix tok_embd;        /* [n_embd -> n_vocab]: row t is token t's embedding */
    eng_matrix output;          /* [n_embd -> n_vocab]: == tok_embd when tied */
    float *output_norm;         /* [n_embd] f32 (owned) */
    float *rope_freqs;          /* [n_rot / 2] frequency factors (theta_i divided by rope_freqs[i]), or NULL */
    float *rope_long;           /* [n_rot / 2] phi3 factors for contexts longer than hp.n_ctx_orig, or NULL */
    float *rope_short;          /* [n_rot / 2] phi3 factors for other contexts, or NULL */
    eng_layer *layers;          /* [n_layer] (owned) */
    size_t weight_bytes;        /* bytes of every tensor the model uses */
    pthread_mutex_t pack_lock;  /* guards the one-time packing of eng_model_pack_cpu */
    bool packed;                /* eng_model_pack_cpu has run */
    struct eng_encoder *enc;    /* an encoder's own weights (engine/model/encoder.h), NULL for a decoder (owned) */
    struct eng_rank_head *rank; /* a decoder reranker's classification head (engine/model/rank_head.h), or NULL
                                   (owned) */
};

/* Matrix i of layer ly, for the loops over all of them (packing, freeing, scratch sizing, byte counts): 0..6 are
 * wq, wk, wv, wo, w_gate, w_up, w_down (the last three unset, data NULL, in an MoE layer), then for an MoE layer
 * the router and each expert's gate, up and down; NULL past the end. n_expert is the model's hp.n_expert. */
eng_matrix *eng_layer_matrix(eng_layer *ly, int32_t n_expert, size_t i);

/* Family-specific loading (model_families.c), called by eng_model_load. eng_model_family_hparams sets the family
 * fields of m->hp (n_swa, rope_freq_base_swa, attn_scale, embd_scale, logit_softcap, ffn_act, n_ctx_orig, the
 * experts' counts and gating) after
 * the common ones; returns 0 or ENG_ERR_FORMAT with a message in err. */
int eng_model_family_hparams(eng_model *m, const char *path, char *err, size_t err_len);
/* Which layers slide: per <arch>.attention.sliding_window_pattern (an int n: layer l slides unless l % n == n - 1;
 * or an array of bools), default 6 for gemma3 and 2 for gpt-oss; every layer is global when hp.n_swa is 0. */
int eng_model_family_swa_layers(eng_model *m, const char *path, char *err, size_t err_len);

/* Repacks every matrix whose type and shape allow it (eng_wpack_bytes) for the AVX2 and AVX-512 kernels, once
 * per model (later calls return at once; safe from several threads). In a memory-mapped model, the mapped
 * pages of the repacked matrices are then released (they refault from the file if something reads them again,
 * such as a CUDA context uploading the weights). That includes a tied output matrix, whose packed copy then
 * serves the embedding lookups (eng_model_embd_row); an untied token_embd is only read where looked up.
 * Returns 0 or ENG_ERR_NOMEM (the matrices packed before the failure stay packed and usable). */
int eng_model_pack_cpu(eng_model *m);

/* Token t's embedding (n_embd floats, not scaled by hp.embd_scale) into dst: the dequantized row t of token_embd,
 * read from the packed output matrix when the output is tied and packed (the same bytes, so the same floats).
 * scratch must hold tok_embd.row_bytes bytes (used only in that case). Returns 0, ENG_ERR_INVALID (t outside
 * [0, n_vocab)) or the error of eng_dequantize_row. Safe from any thread (with its own scratch). */
int eng_model_embd_row(const eng_model *m, int32_t t, float *dst, void *scratch);

/* The model's tokenizer (owned by the model). Declared for the tokenizer in engine/text/tokenizer.h too. */
const struct eng_vocab *eng_model_vocab(const eng_model *m);

#endif /* KVSERVE_ENGINE_MODEL_H */
