/* tpl_parse.c: tokens to syntax tree (the lexer is in tpl_lex.c). The parser is recursive descent with jinja2's
 * operator precedence, bounded by max_parse_depth.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

/* ---- parser ---------------------------------------------------------------------------------------------- */

static tok *cur(parser *p) { return &p->toks[p->pos]; }
static tok *peekt(parser *p, size_t k) { return &p->toks[p->pos + k < p->ntok ? p->pos + k : p->ntok - 1]; }
static void next(parser *p) { if (p->pos + 1 < p->ntok) p->pos++; }

static bool is_op(const tok *t, const char *op) {
    return t->type == T_OP && t->len == strlen(op) && !memcmp(t->s, op, t->len);
}
static bool is_name(const tok *t, const char *nm) {
    return t->type == T_NAME && t->len == strlen(nm) && !memcmp(t->s, nm, t->len);
}
static bool skip_op(parser *p, const char *op) {
    if (!is_op(cur(p), op)) return false;
    next(p);
    return true;
}
static bool skip_name(parser *p, const char *nm) {
    if (!is_name(cur(p), nm)) return false;
    next(p);
    return true;
}

static const char *tokdesc(const tok *t, char *buf, size_t cap) {
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_VAR_END: return "end of print statement";
    case T_BLOCK_END: return "end of statement block";
    case T_STRING: return "string";
    case T_INT: case T_FLOAT: return "number";
    default:
        snprintf(buf, cap, "'%.*s'", (int)(t->len < 40 ? t->len : 40), t->s);
        return buf;
    }
}

static int expect_op(parser *p, const char *op) {
    if (skip_op(p, op)) return 0;
    char b[64];
    return tpl_perr(p, cur(p)->line, cur(p)->col, KVS_ERR_SYNTAX, "expected '%s', got %s", op, tokdesc(cur(p), b, sizeof b));
}

static node *mk_at(parser *p, int kind, int line, int col) {
    node *n = tpl_palloc(p, sizeof *n);
    if (!n) return NULL;
    n->kind = (uint8_t)kind;
    n->line = line;
    n->col = col;
    return n;
}
#define mk(p, kind, at) mk_at((p), (kind), (at)->line, (at)->col)

typedef struct nvec {
    node **v;
    int n, cap;
} nvec;

static int nv_push(parser *p, nvec *v, node *x) {
    if (v->n == v->cap) {
        int nc = v->cap ? v->cap * 2 : 4;
        node **nn = tpl_palloc(p, (size_t)nc * sizeof *nn);
        if (!nn) return p->code;
        if (v->n) memcpy(nn, v->v, (size_t)v->n * sizeof *nn);
        v->v = nn;
        v->cap = nc;
    }
    v->v[v->n++] = x;
    return 0;
}

static const char *tokname(parser *p, const tok *t) { return tpl_pstrdup(p, t->s, t->len); }

static tstr *static_str(parser *p, const char *s, size_t len) {
    tstr *r = tpl_palloc(p, sizeof *r + len + 1);
    if (!r) return NULL;
    r->rc = -1;
    r->len = len;
    memcpy(r->data, s, len);
    return r;
}

static node *parse_expr(parser *p);
static node *parse_or(parser *p);
static node *parse_unary(parser *p, bool with_filter);
static node *parse_primary(parser *p);
static node *parse_postfix(parser *p, node *n);
static node *parse_filters(parser *p, node *n);

static int enter(parser *p) {
    if (++p->depth > p->t->lim.max_parse_depth)
        return tpl_perr(p, cur(p)->line, cur(p)->col, KVS_ERR_LIMIT, "nesting deeper than %d", p->t->lim.max_parse_depth);
    return 0;
}

/* call arguments after '(' up to ')': positional first, then name=value */
static int parse_args(parser *p, node *call) {
    nvec v = {0};
    bool kw_seen = false;
    while (!is_op(cur(p), ")")) {
        if (v.n) {
            if (expect_op(p, ",")) return p->code;
            if (is_op(cur(p), ")")) break;
        }
        tok *t = cur(p);
        node *a;
        if (t->type == T_NAME && is_op(peekt(p, 1), "=")) {
            a = mk(p, N_KW, t);
            if (!a) return p->code;
            a->name = tokname(p, t);
            next(p);
            next(p);
            a->a = parse_expr(p);
            if (!a->a) return p->code;
            kw_seen = true;
        } else {
            if (is_op(t, "*") || is_op(t, "**"))
                return tpl_perr(p, t->line, t->col, KVS_ERR_UNSUPPORTED, "*args and **kwargs are not supported");
            if (kw_seen) return tpl_perr(p, t->line, t->col, KVS_ERR_SYNTAX, "positional argument after keyword argument");
            a = parse_expr(p);
            if (!a) return p->code;
        }
        if (nv_push(p, &v, a)) return p->code;
    }
    next(p);
    call->v = v.v;
    call->nv = v.n;
    return 0;
}

