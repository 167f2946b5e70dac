/* tpl_builtins.c: the globals (range, namespace, dict, raise_exception, strftime_now), filters, tests and the
 * methods of strings, lists, dicts and loop objects, with Python's and jinja2's semantics. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

/* ---- argument helpers ------------------------------------------------------------------------------------- */

typedef struct fargs {
    tv *pos;
    int npos;
    const char **kwn;
    tv *kwv;
    int nkw;
} fargs;

/* the argument at position i or named `name`, or NULL */
static tv *arg(fargs *a, int i, const char *name) {
    if (i >= 0 && i < a->npos) return &a->pos[i];
    for (int k = 0; name && k < a->nkw; k++)
        if (!strcmp(a->kwn[k], name)) return &a->kwv[k];
    return NULL;
}

static bool arg_bool(fargs *a, int i, const char *name, bool dflt) {
    tv *v = arg(a, i, name);
    return v ? tv_truthy(*v) : dflt;
}

static int need_str(tctx *c, const node *n, tv *v, const char *what, tstr **out) {
    if (!v || v->t != TV_STR)
        return tpl_fail(c, n, KVS_ERR_TYPE, "%s must be a string, not %s", what, v ? tv_typename(*v) : "nothing");
    *out = v->s;
    return 0;
}

static bool is_intlike(tv v) { return v.t == TV_INT || v.t == TV_BOOL; }
static int64_t ival(tv v) { return v.t == TV_INT ? v.i : v.t == TV_BOOL ? v.b : 0; }

static int undef_err(tctx *c, const node *n, tv v) {
    return tpl_fail(c, n, KVS_ERR_TYPE, "'%s' is undefined", v.uname ? v.uname : "value");
}

/* ---- UTF-8 and Python whitespace ---------------------------------------------------------------------------- */


/* start of the code point ending at s[end) */
static size_t prev_cp(const char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80 && end - i < 4) i--;
    return i;
}

static bool py_space(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

static bool in_chars(uint32_t cp, const tstr *chars) {
    for (size_t i = 0; i < chars->len;) {
        uint32_t x;
        i += tpl_u8_dec(chars->data + i, chars->len - i, &x);
        if (x == cp) return true;
    }
    return false;
}

/* strip: which 1 left, 2 right, 3 both; chars NULL = whitespace */
static int do_strip(tctx *c, const node *n, tstr *s, const tstr *chars, int which, tv *out) {
    size_t a = 0, b = s->len;
    if (which & 1)
        while (a < b) {
            uint32_t cp;
            size_t l = tpl_u8_dec(s->data + a, b - a, &cp);
            if (chars ? !in_chars(cp, chars) : !py_space(cp)) break;
            a += l;
        }
    if (which & 2)
        while (b > a) {
            size_t p = prev_cp(s->data, b);
            if (p < a) p = a;
            uint32_t cp;
            tpl_u8_dec(s->data + p, b - p, &cp);
            if (chars ? !in_chars(cp, chars) : !py_space(cp)) break;
            b = p;
        }
    return tstr_sub(c, n, s, a, b - a, out);
}

/* ---- case ------------------------------------------------------------------------------------------------- */

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAP, CASE_JTITLE };

/* Simple case mappings of ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (U+0400..U+045F); other code
 * points map to themselves and count as uncased. 0 in *extra unless the mapping is two code points. */
static uint32_t cp_upper(uint32_t cp, uint32_t *extra) {
    *extra = 0;
    if (cp >= 'a' && cp <= 'z') return cp - 32;
    if (cp < 0x80) return cp;
    if (cp == 0x149) { *extra = 'N'; return 0x2BC; }
    if (cp == 0xB5) return 0x39C;
    if (cp == 0xDF) { *extra = 'S'; return 'S'; }
    if (cp >= 0xE0 && cp <= 0xFE && cp != 0xF7) return cp - 32;
    if (cp == 0xFF) return 0x178;
    if (cp == 0x131) return 'I';
    if (cp == 0x17F) return 'S';
    if ((cp >= 0x100 && cp <= 0x12F) || (cp >= 0x132 && cp <= 0x137) || (cp >= 0x14A && cp <= 0x177))
        return cp & 1 ? cp - 1 : cp;
    if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E)) return cp & 1 ? cp : cp - 1;
    if (cp == 0x3C2) return 0x3A3;
    if ((cp >= 0x3B1 && cp <= 0x3C1) || (cp >= 0x3C3 && cp <= 0x3CB)) return cp - 32;
    if (cp == 0x3AC) return 0x386;
    if (cp >= 0x3AD && cp <= 0x3AF) return cp - 37;
    if (cp == 0x3CC) return 0x38C;
    if (cp == 0x3CD || cp == 0x3CE) return cp - 63;
    if (cp >= 0x430 && cp <= 0x44F) return cp - 32;
    if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
    return cp;
}

static uint32_t cp_lower(uint32_t cp, uint32_t *extra) {
    *extra = 0;
    if (cp >= 'A' && cp <= 'Z') return cp + 32;
    if (cp < 0x80) return cp;
    if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 32;
    if (cp == 0x178) return 0xFF;
    if (cp == 0x130) { *extra = 0x307; return 'i'; }
    if ((cp >= 0x100 && cp <= 0x12F) || (cp >= 0x132 && cp <= 0x137) || (cp >= 0x14A && cp <= 0x177))
        return cp & 1 ? cp : cp + 1;
    if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E)) return cp & 1 ? cp + 1 : cp;
    if ((cp >= 0x391 && cp <= 0x3A1) || (cp >= 0x3A3 && cp <= 0x3AB)) return cp + 32;
    if (cp == 0x386) return 0x3AC;
    if (cp >= 0x388 && cp <= 0x38A) return cp + 37;
    if (cp == 0x38C) return 0x3CC;
    if (cp == 0x38E || cp == 0x38F) return cp + 63;
    if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
    if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
    return cp;
}

/* Python's "cased": the letters of the covered blocks that have case (ª and º included, as Unicode says) */
static bool cp_cased(uint32_t cp) {
    if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z');
    return cp == 0xAA || cp == 0xB5 || cp == 0xBA || (cp >= 0xC0 && cp <= 0x17F && cp != 0xD7 && cp != 0xF7) ||
           cp == 0x386 || (cp >= 0x388 && cp <= 0x3CE && cp != 0x38B && cp != 0x38D && cp != 0x3A2) ||
           (cp >= 0x400 && cp <= 0x45F);
}

/* a letter followed (after case-ignorable marks, none handled here) by no further cased letter: Python's final
 * sigma rule for lower() */
static bool final_sigma(const tstr *s, size_t at, size_t len, bool prev_cased) {
    if (!prev_cased) return false;
    size_t j = at + len;
    if (j >= s->len) return true;
    uint32_t nx;
    tpl_u8_dec(s->data + j, s->len - j, &nx);
    return !cp_cased(nx);
}

static void put_cp(kvs_buf *b, uint32_t cp) {
    char u[4];
    size_t k = 0;
    if (cp < 0x80) u[k++] = (char)cp;
    else if (cp < 0x800) { u[k++] = (char)(0xC0 | cp >> 6); u[k++] = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) { u[k++] = (char)(0xE0 | cp >> 12); u[k++] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[k++] = (char)(0x80 | (cp & 0x3F)); }
    else { u[k++] = (char)(0xF0 | cp >> 18); u[k++] = (char)(0x80 | ((cp >> 12) & 0x3F)); u[k++] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[k++] = (char)(0x80 | (cp & 0x3F)); }
    kvs_buf_append(b, u, k);
}

/* upper / lower / str.title / capitalize / jinja2's title filter (words split at whitespace and -({[<) */
static int do_case(tctx *c, const node *n, tstr *s, int mode, tv *out) {
    kvs_buf b = {0};
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp, extra = 0, o;
        size_t l = tpl_u8_dec(s->data + i, s->len - i, &cp);
        if (l == 1 && cp >= 0x80) {   /* a stray byte stays as it is */
            kvs_buf_putc(&b, s->data[i]);
            i++;
            prev_cased = false;
            first = false;
            continue;
        }
        bool cased = cp_cased(cp), up;
        switch (mode) {
        case CASE_UPPER: up = true; break;
        case CASE_LOWER: up = false; break;
        case CASE_TITLE: up = !prev_cased; break;
        case CASE_CAP: up = first; break;
        default: up = first; break;
        }
        if (up) {
            o = cp_upper(cp, &extra);
            if (cp == 0xDF && (mode == CASE_TITLE || mode == CASE_CAP)) extra = 's';   /* titlecase of ß is Ss */
        } else if (cp == 0x3A3 && final_sigma(s, i, l, prev_cased)) {
            o = 0x3C2;
        } else {
            o = cp_lower(cp, &extra);
        }
        if (up && (cp == 0x390 || cp == 0x3B0)) {   /* ΐ and ΰ have no single capital: three code points */
            put_cp(&b, cp == 0x390 ? 0x399 : 0x3A5);
            put_cp(&b, 0x308);
            put_cp(&b, 0x301);
        } else {
            put_cp(&b, o);
            if (extra) put_cp(&b, extra);
        }
        prev_cased = cased && !(mode == CASE_JTITLE && first);   /* jinja2 lowers each word's tail on its own */
        first = mode == CASE_JTITLE ? (py_space(cp) || (cp < 0x80 && strchr("-({[<", (int)cp))) : false;
        i += l;
    }
    int rc = b.oom ? tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory") : tstr_new(c, n, b.data ? b.data : "", b.len, out);
    kvs_buf_free(&b);
    return rc;
}

/* ---- iteration -------------------------------------------------------------------------------------------- */

