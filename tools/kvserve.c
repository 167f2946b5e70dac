/* kvserve: one executable, subcommands dispatched here. `serve` is the default. */
#include <stdio.h>
#include <string.h>

#include "tools/commands.h"

#ifndef KVSERVE_VERSION
#define KVSERVE_VERSION "dev"
#endif

typedef struct kvs_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} kvs_command;

static int cmd_version(int argc, char **argv) {
    (void)argc; (void)argv;
    printf("kvserve %s\n", KVSERVE_VERSION);
    return 0;
}

static const kvs_command commands[] = {
    /* KVS_COMMANDS: one line per subcommand, alphabetical */
    {"bench", kvs_cmd_bench, "measure prefill and multi-sequence decode speed on the CPU"},
    {"generate", kvs_cmd_generate, "generate completions for one prompt or a batch of prompts"},
    {"mkmodel", kvs_cmd_mkmodel, "write a deterministic random-weight GGUF model"},
    {"quantize", kvs_cmd_quantize, "convert a f32/f16/bf16 GGUF model to Q4_0, Q8_0 or a K-quant mixture"},
    {"render-template", kvs_cmd_render_template, "render a chat template (Jinja) for a conversation"},
    {"serve", kvs_cmd_serve, "run the HTTP server (default)"},
    {"tokenize", kvs_cmd_tokenize, "tokenize text with a model's vocabulary"},
    {"version", cmd_version, "print the version"},
};

static void usage(FILE *f) {
    fprintf(f, "kvserve %s: a multi-sequence LLM inference server\n\nusage: kvserve [COMMAND] [OPTIONS]\n\n"
               "commands:\n", KVSERVE_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-16s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`kvserve COMMAND --help` describes a command's options. Without a command, `serve` runs.\n");
}

int main(int argc, char **argv) {
    size_t n = sizeof commands / sizeof commands[0];
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))) {
        usage(stdout);
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "--version")) return cmd_version(0, NULL);
    if (argc >= 2 && argv[1][0] != '-') {
        for (size_t i = 0; i < n; i++)
            if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
        fprintf(stderr, "kvserve: unknown command '%s'\n\n", argv[1]);
        usage(stderr);
        return 2;
    }
    /* No command (or options only): serve. */
    for (size_t i = 0; i < n; i++)
        if (!strcmp(commands[i].name, "serve")) {
            argv[0] = (char *)"serve";
            return commands[i].run(argc, argv);
        }
    usage(stderr);
    return 2;
}
