/* config.c: configuration defaults, JSON file, environment and flags (see server.h). */
#include "server/server.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "engine/engine.h"
#include "server/http/http.h"
#include "server/obs/obs.h"

typedef enum { K_STR, K_INT, K_NUM, K_BOOL, K_LIST, K_JSON } key_type; /* K_LIST: a string, or in a file a list of them */

typedef struct key_def {
    const char *name;
    key_type type;
    size_t off;
    size_t size;            /* K_STR: buffer size */
    double lo, hi;          /* K_INT/K_NUM range (inclusive) */
    const char *choices;    /* K_STR: "a|b|c" or NULL */
    const char *help;
} key_def;

#define S(f, ch, h) {#f, K_STR, offsetof(srv_config, f), sizeof(((srv_config *)0)->f), 0, 0, ch, h}
#define I(f, lo, hi, h) {#f, K_INT, offsetof(srv_config, f), 0, lo, hi, NULL, h}
#define N(f, lo, hi, h) {#f, K_NUM, offsetof(srv_config, f), 0, lo, hi, NULL, h}
#define B(f, h) {#f, K_BOOL, offsetof(srv_config, f), 0, 0, 0, NULL, h}
#define L(f, h) {#f, K_LIST, offsetof(srv_config, f), sizeof(((srv_config *)0)->f), 0, 0, NULL, h}
#define J(f, h) {#f, K_JSON, offsetof(srv_config, f), sizeof(((srv_config *)0)->f), 0, 0, NULL, h}

