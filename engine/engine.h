/*
 * engine.h: kvserve's inference engine (prefix eng_): GGUF models, tokenizers, chat templates, sampling and a
 * multi-sequence forward pass over the paged KV cache (cache/kv_cache.h).
 *
 * What it is, by folder: format/ (GGUF reading and writing, model loading: gguf*.c, model.c), text/ (the
 * tokenizer: tok_load, tok_spm, tok_bpe, tok_detok, tokenizer.c; chat templates: chat*.c), kernels/ (quantized
 * formats and dots: quant*.c; attention and norms: ops.c; sampler kernels), runtime/ (the forward pass:
 * forward.c, its GPU path forward_cuda.c, batches, the thread pool, samplers, the KV pool of a context:
 * kv_pool.c). This header is the module's public one (engine/gpu_backend.h is the interface a GPU backend
 * implements); the others are internal to engine/ (tools and tests may include them).
 * Owns: the mapped model, each context's threads, scratch and KV cache (created through cache/), samplers.
 * Must never: parse HTTP or JSON requests, queue or schedule requests (server/ does), keep global state (CPU
 * features are detected per context, common's kvs_cpu_detect), or include a cuda/ header: a GPU backend
 * implements engine/gpu_backend.h.
 *
 * Objects:
 *   eng_model    weights (mmapped GGUF), hyper-parameters, vocabulary, chat template. Read-only once loaded:
 *                any thread may call the const functions on it concurrently (tokenize, pieces, chat render).
 *   eng_ctx      the compute state: worker threads, scratch buffers and the KV cache the context creates
 *                (kvc_cache, reachable with eng_ctx_cache). Single-owner: one thread at a time (in the server,
 *                the scheduler thread).
 *   eng_sampler  per-sequence sampling state (penalty history, RNG). Single-owner.
 *
 * Errors: functions return 0 (ENG_OK) or a negative ENG_ERR_* code and write results through pointers. The
 * ENG_* names are aliases of common/common.h's kvs_err values (one enum, one kvs_strerror for every module).
 * Functions that can fail for reasons a user must read (loading a file) also take an `err` buffer that
 * receives a message naming the file and what is wrong.
 */
#ifndef KVSERVE_ENGINE_H
#define KVSERVE_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "cache/kv_cache.h"
#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    ENG_OK = KVS_OK,
    ENG_ERR_INVALID = KVS_ERR_INVALID,         /* an argument is out of range */
    ENG_ERR_NOMEM = KVS_ERR_NOMEM,             /* an allocation failed */
    ENG_ERR_IO = KVS_ERR_IO,                   /* a file could not be opened, read or written */
    ENG_ERR_FORMAT = KVS_ERR_FORMAT,           /* a file is truncated, corrupt or not what it claims (see err) */
    ENG_ERR_UNSUPPORTED = KVS_ERR_UNSUPPORTED, /* a valid file this engine cannot run (architecture, tensor type) */
    ENG_ERR_NOT_FOUND = KVS_ERR_NOT_FOUND,     /* a key, tensor or token does not exist */
    ENG_ERR_TYPE = KVS_ERR_TYPE,               /* a metadata value has another type than requested */
    ENG_ERR_TOO_LARGE = KVS_ERR_TOO_LARGE,     /* an output buffer is too small (the needed size is still reported) */
    ENG_ERR_KV_FULL = KVS_ERR_KV_FULL,         /* the KV pool cannot hold the batch (nothing was changed) */
    ENG_ERR_KV = KVS_ERR_KV,                   /* another KV cache error (the batch is invalid for the cache) */
    ENG_ERR_DEVICE = KVS_ERR_DEVICE,           /* a GPU call failed (see the log) */
};

/* ---- models --------------------------------------------------------------------------------------------- */
typedef enum { ENG_ARCH_LLAMA = 0, ENG_ARCH_QWEN2 = 1, ENG_ARCH_QWEN3 = 2, ENG_ARCH_GEMMA3 = 3, ENG_ARCH_PHI3 = 4,
               ENG_ARCH_QWEN3MOE = 5, ENG_ARCH_GPT_OSS = 6,
               /* encoders (bidirectional attention, embeddings and rerank only: engine/model/encoder.h) */
               ENG_ARCH_BERT = 32, ENG_ARCH_NOMIC_BERT = 33, ENG_ARCH_JINA_BERT_V2 = 34 } eng_arch;

