/* test_sched_engine.c: the scheduler over the REAL engine (server/sched/engine_ops.c, eng_decode, eng_sampler,
 * the tokenizer and detokenizer). Concurrent requests in a KV pool small enough to preempt, with shared
 * prefixes and n > 1, must produce exactly the tokens, text and logprobs (bit for bit) that each request
 * produces alone in a roomy pool: a token's numbers must not depend on how it was scheduled (decode step,
 * prefill chunk, recompute after preemption, prefix-cache hit, batch size). Two models: stories260K from
 * ../shared (skipped when absent) and a random-weight model written by `kvserve mkmodel`, whose flat
 * distributions turn any numeric drift into different tokens. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "server/sched/sched.h"

#define MAXT 256
#define MAXC 2

typedef struct res {
    int32_t n;
    int32_t toks[MAXC][MAXT];
    float lp[MAXC][MAXT];      /* each token's logprob */
    float top[MAXC][MAXT][2];  /* and the two best alternatives' */
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
    int32_t prompt[128];
    int32_t n_prompt;
    int32_t n;
    int32_t max_tokens;
    float temp;
    uint64_t seed;
} spec;

static const char *model_path(char *buf, size_t cap) {
    const char *dir = getenv("KVSERVE_SHARED");
    if (!dir || !dir[0]) dir = KVSERVE_SHARED_DIR;
    snprintf(buf, cap, "%s/models/stories260K.gguf", dir);
    FILE *f = fopen(buf, "rb");
    if (!f) return NULL;
    fclose(f);
    return buf;
}

/* How the engine and scheduler are shaped for one run. */
typedef struct shape {
    int32_t kv_blocks;
    int32_t batch_tokens;
    int32_t n_threads;
} shape;

/* Runs the specs concurrently on a context shaped by sh; returns the number of preemptions. */
static uint64_t run_shaped(eng_model *model, const spec *sp, int n, shape sh, res *out) {
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_threads = sh.n_threads;
    cp.n_ctx = 256;
    cp.max_seqs = 8;
    cp.max_batch_tokens = sh.batch_tokens;
    cp.kv_block_size = 16;
    cp.kv_blocks = sh.kv_blocks;
    cp.device = ENG_DEVICE_CPU;
    eng_ctx *ctx = NULL;
    char err[256] = "";
    cr_assert_eq(eng_ctx_create(model, &cp, &ctx, err, sizeof err), ENG_OK, "%s", err);
    srv_engine_ops ops;
    cr_assert_eq(srv_engine_ops_init(&ops, model, ctx), SRV_SCHED_OK);
    uv_loop_t loop;
    uv_loop_init(&loop);
    srv_sched_params p;
    srv_sched_params_default(&p);
    p.batch_tokens = sh.batch_tokens;
    p.parallel = 8;
    p.n_ctx = 256;
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
        rq.cb = on_event;
        rq.user = &out[i];
        uint64_t id;
        cr_assert_eq(srv_sched_submit(s, &rq, &id), SRV_SCHED_OK);
    }
    while (n_done < n) uv_run(&loop, UV_RUN_ONCE);
    srv_sched_stats st;
    srv_sched_get_stats(s, &st);
    cr_assert_eq(st.kv_blocks_used, 0);
    cr_assert_eq(st.counters.preemptions_repeated, 0);
    srv_sched_free(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0);
    char msg[256];
    cr_assert_eq(kvc_check(eng_ctx_cache(ctx), msg, sizeof msg), KVC_OK, "%s", msg);
    srv_engine_ops_release(&ops);
    eng_ctx_free(ctx);
    return st.counters.preemptions;
}

static uint64_t run(eng_model *model, const spec *sp, int n, int32_t kv_blocks, res *out) {
    return run_shaped(model, sp, n, (shape){kv_blocks, 48, 1}, out);
}

/* Every choice of `got` equals `want` in tokens, text, finish reason and logprobs (bit for bit). */
static void assert_same(const res *got, const res *want, int32_t n, const char *what, int i) {
    cr_assert_eq(got->order_errors, 0);
    cr_assert_eq(got->usage.completion_tokens, want->usage.completion_tokens, "%s req %d", what, i);
    for (int c = 0; c < n; c++) {
        int32_t nt = want->n_toks[c];
        cr_assert_eq(got->n_toks[c], nt, "%s req %d choice %d", what, i, c);
        cr_assert(memcmp(got->toks[c], want->toks[c], (size_t)nt * sizeof(int32_t)) == 0,
                  "%s req %d choice %d: tokens differ from the request run alone", what, i, c);
        for (int32_t k = 0; k < nt; k++)
            cr_assert(memcmp(&got->lp[c][k], &want->lp[c][k], sizeof(float)) == 0 &&
                          memcmp(got->top[c][k], want->top[c][k], sizeof got->top[c][k]) == 0,
                      "%s req %d choice %d token %d: logprob %.9g / top %.9g %.9g, alone %.9g / %.9g %.9g", what, i,
                      c, k, (double)got->lp[c][k], (double)got->top[c][k][0], (double)got->top[c][k][1],
                      (double)want->lp[c][k], (double)want->top[c][k][0], (double)want->top[c][k][1]);
        cr_assert_eq(got->text_len[c], want->text_len[c]);
        cr_assert(memcmp(got->text[c], want->text[c], want->text_len[c]) == 0);
        cr_assert_eq(got->finish[c], want->finish[c]);
    }
}

