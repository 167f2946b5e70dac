/* api_fim.c: fill-in-the-middle (see api_gen_internal.h): prompts, and the body of POST /infill. A completion
 * with `suffix` is built in the model's FIM order, PSM (prefix-suffix-middle), as the metadata's tokens name it:
 * [BOS] <fim_pre> prefix <fim_suf> suffix <fim_mid>, and the model writes the middle. Prefix and suffix are
 * tokenized without special tokens and without parsing special-token text (so a "<|fim_middle|>" typed in code
 * stays text). A model whose metadata names no FIM tokens answers 400. */
#include "server/api/api_gen_internal.h"

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
        srv_api_set_nomem(e);
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

/* POST /infill (llama.cpp's field names): input_prefix, input_suffix, n_predict and the sampling fields become a
 * /v1/completions body with `suffix`, which then runs as any completion (the answer has the completions shape,
 * not llama.cpp's `content`; api_routes.c hands the translated request to api_route_generate). The translation
 * runs on the loop thread; infill bodies are small (the HTTP body limit bounds them). */
int api_fim_infill_body(srv_http_req *req, srv_api_error *e) {
    static const char *const copied[] = {"model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stream",
                                         "presence_penalty", "frequency_penalty", "max_tokens", "ignore_eos",
                                         "logit_bias", "n", "priority"};
    cJSON *root = api_parse_body_object(req->body, req->body_len, e), *out = NULL;
    if (!root) return -1;
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "input_prefix");
    const cJSON *suf = cJSON_GetObjectItemCaseSensitive(root, "input_suffix");
    const cJSON *mid = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(root, "input_extra");
    const cJSON *np = cJSON_GetObjectItemCaseSensitive(root, "n_predict");
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "repeat_penalty");
    const char *bad = NULL, *why = "must be a string";
    if (pre && !cJSON_IsNull(pre) && !cJSON_IsString(pre)) bad = "input_prefix";
    else if (suf && !cJSON_IsNull(suf) && !cJSON_IsString(suf)) bad = "input_suffix";
    else if (mid && !cJSON_IsNull(mid) && !(cJSON_IsString(mid) && !mid->valuestring[0])) {
        bad = "prompt";
        why = "(text after the middle token) is not supported; put it at the end of input_prefix";
    } else if (extra && cJSON_GetArraySize(extra) > 0) {
        bad = "input_extra";
        why = "(extra context files) is not supported";
    } else if (np && !cJSON_IsNull(np) && !cJSON_IsNumber(np)) {
        bad = "n_predict";
        why = "must be an integer";
    }
    if (bad) {
        srv_api_set_error(e, 400, NULL, bad, NULL, "'%s' %s", bad, why);
        goto fail;
    }
    out = cJSON_CreateObject();
    if (!out || !cJSON_AddStringToObject(out, "prompt", cJSON_IsString(pre) ? pre->valuestring : "") ||
        !cJSON_AddStringToObject(out, "suffix", cJSON_IsString(suf) ? suf->valuestring : ""))
        goto oom;
    for (size_t i = 0; i < sizeof copied / sizeof copied[0]; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, copied[i]);
        cJSON *d = f ? cJSON_Duplicate(f, true) : NULL;
        if (f && !d) goto oom;
        if (d) cJSON_AddItemToObject(out, copied[i], d);
    }
    if (cJSON_IsNumber(np) && np->valuedouble > 0 && !cJSON_GetObjectItemCaseSensitive(out, "max_tokens"))
        cJSON_AddNumberToObject(out, "max_tokens", np->valuedouble);
    if (rp && !cJSON_IsNull(rp)) {
        cJSON *d = cJSON_Duplicate(rp, true);
        if (!d) goto oom;
        cJSON_AddItemToObject(out, "repetition_penalty", d);
    }
    char *body = cJSON_PrintUnformatted(out);
    if (!body) goto oom;
    free(req->body); /* the request's body is malloc'd and freed with the request (http.h) */
    req->body = body;
    req->body_len = strlen(body);
    cJSON_Delete(root);
    cJSON_Delete(out);
    return 0;
oom:
    srv_api_set_nomem(e);
fail:
    cJSON_Delete(root);
    cJSON_Delete(out);
    return -1;
}
