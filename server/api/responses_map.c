/* responses_map.c: Responses API requests as chat completions, and generated text as Responses output items
 * (see responses_map_internal.h). */
#include "server/api/responses_map_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api/chat_internal.h"
#include "server/api/tool_call_internal.h"

#define BAD(param, ...) (srv_api_set_error(err, 400, NULL, param, NULL, __VA_ARGS__), SRV_API_ERR_INVALID)
#define OOM() srv_api_set_nomem(err)

void srv_responses_map_req_free(srv_responses_map_req *r) {
    if (!r) return;
    cJSON_Delete(r->chat);
    cJSON_Delete(r->conv);
    cJSON_Delete(r->tools);
    cJSON_Delete(r->tool_choice);
    cJSON_Delete(r->text_format);
    free(r->instructions);
    free(r->prev_id);
    memset(r, 0, sizeof *r);
}

/* ---- scalars ------------------------------------------------------------------------------------------------ */
static int get_bool(const cJSON *root, const char *name, bool *out, srv_api_error *err) {
    const cJSON *f = srv_api_json_field(root, name);
    if (!f) return 0;
    if (!cJSON_IsBool(f)) return BAD(name, "'%s' must be a boolean, got %s", name, srv_api_json_kind(f));
    *out = cJSON_IsTrue(f);
    return 0;
}

/* A number copied into the chat body under chat_name (range checks are the chat parse's). */
static int copy_number(const cJSON *root, const char *name, const char *chat_name, cJSON *chat, float *echo,
                       srv_api_error *err) {
    const cJSON *f = srv_api_json_field(root, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble))
        return BAD(name, "'%s' must be a number, got %s", name, srv_api_json_kind(f));
    if (!cJSON_AddNumberToObject(chat, chat_name, f->valuedouble)) return OOM();
    if (echo) *echo = (float)f->valuedouble;
    return 0;
}

/* ---- content -------------------------------------------------------------------------------------------------- */
/* A string, or text parts (input_text, output_text, text) joined; what[] names the field in messages. */
static int text_of(const cJSON *c, const char *what, char **out, srv_api_error *err) {
    *out = NULL;
    if (cJSON_IsString(c)) return (*out = strdup(c->valuestring)) ? 0 : OOM();
    if (!cJSON_IsArray(c))
        return BAD("input", "'%s' must be a string or an array of text parts, got %s", what, srv_api_json_kind(c));
    kvs_buf b = {0};
    int j = 0;
    for (const cJSON *p = c->child; p; p = p->next, j++) {
        const cJSON *ty = srv_api_json_field(p, "type"), *tx = srv_api_json_field(p, "text");
        const char *t = cJSON_IsString(ty) ? ty->valuestring : "";
        if (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text")) {
            kvs_buf_free(&b);
            return BAD("input", "'%s[%d]': content of type '%s' is not supported (text parts only: input_text, "
                       "output_text)", what, j, cJSON_IsString(ty) ? t : "(none)");
        }
        if (!cJSON_IsString(tx)) { kvs_buf_free(&b); return BAD("input", "'%s[%d].text' must be a string", what, j); }
        kvs_buf_puts(&b, tx->valuestring);
    }
    kvs_buf_putc(&b, 0);
    if (b.oom) { kvs_buf_free(&b); return OOM(); }
    *out = b.data;
    return 0;
}

/* input[i] of type function_call: a tool call of the assistant message before it (or of a new one). */
static int add_function_call(cJSON *msgs, const cJSON *it, int i, srv_api_error *err) {
    char pn[64];
    const char *call_id = srv_api_json_str(it, "call_id"), *name = srv_api_json_str(it, "name"), *args = srv_api_json_str(it, "arguments");
    snprintf(pn, sizeof pn, "input[%d].call_id", i);
    if (!call_id || !call_id[0]) return BAD(pn, "'%s' must be a non-empty string", pn);
    snprintf(pn, sizeof pn, "input[%d].name", i);
    if (!name || !name[0]) return BAD(pn, "'%s' must be a non-empty string", pn);
    snprintf(pn, sizeof pn, "input[%d].arguments", i);
    if (!args) return BAD(pn, "'%s' must be a string holding a JSON object", pn);
    cJSON *parsed = cJSON_Parse(args);
    bool obj = cJSON_IsObject(parsed);
    cJSON_Delete(parsed);
    if (!obj) return BAD(pn, "'%s' must be a string holding a JSON object", pn);
    cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const char *lr = last ? srv_api_json_str(last, "role") : NULL;
    if (!lr || strcmp(lr, "assistant")) {
        if (srv_chat_add_message(msgs, "assistant", "", &last, err)) return SRV_API_ERR_NOMEM;
    }
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(last, "tool_calls");
    if (!calls && !(calls = cJSON_AddArrayToObject(last, "tool_calls"))) return OOM();
    return srv_chat_add_tool_call(calls, call_id, name, args) ? 0 : OOM();
}

