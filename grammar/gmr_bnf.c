/* gmr_bnf.c: the small BNF of grammar.h (GBNF-like) into a grammar; `@name` imports a named grammar. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gmr_internal.h"

#define BNF_MAX_RULES 10000
#define BNF_MAX_DEPTH 64
#define BNF_MAX_COUNT 100000u

typedef struct bname { const char *s; size_t n; uint32_t rule; bool defined; int line; } bname;

typedef struct bnf {
    gb *b;
    const char *p;
    size_t i;
    int line, depth;
    bname *names; size_t n_names, cap_names;
    bname *imports; size_t n_imports, cap_imports;
    const gmr_named_grammar *named; size_t n_named;
} bnf;

static int bfail(bnf *x, int code, const char *what) {
    return gb_fail(x->b, code, "grammar line %d: %s", x->line, what);
}

static void skip_ws(bnf *x) {
    for (;;) {
        char c = x->p[x->i];
        if (c == '\n') x->line++, x->i++;
        else if (c == ' ' || c == '\t' || c == '\r') x->i++;
        else if (c == '#') {
            while (x->p[x->i] && x->p[x->i] != '\n') x->i++;
        } else return;
    }
}

static bool name_char(char c, bool first) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!first && ((c >= '0' && c <= '9') || c == '-'));
}

static size_t name_len(const char *s) {
    size_t n = 0;
    if (!name_char(s[0], true)) return 0;
    while (name_char(s[n], n == 0)) n++;
    return n;
}

/* Whether a rule definition (NAME ::=) starts at the current position. */
static bool at_definition(bnf *x) {
    size_t n = name_len(x->p + x->i);
    if (!n) return false;
    size_t k = x->i + n;
    while (x->p[k] == ' ' || x->p[k] == '\t' || x->p[k] == '\r' || x->p[k] == '\n') k++;
    return !strncmp(x->p + k, "::=", 3);
}

static bname *lookup(bnf *x, bname **arr, size_t *n, size_t *cap, const char *s, size_t len, bool create) {
    for (size_t k = 0; k < *n; k++)
        if ((*arr)[k].n == len && !memcmp((*arr)[k].s, s, len)) return &(*arr)[k];
    if (!create) return NULL;
    if (*n >= BNF_MAX_RULES) return bfail(x, KVS_ERR_LIMIT, "too many rules"), NULL;
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        bname *m = realloc(*arr, c * sizeof *m);
        if (!m) return gb_fail(x->b, KVS_ERR_NOMEM, "out of memory"), NULL;
        *arr = m;
        *cap = c;
    }
    bname *e = &(*arr)[(*n)++];
    *e = (bname){s, len, UINT32_MAX, false, x->line};
    return e;
}

/* One (possibly escaped) code point of a literal or class. */
static int read_char(bnf *x, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)x->p;
    if (!s[x->i] || s[x->i] == '\n') return bfail(x, KVS_ERR_SYNTAX, "unterminated literal or class");
    if (s[x->i] != '\\') {
        uint32_t c = s[x->i];
        int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        uint32_t v = n == 1 ? c : c & (0x7F >> n);
        for (int k = 1; k < n; k++) {
            if ((s[x->i + k] & 0xC0) != 0x80) return bfail(x, KVS_ERR_SYNTAX, "invalid UTF-8");
            v = (v << 6) | (s[x->i + k] & 63);
        }
        x->i += (size_t)n;
        *cp = v;
        return 0;
    }
    x->i++;
    char c = (char)s[x->i++];
    int nd = 0;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'x': nd = 2; break;
    case 'u': nd = 4; break;
    case 0: return bfail(x, KVS_ERR_SYNTAX, "trailing backslash");
    default: *cp = (unsigned char)c; return 0;
    }
    uint32_t v = 0;
    for (int k = 0; k < nd; k++) {
        char h = x->p[x->i++];
        int d = gmr_hexval(h);
        if (d < 0) return bfail(x, KVS_ERR_SYNTAX, "bad hex escape");
        v = v * 16 + (uint32_t)d;
    }
    *cp = v;
    return 0;
}

