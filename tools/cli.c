/* cli.c: the option-table parser and small helpers shared by the kvserve subcommands (see cli.h). */
#include "tools/cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

bool kvs_parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool kvs_parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

double kvs_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int kvs_cli_fail(const kvs_cli *cli, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvserve %s: ", cli->cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

/* A range bound of the table as a long long (bounds at or past the type's ends saturate). */
static long long int_bound(double d) {
    if (d >= 9.2e18) return LLONG_MAX;
    if (d <= -9.2e18) return LLONG_MIN;
    return (long long)d;
}

/* Stores one value through its table entry; 0, or 2 after printing the message. */
static int set_value(const kvs_cli *cli, const kvs_opt *o, const char *given, void *field, const char *v) {
    char *end;
    errno = 0;
    switch (o->kind) {
    case KVS_OPT_LONG:
    case KVS_OPT_I64: {
        long long x = strtoll(v, &end, 10), lo = int_bound(o->lo), hi = int_bound(o->hi);
        if (errno || end == v || *end || x < lo || x > hi)
            return kvs_cli_fail(cli, "%s wants an integer in %lld..%lld, got '%s'", given, lo, hi, v);
        if (o->kind == KVS_OPT_LONG) *(long *)field = (long)x;
        else *(int64_t *)field = (int64_t)x;
        return 0;
    }
    case KVS_OPT_FLOAT:
    case KVS_OPT_DOUBLE: {
        double x = strtod(v, &end);
        bool ranged = o->lo < o->hi;
        bool ok = !errno && end != v && !*end && isfinite(x) && (!ranged || (x >= o->lo && x <= o->hi));
        if (ok && o->kind == KVS_OPT_FLOAT) ok = isfinite((float)x);
        if (!ok && ranged) return kvs_cli_fail(cli, "%s wants a number in %g..%g, got '%s'", given, o->lo, o->hi, v);
        if (!ok) return kvs_cli_fail(cli, "%s wants a finite number, got '%s'", given, v);
        if (o->kind == KVS_OPT_FLOAT) *(float *)field = (float)x;
        else *(double *)field = x;
        return 0;
    }
    case KVS_OPT_STR: *(const char **)field = v; return 0;
    case KVS_OPT_SET:
        if (o->set(field, v)) return 0;
        return kvs_cli_fail(cli, "%s wants %s, got '%s'", given, o->expect ? o->expect : "another value", v);
    case KVS_OPT_FLAG: break;
    }
    return kvs_cli_fail(cli, "%s takes no value", given);
}

static const kvs_opt *find_opt(const kvs_cli *cli, const char *name, size_t len) {
    for (size_t i = 0; i < cli->n_opts; i++) {
        const kvs_opt *o = &cli->opts[i];
        if ((strlen(o->name) == len && !memcmp(o->name, name, len)) ||
            (o->alias && strlen(o->alias) == len && !memcmp(o->alias, name, len)))
            return o;
    }
    return NULL;
}

int kvs_cli_parse(const kvs_cli *cli, void *base, int argc, char **argv, const char **pos, int *npos) {
    int np = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            kvs_cli_usage(cli, stdout);
            return 1;
        }
        if (a[0] != '-' || !a[1]) {
            if (np >= cli->max_pos) {
                if (cli->max_pos == 0) return kvs_cli_fail(cli, "unexpected argument '%s' (see --help)", a);
                return kvs_cli_fail(cli, "too many arguments (see --help)");
            }
            pos[np++] = a;
            continue;
        }
        /* --name=value (long names only) or the name alone */
        const char *eq = a[1] == '-' ? strchr(a, '=') : NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const kvs_opt *o = find_opt(cli, a, len);
        if (!o) return kvs_cli_fail(cli, "unknown option '%.*s' (see --help)", (int)len, a);
        void *field = (char *)base + o->off;
        if (o->kind == KVS_OPT_FLAG) {
            if (eq) return kvs_cli_fail(cli, "%s takes no value", o->name);
            *(bool *)field = o->flag_value;
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) return kvs_cli_fail(cli, "%s needs a value (see --help)", a);
        char given[64];
        snprintf(given, sizeof given, "%.*s", (int)len, a);
        int rc = set_value(cli, o, given, field, v);
        if (rc) return rc;
    }
    if (npos) *npos = np;
    return 0;
}

/* One option's help lines: the names in a 24-column field, the help text beside it (its '\n's continue under
 * it). */
static void usage_line(FILE *f, const char *names, const char *help) {
    const int col = 24;
    int w = fprintf(f, "  %s", names);
    if (w < 0) return;
    if (w + 1 > col) {
        fputc('\n', f);
        w = 0;
    }
    fprintf(f, "%*s", col - w, "");
    for (const char *p = help; *p; p++) {
        fputc(*p, f);
        if (*p == '\n' && p[1]) fprintf(f, "%*s", col, "");
    }
    fputc('\n', f);
}

void kvs_cli_usage(const kvs_cli *cli, FILE *f) {
    fprintf(f, "usage: kvserve %s %s\n", cli->cmd, cli->synopsis);
    if (cli->intro) fprintf(f, "\n%s", cli->intro);
    if (cli->n_opts) fputc('\n', f);
    for (size_t i = 0; i < cli->n_opts; i++) {
        const kvs_opt *o = &cli->opts[i];
        char names[64];
        snprintf(names, sizeof names, "%s%s%s%s%s", o->alias ? o->alias : "", o->alias ? ", " : "", o->name,
                 o->arg ? " " : "", o->arg ? o->arg : "");
        usage_line(f, names, o->help ? o->help : "");
    }
    usage_line(f, "-h, --help", "this text");
    if (cli->outro) fprintf(f, "\n%s", cli->outro);
}
