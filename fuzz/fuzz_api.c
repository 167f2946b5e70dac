/*
 * fuzz_api.c: request JSON parsing of every route.
 *
 * Input: byte 0 selects the route (mod 5), byte 1 the vocabulary size used for token-id checks; the rest is
 * the request body.
 *   0 /v1/completions, 1 /v1/chat/completions: srv_api_parse_gen (pure). Checks: success and failure are
 *     exclusive and complete (a 400 with a message, or a request within every documented range); a body the
 *     strict JSON pass accepts never loses text (every prompt / message string is as long as cJSON's).
 *   2 /tokenize, 3 /detokenize: the route itself (srv_api_handle over srv_http_adopt_fd) with a backend whose
 *     tokens are bytes. Checks: the answer is 200 or 400 with a JSON body; a 200 tokenize returns one token per
 *     byte of the content (no truncation), a 200 detokenize returns a content string.
 *   4 /v1/responses: srv_responses_map_parse (pure; previous_response_id "resp_x" finds a stored conversation with a
 *     call
 *     "call_x", others are unknown), then srv_api_parse_gen_json on the chat body it makes. Checks: a failure is a
 *     400 (404 for an unknown previous_response_id) with a message and nothing left allocated; on success the
 *     chat parse takes the body whole or answers 400, never more or fewer messages than instructions plus the
 *     stored conversation plus the input gave.
 */
#define FZ_WITH_HTTP
#include "fuzz_util.h"

#include <math.h>

#include <cjson/cJSON.h>

#include "server/api/api.h"
#include "server/api/json_check_internal.h"
#include "server/api/chat_internal.h"
#include "server/api/responses_map_internal.h"

typedef struct fz_api { uv_loop_t loop; srv_http *h; srv_api *api; } fz_api;
static fz_api *G; /* the harness's one state (libFuzzer gives no user pointer) */

static int be_tokenize(void *ctx, const char *text, size_t len, bool add_special, bool parse_special, int32_t *out,
                       int32_t cap, int32_t *n_out) {
    (void)ctx; (void)add_special; (void)parse_special;
    *n_out = (int32_t)len;
    if ((size_t)cap < len) return ENG_ERR_TOO_LARGE;
    for (size_t i = 0; i < len; i++) out[i] = (unsigned char)text[i];
    return ENG_OK;
}

static int be_piece(void *ctx, int32_t token, bool render_special, char *buf, size_t cap, size_t *n_out) {
    (void)ctx; (void)render_special;
    if (token < 0 || token > 255) return ENG_ERR_INVALID;
    *n_out = 1;
    if (cap < 1) return ENG_ERR_TOO_LARGE;
    buf[0] = (char)token;
    return ENG_OK;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    FZ_HTTP_STATE_NEW(G);
    srv_api_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.model_id = "fuzz";
    srv_api_limits_default(&cfg.limits);
    cfg.limits.n_vocab = 256;
    cfg.log_format = SRV_API_LOG_NONE;
    cfg.loop = &G->loop;
    if (srv_api_create(&cfg, NULL, &G->api) != 0) abort();
    srv_api_backend be;
    memset(&be, 0, sizeof be);
    be.ctx = G;
    be.tokenize = be_tokenize;
    be.token_piece = be_piece;
    srv_api_set_backend(G->api, &be);
    srv_http_limits l;
    srv_http_limits_default(&l);
    if (srv_http_create(&G->loop, &l, srv_api_handle, G->api, &G->h) != 0) abort();
    return 0;
}

