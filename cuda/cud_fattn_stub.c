/* cud_fattn_stub.c: the tensor-core attention's self-test in a build without CUDA (no device). */
#include <stdio.h>

#include "common/common.h"
#include "cuda/cud_fattn.h"

#ifndef KVSERVE_HAVE_CUDA
int cud_fattn_selftest(char *msg, size_t msg_len) {
    if (msg && msg_len) snprintf(msg, msg_len, "built without CUDA");
    return KVS_ERR_UNSUPPORTED;
}
#endif
