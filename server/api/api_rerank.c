/* api_rerank.c: POST /v1/rerank, /rerank and /v2/rerank (llama.cpp's --reranking server, vLLM and Cohere's v2 shape).
 * Each (query, document) pair becomes one embedding request of the scheduler with rank pooling. Two kinds of model:
 *   - an encoder with a classification head (bert, nomic-bert): the pair's tokens are [BOS] query [EOS] [SEP]
 *     document [EOS], each special token where the vocabulary adds it (a BERT vocabulary: [CLS] query [SEP]
 *     document, as llama.cpp builds it); the score is output 0 of the head over the first token, the raw value as
 *     llama.cpp reports it;
 *   - a decoder reranker (Qwen3-Reranker: a qwen3 GGUF with cls.output and tokenizer.chat_template.rerank): the
 *     pair's prompt is the model's rerank prompt with {query} and {document} replaced, tokenized with special
 *     tokens parsed and none added, as llama.cpp's server builds it; the score is output 0 of the softmax of the
 *     head over the LAST token (p("yes") from the yes / no logits, as vLLM scores it). A query or document holding
 *     special-token text (e.g. "<|im_end|>") keeps it as plain text: the prompt is then tokenized piecewise (the
 *     template's text with special tokens, the query and the document without), unless the server parses specials
 *     in content. A decoder reranker without a rerank prompt gets the pair of special tokens above.
 * Pairs are submitted RERANK_WINDOW at a time and batched with whatever else runs; an encoder's pairs and a
 * decoder's alike keep no KV block after their request.
 *
 * Body: query (a string, required), documents (a non-empty array of strings or of {"text": string} objects),
 * top_n (an integer >= 0; 0 or absent: every document), return_documents (a boolean, default false: each result
 * then carries "document": {"text": ...}), model (a string, ignored). Answer: {"id", "object": "list", "model",
 * "results": [{"index", "relevance_score", "document"?}] sorted by score (highest first, ties by index),
 * "usage": {"prompt_tokens", "total_tokens"}}. A model without a classification head (or a decoder reranker on the
 * GPU, whose hidden states the CUDA forward pass does not return) answers 501. */
#include "server/api/api_gen_internal.h"
#include "server/api/api_routes_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { RERANK_WINDOW = 16, RERANK_MAX_DOCS = 2048 };

#define RBAD(param, ...) srv_api_set_error(e, 400, NULL, param, NULL, __VA_ARGS__)

typedef struct rerank_call {
    api_call c;           /* first: freed by api_call_free */
    char **docs;          /* [n_subs] the documents' texts (owned), kept for return_documents */
    int32_t top_n;        /* results to answer (<= n_subs) */
    bool ret_docs;
} rerank_call;

static void rerank_ext_free(api_call *c) {
    rerank_call *rc = (rerank_call *)c;
    for (int32_t i = 0; rc->docs && i < c->n_subs; i++) free(rc->docs[i]);
    free(rc->docs);
}

/* The text of documents[i] (a string or {"text": string}), or NULL after a 400. */
static const char *doc_text(const cJSON *d, int32_t i, srv_api_error *e) {
    if (cJSON_IsString(d)) return d->valuestring;
    const cJSON *t = cJSON_IsObject(d) ? cJSON_GetObjectItemCaseSensitive(d, "text") : NULL;
    if (cJSON_IsString(t)) return t->valuestring;
    RBAD("documents", "'documents' item %d must be a string or an object with a string 'text'", (int)i);
    return NULL;
}

/* The pair's tokens: [bos] q [eos] [sep] d [eos] into a new array. */
static int build_pair(const srv_api *api, const int32_t *q, int32_t nq, const int32_t *d, int32_t nd, int32_t **out,
                      int32_t *n) {
    const int32_t *sp = api->rank_tok; /* bos, eos, sep: -1 when the vocabulary does not add it */
    int32_t *t = malloc(((size_t)nq + (size_t)nd + 4) * sizeof *t), k = 0;
    if (!t) return -2;
    if (sp[0] >= 0) t[k++] = sp[0];
    memcpy(t + k, q, (size_t)nq * sizeof *t);
    k += nq;
    if (sp[1] >= 0) t[k++] = sp[1];
    if (sp[2] >= 0) t[k++] = sp[2];
    memcpy(t + k, d, (size_t)nd * sizeof *t);
    k += nd;
    if (sp[1] >= 0) t[k++] = sp[1];
    *out = t;
    *n = k;
    return 0;
}

