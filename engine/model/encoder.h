/*
 * encoder.h: the BERT-family encoders (bert, nomic-bert, jina-bert-v2) as the engine loads them (internal to the engine module;
 * prefix eng_encoder_). An encoder model is an eng_model whose `enc` is set: its layers' wq/wk/wv/wo/w_up/w_down
 * (and w_gate for nomic-bert's SwiGLU) are the usual eng_layer matrices, so the weights are packed and counted
 * like a decoder's; what only encoders have (position and token-type embeddings, LayerNorm weights and biases,
 * the linear layers' biases, the classification head of a reranker) lives here.
 *
 * Facts from llama.cpp's bert / nomic-bert graphs (the GGUF names and keys): token_embd, token_types (row 0 is
 * added: every token is "sentence A"), position_embd (bert only), token_embd_norm{,.bias}; per layer attn_q/k/v
 * (+ .bias) or a fused attn_qkv (+ .bias), attn_output{,.bias}, attn_output_norm{,.bias}, ffn_up{,.bias},
 * ffn_gate (nomic-bert), ffn_down{,.bias}, layer_output_norm{,.bias}; cls{,.bias} and cls.output{,.bias} for a
 * classification head; <arch>.attention.layer_norm_epsilon, <arch>.pooling_type,
 * <arch>.classifier.output_labels (the head's outputs; default 1).
 *
 * jina-bert-v2 (llama.cpp's jina-bert-v2 graph): bert's layers without position_embd; attention gets ALiBi, a bias
 * of -slope_h * |i - j| added to the scaled scores (symmetric: bidirectional), slope_h as ggml's soft_max computes it
 * for max_bias 8 (n2 = the largest power of two <= n_head, m0 = 2^(-8 / n2), m1 = 2^(-4 / n2); head h < n2: m0^(h+1),
 * else m1^(2 (h - n2) + 1)); the feed-forward is GEGLU: ffn_up holds 2 x n_ff rows (gate half first, then up; its
 * bias likewise) and the activation is GELU(gate) * up (or a separate ffn_gate [n_embd, n_ff]); a reranker's head
 * is cls [n_embd, 1] + cls.bias with tanh and no cls.output (jina-reranker-v1). Optional per-layer Q/K LayerNorms
 * and attn_norm_2 are refused (ENG_ERR_UNSUPPORTED).
 *
 * Errors: eng_encoder_load returns 0, ENG_ERR_FORMAT (a missing or misshapen tensor or key, named in err),
 * ENG_ERR_UNSUPPORTED (a tensor type the engine cannot run) or ENG_ERR_NOMEM.
 */
#ifndef KVSERVE_ENGINE_ENCODER_H
#define KVSERVE_ENGINE_ENCODER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/model/model.h"

typedef struct eng_enc_layer {
    float *bq, *bk, *bv;        /* [n_embd] each, f32 or NULL (owned) */
    float *bo;                  /* [n_embd] attn_output.bias or NULL */
    float *attn_ln_w, *attn_ln_b; /* [n_embd] attn_output_norm weight and bias (post-attention LayerNorm) */
    float *b_up;                /* [n_ff] ffn_up.bias (jina-bert-v2: the up half of it) or NULL */
    float *b_gate;              /* [n_ff] jina-bert-v2: the gate half of a fused ffn_up.bias, or NULL */
    float *b_down;              /* [n_embd] ffn_down.bias or NULL */
    float *out_ln_w, *out_ln_b; /* [n_embd] layer_output_norm weight and bias (post-FFN LayerNorm) */
} eng_enc_layer;

typedef struct eng_encoder {
    bool rope;                  /* nomic-bert: rotary positions (neox halves) instead of position_embd */
    bool swiglu;                /* nomic-bert: silu(gate) * up; bert: GELU(up) */
    bool geglu;                 /* jina-bert-v2: GELU(gate) * up (w_gate, w_up: the halves of a fused ffn_up) */
    bool alibi;                 /* jina-bert-v2: ALiBi biases instead of position rows */
    float alibi_max_bias;       /* 8 (llama.cpp's f_max_alibi_bias for jina-bert-v2) */
    float ln_eps;               /* <arch>.attention.layer_norm_epsilon */
    float *type_row;            /* [n_embd] row 0 of token_types, or NULL (owned) */
    eng_matrix pos_embd;        /* [n_embd -> n_ctx_train] position_embd (bert); data NULL for nomic-bert */
    float *embd_ln_w, *embd_ln_b; /* [n_embd] token_embd_norm weight and bias */
    eng_enc_layer *layers;      /* [n_layer] (owned) */
    /* classification head (rank pooling): out = cls_out(tanh(cls(x) + cls_b)) + cls_out_b, either part optional */
    eng_matrix cls;             /* [n_embd -> n_cls] (n_cls = n_embd with cls_out; 1..n_embd without), data NULL
                                   when absent */
    float *cls_b;               /* [n_cls] or NULL */
    eng_matrix cls_out;         /* [n_embd -> n_cls_out], data NULL when absent */
    float *cls_out_b;           /* [n_cls_out] or NULL */
    int32_t n_cls_out;          /* outputs of the head; 0 when the model has none */
    float *gelu_tab;            /* [65536] bert: GELU (tanh form) of each fp16 value, rounded to fp16, as ggml's CPU
                                   backend tabulates it (its GELU is a lookup of the input rounded to fp16 for
                                   |x| < 10); NULL for nomic-bert (owned) */
} eng_encoder;

/* Whether general.architecture names an encoder this engine runs ("bert", "nomic-bert", "jina-bert-v2"); sets
 * *arch. */
bool eng_encoder_arch(const char *arch_name, eng_arch *arch);

/* Loads the encoder's tensors into m (m->hp is filled, the file open): m->tok_embd, m->layers (its matrices;
 * the norm pointers stay NULL) and m->enc. On failure m keeps what was loaded for eng_model_free. */
int eng_encoder_load(eng_model *m, const char *path, char *err, size_t err_len);

/* Frees what eng_encoder_load allocated in enc (and enc itself); NULL is a no-op. */
void eng_encoder_free(eng_encoder *enc, int32_t n_layer);

#endif /* KVSERVE_ENGINE_ENCODER_H */
