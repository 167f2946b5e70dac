/* sched_core.c: the continuous-batching scheduler's queue, threads and steps (see sched.h for the
 * contract; admission and preemption are in sched_policy.c, sampling and events in sched_output.c).
 *
 * Shape of the code:
 *   - Loop thread: srv_sched_submit / srv_sched_cancel put requests on `incoming` / set their `cancelled`
 *     flag under `mu` and signal `cv`; on_async() drains the event queue and calls the callbacks.
 *   - Scheduler thread: thread_main() waits for work and runs step(): take incoming requests, apply
 *     cancellations, build one batch (decode tokens first, then prompt chunks, then admissions), decode,
 *     sample, post events.
 *
 * A choice's "known" tokens are prompt + generated; its sequence holds the first n_cached of them. A
 * choice that has sampled always has exactly one known token not yet in the cache (the next decode input),
 * so decoding and recomputing after a preemption are the same operation: put the uncached known tokens
 * through the engine and sample from the logits of the last one.
 */
#include "server/sched/sched_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ---------------------------------------------------------------------------------------- */
const char *srv_sched_finish_name(srv_sched_finish f) {
    switch (f) {
    case SRV_SCHED_FINISH_STOP: return "stop";
    case SRV_SCHED_FINISH_LENGTH: return "length";
    case SRV_SCHED_FINISH_CANCELLED: return "abort";
    case SRV_SCHED_FINISH_ERROR: return "error";
    default: return "";
    }
}

void srv_sched_params_default(srv_sched_params *p) {
    if (!p) return;
    p->batch_tokens = 512;
    p->parallel = 64;
    p->max_queue = 256;
    p->n_ctx = 0;
    p->context_shift = false;
    p->max_queued_tokens = 0;
    p->on_step = NULL;
    p->on_step_ctx = NULL;
    p->policy = SRV_SCHED_FCFS;
    p->on_trace = NULL;
    p->on_trace_ctx = NULL;
    p->spec_type = SRV_SCHED_SPEC_NONE;
    p->spec_n_max = 16;
    p->spec_n_min = 0;
    p->spec_ngram_min = 2;
    p->spec_ngram_max = 4;
    p->spec_adaptive = true;
    p->draft = NULL;
    p->spec_p_min = 0;
    p->step_clock = NULL;
    p->step_clock_ctx = NULL;
    p->tier = NULL;
    p->host = NULL;
}

uint64_t sched_step_clock(const srv_sched *s) {
    return s->p.step_clock ? s->p.step_clock(s->p.step_clock_ctx) : uv_hrtime();
}

int sched_vec_insert(req_vec *q, int32_t at, sched_req *r) {
    if (q->n == q->cap) {
        int32_t c = q->cap ? q->cap * 2 : 16;
        sched_req **n = realloc(q->v, (size_t)c * sizeof *n);
        if (!n) return -1;
        q->v = n;
        q->cap = c;
    }
    memmove(q->v + at + 1, q->v + at, (size_t)(q->n - at) * sizeof *q->v);
    q->v[at] = r;
    q->n++;
    return 0;
}

/* Whether a comes after b in the queues' order (priority, then arrival). */
static bool req_after(const sched_req *a, const sched_req *b) {
    return a->rq.priority != b->rq.priority ? a->rq.priority > b->rq.priority : a->id > b->id;
}

int sched_vec_insert_sorted(req_vec *q, sched_req *r) {
    int32_t at = q->n;
    while (at > 0 && req_after(q->v[at - 1], r)) at--;
    return sched_vec_insert(q, at, r);
}

void sched_trace(srv_sched *s, srv_sched_trace_kind kind, const sched_req *r, bool repeated) {
    if (!s->p.on_trace) return;
    srv_sched_trace t = {.kind = kind, .id = r->id, .priority = r->rq.priority, .repeated = repeated};
    s->p.on_trace(s->p.on_trace_ctx, &t);
}

void sched_vec_remove(req_vec *q, sched_req *r) {
    for (int32_t i = 0; i < q->n; i++)
        if (q->v[i] == r) {
            memmove(q->v + i, q->v + i + 1, (size_t)(q->n - i - 1) * sizeof *q->v);
            q->n--;
            return;
        }
}

static void req_free(srv_sched *s, sched_req *r) {
    if (!r) return;
    if (r->ch) {
        for (int32_t i = 0; i < r->rq.n; i++) {
            sched_choice *c = &r->ch[i];
            if (c->sampler) s->ops.sampler_free(s->ops.ctx, c->sampler);
            sched_grammar_release(c);
            srv_stop_free(c->stop);
            free(c->gen);
            free(c->shctx);
            kvs_buf_free(&c->txt);
            free(c->smp);
        }
        free(r->ch);
    }
    KVS_FREE_ALL(r->end_ev, r->done_ev, r->prompt, r->bias, r->embd_acc, r->embd, r);
}

