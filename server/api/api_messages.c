/* api_messages.c: POST /v1/messages and POST /v1/messages/count_tokens, Anthropic's Messages API. The body is
 * mapped onto a chat completions body (server/api/messages_map_internal.h) and then takes the chat path itself:
 * srv_api_parse_gen_json, api_prepare_gen (the model's Jinja template with content spans as plain text, the
 * system-role retry, tools and tool_choice with its grammar, the context and KV checks) and api_fill_request for
 * the scheduler. Its events become a Message object, or Anthropic's server-sent events for a streamed one:
 * message_start, ping, a text block (content_block_start, text_delta per step, content_block_stop), then each
 * tool call the model wrote (server/api/tool_call_internal.h) as a tool_use block whose input arrives as one
 * input_json_delta, then message_delta (stop_reason, stop_sequence, usage) and message_stop. With tools, text is
 * held back from where it may become a call, as on chat. count_tokens renders and tokenizes the prompt the same
 * way and answers {"input_tokens": N} without generating. Errors on these paths are written in Anthropic's shape
 * (api_reply_error; in a stream, an `error` event). */
#include "server/api/api_gen_internal.h"
#include "server/api/api_routes_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api/messages_map_internal.h"
#include "server/api/tool_call_internal.h"

typedef struct msg_call {
    api_call c;              /* first: api_call_free frees the whole struct */
    srv_messages_map_req rq;          /* the mapped request */
    bool count;              /* /v1/messages/count_tokens */
    int32_t n_input;         /* count_tokens: the prompt's tokens */
    const char *seed;        /* the random part of c.id, for the tool_use ids */
    bool tools;              /* tool calls are parsed from the output (tools given, tool_choice not none) */
    int open_kind;           /* streamed: the block now open: BLK_NONE, BLK_THINKING or BLK_TEXT */
    int cur_idx;             /* streamed: its index */
    bool text_seen;          /* streamed: a text block was started */
    int n_blocks;            /* streamed: content blocks started */
    int32_t stop_match;      /* the CHOICE_END's stop_match */
    srv_sched_finish finish;
} msg_call;

enum { BLK_NONE, BLK_THINKING, BLK_TEXT };

static void msg_ext_free(api_call *c) { srv_messages_map_req_free(&((msg_call *)c)->rq); }

static void msg_free(msg_call *m) { api_call_free(&m->c); }

/* Pool thread: the body mapped onto chat's, then chat's own preparation (template, tokens, grammar, checks);
 * count_tokens only renders and tokenizes the prompt. */
static void msg_work(api_job *j) {
    msg_call *m = (msg_call *)j;
    api_call *c = &m->c;
    srv_api *api = c->api;
    srv_api_error *e = &c->prep_error;
    c->prep_failed = true;
    cJSON *root = api_parse_body_object(c->job.body, c->job.body_len, e);
    if (!root) return;
    int rc = srv_messages_map_parse(root, m->count, &m->rq, e);
    cJSON_Delete(root);
    if (rc != 0) return;
    c->kind = SRV_API_CHAT;
    rc = srv_api_parse_gen_json(SRV_API_CHAT, m->rq.chat, &api->limits, &c->gen, e);
    if (rc != 0) return;
    if (m->count) {
        int32_t *toks = NULL, n = 0;
        if (api_chat_prompt(api, c, &toks, &n, e) != 0) return;
        free(toks);
        m->n_input = n;
    } else {
        if (api_prepare_gen(api, c, e) != 0) return;
        m->tools = api_tools_active(c);
    }
    c->prep_failed = false;
}

/* ---- output ------------------------------------------------------------------------------------------------- */
/* The stop string that ended the choice, or NULL. */
static const char *matched_stop(const msg_call *m) {
    const srv_api_gen *g = &m->c.gen;
    if (m->finish != SRV_SCHED_FINISH_STOP || m->stop_match < 1 || m->stop_match > g->n_stop) return NULL;
    return g->stop[m->stop_match - 1];
}

