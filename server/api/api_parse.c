/* api_parse.c: validation of /v1/completions and /v1/chat/completions bodies (pure; see api.h) and the `priority`
 * field the other routes read too (see api_gen_internal.h). */
#include "server/api/api_gen_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/api/chat_internal.h"

void srv_api_limits_default(srv_api_limits *l) {
    l->n_vocab = 0;
    l->max_n = 16;
    l->template_ms = 5000;
    l->template_bytes = (size_t)1 << 30;
    l->text_answer_bytes = (size_t)32 << 20;
    l->text_jobs = 1;
    l->text_queue = 16;
    l->max_stop = 16;
    l->max_prompts = 64;
    l->priority_scheduling = false;
}

/* ---- field readers: JSON null counts as absent. Each returns 1 (set), 0 (absent) or -1 (error set). ---- */
#define BAD(...) (srv_api_set_error(err, 400, NULL, name, NULL, __VA_ARGS__), -1)
#define OOM() (srv_api_set_nomem(err), -2)

static int get_num(const cJSON *obj, const char *name, double lo, double hi, bool lo_open, float *out,
                   srv_api_error *err) {
    const cJSON *f = srv_api_json_field(obj, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f)) return BAD("'%s' must be a number, got %s", name, srv_api_json_kind(f));
    double v = f->valuedouble;
    if (!isfinite(v) || v > hi || (lo_open ? v <= lo : v < lo))
        return BAD("'%s' must be %s %g and %g, got %g", name, lo_open ? "greater than" : "between", lo, hi, v);
    *out = (float)v;
    return 1;
}

static int get_int(const cJSON *obj, const char *name, double lo, double hi, double *out, srv_api_error *err) {
    const cJSON *f = srv_api_json_field(obj, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble) || f->valuedouble != floor(f->valuedouble))
        return BAD("'%s' must be an integer, got %s", name, cJSON_IsNumber(f) ? "a fraction" : srv_api_json_kind(f));
    double v = f->valuedouble;
    if (v < lo || v > hi) return BAD("'%s' must be an integer between %.0f and %.0f, got %.0f", name, lo, hi, v);
    *out = v;
    return 1;
}

int api_parse_priority(const cJSON *root, const srv_api_limits *lim, int32_t *out, srv_api_error *err) {
    const char *name = "priority";
    double d = 0;
    *out = 0;
    int r = get_int(root, name, INT32_MIN, INT32_MAX, &d, err);
    if (r < 0) return r;
    if (r && d != 0 && !lim->priority_scheduling)
        return BAD("'priority' is %.0f but priority scheduling is not enabled: only 0 is accepted under the fcfs "
                   "scheduling policy (start the server with --scheduling-policy priority)", d);
    *out = (int32_t)d;
    return r;
}

static int get_bool(const cJSON *obj, const char *name, bool *out, srv_api_error *err) {
    const cJSON *f = srv_api_json_field(obj, name);
    if (!f) return 0;
    if (!cJSON_IsBool(f)) return BAD("'%s' must be a boolean, got %s", name, srv_api_json_kind(f));
    *out = cJSON_IsTrue(f);
    return 1;
}

static int get_str(const cJSON *obj, const char *name, char **out, srv_api_error *err) {
    const cJSON *f = srv_api_json_field(obj, name);
    if (!f) return 0;
    if (!cJSON_IsString(f)) return BAD("'%s' must be a string, got %s", name, srv_api_json_kind(f));
    free(*out);
    if (!(*out = strdup(f->valuestring))) return OOM();
    return 1;
}

/* An array of token ids, each in [0, n_vocab). */
static int read_tokens(const cJSON *arr, const char *name, const srv_api_limits *lim, srv_api_prompt *p,
                       srv_api_error *err) {
    int n = cJSON_GetArraySize(arr);
    if (n < 1) return BAD("'%s' must not be an empty array", name);
    if (!(p->tokens = malloc((size_t)n * sizeof *p->tokens))) return OOM();
    int i = 0;
    for (const cJSON *t = arr->child; t; t = t->next, i++) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble))
            return BAD("'%s' must hold integer token ids, item %d is %s", name, i, srv_api_json_kind(t));
        double v = t->valuedouble;
        if (v < 0 || v > INT32_MAX || (lim->n_vocab > 0 && v >= lim->n_vocab))
            return BAD("'%s': token id %.0f at item %d is out of range (vocabulary size %d)", name, v, i,
                       (int)lim->n_vocab);
        p->tokens[i] = (int32_t)v;
    }
    p->n_tokens = n;
    return 1;
}

