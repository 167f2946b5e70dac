/* helper_sched.h: the contexts and requests the scheduler tests build alike (helper_sched.c). */
#ifndef KVSERVE_TEST_HELPER_SCHED_H
#define KVSERVE_TEST_HELPER_SCHED_H

#include <stdint.h>
#include "engine/engine.h"
#include "server/sched/sched.h"

/* A CPU context of m for the scheduler tests: n_threads, n_ctx, max_seqs, max_batch_tokens and kv_blocks as given,
 * 16-token KV blocks, the rest eng_ctx_params_default's. Fails the test when eng_ctx_create fails. */
eng_ctx *schedt_cpu_ctx(eng_model *m, int32_t n_threads, int32_t n_ctx, int32_t max_seqs, int32_t max_batch_tokens,
                        int32_t kv_blocks);

/* Submits to s one pooled request (embed, n = 1, default sampling) for the prompt tok[0..n) (copied by the
 * scheduler), pooled by `pool`; its events go to cb(ev, user). Returns srv_sched_submit's code. */
int schedt_submit_pooled(srv_sched *s, const int32_t *tok, int32_t n, srv_sched_pooling pool, srv_sched_event_cb cb,
                         void *user);

#endif
