/* chat.c: chat requests for the model's Jinja template (see chat_internal.h). */
#include "server/api/chat_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD(...) (srv_api_set_error(err, 400, NULL, pname, NULL, __VA_ARGS__), SRV_API_ERR_INVALID)

void srv_chat_req_free(srv_chat_req *r) {
    if (!r) return;
    cJSON_Delete(r->messages);
    cJSON_Delete(r->tools);
    cJSON_Delete(r->kwargs);
    free(r->tool_name);
    memset(r, 0, sizeof *r);
}

/* content: a string, text parts joined, or NULL (absent). */
static int content_of(const cJSON *c, cJSON **out) {
    *out = NULL;
    if (!c) return 0;
    if (cJSON_IsString(c)) return (*out = cJSON_CreateString(c->valuestring)) ? 0 : -2;
    kvs_buf b = {0};
    for (const cJSON *p = c->child; p; p = p->next) {
        const cJSON *tx = cJSON_IsObject(p) ? srv_api_json_field(p, "text") : NULL;
        if (!cJSON_IsString(tx)) { kvs_buf_free(&b); return -1; }
        if (kvs_buf_append(&b, tx->valuestring, strlen(tx->valuestring))) { kvs_buf_free(&b); return -2; }
    }
    *out = cJSON_CreateString(b.data ? b.data : "");
    kvs_buf_free(&b);
    return *out ? 0 : -2;
}

static int convert_tool_calls(const cJSON *tc, int i, cJSON *msg, srv_api_error *err) {
    char pname[64];
    snprintf(pname, sizeof pname, "messages[%d].tool_calls", i);
    if (!cJSON_IsArray(tc)) return BAD("'%s' must be an array", pname);
    cJSON *arr = cJSON_AddArrayToObject(msg, "tool_calls");
    if (!arr) return srv_api_set_nomem(err);
    int j = 0;
    for (const cJSON *c = tc->child; c; c = c->next, j++) {
        snprintf(pname, sizeof pname, "messages[%d].tool_calls[%d]", i, j);
        const cJSON *fn = cJSON_IsObject(c) ? srv_api_json_field(c, "function") : NULL;
        const cJSON *name = cJSON_IsObject(fn) ? srv_api_json_field(fn, "name") : NULL;
        if (!cJSON_IsString(name) || !name->valuestring[0])
            return BAD("'%s' must be an object with function.name a non-empty string", pname);
        cJSON *call = cJSON_Duplicate(c, true);
        if (!call) return srv_api_set_nomem(err);
        cJSON_AddItemToArray(arr, call);
        if (!srv_api_json_field(call, "type") && !cJSON_AddStringToObject(call, "type", "function"))
            return srv_api_set_nomem(err);
        cJSON *cfn = cJSON_GetObjectItemCaseSensitive(call, "function");
        cJSON *args = cJSON_GetObjectItemCaseSensitive(cfn, "arguments");
        if (!args || cJSON_IsNull(args)) {
            cJSON *o = cJSON_CreateObject();
            if (!o) return srv_api_set_nomem(err);
            if (args) cJSON_ReplaceItemInObjectCaseSensitive(cfn, "arguments", o);
            else cJSON_AddItemToObject(cfn, "arguments", o);
        } else if (cJSON_IsString(args)) {
            /* templates read arguments as an object (tojson, items()): parse the client's JSON string */
            cJSON *o = cJSON_Parse(args->valuestring);
            if (!cJSON_IsObject(o)) {
                cJSON_Delete(o);
                snprintf(pname, sizeof pname, "messages[%d].tool_calls[%d].function.arguments", i, j);
                return BAD("'%s' must be a JSON object or a string holding one", pname);
            }
            cJSON_ReplaceItemInObjectCaseSensitive(cfn, "arguments", o);
        } else if (!cJSON_IsObject(args)) {
            snprintf(pname, sizeof pname, "messages[%d].tool_calls[%d].function.arguments", i, j);
            return BAD("'%s' must be a JSON object or a string holding one", pname);
        }
    }
    return 0;
}

