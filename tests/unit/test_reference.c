/*
 * test_reference.c: the engine against llama.cpp's greedy completions in ../shared/reference/, by the rule of
 * ../shared/reference/README.md (accepted divergence only below a margin, mean/max logprob deltas, share of
 * steps compared, EOS at the reference's EOS step), run both one prompt at a time and as one multi-sequence
 * batch, which must agree (batch invariance). Also stories260K's 60-token greedy sequence from BOS, and a phi3
 * model with LongRoPE factors, a llama model with YaRN and qwen3moe models (f32, q8_0, Q4_K_M) made by `kvserve
 * mkmodel` (and `kvserve quantize`) against llama.cpp's completions committed in tests/reference/
 * (scripts/ref-mkmodel.py; no shared material needed).
 * Skips with a message when the shared directory is absent. The device is KVSERVE_TEST_DEVICE ("cpu", the
 * default, or "cuda": ctest's test_reference_cuda; skips when no CUDA device is present).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"

#include "cuda/cuda_engine.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "helper_shared.h"

#define MAX_CASES 16
#define MAX_STEPS 64
#define MAX_PROMPT 1024

/* The device the tests run on (KVSERVE_TEST_DEVICE); skips the test when cuda is asked for but absent. */
static eng_device test_device(void) {
    const char *d = getenv("KVSERVE_TEST_DEVICE");
    if (!d || !*d || !strcmp(d, "cpu")) return ENG_DEVICE_CPU;
    cr_assert(!strcmp(d, "cuda"), "KVSERVE_TEST_DEVICE must be cpu or cuda (got '%s')", d);
    char why[256];
    if (cud_available_why(NULL, 0, why, sizeof why) < 1)
        cr_skip_test("KVSERVE_TEST_DEVICE=cuda but no CUDA device (%s)", why);
    return ENG_DEVICE_CUDA;
}

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

typedef struct ref_step { int32_t token; double logprob, margin; } ref_step;
typedef struct ref_case {
    const char *prompt;
    int32_t prompt_tokens[MAX_PROMPT];
    int32_t n_prompt;
    ref_step steps[MAX_STEPS];
    int32_t n_steps;
} ref_case;

/* What one engine run produced for a case. */
typedef struct run_case {
    int32_t tokens[MAX_STEPS];
    double logprob[MAX_STEPS];    /* of the chosen token */
    double ref_lp[MAX_STEPS];     /* of the reference token at that step */
    double margin[MAX_STEPS];     /* engine's top-1 minus top-2 logprob */
    int32_t n;
} run_case;

static int parse_ref(cJSON *root, ref_case *cases) {
    cJSON *arr = cJSON_GetObjectItem(root, "cases");
    cr_assert(cJSON_IsArray(arr));
    int n = 0;
    cJSON *c;
    cJSON_ArrayForEach(c, arr) {
        cr_assert(n < MAX_CASES);
        ref_case *rc = &cases[n++];
        rc->prompt = cJSON_GetObjectItem(c, "prompt")->valuestring;
        rc->n_prompt = 0;
        cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(c, "prompt_tokens")) {
            cr_assert(rc->n_prompt < MAX_PROMPT);
            rc->prompt_tokens[rc->n_prompt++] = (int32_t)t->valuedouble;
        }
        rc->n_steps = 0;
        cJSON *s;
        cJSON_ArrayForEach(s, cJSON_GetObjectItem(c, "steps")) {
            cr_assert(rc->n_steps < MAX_STEPS);
            ref_step *st = &rc->steps[rc->n_steps++];
            st->token = (int32_t)cJSON_GetObjectItem(s, "token")->valuedouble;
            st->logprob = cJSON_GetObjectItem(s, "logprob")->valuedouble;
            cJSON *top = cJSON_GetObjectItem(s, "top");
            st->margin = cJSON_GetArrayItem(cJSON_GetArrayItem(top, 0), 1)->valuedouble -
                         cJSON_GetArrayItem(cJSON_GetArrayItem(top, 1), 1)->valuedouble;
        }
    }
    return n;
}

