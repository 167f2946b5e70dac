/* test_gguf.c: the GGUF reader and writer (engine/format/gguf.h).
 *
 * - writer -> reader round trips of every value type, arrays and tensors (fixed and randomized);
 * - the writer's bytes against an independent hand encoder of the format in this file;
 * - every truncation point and thousands of random byte flips of a small file: a clean error or a consistent
 *   result, never a crash (the ASan build checks out-of-bounds reads: each case gets an exact-size copy);
 * - hand-made hostile files, each expecting its error code and a message naming the file;
 * - with ../shared: every model opens, stories260K's documented facts, and a rewrite of it is byte-identical;
 * - `kvserve mkmodel` (the built binary): shapes, metadata, the built-in vocabulary's structure, weight
 *   statistics, byte-identical reruns, q8_0/f16 output equal to quantizing the f32 output, option errors.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "engine/kernels/quant.h"
#include "helper_shared.h"

/* ---- helpers ------------------------------------------------------------------------------------------------ */
typedef struct rng { uint64_t s; } rng;
static uint64_t rng_next(rng *r) {  /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint64_t rng_below(rng *r, uint64_t n) { return n ? rng_next(r) % n : 0; }

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static char *make_tmpdir(void) {
    char tmpl[] = "/tmp/kvs-test-gguf-XXXXXX";
    char *d = mkdtemp(tmpl);
    cr_assert_not_null(d, "mkdtemp failed");
    return strdup(d);
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

static void *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(len > 0 ? (size_t)len : 1);
    cr_assert_not_null(p);
    cr_assert_eq(fread(p, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return p;
}

static bool str_is(eng_gguf_str s, const char *c) { return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0; }

/* ---- an independent encoder of the format, for hostile files ------------------------------------------------- */
typedef struct buf { uint8_t *p; size_t n, cap; } buf;
static void b_put(buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        cr_assert_not_null(b->p);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void b_u8(buf *b, uint8_t v) { b_put(b, &v, 1); }
static void b_u32(buf *b, uint32_t v) { uint8_t t[4]; for (int i = 0; i < 4; i++) t[i] = (uint8_t)(v >> 8 * i); b_put(b, t, 4); }
static void b_u64(buf *b, uint64_t v) { uint8_t t[8]; for (int i = 0; i < 8; i++) t[i] = (uint8_t)(v >> 8 * i); b_put(b, t, 8); }
static void b_str(buf *b, const char *s) { b_u64(b, strlen(s)); b_put(b, s, strlen(s)); }
static void b_pad(buf *b, size_t a) { while (b->n % a) b_u8(b, 0); }
static void b_header(buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b_put(b, "GGUF", 4); b_u32(b, version); b_u64(b, n_tensors); b_u64(b, n_kv);
}
static void b_kv_u32(buf *b, const char *key, uint32_t v) { b_str(b, key); b_u32(b, ENG_GGUF_UINT32); b_u32(b, v); }
static void b_tensor(buf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off) {
    b_str(b, name); b_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) b_u64(b, ne[d]);
    b_u32(b, type); b_u64(b, off);
}

/* Opens bytes written to a file in dir (the mmap path) and returns the code; err must name the file. */
static int open_bytes(const char *dir, const char *fname, const buf *b, char *err, size_t err_len) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    write_file(path, b->p, b->n);
    eng_gguf *g = NULL;
    int rc = eng_gguf_open(path, &g, err, err_len);
    if (rc == 0) eng_gguf_close(g);
    else {
        cr_assert_null(g);
        cr_assert(strncmp(err, path, strlen(path)) == 0 && err[strlen(path)] == ':',
                  "message does not start with the path: %s", err);
    }
    unlink(path);
    return rc;
}

/* ---- kvs_strerror ---------------------------------------------------------------------------------------------- */
Test(gguf, strerror_every_code) {
    const int codes[] = {ENG_OK, ENG_ERR_INVALID, ENG_ERR_NOMEM, ENG_ERR_IO, ENG_ERR_FORMAT, ENG_ERR_UNSUPPORTED,
                         ENG_ERR_NOT_FOUND, ENG_ERR_TYPE, ENG_ERR_TOO_LARGE, ENG_ERR_KV_FULL, ENG_ERR_KV,
                         ENG_ERR_DEVICE};
    size_t n = sizeof codes / sizeof codes[0];
    const char *unknown = kvs_strerror(-1000);
    cr_assert_not_null(unknown);
    for (size_t i = 0; i < n; i++) {
        const char *s = kvs_strerror(codes[i]);
        cr_assert(s && *s, "code %d has no text", codes[i]);
        cr_assert_str_neq(s, unknown, "code %d falls through to the unknown text", codes[i]);
        for (size_t j = 0; j < i; j++) cr_assert_str_neq(s, kvs_strerror(codes[j]), "codes %d and %d share text",
                                                         codes[i], codes[j]);
    }
    cr_assert_not_null(kvs_strerror(1));
}

/* ---- round trips ------------------------------------------------------------------------------------------------ */
static size_t elem_size(uint32_t t) {
    switch (t) {
    case ENG_GGUF_UINT8: case ENG_GGUF_INT8: case ENG_GGUF_BOOL: return 1;
    case ENG_GGUF_UINT16: case ENG_GGUF_INT16: return 2;
    case ENG_GGUF_UINT32: case ENG_GGUF_INT32: case ENG_GGUF_FLOAT32: return 4;
    case ENG_GGUF_UINT64: case ENG_GGUF_INT64: case ENG_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* A reference model of what was written, compared with what is read. */
typedef struct ref_kv {
    char key[48];
    uint32_t type, elem_type;
    uint64_t n;
    uint8_t raw[8];       /* scalar bytes, little-endian */
    uint8_t *data;        /* array elements or string bytes */
    size_t data_len;
    char **strs; uint64_t *str_lens;
} ref_kv;

typedef struct ref_tensor {
    char name[48];
    uint32_t type, n_dims;
    int64_t ne[4];
    uint8_t *data;
    size_t nbytes;
} ref_tensor;

typedef struct ref_file {
    ref_kv kv[64]; int n_kv;
    ref_tensor t[16]; int n_t;
} ref_file;

static void ref_free(ref_file *f) {
    for (int i = 0; i < f->n_kv; i++) {
        free(f->kv[i].data);
        if (f->kv[i].strs) {
            for (uint64_t j = 0; j < f->kv[i].n; j++) free(f->kv[i].strs[j]);
            free(f->kv[i].strs);
            free(f->kv[i].str_lens);
        }
    }
    for (int i = 0; i < f->n_t; i++) free(f->t[i].data);
}

static uint64_t raw_le(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << 8 * i;
    return v;
}

/* Fills f with random kvs of every type (scalars of each type at least once, arrays of each element type,
 * string arrays) and tensors of several types, and adds them to w. */
static void build_random(rng *r, ref_file *f, eng_gguf_writer *w, int n_extra) {
    memset(f, 0, sizeof *f);
    int n = 13 + 12 + n_extra;  /* each scalar type, each array element type, then random ones */
    for (int i = 0; i < n && f->n_kv < 64; i++) {
        ref_kv *k = &f->kv[f->n_kv];
        snprintf(k->key, sizeof k->key, "test.key_%d.%llu", i, (unsigned long long)rng_below(r, 1000));
        if (i < 13) k->type = (uint32_t)i;
        else if (i < 25) { k->type = ENG_GGUF_ARRAY; k->elem_type = (uint32_t)(i - 13 < 9 ? i - 13 : i - 12); }
        else {
            k->type = (uint32_t)rng_below(r, 13);
            k->elem_type = (uint32_t)rng_below(r, 13);
            if (k->elem_type == ENG_GGUF_ARRAY) k->elem_type = ENG_GGUF_STRING;
        }
        if (k->type == ENG_GGUF_ARRAY && k->elem_type == ENG_GGUF_STRING) {
            k->n = rng_below(r, 6);
            k->strs = calloc(k->n + 1, sizeof *k->strs);
            k->str_lens = calloc(k->n + 1, sizeof *k->str_lens);
            eng_gguf_str *ss = calloc(k->n + 1, sizeof *ss);
            for (uint64_t j = 0; j < k->n; j++) {
                k->str_lens[j] = rng_below(r, 20);
                k->strs[j] = malloc(k->str_lens[j] + 1);
                for (uint64_t c = 0; c < k->str_lens[j]; c++) k->strs[j][c] = (char)rng_below(r, 256);
                ss[j].ptr = k->strs[j];
                ss[j].len = k->str_lens[j];
            }
            cr_assert_eq(eng_gguf_add_str_arr(w, k->key, ss, k->n), 0);
            free(ss);
        } else if (k->type == ENG_GGUF_ARRAY) {
            size_t es = elem_size(k->elem_type);
            k->n = rng_below(r, 40);
            k->data_len = k->n * es;
            k->data = malloc(k->data_len + 1);
            for (size_t j = 0; j < k->data_len; j++) k->data[j] = (uint8_t)rng_next(r);
            if (k->elem_type == ENG_GGUF_BOOL)
                for (size_t j = 0; j < k->n; j++) k->data[j] &= 1;
            if (k->elem_type == ENG_GGUF_FLOAT32 || k->elem_type == ENG_GGUF_FLOAT64)
                for (size_t j = 0; j < k->n; j++) k->data[j * es + es - 1] &= 0x3f;  /* no NaNs */
            cr_assert_eq(eng_gguf_add_arr(w, k->key, k->elem_type, k->data, k->n), 0);
        } else if (k->type == ENG_GGUF_STRING) {
            k->data_len = rng_below(r, 50);
            k->data = malloc(k->data_len + 1);
            for (size_t j = 0; j < k->data_len; j++) k->data[j] = (uint8_t)rng_next(r);
            cr_assert_eq(eng_gguf_add_str(w, k->key, (const char *)k->data, k->data_len), 0);
        } else {
            size_t es = elem_size(k->type);
            uint64_t v = rng_next(r);
            if (k->type == ENG_GGUF_BOOL) v &= 1;
            if (k->type == ENG_GGUF_FLOAT32) v &= 0x3fffffffu;
            if (k->type == ENG_GGUF_FLOAT64) v &= 0x3fffffffffffffffull;
            for (size_t j = 0; j < es; j++) k->raw[j] = (uint8_t)(v >> 8 * j);
            /* Through the typed adders where there is one, else through add_kv_from with a built kv. */
            int rc;
            if (k->type == ENG_GGUF_UINT32) rc = eng_gguf_add_u32(w, k->key, (uint32_t)v);
            else if (k->type == ENG_GGUF_INT32) rc = eng_gguf_add_i32(w, k->key, (int32_t)(uint32_t)v);
            else if (k->type == ENG_GGUF_FLOAT32) { float fv; uint32_t b = (uint32_t)v; memcpy(&fv, &b, 4); rc = eng_gguf_add_f32(w, k->key, fv); }
            else if (k->type == ENG_GGUF_BOOL) rc = eng_gguf_add_bool(w, k->key, v != 0);
            else {
                eng_gguf_kv kv;
                memset(&kv, 0, sizeof kv);
                kv.key.ptr = k->key;
                kv.key.len = strlen(k->key);
                kv.type = k->type;
                uint64_t bits = raw_le(k->raw, es);
                switch (k->type) {
                case ENG_GGUF_UINT8: case ENG_GGUF_UINT16: case ENG_GGUF_UINT64: kv.v.u64 = bits; break;
                case ENG_GGUF_INT8: kv.v.i64 = (int8_t)bits; break;
                case ENG_GGUF_INT16: kv.v.i64 = (int16_t)bits; break;
                case ENG_GGUF_INT64: kv.v.i64 = (int64_t)bits; break;
                case ENG_GGUF_FLOAT64: memcpy(&kv.v.f64, &bits, 8); break;
                default: cr_assert_fail("type %u", k->type);
                }
                rc = eng_gguf_add_kv_from(w, &kv);
            }
            cr_assert_eq(rc, 0, "adding %s type %u", k->key, k->type);
        }
        f->n_kv++;
    }
    static const uint32_t types[] = {0, 1, 8, 2, 12, 14, 30, 6};
    static const int blocks[] = {1, 1, 32, 32, 256, 256, 1, 32};
    static const int bbytes[] = {4, 2, 34, 18, 144, 210, 2, 22};
    int nt = 1 + (int)rng_below(r, 8);
    for (int i = 0; i < nt; i++) {
        ref_tensor *t = &f->t[f->n_t++];
        int ti = (int)rng_below(r, 8);
        snprintf(t->name, sizeof t->name, "blk.%d.w%llu", i, (unsigned long long)rng_below(r, 100));
        t->type = types[ti];
        t->n_dims = 1 + (uint32_t)rng_below(r, 4);
        for (int d = 0; d < 4; d++) t->ne[d] = 1;
        t->ne[0] = blocks[ti] * (1 + (int64_t)rng_below(r, 3));
        for (uint32_t d = 1; d < t->n_dims; d++) t->ne[d] = 1 + (int64_t)rng_below(r, 3);
        t->nbytes = (size_t)(t->ne[0] / blocks[ti] * bbytes[ti] * t->ne[1] * t->ne[2] * t->ne[3]);
        cr_assert_eq(eng_gguf_tensor_bytes(t->type, t->n_dims, t->ne), t->nbytes);
        t->data = malloc(t->nbytes);
        for (size_t j = 0; j < t->nbytes; j++) t->data[j] = (uint8_t)rng_next(r);
        cr_assert_eq(eng_gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->nbytes), 0);
    }
}

static void check_against_ref(const eng_gguf *g, const ref_file *f) {
    cr_assert_eq(eng_gguf_version(g), 3);
    cr_assert_eq(eng_gguf_n_kv(g), f->n_kv);
    cr_assert_eq(eng_gguf_n_tensors(g), f->n_t);
    for (int i = 0; i < f->n_kv; i++) {
        const ref_kv *k = &f->kv[i];
        const eng_gguf_kv *kv = eng_gguf_kv_at(g, i);
        cr_assert_not_null(kv);
        cr_assert(str_is(kv->key, k->key), "kv %d key", i);
        cr_assert_eq(eng_gguf_find(g, k->key), kv, "find(%s)", k->key);
        cr_assert_eq(kv->type, k->type, "kv %s type", k->key);
        if (k->type == ENG_GGUF_ARRAY) {
            cr_assert_eq(kv->v.arr.type, k->elem_type);
            cr_assert_eq(kv->v.arr.n, k->n);
            uint32_t et; uint64_t n; const void *data; const eng_gguf_str *strs;
            cr_assert_eq(eng_gguf_get_arr(g, k->key, &et, &n, &data, &strs), 0);
            cr_assert_eq(et, k->elem_type);
            cr_assert_eq(n, k->n);
            if (k->elem_type == ENG_GGUF_STRING) {
                cr_assert_null(data);
                for (uint64_t j = 0; j < k->n; j++) {
                    cr_assert_eq(strs[j].len, k->str_lens[j]);
                    cr_assert(memcmp(strs[j].ptr, k->strs[j], k->str_lens[j]) == 0);
                }
            } else {
                cr_assert_null(strs);
                cr_assert(k->data_len == 0 || memcmp(data, k->data, k->data_len) == 0, "array %s data", k->key);
            }
        } else if (k->type == ENG_GGUF_STRING) {
            eng_gguf_str s;
            cr_assert_eq(eng_gguf_get_str(g, k->key, &s), 0);
            cr_assert_eq(s.len, k->data_len);
            cr_assert(memcmp(s.ptr, k->data, k->data_len) == 0);
        } else {
            size_t es = elem_size(k->type);
            uint64_t bits = raw_le(k->raw, es);
            switch (k->type) {
            case ENG_GGUF_UINT8: case ENG_GGUF_UINT16: case ENG_GGUF_UINT32: case ENG_GGUF_UINT64:
                cr_assert_eq(kv->v.u64, bits); break;
            case ENG_GGUF_INT8: cr_assert_eq(kv->v.i64, (int8_t)bits); break;
            case ENG_GGUF_INT16: cr_assert_eq(kv->v.i64, (int16_t)bits); break;
            case ENG_GGUF_INT32: cr_assert_eq(kv->v.i64, (int32_t)bits); break;
            case ENG_GGUF_INT64: cr_assert_eq(kv->v.i64, (int64_t)bits); break;
            case ENG_GGUF_FLOAT32: { float fv; uint32_t b = (uint32_t)bits; memcpy(&fv, &b, 4);
                cr_assert(kv->v.f64 == (double)fv); break; }
            case ENG_GGUF_FLOAT64: { double d; memcpy(&d, &bits, 8); cr_assert(kv->v.f64 == d); break; }
            case ENG_GGUF_BOOL: cr_assert_eq(kv->v.b, bits != 0); break;
            }
        }
    }
    uint64_t a = eng_gguf_alignment(g);
    for (int i = 0; i < f->n_t; i++) {
        const ref_tensor *rt = &f->t[i];
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        cr_assert_not_null(t);
        cr_assert(str_is(t->name, rt->name));
        cr_assert_eq(eng_gguf_find_tensor(g, rt->name), t);
        cr_assert_eq(t->type, rt->type);
        cr_assert_eq(t->n_dims, rt->n_dims);
        for (int d = 0; d < 4; d++) cr_assert_eq(t->ne[d], rt->ne[d]);
        cr_assert_eq(t->nbytes, rt->nbytes);
        cr_assert_eq(t->offset % a, 0);
        cr_assert(memcmp(t->data, rt->data, rt->nbytes) == 0, "tensor %s data", rt->name);
    }
    cr_assert_null(eng_gguf_find(g, "no.such.key"));
    cr_assert_null(eng_gguf_find_tensor(g, "no.such.tensor"));
    cr_assert_null(eng_gguf_kv_at(g, -1));
    cr_assert_null(eng_gguf_kv_at(g, f->n_kv));
    cr_assert_null(eng_gguf_tensor_at(g, f->n_t));
}

Test(gguf, roundtrip_every_type_randomized) {
    char *dir = make_tmpdir();
    for (uint64_t seed = 1; seed <= 40; seed++) {
        rng r = {seed};
        ref_file f;
        eng_gguf_writer *w;
        cr_assert_eq(eng_gguf_writer_create(&w), 0);
        build_random(&r, &f, w, (int)rng_below(&r, 30));
        void *mem; size_t size;
        cr_assert_eq(eng_gguf_write_memory(w, &mem, &size), 0);
        eng_gguf *g; char err[256];
        cr_assert_eq(eng_gguf_open_memory(mem, size, "mem", &g, err, sizeof err), 0, "seed %llu: %s",
                     (unsigned long long)seed, err);
        cr_assert_eq(eng_gguf_alignment(g), 32);
        cr_assert_eq(eng_gguf_data_offset(g) % 32, 0);
        check_against_ref(g, &f);
        eng_gguf_close(g);

        /* The file writer writes the same bytes, and the mmap reader reads them the same way. */
        char path[512];
        snprintf(path, sizeof path, "%s/rt.gguf", dir);
        cr_assert_eq(eng_gguf_write(w, path, err, sizeof err), 0, "%s", err);
        size_t fsize;
        void *fbytes = read_file(path, &fsize);
        cr_assert_eq(fsize, size, "seed %llu", (unsigned long long)seed);
        cr_assert(memcmp(fbytes, mem, size) == 0, "seed %llu: file and memory writers differ",
                  (unsigned long long)seed);
        cr_assert_eq(eng_gguf_open(path, &g, err, sizeof err), 0, "%s", err);
        cr_assert_str_eq(eng_gguf_name(g), path);
        check_against_ref(g, &f);
        eng_gguf_close(g);
        free(fbytes);
        free(mem);
        unlink(path);
        eng_gguf_writer_free(w);
        ref_free(&f);
    }
    rmdir(dir);
    free(dir);
}

/* The writer's bytes for a small file equal the independent encoder's. */
Test(gguf, writer_matches_hand_encoding) {
    eng_gguf_writer *w;
    cr_assert_eq(eng_gguf_writer_create(&w), 0);
    cr_assert_eq(eng_gguf_add_str(w, "general.architecture", "llama", 5), 0);
    cr_assert_eq(eng_gguf_add_u32(w, "llama.block_count", 7), 0);
    const int32_t arr[3] = {-1, 2, 300000};
    cr_assert_eq(eng_gguf_add_arr(w, "a.i32", ENG_GGUF_INT32, arr, 3), 0);
    const float t1[3] = {1.5f, -2.0f, 0.25f};
    const int64_t ne1[1] = {3};
    cr_assert_eq(eng_gguf_add_tensor(w, "t1", 0 /* f32 */, 1, ne1, t1, sizeof t1), 0);
    uint16_t t2[2 * 5];
    for (int i = 0; i < 10; i++) t2[i] = (uint16_t)(i * 977);
    const int64_t ne2[2] = {2, 5};
    cr_assert_eq(eng_gguf_add_tensor(w, "t2", 1 /* f16 */, 2, ne2, t2, sizeof t2), 0);
    void *mem; size_t size;
    cr_assert_eq(eng_gguf_write_memory(w, &mem, &size), 0);

    buf b = {0};
    b_header(&b, 3, 2, 3);
    b_str(&b, "general.architecture"); b_u32(&b, ENG_GGUF_STRING); b_str(&b, "llama");
    b_kv_u32(&b, "llama.block_count", 7);
    b_str(&b, "a.i32"); b_u32(&b, ENG_GGUF_ARRAY); b_u32(&b, ENG_GGUF_INT32); b_u64(&b, 3);
    for (int i = 0; i < 3; i++) b_u32(&b, (uint32_t)arr[i]);
    const uint64_t e1[1] = {3}, e2[2] = {2, 5};
    b_tensor(&b, "t1", 1, e1, 0, 0);
    b_tensor(&b, "t2", 2, e2, 1, 32);
    b_pad(&b, 32);
    b_put(&b, t1, sizeof t1); b_pad(&b, 32);
    b_put(&b, t2, sizeof t2); b_pad(&b, 32);
    cr_assert_eq(size, b.n);
    cr_assert(memcmp(mem, b.p, b.n) == 0);
    free(b.p);
    free(mem);
    eng_gguf_writer_free(w);
}

Test(gguf, writer_alignment_key_and_rejections) {
    eng_gguf_writer *w;
    cr_assert_eq(eng_gguf_writer_create(&w), 0);
    cr_assert_eq(eng_gguf_add_u32(w, "general.alignment", 0), ENG_ERR_INVALID);
    cr_assert_eq(eng_gguf_add_u32(w, "general.alignment", 48), ENG_ERR_INVALID);
    cr_assert_eq(eng_gguf_add_i32(w, "general.alignment", 64), ENG_ERR_INVALID);
    cr_assert_eq(eng_gguf_add_str(w, "general.alignment", "64", 2), ENG_ERR_INVALID);
    cr_assert_eq(eng_gguf_add_u32(w, "general.alignment", 64), 0);
    cr_assert_eq(eng_gguf_add_u32(w, "x", 1), 0);
    cr_assert_eq(eng_gguf_add_f32(w, "x", 1.0f), ENG_ERR_INVALID);   /* duplicate key */
    cr_assert_eq(eng_gguf_add_u32(w, "", 1), ENG_ERR_INVALID);
    cr_assert_eq(eng_gguf_add_u32(w, NULL, 1), ENG_ERR_INVALID);
    const uint8_t bools[2] = {1, 2};
    cr_assert_eq(eng_gguf_add_arr(w, "b", ENG_GGUF_BOOL, bools, 2), ENG_ERR_INVALID);
    cr_assert_eq(eng_gguf_add_arr(w, "b", ENG_GGUF_ARRAY, bools, 1), ENG_ERR_INVALID);
    cr_assert_eq(eng_gguf_add_arr(w, "b", ENG_GGUF_STRING, bools, 1), ENG_ERR_INVALID);
    cr_assert_eq(eng_gguf_add_arr(w, "b", 13, bools, 1), ENG_ERR_INVALID);
    eng_gguf_kv big = {.key = {"u8", 2}, .type = ENG_GGUF_UINT8, .v.u64 = 256};
    cr_assert_eq(eng_gguf_add_kv_from(w, &big), ENG_ERR_INVALID);
    eng_gguf_kv neg = {.key = {"i16", 3}, .type = ENG_GGUF_INT16, .v.i64 = -40000};
    cr_assert_eq(eng_gguf_add_kv_from(w, &neg), ENG_ERR_INVALID);

    float data[64] = {0};
    const int64_t ne[2] = {8, 3}, bad0[1] = {0}, q8[1] = {33};
    cr_assert_eq(eng_gguf_add_tensor(w, "t", 0, 2, ne, data, 8 * 3 * 4), 0);
    cr_assert_eq(eng_gguf_add_tensor(w, "t", 0, 2, ne, data, 8 * 3 * 4), ENG_ERR_INVALID); /* duplicate */
    cr_assert_eq(eng_gguf_add_tensor(w, "u", 0, 2, ne, data, 8 * 3 * 4 - 1), ENG_ERR_INVALID);
    cr_assert_eq(eng_gguf_add_tensor(w, "u", 0, 5, ne, data, 8 * 3 * 4), ENG_ERR_INVALID);
    cr_assert_eq(eng_gguf_add_tensor(w, "u", 0, 0, ne, data, 8 * 3 * 4), ENG_ERR_INVALID);
    cr_assert_eq(eng_gguf_add_tensor(w, "u", 0, 1, bad0, data, 0), ENG_ERR_INVALID);
    cr_assert_eq(eng_gguf_add_tensor(w, "u", 4 /* no such type */, 2, ne, data, 8 * 3 * 4), ENG_ERR_INVALID);
    cr_assert_eq(eng_gguf_add_tensor(w, "u", 8 /* q8_0 */, 1, q8, data, 34), ENG_ERR_INVALID);
    const int64_t ne1[1] = {5};
    cr_assert_eq(eng_gguf_add_tensor(w, "v", 0, 1, ne1, data, 20), 0);

    void *mem; size_t size;
    cr_assert_eq(eng_gguf_write_memory(w, &mem, &size), 0);
    eng_gguf *g; char err[256];
    cr_assert_eq(eng_gguf_open_memory(mem, size, "aligned", &g, err, sizeof err), 0, "%s", err);
    cr_assert_eq(eng_gguf_alignment(g), 64);
    cr_assert_eq(eng_gguf_data_offset(g) % 64, 0);
    cr_assert_eq(eng_gguf_n_tensors(g), 2);
    cr_assert_eq(eng_gguf_tensor_at(g, 1)->offset, 128);  /* 96 bytes of "t" rounded up to 64 */
    cr_assert_eq(eng_gguf_n_kv(g), 2);
    eng_gguf_close(g);
    free(mem);
    eng_gguf_writer_free(w);
    eng_gguf_writer_free(NULL);
    eng_gguf_close(NULL);
}

Test(gguf, typed_getters_convert_only_when_the_value_fits) {
    eng_gguf_writer *w;
    cr_assert_eq(eng_gguf_writer_create(&w), 0);
    eng_gguf_kv kvs[] = {
        {.key = {"u8", 2}, .type = ENG_GGUF_UINT8, .v.u64 = 200},
        {.key = {"u64big", 6}, .type = ENG_GGUF_UINT64, .v.u64 = 1ull << 40},
        {.key = {"u64max", 6}, .type = ENG_GGUF_UINT64, .v.u64 = UINT64_MAX},
        {.key = {"i8neg", 5}, .type = ENG_GGUF_INT8, .v.i64 = -5},
        {.key = {"i64", 3}, .type = ENG_GGUF_INT64, .v.i64 = 123456789012345ll},
        {.key = {"i16", 3}, .type = ENG_GGUF_INT16, .v.i64 = 1000},
        {.key = {"f64", 3}, .type = ENG_GGUF_FLOAT64, .v.f64 = 0.125},
    };
    for (size_t i = 0; i < sizeof kvs / sizeof kvs[0]; i++) cr_assert_eq(eng_gguf_add_kv_from(w, &kvs[i]), 0);
    cr_assert_eq(eng_gguf_add_f32(w, "f32", 1e-5f), 0);
    cr_assert_eq(eng_gguf_add_bool(w, "b", true), 0);
    cr_assert_eq(eng_gguf_add_str(w, "s", "hi", 2), 0);
    const uint32_t a[2] = {1, 2};
    cr_assert_eq(eng_gguf_add_arr(w, "arr", ENG_GGUF_UINT32, a, 2), 0);
    void *mem; size_t size;
    cr_assert_eq(eng_gguf_write_memory(w, &mem, &size), 0);
    eng_gguf *g; char err[256];
    cr_assert_eq(eng_gguf_open_memory(mem, size, NULL, &g, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(eng_gguf_name(g), "<memory>");
    uint32_t u; int64_t i64; float f; bool b; eng_gguf_str s;
    cr_assert_eq(eng_gguf_get_u32(g, "u8", &u), 0); cr_assert_eq(u, 200);
    cr_assert_eq(eng_gguf_get_u32(g, "u64big", &u), ENG_ERR_TYPE);
    cr_assert_eq(eng_gguf_get_i64(g, "u64big", &i64), 0); cr_assert_eq(i64, 1ll << 40);
    cr_assert_eq(eng_gguf_get_i64(g, "u64max", &i64), ENG_ERR_TYPE);
    cr_assert_eq(eng_gguf_get_u32(g, "i8neg", &u), ENG_ERR_TYPE);
    cr_assert_eq(eng_gguf_get_i64(g, "i8neg", &i64), 0); cr_assert_eq(i64, -5);
    cr_assert_eq(eng_gguf_get_u32(g, "i16", &u), 0); cr_assert_eq(u, 1000);
    cr_assert_eq(eng_gguf_get_i64(g, "i64", &i64), 0); cr_assert_eq(i64, 123456789012345ll);
    cr_assert_eq(eng_gguf_get_f32(g, "f64", &f), 0); cr_assert_float_eq(f, 0.125f, 0);
    cr_assert_eq(eng_gguf_get_f32(g, "f32", &f), 0); cr_assert_eq(f, 1e-5f);
    cr_assert_eq(eng_gguf_get_f32(g, "u8", &f), ENG_ERR_TYPE);
    cr_assert_eq(eng_gguf_get_u32(g, "f32", &u), ENG_ERR_TYPE);
    cr_assert_eq(eng_gguf_get_bool(g, "b", &b), 0); cr_assert(b);
    cr_assert_eq(eng_gguf_get_bool(g, "u8", &b), ENG_ERR_TYPE);
    cr_assert_eq(eng_gguf_get_str(g, "s", &s), 0); cr_assert(str_is(s, "hi"));
    cr_assert_eq(eng_gguf_get_str(g, "u8", &s), ENG_ERR_TYPE);
    cr_assert_eq(eng_gguf_get_u32(g, "arr", &u), ENG_ERR_TYPE);
    cr_assert_eq(eng_gguf_get_arr(g, "s", NULL, NULL, NULL, NULL), ENG_ERR_TYPE);
    uint64_t n;
    cr_assert_eq(eng_gguf_get_arr(g, "arr", NULL, &n, NULL, NULL), 0); cr_assert_eq(n, 2);
    cr_assert_eq(eng_gguf_get_u32(g, "missing", &u), ENG_ERR_NOT_FOUND);
    cr_assert_eq(eng_gguf_get_i64(g, "missing", &i64), ENG_ERR_NOT_FOUND);
    cr_assert_eq(eng_gguf_get_f32(g, "missing", &f), ENG_ERR_NOT_FOUND);
    cr_assert_eq(eng_gguf_get_bool(g, "missing", &b), ENG_ERR_NOT_FOUND);
    cr_assert_eq(eng_gguf_get_str(g, "missing", &s), ENG_ERR_NOT_FOUND);
    cr_assert_eq(eng_gguf_get_arr(g, "missing", NULL, NULL, NULL, NULL), ENG_ERR_NOT_FOUND);
    eng_gguf_close(g);
    free(mem);
    eng_gguf_writer_free(w);
}

Test(gguf, zero_tensor_file_opens) {
    eng_gguf_writer *w;
    cr_assert_eq(eng_gguf_writer_create(&w), 0);
    const eng_gguf_str toks[3] = {{"a", 1}, {"", 0}, {"\xe2\x96\x81the", 6}};
    cr_assert_eq(eng_gguf_add_str_arr(w, "tokenizer.ggml.tokens", toks, 3), 0);
    void *mem; size_t size;
    cr_assert_eq(eng_gguf_write_memory(w, &mem, &size), 0);
    eng_gguf *g; char err[256];
    cr_assert_eq(eng_gguf_open_memory(mem, size, "vocab", &g, err, sizeof err), 0, "%s", err);
    cr_assert_eq(eng_gguf_n_tensors(g), 0);
    cr_assert_null(eng_gguf_tensor_at(g, 0));
    eng_gguf_close(g);
    /* Without the padding a vocab-only file is still valid (the data section is empty). */
    buf b = {0};
    b_header(&b, 2, 0, 1);
    b_kv_u32(&b, "k", 1);
    cr_assert_eq(eng_gguf_open_memory(b.p, b.n, "v2", &g, err, sizeof err), 0, "%s", err);
    cr_assert_eq(eng_gguf_version(g), 2);
    eng_gguf_close(g);
    free(b.p);
    free(mem);
    eng_gguf_writer_free(w);
}

/* Thousands of keys and tensors: every one is found by name, and absent names are not. */
Test(gguf, many_names_are_all_found) {
    eng_gguf_writer *w;
    cr_assert_eq(eng_gguf_writer_create(&w), 0);
    enum { N = 3000 };
    char name[64];
    const float one = 1.0f;
    const int64_t ne[1] = {1};
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "k.%d", i * 7919 % 100003);
        cr_assert_eq(eng_gguf_add_u32(w, name, (uint32_t)i), 0);
        snprintf(name, sizeof name, "blk.%d.t", i);
        cr_assert_eq(eng_gguf_add_tensor(w, name, 0, 1, ne, &one, 4), 0);
    }
    void *mem; size_t size;
    cr_assert_eq(eng_gguf_write_memory(w, &mem, &size), 0);
    eng_gguf *g; char err[256];
    cr_assert_eq(eng_gguf_open_memory(mem, size, "many", &g, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < N; i++) {
        uint32_t v;
        snprintf(name, sizeof name, "k.%d", i * 7919 % 100003);
        cr_assert_eq(eng_gguf_get_u32(g, name, &v), 0, "%s", name);
        cr_assert_eq(v, (uint32_t)i);
        snprintf(name, sizeof name, "blk.%d.t", i);
        cr_assert_eq(eng_gguf_find_tensor(g, name), eng_gguf_tensor_at(g, i));
        snprintf(name, sizeof name, "blk.%d.u", i);
        cr_assert_null(eng_gguf_find_tensor(g, name));
    }
    eng_gguf_close(g);
    free(mem);
    eng_gguf_writer_free(w);
}

/* ---- corruption -------------------------------------------------------------------------------------------------- */
/* A few-KB file whose last tensor ends exactly at the end of the file (no trailing padding), so that every
 * proper prefix is invalid. */
static void small_file(void **mem, size_t *size) {
    rng r = {77};
    eng_gguf_writer *w;
    cr_assert_eq(eng_gguf_writer_create(&w), 0);
    cr_assert_eq(eng_gguf_add_str(w, "general.architecture", "llama", 5), 0);
    cr_assert_eq(eng_gguf_add_u32(w, "llama.block_count", 1), 0);
    cr_assert_eq(eng_gguf_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f), 0);
    cr_assert_eq(eng_gguf_add_bool(w, "tokenizer.ggml.add_bos_token", true), 0);
    eng_gguf_str toks[40];
    char tb[40][8];
    float scores[40];
    int32_t types[40];
    for (int i = 0; i < 40; i++) {
        snprintf(tb[i], sizeof tb[i], "t%d", i);
        toks[i].ptr = tb[i];
        toks[i].len = strlen(tb[i]);
        scores[i] = -(float)i;
        types[i] = 1;
    }
    cr_assert_eq(eng_gguf_add_str_arr(w, "tokenizer.ggml.tokens", toks, 40), 0);
    cr_assert_eq(eng_gguf_add_arr(w, "tokenizer.ggml.scores", ENG_GGUF_FLOAT32, scores, 40), 0);
    cr_assert_eq(eng_gguf_add_arr(w, "tokenizer.ggml.token_type", ENG_GGUF_INT32, types, 40), 0);
    uint8_t data[2048];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)rng_next(&r);
    const int64_t q[2] = {64, 8}, n1[1] = {16}, f2[2] = {8, 4};
    cr_assert_eq(eng_gguf_add_tensor(w, "blk.0.attn_q.weight", 8, 2, q, data, 2 * 34 * 8), 0);
    cr_assert_eq(eng_gguf_add_tensor(w, "blk.0.attn_norm.weight", 0, 1, n1, data, 64), 0);
    cr_assert_eq(eng_gguf_add_tensor(w, "output.weight", 1, 2, f2, data, 64), 0);
    cr_assert_eq(eng_gguf_write_memory(w, mem, size), 0);
    eng_gguf_writer_free(w);
}

/* Whatever a corrupt file opened as must be self-consistent and inside the buffer. */
static void check_consistent(const eng_gguf *g, const uint8_t *base, size_t size) {
    uint32_t a = eng_gguf_alignment(g);
    cr_assert(a != 0 && (a & (a - 1)) == 0);
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++) {
        const eng_gguf_kv *kv = eng_gguf_kv_at(g, i);
        cr_assert((const uint8_t *)kv->key.ptr >= base && (const uint8_t *)kv->key.ptr + kv->key.len <= base + size);
        cr_assert_lt(kv->type, 13);
        char key[256];
        if (kv->key.len < sizeof key && !memchr(kv->key.ptr, 0, kv->key.len)) {
            memcpy(key, kv->key.ptr, kv->key.len);
            key[kv->key.len] = 0;
            cr_assert_eq(eng_gguf_find(g, key), kv);
        }
        if (kv->type == ENG_GGUF_STRING)
            cr_assert((const uint8_t *)kv->v.str.ptr + kv->v.str.len <= base + size);
        if (kv->type == ENG_GGUF_ARRAY) {
            cr_assert(kv->v.arr.type < 13 && kv->v.arr.type != ENG_GGUF_ARRAY);
            if (kv->v.arr.type == ENG_GGUF_STRING) {
                for (uint64_t j = 0; j < kv->v.arr.n; j++)
                    cr_assert((const uint8_t *)kv->v.arr.strs[j].ptr + kv->v.arr.strs[j].len <= base + size);
            } else {
                cr_assert((const uint8_t *)kv->v.arr.data + kv->v.arr.n * elem_size(kv->v.arr.type) <= base + size);
            }
        }
    }
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        cr_assert(t->n_dims >= 1 && t->n_dims <= 4);
        cr_assert_not_null(eng_gguf_type_name(t->type));
        cr_assert_eq(t->nbytes, eng_gguf_tensor_bytes(t->type, t->n_dims, t->ne));
        cr_assert_eq(t->offset % a, 0);
        cr_assert((const uint8_t *)t->data == base + eng_gguf_data_offset(g) + t->offset);
        cr_assert((const uint8_t *)t->data + t->nbytes <= base + size);
        volatile uint8_t sink = ((const uint8_t *)t->data)[t->nbytes - 1];  /* ASan checks the last byte */
        (void)sink;
    }
}

