/* test_tool_format.c: server/api/tool_format_internal.h: the format picked per template/family, the constrained tool-call
 * grammars, and the prompt texts of the built-in families.
 *
 * The main test is randomized: for every format, parallel or not, any tool or a named one, random walks pick
 * uniformly among the tokens the grammar's mask allows until an eog token; every finished output must parse
 * (server/api/tool_call_internal.h) into calls of the allowed tools, exactly one when parallel_tool_calls is false, whose
 * arguments a validator written here accepts against the function's parameters. It runs over a byte
 * vocabulary, and over the real Qwen2 vocabulary (../shared) for the Hermes format, where <tool_call> is a
 * token of its own. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helper_rng.h"
#include "helper_shared.h"
#include "helper_vocab.h"
#include "server/api/tool_call_internal.h"
#include "server/api/tool_format_internal.h"

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

/* ---- the tools ------------------------------------------------------------------------------------------- */

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"weather\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":8},"
    "\"unit\":{\"enum\":[\"C\",\"F\"]},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14}},"
    "\"required\":[\"city\",\"unit\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"now\"}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"say \\\"hi\\\"\\\\x\",\"parameters\":{\"properties\":"
    "{\"n\":{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":3},\"tags\":{\"type\":\"array\",\"items\":"
    "{\"type\":\"string\",\"maxLength\":3},\"minItems\":1,\"maxItems\":2},\"ok\":{\"type\":[\"boolean\",\"null\"]}},"
    "\"required\":[\"n\",\"tags\",\"ok\"],\"additionalProperties\":false}}}]";

/* A validator for the keywords the tools use (independent of the grammar compiler). */
static size_t utf8_count(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static bool type_ok(const char *t, const cJSON *v) {
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == (double)(long long)v->valuedouble;
    return false;
}

static bool valid(const cJSON *s, const cJSON *v, char *why, size_t wl) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(ty) && !type_ok(ty->valuestring, v)) return snprintf(why, wl, "not a %s", ty->valuestring), false;
    if (cJSON_IsArray(ty)) {
        bool any = false;
        const cJSON *t;
        cJSON_ArrayForEach(t, ty) any = any || type_ok(t->valuestring, v);
        if (!any) return snprintf(why, wl, "no type of the list"), false;
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (en) {
        bool any = false;
        const cJSON *e;
        cJSON_ArrayForEach(e, en) any = any || cJSON_Compare(e, v, true);
        if (!any) return snprintf(why, wl, "not in the enum"), false;
    }
    const cJSON *k;
    if (cJSON_IsNumber(v)) {
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "minimum")) && v->valuedouble < k->valuedouble)
            return snprintf(why, wl, "%g < minimum", v->valuedouble), false;
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "maximum")) && v->valuedouble > k->valuedouble)
            return snprintf(why, wl, "%g > maximum", v->valuedouble), false;
    }
    if (cJSON_IsString(v) && (k = cJSON_GetObjectItemCaseSensitive(s, "maxLength")) &&
        (double)utf8_count(v->valuestring) > k->valuedouble)
        return snprintf(why, wl, "string too long"), false;
    if (cJSON_IsArray(v)) {
        int n = cJSON_GetArraySize(v);
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "minItems")) && n < k->valueint) return snprintf(why, wl, "few items"), false;
        if ((k = cJSON_GetObjectItemCaseSensitive(s, "maxItems")) && n > k->valueint) return snprintf(why, wl, "many items"), false;
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items"), *it;
        cJSON_ArrayForEach(it, v) if (items && !valid(items, it, why, wl)) return false;
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties"), *r, *it;
        cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(s, "required"))
            if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring)) return snprintf(why, wl, "missing %s", r->valuestring), false;
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        cJSON_ArrayForEach(it, v) {
            const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, it->string) : NULL;
            if (ps && !valid(ps, it, why, wl)) return false;
            if (!ps && cJSON_IsFalse(ap)) return snprintf(why, wl, "extra key %s", it->string), false;
        }
    }
    return true;
}

/* The parameters of the tool named `name` (NULL: none; "absent" when it has none). */
static const cJSON *params_of(const cJSON *tools, const char *name, bool *found) {
    const cJSON *t;
    *found = false;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring, name)) {
            *found = true;
            return cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        }
    }
    return NULL;
}

/* ---- vocabularies and walks ------------------------------------------------------------------------------------ */