/* The most experts an MoE layer may have (llama.cpp's limit is the same order). */
#define ENG_MAX_EXPERTS 512

/* The feed-forward activation: act(gate) * up. */
typedef enum {
    ENG_ACT_SILU = 0,
    ENG_ACT_GELU_TANH = 1,
    ENG_ACT_SWIGLU_OAI = 2, /* gpt-oss: x sigmoid(alpha x) (clamp(u, -limit, limit) + 1), x = min(g, limit) */
} eng_ffn_act;

/* How an MoE router's logits (+ its bias) become the selected experts and their weights (llama.cpp's gating):
 * SOFTMAX (qwen3moe): softmax over all experts, the n_expert_used highest, their probabilities divided by their
 * sum; SOFTMAX_WEIGHT (gpt-oss): the n_expert_used highest logits, their weights the softmax over those only. */
typedef enum { ENG_MOE_SOFTMAX = 0, ENG_MOE_SOFTMAX_WEIGHT = 1 } eng_moe_gating;

typedef struct eng_hparams {
    eng_arch arch;
    char arch_name[32];     /* general.architecture */
    char name[128];         /* general.name, or the file name */
    int32_t n_vocab;
    int32_t n_ctx_train;    /* <arch>.context_length */
    int32_t n_embd;         /* <arch>.embedding_length */
    int32_t n_layer;        /* <arch>.block_count */
    int32_t n_head;         /* <arch>.attention.head_count */
    int32_t n_head_kv;      /* <arch>.attention.head_count_kv (default n_head) */
    int32_t head_dim;       /* <arch>.attention.key_length (default n_embd / n_head) */
    int32_t n_ff;           /* <arch>.feed_forward_length */
    int32_t n_rot;          /* <arch>.rope.dimension_count (default head_dim) */
    float rope_freq_base;   /* <arch>.rope.freq_base (default 10000) */
    float rope_freq_scale;  /* 1 / <arch>.rope.scaling.factor, else 1 / <arch>.rope.scale_linear (default 1); 1 when
                               rope.scaling.type is "none" */
    float rms_eps;          /* <arch>.attention.layer_norm_rms_epsilon (default 1e-5) */
    bool tied_embeddings;   /* no output.weight: the output projection reuses token_embd.weight */
    int32_t pooling_type;   /* <arch>.pooling_type as llama.cpp numbers it (0 none, 1 mean, 2 cls, 3 last,
                               4 rank); -1 when absent */
    bool neox_rope;         /* rope on halves (qwen2/qwen3/gemma3/phi3) instead of consecutive pairs (llama) */
    /* family details (model_families.c) */
    int32_t n_swa;          /* <arch>.attention.sliding_window: sliding layers see the last n_swa positions (their
                               own included); 0 = no sliding layers */
    float rope_freq_base_swa; /* <arch>.rope.freq_base_swa: rope base of the sliding layers (default rope_freq_base) */
    int32_t n_ctx_orig;     /* <arch>.rope.scaling.original_context_length (default n_ctx_train): contexts longer
                               use rope_factors_long, others rope_factors_short (phi3) */
    float rope_attn_factor; /* <arch>.rope.scaling.attn_factor (default 1): LongRoPE's attention factor; the
                               rotation's cos and sin are multiplied by it (Q and K of the rotated dimensions, so
                               their scores by its square), whichever factor set applies, as llama.cpp does */
    float rope_yarn_ext;    /* YaRN's extrapolation mix: 1 when <arch>.rope.scaling.type is "yarn", else 0. With it,
                               dimension pair i turns by pos * theta_i * (s (1 - r_i) + r_i), s = rope_freq_scale,
                               r_i = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1), lo and hi the correction
                               dimensions of rope_yarn_beta_fast / _slow for n_ctx_orig, and cos and sin are
                               scaled by rope_attn_factor * (1 + 0.1 ln(1 / s)), as llama.cpp computes them */
    float rope_yarn_beta_fast, rope_yarn_beta_slow; /* 32 and 1 (llama.cpp's defaults, which it keeps for the
                               families kvserve loads) */
    float attn_scale;       /* scale of q.k before the softmax (1/sqrt(head_dim) unless the family says otherwise) */
    float embd_scale;       /* the token embeddings are multiplied by it (gemma3: sqrt(n_embd); else 1) */
    float logit_softcap;    /* <arch>.final_logit_softcapping: logits = c * tanh(logits / c); 0 = none */
    eng_ffn_act ffn_act;    /* silu, or GELU (tanh approximation) for gemma3, or gpt-oss's clamped SwiGLU */
    float swiglu_alpha, swiglu_limit; /* ENG_ACT_SWIGLU_OAI's constants (1.702 and 7, as llama.cpp uses them) */
    bool swa_all;           /* n_swa > 0 and every layer slides: the KV cache keeps only the window's blocks */
    /* Mixture-of-Experts (qwen3moe; all 0 for a dense model): every layer's feed-forward is n_expert experts of
     * which each token uses the n_expert_used its router ranks highest */
    int32_t n_expert;       /* <arch>.expert_count */
    int32_t n_expert_used;  /* <arch>.expert_used_count (1 .. n_expert) */
    int32_t n_ff_exp;       /* <arch>.expert_feed_forward_length (default n_ff / n_expert_used) */
    float expert_weights_scale; /* <arch>.expert_weights_scale: the routing weights are multiplied by it (0 or 1:
                                   not scaled; gpt-oss: not read, 0, as llama.cpp) */
    eng_moe_gating moe_gating; /* how the router's logits become the experts' weights */
} eng_hparams;

