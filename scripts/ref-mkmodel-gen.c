/*
 * ref-mkmodel-gen.c: greedy completions with top-5 logprobs through llama.cpp's library, for
 * scripts/ref-mkmodel.py (not part of the kvserve build; the script compiles it against a llama.cpp tree).
 *
 * usage: ref-mkmodel-gen MODEL N_CTX N_PREDICT < prompts
 * Input: one prompt per line, hex-encoded bytes. Output, per prompt: "P id id ..." (the prompt tokenized with the
 * special tokens the model's metadata adds), then one "S id logprob id logprob ..." line per generated token (the
 * chosen token and its natural-log softmax over the whole vocabulary, then the top 5), then "E eos" or "E limit".
 * The prompt is evaluated in one batch, then each token alone; f32 KV cache, one sequence, 2 threads.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static int hexval(int c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL N_CTX N_PREDICT < hex prompts\n", argv[0]);
        return 2;
    }
    int n_ctx = atoi(argv[2]), n_predict = atoi(argv[3]);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = cp.n_ubatch = (uint32_t)n_ctx;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    static char line[1 << 16], text[1 << 15];
    static llama_token toks[1 << 14];
    double *lp = malloc((size_t)n_vocab * sizeof *lp);
    while (fgets(line, sizeof line, stdin)) {
        size_t n = strcspn(line, "\r\n") / 2;
        for (size_t i = 0; i < n; i++) text[i] = (char)(hexval(line[2 * i]) * 16 + hexval(line[2 * i + 1]));
        int nt = llama_tokenize(vocab, text, (int32_t)n, toks, 1 << 14, true, true);
        if (nt < 0) return 1;
        printf("P");
        for (int i = 0; i < nt; i++) printf(" %d", toks[i]);
        printf("\n");
        llama_memory_clear(llama_get_memory(ctx), true);
        if (llama_decode(ctx, llama_batch_get_one(toks, nt)) != 0) return 1;
        const char *end = "limit";
        for (int step = 0; step < n_predict; step++) {
            const float *lg = llama_get_logits_ith(ctx, -1);
            double mx = lg[0], sum = 0.0;
            for (int i = 1; i < n_vocab; i++) mx = lg[i] > mx ? lg[i] : mx;
            for (int i = 0; i < n_vocab; i++) sum += exp((double)lg[i] - mx);
            double lse = mx + log(sum);
            for (int i = 0; i < n_vocab; i++) lp[i] = (double)lg[i] - lse;
            int top[5];
            for (int k = 0; k < 5; k++) {
                top[k] = -1;
                for (int i = 0; i < n_vocab; i++) {
                    int used = 0;
                    for (int j = 0; j < k; j++) used |= top[j] == i;
                    if (!used && (top[k] < 0 || lp[i] > lp[top[k]])) top[k] = i;
                }
            }
            llama_token t = top[0];
            printf("S %d %.6f", t, lp[t]);
            for (int k = 0; k < 5; k++) printf(" %d %.6f", top[k], lp[top[k]]);
            printf("\n");
            if (llama_vocab_is_eog(vocab, t)) {
                end = "eos";
                break;
            }
            if (llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0) return 1;
        }
        printf("E %s\n", end);
        fflush(stdout);
    }
    free(lp);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
