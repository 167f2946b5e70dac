/* api_responses.c: POST /v1/responses (and /responses) for text, mapped onto the chat pipeline: the input items
 * (and instructions, and the stored conversation of previous_response_id) become chat messages, rendered with
 * the chat template, tokenized, submitted to the scheduler as one request; its events become a Response
 * object, or the typed server-sent events of a streamed one. Finished responses are kept in memory (at most
 * RESP_STORE_MAX, least recently used dropped) so that previous_response_id can continue them; the continued
 * conversation renders to the same prefix, which the prefix cache then reuses. */
#include "server/api_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { RESP_STORE_MAX = 256 };

/* ---- the store of finished conversations ------------------------------------------------------------------- */
typedef struct resp_entry {
    char id[48];
    srv_api_msg *msgs;   /* the whole conversation, the response's own output last (no instructions) */
    int32_t n_msgs;
    uint64_t used;       /* LRU clock */
} resp_entry;

struct api_resp_store {
    uv_mutex_t mu;
    resp_entry e[RESP_STORE_MAX];
    uint64_t clock;
};

static void msgs_free(srv_api_msg *m, int32_t n) {
    for (int32_t i = 0; m && i < n; i++) { free(m[i].role); free(m[i].content); }
    free(m);
}

api_resp_store *api_resp_store_create(void) {
    api_resp_store *s = calloc(1, sizeof *s);
    if (s && uv_mutex_init(&s->mu) != 0) { free(s); return NULL; }
    return s;
}

void api_resp_store_free(api_resp_store *s) {
    if (!s) return;
    for (int i = 0; i < RESP_STORE_MAX; i++) msgs_free(s->e[i].msgs, s->e[i].n_msgs);
    uv_mutex_destroy(&s->mu);
    free(s);
}

/* Appends copies of the stored conversation `id` to *msgs; -1 when unknown, -2 out of memory. Any thread. */
static int store_get(api_resp_store *s, const char *id, srv_api_msg **msgs, int32_t *n) {
    int rc = -1;
    uv_mutex_lock(&s->mu);
    for (int i = 0; i < RESP_STORE_MAX; i++) {
        resp_entry *e = &s->e[i];
        if (!e->msgs || strcmp(e->id, id)) continue;
        e->used = ++s->clock;
        srv_api_msg *m = realloc(*msgs, (size_t)(*n + e->n_msgs) * sizeof *m);
        rc = -2;
        if (!m) break;
        *msgs = m;
        for (int32_t k = 0; k < e->n_msgs; k++) {
            m[*n].role = strdup(e->msgs[k].role);
            m[*n].content = strdup(e->msgs[k].content);
            (*n)++;
            if (!m[*n - 1].role || !m[*n - 1].content) goto out;
        }
        rc = 0;
        break;
    }
out:
    uv_mutex_unlock(&s->mu);
    return rc;
}

/* Takes ownership of msgs. */
static void store_put(api_resp_store *s, const char *id, srv_api_msg *msgs, int32_t n) {
    uv_mutex_lock(&s->mu);
    resp_entry *victim = &s->e[0];
    for (int i = 0; i < RESP_STORE_MAX; i++) {
        if (!s->e[i].msgs) { victim = &s->e[i]; break; }
        if (s->e[i].used < victim->used) victim = &s->e[i];
    }
    msgs_free(victim->msgs, victim->n_msgs);
    snprintf(victim->id, sizeof victim->id, "%s", id);
    victim->msgs = msgs;
    victim->n_msgs = n;
    victim->used = ++s->clock;
    uv_mutex_unlock(&s->mu);
}

/* ---- a call ------------------------------------------------------------------------------------------------- */
typedef struct resp_call {
    api_call c;              /* first: api_call_free frees the whole struct */
    char *instructions, *prev_id;
    float temperature, top_p;
    int32_t max_output;      /* -1: until the context ends */
    bool store;
    srv_api_msg *conv;       /* the conversation without instructions (stored when done) */
    int32_t n_conv;
    char msg_id[48];
    int64_t seq_no;          /* sequence_number of the next streamed event */
    srv_sched_finish finish;
} resp_call;

static void resp_ext_free(api_call *c) {
    resp_call *r = (resp_call *)c;
    free(r->instructions);
    free(r->prev_id);
    msgs_free(r->conv, r->n_conv);
    r->instructions = r->prev_id = NULL;
    r->conv = NULL;
    r->n_conv = 0;
}

