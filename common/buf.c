/* buf.c: kvs_buf, the one growable byte buffer, and the growable-array and free helpers. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

int kvs_buf_reserve(kvs_buf *b, size_t n) {
    if (b->oom) return KVS_ERR_NOMEM;
    if (n > SIZE_MAX - 1 - b->len) { b->oom = true; return KVS_ERR_TOO_LARGE; }
    size_t need = b->len + n + 1;
    if (b->max && b->len + n > b->max) { b->oom = true; return KVS_ERR_TOO_LARGE; }
    if (need <= b->cap) return KVS_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->data, cap);
    if (!p) { b->oom = true; return KVS_ERR_NOMEM; }
    b->data = p;
    b->cap = cap;
    return KVS_OK;
}

int kvs_buf_append(kvs_buf *b, const void *s, size_t n) {
    int rc = kvs_buf_reserve(b, n);
    if (rc) return rc;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return KVS_OK;
}

int kvs_buf_puts(kvs_buf *b, const char *s) { return kvs_buf_append(b, s, strlen(s)); }

int kvs_buf_putc(kvs_buf *b, char c) { return kvs_buf_append(b, &c, 1); }

int kvs_buf_vprintf(kvs_buf *b, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) return KVS_ERR_INVALID;
    int rc = kvs_buf_reserve(b, (size_t)n);
    if (rc) return rc;
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
    return KVS_OK;
}

int kvs_buf_printf(kvs_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = kvs_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void kvs_buf_clear(kvs_buf *b) {
    b->len = 0;
    b->oom = false;
    if (b->data) b->data[0] = 0;
}

char *kvs_buf_take(kvs_buf *b) {
    char *p = NULL;
    if (!b->oom) {
        if (!b->data && kvs_buf_reserve(b, 0) == KVS_OK) b->data[0] = 0;
        p = b->oom ? NULL : b->data;
        if (p) b->data = NULL;
    }
    kvs_buf_free(b);
    return p;
}

void kvs_buf_free(kvs_buf *b) {
    free(b->data);
    size_t max = b->max;
    *b = (kvs_buf){0};
    b->max = max;
}

void *kvs_grow(void *p, size_t *cap, size_t need, size_t elem, size_t first) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : (first ? first : 1);
    while (c < need) {
        if (c > SIZE_MAX / 2) return NULL;
        c *= 2;
    }
    if (elem && c > SIZE_MAX / elem) return NULL;
    void *np = realloc(p, c * elem);
    if (!np) return NULL;
    *cap = c;
    return np;
}

void kvs_free_all(void *const *ptrs, size_t n) {
    for (size_t i = 0; i < n; i++) free(ptrs[i]);
}

int kvs_read_file(const char *path, char **out, size_t *len) {
    if (!path || !out || !len) return KVS_ERR_INVALID;
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return KVS_ERR_IO;
    kvs_buf b = {0};
    char chunk[65536];
    size_t n;
    int rc = KVS_OK;
    while (rc == KVS_OK && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (kvs_buf_append(&b, chunk, n)) rc = KVS_ERR_NOMEM;
    if (rc == KVS_OK && ferror(f)) rc = KVS_ERR_IO;
    fclose(f);
    size_t l = b.len;
    char *s = rc == KVS_OK ? kvs_buf_take(&b) : NULL;
    kvs_buf_free(&b);
    if (rc == KVS_OK && !s) rc = KVS_ERR_NOMEM;
    if (rc != KVS_OK) return rc;
    *out = s;
    *len = l;
    return KVS_OK;
}
