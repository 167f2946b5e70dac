/* gmr_build.c: the grammar builder every compiler uses, its checks (undefined rules, left recursion, empty
 * repetitions, productivity) and the flattening into a gmr_grammar. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gmr_internal.h"

void gb_init(gb *b, char *msg, size_t msg_len) {
    memset(b, 0, sizeof *b);
    b->msg = msg;
    b->msg_len = msg_len;
    if (msg && msg_len) msg[0] = 0;
}

void gb_seq_free(gb_seq *s) {
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

void gb_free(gb *b) {
    for (uint32_t r = 0; r < b->n_rules; r++) {
        for (uint32_t a = 0; a < b->rules[r].n; a++) gb_seq_free(&b->rules[r].alts[a]);
        free(b->rules[r].alts);
    }
    free(b->rules);
    free(b->cls);
    b->rules = NULL;
    b->cls = NULL;
    b->n_rules = b->n_cls = 0;
}

int gmr_hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int gb_fail(gb *b, int code, const char *fmt, ...) {
    if (b->err) return b->err;
    b->err = code;
    if (b->msg && b->msg_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b->msg, b->msg_len, fmt, ap);
        va_end(ap);
    }
    return code;
}

uint32_t gb_rule_new(gb *b) {
    if (b->err) return UINT32_MAX;
    if (b->n_rules >= GMR_MAX_RULES) {
        gb_fail(b, KVS_ERR_LIMIT, "grammar too large (more than %u rules)", GMR_MAX_RULES);
        return UINT32_MAX;
    }
    if (b->n_rules == b->cap_rules) {
        uint32_t cap = b->cap_rules ? b->cap_rules * 2 : 64;
        gb_rule *n = realloc(b->rules, cap * sizeof *n);
        if (!n) {
            gb_fail(b, KVS_ERR_NOMEM, "out of memory");
            return UINT32_MAX;
        }
        b->rules = n;
        b->cap_rules = cap;
    }
    memset(&b->rules[b->n_rules], 0, sizeof b->rules[0]);
    return b->n_rules++;
}

void gb_define(gb *b, uint32_t r) {
    if (!b->err && r < b->n_rules) b->rules[r].defined = true;
}

void gb_alt(gb *b, uint32_t r, gb_seq *s) {
    if (b->err || r >= b->n_rules) {
        gb_seq_free(s);
        return;
    }
    gb_rule *R = &b->rules[r];
    if (R->n == R->cap) {
        uint32_t cap = R->cap ? R->cap * 2 : 4;
        gb_seq *n = realloc(R->alts, cap * sizeof *n);
        if (!n) {
            gb_fail(b, KVS_ERR_NOMEM, "out of memory");
            gb_seq_free(s);
            return;
        }
        R->alts = n;
        R->cap = cap;
    }
    R->alts[R->n++] = *s;
    R->defined = true;
    memset(s, 0, sizeof *s);
}

void gb_alt_ref(gb *b, uint32_t r, uint32_t q) {
    gb_seq s = {0};
    gb_ref(b, &s, q);
    gb_alt(b, r, &s);
}

uint32_t gb_alternatives(gb *b, uint32_t (*branch)(void *ctx), bool (*bar)(void *ctx), void *ctx) {
    uint32_t r = gb_rule_new(b);
    do gb_alt_ref(b, r, branch(ctx));
    while (!b->err && bar(ctx));
    return r;
}

/* A decimal number at p[*i] (saturating at max + 1); false when there is no digit. */
static bool count_num(const char *p, size_t n, size_t *i, uint32_t max, uint32_t *v) {
    if (*i >= n || p[*i] < '0' || p[*i] > '9') return false;
    uint64_t x = 0;
    while (*i < n && p[*i] >= '0' && p[*i] <= '9') {
        x = x * 10 + (uint64_t)(p[(*i)++] - '0');
        if (x > max) x = (uint64_t)max + 1;
    }
    *v = (uint32_t)x;
    return true;
}

