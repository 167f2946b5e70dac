/* test_config.c: configuration defaults, the documented config file, JSON file errors, flags and precedence. */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "server/server.h"

static char *write_tmp(const char *text) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/kvs_cfg_XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    size_t r = fread(b, 1, (size_t)n, f);
    b[r] = 0;
    fclose(f);
    return b;
}

Test(config, defaults_are_valid) {
    srv_config c;
    srv_config_default(&c);
    char err[256];
    cr_assert_eq(srv_config_validate(&c, err, sizeof err), SRV_OK, "%s", err);
    cr_assert_str_eq(c.host, "127.0.0.1");
    cr_assert_eq(c.port, 8080);
    cr_assert_eq(c.parallel, 64);
    cr_assert_eq(c.batch_tokens, 512);
    cr_assert(c.prefix_caching);
    cr_assert_float_eq(c.body_limit_mb, 16.0, 1e-9);
}

/* config/kvserve.json is the documented default: loading it changes nothing, it holds every key, and
 * docs/CONFIG.md documents every key. */
Test(config, shipped_file_matches_defaults_and_docs) {
    char path[1024], doc[1024];
    snprintf(path, sizeof path, "%s/config/kvserve.json", KVSERVE_SOURCE_DIR);
    snprintf(doc, sizeof doc, "%s/docs/CONFIG.md", KVSERVE_SOURCE_DIR);
    srv_config d, c;
    srv_config_default(&d);
    srv_config_default(&c);
    char err[512];
    cr_assert_eq(srv_config_load_file(&c, path, err, sizeof err), SRV_OK, "%s", err);
    char *jd = srv_config_to_json(&d), *jc = srv_config_to_json(&c);
    cr_assert_str_eq(jd, jc);
    cJSON *keys = cJSON_Parse(jd);
    char *ftext = read_all(path), *dtext = read_all(doc);
    cr_assert(ftext && dtext);
    cJSON *file = cJSON_Parse(ftext);
    for (cJSON *k = keys->child; k; k = k->next) {
        cr_assert(cJSON_GetObjectItemCaseSensitive(file, k->string), "config/kvserve.json lacks '%s'", k->string);
        char needle[80];
        snprintf(needle, sizeof needle, "| `%s` |", k->string);
        cr_assert(strstr(dtext, needle), "docs/CONFIG.md does not document '%s'", k->string);
    }
    cr_assert_eq(cJSON_GetArraySize(file), cJSON_GetArraySize(keys));
    cJSON_Delete(keys);
    cJSON_Delete(file);
    free(jd); free(jc); free(ftext); free(dtext);
}

Test(config, file_values) {
    const char *p = write_tmp("{\"host\":\"0.0.0.0\",\"port\":9000,\"parallel\":8,\"prefix_caching\":false,"
                              "\"timeout_s\":1.5,\"kv_dtype\":\"q8_0\",\"log_format\":\"json\",\"api_key\":\"k\"}");
    srv_config c;
    srv_config_default(&c);
    char err[512];
    cr_assert_eq(srv_config_load_file(&c, p, err, sizeof err), SRV_OK, "%s", err);
    cr_assert_str_eq(c.host, "0.0.0.0");
    cr_assert_eq(c.port, 9000);
    cr_assert_eq(c.parallel, 8);
    cr_assert(!c.prefix_caching);
    cr_assert_float_eq(c.timeout_s, 1.5, 1e-9);
    cr_assert_str_eq(c.kv_dtype, "q8_0");
    cr_assert_str_eq(c.log_format, "json");
    cr_assert_str_eq(c.api_key, "k");
    cr_assert_eq(c.batch_tokens, 512); /* untouched */
    unlink(p);
}

typedef struct bad { const char *json; const char *needle; } bad;