/* Chains (a.b.c, x|f|g, 1+2+3) nest the tree one level per link: each link counts against max_parse_depth, so
 * that evaluating the tree recurses no deeper than the parser allowed. */
#define LINK(p, wraps) do { if (enter(p)) return NULL; (wraps)++; } while (0)

/* `name` or `name(args)` at the current token: a filter applied to `input` */
static node *parse_one_filter(parser *p, node *input) {
    tok *nt = cur(p);
    if (nt->type != T_NAME) {
        tpl_perr(p, nt->line, nt->col, KVS_ERR_SYNTAX, "expected a filter name");
        return NULL;
    }
    node *f = mk(p, N_FILTER, nt);
    if (!f) return NULL;
    f->name = tokname(p, nt);
    next(p);
    /* dotted filter names are jinja2 syntax but never used by templates */
    if (skip_op(p, "(") && parse_args(p, f)) return NULL;
    f->a = input;
    return f;
}

/* The links after a primary: `.name`, `[index]`, `[a:b:c]` and calls; with `filters`, then also `| filter(args)`
 * and `is [not] test args` (after which, as in jinja2, only more filters, tests and calls may follow). */
static node *parse_chain(parser *p, node *n, bool filters) {
    int wraps = 0;
    bool filtered = false;
    for (;;) {
        tok *t = cur(p);
        bool sub = !filtered && (is_op(t, ".") || is_op(t, "["));
        bool filt = filters && (is_op(t, "|") || is_name(t, "is"));
        if (!sub && !filt && !is_op(t, "(")) break;
        LINK(p, wraps);
        if (sub && is_op(t, ".")) {
            next(p);
            tok *nt = cur(p);
            node *a = mk(p, N_ATTR, t);
            if (!a) return NULL;
            a->a = n;
            if (nt->type == T_NAME) a->name = tokname(p, nt);
            else if (nt->type == T_INT) {   /* x.0 is x[0] */
                a->kind = N_ITEM;
                a->b = mk(p, N_CONST, nt);
                if (!a->b) return NULL;
                a->b->k = tv_int(nt->iv);
            } else {
                char b[64];
                tpl_perr(p, nt->line, nt->col, KVS_ERR_SYNTAX, "expected a name after '.', got %s", tokdesc(nt, b, sizeof b));
                return NULL;
            }
            next(p);
            n = a;
        } else if (sub) {
            next(p);
            node *lo = NULL, *hi = NULL, *st = NULL;
            bool slice = false;
            if (!is_op(cur(p), ":")) { lo = parse_expr(p); if (!lo) return NULL; }
            if (skip_op(p, ":")) {
                slice = true;
                if (!is_op(cur(p), "]") && !is_op(cur(p), ":")) { hi = parse_expr(p); if (!hi) return NULL; }
                if (skip_op(p, ":") && !is_op(cur(p), "]")) { st = parse_expr(p); if (!st) return NULL; }
            }
            if (expect_op(p, "]")) return NULL;
            node *a = mk(p, slice ? N_SLICE : N_ITEM, t);
            if (!a) return NULL;
            a->a = n;
            a->b = lo;
            if (slice) { a->c = hi; a->d = st; }
            n = a;
        } else if (filt && is_op(t, "|")) {
            next(p);
            if (!(n = parse_one_filter(p, n))) return NULL;
        } else if (filt) {
            next(p);
            node *f = mk(p, N_TEST, t);
            if (!f) return NULL;
            if (skip_name(p, "not")) f->op = 1;
            tok *nt = cur(p);
            if (nt->type != T_NAME) {
                tpl_perr(p, nt->line, nt->col, KVS_ERR_SYNTAX, "expected a test name after 'is'");
                return NULL;
            }
            f->name = tokname(p, nt);
            next(p);
            tok *at = cur(p);
            if (skip_op(p, "(")) {
                if (parse_args(p, f)) return NULL;
            } else if ((at->type == T_NAME || at->type == T_STRING || at->type == T_INT || at->type == T_FLOAT ||
                        is_op(at, "[") || is_op(at, "{")) &&
                       !is_name(at, "else") && !is_name(at, "or") && !is_name(at, "and")) {
                if (is_name(at, "is")) {
                    tpl_perr(p, at->line, at->col, KVS_ERR_SYNTAX, "unexpected 'is'");
                    return NULL;
                }
                node *arg = parse_primary(p);
                if (!arg) return NULL;
                arg = parse_postfix(p, arg);
                if (!arg) return NULL;
                f->v = tpl_palloc(p, sizeof *f->v);
                if (!f->v) return NULL;
                f->v[0] = arg;
                f->nv = 1;
            }
            f->a = n;
            n = f;
        } else {
            next(p);
            node *a = mk(p, N_CALL, n);
            if (!a) return NULL;
            a->a = n;
            if (parse_args(p, a)) return NULL;
            n = a;
        }
        if (filt) filtered = true;
    }
    p->depth -= wraps;
    return n;
}

