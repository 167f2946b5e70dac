/* tpl_filters.c: the jinja2 filters (moved out of tpl_builtins.c, whose helpers they share through tpl_internal.h). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

/* ---- filters ------------------------------------------------------------------------------------------------ */

static int to_str(tctx *c, const node *n, tv v, tv *out) { return tv_tostr(c, n, v, out); }

int tpl_join(tctx *c, const node *n, tv seq, const tstr *sep, const tstr *attr, tv *out) {
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
            if (!rc && !(rc = tpl_attr_path(c, n, x, attr, &y))) {
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

int tpl_replace(tctx *c, const node *n, tstr *s, tstr *old, tstr *new, int64_t count, tv *out) {
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

/* the sequence filters unique, reverse, sort, dictsort, min, max and sum */
static int filter_sequence(tctx *c, const node *n, const char *name, tv in, fargs *ap, tv *out) {
    fargs a = *ap;
    int rc;
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
        tv *by = tpl_arg(&a, 1, "by");
        bool byval = by && by->t == TV_STR && !strcmp(by->s->data, "value");
        tv path;
        if ((rc = tstr_new(c, n, byval ? "1" : "0", 1, &path))) { tv_decref(c, items); return rc; }
        rc = tpl_sort_list(c, n, items, path.s, !tpl_arg_bool(&a, 0, "case_sensitive", false), tpl_arg_bool(&a, 2, "reverse", false), TC_LIST, out);
        tv_decref(c, path);
        tv_decref(c, items);
        return rc;
    }
    if ((rc = tpl_iter_list(c, n, in, &items))) return rc;
    if (!strcmp(name, "reverse")) {
        rc = tcont_new(c, n, TC_GEN, items.c->n, out);
        for (size_t i = items.c->n; i-- > 0 && !rc;) { tv_incref(items.c->items[i]); rc = tlist_push(c, n, out->c, items.c->items[i]); }
    } else if (!strcmp(name, "sum")) {
        tv *attr = tpl_arg(&a, 0, "attribute"), *start = tpl_arg(&a, 1, "start");
        tv acc = start ? *start : tv_int(0);
        tv_incref(acc);
        for (size_t i = 0; i < items.c->n && !rc; i++) {
            tv v = items.c->items[i], k, r;
            if (attr && attr->t == TV_STR) rc = tpl_attr_path(c, n, v, attr->s, &k);
            else { k = v; tv_incref(k); }
            if (rc) break;
            if (!((k.t == TV_INT || k.t == TV_FLOAT || k.t == TV_BOOL) && (acc.t == TV_INT || acc.t == TV_FLOAT || acc.t == TV_BOOL)))
                rc = tpl_fail(c, n, KVS_ERR_TYPE, "unsupported operand type(s) for +: '%s' and '%s'", tv_typename(acc), tv_typename(k));
            else if (acc.t == TV_FLOAT || k.t == TV_FLOAT) r = tv_float((acc.t == TV_FLOAT ? acc.f : (double)tpl_ival(acc)) + (k.t == TV_FLOAT ? k.f : (double)tpl_ival(k)));
            else {
                int64_t sum;
                if (__builtin_add_overflow(tpl_ival(acc), tpl_ival(k), &sum)) rc = tpl_fail(c, n, KVS_ERR_LIMIT, "integer overflow");
                r = tv_int(sum);
            }
            tv_decref(c, k);
            if (!rc) { tv_decref(c, acc); acc = r; }
        }
        if (rc) tv_decref(c, acc);
        else *out = acc;
    } else if (!strcmp(name, "unique")) {
        bool cs = tpl_arg_bool(&a, 0, "case_sensitive", false);
        tv *attr = tpl_arg(&a, 1, "attribute");
        if (!(rc = to_gen(c, n, out))) {
            tv seen;
            rc = tcont_new(c, n, TC_LIST, 0, &seen);
            for (size_t i = 0; i < items.c->n && !rc; i++) {
                tv v = items.c->items[i], k;
                if (attr && attr->t == TV_STR) rc = tpl_attr_path(c, n, v, attr->s, &k);
                else { k = v; tv_incref(k); }
                if (rc) break;
                if (!cs && k.t == TV_STR) {
                    tv lk;
                    rc = tpl_case(c, n, k.s, CASE_LOWER, &lk);
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
        tv *attr = tpl_arg(&a, isort ? 2 : 1, "attribute");
        bool cs = tpl_arg_bool(&a, isort ? 1 : 0, "case_sensitive", false);
        bool rev = isort && tpl_arg_bool(&a, 0, "reverse", false);
        tv sorted;
        rc = tpl_sort_list(c, n, items, attr && attr->t == TV_STR ? attr->s : NULL, !cs, rev, TC_LIST, &sorted);
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

/* map, select, reject, selectattr and rejectattr */
static int filter_map_select(tctx *c, const node *n, const char *name, tv in, fargs *ap, tv *out) {
    fargs a = *ap;
    tv *pos = a.pos, *kwv = a.kwv;
    int npos = a.npos, nkw = a.nkw;
    const char **kwn = a.kwn;
    int rc;
    tv items;
    /* jinja2 iterates the input only when it is truthy */
    if ((rc = tv_truthy(in) ? tpl_iter_list(c, n, in, &items) : tcont_new(c, n, TC_LIST, 0, &items))) return rc;
    if ((rc = to_gen(c, n, out))) { tv_decref(c, items); return rc; }
    bool ismap = name[0] == 'm', isattr = strstr(name, "attr") != NULL, rej = name[0] == 'r';
    tv *attr = ismap ? tpl_arg(&a, -1, "attribute") : NULL;
    tv *dflt = ismap ? tpl_arg(&a, -1, "default") : NULL;
    int first = 0;
    tstr *aname = NULL, *fname = NULL;
    if (ismap) {
        if (!attr && (rc = tpl_need_str(c, n, tpl_arg(&a, 0, NULL), "map's filter name", &fname))) goto mdone;
        if (attr && (rc = tpl_need_str(c, n, attr, "map's attribute", &aname))) goto mdone;
        first = 1;
    } else if (isattr) {
        if ((rc = tpl_need_str(c, n, tpl_arg(&a, 0, NULL), "the attribute", &aname))) goto mdone;
        if (npos > 1 && (rc = tpl_need_str(c, n, &pos[1], "the test name", &fname))) goto mdone;
        first = 2;
    } else {
        if (npos > 0 && (rc = tpl_need_str(c, n, &pos[0], "the test name", &fname))) goto mdone;
        first = 1;
    }
    if (first > npos) first = npos;
    for (size_t i = 0; i < items.c->n && !rc; i++) {
        if ((rc = tpl_step(c, n))) break;
        tv v = items.c->items[i], k;
        if (aname) {
            if ((rc = tpl_attr_path(c, n, v, aname, &k))) break;
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

/* tojson with transformers' arguments */
static int filter_tojson(tctx *c, const node *n, const char *name, tv in, fargs *ap, tv *out) {
    (void)name;
    fargs a = *ap;
    int rc;
    /* transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
    tv *av = tpl_arg(&a, 0, "ensure_ascii"), *iv = tpl_arg(&a, 1, "indent"), *sv = tpl_arg(&a, 2, "separators");
    tpl_json_opts o = {.indent = -1, .item_sep = ", ", .key_sep = ": ", .sort_keys = tpl_arg_bool(&a, 3, "sort_keys", false),
                       .ensure_ascii = av && tv_truthy(*av)};
    char seps[2][16];
    if (iv && iv->t != TV_NONE) {
        if (!tpl_is_intlike(*iv)) return tpl_fail(c, n, KVS_ERR_UNSUPPORTED, "tojson indent must be an integer");
        o.indent = tpl_ival(*iv) < 0 ? 0 : tpl_ival(*iv) > 64 ? 64 : (int)tpl_ival(*iv);
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

/* indent(width, first, blank) */
static int filter_indent(tctx *c, const node *n, const char *name, tv in, fargs *ap, tv *out) {
    (void)name;
    fargs a = *ap;
    int rc;
    tv s;
    tv *w = tpl_arg(&a, 0, "width");
    tv indv;
    if (w && w->t == TV_STR) { indv = *w; tv_incref(indv); }
    else {
        int64_t width = w ? (tpl_is_intlike(*w) ? tpl_ival(*w) : -1) : 4;
        if (width < 0 || width > 1000) return tpl_fail(c, n, KVS_ERR_INVALID, "bad indent width");
        char sp[1001];
        memset(sp, ' ', (size_t)width);
        if ((rc = tstr_new(c, n, sp, (size_t)width, &indv))) return rc;
    }
    if (in.t != TV_STR) {   /* jinja2 appends "\n" to the value: only strings survive that */
        tv_decref(c, indv);
        return in.t == TV_UNDEF ? tpl_undef_err(c, n, in)
                                : tpl_fail(c, n, KVS_ERR_TYPE, "unsupported operand type(s) for +=: '%s' and 'str'", tv_typename(in));
    }
    if ((rc = to_str(c, n, in, &s))) { tv_decref(c, indv); return rc; }
    rc = do_indent(c, n, s.s, indv.s, tpl_arg_bool(&a, 1, "first", false), tpl_arg_bool(&a, 2, "blank", false), out);
    tv_decref(c, s);
    tv_decref(c, indv);
    return rc;
}

/* int(default, base) */
static int filter_int(tctx *c, const node *n, const char *name, tv in, fargs *ap, tv *out) {
    (void)name;
    if (in.t == TV_UNDEF) return tpl_undef_err(c, n, in);
    fargs a = *ap;
    tv *dv = tpl_arg(&a, 0, "default");
    tv *bv = tpl_arg(&a, 1, "base");
    int64_t r;
    double f;
    if (tpl_is_intlike(in)) { *out = tv_int(tpl_ival(in)); return 0; }
    if (in.t == TV_FLOAT && isfinite(in.f) && fabs(in.f) < 9.2e18) { *out = tv_int((int64_t)in.f); return 0; }
    if (in.t == TV_STR) {
        int base = bv && tpl_is_intlike(*bv) ? (int)tpl_ival(*bv) : 10;
        if (parse_int(in.s, base, &r)) { *out = tv_int(r); return 0; }
        if (parse_float(in.s, &f) && isfinite(f) && fabs(f) < 9.2e18) { *out = tv_int((int64_t)f); return 0; }
    }
    if (dv) { tv_incref(*dv); *out = *dv; } else *out = tv_int(0);
    return 0;
}

/* round(precision, method) */
static int filter_round(tctx *c, const node *n, const char *name, tv in, fargs *ap, tv *out) {
    (void)name;
    fargs a = *ap;
    tv *pv = tpl_arg(&a, 0, "precision"), *mv = tpl_arg(&a, 1, "method");
    int64_t prec = pv && tpl_is_intlike(*pv) ? tpl_ival(*pv) : 0;
    if (prec < -300 || prec > 300) prec = prec < 0 ? -300 : 300;
    const char *method = mv && mv->t == TV_STR ? mv->s->data : "common";
    if (in.t != TV_INT && in.t != TV_FLOAT && in.t != TV_BOOL) return tpl_fail(c, n, KVS_ERR_TYPE, "round needs a number");
    double v = in.t == TV_FLOAT ? in.f : (double)tpl_ival(in), m = pow(10.0, (double)prec), r;
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

/* wordcount */
static int filter_wordcount(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)name; (void)a;
    int rc;
    tv s;
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

/* safe: the string marked safe (a copy unless it already is) */
static int filter_safe(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)name; (void)a;
    tv s;
    int rc;
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

/* default / d (default_value, boolean) */
static int filter_default(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)name;
    tv *dv = tpl_arg(a, 0, "default_value");
    bool boolean = tpl_arg_bool(a, 1, "boolean", false);
    if (in.t == TV_UNDEF || (boolean && !tv_truthy(in))) {
        if (dv) { tv_incref(*dv); *out = *dv; return 0; }
        return tstr_new(c, n, "", 0, out);
    }
    tv_incref(in);
    *out = in;
    return 0;
}

static int filter_string(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)name; (void)a;
    return to_str(c, n, in, out);
}

/* trim(chars) */
static int filter_trim(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)name;
    tv s;
    int rc;
    tv *ch = tpl_arg(a, 0, "chars");
    if (ch && ch->t != TV_NONE && ch->t != TV_STR) return tpl_fail(c, n, KVS_ERR_TYPE, "trim chars must be a string");
    if ((rc = to_str(c, n, in, &s))) return rc;
    rc = tpl_strip(c, n, s.s, ch && ch->t == TV_STR ? ch->s : NULL, 3, out);
    tv_decref(c, s);
    return rc;
}

/* length / count */
static int filter_length(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)name; (void)a;
    switch (in.t) {
    case TV_UNDEF: *out = tv_int(0); return 0;
    case TV_STR: *out = tv_int((int64_t)tpl_u8_len(in.s->data, in.s->len)); return 0;
    case TV_LIST: if (in.c->kind == TC_GEN) break; *out = tv_int((int64_t)in.c->n); return 0;
    case TV_DICT: if (in.c->kind == TC_NS) break; *out = tv_int((int64_t)in.c->n); return 0;
    default: break;
    }
    return tpl_fail(c, n, KVS_ERR_TYPE, "object of type '%s' has no len()", tv_typename(in));
}

/* join(d, attribute) */
static int filter_join(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)name;
    int rc;
    tv *sep = tpl_arg(a, 0, "d"), *attr = tpl_arg(a, 1, "attribute");
    tv sepv = tv_none();
    if (sep && (rc = to_str(c, n, *sep, &sepv))) return rc;
    rc = tpl_join(c, n, in, sep ? sepv.s : NULL, attr && attr->t == TV_STR ? attr->s : NULL, out);
    tv_decref(c, sepv);
    return rc;
}

/* lower, upper, title, capitalize */
static int filter_case(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)a;
    tv s;
    int rc;
    if ((rc = to_str(c, n, in, &s))) return rc;
    int mode = name[0] == 'l' ? CASE_LOWER : name[0] == 'u' ? CASE_UPPER : name[0] == 't' ? CASE_JTITLE : CASE_CAP;
    rc = tpl_case(c, n, s.s, mode, out);
    tv_decref(c, s);
    return rc;
}

/* replace(old, new, count) */
static int filter_replace(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)name;
    tv s;
    int rc;
    tstr *old, *new;
    tv *cnt = tpl_arg(a, 2, "count");
    if ((rc = tpl_need_str(c, n, tpl_arg(a, 0, "old"), "replace's old", &old)) ||
        (rc = tpl_need_str(c, n, tpl_arg(a, 1, "new"), "replace's new", &new)))
        return rc;
    if ((rc = to_str(c, n, in, &s))) return rc;
    rc = tpl_replace(c, n, s.s, old, new, cnt && tpl_is_intlike(*cnt) ? tpl_ival(*cnt) : -1, out);
    tv_decref(c, s);
    return rc;
}

/* escape / e / forceescape */
static int filter_escape(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)name; (void)a;
    tv s;
    int rc;
    if ((rc = to_str(c, n, in, &s))) return rc;
    rc = tpl_html_escape(c, n, s.s, out);
    tv_decref(c, s);
    return rc;
}

/* format(*args): printf-style % formatting */
static int filter_format(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)name;
    int rc;
    tstr *x = NULL;
    if ((rc = tpl_need_str(c, n, &in, "format's input", &x))) return rc;
    tv tup;
    if ((rc = tcont_new(c, n, TC_TUPLE, (size_t)a->npos, &tup))) return rc;
    for (int i = 0; i < a->npos && !rc; i++) { tv_incref(a->pos[i]); rc = tlist_push(c, n, tup.c, a->pos[i]); }
    if (!rc) rc = tpl_str_mod(c, n, x, tup, out);
    tv_decref(c, tup);
    return rc;
}

/* first / last */
static int filter_first_last(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)a;
    int rc;
    if (in.t == TV_STR) return tpl_getitem(c, n, in, tv_int(name[0] == 'f' ? 0 : -1), out);
    tv items;
    if ((rc = tpl_iter_list(c, n, in, &items))) return rc;
    *out = tv_undef(NULL);
    if (items.c->n) { *out = items.c->items[name[0] == 'f' ? 0 : items.c->n - 1]; tv_incref(*out); }
    tv_decref(c, items);
    return 0;
}

static int filter_list(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)name; (void)a;
    return tpl_iter_list(c, n, in, out);
}

static int filter_items(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)name; (void)a;
    if (in.t == TV_UNDEF) return tcont_new(c, n, TC_LIST, 0, out);
    if (in.t != TV_DICT || in.c->kind != TC_DICT) return tpl_fail(c, n, KVS_ERR_TYPE, "can only get item pairs from a mapping");
    return tpl_method(c, n, in, "items", NULL, 0, NULL, NULL, 0, out);
}

