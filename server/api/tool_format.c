/* tool_format.c: tool-call formats, their grammars and prompts (see tool_format_internal.h and api.h). */
#include "server/api/tool_format_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const NAMES[] = {"generic", "hermes", "llama3", "mistral"};

const char *srv_tool_format_name(srv_tool_format f) {
    return (int)f >= 0 && (int)f < (int)(sizeof NAMES / sizeof *NAMES) ? NAMES[f] : "generic";
}

srv_tool_format srv_tool_format_detect(const char *t, eng_chat_family family) {
    if (t && strstr(t, "<tool_call>")) return SRV_TOOL_FORMAT_HERMES;
    if (t && strstr(t, "[TOOL_CALLS]")) return SRV_TOOL_FORMAT_MISTRAL;
    if (t && strstr(t, "<|python_tag|>")) return SRV_TOOL_FORMAT_LLAMA3;
    if (family == ENG_CHAT_AUTO) family = t ? eng_chat_detect(t) : ENG_CHAT_AUTO;
    switch (family) {
    case ENG_CHAT_AUTO: /* rendered as ChatML */
    case ENG_CHAT_CHATML: return SRV_TOOL_FORMAT_HERMES;
    case ENG_CHAT_LLAMA3: return SRV_TOOL_FORMAT_LLAMA3;
    case ENG_CHAT_MISTRAL: return SRV_TOOL_FORMAT_MISTRAL;
    default: return SRV_TOOL_FORMAT_GENERIC;
    }
}

/* ---- the pieces of a call in each format ------------------------------------------------------------------ */

typedef struct shape {
    const char *pre;      /* before the name (a JSON string) */
    const char *mid;      /* between the name and the arguments object */
    const char *post;     /* after the arguments */
    const char *sep;      /* between two calls */
    const char *open;     /* before the calls when there may be several (NULL: none) */
    const char *close;
} shape;

static shape shape_of(srv_tool_format f) {
    switch (f) {
    case SRV_TOOL_FORMAT_HERMES:
        return (shape){"<tool_call>\n{\"name\": ", ", \"arguments\": ", "}\n</tool_call>", "\n", NULL, NULL};
    case SRV_TOOL_FORMAT_LLAMA3:
        return (shape){"{\"name\": ", ", \"parameters\": ", "}", ", ", "[", "]"};
    case SRV_TOOL_FORMAT_MISTRAL:
        return (shape){"{\"name\": ", ", \"arguments\": ", "}", ", ", "[TOOL_CALLS][", "]"};
    default:
        return (shape){"{\"name\": ", ", \"arguments\": ", "}", ", ", "[", "]"};
    }
}

/* ---- grammars ------------------------------------------------------------------------------------------- */

static const cJSON *tool_fn(const cJSON *tool) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
    return cJSON_IsObject(fn) ? fn : NULL;
}

static const char *tool_name(const cJSON *tool) {
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(tool_fn(tool), "name");
    return cJSON_IsString(n) ? n->valuestring : NULL;
}

static bool selected(const srv_tool_format_choice *ch, const cJSON *tool) {
    const char *n = tool_name(tool);
    return n && n[0] && (!ch->name || !strcmp(ch->name, n));
}

char *srv_tool_format_key(const srv_tool_format_choice *ch) {
    if (!ch || !cJSON_IsArray(ch->tools)) return NULL;
    cJSON *k = cJSON_CreateObject();
    cJSON *t = k ? cJSON_AddArrayToObject(k, "t") : NULL;
    bool ok = t && cJSON_AddStringToObject(k, "f", srv_tool_format_name(ch->format)) &&
              cJSON_AddBoolToObject(k, "p", ch->parallel) &&
              (ch->name ? cJSON_AddStringToObject(k, "n", ch->name) : cJSON_AddNullToObject(k, "n"));
    for (const cJSON *tool = ch->tools->child; ok && tool; tool = tool->next) {
        if (!selected(ch, tool)) continue;
        cJSON *pair = cJSON_CreateArray();
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(tool_fn(tool), "parameters");
        cJSON *pd = p ? cJSON_Duplicate(p, true) : cJSON_CreateNull();
        cJSON *nm = cJSON_CreateString(tool_name(tool));
        ok = pair && pd && nm;
        if (ok) {
            cJSON_AddItemToArray(t, pair);
            cJSON_AddItemToArray(pair, nm);
            cJSON_AddItemToArray(pair, pd);
        } else {
            cJSON_Delete(pair);
            cJSON_Delete(pd);
            cJSON_Delete(nm);
        }
    }
    char *json = ok ? cJSON_PrintUnformatted(k) : NULL;
    cJSON_Delete(k);
    if (!json) return NULL;
    size_t n = strlen(json);
    char *key = malloc(n + 2);
    if (key) {
        key[0] = '\x02';
        memcpy(key + 1, json, n + 1);
    }
    free(json);
    return key;
}

