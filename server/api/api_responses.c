/* api_responses.c: POST /v1/responses (and /responses). The body is mapped onto a chat completions body
 * (server/api/responses_map_internal.h) and then takes the chat path itself: srv_api_parse_gen_json, api_prepare_gen
 * (the model's Jinja template with content spans as plain text, the system-role retry, tools and tool_choice,
 * response_format's grammar, the context check) and api_fill_request (sampling, grammar) for the scheduler. Its events
 * become a Response object, or the typed server-sent events of a streamed one: text deltas of a message item, then each
 * tool call the model wrote (server/api/tool_call_internal.h) as a function_call item with its arguments. Finished
 * responses are kept in memory (at most RESP_STORE_MAX, least recently used dropped) as chat messages, tool calls
 * included, so that previous_response_id can continue them; the continued conversation renders to the same prefix,
 * which the prefix cache then reuses. */
#include "server/api/api_gen_internal.h"
#include "server/api/api_routes_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api/responses_map_internal.h"
#include "server/api/tool_call_internal.h"

enum { RESP_STORE_MAX = 256 };

/* ---- the store of finished conversations ------------------------------------------------------------------- */
typedef struct resp_entry {
    char id[48];
    cJSON *conv;         /* chat messages: the whole conversation, the response's own output last (no instructions) */
    uint64_t used;       /* LRU clock */
} resp_entry;

struct api_resp_store {
    uv_mutex_t mu;
    resp_entry e[RESP_STORE_MAX];
    uint64_t clock;
};

api_resp_store *api_resp_store_create(void) {
    api_resp_store *s = calloc(1, sizeof *s);
    if (s && uv_mutex_init(&s->mu) != 0) { free(s); return NULL; }
    return s;
}

void api_resp_store_free(api_resp_store *s) {
    if (!s) return;
    for (int i = 0; i < RESP_STORE_MAX; i++) cJSON_Delete(s->e[i].conv);
    uv_mutex_destroy(&s->mu);
    free(s);
}

/* srv_responses_map_lookup_fn over the store (ud): a copy of the conversation `id`. Any thread. */
static int store_lookup(void *ud, const char *id, cJSON **msgs) {
    api_resp_store *s = ud;
    int rc = -1;
    if (!s) return -1;
    uv_mutex_lock(&s->mu);
    for (int i = 0; i < RESP_STORE_MAX; i++) {
        resp_entry *e = &s->e[i];
        if (!e->conv || strcmp(e->id, id)) continue;
        e->used = ++s->clock;
        rc = (*msgs = cJSON_Duplicate(e->conv, true)) ? 0 : -2;
        break;
    }
    uv_mutex_unlock(&s->mu);
    return rc;
}

/* Takes ownership of conv. */
static void store_put(api_resp_store *s, const char *id, cJSON *conv) {
    uv_mutex_lock(&s->mu);
    resp_entry *victim = &s->e[0];
    for (int i = 0; i < RESP_STORE_MAX; i++) {
        if (!s->e[i].conv) { victim = &s->e[i]; break; }
        if (s->e[i].used < victim->used) victim = &s->e[i];
    }
    cJSON_Delete(victim->conv);
    snprintf(victim->id, sizeof victim->id, "%s", id);
    victim->conv = conv;
    victim->used = ++s->clock;
    uv_mutex_unlock(&s->mu);
}

/* ---- a call ------------------------------------------------------------------------------------------------- */
typedef struct resp_call {
    api_call c;              /* first: api_call_free frees the whole struct */
    srv_responses_map_req rq;         /* the mapped request */
    char msg_id[48];
    const char *seed;        /* the random part of c.id, for the function calls' ids */
    bool tools;              /* tool calls are parsed from the output (tools given, tool_choice not none) */
    bool msg_open;           /* streamed: the message item was announced */
    int msg_index;           /* streamed: its output_index */
    char rs_id[48];          /* the reasoning item's id */
    bool rs_open;            /* streamed: the reasoning item was announced */
    bool rs_done;            /* streamed: and its done events sent (when the message began, or at the end) */
    int rs_index;            /* streamed: its output_index */
    int next_out;            /* streamed: the output_index of the next item announced */
    int64_t seq_no;          /* sequence_number of the next streamed event */
    srv_sched_finish finish;
} resp_call;

static void resp_ext_free(api_call *c) { srv_responses_map_req_free(&((resp_call *)c)->rq); }