Test(gguf, every_truncation_fails_cleanly) {
    void *mem; size_t size;
    small_file(&mem, &size);
    cr_assert(size > 1000 && size < 8000, "size %zu", size);
    for (size_t len = 0; len <= size; len++) {
        uint8_t *copy = malloc(len ? len : 1);  /* exact size: ASan catches any read past len */
        memcpy(copy, mem, len);
        eng_gguf *g = NULL;
        char err[256] = "";
        int rc = eng_gguf_open_memory(len ? copy : NULL, len, "trunc.gguf", &g, err, sizeof err);
        if (len < size) {
            cr_assert_eq(rc, ENG_ERR_FORMAT, "truncated at %zu of %zu: rc %d (%s)", len, size, rc, err);
            cr_assert_null(g);
            cr_assert(strncmp(err, "trunc.gguf: ", 12) == 0, "message: %s", err);
        } else {
            cr_assert_eq(rc, 0, "%s", err);
            check_consistent(g, copy, len);
            eng_gguf_close(g);
        }
        free(copy);
    }
    free(mem);
}

Test(gguf, random_byte_flips_give_an_error_or_consistent_data) {
    void *mem; size_t size;
    small_file(&mem, &size);
    uint8_t *copy = malloc(size);
    int n_ok = 0, n_err = 0;
    for (uint64_t seed = 1; seed <= 4000; seed++) {
        rng r = {seed * 7919};
        memcpy(copy, mem, size);
        int flips = 1 + (int)rng_below(&r, 4);
        /* Most flips land in the header (where they matter); some anywhere. */
        for (int k = 0; k < flips; k++) {
            size_t at = rng_below(&r, 4) ? rng_below(&r, 900) : rng_below(&r, size);
            uint8_t v = rng_below(&r, 3) == 0 ? (uint8_t)(1u << rng_below(&r, 8)) ^ copy[at] : (uint8_t)rng_next(&r);
            copy[at] = v;
        }
        eng_gguf *g = NULL;
        char err[256] = "";
        int rc = eng_gguf_open_memory(copy, size, "flip.gguf", &g, err, sizeof err);
        if (rc == 0) {
            check_consistent(g, copy, size);
            eng_gguf_close(g);
            n_ok++;
        } else {
            cr_assert(rc == ENG_ERR_FORMAT || rc == ENG_ERR_UNSUPPORTED || rc == ENG_ERR_NOMEM,
                      "seed %llu: rc %d", (unsigned long long)seed, rc);
            cr_assert(strncmp(err, "flip.gguf: ", 11) == 0 && strlen(err) > 12, "seed %llu: message '%s'",
                      (unsigned long long)seed, err);
            cr_assert_null(g);
            n_err++;
        }
    }
    cr_assert(n_ok > 100 && n_err > 100, "flips: %d ok, %d errors", n_ok, n_err);
    free(copy);
    free(mem);
}

