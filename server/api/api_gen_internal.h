/* api_gen_internal.h: the generation pipeline of server/api/ (private to the folder), between the low level
 * (api_internal.h: api_base.c, api_call.c) and the routes (api_routes_internal.h). Each file uses only those
 * listed before it here (and the low level):
 *   api_structured.c   response_format and forced tool calls: parsing, the grammar compiled off the loop
 *   api_parse.c        request bodies -> srv_api_gen (validation; public part in api.h), the `priority` field
 *   api_chat_prompt.c  a chat request's prompt tokens (its template, content spans, the built-in families' tools)
 *   api_fim.c          fill-in-the-middle prompts, and the /infill body as a /v1/completions one
 *   api_prepare.c      a generation call's preparation off the loop (grammar, prompts, context and KV checks)
 *                      and its scheduler requests
 *   api_render.c       what a generation streams and answers: SSE chunks, logprobs, usage
 *   api_tools.c        tool calls in chat responses (message.tool_calls, streamed fragments)
 *   api_single.c       the one-choice routes on chat's preparation (responses, messages): submit, events, end
 */
#ifndef KVSERVE_API_GEN_INTERNAL_H
#define KVSERVE_API_GEN_INTERNAL_H

#include "server/api/api_internal.h"

/* ---- api_structured.c: response_format -------------------------------------------------------------------- */
/* Parses response_format into g (1 set, 0 absent, -1 invalid with err, -2 out of memory). */
int api_parse_response_format(const cJSON *root, srv_api_gen *g, srv_api_error *err);
/* Pool thread (the preparation): compiles or finds c->gen's response grammar (or its tool-call grammar) into
 * c->grammar. -1 with err set. */
int api_prepare_grammar(srv_api *api, api_call *c, srv_api_error *err);

/* ---- api_parse.c ------------------------------------------------------------------------------------------ */
/* The body's `priority` (an int32; absent or null: 0) into *out. 1 set, 0 absent, -1 with a 400 in err naming the
 * field: not an integer, out of range, or nonzero without lim->priority_scheduling. */
int api_parse_priority(const cJSON *root, const srv_api_limits *lim, int32_t *out, srv_api_error *err);

/* ---- api_chat_prompt.c, api_fim.c: prompts ---------------------------------------------------------------- */
/* The tokens of a chat request's prompt (template, content spans, prefill); -1 with e set. */
int api_chat_prompt(srv_api *api, api_call *c, int32_t **toks, int32_t *n, srv_api_error *e);
/* Prompt p with the suffix in the model's FIM order (PSM); -1 with e set (400 without FIM tokens). */
int api_fim_prompt(srv_api *api, const srv_api_prompt *p, const char *suffix, int32_t **toks, int32_t *n,
                   srv_api_error *e);
/* POST /infill: llama.cpp's infill fields in req's body translated into a /v1/completions body with `suffix`,
 * which replaces req's body. 0, or -1 with e set (400, 500). Loop thread. */
int api_fim_infill_body(srv_http_req *req, srv_api_error *e);

/* ---- api_prepare.c ---------------------------------------------------------------------------------------- */
/* Pool thread: after c->gen is parsed, everything else the preparation does for chat and completions (the
 * response_format grammar, subs and choices, every prompt built and checked against the context and the KV
 * pool) into c->prep_toks / prep_ntok; -1 with e set (the param of a prompt error is "messages" or "prompt"). */
int api_prepare_gen(srv_api *api, api_call *c, srv_api_error *e);
/* Loop thread: the scheduler request of prompt i (toks[0..n_toks)) from c->gen and c->grammar: sampling, seed,
 * stops, grammar, n_keep, priority; the caller sets cb and user. */
void api_fill_request(srv_api *api, api_call *c, const int32_t *toks, int32_t n_toks, int32_t i,
                      srv_sched_request *sr);

/* ---- api_render.c ----------------------------------------------------------------------------------------- */
/* The envelope of a streamed chunk: id, object, created, model. */
cJSON *api_chunk_base(api_call *c);
/* Writes `data: <json>\n\n` (or the literal, e.g. [DONE]); on a stalled or closed client, drops the stream and
 * cancels the generation. Consumes o. */
void api_sse_send(api_call *c, cJSON *o, const char *literal);
/* Starts c's SSE answer on req (200, text/event-stream). -1 when the connection is gone: then c->req is
 * cleared, the request aborted and c's scheduler requests cancelled. Loop thread. */
