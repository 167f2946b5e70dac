/* test_grammar.c: grammar/grammar.h.
 *
 * The main test is differential: random schemas from a generator, a random walk that picks uniformly among the
 * tokens the mask allows until an eog token, the output checked by cJSON and by an independent validator written
 * here (pcre2 for patterns), and masks checked against a brute-force test of every token on a fresh byte-level
 * matcher. It runs over a real vocabulary (../shared qwen2, else a small built-in byte vocabulary). Then one test
 * per keyword (accepted and rejected strings), the rejected keywords, hostile schemas, BNF, and the matcher API. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "grammar/grammar.h"
#include "helper_rng.h"
#include "helper_shared.h"
#include "helper_vocab.h"

/* Under the sanitizers the walks are shorter (the same code, fewer random cases). */
#if defined(__SANITIZE_ADDRESS__)
#define SAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SAN_BUILD 1
#endif
#endif
#ifndef SAN_BUILD
#define SAN_BUILD 0
#endif

/* ---- helpers --------------------------------------------------------------------------------------------- */

static gmr_grammar *compile(const char *schema_json) {
    cJSON *s = cJSON_Parse(schema_json);
    cr_assert_not_null(s, "bad test schema %s", schema_json);
    gmr_grammar *g = NULL;
    char err[256];
    int rc = gmr_compile_schema(s, NULL, &g, err, sizeof err);
    cJSON_Delete(s);
    cr_assert_eq(rc, 0, "%s: %s (%d)", schema_json, err, rc);
    return g;
}

static int compile_err(const char *schema_json, char *err, size_t n) {
    cJSON *s = cJSON_Parse(schema_json);
    cr_assert_not_null(s, "bad test schema %s", schema_json);
    gmr_grammar *g = NULL;
    int rc = gmr_compile_schema(s, NULL, &g, err, n);
    cJSON_Delete(s);
    gmr_grammar_free(g);
    return rc;
}

/* The 256 single bytes, an eog token (id 256) and a few tokens longer than 16 bytes (the masks treat those
 * apart when repetition counts are clamped in the cache key). */
#define BYTE_VOCAB 263
static const char *const LONG_PIECES[BYTE_VOCAB - 257] = {
    "aaaaaaaaaaaaaaaaaaaa", "\"abcdefghijklmnopqrs\"", "                 ", "12345678901234567",
    "xyzxyzxyzxyzxyzxyzxyz\",", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"};

typedef struct bytevoc { const char *pieces[BYTE_VOCAB]; size_t lens[BYTE_VOCAB]; uint8_t flags[BYTE_VOCAB]; } bytevoc;

static void byte_pieces(bytevoc *bv) {
    static char bytes[256];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        bv->pieces[i] = &bytes[i];
        bv->lens[i] = 1;
        bv->flags[i] = 0;
    }
    bv->pieces[256] = "</s>";
    bv->lens[256] = 4;
    bv->flags[256] = GMR_TOKEN_EOG;
    for (int i = 257; i < BYTE_VOCAB; i++) {
        bv->pieces[i] = LONG_PIECES[i - 257];
        bv->lens[i] = strlen(bv->pieces[i]);
        bv->flags[i] = 0;
    }
}

static gmr_vocab *byte_vocab(void) {
    bytevoc bv;
    byte_pieces(&bv);
    gmr_vocab *v = NULL;
    cr_assert_eq(gmr_vocab_create(bv.pieces, bv.lens, bv.flags, BYTE_VOCAB, &v), 0);
    return v;
}

/* Whether the whole text is a complete value of g. */
static bool accepts(const gmr_grammar *g, const gmr_vocab *v, const char *text) {
    gmr_matcher *m = NULL;
    cr_assert_eq(gmr_matcher_create(g, v, 0, &m), 0);
    bool ok = gmr_matcher_accept_bytes(m, text, strlen(text)) == 0 && gmr_matcher_is_complete(m);
    gmr_matcher_free(m);
    return ok;
}

static void expect(const char *schema, const char *const *good, const char *const *bad) {
    gmr_vocab *v = byte_vocab();
    gmr_grammar *g = compile(schema);
    for (; good && *good; good++) cr_expect(accepts(g, v, *good), "%s should accept %s", schema, *good);
    for (; bad && *bad; bad++) cr_expect(!accepts(g, v, *bad), "%s should reject %s", schema, *bad);
    gmr_grammar_free(g);
    gmr_vocab_free(v);
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- an independent validator ------------------------------------------------------------------------------------ */

static size_t utf8_count(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* JSON Schema patterns are ECMA-262 regexes, whose \s is Unicode white space (pcre2's is ASCII unless UCP, which
 * would also widen \d and \w): \s outside a class is spelled out. */
static bool regex_search(const char *pattern, const char *subject) {
    kvs_buf p = {0};
    for (const char *c = pattern; *c; c++) {
        if (c[0] == '\\' && c[1] == 's') {
            kvs_buf_puts(&p, "[\\t\\n\\v\\f\\r \\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}"
                             "\\x{3000}\\x{feff}]");
            c++;
        } else {
            if (c[0] == '\\' && c[1]) kvs_buf_putc(&p, *c++);
            kvs_buf_putc(&p, *c);
        }
    }
    cr_assert(!p.oom);
    int errc;
    PCRE2_SIZE eoff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)p.data, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &errc, &eoff, NULL);
    kvs_buf_free(&p);
    cr_assert_not_null(re, "pcre2 cannot compile %s", pattern);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)subject, strlen(subject), 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