int tpl_iter_list(tctx *c, const node *n, tv v, tv *out) {
    int rc;
    switch (v.t) {
    case TV_UNDEF: return tcont_new(c, n, TC_LIST, 0, out);
    case TV_LIST:
    case TV_DICT:
        if (v.t == TV_DICT && v.c->kind == TC_NS) break;
        if ((rc = tcont_new(c, n, TC_LIST, v.c->n, out))) return rc;
        for (size_t i = 0; i < v.c->n; i++) {
            tv x = v.t == TV_DICT ? v.c->keys[i] : v.c->items[i];
            tv_incref(x);
            if ((rc = tlist_push(c, n, out->c, x))) return rc;
        }
        return 0;
    case TV_STR:
        if ((rc = tcont_new(c, n, TC_LIST, 0, out))) return rc;
        for (size_t i = 0; i < v.s->len;) {
            uint32_t cp;
            size_t l = tpl_u8_dec(v.s->data + i, v.s->len - i, &cp);
            tv ch;
            if ((rc = tpl_step(c, n)) || (rc = tstr_sub(c, n, v.s, i, l, &ch)) || (rc = tlist_push(c, n, out->c, ch))) return rc;
            i += l;
        }
        return 0;
    default: break;
    }
    return tpl_fail(c, n, KVS_ERR_TYPE, "'%s' object is not iterable", tv_typename(v));
}

/* attribute path "a.b.0" of v (jinja2's make_attrgetter): new reference, undefined when missing */
static int attr_path(tctx *c, const node *n, tv v, const tstr *path, tv *out) {
    tv cur = v;
    tv_incref(cur);
    size_t i = 0;
    while (i <= path->len) {
        size_t j = i;
        while (j < path->len && path->data[j] != '.') j++;
        char part[128];
        size_t pl = j - i < sizeof part - 1 ? j - i : sizeof part - 1;
        memcpy(part, path->data + i, pl);
        part[pl] = 0;
        tv next;
        int rc;
        bool digits = pl > 0;
        for (size_t k = 0; k < pl; k++) digits = digits && isdigit((unsigned char)part[k]);
        if (cur.t == TV_UNDEF) { *out = cur; return 0; }
        if (digits && cur.t != TV_DICT) rc = tpl_getitem(c, n, cur, tv_int(strtoll(part, NULL, 10)), &next);
        else {
            tv key;
            if ((rc = tstr_new(c, n, part, pl, &key))) { tv_decref(c, cur); return rc; }
            rc = tpl_getitem(c, n, cur, key, &next);
            tv_decref(c, key);
        }
        tv_decref(c, cur);
        if (rc) return rc;
        if (next.t == TV_UNDEF) next.uname = NULL;
        cur = next;
        i = j + 1;
    }
    *out = cur;
    return 0;
}

/* ---- sort helpers ------------------------------------------------------------------------------------------- */

typedef struct sortctx {
    tctx *c;
    const node *n;
    bool ci;          /* case-insensitive for strings */
    int err;
} sortctx;

static int cmp_vals(sortctx *s, tv a, tv b) {
    int r = 0;
    if (s->ci && a.t == TV_STR && b.t == TV_STR) {
        size_t m = a.s->len < b.s->len ? a.s->len : b.s->len;
        for (size_t i = 0; i < m && !r; i++) {
            int x = tolower((unsigned char)a.s->data[i]), y = tolower((unsigned char)b.s->data[i]);
            r = (x > y) - (x < y);
        }
        return r ? r : (a.s->len > b.s->len) - (a.s->len < b.s->len);
    }
    if (!s->err && tv_compare(s->c, s->n, a, b, &r)) s->err = s->c->errcode;
    return r;
}

/* stable merge sort of keys[] carrying vals[] */
static void msort(sortctx *s, tv *keys, tv *vals, tv *tk, tv *tvl, size_t n, bool rev) {
    if (n < 2) return;
    size_t h = n / 2;
    msort(s, keys, vals, tk, tvl, h, rev);
    msort(s, keys + h, vals + h, tk, tvl, n - h, rev);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = cmp_vals(s, keys[j], keys[i]);
        bool take_right = rev ? r > 0 : r < 0;
        if (take_right) { tk[k] = keys[j]; tvl[k++] = vals[j++]; }
        else { tk[k] = keys[i]; tvl[k++] = vals[i++]; }
    }
    while (i < h) { tk[k] = keys[i]; tvl[k++] = vals[i++]; }
    while (j < n) { tk[k] = keys[j]; tvl[k++] = vals[j++]; }
    memcpy(keys, tk, n * sizeof *keys);
    memcpy(vals, tvl, n * sizeof *vals);
}

