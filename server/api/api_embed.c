/* api_embed.c: POST /v1/embeddings (and /embeddings). Each input becomes one embedding request of the
 * scheduler (srv_sched_request.embed): it is prefilled in the same batches, under the same token budget and
 * KV pool as generation, and its DONE event carries the pooled, L2-normalized vector. Inputs are submitted
 * EMBED_WINDOW at a time (the next when one finishes), so a long input list does not fill the request queue.
 *
 * Body: input (a string, a list of strings, a list of token ids, a list of token-id lists), model (ignored),
 * encoding_format ("float", default, or "base64": the vector's little-endian float32 bytes, which the openai
 * SDKs decode), dimensions (only the model's own size; anything else is a 400), user (ignored), priority (vLLM's:
 * the scheduling priority of every input; see api_parse_priority). */
#include "server/api/api_gen_internal.h"
#include "server/api/api_routes_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { EMBED_WINDOW = 16, EMBED_MAX_INPUTS = 2048 };

#define EBAD(param, ...) srv_api_set_error(e, 400, NULL, param, NULL, __VA_ARGS__)

/* One token-id array into toks (ids checked against the vocabulary). */
static int read_ids(srv_api *api, const cJSON *arr, int32_t idx, int32_t **toks, int32_t *n, srv_api_error *e) {
    int32_t cnt = cJSON_GetArraySize(arr), i = 0;
    if (cnt < 1) {
        EBAD("input", "'input' item %d is empty", (int)idx);
        return -1;
    }
    if (!(*toks = malloc((size_t)cnt * sizeof **toks))) return -2;
    for (const cJSON *t = arr->child; t; t = t->next, i++) {
        double v = cJSON_IsNumber(t) ? t->valuedouble : -1;
        if (!(v >= 0 && v <= INT32_MAX) || v != floor(v) || (api->limits.n_vocab > 0 && v >= api->limits.n_vocab)) {
            EBAD("input", "'input' item %d: element %d is not a valid token id", (int)idx, (int)i);
            return -1;
        }
        (*toks)[i] = (int32_t)v;
    }
    *n = cnt;
    return 0;
}

/* Pool thread: parse, tokenize, check lengths. Fills c->prep_toks / prep_ntok / n_subs. */
static int embed_parse(api_call *c, srv_api_error *e) {
    srv_api *api = c->api;
    if (api->n_embd < 1) {
        srv_api_set_error(e, 501, "server_error", NULL, "not_implemented", "embeddings are not available");
        return -1;
    }
    cJSON *root = api_parse_body_object(c->job.body, c->job.body_len, e);
    if (!root) return -1;
    int rc = -1;
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(root, "input");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "encoding_format");
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(root, "dimensions");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model) && !cJSON_IsString(model)) { EBAD("model", "'model' must be a string"); goto out; }
    if (fmt && !cJSON_IsNull(fmt)) {
        if (!cJSON_IsString(fmt) || (strcmp(fmt->valuestring, "float") && strcmp(fmt->valuestring, "base64"))) {
            EBAD("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
            goto out;
        }
        c->embd_b64 = !strcmp(fmt->valuestring, "base64");
    }
    if (dims && !cJSON_IsNull(dims) && !(cJSON_IsNumber(dims) && dims->valuedouble == (double)api->n_embd)) {
        EBAD("dimensions", "'dimensions' is not supported: this model's embeddings have %d dimensions and cannot "
             "be shortened", (int)api->n_embd);
        goto out;
    }
    if (api_parse_priority(root, &api->limits, &c->priority, e) < 0) goto out;
    if (!in || cJSON_IsNull(in)) { EBAD("input", "'input' is required"); goto out; }
    bool one = cJSON_IsString(in) || (cJSON_IsArray(in) && cJSON_IsNumber(in->child));
    if (!one && !cJSON_IsArray(in)) {
        EBAD("input", "'input' must be a string, an array of strings, an array of token ids or an array of "
             "token-id arrays");
        goto out;
    }
    int32_t n = one ? 1 : cJSON_GetArraySize(in);
    if (n < 1) { EBAD("input", "'input' must not be empty"); goto out; }
    if (n > EMBED_MAX_INPUTS) { EBAD("input", "'input' holds %d items; at most %d are allowed", (int)n, EMBED_MAX_INPUTS); goto out; }
    c->n_subs = n;
    c->subs = calloc((size_t)n, sizeof *c->subs);
    c->prep_toks = calloc((size_t)n, sizeof *c->prep_toks);
    c->prep_ntok = calloc((size_t)n, sizeof *c->prep_ntok);
    c->embd = calloc((size_t)n * (size_t)api->n_embd, sizeof *c->embd);
    c->n_embd = api->n_embd;
    if (!c->subs || !c->prep_toks || !c->prep_ntok || !c->embd) { rc = -2; goto out; }
    const cJSON *it = one ? in : in->child;
    for (int32_t i = 0; i < n; i++, it = it->next) {
        c->subs[i].call = c;
        c->subs[i].prompt_index = i;
        int r;
        if (!one && (cJSON_IsString(it) != cJSON_IsString(in->child))) {
            EBAD("input", "'input' must not mix strings and token-id arrays (item %d)", (int)i);
            goto out;
        }
        if (cJSON_IsString(it)) {
            if (!it->valuestring[0]) { EBAD("input", "'input' item %d is an empty string", (int)i); goto out; }
            r = api_tokenize(api, it->valuestring, strlen(it->valuestring), true, false, &c->prep_toks[i],
                             &c->prep_ntok[i]);
            if (r != 0) {
                srv_api_set_error(e, 500, "server_error", NULL, NULL, "tokenization failed: %s", kvs_strerror(r));
                goto out;
            }
        } else if (cJSON_IsArray(it) && !one) {
            if ((r = read_ids(api, it, i, &c->prep_toks[i], &c->prep_ntok[i], e)) != 0) { rc = r; goto out; }
        } else if (one) {
            if ((r = read_ids(api, in, 0, &c->prep_toks[0], &c->prep_ntok[0], e)) != 0) { rc = r; goto out; }
        } else {
            EBAD("input", "'input' item %d must be a string or an array of token ids", (int)i);
            goto out;
        }
        if (c->prep_ntok[i] < 1) { EBAD("input", "'input' item %d has no tokens", (int)i); goto out; }
        if (api->n_ctx > 0 && c->prep_ntok[i] >= api->n_ctx) {
            srv_api_set_error(e, 400, NULL, "input", "context_length_exceeded", "This model's maximum context "
                              "length is %d tokens, but input %d has %d tokens", (int)api->n_ctx, (int)i,
                              (int)c->prep_ntok[i]);
            goto out;
        }
        if (api_check_kv_fit(api, c->prep_ntok[i], 1, "input", e) != 0) goto out;
        c->usage.prompt_tokens += c->prep_ntok[i];
    }
    rc = 0;
out:
    if (rc == -2) srv_api_set_nomem(e);
    cJSON_Delete(root);
    return rc;
}

