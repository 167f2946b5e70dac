/* sched_policy.c: who runs. Admission of the queue's head (the KV blocks a request needs, how many the running
 * requests still need, shared prompt blocks counted once) and preemption (the least urgent running request,
 * by (priority, arrival), gives its blocks back and is recomputed later). See sched.h for the contract. */
#include "server/sched/sched_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- preemption --------------------------------------------------------------------------------------------- */
/* Frees the request's sequences and puts it back in the waiting queue at its (priority, arrival) place (ahead
 * of every request of its priority that arrived after it). Samplers, detokenizers, stop matchers and generated
 * tokens are kept. */
void sched_preempt(srv_sched *s, sched_req *r) {
    sched_trace(s, SRV_SCHED_TRACE_PREEMPTED, r, r->protect);
    for (int32_t i = 0; i < r->rq.n; i++) {
        sched_choice *c = &r->ch[i];
        if (c->seq >= 0) {
            srv_block_manager_seq_close(&s->bm, c->seq);
            c->seq = -1;
            c->n_cached = 0;
        }
        sched_draft_drop(s, c); /* a waiting request holds no draft sequence either */
    }
    if (r->protect) s->counters.preemptions_repeated++;
    s->counters.preemptions++;
    r->timings.n_preempted++;
    r->protect = true;
    r->preempt_step = s->step_no;
    s->seqs_reserved -= r->n_unfinished;
    sched_vec_remove(&s->running, r);
    r->running = false;
    if (sched_vec_insert_sorted(&s->waiting, r) != 0) {
        /* cannot requeue: end it rather than lose it */
        for (int32_t i = 0; i < r->rq.n; i++)
            sched_finish_choice(s, r, &r->ch[i], SRV_SCHED_FINISH_ERROR, "out of memory");
        sched_emit_outputs(s, r);
    }
}

/* The request to preempt when the pool is full: among the running requests of the largest priority value (the
 * least urgent; all of them under FCFS), the latest-arrived one that has made progress since its last
 * preemption; failing that, the latest-arrived of them (a repeated preemption, counted). NULL when fewer than
 * two requests run (a request alone is never preempted). */
sched_req *sched_pick_victim(srv_sched *s) {
    if (s->running.n < 2) return NULL;
    sched_req *last = s->running.v[s->running.n - 1];
    for (int32_t i = s->running.n - 1; i >= 0 && s->running.v[i]->rq.priority == last->rq.priority; i--)
        if (!s->running.v[i]->protect) return s->running.v[i];
    return last;
}

/* Ends choice c with "length" because its context no longer fits the whole pool (not max_tokens, not n_ctx):
 * marked so that its CHOICE_END says so (truncated) and counted (stats.counters.choices_truncated). */
void sched_cut_by_pool(srv_sched *s, sched_req *r, sched_choice *c) {
    if (c->finished) return;
    c->pool_cut = true;
    s->counters.choices_truncated++;
    sched_finish_choice(s, r, c, SRV_SCHED_FINISH_LENGTH, NULL);
}

/* Ends the unfinished choices of a request that cannot fit the pool even alone: "length" for a choice that
 * has generated (its context outgrew the pool), an error for one that has not (its prompt does not fit). */
void sched_finish_no_room(srv_sched *s, sched_req *r) {
    for (int32_t j = 0; j < r->rq.n; j++) {
        sched_choice *c = &r->ch[j];
        if (c->n_gen > 0) sched_cut_by_pool(s, r, c);
        else sched_finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "prompt does not fit in the KV cache");
    }
}

/* Blocks the request needs for its whole known context (+1 token), shared prompt blocks counted once. */
static int64_t context_blocks(const srv_sched *s, const sched_req *r) {
    int64_t bs = s->block_size, total = 0;
    bool first = true;
    for (int32_t i = 0; i < r->rq.n; i++) {
        const sched_choice *c = &r->ch[i];
        if (c->finished) continue;
        int64_t b = ((int64_t)known_len(r, c) + 1 + bs - 1) / bs;
        if (!first) b -= (c->shctx ? r->rq.n_keep : r->rq.n_prompt) / bs; /* a shifted context shares only its head */
        total += b;
        first = false;
    }
    return total;
}

static sched_choice *first_unfinished(sched_req *r) {
    for (int32_t i = 0; i < r->rq.n; i++)
        if (!r->ch[i].finished) return &r->ch[i];
    return NULL;
}

/* Blocks the running requests still need to reach their known length plus one more token per choice: a new
 * request is admitted only into what is left, so that admitted requests (in particular preempted ones that
 * recompute) can finish their prompts without preempting each other. */
