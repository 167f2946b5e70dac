/* test_sched_encoder.c: the scheduler over a real encoder (a bert reranker written by `kvserve mkmodel --arch bert
 * --rerank`): embedding requests (mean and cls pooling) and rank requests submitted together into a small token
 * budget and KV pool give bit for bit the vectors and scores each gives alone; an encoder's prompt is never split
 * across steps; no KV block stays used; and what an encoder cannot do is refused at submit. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "cache/kv_cache.h"
#include "helper_rng.h"
#include "helper_shared.h"
#include "helper_sched.h"
#include "server/sched/sched.h"

enum { NREQ = 14, MAXP = 60, E = 64 };

typedef struct out {
    float v[E];
    int32_t n;
    srv_sched_finish finish;
    int *n_done;
} out;

static void on_event(const srv_sched_event *ev, void *user) {
    out *o = user;
    if (ev->type != SRV_SCHED_EV_DONE) return;
    o->finish = ev->finish;
    o->n = ev->embd ? ev->n_embd : 0;
    if (ev->embd && ev->n_embd <= E) memcpy(o->v, ev->embd, (size_t)ev->n_embd * sizeof(float));
    (*o->n_done)++;
}

typedef struct req { int32_t tok[MAXP]; int32_t n; srv_sched_pooling pool; } req;

/* Runs reqs[0..n) submitted together (or one by one when alone) into a scheduler of batch_tokens 64 and a pool of
 * kv_blocks blocks; checks the pool is empty afterwards. */
static void run(eng_model *m, const req *reqs, int n, bool alone, int32_t kv_blocks, out *res) {
    eng_ctx *ctx = schedt_cpu_ctx(m, 2, 128, 8, 64, kv_blocks);
    srv_engine_ops ops;
    cr_assert_eq(srv_engine_ops_init(&ops, m, ctx), SRV_SCHED_OK);
    cr_assert(ops.whole_prompts);
    cr_assert_eq(ops.n_rank, 1);
    uv_loop_t loop;
    uv_loop_init(&loop);
    srv_sched_params p;
    srv_sched_params_default(&p);
    p.batch_tokens = 64;
    p.parallel = 8;
    p.n_ctx = 128;
    srv_sched *s = NULL;
    cr_assert_eq(srv_sched_create(&p, &ops, &loop, &s), SRV_SCHED_OK);
    int n_done = 0;
    for (int i = 0; i < n; i++) {
        memset(&res[i], 0, sizeof res[i]);
        res[i].n_done = &n_done;
        cr_assert_eq(schedt_submit_pooled(s, reqs[i].tok, reqs[i].n, reqs[i].pool, on_event, &res[i]), SRV_SCHED_OK);
        while (alone && n_done < i + 1) uv_run(&loop, UV_RUN_ONCE);
    }
    while (n_done < n) uv_run(&loop, UV_RUN_ONCE);
    /* what an encoder refuses */
    srv_sched_request bad;
    memset(&bad, 0, sizeof bad);
    int32_t long_prompt[65] = {0};
    bad.prompt = long_prompt;
    bad.n_prompt = 4;
    bad.n = 1;
    bad.max_tokens = 4;
    eng_sampling_params_default(&bad.sampling);
    bad.cb = on_event;
    uint64_t id;
    cr_assert_eq(srv_sched_submit(s, &bad, &id), KVS_ERR_UNSUPPORTED, "generation on an encoder");
    bad.embed = true;
    bad.n_prompt = 65;
    cr_assert_eq(srv_sched_submit(s, &bad, &id), SRV_SCHED_ERR_TOO_LONG, "a prompt past batch_tokens");
    srv_sched_stats st;
    srv_sched_get_stats(s, &st);
    cr_assert_eq(st.kv_blocks_used, 0, "an encoder's requests keep no KV block");
    kvc_stats ks;
    kvc_get_stats(eng_ctx_cache(ctx), &ks);
    cr_assert_eq(ks.blocks_cached, 0, "nor any cached one");
    cr_assert(st.counters.steps > 0);
    srv_sched_free(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0);
    char msg[256];
    cr_assert_eq(kvc_check(eng_ctx_cache(ctx), msg, sizeof msg), KVC_OK, "%s", msg);
    srv_engine_ops_release(&ops);
    eng_ctx_free(ctx);
}

Test(sched_encoder, together_equals_alone) {
    char dir[64] = "/tmp/kvs-schedenc-XXXXXX", path[128], log[128];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/rr.gguf", dir);
    const char *args[] = {"mkmodel", "-o", path, "--arch", "bert", "--rerank", "--embd", "64", "--layers", "2",
                          "--heads", "4", "--ff", "128", "--ctx", "128", "--type", "q8_0", NULL};
    cr_assert_eq(kvt_run_kvserve(dir, args, NULL), 0);
    eng_model *m = NULL;
    char err[256];
    cr_assert_eq(eng_model_load(path, NULL, &m, err, sizeof err), 0, "%s", err);
    req reqs[NREQ];
    rng r = {99};
    const int32_t V = eng_model_hparams(m)->n_vocab;
    static const srv_sched_pooling pools[] = {SRV_SCHED_POOL_MEAN, SRV_SCHED_POOL_CLS, SRV_SCHED_POOL_RANK,
                                              SRV_SCHED_POOL_LAST};
    for (int i = 0; i < NREQ; i++) {
        reqs[i].n = 3 + rng_int(&r, MAXP - 3);
        reqs[i].pool = pools[i % 4];
        for (int32_t k = 0; k < reqs[i].n; k++) reqs[i].tok[k] = 5 + rng_int(&r, V - 5);
    }
    out together[NREQ], alone[NREQ];
    run(m, reqs, NREQ, false, 10, together); /* 10 blocks of 16: at most a few prompts at once */
    run(m, reqs, NREQ, true, 64, alone);
    for (int i = 0; i < NREQ; i++) {
        cr_assert_eq(together[i].finish, SRV_SCHED_FINISH_STOP, "request %d", i);
        cr_assert_eq(together[i].n, reqs[i].pool == SRV_SCHED_POOL_RANK ? 1 : E, "request %d", i);
        cr_assert_eq(alone[i].n, together[i].n);
        cr_assert(!memcmp(together[i].v, alone[i].v, (size_t)together[i].n * sizeof(float)),
                  "request %d (pooling %d): together and alone differ", i, (int)reqs[i].pool);
    }
    eng_model_free(m);
    snprintf(log, sizeof log, "%s/log", dir);
    unlink(log);
    unlink(path);
    rmdir(dir);
}