/* sorts list items (new list out) by key = attribute path or the item itself */
static int sort_list(tctx *c, const node *n, tv list, const tstr *attr, bool ci, bool rev, int kind, tv *out) {
    size_t cnt = list.c->n;
    int rc = tpl_mem(c, n, cnt * 4 * sizeof(tv));
    if (rc) return rc;
    tv *keys = malloc((cnt + 1) * sizeof(tv)), *vals = malloc((cnt + 1) * sizeof(tv));
    tv *tk = malloc((cnt + 1) * sizeof(tv)), *tvl = malloc((cnt + 1) * sizeof(tv));
    size_t nk = 0;
    if (!keys || !vals || !tk || !tvl) { rc = tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory"); goto out; }
    for (; nk < cnt && !rc; nk++) {
        vals[nk] = list.c->items[nk];
        if (attr) rc = attr_path(c, n, vals[nk], attr, &keys[nk]);
        else { keys[nk] = vals[nk]; tv_incref(keys[nk]); }
        if (rc) break;
        rc = tpl_step(c, n);
    }
    if (!rc) {
        sortctx s = {c, n, ci, 0};
        msort(&s, keys, vals, tk, tvl, nk, rev);
        rc = s.err;
    }
    if (!rc) rc = tcont_new(c, n, kind, nk, out);
    for (size_t i = 0; !rc && i < nk; i++) {
        tv_incref(vals[i]);
        rc = tlist_push(c, n, out->c, vals[i]);
    }
out:
    for (size_t i = 0; keys && i < nk; i++) tv_decref(c, keys[i]);
    free(keys); free(vals); free(tk); free(tvl);
    tpl_unmem(c, cnt * 4 * sizeof(tv));
    return rc;
}

/* ---- globals ----------------------------------------------------------------------------------------------- */

int tpl_call_global(tctx *c, const node *n, int fn, tv *pos, int npos, const char **kwn, tv *kwv, int nkw, tv *out) {
    fargs a = {pos, npos, kwn, kwv, nkw};
    int rc;
    switch (fn) {
    case FN_RANGE: {
        int64_t start = 0, stop, step = 1;
        for (int i = 0; i < npos; i++)
            if (!is_intlike(pos[i])) return tpl_fail(c, n, KVS_ERR_TYPE, "range() arguments must be integers");
        if (npos == 1) stop = ival(pos[0]);
        else if (npos == 2 || npos == 3) {
            start = ival(pos[0]);
            stop = ival(pos[1]);
            if (npos == 3) step = ival(pos[2]);
        } else return tpl_fail(c, n, KVS_ERR_TYPE, "range expected 1 to 3 arguments, got %d", npos);
        if (step == 0) return tpl_fail(c, n, KVS_ERR_INVALID, "range() arg 3 must not be zero");
        double cnt = step > 0 ? ceil(((double)stop - (double)start) / (double)step) : ceil(((double)start - (double)stop) / (double)-step);
        if (cnt < 0) cnt = 0;
        if (cnt > (double)(c->t->lim.max_steps - (c->steps < c->t->lim.max_steps ? c->steps : c->t->lim.max_steps)))
            return tpl_fail(c, n, KVS_ERR_LIMIT, "range of %.0f items exceeds the step limit", cnt);
        if ((rc = tcont_new(c, n, TC_LIST, (size_t)cnt, out))) return rc;
        for (size_t i = 0; i < (size_t)cnt; i++) {
            if ((rc = tpl_step(c, n)) || (rc = tlist_push(c, n, out->c, tv_int(start + (int64_t)i * step)))) return rc;
        }
        return 0;
    }
    case FN_NAMESPACE: case FN_DICT: {
        if ((rc = tcont_new(c, n, fn == FN_NAMESPACE ? TC_NS : TC_DICT, 0, out))) return rc;
        for (int i = 0; i < npos; i++) {
            if (pos[i].t != TV_DICT) return tpl_fail(c, n, KVS_ERR_TYPE, "%s() takes a mapping", fn == FN_DICT ? "dict" : "namespace");
            for (size_t k = 0; k < pos[i].c->n; k++) {
                tv_incref(pos[i].c->items[k]);
                if ((rc = tdict_set(c, n, out->c, pos[i].c->keys[k], pos[i].c->items[k]))) return rc;
            }
        }
        for (int k = 0; k < nkw; k++) {
            tv_incref(kwv[k]);
            if ((rc = tdict_setc(c, n, out->c, kwn[k], kwv[k]))) return rc;
        }
        return 0;
    }
    case FN_RAISE: {
        tv *m = arg(&a, 0, "message");
        kvs_buf b = {0};
        if (m) tv_repr(c, n, *m, &b, 0);
        rc = tpl_fail(c, n, KVS_ERR_RAISED, "%s", b.data ? b.data : "raise_exception called");
        kvs_buf_free(&b);
        return rc;
    }
    case FN_STRFTIME: {
        tstr *fmt = NULL;
        if ((rc = need_str(c, n, arg(&a, 0, "format"), "strftime_now's format", &fmt))) return rc;
        struct tm tm = c->now;
        tm.tm_isdst = 0;
        time_t t = timegm(&tm);   /* normalizes and fills the weekday and day of the year */
        struct tm norm;
        if (t == (time_t)-1 || !gmtime_r(&t, &norm)) norm = c->now;
        norm.tm_isdst = c->now.tm_isdst;
        char buf[512];
        if (fmt->len > 200 || memchr(fmt->data, 0, fmt->len))
            return tpl_fail(c, n, KVS_ERR_INVALID, "strftime_now format too long");
        size_t len = fmt->len ? strftime(buf, sizeof buf, fmt->data, &norm) : 0;
        return tstr_new(c, n, buf, len, out);
    }
    default:
        return tpl_fail(c, n, KVS_ERR_TYPE, "not callable");
    }
}

/* ---- tests ------------------------------------------------------------------------------------------------- */

int tpl_test(tctx *c, const node *n, const char *name, tv v, tv *args, int nargs, bool *out) {
    tv a0 = nargs > 0 ? args[0] : tv_undef(NULL);
    int r = 0, rc;
    if (!strcmp(name, "defined")) *out = v.t != TV_UNDEF;
    else if (!strcmp(name, "undefined")) *out = v.t == TV_UNDEF;
    else if (!strcmp(name, "none")) *out = v.t == TV_NONE;
    else if (!strcmp(name, "string")) *out = v.t == TV_STR;
    else if (!strcmp(name, "number")) *out = v.t == TV_INT || v.t == TV_FLOAT || v.t == TV_BOOL;
    else if (!strcmp(name, "integer")) *out = v.t == TV_INT;
    else if (!strcmp(name, "float")) *out = v.t == TV_FLOAT;
    else if (!strcmp(name, "boolean")) *out = v.t == TV_BOOL;
    else if (!strcmp(name, "true")) *out = v.t == TV_BOOL && v.b;
    else if (!strcmp(name, "false")) *out = v.t == TV_BOOL && !v.b;
    else if (!strcmp(name, "mapping")) *out = v.t == TV_DICT && v.c->kind == TC_DICT;
    else if (!strcmp(name, "sequence")) *out = v.t == TV_STR || v.t == TV_UNDEF || (v.t == TV_LIST && v.c->kind != TC_GEN) || (v.t == TV_DICT && v.c->kind == TC_DICT);
    else if (!strcmp(name, "iterable")) *out = v.t == TV_STR || v.t == TV_LIST || v.t == TV_UNDEF || (v.t == TV_DICT && v.c->kind == TC_DICT);
    else if (!strcmp(name, "callable")) *out = v.t == TV_FUNC || v.t == TV_MACRO || v.t == TV_CALLER;
    else if (!strcmp(name, "escaped")) *out = false;
    else if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (v.t == TV_UNDEF) return undef_err(c, n, v);
        if (!is_intlike(v) && v.t != TV_FLOAT) return tpl_fail(c, n, KVS_ERR_TYPE, "unsupported operand for %%: '%s'", tv_typename(v));
        double x = v.t == TV_FLOAT ? v.f : (double)ival(v);
        bool odd = fmod(fabs(x), 2.0) == 1.0;
        *out = name[0] == 'o' ? odd : !odd && fmod(x, 1.0) == 0;
    } else if (!strcmp(name, "divisibleby")) {
        bool vn = is_intlike(v) || v.t == TV_FLOAT, an = is_intlike(a0) || a0.t == TV_FLOAT;
        if (!vn || !an) return tpl_fail(c, n, KVS_ERR_TYPE, "divisibleby needs numbers");
        if (is_intlike(v) && is_intlike(a0)) {
            if (ival(a0) == 0) return tpl_fail(c, n, KVS_ERR_INVALID, "integer division or modulo by zero");
            *out = ival(a0) == -1 || ival(v) % ival(a0) == 0;
        } else {
            double x = v.t == TV_FLOAT ? v.f : (double)ival(v), y = a0.t == TV_FLOAT ? a0.f : (double)ival(a0);
            if (y == 0) return tpl_fail(c, n, KVS_ERR_INVALID, "float modulo by zero");
            *out = fmod(x, y) == 0;
        }
    } else if (!strcmp(name, "sameas")) {   /* identity: containers by address, scalars of one type by value */
        *out = v.t == a0.t && ((v.t != TV_LIST && v.t != TV_DICT) ? tv_equal(v, a0) : v.c == a0.c);
    } else if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==")) return tpl_equal(c, n, v, a0, out);
    else if (!strcmp(name, "ne") || !strcmp(name, "!=")) { if ((rc = tpl_equal(c, n, v, a0, out))) return rc; *out = !*out; }
    else if (!strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "<")) { if ((rc = tv_compare(c, n, v, a0, &r))) return rc; *out = r < 0; }
    else if (!strcmp(name, "le") || !strcmp(name, "<=")) { if ((rc = tv_compare(c, n, v, a0, &r))) return rc; *out = r <= 0; }
    else if (!strcmp(name, "gt") || !strcmp(name, "greaterthan") || !strcmp(name, ">")) { if ((rc = tv_compare(c, n, v, a0, &r))) return rc; *out = r > 0; }
    else if (!strcmp(name, "ge") || !strcmp(name, ">=")) { if ((rc = tv_compare(c, n, v, a0, &r))) return rc; *out = r >= 0; }
    else if (!strcmp(name, "in")) {
        *out = false;
        if (a0.t == TV_STR && v.t == TV_STR) *out = !v.s->len || memmem(a0.s->data, a0.s->len, v.s->data, v.s->len);
        else if (a0.t == TV_LIST) { for (size_t i = 0; i < a0.c->n && !*out; i++) if ((rc = tpl_equal(c, n, a0.c->items[i], v, out))) return rc; }
        else if (a0.t == TV_DICT) *out = tdict_getv(a0.c, v) != NULL;
        else if (a0.t != TV_UNDEF) return tpl_fail(c, n, KVS_ERR_TYPE, "argument of type '%s' is not iterable", tv_typename(a0));
    } else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        *out = false;
        if (v.t == TV_STR) {
            bool any = false, ok = true;
            for (size_t i = 0; i < v.s->len; i++) {
                unsigned char ch = (unsigned char)v.s->data[i];
                if (isalpha(ch) && ch < 0x80) { any = true; if (name[0] == 'l' ? isupper(ch) : islower(ch)) ok = false; }
            }
            *out = any && ok;
        }
    } else {
        return tpl_fail(c, n, KVS_ERR_TYPE, "no test named '%s'", name);
    }
    return 0;
}

/* ---- filters ------------------------------------------------------------------------------------------------ */

static int to_str(tctx *c, const node *n, tv v, tv *out) { return tv_tostr(c, n, v, out); }

static int do_join(tctx *c, const node *n, tv seq, const tstr *sep, const tstr *attr, tv *out) {
    tv items;
    int rc = tpl_iter_list(c, n, seq, &items);
    if (rc) return rc;
    tsink s = {0};
    for (size_t i = 0; i < items.c->n && !rc; i++) {
        if ((rc = tpl_step(c, n))) break;
        if (i && sep) rc = tsink_putstr(c, n, &s, sep);
        tv x = items.c->items[i];
        if (attr) {
            tv y;
            if (!rc && !(rc = attr_path(c, n, x, attr, &y))) {
                rc = tv_print(c, n, y, &s);
                tv_decref(c, y);
            }
        } else if (!rc) rc = tv_print(c, n, x, &s);
    }
    if (!rc) rc = tsink_take(c, n, &s, out);
    tsink_free(&s);
    tv_decref(c, items);
    return rc;
}

static int do_replace(tctx *c, const node *n, tstr *s, tstr *old, tstr *new, int64_t count, tv *out) {
    kvs_buf b = {0};
    int rc = 0;
    int64_t done = 0;
    if (!old->len) {
        /* Python inserts `new` between code points and at both ends */
        size_t i = 0;
        while (!rc) {
            if (count < 0 || done < count) { kvs_buf_append(&b, new->data, new->len); done++; }
            if (i >= s->len) break;
            uint32_t cp;
            size_t l = tpl_u8_dec(s->data + i, s->len - i, &cp);
            kvs_buf_append(&b, s->data + i, l);
            i += l;
            if (b.len > c->t->lim.max_output) rc = tpl_fail(c, n, KVS_ERR_LIMIT, "string too long");
        }
    } else {
        size_t i = 0;
        while (i < s->len && !rc) {
            const char *f = (count < 0 || done < count) ? memmem(s->data + i, s->len - i, old->data, old->len) : NULL;
            if (!f) { kvs_buf_append(&b, s->data + i, s->len - i); break; }
            kvs_buf_append(&b, s->data + i, (size_t)(f - (s->data + i)));
            kvs_buf_append(&b, new->data, new->len);
            i = (size_t)(f - s->data) + old->len;
            done++;
            if (b.len > c->t->lim.max_output) rc = tpl_fail(c, n, KVS_ERR_LIMIT, "string too long");
        }
    }
    if (!rc && b.oom) rc = tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
    if (!rc) rc = tstr_new(c, n, b.data ? b.data : "", b.len, out);
    kvs_buf_free(&b);
    return rc;
}

static int do_indent(tctx *c, const node *n, tstr *s, tstr *ind, bool first, bool blank, tv *out) {
    /* jinja2: s += "\n"; lines = s.splitlines(); first line unindented unless `first`; empty lines kept bare
     * unless `blank` */
    kvs_buf b = {0};
    size_t i = 0, line = 0;
    int rc = 0;
    while (i <= s->len) {
        size_t j = i;
        while (j < s->len && s->data[j] != '\n') j++;
        if (j >= s->len) {   /* the last piece: s + "\n" makes it a line of its own only when non-empty */
            if (j == i && line > 0) break;
        }
        if (line > 0) kvs_buf_putc(&b, '\n');
        bool empty = j == i;
        if ((line > 0 || first) && (!empty || blank)) kvs_buf_append(&b, ind->data, ind->len);
        kvs_buf_append(&b, s->data + i, j - i);
        line++;
        if (b.len > c->t->lim.max_output) { rc = tpl_fail(c, n, KVS_ERR_LIMIT, "string too long"); break; }
        if (j >= s->len) break;
        i = j + 1;
        if (i == s->len) {   /* a trailing newline: the appended "\n" gives one more empty line */
            kvs_buf_putc(&b, '\n');
            if (blank) kvs_buf_append(&b, ind->data, ind->len);
            break;
        }
    }
    if (!rc && b.oom) rc = tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
    if (!rc) rc = tstr_new(c, n, b.data ? b.data : "", b.len, out);
    kvs_buf_free(&b);
    return rc;
}