static void check_gen(srv_api_kind kind, const char *body, size_t len, int32_t n_vocab) {
    srv_api_limits lim;
    srv_api_limits_default(&lim);
    lim.n_vocab = n_vocab;
    srv_api_gen g;
    srv_api_error e;
    memset(&e, 0, sizeof e);
    int r = srv_api_parse_gen(kind, body, len, &lim, &g, &e);
    if (r != SRV_API_OK) {
        FZ_CHECK(r == SRV_API_ERR_INVALID, "parse_gen returned %d", r);
        FZ_CHECK(e.status == 400 && e.message[0], "error status %d message '%s'", e.status, e.message);
        char *j = srv_api_error_json(&e);
        FZ_CHECK(j && srv_json_check(j, strlen(j), 8, &(srv_json_check_result){0}) == 0, "error JSON invalid");
        free(j);
        return;
    }
    /* accepted: every field within its documented range */
    FZ_CHECK(g.kind == kind, "kind");
    FZ_CHECK(g.n >= 1 && g.n <= lim.max_n, "n %d", g.n);
    FZ_CHECK(g.max_tokens == -1 || g.max_tokens >= 1, "max_tokens %d", g.max_tokens);
    FZ_CHECK(g.sampling.temperature >= 0 && g.sampling.temperature <= 2, "temperature %g", g.sampling.temperature);
    FZ_CHECK(g.sampling.top_p >= 0 && g.sampling.top_p <= 1, "top_p %g", g.sampling.top_p);
    FZ_CHECK(g.sampling.min_p >= 0 && g.sampling.min_p <= 1, "min_p");
    FZ_CHECK(fabsf(g.sampling.presence_penalty) <= 2 && fabsf(g.sampling.frequency_penalty) <= 2, "penalties");
    FZ_CHECK(g.sampling.repetition_penalty > 0 && g.sampling.repetition_penalty <= 10, "repetition_penalty");
    FZ_CHECK(g.top_logprobs >= 0 && g.top_logprobs <= KVS_MAX_TOP_LOGPROBS, "top_logprobs");
    FZ_CHECK(g.n_stop >= 0 && g.n_stop <= lim.max_stop, "n_stop");
    for (int32_t i = 0; i < g.n_logit_bias; i++)
        FZ_CHECK(g.logit_bias[i].token >= 0 && g.logit_bias[i].token < n_vocab, "logit_bias token");
    /* no text lost: cJSON's view of the same body gives strings of the same lengths */
    cJSON *root = cJSON_ParseWithLength(body, len);
    FZ_CHECK(root, "accepted but cJSON cannot parse it");
    if (kind == SRV_API_COMPLETION) {
        FZ_CHECK(g.n_prompts >= 1 && g.n_prompts <= lim.max_prompts, "n_prompts %d", g.n_prompts);
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(root, "prompt");
        for (int32_t i = 0; i < g.n_prompts; i++) {
            const srv_api_prompt *p = &g.prompts[i];
            FZ_CHECK((p->text != NULL) != (p->tokens != NULL), "prompt %d: text xor tokens", i);
            for (int32_t k = 0; p->tokens && k < p->n_tokens; k++)
                FZ_CHECK(p->tokens[k] >= 0 && p->tokens[k] < n_vocab, "token id %d", p->tokens[k]);
            const cJSON *src = cJSON_IsString(pr) ? pr : cJSON_GetArrayItem(pr, i);
            if (p->text) FZ_CHECK(cJSON_IsString(src) && strlen(p->text) == strlen(src->valuestring), "prompt %d length", i);
        }
    } else {
        FZ_CHECK(g.n_msgs >= 1, "n_msgs");
        for (int32_t i = 0; i < g.n_msgs; i++) FZ_CHECK(g.msgs[i].role && g.msgs[i].content, "message %d", i);
    }
    /* the strict pass accepted the body (parse_gen runs it first) */
    srv_json_check_result cr;
    FZ_CHECK(srv_json_check(body, len, SRV_JSON_CHECK_MAX_DEPTH, &cr) == 0,
             "parse_gen accepted what the check refuses");
    cJSON_Delete(root);
    srv_api_gen_free(&g);
}

