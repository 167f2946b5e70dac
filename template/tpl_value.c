/* tpl_value.c: template values (Python semantics): strings with their content spans, lists and dicts with
 * reference counts and the render's memory account, truthiness, equality and ordering, str()/repr(), tojson, and
 * conversion from cJSON. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

void tpl_set_error(tpl_error *err, int code, int line, int col, const char *fmt, va_list ap) {
    if (!err) return;
    char m[220];
    vsnprintf(m, sizeof m, fmt, ap);
    err->code = code;
    err->line = line;
    err->col = col;
    if (line) snprintf(err->msg, sizeof err->msg, "template line %d:%d: %s", line, col, m);
    else snprintf(err->msg, sizeof err->msg, "template: %s", m);
}

int tpl_fail(tctx *c, const node *n, int code, const char *fmt, ...) {
    if (c->errcode) return c->errcode;
    c->errcode = code;
    va_list ap;
    va_start(ap, fmt);
    tpl_set_error(c->err, code, n ? n->line : 0, n ? n->col : 0, fmt, ap);
    va_end(ap);
    return code;
}

int tpl_mem(tctx *c, const node *n, size_t add) {
    if (add > c->t->lim.max_memory || c->mem > c->t->lim.max_memory - add)
        return tpl_fail(c, n, KVS_ERR_LIMIT, "memory limit of %zu bytes reached", c->t->lim.max_memory);
    c->mem += add;
    c->alloc_total = add > SIZE_MAX - c->alloc_total ? SIZE_MAX : c->alloc_total + add;
    if (c->p->max_alloc_bytes && c->alloc_total > c->p->max_alloc_bytes)
        return tpl_fail(c, n, KVS_ERR_LIMIT, "allocation budget of %zu bytes reached", c->p->max_alloc_bytes);
    if (add >= (1u << 20) && (c->deadline_ns || c->p->cancel)) {
        c->next_check = 0; /* a large string: look at the clock at the next step */
    }
    return 0;
}

/* ---- UTF-8 ----------------------------------------------------------------------------------------------- */

bool tpl_is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

size_t tpl_u8_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

size_t tpl_u8_off(const char *s, size_t n, size_t cp) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (k == cp) return i;
            k++;
        }
    return n;
}

/* ---- strings --------------------------------------------------------------------------------------------- */

int tstr_alloc(tctx *c, const node *n, size_t len, tstr **out) {
    if (len > c->t->lim.max_output)
        return tpl_fail(c, n, KVS_ERR_LIMIT, "string longer than the output limit of %zu bytes", c->t->lim.max_output);
    int rc = tpl_charge(c, n, len / TPL_BYTES_PER_STEP);
    if (!rc) rc = tpl_mem(c, n, sizeof(tstr) + len + 1);
    if (rc) return rc;
    tstr *s = malloc(sizeof *s + len + 1);
    if (!s) {
        tpl_unmem(c, sizeof(tstr) + len + 1);
        return tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
    }
    s->rc = 1;
    s->safe = false;
    s->nspans = 0;
    s->spans = NULL;
    s->len = len;
    s->data[len] = 0;
    *out = s;
    return 0;
}

int tstr_new(tctx *c, const node *n, const char *p, size_t len, tv *out) {
    tstr *s = NULL;
    int rc = tstr_alloc(c, n, len, &s);
    if (rc) return rc;
    if (len) memcpy(s->data, p, len);
    *out = tv_str(s);
    return 0;
}

static void tstr_free(tctx *c, tstr *s) {
    tpl_unmem(c, sizeof(tstr) + s->len + 1 + s->nspans * sizeof(tpl_span));
    free(s->spans);
    free(s);
}

/* appends span [off, off+len) to an array, merging with the last when adjacent */
static int spans_add(tpl_span **arr, size_t *n, size_t *cap, size_t off, size_t len) {
    if (!len) return 0;
    if (*n && (*arr)[*n - 1].off + (*arr)[*n - 1].len == off) {
        (*arr)[*n - 1].len += len;
        return 0;
    }
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        tpl_span *na = realloc(*arr, nc * sizeof *na);
        if (!na) return KVS_ERR_NOMEM;
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = (tpl_span){off, len};
    return 0;
}

int tstr_sub(tctx *c, const node *n, tstr *s, size_t off, size_t len, tv *out) {
    if (off == 0 && len == s->len) {
        tv v = tv_str(s);
        tv_incref(v);
        *out = v;
        return 0;
    }
    tstr *r = NULL;
    int rc = tstr_alloc(c, n, len, &r);
    if (rc) return rc;
    memcpy(r->data, s->data + off, len);
    r->safe = s->safe;
    size_t nsp = 0, cap = 0;
    for (uint32_t i = 0; i < s->nspans; i++) {
        size_t a = s->spans[i].off, b = a + s->spans[i].len;
        if (a < off) a = off;
        if (b > off + len) b = off + len;
        if (a < b && spans_add(&r->spans, &nsp, &cap, a - off, b - a)) {
            tstr_free(c, r);
            return tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
        }
    }
    r->nspans = (uint32_t)nsp;
    if (nsp && (rc = tpl_mem(c, n, nsp * sizeof(tpl_span)))) {
        r->nspans = 0;
        tstr_free(c, r);
        return rc;
    }
    *out = tv_str(r);
    return 0;
}

