/* reasoning.c: reasoning output: which syntax a chat template thinks in, and the streaming split of a model's
 * output into reasoning and content (see reasoning_internal.h and api.h). */
#include "server/api/reasoning_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

static const char OPEN[] = "<think>", CLOSE[] = "</think>";
#define OPEN_LEN (sizeof OPEN - 1)
#define CLOSE_LEN (sizeof CLOSE - 1)
static const char H_MSG[] = "<|message|>", H_CHAN[] = "<|channel|>";
static const char *const H_ENDS[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};
enum { N_H_ENDS = 4, H_HEADER_MAX = 512 };

/* THINK states */
enum { T_START, T_OPEN, T_IN, T_AFTER, T_CONTENT };
/* HARMONY states and sinks */
enum { H_START = 16, H_HEADER, H_BODY, H_PLAIN };
enum { SINK_REASON, SINK_CONTENT, SINK_CALL };

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static const char *find(const char *h, size_t hl, const char *n, size_t nl) {
    if (nl == 0 || hl < nl) return NULL;
    for (size_t i = 0; i + nl <= hl; i++)
        if (h[i] == n[0] && !memcmp(h + i, n, nl)) return h + i;
    return NULL;
}

/* ---- the public part (api.h) ------------------------------------------------------------------------------ */
srv_reasoning_syntax srv_reasoning_detect(const char *t) {
    if (!t) return SRV_REASONING_OFF;
    if (strstr(t, H_CHAN) && strstr(t, "analysis")) return SRV_REASONING_HARMONY;
    if (strstr(t, OPEN) || strstr(t, CLOSE)) return SRV_REASONING_THINK;
    return SRV_REASONING_OFF;
}

const char *srv_reasoning_syntax_name(srv_reasoning_syntax s) {
    return s == SRV_REASONING_THINK ? "think" : s == SRV_REASONING_HARMONY ? "harmony" : "off";
}

int srv_reasoning_format_from_name(const char *name, srv_reasoning_format *out) {
    static const char *const N[] = {"auto", "deepseek", "none"};
    for (int i = 0; name && i < 3; i++)
        if (!strcmp(name, N[i])) { *out = (srv_reasoning_format)i; return 0; }
    return KVS_ERR_INVALID;
}

const char *srv_reasoning_format_name(srv_reasoning_format f) {
    return f == SRV_REASONING_FORMAT_DEEPSEEK ? "deepseek" : f == SRV_REASONING_FORMAT_NONE ? "none" : "auto";
}

srv_reasoning_syntax srv_reasoning_effective(srv_reasoning_format f, srv_reasoning_syntax tmpl) {
    if (f == SRV_REASONING_FORMAT_NONE) return SRV_REASONING_OFF;
    if (f == SRV_REASONING_FORMAT_DEEPSEEK && tmpl == SRV_REASONING_OFF) return SRV_REASONING_THINK;
    return tmpl;
}

bool srv_reasoning_prompt_open(const char *prompt, size_t len) {
    if (!prompt) return false;
    while (len > 0 && is_ws(prompt[len - 1])) len--;
    return len >= OPEN_LEN && !memcmp(prompt + len - OPEN_LEN, OPEN, OPEN_LEN);
}

/* ---- the parser ------------------------------------------------------------------------------------------- */
void srv_reasoning_init(srv_reasoning *p, srv_reasoning_syntax syntax, bool open) {
    memset(p, 0, sizeof *p);
    p->syntax = syntax;
    if (syntax == SRV_REASONING_THINK) p->state = open ? T_OPEN : T_START;
    else if (syntax == SRV_REASONING_HARMONY) p->state = H_START;
    p->saw_reasoning = syntax == SRV_REASONING_THINK && open;
}

void srv_reasoning_free(srv_reasoning *p) {
    if (!p) return;
    kvs_buf_free(&p->pend);
    kvs_buf_free(&p->call);
    free(p->call_name);
    p->call_name = NULL;
}

