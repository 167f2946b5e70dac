/* errors.c: kvs_strerror, the one text table for kvs_err, and kvs_errf, the one error-message helper. */
#include <stdio.h>

#include "common/common.h"

const char *kvs_strerror(int err) {
    switch ((kvs_err)err) {
    case KVS_OK: return "success";
    case KVS_ERR_INVALID: return "invalid argument";
    case KVS_ERR_NOMEM: return "out of memory";
    case KVS_ERR_IO: return "I/O error";
    case KVS_ERR_FORMAT: return "malformed input";
    case KVS_ERR_UNSUPPORTED: return "unsupported";
    case KVS_ERR_NOT_FOUND: return "not found";
    case KVS_ERR_TYPE: return "wrong value type";
    case KVS_ERR_TOO_LARGE: return "too large";
    case KVS_ERR_KV_FULL: return "KV cache full";
    case KVS_ERR_KV: return "KV cache error";
    case KVS_ERR_DEVICE: return "GPU device error";
    case KVS_ERR_NO_SLOT: return "no free sequence slot";
    case KVS_ERR_BAD_SEQ: return "bad sequence id";
    case KVS_ERR_POSITION: return "position out of range";
    case KVS_ERR_STATE: return "not allowed in the current state";
    case KVS_ERR_QUEUE_FULL: return "queue full";
    case KVS_ERR_STOPPED: return "stopped";
    case KVS_ERR_THREAD: return "thread creation failed";
    case KVS_ERR_TOO_LONG: return "does not fit the context";
    case KVS_ERR_BIND: return "cannot bind address";
    case KVS_ERR_CLOSED: return "connection closed";
    case KVS_ERR_BACKPRESSURE: return "peer too slow";
    case KVS_ERR_MODEL: return "model load failed";
    case KVS_ERR_SYNTAX: return "syntax error";
    case KVS_ERR_LIMIT: return "limit reached";
    case KVS_ERR_RAISED: return "raised by the template";
    case KVS_ERR_HELP: return "help requested";
    }
    return "unknown error";
}

int kvs_verrf(char *err, size_t err_len, int code, const char *fmt, va_list ap) {
    if (err && err_len > 0) vsnprintf(err, err_len, fmt, ap);
    return code;
}

int kvs_errf(char *err, size_t err_len, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvs_verrf(err, err_len, code, fmt, ap);
    va_end(ap);
    return code;
}
