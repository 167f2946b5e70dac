/* test_messages_map.c: Anthropic's Messages API mapped onto chat completions (server/api/messages_map_internal.h):
 * system, text blocks, tool_use and tool_result blocks as chat messages, every request field, tools and
 * tool_choice, count_tokens bodies, bad inputs (each a 400 naming the field); generated text mapped back to
 * content blocks (randomized against a generator of Hermes tool-call texts), stop_reason, usage, the Message
 * object, the round trip of a tool_use block; Anthropic's error shape (api.h). */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helper_rng.h"
#include "server/api/chat_internal.h"
#include "server/api/messages_map_internal.h"

static cJSON *parse(const char *json) {
    cJSON *root = cJSON_Parse(json);
    cr_assert(root, "bad test JSON: %s", json);
    return root;
}

static int map(const char *json, bool count, srv_messages_map_req *r, srv_api_error *e) {
    cJSON *root = parse(json);
    int rc = srv_messages_map_parse(root, count, r, e);
    cJSON_Delete(root);
    return rc;
}

static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    cr_assert(cJSON_IsString(v), "field %s is not a string", k);
    return v->valuestring;
}

#define TOOLS                                                                                                      \
    "\"tools\":[{\"name\":\"get_weather\",\"description\":\"The weather\",\"input_schema\":{\"type\":\"object\","  \
    "\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}},"                                   \
    "{\"type\":\"custom\",\"name\":\"noop\",\"input_schema\":{\"type\":\"object\"}}]"

