/* cli.h: the option-table parser and small helpers shared by the kvserve subcommands (prefix kvs_).
 *
 * What it is: one parser for every subcommand's command line. A subcommand describes its options in a static
 * table of kvs_opt (names, kind, the field of its options struct by offset, range, help) and calls
 * kvs_cli_parse; the parser gives every command the same forms and the same messages, and kvs_cli_usage prints
 * --help from the same table.
 * Forms: `--name VALUE`, `--name=VALUE` (long names), `-x VALUE` (short names), flags without a value, `-h` /
 * `--help`; an argument that does not start with '-' (or is "-" alone) is a positional. The next argument is
 * always taken as the value, even when it starts with '-' (so `--seed -1` is a range error, not a missing value).
 * Messages (on stderr, each "kvserve CMD: ..."): "unknown option 'X' (see --help)", "X needs a value",
 * "X takes no value", "X wants an integer in LO..HI, got 'V'", "X wants a number in LO..HI, got 'V'",
 * "X wants EXPECT, got 'V'" (setters), "too many arguments (see --help)".
 * Must never: exit the process or keep state between calls. */
#ifndef KVSERVE_TOOLS_CLI_H
#define KVSERVE_TOOLS_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum kvs_opt_kind {
    KVS_OPT_FLAG,   /* bool field, set to .flag_value; takes no value */
    KVS_OPT_LONG,   /* long field, a whole decimal integer in [lo, hi] */
    KVS_OPT_I64,    /* int64_t field, a whole decimal integer in [lo, hi] */
    KVS_OPT_FLOAT,  /* float field, a finite number in [lo, hi] (lo == hi: any finite number) */
    KVS_OPT_DOUBLE, /* double field, a finite number in [lo, hi] (lo == hi: any finite number) */
    KVS_OPT_STR,    /* const char * field: the argument itself (not copied) */
    KVS_OPT_SET,    /* the setter .set(field, value): false for a bad value, described by .expect */
} kvs_opt_kind;

typedef struct kvs_opt {
    const char *name;        /* "--threads", or a short name alone ("-p") */
    const char *alias;       /* a second name ("-t"), or NULL */
    kvs_opt_kind kind;
    size_t off;              /* offset of the field in the command's options struct */
    double lo, hi;           /* ranges of LONG, I64, FLOAT and DOUBLE (integers: exact up to 2^53) */
    bool flag_value;         /* FLAG */
    bool (*set)(void *field, const char *value); /* SET */
    const char *expect;      /* SET: what a good value is ("auto, cpu or cuda") */
    const char *arg;         /* the value's name in --help ("N", "FILE"); NULL for flags */
    const char *help;        /* may hold '\n': continuation lines are indented under the first */
} kvs_opt;

typedef struct kvs_cli {
    const char *cmd;         /* "bench": messages start "kvserve bench: " */
    const char *synopsis;    /* after "usage: kvserve CMD " */
    const char *intro;       /* printed between the usage line and the options, or NULL */
    const char *outro;       /* printed after the options, or NULL */
    const kvs_opt *opts;
    size_t n_opts;
    int max_pos;             /* positional arguments accepted (0: none) */
} kvs_cli;

/* Parses argv[1..argc-1] (argv[0] is the subcommand name) into the struct at base, each option through its
 * table entry; positionals go to pos[0..max_pos-1] (pos may be NULL when max_pos is 0) and their count to *npos
 * (may be NULL). Returns 0 to go on, 1 after -h/--help (usage printed on stdout: exit 0), 2 on a usage error
 * (the message printed on stderr: exit 2). Fields of options not given keep their values. */
int kvs_cli_parse(const kvs_cli *cli, void *base, int argc, char **argv, const char **pos, int *npos);
/* The --help text, generated from the table. */
void kvs_cli_usage(const kvs_cli *cli, FILE *f);
/* Prints "kvserve CMD: MESSAGE\n" on stderr (printf format) and returns 2, the exit status of a usage error. */
int kvs_cli_fail(const kvs_cli *cli, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parses a whole decimal integer in [lo, hi] into *out; false (and *out untouched) otherwise. */
bool kvs_parse_long(const char *s, long lo, long hi, long *out);
/* Parses a whole finite float into *out; false otherwise. */
bool kvs_parse_float(const char *s, float *out);
/* Seconds of the monotonic clock. */
double kvs_now_s(void);

#endif
