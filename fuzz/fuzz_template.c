/*
 * fuzz_template.c: the chat-template engine (template/template.h): template text from the input compiled and
 * rendered over a conversation from the input, under sandbox limits small enough for a fuzzer.
 *
 * Input: byte 0 = options (bit 0: mark content; bits 1-2: which limits, see LIMITS below), bytes 1-2 = the
 * template's length L (little endian, clamped to what is left), then L bytes of template text, then the
 * variables: a JSON object when the rest parses as one, else a conversation made from the rest (its lines
 * become alternating user/assistant messages, the first line starting with "sys:" a system message).
 *
 * Checks: tpl_compile and tpl_render return 0 or one of their documented codes, with err.code equal to the
 * return and a NUL-terminated message; a failed render leaves the output empty; a successful one is
 * NUL-terminated at len, never longer than max_output, its spans sorted, disjoint, non-adjacent and inside the
 * text (and absent without mark_content); a second render of the same template gives the same bytes and
 * spans (renders are deterministic at a fixed `now`).
 */
#include "fuzz_util.h"

#include <cjson/cJSON.h>

#include "template/template.h"

/* The limits an input may pick: default-like but smaller steps (a fuzzer needs fast executions), tight ones
 * (every limit reachable by short hostile templates), tiny depth, and a small output budget. */
static void pick_limits(uint32_t which, tpl_limits *lim) {
    tpl_limits_default(lim);
    lim->max_steps = 200000;
    lim->max_output = 1 << 20;
    lim->max_memory = 16 << 20;
    switch (which & 3) {
    case 1: lim->max_steps = 5000; lim->max_output = 4096; lim->max_memory = 65536; break;
    case 2: lim->max_depth = 3; lim->max_parse_depth = 8; break;
    case 3: lim->max_output = 64; break;
    default: break;
    }
}

static bool code_ok(int rc, bool render) {
    switch (rc) {
    case KVS_ERR_INVALID: case KVS_ERR_SYNTAX: case KVS_ERR_UNSUPPORTED: case KVS_ERR_LIMIT: case KVS_ERR_NOMEM:
        return true;
    case KVS_ERR_RAISED: case KVS_ERR_TYPE: case KVS_ERR_NOT_FOUND: case KVS_ERR_STATE:
        return render;
    default:
        return false;
    }
}

static void check_error(const tpl_error *e, int rc, bool render) {
    FZ_CHECK(code_ok(rc, render), "%s returned %d (%s)", render ? "render" : "compile", rc, kvs_strerror(rc));
    FZ_CHECK(e->code == rc, "err.code %d, returned %d", e->code, rc);
    FZ_CHECK(memchr(e->msg, 0, sizeof e->msg) != NULL, "error message not terminated");
    FZ_CHECK(e->msg[0] != 0, "empty error message for %d", rc);
}

/* A conversation from text: one message per line, alternating user / assistant ("sys:" first: system). */
static cJSON *conversation(const char *s, size_t n) {
    cJSON *vars = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(vars, "messages");
    if (!vars || !msgs) { cJSON_Delete(vars); return NULL; }
    size_t i = 0;
    int turn = 0;
    while (i <= n) {
        size_t e = i;
        while (e < n && s[e] != '\n') e++;
        char *line = malloc(e - i + 1);
        if (!line) break;
        memcpy(line, s + i, e - i);
        line[e - i] = 0;
        cJSON *m = cJSON_CreateObject();
        const char *role = turn % 2 ? "assistant" : "user", *text = line;
        if (turn == 0 && !strncmp(line, "sys:", 4)) { role = "system"; text = line + 4; turn--; }
        cJSON_AddStringToObject(m, "role", role);
        cJSON_AddStringToObject(m, "content", text);
        cJSON_AddItemToArray(msgs, m);
        free(line);
        turn++;
        i = e + 1;
        if (turn > 64) break;
    }
    cJSON_AddBoolToObject(vars, "add_generation_prompt", true);
    cJSON_AddStringToObject(vars, "bos_token", "<s>");
    cJSON_AddStringToObject(vars, "eos_token", "</s>");
    return vars;
}