/* ---- containers ------------------------------------------------------------------------------------------ */

int tcont_new(tctx *c, const node *n, int kind, size_t cap, tv *out) {
    int rc = tpl_mem(c, n, sizeof(tcont));
    if (rc) return rc;
    tcont *k = calloc(1, sizeof *k);
    if (!k) return tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
    k->rc = 1;
    k->kind = (uint8_t)kind;
    if (cap) {
        size_t per = sizeof(tv) + (kind == TC_DICT || kind == TC_NS ? sizeof(tv) : 0);
        if ((rc = tpl_mem(c, n, cap * per))) { free(k); tpl_unmem(c, sizeof(tcont)); return rc; }
        k->items = malloc(cap * sizeof(tv));
        if (kind == TC_DICT || kind == TC_NS) k->keys = malloc(cap * sizeof(tv));
        if (!k->items || ((kind == TC_DICT || kind == TC_NS) && !k->keys)) {
            free(k->items);
            free(k->keys);
            free(k);
            tpl_unmem(c, sizeof(tcont) + cap * per);
            return tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
        }
        k->cap = cap;
    }
    k->next = c->live;
    if (c->live) c->live->prev = k;
    c->live = k;
    out->t = (kind == TC_DICT || kind == TC_NS) ? TV_DICT : TV_LIST;
    out->sub = 0;
    out->c = k;
    return 0;
}

static size_t cont_per(const tcont *k) { return sizeof(tv) + (k->keys ? sizeof(tv) : 0); }

static int cont_grow(tctx *c, const node *n, tcont *k) {
    bool dict = k->kind == TC_DICT || k->kind == TC_NS;
    size_t nc = k->cap ? k->cap * 2 : 4;
    size_t per = sizeof(tv) + (dict ? sizeof(tv) : 0);
    int rc = tpl_mem(c, n, (nc - k->cap) * per);
    if (rc) return rc;
    tv *ni = realloc(k->items, nc * sizeof *ni);
    if (!ni) goto oom;
    k->items = ni;
    if (dict) {
        tv *nk = realloc(k->keys, nc * sizeof *nk);
        if (!nk) goto oom;
        k->keys = nk;
    }
    k->cap = nc;
    return 0;
oom:
    tpl_unmem(c, (nc - k->cap) * per);
    return tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
}

int tlist_push(tctx *c, const node *n, tcont *l, tv v) {
    if (l->n == l->cap) {
        int rc = cont_grow(c, n, l);
        if (rc) { tv_decref(c, v); return rc; }
    }
    l->items[l->n++] = v;
    return 0;
}

static uint32_t hkey(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

bool tv_hashable(tv v) {
    return v.t == TV_STR || v.t == TV_INT || v.t == TV_BOOL || v.t == TV_FLOAT || v.t == TV_NONE || v.t == TV_UNDEF;
}

/* equal keys hash equally: 1, 1.0 and True are one key, as in Python */
static uint32_t hval(tv k) {
    if (k.t == TV_STR) return hkey(k.s->data, k.s->len);
    int64_t i;
    if (k.t == TV_INT) i = k.i;
    else if (k.t == TV_BOOL) i = k.b;
    else if (k.t == TV_FLOAT && k.f == floor(k.f) && fabs(k.f) < 9.2e18) i = (int64_t)k.f;
    else if (k.t == TV_FLOAT) { uint64_t b; memcpy(&b, &k.f, sizeof b); return (uint32_t)(b ^ b >> 32); }
    else return 0x9e3779b9u;
    return hkey((const char *)&i, sizeof i);
}

static int dict_reindex(tcont *d) {
    size_t icap = 16;
    while (icap < d->n * 2 + 2) icap *= 2;
    uint32_t *ix = calloc(icap, sizeof *ix);
    if (!ix) return KVS_ERR_NOMEM;
    for (size_t i = 0; i < d->n; i++) {
        size_t h = hval(d->keys[i]) & (icap - 1);
        while (ix[h]) h = (h + 1) & (icap - 1);
        ix[h] = (uint32_t)(i + 1);
    }
    free(d->index);
    d->index = ix;
    d->icap = icap;
    return 0;
}

static bool key_is(tv k, const char *key, size_t klen) {
    return k.t == TV_STR && k.s->len == klen && !memcmp(k.s->data, key, klen);
}

static size_t dict_find(const tcont *d, const char *key, size_t klen) {
    if (d->index) {
        size_t h = hkey(key, klen) & (d->icap - 1);
        for (; d->index[h]; h = (h + 1) & (d->icap - 1))
            if (key_is(d->keys[d->index[h] - 1], key, klen)) return d->index[h] - 1;
        return (size_t)-1;
    }
    for (size_t i = 0; i < d->n; i++)
        if (key_is(d->keys[i], key, klen)) return i;
    return (size_t)-1;
}

static size_t dict_findv(const tcont *d, tv key) {
    if (key.t == TV_STR) return dict_find(d, key.s->data, key.s->len);
    if (!tv_hashable(key) || key.t == TV_UNDEF) return (size_t)-1;
    if (d->index) {
        size_t h = hval(key) & (d->icap - 1);
        for (; d->index[h]; h = (h + 1) & (d->icap - 1))
            if (d->keys[d->index[h] - 1].t != TV_STR && tv_equal(d->keys[d->index[h] - 1], key)) return d->index[h] - 1;
        return (size_t)-1;
    }
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].t != TV_STR && tv_equal(d->keys[i], key)) return i;
    return (size_t)-1;
}