static bool digits(const char *s, int n) {
    for (int i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

static bool valid_date(const char *s) {
    if (strlen(s) < 10 || !digits(s, 4) || s[4] != '-' || !digits(s + 5, 2) || s[7] != '-' || !digits(s + 8, 2)) return false;
    int y = atoi(s), mo = atoi(s + 5), d = atoi(s + 8);
    static const int dim[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int max = mo >= 1 && mo <= 12 ? dim[mo - 1] : 0;
    if (mo == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0)) max = 29;
    return d >= 1 && d <= max;
}

static bool valid_time(const char *s) {
    if (!digits(s, 2) || s[2] != ':' || !digits(s + 3, 2) || s[5] != ':' || !digits(s + 6, 2)) return false;
    if (atoi(s) > 23 || atoi(s + 3) > 59 || atoi(s + 6) > 60) return false;
    s += 8;
    if (*s == '.') {
        s++;
        if (!digits(s, 1)) return false;
        while (*s >= '0' && *s <= '9') s++;
    }
    if (!strcmp(s, "Z")) return true;
    return (s[0] == '+' || s[0] == '-') && digits(s + 1, 2) && s[3] == ':' && digits(s + 4, 2) && !s[6] &&
           atoi(s + 1) <= 23 && atoi(s + 4) <= 59;
}

static bool valid_uuid(const char *s) {
    if (strlen(s) != 36) return false;
    for (int i = 0; i < 36; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? s[i] != '-' : !strchr("0123456789abcdefABCDEF", s[i])) return false;
    }
    return true;
}

static bool type_ok(const cJSON *v, const char *t) {
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    return false;
}

static bool validate(const cJSON *root, const cJSON *s, const cJSON *v);

static bool validate(const cJSON *root, const cJSON *s, const cJSON *v) {
    if (cJSON_IsTrue(s)) return true;
    if (cJSON_IsFalse(s)) return false;
    const cJSON *k;
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) {
        const char *r = k->valuestring;
        cr_assert(!strncmp(r, "#/$defs/", 8) || !strcmp(r, "#"), "validator: ref %s", r);
        const cJSON *t = !strcmp(r, "#") ? root : cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "$defs"), r + 8);
        return validate(root, t, v);
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "anyOf"))) {
        bool any = false;
        for (const cJSON *b = k->child; b && !any; b = b->next) any = validate(root, b, v);
        if (!any) return false;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "type"))) {
        bool ok = false;
        if (cJSON_IsString(k)) ok = type_ok(v, k->valuestring);
        else
            for (const cJSON *t = k->child; t && !ok; t = t->next) ok = type_ok(v, t->valuestring);
        if (!ok) return false;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        bool ok = false;
        for (const cJSON *e = k->child; e && !ok; e = e->next) ok = cJSON_Compare(e, v, true);
        if (!ok) return false;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "const")) && !cJSON_Compare(k, v, true)) return false;
    if (cJSON_IsNumber(v)) {
        double x = v->valuedouble;
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "minimum")) && x < k->valuedouble) return false;
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "maximum")) && x > k->valuedouble) return false;
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum")) && x <= k->valuedouble) return false;
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum")) && x >= k->valuedouble) return false;
    }
    if (cJSON_IsString(v)) {
        size_t n = utf8_count(v->valuestring);
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "minLength")) && n < (size_t)k->valuedouble) return false;
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "maxLength")) && n > (size_t)k->valuedouble) return false;
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "pattern")) && !regex_search(k->valuestring, v->valuestring))
            return false;
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "format"))) {
            const char *f = k->valuestring, *x = v->valuestring;
            if (!strcmp(f, "date") && !(strlen(x) == 10 && valid_date(x))) return false;
            if (!strcmp(f, "time") && !valid_time(x)) return false;
            if (!strcmp(f, "uuid") && !valid_uuid(x)) return false;
            if (!strcmp(f, "date-time") && !(strlen(x) > 11 && valid_date(x) && x[10] == 'T' && valid_time(x + 11)))
                return false;
        }
    }
    if (cJSON_IsArray(v)) {
        int n = cJSON_GetArraySize(v);
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "minItems")) && n < k->valueint) return false;
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "maxItems")) && n > k->valueint) return false;
        const cJSON *pre = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        int np = pre ? cJSON_GetArraySize(pre) : 0, i = 0;
        for (const cJSON *e = v->child; e; e = e->next, i++) {
            const cJSON *es = i < np ? cJSON_GetArrayItem(pre, i) : items;
            if (es && !validate(root, es, e)) return false;
        }
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        for (const cJSON *e = v->child; e; e = e->next) {
            const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, e->string) : NULL;
            for (const cJSON *f = v->child; f != e && ps; f = f->next)   /* a declared key appears once; */
                if (!strcmp(f->string, e->string)) return false;        /* extra keys may repeat (documented) */
            if (ps) {
                if (!validate(root, ps, e)) return false;
            } else if (ap && !validate(root, ap, e)) {
                return false;
            }
        }
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "required")))
            for (const cJSON *r = k->child; r; r = r->next)
                if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring)) return false;
    }
    return true;
}

/* ---- a random schema generator ---------------------------------------------------------------------------------- */

static const char *const PATTERNS[] = {"^[a-z]{2,5}$", "^\\d{3}-\\d{2}$", "ab", "^(foo|bar)+$", "^[A-F0-9]+$",
                                       "^\\w+@\\w+\\.com$", "x.y", "^[^\"\\\\]{1,4}$", "^(?:a|bc)?d$", "^é[ü-ÿ]$",
                                       "^\\s?[\"\\\\q]{2}$"};

static cJSON *gen_schema(rng *r, int depth, bool *has_defs);

static cJSON *gen_leaf(rng *r) {
    cJSON *s = cJSON_CreateObject();
    switch (rng_int(r, 9)) {
    case 0: cJSON_AddStringToObject(s, "type", rng_int(r, 2) ? "null" : "boolean"); break;
    case 1: {
        cJSON_AddStringToObject(s, "type", "integer");
        int lo = rng_int(r, 2000) - 1000, w = rng_int(r, 3) ? rng_int(r, 300) : rng_int(r, 100000);
        int form = rng_int(r, 4);
        if (form == 0 || form == 2) cJSON_AddNumberToObject(s, rng_int(r, 3) ? "minimum" : "exclusiveMinimum", lo);
        if (form == 1 || form == 2) cJSON_AddNumberToObject(s, rng_int(r, 3) ? "maximum" : "exclusiveMaximum", lo + w + 2);
        break;
    }
    case 2: {
        cJSON_AddStringToObject(s, "type", "number");
        double lo = (rng_int(r, 400) - 200) / 4.0, w = 1 + rng_int(r, 200) / 2.0;
        int form = rng_int(r, 4);
        if (form == 0 || form == 2) cJSON_AddNumberToObject(s, rng_int(r, 3) ? "minimum" : "exclusiveMinimum", lo);
        if (form == 1 || form == 2) cJSON_AddNumberToObject(s, rng_int(r, 3) ? "maximum" : "exclusiveMaximum", lo + w + 1.5);
        break;
    }
    case 3: case 4: {
        cJSON_AddStringToObject(s, "type", "string");
        int mn = rng_int(r, 5) ? rng_int(r, 4) : 15 + rng_int(r, 6);   /* sometimes above the clamp of 16 */
        if (rng_int(r, 2) || mn > 3) cJSON_AddNumberToObject(s, "minLength", mn);
        cJSON_AddNumberToObject(s, "maxLength", mn + (rng_int(r, 3) ? rng_int(r, 8) : 14 + rng_int(r, 30)));
        break;
    }
    case 5: {
        cJSON_AddStringToObject(s, "type", "string");
        if (rng_int(r, 2)) {
            static const char *const fmts[] = {"date", "time", "date-time", "uuid"};
            cJSON_AddStringToObject(s, "format", fmts[rng_int(r, 4)]);
        } else {
            cJSON_AddStringToObject(s, "pattern", PATTERNS[rng_int(r, (int)(sizeof PATTERNS / sizeof *PATTERNS))]);
        }
        break;
    }
    case 6: {
        cJSON *e = cJSON_AddArrayToObject(s, "enum");
        cJSON_AddItemToArray(e, cJSON_CreateString("red"));
        cJSON_AddItemToArray(e, cJSON_CreateString("re\"d\n"));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(rng_int(r, 100)));
        if (rng_int(r, 2)) cJSON_AddItemToArray(e, cJSON_CreateNull());
        if (rng_int(r, 2)) cJSON_AddItemToArray(e, cJSON_Parse("{\"a\":[1,true]}"));
        break;
    }
    case 7: cJSON_AddItemToObject(s, "const", rng_int(r, 2) ? cJSON_CreateString("fixed ü") : cJSON_CreateNumber(42)); break;
    default: {
        cJSON *t = cJSON_AddArrayToObject(s, "type");
        cJSON_AddItemToArray(t, cJSON_CreateString("string"));
        cJSON_AddItemToArray(t, cJSON_CreateString("null"));
        cJSON_AddNumberToObject(s, "maxLength", 3);
    }
    }
    return s;
}

