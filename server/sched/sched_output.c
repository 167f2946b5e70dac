/* sched_output.c: what a step produces. Sampling from the logits, detokenizing, stop strings, logprobs, the
 * events handed to the loop thread and the statistics. See sched.h for the contract. */
#include "server/sched/sched_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- events ---------------------------------------------------------------------------------------------- */
/* Events are built during a step on the scheduler thread (out list) and posted at its end. CHOICE_END and
 * DONE events are allocated at submit so that they can always be delivered; a DELTA that cannot be allocated
 * is dropped (its text is lost; the request still ends properly). */
static void out_push(srv_sched *s, sched_event *e) {
    e->next = NULL;
    if (s->out_tail) s->out_tail->next = e;
    else s->out_head = e;
    s->out_tail = e;
}

void sched_finish_choice(srv_sched *s, sched_req *r, sched_choice *c, srv_sched_finish reason, const char *error);

/* Appends a token's text to the choice's output through the stop matcher; finishes it on a stop string. */
static void feed_text(srv_sched *s, sched_req *r, sched_choice *c, const char *t, size_t n) {
    const char *o;
    size_t ol;
    bool stopped = false;
    if (srv_stop_push(c->stop, t, n, &o, &ol, &stopped) != SRV_STOP_OK) {
        sched_finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "out of memory");
        return;
    }
    if (kvs_buf_append(&c->txt, o, ol) != 0) {
        sched_finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "out of memory");
        return;
    }
    if (stopped) sched_finish_choice(s, r, c, SRV_SCHED_FINISH_STOP, NULL);
}

/* Runs a detokenizer call into s->piece or a heap buffer when the piece is longer (special: control tokens
 * printed, when the ops can). */
static int detok_call(srv_sched *s, eng_detok *d, int32_t token, bool flush, bool special, char **heap,
                      const char **out, size_t *n) {
    *heap = NULL;
    int (*push)(void *, eng_detok *, int32_t, char *, size_t, size_t *) =
        special && s->ops.detok_push_special ? s->ops.detok_push_special : s->ops.detok_push;
    int rc = flush ? s->ops.detok_flush(s->ops.ctx, d, s->piece, sizeof s->piece, n)
                   : push(s->ops.ctx, d, token, s->piece, sizeof s->piece, n);
    if (rc == ENG_ERR_TOO_LARGE && *n > sizeof s->piece) {
        size_t need = *n;
        *heap = malloc(need);
        if (!*heap) return ENG_ERR_NOMEM;
        rc = flush ? s->ops.detok_flush(s->ops.ctx, d, *heap, need, n) : push(s->ops.ctx, d, token, *heap, need, n);
        *out = *heap;
    } else {
        *out = s->piece;
    }
    return rc;
}

/* Ends a choice: frees its sequence, and for a normal end releases the text still held by the detokenizer
 * and the stop matcher. */
void sched_finish_choice(srv_sched *s, sched_req *r, sched_choice *c, srv_sched_finish reason, const char *error) {
    if (c->finished) return;
    c->finished = true;
    c->reason = reason;
    c->error = error;
    c->end_pending = true;
    if (c->seq >= 0) {
        if (reason == SRV_SCHED_FINISH_STOP || reason == SRV_SCHED_FINISH_LENGTH) sched_slot_record(s, r, c);
        srv_block_manager_seq_close(&s->bm, c->seq);
        c->seq = -1;
        c->n_cached = 0;
    }
    sched_draft_drop(s, c);
    r->n_unfinished--;
    if (r->n_unfinished == 0) r->timings.t_end = uv_hrtime();
    if (r->running) s->seqs_reserved--;
    if (reason == SRV_SCHED_FINISH_ERROR) r->had_error = true;
    if (reason == SRV_SCHED_FINISH_STOP || reason == SRV_SCHED_FINISH_LENGTH) {
        if (!srv_stop_is_stopped(c->stop)) {
            char *heap;
            const char *t;
            size_t n = 0;
            if (detok_call(s, &c->detok, 0, true, false, &heap, &t, &n) == ENG_OK && n > 0) {
                const char *o;
                size_t ol;
                bool stopped = false;
                if (srv_stop_push(c->stop, t, n, &o, &ol, &stopped) == SRV_STOP_OK) {
                    (void)kvs_buf_append(&c->txt, o, ol);
                    if (stopped) c->reason = SRV_SCHED_FINISH_STOP;
                }
            }
            free(heap);
            const char *o;
            size_t ol;
            if (srv_stop_flush(c->stop, &o, &ol) == SRV_STOP_OK) (void)kvs_buf_append(&c->txt, o, ol);
        }
    }
}