#define BYTE_VOCAB 257
static gmr_vocab *byte_vocab(const char **pieces, size_t *lens) {
    static char bytes[256];
    uint8_t flags[BYTE_VOCAB] = {0};
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        pieces[i] = &bytes[i];
        lens[i] = 1;
    }
    pieces[256] = "</s>";
    lens[256] = 4;
    flags[256] = GMR_TOKEN_EOG;
    gmr_vocab *v = NULL;
    cr_assert_eq(gmr_vocab_create(pieces, lens, flags, BYTE_VOCAB, &v), 0);
    return v;
}

/* One random walk; the text (without the eog token) in *out. false when it did not finish within max_steps. */
static bool walk(const gmr_grammar *g, const gmr_vocab *v, const char *const *pieces, const size_t *lens, rng *r,
                 int max_steps, kvs_buf *out) {
    gmr_matcher *m = NULL;
    cr_assert_eq(gmr_matcher_create(g, v, 0, &m), 0);
    size_t nw = gmr_mask_words(v);
    uint32_t *mask = malloc(nw * sizeof *mask);
    int32_t n_vocab = gmr_vocab_size(v);
    int32_t *allowed = malloc((size_t)n_vocab * sizeof *allowed);
    kvs_buf_clear(out);
    bool done = false;
    for (int step = 0; step < max_steps && !done; step++) {
        cr_assert_eq(gmr_matcher_fill_mask(m, mask, nw), 0);
        int32_t na = 0;
        for (int32_t t = 0; t < n_vocab; t++)
            if (mask[t / 32] >> (t % 32) & 1) allowed[na++] = t;
        cr_assert_gt(na, 0, "a dead state after %s", out->data ? out->data : "");
        int32_t t = allowed[rng_int(r, na)];
        cr_assert_eq(gmr_matcher_accept_token(m, t), 0);
        if (gmr_matcher_is_finished(m)) done = true;
        else kvs_buf_append(out, pieces[t], lens[t]);
    }
    free(mask);
    free(allowed);
    gmr_matcher_free(m);
    return done;
}

typedef struct walk_case { srv_tool_format fmt; bool parallel; const char *name; } walk_case;

/* Walks the grammar of one case and checks every finished output. Returns how many finished. */
static int check_case(const cJSON *tools, const walk_case *wc, const gmr_vocab *v, const char *const *pieces,
                      const size_t *lens, int n_walks, int max_steps, uint64_t seed, int *multi) {
    srv_tool_format_choice ch = {tools, wc->name, wc->parallel, wc->fmt};
    gmr_grammar *g = NULL;
    char err[512];
    cr_assert_eq(srv_tool_format_compile(&ch, &g, err, sizeof err), 0, "%s: %s", srv_tool_format_name(wc->fmt), err);
    rng r = {seed};
    kvs_buf text = {0};
    int finished = 0;
    for (int w = 0; w < n_walks; w++) {
        if (!walk(g, v, pieces, lens, &r, max_steps, &text)) continue;
        finished++;
        srv_tool_call_result res;
        cr_assert_eq(srv_tool_call_parse(text.data, text.len, &res), 0);
        cr_assert_gt(res.n_calls, 0, "%s: not parsed as calls: %s", srv_tool_format_name(wc->fmt), text.data);
        cr_assert_eq(res.content_len, 0, "content before the calls: %s", text.data);
        if (!wc->parallel) cr_assert_eq(res.n_calls, 1, "parallel_tool_calls false: %d calls in %s", res.n_calls, text.data);
        if (res.n_calls > 1) (*multi)++;
        for (int k = 0; k < res.n_calls; k++) {
            if (wc->name) cr_assert_str_eq(res.calls[k].name, wc->name);
            bool found;
            const cJSON *params = params_of(tools, res.calls[k].name, &found);
            cr_assert(found, "unknown function %s in %s", res.calls[k].name, text.data);
            cJSON *args = cJSON_Parse(res.calls[k].arguments);
            cr_assert(cJSON_IsObject(args), "%s", res.calls[k].arguments);
            char why[128] = "";
            if (params) cr_assert(valid(params, args, why, sizeof why), "%s: %s in %s", res.calls[k].name, why, text.data);
            else cr_assert_null(args->child, "a function without parameters got %s", res.calls[k].arguments);
            cJSON_Delete(args);
        }
        /* the envelope of the format */
        if (wc->fmt == SRV_TOOL_FORMAT_HERMES) cr_assert(!strncmp(text.data, "<tool_call>\n{\"name\": ", 21), "%s", text.data);
        if (wc->fmt == SRV_TOOL_FORMAT_MISTRAL) cr_assert(!strncmp(text.data, "[TOOL_CALLS][{\"name\": ", 22), "%s", text.data);
        if (wc->fmt == SRV_TOOL_FORMAT_LLAMA3 && text.data[0] == '{') cr_assert(strstr(text.data, "\"parameters\": "), "%s", text.data);
        srv_tool_call_result_free(&res);
    }
    kvs_buf_free(&text);
    gmr_grammar_free(g);
    return finished;
}