static const key_def KEYS[] = {
    S(host, NULL, "listen address (IPv4 or IPv6 literal)"),
    I(port, 0, 65535, "listen port (0: any free port)"),
    S(model, NULL, "path of the GGUF model to serve"),
    S(model_name, NULL, "model id in /v1/models and responses (default: general.name or the file name)"),
    I(threads, 0, 1024, "engine threads (0: all cores)"),
    I(parallel, 1, 4096, "most sequences generating at once"),
    I(batch_tokens, 1, 1048576, "token budget of one engine step"),
    I(ctx_size, 0, 16777216, "longest sequence in tokens (0: the model's training context)"),
    B(context_shift, "a generation reaching ctx_size drops half of its context after n_keep tokens and goes on"),
    I(n_keep, -1, 16777216, "prompt tokens a context shift keeps, BOS not counted (-1: all; requests may set n_keep)"),
    I(kv_blocks, 0, 1 << 30, "KV pool size in blocks (0: from kv_cache_mb)"),
    I(kv_cache_mb, 0, 1 << 24, "KV pool budget in MiB when kv_blocks is 0 (0: engine default)"),
    S(kv_dtype, "f16|f32|q8_0", "KV storage type"),
    I(block_size, 1, 1024, "tokens per KV block"),
    B(prefix_caching, "reuse cached KV blocks of common prompt prefixes"),
    S(device, "auto|cpu|cuda", "compute device"),
    N(gpu_memory_fraction, 0.01, 1.0, "CUDA: share of GPU memory for weights and KV"),
    I(max_queue, 1, 1000000, "waiting requests before new ones get 429"),
    I(max_queued_tokens, 0, 2147483647, "prompt tokens of waiting requests before new ones get 429 (0: no limit)"),
    S(scheduling_policy, "fcfs|priority", "request order: arrival, or a request's `priority` (lower first) then "
      "arrival"),
    I(max_n, 1, 4096, "largest n (choices) a request may ask"),
    I(max_stop, 0, 1024, "most stop strings per request"),
    S(api_key, NULL, "require 'Authorization: Bearer KEY' (also env KVSERVE_API_KEY)"),
    L(cors_origins, "origins allowed to call from a browser: \"*\", \"none\" or a comma list (\"\": * on loopback)"),
    N(timeout_s, 0.001, 86400, "seconds a started request has to arrive completely (else 408)"),
    N(idle_timeout_s, 0.001, 86400, "seconds before an idle keep-alive connection is closed"),
    N(body_limit_mb, 0.000001, 4096, "largest request body in MiB (else 413)"),
    N(body_total_mb, 0.000001, 1048576, "request-body MiB held across all connections (new bodies past it: 503)"),
    I(header_limit_kb, 1, 1048576, "largest request line + headers in KiB (else 431)"),
    I(max_connections, 1, 1000000, "most open connections (more get 503)"),
    I(write_buffer_kb, 1, 1048576, "unsent KiB per connection before a stalled stream is cut"),
    N(shutdown_grace_s, 0, 86400, "drain timeout: seconds in-flight requests get to finish after SIGTERM/SIGINT"),
    I(template_ms, 0, 3600000, "wall-clock ms one chat-template render may take (past it 400; 0: no limit)"),
    N(template_mb, 0, 1048576, "MiB one chat-template render may allocate in all (past it 400; 0: no limit)"),
    I(text_jobs, 1, 64, "/tokenize and /detokenize jobs on the thread pool at once"),
    I(text_queue, 0, 1000000, "text jobs waiting for a thread (more get 503 with Retry-After)"),
    N(text_answer_mb, 0, 1048576, "largest /tokenize or /detokenize answer in MiB (past it 413; 0: no limit)"),
    S(log_format, "text|json|none", "request log format (stderr)"),
    S(pooling, "|mean|cls|last", "embedding pooling (empty: the model's <arch>.pooling_type; none/absent: mean)"),
    B(reranking, "accepted for llama.cpp's --reranking: /v1/rerank is on whenever the model has a classification "
      "head"),
    S(chat_template, NULL,
      "a Jinja chat template FILE, or a built-in family (chatml|llama3|llama2|mistral|phi3|zephyr|gemma); "
      "empty: the model's own"),
    S(reasoning_format, "auto|deepseek|none", "thinking in chat output: auto splits it into reasoning_content where "
      "the template thinks (<think>, gpt-oss channels), deepseek also a leading <think> block of any template, none "
      "leaves it in content; requests may set reasoning_format"),
    B(parse_special_in_content, "chat message contents may produce control tokens (<|im_start|>...): the old, "
      "unsafe behaviour"),
    S(spec_type, "|none|ngram|draft", "speculative decoding: none, ngram (prompt lookup) or draft (a draft model, "
      "model_draft): guesses verified in one step, the output unchanged; empty: draft when model_draft is set, "
      "else none"),
    S(model_draft, NULL, "GGUF path of the draft model for spec_type draft (-md; the same vocabulary as the model)"),
    N(draft_p_min, 0, 1, "speculative decoding with a draft model: a draft stops at a guess whose draft "
      "probability is below this"),
    I(draft_max, 1, 32, "speculative decoding: most tokens guessed per sequence and step (requests: speculative.n_max)"),
    I(draft_min, 0, 32, "speculative decoding: fewest tokens a guess needs to be tried (requests: speculative.n_min)"),
    J(kv_events_config, "KV-cache events as vLLM's --kv-events-config (JSON object; see docs/CONFIG.md)"),
    S(kv_disk_dir, NULL, "directory of the KV disk tier: prefix blocks saved there are loaded instead of recomputed, "
      "also after a restart (\"\": none; CPU pools only)"),
    N(kv_disk_gb, 0.001, 1000000, "most GB (1e9 bytes) of KV files kept in kv_disk_dir (least recently used deleted)"),
    N(kv_host_gb, 0, 1000000, "GB (1e9 bytes) of RAM for the KV host tier: prefix blocks the pool evicts are copied "
      "there and copied back instead of recomputed (0: none; CPU pools only; llama.cpp's --cache-ram)"),
    S(slot_save_path, NULL, "directory of saved sessions: POST /slots/{id}?action=save|restore|erase (needs "
      "kv_disk_dir; \"\": the slot API answers 501)"),
};
#define N_KEYS (sizeof KEYS / sizeof KEYS[0])

void srv_config_default(srv_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "127.0.0.1");
    c->port = 8080;
    c->parallel = 64;
    c->batch_tokens = 512;
    snprintf(c->kv_dtype, sizeof c->kv_dtype, "f16");
    c->block_size = 16;
    c->prefix_caching = true;
    snprintf(c->device, sizeof c->device, "auto");
    c->gpu_memory_fraction = 0.9;
    c->max_queue = 256;
    snprintf(c->scheduling_policy, sizeof c->scheduling_policy, "fcfs");
    c->max_n = 16;
    c->max_stop = 16;
    c->timeout_s = 30;
    c->idle_timeout_s = 60;
    c->body_limit_mb = 16;
    c->body_total_mb = 256;
    c->header_limit_kb = 16;
    c->max_connections = 1024;
    c->write_buffer_kb = 4096;
    c->shutdown_grace_s = 10;
    c->template_ms = 5000;
    c->template_mb = 1024;
    c->text_jobs = 1;
    c->text_queue = 16;
    c->text_answer_mb = 32;
    snprintf(c->log_format, sizeof c->log_format, "text");
    snprintf(c->reasoning_format, sizeof c->reasoning_format, "auto");
    c->draft_max = 16;
    c->kv_disk_gb = 10;
}

