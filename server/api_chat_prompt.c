/* api_chat_prompt.c: a chat request's prompt tokens: the template's rendering tokenized piecewise, message
 * contents as plain text (special-token parsing off) and the template's own text with it on; a final
 * assistant message continued (see api_internal.h, api_chat.h). Runs in prepare_work, off the loop. */
#include "server/api_chat.h"
#include "server/api_internal.h"

#include <stdlib.h>
#include <string.h>

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

/* The built-in families (no Jinja template): chat_render, content found in order; a prefill is rendered as
 * the turns before it with a generation prompt, then its content. */
static int fallback_prompt(srv_api *api, srv_api_gen *g, int32_t **toks, int32_t *n, srv_api_error *e) {
    bool prefill = g->chat && g->chat->prefill && g->n_msgs > 1;
    int32_t nm = prefill ? g->n_msgs - 1 : g->n_msgs;
    eng_chat_msg *m = calloc((size_t)nm, sizeof *m);
    if (!m) goto oom;
    for (int32_t k = 0; k < nm; k++) { m[k].role = g->msgs[k].role; m[k].content = g->msgs[k].content; }
    char *text = NULL;
    int r = api->be.chat_render(api->be.ctx, m, (size_t)nm, &text);
    free(m);
    if (r != 0) {
        srv_api_set_error(e, r == ENG_ERR_NOMEM ? 500 : 400, r == ENG_ERR_NOMEM ? "server_error" : NULL,
                          "messages", NULL, "the messages could not be rendered with the chat template: %s",
                          kvs_strerror(r));
        return -1;
    }
    size_t len = strlen(text);
    if (prefill) {
        const char *pc = g->msgs[g->n_msgs - 1].content;
        size_t pl = strlen(pc);
        char *t2 = realloc(text, len + pl + 1);
        if (!t2) { free(text); goto oom; }
        text = t2;
        memcpy(text + len, pc, pl + 1);
        len += pl;
    }
    tpl_span *spans = NULL;
    size_t ns = 0;
    r = srv_chat_find_spans(text, len, g->msgs, g->n_msgs, &spans, &ns);
    if (r == 0) r = tokenize_spans(api, text, len, spans, ns, true, toks, n);
    free(spans);
    free(text);
    if (r == KVS_ERR_NOMEM) goto oom;
    if (r != 0) { srv_api_set_error(e, 500, "server_error", NULL, NULL, "tokenization failed"); return -1; }
    return 0;
oom:
    srv_api_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

int api_chat_prompt(srv_api *api, api_call *c, int32_t **toks, int32_t *n, srv_api_error *e) {
    srv_api_gen *g = &c->gen;
    const tpl_template *t = api->be.chat_tpl;
    if (!t || !g->chat) return fallback_prompt(api, g, toks, n, e);
    tpl_output o;
    if (srv_chat_render(t, g->chat, api->be.bos_text, api->be.eos_text, &o, e) != 0) return -1;
    /* the template may print BOS itself (as special-token text); else the model adds it as it says */
    bool add_bos = !starts_with(o.text, o.len, api->be.bos_text);
    int r = tokenize_spans(api, o.text, o.len, o.spans, o.n_spans, add_bos, toks, n);
    tpl_output_free(&o);
    if (r != 0) {
        srv_api_set_error(e, 500, "server_error", NULL, NULL, r == KVS_ERR_NOMEM ? "out of memory" : "tokenization failed");
        return -1;
    }
    return 0;
}
