/* test_tool_calls.c: tool calls parsed out of generated text (server/api/tool_call_internal.h): every format, malformed
 * input, and the streaming hold-back checked at every split point against the final parse. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/common.h"
#include "server/api/tool_call_internal.h"

static srv_tool_call_result parse(const char *s) {
    srv_tool_call_result r;
    cr_assert_eq(srv_tool_call_parse(s, strlen(s), &r), 0);
    return r;
}

/* arguments JSON equals want (compared as parsed values) */
static void args_eq(const char *got, const char *want) {
    cJSON *a = cJSON_Parse(got), *b = cJSON_Parse(want);
    cr_assert(a && b, "bad JSON %s / %s", got, want);
    cr_assert(cJSON_Compare(a, b, true), "arguments %s, want %s", got, want);
    cJSON_Delete(a);
    cJSON_Delete(b);
}

Test(tool_calls, hermes_qwen) {
    srv_tool_call_result r = parse("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
                            "<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>");
    cr_assert_eq(r.n_calls, 2);
    cr_assert_eq(r.content_len, strlen("Let me check."));
    cr_assert_str_eq(r.calls[0].name, "get_weather");
    args_eq(r.calls[0].arguments, "{\"city\":\"Paris\"}");
    cr_assert_str_eq(r.calls[1].name, "get_time");
    args_eq(r.calls[1].arguments, "{}");
    srv_tool_call_result_free(&r);
    /* the closing tag eaten by a stop sequence */
    r = parse("<tool_call>{\"name\":\"f\",\"arguments\":{\"x\":[1,2]}}");
    cr_assert_eq(r.n_calls, 1);
    cr_assert_eq(r.content_len, 0);
    args_eq(r.calls[0].arguments, "{\"x\":[1,2]}");
    srv_tool_call_result_free(&r);
    /* arguments as a JSON string */
    r = parse("<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}</tool_call>");
    cr_assert_eq(r.n_calls, 1);
    args_eq(r.calls[0].arguments, "{\"a\":1}");
    srv_tool_call_result_free(&r);
}

Test(tool_calls, mistral) {
    srv_tool_call_result r = parse("[TOOL_CALLS][{\"name\":\"a\",\"arguments\":{\"q\":\"x\"}},{\"name\":\"b\",\"arguments\":{}}]");
    cr_assert_eq(r.n_calls, 2);
    cr_assert_eq(r.content_len, 0);
    cr_assert_str_eq(r.calls[0].name, "a");
    cr_assert_str_eq(r.calls[1].name, "b");
    args_eq(r.calls[0].arguments, "{\"q\":\"x\"}");
    srv_tool_call_result_free(&r);
}

Test(tool_calls, llama3_json_and_python_tag) {
    srv_tool_call_result r = parse("  {\"name\": \"search\", \"parameters\": {\"query\": \"kv cache\"}}\n");
    cr_assert_eq(r.n_calls, 1);
    cr_assert_eq(r.content_len, 0);
    cr_assert_str_eq(r.calls[0].name, "search");
    args_eq(r.calls[0].arguments, "{\"query\":\"kv cache\"}");
    srv_tool_call_result_free(&r);
    r = parse("{\"type\": \"function\", \"name\": \"f\", \"parameters\": {}}");
    cr_assert_eq(r.n_calls, 1);
    srv_tool_call_result_free(&r);
    r = parse("<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}");
    cr_assert_eq(r.n_calls, 2);
    cr_assert_str_eq(r.calls[1].name, "b");
    srv_tool_call_result_free(&r);
    r = parse("Running it.<|python_tag|>print(1 + 1)");
    cr_assert_eq(r.n_calls, 1);
    cr_assert_str_eq(r.calls[0].name, "python");
    args_eq(r.calls[0].arguments, "{\"code\":\"print(1 + 1)\"}");
    cr_assert_eq(r.content_len, strlen("Running it."));
    srv_tool_call_result_free(&r);
}

