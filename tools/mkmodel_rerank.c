/*
 * mkmodel_rerank.c: `kvserve mkmodel --arch qwen3 --rerank`: a Qwen3-Reranker-style decoder, written as llama.cpp
 * v0.5.0's convert_hf_to_gguf writes one (facts: engine/model/rank_head.h): qwen3.pooling_type 4 (rank),
 * qwen3.classifier.output_labels ["yes", "no"], the rerank prompt in tokenizer.chat_template.rerank (listed in
 * tokenizer.chat_templates), and cls.output.weight [n_embd, 2]: the output matrix's rows of the tokens "yes" and
 * "no", in that order. As in the conversion, a tied model keeps token_embd (the rows come from it) and an untied
 * one has no output.weight (its rows go into cls.output only). The vocabulary must hold the tokens "yes" and "no"
 * and, for the prompt's ChatML markers to be special tokens, <|im_start|> and <|im_end|> (a Qwen2 vocabulary:
 * --vocab-from ggml-vocab-qwen2.gguf).
 */
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "tools/mkmodel.h"

/* The rerank prompt of Qwen3-Reranker as llama.cpp's conversion writes it. */
static const char RERANK_PROMPT[] =
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n";

bool kvs_mk_is_decoder_reranker(const mk_opts *o) { return o->rerank && !strcmp(o->arch, "qwen3"); }

int kvs_mk_rerank_tokens(const eng_gguf *tok, mk_opts *o) {
    uint32_t et;
    uint64_t n;
    const void *data;
    const eng_gguf_str *strs;
    o->rank_tok[0] = o->rank_tok[1] = -1;
    if (eng_gguf_get_arr(tok, "tokenizer.ggml.tokens", &et, &n, &data, &strs) != 0 || et != ENG_GGUF_STRING) {
        fprintf(stderr, "kvserve mkmodel: the vocabulary has no tokenizer.ggml.tokens\n");
        return KVS_ERR_FORMAT;
    }
    static const char *const want[2] = {"yes", "no"};
    for (uint64_t i = 0; i < n && i < INT32_MAX; i++)
        for (int k = 0; k < 2; k++)
            if (o->rank_tok[k] < 0 && strs[i].len == strlen(want[k]) && !memcmp(strs[i].ptr, want[k], strs[i].len))
                o->rank_tok[k] = (int32_t)i;
    if (o->rank_tok[0] < 0 || o->rank_tok[1] < 0) {
        fprintf(stderr, "kvserve mkmodel: --arch qwen3 --rerank needs a vocabulary with the tokens \"yes\" and \"no\" "
                "(e.g. --vocab-from ggml-vocab-qwen2.gguf)\n");
        return KVS_ERR_INVALID;
    }
    return 0;
}

int kvs_mk_rerank_metadata(eng_gguf_writer *w, const mk_opts *o) {
    char key[96];
    snprintf(key, sizeof key, "%s.pooling_type", o->arch);
    int rc = eng_gguf_add_u32(w, key, 4);
    const eng_gguf_str labels[2] = {{"yes", 3}, {"no", 2}}, names[1] = {{"rerank", 6}};
    snprintf(key, sizeof key, "%s.classifier.output_labels", o->arch);
    if (!rc) rc = eng_gguf_add_str_arr(w, key, labels, 2);
    if (!rc) rc = eng_gguf_add_str(w, "tokenizer.chat_template.rerank", RERANK_PROMPT, strlen(RERANK_PROMPT));
    if (!rc) rc = eng_gguf_add_str_arr(w, "tokenizer.chat_templates", names, 1);
    if (rc) fprintf(stderr, "kvserve mkmodel: cannot add the reranker's keys: %s\n", kvs_strerror(rc));
    return rc;
}