/* Log-softmax facts of one logits row: argmax, margin, and the logprob of `tok`. */
static void logits_info(const float *lg, int32_t n_vocab, int32_t tok, int32_t *best, double *margin, double *lp_tok,
                        double *lp_best) {
    int32_t b1 = 0, b2 = -1;
    for (int32_t i = 1; i < n_vocab; i++) {
        if (lg[i] > lg[b1]) {
            b2 = b1;
            b1 = i;
        } else if (b2 < 0 || lg[i] > lg[b2]) {
            b2 = i;
        }
    }
    double mx = lg[b1], sum = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) sum += exp((double)lg[i] - mx);
    double lse = mx + log(sum);
    *best = b1;
    *margin = (double)lg[b1] - (double)lg[b2];
    *lp_tok = (double)lg[tok] - lse;
    *lp_best = (double)lg[b1] - lse;
}

/* Records step `i` of case rc from logits; returns the token to feed next. */
static int32_t record(run_case *out, const ref_case *rc, int i, const float *lg, int32_t n_vocab) {
    int32_t best;
    double margin, lp_ref, lp_best;
    int32_t ref_tok = i < rc->n_steps ? rc->steps[i].token : 0;
    logits_info(lg, n_vocab, ref_tok, &best, &margin, &lp_ref, &lp_best);
    out->tokens[i] = best;
    out->logprob[i] = lp_best;
    out->ref_lp[i] = lp_ref;
    out->margin[i] = margin;
    out->n = i + 1;
    return best;
}

/* Runs every case alone (batched == false) or all together as one multi-sequence batch. Each case decodes as
 * many greedy steps as its reference has. */
static void run_cases(eng_ctx *ctx, const ref_case *cases, int n_cases, int32_t n_vocab, bool batched,
                      run_case *out) {
    kvc_cache *kv = eng_ctx_cache(ctx);
    static int32_t tok[MAX_CASES * MAX_PROMPT], pos[MAX_CASES * MAX_PROMPT], seq[MAX_CASES * MAX_PROMPT];
    static bool want[MAX_CASES * MAX_PROMPT];
    int32_t seqs[MAX_CASES], next[MAX_CASES], row[MAX_CASES];
    int groups = batched ? 1 : n_cases;
    for (int g = 0; g < groups; g++) {
        int c0 = batched ? 0 : g, c1 = batched ? n_cases : g + 1;
        int32_t n = 0;
        for (int c = c0; c < c1; c++) {
            cr_assert_eq(kvc_seq_alloc(kv, &seqs[c]), 0);
            for (int32_t p = 0; p < cases[c].n_prompt; p++) {
                tok[n] = cases[c].prompt_tokens[p];
                pos[n] = p;
                seq[n] = seqs[c];
                want[n] = p == cases[c].n_prompt - 1;
                if (want[n]) row[c] = n;
                n++;
            }
        }
        eng_batch b = {n, tok, pos, seq, want, NULL};
        cr_assert_eq(eng_decode(ctx, &b), 0);
        for (int c = c0; c < c1; c++) {
            out[c].n = 0;
            next[c] = record(&out[c], &cases[c], 0, eng_get_logits(ctx, row[c]), n_vocab);
        }
        for (int step = 1;; step++) {
            n = 0;
            for (int c = c0; c < c1; c++) {
                if (step >= cases[c].n_steps) continue;
                tok[n] = next[c];
                pos[n] = cases[c].n_prompt + step - 1;
                seq[n] = seqs[c];
                want[n] = true;
                row[c] = n++;
            }
            if (n == 0) break;
            eng_batch d = {n, tok, pos, seq, want, NULL};
            cr_assert_eq(eng_decode(ctx, &d), 0, "decode step %d", step);
            for (int c = c0; c < c1; c++)
                if (step < cases[c].n_steps)
                    next[c] = record(&out[c], &cases[c], step, eng_get_logits(ctx, row[c]), n_vocab);
        }
        for (int c = c0; c < c1; c++) cr_assert_eq(kvc_seq_free(kv, seqs[c]), 0);
    }
}

