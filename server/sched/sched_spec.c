/* sched_spec.c: speculative decoding in the scheduler (sched.h, "Speculative decoding"): which decoding choices
 * get guesses and how many (the acceptance estimate per choice, the step cost model), the batch rows of the
 * guesses, and their verification.
 *
 * Verification samples the choice's rows one after the other with the choice's own sampler, exactly as plain
 * decoding samples successive steps, and stops at the first sampled token that is not the guess that follows.
 * Every sampled token is therefore the one plain decoding would have sampled from the same logits, and the CPU
 * forward pass gives a row the same logits whatever it is batched with: the output is plain decoding's, tokens
 * and logprobs, at any temperature and seed. */
#include "server/sched/sched_internal.h"

#include "server/sched/ngram_internal.h"

#include <stdlib.h>
#include <string.h>

#define COST_DECAY 0.98     /* weight of a step's observation in the cost model after each later step */
#define ACC_DECAY 0.8f      /* weight of a choice's acceptance history after each draft */
#define ACC_IDLE_DECAY 0.97f /* ... after each step without guesses: an unlucky estimate drifts back to the prior */
#define G_DECAY 0.9          /* a draft model's scheduler-wide acceptance: weight of the history after each draft */
#define G_IDLE_DECAY 0.995   /* ... after each step: the estimate drifts back to 0.7, so drafting is tried again */
#define DRAFT_OPENS 2        /* a draft model: most choices that start drafting (a catch-up of their whole context)
                                in one step */

/* The request's bounds on its guesses per step: *n_max 0 when it gets none. */
static void req_bounds(const srv_sched *s, const sched_req *r, int32_t *n_max, int32_t *n_min) {
    *n_max = r->rq.spec_n_max < 0 ? s->p.spec_n_max : r->rq.spec_n_max;
    *n_min = r->rq.spec_n_min < 0 ? s->p.spec_n_min : r->rq.spec_n_min;
    if (*n_max > SRV_SCHED_SPEC_MAX) *n_max = SRV_SCHED_SPEC_MAX;
    if (*n_min < 1) *n_min = 1;
    if (r->rq.embed || *n_min > *n_max) *n_max = 0;
}

