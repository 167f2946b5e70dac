/* gmr_schema.c: JSON Schema (a cJSON document) into a grammar. The supported keywords and the shape of the
 * output are listed in grammar.h. Every value ends with its own trailing whitespace slot inside containers:
 *   object := "{" ws [member ("," ws member)*] "}"      member := key ws ":" ws value ws
 *   array  := "[" ws [value ws ("," ws value ws)*] "]"
 * so that the root value has no whitespace after it (EOS is then the only continuation). The integer and number
 * rules are in gmr_schema_num.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gmr_internal.h"

#define MAX_SCHEMA_DEPTH 64
#define MAX_ENUM 10000
#define MAX_ENUM_BYTES (1u << 20)
#define MAX_COUNT 100000u      /* minItems / minLength beyond this: a hostile schema */
#define MAX_PROPS 1000


void gmr_schema_options_default(gmr_schema_options *o) {
    o->max_ws = 4;
    o->max_digits = 16;
    o->max_frac = 8;
    o->max_key_len = 64;
}

static uint32_t c_schema(sctx *s, const cJSON *sch);

static void ws(sctx *s, gb_seq *q) {
    if (s->o.max_ws > 0) gb_repeat(s->b, q, s->r_wsc, 0, (uint32_t)s->o.max_ws);
}

static void lit(sctx *s, gb_seq *q, const char *t) { gb_lit(s->b, q, t, strlen(t)); }

uint32_t gmr_class_rule(gb *b, const char *chars, char lo, char hi) {
    uint8_t set[32] = {0};
    for (const char *c = chars; c && *c; c++) set[(uint8_t)*c >> 3] |= (uint8_t)(1u << ((uint8_t)*c & 7));
    for (int c = (uint8_t)lo; lo && c <= (uint8_t)hi; c++) set[c >> 3] |= (uint8_t)(1u << (c & 7));
    gb_seq q = {0};
    gb_bytes(b, &q, set);
    return gb_rule_of(b, &q);
}

/* One JSON string character (raw UTF-8 or an escape; no \u escape of a surrogate or of NUL). */
static uint32_t jchar(sctx *s) {
    if (s->r_jchar != UINT32_MAX) return s->r_jchar;
    gb *b = s->b;
    gmr_cpset raw = {0};
    if (cps_add(&raw, 0x20, 0x21) || cps_add(&raw, 0x23, 0x5B) || cps_add(&raw, 0x5D, 0x10FFFF)) {
        cps_free(&raw);
        gb_fail(b, KVS_ERR_NOMEM, "out of memory");
        return UINT32_MAX;
    }
    uint32_t r = gb_rule_new(b);
    gb_seq q = {0};
    gb_ref(b, &q, gb_rule_cp(b, raw.r, raw.n));
    cps_free(&raw);
    gb_alt(b, r, &q);
    uint32_t hex = gmr_class_rule(b, NULL, '0', '9');
    {
        uint8_t set[32] = {0};
        for (int c = 0; c < 256; c++)
            if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))
                set[c >> 3] |= (uint8_t)(1u << (c & 7));
        gb_seq h = {0};
        gb_bytes(b, &h, set);
        hex = gb_rule_of(b, &h);
    }
    /* \u: not D800-DFFF, not 0000 */
    uint32_t u = gb_rule_new(b);
    struct { const char *c0; char l0, h0; const char *c1; char l1, h1; int rest; } alts[] = {
        {"aAbBcC", '1', '9', NULL, 0, 0, 3}, {"dD", 0, 0, NULL, '0', '7', 2}, {"eEfF", 0, 0, NULL, 0, 0, 3},
    };
    for (int k = 0; k < 3; k++) {
        gb_seq a = {0};
        gb_ref(b, &a, gmr_class_rule(b, alts[k].c0, alts[k].l0, alts[k].h0));
        if (alts[k].rest == 2) gb_ref(b, &a, gmr_class_rule(b, NULL, alts[k].l1, alts[k].h1));
        gb_repeat(b, &a, hex, (uint32_t)alts[k].rest, (uint32_t)alts[k].rest);
        gb_alt(b, u, &a);
    }
    uint32_t nz = gmr_class_rule(b, "abcdefABCDEF", '1', '9');
    for (int zeros = 1; zeros <= 3; zeros++) {
        gb_seq a = {0};
        for (int z = 0; z < zeros; z++) gb_byte(b, &a, '0');
        gb_ref(b, &a, nz);
        gb_repeat(b, &a, hex, (uint32_t)(3 - zeros), (uint32_t)(3 - zeros));
        gb_alt(b, u, &a);
    }
    gb_seq e = {0};
    gb_byte(b, &e, '\\');
    uint32_t esc = gb_rule_new(b);
    {
        gb_alt_ref(b, esc, gmr_class_rule(b, "\"\\/bfnrt", 0, 0));
        gb_seq c = {0};
        gb_byte(b, &c, 'u');
        gb_ref(b, &c, u);
        gb_alt(b, esc, &c);
    }
    gb_ref(b, &e, esc);
    gb_alt(b, r, &e);
    s->r_hex = hex;
    s->r_jchar = r;
    return r;
}

static uint32_t string_rule(sctx *s, uint32_t mn, uint32_t mx) {
    gb_seq q = {0};
    gb_byte(s->b, &q, '"');
    gb_repeat(s->b, &q, jchar(s), mn, mx);
    gb_byte(s->b, &q, '"');
    return gb_rule_of(s->b, &q);
}

