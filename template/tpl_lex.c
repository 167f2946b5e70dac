/* tpl_lex.c: template text to tokens (moved out of tpl_parse.c). The lexer applies whitespace control as jinja2
 * does with trim_blocks and lstrip_blocks (a block or comment tag alone on its line takes its indentation and its
 * newline away; `-` strips all whitespace on its side, `+` keeps it). The tree's arena and the parser's error and
 * allocation helpers (tpl_perr, tpl_palloc, tpl_pstrdup) live here too, shared with tpl_parse.c through tpl_internal.h. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

/* ---- arena ----------------------------------------------------------------------------------------------- */

typedef struct arena_blk {
    struct arena_blk *next;
    size_t used, cap;
    max_align_t data[];
} arena_blk;

void *tpl_arena_alloc(void **arena, size_t n) {
    arena_blk *b = *arena;
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        arena_blk *nb = malloc(sizeof *nb + cap);
        if (!nb) return NULL;
        nb->next = b;
        nb->used = 0;
        nb->cap = cap;
        *arena = b = nb;
    }
    void *p = (char *)b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

void tpl_arena_free(void *arena) {
    for (arena_blk *b = arena; b;) {
        arena_blk *next = b->next;
        free(b);
        b = next;
    }
}

int tpl_perr(parser *p, int line, int col, int code, const char *fmt, ...) {
    if (p->code) return p->code;
    p->code = code;
    va_list ap;
    va_start(ap, fmt);
    tpl_set_error(p->err, code, line, col, fmt, ap);
    va_end(ap);
    return code;
}

void *tpl_palloc(parser *p, size_t n) {
    void *r = tpl_arena_alloc(&p->t->arena, n);
    if (!r) tpl_perr(p, 0, 0, KVS_ERR_NOMEM, "out of memory");
    return r;
}

char *tpl_pstrdup(parser *p, const char *s, size_t n) {
    char *r = tpl_palloc(p, n + 1);
    if (r) memcpy(r, s, n);
    return r;
}

static int push(parser *p, tok t) {
    if (p->ntok == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 256;
        tok *nt = realloc(p->toks, nc * sizeof *nt);
        if (!nt) return tpl_perr(p, t.line, t.col, KVS_ERR_NOMEM, "out of memory");
        p->toks = nt;
        p->cap = nc;
    }
    p->toks[p->ntok++] = t;
    return 0;
}

typedef struct lexpos {
    size_t i;
    int line;
    size_t line_start;
} lexpos;