/* The choice's known tokens as one array (scratch, valid until the next call); NULL on allocation failure. */
static const int32_t *known_tokens(srv_sched *s, const sched_req *r, const sched_choice *c) {
    int32_t n = known_len(r, c);
    if (c->shctx) return c->shctx;
    if (c->n_gen == 0) return r->prompt;
    if (n > s->tok_cap) {
        int32_t *p = realloc(s->tok_buf, (size_t)n * sizeof *p);
        if (!p) return NULL;
        s->tok_buf = p;
        s->tok_cap = n;
    }
    memcpy(s->tok_buf, r->prompt, (size_t)r->rq.n_prompt * sizeof *s->tok_buf);
    memcpy(s->tok_buf + r->rq.n_prompt, c->gen, (size_t)c->n_gen * sizeof *s->tok_buf);
    return s->tok_buf;
}

/* ---- batch building ------------------------------------------------------------------------------------------ */
static int32_t blocks_avail(srv_sched *s, int32_t reserved) { return srv_block_manager_available(&s->bm) - reserved; }

static void add_group(srv_sched *s, sched_req *r, sched_choice *c, int32_t n, bool logits, bool prompt) {
    batch_group *g = &s->groups[s->n_groups++];
    g->r = r;
    g->c = c;
    g->first = s->n_entries;
    g->n = n;
    g->logits = logits;
    g->prompt = prompt;
    g->n_draft = 0;
    for (int32_t k = 0; k < n; k++) {
        int32_t i = s->n_entries++;
        int32_t pos = c->n_cached + k;
        s->b_token[i] = token_at(r, c, pos);
        s->b_pos[i] = pos;
        s->b_seq[i] = c->seq;
        s->b_logits[i] = logits && k == n - 1;
        s->b_embd[i] = r->rq.embed;
    }
    s->batch_embd |= r->rq.embed;
}

static bool choice_in_batch(const srv_sched *s, const sched_choice *c) {
    for (int32_t i = 0; i < s->n_groups; i++)
        if (s->groups[i].c == c) return true;
    return false;
}

/* Whether request r needs every row of its prompt computed: an embedding request pools them all (its prompt
 * attaches no cached prefix); a decoder reranker's rank request reads only its last row, so it attaches and shares
 * prefixes like a generation (the pairs of one query share the rerank prompt's head). */
static bool needs_all_rows(const srv_sched *s, const sched_req *r) {
    return r->rq.embed && !(r->rq.pooling == SRV_SCHED_POOL_RANK && s->ops.rank_last);
}

/* Whether choice c (no sequence yet) should wait because a running, still prefilling sequence is computing
 * at least one full block of its prefix that is not committed yet: it then attaches those blocks later
 * instead of computing them a second time. */
bool sched_prefix_wait(srv_sched *s, const sched_req *r, const sched_choice *c) {
    int32_t n = known_len(r, c) - 1; /* attachable tokens */
    if (n < s->block_size || needs_all_rows(s, r)) return false;
    for (int32_t i = 0; i < s->running.n; i++) {
        const sched_req *p = s->running.v[i];
        for (int32_t j = 0; j < p->rq.n; j++) {
            const sched_choice *d = &p->ch[j];
            if (d == c || d->finished || d->seq < 0) continue;
            int32_t kd = known_len(p, d);
            if (kd - d->n_cached <= 1) continue; /* not prefilling */
            int32_t lim = n < kd ? n : kd, l = 0;
            if (d->clean < lim) lim = d->clean;
            while (l < lim && token_at(r, c, l) == token_at(p, d, l)) l++;
            int32_t full = l / s->block_size * s->block_size;
            if (full >= s->block_size && d->n_cached < full) return true;
        }
    }
    return false;
}

/* The running sequence that holds the longest committed prefix in common with choice c's first n tokens
 * (partial last block included); its length, 0 when none. */
static int32_t best_donor(srv_sched *s, const sched_req *r, const sched_choice *c, int32_t n, int32_t *donor) {
    int32_t best = 0;
    for (int32_t i = 0; i < s->running.n; i++) {
        const sched_req *p = s->running.v[i];
        for (int32_t j = 0; j < p->rq.n; j++) {
            const sched_choice *d = &p->ch[j];
            if (d == c || d->finished || d->seq < 0) continue;
            int32_t lim = srv_block_manager_seq_len(&s->bm, d->seq), kd = known_len(p, d);
            if (kd < lim) lim = kd;
            if (n < lim) lim = n;
            if (d->clean < lim) lim = d->clean; /* a shifted sequence lends only its unshifted head */
            if (lim <= best) continue;
            int32_t l = 0;
            while (l < lim && token_at(r, c, l) == token_at(p, d, l)) l++;
            if (l > best) {
                best = l;
                *donor = d->seq;
            }
        }
    }
    return best;
}

