/* common.h: the small toolbox every kvserve module shares (prefix kvs_).
 *
 * What it is: one error enum with one kvs_strerror (libuv style: 0 is success, every failure a distinct negative
 * code), one growable byte buffer (kvs_buf), and the limits that more than one layer must agree on.
 * What it owns: nothing global. Every function here is reentrant and touches only what it is handed.
 * What it must never do: depend on another kvserve module, allocate behind the caller's back (kvs_buf grows only
 * the buffer it is given), or print. Mapping codes to HTTP statuses belongs to the server's API layer alone.
 */
#ifndef KVSERVE_COMMON_H
#define KVSERVE_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ------------------------------------------------------------------------------------------------ */

/* Every kvserve function that can fail returns 0 or one of these. The values never change meaning; new codes
 * are added at the end. Modules may keep their historical names (ENG_ERR_NOMEM...) as aliases of these. */
typedef enum kvs_err {
    KVS_OK = 0,
    KVS_ERR_INVALID = -1,      /* an argument or input is out of its documented range */
    KVS_ERR_NOMEM = -2,        /* an allocation failed */
    KVS_ERR_IO = -3,           /* a read, write, open or map failed (errno tells more) */
    KVS_ERR_FORMAT = -4,       /* malformed file or text (GGUF, JSON, template, schema) */
    KVS_ERR_UNSUPPORTED = -5,  /* well-formed, but a feature or type this build cannot handle */
    KVS_ERR_NOT_FOUND = -6,    /* a named key, tensor, token, sequence or request does not exist */
    KVS_ERR_TYPE = -7,         /* a value has another type than the one asked for */
    KVS_ERR_TOO_LARGE = -8,    /* an output buffer is too small, or an input exceeds a hard limit */
    KVS_ERR_KV_FULL = -9,      /* the KV block pool has no free block for this step */
    KVS_ERR_KV = -10,          /* the KV cache refused an operation (state or position) */
    KVS_ERR_DEVICE = -11,      /* a GPU call failed or no usable device */
    KVS_ERR_NO_SLOT = -12,     /* every sequence slot is in use */
    KVS_ERR_BAD_SEQ = -13,     /* a sequence id out of range or not active */
    KVS_ERR_POSITION = -14,    /* a position out of order or beyond the context */
    KVS_ERR_STATE = -15,       /* the call is not allowed in the object's current state */
    KVS_ERR_QUEUE_FULL = -16,  /* admission refused: the queue is at its limit */
    KVS_ERR_STOPPED = -17,     /* the component is shutting down or stopped */
    KVS_ERR_THREAD = -18,      /* a thread could not be created */
    KVS_ERR_TOO_LONG = -19,    /* a prompt (plus requested tokens) does not fit the context */
    KVS_ERR_BIND = -20,        /* a listening address could not be bound */
    KVS_ERR_CLOSED = -21,      /* the peer or connection is gone */
    KVS_ERR_BACKPRESSURE = -22,/* the peer reads too slowly; output is held back */
    KVS_ERR_MODEL = -23,       /* the model file could not be loaded */
    KVS_ERR_SYNTAX = -24,      /* a template, grammar or schema has a syntax error */
    KVS_ERR_LIMIT = -25,       /* a sandbox limit was reached (steps, depth, output size) */
    KVS_ERR_RAISED = -26,      /* a template called raise_exception */
    KVS_ERR_HELP = -27,        /* not a failure: usage text was requested and printed */
} kvs_err;

/* A short, constant, English description of `err`; "unknown error" for codes not in kvs_err. Never NULL. */
const char *kvs_strerror(int err);

/* Writes a printf-style message into err[0..err_len) (truncated, always NUL-terminated; nothing when err is NULL
 * or err_len is 0) and returns `code`, so a failure path reads `return kvs_errf(err, err_len, KVS_ERR_IO, ...)`. */
