/* gmr_regex.c: the JSON Schema `pattern` subset (ECMA-262 flavoured) compiled into grammar rules over the
 * JSON-encoded content of a string. Supported: literals, ., [classes] with ranges and negation, \d \w \s \D \W
 * \S, escapes (\n \t \r \f \v \0 \xHH \uXXXX and escaped punctuation), groups ( ), (?: ), (?<name> ), |,
 * quantifiers ? * + {m} {m,} {m,n} (lazy forms too: same language), ^ at the start and $ at the end.
 * Rejected with KVS_ERR_UNSUPPORTED: backreferences, lookaround, \b \B, anchors elsewhere, possessive forms. */
#include <stdlib.h>
#include <string.h>

#include "grammar/gmr_internal.h"

#define RX_MAX_COUNT 10000u
#define RX_MAX_DEPTH 64

typedef struct rx {
    gb *b;
    const char *p;     /* the pattern */
    size_t i, n;
    int depth;
} rx;

uint32_t gmr_json_cp_rule(gb *b, gmr_cpset *set) {
    cps_norm(set);
    gmr_cpset raw = {0};
    static const char *short_esc[32] = {[8] = "\\b", [9] = "\\t", [10] = "\\n", [12] = "\\f", [13] = "\\r"};
    const char *esc[40];
    size_t esc_len[40], n_esc = 0;
    char ubuf[32][7];
    int rc = 0;
    for (size_t k = 0; k < set->n && !rc; k++) {
        uint32_t lo = set->r[2 * k], hi = set->r[2 * k + 1];
        for (uint32_t c = lo; c <= hi && c < 0x20; c++) {
            if (short_esc[c]) esc[n_esc] = short_esc[c];
            else {
                static const char hx[] = "0123456789abcdef";
                memcpy(ubuf[c], "\\u00", 4);
                ubuf[c][4] = hx[c >> 4];
                ubuf[c][5] = hx[c & 15];
                ubuf[c][6] = 0;
                esc[n_esc] = ubuf[c];
            }
            esc_len[n_esc] = strlen(esc[n_esc]);
            n_esc++;
        }
        if (lo <= '"' && hi >= '"') esc[n_esc] = "\\\"", esc_len[n_esc++] = 2;
        if (lo <= '\\' && hi >= '\\') esc[n_esc] = "\\\\", esc_len[n_esc++] = 2;
        uint32_t a = lo < 0x20 ? 0x20 : lo;
        /* the raw part: [a, hi] minus '"' and '\\' */
        uint32_t cuts[2] = {'"', '\\'};
        for (int j = 0; j < 2 && !rc; j++) {
            if (a <= cuts[j] && hi >= cuts[j]) {
                if (a < cuts[j]) rc = cps_add(&raw, a, cuts[j] - 1);
                a = cuts[j] + 1;
            }
        }
        if (!rc && a <= hi) rc = cps_add(&raw, a, hi);
    }
    cps_free(set);
    if (rc) {
        cps_free(&raw);
        gb_fail(b, KVS_ERR_NOMEM, "out of memory");
        return UINT32_MAX;
    }
    uint32_t r;
    if (n_esc == 0) {
        r = gb_rule_cp(b, raw.r, raw.n);
    } else {
        r = gb_rule_new(b);
        gb_define(b, r);
        if (raw.n) gb_alt_ref(b, r, gb_rule_cp(b, raw.r, raw.n));
        gb_alt_ref(b, r, gb_rule_lits(b, esc, esc_len, n_esc));
    }
    cps_free(&raw);
    return r;
}

static int rx_fail(rx *x, int code, const char *what) {
    return gb_fail(x->b, code, "pattern: %s at offset %zu", what, x->i);
}

/* Decodes one UTF-8 code point of the pattern (invalid bytes stand for themselves). */
static uint32_t rx_cp(rx *x) {
    const unsigned char *s = (const unsigned char *)x->p;
    uint32_t c = s[x->i];
    int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (n > 1 && x->i + (size_t)n <= x->n) {
        uint32_t v = c & (0x7F >> n);
        for (int k = 1; k < n; k++) v = (v << 6) | (s[x->i + k] & 63);
        x->i += (size_t)n;
        return v;
    }
    x->i++;
    return c;
}