static node *parse_postfix(parser *p, node *n) { return parse_chain(p, n, false); }
static node *parse_filters(parser *p, node *n) { return parse_chain(p, n, true); }

/* A list [a, b, ...] or a dict {k: v, ...} (kind N_DICT: children k0, v0, k1, v1, ...) after its opening token t,
 * up to and including close; a trailing comma is allowed. */
static node *parse_display(parser *p, const tok *t, const char *close, int kind) {
    next(p);
    nvec v = {0};
    while (!is_op(cur(p), close)) {
        if (v.n && expect_op(p, ",")) return NULL;
        if (is_op(cur(p), close)) break;
        node *k = NULL;
        if (kind == N_DICT && (!(k = parse_expr(p)) || expect_op(p, ":"))) return NULL;
        node *x = parse_expr(p);
        if (!x || (k && nv_push(p, &v, k)) || nv_push(p, &v, x)) return NULL;
    }
    next(p);
    node *n = mk(p, kind, t);
    if (!n) return NULL;
    n->v = v.v;
    n->nv = v.n;
    return n;
}

static node *parse_primary(parser *p) {
    if (enter(p)) return NULL;
    tok *t = cur(p);
    node *n = NULL;
    if (t->type == T_NAME) {
        n = mk(p, N_CONST, t);
        if (!n) return NULL;
        if (is_name(t, "true") || is_name(t, "True")) n->k = tv_bool(true);
        else if (is_name(t, "false") || is_name(t, "False")) n->k = tv_bool(false);
        else if (is_name(t, "none") || is_name(t, "None")) n->k = tv_none();
        else {
            n->kind = N_NAME;
            n->name = tokname(p, t);
        }
        next(p);
    } else if (t->type == T_STRING) {
        /* adjacent literals join */
        size_t total = 0, k = p->pos;
        while (p->toks[k].type == T_STRING) total += p->toks[k++].len;
        char *buf = tpl_palloc(p, total + 1);
        if (!buf) return NULL;
        size_t o = 0;
        while (cur(p)->type == T_STRING) {
            memcpy(buf + o, cur(p)->s, cur(p)->len);
            o += cur(p)->len;
            next(p);
        }
        n = mk(p, N_CONST, t);
        if (!n) return NULL;
        tstr *s = static_str(p, buf, total);
        if (!s) return NULL;
        n->k = tv_str(s);
    } else if (t->type == T_INT || t->type == T_FLOAT) {
        n = mk(p, N_CONST, t);
        if (!n) return NULL;
        n->k = t->type == T_INT ? tv_int(t->iv) : tv_float(t->fv);
        next(p);
    } else if (is_op(t, "(")) {
        next(p);
        if (skip_op(p, ")")) {
            n = mk(p, N_TUPLE, t);
        } else {
            node *e = parse_expr(p);
            if (!e) return NULL;
            if (is_op(cur(p), ",")) {
                nvec v = {0};
                if (nv_push(p, &v, e)) return NULL;
                while (skip_op(p, ",")) {
                    if (is_op(cur(p), ")")) break;
                    node *x = parse_expr(p);
                    if (!x || nv_push(p, &v, x)) return NULL;
                }
                n = mk(p, N_TUPLE, t);
                if (!n) return NULL;
                n->v = v.v;
                n->nv = v.n;
            } else {
                n = e;
            }
            if (expect_op(p, ")")) return NULL;
        }
    } else if (is_op(t, "[")) {
        n = parse_display(p, t, "]", N_LIST);
        if (!n) return NULL;
    } else if (is_op(t, "{")) {
        n = parse_display(p, t, "}", N_DICT);
        if (!n) return NULL;
    } else {
        char b[64];
        tpl_perr(p, t->line, t->col, KVS_ERR_SYNTAX, "unexpected %s", tokdesc(t, b, sizeof b));
        return NULL;
    }
    p->depth--;
    return n;
}

static node *parse_unary(parser *p, bool with_filter) {
    if (enter(p)) return NULL;
    tok *t = cur(p);
    node *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        next(p);
        n = mk(p, is_op(t, "-") ? N_NEG : N_POS, t);
        if (!n) return NULL;
        n->a = parse_unary(p, false);
        if (!n->a) return NULL;
    } else {
        n = parse_primary(p);
    }
    if (n) n = parse_postfix(p, n);
    if (n && with_filter) n = parse_filters(p, n);
    p->depth--;
    return n;
}