/* Turns what the request's choices produced in this step into events (out list). When every choice has
 * ended, also the DONE event; the request then leaves the running / waiting lists and the caller must not
 * touch it again after the events are posted. Returns true when the request is done. */
bool sched_emit_outputs(srv_sched *s, sched_req *r) {
    uint64_t now = uv_hrtime();
    for (int32_t i = 0; i < r->rq.n; i++) {
        sched_choice *c = &r->ch[i];
        if (c->n_smp > 0 || c->txt.len > 0) {
            sched_event *e = calloc(1, sizeof *e);
            if (e) {
                e->req = r;
                e->ev.type = SRV_SCHED_EV_DELTA;
                e->ev.id = r->id;
                e->ev.choice = i;
                e->ev.t = now;
                if (c->txt.len > 0) {
                    e->text = malloc(c->txt.len);
                    if (e->text) memcpy(e->text, c->txt.data, c->txt.len);
                }
                if (c->n_smp > 0) {
                    e->samples = malloc((size_t)c->n_smp * sizeof *e->samples);
                    if (e->samples) memcpy(e->samples, c->smp, (size_t)c->n_smp * sizeof *e->samples);
                }
                if ((c->txt.len > 0 && !e->text) || (c->n_smp > 0 && !e->samples)) {
                    free(e->text);
                    free(e->samples);
                    free(e);
                } else {
                    e->ev.text = e->text;
                    e->ev.text_len = c->txt.len;
                    e->ev.samples = e->samples;
                    e->ev.n_samples = c->n_smp;
                    out_push(s, e);
                }
            }
            kvs_buf_clear(&c->txt);
            c->n_smp = 0;
        }
        if (c->end_pending) {
            c->end_pending = false;
            sched_event *e = &r->end_ev[i];
            e->req = r;
            e->prealloc = true;
            e->ev.type = SRV_SCHED_EV_CHOICE_END;
            e->ev.id = r->id;
            e->ev.choice = i;
            e->ev.t = now;
            e->ev.finish = c->reason;
            e->ev.truncated = c->pool_cut && c->reason == SRV_SCHED_FINISH_LENGTH;
            e->ev.stop_match = c->reason == SRV_SCHED_FINISH_STOP ? srv_stop_matched_index(c->stop) + 1 : 0;
            e->ev.error = c->reason == SRV_SCHED_FINISH_ERROR ? (c->error ? c->error : "internal error") : NULL;
            out_push(s, e);
        }
    }
    if (r->n_unfinished > 0) return false;
    /* done: release engine-side state here, on the scheduler thread */
    srv_sched_finish overall = SRV_SCHED_FINISH_STOP;
    const char *error = NULL;
    bool any_cancel = false, any_length = false;
    for (int32_t i = 0; i < r->rq.n; i++) {
        sched_choice *c = &r->ch[i];
        if (c->reason == SRV_SCHED_FINISH_ERROR && !error) error = c->error ? c->error : "internal error";
        any_cancel |= c->reason == SRV_SCHED_FINISH_CANCELLED;
        any_length |= c->reason == SRV_SCHED_FINISH_LENGTH;
        if (c->sampler) {
            s->ops.sampler_free(s->ops.ctx, c->sampler);
            c->sampler = NULL;
        }
        sched_grammar_release(c); /* before DONE: the caller may free the grammar then */
    }
    if (error) overall = SRV_SCHED_FINISH_ERROR;
    else if (any_cancel) overall = SRV_SCHED_FINISH_CANCELLED;
    else if (any_length) overall = SRV_SCHED_FINISH_LENGTH;
    if (r->timings.t_end == 0) r->timings.t_end = now;
    sched_event *e = r->done_ev;
    e->req = r;
    e->prealloc = true;
    e->ev.type = SRV_SCHED_EV_DONE;
    e->ev.id = r->id;
    e->ev.choice = -1;
    e->ev.t = now;
    e->ev.finish = overall;
    e->ev.error = error;
    e->ev.usage = r->usage;
    e->ev.timings = r->timings;
    if (r->rq.embed && overall == SRV_SCHED_FINISH_STOP) {
        e->ev.embd = r->embd;
        e->ev.n_embd = r->rq.pooling == SRV_SCHED_POOL_RANK ? s->ops.n_rank : s->ops.n_embd;
    }
    out_push(s, e);
    s->counters.requests_finished[overall]++;
    sched_trace(s, SRV_SCHED_TRACE_ENDED, r, false);
    if (r->running) sched_vec_remove(&s->running, r);
    else sched_vec_remove(&s->waiting, r);
    r->running = false;
    return true;
}

