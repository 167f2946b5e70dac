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
/* Parses a --device value: "auto", "cpu" or "cuda" ("gpu" is accepted for cuda) into an eng_device. */
bool kvs_parse_device(const char *s, int *device);

#endif
