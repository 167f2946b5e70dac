/* grammar.h: constrained decoding (prefix gmr_): JSON Schema or a small BNF compiled into a grammar, a
 * per-sequence matcher over bytes, and the allowed-token mask of each decoding step.
 *
 * Objects:
 *   gmr_grammar  a compiled grammar: rules over bytes (UTF-8 aware). Immutable once built: any thread may use it.
 *   gmr_vocab    a model's vocabulary as a token trie (built once per model), plus which tokens end generation
 *                (eog) and which are special/control. Immutable once built: shared by every matcher and thread.
 *   gmr_matcher  one sequence's position in the grammar (a set of parse stacks). Single-owner. Its clones share
 *                one mask cache (guarded by a mutex, so clones may live on different threads).
 * The grammar and the vocabulary must outlive every matcher made from them.
 *
 * How the sampler uses it, per decoding step of a constrained sequence:
 *   gmr_matcher_fill_mask(m, mask, n_words);      bit t of mask set = token t allowed
 *   gmr_mask_apply(mask, logits, n_vocab);        disallowed logits become -INFINITY, then sample as usual
 *   gmr_matcher_accept_token(m, token);           the chosen token (an eog token: the sequence is finished)
 * An eog token is allowed exactly when gmr_matcher_is_complete(); when the value is complete and nothing else can
 * follow, only eog tokens are allowed. An all-zero mask (a dead state: only after a grammar limit such as the
 * nesting depth cut every stack) means the sequence must be ended by the caller (finish_reason "length").
 * Special/control tokens are never allowed except eog ones; tokens whose piece is empty never are.
 * The mask depends only on the matcher's state, so it can be computed while the forward pass runs.
 * Masks are cached per grammar state in the cache a matcher shares with its clones: to keep it across requests
 * with the same schema, keep one matcher per (schema, model) as a template and clone it for each sequence.
 * Limits: a stack deeper than 2048 frames or a state of more than 512 parse stacks (ambiguity) drops the excess
 * (the language shrinks, it never grows), so work per byte stays bounded.
 *
 * Errors (kvs_err from common/common.h): KVS_ERR_INVALID (bad argument), KVS_ERR_NOMEM, KVS_ERR_FORMAT (the schema
 * is not a schema: a non-object where a schema must be, a bad $ref), KVS_ERR_SYNTAX (BNF or regex syntax),
 * KVS_ERR_UNSUPPORTED (a keyword or construct this compiler cannot honour; the message names it), KVS_ERR_LIMIT
 * (a hostile input: nesting, size, counts or a language with no finite value; the message says which).
 * Functions taking `err` write a one-line NUL-terminated message there on failure (err may be NULL).
 */
#ifndef KVSERVE_GRAMMAR_H
#define KVSERVE_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gmr_grammar gmr_grammar;
typedef struct gmr_vocab gmr_vocab;
typedef struct gmr_matcher gmr_matcher;

/* ---- grammars ------------------------------------------------------------------------------------------------ */

typedef struct gmr_schema_options {
    int32_t max_ws;        /* JSON whitespace allowed between two tokens: 0..32 bytes of [ \t\n] (default 4).
                              Bounded so that a model cannot loop on spaces. */
    int32_t max_digits;    /* digits of an integer part with no bound from the schema, 1..19 (default 16) */
    int32_t max_frac;      /* fraction digits of a number, 1..19 (default 8) */
    int32_t max_key_len;   /* length of an extra key allowed by additionalProperties (default 64) */
} gmr_schema_options;

void gmr_schema_options_default(gmr_schema_options *o);

/* Compiles a JSON Schema (a cJSON object, or the booleans true/false) into *out (free with gmr_grammar_free).
 * opts may be NULL (defaults). The output is one JSON value with no leading or trailing whitespace.
 *
 * Supported: type (object, array, string, number, integer, boolean, null, and arrays of them), OpenAPI
 * nullable, properties, required, additionalProperties (false; true/absent/a schema: extra keys after the
 * declared ones, keys of printable ASCII other than the declared names; an extra key may repeat), enum, const, anyOf, oneOf (as anyOf:
 * branches are not checked for overlap), allOf (merged when the branches' keywords do not conflict), $ref to "#",
 * "#/$defs/..." and "#/definitions/..." (recursion included), items, prefixItems, minItems, maxItems, minLength,
 * maxLength, pattern (a regex subset: literals, ., classes, \d \w \s \D \W \S, groups, |, ?, *, +, {m,n},
 * anchors ^ at the start and $ at the end; not together with min/maxLength), format date, time, date-time, uuid,
 * minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers and draft-4 booleans). Annotations are ignored
 * (title, description, default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly,
 * discriminator, and any key starting with "x-").
 * Property order: the declared properties appear in schema order; required ones always, optional ones may be
 * left out. Integer bounds are exact (digit by digit, int64 range). A bounded number is written without an
 * exponent; its integer part is bounded exactly and a fraction is allowed only where the whole unit interval
 * lies within the bounds (sound, not complete: bounds narrower than one unit around a non-integer fail with
 * KVS_ERR_UNSUPPORTED). Strings carry no \u escapes for surrogates or NUL.
 * enum and const go with type/nullable only (their values are not checked against other keywords).
 * Anything else (uniqueItems, contains, patternProperties, propertyNames, min/maxProperties, not, if/then/else,
 * dependent*, multipleOf, unknown keywords, other formats, ...) is KVS_ERR_UNSUPPORTED with the keyword named. */
int gmr_compile_schema(const cJSON *schema, const gmr_schema_options *opts, gmr_grammar **out, char *err,
                       size_t err_len);

/* The grammar of response_format {type: "json_object"}: any JSON object. */
int gmr_compile_json_object(const gmr_schema_options *opts, gmr_grammar **out, char *err, size_t err_len);