static node *binop(parser *p, const tok *t, int op, node *a, node *b) {
    if (!a || !b) return NULL;
    node *n = mk(p, N_BIN, t);
    if (!n) return NULL;
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

/* The left-associative arithmetic levels: 0 is `+ -` over concatenation, 1 is `* / // %`, 2 is `**` over unary
 * expressions (jinja2's precedence; its `**` is left-associative too). */
static node *parse_concat(parser *p);

static int arith_op(const tok *t, int level) {
    if (level == 0) return is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : -1;
    if (level == 1) return is_op(t, "*") ? OP_MUL : is_op(t, "/") ? OP_DIV : is_op(t, "//") ? OP_FDIV : is_op(t, "%") ? OP_MOD : -1;
    return is_op(t, "**") ? OP_POW : -1;
}

static node *parse_arith(parser *p, int level) {
    node *l = level == 0 ? parse_concat(p) : level == 1 ? parse_arith(p, 2) : parse_unary(p, true);
    int wraps = 0;
    for (;;) {
        tok *t = cur(p);
        int op = arith_op(t, level);
        if (!l || op < 0) { p->depth -= wraps; return l; }
        LINK(p, wraps);
        next(p);
        l = binop(p, t, op, l, level == 0 ? parse_concat(p) : level == 1 ? parse_arith(p, 2) : parse_unary(p, true));
    }
}

static node *parse_concat(parser *p) {
    node *l = parse_arith(p, 1);
    if (!l || !is_op(cur(p), "~")) return l;
    node *n = mk(p, N_CONCAT, cur(p));
    nvec v = {0};
    if (!n || nv_push(p, &v, l)) return NULL;
    while (skip_op(p, "~")) {
        node *x = parse_arith(p, 1);
        if (!x || nv_push(p, &v, x)) return NULL;
    }
    n->v = v.v;
    n->nv = v.n;
    return n;
}

static node *parse_math1(parser *p) { return parse_arith(p, 0); }

static node *parse_compare(parser *p) {
    node *l = parse_math1(p);
    if (!l) return NULL;
    nvec v = {0};
    tok *first = cur(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "==") ? OP_EQ : is_op(t, "!=") ? OP_NE : is_op(t, "<") ? OP_LT : is_op(t, "<=") ? OP_LE
               : is_op(t, ">") ? OP_GT : is_op(t, ">=") ? OP_GE : is_name(t, "in") ? OP_IN : -1;
        if (op >= 0) next(p);
        else if (is_name(t, "not") && is_name(peekt(p, 1), "in")) { next(p); next(p); op = OP_NOTIN; }
        else break;
        node *o = mk(p, N_BIN, t);
        if (!o) return NULL;
        o->op = (uint8_t)op;
        o->a = parse_math1(p);
        if (!o->a || nv_push(p, &v, o)) return NULL;
    }
    if (!v.n) return l;
    node *n = mk(p, N_CMP, first);
    if (!n) return NULL;
    n->a = l;
    n->v = v.v;
    n->nv = v.n;
    return n;
}

static node *parse_not(parser *p) {
    tok *t = cur(p);
    if (is_name(t, "not")) {
        if (enter(p)) return NULL;
        next(p);
        node *n = mk(p, N_NOT, t);
        if (!n) return NULL;
        n->a = parse_not(p);
        p->depth--;
        return n->a ? n : NULL;
    }
    return parse_compare(p);
}

/* `a and b and ...` (kind N_AND over parse_not) or `a or b or ...` (N_OR over the and-level) */
static node *parse_logic(parser *p, int kind) {
    const char *word = kind == N_AND ? "and" : "or";
    node *l = kind == N_AND ? parse_not(p) : parse_logic(p, N_AND);
    int wraps = 0;
    while (l && is_name(cur(p), word)) {
        tok *t = cur(p);
        LINK(p, wraps);
        next(p);
        node *r = kind == N_AND ? parse_not(p) : parse_logic(p, N_AND);
        node *n = r ? mk(p, kind, t) : NULL;
        if (!n) return NULL;
        n->a = l;
        n->b = r;
        l = n;
    }
    p->depth -= wraps;
    return l;
}

static node *parse_or(parser *p) { return parse_logic(p, N_OR); }

static node *parse_expr(parser *p) {
    if (enter(p)) return NULL;
    node *e = parse_or(p);
    int wraps = 0;
    while (e && is_name(cur(p), "if")) {
        tok *t = cur(p);
        LINK(p, wraps);
        next(p);
        node *n = mk(p, N_COND, t);
        if (!n) return NULL;
        n->b = e;
        n->a = parse_or(p);
        if (!n->a) return NULL;
        if (skip_name(p, "else")) {
            n->c = parse_expr(p);
            if (!n->c) return NULL;
        }
        e = n;
    }
    p->depth -= wraps + 1;
    return e;
}

/* ---- statements ------------------------------------------------------------------------------------------ */

