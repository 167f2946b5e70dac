/* gguf_internal.h: what the GGUF reader (gguf.c) and writer (gguf_write.c) share. Not a public header. */
#ifndef KVSERVE_GGUF_INTERNAL_H
#define KVSERVE_GGUF_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/format/gguf.h"

#define GGUF_DEFAULT_ALIGNMENT 32u

static inline bool gguf_is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

/* Bytes of one scalar value of GGUF value type `type` (0 for strings, arrays and unknown types). */
size_t gguf_value_size(uint32_t type);

/* Writes "<name>: <message>" into err (when err_len > 0) and returns code. */
int gguf_fail_msg(const char *name, char *err, size_t err_len, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
