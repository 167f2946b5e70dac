/*
 * gguf.c: GGUF v2/v3 reader (mmap or memory); the writer is in gguf_write.c. See gguf.h for the contract.
 *
 * File layout (all little-endian):
 *   "GGUF" | version u32 | n_tensors u64 | n_kv u64
 *   n_kv x (key: string, value type u32, value)
 *   n_tensors x (name: string, n_dims u32, ne[n_dims] u64, type u32, offset u64)
 *   padding to `alignment` | tensor data (each tensor at data_offset + offset)
 * string = u64 length + bytes; array = elem type u32 + count u64 + elements.
 *
 * The reader never trusts a number from the file: each read is checked against the bytes left, counts are
 * bounded by the smallest encoding of what they count before anything is allocated, and products and sums
 * are overflow-checked.
 */
#include "engine/format/gguf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#define GGUF_N_VALUE_TYPES 13u

/* ---- ggml tensor type sizes ----------------------------------------------------------------------------- */
/* (values per block, bytes per block) for the ggml type ids that exist; holes are ids ggml removed.
 * Kept private here so the reader does not depend on the quant module; test_gguf cross-checks the ids
 * quant.h knows against eng_qtype_get once both are linked. */
typedef struct gguf_tsize { uint16_t block_elems; uint16_t block_bytes; const char *name; } gguf_tsize;

static const gguf_tsize k_tsizes[] = {
    [0] = {1, 4, "f32"},        [1] = {1, 2, "f16"},        [2] = {32, 18, "q4_0"},
    [3] = {32, 20, "q4_1"},     [6] = {32, 22, "q5_0"},     [7] = {32, 24, "q5_1"},
    [8] = {32, 34, "q8_0"},     [9] = {32, 36, "q8_1"},     [10] = {256, 84, "q2_K"},
    [11] = {256, 110, "q3_K"},  [12] = {256, 144, "q4_K"},  [13] = {256, 176, "q5_K"},
    [14] = {256, 210, "q6_K"},  [15] = {256, 292, "q8_K"},  [16] = {256, 66, "iq2_xxs"},
    [17] = {256, 74, "iq2_xs"}, [18] = {256, 98, "iq3_xxs"}, [19] = {256, 50, "iq1_s"},
    [20] = {32, 18, "iq4_nl"},  [21] = {256, 110, "iq3_s"}, [22] = {256, 82, "iq2_s"},
    [23] = {256, 136, "iq4_xs"}, [24] = {1, 1, "i8"},       [25] = {1, 2, "i16"},
    [26] = {1, 4, "i32"},       [27] = {1, 8, "i64"},       [28] = {1, 8, "f64"},
    [29] = {256, 56, "iq1_m"},  [30] = {1, 2, "bf16"},      [34] = {256, 54, "tq1_0"},
    [35] = {256, 66, "tq2_0"},  [39] = {32, 17, "mxfp4"},
};

static const gguf_tsize *tsize_get(uint32_t type) {
    if (type >= sizeof k_tsizes / sizeof k_tsizes[0] || k_tsizes[type].block_elems == 0) return NULL;
    return &k_tsizes[type];
}

/* Bytes of a tensor, or 0 when ne[0] is not a whole number of blocks or the size overflows. */
static size_t tensor_nbytes(const gguf_tsize *ts, const int64_t ne[4]) {
    if (ne[0] % ts->block_elems != 0) return 0;
    uint64_t n = (uint64_t)(ne[0] / ts->block_elems);
    if (__builtin_mul_overflow(n, (uint64_t)ts->block_bytes, &n)) return 0;
    for (int d = 1; d < 4; d++)
        if (__builtin_mul_overflow(n, (uint64_t)ne[d], &n)) return 0;
    if (n > SIZE_MAX) return 0;
    return (size_t)n;
}