static int parse_tools(const cJSON *root, srv_chat_req *out, srv_api_error *err) {
    const char *pname = "tools";
    const cJSON *tools = srv_api_json_field(root, "tools");
    if (tools) {
        if (!cJSON_IsArray(tools)) return BAD("'tools' must be an array");
        int j = 0;
        for (const cJSON *t = tools->child; t; t = t->next, j++) {
            const cJSON *ty = cJSON_IsObject(t) ? srv_api_json_field(t, "type") : NULL;
            const cJSON *fn = cJSON_IsObject(t) ? srv_api_json_field(t, "function") : NULL;
            const cJSON *name = cJSON_IsObject(fn) ? srv_api_json_field(fn, "name") : NULL;
            if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(name) ||
                !name->valuestring[0])
                return BAD("'tools[%d]' must be {\"type\": \"function\", \"function\": {\"name\": ...}}", j);
        }
    }
    out->parallel_tool_calls = true;
    pname = "parallel_tool_calls";
    const cJSON *ptc = srv_api_json_field(root, pname);
    if (ptc && !cJSON_IsBool(ptc)) return BAD("'parallel_tool_calls' must be a boolean");
    if (ptc) out->parallel_tool_calls = cJSON_IsTrue(ptc);
    pname = "tool_choice";
    const cJSON *tc = srv_api_json_field(root, pname);
    bool have = tools && cJSON_GetArraySize(tools) > 0;
    if (cJSON_IsString(tc)) {
        const char *s = tc->valuestring;
        if (!strcmp(s, "none")) out->tool_choice = SRV_CHAT_TOOL_CHOICE_NONE;
        else if (!strcmp(s, "auto")) out->tool_choice = SRV_CHAT_TOOL_CHOICE_AUTO;
        else if (!strcmp(s, "required")) out->tool_choice = SRV_CHAT_TOOL_CHOICE_REQUIRED;
        else return BAD("'tool_choice' must be \"none\", \"auto\", \"required\" or a function, got '%s'", s);
    } else if (cJSON_IsObject(tc)) {
        const cJSON *fn = srv_api_json_field(tc, "function");
        const cJSON *name = cJSON_IsObject(fn) ? srv_api_json_field(fn, "name") : NULL;
        if (!cJSON_IsString(name)) return BAD("'tool_choice' must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}");
        bool found = false;
        for (const cJSON *t = have ? tools->child : NULL; t && !found; t = t->next)
            found = !strcmp(srv_api_json_field(srv_api_json_field(t, "function"), "name")->valuestring,
                            name->valuestring);
        if (!found) return BAD("'tool_choice' names function '%s', which is not in 'tools'", name->valuestring);
        out->tool_choice = SRV_CHAT_TOOL_CHOICE_NAMED;
        if (!(out->tool_name = strdup(name->valuestring))) return srv_api_set_nomem(err);
    } else if (tc) {
        return BAD("'tool_choice' must be a string or an object");
    }
    if (out->tool_choice == SRV_CHAT_TOOL_CHOICE_REQUIRED && !have)
        return BAD("'tool_choice' \"required\" needs a non-empty 'tools'");
    if (have && out->tool_choice != SRV_CHAT_TOOL_CHOICE_NONE && !(out->tools = cJSON_Duplicate(tools, true)))
        return srv_api_set_nomem(err);
    return 0;
}

/* chat_template_kwargs and reasoning_effort into out->kwargs, on top of enable_thinking: true (as llama.cpp). */
static int parse_kwargs(const cJSON *root, srv_chat_req *out, srv_api_error *err) {
    static const char *const RESERVED[] = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"};
    const char *pname = "chat_template_kwargs";
    if (!(out->kwargs = cJSON_CreateObject()) || !cJSON_AddTrueToObject(out->kwargs, "enable_thinking"))
        return srv_api_set_nomem(err);
    const cJSON *kw = srv_api_json_field(root, pname);
    if (kw && !cJSON_IsObject(kw)) return BAD("'%s' must be an object, got %s", pname, srv_api_json_kind(kw));
    for (const cJSON *v = kw ? kw->child : NULL; v; v = v->next) {
        for (size_t k = 0; k < sizeof RESERVED / sizeof RESERVED[0]; k++)
            if (!strcmp(v->string, RESERVED[k]))
                return BAD("'%s.%s' cannot be set: the server sets it from the request", pname, v->string);
        if (!strcmp(v->string, "enable_thinking") && !cJSON_IsBool(v))
            return BAD("'%s.enable_thinking' must be a boolean, got %s", pname, srv_api_json_kind(v));
        cJSON *d = cJSON_Duplicate(v, true);
        if (!d) return srv_api_set_nomem(err);
        cJSON_DeleteItemFromObjectCaseSensitive(out->kwargs, v->string);
        cJSON_AddItemToObject(out->kwargs, v->string, d);
    }
    pname = "reasoning_effort";
    const cJSON *re = srv_api_json_field(root, pname);
    if (!re) return 0;
    static const char *const EFFORT[] = {"none", "minimal", "low", "medium", "high"};
    size_t k = 0;
    while (cJSON_IsString(re) && k < 5 && strcmp(re->valuestring, EFFORT[k])) k++;
    if (!cJSON_IsString(re) || k == 5)
        return BAD("'%s' must be one of \"none\", \"minimal\", \"low\", \"medium\", \"high\"", pname);
    cJSON_DeleteItemFromObjectCaseSensitive(out->kwargs, pname);
    if (k == 0) { /* "none": no thinking at all */
        cJSON_DeleteItemFromObjectCaseSensitive(out->kwargs, "enable_thinking");
        return cJSON_AddFalseToObject(out->kwargs, "enable_thinking") ? 0 : srv_api_set_nomem(err);
    }
    return cJSON_AddStringToObject(out->kwargs, pname, re->valuestring) ? 0 : srv_api_set_nomem(err);
}