tv *tdict_get(const tcont *d, const char *key, size_t klen) {
    size_t i = dict_find(d, key, klen);
    return i == (size_t)-1 ? NULL : &d->items[i];
}

tv *tdict_getv(const tcont *d, tv key) {
    size_t i = dict_findv(d, key);
    return i == (size_t)-1 ? NULL : &d->items[i];
}

int tdict_set(tctx *c, const node *n, tcont *d, tv key, tv v) {
    if (!tv_hashable(key) || key.t == TV_UNDEF) {
        tv_decref(c, v);
        return tpl_fail(c, n, KVS_ERR_TYPE, "unhashable type: '%s'", tv_typename(key));
    }
    size_t i = dict_findv(d, key);
    if (i != (size_t)-1) {
        tv old = d->items[i];
        d->items[i] = v;
        tv_decref(c, old);
        return 0;
    }
    if (d->n >= UINT32_MAX - 1) { tv_decref(c, v); return tpl_fail(c, n, KVS_ERR_LIMIT, "dict too large"); }
    if (d->n == d->cap) {
        int rc = cont_grow(c, n, d);
        if (rc) { tv_decref(c, v); return rc; }
    }
    tv_incref(key);
    d->keys[d->n] = key;
    d->items[d->n++] = v;
    if (d->n > 8 && (!d->index || d->n * 2 > d->icap)) {
        if (dict_reindex(d)) return tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
    } else if (d->index) {
        size_t h = hval(key) & (d->icap - 1);
        while (d->index[h]) h = (h + 1) & (d->icap - 1);
        d->index[h] = (uint32_t)d->n;
    }
    return 0;
}

int tdict_setc(tctx *c, const node *n, tcont *d, const char *key, tv v) {
    tv k;
    int rc = tstr_new(c, n, key, strlen(key), &k);
    if (rc) { tv_decref(c, v); return rc; }
    rc = tdict_set(c, n, d, k, v);
    tv_decref(c, k);
    return rc;
}

int tdict_del(tctx *c, tcont *d, size_t pos) {
    tv_decref(c, d->keys[pos]);
    tv_decref(c, d->items[pos]);
    memmove(d->keys + pos, d->keys + pos + 1, (d->n - pos - 1) * sizeof *d->keys);
    memmove(d->items + pos, d->items + pos + 1, (d->n - pos - 1) * sizeof *d->items);
    d->n--;
    if (d->index) return dict_reindex(d);
    return 0;
}

static void cont_unlink(tctx *c, tcont *k) {
    if (k->prev) k->prev->next = k->next;
    else c->live = k->next;
    if (k->next) k->next->prev = k->prev;
}

static void cont_release(tctx *c, tcont *k) {
    tpl_unmem(c, sizeof(tcont) + k->cap * cont_per(k));
    free(k->items);
    free(k->keys);
    free(k->index);
    free(k);
}

/* ---- reference counts ------------------------------------------------------------------------------------ */

void tv_incref(tv v) {
    if (v.t == TV_STR && v.s->rc >= 0) v.s->rc++;
    else if (v.t == TV_LIST || v.t == TV_DICT) v.c->rc++;
    else if (v.t == TV_LOOP) v.loop->rc++;
    else if (v.t == TV_CALLER) v.cl->rc++;
}

/* Containers freed by a chain of decrefs deeper than this stay on the live list until the render ends (the C
 * stack stays bounded however deep a template nests its lists). */
#define FREE_DEPTH_MAX 200