/* ---- any JSON value ---------------------------------------------------------------------------------------- */

/* The rule "," ws x. */
static uint32_t comma_then(sctx *s, uint32_t x) {
    gb_seq q = {0};
    gb_byte(s->b, &q, ',');
    ws(s, &q);
    gb_ref(s->b, &q, x);
    return gb_rule_of(s->b, &q);
}

/* Adds to v the alternative: open ws [elem ("," ws elem)*] close. */
static void any_container(sctx *s, uint32_t v, char open, uint32_t elem, char close) {
    gb *b = s->b;
    gb_seq body = {0};
    gb_ref(b, &body, elem);
    gb_repeat(b, &body, comma_then(s, elem), 0, GMR_INF);
    uint32_t body_r = gb_rule_of(b, &body);
    gb_seq o = {0};
    gb_byte(b, &o, (uint8_t)open);
    ws(s, &o);
    gb_repeat(b, &o, body_r, 0, 1);
    gb_byte(b, &o, (uint8_t)close);
    gb_alt(b, v, &o);
}

static uint32_t any_value(sctx *s) {
    if (s->r_value != UINT32_MAX) return s->r_value;
    gb *b = s->b;
    uint32_t v = gb_rule_new(b);
    s->r_value = v;
    uint32_t str = s->r_string != UINT32_MAX ? s->r_string : (s->r_string = string_rule(s, 0, GMR_INF));
    gb_seq m = {0};   /* object */
    gb_ref(b, &m, str);
    ws(s, &m);
    gb_byte(b, &m, ':');
    ws(s, &m);
    gb_ref(b, &m, v);
    ws(s, &m);
    any_container(s, v, '{', gb_rule_of(b, &m), '}');
    gb_seq it = {0};   /* array */
    gb_ref(b, &it, v);
    ws(s, &it);
    any_container(s, v, '[', gb_rule_of(b, &it), ']');
    gb_seq q = {0};
    gb_ref(b, &q, str);
    gb_alt(b, v, &q);   /* q, emptied by gb_alt, builds the next alternatives */
    bounds nb = {-INFINITY, INFINITY, false, false};
    gb_ref(b, &q, gmr_number_rule(s, &nb));
    gb_alt(b, v, &q);
    static const char *lits[3] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        lit(s, &q, lits[k]);
        gb_alt(b, v, &q);
    }
    return v;
}

/* ---- keywords ----------------------------------------------------------------------------------------------- */

static const char *const k_annot[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                      "deprecated", "readOnly", "writeOnly", "discriminator", "$defs",
                                      "definitions", "contentMediaType", "contentEncoding", "$anchor", NULL};
static const char *const k_known[] = {"type", "nullable", "properties", "required", "additionalProperties",
                                      "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "items", "prefixItems",
                                      "minItems", "maxItems", "minLength", "maxLength", "pattern", "format",
                                      "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};

static bool in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return true;
    return false;
}

static bool is_annotation(const char *k) { return in_list(k_annot, k) || !strncmp(k, "x-", 2); }

static int check_keywords(sctx *s, const cJSON *sch) {
    for (const cJSON *c = sch->child; c; c = c->next) {
        if (!c->string) continue;
        if (!is_annotation(c->string) && !in_list(k_known, c->string))
            return gb_fail(s->b, KVS_ERR_UNSUPPORTED, "unsupported JSON Schema keyword '%s'", c->string);
    }
    return 0;
}

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static int get_count(sctx *s, const cJSON *sch, const char *k, uint32_t dflt, uint32_t *out) {
    const cJSON *v = get(sch, k);
    *out = dflt;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        return gb_fail(s->b, KVS_ERR_FORMAT, "%s must be a non-negative integer", k);
    *out = v->valuedouble >= 4e9 ? GMR_INF - 1 : (uint32_t)v->valuedouble;
    return 0;
}

static const cJSON *resolve_ref(sctx *s, const char *ref) {
    if (ref[0] != '#')
        return gb_fail(s->b, KVS_ERR_UNSUPPORTED, "$ref '%.80s': only local references (#...) are supported", ref),
               NULL;
    const cJSON *cur = s->root;
    const char *p = ref + 1;
    if (*p && *p != '/') return gb_fail(s->b, KVS_ERR_UNSUPPORTED, "$ref '%.80s': anchors are not supported", ref), NULL;
    char seg[256];
    while (*p == '/') {
        p++;
        size_t n = 0;
        while (*p && *p != '/') {
            char c = *p++;
            if (c == '~' && (*p == '0' || *p == '1')) c = *p++ == '0' ? '~' : '/';
            if (n + 1 >= sizeof seg) return gb_fail(s->b, KVS_ERR_FORMAT, "$ref '%.80s': segment too long", ref), NULL;
            seg[n++] = c;
        }
        seg[n] = 0;
        if (cJSON_IsArray(cur)) {
            char *end;
            long i = strtol(seg, &end, 10);
            cur = *seg && !*end && i >= 0 ? cJSON_GetArrayItem(cur, (int)i) : NULL;
        } else if (cJSON_IsObject(cur)) {
            cur = get(cur, seg);
        } else {
            cur = NULL;
        }
        if (!cur) return gb_fail(s->b, KVS_ERR_FORMAT, "$ref '%.80s' does not resolve", ref), NULL;
    }
    return cur;
}