/* Gives choice c a sequence and attaches its cached prefix. Full blocks come from the prefix cache; when a
 * running sequence holds a longer common prefix (its partial last block included: requests arriving
 * together with the same prompt head), that prefix is copied from it instead (full blocks shared, the
 * partial block copied), so no token of it is computed twice. The prefix then continues with what the disk tier
 * holds, at most `avail` blocks. Returns 0, or -1 when no sequence id is free
 * (then nothing changed) or on an allocation failure (then the choice has failed). */
static int start_seq(srv_sched *s, sched_req *r, sched_choice *c, int32_t avail) {
    int32_t seq;
    if (srv_block_manager_seq_open(&s->bm, &seq) != 0) return -1;
    c->clean = INT32_MAX;
    if (needs_all_rows(s, r)) { /* every row's hidden state is needed: nothing attached, the pooling starts over */
        memset(r->embd_acc, 0, (size_t)s->ops.n_embd * sizeof *r->embd_acc);
        c->seq = seq;
        c->n_cached = 0;
        return 0;
    }
    const int32_t *toks = known_tokens(s, r, c);
    if (!toks) {
        srv_block_manager_seq_close(&s->bm, seq);
        sched_finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "out of memory");
        return -1;
    }
    int32_t n = known_len(r, c) - 1, donor = -1;
    int32_t shared = best_donor(s, r, c, n, &donor);
    bool copied;
    int32_t cached = srv_block_manager_attach_prefix(&s->bm, seq, toks, n, donor, shared, &copied);
    if (!copied) cached += sched_load_begin(s, seq, toks, n, cached, avail); /* may leave a disk fetch running */
    if (copied) {
        s->c_copy_query += (uint64_t)n;
        s->c_copy_hit += (uint64_t)shared;
    }
    c->seq = seq;
    c->n_cached = cached;
    if (c->idx == 0 && c->n_gen == 0 && r->timings.n_preempted == 0) r->usage.cached_tokens = cached;
    return 0;
}

/* Largest n <= want whose blocks fit into avail blocks (kvc_blocks_needed is monotone in n). */
static int32_t fit_tokens(srv_sched *s, int32_t seq, int32_t want, int32_t avail, int32_t *need_out) {
    *need_out = 0;
    if (want <= 0 || avail < 0) return 0;
    int32_t need = srv_block_manager_needed(&s->bm, seq, want);
    if (need >= 0 && need <= avail) {
        *need_out = need;
        return want;
    }
    int32_t lo = 0, hi = want; /* lo fits, hi does not */
    while (hi - lo > 1) {
        int32_t mid = lo + (hi - lo) / 2;
        int32_t nm = srv_block_manager_needed(&s->bm, seq, mid);
        if (nm >= 0 && nm <= avail) lo = mid;
        else hi = mid;
    }
    if (lo > 0) *need_out = srv_block_manager_needed(&s->bm, seq, lo);
    return lo;
}

/* Adds prompt/recompute chunks of request r's choices that are not in the batch yet. */
static void prefill_request(srv_sched *s, sched_req *r, int32_t *budget, int32_t *reserved) {
    for (int32_t i = 0; i < r->rq.n && *budget > 0; i++) {
        sched_choice *c = &r->ch[i];
        if (c->finished || choice_in_batch(s, c)) continue;
        if (c->seq < 0) {
            if (c->idx > 0 && c->n_gen == 0) continue; /* gets choice 0's prompt by copy */
            if (sched_prefix_wait(s, r, c)) continue;
            if (start_seq(s, r, c, blocks_avail(s, *reserved)) != 0) continue;
            if (blocks_avail(s, *reserved) < 0) {
                /* attaching took cached blocks that this batch already counted on: not this step */
                srv_block_manager_seq_close(&s->bm, c->seq);
                c->seq = -1;
                c->n_cached = 0;
                continue;
            }
        }
        if (s->bm.n_fetch > 0 && sched_load_pending(s, r, c, known_tokens(s, r, c), blocks_avail(s, *reserved)))
            continue; /* its prefix is still being read from disk */
        int32_t rem = known_len(r, c) - c->n_cached;
        if (rem <= 0) continue; /* cannot happen: a live choice always has its next input uncached */
        int32_t want = rem < *budget ? rem : *budget, need;
        int32_t n = fit_tokens(s, c->seq, want, blocks_avail(s, *reserved), &need);
        if (n == 0 || (s->ops.whole_prompts && n < rem)) continue; /* an encoder's prompt runs whole */
        add_group(s, r, c, n, n == rem && !r->rq.embed, true);
        *reserved += need;
        *budget -= n;
    }
}

/* The logits of the last entry of choice c's group: sample (for a fresh request with n > 1, first copy the
 * prompt into the other choices' sequences and sample them all from these logits). */