/* input[i] of type function_call_output: a tool message answering an earlier call. */
static int add_call_output(cJSON *msgs, const cJSON *it, int i, srv_api_error *err) {
    char pn[64];
    const char *call_id = srv_api_json_str(it, "call_id");
    snprintf(pn, sizeof pn, "input[%d].call_id", i);
    if (!call_id || !call_id[0]) return BAD(pn, "'%s' must be a non-empty string", pn);
    const char *name = srv_chat_call_name(msgs, call_id);
    if (!name)
        return BAD(pn, "'%s': no function_call with call_id '%s' comes before it (in input or in the conversation "
                   "of previous_response_id)", pn, call_id);
    snprintf(pn, sizeof pn, "input[%d].output", i);
    const cJSON *o = srv_api_json_field(it, "output");
    if (!o) return BAD(pn, "'%s' is required", pn);
    char *text = NULL;
    int r = text_of(o, pn, &text, err);
    if (r) return r;
    r = srv_chat_add_message(msgs, "tool", text, NULL, err);
    free(text);
    if (r) return r;
    cJSON *m = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    if (!cJSON_AddStringToObject(m, "tool_call_id", call_id) || !cJSON_AddStringToObject(m, "name", name)) return OOM();
    return 0;
}

static int add_input(const cJSON *root, cJSON *msgs, srv_api_error *err) {
    const cJSON *in = srv_api_json_field(root, "input");
    if (cJSON_IsString(in)) return srv_chat_add_message(msgs, "user", in->valuestring, NULL, err);
    if (!cJSON_IsArray(in) || !in->child)
        return BAD("input", "'input' is required: a string or a non-empty array of input items");
    int i = 0;
    for (const cJSON *it = in->child; it; it = it->next, i++) {
        char pn[64];
        snprintf(pn, sizeof pn, "input[%d]", i);
        if (!cJSON_IsObject(it)) return BAD("input", "'%s' must be an object, got %s", pn, srv_api_json_kind(it));
        const cJSON *ty = srv_api_json_field(it, "type");
        if (ty && !cJSON_IsString(ty)) return BAD("input", "'%s.type' must be a string", pn);
        const char *t = ty ? ty->valuestring : "message";
        int r;
        if (!strcmp(t, "function_call")) {
            r = add_function_call(msgs, it, i, err);
        } else if (!strcmp(t, "function_call_output")) {
            r = add_call_output(msgs, it, i, err);
        } else if (!strcmp(t, "message")) {
            const char *role = srv_api_json_str(it, "role");
            if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                          strcmp(role, "developer")))
                return BAD("input", "'%s.role' must be user, assistant, system or developer", pn);
            char what[96], *text = NULL;
            snprintf(what, sizeof what, "%s.content", pn);
            const cJSON *c = srv_api_json_field(it, "content");
            if (!c) return BAD("input", "'%s' is required", what);
            if ((r = text_of(c, what, &text, err)) != 0) return r;
            r = srv_chat_add_message(msgs, !strcmp(role, "developer") ? "system" : role, text, NULL, err);
            free(text);
        } else {
            return BAD("input", "'%s': input items of type '%s' are not supported (message, function_call and "
                       "function_call_output are)", pn, t);
        }
        if (r) return r;
    }
    return 0;
}