typedef struct cmp_stats { int compared, total; double sum_delta, max_delta; bool ok; } cmp_stats;

/* The README's rule for one run over all cases. */
static cmp_stats compare_ref(const char *name, const char *label, const ref_case *cases, int n_cases,
                             const run_case *runs, bool quantized, int32_t eos) {
    double thr_margin = quantized ? 0.5 : 0.1, max_mean = quantized ? 0.05 : 0.01, max_step = quantized ? 0.5 : 0.05;
    double min_frac = quantized ? 0.40 : 0.90;
    cmp_stats s = {0, 0, 0.0, 0.0, true};
    for (int c = 0; c < n_cases; c++) {
        s.total += cases[c].n_steps;
        for (int i = 0; i < cases[c].n_steps && i < runs[c].n; i++) {
            const ref_step *st = &cases[c].steps[i];
            double d = fabs(runs[c].ref_lp[i] - st->logprob);
            s.compared++;
            s.sum_delta += d;
            if (d > s.max_delta) s.max_delta = d;
            if (d > max_step) {
                cr_log_error("%s %s: case %d step %d: delta %.4f > %.3f", name, label, c, i, d, max_step);
                s.ok = false;
            }
            if (runs[c].tokens[i] != st->token) {
                if (st->token == eos) {
                    cr_log_error("%s %s: case %d step %d: reference ends in EOS, engine chose %d", name, label, c, i,
                                 runs[c].tokens[i]);
                    s.ok = false;
                } else if (st->margin >= thr_margin) {
                    cr_log_error("%s %s: case %d step %d: token %d != reference %d (margin %.4f)", name, label, c, i,
                                 runs[c].tokens[i], st->token, st->margin);
                    s.ok = false;
                }
                break; /* diverged (legitimately or not): stop comparing this case */
            }
        }
    }
    double mean = s.compared ? s.sum_delta / s.compared : 0.0;
    if (mean > max_mean) {
        cr_log_error("%s %s: mean delta %.4f > %.3f", name, label, mean, max_mean);
        s.ok = false;
    }
    if (s.compared < min_frac * s.total) {
        cr_log_error("%s %s: compared %d of %d steps (< %.0f%%)", name, label, s.compared, s.total, 100 * min_frac);
        s.ok = false;
    }
    return s;
}

static bool model_is_quantized(const eng_model *m) {
    if (m->output.type != 0 && m->output.type != 1 && m->output.type != 30) return true;
    const eng_matrix *w;
    for (size_t i = 0; (w = eng_layer_matrix(&m->layers[0], m->hp.n_expert, i)) != NULL; i++)
        if (w->data && w->type != 0 && w->type != 1 && w->type != 30) return true;
    return false;
}

