/* messages_map.c: Anthropic Messages API requests as chat completions, and generated text as Message content
 * blocks (see messages_map_internal.h). */
#include "server/api/messages_map_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api/chat_internal.h"
#include "server/api/tool_call_internal.h"

#define BAD(param, ...) (srv_api_set_error(err, 400, NULL, param, NULL, __VA_ARGS__), SRV_API_ERR_INVALID)

void srv_messages_map_req_free(srv_messages_map_req *r) {
    if (!r) return;
    cJSON_Delete(r->chat);
    memset(r, 0, sizeof *r);
}

/* A number copied into the chat body under the same name (range checks are the chat parse's). */
static int copy_number(const cJSON *root, const char *name, cJSON *chat, srv_api_error *err) {
    const cJSON *f = srv_api_json_field(root, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble))
        return BAD(name, "%s: must be a number, got %s", name, srv_api_json_kind(f));
    return cJSON_AddNumberToObject(chat, name, f->valuedouble) ? 0 : srv_api_set_nomem(err);
}

/* ---- content -------------------------------------------------------------------------------------------------- */
/* A string, or an array of text blocks joined by "\n" (what: the field's name for messages). */
static int text_of(const cJSON *c, const char *what, char **out, srv_api_error *err) {
    *out = NULL;
    if (cJSON_IsString(c)) return (*out = strdup(c->valuestring)) ? 0 : srv_api_set_nomem(err);
    if (!cJSON_IsArray(c))
        return BAD(what, "%s: must be a string or an array of text blocks, got %s", what, srv_api_json_kind(c));
    kvs_buf b = {0};
    int j = 0;
    for (const cJSON *p = c->child; p; p = p->next, j++) {
        const char *ty = srv_api_json_str(p, "type");
        if (!ty || strcmp(ty, "text")) {
            kvs_buf_free(&b);
            return BAD(what, "%s[%d]: content blocks of type '%s' are not supported here (text blocks only)", what,
                       j, ty ? ty : "(none)");
        }
        const char *tx = srv_api_json_str(p, "text");
        if (!tx) { kvs_buf_free(&b); return BAD(what, "%s[%d].text: must be a string", what, j); }
        if (j > 0) kvs_buf_putc(&b, '\n');
        kvs_buf_puts(&b, tx);
    }
    kvs_buf_putc(&b, 0);
    if (b.oom) { kvs_buf_free(&b); return srv_api_set_nomem(err); }
    *out = b.data;
    return 0;
}

/* messages[i].content[j] of type tool_use (an assistant message): a tool call onto calls. */
static int add_tool_use(cJSON *calls, const cJSON *b, const char *pn, srv_api_error *err) {
    const char *id = srv_api_json_str(b, "id"), *name = srv_api_json_str(b, "name");
    if (!id || !id[0]) return BAD(pn, "%s.id: must be a non-empty string", pn);
    if (!name || !name[0]) return BAD(pn, "%s.name: must be a non-empty string", pn);
    const cJSON *in = srv_api_json_field(b, "input");
    if (in && !cJSON_IsObject(in)) return BAD(pn, "%s.input: must be an object, got %s", pn, srv_api_json_kind(in));
    char *args = in ? cJSON_PrintUnformatted(in) : strdup("{}");
    if (!args) return srv_api_set_nomem(err);
    bool ok = srv_chat_add_tool_call(calls, id, name, args);
    free(args);
    return ok ? 0 : srv_api_set_nomem(err);
}

