/*
 * mkmodel.h: what `kvserve mkmodel`'s files share (internal to tools/): the options, the tensor generator of
 * cmd_mkmodel.c, the encoders of mkmodel_encoder.c (bert, nomic-bert, jina-bert-v2, with a built-in WordPiece
 * vocabulary), gpt-oss's parts (mkmodel_oss.c) and the decoder reranker's parts of mkmodel_rerank.c (qwen3 --rerank).
 * Functions return 0 or a kvs_err code after printing a message to stderr.
 */
#ifndef KVSERVE_TOOLS_MKMODEL_H
#define KVSERVE_TOOLS_MKMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/format/gguf.h"

/* ---- options ------------------------------------------------------------------------------------------------ */
typedef struct mk_opts {
    const char *out;
    const char *preset;
    const char *vocab_from;
    char arch[16];          /* "llama", "qwen2", "qwen3", "qwen3moe", "gpt-oss", "phi3", "bert" or "nomic-bert" */
    int64_t n_embd;
    int64_t n_layer;
    int64_t n_head;
    int64_t n_head_kv;
    int64_t n_ff;
    int64_t n_ctx;
    int64_t head_dim;       /* 0: n_embd / n_head */
    int64_t n_expert;       /* qwen3moe, gpt-oss: experts per layer, used per token, their feed-forward length */
    int64_t n_expert_used;
    int64_t n_ff_exp;
    int64_t n_swa;          /* gpt-oss: attention.sliding_window (0: 128) */
    double rope_base;
    double rms_eps;         /* < 0: the arch default (1e-5 llama, 1e-6 qwen2) */
    uint32_t wtype;         /* matrices: ENG_Q_F32, ENG_Q_F16 or ENG_Q_Q8_0 */
    bool tied;
    bool fim;               /* built-in vocabulary: add <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|> and their
                               tokenizer.ggml.fim_{pre,suf,mid}_token_id keys */
    bool rope_factors;      /* phi3: rope_factors_long/short.weight (LongRoPE, as Phi-3 128k / Phi-3.5 have) */
    int64_t orig_ctx;       /* > 0: <arch>.rope.scaling.original_context_length */
    double rope_attn;       /* > 0: <arch>.rope.scaling.attn_factor; 0: LongRoPE's default (see parse_args) */
    char rope_scaling[8];   /* "": no <arch>.rope.scaling.type key; else "none", "linear" or "yarn" */
    double rope_scale;      /* > 0: <arch>.rope.scaling.factor */
    bool out_bias;          /* llama: Q/K/V biases and attn_output.bias */
    uint64_t seed;
    double std;             /* matrices and biases */
    double router_std;      /* qwen3moe's routers (ffn_gate_inp); < 0: std */
    double embd_std;        /* token_embd and output */
    bool dry_run;           /* print the header instead of writing */
    bool rerank;            /* encoders: a classification head and pooling type rank; qwen3: a Qwen3-Reranker */
    int32_t rank_tok[2];    /* qwen3 --rerank: the ids of "yes" and "no" (set from the vocabulary) */
    int pooling;            /* encoders: 0 default (mean), else llama.cpp's pooling_type (1 mean, 2 cls, 3 last) */
    bool ugm;               /* encoders: a unigram ("t5", XLM-RoBERTa-style) vocabulary instead of WordPiece */
} mk_opts;

/* Tensor kinds: matrices and embeddings in the chosen type (std --std / --embd-std), norms (1 + 0.02 N) and
 * biases (--std) in f32, and small embedding tables kept in f32 whatever the type (--embd-std: an encoder's
 * token_types, which ggml adds as they are and cannot add from a quantized type). */
enum { MK_MATRIX, MK_EMBED, MK_NORM, MK_BIAS, MK_EMBED_F32, MK_ROUTER }; /* MK_ROUTER: an MoE router, f32 */

/* One tensor of a block: blk.N.<suffix>, [ne0, ne1, ne2] (ne2 > 1: stacked experts) */
typedef struct mk_tdef { const char *suffix; int kind; int64_t ne0, ne1, ne2; } mk_tdef;

