/* gguf_write.c: the GGUF writer (eng_gguf_writer; see gguf.h for the contract and gguf.c for the layout). */
#include "engine/format/gguf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- writer -------------------------------------------------------------------------------------------------- */
typedef struct wkv {
    char *key;
    size_t key_len;
    uint32_t type;
    uint32_t elem_type;   /* arrays */
    uint64_t n;           /* arrays: element count */
    uint8_t scalar[8];    /* scalars: little-endian bytes (gguf_value_size(type) of them) */
    uint8_t *blob;        /* STRING: the bytes; ARRAY: the serialized elements (strings as len + bytes) */
    size_t blob_len;
} wkv;

typedef struct wtensor {
    char *name;
    size_t name_len;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[4];
    uint8_t *data;
    size_t nbytes;
} wtensor;

struct eng_gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
    size_t n_streamed;    /* tensors added with eng_gguf_add_tensor_info (no data kept) */
    uint32_t alignment;
};

int eng_gguf_writer_create(eng_gguf_writer **out) {
    if (!out) return ENG_ERR_INVALID;
    eng_gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return ENG_ERR_NOMEM;
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    *out = w;
    return 0;
}

void eng_gguf_writer_free(eng_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) { free(w->kv[i].key); free(w->kv[i].blob); }
    for (size_t i = 0; i < w->n_t; i++) { free(w->t[i].name); free(w->t[i].data); }
    free(w->kv);
    free(w->t);
    free(w);
}