/* The model at mpath against the reference root (named base in messages), with a context of n_ctx positions. */
static void check_ref(const char *base, const char *mpath, cJSON *root, int32_t n_ctx) {
    static ref_case cases[MAX_CASES];
    int n_cases = parse_ref(root, cases);

    eng_model *m = NULL;
    char err[512];
    cr_assert_eq(eng_model_load(mpath, NULL, &m, err, sizeof err), 0, "%s", err);
    const eng_hparams *hp = eng_model_hparams(m);
    bool quantized = model_is_quantized(m);

    /* tokenization must reproduce prompt_tokens (the engine runs on the reference ids either way) */
    for (int c = 0; c < n_cases; c++) {
        int32_t ids[MAX_PROMPT], n = 0;
        int rc = eng_tokenize(m, cases[c].prompt, strlen(cases[c].prompt), true, true, ids, MAX_PROMPT, &n);
        cr_expect_eq(rc, 0);
        bool same = rc == 0 && n == cases[c].n_prompt;
        for (int32_t i = 0; same && i < n; i++) same = ids[i] == cases[c].prompt_tokens[i];
        cr_expect(same, "%s: case %d: tokenization differs from prompt_tokens", base, c);
    }

    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_ctx = n_ctx;
    cp.max_seqs = MAX_CASES;
    cp.max_batch_tokens = 1024;
    cp.kv_dtype = KVC_DTYPE_F32;
    cp.prefix_caching = false;
    cp.device = test_device();
    eng_ctx *ctx = NULL;
    cr_assert_eq(eng_ctx_create(m, &cp, &ctx, err, sizeof err), 0, "%s", err);

    static run_case seq_runs[MAX_CASES], batch_runs[MAX_CASES];
    run_cases(ctx, cases, n_cases, hp->n_vocab, false, seq_runs);
    run_cases(ctx, cases, n_cases, hp->n_vocab, true, batch_runs);

    int32_t eos = eng_token_eos(m);
    cmp_stats s1 = compare_ref(base, "one at a time", cases, n_cases, seq_runs, quantized, eos);
    cmp_stats s2 = compare_ref(base, "batched", cases, n_cases, batch_runs, quantized, eos);
    cr_log_info("%s (%s): %s; mean delta %.5f, max delta %.5f, steps compared %d/%d (batched: %s, mean %.5f, "
                "max %.5f, %d/%d)", base, quantized ? "quantized rule" : "float rule", s1.ok ? "pass" : "FAIL",
                s1.compared ? s1.sum_delta / s1.compared : 0.0, s1.max_delta, s1.compared, s1.total,
                s2.ok ? "pass" : "FAIL", s2.compared ? s2.sum_delta / s2.compared : 0.0, s2.max_delta, s2.compared,
                s2.total);
    cr_expect(s1.ok, "%s: reference comparison failed (one prompt at a time)", base);
    cr_expect(s2.ok, "%s: reference comparison failed (batched)", base);

    /* batch invariance */
    double max_lp_diff = 0.0;
    for (int c = 0; c < n_cases; c++) {
        for (int i = 0; i < seq_runs[c].n && i < batch_runs[c].n; i++) {
            double d = fabs(seq_runs[c].logprob[i] - batch_runs[c].logprob[i]);
            if (seq_runs[c].tokens[i] != batch_runs[c].tokens[i]) {
                cr_expect(seq_runs[c].margin[i] < 1e-3, "%s: case %d step %d: batched token %d != %d (margin %g)",
                          base, c, i, batch_runs[c].tokens[i], seq_runs[c].tokens[i], seq_runs[c].margin[i]);
                break;
            }
            if (d > max_lp_diff) max_lp_diff = d;
            cr_expect_leq(d, 1e-3, "%s: case %d step %d: batched logprob differs by %g", base, c, i, d);
        }
    }
    cr_log_info("%s: batch invariance: max logprob difference %.2e", base, max_lp_diff);
    eng_ctx_free(ctx);
    eng_model_free(m);
}

static void check_model(const char *base) {
    char mpath[1024], rpath[1024];
    const char *dir = kvt_shared_dir();
    snprintf(rpath, sizeof rpath, "%s/reference/%s.json", dir, base);
    snprintf(mpath, sizeof mpath, "%s/models/%s%s.gguf", dir, strncmp(base, "syn-", 4) ? "" : "synthetic/", base);
    if (!file_exists(mpath) || !file_exists(rpath))
        cr_skip_test("shared test material not found (%s): set KVSERVE_SHARED to ../shared", mpath);
    char *json = kvt_read_file(rpath, NULL);
    cr_assert_not_null(json);
    cJSON *root = cJSON_Parse(json);
    cr_assert_not_null(root);
    check_ref(base, mpath, root, 512);
    cJSON_Delete(root);
    free(json);
}

TestSuite(reference, .timeout = 120);

Test(reference, stories260K) { check_model("stories260K"); }
Test(reference, syn_llama_f16) { check_model("syn-llama-f16"); }
Test(reference, syn_llama_q8_0) { check_model("syn-llama-q8_0"); }
Test(reference, syn_llama_q4_0) { check_model("syn-llama-q4_0"); }
Test(reference, syn_llama_q4_k_m) { check_model("syn-llama-q4_k_m"); }
Test(reference, syn_llama_q6_k) { check_model("syn-llama-q6_k"); }
Test(reference, syn_qwen2_q8_0) { check_model("syn-qwen2-q8_0"); }
Test(reference, syn_gemma3_q8_0) { check_model("families/syn-gemma3-q8_0"); }
Test(reference, syn_phi3_q8_0) { check_model("families/syn-phi3-q8_0"); }