/* A BNF string literal of s (the grammar's escapes). */
static void put_literal(kvs_buf *b, const char *s) {
    kvs_buf_putc(b, '"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            kvs_buf_putc(b, '\\');
            kvs_buf_putc(b, (char)c);
        } else if (c == '\n') {
            kvs_buf_puts(b, "\\n");
        } else if (c < 0x20 || c == 0x7f) {
            kvs_buf_printf(b, "\\x%02X", c);
        } else {
            kvs_buf_putc(b, (char)c);
        }
    }
    kvs_buf_putc(b, '"');
}

/* The schema a function's arguments are compiled with: its parameters, typed as an object. */
static int params_schema(const cJSON *fn, cJSON **out, char *err, size_t err_len) {
    *out = NULL;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    if (!p || cJSON_IsNull(p)) { /* OpenAI: an empty parameter list */
        *out = cJSON_Parse("{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}");
        return *out ? 0 : KVS_ERR_NOMEM;
    }
    if (cJSON_IsTrue(p)) {
        *out = cJSON_Parse("{\"type\":\"object\"}");
        return *out ? 0 : KVS_ERR_NOMEM;
    }
    if (!cJSON_IsObject(p)) return kvs_errf(err, err_len, KVS_ERR_TYPE, "parameters must be a JSON Schema object");
    cJSON *s = cJSON_Duplicate(p, true);
    if (!s) return KVS_ERR_NOMEM;
    cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    bool object = !ty;
    if (cJSON_IsString(ty)) object = !strcmp(ty->valuestring, "object");
    for (const cJSON *it = cJSON_IsArray(ty) ? ty->child : NULL; it; it = it->next)
        if (cJSON_IsString(it) && !strcmp(it->valuestring, "object")) object = true;
    if (!object) {
        cJSON_Delete(s);
        return kvs_errf(err, err_len, KVS_ERR_TYPE, "parameters must describe an object (\"type\": \"object\")");
    }
    /* no type: an object, unless the schema says what it is otherwise (a $ref or combinator allows no sibling
     * type; what it leads to is the client's to make an object) */
    static const char *const DEFINERS[] = {"$ref", "anyOf", "oneOf", "allOf", "enum", "const"};
    bool defined = false;
    for (size_t i = 0; i < sizeof DEFINERS / sizeof *DEFINERS; i++)
        defined = defined || cJSON_GetObjectItemCaseSensitive(s, DEFINERS[i]);
    if (ty || !defined) {
        cJSON *obj = cJSON_CreateString("object");
        if (!obj) { cJSON_Delete(s); return KVS_ERR_NOMEM; }
        if (ty) cJSON_ReplaceItemInObjectCaseSensitive(s, "type", obj);
        else cJSON_AddItemToObject(s, "type", obj);
    }
    /* the OpenAPI nullable of the top level would let the arguments be null, which is not a call */
    cJSON_DeleteItemFromObjectCaseSensitive(s, "nullable");
    *out = s;
    return 0;
}

/* One call alternative: the literal up to the arguments, @pI, the literal after them. */
static void put_call(kvs_buf *b, const shape *sh, const char *name, int i) {
    cJSON *n = cJSON_CreateString(name);
    char *nj = n ? cJSON_PrintUnformatted(n) : NULL;
    cJSON_Delete(n);
    if (!nj) { b->oom = true; return; }
    kvs_buf head = {0};
    kvs_buf_puts(&head, sh->pre);
    kvs_buf_puts(&head, nj);
    kvs_buf_puts(&head, sh->mid);
    free(nj);
    if (head.oom) { b->oom = true; kvs_buf_free(&head); return; }
    put_literal(b, head.data);
    kvs_buf_free(&head);
    kvs_buf_printf(b, " @p%d ", i);
    put_literal(b, sh->post);
}

