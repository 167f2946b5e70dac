/* test_cli.c: the option-table parser of the kvserve subcommands (tools/cli.c), through the binary: the forms
 * every command accepts, the messages and exit statuses of usage errors, --help generated from the tables. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helper_shared.h"

static void rm_dir(char *d) {
    char p[256];
    snprintf(p, sizeof p, "%s/log", d);
    unlink(p);
    rmdir(d);
    free(d);
}

static char *tmpdir(void) {
    char *d = strdup("/tmp/kvs-cli-XXXXXX");
    cr_assert(d && mkdtemp(d));
    return d;
}

/* Runs kvserve with args; asserts the exit status and that the output holds want (when not NULL). */
static void expect(const char *dir, const char *const *args, int status, const char *want) {
    char *log = NULL;
    int st = kvt_run_kvserve(dir, args, &log);
    cr_assert_eq(st, status, "kvserve %s %s: exit %d, want %d:\n%s", args[0], args[1] ? args[1] : "", st, status, log);
    if (want) cr_assert(strstr(log, want), "kvserve %s: no '%s' in:\n%s", args[0], want, log);
    free(log);
}

Test(cli, forms_name_value_equals_and_short) {
    char *dir = tmpdir();
    /* --name=value, --name value and a short alias give the same result */
    expect(dir, (const char *[]){"mkmodel", "--dry-run", "--preset=tiny", "--layers=1", NULL}, 0, "1 blocks");
    expect(dir, (const char *[]){"mkmodel", "--dry-run", "--preset", "tiny", "--layers", "3", NULL}, 0, "3 blocks");
    /* the preset is the starting point wherever it stands */
    expect(dir, (const char *[]){"mkmodel", "--dry-run", "--layers", "3", "--preset", "tiny", NULL}, 0, "3 blocks");
    expect(dir, (const char *[]){"mkmodel", "--dry-run", "--preset", "tiny", "--untied", "--tied", NULL}, 0, ", tied");
    rm_dir(dir);
}

Test(cli, usage_errors_name_the_option) {
    char *dir = tmpdir();
    expect(dir, (const char *[]){"bench", "--bogus", NULL}, 2, "kvserve bench: unknown option '--bogus' (see --help)");
    expect(dir, (const char *[]){"bench", "-m", "x", "-p", "0", NULL}, 2, "-p wants an integer in 1..8192, got '0'");
    expect(dir, (const char *[]){"bench", "-m", "x", "-b", "1,x", NULL}, 2, "-b wants a comma-separated list");
    expect(dir, (const char *[]){"bench", "-m", "x", "--device", "tpu", NULL}, 2, "--device wants auto, cpu or cuda");
    expect(dir, (const char *[]){"generate", "-m", NULL}, 2, "kvserve generate: -m needs a value");
    expect(dir, (const char *[]){"generate", "-m", "x", "--temp", "warm", NULL}, 2, "--temp wants a finite number");
    expect(dir, (const char *[]){"generate", "-m", "x", NULL}, 2, "exactly one of -p PROMPT / -f FILE");
    expect(dir, (const char *[]){"tokenize", "--json=1", NULL}, 2, "kvserve tokenize: --json takes no value");
    expect(dir, (const char *[]){"tokenize", "stray", NULL}, 2, "unexpected argument 'stray'");
    expect(dir, (const char *[]){"render-template", "-t", "x", NULL}, 2, "need -t TEMPLATE and -i CONVERSATION");
    expect(dir, (const char *[]){"quantize", "--threads=0", "a", "b", "Q4_0", NULL}, 2,
           "--threads wants an integer in 1..1024, got '0'");
    expect(dir, (const char *[]){"quantize", "a", "b", "Q4_0", "d", NULL}, 2, "too many arguments");
    expect(dir, (const char *[]){"mkmodel", "-o", "x", "--rope-base", "0.5", NULL}, 2,
           "--rope-base wants a number in 1..1e+12, got '0.5'");
    expect(dir, (const char *[]){"mkmodel", "-o", "x", "--type", "q4_0", NULL}, 2, "--type wants f32, f16 or q8_0");
    expect(dir, (const char *[]){"mkmodel", "--preset", "huge", NULL}, 2, "unknown preset 'huge' (default, tiny,");
    rm_dir(dir);
}

Test(cli, help_comes_from_the_tables) {
    char *dir = tmpdir();
    const char *cmds[] = {"bench", "generate", "mkmodel", "quantize", "render-template", "tokenize"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "usage: kvserve %s ", cmds[i]);
        expect(dir, (const char *[]){cmds[i], "--help", NULL}, 0, want);
        expect(dir, (const char *[]){cmds[i], "-h", NULL}, 0, "-h, --help");
    }
    expect(dir, (const char *[]){"generate", "--help", NULL}, 0, "--top-logprobs K");
    expect(dir, (const char *[]){"bench", "--help", NULL}, 0, "-t, --threads N");
    expect(dir, (const char *[]){"mkmodel", "--help", NULL}, 0, "bench-8b    the Llama-3.1-8B shape");
    expect(dir, (const char *[]){"quantize", "--help", NULL}, 0, "Q4_K_M (or Q4_K)");
    rm_dir(dir);
}
