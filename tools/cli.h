/* cli.h: small helpers shared by the kvserve subcommands (prefix kvs_). */
#ifndef KVSERVE_TOOLS_CLI_H
#define KVSERVE_TOOLS_CLI_H

#include <stdbool.h>

/* Parses a whole decimal integer in [lo, hi] into *out; false (and *out untouched) otherwise. */
bool kvs_parse_long(const char *s, long lo, long hi, long *out);
/* Parses a whole finite float into *out; false otherwise. */
bool kvs_parse_float(const char *s, float *out);
/* Seconds of the monotonic clock. */
double kvs_now_s(void);

#endif