void tv_decref(tctx *c, tv v) {
    if (v.t == TV_STR) {
        if (v.s->rc > 0 && --v.s->rc == 0) tstr_free(c, v.s);
    } else if (v.t == TV_LIST || v.t == TV_DICT) {
        tcont *k = v.c;
        if (k->rc <= 0 || --k->rc > 0 || c->dying || c->free_depth >= FREE_DEPTH_MAX) return;
        c->free_depth++;
        cont_unlink(c, k);
        for (size_t i = 0; i < k->n; i++) {
            if (k->keys) tv_decref(c, k->keys[i]);
            tv_decref(c, k->items[i]);
        }
        cont_release(c, k);
        c->free_depth--;
    } else if (v.t == TV_CALLER) {
        if (--v.cl->rc == 0) {
            tpl_unmem(c, sizeof(tcaller));
            free(v.cl);
        }
    } else if (v.t == TV_LOOP) {
        if (--v.loop->rc == 0) {
            tv_decref(c, v.loop->prev);
            tv_decref(c, v.loop->next);
            tpl_unmem(c, sizeof(tloop));
            free(v.loop);
        }
    }
}

void tctx_free_all(tctx *c) {
    /* containers still alive (cycles, or left by the depth guard): drop their strings and loops, then free them
     * all; while dying, decrefs never free a container */
    c->dying = true;
    for (tcont *k = c->live; k; k = k->next)
        for (size_t i = 0; i < k->n; i++) {
            if (k->keys) tv_decref(c, k->keys[i]);
            if (k->items[i].t != TV_LIST && k->items[i].t != TV_DICT) tv_decref(c, k->items[i]);
        }
    while (c->live) {
        tcont *k = c->live;
        c->live = k->next;
        k->n = 0;
        cont_release(c, k);
    }
}

/* ---- truth, equality, order ------------------------------------------------------------------------------ */

bool tv_truthy(tv v) {
    switch (v.t) {
    case TV_UNDEF: case TV_NONE: return false;
    case TV_BOOL: return v.b;
    case TV_INT: return v.i != 0;
    case TV_FLOAT: return v.f != 0;
    case TV_STR: return v.s->len > 0;
    case TV_LIST: return v.c->kind == TC_GEN || v.c->n > 0;
    case TV_DICT: return v.c->kind == TC_NS || v.c->n > 0;
    default: return true;
    }
}

static bool is_num(tv v) { return v.t == TV_INT || v.t == TV_FLOAT || v.t == TV_BOOL; }
static double num_f(tv v) { return v.t == TV_FLOAT ? v.f : v.t == TV_INT ? (double)v.i : (double)v.b; }
static int64_t num_i(tv v) { return v.t == TV_INT ? v.i : (int64_t)v.b; }

bool tv_equal(tv a, tv b) {
    tv_eqw w = {0};
    return tv_equal_w(a, b, &w);
}

bool tv_equal_w(tv a, tv b, tv_eqw *w) {
    w->work++;
    if (is_num(a) && is_num(b)) {
        if (a.t == TV_FLOAT || b.t == TV_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case TV_UNDEF: case TV_NONE: return true;
    case TV_STR: return a.s->len == b.s->len && !memcmp(a.s->data, b.s->data, a.s->len);
    case TV_LIST: case TV_DICT: {
        if (a.c == b.c) return true;
        if (a.c->kind != b.c->kind || a.c->kind == TC_GEN || a.c->kind == TC_NS || a.c->n != b.c->n) return false;
        if (w->deep || ++w->depth > TPL_MAX_EVAL_NEST) { w->deep = true; return false; }
        bool eq = true;
        for (size_t i = 0; i < a.c->n && eq; i++) {
            tv *o = a.t == TV_LIST ? &b.c->items[i] : tdict_getv(b.c, a.c->keys[i]);
            eq = o && tv_equal_w(a.c->items[i], *o, w);
        }
        w->depth--;
        return eq && !w->deep;
    }
    case TV_FUNC: return a.sub == b.sub;
    case TV_MACRO: return a.m == b.m;
    case TV_LOOP: return a.loop == b.loop;
    case TV_CALLER: return a.cl == b.cl;
    default: return false;
    }
}

const char *tv_typename(tv v) {
    switch (v.t) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return "str";
    case TV_LIST: return v.c->kind == TC_TUPLE ? "tuple" : v.c->kind == TC_GEN ? "generator" : "list";
    case TV_DICT: return v.c->kind == TC_NS ? "Namespace" : "dict";
    case TV_LOOP: return "LoopContext";
    case TV_CALLER: return "Macro";
    default: return "function";
    }
}