Test(tool_calls, generic_json) {
    srv_tool_call_result r = parse("{\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}");
    cr_assert_eq(r.n_calls, 1);
    cr_assert_str_eq(r.calls[0].name, "f");
    srv_tool_call_result_free(&r);
    r = parse("[{\"name\":\"f\",\"arguments\":{\"k\":true}},{\"name\":\"g\"}]");
    cr_assert_eq(r.n_calls, 2);
    args_eq(r.calls[1].arguments, "{}");
    srv_tool_call_result_free(&r);
}

Test(tool_calls, not_calls) {
    static const char *const cases[] = {
        "", "Hello there.", "{\"answer\": 42}", "[1, 2, 3]", "{\"name\": \"\"}", "{\"name\": 5}",
        "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>", "<tool_call>not json</tool_call>",
        "<tool_call>{\"name\":\"f\"}</tool_call> and then text", "[TOOL_CALLS]", "[TOOL_CALLS][]",
        "[TOOL_CALLS][{\"name\":\"f\"}] trailing", "{\"name\":\"f\",\"arguments\":\"not json\"}",
        "{\"name\":\"f\",\"arguments\":[1]}", "<|python_tag|>   ", "{\"name\": \"f\"} trailing",
        "<tool_call>", "<tool_call>{\"name\":\"f\"}</tool_call><tool_call>{bad}</tool_call>",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        srv_tool_call_result r = parse(cases[i]);
        cr_assert_eq(r.n_calls, 0, "case %zu: %s", i, cases[i]);
        cr_assert_eq(r.content_len, strlen(cases[i]), "case %zu", i);
        cr_assert_null(r.calls);
    }
    srv_tool_call_result r;
    cr_assert_eq(srv_tool_call_parse(NULL, 3, &r), KVS_ERR_INVALID);
    cr_assert_eq(srv_tool_call_parse("x", 1, NULL), KVS_ERR_INVALID);
    cr_assert_eq(srv_tool_call_parse(NULL, 0, &r), 0);
    /* not NUL-terminated: only len bytes are read */
    char buf[8];
    memcpy(buf, "{\"name\"", 7);
    cr_assert_eq(srv_tool_call_parse(buf, 7, &r), 0);
    cr_assert_eq(r.n_calls, 0);
}

/* What a streaming client sees: content sent while generating (held back by srv_tool_call_stream_safe) and, at the
 * end, the rest of the content and the calls. Feeds text in pieces cut at the given points. */
static void stream_check(const char *text, const size_t *cuts, int n_cuts) {
    size_t len = strlen(text), sent = 0;
    srv_tool_call_result fin = parse(text);
    size_t content_end = fin.n_calls > 0 ? fin.content_len : len;
    bool held = false;
    for (int k = 0; k < n_cuts; k++) {
        /* the incremental scan (from the last result) agrees with a scan from the start */
        bool h0;
        size_t full = srv_tool_call_stream_safe(text, cuts[k], 0, &h0);
        if (held) { cr_assert_eq(full, sent, "held text released: '%s' at %zu", text, cuts[k]); continue; }
        size_t safe = srv_tool_call_stream_safe(text, cuts[k], sent, &held);
        cr_assert_eq(safe, full, "'%s' cut at %zu: incremental %zu, full %zu", text, cuts[k], safe, full);
        cr_assert_geq(safe, sent, "what was sent is never taken back");
        cr_assert_leq(safe, cuts[k]);
        cr_assert_leq(safe, content_end, "text '%s' cut at %zu: %zu bytes sent, but the content is %zu", text,
                      cuts[k], safe, content_end);
        if (safe > sent) sent = safe;
    }
    cr_assert_leq(sent, content_end);
    srv_tool_call_result_free(&fin);
}