int gb_count(const char *p, size_t n, size_t *i, uint32_t max, uint32_t *mn, uint32_t *mx) {
    size_t j = *i + 1;
    if (!count_num(p, n, &j, max, mn)) return GB_COUNT_NONE;
    *mx = *mn;
    if (j < n && p[j] == ',') {
        j++;
        if (!count_num(p, n, &j, max, mx)) *mx = GMR_INF;
    }
    *i = j;
    if (j >= n || p[j] != '}') return GB_COUNT_BAD;
    *i = j + 1;
    return *mn > max || (*mx != GMR_INF && *mx > max) ? GB_COUNT_LIMIT : GB_COUNT_OK;
}

static void seq_push(gb *b, gb_seq *s, gmr_el e) {
    if (b->err) return;
    if (++b->n_el > GMR_MAX_ELEMS) {
        gb_fail(b, KVS_ERR_LIMIT, "grammar too large (more than %u elements)", GMR_MAX_ELEMS);
        return;
    }
    if (s->n == s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 8;
        gmr_el *n = realloc(s->v, cap * sizeof *n);
        if (!n) {
            gb_fail(b, KVS_ERR_NOMEM, "out of memory");
            return;
        }
        s->v = n;
        s->cap = cap;
    }
    s->v[s->n++] = e;
}

uint32_t gb_class(gb *b, const uint8_t set[32]) {
    if (b->err) return 0;
    for (uint32_t i = b->n_cls; i-- > 0;)
        if (!memcmp(b->cls[i], set, 32)) return i;
    if (b->n_cls >= GMR_MAX_CLASSES) {
        gb_fail(b, KVS_ERR_LIMIT, "grammar too large (more than %u byte classes)", GMR_MAX_CLASSES);
        return 0;
    }
    if (b->n_cls == b->cap_cls) {
        uint32_t cap = b->cap_cls ? b->cap_cls * 2 : 32;
        uint8_t(*n)[32] = realloc(b->cls, cap * sizeof *n);
        if (!n) {
            gb_fail(b, KVS_ERR_NOMEM, "out of memory");
            return 0;
        }
        b->cls = n;
        b->cap_cls = cap;
    }
    memcpy(b->cls[b->n_cls], set, 32);
    return b->n_cls++;
}

void gb_bytes(gb *b, gb_seq *s, const uint8_t set[32]) {
    uint32_t c = gb_class(b, set);
    seq_push(b, s, (gmr_el){GK_BYTES, c, 0, 0});
}

void gb_byte(gb *b, gb_seq *s, uint8_t c) {
    uint8_t set[32] = {0};
    set[c >> 3] |= (uint8_t)(1u << (c & 7));
    gb_bytes(b, s, set);
}

void gb_lit(gb *b, gb_seq *s, const char *str, size_t n) {
    for (size_t i = 0; i < n && !b->err; i++) gb_byte(b, s, (uint8_t)str[i]);
}

void gb_ref(gb *b, gb_seq *s, uint32_t rule) {
    if (rule == UINT32_MAX) {
        gb_fail(b, KVS_ERR_INVALID, "internal: reference to a failed rule");
        return;
    }
    seq_push(b, s, (gmr_el){GK_RULE, rule, 0, 0});
}

void gb_repeat(gb *b, gb_seq *s, uint32_t rule, uint32_t min, uint32_t max) {
    if (rule == UINT32_MAX) {
        gb_fail(b, KVS_ERR_INVALID, "internal: reference to a failed rule");
        return;
    }
    if (max == 0) return;
    if (min == 1 && max == 1) {
        gb_ref(b, s, rule);
        return;
    }
    seq_push(b, s, (gmr_el){GK_REPEAT, rule, min, max});
}

uint32_t gb_rule_of(gb *b, gb_seq *s) {
    uint32_t r = gb_rule_new(b);
    gb_alt(b, r, s);
    gb_seq_free(s);
    return r;
}

uint32_t gb_rule_lit(gb *b, const char *str, size_t n) {
    gb_seq s = {0};
    gb_lit(b, &s, str, n);
    return gb_rule_of(b, &s);
}