size_t gguf_value_size(uint32_t type) {
    switch (type) {
    case ENG_GGUF_UINT8: case ENG_GGUF_INT8: case ENG_GGUF_BOOL: return 1;
    case ENG_GGUF_UINT16: case ENG_GGUF_INT16: return 2;
    case ENG_GGUF_UINT32: case ENG_GGUF_INT32: case ENG_GGUF_FLOAT32: return 4;
    case ENG_GGUF_UINT64: case ENG_GGUF_INT64: case ENG_GGUF_FLOAT64: return 8;
    default: return 0; /* STRING, ARRAY, out of range */
    }
}


static bool str_eq(eng_gguf_str s, const char *c, size_t n) { return s.len == n && memcmp(s.ptr, c, n) == 0; }

/* ---- name index: open addressing over the eng_gguf_str at offset 0 of each record ----------------------- */
/* The hash is seeded per file with random bits, so a hostile file cannot make all its names collide and turn
 * opening into quadratic work. */
typedef struct gguf_index {
    int64_t *slots;  /* record index + 1; 0 = empty */
    size_t mask;
    uint64_t seed;
} gguf_index;

static int index_init(gguf_index *ix, int64_t n, uint64_t seed) {
    size_t cap = 8;
    while (cap < (size_t)n * 2) cap <<= 1;
    ix->slots = calloc(cap, sizeof *ix->slots);
    if (!ix->slots) return ENG_ERR_NOMEM;
    ix->mask = cap - 1;
    ix->seed = seed;
    return 0;
}

static uint64_t random_seed(const void *salt) {
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed)
        seed = (uint64_t)(uintptr_t)salt * 0x9e3779b97f4a7c15ull;  /* ASLR bits: still not predictable offline */
    return seed;
}

static const eng_gguf_str *rec_key(const void *base, size_t stride, int64_t i) {
    return (const eng_gguf_str *)((const char *)base + (size_t)i * stride);
}

/* Finds key; returns its record index or -1. With insert >= 0, adds record `insert` when key is absent. */
static int64_t index_lookup(const gguf_index *ix, const void *base, size_t stride, const char *key, size_t len,
                            int64_t insert) {
    if (!ix->slots) return -1;
    size_t h = (size_t)XXH3_64bits_withSeed(key, len, ix->seed) & ix->mask;
    for (;;) {
        int64_t s = ix->slots[h];
        if (s == 0) {
            if (insert >= 0) ix->slots[h] = insert + 1;
            return -1;
        }
        if (str_eq(*rec_key(base, stride, s - 1), key, len)) return s - 1;
        h = (h + 1) & ix->mask;
    }
}

/* ---- reader -------------------------------------------------------------------------------------------------- */
struct eng_gguf {
    char *name;
    const uint8_t *data;   /* the whole file */
    size_t size;
    void *map;             /* mmap base when opened from a path, else NULL */
    size_t map_len;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;  /* start of the tensor data section */
    int64_t n_kv;
    eng_gguf_kv *kv;
    int64_t n_tensors;
    eng_gguf_tensor *tensors;
    gguf_index kv_index;
    gguf_index tensor_index;
};

typedef struct rd {
    const uint8_t *p;
    size_t size;
    size_t pos;
    const char *name;
    char *err;
    size_t err_len;
} rd;

/* kvs_errf with the file's name in front of the message. */
int gguf_fail_msg(const char *name, char *err, size_t err_len, int code, const char *fmt, ...) {
    if (err && err_len > 0) {
        int n = snprintf(err, err_len, "%s: ", name ? name : "<gguf>");
        if (n >= 0 && (size_t)n < err_len) {
            va_list ap;
            va_start(ap, fmt);
            kvs_verrf(err + n, err_len - (size_t)n, code, fmt, ap);
            va_end(ap);
        }
    }
    return code;
}
#define FAIL(r, code, ...) gguf_fail_msg((r)->name, (r)->err, (r)->err_len, (code), __VA_ARGS__)