static void resp_free(resp_call *r) { api_call_free(&r->c); }

#define RBAD(param, ...) srv_api_set_error(e, 400, NULL, param, NULL, __VA_ARGS__)

static int add_msg(resp_call *r, const char *role, const char *content) {
    srv_api_msg *m = realloc(r->conv, (size_t)(r->n_conv + 1) * sizeof *m);
    if (!m) return -2;
    r->conv = m;
    m[r->n_conv].role = strdup(role);
    m[r->n_conv].content = strdup(content);
    r->n_conv++;
    return m[r->n_conv - 1].role && m[r->n_conv - 1].content ? 0 : -2;
}

/* One input item's text: a string, or content parts of type input_text / output_text / text. */
static int item_text(const cJSON *content, int32_t idx, kvs_buf *out, srv_api_error *e) {
    if (cJSON_IsString(content)) return kvs_buf_append(out, content->valuestring, strlen(content->valuestring)) ? -2 : 0;
    if (!cJSON_IsArray(content)) {
        RBAD("input", "'input[%d].content' must be a string or an array of content parts", (int)idx);
        return -1;
    }
    for (const cJSON *p = content->child; p; p = p->next) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type"), *tx = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(ty) || (strcmp(ty->valuestring, "input_text") && strcmp(ty->valuestring, "output_text") &&
                                    strcmp(ty->valuestring, "text"))) {
            RBAD("input", "'input[%d].content': only text parts (input_text, output_text) are supported", (int)idx);
            return -1;
        }
        if (!cJSON_IsString(tx)) {
            RBAD("input", "'input[%d].content[].text' must be a string", (int)idx);
            return -1;
        }
        if (kvs_buf_append(out, tx->valuestring, strlen(tx->valuestring))) return -2;
    }
    return 0;
}

static int get_number(const cJSON *root, const char *name, double lo, double hi, double *out, srv_api_error *e) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, name);
    if (!f || cJSON_IsNull(f)) return 0;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble) || f->valuedouble < lo || f->valuedouble > hi) {
        RBAD(name, "'%s' must be a number between %g and %g", name, lo, hi);
        return -1;
    }
    *out = f->valuedouble;
    return 1;
}

