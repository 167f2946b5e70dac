/* tpl_eval.c: compile/render entry points and the interpreter: statements, expressions, scopes, macros. The
 * operations on values (attribute/item access, arithmetic) are in tpl_ops.c. */
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

uint64_t tpl_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The render's wall-clock and cancel budgets (tpl_render_params), looked at every TPL_CHECK_STEPS steps. */
#define TPL_CHECK_STEPS 4096
static int check_budget(tctx *c, const node *n) {
    c->next_check = c->steps + TPL_CHECK_STEPS;
    if (c->p->cancel && atomic_load_explicit(c->p->cancel, memory_order_relaxed))
        return tpl_fail(c, n, KVS_ERR_CLOSED, "render abandoned: its caller went away");
    if (c->deadline_ns && tpl_now_ns() > c->deadline_ns)
        return tpl_fail(c, n, KVS_ERR_LIMIT, "time limit of %u ms reached", (unsigned)c->p->max_ms);
    return 0;
}

int tpl_charge(tctx *c, const node *n, uint64_t units) {
    c->steps = units > UINT64_MAX - c->steps ? UINT64_MAX : c->steps + units;
    if (c->steps > c->t->lim.max_steps)
        return tpl_fail(c, n, KVS_ERR_LIMIT, "step limit of %llu reached", (unsigned long long)c->t->lim.max_steps);
    if (c->steps >= c->next_check && (c->deadline_ns || c->p->cancel)) return check_budget(c, n);
    return 0;
}

int tpl_equal(tctx *c, const node *n, tv a, tv b, bool *res) {
    tv_eqw w = {0};
    *res = tv_equal_w(a, b, &w);
    if (w.deep) return tpl_fail(c, n, KVS_ERR_LIMIT, "values nested deeper than %d compared", TPL_MAX_EVAL_NEST);
    return tpl_charge(c, n, w.work);
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
    case TV_UNDEF: return tpl_undef_err(c, n, fnv);
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
    else if (!blockin) /* a filter block's bare filter reached as a value (`{% filter up.er %}`) */
        return tpl_fail(c, n, KVS_ERR_TYPE, "filter '%s' used without an input", n->name ? n->name : "?");
    else { in = *blockin; tv_incref(in); rc = 0; }
    if (rc) return rc;
    targs a;
    if ((rc = args_eval(c, n, &a))) { tv_decref(c, in); return rc; }
    rc = tpl_filter(c, n, n->name, in, a.pos, a.npos, a.kwn, a.kwv, a.nkw, out);
    args_free(c, &a);
    tv_decref(c, in);
    return rc;
}

/* a call: a method of the object when it has one, else a callable value */
static int eval_call(tctx *c, const node *n, tv *out) {
    int rc;
    tv a, b;
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

/* unary minus / plus */
static int eval_sign(tctx *c, const node *n, tv *out) {
    int rc;
    tv a;
    if ((rc = eval(c, n->a, &a))) return rc;
    if (a.t == TV_INT && n->kind == N_NEG) {
        if (a.i == INT64_MIN) return tpl_fail(c, n, KVS_ERR_LIMIT, "integer overflow");
        *out = tv_int(-a.i);
    } else if (a.t == TV_BOOL) *out = tv_int(n->kind == N_NEG ? -(int64_t)a.b : a.b);
    else if (a.t == TV_FLOAT) *out = tv_float(n->kind == N_NEG ? -a.f : a.f);
    else if (a.t == TV_INT) *out = a;
    else {
        rc = a.t == TV_UNDEF ? tpl_undef_err(c, n, a)
                             : tpl_fail(c, n, KVS_ERR_TYPE, "bad operand type for unary %s: '%s'",
                                        n->kind == N_NEG ? "-" : "+", tv_typename(a));
        tv_decref(c, a);
        return rc;
    }
    return 0;
}

/* a comparison chain a < b <= c ... (stops at the first false link) */
static int eval_compare(tctx *c, const node *n, tv *out) {
    int rc;
    tv a, b;
    if ((rc = eval(c, n->a, &a))) return rc;
    bool res = true;
    for (int i = 0; i < n->nv && res; i++) {
        const node *o = n->v[i];
        if ((rc = eval(c, o->a, &b))) { tv_decref(c, a); return rc; }
        int cmp = 0;
        switch (o->op) {
        case OP_EQ: rc = tpl_equal(c, o, a, b, &res); break;
        case OP_NE: rc = tpl_equal(c, o, a, b, &res); res = !res; break;
        case OP_IN: rc = tpl_contains(c, o, a, b, &res); break;
        case OP_NOTIN: rc = tpl_contains(c, o, a, b, &res); res = !res; break;
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

/* the ~ operator over all operands */
static int eval_concat(tctx *c, const node *n, tv *out) {
    int rc;
    tv a;
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
        if (!rc) rc = tpl_slice(c, n, a, x[0], x[1], x[2], out);
        for (int i = 0; i < 3; i++) tv_decref(c, x[i]);
        tv_decref(c, a);
        return rc;
    }
    case N_CALL:
        return eval_call(c, n, out);
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
        rc = tpl_binop(c, n, n->op, a, b, out);
        tv_decref(c, a);
        tv_decref(c, b);
        return rc;
    case N_NEG: case N_POS:
        return eval_sign(c, n, out);
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
    case N_CMP:
        return eval_compare(c, n, out);
    case N_COND:
        if ((rc = eval(c, n->a, &a))) return rc;
        bool t = tv_truthy(a);
        tv_decref(c, a);
        if (t) return eval(c, n->b, out);
        if (n->c) return eval(c, n->c, out);
        *out = tv_undef(NULL);
        return 0;
    case N_CONCAT:
        return eval_concat(c, n, out);
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
        rc = fnv.t == TV_UNDEF ? tpl_undef_err(c, call, fnv) : tpl_fail(c, call, KVS_ERR_TYPE, "a call block needs a macro");
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
    if (p->max_ms) c.deadline_ns = tpl_now_ns() + (uint64_t)p->max_ms * 1000000ull;
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