static void resp_free(resp_call *r) { api_call_free(&r->c); }

/* The chat path's error names chat fields: the ones the client wrote are the Responses API's. */
static void responses_param(srv_api_error *e) {
    if (!strncmp(e->param, "messages", 8)) snprintf(e->param, sizeof e->param, "input");
    else if (!strcmp(e->param, "max_tokens")) snprintf(e->param, sizeof e->param, "max_output_tokens");
    else if (!strcmp(e->param, "response_format")) snprintf(e->param, sizeof e->param, "text.format");
}

/* Pool thread: the body mapped onto chat's, then chat's own preparation (template, tokens, grammar, checks). */
static void resp_work(api_job *j) {
    resp_call *r = (resp_call *)j;
    api_call *c = &r->c;
    srv_api *api = c->api;
    srv_api_error *e = &c->prep_error;
    c->prep_failed = true;
    cJSON *root = api_parse_body_object(c->job.body, c->job.body_len, e);
    if (!root) return;
    int rc = srv_responses_map_parse(root, store_lookup, api->resp_store, &r->rq, e);
    cJSON_Delete(root);
    if (rc != 0) return;
    c->kind = SRV_API_CHAT;
    rc = srv_api_parse_gen_json(SRV_API_CHAT, r->rq.chat, &api->limits, &c->gen, e);
    if (rc == 0) rc = api_prepare_gen(api, c, e);
    if (rc != 0) { responses_param(e); return; }
    r->tools = api_tools_active(c);
    c->prep_failed = false;
}

/* ---- output ------------------------------------------------------------------------------------------------- */
static cJSON *dup_or_null(const cJSON *j) { return j ? cJSON_Duplicate(j, true) : cJSON_CreateNull(); }

/* The Response object; status "in_progress", "completed", "incomplete" or "failed"; output: the items (copied;
 * NULL: none yet). */
static cJSON *response_obj(resp_call *r, const char *status, const cJSON *output) {
    api_call *c = &r->c;
    const srv_responses_map_req *q = &r->rq;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)c->created);
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddStringToObject(o, "model", c->api->model_id);
    cJSON_AddNullToObject(o, "error");
    if (!strcmp(status, "incomplete")) {
        cJSON *d = cJSON_AddObjectToObject(o, "incomplete_details");
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
    } else {
        cJSON_AddNullToObject(o, "incomplete_details");
    }
    if (q->instructions) cJSON_AddStringToObject(o, "instructions", q->instructions);
    else cJSON_AddNullToObject(o, "instructions");
    if (q->max_output > 0) cJSON_AddNumberToObject(o, "max_output_tokens", q->max_output);
    else cJSON_AddNullToObject(o, "max_output_tokens");
    cJSON_AddItemToObject(o, "output", output ? cJSON_Duplicate(output, true) : cJSON_CreateArray());
    cJSON_AddBoolToObject(o, "parallel_tool_calls", q->parallel_tool_calls);
    if (q->prev_id) cJSON_AddStringToObject(o, "previous_response_id", q->prev_id);
    else cJSON_AddNullToObject(o, "previous_response_id");
    cJSON_AddBoolToObject(o, "store", q->store);
    cJSON_AddNumberToObject(o, "temperature", q->temperature);
    cJSON_AddNumberToObject(o, "top_p", q->top_p);
    cJSON *tf = cJSON_AddObjectToObject(o, "text");
    if (tf) cJSON_AddItemToObject(tf, "format", dup_or_null(q->text_format));
    cJSON_AddItemToObject(o, "tool_choice",
                          q->tool_choice ? cJSON_Duplicate(q->tool_choice, true) : cJSON_CreateString("auto"));
    cJSON_AddItemToObject(o, "tools", q->tools ? cJSON_Duplicate(q->tools, true) : cJSON_CreateArray());
    cJSON_AddStringToObject(o, "truncation", "disabled");
    cJSON_AddObjectToObject(o, "metadata");
    if (strcmp(status, "in_progress")) {
        cJSON *u = cJSON_AddObjectToObject(o, "usage");
        int32_t in = c->usage.prompt_tokens, outn = c->usage.completion_tokens;
        cJSON_AddNumberToObject(u, "input_tokens", in);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens",
                                c->usage.cached_tokens);
        cJSON_AddNumberToObject(u, "output_tokens", outn);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens",
                                c->reasoning_tokens);
        cJSON_AddNumberToObject(u, "total_tokens", in + outn);
    } else {
        cJSON_AddNullToObject(o, "usage");
    }
    return o;
}