/* ---- literal sets as a trie ------------------------------------------------------------------------------ */

int gb_str_cmp(const void *x, const void *y) {
    const gb_str *a = x, *c = y;
    size_t m = a->n < c->n ? a->n : c->n;
    int r = memcmp(a->s, c->s, m);
    if (r) return r;
    return (a->n > c->n) - (a->n < c->n);
}

/* Strings v[0..n) (sorted, distinct, sharing their first d bytes) after byte d. */
static uint32_t lits_rule(gb *b, const gb_str *v, size_t n, size_t d) {
    uint32_t r = gb_rule_new(b);
    size_t i = 0;
    if (i < n && v[i].n == d) {    /* one string ends here */
        gb_seq s = {0};
        gb_alt(b, r, &s);
        i++;
    }
    while (i < n && !b->err) {
        size_t j = i + 1;
        while (j < n && v[j].s[d] == v[i].s[d]) j++;
        gb_seq s = {0};
        if (j == i + 1) {
            gb_lit(b, &s, v[i].s + d, v[i].n - d);
        } else {
            size_t e = d + 1;     /* the group's common prefix */
            while (v[i].n > e && v[j - 1].n > e && v[i].s[e] == v[j - 1].s[e]) e++;
            gb_lit(b, &s, v[i].s + d, e - d);
            gb_ref(b, &s, lits_rule(b, v + i, j - i, e));
        }
        gb_alt(b, r, &s);
        i = j;
    }
    return r;
}

uint32_t gb_rule_lits(gb *b, const char *const *strs, const size_t *lens, size_t n) {
    if (b->err) return UINT32_MAX;
    gb_str *v = malloc((n ? n : 1) * sizeof *v);
    if (!v) {
        gb_fail(b, KVS_ERR_NOMEM, "out of memory");
        return UINT32_MAX;
    }
    for (size_t i = 0; i < n; i++) v[i] = (gb_str){strs[i], lens[i]};
    qsort(v, n, sizeof *v, gb_str_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (m == 0 || gb_str_cmp(&v[m - 1], &v[i])) v[m++] = v[i];
    uint32_t r;
    if (m == 0) {
        r = gb_rule_new(b);
        gb_define(b, r);
    } else {
        r = lits_rule(b, v, m, 0);
    }
    free(v);
    return r;
}

/* ---- code points as UTF-8 ----------------------------------------------------------------------------------- */

int gmr_utf8_encode(uint32_t c, uint8_t *o) {
    if (c < 0x80) { o[0] = (uint8_t)c; return 1; }
    if (c < 0x800) { o[0] = (uint8_t)(0xC0 | (c >> 6)); o[1] = (uint8_t)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (c >> 12)); o[1] = (uint8_t)(0x80 | ((c >> 6) & 63)); o[2] = (uint8_t)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (c >> 18)); o[1] = (uint8_t)(0x80 | ((c >> 12) & 63));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 63)); o[3] = (uint8_t)(0x80 | (c & 63));
    return 4;
}

static void set_range(uint8_t set[32], unsigned lo, unsigned hi) {
    for (unsigned c = lo; c <= hi; c++) set[c >> 3] |= (uint8_t)(1u << (c & 7));
}

/* Adds to rule r the alternatives for code points [lo, hi] of one encoded length at a time, split so that each
 * piece is a product of byte ranges. ASCII goes into the shared class `ascii`. */