Test(msg_map, every_field_becomes_chat) {
    const char *body =
        "{\"model\":\"claude-x\",\"max_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":20,"
        "\"stop_sequences\":[\"END\",\"\\n\\nHuman:\"],\"metadata\":{\"user_id\":\"u-1\"},\"stream\":true,"
        "\"thinking\":{\"type\":\"disabled\"},\"service_tier\":\"auto\"," TOOLS ","
        "\"tool_choice\":{\"type\":\"tool\",\"name\":\"get_weather\",\"disable_parallel_tool_use\":true},"
        "\"system\":[{\"type\":\"text\",\"text\":\"Be brief.\"},{\"type\":\"text\",\"text\":\"Be kind.\","
        "\"cache_control\":{\"type\":\"ephemeral\"}}],"
        "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Weather\"},"
        "{\"type\":\"text\",\"text\":\"in Paris?\"}]},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":\"s\"},"
        "{\"type\":\"text\",\"text\":\"Let me check.\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_2\",\"name\":\"noop\",\"input\":{}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":\"sunny\"},"
        "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_2\",\"is_error\":true,"
        "\"content\":[{\"type\":\"text\",\"text\":\"failed\"}]},{\"type\":\"text\",\"text\":\"Thanks\"}]},"
        "{\"role\":\"assistant\",\"content\":\"You are\"}]}";
    srv_messages_map_req r;
    srv_api_error e;
    cr_assert_eq(map(body, false, &r, &e), 0, "%s", e.message);
    cr_assert_eq(r.max_tokens, 7);
    cr_assert(r.stream && !r.parallel_tool_calls);
    cr_assert_null(cJSON_GetObjectItem(r.chat, "stream"), "the chat body never streams");
    cJSON *msgs = cJSON_GetObjectItem(r.chat, "messages");
    cr_assert_eq(cJSON_GetArraySize(msgs), 7, "system, user, assistant with 2 calls, 2 tool, user, assistant");
    cr_assert_str_eq(str(cJSON_GetArrayItem(msgs, 0), "role"), "system");
    cr_assert_str_eq(str(cJSON_GetArrayItem(msgs, 0), "content"), "Be brief.\nBe kind.");
    cr_assert_str_eq(str(cJSON_GetArrayItem(msgs, 1), "content"), "Weather\nin Paris?");
    cJSON *a = cJSON_GetArrayItem(msgs, 2);
    cr_assert_str_eq(str(a, "role"), "assistant");
    cr_assert_str_eq(str(a, "content"), "Let me check.", "thinking blocks are left out");
    cJSON *calls = cJSON_GetObjectItem(a, "tool_calls");
    cr_assert_eq(cJSON_GetArraySize(calls), 2);
    cr_assert_str_eq(str(cJSON_GetArrayItem(calls, 0), "id"), "toolu_1");
    cr_assert_str_eq(str(cJSON_GetArrayItem(calls, 0), "type"), "function");
    cJSON *fn0 = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "function");
    cr_assert_str_eq(str(fn0, "name"), "get_weather");
    cr_assert_str_eq(str(fn0, "arguments"), "{\"city\":\"Paris\"}");
    cr_assert_str_eq(str(cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 1), "function"), "arguments"), "{}");
    for (int k = 0; k < 2; k++) {
        cJSON *t = cJSON_GetArrayItem(msgs, 3 + k);
        cr_assert_str_eq(str(t, "role"), "tool");
        cr_assert_str_eq(str(t, "tool_call_id"), k ? "toolu_2" : "toolu_1");
        cr_assert_str_eq(str(t, "name"), k ? "noop" : "get_weather");
        cr_assert_str_eq(str(t, "content"), k ? "failed" : "sunny");
    }
    cr_assert_str_eq(str(cJSON_GetArrayItem(msgs, 5), "role"), "user");
    cr_assert_str_eq(str(cJSON_GetArrayItem(msgs, 5), "content"), "Thanks", "the user's text after the results");
    cr_assert_str_eq(str(cJSON_GetArrayItem(msgs, 6), "content"), "You are");
    /* the chat parse takes the body as it is */
    srv_api_gen g;
    cr_assert_eq(srv_api_parse_gen_json(SRV_API_CHAT, r.chat, NULL, &g, &e), 0, "%s", e.message);
    cr_assert_eq(g.max_tokens, 7);
    cr_assert_float_eq(g.sampling.temperature, 0.5f, 1e-6);
    cr_assert_float_eq(g.sampling.top_p, 0.9f, 1e-6);
    cr_assert_eq(g.sampling.top_k, 20);
    cr_assert_eq(g.n_stop, 2);
    cr_assert_str_eq(g.stop[0], "END");
    cr_assert_str_eq(g.stop[1], "\n\nHuman:");
    cr_assert_str_eq(g.user, "u-1");
    /* thinking {type: disabled}: the template renders without thinking */
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(g.chat->kwargs, "enable_thinking")));
    cr_assert_str_eq(g.model, "claude-x");
    cr_assert(!g.stream);
    cr_assert_eq(g.n_msgs, 7);
    cr_assert_eq(g.chat->tool_choice, SRV_CHAT_TOOL_CHOICE_NAMED);
    cr_assert_str_eq(g.chat->tool_name, "get_weather");
    cr_assert(!g.chat->parallel_tool_calls);
    cr_assert(g.chat->prefill, "a final assistant message is continued, as Anthropic's prefill");
    cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(g.chat->tools, 0), "function");
    cr_assert_str_eq(str(fn, "name"), "get_weather");
    cr_assert_str_eq(str(fn, "description"), "The weather");
    cr_assert(cJSON_IsObject(cJSON_GetObjectItem(fn, "parameters")));
    srv_api_gen_free(&g);
    srv_messages_map_req_free(&r);
}