/* ---- tools ---------------------------------------------------------------------------------------------------- */
static int map_tools(const cJSON *root, srv_responses_map_req *out, srv_api_error *err) {
    const cJSON *tools = srv_api_json_field(root, "tools");
    if (!(out->tools = cJSON_CreateArray())) return OOM();
    if (!tools) return 0;
    if (!cJSON_IsArray(tools)) return BAD("tools", "'tools' must be an array, got %s", srv_api_json_kind(tools));
    cJSON *chat_tools = cJSON_AddArrayToObject(out->chat, "tools");
    if (!chat_tools) return OOM();
    int j = 0;
    for (const cJSON *t = tools->child; t; t = t->next, j++) {
        const char *ty = srv_api_json_str(t, "type");
        if (!ty) return BAD("tools", "'tools[%d]' must be an object with a string type", j);
        if (strcmp(ty, "function"))
            return BAD("tools", "'tools[%d]' has type '%s', which this server does not support: only function "
                       "tools (type 'function') are", j, ty);
        const char *name = srv_api_json_str(t, "name");
        if (!name || !name[0]) return BAD("tools", "'tools[%d].name' must be a non-empty string", j);
        const cJSON *desc = srv_api_json_field(t, "description"), *params = srv_api_json_field(t, "parameters");
        const cJSON *strict = srv_api_json_field(t, "strict");
        if (desc && !cJSON_IsString(desc)) return BAD("tools", "'tools[%d].description' must be a string", j);
        if (params && !cJSON_IsObject(params))
            return BAD("tools", "'tools[%d].parameters' must be an object (a JSON Schema)", j);
        if (strict && !cJSON_IsBool(strict)) return BAD("tools", "'tools[%d].strict' must be a boolean", j);
        cJSON *ct = cJSON_CreateObject(), *fn = cJSON_CreateObject(), *echo = cJSON_CreateObject();
        if (!ct || !fn || !echo) { cJSON_Delete(ct); cJSON_Delete(fn); cJSON_Delete(echo); return OOM(); }
        cJSON_AddItemToArray(chat_tools, ct);
        cJSON_AddItemToArray(out->tools, echo);
        bool ok = cJSON_AddStringToObject(ct, "type", "function");
        cJSON_AddItemToObject(ct, "function", fn);
        ok = ok && cJSON_AddStringToObject(fn, "name", name) &&
                  cJSON_AddStringToObject(echo, "type", "function") && cJSON_AddStringToObject(echo, "name", name);
        if (desc) ok = ok && cJSON_AddStringToObject(fn, "description", desc->valuestring);
        ok = ok && (desc ? cJSON_AddStringToObject(echo, "description", desc->valuestring)
                         : cJSON_AddNullToObject(echo, "description"));
        if (params) {
            cJSON *p1 = cJSON_Duplicate(params, true), *p2 = cJSON_Duplicate(params, true);
            if (p1) cJSON_AddItemToObject(fn, "parameters", p1);
            if (p2) cJSON_AddItemToObject(echo, "parameters", p2);
            ok = ok && p1 && p2;
        } else {
            ok = ok && cJSON_AddNullToObject(echo, "parameters");
        }
        /* strict goes to chat only when given, so that the prompt is chat's for the same function */
        if (strict) ok = ok && cJSON_AddBoolToObject(fn, "strict", cJSON_IsTrue(strict)) &&
                         cJSON_AddBoolToObject(echo, "strict", cJSON_IsTrue(strict));
        else ok = ok && cJSON_AddNullToObject(echo, "strict");
        if (!ok) return OOM();
    }
    return 0;
}

static int map_tool_choice(const cJSON *root, srv_responses_map_req *out, srv_api_error *err) {
    const cJSON *tc = srv_api_json_field(root, "tool_choice");
    if (!tc) return (out->tool_choice = cJSON_CreateString("auto")) ? 0 : OOM();
    if (cJSON_IsString(tc)) {
        const char *s = tc->valuestring;
        if (strcmp(s, "none") && strcmp(s, "auto") && strcmp(s, "required"))
            return BAD("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                       "\"function\", \"name\": ...}, got '%s'", s);
        if (!cJSON_AddStringToObject(out->chat, "tool_choice", s)) return OOM();
    } else if (cJSON_IsObject(tc)) {
        const char *ty = srv_api_json_str(tc, "type");
        if (!ty) return BAD("tool_choice", "'tool_choice.type' must be a string");
        if (strcmp(ty, "function"))
            return BAD("tool_choice", "'tool_choice' of type '%s' is not supported: only \"none\", \"auto\", "
                       "\"required\" and {\"type\": \"function\", \"name\": ...} are", ty);
        const char *name = srv_api_json_str(tc, "name");
        if (!name || !name[0]) return BAD("tool_choice", "'tool_choice.name' must be a non-empty string");
        cJSON *c = cJSON_AddObjectToObject(out->chat, "tool_choice");
        cJSON *fn = c ? cJSON_AddObjectToObject(c, "function") : NULL;
        if (!fn || !cJSON_AddStringToObject(c, "type", "function") || !cJSON_AddStringToObject(fn, "name", name))
            return OOM();
    } else {
        return BAD("tool_choice", "'tool_choice' must be a string or an object, got %s", srv_api_json_kind(tc));
    }
    return (out->tool_choice = cJSON_Duplicate(tc, true)) ? 0 : OOM();
}