static int expect_block_end(parser *p) {
    if (cur(p)->type == T_BLOCK_END) { next(p); return 0; }
    char b[64];
    return tpl_perr(p, cur(p)->line, cur(p)->col, KVS_ERR_SYNTAX, "expected end of statement block, got %s",
                tokdesc(cur(p), b, sizeof b));
}

/* Parses statements until a block tag whose name is in `ends` (NULL-terminated); leaves the position on that
 * name (after {%). *which gets its index. ends == NULL: until end of template. */
static node *parse_body(parser *p, const char *const *ends, int *which, const tok *opener);

static int parse_targets(parser *p, nvec *names_out) {
    bool paren = skip_op(p, "(");
    for (;;) {
        tok *t = cur(p);
        if (t->type != T_NAME) return tpl_perr(p, t->line, t->col, KVS_ERR_SYNTAX, "expected a variable name");
        const char *nm = tokname(p, t);
        if (!nm || nv_push(p, names_out, (node *)(void *)nm)) return p->code;
        next(p);
        if (!skip_op(p, ",")) break;
        if (paren && is_op(cur(p), ")")) break;
    }
    if (paren && expect_op(p, ")")) return p->code;
    return 0;
}

/* `(name, name=default, ...)` of a macro or call block: names and defaults (NULL where none) */
static int parse_params(parser *p, nvec *names, nvec *defs) {
    if (expect_op(p, "(")) return p->code;
    while (!is_op(cur(p), ")")) {
        if (names->n && expect_op(p, ",")) return p->code;
        if (is_op(cur(p), ")")) break;
        tok *pt = cur(p);
        if (pt->type != T_NAME) return tpl_perr(p, pt->line, pt->col, KVS_ERR_SYNTAX, "expected a parameter name");
        const char *pn = tokname(p, pt);
        next(p);
        node *def = NULL;
        if (skip_op(p, "=")) {
            if (!(def = parse_expr(p))) return p->code;
        } else if (defs->n && defs->v[defs->n - 1]) {
            return tpl_perr(p, pt->line, pt->col, KVS_ERR_SYNTAX, "non-default argument follows default argument");
        }
        if (nv_push(p, names, (node *)(void *)pn) || nv_push(p, defs, def)) return p->code;
    }
    next(p);
    return 0;
}

/* a macro's parameters into m->names and its defaults into m->d->v (when `present`; else none) */
static int macro_params(parser *p, node *m, bool present) {
    nvec names = {0}, defs = {0};
    if (present && parse_params(p, &names, &defs)) return p->code;
    m->names = (const char **)(void *)names.v;
    m->nnames = names.n;
    if (!(m->d = tpl_palloc(p, sizeof *m->d))) return p->code;   /* holder of the defaults */
    m->d->v = defs.v;
    m->d->nv = defs.n;
    return 0;
}

/* the statements up to {% end %}, which is consumed; fresh_loops: a macro body (break/continue do not reach out) */
static node *parse_until(parser *p, const char *end, const tok *opener, bool fresh_loops) {
    const char *ends[] = {end, NULL};
    int w, saved = p->loops;
    if (fresh_loops) p->loops = 0;
    node *body = parse_body(p, ends, &w, opener);
    p->loops = saved;
    if (!body) return NULL;
    next(p);
    return expect_block_end(p) ? NULL : body;
}

/* {% if %} ... {% elif %} ... {% else %} ... {% endif %}, bt its name token */
static node *parse_if(parser *p, tok *bt) {
    next(p);
    node *n = mk(p, N_IF, bt);
    if (!n || !(n->a = parse_expr(p)) || expect_block_end(p)) return NULL;
    node *ifn = n;
    for (;;) {
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        int w = -1;
        node *body = parse_body(p, ends, &w, bt);
        if (!body) return NULL;
        ifn->b = body;
        if (w == 0) {
            tok *et = cur(p);
            next(p);
            node *el = mk(p, N_IF, et);
            if (!el || !(el->a = parse_expr(p)) || expect_block_end(p)) return NULL;
            ifn->c = el;
            ifn = el;
            continue;
        }
        if (w == 1) {
            next(p);
            if (expect_block_end(p)) return NULL;
            static const char *const ends2[] = {"endif", NULL};
            node *eb = parse_body(p, ends2, &w, bt);
            if (!eb) return NULL;
            ifn->c = eb;
        }
        next(p);
        if (expect_block_end(p)) return NULL;
        break;
    }
    return n;
}

