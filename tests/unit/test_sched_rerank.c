/* test_sched_rerank.c: the scheduler over a decoder reranker (a Qwen3-Reranker-style qwen3 written by `kvserve
 * mkmodel --arch qwen3 --rerank` with the Qwen2 vocabulary of the shared test material): rank requests of random
 * prompts, mixed with mean- and last-pooled embedding requests, submitted together into a small token budget
 * (prompts chunked over several steps) and a small KV pool (admission waits for blocks) give bit for bit the values a plain
 * reference gives: the whole prompt decoded in one batch and the head read at its last row (eng_get_rank); the
 * two outputs are p(yes) and p(no); no KV block stays used afterwards. Most rank prompts share a head of 40 tokens
 * (as the pairs of one query share the rerank prompt's head), which the scheduler computes once: rank requests of
 * a decoder attach cached and shared prefixes (their results stay the reference's, bit for bit). */
#include <criterion/criterion.h>
#include <math.h>
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

enum { NREQ = 12, MAXP = 120, E = 64 };

typedef struct out {
    float v[E];
    int32_t n;
    srv_sched_finish finish;
    int *n_done;
} out;

typedef struct req { int32_t tok[MAXP]; int32_t n; srv_sched_pooling pool; } req;

static void on_event(const srv_sched_event *ev, void *user) {
    out *o = user;
    if (ev->type != SRV_SCHED_EV_DONE) return;
    o->finish = ev->finish;
    o->n = ev->embd ? ev->n_embd : 0;
    if (ev->embd && ev->n_embd <= E) memcpy(o->v, ev->embd, (size_t)ev->n_embd * sizeof(float));
    (*o->n_done)++;
}

static eng_ctx *make_ctx(eng_model *m, int32_t kv_blocks) { return schedt_cpu_ctx(m, 2, 256, 8, 128, kv_blocks); }

/* The reference: the whole prompt in one batch, every row's hidden state wanted; the head at the last row, or the
 * pooled, L2-normalized hidden states (mean: their sum, as the scheduler sums). */
static void reference(eng_model *m, const req *q, out *o) {
    eng_ctx *ctx = make_ctx(m, 64);
    kvc_cache *kv = eng_ctx_cache(ctx);
    int32_t seq, pos[MAXP], seqs[MAXP];
    bool wl[MAXP], we[MAXP];
    cr_assert_eq(kvc_seq_alloc(kv, &seq), 0);
    for (int32_t i = 0; i < q->n; i++) {
        pos[i] = i;
        seqs[i] = seq;
        wl[i] = false;
        we[i] = true;
    }
    eng_batch b = {.n = q->n, .token = q->tok, .pos = pos, .seq = seqs, .want_logits = wl, .want_embd = we};
    cr_assert_eq(eng_decode(ctx, &b), 0);
    memset(o, 0, sizeof *o);
    if (q->pool == SRV_SCHED_POOL_RANK) {
        const float *h = eng_get_rank(ctx, q->n - 1);
        cr_assert_not_null(h);
        o->n = 2;
        memcpy(o->v, h, 2 * sizeof(float));
    } else {
        double acc[E] = {0}, ss = 0;
        for (int32_t i = q->pool == SRV_SCHED_POOL_LAST ? q->n - 1 : 0; i < q->n; i++) {
            const float *row = eng_get_embeddings(ctx, i);
            cr_assert_not_null(row);
            for (int j = 0; j < E; j++) acc[j] += row[j];
        }
        for (int j = 0; j < E; j++) ss += acc[j] * acc[j];
        for (int j = 0; j < E; j++) o->v[j] = (float)(acc[j] * (ss > 0 ? 1.0 / sqrt(ss) : 0.0));
        o->n = E;
    }
    kvc_seq_free(kv, seq);
    eng_ctx_free(ctx);
}

