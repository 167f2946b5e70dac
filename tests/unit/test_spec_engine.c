/* test_spec_engine.c: speculative decoding (n-gram or draft-model guesses verified in the scheduler) over the REAL
 * engine. The
 * contract: with speculation on, every request's tokens, logprobs (with the top alternatives), text and finish
 * reasons are bit for bit those of plain decoding, whatever k, batch budget, KV pool (preemption, recompute),
 * thread count and adaptive choice; stop strings and max_tokens cut the accepted tokens where plain decoding
 * cuts. Models: a random-weight model written by `kvserve mkmodel` (its flat distributions turn any numeric
 * drift into different tokens), stories260K and the synthetic Q4_K_M llama from ../shared (skipped when absent).
 * Prompts repeat stretches of themselves so that the n-gram lookup finds guesses, and greedy output of these
 * models loops, so guesses are both accepted and rejected; the counters prove that they were. With a draft model
 * (stories260K drafting for itself, or for a random model with its vocabulary) the same contract holds, whatever
 * the draft's own KV pool (some rounds give it too few blocks for every sequence: the draft then fails and the
 * step runs without guesses) and p_min; at the end the draft's pool holds no block. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "helper_sched.h"
#include "server/sched/sched.h"

#define MAXT 160
#define MAXC 2
#define MAXP 200

typedef struct res {
    int32_t n;
    int32_t toks[MAXC][MAXT];
    float lp[MAXC][MAXT];
    float top[MAXC][MAXT][2];
    int32_t n_toks[MAXC];
    char text[MAXC][4096];
    size_t text_len[MAXC];
    srv_sched_finish finish[MAXC];
    int done;
    srv_sched_usage usage;
    int order_errors;
    int *n_done;
} res;

static void on_event(const srv_sched_event *ev, void *user) {
    res *r = user;
    if (r->done) {
        r->order_errors++;
        return;
    }
    if (ev->type == SRV_SCHED_EV_DONE) {
        r->done = 1;
        r->usage = ev->usage;
        (*r->n_done)++;
        return;
    }
    if (ev->choice < 0 || ev->choice >= r->n) {
        r->order_errors++;
        return;
    }
    int c = ev->choice;
    if (ev->text_len && r->text_len[c] + ev->text_len < sizeof r->text[c]) {
        memcpy(r->text[c] + r->text_len[c], ev->text, ev->text_len);
        r->text_len[c] += ev->text_len;
    }
    for (int32_t i = 0; i < ev->n_samples && r->n_toks[c] < MAXT; i++) {
        const eng_sample *sm = &ev->samples[i];
        int32_t k = r->n_toks[c]++;
        r->toks[c][k] = sm->token;
        r->lp[c][k] = sm->logprob;
        r->top[c][k][0] = sm->n_top > 0 ? sm->top_logprob[0] : 0.0f;
        r->top[c][k][1] = sm->n_top > 1 ? sm->top_logprob[1] : 0.0f;
    }
    if (ev->type == SRV_SCHED_EV_CHOICE_END) r->finish[c] = ev->finish;
}

typedef struct spec {
    int32_t prompt[MAXP];
    int32_t n_prompt;
    int32_t n;
    int32_t max_tokens;
    float temp;
    uint64_t seed;
    const char *stop; /* NULL: none */
    int32_t spec_n_max; /* the request's speculative.n_max (-1: the scheduler's) */
} spec;

/* How the engine and scheduler are shaped for one run. */
typedef struct shape {
    int32_t kv_blocks;
    int32_t batch_tokens;
    int32_t n_threads;
    bool spec;
    int32_t n_max;
    bool adaptive;
    eng_model *draft;       /* NULL: n-gram guesses; else this model drafts (SRV_SCHED_SPEC_DRAFT) */
    int32_t draft_blocks;   /* the draft context's KV pool in blocks (small ones make it run full) */
    float p_min;
} shape;