/* {% for targets in iterable [if filter] %} ... [{% else %} ...] {% endfor %} */
static node *parse_for(parser *p, tok *bt) {
    next(p);
    node *n = mk(p, N_FOR, bt);
    nvec names = {0};
    if (!n || parse_targets(p, &names)) return NULL;
    n->names = (const char **)(void *)names.v;
    n->nnames = names.n;
    if (!skip_name(p, "in")) {
        tpl_perr(p, cur(p)->line, cur(p)->col, KVS_ERR_SYNTAX, "expected 'in' in for loop");
        return NULL;
    }
    /* the iterable: no conditional expression (its `if` is the loop filter) */
    if (!(n->a = parse_or(p))) return NULL;
    if (skip_name(p, "if")) {
        if (!(n->b = parse_expr(p))) return NULL;
    }
    if (is_name(cur(p), "recursive")) {
        tpl_perr(p, cur(p)->line, cur(p)->col, KVS_ERR_UNSUPPORTED, "recursive loops are not supported");
        return NULL;
    }
    if (expect_block_end(p)) return NULL;
    static const char *const ends[] = {"else", "endfor", NULL};
    int w = -1;
    p->loops++;
    node *body = parse_body(p, ends, &w, bt);
    p->loops--;
    if (!body) return NULL;
    n->v = body->v;
    n->nv = body->nv;
    if (w == 0) {
        next(p);
        if (expect_block_end(p)) return NULL;
        static const char *const ends2[] = {"endfor", NULL};
        int saved = p->loops;
        p->loops = 0;
        n->c = parse_body(p, ends2, &w, bt);
        p->loops = saved;
        if (!n->c) return NULL;
    }
    next(p);
    if (expect_block_end(p)) return NULL;
    return n;
}

/* {% set target = expr %}, {% set ns.attr = expr %} and the block form {% set x [| filter] %} ... {% endset %} */
static node *parse_set(parser *p, tok *bt) {
    next(p);
    node *n = mk(p, N_SET, bt);
    if (!n) return NULL;
    tok *t = cur(p);
    if (t->type == T_NAME && is_op(peekt(p, 1), ".")) {
        tok *at = peekt(p, 2);
        if (at->type != T_NAME) {
            tpl_perr(p, at->line, at->col, KVS_ERR_SYNTAX, "expected an attribute name");
            return NULL;
        }
        n->b = mk(p, N_NAME, t);
        if (!n->b) return NULL;
        n->b->name = tokname(p, t);
        n->name = tokname(p, at);
        next(p); next(p); next(p);
    } else {
        nvec names = {0};
        if (parse_targets(p, &names)) return NULL;
        n->names = (const char **)(void *)names.v;
        n->nnames = names.n;
    }
    if (skip_op(p, "=")) {
        node *e = parse_expr(p);
        if (!e) return NULL;
        if (is_op(cur(p), ",")) {   /* implicit tuple */
            nvec v = {0};
            if (nv_push(p, &v, e)) return NULL;
            while (skip_op(p, ",")) {
                node *x = parse_expr(p);
                if (!x || nv_push(p, &v, x)) return NULL;
            }
            node *tn = mk(p, N_TUPLE, t);
            if (!tn) return NULL;
            tn->v = v.v;
            tn->nv = v.n;
            e = tn;
        }
        n->a = e;
        if (expect_block_end(p)) return NULL;
    } else {
        if (n->b || n->nnames != 1) {
            tpl_perr(p, t->line, t->col, KVS_ERR_SYNTAX, "a set block assigns one plain name");
            return NULL;
        }
        n->kind = N_SETBLOCK;
        if (is_op(cur(p), "|")) {   /* {% set x | filter %} */
            node *f = parse_filters(p, NULL);
            if (!f) return NULL;
            n->a = f;
        }
        if (expect_block_end(p)) return NULL;
        if (!(n->c = parse_until(p, "endset", bt, false))) return NULL;
    }
    return n;
}