/* ---- hostile files -------------------------------------------------------------------------------------------- */
typedef struct hostile {
    const char *what;
    int code;
    const char *needle;   /* must appear in the message */
} hostile;

static void expect(const char *dir, buf *b, const hostile *h) {
    char err[512] = "";
    int rc = open_bytes(dir, "hostile.gguf", b, err, sizeof err);
    cr_assert_eq(rc, h->code, "%s: rc %d, expected %d (%s)", h->what, rc, h->code, err);
    cr_assert(strstr(err, h->needle) != NULL, "%s: message '%s' lacks '%s'", h->what, err, h->needle);
    free(b->p);
    memset(b, 0, sizeof *b);
}

Test(gguf, hostile_values_get_the_right_error) {
    char *dir = make_tmpdir();
    buf b = {0};
    const uint64_t ne8[2] = {8, 2}, ne5[5] = {1, 1, 1, 1, 1};
    float zeros[16] = {0};

    b_put(&b, "GGML", 4); b_u32(&b, 3); b_u64(&b, 0); b_u64(&b, 0);
    expect(dir, &b, &(hostile){"bad magic", ENG_ERR_FORMAT, "not a GGUF file"});
    b_header(&b, 1, 0, 0);
    expect(dir, &b, &(hostile){"version 1", ENG_ERR_FORMAT, "version 1"});
    b_header(&b, 7, 0, 0);
    expect(dir, &b, &(hostile){"version 7", ENG_ERR_FORMAT, "version 7"});
    b_header(&b, 0x03000000u, 0, 0);
    expect(dir, &b, &(hostile){"big endian", ENG_ERR_FORMAT, "big-endian"});
    b_header(&b, 3, 0, UINT64_MAX);
    expect(dir, &b, &(hostile){"huge n_kv", ENG_ERR_FORMAT, "kv count"});
    b_header(&b, 3, 1ull << 60, 0);
    expect(dir, &b, &(hostile){"huge n_tensors", ENG_ERR_FORMAT, "tensor count"});
    b_header(&b, 3, 0, 1); b_u64(&b, UINT64_MAX - 3); b_put(&b, "abcdefghijklmnop", 16);
    expect(dir, &b, &(hostile){"huge key length", ENG_ERR_FORMAT, "string length"});
    b_header(&b, 3, 0, 1); b_str(&b, "k"); b_u32(&b, ENG_GGUF_STRING); b_u64(&b, 1ull << 62); b_put(&b, "xxxx", 4);
    expect(dir, &b, &(hostile){"huge string value", ENG_ERR_FORMAT, "string length"});
    b_header(&b, 3, 0, 1); b_str(&b, "k"); b_u32(&b, ENG_GGUF_ARRAY); b_u32(&b, ENG_GGUF_STRING);
    b_u64(&b, 1ull << 61); b_u64(&b, 0);
    expect(dir, &b, &(hostile){"huge string array", ENG_ERR_FORMAT, "cannot fit"});
    b_header(&b, 3, 0, 1); b_str(&b, "k"); b_u32(&b, ENG_GGUF_ARRAY); b_u32(&b, ENG_GGUF_UINT64);
    b_u64(&b, 1ull << 61); b_u64(&b, 0);
    expect(dir, &b, &(hostile){"huge u64 array (count * 8 overflows)", ENG_ERR_FORMAT, "exceeds"});
    b_header(&b, 3, 0, 1); b_str(&b, "k"); b_u32(&b, ENG_GGUF_ARRAY); b_u32(&b, ENG_GGUF_ARRAY);
    b_u64(&b, 1); b_u32(&b, ENG_GGUF_UINT8); b_u64(&b, 0);
    expect(dir, &b, &(hostile){"nested array", ENG_ERR_UNSUPPORTED, "nested arrays"});
    b_header(&b, 3, 0, 1); b_str(&b, "k"); b_u32(&b, 13); b_u64(&b, 0);
    expect(dir, &b, &(hostile){"value type 13", ENG_ERR_FORMAT, "value type 13"});
    b_header(&b, 3, 0, 1); b_str(&b, "k"); b_u32(&b, ENG_GGUF_ARRAY); b_u32(&b, 99); b_u64(&b, 0);
    expect(dir, &b, &(hostile){"element type 99", ENG_ERR_FORMAT, "element type 99"});
    b_header(&b, 3, 0, 1); b_str(&b, "k"); b_u32(&b, ENG_GGUF_BOOL); b_u8(&b, 2); b_put(&b, "pad.pad.pad.pad", 15);
    expect(dir, &b, &(hostile){"bool 2", ENG_ERR_FORMAT, "bool"});
    b_header(&b, 3, 0, 2); b_kv_u32(&b, "dup", 1); b_kv_u32(&b, "dup", 2);
    expect(dir, &b, &(hostile){"duplicate key", ENG_ERR_FORMAT, "duplicate key 'dup'"});
    b_header(&b, 3, 0, 1); b_kv_u32(&b, "general.alignment", 0);
    expect(dir, &b, &(hostile){"alignment 0", ENG_ERR_FORMAT, "general.alignment"});
    b_header(&b, 3, 0, 1); b_kv_u32(&b, "general.alignment", 24);
    expect(dir, &b, &(hostile){"alignment 24", ENG_ERR_FORMAT, "power of two"});
    b_header(&b, 3, 0, 1); b_str(&b, "general.alignment"); b_u32(&b, ENG_GGUF_UINT64); b_u64(&b, 32);
    expect(dir, &b, &(hostile){"alignment as u64", ENG_ERR_FORMAT, "general.alignment"});

    /* tensor infos */
    b_header(&b, 3, 1, 0); b_tensor(&b, "t5", 5, ne5, 0, 0); b_put(&b, zeros, sizeof zeros);
    expect(dir, &b, &(hostile){"n_dims 5", ENG_ERR_FORMAT, "n_dims 5"});
    b_header(&b, 3, 1, 0); b_tensor(&b, "t0", 0, ne5, 0, 0); b_put(&b, zeros, sizeof zeros);
    expect(dir, &b, &(hostile){"n_dims 0", ENG_ERR_FORMAT, "n_dims 0"});
    const uint64_t zero_dim[2] = {8, 0};
    b_header(&b, 3, 1, 0); b_tensor(&b, "tz", 2, zero_dim, 0, 0); b_put(&b, zeros, sizeof zeros);
    expect(dir, &b, &(hostile){"dim 0", ENG_ERR_FORMAT, "dimension 1 = 0"});
    const uint64_t neg_dim[1] = {1ull << 63};
    b_header(&b, 3, 1, 0); b_tensor(&b, "tn", 1, neg_dim, 0, 0); b_put(&b, zeros, sizeof zeros);
    expect(dir, &b, &(hostile){"dim >= 2^63", ENG_ERR_FORMAT, "out of range"});
    const uint64_t ovf[4] = {1ull << 20, 1ull << 20, 1ull << 20, 1ull << 20};
    b_header(&b, 3, 1, 0); b_tensor(&b, "tov", 4, ovf, 0, 0); b_put(&b, zeros, sizeof zeros);
    expect(dir, &b, &(hostile){"element count overflow", ENG_ERR_FORMAT, "overflows"});
    const uint64_t big2[2] = {1ull << 31, 1ull << 30};
    b_header(&b, 3, 1, 0); b_tensor(&b, "tbytes", 2, big2, 0, 0); b_put(&b, zeros, sizeof zeros);
    expect(dir, &b, &(hostile){"byte size past end", ENG_ERR_FORMAT, "past the end"});
    b_header(&b, 3, 1, 0); b_tensor(&b, "weird.tensor", 2, ne8, 77, 0); b_put(&b, zeros, sizeof zeros);
    expect(dir, &b, &(hostile){"unknown type", ENG_ERR_UNSUPPORTED, "tensor 'weird.tensor': unknown tensor type id 77"});
    b_header(&b, 3, 1, 0); b_tensor(&b, "removed", 2, ne8, 4 /* a removed ggml id */, 0); b_put(&b, zeros, sizeof zeros);
    expect(dir, &b, &(hostile){"removed type", ENG_ERR_UNSUPPORTED, "type id 4"});
    const uint64_t q8odd[1] = {40};
    b_header(&b, 3, 1, 0); b_tensor(&b, "q8", 1, q8odd, 8, 0); b_pad(&b, 32); b_put(&b, zeros, sizeof zeros);
    expect(dir, &b, &(hostile){"row not whole blocks", ENG_ERR_FORMAT, "not a multiple of the q8_0 block size"});
    b_header(&b, 3, 1, 0); b_tensor(&b, "mis", 2, ne8, 0, 16); b_pad(&b, 32);
    b_put(&b, zeros, sizeof zeros); b_put(&b, zeros, sizeof zeros); b_put(&b, zeros, sizeof zeros);
    expect(dir, &b, &(hostile){"misaligned offset", ENG_ERR_FORMAT, "not a multiple of the alignment"});
    b_header(&b, 3, 1, 0); b_tensor(&b, "past", 2, ne8, 0, 32); b_pad(&b, 32); b_put(&b, zeros, sizeof zeros);
    b_put(&b, zeros, sizeof zeros / 2 - 4);  /* 4 bytes short of offset 32 + 64 bytes */
    expect(dir, &b, &(hostile){"data past end", ENG_ERR_FORMAT, "tensor 'past': data"});
    b_header(&b, 3, 1, 0); b_tensor(&b, "far", 2, ne8, 0, UINT64_MAX - 31); b_pad(&b, 32); b_put(&b, zeros, sizeof zeros);
    expect(dir, &b, &(hostile){"offset overflow", ENG_ERR_FORMAT, "past the end"});
    b_header(&b, 3, 2, 0); b_tensor(&b, "same", 2, ne8, 0, 0); b_tensor(&b, "same", 2, ne8, 0, 64); b_pad(&b, 32);
    for (int i = 0; i < 4; i++) b_put(&b, zeros, sizeof zeros);
    expect(dir, &b, &(hostile){"duplicate tensor", ENG_ERR_FORMAT, "duplicate tensor name 'same'"});
    /* With general.alignment 64, an offset of 32 is misaligned. */
    b_header(&b, 3, 1, 1); b_kv_u32(&b, "general.alignment", 64); b_tensor(&b, "a64", 2, ne8, 0, 32); b_pad(&b, 64);
    for (int i = 0; i < 4; i++) b_put(&b, zeros, sizeof zeros);
    expect(dir, &b, &(hostile){"offset vs alignment 64", ENG_ERR_FORMAT, "alignment 64"});
    /* Control: the same shapes well-formed open fine. */
    b_header(&b, 3, 2, 1); b_kv_u32(&b, "general.alignment", 64); b_tensor(&b, "a", 2, ne8, 0, 0);
    b_tensor(&b, "b", 2, ne8, 0, 64); b_pad(&b, 64);
    for (int i = 0; i < 2; i++) { b_put(&b, zeros, sizeof zeros); b_pad(&b, 64); }
    char err[512];
    cr_assert_eq(open_bytes(dir, "good.gguf", &b, err, sizeof err), 0, "%s", err);
    free(b.p);
    memset(&b, 0, sizeof b);

    /* Files that are no GGUF at all. */
    eng_gguf *g = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/missing.gguf", dir);
    cr_assert_eq(eng_gguf_open(path, &g, err, sizeof err), ENG_ERR_IO);
    cr_assert(strstr(err, path) == err, "%s", err);
    cr_assert_eq(eng_gguf_open(dir, &g, err, sizeof err), ENG_ERR_IO);
    cr_assert(strstr(err, "not a regular file"), "%s", err);
    snprintf(path, sizeof path, "%s/empty.gguf", dir);
    write_file(path, "", 0);
    cr_assert_eq(eng_gguf_open(path, &g, err, sizeof err), ENG_ERR_FORMAT);
    cr_assert(strstr(err, "empty"), "%s", err);
    unlink(path);
    cr_assert_eq(eng_gguf_open_memory("GG", 2, "short", &g, err, sizeof err), ENG_ERR_FORMAT);
    cr_assert_eq(eng_gguf_open_memory("GGUF", 4, "short", &g, NULL, 0), ENG_ERR_FORMAT);  /* no err buffer */
    cr_assert_eq(eng_gguf_open_memory("GGUF\3\0\0\0", 8, "s", &g, err, 5), ENG_ERR_FORMAT); /* tiny buffer */
    cr_assert_eq(strlen(err), 4);
    rmdir(dir);
    free(dir);
}

