/* errors.c: text for the ENG_* result codes of engine.h. */
#include "engine/engine.h"

const char *eng_strerror(int err) {
    switch (err) {
    case ENG_OK: return "success";
    case ENG_ERR_INVALID: return "invalid argument";
    case ENG_ERR_NOMEM: return "out of memory";
    case ENG_ERR_IO: return "I/O error";
    case ENG_ERR_FORMAT: return "malformed file";
    case ENG_ERR_UNSUPPORTED: return "unsupported model or tensor type";
    case ENG_ERR_NOT_FOUND: return "not found";
    case ENG_ERR_TYPE: return "wrong value type";
    case ENG_ERR_TOO_LARGE: return "output buffer too small";
    case ENG_ERR_KV_FULL: return "KV cache full";
    case ENG_ERR_KV: return "KV cache error";
    case ENG_ERR_DEVICE: return "GPU device error";
    default: return "unknown error";
    }
}