/* messages[i].content[j] of type tool_result (a user message): a tool message answering an earlier call. */
static int add_tool_result(cJSON *msgs, const cJSON *b, const char *pn, srv_api_error *err) {
    const char *id = srv_api_json_str(b, "tool_use_id");
    if (!id || !id[0]) return BAD(pn, "%s.tool_use_id: must be a non-empty string", pn);
    const char *name = srv_chat_call_name(msgs, id);
    if (!name) return BAD(pn, "%s.tool_use_id: no tool_use block with id '%s' comes before it", pn, id);
    const cJSON *is_error = srv_api_json_field(b, "is_error");
    if (is_error && !cJSON_IsBool(is_error)) return BAD(pn, "%s.is_error: must be a boolean", pn);
    char what[160], *text = NULL;
    snprintf(what, sizeof what, "%s.content", pn);
    const cJSON *c = srv_api_json_field(b, "content");
    int r = c ? text_of(c, what, &text, err) : ((text = strdup("")) ? 0 : srv_api_set_nomem(err));
    if (r) return r;
    cJSON *m = NULL;
    r = srv_chat_add_message(msgs, "tool", text, &m, err);
    free(text);
    if (r) return r;
    if (!cJSON_AddStringToObject(m, "tool_call_id", id) || !cJSON_AddStringToObject(m, "name", name)) return srv_api_set_nomem(err);
    return 0;
}

/* messages[i]: one chat message, or for a user message with tool_result blocks, one tool message per result and
 * then the user's text (when there is any). */
static int add_one(cJSON *msgs, const cJSON *m, int i, srv_api_error *err) {
    char pn[96];
    snprintf(pn, sizeof pn, "messages[%d]", i);
    if (!cJSON_IsObject(m)) return BAD("messages", "%s: must be an object, got %s", pn, srv_api_json_kind(m));
    const char *role = srv_api_json_str(m, "role");
    if (!role || (strcmp(role, "user") && strcmp(role, "assistant")))
        return BAD("messages", "%s.role: must be \"user\" or \"assistant\"", pn);
    bool user = !strcmp(role, "user");
    const cJSON *c = srv_api_json_field(m, "content");
    if (!c) return BAD("messages", "%s.content: Field required", pn);
    if (cJSON_IsString(c)) return srv_chat_add_message(msgs, role, c->valuestring, NULL, err);
    if (!cJSON_IsArray(c))
        return BAD("messages", "%s.content: must be a string or an array of content blocks, got %s", pn,
                   srv_api_json_kind(c));
    kvs_buf text = {0};
    cJSON *calls = NULL;
    int r = 0, j = 0, n_text = 0;
    for (const cJSON *b = c->child; b && !r; b = b->next, j++) {
        char bn[128];
        snprintf(bn, sizeof bn, "%s.content[%d]", pn, j);
        const char *ty = srv_api_json_str(b, "type");
        if (!ty) { r = BAD("messages", "%s.type: must be a string", bn); break; }
        if (!strcmp(ty, "text")) {
            const char *tx = srv_api_json_str(b, "text");
            if (!tx) { r = BAD("messages", "%s.text: must be a string", bn); break; }
            if (n_text++) kvs_buf_putc(&text, '\n');
            kvs_buf_puts(&text, tx);
        } else if (!user && !strcmp(ty, "tool_use")) {
            if (!calls && !(calls = cJSON_CreateArray())) { r = srv_api_set_nomem(err); break; }
            r = add_tool_use(calls, b, bn, err);
        } else if (user && !strcmp(ty, "tool_result")) {
            r = add_tool_result(msgs, b, bn, err);
        } else if (!user && (!strcmp(ty, "thinking") || !strcmp(ty, "redacted_thinking"))) {
            /* past reasoning is not shown to the model */
        } else {
            r = BAD("messages", "%s: content blocks of type '%s' are not supported%s (text%s are)", bn, ty,
                    user ? " in user messages" : " in assistant messages",
                    user ? " and tool_result" : ", tool_use and thinking");
        }
    }
    kvs_buf_putc(&text, 0);
    if (!r && text.oom) r = srv_api_set_nomem(err);
    if (!r && (!user || n_text > 0 || !c->child)) {
        cJSON *o = NULL;
        r = srv_chat_add_message(msgs, role, text.data, &o, err);
        if (!r && calls) { cJSON_AddItemToObject(o, "tool_calls", calls); calls = NULL; }
    }
    cJSON_Delete(calls);
    kvs_buf_free(&text);
    return r;
}