static void utf8_range(gb *b, uint32_t r, uint32_t lo, uint32_t hi, uint8_t ascii[32]) {
    if (lo > hi || b->err) return;
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800) utf8_range(b, r, lo, 0xD7FF, ascii);
        if (hi > 0xDFFF) utf8_range(b, r, 0xE000, hi, ascii);
        return;
    }
    static const uint32_t lim[3] = {0x7F, 0x7FF, 0xFFFF};
    for (int k = 0; k < 3; k++)
        if (lo <= lim[k] && hi > lim[k]) {
            utf8_range(b, r, lo, lim[k], ascii);
            utf8_range(b, r, lim[k] + 1, hi, ascii);
            return;
        }
    if (hi < 0x80) {
        set_range(ascii, lo, hi);
        return;
    }
    uint8_t el[4], eh[4];
    int n = gmr_utf8_encode(lo, el);
    gmr_utf8_encode(hi, eh);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_range(b, r, lo, lo | m, ascii);
                utf8_range(b, r, (lo | m) + 1, hi, ascii);
                return;
            }
            if ((hi & m) != m) {
                utf8_range(b, r, lo, (hi & ~m) - 1, ascii);
                utf8_range(b, r, hi & ~m, hi, ascii);
                return;
            }
        }
    }
    gb_seq s = {0};
    for (int i = 0; i < n; i++) {
        uint8_t set[32] = {0};
        set_range(set, el[i], eh[i]);
        gb_bytes(b, &s, set);
    }
    gb_alt(b, r, &s);
}

uint32_t gb_rule_cp(gb *b, const uint32_t *ranges, size_t n) {
    uint32_t r = gb_rule_new(b);
    gb_define(b, r);
    uint8_t ascii[32] = {0};
    for (size_t i = 0; i < n; i++) utf8_range(b, r, ranges[2 * i], ranges[2 * i + 1] > 0x10FFFF ? 0x10FFFF : ranges[2 * i + 1], ascii);
    static const uint8_t zero[32];
    if (memcmp(ascii, zero, 32)) {
        gb_seq s = {0};
        gb_bytes(b, &s, ascii);
        gb_alt(b, r, &s);
        /* the ASCII alternative first: it is the common one */
        if (!b->err) {
            gb_rule *R = &b->rules[r];
            gb_seq t = R->alts[R->n - 1];
            memmove(R->alts + 1, R->alts, (R->n - 1) * sizeof t);
            R->alts[0] = t;
        }
    }
    return r;
}

int cps_add(gmr_cpset *s, uint32_t lo, uint32_t hi) {
    if (lo > hi) return 0;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        uint32_t *n = realloc(s->r, cap * 2 * sizeof *n);
        if (!n) return KVS_ERR_NOMEM;
        s->r = n;
        s->cap = cap;
    }
    s->r[2 * s->n] = lo;
    s->r[2 * s->n + 1] = hi;
    s->n++;
    return 0;
}

static int cp_cmp(const void *x, const void *y) {
    const uint32_t *a = x, *c = y;
    return (a[0] > c[0]) - (a[0] < c[0]);
}

void cps_norm(gmr_cpset *s) {
    if (!s->n) return;
    qsort(s->r, s->n, 2 * sizeof *s->r, cp_cmp);
    size_t m = 0;
    for (size_t i = 1; i < s->n; i++) {
        if (s->r[2 * i] <= s->r[2 * m + 1] + 1) {
            if (s->r[2 * i + 1] > s->r[2 * m + 1]) s->r[2 * m + 1] = s->r[2 * i + 1];
        } else {
            m++;
            s->r[2 * m] = s->r[2 * i];
            s->r[2 * m + 1] = s->r[2 * i + 1];
        }
    }
    s->n = m + 1;
}

int cps_negate(gmr_cpset *s) {
    cps_norm(s);
    gmr_cpset t = {0};
    uint32_t next = 0;
    int rc = 0;
    for (size_t i = 0; i < s->n && !rc; i++) {
        if (s->r[2 * i] > next) rc = cps_add(&t, next, s->r[2 * i] - 1);
        next = s->r[2 * i + 1] + 1;
    }
    if (!rc && next <= 0x10FFFF) rc = cps_add(&t, next, 0x10FFFF);
    if (rc) {
        cps_free(&t);
        return rc;
    }
    cps_free(s);
    *s = t;
    return 0;
}

void cps_free(gmr_cpset *s) {
    free(s->r);
    memset(s, 0, sizeof *s);
}

/* ---- import ------------------------------------------------------------------------------------------------ */