static int parse_prompt(const cJSON *root, const srv_api_limits *lim, srv_api_gen *g, srv_api_error *err) {
    const char *name = "prompt";
    const cJSON *f = srv_api_json_field(root, name);
    if (!f) return BAD("'prompt' is required");
    if (cJSON_IsString(f)) {
        if (!(g->prompts = calloc(1, sizeof *g->prompts))) return OOM();
        g->n_prompts = 1;
        if (!(g->prompts[0].text = strdup(f->valuestring))) return OOM();
        return 1;
    }
    if (!cJSON_IsArray(f))
        return BAD("'prompt' must be a string, an array of strings, an array of token ids or an array of "
                   "token-id arrays, got %s", srv_api_json_kind(f));
    int n = cJSON_GetArraySize(f);
    if (n < 1) return BAD("'prompt' must not be an empty array");
    if (cJSON_IsNumber(f->child)) { /* one token-id prompt */
        if (!(g->prompts = calloc(1, sizeof *g->prompts))) return OOM();
        g->n_prompts = 1;
        return read_tokens(f, name, lim, &g->prompts[0], err);
    }
    if (n > lim->max_prompts) return BAD("'prompt' holds %d prompts; at most %d are allowed", n, lim->max_prompts);
    if (!(g->prompts = calloc((size_t)n, sizeof *g->prompts))) return OOM();
    g->n_prompts = n;
    bool strings = cJSON_IsString(f->child);
    int i = 0;
    for (const cJSON *it = f->child; it; it = it->next, i++) {
        if (strings && cJSON_IsString(it)) {
            if (!(g->prompts[i].text = strdup(it->valuestring))) return OOM();
        } else if (!strings && cJSON_IsArray(it)) {
            int r = read_tokens(it, name, lim, &g->prompts[i], err);
            if (r < 0) return r;
        } else {
            return BAD("'prompt' must not mix types: item %d is %s", i, srv_api_json_kind(it));
        }
    }
    return 1;
}

static int parse_messages(const cJSON *root, srv_api_gen *g, srv_api_error *err) {
    const char *name = "messages";
    const cJSON *f = srv_api_json_field(root, name);
    if (!f) return BAD("'messages' is required");
    if (!cJSON_IsArray(f)) return BAD("'messages' must be an array, got %s", srv_api_json_kind(f));
    int n = cJSON_GetArraySize(f);
    if (n < 1) return BAD("'messages' must not be empty");
    if (!(g->msgs = calloc((size_t)n, sizeof *g->msgs))) return OOM();
    int i = 0;
    for (const cJSON *m = f->child; m; m = m->next, i++) {
        g->n_msgs = i + 1;
        char pname[64];
        snprintf(pname, sizeof pname, "messages[%d]", i);
        name = pname;
        if (!cJSON_IsObject(m)) return BAD("'%s' must be an object, got %s", pname, srv_api_json_kind(m));
        const cJSON *role = srv_api_json_field(m, "role");
        snprintf(pname, sizeof pname, "messages[%d].role", i);
        if (!role) return BAD("'%s' is required", pname);
        if (!cJSON_IsString(role)) return BAD("'%s' must be a string, got %s", pname, srv_api_json_kind(role));
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool"))
            return BAD("'%s' must be one of system, developer, user, assistant, tool; got '%s'", pname,
                       role->valuestring);
        if (!(g->msgs[i].role = strdup(r))) return OOM();
        const cJSON *c = srv_api_json_field(m, "content");
        snprintf(pname, sizeof pname, "messages[%d].content", i);
        if (!c) {
            if (strcmp(r, "assistant")) return BAD("'%s' is required", pname);
            if (!(g->msgs[i].content = strdup(""))) return OOM();
        } else if (cJSON_IsString(c)) {
            if (!(g->msgs[i].content = strdup(c->valuestring))) return OOM();
        } else if (cJSON_IsArray(c)) {
            size_t total = 0;
            int j = 0;
            for (const cJSON *p = c->child; p; p = p->next, j++) {
                const cJSON *ty = cJSON_IsObject(p) ? srv_api_json_field(p, "type") : NULL;
                const cJSON *tx = cJSON_IsObject(p) ? srv_api_json_field(p, "text") : NULL;
                if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text"))
                    return BAD("'%s[%d]': only parts of type \"text\" are supported", pname, j);
                if (!cJSON_IsString(tx)) return BAD("'%s[%d].text' must be a string", pname, j);
                total += strlen(tx->valuestring);
            }
            char *s = malloc(total + 1);
            if (!s) return OOM();
            size_t off = 0;
            for (const cJSON *p = c->child; p; p = p->next) {
                const char *tx = srv_api_json_field(p, "text")->valuestring;
                size_t l = strlen(tx);
                memcpy(s + off, tx, l);
                off += l;
            }
            s[off] = 0;
            g->msgs[i].content = s;
        } else {
            return BAD("'%s' must be a string or an array of content parts, got %s", pname, srv_api_json_kind(c));
        }
    }
    return 1;
}

