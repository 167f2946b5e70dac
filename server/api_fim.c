/* api_fim.c: fill-in-the-middle prompts. A completion with `suffix` is built in the model's FIM order, PSM
 * (prefix-suffix-middle), as the metadata's tokens name it: [BOS] <fim_pre> prefix <fim_suf> suffix <fim_mid>,
 * and the model writes the middle. Prefix and suffix are tokenized without special tokens and without parsing
 * special-token text (so a "<|fim_middle|>" typed in code stays text). A model whose metadata names no FIM
 * tokens answers 400. */
#include "server/api_internal.h"

#include <stdlib.h>
#include <string.h>

int api_fim_prompt(srv_api *api, const srv_api_prompt *p, const char *suffix, int32_t **toks, int32_t *n,
                   srv_api_error *e) {
    if (api->fim[0] < 0 || api->fim[1] < 0 || api->fim[2] < 0) {
        srv_api_set_error(e, 400, NULL, "suffix", NULL, "'suffix' (fill-in-the-middle) needs a model whose metadata "
                          "names FIM tokens (tokenizer.ggml.fim_pre_token_id, fim_suf_token_id, fim_mid_token_id); "
                          "this model has none");
        return -1;
    }
    int32_t *bos = NULL, n_bos = 0, *pre = NULL, n_pre = 0, *suf = NULL, n_suf = 0;
    /* the tokens the model adds around a text (BOS when add_bos_token): what an empty text tokenizes to */
    int rc = api_tokenize(api, "", 0, true, false, &bos, &n_bos);
    if (!rc && p->text) rc = api_tokenize(api, p->text, strlen(p->text), false, false, &pre, &n_pre);
    if (!rc) rc = api_tokenize(api, suffix, strlen(suffix), false, false, &suf, &n_suf);
    if (rc != 0) {
        free(bos);
        free(pre);
        free(suf);
        srv_api_set_error(e, 500, "server_error", NULL, NULL, "tokenization failed: %s", kvs_strerror(rc));
        return -1;
    }
    const int32_t *pt = p->text ? pre : p->tokens;
    int32_t np = p->text ? n_pre : p->n_tokens, lead = n_bos > 0 ? 1 : 0; /* BOS only, never a trailing EOS */
    int32_t total = lead + 1 + np + 1 + n_suf + 1, k = 0;
    int32_t *out = malloc((size_t)total * sizeof *out);
    if (!out) {
        free(bos);
        free(pre);
        free(suf);
        srv_api_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    if (lead) out[k++] = bos[0];
    out[k++] = api->fim[0];
    if (np > 0) memcpy(out + k, pt, (size_t)np * sizeof *out);
    k += np;
    out[k++] = api->fim[1];
    if (n_suf > 0) memcpy(out + k, suf, (size_t)n_suf * sizeof *out);
    k += n_suf;
    out[k++] = api->fim[2];
    free(bos);
    free(pre);
    free(suf);
    *toks = out;
    *n = k;
    return 0;
}

void srv_api_set_fim(srv_api *api, int32_t pre, int32_t suf, int32_t mid) {
    if (!api) return;
    api->fim[0] = pre;
    api->fim[1] = suf;
    api->fim[2] = mid;
}