/* Pool thread: the body into r's fields and the conversation. */
static int resp_parse(resp_call *r, srv_api_error *e) {
    srv_api *api = r->c.api;
    cJSON *root = api_parse_body_object(r->c.req, e);
    if (!root) return -1;
    int rc = -1;
    double d = 0;
    const cJSON *f;
    r->temperature = 1.0f;
    r->top_p = 1.0f;
    r->max_output = -1;
    r->store = true;
    if (get_number(root, "temperature", 0, 2, &d, e) < 0) goto out;
    if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(root, "temperature"))) r->temperature = (float)d;
    if (get_number(root, "top_p", 0, 1, &d, e) < 0) goto out;
    if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(root, "top_p"))) r->top_p = (float)d;
    int gr = get_number(root, "max_output_tokens", 1, INT32_MAX, &d, e);
    if (gr < 0) goto out;
    if (gr > 0) {
        if (d != floor(d)) { RBAD("max_output_tokens", "'max_output_tokens' must be an integer"); goto out; }
        r->max_output = (int32_t)d;
    }
    if (api_parse_priority(root, &api->limits, &r->c.priority, e) < 0) goto out;
    if ((f = cJSON_GetObjectItemCaseSensitive(root, "stream")) && !cJSON_IsNull(f)) {
        if (!cJSON_IsBool(f)) { RBAD("stream", "'stream' must be a boolean"); goto out; }
        r->c.stream = cJSON_IsTrue(f);
    }
    if ((f = cJSON_GetObjectItemCaseSensitive(root, "store")) && !cJSON_IsNull(f)) {
        if (!cJSON_IsBool(f)) { RBAD("store", "'store' must be a boolean"); goto out; }
        r->store = cJSON_IsTrue(f);
    }
    if ((f = cJSON_GetObjectItemCaseSensitive(root, "tools")) && cJSON_GetArraySize(f) > 0) {
        RBAD("tools", "'tools' (function calling) is not supported by /v1/responses yet");
        goto out;
    }
    if ((f = cJSON_GetObjectItemCaseSensitive(root, "instructions")) && !cJSON_IsNull(f)) {
        if (!cJSON_IsString(f)) { RBAD("instructions", "'instructions' must be a string"); goto out; }
        if (!(r->instructions = strdup(f->valuestring))) { rc = -2; goto out; }
    }
    if ((f = cJSON_GetObjectItemCaseSensitive(root, "previous_response_id")) && !cJSON_IsNull(f)) {
        if (!cJSON_IsString(f)) { RBAD("previous_response_id", "'previous_response_id' must be a string"); goto out; }
        if (!(r->prev_id = strdup(f->valuestring))) { rc = -2; goto out; }
        int sr = store_get(api->resp_store, f->valuestring, &r->conv, &r->n_conv);
        if (sr == -2) { rc = -2; goto out; }
        if (sr < 0) {
            srv_api_set_error(e, 404, NULL, "previous_response_id", "not_found", "Previous response with id '%s' "
                              "not found (responses are kept in memory, the last %d)", f->valuestring, RESP_STORE_MAX);
            goto out;
        }
    }
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(root, "input");
    if (cJSON_IsString(in)) {
        if ((rc = add_msg(r, "user", in->valuestring)) != 0) goto out;
        rc = -1;
    } else if (cJSON_IsArray(in) && cJSON_GetArraySize(in) > 0) {
        int32_t i = 0;
        for (const cJSON *it = in->child; it; it = it->next, i++) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
            if (!cJSON_IsObject(it) || (ty && !cJSON_IsNull(ty) && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "message")))) {
                RBAD("input", "'input[%d]': only message items are supported", (int)i);
                goto out;
            }
            const char *ro = cJSON_IsString(role) ? role->valuestring : "";
            if (!strcmp(ro, "developer")) ro = "system";
            if (strcmp(ro, "user") && strcmp(ro, "assistant") && strcmp(ro, "system")) {
                RBAD("input", "'input[%d].role' must be user, assistant, system or developer", (int)i);
                goto out;
            }
            kvs_buf t = {0};
            int tr = item_text(cJSON_GetObjectItemCaseSensitive(it, "content"), i, &t, e);
            if (tr == 0 && kvs_buf_append(&t, "", 1)) tr = -2;
            if (tr == 0) tr = add_msg(r, ro, t.data);
            kvs_buf_free(&t);
            if (tr != 0) { rc = tr; goto out; }
        }
    } else {
        RBAD("input", "'input' is required: a string or a non-empty array of message items");
        goto out;
    }
    rc = 0;
out:
    if (rc == -2) srv_api_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
    cJSON_Delete(root);
    return rc;
}

static void resp_work(api_job *j) {
    resp_call *r = (resp_call *)j;
    api_call *c = &r->c;
    srv_api *api = c->api;
    srv_api_error *e = &c->prep_error;
    c->prep_failed = true;
    if (resp_parse(r, e) != 0) return;
    int32_t n = r->n_conv + (r->instructions ? 1 : 0), k = 0;
    eng_chat_msg *m = calloc((size_t)n, sizeof *m);
    if (!m) { srv_api_set_error(e, 500, "server_error", NULL, NULL, "out of memory"); return; }
    if (r->instructions) { m[k].role = "system"; m[k++].content = r->instructions; }
    for (int32_t i = 0; i < r->n_conv; i++, k++) { m[k].role = r->conv[i].role; m[k].content = r->conv[i].content; }
    char *text = NULL;
    int rr = api->be.chat_render(api->be.ctx, m, (size_t)n, &text);
    free(m);
    if (rr != 0) {
        srv_api_set_error(e, 400, NULL, "input", NULL, "the input could not be rendered with the chat template: %s",
                          kvs_strerror(rr));
        return;
    }
    c->n_subs = 1;
    c->subs = calloc(1, sizeof *c->subs);
    c->prep_toks = calloc(1, sizeof *c->prep_toks);
    c->prep_ntok = calloc(1, sizeof *c->prep_ntok);
    if (!c->subs || !c->prep_toks || !c->prep_ntok ||
        api_tokenize(api, text, strlen(text), true, true, &c->prep_toks[0], &c->prep_ntok[0]) != 0) {
        free(text);
        srv_api_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
        return;
    }
    free(text);
    c->subs[0].call = c;
    int32_t nt = c->prep_ntok[0];
    if (nt < 1) { srv_api_set_error(e, 400, NULL, "input", NULL, "the input is empty (0 tokens)"); return; }
    if (api_ctx_exceeded(api, nt, r->max_output)) {
        srv_api_set_error(e, 400, NULL, "input", "context_length_exceeded", "This model's maximum context length "
                          "is %d tokens, but the input has %d tokens%s", (int)api->n_ctx, (int)nt,
                          r->max_output > 0 && nt < api->n_ctx ? " plus max_output_tokens" : "");
        return;
    }
    c->prep_failed = false;
}