uint32_t gb_import(gb *b, const gmr_grammar *g) {
    if (b->err) return UINT32_MAX;
    uint32_t base = b->n_rules;
    for (uint32_t r = 0; r < g->n_rules; r++) gb_rule_new(b);
    for (uint32_t r = 0; r < g->n_rules && !b->err; r++) {
        gb_define(b, base + r);
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            gb_seq s = {0};
            for (uint32_t e = g->alt_el[a]; g->el[e].kind != GK_END && !b->err; e++) {
                gmr_el x = g->el[e];
                if (x.kind == GK_BYTES) gb_bytes(b, &s, g->cls[x.a]);
                else if (x.kind == GK_RULE) gb_ref(b, &s, base + x.a);
                else gb_repeat(b, &s, base + x.a, x.min, x.max);
            }
            gb_alt(b, base + r, &s);
            gb_seq_free(&s);
        }
    }
    /* element 0 of a grammar is RULE root */
    return b->err ? UINT32_MAX : base + g->el[0].a;
}

/* ---- checks and flattening ------------------------------------------------------------------------------------- */

void gmr_grammar_free(gmr_grammar *g) {
    if (!g) return;
    KVS_FREE_ALL(g->rule_alt, g->alt_el, g->alt_first, g->alt_null, g->rule_null, g->el, g->null_from, g->cls, g);
}

static bool el_null(const gb *b, const uint8_t *rn, const gmr_el *e) {
    (void)b;
    if (e->kind == GK_BYTES) return false;
    if (e->kind == GK_RULE) return rn[e->a];
    return e->min == 0 || rn[e->a];
}

/* productive: an element derives a finite string when its rule does (a repeat allowing zero times always can) */
static bool el_prod(const gb *b, const uint8_t *prod, const gmr_el *e) {
    (void)b;
    if (e->kind == GK_RULE) return prod[e->a];
    if (e->kind == GK_REPEAT) return e->min == 0 || prod[e->a];
    return true;
}

/* nullable, once pruning has set max = 0 on the repeats that may only be taken zero times */
static bool el_null_pruned(const gb *b, const uint8_t *rn, const gmr_el *e) {
    return (e->kind == GK_REPEAT && !e->max) || el_null(b, rn, e);
}

/* Marks rules until nothing changes: rule r gets mark[r] = 1 once one alternative has el_ok on every element.
 * Highest ids first converge fastest. */
static void gb_fixpoint(const gb *b, uint8_t *mark, bool (*el_ok)(const gb *, const uint8_t *, const gmr_el *)) {
    for (bool ch = true; ch;) {
        ch = false;
        for (uint32_t r = b->n_rules; r-- > 0;) {
            if (mark[r]) continue;
            for (uint32_t a = 0; a < b->rules[r].n && !mark[r]; a++) {
                const gb_seq *s = &b->rules[r].alts[a];
                bool ok = true;
                for (uint32_t i = 0; i < s->n && ok; i++) ok = el_ok(b, mark, &s->v[i]);
                if (ok) mark[r] = 1, ch = true;
            }
        }
    }
}

/* drops the alternatives that reference unproductive rules, so that a matcher never enters a dead end */
static void gb_prune_unproductive(gb *b, const uint8_t *prod) {
    uint32_t R = b->n_rules;
    for (uint32_t r = 0; r < R; r++) {
        gb_rule *ru = &b->rules[r];
        uint32_t m = 0;
        for (uint32_t a = 0; a < ru->n; a++) {
            gb_seq *s = &ru->alts[a];
            bool ok = true;
            for (uint32_t i = 0; i < s->n && ok; i++)
                if (s->v[i].kind == GK_RULE) ok = prod[s->v[i].a];
                else if (s->v[i].kind == GK_REPEAT && !prod[s->v[i].a]) {
                    if (s->v[i].min) ok = false;
                    else s->v[i].max = 0; /* only zero times */
                }
            if (ok) ru->alts[m++] = *s;
            else gb_seq_free(s);
        }
        ru->n = m;
    }
}

