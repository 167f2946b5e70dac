/* host_alloc.c: the default kvc_allocator, plain host memory aligned to 64 bytes. */
#include "cache/kv_cache.h"

#include <stdlib.h>
#include <string.h>

static void *host_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    if (bytes == 0) bytes = 1;
    /* aligned_alloc wants a multiple of the alignment. */
    if (bytes > SIZE_MAX - 63) return NULL;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    return aligned_alloc(64, rounded);
}

static int host_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (!dst || !src) return -1;
    memcpy(dst, src, bytes);
    return 0;
}

static void host_free(void *ctx, void *ptr) {
    (void)ctx;
    free(ptr);
}

static const kvc_allocator host_allocator = {host_alloc, host_copy, host_free, NULL};

const kvc_allocator *kvc_host_allocator(void) { return &host_allocator; }
