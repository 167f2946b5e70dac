/*
 * tool_format_internal.h: how a model writes tool calls, and what follows from it (api/tool_format.c, prefix
 * srv_tool_format_; private to server/api/): the format picked from the chat template or built-in family
 * (srv_tool_format_detect, declared in server/api/api.h for the daemon), the grammar that constrains the output to tool
 * calls in that format (tool_choice "required" or a named function), and the tools described in the prompt for the
 * built-in families (which have no template to print them). The calls the grammar produces are exactly what
 * srv_tool_call_parse (api/tool_call_internal.h) reads back. Pure functions, no I/O, any thread.
 *
 * The formats themselves (what constrained output looks like) are described beside srv_tool_format in api.h.
 */
#ifndef KVSERVE_SERVER_TOOL_FORMAT_INTERNAL_H
#define KVSERVE_SERVER_TOOL_FORMAT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/common.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "server/api/api.h"

/* ---- constrained tool calls -------------------------------------------------------------------------------- */

typedef struct srv_tool_format_choice {
    const cJSON *tools;    /* the request's tools: [{type: "function", function: {name, parameters?}}, ...]
                              (validated by srv_chat_parse) */
    const char *name;      /* a named tool_choice: only this function (it must be in tools); NULL: any of them */
    bool parallel;         /* true: one or more calls; false: exactly one */
    srv_tool_format format;
} srv_tool_format_choice;

/* The cache key of the grammar srv_tool_format_compile builds for ch (malloc'd text, NULL on OOM): it starts with the
 * byte 0x02, which no JSON Schema key (JSON text) starts with. */
char *srv_tool_format_key(const srv_tool_format_choice *ch);

/* Compiles the grammar of the output ch allows: the call(s) in ch->format, names an enum of the allowed tools
 * (or the named one), each call's arguments constrained by its function's `parameters` JSON Schema through
 * gmr_compile_schema (default options, but at most one byte of whitespace between two JSON tokens: arguments
 * come on one line, as models write them). A function without parameters takes {} only; a schema without "type"
 * is taken as {"type": "object", ...} unless it has $ref, anyOf, oneOf, allOf, enum or const at the top (then
 * it is compiled as it is). On success *out is the grammar (gmr_grammar_free).
 * Errors (err names the tool as tools[i] with its function name, and the schema's problem): KVS_ERR_INVALID (a
 * bad argument, no tool to call, or the named one missing), KVS_ERR_TYPE (parameters not an object schema),
 * gmr_compile_schema's KVS_ERR_UNSUPPORTED (the keyword named), KVS_ERR_FORMAT, KVS_ERR_LIMIT,
 * KVS_ERR_NOMEM. */
int srv_tool_format_compile(const srv_tool_format_choice *ch, gmr_grammar **out, char *err, size_t err_len);

/* ---- prompts for the built-in families ------------------------------------------------------------------ */

/* Appends to *b a system-prompt text that describes the tools and how to call them in format f: Hermes the
 * <tools></tools> list and the <tool_call> envelope; Llama 3 the functions as JSON and the {"name",
 * "parameters"} answer; Mistral an [AVAILABLE_TOOLS] list and the [TOOL_CALLS] answer; generic the functions
 * and the {"name", "arguments"} answer. 0 or KVS_ERR_NOMEM. */
int srv_tool_format_prompt(srv_tool_format f, const cJSON *tools, kvs_buf *b);

/* Appends to *b the text of an assistant message's tool_calls ([{function: {name, arguments (an object)}}])
 * as the model writes them in format f (so that the history reads like its own output). 0 or KVS_ERR_NOMEM. */
int srv_tool_format_calls_text(srv_tool_format f, const cJSON *tool_calls, kvs_buf *b);

/* How a tool result (a `tool` message's content) is shown to a built-in family: *role becomes the role to
 * render it with ("user", or "ipython" for Llama 3) and *b gets the content (Hermes <tool_response>...,
 * Mistral [TOOL_RESULTS]..., otherwise a short "Result of ..." line). 0 or KVS_ERR_NOMEM. */
int srv_tool_format_result_text(srv_tool_format f, const char *name, const char *content, const char **role,
                                kvs_buf *b);

#endif /* KVSERVE_SERVER_TOOL_FORMAT_INTERNAL_H */