/* Runs the specs concurrently; returns the scheduler's counters. */
static srv_sched_counters run_shaped(eng_model *model, const spec *sp, int n, shape sh, res *out) {
    eng_ctx *ctx = schedt_cpu_ctx(model, sh.n_threads, 256, 8, sh.batch_tokens, sh.kv_blocks);
    srv_engine_ops ops, dops;
    cr_assert_eq(srv_engine_ops_init(&ops, model, ctx), SRV_SCHED_OK);
    eng_ctx *dctx = NULL;
    if (sh.draft) {
        dctx = schedt_cpu_ctx(sh.draft, sh.n_threads, 256, 8, sh.batch_tokens, sh.draft_blocks);
        cr_assert_eq(srv_engine_ops_init(&dops, sh.draft, dctx), SRV_SCHED_OK);
    }
    uv_loop_t loop;
    uv_loop_init(&loop);
    srv_sched_params p;
    srv_sched_params_default(&p);
    p.batch_tokens = sh.batch_tokens;
    p.parallel = 8;
    p.n_ctx = 256;
    p.spec_type = !sh.spec ? SRV_SCHED_SPEC_NONE : sh.draft ? SRV_SCHED_SPEC_DRAFT : SRV_SCHED_SPEC_NGRAM;
    p.draft = sh.draft ? &dops : NULL;
    p.spec_p_min = sh.p_min;
    p.spec_n_max = sh.n_max;
    p.spec_adaptive = sh.adaptive;
    srv_sched *s = NULL;
    cr_assert_eq(srv_sched_create(&p, &ops, &loop, &s), SRV_SCHED_OK);
    int n_done = 0;
    for (int i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].n = sp[i].n;
        out[i].n_done = &n_done;
        srv_sched_request rq;
        memset(&rq, 0, sizeof rq);
        rq.prompt = sp[i].prompt;
        rq.n_prompt = sp[i].n_prompt;
        rq.n = sp[i].n;
        rq.max_tokens = sp[i].max_tokens;
        eng_sampling_params_default(&rq.sampling);
        rq.sampling.temperature = sp[i].temp;
        rq.sampling.seed = sp[i].seed;
        rq.sampling.n_top_logprobs = 2;
        rq.ignore_eos = true;
        const char *stops[1] = {sp[i].stop};
        rq.stop = sp[i].stop ? stops : NULL;
        rq.n_stop = sp[i].stop ? 1 : 0;
        rq.spec_n_max = sp[i].spec_n_max;
        rq.spec_n_min = -1;
        rq.cb = on_event;
        rq.user = &out[i];
        uint64_t id;
        cr_assert_eq(srv_sched_submit(s, &rq, &id), SRV_SCHED_OK);
    }
    while (n_done < n) uv_run(&loop, UV_RUN_ONCE);
    srv_sched_stats st;
    srv_sched_get_stats(s, &st);
    cr_assert_eq(st.kv_blocks_used, 0);
    srv_sched_free(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0);
    char msg[256];
    cr_assert_eq(kvc_check(eng_ctx_cache(ctx), msg, sizeof msg), KVC_OK, "%s", msg);
    srv_engine_ops_release(&ops);
    eng_ctx_free(ctx);
    if (dctx) {
        /* every draft sequence was closed with its choice: the draft's pool is whole again */
        kvc_stats ks;
        kvc_get_stats(eng_ctx_cache(dctx), &ks);
        cr_assert_eq(ks.blocks_used, 0, "the draft's pool still holds %d blocks", (int)ks.blocks_used);
        cr_assert_eq(kvc_check(eng_ctx_cache(dctx), msg, sizeof msg), KVC_OK, "%s", msg);
        srv_engine_ops_release(&dops);
        eng_ctx_free(dctx);
    }
    return st.counters;
}

/* Every choice of `got` equals `want` in tokens, logprobs (bit for bit), text and finish reason. */
static void assert_same(const res *got, const res *want, int32_t n, const char *what, int i) {
    cr_assert_eq(got->order_errors, 0);
    for (int c = 0; c < n; c++) {
        int32_t nt = want->n_toks[c];
        cr_assert_eq(got->n_toks[c], nt, "%s req %d choice %d: %d tokens, plain decoding %d (finish %d, plain %d)",
                     what, i, c, got->n_toks[c], nt, (int)got->finish[c], (int)want->finish[c]);
        for (int32_t k = 0; k < nt; k++) {
            cr_assert_eq(got->toks[c][k], want->toks[c][k], "%s req %d choice %d token %d differs", what, i, c, k);
            cr_assert(memcmp(&got->lp[c][k], &want->lp[c][k], sizeof(float)) == 0 &&
                          memcmp(got->top[c][k], want->top[c][k], sizeof got->top[c][k]) == 0,
                      "%s req %d choice %d token %d: logprob %.9g, plain decoding %.9g", what, i, c, k,
                      (double)got->lp[c][k], (double)want->lp[c][k]);
        }
        cr_assert_eq(got->text_len[c], want->text_len[c], "%s req %d choice %d: text length", what, i, c);
        cr_assert(memcmp(got->text[c], want->text[c], want->text_len[c]) == 0, "%s req %d: text differs", what, i);
        cr_assert_eq(got->finish[c], want->finish[c], "%s req %d choice %d: finish reason", what, i, c);
    }
    cr_assert_eq(got->usage.completion_tokens, want->usage.completion_tokens, "%s req %d: completion tokens %d, "
                 "plain decoding %d", what, i, got->usage.completion_tokens, want->usage.completion_tokens);
}

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