static cJSON *gen_schema(rng *r, int depth, bool *has_defs) {
    int k = depth <= 0 ? 0 : rng_int(r, 6);
    if (k <= 1) return gen_leaf(r);
    cJSON *s = cJSON_CreateObject();
    if (k == 2 || k == 3) {
        cJSON_AddStringToObject(s, "type", "object");
        cJSON *p = cJSON_AddObjectToObject(s, "properties"), *req = cJSON_AddArrayToObject(s, "required");
        int n = 1 + rng_int(r, 4);
        for (int i = 0; i < n; i++) {
            char name[16];
            snprintf(name, sizeof name, i == 2 ? "p%d\"q" : "p%d", i);
            cJSON_AddItemToObject(p, name, gen_schema(r, depth - 1, has_defs));
            if (rng_int(r, 2)) cJSON_AddItemToArray(req, cJSON_CreateString(name));
        }
        int ap = rng_int(r, 4);
        if (ap == 0) cJSON_AddBoolToObject(s, "additionalProperties", false);
        else if (ap == 1) cJSON_AddItemToObject(s, "additionalProperties", gen_leaf(r));
        else if (ap == 2) cJSON_AddBoolToObject(s, "additionalProperties", true);
    } else if (k == 4) {
        cJSON_AddStringToObject(s, "type", "array");
        if (rng_int(r, 3) == 0) {
            cJSON *pre = cJSON_AddArrayToObject(s, "prefixItems");
            cJSON_AddItemToArray(pre, gen_leaf(r));
            cJSON_AddItemToArray(pre, gen_leaf(r));
            if (rng_int(r, 2)) cJSON_AddBoolToObject(s, "items", false);
        } else {
            cJSON_AddItemToObject(s, "items", gen_schema(r, depth - 1, has_defs));
        }
        int mn = rng_int(r, 3);
        if (rng_int(r, 2)) cJSON_AddNumberToObject(s, "minItems", mn);
        cJSON_AddNumberToObject(s, "maxItems", mn + rng_int(r, 4));
    } else {
        if (rng_int(r, 2)) {
            cJSON *a = cJSON_AddArrayToObject(s, "anyOf");
            cJSON_AddItemToArray(a, gen_schema(r, depth - 1, has_defs));
            cJSON_AddItemToArray(a, gen_leaf(r));
        } else {
            cJSON_AddStringToObject(s, "$ref", "#/$defs/node");
            *has_defs = true;
        }
    }
    return s;
}

/* A random schema, sometimes with a recursive $defs/node (a tree of names with bounded children). */
static cJSON *gen_root(rng *r) {
    bool defs = false;
    cJSON *s = gen_schema(r, 3, &defs);
    if (defs) {
        cJSON *d = cJSON_AddObjectToObject(s, "$defs");
        cJSON *node = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":4},"
                                  "\"kids\":{\"type\":\"array\",\"maxItems\":2,\"items\":{\"$ref\":\"#/$defs/node\"}}},"
                                  "\"required\":[\"name\"],\"additionalProperties\":false}");
        cJSON_AddItemToObject(d, "node", node);
    }
    return s;
}

/* ---- the differential walk ------------------------------------------------------------------------------------------ */

typedef struct walk_stats { int runs, finished, steps, checked; } walk_stats;

static bool bit(const uint32_t *m, int32_t t) { return m[t >> 5] >> (t & 31) & 1; }

/* Brute force: token t is allowed iff a fresh copy of m accepts its bytes (eog: iff m is complete). */
static void brute_check(gmr_matcher *m, const uint32_t *mask, const char *const *pieces, const size_t *lens,
                        const uint8_t *flags, int32_t n_vocab, const char *ctx) {
    for (int32_t t = 0; t < n_vocab; t++) {
        bool want;
        if (flags[t] & GMR_TOKEN_EOG) want = gmr_matcher_is_complete(m);
        else if ((flags[t] & GMR_TOKEN_SPECIAL) || !lens[t]) want = false;
        else {
            gmr_matcher *c = NULL;
            cr_assert_eq(gmr_matcher_clone(m, &c), 0);
            want = gmr_matcher_accept_bytes(c, pieces[t], lens[t]) == 0;
            gmr_matcher_free(c);
        }
        if (gmr_matcher_allows(m, t) != want)
            cr_assert_fail("%s: token %d [%.*s]: allows says %d, brute force %d", ctx, t, (int)lens[t], pieces[t],
                           !want, want);
        if (want != bit(mask, t))
            cr_assert_fail("%s: token %d [%.*s]: mask says %d, brute force %d", ctx, t, (int)lens[t], pieces[t],
                           bit(mask, t), want);
    }
}

