/* test_grammar_cache.c: the server's response_format grammar cache (server/api/grammar_cache_internal.h) and the parsing of
 * response_format (server/api/api_structured.c through srv_api_parse_gen). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "server/api/api.h"
#include "server/api/grammar_cache_internal.h"

/* A byte-level vocabulary: token t < 128 is the byte t (0 is the EOG, control bytes special), then a few
 * multi-byte pieces. */
static const char *const EXTRA[8] = {"{\"", "\":", "\",\"", "true", "false", "null", "\"}", "  "};

static gmr_vocab *byte_vocab(void) {
    enum { N = 136 };
    const char *pieces[N];
    size_t lens[N];
    uint8_t flags[N];
    static char bytes[128][2];
    for (int t = 0; t < N; t++) {
        if (t < 128) {
            bytes[t][0] = (char)t;
            pieces[t] = bytes[t];
            lens[t] = t == 0 ? 0 : 1;
            flags[t] = t == 0 ? GMR_TOKEN_EOG : (t < 32 && t != '\n' && t != '\t' ? GMR_TOKEN_SPECIAL : 0);
        } else {
            pieces[t] = EXTRA[t - 128];
            lens[t] = strlen(EXTRA[t - 128]);
            flags[t] = 0;
        }
    }
    gmr_vocab *v = NULL;
    cr_assert_eq(gmr_vocab_create(pieces, lens, flags, N, &v), KVS_OK);
    return v;
}

static cJSON *parse(const char *s) {
    cJSON *j = cJSON_Parse(s);
    cr_assert_not_null(j);
    return j;
}

/* Walks a clone of the entry's template to the end with pseudo-random allowed tokens; returns the text. */
static char *random_value(const srv_grammar_cache_entry *e, uint64_t seed) {
    gmr_matcher *m = NULL;
    cr_assert_eq(gmr_matcher_clone(srv_grammar_cache_matcher(e), &m), KVS_OK);
    uint32_t mask[8];
    char *out = calloc(1, 4096);
    size_t n = 0;
    for (int step = 0; step < 2000 && !gmr_matcher_is_finished(m); step++) {
        cr_assert_eq(gmr_matcher_fill_mask(m, mask, 8), KVS_OK);
        int32_t allowed[256], na = 0;
        for (int32_t t = 0; t < 136; t++)
            if (mask[t >> 5] >> (t & 31) & 1) allowed[na++] = t;
        cr_assert_gt(na, 0);
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        /* prefer ending once possible, so values stay short */
        int32_t t = gmr_matcher_is_complete(m) && (seed >> 60) < 8 ? 0 : allowed[(seed >> 33) % (uint64_t)na];
        cr_assert_eq(gmr_matcher_is_complete(m), (mask[0] & 1u) != 0, "an EOG is allowed exactly when complete");
        cr_assert_eq(gmr_matcher_accept_token(m, t), KVS_OK);
        if (t >= 128) {
            size_t l = strlen(EXTRA[t - 128]);
            cr_assert_lt(n + l, 4096);
            memcpy(out + n, EXTRA[t - 128], l);
            n += l;
        } else if (t > 0) {
            cr_assert_lt(n + 1, 4096);
            out[n++] = (char)t;
        }
    }
    cr_assert(gmr_matcher_is_finished(m), "no end within 2000 tokens: %s", out);
    gmr_matcher_free(m);
    return out;
}

