/* sched_shift.c: the context shift (sched.h, "Context shift"; llama.cpp's --context-shift). A choice whose
 * context reaches n_ctx keeps its first n_keep tokens, drops half of the rest and goes on generating. The
 * choice's known tokens become its shifted context (sched_choice.shctx), which every other part of the
 * scheduler reads through known_len / token_at, so decoding, preemption and recompute need nothing special. */
#include "server/sched/sched_internal.h"

#include <stdlib.h>
#include <string.h>

static bool shctx_reserve(sched_choice *c, int32_t n) {
    if (n <= c->cap_shctx) return true;
    int32_t cap = c->cap_shctx ? c->cap_shctx : 64;
    while (cap < n) cap = cap > INT32_MAX / 2 ? n : cap * 2;
    int32_t *p = realloc(c->shctx, (size_t)cap * sizeof *p);
    if (!p) return false;
    c->shctx = p;
    c->cap_shctx = cap;
    return true;
}

bool sched_shift_push(sched_choice *c, int32_t token) {
    if (!c->shctx) return true;
    if (!shctx_reserve(c, c->n_shctx + 1)) return false;
    c->shctx[c->n_shctx++] = token;
    return true;
}

bool sched_context_shift(srv_sched *s, sched_req *r, sched_choice *c) {
    int32_t known = known_len(r, c);
    /* the sequence holds every known token but the one just sampled (a choice without a sequence, e.g. an
     * n > 1 fork that failed, is shifted over what it would hold) */
    int32_t held = known - 1, keep = r->rq.n_keep < held ? r->rq.n_keep : held;
    int32_t n_discard = (held - keep) / 2;
    if (n_discard < 1) return false;
    /* the new context: tokens [0, keep) and [keep + n_discard, known); built in a new array since the old
     * known tokens may live in prompt + gen */
    int32_t n_new = known - n_discard;
    int32_t *nt = malloc((size_t)(n_new > 64 ? n_new : 64) * sizeof *nt);
    if (!nt) return false;
    for (int32_t i = 0; i < keep; i++) nt[i] = token_at(r, c, i);
    for (int32_t i = keep + n_discard; i < known; i++) nt[i - n_discard] = token_at(r, c, i);
    bool in_place = false;
    if (c->seq >= 0 && c->n_cached == held && s->ops.seq_remove &&
        s->ops.seq_remove(s->ops.ctx, c->seq, keep, keep + n_discard) == ENG_OK) {
        in_place = srv_block_manager_seq_len(&s->bm, c->seq) == held - n_discard;
        if (in_place) {
            c->n_cached = held - n_discard;
            if (keep < c->clean) c->clean = keep;
        }
    }
    if (!in_place && c->seq >= 0) {
        /* recompute the kept tokens: a fresh sequence attaches what it can (the kept prefix's cached blocks) */
        srv_block_manager_seq_close(&s->bm, c->seq);
        c->seq = -1;
        c->n_cached = 0;
        c->clean = INT32_MAX;
    }
    sched_draft_drop(s, c); /* the draft's sequence holds the old context */
    free(c->shctx);
    c->shctx = nt;
    c->n_shctx = n_new;
    c->cap_shctx = n_new > 64 ? n_new : 64;
    s->counters.context_shifts++;
    if (!in_place) s->counters.context_shifts_recomputed++;
    return true;
}
