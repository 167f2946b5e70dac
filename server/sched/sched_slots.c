/* sched_slots.c: the scheduler's saved-session records (slots): what each sequence id held when its last choice
 * ended (see sched.h, "saved sessions"). */
#include "server/sched/sched_internal.h"

#include <stdlib.h>
#include <string.h>

void sched_slot_record(srv_sched *s, const sched_req *r, const sched_choice *c) {
    if (c->seq < 0 || c->seq >= s->n_slots || r->rq.embed) return;
    int32_t n = srv_block_manager_seq_len(&s->bm, c->seq), k = known_len(r, c);
    if (n > k) n = k;
    int32_t *tok = n > 0 ? malloc((size_t)n * sizeof *tok) : NULL;
    if (n > 0 && !tok) return;
    for (int32_t i = 0; i < n; i++) tok[i] = token_at(r, c, i);
    uv_mutex_lock(&s->mu);
    free(s->slot_tok[c->seq]);
    s->slot_tok[c->seq] = tok;
    s->slot_n[c->seq] = n;
    uv_mutex_unlock(&s->mu);
}

void sched_slots_free(srv_sched *s) {
    if (!s->slot_tok) return;
    for (int32_t i = 0; i < s->n_slots; i++) free(s->slot_tok[i]);
    free(s->slot_tok);
    free(s->slot_n);
    s->slot_tok = NULL;
    s->slot_n = NULL;
}

int srv_sched_slot_tokens(srv_sched *s, int32_t slot, int32_t **out, int32_t *n) {
    if (!s || !out || !n || slot < 0 || slot >= s->n_slots) return SRV_SCHED_ERR_INVALID;
    *out = NULL;
    *n = 0;
    uv_mutex_lock(&s->mu);
    int32_t len = s->slot_n[slot];
    int32_t *copy = len > 0 ? malloc((size_t)len * sizeof *copy) : NULL;
    if (copy) memcpy(copy, s->slot_tok[slot], (size_t)len * sizeof *copy);
    uv_mutex_unlock(&s->mu);
    if (len > 0 && !copy) return SRV_SCHED_ERR_NOMEM;
    *out = copy;
    *n = len;
    return SRV_SCHED_OK;
}

int srv_sched_slot_set(srv_sched *s, int32_t slot, const int32_t *tokens, int32_t n, int32_t *n_old) {
    if (!s || slot < 0 || slot >= s->n_slots || n < 0 || (n > 0 && !tokens)) return SRV_SCHED_ERR_INVALID;
    int32_t *copy = n > 0 ? malloc((size_t)n * sizeof *copy) : NULL;
    if (n > 0 && !copy) return SRV_SCHED_ERR_NOMEM;
    if (copy) memcpy(copy, tokens, (size_t)n * sizeof *copy);
    uv_mutex_lock(&s->mu);
    if (n_old) *n_old = s->slot_n[slot];
    free(s->slot_tok[slot]);
    s->slot_tok[slot] = copy;
    s->slot_n[slot] = n;
    uv_mutex_unlock(&s->mu);
    return SRV_SCHED_OK;
}