/* models/README.md: greedy from BOS with no prompt gives these 60 ids (independent float64 reference). */
Test(reference, stories260K_from_bos) {
    static const int32_t want[60] = {
        403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337,
        410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352,
        266, 268, 388, 426, 338, 391, 266, 267, 337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415};
    char mpath[1024], err[512];
    snprintf(mpath, sizeof mpath, "%s/models/stories260K.gguf", kvt_shared_dir());
    if (!file_exists(mpath)) cr_skip_test("shared test material not found (%s): set KVSERVE_SHARED", mpath);
    eng_model *m = NULL;
    cr_assert_eq(eng_model_load(mpath, NULL, &m, err, sizeof err), 0, "%s", err);
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_ctx = 128;
    cp.kv_dtype = KVC_DTYPE_F32;
    cp.device = test_device();
    eng_ctx *ctx = NULL;
    cr_assert_eq(eng_ctx_create(m, &cp, &ctx, err, sizeof err), 0, "%s", err);
    int32_t seq;
    cr_assert_eq(kvc_seq_alloc(eng_ctx_cache(ctx), &seq), 0);
    int32_t tok = eng_token_bos(m);
    cr_assert_eq(tok, 1);
    bool wl = true;
    int matched = 0;
    for (int32_t pos = 0; pos < 60; pos++) {
        eng_batch b = {1, &tok, &pos, &seq, &wl, NULL};
        cr_assert_eq(eng_decode(ctx, &b), 0);
        const float *lg = eng_get_logits(ctx, 0);
        int32_t best = 0;
        for (int32_t i = 1; i < eng_model_hparams(m)->n_vocab; i++)
            if (lg[i] > lg[best]) best = i;
        if (best != want[pos]) break;
        matched++;
        tok = best;
    }
    cr_log_info("stories260K from BOS: %d of 60 greedy tokens match", matched);
    cr_expect_eq(matched, 60, "diverged at generated token %d", matched);
    eng_ctx_free(ctx);
    eng_model_free(m);
}

/* The logits do not depend on how many threads compute them, bit for bit: every stage hands its rows out in chunks
 * whose sizes depend on the thread count and on which thread comes first (guided chunks for small batches), and
 * each output row must still be computed whole, the same way, by whichever thread takes it. A 24-token prefill
 * (logits for every row) then 8 greedy single-token steps, with 1, 2 and 3 threads, on the packed K-quant,
 * Q4_0 and Q8_0 paths. */