static void run_walks(const gmr_vocab *v, const char *const *pieces, const size_t *lens, const uint8_t *flags,
                      int32_t n_vocab, int n_schemas, int max_steps, int check_every, uint64_t seed, walk_stats *st) {
    rng r = {seed};
    size_t words = gmr_mask_words(v);
    uint32_t *mask = malloc(words * sizeof *mask);
    int32_t *allowed = malloc((size_t)n_vocab * sizeof *allowed);
    cr_assert(mask && allowed);
    for (int si = 0; si < n_schemas; si++) {
        cJSON *schema = gen_root(&r);
        char *stext = cJSON_PrintUnformatted(schema);
        gmr_grammar *g = NULL;
        char err[256];
        int rc = gmr_compile_schema(schema, NULL, &g, err, sizeof err);
        cr_assert_eq(rc, 0, "schema %s: %s", stext, err);
        gmr_matcher *base = NULL;
        cr_assert_eq(gmr_matcher_create(g, v, 0, &base), 0);
        for (int run = 0; run < 3; run++) {   /* clones share the cache: later runs hit it */
            gmr_matcher *m = NULL;
            cr_assert_eq(gmr_matcher_clone(base, &m), 0);
            char out[65536];
            size_t n_out = 0;
            bool done = false;
            for (int step = 0; step < max_steps && !done; step++) {
                cr_assert_eq(gmr_matcher_fill_mask(m, mask, words), 0);
                if (check_every && step % check_every == 0) {
                    char ctx[200];
                    snprintf(ctx, sizeof ctx, "schema %.120s after [%.*s]", stext, (int)(n_out < 40 ? n_out : 40),
                             out + (n_out < 40 ? 0 : n_out - 40));
                    brute_check(m, mask, pieces, lens, flags, n_vocab, ctx);
                    st->checked++;
                }
                int na = 0;
                for (int32_t t = 0; t < n_vocab; t++)
                    if (bit(mask, t)) allowed[na++] = t;
                cr_assert_gt(na, 0, "schema %s: dead state after [%.*s]", stext, (int)n_out, out);
                int32_t t = allowed[rng_int(&r, na)];
                cr_assert_eq(gmr_matcher_accept_token(m, t), 0);
                st->steps++;
                if (flags[t] & GMR_TOKEN_EOG) {
                    done = true;
                    break;
                }
                if (n_out + lens[t] >= sizeof out) break;
                memcpy(out + n_out, pieces[t], lens[t]);
                n_out += lens[t];
                /* when the value is complete and nothing else can follow, only eog is allowed */
            }
            st->runs++;
            if (done) {
                st->finished++;
                out[n_out] = 0;
                cr_assert(gmr_matcher_is_finished(m));
                cJSON *val = cJSON_ParseWithLength(out, n_out);
                cr_assert_not_null(val, "schema %s: output is not JSON: %s", stext, out);
                cr_assert(validate(schema, schema, val), "schema %s: output does not validate: %s", stext, out);
                if (getenv("GMR_TEST_SHOW")) fprintf(stderr, "%s\n  -> %s\n", stext, out);
                cJSON_Delete(val);
            }
            gmr_matcher_free(m);
        }
        gmr_matcher_free(base);
        gmr_grammar_free(g);
        cJSON_free(stext);
        cJSON_Delete(schema);
    }
    free(mask);
    free(allowed);
}

Test(grammar, differential_byte_vocab) {
    gmr_vocab *v = byte_vocab();
    bytevoc bv;
    byte_pieces(&bv);
    walk_stats st = {0};
    run_walks(v, bv.pieces, bv.lens, bv.flags, BYTE_VOCAB, SAN_BUILD ? 30 : 80, 3000, 1, 0x9E3779B97F4A7C15ULL, &st);
    cr_log_info("byte vocabulary: %d walks, %d finished, %d steps, %d masks brute-forced", st.runs, st.finished,
                st.steps, st.checked);
    cr_expect_geq(st.finished * 10, st.runs * 8, "too few walks finished: %d of %d", st.finished, st.runs);
    gmr_vocab_free(v);
}

Test(grammar, differential_qwen2_vocab, .timeout = 600) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/vocab-only/ggml-vocab-qwen2.gguf", kvt_shared_dir());
    FILE *f = fopen(path, "rb");
    if (!f) cr_skip_test("%s not found (no ../shared): the real-vocabulary walk is skipped; the byte vocabulary one ran", path);
    fclose(f);
    char err[512];
    gmr_vocab *v = NULL;
    kvt_pieces pc;
    cr_assert_eq(kvt_load_vocab_pieces(path, &v, &pc, err, sizeof err), 0, "%s", err);
    walk_stats st = {0};
    run_walks(v, (const char *const *)pc.pieces, pc.lens, pc.flags, pc.n, SAN_BUILD ? 3 : 8, 800, SAN_BUILD ? 150 : 40, 0x2545F4914F6CDD1DULL, &st);
    cr_log_info("qwen2 vocabulary: %d walks, %d finished, %d steps, %d masks brute-forced", st.runs, st.finished,
                st.steps, st.checked);
    cr_expect_geq(st.finished * 10, st.runs * 6, "too few walks finished: %d of %d", st.finished, st.runs);
    kvt_pieces_free(&pc);
    gmr_vocab_free(v);
}

/* ---- keywords ------------------------------------------------------------------------------------------------------ */

Test(grammar, types) {
    expect("{\"type\":\"null\"}", L("null"), L("nul", "null ", " null", "0", "\"null\""));
    expect("{\"type\":\"boolean\"}", L("true", "false"), L("tru", "True", "1"));
    expect("{\"type\":[\"boolean\",\"null\"]}", L("true", "null"), L("0"));
    expect("{\"type\":\"string\",\"nullable\":true}", L("\"x\"", "null"), L("1"));
    expect("{\"type\":\"string\"}", L("\"\"", "\"a b\"", "\"\\n\\u00e9\\\"\"", "\"é☃😀\"", "\"\\/\""),
           L("\"a", "\"\\x\"", "\"\\ud800\"", "\"\\u0000\"", "\"a\nb\"", "'a'", "\"\xff\"", "\"\xc3\""));
    expect("{\"type\":\"integer\"}", L("0", "-7", "123456"), L("01", "-0", "1.5", "1e3", "+1", "-", "12345678901234567"));
    expect("{\"type\":\"number\"}", L("0", "-7.25", "1e5", "1.5E-3", "0.0"), L("01", ".5", "1.", "1e", "--1", "NaN"));
    expect("{}", L("{\"a\":[1,{\"b\":null}]}", "\"s\"", "1", "[]", "{ }"), L("{,}", "[1,]", "{\"a\"}"));
    expect("true", L("1", "[]"), L("x"));
}

Test(grammar, objects) {
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"},"
                    "\"c\":{\"type\":\"boolean\"}},\"required\":[\"b\"],\"additionalProperties\":false}";
    expect(s, L("{\"b\":\"x\"}", "{\"a\":1,\"b\":\"x\"}", "{\"a\":1,\"b\":\"x\",\"c\":true}", "{ \"b\" : \"x\" , \"c\" : false }"),
           L("{}", "{\"a\":1}", "{\"b\":\"x\",\"a\":1}", "{\"b\":\"x\",\"d\":1}", "{\"b\":\"x\",}", "{\"b\":\"x\"} "));
    /* additionalProperties absent / true: extra keys after the declared ones, never a declared name */
    s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}";
    expect(s, L("{}", "{\"a\":1}", "{\"a\":1,\"zz\":[true]}", "{\"ab\":\"x\"}", "{\"\":1}", "{\"x\":{},\"y\":2}"),
           L("{\"a\":\"x\"}", "{\"a\":1,\"a\":2}", "{\"zz\":1,\"a\":\"s\"}"));
    s = "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}";
    expect(s, L("{}", "{\"k\":1,\"j\":2}"), L("{\"k\":\"v\"}"));
    /* required names not among properties: any value */
    s = "{\"type\":\"object\",\"required\":[\"id\"]}";
    expect(s, L("{\"id\":[1]}", "{\"id\":1,\"x\":2}"), L("{}", "{\"x\":2}"));
}

