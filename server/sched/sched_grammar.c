/* sched_grammar.c: constrained decoding in the scheduler's sampling step (srv_sched_request.grammar).
 *
 * Each choice owns a clone of the request's template matcher and a mask buffer. Before the sampler runs, the
 * mask of the matcher's state is applied to the logits (disallowed tokens become -inf, so every sampler stage
 * sees only allowed tokens); the sampled token is then accepted. When a token completes the value and the
 * grammar allows nothing but an end-of-generation token after it, the choice ends with FINISH_STOP at once
 * (no extra forward pass for the EOG). That mask is kept for the next step (gmask_ready), so it is computed
 * once. Preemption does not touch the matcher: like the sampler, it stays with the choice, consistent with
 * the tokens generated so far. Runs on the scheduler thread except sched_grammar_init (submit). */
#include "server/sched/sched_internal.h"

#include <stdlib.h>
#include <string.h>

static size_t mask_words(const srv_sched *s) { return ((size_t)s->ops.n_vocab + 31) / 32; }

int sched_grammar_init(srv_sched *s, sched_req *r, const gmr_matcher *tmpl) {
    if (!tmpl) return SRV_SCHED_OK;
    if (gmr_vocab_size(gmr_matcher_vocab(tmpl)) != s->ops.n_vocab) return SRV_SCHED_ERR_INVALID;
    for (int32_t i = 0; i < r->rq.n; i++) {
        sched_choice *c = &r->ch[i];
        c->gmask = malloc(mask_words(s) * sizeof *c->gmask);
        if (!c->gmask || gmr_matcher_clone(tmpl, &c->gm) != 0) return SRV_SCHED_ERR_NOMEM;
        c->gmask_ready = false;
    }
    return SRV_SCHED_OK;
}

void sched_grammar_release(sched_choice *c) {
    gmr_matcher_free(c->gm);
    c->gm = NULL;
    free(c->gmask);
    c->gmask = NULL;
    c->gmask_ready = false;
}

/* Fills the choice's mask for its current state; false (the choice ended) on a dead state or a failure. */
static bool fill(srv_sched *s, sched_req *r, sched_choice *c) {
    if (c->gmask_ready) return true;
    size_t nw = mask_words(s);
    if (gmr_matcher_fill_mask(c->gm, c->gmask, nw) != 0) {
        sched_finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "the response grammar is too ambiguous to follow");
        return false;
    }
    uint32_t any = 0;
    for (size_t w = 0; w < nw; w++) any |= c->gmask[w];
    if (!any) { /* a grammar limit cut every parse: nothing may follow */
        sched_finish_choice(s, r, c, SRV_SCHED_FINISH_LENGTH, NULL);
        return false;
    }
    c->gmask_ready = true;
    return true;
}

bool sched_grammar_mask(srv_sched *s, sched_req *r, sched_choice *c, float *logits) {
    if (!fill(s, r, c)) return false;
    gmr_mask_apply(c->gmask, logits, s->ops.n_vocab);
    return true;
}

bool sched_grammar_accept(srv_sched *s, sched_req *r, sched_choice *c, int32_t token) {
    c->gmask_ready = false;
    if (gmr_matcher_accept_token(c->gm, token) != 0) {
        sched_finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "the sampled token does not fit the response grammar");
        return false;
    }
    return true;
}

bool sched_grammar_only_eog(srv_sched *s, sched_req *r, sched_choice *c) {
    if (gmr_matcher_is_finished(c->gm) || !gmr_matcher_is_complete(c->gm)) return false;
    if (!fill(s, r, c)) return false; /* ended there */
    size_t nw = mask_words(s);
    uint64_t allowed = 0, eog = 0;
    for (size_t w = 0; w < nw; w++) allowed += (uint64_t)__builtin_popcount(c->gmask[w]);
    for (int32_t k = 0; k < s->n_eog; k++) eog += (c->gmask[s->eog[k] >> 5] >> (s->eog[k] & 31)) & 1u;
    return allowed == eog;
}
