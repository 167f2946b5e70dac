/* tpl_ops.c: the operations on values used by the interpreter (moved out of tpl_eval.c): attribute and item
 * access, slicing, arithmetic and comparison operators, %-formatting and membership. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

/* ---- attribute / item -------------------------------------------------------------------------------------- */

int tpl_getattr(tctx *c, const node *n, tv obj, const char *name, tv *out) {
    if (obj.t == TV_UNDEF) return tpl_undef_err(c, n, obj);
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
    if (obj.t == TV_UNDEF) return tpl_undef_err(c, n, obj);
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

int tpl_slice(tctx *c, const node *n, tv obj, tv lo, tv hi, tv st, tv *out) {
    if (obj.t == TV_UNDEF) return tpl_undef_err(c, n, obj);
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
    /* an empty string or list repeated is empty at once (as in Python): the loops below would otherwise spin
     * `times` rounds of no work ('' * 1000000000 took 23 s; libFuzzer found it) */
    if (seq.t == TV_STR ? seq.s->len == 0 : seq.c->n == 0) times = 0;
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

int tpl_binop(tctx *c, const node *n, int op, tv a, tv b, tv *out) {
    if (a.t == TV_UNDEF) return tpl_undef_err(c, n, a);
    if (b.t == TV_UNDEF) return tpl_undef_err(c, n, b);
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

int tpl_contains(tctx *c, const node *n, tv item, tv seq, bool *res) {
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