int tpl_html_escape(tctx *c, const node *n, tstr *s, tv *out) {
    if (s->safe) { tv v = tv_str(s); tv_incref(v); *out = v; return 0; }
    kvs_buf b = {0};
    for (size_t i = 0; i < s->len; i++) {
        switch (s->data[i]) {
        case '&': kvs_buf_puts(&b, "&amp;"); break;
        case '<': kvs_buf_puts(&b, "&lt;"); break;
        case '>': kvs_buf_puts(&b, "&gt;"); break;
        case '"': kvs_buf_puts(&b, "&#34;"); break;
        case '\'': kvs_buf_puts(&b, "&#39;"); break;
        default: kvs_buf_putc(&b, s->data[i]);
        }
    }
    int rc = b.oom ? tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory") : tstr_new(c, n, b.data ? b.data : "", b.len, out);
    if (!rc) out->s->safe = true;
    kvs_buf_free(&b);
    return rc;
}

/* parses a Python int / float literal from a string */
static bool parse_int(const tstr *s, int base, int64_t *out) {
    char buf[80];
    if (s->len >= sizeof buf) return false;
    memcpy(buf, s->data, s->len);
    buf[s->len] = 0;
    char *p = buf;
    while (isspace((unsigned char)*p)) p++;
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, base);
    if (end == p || errno) return false;
    while (isspace((unsigned char)*end)) end++;
    if (*end) return false;
    *out = v;
    return true;
}

static bool parse_float(const tstr *s, double *out) {
    char buf[80];
    if (s->len >= sizeof buf) return false;
    memcpy(buf, s->data, s->len);
    buf[s->len] = 0;
    char *p = buf, *end;
    while (isspace((unsigned char)*p)) p++;
    if (!*p || (p[0] == '0' && (p[1] == 'x' || p[1] == 'X'))) return false;
    double v = strtod(p, &end);
    if (end == p) return false;
    while (isspace((unsigned char)*end)) end++;
    if (*end) return false;
    *out = v;
    return true;
}

static int to_gen(tctx *c, const node *n, tv *out) { return tcont_new(c, n, TC_GEN, 0, out); }