static int map_messages(const cJSON *root, cJSON *chat, srv_api_error *err) {
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    if (!msgs) return srv_api_set_nomem(err);
    const cJSON *sys = srv_api_json_field(root, "system");
    if (sys) {
        char *s = NULL;
        int r = text_of(sys, "system", &s, err);
        if (!r) r = srv_chat_add_message(msgs, "system", s, NULL, err);
        free(s);
        if (r) return r;
    }
    const cJSON *in = srv_api_json_field(root, "messages");
    if (!in) return BAD("messages", "messages: Field required");
    if (!cJSON_IsArray(in) || !in->child)
        return BAD("messages", "messages: must be a non-empty array of messages, got %s",
                   cJSON_IsArray(in) ? "an empty array" : srv_api_json_kind(in));
    int i = 0;
    for (const cJSON *m = in->child; m; m = m->next, i++) {
        int r = add_one(msgs, m, i, err);
        if (r) return r;
    }
    return 0;
}

/* ---- tools ---------------------------------------------------------------------------------------------------- */
static int map_tools(const cJSON *root, cJSON *chat, srv_api_error *err) {
    const cJSON *tools = srv_api_json_field(root, "tools");
    if (!tools) return 0;
    if (!cJSON_IsArray(tools)) return BAD("tools", "tools: must be an array, got %s", srv_api_json_kind(tools));
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    if (!out) return srv_api_set_nomem(err);
    int j = 0;
    for (const cJSON *t = tools->child; t; t = t->next, j++) {
        if (!cJSON_IsObject(t)) return BAD("tools", "tools[%d]: must be an object", j);
        const cJSON *ty = srv_api_json_field(t, "type");
        if (ty && (!cJSON_IsString(ty) || strcmp(ty->valuestring, "custom")))
            return BAD("tools", "tools[%d].type: tools of type '%s' are not supported (only client tools with an "
                       "input_schema are)", j, cJSON_IsString(ty) ? ty->valuestring : srv_api_json_kind(ty));
        const char *name = srv_api_json_str(t, "name");
        if (!name || !name[0]) return BAD("tools", "tools[%d].name: must be a non-empty string", j);
        const cJSON *desc = srv_api_json_field(t, "description"), *schema = srv_api_json_field(t, "input_schema");
        if (desc && !cJSON_IsString(desc)) return BAD("tools", "tools[%d].description: must be a string", j);
        if (!schema) return BAD("tools", "tools[%d].input_schema: Field required", j);
        if (!cJSON_IsObject(schema)) return BAD("tools", "tools[%d].input_schema: must be an object (a JSON Schema)", j);
        cJSON *ct = cJSON_CreateObject(), *fn = cJSON_CreateObject(), *p = cJSON_Duplicate(schema, true);
        if (!ct || !fn || !p) { cJSON_Delete(ct); cJSON_Delete(fn); cJSON_Delete(p); return srv_api_set_nomem(err); }
        cJSON_AddItemToArray(out, ct);
        bool ok = cJSON_AddStringToObject(ct, "type", "function") != NULL;
        cJSON_AddItemToObject(ct, "function", fn);
        ok = ok && cJSON_AddStringToObject(fn, "name", name);
        if (desc) ok = ok && cJSON_AddStringToObject(fn, "description", desc->valuestring);
        cJSON_AddItemToObject(fn, "parameters", p);
        if (!ok) return srv_api_set_nomem(err);
    }
    return 0;
}