Test(grammar_cache, schema_values_hits_and_lru_bound) {
    srv_grammar_cache *c = NULL;
    cr_assert_eq(srv_grammar_cache_create(byte_vocab(), 2, 1 << 20, &c), KVS_OK);
    const char *schema_a = "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":3,"
                           "\"maximum\":40},\"s\":{\"type\":\"string\",\"maxLength\":5}},\"required\":[\"n\",\"s\"],"
                           "\"additionalProperties\":false}";
    cJSON *sa = parse(schema_a);
    char err[256];
    srv_grammar_cache_entry *e1 = NULL, *e2 = NULL;
    cr_assert_eq(srv_grammar_cache_get(c, schema_a, sa, &e1, err, sizeof err), KVS_OK, "%s", err);
    cr_assert_eq(srv_grammar_cache_get(c, schema_a, sa, &e2, err, sizeof err), KVS_OK);
    cr_assert_eq(e1, e2, "the same schema text must reuse the compiled grammar");
    srv_grammar_cache_stats st;
    srv_grammar_cache_get_stats(c, &st);
    cr_assert_eq(st.misses, 1);
    cr_assert_eq(st.hits, 1);
    for (uint64_t seed = 1; seed <= 30; seed++) {
        char *txt = random_value(e1, seed);
        cJSON *v = cJSON_Parse(txt);
        cr_assert_not_null(v, "not JSON: %s", txt);
        cJSON *n = cJSON_GetObjectItemCaseSensitive(v, "n"), *s = cJSON_GetObjectItemCaseSensitive(v, "s");
        cr_assert(cJSON_IsNumber(n) && n->valuedouble >= 3 && n->valuedouble <= 40, "%s", txt);
        cr_assert(cJSON_IsString(s) && strlen(s->valuestring) <= 5, "%s", txt);
        cr_assert_eq(cJSON_GetArraySize(v), 2, "%s", txt);
        cJSON_Delete(v);
        free(txt);
    }
    /* json_object */
    srv_grammar_cache_entry *eo = NULL;
    cr_assert_eq(srv_grammar_cache_get(c, NULL, NULL, &eo, err, sizeof err), KVS_OK, "%s", err);
    for (uint64_t seed = 1; seed <= 10; seed++) {
        char *txt = random_value(eo, seed);
        cJSON *v = cJSON_Parse(txt);
        cr_assert(cJSON_IsObject(v), "not a JSON object: %s", txt);
        cJSON_Delete(v);
        free(txt);
    }
    /* more grammars than the bound while all are referenced: all kept; once released, trimmed to 2 */
    srv_grammar_cache_entry *more[3];
    for (int i = 0; i < 3; i++) {
        char key[64];
        snprintf(key, sizeof key, "{\"type\":\"integer\",\"maximum\":%d}", i + 5);
        cJSON *s = parse(key);
        cr_assert_eq(srv_grammar_cache_get(c, key, s, &more[i], err, sizeof err), KVS_OK, "%s", err);
        cJSON_Delete(s);
    }
    srv_grammar_cache_get_stats(c, &st);
    cr_assert_eq(st.entries, 5);
    srv_grammar_cache_release(c, e1);
    srv_grammar_cache_release(c, e2);
    srv_grammar_cache_release(c, eo);
    for (int i = 0; i < 3; i++) srv_grammar_cache_release(c, more[i]);
    srv_grammar_cache_get_stats(c, &st);
    cr_assert_eq(st.entries, 2);
    /* the most recent ones stay: the last integer schema is a hit */
    char key[64];
    snprintf(key, sizeof key, "{\"type\":\"integer\",\"maximum\":%d}", 7);
    cJSON *s7 = parse(key);
    cr_assert_eq(srv_grammar_cache_get(c, key, s7, &e1, err, sizeof err), KVS_OK);
    srv_grammar_cache_get_stats(c, &st);
    cr_assert_eq(st.hits, 2);
    srv_grammar_cache_release(c, e1);
    cJSON_Delete(s7);
    cJSON_Delete(sa);
    srv_grammar_cache_free(c);
}

Test(grammar_cache, unsupported_and_bad_schemas) {
    srv_grammar_cache *c = NULL;
    cr_assert_eq(srv_grammar_cache_create(byte_vocab(), 4, 0, &c), KVS_OK);
    char err[256];
    srv_grammar_cache_entry *e = NULL;
    const char *uk = "{\"type\":\"array\",\"uniqueItems\":true}";
    cJSON *s = parse(uk);
    cr_assert_eq(srv_grammar_cache_get(c, uk, s, &e, err, sizeof err), KVS_ERR_UNSUPPORTED);
    cr_assert_null(e);
    cr_assert(strstr(err, "uniqueItems"), "%s", err);
    cJSON_Delete(s);
    const char *bad = "{\"$ref\":\"#/$defs/missing\"}";
    s = parse(bad);
    int rc = srv_grammar_cache_get(c, bad, s, &e, err, sizeof err);
    cr_assert(rc == KVS_ERR_FORMAT || rc == KVS_ERR_NOT_FOUND, "rc %d: %s", rc, err);
    cr_assert(err[0]);
    cJSON_Delete(s);
    srv_grammar_cache_stats st;
    srv_grammar_cache_get_stats(c, &st);
    cr_assert_eq(st.entries, 0);
    srv_grammar_cache_free(c);
}