static int parse_stop(const cJSON *root, const srv_api_limits *lim, srv_api_gen *g, srv_api_error *err) {
    const char *name = "stop";
    const cJSON *f = srv_api_json_field(root, name);
    if (!f) return 0;
    if (cJSON_IsString(f)) {
        if (!(g->stop = calloc(1, sizeof *g->stop))) return OOM();
        if (!(g->stop[0] = strdup(f->valuestring))) return OOM();
        g->n_stop = 1;
        return 1;
    }
    if (!cJSON_IsArray(f)) return BAD("'stop' must be a string or an array of strings, got %s", srv_api_json_kind(f));
    int n = cJSON_GetArraySize(f);
    if (n > lim->max_stop) return BAD("'stop' holds %d strings; at most %d are allowed", n, lim->max_stop);
    if (n == 0) return 0;
    if (!(g->stop = calloc((size_t)n, sizeof *g->stop))) return OOM();
    int i = 0;
    for (const cJSON *s = f->child; s; s = s->next, i++) {
        if (!cJSON_IsString(s)) return BAD("'stop' must hold strings, item %d is %s", i, srv_api_json_kind(s));
        if (!(g->stop[i] = strdup(s->valuestring))) return OOM();
        g->n_stop = i + 1;
    }
    return 1;
}

static int parse_logit_bias(const cJSON *root, const srv_api_limits *lim, srv_api_gen *g, srv_api_error *err) {
    const char *name = "logit_bias";
    const cJSON *f = srv_api_json_field(root, name);
    if (!f) return 0;
    if (!cJSON_IsObject(f)) return BAD("'logit_bias' must be an object mapping token ids to biases, got %s",
                                       srv_api_json_kind(f));
    int n = cJSON_GetArraySize(f);
    if (n == 0) return 0;
    if (!(g->logit_bias = calloc((size_t)n, sizeof *g->logit_bias))) return OOM();
    for (const cJSON *b = f->child; b; b = b->next) {
        const char *k = b->string;
        char *end = NULL;
        long long id = (k && *k) ? strtoll(k, &end, 10) : -1;
        if (!k || !*k || *end || id < 0 || id > INT32_MAX || (lim->n_vocab > 0 && id >= lim->n_vocab))
            return BAD("'logit_bias' key '%s' is not a token id in [0, %d)", k ? k : "", (int)lim->n_vocab);
        if (!cJSON_IsNumber(b) || !isfinite(b->valuedouble) || b->valuedouble < -100 || b->valuedouble > 100)
            return BAD("'logit_bias' value for token %s must be a number between -100 and 100", k);
        g->logit_bias[g->n_logit_bias].token = (int32_t)id;
        g->logit_bias[g->n_logit_bias].bias = (float)b->valuedouble;
        g->n_logit_bias++;
    }
    return 1;
}