/* A printable, bounded copy of a name from the file for messages. */
static const char *safe_name(eng_gguf_str s, char *buf, size_t cap) {
    size_t n = s.len < cap - 4 ? (size_t)s.len : cap - 4;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        buf[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (n < s.len) { memcpy(buf + n, "...", 3); n += 3; }
    buf[n] = 0;
    return buf;
}

static int need(rd *r, uint64_t n, const char *what) {
    if (n > r->size - r->pos)
        return FAIL(r, ENG_ERR_FORMAT, "truncated file: %s needs %llu bytes at byte %zu but only %zu are left", what,
                    (unsigned long long)n, r->pos, r->size - r->pos);
    return 0;
}

static uint64_t le_read(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int rd_u32(rd *r, uint32_t *v, const char *what) {
    int rc = need(r, 4, what);
    if (rc) return rc;
    *v = (uint32_t)le_read(r->p + r->pos, 4);
    r->pos += 4;
    return 0;
}

static int rd_u64(rd *r, uint64_t *v, const char *what) {
    int rc = need(r, 8, what);
    if (rc) return rc;
    *v = le_read(r->p + r->pos, 8);
    r->pos += 8;
    return 0;
}

static int rd_str(rd *r, eng_gguf_str *s, const char *what) {
    uint64_t len;
    size_t at = r->pos;
    int rc = rd_u64(r, &len, what);
    if (rc) return rc;
    if (len > r->size - r->pos)
        return FAIL(r, ENG_ERR_FORMAT, "%s: string length %llu at byte %zu exceeds the %zu bytes left in the file",
                    what, (unsigned long long)len, at, r->size - r->pos);
    s->ptr = (const char *)(r->p + r->pos);
    s->len = len;
    r->pos += (size_t)len;
    return 0;
}

/* Reads one scalar of type t (validated by the caller) into kv->v. */
static int rd_scalar(rd *r, uint32_t t, eng_gguf_kv *kv, const char *key) {
    size_t n = gguf_value_size(t);
    int rc = need(r, n, "a value");
    if (rc) return rc;
    uint64_t raw = le_read(r->p + r->pos, n);
    switch (t) {
    case ENG_GGUF_UINT8: case ENG_GGUF_UINT16: case ENG_GGUF_UINT32: case ENG_GGUF_UINT64:
        kv->v.u64 = raw; break;
    case ENG_GGUF_INT8: kv->v.i64 = (int8_t)raw; break;
    case ENG_GGUF_INT16: kv->v.i64 = (int16_t)raw; break;
    case ENG_GGUF_INT32: kv->v.i64 = (int32_t)raw; break;
    case ENG_GGUF_INT64: kv->v.i64 = (int64_t)raw; break;
    case ENG_GGUF_FLOAT32: { uint32_t b = (uint32_t)raw; float f; memcpy(&f, &b, 4); kv->v.f64 = f; break; }
    case ENG_GGUF_FLOAT64: { double d; memcpy(&d, &raw, 8); kv->v.f64 = d; break; }
    case ENG_GGUF_BOOL:
        if (raw > 1)
            return FAIL(r, ENG_ERR_FORMAT, "kv '%s': bool value %llu at byte %zu is neither 0 nor 1", key,
                        (unsigned long long)raw, r->pos);
        kv->v.b = raw != 0;
        break;
    default: return FAIL(r, ENG_ERR_FORMAT, "kv '%s': bad scalar type %u", key, t);
    }
    r->pos += n;
    return 0;
}

/* The name that opens entry i of a kind ("the key of kv", "the name of tensor") into *s, and its printable form
 * (in buf) into *shown, for the messages about the entry. */
static int rd_entry_name(rd *r, const char *kind, int64_t i, eng_gguf_str *s, char *buf, size_t cap,
                         const char **shown) {
    char what[64];
    snprintf(what, sizeof what, "%s %lld", kind, (long long)i);
    int rc = rd_str(r, s, what);
    if (rc == 0) *shown = safe_name(*s, buf, cap);
    return rc;
}

static int rd_kv(rd *r, int64_t i, eng_gguf_kv *kv) {
    char kbuf[80];
    const char *key;
    int rc = rd_entry_name(r, "the key of kv", i, &kv->key, kbuf, sizeof kbuf, &key);
    if (rc) return rc;
    size_t at = r->pos;
    if ((rc = rd_u32(r, &kv->type, "a value type"))) return rc;
    if (kv->type >= GGUF_N_VALUE_TYPES)
        return FAIL(r, ENG_ERR_FORMAT, "kv '%s': value type %u at byte %zu is out of range (0..12)", key, kv->type,
                    at);
    if (kv->type == ENG_GGUF_STRING) return rd_str(r, &kv->v.str, key);
    if (kv->type != ENG_GGUF_ARRAY) return rd_scalar(r, kv->type, kv, key);

    uint32_t et;
    uint64_t n;
    at = r->pos;
    if ((rc = rd_u32(r, &et, "an array element type"))) return rc;
    if (et == ENG_GGUF_ARRAY)
        return FAIL(r, ENG_ERR_UNSUPPORTED, "kv '%s': nested arrays are not supported (at byte %zu)", key, at);
    if (et >= GGUF_N_VALUE_TYPES)
        return FAIL(r, ENG_ERR_FORMAT, "kv '%s': array element type %u at byte %zu is out of range (0..12)", key, et,
                    at);
    at = r->pos;
    if ((rc = rd_u64(r, &n, "an array length"))) return rc;
    size_t left = r->size - r->pos;
    kv->v.arr.type = et;
    kv->v.arr.n = n;
    if (et == ENG_GGUF_STRING) {
        if (n > left / 8)
            return FAIL(r, ENG_ERR_FORMAT,
                        "kv '%s': array of %llu strings at byte %zu cannot fit in the %zu bytes left", key,
                        (unsigned long long)n, at, left);
        eng_gguf_str *strs = malloc((size_t)(n ? n : 1) * sizeof *strs);
        if (!strs) return FAIL(r, ENG_ERR_NOMEM, "out of memory for kv '%s' (%llu strings)", key,
                               (unsigned long long)n);
        kv->v.arr.strs = strs;
        for (uint64_t j = 0; j < n; j++)
            if ((rc = rd_str(r, &strs[j], key))) return rc;
        return 0;
    }
    size_t es = gguf_value_size(et);
    if (n > left / es)
        return FAIL(r, ENG_ERR_FORMAT, "kv '%s': array of %llu elements of %zu bytes at byte %zu exceeds the %zu "
                    "bytes left", key, (unsigned long long)n, es, at, left);
    kv->v.arr.data = r->p + r->pos;
    if (et == ENG_GGUF_BOOL)
        for (uint64_t j = 0; j < n; j++)
            if (r->p[r->pos + j] > 1)
                return FAIL(r, ENG_ERR_FORMAT, "kv '%s': bool element %llu at byte %zu is neither 0 nor 1", key,
                            (unsigned long long)j, r->pos + (size_t)j);
    r->pos += (size_t)(n * es);
    return 0;
}

static int rd_tensor_info(rd *r, int64_t i, eng_gguf_tensor *t) {
    char nbuf[80];
    const char *name;
    int rc = rd_entry_name(r, "the name of tensor", i, &t->name, nbuf, sizeof nbuf, &name);
    if (rc) return rc;
    size_t at = r->pos;
    if ((rc = rd_u32(r, &t->n_dims, "a tensor's n_dims"))) return rc;
    if (t->n_dims < 1 || t->n_dims > 4)
        return FAIL(r, ENG_ERR_FORMAT, "tensor '%s': n_dims %u at byte %zu is not in 1..4", name, t->n_dims, at);
    uint64_t total = 1;
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t v;
        at = r->pos;
        if ((rc = rd_u64(r, &v, "a tensor dimension"))) return rc;
        if (v == 0 || v > (uint64_t)INT64_MAX)
            return FAIL(r, ENG_ERR_FORMAT, "tensor '%s': dimension %u = %llu at byte %zu is out of range", name, d,
                        (unsigned long long)v, at);
        if (__builtin_mul_overflow(total, v, &total) || total > (uint64_t)INT64_MAX)
            return FAIL(r, ENG_ERR_FORMAT, "tensor '%s': the element count overflows (at byte %zu)", name, at);
        t->ne[d] = (int64_t)v;
    }
    at = r->pos;
    if ((rc = rd_u32(r, &t->type, "a tensor type"))) return rc;
    if (!tsize_get(t->type))
        return FAIL(r, ENG_ERR_UNSUPPORTED, "tensor '%s': unknown tensor type id %u (at byte %zu)", name, t->type,
                    at);
    return rd_u64(r, &t->offset, "a tensor offset");
}

static int parse(eng_gguf *g, char *err, size_t err_len) {
    rd r = {.p = g->data, .size = g->size, .pos = 0, .name = g->name, .err = err, .err_len = err_len};
    rd *R = &r;
    int rc;
    if (g->size < 4 || memcmp(g->data, "GGUF", 4) != 0) {
        uint8_t m[4] = {0};
        memcpy(m, g->data, g->size < 4 ? g->size : 4);
        return FAIL(R, ENG_ERR_FORMAT,
                    "not a GGUF file (starts with bytes %02x %02x %02x %02x, expected \"GGUF\"; file size %zu)",
                    m[0], m[1], m[2], m[3], g->size);
    }
    r.pos = 4;
    if ((rc = rd_u32(R, &g->version, "the version"))) return rc;
    if (g->version == 1)
        return FAIL(R, ENG_ERR_FORMAT, "GGUF version 1 is not supported (only versions 2 and 3): re-convert the "
                    "model with a current converter");
    if (g->version != 2 && g->version != 3) {
        uint32_t v = g->version;
        uint32_t swapped = (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
        if (swapped == 2 || swapped == 3)
            return FAIL(R, ENG_ERR_FORMAT, "big-endian GGUF (version %u byte-swapped) is not supported", swapped);
        return FAIL(R, ENG_ERR_FORMAT, "unknown GGUF version %u (supported: 2 and 3)", v);
    }
    uint64_t n_tensors, n_kv;
    if ((rc = rd_u64(R, &n_tensors, "the tensor count"))) return rc;
    if ((rc = rd_u64(R, &n_kv, "the kv count"))) return rc;
    /* A kv takes at least 13 bytes (key length, type, a 1-byte value), a tensor info at least 32. */
    size_t left = r.size - r.pos;
    if (n_kv > left / 13)
        return FAIL(R, ENG_ERR_FORMAT, "kv count %llu cannot fit in the %zu bytes after the header",
                    (unsigned long long)n_kv, left);
    if (n_tensors > left / 32 || n_tensors > (left - n_kv * 13) / 32)
        return FAIL(R, ENG_ERR_FORMAT, "tensor count %llu (with %llu kvs) cannot fit in the %zu bytes after the "
                    "header", (unsigned long long)n_tensors, (unsigned long long)n_kv, left);

    g->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return FAIL(R, ENG_ERR_NOMEM, "out of memory for %llu kvs and %llu tensors",
                                           (unsigned long long)n_kv, (unsigned long long)n_tensors);
    uint64_t seed = random_seed(g);
    if (index_init(&g->kv_index, (int64_t)n_kv, seed) || index_init(&g->tensor_index, (int64_t)n_tensors, seed))
        return FAIL(R, ENG_ERR_NOMEM, "out of memory for the name index");

    for (uint64_t i = 0; i < n_kv; i++) {
        size_t at = r.pos;
        eng_gguf_kv *kv = &g->kv[i];
        rc = rd_kv(R, (int64_t)i, kv);
        g->n_kv = (int64_t)i + 1;  /* so close() frees a partially read string array */
        if (rc) return rc;
        if (index_lookup(&g->kv_index, g->kv, sizeof *g->kv, kv->key.ptr, (size_t)kv->key.len, (int64_t)i) >= 0) {
            char kbuf[80];
            return FAIL(R, ENG_ERR_FORMAT, "duplicate key '%s' (kv %llu at byte %zu)",
                        safe_name(kv->key, kbuf, sizeof kbuf), (unsigned long long)i, at);
        }
    }

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = index_lookup(&g->kv_index, g->kv, sizeof *g->kv, "general.alignment", 17, -1);
    if (ai >= 0) {
        const eng_gguf_kv *kv = &g->kv[ai];
        if (kv->type != ENG_GGUF_UINT32)
            return FAIL(R, ENG_ERR_FORMAT, "general.alignment has value type %u, expected uint32 (4)", kv->type);
        if (!gguf_is_pow2(kv->v.u64))
            return FAIL(R, ENG_ERR_FORMAT, "general.alignment %llu is not a nonzero power of two",
                        (unsigned long long)kv->v.u64);
        g->alignment = (uint32_t)kv->v.u64;
    }

    for (uint64_t i = 0; i < n_tensors; i++) {
        size_t at = r.pos;
        eng_gguf_tensor *t = &g->tensors[i];
        if ((rc = rd_tensor_info(R, (int64_t)i, t))) return rc;
        g->n_tensors = (int64_t)i + 1;
        if (index_lookup(&g->tensor_index, g->tensors, sizeof *g->tensors, t->name.ptr, (size_t)t->name.len,
                         (int64_t)i) >= 0) {
            char nbuf[80];
            return FAIL(R, ENG_ERR_FORMAT, "duplicate tensor name '%s' (tensor %llu at byte %zu)",
                        safe_name(t->name, nbuf, sizeof nbuf), (unsigned long long)i, at);
        }
    }

    /* The data section starts at the aligned end of the header. r.pos <= size, so this cannot overflow. */
    uint64_t a = g->alignment;
    g->data_offset = ((uint64_t)r.pos + a - 1) / a * a;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        eng_gguf_tensor *t = &g->tensors[i];
        char nbuf[80];
        const char *name = safe_name(t->name, nbuf, sizeof nbuf);
        const gguf_tsize *ts = tsize_get(t->type);
        if (t->ne[0] % ts->block_elems != 0)
            return FAIL(R, ENG_ERR_FORMAT, "tensor '%s': row length %lld is not a multiple of the %s block size %u",
                        name, (long long)t->ne[0], ts->name, ts->block_elems);
        t->nbytes = tensor_nbytes(ts, t->ne);
        if (t->nbytes == 0)
            return FAIL(R, ENG_ERR_FORMAT, "tensor '%s': its size in bytes overflows", name);
        if (t->offset % a != 0)
            return FAIL(R, ENG_ERR_FORMAT, "tensor '%s': data offset %llu is not a multiple of the alignment %u",
                        name, (unsigned long long)t->offset, g->alignment);
        uint64_t begin, end;
        if (__builtin_add_overflow(g->data_offset, t->offset, &begin) ||
            __builtin_add_overflow(begin, (uint64_t)t->nbytes, &end) || end > g->size)
            return FAIL(R, ENG_ERR_FORMAT, "tensor '%s': data (%zu bytes at offset %llu from the data section at "
                        "byte %llu) lies past the end of the file (%zu bytes)", name, t->nbytes,
                        (unsigned long long)t->offset, (unsigned long long)g->data_offset, g->size);
        t->data = g->data + begin;
    }
    return 0;
}

void eng_gguf_close(eng_gguf *g) {
    if (!g) return;
    for (int64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].type == ENG_GGUF_ARRAY && g->kv[i].v.arr.type == ENG_GGUF_STRING)
            free((void *)g->kv[i].v.arr.strs);
    free(g->kv);
    free(g->tensors);
    free(g->kv_index.slots);
    free(g->tensor_index.slots);
    if (g->map) munmap(g->map, g->map_len);
    free(g->name);
    free(g);
}