Test(config, file_errors_name_the_key) {
    static const bad cases[] = {
        {"{\"prot\":1}", "'prot'"},
        {"{\"port\":\"80\"}", "'port'"},
        {"{\"port\":70000}", "'port'"},
        {"{\"port\":80.5}", "'port'"},
        {"{\"parallel\":0}", "'parallel'"},
        {"{\"prefix_caching\":1}", "'prefix_caching'"},
        {"{\"kv_dtype\":\"f8\"}", "'kv_dtype'"},
        {"{\"log_format\":\"xml\"}", "'log_format'"},
        {"{\"device\":\"tpu\"}", "'device'"},
        {"{\"gpu_memory_fraction\":1.5}", "'gpu_memory_fraction'"},
        {"{\"timeout_s\":0}", "'timeout_s'"},
        {"{\"chat_template\":\"unknown\"}", "'chat_template'"},
        {"{\"ctx-size\":5}", "'ctx-size'"},
        {"{\"host\":5}", "'host'"},
        {"{\"cors_origins\":5}", "'cors_origins'"},
        {"{\"cors_origins\":[\"http://a.test\",3]}", "item 1"},
        {"{\"cors_origins\":[\"http://a.test/\"]}", "must not end with '/'"},
        {"{\"cors_origins\":\"a.test\"}", "scheme://host"},
        {"[1]", "JSON object"},
        {"{\"port\":", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *p = write_tmp(cases[i].json);
        srv_config c;
        srv_config_default(&c);
        char err[512] = "";
        cr_assert_eq(srv_config_load_file(&c, p, err, sizeof err), SRV_ERR_INVALID, "case %s", cases[i].json);
        cr_assert(strstr(err, cases[i].needle), "case %s: message '%s'", cases[i].json, err);
        unlink(p);
    }
    srv_config c;
    srv_config_default(&c);
    char err[512];
    cr_assert_eq(srv_config_load_file(&c, "/nonexistent/kvserve.json", err, sizeof err), SRV_ERR_IO);
    cr_assert(strstr(err, "/nonexistent/kvserve.json"));
}

static int run_args(srv_config *c, char *err, size_t el, int argc, const char **argv) {
    srv_config_default(c);
    return srv_config_from_args(c, argc, (char **)argv, err, el);
}

Test(config, flags_and_precedence) {
    const char *p = write_tmp("{\"port\":9000,\"parallel\":8,\"api_key\":\"fromfile\",\"ctx_size\":100}");
    unsetenv("KVSERVE_API_KEY");
    srv_config c;
    char err[512];
    const char *a1[] = {"serve", "--config", p, "--port", "9100", "--ctx-size=2048", "-m", "/m.gguf",
                        "--no-prefix-caching", "--log_format", "json", "--threads", "3"};
    cr_assert_eq(run_args(&c, err, sizeof err, 13, a1), SRV_OK, "%s", err);
    cr_assert_eq(c.port, 9100);      /* flag beats file */
    cr_assert_eq(c.parallel, 8);     /* file beats default */
    cr_assert_eq(c.ctx_size, 2048);
    cr_assert_str_eq(c.model, "/m.gguf");
    cr_assert(!c.prefix_caching);
    cr_assert_str_eq(c.log_format, "json");
    cr_assert_eq(c.threads, 3);
    cr_assert_str_eq(c.api_key, "fromfile");
    /* the flag order does not matter for --config: it is applied first */
    const char *a2[] = {"serve", "--port", "9200", "--config", p};
    cr_assert_eq(run_args(&c, err, sizeof err, 5, a2), SRV_OK, "%s", err);
    cr_assert_eq(c.port, 9200);
    /* env beats file, flag beats env */
    setenv("KVSERVE_API_KEY", "fromenv", 1);
    const char *a3[] = {"serve", "--config", p};
    cr_assert_eq(run_args(&c, err, sizeof err, 3, a3), SRV_OK, "%s", err);
    cr_assert_str_eq(c.api_key, "fromenv");
    const char *a4[] = {"serve", "--config", p, "--api-key", "fromflag"};
    cr_assert_eq(run_args(&c, err, sizeof err, 5, a4), SRV_OK, "%s", err);
    cr_assert_str_eq(c.api_key, "fromflag");
    unsetenv("KVSERVE_API_KEY");
    /* booleans */
    const char *a5[] = {"serve", "--prefix-caching", "false", "--port", "1"};
    cr_assert_eq(run_args(&c, err, sizeof err, 5, a5), SRV_OK, "%s", err);
    cr_assert(!c.prefix_caching);
    cr_assert_eq(c.port, 1);
    const char *a6[] = {"serve", "--no-prefix-caching", "--prefix-caching", "--port", "2"};
    cr_assert_eq(run_args(&c, err, sizeof err, 5, a6), SRV_OK, "%s", err);
    cr_assert(c.prefix_caching);
    /* the context shift: off by default, a bare flag turns it on; n_keep -1 .. */
    cr_assert(!c.context_shift);
    cr_assert_eq(c.n_keep, 0);
    const char *a7[] = {"serve", "--context-shift", "--n-keep", "-1"};
    cr_assert_eq(run_args(&c, err, sizeof err, 4, a7), SRV_OK, "%s", err);
    cr_assert(c.context_shift);
    cr_assert_eq(c.n_keep, -1);
    const char *a8[] = {"serve", "--n-keep=-2"};
    cr_assert_eq(run_args(&c, err, sizeof err, 2, a8), SRV_ERR_INVALID);
    cr_assert(strstr(err, "n_keep"), "%s", err);
    unlink(p);
}

Test(config, flag_errors) {
    srv_config c;
    char err[512];
    const char *a1[] = {"serve", "--bogus", "1"};
    cr_assert_eq(run_args(&c, err, sizeof err, 3, a1), SRV_ERR_INVALID);
    cr_assert(strstr(err, "--bogus"), "%s", err);
    const char *a2[] = {"serve", "--port"};
    cr_assert_eq(run_args(&c, err, sizeof err, 2, a2), SRV_ERR_INVALID);
    cr_assert(strstr(err, "--port"), "%s", err);
    const char *a3[] = {"serve", "--port", "http"};
    cr_assert_eq(run_args(&c, err, sizeof err, 3, a3), SRV_ERR_INVALID);
    cr_assert(strstr(err, "port"), "%s", err);
    const char *a4[] = {"serve", "--parallel", "0"};
    cr_assert_eq(run_args(&c, err, sizeof err, 3, a4), SRV_ERR_INVALID);
    cr_assert(strstr(err, "parallel"), "%s", err);
    const char *a5[] = {"serve", "stray"};
    cr_assert_eq(run_args(&c, err, sizeof err, 2, a5), SRV_ERR_INVALID);
    const char *a6[] = {"serve", "--config", "/nonexistent.json"};
    cr_assert_eq(run_args(&c, err, sizeof err, 3, a6), SRV_ERR_IO);
    const char *a7[] = {"serve", "--kv-dtype", "int4"};
    cr_assert_eq(run_args(&c, err, sizeof err, 3, a7), SRV_ERR_INVALID);
    cr_assert(strstr(err, "kv_dtype"), "%s", err);
}

/* Every key round-trips through srv_config_set from the text of its own JSON value. */
Test(config, set_roundtrip_every_key) {
    srv_config d;
    srv_config_default(&d);
    char *j = srv_config_to_json(&d);
    cJSON *o = cJSON_Parse(j);
    for (cJSON *k = o->child; k; k = k->next) {
        char val[1024], err[256];
        if (cJSON_IsObject(k)) {
            char *t = cJSON_PrintUnformatted(k);
            snprintf(val, sizeof val, "%s", t);
            free(t);
        } else if (cJSON_IsString(k)) snprintf(val, sizeof val, "%s", k->valuestring);
        else if (cJSON_IsBool(k)) snprintf(val, sizeof val, "%s", cJSON_IsTrue(k) ? "true" : "false");
        else snprintf(val, sizeof val, "%.17g", k->valuedouble);
        srv_config c = d;
        cr_assert_eq(srv_config_set(&c, k->string, val, err, sizeof err), SRV_OK, "%s=%s: %s", k->string, val, err);
        char *j2 = srv_config_to_json(&c);
        cr_assert_str_eq(j, j2, "key %s", k->string);
        free(j2);
    }
    cJSON_Delete(o);
    free(j);
}

/* cors_origins: a list in the file, a comma string in a flag; every malformed entry is refused by name. */
Test(config, cors_origins) {
    srv_config c;
    srv_config_default(&c);
    cr_assert_str_eq(c.cors_origins, "", "default: the automatic rule");
    char err[512];
    const char *p = write_tmp("{\"cors_origins\":[\"http://localhost:3000\",\"https://app.example.com\"]}");
    cr_assert_eq(srv_config_load_file(&c, p, err, sizeof err), SRV_OK, "%s", err);
    cr_assert_str_eq(c.cors_origins, "http://localhost:3000, https://app.example.com");
    unlink(p);
    p = write_tmp("{\"cors_origins\":[]}");
    cr_assert_eq(srv_config_load_file(&c, p, err, sizeof err), SRV_OK, "%s", err);
    cr_assert_str_eq(c.cors_origins, "none", "an empty list allows no origin");
    unlink(p);
    const char *argv[] = {"serve", "--cors-origins", "*"};
    cr_assert_eq(run_args(&c, err, sizeof err, 3, argv), SRV_OK, "%s", err);
    cr_assert_str_eq(c.cors_origins, "*");
    static const char *const bad[] = {"http://a.test/x", "ftp:/a", "http://a.test, ", "http://a b.test", "*.test"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *a[] = {"serve", "--cors-origins", bad[i]};
        cr_assert_eq(run_args(&c, err, sizeof err, 3, a), SRV_ERR_INVALID, "%s", bad[i]);
        cr_assert(strstr(err, "cors_origins"), "%s: %s", bad[i], err);
    }
}

/* kv_events_config: vLLM's KVEventsConfig keys, an object in the file, JSON text as a flag; checked at once. */
Test(config, kv_events_config) {
    srv_config c;
    srv_config_default(&c);
    char err[512];
    char *argv[] = {"kvserve", "--kv-events-config",
                    "{\"enable_kv_cache_events\": true, \"endpoint\": \"tcp://*:6100\", \"topic\": \"kv@a@b\"}"};
    cr_assert_eq(srv_config_from_args(&c, 3, argv, err, sizeof err), SRV_OK, "%s", err);
    char *j = srv_config_to_json(&c);
    cJSON *o = cJSON_Parse(j);
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(o, "kv_events_config");
    cr_assert(cJSON_IsObject(k));
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(k, "enable_kv_cache_events")));
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(k, "publisher")->valuestring, "zmq");
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(k, "endpoint")->valuestring, "tcp://*:6100");
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(k, "topic")->valuestring, "kv@a@b");
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(k, "buffer_steps")->valuedouble, 10000);
    cJSON_Delete(o);
    free(j);
    const char *p = write_tmp("{\"kv_events_config\": {\"enable_kv_cache_events\": true, \"hwm\": -1}}");
    srv_config_default(&c);
    cr_assert_eq(srv_config_load_file(&c, p, err, sizeof err), SRV_ERR_INVALID);
    cr_assert(strstr(err, "hwm"), "%s", err);
    unlink(p);
    p = write_tmp("{\"kv_events_config\": \"on\"}");
    cr_assert_eq(srv_config_load_file(&c, p, err, sizeof err), SRV_ERR_INVALID);
    unlink(p);
    cr_assert(strstr(err, "kv_events_config"), "%s", err);
    cr_assert_eq(srv_config_set(&c, "kv-events-config", "{\"bogus\": 1}", err, sizeof err), SRV_ERR_INVALID);
    cr_assert(strstr(err, "bogus"), "%s", err);
    cr_assert_eq(srv_config_set(&c, "kv-events-config", "not json", err, sizeof err), SRV_ERR_INVALID);
}

