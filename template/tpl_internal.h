/* tpl_internal.h: what the template module's files share (not public). Values, the syntax tree, the render
 * context. */
#ifndef KVSERVE_TPL_INTERNAL_H
#define KVSERVE_TPL_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>

#include "template/template.h"

/* ---- values ---------------------------------------------------------------------------------------------- */

typedef enum tv_type {
    TV_UNDEF, TV_NONE, TV_BOOL, TV_INT, TV_FLOAT, TV_STR, TV_LIST, TV_DICT, TV_FUNC, TV_MACRO, TV_LOOP, TV_CALLER,
} tv_type;

/* A string: immutable once built. rc < 0 marks a string owned by the compiled template (never counted, never
 * freed by a render). spans: content-marked byte ranges, sorted and disjoint. */
typedef struct tstr {
    int32_t rc;
    uint32_t nspans;
    size_t len;
    tpl_span *spans;
    bool safe;     /* jinja2's Markup (the `safe` filter): `+` with a plain string HTML-escapes the plain one */
    char data[];   /* [len + 1] */
} tstr;

struct tv;
typedef struct tcont tcont;

/* Lists (also tuples and generator results) and dicts (also namespaces) are containers. Every container of a
 * render is on the render's list so that cycles are freed at the end. */
enum { TC_LIST, TC_TUPLE, TC_GEN, TC_DICT, TC_NS };

typedef struct tv {
    uint8_t t;           /* tv_type */
    uint8_t sub;         /* TV_FUNC: builtin id */
    union {
        bool b;
        int64_t i;
        double f;
        tstr *s;
        tcont *c;
        const struct node *m;   /* TV_MACRO */
        struct tloop *loop;     /* TV_LOOP */
        struct tcaller *cl;     /* TV_CALLER: a call block's body, callable while the block runs */
        const char *uname;      /* TV_UNDEF: the missing name (template-owned, NUL-terminated) or NULL */
    };
} tv;

struct tcont {
    int32_t rc;
    uint8_t kind;
    tcont *prev, *next;   /* the render's list of live containers */
    size_t n, cap;
    tv *items;            /* list items, or dict values */
    struct tv *keys;      /* dict keys [cap]: strings, or int/float/bool/None */
    uint32_t *index;      /* dict hash index [icap] of position + 1, 0 = empty; NULL while small */
    size_t icap;
};

/* ---- syntax tree ------------------------------------------------------------------------------------------ */

typedef enum nkind {
    /* statements */
    N_BODY, N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_FILTERBLOCK, N_BREAK, N_CONTINUE, N_CALLBLOCK,
    /* expressions */
    N_CONST, N_NAME, N_LIST, N_TUPLE, N_DICT, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_KW, N_FILTER, N_TEST, N_BIN,
    N_NEG, N_POS, N_NOT, N_AND, N_OR, N_CMP, N_COND, N_CONCAT,
} nkind;

enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

typedef struct node {
    uint8_t kind;
    uint8_t op;          /* N_BIN, N_CMP operands: OP_*; N_TEST: 1 = negated; N_FOR: 1 = has filter */
    int line, col;
    struct node *a, *b, *c, *d;
    struct node **v;     /* children: body statements, arguments, list items, dict key/value pairs */
    int nv;
    const char *name;    /* N_NAME, N_ATTR, N_KW, N_FILTER, N_TEST, N_MACRO: NUL-terminated, template-owned */
    tv k;                /* N_CONST: the value (strings template-owned) */
    const char **names;  /* N_FOR / N_SET targets, N_MACRO parameters */
    int nnames;
} node;

struct tpl_template {
    tpl_limits lim;
    node *root;
    /* names the template's top level assigns before (in source order) it ever reads them: jinja2 makes them
     * template variables from the start, undefined until assigned, so that loops and macros reading them early
     * see undefined rather than an input variable of the same name */
    const char **root_undef;
    int n_root_undef;
    void *arena;        /* every allocation of the compiled template */
};

/* The compiler's arena. */
void *tpl_arena_alloc(void **arena, size_t n);
void tpl_arena_free(void *arena);

/* Parses src into *t (t->lim already set). */
int tpl_parse(tpl_template *t, const char *src, size_t len, tpl_error *err);

/* ---- render context ------------------------------------------------------------------------------------------ */