Test(gguf, writer_reports_unwritable_path) {
    eng_gguf_writer *w;
    cr_assert_eq(eng_gguf_writer_create(&w), 0);
    char err[256];
    cr_assert_eq(eng_gguf_write(w, "/nonexistent-dir-kvs/x.gguf", err, sizeof err), ENG_ERR_IO);
    cr_assert(strncmp(err, "/nonexistent-dir-kvs/x.gguf: ", 29) == 0, "%s", err);
    eng_gguf_writer_free(w);
}

/* ---- ../shared models -------------------------------------------------------------------------------------------- */
static int count_opened(const char *dir, int *n_files) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int n_tensor_files = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) { n_tensor_files += count_opened(path, n_files); continue; }
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 5, ".gguf") != 0) continue;
        eng_gguf *g;
        char err[512];
        cr_assert_eq(eng_gguf_open(path, &g, err, sizeof err), 0, "%s", err);
        cr_assert_eq(eng_gguf_file_size(g), (size_t)st.st_size);
        cr_assert(eng_gguf_version(g) == 2 || eng_gguf_version(g) == 3);
        /* Every tensor lies inside the file; the largest end is within one alignment of the file end. */
        uint64_t max_end = 0;
        for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
            const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
            uint64_t end = eng_gguf_data_offset(g) + t->offset + t->nbytes;
            if (end > max_end) max_end = end;
        }
        if (eng_gguf_n_tensors(g) > 0) {
            n_tensor_files++;
            cr_assert_leq(max_end, (uint64_t)st.st_size);
            cr_assert_lt((uint64_t)st.st_size - max_end, eng_gguf_alignment(g), "%s: %llu bytes after the data",
                         path, (unsigned long long)((uint64_t)st.st_size - max_end));
        }
        uint64_t n_tok;
        cr_assert_eq(eng_gguf_get_arr(g, "tokenizer.ggml.tokens", NULL, &n_tok, NULL, NULL), 0, "%s", path);
        (*n_files)++;
        eng_gguf_close(g);
    }
    closedir(d);
    return n_tensor_files;
}