int api_stream_begin(api_call *c, srv_http_req *req);
/* One streamed chunk for choice idx: text (may be NULL), logprob samples, finish reason (NONE: null), the role
 * (the first chunk of a chat choice). */
void api_stream_chunk(api_call *c, int32_t idx, const char *text, size_t len, const eng_sample *smp, int32_t n_smp,
                      srv_sched_finish finish, bool role);
/* A streamed chat chunk whose delta holds reasoning_content (the thinking split from the output), with samples'
 * logprobs when n_smp > 0. */
void api_stream_reasoning(api_call *c, int32_t idx, const char *text, size_t len, const eng_sample *smp,
                          int32_t n_smp);
/* An empty logprobs accumulator of the call's kind (chat: {content, refusal}; completions: the four arrays). */
cJSON *api_new_logprobs(api_call *c);
/* Appends the logprobs of samples to lp (the choice's accumulator or a chunk's logprobs object). */
void api_add_logprobs(api_call *c, api_choice *ch, cJSON *lp, const eng_sample *smp, int32_t n);
/* The usage object of a final body or of the stream's last chunk. */
cJSON *api_usage_json(const srv_sched_usage *u, int32_t reasoning_tokens);
/* The tokens of one scheduler event (n) counted into c->reasoning_tokens when they went to reasoning: the parser
 * was inside reasoning before or after their text (was_inside, srv_reasoning_inside) or the reasoning grew, and
 * no content came with them. So a thinking block's markers and an analysis message's end count, a final
 * message's header does not; an event whose tokens mix both (rare: text held back by the detokenizer or a stop
 * string) counts as content. */
void api_count_reasoning(api_call *c, const srv_reasoning *p, bool was_inside, bool r_grew, bool c_grew, int32_t n);

/* ---- api_tools.c: tool calls in chat responses (loop thread) ---------------------------------------------- */
/* Whether c's output is parsed for tool calls (chat, tools given, tool_choice not none). */
bool api_tools_active(const api_call *c);
void api_tools_stream_delta(api_call *c, int32_t idx, const char *text, size_t len, const eng_sample *smp,
                            int32_t n_smp);
void api_tools_stream_end(api_call *c, int32_t idx, const char *text, size_t len, srv_sched_finish finish);
/* The final body's message of choice idx: content and tool_calls when the text holds calls. */
void api_tools_message(api_call *c, int32_t idx, cJSON *message, api_choice *ch);

/* ---- api_single.c: the one-choice routes on chat's preparation (loop thread) ------------------------------ */
/* After the preparation of c (one prompt, one choice; c->req set): submits the prompt with cb (user:
 * &c->subs[0]) and, when stream, begins the SSE answer. 1: streaming has begun (the caller sends its opening
 * events); 0: submitted without a stream, or the connection is gone, or c was answered with the preparation's
 * error, the shutdown's 503 or the scheduler's refusal (first given to adjust when not NULL) and freed. */
int api_single_start(api_call *c, srv_sched_event_cb cb, bool stream, void (*adjust)(srv_api_error *e));

enum { API_SINGLE_TEXT = 1, API_SINGLE_DONE = 2 };
/* The bookkeeping of scheduler event ev for sub (c's only request): DONE records the usage and returns
 * API_SINGLE_DONE (the caller ends the call); text is appended to choice 0 as valid UTF-8 (out of memory: c's
 * error), split into its reasoning and text when c->rsn_syntax says so (the parser finished by a normal
 * CHOICE_END), and returns API_SINGLE_TEXT when either grew and is to be streamed; a CHOICE_END of FINISH_ERROR sets c's error.
 * Else 0. The caller records a CHOICE_END's finish itself. */
int api_single_event(api_call *c, api_sub *sub, const srv_sched_event *ev);
/* The error c ends with into *e: its own, else the 503 / 500 of a cancelled choice (finish CANCELLED). Returns
 * whether there is one. */
bool api_single_error(const api_call *c, srv_sched_finish finish, srv_api_error *e);
/* The end of c once a stream's last events are sent: counts the finish (an error when e is set), closes the
 * stream and logs it, or answers e or body (200); consumes body (may be NULL) and clears c->req. The caller
 * frees c. */
void api_single_end(api_call *c, srv_sched_finish finish, const srv_api_error *e, cJSON *body);

#endif /* KVSERVE_API_GEN_INTERNAL_H */
