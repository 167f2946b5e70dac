/* The CUDA engine on a real GPU: dequantization bit-identical to the CPU engine's, and logits of the GPU
 * engine within 1e-2 (relative to the largest |logit|) of the CPU engine's on the shared models (one batch of
 * 8 prompts, then decode steps), and on random-weight models through scripted batches. Skips with a message
 * when this build has no CUDA, no GPU is present, or ../shared is absent. Device selection runs everywhere. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda/cuda_engine.h"
#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "engine/kernels/quant.h"
#include "helper_shared.h"

static void need_gpu_and_shared(char *path, size_t len, const char *model) {
    char name[128], why[256];
    if (cud_available_why(name, sizeof name, why, sizeof why) < 1)
        cr_skip_test("no CUDA device (%s): GPU tests skipped", why);
    snprintf(path, len, "%s/models/%s", kvt_shared_dir(), model);
    struct stat st;
    if (stat(path, &st) != 0) cr_skip_test("%s not found: ../shared is absent, GPU model tests skipped", path);
}

static void check_dequant(const char *model) {
    char path[1024], err[512];
    need_gpu_and_shared(path, sizeof path, model);
    eng_gguf *g = NULL;
    cr_assert_eq(eng_gguf_open(path, &g, err, sizeof err), ENG_OK, "%s", err);
    int checked = 0;
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        int64_t k = t->ne[0], rows = t->nbytes / eng_qtype_row_bytes(t->type, k);
        float *cpu = malloc(sizeof(float) * (size_t)(k * rows)), *gpu = malloc(sizeof(float) * (size_t)(k * rows));
        cr_assert(cpu && gpu);
        size_t rb = eng_qtype_row_bytes(t->type, k);
        for (int64_t r = 0; r < rows; r++)
            cr_assert_eq(eng_dequantize_row(t->type, (const char *)t->data + r * rb, cpu + r * k, k), ENG_OK);
        int rc = cud_dequantize_host(t->type, t->data, t->nbytes, rows, k, gpu);
        cr_assert_eq(rc, ENG_OK, "%s: tensor %.*s type %u", model, (int)t->name.len, t->name.ptr, t->type);
        cr_assert_eq(memcmp(cpu, gpu, sizeof(float) * (size_t)(k * rows)), 0, "%s: tensor %.*s differs", model,
                     (int)t->name.len, t->name.ptr);
        free(cpu);
        free(gpu);
        checked++;
    }
    cr_log_info("%s: %d tensors dequantized identically on GPU and CPU", model, checked);
    eng_gguf_close(g);
}

Test(cuda_engine, dequant_f16) { check_dequant("synthetic/syn-llama-f16.gguf"); }
Test(cuda_engine, dequant_q8_0) { check_dequant("synthetic/syn-llama-q8_0.gguf"); }
Test(cuda_engine, dequant_q4_0) { check_dequant("synthetic/syn-llama-q4_0.gguf"); }
Test(cuda_engine, dequant_q4_k_m) { check_dequant("synthetic/syn-llama-q4_k_m.gguf"); }
Test(cuda_engine, dequant_q6_k) { check_dequant("synthetic/syn-llama-q6_k.gguf"); }

/* Runs 8 prompts as one batch on a device, then `steps` greedy decode steps; writes every logits row. */
static void run_device(eng_model *m, eng_device dev, const int32_t *const *prompts, const int32_t *lens, int n,
                       int steps, float *out /* [n * (steps + 1)][n_vocab] */) {
    char err[512];
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.device = dev;
    cp.max_seqs = n;
    cp.max_batch_tokens = 512;
    cp.n_ctx = 256;
    cp.kv_dtype = KVC_DTYPE_F32;
    eng_ctx *c = NULL;
    cr_assert_eq(eng_ctx_create(m, &cp, &c, err, sizeof err), ENG_OK, "%s", err);
    cr_assert_eq(eng_ctx_device(c), dev);
    const int32_t nv = eng_model_hparams(m)->n_vocab;
    int32_t seq[8];
    for (int i = 0; i < n; i++) cr_assert_eq(kvc_seq_alloc(eng_ctx_cache(c), &seq[i]), KVC_OK);
    int32_t tok[512], pos[512], sq[512], last[8], cur[8];
    bool want[512];
    int32_t nt = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < lens[i]; j++) {
            tok[nt] = prompts[i][j]; pos[nt] = j; sq[nt] = seq[i]; want[nt] = j == lens[i] - 1;
            if (want[nt]) last[i] = nt;
            nt++;
        }
    eng_batch b = {.n = nt, .token = tok, .pos = pos, .seq = sq, .want_logits = want};
    cr_assert_eq(eng_decode(c, &b), ENG_OK);
    for (int step = 0; step <= steps; step++) {
        for (int i = 0; i < n; i++) {
            const float *l = eng_get_logits(c, step == 0 ? last[i] : i);
            cr_assert_not_null(l);
            memcpy(out + ((size_t)step * n + i) * nv, l, sizeof(float) * nv);
            int32_t best = 0;
            for (int32_t v = 1; v < nv; v++) if (l[v] > l[best]) best = v;
            cur[i] = best;
        }
        if (step == steps) break;
        for (int i = 0; i < n; i++) {
            tok[i] = cur[i]; pos[i] = lens[i] + step; sq[i] = seq[i]; want[i] = true;
        }
        eng_batch d = {.n = n, .token = tok, .pos = pos, .seq = sq, .want_logits = want};
        cr_assert_eq(eng_decode(c, &d), ENG_OK);
    }
    eng_ctx_free(c);
}