int tv_compare(tctx *c, const node *n, tv a, tv b, int *res) {
    if (is_num(a) && is_num(b)) {
        if (a.t == TV_FLOAT || b.t == TV_FLOAT) {
            double x = num_f(a), y = num_f(b);
            *res = x < y ? -1 : x > y ? 1 : 0;
        } else {
            int64_t x = num_i(a), y = num_i(b);
            *res = x < y ? -1 : x > y ? 1 : 0;
        }
        return 0;
    }
    if (a.t == TV_STR && b.t == TV_STR) {
        size_t m = a.s->len < b.s->len ? a.s->len : b.s->len;
        int r = memcmp(a.s->data, b.s->data, m);
        *res = r ? (r < 0 ? -1 : 1) : a.s->len < b.s->len ? -1 : a.s->len > b.s->len ? 1 : 0;
        return 0;
    }
    if (a.t == TV_LIST && b.t == TV_LIST && a.c->kind == b.c->kind && a.c->kind != TC_GEN) {
        for (size_t i = 0; i < a.c->n && i < b.c->n; i++) {
            bool eq;
            int rc = tpl_equal(c, n, a.c->items[i], b.c->items[i], &eq);
            if (rc) return rc;
            if (eq) continue;
            if (++c->nest > TPL_MAX_EVAL_NEST) { c->nest--; return tpl_fail(c, n, KVS_ERR_LIMIT, "values nested too deeply"); }
            rc = tv_compare(c, n, a.c->items[i], b.c->items[i], res);
            c->nest--;
            return rc;
        }
        *res = a.c->n < b.c->n ? -1 : a.c->n > b.c->n ? 1 : 0;
        return 0;
    }
    if (a.t == TV_UNDEF || b.t == TV_UNDEF)
        return tpl_fail(c, n, KVS_ERR_TYPE, "'%s' is undefined", a.t == TV_UNDEF && a.uname ? a.uname : b.t == TV_UNDEF && b.uname ? b.uname : "value");
    return tpl_fail(c, n, KVS_ERR_TYPE, "'<' not supported between instances of '%s' and '%s'", tv_typename(a), tv_typename(b));
}

/* ---- str / repr ------------------------------------------------------------------------------------------- */

void tpl_format_float(double f, char *buf, size_t cap) {
    if (isnan(f)) { snprintf(buf, cap, "nan"); return; }
    if (isinf(f)) { snprintf(buf, cap, f < 0 ? "-inf" : "inf"); return; }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: d.ddde[+-]XX; digits and exponent */
    char digits[24];
    int nd = 0, exp10;
    const char *q = tmp;
    bool neg = *q == '-';
    if (neg) q++;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') digits[nd++] = *q;
    exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char out[64];
    size_t k = 0;
    if (neg) out[k++] = '-';
    if (exp10 < -4 || exp10 >= 16) {
        out[k++] = digits[0];
        if (nd > 1) {
            out[k++] = '.';
            for (int i = 1; i < nd; i++) out[k++] = digits[i];
        }
        k += (size_t)snprintf(out + k, sizeof out - k, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (exp10 < 0) {
        out[k++] = '0';
        out[k++] = '.';
        for (int i = -1; i > exp10; i--) out[k++] = '0';
        for (int i = 0; i < nd; i++) out[k++] = digits[i];
    } else {
        for (int i = 0; i <= exp10; i++) out[k++] = i < nd ? digits[i] : '0';
        out[k++] = '.';
        if (nd > exp10 + 1) for (int i = exp10 + 1; i < nd; i++) out[k++] = digits[i];
        else out[k++] = '0';
    }
    out[k] = 0;
    snprintf(buf, cap, "%s", out);
}

size_t tpl_u8_dec(const char *str, size_t n, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)str;
    if (s[0] < 0x80) { *cp = s[0]; return 1; }
    size_t len = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC0 ? 2 : 1;
    if (len == 1 || len > n) { *cp = s[0]; return 1; }
    uint32_t v = s[0] & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) { *cp = s[0]; return 1; }
        v = v << 6 | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

static bool py_printable(uint32_t cp) {
    if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
    if ((cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) || (cp >= 0x205F && cp <= 0x206F)) return false;
    if (cp == 0x3000 || cp == 0xFEFF || cp == 0x1680 || (cp >= 0xD800 && cp <= 0xDFFF) || cp == 0x180E) return false;
    if ((cp >= 0xE000 && cp <= 0xF8FF) || (cp >= 0xFFF0 && cp <= 0xFFFF && cp != 0xFFFD)) return false;
    return true;
}

static void repr_str(kvs_buf *b, const char *s, size_t n) {
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    kvs_buf_putc(b, q);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tpl_u8_dec(s + i, n - i, &cp);
        if (cp == '\\' || (char)cp == q) { kvs_buf_putc(b, '\\'); kvs_buf_putc(b, (char)cp); }
        else if (cp == '\n') kvs_buf_puts(b, "\\n");
        else if (cp == '\r') kvs_buf_puts(b, "\\r");
        else if (cp == '\t') kvs_buf_puts(b, "\\t");
        else if (l == 1 && cp >= 0x80) kvs_buf_printf(b, "\\udc%02x", cp);   /* Python's surrogateescape */
        else if (!py_printable(cp)) {
            if (cp < 0x100) kvs_buf_printf(b, "\\x%02x", cp);
            else if (cp < 0x10000) kvs_buf_printf(b, "\\u%04x", cp);
            else kvs_buf_printf(b, "\\U%08x", cp);
        } else kvs_buf_append(b, s + i, l);
        i += l;
    }
    kvs_buf_putc(b, q);
}