static int add_space(gmr_cpset *s) {
    static const uint32_t sp[] = {9, 13, 32, 32, 0xA0, 0xA0, 0x1680, 0x1680, 0x2000, 0x200A, 0x2028, 0x2029,
                                  0x202F, 0x202F, 0x205F, 0x205F, 0x3000, 0x3000, 0xFEFF, 0xFEFF};
    int rc = 0;
    for (size_t k = 0; k < sizeof sp / sizeof *sp && !rc; k += 2) rc = cps_add(s, sp[k], sp[k + 1]);
    return rc;
}

/* After a backslash: adds the escape's code points to s. *single gets the code point when it is one. */
static int rx_escape(rx *x, gmr_cpset *s, bool in_class) {
    if (x->i >= x->n) return rx_fail(x, KVS_ERR_SYNTAX, "trailing backslash");
    char c = x->p[x->i++];
    gmr_cpset t = {0};
    int rc = 0;
    bool neg = false;
    switch (c) {
    case 'd': case 'D': rc = cps_add(&t, '0', '9'); neg = c == 'D'; break;
    case 'w': case 'W':
        rc = cps_add(&t, '0', '9');
        if (!rc) rc = cps_add(&t, 'A', 'Z');
        if (!rc) rc = cps_add(&t, 'a', 'z');
        if (!rc) rc = cps_add(&t, '_', '_');
        neg = c == 'W';
        break;
    case 's': case 'S': rc = add_space(&t); neg = c == 'S'; break;
    case 'n': rc = cps_add(s, '\n', '\n'); return rc;
    case 't': rc = cps_add(s, '\t', '\t'); return rc;
    case 'r': rc = cps_add(s, '\r', '\r'); return rc;
    case 'f': rc = cps_add(s, '\f', '\f'); return rc;
    case 'v': rc = cps_add(s, '\v', '\v'); return rc;
    case '0': rc = cps_add(s, 0, 0); return rc;
    case 'x': case 'u': {
        int nd = c == 'x' ? 2 : 4;
        if (x->i + (size_t)nd > x->n) return rx_fail(x, KVS_ERR_SYNTAX, "short \\x or \\u escape");
        uint32_t v = 0;
        for (int k = 0; k < nd; k++) {
            int h = gmr_hexval(x->p[x->i + k]);
            if (h < 0) return rx_fail(x, KVS_ERR_SYNTAX, "bad hex digit in an escape");
            v = v * 16 + (uint32_t)h;
        }
        x->i += (size_t)nd;
        return cps_add(s, v, v);
    }
    case 'b':
        if (in_class) return cps_add(s, 8, 8);
        return rx_fail(x, KVS_ERR_UNSUPPORTED, "word boundary \\b");
    default:
        if ((c >= '1' && c <= '9') || c == 'k') return rx_fail(x, KVS_ERR_UNSUPPORTED, "backreference");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return rx_fail(x, KVS_ERR_UNSUPPORTED, "escape sequence");
        return cps_add(s, (unsigned char)c, (unsigned char)c);
    }
    if (!rc && neg) rc = cps_negate(&t);
    for (size_t k = 0; k < t.n && !rc; k++) rc = cps_add(s, t.r[2 * k], t.r[2 * k + 1]);
    cps_free(&t);
    return rc;
}

static uint32_t rx_alt(rx *x);