/* scheduling_policy (vLLM's --scheduling-policy): fcfs by default, priority from the file or the flag, anything
 * else refused by name. */
Test(config, scheduling_policy) {
    srv_config c;
    srv_config_default(&c);
    cr_assert_str_eq(c.scheduling_policy, "fcfs");
    char err[512];
    const char *p = write_tmp("{\"scheduling_policy\":\"priority\"}");
    const char *a1[] = {"serve", "--config", p};
    cr_assert_eq(run_args(&c, err, sizeof err, 3, a1), SRV_OK, "%s", err);
    cr_assert_str_eq(c.scheduling_policy, "priority");
    const char *a2[] = {"serve", "--config", p, "--scheduling-policy", "fcfs"};
    cr_assert_eq(run_args(&c, err, sizeof err, 5, a2), SRV_OK, "%s", err);
    cr_assert_str_eq(c.scheduling_policy, "fcfs");
    const char *a3[] = {"serve", "--scheduling-policy=priority"};
    cr_assert_eq(run_args(&c, err, sizeof err, 2, a3), SRV_OK, "%s", err);
    cr_assert_str_eq(c.scheduling_policy, "priority");
    const char *a4[] = {"serve", "--scheduling-policy", "lifo"};
    cr_assert_eq(run_args(&c, err, sizeof err, 3, a4), SRV_ERR_INVALID);
    cr_assert(strstr(err, "scheduling_policy") && strstr(err, "fcfs|priority"), "%s", err);
    unlink(p);
    p = write_tmp("{\"scheduling_policy\":1}");
    cr_assert_eq(srv_config_load_file(&c, p, err, sizeof err), SRV_ERR_INVALID);
    cr_assert(strstr(err, "scheduling_policy"), "%s", err);
    unlink(p);
}