/* A grammar another grammar's BNF can reference by name: `@name` in the text stands for that grammar's
 * whole language (for instance a tool's parameter schema). */
typedef struct gmr_named_grammar {
    const char *name;           /* [A-Za-z_][A-Za-z0-9_-]* */
    const gmr_grammar *grammar; /* copied into the result: may be freed after the call */
} gmr_named_grammar;

/* Compiles a small BNF (GBNF-like) whose rule `root` is the language:
 *   rule   ::= NAME "::=" alternatives          (a rule may span lines; a new one starts at `NAME ::=`)
 *   alternatives: sequences separated by |; a sequence of items, each optionally followed by ?, *, + or {m},
 *   {m,}, {m,n}. Items: "literal" (escapes \n \r \t \\ \" \xHH \uXXXX), [class] ([^...] negated, ranges a-z,
 *   the same escapes; over Unicode code points), . (any code point), NAME (a rule), @NAME (a named grammar),
 *   ( alternatives ). # starts a comment to the end of the line.
 * Example, a Hermes/Qwen tool-call envelope:
 *   root ::= "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " @get_weather "}\n</tool_call>"
 * Errors: KVS_ERR_SYNTAX (with the line), KVS_ERR_NOT_FOUND (an undefined rule or @name), KVS_ERR_UNSUPPORTED
 * (left recursion, a repetition of something that can be empty), KVS_ERR_LIMIT (sizes, counts, no finite
 * string). */
int gmr_compile_bnf(const char *text, const gmr_named_grammar *named, size_t n_named, gmr_grammar **out, char *err,
                    size_t err_len);

void gmr_grammar_free(gmr_grammar *g);

/* ---- vocabularies -------------------------------------------------------------------------------------------- */

enum { GMR_TOKEN_EOG = 1, GMR_TOKEN_SPECIAL = 2 };

/* Builds the token trie. pieces[t] / lens[t] are the bytes of token t (copied; lens[t] <= 1024), flags[t] an OR of
 * GMR_TOKEN_* (flags may be NULL: none). 1 <= n_vocab <= 2^24. Errors: KVS_ERR_INVALID, KVS_ERR_NOMEM. */
int gmr_vocab_create(const char *const *pieces, const size_t *lens, const uint8_t *flags, int32_t n_vocab,
                     gmr_vocab **out);
void gmr_vocab_free(gmr_vocab *v);
int32_t gmr_vocab_size(const gmr_vocab *v);
/* 32-bit words a mask of this vocabulary needs: (n_vocab + 31) / 32. */
size_t gmr_mask_words(const gmr_vocab *v);

/* Sets logits[t] = -INFINITY for every token t whose bit is clear. */
void gmr_mask_apply(const uint32_t *mask, float *logits, int32_t n_vocab);

/* ---- matchers ------------------------------------------------------------------------------------------------ */

/* A matcher at the start of g. cache_bytes bounds the mask cache that the matcher and its clones share
 * (0: 32 MiB; when full it is emptied and refilled). Errors: KVS_ERR_INVALID, KVS_ERR_NOMEM. */
int gmr_matcher_create(const gmr_grammar *g, const gmr_vocab *v, size_t cache_bytes, gmr_matcher **out);
/* An independent copy at the same position (for n > 1), sharing the mask cache. */
int gmr_matcher_clone(const gmr_matcher *m, gmr_matcher **out);
void gmr_matcher_free(gmr_matcher *m);
/* The vocabulary the matcher was made with (NULL for a NULL matcher). */
const gmr_vocab *gmr_matcher_vocab(const gmr_matcher *m);
/* Back to the start of the grammar. */
void gmr_matcher_reset(gmr_matcher *m);

/* Writes the allowed-token mask (n_words >= gmr_mask_words, else KVS_ERR_INVALID). After an eog token was
 * accepted the mask is all zero. Errors: KVS_ERR_INVALID, KVS_ERR_NOMEM (also when one walk would need more than
 * 4M parse frames: a grammar too ambiguous to mask within bounded memory; end the sequence). */
int gmr_matcher_fill_mask(gmr_matcher *m, uint32_t *mask, size_t n_words);
/* Advances by one token. KVS_ERR_INVALID when the token is out of range or not allowed (the state is then
 * unchanged); accepting an eog token when complete finishes the matcher. */
int gmr_matcher_accept_token(gmr_matcher *m, int32_t token);
/* Whether the token would be accepted now, without changing the state (an eog token: iff complete). It costs
 * one token's bytes instead of a mask: a sampler may sample from the unmasked logits, keep the token when it is
 * allowed, and compute the mask only when it is not (then sample again from the masked logits). That draws from
 * the masked distribution exactly for greedy and plain temperature sampling; with top-k/top-p/min-p the
 * truncation then applies before the mask instead of after. false for an out-of-range token. */
bool gmr_matcher_allows(gmr_matcher *m, int32_t token);
/* Advances by raw bytes (for a prefill or a forced prefix); KVS_ERR_INVALID and no change when the grammar rejects
 * them. */
int gmr_matcher_accept_bytes(gmr_matcher *m, const char *bytes, size_t n);
/* Whether the bytes so far form a complete value (an eog token is allowed now). */
bool gmr_matcher_is_complete(const gmr_matcher *m);
/* Whether an eog token was accepted. */
bool gmr_matcher_is_finished(const gmr_matcher *m);

/* Statistics of the shared mask cache (for benchmarks): masks computed and masks served from the cache. */
void gmr_matcher_cache_stats(const gmr_matcher *m, uint64_t *computed, uint64_t *hits);

#ifdef __cplusplus
}
#endif
#endif /* KVSERVE_GRAMMAR_H */