static void handle_logits(srv_sched *s, sched_req *r, sched_choice *c, int32_t entry) {
    const float *lg = s->ops.get_logits(s->ops.ctx, entry);
    if (!lg) {
        sched_fail_request(s, r, "the engine returned no logits");
        return;
    }
    size_t bytes = (size_t)s->ops.n_vocab * sizeof(float);
    bool fan_out = c->idx == 0 && c->n_gen == 0 && r->rq.n > 1;
    if (fan_out) {
        for (int32_t i = 1; i < r->rq.n; i++) {
            sched_choice *d = &r->ch[i];
            if (d->finished || d->seq >= 0 || d->n_gen != 0) continue;
            int32_t seq;
            if (srv_block_manager_fork(&s->bm, c->seq, r->rq.n_prompt, &seq) != 0) continue; /* recomputed later */
            d->seq = seq;
            d->n_cached = r->rq.n_prompt;
        }
    }
    memcpy(s->logit_buf, lg, bytes);
    sched_sample_choice(s, r, c, s->logit_buf);
    if (fan_out) {
        for (int32_t i = 1; i < r->rq.n; i++) {
            sched_choice *d = &r->ch[i];
            if (d->finished || d->n_gen != 0) continue;
            memcpy(s->logit_buf, lg, bytes);
            sched_sample_choice(s, r, d, s->logit_buf);
        }
    }
}

static const char *engine_error(int rc) {
    switch (rc) {
    case ENG_ERR_INVALID: return "engine: invalid batch";
    case ENG_ERR_NOMEM: return "engine: out of memory";
    case ENG_ERR_KV: return "engine: KV cache error";
    case ENG_ERR_DEVICE: return "engine: device error";
    default: return "engine: decode failed";
    }
}

/* Ends every choice of r as cancelled. */
static void end_cancelled(srv_sched *s, sched_req *r) {
    for (int32_t j = 0; j < r->rq.n; j++) sched_finish_choice(s, r, &r->ch[j], SRV_SCHED_FINISH_CANCELLED, NULL);
}

/* ---- one step ------------------------------------------------------------------------------------------------ */
static void handle_cancels(srv_sched *s, int32_t *dropped_new) {
    req_vec *lists[2] = {&s->running, &s->waiting};
    for (int l = 0; l < 2; l++) {
        for (int32_t i = lists[l]->n - 1; i >= 0; i--) {
            sched_req *r = lists[l]->v[i];
            if (r->cancel_handled || !atomic_load(&r->cancelled)) continue;
            r->cancel_handled = true;
            end_cancelled(s, r);
            bool never = !r->admitted_once;
            if (sched_emit_outputs(s, r) && never) { (*dropped_new)++; s->dropped_tokens += r->rq.n_prompt; }
        }
    }
}

/* Builds the batch. Returns 0 when built (possibly empty), 1 when the state changed (a preemption, a choice
 * that cannot grow) and the batch must be rebuilt. */
static int build(srv_sched *s, int32_t *dropped_new) {
    s->n_entries = s->n_groups = 0;
    s->batch_embd = false;
    int32_t reserved = 0, budget = s->p.batch_tokens;
    /* 1. decode tokens of running choices, in queue order */
    for (int32_t i = 0; i < s->running.n && budget > 0; i++) {
        sched_req *r = s->running.v[i];
        for (int32_t j = 0; j < r->rq.n && budget > 0; j++) {
            sched_choice *c = &r->ch[j];
            if (c->finished || c->seq < 0 || known_len(r, c) - c->n_cached != 1) continue;
            int32_t need = srv_block_manager_needed(&s->bm, c->seq, 1);
            if (need < 0 || need > blocks_avail(s, reserved)) {
                sched_req *victim = sched_pick_victim(s);
                if (victim) {
                    sched_preempt(s, victim);
                } else {
                    /* alone and the pool is full: this choice cannot grow */
                    sched_cut_by_pool(s, r, c);
                }
                return 1;
            }
            add_group(s, r, c, 1, true, false);
            reserved += need;
            budget--;
        }
    }
    /* speculative decoding: guesses for some decode tokens, from what budget and blocks are left */
    sched_spec_extend(s, &budget, &reserved);
    /* 2. prompt chunks and recomputation of admitted requests */
    for (int32_t i = 0; i < s->running.n && budget > 0; i++) prefill_request(s, s->running.v[i], &budget, &reserved);
    /* 3. admissions in queue order: stop at the first request that must wait */
    while (s->waiting.n > 0 && budget > 0) {
        sched_req *h = s->waiting.v[0];
        int rc = sched_admit_head(s);
        if (rc == 0) break;
        if (rc < 0) {
            bool never = !h->admitted_once;
            if (sched_emit_outputs(s, h) && never) { (*dropped_new)++; s->dropped_tokens += h->rq.n_prompt; }
            continue;
        }
        prefill_request(s, h, &budget, &reserved);
    }
    return 0;
}