typedef struct tsink {
    kvs_buf buf;
    tpl_span *spans;
    size_t nspans, cap;
} tsink;

typedef struct tframe {
    struct tframe *parent;
    const char **names;
    tv *vals;
    size_t n, cap;
} tframe;

/* `caller` inside a macro called by {% call %}: the block's body as a macro whose scope is the block's own */
typedef struct tcaller {
    int32_t rc;
    const struct node *m;     /* N_MACRO node of the body */
    struct tframe *frame;     /* the scope around the call block; NULL once the block has ended */
} tcaller;

typedef struct tloop {
    int32_t rc;
    int64_t index0, length;
    tv prev, next;
    bool has_prev, has_next;
} tloop;

typedef struct tctx {
    const tpl_template *t;
    const tpl_render_params *p;
    struct tm now;
    uint64_t steps;
    size_t mem;
    uint64_t deadline_ns;   /* CLOCK_MONOTONIC; 0: none (params.max_ms) */
    uint64_t next_check;    /* steps at which the deadline and the cancel flag are looked at next */
    size_t alloc_total;     /* bytes charged by tpl_mem over the render (params.max_alloc_bytes) */
    int depth;          /* macro call depth */
    tcont *live;        /* containers alive */
    tframe *root;       /* template-level variables */
    tcont *globals;     /* the input variables (a dict) or NULL */
    tframe *frame;      /* the innermost scope */
    int nest;           /* evaluation nesting (bounds the C stack) */
    tsink *out;         /* where printing goes */
    int brk;            /* 1 break, 2 continue pending */
    int free_depth;     /* nesting of container frees in progress */
    bool dying;         /* the render is being torn down */
    tpl_error *err;
    int errcode;
} tctx;