Test(grammar, required_but_forbidden_is_an_error) {
    char err[256];
    int rc = compile_err("{\"type\":\"object\",\"required\":[\"id\"],\"additionalProperties\":false}", err, sizeof err);
    cr_assert_eq(rc, KVS_ERR_LIMIT, "%d %s", rc, err);
    cr_assert(strstr(err, "no finite value"), "%s", err);
}

Test(grammar, arrays) {
    const char *s = "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}";
    expect(s, L("[1]", "[1,2,3]", "[ 1 , 2 ]"), L("[]", "[1,2,3,4]", "[\"a\"]", "[1,]"));
    s = "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}";
    expect(s, L("[]", "[\"a\"]", "[\"a\",1]"), L("[1]", "[\"a\",1,2]"));
    s = "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"}],\"items\":{\"type\":\"null\"},\"minItems\":2}";
    expect(s, L("[\"a\",null]", "[\"a\",null,null]"), L("[\"a\"]", "[null,null]"));
    expect("{\"type\":\"array\"}", L("[]", "[1,\"a\",[{}]]"), L("[", "[1 2]"));
    expect("{\"type\":\"array\",\"maxItems\":0}", L("[]"), L("[1]"));
}

Test(grammar, strings) {
    expect("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", L("\"ab\"", "\"abc\"", "\"é\\n\"", "\"😀😀\""),
           L("\"a\"", "\"abcd\"", "\"\""));
    expect("{\"type\":\"string\",\"pattern\":\"^[a-c]+x?$\"}", L("\"a\"", "\"abcx\""), L("\"\"", "\"ad\"", "\"x\""));
    expect("{\"type\":\"string\",\"pattern\":\"b\\\\d\"}", L("\"b1\"", "\"ab9c\""), L("\"b\"", "\"ba\""));
    expect("{\"type\":\"string\",\"pattern\":\"^a{2,3}(b|cd)*$\"}", L("\"aa\"", "\"aaacdb\""), L("\"a\"", "\"aaaa\""));
    expect("{\"type\":\"string\",\"pattern\":\"^[^a-z]\\\\s\\\\W.$\"}", L("\"A !x\"", "\"\\\"\\t!\\\\\""), L("\"a !x\"", "\"A !\\n\""));
    expect("{\"type\":\"string\",\"pattern\":\"^\\\"\\\\\\\\$\"}", L("\"\\\"\\\\\""), L("\"\\\"\""));
    expect("{\"type\":\"string\",\"format\":\"date\"}", L("\"2024-02-28\"", "\"1999-12-31\""),
           L("\"2024-02-30\"", "\"2024-13-01\"", "\"2024-04-31\"", "\"24-01-01\""));
    expect("{\"type\":\"string\",\"format\":\"time\"}", L("\"23:59:59Z\"", "\"01:02:03.5+05:30\""), L("\"24:00:00Z\"", "\"01:02:03\""));
    expect("{\"type\":\"string\",\"format\":\"date-time\"}", L("\"2024-01-01T00:00:00Z\""), L("\"2024-01-01 00:00:00Z\""));
    expect("{\"type\":\"string\",\"format\":\"uuid\"}", L("\"123e4567-e89b-12d3-a456-426614174000\""),
           L("\"123e4567e89b12d3a456426614174000\""));
}

Test(grammar, enum_const) {
    expect("{\"enum\":[\"a\",\"ab\",1,null,{\"x\":[true]}]}", L("\"a\"", "\"ab\"", "1", "null", "{\"x\":[true]}"),
           L("\"b\"", "2", "{\"x\":[false]}", "\"abc\""));
    expect("{\"type\":\"string\",\"enum\":[\"a\",1]}", L("\"a\""), L("1"));
    expect("{\"const\":\"é\\n\"}", L("\"é\\n\""), L("\"é\""));
}

Test(grammar, combinators) {
    expect("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":1}]}", L("5", "\"a\""), L("\"ab\"", "true"));
    expect("{\"oneOf\":[{\"type\":\"null\"},{\"type\":\"boolean\"}]}", L("null", "true"), L("0"));
    expect("{\"type\":\"object\",\"required\":[\"k\"],\"anyOf\":[{\"properties\":{\"k\":{\"const\":1}}},"
           "{\"properties\":{\"k\":{\"const\":2}}}],\"additionalProperties\":false}",
           L("{\"k\":1}", "{\"k\":2}"), L("{\"k\":3}", "{}"));
    expect("{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
           "{\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}]}",
           L("{\"a\":1,\"b\":\"x\"}"), L("{\"a\":1}", "{\"b\":\"x\"}"));
    expect("{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"$ref\":\"#/$defs/n\"}},"
           "\"required\":[\"v\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/n\"}",
           L("{\"v\":1}", "{\"v\":1,\"next\":{\"v\":2,\"next\":{\"v\":3}}}"), L("{\"v\":1,\"next\":{}}"));
    expect("{\"definitions\":{\"a~b/c\":{\"type\":\"null\"}},\"$ref\":\"#/definitions/a~0b~1c\"}", L("null"), L("1"));
    expect("{\"type\":\"array\",\"items\":{\"$ref\":\"#\"},\"maxItems\":2}", L("[]", "[[],[[]]]"), L("[1]"));
}

/* Every integer in [lo - 30, hi + 30] is accepted exactly when it is within the bounds. */
Test(grammar, integer_bounds_exhaustive) {
    gmr_vocab *v = byte_vocab();
    rng r = {12345};
    for (int k = 0; k < 40; k++) {
        long lo = rng_int(&r, 4000) - 2000, hi = lo + rng_int(&r, k < 20 ? 30 : 3000);
        int form = rng_int(&r, 3);   /* 0 both, 1 minimum only, 2 maximum only */
        char sch[200];
        bool exl = rng_int(&r, 2), exh = rng_int(&r, 2);
        snprintf(sch, sizeof sch, "{\"type\":\"integer\"%s%s%ld%s%s%ld}", form != 2 ? "," : "",
                 form != 2 ? (exl ? "\"exclusiveMinimum\":" : "\"minimum\":") : "", form != 2 ? lo : 0L,
                 form != 1 ? "," : "", form != 1 ? (exh ? "\"exclusiveMaximum\":" : "\"maximum\":") : "", form != 1 ? hi : 0L);
        /* drop the dangling number of an absent bound */
        char clean[200];
        if (form == 1) snprintf(clean, sizeof clean, "{\"type\":\"integer\",%s%ld}", exl ? "\"exclusiveMinimum\":" : "\"minimum\":", lo);
        else if (form == 2) snprintf(clean, sizeof clean, "{\"type\":\"integer\",%s%ld}", exh ? "\"exclusiveMaximum\":" : "\"maximum\":", hi);
        else snprintf(clean, sizeof clean, "%s", sch);
        if (form == 0 && (exl || exh) && hi - lo < 2) continue;
        gmr_grammar *g = compile(clean);
        for (long x = lo - 30; x <= hi + 30; x++) {
            bool in = (form == 2 || (exl ? x > lo : x >= lo)) && (form == 1 || (exh ? x < hi : x <= hi));
            char t[32];
            snprintf(t, sizeof t, "%ld", x);
            cr_assert_eq(accepts(g, v, t), in, "%s: %ld", clean, x);
        }
        gmr_grammar_free(g);
    }
    gmr_vocab_free(v);
}