static int map_tool_choice(const cJSON *root, srv_messages_map_req *out, srv_api_error *err) {
    const cJSON *tc = srv_api_json_field(root, "tool_choice");
    if (!tc) return 0;
    if (!cJSON_IsObject(tc))
        return BAD("tool_choice", "tool_choice: must be an object {\"type\": \"auto\"|\"any\"|\"tool\"|\"none\"}, "
                   "got %s", srv_api_json_kind(tc));
    const char *ty = srv_api_json_str(tc, "type");
    if (!ty) return BAD("tool_choice", "tool_choice.type: must be a string");
    const cJSON *dp = srv_api_json_field(tc, "disable_parallel_tool_use");
    if (dp && !cJSON_IsBool(dp)) return BAD("tool_choice", "tool_choice.disable_parallel_tool_use: must be a boolean");
    out->parallel_tool_calls = !cJSON_IsTrue(dp);
    if (!strcmp(ty, "auto") || !strcmp(ty, "none") || !strcmp(ty, "any")) {
        const char *s = !strcmp(ty, "any") ? "required" : ty;
        if (!cJSON_AddStringToObject(out->chat, "tool_choice", s)) return srv_api_set_nomem(err);
    } else if (!strcmp(ty, "tool")) {
        const char *name = srv_api_json_str(tc, "name");
        if (!name || !name[0]) return BAD("tool_choice", "tool_choice.name: must be a non-empty string");
        cJSON *c = cJSON_AddObjectToObject(out->chat, "tool_choice");
        cJSON *fn = c ? cJSON_AddObjectToObject(c, "function") : NULL;
        if (!fn || !cJSON_AddStringToObject(c, "type", "function") || !cJSON_AddStringToObject(fn, "name", name))
            return srv_api_set_nomem(err);
    } else {
        return BAD("tool_choice", "tool_choice.type: must be \"auto\", \"any\", \"tool\" or \"none\", got '%s'", ty);
    }
    return cJSON_AddBoolToObject(out->chat, "parallel_tool_calls", out->parallel_tool_calls) ? 0 : srv_api_set_nomem(err);
}

/* thinking {type: enabled, budget_tokens} | {type: disabled}: disabled renders the template with enable_thinking
 * false (chat_template_kwargs); the budget is checked, not enforced. */
static int map_thinking(const cJSON *root, cJSON *chat, srv_api_error *err) {
    const cJSON *th = srv_api_json_field(root, "thinking");
    if (!th) return 0;
    if (!cJSON_IsObject(th))
        return BAD("thinking", "thinking: must be an object {\"type\": \"enabled\"|\"disabled\"}, got %s",
                   srv_api_json_kind(th));
    const char *ty = srv_api_json_str(th, "type");
    if (!ty || (strcmp(ty, "enabled") && strcmp(ty, "disabled")))
        return BAD("thinking", "thinking.type: must be \"enabled\" or \"disabled\"");
    const cJSON *b = srv_api_json_field(th, "budget_tokens");
    if (b && (!cJSON_IsNumber(b) || b->valuedouble != floor(b->valuedouble) || b->valuedouble < 1 ||
              b->valuedouble > INT32_MAX))
        return BAD("thinking", "thinking.budget_tokens: must be an integer >= 1");
    if (!strcmp(ty, "enabled")) return 0;
    cJSON *kw = cJSON_AddObjectToObject(chat, "chat_template_kwargs");
    return kw && cJSON_AddFalseToObject(kw, "enable_thinking") ? 0 : srv_api_set_nomem(err);
}