/* fills err (when not NULL): code, place (line 0 = none) and the message "template line L:C: ..." */
void tpl_set_error(tpl_error *err, int code, int line, int col, const char *fmt, va_list ap);
/* errors: record the first error (code, node's place, message) and return the code */
int tpl_fail(tctx *c, const node *n, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* values */
static inline tv tv_undef(const char *name) { tv v = {.t = TV_UNDEF}; v.uname = name; return v; }
static inline tv tv_none(void) { tv v = {.t = TV_NONE}; return v; }
static inline tv tv_bool(bool b) { tv v = {.t = TV_BOOL}; v.b = b; return v; }
static inline tv tv_int(int64_t i) { tv v = {.t = TV_INT}; v.i = i; return v; }
static inline tv tv_float(double f) { tv v = {.t = TV_FLOAT}; v.f = f; return v; }
void tv_incref(tv v);
void tv_decref(tctx *c, tv v);
int tstr_new(tctx *c, const node *n, const char *s, size_t len, tv *out);
/* a new string of len bytes (data uninitialized, NUL written), no spans */
int tstr_alloc(tctx *c, const node *n, size_t len, tstr **out);
static inline tv tv_str(tstr *s) { tv v = {.t = TV_STR}; v.s = s; return v; }
/* s[off..off+len) with the spans clipped */
int tstr_sub(tctx *c, const node *n, tstr *s, size_t off, size_t len, tv *out);
int tcont_new(tctx *c, const node *n, int kind, size_t cap, tv *out);
int tlist_push(tctx *c, const node *n, tcont *l, tv v);      /* takes the reference */
int tdict_set(tctx *c, const node *n, tcont *d, tv key, tv v); /* takes v's reference, not key's */
/* the value under a hashable key (NULL when missing or the key is not hashable) */
tv *tdict_getv(const tcont *d, tv key);
bool tv_hashable(tv v);
int tdict_setc(tctx *c, const node *n, tcont *d, const char *key, tv v);
tv *tdict_get(const tcont *d, const char *key, size_t klen);
int tdict_del(tctx *c, tcont *d, size_t pos);
void tctx_free_all(tctx *c);
int tpl_mem(tctx *c, const node *n, size_t add);
static inline void tpl_unmem(tctx *c, size_t sub) { c->mem -= sub < c->mem ? sub : c->mem; }

bool tv_truthy(tv v);
/* Python ==. tv_equal_w also counts the values it visits into w->work and gives up (w->deep set, result false)
 * on values nested deeper than TPL_MAX_EVAL_NEST; tv_equal is for scalars and keys. */
typedef struct tv_eqw {
    uint64_t work;
    int depth;
    bool deep;
} tv_eqw;
bool tv_equal_w(tv a, tv b, tv_eqw *w);
bool tv_equal(tv a, tv b);
/* == inside a render: the work is charged as steps; KVS_ERR_LIMIT when too deep or over the budget */
int tpl_equal(tctx *c, const node *n, tv a, tv b, bool *res);
/* <0, 0, >0; KVS_ERR_TYPE when not ordered (returned through *rc) */
int tv_compare(tctx *c, const node *n, tv a, tv b, int *res);
const char *tv_typename(tv v);
/* Python str() / repr() appended to the sink or buffer: spans of marked strings are kept by tv_print */
int tv_print(tctx *c, const node *n, tv v, tsink *s);
int tv_repr(tctx *c, const node *n, tv v, kvs_buf *b, int depth);
/* str(v) as a new string value (strings returned as they are, with a new reference) */
int tv_tostr(tctx *c, const node *n, tv v, tv *out);
/* json.dumps(v, ensure_ascii, indent, separators, sort_keys) into a sink */
typedef struct tpl_json_opts {
    int indent;              /* < 0: none (one line) */
    const char *item_sep;    /* ", " (or "," with an indent) unless given */
    const char *key_sep;     /* ": " unless given */
    bool sort_keys, ensure_ascii;
} tpl_json_opts;
int tv_tojson(tctx *c, const node *n, tv v, const tpl_json_opts *o, tsink *s);
/* markupsafe's escape of s (& < > " ') as a new safe string */
int tpl_html_escape(tctx *c, const node *n, tstr *s, tv *out);
/* Python's `fmt % args` */
int tpl_str_mod(tctx *c, const node *n, tstr *fmt, tv args, tv *out);
int tv_from_json(tctx *c, const cJSON *j, int mark, int depth, tv *out);
void tpl_format_float(double f, char *buf, size_t cap);

/* sinks */
int tsink_put(tctx *c, const node *n, tsink *s, const char *p, size_t len, bool marked);
int tsink_putstr(tctx *c, const node *n, tsink *s, const tstr *str);
int tsink_take(tctx *c, const node *n, tsink *s, tv *out);
void tsink_free(tsink *s);

/* UTF-8 helpers */
size_t tpl_u8_len(const char *s, size_t n);                  /* code points */
size_t tpl_u8_off(const char *s, size_t n, size_t cp);       /* byte offset of code point cp (n if past) */
bool tpl_is_ascii(const char *s, size_t n);
/* decodes the code point at s (n > 0 bytes left) into *cp; returns its length (1 and the byte for a bad one) */
size_t tpl_u8_dec(const char *s, size_t n, uint32_t *cp);

/* value operations (tpl_ops.c) used by the interpreter (tpl_eval.c) */
int tpl_slice(tctx *c, const node *n, tv obj, tv lo, tv hi, tv st, tv *out);
int tpl_binop(tctx *c, const node *n, int op, tv a, tv b, tv *out);
int tpl_contains(tctx *c, const node *n, tv item, tv seq, bool *res);

/* lexer and parser state shared by tpl_lex.c and tpl_parse.c */
typedef enum {
    T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP, T_EOF
} ttype;

typedef struct tok {
    uint8_t type;
    int line, col;
    const char *s;   /* T_TEXT, T_NAME, T_OP: source text; T_STRING: unescaped (arena) */
    size_t len;
    int64_t iv;
    double fv;
} tok;

typedef struct parser {
    tpl_template *t;
    tpl_error *err;
    const char *src;
    size_t n;
    tok *toks;
    size_t ntok, cap, pos;
    int depth;
    int loops;       /* for loops around the statement being parsed */
    int code;
} parser;

int tpl_perr(parser *p, int line, int col, int code, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* arena allocation for the tree; sets the parser error on failure */
void *tpl_palloc(parser *p, size_t n);
char *tpl_pstrdup(parser *p, const char *s, size_t n);
/* fills p->toks from p->src */
int tpl_lex(parser *p);

/* builtins (tpl_builtins.c: globals and tests; tpl_filters.c; tpl_methods.c) */
enum { FN_RANGE = 1, FN_NAMESPACE, FN_RAISE, FN_STRFTIME, FN_DICT, FN_LOOP_CYCLE };
int tpl_call_global(tctx *c, const node *n, int fn, tv *args, int nargs, const char **kwn, tv *kwv, int nkw,
                    tv *out);
int tpl_filter(tctx *c, const node *n, const char *name, tv in, tv *args, int nargs, const char **kwn, tv *kwv,
               int nkw, tv *out);
int tpl_test(tctx *c, const node *n, const char *name, tv in, tv *args, int nargs, bool *out);
int tpl_method(tctx *c, const node *n, tv obj, const char *name, tv *args, int nargs, const char **kwn, tv *kwv,
               int nkw, tv *out);
bool tpl_has_method(tv obj, const char *name);
/* The name-to-function tables (filters, string/list/dict methods) are arrays of structs whose first member is
 * the name (const char *), in strcmp order: tpl_table_find bsearches one (NULL when absent), tpl_table_sorted
 * checks the order; tpl_filters_sorted / tpl_methods_sorted check every table (for the tests). */
const void *tpl_table_find(const void *table, size_t n, size_t size, const char *name);
bool tpl_table_sorted(const void *table, size_t n, size_t size);
bool tpl_filters_sorted(void);
bool tpl_methods_sorted(void);

/* helpers shared by the builtins (tpl_builtins.c), the filters (tpl_filters.c) and the methods (tpl_methods.c) */
typedef struct fargs {
    tv *pos;
    int npos;
    const char **kwn;
    tv *kwv;
    int nkw;
} fargs;
/* the argument at position i or named `name`, or NULL */
tv *tpl_arg(fargs *a, int i, const char *name);
bool tpl_arg_bool(fargs *a, int i, const char *name, bool dflt);
int tpl_need_str(tctx *c, const node *n, tv *v, const char *what, tstr **out);
bool tpl_is_intlike(tv v);
int64_t tpl_ival(tv v);
int tpl_undef_err(tctx *c, const node *n, tv v);
/* start of the code point ending at s[end) */
size_t tpl_prev_cp(const char *s, size_t end);
bool tpl_py_space(uint32_t cp);
/* strip: which 1 left, 2 right, 3 both; chars NULL = whitespace */
int tpl_strip(tctx *c, const node *n, tstr *s, const tstr *chars, int which, tv *out);
/* upper / lower / str.title / capitalize / jinja2's title filter */
enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAP, CASE_JTITLE };
int tpl_case(tctx *c, const node *n, tstr *s, int mode, tv *out);
/* attribute path "a.b.0" of v: new reference, undefined when missing */
int tpl_attr_path(tctx *c, const node *n, tv v, const tstr *path, tv *out);
/* sorts list items (new list out) by key = attribute path or the item itself */
int tpl_sort_list(tctx *c, const node *n, tv list, const tstr *attr, bool ci, bool rev, int kind, tv *out);
int tpl_join(tctx *c, const node *n, tv seq, const tstr *sep, const tstr *attr, tv *out);
int tpl_replace(tctx *c, const node *n, tstr *s, tstr *old, tstr *new, int64_t count, tv *out);
/* the items of an iterable as a new list (strings: characters; dicts: keys; undefined: empty) */
int tpl_iter_list(tctx *c, const node *n, tv v, tv *out);
/* attribute / item access as jinja2's getattr / getitem */
int tpl_getattr(tctx *c, const node *n, tv obj, const char *name, tv *out);
int tpl_getitem(tctx *c, const node *n, tv obj, tv key, tv *out);
int tpl_step(tctx *c, const node *n);
/* CLOCK_MONOTONIC in nanoseconds */
uint64_t tpl_now_ns(void);
/* charges `units` steps at once (work proportional to a size: bytes / TPL_BYTES_PER_STEP, elements) */
int tpl_charge(tctx *c, const node *n, uint64_t units);
#define TPL_BYTES_PER_STEP 256
/* Nesting of evaluation (statements and expressions, across macro calls, and of values compared): bounds the C
 * stack a render uses. */
#define TPL_MAX_EVAL_NEST 500
/* calls a macro value */
int tpl_call_macro(tctx *c, const node *n, const node *m, tframe *scope, tv *args, int nargs, const char **kwn, tv *kwv,
                   int nkw, tv *out);

#endif