typedef struct eng_load_params {
    bool use_mmap;          /* default true */
    bool vocab_only;        /* load only metadata and the tokenizer (no tensors needed) */
} eng_load_params;

void eng_load_params_default(eng_load_params *p);

typedef struct eng_model eng_model;

/* Loads a GGUF model. On failure returns a negative code and writes a message naming the file and the
 * problem ("unsupported architecture X", "tensor T: data past end of file", ...) into err. The caller frees
 * *out with eng_model_free. */
int eng_model_load(const char *path, const eng_load_params *params, eng_model **out, char *err, size_t err_len);
void eng_model_free(eng_model *model);
const eng_hparams *eng_model_hparams(const eng_model *model);
/* Total bytes of weight data (for bandwidth figures). */
size_t eng_model_weight_bytes(const eng_model *model);
/* Bytes of matrix data a CPU decode step of one sequence reads: every layer matrix and the output matrix, packed
 * size for the matrices a CPU context repacked (the layout its kernels stream), else their GGUF size; the
 * embedding row, norms and the KV cache are not counted. Divided into a read bandwidth it bounds the speed of
 * single-sequence decoding. 0 for NULL or a vocab_only model. */
size_t eng_model_decode_bytes(const eng_model *model);
/* tokenizer.chat_template, or NULL when the model has none. Owned by the model. */
const char *eng_model_chat_template(const eng_model *model);

/* ---- tokens ------------------------------------------------------------------------------------------------ */
int32_t eng_token_bos(const eng_model *model);   /* -1 when none */
int32_t eng_token_eos(const eng_model *model);   /* -1 when none */
/* The fill-in-the-middle tokens the metadata names (tokenizer.ggml.fim_pre_token_id, fim_suf_token_id,
 * fim_mid_token_id): writes them to pre/suf/mid and returns 0, or ENG_ERR_NOT_FOUND when any is absent or not
 * a token of the vocabulary (the outputs are then -1). */
int eng_token_fim(const eng_model *model, int32_t *pre, int32_t *suf, int32_t *mid);
/* Whether a token ends generation (EOS, EOT, <|im_end|>, <|eot_id|>, ... as the vocabulary marks them). */
bool eng_token_is_eog(const eng_model *model, int32_t token);
/* Whether the token is a control / user-defined special token (its text is not shown by default). */
bool eng_token_is_special(const eng_model *model, int32_t token);

/* Tokenizes text[0..len). add_special: add BOS/EOS as the model's metadata says. parse_special: text of
 * control and user-defined tokens (e.g. "<|im_start|>") becomes those tokens. Writes up to cap ids to out
 * and the full count to *n_out; ENG_ERR_TOO_LARGE when cap < *n_out (call again with a bigger buffer). */
int eng_tokenize(const eng_model *model, const char *text, size_t len, bool add_special, bool parse_special,
                 int32_t *out, int32_t cap, int32_t *n_out);

/* The bytes a token stands for (SPM: '\u2581' read as a space, byte tokens as their byte; BPE: byte-level
 * decoding). Special tokens give their text only when render_special. Writes up to cap bytes (no NUL) and the
 * full length to *n_out; ENG_ERR_TOO_LARGE when cap is too small; ENG_ERR_INVALID for a bad id. */
int eng_token_to_piece(const eng_model *model, int32_t token, bool render_special, char *buf, size_t cap,
                       size_t *n_out);