/* Where the tensors go: counted only (w NULL, f NULL), their infos into w, or their bytes generated into f. */
typedef struct mk_sink {
    eng_gguf_writer *w;
    FILE *f;
    uint32_t align;     /* f: each tensor's bytes are padded to a multiple of it */
} mk_sink;

/* One tensor [ne0, ne1, ne2] into the sink: *total gets its bytes, *count one more. */
int kvs_mk_tensor_one(const mk_sink *sk, const mk_opts *o, const char *name, int kind, int64_t ne0, int64_t ne1,
                      int64_t ne2, size_t *total, int *count);
/* The metadata every mkmodel model starts with, in this order: general.architecture, general.name (name),
 * general.file_type (and quantization_version for q8_0), then <arch>.vocab_size, context_length,
 * embedding_length, block_count, feed_forward_length and attention.head_count. */
int kvs_mk_common_metadata(eng_gguf_writer *w, const mk_opts *o, int64_t n_vocab, const char *name);
/* The built-in word list (static storage). */
const char *const *kvs_mk_words(size_t *n);

/* mkmodel_encoder.c */
bool kvs_mk_is_encoder(const mk_opts *o);
bool kvs_mk_set_pooling(void *field, const char *v); /* --pooling mean|cls|last into an int */
bool kvs_mk_set_vocab(void *field, const char *v);   /* --vocab wpm|ugm into a bool (ugm) */
/* The built-in WordPiece vocabulary ("bert": [PAD] [UNK] [CLS] [SEP] [MASK], characters, lowercase words), or with
 * o->ugm an XLM-RoBERTa-style unigram one ("t5", with a small precompiled charsmap). */
int kvs_mk_encoder_vocab(eng_gguf_writer *w, const mk_opts *o, int64_t *n_vocab);
int kvs_mk_encoder_metadata(eng_gguf_writer *w, const mk_opts *o, int64_t n_vocab);
int kvs_mk_encoder_tensors(const mk_sink *sk, const mk_opts *o, int64_t n_vocab, size_t *total, int *count);

/* mkmodel_oss.c (gpt-oss) */
bool kvs_mk_is_oss(const mk_opts *o);
/* The first special tokens of its built-in vocabulary (static storage): <unk>, BOS, EOS, then harmony's. */
const char *const *kvs_mk_oss_specials(size_t *n);
/* Its harmony chat template (static storage). */
const char *kvs_mk_oss_template(void);
/* gpt-oss.expert_count, expert_used_count, expert_feed_forward_length, attention.sliding_window into w. */
int kvs_mk_oss_metadata(eng_gguf_writer *w, const mk_opts *o);
/* Block l's tensors, in file order, into the sink (as kvs_mk_tensor_one). */
int kvs_mk_oss_layer(const mk_sink *sk, const mk_opts *o, int64_t l, size_t *total, int *count);

/* cmd_mkmodel.c: one tensor [ne0, n_rows] made of rows rows[0..n_rows) of the tensor `src` [ne0, *] the generator
 * makes (kind), bytes equal to those rows of it. */
int kvs_mk_tensor_rows(const mk_sink *sk, const mk_opts *o, const char *name, const char *src, int kind, int64_t ne0,
                       const int32_t *rows, int n_rows, size_t *total, int *count);

/* mkmodel_rerank.c: qwen3 --rerank (a Qwen3-Reranker-style decoder) */
bool kvs_mk_is_decoder_reranker(const mk_opts *o);
/* o->rank_tok from the tokenizer block tok ("yes", "no"); ENG_ERR_INVALID when the vocabulary lacks them. */
int kvs_mk_rerank_tokens(const eng_gguf *tok, mk_opts *o);
/* pooling_type 4, classifier.output_labels, tokenizer.chat_template.rerank and tokenizer.chat_templates. */
int kvs_mk_rerank_metadata(eng_gguf_writer *w, const mk_opts *o);

#endif /* KVSERVE_TOOLS_MKMODEL_H */