static void step(srv_sched *s) {
    int32_t dropped_new = 0;
    s->step_no++;
    handle_cancels(s, &dropped_new);
    for (;;) {
        if (build(s, &dropped_new) != 0) continue;
        if (s->n_entries == 0) {
            if (s->running.n == 0) {
                if (s->waiting.n > 0) {
                    /* nothing runs and the head cannot start: it never will (defensive; admit_head rejects
                     * what cannot fit) */
                    sched_req *h = s->waiting.v[0];
                    bool never = !h->admitted_once;
                    sched_fail_request(s, h, "the request cannot be scheduled");
                    if (sched_emit_outputs(s, h) && never) { dropped_new++; s->dropped_tokens += h->rq.n_prompt; }
                    continue;
                }
                break;
            }
            if (sched_load_idle(s)) break; /* the running wait for their prefixes from disk */
            sched_relieve_pool(s);
            continue;
        }
        eng_batch b = {.n = s->n_entries, .token = s->b_token, .pos = s->b_pos, .seq = s->b_seq,
                       .want_logits = s->b_logits, .want_embd = s->batch_embd ? s->b_embd : NULL};
        uint64_t t0 = sched_step_clock(s);
        int rc = s->ops.decode(s->ops.ctx, &b);
        if (rc == ENG_OK) sched_spec_observe(s, s->n_entries, sched_step_clock(s) - t0);
        if (rc == ENG_ERR_KV_FULL) {
            sched_relieve_pool(s);
            continue;
        }
        s->counters.steps++;
        s->counters.batch_tokens_total += (uint64_t)s->n_entries;
        if (rc != ENG_OK) {
            const char *msg = engine_error(rc);
            for (int32_t g = 0; g < s->n_groups; g++) sched_fail_request(s, s->groups[g].r, msg);
            break;
        }
        for (int32_t g = 0; g < s->n_groups; g++) {
            batch_group *gr = &s->groups[g];
            sched_choice *c = gr->c;
            if (c->finished) continue;
            if (gr->n_draft > 0) {
                sched_spec_verify(s, gr);
                continue;
            }
            int32_t pos0 = c->n_cached;
            c->n_cached += gr->n;
            if (gr->prompt) {
                s->counters.prompt_tokens_computed += (uint64_t)gr->n;
                gr->r->timings.n_prompt_computed += gr->n;
            }
            if (gr->r->rq.embed) sched_pool_rows(s, gr->r, c, gr->first, gr->n, pos0);
            else if (gr->logits) handle_logits(s, gr->r, c, gr->first + gr->n - 1);
        }
        break;
    }
    for (int32_t i = s->running.n - 1; i >= 0; i--) sched_emit_outputs(s, s->running.v[i]);
    kvt_step_end(s->p.tier);
    if (s->p.on_step) s->p.on_step(s->p.on_step_ctx);
    sched_post_events(s, dropped_new);
}

/* ---- threads --------------------------------------------------------------------------------------------------- */
static void thread_main(void *arg) {
    srv_sched *s = arg;
    uv_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && s->incoming.n == 0 && s->running.n == 0 && s->waiting.n == 0 && !s->cancel_signal)
            uv_cond_wait(&s->cv, &s->mu);
        if (s->stop) break;
        s->cancel_signal = false;
        /* into the waiting queue; on allocation failure the rest stay incoming and are retried next time */
        int32_t moved = 0;
        while (moved < s->incoming.n && sched_vec_insert_sorted(&s->waiting, s->incoming.v[moved]) == 0)
            sched_trace(s, SRV_SCHED_TRACE_QUEUED, s->incoming.v[moved++], false);
        memmove(s->incoming.v, s->incoming.v + moved, (size_t)(s->incoming.n - moved) * sizeof *s->incoming.v);
        s->incoming.n -= moved;
        uv_mutex_unlock(&s->mu);
        step(s);
        uv_mutex_lock(&s->mu);
    }
    uv_mutex_unlock(&s->mu);
}

/* Loop thread: delivers queued events. DELTA events of cancelled requests are dropped; after DONE the request
 * is freed. */
static void dispatch(srv_sched *s) {
    uv_mutex_lock(&s->mu);
    sched_event *e = s->ev_head;
    s->ev_head = s->ev_tail = NULL;
    uv_mutex_unlock(&s->mu);
    while (e) {
        sched_event *next = e->next;
        sched_req *r = e->req;
        if (!(e->ev.type == SRV_SCHED_EV_DELTA && atomic_load(&r->cancelled))) r->rq.cb(&e->ev, r->rq.user);
        if (!e->prealloc) {
            free(e->text);
            free(e->samples);
            free(e);
        } else if (e->ev.type == SRV_SCHED_EV_DONE) {
            req_free(s, r);
        }
        e = next;
    }
}