/* ---- output ------------------------------------------------------------------------------------------------- */
static cJSON *text_part(const char *text) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "output_text");
    cJSON_AddStringToObject(p, "text", text);
    cJSON_AddArrayToObject(p, "annotations");
    return p;
}

static cJSON *message_item(resp_call *r, const char *status, const char *text) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "id", r->msg_id);
    cJSON_AddStringToObject(m, "status", status);
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON *content = cJSON_AddArrayToObject(m, "content");
    if (text && content) cJSON_AddItemToArray(content, text_part(text));
    return m;
}

/* The Response object; status "in_progress", "completed", "incomplete" or "failed". text: the output (NULL:
 * no output item yet). */
static cJSON *response_obj(resp_call *r, const char *status, const char *text, const srv_api_error *err) {
    api_call *c = &r->c;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)c->created);
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddStringToObject(o, "model", c->api->model_id);
    if (err) {
        cJSON *eo = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(eo, "code", err->code ? err->code : "server_error");
        cJSON_AddStringToObject(eo, "message", err->message);
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    if (!strcmp(status, "incomplete")) {
        cJSON *d = cJSON_AddObjectToObject(o, "incomplete_details");
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
    } else {
        cJSON_AddNullToObject(o, "incomplete_details");
    }
    if (r->instructions) cJSON_AddStringToObject(o, "instructions", r->instructions);
    else cJSON_AddNullToObject(o, "instructions");
    if (r->max_output > 0) cJSON_AddNumberToObject(o, "max_output_tokens", r->max_output);
    else cJSON_AddNullToObject(o, "max_output_tokens");
    cJSON *out = cJSON_AddArrayToObject(o, "output");
    if (text && out) cJSON_AddItemToArray(out, message_item(r, "completed", text));
    cJSON_AddBoolToObject(o, "parallel_tool_calls", false);
    if (r->prev_id) cJSON_AddStringToObject(o, "previous_response_id", r->prev_id);
    else cJSON_AddNullToObject(o, "previous_response_id");
    cJSON_AddBoolToObject(o, "store", r->store);
    cJSON_AddNumberToObject(o, "temperature", r->temperature);
    cJSON_AddNumberToObject(o, "top_p", r->top_p);
    cJSON *tf = cJSON_AddObjectToObject(o, "text"), *fmt = tf ? cJSON_AddObjectToObject(tf, "format") : NULL;
    if (fmt) cJSON_AddStringToObject(fmt, "type", "text");
    cJSON_AddStringToObject(o, "tool_choice", "auto");
    cJSON_AddArrayToObject(o, "tools");
    cJSON_AddStringToObject(o, "truncation", "disabled");
    cJSON_AddObjectToObject(o, "metadata");
    if (strcmp(status, "in_progress")) {
        cJSON *u = cJSON_AddObjectToObject(o, "usage");
        int32_t in = c->usage.prompt_tokens, outn = c->usage.completion_tokens;
        cJSON_AddNumberToObject(u, "input_tokens", in);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens", c->usage.cached_tokens);
        cJSON_AddNumberToObject(u, "output_tokens", outn);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens", 0);
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
    if (rc != 0 && c->req) { /* the client does not read or is gone: stop generating for it */
        srv_http_req *req = c->req;
        c->req = NULL;
        if (c->api->metrics) c->api->metrics->requests_finished_abort++;
        api_log_request(c->api, c->method, c->path, 499, &c->usage, -1, api_ms_since(c->t_arrival));
        srv_http_abort(req);
        api_cancel_subs(c);
    }
}

static cJSON *item_event(resp_call *r, bool with_content_index) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "item_id", r->msg_id);
    cJSON_AddNumberToObject(o, "output_index", 0);
    if (with_content_index) cJSON_AddNumberToObject(o, "content_index", 0);
    return o;
}