/* ---- the request ---------------------------------------------------------------------------------------------- */
static int map_all(const cJSON *root, bool count, srv_messages_map_req *out, srv_api_error *err) {
    int r;
    out->max_tokens = -1;
    out->parallel_tool_calls = true;
    if (!cJSON_IsObject(root)) return BAD(NULL, "the request body must be a JSON object");
    if (!(out->chat = cJSON_CreateObject())) return srv_api_set_nomem(err);
    const cJSON *model = srv_api_json_field(root, "model");
    if (model && !cJSON_IsString(model))
        return BAD("model", "model: must be a string, got %s", srv_api_json_kind(model));
    if (model && !cJSON_AddStringToObject(out->chat, "model", model->valuestring)) return srv_api_set_nomem(err);
    if (!count) {
        const cJSON *mt = srv_api_json_field(root, "max_tokens");
        if (!mt) return BAD("max_tokens", "max_tokens: Field required");
        if (!cJSON_IsNumber(mt) || mt->valuedouble != floor(mt->valuedouble) || mt->valuedouble < 1 ||
            mt->valuedouble > INT32_MAX)
            return BAD("max_tokens", "max_tokens: must be an integer >= 1");
        out->max_tokens = (int32_t)mt->valuedouble;
        if (!cJSON_AddNumberToObject(out->chat, "max_tokens", mt->valuedouble)) return srv_api_set_nomem(err);
        if ((r = copy_number(root, "temperature", out->chat, err)) || (r = copy_number(root, "top_p", out->chat, err)) ||
            (r = copy_number(root, "top_k", out->chat, err)))
            return r;
        const cJSON *st = srv_api_json_field(root, "stream");
        if (st && !cJSON_IsBool(st)) return BAD("stream", "stream: must be a boolean, got %s", srv_api_json_kind(st));
        out->stream = cJSON_IsTrue(st);
        const cJSON *stops = srv_api_json_field(root, "stop_sequences");
        if (stops) {
            if (!cJSON_IsArray(stops))
                return BAD("stop_sequences", "stop_sequences: must be an array of strings, got %s",
                           srv_api_json_kind(stops));
            int k = 0;
            for (const cJSON *s = stops->child; s; s = s->next, k++)
                if (!cJSON_IsString(s) || !s->valuestring[0])
                    return BAD("stop_sequences", "stop_sequences[%d]: must be a non-empty string", k);
            cJSON *d = cJSON_Duplicate(stops, true);
            if (!d) return srv_api_set_nomem(err);
            cJSON_AddItemToObject(out->chat, "stop", d);
        }
        const cJSON *md = srv_api_json_field(root, "metadata");
        if (md && !cJSON_IsObject(md))
            return BAD("metadata", "metadata: must be an object, got %s", srv_api_json_kind(md));
        const cJSON *uid = srv_api_json_field(md, "user_id");
        if (uid && !cJSON_IsString(uid))
            return BAD("metadata", "metadata.user_id: must be a string, got %s", srv_api_json_kind(uid));
        if (uid && !cJSON_AddStringToObject(out->chat, "user", uid->valuestring)) return srv_api_set_nomem(err);
        const cJSON *prio = srv_api_json_field(root, "priority"); /* chat's parser checks it with its policy */
        if (prio) {
            cJSON *d = cJSON_Duplicate(prio, true);
            if (!d) return srv_api_set_nomem(err);
            cJSON_AddItemToObject(out->chat, "priority", d);
        }
    }
    if ((r = map_tools(root, out->chat, err)) || (r = map_tool_choice(root, out, err)) ||
        (r = map_thinking(root, out->chat, err)))
        return r;
    return map_messages(root, out->chat, err);
}

int srv_messages_map_parse(const cJSON *root, bool count_tokens, srv_messages_map_req *out, srv_api_error *err) {
    if (!out) return SRV_API_ERR_INVALID;
    memset(out, 0, sizeof *out);
    int r = map_all(root, count_tokens, out, err);
    if (r) srv_messages_map_req_free(out);
    return r;
}

/* ---- output ----------------------------------------------------------------------------------------------------- */
void srv_messages_map_out_free(srv_messages_map_out *o) {
    if (!o) return;
    cJSON_Delete(o->content);
    free(o->text);
    memset(o, 0, sizeof *o);
}