static void thread_count_invariance(const char *base) {
    char mpath[1024], err[512];
    snprintf(mpath, sizeof mpath, "%s/models/synthetic/%s.gguf", kvt_shared_dir(), base);
    if (!file_exists(mpath)) cr_skip_test("shared test material not found (%s): set KVSERVE_SHARED", mpath);
    if (test_device() != ENG_DEVICE_CPU) cr_skip_test("thread counts are a CPU matter");
    eng_model *m = NULL;
    cr_assert_eq(eng_model_load(mpath, NULL, &m, err, sizeof err), 0, "%s", err);
    enum { P = 24, N = 8 }; /* prompt rows, decode steps */
    const int32_t V = eng_model_hparams(m)->n_vocab;
    float *first = malloc(sizeof(float) * (size_t)V * (P + N));
    cr_assert_not_null(first);
    for (int32_t nth = 1; nth <= 3; nth++) {
        eng_ctx_params cp;
        eng_ctx_params_default(&cp);
        cp.n_ctx = 128;
        cp.n_threads = nth;
        cp.max_batch_tokens = P;
        cp.kv_dtype = KVC_DTYPE_F16;
        cp.device = ENG_DEVICE_CPU;
        eng_ctx *ctx = NULL;
        cr_assert_eq(eng_ctx_create(m, &cp, &ctx, err, sizeof err), 0, "%s", err);
        int32_t seq, tok[P], pos[P], sq[P];
        bool want[P];
        cr_assert_eq(kvc_seq_alloc(eng_ctx_cache(ctx), &seq), 0);
        for (int32_t i = 0; i < P; i++) tok[i] = (i * 7919 + 13) % V, pos[i] = i, sq[i] = seq, want[i] = true;
        eng_batch b = {P, tok, pos, sq, want, NULL};
        cr_assert_eq(eng_decode(ctx, &b), 0);
        int32_t next = 0;
        for (int32_t step = 0; step <= N; step++) {
            for (int32_t r = 0; r < (step == 0 ? P : 1); r++) {
                const float *lg = eng_get_logits(ctx, r);
                float *keep = first + (size_t)V * (size_t)(step == 0 ? r : P + step - 1);
                if (nth == 1) memcpy(keep, lg, sizeof(float) * (size_t)V);
                else cr_assert(memcmp(keep, lg, sizeof(float) * (size_t)V) == 0,
                               "%s: %d threads: the logits of %s %d differ from one thread's", base, nth,
                               step == 0 ? "prompt row" : "decode step", step == 0 ? r : step);
                if (r == (step == 0 ? P - 1 : 0)) {
                    next = 0;
                    for (int32_t i = 1; i < V; i++)
                        if (lg[i] > lg[next]) next = i;
                }
            }
            if (step == N) break;
            int32_t p = P + step;
            bool w = true;
            eng_batch d = {1, &next, &p, &seq, &w, NULL};
            cr_assert_eq(eng_decode(ctx, &d), 0);
        }
        eng_ctx_free(ctx);
    }
    free(first);
    eng_model_free(m);
}

Test(reference, thread_count_invariance_q4_k_m) { thread_count_invariance("syn-llama-q4_k_m"); }
Test(reference, thread_count_invariance_q6_k) { thread_count_invariance("syn-llama-q6_k"); }
Test(reference, thread_count_invariance_q4_0) { thread_count_invariance("syn-llama-q4_0"); }
Test(reference, thread_count_invariance_q8_0) { thread_count_invariance("syn-llama-q8_0"); }

/* ---- Phi-3 with LongRoPE factors (tests/reference/mk-phi3-longrope.ctx*.json) ----------------------------------
 * A phi3 model with rope_factors_short/long.weight, rope.scaling.original_context_length 512 and
 * rope.scaling.attn_factor, made by `kvserve mkmodel` with the arguments the reference records (the file's SHA-256
 * must be the recorded one), against llama.cpp's llama-server at two context sizes: 512 (not above the original
 * context: the short factors) and 1024 (the long ones); the attention factor applies to both. The two references
 * differ, so each factor set is in effect. */
static cJSON *mk_ref(const char *stem, int32_t n_ctx, char *json_out[1]) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/reference/%s.ctx%d.json", KVSERVE_SOURCE_DIR, stem, n_ctx);
    char *json = kvt_read_file(path, NULL);
    cr_assert_not_null(json, "%s: cannot read", path);
    cJSON *root = cJSON_Parse(json);
    cr_assert_not_null(root, "%s: invalid JSON", path);
    cJSON *nc = cJSON_GetObjectItem(root, "n_ctx");
    cr_assert(cJSON_IsNumber(nc) && nc->valuedouble == n_ctx, "%s: n_ctx", path);
    *json_out = json;
    return root;
}

static cJSON *longrope_ref(int32_t n_ctx, char *json_out[1]) { return mk_ref("mk-phi3-longrope", n_ctx, json_out); }

/* Makes the reference's model in dir (model path in mpath: mkmodel, then `kvserve quantize` when the reference names
 * a "quantize" file type) and checks its SHA-256. */