static void stream_start(resp_call *r) {
    cJSON *o = cJSON_CreateObject();
    if (o) cJSON_AddItemToObject(o, "response", response_obj(r, "in_progress", NULL, NULL));
    resp_send(r, "response.created", o);
    o = cJSON_CreateObject();
    if (o) cJSON_AddItemToObject(o, "response", response_obj(r, "in_progress", NULL, NULL));
    resp_send(r, "response.in_progress", o);
    o = cJSON_CreateObject();
    if (o) {
        cJSON_AddNumberToObject(o, "output_index", 0);
        cJSON_AddItemToObject(o, "item", message_item(r, "in_progress", NULL));
    }
    resp_send(r, "response.output_item.added", o);
    o = item_event(r, true);
    if (o) cJSON_AddItemToObject(o, "part", text_part(""));
    resp_send(r, "response.content_part.added", o);
}

static void resp_finish(resp_call *r) {
    api_call *c = &r->c;
    srv_api *api = c->api;
    bool error = c->has_error;
    srv_api_error e = c->error;
    if (!error && r->finish == SRV_SCHED_FINISH_CANCELLED) {
        error = true;
        srv_api_set_error(&e, c->shutdown ? 503 : 500, "server_error", NULL, NULL, "%s",
                          c->shutdown ? "the server is shutting down" : "the request was cancelled");
    }
    kvs_buf_append(&c->choices[0].text, "", 1);
    char *text = api_utf8_sanitize(c->choices[0].text.data ? c->choices[0].text.data : "",
                                   c->choices[0].text.len ? c->choices[0].text.len - 1 : 0);
    const char *status = r->finish == SRV_SCHED_FINISH_LENGTH ? "incomplete" : "completed";
    if (!error && text && r->store && add_msg(r, "assistant", text) == 0) {
        store_put(api->resp_store, c->id, r->conv, r->n_conv);
        r->conv = NULL;
        r->n_conv = 0;
    }
    if (api->metrics) {
        if (error) api->metrics->requests_finished_error++;
        else if (r->finish == SRV_SCHED_FINISH_LENGTH) api->metrics->requests_finished_length++;
        else api->metrics->requests_finished_stop++;
    }
    double ttft = c->t_first_token ? (double)(c->t_first_token - c->t_arrival) / 1e6 : -1;
    if (c->req && c->stream) {
        if (error) {
            cJSON *o = cJSON_CreateObject();
            if (o) {
                if (e.code) cJSON_AddStringToObject(o, "code", e.code); else cJSON_AddNullToObject(o, "code");
                cJSON_AddStringToObject(o, "message", e.message);
                if (e.param[0]) cJSON_AddStringToObject(o, "param", e.param); else cJSON_AddNullToObject(o, "param");
            }
            resp_send(r, "error", o);
        } else {
            cJSON *o = item_event(r, true);
            if (o) cJSON_AddStringToObject(o, "text", text ? text : "");
            resp_send(r, "response.output_text.done", o);
            o = item_event(r, true);
            if (o) cJSON_AddItemToObject(o, "part", text_part(text ? text : ""));
            resp_send(r, "response.content_part.done", o);
            o = cJSON_CreateObject();
            if (o) {
                cJSON_AddNumberToObject(o, "output_index", 0);
                cJSON_AddItemToObject(o, "item", message_item(r, "completed", text ? text : ""));
            }
            resp_send(r, "response.output_item.done", o);
            o = cJSON_CreateObject();
            if (o) cJSON_AddItemToObject(o, "response", response_obj(r, status, text ? text : "", NULL));
            resp_send(r, !strcmp(status, "completed") ? "response.completed" : "response.incomplete", o);
        }
        if (c->req) {
            if (api->metrics) srv_metrics_count_http(api->metrics, 200);
            srv_http_stream_end(c->req);
            api_log_request(api, c->method, c->path, 200, &c->usage, ttft, api_ms_since(c->t_arrival));
        }
    } else if (c->req) {
        srv_http_set_abort(c->req, NULL, NULL);
        if (error) {
            api_reply_error(api, c->req, &e, NULL);
        } else {
            cJSON *o = response_obj(r, status, text ? text : "", NULL);
            api_reply_json(api, c->req, 200, o, &c->usage, ttft);
            cJSON_Delete(o);
        }
    }
    c->req = NULL;
    free(text);
    resp_free(r);
}