/* Random prompts that repeat stretches of themselves (something for the lookup to find). */
static void make_specs(spec *sp, int nr, int32_t n_vocab, const char *stop) {
    for (int i = 0; i < nr; i++) {
        memset(&sp[i], 0, sizeof sp[i]);
        int32_t seg = 4 + (int32_t)rnd(20), n = 0, head = 1 + (int32_t)rnd(30);
        int32_t part[24];
        for (int32_t k = 0; k < seg; k++) part[k] = 1 + (int32_t)rnd((uint32_t)(n_vocab - 1));
        for (int32_t k = 0; k < head; k++) sp[i].prompt[n++] = 1 + (int32_t)rnd((uint32_t)(n_vocab - 1));
        int32_t reps = 1 + (int32_t)rnd(4);
        for (int32_t r = 0; r < reps && n + seg < 120; r++) {
            for (int32_t k = 0; k < seg; k++) sp[i].prompt[n++] = part[k];
            int32_t gap = (int32_t)rnd(6);
            for (int32_t k = 0; k < gap; k++) sp[i].prompt[n++] = 1 + (int32_t)rnd((uint32_t)(n_vocab - 1));
        }
        sp[i].n_prompt = n;
        sp[i].n = i % 4 == 1 ? 2 : 1;
        sp[i].max_tokens = 20 + (int32_t)rnd(100);
        sp[i].temp = i % 3 == 2 ? 0.9f : 0.0f;
        sp[i].seed = 7 + (uint64_t)i;
        sp[i].stop = stop && i % 3 == 1 ? stop : NULL;
        sp[i].spec_n_max = i % 5 == 4 ? 0 : i % 5 == 3 ? 2 : -1; /* one request opts out, one asks for 2 */
    }
}

/* Plain decoding once, then rounds of speculation at random k, budgets, pools, threads and adaptive choice:
 * each must equal plain decoding. draft: NULL for n-gram guesses, else the draft model (with random draft pools,
 * some too small for every sequence, and random p_min); accepts: whether some guess must have been accepted. */
static void check_model_with(eng_model *model, const char *name, const char *stop, int rounds, eng_model *draft,
                             bool accepts) {
    int32_t n_vocab = eng_model_hparams(model)->n_vocab;
    enum { NR = 8 };
    spec sp[NR];
    make_specs(sp, NR, n_vocab, stop);
    res *plain = calloc(NR, sizeof *plain), *got = calloc(NR, sizeof *got);
    cr_assert(plain && got);
    run_shaped(model, sp, NR, (shape){256, 64, 1, false, 1, false, NULL, 0, 0}, plain);
    srv_sched_counters sum;
    memset(&sum, 0, sizeof sum);
    int stopped = 0;
    for (int round = 0; round < rounds; round++) {
        static const int32_t ks[] = {1, 2, 3, 5, 8, 16, 32};
        shape sh; /* one draw per statement: the evaluation order inside an initializer is unspecified */
        sh.kv_blocks = round % 2 ? 256 : 17 + (int32_t)rnd(8); /* 17: one request alone fits */
        sh.batch_tokens = 16 + (int32_t)rnd(100);
        sh.n_threads = 1 + (int32_t)rnd(2);
        sh.spec = true;
        sh.n_max = ks[rnd(sizeof ks / sizeof ks[0])];
        sh.adaptive = rnd(2);
        sh.draft = draft;
        sh.draft_blocks = round % 3 == 0 ? 20 + (int32_t)rnd(20) : 0; /* 0: enough for every sequence */
        sh.p_min = rnd(3) == 0 ? 0.3f : 0.0f;
        srv_sched_counters c = run_shaped(model, sp, NR, sh, got);
        char what[160];
        snprintf(what, sizeof what, "%s round %d (blocks %d, budget %d, threads %d, k %d, adaptive %d, draft blocks %d, "
                 "p_min %.1f)", name, round, sh.kv_blocks, sh.batch_tokens, sh.n_threads, sh.n_max, sh.adaptive,
                 sh.draft_blocks, (double)sh.p_min);
        for (int i = 0; i < NR; i++) assert_same(&got[i], &plain[i], sp[i].n, what, i);
        for (int i = 0; i < NR; i++)
            for (int c = 0; c < sp[i].n; c++) stopped += sp[i].stop && got[i].finish[c] == SRV_SCHED_FINISH_STOP;
        sum.preemptions += c.preemptions;
        sum.spec_drafts += c.spec_drafts;
        sum.spec_draft_tokens += c.spec_draft_tokens;
        sum.spec_accepted_tokens += c.spec_accepted_tokens;
        cr_assert_eq(c.spec_accepted_per_pos[0] <= c.spec_drafts, true);
        uint64_t per = 0;
        for (int j = 0; j < SRV_SCHED_SPEC_MAX; j++) per += c.spec_accepted_per_pos[j];
        cr_assert_eq(per, c.spec_accepted_tokens, "the per-position counts add up to the accepted tokens");
    }
    cr_log_info("%s: %llu drafts, %llu guessed, %llu accepted, %llu preemptions", name,
                (unsigned long long)sum.spec_drafts, (unsigned long long)sum.spec_draft_tokens,
                (unsigned long long)sum.spec_accepted_tokens, (unsigned long long)sum.preemptions);
    cr_assert_gt(sum.spec_drafts, 0, "%s: nothing was guessed", name);
    if (accepts) cr_assert_gt(sum.spec_accepted_tokens, 0, "%s: no guess was ever accepted", name);
    cr_assert_gt(sum.spec_draft_tokens, sum.spec_accepted_tokens, "%s: no guess was ever rejected", name);
    cr_assert_gt(sum.preemptions, 0, "%s: no round preempted", name);
    if (stop) cr_assert_gt(stopped, 0, "%s: no choice ended on its stop string", name);
    free(plain);
    free(got);
}