static const key_def *find_key(const char *name) {
    char norm[64];
    size_t n = strlen(name);
    if (n >= sizeof norm) return NULL;
    for (size_t i = 0; i <= n; i++) norm[i] = name[i] == '-' ? '_' : name[i];
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(KEYS[i].name, norm)) return &KEYS[i];
    return NULL;
}

static bool in_choices(const char *choices, const char *v) {
    size_t vl = strlen(v);
    for (const char *p = choices;;) {
        const char *e = strchr(p, '|');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == vl && !strncmp(p, v, l)) return true;
        if (!e) return false;
        p = e + 1;
    }
}

/* chat_template: "", a built-in family name or a readable file. */
static int check_chat_template(const char *v, char *err, size_t el) {
    if (!v[0] || eng_chat_family_from_name(v) != ENG_CHAT_AUTO || access(v, R_OK) == 0) return SRV_OK;
    snprintf(err, el, "config key 'chat_template': '%s' is neither a readable file nor one of "
             "chatml|llama3|llama2|mistral|phi3|zephyr|gemma", v);
    return SRV_ERR_INVALID;
}

static int set_str(srv_config *c, const key_def *k, const char *v, char *err, size_t el) {
    if (!strcmp(k->name, "chat_template") && check_chat_template(v, err, el) != SRV_OK) return SRV_ERR_INVALID;
    if (strlen(v) >= k->size) {
        snprintf(err, el, "config key '%s': value too long (at most %zu bytes)", k->name, k->size - 1);
        return SRV_ERR_INVALID;
    }
    if (k->choices && !in_choices(k->choices, v)) {
        snprintf(err, el, "config key '%s': '%s' is not one of %s", k->name, v, k->choices);
        return SRV_ERR_INVALID;
    }
    char why[256];
    if (k->type == K_LIST && srv_cors_check(v, why, sizeof why) != SRV_CORS_OK) {
        snprintf(err, el, "config key '%s': %s", k->name, why);
        return SRV_ERR_INVALID;
    }
    snprintf((char *)c + k->off, k->size, "%s", v);
    return SRV_OK;
}

/* A K_LIST value from a config file: a string, or a list of strings joined with ", ". */
static int set_list_json(srv_config *c, const key_def *k, const cJSON *it, char *err, size_t el) {
    if (cJSON_IsString(it)) return set_str(c, k, it->valuestring, err, el);
    if (!cJSON_IsArray(it)) {
        snprintf(err, el, "config key '%s': must be a string or a list of strings", k->name);
        return SRV_ERR_INVALID;
    }
    char joined[4096] = "";
    size_t len = 0;
    int i = 0;
    for (const cJSON *e = it->child; e; e = e->next, i++) {
        if (!cJSON_IsString(e)) {
            snprintf(err, el, "config key '%s': item %d must be a string", k->name, i);
            return SRV_ERR_INVALID;
        }
        int n = snprintf(joined + len, sizeof joined - len, "%s%s", i ? ", " : "", e->valuestring);
        if (n < 0 || (size_t)n >= sizeof joined - len) {
            snprintf(err, el, "config key '%s': value too long (at most %zu bytes)", k->name, k->size - 1);
            return SRV_ERR_INVALID;
        }
        len += (size_t)n;
    }
    if (i == 0) snprintf(joined, sizeof joined, "none"); /* an empty list allows no origin */
    return set_str(c, k, joined, err, el);
}

static int set_num(srv_config *c, const key_def *k, double v, char *err, size_t el) {
    if (!isfinite(v) || v < k->lo || v > k->hi) {
        snprintf(err, el, "config key '%s': %g is out of range [%g, %g]", k->name, v, k->lo, k->hi);
        return SRV_ERR_INVALID;
    }
    if (k->type == K_INT) {
        if (v != floor(v)) {
            snprintf(err, el, "config key '%s': must be an integer, got %g", k->name, v);
            return SRV_ERR_INVALID;
        }
        *(int32_t *)((char *)c + k->off) = (int32_t)v;
    } else {
        *(double *)((char *)c + k->off) = v;
    }
    return SRV_OK;
}

