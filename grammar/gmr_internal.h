/* gmr_internal.h: the grammar module's internal representation and builder (not part of the public API).
 *
 * A grammar is a set of rules; a rule is a list of alternatives; an alternative is a sequence of elements ended
 * by GK_END. Elements: GK_BYTES (one byte of a 256-bit class), GK_RULE (a rule), GK_REPEAT (a rule repeated
 * min..max times; max GMR_INF = unbounded). Element 0 is GK_RULE root and element 1 GK_END: the start.
 * Compilers (schema, regex, BNF) build through gb_* and gb_finish checks and flattens the result.
 */
#ifndef KVSERVE_GMR_INTERNAL_H
#define KVSERVE_GMR_INTERNAL_H

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>

#include "grammar/grammar.h"

#define GMR_INF UINT32_MAX
#define GMR_MAX_RULES 262144u
#define GMR_MAX_ELEMS 4194304u
#define GMR_MAX_CLASSES 65536u

enum { GK_END = 0, GK_BYTES = 1, GK_RULE = 2, GK_REPEAT = 3 };

typedef struct gmr_el {
    uint32_t kind;   /* GK_* */
    uint32_t a;      /* BYTES: class id; RULE, REPEAT: rule id */
    uint32_t min;    /* REPEAT only */
    uint32_t max;    /* REPEAT only; GMR_INF = unbounded */
} gmr_el;

struct gmr_grammar {
    uint32_t n_rules, n_alts, n_el, n_cls;
    uint32_t *rule_alt;      /* [n_rules + 1]: the alternatives of rule r are rule_alt[r] .. rule_alt[r+1] - 1 */
    uint32_t *alt_el;        /* [n_alts]: first element of each alternative */
    uint8_t (*alt_first)[32];/* [n_alts]: bytes that can start the alternative's non-empty strings */
    uint8_t *alt_null;       /* [n_alts]: the alternative matches the empty string */
    uint8_t *rule_null;      /* [n_rules] */
    gmr_el *el;              /* [n_el] */
    uint8_t *null_from;      /* [n_el]: elements from here to the END match empty (a REPEAT as at count 0) */
    uint8_t (*cls)[32];      /* [n_cls] byte classes */
};

/* ---- builder --------------------------------------------------------------------------------------------- */

typedef struct gb_seq { gmr_el *v; uint32_t n, cap; } gb_seq;
typedef struct gb_rule { gb_seq *alts; uint32_t n, cap; bool defined; } gb_rule;

typedef struct gb {
    gb_rule *rules; uint32_t n_rules, cap_rules;
    uint8_t (*cls)[32]; uint32_t n_cls, cap_cls;
    size_t n_el;             /* elements so far (limit) */
    int err;                 /* sticky: the first error */
    char *msg; size_t msg_len;
} gb;