static node *parse_stmt(parser *p) {
    tok *bt = cur(p);   /* the name after {% */
    if (bt->type != T_NAME) {
        tpl_perr(p, bt->line, bt->col, KVS_ERR_SYNTAX, "expected a statement name");
        return NULL;
    }
    if (enter(p)) return NULL;
    node *n = NULL;
    if (is_name(bt, "if")) {
        n = parse_if(p, bt);
        if (!n) return NULL;
    } else if (is_name(bt, "for")) {
        n = parse_for(p, bt);
        if (!n) return NULL;
    } else if (is_name(bt, "set")) {
        n = parse_set(p, bt);
        if (!n) return NULL;
    } else if (is_name(bt, "macro")) {
        next(p);
        n = mk(p, N_MACRO, bt);
        tok *t = cur(p);
        if (!n) return NULL;
        if (t->type != T_NAME) {
            tpl_perr(p, t->line, t->col, KVS_ERR_SYNTAX, "expected a macro name");
            return NULL;
        }
        n->name = tokname(p, t);
        next(p);
        if (macro_params(p, n, true) || expect_block_end(p)) return NULL;
        if (!(n->c = parse_until(p, "endmacro", bt, true))) return NULL;
    } else if (is_name(bt, "filter")) {
        next(p);
        n = mk(p, N_FILTERBLOCK, bt);
        if (!n) return NULL;
        /* a filter chain applied to a placeholder input (NULL) */
        node *f = parse_one_filter(p, NULL);
        if (!f) return NULL;
        n->a = parse_filters(p, f);
        if (!n->a || expect_block_end(p)) return NULL;
        if (!(n->c = parse_until(p, "endfilter", bt, false))) return NULL;
    } else if (is_name(bt, "generation")) {
        next(p);
        if (expect_block_end(p)) return NULL;
        n = mk(p, N_FILTERBLOCK, bt);   /* a filter block without a filter: its body, in its own scope */
        if (!n || !(n->c = parse_until(p, "endgeneration", bt, false))) return NULL;
    } else if (is_name(bt, "call")) {
        /* {% call [(params)] macro(args) %}body{% endcall %}: the body becomes an anonymous macro, `caller` */
        next(p);
        n = mk(p, N_CALLBLOCK, bt);
        node *m = mk(p, N_MACRO, bt);
        if (!n || !m) return NULL;
        m->name = "caller";
        if (macro_params(p, m, is_op(cur(p), "("))) return NULL;
        node *e = parse_expr(p);
        if (!e) return NULL;
        if (e->kind != N_CALL) {
            tpl_perr(p, e->line, e->col, KVS_ERR_SYNTAX, "a call block needs a macro call");
            return NULL;
        }
        if (expect_block_end(p)) return NULL;
        if (!(m->c = parse_until(p, "endcall", bt, true))) return NULL;
        n->a = e;
        n->d = m;
    } else if (is_name(bt, "break") || is_name(bt, "continue")) {
        if (!p->loops) {
            tpl_perr(p, bt->line, bt->col, KVS_ERR_SYNTAX, "'%.*s' outside a loop", (int)bt->len, bt->s);
            return NULL;
        }
        n = mk(p, is_name(bt, "break") ? N_BREAK : N_CONTINUE, bt);
        next(p);
        if (!n || expect_block_end(p)) return NULL;
    } else {
        static const char *unsup[] = {"include", "import", "from", "extends", "block", "do", "with",
                                      "autoescape", "trans", NULL};
        for (int i = 0; unsup[i]; i++)
            if (is_name(bt, unsup[i])) {
                tpl_perr(p, bt->line, bt->col, KVS_ERR_UNSUPPORTED, "the '%s' tag is not supported", unsup[i]);
                return NULL;
            }
        tpl_perr(p, bt->line, bt->col, KVS_ERR_SYNTAX, "unknown tag '%.*s'", (int)(bt->len < 40 ? bt->len : 40), bt->s);
        return NULL;
    }
    p->depth--;
    return n;
}

static node *parse_body(parser *p, const char *const *ends, int *which, const tok *opener) {
    nvec v = {0};
    node *body = mk(p, N_BODY, cur(p));
    if (!body) return NULL;
    for (;;) {
        tok *t = cur(p);
        if (t->type == T_EOF) {
            if (ends) {
                tpl_perr(p, opener->line, opener->col, KVS_ERR_SYNTAX, "unclosed '%.*s' block (expected '%s')",
                     (int)opener->len, opener->s, ends[0]);
                return NULL;
            }
            break;
        }
        if (t->type == T_TEXT) {
            node *n = mk(p, N_TEXT, t);
            tstr *s = n ? static_str(p, t->s, t->len) : NULL;
            if (!s) return NULL;
            n->k = tv_str(s);
            if (nv_push(p, &v, n)) return NULL;
            next(p);
        } else if (t->type == T_VAR_BEGIN) {
            next(p);
            node *n = mk(p, N_OUT, t);
            if (!n || !(n->a = parse_expr(p))) return NULL;
            if (cur(p)->type != T_VAR_END) {
                char b[64];
                tpl_perr(p, cur(p)->line, cur(p)->col, KVS_ERR_SYNTAX, "expected end of print statement, got %s",
                     tokdesc(cur(p), b, sizeof b));
                return NULL;
            }
            next(p);
            if (nv_push(p, &v, n)) return NULL;
        } else if (t->type == T_BLOCK_BEGIN) {
            next(p);
            tok *nt = cur(p);
            if (ends)
                for (int i = 0; ends[i]; i++)
                    if (is_name(nt, ends[i])) {
                        *which = i;
                        body->v = v.v;
                        body->nv = v.n;
                        return body;
                    }
            if (nt->type == T_NAME && nt->len > 3 && (!memcmp(nt->s, "end", 3) || is_name(nt, "elif") || is_name(nt, "else"))) {
                tpl_perr(p, nt->line, nt->col, KVS_ERR_SYNTAX, "unexpected '%.*s'", (int)(nt->len < 40 ? nt->len : 40), nt->s);
                return NULL;
            }
            node *n = parse_stmt(p);
            if (!n || nv_push(p, &v, n)) return NULL;
        } else {
            char b[64];
            tpl_perr(p, t->line, t->col, KVS_ERR_SYNTAX, "unexpected %s", tokdesc(t, b, sizeof b));
            return NULL;
        }
    }
    body->v = v.v;
    body->nv = v.n;
    return body;
}

