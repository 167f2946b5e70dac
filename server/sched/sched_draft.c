/* sched_draft.c: the draft model's guesses for speculative decoding (sched.h, "Speculative decoding", spec_type
 * SRV_SCHED_SPEC_DRAFT). One draft context serves every sequence: the choices that draft in a step are caught up
 * (their known tokens the draft has not seen, one batched prefill in chunks of batch_tokens rows), then every
 * draft step is one batch with a row per choice still drafting. A guess is the draft's argmax (greedy): the draft
 * is a point mass on it, so verification in sched_spec.c samples the model's rows as plain decoding would and the
 * output keeps the model's distribution at any temperature (the rejection rule with q a point mass).
 *
 * A choice's draft sequence holds its known tokens up to d_base, then the guesses it was fed (guess j at
 * d_base + j). Before the next draft, the positions whose tokens are no longer the choice's known tokens (the
 * guesses that were rejected, or never verified) are removed from it (tail removal); the accepted guesses stay. */
#include "server/sched/sched_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DSTEP_DECAY 0.9 /* weight of the previous estimate of a draft step's time after each measured step */

int sched_draft_init(srv_sched *s) {
    const srv_engine_ops *d = s->p.draft;
    if (!d || !d->cache || !d->decode || !d->get_logits || d->n_vocab != s->ops.n_vocab) return SRV_SCHED_ERR_INVALID;
    kvc_cache *cache = d->cache(d->ctx);
    if (!cache) return SRV_SCHED_ERR_INVALID;
    s->dops = *d;
    s->p.draft = &s->dops;
    srv_block_manager_init(&s->dbm, cache);
    size_t nb = (size_t)s->p.batch_tokens;
    s->d_token = malloc(nb * sizeof *s->d_token);
    s->d_pos = malloc(nb * sizeof *s->d_pos);
    s->d_seq = malloc(nb * sizeof *s->d_seq);
    s->d_group = malloc(nb * sizeof *s->d_group);
    s->d_logits = malloc(nb * sizeof *s->d_logits);
    s->d_got = malloc(nb * sizeof *s->d_got);
    s->d_stop = malloc(nb * sizeof *s->d_stop);
    if (!s->d_token || !s->d_pos || !s->d_seq || !s->d_group || !s->d_logits || !s->d_got || !s->d_stop)
        return SRV_SCHED_ERR_NOMEM;
    return SRV_SCHED_OK;
}

void sched_draft_release(srv_sched *s) {
    KVS_FREE_ALL(s->d_token, s->d_pos, s->d_seq, s->d_group, s->d_logits, s->d_got, s->d_stop);
    s->d_token = s->d_pos = s->d_seq = s->d_group = s->d_got = NULL;
    s->d_logits = s->d_stop = NULL;
}

void sched_draft_drop(srv_sched *s, sched_choice *c) {
    if (!c->draft_open) return;
    srv_block_manager_seq_close(&s->dbm, c->dseq);
    c->draft_open = false;
    c->dseq = -1;
    c->d_len = c->d_base = 0;
}

/* Opens the choice's draft sequence, or cuts it back to the positions that still hold its known tokens (len of
 * them). false when it cannot draft this step. */
static bool draft_ready(srv_sched *s, const sched_req *r, sched_choice *c, int32_t len) {
    if (!c->draft_open) {
        if (srv_block_manager_seq_open(&s->dbm, &c->dseq) != KVS_OK) return false;
        c->draft_open = true;
        c->d_len = c->d_base = 0;
        return true;
    }
    int32_t v = c->d_len < c->d_base ? c->d_len : c->d_base;
    while (v < c->d_len && v < len && v - c->d_base < SRV_SCHED_SPEC_MAX &&
           token_at(r, c, v) == c->draft[v - c->d_base])
        v++;
    if (v > len - 1) v = len - 1; /* the last known token is the next input: its logits are needed */
    if (v < c->d_len && srv_block_manager_truncate(&s->dbm, c->dseq, v) != KVS_OK) {
        sched_draft_drop(s, c);
        return draft_ready(s, r, c, len);
    }
    c->d_len = v;
    c->d_base = v; /* no guesses past it any more */
    if (srv_block_manager_seq_len(&s->dbm, c->dseq) != v) { /* defensive: start the sequence over */
        sched_draft_drop(s, c);
        return draft_ready(s, r, c, len);
    }
    return true;
}

/* The draft's greedy token in logits[0..n) and its probability (computed only when p_min needs it). */
static int32_t argmax_prob(const float *lg, int32_t n, bool want_p, float *p) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (lg[i] > lg[best]) best = i;
    *p = 1;
    if (want_p) {
        double sum = 0, mx = lg[best];
        for (int32_t i = 0; i < n; i++) sum += exp((double)lg[i] - mx);
        *p = (float)(1.0 / sum);
    }
    return best;
}

/* Runs the draft batch of n rows; for each row with logits, records the guess of its group. got[g]: the guesses
 * made so far, stop[g]: no more for g. Returns the engine's code. */