/* Sends one typed event ("event: T\ndata: {...,"type":T,"sequence_number":N}\n\n"); takes obj. */
static void resp_send(resp_call *r, const char *type, cJSON *obj) {
    api_call *c = &r->c;
    if (!c->req || !obj) { cJSON_Delete(obj); return; }
    cJSON *t = cJSON_CreateString(type);
    if (t) cJSON_AddItemToObject(obj, "type", t);
    cJSON_AddNumberToObject(obj, "sequence_number", (double)r->seq_no++);
    char *s = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    kvs_buf b = {0};
    kvs_buf_append(&b, "event: ", 7);
    kvs_buf_append(&b, type, strlen(type));
    kvs_buf_append(&b, "\ndata: ", 7);
    if (s) kvs_buf_append(&b, s, strlen(s));
    kvs_buf_append(&b, "\n\n", 2);
    free(s);
    int rc = s && !b.oom ? srv_http_stream_write(c->req, b.data, b.len) : -1;
    kvs_buf_free(&b);
    if (rc != 0 && c->req) api_stream_client_gone(c); /* the client does not read or is gone */
}

/* {item_id, output_index[, content_index: 0]} */
static cJSON *item_event(const char *item_id, int output_index, bool with_content_index) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "item_id", item_id);
    cJSON_AddNumberToObject(o, "output_index", output_index);
    if (with_content_index) cJSON_AddNumberToObject(o, "content_index", 0);
    return o;
}

static cJSON *text_part(const char *text) {
    cJSON *p = cJSON_CreateObject();
    if (!p) return NULL;
    cJSON_AddStringToObject(p, "type", "output_text");
    cJSON_AddStringToObject(p, "text", text);
    cJSON_AddArrayToObject(p, "annotations");
    cJSON_AddArrayToObject(p, "logprobs");
    return p;
}

/* response.output_item.added / .done of item (taken) at output_index. */
static void send_item(resp_call *r, const char *type, int output_index, cJSON *item) {
    cJSON *o = cJSON_CreateObject();
    if (!o) { cJSON_Delete(item); return; }
    cJSON_AddNumberToObject(o, "output_index", output_index);
    cJSON_AddItemToObject(o, "item", item);
    resp_send(r, type, o);
}

/* The reasoning item is done: its text so far (reasoning that comes after the message began, as harmony's
 * analysis may, is in the final Response's item only). */
static void reasoning_done(resp_call *r) {
    api_choice *ch = &r->c.choices[0];
    if (!r->rs_open || r->rs_done) return;
    r->rs_done = true;
    const char *text = ch->reasoning.data ? ch->reasoning.data : "";
    cJSON *o = item_event(r->rs_id, r->rs_index, true);
    if (o) cJSON_AddStringToObject(o, "text", text);
    resp_send(r, "response.reasoning_text.done", o);
    send_item(r, "response.output_item.done", r->rs_index, srv_responses_map_reasoning_item(r->rs_id, "completed", text));
}

/* The message item (the next output index) and its one text part begin; the reasoning before it is done. */
static void open_message(resp_call *r) {
    reasoning_done(r);
    r->msg_open = true;
    r->msg_index = r->next_out++;
    send_item(r, "response.output_item.added", r->msg_index,
              srv_responses_map_message_item(r->msg_id, "in_progress", NULL));
    cJSON *o = item_event(r->msg_id, r->msg_index, true);
    if (o) cJSON_AddItemToObject(o, "part", text_part(""));
    resp_send(r, "response.content_part.added", o);
}

static void send_text_delta(resp_call *r, const char *text, size_t len) {
    char *d = api_utf8_sanitize(text, len);
    cJSON *o = item_event(r->msg_id, r->msg_index, true);
    if (o) {
        cJSON_AddStringToObject(o, "delta", d ? d : "");
        cJSON_AddArrayToObject(o, "logprobs");
    }
    free(d);
    resp_send(r, "response.output_text.delta", o);
}