/* ---- the top level's first references (jinja2's symbol analysis of the root frame) ------------------------- */

typedef struct refs {
    const char **names;
    bool *stored_first;
    int n, cap;
} refs;

/* the first reference to `name` decides: a load (or a store inside an if branch) means "read the input until
 * assigned", a plain store means "undefined until assigned" */
static int ref_note(parser *p, refs *r, const char *name, bool store) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->names[i], name)) return 0;
    if (r->n == r->cap) {
        int nc = r->cap ? r->cap * 2 : 16;
        const char **nn = tpl_palloc(p, (size_t)nc * sizeof *nn);
        bool *ns = tpl_palloc(p, (size_t)nc * sizeof *ns);
        if (!nn || !ns) return p->code;
        if (r->n) {
            memcpy(nn, r->names, (size_t)r->n * sizeof *nn);
            memcpy(ns, r->stored_first, (size_t)r->n * sizeof *ns);
        }
        r->names = nn;
        r->stored_first = ns;
        r->cap = nc;
    }
    r->names[r->n] = name;
    r->stored_first[r->n++] = store;
    return 0;
}

static int ref_loads(parser *p, refs *r, const node *e) {
    if (!e) return 0;
    if (e->kind == N_NAME) return ref_note(p, r, e->name, false);
    int rc = 0;
    const node *kids[4] = {e->a, e->b, e->c, e->d};
    for (int i = 0; i < 4 && !rc; i++) rc = ref_loads(p, r, kids[i]);
    for (int i = 0; i < e->nv && !rc; i++) rc = ref_loads(p, r, e->v[i]);
    return rc;
}

static int ref_body(parser *p, refs *r, const node *body, bool branch);

static int ref_stmt(parser *p, refs *r, const node *n, bool branch) {
    int rc = 0;
    switch (n->kind) {
    case N_OUT: return ref_loads(p, r, n->a);
    case N_IF:
        for (const node *b = n; b && !rc;) {
            if (b->kind != N_IF) return ref_body(p, r, b, true);
            if (!(rc = ref_loads(p, r, b->a))) rc = ref_body(p, r, b->b, true);
            b = b->c;
        }
        return rc;
    case N_FOR: return ref_loads(p, r, n->a);
    case N_SET:
        if ((rc = ref_loads(p, r, n->a))) return rc;
        if (n->b) return ref_note(p, r, n->b->name, false);
        for (int i = 0; i < n->nnames && !rc; i++) rc = ref_note(p, r, n->names[i], !branch);
        return rc;
    case N_SETBLOCK: return ref_note(p, r, n->names[0], !branch);
    case N_MACRO: return ref_note(p, r, n->name, !branch);
    case N_FILTERBLOCK: return ref_loads(p, r, n->a);
    case N_CALLBLOCK: return ref_loads(p, r, n->a);
    case N_BODY: return ref_body(p, r, n, branch);
    default: return 0;
    }
}

static int ref_body(parser *p, refs *r, const node *body, bool branch) {
    int rc = 0;
    for (int i = 0; body && i < body->nv && !rc; i++) rc = ref_stmt(p, r, body->v[i], branch);
    return rc;
}

static int root_undef(parser *p, tpl_template *t) {
    refs r = {0};
    int rc = ref_body(p, &r, t->root, false);
    if (rc) return rc;
    int k = 0;
    for (int i = 0; i < r.n; i++) k += r.stored_first[i];
    if (!k) return 0;
    t->root_undef = tpl_palloc(p, (size_t)k * sizeof *t->root_undef);
    if (!t->root_undef) return p->code;
    for (int i = 0; i < r.n; i++)
        if (r.stored_first[i]) t->root_undef[t->n_root_undef++] = r.names[i];
    return 0;
}

int tpl_parse(tpl_template *t, const char *src, size_t len, tpl_error *err) {
    parser p = {.t = t, .err = err};
    /* newlines normalized to \n, one trailing newline dropped (jinja2's keep_trailing_newline=False) */
    char *s = tpl_arena_alloc(&t->arena, len + 1);
    if (!s) return tpl_perr(&p, 0, 0, KVS_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[k++] = src[i];
        }
    }
    if (k && s[k - 1] == '\n') k--;
    s[k] = 0;
    p.src = s;
    p.n = k;
    int rc = tpl_lex(&p);
    if (!rc) {
        t->root = parse_body(&p, NULL, NULL, NULL);
        rc = t->root ? root_undef(&p, t) : p.code ? p.code : KVS_ERR_SYNTAX;
    }
    free(p.toks);
    return rc;
}