static void check_route(const char *path, const char *body, size_t len) {
    kvs_buf req = {0};
    kvs_buf_printf(&req, "POST %s HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n", path, len);
    kvs_buf_append(&req, body, len);
    FZ_CHECK(!req.oom, "out of memory");
    kvs_buf out = {0};
    fz_http_exchange(&G->loop, G->h, (const uint8_t *)req.data, req.len, 0, false, &out);
    kvs_buf_free(&req);
    FZ_CHECK(out.len > 12 && !memcmp(out.data, "HTTP/1.1 ", 9), "no answer");
    int status = atoi(out.data + 9);
    FZ_CHECK(status == 200 || status == 400, "status %d", status);
    const char *b = strstr(out.data, "\r\n\r\n");
    FZ_CHECK(b, "no header end");
    b += 4;
    cJSON *o = cJSON_Parse(b);
    FZ_CHECK(o, "answer is not JSON: %s", b);
    if (status == 200 && !strcmp(path, "/tokenize")) {
        cJSON *in = cJSON_ParseWithLength(body, len);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(in, "content");
        FZ_CHECK(cJSON_IsString(content), "tokenize answered 200 without a string content");
        int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(o, "tokens"));
        FZ_CHECK((size_t)n == strlen(content->valuestring), "%d tokens for %zu bytes of content", n,
                 strlen(content->valuestring));
        cJSON_Delete(in);
    }
    if (status == 200 && !strcmp(path, "/detokenize"))
        FZ_CHECK(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "content")), "detokenize answer without content");
    if (status == 400) FZ_CHECK(cJSON_GetObjectItemCaseSensitive(o, "error"), "400 without an error object");
    cJSON_Delete(o);
    kvs_buf_free(&out);
    FZ_CHECK(srv_http_body_bytes(G->h) == 0, "body bytes left");
}

static int stored(void *ud, const char *id, cJSON **msgs) {
    (void)ud;
    if (strcmp(id, "resp_x")) return -1;
    *msgs = cJSON_Parse("[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\","
                        "\"tool_calls\":[{\"id\":\"call_x\",\"type\":\"function\",\"function\":{\"name\":"
                        "\"f\",\"arguments\":\"{}\"}}]}]");
    return *msgs ? 0 : -2;
}

static void check_responses(const char *body, size_t len, int32_t n_vocab) {
    srv_api_error e;
    memset(&e, 0, sizeof e);
    if (srv_api_check_json(body, len, &e) != SRV_API_OK) return;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) return;
    srv_responses_map_req q;
    int r = srv_responses_map_parse(root, stored, NULL, &q, &e);
    cJSON_Delete(root);
    if (r != 0) {
        FZ_CHECK(r == SRV_API_ERR_INVALID, "srv_responses_map_parse returned %d", r);
        FZ_CHECK((e.status == 400 || (e.status == 404 && !strcmp(e.param, "previous_response_id"))) && e.message[0],
                 "error status %d param '%s' message '%s'", e.status, e.param, e.message);
        FZ_CHECK(!q.chat && !q.conv && !q.tools, "left allocated after a failure");
        return;
    }
    FZ_CHECK(q.chat && q.conv && q.tools && q.tool_choice && q.text_format, "a field missing after success");
    int n_conv = cJSON_GetArraySize(q.conv);
    FZ_CHECK(n_conv >= 1, "no conversation");
    srv_api_limits lim;
    srv_api_limits_default(&lim);
    lim.n_vocab = n_vocab;
    srv_api_gen g;
    memset(&e, 0, sizeof e);
    r = srv_api_parse_gen_json(SRV_API_CHAT, q.chat, &lim, &g, &e);
    if (r == SRV_API_OK) {
        FZ_CHECK(g.n_msgs == n_conv + (q.instructions ? 1 : 0), "%d messages for %d + instructions", g.n_msgs, n_conv);
        FZ_CHECK(g.max_tokens == q.max_output, "max_tokens %d, max_output_tokens %d", g.max_tokens, q.max_output);
        FZ_CHECK(g.chat && g.chat->parallel_tool_calls == q.parallel_tool_calls, "parallel_tool_calls");
        srv_api_gen_free(&g);
    } else {
        FZ_CHECK(r == SRV_API_ERR_INVALID && e.status == 400 && e.message[0], "chat parse %d status %d", r, e.status);
    }
    srv_responses_map_req_free(&q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!G) LLVMFuzzerInitialize(NULL, NULL);
    if (size < 2) return 0;
    const char *body = (const char *)data + 2;
    size_t len = size - 2;
    int32_t n_vocab = 1 + data[1];
    switch (data[0] % 5) {
    case 0: check_gen(SRV_API_COMPLETION, body, len, n_vocab); break;
    case 1: check_gen(SRV_API_CHAT, body, len, n_vocab); break;
    case 2: check_route("/tokenize", body, len); break;
    case 3: check_route("/detokenize", body, len); break;
    case 4: check_responses(body, len, n_vocab); break;
    }
    return 0;
}