Test(gguf, shared_models_all_open) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models", kvt_shared_dir());
    if (!file_exists(dir)) cr_skip_test("%s not present: shared test models unavailable", dir);
    int n_files = 0;
    int n_tensor_files = count_opened(dir, &n_files);
    cr_assert_geq(n_files, 13, "opened %d model files", n_files);
    cr_assert_geq(n_tensor_files, 8);
}

Test(gguf, shared_vocab_only_sizes) {
    static const struct { const char *file; uint64_t n_vocab; } v[] = {
        {"ggml-vocab-llama-spm.gguf", 32000}, {"ggml-vocab-llama-bpe.gguf", 128256},
        {"ggml-vocab-qwen2.gguf", 151936},    {"ggml-vocab-gpt-2.gguf", 50257},
        {"ggml-vocab-phi-3.gguf", 32064},
    };
    char path[1024];
    snprintf(path, sizeof path, "%s/models/vocab-only", kvt_shared_dir());
    if (!file_exists(path)) cr_skip_test("%s not present: shared test models unavailable", path);
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        snprintf(path, sizeof path, "%s/models/vocab-only/%s", kvt_shared_dir(), v[i].file);
        eng_gguf *g;
        char err[512];
        cr_assert_eq(eng_gguf_open(path, &g, err, sizeof err), 0, "%s", err);
        cr_assert_eq(eng_gguf_n_tensors(g), 0);
        uint32_t et; uint64_t n; const eng_gguf_str *strs;
        cr_assert_eq(eng_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, NULL, &strs), 0);
        cr_assert_eq(et, ENG_GGUF_STRING);
        cr_assert_eq(n, v[i].n_vocab, "%s: %llu tokens", v[i].file, (unsigned long long)n);
        eng_gguf_close(g);
    }
}

