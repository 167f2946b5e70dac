/* api_render.c: what a generation streams and answers: SSE chunks and their envelope, logprobs, usage (see
 * api_gen_internal.h; the replies themselves are api_base.c's). */
#include "server/api/api_gen_internal.h"

#include <stdlib.h>
#include <string.h>

void api_count_reasoning(api_call *c, const srv_reasoning *p, bool was_inside, bool r_grew, bool c_grew, int32_t n) {
    if (n > 0 && !c_grew && (was_inside || r_grew || srv_reasoning_inside(p))) c->reasoning_tokens += n;
}

/* The usage object of a final body or of the stream's last chunk; reasoning_tokens >= 0 adds OpenAI's
 * completion_tokens_details.reasoning_tokens (chat). */
cJSON *api_usage_json(const srv_sched_usage *u, int32_t reasoning_tokens) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(o, "total_tokens", (double)u->prompt_tokens + u->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(o, "prompt_tokens_details");
    if (d) cJSON_AddNumberToObject(d, "cached_tokens", u->cached_tokens);
    cJSON *ct = reasoning_tokens >= 0 ? cJSON_AddObjectToObject(o, "completion_tokens_details") : NULL;
    if (ct) cJSON_AddNumberToObject(ct, "reasoning_tokens", reasoning_tokens);
    return o;
}

cJSON *api_chunk_base(api_call *c) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", c->gen.kind == SRV_API_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddStringToObject(o, "model", c->api->model_id);
    return o;
}

/* Writes `data: <json>\n\n` (or the literal [DONE]); on a stalled or closed client, drops the stream and
 * cancels the generation. Consumes obj. */
void api_sse_send(api_call *c, cJSON *obj, const char *literal) {
    if (!c->req) { cJSON_Delete(obj); return; }
    char *s = literal ? NULL : (obj ? cJSON_PrintUnformatted(obj) : NULL);
    cJSON_Delete(obj);
    const char *payload = literal ? literal : s;
    if (!payload) return;
    size_t pl = strlen(payload);
    char *msg = malloc(pl + 9);
    if (!msg) { free(s); return; }
    memcpy(msg, "data: ", 6);
    memcpy(msg + 6, payload, pl);
    memcpy(msg + 6 + pl, "\n\n", 3);
    free(s);
    int r = srv_http_stream_write(c->req, msg, pl + 8);
    free(msg);
    if (r != 0 && !c->req) return; /* the write found the connection gone: on_abort already cleaned up */
    if (r != 0) api_stream_client_gone(c);
}

int api_stream_begin(api_call *c, srv_http_req *req) {
    if (srv_http_stream_begin(req, 200, "text/event-stream", "Cache-Control: no-cache\r\n") == 0) return 0;
    c->req = NULL;
    srv_http_abort(req);
    api_cancel_subs(c);
    return -1;
}

static cJSON *bytes_array(const char *p, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)p[i]));
    return a;
}

/* Appends the logprobs of samples to lp (the choice's accumulator or a chunk's logprobs object). */
void api_add_logprobs(api_call *c, api_choice *ch, cJSON *lp, const eng_sample *smp, int32_t n) {
    srv_api *api = c->api;
    char buf[256];
    if (c->gen.kind == SRV_API_CHAT) {
        cJSON *content = cJSON_GetObjectItemCaseSensitive(lp, "content");
        for (int32_t i = 0; content && i < n; i++) {
            int l = api_piece(api, smp[i].token, buf, sizeof buf);
            if (l < 0) l = 0;
            char *s = api_utf8_sanitize(buf, (size_t)l);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "token", s ? s : "");
            cJSON_AddNumberToObject(e, "logprob", smp[i].logprob);
            cJSON_AddItemToObject(e, "bytes", bytes_array(buf, l));
            free(s);
            cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
            int32_t nt = smp[i].n_top < c->gen.top_logprobs ? smp[i].n_top : c->gen.top_logprobs;
            for (int32_t k = 0; tops && k < nt; k++) {
                int tl = api_piece(api, smp[i].top_token[k], buf, sizeof buf);
                if (tl < 0) tl = 0;
                char *ts = api_utf8_sanitize(buf, (size_t)tl);
                cJSON *t = cJSON_CreateObject();
                cJSON_AddStringToObject(t, "token", ts ? ts : "");
                cJSON_AddNumberToObject(t, "logprob", smp[i].top_logprob[k]);
                cJSON_AddItemToObject(t, "bytes", bytes_array(buf, tl));
                free(ts);
                cJSON_AddItemToArray(tops, t);
            }
            cJSON_AddItemToArray(content, e);
        }
        return;
    }
    cJSON *tokens = cJSON_GetObjectItemCaseSensitive(lp, "tokens");
    cJSON *tlp = cJSON_GetObjectItemCaseSensitive(lp, "token_logprobs");
    cJSON *tops = cJSON_GetObjectItemCaseSensitive(lp, "top_logprobs");
    cJSON *offs = cJSON_GetObjectItemCaseSensitive(lp, "text_offset");
    if (!tokens || !tlp || !tops || !offs) return;
    for (int32_t i = 0; i < n; i++) {
        int l = api_piece(api, smp[i].token, buf, sizeof buf);
        if (l < 0) l = 0;
        char *s = api_utf8_sanitize(buf, (size_t)l);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(s ? s : ""));
        free(s);
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(smp[i].logprob));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)ch->lp_offset));
        ch->lp_offset += (size_t)l;
        cJSON *m = cJSON_CreateObject();
        int32_t nt = smp[i].n_top < c->gen.top_logprobs ? smp[i].n_top : c->gen.top_logprobs;
        for (int32_t k = 0; m && k < nt; k++) {
            int tl = api_piece(api, smp[i].top_token[k], buf, sizeof buf);
            if (tl < 0) tl = 0;
            char *ts = api_utf8_sanitize(buf, (size_t)tl);
            if (ts && !cJSON_GetObjectItemCaseSensitive(m, ts))
                cJSON_AddNumberToObject(m, ts, smp[i].top_logprob[k]);
            free(ts);
        }
        cJSON_AddItemToArray(tops, m ? m : cJSON_CreateNull());
    }
}