static void mk_model(const char *stem, cJSON *root, const char *dir, char *mpath, size_t cap) {
    snprintf(mpath, cap, "%s/%s.gguf", dir, stem);
    const char *args[64];
    int n = 0;
    args[n++] = "mkmodel";
    args[n++] = "-o";
    args[n++] = mpath;
    cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItem(root, "mkmodel_args")) {
        cr_assert(cJSON_IsString(a) && n < 63);
        args[n++] = a->valuestring;
    }
    args[n] = NULL;
    cr_assert_eq(kvt_run_kvserve(dir, args, NULL), 0, "kvserve mkmodel failed");
    const char *qtype = cJSON_GetStringValue(cJSON_GetObjectItem(root, "quantize"));
    if (qtype) {
        char qpath[300];
        snprintf(qpath, sizeof qpath, "%s.q", mpath);
        const char *qargs[] = {"quantize", mpath, qpath, qtype, NULL};
        cr_assert_eq(kvt_run_kvserve(dir, qargs, NULL), 0, "kvserve quantize failed");
        cr_assert_eq(rename(qpath, mpath), 0);
    }
    size_t len = 0;
    char *data = kvt_read_file(mpath, &len);
    cr_assert_not_null(data);
    uint8_t h[32];
    kvs_sha256(data, len, h);
    free(data);
    char hex[65];
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
    const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(root, "model_sha256"));
    cr_assert(want && !strcmp(hex, want), "mkmodel's %s model changed (sha256 %s, reference %s): regenerate the "
              "reference with scripts/ref-mkmodel.py", stem, hex, want ? want : "?");
}

/* The model file and directory a test of a mkmodel model made: removed by the test's .fini, which runs whether
 * the test passed or failed (a skip does not run it: the device check comes before anything is made). */
static char made_dir[64], made_path[256];
static void made_cleanup(void) {
    if (made_path[0]) unlink(made_path);
    if (made_dir[0]) rmdir(made_dir);
}