static int draft_run(srv_sched *s, int32_t n, int32_t *got, bool *stop) {
    eng_batch b = {.n = n, .token = s->d_token, .pos = s->d_pos, .seq = s->d_seq, .want_logits = s->d_logits};
    uint64_t t0 = sched_step_clock(s);
    int rc = s->dops.decode(s->dops.ctx, &b);
    s->counters.spec_draft_ns += sched_step_clock(s) - t0;
    s->counters.spec_draft_calls++;
    if (rc != ENG_OK) return rc;
    s->counters.spec_draft_rows += (uint64_t)n;
    for (int32_t i = 0; i < n; i++) {
        int32_t g = s->d_group[i];
        sched_choice *c = s->groups[g].c;
        c->d_len = s->d_pos[i] + 1;
        if (!s->d_logits[i]) continue;
        float *lg = s->dops.get_logits(s->dops.ctx, i);
        if (!lg) return ENG_ERR_INVALID;
        if (s->groups[g].r->rq.ignore_eos) /* the model will not sample them: neither guess them */
            for (int32_t e = 0; e < s->n_eog; e++) lg[s->eog[e]] = -INFINITY;
        float p;
        int32_t t = argmax_prob(lg, s->dops.n_vocab, s->p.spec_p_min > 0, &p);
        if (p < s->p.spec_p_min) {
            stop[g] = true;
            continue;
        }
        c->draft[got[g]++] = t;
        if (s->ops.token_is_eog(s->ops.ctx, t)) stop[g] = true; /* nothing follows an end of generation */
    }
    return ENG_OK;
}

/* Brings every drafting choice's sequence up to its known tokens; the last one's row gives its first guess. */
static int catch_up(srv_sched *s, int32_t nd, const int32_t *want, int32_t *got, bool *stop) {
    int32_t n = 0, cap = s->p.batch_tokens;
    for (int32_t g = 0; g < nd; g++) {
        if (want[g] <= 0) continue;
        const batch_group *gr = &s->groups[g];
        int32_t len = known_len(gr->r, gr->c);
        for (int32_t pos = gr->c->d_len; pos < len; pos++) {
            if (n == cap) {
                int rc = draft_run(s, n, got, stop);
                if (rc != ENG_OK) return rc;
                n = 0;
            }
            s->d_token[n] = token_at(gr->r, gr->c, pos);
            s->d_pos[n] = pos;
            s->d_seq[n] = gr->c->dseq;
            s->d_group[n] = g;
            s->d_logits[n] = pos == len - 1;
            n++;
        }
        gr->c->d_base = len;
    }
    return n > 0 ? draft_run(s, n, got, stop) : ENG_OK;
}

static void observe_step(srv_sched *s, uint64_t ns) {
    s->d_step_ns = s->d_step_ns > 0 ? s->d_step_ns * DSTEP_DECAY + (double)ns * (1 - DSTEP_DECAY) : (double)ns;
}

void sched_draft_propose(srv_sched *s, int32_t nd, int32_t *want) {
    int32_t *got = s->d_got, maxk = 0;
    bool *stop = s->d_stop;
    /* the draft's pool: a choice drafts only when its catch-up and guesses fit what is left (a full pool would
     * fail the whole batch, and every drafting choice would have to start over) */
    int32_t avail = srv_block_manager_available(&s->dbm);
    for (int32_t g = 0; g < nd; g++) {
        batch_group *gr = &s->groups[g];
        int32_t len = known_len(gr->r, gr->c);
        got[g] = 0;
        stop[g] = false;
        if (want[g] > 0 && !draft_ready(s, gr->r, gr->c, len)) want[g] = 0;
        if (want[g] > 0) {
            int32_t need = srv_block_manager_needed(&s->dbm, gr->c->dseq, len - gr->c->d_len + want[g]);
            if (need < 0 || need > avail) want[g] = 0;
            else avail -= need;
        }
        if (want[g] > maxk) maxk = want[g];
    }
    if (maxk == 0) return;
    int32_t rows = 0, drafting = 0;
    for (int32_t g = 0; g < nd; g++)
        if (want[g] > 0) {
            rows += known_len(s->groups[g].r, s->groups[g].c) - s->groups[g].c->d_len;
            drafting++;
        }
    uint64_t t0 = sched_step_clock(s);
    int rc = catch_up(s, nd, want, got, stop);
    if (rc == ENG_OK && rows == drafting) observe_step(s, sched_step_clock(s) - t0); /* a row each: a draft step */
    if (rc == ENG_OK) s->counters.spec_draft_catchup_rows += (uint64_t)rows;
    for (int32_t j = 1; rc == ENG_OK && j < maxk; j++) {
        int32_t n = 0;
        for (int32_t g = 0; g < nd; g++) {
            sched_choice *c = s->groups[g].c;
            if (want[g] <= j || got[g] != j || stop[g]) continue;
            s->d_token[n] = c->draft[j - 1];
            s->d_pos[n] = c->d_base + j - 1;
            s->d_seq[n] = c->dseq;
            s->d_group[n] = g;
            s->d_logits[n] = true;
            n++;
        }
        if (n == 0) break;
        t0 = sched_step_clock(s);
        rc = draft_run(s, n, got, stop);
        if (rc == ENG_OK) observe_step(s, sched_step_clock(s) - t0);
    }
    if (rc != ENG_OK) {
        /* the draft's pool is full or the engine failed: no guesses this step, and the sequences start over */
        for (int32_t g = 0; g < nd; g++)
            if (want[g] > 0) sched_draft_drop(s, s->groups[g].c);
        for (int32_t g = 0; g < nd; g++) want[g] = 0;
        return;
    }
    for (int32_t g = 0; g < nd; g++) want[g] = want[g] > 0 ? got[g] : 0;
}