/* float(default) */
static int filter_float(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)name;
    if (in.t == TV_UNDEF) return tpl_undef_err(c, n, in);
    tv *dv = tpl_arg(a, 0, "default");
    double f;
    if (tpl_is_intlike(in)) { *out = tv_float((double)tpl_ival(in)); return 0; }
    if (in.t == TV_FLOAT) { *out = in; return 0; }
    if (in.t == TV_STR && parse_float(in.s, &f)) { *out = tv_float(f); return 0; }
    if (dv) { tv_incref(*dv); *out = *dv; } else *out = tv_float(0);
    return 0;
}

static int filter_abs(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)name; (void)a;
    if (in.t == TV_INT) { if (in.i == INT64_MIN) return tpl_fail(c, n, KVS_ERR_LIMIT, "integer overflow"); *out = tv_int(in.i < 0 ? -in.i : in.i); return 0; }
    if (in.t == TV_BOOL) { *out = tv_int(in.b); return 0; }
    if (in.t == TV_FLOAT) { *out = tv_float(fabs(in.f)); return 0; }
    return tpl_fail(c, n, KVS_ERR_TYPE, "bad operand type for abs(): '%s'", tv_typename(in));
}

/* attr(name) */
static int filter_attr(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out) {
    (void)name;
    int rc;
    tstr *an = NULL;
    if ((rc = tpl_need_str(c, n, tpl_arg(a, 0, "name"), "attr's name", &an))) return rc;
    char nm[128];
    size_t l = an->len < sizeof nm - 1 ? an->len : sizeof nm - 1;
    memcpy(nm, an->data, l);
    nm[l] = 0;
    return tpl_getattr(c, n, in, nm, out);
}