static int open_common(eng_gguf *g, eng_gguf **out, char *err, size_t err_len) {
    int rc = parse(g, err, err_len);
    if (rc) {
        eng_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

static eng_gguf *gguf_new(const char *name) {
    eng_gguf *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->name = strdup(name);
    if (!g->name) { free(g); return NULL; }
    return g;
}

int eng_gguf_open_memory(const void *data, size_t size, const char *name, eng_gguf **out, char *err,
                         size_t err_len) {
    if (!name) name = "<memory>";
    if (err && err_len) err[0] = 0;
    if (!out || (!data && size)) return gguf_fail_msg(name, err, err_len, ENG_ERR_INVALID, "invalid arguments");
    *out = NULL;
    static const uint8_t empty[1] = {0};
    eng_gguf *g = gguf_new(name);
    if (!g) return gguf_fail_msg(name, err, err_len, ENG_ERR_NOMEM, "out of memory");
    g->data = data ? data : empty;
    g->size = size;
    return open_common(g, out, err, err_len);
}

int eng_gguf_open(const char *path, eng_gguf **out, char *err, size_t err_len) {
    if (err && err_len) err[0] = 0;
    if (!path || !out) return gguf_fail_msg(path, err, err_len, ENG_ERR_INVALID, "invalid arguments");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return gguf_fail_msg(path, err, err_len, ENG_ERR_IO, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return gguf_fail_msg(path, err, err_len, ENG_ERR_IO, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return gguf_fail_msg(path, err, err_len, ENG_ERR_IO, "not a regular file");
    }
    if (st.st_size == 0) {
        close(fd);
        return gguf_fail_msg(path, err, err_len, ENG_ERR_FORMAT, "empty file (0 bytes), not a GGUF file");
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return gguf_fail_msg(path, err, err_len, ENG_ERR_IO, "file too large to map");
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return gguf_fail_msg(path, err, err_len, ENG_ERR_IO, "cannot mmap %zu bytes: %s", size,
                                           strerror(e));
    eng_gguf *g = gguf_new(path);
    if (!g) {
        munmap(map, size);
        return gguf_fail_msg(path, err, err_len, ENG_ERR_NOMEM, "out of memory");
    }
    g->map = map;
    g->map_len = size;
    g->data = map;
    g->size = size;
    return open_common(g, out, err, err_len);
}

uint32_t eng_gguf_version(const eng_gguf *g) { return g->version; }
uint32_t eng_gguf_alignment(const eng_gguf *g) { return g->alignment; }
uint64_t eng_gguf_data_offset(const eng_gguf *g) { return g->data_offset; }
size_t eng_gguf_file_size(const eng_gguf *g) { return g->size; }
const char *eng_gguf_name(const eng_gguf *g) { return g->name; }

int64_t eng_gguf_n_kv(const eng_gguf *g) { return g->n_kv; }
const eng_gguf_kv *eng_gguf_kv_at(const eng_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_kv) ? &g->kv[i] : NULL;
}
const eng_gguf_kv *eng_gguf_find(const eng_gguf *g, const char *key) {
    if (!key) return NULL;
    int64_t i = index_lookup(&g->kv_index, g->kv, sizeof *g->kv, key, strlen(key), -1);
    return i >= 0 ? &g->kv[i] : NULL;
}

int64_t eng_gguf_n_tensors(const eng_gguf *g) { return g->n_tensors; }
const eng_gguf_tensor *eng_gguf_tensor_at(const eng_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_tensors) ? &g->tensors[i] : NULL;
}
const eng_gguf_tensor *eng_gguf_find_tensor(const eng_gguf *g, const char *name) {
    if (!name) return NULL;
    int64_t i = index_lookup(&g->tensor_index, g->tensors, sizeof *g->tensors, name, strlen(name), -1);
    return i >= 0 ? &g->tensors[i] : NULL;
}

static bool is_unsigned(uint32_t t) {
    return t == ENG_GGUF_UINT8 || t == ENG_GGUF_UINT16 || t == ENG_GGUF_UINT32 || t == ENG_GGUF_UINT64;
}
static bool is_signed(uint32_t t) {
    return t == ENG_GGUF_INT8 || t == ENG_GGUF_INT16 || t == ENG_GGUF_INT32 || t == ENG_GGUF_INT64;
}

int eng_gguf_get_u32(const eng_gguf *g, const char *key, uint32_t *out) {
    const eng_gguf_kv *kv = eng_gguf_find(g, key);
    if (!kv) return ENG_ERR_NOT_FOUND;
    if (is_unsigned(kv->type) && kv->v.u64 <= UINT32_MAX) { *out = (uint32_t)kv->v.u64; return 0; }
    if (is_signed(kv->type) && kv->v.i64 >= 0 && kv->v.i64 <= (int64_t)UINT32_MAX) {
        *out = (uint32_t)kv->v.i64;
        return 0;
    }
    return ENG_ERR_TYPE;
}

int eng_gguf_get_i64(const eng_gguf *g, const char *key, int64_t *out) {
    const eng_gguf_kv *kv = eng_gguf_find(g, key);
    if (!kv) return ENG_ERR_NOT_FOUND;
    if (is_signed(kv->type)) { *out = kv->v.i64; return 0; }
    if (is_unsigned(kv->type) && kv->v.u64 <= (uint64_t)INT64_MAX) { *out = (int64_t)kv->v.u64; return 0; }
    return ENG_ERR_TYPE;
}

int eng_gguf_get_f32(const eng_gguf *g, const char *key, float *out) {
    const eng_gguf_kv *kv = eng_gguf_find(g, key);
    if (!kv) return ENG_ERR_NOT_FOUND;
    if (kv->type != ENG_GGUF_FLOAT32 && kv->type != ENG_GGUF_FLOAT64) return ENG_ERR_TYPE;
    *out = (float)kv->v.f64;
    return 0;
}

int eng_gguf_get_bool(const eng_gguf *g, const char *key, bool *out) {
    const eng_gguf_kv *kv = eng_gguf_find(g, key);
    if (!kv) return ENG_ERR_NOT_FOUND;
    if (kv->type != ENG_GGUF_BOOL) return ENG_ERR_TYPE;
    *out = kv->v.b;
    return 0;
}

int eng_gguf_get_str(const eng_gguf *g, const char *key, eng_gguf_str *out) {
    const eng_gguf_kv *kv = eng_gguf_find(g, key);
    if (!kv) return ENG_ERR_NOT_FOUND;
    if (kv->type != ENG_GGUF_STRING) return ENG_ERR_TYPE;
    *out = kv->v.str;
    return 0;
}

int eng_gguf_get_arr(const eng_gguf *g, const char *key, uint32_t *elem_type, uint64_t *n, const void **data,
                     const eng_gguf_str **strs) {
    const eng_gguf_kv *kv = eng_gguf_find(g, key);
    if (!kv) return ENG_ERR_NOT_FOUND;
    if (kv->type != ENG_GGUF_ARRAY) return ENG_ERR_TYPE;
    if (elem_type) *elem_type = kv->v.arr.type;
    if (n) *n = kv->v.arr.n;
    if (data) *data = kv->v.arr.type == ENG_GGUF_STRING ? NULL : kv->v.arr.data;
    if (strs) *strs = kv->v.arr.type == ENG_GGUF_STRING ? kv->v.arr.strs : NULL;
    return 0;
}

const char *eng_gguf_type_name(uint32_t type) {
    const gguf_tsize *ts = tsize_get(type);
    return ts ? ts->name : NULL;
}

size_t eng_gguf_tensor_bytes(uint32_t type, uint32_t n_dims, const int64_t *ne) {
    const gguf_tsize *ts = tsize_get(type);
    if (!ts || !ne || n_dims < 1 || n_dims > 4) return 0;
    int64_t d4[4] = {1, 1, 1, 1};
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] <= 0) return 0;
        d4[d] = ne[d];
    }
    return tensor_nbytes(ts, d4);
}
