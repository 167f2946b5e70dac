/* test_sched_engine.c: the scheduler over the REAL engine (server/engine_ops.c, eng_decode, eng_sampler,
 * the tokenizer and detokenizer) with stories260K from ../shared. Concurrent requests in a KV pool small
 * enough to preempt, with shared prefixes and n > 1, must produce exactly the tokens and text that each
 * request produces alone in a roomy pool. Skips when the model is absent. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "server/scheduler.h"

#define MAXT 256
#define MAXC 2

typedef struct res {
    int32_t n;
    int32_t toks[MAXC][MAXT];
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
    for (int32_t i = 0; i < ev->n_samples && r->n_toks[c] < MAXT; i++) r->toks[c][r->n_toks[c]++] = ev->samples[i].token;
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

/* Runs the specs concurrently on a context with kv_blocks blocks; returns the number of preemptions. */
static uint64_t run(eng_model *model, const spec *sp, int n, int32_t kv_blocks, res *out) {
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_threads = 1;
    cp.n_ctx = 256;
    cp.max_seqs = 8;
    cp.max_batch_tokens = 48;
    cp.kv_block_size = 16;
    cp.kv_blocks = kv_blocks;
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
    p.batch_tokens = 48;
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
    cr_assert_eq(st.preemptions_repeated, 0);
    srv_sched_free(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0);
    char msg[256];
    cr_assert_eq(kvc_check(eng_ctx_cache(ctx), msg, sizeof msg), KVC_OK, "%s", msg);
    srv_engine_ops_release(&ops);
    eng_ctx_free(ctx);
    return st.preemptions;
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
        cr_assert_eq(together[i].order_errors, 0);
        cr_assert_eq(together[i].usage.completion_tokens, alone->usage.completion_tokens, "req %d", i);
        for (int c = 0; c < sp[i].n; c++) {
            cr_assert_eq(together[i].n_toks[c], alone->n_toks[c], "req %d choice %d", i, c);
            cr_assert(memcmp(together[i].toks[c], alone->toks[c], (size_t)alone->n_toks[c] * sizeof(int32_t)) == 0,
                      "req %d choice %d: tokens differ from the request run alone", i, c);
            cr_assert_eq(together[i].text_len[c], alone->text_len[c]);
            cr_assert(memcmp(together[i].text[c], alone->text[c], alone->text_len[c]) == 0);
            cr_assert_eq(together[i].finish[c], SRV_SCHED_FINISH_LENGTH);
        }
    }
    free(together);
    free(alone);
    eng_model_free(model);
}