cJSON *api_new_logprobs(api_call *c) {
    cJSON *lp = cJSON_CreateObject();
    if (!lp) return NULL;
    if (c->gen.kind == SRV_API_CHAT) {
        cJSON_AddArrayToObject(lp, "content");
        cJSON_AddNullToObject(lp, "refusal");
    } else {
        cJSON_AddArrayToObject(lp, "tokens");
        cJSON_AddArrayToObject(lp, "token_logprobs");
        cJSON_AddArrayToObject(lp, "top_logprobs");
        cJSON_AddArrayToObject(lp, "text_offset");
    }
    return lp;
}

static void chunk(api_call *c, int32_t idx, const char *field, const char *text, size_t len, const eng_sample *smp,
                  int32_t n_smp, srv_sched_finish finish, bool role);

void api_stream_chunk(api_call *c, int32_t idx, const char *text, size_t len, const eng_sample *smp,
                         int32_t n_smp, srv_sched_finish finish, bool role) {
    chunk(c, idx, "content", text, len, smp, n_smp, finish, role);
}

void api_stream_reasoning(api_call *c, int32_t idx, const char *text, size_t len, const eng_sample *smp,
                          int32_t n_smp) {
    chunk(c, idx, "reasoning_content", text, len, smp, n_smp, SRV_SCHED_FINISH_NONE, false);
}

/* One streamed chunk for choice idx: text (may be NULL) as delta.<field>, logprob samples, finish reason (NONE:
 * null). */
static void chunk(api_call *c, int32_t idx, const char *field, const char *text, size_t len, const eng_sample *smp,
                  int32_t n_smp, srv_sched_finish finish, bool role) {
    cJSON *o = api_chunk_base(c);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", idx);
    char *s = text ? api_utf8_sanitize(text, len) : NULL;
    if (c->gen.kind == SRV_API_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (role) { cJSON_AddStringToObject(d, "role", "assistant"); cJSON_AddStringToObject(d, "content", ""); }
        if (s) cJSON_AddStringToObject(d, field, s);
    } else {
        cJSON_AddStringToObject(ch, "text", s ? s : "");
    }
    free(s);
    if (c->gen.logprobs && n_smp > 0) {
        cJSON *lp = api_new_logprobs(c);
        api_add_logprobs(c, &c->choices[idx], lp, smp, n_smp);
        cJSON_AddItemToObject(ch, "logprobs", lp);
    } else {
        cJSON_AddNullToObject(ch, "logprobs");
    }
    const char *fn = finish != SRV_SCHED_FINISH_NONE ? srv_sched_finish_name(finish) : NULL;
    if (fn && c->choices[idx].tool_calls) fn = "tool_calls";
    if (fn) cJSON_AddStringToObject(ch, "finish_reason", fn); else cJSON_AddNullToObject(ch, "finish_reason");
    if (fn && c->choices[idx].truncated) cJSON_AddTrueToObject(ch, "truncated");
    if (c->gen.include_usage) cJSON_AddNullToObject(o, "usage");
    api_sse_send(c, o, NULL);
}