/* text.format -> response_format */
static int map_text_format(const cJSON *root, srv_responses_map_req *out, srv_api_error *err) {
    const cJSON *text = srv_api_json_field(root, "text"), *fmt = text ? srv_api_json_field(text, "format") : NULL;
    if (text && !cJSON_IsObject(text)) return BAD("text", "'text' must be an object, got %s", srv_api_json_kind(text));
    if (!fmt) {
        out->text_format = cJSON_CreateObject();
        return out->text_format && cJSON_AddStringToObject(out->text_format, "type", "text") ? 0 : OOM();
    }
    const char *ty = srv_api_json_str(fmt, "type");
    if (!ty) return BAD("text.format", "'text.format' must be an object with a string type");
    if (!(out->text_format = cJSON_Duplicate(fmt, true))) return OOM();
    if (!strcmp(ty, "text")) return 0;
    cJSON *rf = cJSON_AddObjectToObject(out->chat, "response_format");
    if (!rf || !cJSON_AddStringToObject(rf, "type", ty)) return OOM();
    if (!strcmp(ty, "json_object")) return 0;
    if (strcmp(ty, "json_schema"))
        return BAD("text.format", "'text.format.type' must be text, json_object or json_schema, got '%s'", ty);
    /* the Responses API puts name, schema, strict, description beside type; chat nests them in json_schema */
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    if (!js) return OOM();
    for (const cJSON *f = fmt->child; f; f = f->next) {
        if (!f->string || !strcmp(f->string, "type")) continue;
        cJSON *d = cJSON_Duplicate(f, true);
        if (!d) return OOM();
        cJSON_AddItemToObject(js, f->string, d);
    }
    return 0;
}

