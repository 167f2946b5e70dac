/*
 * rank_head.h: a decoder reranker's classification head (internal to the engine module; prefix eng_rank_head_).
 *
 * Facts from llama.cpp v0.5.0 (convert_hf_to_gguf's Qwen3 reranker, llama-graph's rank pooling, the server's
 * format_prompt_rerank): a Qwen3-Reranker GGUF is an ordinary qwen3 decoder with <arch>.pooling_type 4 (rank),
 * <arch>.classifier.output_labels ["yes", "no"], a tensor cls.output.weight [n_embd, 2] whose rows are the output
 * matrix's rows of the tokens "yes" and "no" (in that order), and the rerank prompt in the key
 * tokenizer.chat_template.rerank (a plain text with the placeholders {query} and {document}, tokenized with special
 * tokens parsed and none added). Rank pooling of a qwen3 model reads the hidden state of the sequence's LAST row
 * (after output_norm), multiplies it by cls.output (plus cls.output.bias if present) and takes the softmax of the
 * outputs; the score is output 0, p("yes") = 1 / (1 + exp(logit_no - logit_yes)), the score vLLM computes from the
 * yes / no logits of the last position.
 *
 * The head is loaded for qwen3 only (llama.cpp reads cls.output for no other decoder). Errors of the loader: 0,
 * ENG_ERR_FORMAT (a misshapen tensor or key, named in err), ENG_ERR_UNSUPPORTED (a type the engine cannot read),
 * ENG_ERR_NOMEM.
 */
#ifndef KVSERVE_ENGINE_RANK_HEAD_H
#define KVSERVE_ENGINE_RANK_HEAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model/model.h"

typedef struct eng_rank_head {
    eng_matrix out;     /* [n_embd -> n_out] cls.output.weight, inside the GGUF mapping */
    float *out_b;       /* [n_out] cls.output.bias dequantized, or NULL (owned) */
    int32_t n_out;      /* outputs of the head (2 for a Qwen3 reranker: yes, no) */
    bool softmax;       /* the outputs are a softmax (qwen3) rather than raw values */
    char *prompt;       /* tokenizer.chat_template.rerank, NUL-terminated (owned), or NULL */
} eng_rank_head;

/* Loads m's head when m is a qwen3 model with a cls.output.weight tensor (m->hp filled, the file open); sets m->rank
 * (left NULL when there is none). On failure m->rank is NULL. */
int eng_rank_head_load(eng_model *m, const char *path, char *err, size_t err_len);

/* The head over one hidden state x[n_embd] into out[n_out]: x quantized to the weights' activation type and dotted
 * with each row by the scalar kernel (eng_vec_dot: the logits a matrix product gives), the bias, then the softmax
 * when h->softmax. The same x gives the same bits whatever the batch or CPU. 0, ENG_ERR_NOMEM or the error of
 * eng_quantize_row. Any thread. */
int eng_rank_head_apply(const eng_rank_head *h, const float *x, float *out);

/* Frees h and what it owns; NULL is a no-op. */
void eng_rank_head_free(eng_rank_head *h);

#endif /* KVSERVE_ENGINE_RANK_HEAD_H */