void gb_init(gb *b, char *msg, size_t msg_len);
void gb_free(gb *b);
/* Records the first error (later ones are ignored) and returns it. */
int gb_fail(gb *b, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A new rule with no alternatives yet; UINT32_MAX (and b->err set) on failure. */
uint32_t gb_rule_new(gb *b);
/* Moves s into rule r as one more alternative (s is left empty). */
void gb_alt(gb *b, uint32_t r, gb_seq *s);
/* Adds to rule r the alternative made of rule q alone. */
void gb_alt_ref(gb *b, uint32_t r, uint32_t q);
/* A new rule of alternatives separated by '|': branch(ctx) parses one and returns its rule; bar(ctx) consumes
 * a following '|' (true) or finds none (false). Stops at the first error. */
uint32_t gb_alternatives(gb *b, uint32_t (*branch)(void *ctx), bool (*bar)(void *ctx), void *ctx);
/* The bounds of a counted repetition: p[*i] is '{' and the text ends at n or at a NUL. Reads "m}", "m,}" or
 * "m,n}" (decimal numbers, each saturating at max + 1): GB_COUNT_OK with *i past the '}' and *mn / *mx set (*mx
 * GMR_INF for "m,}"); GB_COUNT_LIMIT the same with a number above max; GB_COUNT_NONE when no digit follows the
 * '{' (*i unchanged); GB_COUNT_BAD when no '}' closes the numbers. n < m is the caller's to judge. */
enum { GB_COUNT_OK, GB_COUNT_LIMIT, GB_COUNT_NONE, GB_COUNT_BAD };
int gb_count(const char *p, size_t n, size_t *i, uint32_t max, uint32_t *mn, uint32_t *mx);
/* Marks r as defined even with no alternatives (an empty language). */
void gb_define(gb *b, uint32_t r);
void gb_seq_free(gb_seq *s);
uint32_t gb_class(gb *b, const uint8_t set[32]);
void gb_bytes(gb *b, gb_seq *s, const uint8_t set[32]);
void gb_byte(gb *b, gb_seq *s, uint8_t c);
void gb_lit(gb *b, gb_seq *s, const char *str, size_t n);
void gb_ref(gb *b, gb_seq *s, uint32_t rule);
void gb_repeat(gb *b, gb_seq *s, uint32_t rule, uint32_t min, uint32_t max);
/* A rule of one alternative: s. */
uint32_t gb_rule_of(gb *b, gb_seq *s);
/* A rule matching exactly the literal. */
uint32_t gb_rule_lit(gb *b, const char *str, size_t n);

/* A byte string s[0..n) (not owned). gb_str_cmp is a qsort comparator of gb_str: bytewise, a proper prefix
 * first. */
typedef struct gb_str { const char *s; size_t n; } gb_str;
int gb_str_cmp(const void *x, const void *y);

/* A rule matching one of n byte strings, factored as a trie (deterministic). */
uint32_t gb_rule_lits(gb *b, const char *const *strs, const size_t *lens, size_t n);
/* A rule matching one code point of the set given as n sorted, disjoint, inclusive ranges [2*i], [2*i+1]
 * (surrogates never match), as its UTF-8 bytes. */
uint32_t gb_rule_cp(gb *b, const uint32_t *ranges, size_t n);
/* Copies grammar g's rules in; returns the rule id of its root. */
uint32_t gb_import(gb *b, const gmr_grammar *g);
/* Checks (undefined rules, left recursion, empty repetitions, productivity), prunes alternatives that can never
 * finish and flattens into *out. b is left reusable only for gb_free. */
int gb_finish(gb *b, uint32_t root, gmr_grammar **out);

/* Writes code point c (<= 0x10FFFF) as UTF-8 into o (4 bytes of room); returns the length. */
int gmr_utf8_encode(uint32_t c, uint8_t *o);
/* The value of a hex digit, or -1. */
int gmr_hexval(char c);

/* Code point sets as range lists (sorted, disjoint). */
typedef struct gmr_cpset { uint32_t *r; size_t n, cap; } gmr_cpset;
int cps_add(gmr_cpset *s, uint32_t lo, uint32_t hi);   /* unsorted; cps_norm sorts and merges */
void cps_norm(gmr_cpset *s);
int cps_negate(gmr_cpset *s);                          /* complement in [0, 0x10FFFF] */
void cps_free(gmr_cpset *s);

/* A rule matching one code point of the set as JSON string content: the characters JSON needs escaped
 * ('"', '\\', controls) as their escapes, the others as raw UTF-8. Consumes (frees) the set. */
uint32_t gmr_json_cp_rule(gb *b, gmr_cpset *set);
/* The JSON Schema pattern (regex subset) as a rule over the JSON-encoded string content (no quotes); any_char is
 * the rule of one JSON string character (used where the pattern is not anchored). */
uint32_t gmr_regex_rule(gb *b, const char *pattern, uint32_t any_char);

/* JSON Schema compilation state shared by gmr_schema.c and gmr_schema_num.c */
typedef struct refmemo { const cJSON *node; uint32_t rule; } refmemo;

typedef struct sctx {
    gb *b;
    const cJSON *root;
    gmr_schema_options o;
    uint32_t r_wsc, r_jchar, r_value, r_string, r_number, r_integer, r_hex;
    refmemo *memo; size_t n_memo, cap_memo;
    int depth;
} sctx;
typedef struct bounds { double lo, hi; bool lo_ex, hi_ex; } bounds;
/* a rule matching one byte of `chars` or of lo..hi */
uint32_t gmr_class_rule(gb *b, const char *chars, char lo, char hi);
/* minimum / maximum / exclusive* of sch into bd */
int gmr_get_bounds(sctx *s, const cJSON *sch, bounds *bd);
uint32_t gmr_integer_rule(sctx *s, const bounds *bd, bool fail_empty);
uint32_t gmr_number_rule(sctx *s, const bounds *bd);

#endif