static void check_model(eng_model *model, const char *name, const char *stop, int rounds) {
    check_model_with(model, name, stop, rounds, NULL, true);
}

static eng_model *load(const char *path) {
    eng_load_params lp;
    eng_load_params_default(&lp);
    eng_model *model = NULL;
    char err[256] = "";
    cr_assert_eq(eng_model_load(path, &lp, &model, err, sizeof err), ENG_OK, "%s", err);
    return model;
}

static bool shared_model(char *buf, size_t cap, const char *rel) {
    const char *dir = getenv("KVSERVE_SHARED");
    if (!dir || !dir[0]) dir = KVSERVE_SHARED_DIR;
    snprintf(buf, cap, "%s/models/%s", dir, rel);
    FILE *f = fopen(buf, "rb");
    if (!f) return false;
    fclose(f);
    return true;
}

Test(spec_engine, equals_plain_decoding_on_a_random_model, .timeout = 600) {
    char dir[] = "/tmp/kvs_speceng_XXXXXX", path[256], cmd[512];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    snprintf(cmd, sizeof cmd, "'%s' mkmodel -o '%s' --preset default >/dev/null 2>&1", KVSERVE_BINARY, path);
    cr_assert_eq(system(cmd), 0, "%s failed", cmd);
    eng_model *model = load(path);
    remove(path);
    rmdir(dir);
    check_model(model, "mkmodel", NULL, 6);
    eng_model_free(model);
}

Test(spec_engine, equals_plain_decoding_on_stories260K, .timeout = 600) {
    char path[1024];
    if (!shared_model(path, sizeof path, "stories260K.gguf"))
        cr_skip_test("models/stories260K.gguf not found in ../shared (KVSERVE_SHARED)");
    eng_model *model = load(path);
    check_model(model, "stories260K", ",", 6);
    eng_model_free(model);
}

Test(spec_engine, equals_plain_decoding_on_synthetic_q4_k_m, .timeout = 600) {
    char path[1024];
    if (!shared_model(path, sizeof path, "synthetic/syn-llama-q4_k_m.gguf"))
        cr_skip_test("models/synthetic/syn-llama-q4_k_m.gguf not found in ../shared (KVSERVE_SHARED)");
    eng_model *model = load(path);
    check_model(model, "syn-llama-q4_k_m", NULL, 4);
    eng_model_free(model);
}

/* ---- a draft model (SRV_SCHED_SPEC_DRAFT) ---------------------------------------------------------------------- */

/* stories260K drafting for itself: nearly every guess holds at temperature 0, some fail at 0.9 */
Test(spec_engine, draft_model_equals_plain_decoding_self_draft, .timeout = 600) {
    char path[1024];
    if (!shared_model(path, sizeof path, "stories260K.gguf"))
        cr_skip_test("models/stories260K.gguf not found in ../shared (KVSERVE_SHARED)");
    eng_model *model = load(path), *draft = load(path);
    check_model_with(model, "stories260K drafting for itself", ",", 6, draft, true);
    eng_model_free(draft);
    eng_model_free(model);
}