Test(grammar, number_bounds) {
    gmr_vocab *v = byte_vocab();
    rng r = {777};
    for (int k = 0; k < 30; k++) {
        double lo = (rng_int(&r, 80) - 40) / 4.0, hi = lo + 1 + rng_int(&r, 40) / 4.0;
        bool exl = rng_int(&r, 2), exh = rng_int(&r, 2);
        char sch[200];
        snprintf(sch, sizeof sch, "{\"type\":\"number\",\"%s\":%g,\"%s\":%g}", exl ? "exclusiveMinimum" : "minimum", lo,
                 exh ? "exclusiveMaximum" : "maximum", hi);
        gmr_grammar *g = compile(sch);
        int n_in = 0;
        for (int i = -200; i <= 200; i++) {   /* x = i / 8 written plainly, and with one more decimal */
            double x = i / 8.0;
            char t[40];
            snprintf(t, sizeof t, "%g", x);
            bool in = (exl ? x > lo : x >= lo) && (exh ? x < hi : x <= hi);
            if (accepts(g, v, t)) {
                cr_assert(in, "%s accepts %s", sch, t);
                n_in++;
            }
        }
        cr_assert_gt(n_in, 0, "%s accepts nothing", sch);
        gmr_grammar_free(g);
    }
    expect("{\"type\":\"number\",\"minimum\":0.5,\"maximum\":2.5}", L("1", "2", "1.5", "1.999"), L("0.5", "2.5", "3", "0", "1e0"));
    gmr_vocab_free(v);
}

/* ---- rejected keywords and hostile schemas ---------------------------------------------------------------------------- */