static int parse_all(srv_api_kind kind, const cJSON *root, const srv_api_limits *lim, srv_api_gen *g,
                     srv_api_error *err) {
    const char *name = NULL;
    int r;
    double d;
    if ((r = get_str(root, "model", &g->model, err)) < 0) return r;
    if (kind == SRV_API_COMPLETION) {
        if ((r = parse_prompt(root, lim, g, err)) < 0) return r;
    } else {
        if ((r = parse_messages(root, g, err)) < 0) return r;
    }
    g->max_tokens = kind == SRV_API_COMPLETION ? 16 : -1; /* the OpenAI defaults */
    if ((r = get_int(root, "max_tokens", 1, INT32_MAX, &d, err)) < 0) return r;
    if (r) g->max_tokens = (int32_t)d;
    if (kind == SRV_API_CHAT) {
        if ((r = get_int(root, "max_completion_tokens", 1, INT32_MAX, &d, err)) < 0) return r;
        if (r) g->max_tokens = (int32_t)d;
    }
    eng_sampling_params_default(&g->sampling);
    if ((r = get_num(root, "temperature", 0, 2, false, &g->sampling.temperature, err)) < 0) return r;
    if ((r = get_num(root, "top_p", 0, 1, false, &g->sampling.top_p, err)) < 0) return r;
    if ((r = get_int(root, "top_k", -1, INT32_MAX, &d, err)) < 0) return r;
    if (r) g->sampling.top_k = (int32_t)d;
    if ((r = get_num(root, "min_p", 0, 1, false, &g->sampling.min_p, err)) < 0) return r;
    g->n = 1;
    if ((r = get_int(root, "n", 1, lim->max_n, &d, err)) < 0) return r;
    if (r) g->n = (int32_t)d;
    if ((r = get_num(root, "presence_penalty", -2, 2, false, &g->sampling.presence_penalty, err)) < 0) return r;
    if ((r = get_num(root, "frequency_penalty", -2, 2, false, &g->sampling.frequency_penalty, err)) < 0) return r;
    if ((r = get_num(root, "repetition_penalty", 0, 10, true, &g->sampling.repetition_penalty, err)) < 0) return r;
    if ((r = get_int(root, "seed", -9223372036854775808.0, 18446744073709549568.0, &d, err)) < 0) return r;
    if (r) { g->has_seed = true; g->seed = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d; }
    if ((r = parse_stop(root, lim, g, err)) < 0) return r;
    if ((r = parse_logit_bias(root, lim, g, err)) < 0) return r;
    if ((r = get_bool(root, "stream", &g->stream, err)) < 0) return r;
    const cJSON *so = srv_api_json_field(root, "stream_options");
    if (so) {
        name = "stream_options";
        if (!cJSON_IsObject(so)) return BAD("'stream_options' must be an object, got %s", srv_api_json_kind(so));
        const cJSON *iu = srv_api_json_field(so, "include_usage");
        name = "stream_options.include_usage";
        if (iu && !cJSON_IsBool(iu)) return BAD("'%s' must be a boolean, got %s", name, srv_api_json_kind(iu));
        g->include_usage = iu && cJSON_IsTrue(iu);
    }
    if ((r = get_bool(root, "ignore_eos", &g->ignore_eos, err)) < 0) return r;
    if ((r = get_int(root, "n_keep", -1, INT32_MAX, &d, err)) < 0) return r;
    if (r) {
        g->has_n_keep = true;
        g->n_keep = (int32_t)d;
    }
    g->spec_n_max = g->spec_n_min = -1;
    if ((r = get_int(root, "speculative.n_max", 0, SRV_SCHED_SPEC_MAX, &d, err)) < 0) return r;
    if (r) g->spec_n_max = (int32_t)d;
    if ((r = get_int(root, "speculative.n_min", 0, SRV_SCHED_SPEC_MAX, &d, err)) < 0) return r;
    if (r) g->spec_n_min = (int32_t)d;
    if ((r = get_str(root, "user", &g->user, err)) < 0) return r;
    if ((r = api_parse_response_format(root, g, err)) < 0) return r;
    if ((r = api_parse_priority(root, lim, &g->priority, err)) < 0) return r;
    if (kind == SRV_API_COMPLETION) {
        if ((r = get_int(root, "logprobs", 0, KVS_MAX_TOP_LOGPROBS, &d, err)) < 0) return r;
        if (r) { g->logprobs = true; g->top_logprobs = (int32_t)d; }
        if ((r = get_bool(root, "echo", &g->echo, err)) < 0) return r;
        name = "echo";
        if (g->echo && g->logprobs) return BAD("'echo' together with 'logprobs' is not supported");
        if ((r = get_int(root, "best_of", 1, lim->max_n, &d, err)) < 0) return r;
        name = "best_of";
        if (r && (int32_t)d != g->n) return BAD("'best_of' other than n is not supported");
        if ((r = get_str(root, "suffix", &g->suffix, err)) < 0) return r;
    } else {
        if ((r = get_bool(root, "logprobs", &g->logprobs, err)) < 0) return r;
        if ((r = get_int(root, "top_logprobs", 0, KVS_MAX_TOP_LOGPROBS, &d, err)) < 0) return r;
        name = "top_logprobs";
        if (r && !g->logprobs) return BAD("'top_logprobs' requires 'logprobs' to be true");
        if (r) g->top_logprobs = (int32_t)d;
        char *rf = NULL;
        if ((r = get_str(root, "reasoning_format", &rf, err)) < 0) return r;
        if (r) {
            srv_reasoning_format f;
            int bad = srv_reasoning_format_from_name(rf, &f);
            free(rf);
            name = "reasoning_format";
            if (bad) return BAD("'reasoning_format' must be \"auto\", \"deepseek\" or \"none\"");
            g->has_reasoning_format = true;
            g->reasoning_format = (int)f;
        }
        if (!(g->chat = calloc(1, sizeof *g->chat))) return OOM();
        r = srv_chat_parse(root, g->chat, err);
        if (r != 0) { free(g->chat); g->chat = NULL; return r == SRV_API_ERR_NOMEM ? -2 : -1; }
    }
    return 0;
}