int srv_chat_parse(const cJSON *root, srv_chat_req *out, srv_api_error *err) {
    memset(out, 0, sizeof *out);
    char pname[64] = "messages";
    const cJSON *msgs = srv_api_json_field(root, "messages");
    if (!cJSON_IsArray(msgs) || !msgs->child) return BAD("'messages' must be a non-empty array");
    if (!(out->messages = cJSON_CreateArray())) return srv_api_set_nomem(err);
    int i = 0, r;
    const cJSON *last = NULL;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        snprintf(pname, sizeof pname, "messages[%d]", i);
        const cJSON *role = cJSON_IsObject(m) ? srv_api_json_field(m, "role") : NULL;
        if (!cJSON_IsString(role)) { r = BAD("'%s' must be an object with a string role", pname); goto fail; }
        cJSON *o = cJSON_CreateObject();
        if (!o) { r = srv_api_set_nomem(err); goto fail; }
        cJSON_AddItemToArray(out->messages, o);
        const char *rs = !strcmp(role->valuestring, "developer") ? "system" : role->valuestring;
        if (!cJSON_AddStringToObject(o, "role", rs)) { r = srv_api_set_nomem(err); goto fail; }
        cJSON *content = NULL;
        int c = content_of(srv_api_json_field(m, "content"), &content);
        if (c == -1) { snprintf(pname, sizeof pname, "messages[%d].content", i); r = BAD("'%s' parts must have a string text", pname); goto fail; }
        if (c == -2) { r = srv_api_set_nomem(err); goto fail; }
        if (!content && !(content = cJSON_CreateString(""))) { r = srv_api_set_nomem(err); goto fail; }
        cJSON_AddItemToObject(o, "content", content);
        const cJSON *tcs = srv_api_json_field(m, "tool_calls");
        if (tcs && (r = convert_tool_calls(tcs, i, o, err)) != 0) goto fail;
        static const char *const KEEP[] = {"tool_call_id", "name", "reasoning_content"};
        for (size_t k = 0; k < sizeof KEEP / sizeof KEEP[0]; k++) {
            const cJSON *v = srv_api_json_field(m, KEEP[k]);
            if (cJSON_IsString(v) && !cJSON_AddStringToObject(o, KEEP[k], v->valuestring)) {
                r = srv_api_set_nomem(err);
                goto fail;
            }
        }
        last = o;
    }
    out->prefill = last && !strcmp(cJSON_GetObjectItemCaseSensitive(last, "role")->valuestring, "assistant") &&
                   !cJSON_GetObjectItemCaseSensitive(last, "tool_calls");
    if ((r = parse_tools(root, out, err)) != 0) goto fail;
    if ((r = parse_kwargs(root, out, err)) != 0) goto fail;
    return 0;
fail:
    srv_chat_req_free(out);
    return r;
}

/* ---- rendering ------------------------------------------------------------------------------------------- */
static int render_vars(const tpl_template *t, cJSON *messages, const srv_chat_req *r, bool add_gen,
                       const char *bos, const char *eos, tpl_output *out, tpl_error *te) {
    cJSON *vars = cJSON_CreateObject();
    if (!vars) return KVS_ERR_NOMEM;
    for (const cJSON *k = r->kwargs ? r->kwargs->child : NULL; k; k = k->next)
        cJSON_AddItemReferenceToObject(vars, k->string, (cJSON *)k);
    cJSON_AddItemReferenceToObject(vars, "messages", messages);
    if (r->tools) cJSON_AddItemReferenceToObject(vars, "tools", r->tools);
    cJSON_AddBoolToObject(vars, "add_generation_prompt", add_gen);
    cJSON_AddStringToObject(vars, "bos_token", bos ? bos : "");
    cJSON_AddStringToObject(vars, "eos_token", eos ? eos : "");
    tpl_render_params p = {.vars = vars, .now = NULL, .mark_content = true, .max_ms = r->render_ms,
                           .max_alloc_bytes = r->render_bytes, .cancel = r->cancel};
    int rc = tpl_render(t, &p, out, te);
    cJSON_Delete(vars);
    return rc;
}