static void adv(parser *p, lexpos *lp, size_t to) {
    for (; lp->i < to; lp->i++)
        if (p->src[lp->i] == '\n') { lp->line++; lp->line_start = lp->i + 1; }
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static bool is_id0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_dig(char c) { return c >= '0' && c <= '9'; }

static void put_utf8(char *o, size_t *k, uint32_t cp) {
    if (cp < 0x80) o[(*k)++] = (char)cp;
    else if (cp < 0x800) { o[(*k)++] = (char)(0xC0 | cp >> 6); o[(*k)++] = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        o[(*k)++] = (char)(0xE0 | cp >> 12); o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        o[(*k)++] = (char)(0xF0 | cp >> 18); o[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Python's string-literal escapes (as jinja2 decodes them). */
static char *unescape(parser *p, const char *s, size_t n, size_t *outlen) {
    char *o = tpl_palloc(p, n + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) { o[k++] = s[i]; continue; }
        char e = s[++i];
        switch (e) {
        case '\n': break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = 7; break;
        case 'b': o[k++] = 8; break;
        case 'f': o[k++] = 12; break;
        case 'n': o[k++] = 10; break;
        case 'r': o[k++] = 13; break;
        case 't': o[k++] = 9; break;
        case 'v': o[k++] = 11; break;
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            int d = 0;
            for (; d < nd && i + 1 + d < n && hexval(s[i + 1 + d]) >= 0; d++) cp = cp * 16 + (uint32_t)hexval(s[i + 1 + d]);
            if (d < nd || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) { o[k++] = '\\'; o[k++] = e; break; }
            put_utf8(o, &k, cp);   /* at most 4 bytes for 3..10 source bytes */
            i += (size_t)nd;
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = 0;
                int d = 0;
                for (; d < 3 && i + d < n && s[i + d] >= '0' && s[i + d] <= '7'; d++) cp = cp * 8 + (uint32_t)(s[i + d] - '0');
                if (d > 1 && cp >= 0x80) { /* at most 2 bytes from 3 source bytes */ }
                put_utf8(o, &k, cp);
                i += (size_t)d - 1;
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
        }
    }
    o[k] = 0;
    *outlen = k;
    return o;
}

/* Lexes the inside of a {{ }} or {% %} tag starting at lp->i; stops after the end marker. Sets *strip_after
 * (the end had `-`) and *plus_end (the end had `+`, block tags only). */
static int lex_tag(parser *p, lexpos *lp, bool block, bool *strip_after, bool *plus_end) {
    int balance = 0;
    const char *s = p->src;
    size_t n = p->n;
    for (;;) {
        while (lp->i < n && is_ws(s[lp->i])) adv(p, lp, lp->i + 1);
        size_t i = lp->i;
        int col = (int)(i - lp->line_start) + 1;
        if (i >= n) return tpl_perr(p, lp->line, col, KVS_ERR_SYNTAX, "unexpected end of template inside a tag");
        if (balance == 0) {
            const char *end = block ? "%}" : "}}";
            size_t e = 0;
            bool minus = false, plus = false;
            if (s[i] == '-' && i + 2 < n && !memcmp(s + i + 1, end, 2)) { e = 3; minus = true; }
            else if (block && s[i] == '+' && i + 2 < n && !memcmp(s + i + 1, end, 2)) { e = 3; plus = true; }
            else if (i + 1 < n && !memcmp(s + i, end, 2)) e = 2;
            if (e) {
                tok t = {.type = block ? T_BLOCK_END : T_VAR_END, .line = lp->line, .col = col};
                if (push(p, t)) return p->code;
                adv(p, lp, i + e);
                *strip_after = minus;
                *plus_end = plus;
                return 0;
            }
        }
        tok t = {.line = lp->line, .col = col, .s = s + i};
        if (is_id0(s[i])) {
            size_t j = i + 1;
            while (j < n && (is_id0(s[j]) || is_dig(s[j]))) j++;
            t.type = T_NAME;
            t.len = j - i;
            adv(p, lp, j);
        } else if (is_dig(s[i])) {
            size_t j = i;
            bool isf = false;
            char num[64];
            size_t k = 0;
            while (j < n && (is_dig(s[j]) || (s[j] == '_' && j + 1 < n && is_dig(s[j + 1])))) {
                if (s[j] != '_' && k < sizeof num - 1) num[k++] = s[j];
                j++;
            }
            if (j + 1 < n && s[j] == '.' && is_dig(s[j + 1])) {
                isf = true;
                if (k < sizeof num - 1) num[k++] = '.';
                j++;
                while (j < n && (is_dig(s[j]) || (s[j] == '_' && j + 1 < n && is_dig(s[j + 1])))) {
                    if (s[j] != '_' && k < sizeof num - 1) num[k++] = s[j];
                    j++;
                }
            }
            if (j < n && (s[j] == 'e' || s[j] == 'E')) {
                size_t q = j + 1;
                if (q < n && (s[q] == '+' || s[q] == '-')) q++;
                if (q < n && is_dig(s[q])) {
                    isf = true;
                    if (k < sizeof num - 1) num[k++] = 'e';
                    if (s[j + 1] == '-' && k < sizeof num - 1) num[k++] = '-';
                    j = q;
                    while (j < n && is_dig(s[j])) { if (k < sizeof num - 1) num[k++] = s[j]; j++; }
                }
            }
            num[k] = 0;
            if (isf) {
                t.type = T_FLOAT;
                t.fv = strtod(num, NULL);
            } else {
                errno = 0;
                long long v = strtoll(num, NULL, 10);
                if (errno || k >= sizeof num - 1)
                    return tpl_perr(p, t.line, t.col, KVS_ERR_UNSUPPORTED, "integer literal too large");
                t.type = T_INT;
                t.iv = v;
            }
            t.len = j - i;
            adv(p, lp, j);
        } else if (s[i] == '\'' || s[i] == '"') {
            char q = s[i];
            size_t j = i + 1;
            while (j < n && s[j] != q) j += s[j] == '\\' && j + 1 < n ? 2 : 1;
            if (j >= n) return tpl_perr(p, t.line, t.col, KVS_ERR_SYNTAX, "unterminated string literal");
            t.type = T_STRING;
            t.s = unescape(p, s + i + 1, j - i - 1, &t.len);
            if (!t.s) return p->code;
            adv(p, lp, j + 1);
        } else {
            static const char *ops2[] = {"//", "**", "==", "!=", "<=", ">="};
            size_t len = 0;
            for (size_t k = 0; k < sizeof ops2 / sizeof *ops2; k++)
                if (i + 1 < n && s[i] == ops2[k][0] && s[i + 1] == ops2[k][1]) len = 2;
            if (!len && strchr("+-/*%~[](){}<>=.:|,;", s[i]) && s[i]) len = 1;
            if (!len) return tpl_perr(p, t.line, t.col, KVS_ERR_SYNTAX, "unexpected character '%c'", s[i]);
            if (len == 1 && (s[i] == '(' || s[i] == '[' || s[i] == '{')) balance++;
            if (len == 1 && (s[i] == ')' || s[i] == ']' || s[i] == '}')) {
                if (balance == 0) return tpl_perr(p, t.line, t.col, KVS_ERR_SYNTAX, "unexpected '%c'", s[i]);
                balance--;
            }
            t.type = T_OP;
            t.len = len;
            adv(p, lp, i + len);
        }
        if (push(p, t)) return p->code;
    }
}

/* At s[i] (after `{%` and its modifier): whitespace, `word`, whitespace, then `-%}` or `%}` (or `+%}` when
 * plus_ok). Returns the offset just past the `%}`, or 0. */
static size_t raw_tag(const char *s, size_t n, size_t i, const char *word, bool plus_ok) {
    while (i < n && is_ws(s[i])) i++;
    size_t wl = strlen(word);
    if (i + wl > n || memcmp(s + i, word, wl)) return 0;
    i += wl;
    if (i < n && (is_id0(s[i]) || is_dig(s[i]))) return 0;
    while (i < n && is_ws(s[i])) i++;
    if (i < n && (s[i] == '-' || (plus_ok && s[i] == '+'))) i++;
    return i + 1 < n && s[i] == '%' && s[i + 1] == '}' ? i + 2 : 0;
}

int tpl_lex(parser *p) {
    const char *s = p->src;
    size_t n = p->n;
    lexpos lp = {0, 1, 0};
    bool line_starting = true, strip_next = false;
    while (lp.i < n) {
        size_t start = lp.i;
        if (strip_next) while (start < n && is_ws(s[start])) start++;
        strip_next = false;
        /* find the next tag */
        size_t j = start;
        int kind = 0;   /* 1 var, 2 block, 3 comment */
        for (; j + 1 < n; j++) {
            if (s[j] != '{') continue;
            if (s[j + 1] == '{') { kind = 1; break; }
            if (s[j + 1] == '%') { kind = 2; break; }
            if (s[j + 1] == '#') { kind = 3; break; }
        }
        if (!kind) j = n;
        size_t tend = j;   /* end of the text before the tag */
        char mod = kind && j + 2 < n ? s[j + 2] : 0;
        if (kind && mod == '-') {
            while (tend > start && is_ws(s[tend - 1])) tend--;
        } else if (kind >= 2 && mod != '+') {
            /* lstrip_blocks: only spaces and tabs between the line's start and the tag */
            size_t l = tend;
            while (l > start && s[l - 1] != '\n') l--;
            bool at_line_start = l > start || (l == start && (line_starting || start == 0));
            if (l > start || line_starting) {
                bool blank = true;
                for (size_t q = l; q < tend; q++)
                    if (s[q] != ' ' && s[q] != '\t') { blank = false; break; }
                if (blank && at_line_start) tend = l;
            }
        }
        adv(p, &lp, start);
        if (tend > start) {
            tok t = {.type = T_TEXT, .line = lp.line, .col = (int)(start - lp.line_start) + 1, .s = s + start,
                     .len = tend - start};
            if (push(p, t)) return p->code;
        }
        adv(p, &lp, j);
        if (!kind) break;
        int tline = lp.line, tcol = (int)(j - lp.line_start) + 1;
        size_t body = j + 2 + (mod == '-' || mod == '+' ? 1 : 0);
        if (kind == 3) {
            size_t e = body;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= n) return tpl_perr(p, tline, tcol, KVS_ERR_SYNTAX, "unterminated comment");
            bool minus = e > body && s[e - 1] == '-';
            bool plus = e > body && s[e - 1] == '+';
            size_t after = e + 2;
            if (!minus && !plus && after < n && s[after] == '\n') after++;
            adv(p, &lp, after);
            strip_next = minus;
            line_starting = after > 0 && s[after - 1] == '\n';
            continue;
        }
        size_t rawend;
        if (kind == 2 && (rawend = raw_tag(s, n, body, "raw", false))) {
            /* {% raw %}...{% endraw %}: the text between, as it is */
            size_t cstart = rawend, k = cstart, cend = 0, after = 0;
            for (; k + 1 < n; k++)
                if (s[k] == '{' && s[k + 1] == '%' && (after = raw_tag(s, n, k + 2 + (s[k + 2] == '-' || s[k + 2] == '+'), "endraw", true))) {
                    cend = k;
                    break;
                }
            if (!after) return tpl_perr(p, tline, tcol, KVS_ERR_SYNTAX, "unclosed 'raw' block (expected 'endraw')");
            if (s[rawend - 3] == '-') while (cstart < cend && is_ws(s[cstart])) cstart++;
            size_t tend2 = cend;
            if (s[cend + 2] == '-') while (tend2 > cstart && is_ws(s[tend2 - 1])) tend2--;
            else if (s[cend + 2] != '+') {   /* lstrip_blocks before {% endraw %} alone on its line */
                size_t l = tend2;
                while (l > cstart && (s[l - 1] == ' ' || s[l - 1] == '\t')) l--;
                if (l > cstart && s[l - 1] == '\n') tend2 = l;
            }
            adv(p, &lp, cstart);
            if (tend2 > cstart) {
                tok t = {.type = T_TEXT, .line = lp.line, .col = (int)(cstart - lp.line_start) + 1, .s = s + cstart, .len = tend2 - cstart};
                if (push(p, t)) return p->code;
            }
            bool em = s[after - 3] == '-', ep = s[after - 3] == '+';
            if (!em && !ep && after < n && s[after] == '\n') after++;
            adv(p, &lp, after);
            strip_next = em;
            line_starting = after > 0 && s[after - 1] == '\n';
            continue;
        }
        tok b = {.type = kind == 1 ? T_VAR_BEGIN : T_BLOCK_BEGIN, .line = tline, .col = tcol};
        if (push(p, b)) return p->code;
        adv(p, &lp, body);
        bool minus = false, plus = false;
        if (lex_tag(p, &lp, kind == 2, &minus, &plus)) return p->code;
        if (kind == 2 && !minus && !plus && lp.i < n && s[lp.i] == '\n') adv(p, &lp, lp.i + 1);
        strip_next = minus;
        line_starting = lp.i > 0 && s[lp.i - 1] == '\n';
    }
    tok e = {.type = T_EOF, .line = lp.line, .col = (int)(lp.i - lp.line_start) + 1};
    return push(p, e);
}
