/* test_alloc_fail.c: allocation-failure injection (issue 14). Linked with -Wl,--wrap=malloc,calloc,realloc,
 * aligned_alloc,strdup,strndup (CMakeLists.txt), so every allocation the project's code makes goes through the
 * wrappers below; the production code has no hook of its own. For every N, a run fails the Nth allocation and
 * only that one:
 *   - the KV cache: create and a sequence of operations (prefill, prefix attach, copy-prefix, copy-on-write,
 *     rollback, context shift, tail removal, free, prefix reset), two configurations. Each call returns what it
 *     returns without injection, or KVS_ERR_NOMEM; after a NOMEM the cache passes kvc_check and the same call,
 *     retried, succeeds; the run ends with the same sequence lengths as without injection;
 *   - the engine's start-up and first steps: loading stories260K, creating a context, tokenizing, two decodes.
 *     A failure is a negative code (with a message for load and create), never a crash; a decode that failed
 *     leaves the cache as it was and its retry gives the same logits bit for bit as a run without injection.
 * N runs from 1 until a run meets no Nth allocation, so every allocation point of the sequence is tried.
 * Under ASan+UBSan (the san build) LeakSanitizer checks that no error path leaks. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kv_cache.h"
#include "engine/engine.h"
#include "helper_shared.h"

/* ---- the wrappers (test-only state: the production code has none) --------------------------------------------- */
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t s);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);

typedef struct af_state {
    atomic_bool armed;
    atomic_long count;   /* allocations seen while armed */
    atomic_long fail_at; /* the one to fail (1-based) */
    atomic_long failed;  /* how many were failed (0 or 1) */
} af_state;
static af_state AF;

static bool af_fail(void) {
    if (!atomic_load(&AF.armed)) return false;
    long k = atomic_fetch_add(&AF.count, 1) + 1;
    if (k != atomic_load(&AF.fail_at)) return false;
    atomic_fetch_add(&AF.failed, 1);
    return true;
}
static void af_arm(long n) {
    atomic_store(&AF.count, 0);
    atomic_store(&AF.failed, 0);
    atomic_store(&AF.fail_at, n);
    atomic_store(&AF.armed, true);
}
static void af_disarm(void) { atomic_store(&AF.armed, false); }
static bool af_failed(void) { return atomic_load(&AF.failed) > 0; }

void *__wrap_malloc(size_t n) { return af_fail() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t s) { return af_fail() ? NULL : __real_calloc(n, s); }
void *__wrap_realloc(void *p, size_t n) { return af_fail() ? NULL : __real_realloc(p, n); }
void *__wrap_aligned_alloc(size_t a, size_t n) { return af_fail() ? NULL : __real_aligned_alloc(a, n); }
char *__wrap_strdup(const char *s) { return af_fail() ? NULL : __real_strdup(s); }
char *__wrap_strndup(const char *s, size_t n) { return af_fail() ? NULL : __real_strndup(s, n); }

/* ---- the cache ----------------------------------------------------------------------------------------------- */
#define MAX_CALLS 64

typedef struct cache_run {
    bool record;             /* the run without injection: record the codes */
    int codes[MAX_CALLS];    /* each call's code without injection */
    int n_calls, k;
    int32_t lens[4];         /* sequence lengths at the end */
    int n_nomem;             /* calls that returned NOMEM (and were retried) */
} cache_run;

static void cache_check(kvc_cache *c, const char *what) {
    char msg[256];
    af_disarm(); /* the checker allocates too: not part of the injected sequence */
    int rc = kvc_check(c, msg, sizeof msg);
    cr_assert_eq(rc, 0, "after a failed %s the cache is inconsistent: %s", what, msg);
}

/* One call of the sequence: its code must be the recorded one, or NOMEM (when the injected failure hit it),
 * after which the cache must be consistent and the same call, retried (no more injection), must succeed. */