static void check_logits(const char *model, float tol) {
    char path[1024], err[512];
    need_gpu_and_shared(path, sizeof path, model);
    eng_load_params lp;
    eng_load_params_default(&lp);
    eng_model *m = NULL;
    cr_assert_eq(eng_model_load(path, &lp, &m, err, sizeof err), ENG_OK, "%s", err);
    static const char *texts[8] = {"Once upon a time", "The little dog", "Lily wanted to", "One day, a big",
                                   "Tom and Sue went to the", "The sun was", "She saw a bird", "In the park"};
    int32_t *prompts[8], lens[8];
    for (int i = 0; i < 8; i++) {
        prompts[i] = malloc(sizeof(int32_t) * 64);
        cr_assert_eq(eng_tokenize(m, texts[i], strlen(texts[i]), true, true, prompts[i], 64, &lens[i]), ENG_OK);
    }
    const int steps = 8, nv = eng_model_hparams(m)->n_vocab;
    size_t sz = sizeof(float) * (size_t)8 * (steps + 1) * (size_t)nv;
    float *cpu = malloc(sz), *gpu = malloc(sz);
    cr_assert(cpu && gpu);
    run_device(m, ENG_DEVICE_CPU, (const int32_t *const *)prompts, lens, 8, steps, cpu);
    run_device(m, ENG_DEVICE_CUDA, (const int32_t *const *)prompts, lens, 8, steps, gpu);
    /* relative to the largest |logit| (at least 1): the GPU reads quantized and f16 weights with f16-rounded
     * activations, the CPU with f32 or Q8 ones */
    double maxd = 0, scale = 1;
    for (size_t i = 0; i < sz / sizeof(float); i++) {
        double d = fabs((double)cpu[i] - (double)gpu[i]);
        if (d > maxd || d != d) maxd = d;
        if (fabs((double)cpu[i]) > scale) scale = fabs((double)cpu[i]);
    }
    cr_log_info("%s: max |GPU - CPU| logit difference %.3g over %d rows (largest |logit| %.3g)", model, maxd,
                8 * (steps + 1), scale);
    cr_assert_leq(maxd, tol * scale, "%s: GPU logits differ from CPU by %g (scale %g)", model, maxd, scale);
    for (int i = 0; i < 8; i++) free(prompts[i]);
    free(cpu);
    free(gpu);
    eng_model_free(m);
}

Test(cuda_engine, logits_f16_match_cpu, .timeout = 600) { check_logits("synthetic/syn-llama-f16.gguf", 1e-2f); }
Test(cuda_engine, logits_stories_match_cpu, .timeout = 600) { check_logits("stories260K.gguf", 1e-2f); }

/* ---- device selection (runs on every machine) and GPU-vs-CPU differential scripts ----------------------- */