static void le_write(uint8_t *p, uint64_t v, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Makes room for a new element at the end of the array w->arr (w->n_arr used of w->cap_arr, capacity starting at
 * first) after checking that no element there is named s[0..len) (its fields nm and nm_len): rc is 0 with slot
 * pointing at the new element, zeroed; ENG_ERR_INVALID when the name is taken; ENG_ERR_NOMEM. The count is not
 * raised. Serves the kvs and the tensors: a macro because wkv and wtensor differ. */
#define W_NEW_NAMED(w, arr, nm, nm_len, s, len, first, slot, rc)                                                    \
    do {                                                                                                          \
        (rc) = 0;                                                                                                 \
        for (size_t i_ = 0; i_ < (w)->n_##arr && !(rc); i_++)                                                     \
            if ((w)->arr[i_].nm_len == (len) && memcmp((w)->arr[i_].nm, (s), (len)) == 0) (rc) = ENG_ERR_INVALID; \
        if (!(rc)) KVS_GROW_ONE(rc, (w)->arr, (w)->n_##arr, (w)->cap_##arr, (first));                             \
        if (!(rc)) memset((slot) = &(w)->arr[(w)->n_##arr], 0, sizeof *(slot));                                   \
    } while (0)

/* Appends a kv with the key copied; returns it through *out (blob empty). */
static int w_new_kv(eng_gguf_writer *w, const char *key, size_t key_len, uint32_t type, wkv **out) {
    if (!w || !key || key_len == 0) return ENG_ERR_INVALID;
    wkv *kv;
    int rc;
    W_NEW_NAMED(w, kv, key, key_len, key, key_len, 16, kv, rc);
    if (rc) return rc;
    kv->key = malloc(key_len + 1);
    if (!kv->key) return ENG_ERR_NOMEM;
    memcpy(kv->key, key, key_len);
    kv->key[key_len] = 0;
    kv->key_len = key_len;
    kv->type = type;
    w->n_kv++;
    *out = kv;
    return 0;
}

/* Removes the last kv (after a failure filling it). */
static void w_drop_last(eng_gguf_writer *w) {
    wkv *kv = &w->kv[--w->n_kv];
    free(kv->key);
    free(kv->blob);
}

static bool is_alignment_key(const char *key, size_t len) {
    return len == 17 && memcmp(key, "general.alignment", 17) == 0;
}

static int w_scalar(eng_gguf_writer *w, const char *key, size_t key_len, uint32_t type, uint64_t bits) {
    if (key && is_alignment_key(key, key_len) && (type != ENG_GGUF_UINT32 || !gguf_is_pow2(bits))) return ENG_ERR_INVALID;
    wkv *kv;
    int rc = w_new_kv(w, key, key_len, type, &kv);
    if (rc) return rc;
    le_write(kv->scalar, bits, gguf_value_size(type));
    if (is_alignment_key(key, key_len)) w->alignment = (uint32_t)bits;
    return 0;
}

int eng_gguf_add_u32(eng_gguf_writer *w, const char *key, uint32_t v) {
    return w_scalar(w, key, key ? strlen(key) : 0, ENG_GGUF_UINT32, v);
}
int eng_gguf_add_i32(eng_gguf_writer *w, const char *key, int32_t v) {
    return w_scalar(w, key, key ? strlen(key) : 0, ENG_GGUF_INT32, (uint32_t)v);
}
int eng_gguf_add_f32(eng_gguf_writer *w, const char *key, float v) {
    uint32_t b;
    memcpy(&b, &v, 4);
    return w_scalar(w, key, key ? strlen(key) : 0, ENG_GGUF_FLOAT32, b);
}
int eng_gguf_add_bool(eng_gguf_writer *w, const char *key, bool v) {
    return w_scalar(w, key, key ? strlen(key) : 0, ENG_GGUF_BOOL, v ? 1 : 0);
}

static int w_str(eng_gguf_writer *w, const char *key, size_t key_len, const char *v, size_t len) {
    if (!v && len) return ENG_ERR_INVALID;
    if (key && is_alignment_key(key, key_len)) return ENG_ERR_INVALID;
    wkv *kv;
    int rc = w_new_kv(w, key, key_len, ENG_GGUF_STRING, &kv);
    if (rc) return rc;
    kv->blob = malloc(len ? len : 1);
    if (!kv->blob) { w_drop_last(w); return ENG_ERR_NOMEM; }
    if (len) memcpy(kv->blob, v, len);
    kv->blob_len = len;
    return 0;
}

int eng_gguf_add_str(eng_gguf_writer *w, const char *key, const char *v, size_t len) {
    return w_str(w, key, key ? strlen(key) : 0, v, len);
}

static int w_arr(eng_gguf_writer *w, const char *key, size_t key_len, uint32_t elem_type, const void *data,
                 uint64_t n) {
    size_t es = gguf_value_size(elem_type);
    if (es == 0 || (!data && n)) return ENG_ERR_INVALID;
    if (key && is_alignment_key(key, key_len)) return ENG_ERR_INVALID;
    if (n > SIZE_MAX / es) return ENG_ERR_INVALID;
    if (elem_type == ENG_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1) return ENG_ERR_INVALID;
    wkv *kv;
    int rc = w_new_kv(w, key, key_len, ENG_GGUF_ARRAY, &kv);
    if (rc) return rc;
    kv->elem_type = elem_type;
    kv->n = n;
    kv->blob_len = (size_t)n * es;
    kv->blob = malloc(kv->blob_len ? kv->blob_len : 1);
    if (!kv->blob) { w_drop_last(w); return ENG_ERR_NOMEM; }
    if (kv->blob_len) memcpy(kv->blob, data, kv->blob_len);
    return 0;
}

int eng_gguf_add_arr(eng_gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n) {
    return w_arr(w, key, key ? strlen(key) : 0, elem_type, data, n);
}

static int w_str_arr(eng_gguf_writer *w, const char *key, size_t key_len, const eng_gguf_str *strs, uint64_t n) {
    if (!strs && n) return ENG_ERR_INVALID;
    if (key && is_alignment_key(key, key_len)) return ENG_ERR_INVALID;
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i].ptr && strs[i].len) return ENG_ERR_INVALID;
        if (strs[i].len > SIZE_MAX - 8 - total) return ENG_ERR_INVALID;
        total += 8 + (size_t)strs[i].len;
    }
    wkv *kv;
    int rc = w_new_kv(w, key, key_len, ENG_GGUF_ARRAY, &kv);
    if (rc) return rc;
    kv->elem_type = ENG_GGUF_STRING;
    kv->n = n;
    kv->blob = malloc(total ? total : 1);
    if (!kv->blob) { w_drop_last(w); return ENG_ERR_NOMEM; }
    uint8_t *p = kv->blob;
    for (uint64_t i = 0; i < n; i++) {
        le_write(p, strs[i].len, 8);
        if (strs[i].len) memcpy(p + 8, strs[i].ptr, (size_t)strs[i].len);
        p += 8 + strs[i].len;
    }
    kv->blob_len = total;
    return 0;
}

int eng_gguf_add_str_arr(eng_gguf_writer *w, const char *key, const eng_gguf_str *strs, uint64_t n) {
    return w_str_arr(w, key, key ? strlen(key) : 0, strs, n);
}

int eng_gguf_add_kv_from(eng_gguf_writer *w, const eng_gguf_kv *kv) {
    if (!w || !kv || !kv->key.ptr || kv->key.len == 0) return ENG_ERR_INVALID;
    const char *key = kv->key.ptr;
    size_t kl = (size_t)kv->key.len;
    switch (kv->type) {
    case ENG_GGUF_UINT8: case ENG_GGUF_UINT16: case ENG_GGUF_UINT32: case ENG_GGUF_UINT64: {
        size_t bits = gguf_value_size(kv->type) * 8;
        if (bits < 64 && kv->v.u64 >> bits) return ENG_ERR_INVALID;
        return w_scalar(w, key, kl, kv->type, kv->v.u64);
    }
    case ENG_GGUF_INT8: case ENG_GGUF_INT16: case ENG_GGUF_INT32: case ENG_GGUF_INT64: {
        size_t bits = gguf_value_size(kv->type) * 8;
        if (bits < 64) {
            int64_t lo = -((int64_t)1 << (bits - 1)), hi = ((int64_t)1 << (bits - 1)) - 1;
            if (kv->v.i64 < lo || kv->v.i64 > hi) return ENG_ERR_INVALID;
        }
        return w_scalar(w, key, kl, kv->type, (uint64_t)kv->v.i64);
    }
    case ENG_GGUF_FLOAT32: {
        float f = (float)kv->v.f64;
        uint32_t b;
        memcpy(&b, &f, 4);
        return w_scalar(w, key, kl, kv->type, b);
    }
    case ENG_GGUF_FLOAT64: {
        uint64_t b;
        memcpy(&b, &kv->v.f64, 8);
        return w_scalar(w, key, kl, kv->type, b);
    }
    case ENG_GGUF_BOOL: return w_scalar(w, key, kl, kv->type, kv->v.b ? 1 : 0);
    case ENG_GGUF_STRING: return w_str(w, key, kl, kv->v.str.ptr, (size_t)kv->v.str.len);
    case ENG_GGUF_ARRAY:
        if (kv->v.arr.type == ENG_GGUF_STRING) return w_str_arr(w, key, kl, kv->v.arr.strs, kv->v.arr.n);
        return w_arr(w, key, kl, kv->v.arr.type, kv->v.arr.data, kv->v.arr.n);
    default: return ENG_ERR_INVALID;
    }
}

/* Adds a tensor; with data NULL only its info is kept (streamed by the caller after eng_gguf_write_header). */
static int w_tensor(eng_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne,
                    const void *data, size_t nbytes) {
    if (!w || !name || !*name || !ne) return ENG_ERR_INVALID;
    size_t need_bytes = eng_gguf_tensor_bytes(type, n_dims, ne);
    if (need_bytes == 0 || need_bytes != nbytes) return ENG_ERR_INVALID;
    size_t name_len = strlen(name);
    wtensor *t;
    int rc;
    W_NEW_NAMED(w, t, name, name_len, name, name_len, 32, t, rc);
    if (rc) return rc;
    t->name = strdup(name);
    t->data = data ? malloc(nbytes) : NULL;
    if (!t->name || (data && !t->data)) {
        free(t->name);
        free(t->data);
        return ENG_ERR_NOMEM;
    }
    if (data) memcpy(t->data, data, nbytes);
    else w->n_streamed++;
    t->name_len = name_len;
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < (int)n_dims ? ne[d] : 1;
    t->nbytes = nbytes;
    w->n_t++;
    return 0;
}

int eng_gguf_add_tensor(eng_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne,
                        const void *data, size_t nbytes) {
    if (!data) return ENG_ERR_INVALID;
    return w_tensor(w, name, type, n_dims, ne, data, nbytes);
}

int eng_gguf_add_tensor_info(eng_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                             const int64_t *ne) {
    return w_tensor(w, name, type, n_dims, ne, NULL, eng_gguf_tensor_bytes(type, n_dims, ne));
}

uint32_t eng_gguf_writer_alignment(const eng_gguf_writer *w) { return w ? w->alignment : 0; }

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Serializes everything before the tensor data, padded to the alignment; tensor offsets are laid out
 * consecutively, each aligned. *data_len receives the size of the (padded) data section. */
static int build_header(const eng_gguf_writer *w, uint8_t **out, size_t *out_len, size_t *data_len) {
    size_t len = 4 + 4 + 8 + 8;
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kv[i];
        len += 8 + kv->key_len + 4;
        if (kv->type == ENG_GGUF_STRING) len += 8 + kv->blob_len;
        else if (kv->type == ENG_GGUF_ARRAY) len += 4 + 8 + kv->blob_len;
        else len += gguf_value_size(kv->type);
    }
    for (size_t i = 0; i < w->n_t; i++) len += 8 + w->t[i].name_len + 4 + 8 * (size_t)w->t[i].n_dims + 4 + 8;
    size_t padded = align_up(len, w->alignment);
    uint8_t *buf = calloc(1, padded ? padded : 1);
    if (!buf) return ENG_ERR_NOMEM;
    uint8_t *p = buf;
    memcpy(p, "GGUF", 4); p += 4;
    le_write(p, 3, 4); p += 4;
    le_write(p, w->n_t, 8); p += 8;
    le_write(p, w->n_kv, 8); p += 8;
    for (size_t i = 0; i < w->n_kv; i++) {
        const wkv *kv = &w->kv[i];
        le_write(p, kv->key_len, 8); p += 8;
        memcpy(p, kv->key, kv->key_len); p += kv->key_len;
        le_write(p, kv->type, 4); p += 4;
        if (kv->type == ENG_GGUF_STRING) {
            le_write(p, kv->blob_len, 8); p += 8;
        } else if (kv->type == ENG_GGUF_ARRAY) {
            le_write(p, kv->elem_type, 4); p += 4;
            le_write(p, kv->n, 8); p += 8;
        } else {
            size_t n = gguf_value_size(kv->type);
            memcpy(p, kv->scalar, n); p += n;
            continue;
        }
        if (kv->blob_len) memcpy(p, kv->blob, kv->blob_len);
        p += kv->blob_len;
    }
    size_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        le_write(p, t->name_len, 8); p += 8;
        memcpy(p, t->name, t->name_len); p += t->name_len;
        le_write(p, t->n_dims, 4); p += 4;
        for (uint32_t d = 0; d < t->n_dims; d++) { le_write(p, (uint64_t)t->ne[d], 8); p += 8; }
        le_write(p, t->type, 4); p += 4;
        le_write(p, off, 8); p += 8;
        off = align_up(off + t->nbytes, w->alignment);
    }
    *out = buf;
    *out_len = padded;
    *data_len = off;
    return 0;
}