Test(gguf, shared_stories260k_facts) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", kvt_shared_dir());
    if (!file_exists(path)) cr_skip_test("%s not present: shared test models unavailable", path);
    eng_gguf *g;
    char err[512];
    cr_assert_eq(eng_gguf_open(path, &g, err, sizeof err), 0, "%s", err);
    cr_assert_eq(eng_gguf_version(g), 3);
    cr_assert_eq(eng_gguf_n_tensors(g), 48);
    cr_assert_eq(eng_gguf_n_kv(g), 19);
    cr_assert_eq(eng_gguf_alignment(g), 32);
    cr_assert_null(eng_gguf_find(g, "general.alignment"));
    cr_assert_eq(eng_gguf_data_offset(g), 14176);
    cr_assert_eq(eng_gguf_file_size(g), 1185376);
    eng_gguf_str s;
    cr_assert_eq(eng_gguf_get_str(g, "general.architecture", &s), 0); cr_assert(str_is(s, "llama"));
    cr_assert_eq(eng_gguf_get_str(g, "general.name", &s), 0); cr_assert(str_is(s, "llama"));
    cr_assert_eq(eng_gguf_get_str(g, "tokenizer.ggml.model", &s), 0); cr_assert(str_is(s, "llama"));
    static const struct { const char *key; uint32_t v; } u[] = {
        {"llama.context_length", 2048}, {"llama.embedding_length", 64}, {"llama.block_count", 5},
        {"llama.feed_forward_length", 172}, {"llama.attention.head_count", 8},
        {"llama.attention.head_count_kv", 4}, {"llama.rope.dimension_count", 8},
        {"tokenizer.ggml.bos_token_id", 1}, {"tokenizer.ggml.eos_token_id", 2},
        {"tokenizer.ggml.unknown_token_id", 0}, {"tokenizer.ggml.padding_token_id", 4294967295u},
        {"tokenizer.ggml.seperator_token_id", 4294967295u},
    };
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) {
        uint32_t v;
        cr_assert_eq(eng_gguf_get_u32(g, u[i].key, &v), 0, "%s", u[i].key);
        cr_assert_eq(v, u[i].v, "%s = %u", u[i].key, v);
    }
    float eps;
    cr_assert_eq(eng_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps), 0);
    cr_assert_float_eq(eps, 1e-5f, 1e-12);
    cr_assert_null(eng_gguf_find(g, "llama.rope.freq_base"));
    cr_assert_null(eng_gguf_find(g, "tokenizer.ggml.add_bos_token"));
    cr_assert_null(eng_gguf_find(g, "tokenizer.ggml.pre"));
    cr_assert_null(eng_gguf_find(g, "tokenizer.chat_template"));

    uint32_t et; uint64_t n; const void *data; const eng_gguf_str *strs;
    cr_assert_eq(eng_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &data, &strs), 0);
    cr_assert_eq(et, ENG_GGUF_STRING); cr_assert_eq(n, 512);
    cr_assert(str_is(strs[0], "<unk>") && str_is(strs[1], "<s>") && str_is(strs[2], "</s>"));
    cr_assert(str_is(strs[3], "<0x00>") && str_is(strs[258], "<0xFF>"));
    cr_assert_eq(eng_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, &data, &strs), 0);
    cr_assert_eq(et, ENG_GGUF_FLOAT32); cr_assert_eq(n, 512);
    cr_assert_eq(eng_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &data, &strs), 0);
    cr_assert_eq(et, ENG_GGUF_INT32); cr_assert_eq(n, 512);
    int counts[8] = {0};
    for (uint64_t i = 0; i < n; i++) {
        int32_t t;
        memcpy(&t, (const uint8_t *)data + 4 * i, 4);
        cr_assert(t >= 0 && t < 8);
        counts[t]++;
    }
    cr_assert_eq(counts[1], 253); cr_assert_eq(counts[2], 1); cr_assert_eq(counts[3], 2); cr_assert_eq(counts[6], 256);

    size_t total = 0;
    for (int64_t i = 0; i < 48; i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        cr_assert_eq(t->type, 0, "all F32");
        total += t->nbytes;
    }
    const struct { const char *name; int64_t ne0, ne1; } shapes[] = {
        {"token_embd.weight", 64, 512}, {"output.weight", 64, 512}, {"output_norm.weight", 64, 1},
        {"blk.0.attn_q.weight", 64, 64}, {"blk.0.attn_k.weight", 64, 32}, {"blk.4.attn_v.weight", 64, 32},
        {"blk.2.ffn_gate.weight", 64, 172}, {"blk.3.ffn_up.weight", 64, 172}, {"blk.1.ffn_down.weight", 172, 64},
        {"blk.4.attn_norm.weight", 64, 1}, {"blk.4.ffn_norm.weight", 64, 1}, {"blk.0.attn_output.weight", 64, 64},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const eng_gguf_tensor *t = eng_gguf_find_tensor(g, shapes[i].name);
        cr_assert_not_null(t, "%s", shapes[i].name);
        cr_assert_eq(t->ne[0], shapes[i].ne0, "%s", shapes[i].name);
        cr_assert_eq(t->ne[1], shapes[i].ne1, "%s", shapes[i].name);
        cr_assert_eq(t->nbytes, (size_t)(4 * shapes[i].ne0 * shapes[i].ne1));
    }
    cr_assert_leq(total + 14176, 1185376);
    eng_gguf_close(g);
}

/* Rewriting a real file (every kv through add_kv_from, every tensor) gives a file that reads back the same;
 * for stories260K, whose producer laid it out the same way, the bytes are identical. */
Test(gguf, shared_rewrite_reads_back_identically) {
    const char *files[] = {"stories260K.gguf", "synthetic/syn-qwen2-chat-q8_0.gguf",
                           "vocab-only/ggml-vocab-phi-3.gguf"};
    char path[1024];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", kvt_shared_dir());
    if (!file_exists(path)) cr_skip_test("%s not present: shared test models unavailable", path);
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        snprintf(path, sizeof path, "%s/models/%s", kvt_shared_dir(), files[f]);
        eng_gguf *g, *h;
        char err[512];
        cr_assert_eq(eng_gguf_open(path, &g, err, sizeof err), 0, "%s", err);
        eng_gguf_writer *w;
        cr_assert_eq(eng_gguf_writer_create(&w), 0);
        for (int64_t i = 0; i < eng_gguf_n_kv(g); i++) cr_assert_eq(eng_gguf_add_kv_from(w, eng_gguf_kv_at(g, i)), 0);
        for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
            const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
            char name[256];
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
            cr_assert_eq(eng_gguf_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->nbytes), 0);
        }
        void *mem; size_t size;
        cr_assert_eq(eng_gguf_write_memory(w, &mem, &size), 0);
        cr_assert_eq(eng_gguf_open_memory(mem, size, "rewritten", &h, err, sizeof err), 0, "%s", err);
        cr_assert_eq(eng_gguf_n_kv(h), eng_gguf_n_kv(g));
        cr_assert_eq(eng_gguf_n_tensors(h), eng_gguf_n_tensors(g));
        for (int64_t i = 0; i < eng_gguf_n_kv(g); i++) {
            const eng_gguf_kv *a = eng_gguf_kv_at(g, i), *b = eng_gguf_kv_at(h, i);
            cr_assert(a->key.len == b->key.len && !memcmp(a->key.ptr, b->key.ptr, a->key.len));
            cr_assert_eq(a->type, b->type);
        }
        for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
            const eng_gguf_tensor *a = eng_gguf_tensor_at(g, i), *b = eng_gguf_tensor_at(h, i);
            cr_assert_eq(a->nbytes, b->nbytes);
            cr_assert_eq(a->offset, b->offset);
            cr_assert(memcmp(a->data, b->data, a->nbytes) == 0);
        }
        if (f == 0) {
            size_t osize;
            void *orig = read_file(path, &osize);
            cr_assert_eq(size, osize);
            cr_assert(memcmp(orig, mem, size) == 0, "rewritten stories260K differs from the original");
            free(orig);
        }
        eng_gguf_close(h);
        eng_gguf_close(g);
        free(mem);
        eng_gguf_writer_free(w);
    }
}

/* ---- the block-size table against quant.h ------------------------------------------------------------------- */
Test(gguf, block_sizes_agree_with_quant_module) {
    int n_known = 0;
    for (uint32_t t = 0; t < 64; t++) {
        const eng_qtype_info *qi = eng_qtype_get(t);
        if (!qi || !qi->name) continue;
        n_known++;
        const int64_t ne[1] = {qi->block_elems};
        cr_assert_not_null(eng_gguf_type_name(t), "type %u (%s) unknown to gguf", t, qi->name);
        cr_assert_str_eq(eng_gguf_type_name(t), qi->name);
        cr_assert_eq(eng_gguf_tensor_bytes(t, 1, ne), (size_t)qi->block_bytes, "type %s", qi->name);
        const int64_t ne3[3] = {qi->block_elems * 3, 5, 2};
        cr_assert_eq(eng_gguf_tensor_bytes(t, 3, ne3), eng_qtype_row_bytes(t, qi->block_elems * 3) * 10);
    }
    cr_assert_geq(n_known, 15);
}

/* ---- kvserve mkmodel ------------------------------------------------------------------------------------------ */
static eng_gguf *mk(const char *dir, const char *fname, const char *const *extra) {
    char out[512];
    snprintf(out, sizeof out, "%s/%s", dir, fname);
    const char *args[32] = {"mkmodel", "-o", out};
    int n = 3;
    for (int i = 0; extra[i]; i++) args[n++] = extra[i];
    args[n] = NULL;
    cr_assert_eq(kvt_run_kvserve(dir, args, NULL), 0, "mkmodel %s failed", fname);
    eng_gguf *g;
    char err[512];
    cr_assert_eq(eng_gguf_open(out, &g, err, sizeof err), 0, "%s", err);
    return g;
}

static void rm_in(const char *dir, const char *fname) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, fname);
    unlink(p);
}

static uint32_t u32_of(const eng_gguf *g, const char *key) {
    uint32_t v = 0;
    cr_assert_eq(eng_gguf_get_u32(g, key, &v), 0, "%s", key);
    return v;
}

static void expect_tensor(const eng_gguf *g, const char *name, uint32_t type, int64_t ne0, int64_t ne1) {
    const eng_gguf_tensor *t = eng_gguf_find_tensor(g, name);
    cr_assert_not_null(t, "missing tensor %s", name);
    cr_assert_eq(t->type, type, "%s type %u", name, t->type);
    cr_assert_eq(t->ne[0], ne0, "%s ne0 %lld", name, (long long)t->ne[0]);
    cr_assert_eq(t->ne[1], ne1, "%s ne1 %lld", name, (long long)t->ne[1]);
    cr_assert_eq(t->n_dims, ne1 > 1 ? 2u : 1u, "%s", name);
}

static float *tensor_f32(const eng_gguf_tensor *t) {
    int64_t n = t->ne[0] * t->ne[1];
    float *v = malloc((size_t)n * sizeof *v);
    size_t rb = eng_qtype_row_bytes(t->type, t->ne[0]);
    for (int64_t r = 0; r < t->ne[1]; r++)
        cr_assert_eq(eng_dequantize_row(t->type, (const uint8_t *)t->data + r * rb, v + r * t->ne[0], t->ne[0]), 0);
    return v;
}

static void moments(const eng_gguf_tensor *t, double *mean, double *std) {
    float *v = tensor_f32(t);
    int64_t n = t->ne[0] * t->ne[1];
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) { s += v[i]; s2 += (double)v[i] * v[i]; }
    *mean = s / (double)n;
    *std = sqrt(s2 / (double)n - *mean * *mean);
    free(v);
}

