/* tpl_builtins.c: the shared helpers of the builtins (arguments, UTF-8, case mapping, attribute paths,
 * sorting), the globals (range, namespace, dict, raise_exception, strftime_now) and the tests. The filters live in
 * tpl_filters.c, the methods of strings, lists, dicts and loop objects in tpl_methods.c. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

/* ---- argument helpers ------------------------------------------------------------------------------------- */

/* the argument at position i or named `name`, or NULL */
tv *tpl_arg(fargs *a, int i, const char *name) {
    if (i >= 0 && i < a->npos) return &a->pos[i];
    for (int k = 0; name && k < a->nkw; k++)
        if (!strcmp(a->kwn[k], name)) return &a->kwv[k];
    return NULL;
}

bool tpl_arg_bool(fargs *a, int i, const char *name, bool dflt) {
    tv *v = tpl_arg(a, i, name);
    return v ? tv_truthy(*v) : dflt;
}

int tpl_need_str(tctx *c, const node *n, tv *v, const char *what, tstr **out) {
    if (!v || v->t != TV_STR)
        return tpl_fail(c, n, KVS_ERR_TYPE, "%s must be a string, not %s", what, v ? tv_typename(*v) : "nothing");
    *out = v->s;
    return 0;
}

bool tpl_is_intlike(tv v) { return v.t == TV_INT || v.t == TV_BOOL; }
int64_t tpl_ival(tv v) { return v.t == TV_INT ? v.i : v.t == TV_BOOL ? v.b : 0; }

int tpl_undef_err(tctx *c, const node *n, tv v) {
    return tpl_fail(c, n, KVS_ERR_TYPE, "'%s' is undefined", v.uname ? v.uname : "value");
}

/* ---- UTF-8 and Python whitespace ---------------------------------------------------------------------------- */


/* start of the code point ending at s[end) */
size_t tpl_prev_cp(const char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80 && end - i < 4) i--;
    return i;
}

bool tpl_py_space(uint32_t cp) {
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
int tpl_strip(tctx *c, const node *n, tstr *s, const tstr *chars, int which, tv *out) {
    size_t a = 0, b = s->len;
    if (which & 1)
        while (a < b) {
            uint32_t cp;
            size_t l = tpl_u8_dec(s->data + a, b - a, &cp);
            if (chars ? !in_chars(cp, chars) : !tpl_py_space(cp)) break;
            a += l;
        }
    if (which & 2)
        while (b > a) {
            size_t p = tpl_prev_cp(s->data, b);
            if (p < a) p = a;
            uint32_t cp;
            tpl_u8_dec(s->data + p, b - p, &cp);
            if (chars ? !in_chars(cp, chars) : !tpl_py_space(cp)) break;
            b = p;
        }
    return tstr_sub(c, n, s, a, b - a, out);
}

/* ---- case ------------------------------------------------------------------------------------------------- */

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
int tpl_case(tctx *c, const node *n, tstr *s, int mode, tv *out) {
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
        first = mode == CASE_JTITLE ? (tpl_py_space(cp) || (cp < 0x80 && strchr("-({[<", (int)cp))) : false;
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
int tpl_attr_path(tctx *c, const node *n, tv v, const tstr *path, tv *out) {
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
int tpl_sort_list(tctx *c, const node *n, tv list, const tstr *attr, bool ci, bool rev, int kind, tv *out) {
    size_t cnt = list.c->n;
    int rc = tpl_mem(c, n, cnt * 4 * sizeof(tv));
    if (rc) return rc;
    tv *keys = malloc((cnt + 1) * sizeof(tv)), *vals = malloc((cnt + 1) * sizeof(tv));
    tv *tk = malloc((cnt + 1) * sizeof(tv)), *tvl = malloc((cnt + 1) * sizeof(tv));
    size_t nk = 0;
    if (!keys || !vals || !tk || !tvl) { rc = tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory"); goto out; }
    for (; nk < cnt && !rc; nk++) {
        vals[nk] = list.c->items[nk];
        if (attr) rc = tpl_attr_path(c, n, vals[nk], attr, &keys[nk]);
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
            if (!tpl_is_intlike(pos[i])) return tpl_fail(c, n, KVS_ERR_TYPE, "range() arguments must be integers");
        if (npos == 1) stop = tpl_ival(pos[0]);
        else if (npos == 2 || npos == 3) {
            start = tpl_ival(pos[0]);
            stop = tpl_ival(pos[1]);
            if (npos == 3) step = tpl_ival(pos[2]);
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
        tv *m = tpl_arg(&a, 0, "message");
        kvs_buf b = {0};
        if (m) tv_repr(c, n, *m, &b, 0);
        rc = tpl_fail(c, n, KVS_ERR_RAISED, "%s", b.data ? b.data : "raise_exception called");
        kvs_buf_free(&b);
        return rc;
    }
    case FN_STRFTIME: {
        tstr *fmt = NULL;
        if ((rc = tpl_need_str(c, n, tpl_arg(&a, 0, "format"), "strftime_now's format", &fmt))) return rc;
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
        if (v.t == TV_UNDEF) return tpl_undef_err(c, n, v);
        if (!tpl_is_intlike(v) && v.t != TV_FLOAT) return tpl_fail(c, n, KVS_ERR_TYPE, "unsupported operand for %%: '%s'", tv_typename(v));
        double x = v.t == TV_FLOAT ? v.f : (double)tpl_ival(v);
        bool odd = fmod(fabs(x), 2.0) == 1.0;
        *out = name[0] == 'o' ? odd : !odd && fmod(x, 1.0) == 0;
    } else if (!strcmp(name, "divisibleby")) {
        bool vn = tpl_is_intlike(v) || v.t == TV_FLOAT, an = tpl_is_intlike(a0) || a0.t == TV_FLOAT;
        if (!vn || !an) return tpl_fail(c, n, KVS_ERR_TYPE, "divisibleby needs numbers");
        if (tpl_is_intlike(v) && tpl_is_intlike(a0)) {
            if (tpl_ival(a0) == 0) return tpl_fail(c, n, KVS_ERR_INVALID, "integer division or modulo by zero");
            *out = tpl_ival(a0) == -1 || tpl_ival(v) % tpl_ival(a0) == 0;
        } else {
            double x = v.t == TV_FLOAT ? v.f : (double)tpl_ival(v), y = a0.t == TV_FLOAT ? a0.f : (double)tpl_ival(a0);
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