/* The messages with every system message folded into the next user message, as llama.cpp's --jinja does for a
 * template without a system role: consecutive system texts are joined with "\n", a user message that follows
 * becomes "SYSTEM\nUSER" (just SYSTEM when its content is empty), and system text followed by another role (or
 * by nothing) becomes a user message of its own. NULL when out of memory. */
static cJSON *fold_system(const cJSON *messages) {
    cJSON *m = cJSON_CreateArray();
    kvs_buf pend = {0};
    bool has_pend = false;
    if (!m) return NULL;
    for (const cJSON *it = messages->child; it; it = it->next) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        const char *cs = cJSON_IsString(c) ? c->valuestring : "";
        bool is_sys = cJSON_IsString(role) && !strcmp(role->valuestring, "system");
        bool is_user = cJSON_IsString(role) && !strcmp(role->valuestring, "user");
        if (is_sys) {
            if (!cs[0]) continue;
            if ((has_pend && kvs_buf_append(&pend, "\n", 1) != 0) || kvs_buf_append(&pend, cs, strlen(cs)) != 0)
                goto oom;
            has_pend = true;
            continue;
        }
        if (has_pend && !is_user) { /* flush the system text as a user message of its own */
            cJSON *u = cJSON_CreateObject();
            if (!u || !cJSON_AddItemToArray(m, u) || !cJSON_AddStringToObject(u, "role", "user") ||
                !cJSON_AddStringToObject(u, "content", pend.data))
                goto oom;
            pend.len = 0;
            has_pend = false;
        }
        cJSON *d = cJSON_Duplicate(it, true);
        if (!d || !cJSON_AddItemToArray(m, d)) { cJSON_Delete(d); goto oom; }
        if (has_pend) { /* a user message after system text */
            if (cs[0] && (kvs_buf_append(&pend, "\n", 1) != 0 || kvs_buf_append(&pend, cs, strlen(cs)) != 0))
                goto oom;
            cJSON *ns = cJSON_CreateString(pend.data);
            if (!ns) goto oom;
            if (cJSON_GetObjectItemCaseSensitive(d, "content")) cJSON_ReplaceItemInObjectCaseSensitive(d, "content", ns);
            else cJSON_AddItemToObject(d, "content", ns);
            pend.len = 0;
            has_pend = false;
        }
    }
    if (has_pend) {
        cJSON *u = cJSON_CreateObject();
        if (!u || !cJSON_AddItemToArray(m, u) || !cJSON_AddStringToObject(u, "role", "user") ||
            kvs_buf_append(&pend, "", 1) != 0 || !cJSON_AddStringToObject(u, "content", (char *)pend.data))
            goto oom;
    }
    kvs_buf_free(&pend);
    return m;
oom:
    kvs_buf_free(&pend);
    cJSON_Delete(m);
    return NULL;
}

/* Whether the conversation has a system message with text. */
static bool has_system_text(const cJSON *messages) {
    for (const cJSON *it = messages->child; it; it = it->next) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "system") && cJSON_IsString(c) && c->valuestring[0])
            return true;
    }
    return false;
}

/* Whether every system message's text (or its whitespace-trimmed form) appears in the rendering. */
static bool system_text_printed(const cJSON *messages, const tpl_output *o) {
    for (const cJSON *it = messages->child; it; it = it->next) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsString(role) || strcmp(role->valuestring, "system") || !cJSON_IsString(c)) continue;
        const char *s = c->valuestring;
        size_t b = 0, e = strlen(s);
        while (b < e && strchr(" \t\r\n", s[b])) b++;
        while (e > b && strchr(" \t\r\n", s[e - 1])) e--;
        if (e == b) continue;
        bool found = false;
        for (size_t k = 0; !found && k + (e - b) <= o->len; k++)
            found = o->text[k] == s[b] && !memcmp(o->text + k, s + b, e - b);
        if (!found) return false;
    }
    return true;
}