/* ---- the request ---------------------------------------------------------------------------------------------- */
static int map_all(const cJSON *root, srv_responses_map_lookup_fn lookup, void *ud, srv_responses_map_req *out,
                   srv_api_error *err) {
    int r;
    out->max_output = -1;
    out->temperature = out->top_p = 1.0f;
    out->parallel_tool_calls = out->store = true;
    if (!cJSON_IsObject(root)) return BAD(NULL, "the request body must be a JSON object");
    if (!(out->chat = cJSON_CreateObject())) return OOM();
    const cJSON *model = srv_api_json_field(root, "model");
    if (model && !cJSON_IsString(model))
        return BAD("model", "'model' must be a string, got %s", srv_api_json_kind(model));
    if (model && !cJSON_AddStringToObject(out->chat, "model", model->valuestring)) return OOM();
    if ((r = copy_number(root, "temperature", "temperature", out->chat, &out->temperature, err))) return r;
    if ((r = copy_number(root, "top_p", "top_p", out->chat, &out->top_p, err))) return r;
    const cJSON *mo = srv_api_json_field(root, "max_output_tokens");
    if (mo) {
        if (!cJSON_IsNumber(mo) || mo->valuedouble != floor(mo->valuedouble) || mo->valuedouble < 1 ||
            mo->valuedouble > INT32_MAX)
            return BAD("max_output_tokens", "'max_output_tokens' must be an integer >= 1");
        out->max_output = (int32_t)mo->valuedouble;
        if (!cJSON_AddNumberToObject(out->chat, "max_tokens", mo->valuedouble)) return OOM();
    }
    const cJSON *rs = srv_api_json_field(root, "reasoning"); /* {effort}: chat's reasoning_effort (checked there) */
    if (rs && !cJSON_IsObject(rs)) return BAD("reasoning", "'reasoning' must be an object, got %s", srv_api_json_kind(rs));
    const cJSON *effort = srv_api_json_field(rs, "effort");
    if (effort) {
        cJSON *d = cJSON_Duplicate(effort, true);
        if (!d) return OOM();
        cJSON_AddItemToObject(out->chat, "reasoning_effort", d);
    }
    const cJSON *prio = srv_api_json_field(root, "priority"); /* checked by chat's parser, with its policy rule */
    if (prio) {
        cJSON *d = cJSON_Duplicate(prio, true);
        if (!d) return OOM();
        cJSON_AddItemToObject(out->chat, "priority", d);
    }
    if ((r = get_bool(root, "stream", &out->stream, err))) return r;
    if ((r = get_bool(root, "store", &out->store, err))) return r;
    if ((r = get_bool(root, "parallel_tool_calls", &out->parallel_tool_calls, err))) return r;
    if (!cJSON_AddBoolToObject(out->chat, "parallel_tool_calls", out->parallel_tool_calls)) return OOM();
    const cJSON *ins = srv_api_json_field(root, "instructions");
    if (ins && !cJSON_IsString(ins))
        return BAD("instructions", "'instructions' must be a string, got %s", srv_api_json_kind(ins));
    if (ins && !(out->instructions = strdup(ins->valuestring))) return OOM();
    if ((r = map_tools(root, out, err)) || (r = map_tool_choice(root, out, err)) ||
        (r = map_text_format(root, out, err)))
        return r;
    const cJSON *prev = srv_api_json_field(root, "previous_response_id");
    if (prev && !cJSON_IsString(prev))
        return BAD("previous_response_id", "'previous_response_id' must be a string, got %s", srv_api_json_kind(prev));
    if (prev) {
        if (!(out->prev_id = strdup(prev->valuestring))) return OOM();
        int lr = lookup ? lookup(ud, prev->valuestring, &out->conv) : -1;
        if (lr == -2) return OOM();
        if (lr != 0) {
            srv_api_set_error(err, 404, NULL, "previous_response_id", "not_found", "Previous response with id '%s' "
                              "not found (responses are kept in memory for a while)", prev->valuestring);
            return SRV_API_ERR_INVALID;
        }
    }
    if (!out->conv && !(out->conv = cJSON_CreateArray())) return OOM();
    if ((r = add_input(root, out->conv, err))) return r;
    /* the chat messages: instructions, then the conversation */
    cJSON *msgs = cJSON_AddArrayToObject(out->chat, "messages");
    if (!msgs) return OOM();
    if (out->instructions && srv_chat_add_message(msgs, "system", out->instructions, NULL, err)) return SRV_API_ERR_NOMEM;
    for (const cJSON *m = out->conv->child; m; m = m->next) {
        cJSON *d = cJSON_Duplicate(m, true);
        if (!d) return OOM();
        cJSON_AddItemToArray(msgs, d);
    }
    return 0;
}

int srv_responses_map_parse(const cJSON *root, srv_responses_map_lookup_fn lookup, void *ud, srv_responses_map_req *out,
                            srv_api_error *err) {
    memset(out, 0, sizeof *out);
    int r = map_all(root, lookup, ud, out, err);
    if (r) srv_responses_map_req_free(out);
    return r;
}

/* ---- output ----------------------------------------------------------------------------------------------------- */
cJSON *srv_responses_map_message_item(const char *id, const char *status, const char *text) {
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    cJSON *content = cJSON_CreateArray();
    bool ok = content && cJSON_AddStringToObject(m, "type", "message") && cJSON_AddStringToObject(m, "id", id) &&
              cJSON_AddStringToObject(m, "status", status) && cJSON_AddStringToObject(m, "role", "assistant");
    if (content) cJSON_AddItemToObject(m, "content", content);
    if (ok && text) {
        cJSON *p = cJSON_CreateObject();
        if (p) cJSON_AddItemToArray(content, p);
        ok = p && cJSON_AddStringToObject(p, "type", "output_text") && cJSON_AddStringToObject(p, "text", text) &&
             cJSON_AddArrayToObject(p, "annotations") && cJSON_AddArrayToObject(p, "logprobs");
    }
    if (!ok) { cJSON_Delete(m); return NULL; }
    return m;
}