/* One atom as a rule, or UINT32_MAX (error set). */
static uint32_t rx_atom(rx *x) {
    gb *b = x->b;
    char c = x->p[x->i];
    gmr_cpset s = {0};
    int rc = 0;
    if (c == '(') {
        x->i++;
        if (x->i < x->n && x->p[x->i] == '?') {
            if (x->i + 1 < x->n && x->p[x->i + 1] == ':') x->i += 2;
            else if (x->i + 2 < x->n && x->p[x->i + 1] == '<' && x->p[x->i + 2] != '=' && x->p[x->i + 2] != '!') {
                const char *e = memchr(x->p + x->i, '>', x->n - x->i);
                if (!e) return rx_fail(x, KVS_ERR_SYNTAX, "unterminated group name"), UINT32_MAX;
                x->i = (size_t)(e - x->p) + 1;
            } else {
                return rx_fail(x, KVS_ERR_UNSUPPORTED, "lookaround or group flags"), UINT32_MAX;
            }
        }
        if (++x->depth > RX_MAX_DEPTH) return rx_fail(x, KVS_ERR_LIMIT, "groups nested too deeply"), UINT32_MAX;
        uint32_t r = rx_alt(x);
        x->depth--;
        if (b->err) return UINT32_MAX;
        if (x->i >= x->n || x->p[x->i] != ')') return rx_fail(x, KVS_ERR_SYNTAX, "missing )"), UINT32_MAX;
        x->i++;
        return r;
    }
    if (c == '[') {
        x->i++;
        bool neg = x->i < x->n && x->p[x->i] == '^';
        if (neg) x->i++;
        bool first = true;
        while (!rc && x->i < x->n && (x->p[x->i] != ']' || first)) {
            first = false;
            uint32_t lo;
            gmr_cpset one = {0};
            if (x->p[x->i] == '\\') {
                x->i++;
                rc = rx_escape(x, &one, true);
                if (rc) break;
                if (one.n != 1 || one.r[0] != one.r[1]) {   /* a class escape: no range */
                    for (size_t k = 0; k < one.n && !rc; k++) rc = cps_add(&s, one.r[2 * k], one.r[2 * k + 1]);
                    cps_free(&one);
                    continue;
                }
                lo = one.r[0];
                cps_free(&one);
            } else {
                lo = rx_cp(x);
            }
            uint32_t hi = lo;
            if (x->i + 1 < x->n && x->p[x->i] == '-' && x->p[x->i + 1] != ']') {
                x->i++;
                if (x->p[x->i] == '\\') {
                    x->i++;
                    rc = rx_escape(x, &one, true);
                    if (rc) break;
                    if (one.n != 1 || one.r[0] != one.r[1]) {
                        cps_free(&one);
                        rc = rx_fail(x, KVS_ERR_SYNTAX, "class escape as a range end");
                        break;
                    }
                    hi = one.r[0];
                    cps_free(&one);
                } else {
                    hi = rx_cp(x);
                }
                if (hi < lo) {
                    rc = rx_fail(x, KVS_ERR_SYNTAX, "range out of order");
                    break;
                }
            }
            rc = cps_add(&s, lo, hi);
        }
        if (!rc && x->i >= x->n) rc = rx_fail(x, KVS_ERR_SYNTAX, "missing ]");
        if (!rc) x->i++;
        if (!rc && neg) rc = cps_negate(&s);
    } else if (c == '.') {
        x->i++;
        rc = cps_add(&s, 0, 9);
        if (!rc) rc = cps_add(&s, 11, 12);
        if (!rc) rc = cps_add(&s, 14, 0x2027);
        if (!rc) rc = cps_add(&s, 0x202A, 0x10FFFF);
    } else if (c == '\\') {
        x->i++;
        rc = rx_escape(x, &s, false);
    } else if (c == '^' || c == '$') {
        rc = rx_fail(x, KVS_ERR_UNSUPPORTED, "anchor ^ or $ other than at the pattern's start or end");
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        rc = rx_fail(x, KVS_ERR_SYNTAX, "quantifier without an operand");
    } else {
        uint32_t v = rx_cp(x);
        rc = cps_add(&s, v, v);
    }
    if (rc) {
        cps_free(&s);
        if (rc == KVS_ERR_NOMEM) gb_fail(b, rc, "out of memory");
        return UINT32_MAX;
    }
    if (s.n == 0) {
        cps_free(&s);
        rx_fail(x, KVS_ERR_UNSUPPORTED, "empty character class");
        return UINT32_MAX;
    }
    return gmr_json_cp_rule(b, &s);
}

