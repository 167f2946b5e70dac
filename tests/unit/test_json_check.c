/* test_json_check.c: the strict JSON pass that runs before cJSON on request bodies (server/api/json_check_internal.h): a table
 * of accepted and refused texts with the offsets and messages, the facts counted on success, and a randomized
 * comparison with cJSON over mutated bodies (what it accepts, cJSON reads completely without losing text). */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/common.h"
#include "helper_rng.h"
#include "server/api/api.h"
#include "server/api/json_check_internal.h"

typedef struct jcase { const char *text; int rc; size_t offset; const char *msg; } jcase;

static const jcase CASES[] = {
    {"{}", 0, 0, NULL},
    {" [1, -0.5e+3, true, false, null, \"x\"] ", 0, 0, NULL},
    {"\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\"", 0, 0, NULL},
    {"\"\\u0041\\u00e9\\u4E2D\\uD83D\\uDE00\"", 0, 0, NULL},
    {"\"caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80\"", 0, 0, NULL},
    {"", KVS_ERR_FORMAT, 0, "unexpected end of the text"},
    {"\"ab\\u12zz\"", KVS_ERR_FORMAT, 3, "invalid \\u escape"},
    {"\"ab\\u12\"", KVS_ERR_FORMAT, 3, "invalid \\u escape"},
    {"\"ab\\u", KVS_ERR_FORMAT, 3, "invalid \\u escape"},
    {"\"ab\\", KVS_ERR_FORMAT, 3, "unterminated escape"},
    {"{\"k\":\"a\\u0000b\"}", KVS_ERR_FORMAT, 7, "\\u0000 (NUL) is not allowed"},
    {"\"\\uD800\"", KVS_ERR_FORMAT, 1, "lone UTF-16 high surrogate \\uD800"},
    {"\"\\uD800\\u0041\"", KVS_ERR_FORMAT, 1, "lone UTF-16 high surrogate"},
    {"\"\\uDC00\"", KVS_ERR_FORMAT, 1, "lone UTF-16 low surrogate"},
    {"\"\\x\"", KVS_ERR_FORMAT, 1, "invalid escape '\\x'"},
    {"\"a\nb\"", KVS_ERR_FORMAT, 2, "raw control character 0x0A"},
    {"\"\xc0\xaf\"", KVS_ERR_FORMAT, 1, "invalid UTF-8 byte 0xC0"},
    {"\"\xed\xa0\x80\"", KVS_ERR_FORMAT, 1, "invalid UTF-8"},
    {"\"\xf4\x90\x80\x80\"", KVS_ERR_FORMAT, 1, "invalid UTF-8"},
    {"\"\xe2\x82\"", KVS_ERR_FORMAT, 1, "invalid UTF-8"},
    {"\"abc", KVS_ERR_FORMAT, 0, "unterminated string"},
    {"01", KVS_ERR_FORMAT, 0, "leading zeros"},
    {"1.", KVS_ERR_FORMAT, 0, "a digit must follow '.'"},
    {".5", KVS_ERR_FORMAT, 0, "unexpected character '.'"},
    {"+1", KVS_ERR_FORMAT, 0, "unexpected character '+'"},
    {"1e", KVS_ERR_FORMAT, 0, "exponent"},
    {"-", KVS_ERR_FORMAT, 0, "a digit must follow '-'"},
    {"NaN", KVS_ERR_FORMAT, 0, "unexpected character 'N'"},
    {"tru", KVS_ERR_FORMAT, 0, "expected 'true'"},
    {"{\"a\":1,}", KVS_ERR_FORMAT, 7, "a string key"},
    {"[1,]", KVS_ERR_FORMAT, 3, "a value"},
    {"{\"a\" 1}", KVS_ERR_FORMAT, 5, "':' after the key"},
    {"{\"a\":1} x", KVS_ERR_FORMAT, 8, "the end of the text"},
    {"[1 2]", KVS_ERR_FORMAT, 3, "',' or ']'"},
    {"\xef\xbb\xbf{}", KVS_ERR_FORMAT, 0, "unexpected byte 0xEF"},
    {"1234567890123456789012345678901234567890123456789012345678901234", KVS_ERR_FORMAT, 0, "longer than 63"},
};

