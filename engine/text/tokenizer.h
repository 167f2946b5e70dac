/*
 * tokenizer.h: vocabularies and tokenizers (internal to the engine; prefixes eng_vocab_, eng_tok_).
 *
 * An eng_vocab is built from a GGUF file's tokenizer.* metadata and is self-contained afterwards (it copies the
 * token texts and merges it needs, so the eng_gguf may be closed). Two tokenizer families:
 *   - SPM   (tokenizer.ggml.model "llama"): SentencePiece-style bigram merging by token score, spaces escaped to
 *           U+2581, an added leading space (tokenizer.ggml.add_space_prefix, default true), byte fallback to
 *           <0xXX> tokens, else the unknown token.
 *   - BPE   (tokenizer.ggml.model "gpt2"): byte-level BPE; the text is split by the pre-tokenizer regexes that
 *           tokenizer.ggml.pre selects (PCRE2, compiled once per vocab), each piece is mapped byte-to-unicode
 *           (GPT-2's table) and merged by tokenizer.ggml.merges rank (earlier merge first).
 * Both follow llama.cpp's behaviour (special-token partitioning, BOS/EOS defaults, end-of-generation set), which
 * the conformance tests check against llama.cpp's own tokenizer test files.
 *
 * Thread-safety: a loaded vocab is read-only; every function taking a const eng_vocab may be called from any
 * number of threads at once (scratch memory is per call).
 *
 * Errors are the ENG_ERR_* codes of engine.h.
 */
#ifndef KVSERVE_ENGINE_TOKENIZER_H
#define KVSERVE_ENGINE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "engine/engine.h"
#include "engine/format/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

/* WPM: BERT's WordPiece as llama.cpp runs it (tokenizer.ggml.model "bert"; tok_wpm.c) */
/* UGM: SentencePiece unigram as llama.cpp runs "t5" vocabularies (T5, XLM-RoBERTa; tok_ugm.c) */
typedef enum { ENG_VOCAB_SPM = 1, ENG_VOCAB_BPE = 2, ENG_VOCAB_WPM = 3, ENG_VOCAB_UGM = 4 } eng_vocab_type;

/* GGUF token types (tokenizer.ggml.token_type). Tokens without a type array are NORMAL. */
enum {
    ENG_TOKTYPE_UNDEFINED = 0,
    ENG_TOKTYPE_NORMAL = 1,
    ENG_TOKTYPE_UNKNOWN = 2,
    ENG_TOKTYPE_CONTROL = 3,
    ENG_TOKTYPE_USER_DEFINED = 4,
    ENG_TOKTYPE_UNUSED = 5,
    ENG_TOKTYPE_BYTE = 6,
};

/* Pre-tokenizers (tokenizer.ggml.pre) of BPE vocabularies. */
typedef enum {
    ENG_PRE_DEFAULT = 0,   /* "default" or absent */
    ENG_PRE_GPT2 = 1,      /* "gpt-2", "phi-2", ... */
    ENG_PRE_LLAMA3 = 2,    /* "llama3", "llama-v3", "llama-bpe", "falcon3" */
    ENG_PRE_QWEN2 = 3,     /* "qwen2", "deepseek-r1-qwen", "stablelm2", "megrez" */
    ENG_PRE_SMOLLM = 4,    /* "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone" */
    ENG_PRE_GPT4O = 5,     /* "gpt-4o" (gpt-oss's o200k), "llama4" */
} eng_pre_type;

typedef struct eng_vocab eng_vocab;

/* Builds a vocabulary from g's tokenizer.* keys. Needs tokenizer.ggml.model ("llama" or "gpt2") and
 * tokenizer.ggml.tokens; scores and token_type are optional (0 and NORMAL), merges are required for "gpt2".
 * Special-token ids (tokenizer.ggml.{bos,eos,unknown,eot,eom}_token_id) that are out of range are ignored (the
 * default stays, as in llama.cpp); -1 / 0xFFFFFFFF means none.
 * Errors: ENG_ERR_FORMAT (missing/ill-typed keys, array lengths that disagree, a malformed merge),
 * ENG_ERR_UNSUPPORTED (another tokenizer model, an unknown pre-tokenizer, a regex PCRE2 rejects),
 * ENG_ERR_NOMEM, ENG_ERR_INVALID (NULL arguments). err gets "NAME: what is wrong". *out is freed with
 * eng_vocab_free. */
int eng_vocab_load(const eng_gguf *g, eng_vocab **out, char *err, size_t err_len);
void eng_vocab_free(eng_vocab *v);   /* NULL: no-op */