static void on_async(uv_async_t *h) { dispatch(h->data); }

static void on_async_close(uv_handle_t *h) { free(h); }

/* Frees the scheduler's own buffers and the struct. */
static void free_bufs(srv_sched *s) {
    sched_spec_release(s);
    sched_draft_release(s);
    sched_slots_free(s);
    KVS_FREE_ALL(s->incoming.v, s->waiting.v, s->running.v, s->eog, s->b_token, s->b_pos, s->b_seq, s->b_logits,
                 s->b_embd, s->groups, s->logit_buf, s->tok_buf, s);
}

/* ---- API ------------------------------------------------------------------------------------------------------- */
int srv_sched_create(const srv_sched_params *params, const srv_engine_ops *ops, uv_loop_t *loop, srv_sched **out) {
    if (!params || !ops || !loop || !out) return SRV_SCHED_ERR_INVALID;
    *out = NULL;
    if (params->batch_tokens < 1 || params->parallel < 1 || params->max_queue < 1 || params->n_ctx < 0 ||
        params->max_queued_tokens < 0 || (params->policy != SRV_SCHED_FCFS && params->policy != SRV_SCHED_PRIORITY))
        return SRV_SCHED_ERR_INVALID;
    if ((params->spec_type != SRV_SCHED_SPEC_NONE && params->spec_type != SRV_SCHED_SPEC_NGRAM &&
         params->spec_type != SRV_SCHED_SPEC_DRAFT) ||
        (params->spec_type == SRV_SCHED_SPEC_DRAFT && !params->draft) || !(params->spec_p_min >= 0) ||
        params->spec_p_min > 1 ||
        params->spec_n_max < 1 || params->spec_n_max > SRV_SCHED_SPEC_MAX || params->spec_n_min < 0 ||
        params->spec_n_min > params->spec_n_max || params->spec_ngram_min < 1 ||
        params->spec_ngram_max < params->spec_ngram_min || params->spec_ngram_max > 64)
        return SRV_SCHED_ERR_INVALID;
    if (ops->n_vocab < 1 || !ops->cache || !ops->decode || !ops->get_logits || !ops->token_is_eog ||
        !ops->detok_push || !ops->detok_flush || !ops->sampler_create || !ops->sampler_free ||
        !ops->sampler_sample)
        return SRV_SCHED_ERR_INVALID;
    kvc_cache *cache = ops->cache(ops->ctx);
    if (!cache) return SRV_SCHED_ERR_INVALID;
    srv_sched *s = calloc(1, sizeof *s);
    if (!s) return SRV_SCHED_ERR_NOMEM;
    s->p = *params;
    s->ops = *ops;
    srv_block_manager_init(&s->bm, cache);
    s->bm.tier = params->tier;
    s->bm.host = params->host;
    s->block_size = s->bm.block_size;
    s->blocks_total = s->bm.n_blocks;
    s->next_id = 1;
    size_t nb = (size_t)params->batch_tokens;
    s->b_token = malloc(nb * sizeof *s->b_token);
    s->b_pos = malloc(nb * sizeof *s->b_pos);
    s->b_seq = malloc(nb * sizeof *s->b_seq);
    s->b_logits = malloc(nb * sizeof *s->b_logits);
    s->b_embd = malloc(nb * sizeof *s->b_embd);
    s->groups = malloc(nb * sizeof *s->groups);
    s->logit_buf = malloc((size_t)ops->n_vocab * sizeof *s->logit_buf);
    s->n_slots = params->parallel;
    s->slot_tok = calloc((size_t)s->n_slots, sizeof *s->slot_tok);
    s->slot_n = calloc((size_t)s->n_slots, sizeof *s->slot_n);
    if (!s->b_token || !s->b_pos || !s->b_seq || !s->b_logits || !s->b_embd || !s->groups || !s->logit_buf ||
        !s->slot_tok || !s->slot_n)
        goto nomem;
    s->p.draft = NULL; /* the draft's engine is copied into s->dops */
    if (params->spec_type == SRV_SCHED_SPEC_DRAFT) {
        s->p.draft = params->draft;
        int rc = sched_draft_init(s);
        if (rc != SRV_SCHED_OK) {
            free_bufs(s);
            return rc;
        }
    }
    for (int32_t t = 0; t < ops->n_vocab; t++) {
        if (!ops->token_is_eog(ops->ctx, t)) continue;
        int32_t *e = realloc(s->eog, (size_t)(s->n_eog + 1) * sizeof *e);
        if (!e) goto nomem;
        s->eog = e;
        s->eog[s->n_eog++] = t;
    }
    if (uv_mutex_init(&s->mu) != 0) {
        free_bufs(s);
        return SRV_SCHED_ERR_THREAD;
    }
    if (uv_cond_init(&s->cv) != 0) {
        uv_mutex_destroy(&s->mu);
        free_bufs(s);
        return SRV_SCHED_ERR_THREAD;
    }
    s->async = malloc(sizeof *s->async);
    if (!s->async || uv_async_init(loop, s->async, on_async) != 0) {
        free(s->async);
        uv_cond_destroy(&s->cv);
        uv_mutex_destroy(&s->mu);
        free_bufs(s);
        return SRV_SCHED_ERR_THREAD;
    }
    s->async->data = s;
    s->loop = loop;
    uv_mutex_lock(&s->mu);
    sched_refresh_stats_locked(s);
    uv_mutex_unlock(&s->mu);
    if (uv_thread_create(&s->thread, thread_main, s) != 0) {
        uv_close((uv_handle_t *)s->async, on_async_close);
        uv_cond_destroy(&s->cv);
        uv_mutex_destroy(&s->mu);
        free_bufs(s);
        return SRV_SCHED_ERR_THREAD;
    }
    s->thread_started = true;
    *out = s;
    return SRV_SCHED_OK;
nomem:
    free_bufs(s);
    return SRV_SCHED_ERR_NOMEM;
}