Test(tool_calls, stream_every_split) {
    static const char *const texts[] = {
        "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"<tool_call>\"}}\n</tool_call>",
        "[TOOL_CALLS][{\"name\":\"a\",\"arguments\":{}}]",
        "ok <|python_tag|>{\"name\": \"a\", \"parameters\": {}}",
        "  {\"name\": \"s\", \"parameters\": {\"q\": 1}}",
        "plain text with a < sign and [brackets] and {braces}",
        "text then <tool_call>{broken",
        "<tool_c",
        "Hello   \n\n",
    };
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        size_t len = strlen(texts[t]);
        /* one split point at every byte (a two-piece stream), and the byte-by-byte stream */
        for (size_t k = 0; k <= len; k++) {
            size_t cuts[2] = {k, len};
            stream_check(texts[t], cuts, 2);
        }
        size_t *all = malloc((len + 1) * sizeof *all);
        for (size_t k = 0; k <= len; k++) all[k] = k;
        stream_check(texts[t], all, (int)len + 1);
        free(all);
    }
    /* plain text is sent as it comes, apart from trailing whitespace and a possible marker start */
    cr_assert_eq(srv_tool_call_stream_safe("Hello wor", 9, 0, NULL), 9);
    cr_assert_eq(srv_tool_call_stream_safe("Hello <tool", 11, 0, NULL), 5);
    cr_assert_eq(srv_tool_call_stream_safe("Hello [TOOL_", 12, 0, NULL), 5);
    bool h = false;
    cr_assert_eq(srv_tool_call_stream_safe("  {\"na", 6, 0, &h), 0);
    cr_assert(h, "output starting as JSON is held to the end");
    cr_assert_eq(srv_tool_call_stream_safe("ab <tool_call>{", 15, 0, &h), 2);
    cr_assert(h);
    cr_assert_eq(srv_tool_call_stream_safe("   ", 3, 0, NULL), 0);
}

/* Randomized: content + calls in a random format, rendered, parsed back; every split keeps the guarantee. */
Test(tool_calls, random_roundtrip) {
    srand(1234);
    static const char *const words[] = {"alpha", "<b>", "[x]", "{y}", "tool", "call", " ", "\n", "é", "\"q\""};
    for (int it = 0; it < 300; it++) {
        char content[128] = "";
        int nw = rand() % 5;
        for (int i = 0; i < nw; i++) strcat(content, words[rand() % 10]);
        int fmt = rand() % 3, n = 1 + rand() % 3;
        if (fmt == 2 && nw) fmt = 0; /* the bare JSON formats carry no content */
        char text[2048] = "", argv[3][64];
        strcat(text, content);
        if (fmt == 1) strcat(text, "[TOOL_CALLS][");
        for (int k = 0; k < n; k++) {
            snprintf(argv[k], sizeof argv[k], "{\"n\":%d,\"s\":\"%s\"}", rand() % 1000, words[rand() % 4]);
            char one[256];
            snprintf(one, sizeof one, "{\"name\":\"fn%d\",\"arguments\":%s}", k, argv[k]);
            if (fmt == 0) { strcat(text, "<tool_call>\n"); strcat(text, one); strcat(text, "\n</tool_call>\n"); }
            else if (fmt == 1) { if (k) strcat(text, ","); strcat(text, one); }
            else { if (k == 0 && n > 1) strcat(text, "["); if (k) strcat(text, ","); strcat(text, one); if (k == n - 1 && n > 1) strcat(text, "]"); }
        }
        if (fmt == 1) strcat(text, "]");
        srv_tool_call_result r = parse(text);
        cr_assert_eq(r.n_calls, n, "text: %s", text);
        for (int k = 0; k < n; k++) {
            char name[16];
            snprintf(name, sizeof name, "fn%d", k);
            cr_assert_str_eq(r.calls[k].name, name);
            args_eq(r.calls[k].arguments, argv[k]);
        }
        size_t cl = strlen(content);
        while (cl > 0 && strchr(" \n", content[cl - 1])) cl--;
        cr_assert_eq(r.content_len, cl, "text: %s", text);
        srv_tool_call_result_free(&r);
        size_t len = strlen(text);
        size_t *all = malloc((len + 1) * sizeof *all);
        for (size_t k = 0; k <= len; k++) all[k] = k;
        stream_check(text, all, (int)len + 1);
        free(all);
    }
}