/* Merges the keywords of src into dst (allOf, or a base schema into anyOf branches). */
static int merge_into(sctx *s, cJSON *dst, const cJSON *src, int depth) {
    if (depth > 16) return gb_fail(s->b, KVS_ERR_LIMIT, "allOf: $ref chain too deep");
    if (cJSON_IsTrue(src)) return 0;
    if (!cJSON_IsObject(src)) return gb_fail(s->b, KVS_ERR_UNSUPPORTED, "allOf: a branch that is not an object schema");
    const cJSON *ref = get(src, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) return gb_fail(s->b, KVS_ERR_FORMAT, "$ref must be a string");
        const cJSON *t = resolve_ref(s, ref->valuestring);
        if (!t) return s->b->err;
        int rc = merge_into(s, dst, t, depth + 1);
        if (rc) return rc;
    }
    const cJSON *all = get(src, "allOf");
    if (all) {
        if (!cJSON_IsArray(all)) return gb_fail(s->b, KVS_ERR_FORMAT, "allOf must be an array");
        for (const cJSON *c = all->child; c; c = c->next) {
            int rc = merge_into(s, dst, c, depth + 1);
            if (rc) return rc;
        }
    }
    for (const cJSON *c = src->child; c; c = c->next) {
        const char *k = c->string;
        if (!k || is_annotation(k) || !strcmp(k, "$ref") || !strcmp(k, "allOf")) continue;
        cJSON *d = cJSON_GetObjectItemCaseSensitive(dst, k);
        if (!strcmp(k, "properties") && d && cJSON_IsObject(d) && cJSON_IsObject(c)) {
            if (get(dst, "additionalProperties") || get(src, "additionalProperties"))
                return gb_fail(s->b, KVS_ERR_UNSUPPORTED, "allOf: properties in several branches with additionalProperties");
            for (const cJSON *p = c->child; p; p = p->next) {
                const cJSON *e = get(d, p->string);
                if (e && !cJSON_Compare(e, p, true))
                    return gb_fail(s->b, KVS_ERR_UNSUPPORTED, "allOf: property '%s' defined differently in several branches",
                                   p->string);
                if (!e && !cJSON_AddItemToObject(d, p->string, cJSON_Duplicate(p, true)))
                    return gb_fail(s->b, KVS_ERR_NOMEM, "out of memory");
            }
            continue;
        }
        if (!strcmp(k, "required") && d && cJSON_IsArray(d) && cJSON_IsArray(c)) {
            for (const cJSON *p = c->child; p; p = p->next) {
                bool have = false;
                for (const cJSON *q = d->child; q && !have; q = q->next) have = cJSON_Compare(p, q, true);
                if (!have) cJSON_AddItemToArray(d, cJSON_Duplicate(p, true));
            }
            continue;
        }
        if (d) {
            if (!cJSON_Compare(d, c, true))
                return gb_fail(s->b, KVS_ERR_UNSUPPORTED, "allOf: keyword '%s' with different values in several branches", k);
            continue;
        }
        if (!strcmp(k, "additionalProperties") && get(dst, "properties") && get(src, "properties") == NULL)
            return gb_fail(s->b, KVS_ERR_UNSUPPORTED, "allOf: properties in several branches with additionalProperties");
        if (!cJSON_AddItemToObject(dst, k, cJSON_Duplicate(c, true))) return gb_fail(s->b, KVS_ERR_NOMEM, "out of memory");
    }
    return 0;
}

static uint32_t literal_rule(sctx *s, const cJSON *vals, int n, const char *kw, const char *const *types, int n_types);

static bool json_type_is(const cJSON *v, const char *t) {
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) < 9e15;
    return false;
}

static uint32_t literal_rule(sctx *s, const cJSON *vals, int n, const char *kw, const char *const *types, int n_types) {
    gb *b = s->b;
    if (n > MAX_ENUM) return gb_fail(b, KVS_ERR_LIMIT, "%s: more than %d values", kw, MAX_ENUM), UINT32_MAX;
    char **txt = calloc((size_t)n + 1, sizeof *txt);
    size_t *len = calloc((size_t)n + 1, sizeof *len);
    size_t total = 0, m = 0;
    if (!txt || !len) gb_fail(b, KVS_ERR_NOMEM, "out of memory");
    for (const cJSON *v = vals; v && !b->err; v = v->next) {
        bool ok = n_types == 0;
        for (int t = 0; t < n_types && !ok; t++) ok = json_type_is(v, types[t]);
        if (!ok) continue;
        txt[m] = cJSON_PrintUnformatted(v);
        if (!txt[m]) {
            gb_fail(b, KVS_ERR_NOMEM, "out of memory");
            break;
        }
        len[m] = strlen(txt[m]);
        total += len[m++];
        if (total > MAX_ENUM_BYTES) gb_fail(b, KVS_ERR_LIMIT, "%s: values longer than %u bytes in all", kw, MAX_ENUM_BYTES);
    }
    uint32_t r = b->err ? UINT32_MAX : gb_rule_lits(b, (const char *const *)txt, len, m);
    for (size_t k = 0; txt && k < m; k++) cJSON_free(txt[k]);
    free(txt);
    free(len);
    return r;
}

static uint32_t object_rule(sctx *s, const cJSON *sch);
static uint32_t array_rule(sctx *s, const cJSON *sch);

static const char *const k_date = "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))";
static const char *const k_time = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";