Test(sched_engine, concurrent_equals_alone_on_stories260K) {
    char path[1024];
    if (!model_path(path, sizeof path)) cr_skip_test("models/stories260K.gguf not found in ../shared (KVSERVE_SHARED)");
    eng_load_params lp;
    eng_load_params_default(&lp);
    eng_model *model = NULL;
    char err[256] = "";
    cr_assert_eq(eng_model_load(path, &lp, &model, err, sizeof err), ENG_OK, "%s", err);
    static const char *const texts[] = {
        "Once upon a time, there was a little girl named Lily. She loved to play",
        "Once upon a time, there was a little girl named Lily. She had a big red ball",
        "Once upon a time, there was a little boy named Tom. He",
        "The cat sat on the mat and looked at the",
        "Once upon a time, there was a little girl named Lily. She loved to play",
        "One day, a big dog came to the park.",
    };
    enum { NR = 6 };
    spec sp[NR];
    for (int i = 0; i < NR; i++) {
        memset(&sp[i], 0, sizeof sp[i]);
        cr_assert_eq(eng_tokenize(model, texts[i], strlen(texts[i]), true, false, sp[i].prompt, 128, &sp[i].n_prompt),
                     ENG_OK);
        sp[i].n = i % 3 == 0 ? 2 : 1;
        sp[i].max_tokens = 40 + 7 * i;
        sp[i].temp = i % 2 ? 0.0f : 0.8f;
        sp[i].seed = 42 + (uint64_t)i;
    }
    res *together = calloc(NR, sizeof *together), *alone = calloc(1, sizeof *alone);
    /* 14 blocks of 16 = 224 tokens for ~8 sequences of up to ~110 tokens: preemption is certain */
    uint64_t pre = run(model, sp, NR, 14, together);
    cr_assert_gt(pre, 0, "the small pool never preempted");
    for (int i = 0; i < NR; i++) {
        run(model, &sp[i], 1, 256, alone);
        assert_same(&together[i], alone, sp[i].n, "stories260K", i);
        for (int c = 0; c < sp[i].n; c++) cr_assert_eq(together[i].finish[c], SRV_SCHED_FINISH_LENGTH);
    }
    free(together);
    free(alone);
    eng_model_free(model);
}

/* Random-weight model (head size 32: the AVX-512 attention kernels where the CPU has them), random prompts
 * sharing prefixes, rounds with random pool sizes, step budgets and thread counts: every request's tokens
 * and logprobs equal those of the request alone, whatever was preempted and recomputed. */
Test(sched_engine, bitwise_under_random_preemption, .timeout = 300) {
    char dir[] = "/tmp/kvs_schedeng_XXXXXX", path[256], cmd[512];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    snprintf(cmd, sizeof cmd, "'%s' mkmodel -o '%s' --preset default >/dev/null 2>&1", KVSERVE_BINARY, path);
    cr_assert_eq(system(cmd), 0, "%s failed", cmd);
    eng_load_params lp;
    eng_load_params_default(&lp);
    eng_model *model = NULL;
    char err[256] = "";
    cr_assert_eq(eng_model_load(path, &lp, &model, err, sizeof err), ENG_OK, "%s", err);
    int32_t n_vocab = eng_model_hparams(model)->n_vocab;

    enum { NR = 7 };
    uint64_t rs = 0x9e3779b97f4a7c15ull;
#define RND() (rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17, rs)
    spec sp[NR];
    int32_t common[48];
    for (int i = 0; i < 48; i++) common[i] = 1 + (int32_t)(RND() % (uint64_t)(n_vocab - 1));
    for (int i = 0; i < NR; i++) {
        memset(&sp[i], 0, sizeof sp[i]);
        /* a shared head of 0..48 tokens (so blocks come from the prefix cache), then the request's own */
        int32_t shared = (int32_t)(RND() % 49), own = 1 + (int32_t)(RND() % 60);
        for (int32_t k = 0; k < shared; k++) sp[i].prompt[k] = common[k];
        for (int32_t k = 0; k < own; k++) sp[i].prompt[shared + k] = 1 + (int32_t)(RND() % (uint64_t)(n_vocab - 1));
        sp[i].n_prompt = shared + own;
        sp[i].n = i % 4 == 1 ? 2 : 1;
        sp[i].max_tokens = 20 + (int32_t)(RND() % 60);
        sp[i].temp = i % 3 == 2 ? 0.9f : 0.0f;
        sp[i].seed = 7 + (uint64_t)i;
    }
    res *alone = calloc(NR, sizeof *alone), *together = calloc(NR, sizeof *together);
    cr_assert(alone && together);
    for (int i = 0; i < NR; i++) run_shaped(model, &sp[i], 1, (shape){256, 64, 1}, &alone[i]);
    uint64_t preempted = 0;
    for (int round = 0; round < 4; round++) {
        /* 10..17 blocks of 16 for up to 8 sequences of up to ~190 tokens */
        shape sh; /* one draw per statement: the evaluation order inside an initializer list is unspecified */
        sh.kv_blocks = 10 + (int32_t)(RND() % 8);
        sh.batch_tokens = 16 + (int32_t)(RND() % 49);
        sh.n_threads = 1 + (int32_t)(RND() % 2);
        preempted += run_shaped(model, sp, NR, sh, together);
        char what[96];
        snprintf(what, sizeof what, "round %d (blocks %d, budget %d, threads %d)", round, sh.kv_blocks,
                 sh.batch_tokens, sh.n_threads);
        for (int i = 0; i < NR; i++) assert_same(&together[i], &alone[i], sp[i].n, what, i);
    }
#undef RND
    cr_assert_gt(preempted, 0, "no round preempted");
    free(alone);
    free(together);
    eng_model_free(model);
    remove(path);
    rmdir(dir);
}
