/*
 * test_oss_template.c: the harmony chat template that `kvserve mkmodel --arch gpt-oss` embeds, rendered by kvserve's
 * template engine through the chat route's conversion (server/api/chat.c: srv_chat_parse, srv_chat_render) for a
 * conversation with a system prompt, tools, reasoning_effort, an assistant turn with reasoning and a tool call, the
 * tool's result, a final answer and a new question: the exact harmony text (facts of the format: messages
 * <|start|>ROLE<|message|>...<|end|>, the effort in the system message, the instructions and the `functions`
 * namespace in the developer message, the analysis channel, a commentary call to=functions.NAME ending in <|call|>,
 * the result from functions.NAME to=assistant, the generation prompt <|start|>assistant). Also: harmony's markers
 * are single control tokens of the model's vocabulary, and the loaded model detects the harmony syntax.
 */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "server/api/api.h"
#include "server/api/chat_internal.h"
#include "template/template.h"
#include "helper_shared.h"

static char dir[64], model_path[128];

static void cleanup(void) {
    if (!dir[0]) return;
    char p[160];
    snprintf(p, sizeof p, "%s/log", dir);
    unlink(p);
    unlink(model_path);
    rmdir(dir);
}

static eng_model *make_oss(void) {
    snprintf(dir, sizeof dir, "/tmp/kvserve-oss-tpl-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(model_path, sizeof model_path, "%s/oss.gguf", dir);
    const char *args[] = {"mkmodel", "-o", model_path, "--preset", "tiny-oss", NULL};
    cr_assert_eq(kvt_run_kvserve(dir, args, NULL), 0, "kvserve mkmodel failed");
    eng_load_params lp;
    eng_load_params_default(&lp);
    lp.vocab_only = true;
    eng_model *m = NULL;
    char err[256];
    cr_assert_eq(eng_model_load(model_path, &lp, &m, err, sizeof err), 0, "%s", err);
    return m;
}

static const char BODY[] =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
    "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
    "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"Need a tool.\",\"tool_calls\":[{\"id\":\"c1\","
    "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"},"
    "{\"role\":\"assistant\",\"content\":\"It is sunny.\"},"
    "{\"role\":\"user\",\"content\":\"Thanks\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Current weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"description\":\"City\"},"
    "\"days\":{\"type\":\"integer\"},\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},\"required\":[\"city\"]}}}],"
    "\"reasoning_effort\":\"low\"}";

static const char WANT[] =
    "<|start|>system<|message|>You are an assistant answering through channels.\n"
    "Knowledge cutoff: 2024-06\n\nReasoning: low\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.\n"
    "Calls to these tools must go to the commentary channel: 'functions'.<|end|>"
    "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n"
    "// Current weather\ntype get_weather = (_: {\n// City\ncity: string,\ndays?: number,\nunit?: \"c\" | \"f\",\n"
    "tags?: string[],\n}) => any;\n\n} // namespace functions<|end|>"
    "<|start|>user<|message|>Weather in Paris?<|end|>"
    "<|start|>assistant<|channel|>analysis<|message|>Need a tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    "{\"city\": \"Paris\"}<|call|>"
    "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is sunny.<|end|>"
    "<|start|>user<|message|>Thanks<|end|>"
    "<|start|>assistant";

Test(oss_template, harmony_rendering, .fini = cleanup) {
    eng_model *m = make_oss();
    const char *src = eng_model_chat_template(m);
    cr_assert_not_null(src);
    cr_assert_eq(srv_reasoning_detect(src), SRV_REASONING_HARMONY);
    tpl_template *t = NULL;
    tpl_error terr;
    cr_assert_eq(tpl_compile(src, strlen(src), NULL, &t, &terr), 0, "%s", terr.msg);
    cJSON *root = cJSON_Parse(BODY);
    cr_assert_not_null(root);
    srv_chat_req req;
    srv_api_error err;
    cr_assert_eq(srv_chat_parse(root, &req, &err), 0, "%s", err.message);
    tpl_output out = {0};
    cr_assert_eq(srv_chat_render(t, &req, NULL, NULL, &out, &err), 0, "%s", err.message);
    cr_assert_str_eq(out.text, WANT);
    /* reasoning_effort absent: medium; no tools and no system prompt: no developer message */
    srv_chat_req_free(&req);
    tpl_output_free(&out);
    cJSON_Delete(root);
    root = cJSON_Parse("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}");
    cr_assert_eq(srv_chat_parse(root, &req, &err), 0, "%s", err.message);
    cr_assert_eq(srv_chat_render(t, &req, NULL, NULL, &out, &err), 0, "%s", err.message);
    cr_assert(strstr(out.text, "Reasoning: medium\n"), "%s", out.text);
    cr_assert_null(strstr(out.text, "developer"), "%s", out.text);
    cr_assert(strstr(out.text, "<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant"), "%s", out.text);
    /* the markers are single control tokens */
    static const char *const marks[] = {"<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|call|>",
                                        "<|constrain|>", "<|return|>"};
    for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++) {
        int32_t toks[8], n = 0;
        cr_assert_eq(eng_tokenize(m, marks[i], strlen(marks[i]), false, true, toks, 8, &n), 0);
        cr_assert_eq(n, 1, "%s is one token (%d)", marks[i], n);
    }
    srv_chat_req_free(&req);
    tpl_output_free(&out);
    cJSON_Delete(root);
    tpl_free(t);
    eng_model_free(m);
}
