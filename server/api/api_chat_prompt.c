/* api_chat_prompt.c: a chat request's prompt tokens: the template's rendering tokenized piecewise, message
 * contents as plain text (special-token parsing off) and the template's own text with it on; a final
 * assistant message continued (see api_gen_internal.h, chat_internal.h). The built-in families get the tools and
 * the tool-call history written into the messages in the model's tool format (tool_format_internal.h). Runs in
 * the preparation (api_prepare.c), off the loop. */
#include "server/api/api_gen_internal.h"

#include <stdlib.h>
#include <string.h>

#include "server/api/chat_internal.h"
#include "server/api/tool_format_internal.h"

/* Appends the tokens of text[0..len) to *b (an int32_t array as bytes). */
static int add_piece(srv_api *api, kvs_buf *b, const char *text, size_t len, bool add_special, bool parse_special) {
    if (len == 0 && !add_special) return 0;
    int32_t *t = NULL, n = 0;
    int r = api_tokenize(api, text, len, add_special, parse_special, &t, &n);
    if (r != 0) return r;
    if (add_special && len == 0 && n > 1) n = 1; /* only the BOS the model adds, not an EOS */
    r = kvs_buf_append(b, t, (size_t)n * sizeof *t);
    free(t);
    return r;
}

/* Tokenizes text with spans[] as plain text (unless the server parses specials everywhere). */
static int tokenize_spans(srv_api *api, const char *text, size_t len, const tpl_span *spans, size_t n_spans,
                          bool add_bos, int32_t **toks, int32_t *n) {
    kvs_buf b = {0};
    int r = 0;
    if (api->parse_special_in_content) {
        r = add_piece(api, &b, text, len, add_bos, true);
    } else {
        if (add_bos) r = add_piece(api, &b, "", 0, true, false);
        size_t pos = 0;
        for (size_t i = 0; r == 0 && i <= n_spans; i++) {
            size_t s = i < n_spans ? spans[i].off : len, e = i < n_spans ? s + spans[i].len : len;
            if (s > pos) r = add_piece(api, &b, text + pos, s - pos, false, true);
            if (r == 0 && e > s) r = add_piece(api, &b, text + s, e - s, false, false);
            pos = e;
        }
    }
    if (r != 0) { kvs_buf_free(&b); return r; }
    *n = (int32_t)(b.len / sizeof(int32_t));
    *toks = (int32_t *)(void *)b.data;
    if (!*toks && !(*toks = malloc(sizeof **toks))) return KVS_ERR_NOMEM;
    return 0;
}

static bool starts_with(const char *s, size_t len, const char *p) {
    size_t pl = p ? strlen(p) : 0;
    return pl > 0 && pl <= len && !memcmp(s, p, pl);
}

static void free_msgs(srv_api_msg *m, int32_t n) {
    for (int32_t i = 0; m && i < n; i++) { free(m[i].role); free(m[i].content); }
    free(m);
}

static bool has_tool_history(const cJSON *messages) {
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (cJSON_GetObjectItemCaseSensitive(m, "tool_calls") || (cJSON_IsString(role) && !strcmp(role->valuestring, "tool")))
            return true;
    }
    return false;
}

/* The messages for a built-in family when tools are involved (it has no template to print them): the tools described in
 * the system message (one is added first when there is none), assistant tool_calls written as the model writes them,
 * tool results as its format shows them (server/api/tool_format_internal.h). *out NULL: no tools, the request's
 * messages serve as they are. 0 or KVS_ERR_NOMEM. */
static int tool_messages(srv_tool_format f, const srv_chat_req *r, srv_api_msg **out, int32_t *n_out) {
    *out = NULL;
    *n_out = 0;
    if (!r || r->tool_choice == SRV_CHAT_TOOL_CHOICE_NONE || (!r->tools && !has_tool_history(r->messages))) return 0;
    int32_t n = cJSON_GetArraySize(r->messages);
    const cJSON *first = r->messages->child;
    const cJSON *fr = first ? cJSON_GetObjectItemCaseSensitive(first, "role") : NULL;
    bool add_sys = r->tools && !(cJSON_IsString(fr) && !strcmp(fr->valuestring, "system"));
    srv_api_msg *m = calloc((size_t)n + 1, sizeof *m);
    if (!m) return KVS_ERR_NOMEM;
    int32_t k = 0;
    int rc = 0;
    kvs_buf b = {0};
    if (add_sys) {
        rc = srv_tool_format_prompt(f, r->tools, &b);
        m[k].role = strdup("system");
        m[k].content = kvs_buf_take(&b);
        if (!m[k].role || !m[k].content) rc = KVS_ERR_NOMEM;
        k++;
    }
    const cJSON *msg;
    cJSON_ArrayForEach(msg, r->messages) {
        if (rc) break;
        kvs_buf_clear(&b);
        const char *role = cJSON_GetObjectItemCaseSensitive(msg, "role")->valuestring;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
        const char *text = cJSON_IsString(content) ? content->valuestring : "";
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
        if (msg == first && r->tools && !add_sys) { /* the system message, then the tools */
            kvs_buf_puts(&b, text);
            if (text[0]) kvs_buf_puts(&b, "\n\n");
            rc = srv_tool_format_prompt(f, r->tools, &b);
        } else if (!strcmp(role, "tool")) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(msg, "name");
            rc = srv_tool_format_result_text(f, cJSON_IsString(nm) ? nm->valuestring : NULL, text, &role, &b);
        } else if (calls && cJSON_GetArraySize(calls) > 0) {
            kvs_buf_puts(&b, text);
            if (text[0]) kvs_buf_putc(&b, '\n');
            rc = srv_tool_format_calls_text(f, calls, &b);
        } else {
            kvs_buf_puts(&b, text);
        }
        m[k].role = strdup(role);
        m[k].content = kvs_buf_take(&b);
        if (!m[k].role || !m[k].content) rc = KVS_ERR_NOMEM;
        k++;
    }
    kvs_buf_free(&b);
    if (rc) { free_msgs(m, k); return KVS_ERR_NOMEM; }
    *out = m;
    *n_out = k;
    return 0;
}