/* Posts the step's events: appends them to the shared queue, unlinks finished requests from the live list
 * (in the same critical section, so srv_sched_cancel never finds a request whose DONE is queued), refreshes
 * the stats and wakes the loop. */
void sched_refresh_stats_locked(srv_sched *s);

void sched_post_events(srv_sched *s, int32_t dropped_new) {
    uv_mutex_lock(&s->mu);
    bool any = s->out_head != NULL;
    for (sched_event *e = s->out_head; e; e = e->next) {
        if (e->ev.type == SRV_SCHED_EV_DONE) {
            sched_req *r = e->req;
            if (r->live_prev) r->live_prev->live_next = r->live_next;
            else s->live = r->live_next;
            if (r->live_next) r->live_next->live_prev = r->live_prev;
            r->live_prev = r->live_next = NULL;
        }
    }
    if (s->out_head) {
        if (s->ev_tail) s->ev_tail->next = s->out_head;
        else s->ev_head = s->out_head;
        s->ev_tail = s->out_tail;
    }
    s->out_head = s->out_tail = NULL;
    s->n_queued_new -= dropped_new;
    s->n_queued_tokens -= s->dropped_tokens;
    s->dropped_tokens = 0;
    sched_refresh_stats_locked(s);
    uv_mutex_unlock(&s->mu);
    if (any && s->async) uv_async_send(s->async);
}

void sched_refresh_stats_locked(srv_sched *s) {
    srv_sched_stats *st = &s->stats;
    kvc_stats ks;
    srv_block_manager_stats(&s->bm, &ks);
    st->has_tier = s->p.tier != NULL;
    kvt_get_stats(s->p.tier, &st->tier);
    st->has_host = s->p.host != NULL;
    kvh_get_stats(s->p.host, &st->host);
    st->requests_running = s->running.n;
    st->requests_waiting = s->waiting.n + s->incoming.n;
    st->seqs_running = ks.seqs_live;
    st->kv_blocks_total = ks.blocks_total;
    st->kv_blocks_used = ks.blocks_used;
    st->kv_blocks_cached = ks.blocks_cached;
    st->kv_blocks_free = ks.blocks_free;
    st->kv_block_size = ks.block_size;
    st->kv_usage = ks.usage;
    st->prefix_query_tokens = ks.prefix_query_tokens + s->c_copy_query;
    st->prefix_hit_tokens = ks.prefix_hit_tokens + s->c_copy_hit;
    st->counters = s->counters;
    st->queued_tokens = s->n_queued_tokens;
    st->spec_n_max = s->p.spec_type != SRV_SCHED_SPEC_NONE ? s->p.spec_n_max : 0;
    st->spec_draft = s->p.spec_type == SRV_SCHED_SPEC_DRAFT;
}

/* ---- sampling ----------------------------------------------------------------------------------------------- */
/* Queues a sample for the choice's next DELTA; false (the choice failed) when out of memory. */
static bool push_sample(srv_sched *s, sched_req *r, sched_choice *c, const eng_sample *smp) {
    if (c->n_smp == c->cap_smp) {
        int32_t cap = c->cap_smp ? c->cap_smp * 2 : 4;
        eng_sample *p = realloc(c->smp, (size_t)cap * sizeof *p);
        if (!p) {
            sched_finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "out of memory");
            return false;
        }
        c->smp = p;
        c->cap_smp = cap;
    }
    c->smp[c->n_smp++] = *smp;
    return true;
}