Test(config, speculative_decoding) {
    srv_config c;
    srv_config_default(&c);
    cr_assert_str_eq(c.spec_type, ""); /* none, or draft when model_draft is set */
    cr_assert_str_eq(c.model_draft, "");
    cr_assert(c.draft_p_min == 0);
    cr_assert_eq(c.draft_max, 16);
    cr_assert_eq(c.draft_min, 0);
    char err[512];
    const char *a1[] = {"serve", "--spec-type", "ngram", "--draft-max", "8", "--draft-min=2"};
    cr_assert_eq(run_args(&c, err, sizeof err, 6, a1), SRV_OK, "%s", err);
    cr_assert_str_eq(c.spec_type, "ngram");
    cr_assert_eq(c.draft_max, 8);
    cr_assert_eq(c.draft_min, 2);
    const char *a2[] = {"serve", "--spec-type", "eagle"};
    cr_assert_eq(run_args(&c, err, sizeof err, 3, a2), SRV_ERR_INVALID);
    cr_assert(strstr(err, "spec_type") && strstr(err, "none|ngram|draft"), "%s", err);
    const char *a5[] = {"serve", "--spec-type", "draft"};
    cr_assert_eq(run_args(&c, err, sizeof err, 3, a5), SRV_ERR_INVALID);
    cr_assert(strstr(err, "spec_type") && strstr(err, "model_draft"), "%s", err);
    const char *a6[] = {"serve", "-md", "/d.gguf", "--draft-p-min", "0.5"};
    cr_assert_eq(run_args(&c, err, sizeof err, 5, a6), SRV_OK, "%s", err);
    cr_assert_str_eq(c.model_draft, "/d.gguf");
    cr_assert_str_eq(c.spec_type, "");
    cr_assert(c.draft_p_min == 0.5);
    const char *a7[] = {"serve", "--model-draft", "/e.gguf", "--spec-type", "draft"};
    cr_assert_eq(run_args(&c, err, sizeof err, 5, a7), SRV_OK, "%s", err);
    cr_assert_str_eq(c.model_draft, "/e.gguf");
    cr_assert_str_eq(c.spec_type, "draft");
    const char *a8[] = {"serve", "--draft-p-min", "1.5"};
    cr_assert_eq(run_args(&c, err, sizeof err, 3, a8), SRV_ERR_INVALID);
    cr_assert(strstr(err, "draft_p_min"), "%s", err);
    const char *a3[] = {"serve", "--draft-max", "33"};
    cr_assert_eq(run_args(&c, err, sizeof err, 3, a3), SRV_ERR_INVALID);
    cr_assert(strstr(err, "draft_max"), "%s", err);
    const char *a4[] = {"serve", "--draft-max", "4", "--draft-min", "5"};
    cr_assert_eq(run_args(&c, err, sizeof err, 5, a4), SRV_ERR_INVALID);
    cr_assert(strstr(err, "draft_min") && strstr(err, "draft_max"), "%s", err);
}