static uint32_t b_alts(bnf *x);

static uint32_t b_item(bnf *x) {
    gb *b = x->b;
    char c = x->p[x->i];
    if (c == '"') {
        x->i++;
        gb_seq q = {0};
        while (x->p[x->i] != '"' && !b->err) {
            uint32_t cp;
            if (read_char(x, &cp)) break;
            if (cp > 0x10FFFF) {
                bfail(x, KVS_ERR_SYNTAX, "code point out of range");
                break;
            }
            uint8_t o[4];
            int n = gmr_utf8_encode(cp, o);
            gb_lit(b, &q, (const char *)o, (size_t)n);
        }
        if (!b->err) x->i++;
        return gb_rule_of(b, &q);
    }
    if (c == '[' || c == '.') {
        gmr_cpset s = {0};
        int rc = 0;
        x->i++;
        if (c == '.') rc = cps_add(&s, 0, 0x10FFFF);
        else {
            bool neg = x->p[x->i] == '^';
            if (neg) x->i++;
            while (!rc && x->p[x->i] != ']') {
                uint32_t lo, hi;
                if ((rc = read_char(x, &lo))) break;
                hi = lo;
                if (x->p[x->i] == '-' && x->p[x->i + 1] != ']') {
                    x->i++;
                    if ((rc = read_char(x, &hi))) break;
                    if (hi < lo) {
                        rc = bfail(x, KVS_ERR_SYNTAX, "class range out of order");
                        break;
                    }
                }
                rc = cps_add(&s, lo, hi);
            }
            if (!rc) x->i++;
            if (!rc && neg) rc = cps_negate(&s);
            else cps_norm(&s);
        }
        if (rc == KVS_ERR_NOMEM) gb_fail(b, rc, "out of memory");
        uint32_t r = rc ? UINT32_MAX : gb_rule_cp(b, s.r, s.n);
        cps_free(&s);
        return r;
    }
    if (c == '(') {
        x->i++;
        if (++x->depth > BNF_MAX_DEPTH) return bfail(x, KVS_ERR_LIMIT, "groups nested too deeply"), UINT32_MAX;
        uint32_t r = b_alts(x);
        x->depth--;
        skip_ws(x);
        if (!b->err && x->p[x->i] != ')') return bfail(x, KVS_ERR_SYNTAX, "missing )"), UINT32_MAX;
        x->i++;
        return r;
    }
    if (c == '@') {
        x->i++;
        size_t n = name_len(x->p + x->i);
        if (!n) return bfail(x, KVS_ERR_SYNTAX, "@ without a name"), UINT32_MAX;
        const char *nm = x->p + x->i;
        x->i += n;
        bname *e = lookup(x, &x->imports, &x->n_imports, &x->cap_imports, nm, n, true);
        if (!e) return UINT32_MAX;
        if (e->rule == UINT32_MAX) {
            const gmr_grammar *g = NULL;
            for (size_t k = 0; k < x->n_named && !g; k++)
                if (x->named[k].name && strlen(x->named[k].name) == n && !memcmp(x->named[k].name, nm, n))
                    g = x->named[k].grammar;
            if (!g) return gb_fail(b, KVS_ERR_NOT_FOUND, "grammar line %d: no grammar named '%.*s'", x->line, (int)n, nm),
                          UINT32_MAX;
            e->rule = gb_import(b, g);
        }
        return e->rule;
    }
    size_t n = name_len(x->p + x->i);
    if (!n) return bfail(x, KVS_ERR_SYNTAX, "expected a literal, class, rule name or group"), UINT32_MAX;
    bname *e = lookup(x, &x->names, &x->n_names, &x->cap_names, x->p + x->i, n, true);
    x->i += n;
    if (!e) return UINT32_MAX;
    if (e->rule == UINT32_MAX) e->rule = gb_rule_new(b);
    return e->rule;
}