/* Whether text holds special-token text: it tokenizes differently with special parsing on. */
static int has_special(srv_api *api, const char *text, bool *out) {
    int32_t *a = NULL, *b = NULL, na = 0, nb = 0;
    int r = api_tokenize(api, text, strlen(text), false, true, &a, &na);
    if (r == 0) r = api_tokenize(api, text, strlen(text), false, false, &b, &nb);
    if (r == 0) *out = na != nb || memcmp(a, b, (size_t)na * sizeof *a) != 0;
    free(a);
    free(b);
    return r;
}

/* Appends the tokens of text[0..len) to b (an int32_t array as bytes). */
static int add_tokens(srv_api *api, kvs_buf *b, const char *text, size_t len, bool parse_special) {
    if (len == 0) return 0;
    int32_t *t = NULL, n = 0;
    int r = api_tokenize(api, text, len, false, parse_special, &t, &n);
    if (r == 0) r = kvs_buf_append(b, t, (size_t)n * sizeof *t);
    free(t);
    return r;
}

/* The model's rerank prompt with q and d in place of {query} and {document}: as one text tokenized with special
 * tokens parsed, or (piecewise) the template's pieces with special tokens and q and d as plain text. */
static int prompt_pair(srv_api *api, const char *q, const char *d, bool piecewise, int32_t **out, int32_t *n) {
    kvs_buf text = {0}, toks = {0};
    const char *t = api->rank_prompt;
    int r = 0;
    while (r == 0 && *t) {
        const char *pq = strstr(t, "{query}"), *pd = strstr(t, "{document}");
        const char *p = pq && (!pd || pq < pd) ? pq : pd;
        size_t lit = p ? (size_t)(p - t) : strlen(t);
        if (piecewise) r = add_tokens(api, &toks, t, lit, true);
        else r = kvs_buf_append(&text, t, lit);
        if (!p) break;
        const char *v = p == pq ? q : d;
        if (r == 0) r = piecewise ? add_tokens(api, &toks, v, strlen(v), false) : kvs_buf_puts(&text, v);
        t = p + (p == pq ? strlen("{query}") : strlen("{document}"));
    }
    if (r == 0 && !piecewise && text.len > 0) r = add_tokens(api, &toks, text.data, text.len, true);
    kvs_buf_free(&text);
    if (r != 0) {
        kvs_buf_free(&toks);
        return r;
    }
    *n = (int32_t)(toks.len / sizeof(int32_t));
    *out = (int32_t *)(void *)toks.data;
    if (!*out && !(*out = malloc(sizeof **out))) return KVS_ERR_NOMEM;
    return 0;
}

static int parse_options(rerank_call *rc, const cJSON *root, int32_t n_docs, srv_api_error *e) {
    const cJSON *top = cJSON_GetObjectItemCaseSensitive(root, "top_n");
    const cJSON *ret = cJSON_GetObjectItemCaseSensitive(root, "return_documents");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model) && !cJSON_IsString(model)) { RBAD("model", "'model' must be a string"); return -1; }
    rc->top_n = n_docs;
    if (top && !cJSON_IsNull(top)) {
        if (!cJSON_IsNumber(top) || top->valuedouble < 0 || top->valuedouble != (double)(int64_t)top->valuedouble) {
            RBAD("top_n", "'top_n' must be a non-negative integer");
            return -1;
        }
        if (top->valuedouble > 0 && top->valuedouble < n_docs) rc->top_n = (int32_t)top->valuedouble;
    }
    if (ret && !cJSON_IsNull(ret)) {
        if (!cJSON_IsBool(ret)) { RBAD("return_documents", "'return_documents' must be a boolean"); return -1; }
        rc->ret_docs = cJSON_IsTrue(ret);
    }
    return 0;
}

/* Pair i's tokens into prep_toks[i] / prep_ntok[i]: the rerank prompt, or the pair of special tokens around the
 * query's tokens qt[nq] and the document's. 0, -2 (out of memory) or a tokenizer error. */
static int pair_tokens(rerank_call *rc, const int32_t *qt, int32_t nq, bool q_special, const char *query,
                       const char *doc, int32_t i) {
    api_call *c = &rc->c;
    srv_api *api = c->api;
    int r;
    if (api->rank_prompt) {
        bool d_special = false;
        if (!q_special && !api->parse_special_in_content && (r = has_special(api, doc, &d_special)) != 0) return r;
        r = prompt_pair(api, query, doc, q_special || d_special, &c->prep_toks[i], &c->prep_ntok[i]);
        return r == KVS_ERR_NOMEM ? -2 : r;
    }
    int32_t *dt = NULL, nd = 0;
    if ((r = api_tokenize(api, doc, strlen(doc), false, false, &dt, &nd)) != 0) return r;
    r = build_pair(api, qt, nq, dt, nd, &c->prep_toks[i], &c->prep_ntok[i]);
    free(dt);
    return r;
}

