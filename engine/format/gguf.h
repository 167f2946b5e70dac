/*
 * gguf.h: GGUF v2/v3 reader (over mmap or a memory buffer) and writer. Internal to the engine module
 * (prefix eng_gguf_); errors are the ENG_ERR_* codes of engine.h.
 *
 * The reader validates everything it reads from the file before using it: every length, count, offset and
 * size is checked against the file size, so a truncated, corrupt or hostile file gets ENG_ERR_FORMAT and a
 * message (naming the file and what is wrong), never a crash or an out-of-bounds read. Strings and array
 * data point into the mapping (not NUL-terminated; use the length). A gguf file is read-only after opening
 * and may be read from any thread.
 */
#ifndef KVSERVE_ENGINE_GGUF_H
#define KVSERVE_ENGINE_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

enum eng_gguf_type {
    ENG_GGUF_UINT8 = 0, ENG_GGUF_INT8 = 1, ENG_GGUF_UINT16 = 2, ENG_GGUF_INT16 = 3, ENG_GGUF_UINT32 = 4,
    ENG_GGUF_INT32 = 5, ENG_GGUF_FLOAT32 = 6, ENG_GGUF_BOOL = 7, ENG_GGUF_STRING = 8, ENG_GGUF_ARRAY = 9,
    ENG_GGUF_UINT64 = 10, ENG_GGUF_INT64 = 11, ENG_GGUF_FLOAT64 = 12,
};

typedef struct eng_gguf_str { const char *ptr; uint64_t len; } eng_gguf_str;

typedef struct eng_gguf_kv {
    eng_gguf_str key;
    uint32_t type;               /* enum eng_gguf_type */
    union {
        uint64_t u64; int64_t i64; double f64; bool b;  /* scalars, widened */
        eng_gguf_str str;
        struct {
            uint32_t type;       /* element type (not ARRAY: nested arrays are rejected as unsupported) */
            uint64_t n;
            const void *data;    /* n packed little-endian elements, for non-string types; inside the
                                    mapping at any byte offset, so possibly unaligned: memcpy them out */
            const eng_gguf_str *strs; /* n strings, for STRING arrays (allocated by the reader) */
        } arr;
    } v;
} eng_gguf_kv;

typedef struct eng_gguf_tensor {
    eng_gguf_str name;
    uint32_t n_dims;             /* 1..4 */
    int64_t ne[4];               /* dims, GGUF order: ne[0] is the innermost (row length); unused dims = 1 */
    uint32_t type;               /* ggml type id (enum eng_qtype in quant.h) */
    uint64_t offset;             /* from the start of the data section */
    const void *data;            /* the tensor's bytes inside the mapping: at a multiple of the alignment from
                                    the file start (so aligned in memory for eng_gguf_open's mmap; for
                                    open_memory only as aligned as the caller's buffer) */
    size_t nbytes;
} eng_gguf_tensor;

typedef struct eng_gguf eng_gguf;

/* Opens and validates a file (mmap, read-only). err receives "PATH: what is wrong (at byte N)" on failure.
 * Errors: ENG_ERR_IO (cannot open/stat/map, not a regular file), ENG_ERR_FORMAT (not GGUF, version other than
 * 2 or 3, truncated, a count/length/offset/size that does not fit the file, duplicate keys or tensor names,
 * value types out of range, bad general.alignment (must be a uint32 power of two; default 32), n_dims not in
 * 1..4, a dim < 1, misaligned or out-of-file tensor data), ENG_ERR_UNSUPPORTED (a tensor type id GGUF does
 * not define, nested arrays), ENG_ERR_NOMEM, ENG_ERR_INVALID (NULL arguments). Files with zero tensors
 * (vocab-only) are valid. The mapping must not be truncated by someone else while open (SIGBUS). */
int eng_gguf_open(const char *path, eng_gguf **out, char *err, size_t err_len);
/* Same over a caller's buffer (kept, not copied: it must outlive the eng_gguf). name labels messages. */
int eng_gguf_open_memory(const void *data, size_t size, const char *name, eng_gguf **out, char *err,
                         size_t err_len);
void eng_gguf_close(eng_gguf *g);

uint32_t eng_gguf_version(const eng_gguf *g);
uint32_t eng_gguf_alignment(const eng_gguf *g);
const char *eng_gguf_name(const eng_gguf *g);        /* the path or name given at open */
/* Byte offset of the tensor data section (the aligned end of the header) and the file's size. With zero
 * tensors the data offset may lie past the end of the file (vocab-only files need no padding). */
uint64_t eng_gguf_data_offset(const eng_gguf *g);
size_t eng_gguf_file_size(const eng_gguf *g);

