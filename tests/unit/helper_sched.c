/* helper_sched.c: the contexts and requests the scheduler tests build alike (see helper_sched.h). */
#include "helper_sched.h"

#include <criterion/criterion.h>
#include <string.h>

eng_ctx *schedt_cpu_ctx(eng_model *m, int32_t n_threads, int32_t n_ctx, int32_t max_seqs, int32_t max_batch_tokens,
                        int32_t kv_blocks) {
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_threads = n_threads;
    cp.n_ctx = n_ctx;
    cp.max_seqs = max_seqs;
    cp.max_batch_tokens = max_batch_tokens;
    cp.kv_block_size = 16;
    cp.kv_blocks = kv_blocks;
    cp.device = ENG_DEVICE_CPU;
    eng_ctx *ctx = NULL;
    char err[256] = "";
    cr_assert_eq(eng_ctx_create(m, &cp, &ctx, err, sizeof err), ENG_OK, "%s", err);
    return ctx;
}

int schedt_submit_pooled(srv_sched *s, const int32_t *tok, int32_t n, srv_sched_pooling pool, srv_sched_event_cb cb,
                         void *user) {
    srv_sched_request rq;
    memset(&rq, 0, sizeof rq);
    rq.prompt = tok;
    rq.n_prompt = n;
    rq.n = 1;
    eng_sampling_params_default(&rq.sampling);
    rq.embed = true;
    rq.pooling = pool;
    rq.cb = cb;
    rq.user = user;
    uint64_t id;
    return srv_sched_submit(s, &rq, &id);
}