int tpl_filter(tctx *c, const node *n, const char *name, tv in, tv *pos, int npos, const char **kwn, tv *kwv,
               int nkw, tv *out) {
    fargs a = {pos, npos, kwn, kwv, nkw};
    int rc;
    tv s;
    tstr *x = NULL;
    if (!strcmp(name, "safe")) {
        if ((rc = to_str(c, n, in, &s))) return rc;
        if (s.s->safe) { *out = s; return 0; }
        tsink sk = {0};
        rc = tsink_putstr(c, n, &sk, s.s);
        if (!rc) rc = tsink_take(c, n, &sk, out);
        if (!rc) out->s->safe = true;
        tsink_free(&sk);
        tv_decref(c, s);
        return rc;
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        tv *dv = arg(&a, 0, "default_value");
        bool boolean = arg_bool(&a, 1, "boolean", false);
        if (in.t == TV_UNDEF || (boolean && !tv_truthy(in))) {
            if (dv) { tv_incref(*dv); *out = *dv; return 0; }
            return tstr_new(c, n, "", 0, out);
        }
        tv_incref(in);
        *out = in;
        return 0;
    }
    if (!strcmp(name, "tojson")) {
        /* transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
        tv *av = arg(&a, 0, "ensure_ascii"), *iv = arg(&a, 1, "indent"), *sv = arg(&a, 2, "separators");
        tpl_json_opts o = {.indent = -1, .item_sep = ", ", .key_sep = ": ", .sort_keys = arg_bool(&a, 3, "sort_keys", false),
                           .ensure_ascii = av && tv_truthy(*av)};
        char seps[2][16];
        if (iv && iv->t != TV_NONE) {
            if (!is_intlike(*iv)) return tpl_fail(c, n, KVS_ERR_UNSUPPORTED, "tojson indent must be an integer");
            o.indent = ival(*iv) < 0 ? 0 : ival(*iv) > 64 ? 64 : (int)ival(*iv);
            o.item_sep = ",";
        }
        if (sv && sv->t != TV_NONE) {
            if (sv->t != TV_LIST || sv->c->n != 2 || sv->c->items[0].t != TV_STR || sv->c->items[1].t != TV_STR ||
                sv->c->items[0].s->len >= sizeof seps[0] || sv->c->items[1].s->len >= sizeof seps[1])
                return tpl_fail(c, n, KVS_ERR_UNSUPPORTED, "tojson separators must be two short strings");
            for (int k = 0; k < 2; k++) memcpy(seps[k], sv->c->items[k].s->data, sv->c->items[k].s->len + 1);
            o.item_sep = seps[0];
            o.key_sep = seps[1];
        }
        tsink sk = {0};
        rc = tv_tojson(c, n, in, &o, &sk);
        if (!rc) rc = tsink_take(c, n, &sk, out);
        tsink_free(&sk);
        return rc;
    }
    if (!strcmp(name, "string")) return to_str(c, n, in, out);
    if (!strcmp(name, "trim")) {
        tv *ch = arg(&a, 0, "chars");
        if (ch && ch->t != TV_NONE && ch->t != TV_STR) return tpl_fail(c, n, KVS_ERR_TYPE, "trim chars must be a string");
        if ((rc = to_str(c, n, in, &s))) return rc;
        rc = do_strip(c, n, s.s, ch && ch->t == TV_STR ? ch->s : NULL, 3, out);
        tv_decref(c, s);
        return rc;
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        switch (in.t) {
        case TV_UNDEF: *out = tv_int(0); return 0;
        case TV_STR: *out = tv_int((int64_t)tpl_u8_len(in.s->data, in.s->len)); return 0;
        case TV_LIST: if (in.c->kind == TC_GEN) break; *out = tv_int((int64_t)in.c->n); return 0;
        case TV_DICT: if (in.c->kind == TC_NS) break; *out = tv_int((int64_t)in.c->n); return 0;
        default: break;
        }
        return tpl_fail(c, n, KVS_ERR_TYPE, "object of type '%s' has no len()", tv_typename(in));
    }
    if (!strcmp(name, "join")) {
        tv *sep = arg(&a, 0, "d"), *attr = arg(&a, 1, "attribute");
        tv sepv = tv_none();
        if (sep && (rc = to_str(c, n, *sep, &sepv))) return rc;
        rc = do_join(c, n, in, sep ? sepv.s : NULL, attr && attr->t == TV_STR ? attr->s : NULL, out);
        tv_decref(c, sepv);
        return rc;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper") || !strcmp(name, "title") || !strcmp(name, "capitalize")) {
        if ((rc = to_str(c, n, in, &s))) return rc;
        int mode = name[0] == 'l' ? CASE_LOWER : name[0] == 'u' ? CASE_UPPER : name[0] == 't' ? CASE_JTITLE : CASE_CAP;
        rc = do_case(c, n, s.s, mode, out);
        tv_decref(c, s);
        return rc;
    }
    if (!strcmp(name, "replace")) {
        tstr *old, *new;
        tv *cnt = arg(&a, 2, "count");
        if ((rc = need_str(c, n, arg(&a, 0, "old"), "replace's old", &old)) ||
            (rc = need_str(c, n, arg(&a, 1, "new"), "replace's new", &new)))
            return rc;
        if ((rc = to_str(c, n, in, &s))) return rc;
        rc = do_replace(c, n, s.s, old, new, cnt && is_intlike(*cnt) ? ival(*cnt) : -1, out);
        tv_decref(c, s);
        return rc;
    }
    if (!strcmp(name, "indent")) {
        tv *w = arg(&a, 0, "width");
        tv indv;
        if (w && w->t == TV_STR) { indv = *w; tv_incref(indv); }
        else {
            int64_t width = w ? (is_intlike(*w) ? ival(*w) : -1) : 4;
            if (width < 0 || width > 1000) return tpl_fail(c, n, KVS_ERR_INVALID, "bad indent width");
            char sp[1001];
            memset(sp, ' ', (size_t)width);
            if ((rc = tstr_new(c, n, sp, (size_t)width, &indv))) return rc;
        }
        if (in.t != TV_STR) {   /* jinja2 appends "\n" to the value: only strings survive that */
            tv_decref(c, indv);
            return in.t == TV_UNDEF ? undef_err(c, n, in)
                                    : tpl_fail(c, n, KVS_ERR_TYPE, "unsupported operand type(s) for +=: '%s' and 'str'", tv_typename(in));
        }
        if ((rc = to_str(c, n, in, &s))) { tv_decref(c, indv); return rc; }
        rc = do_indent(c, n, s.s, indv.s, arg_bool(&a, 1, "first", false), arg_bool(&a, 2, "blank", false), out);
        tv_decref(c, s);
        tv_decref(c, indv);
        return rc;
    }
    if (!strcmp(name, "escape") || !strcmp(name, "e") || !strcmp(name, "forceescape")) {
        if ((rc = to_str(c, n, in, &s))) return rc;
        rc = tpl_html_escape(c, n, s.s, out);
        tv_decref(c, s);
        return rc;
    }
    if (!strcmp(name, "format")) {
        if ((rc = need_str(c, n, &in, "format's input", &x))) return rc;
        tv tup;
        if ((rc = tcont_new(c, n, TC_TUPLE, (size_t)npos, &tup))) return rc;
        for (int i = 0; i < npos && !rc; i++) { tv_incref(pos[i]); rc = tlist_push(c, n, tup.c, pos[i]); }
        if (!rc) rc = tpl_str_mod(c, n, x, tup, out);
        tv_decref(c, tup);
        return rc;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        if (in.t == TV_STR) return tpl_getitem(c, n, in, tv_int(name[0] == 'f' ? 0 : -1), out);
        tv items;
        if ((rc = tpl_iter_list(c, n, in, &items))) return rc;
        *out = tv_undef(NULL);
        if (items.c->n) { *out = items.c->items[name[0] == 'f' ? 0 : items.c->n - 1]; tv_incref(*out); }
        tv_decref(c, items);
        return 0;
    }
    if (!strcmp(name, "list")) {
        if ((rc = tpl_iter_list(c, n, in, out))) return rc;
        return 0;
    }
    if (!strcmp(name, "items")) {
        if (in.t == TV_UNDEF) return tcont_new(c, n, TC_LIST, 0, out);
        if (in.t != TV_DICT || in.c->kind != TC_DICT) return tpl_fail(c, n, KVS_ERR_TYPE, "can only get item pairs from a mapping");
        return tpl_method(c, n, in, "items", NULL, 0, NULL, NULL, 0, out);
    }
    if ((!strcmp(name, "int") || !strcmp(name, "float")) && in.t == TV_UNDEF) return undef_err(c, n, in);
    if (!strcmp(name, "wordcount")) {
        if ((rc = to_str(c, n, in, &s))) return rc;
        int64_t words = 0;
        bool inword = false;
        for (size_t i = 0; i < s.s->len; i++) {
            unsigned char ch = (unsigned char)s.s->data[i];
            bool w = isalnum(ch) || ch == '_' || ch >= 0x80;
            if (w && !inword) words++;
            inword = w;
        }
        tv_decref(c, s);
        *out = tv_int(words);
        return 0;
    }
    if (!strcmp(name, "int")) {
        tv *dv = arg(&a, 0, "default");
        tv *bv = arg(&a, 1, "base");
        int64_t r;
        double f;
        if (is_intlike(in)) { *out = tv_int(ival(in)); return 0; }
        if (in.t == TV_FLOAT && isfinite(in.f) && fabs(in.f) < 9.2e18) { *out = tv_int((int64_t)in.f); return 0; }
        if (in.t == TV_STR) {
            int base = bv && is_intlike(*bv) ? (int)ival(*bv) : 10;
            if (parse_int(in.s, base, &r)) { *out = tv_int(r); return 0; }
            if (parse_float(in.s, &f) && isfinite(f) && fabs(f) < 9.2e18) { *out = tv_int((int64_t)f); return 0; }
        }
        if (dv) { tv_incref(*dv); *out = *dv; } else *out = tv_int(0);
        return 0;
    }
    if (!strcmp(name, "float")) {
        tv *dv = arg(&a, 0, "default");
        double f;
        if (is_intlike(in)) { *out = tv_float((double)ival(in)); return 0; }
        if (in.t == TV_FLOAT) { *out = in; return 0; }
        if (in.t == TV_STR && parse_float(in.s, &f)) { *out = tv_float(f); return 0; }
        if (dv) { tv_incref(*dv); *out = *dv; } else *out = tv_float(0);
        return 0;
    }
    if (!strcmp(name, "abs")) {
        if (in.t == TV_INT) { if (in.i == INT64_MIN) return tpl_fail(c, n, KVS_ERR_LIMIT, "integer overflow"); *out = tv_int(in.i < 0 ? -in.i : in.i); return 0; }
        if (in.t == TV_BOOL) { *out = tv_int(in.b); return 0; }
        if (in.t == TV_FLOAT) { *out = tv_float(fabs(in.f)); return 0; }
        return tpl_fail(c, n, KVS_ERR_TYPE, "bad operand type for abs(): '%s'", tv_typename(in));
    }
    if (!strcmp(name, "round")) {
        tv *pv = arg(&a, 0, "precision"), *mv = arg(&a, 1, "method");
        int64_t prec = pv && is_intlike(*pv) ? ival(*pv) : 0;
        if (prec < -300 || prec > 300) prec = prec < 0 ? -300 : 300;
        const char *method = mv && mv->t == TV_STR ? mv->s->data : "common";
        if (in.t != TV_INT && in.t != TV_FLOAT && in.t != TV_BOOL) return tpl_fail(c, n, KVS_ERR_TYPE, "round needs a number");
        double v = in.t == TV_FLOAT ? in.f : (double)ival(in), m = pow(10.0, (double)prec), r;
        if (!strcmp(method, "ceil")) r = ceil(v * m) / m;
        else if (!strcmp(method, "floor")) r = floor(v * m) / m;
        else if (!strcmp(method, "common")) {
            double t = v * m, fl = floor(t), diff = t - fl;
            r = diff > 0.5 ? fl + 1 : diff < 0.5 ? fl : (fmod(fl, 2.0) == 0 ? fl : fl + 1);   /* half to even */
            r /= m;
            r = copysign(r, v);   /* round(-0.4) is -0.0 */
        } else return tpl_fail(c, n, KVS_ERR_INVALID, "method must be common, ceil or floor");
        if (in.t != TV_FLOAT && !strcmp(method, "common")) *out = tv_int((int64_t)r);
        else *out = tv_float(r);
        return 0;
    }
    if (!strcmp(name, "attr")) {
        tstr *an = NULL;
        if ((rc = need_str(c, n, arg(&a, 0, "name"), "attr's name", &an))) return rc;
        char nm[128];
        size_t l = an->len < sizeof nm - 1 ? an->len : sizeof nm - 1;
        memcpy(nm, an->data, l);
        nm[l] = 0;
        return tpl_getattr(c, n, in, nm, out);
    }
    if (!strcmp(name, "unique") || !strcmp(name, "reverse") || !strcmp(name, "sort") || !strcmp(name, "dictsort") ||
        !strcmp(name, "min") || !strcmp(name, "max") || !strcmp(name, "sum")) {
        if (!strcmp(name, "reverse") && in.t == TV_STR) {
            tv items;
            if ((rc = tpl_iter_list(c, n, in, &items))) return rc;
            tsink sk = {0};
            for (size_t i = items.c->n; i-- > 0 && !rc;) rc = tsink_putstr(c, n, &sk, items.c->items[i].s);
            if (!rc) rc = tsink_take(c, n, &sk, out);
            tsink_free(&sk);
            tv_decref(c, items);
            return rc;
        }
        tv items;
        if (!strcmp(name, "dictsort")) {
            if (in.t != TV_DICT || in.c->kind != TC_DICT) return tpl_fail(c, n, KVS_ERR_TYPE, "dictsort needs a mapping");
            if ((rc = tpl_method(c, n, in, "items", NULL, 0, NULL, NULL, 0, &items))) return rc;
            tv *by = arg(&a, 1, "by");
            bool byval = by && by->t == TV_STR && !strcmp(by->s->data, "value");
            tv path;
            if ((rc = tstr_new(c, n, byval ? "1" : "0", 1, &path))) { tv_decref(c, items); return rc; }
            rc = sort_list(c, n, items, path.s, !arg_bool(&a, 0, "case_sensitive", false), arg_bool(&a, 2, "reverse", false), TC_LIST, out);
            tv_decref(c, path);
            tv_decref(c, items);
            return rc;
        }
        if ((rc = tpl_iter_list(c, n, in, &items))) return rc;
        if (!strcmp(name, "reverse")) {
            rc = tcont_new(c, n, TC_GEN, items.c->n, out);
            for (size_t i = items.c->n; i-- > 0 && !rc;) { tv_incref(items.c->items[i]); rc = tlist_push(c, n, out->c, items.c->items[i]); }
        } else if (!strcmp(name, "sum")) {
            tv *attr = arg(&a, 0, "attribute"), *start = arg(&a, 1, "start");
            tv acc = start ? *start : tv_int(0);
            tv_incref(acc);
            for (size_t i = 0; i < items.c->n && !rc; i++) {
                tv v = items.c->items[i], k, r;
                if (attr && attr->t == TV_STR) rc = attr_path(c, n, v, attr->s, &k);
                else { k = v; tv_incref(k); }
                if (rc) break;
                if (!((k.t == TV_INT || k.t == TV_FLOAT || k.t == TV_BOOL) && (acc.t == TV_INT || acc.t == TV_FLOAT || acc.t == TV_BOOL)))
                    rc = tpl_fail(c, n, KVS_ERR_TYPE, "unsupported operand type(s) for +: '%s' and '%s'", tv_typename(acc), tv_typename(k));
                else if (acc.t == TV_FLOAT || k.t == TV_FLOAT) r = tv_float((acc.t == TV_FLOAT ? acc.f : (double)ival(acc)) + (k.t == TV_FLOAT ? k.f : (double)ival(k)));
                else {
                    int64_t sum;
                    if (__builtin_add_overflow(ival(acc), ival(k), &sum)) rc = tpl_fail(c, n, KVS_ERR_LIMIT, "integer overflow");
                    r = tv_int(sum);
                }
                tv_decref(c, k);
                if (!rc) { tv_decref(c, acc); acc = r; }
            }
            if (rc) tv_decref(c, acc);
            else *out = acc;
        } else if (!strcmp(name, "unique")) {
            bool cs = arg_bool(&a, 0, "case_sensitive", false);
            tv *attr = arg(&a, 1, "attribute");
            if (!(rc = to_gen(c, n, out))) {
                tv seen;
                rc = tcont_new(c, n, TC_LIST, 0, &seen);
                for (size_t i = 0; i < items.c->n && !rc; i++) {
                    tv v = items.c->items[i], k;
                    if (attr && attr->t == TV_STR) rc = attr_path(c, n, v, attr->s, &k);
                    else { k = v; tv_incref(k); }
                    if (rc) break;
                    if (!cs && k.t == TV_STR) {
                        tv lk;
                        rc = do_case(c, n, k.s, CASE_LOWER, &lk);
                        tv_decref(c, k);
                        if (rc) break;
                        k = lk;
                    }
                    bool dup = false;
                    for (size_t j = 0; j < seen.c->n && !dup; j++) {
                        if ((rc = tpl_equal(c, n, seen.c->items[j], k, &dup))) break;
                    }
                    if (rc) { tv_decref(c, k); break; }
                    if (dup) { tv_decref(c, k); continue; }
                    if ((rc = tlist_push(c, n, seen.c, k))) break;
                    tv_incref(v);
                    rc = tlist_push(c, n, out->c, v);
                }
                if (seen.t == TV_LIST) tv_decref(c, seen);
            }
        } else {   /* sort, min, max */
            bool isort = !strcmp(name, "sort");
            tv *attr = arg(&a, isort ? 2 : 1, "attribute");
            bool cs = arg_bool(&a, isort ? 1 : 0, "case_sensitive", false);
            bool rev = isort && arg_bool(&a, 0, "reverse", false);
            tv sorted;
            rc = sort_list(c, n, items, attr && attr->t == TV_STR ? attr->s : NULL, !cs, rev, TC_LIST, &sorted);
            if (!rc) {
                if (isort) { *out = sorted; tv_decref(c, items); return 0; }
                *out = tv_undef(NULL);
                if (sorted.c->n) { *out = sorted.c->items[name[1] == 'i' ? 0 : sorted.c->n - 1]; tv_incref(*out); }
                tv_decref(c, sorted);
            }
        }
        tv_decref(c, items);
        return rc;
    }
    if (!strcmp(name, "map") || !strcmp(name, "select") || !strcmp(name, "reject") || !strcmp(name, "selectattr") ||
        !strcmp(name, "rejectattr")) {
        tv items;
        /* jinja2 iterates the input only when it is truthy */
        if ((rc = tv_truthy(in) ? tpl_iter_list(c, n, in, &items) : tcont_new(c, n, TC_LIST, 0, &items))) return rc;
        if ((rc = to_gen(c, n, out))) { tv_decref(c, items); return rc; }
        bool ismap = name[0] == 'm', isattr = strstr(name, "attr") != NULL, rej = name[0] == 'r';
        tv *attr = ismap ? arg(&a, -1, "attribute") : NULL;
        tv *dflt = ismap ? arg(&a, -1, "default") : NULL;
        int first = 0;
        tstr *aname = NULL, *fname = NULL;
        if (ismap) {
            if (!attr && (rc = need_str(c, n, arg(&a, 0, NULL), "map's filter name", &fname))) goto mdone;
            if (attr && (rc = need_str(c, n, attr, "map's attribute", &aname))) goto mdone;
            first = 1;
        } else if (isattr) {
            if ((rc = need_str(c, n, arg(&a, 0, NULL), "the attribute", &aname))) goto mdone;
            if (npos > 1 && (rc = need_str(c, n, &pos[1], "the test name", &fname))) goto mdone;
            first = 2;
        } else {
            if (npos > 0 && (rc = need_str(c, n, &pos[0], "the test name", &fname))) goto mdone;
            first = 1;
        }
        if (first > npos) first = npos;
        for (size_t i = 0; i < items.c->n && !rc; i++) {
            if ((rc = tpl_step(c, n))) break;
            tv v = items.c->items[i], k;
            if (aname) {
                if ((rc = attr_path(c, n, v, aname, &k))) break;
                if (ismap && k.t == TV_UNDEF && dflt) { k = *dflt; tv_incref(k); }
            } else { k = v; tv_incref(k); }
            if (ismap) {
                if (fname) {
                    tv r;
                    rc = tpl_filter(c, n, fname->data, k, pos + first, npos - first, kwn, kwv, nkw, &r);
                    tv_decref(c, k);
                    if (!rc) rc = tlist_push(c, n, out->c, r);
                } else rc = tlist_push(c, n, out->c, k);
                continue;
            }
            bool t;
            if (fname) rc = tpl_test(c, n, fname->data, k, pos + first, npos - first, &t);
            else t = tv_truthy(k);
            tv_decref(c, k);
            if (!rc && t != rej) { tv_incref(v); rc = tlist_push(c, n, out->c, v); }
        }
    mdone:
        tv_decref(c, items);
        return rc;
    }
    return tpl_fail(c, n, KVS_ERR_TYPE, "no filter named '%s'", name);
}