Test(tool_format, random_walks_byte_vocab) {
    const char *pieces[BYTE_VOCAB];
    size_t lens[BYTE_VOCAB];
    gmr_vocab *v = byte_vocab(pieces, lens);
    cJSON *tools = cJSON_Parse(TOOLS);
    cr_assert_not_null(tools);
    const char *names[] = {NULL, "get_weather", "now", "say \"hi\"\\x"};
    int total = 0, finished = 0, multi = 0;
    uint64_t seed = 0x9E3779B97F4A7C15ULL;
    for (int f = 0; f < 4; f++)
        for (int par = 0; par < 2; par++)
            for (int ni = 0; ni < 4; ni++) {
                walk_case wc = {(srv_tool_format)f, par == 1, names[ni]};
                int n = SAN_BUILD ? 3 : 12;
                finished += check_case(tools, &wc, v, pieces, lens, n, 4000, seed++, &multi);
                total += n;
            }
    cr_log_info("byte vocabulary: %d of %d walks finished, %d with several calls", finished, total, multi);
    cr_expect_geq(finished * 10, total * 9, "too few walks finished: %d of %d", finished, total);
    cr_expect_gt(multi, 0, "parallel_tool_calls true never gave several calls");
    cJSON_Delete(tools);
    gmr_vocab_free(v);
}

Test(tool_format, random_walks_qwen2_vocab, .timeout = 600) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/vocab-only/ggml-vocab-qwen2.gguf", kvt_shared_dir());
    FILE *fp = fopen(path, "rb");
    if (!fp) cr_skip_test("%s not found (no ../shared): the real-vocabulary walks are skipped", path);
    fclose(fp);
    char err[512];
    gmr_vocab *v = NULL;
    kvt_pieces pc;
    cr_assert_eq(kvt_load_vocab_pieces(path, &v, &pc, err, sizeof err), 0, "%s", err);
    cJSON *tools = cJSON_Parse(TOOLS);
    int multi = 0, finished = 0, total = 0;
    const walk_case cases[] = {{SRV_TOOL_FORMAT_HERMES, true, NULL}, {SRV_TOOL_FORMAT_HERMES, false, "get_weather"},
                               {SRV_TOOL_FORMAT_LLAMA3, true, NULL}, {SRV_TOOL_FORMAT_MISTRAL, false, NULL}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int nw = SAN_BUILD ? 2 : 5;
        finished += check_case(tools, &cases[i], v, (const char *const *)pc.pieces, pc.lens, nw, 1500, 77 + i, &multi);
        total += nw;
    }
    cr_log_info("qwen2 vocabulary: %d of %d walks finished", finished, total);
    cr_expect_geq(finished * 10, total * 7, "too few walks finished: %d of %d", finished, total);
    cJSON_Delete(tools);
    kvt_pieces_free(&pc);
    gmr_vocab_free(v);
}

/* ---- errors and keys -------------------------------------------------------------------------------------------- */

static int compile_tools(const char *json, const char *name, char *err, size_t el) {
    cJSON *tools = cJSON_Parse(json);
    cr_assert_not_null(tools, "%s", json);
    srv_tool_format_choice ch = {tools, name, true, SRV_TOOL_FORMAT_HERMES};
    gmr_grammar *g = NULL;
    int rc = srv_tool_format_compile(&ch, &g, err, el);
    gmr_grammar_free(g);
    cJSON_Delete(tools);
    return rc;
}

