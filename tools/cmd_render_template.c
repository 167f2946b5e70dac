/*
 * cmd_render_template.c: `kvserve render-template -t TEMPLATE.jinja -i CONVERSATION.json`
 *
 * Renders a chat template the way the server will: CONVERSATION.json is an object whose members become the
 * template's variables (messages, tools, add_generation_prompt, bos_token, eos_token, anything else); `now`
 * (YYYY-MM-DDTHH:MM:SS, local time) is the time strftime_now formats, default the current time, and is not passed
 * as a variable. The rendering goes to stdout exactly (nothing added), exit 0; an error goes to stderr, exit 1
 * (2 for bad usage).
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "template/template.h"
#include "tools/cli.h"
#include "tools/commands.h"

typedef struct rt_opts { const char *tpath, *ipath; } rt_opts;

static const kvs_opt rt_opts_table[] = {
    {"--template", "-t", KVS_OPT_STR, offsetof(rt_opts, tpath), .arg = "FILE", .help = "the Jinja chat template"},
    {"--input", "-i", KVS_OPT_STR, offsetof(rt_opts, ipath), .arg = "FILE",
     .help = "a JSON object: messages, tools, add_generation_prompt, bos_token,\n"
             "eos_token, now (YYYY-MM-DDTHH:MM:SS), other template variables"},
};
static const kvs_cli rt_cli = {
    "render-template", "-t TEMPLATE.jinja -i CONVERSATION.json", NULL, NULL,
    rt_opts_table, sizeof rt_opts_table / sizeof rt_opts_table[0], 0,
};

static char *slurp(const char *path, size_t *len) {
    char *s = NULL;
    int rc = kvs_read_file(path, &s, len);
    if (rc == KVS_ERR_NOMEM) errno = ENOMEM;
    else if (rc != KVS_OK && !errno) errno = EIO;
    return s;
}

/* YYYY-MM-DDTHH:MM:SS (a space instead of T is accepted) */
static bool parse_now(const char *s, struct tm *tm) {
    int y, mo, d, h, mi, sec;
    char sep, extra;
    if (sscanf(s, "%4d-%2d-%2d%c%2d:%2d:%2d%c", &y, &mo, &d, &sep, &h, &mi, &sec, &extra) != 7) return false;
    if ((sep != 'T' && sep != ' ') || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60 || h < 0 ||
        mi < 0 || sec < 0)
        return false;
    memset(tm, 0, sizeof *tm);
    tm->tm_year = y - 1900;
    tm->tm_mon = mo - 1;
    tm->tm_mday = d;
    tm->tm_hour = h;
    tm->tm_min = mi;
    tm->tm_sec = sec;
    tm->tm_isdst = -1;
    return true;
}

int kvs_cmd_render_template(int argc, char **argv) {
    rt_opts o = {0};
    int prc = kvs_cli_parse(&rt_cli, &o, argc, argv, NULL, NULL);
    if (prc) return prc == 1 ? 0 : 2;
    const char *tpath = o.tpath, *ipath = o.ipath;
    if (!tpath || !ipath) {
        kvs_cli_fail(&rt_cli, "need -t TEMPLATE and -i CONVERSATION");
        kvs_cli_usage(&rt_cli, stderr);
        return 2;
    }
    size_t tlen = 0, ilen = 0;
    char *tsrc = slurp(tpath, &tlen);
    if (!tsrc) { fprintf(stderr, "kvserve render-template: cannot read %s: %s\n", tpath, strerror(errno)); return 1; }
    char *isrc = slurp(ipath, &ilen);
    if (!isrc) {
        fprintf(stderr, "kvserve render-template: cannot read %s: %s\n", ipath, strerror(errno));
        free(tsrc);
        return 1;
    }
    int status = 1;
    tpl_template *t = NULL;
    tpl_output out = {0};
    cJSON *vars = cJSON_ParseWithLength(isrc, ilen);
    if (!vars || !cJSON_IsObject(vars)) {
        fprintf(stderr, "kvserve render-template: %s is not a JSON object\n", ipath);
        goto done;
    }
    struct tm now, *nowp = NULL;
    cJSON *jn = cJSON_DetachItemFromObjectCaseSensitive(vars, "now");
    if (jn) {
        if (!cJSON_IsString(jn) || !parse_now(jn->valuestring, &now)) {
            fprintf(stderr, "kvserve render-template: `now` must be a string YYYY-MM-DDTHH:MM:SS\n");
            cJSON_Delete(jn);
            goto done;
        }
        nowp = &now;
        cJSON_Delete(jn);
    }
    tpl_error err;
    int rc = tpl_compile(tsrc, tlen, NULL, &t, &err);
    if (!rc) {
        tpl_render_params p = {.vars = vars, .now = nowp};
        rc = tpl_render(t, &p, &out, &err);
    }
    if (rc) {
        fprintf(stderr, "kvserve render-template: %s (%s)\n", err.msg, kvs_strerror(rc));
        goto done;
    }
    if (fwrite(out.text, 1, out.len, stdout) != out.len || fflush(stdout)) {
        fprintf(stderr, "kvserve render-template: cannot write the output\n");
        goto done;
    }
    status = 0;
done:
    tpl_output_free(&out);
    tpl_free(t);
    cJSON_Delete(vars);
    free(tsrc);
    free(isrc);
    return status;
}