/* ---- methods ------------------------------------------------------------------------------------------------- */

static const char *const str_methods[] = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit",
    "replace", "upper", "lower", "title", "capitalize", "format", "find", "rfind", "index", "count", "join",
    "splitlines", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper", "removeprefix", "removesuffix",
    "swapcase", NULL};
static const char *const list_methods[] = {"append", "pop", "insert", "extend", "index", "count", "remove", "reverse",
    "sort", "copy", "clear", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", "pop", "setdefault", "update", "copy",
    "clear", NULL};

static bool in_list(const char *const *l, const char *name) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], name)) return true;
    return false;
}

bool tpl_has_method(tv obj, const char *name) {
    switch (obj.t) {
    case TV_STR: return in_list(str_methods, name);
    case TV_LIST: return obj.c->kind != TC_GEN && in_list(list_methods, name) &&
                         (obj.c->kind == TC_LIST || !strcmp(name, "index") || !strcmp(name, "count"));
    case TV_DICT: return obj.c->kind == TC_DICT && in_list(dict_methods, name);
    case TV_LOOP: return !strcmp(name, "cycle");
    default: return false;
    }
}

static int str_split(tctx *c, const node *n, tstr *s, tstr *sep, int64_t maxsplit, bool right, tv *out) {
    int rc = tcont_new(c, n, TC_LIST, 0, out);
    if (rc) return rc;
    tv piece;
    if (!sep) {
        /* runs of whitespace; leading/trailing ignored */
        if (!right) {
            size_t i = 0;
            int64_t done = 0;
            for (;;) {
                uint32_t cp;
                while (i < s->len) { size_t l = tpl_u8_dec(s->data + i, s->len - i, &cp); if (!py_space(cp)) break; i += l; }
                if (i >= s->len) break;
                size_t j = i;
                if (maxsplit >= 0 && done >= maxsplit) {
                    /* the rest, with trailing whitespace stripped */
                    size_t e = s->len;
                    while (e > i) { size_t p = prev_cp(s->data, e); tpl_u8_dec(s->data + p, e - p, &cp); if (!py_space(cp)) break; e = p; }
                    if ((rc = tstr_sub(c, n, s, i, e - i, &piece)) || (rc = tlist_push(c, n, out->c, piece))) return rc;
                    break;
                }
                while (j < s->len) { size_t l = tpl_u8_dec(s->data + j, s->len - j, &cp); if (py_space(cp)) break; j += l; }
                if ((rc = tpl_step(c, n)) || (rc = tstr_sub(c, n, s, i, j - i, &piece)) || (rc = tlist_push(c, n, out->c, piece))) return rc;
                done++;
                i = j;
            }
            return 0;
        }
        /* rsplit(None, maxsplit) */
        size_t e = s->len;
        int64_t done = 0;
        tv rev;
        if ((rc = tcont_new(c, n, TC_LIST, 0, &rev))) return rc;
        for (;;) {
            uint32_t cp;
            while (e > 0) { size_t p = prev_cp(s->data, e); tpl_u8_dec(s->data + p, e - p, &cp); if (!py_space(cp)) break; e = p; }
            if (e == 0) break;
            size_t b = e;
            if (maxsplit >= 0 && done >= maxsplit) {
                size_t i = 0;
                while (i < e) { size_t l = tpl_u8_dec(s->data + i, e - i, &cp); if (!py_space(cp)) break; i += l; }
                if ((rc = tstr_sub(c, n, s, i, e - i, &piece)) || (rc = tlist_push(c, n, rev.c, piece))) break;
                break;
            }
            while (b > 0) { size_t p = prev_cp(s->data, b); tpl_u8_dec(s->data + p, b - p, &cp); if (py_space(cp)) break; b = p; }
            if ((rc = tpl_step(c, n)) || (rc = tstr_sub(c, n, s, b, e - b, &piece)) || (rc = tlist_push(c, n, rev.c, piece))) break;
            done++;
            e = b;
        }
        for (size_t i = rev.c->n; !rc && i-- > 0;) { tv_incref(rev.c->items[i]); rc = tlist_push(c, n, out->c, rev.c->items[i]); }
        tv_decref(c, rev);
        return rc;
    }
    if (!sep->len) return tpl_fail(c, n, KVS_ERR_INVALID, "empty separator");
    if (!right) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *f = (maxsplit < 0 || done < maxsplit) && i <= s->len ? memmem(s->data + i, s->len - i, sep->data, sep->len) : NULL;
            size_t j = f ? (size_t)(f - s->data) : s->len;
            if ((rc = tpl_step(c, n)) || (rc = tstr_sub(c, n, s, i, j - i, &piece)) || (rc = tlist_push(c, n, out->c, piece))) return rc;
            if (!f) break;
            i = j + sep->len;
            done++;
        }
        return 0;
    }
    tv rev;
    if ((rc = tcont_new(c, n, TC_LIST, 0, &rev))) return rc;
    size_t e = s->len;
    int64_t done = 0;
    for (;;) {
        size_t found = (size_t)-1;
        if ((maxsplit < 0 || done < maxsplit) && e >= sep->len)
            for (size_t p = e - sep->len + 1; p-- > 0;)
                if (!memcmp(s->data + p, sep->data, sep->len)) { found = p; break; }
        size_t b = found == (size_t)-1 ? 0 : found + sep->len;
        if ((rc = tpl_step(c, n)) || (rc = tstr_sub(c, n, s, b, e - b, &piece)) || (rc = tlist_push(c, n, rev.c, piece))) break;
        if (found == (size_t)-1) break;
        e = found;
        done++;
    }
    for (size_t i = rev.c->n; !rc && i-- > 0;) { tv_incref(rev.c->items[i]); rc = tlist_push(c, n, out->c, rev.c->items[i]); }
    tv_decref(c, rev);
    return rc;
}

