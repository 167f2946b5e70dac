/* tool_call.c: tool calls in generated text (see tool_call_internal.h). */
#include "server/api/tool_call_internal.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/common.h"

static const char *const MARKERS[] = {"<tool_call>", "[TOOL_CALLS]", "<|python_tag|>"};
enum { MK_HERMES = 0, MK_MISTRAL = 1, MK_PYTHON = 2, N_MARKERS = 3 };

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static const char *find_bytes(const char *h, size_t hl, const char *n, size_t nl) {
    if (nl == 0 || hl < nl) return NULL;
    for (size_t i = 0; i + nl <= hl; i++)
        if (h[i] == n[0] && !memcmp(h + i, n, nl)) return h + i;
    return NULL;
}

void srv_tool_call_result_free(srv_tool_call_result *r) {
    if (!r) return;
    for (int i = 0; i < r->n_calls; i++) { free(r->calls[i].name); free(r->calls[i].arguments); }
    free(r->calls);
    memset(r, 0, sizeof *r);
}

/* Parses one JSON value at s[0..len) (leading JSON whitespace skipped); *used: bytes consumed. NULL when none. */
static cJSON *parse_value(const char *s, size_t len, size_t *used) {
    size_t i = 0;
    while (i < len && is_ws(s[i])) i++;
    /* cJSON skips every byte <= 0x20 before a value, NULs included; only JSON's own whitespace may precede one
     * here, as srv_tool_call_stream_safe assumes (a NUL-led text is content, never a call) */
    if (i == len || (unsigned char)s[i] <= 0x20) return NULL;
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(s + i, len - i, &end, false);
    if (!v) return NULL;
    *used = (size_t)(end - s);
    return v;
}

/* Adds the call described by object o ({name, arguments|parameters} or {function: {...}}). -1: not a call. */
static int add_call(srv_tool_call_result *r, const cJSON *o) {
    if (!cJSON_IsObject(o)) return -1;
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(o, "function");
    if (cJSON_IsObject(fn)) o = fn;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!cJSON_IsString(name) || !name->valuestring[0]) return -1;
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    cJSON *parsed = NULL;
    if (cJSON_IsString(args)) { /* arguments as a JSON string holding an object */
        parsed = cJSON_Parse(args->valuestring);
        if (!cJSON_IsObject(parsed)) { cJSON_Delete(parsed); return -1; }
        args = parsed;
    }
    if (args && !cJSON_IsObject(args) && !cJSON_IsNull(args)) return -1;
    char *a = (args && cJSON_IsObject(args)) ? cJSON_PrintUnformatted(args) : strdup("{}");
    cJSON_Delete(parsed);
    char *n = strdup(name->valuestring);
    srv_tool_call *c = realloc(r->calls, (size_t)(r->n_calls + 1) * sizeof *c);
    if (!a || !n || !c) { free(a); free(n); if (c) r->calls = c; return -2; }
    r->calls = c;
    c[r->n_calls].name = n;
    c[r->n_calls].arguments = a;
    r->n_calls++;
    return 0;
}

/* A value that is a call or an array of calls (or {"tool_calls": [...]}). */
static int add_calls(srv_tool_call_result *r, const cJSON *v) {
    const cJSON *tc = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "tool_calls") : NULL;
    if (cJSON_IsArray(tc)) v = tc;
    if (cJSON_IsArray(v)) {
        if (!v->child) return -1;
        for (const cJSON *it = v->child; it; it = it->next) {
            int e = add_call(r, it);
            if (e) return e;
        }
        return 0;
    }
    return add_call(r, v);
}

/* The call(s) in the JSON value at t[0..len): 0 and *used, -1 (no JSON or not calls), -2 (no memory). */
static int take_calls(srv_tool_call_result *r, const char *t, size_t len, size_t *used) {
    cJSON *v = parse_value(t, len, used);
    if (!v) return -1;
    int e = add_calls(r, v);
    cJSON_Delete(v);
    return e;
}

static bool only_ws(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++) if (!is_ws(s[i])) return false;
    return true;
}