/* Sends one event ("event: T\ndata: {"type":T,...}\n\n"); takes obj (NULL: {"type":T}). */
static void msg_send(msg_call *m, const char *type, cJSON *obj) {
    api_call *c = &m->c;
    if (!c->req) { cJSON_Delete(obj); return; }
    cJSON *o = cJSON_CreateObject();
    if (o) cJSON_AddStringToObject(o, "type", type);
    for (cJSON *f = obj ? obj->child : NULL, *n; o && f; f = n) { /* type first, then obj's fields */
        n = f->next;
        cJSON_AddItemToObject(o, f->string, cJSON_DetachItemViaPointer(obj, f));
    }
    cJSON_Delete(obj);
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    kvs_buf b = {0};
    kvs_buf_puts(&b, "event: ");
    kvs_buf_puts(&b, type);
    kvs_buf_puts(&b, "\ndata: ");
    if (s) kvs_buf_puts(&b, s);
    kvs_buf_puts(&b, "\n\n");
    free(s);
    int rc = s && !b.oom ? srv_http_stream_write(c->req, b.data, b.len) : -1;
    kvs_buf_free(&b);
    if (rc != 0 && c->req) api_stream_client_gone(c); /* the client does not read or is gone */
}

/* {index: i} plus one member (taken) under name. */
static cJSON *indexed(int index, const char *name, cJSON *member) {
    cJSON *o = cJSON_CreateObject();
    if (!o) { cJSON_Delete(member); return NULL; }
    cJSON_AddNumberToObject(o, "index", index);
    if (name && member) cJSON_AddItemToObject(o, name, member);
    else cJSON_Delete(member);
    return o;
}

static cJSON *block2(const char *type, const char *k, const char *v) {
    cJSON *b = cJSON_CreateObject();
    if (b) {
        cJSON_AddStringToObject(b, "type", type);
        cJSON_AddStringToObject(b, k, v);
    }
    return b;
}

/* Closes the open block (a thinking block ends with its signature_delta: empty, nothing is signed here). */
static void close_block(msg_call *m) {
    if (m->open_kind == BLK_THINKING)
        msg_send(m, "content_block_delta", indexed(m->cur_idx, "delta", block2("signature_delta", "signature", "")));
    if (m->open_kind != BLK_NONE) msg_send(m, "content_block_stop", indexed(m->cur_idx, NULL, NULL));
    m->open_kind = BLK_NONE;
}

/* Makes a block of this kind the open one (closing another); a new block takes the next index. */
static void want_block(msg_call *m, int kind) {
    if (m->open_kind == kind) return;
    close_block(m);
    m->open_kind = kind;
    m->cur_idx = m->n_blocks++;
    cJSON *b = kind == BLK_TEXT ? block2("text", "text", "") : block2("thinking", "thinking", "");
    if (b && kind == BLK_THINKING) cJSON_AddStringToObject(b, "signature", "");
    if (kind == BLK_TEXT) m->text_seen = true;
    msg_send(m, "content_block_start", indexed(m->cur_idx, "content_block", b));
}

static void send_delta(msg_call *m, int kind, const char *text, size_t len) {
    want_block(m, kind);
    char *d = api_utf8_sanitize(text, len);
    msg_send(m, "content_block_delta", indexed(m->cur_idx, "delta", kind == BLK_TEXT ? block2("text_delta", "text", d ? d : "")
                                                                          : block2("thinking_delta", "thinking", d ? d : "")));
    free(d);
}

/* Streams the reasoning not sent yet as thinking_delta events. */
static void stream_thinking(msg_call *m) {
    api_choice *ch = &m->c.choices[0];
    if (ch->reasoning.len <= ch->r_sent) return;
    send_delta(m, BLK_THINKING, ch->reasoning.data + ch->r_sent, ch->reasoning.len - ch->r_sent);
    ch->r_sent = ch->reasoning.len;
}