Test(msg_map, tool_choice_types) {
    static const char *const types[] = {"auto", "any", "none", "tool\",\"name\":\"noop"};
    static const srv_chat_tool_choice want[] = {SRV_CHAT_TOOL_CHOICE_AUTO, SRV_CHAT_TOOL_CHOICE_REQUIRED, SRV_CHAT_TOOL_CHOICE_NONE,
                                           SRV_CHAT_TOOL_CHOICE_NAMED};
    for (int i = 0; i < 4; i++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                 "\"tool_choice\":{\"type\":\"%s\"}," TOOLS "}", types[i]);
        srv_messages_map_req r;
        srv_api_error e;
        cr_assert_eq(map(body, false, &r, &e), 0, "%s", e.message);
        cr_assert(r.parallel_tool_calls);
        srv_api_gen g;
        cr_assert_eq(srv_api_parse_gen_json(SRV_API_CHAT, r.chat, NULL, &g, &e), 0, "%s", e.message);
        cr_assert_eq(g.chat->tool_choice, want[i], "type %s", types[i]);
        cr_assert(g.chat->parallel_tool_calls);
        srv_api_gen_free(&g);
        srv_messages_map_req_free(&r);
    }
    /* no tool_choice: chat's default (auto), parallel calls */
    srv_messages_map_req r;
    srv_api_error e;
    cr_assert_eq(map("{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]," TOOLS "}", false, &r,
                     &e), 0, "%s", e.message);
    cr_assert_null(cJSON_GetObjectItem(r.chat, "tool_choice"));
    cr_assert(r.parallel_tool_calls);
    srv_messages_map_req_free(&r);
}

Test(msg_map, count_tokens_body) {
    srv_messages_map_req r;
    srv_api_error e;
    /* no max_tokens needed; generation fields are not passed on */
    cr_assert_eq(map("{\"model\":\"m\",\"system\":\"S\",\"stream\":\"ignored\",\"stop_sequences\":3,"
                     "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", true, &r, &e), 0, "%s", e.message);
    cr_assert_eq(r.max_tokens, -1);
    cr_assert(!r.stream);
    cr_assert_null(cJSON_GetObjectItem(r.chat, "max_tokens"));
    cr_assert_null(cJSON_GetObjectItem(r.chat, "stop"));
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(r.chat, "messages")), 2);
    srv_api_gen g;
    cr_assert_eq(srv_api_parse_gen_json(SRV_API_CHAT, r.chat, NULL, &g, &e), 0, "%s", e.message);
    cr_assert_eq(g.max_tokens, -1);
    srv_api_gen_free(&g);
    srv_messages_map_req_free(&r);
    /* ... but the messages are checked as for /v1/messages */
    cr_assert_eq(map("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}", true, &r, &e),
                 SRV_API_ERR_INVALID);
    cr_assert(strstr(e.message, "image"));
}