void srv_sched_free(srv_sched *s) {
    if (!s) return;
    uv_mutex_lock(&s->mu);
    s->stop = true;
    uv_cond_signal(&s->cv);
    uv_mutex_unlock(&s->mu);
    if (s->thread_started) uv_thread_join(&s->thread);
    /* The scheduler thread is gone: this thread now owns the engine state. End everything as cancelled. */
    for (int32_t i = 0; i < s->incoming.n; i++) {
        sched_req *r = s->incoming.v[i];
        sched_trace(s, SRV_SCHED_TRACE_QUEUED, r, false);
        if (sched_vec_insert_sorted(&s->waiting, r) != 0) {
            /* cannot list it: end it directly */
            end_cancelled(s, r);
            sched_emit_outputs(s, r);
        }
    }
    s->incoming.n = 0;
    while (s->running.n > 0) {
        sched_req *r = s->running.v[s->running.n - 1];
        end_cancelled(s, r);
        sched_emit_outputs(s, r);
    }
    while (s->waiting.n > 0) {
        sched_req *r = s->waiting.v[s->waiting.n - 1];
        end_cancelled(s, r);
        sched_emit_outputs(s, r);
    }
    sched_post_events(s, 0);
    dispatch(s);
    uv_cond_destroy(&s->cv);
    uv_mutex_destroy(&s->mu);
    if (s->async) uv_close((uv_handle_t *)s->async, on_async_close);
    free_bufs(s);
}