static uint32_t typed_rule(sctx *s, const cJSON *sch, const char *t) {
    gb *b = s->b;
    if (!strcmp(t, "null")) return gb_rule_lit(b, "null", 4);
    if (!strcmp(t, "boolean")) {
        const char *v[2] = {"true", "false"};
        size_t l[2] = {4, 5};
        return gb_rule_lits(b, v, l, 2);
    }
    if (!strcmp(t, "integer") || !strcmp(t, "number")) {
        bounds bd;
        if (gmr_get_bounds(s, sch, &bd)) return UINT32_MAX;
        if (!strcmp(t, "integer")) {
            if (bd.lo == -INFINITY && bd.hi == INFINITY && s->r_integer != UINT32_MAX) return s->r_integer;
            uint32_t r = gmr_integer_rule(s, &bd, true);
            if (bd.lo == -INFINITY && bd.hi == INFINITY) s->r_integer = r;
            return r;
        }
        return gmr_number_rule(s, &bd);
    }
    if (!strcmp(t, "string")) {
        uint32_t mn, mx;
        if (get_count(s, sch, "minLength", 0, &mn) || get_count(s, sch, "maxLength", GMR_INF, &mx)) return UINT32_MAX;
        if (mn > MAX_COUNT) return gb_fail(b, KVS_ERR_LIMIT, "minLength above %u", MAX_COUNT), UINT32_MAX;
        const cJSON *pat = get(sch, "pattern"), *fmt = get(sch, "format");
        bool lens = get(sch, "minLength") || get(sch, "maxLength");
        if (pat && (lens || fmt))
            return gb_fail(b, KVS_ERR_UNSUPPORTED, "pattern together with minLength/maxLength/format"), UINT32_MAX;
        if (fmt && lens)
            return gb_fail(b, KVS_ERR_UNSUPPORTED, "format together with minLength/maxLength"), UINT32_MAX;
        const char *rx = NULL;
        char buf[1024];
        if (fmt) {
            if (!cJSON_IsString(fmt)) return gb_fail(b, KVS_ERR_FORMAT, "format must be a string"), UINT32_MAX;
            const char *f = fmt->valuestring;
            if (!strcmp(f, "date")) snprintf(buf, sizeof buf, "^%s$", k_date);
            else if (!strcmp(f, "time")) snprintf(buf, sizeof buf, "^%s$", k_time);
            else if (!strcmp(f, "date-time")) snprintf(buf, sizeof buf, "^%sT%s$", k_date, k_time);
            else if (!strcmp(f, "uuid"))
                snprintf(buf, sizeof buf, "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$");
            else return gb_fail(b, KVS_ERR_UNSUPPORTED, "unsupported format '%.64s'", f), UINT32_MAX;
            rx = buf;
        } else if (pat) {
            if (!cJSON_IsString(pat)) return gb_fail(b, KVS_ERR_FORMAT, "pattern must be a string"), UINT32_MAX;
            rx = pat->valuestring;
        }
        if (rx) {
            uint32_t body = gmr_regex_rule(b, rx, jchar(s));
            gb_seq q = {0};
            gb_byte(b, &q, '"');
            gb_ref(b, &q, body);
            gb_byte(b, &q, '"');
            return gb_rule_of(b, &q);
        }
        if (mn == 0 && mx == GMR_INF) {
            if (s->r_string == UINT32_MAX) s->r_string = string_rule(s, 0, GMR_INF);
            return s->r_string;
        }
        if (mn > mx) {
            uint32_t r = gb_rule_new(b);
            gb_define(b, r);
            return r;
        }
        return string_rule(s, mn, mx);
    }
    if (!strcmp(t, "object")) return object_rule(s, sch);
    if (!strcmp(t, "array")) return array_rule(s, sch);
    return gb_fail(b, KVS_ERR_UNSUPPORTED, "unsupported type '%.64s'", t), UINT32_MAX;
}

static uint32_t member_value(sctx *s, const char *key, const cJSON *vs) {
    gb *b = s->b;
    cJSON *kj = cJSON_CreateString(key);
    char *kt = kj ? cJSON_PrintUnformatted(kj) : NULL;
    cJSON_Delete(kj);
    if (!kt) return gb_fail(b, KVS_ERR_NOMEM, "out of memory"), UINT32_MAX;
    uint32_t v = c_schema(s, vs);
    gb_seq q = {0};
    lit(s, &q, kt);
    cJSON_free(kt);
    ws(s, &q);
    gb_byte(b, &q, ':');
    ws(s, &q);
    gb_ref(b, &q, v);
    ws(s, &q);
    return gb_rule_of(b, &q);
}


static bool key_safe(const char *k) {
    for (; *k; k++)
        if ((unsigned char)*k < 0x20 || (unsigned char)*k > 0x7E || *k == '"' || *k == '\\') return false;
    return true;
}

