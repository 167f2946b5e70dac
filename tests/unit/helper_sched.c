/* helper_sched.c: requests the scheduler tests build alike (see helper_sched.h). */
#include "helper_sched.h"

#include <string.h>

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