cJSON *srv_responses_map_reasoning_item(const char *id, const char *status, const char *text) {
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    cJSON *content = cJSON_CreateArray();
    bool ok = content && cJSON_AddStringToObject(m, "type", "reasoning") && cJSON_AddStringToObject(m, "id", id) &&
              cJSON_AddArrayToObject(m, "summary") && cJSON_AddStringToObject(m, "status", status);
    if (content) cJSON_AddItemToObject(m, "content", content);
    if (ok && text) {
        cJSON *p = cJSON_CreateObject();
        if (p) cJSON_AddItemToArray(content, p);
        ok = p && cJSON_AddStringToObject(p, "type", "reasoning_text") && cJSON_AddStringToObject(p, "text", text);
    }
    if (!ok) { cJSON_Delete(m); return NULL; }
    return m;
}

cJSON *srv_responses_map_call_item(const char *id, const char *call_id, const char *name, const char *arguments,
                                   const char *status) {
    cJSON *c = cJSON_CreateObject();
    if (!c) return NULL;
    if (!cJSON_AddStringToObject(c, "type", "function_call") || !cJSON_AddStringToObject(c, "id", id) ||
        !cJSON_AddStringToObject(c, "call_id", call_id) || !cJSON_AddStringToObject(c, "name", name) ||
        !cJSON_AddStringToObject(c, "arguments", arguments) || !cJSON_AddStringToObject(c, "status", status)) {
        cJSON_Delete(c);
        return NULL;
    }
    return c;
}

void srv_responses_map_out_free(srv_responses_map_out *o) {
    if (!o) return;
    cJSON_Delete(o->items);
    cJSON_Delete(o->assistant);
    free(o->content);
    memset(o, 0, sizeof *o);
}

static int build_output(const char *text, size_t len, bool tools, bool parallel, const char *msg_id,
                        const char *seed, const char *status, srv_responses_map_out *out) {
    srv_tool_call_result tc;
    memset(&tc, 0, sizeof tc);
    if (tools && srv_tool_call_parse_first(text, len, parallel, &tc) != 0) return KVS_ERR_NOMEM;
    size_t cl = tc.n_calls > 0 ? tc.content_len : len;
    int rc = KVS_ERR_NOMEM;
    if (!(out->content = malloc(cl + 1))) goto out;
    if (cl) memcpy(out->content, text, cl);
    out->content[cl] = 0;
    out->n_calls = tc.n_calls;
    out->has_message = cl > 0 || tc.n_calls == 0;
    if (!(out->items = cJSON_CreateArray()) || !(out->assistant = cJSON_CreateObject())) goto out;
    if (!cJSON_AddStringToObject(out->assistant, "role", "assistant") ||
        !cJSON_AddStringToObject(out->assistant, "content", out->content))
        goto out;
    if (out->has_message) {
        cJSON *m = srv_responses_map_message_item(msg_id, status, out->content);
        if (!m) goto out;
        cJSON_AddItemToArray(out->items, m);
    }
    cJSON *calls = tc.n_calls ? cJSON_AddArrayToObject(out->assistant, "tool_calls") : NULL;
    if (tc.n_calls && !calls) goto out;
    for (int k = 0; k < tc.n_calls; k++) {
        char id[96], call_id[96];
        snprintf(id, sizeof id, "fc_%s_%d", seed, k);
        snprintf(call_id, sizeof call_id, "call_%s_%d", seed, k);
        cJSON *it = srv_responses_map_call_item(id, call_id, tc.calls[k].name, tc.calls[k].arguments, "completed");
        if (!it) goto out;
        cJSON_AddItemToArray(out->items, it);
        if (!srv_chat_add_tool_call(calls, call_id, tc.calls[k].name, tc.calls[k].arguments)) goto out;
    }
    rc = 0;
out:
    srv_tool_call_result_free(&tc);
    return rc;
}

int srv_responses_map_output(const char *text, size_t len, bool tools, bool parallel, const char *msg_id,
                             const char *seed, const char *status, srv_responses_map_out *out) {
    if (!out) return KVS_ERR_INVALID;
    memset(out, 0, sizeof *out);
    if ((!text && len) || !msg_id || !seed || !status) return KVS_ERR_INVALID;
    int rc = build_output(text ? text : "", len, tools, parallel, msg_id, seed, status, out);
    if (rc) srv_responses_map_out_free(out);
    return rc;
}
