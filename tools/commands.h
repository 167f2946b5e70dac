/* commands.h: the kvserve subcommands (prefix kvs_). Each takes the arguments after the subcommand name
 * (argv[0] is the subcommand name) and returns the process exit status.
 *
 * What it is: the command line (kvserve.c dispatches to cmd_*.c). Owns: only what one command run needs.
 * Must never: hold logic the daemon also needs: `generate` runs through the server's scheduler, `serve` through
 * server/server.h; only `bench` drives the engine directly, to time the engine alone. */
#ifndef KVSERVE_TOOLS_COMMANDS_H
#define KVSERVE_TOOLS_COMMANDS_H

int kvs_cmd_serve(int argc, char **argv);
int kvs_cmd_generate(int argc, char **argv);
int kvs_cmd_tokenize(int argc, char **argv);
int kvs_cmd_mkmodel(int argc, char **argv);
int kvs_cmd_bench(int argc, char **argv);
int kvs_cmd_quantize(int argc, char **argv);
int kvs_cmd_render_template(int argc, char **argv);

#include <stdbool.h>
#include <stddef.h>

/* Parses a --device value: "auto", "cpu" or "cuda" ("gpu" is accepted for cuda) into an eng_device. */
bool kvs_parse_device(const char *s, int *device);
/* The same as an option-table setter (tools/cli.h): field is an int. */
bool kvs_opt_device(void *field, const char *s);

/* The option-table entries (tools/cli.h) that several subcommands share: --threads into a long field,
 * --device into an int field. */
#define KVS_OPT_THREADS(type, field)                                                                             \
    {"--threads", "-t", KVS_OPT_LONG, offsetof(type, field), 1, 1024, .arg = "N",                                \
     .help = "worker threads (default: the number of cores)"}
#define KVS_OPT_DEVICE(type, field)                                                                              \
    {"--device", NULL, KVS_OPT_SET, offsetof(type, field), .set = kvs_opt_device, .expect = "auto, cpu or cuda", \
     .arg = "D", .help = "auto (default: the GPU when there is one), cpu or cuda"}

#endif
