/*
 * chat_internal.h: chat requests for the model's own Jinja chat template (api/chat.c, prefix srv_chat_; private to
 * server/api/): the messages and tools of a /v1/chat/completions body converted to the variables templates expect, and
 * their rendering with the content spans the prompt builder tokenizes as plain text. Pure: no I/O, no engine; any
 * thread.
 */
#ifndef KVSERVE_SERVER_CHAT_INTERNAL_H
#define KVSERVE_SERVER_CHAT_INTERNAL_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "server/api/api.h"
#include "template/template.h"

typedef enum {
    SRV_CHAT_TOOL_CHOICE_AUTO = 0,  /* the default: the model may call tools */
    SRV_CHAT_TOOL_CHOICE_NONE,      /* no tools in the prompt, no parsing of calls */
    SRV_CHAT_TOOL_CHOICE_REQUIRED,  /* the output is grammar-constrained to tool calls (tool_format_internal.h) */
    SRV_CHAT_TOOL_CHOICE_NAMED,     /* {"type":"function","function":{"name":N}}: constrained to calls of N */
} srv_chat_tool_choice;

typedef struct srv_chat_req {
    cJSON *messages;           /* the messages as templates read them: role (developer -> system), content (a
                                  string: text parts joined; "" when absent),
                                  tool_calls with function.arguments an OBJECT (a JSON string from the client is
                                  parsed), tool_call_id, name */
    cJSON *tools;              /* the request's tools array; NULL when absent, empty or tool_choice is none */
    srv_chat_tool_choice tool_choice;
    char *tool_name;           /* NAMED: the function's name */
    bool parallel_tool_calls;  /* default true */
    bool prefill;              /* the last message is an assistant message: it is continued, not closed */
    cJSON *kwargs;             /* extra template variables: enable_thinking (true unless chat_template_kwargs or
                                  reasoning_effort "none" say otherwise), the chat_template_kwargs, and
                                  reasoning_effort (gpt-oss's template reads it); an object, never NULL once
                                  parsed */
    /* budgets of each render (tpl_render_params: max_ms, max_alloc_bytes, cancel); 0 / NULL: none. Set by the
     * caller after srv_chat_parse; a render over them is a 400 naming the limit (cancel: SRV_API_ERR_INVALID
     * too, with a 499 the client never sees). */
    uint32_t render_ms;
    size_t render_bytes;
    const _Atomic bool *cancel;
} srv_chat_req;

/* Converts the messages, tools, tool_choice, parallel_tool_calls, chat_template_kwargs and reasoning_effort of a
 * request body (root: the parsed object;
 * the messages' roles and contents were validated by srv_api_parse_gen). On success *out is filled (free with
 * srv_chat_req_free). Errors: SRV_API_ERR_INVALID with a 400 naming the field in *err (tool_calls without a
 * function name, arguments that are not a JSON object or a string holding one, tools not an array of
 * functions, an unknown tool_choice or a named function not in tools, chat_template_kwargs not an object, setting
 * a variable the server sets (messages, tools, add_generation_prompt, bos_token, eos_token) or a non-boolean
 * enable_thinking, reasoning_effort not none|minimal|low|medium|high), SRV_API_ERR_NOMEM (500). */
int srv_chat_parse(const cJSON *root, srv_chat_req *out, srv_api_error *err);
void srv_chat_req_free(srv_chat_req *r);

/* Renders r with template t: variables r->kwargs, messages, tools (when set), add_generation_prompt (false for a prefill),
 * bos_token, eos_token (NULL: ""), content spans marked (tpl_render_params.mark_content). A template that raises
 * while the first message is a system message is rendered again with the system text merged into the first
 * user message (as llama.cpp does). A prefill is cut right after the last assistant message's content, so that
 * generation continues it. On success *out holds the text and spans (free with tpl_output_free). Errors:
 * SRV_API_ERR_INVALID (400 naming the template's error and line, or a prefill the template does not print),
 * SRV_API_ERR_NOMEM (500). */
int srv_chat_render(const tpl_template *t, const srv_chat_req *r, const char *bos, const char *eos,
                    tpl_output *out, srv_api_error *err);

/* Spans of a rendering made by the built-in families (engine/text/chat.c), which do not mark content: each
 * message's content (or its whitespace-trimmed form) is looked for in order from where the previous one ended.
 * *spans is malloc'd (NULL when none). Returns 0 or KVS_ERR_NOMEM. */
int srv_chat_find_spans(const char *text, size_t len, const srv_api_msg *msgs, int32_t n_msgs,
                        tpl_span **spans, size_t *n_spans);

/* ---- building a chat body's messages (the Responses and Messages APIs map their input onto one) ---------- */
/* Appends {role, content} to the array msgs; *m (m may be NULL) gets the new message. 0, or SRV_API_ERR_NOMEM
 * with err set. */
int srv_chat_add_message(cJSON *msgs, const char *role, const char *content, cJSON **m, srv_api_error *err);
/* Appends {id, type: "function", function: {name, arguments}} to the array calls; false when out of memory. */
bool srv_chat_add_tool_call(cJSON *calls, const char *id, const char *name, const char *args);
/* The function name of the call with id among the tool_calls of the messages msgs, or NULL. */
const char *srv_chat_call_name(const cJSON *msgs, const char *id);

#endif /* KVSERVE_SERVER_CHAT_INTERNAL_H */