Test(mkmodel, tiny_shapes_metadata_vocab_and_statistics) {
    char *dir = make_tmpdir();
    eng_gguf *g = mk(dir, "tiny.gguf", (const char *[]){"--preset", "tiny", NULL});
    eng_gguf_str s;
    cr_assert_eq(eng_gguf_get_str(g, "general.architecture", &s), 0);
    cr_assert(str_is(s, "llama"));
    cr_assert_eq(u32_of(g, "llama.embedding_length"), 64);
    cr_assert_eq(u32_of(g, "llama.block_count"), 2);
    cr_assert_eq(u32_of(g, "llama.attention.head_count"), 4);
    cr_assert_eq(u32_of(g, "llama.attention.head_count_kv"), 2);
    cr_assert_eq(u32_of(g, "llama.feed_forward_length"), 128);
    cr_assert_eq(u32_of(g, "llama.context_length"), 512);
    cr_assert_eq(u32_of(g, "llama.rope.dimension_count"), 16);
    cr_assert_eq(u32_of(g, "general.file_type"), 0);
    cr_assert_null(eng_gguf_find(g, "llama.attention.key_length"));
    float f;
    cr_assert_eq(eng_gguf_get_f32(g, "llama.rope.freq_base", &f), 0); cr_assert_eq(f, 10000.0f);
    cr_assert_eq(eng_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f), 0); cr_assert_eq(f, 1e-5f);

    /* Built-in vocabulary. */
    cr_assert_eq(eng_gguf_get_str(g, "tokenizer.ggml.model", &s), 0); cr_assert(str_is(s, "llama"));
    uint32_t et; uint64_t n_vocab; const eng_gguf_str *toks; const void *data;
    cr_assert_eq(eng_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n_vocab, NULL, &toks), 0);
    cr_assert_eq(et, ENG_GGUF_STRING);
    cr_assert_gt(n_vocab, 261 + 300);
    cr_assert_eq(u32_of(g, "llama.vocab_size"), n_vocab);
    cr_assert(str_is(toks[0], "<unk>") && str_is(toks[1], "<s>") && str_is(toks[2], "</s>"));
    cr_assert(str_is(toks[3], "<|im_start|>") && str_is(toks[4], "<|im_end|>"));
    cr_assert_eq(u32_of(g, "tokenizer.ggml.bos_token_id"), 1);
    cr_assert_eq(u32_of(g, "tokenizer.ggml.eos_token_id"), 2);
    cr_assert_eq(u32_of(g, "tokenizer.ggml.eot_token_id"), 4);
    cr_assert_eq(u32_of(g, "tokenizer.ggml.unknown_token_id"), 0);
    bool b;
    cr_assert_eq(eng_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b), 0); cr_assert(b);
    cr_assert_eq(eng_gguf_get_str(g, "tokenizer.chat_template", &s), 0);
    cr_assert(str_is(s, "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                        "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
                        "{{ '<|im_start|>assistant\\n' }}{% endif %}"));
    cr_assert_eq(eng_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, NULL, &data, NULL), 0);
    cr_assert_eq(et, ENG_GGUF_INT32);
    /* Array data is packed into the file and may be unaligned: copy it out. */
    int32_t *types = malloc(n_vocab * 4);
    memcpy(types, data, n_vocab * 4);
    cr_assert_eq(types[0], 2);
    for (int i = 1; i < 5; i++) cr_assert_eq(types[i], 3);
    for (int i = 0; i < 256; i++) {
        char want[8];
        snprintf(want, sizeof want, "<0x%02X>", i);
        cr_assert(str_is(toks[5 + i], want), "byte token %d", i);
        cr_assert_eq(types[5 + i], 6);
    }
    cr_assert_eq(eng_gguf_get_arr(g, "tokenizer.ggml.scores", &et, NULL, &data, NULL), 0);
    cr_assert_eq(et, ENG_GGUF_FLOAT32);
    float *scores = malloc(n_vocab * 4);
    memcpy(scores, data, n_vocab * 4);
    /* Pieces: unique, normal, scores non-increasing, and every multi-character piece is a "\u2581" word prefix
     * whose one-shorter prefix is also a piece (so SPM merging can build it). */
    int n_words = 0;
    for (uint64_t i = 261; i < n_vocab; i++) {
        cr_assert_eq(types[i], 1);
        if (i > 261) cr_assert_leq(scores[i], scores[i - 1], "score order at %llu", (unsigned long long)i);
        for (uint64_t j = 261; j < i; j++)
            cr_assert(!(toks[j].len == toks[i].len && !memcmp(toks[j].ptr, toks[i].ptr, toks[i].len)),
                      "duplicate piece %llu", (unsigned long long)i);
        if (toks[i].len <= 1 || (toks[i].len == 3 && !memcmp(toks[i].ptr, "\xe2\x96\x81", 3))) continue;
        cr_assert(toks[i].len > 3 && !memcmp(toks[i].ptr, "\xe2\x96\x81", 3), "piece %llu is not a word",
                  (unsigned long long)i);
        eng_gguf_str prefix = {toks[i].ptr, toks[i].len - 1};
        bool found = false;
        for (uint64_t j = 261; j < n_vocab && !found; j++)
            found = toks[j].len == prefix.len && !memcmp(toks[j].ptr, prefix.ptr, prefix.len);
        cr_assert(found, "prefix of piece %llu missing", (unsigned long long)i);
        if (toks[i].len >= 6) n_words++;
    }
    cr_assert_gt(n_words, 200);
    free(types);
    free(scores);

    /* Tensors: names, shapes, types. Tiny is f32 with a separate output.weight. */
    cr_assert_eq(eng_gguf_n_tensors(g), 1 + 2 * 9 + 2);
    expect_tensor(g, "token_embd.weight", 0, 64, (int64_t)n_vocab);
    expect_tensor(g, "output.weight", 0, 64, (int64_t)n_vocab);
    expect_tensor(g, "output_norm.weight", 0, 64, 1);
    for (int l = 0; l < 2; l++) {
        char nm[64];
#define T(sfx, a, b) do { snprintf(nm, sizeof nm, "blk.%d." sfx, l); expect_tensor(g, nm, 0, a, b); } while (0)
        T("attn_norm.weight", 64, 1); T("attn_q.weight", 64, 64); T("attn_k.weight", 64, 32);
        T("attn_v.weight", 64, 32); T("attn_output.weight", 64, 64); T("ffn_norm.weight", 64, 1);
        T("ffn_gate.weight", 64, 128); T("ffn_up.weight", 64, 128); T("ffn_down.weight", 128, 64);
#undef T
        snprintf(nm, sizeof nm, "blk.%d.attn_q.bias", l);
        cr_assert_null(eng_gguf_find_tensor(g, nm));
    }
    /* Weight statistics: matrices ~N(0, 0.05), embeddings ~N(0, 0.5), norms near 1. */
    double mean, sd;
    moments(eng_gguf_find_tensor(g, "blk.0.ffn_up.weight"), &mean, &sd);
    cr_assert(fabs(mean) < 0.003 && fabs(sd - 0.05) < 0.0025, "ffn_up mean %g std %g", mean, sd);
    moments(eng_gguf_find_tensor(g, "token_embd.weight"), &mean, &sd);
    cr_assert(fabs(mean) < 0.01 && fabs(sd - 0.5) < 0.02, "token_embd mean %g std %g", mean, sd);
    moments(eng_gguf_find_tensor(g, "blk.1.attn_norm.weight"), &mean, &sd);
    cr_assert(fabs(mean - 1.0) < 0.02 && sd > 0.001 && sd < 0.05, "attn_norm mean %g std %g", mean, sd);
    /* Different tensors get different streams. */
    const eng_gguf_tensor *a = eng_gguf_find_tensor(g, "blk.0.ffn_gate.weight");
    const eng_gguf_tensor *u = eng_gguf_find_tensor(g, "blk.0.ffn_up.weight");
    cr_assert(memcmp(a->data, u->data, a->nbytes) != 0);
    eng_gguf_close(g);
    rm_in(dir, "tiny.gguf");
    rmdir(dir);
    free(dir);
}

Test(mkmodel, reruns_are_byte_identical_and_seeds_differ) {
    char *dir = make_tmpdir();
    const char *cases[][12] = {
        {"--preset", "tiny", NULL},
        {"--preset", "default", "--layers", "1", NULL},
        {"--preset", "tiny", "--arch", "qwen2", "--type", "f16", "--tied", NULL},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        eng_gguf_close(mk(dir, "a.gguf", cases[c]));
        eng_gguf_close(mk(dir, "b.gguf", cases[c]));
        char pa[512], pb[512];
        snprintf(pa, sizeof pa, "%s/a.gguf", dir);
        snprintf(pb, sizeof pb, "%s/b.gguf", dir);
        size_t na, nb;
        void *A = read_file(pa, &na), *B = read_file(pb, &nb);
        cr_assert_eq(na, nb, "case %zu", c);
        cr_assert(memcmp(A, B, na) == 0, "case %zu: two runs differ", c);
        free(B);
        /* Another seed: same layout and size, other weights. */
        const char *with_seed[16];
        int n = 0;
        for (; cases[c][n]; n++) with_seed[n] = cases[c][n];
        with_seed[n++] = "--seed";
        with_seed[n++] = "7";
        with_seed[n] = NULL;
        eng_gguf_close(mk(dir, "b.gguf", with_seed));
        B = read_file(pb, &nb);
        cr_assert_eq(na, nb);
        cr_assert(memcmp(A, B, na) != 0, "case %zu: --seed changes nothing", c);
        free(A);
        free(B);
    }
    rm_in(dir, "a.gguf");
    rm_in(dir, "b.gguf");
    rmdir(dir);
    free(dir);
}

/* With the same seed, the q8_0 and f16 files hold exactly the quantization of the f32 file's weights. */
Test(mkmodel, quantized_types_equal_quantizing_the_f32_weights) {
    char *dir = make_tmpdir();
    eng_gguf *g32 = mk(dir, "f32.gguf", (const char *[]){"--preset", "tiny", "--type", "f32", NULL});
    eng_gguf *g8 = mk(dir, "q8.gguf", (const char *[]){"--preset", "tiny", "--type", "q8_0", NULL});
    eng_gguf *g16 = mk(dir, "f16.gguf", (const char *[]){"--preset", "tiny", "--type", "f16", NULL});
    cr_assert_eq(eng_gguf_n_tensors(g8), eng_gguf_n_tensors(g32));
    cr_assert_eq(u32_of(g8, "general.file_type"), 7);
    cr_assert_eq(u32_of(g16, "general.file_type"), 1);
    int n_quant = 0;
    for (int64_t i = 0; i < eng_gguf_n_tensors(g32); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g32, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        const eng_gguf_tensor *q8 = eng_gguf_find_tensor(g8, name), *h = eng_gguf_find_tensor(g16, name);
        cr_assert(q8 && h, "%s", name);
        bool is_norm = t->n_dims == 1;
        cr_assert_eq(q8->type, is_norm ? ENG_Q_F32 : ENG_Q_Q8_0, "%s", name);
        cr_assert_eq(h->type, is_norm ? ENG_Q_F32 : ENG_Q_F16, "%s", name);
        int64_t ne0 = t->ne[0], rows = t->ne[1];
        size_t rb8 = eng_qtype_row_bytes(q8->type, ne0), rb16 = eng_qtype_row_bytes(h->type, ne0);
        uint8_t *want8 = malloc(rb8), *want16 = malloc(rb16);
        for (int64_t r = 0; r < rows; r++) {
            const float *src = (const float *)t->data + r * ne0;
            cr_assert_eq(eng_quantize_row(q8->type, src, want8, ne0), 0);
            cr_assert(memcmp(want8, (const uint8_t *)q8->data + r * rb8, rb8) == 0, "%s row %lld", name, (long long)r);
            cr_assert_eq(eng_quantize_row(h->type, src, want16, ne0), 0);
            cr_assert(memcmp(want16, (const uint8_t *)h->data + r * rb16, rb16) == 0, "%s row %lld", name, (long long)r);
        }
        free(want8);
        free(want16);
        n_quant += !is_norm;
    }
    cr_assert_eq(n_quant, 2 + 2 * 7);
    eng_gguf_close(g32);
    eng_gguf_close(g8);
    eng_gguf_close(g16);
    rm_in(dir, "f32.gguf");
    rm_in(dir, "q8.gguf");
    rm_in(dir, "f16.gguf");
    rmdir(dir);
    free(dir);
}