/* The choice's known tokens in s->spec_buf (grown on demand); NULL when out of memory. */
static const int32_t *spec_tokens(srv_sched *s, const sched_req *r, const sched_choice *c, int32_t n) {
    if (c->shctx) return c->shctx;
    if (c->n_gen == 0) return r->prompt;
    if (n > s->spec_cap) {
        int32_t cap = n + n / 2 + 64;
        int32_t *p = realloc(s->spec_buf, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        s->spec_buf = p;
        s->spec_cap = cap;
    }
    memcpy(s->spec_buf, r->prompt, (size_t)r->rq.n_prompt * sizeof *s->spec_buf);
    memcpy(s->spec_buf + r->rq.n_prompt, c->gen, (size_t)c->n_gen * sizeof *s->spec_buf);
    return s->spec_buf;
}

/* Proposes guesses for decode group g: returns how many were written to its choice's draft (0: none). */
static int32_t propose(srv_sched *s, const batch_group *g) {
    int32_t n_max, n_min;
    req_bounds(s, g->r, &n_max, &n_min);
    /* a choice's first token (its prompt fully cached but for the last token) is sampled by handle_logits, which
     * also forks the prompt into the request's other choices (n > 1): never from a verification */
    if (g->c->n_gen == 0) return 0;
    int32_t len = known_len(g->r, g->c);
    /* no context shift or n_ctx end may happen in the middle of a verification: see sched.h */
    int32_t room = s->p.n_ctx - len - 2;
    if (room < n_max) n_max = room;
    if (n_max < n_min) return 0;
    if (s->p.spec_type == SRV_SCHED_SPEC_DRAFT) return n_max; /* the draft runs once k is chosen */
    const int32_t *toks = spec_tokens(s, g->r, g->c, len);
    if (!toks) return 0;
    int32_t n = srv_ngram_propose(toks, len, s->p.spec_ngram_min, s->p.spec_ngram_max, n_max, g->c->draft);
    return n >= n_min ? n : 0;
}

/* The cost model's slope (ns per extra row) and step time at `rows`; slope 0 until steps of different sizes
 * were seen (then every guess is tried: the model learns from those steps). */
static void cost_at(const sched_cost *m, int32_t rows, double *slope, double *t) {
    *slope = 0;
    *t = 1;
    if (m->w <= 0) return;
    double mx = m->sx / m->w, my = m->sy / m->w;
    double var = m->sxx / m->w - mx * mx, cov = m->sxy / m->w - mx * my;
    double b = var > 1e-6 ? cov / var : 0;
    if (b < 0) b = 0;
    double a = my - b * mx;
    if (a < 1) a = 1;
    *slope = b;
    *t = a + b * rows;
}

void sched_spec_observe(srv_sched *s, int32_t rows, uint64_t ns) {
    if (s->p.spec_type == SRV_SCHED_SPEC_NONE || rows < 1) return;
    sched_cost *m = &s->cost;
    double x = rows, y = (double)ns;
    m->w = m->w * COST_DECAY + 1;
    m->sx = m->sx * COST_DECAY + x;
    m->sy = m->sy * COST_DECAY + y;
    m->sxx = m->sxx * COST_DECAY + x * x;
    m->sxy = m->sxy * COST_DECAY + x * y;
}

/* The choice's estimated chance that a guess is accepted given that the ones before it were: a prior of 0.7 (worth
 * 2 guesses) that its recent drafts move, so a new choice is tried wherever a guess of that quality pays. */
/* With a draft model the prior is what the draft has recently achieved across all choices (starting at 0.7): a
 * new choice's first draft costs a catch-up of its whole context on the draft, which a draft that keeps failing
 * should not be paid for choice after choice. */
static double acc_rate(const srv_sched *s, const sched_choice *c) {
    double prior = s->p.spec_type == SRV_SCHED_SPEC_DRAFT ? (s->g_acc + 1.4) / (s->g_tries + 2.0) : 0.7;
    return (c->spec_acc + 2 * prior) / (c->spec_tries + 2.0);
}

/* Adaptive k: guesses are taken in order of their expected yield (guess j of a choice with rate q is accepted
 * with chance q^j) while each one raises the step's expected tokens per nanosecond: yield v is worth one more
 * row when v / slope > tokens / time. A guess that deepens the step's draft (the first guess j + 1 of any choice)
 * also costs depth_ns, one batched draft step. nd decode groups; want[g] holds the proposals and is lowered. */
static void choose_adaptive(srv_sched *s, int32_t nd, int32_t *want, double depth_ns) {
    double slope, t;
    cost_at(&s->cost, nd, &slope, &t);
    double tokens = nd;
    int32_t kept = 0, offered = 0, depth = 0;
    int32_t *take = s->spec_take;
    for (int32_t g = 0; g < nd; g++) {
        take[g] = 0;
        offered += want[g] > 0;
    }
    for (;;) {
        int32_t best = -1;
        double bv = 0;
        for (int32_t g = 0; g < nd; g++) {
            if (take[g] >= want[g]) continue;
            double q = acc_rate(s, s->groups[g].c), v = q;
            for (int32_t j = 0; j < take[g]; j++) v *= q;
            if (best < 0 || v > bv) {
                best = g;
                bv = v;
            }
        }
        if (best < 0) break;
        double cost = slope + (take[best] == depth ? depth_ns : 0);
        if (bv * t <= cost * tokens) break; /* the best remaining guess does not pay */
        if (take[best] == depth) depth++;
        take[best]++;
        tokens += bv;
        t += cost;
        kept++;
    }
    for (int32_t g = 0; g < nd; g++) want[g] = take[g];
    if (offered > 0 && kept == 0) s->counters.spec_steps_off++;
}

void sched_spec_extend(srv_sched *s, int32_t *budget, int32_t *reserved) {
    int32_t nd = s->n_groups;
    if (s->p.spec_type == SRV_SCHED_SPEC_NONE || s->p.n_ctx <= 0 || nd == 0) return;
    for (int32_t g = 0; g < nd; g++)
        if (s->groups[g].n != 1 || s->groups[g].prompt || s->groups[g].first != g) return; /* not decode rows */
    int32_t room = *budget / 2;
    if (room <= 0) return;
    if (!s->spec_want) { /* scratch for the step's choices, [batch_tokens] each */
        s->spec_want = malloc(2 * (size_t)s->p.batch_tokens * sizeof *s->spec_want);
        if (!s->spec_want) return; /* no guesses this step */
        s->spec_take = s->spec_want + s->p.batch_tokens;
    }
    int32_t *want = s->spec_want;
    for (int32_t g = 0; g < nd; g++) want[g] = propose(s, &s->groups[g]);
    bool draft = s->p.spec_type == SRV_SCHED_SPEC_DRAFT;
    if (draft) {
        s->g_acc *= G_IDLE_DECAY;
        s->g_tries *= G_IDLE_DECAY;
        for (int32_t g = 0, opens = 0; g < nd; g++) /* a few new draft sequences per step: see DRAFT_OPENS */
            if (want[g] > 0 && !s->groups[g].c->draft_open && ++opens > DRAFT_OPENS) want[g] = 0;
    }
    if (s->p.spec_adaptive) choose_adaptive(s, nd, want, draft ? s->d_step_ns : 0);
    if (draft) {
        int32_t *asked = s->spec_take; /* choose_adaptive is done with it; the draft reuses it after this loop */
        for (int32_t g = 0; g < nd; g++) asked[g] = want[g];
        sched_draft_propose(s, nd, want);
        for (int32_t g = 0; g < nd; g++) {
            sched_choice *c = s->groups[g].c;
            if (want[g] == 0 && asked[g] > 0) { /* the draft declined (p_min): a failed guess for the estimate */
                c->spec_acc *= ACC_DECAY;
                c->spec_tries = c->spec_tries * ACC_DECAY + 1.0f;
                s->g_acc *= G_DECAY;
                s->g_tries = s->g_tries * G_DECAY + 1;
            }
        }
    }
    int32_t total = 0;
    for (int32_t g = 0; g < nd; g++) {
        batch_group *gr = &s->groups[g];
        sched_choice *c = gr->c;
        int32_t n_max, n_min, k = want[g];
        req_bounds(s, gr->r, &n_max, &n_min);
        if (k > room - total) k = room - total;
        /* guesses take only the blocks left once every decode token has its own */
        int32_t base = srv_block_manager_needed(&s->bm, c->seq, 1), extra = 0;
        int32_t left = srv_block_manager_available(&s->bm) - *reserved;
        for (; k >= n_min && k > 0; k--) {
            int32_t need = srv_block_manager_needed(&s->bm, c->seq, 1 + k);
            if (need >= 0 && base >= 0 && need - base <= left) {
                extra = need - base;
                break;
            }
        }
        if (k < n_min) k = 0;
        if (k > 0) *reserved += extra;
        gr->n_draft = k;
        total += k;
        if (k == 0) {
            c->spec_acc *= ACC_IDLE_DECAY;
            c->spec_tries *= ACC_IDLE_DECAY;
        }
    }
    if (total == 0) return;
    /* move the decode entries apart, last first, and write each group's guesses after its entry */
    int32_t end = nd + total;
    for (int32_t g = nd - 1; g >= 0; g--) {
        batch_group *gr = &s->groups[g];
        int32_t first = end - 1 - gr->n_draft;
        s->b_token[first] = s->b_token[g];
        s->b_pos[first] = s->b_pos[g];
        s->b_seq[first] = s->b_seq[g];
        s->b_logits[first] = true;
        s->b_embd[first] = false;
        for (int32_t j = 0; j < gr->n_draft; j++) {
            int32_t i = first + 1 + j;
            s->b_token[i] = gr->c->draft[j];
            s->b_pos[i] = s->b_pos[first] + 1 + j;
            s->b_seq[i] = gr->c->seq;
            s->b_logits[i] = true;
            s->b_embd[i] = false;
        }
        gr->first = first;
        gr->n = 1 + gr->n_draft;
        end = first;
    }
    s->n_entries = nd + total;
    *budget -= total;
}

/* Counts a verified draft of k guesses of which the first m were accepted. */
static void count_draft(srv_sched *s, sched_choice *c, int32_t k, int32_t m) {
    s->counters.spec_drafts++;
    s->counters.spec_draft_tokens += (uint64_t)k;
    s->counters.spec_accepted_tokens += (uint64_t)m;
    for (int32_t j = 0; j < m; j++) s->counters.spec_accepted_per_pos[j]++;
    c->spec_acc = c->spec_acc * ACC_DECAY + (float)m;
    c->spec_tries = c->spec_tries * ACC_DECAY + (float)(m < k ? m + 1 : m);
    s->g_acc = s->g_acc * G_DECAY + m;
    s->g_tries = s->g_tries * G_DECAY + (m < k ? m + 1 : m);
}

void sched_spec_verify(srv_sched *s, const batch_group *g) {
    sched_req *r = g->r;
    sched_choice *c = g->c;
    int32_t pos0 = c->n_cached, k = g->n_draft, m = 0;
    c->n_cached = pos0 + g->n; /* what the sequence holds now, the guessed rows included */
    size_t bytes = (size_t)s->ops.n_vocab * sizeof(float);
    for (int32_t j = 0; j <= k; j++) {
        const float *lg = s->ops.get_logits(s->ops.ctx, g->first + j);
        if (!lg) {
            sched_fail_request(s, r, "the engine returned no logits");
            break;
        }
        memcpy(s->logit_buf, lg, bytes);
        int32_t before = c->n_gen;
        sched_sample_choice(s, r, c, s->logit_buf);
        bool hit = j < k && c->n_gen > before && c->gen[c->n_gen - 1] == c->draft[j];
        if (hit) m++;
        if (c->finished || !hit) break;
    }
    count_draft(s, c, k, m);
    if (c->finished) return; /* its sequence is closed */
    int32_t keep = pos0 + m + 1;
    if (keep < c->n_cached && srv_block_manager_truncate(&s->bm, c->seq, keep) != KVS_OK) {
        /* the sequence cannot go on at keep: recompute it, as after a preemption */
        srv_block_manager_seq_close(&s->bm, c->seq);
        c->seq = -1;
        c->n_cached = 0;
        return;
    }
    c->n_cached = keep;
}

void sched_spec_release(srv_sched *s) {
    free(s->spec_buf);
    free(s->spec_want);
    s->spec_buf = s->spec_want = s->spec_take = NULL;
    s->spec_cap = 0;
}