/* Tokenizes the query and every pair; fills prep_toks / prep_ntok and the documents' texts. */
static int tokenize_pairs(rerank_call *rc, const char *query, const cJSON *docs, srv_api_error *e) {
    api_call *c = &rc->c;
    srv_api *api = c->api;
    int32_t *qt = NULL, nq = 0, r = 0;
    bool q_special = false; /* a rerank prompt: the query holds special-token text */
    if (api->rank_prompt && !api->parse_special_in_content) r = has_special(api, query, &q_special);
    if (r == 0) r = api_tokenize(api, query, strlen(query), false, false, &qt, &nq);
    if (r != 0) {
        srv_api_set_error(e, 500, "server_error", NULL, NULL, "tokenization failed: %s", kvs_strerror(r));
        return -1;
    }
    int rv = -1;
    const cJSON *it = docs->child;
    for (int32_t i = 0; i < c->n_subs; i++, it = it->next) {
        c->subs[i].call = c;
        c->subs[i].prompt_index = i;
        const char *text = doc_text(it, i, e);
        if (!text) goto out;
        if (!(rc->docs[i] = strdup(text))) { rv = -2; goto out; }
        if ((r = pair_tokens(rc, qt, nq, q_special, query, text, i)) != 0) {
            if (r == -2) rv = -2;
            else srv_api_set_error(e, 500, "server_error", NULL, NULL, "tokenization failed: %s", kvs_strerror(r));
            goto out;
        }
        if (c->prep_ntok[i] < 1) { RBAD("documents", "the query and document %d have no tokens", (int)i); goto out; }
        if (api->n_ctx > 0 && c->prep_ntok[i] >= api->n_ctx) {
            srv_api_set_error(e, 400, NULL, "documents", "context_length_exceeded", "This model's maximum context "
                              "length is %d tokens, but the query and document %d have %d tokens", (int)api->n_ctx,
                              (int)i, (int)c->prep_ntok[i]);
            goto out;
        }
        if (api_check_kv_fit(api, c->prep_ntok[i], 1, "documents", e) != 0) goto out;
        c->usage.prompt_tokens += c->prep_ntok[i];
    }
    rv = 0;
out:
    free(qt);
    return rv;
}

/* Pool thread: parse and tokenize. */
static int rerank_parse(rerank_call *rc, srv_api_error *e) {
    api_call *c = &rc->c;
    srv_api *api = c->api;
    if (api->n_rank < 1) {
        srv_api_set_error(e, 501, "server_error", NULL, "not_implemented", "this model cannot rerank: it has no "
                          "classification head (a reranker GGUF has cls / cls.output tensors and pooling type rank: "
                          "an encoder reranker or a Qwen3-Reranker), or it runs on the GPU (rerank runs on the CPU)");
        return -1;
    }
    cJSON *root = api_parse_body_object(c->job.body, c->job.body_len, e);
    if (!root) return -1;
    int rv = -1;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "query");
    const cJSON *docs = cJSON_GetObjectItemCaseSensitive(root, "documents");
    if (!q || cJSON_IsNull(q)) { RBAD("query", "'query' is required"); goto out; }
    if (!cJSON_IsString(q)) { RBAD("query", "'query' must be a string"); goto out; }
    if (!docs || cJSON_IsNull(docs)) { RBAD("documents", "'documents' is required"); goto out; }
    if (!cJSON_IsArray(docs) || cJSON_GetArraySize(docs) < 1) {
        RBAD("documents", "'documents' must be a non-empty array of strings or {\"text\": ...} objects");
        goto out;
    }
    int32_t n = cJSON_GetArraySize(docs);
    if (n > RERANK_MAX_DOCS) { RBAD("documents", "'documents' holds %d items; at most %d are allowed", (int)n, RERANK_MAX_DOCS); goto out; }
    if (parse_options(rc, root, n, e) != 0) goto out;
    if (api_parse_priority(root, &api->limits, &c->priority, e) < 0) goto out;
    c->n_subs = n;
    c->subs = calloc((size_t)n, sizeof *c->subs);
    c->prep_toks = calloc((size_t)n, sizeof *c->prep_toks);
    c->prep_ntok = calloc((size_t)n, sizeof *c->prep_ntok);
    c->embd = calloc((size_t)n, sizeof *c->embd);
    rc->docs = calloc((size_t)n, sizeof *rc->docs);
    if (!c->subs || !c->prep_toks || !c->prep_ntok || !c->embd || !rc->docs) { rv = -2; goto out; }
    rv = tokenize_pairs(rc, q->valuestring, docs, e);