static void resp_event(const srv_sched_event *ev, void *user) {
    api_sub *sub = user;
    resp_call *r = (resp_call *)sub->call;
    api_call *c = &r->c;
    if (ev->type == SRV_SCHED_EV_DONE) {
        sub->done = true;
        c->n_live--;
        c->usage = ev->usage;
        if (ev->timings.t_first_token) c->t_first_token = ev->timings.t_first_token;
        resp_finish(r);
        return;
    }
    if (ev->text_len > 0) {
        if (kvs_buf_append(&c->choices[0].text, ev->text, ev->text_len) && !c->has_error) {
            c->has_error = true;
            srv_api_set_error(&c->error, 500, "server_error", NULL, NULL, "out of memory");
        }
        if (c->stream) {
            char *d = api_utf8_sanitize(ev->text, ev->text_len);
            cJSON *o = item_event(r, true);
            if (o) cJSON_AddStringToObject(o, "delta", d ? d : "");
            cJSON_AddArrayToObject(o, "logprobs");
            free(d);
            resp_send(r, "response.output_text.delta", o);
        }
    }
    if (ev->type == SRV_SCHED_EV_CHOICE_END) {
        r->finish = ev->finish;
        if (ev->finish == SRV_SCHED_FINISH_ERROR && !c->has_error) {
            c->has_error = true;
            srv_api_set_error(&c->error, 500, "server_error", NULL, NULL, "%s", ev->error ? ev->error : "generation failed");
        }
    }
}


static void resp_done(api_job *j) {
    resp_call *r = (resp_call *)j;
    api_call *c = &r->c;
    srv_api *api = c->api;
    srv_http_req *req = c->req;
    if (!req || api->closing) { resp_free(r); return; }
    srv_api_error e = c->prep_error;
    bool fail = c->prep_failed;
    if (!fail && c->shutdown) {
        srv_api_set_error(&e, 503, "server_error", NULL, NULL, "the server is shutting down");
        fail = true;
    }
    if (!fail) {
        c->n_choices = 1;
        if (!(c->choices = calloc(1, sizeof *c->choices))) {
            srv_api_set_error(&e, 500, "server_error", NULL, NULL, "out of memory");
            fail = true;
        }
    }
    if (!fail) {
        srv_sched_request sr;
        memset(&sr, 0, sizeof sr);
        sr.prompt = c->prep_toks[0];
        sr.n_prompt = c->prep_ntok[0];
        sr.n = 1;
        sr.max_tokens = r->max_output;
        sr.n_keep = api_n_keep(api, sr.prompt, sr.n_prompt, false, 0);
        eng_sampling_params_default(&sr.sampling);
        sr.sampling.temperature = r->temperature;
        sr.sampling.top_p = r->top_p;
        sr.sampling.seed = uv_hrtime() ^ (uint64_t)(uintptr_t)r;
        sr.priority = c->priority;
        sr.cb = resp_event;
        sr.user = &c->subs[0];
        int rc = api->be.submit(api->be.ctx, &sr, &c->subs[0].id);
        if (rc != 0) {
            if (rc == SRV_SCHED_ERR_QUEUE_FULL || rc == SRV_SCHED_ERR_STOPPED)
                srv_api_set_error(&e, 503, "server_error", NULL, NULL, "%s", rc == SRV_SCHED_ERR_STOPPED ?
                                  "the server is shutting down" : "the server is overloaded: the request queue is full");
            else
                srv_api_set_error(&e, 400, NULL, "input", NULL, "could not queue the request: %s", kvs_strerror(rc));
            fail = true;
        } else {
            c->subs[0].submitted = true;
            c->n_live = 1;
        }
    }
    if (fail) {
        srv_http_set_abort(req, NULL, NULL);
        c->req = NULL;
        api_reply_error(api, req, &e, NULL);
        resp_free(r);
        return;
    }
    if (c->stream) {
        if (srv_http_stream_begin(req, 200, "text/event-stream", "Cache-Control: no-cache\r\n") != 0) {
            c->req = NULL;
            srv_http_abort(req);
            api_cancel_subs(c);
            return;
        }
        stream_start(r);
    }
}

void api_route_responses(srv_api *api, srv_http_req *req) {
    resp_call *r = calloc(1, sizeof *r);
    if (!r || !api->resp_store) { free(r); api_reply_json(api, req, 500, NULL, NULL, -1); return; }
    api_call *c = &r->c;
    c->ext_free = resp_ext_free;
    api_call_register(api, c, req, "/v1/responses");
    api_make_id(api, "resp_", c->id, sizeof c->id);
    api_make_id(api, "msg_", r->msg_id, sizeof r->msg_id);
    c->job.work = resp_work;
    c->job.done = resp_done;
    api_offload(api, &c->job);
}