static void stream_start(resp_call *r) {
    cJSON *o = cJSON_CreateObject();
    if (o) cJSON_AddItemToObject(o, "response", response_obj(r, "in_progress", NULL));
    resp_send(r, "response.created", o);
    o = cJSON_CreateObject();
    if (o) cJSON_AddItemToObject(o, "response", response_obj(r, "in_progress", NULL));
    resp_send(r, "response.in_progress", o);
    /* with tools the output may hold no message at all: it begins with the first text that cannot be a call */
    if (!r->tools && r->c.rsn_syntax == SRV_REASONING_OFF) open_message(r);
}

/* Streams the reasoning not sent yet: the reasoning item (announced at its first text, the next output index)
 * gets response.reasoning_text.delta events. */
static void stream_reasoning(resp_call *r) {
    api_choice *ch = &r->c.choices[0];
    if (ch->reasoning.len <= ch->r_sent || r->rs_done) return;
    if (!r->rs_open) {
        r->rs_open = true;
        r->rs_index = r->next_out++;
        send_item(r, "response.output_item.added", r->rs_index,
                  srv_responses_map_reasoning_item(r->rs_id, "in_progress", NULL));
    }
    char *d = api_utf8_sanitize(ch->reasoning.data + ch->r_sent, ch->reasoning.len - ch->r_sent);
    cJSON *o = item_event(r->rs_id, r->rs_index, true);
    if (o) cJSON_AddStringToObject(o, "delta", d ? d : "");
    free(d);
    resp_send(r, "response.reasoning_text.delta", o);
    ch->r_sent = ch->reasoning.len;
}

/* Streams the new reasoning, then what of the text so far is surely message content (all of it without tools). */
static void stream_text(resp_call *r) {
    api_choice *ch = &r->c.choices[0];
    stream_reasoning(r);
    size_t safe = ch->text.len;
    if (r->tools)
        safe = ch->held ? ch->sent : srv_tool_call_stream_safe(ch->text.data, ch->text.len, ch->sent, &ch->held);
    if (safe <= ch->sent) return;
    if (!r->msg_open) open_message(r);
    send_text_delta(r, ch->text.data + ch->sent, safe - ch->sent);
    ch->sent = safe;
}

/* The end of a streamed response: the rest of the reasoning and of the message, then each function call's
 * events. out->items holds the reasoning item at the index it was announced at. */
static void stream_end(resp_call *r, const srv_responses_map_out *out, const char *status) {
    api_choice *ch = &r->c.choices[0];
    reasoning_done(r);
    if (out->has_message) {
        size_t cl = strlen(out->content);
        if (!r->msg_open) open_message(r);
        if (cl > ch->sent) send_text_delta(r, out->content + ch->sent, cl - ch->sent);
        ch->sent = cl > ch->sent ? cl : ch->sent;
        cJSON *o = item_event(r->msg_id, r->msg_index, true);
        if (o) cJSON_AddStringToObject(o, "text", out->content);
        resp_send(r, "response.output_text.done", o);
        o = item_event(r->msg_id, r->msg_index, true);
        if (o) cJSON_AddItemToObject(o, "part", text_part(out->content));
        resp_send(r, "response.content_part.done", o);
        send_item(r, "response.output_item.done", r->msg_index,
                  cJSON_Duplicate(cJSON_GetArrayItem(out->items, r->msg_index), true));
    }
    int idx = r->next_out;
    for (int k = 0; k < out->n_calls && r->c.req; k++, idx++) {
        const cJSON *it = cJSON_GetArrayItem(out->items, idx);
        const char *id = cJSON_GetObjectItemCaseSensitive(it, "id")->valuestring;
        const char *name = cJSON_GetObjectItemCaseSensitive(it, "name")->valuestring;
        const char *args = cJSON_GetObjectItemCaseSensitive(it, "arguments")->valuestring;
        const char *call_id = cJSON_GetObjectItemCaseSensitive(it, "call_id")->valuestring;
        send_item(r, "response.output_item.added", idx,
                  srv_responses_map_call_item(id, call_id, name, "", "in_progress"));
        cJSON *o = item_event(id, idx, false);
        if (o) cJSON_AddStringToObject(o, "delta", args);
        resp_send(r, "response.function_call_arguments.delta", o);
        o = item_event(id, idx, false);
        if (o) { cJSON_AddStringToObject(o, "name", name); cJSON_AddStringToObject(o, "arguments", args); }
        resp_send(r, "response.function_call_arguments.done", o);
        send_item(r, "response.output_item.done", idx, cJSON_Duplicate(it, true));
    }
    cJSON *o = cJSON_CreateObject();
    if (o) cJSON_AddItemToObject(o, "response", response_obj(r, status, out->items));
    resp_send(r, !strcmp(status, "completed") ? "response.completed" : "response.incomplete", o);
}