static void stream_start(msg_call *m) {
    api_call *c = &m->c;
    cJSON *msg = srv_messages_map_message(c->id, c->api->model_id, NULL, NULL, NULL,
                                 srv_messages_map_usage(c->prep_ntok[0], 0, 0));
    cJSON *o = cJSON_CreateObject();
    if (o && msg) cJSON_AddItemToObject(o, "message", msg);
    else { cJSON_Delete(msg); cJSON_Delete(o); o = NULL; }
    msg_send(m, "message_start", o);
    msg_send(m, "ping", NULL);
}

/* Streams the new reasoning, then what of the text so far is surely message text (all of it without tools). */
static void stream_text(msg_call *m) {
    api_choice *ch = &m->c.choices[0];
    stream_thinking(m);
    size_t safe = ch->text.len;
    if (m->tools) safe = ch->held ? ch->sent : srv_tool_call_stream_safe(ch->text.data, ch->text.len, ch->sent, &ch->held);
    if (safe <= ch->sent) return;
    send_delta(m, BLK_TEXT, ch->text.data + ch->sent, safe - ch->sent);
    ch->sent = safe;
}

/* The end of a streamed message: the rest of the text, each tool_use block, message_delta, message_stop. */
static void stream_end(msg_call *m, const srv_messages_map_out *out, const char *stop_reason, const char *stop_seq) {
    api_call *c = &m->c;
    api_choice *ch = &c->choices[0];
    int k = 0;
    stream_thinking(m);
    if (out->has_text) {
        size_t tl = strlen(out->text);
        if (tl > ch->sent) send_delta(m, BLK_TEXT, out->text + ch->sent, tl - ch->sent);
        else if (!m->text_seen) want_block(m, BLK_TEXT);
        ch->sent = tl > ch->sent ? tl : ch->sent;
        k = 1;
    }
    close_block(m);
    int idx = m->n_blocks;
    for (int n = 0; n < out->n_calls && c->req; n++, k++, idx++) {
        const cJSON *b = cJSON_GetArrayItem(out->content, k);
        const char *id = cJSON_GetObjectItemCaseSensitive(b, "id")->valuestring;
        const char *name = cJSON_GetObjectItemCaseSensitive(b, "name")->valuestring;
        char *args = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(b, "input"));
        cJSON *start = cJSON_CreateObject();
        if (start) {
            cJSON_AddStringToObject(start, "type", "tool_use");
            cJSON_AddStringToObject(start, "id", id);
            cJSON_AddStringToObject(start, "name", name);
            cJSON_AddObjectToObject(start, "input");
        }
        msg_send(m, "content_block_start", indexed(idx, "content_block", start));
        msg_send(m, "content_block_delta", indexed(idx, "delta", block2("input_json_delta", "partial_json",
                                                                         args ? args : "{}")));
        msg_send(m, "content_block_stop", indexed(idx, NULL, NULL));
        free(args);
    }
    cJSON *o = cJSON_CreateObject(), *d = o ? cJSON_AddObjectToObject(o, "delta") : NULL;
    if (d) {
        cJSON_AddStringToObject(d, "stop_reason", stop_reason);
        if (stop_seq) cJSON_AddStringToObject(d, "stop_sequence", stop_seq);
        else cJSON_AddNullToObject(d, "stop_sequence");
        cJSON_AddNullToObject(d, "stop_details");
        cJSON *u = srv_messages_map_usage(c->usage.prompt_tokens, c->usage.cached_tokens, c->usage.completion_tokens);
        if (u) cJSON_AddItemToObject(o, "usage", u);
    }
    msg_send(m, "message_delta", o);
    msg_send(m, "message_stop", NULL);
}

static void stream_error(msg_call *m, const srv_api_error *e) {
    char *s = srv_api_error_json_anthropic(e);
    cJSON *err = s ? cJSON_Parse(s) : NULL;
    free(s);
    cJSON *inner = err ? cJSON_DetachItemFromObjectCaseSensitive(err, "error") : NULL;
    cJSON_Delete(err);
    cJSON *o = cJSON_CreateObject();
    if (o && inner) cJSON_AddItemToObject(o, "error", inner);
    else cJSON_Delete(inner);
    msg_send(m, "error", o);
}