static void embed_work(api_job *j) {
    api_call *c = (api_call *)j;
    c->prep_failed = embed_parse(c, &c->prep_error) != 0;
}


/* The 200 body: {"object":"list","data":[{"object":"embedding","index":i,"embedding":...}],"model","usage"}. */
static cJSON *embed_body(api_call *c) {
    srv_api *api = c->api;
    const int32_t E = c->n_embd;
    cJSON *o = cJSON_CreateObject(), *data = o ? cJSON_AddArrayToObject(o, "data") : NULL;
    if (!data) { cJSON_Delete(o); return NULL; }
    cJSON_AddStringToObject(o, "object", "list");
    char *b64 = c->embd_b64 ? malloc(((size_t)E * 4 + 2) / 3 * 4 + 1) : NULL;
    uint8_t *bytes = c->embd_b64 ? malloc((size_t)E * 4) : NULL;
    if (c->embd_b64 && (!b64 || !bytes)) goto oom;
    for (int32_t i = 0; i < c->n_subs; i++) {
        const float *v = c->embd + (size_t)i * (size_t)E;
        cJSON *d = cJSON_CreateObject();
        if (!d) goto oom;
        cJSON_AddItemToArray(data, d);
        cJSON_AddStringToObject(d, "object", "embedding");
        cJSON_AddNumberToObject(d, "index", i);
        if (c->embd_b64) {
            for (int32_t k = 0; k < E; k++) { /* little-endian float32, whatever the host's order */
                uint32_t u;
                memcpy(&u, &v[k], 4);
                for (int b = 0; b < 4; b++) bytes[(size_t)k * 4 + (size_t)b] = (uint8_t)(u >> (8 * b));
            }
            kvs_base64_encode(bytes, (size_t)E * 4, b64, ((size_t)E * 4 + 2) / 3 * 4 + 1);
            if (!cJSON_AddStringToObject(d, "embedding", b64)) goto oom;
        } else {
            cJSON *arr = cJSON_CreateFloatArray(v, E);
            if (!arr) goto oom;
            cJSON_AddItemToObject(d, "embedding", arr);
        }
    }
    free(b64);
    free(bytes);
    cJSON_AddStringToObject(o, "model", api->model_id);
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    if (!u) { cJSON_Delete(o); return NULL; }
    cJSON_AddNumberToObject(u, "prompt_tokens", c->usage.prompt_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", c->usage.prompt_tokens);
    return o;
oom:
    free(b64);
    free(bytes);
    cJSON_Delete(o);
    return NULL;
}

static srv_sched_pooling embed_pooling(const api_call *c) { return c->api->pooling; }

/* Input i's vector, when the event carries one of the model's width. */
static bool embed_store(api_call *c, int32_t i, const srv_sched_event *ev) {
    if (!ev->embd || ev->n_embd != c->n_embd) return false;
    memcpy(c->embd + (size_t)i * (size_t)c->n_embd, ev->embd, (size_t)c->n_embd * sizeof(float));
    return true;
}

static const api_pooled_ops EMBED_OPS = {
    .window = EMBED_WINDOW, .pooling = embed_pooling, .store = embed_store, .body = embed_body,
    .param = "input", .failed = "embedding failed",
    .unsupported = "embeddings are computed by the CPU backend only; this server runs the model on the GPU",
};

void api_route_embeddings(srv_api *api, srv_http_req *req) {
    api_call *c = calloc(1, sizeof *c);
    if (!c) { api_reply_json(api, req, 500, NULL, NULL, -1); return; }
    api_call_register(api, c, req, "/v1/embeddings");
    c->pooled = &EMBED_OPS;
    c->job.work = embed_work;
    c->job.done = api_pooled_done;
    api_offload(api, &c->job);
}

void srv_api_set_pooling(srv_api *api, srv_sched_pooling pooling, int32_t n_embd) {
    if (!api) return;
    api->pooling = pooling;
    api->n_embd = n_embd;
}