static uint32_t b_seq(bnf *x) {
    gb *b = x->b;
    gb_seq q = {0};
    for (;;) {
        skip_ws(x);
        char c = x->p[x->i];
        if (!c || c == '|' || c == ')' || at_definition(x) || b->err) break;
        uint32_t a = b_item(x);
        if (b->err) break;
        uint32_t mn = 1, mx = 1;
        c = x->p[x->i];
        if (c == '?') mn = 0, x->i++;
        else if (c == '*') mn = 0, mx = GMR_INF, x->i++;
        else if (c == '+') mx = GMR_INF, x->i++;
        else if (c == '{') {
            int cr = gb_count(x->p, SIZE_MAX, &x->i, BNF_MAX_COUNT, &mn, &mx);
            if (cr != GB_COUNT_OK || mx < mn) {   /* a malformed count before one too large */
                bool limit = cr == GB_COUNT_LIMIT && mx >= mn;
                bfail(x, limit ? KVS_ERR_LIMIT : KVS_ERR_SYNTAX, limit ? "repetition count above 100000" : "bad {m,n}");
                break;
            }
        }
        gb_repeat(b, &q, a, mn, mx);
    }
    return gb_rule_of(b, &q);
}

static uint32_t b_branch(void *x) { return b_seq(x); }

static bool b_bar(void *v) {
    bnf *x = v;
    skip_ws(x);
    if (x->p[x->i] != '|') return false;
    x->i++;
    return true;
}

static uint32_t b_alts(bnf *x) { return gb_alternatives(x->b, b_branch, b_bar, x); }

int gmr_compile_bnf(const char *text, const gmr_named_grammar *named, size_t n_named, gmr_grammar **out, char *err,
                    size_t err_len) {
    if (!out) return KVS_ERR_INVALID;
    *out = NULL;
    gb b;
    gb_init(&b, err, err_len);
    if (!text || (n_named && !named)) return gb_fail(&b, KVS_ERR_INVALID, "no grammar text");
    bnf x = {.b = &b, .p = text, .line = 1, .named = named, .n_named = n_named};
    for (;;) {
        skip_ws(&x);
        if (!text[x.i] || b.err) break;
        size_t n = name_len(text + x.i);
        if (!n || !at_definition(&x)) {
            bfail(&x, KVS_ERR_SYNTAX, "expected a rule definition (name ::= ...)");
            break;
        }
        bname *e = lookup(&x, &x.names, &x.n_names, &x.cap_names, text + x.i, n, true);
        if (!e) break;
        if (e->defined) {
            gb_fail(&b, KVS_ERR_SYNTAX, "grammar line %d: rule '%.*s' defined twice", x.line, (int)n, text + x.i);
            break;
        }
        e->defined = true;
        if (e->rule == UINT32_MAX) e->rule = gb_rule_new(&b);
        uint32_t target = e->rule;
        x.i += n;
        skip_ws(&x);
        x.i += 3;   /* ::= */
        gb_alt_ref(&b, target, b_alts(&x));
        skip_ws(&x);
        if (!b.err && text[x.i] && !at_definition(&x)) bfail(&x, KVS_ERR_SYNTAX, "unexpected character");
    }
    int rc = b.err;
    bname *root = NULL;
    if (!rc) {
        for (size_t k = 0; k < x.n_names && !rc; k++)
            if (!x.names[k].defined)
                rc = gb_fail(&b, KVS_ERR_NOT_FOUND, "grammar: rule '%.*s' is used but not defined", (int)x.names[k].n,
                             x.names[k].s);
        root = lookup(&x, &x.names, &x.n_names, &x.cap_names, "root", 4, false);
        if (!rc && !root) rc = gb_fail(&b, KVS_ERR_NOT_FOUND, "grammar: no rule 'root'");
    }
    if (!rc) rc = gb_finish(&b, root->rule, out);
    free(x.names);
    free(x.imports);
    gb_free(&b);
    return rc;
}
