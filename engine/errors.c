/* errors.c: eng_strerror, kept as a thin wrapper of common's kvs_strerror (ENG_* codes are kvs_err values). */
#include "engine/engine.h"

const char *eng_strerror(int err) { return kvs_strerror(err); }