/* Runs reqs submitted together into a scheduler of batch_tokens 32 and a pool of kv_blocks blocks. */
static void run_together(eng_model *m, const req *reqs, int n, int32_t kv_blocks, out *res) {
    eng_ctx *ctx = make_ctx(m, kv_blocks);
    srv_engine_ops ops;
    cr_assert_eq(srv_engine_ops_init(&ops, m, ctx), SRV_SCHED_OK);
    cr_assert(!ops.whole_prompts);
    cr_assert(ops.rank_last);
    cr_assert_eq(ops.n_rank, 2);
    uv_loop_t loop;
    uv_loop_init(&loop);
    srv_sched_params p;
    srv_sched_params_default(&p);
    p.batch_tokens = 32;
    p.parallel = 8;
    p.n_ctx = 256;
    srv_sched *s = NULL;
    cr_assert_eq(srv_sched_create(&p, &ops, &loop, &s), SRV_SCHED_OK);
    int n_done = 0;
    uint64_t n_total = 0;
    for (int i = 0; i < n; i++) {
        n_total += (uint64_t)reqs[i].n;
        memset(&res[i], 0, sizeof res[i]);
        res[i].n_done = &n_done;
        cr_assert_eq(schedt_submit_pooled(s, reqs[i].tok, reqs[i].n, reqs[i].pool, on_event, &res[i]), SRV_SCHED_OK);
    }
    while (n_done < n) uv_run(&loop, UV_RUN_ONCE);
    srv_sched_stats st;
    srv_sched_get_stats(s, &st);
    cr_assert_eq(st.kv_blocks_used, 0, "the rank requests keep no KV block in use");
    cr_assert(st.counters.steps > (uint64_t)n, "the prompts were chunked over several steps");
    cr_assert_lt(st.counters.prompt_tokens_computed, n_total, "the shared head was computed once (%llu of %llu)",
                 (unsigned long long)st.counters.prompt_tokens_computed, (unsigned long long)n_total);
    srv_sched_free(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0);
    char msg[256];
    cr_assert_eq(kvc_check(eng_ctx_cache(ctx), msg, sizeof msg), KVC_OK, "%s", msg);
    srv_engine_ops_release(&ops);
    eng_ctx_free(ctx);
}

Test(sched_rerank, decoder_reranker_together_equals_one_batch) {
    char vocab[512];
    snprintf(vocab, sizeof vocab, "%s/models/vocab-only/ggml-vocab-qwen2.gguf", kvt_shared_dir());
    if (access(vocab, R_OK) != 0) cr_skip_test("%s is absent (the shared test material)", vocab);
    char dir[64] = "/tmp/kvs-schedrr-XXXXXX", path[128], log[128];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/rr.gguf", dir);
    const char *args[] = {"mkmodel", "-o", path, "--arch", "qwen3", "--rerank", "--tied", "--vocab-from", vocab,
                          "--embd", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ff", "128",
                          "--ctx", "256", "--type", "q8_0", "--std", "0.15", NULL};
    cr_assert_eq(kvt_run_kvserve(dir, args, NULL), 0);
    eng_model *m = NULL;
    char err[256];
    cr_assert_eq(eng_model_load(path, NULL, &m, err, sizeof err), 0, "%s", err);
    cr_assert(eng_model_rank_last(m));
    cr_assert_not_null(eng_model_rerank_prompt(m));
    req reqs[NREQ];
    rng r = {4242};
    const int32_t V = eng_model_hparams(m)->n_vocab;
    static const srv_sched_pooling pools[] = {SRV_SCHED_POOL_RANK, SRV_SCHED_POOL_RANK, SRV_SCHED_POOL_MEAN,
                                              SRV_SCHED_POOL_RANK, SRV_SCHED_POOL_LAST};
    int32_t head[40];
    for (int k = 0; k < 40; k++) head[k] = rng_int(&r, V);
    for (int i = 0; i < NREQ; i++) {
        reqs[i].pool = pools[i % 5];
        bool shared = reqs[i].pool == SRV_SCHED_POOL_RANK && i % 4 != 3;
        reqs[i].n = (shared ? 41 : 2) + rng_int(&r, MAXP - (shared ? 41 : 2));
        for (int32_t k = 0; k < reqs[i].n; k++) reqs[i].tok[k] = shared && k < 40 ? head[k] : rng_int(&r, V);
    }
    out together[NREQ], ref;
    run_together(m, reqs, NREQ, 12, together); /* 12 blocks of 16: prompts wait for blocks */
    for (int i = 0; i < NREQ; i++) {
        reference(m, &reqs[i], &ref);
        cr_assert_eq(together[i].finish, SRV_SCHED_FINISH_STOP, "request %d", i);
        cr_assert_eq(together[i].n, ref.n, "request %d", i);
        cr_assert(!memcmp(together[i].v, ref.v, (size_t)ref.n * sizeof(float)),
                  "request %d (pooling %d, %d tokens): the scheduler's %.9g differs from the one-batch reference %.9g",
                  i, (int)reqs[i].pool, (int)reqs[i].n, together[i].v[0], ref.v[0]);
        if (reqs[i].pool == SRV_SCHED_POOL_RANK) {
            cr_assert(ref.v[0] > 0.0f && ref.v[0] < 1.0f, "request %d: p(yes) %g", i, ref.v[0]);
            cr_assert(fabsf(ref.v[0] + ref.v[1] - 1.0f) < 1e-6f, "request %d: p(yes) + p(no) = %g", i,
                      ref.v[0] + ref.v[1]);
        }
    }
    eng_model_free(m);
    snprintf(log, sizeof log, "%s/log", dir);
    unlink(log);
    unlink(path);
    rmdir(dir);
}