/* Whether two models share one vocabulary (a draft model and its target): the same number of tokens and every
 * token the same text (eng_token_to_piece with render_special, so special tokens' texts count). 0 when they do;
 * ENG_ERR_INVALID when not, with *first_diff the first id whose text differs (the smaller size when the counts
 * differ); ENG_ERR_NOMEM. */
int eng_vocab_compare(const eng_model *a, const eng_model *b, int32_t *first_diff);

/* Streaming detokenizer: holds back a piece's trailing incomplete UTF-8 sequence until the next token
 * completes it, so streamed text is always valid UTF-8. Zero-initialise (or eng_detok_reset) per stream. */
typedef struct eng_detok {
    uint8_t pending[8];
    uint8_t n_pending;
} eng_detok;
void eng_detok_reset(eng_detok *d);
/* Appends the complete text that token adds to buf (up to cap bytes) and its length to *n_out. */
int eng_detok_push(const eng_model *model, eng_detok *d, int32_t token, bool render_special, char *buf,
                   size_t cap, size_t *n_out);
/* Emits what is held back at the end of a stream (invalid bytes as U+FFFD). */
int eng_detok_flush(eng_detok *d, char *buf, size_t cap, size_t *n_out);

/* ---- chat templates ------------------------------------------------------------------------------------------ */
typedef enum {
    ENG_CHAT_AUTO = 0, ENG_CHAT_CHATML, ENG_CHAT_LLAMA3, ENG_CHAT_LLAMA2, ENG_CHAT_MISTRAL, ENG_CHAT_PHI3,
    ENG_CHAT_ZEPHYR, ENG_CHAT_GEMMA,
} eng_chat_family;

typedef struct eng_chat_msg {
    const char *role;    /* "system", "user", "assistant" (others passed through where the family allows) */
    const char *content; /* NUL-terminated UTF-8 */
} eng_chat_msg;

/* The family a template text is recognized as (ENG_CHAT_AUTO when unknown or NULL). */
eng_chat_family eng_chat_detect(const char *template_text);
/* Parses a family name ("chatml", "llama3", "llama2", "mistral", "phi3", "zephyr", "gemma"); AUTO if unknown. */
eng_chat_family eng_chat_family_from_name(const char *name);
const char *eng_chat_family_name(eng_chat_family f);

/* Renders messages as the model's template would (family AUTO: detect from the model's template; unknown
 * templates fall back to ChatML and *used_fallback is set). add_generation_prompt appends the assistant
 * header. The text excludes BOS (tokenize with add_special to add it). *out is malloc'd; the caller frees it.
 * Errors: ENG_ERR_INVALID (no messages, NULL role/content), ENG_ERR_NOMEM. */
int eng_chat_render(const eng_model *model, const eng_chat_msg *msgs, size_t n_msgs, bool add_generation_prompt,
                    eng_chat_family family, char **out, bool *used_fallback);

/* ---- sampling ------------------------------------------------------------------------------------------------- */
typedef struct eng_logit_bias { int32_t token; float bias; } eng_logit_bias;

typedef struct eng_sampling_params {
    float temperature;        /* <= 0: greedy (argmax) */
    int32_t top_k;            /* <= 0: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    float repetition_penalty; /* 1: off (divides positive logits, multiplies negative, of seen tokens) */
    int32_t penalty_last_n;   /* window of the history the penalties see; -1: all */
    float presence_penalty;   /* 0: off (OpenAI meaning, over generated tokens) */
    float frequency_penalty;  /* 0: off */
    uint64_t seed;            /* RNG seed: same seed and inputs, same output */
    const eng_logit_bias *logit_bias; size_t n_logit_bias; /* copied by eng_sampler_create */
    int32_t n_top_logprobs;   /* top-N log-probabilities to report per step, 0..KVS_MAX_TOP_LOGPROBS (20) */
} eng_sampling_params;

void eng_sampling_params_default(eng_sampling_params *p); /* greedy-free defaults: temp 1, everything off */

typedef struct eng_sample {
    int32_t token;
    float logprob;            /* log-softmax of the raw logits (before any sampling transform) at token */
    int32_t n_top;
    int32_t top_token[KVS_MAX_TOP_LOGPROBS]; /* the n_top best by raw logit, best first */
    float top_logprob[KVS_MAX_TOP_LOGPROBS];
} eng_sample;