/* Every filter by name, in strcmp order (bsearch; tpl_filters_sorted checks the order). Each gets the name it
 * was called by, for the functions that serve several. */
typedef int (*filter_fn)(tctx *c, const node *n, const char *name, tv in, fargs *a, tv *out);
typedef struct filter_entry { const char *name; filter_fn fn; } filter_entry;
static const filter_entry filters[] = {
    {"abs", filter_abs},           {"attr", filter_attr},           {"capitalize", filter_case},
    {"count", filter_length},      {"d", filter_default},           {"default", filter_default},
    {"dictsort", filter_sequence}, {"e", filter_escape},            {"escape", filter_escape},
    {"first", filter_first_last},  {"float", filter_float},         {"forceescape", filter_escape},
    {"format", filter_format},     {"indent", filter_indent},       {"int", filter_int},
    {"items", filter_items},       {"join", filter_join},           {"last", filter_first_last},
    {"length", filter_length},     {"list", filter_list},           {"lower", filter_case},
    {"map", filter_map_select},    {"max", filter_sequence},        {"min", filter_sequence},
    {"reject", filter_map_select}, {"rejectattr", filter_map_select}, {"replace", filter_replace},
    {"reverse", filter_sequence},  {"round", filter_round},         {"safe", filter_safe},
    {"select", filter_map_select}, {"selectattr", filter_map_select}, {"sort", filter_sequence},
    {"string", filter_string},     {"sum", filter_sequence},        {"title", filter_case},
    {"tojson", filter_tojson},     {"trim", filter_trim},           {"unique", filter_sequence},
    {"upper", filter_case},        {"wordcount", filter_wordcount},
};

static int entry_cmp(const void *key, const void *entry) {
    return strcmp(key, *(const char *const *)entry);   /* every table's entries start with their name */
}

bool tpl_table_sorted(const void *table, size_t n, size_t size) {
    for (size_t i = 1; i < n; i++)
        if (strcmp(*(const char *const *)((const char *)table + (i - 1) * size),
                   *(const char *const *)((const char *)table + i * size)) >= 0)
            return false;
    return true;
}

const void *tpl_table_find(const void *table, size_t n, size_t size, const char *name) {
    return bsearch(name, table, n, size, entry_cmp);
}

bool tpl_filters_sorted(void) { return tpl_table_sorted(filters, sizeof filters / sizeof filters[0], sizeof filters[0]); }

int tpl_filter(tctx *c, const node *n, const char *name, tv in, tv *pos, int npos, const char **kwn, tv *kwv,
               int nkw, tv *out) {
    fargs a = {pos, npos, kwn, kwv, nkw};
    const filter_entry *e = tpl_table_find(filters, sizeof filters / sizeof filters[0], sizeof filters[0], name);
    if (!e) return tpl_fail(c, n, KVS_ERR_TYPE, "no filter named '%s'", name);
    return e->fn(c, n, name, in, &a, out);
}