int eng_gguf_write_header(const eng_gguf_writer *w, void **out, size_t *size) {
    if (!w || !out || !size) return ENG_ERR_INVALID;
    uint8_t *hdr;
    size_t hdr_len, data_len;
    int rc = build_header(w, &hdr, &hdr_len, &data_len);
    if (rc) return rc;
    *out = hdr;
    *size = hdr_len;
    return 0;
}

int eng_gguf_write_memory(const eng_gguf_writer *w, void **out, size_t *size) {
    if (!w || !out || !size || w->n_streamed) return ENG_ERR_INVALID;
    uint8_t *hdr;
    size_t hdr_len, data_len;
    int rc = build_header(w, &hdr, &hdr_len, &data_len);
    if (rc) return rc;
    uint8_t *buf = realloc(hdr, hdr_len + data_len ? hdr_len + data_len : 1);
    if (!buf) { free(hdr); return ENG_ERR_NOMEM; }
    memset(buf + hdr_len, 0, data_len);
    size_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        memcpy(buf + hdr_len + off, w->t[i].data, w->t[i].nbytes);
        off = align_up(off + w->t[i].nbytes, w->alignment);
    }
    *out = buf;
    *size = hdr_len + data_len;
    return 0;
}

static int write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t k = write(fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

int eng_gguf_write(const eng_gguf_writer *w, const char *path, char *err, size_t err_len) {
    if (err && err_len) err[0] = 0;
    if (!w || !path || !*path || w->n_streamed)
        return gguf_fail_msg(path, err, err_len, ENG_ERR_INVALID, "invalid arguments");
    uint8_t *hdr;
    size_t hdr_len, data_len;
    int rc = build_header(w, &hdr, &hdr_len, &data_len);
    if (rc) return gguf_fail_msg(path, err, err_len, rc, "out of memory building the header");
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) { free(hdr); return gguf_fail_msg(path, err, err_len, ENG_ERR_NOMEM, "out of memory"); }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", 12);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        free(hdr);
        free(tmp);
        return gguf_fail_msg(path, err, err_len, ENG_ERR_IO, "cannot create a temporary file beside it: %s", strerror(e));
    }
    static const uint8_t zeros[256] = {0};
    int bad = write_all(fd, hdr, hdr_len);
    size_t off = 0;
    for (size_t i = 0; i < w->n_t && !bad; i++) {
        bad = write_all(fd, w->t[i].data, w->t[i].nbytes);
        size_t end = align_up(off + w->t[i].nbytes, w->alignment);
        size_t pad = end - off - w->t[i].nbytes;
        while (!bad && pad > 0) {
            size_t k = pad < sizeof zeros ? pad : sizeof zeros;
            bad = write_all(fd, zeros, k);
            pad -= k;
        }
        off = end;
    }
    int e = errno;
    free(hdr);
    if (!bad && fsync(fd) != 0) { bad = 1; e = errno; }
    /* mkstemp makes the file 0600; models are meant to be readable by others. */
    if (!bad && fchmod(fd, 0644) != 0) { bad = 1; e = errno; }
    if (close(fd) != 0 && !bad) { bad = 1; e = errno; }
    if (!bad && rename(tmp, path) != 0) { bad = 1; e = errno; }
    if (bad) {
        unlink(tmp);
        free(tmp);
        return gguf_fail_msg(path, err, err_len, ENG_ERR_IO, "cannot write: %s", strerror(e));
    }
    free(tmp);
    return 0;
}
