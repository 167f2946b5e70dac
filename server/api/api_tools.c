/* api_tools.c: tool calls in chat responses: message.tool_calls, and streamed delta.tool_calls fragments
 * (text is held back once it may be a tool call; see server/api/tool_call_internal.h). Loop thread. */
#include "server/api/api_gen_internal.h"

#include "server/api/chat_internal.h"
#include "server/api/tool_call_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool api_tools_active(const api_call *c) {
    return c->gen.kind == SRV_API_CHAT && c->gen.chat && c->gen.chat->tools &&
           c->gen.chat->tool_choice != SRV_CHAT_TOOL_CHOICE_NONE;
}

static void call_id(const api_call *c, int32_t idx, int k, char *out, size_t cap) {
    const char *dash = strchr(c->id, '-');
    snprintf(out, cap, "call_%s_%d_%d", dash ? dash + 1 : c->id, (int)idx, k);
}

static cJSON *calls_json(const api_call *c, int32_t idx, const srv_tool_call_result *r) {
    cJSON *arr = cJSON_CreateArray();
    for (int k = 0; arr && k < r->n_calls; k++) {
        char id[96];
        call_id(c, idx, k, id, sizeof id);
        cJSON *o = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        if (!o || !fn) { cJSON_Delete(o); cJSON_Delete(fn); break; }
        cJSON_AddItemToArray(arr, o);
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "type", "function");
        cJSON_AddItemToObject(o, "function", fn);
        cJSON_AddStringToObject(fn, "name", r->calls[k].name);
        cJSON_AddStringToObject(fn, "arguments", r->calls[k].arguments);
    }
    return arr;
}

/* Keeps only the first call when parallel_tool_calls is false. */
static void limit_calls(const api_call *c, srv_tool_call_result *r) {
    while (!c->gen.chat->parallel_tool_calls && r->n_calls > 1) {
        r->n_calls--;
        free(r->calls[r->n_calls].name);
        free(r->calls[r->n_calls].arguments);
    }
}

void api_tools_message(api_call *c, int32_t idx, cJSON *message, api_choice *ch) {
    srv_tool_call_result r;
    if (srv_tool_call_parse(ch->text.data, ch->text.len, &r) != 0 || r.n_calls == 0) return;
    limit_calls(c, &r);
    char *s = api_utf8_sanitize(ch->text.data ? ch->text.data : "", r.content_len);
    cJSON *content = s && s[0] ? cJSON_CreateString(s) : cJSON_CreateNull();
    free(s);
    cJSON *calls = calls_json(c, idx, &r);
    if (content && calls) {
        cJSON_ReplaceItemInObjectCaseSensitive(message, "content", content);
        cJSON_AddItemToObject(message, "tool_calls", calls);
        ch->tool_calls = true;
    } else {
        cJSON_Delete(content);
        cJSON_Delete(calls);
    }
    srv_tool_call_result_free(&r);
}

void api_tools_stream_delta(api_call *c, int32_t idx, const char *text, size_t len, const eng_sample *smp,
                            int32_t n_smp) {
    api_choice *ch = &c->choices[idx];
    if (len > 0 && kvs_buf_append(&ch->text, text, len)) return;
    size_t safe = ch->held ? ch->sent : srv_tool_call_stream_safe(ch->text.data, ch->text.len, ch->sent, &ch->held);
    if (safe > ch->sent) {
        api_stream_chunk(c, idx, ch->text.data + ch->sent, safe - ch->sent, smp, n_smp, SRV_SCHED_FINISH_NONE, false);
        ch->sent = safe;
    } else if (c->gen.logprobs && n_smp > 0) {
        api_stream_chunk(c, idx, NULL, 0, smp, n_smp, SRV_SCHED_FINISH_NONE, false);
    }
}

/* One chunk whose delta holds tool_calls[0] = call k: its header (id, type, name, empty arguments) or its
 * arguments. */
static void send_call_chunk(api_call *c, int32_t idx, int k, const srv_tool_call *call, bool header) {
    cJSON *o = api_chunk_base(c);
    if (!o) return;
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", idx);
    cJSON *d = cJSON_AddObjectToObject(ch, "delta");
    cJSON *arr = cJSON_AddArrayToObject(d, "tool_calls");
    cJSON *tc = cJSON_CreateObject();
    cJSON_AddItemToArray(arr, tc);
    cJSON_AddNumberToObject(tc, "index", k);
    cJSON *fn = cJSON_CreateObject();
    if (header) {
        char id[96];
        call_id(c, idx, k, id, sizeof id);
        cJSON_AddStringToObject(tc, "id", id);
        cJSON_AddStringToObject(tc, "type", "function");
        cJSON_AddItemToObject(tc, "function", fn);
        cJSON_AddStringToObject(fn, "name", call->name);
        cJSON_AddStringToObject(fn, "arguments", "");
    } else {
        cJSON_AddItemToObject(tc, "function", fn);
        cJSON_AddStringToObject(fn, "arguments", call->arguments);
    }
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    if (c->gen.include_usage) cJSON_AddNullToObject(o, "usage");
    api_sse_send(c, o, NULL);
}

void api_tools_stream_end(api_call *c, int32_t idx, const char *text, size_t len, srv_sched_finish finish) {
    api_choice *ch = &c->choices[idx];
    if (len > 0) kvs_buf_append(&ch->text, text, len);
    srv_tool_call_result r;
    if (srv_tool_call_parse(ch->text.data, ch->text.len, &r) != 0) memset(&r, 0, sizeof r);
    limit_calls(c, &r);
    size_t end = r.n_calls > 0 ? r.content_len : ch->text.len;
    if (end > ch->sent && c->req)
        api_stream_chunk(c, idx, ch->text.data + ch->sent, end - ch->sent, NULL, 0, SRV_SCHED_FINISH_NONE, false);
    ch->sent = end > ch->sent ? end : ch->sent;
    for (int k = 0; k < r.n_calls && c->req; k++) {
        send_call_chunk(c, idx, k, &r.calls[k], true);
        send_call_chunk(c, idx, k, &r.calls[k], false);
    }
    ch->tool_calls = r.n_calls > 0;
    srv_tool_call_result_free(&r);
    if (c->req) api_stream_chunk(c, idx, NULL, 0, NULL, 0, finish, false);
}