int srv_tool_format_compile(const srv_tool_format_choice *ch, gmr_grammar **out, char *err, size_t err_len) {
    if (err && err_len) err[0] = 0;
    if (!out) return KVS_ERR_INVALID;
    *out = NULL;
    if (!ch || !cJSON_IsArray(ch->tools)) return kvs_errf(err, err_len, KVS_ERR_INVALID, "no tools");
    int n = 0;
    for (const cJSON *t = ch->tools->child; t; t = t->next) n += selected(ch, t);
    if (n == 0 && ch->name) return kvs_errf(err, err_len, KVS_ERR_INVALID, "no function named '%s' in tools", ch->name);
    if (n == 0) return kvs_errf(err, err_len, KVS_ERR_INVALID, "no tools");
    gmr_named_grammar *named = calloc((size_t)n, sizeof *named);
    char(*pnames)[16] = calloc((size_t)n, sizeof *pnames);
    kvs_buf b = {0};
    int rc = named && pnames ? 0 : KVS_ERR_NOMEM;
    shape sh = shape_of(ch->format);
    /* arguments are read by programs, and models write them on one line (", " and ": "): one byte of
     * whitespace between two JSON tokens, so that a weak model cannot spend its tokens on blank space */
    gmr_schema_options opts;
    gmr_schema_options_default(&opts);
    opts.max_ws = 1;
    kvs_buf_puts(&b, "call ::= ");
    int k = 0, i = 0;
    for (const cJSON *t = ch->tools->child; t && rc == 0; t = t->next, i++) {
        if (!selected(ch, t)) continue;
        cJSON *schema = NULL;
        char msg[320] = "";
        rc = params_schema(tool_fn(t), &schema, msg, sizeof msg);
        gmr_grammar *g = NULL;
        if (rc == 0) rc = gmr_compile_schema(schema, &opts, &g, msg, sizeof msg);
        cJSON_Delete(schema);
        if (rc != 0) {
            if (rc != KVS_ERR_NOMEM)
                kvs_errf(err, err_len, rc, "tools[%d] (function '%s'): %s", i, tool_name(t),
                         msg[0] ? msg : kvs_strerror(rc));
            break;
        }
        snprintf(pnames[k], sizeof pnames[k], "p%d", k);
        named[k].name = pnames[k];
        named[k].grammar = g;
        if (k > 0) kvs_buf_puts(&b, "\n  | ");
        put_call(&b, &sh, tool_name(t), k);
        k++;
    }
    if (rc == 0) {
        kvs_buf_puts(&b, "\nroot ::= ");
        if (sh.open && (ch->parallel || ch->format == SRV_TOOL_FORMAT_MISTRAL)) {
            /* Llama 3 and generic: a single call is also a bare object */
            if (ch->format != SRV_TOOL_FORMAT_MISTRAL) kvs_buf_puts(&b, "call | ");
            put_literal(&b, sh.open);
            kvs_buf_puts(&b, " call ");
            if (ch->parallel) {
                kvs_buf_puts(&b, "(");
                put_literal(&b, sh.sep);
                kvs_buf_puts(&b, " call)* ");
            }
            put_literal(&b, sh.close);
        } else if (ch->parallel) {
            kvs_buf_puts(&b, "call (");
            put_literal(&b, sh.sep);
            kvs_buf_puts(&b, " call)*");
        } else {
            kvs_buf_puts(&b, "call");
        }
        kvs_buf_putc(&b, '\n');
        if (b.oom) rc = KVS_ERR_NOMEM;
    }
    if (rc == 0) {
        char msg[320] = "";
        rc = gmr_compile_bnf(b.data, named, (size_t)k, out, msg, sizeof msg);
        if (rc != 0 && rc != KVS_ERR_NOMEM)
            kvs_errf(err, err_len, rc, "the tool-call grammar does not compile: %s", msg);
    }
    for (int j = 0; named && j < k; j++) gmr_grammar_free((gmr_grammar *)named[j].grammar);
    free(named);
    free(pnames);
    kvs_buf_free(&b);
    if (rc == KVS_ERR_NOMEM) kvs_errf(err, err_len, rc, "out of memory");
    return rc;
}

/* ---- prompts -------------------------------------------------------------------------------------------- */

static void put_json(kvs_buf *b, const cJSON *v) {
    char *s = cJSON_PrintUnformatted(v);
    if (!s) { b->oom = true; return; }
    kvs_buf_puts(b, s);
    free(s);
}