/* Keys (printable ASCII but '"' and '\\', length <= K) other than v[0..n) (sorted, sharing d bytes). */
static uint32_t key_except(sctx *s, const gb_str *v, size_t n, size_t d, uint32_t safe) {
    gb *b = s->b;
    uint32_t K = (uint32_t)s->o.max_key_len;
    uint32_t r = gb_rule_new(b);
    gb_define(b, r);
    size_t i = 0;
    gb_seq q = {0};
    if (n && v[0].n == d) i = 1;          /* a declared name ends here: the key may not */
    else gb_alt(b, r, &q);
    if (d >= K) return r;
    uint8_t set[32] = {0};
    for (int c = 0x20; c <= 0x7E; c++)
        if (c != '"' && c != '\\') set[c >> 3] |= (uint8_t)(1u << (c & 7));
    while (i < n && !b->err) {
        size_t j = i + 1;
        uint8_t c = (uint8_t)v[i].s[d];
        while (j < n && (uint8_t)v[j].s[d] == c) j++;
        set[c >> 3] &= (uint8_t)~(1u << (c & 7));
        gb_byte(b, &q, c);
        gb_ref(b, &q, key_except(s, v + i, j - i, d + 1, safe));
        gb_alt(b, r, &q);
        i = j;
    }
    gb_bytes(b, &q, set);
    gb_repeat(b, &q, safe, 0, K - (uint32_t)d - 1);
    gb_alt(b, r, &q);
    return r;
}

