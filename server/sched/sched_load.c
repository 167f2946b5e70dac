/* sched_load.c: a new sequence's prefix from the KV tiers below the pool: the host tier's blocks at once, the disk
 * tier's through an asynchronous fetch (its reads and checks on the tier's loader thread) while the other sequences
 * keep stepping; the sequence waits in the loading state and prefills the rest once its blocks are placed. */
#include "server/sched/sched_internal.h"

int32_t sched_load_begin(srv_sched *s, int32_t seq, const int32_t *toks, int32_t n, int32_t cached, int32_t avail) {
    bool pending = false;
    return srv_block_manager_fetch_start(&s->bm, seq, toks, n, cached, avail, &pending);
}

bool sched_load_pending(srv_sched *s, sched_req *r, sched_choice *c, const int32_t *toks, int32_t avail) {
    if (s->bm.n_fetch == 0 || c->seq < 0) return false;
    int32_t added = 0;
    int st = srv_block_manager_fetch_poll(&s->bm, c->seq, toks, known_len(r, c) - 1, avail > 0 ? avail : 0, &added);
    if (st == 1) return true;
    if (st == 0) return false;
    c->n_cached += added;
    if (c->idx == 0 && c->n_gen == 0 && r->timings.n_preempted == 0) r->usage.cached_tokens = c->n_cached;
    return false;
}

/* Waiting (rather than spinning, and rather than relieving a pool that is not the problem). */
bool sched_load_idle(srv_sched *s) { return srv_block_manager_fetch_wait(&s->bm, 2000000); }