/* A JSON object setting: checked by its module's parser, stored as compact text ("" when it is empty). */
static int set_json(srv_config *c, const key_def *k, const cJSON *obj, char *err, size_t el) {
    if (!cJSON_IsObject(obj)) {
        snprintf(err, el, "config key '%s': must be a JSON object", k->name);
        return SRV_ERR_INVALID;
    }
    char *text = cJSON_PrintUnformatted(obj);
    if (!text) { snprintf(err, el, "config key '%s': out of memory", k->name); return SRV_ERR_NOMEM; }
    srv_kv_events_config kc;
    int r = SRV_OK;
    if (strlen(text) >= k->size) {
        snprintf(err, el, "config key '%s': value too long (at most %zu bytes)", k->name, k->size - 1);
        r = SRV_ERR_INVALID;
    } else if (srv_kv_events_config_parse(text, &kc, err, el) != KVS_OK) {
        r = SRV_ERR_INVALID;
    } else {
        snprintf((char *)c + k->off, k->size, "%s", obj->child ? text : "");
    }
    free(text);
    return r;
}

int srv_config_set(srv_config *c, const char *key, const char *value, char *err, size_t el) {
    const key_def *k = key ? find_key(key) : NULL;
    if (!k) { snprintf(err, el, "unknown config key '%s'", key ? key : "(null)"); return SRV_ERR_INVALID; }
    if (!value) { snprintf(err, el, "config key '%s': a value is required", k->name); return SRV_ERR_INVALID; }
    switch (k->type) {
    case K_STR: case K_LIST: return set_str(c, k, value, err, el);
    case K_JSON: {
        cJSON *o = cJSON_Parse(value);
        if (!o) { snprintf(err, el, "config key '%s': invalid JSON", k->name); return SRV_ERR_INVALID; }
        int r = set_json(c, k, o, err, el);
        cJSON_Delete(o);
        return r;
    }
    case K_BOOL:
        if (!strcmp(value, "true") || !strcmp(value, "1") || !strcmp(value, "on") || !strcmp(value, "yes"))
            *(bool *)((char *)c + k->off) = true;
        else if (!strcmp(value, "false") || !strcmp(value, "0") || !strcmp(value, "off") || !strcmp(value, "no"))
            *(bool *)((char *)c + k->off) = false;
        else { snprintf(err, el, "config key '%s': '%s' is not a boolean (true/false)", k->name, value); return SRV_ERR_INVALID; }
        return SRV_OK;
    default: {
        char *end = NULL;
        errno = 0;
        double v = strtod(value, &end);
        if (!*value || *end || errno) {
            snprintf(err, el, "config key '%s': '%s' is not a number", k->name, value);
            return SRV_ERR_INVALID;
        }
        return set_num(c, k, v, err, el);
    }
    }
}

int srv_config_load_file(srv_config *c, const char *path, char *err, size_t el) {
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, el, "cannot open config file '%s': %s", path, strerror(errno)); return SRV_ERR_IO; }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) { fclose(f); snprintf(err, el, "out of memory reading '%s'", path); return SRV_ERR_NOMEM; }
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (len < cap) break;
        if (cap > (64u << 20)) { free(buf); fclose(f); snprintf(err, el, "config file '%s' is too large", path); return SRV_ERR_INVALID; }
        char *p = realloc(buf, cap *= 2);
        if (!p) free(buf);
        buf = p;
    }
    bool rerr = ferror(f);
    fclose(f);
    if (rerr) { free(buf); snprintf(err, el, "cannot read config file '%s'", path); return SRV_ERR_IO; }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, false);
    if (!root || !cJSON_IsObject(root)) {
        size_t off = root ? 0 : (end && end >= buf ? (size_t)(end - buf) : 0);
        snprintf(err, el, "config file '%s': %s", path,
                 root ? "the top level must be a JSON object" : "invalid JSON");
        if (!root) snprintf(err + strlen(err), el - strlen(err), " near byte %zu", off);
        cJSON_Delete(root);
        free(buf);
        return SRV_ERR_INVALID;
    }
    free(buf);
    int r = SRV_OK;
    for (const cJSON *it = root->child; it && r == SRV_OK; it = it->next) {
        const key_def *k = find_key(it->string);
        if (!k || strchr(it->string, '-')) {
            snprintf(err, el, "config file '%s': unknown key '%s'", path, it->string);
            r = SRV_ERR_INVALID;
            break;
        }
        char sub[512] = "";
        switch (k->type) {
        case K_JSON: r = set_json(c, k, it, sub, sizeof sub); break;
        case K_STR:
            if (!cJSON_IsString(it)) { snprintf(sub, sizeof sub, "config key '%s': must be a string", k->name); r = SRV_ERR_INVALID; }
            else r = set_str(c, k, it->valuestring, sub, sizeof sub);
            break;
        case K_LIST: r = set_list_json(c, k, it, sub, sizeof sub); break;
        case K_BOOL:
            if (!cJSON_IsBool(it)) { snprintf(sub, sizeof sub, "config key '%s': must be true or false", k->name); r = SRV_ERR_INVALID; }
            else *(bool *)((char *)c + k->off) = cJSON_IsTrue(it);
            break;
        default:
            if (!cJSON_IsNumber(it)) { snprintf(sub, sizeof sub, "config key '%s': must be a number", k->name); r = SRV_ERR_INVALID; }
            else r = set_num(c, k, it->valuedouble, sub, sizeof sub);
            break;
        }
        if (r != SRV_OK) snprintf(err, el, "config file '%s': %s", path, sub);
    }
    cJSON_Delete(root);
    return r;
}

