/*
 * ref-encoder-gen.c: token ids, pooled embeddings and rerank scores of an encoder GGUF through llama.cpp's library,
 * for scripts/ref-encoder.py (not part of the kvserve build; the script compiles it against a llama.cpp tree).
 *
 * usage: ref-encoder-gen MODEL < requests
 * Input lines: "T HEX" (tokenize the hex-encoded text with the special tokens the model adds, special-token text
 * parsed, as llama-embedding does), "E HEX" (that text's embedding: the model's pooling, L2-normalized, as
 * llama-embedding --embd-normalize 2 gives it), "R HEXQUERY HEXDOC" (the rerank score of the pair, built as
 * llama-server's format_prompt_rerank builds it: the model's rerank prompt (tokenizer.chat_template.rerank) with
 * {query} and {document} replaced, tokenized with special tokens parsed and none added; or, for a model without
 * one, [BOS] query [EOS] [SEP] doc [EOS], each where the vocabulary adds it, EOS falling back to SEP; the score is
 * output 0 of the rank pooling), "P HEXQUERY HEXDOC" (the tokens of that pair prompt).
 * Output: "T id id ...", "E v v ...", "R score", "P id id ...". One sequence at a time, n_ctx = n_batch = n_ubatch
 * = 512, 2 threads.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static int hexval(int c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

static size_t unhex(const char *h, char *out) {
    size_t n = 0;
    while (h[0] && h[1] && h[0] != ' ' && h[0] != '\n') {
        out[n++] = (char)(hexval(h[0]) * 16 + hexval(h[1]));
        h += 2;
    }
    out[n] = 0;
    return n;
}

static int tok(const struct llama_vocab *v, const char *text, size_t len, bool add_special, llama_token *out, int cap) {
    int n = llama_tokenize(v, text, (int32_t)len, out, cap, add_special, true);
    if (n < 0) exit(3);
    return n;
}

/* Decodes one sequence; returns its pooled vector (the context's). */
static const float *run(struct llama_context *ctx, const llama_token *t, int n) {
    llama_memory_clear(llama_get_memory(ctx), true);
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = t[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = true;
    }
    b.n_tokens = n;
    if (llama_decode(ctx, b) < 0) exit(4);
    llama_batch_free(b);
    const float *e = llama_get_embeddings_seq(ctx, 0);
    if (!e) exit(5);
    return e;
}

/* The pair without a rerank prompt: [BOS] q [EOS] [SEP] d [EOS], each where the vocabulary adds it. */
static int pair(const struct llama_vocab *v, const char *a, size_t lq, const char *d, size_t ld, llama_token *t) {
    llama_token eos = llama_vocab_eos(v);
    if (eos == LLAMA_TOKEN_NULL) eos = llama_vocab_sep(v);
    int n = 0;
    if (llama_vocab_get_add_bos(v)) t[n++] = llama_vocab_bos(v);
    n += tok(v, a, lq, false, t + n, 4000 - n);
    if (llama_vocab_get_add_eos(v)) t[n++] = eos;
    if (llama_vocab_get_add_sep(v)) t[n++] = llama_vocab_sep(v);
    n += tok(v, d, ld, false, t + n, 4000 - n);
    if (llama_vocab_get_add_eos(v)) t[n++] = eos;
    return n;
}

/* Replaces every occurrence of key in s (in place, s has room for cap bytes). */
static void replace_all(char *s, size_t cap, const char *key, const char *val) {
    static char tmp[1 << 17];
    size_t kl = strlen(key), vl = strlen(val), o = 0;
    for (const char *p = s; *p;) {
        if (!strncmp(p, key, kl)) {
            if (o + vl >= sizeof tmp) exit(7);
            memcpy(tmp + o, val, vl);
            o += vl;
            p += kl;
        } else {
            if (o + 1 >= sizeof tmp) exit(7);
            tmp[o++] = *p++;
        }
    }
    tmp[o] = 0;
    if (o + 1 > cap) exit(7);
    memcpy(s, tmp, o + 1);
}

/* The server's rerank prompt: {query} replaced, then {document}; tokenized with specials parsed, none added. */
static int from_template(const struct llama_vocab *v, const char *tmpl, const char *q, const char *d, llama_token *t,
                         int cap) {
    static char s[1 << 17];
    if (strlen(tmpl) + 1 > sizeof s) exit(7);
    strcpy(s, tmpl);
    replace_all(s, sizeof s, "{query}", q);
    replace_all(s, sizeof s, "{document}", d);
    return tok(v, s, strlen(s), false, t, cap);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL < requests\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    struct llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) return 1;
    const struct llama_vocab *v = llama_model_get_vocab(model);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 512;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.embeddings = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    const int n_embd = llama_model_n_embd_out(model);
    const char *rerank_prompt = llama_model_chat_template(model, "rerank");
    static char line[1 << 16], a[1 << 15], d[1 << 15];
    static llama_token t[4096];
    while (fgets(line, sizeof line, stdin)) {
        if (line[0] == 'T' || line[0] == 'E') {
            size_t len = unhex(line + 2, a);
            int n = tok(v, a, len, true, t, 4096);
            if (line[0] == 'T') {
                printf("T");
                for (int i = 0; i < n; i++) printf(" %d", t[i]);
            } else {
                const float *e = run(ctx, t, n);
                double ss = 0;
                for (int i = 0; i < n_embd; i++) ss += (double)e[i] * e[i];
                double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
                printf("E");
                for (int i = 0; i < n_embd; i++) printf(" %.9g", e[i] * inv);
            }
        } else if (line[0] == 'R' || line[0] == 'P') {
            size_t lq = unhex(line + 2, a);
            const char *sp = strchr(line + 2, ' ');
            if (!sp) return 6;
            size_t ld = unhex(sp + 1, d);
            int n = rerank_prompt ? from_template(v, rerank_prompt, a, d, t, 4000) : -1;
            if (n < 0) n = pair(v, a, lq, d, ld, t);
            if (line[0] == 'P') {
                printf("P");
                for (int i = 0; i < n; i++) printf(" %d", t[i]);
            } else {
                printf("R %.9g", run(ctx, t, n)[0]);
            }
        }
        printf("\n");
        fflush(stdout);
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