static int64_t running_demand(srv_sched *s) {
    int64_t total = 0, bs = s->block_size;
    for (int32_t i = 0; i < s->running.n; i++) {
        sched_req *r = s->running.v[i];
        for (int32_t j = 0; j < r->rq.n; j++) {
            sched_choice *c = &r->ch[j];
            if (c->finished) continue;
            if (c->seq >= 0) {
                int32_t n = srv_block_manager_needed(&s->bm, c->seq, known_len(r, c) - c->n_cached + 1);
                if (n > 0) total += n;
            } else if (!(c->idx > 0 && c->n_gen == 0)) {
                total += ((int64_t)known_len(r, c) + 1 + bs - 1) / bs;
            } else {
                total += 1 + (r->rq.n_prompt % bs != 0); /* copied partial block + growth */
            }
        }
    }
    return total;
}

/* Full blocks of c's attachable prefix that a running sequence already holds (so they are in use and would be
 * shared by attaching): the longest such common prefix, in blocks. */
static int32_t shared_in_use(srv_sched *s, const sched_req *r, const sched_choice *c) {
    int32_t n = known_len(r, c) - 1, best = 0;
    if (n < s->block_size) return 0;
    for (int32_t i = 0; i < s->running.n; i++) {
        const sched_req *p = s->running.v[i];
        for (int32_t j = 0; j < p->rq.n; j++) {
            const sched_choice *d = &p->ch[j];
            if (d->finished || d->seq < 0) continue;
            int32_t lim = n < d->n_cached ? n : d->n_cached, l = 0;
            if (d->clean < lim) lim = d->clean;
            if (lim / s->block_size <= best) continue;
            while (l < lim && token_at(r, c, l) == token_at(p, d, l)) l++;
            if (l / s->block_size > best) best = l / s->block_size;
        }
    }
    return best;
}

/* Tries to admit the head of the waiting queue. Returns 1 when admitted, 0 when it must wait (nothing behind
 * it is admitted either), -1 when it was finished instead (does not fit, sampler failure). */
int sched_admit_head(srv_sched *s) {
    sched_req *r = s->waiting.v[0];
    if (s->seqs_reserved + r->n_unfinished > s->p.parallel) return 0;
    int64_t need = context_blocks(s, r);
    if (need > s->blocks_total) {
        sched_finish_no_room(s, r);
        return -1;
    }
    sched_choice *c0 = first_unfinished(r);
    /* Prefix blocks that a running sequence holds are shared, not allocated: they are credited. Blocks that
     * are merely cached are not: attaching them takes them out of the available count just as computing
     * them would. The blocks this step already reserved are part of the running requests' demand. */
    if (r->preempt_step == s->step_no) return 0; /* not back in the step that preempted it */
    if (need - shared_in_use(s, r, c0) > srv_block_manager_available(&s->bm) - running_demand(s)) return 0;
    if (!(c0->idx > 0 && c0->n_gen == 0) && sched_prefix_wait(s, r, c0)) return 0;
    for (int32_t i = 0; i < r->rq.n; i++) {
        sched_choice *c = &r->ch[i];
        if (c->finished || c->sampler) continue;
        eng_sampling_params sp = r->rq.sampling;
        sp.seed = r->rq.sampling.seed + (uint64_t)i;
        if (s->ops.sampler_create(s->ops.ctx, &sp, &c->sampler) != 0) {
            c->sampler = NULL;
            for (int32_t j = 0; j < r->rq.n; j++)
                sched_finish_choice(s, r, &r->ch[j], SRV_SCHED_FINISH_ERROR, "cannot create a sampler");
            return -1;
        }
        if (r->rq.penalize_prompt && s->ops.sampler_accept)
            for (int32_t k = 0; k < r->rq.n_prompt; k++) s->ops.sampler_accept(s->ops.ctx, c->sampler, r->prompt[k]);
    }
    sched_vec_remove(&s->waiting, r);
    if (sched_vec_insert_sorted(&s->running, r) != 0) {
        (void)sched_vec_insert(&s->waiting, 0, r);
        return 0;
    }
    r->running = true;
    sched_trace(s, SRV_SCHED_TRACE_ADMITTED, r, false);
    s->seqs_reserved += r->n_unfinished;
    if (r->timings.t_start == 0) r->timings.t_start = uv_hrtime();
    if (!r->admitted_once) {
        r->admitted_once = true;
        uv_mutex_lock(&s->mu);
        s->n_queued_new--;
        s->n_queued_tokens -= r->rq.n_prompt;
        uv_mutex_unlock(&s->mu);
        s->counters.prompt_tokens_total += (uint64_t)r->rq.n_prompt;
    }
    return 1;
}

void sched_relieve_pool(srv_sched *s) {
    sched_req *victim = sched_pick_victim(s);
    if (victim) {
        sched_preempt(s, victim);
        return;
    }
    /* a single running request that cannot progress: it does not fit the pool */
    sched_req *r = s->running.v[0];
    sched_finish_no_room(s, r);
    sched_emit_outputs(s, r);
}
