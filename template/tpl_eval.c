/* tpl_eval.c: compile/render entry points and the interpreter: statements, expressions, scopes, macros. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"


void tpl_limits_default(tpl_limits *lim) {
    lim->max_steps = 5000000;
    lim->max_output = 8u << 20;
    lim->max_memory = 256u << 20;
    lim->max_depth = 100;
    lim->max_parse_depth = 200;
}

static void set_err(tpl_error *err, int code, const char *msg, ...) __attribute__((format(printf, 3, 4)));
static void set_err(tpl_error *err, int code, const char *msg, ...) {
    va_list ap;
    va_start(ap, msg);
    tpl_set_error(err, code, 0, 0, msg, ap);
    va_end(ap);
}

int tpl_compile(const char *src, size_t len, const tpl_limits *lim, tpl_template **out, tpl_error *err) {
    if (err) memset(err, 0, sizeof *err);
    if (!out || (!src && len)) { set_err(err, KVS_ERR_INVALID, "no template"); return KVS_ERR_INVALID; }
    *out = NULL;
    tpl_limits l;
    if (lim) l = *lim;
    else tpl_limits_default(&l);
    if (!l.max_steps || !l.max_output || !l.max_memory || l.max_depth < 1 || l.max_depth > 10000 ||
        l.max_parse_depth < 1 || l.max_parse_depth > 10000) {
        set_err(err, KVS_ERR_INVALID, "limits out of range");
        return KVS_ERR_INVALID;
    }
    tpl_template *t = calloc(1, sizeof *t);
    if (!t) { set_err(err, KVS_ERR_NOMEM, "out of memory"); return KVS_ERR_NOMEM; }
    t->lim = l;
    int rc = tpl_parse(t, src ? src : "", len, err);
    if (rc) {
        tpl_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void tpl_free(tpl_template *t) {
    if (!t) return;
    tpl_arena_free(t->arena);
    free(t);
}

void tpl_output_free(tpl_output *o) {
    if (!o) return;
    free(o->text);
    free(o->spans);
    memset(o, 0, sizeof *o);
}

/* ---- scopes ---------------------------------------------------------------------------------------------- */