void sched_sample_choice(srv_sched *s, sched_req *r, sched_choice *c, float *logits) {
    if (r->rq.ignore_eos)
        for (int32_t k = 0; k < s->n_eog; k++) logits[s->eog[k]] = -INFINITY;
    if (c->gm && !sched_grammar_mask(s, r, c, logits)) return;
    eng_sample smp;
    memset(&smp, 0, sizeof smp);
    if (s->ops.sampler_sample(s->ops.ctx, c->sampler, logits, &smp) != 0 || smp.token < 0 ||
        smp.token >= s->ops.n_vocab) {
        sched_finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "sampling failed");
        return;
    }
    if (c->gm && !sched_grammar_accept(s, r, c, smp.token)) return;
    if (c->n_gen == c->cap_gen) {
        int32_t cap = c->cap_gen ? c->cap_gen * 2 : 64;
        int32_t *g = realloc(c->gen, (size_t)cap * sizeof *g);
        if (!g) {
            sched_finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "out of memory");
            return;
        }
        c->gen = g;
        c->cap_gen = cap;
    }
    c->gen[c->n_gen++] = smp.token;
    if (!sched_shift_push(c, smp.token)) {
        sched_finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "out of memory");
        return;
    }
    r->usage.completion_tokens++;
    s->counters.generation_tokens_total++;
    if (r->timings.t_first_token == 0) r->timings.t_first_token = uv_hrtime();
    r->protect = false;
    if (!r->rq.ignore_eos && s->ops.token_is_eog(s->ops.ctx, smp.token)) {
        if (r->rq.report_eog && !push_sample(s, r, c, &smp)) return;
        sched_finish_choice(s, r, c, SRV_SCHED_FINISH_STOP, NULL);
        return;
    }
    if (!push_sample(s, r, c, &smp)) return;
    char *heap;
    const char *t;
    size_t n = 0;
    int rc = detok_call(s, &c->detok, smp.token, false, r->rq.render_special, &heap, &t, &n);
    if (rc != ENG_OK) {
        free(heap);
        sched_finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "detokenization failed");
        return;
    }
    feed_text(s, r, c, t, n);
    free(heap);
    if (c->finished) return;
    if (c->gm && sched_grammar_only_eog(s, r, c)) {
        sched_finish_choice(s, r, c, SRV_SCHED_FINISH_STOP, NULL);
        return;
    }
    if (c->finished) return;
    if (r->rq.max_tokens > 0 && c->n_gen >= r->rq.max_tokens) {
        sched_finish_choice(s, r, c, SRV_SCHED_FINISH_LENGTH, NULL);
    } else if (s->p.n_ctx > 0 && known_len(r, c) >= s->p.n_ctx) {
        /* the context is full: shift it (sched.h, "Context shift") or end */
        if (!(s->p.context_shift && r->rq.max_tokens > 0 && sched_context_shift(s, r, c)))
            sched_finish_choice(s, r, c, SRV_SCHED_FINISH_LENGTH, NULL);
    }
}

void sched_fail_request(srv_sched *s, sched_req *r, const char *msg) {
    for (int32_t i = 0; i < r->rq.n; i++) sched_finish_choice(s, r, &r->ch[i], SRV_SCHED_FINISH_ERROR, msg);
}

/* ---- embeddings ------------------------------------------------------------------------------------------- */
/* Rank pooling: the head's values of the first row (the last with ops.rank_last), as they are. The rows of this
 * group are first .. first + n - 1 at positions pos0 .. pos0 + n - 1. */
static void pool_rank(srv_sched *s, sched_req *r, sched_choice *c, int32_t first, int32_t n, int32_t pos0) {
    int32_t want = s->ops.rank_last ? r->rq.n_prompt - 1 : 0;
    if (want >= pos0 && want < pos0 + n) {
        const float *v = s->ops.get_rank(s->ops.ctx, first + (want - pos0));
        if (!v) {
            sched_finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "the engine returned no classification values");
            return;
        }
        memcpy(r->embd, v, (size_t)s->ops.n_rank * sizeof *r->embd);
    }
    if (c->n_cached < r->rq.n_prompt) return;
    if (r->timings.t_first_token == 0) r->timings.t_first_token = uv_hrtime();
    sched_finish_choice(s, r, c, SRV_SCHED_FINISH_STOP, NULL);
}

void sched_pool_rows(srv_sched *s, sched_req *r, sched_choice *c, int32_t first, int32_t n, int32_t pos0) {
    const int32_t E = s->ops.n_embd;
    if (r->rq.pooling == SRV_SCHED_POOL_RANK) {
        pool_rank(s, r, c, first, n, pos0);
        return;
    }
    for (int32_t k = 0; k < n; k++) {
        int32_t pos = pos0 + k;
        bool take = r->rq.pooling == SRV_SCHED_POOL_MEAN || (r->rq.pooling == SRV_SCHED_POOL_CLS && pos == 0) ||
                    (r->rq.pooling == SRV_SCHED_POOL_LAST && pos == r->rq.n_prompt - 1);
        if (!take) continue;
        const float *row = s->ops.get_embd(s->ops.ctx, first + k);
        if (!row) {
            sched_finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "the engine returned no hidden state");
            return;
        }
        for (int32_t j = 0; j < E; j++) r->embd_acc[j] += row[j];
    }
    if (c->n_cached < r->rq.n_prompt) return;
    /* mean: the sum's direction is the mean's, so the L2 normalization below makes the division moot */
    double ss = 0;
    for (int32_t j = 0; j < E; j++) ss += r->embd_acc[j] * r->embd_acc[j];
    double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
    for (int32_t j = 0; j < E; j++) r->embd[j] = (float)(r->embd_acc[j] * inv);
    if (r->timings.t_first_token == 0) r->timings.t_first_token = uv_hrtime();
    sched_finish_choice(s, r, c, SRV_SCHED_FINISH_STOP, NULL);
}