typedef struct eng_sampler eng_sampler;
int eng_sampler_create(const eng_sampling_params *params, int32_t n_vocab, eng_sampler **out);
void eng_sampler_free(eng_sampler *s);
/* Adds a token to the penalty history (the sampler adds its own choices; call it for prompt tokens only
 * when penalties should see them). */
void eng_sampler_accept(eng_sampler *s, int32_t token);
/* Chooses a token from logits[0..n_vocab) (the array may be modified) and fills *out. */
int eng_sampler_sample(eng_sampler *s, float *logits, eng_sample *out);

/* ---- contexts and the forward pass -------------------------------------------------------------------------- */
typedef enum { ENG_DEVICE_AUTO = 0, ENG_DEVICE_CPU = 1, ENG_DEVICE_CUDA = 2 } eng_device;

typedef struct eng_ctx_params {
    int32_t n_threads;        /* worker threads; <= 0: the number of cores */
    int32_t n_ctx;            /* longest sequence; <= 0: the model's training context */
    int32_t max_seqs;         /* sequence ids (cache slots) */
    int32_t max_batch_tokens; /* largest batch eng_decode accepts */
    int32_t kv_block_size;    /* tokens per KV block (default 16) */
    int32_t kv_blocks;        /* pool size in blocks; 0: from kv_mem_bytes */
    size_t kv_mem_bytes;      /* pool budget when kv_blocks == 0; 0: enough for max_seqs * n_ctx tokens,
                                 capped at 1 GiB. On CUDA: 0 means the device memory left under
                                 gpu_memory_fraction after the weights, capped at 4 * max_seqs * n_ctx tokens;
                                 kv_blocks / kv_mem_bytes above that budget fail with ENG_ERR_NOMEM */
    kvc_dtype kv_dtype;       /* default F16 (CUDA: F16 or F32; Q8_0 is ENG_ERR_UNSUPPORTED there) */
    bool prefix_caching;      /* default true */
    eng_device device;        /* default AUTO: CUDA when a device is present and the model's tensor types have
                                 kernels and its weights fit, else CPU. CUDA without a device: eng_ctx_create fails with
                                 ENG_ERR_DEVICE ("no CUDA device found"), or ENG_ERR_UNSUPPORTED in a build
                                 without CUDA ("built without CUDA") */
    float gpu_memory_fraction;/* CUDA: share of device memory for weights + KV (default 0.9) */
    bool swa_full;            /* a model mixing sliding-window and global layers (gemma3): false (default), the
                                 sliding layers' KV lives in a small pool bounded by the window (kv_cache.h's
                                 sliding group; kv_blocks / kv_mem_bytes size the global layers' pool); true,
                                 every layer keeps every position in one pool (llama.cpp's --swa-full). Same
                                 logits either way. */
} eng_ctx_params;

/* Defaults: n_threads 0 (the cores this process may run on), n_ctx 0 (the training context), max_seqs 1,
 * max_batch_tokens 512, kv_block_size 16, kv_blocks 0 and kv_mem_bytes 0 (max_seqs * n_ctx tokens, at most
 * 1 GiB), kv_dtype F16, prefix_caching true, device AUTO, gpu_memory_fraction 0.9, swa_full false. */
void eng_ctx_params_default(eng_ctx_params *p);

typedef struct eng_ctx eng_ctx;

/* A CPU context uses the best kernel level the CPU has; the environment variable KVSERVE_SIMD_MAX=avx2 (or
 * scalar) caps it, to check on a newer CPU how the engine runs on an older one (see eng_simd_detect). */
int eng_ctx_create(eng_model *model, const eng_ctx_params *params, eng_ctx **out, char *err, size_t err_len);
void eng_ctx_free(eng_ctx *ctx);
/* The context's KV cache (owned by the context): allocate sequence ids, attach prefixes, read stats. */
kvc_cache *eng_ctx_cache(eng_ctx *ctx);
eng_device eng_ctx_device(const eng_ctx *ctx);
int32_t eng_ctx_n_threads(const eng_ctx *ctx);

/* A ragged batch: entry i is token[i] at position pos[i] of sequence seq[i]. Entries of one sequence must be
 * consecutive positions continuing it, in order; sequences may be mixed freely. want_logits[i] asks for the
 * logits of entry i. The arrays are the caller's. */
typedef struct eng_batch {
    int32_t n;
    const int32_t *token;
    const int32_t *pos;
    const int32_t *seq;
    const bool *want_logits;
    const bool *want_embd;   /* NULL, or [n]: entry i asks for its hidden state (eng_get_embeddings) */
} eng_batch;