static int frame_set(tctx *c, const node *n, tframe *f, const char *name, tv v) {
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            tv old = f->vals[i];
            f->vals[i] = v;
            tv_decref(c, old);
            return 0;
        }
    if (f->n == f->cap) {
        size_t nc = f->cap ? f->cap * 2 : 8;
        const char **nn = realloc(f->names, nc * sizeof *nn);
        if (nn) f->names = nn;
        tv *nv = nn ? realloc(f->vals, nc * sizeof *nv) : NULL;
        if (!nv) { tv_decref(c, v); return tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory"); }
        f->vals = nv;
        f->cap = nc;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
    return 0;
}

static void frame_clear(tctx *c, tframe *f) {
    for (size_t i = 0; i < f->n; i++) tv_decref(c, f->vals[i]);
    free(f->names);
    free(f->vals);
    memset(f, 0, sizeof *f);
}

static const struct { const char *name; int fn; } globals_fn[] = {
    {"range", FN_RANGE}, {"namespace", FN_NAMESPACE}, {"raise_exception", FN_RAISE},
    {"strftime_now", FN_STRFTIME}, {"dict", FN_DICT},
};

static tv lookup(tctx *c, tframe *f, const char *name) {
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (!strcmp(f->names[i], name)) return f->vals[i];
    if (c->globals) {
        tv *g = tdict_get(c->globals, name, strlen(name));
        if (g) return *g;
    }
    for (size_t i = 0; i < sizeof globals_fn / sizeof *globals_fn; i++)
        if (!strcmp(globals_fn[i].name, name)) {
            tv v = {.t = TV_FUNC, .sub = (uint8_t)globals_fn[i].fn};
            return v;
        }
    return tv_undef(name);
}

/* ---- helpers --------------------------------------------------------------------------------------------- */

int tpl_step(tctx *c, const node *n) { return tpl_charge(c, n, 1); }

int tpl_charge(tctx *c, const node *n, uint64_t units) {
    c->steps = units > UINT64_MAX - c->steps ? UINT64_MAX : c->steps + units;
    if (c->steps > c->t->lim.max_steps)
        return tpl_fail(c, n, KVS_ERR_LIMIT, "step limit of %llu reached", (unsigned long long)c->t->lim.max_steps);
    return 0;
}

int tpl_equal(tctx *c, const node *n, tv a, tv b, bool *res) {
    tv_eqw w = {0};
    *res = tv_equal_w(a, b, &w);
    if (w.deep) return tpl_fail(c, n, KVS_ERR_LIMIT, "values nested deeper than %d compared", TPL_MAX_EVAL_NEST);
    return tpl_charge(c, n, w.work);
}

static int undef_err(tctx *c, const node *n, tv v) {
    return tpl_fail(c, n, KVS_ERR_TYPE, "'%s' is undefined", v.uname ? v.uname : "value");
}

static int eval(tctx *c, const node *n, tv *out);
static int exec_body(tctx *c, const node *body);

typedef struct targs {
    tv *pos;
    int npos;
    const char **kwn;
    tv *kwv;
    int nkw;
    tv small[8];
    const char *smalln[4];
} targs;

static void args_free(tctx *c, targs *a) {
    for (int i = 0; i < a->npos; i++) tv_decref(c, a->pos[i]);
    for (int i = 0; i < a->nkw; i++) tv_decref(c, a->kwv[i]);
    if (a->pos != a->small) free(a->pos);
    if (a->kwn != a->smalln) {
        free(a->kwn);
        free(a->kwv);
    }
}

static int args_eval(tctx *c, const node *n, targs *a) {
    memset(a, 0, sizeof *a);
    int np = 0, nk = 0;
    for (int i = 0; i < n->nv; i++) {
        if (n->v[i]->kind == N_KW) nk++;
        else np++;
    }
    a->pos = a->small;
    a->kwn = a->smalln;
    a->kwv = a->small + 4;
    if (np > 4) a->pos = malloc((size_t)np * sizeof(tv));
    if (nk > 4) {
        a->kwn = malloc((size_t)nk * sizeof(char *));
        a->kwv = malloc((size_t)nk * sizeof(tv));
    }
    if (!a->pos || !a->kwn || !a->kwv) {
        if (a->pos != a->small) free(a->pos);
        if (a->kwn != a->smalln) { free(a->kwn); free(a->kwv); }
        memset(a, 0, sizeof *a);
        return tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n->nv; i++) {
        const node *x = n->v[i];
        tv v;
        int rc = eval(c, x->kind == N_KW ? x->a : x, &v);
        if (rc) { args_free(c, a); return rc; }
        if (x->kind == N_KW) {
            a->kwn[a->nkw] = x->name;
            a->kwv[a->nkw++] = v;
        } else {
            a->pos[a->npos++] = v;
        }
    }
    return 0;
}

/* ---- attribute / item -------------------------------------------------------------------------------------- */

int tpl_getattr(tctx *c, const node *n, tv obj, const char *name, tv *out) {
    if (obj.t == TV_UNDEF) return undef_err(c, n, obj);
    *out = tv_undef(name);
    if (name[0] == '_') return 0;
    if (obj.t == TV_DICT) {
        tv *v = tdict_get(obj.c, name, strlen(name));
        if (v) { tv_incref(*v); *out = *v; }
        return 0;
    }
    if (obj.t == TV_LOOP) {
        tloop *l = obj.loop;
        if (!strcmp(name, "index")) *out = tv_int(l->index0 + 1);
        else if (!strcmp(name, "index0")) *out = tv_int(l->index0);
        else if (!strcmp(name, "revindex")) *out = tv_int(l->length - l->index0);
        else if (!strcmp(name, "revindex0")) *out = tv_int(l->length - l->index0 - 1);
        else if (!strcmp(name, "first")) *out = tv_bool(l->index0 == 0);
        else if (!strcmp(name, "last")) *out = tv_bool(l->index0 == l->length - 1);
        else if (!strcmp(name, "length")) *out = tv_int(l->length);
        else if (!strcmp(name, "depth")) *out = tv_int(1);
        else if (!strcmp(name, "depth0")) *out = tv_int(0);
        else if (!strcmp(name, "previtem") && l->has_prev) { tv_incref(l->prev); *out = l->prev; }
        else if (!strcmp(name, "nextitem") && l->has_next) { tv_incref(l->next); *out = l->next; }
        return 0;
    }
    return 0;
}

static int64_t py_index(int64_t i, size_t len, bool *ok) {
    if (i < 0) i += (int64_t)len;
    *ok = i >= 0 && (uint64_t)i < len;
    return i;
}

int tpl_getitem(tctx *c, const node *n, tv obj, tv key, tv *out) {
    if (obj.t == TV_UNDEF) return undef_err(c, n, obj);
    *out = tv_undef(NULL);
    if (obj.t == TV_DICT) {
        tv *v = tdict_getv(obj.c, key);
        if (v) { tv_incref(*v); *out = *v; }
        return 0;
    }
    if (obj.t == TV_LOOP && key.t == TV_STR) {
        char nm[32];
        if (key.s->len >= sizeof nm) return 0;
        memcpy(nm, key.s->data, key.s->len + 1);
        int rc = tpl_getattr(c, n, obj, nm, out);
        if (out->t == TV_UNDEF) out->uname = NULL;
        return rc;
    }
    if (key.t != TV_INT && key.t != TV_BOOL) return 0;
    int64_t i = key.t == TV_INT ? key.i : key.b;
    bool ok;
    if (obj.t == TV_LIST && obj.c->kind != TC_GEN) {
        i = py_index(i, obj.c->n, &ok);
        if (ok) { *out = obj.c->items[i]; tv_incref(*out); }
        return 0;
    }
    if (obj.t == TV_STR) {
        size_t len = tpl_u8_len(obj.s->data, obj.s->len);
        i = py_index(i, len, &ok);
        if (!ok) return 0;
        size_t a = tpl_u8_off(obj.s->data, obj.s->len, (size_t)i), b = tpl_u8_off(obj.s->data, obj.s->len, (size_t)i + 1);
        return tstr_sub(c, n, obj.s, a, b - a, out);
    }
    return 0;
}

/* Python slice indices for a sequence of len items. */
static int slice_ix(tctx *c, const node *n, tv lo, tv hi, tv st, size_t len, int64_t *start, int64_t *stop,
                    int64_t *step) {
    int64_t L = (int64_t)len;
    *step = 1;
    if (st.t == TV_INT || st.t == TV_BOOL) *step = st.t == TV_INT ? st.i : st.b;
    else if (st.t != TV_NONE && st.t != TV_UNDEF) return tpl_fail(c, n, KVS_ERR_TYPE, "slice indices must be integers or None");
    if (*step == 0) return tpl_fail(c, n, KVS_ERR_INVALID, "slice step cannot be zero");
    if (*step == INT64_MIN) *step = -INT64_MAX;
    tv b[2] = {lo, hi};
    int64_t r[2];
    for (int k = 0; k < 2; k++) {
        bool dflt = b[k].t == TV_NONE || b[k].t == TV_UNDEF;
        if (!dflt && b[k].t != TV_INT && b[k].t != TV_BOOL)
            return tpl_fail(c, n, KVS_ERR_TYPE, "slice indices must be integers or None");
        if (dflt) r[k] = *step > 0 ? (k ? L : 0) : (k ? -1 : L - 1);
        else {
            int64_t v = b[k].t == TV_INT ? b[k].i : b[k].b;
            if (v < 0) { v = v < -L ? -L - 1 : v; v += L; if (v < 0) v = *step > 0 ? 0 : -1; }
            else if (v >= L) v = *step > 0 ? L : L - 1;
            r[k] = v;
        }
    }
    *start = r[0];
    *stop = r[1];
    return 0;
}

static int do_slice(tctx *c, const node *n, tv obj, tv lo, tv hi, tv st, tv *out) {
    if (obj.t == TV_UNDEF) return undef_err(c, n, obj);
    int64_t a, b, s;
    int rc;
    if (obj.t == TV_LIST && obj.c->kind != TC_GEN) {
        if ((rc = slice_ix(c, n, lo, hi, st, obj.c->n, &a, &b, &s))) return rc;
        if ((rc = tcont_new(c, n, obj.c->kind == TC_TUPLE ? TC_TUPLE : TC_LIST, 0, out))) return rc;
        for (int64_t i = a; s > 0 ? i < b : i > b; i += s) {
            if ((rc = tpl_step(c, n))) return rc;
            tv_incref(obj.c->items[i]);
            if ((rc = tlist_push(c, n, out->c, obj.c->items[i]))) return rc;
            if ((s > 0 && i > INT64_MAX - s) || (s < 0 && i < INT64_MIN - s)) break;
        }
        return 0;
    }
    if (obj.t == TV_STR) {
        const tstr *str = obj.s;
        bool ascii = tpl_is_ascii(str->data, str->len);
        size_t len = ascii ? str->len : tpl_u8_len(str->data, str->len);
        if ((rc = slice_ix(c, n, lo, hi, st, len, &a, &b, &s))) return rc;
        if (s == 1) {
            if (b <= a) return tstr_new(c, n, "", 0, out);
            size_t x = ascii ? (size_t)a : tpl_u8_off(str->data, str->len, (size_t)a);
            size_t y = ascii ? (size_t)b : tpl_u8_off(str->data, str->len, (size_t)b);
            return tstr_sub(c, n, obj.s, x, y - x, out);
        }
        size_t *offs = NULL;
        if (!ascii) {
            offs = malloc((len + 1) * sizeof *offs);
            if (!offs) return tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
            size_t k = 0;
            for (size_t i = 0; i < str->len; i++)
                if (((unsigned char)str->data[i] & 0xC0) != 0x80) offs[k++] = i;
            offs[k] = str->len;
        }
        kvs_buf buf = {0};
        for (int64_t i = a; s > 0 ? i < b : i > b; i += s) {
            if ((rc = tpl_step(c, n))) break;
            size_t x = ascii ? (size_t)i : offs[i], y = ascii ? (size_t)i + 1 : offs[i + 1];
            kvs_buf_append(&buf, str->data + x, y - x);
            if ((s > 0 && i > INT64_MAX - s) || (s < 0 && i < INT64_MIN - s)) break;
        }
        free(offs);
        if (!rc && buf.oom) rc = tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
        if (!rc) rc = tstr_new(c, n, buf.data ? buf.data : "", buf.len, out);
        kvs_buf_free(&buf);
        return rc;
    }
    /* jinja2 compiles slices to Python's own (no getitem fallback to undefined) */
    return tpl_fail(c, n, KVS_ERR_TYPE, "'%s' object is not subscriptable", tv_typename(obj));
}

/* ---- arithmetic ------------------------------------------------------------------------------------------ */

static bool numeric(tv v) { return v.t == TV_INT || v.t == TV_FLOAT || v.t == TV_BOOL; }
static double fv(tv v) { return v.t == TV_FLOAT ? v.f : v.t == TV_INT ? (double)v.i : (double)v.b; }
static int64_t iv(tv v) { return v.t == TV_INT ? v.i : (int64_t)v.b; }

static int concat2(tctx *c, const node *n, tstr *a, tstr *b, tv *out) {
    if (a->len > c->t->lim.max_output || b->len > c->t->lim.max_output - a->len)
        return tpl_fail(c, n, KVS_ERR_LIMIT, "string longer than the output limit of %zu bytes", c->t->lim.max_output);
    tsink s = {0};
    int rc = tsink_putstr(c, n, &s, a);
    if (!rc) rc = tsink_putstr(c, n, &s, b);
    if (!rc) rc = tsink_take(c, n, &s, out);
    tsink_free(&s);
    return rc;
}

static int repeat(tctx *c, const node *n, tv seq, int64_t times, tv *out) {
    if (times < 0) times = 0;
    int rc;
    if (seq.t == TV_STR) {
        if (seq.s->len && (uint64_t)times > c->t->lim.max_output / seq.s->len)
            return tpl_fail(c, n, KVS_ERR_LIMIT, "string longer than the output limit of %zu bytes", c->t->lim.max_output);
        tstr *r = NULL;
        if ((rc = tstr_alloc(c, n, seq.s->len * (size_t)times, &r))) return rc;
        for (int64_t i = 0; i < times; i++) memcpy(r->data + (size_t)i * seq.s->len, seq.s->data, seq.s->len);
        *out = tv_str(r);
        return 0;
    }
    if ((rc = tcont_new(c, n, seq.c->kind, 0, out))) return rc;
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.c->n; k++) {
            if ((rc = tpl_step(c, n))) return rc;
            tv_incref(seq.c->items[k]);
            if ((rc = tlist_push(c, n, out->c, seq.c->items[k]))) return rc;
        }
    return 0;
}