Test(grammar, rejected_keywords) {
    static const char *const cases[][2] = {
        {"{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems"},
        {"{\"type\":\"array\",\"contains\":{}}", "contains"},
        {"{\"type\":\"object\",\"patternProperties\":{}}", "patternProperties"},
        {"{\"type\":\"object\",\"propertyNames\":{}}", "propertyNames"},
        {"{\"type\":\"object\",\"minProperties\":1}", "minProperties"},
        {"{\"type\":\"object\",\"maxProperties\":1}", "maxProperties"},
        {"{\"not\":{}}", "not"},
        {"{\"if\":{},\"then\":{}}", "if"},
        {"{\"type\":\"number\",\"multipleOf\":2}", "multipleOf"},
        {"{\"type\":\"object\",\"dependentRequired\":{}}", "dependentRequired"},
        {"{\"type\":\"string\",\"format\":\"email\"}", "email"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreference"},
        {"{\"type\":\"string\",\"pattern\":\"a(?=b)\"}", "lookaround"},
        {"{\"type\":\"string\",\"pattern\":\"\\\\bx\"}", "\\b"},
        {"{\"type\":\"string\",\"pattern\":\"a^b\"}", "anchor"},
        {"{\"type\":\"string\",\"pattern\":\"^a|b$\"}", "alternation"},
        {"{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}", "pattern"},
        {"{\"$ref\":\"http://example.com/s.json\"}", "$ref"},
        {"{\"type\":\"unicorn\"}", "unicorn"},
        {"{\"type\":\"number\",\"minimum\":0.25,\"maximum\":0.75}", "minimum/maximum"},
        {"{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", "allOf"},
        {"{\"$ref\":\"#/$defs/x\",\"type\":\"string\",\"$defs\":{\"x\":{}}}", "$ref"},
        {"{\"type\":\"string\",\"enum\":[\"abc\"],\"maxLength\":2}", "maxLength"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[256] = "";
        int rc = compile_err(cases[i][0], err, sizeof err);
        cr_expect_eq(rc, KVS_ERR_UNSUPPORTED, "%s: %d (%s)", cases[i][0], rc, err);
        cr_expect(strstr(err, cases[i][1]), "%s: message '%s' does not name %s", cases[i][0], err, cases[i][1]);
    }
    char err[256];
    cr_expect_eq(compile_err("{\"type\":3}", err, sizeof err), KVS_ERR_FORMAT);
    cr_expect_eq(compile_err("{\"$ref\":\"#/$defs/missing\"}", err, sizeof err), KVS_ERR_FORMAT);
    cr_expect_eq(compile_err("{\"type\":\"string\",\"pattern\":\"(a\"}", err, sizeof err), KVS_ERR_SYNTAX);
    cr_expect_eq(compile_err("{\"type\":\"string\",\"pattern\":\"(a*)*\"}", err, sizeof err), KVS_ERR_UNSUPPORTED);
    cr_expect_eq(compile_err("[1]", err, sizeof err), KVS_ERR_FORMAT);
}

Test(grammar, hostile_schemas) {
    char err[256];
    /* deep nesting */
    kvs_buf b = {0};
    for (int i = 0; i < 500; i++) kvs_buf_puts(&b, "{\"type\":\"array\",\"items\":");
    kvs_buf_puts(&b, "{}");
    for (int i = 0; i < 500; i++) kvs_buf_puts(&b, "}");
    cr_assert_eq(compile_err(b.data, err, sizeof err), KVS_ERR_LIMIT, "%s", err);
    cr_assert(strstr(err, "deeper"), "%s", err);
    /* a huge enum */
    kvs_buf_clear(&b);
    kvs_buf_puts(&b, "{\"enum\":[");
    for (int i = 0; i < 20000; i++) kvs_buf_printf(&b, "%s%d", i ? "," : "", i);
    kvs_buf_puts(&b, "]}");
    cr_assert_eq(compile_err(b.data, err, sizeof err), KVS_ERR_LIMIT, "%s", err);
    /* a large one that fits stays deterministic (a trie) */
    kvs_buf_clear(&b);
    kvs_buf_puts(&b, "{\"enum\":[");
    for (int i = 0; i < 5000; i++) kvs_buf_printf(&b, "%s\"value-%d\"", i ? "," : "", i * 7);
    kvs_buf_puts(&b, "]}");
    gmr_grammar *g = compile(b.data);
    gmr_vocab *v = byte_vocab();
    cr_assert(accepts(g, v, "\"value-34993\""));
    cr_assert(!accepts(g, v, "\"value-34994\""));
    gmr_grammar_free(g);
    /* huge counts: minimums refused, maximums cost nothing */
    cr_assert_eq(compile_err("{\"type\":\"array\",\"minItems\":1000000000}", err, sizeof err), KVS_ERR_LIMIT);
    cr_assert_eq(compile_err("{\"type\":\"string\",\"minLength\":1000000000}", err, sizeof err), KVS_ERR_LIMIT);
    g = compile("{\"type\":\"string\",\"maxLength\":4000000000}");
    cr_assert(accepts(g, v, "\"abc\""));
    gmr_grammar_free(g);
    /* recursion without a base case */
    cr_assert_eq(compile_err("{\"$ref\":\"#\"}", err, sizeof err), KVS_ERR_LIMIT, "%s", err);
    cr_assert_eq(compile_err("{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\"}},\"required\":[\"a\"]}", err,
                             sizeof err), KVS_ERR_LIMIT, "%s", err);
    cr_assert(strstr(err, "no finite value"), "%s", err);
    cr_assert_eq(compile_err("{\"anyOf\":[{\"$ref\":\"#\"}]}", err, sizeof err), KVS_ERR_LIMIT, "%s", err);
    /* ambiguity: 600 overlapping branches (more stacks than a state keeps) still mask, by brute force too */
    kvs_buf_clear(&b);
    kvs_buf_puts(&b, "{\"anyOf\":[");
    for (int i = 0; i < 600; i++) kvs_buf_printf(&b, "%s{\"type\":\"string\",\"maxLength\":%d}", i ? "," : "", 1 + i % 40);
    kvs_buf_puts(&b, "]}");
    g = compile(b.data);
    {
        bytevoc bv;
        byte_pieces(&bv);
        gmr_matcher *a = NULL;
        cr_assert_eq(gmr_matcher_create(g, v, 0, &a), 0);
        uint32_t am[(BYTE_VOCAB + 31) / 32];
        const char *text = "\"abcdefghijklmnopqrstuvwxyz0123456789ABCDE";
        for (int k = 0; k < 41; k++) {   /* the quote and 40 characters */
            cr_assert_eq(gmr_matcher_fill_mask(a, am, sizeof am / sizeof *am), 0);
            if (k % 10 == 0) brute_check(a, am, bv.pieces, bv.lens, bv.flags, BYTE_VOCAB, "600 branches");
            cr_assert_eq(gmr_matcher_accept_bytes(a, text + k, 1), 0, "step %d", k);
        }
        cr_assert(!gmr_matcher_allows(a, 'x'), "40 characters: the string must close");
        gmr_matcher_free(a);
    }
    gmr_grammar_free(g);
    /* json_object: deep nesting is cut at the stack limit, with bounded work */
    cr_assert_eq(gmr_compile_json_object(NULL, &g, err, sizeof err), 0, "%s", err);
    gmr_matcher *m = NULL;
    cr_assert_eq(gmr_matcher_create(g, v, 0, &m), 0);
    cr_assert_eq(gmr_matcher_accept_bytes(m, "{\"a\":", 5), 0);
    int depth = 0;
    while (depth < 5000 && gmr_matcher_accept_bytes(m, "[", 1) == 0) depth++;
    cr_assert_lt(depth, 5000, "nesting was not bounded");
    uint32_t mask[9];
    cr_assert_eq(gmr_matcher_fill_mask(m, mask, 9), 0);
    gmr_matcher_free(m);
    gmr_grammar_free(g);
    gmr_vocab_free(v);
    kvs_buf_free(&b);
}

/* ---- BNF ------------------------------------------------------------------------------------------------------- */

Test(grammar, bnf_tool_call) {
    gmr_grammar *params = compile("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
                                  "\"required\":[\"city\"],\"additionalProperties\":false}");
    gmr_named_grammar named[1] = {{"get_weather", params}};
    gmr_grammar *g = NULL;
    char err[256];
    const char *text = "# a Hermes tool call, one or more\n"
                       "root ::= call (\"\\n\" call)*\n"
                       "call ::= \"<tool_call>\\n{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": \" @get_weather \"}\\n</tool_call>\"\n";
    cr_assert_eq(gmr_compile_bnf(text, named, 1, &g, err, sizeof err), 0, "%s", err);
    gmr_grammar_free(params);   /* copied */
    gmr_vocab *v = byte_vocab();
    cr_assert(accepts(g, v, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
    cr_assert(accepts(g, v, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"a\"}}\n</tool_call>\n"
                            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"b\"}}\n</tool_call>"));
    cr_assert(!accepts(g, v, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
    gmr_grammar_free(g);
    gmr_vocab_free(v);
}

Test(grammar, bnf_syntax) {
    gmr_vocab *v = byte_vocab();
    gmr_grammar *g = NULL;
    char err[256];
    cr_assert_eq(gmr_compile_bnf("root ::= [a-c]{2,3} x? | \"é\" .\nx ::= [^a-z0-9] (\"q\" | \"r\")+", NULL, 0, &g, err, sizeof err), 0,
                 "%s", err);
    cr_assert(accepts(g, v, "ab"));
    cr_assert(accepts(g, v, "abc!qrq"));
    cr_assert(accepts(g, v, "é☃"));
    cr_assert(!accepts(g, v, "a"));
    cr_assert(!accepts(g, v, "abz"));
    gmr_grammar_free(g);
    static const struct { const char *t; int rc; } bad[] = {
        {"root ::= \"a", KVS_ERR_SYNTAX},      {"root ::= b", KVS_ERR_NOT_FOUND},   {"r ::= \"a\"", KVS_ERR_NOT_FOUND},
        {"root ::= root \"a\" | \"b\"", KVS_ERR_UNSUPPORTED}, {"root ::= (\"a\"?)*", KVS_ERR_UNSUPPORTED},
        {"root ::= @nope", KVS_ERR_NOT_FOUND}, {"root ::= \"a\"\nroot ::= \"b\"", KVS_ERR_SYNTAX},
        {"root ::= x\nx ::= \"(\" x \")\"", KVS_ERR_LIMIT}, {"root ::= [b-a]", KVS_ERR_SYNTAX},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = gmr_compile_bnf(bad[i].t, NULL, 0, &g, err, sizeof err);
        cr_expect_eq(rc, bad[i].rc, "%s: %d (%s)", bad[i].t, rc, err);
        gmr_grammar_free(g);
    }
    gmr_vocab_free(v);
}

/* ---- the matcher API ---------------------------------------------------------------------------------------------- */

Test(grammar, matcher_api) {
    const char *pieces[] = {"{", "}", "\"a\"", ":", "1", "12", " ", "</s>", "<|ctl|>", "", "\"a\":1}"};
    size_t lens[11];
    for (int i = 0; i < 11; i++) lens[i] = strlen(pieces[i]);
    uint8_t flags[11] = {[7] = GMR_TOKEN_EOG, [8] = GMR_TOKEN_SPECIAL};
    gmr_vocab *v = NULL;
    cr_assert_eq(gmr_vocab_create(pieces, lens, flags, 11, &v), 0);
    cr_assert_eq(gmr_mask_words(v), 1);
    gmr_grammar *g = compile("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":false}");
    gmr_matcher *m = NULL;
    cr_assert_eq(gmr_matcher_create(g, v, 0, &m), 0);
    uint32_t mask;
    cr_assert_eq(gmr_matcher_fill_mask(m, &mask, 1), 0);
    cr_assert_eq(mask, 1u << 0, "start: only {, got %x", mask);
    cr_assert_eq(gmr_matcher_accept_token(m, 1), KVS_ERR_INVALID);   /* } not allowed: unchanged */
    cr_assert_eq(gmr_matcher_accept_token(m, 0), 0);
    cr_assert_eq(gmr_matcher_fill_mask(m, &mask, 1), 0);
    cr_assert_eq(mask, (1u << 1) | (1u << 2) | (1u << 6) | (1u << 10), "after {: %x", mask);
    gmr_matcher *c = NULL;
    cr_assert_eq(gmr_matcher_clone(m, &c), 0);
    cr_assert_eq(gmr_matcher_accept_token(c, 10), 0);   /* "a":1} in one token */
    cr_assert(gmr_matcher_is_complete(c));
    cr_assert_eq(gmr_matcher_fill_mask(c, &mask, 1), 0);
    cr_assert_eq(mask, 1u << 7, "complete, nothing can follow: only eog, got %x", mask);
    cr_assert_eq(gmr_matcher_accept_token(c, 7), 0);
    cr_assert(gmr_matcher_is_finished(c));
    cr_assert_eq(gmr_matcher_fill_mask(c, &mask, 1), 0);
    cr_assert_eq(mask, 0);
    cr_assert_eq(gmr_matcher_accept_token(c, 1), KVS_ERR_INVALID);
    /* the original did not move */
    cr_assert(!gmr_matcher_is_complete(m));
    cr_assert_eq(gmr_matcher_accept_token(m, 7), KVS_ERR_INVALID);
    cr_assert_eq(gmr_matcher_accept_token(m, 8), KVS_ERR_INVALID);
    cr_assert_eq(gmr_matcher_accept_token(m, 9), KVS_ERR_INVALID);
    cr_assert_eq(gmr_matcher_accept_token(m, 11), KVS_ERR_INVALID);
    cr_assert_eq(gmr_matcher_fill_mask(m, &mask, 0), KVS_ERR_INVALID);
    gmr_matcher_reset(c);
    cr_assert(!gmr_matcher_is_finished(c));
    cr_assert_eq(gmr_matcher_fill_mask(c, &mask, 1), 0);
    cr_assert_eq(mask, 1u << 0);
    uint64_t computed, hits;
    gmr_matcher_cache_stats(m, &computed, &hits);
    cr_assert_geq(hits, 1, "the reset clone's start mask should come from the shared cache");
    float logits[11] = {0};
    gmr_mask_apply(&mask, logits, 11);
    cr_assert(logits[0] == 0 && isinf(logits[1]) && logits[1] < 0);
    gmr_matcher_free(c);
    gmr_matcher_free(m);
    gmr_grammar_free(g);
    gmr_vocab_free(v);
    cr_assert_eq(gmr_vocab_create(pieces, lens, flags, 0, &v), KVS_ERR_INVALID);
    cr_assert_eq(gmr_matcher_create(NULL, NULL, 0, &m), KVS_ERR_INVALID);
}

/* Random patterns and BNF texts: every one compiles or fails with an error, never crashes or hangs; what compiles
 * drives a short random walk whose every mask is checked by brute force. */
Test(grammar, fuzz_parsers) {
    static const char rx_alpha[] = "ab()[]^$|?*+{},-\\.dws09\"";
    static const char bnf_alpha[] = "root ::= x\"a\\[]^-()|?*+{1,2}.@#\n";
    gmr_vocab *v = byte_vocab();
    bytevoc bv;
    byte_pieces(&bv);
    rng r = {4242};
    int ok = 0;
    uint32_t mask[(BYTE_VOCAB + 31) / 32];
    for (int it = 0; it < 3000; it++) {
        char text[40];
        int n = 1 + rng_int(&r, 24);
        bool is_bnf = it % 2;
        for (int i = 0; i < n; i++)
            text[i] = is_bnf ? bnf_alpha[rng_int(&r, (int)sizeof bnf_alpha - 1)] : rx_alpha[rng_int(&r, (int)sizeof rx_alpha - 1)];
        text[n] = 0;
        gmr_grammar *g = NULL;
        char err[256];
        int rc;
        if (is_bnf) {
            char full[64];
            snprintf(full, sizeof full, "root ::= %s", text);
            rc = gmr_compile_bnf(full, NULL, 0, &g, err, sizeof err);
        } else {
            cJSON *s = cJSON_CreateObject();
            cJSON_AddStringToObject(s, "type", "string");
            cJSON_AddStringToObject(s, "pattern", text);
            rc = gmr_compile_schema(s, NULL, &g, err, sizeof err);
            cJSON_Delete(s);
        }
        if (rc) {
            cr_assert(rc == KVS_ERR_SYNTAX || rc == KVS_ERR_UNSUPPORTED || rc == KVS_ERR_LIMIT || rc == KVS_ERR_NOT_FOUND,
                      "[%s]: %d", text, rc);
            cr_assert_gt(strlen(err), 0, "[%s]: no message", text);
            continue;
        }
        ok++;
        gmr_matcher *m = NULL;
        cr_assert_eq(gmr_matcher_create(g, v, 0, &m), 0);
        for (int step = 0; step < 12 && !gmr_matcher_is_finished(m); step++) {
            cr_assert_eq(gmr_matcher_fill_mask(m, mask, sizeof mask / sizeof *mask), 0);
            brute_check(m, mask, bv.pieces, bv.lens, bv.flags, BYTE_VOCAB, text);
            int32_t allowed[BYTE_VOCAB], na = 0;
            for (int32_t t = 0; t < BYTE_VOCAB; t++)
                if (bit(mask, t)) allowed[na++] = t;
            cr_assert_gt(na, 0, "[%s]: dead state", text);
            cr_assert_eq(gmr_matcher_accept_token(m, allowed[rng_int(&r, na)]), 0);
        }
        gmr_matcher_free(m);
        gmr_grammar_free(g);
    }
    cr_log_info("fuzz: %d of 3000 texts compiled", ok);
    cr_assert_gt(ok, 100);
    gmr_vocab_free(v);
}