int srv_config_validate(const srv_config *c, char *err, size_t el) {
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_def *k = &KEYS[i];
        if (k->type == K_INT) {
            int32_t v = *(const int32_t *)((const char *)c + k->off);
            if (v < k->lo || v > k->hi) {
                snprintf(err, el, "config key '%s': %d is out of range [%g, %g]", k->name, (int)v, k->lo, k->hi);
                return SRV_ERR_INVALID;
            }
        } else if (k->type == K_NUM) {
            double v = *(const double *)((const char *)c + k->off);
            if (!isfinite(v) || v < k->lo || v > k->hi) {
                snprintf(err, el, "config key '%s': %g is out of range [%g, %g]", k->name, v, k->lo, k->hi);
                return SRV_ERR_INVALID;
            }
        } else if (k->type == K_LIST) {
            char why[256];
            if (srv_cors_check((const char *)c + k->off, why, sizeof why) != SRV_CORS_OK) {
                snprintf(err, el, "config key '%s': %s", k->name, why);
                return SRV_ERR_INVALID;
            }
        } else if (k->type == K_STR && k->choices) {
            const char *v = (const char *)c + k->off;
            if (!in_choices(k->choices, v)) {
                snprintf(err, el, "config key '%s': '%s' is not one of %s", k->name, v, k->choices);
                return SRV_ERR_INVALID;
            }
        }
    }
    if (check_chat_template(c->chat_template, err, el) != SRV_OK) return SRV_ERR_INVALID;
    if (!c->host[0]) { snprintf(err, el, "config key 'host': must not be empty"); return SRV_ERR_INVALID; }
    srv_kv_events_config kc;
    if (srv_kv_events_config_parse(c->kv_events_config, &kc, err, el) != KVS_OK) return SRV_ERR_INVALID;
    if (c->draft_min > c->draft_max) {
        snprintf(err, el, "config key 'draft_min': %d is above draft_max (%d)", (int)c->draft_min, (int)c->draft_max);
        return SRV_ERR_INVALID;
    }
    if (!strcmp(c->spec_type, "draft") && !c->model_draft[0]) {
        snprintf(err, el, "config key 'spec_type': draft needs a draft model (model_draft, --model-draft FILE)");
        return SRV_ERR_INVALID;
    }
    if (c->ctx_size > 0 && c->ctx_size < 2) {
        snprintf(err, el, "config key 'ctx_size': must be 0 or at least 2");
        return SRV_ERR_INVALID;
    }
    return SRV_OK;
}

void srv_config_usage(FILE *f) {
    srv_config d;
    srv_config_default(&d);
    fprintf(f, "usage: kvserve serve [--config FILE] [--KEY VALUE ...]\n\n"
               "Every configuration key is also a flag (--ctx-size or --ctx_size). Flags override the config\n"
               "file; KVSERVE_API_KEY sets api_key unless --api-key is given. -m is --model, -md\n"
               "--model-draft.\n\n");
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_def *k = &KEYS[i];
        char flag[64], def[64];
        snprintf(flag, sizeof flag, "--%s", k->name);
        for (char *p = flag + 2; *p; p++) if (*p == '_') *p = '-';
        const char *base = (const char *)&d + k->off;
        switch (k->type) {
        case K_STR: case K_LIST: snprintf(def, sizeof def, "\"%s\"", base); break;
        case K_INT: snprintf(def, sizeof def, "%d", (int)*(const int32_t *)base); break;
        case K_NUM: snprintf(def, sizeof def, "%g", *(const double *)base); break;
        case K_BOOL: snprintf(def, sizeof def, "%s", *(const bool *)base ? "true" : "false"); break;
        case K_JSON: snprintf(def, sizeof def, "%s", base[0] ? base : "{}"); break;
        }
        fprintf(f, "  %-24s %s (default %s)\n", flag, k->help, def);
    }
    fprintf(f, "  %-24s %s\n", "--config FILE", "read keys from a JSON file first (see config/kvserve.json)");
}