static void msg_finish(msg_call *m) {
    api_call *c = &m->c;
    srv_api_error e;
    bool error = api_single_error(c, m->finish, &e);
    srv_messages_map_out out;
    memset(&out, 0, sizeof out);
    api_choice *ch = &c->choices[0];
    if (!error && srv_messages_map_output(ch->text.data, ch->text.len, m->tools, m->rq.parallel_tool_calls, m->seed,
                                 &out) != 0) {
        error = true;
        srv_api_set_nomem(&e);
    }
    const char *stop_seq = matched_stop(m);
    const char *reason = srv_messages_map_stop_reason(out.n_calls, m->finish == SRV_SCHED_FINISH_LENGTH, stop_seq != NULL);
    if (out.n_calls > 0) stop_seq = NULL;
    cJSON *body = NULL;
    if (c->req && c->stream) {
        if (error) stream_error(m, &e);
        else stream_end(m, &out, reason, stop_seq);
    } else if (c->req && !error) {
        if (ch->reasoning.len > 0 && out.content) { /* the thinking block first (its signature empty: unsigned) */
            cJSON *t = block2("thinking", "thinking", ch->reasoning.data);
            if (t && cJSON_AddStringToObject(t, "signature", "")) cJSON_InsertItemInArray(out.content, 0, t);
            else cJSON_Delete(t);
        }
        cJSON *u = srv_messages_map_usage(c->usage.prompt_tokens, c->usage.cached_tokens, c->usage.completion_tokens);
        body = srv_messages_map_message(c->id, c->api->model_id, out.content, reason, stop_seq, u);
        out.content = NULL;
    }
    api_single_end(c, m->finish, error ? &e : NULL, body);
    srv_messages_map_out_free(&out);
    msg_free(m);
}

static void msg_event(const srv_sched_event *ev, void *user) {
    api_sub *sub = user;
    msg_call *m = (msg_call *)sub->call;
    int r = api_single_event(&m->c, sub, ev);
    if (r == API_SINGLE_DONE) { msg_finish(m); return; }
    if (r == API_SINGLE_TEXT) stream_text(m);
    if (ev->type == SRV_SCHED_EV_CHOICE_END) {
        m->finish = ev->finish;
        m->stop_match = ev->stop_match;
    }
}

/* Loop thread, count_tokens: the answer. */
static void count_done(msg_call *m) {
    api_call *c = &m->c;
    srv_http_req *req = c->req;
    srv_http_set_abort(req, NULL, NULL);
    c->req = NULL;
    if (c->prep_failed) {
        api_reply_error(c->api, req, &c->prep_error, NULL);
    } else {
        cJSON *o = cJSON_CreateObject();
        if (o && !cJSON_AddNumberToObject(o, "input_tokens", m->n_input)) { cJSON_Delete(o); o = NULL; }
        api_reply_json(c->api, req, 200, o, NULL, -1);
        cJSON_Delete(o);
    }
    msg_free(m);
}

/* Loop thread: queue the prepared prompt, begin the stream. */
static void msg_done(api_job *j) {
    msg_call *m = (msg_call *)j;
    api_call *c = &m->c;
    srv_api *api = c->api;
    srv_http_req *req = c->req;
    if (!req || api->closing) { msg_free(m); return; }
    if (m->count) { count_done(m); return; }
    if (api_single_start(c, msg_event, m->rq.stream, NULL)) stream_start(m);
}

void api_route_messages(srv_api *api, srv_http_req *req, bool count_tokens) {
    msg_call *m = calloc(1, sizeof *m);
    if (!m) { api_reply_json(api, req, 500, NULL, NULL, -1); return; }
    api_call *c = &m->c;
    c->ext_free = msg_ext_free;
    m->count = count_tokens;
    api_call_register(api, c, req, count_tokens ? "/v1/messages/count_tokens" : "/v1/messages");
    api_make_id(api, "msg_", c->id, sizeof c->id);
    m->seed = c->id + 4;
    c->job.work = msg_work;
    c->job.done = msg_done;
    api_offload(api, &c->job);
}
