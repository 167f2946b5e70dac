/* cmd_serve.c: `kvserve serve` (the default command): configuration from flags/file/env, then srv_main. */
#include <stdio.h>

#include "server/server.h"
#include "tools/commands.h"

int kvs_cmd_serve(int argc, char **argv) {
    srv_config cfg;
    srv_config_default(&cfg);
    char err[1024];
    int r = srv_config_from_args(&cfg, argc, argv, err, sizeof err);
    if (r == SRV_ERR_HELP) return 0;
    if (r != SRV_OK) {
        fprintf(stderr, "kvserve serve: %s\n", err);
        return 2;
    }
    return srv_main(&cfg);
}