/* repetitions of something empty would loop: rn holds the nullable rules */
static int gb_check_empty_repeats(gb *b, const uint8_t *rn) {
    uint32_t R = b->n_rules;
    int rc = 0;
    for (uint32_t r = 0; r < R && !rc; r++)
        for (uint32_t a = 0; a < b->rules[r].n && !rc; a++) {
            gb_seq *s = &b->rules[r].alts[a];
            for (uint32_t i = 0; i < s->n; i++)
                if (s->v[i].kind == GK_REPEAT && s->v[i].max && rn[s->v[i].a]) {
                    rc = gb_fail(b, KVS_ERR_UNSUPPORTED, "a repetition of something that can be empty");
                    break;
                }
        }
    return rc;
}

/* left recursion: edges r -> s where s can start r; Kahn's algorithm finds a cycle */
static int gb_check_left_recursion(gb *b, const uint8_t *rn) {
    uint32_t R = b->n_rules;
    int rc = 0;
    uint32_t *indeg = calloc(R, sizeof *indeg), *queue = malloc(R * sizeof *queue);
    if (!indeg || !queue) rc = gb_fail(b, KVS_ERR_NOMEM, "out of memory");
    for (int pass = 0; pass < 2 && !rc; pass++) {
        uint32_t qh = 0, qt = 0;
        if (pass == 1) {
            for (uint32_t r = 0; r < R; r++)
                if (!indeg[r]) queue[qt++] = r;
        }
        for (uint32_t k = 0; k < (pass == 0 ? R : qt); k++) {
            uint32_t r = pass == 0 ? k : queue[qh++];
            for (uint32_t a = 0; a < b->rules[r].n; a++) {
                gb_seq *s = &b->rules[r].alts[a];
                for (uint32_t i = 0; i < s->n; i++) {
                    gmr_el *e = &s->v[i];
                    if (e->kind == GK_REPEAT && !e->max) continue;
                    if (e->kind != GK_BYTES) {
                        if (pass == 0) indeg[e->a]++;
                        else if (--indeg[e->a] == 0) queue[qt++] = e->a;
                    }
                    if (!el_null(b, rn, e)) break;
                }
            }
        }
        if (pass == 1 && qt < R) rc = gb_fail(b, KVS_ERR_UNSUPPORTED, "left recursion (a rule can start with itself)");
    }
    free(indeg);
    free(queue);
    return rc;
}

/* FIRST sets of the alternatives of g: fixpoint over rules */
static int gb_first_sets(gb *b, gmr_grammar *g, const uint8_t *rn) {
    uint32_t R = b->n_rules;
    int rc = 0;
    uint8_t(*rf)[32] = calloc(R, 32);
    if (!rf) rc = gb_fail(b, KVS_ERR_NOMEM, "out of memory");
    for (bool ch = true; ch && !rc;) {
        ch = false;
        for (uint32_t r = R; r-- > 0;) {
            for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
                uint8_t f[32];
                memcpy(f, g->alt_first[a], 32);
                for (uint32_t e = g->alt_el[a]; g->el[e].kind != GK_END; e++) {
                    gmr_el *x = &g->el[e];
                    if (x->kind == GK_REPEAT && !x->max) continue;
                    const uint8_t *src = x->kind == GK_BYTES ? g->cls[x->a] : rf[x->a];
                    for (int k = 0; k < 32; k++) f[k] |= src[k];
                    if (!el_null(b, rn, x)) break;
                }
                if (memcmp(f, g->alt_first[a], 32)) {
                    memcpy(g->alt_first[a], f, 32);
                    ch = true;
                }
                for (int k = 0; k < 32; k++) rf[r][k] |= f[k];
            }
        }
    }
    free(rf);
    return rc;
}