static int build_output(const char *text, size_t len, bool tools, bool parallel, const char *seed,
                        srv_messages_map_out *out) {
    srv_tool_call_result tc;
    memset(&tc, 0, sizeof tc);
    if (tools && srv_tool_call_parse_first(text, len, parallel, &tc) != 0) return KVS_ERR_NOMEM;
    size_t cl = tc.n_calls > 0 ? tc.content_len : len;
    int rc = KVS_ERR_NOMEM;
    if (!(out->text = malloc(cl + 1)) || !(out->content = cJSON_CreateArray())) goto out;
    if (cl) memcpy(out->text, text, cl);
    out->text[cl] = 0;
    out->n_calls = tc.n_calls;
    out->has_text = cl > 0;
    if (out->has_text) {
        cJSON *b = cJSON_CreateObject();
        if (!b) goto out;
        cJSON_AddItemToArray(out->content, b);
        if (!cJSON_AddStringToObject(b, "type", "text") || !cJSON_AddStringToObject(b, "text", out->text)) goto out;
    }
    for (int k = 0; k < tc.n_calls; k++) {
        char id[96];
        snprintf(id, sizeof id, "toolu_%s_%d", seed, k);
        cJSON *b = cJSON_CreateObject();
        if (!b) goto out;
        cJSON_AddItemToArray(out->content, b);
        /* srv_tool_call_parse gives the arguments as the compact JSON text of an object */
        cJSON *in = cJSON_Parse(tc.calls[k].arguments);
        if (!in) goto out;
        bool ok = cJSON_AddStringToObject(b, "type", "tool_use") && cJSON_AddStringToObject(b, "id", id) &&
                  cJSON_AddStringToObject(b, "name", tc.calls[k].name);
        cJSON_AddItemToObject(b, "input", in);
        if (!ok) goto out;
    }
    rc = 0;
out:
    srv_tool_call_result_free(&tc);
    return rc;
}

int srv_messages_map_output(const char *text, size_t len, bool tools, bool parallel, const char *seed, srv_messages_map_out *out) {
    if (!out) return KVS_ERR_INVALID;
    memset(out, 0, sizeof *out);
    if ((!text && len) || !seed) return KVS_ERR_INVALID;
    int rc = build_output(text ? text : "", len, tools, parallel, seed, out);
    if (rc) srv_messages_map_out_free(out);
    return rc;
}

const char *srv_messages_map_stop_reason(int n_calls, bool length, bool stop_string) {
    if (n_calls > 0) return "tool_use";
    if (length) return "max_tokens";
    return stop_string ? "stop_sequence" : "end_turn";
}

cJSON *srv_messages_map_usage(int32_t prompt_tokens, int32_t cached_tokens, int32_t output_tokens) {
    cJSON *u = cJSON_CreateObject();
    if (!u) return NULL;
    if (cached_tokens < 0) cached_tokens = 0;
    if (cached_tokens > prompt_tokens) cached_tokens = prompt_tokens;
    if (!cJSON_AddNumberToObject(u, "input_tokens", prompt_tokens - cached_tokens) ||
        !cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0) ||
        !cJSON_AddNumberToObject(u, "cache_read_input_tokens", cached_tokens) ||
        !cJSON_AddNumberToObject(u, "output_tokens", output_tokens)) {
        cJSON_Delete(u);
        return NULL;
    }
    return u;
}

cJSON *srv_messages_map_message(const char *id, const char *model, cJSON *content, const char *stop_reason,
                       const char *stop_sequence, cJSON *usage) {
    cJSON *m = cJSON_CreateObject();
    if (!content) content = cJSON_CreateArray();
    if (!usage) usage = srv_messages_map_usage(0, 0, 0);
    if (!m || !content || !usage) { cJSON_Delete(m); cJSON_Delete(content); cJSON_Delete(usage); return NULL; }
    bool ok = cJSON_AddStringToObject(m, "id", id ? id : "") && cJSON_AddStringToObject(m, "type", "message") &&
              cJSON_AddStringToObject(m, "role", "assistant") && cJSON_AddStringToObject(m, "model", model ? model : "");
    cJSON_AddItemToObject(m, "content", content);
    ok = ok && (stop_reason ? cJSON_AddStringToObject(m, "stop_reason", stop_reason)
                            : cJSON_AddNullToObject(m, "stop_reason"));
    ok = ok && (stop_sequence ? cJSON_AddStringToObject(m, "stop_sequence", stop_sequence)
                              : cJSON_AddNullToObject(m, "stop_sequence"));
    ok = ok && cJSON_AddNullToObject(m, "stop_details");
    cJSON_AddItemToObject(m, "usage", usage);
    if (!ok) { cJSON_Delete(m); return NULL; }
    return m;
}