int tv_repr(tctx *c, const node *n, tv v, kvs_buf *b, int depth) {
    if (depth > c->t->lim.max_depth) return tpl_fail(c, n, KVS_ERR_LIMIT, "value nested deeper than %d", c->t->lim.max_depth);
    char num[40];
    switch (v.t) {
    case TV_UNDEF: break;
    case TV_NONE: kvs_buf_puts(b, "None"); break;
    case TV_BOOL: kvs_buf_puts(b, v.b ? "True" : "False"); break;
    case TV_INT: kvs_buf_printf(b, "%lld", (long long)v.i); break;
    case TV_FLOAT: tpl_format_float(v.f, num, sizeof num); kvs_buf_puts(b, num); break;
    case TV_STR: if (depth == 0) kvs_buf_append(b, v.s->data, v.s->len); else repr_str(b, v.s->data, v.s->len); break;
    case TV_LIST: {
        if (v.c->kind == TC_GEN) { kvs_buf_puts(b, "<generator object>"); break; }
        bool tup = v.c->kind == TC_TUPLE;
        kvs_buf_putc(b, tup ? '(' : '[');
        for (size_t i = 0; i < v.c->n; i++) {
            if (i) kvs_buf_puts(b, ", ");
            int rc = tv_repr(c, n, v.c->items[i], b, depth + 1);
            if (rc) return rc;
            if (b->len > c->t->lim.max_output) break;
        }
        if (tup && v.c->n == 1) kvs_buf_putc(b, ',');
        kvs_buf_putc(b, tup ? ')' : ']');
        break;
    }
    case TV_DICT:
        if (v.c->kind == TC_NS) { kvs_buf_puts(b, "<Namespace>"); break; }
        kvs_buf_putc(b, '{');
        for (size_t i = 0; i < v.c->n; i++) {
            if (i) kvs_buf_puts(b, ", ");
            int rk = tv_repr(c, n, v.c->keys[i], b, depth + 1);
            if (rk) return rk;
            kvs_buf_puts(b, ": ");
            int rc = tv_repr(c, n, v.c->items[i], b, depth + 1);
            if (rc) return rc;
            if (b->len > c->t->lim.max_output) break;
        }
        kvs_buf_putc(b, '}');
        break;
    case TV_LOOP: kvs_buf_puts(b, "<LoopContext>"); break;
    case TV_MACRO: kvs_buf_printf(b, "<Macro '%s'>", v.m->name); break;
    case TV_CALLER: kvs_buf_puts(b, "<Macro 'caller'>"); break;
    default: kvs_buf_puts(b, "<built-in function>"); break;
    }
    if (b->len > c->t->lim.max_output)
        return tpl_fail(c, n, KVS_ERR_LIMIT, "string longer than the output limit of %zu bytes", c->t->lim.max_output);
    if (b->oom) return tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
    return 0;
}

int tv_tostr(tctx *c, const node *n, tv v, tv *out) {
    if (v.t == TV_STR) {
        tv_incref(v);
        *out = v;
        return 0;
    }
    kvs_buf b = {0};
    int rc = tv_repr(c, n, v, &b, 0);
    if (!rc) rc = tpl_charge(c, n, b.len / TPL_BYTES_PER_STEP);
    if (!rc) rc = tstr_new(c, n, b.data ? b.data : "", b.len, out);
    kvs_buf_free(&b);
    return rc;
}

/* ---- sinks ------------------------------------------------------------------------------------------------ */

int tsink_put(tctx *c, const node *n, tsink *s, const char *p, size_t len, bool marked) {
    size_t off = s->buf.len;
    if (len > c->t->lim.max_output || off > c->t->lim.max_output - len)
        return tpl_fail(c, n, KVS_ERR_LIMIT, "output longer than the limit of %zu bytes", c->t->lim.max_output);
    if (len >= TPL_BYTES_PER_STEP) {
        int rc = tpl_charge(c, n, len / TPL_BYTES_PER_STEP);
        if (rc) return rc;
    }
    if (kvs_buf_append(&s->buf, p, len)) return tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
    if (marked && spans_add(&s->spans, &s->nspans, &s->cap, off, len)) return tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
    return 0;
}

int tsink_putstr(tctx *c, const node *n, tsink *s, const tstr *str) {
    size_t off = s->buf.len;
    int rc = tsink_put(c, n, s, str->data, str->len, false);
    for (uint32_t i = 0; !rc && i < str->nspans; i++)
        if (spans_add(&s->spans, &s->nspans, &s->cap, off + str->spans[i].off, str->spans[i].len))
            rc = tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
    return rc;
}

int tsink_take(tctx *c, const node *n, tsink *s, tv *out) {
    tstr *r = NULL;
    int rc = tstr_alloc(c, n, s->buf.len, &r);
    if (rc) return rc;
    if (s->buf.len) memcpy(r->data, s->buf.data, s->buf.len);
    if (s->nspans) {
        if ((rc = tpl_mem(c, n, s->nspans * sizeof(tpl_span)))) { tstr_free(c, r); return rc; }
        r->spans = s->spans;
        r->nspans = (uint32_t)s->nspans;
        s->spans = NULL;
        s->nspans = s->cap = 0;
    }
    *out = tv_str(r);
    return 0;
}