/* The kvserve executable: $KVSERVE_BIN when set, else `kvserve` next to this test binary (where the build puts
 * it, and where a copied kit keeps it), else the build folder this test was compiled in. */
static void kvserve_path(char *out, size_t len) {
    const char *env = getenv("KVSERVE_BIN");
    if (env && env[0]) {
        snprintf(out, len, "%s", env);
        return;
    }
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            int w = snprintf(out, len, "%s/kvserve", self);
            if (w > 0 && (size_t)w < len && access(out, X_OK) == 0) return;
        }
    }
    snprintf(out, len, "%s", KVSERVE_BINARY);
}

/* Writes a random-weight model with `kvserve mkmodel ARGS` into a fresh temporary directory; *dir receives
 * the directory (removed by rm_model). */
static void mk_model(const char *args, char *path, size_t len, char *dir, size_t dir_len) {
    snprintf(dir, dir_len, "/tmp/kvs-cudaeng-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, len, "%s/m.gguf", dir);
    char cmd[4096], bin[1100];
    kvserve_path(bin, sizeof bin);
    snprintf(cmd, sizeof cmd, "'%s' mkmodel -o '%s' %s >/dev/null", bin, path, args);
    cr_assert_eq(system(cmd), 0, "%s failed", cmd);
}

static void rm_model(const char *path, const char *dir) {
    remove(path);
    rmdir(dir);
}

static eng_model *load(const char *path) {
    char err[512];
    eng_model *m = NULL;
    cr_assert_eq(eng_model_load(path, NULL, &m, err, sizeof err), ENG_OK, "%s", err);
    return m;
}

/* One decode of a single token, which must give logits. */
static void smoke_decode(eng_ctx *c) {
    int32_t seq;
    cr_assert_eq(kvc_seq_alloc(eng_ctx_cache(c), &seq), KVC_OK);
    int32_t tok = 1, pos = 0;
    bool want = true;
    eng_batch b = {1, &tok, &pos, &seq, &want, NULL};
    cr_assert_eq(eng_decode(c, &b), ENG_OK);
    cr_assert_not_null(eng_get_logits(c, 0));
    cr_assert_eq(kvc_seq_free(eng_ctx_cache(c), seq), KVC_OK);
}

Test(cuda_engine, device_selection) {
    char path[1024], dir[256], err[512];
    mk_model("--preset tiny", path, sizeof path, dir, sizeof dir);
    eng_model *m = load(path);
    char gpu[256];
    const int32_t n_gpu = cud_available(gpu, sizeof gpu);
    cr_log_info("CUDA devices: %d%s%s", n_gpu, n_gpu ? ", first: " : "", gpu);
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_ctx = 64;
    cp.n_threads = 1;
    eng_ctx *c = NULL;

    /* CUDA: an error with a clear message without a device; a CUDA context with one */
    cp.device = ENG_DEVICE_CUDA;
    int rc = eng_ctx_create(m, &cp, &c, err, sizeof err);
    if (n_gpu == 0) {
        cr_expect(rc == ENG_ERR_DEVICE || rc == ENG_ERR_UNSUPPORTED, "rc %d (%s)", rc, err);
        cr_expect_null(c);
        cr_expect(strstr(err, "no CUDA device found") || strstr(err, "built without CUDA"), "message: %s", err);
#ifdef KVSERVE_HAVE_CUDA
        cr_expect_eq(rc, ENG_ERR_DEVICE);
#else
        cr_expect_eq(rc, ENG_ERR_UNSUPPORTED);
#endif
    } else {
        cr_assert_eq(rc, ENG_OK, "%s", err);
        cr_expect_eq(eng_ctx_device(c), ENG_DEVICE_CUDA);
        smoke_decode(c);
        eng_ctx_free(c);
        c = NULL;
    }

    /* AUTO: the GPU when there is one, else the CPU, silently */
    cp.device = ENG_DEVICE_AUTO;
    err[0] = 'x';
    cr_assert_eq(eng_ctx_create(m, &cp, &c, err, sizeof err), ENG_OK, "%s", err);
    cr_expect_eq(err[0], '\0');
    cr_expect_eq(eng_ctx_device(c), n_gpu ? ENG_DEVICE_CUDA : ENG_DEVICE_CPU);
    smoke_decode(c);
    eng_ctx_free(c);
    c = NULL;

    /* CPU is always the CPU */
    cp.device = ENG_DEVICE_CPU;
    cr_assert_eq(eng_ctx_create(m, &cp, &c, err, sizeof err), ENG_OK, "%s", err);
    cr_expect_eq(eng_ctx_device(c), ENG_DEVICE_CPU);
    eng_ctx_free(c);
    c = NULL;

    /* an out-of-range device is rejected */
    cp.device = (eng_device)7;
    cr_expect_eq(eng_ctx_create(m, &cp, &c, err, sizeof err), ENG_ERR_INVALID);
    cr_expect_null(c);

    /* the GPU KV cache holds f16 or f32 only; AUTO with q8_0 errs on a GPU machine and runs on the CPU
     * elsewhere */
    cp.device = ENG_DEVICE_CUDA;
    cp.kv_dtype = KVC_DTYPE_Q8_0;
    rc = eng_ctx_create(m, &cp, &c, err, sizeof err);
    cr_expect_neq(rc, ENG_OK);
    cr_expect_null(c);
    if (n_gpu > 0) {
        cr_expect_eq(rc, ENG_ERR_UNSUPPORTED);
        cr_expect(strstr(err, "supports f16 and f32") != NULL, "message: %s", err);
        cp.kv_dtype = KVC_DTYPE_F16;
        cp.gpu_memory_fraction = 1.5f;
        cr_expect_eq(eng_ctx_create(m, &cp, &c, err, sizeof err), ENG_ERR_INVALID);
        cr_expect_null(c);
    }
    eng_model_free(m);
    rm_model(path, dir);
}

/* A deterministic script of batches run on a context: interleaved chunked prefill of several sequences
 * (the first chunk wants no logits), decode steps over shrinking sets of sequences (CUDA graph buckets with
 * padding rows), a context shift (removal from the middle) and decoding after it, and a sequence freed and
 * reused. Tokens come from a seeded generator, not from sampling, so both devices see the same inputs.
 * Every logits row is appended to out (up to cap floats); returns the number of floats written. */
static size_t run_script(eng_model *m, eng_device dev, kvc_dtype kv, uint64_t seed, float *out, size_t cap) {
    char err[512];
    const int32_t nv = eng_model_hparams(m)->n_vocab;
    enum { NS = 5, MAXT = 256 };
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.device = dev;
    cp.n_threads = 2;
    cp.n_ctx = 128;
    cp.max_seqs = NS;
    cp.max_batch_tokens = MAXT;
    cp.kv_block_size = 8;
    cp.kv_dtype = kv;
    eng_ctx *c = NULL;
    cr_assert_eq(eng_ctx_create(m, &cp, &c, err, sizeof err), ENG_OK, "%s", err);
    cr_assert_eq(eng_ctx_device(c), dev);
    kvc_cache *kc = eng_ctx_cache(c);
    uint64_t st = seed * 2654435761u + 1;
#define RNG() (st = st * 6364136223846793005ull + 1442695040888963407ull, (uint32_t)(st >> 33))
    int32_t seq[NS], len[NS], plen[NS];
    for (int s = 0; s < NS; s++) {
        cr_assert_eq(kvc_seq_alloc(kc, &seq[s]), KVC_OK);
        len[s] = 0;
        plen[s] = 9 + (int32_t)(RNG() % 40);
    }
    int32_t tok[MAXT], pos[MAXT], sq[MAXT];
    bool want[MAXT];
    size_t n_out = 0;
#define RUN(n_)                                                                                                \
    do {                                                                                                       \
        eng_batch b_ = {(n_), tok, pos, sq, want, NULL};                                                             \
        cr_assert_eq(eng_decode(c, &b_), ENG_OK, "seed %llu", (unsigned long long)seed);                       \
        for (int32_t i_ = 0; i_ < (n_); i_++) {                                                                \
            if (!want[i_]) continue;                                                                           \
            const float *l_ = eng_get_logits(c, i_);                                                           \
            cr_assert_not_null(l_);                                                                            \
            cr_assert_leq(n_out + (size_t)nv, cap);                                                            \
            memcpy(out + n_out, l_, sizeof(float) * (size_t)nv);                                               \
            n_out += (size_t)nv;                                                                               \
        }                                                                                                      \
    } while (0)
    /* prefill in two interleaved chunks: first halves without logits, then the rest */
    for (int chunk = 0; chunk < 2; chunk++) {
        int32_t n = 0;
        for (int32_t t = 0; t < 48; t++)
            for (int s = 0; s < NS; s++) {
                int32_t end = chunk == 0 ? plen[s] / 2 : plen[s];
                if (len[s] >= end) continue;
                tok[n] = (int32_t)(RNG() % (uint32_t)nv);
                pos[n] = len[s]++;
                sq[n] = seq[s];
                want[n] = chunk == 1 && len[s] == plen[s];
                n++;
            }
        /* rows of one sequence must be consecutive positions in order: they are, since t increases */
        RUN(n);
    }
    /* decode: all sequences, then 3 (graph bucket 4 with a padding row), then 1 */
    const int widths[3] = {NS, 3, 1}, steps[3] = {4, 3, 2};
    for (int w = 0; w < 3; w++)
        for (int k = 0; k < steps[w]; k++) {
            for (int s = 0; s < widths[w]; s++) {
                tok[s] = (int32_t)(RNG() % (uint32_t)nv);
                pos[s] = len[s]++;
                sq[s] = seq[s];
                want[s] = true;
            }
            RUN(widths[w]);
        }
    /* context shift on sequence 0: drop [3, 11), later keys move down and are re-rotated */
    cr_assert_eq(eng_seq_remove(c, seq[0], 3, 11), ENG_OK);
    len[0] -= 8;
    for (int k = 0; k < 3; k++) {
        tok[0] = (int32_t)(RNG() % (uint32_t)nv);
        pos[0] = len[0]++;
        sq[0] = seq[0];
        want[0] = true;
        tok[1] = (int32_t)(RNG() % (uint32_t)nv);
        pos[1] = len[1]++;
        sq[1] = seq[1];
        want[1] = true;
        RUN(2);
    }
    /* tail removal and a freed, reused sequence */
    cr_assert_eq(eng_seq_remove(c, seq[2], len[2] - 4, INT32_MAX), ENG_OK);
    len[2] -= 4;
    cr_assert_eq(kvc_seq_free(kc, seq[3]), KVC_OK);
    cr_assert_eq(kvc_seq_alloc(kc, &seq[3]), KVC_OK);
    len[3] = 0;
    int32_t n = 0;
    for (int32_t t = 0; t < 20; t++) {
        tok[n] = (int32_t)(RNG() % (uint32_t)nv);
        pos[n] = len[3]++;
        sq[n] = seq[3];
        want[n] = t % 7 == 6;
        n++;
    }
    tok[n] = (int32_t)(RNG() % (uint32_t)nv);
    pos[n] = len[2]++;
    sq[n] = seq[2];
    want[n] = true;
    n++;
    RUN(n);
#undef RUN
#undef RNG
    eng_ctx_free(c);
    return n_out;
}

/* Runs the script on the CPU and on the GPU; logits must agree within tol relative to the largest |logit|. */
static void check_script(const char *mk_args, kvc_dtype kv, double tol) {
    char gpu[256], why[256];
    if (cud_available_why(gpu, sizeof gpu, why, sizeof why) < 1)
        cr_skip_test("no CUDA device (%s): GPU tests skipped", why);
    char path[1024], dir[256];
    mk_model(mk_args, path, sizeof path, dir, sizeof dir);
    eng_model *m = load(path);
    const size_t cap = (size_t)400 * (size_t)eng_model_hparams(m)->n_vocab;
    float *cpu = malloc(cap * sizeof(float)), *dev = malloc(cap * sizeof(float));
    cr_assert(cpu && dev);
    for (uint64_t seed = 1; seed <= 3; seed++) {
        size_t n1 = run_script(m, ENG_DEVICE_CPU, kv, seed, cpu, cap);
        size_t n2 = run_script(m, ENG_DEVICE_CUDA, kv, seed, dev, cap);
        cr_assert_eq(n1, n2);
        double maxd = 0, scale = 1;
        for (size_t i = 0; i < n1; i++) {
            double d = fabs((double)cpu[i] - (double)dev[i]);
            if (d > maxd || d != d) maxd = d;
            if (fabs((double)cpu[i]) > scale) scale = fabs((double)cpu[i]);
        }
        cr_log_info("mkmodel %s on %s: seed %llu: %zu logits rows, max |GPU - CPU| %.3g (largest |logit| %.3g)",
                    mk_args, gpu, (unsigned long long)seed, n1 / (size_t)eng_model_hparams(m)->n_vocab, maxd, scale);
        cr_assert(maxd <= tol * scale, "mkmodel %s: seed %llu: GPU logits differ from CPU by %g (scale %g)", mk_args,
                  (unsigned long long)seed, maxd, scale);
    }
    free(cpu);
    free(dev);
    eng_model_free(m);
    rm_model(path, dir);
}

/* The scripts themselves, on the CPU twice (every machine): they must run and be deterministic, so that a
 * GPU difference is the GPU's. */
static const char *const script_models[] = {
    "--preset tiny",
    "--preset tiny --arch qwen2 --type f16 --heads 8 --kv-heads 2 --head-dim 16",
    "--preset tiny --type q8_0 --embd 128 --heads 4 --kv-heads 1 --ff 256 --untied",
    "--preset tiny --rope-base 500000 --tied --layers 3",
};
Test(cuda_engine, scripts_on_cpu, .timeout = 300) {
    for (size_t k = 0; k < sizeof script_models / sizeof script_models[0]; k++) {
        char path[1024], dir[256];
        mk_model(script_models[k], path, sizeof path, dir, sizeof dir);
        eng_model *m = load(path);
        const size_t cap = (size_t)400 * (size_t)eng_model_hparams(m)->n_vocab;
        float *a = malloc(cap * sizeof(float)), *b = malloc(cap * sizeof(float));
        cr_assert(a && b);
        size_t n1 = run_script(m, ENG_DEVICE_CPU, KVC_DTYPE_F16, 7, a, cap);
        size_t n2 = run_script(m, ENG_DEVICE_CPU, KVC_DTYPE_F16, 7, b, cap);
        cr_assert_eq(n1, n2);
        cr_assert_gt(n1, 0);
        cr_expect_eq(memcmp(a, b, n1 * sizeof(float)), 0, "mkmodel %s: the CPU script is not deterministic",
                     script_models[k]);
        free(a);
        free(b);
        eng_model_free(m);
        rm_model(path, dir);
    }
}

Test(cuda_engine, script_llama_f32, .timeout = 300) { check_script(script_models[0], KVC_DTYPE_F32, 1e-3); }
Test(cuda_engine, script_llama_f32_kv_f16, .timeout = 300) { check_script(script_models[0], KVC_DTYPE_F16, 1e-3); }
Test(cuda_engine, script_qwen2_f16_gqa, .timeout = 300) { check_script(script_models[1], KVC_DTYPE_F16, 1e-2); }
Test(cuda_engine, script_llama_q8_0_untied, .timeout = 300) { check_script(script_models[2], KVC_DTYPE_F16, 5e-2); }
Test(cuda_engine, script_rope_base_tied, .timeout = 300) { check_script(script_models[3], KVC_DTYPE_F32, 1e-3); }

/* ---- long contexts: the split-KV decode attention ------------------------------------------------------ */

/* Three sequences of 150, 1000 and 5000 positions (1, 8 and 32 attention splits: past 4096 positions the
 * splits lengthen), prefilled one at a time in chunks, then 4 decode steps: all three together in one batch
 * (together), or each sequence alone, one after the other. The tokens are the same either way; the logits
 * of every (sequence, step) are written in that order to out [3 * 4][n_vocab]. */
static void run_long(eng_model *m, eng_device dev, bool together, float *out) {
    char err[512];
    const int32_t nv = eng_model_hparams(m)->n_vocab;
    enum { NS = 3, STEPS = 4, CHUNK = 512 };
    const int32_t plen[NS] = {150, 1000, 5000};
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.device = dev;
    cp.n_threads = 2;
    cp.n_ctx = 8192;
    cp.max_seqs = NS;
    cp.max_batch_tokens = CHUNK;
    cp.kv_block_size = 16;
    cp.kv_dtype = KVC_DTYPE_F16;
    eng_ctx *c = NULL;
    cr_assert_eq(eng_ctx_create(m, &cp, &c, err, sizeof err), ENG_OK, "%s", err);
    kvc_cache *kc = eng_ctx_cache(c);
    int32_t seq[NS], tok[CHUNK], pos[CHUNK], sq[CHUNK];
    bool want[CHUNK];
    for (int s = 0; s < NS; s++) {
        cr_assert_eq(kvc_seq_alloc(kc, &seq[s]), KVC_OK);
        for (int32_t p0 = 0; p0 < plen[s]; p0 += CHUNK) {
            int32_t n = 0;
            for (int32_t p = p0; p < plen[s] && n < CHUNK; p++, n++) {
                tok[n] = (int32_t)((p * 7919u + (uint32_t)s * 104729u) % (uint32_t)nv);
                pos[n] = p;
                sq[n] = seq[s];
                want[n] = false;
            }
            eng_batch b = {n, tok, pos, sq, want, NULL};
            cr_assert_eq(eng_decode(c, &b), ENG_OK);
        }
    }
    for (int pass = 0; pass < (together ? 1 : NS); pass++)
        for (int step = 0; step < STEPS; step++) {
            int32_t n = 0;
            for (int s = 0; s < NS; s++) {
                if (!together && s != pass) continue;
                tok[n] = (int32_t)(((uint32_t)step * 31u + (uint32_t)s * 17u + 5u) % (uint32_t)nv);
                pos[n] = plen[s] + step;
                sq[n] = seq[s];
                want[n] = true;
                n++;
            }
            eng_batch b = {n, tok, pos, sq, want, NULL};
            cr_assert_eq(eng_decode(c, &b), ENG_OK);
            for (int32_t i = 0, s = together ? 0 : pass; i < n; i++, s++)
                memcpy(out + ((size_t)s * STEPS + (size_t)step) * (size_t)nv, eng_get_logits(c, i),
                       sizeof(float) * (size_t)nv);
        }
    eng_ctx_free(c);
}

Test(cuda_engine, long_context_decode, .timeout = 600) {
    char gpu[256], why[256];
    if (cud_available_why(gpu, sizeof gpu, why, sizeof why) < 1)
        cr_skip_test("no CUDA device (%s): GPU tests skipped", why);
    char path[1024], dir[256];
    mk_model("--preset tiny --ctx 8192 --embd 256 --heads 8 --kv-heads 2 --head-dim 64", path, sizeof path, dir,
             sizeof dir);
    eng_model *m = load(path);
    const size_t n = (size_t)3 * 4 * (size_t)eng_model_hparams(m)->n_vocab;
    float *cpu = malloc(n * sizeof(float)), *dev = malloc(n * sizeof(float)), *alone = malloc(n * sizeof(float));
    cr_assert(cpu && dev && alone);
    run_long(m, ENG_DEVICE_CPU, true, cpu);
    run_long(m, ENG_DEVICE_CUDA, true, dev);
    run_long(m, ENG_DEVICE_CUDA, false, alone);
    double maxd = 0, scale = 1;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)cpu[i] - (double)dev[i]);
        if (d > maxd || d != d) maxd = d;
        if (fabs((double)cpu[i]) > scale) scale = fabs((double)cpu[i]);
    }
    cr_log_info("long contexts on %s: max |GPU - CPU| %.3g (largest |logit| %.3g)", gpu, maxd, scale);
    cr_assert(maxd <= 2e-3 * scale, "long contexts: GPU logits differ from CPU by %g (scale %g)", maxd, scale);
    /* a token's numbers do not depend on the batch it ran in (the split-KV attention's splits come from the
     * sequence's own length; the decode products are per row) */
    const char *attn = getenv("KVSERVE_CUDA_ATTN");
    if (attn && strcmp(attn, "old") == 0)
        cr_log_info("KVSERVE_CUDA_ATTN=old: batch invariance not checked (the old kernel splits by batch)");
    else
        cr_assert_eq(memcmp(dev, alone, n * sizeof(float)), 0,
                     "long contexts: a sequence's logits differ alone and in a batch on the GPU");
    free(cpu);
    free(dev);
    free(alone);
    eng_model_free(m);
    rm_model(path, dir);
}
