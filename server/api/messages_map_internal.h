/*
 * messages_map_internal.h: Anthropic's Messages API mapped onto chat completions (api/messages_map.c, prefix
 * srv_messages_map_; private to server/api/). Pure: no I/O, no engine, no globals; any thread.
 *
 * A /v1/messages (or /v1/messages/count_tokens) body becomes a /v1/chat/completions body, which then takes the
 * chat path itself (srv_api_parse_gen_json, the model's Jinja template, tools, tool_choice and its grammar, the
 * scheduler): nothing about prompts is decided here.
 *
 *   system: a string or text blocks      -> a first system message (blocks joined by "\n")
 *   messages[i] {role: user|assistant, content: a string or blocks}:
 *     text blocks                        -> the message's content (joined by "\n")
 *     tool_use {id, name, input}         -> (assistant) tool_calls [{id, type: function, function: {name,
 *                                           arguments: input as compact JSON}}]
 *     tool_result {tool_use_id, content: a string or text blocks, is_error}
 *                                        -> (user) a tool message {tool_call_id, name (of the tool_use with
 *                                           that id, which must come before), content}, before the user's text
 *     thinking, redacted_thinking        -> (assistant) left out (the model does not see past reasoning)
 *     any other type (image, document, search_result, server tool blocks ...) -> 400 naming it
 *   max_tokens (required, integer >= 1; not for count_tokens) -> max_tokens
 *   temperature, top_p, top_k            -> the same (range checks are chat's)
 *   stop_sequences                       -> stop
 *   metadata {user_id}                   -> user
 *   tools [{name, description, input_schema, type: absent or "custom"}]
 *                                        -> tools [{type: function, function: {name, description, parameters}}]
 *   tool_choice {type: auto|any|tool|none, name, disable_parallel_tool_use}
 *                                        -> tool_choice "auto" | "required" | {type: function, function: {name}}
 *                                           | "none"; parallel_tool_calls = !disable_parallel_tool_use
 *   thinking {type: enabled, budget_tokens} -> nothing (the template thinks by default; the budget is checked
 *                                           as an integer >= 1, not enforced)
 *   thinking {type: disabled}            -> chat_template_kwargs {enable_thinking: false}
 *   stream                               -> kept here (the chat body never streams)
 * Other fields (service_tier, container, cache_control in blocks ...) are ignored.
 *
 * Generated text maps back (srv_messages_map_output): tool calls in the model's format (api/tool_call_internal.h)
 * become tool_use blocks with the arguments parsed into `input`, after a text block holding the text before
 * them (present when that text is not empty). The reasoning split from the output (api/reasoning_internal.h) is
 * not this file's: api_messages.c puts it first as a thinking block.
 *
 * Errors are srv_api_error values as everywhere in the API layer; on the Anthropic routes they are written in
 * Anthropic's shape (srv_api_error_json_anthropic, api.h).
 */
#ifndef KVSERVE_SERVER_MESSAGES_MAP_INTERNAL_H
#define KVSERVE_SERVER_MESSAGES_MAP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "server/api/api.h"

typedef struct srv_messages_map_req {
    cJSON *chat;              /* the /v1/chat/completions body for srv_api_parse_gen_json (never "stream") */
    int32_t max_tokens;       /* -1 for count_tokens */
    bool parallel_tool_calls; /* !tool_choice.disable_parallel_tool_use (default true) */
    bool stream;              /* default false; always false for count_tokens */
} srv_messages_map_req;

/* Maps a Messages body (root: a JSON object) onto *out (free with srv_messages_map_req_free). count_tokens: the body of
 * /v1/messages/count_tokens (max_tokens neither required nor passed on, stream ignored). Returns 0;
 * SRV_API_ERR_INVALID with err set (400, the message naming the field: "messages[1].content[0]", "max_tokens",
 * "tools[2].type", ...; an unsupported block or tool type is named in the message); SRV_API_ERR_NOMEM (500). */
int srv_messages_map_parse(const cJSON *root, bool count_tokens, srv_messages_map_req *out, srv_api_error *err);
void srv_messages_map_req_free(srv_messages_map_req *r);

/* What the model generated, mapped back. */
typedef struct srv_messages_map_out {
    cJSON *content;      /* the Message's content blocks: {type: text, text} when the text is not empty, then
                            one {type: tool_use, id, name, input} per call */
    char *text;          /* the text block's text, "" when none */
    int n_calls;
    bool has_text;       /* content[0] is the text block */
} srv_messages_map_out;

/* Maps text[0..len) (valid UTF-8, need not be NUL-terminated; NULL when len is 0). tools: parse tool calls
 * (tools were given and tool_choice is not none); parallel false keeps only the first call. Call k gets the id
 * "toolu_<seed>_<k>". Returns 0 (free with srv_messages_map_out_free), KVS_ERR_INVALID (NULL out or seed, NULL text
 * with len), KVS_ERR_NOMEM. */
int srv_messages_map_output(const char *text, size_t len, bool tools, bool parallel, const char *seed, srv_messages_map_out *out);
void srv_messages_map_out_free(srv_messages_map_out *o);

/* The stop_reason: "tool_use" when the output holds calls, else "max_tokens" when the length ended it (length),
 * else "stop_sequence" when a stop string did (stop_string), else "end_turn". */
const char *srv_messages_map_stop_reason(int n_calls, bool length, bool stop_string);

/* The usage object: {input_tokens: prompt - cached, cache_creation_input_tokens: 0, cache_read_input_tokens:
 * cached, output_tokens} (Anthropic counts cache reads apart from input_tokens). NULL on OOM. */
cJSON *srv_messages_map_usage(int32_t prompt_tokens, int32_t cached_tokens, int32_t output_tokens);

/* The Message object {id, type: "message", role: "assistant", model, content, stop_reason, stop_sequence,
 * stop_details: null, usage}. content is taken (NULL: []); stop_reason and stop_sequence NULL: JSON null; usage
 * is taken (NULL: zeros). NULL on OOM (what was taken is freed). */
cJSON *srv_messages_map_message(const char *id, const char *model, cJSON *content, const char *stop_reason,
                       const char *stop_sequence, cJSON *usage);

#endif /* KVSERVE_SERVER_MESSAGES_MAP_INTERNAL_H */