Test(json_check, table) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const jcase *c = &CASES[i];
        srv_json_check_result r;
        int rc = srv_json_check(c->text, strlen(c->text), SRV_JSON_CHECK_MAX_DEPTH, &r);
        cr_assert_eq(rc, c->rc, "case %zu '%s': rc %d (%s)", i, c->text, rc, r.message);
        if (rc == 0) {
            cr_assert_str_eq(r.message, "");
            continue;
        }
        cr_assert_eq(r.offset, c->offset, "case %zu '%s': offset %zu (%s)", i, c->text, r.offset, r.message);
        cr_assert(strstr(r.message, c->msg), "case %zu '%s': message '%s'", i, c->text, r.message);
        char at[32];
        snprintf(at, sizeof at, "at byte %zu", c->offset);
        cr_assert(strstr(r.message, at), "case %zu: the message names the offset: %s", i, r.message);
    }
}

Test(json_check, facts_depth_and_bounds) {
    srv_json_check_result r;
    const char *t = "{\"ab\":[\"\\u00e9\",\"\\uD83D\\uDE00\",1,{\"\":null}]}";
    cr_assert_eq(srv_json_check(t, strlen(t), 8, &r), 0, "%s", r.message);
    cr_assert_eq(r.n_strings, 4u);            /* ab, é, 😀, "" */
    cr_assert_eq(r.string_bytes, 2u + 2 + 4); /* UTF-8 lengths after unescaping */
    cr_assert_eq(r.n_values, 7u);             /* object, array, 2 strings, 1, object, null */
    char deep[600];
    memset(deep, '[', 300);
    memset(deep + 300, ']', 300);
    cr_assert_eq(srv_json_check(deep, 600, 300, &r), 0);
    cr_assert_eq(srv_json_check(deep, 600, 299, &r), KVS_ERR_LIMIT);
    cr_assert(strstr(r.message, "nesting deeper than 299 levels at byte 299"), "%s", r.message);
    /* no byte past len is read: the length cuts a valid text into an invalid one */
    cr_assert_eq(srv_json_check("[1,2]", 4, 8, &r), KVS_ERR_FORMAT);
    cr_assert_eq(srv_json_check(NULL, 0, 8, &r), KVS_ERR_FORMAT);
    cr_assert_eq(srv_json_check(NULL, 1, 8, &r), KVS_ERR_INVALID);
    cr_assert_eq(srv_json_check("{}", 2, 8, NULL), KVS_ERR_INVALID);
}

static void tally(const cJSON *j, size_t *strings, size_t *bytes) {
    for (; j; j = j->next) {
        if (j->string) { (*strings)++; *bytes += strlen(j->string); }
        if (cJSON_IsString(j)) { (*strings)++; *bytes += strlen(j->valuestring); }
        tally(j->child, strings, bytes);
    }
}

/* Mutated request bodies: whatever the check accepts, cJSON parses completely with the same strings (nothing cut
 * by an escape); escapes and UTF-8 are mutated on purpose. */