static uint32_t object_rule(sctx *s, const cJSON *sch) {
    gb *b = s->b;
    const cJSON *props = get(sch, "properties"), *req = get(sch, "required"), *ap = get(sch, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return gb_fail(b, KVS_ERR_FORMAT, "properties must be an object"), UINT32_MAX;
    if (req && !cJSON_IsArray(req)) return gb_fail(b, KVS_ERR_FORMAT, "required must be an array"), UINT32_MAX;
    if (ap && !cJSON_IsBool(ap) && !cJSON_IsObject(ap))
        return gb_fail(b, KVS_ERR_FORMAT, "additionalProperties must be a boolean or a schema"), UINT32_MAX;
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
        if (!cJSON_IsString(r)) return gb_fail(b, KVS_ERR_FORMAT, "required must hold strings"), UINT32_MAX;
    int np = props ? cJSON_GetArraySize(props) : 0, nr = req ? cJSON_GetArraySize(req) : 0;
    if (np + nr > MAX_PROPS) return gb_fail(b, KVS_ERR_LIMIT, "more than %d properties", MAX_PROPS), UINT32_MAX;
    bool extras = !cJSON_IsFalse(ap);
    /* the members in order: the declared properties, then required names not declared (any value) */
    size_t n = 0;
    uint32_t *mem = malloc(((size_t)np + (size_t)nr + 1) * sizeof *mem);
    bool *opt = malloc(((size_t)np + (size_t)nr + 1) * sizeof *opt);
    gb_str *names = malloc(((size_t)np + (size_t)nr + 1) * sizeof *names);
    if (!mem || !opt || !names) {
        free(mem);
        free(opt);
        free(names);
        return gb_fail(b, KVS_ERR_NOMEM, "out of memory"), UINT32_MAX;
    }
    size_t n_names = 0;
    for (const cJSON *p = props ? props->child : NULL; p && !b->err; p = p->next) {
        bool is_req = false;
        for (const cJSON *r = req ? req->child : NULL; r && !is_req; r = r->next) is_req = !strcmp(r->valuestring, p->string);
        mem[n] = member_value(s, p->string, p);
        opt[n++] = !is_req;
        if (key_safe(p->string)) names[n_names++] = (gb_str){p->string, strlen(p->string)};
    }
    for (const cJSON *r = req ? req->child : NULL; r && !b->err; r = r->next) {
        if (props && get(props, r->valuestring)) continue;
        bool dup = false;
        for (const cJSON *q = req->child; q != r && !dup; q = q->next) dup = !strcmp(q->valuestring, r->valuestring);
        if (dup) continue;
        if (!extras) {   /* required but not allowed: no value satisfies the schema */
            uint32_t e = gb_rule_new(b);
            gb_define(b, e);
            free(mem);
            free(opt);
            free(names);
            return e;
        }
        mem[n] = member_value(s, r->valuestring, cJSON_IsObject(ap) ? ap : NULL);
        opt[n++] = false;
        if (key_safe(r->valuestring)) names[n_names++] = (gb_str){r->valuestring, strlen(r->valuestring)};
    }
    /* the tail: extra members */
    uint32_t tail[2];
    for (int f = 0; f < 2; f++) tail[f] = gb_rule_new(b);
    if (!extras) {
        for (int f = 0; f < 2; f++) gb_define(b, tail[f]);
        gb_seq e = {0};
        gb_alt(b, tail[0], &e);
        gb_alt(b, tail[1], &e);
    } else if (!b->err) {
        qsort(names, n_names, sizeof *names, gb_str_cmp);
        uint8_t set[32] = {0};
        for (int c = 0x20; c <= 0x7E; c++)
            if (c != '"' && c != '\\') set[c >> 3] |= (uint8_t)(1u << (c & 7));
        gb_seq sq = {0};
        gb_bytes(b, &sq, set);
        uint32_t safe = gb_rule_of(b, &sq);
        gb_seq q = {0};
        gb_byte(b, &q, '"');
        gb_ref(b, &q, key_except(s, names, n_names, 0, safe));
        gb_byte(b, &q, '"');
        ws(s, &q);
        gb_byte(b, &q, ':');
        ws(s, &q);
        gb_ref(b, &q, cJSON_IsObject(ap) ? c_schema(s, ap) : any_value(s));
        ws(s, &q);
        uint32_t xm = gb_rule_of(b, &q);
        uint32_t more = comma_then(s, xm);
        gb_repeat(b, &q, more, 0, GMR_INF);
        gb_alt(b, tail[1], &q);
        gb_alt(b, tail[0], &q);   /* empty */
        gb_ref(b, &q, xm);
        gb_repeat(b, &q, more, 0, GMR_INF);
        gb_alt(b, tail[0], &q);
    }
    /* S[i][f] := sep_f member_i S[i+1][1] | (optional) S[i+1][f] */
    uint32_t next[2] = {tail[0], tail[1]};
    for (size_t i = n; i-- > 0 && !b->err;) {
        uint32_t cur[2];
        for (int f = 0; f < 2; f++) {
            cur[f] = gb_rule_new(b);
            gb_seq q = {0};
            if (f) {
                gb_byte(b, &q, ',');
                ws(s, &q);
            }
            gb_ref(b, &q, mem[i]);
            gb_ref(b, &q, next[1]);
            gb_alt(b, cur[f], &q);
            if (opt[i]) {
                gb_ref(b, &q, next[f]);
                gb_alt(b, cur[f], &q);
            }
        }
        next[0] = cur[0];
        next[1] = cur[1];
    }
    free(mem);
    free(opt);
    free(names);
    gb_seq q = {0};
    gb_byte(b, &q, '{');
    ws(s, &q);
    gb_ref(b, &q, next[0]);
    gb_byte(b, &q, '}');
    return gb_rule_of(b, &q);
}

static uint32_t array_rule(sctx *s, const cJSON *sch) {
    gb *b = s->b;
    const cJSON *pre = get(sch, "prefixItems"), *items = get(sch, "items");
    if (items && cJSON_IsArray(items)) {   /* draft 4-7 tuple form */
        if (pre) return gb_fail(b, KVS_ERR_UNSUPPORTED, "items as an array together with prefixItems"), UINT32_MAX;
        pre = items;
        items = NULL;
    }
    if (pre && !cJSON_IsArray(pre)) return gb_fail(b, KVS_ERR_FORMAT, "prefixItems must be an array"), UINT32_MAX;
    if (items && !cJSON_IsBool(items) && !cJSON_IsObject(items))
        return gb_fail(b, KVS_ERR_FORMAT, "items must be a schema"), UINT32_MAX;
    uint32_t mn, mx;
    if (get_count(s, sch, "minItems", 0, &mn) || get_count(s, sch, "maxItems", GMR_INF, &mx)) return UINT32_MAX;
    if (mn > MAX_COUNT) return gb_fail(b, KVS_ERR_LIMIT, "minItems above %u", MAX_COUNT), UINT32_MAX;
    uint32_t k = pre ? (uint32_t)cJSON_GetArraySize(pre) : 0;
    if (k > MAX_PROPS) return gb_fail(b, KVS_ERR_LIMIT, "more than %d prefixItems", MAX_PROPS), UINT32_MAX;
    if (cJSON_IsFalse(items) && mx > k) mx = k;
    uint32_t r = gb_rule_new(b);
    gb_define(b, r);
    if (mn > mx) return r;
    /* the tail after the prefix: items repeated */
    uint32_t tail[2];
    uint32_t rmin = mn > k ? mn - k : 0, rmax = mx == GMR_INF ? GMR_INF : mx - (mx > k ? k : mx);
    for (int f = 0; f < 2; f++) {
        tail[f] = gb_rule_new(b);
        gb_define(b, tail[f]);
    }
    if (rmax == 0 || cJSON_IsFalse(items)) {
        if (rmin == 0) {
            gb_seq e = {0};
            gb_alt(b, tail[0], &e);
            gb_alt(b, tail[1], &e);
        }
    } else {
        uint32_t iv = items ? c_schema(s, items) : any_value(s);
        gb_seq q = {0};
        gb_ref(b, &q, iv);
        ws(s, &q);
        uint32_t item = gb_rule_of(b, &q);
        uint32_t more = comma_then(s, item);
        gb_repeat(b, &q, more, rmin, rmax);
        gb_alt(b, tail[1], &q);
        if (rmin == 0) gb_alt(b, tail[0], &q);   /* empty */
        gb_ref(b, &q, item);
        gb_repeat(b, &q, more, rmin ? rmin - 1 : 0, rmax == GMR_INF ? GMR_INF : rmax - 1);
        gb_alt(b, tail[0], &q);
    }
    uint32_t next[2] = {tail[0], tail[1]};
    for (uint32_t i = k; i-- > 0 && !b->err;) {
        if (i >= mx) continue;   /* beyond maxItems: never reached */
        uint32_t v = c_schema(s, cJSON_GetArrayItem(pre, (int)i));
        gb_seq q = {0};
        gb_ref(b, &q, v);
        ws(s, &q);
        uint32_t item = gb_rule_of(b, &q);
        uint32_t cur[2];
        for (int f = 0; f < 2; f++) {
            cur[f] = gb_rule_new(b);
            gb_define(b, cur[f]);
            if (f) {
                gb_byte(b, &q, ',');
                ws(s, &q);
            }
            gb_ref(b, &q, item);
            gb_ref(b, &q, next[1]);
            gb_alt(b, cur[f], &q);
            if (i >= mn) {   /* the array may end before this item */
                gb_seq e = {0};
                gb_alt(b, cur[f], &e);
            }
        }
        next[0] = cur[0];
        next[1] = cur[1];
    }
    gb_seq q = {0};
    gb_byte(b, &q, '[');
    ws(s, &q);
    gb_ref(b, &q, next[0]);
    gb_byte(b, &q, ']');
    gb_alt(b, r, &q);
    return r;
}

static const char *const k_types[] = {"object", "array", "string", "number", "integer", "boolean", "null"};

/* {"$ref": ...}: the referenced schema's rule, one per target (memoized, so recursive schemas terminate) */
static uint32_t c_ref(sctx *s, const cJSON *sch, const cJSON *ref) {
    gb *b = s->b;
    if (!cJSON_IsString(ref)) return gb_fail(b, KVS_ERR_FORMAT, "$ref must be a string"), UINT32_MAX;
    for (const cJSON *c = sch->child; c; c = c->next)
        if (c->string && !is_annotation(c->string) && strcmp(c->string, "$ref"))
            return gb_fail(b, KVS_ERR_UNSUPPORTED, "$ref with sibling keyword '%s'", c->string), UINT32_MAX;
    const cJSON *t = resolve_ref(s, ref->valuestring);
    if (!t) return UINT32_MAX;
    for (size_t i = 0; i < s->n_memo; i++)
        if (s->memo[i].node == t) return s->memo[i].rule;
    if (s->n_memo == s->cap_memo) {
        size_t cap = s->cap_memo ? s->cap_memo * 2 : 16;
        refmemo *m = realloc(s->memo, cap * sizeof *m);
        if (!m) return gb_fail(b, KVS_ERR_NOMEM, "out of memory"), UINT32_MAX;
        s->memo = m;
        s->cap_memo = cap;
    }
    uint32_t r = gb_rule_new(b);
    s->memo[s->n_memo++] = (refmemo){t, r};
    uint32_t body = c_schema(s, t);
    gb_alt_ref(b, r, body);
    return r;
}

/* anyOf / oneOf (both accept any branch: the grammar cannot check exclusivity) */
static uint32_t c_any_of(sctx *s, const cJSON *sch, const cJSON *any) {
    gb *b = s->b;
    if (get(sch, "anyOf") && get(sch, "oneOf"))
        return gb_fail(b, KVS_ERR_UNSUPPORTED, "anyOf together with oneOf"), UINT32_MAX;
    if (!cJSON_IsArray(any) || !any->child)
        return gb_fail(b, KVS_ERR_FORMAT, "anyOf/oneOf must be a non-empty array"), UINT32_MAX;
    bool base = false;
    for (const cJSON *c = sch->child; c && !base; c = c->next)
        base = c->string && !is_annotation(c->string) && strcmp(c->string, "anyOf") && strcmp(c->string, "oneOf");
    uint32_t r = gb_rule_new(b);
    gb_define(b, r);
    for (const cJSON *c = any->child; c && !b->err; c = c->next) {
        uint32_t br;
        if (base) {   /* the keywords beside anyOf apply to every branch */
            cJSON *m = cJSON_CreateObject();
            if (!m) return gb_fail(b, KVS_ERR_NOMEM, "out of memory"), UINT32_MAX;
            for (const cJSON *k = sch->child; k; k = k->next)
                if (k->string && strcmp(k->string, "anyOf") && strcmp(k->string, "oneOf") && !is_annotation(k->string))
                    cJSON_AddItemToObject(m, k->string, cJSON_Duplicate(k, true));
            br = merge_into(s, m, c, 0) ? UINT32_MAX : c_schema(s, m);
            cJSON_Delete(m);
        } else {
            br = c_schema(s, c);
        }
        gb_alt_ref(b, r, br);
    }
    return r;
}

static uint32_t c_schema_obj(sctx *s, const cJSON *sch) {
    gb *b = s->b;
    if (check_keywords(s, sch)) return UINT32_MAX;
    const cJSON *ref = get(sch, "$ref");
    if (ref) return c_ref(s, sch, ref);
    const cJSON *all = get(sch, "allOf");
    if (all) {
        if (!cJSON_IsArray(all)) return gb_fail(b, KVS_ERR_FORMAT, "allOf must be an array"), UINT32_MAX;
        cJSON *m = cJSON_CreateObject();
        if (!m) return gb_fail(b, KVS_ERR_NOMEM, "out of memory"), UINT32_MAX;
        uint32_t r = UINT32_MAX;
        if (!merge_into(s, m, sch, 0)) r = c_schema(s, m);
        cJSON_Delete(m);
        return r;
    }
    const cJSON *any = get(sch, "anyOf");
    if (!any) any = get(sch, "oneOf");
    if (any) return c_any_of(s, sch, any);
    /* the types this schema admits */
    const char *types[8];
    int nt = 0;
    const cJSON *type = get(sch, "type");
    if (type) {
        if (cJSON_IsString(type)) types[nt++] = type->valuestring;
        else if (cJSON_IsArray(type)) {
            for (const cJSON *c = type->child; c; c = c->next) {
                if (!cJSON_IsString(c)) return gb_fail(b, KVS_ERR_FORMAT, "type must hold strings"), UINT32_MAX;
                if (nt < 7) types[nt++] = c->valuestring;
            }
        } else return gb_fail(b, KVS_ERR_FORMAT, "type must be a string or an array"), UINT32_MAX;
        for (int i = 0; i < nt; i++) {
            bool ok = false;
            for (int k = 0; k < 7 && !ok; k++) ok = !strcmp(types[i], k_types[k]);
            if (!ok) return gb_fail(b, KVS_ERR_UNSUPPORTED, "unsupported type '%.64s'", types[i]), UINT32_MAX;
        }
        if (cJSON_IsTrue(get(sch, "nullable")) && nt < 8) types[nt++] = "null";
    }
    const cJSON *en = get(sch, "enum"), *cn = get(sch, "const");
    if (en || cn) {
        if (en && !cJSON_IsArray(en)) return gb_fail(b, KVS_ERR_FORMAT, "enum must be an array"), UINT32_MAX;
        if (en && cn) return gb_fail(b, KVS_ERR_UNSUPPORTED, "enum together with const"), UINT32_MAX;
        for (const cJSON *c = sch->child; c; c = c->next)   /* the values are not checked against other keywords */
            if (c->string && !is_annotation(c->string) && strcmp(c->string, "enum") && strcmp(c->string, "const") &&
                strcmp(c->string, "type") && strcmp(c->string, "nullable"))
                return gb_fail(b, KVS_ERR_UNSUPPORTED, "%s together with '%s'", en ? "enum" : "const", c->string), UINT32_MAX;
        const cJSON *vals = en ? en->child : cn;
        int n = en ? cJSON_GetArraySize(en) : 1;
        if (cn) {   /* one value: print it alone */
            cJSON *one = cJSON_Duplicate(cn, true);
            if (!one) return gb_fail(b, KVS_ERR_NOMEM, "out of memory"), UINT32_MAX;
            uint32_t r = literal_rule(s, one, 1, "const", types, nt);
            cJSON_Delete(one);
            return r;
        }
        return literal_rule(s, vals, n, "enum", types, nt);
    }
    if (!type) {   /* infer from the keywords present; none: any value */
        static const char *fam[4][5] = {
            {"object", "properties", "required", "additionalProperties", NULL},
            {"array", "items", "prefixItems", "minItems", "maxItems"},
            {"string", "minLength", "maxLength", "pattern", "format"},
            {"number", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
        };
        for (int f = 0; f < 4; f++)
            for (int k = 1; k < 5 && fam[f][k]; k++)
                if (get(sch, fam[f][k])) {
                    types[nt++] = fam[f][0];
                    break;
                }
        if (!nt) return any_value(s);
        if (cJSON_IsTrue(get(sch, "nullable"))) types[nt++] = "null";
    }
    if (nt == 1) return typed_rule(s, sch, types[0]);
    uint32_t r = gb_rule_new(b);
    gb_define(b, r);
    for (int i = 0; i < nt && !b->err; i++) {
        bool dup = false;
        for (int j = 0; j < i; j++) dup |= !strcmp(types[i], types[j]);
        if (dup) continue;
        gb_alt_ref(b, r, typed_rule(s, sch, types[i]));
    }
    return r;
}

static uint32_t c_schema(sctx *s, const cJSON *sch) {
    gb *b = s->b;
    if (b->err) return UINT32_MAX;
    if (!sch || cJSON_IsTrue(sch)) return any_value(s);
    if (cJSON_IsFalse(sch)) {
        uint32_t r = gb_rule_new(b);
        gb_define(b, r);
        return r;
    }
    if (!cJSON_IsObject(sch)) return gb_fail(b, KVS_ERR_FORMAT, "a schema must be an object or a boolean"), UINT32_MAX;
    if (++s->depth > MAX_SCHEMA_DEPTH) {
        s->depth--;
        return gb_fail(b, KVS_ERR_LIMIT, "schema nested deeper than %d levels", MAX_SCHEMA_DEPTH), UINT32_MAX;
    }
    uint32_t r = c_schema_obj(s, sch);
    s->depth--;
    return r;
}

static int sctx_init(sctx *s, gb *b, const gmr_schema_options *opts, char *err, size_t err_len) {
    memset(s, 0, sizeof *s);
    gb_init(b, err, err_len);
    s->b = b;
    if (opts) s->o = *opts;
    else gmr_schema_options_default(&s->o);
    if (s->o.max_ws < 0 || s->o.max_ws > 32 || s->o.max_digits < 1 || s->o.max_digits > 18 || s->o.max_frac < 1 ||
        s->o.max_frac > 19 || s->o.max_key_len < 1 || s->o.max_key_len > 1024)
        return gb_fail(b, KVS_ERR_INVALID, "schema options out of range");
    s->r_jchar = s->r_value = s->r_string = s->r_number = s->r_integer = s->r_hex = UINT32_MAX;
    s->r_wsc = gmr_class_rule(b, " \t\n", 0, 0);
    return b->err;
}

int gmr_compile_schema(const cJSON *schema, const gmr_schema_options *opts, gmr_grammar **out, char *err,
                       size_t err_len) {
    if (!out) return KVS_ERR_INVALID;
    *out = NULL;
    gb b;
    sctx s;
    int rc = sctx_init(&s, &b, opts, err, err_len);
    if (!rc && !schema) rc = gb_fail(&b, KVS_ERR_INVALID, "no schema");
    if (!rc) {
        s.root = schema;
        uint32_t root = c_schema(&s, schema);
        rc = b.err ? b.err : gb_finish(&b, root, out);
    }
    free(s.memo);
    gb_free(&b);
    return rc;
}

int gmr_compile_json_object(const gmr_schema_options *opts, gmr_grammar **out, char *err, size_t err_len) {
    if (!out) return KVS_ERR_INVALID;
    *out = NULL;
    cJSON *sch = cJSON_CreateObject();
    if (!sch || !cJSON_AddStringToObject(sch, "type", "object")) {
        cJSON_Delete(sch);
        return KVS_ERR_NOMEM;
    }
    int rc = gmr_compile_schema(sch, opts, out, err, err_len);
    cJSON_Delete(sch);
    return rc;
}