static void stream_error(resp_call *r, const srv_api_error *e) {
    cJSON *o = cJSON_CreateObject();
    if (o) {
        if (e->code) cJSON_AddStringToObject(o, "code", e->code); else cJSON_AddNullToObject(o, "code");
        cJSON_AddStringToObject(o, "message", e->message);
        if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param); else cJSON_AddNullToObject(o, "param");
    }
    resp_send(r, "error", o);
}

static void resp_finish(resp_call *r) {
    api_call *c = &r->c;
    srv_api *api = c->api;
    srv_api_error e;
    bool error = api_single_error(c, r->finish, &e);
    const char *status = r->finish == SRV_SCHED_FINISH_LENGTH ? "incomplete" : "completed";
    srv_responses_map_out out;
    memset(&out, 0, sizeof out);
    api_choice *ch = &c->choices[0];
    if (!error && srv_responses_map_output(ch->text.data, ch->text.len, r->tools, r->rq.parallel_tool_calls, r->msg_id,
                                  r->seed, status, &out) != 0) {
        error = true;
        srv_api_set_nomem(&e);
    }
    if (!error && ch->reasoning.len > 0 && out.has_message && !out.content[0] && out.n_calls == 0 && !r->msg_open) {
        cJSON_DeleteItemFromArray(out.items, 0); /* only thinking came out: no empty message item */
        out.has_message = false;
    }
    if (!error && ch->reasoning.len > 0) { /* the reasoning item: where the stream announced it, else first */
        if (c->req && c->stream) stream_reasoning(r);
        cJSON *it = srv_responses_map_reasoning_item(r->rs_id, "completed", ch->reasoning.data);
        if (!it || !out.items) { cJSON_Delete(it); error = true; srv_api_set_nomem(&e); }
        else cJSON_InsertItemInArray(out.items, r->rs_open ? r->rs_index : 0, it);
    }
    if (!error && r->rq.store && r->rq.conv) {
        cJSON_AddItemToArray(r->rq.conv, out.assistant);
        out.assistant = NULL;
        store_put(api->resp_store, c->id, r->rq.conv);
        r->rq.conv = NULL;
    }
    cJSON *body = NULL;
    if (c->req && c->stream) {
        if (error) stream_error(r, &e);
        else stream_end(r, &out, status);
    } else if (c->req && !error) {
        body = response_obj(r, status, out.items);
    }
    api_single_end(c, r->finish, error ? &e : NULL, body);
    srv_responses_map_out_free(&out);
    resp_free(r);
}

static void resp_event(const srv_sched_event *ev, void *user) {
    api_sub *sub = user;
    resp_call *r = (resp_call *)sub->call;
    int k = api_single_event(&r->c, sub, ev);
    if (k == API_SINGLE_DONE) { resp_finish(r); return; }
    if (k == API_SINGLE_TEXT) stream_text(r);
    if (ev->type == SRV_SCHED_EV_CHOICE_END) r->finish = ev->finish;
}

/* Loop thread: queue the prepared prompt, begin the stream. */
static void resp_done(api_job *j) {
    resp_call *r = (resp_call *)j;
    api_call *c = &r->c;
    srv_api *api = c->api;
    srv_http_req *req = c->req;
    if (!req || api->closing) { resp_free(r); return; }
    if (api_single_start(c, resp_event, r->rq.stream, responses_param)) stream_start(r);
}

void api_route_responses(srv_api *api, srv_http_req *req) {
    resp_call *r = calloc(1, sizeof *r);
    if (!r || !api->resp_store) { free(r); api_reply_json(api, req, 500, NULL, NULL, -1); return; }
    api_call *c = &r->c;
    c->ext_free = resp_ext_free;
    api_call_register(api, c, req, "/v1/responses");
    api_make_id(api, "resp_", c->id, sizeof c->id);
    api_make_id(api, "msg_", r->msg_id, sizeof r->msg_id);
    api_make_id(api, "rs_", r->rs_id, sizeof r->rs_id);
    r->seed = c->id + 5;
    c->job.work = resp_work;
    c->job.done = resp_done;
    api_offload(api, &c->job);
}