static void check_longrope(int32_t n_ctx) {
    (void)test_device(); /* skips here, before anything is made, when the device asked for is absent */
    char *json = NULL, *dir = made_dir, *mpath = made_path;
    cJSON *root = longrope_ref(n_ctx, &json);
    snprintf(made_dir, sizeof made_dir, "/tmp/kvserve-longrope-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    mk_model("mk-phi3-longrope", root, dir, mpath, sizeof made_path);
    eng_model *m = NULL;
    char err[512];
    cr_assert_eq(eng_model_load(mpath, NULL, &m, err, sizeof err), 0, "%s", err);
    const eng_hparams *hp = eng_model_hparams(m);
    cr_assert_eq(hp->n_ctx_orig, 512);
    cr_assert_gt(hp->rope_attn_factor, 1.0f);
    eng_model_free(m);
    char name[64];
    snprintf(name, sizeof name, "mk-phi3-longrope ctx %d", n_ctx);
    check_ref(name, mpath, root, n_ctx);
    cJSON_Delete(root);
    free(json);
}

Test(reference, phi3_longrope_short_factors, .fini = made_cleanup) { check_longrope(512); }
Test(reference, phi3_longrope_long_factors, .fini = made_cleanup) { check_longrope(1024); }

/* The two references are not the same: the context size (hence the factor set) changes llama.cpp's results. */
Test(reference, phi3_longrope_factor_sets_differ) {
    char *j1 = NULL, *j2 = NULL;
    cJSON *r1 = longrope_ref(512, &j1), *r2 = longrope_ref(1024, &j2);
    static ref_case c1[MAX_CASES], c2[MAX_CASES];
    int n1 = parse_ref(r1, c1), n2 = parse_ref(r2, c2);
    cr_assert_eq(n1, n2);
    double max_d = 0.0;
    int diff_tokens = 0;
    for (int c = 0; c < n1; c++)
        for (int i = 0; i < c1[c].n_steps && i < c2[c].n_steps; i++) {
            if (c1[c].steps[i].token != c2[c].steps[i].token) {
                diff_tokens++;
                break;
            }
            max_d = fmax(max_d, fabs(c1[c].steps[i].logprob - c2[c].steps[i].logprob));
        }
    cr_log_info("phi3 LongRoPE: short vs long factors: %d cases diverge, max logprob difference before %.3f",
                diff_tokens, max_d);
    cr_expect(diff_tokens > 0 || max_d > 0.1, "the factor sets hardly change the results (max %.4f)", max_d);
    cJSON_Delete(r1);
    cJSON_Delete(r2);
    free(j1);
    free(j2);
}

/* ---- llama with YaRN rope scaling and attention biases (tests/reference/mk-llama-yarn.ctx1024.json) --------------
 * rope.scaling.type yarn, factor 4 over an original context of 256, rope.scaling.attn_factor 1.1, Q/K/V and
 * attn_output biases, made by `kvserve mkmodel` with the recorded arguments, against llama.cpp's library
 * (scripts/ref-mkmodel.py llama-yarn). */
Test(reference, llama_yarn_biases, .fini = made_cleanup) {
    (void)test_device(); /* skips before anything is made when the device asked for is absent */
    char *json = NULL, *dir = made_dir, *mpath = made_path;
    cJSON *root = mk_ref("mk-llama-yarn", 1024, &json);
    snprintf(made_dir, sizeof made_dir, "/tmp/kvserve-yarn-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    mk_model("mk-llama-yarn", root, dir, mpath, sizeof made_path);
    eng_model *m = NULL;
    char err[512];
    cr_assert_eq(eng_model_load(mpath, NULL, &m, err, sizeof err), 0, "%s", err);
    const eng_hparams *hp = eng_model_hparams(m);
    cr_assert_eq(hp->rope_yarn_ext, 1.0f);
    cr_assert_eq(hp->rope_freq_scale, 0.25f);
    cr_assert_eq(hp->n_ctx_orig, 256);
    eng_model_free(m);
    check_ref("mk-llama-yarn ctx 1024", mpath, root, 1024);
    cJSON_Delete(root);
    free(json);
}

/* ---- qwen3moe (tests/reference/mk-qwen3moe-*.ctx512.json) ---------------------------------------------------------
 * Mixture-of-Experts: a router, 16 experts of which 4 per token, Q/K norms; made by `kvserve mkmodel` in f32 (the
 * float rule), q8_0 and Q4_K_M (f16 through `kvserve quantize`; the quantized rule), against llama.cpp's library
 * (scripts/ref-mkmodel.py), alone and batched. */
static void check_moe(const char *stem) {
    (void)test_device(); /* skips before anything is made when the device asked for is absent */
    char *json = NULL, *dir = made_dir, *mpath = made_path;
    cJSON *root = mk_ref(stem, 512, &json);
    snprintf(made_dir, sizeof made_dir, "/tmp/kvserve-moe-ref-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    mk_model(stem, root, dir, mpath, sizeof made_path);
    char label[96];
    snprintf(label, sizeof label, "%s ctx 512", stem);
    check_ref(label, mpath, root, 512);
    cJSON_Delete(root);
    free(json);
}

Test(reference, qwen3moe_f32, .fini = made_cleanup) { check_moe("mk-qwen3moe-f32"); }
Test(reference, qwen3moe_q8_0, .fini = made_cleanup) { check_moe("mk-qwen3moe-q8_0"); }
Test(reference, qwen3moe_q4_k_m, .fini = made_cleanup) { check_moe("mk-qwen3moe-q4_k_m"); }
/* gpt-oss (tests/reference/mk-gpt-oss-*.ctx512.json): a biased router over 16 experts (4 per token, top-k then
 * softmax), the clamped SwiGLU, Q/K/V/O biases, attention sinks, blocks 0 and 2 sliding over 16 positions (the
 * longer prompts and their completions leave the window), YaRN; f32 (the float rule) and MXFP4 experts with Q8_0
 * matrices (`kvserve quantize ... MXFP4_MOE` of the f16 model; the quantized rule), alone and batched. */
Test(reference, gpt_oss_f32, .fini = made_cleanup) { check_moe("mk-gpt-oss-f32"); }
Test(reference, gpt_oss_mxfp4, .fini = made_cleanup) { check_moe("mk-gpt-oss-mxfp4"); }