/* Python str.format: {} {0} {name} {{ }} and the conversions !s !r; format specs are not supported */
static int str_format(tctx *c, const node *n, tstr *f, fargs *a, tv *out) {
    tsink sk = {0};
    int rc = 0, autoi = 0;
    for (size_t i = 0; i < f->len && !rc; i++) {
        char ch = f->data[i];
        if (ch == '}' ) {
            if (i + 1 < f->len && f->data[i + 1] == '}') i++;
            else { rc = tpl_fail(c, n, KVS_ERR_INVALID, "single '}' encountered in format string"); break; }
            rc = tsink_put(c, n, &sk, "}", 1, false);
            continue;
        }
        if (ch != '{') { rc = tsink_put(c, n, &sk, &ch, 1, false); continue; }
        if (i + 1 < f->len && f->data[i + 1] == '{') { i++; rc = tsink_put(c, n, &sk, "{", 1, false); continue; }
        size_t j = i + 1;
        while (j < f->len && f->data[j] != '}') j++;
        if (j >= f->len) { rc = tpl_fail(c, n, KVS_ERR_INVALID, "single '{' encountered in format string"); break; }
        char field[128];
        size_t fl = j - i - 1 < sizeof field - 1 ? j - i - 1 : sizeof field - 1;
        memcpy(field, f->data + i + 1, fl);
        field[fl] = 0;
        i = j;
        char conv = 's';
        char *bang = strchr(field, '!');
        if (strchr(field, ':')) { rc = tpl_fail(c, n, KVS_ERR_UNSUPPORTED, "format specs are not supported"); break; }
        if (bang) { conv = bang[1]; *bang = 0; }
        tv *v = NULL;
        if (!field[0]) v = arg(a, autoi++, NULL);
        else if (isdigit((unsigned char)field[0])) v = arg(a, atoi(field), NULL);
        else v = arg(a, -1, field);
        if (!v) { rc = tpl_fail(c, n, KVS_ERR_INVALID, "format field '%s' has no argument", field); break; }
        if (conv == 'r') {
            kvs_buf b = {0};
            rc = tv_repr(c, n, *v, &b, 1);
            if (!rc) rc = tsink_put(c, n, &sk, b.data ? b.data : "", b.len, false);
            kvs_buf_free(&b);
        } else rc = tv_print(c, n, *v, &sk);
    }
    if (!rc) rc = tsink_take(c, n, &sk, out);
    tsink_free(&sk);
    return rc;
}

static bool affix(tstr *s, tstr *p, bool end) {
    return p->len <= s->len && !memcmp(s->data + (end ? s->len - p->len : 0), p->data, p->len);
}

static int str_method(tctx *c, const node *n, tstr *s, const char *name, fargs *a, tv *out) {
    int rc;
    tstr *x = NULL, *y = NULL;
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        bool end = name[0] == 'e';
        tv *p = arg(a, 0, NULL);
        *out = tv_bool(false);
        if (p && p->t == TV_STR) *out = tv_bool(affix(s, p->s, end));
        else if (p && p->t == TV_LIST && p->c->kind == TC_TUPLE) {
            for (size_t i = 0; i < p->c->n; i++) {
                if (p->c->items[i].t != TV_STR) return tpl_fail(c, n, KVS_ERR_TYPE, "tuple for %s must only contain str", name);
                if (affix(s, p->c->items[i].s, end)) { *out = tv_bool(true); break; }
            }
        } else return tpl_fail(c, n, KVS_ERR_TYPE, "%s first arg must be str or a tuple of str", name);
        return 0;
    }
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        tv *ch = arg(a, 0, "chars");
        if (ch && ch->t != TV_NONE && ch->t != TV_STR) return tpl_fail(c, n, KVS_ERR_TYPE, "%s arg must be None or str", name);
        return do_strip(c, n, s, ch && ch->t == TV_STR ? ch->s : NULL, name[0] == 'l' ? 1 : name[0] == 'r' ? 2 : 3, out);
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        tv *sep = arg(a, 0, "sep"), *mx = arg(a, 1, "maxsplit");
        if (sep && sep->t != TV_NONE && sep->t != TV_STR) return tpl_fail(c, n, KVS_ERR_TYPE, "must be str or None");
        return str_split(c, n, s, sep && sep->t == TV_STR ? sep->s : NULL, mx && is_intlike(*mx) ? ival(*mx) : -1,
                         name[0] == 'r', out);
    }
    if (!strcmp(name, "replace")) {
        tv *cnt = arg(a, 2, "count");
        if ((rc = need_str(c, n, arg(a, 0, NULL), "replace's old", &x)) || (rc = need_str(c, n, arg(a, 1, NULL), "replace's new", &y)))
            return rc;
        return do_replace(c, n, s, x, y, cnt && is_intlike(*cnt) ? ival(*cnt) : -1, out);
    }
    if (!strcmp(name, "upper")) return do_case(c, n, s, CASE_UPPER, out);
    if (!strcmp(name, "lower")) return do_case(c, n, s, CASE_LOWER, out);
    if (!strcmp(name, "title")) return do_case(c, n, s, CASE_TITLE, out);
    if (!strcmp(name, "capitalize")) return do_case(c, n, s, CASE_CAP, out);
    if (!strcmp(name, "swapcase")) {
        tstr *r = NULL;
        if ((rc = tstr_alloc(c, n, s->len, &r))) return rc;
        for (size_t i = 0; i < s->len; i++) {
            unsigned char ch = (unsigned char)s->data[i];
            r->data[i] = (char)(ch < 0x80 ? (isupper(ch) ? tolower(ch) : toupper(ch)) : ch);
        }
        *out = tv_str(r);
        return 0;
    }
    if (!strcmp(name, "format")) return str_format(c, n, s, a, out);
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "index") || !strcmp(name, "count")) {
        if ((rc = need_str(c, n, arg(a, 0, NULL), "the substring", &x))) return rc;
        if (!strcmp(name, "count")) {
            int64_t k = 0;
            if (!x->len) k = (int64_t)tpl_u8_len(s->data, s->len) + 1;
            else for (size_t i = 0; i + x->len <= s->len;) {
                const char *f = memmem(s->data + i, s->len - i, x->data, x->len);
                if (!f) break;
                k++;
                i = (size_t)(f - s->data) + x->len;
            }
            *out = tv_int(k);
            return 0;
        }
        size_t found = (size_t)-1;
        if (name[0] == 'r') {
            if (x->len <= s->len)
                for (size_t p = s->len - x->len + 1; p-- > 0;)
                    if (!memcmp(s->data + p, x->data, x->len)) { found = p; break; }
        } else {
            const char *f = x->len ? memmem(s->data, s->len, x->data, x->len) : s->data;
            if (f) found = (size_t)(f - s->data);
        }
        if (found == (size_t)-1 && name[0] == 'i') return tpl_fail(c, n, KVS_ERR_INVALID, "substring not found");
        *out = tv_int(found == (size_t)-1 ? -1 : (int64_t)tpl_u8_len(s->data, found));
        return 0;
    }
    if (!strcmp(name, "join")) {
        tv *seq = arg(a, 0, NULL);
        if (!seq) return tpl_fail(c, n, KVS_ERR_TYPE, "join() takes exactly one argument");
        tv items;
        if ((rc = tpl_iter_list(c, n, *seq, &items))) return rc;
        for (size_t i = 0; i < items.c->n; i++)
            if (items.c->items[i].t != TV_STR) {
                tv_decref(c, items);
                return tpl_fail(c, n, KVS_ERR_TYPE, "sequence item %zu: expected str instance, %s found", i, tv_typename(items.c->items[i]));
            }
        rc = do_join(c, n, items, s, NULL, out);
        tv_decref(c, items);
        return rc;
    }
    if (!strcmp(name, "splitlines")) {
        if ((rc = tcont_new(c, n, TC_LIST, 0, out))) return rc;
        size_t i = 0;
        while (i < s->len) {
            size_t j = i;
            while (j < s->len && s->data[j] != '\n' && s->data[j] != '\r') j++;
            tv piece;
            if ((rc = tpl_step(c, n)) || (rc = tstr_sub(c, n, s, i, j - i, &piece)) || (rc = tlist_push(c, n, out->c, piece))) return rc;
            if (j < s->len && s->data[j] == '\r' && j + 1 < s->len && s->data[j + 1] == '\n') j++;
            i = j + 1;
        }
        return 0;
    }
    if (!strncmp(name, "is", 2)) {
        bool r = s->len > 0, cased = false;
        for (size_t i = 0; i < s->len && r; i++) {
            unsigned char ch = (unsigned char)s->data[i];
            if (!strcmp(name, "isdigit")) r = isdigit(ch);
            else if (!strcmp(name, "isalpha")) r = isalpha(ch) || ch >= 0x80;
            else if (!strcmp(name, "isalnum")) r = isalnum(ch) || ch >= 0x80;
            else if (!strcmp(name, "isspace")) r = isspace(ch) != 0;
            else if (!strcmp(name, "islower")) { r = !isupper(ch); cased = cased || islower(ch); }
            else if (!strcmp(name, "isupper")) { r = !islower(ch); cased = cased || isupper(ch); }
        }
        if (!strcmp(name, "islower") || !strcmp(name, "isupper")) r = r && cased;
        *out = tv_bool(r);
        return 0;
    }
    if (!strcmp(name, "removeprefix") || !strcmp(name, "removesuffix")) {
        if ((rc = need_str(c, n, arg(a, 0, NULL), "the affix", &x))) return rc;
        bool end = name[6] == 's';
        if (!affix(s, x, end)) return tstr_sub(c, n, s, 0, s->len, out);
        return tstr_sub(c, n, s, end ? 0 : x->len, s->len - x->len, out);
    }
    return tpl_fail(c, n, KVS_ERR_TYPE, "'str' object has no attribute '%s'", name);
}