out:
    if (rv == -2) srv_api_set_nomem(e);
    cJSON_Delete(root);
    return rv;
}

static void rerank_work(api_job *j) {
    api_call *c = (api_call *)j;
    c->prep_failed = rerank_parse((rerank_call *)c, &c->prep_error) != 0;
}

static int32_t *ranked_order(const api_call *c) {
    int32_t *ord = malloc((size_t)c->n_subs * sizeof *ord);
    if (!ord) return NULL;
    for (int32_t i = 0; i < c->n_subs; i++) ord[i] = i;
    for (int32_t i = 1; i < c->n_subs; i++) { /* insertion sort: stable, so ties keep the input order */
        int32_t x = ord[i], j = i;
        while (j > 0 && c->embd[ord[j - 1]] < c->embd[x]) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = x;
    }
    return ord;
}

static cJSON *rerank_body(rerank_call *rc) {
    api_call *c = &rc->c;
    int32_t *ord = ranked_order(c);
    cJSON *o = ord ? cJSON_CreateObject() : NULL, *res = o ? cJSON_CreateArray() : NULL;
    if (!res) goto oom;
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddStringToObject(o, "model", c->api->model_id);
    cJSON_AddItemToObject(o, "results", res);
    for (int32_t k = 0; k < rc->top_n; k++) {
        int32_t i = ord[k];
        cJSON *r = cJSON_CreateObject();
        if (!r) goto oom;
        cJSON_AddItemToArray(res, r);
        cJSON_AddNumberToObject(r, "index", i);
        cJSON_AddNumberToObject(r, "relevance_score", c->embd[i]);
        if (rc->ret_docs) {
            cJSON *d = cJSON_AddObjectToObject(r, "document");
            if (!d || !cJSON_AddStringToObject(d, "text", rc->docs[i])) goto oom;
        }
    }
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    if (!u) goto oom;
    cJSON_AddNumberToObject(u, "prompt_tokens", c->usage.prompt_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", c->usage.prompt_tokens);
    free(ord);
    return o;
oom:
    free(ord);
    cJSON_Delete(o);
    return NULL;
}

static srv_sched_pooling rerank_pooling(const api_call *c) {
    (void)c;
    return SRV_SCHED_POOL_RANK;
}

/* Pair i's score: output 0 of the classification head (a decoder reranker's: p(yes)). */
static bool rerank_store(api_call *c, int32_t i, const srv_sched_event *ev) {
    if (!ev->embd || ev->n_embd < 1) return false;
    c->embd[i] = ev->embd[0];
    return true;
}

static cJSON *rerank_body_of(api_call *c) { return rerank_body((rerank_call *)c); }

static const api_pooled_ops RERANK_OPS = {
    .window = RERANK_WINDOW, .pooling = rerank_pooling, .store = rerank_store, .body = rerank_body_of,
    .param = "documents", .failed = "reranking failed",
    .unsupported = "reranking runs on the CPU forward pass of a model with a classification head only",
};

void api_route_rerank(srv_api *api, srv_http_req *req) {
    rerank_call *rc = calloc(1, sizeof *rc);
    if (!rc) { api_reply_json(api, req, 500, NULL, NULL, -1); return; }
    api_call *c = &rc->c;
    api_call_register(api, c, req, "/v1/rerank");
    api_make_id(api, "rerank-", c->id, sizeof c->id);
    c->ext_free = rerank_ext_free;
    c->pooled = &RERANK_OPS;
    c->job.work = rerank_work;
    c->job.done = api_pooled_done;
    api_offload(api, &c->job);
}

void srv_api_set_rerank(srv_api *api, int32_t n_rank, int32_t bos, int32_t eos, int32_t sep) {
    if (!api) return;
    api->n_rank = n_rank;
    api->rank_tok[0] = bos;
    api->rank_tok[1] = eos;
    api->rank_tok[2] = sep;
}

int srv_api_set_rerank_prompt(srv_api *api, const char *prompt) {
    if (!api) return 0;
    char *p = prompt ? strdup(prompt) : NULL;
    if (prompt && !p) return KVS_ERR_NOMEM;
    free(api->rank_prompt);
    api->rank_prompt = p;
    return 0;
}