#define CALL(run, c, expr)                                                                                      \
    do {                                                                                                        \
        int rc_ = (expr);                                                                                       \
        cr_assert_lt((run)->k, MAX_CALLS);                                                                      \
        if ((run)->record) {                                                                                    \
            (run)->codes[(run)->k] = rc_;                                                                       \
        } else if (rc_ != (run)->codes[(run)->k]) {                                                             \
            cr_assert(rc_ == KVS_ERR_NOMEM && af_failed(), "%s returned %d (%s), %d without injection", #expr,   \
                      rc_, kvs_strerror(rc_), (run)->codes[(run)->k]);                                          \
            (run)->n_nomem++;                                                                                   \
            cache_check((c), #expr);                                                                            \
            rc_ = (expr);                                                                                       \
            cr_assert_eq(rc_, (run)->codes[(run)->k], "%s retried: %d", #expr, rc_);                            \
        }                                                                                                       \
        (run)->k++;                                                                                             \
    } while (0)

static void tokens_of(int32_t *t, int32_t n, int32_t salt) {
    for (int32_t i = 0; i < n; i++) t[i] = (i * 7 + salt) % 50;
}

static void prefill(cache_run *run, kvc_cache *c, int32_t seq, const int32_t *tok, int32_t from, int32_t to, bool ok) {
    kvc_entry e[64];
    int32_t slots[64];
    for (int32_t p = from; p < to; p++) e[p - from] = (kvc_entry){seq, p, tok[p]};
    CALL(run, c, kvc_start_forward(c, e, to - from, slots));
    CALL(run, c, kvc_finish_forward(c, ok));
}

static void cache_sequence(const kvc_params *p, cache_run *run) {
    run->k = 0;
    kvc_cache *c = NULL;
    int rc = kvc_create(p, &c);
    if (rc != 0) {
        cr_assert(rc == KVS_ERR_NOMEM && af_failed() && !run->record, "kvc_create: %d", rc);
        cr_assert_null(c);
        run->n_nomem++;
        af_disarm();
        cr_assert_eq(kvc_create(p, &c), 0);
    }
    int32_t ta[40], tb[40];
    tokens_of(ta, 40, 1);
    memcpy(tb, ta, sizeof tb);
    tb[13] = 49; /* b shares a's first 13 tokens */
    int32_t a = -1, b = -1, d = -1, n_cached = 0;
    CALL(run, c, kvc_seq_alloc(c, &a));
    prefill(run, c, a, ta, 0, 10, true);
    prefill(run, c, a, ta, 10, 18, true);
    CALL(run, c, kvc_seq_alloc(c, &b));
    CALL(run, c, kvc_attach_prefix(c, b, tb, 17, &n_cached));
    prefill(run, c, b, tb, n_cached, 22, true);
    CALL(run, c, kvc_seq_alloc(c, &d));
    CALL(run, c, kvc_copy_prefix(c, a, d, 15));        /* full blocks shared, the partial block copied */
    prefill(run, c, d, ta, 15, 17, true);               /* copy-on-write of nothing shared, or of a shared block */
    prefill(run, c, a, ta, 18, 25, false);              /* rolled back */
    prefill(run, c, a, ta, 18, 21, true);
    kvc_shift sh;
    CALL(run, c, kvc_remove(c, d, 9, 12, &sh));          /* context shift where d alone holds the blocks, or not */
    CALL(run, c, kvc_remove(c, b, 6, INT32_MAX, NULL)); /* tail removal into shared blocks */
    prefill(run, c, b, tb, 6, 14, true);
    CALL(run, c, kvc_seq_free(c, d));
    int32_t matched = 0;
    CALL(run, c, kvc_prefix_match(c, ta, 20, &matched));
    for (int i = 0; i < 4; i++) run->lens[i] = 0;
    run->lens[0] = kvc_seq_len(c, a);
    run->lens[1] = kvc_seq_len(c, b);
    CALL(run, c, kvc_seq_alloc(c, &d));
    CALL(run, c, kvc_attach_prefix(c, d, ta, 20, &n_cached));
    prefill(run, c, d, ta, n_cached, 24, true);
    run->lens[2] = kvc_seq_len(c, d);
    CALL(run, c, kvc_seq_free(c, a));
    CALL(run, c, kvc_seq_free(c, b));
    CALL(run, c, kvc_seq_free(c, d));
    CALL(run, c, kvc_reset_prefix_cache(c));
    af_disarm();
    char msg[256];
    cr_assert_eq(kvc_check(c, msg, sizeof msg), 0, "%s", msg);
    kvc_free(c);
    run->n_calls = run->k;
}

static void cache_injection(const kvc_params *p, long *points) {
    cache_run ref;
    memset(&ref, 0, sizeof ref);
    ref.record = true;
    af_arm(0); /* counts, never fails */
    cache_sequence(p, &ref);
    long total = atomic_load(&AF.count);
    cr_assert_gt(total, 5, "only %ld allocations seen: is the test linked with --wrap=malloc?", total);
    long n;
    for (n = 1;; n++) {
        cache_run run;
        memset(&run, 0, sizeof run);
        memcpy(run.codes, ref.codes, sizeof run.codes);
        af_arm(n);
        cache_sequence(p, &run);
        bool hit = af_failed();
        af_disarm();
        if (!hit) break;
        cr_assert_eq(run.n_calls, ref.n_calls);
        cr_assert_arr_eq(run.lens, ref.lens, sizeof ref.lens, "failure at allocation %ld changed the lengths", n);
    }
    cr_assert_geq(n - 1, total, "%ld failure points tried, %ld allocations in the sequence", n - 1, total);
    *points = n - 1;
}

Test(alloc_fail, kv_cache_every_allocation) {
    kvc_params p;
    kvc_params_default(&p);
    p.n_layer = 2;
    p.n_kv_head = 2;
    p.head_dim = 32;
    p.block_size = 4;
    p.n_blocks = 24;
    p.max_seqs = 4;
    p.max_batch_tokens = 32;
    long a = 0, b = 0;
    cache_injection(&p, &a);
    p.dtype = KVC_DTYPE_Q8_0;
    p.sliding_window = 8;
    cache_injection(&p, &b);
    cr_log_info("kv cache: %ld and %ld allocation points failed one at a time", a, b);
}

/* ---- the engine's start-up ----------------------------------------------------------------------------------- */
typedef struct eng_run {
    float *logits[2];  /* the last entry's logits of each decode (copies, malloc'd outside injection) */
    int32_t n_vocab;
    int n_nomem;
} eng_run;

/* Returns 0 when the whole sequence ran (possibly after retrying a failed decode), or the code of the start-up
 * step that failed (then everything is freed). */
static int engine_sequence(const char *path, eng_run *run, bool reference) {
    eng_load_params lp;
    eng_load_params_default(&lp);
    eng_model *m = NULL;
    char err[256] = "";
    int rc = eng_model_load(path, &lp, &m, err, sizeof err);
    if (rc != 0) {
        af_disarm();
        cr_assert(!reference && rc < 0 && af_failed(), "load: %d %s", rc, err);
        cr_assert_null(m);
        cr_assert(err[0], "load failed (%d) without a message", rc);
        return rc;
    }
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_threads = 2;
    cp.max_seqs = 2;
    cp.n_ctx = 64;
    cp.kv_blocks = 8;
    cp.max_batch_tokens = 32;
    cp.device = ENG_DEVICE_CPU;
    eng_ctx *ctx = NULL;
    err[0] = 0;
    rc = eng_ctx_create(m, &cp, &ctx, err, sizeof err);
    if (rc != 0) {
        af_disarm();
        cr_assert(!reference && rc < 0 && af_failed(), "ctx: %d %s", rc, err);
        cr_assert_null(ctx);
        cr_assert(err[0], "context creation failed (%d) without a message", rc);
        eng_model_free(m);
        return rc;
    }
    int32_t tok[33], n = 0;
    rc = eng_tokenize(m, "Once upon a time, there was", 27, true, false, tok, 32, &n);
    if (rc != 0) {
        af_disarm();
        cr_assert(!reference && rc == KVS_ERR_NOMEM && af_failed(), "tokenize: %d", rc);
        eng_ctx_free(ctx);
        eng_model_free(m);
        return rc;
    }
    int32_t seq = -1;
    kvc_cache *kc = eng_ctx_cache(ctx);
    rc = kvc_seq_alloc(kc, &seq);
    cr_assert_eq(rc, 0);
    run->n_vocab = eng_model_hparams(m)->n_vocab;
    int32_t pos[33], sq[33];
    bool want[33];
    for (int32_t i = 0; i < n + 1; i++) { pos[i] = i; sq[i] = seq; want[i] = false; }
    for (int step = 0; step < 2; step++) {
        int32_t from = step == 0 ? 0 : n, cnt = step == 0 ? n : 1;
        if (step == 1) tok[n] = 42; /* a decode step after the prompt */
        want[from + cnt - 1] = true;
        eng_batch bt = {.n = cnt, .token = tok + from, .pos = pos + from, .seq = sq + from, .want_logits = want + from};
        rc = eng_decode(ctx, &bt);
        if (rc != 0) {
            cr_assert(!reference && rc == KVS_ERR_NOMEM && af_failed(), "decode %d: %d (%s)", step, rc,
                      kvs_strerror(rc));
            run->n_nomem++;
            af_disarm();
            cr_assert_eq(kvc_seq_len(kc, seq), from, "a failed decode changed the cache");
            char msg[256];
            cr_assert_eq(kvc_check(kc, msg, sizeof msg), 0, "%s", msg);
            rc = eng_decode(ctx, &bt);
            cr_assert_eq(rc, 0, "decode %d retried: %d", step, rc);
        }
        bool armed = atomic_load(&AF.armed);
        af_disarm();
        const float *lg = eng_get_logits(ctx, cnt - 1);
        cr_assert_not_null(lg);
        if (reference) {
            run->logits[step] = malloc((size_t)run->n_vocab * sizeof(float));
            cr_assert_not_null(run->logits[step]);
            memcpy(run->logits[step], lg, (size_t)run->n_vocab * sizeof(float));
        } else {
            cr_assert(!memcmp(run->logits[step], lg, (size_t)run->n_vocab * sizeof(float)),
                      "decode %d: logits differ from the run without injection", step);
        }
        if (armed) atomic_store(&AF.armed, true);
    }
    af_disarm();
    eng_ctx_free(ctx);
    eng_model_free(m);
    return 0;
}

Test(alloc_fail, engine_startup_every_allocation, .timeout = 600) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", kvt_shared_dir());
    FILE *f = fopen(path, "rb");
    if (!f) cr_skip_test("%s not found (../shared absent): the engine start-up injection needs stories260K", path);
    fclose(f);
    eng_run ref;
    memset(&ref, 0, sizeof ref);
    af_arm(0);
    cr_assert_eq(engine_sequence(path, &ref, true), 0);
    long total = atomic_load(&AF.count);
    af_disarm();
    cr_assert_gt(total, 5, "only %ld allocations seen: is the test linked with --wrap=malloc?", total);
    long n, fails[3] = {0, 0, 0};
    for (n = 1;; n++) {
        eng_run run = ref;
        run.n_nomem = 0;
        af_arm(n);
        int rc = engine_sequence(path, &run, false);
        bool hit = af_failed();
        af_disarm();
        if (!hit) break;
        fails[rc == 0 ? 0 : rc == KVS_ERR_NOMEM ? 1 : 2]++;
    }
    cr_log_info("engine start-up: %ld allocation points failed one at a time (%ld ran on, %ld NOMEM, %ld other "
                "codes)", n - 1, fails[0], fails[1], fails[2]);
    free(ref.logits[0]);
    free(ref.logits[1]);
}