static int list_method(tctx *c, const node *n, tcont *l, const char *name, fargs *a, tv *out) {
    int rc;
    *out = tv_none();
    tv *x = arg(a, 0, NULL);
    if (!strcmp(name, "append")) {
        if (!x) return tpl_fail(c, n, KVS_ERR_TYPE, "append() takes exactly one argument");
        tv_incref(*x);
        return tlist_push(c, n, l, *x);
    }
    if (!strcmp(name, "pop")) {
        if (!l->n) return tpl_fail(c, n, KVS_ERR_INVALID, "pop from empty list");
        int64_t i = x && is_intlike(*x) ? ival(*x) : -1;
        if (i < 0) i += (int64_t)l->n;
        if (i < 0 || (size_t)i >= l->n) return tpl_fail(c, n, KVS_ERR_INVALID, "pop index out of range");
        *out = l->items[i];
        memmove(l->items + i, l->items + i + 1, (l->n - (size_t)i - 1) * sizeof *l->items);
        l->n--;
        return 0;
    }
    if (!strcmp(name, "insert")) {
        tv *v = arg(a, 1, NULL);
        if (!x || !v || !is_intlike(*x)) return tpl_fail(c, n, KVS_ERR_TYPE, "insert(index, value)");
        int64_t i = ival(*x);
        if (i < 0) i += (int64_t)l->n;
        if (i < 0) i = 0;
        if ((size_t)i > l->n) i = (int64_t)l->n;
        tv_incref(*v);
        if ((rc = tlist_push(c, n, l, *v))) return rc;
        memmove(l->items + i + 1, l->items + i, (l->n - 1 - (size_t)i) * sizeof *l->items);
        l->items[i] = *v;
        return 0;
    }
    if (!strcmp(name, "extend")) {
        if (!x) return tpl_fail(c, n, KVS_ERR_TYPE, "extend() takes exactly one argument");
        tv items;
        if ((rc = tpl_iter_list(c, n, *x, &items))) return rc;
        for (size_t i = 0; i < items.c->n && !rc; i++) { tv_incref(items.c->items[i]); rc = tlist_push(c, n, l, items.c->items[i]); }
        tv_decref(c, items);
        return rc;
    }
    if (!strcmp(name, "index") || !strcmp(name, "count") || !strcmp(name, "remove")) {
        if (!x) return tpl_fail(c, n, KVS_ERR_TYPE, "%s() takes exactly one argument", name);
        int64_t k = 0;
        for (size_t i = 0; i < l->n; i++) {
            bool eq;
            if ((rc = tpl_equal(c, n, l->items[i], *x, &eq))) return rc;
            if (!eq) continue;
            if (name[0] == 'i') { *out = tv_int((int64_t)i); return 0; }
            if (name[0] == 'r') {
                tv old = l->items[i];
                memmove(l->items + i, l->items + i + 1, (l->n - i - 1) * sizeof *l->items);
                l->n--;
                tv_decref(c, old);
                return 0;
            }
            k++;
        }
        if (name[0] != 'c') return tpl_fail(c, n, KVS_ERR_INVALID, "value is not in list");
        *out = tv_int(k);
        return 0;
    }
    if (!strcmp(name, "reverse")) {
        for (size_t i = 0; i < l->n / 2; i++) { tv t = l->items[i]; l->items[i] = l->items[l->n - 1 - i]; l->items[l->n - 1 - i] = t; }
        return 0;
    }
    if (!strcmp(name, "clear")) {
        while (l->n) tv_decref(c, l->items[--l->n]);
        return 0;
    }
    if (!strcmp(name, "copy") || !strcmp(name, "sort")) {
        tv self = {.t = TV_LIST};
        self.c = l;
        if (name[0] == 'c') return tpl_iter_list(c, n, self, out);
        tv sorted;
        tv *key = arg(a, -1, "key");
        if (key) return tpl_fail(c, n, KVS_ERR_UNSUPPORTED, "sort(key=...) is not supported");
        if ((rc = sort_list(c, n, self, NULL, false, arg_bool(a, -1, "reverse", false), TC_LIST, &sorted))) return rc;
        for (size_t i = 0; i < l->n; i++) {
            tv old = l->items[i];
            l->items[i] = sorted.c->items[i];
            tv_incref(l->items[i]);
            tv_decref(c, old);
        }
        tv_decref(c, sorted);
        return 0;
    }
    return tpl_fail(c, n, KVS_ERR_TYPE, "'list' object has no attribute '%s'", name);
}

static int dict_method(tctx *c, const node *n, tcont *d, const char *name, fargs *a, tv *out) {
    int rc;
    tv *k = arg(a, 0, NULL);
    if (!strcmp(name, "items") || !strcmp(name, "keys") || !strcmp(name, "values")) {
        if ((rc = tcont_new(c, n, TC_LIST, d->n, out))) return rc;
        for (size_t i = 0; i < d->n; i++) {
            tv x;
            if (name[0] == 'i') {
                if ((rc = tcont_new(c, n, TC_TUPLE, 2, &x))) return rc;
                tv_incref(d->keys[i]);
                tv_incref(d->items[i]);
                tlist_push(c, n, x.c, d->keys[i]);
                tlist_push(c, n, x.c, d->items[i]);
            } else {
                x = name[0] == 'k' ? d->keys[i] : d->items[i];
                tv_incref(x);
            }
            if ((rc = tlist_push(c, n, out->c, x))) return rc;
        }
        return 0;
    }
    if (!strcmp(name, "get") || !strcmp(name, "pop") || !strcmp(name, "setdefault")) {
        tv *dv = arg(a, 1, "default");
        if (!k) return tpl_fail(c, n, KVS_ERR_TYPE, "%s expected at least 1 argument", name);
        tv *v = tdict_getv(d, *k);
        if (v) {
            *out = *v;
            tv_incref(*out);
            if (name[0] == 'p') return tdict_del(c, d, (size_t)(v - d->items)) ? tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory") : 0;
            return 0;
        }
        if (name[0] == 'p' && !dv) return tpl_fail(c, n, KVS_ERR_NOT_FOUND, "key not found");
        *out = dv ? *dv : tv_none();
        tv_incref(*out);
        if (name[0] == 's') {
            tv_incref(*out);
            return tdict_set(c, n, d, *k, *out);
        }
        return 0;
    }
    if (!strcmp(name, "update")) {
        *out = tv_none();
        if (k) {
            if (k->t != TV_DICT) return tpl_fail(c, n, KVS_ERR_TYPE, "update() needs a mapping");
            tcont *o = k->c;
            for (size_t i = 0; i < o->n; i++) {
                tv_incref(o->items[i]);
                if ((rc = tdict_set(c, n, d, o->keys[i], o->items[i]))) return rc;
            }
        }
        for (int i = 0; i < a->nkw; i++) {
            tv_incref(a->kwv[i]);
            if ((rc = tdict_setc(c, n, d, a->kwn[i], a->kwv[i]))) return rc;
        }
        return 0;
    }
    if (!strcmp(name, "copy")) {
        if ((rc = tcont_new(c, n, TC_DICT, d->n, out))) return rc;
        for (size_t i = 0; i < d->n; i++) {
            tv_incref(d->items[i]);
            if ((rc = tdict_set(c, n, out->c, d->keys[i], d->items[i]))) return rc;
        }
        return 0;
    }
    if (!strcmp(name, "clear")) {
        *out = tv_none();
        while (d->n)
            if (tdict_del(c, d, d->n - 1)) return tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
        return 0;
    }
    return tpl_fail(c, n, KVS_ERR_TYPE, "'dict' object has no attribute '%s'", name);
}

int tpl_method(tctx *c, const node *n, tv obj, const char *name, tv *pos, int npos, const char **kwn, tv *kwv,
               int nkw, tv *out) {
    fargs a = {pos, npos, kwn, kwv, nkw};
    int rc;
    switch (obj.t) {
    case TV_STR:   /* scans of the whole string (find, count, strip, split...) cost by its size */
        if ((rc = tpl_charge(c, n, obj.s->len / TPL_BYTES_PER_STEP))) return rc;
        return str_method(c, n, obj.s, name, &a, out);
    case TV_LIST:   /* and of the whole list (insert, pop(0), remove...) */
        if ((rc = tpl_charge(c, n, obj.c->n / 16))) return rc;
        return list_method(c, n, obj.c, name, &a, out);
    case TV_DICT: return dict_method(c, n, obj.c, name, &a, out);
    case TV_LOOP:
        if (!npos) return tpl_fail(c, n, KVS_ERR_TYPE, "no items for cycling given");
        *out = pos[obj.loop->index0 % npos];
        tv_incref(*out);
        return 0;
    default: return tpl_fail(c, n, KVS_ERR_TYPE, "'%s' object has no attribute '%s'", tv_typename(obj), name);
    }
}