int srv_sched_submit(srv_sched *s, const srv_sched_request *req, uint64_t *id) {
    if (!s || !req || !id || !req->cb || !req->prompt || req->n_prompt < 1 || req->n < 1 ||
        req->n > s->p.parallel || (req->n_stop > 0 && !req->stop) ||
        (s->p.policy == SRV_SCHED_FCFS && req->priority != 0) ||
        (req->sampling.n_logit_bias > 0 && !req->sampling.logit_bias) || req->sampling.n_top_logprobs < 0 ||
        req->sampling.n_top_logprobs > KVS_MAX_TOP_LOGPROBS || req->spec_n_max < -1 ||
        req->spec_n_max > SRV_SCHED_SPEC_MAX || req->spec_n_min < -1 || req->spec_n_min > SRV_SCHED_SPEC_MAX)
        return SRV_SCHED_ERR_INVALID;
    for (int32_t i = 0; i < req->n_prompt; i++)
        if (req->prompt[i] < 0 || req->prompt[i] >= s->ops.n_vocab) return SRV_SCHED_ERR_INVALID;
    if (s->p.n_ctx > 0 && req->n_prompt >= s->p.n_ctx) return SRV_SCHED_ERR_TOO_LONG;
    if (req->embed && (req->n != 1 || (int)req->pooling < SRV_SCHED_POOL_MEAN || req->pooling > SRV_SCHED_POOL_RANK))
        return SRV_SCHED_ERR_INVALID;
    if (req->embed && (!s->ops.get_embd || s->ops.n_embd < 1)) return KVS_ERR_UNSUPPORTED;
    if (req->embed && req->pooling == SRV_SCHED_POOL_RANK &&
        (!s->ops.get_rank || s->ops.n_rank < 1 || s->ops.n_rank > s->ops.n_embd))
        return KVS_ERR_UNSUPPORTED;
    if (s->ops.whole_prompts && !req->embed) return KVS_ERR_UNSUPPORTED; /* an encoder does not generate */
    if (s->ops.whole_prompts && req->n_prompt > s->p.batch_tokens) return SRV_SCHED_ERR_TOO_LONG;
    sched_req *r = calloc(1, sizeof *r);
    if (!r) return SRV_SCHED_ERR_NOMEM;
    r->rq = *req;
    r->rq.stop = NULL;
    r->rq.n_stop = 0;
    r->rq.grammar = NULL;
    if (req->n_keep < 0 || req->n_keep > req->n_prompt) r->rq.n_keep = req->n_prompt;
    if (req->embed) {
        r->embd_acc = calloc((size_t)s->ops.n_embd, sizeof *r->embd_acc);
        r->embd = calloc((size_t)s->ops.n_embd, sizeof *r->embd);
        if (!r->embd_acc || !r->embd) {
            free(r->embd_acc);
            free(r->embd);
            free(r);
            return SRV_SCHED_ERR_NOMEM;
        }
    }
    r->ch = calloc((size_t)req->n, sizeof *r->ch);
    r->prompt = malloc((size_t)req->n_prompt * sizeof *r->prompt);
    r->end_ev = calloc((size_t)req->n, sizeof *r->end_ev);
    r->done_ev = calloc(1, sizeof *r->done_ev);
    if (!r->ch || !r->prompt || !r->end_ev || !r->done_ev) goto nomem;
    memcpy(r->prompt, req->prompt, (size_t)req->n_prompt * sizeof *r->prompt);
    r->rq.prompt = r->prompt;
    if (req->sampling.n_logit_bias > 0) {
        r->bias = malloc(req->sampling.n_logit_bias * sizeof *r->bias);
        if (!r->bias) goto nomem;
        memcpy(r->bias, req->sampling.logit_bias, req->sampling.n_logit_bias * sizeof *r->bias);
    }
    r->rq.sampling.logit_bias = r->bias;
    atomic_init(&r->cancelled, false);
    r->n_unfinished = req->n;
    r->usage.prompt_tokens = req->n_prompt;
    for (int32_t i = 0; i < req->n; i++) {
        r->ch[i].idx = i;
        r->ch[i].seq = -1;
        r->ch[i].clean = INT32_MAX;
        if (srv_stop_create(req->stop, req->n_stop, &r->ch[i].stop) != SRV_STOP_OK) goto nomem;
    }
    if (req->grammar) {
        int grc = sched_grammar_init(s, r, req->grammar);
        if (grc != SRV_SCHED_OK) {
            req_free(s, r);
            return grc;
        }
    }
    r->timings.t_submit = uv_hrtime();
    uv_mutex_lock(&s->mu);
    if (s->stop) {
        uv_mutex_unlock(&s->mu);
        req_free(s, r);
        return SRV_SCHED_ERR_STOPPED;
    }
    bool over_tokens = s->p.max_queued_tokens > 0 && s->n_queued_new > 0 &&
                       s->n_queued_tokens + req->n_prompt > s->p.max_queued_tokens;
    if (s->n_queued_new >= s->p.max_queue || over_tokens) {
        if (s->n_queued_new >= s->p.max_queue) s->stats.requests_rejected++;
        else s->stats.requests_rejected_tokens++;
        uv_mutex_unlock(&s->mu);
        req_free(s, r);
        return SRV_SCHED_ERR_QUEUE_FULL;
    }
    if (sched_vec_insert(&s->incoming, s->incoming.n, r) != 0) {
        uv_mutex_unlock(&s->mu);
        req_free(s, r);
        return SRV_SCHED_ERR_NOMEM;
    }
    r->id = s->next_id++;
    s->n_queued_new++;
    s->n_queued_tokens += req->n_prompt;
    s->stats.queued_tokens = s->n_queued_tokens;
    s->stats.requests_waiting++;
    r->live_next = s->live;
    if (s->live) s->live->live_prev = r;
    s->live = r;
    *id = r->id;
    uv_cond_signal(&s->cv);
    uv_mutex_unlock(&s->mu);
    return SRV_SCHED_OK;
nomem:
    req_free(s, r);
    return SRV_SCHED_ERR_NOMEM;
}

int srv_sched_cancel(srv_sched *s, uint64_t id) {
    if (!s) return SRV_SCHED_ERR_INVALID;
    int rc = SRV_SCHED_ERR_NOT_FOUND;
    uv_mutex_lock(&s->mu);
    for (sched_req *r = s->live; r; r = r->live_next)
        if (r->id == id) {
            atomic_store(&r->cancelled, true);
            s->cancel_signal = true;
            uv_cond_signal(&s->cv);
            rc = SRV_SCHED_OK;
            break;
        }
    uv_mutex_unlock(&s->mu);
    return rc;
}

void srv_sched_get_stats(srv_sched *s, srv_sched_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!s) return;
    uv_mutex_lock(&s->mu);
    *out = s->stats;
    uv_mutex_unlock(&s->mu);
}