/* Python's printf-style `str % args` for %s %r %d %i %f %x %% (flags, width and precision kept). */
int tpl_str_mod(tctx *c, const node *n, tstr *fmt, tv args, tv *out) {
    tv *av = &args;
    size_t na = 1, ai = 0;
    if (args.t == TV_LIST && args.c->kind == TC_TUPLE) { av = args.c->items; na = args.c->n; }
    kvs_buf b = {0};
    int rc = 0;
    for (size_t i = 0; i < fmt->len && !rc; i++) {
        char ch = fmt->data[i];
        if (ch != '%') { kvs_buf_putc(&b, ch); continue; }
        size_t j = i + 1;
        char spec[32] = "%";
        size_t k = 1;
        long num = 0;
        while (j < fmt->len && strchr("-+ #0123456789.", fmt->data[j]) && k < 20) {
            char d = fmt->data[j];
            num = d >= '0' && d <= '9' ? num * 10 + (d - '0') : 0;
            if (num > 4096) break;   /* widths and precisions stay small: no giant padding */
            spec[k++] = fmt->data[j++];
        }
        if (num > 4096 || k >= 20) { rc = tpl_fail(c, n, KVS_ERR_LIMIT, "format width or precision too large"); break; }
        if (j >= fmt->len) { rc = tpl_fail(c, n, KVS_ERR_INVALID, "incomplete format"); break; }
        char conv = fmt->data[j];
        i = j;
        if (conv == '%') { kvs_buf_putc(&b, '%'); continue; }
        if (ai >= na) { rc = tpl_fail(c, n, KVS_ERR_TYPE, "not enough arguments for format string"); break; }
        tv a = av[ai++];
        if (conv == 's' || conv == 'r') {
            kvs_buf t = {0};
            rc = tv_repr(c, n, a, &t, conv == 'r' ? 1 : 0);
            spec[k++] = 's';
            spec[k] = 0;
            if (!rc) kvs_buf_printf(&b, spec, t.data ? t.data : "");
            kvs_buf_free(&t);
        } else if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
            if (!numeric(a)) { rc = tpl_fail(c, n, KVS_ERR_TYPE, "%%%c format: a number is required", conv); break; }
            spec[k++] = 'l';
            spec[k++] = 'l';
            spec[k++] = conv == 'i' ? 'd' : conv;
            spec[k] = 0;
            kvs_buf_printf(&b, spec, (long long)(a.t == TV_FLOAT ? (int64_t)a.f : iv(a)));
        } else if (conv == 'f' || conv == 'F' || conv == 'e' || conv == 'E' || conv == 'g' || conv == 'G') {
            if (!numeric(a)) { rc = tpl_fail(c, n, KVS_ERR_TYPE, "%%%c format: a number is required", conv); break; }
            spec[k++] = conv;
            spec[k] = 0;
            kvs_buf_printf(&b, spec, fv(a));
        } else {
            rc = tpl_fail(c, n, KVS_ERR_UNSUPPORTED, "unsupported format character '%c'", conv);
        }
        if (b.len > c->t->lim.max_output) rc = tpl_fail(c, n, KVS_ERR_LIMIT, "string too long");
    }
    /* Python: a lone argument that is a mapping (dict, list) may go unused; a str, number or tuple may not */
    if (!rc && ai < na && args.t != TV_DICT && !(args.t == TV_LIST && args.c->kind != TC_TUPLE))
        rc = tpl_fail(c, n, KVS_ERR_TYPE, "not all arguments converted during string formatting");
    if (!rc && b.oom) rc = tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
    if (!rc) rc = tstr_new(c, n, b.data ? b.data : "", b.len, out);
    kvs_buf_free(&b);
    return rc;
}