Test(tool_format, errors_name_the_tool_and_keyword) {
    char err[512];
    int rc = compile_tools("[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},{\"type\":\"function\",\"function\":"
                           "{\"name\":\"b\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"array\","
                           "\"uniqueItems\":true}}}}}]", NULL, err, sizeof err);
    cr_assert_eq(rc, KVS_ERR_UNSUPPORTED, "%d %s", rc, err);
    cr_assert(strstr(err, "uniqueItems") && strstr(err, "tools[1]") && strstr(err, "'b'"), "%s", err);
    /* the same tool is not compiled when another one is named */
    cr_assert_eq(compile_tools("[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},{\"type\":\"function\",\"function\":"
                               "{\"name\":\"b\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"array\","
                               "\"uniqueItems\":true}}}}}]", "a", err, sizeof err), 0, "%s", err);
    rc = compile_tools("[{\"type\":\"function\",\"function\":{\"name\":\"s\",\"parameters\":{\"type\":\"string\"}}}]", NULL, err, sizeof err);
    cr_assert_eq(rc, KVS_ERR_TYPE, "%s", err);
    cr_assert(strstr(err, "object"), "%s", err);
    rc = compile_tools("[{\"type\":\"function\",\"function\":{\"name\":\"s\",\"parameters\":[1]}}]", NULL, err, sizeof err);
    cr_assert_eq(rc, KVS_ERR_TYPE, "%s", err);
    rc = compile_tools("[{\"type\":\"function\",\"function\":{\"name\":\"s\"}}]", "t", err, sizeof err);
    cr_assert_eq(rc, KVS_ERR_INVALID, "%s", err);
    cr_assert_eq(compile_tools("[]", NULL, err, sizeof err), KVS_ERR_INVALID);
    rc = compile_tools("[{\"type\":\"function\",\"function\":{\"name\":\"s\",\"parameters\":{\"$ref\":\"#/$defs/x\"}}}]",
                       NULL, err, sizeof err);
    cr_assert_eq(rc, KVS_ERR_FORMAT, "%d %s", rc, err);
    /* a top-level $ref (as some generators write) is kept as it is */
    cr_assert_eq(compile_tools("[{\"type\":\"function\",\"function\":{\"name\":\"s\",\"parameters\":{\"$ref\":"
                               "\"#/$defs/x\",\"$defs\":{\"x\":{\"type\":\"object\",\"properties\":{}}}}}}]",
                               NULL, err, sizeof err), 0, "%s", err);
}

Test(tool_format, keys_tell_choices_apart) {
    cJSON *tools = cJSON_Parse(TOOLS);
    char *keys[4 * 2 * 2];
    int n = 0;
    for (int f = 0; f < 4; f++)
        for (int par = 0; par < 2; par++)
            for (int named = 0; named < 2; named++) {
                srv_tool_format_choice ch = {tools, named ? "now" : NULL, par == 1, (srv_tool_format)f};
                keys[n] = srv_tool_format_key(&ch);
                cr_assert_not_null(keys[n]);
                cr_assert_eq(keys[n][0], '\x02');
                for (int j = 0; j < n; j++) cr_assert_str_neq(keys[j], keys[n]);
                n++;
            }
    srv_tool_format_choice ch = {tools, NULL, true, SRV_TOOL_FORMAT_HERMES};
    char *again = srv_tool_format_key(&ch);
    cr_assert_str_eq(again, keys[6]); /* index f*4 + par*2 + named: Hermes (1), parallel, any tool */
    free(again);
    for (int j = 0; j < n; j++) free(keys[j]);
    cJSON_Delete(tools);
}