Test(msg_map, bad_inputs_name_the_field) {
    static const struct { const char *body, *want; } cases[] = {
        {"[1]", "JSON object"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "max_tokens: Field required"},
        {"{\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "max_tokens"},
        {"{\"max_tokens\":1.5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "max_tokens"},
        {"{\"max_tokens\":\"8\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "max_tokens"},
        {"{\"max_tokens\":8}", "messages: Field required"},
        {"{\"max_tokens\":8,\"thinking\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "thinking: must be an object"},
        {"{\"max_tokens\":8,\"thinking\":{\"type\":\"on\"},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
         "thinking.type"},
        {"{\"max_tokens\":8,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":0},\"messages\":[{\"role\":\"user\","
         "\"content\":\"hi\"}]}", "thinking.budget_tokens"},
        {"{\"max_tokens\":8,\"messages\":[]}", "non-empty array"},
        {"{\"max_tokens\":8,\"messages\":\"hi\"}", "messages"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"system\",\"content\":\"hi\"}]}", "messages[0].role"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"user\"}]}", "messages[0].content: Field required"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}",
         "messages[0].content[0]: content blocks of type 'image'"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
         "{\"type\":\"document\"}]}]}", "messages[0].content[1]: content blocks of type 'document'"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]}",
         "messages[0].content[0].type"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
         "messages[0].content[0].text"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\","
         "\"name\":\"n\",\"input\":{}}]}]}", "'tool_use' are not supported in user messages"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_result\","
         "\"tool_use_id\":\"t\"}]}]}", "'tool_result' are not supported in assistant messages"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
         "\"tool_use_id\":\"toolu_x\",\"content\":\"r\"}]}]}", "no tool_use block with id 'toolu_x'"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\","
         "\"id\":\"t\",\"name\":\"n\",\"input\":[1]}]}]}", "messages[0].content[0].input"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\","
         "\"name\":\"n\",\"input\":{}}]}]}", "messages[0].content[0].id"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\","
         "\"name\":\"n\"}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t\","
         "\"content\":[{\"type\":\"image\"}]}]}]}", "messages[1].content[0].content[0]: content blocks of type 'image'"},
        {"{\"max_tokens\":8,\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\","
         "\"name\":\"n\"}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t\","
         "\"is_error\":\"yes\"}]}]}", "is_error"},
        {"{\"max_tokens\":8,\"system\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "system"},
        {"{\"max_tokens\":8,\"system\":[{\"type\":\"image\"}],\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
         "system[0]: content blocks of type 'image'"},
        {"{\"max_tokens\":8,\"tools\":{},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "tools: must be"},
        {"{\"max_tokens\":8,\"tools\":[{\"type\":\"bash_20250124\",\"name\":\"bash\"}],\"messages\":[{\"role\":"
         "\"user\",\"content\":\"hi\"}]}", "tools of type 'bash_20250124'"},
        {"{\"max_tokens\":8,\"tools\":[{\"name\":\"f\"}],\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
         "tools[0].input_schema: Field required"},
        {"{\"max_tokens\":8,\"tools\":[{\"name\":\"\",\"input_schema\":{}}],\"messages\":[{\"role\":\"user\","
         "\"content\":\"hi\"}]}", "tools[0].name"},
        {"{\"max_tokens\":8,\"tools\":[{\"name\":\"f\",\"input_schema\":[]}],\"messages\":[{\"role\":\"user\","
         "\"content\":\"hi\"}]}", "tools[0].input_schema: must be an object"},
        {"{\"max_tokens\":8,\"tool_choice\":\"auto\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
         "tool_choice: must be an object"},
        {"{\"max_tokens\":8,\"tool_choice\":{\"type\":\"required\"},\"messages\":[{\"role\":\"user\",\"content\":"
         "\"hi\"}]}", "tool_choice.type"},
        {"{\"max_tokens\":8,\"tool_choice\":{\"type\":\"tool\"},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
         "tool_choice.name"},
        {"{\"max_tokens\":8,\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":1},\"messages\":[{\"role\":"
         "\"user\",\"content\":\"hi\"}]}", "disable_parallel_tool_use"},
        {"{\"max_tokens\":8,\"stop_sequences\":\"END\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
         "stop_sequences"},
        {"{\"max_tokens\":8,\"stop_sequences\":[\"a\",\"\"],\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
         "stop_sequences[1]"},
        {"{\"max_tokens\":8,\"metadata\":[],\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "metadata"},
        {"{\"max_tokens\":8,\"metadata\":{\"user_id\":3},\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
         "metadata.user_id"},
        {"{\"max_tokens\":8,\"stream\":\"yes\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "stream"},
        {"{\"max_tokens\":8,\"temperature\":\"hot\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
         "temperature"},
        {"{\"max_tokens\":8,\"model\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "model"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        srv_messages_map_req r;
        srv_api_error e;
        memset(&e, 0, sizeof e);
        int rc = map(cases[i].body, false, &r, &e);
        cr_assert_eq(rc, SRV_API_ERR_INVALID, "case %zu should fail: %s", i, cases[i].body);
        cr_assert_eq(e.status, 400, "case %zu", i);
        cr_assert(strstr(e.message, cases[i].want), "case %zu: '%s' does not name '%s'", i, e.message, cases[i].want);
        cr_assert_null(r.chat, "nothing is left on failure");
    }
}

/* ---- output ----------------------------------------------------------------------------------------------- */
Test(msg_map, text_without_tools_is_one_text_block) {
    const char *t = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    srv_messages_map_out o;
    cr_assert_eq(srv_messages_map_output(t, strlen(t), false, true, "s", &o), 0);
    cr_assert_eq(o.n_calls, 0);
    cr_assert(o.has_text);
    cr_assert_eq(cJSON_GetArraySize(o.content), 1);
    cr_assert_str_eq(str(cJSON_GetArrayItem(o.content, 0), "type"), "text");
    cr_assert_str_eq(str(cJSON_GetArrayItem(o.content, 0), "text"), t, "no tools: a call is only text");
    srv_messages_map_out_free(&o);
    cr_assert_eq(srv_messages_map_output(NULL, 0, true, true, "s", &o), 0);
    cr_assert(!o.has_text);
    cr_assert_eq(cJSON_GetArraySize(o.content), 0, "empty output: no blocks");
    srv_messages_map_out_free(&o);
    cr_assert_eq(srv_messages_map_output(NULL, 3, true, true, "s", &o), KVS_ERR_INVALID);
    cr_assert_eq(srv_messages_map_output("x", 1, true, true, NULL, &o), KVS_ERR_INVALID);
    cr_assert_eq(srv_messages_map_output("x", 1, true, true, "s", NULL), KVS_ERR_INVALID);
}

/* A random JSON object of strings and integers. */
static cJSON *random_args(rng *r) {
    cJSON *o = cJSON_CreateObject();
    int n = (int)(rng_next(r) % 4);
    for (int i = 0; i < n; i++) {
        char k[16], v[16];
        snprintf(k, sizeof k, "k%d", i);
        int len = (int)(rng_next(r) % 8);
        for (int j = 0; j < len; j++) v[j] = (char)('a' + rng_next(r) % 26);
        v[len] = 0;
        if (rng_next(r) & 1) cJSON_AddStringToObject(o, k, v);
        else cJSON_AddNumberToObject(o, k, (double)(rng_next(r) % 1000));
    }
    return o;
}

Test(msg_map, tool_calls_become_tool_use_blocks_randomized) {
    rng g = {0x5eed1234abcdULL};
    for (int iter = 0; iter < 300; iter++) {
        kvs_buf b = {0};
        char prefix[32];
        int pl = (int)(rng_next(&g) % 12);
        for (int j = 0; j < pl; j++) prefix[j] = (char)('a' + rng_next(&g) % 26);
        prefix[pl] = 0;
        kvs_buf_puts(&b, prefix);
        if (pl) kvs_buf_puts(&b, "\n");
        int k = (int)(rng_next(&g) % 4);
        cJSON *want[4];
        char names[4][16];
        for (int c = 0; c < k; c++) {
            want[c] = random_args(&g);
            snprintf(names[c], sizeof names[c], "fn%d", (int)(rng_next(&g) % 100));
            char *a = cJSON_PrintUnformatted(want[c]);
            kvs_buf_puts(&b, "<tool_call>\n{\"name\": \"");
            kvs_buf_puts(&b, names[c]);
            kvs_buf_puts(&b, "\", \"arguments\": ");
            kvs_buf_puts(&b, a);
            kvs_buf_puts(&b, "}\n</tool_call>\n");
            free(a);
        }
        cr_assert(!b.oom);
        bool parallel = rng_next(&g) & 1;
        srv_messages_map_out o;
        cr_assert_eq(srv_messages_map_output(b.data, b.len, true, parallel, "abc", &o), 0);
        int calls = parallel || k < 1 ? k : 1;
        cr_assert_eq(o.n_calls, calls, "iter %d", iter);
        cr_assert_eq(o.has_text, pl > 0, "iter %d: a text block when there is text", iter);
        if (k == 0) cr_assert_str_eq(o.text, b.data);
        else cr_assert_str_eq(o.text, prefix, "the text before the calls, without its trailing newline");
        cr_assert_eq(cJSON_GetArraySize(o.content), calls + (o.has_text ? 1 : 0));
        for (int c = 0; c < calls; c++) {
            cJSON *blk = cJSON_GetArrayItem(o.content, c + (o.has_text ? 1 : 0));
            char id[32];
            snprintf(id, sizeof id, "toolu_abc_%d", c);
            cr_assert_str_eq(str(blk, "type"), "tool_use");
            cr_assert_str_eq(str(blk, "id"), id);
            cr_assert_str_eq(str(blk, "name"), names[c]);
            cr_assert(cJSON_Compare(cJSON_GetObjectItem(blk, "input"), want[c], true), "iter %d call %d", iter, c);
        }
        /* the round trip: the content as an assistant turn, then the results, map back onto chat's calls */
        cJSON *req = parse("{\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}");
        cJSON *msgs = cJSON_GetObjectItem(req, "messages"), *am = cJSON_CreateObject(), *um = cJSON_CreateObject();
        cJSON_AddStringToObject(am, "role", "assistant");
        cJSON_AddItemToObject(am, "content", cJSON_Duplicate(o.content, true));
        cJSON_AddItemToArray(msgs, am);
        cJSON_AddStringToObject(um, "role", "user");
        cJSON *uc = cJSON_AddArrayToObject(um, "content");
        for (int c = 0; c < calls; c++) {
            cJSON *tr = cJSON_CreateObject();
            char id[32];
            snprintf(id, sizeof id, "toolu_abc_%d", c);
            cJSON_AddStringToObject(tr, "type", "tool_result");
            cJSON_AddStringToObject(tr, "tool_use_id", id);
            cJSON_AddStringToObject(tr, "content", "ok");
            cJSON_AddItemToArray(uc, tr);
        }
        cJSON_AddItemToArray(msgs, um);
        srv_messages_map_req r;
        srv_api_error e;
        cr_assert_eq(srv_messages_map_parse(req, false, &r, &e), 0, "%s", e.message);
        cJSON *cm = cJSON_GetObjectItem(r.chat, "messages");
        cr_assert_eq(cJSON_GetArraySize(cm), 2 + calls + (calls == 0 ? 1 : 0), "iter %d", iter);
        cJSON *ca = cJSON_GetArrayItem(cm, 1);
        cr_assert_str_eq(str(ca, "content"), o.text);
        cJSON *tc = cJSON_GetObjectItem(ca, "tool_calls");
        cr_assert_eq(cJSON_GetArraySize(tc), calls);
        for (int c = 0; c < calls; c++) {
            cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(tc, c), "function");
            cJSON *args = cJSON_Parse(str(fn, "arguments"));
            cr_assert(cJSON_Compare(args, want[c], true));
            cJSON_Delete(args);
            cr_assert_str_eq(str(cJSON_GetArrayItem(cm, 2 + c), "name"), names[c]);
        }
        srv_messages_map_req_free(&r);
        cJSON_Delete(req);
        for (int c = 0; c < k; c++) cJSON_Delete(want[c]);
        srv_messages_map_out_free(&o);
        kvs_buf_free(&b);
    }
}

Test(msg_map, stop_reason_usage_and_message) {
    cr_assert_str_eq(srv_messages_map_stop_reason(1, true, true), "tool_use");
    cr_assert_str_eq(srv_messages_map_stop_reason(0, true, false), "max_tokens");
    cr_assert_str_eq(srv_messages_map_stop_reason(0, false, true), "stop_sequence");
    cr_assert_str_eq(srv_messages_map_stop_reason(0, false, false), "end_turn");
    cJSON *u = srv_messages_map_usage(100, 64, 7);
    cr_assert_eq(cJSON_GetObjectItem(u, "input_tokens")->valueint, 36, "cache reads are counted apart");
    cr_assert_eq(cJSON_GetObjectItem(u, "cache_read_input_tokens")->valueint, 64);
    cr_assert_eq(cJSON_GetObjectItem(u, "cache_creation_input_tokens")->valueint, 0);
    cr_assert_eq(cJSON_GetObjectItem(u, "output_tokens")->valueint, 7);
    cJSON_Delete(u);
    u = srv_messages_map_usage(10, 20, 0);
    cr_assert_eq(cJSON_GetObjectItem(u, "input_tokens")->valueint, 0);
    cr_assert_eq(cJSON_GetObjectItem(u, "cache_read_input_tokens")->valueint, 10);
    cJSON *content = parse("[{\"type\":\"text\",\"text\":\"hi\"}]");
    cJSON *m = srv_messages_map_message("msg_1", "model-x", content, "stop_sequence", "END", u);
    cr_assert_str_eq(str(m, "id"), "msg_1");
    cr_assert_str_eq(str(m, "type"), "message");
    cr_assert_str_eq(str(m, "role"), "assistant");
    cr_assert_str_eq(str(m, "model"), "model-x");
    cr_assert_str_eq(str(m, "stop_reason"), "stop_sequence");
    cr_assert_str_eq(str(m, "stop_sequence"), "END");
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(m, "stop_details")));
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(m, "content")), 1);
    cr_assert(cJSON_IsObject(cJSON_GetObjectItem(m, "usage")));
    cJSON_Delete(m);
    m = srv_messages_map_message("msg_2", "x", NULL, NULL, NULL, NULL);
    cr_assert(cJSON_IsArray(cJSON_GetObjectItem(m, "content")));
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(m, "stop_reason")));
    cr_assert(cJSON_IsNull(cJSON_GetObjectItem(m, "stop_sequence")));
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(m, "usage"), "output_tokens")->valueint, 0);
    cJSON_Delete(m);
}

