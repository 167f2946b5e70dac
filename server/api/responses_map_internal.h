/*
 * responses_map_internal.h: the OpenAI Responses API mapped onto chat completions (api/responses_map.c, prefix
 * srv_responses_map_; private to server/api/). Pure: no I/O, no
 * engine, no globals; any thread.
 *
 * A /v1/responses body becomes a /v1/chat/completions body, which then takes exactly the chat path
 * (srv_api_parse_gen_json, the model's Jinja template with content spans, tools, tool_choice and its grammar,
 * the scheduler): nothing about prompts is decided here.
 *
 *   instructions                    -> a first system message (not carried over by previous_response_id)
 *   the stored conversation         -> the messages after it (chat messages, as srv_responses_map_output made them)
 *   input: a string                 -> a user message
 *   input: message items            -> messages (developer -> system; text parts joined)
 *   input: function_call items      -> tool_calls of an assistant message (appended to the assistant message
 *                                      right before it, as the model produced them; else a new one)
 *   input: function_call_output     -> a tool message (tool_call_id, and the function's name when a call with
 *                                      that call_id came before)
 *   tools [{type:function, name, description, parameters, strict}]
 *                                   -> tools [{type:function, function:{name, description, parameters, strict}}]
 *   tool_choice none|auto|required  -> the same; {type:function, name} -> {type:function, function:{name}}
 *   parallel_tool_calls, temperature, top_p -> the same; max_output_tokens -> max_tokens
 *   text.format text|json_object|json_schema -> response_format
 *   reasoning {effort}              -> reasoning_effort (chat's checks; "none" renders without thinking)
 *
 * The generated text maps back (srv_responses_map_output): tool calls in the model's format
 * (tool_call_internal.h) become function_call output items after the message item, and the assistant message that
 * the store keeps.
 */
#ifndef KVSERVE_SERVER_RESPONSES_MAP_INTERNAL_H
#define KVSERVE_SERVER_RESPONSES_MAP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "server/api/api.h"

/* Looks up the conversation stored under a previous response's id: on 0, *msgs is a new array of chat messages
 * the caller of srv_responses_map_parse owns; -1 unknown id; -2 out of memory. */
typedef int (*srv_responses_map_lookup_fn)(void *ud, const char *id, cJSON **msgs);

typedef struct srv_responses_map_req {
    cJSON *chat;              /* the /v1/chat/completions body for srv_api_parse_gen_json (never "stream") */
    cJSON *conv;              /* the conversation to store: the stored one, then this input (no instructions) */
    cJSON *tools;             /* the function tools as the Response object echoes them (an array, maybe empty) */
    cJSON *tool_choice;       /* as given, for the echo ("auto" when absent) */
    cJSON *text_format;       /* text.format for the echo ({"type":"text"} when absent) */
    char *instructions;       /* NULL when absent */
    char *prev_id;            /* previous_response_id, NULL when absent */
    int32_t max_output;       /* max_output_tokens, -1 when absent */
    float temperature, top_p; /* 1, 1 when absent (range-checked by the chat parse) */
    bool parallel_tool_calls; /* default true */
    bool store;               /* default true */
    bool stream;              /* default false */
} srv_responses_map_req;

/* Maps a Responses body (root: a JSON object) onto *out (free with srv_responses_map_req_free). lookup (may be NULL:
 * every previous_response_id is unknown) fetches the stored conversation. Returns 0; SRV_API_ERR_INVALID with
 * err set: 400 naming the field ("input[2].call_id", "tools[1]", "tool_choice", ...; an unsupported tool type
 * or input item type is named in the message), or 404 (code "not_found") for an unknown previous_response_id;
 * SRV_API_ERR_NOMEM (500). */
int srv_responses_map_parse(const cJSON *root, srv_responses_map_lookup_fn lookup, void *ud, srv_responses_map_req *out,
                            srv_api_error *err);
void srv_responses_map_req_free(srv_responses_map_req *r);

/* One output item (new object, NULL on OOM). message: status "in_progress" / "completed" / "incomplete"; text
 * NULL gives an empty content array (the streamed item's start), else one output_text part. */
cJSON *srv_responses_map_message_item(const char *id, const char *status, const char *text);
/* reasoning (the thinking split from the output): {type: reasoning, id, summary: [], status, content: [] or
 * [{type: reasoning_text, text}]} (text NULL: the streamed item's start). */
cJSON *srv_responses_map_reasoning_item(const char *id, const char *status, const char *text);
/* function_call: arguments is the JSON text of the arguments object ("" while streaming). */
cJSON *srv_responses_map_call_item(const char *id, const char *call_id, const char *name, const char *arguments,
                                   const char *status);

/* What the model generated, mapped back. */
typedef struct srv_responses_map_out {
    cJSON *items;        /* the Response's output: a message item (when content is not empty, or when there
                            are no calls), then one function_call item per call */
    cJSON *assistant;    /* the chat message for the store: {role: assistant, content, tool_calls?} */
    char *content;       /* the message text, "" when none */
    int n_calls;
    bool has_message;    /* items[0] is the message item */
} srv_responses_map_out;

/* Maps text[0..len) (valid UTF-8, need not be NUL-terminated; NULL when len is 0). tools: parse tool calls
 * (tools were given and tool_choice is not none); parallel false keeps only the first call. Item ids: msg_id for
 * the message; "fc_<seed>_<k>" and call ids "call_<seed>_<k>" for call k. status: the message item's status.
 * Returns 0 (free with srv_responses_map_out_free), KVS_ERR_INVALID (NULL out, ids or text with len), KVS_ERR_NOMEM. */
int srv_responses_map_output(const char *text, size_t len, bool tools, bool parallel, const char *msg_id,
                             const char *seed, const char *status, srv_responses_map_out *out);
void srv_responses_map_out_free(srv_responses_map_out *o);

#endif /* KVSERVE_SERVER_RESPONSES_MAP_INTERNAL_H */