Test(tool_format, detect) {
    cr_assert_eq(srv_tool_format_detect("{{ '<tool_call>' }}<|im_start|>", ENG_CHAT_AUTO), SRV_TOOL_FORMAT_HERMES);
    cr_assert_eq(srv_tool_format_detect("[INST] {{ '[TOOL_CALLS]' }}", ENG_CHAT_AUTO), SRV_TOOL_FORMAT_MISTRAL);
    cr_assert_eq(srv_tool_format_detect("<|start_header_id|>x<|end_header_id|><|python_tag|>", ENG_CHAT_AUTO), SRV_TOOL_FORMAT_LLAMA3);
    cr_assert_eq(srv_tool_format_detect("<|start_header_id|>x<|end_header_id|>", ENG_CHAT_AUTO), SRV_TOOL_FORMAT_LLAMA3);
    cr_assert_eq(srv_tool_format_detect("<|im_start|>{{ m }}<|im_end|>", ENG_CHAT_AUTO), SRV_TOOL_FORMAT_HERMES);
    cr_assert_eq(srv_tool_format_detect("[INST] {{ m }} [/INST]", ENG_CHAT_AUTO), SRV_TOOL_FORMAT_MISTRAL);
    cr_assert_eq(srv_tool_format_detect("<start_of_turn>", ENG_CHAT_AUTO), SRV_TOOL_FORMAT_GENERIC);
    cr_assert_eq(srv_tool_format_detect("something else", ENG_CHAT_AUTO), SRV_TOOL_FORMAT_HERMES); /* rendered as ChatML */
    cr_assert_eq(srv_tool_format_detect(NULL, ENG_CHAT_AUTO), SRV_TOOL_FORMAT_HERMES);
    cr_assert_eq(srv_tool_format_detect(NULL, ENG_CHAT_LLAMA3), SRV_TOOL_FORMAT_LLAMA3);
    cr_assert_eq(srv_tool_format_detect(NULL, ENG_CHAT_MISTRAL), SRV_TOOL_FORMAT_MISTRAL);
    cr_assert_eq(srv_tool_format_detect(NULL, ENG_CHAT_GEMMA), SRV_TOOL_FORMAT_GENERIC);
    cr_assert_eq(srv_tool_format_detect(NULL, ENG_CHAT_PHI3), SRV_TOOL_FORMAT_GENERIC);
    /* a forced family wins over what the text looks like, the markers over the family */
    cr_assert_eq(srv_tool_format_detect("<|im_start|>", ENG_CHAT_GEMMA), SRV_TOOL_FORMAT_GENERIC);
    cr_assert_eq(srv_tool_format_detect("<tool_call>", ENG_CHAT_GEMMA), SRV_TOOL_FORMAT_HERMES);
}

/* ---- prompts ---------------------------------------------------------------------------------------------------- */

Test(tool_format, history_calls_parse_back) {
    cJSON *calls = cJSON_Parse("[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
                               "{\"city\":\"Paris\"}}},{\"function\":{\"name\":\"now\",\"arguments\":{}}}]");
    for (int f = 0; f < 4; f++)
        for (int n = 1; n <= 2; n++) {
            cJSON *sub = cJSON_Duplicate(calls, true);
            if (n == 1) cJSON_DeleteItemFromArray(sub, 1);
            kvs_buf b = {0};
            cr_assert_eq(srv_tool_format_calls_text((srv_tool_format)f, sub, &b), 0);
            srv_tool_call_result r;
            cr_assert_eq(srv_tool_call_parse(b.data, b.len, &r), 0);
            cr_assert_eq(r.n_calls, n, "%s: %s", srv_tool_format_name((srv_tool_format)f), b.data);
            cr_assert_str_eq(r.calls[0].name, "get_weather");
            cr_assert_str_eq(r.calls[0].arguments, "{\"city\":\"Paris\"}");
            if (n == 2) cr_assert_str_eq(r.calls[1].arguments, "{}");
            srv_tool_call_result_free(&r);
            kvs_buf_free(&b);
            cJSON_Delete(sub);
        }
    cJSON_Delete(calls);
}

Test(tool_format, prompts_and_results) {
    cJSON *tools = cJSON_Parse(TOOLS);
    static const char *const needles[] = {"\"arguments\"", "<tool_call>", "\"parameters\"", "[TOOL_CALLS]"};
    for (int f = 0; f < 4; f++) {
        kvs_buf b = {0};
        cr_assert_eq(srv_tool_format_prompt((srv_tool_format)f, tools, &b), 0);
        cr_assert(strstr(b.data, "get_weather") && strstr(b.data, "maxLength"), "%s", b.data);
        cr_assert(strstr(b.data, needles[f]), "%s: %s", srv_tool_format_name((srv_tool_format)f), b.data);
        kvs_buf_free(&b);
        const char *role = NULL;
        cr_assert_eq(srv_tool_format_result_text((srv_tool_format)f, "get_weather", "sunny \"21\"", &role, &b), 0);
        cr_assert(strstr(b.data, f == SRV_TOOL_FORMAT_MISTRAL ? "sunny \\\"21\\\"" : "sunny \"21\""), "%s", b.data);
        cr_assert_str_eq(role, f == SRV_TOOL_FORMAT_LLAMA3 ? "ipython" : "user");
        kvs_buf_free(&b);
    }
    cJSON_Delete(tools);
}