int64_t eng_gguf_n_kv(const eng_gguf *g);
const eng_gguf_kv *eng_gguf_kv_at(const eng_gguf *g, int64_t i);
const eng_gguf_kv *eng_gguf_find(const eng_gguf *g, const char *key); /* NULL when absent */

/* Typed getters: ENG_ERR_NOT_FOUND when absent, ENG_ERR_TYPE when the stored type does not fit (integers
 * convert between widths when the value fits; floats accept f32/f64). */
int eng_gguf_get_u32(const eng_gguf *g, const char *key, uint32_t *out);
int eng_gguf_get_i64(const eng_gguf *g, const char *key, int64_t *out);
int eng_gguf_get_f32(const eng_gguf *g, const char *key, float *out);
int eng_gguf_get_bool(const eng_gguf *g, const char *key, bool *out);
int eng_gguf_get_str(const eng_gguf *g, const char *key, eng_gguf_str *out);
/* An array's element type, count, and data (non-string) or strings (string arrays). */
int eng_gguf_get_arr(const eng_gguf *g, const char *key, uint32_t *elem_type, uint64_t *n, const void **data,
                     const eng_gguf_str **strs);

int64_t eng_gguf_n_tensors(const eng_gguf *g);
const eng_gguf_tensor *eng_gguf_tensor_at(const eng_gguf *g, int64_t i);
const eng_gguf_tensor *eng_gguf_find_tensor(const eng_gguf *g, const char *name); /* NULL when absent */

/* The ggml name of a tensor type id ("f32", "q8_0", "iq2_xs", ...), NULL for ids GGUF does not define. The
 * reader knows the block layout of every defined id (quantized or not), so it can open files whose tensor
 * types the engine cannot compute with; the model loader checks eng_qtype_get(type)->supported. */
const char *eng_gguf_type_name(uint32_t type);
/* Bytes of a tensor of that type and dims (ne[0] a multiple of the block size, every ne >= 1, n_dims 1..4);
 * 0 when the shape is invalid, the type unknown, or the size overflows. */
size_t eng_gguf_tensor_bytes(uint32_t type, uint32_t n_dims, const int64_t *ne);

/* ---- writer ---------------------------------------------------------------------------------------------- */
typedef struct eng_gguf_writer eng_gguf_writer;

int eng_gguf_writer_create(eng_gguf_writer **out);   /* GGUF v3, alignment 32 */
void eng_gguf_writer_free(eng_gguf_writer *w);
/* Adders copy their arguments. Keys must be unique and non-empty (ENG_ERR_INVALID otherwise); ENG_ERR_NOMEM
 * when a copy fails. "general.alignment" may only be added as a uint32 power of two, and then sets the
 * alignment the writer lays tensors out with. */
int eng_gguf_add_u32(eng_gguf_writer *w, const char *key, uint32_t v);
int eng_gguf_add_i32(eng_gguf_writer *w, const char *key, int32_t v);
int eng_gguf_add_f32(eng_gguf_writer *w, const char *key, float v);
int eng_gguf_add_bool(eng_gguf_writer *w, const char *key, bool v);
int eng_gguf_add_str(eng_gguf_writer *w, const char *key, const char *v, size_t len);
/* A non-string array of n elements of elem_type, packed little-endian. */
int eng_gguf_add_arr(eng_gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n);
int eng_gguf_add_str_arr(eng_gguf_writer *w, const char *key, const eng_gguf_str *strs, uint64_t n);
/* Copies a kv (any type, arrays included) from a reader, e.g. a tokenizer block from another model. The
 * scalar is narrowed back to kv->type (ENG_ERR_INVALID when the widened value does not fit it), so a kv
 * built by hand can add any scalar type. */
int eng_gguf_add_kv_from(eng_gguf_writer *w, const eng_gguf_kv *kv);
/* A tensor of the given ggml type and dims; data (nbytes, which must match the type and dims) is copied. */
int eng_gguf_add_tensor(eng_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                        const int64_t *ne, const void *data, size_t nbytes);
/* Writes the file (atomically: a temporary file renamed into place). err names the path on failure. */
int eng_gguf_write(const eng_gguf_writer *w, const char *path, char *err, size_t err_len);
/* The same bytes eng_gguf_write would write, into a malloc'd buffer (*out, caller frees; *size its length).
 * Errors: ENG_ERR_INVALID, ENG_ERR_NOMEM. */
int eng_gguf_write_memory(const eng_gguf_writer *w, void **out, size_t *size);

#endif /* KVSERVE_ENGINE_GGUF_H */