/* The built-in families (no Jinja template): chat_render, content found in order; a prefill is rendered as
 * the turns before it with a generation prompt, then its content. */
static int fallback_prompt(srv_api *api, srv_api_gen *g, int32_t **toks, int32_t *n, srv_api_error *e) {
    srv_api_msg *tm = NULL;
    int32_t n_tm = 0;
    if (tool_messages(api->be.tool_format, g->chat, &tm, &n_tm) != 0) goto oom;
    const srv_api_msg *msgs = tm ? tm : g->msgs;
    int32_t n_msgs = tm ? n_tm : g->n_msgs;
    bool prefill = g->chat && g->chat->prefill && n_msgs > 1;
    int32_t nm = prefill ? n_msgs - 1 : n_msgs;
    eng_chat_msg *m = calloc((size_t)nm, sizeof *m);
    if (!m) goto oom;
    for (int32_t k = 0; k < nm; k++) { m[k].role = msgs[k].role; m[k].content = msgs[k].content; }
    char *text = NULL;
    int r = api->be.chat_render(api->be.ctx, m, (size_t)nm, &text);
    free(m);
    if (r != 0) {
        free_msgs(tm, n_tm);
        srv_api_set_error(e, r == ENG_ERR_NOMEM ? 500 : 400, r == ENG_ERR_NOMEM ? "server_error" : NULL,
                          "messages", NULL, "the messages could not be rendered with the chat template: %s",
                          kvs_strerror(r));
        return -1;
    }
    size_t len = strlen(text);
    if (prefill) {
        const char *pc = msgs[n_msgs - 1].content;
        size_t pl = strlen(pc);
        char *t2 = realloc(text, len + pl + 1);
        if (!t2) { free(text); goto oom; }
        text = t2;
        memcpy(text + len, pc, pl + 1);
        len += pl;
    }
    tpl_span *spans = NULL;
    size_t ns = 0;
    r = srv_chat_find_spans(text, len, msgs, n_msgs, &spans, &ns);
    if (r == 0) r = tokenize_spans(api, text, len, spans, ns, true, toks, n);
    free(spans);
    free(text);
    free_msgs(tm, n_tm);
    tm = NULL;
    if (r == KVS_ERR_NOMEM) goto oom;
    if (r != 0) { srv_api_set_error(e, 500, "server_error", NULL, NULL, "tokenization failed"); return -1; }
    return 0;
oom:
    free_msgs(tm, n_tm);
    srv_api_set_nomem(e);
    return -1;
}

int api_chat_prompt(srv_api *api, api_call *c, int32_t **toks, int32_t *n, srv_api_error *e) {
    srv_api_gen *g = &c->gen;
    const tpl_template *t = api->be.chat_tpl;
    if (!t || !g->chat) return fallback_prompt(api, g, toks, n, e);
    tpl_output o;
    g->chat->render_ms = api->limits.template_ms;
    g->chat->render_bytes = api->limits.template_bytes;
    g->chat->cancel = &c->job.cancel;
    if (srv_chat_render(t, g->chat, api->be.bos_text, api->be.eos_text, &o, e) != 0) return -1;
    /* the template may print BOS itself (as special-token text); else the model adds it as it says */
    bool add_bos = !starts_with(o.text, o.len, api->be.bos_text);
    c->rsn_open = srv_reasoning_prompt_open(o.text, o.len); /* the generation prompt opened <think> */
    int r = tokenize_spans(api, o.text, o.len, o.spans, o.n_spans, add_bos, toks, n);
    tpl_output_free(&o);
    if (r != 0) {
        srv_api_set_error(e, 500, "server_error", NULL, NULL, r == KVS_ERR_NOMEM ? "out of memory" : "tokenization failed");
        return -1;
    }
    return 0;
}