Test(json_check, random_mutations_agree_with_cjson) {
    const char *base = "{\"prompt\":[\"a\\u00e9\\uD83D\\uDE00 b\",\"\\n\\t\\\"\"],\"stop\":[\"x\"],\"n\":2,"
                       "\"logit_bias\":{\"3\":-1.5e2},\"stream\":false,\"user\":null}";
    const char alphabet[] = "{}[]\",:0123456789.-+eE truefalsnl\\uDdbB\xc3\xa9\xed\xa0";
    size_t bl = strlen(base);
    char buf[512];
    rng s = {14};
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(buf, base, bl);
        size_t len = bl;
        int muts = 1 + (int)(rng_next(&s) % 3);
        for (int m = 0; m < muts; m++) {
            size_t pos = (size_t)(rng_next(&s) % len);
            char ch = alphabet[rng_next(&s) % (sizeof alphabet - 1)];
            int op = (int)(rng_next(&s) % 3);
            if (op == 0) buf[pos] = ch;
            else if (op == 1 && len > 1) { memmove(buf + pos, buf + pos + 1, len - pos - 1); len--; }
            else if (len < sizeof buf - 1) { memmove(buf + pos + 1, buf + pos, len - pos); buf[pos] = ch; len++; }
        }
        srv_json_check_result r;
        if (srv_json_check(buf, len, SRV_JSON_CHECK_MAX_DEPTH, &r) != 0) {
            cr_assert(r.offset <= len && r.message[0], "iteration %d", it);
            continue;
        }
        accepted++;
        const char *end = NULL;
        cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, false);
        cr_assert(root, "iteration %d: accepted, cJSON fails: %.*s", it, (int)len, buf);
        size_t strings = 0, bytes = 0;
        tally(root, &strings, &bytes);
        cr_assert_eq(strings, r.n_strings, "iteration %d: %.*s", it, (int)len, buf);
        cr_assert_eq(bytes, r.string_bytes, "iteration %d (text cut): %.*s", it, (int)len, buf);
        cJSON_Delete(root);
    }
    cr_assert_gt(accepted, 1000, "only %d mutations stayed valid JSON", accepted);
}

/* Duplicate keys (issue 30): refused with the key and its object's path named, at any depth, in small
 * (pairwise) and large (sorted) objects; distinct keys, equal keys in different objects and arrays of objects
 * pass; srv_api_parse_gen refuses such a body with 400. */
static int dup_of(const char *text, srv_json_check_result *res) {
    cJSON *j = cJSON_Parse(text);
    cr_assert_not_null(j, "%s", text);
    int r = srv_json_check_dup_keys(j, res);
    cJSON_Delete(j);
    return r;
}

Test(json_check, duplicate_keys) {
    srv_json_check_result res;
    cr_assert_eq(dup_of("{\"a\":1,\"b\":2,\"c\":{\"a\":3},\"d\":[{\"a\":1},{\"a\":2}]}", &res), 0);
    cr_assert_eq(dup_of("[1,2,{\"x\":[]}]", &res), 0);
    cr_assert_eq(dup_of("{\"max_tokens\":1,\"max_tokens\":300}", &res), KVS_ERR_FORMAT);
    cr_assert_str_eq(res.message, "duplicate key 'max_tokens'");
    cr_assert_eq(dup_of("{\"messages\":[{\"role\":\"user\"},{\"role\":\"user\",\"content\":\"a\",\"role\":\"system\"}]}",
                        &res), KVS_ERR_FORMAT);
    cr_assert_str_eq(res.message, "duplicate key 'role' in messages[1]");
    /* a large object: sorted, the duplicate anywhere */
    char big[4096];
    size_t at = 0;
    at += (size_t)snprintf(big + at, sizeof big - at, "{");
    for (int i = 0; i < 200; i++) at += (size_t)snprintf(big + at, sizeof big - at, "\"k%d\":%d,", i, i);
    at += (size_t)snprintf(big + at, sizeof big - at, "\"k0\":0}");
    cr_assert_eq(dup_of(big, &res), KVS_ERR_FORMAT);
    cr_assert_str_eq(res.message, "duplicate key 'k0'");
    big[at - 8] = '}';
    big[at - 7] = 0;
    cr_assert_eq(dup_of(big, &res), 0, "%s", big + at - 20);
    /* the API: a 400 naming the key */
    srv_api_gen g;
    srv_api_error e;
    const char *body = "{\"prompt\":\"hi\",\"max_tokens\":1,\"max_tokens\":300}";
    cr_assert_eq(srv_api_parse_gen(SRV_API_COMPLETION, body, strlen(body), NULL, &g, &e), SRV_API_ERR_INVALID);
    cr_assert_eq(e.status, 400);
    cr_assert(strstr(e.message, "duplicate key 'max_tokens'"), "%s", e.message);
}