void tsink_free(tsink *s) {
    kvs_buf_free(&s->buf);
    free(s->spans);
    s->spans = NULL;
    s->nspans = s->cap = 0;
}

int tv_print(tctx *c, const node *n, tv v, tsink *s) {
    if (v.t == TV_STR) return tsink_putstr(c, n, s, v.s);
    if (v.t == TV_UNDEF) return 0;
    kvs_buf b = {0};
    int rc = tv_repr(c, n, v, &b, 0);
    if (!rc) rc = tsink_put(c, n, s, b.data ? b.data : "", b.len, false);
    kvs_buf_free(&b);
    return rc;
}

/* ---- JSON ------------------------------------------------------------------------------------------------- */

static int json_str(tctx *c, const node *n, tsink *s, const tstr *str, bool ascii) {
    kvs_buf b = {0};
    const char *p = str->data;
    /* the escaped bytes of each marked range are marked */
    size_t spi = 0;
    int rc = tsink_put(c, n, s, "\"", 1, false);
    if (rc) return rc;
    size_t i = 0;
    while (i < str->len && !rc) {
        /* the next run with one marking */
        bool marked = false;
        size_t end = str->len;
        while (spi < str->nspans && str->spans[spi].off + str->spans[spi].len <= i) spi++;
        if (spi < str->nspans) {
            if (str->spans[spi].off <= i) { marked = true; end = str->spans[spi].off + str->spans[spi].len; }
            else end = str->spans[spi].off;
        }
        kvs_buf_clear(&b);
        while (i < end) {
            unsigned char ch = (unsigned char)p[i];
            if (ascii && ch >= 0x7F) {   /* ensure_ascii: \uXXXX, surrogate pairs above the BMP */
                uint32_t cp;
                size_t l = tpl_u8_dec(p + i, end - i, &cp);
                if (l == 1 && cp >= 0x80) cp = 0xDC00 | cp;   /* a stray byte: Python's surrogateescape */
                if (cp >= 0x10000) kvs_buf_printf(&b, "\\u%04x\\u%04x", 0xD800 | ((cp - 0x10000) >> 10), 0xDC00 | ((cp - 0x10000) & 0x3FF));
                else kvs_buf_printf(&b, "\\u%04x", cp);
                i += l;
                continue;
            }
            switch (ch) {
            case '"': kvs_buf_puts(&b, "\\\""); break;
            case '\\': kvs_buf_puts(&b, "\\\\"); break;
            case '\n': kvs_buf_puts(&b, "\\n"); break;
            case '\r': kvs_buf_puts(&b, "\\r"); break;
            case '\t': kvs_buf_puts(&b, "\\t"); break;
            case '\b': kvs_buf_puts(&b, "\\b"); break;
            case '\f': kvs_buf_puts(&b, "\\f"); break;
            default:
                if (ch < 0x20) kvs_buf_printf(&b, "\\u%04x", ch);
                else kvs_buf_putc(&b, (char)ch);
            }
            i++;
        }
        if (b.oom) rc = tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
        else if (b.len) rc = tsink_put(c, n, s, b.data, b.len, marked);
    }
    kvs_buf_free(&b);
    return rc ? rc : tsink_put(c, n, s, "\"", 1, false);
}

static int json_val(tctx *c, const node *n, tv v, const tpl_json_opts *o, int level, tsink *s);

/* json.dumps turns int, float, bool and None keys into strings: their JSON text, quoted */
static int json_key(tctx *c, const node *n, tsink *s, tv k, const tpl_json_opts *o) {
    if (k.t == TV_STR) return json_str(c, n, s, k.s, o->ensure_ascii);
    int rc = tsink_put(c, n, s, "\"", 1, false);
    if (!rc) rc = json_val(c, n, k, o, 0, s);
    return rc ? rc : tsink_put(c, n, s, "\"", 1, false);
}

static int json_indent(tctx *c, const node *n, tsink *s, int indent, int level) {
    int rc = tsink_put(c, n, s, "\n", 1, false);
    for (long i = 0; !rc && i < (long)indent * level; i++) rc = tsink_put(c, n, s, " ", 1, false);
    return rc;
}

/* the positions of a dict's keys in sort_keys order (Python sorts the keys themselves; mixed types fail) */
static int json_sorted(tctx *c, const node *n, const tcont *d, size_t **order) {
    size_t *ix = malloc((d->n ? d->n : 1) * sizeof *ix);
    if (!ix) return tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < d->n; i++) ix[i] = i;
    for (size_t i = 1; i < d->n; i++)   /* insertion sort: stable, dicts in templates are small */
        for (size_t j = i; j > 0; j--) {
            int r;
            if (tv_compare(c, n, d->keys[ix[j - 1]], d->keys[ix[j]], &r)) { free(ix); return c->errcode; }
            if (r <= 0) break;
            size_t t = ix[j]; ix[j] = ix[j - 1]; ix[j - 1] = t;
        }
    *order = ix;
    return 0;
}