int srv_api_parse_gen_json(srv_api_kind kind, const cJSON *root, const srv_api_limits *lim_in, srv_api_gen *out,
                           srv_api_error *err) {
    srv_api_limits lim;
    if (lim_in) lim = *lim_in; else srv_api_limits_default(&lim);
    memset(out, 0, sizeof *out);
    out->kind = kind;
    if (!cJSON_IsObject(root)) {
        srv_api_set_error(err, 400, NULL, NULL, NULL, "the request body must be a JSON object, got %s",
                          root ? srv_api_json_kind(root) : "nothing");
        return SRV_API_ERR_INVALID;
    }
    int r = parse_all(kind, root, &lim, out, err);
    if (r < 0) {
        srv_api_gen_free(out);
        return r == -2 ? SRV_API_ERR_NOMEM : SRV_API_ERR_INVALID;
    }
    return SRV_API_OK;
}

int srv_api_parse_gen(srv_api_kind kind, const char *body, size_t len, const srv_api_limits *lim_in,
                      srv_api_gen *out, srv_api_error *err) {
    srv_api_limits lim;
    if (lim_in) lim = *lim_in; else srv_api_limits_default(&lim);
    memset(out, 0, sizeof *out);
    out->kind = kind;
    if (!body) {
        srv_api_set_error(err, 400, NULL, NULL, NULL, "the request body is empty");
        return SRV_API_ERR_INVALID;
    }
    if (srv_api_check_json(body, len, err) != SRV_API_OK) return SRV_API_ERR_INVALID;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root) {
        size_t off = end && end >= body ? (size_t)(end - body) : 0;
        srv_api_set_error(err, 400, NULL, NULL, NULL,
                          len == 0 ? "the request body is empty (expected a JSON object)"
                                   : "the request body is not valid JSON (error near byte %zu)", off);
        return SRV_API_ERR_INVALID;
    }
    while (end && (size_t)(end - body) < len && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n'))
        end++;
    if (end && (size_t)(end - body) < len) {
        srv_api_set_error(err, 400, NULL, NULL, NULL,
                          "the request body is not valid JSON (unexpected data after the value at byte %zu)",
                          (size_t)(end - body));
        cJSON_Delete(root);
        return SRV_API_ERR_INVALID;
    }
    int r = srv_api_check_dup_keys(root, err);
    if (r == SRV_API_OK) r = srv_api_parse_gen_json(kind, root, &lim, out, err);
    cJSON_Delete(root);
    return r;
}