int srv_tool_format_prompt(srv_tool_format f, const cJSON *tools, kvs_buf *b) {
    if (!b) return KVS_ERR_INVALID;
    const cJSON *t;
    switch (f) {
    case SRV_TOOL_FORMAT_HERMES:
        kvs_buf_puts(b, "# Tools\n\nYou may call functions to answer. Their signatures are inside <tools></tools>:\n"
                        "<tools>");
        cJSON_ArrayForEach(t, tools) { kvs_buf_putc(b, '\n'); put_json(b, t); }
        kvs_buf_puts(b, "\n</tools>\n\nTo call a function, write its name and arguments as a JSON object inside "
                        "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                        "<arguments-object>}\n</tool_call>");
        break;
    case SRV_TOOL_FORMAT_LLAMA3:
        kvs_buf_puts(b, "You may call the functions below. To call one, answer with only a JSON object of the form "
                        "{\"name\": function name, \"parameters\": object of argument names and values}.");
        cJSON_ArrayForEach(t, tools) { kvs_buf_puts(b, "\n\n"); put_json(b, t); }
        break;
    case SRV_TOOL_FORMAT_MISTRAL:
        kvs_buf_puts(b, "[AVAILABLE_TOOLS] ");
        put_json(b, tools);
        kvs_buf_puts(b, "[/AVAILABLE_TOOLS]\nTo call functions, answer with [TOOL_CALLS] followed by a JSON array of "
                        "{\"name\": function name, \"arguments\": object} objects.");
        break;
    default:
        kvs_buf_puts(b, "You may call the functions below (each with the JSON Schema of its parameters):");
        cJSON_ArrayForEach(t, tools) {
            const cJSON *fn = tool_fn(t);
            kvs_buf_putc(b, '\n');
            put_json(b, fn ? fn : t);
        }
        kvs_buf_puts(b, "\nTo call one, answer with only a JSON object {\"name\": function name, \"arguments\": "
                        "object}; for several calls, a JSON array of such objects.");
        break;
    }
    return b->oom ? KVS_ERR_NOMEM : 0;
}

int srv_tool_format_calls_text(srv_tool_format f, const cJSON *tool_calls, kvs_buf *b) {
    if (!b) return KVS_ERR_INVALID;
    shape sh = shape_of(f);
    int n = cJSON_GetArraySize(tool_calls);
    bool wrap = sh.open && (n > 1 || f == SRV_TOOL_FORMAT_MISTRAL);
    if (wrap) kvs_buf_puts(b, sh.open);
    int k = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, tool_calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsString(name)) continue;
        if (k++ > 0) kvs_buf_puts(b, sh.sep);
        kvs_buf_puts(b, sh.pre);
        put_json(b, name);
        kvs_buf_puts(b, sh.mid);
        if (args && !cJSON_IsNull(args)) put_json(b, args);
        else kvs_buf_puts(b, "{}");
        kvs_buf_puts(b, sh.post);
    }
    if (wrap) kvs_buf_puts(b, sh.close);
    return b->oom ? KVS_ERR_NOMEM : 0;
}

int srv_tool_format_result_text(srv_tool_format f, const char *name, const char *content, const char **role,
                                kvs_buf *b) {
    if (!b || !role) return KVS_ERR_INVALID;
    if (!content) content = "";
    *role = "user";
    switch (f) {
    case SRV_TOOL_FORMAT_HERMES:
        kvs_buf_printf(b, "<tool_response>\n%s\n</tool_response>", content);
        break;
    case SRV_TOOL_FORMAT_LLAMA3:
        *role = "ipython";
        kvs_buf_puts(b, content);
        break;
    case SRV_TOOL_FORMAT_MISTRAL: {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddStringToObject(o, "content", content)) b->oom = true;
        kvs_buf_puts(b, "[TOOL_RESULTS] ");
        if (o) put_json(b, o);
        kvs_buf_puts(b, "[/TOOL_RESULTS]");
        cJSON_Delete(o);
        break;
    }
    default:
        if (name && name[0]) kvs_buf_printf(b, "Result of the function %s:\n%s", name, content);
        else kvs_buf_printf(b, "Result of the function call:\n%s", content);
        break;
    }
    return b->oom ? KVS_ERR_NOMEM : 0;
}