Test(mkmodel, presets_qwen2_biases_head_dim_and_tying) {
    char *dir = make_tmpdir();
    /* default preset: untied q8_0; qwen2 with an explicit head dim gets biases and key/value lengths. */
    eng_gguf *g = mk(dir, "d.gguf", (const char *[]){"--preset", "default", "--layers", "1", NULL});
    cr_assert_eq(u32_of(g, "llama.embedding_length"), 256);
    cr_assert_eq(u32_of(g, "llama.attention.head_count"), 8);
    cr_assert_eq(u32_of(g, "llama.attention.head_count_kv"), 4);
    cr_assert_eq(u32_of(g, "llama.feed_forward_length"), 768);
    cr_assert_eq(u32_of(g, "llama.context_length"), 2048);
    expect_tensor(g, "output.weight", ENG_Q_Q8_0, 256, (int64_t)u32_of(g, "llama.vocab_size"));
    expect_tensor(g, "token_embd.weight", ENG_Q_Q8_0, 256, (int64_t)u32_of(g, "llama.vocab_size"));
    expect_tensor(g, "blk.0.attn_k.weight", ENG_Q_Q8_0, 256, 128);
    expect_tensor(g, "blk.0.ffn_down.weight", ENG_Q_Q8_0, 768, 256);
    eng_gguf_close(g);
    rm_in(dir, "d.gguf");

    g = mk(dir, "q.gguf", (const char *[]){"--preset", "tiny", "--arch", "qwen2", "--head-dim", "32", "--heads",
                                           "4", "--kv-heads", "1", "--rope-base", "1000000", "--ctx", "777", NULL});
    eng_gguf_str s;
    cr_assert_eq(eng_gguf_get_str(g, "general.architecture", &s), 0); cr_assert(str_is(s, "qwen2"));
    cr_assert_eq(u32_of(g, "qwen2.attention.key_length"), 32);
    cr_assert_eq(u32_of(g, "qwen2.attention.value_length"), 32);
    cr_assert_eq(u32_of(g, "qwen2.rope.dimension_count"), 32);
    cr_assert_eq(u32_of(g, "qwen2.context_length"), 777);
    float f;
    cr_assert_eq(eng_gguf_get_f32(g, "qwen2.attention.layer_norm_rms_epsilon", &f), 0); cr_assert_eq(f, 1e-6f);
    cr_assert_eq(eng_gguf_get_f32(g, "qwen2.rope.freq_base", &f), 0); cr_assert_eq(f, 1e6f);
    expect_tensor(g, "blk.1.attn_q.weight", 0, 64, 128);
    expect_tensor(g, "blk.1.attn_k.weight", 0, 64, 32);
    expect_tensor(g, "blk.1.attn_output.weight", 0, 128, 64);
    expect_tensor(g, "blk.1.attn_q.bias", 0, 128, 1);
    expect_tensor(g, "blk.1.attn_k.bias", 0, 32, 1);
    expect_tensor(g, "blk.1.attn_v.bias", 0, 32, 1);
    eng_gguf_close(g);
    rm_in(dir, "q.gguf");
    rmdir(dir);
    free(dir);
}

/* bench-8b (the Llama-3.1-8B shape) is about 16 GB in f16: its header comes from --dry-run (which writes
 * nothing), and a written file with the preset's untied f16 layout but a reduced shape checks what the preset
 * itself sets (context, rope base, type, the separate output.weight). */
Test(mkmodel, bench_8b_preset_header_by_dry_run) {
    char *dir = make_tmpdir();
    char out[512], vocab[1024];
    snprintf(out, sizeof out, "%s/8b.gguf", dir);
    snprintf(vocab, sizeof vocab, "%s/models/vocab-only/ggml-vocab-llama-bpe.gguf", kvt_shared_dir());
    const bool have_vocab = file_exists(vocab);
    const char *dry[] = {"mkmodel", "--preset", "bench-8b", "-o", out, "--dry-run",
                         have_vocab ? "--vocab-from" : NULL, vocab, NULL};
    char *log = NULL;
    cr_assert_eq(kvt_run_kvserve(dir, dry, &log), 0, "%s", log);
    cr_assert(!file_exists(out), "--dry-run wrote a file");
    const char *want[] = {
        "general.architecture = llama\n", "general.file_type = 1\n", "llama.context_length = 131072\n",
        "llama.embedding_length = 4096\n", "llama.block_count = 32\n", "llama.feed_forward_length = 14336\n",
        "llama.attention.head_count = 32\n", "llama.attention.head_count_kv = 8\n",
        "llama.rope.freq_base = 500000\n", "llama.rope.dimension_count = 128\n",
        "embd 4096, 32 blocks, 32/8 heads (dim 128), ff 14336", "f16, 291 tensors", /* untied: no ", tied" */
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) cr_assert(strstr(log, want[i]), "no '%s' in:\n%s", want[i], log);
    cr_assert_null(strstr(log, "key_length"), "head dim 128 = 4096 / 32 needs no key_length");
    if (have_vocab) {
        /* Llama 3's vocabulary: 128256 tokens; token_embd + 32 x 9 + output_norm + output = 291 tensors, 16.06 GB */
        cr_assert(strstr(log, "llama.vocab_size = 128256\n") && strstr(log, "tokenizer.ggml.pre = llama-bpe\n"), "%s", log);
        cr_assert(strstr(log, "vocab 128256, f16, 291 tensors, 15317.0 MiB of weights"), "%s", log);
    }
    free(log);
    /* the preset's own settings in a written file, with the shape scaled down */
    eng_gguf *g = mk(dir, "8b-small.gguf", (const char *[]){"--preset", "bench-8b", "--layers", "1", "--embd", "128",
                                                           "--heads", "4", "--kv-heads", "1", "--ff", "256", NULL});
    cr_assert_eq(u32_of(g, "llama.context_length"), 131072);
    cr_assert_eq(u32_of(g, "llama.attention.head_count_kv"), 1);
    float f;
    cr_assert_eq(eng_gguf_get_f32(g, "llama.rope.freq_base", &f), 0);
    cr_assert_eq(f, 500000.0f);
    cr_assert_eq(u32_of(g, "general.file_type"), 1);
    const int64_t n_vocab = (int64_t)u32_of(g, "llama.vocab_size");
    expect_tensor(g, "token_embd.weight", ENG_Q_F16, 128, n_vocab);
    expect_tensor(g, "output.weight", ENG_Q_F16, 128, n_vocab);
    expect_tensor(g, "blk.0.ffn_down.weight", ENG_Q_F16, 256, 128);
    eng_gguf_close(g);
    rm_in(dir, "8b-small.gguf");
    rmdir(dir);
    free(dir);
}

Test(mkmodel, bad_options_fail_without_writing) {
    char *dir = make_tmpdir();
    char out[512];
    snprintf(out, sizeof out, "%s/bad.gguf", dir);
    const char *bad[][10] = {
        {"mkmodel", NULL},                                              /* no -o */
        {"mkmodel", "-o", out, "--type", "q4_0", NULL},
        {"mkmodel", "-o", out, "--preset", "huge", NULL},
        {"mkmodel", "-o", out, "--heads", "3", "--kv-heads", "2", "--head-dim", "8", NULL},
        {"mkmodel", "-o", out, "--embd", "48", "--heads", "4", NULL},   /* q8_0 needs multiples of 32 */
        {"mkmodel", "-o", out, "--embd", "100", "--heads", "3", NULL},  /* 100 / 3 */
        {"mkmodel", "-o", out, "--layers", "0", NULL},
        {"mkmodel", "-o", out, "--bogus", "1", NULL},
        {"mkmodel", "-o", out, "--arch", "gpt2", NULL},
        {"mkmodel", "-o", out, "--seed", "-1", NULL},
        {"mkmodel", "-o", out, "--rope-factors", NULL},                 /* rope factors are phi3's */
        {"mkmodel", "-o", out, "--arch", "phi3", "--orig-ctx", "0", NULL},
        {"mkmodel", "-o", out, "--arch", "phi3", "--rope-attn-factor", "0", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(kvt_run_kvserve(dir, bad[i], NULL), 2, "case %zu should be a usage error", i);
        cr_assert(!file_exists(out), "case %zu wrote a file", i);
    }
    const char *missing_vocab[] = {"mkmodel", "-o", out, "--preset", "tiny", "--vocab-from", "/nonexistent.gguf", NULL};
    cr_assert_eq(kvt_run_kvserve(dir, missing_vocab, NULL), 1);
    cr_assert(!file_exists(out));
    const char *help[] = {"mkmodel", "--help", NULL};
    cr_assert_eq(kvt_run_kvserve(dir, help, NULL), 0);
    rmdir(dir);
    free(dir);
}

Test(mkmodel, vocab_from_copies_every_tokenizer_key) {
    const char *srcs[] = {"stories260K.gguf", "vocab-only/ggml-vocab-qwen2.gguf"};
    char path[1024];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", kvt_shared_dir());
    if (!file_exists(path)) cr_skip_test("%s not present: shared test models unavailable", path);
    char *dir = make_tmpdir();
    for (size_t k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/models/%s", kvt_shared_dir(), srcs[k]);
        eng_gguf *src, *g;
        char err[512];
        cr_assert_eq(eng_gguf_open(path, &src, err, sizeof err), 0, "%s", err);
        g = mk(dir, "v.gguf", (const char *[]){"--preset", "tiny", "--layers", "1", "--vocab-from", path, NULL});
        int n_tok_keys = 0;
        for (int64_t i = 0; i < eng_gguf_n_kv(src); i++) {
            const eng_gguf_kv *a = eng_gguf_kv_at(src, i);
            if (a->key.len < 10 || memcmp(a->key.ptr, "tokenizer.", 10)) continue;
            n_tok_keys++;
            char key[256];
            snprintf(key, sizeof key, "%.*s", (int)a->key.len, a->key.ptr);
            const eng_gguf_kv *b = eng_gguf_find(g, key);
            cr_assert_not_null(b, "%s missing", key);
            cr_assert_eq(a->type, b->type, "%s", key);
            if (a->type == ENG_GGUF_STRING) {
                cr_assert(a->v.str.len == b->v.str.len && !memcmp(a->v.str.ptr, b->v.str.ptr, a->v.str.len));
            } else if (a->type == ENG_GGUF_ARRAY) {
                cr_assert_eq(a->v.arr.type, b->v.arr.type);
                cr_assert_eq(a->v.arr.n, b->v.arr.n);
                if (a->v.arr.type == ENG_GGUF_STRING) {
                    for (uint64_t j = 0; j < a->v.arr.n; j++)
                        cr_assert(a->v.arr.strs[j].len == b->v.arr.strs[j].len &&
                                  !memcmp(a->v.arr.strs[j].ptr, b->v.arr.strs[j].ptr, a->v.arr.strs[j].len),
                                  "%s[%llu]", key, (unsigned long long)j);
                } else {
                    cr_assert(!memcmp(a->v.arr.data, b->v.arr.data, a->v.arr.n * elem_size(a->v.arr.type)));
                }
            } else {
                cr_assert(!memcmp(&a->v, &b->v, sizeof a->v), "%s", key);
            }
        }
        cr_assert_geq(n_tok_keys, 5);
        uint64_t n_vocab;
        cr_assert_eq(eng_gguf_get_arr(src, "tokenizer.ggml.tokens", NULL, &n_vocab, NULL, NULL), 0);
        cr_assert_eq(u32_of(g, "llama.vocab_size"), n_vocab);
        expect_tensor(g, "token_embd.weight", 0, 64, (int64_t)n_vocab);
        eng_gguf_close(g);
        eng_gguf_close(src);
    }
    rm_in(dir, "v.gguf");
    rmdir(dir);
    free(dir);
}