int gb_finish(gb *b, uint32_t root, gmr_grammar **out) {
    *out = NULL;
    if (b->err) return b->err;
    if (root >= b->n_rules) return gb_fail(b, KVS_ERR_INVALID, "internal: bad root rule");
    uint32_t R = b->n_rules;
    for (uint32_t r = 0; r < R; r++)
        if (!b->rules[r].defined) return gb_fail(b, KVS_ERR_INVALID, "internal: rule %u never defined", r);
    uint8_t *prod = calloc(R, 1), *rn = calloc(R, 1);
    if (!prod || !rn) {
        free(prod);
        free(rn);
        return gb_fail(b, KVS_ERR_NOMEM, "out of memory");
    }
    /* productive rules (can derive a finite string), then nullable ones */
    gb_fixpoint(b, prod, el_prod);
    if (!prod[root]) {
        free(prod);
        free(rn);
        return gb_fail(b, KVS_ERR_LIMIT, "the grammar admits no finite value (contradictory keywords, or a recursion without a base case)");
    }
    /* prune alternatives that reference unproductive rules, so that a matcher never enters a dead end */
    gb_prune_unproductive(b, prod);
    gb_fixpoint(b, rn, el_null_pruned);
    /* repetitions of something empty would loop */
    int rc = gb_check_empty_repeats(b, rn);
    if (!rc) rc = gb_check_left_recursion(b, rn);
    gmr_grammar *g = NULL;
    if (!rc) {
        g = calloc(1, sizeof *g);
        if (!g) rc = gb_fail(b, KVS_ERR_NOMEM, "out of memory");
    }
    if (!rc) {
        uint32_t n_alts = 0, n_el = 2;
        for (uint32_t r = 0; r < R; r++) {
            n_alts += b->rules[r].n;
            for (uint32_t a = 0; a < b->rules[r].n; a++) n_el += b->rules[r].alts[a].n + 1;
        }
        g->n_rules = R;
        g->n_alts = n_alts;
        g->n_el = n_el;
        g->n_cls = b->n_cls;
        g->rule_alt = malloc((R + 1) * sizeof *g->rule_alt);
        g->alt_el = malloc((n_alts + 1) * sizeof *g->alt_el);
        g->alt_first = calloc(n_alts + 1, sizeof *g->alt_first);
        g->alt_null = calloc(n_alts + 1, 1);
        g->rule_null = malloc(R);
        g->el = malloc(n_el * sizeof *g->el);
        g->null_from = calloc(n_el, 1);
        g->cls = malloc((b->n_cls + 1) * sizeof *g->cls);
        if (!g->rule_alt || !g->alt_el || !g->alt_first || !g->alt_null || !g->rule_null || !g->el || !g->null_from ||
            !g->cls) {
            rc = gb_fail(b, KVS_ERR_NOMEM, "out of memory");
        } else {
            if (b->n_cls) memcpy(g->cls, b->cls, b->n_cls * sizeof *g->cls);
            memcpy(g->rule_null, rn, R);
            g->el[0] = (gmr_el){GK_RULE, root, 0, 0};
            g->el[1] = (gmr_el){GK_END, 0, 0, 0};
            uint32_t ai = 0, ei = 2;
            for (uint32_t r = 0; r < R; r++) {
                g->rule_alt[r] = ai;
                for (uint32_t a = 0; a < b->rules[r].n; a++) {
                    gb_seq *s = &b->rules[r].alts[a];
                    g->alt_el[ai++] = ei;
                    for (uint32_t i = 0; i < s->n; i++) g->el[ei++] = s->v[i];
                    g->el[ei++] = (gmr_el){GK_END, 0, 0, 0};
                }
            }
            g->rule_alt[R] = ai;
            /* null_from, backwards within each alternative */
            g->null_from[1] = 1;
            for (uint32_t e = n_el; e-- > 2;) {
                gmr_el *x = &g->el[e];
                if (x->kind == GK_END) g->null_from[e] = 1;
                else g->null_from[e] = (uint8_t)(g->null_from[e + 1] && (x->kind == GK_REPEAT && !x->max ? true : el_null(b, rn, x)));
            }
            g->null_from[0] = rn[root];
            for (uint32_t a = 0; a < n_alts; a++) g->alt_null[a] = g->null_from[g->alt_el[a]];
            rc = gb_first_sets(b, g, rn);
        }
    }
    free(prod);
    free(rn);
    if (rc) {
        gmr_grammar_free(g);
        return rc;
    }
    *out = g;
    return 0;
}