/* Runs the batch: reserves cache slots (kvc_start_forward), writes K/V, attends through the block tables,
 * commits the cache (kvc_finish_forward) and computes logits for the rows that want them. On error the
 * cache is unchanged. Errors: ENG_ERR_INVALID (bad tokens/sizes), ENG_ERR_KV_FULL, ENG_ERR_KV, ENG_ERR_NOMEM,
 * ENG_ERR_DEVICE. */
int eng_decode(eng_ctx *ctx, const eng_batch *batch);

/* Logits [n_vocab] of batch entry i of the last eng_decode (i must have wanted logits), or NULL. Owned by the
 * context, valid until the next eng_decode. */
float *eng_get_logits(eng_ctx *ctx, int32_t i);

/* The last layer's hidden state of batch entry i of the last eng_decode, after the model's final norm
 * (output_norm: the vector the output projection reads), [n_embd] floats, for entries whose want_embd was
 * set; NULL otherwise (no want_embd, a failed decode, i out of range). Owned by the context, valid until the
 * next eng_decode. A row's vector does not depend on the batch it ran in. CPU contexts only: on a CUDA
 * context a batch with want_embd fails with ENG_ERR_UNSUPPORTED (nothing changed). */
float *eng_get_embeddings(eng_ctx *ctx, int32_t i);

/* ---- encoders (bert, nomic-bert) ------------------------------------------------------------------------------
 * An encoder model's context runs on the CPU (ENG_DEVICE_CUDA fails with ENG_ERR_UNSUPPORTED; AUTO picks the CPU).
 * Its eng_decode takes only whole sequences (each sequence's rows at positions 0 .. n-1, in order, in one batch:
 * attention is bidirectional), wants no logits, and its eng_get_embeddings are the last layer's hidden states
 * (BERT's last LayerNorm included; there is no output_norm). Nothing of a sequence is needed after its batch. */
bool eng_model_is_encoder(const eng_model *m);
/* The outputs of the model's classification head (cls / cls.output tensors: a reranker's score is output 0), or
 * 0 when it has none (NULL model included). */
int32_t eng_model_n_cls_out(const eng_model *m);
/* The classification head's eng_model_n_cls_out values for batch entry i of the last eng_decode, which must have
 * been the row the head reads (eng_model_rank_last: an encoder's first row, position 0; a decoder reranker's last
 * row of the sequence) with want_embd set; NULL otherwise, when the model has no head, or (a decoder) when memory
 * runs out. A decoder reranker's values are a softmax (a Qwen3 reranker: p(yes), p(no)). Owned by the context,
 * valid until the next eng_decode or the next call for the same i. */
float *eng_get_rank(eng_ctx *ctx, int32_t i);
/* ---- decoder rerankers (Qwen3-Reranker: engine/model/rank_head.h) ----------------------------------------------
 * A qwen3 model with a cls.output tensor reranks: eng_model_n_cls_out is its outputs (2: yes, no), its head reads the
 * hidden state of a sequence's LAST row (causal attention: the row that has seen the whole pair), the score is
 * output 0. CPU contexts only (hidden states are). */
/* Whether the head reads a sequence's last row (a decoder reranker) rather than its first (an encoder). */
bool eng_model_rank_last(const eng_model *m);
/* The model's rerank prompt (GGUF key tokenizer.chat_template.rerank: text with the placeholders {query} and
 * {document}), or NULL. Owned by the model. */
const char *eng_model_rerank_prompt(const eng_model *m);
/* The special tokens of a rerank pair prompt, [bos] query [eos] [sep] document [eos] as llama.cpp's server builds
 * it: each the vocabulary's token when it adds that token (add_bos / add_eos / add_sep; EOS falls back to SEP), else
 * -1. A BERT vocabulary gives [CLS] query [SEP] document. */
void eng_rerank_tokens(const eng_model *m, int32_t *bos, int32_t *eos, int32_t *sep);

/* Removes positions [begin, end) of seq (end INT32_MAX: to the end). From the middle, later positions move
 * down and their keys are re-rotated (context shift). ENG_ERR_UNSUPPORTED when the cache cannot (the
 * sequence shares blocks): remove the whole sequence instead. */
int eng_seq_remove(eng_ctx *ctx, int32_t seq, int32_t begin, int32_t end);

#ifdef __cplusplus
}
#endif
#endif /* KVSERVE_ENGINE_H */
