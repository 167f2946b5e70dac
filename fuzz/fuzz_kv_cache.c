/*
 * fuzz_kv_cache.c: the paged KV cache's operation sequences against the reference model of
 * tests/unit/test_kv_cache.c, which this file includes (the same operations, checks and reference; only the
 * source of the choices differs).
 *
 * Input: bytes 0-7 choose the configuration (dtype, block size, pool size, slots, batch budget, longest
 * sequence, sliding window, prefix caching); every later byte is one choice of an operation (which operation,
 * which sequence, how many tokens, which error to inject, ...), taken in order; when they run out the choices
 * continue from a generator seeded by the input's length. After every operation the whole cache is compared
 * with the reference (test_kv_cache.c's verify); any difference aborts.
 */
#include "fuzz_util.h"

#include <stdarg.h>

/* the choices: input bytes first, then the generator */
typedef struct fz_pick_src { fz_in in; } fz_pick_src;
static fz_pick_src PICK; /* one input at a time (libFuzzer is sequential); reset per input */

static int32_t fz_pick(uint64_t *rng, int32_t n);

static void fz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fz_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

#define KVCT_FUZZ 1
#define KVCT_PICK(t, n) fz_pick(&(t)->rng, (n))
#define cr_assert(cond) FZ_CHECK(cond, "%s", "kv cache reference check")
#define cr_assert_eq(a, b) FZ_CHECK((a) == (b), "%s", "kv cache reference check")
#define cr_assert_fail(...) fz_fail(__VA_ARGS__)
#define cr_log_info(...) ((void)0)
#include "../tests/unit/test_kv_cache.c"

static int32_t fz_pick(uint64_t *rng, int32_t n) {
    if (n <= 0) return 0;
    if (fz_left(&PICK.in) > 0) return (int32_t)(fz_byte(&PICK.in) % (uint32_t)n);
    return kvct_range(rng, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 8) return 0;
    fz_in h = {data, 8, 0};
    rcfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.name = "fuzz";
    cfg.seed = 0x9E3779B97F4A7C15ULL ^ size;
    uint32_t d = fz_byte(&h) % 8;
    cfg.dtype = d < 6 ? KVC_DTYPE_F32 : d == 6 ? KVC_DTYPE_F16 : KVC_DTYPE_Q8_0;
    cfg.head_dim = cfg.dtype == KVC_DTYPE_Q8_0 ? 32 : 4;
    cfg.block_size = 1 + (int32_t)(fz_byte(&h) % 16);
    cfg.n_blocks = 2 + (int32_t)(fz_byte(&h) % 63);
    cfg.max_seqs = 1 + (int32_t)(fz_byte(&h) % MAX_SEQS);
    cfg.max_batch = 4 + (int32_t)(fz_byte(&h) % 45);
    uint32_t ml = fz_byte(&h);
    cfg.max_seq_len = ml < 160 ? 0 : 8 + (int32_t)(ml % 128);
    uint32_t w = fz_byte(&h);
    cfg.window = w < 170 ? 0 : cfg.block_size + (int32_t)(w % (uint32_t)(3 * cfg.block_size));
    cfg.prefix = fz_byte(&h) % 4 != 0;
    PICK.in = (fz_in){data + 8, size - 8, 0};
    cfg.ops = (int)((size - 8) / 3) + 1;
    if (cfg.ops > 150) cfg.ops = 150; /* each operation verifies the whole cache: keep an execution short */
    long done = 0;
    run_random(&cfg, &done);
    return 0;
}