static int render_vars(const tpl_template *t, cJSON *messages, const srv_chat_req *r, bool add_gen,
                       const char *bos, const char *eos, tpl_output *out, tpl_error *te);

/* Whether template t has a system role (llama.cpp's probe): a conversation of a system message holding a
 * sentinel and a user message renders, and prints the sentinel. */
static bool template_has_system_role(const tpl_template *t, const srv_chat_req *r, const char *bos,
                                     const char *eos) {
    static const char SENTINEL[] = "<kvserve system probe 7c1d>";
    cJSON *probe = cJSON_CreateArray(), *sys = cJSON_CreateObject(), *user = cJSON_CreateObject();
    if (!probe || !sys || !cJSON_AddItemToArray(probe, sys)) cJSON_Delete(sys);
    if (!probe || !user || !cJSON_AddItemToArray(probe, user)) cJSON_Delete(user);
    if (cJSON_GetArraySize(probe) != 2 || !cJSON_AddStringToObject(sys, "role", "system") ||
        !cJSON_AddStringToObject(sys, "content", SENTINEL) || !cJSON_AddStringToObject(user, "role", "user") ||
        !cJSON_AddStringToObject(user, "content", "x")) {
        cJSON_Delete(probe);
        return true; /* out of memory: keep the rendering we have */
    }
    tpl_output o = {0};
    tpl_error te = {0};
    int rc = render_vars(t, probe, r, true, bos, eos, &o, &te);
    bool has = rc != 0 ? rc == KVS_ERR_NOMEM : strstr(o.text, SENTINEL) != NULL;
    if (rc == 0) tpl_output_free(&o);
    cJSON_Delete(probe);
    return has;
}

static int render_err(srv_api_error *err, int rc, const tpl_error *te) {
    if (rc == KVS_ERR_NOMEM) return srv_api_set_nomem(err);
    if (rc == KVS_ERR_CLOSED) { /* abandoned: the client went away */
        srv_api_set_error(err, 499, NULL, NULL, NULL, "the client closed the request");
        return SRV_API_ERR_INVALID;
    }
    /* a budget reached: name the settings that set it (docs/CONFIG.md) */
    const char *hint = rc != KVS_ERR_LIMIT                      ? ""
                       : strstr(te->msg, "time limit")          ? " (the server's template_ms)"
                       : strstr(te->msg, "allocation budget")   ? " (the server's template_mb)"
                                                                : "";
    srv_api_set_error(err, 400, NULL, "messages", NULL, "the chat template failed on these messages: %s%s",
                      te->msg[0] ? te->msg : kvs_strerror(rc), hint);
    return SRV_API_ERR_INVALID;
}

/* Cuts o at byte `end`, dropping spans past it. */
static void cut_output(tpl_output *o, size_t end) {
    o->len = end;
    o->text[end] = 0;
    size_t k = 0;
    for (size_t i = 0; i < o->n_spans; i++) {
        if (o->spans[i].off >= end) break;
        if (o->spans[i].off + o->spans[i].len > end) o->spans[i].len = end - o->spans[i].off;
        k++;
    }
    o->n_spans = k;
}

static const char *last_find(const char *h, size_t hl, const char *n, size_t nl) {
    if (nl == 0 || nl > hl) return NULL;
    for (size_t i = hl - nl + 1; i-- > 0;)
        if (h[i] == n[0] && !memcmp(h + i, n, nl)) return h + i;
    return NULL;
}