/* a random-weight model with stories260K's vocabulary (mkmodel --vocab-from) as the target, stories260K drafting:
 * the guesses mostly fail, and the output must still be plain decoding's */
Test(spec_engine, draft_model_equals_plain_decoding_other_model, .timeout = 600) {
    char path[1024], dir[] = "/tmp/kvs_specdraft_XXXXXX", mk[256], cmd[2048];
    if (!shared_model(path, sizeof path, "stories260K.gguf"))
        cr_skip_test("models/stories260K.gguf not found in ../shared (KVSERVE_SHARED)");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(mk, sizeof mk, "%s/m.gguf", dir);
    snprintf(cmd, sizeof cmd, "'%s' mkmodel -o '%s' --preset tiny --vocab-from '%s' >/dev/null 2>&1", KVSERVE_BINARY,
             mk, path);
    cr_assert_eq(system(cmd), 0, "%s failed", cmd);
    eng_model *model = load(mk), *draft = load(path);
    remove(mk);
    rmdir(dir);
    int32_t t = -2;
    cr_assert_eq(eng_vocab_compare(model, draft, &t), ENG_OK, "mkmodel --vocab-from: token %d differs", (int)t);
    check_model_with(model, "mkmodel drafted by stories260K", NULL, 4, draft, false);
    eng_model_free(draft);
    eng_model_free(model);
}

/* another vocabulary is refused: eng_vocab_compare names the first token that differs, and the scheduler refuses a
 * draft whose vocabulary size differs */
Test(spec_engine, draft_model_needs_the_same_vocabulary, .timeout = 120) {
    char path[1024], dir[] = "/tmp/kvs_specvoc_XXXXXX", mk[256], cmd[2048];
    if (!shared_model(path, sizeof path, "stories260K.gguf"))
        cr_skip_test("models/stories260K.gguf not found in ../shared (KVSERVE_SHARED)");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(mk, sizeof mk, "%s/m.gguf", dir);
    snprintf(cmd, sizeof cmd, "'%s' mkmodel -o '%s' --preset tiny >/dev/null 2>&1", KVSERVE_BINARY, mk);
    cr_assert_eq(system(cmd), 0, "%s failed", cmd);
    eng_model *other = load(mk), *model = load(path);
    remove(mk);
    rmdir(dir);
    int32_t t = -2;
    cr_assert_eq(eng_vocab_compare(model, model, &t), ENG_OK);
    cr_assert_eq(eng_vocab_compare(model, other, &t), ENG_ERR_INVALID);
    cr_assert_geq(t, 0, "the first differing token is named");
    cr_assert_eq(eng_vocab_compare(other, model, &t), ENG_ERR_INVALID);

    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_ctx = 64;
    cp.max_seqs = 2;
    cp.device = ENG_DEVICE_CPU;
    eng_ctx *ctx = NULL, *octx = NULL;
    char err[256] = "";
    cr_assert_eq(eng_ctx_create(model, &cp, &ctx, err, sizeof err), ENG_OK, "%s", err);
    cr_assert_eq(eng_ctx_create(other, &cp, &octx, err, sizeof err), ENG_OK, "%s", err);
    srv_engine_ops ops, oops;
    cr_assert_eq(srv_engine_ops_init(&ops, model, ctx), SRV_SCHED_OK);
    cr_assert_eq(srv_engine_ops_init(&oops, other, octx), SRV_SCHED_OK);
    uv_loop_t loop;
    uv_loop_init(&loop);
    srv_sched_params p;
    srv_sched_params_default(&p);
    p.parallel = 2;
    p.n_ctx = 64;
    p.spec_type = SRV_SCHED_SPEC_DRAFT;
    srv_sched *s = NULL;
    cr_assert_eq(srv_sched_create(&p, &ops, &loop, &s), SRV_SCHED_ERR_INVALID, "draft type without a draft");
    p.draft = &oops;
    if (oops.n_vocab != ops.n_vocab)
        cr_assert_eq(srv_sched_create(&p, &ops, &loop, &s), SRV_SCHED_ERR_INVALID, "another vocabulary size");
    p.draft = &ops;
    p.spec_p_min = 1.5f;
    cr_assert_eq(srv_sched_create(&p, &ops, &loop, &s), SRV_SCHED_ERR_INVALID, "p_min above 1");
    cr_assert_null(s);
    cr_assert_eq(uv_loop_close(&loop), 0);
    srv_engine_ops_release(&ops);
    srv_engine_ops_release(&oops);
    eng_ctx_free(ctx);
    eng_ctx_free(octx);
    eng_model_free(other);
    eng_model_free(model);
}
