/*
 * ref-tok-gen.c: llama.cpp's tokenization of texts, for scripts/ref-tok-gpt4o.py (not part of the kvserve build;
 * the script compiles it against a llama.cpp tree).
 *
 * usage: ref-tok-gen VOCAB.gguf < texts
 * Input: one text per line, hex-encoded bytes. Output: one line of token ids per text (no BOS/EOS added, special
 * tokens not parsed: the text as plain text). The vocabulary is loaded alone (vocab_only).
 */
#include <stdio.h>
#include <string.h>

#include "llama.h"

static int hexval(int c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s VOCAB.gguf < hex texts\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    static char line[1 << 16], text[1 << 15];
    static llama_token toks[1 << 14];
    while (fgets(line, sizeof line, stdin)) {
        size_t n = strcspn(line, "\r\n") / 2;
        for (size_t i = 0; i < n; i++) text[i] = (char)(hexval(line[2 * i]) * 16 + hexval(line[2 * i + 1]));
        int nt = llama_tokenize(vocab, text, (int32_t)n, toks, 1 << 14, false, false);
        if (nt < 0) return 1;
        for (int i = 0; i < nt; i++) printf(i ? " %d" : "%d", toks[i]);
        printf("\n");
    }
    llama_model_free(model);
    return 0;
}