int kvs_errf(char *err, size_t err_len, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int kvs_verrf(char *err, size_t err_len, int code, const char *fmt, va_list ap);

/* ---- growable buffer --------------------------------------------------------------------------------------- */

/* A byte buffer that grows by doubling. `data` is NUL-terminated whenever len > 0 or after any successful call
 * (so it can be used as a C string when the content has no NUL). A failed allocation sets `oom`: later appends do
 * nothing and return KVS_ERR_NOMEM, so a caller may append many pieces and check once at the end.
 * `max` (0 = unlimited) caps len: an append past it fails with KVS_ERR_TOO_LARGE and sets `oom` as well. */
typedef struct kvs_buf {
    char *data;   /* [cap] owned, NULL until the first append */
    size_t len;   /* bytes used, excluding the terminating NUL */
    size_t cap;   /* bytes allocated */
    size_t max;   /* 0 or the largest len allowed */
    bool oom;     /* sticky: an append failed (memory or max) */
} kvs_buf;

/* Appends n bytes (s may be NULL when n == 0). 0, KVS_ERR_NOMEM or KVS_ERR_TOO_LARGE. */
int kvs_buf_append(kvs_buf *b, const void *s, size_t n);
/* Appends a NUL-terminated string. */
int kvs_buf_puts(kvs_buf *b, const char *s);
/* Appends one byte. */
int kvs_buf_putc(kvs_buf *b, char c);
/* printf-style append. */
int kvs_buf_printf(kvs_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int kvs_buf_vprintf(kvs_buf *b, const char *fmt, va_list ap);
/* Makes room for n more bytes without changing len. */
int kvs_buf_reserve(kvs_buf *b, size_t n);
/* Empties the buffer, keeping its memory and `max`; clears `oom`. */
void kvs_buf_clear(kvs_buf *b);
/* Hands the NUL-terminated data to the caller (free() it; never NULL after a successful call: an empty buffer
 * gives ""), or NULL when `oom` is set or the allocation fails. The buffer is left empty either way. */
char *kvs_buf_take(kvs_buf *b);
/* Frees the data; the buffer is empty and reusable. */
void kvs_buf_free(kvs_buf *b);
/* Reads a whole file into *out (malloc'd, NUL-terminated; the text may hold NULs) and its length into *len.
 * Errors: KVS_ERR_INVALID (NULL argument), KVS_ERR_IO (cannot open or read; errno says why), KVS_ERR_NOMEM. */
int kvs_read_file(const char *path, char **out, size_t *len);

/* ---- arrays ------------------------------------------------------------------------------------------------ */

/* Grows an array p of *cap elements of elem bytes so that it holds at least need elements: the capacity doubles
 * (starting at first). Returns the (possibly moved) array with *cap updated, or NULL when the allocation or the
 * size overflows (p is then untouched and still owned by the caller). */
void *kvs_grow(void *p, size_t *cap, size_t need, size_t elem, size_t first);

/* Room for one more element in the array a of n elements and capacity cap (lvalues; cap a size_t), grown by
 * kvs_grow from first: rc (an int lvalue) becomes KVS_ERR_NOMEM when that fails (a, cap untouched), else is left
 * as it was. A macro because the arrays' element types differ. */
#define KVS_GROW_ONE(rc, a, n, cap, first)                                                                   \
    do {                                                                                                     \
        if ((n) == (cap)) {                                                                                  \
            void *g_ = kvs_grow((a), &(cap), (size_t)(n) + 1, sizeof *(a), (first));                         \
            if (g_) (a) = g_;                                                                                \
            else (rc) = KVS_ERR_NOMEM;                                                                       \
        }                                                                                                    \
    } while (0)

/* free() of each of ptrs[0..n) (NULL entries allowed): a struct's arrays in one call. */
void kvs_free_all(void *const *ptrs, size_t n);
#define KVS_FREE_ALL(...) kvs_free_all((void *const[]){__VA_ARGS__}, sizeof((void *const[]){__VA_ARGS__}) / sizeof(void *))

/* ---- CPU features ------------------------------------------------------------------------------------------ */

/* The SIMD level every CPU kernel chooses by. AVX2 means AVX2 + FMA + F16C with the OS saving YMM state;
 * AVX512 adds AVX-512 F/BW/VL/DQ and VNNI with the OS saving ZMM state. The values equal the engine's
 * eng_simd_level. */
typedef enum { KVS_CPU_SCALAR = 0, KVS_CPU_AVX2 = 1, KVS_CPU_AVX512 = 2 } kvs_cpu_level;

/* Detects the level (cpuid + xgetbv). The environment variable KVSERVE_SIMD_MAX ("scalar" or "avx2") caps it,
 * to run a newer CPU as an older one would. Executes cpuid: objects call it once (an engine context at
 * creation, a sampler) and pass the result to their kernels. */
kvs_cpu_level kvs_cpu_detect(void);

/* ---- KV-pool planning ------------------------------------------------------------------------------------ */

/* How many KV blocks a context's pool gets: one rule for the CPU and the CUDA contexts.
 *   kv_blocks > 0: exactly that many (with a budget, it must fit);
 *   else kv_mem_bytes > 0: as many blocks as fit in it (with a budget, it must not exceed it);
 *   else default_seqs full-length sequences (default_seqs * blocks_per_seq blocks), at most default_cap bytes.
 * With `device`, budget is the device memory the pool may use and bounds every choice; without, memory is the
 * host's and unbounded. */
typedef struct kvs_kv_plan_req {
    size_t block_bytes;      /* bytes of one block over all layers, K and V (> 0) */
    int64_t blocks_per_seq;  /* ceil(n_ctx / block_size) */
    int64_t kv_blocks;       /* requested blocks, 0 = derive */
    size_t kv_mem_bytes;     /* requested bytes, 0 = derive */
    int64_t default_seqs;    /* full-length sequences the default pool holds */
    size_t default_cap;      /* the default pool's byte cap */
    bool device;             /* the pool lives in device memory: budget applies */
    size_t budget;           /* bytes the pool may use (device only) */
    double budget_fraction;  /* for messages only: the fraction of device memory the budget stands for */
} kvs_kv_plan_req;

/* Writes the block count (1 .. INT32_MAX) to *n_blocks. Errors (err gets a message): KVS_ERR_INVALID (host
 * pool below one block, or block_bytes 0), KVS_ERR_NOMEM (device pool: a request above the budget, or the
 * budget below one block). */
int kvs_kv_plan(const kvs_kv_plan_req *req, int32_t *n_blocks, char *err, size_t err_len);
/* ---- digests and encodings ----------------------------------------------------------------------------------- */

/* SHA-256 (FIPS 180-4), streaming: init, any number of updates, final. The state is the caller's. */
typedef struct kvs_sha256_ctx {
    uint32_t h[8];
    uint8_t buf[64];
    size_t n;          /* bytes waiting in buf */
    uint64_t len;      /* bytes hashed so far */
} kvs_sha256_ctx;

void kvs_sha256_init(kvs_sha256_ctx *c);
void kvs_sha256_update(kvs_sha256_ctx *c, const void *data, size_t n);
/* Writes the 32-byte digest; the state must be initialized again before reuse. */
void kvs_sha256_final(kvs_sha256_ctx *c, uint8_t out[32]);
/* One-shot digest of data[0..n). */
void kvs_sha256(const void *data, size_t n, uint8_t out[32]);

/* Standard base64 (RFC 4648 section 4, with '=' padding) of src[0..n) into dst, NUL-terminated. Needs
 * cap >= 4 * ceil(n / 3) + 1; returns the length written (without the NUL), or KVS_ERR_TOO_LARGE when cap is
 * too small (dst then holds "" when cap > 0). */
int kvs_base64_encode(const void *src, size_t n, char *dst, size_t cap);

/* ---- shared limits ------------------------------------------------------------------------------------------ */

/* The most top_logprobs / logprobs alternatives a request may ask for (OpenAI's limit). */
#define KVS_MAX_TOP_LOGPROBS 20

#ifdef __cplusplus
}
#endif

#endif