static int json_val(tctx *c, const node *n, tv v, const tpl_json_opts *o, int level, tsink *s) {
    if (level > c->t->lim.max_depth) return tpl_fail(c, n, KVS_ERR_LIMIT, "value nested deeper than %d", c->t->lim.max_depth);
    int rc = tpl_step(c, n);
    if (rc) return rc;
    char num[40];
    switch (v.t) {
    case TV_NONE: return tsink_put(c, n, s, "null", 4, false);
    case TV_BOOL: return v.b ? tsink_put(c, n, s, "true", 4, false) : tsink_put(c, n, s, "false", 5, false);
    case TV_INT: snprintf(num, sizeof num, "%lld", (long long)v.i); return tsink_put(c, n, s, num, strlen(num), false);
    case TV_FLOAT:
        if (isnan(v.f)) snprintf(num, sizeof num, "NaN");
        else if (isinf(v.f)) snprintf(num, sizeof num, v.f < 0 ? "-Infinity" : "Infinity");
        else tpl_format_float(v.f, num, sizeof num);
        return tsink_put(c, n, s, num, strlen(num), false);
    case TV_STR: return json_str(c, n, s, v.s, o->ensure_ascii);
    case TV_LIST: case TV_DICT: {
        bool dict = v.t == TV_DICT;
        if (v.c->kind == TC_GEN || v.c->kind == TC_NS) break;
        const char *br = dict ? "{}" : "[]";
        if (!v.c->n) return tsink_put(c, n, s, br, 2, false);
        size_t *order = NULL;
        if (dict && o->sort_keys && (rc = json_sorted(c, n, v.c, &order))) return rc;
        rc = tsink_put(c, n, s, br, 1, false);
        for (size_t k = 0; !rc && k < v.c->n; k++) {
            size_t i = order ? order[k] : k;
            if (k) rc = tsink_put(c, n, s, o->item_sep, strlen(o->item_sep), false);
            if (!rc && o->indent >= 0) rc = json_indent(c, n, s, o->indent, level + 1);
            if (!rc && dict) rc = json_key(c, n, s, v.c->keys[i], o);
            if (!rc && dict) rc = tsink_put(c, n, s, o->key_sep, strlen(o->key_sep), false);
            if (!rc) rc = json_val(c, n, v.c->items[i], o, level + 1, s);
        }
        free(order);
        if (!rc && o->indent >= 0) rc = json_indent(c, n, s, o->indent, level);
        return rc ? rc : tsink_put(c, n, s, br + 1, 1, false);
    }
    default: break;
    }
    return tpl_fail(c, n, KVS_ERR_TYPE, "Object of type %s is not JSON serializable", tv_typename(v));
}

int tv_tojson(tctx *c, const node *n, tv v, const tpl_json_opts *o, tsink *s) { return json_val(c, n, v, o, 0, s); }

int tv_from_json(tctx *c, const cJSON *j, int mark, int depth, tv *out) {
    if (depth > 10000) return tpl_fail(c, NULL, KVS_ERR_LIMIT, "input nested too deeply");
    int rc;
    if (cJSON_IsNull(j) || !j) { *out = tv_none(); return 0; }
    if (cJSON_IsBool(j)) { *out = tv_bool(cJSON_IsTrue(j)); return 0; }
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9007199254740992.0) *out = tv_int((int64_t)d);
        else *out = tv_float(d);
        return 0;
    }
    if (cJSON_IsString(j)) {
        const char *s = j->valuestring ? j->valuestring : "";
        if ((rc = tstr_new(c, NULL, s, strlen(s), out))) return rc;
        (void)mark;
        return 0;
    }
    if (cJSON_IsArray(j)) {
        if ((rc = tcont_new(c, NULL, TC_LIST, (size_t)cJSON_GetArraySize(j), out))) return rc;
        for (const cJSON *e = j->child; e; e = e->next) {
            tv x;
            if ((rc = tv_from_json(c, e, mark, depth + 1, &x)) || (rc = tlist_push(c, NULL, out->c, x))) return rc;
        }
        return 0;
    }
    if (cJSON_IsObject(j)) {
        if ((rc = tcont_new(c, NULL, TC_DICT, (size_t)cJSON_GetArraySize(j), out))) return rc;
        for (const cJSON *e = j->child; e; e = e->next) {
            tv x;
            if ((rc = tv_from_json(c, e, mark, depth + 1, &x))) return rc;
            if ((rc = tdict_setc(c, NULL, out->c, e->string ? e->string : "", x))) return rc;
        }
        return 0;
    }
    /* raw values */
    *out = tv_none();
    return 0;
}