static void check_output(const tpl_output *o, const tpl_limits *lim, bool mark) {
    FZ_CHECK(o->text != NULL, "success without text");
    FZ_CHECK(o->text[o->len] == 0, "text not NUL-terminated at len %zu", o->len);
    FZ_CHECK(o->len <= lim->max_output, "output %zu bytes over max_output %zu", o->len, lim->max_output);
    FZ_CHECK(mark || o->n_spans == 0, "%zu spans without mark_content", o->n_spans);
    FZ_CHECK((o->n_spans == 0) == (o->spans == NULL), "spans %p with n_spans %zu", (void *)o->spans, o->n_spans);
    size_t end = 0;
    for (size_t i = 0; i < o->n_spans; i++) {
        const tpl_span *sp = &o->spans[i];
        FZ_CHECK(sp->len > 0, "span %zu empty", i);
        FZ_CHECK(sp->off <= o->len && sp->len <= o->len - sp->off, "span %zu [%zu+%zu) outside %zu", i, sp->off,
                 sp->len, o->len);
        FZ_CHECK(i == 0 || sp->off > end, "span %zu at %zu overlaps or touches the previous end %zu", i, sp->off,
                 end);
        end = sp->off + sp->len;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    uint32_t opt = data[0];
    size_t tl = (size_t)data[1] | (size_t)data[2] << 8;
    if (tl > size - 3) tl = size - 3;
    const char *src = (const char *)data + 3, *rest = src + tl;
    size_t rest_n = size - 3 - tl;
    bool mark = opt & 1;
    tpl_limits lim;
    pick_limits(opt >> 1, &lim);

    tpl_template *t = NULL;
    tpl_error err;
    int rc = tpl_compile(src, tl, &lim, &t, &err);
    if (rc != 0) {
        check_error(&err, rc, false);
        FZ_CHECK(t == NULL, "failed compile set the template");
        return 0;
    }
    /* the variables: a JSON object, or a conversation made of the text (cJSON needs a terminated copy) */
    char *js = malloc(rest_n + 1);
    FZ_CHECK(js != NULL, "out of memory");
    memcpy(js, rest, rest_n);
    js[rest_n] = 0;
    cJSON *vars = cJSON_ParseWithLength(js, rest_n);
    if (vars && !cJSON_IsObject(vars)) { cJSON_Delete(vars); vars = NULL; }
    if (!vars) vars = conversation(js, rest_n);
    free(js);
    FZ_CHECK(vars != NULL, "out of memory");

    static const struct tm now = {.tm_year = 126, .tm_mon = 2, .tm_mday = 7, .tm_hour = 9, .tm_min = 30};
    tpl_render_params p = {.vars = vars, .now = &now, .mark_content = mark};
    tpl_output o;
    rc = tpl_render(t, &p, &o, &err);
    if (rc != 0) {
        check_error(&err, rc, true);
        FZ_CHECK(o.text == NULL && o.len == 0 && o.spans == NULL && o.n_spans == 0, "failed render left output");
    } else {
        check_output(&o, &lim, mark);
        if (o.len <= 65536) { /* determinism: the same template, variables and time give the same bytes */
            tpl_output o2;
            tpl_error err2;
            int rc2 = tpl_render(t, &p, &o2, &err2);
            FZ_CHECK(rc2 == 0 || rc2 == KVS_ERR_NOMEM, "second render failed: %d %s", rc2, err2.msg);
            if (rc2 == 0) {
                FZ_CHECK(o2.len == o.len && !memcmp(o2.text, o.text, o.len), "second render differs");
                FZ_CHECK(o2.n_spans == o.n_spans &&
                             (!o.n_spans || !memcmp(o2.spans, o.spans, o.n_spans * sizeof *o.spans)),
                         "second render's spans differ");
            }
            tpl_output_free(&o2);
        }
    }
    tpl_output_free(&o);
    cJSON_Delete(vars);
    tpl_free(t);
    return 0;
}