int srv_chat_render(const tpl_template *t, const srv_chat_req *r, const char *bos, const char *eos,
                    tpl_output *out, srv_api_error *err) {
    memset(out, 0, sizeof *out);
    cJSON *msgs = r->messages, *owned = NULL;
    const cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const cJSON *lc = last ? cJSON_GetObjectItemCaseSensitive(last, "content") : NULL;
    const char *pre = r->prefill && cJSON_IsString(lc) ? lc->valuestring : "";
    bool empty_prefill = r->prefill && !pre[0];
    if (empty_prefill) { /* nothing to continue: the turn before it with a generation prompt */
        if (!(owned = cJSON_Duplicate(msgs, true))) return srv_api_set_nomem(err);
        cJSON_DeleteItemFromArray(owned, cJSON_GetArraySize(owned) - 1);
        msgs = owned;
    }
    bool add_gen = !r->prefill || empty_prefill;
    tpl_error te = {0};
    int rc = cJSON_GetArraySize(msgs) > 0 ? render_vars(t, msgs, r, add_gen, bos, eos, out, &te) : KVS_ERR_INVALID;
    /* a template without a system role (it raises, or prints no system text): fold the system messages into
     * the user turns and render again */
    bool fold = rc == KVS_ERR_RAISED ||
                (rc == 0 && !system_text_printed(msgs, out) && !template_has_system_role(t, r, bos, eos));
    if (fold && has_system_text(msgs)) {
        cJSON *merged = fold_system(msgs);
        if (merged) {
            tpl_error te2 = {0};
            tpl_output o2 = {0};
            int rc2 = render_vars(t, merged, r, add_gen, bos, eos, &o2, &te2);
            cJSON_Delete(merged);
            if (rc2 == 0) {
                if (rc == 0) tpl_output_free(out);
                *out = o2;
                rc = 0;
            }
        } else if (rc == 0) {
            tpl_output_free(out);
            rc = KVS_ERR_NOMEM;
        }
    }
    cJSON_Delete(owned);
    if (rc != 0) return render_err(err, rc, &te);
    if (r->prefill && !empty_prefill) {
        /* continue the last assistant message: cut right after its content (as printed, or trimmed) */
        size_t pl = strlen(pre), b = 0, e = pl;
        const char *f = last_find(out->text, out->len, pre, pl);
        if (!f) {
            while (b < e && strchr(" \t\r\n", pre[b])) b++;
            while (e > b && strchr(" \t\r\n", pre[e - 1])) e--;
            f = last_find(out->text, out->len, pre + b, e - b);
        }
        if (!f) {
            tpl_output_free(out);
            srv_api_set_error(err, 400, NULL, "messages", NULL,
                              "the chat template does not print the final assistant message, so it cannot be "
                              "continued");
            return SRV_API_ERR_INVALID;
        }
        cut_output(out, (size_t)(f - out->text) + (e - b));
    }
    return 0;
}

int srv_chat_find_spans(const char *text, size_t len, const srv_api_msg *msgs, int32_t n_msgs,
                        tpl_span **spans, size_t *n_spans) {
    *spans = NULL;
    *n_spans = 0;
    tpl_span *s = calloc((size_t)n_msgs + 1, sizeof *s);
    if (!s) return KVS_ERR_NOMEM;
    size_t pos = 0, n = 0;
    for (int32_t i = 0; i < n_msgs; i++) {
        const char *c = msgs[i].content;
        if (!c) continue;
        size_t b = 0, e = strlen(c);
        while (b < e && strchr(" \t\r\n", c[b])) b++;
        while (e > b && strchr(" \t\r\n", c[e - 1])) e--;
        if (e == b) continue;
        const char *f = NULL;
        for (size_t k = pos; !f && k + (e - b) <= len; k++)
            if (!memcmp(text + k, c + b, e - b)) f = text + k;
        if (!f) continue;
        size_t off = (size_t)(f - text);
        if (n > 0 && s[n - 1].off + s[n - 1].len == off) s[n - 1].len += e - b;
        else { s[n].off = off; s[n].len = e - b; n++; }
        pos = off + (e - b);
    }
    if (n == 0) { free(s); return 0; }
    *spans = s;
    *n_spans = n;
    return 0;
}

int srv_chat_add_message(cJSON *msgs, const char *role, const char *content, cJSON **m, srv_api_error *err) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return srv_api_set_nomem(err);
    cJSON_AddItemToArray(msgs, o);
    if (!cJSON_AddStringToObject(o, "role", role) || !cJSON_AddStringToObject(o, "content", content))
        return srv_api_set_nomem(err);
    if (m) *m = o;
    return 0;
}

bool srv_chat_add_tool_call(cJSON *calls, const char *id, const char *name, const char *args) {
    cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    if (!c || !fn) { cJSON_Delete(c); cJSON_Delete(fn); return false; }
    cJSON_AddItemToArray(calls, c);
    bool ok = cJSON_AddStringToObject(c, "id", id) && cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddItemToObject(c, "function", fn);
    return ok && cJSON_AddStringToObject(fn, "name", name) && cJSON_AddStringToObject(fn, "arguments", args);
}

const char *srv_chat_call_name(const cJSON *msgs, const char *id) {
    for (const cJSON *m = msgs->child; m; m = m->next) {
        const cJSON *calls = srv_api_json_field(m, "tool_calls");
        for (const cJSON *c = calls ? calls->child : NULL; c; c = c->next) {
            const char *cid = srv_api_json_str(c, "id");
            if (cid && !strcmp(cid, id)) return srv_api_json_str(srv_api_json_field(c, "function"), "name");
        }
    }
    return NULL;
}
