/* helper_sched.h: requests the scheduler tests build alike (helper_sched.c). */
#ifndef KVSERVE_TEST_HELPER_SCHED_H
#define KVSERVE_TEST_HELPER_SCHED_H

#include <stdint.h>
#include "server/sched/sched.h"

/* Submits to s one pooled request (embed, n = 1, default sampling) for the prompt tok[0..n) (copied by the
 * scheduler), pooled by `pool`; its events go to cb(ev, user). Returns srv_sched_submit's code. */
int schedt_submit_pooled(srv_sched *s, const int32_t *tok, int32_t n, srv_sched_pooling pool, srv_sched_event_cb cb,
                         void *user);

#endif