/* Drops the first n bytes of pend. */
static void drop(kvs_buf *b, size_t n) {
    if (n >= b->len) { b->len = 0; if (b->data) b->data[0] = 0; return; }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

/* The length of the longest proper prefix of m (length ml) that ends s[0..n). */
static size_t partial(const char *s, size_t n, const char *m, size_t ml) {
    for (size_t l = ml - 1; l > 0; l--)
        if (l <= n && !memcmp(s + n - l, m, l)) return l;
    return 0;
}

/* Whether s[0..n) is a proper prefix of m (n < ml), the empty string included. */
static bool prefix_of(const char *s, size_t n, const char *m, size_t ml) { return n < ml && !memcmp(s, m, n); }

/* Reasoning text: leading whitespace of the block is dropped. */
static int put_reason(srv_reasoning *p, kvs_buf *r, const char *s, size_t n) {
    if (!p->r_started) {
        while (n > 0 && is_ws(*s)) { s++; n--; }
        if (n == 0) return 0;
        p->r_started = true;
    }
    return kvs_buf_append(r, s, n);
}

/* THINK: one pass over pend; 1 when the state changed and another pass may take more. */
static int think_step(srv_reasoning *p, bool final, kvs_buf *r, kvs_buf *c, int *rc) {
    kvs_buf *b = &p->pend;
    const char *s = b->data ? b->data : "";
    size_t n = b->len, i = 0;
    switch (p->state) {
    case T_START:
    case T_OPEN:
        while (i < n && is_ws(s[i])) i++;
        if (n - i >= OPEN_LEN && !memcmp(s + i, OPEN, OPEN_LEN)) {
            drop(b, i + OPEN_LEN);
            p->state = T_IN;
            p->saw_reasoning = true;
            return 1;
        }
        if (!final && prefix_of(s + i, n - i, OPEN, OPEN_LEN)) return 0;
        p->state = p->state == T_OPEN ? T_IN : T_CONTENT;
        return 1;
    case T_IN: {
        const char *f = find(s, n, CLOSE, CLOSE_LEN);
        size_t k = f ? (size_t)(f - s) : final ? n : n - partial(s, n, CLOSE, CLOSE_LEN);
        size_t e = k;
        while (e > 0 && is_ws(s[e - 1])) e--; /* trailing whitespace: dropped at the end, else held */
        *rc = put_reason(p, r, s, e);
        if (f) { drop(b, k + CLOSE_LEN); p->state = T_AFTER; return 1; }
        drop(b, final ? n : e);
        return 0;
    }
    case T_AFTER:
        while (i < n && is_ws(s[i])) i++;
        drop(b, i);
        if (b->len == 0) return 0;
        p->state = T_CONTENT;
        return 1;
    default: /* T_CONTENT */
        *rc = kvs_buf_append(c, s, n);
        drop(b, n);
        return 0;
    }
}

/* HARMONY: a message's header s[0..n) (without <|message|>) decides where its body goes. */
static int harmony_header(srv_reasoning *p, const char *s, size_t n) {
    char chan[32] = "", to[256] = "";
    const char *f = find(s, n, H_CHAN, sizeof H_CHAN - 1);
    if (f) {
        size_t i = (size_t)(f - s) + sizeof H_CHAN - 1, k = 0;
        while (i < n && !is_ws(s[i]) && s[i] != '<' && k + 1 < sizeof chan) chan[k++] = s[i++];
        chan[k] = 0;
    }
    const char *t = find(s, n, "to=", 3);
    if (t && (t == s || is_ws(t[-1]))) {
        size_t i = (size_t)(t - s) + 3, k = 0;
        while (i < n && !is_ws(s[i]) && s[i] != '<' && k + 1 < sizeof to) to[k++] = s[i++];
        to[k] = 0;
    }
    free(p->call_name);
    p->call_name = NULL;
    if (to[0]) {
        const char *name = strncmp(to, "functions.", 10) ? to : to + 10;
        if (!name[0]) name = to;
        if (!(p->call_name = strdup(name))) return KVS_ERR_NOMEM;
        kvs_buf_clear(&p->call);
        p->sink = SINK_CALL;
    } else if (!strcmp(chan, "analysis")) {
        p->sink = SINK_REASON;
        p->saw_reasoning = true;
    } else {
        p->sink = SINK_CONTENT;
    }
    return 0;
}

/* HARMONY: the end of a tool call's message: the call as Hermes text onto the content. */
static int harmony_call_end(srv_reasoning *p, kvs_buf *c) {
    const char *a = p->call.data ? p->call.data : "";
    size_t b = 0, e = p->call.len;
    while (b < e && is_ws(a[b])) b++;
    while (e > b && is_ws(a[e - 1])) e--;
    cJSON *nm = cJSON_CreateString(p->call_name ? p->call_name : "");
    char *name = nm ? cJSON_PrintUnformatted(nm) : NULL;
    cJSON_Delete(nm);
    if (!name) return KVS_ERR_NOMEM;
    kvs_buf_puts(c, "<tool_call>{\"name\": ");
    kvs_buf_puts(c, name);
    kvs_buf_puts(c, ", \"arguments\": ");
    if (e > b) kvs_buf_append(c, a + b, e - b);
    else kvs_buf_puts(c, "{}");
    int rc = kvs_buf_puts(c, "}</tool_call>");
    free(name);
    kvs_buf_clear(&p->call);
    return c->oom ? KVS_ERR_NOMEM : rc;
}

static int harmony_put(srv_reasoning *p, kvs_buf *r, kvs_buf *c, const char *s, size_t n) {
    if (n == 0) return 0;
    if (p->sink == SINK_REASON) return kvs_buf_append(r, s, n);
    if (p->sink == SINK_CALL) return kvs_buf_append(&p->call, s, n);
    return kvs_buf_append(c, s, n);
}

static int harmony_step(srv_reasoning *p, bool final, kvs_buf *r, kvs_buf *c, int *rc) {
    kvs_buf *b = &p->pend;
    const char *s = b->data ? b->data : "";
    size_t n = b->len;
    switch (p->state) {
    case H_START:
        if (!final && prefix_of(s, n, "<|", 2)) return 0;
        p->state = n >= 2 && !memcmp(s, "<|", 2) ? H_HEADER : H_PLAIN;
        return 1;
    case H_HEADER: {
        const char *f = find(s, n, H_MSG, sizeof H_MSG - 1);
        if (!f) {
            if (n > H_HEADER_MAX) { p->state = H_PLAIN; return 1; }
            if (final) drop(b, n); /* a header cut off by the end: no text */
            return 0;
        }
        *rc = harmony_header(p, s, (size_t)(f - s));
        drop(b, (size_t)(f - s) + sizeof H_MSG - 1);
        p->state = H_BODY;
        return *rc == 0;
    }
    case H_BODY: {
        size_t k = n, tl = 0, hold = 0;
        int which = -1;
        for (int i = 0; i < N_H_ENDS; i++) {
            size_t ml = strlen(H_ENDS[i]);
            const char *f = find(s, n, H_ENDS[i], ml);
            if (f && (size_t)(f - s) < k) { k = (size_t)(f - s); tl = ml; which = i; }
            size_t h = partial(s, n, H_ENDS[i], ml);
            if (h > hold) hold = h;
        }
        if (which < 0 && !final) k = n - hold;
        *rc = harmony_put(p, r, c, s, k);
        if (which < 0 && !final) { drop(b, k); return 0; }
        if (*rc == 0 && p->sink == SINK_CALL) *rc = harmony_call_end(p, c);
        /* "<|start|>" begins the next header: only the marker itself is dropped */
        drop(b, k + tl);
        p->state = H_HEADER;
        p->sink = SINK_CONTENT;
        return *rc == 0 && which >= 0;
    }
    default: /* H_PLAIN */
        *rc = kvs_buf_append(c, s, n);
        drop(b, n);
        return 0;
    }
}

static int run(srv_reasoning *p, bool final, kvs_buf *r, kvs_buf *c) {
    int rc = 0;
    if (p->syntax == SRV_REASONING_OFF) {
        rc = kvs_buf_append(c, p->pend.data, p->pend.len);
        drop(&p->pend, p->pend.len);
        return rc;
    }
    for (int more = 1; more && rc == 0;)
        more = p->syntax == SRV_REASONING_THINK ? think_step(p, final, r, c, &rc) : harmony_step(p, final, r, c, &rc);
    return rc;
}

int srv_reasoning_feed(srv_reasoning *p, const char *text, size_t len, kvs_buf *reasoning, kvs_buf *content) {
    if (!p || !reasoning || !content || (!text && len)) return KVS_ERR_INVALID;
    if (len && kvs_buf_append(&p->pend, text, len)) return KVS_ERR_NOMEM;
    return run(p, false, reasoning, content);
}

bool srv_reasoning_inside(const srv_reasoning *p) {
    if (!p) return false;
    if (p->syntax == SRV_REASONING_THINK) return p->state == T_OPEN || p->state == T_IN;
    return p->syntax == SRV_REASONING_HARMONY && p->state == H_BODY && p->sink == SINK_REASON;
}

int srv_reasoning_finish(srv_reasoning *p, kvs_buf *reasoning, kvs_buf *content) {
    if (!p || !reasoning || !content) return KVS_ERR_INVALID;
    return run(p, true, reasoning, content);
}