/* The calls after a marker at text[off]; the rest of the text must be nothing but calls. */
static int parse_after(const char *t, size_t len, int mk, size_t off, srv_tool_call_result *r) {
    size_t p = off;
    if (mk == MK_HERMES) {
        static const char open[] = "<tool_call>", close[] = "</tool_call>";
        for (;;) {
            while (p < len && is_ws(t[p])) p++;
            if (p == len) return r->n_calls > 0 ? 0 : -1;
            if (len - p < sizeof open - 1 || memcmp(t + p, open, sizeof open - 1)) return -1;
            p += sizeof open - 1;
            size_t used = 0;
            int e = take_calls(r, t + p, len - p, &used);
            if (e) return e;
            p += used;
            while (p < len && is_ws(t[p])) p++;
            if (p == len) return 0; /* the closing tag may be the stop sequence */
            if (len - p < sizeof close - 1 || memcmp(t + p, close, sizeof close - 1)) return -1;
            p += sizeof close - 1;
        }
    }
    p += strlen(MARKERS[mk]);
    if (mk == MK_MISTRAL) {
        size_t used = 0;
        int e = take_calls(r, t + p, len - p, &used);
        if (e) return e;
        return only_ws(t + p + used, len - p - used) ? 0 : -1;
    }
    /* <|python_tag|>: JSON calls separated by ';', or code for the built-in python tool */
    size_t q = p;
    for (;;) {
        size_t used = 0;
        if (take_calls(r, t + q, len - q, &used)) break;
        q += used;
        while (q < len && is_ws(t[q])) q++;
        if (q == len) return 0;
        if (t[q] != ';') break;
        q++;
    }
    /* not JSON calls: the code itself */
    for (int i = 0; i < r->n_calls; i++) { free(r->calls[i].name); free(r->calls[i].arguments); }
    r->n_calls = 0;
    while (p < len && is_ws(t[p])) p++;
    size_t e = len;
    while (e > p && is_ws(t[e - 1])) e--;
    if (e == p) return -1;
    cJSON *o = cJSON_CreateObject(), *a = cJSON_CreateObject();
    char *code = malloc(e - p + 1);
    if (!o || !a || !code) { cJSON_Delete(o); cJSON_Delete(a); free(code); return -2; }
    memcpy(code, t + p, e - p);
    code[e - p] = 0;
    cJSON_AddItemToObject(o, "arguments", a);
    cJSON_AddStringToObject(o, "name", "python");
    int rc = cJSON_AddStringToObject(a, "code", code) ? add_call(r, o) : -2;
    free(code);
    cJSON_Delete(o);
    return rc;
}

int srv_tool_call_parse(const char *text, size_t len, srv_tool_call_result *out) {
    if (!out) return KVS_ERR_INVALID;
    memset(out, 0, sizeof *out);
    out->content_len = len;
    if (!text && len > 0) return KVS_ERR_INVALID;
    if (len == 0) return 0;
    /* the first marker */
    size_t best = len;
    int mk = -1;
    for (int k = 0; k < N_MARKERS; k++) {
        const char *f = find_bytes(text, len, MARKERS[k], strlen(MARKERS[k]));
        if (f && (size_t)(f - text) < best) { best = (size_t)(f - text); mk = k; }
    }
    int e = -1;
    if (mk >= 0) {
        e = parse_after(text, len, mk, best, out);
        if (e == 0) {
            while (best > 0 && is_ws(text[best - 1])) best--;
            out->content_len = best;
        }
    } else {
        size_t used = 0;
        cJSON *v = parse_value(text, len, &used);
        if (v && (cJSON_IsObject(v) || cJSON_IsArray(v)) && only_ws(text + used, len - used)) e = add_calls(out, v);
        cJSON_Delete(v);
        if (e == 0) out->content_len = 0;
    }
    if (e == -2) { srv_tool_call_result_free(out); out->content_len = len; return KVS_ERR_NOMEM; }
    if (e != 0) { srv_tool_call_result_free(out); out->content_len = len; }
    return 0;
}

size_t srv_tool_call_stream_safe(const char *text, size_t len, size_t from, bool *held) {
    if (held) *held = false;
    if (!text || from > len) return 0;
    if (from == 0) {
        size_t i = 0;
        while (i < len && is_ws(text[i])) i++;
        if (i == len) return 0;
        if (text[i] == '{' || text[i] == '[') { /* "[" may also start "[TOOL_CALLS]": nothing is sure */
            if (held) *held = true;
            return 0;
        }
    }
    /* no marker starts before `from`: that prefix was content, and what followed it then was whitespace or a
     * partial marker */
    size_t safe = len;
    for (int k = 0; k < N_MARKERS; k++) {
        size_t ml = strlen(MARKERS[k]);
        const char *f = find_bytes(text + from, len - from, MARKERS[k], ml);
        if (f && (size_t)(f - text) < safe) { safe = (size_t)(f - text); if (held) *held = true; }
        /* a trailing partial marker */
        for (size_t l = ml - 1; l > 0; l--) {
            if (l <= len - from && !memcmp(text + len - l, MARKERS[k], l)) {
                if (len - l < safe) safe = len - l;
                break;
            }
        }
    }
    while (safe > 0 && is_ws(text[safe - 1])) safe--;
    return safe;
}

int srv_tool_call_parse_first(const char *text, size_t len, bool parallel, srv_tool_call_result *out) {
    int rc = srv_tool_call_parse(text, len, out);
    while (!rc && !parallel && out->n_calls > 1) {
        out->n_calls--;
        free(out->calls[out->n_calls].name);
        free(out->calls[out->n_calls].arguments);
    }
    return rc;
}
