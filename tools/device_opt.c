/* device_opt.c: the --device option shared by the subcommands that create an engine context. */
#include <string.h>

#include "engine/engine.h"
#include "tools/commands.h"

bool kvs_parse_device(const char *s, int *device) {
    if (!s || !device) return false;
    if (!strcmp(s, "auto")) *device = ENG_DEVICE_AUTO;
    else if (!strcmp(s, "cpu")) *device = ENG_DEVICE_CPU;
    else if (!strcmp(s, "cuda") || !strcmp(s, "gpu")) *device = ENG_DEVICE_CUDA;
    else return false;
    return true;
}

bool kvs_opt_device(void *field, const char *s) { return kvs_parse_device(s, field); }