Test(msg_map, anthropic_error_shape) {
    static const struct { int status; const char *type; } cases[] = {
        {400, "invalid_request_error"}, {401, "authentication_error"}, {403, "permission_error"},
        {404, "not_found_error"}, {405, "invalid_request_error"}, {408, "timeout_error"},
        {413, "request_too_large"}, {429, "rate_limit_error"}, {500, "api_error"}, {503, "overloaded_error"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        srv_api_error e;
        srv_api_set_error(&e, cases[i].status, NULL, "p", "c", "bad \xff thing %d", (int)i);
        char *s = srv_api_error_json_anthropic(&e);
        cJSON *j = parse(s);
        cr_assert_str_eq(str(j, "type"), "error");
        cJSON *in = cJSON_GetObjectItem(j, "error");
        cr_assert_str_eq(str(in, "type"), cases[i].type, "status %d", cases[i].status);
        cr_assert(strstr(str(in, "message"), "bad \xEF\xBF\xBD thing"), "the message is valid UTF-8");
        cr_assert_eq(cJSON_GetArraySize(in), 2, "only type and message");
        cJSON_Delete(j);
        free(s);
    }
    cr_assert(srv_api_path_anthropic("/v1/messages"));
    cr_assert(srv_api_path_anthropic("/v1/messages/count_tokens"));
    cr_assert(srv_api_path_anthropic("/v1/messages/batches"));
    cr_assert(!srv_api_path_anthropic("/v1/messagesx"));
    cr_assert(!srv_api_path_anthropic("/v1/chat/completions"));
    cr_assert(srv_api_path_anthropic("/messages"));        /* the routes without /v1, as llama.cpp's */
    cr_assert(srv_api_path_anthropic("/messages/count_tokens"));
    cr_assert(!srv_api_path_anthropic("/messagesx"));
    cr_assert(!srv_api_path_anthropic("/v1messages"));
    cr_assert(!srv_api_path_anthropic(NULL));
}