/* Threads asking for the same few schemas at once: every get has a matching entry and the counts add up. */
typedef struct tharg { srv_grammar_cache *c; int id; int ok; } tharg;
static void worker(void *p) {
    tharg *a = p;
    for (int i = 0; i < 40; i++) {
        char key[64];
        snprintf(key, sizeof key, "{\"type\":\"integer\",\"maximum\":%d}", (a->id + i) % 5);
        cJSON *s = cJSON_Parse(key);
        srv_grammar_cache_entry *e = NULL;
        char err[128];
        if (s && srv_grammar_cache_get(a->c, key, s, &e, err, sizeof err) == KVS_OK && srv_grammar_cache_matcher(e)) a->ok++;
        srv_grammar_cache_release(a->c, e);
        cJSON_Delete(s);
    }
}

Test(grammar_cache, concurrent_gets) {
    srv_grammar_cache *c = NULL;
    cr_assert_eq(srv_grammar_cache_create(byte_vocab(), 3, 0, &c), KVS_OK);
    uv_thread_t th[4];
    tharg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (tharg){c, i, 0};
        cr_assert_eq(uv_thread_create(&th[i], worker, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) uv_thread_join(&th[i]);
    srv_grammar_cache_stats st;
    srv_grammar_cache_get_stats(c, &st);
    for (int i = 0; i < 4; i++) cr_assert_eq(a[i].ok, 40);
    cr_assert_eq(st.hits + st.misses, 160);
    cr_assert_leq(st.entries, 3);
    srv_grammar_cache_free(c);
}

/* response_format in request bodies: the three types, and 400s naming response_format. */
static int parse_body(const char *body, srv_api_gen *g, srv_api_error *e) {
    return srv_api_parse_gen(SRV_API_CHAT, body, strlen(body), NULL, g, e);
}

Test(grammar_cache, parse_response_format) {
    srv_api_gen g;
    srv_api_error e;
    const char *base = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":";
    char body[1024];
    snprintf(body, sizeof body, "%s{\"type\":\"text\"}}", base);
    cr_assert_eq(parse_body(body, &g, &e), SRV_API_OK);
    cr_assert_eq(g.rf, SRV_API_RF_TEXT);
    srv_api_gen_free(&g);
    snprintf(body, sizeof body, "%s{\"type\":\"json_object\"}}", base);
    cr_assert_eq(parse_body(body, &g, &e), SRV_API_OK);
    cr_assert_eq(g.rf, SRV_API_RF_JSON_OBJECT);
    srv_api_gen_free(&g);
    snprintf(body, sizeof body,
             "%s{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"strict\":true,\"schema\":"
             "{\"type\": \"object\",  \"properties\":{}}}}}", base);
    cr_assert_eq(parse_body(body, &g, &e), SRV_API_OK);
    cr_assert_eq(g.rf, SRV_API_RF_JSON_SCHEMA);
    cr_assert_str_eq(g.rf_schema, "{\"type\":\"object\",\"properties\":{}}");
    srv_api_gen_free(&g);
    const char *bad[] = {
        "\"json\"}", "{\"type\":\"xml\"}}", "{\"type\":\"json_schema\"}}",
        "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}}",
        "{\"type\":\"json_schema\",\"json_schema\":{\"name\":3,\"schema\":{}}}}",
        "{\"type\":\"json_schema\",\"json_schema\":{\"schema\":[1]}}}",
        "{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{},\"strict\":\"yes\"}}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(body, sizeof body, "%s%s", base, bad[i]);
        cr_assert_eq(parse_body(body, &g, &e), SRV_API_ERR_INVALID, "%s", bad[i]);
        cr_assert_eq(e.status, 400);
        cr_assert_str_eq(e.param, "response_format", "%s: %s", bad[i], e.message);
    }
}