static int binop(tctx *c, const node *n, int op, tv a, tv b, tv *out) {
    if (a.t == TV_UNDEF) return undef_err(c, n, a);
    if (b.t == TV_UNDEF) return undef_err(c, n, b);
    static const char *sym[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (numeric(a) && numeric(b)) {
        if (a.t != TV_FLOAT && b.t != TV_FLOAT && op != OP_DIV) {
            int64_t x = iv(a), y = iv(b), r = 0;
            bool of = false;
            switch (op) {
            case OP_ADD: of = __builtin_add_overflow(x, y, &r); break;
            case OP_SUB: of = __builtin_sub_overflow(x, y, &r); break;
            case OP_MUL: of = __builtin_mul_overflow(x, y, &r); break;
            case OP_FDIV: case OP_MOD:
                if (y == 0) return tpl_fail(c, n, KVS_ERR_INVALID, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) { of = true; break; }
                r = op == OP_FDIV ? x / y : x % y;
                if (op == OP_FDIV && (x % y != 0) && ((x < 0) != (y < 0))) r--;
                if (op == OP_MOD && r != 0 && ((r < 0) != (y < 0))) r += y;
                break;
            case OP_POW:
                if (y < 0 && x == 0) return tpl_fail(c, n, KVS_ERR_INVALID, "0.0 cannot be raised to a negative power");
                if (y < 0) { *out = tv_float(pow((double)x, (double)y)); return 0; }
                r = 1;
                for (int64_t e = y, base = x; e && !of; e >>= 1) {
                    if (e & 1) of = __builtin_mul_overflow(r, base, &r);
                    if (e > 1 && !of) of = __builtin_mul_overflow(base, base, &base);
                }
                break;
            }
            if (of) return tpl_fail(c, n, KVS_ERR_LIMIT, "integer overflow in '%s'", sym[op]);
            *out = tv_int(r);
            return 0;
        }
        double x = fv(a), y = fv(b), r = 0;
        switch (op) {
        case OP_ADD: r = x + y; break;
        case OP_SUB: r = x - y; break;
        case OP_MUL: r = x * y; break;
        case OP_DIV: if (y == 0) return tpl_fail(c, n, KVS_ERR_INVALID, "division by zero"); r = x / y; break;
        case OP_FDIV: if (y == 0) return tpl_fail(c, n, KVS_ERR_INVALID, "float floor division by zero"); r = floor(x / y); break;
        case OP_MOD:
            if (y == 0) return tpl_fail(c, n, KVS_ERR_INVALID, "float modulo by zero");
            r = fmod(x, y);
            if (r != 0 && ((r < 0) != (y < 0))) r += y;
            break;
        case OP_POW:
            if (x == 0 && y < 0) return tpl_fail(c, n, KVS_ERR_INVALID, "0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y)) return tpl_fail(c, n, KVS_ERR_UNSUPPORTED, "complex results are not supported");
            r = pow(x, y);
            if (isinf(r) && isfinite(x) && isfinite(y)) return tpl_fail(c, n, KVS_ERR_LIMIT, "numerical result out of range");
            break;
        }
        *out = tv_float(r);
        return 0;
    }
    if (op == OP_ADD && a.t == TV_STR && b.t == TV_STR) {
        if (a.s->safe == b.s->safe) {
            int rc = concat2(c, n, a.s, b.s, out);
            if (!rc && a.s->safe) out->s->safe = true;
            return rc;
        }
        /* Markup + str escapes the plain string (both ways round) */
        tv e;
        int rc = tpl_html_escape(c, n, a.s->safe ? b.s : a.s, &e);
        if (rc) return rc;
        rc = a.s->safe ? concat2(c, n, a.s, e.s, out) : concat2(c, n, e.s, b.s, out);
        tv_decref(c, e);
        if (!rc) out->s->safe = true;
        return rc;
    }
    if (op == OP_ADD && a.t == TV_LIST && b.t == TV_LIST && a.c->kind != TC_GEN && b.c->kind != TC_GEN) {
        int rc = tcont_new(c, n, a.c->kind, a.c->n + b.c->n, out);
        for (size_t i = 0; !rc && i < a.c->n + b.c->n; i++) {
            tv x = i < a.c->n ? a.c->items[i] : b.c->items[i - a.c->n];
            tv_incref(x);
            rc = tlist_push(c, n, out->c, x);
        }
        return rc;
    }
    if (op == OP_MUL && (a.t == TV_INT || a.t == TV_BOOL) && (b.t == TV_STR || (b.t == TV_LIST && b.c->kind != TC_GEN)))
        return repeat(c, n, b, iv(a), out);
    if (op == OP_MUL && (b.t == TV_INT || b.t == TV_BOOL) && (a.t == TV_STR || (a.t == TV_LIST && a.c->kind != TC_GEN)))
        return repeat(c, n, a, iv(b), out);
    if (op == OP_MOD && a.t == TV_STR) return tpl_str_mod(c, n, a.s, b, out);
    return tpl_fail(c, n, KVS_ERR_TYPE, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op], tv_typename(a),
                    tv_typename(b));
}

static int contains(tctx *c, const node *n, tv item, tv seq, bool *res) {
    *res = false;
    int rc;
    switch (seq.t) {
    case TV_UNDEF: return 0;
    case TV_STR:
        if (item.t != TV_STR)
            return tpl_fail(c, n, KVS_ERR_TYPE, "'in <string>' requires string as left operand, not %s", tv_typename(item));
        if (!item.s->len) { *res = true; return 0; }
        if ((rc = tpl_charge(c, n, seq.s->len / TPL_BYTES_PER_STEP))) return rc;
        *res = item.s->len <= seq.s->len && memmem(seq.s->data, seq.s->len, item.s->data, item.s->len) != NULL;
        return 0;
    case TV_LIST:
        for (size_t i = 0; i < seq.c->n && !*res; i++)
            if ((rc = tpl_equal(c, n, seq.c->items[i], item, res))) return rc;
        return tpl_charge(c, n, seq.c->n);
    case TV_DICT:
        if (seq.c->kind == TC_NS) break;
        if (!tv_hashable(item)) return tpl_fail(c, n, KVS_ERR_TYPE, "unhashable type: '%s'", tv_typename(item));
        *res = tdict_getv(seq.c, item) != NULL;
        return 0;
    default: break;
    }
    return tpl_fail(c, n, KVS_ERR_TYPE, "argument of type '%s' is not iterable", tv_typename(seq));
}

/* ---- macros ------------------------------------------------------------------------------------------------ */

int tpl_call_macro(tctx *c, const node *n, const node *m, tframe *scope, tv *args, int nargs, const char **kwn, tv *kwv,
                   int nkw, tv *out) {
    if (c->depth >= c->t->lim.max_depth)
        return tpl_fail(c, n, KVS_ERR_LIMIT, "macro calls nested deeper than %d", c->t->lim.max_depth);
    if (nargs > m->nnames)
        return tpl_fail(c, n, KVS_ERR_TYPE, "macro '%s' takes not more than %d argument(s)", m->name, m->nnames);
    for (int k = 0; k < nkw; k++) {
        int p = 0;
        while (p < m->nnames && strcmp(m->names[p], kwn[k])) p++;
        if (p == m->nnames && !strcmp(kwn[k], "caller")) continue;   /* from a call block */
        if (p == m->nnames) return tpl_fail(c, n, KVS_ERR_TYPE, "macro '%s' takes no keyword argument '%s'", m->name, kwn[k]);
        if (p < nargs) return tpl_fail(c, n, KVS_ERR_TYPE, "macro '%s' got multiple values for argument '%s'", m->name, kwn[k]);
    }
    tframe f = {.parent = scope};
    tframe *saved_frame = c->frame;
    tsink *saved_out = c->out;
    tsink sink = {0};
    int saved_brk = c->brk;
    c->frame = &f;
    c->depth++;
    int rc = 0;
    for (int p = 0; p < m->nnames && !rc; p++) {
        tv v = tv_undef(m->names[p]);
        bool have = false;
        if (p < nargs) { v = args[p]; tv_incref(v); have = true; }
        for (int k = 0; k < nkw && !have; k++)
            if (!strcmp(m->names[p], kwn[k])) { v = kwv[k]; tv_incref(v); have = true; }
        if (!have && m->d->v[p]) rc = eval(c, m->d->v[p], &v);
        if (!rc) rc = frame_set(c, n, &f, m->names[p], v);
    }
    for (int k = 0; k < nkw && !rc; k++)
        if (!strcmp(kwn[k], "caller")) {
            tv_incref(kwv[k]);
            rc = frame_set(c, n, &f, "caller", kwv[k]);
        }
    c->out = &sink;
    c->brk = 0;
    if (!rc) rc = exec_body(c, m->c);
    c->brk = saved_brk;
    c->out = saved_out;
    c->depth--;
    c->frame = saved_frame;
    frame_clear(c, &f);
    if (!rc) rc = tsink_take(c, n, &sink, out);
    tsink_free(&sink);
    return rc;
}

static int call_value(tctx *c, const node *n, tv fnv, targs *a, tv *out) {
    switch (fnv.t) {
    case TV_FUNC: return tpl_call_global(c, n, fnv.sub, a->pos, a->npos, a->kwn, a->kwv, a->nkw, out);
    case TV_MACRO: return tpl_call_macro(c, n, fnv.m, c->root, a->pos, a->npos, a->kwn, a->kwv, a->nkw, out);
    case TV_CALLER:
        if (!fnv.cl->frame) return tpl_fail(c, n, KVS_ERR_STATE, "caller used after its call block ended");
        return tpl_call_macro(c, n, fnv.cl->m, fnv.cl->frame, a->pos, a->npos, a->kwn, a->kwv, a->nkw, out);
    case TV_UNDEF: return undef_err(c, n, fnv);
    default: return tpl_fail(c, n, KVS_ERR_TYPE, "'%s' object is not callable", tv_typename(fnv));
    }
}

/* ---- expressions ------------------------------------------------------------------------------------------- */

/* evaluates a filter chain whose innermost input is `in` (filter blocks, set blocks) or its own a */
static int eval_filter(tctx *c, const node *n, const tv *blockin, tv *out) {
    tv in;
    int rc;
    if (n->kind != N_FILTER) return eval(c, n, out);
    if (n->a) rc = n->a->kind == N_FILTER ? eval_filter(c, n->a, blockin, &in) : eval(c, n->a, &in);
    else { in = *blockin; tv_incref(in); rc = 0; }
    if (rc) return rc;
    targs a;
    if ((rc = args_eval(c, n, &a))) { tv_decref(c, in); return rc; }
    rc = tpl_filter(c, n, n->name, in, a.pos, a.npos, a.kwn, a.kwv, a.nkw, out);
    args_free(c, &a);
    tv_decref(c, in);
    return rc;
}

static int eval_inner(tctx *c, const node *n, tv *out) {
    int rc;
    tv a, b;
    switch (n->kind) {
    case N_CONST:
        *out = n->k;
        tv_incref(*out);
        return 0;
    case N_NAME:
        *out = lookup(c, c->frame, n->name);
        tv_incref(*out);
        return 0;
    case N_LIST: case N_TUPLE:
        if ((rc = tcont_new(c, n, n->kind == N_LIST ? TC_LIST : TC_TUPLE, (size_t)n->nv, out))) return rc;
        for (int i = 0; i < n->nv; i++)
            if ((rc = eval(c, n->v[i], &a)) || (rc = tlist_push(c, n, out->c, a))) return rc;
        return 0;
    case N_DICT:
        if ((rc = tcont_new(c, n, TC_DICT, (size_t)n->nv / 2, out))) return rc;
        for (int i = 0; i + 1 < n->nv; i += 2) {
            if ((rc = eval(c, n->v[i], &a))) return rc;
            if ((rc = eval(c, n->v[i + 1], &b))) { tv_decref(c, a); return rc; }
            rc = tdict_set(c, n, out->c, a, b);
            tv_decref(c, a);
            if (rc) return rc;
        }
        return 0;
    case N_ATTR:
        if ((rc = eval(c, n->a, &a))) return rc;
        rc = tpl_getattr(c, n, a, n->name, out);
        tv_decref(c, a);
        return rc;
    case N_ITEM:
        if ((rc = eval(c, n->a, &a))) return rc;
        if ((rc = eval(c, n->b, &b))) { tv_decref(c, a); return rc; }
        rc = tpl_getitem(c, n, a, b, out);
        tv_decref(c, a);
        tv_decref(c, b);
        return rc;
    case N_SLICE: {
        tv x[3] = {tv_none(), tv_none(), tv_none()};
        const node *xs[3] = {n->b, n->c, n->d};
        if ((rc = eval(c, n->a, &a))) return rc;
        for (int i = 0; i < 3 && !rc; i++)
            if (xs[i]) rc = eval(c, xs[i], &x[i]);
        if (!rc) rc = do_slice(c, n, a, x[0], x[1], x[2], out);
        for (int i = 0; i < 3; i++) tv_decref(c, x[i]);
        tv_decref(c, a);
        return rc;
    }
    case N_CALL: {
        targs args;
        if (n->a->kind == N_ATTR) {
            if ((rc = eval(c, n->a->a, &a))) return rc;
            if (tpl_has_method(a, n->a->name)) {
                if ((rc = args_eval(c, n, &args))) { tv_decref(c, a); return rc; }
                rc = tpl_method(c, n, a, n->a->name, args.pos, args.npos, args.kwn, args.kwv, args.nkw, out);
                args_free(c, &args);
                tv_decref(c, a);
                return rc;
            }
            rc = tpl_getattr(c, n->a, a, n->a->name, &b);
            tv_decref(c, a);
            if (rc) return rc;
        } else if ((rc = eval(c, n->a, &b))) {
            return rc;
        }
        if ((rc = args_eval(c, n, &args))) { tv_decref(c, b); return rc; }
        rc = call_value(c, n, b, &args, out);
        args_free(c, &args);
        tv_decref(c, b);
        return rc;
    }
    case N_FILTER:
        return eval_filter(c, n, NULL, out);
    case N_TEST: {
        if ((rc = eval(c, n->a, &a))) return rc;
        targs args;
        if ((rc = args_eval(c, n, &args))) { tv_decref(c, a); return rc; }
        bool r = false;
        rc = tpl_test(c, n, n->name, a, args.pos, args.npos, &r);
        args_free(c, &args);
        tv_decref(c, a);
        *out = tv_bool(n->op ? !r : r);
        return rc;
    }
    case N_BIN:
        if ((rc = eval(c, n->a, &a))) return rc;
        if ((rc = eval(c, n->b, &b))) { tv_decref(c, a); return rc; }
        rc = binop(c, n, n->op, a, b, out);
        tv_decref(c, a);
        tv_decref(c, b);
        return rc;
    case N_NEG: case N_POS:
        if ((rc = eval(c, n->a, &a))) return rc;
        if (a.t == TV_INT && n->kind == N_NEG) {
            if (a.i == INT64_MIN) return tpl_fail(c, n, KVS_ERR_LIMIT, "integer overflow");
            *out = tv_int(-a.i);
        } else if (a.t == TV_BOOL) *out = tv_int(n->kind == N_NEG ? -(int64_t)a.b : a.b);
        else if (a.t == TV_FLOAT) *out = tv_float(n->kind == N_NEG ? -a.f : a.f);
        else if (a.t == TV_INT) *out = a;
        else {
            rc = a.t == TV_UNDEF ? undef_err(c, n, a)
                                 : tpl_fail(c, n, KVS_ERR_TYPE, "bad operand type for unary %s: '%s'",
                                            n->kind == N_NEG ? "-" : "+", tv_typename(a));
            tv_decref(c, a);
            return rc;
        }
        return 0;
    case N_NOT:
        if ((rc = eval(c, n->a, &a))) return rc;
        *out = tv_bool(!tv_truthy(a));
        tv_decref(c, a);
        return 0;
    case N_AND: case N_OR:
        if ((rc = eval(c, n->a, &a))) return rc;
        if (tv_truthy(a) == (n->kind == N_OR)) { *out = a; return 0; }
        tv_decref(c, a);
        return eval(c, n->b, out);
    case N_CMP: {
        if ((rc = eval(c, n->a, &a))) return rc;
        bool res = true;
        for (int i = 0; i < n->nv && res; i++) {
            const node *o = n->v[i];
            if ((rc = eval(c, o->a, &b))) { tv_decref(c, a); return rc; }
            int cmp = 0;
            switch (o->op) {
            case OP_EQ: rc = tpl_equal(c, o, a, b, &res); break;
            case OP_NE: rc = tpl_equal(c, o, a, b, &res); res = !res; break;
            case OP_IN: rc = contains(c, o, a, b, &res); break;
            case OP_NOTIN: rc = contains(c, o, a, b, &res); res = !res; break;
            default:
                rc = tv_compare(c, o, a, b, &cmp);
                res = o->op == OP_LT ? cmp < 0 : o->op == OP_LE ? cmp <= 0 : o->op == OP_GT ? cmp > 0 : cmp >= 0;
            }
            tv_decref(c, a);
            a = b;
            if (rc) { tv_decref(c, a); return rc; }
        }
        tv_decref(c, a);
        *out = tv_bool(res);
        return 0;
    }
    case N_COND:
        if ((rc = eval(c, n->a, &a))) return rc;
        bool t = tv_truthy(a);
        tv_decref(c, a);
        if (t) return eval(c, n->b, out);
        if (n->c) return eval(c, n->c, out);
        *out = tv_undef(NULL);
        return 0;
    case N_CONCAT: {
        tsink s = {0};
        rc = 0;
        for (int i = 0; i < n->nv && !rc; i++) {
            if ((rc = eval(c, n->v[i], &a))) break;
            rc = tv_print(c, n, a, &s);
            tv_decref(c, a);
        }
        if (!rc) rc = tsink_take(c, n, &s, out);
        tsink_free(&s);
        return rc;
    }
    default:
        return tpl_fail(c, n, KVS_ERR_INVALID, "internal: not an expression");
    }
}

static int eval(tctx *c, const node *n, tv *out) {
    *out = tv_undef(NULL);
    int rc = tpl_step(c, n);
    if (rc) return rc;
    if (++c->nest > TPL_MAX_EVAL_NEST) {
        c->nest--;
        return tpl_fail(c, n, KVS_ERR_LIMIT, "evaluation nested deeper than %d", TPL_MAX_EVAL_NEST);
    }
    rc = eval_inner(c, n, out);
    c->nest--;
    if (rc) {
        tv_decref(c, *out);
        *out = tv_undef(NULL);
    }
    return rc;
}

/* ---- statements ------------------------------------------------------------------------------------------- */

static int assign(tctx *c, const node *n, tframe *f, const char **names, int nnames, tv v) {
    if (nnames == 1) return frame_set(c, n, f, names[0], v);
    int rc = 0;
    tv list = v;
    if (v.t != TV_LIST || v.c->kind == TC_GEN) {
        if ((rc = tpl_iter_list(c, n, v, &list))) { tv_decref(c, v); return rc; }
        tv_decref(c, v);
    }
    if (list.c->n != (size_t)nnames) {
        rc = tpl_fail(c, n, KVS_ERR_INVALID, "cannot unpack %zu values into %d names", list.c->n, nnames);
    } else {
        for (int i = 0; i < nnames && !rc; i++) {
            tv_incref(list.c->items[i]);
            rc = frame_set(c, n, f, names[i], list.c->items[i]);
        }
    }
    tv_decref(c, list);
    return rc;
}

/* renders a block body (set block, filter block, generation) into a string, in a scope of its own as jinja2
 * does: what the body sets stays inside */
static int render_body(tctx *c, const node *body, tv *out) {
    tsink sink = {0};
    tsink *saved = c->out;
    tframe f = {.parent = c->frame}, *saved_frame = c->frame;
    c->out = &sink;
    c->frame = &f;
    int rc = exec_body(c, body);
    c->frame = saved_frame;
    frame_clear(c, &f);
    c->out = saved;
    if (!rc) rc = tsink_take(c, body, &sink, out);
    tsink_free(&sink);
    return rc;
}

static int exec_for(tctx *c, const node *n) {
    tv seq, items;
    int rc = eval(c, n->a, &seq);
    if (rc) return rc;
    rc = tpl_iter_list(c, n->a, seq, &items);
    tv_decref(c, seq);
    if (rc) return rc;
    tframe f = {.parent = c->frame};
    tframe *saved = c->frame;
    c->frame = &f;
    if (n->b) {   /* the loop filter, evaluated with the targets bound */
        tv kept;
        if (!(rc = tcont_new(c, n, TC_LIST, 0, &kept))) {
            for (size_t i = 0; i < items.c->n && !rc; i++) {
                tv x = items.c->items[i], cond;
                tv_incref(x);
                if ((rc = assign(c, n, &f, n->names, n->nnames, x))) break;
                if ((rc = eval(c, n->b, &cond))) break;
                bool keep = tv_truthy(cond);
                tv_decref(c, cond);
                if (keep) {
                    tv_incref(x);
                    rc = tlist_push(c, n, kept.c, x);
                }
            }
            tv_decref(c, items);
            items = kept;
        }
    }
    tloop *lp = NULL;
    if (!rc) {
        if (!(rc = tpl_mem(c, n, sizeof(tloop)))) {
            lp = calloc(1, sizeof *lp);
            if (!lp) { tpl_unmem(c, sizeof(tloop)); rc = tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory"); }
        }
    }
    if (lp) {
        lp->rc = 1;
        lp->length = (int64_t)items.c->n;
        lp->prev = lp->next = tv_undef(NULL);
        tv lv = {.t = TV_LOOP};
        lv.loop = lp;
        for (size_t i = 0; i < items.c->n && !rc; i++) {
            if ((rc = tpl_step(c, n))) break;
            /* each iteration starts from a fresh scope: what the body set last time is gone (jinja2) */
            for (size_t k = 0; k < f.n; k++) tv_decref(c, f.vals[k]);
            f.n = 0;
            tv x = items.c->items[i];
            tv_incref(x);
            if ((rc = assign(c, n, &f, n->names, n->nnames, x))) break;
            lp->index0 = (int64_t)i;
            tv_decref(c, lp->prev);
            tv_decref(c, lp->next);
            lp->has_prev = i > 0;
            lp->has_next = i + 1 < items.c->n;
            lp->prev = lp->has_prev ? items.c->items[i - 1] : tv_undef(NULL);
            lp->next = lp->has_next ? items.c->items[i + 1] : tv_undef(NULL);
            tv_incref(lp->prev);
            tv_incref(lp->next);
            tv_incref(lv);
            if ((rc = frame_set(c, n, &f, "loop", lv))) break;
            rc = exec_body(c, n->v ? n : NULL);
            if (c->brk == 1) { c->brk = 0; break; }
            c->brk = 0;
        }
        bool empty = items.c->n == 0;
        tv_decref(c, lv);
        if (!rc && empty && n->c) {
            c->frame = saved;
            rc = exec_body(c, n->c);
        }
    }
    c->frame = saved;
    frame_clear(c, &f);
    tv_decref(c, items);
    return rc;
}

/* {% call m(args) %}body{% endcall %}: m(args, caller=<the body>), printed */
static int exec_callblock(tctx *c, const node *n) {
    const node *call = n->a;
    tv fnv, res;
    int rc = eval(c, call->a, &fnv);
    if (rc) return rc;
    if (fnv.t != TV_MACRO) {
        rc = fnv.t == TV_UNDEF ? undef_err(c, call, fnv) : tpl_fail(c, call, KVS_ERR_TYPE, "a call block needs a macro");
        tv_decref(c, fnv);
        return rc;
    }
    targs a;
    if ((rc = args_eval(c, call, &a))) return rc;
    tcaller *cl = NULL;
    if (!(rc = tpl_mem(c, n, sizeof *cl)) && !(cl = calloc(1, sizeof *cl))) {
        tpl_unmem(c, sizeof *cl);
        rc = tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
    }
    if (!rc) {
        cl->rc = 1;
        cl->m = n->d;
        cl->frame = c->frame;
        tv cv = {.t = TV_CALLER};
        cv.cl = cl;
        /* the arguments plus caller= */
        int nk = a.nkw + 1;
        const char **kwn = malloc((size_t)nk * sizeof *kwn);
        tv *kwv = malloc((size_t)nk * sizeof *kwv);
        if (!kwn || !kwv) rc = tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
        else {
            for (int k = 0; k < a.nkw; k++) { kwn[k] = a.kwn[k]; kwv[k] = a.kwv[k]; }
            kwn[a.nkw] = "caller";
            kwv[a.nkw] = cv;
            rc = tpl_call_macro(c, call, fnv.m, c->root, a.pos, a.npos, kwn, kwv, nk, &res);
        }
        free(kwn);
        free(kwv);
        cl->frame = NULL;   /* copies kept past the block fail when called */
        tv_decref(c, cv);
        if (!rc) {
            rc = tv_print(c, n, res, c->out);
            tv_decref(c, res);
        }
    }
    args_free(c, &a);
    return rc;
}

static int exec_stmt(tctx *c, const node *n) {
    int rc = tpl_step(c, n);
    if (rc) return rc;
    tv v;
    switch (n->kind) {
    case N_TEXT:
        return tsink_putstr(c, n, c->out, n->k.s);
    case N_OUT:
        if ((rc = eval(c, n->a, &v))) return rc;
        rc = tv_print(c, n, v, c->out);
        tv_decref(c, v);
        return rc;
    case N_IF:
        for (const node *b = n; b;) {
            if (b->kind != N_IF) return exec_body(c, b);
            if ((rc = eval(c, b->a, &v))) return rc;
            bool t = tv_truthy(v);
            tv_decref(c, v);
            if (t) return exec_body(c, b->b);
            b = b->c;
        }
        return 0;
    case N_FOR:
        return exec_for(c, n);
    case N_SET:
        if ((rc = eval(c, n->a, &v))) return rc;
        if (n->b) {
            tv ns = lookup(c, c->frame, n->b->name);
            if (ns.t != TV_DICT || ns.c->kind != TC_NS) {
                tv_decref(c, v);
                return tpl_fail(c, n, KVS_ERR_TYPE, "cannot assign attribute on non-namespace object");
            }
            return tdict_setc(c, n, ns.c, n->name, v);
        }
        return assign(c, n, c->frame, n->names, n->nnames, v);
    case N_SETBLOCK:
        if ((rc = render_body(c, n->c, &v))) return rc;
        if (n->a) {
            tv f;
            rc = eval_filter(c, n->a, &v, &f);
            tv_decref(c, v);
            if (rc) return rc;
            v = f;
        }
        return frame_set(c, n, c->frame, n->names[0], v);
    case N_MACRO: {
        tv m = {.t = TV_MACRO};
        m.m = n;
        return frame_set(c, n, c->frame, n->name, m);
    }
    case N_FILTERBLOCK: {
        if ((rc = render_body(c, n->c, &v))) return rc;
        tv f = v;
        if (n->a) {   /* a generation block has no filter */
            rc = eval_filter(c, n->a, &v, &f);
            tv_decref(c, v);
            if (rc) return rc;
        }
        rc = tv_print(c, n, f, c->out);
        tv_decref(c, f);
        return rc;
    }
    case N_CALLBLOCK:
        return exec_callblock(c, n);
    case N_BODY:
        return exec_body(c, n);
    case N_BREAK:
        c->brk = 1;
        return 0;
    case N_CONTINUE:
        c->brk = 2;
        return 0;
    default:
        return tpl_fail(c, n, KVS_ERR_INVALID, "internal: not a statement");
    }
}

static int exec_body(tctx *c, const node *body) {
    if (!body) return 0;
    if (++c->nest > TPL_MAX_EVAL_NEST) {
        c->nest--;
        return tpl_fail(c, body, KVS_ERR_LIMIT, "evaluation nested deeper than %d", TPL_MAX_EVAL_NEST);
    }
    int rc = 0;
    for (int i = 0; i < body->nv && !rc && !c->brk; i++) rc = exec_stmt(c, body->v[i]);
    c->nest--;
    return rc;
}

/* ---- render ------------------------------------------------------------------------------------------------ */

static void mark_str(tctx *c, tv *v) {
    if (v->t != TV_STR || !v->s->len || v->s->nspans || v->s->rc < 0) return;
    tpl_span *sp = malloc(sizeof *sp);
    if (!sp || tpl_mem(c, NULL, sizeof *sp)) { free(sp); return; }
    sp->off = 0;
    sp->len = v->s->len;
    v->s->spans = sp;
    v->s->nspans = 1;
}

static void mark_messages(tctx *c, tv msgs) {
    if (msgs.t != TV_LIST) return;
    for (size_t i = 0; i < msgs.c->n; i++) {
        tv m = msgs.c->items[i];
        if (m.t != TV_DICT) continue;
        tv *x = tdict_get(m.c, "content", 7);
        if (x && x->t == TV_STR) mark_str(c, x);
        else if (x && x->t == TV_LIST)
            for (size_t k = 0; k < x->c->n; k++)
                if (x->c->items[k].t == TV_DICT) {
                    tv *t = tdict_get(x->c->items[k].c, "text", 4);
                    if (t) mark_str(c, t);
                }
        x = tdict_get(m.c, "reasoning_content", 17);
        if (x) mark_str(c, x);
    }
}

int tpl_render(const tpl_template *t, const tpl_render_params *p, tpl_output *out, tpl_error *err) {
    if (err) memset(err, 0, sizeof *err);
    if (out) memset(out, 0, sizeof *out);
    if (!t || !out) { set_err(err, KVS_ERR_INVALID, "no template or output"); return KVS_ERR_INVALID; }
    tpl_render_params dflt = {0};
    if (!p) p = &dflt;
    if (p->vars && !cJSON_IsObject(p->vars)) {
        set_err(err, KVS_ERR_INVALID, "the variables must be a JSON object");
        return KVS_ERR_INVALID;
    }
    tctx c = {.t = t, .p = p, .err = err};
    if (p->now) c.now = *p->now;
    else {
        time_t now = time(NULL);
        localtime_r(&now, &c.now);
    }
    tframe root = {0};
    tsink sink = {0};
    c.root = &root;
    c.frame = &root;
    c.out = &sink;
    int rc = 0;
    tv g = tv_none();
    if (p->vars) {
        rc = tv_from_json(&c, p->vars, 0, 0, &g);
        if (!rc) {
            c.globals = g.c;
            if (p->mark_content) {
                tv *m = tdict_get(g.c, "messages", 8);
                if (m) mark_messages(&c, *m);
            }
        }
    }
    for (int i = 0; i < t->n_root_undef && !rc; i++) rc = frame_set(&c, NULL, &root, t->root_undef[i], tv_undef(t->root_undef[i]));
    if (!rc) rc = exec_body(&c, t->root);
    frame_clear(&c, &root);
    tv_decref(&c, g);
    tctx_free_all(&c);
    if (!rc) {
        out->len = sink.buf.len;
        out->text = kvs_buf_take(&sink.buf);
        if (!out->text) rc = tpl_fail(&c, NULL, KVS_ERR_NOMEM, "out of memory");
        out->spans = sink.spans;
        out->n_spans = sink.nspans;
        sink.spans = NULL;
        if (rc) tpl_output_free(out);
    }
    tsink_free(&sink);
    return rc;
}
