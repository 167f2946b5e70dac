/* json_check.c: strict JSON validation ahead of cJSON (see json_check_internal.h). */
#include "server/api/json_check_internal.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

#define DEPTH_CAP 4096   /* max_depth is clamped to this (the container stack lives on the C stack) */
#define NUMBER_MAX 63    /* longest number literal: cJSON reads at most 63 characters of one */

typedef struct scan {
    const unsigned char *s;
    size_t len, i;
    srv_json_check_result *res;
} scan;

static int fail(scan *sc, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(scan *sc, size_t at, const char *fmt, ...) {
    char what[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    sc->res->offset = at;
    snprintf(sc->res->message, sizeof sc->res->message, "%s at byte %zu", what, at);
    return KVS_ERR_FORMAT;
}

static void skip_ws(scan *sc) {
    while (sc->i < sc->len) {
        unsigned char c = sc->s[sc->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        sc->i++;
    }
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Reads "\uXXXX" at sc->i (the backslash); -1 when it is not one, else the code unit. */
static long read_u16(const scan *sc, size_t at) {
    if (at + 6 > sc->len || sc->s[at] != '\\' || sc->s[at + 1] != 'u') return -1;
    long v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(sc->s[at + 2 + (size_t)k]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* Length of the well-formed UTF-8 sequence at s[i] (first byte >= 0x80), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n, size_t i) {
    unsigned char c = s[i];
    size_t len;
    unsigned cp, min;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1Fu; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0Fu; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07u; min = 0x10000; }
    else return 0;
    if (i + len > n) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[i + k] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i + k] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

/* A string starting at sc->i (the opening quote); on success sc->i is past the closing quote. */
static int scan_string(scan *sc) {
    size_t start = sc->i++;
    size_t bytes = 0;
    while (sc->i < sc->len) {
        unsigned char c = sc->s[sc->i];
        if (c == '"') {
            sc->i++;
            sc->res->n_strings++;
            sc->res->string_bytes += bytes;
            return 0;
        }
        if (c < 0x20) return fail(sc, sc->i, "raw control character 0x%02X inside a string (escape it)", c);
        if (c >= 0x80) {
            size_t l = utf8_len(sc->s, sc->len, sc->i);
            if (!l) return fail(sc, sc->i, "invalid UTF-8 byte 0x%02X inside a string", c);
            sc->i += l;
            bytes += l;
            continue;
        }
        if (c != '\\') { sc->i++; bytes++; continue; }
        size_t at = sc->i;
        if (at + 1 >= sc->len) return fail(sc, at, "unterminated escape sequence");
        unsigned char e = sc->s[at + 1];
        if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
            sc->i += 2;
            bytes++;
            continue;
        }
        if (e != 'u') {
            if (e >= 0x20 && e < 0x7F) return fail(sc, at, "invalid escape '\\%c' in a string", e);
            return fail(sc, at, "invalid escape (backslash followed by byte 0x%02X) in a string", e);
        }
        long u = read_u16(sc, at);
        if (u < 0) return fail(sc, at, "invalid \\u escape (expected four hex digits after \\u)");
        if (u == 0) return fail(sc, at, "\\u0000 (NUL) is not allowed in request strings");
        if (u >= 0xDC00 && u <= 0xDFFF)
            return fail(sc, at, "lone UTF-16 low surrogate \\u%04lX (it must follow a high surrogate)", u);
        if (u >= 0xD800 && u <= 0xDBFF) {
            long lo = read_u16(sc, at + 6);
            if (lo < 0xDC00 || lo > 0xDFFF)
                return fail(sc, at, "lone UTF-16 high surrogate \\u%04lX (it must be followed by a \\u low "
                            "surrogate DC00-DFFF)", u);
            sc->i += 12;
            bytes += 4;
            continue;
        }
        sc->i += 6;
        bytes += u < 0x80 ? 1 : u < 0x800 ? 2 : 3;
    }
    return fail(sc, start, "unterminated string starting");
}

static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int scan_number(scan *sc) {
    size_t start = sc->i, i = sc->i, n = sc->len;
    const unsigned char *s = sc->s;
    if (s[i] == '-') i++;
    if (i >= n || !is_digit(s[i])) return fail(sc, start, "invalid number (a digit must follow '-')");
    if (s[i] == '0') {
        i++;
        if (i < n && is_digit(s[i])) return fail(sc, start, "invalid number (no leading zeros)");
    } else {
        while (i < n && is_digit(s[i])) i++;
    }
    if (i < n && s[i] == '.') {
        i++;
        if (i >= n || !is_digit(s[i])) return fail(sc, start, "invalid number (a digit must follow '.')");
        while (i < n && is_digit(s[i])) i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || !is_digit(s[i])) return fail(sc, start, "invalid number (a digit must follow the exponent)");
        while (i < n && is_digit(s[i])) i++;
    }
    if (i - start > NUMBER_MAX) return fail(sc, start, "number literal longer than %d characters", NUMBER_MAX);
    sc->i = i;
    return 0;
}

static int scan_literal(scan *sc) {
    static const char *const lits[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(lits[k]);
        if (sc->s[sc->i] == (unsigned char)lits[k][0]) {
            if (sc->len - sc->i < l || memcmp(sc->s + sc->i, lits[k], l))
                return fail(sc, sc->i, "invalid literal (expected '%s')", lits[k]);
            sc->i += l;
            return 0;
        }
    }
    return KVS_ERR_INVALID; /* not reached: callers dispatch on t, f, n */
}

static int unexpected(scan *sc, const char *expected) {
    if (sc->i >= sc->len) return fail(sc, sc->i, "unexpected end of the text (expected %s)", expected);
    unsigned char c = sc->s[sc->i];
    if (c >= 0x20 && c < 0x7F) return fail(sc, sc->i, "unexpected character '%c' (expected %s)", c, expected);
    return fail(sc, sc->i, "unexpected byte 0x%02X (expected %s)", c, expected);
}

int srv_json_check(const char *text, size_t len, int32_t max_depth, srv_json_check_result *res) {
    if (!res) return KVS_ERR_INVALID;
    memset(res, 0, sizeof *res);
    if (!text && len) {
        snprintf(res->message, sizeof res->message, "no text");
        return KVS_ERR_INVALID;
    }
    if (max_depth < 1) max_depth = 1;
    if (max_depth > DEPTH_CAP) max_depth = DEPTH_CAP;
    unsigned char stack[DEPTH_CAP]; /* '{' or '[' per open container */
    int32_t depth = 0;
    scan sc = {(const unsigned char *)(text ? text : ""), len, 0, res};
    enum { VALUE, AFTER, KEY } mode = VALUE;
    int r;
    for (;;) {
        skip_ws(&sc);
        if (mode == KEY) { /* after '{' or ',' in an object: a key string, ':' and then a value */
            if (sc.i >= sc.len || sc.s[sc.i] != '"') return unexpected(&sc, "a string key");
            if ((r = scan_string(&sc))) return r;
            skip_ws(&sc);
            if (sc.i >= sc.len || sc.s[sc.i] != ':') return unexpected(&sc, "':' after the key");
            sc.i++;
            mode = VALUE;
            continue;
        }
        if (mode == AFTER) {
            if (depth == 0) {
                if (sc.i < sc.len) return unexpected(&sc, "the end of the text after the value");
                return KVS_OK;
            }
            char close = stack[depth - 1] == '{' ? '}' : ']';
            if (sc.i < sc.len && sc.s[sc.i] == ',') {
                sc.i++;
                mode = close == '}' ? KEY : VALUE;
            } else if (sc.i < sc.len && sc.s[sc.i] == (unsigned char)close) {
                sc.i++;
                depth--;
            } else {
                return unexpected(&sc, close == '}' ? "',' or '}'" : "',' or ']'");
            }
            continue;
        }
        /* VALUE */
        if (sc.i >= sc.len) return unexpected(&sc, "a value");
        unsigned char c = sc.s[sc.i];
        res->n_values++;
        if (c == '{' || c == '[') {
            if (depth >= max_depth)
                return fail(&sc, sc.i, "nesting deeper than %d levels", (int)max_depth), KVS_ERR_LIMIT;
            stack[depth++] = c;
            sc.i++;
            skip_ws(&sc);
            unsigned char close = c == '{' ? '}' : ']';
            if (sc.i < sc.len && sc.s[sc.i] == close) {
                sc.i++;
                depth--;
                mode = AFTER;
            } else {
                mode = c == '{' ? KEY : VALUE;
            }
            continue;
        }
        if (c == '"') r = scan_string(&sc);
        else if (c == '-' || is_digit(c)) r = scan_number(&sc);
        else if (c == 't' || c == 'f' || c == 'n') r = scan_literal(&sc);
        else return unexpected(&sc, "a value");
        if (r) return r;
        mode = AFTER;
    }
}

/* ---- duplicate keys ------------------------------------------------------------------------------------- */
static int cmp_key(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* The duplicate key among o's members, or NULL; *oom set when the sort could not allocate. */
static const char *dup_in_object(const cJSON *o, bool *oom) {
    size_t n = 0;
    for (const cJSON *c = o->child; c; c = c->next) n++;
    if (n < 2) return NULL;
    if (n <= 16) { /* small objects: pairwise */
        for (const cJSON *a = o->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next)
                if (a->string && b->string && !strcmp(a->string, b->string)) return a->string;
        return NULL;
    }
    const cJSON **v = malloc(n * sizeof *v);
    if (!v) { *oom = true; return NULL; }
    size_t k = 0;
    for (const cJSON *c = o->child; c; c = c->next)
        if (c->string) v[k++] = c;
    qsort(v, k, sizeof *v, cmp_key);
    const char *d = NULL;
    for (size_t i = 1; !d && i < k; i++)
        if (!strcmp(v[i - 1]->string, v[i]->string)) d = v[i]->string;
    free(v);
    return d;
}

/* Appends ".key" or "[i]" to the path (silently cut at its capacity). */
static size_t path_push(char *path, size_t cap, size_t at, const cJSON *parent, const cJSON *child, size_t idx) {
    int w = cJSON_IsArray(parent) ? snprintf(path + at, cap - at, "[%zu]", idx)
                                  : snprintf(path + at, cap - at, "%s%.32s", at ? "." : "", child->string ? child->string : "");
    if (w < 0) return at;
    return at + (size_t)w < cap ? at + (size_t)w : cap - 1;
}

static int dup_walk(const cJSON *v, int depth, char *path, size_t cap, size_t at, srv_json_check_result *res) {
    if (depth > SRV_JSON_CHECK_MAX_DEPTH || !(cJSON_IsObject(v) || cJSON_IsArray(v))) return 0;
    if (cJSON_IsObject(v)) {
        bool oom = false;
        const char *d = dup_in_object(v, &oom);
        if (oom) return KVS_ERR_NOMEM;
        if (d) {
            snprintf(res->message, sizeof res->message, "duplicate key '%.64s'%s%s", d, at ? " in " : "",
                     at ? path : "");
            return KVS_ERR_FORMAT;
        }
    }
    size_t i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        if (!(cJSON_IsObject(c) || cJSON_IsArray(c))) continue;
        size_t nat = path_push(path, cap, at, v, c, i);
        int r = dup_walk(c, depth + 1, path, cap, nat, res);
        if (r != 0) return r;
        path[at] = 0;
    }
    return 0;
}

int srv_json_check_dup_keys(const cJSON *root, srv_json_check_result *res) {
    if (!res) return KVS_ERR_INVALID;
    memset(res, 0, sizeof *res);
    if (!root) return 0;
    char path[80] = "";
    return dup_walk(root, 1, path, sizeof path, 0, res);
}
