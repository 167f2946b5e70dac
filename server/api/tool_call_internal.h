/*
 * tool_call_internal.h: tool calls found in a model's generated text (api/tool_call.c, prefix srv_tool_call_; private
 * to server/api/). Pure functions, no I/O, any
 * thread.
 *
 * Formats recognised, at the end of the text (what comes before the first call is the message content):
 *   - Hermes / Qwen:  <tool_call>{"name": N, "arguments": {...}}</tool_call> (repeated; the last closing tag
 *                     may be missing when generation stopped on it)
 *   - Mistral:        [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]
 *   - Llama 3.x:      <|python_tag|>{"name": N, "parameters": {...}} (several separated by ';'), or
 *                     <|python_tag|>CODE (the built-in python tool: {"name": "python", "arguments": {"code": CODE}})
 *   - Llama 3.x JSON and a generic fallback: the whole text (surrounding whitespace aside) is one JSON object
 *     {"name": N, "parameters"|"arguments": {...}} (optionally "type": "function"), an array of such objects,
 *     or {"tool_calls": [...]} of them (also with OpenAI's {"function": {...}} wrapping).
 * "arguments" may be an object or a JSON string holding one; the result always carries the arguments as compact
 * JSON text (OpenAI's function.arguments). Text that looks like a call but does not parse (bad JSON, no name)
 * is not a call: the whole text stays content.
 */
#ifndef KVSERVE_SERVER_TOOL_CALLS_INTERNAL_H
#define KVSERVE_SERVER_TOOL_CALLS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

typedef struct srv_tool_call {
    char *name;         /* NUL-terminated, non-empty */
    char *arguments;    /* compact JSON text of an object ("{}" when none was given) */
} srv_tool_call;

typedef struct srv_tool_call_result {
    size_t content_len; /* the content is text[0..content_len) of the parsed text (trailing whitespace cut when
                           calls follow); the whole text when n_calls == 0 */
    srv_tool_call *calls; /* [n_calls] */
    int n_calls;
} srv_tool_call_result;

/* Parses text[0..len) (need not be NUL-terminated). On success (0) *out holds the calls (n_calls 0: none; free
 * with srv_tool_call_result_free). Errors: KVS_ERR_INVALID (NULL out, or NULL text with len > 0), KVS_ERR_NOMEM. */
int srv_tool_call_parse(const char *text, size_t len, srv_tool_call_result *out);
/* srv_tool_call_parse keeping only the first call unless parallel (parallel_tool_calls false). */
int srv_tool_call_parse_first(const char *text, size_t len, bool parallel, srv_tool_call_result *out);
void srv_tool_call_result_free(srv_tool_call_result *r);

/* Streaming: how many leading bytes of text[0..len) are content whatever text follows, i.e. can be sent to
 * the client now. Stops before the first tool-call marker, before a trailing partial marker or trailing
 * whitespace, and at 0 while the text (leading whitespace aside) is empty or starts with '{' or '[' (it may
 * become a JSON call). Never returns more than srv_tool_call_parse's content_len of any continuation of the text.
 * from: a result this function gave for a prefix of the same text (0: none); only text[from..len) is scanned,
 * so a stream costs O(its length). *held (may be NULL) is set true when everything from the result on is held
 * until the text is complete (a whole marker was seen, or the text starts as JSON): later calls would return
 * the same value. */
size_t srv_tool_call_stream_safe(const char *text, size_t len, size_t from, bool *held);

#endif /* KVSERVE_SERVER_TOOL_CALLS_INTERNAL_H */