int srv_config_from_args(srv_config *c, int argc, char **argv, char *err, size_t el) {
    /* Pass 1: --help and --config. */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { srv_config_usage(stdout); return SRV_ERR_HELP; }
        const char *file = NULL;
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) { snprintf(err, el, "--config needs a file name"); return SRV_ERR_INVALID; }
            file = argv[++i];
        } else if (!strncmp(argv[i], "--config=", 9)) {
            file = argv[i] + 9;
        }
        if (file) {
            int r = srv_config_load_file(c, file, err, el);
            if (r) return r;
        }
    }
    const char *env = getenv("KVSERVE_API_KEY");
    if (env && *env) {
        int r = srv_config_set(c, "api_key", env, err, el);
        if (r) return r;
    }
    /* Pass 2: flags. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--config")) { i++; continue; }
        if (!strncmp(a, "--config=", 9)) continue;
        char key[80];
        const char *val = NULL;
        if (!strcmp(a, "-m")) {
            snprintf(key, sizeof key, "model");
        } else if (!strcmp(a, "-md")) {
            snprintf(key, sizeof key, "model_draft");
        } else if (!strncmp(a, "--", 2) && a[2]) {
            const char *eq = strchr(a, '=');
            size_t kl = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            if (kl >= sizeof key) { snprintf(err, el, "unknown flag '%s'", a); return SRV_ERR_INVALID; }
            memcpy(key, a + 2, kl);
            key[kl] = 0;
            if (eq) val = eq + 1;
        } else {
            snprintf(err, el, "unexpected argument '%s' (flags are --key value; see --help)", a);
            return SRV_ERR_INVALID;
        }
        const key_def *k = find_key(key);
        if (!k && !val && !strncmp(key, "no-", 3) && (k = find_key(key + 3)) && k->type == K_BOOL) {
            *(bool *)((char *)c + k->off) = false;
            continue;
        }
        if (!k) { snprintf(err, el, "unknown flag '%s' (see --help)", a); return SRV_ERR_INVALID; }
        if (!val && k->type == K_BOOL) {
            static const char *const words[] = {"true", "false", "1", "0", "on", "off", "yes", "no"};
            bool word = false;
            for (size_t w = 0; i + 1 < argc && w < sizeof words / sizeof words[0]; w++)
                word |= !strcmp(argv[i + 1], words[w]);
            if (!word) { *(bool *)((char *)c + k->off) = true; continue; }
        }
        if (!val) {
            if (i + 1 >= argc) { snprintf(err, el, "flag '%s' needs a value", a); return SRV_ERR_INVALID; }
            val = argv[++i];
        }
        char sub[512];
        int r = srv_config_set(c, k->name, val, sub, sizeof sub);
        if (r) { snprintf(err, el, "flag '%s': %s", a, sub); return r; }
    }
    return srv_config_validate(c, err, el);
}

char *srv_config_to_json(const srv_config *c) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_def *k = &KEYS[i];
        const char *base = (const char *)c + k->off;
        switch (k->type) {
        case K_STR: case K_LIST:
            cJSON_AddStringToObject(o, k->name, (!strcmp(k->name, "api_key") && base[0]) ? "***" : base);
            break;
        case K_INT: cJSON_AddNumberToObject(o, k->name, *(const int32_t *)base); break;
        case K_NUM: cJSON_AddNumberToObject(o, k->name, *(const double *)base); break;
        case K_BOOL: cJSON_AddBoolToObject(o, k->name, *(const bool *)base); break;
        case K_JSON: { /* the effective settings, every key spelled out */
            srv_kv_events_config kc;
            cJSON *v = srv_kv_events_config_parse(base, &kc, NULL, 0) == KVS_OK ? srv_kv_events_config_to_json(&kc)
                                                                                 : NULL;
            if (v) cJSON_AddItemToObject(o, k->name, v);
            break;
        }
        }
    }
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}