eng_vocab_type eng_vocab_get_type(const eng_vocab *v);
eng_pre_type eng_vocab_pre(const eng_vocab *v);        /* ENG_PRE_DEFAULT for SPM */
int32_t eng_vocab_n_tokens(const eng_vocab *v);
int32_t eng_vocab_bos(const eng_vocab *v);             /* -1 when none */
int32_t eng_vocab_eos(const eng_vocab *v);             /* -1 when none */
int32_t eng_vocab_eot(const eng_vocab *v);             /* -1 when none */
int32_t eng_vocab_unk(const eng_vocab *v);             /* -1 when none */
bool eng_vocab_add_bos(const eng_vocab *v);            /* whether add_special adds BOS */
bool eng_vocab_add_eos(const eng_vocab *v);
/* WPM: the separator token ([SEP], tokenizer.ggml.seperator_token_id, -1 when none) and whether tokenizing with
 * add_special appends it (tokenizer.ggml.add_sep_token, default true for WPM, false otherwise). */
int32_t eng_vocab_sep(const eng_vocab *v);
bool eng_vocab_add_sep(const eng_vocab *v);
bool eng_vocab_add_space_prefix(const eng_vocab *v);   /* SPM only; false for BPE */

/* Token type (ENG_TOKTYPE_*; the load may promote end-of-turn tokens to CONTROL as llama.cpp does), or -1
 * for an id out of range. */
int eng_vocab_token_type(const eng_vocab *v, int32_t id);
/* The token's stored text (not NUL-terminated; *len receives its length), NULL for an id out of range. */
const char *eng_vocab_token_text(const eng_vocab *v, int32_t id, size_t *len);
float eng_vocab_token_score(const eng_vocab *v, int32_t id);   /* 0 when out of range */
/* The id of the token whose text is exactly text[0..len) (the last one when the vocabulary repeats a text),
 * or -1. */
int32_t eng_vocab_find(const eng_vocab *v, const char *text, size_t len);

bool eng_vocab_is_eog(const eng_vocab *v, int32_t id);      /* EOS, EOT, EOM, <|im_end|>, <|eot_id|>, ... */
bool eng_vocab_is_control(const eng_vocab *v, int32_t id);  /* type CONTROL */
bool eng_vocab_is_special(const eng_vocab *v, int32_t id);  /* type CONTROL or USER_DEFINED */

/* Longest text eng_vocab_tokenize accepts (bytes). */
#define ENG_TOK_MAX_TEXT ((size_t)1 << 30)

/* Tokenizes text[0..len) (any bytes; invalid UTF-8 becomes byte tokens). add_special: BOS/EOS per the vocab.
 * parse_special: the text of control and unknown tokens is matched as those tokens (user-defined tokens are
 * always matched, as llama.cpp does). Writes up to cap ids to out (out may be NULL when cap is 0) and the full
 * count to *n_out. Errors: ENG_ERR_TOO_LARGE when cap < *n_out (out holds the first cap ids), ENG_ERR_NOMEM,
 * ENG_ERR_INVALID (NULL vocab/n_out, text NULL with len > 0, cap < 0, len > ENG_TOK_MAX_TEXT). */
int eng_vocab_tokenize(const eng_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                       int32_t *out, int32_t cap, int32_t *n_out);

/* The bytes token id stands for, as in llama.cpp's token_to_piece: SPM normal tokens with U+2581 read as a
 * space, byte tokens as their byte; BPE normal tokens byte-level decoded. Control and unknown tokens give their
 * text only when render_special (else nothing); user-defined tokens always give their text; unused/undefined
 * tokens give nothing. Writes up to cap bytes (no NUL) and the full length to *n_out.
 * Errors: ENG_ERR_INVALID (bad id, NULL n_out), ENG_ERR_TOO_LARGE (cap too small; *n_out is the size needed). */
int eng_vocab_token_to_piece(const eng_vocab *v, int32_t id, bool render_special, char *buf, size_t cap,
                             size_t *n_out);

/* Streaming detokenizer step over a vocab (eng_detok_push is this over the model's vocab): appends the text
 * token adds, minus a trailing incomplete UTF-8 sequence that is held back in d until later bytes complete it.
 * Bytes that can never form a valid sequence are emitted as U+FFFD, so the output is always valid UTF-8.
 * On ENG_ERR_TOO_LARGE (*n_out is the size needed) d is unchanged. */
int eng_vocab_detok_push(const eng_vocab *v, eng_detok *d, int32_t id, bool render_special, char *buf,
                         size_t cap, size_t *n_out);

#ifdef __cplusplus
}
#endif
#endif /* KVSERVE_ENGINE_TOKENIZER_H */