/* A sequence until | or ) or the end, as a rule of one alternative. */
static uint32_t rx_seq(rx *x) {
    gb *b = x->b;
    gb_seq s = {0};
    while (!b->err && x->i < x->n && x->p[x->i] != '|' && x->p[x->i] != ')') {
        uint32_t a = rx_atom(x);
        if (b->err) break;
        uint32_t mn = 1, mx = 1;
        if (x->i < x->n) {
            char q = x->p[x->i];
            if (q == '?') mn = 0, mx = 1, x->i++;
            else if (q == '*') mn = 0, mx = GMR_INF, x->i++;
            else if (q == '+') mn = 1, mx = GMR_INF, x->i++;
            else if (q == '{') {
                int cr = gb_count(x->p, x->n, &x->i, RX_MAX_COUNT, &mn, &mx);   /* NONE: a literal { */
                if (cr == GB_COUNT_BAD) {
                    rx_fail(x, KVS_ERR_SYNTAX, "bad {m,n} quantifier");
                    break;
                }
                if (cr == GB_COUNT_LIMIT) {
                    rx_fail(x, KVS_ERR_LIMIT, "repetition count above 10000");
                    break;
                }
                if (cr == GB_COUNT_OK && mx < mn) {
                    rx_fail(x, KVS_ERR_SYNTAX, "{m,n} with n < m");
                    break;
                }
            }
            if (x->i < x->n && (mn != 1 || mx != 1)) {
                if (x->p[x->i] == '?') x->i++;   /* lazy: the same language */
                else if (x->p[x->i] == '+') {
                    rx_fail(x, KVS_ERR_UNSUPPORTED, "possessive quantifier");
                    break;
                }
            }
        }
        gb_repeat(b, &s, a, mn, mx);
    }
    return gb_rule_of(b, &s);
}

static uint32_t rx_branch(void *x) { return rx_seq(x); }

static bool rx_bar(void *v) {
    rx *x = v;
    if (x->i >= x->n || x->p[x->i] != '|') return false;
    x->i++;
    return true;
}

static uint32_t rx_alt(rx *x) { return gb_alternatives(x->b, rx_branch, rx_bar, x); }

uint32_t gmr_regex_rule(gb *b, const char *pattern, uint32_t any_char) {
    size_t n = strlen(pattern);
    bool start = n > 0 && pattern[0] == '^';
    bool end = false;
    if (n > (start ? 1u : 0u) && pattern[n - 1] == '$') {
        size_t bs = 0;   /* an escaped \$ is a literal */
        for (size_t k = n - 1; k-- > 0 && pattern[k] == '\\';) bs++;
        end = bs % 2 == 0;
    }
    rx x = {b, pattern, start ? 1u : 0u, end ? n - 1 : n, 0};
    /* anchors apply to the whole pattern only when it has no top-level alternation */
    if (start || end) {
        int depth = 0;
        bool in_class = false;
        for (size_t k = x.i; k < x.n; k++) {
            char c = pattern[k];
            if (c == '\\') { k++; continue; }
            if (in_class) { if (c == ']') in_class = false; continue; }
            if (c == '[') in_class = true;
            else if (c == '(') depth++;
            else if (c == ')') depth--;
            else if (c == '|' && depth == 0) {
                gb_fail(b, KVS_ERR_UNSUPPORTED, "pattern: anchors with a top-level alternation (use a group)");
                return UINT32_MAX;
            }
        }
    }
    uint32_t body = rx_alt(&x);
    if (!b->err && x.i < x.n) rx_fail(&x, KVS_ERR_SYNTAX, "unbalanced )");
    if (b->err) return UINT32_MAX;
    gb_seq s = {0};
    if (!start) gb_repeat(b, &s, any_char, 0, GMR_INF);
    gb_ref(b, &s, body);
    if (!end) gb_repeat(b, &s, any_char, 0, GMR_INF);
    return gb_rule_of(b, &s);
}
