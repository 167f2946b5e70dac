/* api_structured.c: response_format on /v1/chat/completions and /v1/completions (an extension there):
 *   {"type": "text"}                                   no constraint
 *   {"type": "json_object"}                            any JSON object
 *   {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}
 * The schema is compiled into a grammar (grammar/) in the request's preparation, off the loop, through the model's
 * grammar cache (server/api/grammar_cache_internal.h), and the scheduler constrains every choice with it. A keyword the
 * compiler cannot enforce is a 400 naming it (param response_format), never a silent ignore. tool_choice "required" or
 * a named function goes the same way: a grammar of tool calls in the model's format whose arguments follow each
 * function's parameters (server/api/tool_format_internal.h); it takes precedence over response_format, and a parameters
 * keyword it cannot enforce is a 400 (param tools) naming the function and the keyword. */
#include "server/api/api_gen_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api/chat_internal.h"
#include "server/api/grammar_cache_internal.h"
#include "server/api/tool_format_internal.h"

#define RF_BAD(...) (srv_api_set_error(err, 400, NULL, param, NULL, __VA_ARGS__), -1)

int api_parse_response_format(const cJSON *root, srv_api_gen *g, srv_api_error *err) {
    const char *param = "response_format";
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    g->rf = SRV_API_RF_TEXT;
    if (!rf || cJSON_IsNull(rf)) return 0;
    if (!cJSON_IsObject(rf)) return RF_BAD("'response_format' must be an object, got %s", srv_api_json_kind(rf));
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsString(ty))
        return RF_BAD("'response_format.type' must be one of \"text\", \"json_object\", \"json_schema\"");
    if (!strcmp(ty->valuestring, "text")) return 1;
    if (!strcmp(ty->valuestring, "json_object")) {
        g->rf = SRV_API_RF_JSON_OBJECT;
        return 1;
    }
    if (strcmp(ty->valuestring, "json_schema"))
        return RF_BAD("'response_format.type' must be one of \"text\", \"json_object\", \"json_schema\"; got '%s'",
                      ty->valuestring);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js))
        return RF_BAD("'response_format.json_schema' must be an object with 'name' and 'schema', got %s",
                      js ? srv_api_json_kind(js) : "nothing");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    if (name && !cJSON_IsNull(name) && !cJSON_IsString(name))
        return RF_BAD("'response_format.json_schema.name' must be a string, got %s", srv_api_json_kind(name));
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
        return RF_BAD("'response_format.json_schema.strict' must be a boolean, got %s", srv_api_json_kind(strict));
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!schema || cJSON_IsNull(schema)) return RF_BAD("'response_format.json_schema.schema' is required");
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return RF_BAD("'response_format.json_schema.schema' must be a JSON Schema object, got %s",
                      srv_api_json_kind(schema));
    if (!(g->rf_schema = cJSON_PrintUnformatted(schema))) {
        srv_api_set_nomem(err);
        return -2;
    }
    g->rf = SRV_API_RF_JSON_SCHEMA;
    return 1;
}

/* The answer to a grammar's compilation rc (msg: the compiler's message): 0, or -1 with err set: 500 when out of
 * memory compiling `what`, otherwise a 400 naming param: "<unsupported>: msg" or "<invalid>: msg". */
static int compiled(int rc, const char *msg, const char *what, const char *param, const char *unsupported,
                    const char *invalid, srv_api_error *err) {
    if (rc == KVS_OK) return 0;
    if (rc == KVS_ERR_NOMEM)
        srv_api_set_error(err, 500, "server_error", NULL, NULL, "out of memory compiling the %s", what);
    else
        srv_api_set_error(err, 400, NULL, param, NULL, "%s: %s", rc == KVS_ERR_UNSUPPORTED ? unsupported : invalid,
                          msg);
    return -1;
}

static int tool_compile(void *ud, gmr_grammar **g, char *err, size_t err_len) {
    return srv_tool_format_compile(ud, g, err, err_len);
}

/* tool_choice "required" or a named function: the output is constrained to tool calls in the model's format. */
static int prepare_tool_grammar(srv_api *api, api_call *c, srv_api_error *err) {
    const char *param = "tool_choice";
    const srv_chat_req *r = c->gen.chat;
    if (!api->gcache) return RF_BAD("'tool_choice' \"required\" or a named function is not available on this server");
    srv_tool_format_choice ch = {
        .tools = r->tools,
        .name = r->tool_choice == SRV_CHAT_TOOL_CHOICE_NAMED ? r->tool_name : NULL,
        .parallel = r->parallel_tool_calls,
        .format = api->be.tool_format,
    };
    char *key = srv_tool_format_key(&ch);
    char msg[400];
    int rc = key ? srv_grammar_cache_get_with(api->gcache, key, tool_compile, &ch, &c->grammar, msg, sizeof msg)
                 : KVS_ERR_NOMEM;
    free(key);
    return compiled(rc, msg, "tool-call grammar", "tools",
                    "function parameters not supported for constrained tool calls", "invalid function parameters", err);
}

/* Whether c's output is constrained to tool calls (chat, tools, tool_choice "required" or a named function). */
static bool tools_constrained(const api_call *c) {
    const srv_chat_req *r = c->gen.kind == SRV_API_CHAT ? c->gen.chat : NULL;
    return r && r->tools &&
           (r->tool_choice == SRV_CHAT_TOOL_CHOICE_REQUIRED || r->tool_choice == SRV_CHAT_TOOL_CHOICE_NAMED);
}

int api_prepare_grammar(srv_api *api, api_call *c, srv_api_error *err) {
    const char *param = "response_format";
    srv_api_gen *g = &c->gen;
    /* a forced tool call decides the whole output: it takes precedence over response_format */
    if (tools_constrained(c)) return prepare_tool_grammar(api, c, err);
    if (g->rf == SRV_API_RF_TEXT) return 0;
    if (!api->gcache) return RF_BAD("'response_format' %s is not available on this server",
                                    g->rf == SRV_API_RF_JSON_OBJECT ? "json_object" : "json_schema");
    cJSON *schema = NULL;
    if (g->rf == SRV_API_RF_JSON_SCHEMA && !(schema = cJSON_Parse(g->rf_schema))) {
        srv_api_set_nomem(err);
        return -1;
    }
    char msg[400];
    int rc = srv_grammar_cache_get(api->gcache, g->rf_schema, schema, &c->grammar, msg, sizeof msg);
    cJSON_Delete(schema);
    return compiled(rc, msg, "response_format schema", "response_format", "'response_format' schema not supported",
                    "'response_format' has an invalid JSON Schema", err);
}

void srv_api_set_grammar_cache(srv_api *api, srv_grammar_cache *gc) {
    if (api) api->gcache = gc;
}
