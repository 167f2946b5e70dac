/* scheduler.c: continuous-batching scheduler (see scheduler.h for the contract).
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
#include "server/scheduler.h"
#include "server/stop.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- data ------------------------------------------------------------------------------------------------ */
typedef struct sched_choice {
    int32_t idx;
    int32_t seq;            /* cache sequence id, -1 when none */
    int32_t n_cached;       /* tokens of the known tokens committed in seq */
    int32_t *gen;           /* generated tokens [n_gen] */
    int32_t n_gen, cap_gen;
    void *sampler;          /* created on the scheduler thread at first admission */
    eng_detok detok;
    srv_stop *stop;
    bool finished;
    srv_sched_finish reason;
    const char *error;      /* static message for FINISH_ERROR */
    /* output of the current step */
    char *txt;
    size_t txt_len, txt_cap;
    eng_sample *smp;
    int32_t n_smp, cap_smp;
    bool end_pending;       /* finished in this step: post CHOICE_END */
} sched_choice;

typedef struct sched_req {
    uint64_t id;
    struct sched_req *live_prev, *live_next; /* the live list (under mu) */
    int32_t *prompt;
    int32_t n_prompt;
    int32_t n;
    int32_t max_tokens;
    eng_sampling_params sp;
    eng_logit_bias *bias;
    bool ignore_eos;
    bool penalize_prompt;
    srv_sched_event_cb cb;
    void *user;
    atomic_bool cancelled;      /* set by the loop thread */
    bool cancel_handled;        /* scheduler thread */
    bool admitted_once;
    bool protect;               /* preempted, no token since: not a preemption victim */
    int32_t n_unfinished;
    sched_choice *ch;
    srv_sched_usage usage;
    srv_sched_timings timings;
    bool had_error;
    uint64_t preempt_step;      /* step_no of the last preemption */
    bool running;               /* in s->running (its unfinished choices are counted in seqs_reserved) */
    struct sched_event *end_ev; /* [n] CHOICE_END events, allocated at submit */
    struct sched_event *done_ev;/* the DONE event, allocated at submit */
} sched_req;

typedef struct sched_event {
    struct sched_event *next;
    sched_req *req;
    srv_sched_event ev;
    char *text;          /* owned copy (DELTA) */
    eng_sample *samples; /* owned copy (DELTA) */
    bool prealloc;       /* part of the request's end_ev / done_ev: freed with the request */
} sched_event;

/* A growable array of request pointers. */
typedef struct req_vec {
    sched_req **v;
    int32_t n, cap;
} req_vec;

/* One sequence's run of entries in the batch being built. */
typedef struct batch_group {
    sched_req *r;
    sched_choice *c;
    int32_t first;   /* first entry index */
    int32_t n;       /* entries */
    bool logits;     /* the last entry wants logits */
    bool prompt;     /* counts as prompt computation (not a decode token) */
} batch_group;

struct srv_sched {
    srv_sched_params p;
    srv_engine_ops ops;
    kvc_cache *cache;
    int32_t block_size;
    int32_t blocks_total;
    int32_t *eog;            /* EOG token ids [n_eog] (banned for ignore_eos) */
    int32_t n_eog;

    uv_loop_t *loop;
    uv_async_t *async;       /* heap: freed in its close callback */
    uv_thread_t thread;
    bool thread_started;
    uv_mutex_t mu;
    uv_cond_t cv;

    /* under mu */
    bool stop;
    uint64_t next_id;
    req_vec incoming;
    int32_t n_queued_new;    /* submitted, never admitted, not finished (bounded by max_queue) */
    int64_t n_queued_tokens; /* their prompt tokens (bounded by max_queued_tokens); under mu */
    int64_t dropped_tokens;  /* scheduler thread: prompt tokens of never-admitted requests ended this step */
    sched_req *live;         /* every request whose DONE is not posted */
    sched_event *ev_head, *ev_tail;
    srv_sched_stats stats;
    bool cancel_signal;

    /* scheduler thread only */
    req_vec waiting;         /* sorted by id (FCFS; preempted requests keep their place) */
    req_vec running;         /* sorted by id */
    int32_t seqs_reserved;   /* unfinished choices of running requests */
    int32_t *b_token, *b_pos, *b_seq;
    bool *b_logits;
    kvc_entry *b_entries;
    batch_group *groups;
    int32_t n_entries, n_groups;
    float *logit_buf;        /* [n_vocab] scratch */
    int32_t *tok_buf;        /* scratch for attach/match, grown on demand */
    int32_t tok_cap;
    char piece[256];
    sched_event *out_head, *out_tail; /* events of the current step, posted at its end */
    /* counters owned by the thread, copied into stats */
    uint64_t c_prompt_total, c_prompt_computed, c_gen_total, c_preempt, c_thrash, c_steps, c_batch_tokens;
    uint64_t c_copy_query, c_copy_hit; /* prefix lookups served by copying from a running sequence */
    uint64_t c_finished[5];
    uint64_t step_no;        /* steps started (numbering for preempt_step) */
};

/* ---- small helpers ---------------------------------------------------------------------------------------- */
const char *srv_sched_strerror(int err) {
    switch (err) {
    case SRV_SCHED_OK: return "ok";
    case SRV_SCHED_ERR_INVALID: return "invalid argument";
    case SRV_SCHED_ERR_NOMEM: return "out of memory";
    case SRV_SCHED_ERR_QUEUE_FULL: return "request queue is full";
    case SRV_SCHED_ERR_NOT_FOUND: return "no such request";
    case SRV_SCHED_ERR_STOPPED: return "scheduler is stopping";
    case SRV_SCHED_ERR_THREAD: return "could not create a thread or handle";
    case SRV_SCHED_ERR_TOO_LONG: return "prompt is longer than the context";
    default: return "unknown error";
    }
}

const char *srv_sched_finish_name(srv_sched_finish f) {
    switch (f) {
    case SRV_SCHED_FINISH_STOP: return "stop";
    case SRV_SCHED_FINISH_LENGTH: return "length";
    case SRV_SCHED_FINISH_CANCELLED: return "cancelled";
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
    p->max_queued_tokens = 0;
    p->on_step = NULL;
    p->on_step_ctx = NULL;
}

static int vec_insert(req_vec *q, int32_t at, sched_req *r) {
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

/* Inserts keeping the vector sorted by id. */
static int vec_insert_sorted(req_vec *q, sched_req *r) {
    int32_t at = q->n;
    while (at > 0 && q->v[at - 1]->id > r->id) at--;
    return vec_insert(q, at, r);
}

static void vec_remove(req_vec *q, sched_req *r) {
    for (int32_t i = 0; i < q->n; i++)
        if (q->v[i] == r) {
            memmove(q->v + i, q->v + i + 1, (size_t)(q->n - i - 1) * sizeof *q->v);
            q->n--;
            return;
        }
}

static int append_text(sched_choice *c, const char *t, size_t n) {
    if (n == 0) return 0;
    if (c->txt_len + n > c->txt_cap) {
        size_t cap = c->txt_cap ? c->txt_cap : 64;
        while (cap < c->txt_len + n) cap *= 2;
        char *p = realloc(c->txt, cap);
        if (!p) return -1;
        c->txt = p;
        c->txt_cap = cap;
    }
    memcpy(c->txt + c->txt_len, t, n);
    c->txt_len += n;
    return 0;
}

static void req_free(srv_sched *s, sched_req *r) {
    if (!r) return;
    if (r->ch) {
        for (int32_t i = 0; i < r->n; i++) {
            sched_choice *c = &r->ch[i];
            if (c->sampler) s->ops.sampler_free(s->ops.ctx, c->sampler);
            srv_stop_free(c->stop);
            free(c->gen);
            free(c->txt);
            free(c->smp);
        }
        free(r->ch);
    }
    free(r->end_ev);
    free(r->done_ev);
    free(r->prompt);
    free(r->bias);
    free(r);
}

static inline int32_t known_len(const sched_req *r, const sched_choice *c) { return r->n_prompt + c->n_gen; }

static inline int32_t token_at(const sched_req *r, const sched_choice *c, int32_t pos) {
    return pos < r->n_prompt ? r->prompt[pos] : c->gen[pos - r->n_prompt];
}

/* The choice's known tokens as one array (scratch, valid until the next call); NULL on allocation failure. */
static const int32_t *known_tokens(srv_sched *s, const sched_req *r, const sched_choice *c) {
    int32_t n = known_len(r, c);
    if (c->n_gen == 0) return r->prompt;
    if (n > s->tok_cap) {
        int32_t *p = realloc(s->tok_buf, (size_t)n * sizeof *p);
        if (!p) return NULL;
        s->tok_buf = p;
        s->tok_cap = n;
    }
    memcpy(s->tok_buf, r->prompt, (size_t)r->n_prompt * sizeof *s->tok_buf);
    memcpy(s->tok_buf + r->n_prompt, c->gen, (size_t)c->n_gen * sizeof *s->tok_buf);
    return s->tok_buf;
}

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

static void finish_choice(srv_sched *s, sched_req *r, sched_choice *c, srv_sched_finish reason, const char *error);

/* Appends a token's text to the choice's output through the stop matcher; finishes it on a stop string. */
static void feed_text(srv_sched *s, sched_req *r, sched_choice *c, const char *t, size_t n) {
    const char *o;
    size_t ol;
    bool stopped = false;
    if (srv_stop_push(c->stop, t, n, &o, &ol, &stopped) != SRV_STOP_OK) {
        finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "out of memory");
        return;
    }
    if (append_text(c, o, ol) != 0) {
        finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "out of memory");
        return;
    }
    if (stopped) finish_choice(s, r, c, SRV_SCHED_FINISH_STOP, NULL);
}

/* Runs a detokenizer call into s->piece or a heap buffer when the piece is longer. */
static int detok_call(srv_sched *s, eng_detok *d, int32_t token, bool flush, char **heap, const char **out,
                      size_t *n) {
    *heap = NULL;
    int rc = flush ? s->ops.detok_flush(s->ops.ctx, d, s->piece, sizeof s->piece, n)
                   : s->ops.detok_push(s->ops.ctx, d, token, s->piece, sizeof s->piece, n);
    if (rc == ENG_ERR_TOO_LARGE && *n > sizeof s->piece) {
        size_t need = *n;
        *heap = malloc(need);
        if (!*heap) return ENG_ERR_NOMEM;
        rc = flush ? s->ops.detok_flush(s->ops.ctx, d, *heap, need, n)
                   : s->ops.detok_push(s->ops.ctx, d, token, *heap, need, n);
        *out = *heap;
    } else {
        *out = s->piece;
    }
    return rc;
}

/* Ends a choice: frees its sequence, and for a normal end releases the text still held by the detokenizer
 * and the stop matcher. */
static void finish_choice(srv_sched *s, sched_req *r, sched_choice *c, srv_sched_finish reason, const char *error) {
    if (c->finished) return;
    c->finished = true;
    c->reason = reason;
    c->error = error;
    c->end_pending = true;
    if (c->seq >= 0) {
        kvc_seq_free(s->cache, c->seq);
        c->seq = -1;
        c->n_cached = 0;
    }
    r->n_unfinished--;
    if (r->n_unfinished == 0) r->timings.t_end = uv_hrtime();
    if (r->running) s->seqs_reserved--;
    if (reason == SRV_SCHED_FINISH_ERROR) r->had_error = true;
    if (reason == SRV_SCHED_FINISH_STOP || reason == SRV_SCHED_FINISH_LENGTH) {
        if (!srv_stop_is_stopped(c->stop)) {
            char *heap;
            const char *t;
            size_t n = 0;
            if (detok_call(s, &c->detok, 0, true, &heap, &t, &n) == ENG_OK && n > 0) {
                const char *o;
                size_t ol;
                bool stopped = false;
                if (srv_stop_push(c->stop, t, n, &o, &ol, &stopped) == SRV_STOP_OK) {
                    (void)append_text(c, o, ol);
                    if (stopped) c->reason = SRV_SCHED_FINISH_STOP;
                }
            }
            free(heap);
            const char *o;
            size_t ol;
            if (srv_stop_flush(c->stop, &o, &ol) == SRV_STOP_OK) (void)append_text(c, o, ol);
        }
    }
}

/* Turns what the request's choices produced in this step into events (out list). When every choice has
 * ended, also the DONE event; the request then leaves the running / waiting lists and the caller must not
 * touch it again after the events are posted. Returns true when the request is done. */
static bool emit_outputs(srv_sched *s, sched_req *r) {
    uint64_t now = uv_hrtime();
    for (int32_t i = 0; i < r->n; i++) {
        sched_choice *c = &r->ch[i];
        if (c->n_smp > 0 || c->txt_len > 0) {
            sched_event *e = calloc(1, sizeof *e);
            if (e) {
                e->req = r;
                e->ev.type = SRV_SCHED_EV_DELTA;
                e->ev.id = r->id;
                e->ev.choice = i;
                e->ev.t = now;
                if (c->txt_len > 0) {
                    e->text = malloc(c->txt_len);
                    if (e->text) memcpy(e->text, c->txt, c->txt_len);
                }
                if (c->n_smp > 0) {
                    e->samples = malloc((size_t)c->n_smp * sizeof *e->samples);
                    if (e->samples) memcpy(e->samples, c->smp, (size_t)c->n_smp * sizeof *e->samples);
                }
                if ((c->txt_len > 0 && !e->text) || (c->n_smp > 0 && !e->samples)) {
                    free(e->text);
                    free(e->samples);
                    free(e);
                } else {
                    e->ev.text = e->text;
                    e->ev.text_len = c->txt_len;
                    e->ev.samples = e->samples;
                    e->ev.n_samples = c->n_smp;
                    out_push(s, e);
                }
            }
            c->txt_len = 0;
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
            e->ev.error = c->reason == SRV_SCHED_FINISH_ERROR ? (c->error ? c->error : "internal error") : NULL;
            out_push(s, e);
        }
    }
    if (r->n_unfinished > 0) return false;
    /* done: release engine-side state here, on the scheduler thread */
    srv_sched_finish overall = SRV_SCHED_FINISH_STOP;
    const char *error = NULL;
    bool any_cancel = false, any_length = false;
    for (int32_t i = 0; i < r->n; i++) {
        sched_choice *c = &r->ch[i];
        if (c->reason == SRV_SCHED_FINISH_ERROR && !error) error = c->error ? c->error : "internal error";
        any_cancel |= c->reason == SRV_SCHED_FINISH_CANCELLED;
        any_length |= c->reason == SRV_SCHED_FINISH_LENGTH;
        if (c->sampler) {
            s->ops.sampler_free(s->ops.ctx, c->sampler);
            c->sampler = NULL;
        }
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
    out_push(s, e);
    s->c_finished[overall]++;
    if (r->running) vec_remove(&s->running, r);
    else vec_remove(&s->waiting, r);
    r->running = false;
    return true;
}

/* Posts the step's events: appends them to the shared queue, unlinks finished requests from the live list
 * (in the same critical section, so srv_sched_cancel never finds a request whose DONE is queued), refreshes
 * the stats and wakes the loop. */
static void refresh_stats_locked(srv_sched *s);

static void post_events(srv_sched *s, int32_t dropped_new) {
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
    refresh_stats_locked(s);
    uv_mutex_unlock(&s->mu);
    if (any && s->async) uv_async_send(s->async);
}

static void refresh_stats_locked(srv_sched *s) {
    srv_sched_stats *st = &s->stats;
    kvc_stats ks;
    kvc_get_stats(s->cache, &ks);
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
    st->prompt_tokens_total = s->c_prompt_total;
    st->prompt_tokens_computed = s->c_prompt_computed;
    st->generation_tokens_total = s->c_gen_total;
    st->preemptions = s->c_preempt;
    st->preemptions_repeated = s->c_thrash;
    st->steps = s->c_steps;
    st->batch_tokens_total = s->c_batch_tokens;
    for (int i = 0; i < 5; i++) st->requests_finished[i] = s->c_finished[i];
    st->queued_tokens = s->n_queued_tokens;
}

/* ---- preemption --------------------------------------------------------------------------------------------- */
/* Frees the request's sequences and puts it back in the waiting queue at its FCFS place (ahead of every
 * request that arrived after it). Samplers, detokenizers, stop matchers and generated tokens are kept. */
static void preempt(srv_sched *s, sched_req *r) {
    for (int32_t i = 0; i < r->n; i++) {
        sched_choice *c = &r->ch[i];
        if (c->seq >= 0) {
            kvc_seq_free(s->cache, c->seq);
            c->seq = -1;
            c->n_cached = 0;
        }
    }
    if (r->protect) s->c_thrash++;
    s->c_preempt++;
    r->timings.n_preempted++;
    r->protect = true;
    r->preempt_step = s->step_no;
    s->seqs_reserved -= r->n_unfinished;
    vec_remove(&s->running, r);
    r->running = false;
    if (vec_insert_sorted(&s->waiting, r) != 0) {
        /* cannot requeue: end it rather than lose it */
        for (int32_t i = 0; i < r->n; i++)
            finish_choice(s, r, &r->ch[i], SRV_SCHED_FINISH_ERROR, "out of memory");
        emit_outputs(s, r);
    }
}

/* The request to preempt when the pool is full: the latest-arrived running request that has made progress
 * since its last preemption; failing that, the latest-arrived one (a repeated preemption, counted), but never
 * the only running request. NULL when fewer than two requests run. */
static sched_req *pick_victim(srv_sched *s) {
    if (s->running.n < 2) return NULL;
    for (int32_t i = s->running.n - 1; i >= 0; i--)
        if (!s->running.v[i]->protect) return s->running.v[i];
    return s->running.v[s->running.n - 1];
}

/* ---- batch building ------------------------------------------------------------------------------------------ */
static int32_t blocks_avail(srv_sched *s, int32_t reserved) { return kvc_blocks_available(s->cache) - reserved; }

static void add_group(srv_sched *s, sched_req *r, sched_choice *c, int32_t n, bool logits, bool prompt) {
    batch_group *g = &s->groups[s->n_groups++];
    g->r = r;
    g->c = c;
    g->first = s->n_entries;
    g->n = n;
    g->logits = logits;
    g->prompt = prompt;
    for (int32_t k = 0; k < n; k++) {
        int32_t i = s->n_entries++;
        int32_t pos = c->n_cached + k;
        s->b_token[i] = token_at(r, c, pos);
        s->b_pos[i] = pos;
        s->b_seq[i] = c->seq;
        s->b_logits[i] = logits && k == n - 1;
    }
}

static bool choice_in_batch(const srv_sched *s, const sched_choice *c) {
    for (int32_t i = 0; i < s->n_groups; i++)
        if (s->groups[i].c == c) return true;
    return false;
}

/* Whether choice c (no sequence yet) should wait because a running, still prefilling sequence is computing
 * at least one full block of its prefix that is not committed yet: it then attaches those blocks later
 * instead of computing them a second time. */
static bool prefix_wait(srv_sched *s, const sched_req *r, const sched_choice *c) {
    int32_t n = known_len(r, c) - 1; /* attachable tokens */
    if (n < s->block_size) return false;
    for (int32_t i = 0; i < s->running.n; i++) {
        const sched_req *p = s->running.v[i];
        for (int32_t j = 0; j < p->n; j++) {
            const sched_choice *d = &p->ch[j];
            if (d == c || d->finished || d->seq < 0) continue;
            int32_t kd = known_len(p, d);
            if (kd - d->n_cached <= 1) continue; /* not prefilling */
            int32_t lim = n < kd ? n : kd, l = 0;
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
        for (int32_t j = 0; j < p->n; j++) {
            const sched_choice *d = &p->ch[j];
            if (d == c || d->finished || d->seq < 0) continue;
            int32_t lim = kvc_seq_len(s->cache, d->seq), kd = known_len(p, d);
            if (kd < lim) lim = kd;
            if (n < lim) lim = n;
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
 * partial block copied), so no token of it is computed twice. Returns 0, or -1 when no sequence id is free
 * (then nothing changed) or on an allocation failure (then the choice has failed). */
static int start_seq(srv_sched *s, sched_req *r, sched_choice *c) {
    int32_t seq;
    if (kvc_seq_alloc(s->cache, &seq) != KVC_OK) return -1;
    const int32_t *toks = known_tokens(s, r, c);
    if (!toks) {
        kvc_seq_free(s->cache, seq);
        finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "out of memory");
        return -1;
    }
    int32_t cached = 0, n = known_len(r, c) - 1, donor = -1, matched = 0;
    int32_t shared = best_donor(s, r, c, n, &donor);
    if (shared > 0 && kvc_prefix_match(s->cache, toks, n, &matched) == KVC_OK && shared > matched &&
        kvc_copy_prefix(s->cache, donor, seq, shared) == KVC_OK) {
        cached = shared;
        s->c_copy_query += (uint64_t)n;
        s->c_copy_hit += (uint64_t)shared;
    } else if (kvc_attach_prefix(s->cache, seq, toks, n, &cached) != KVC_OK) {
        cached = 0;
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
    int32_t need = kvc_blocks_needed(s->cache, seq, want);
    if (need >= 0 && need <= avail) {
        *need_out = need;
        return want;
    }
    int32_t lo = 0, hi = want; /* lo fits, hi does not */
    while (hi - lo > 1) {
        int32_t mid = lo + (hi - lo) / 2;
        int32_t nm = kvc_blocks_needed(s->cache, seq, mid);
        if (nm >= 0 && nm <= avail) lo = mid;
        else hi = mid;
    }
    if (lo > 0) *need_out = kvc_blocks_needed(s->cache, seq, lo);
    return lo;
}

/* Adds prompt/recompute chunks of request r's choices that are not in the batch yet. */
static void prefill_request(srv_sched *s, sched_req *r, int32_t *budget, int32_t *reserved) {
    for (int32_t i = 0; i < r->n && *budget > 0; i++) {
        sched_choice *c = &r->ch[i];
        if (c->finished || choice_in_batch(s, c)) continue;
        if (c->seq < 0) {
            if (c->idx > 0 && c->n_gen == 0) continue; /* gets choice 0's prompt by copy */
            if (prefix_wait(s, r, c)) continue;
            if (start_seq(s, r, c) != 0) continue;
            if (blocks_avail(s, *reserved) < 0) {
                /* attaching took cached blocks that this batch already counted on: not this step */
                kvc_seq_free(s->cache, c->seq);
                c->seq = -1;
                c->n_cached = 0;
                continue;
            }
        }
        int32_t rem = known_len(r, c) - c->n_cached;
        if (rem <= 0) continue; /* cannot happen: a live choice always has its next input uncached */
        int32_t want = rem < *budget ? rem : *budget, need;
        int32_t n = fit_tokens(s, c->seq, want, blocks_avail(s, *reserved), &need);
        if (n == 0) continue;
        add_group(s, r, c, n, n == rem, true);
        *reserved += need;
        *budget -= n;
    }
}

/* Ends the unfinished choices of a request that cannot fit the pool even alone: "length" for a choice that
 * has generated (its context outgrew the pool), an error for one that has not (its prompt does not fit). */
static void finish_no_room(srv_sched *s, sched_req *r) {
    for (int32_t j = 0; j < r->n; j++) {
        sched_choice *c = &r->ch[j];
        if (c->n_gen > 0) finish_choice(s, r, c, SRV_SCHED_FINISH_LENGTH, NULL);
        else finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "prompt does not fit in the KV cache");
    }
}

/* Blocks the request needs for its whole known context (+1 token), shared prompt blocks counted once. */
static int64_t context_blocks(const srv_sched *s, const sched_req *r) {
    int64_t bs = s->block_size, total = 0;
    bool first = true;
    for (int32_t i = 0; i < r->n; i++) {
        const sched_choice *c = &r->ch[i];
        if (c->finished) continue;
        int64_t b = ((int64_t)known_len(r, c) + 1 + bs - 1) / bs;
        if (!first) b -= r->n_prompt / bs;
        total += b;
        first = false;
    }
    return total;
}

static sched_choice *first_unfinished(sched_req *r) {
    for (int32_t i = 0; i < r->n; i++)
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
        for (int32_t j = 0; j < r->n; j++) {
            sched_choice *c = &r->ch[j];
            if (c->finished) continue;
            if (c->seq >= 0) {
                int32_t n = kvc_blocks_needed(s->cache, c->seq, known_len(r, c) - c->n_cached + 1);
                if (n > 0) total += n;
            } else if (!(c->idx > 0 && c->n_gen == 0)) {
                total += ((int64_t)known_len(r, c) + 1 + bs - 1) / bs;
            } else {
                total += 1 + (r->n_prompt % bs != 0); /* copied partial block + growth */
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
        for (int32_t j = 0; j < p->n; j++) {
            const sched_choice *d = &p->ch[j];
            if (d->finished || d->seq < 0) continue;
            int32_t lim = n < d->n_cached ? n : d->n_cached, l = 0;
            if (lim / s->block_size <= best) continue;
            while (l < lim && token_at(r, c, l) == token_at(p, d, l)) l++;
            if (l / s->block_size > best) best = l / s->block_size;
        }
    }
    return best;
}

/* Tries to admit the head of the waiting queue. Returns 1 when admitted, 0 when it must wait (FCFS: nothing
 * behind it is admitted either), -1 when it was finished instead (does not fit, sampler failure). */
static int admit_head(srv_sched *s) {
    sched_req *r = s->waiting.v[0];
    if (s->seqs_reserved + r->n_unfinished > s->p.parallel) return 0;
    int64_t need = context_blocks(s, r);
    if (need > s->blocks_total) {
        finish_no_room(s, r);
        return -1;
    }
    sched_choice *c0 = first_unfinished(r);
    /* Prefix blocks that a running sequence holds are shared, not allocated: they are credited. Blocks that
     * are merely cached are not: attaching them takes them out of the available count just as computing
     * them would. The blocks this step already reserved are part of the running requests' demand. */
    if (r->preempt_step == s->step_no) return 0; /* not back in the step that preempted it */
    if (need - shared_in_use(s, r, c0) > kvc_blocks_available(s->cache) - running_demand(s)) return 0;
    if (!(c0->idx > 0 && c0->n_gen == 0) && prefix_wait(s, r, c0)) return 0;
    for (int32_t i = 0; i < r->n; i++) {
        sched_choice *c = &r->ch[i];
        if (c->finished || c->sampler) continue;
        eng_sampling_params sp = r->sp;
        sp.seed = r->sp.seed + (uint64_t)i;
        if (s->ops.sampler_create(s->ops.ctx, &sp, &c->sampler) != 0) {
            c->sampler = NULL;
            for (int32_t j = 0; j < r->n; j++)
                finish_choice(s, r, &r->ch[j], SRV_SCHED_FINISH_ERROR, "cannot create a sampler");
            return -1;
        }
        if (r->penalize_prompt && s->ops.sampler_accept)
            for (int32_t k = 0; k < r->n_prompt; k++) s->ops.sampler_accept(s->ops.ctx, c->sampler, r->prompt[k]);
    }
    vec_remove(&s->waiting, r);
    if (vec_insert_sorted(&s->running, r) != 0) {
        (void)vec_insert(&s->waiting, 0, r);
        return 0;
    }
    r->running = true;
    s->seqs_reserved += r->n_unfinished;
    if (r->timings.t_start == 0) r->timings.t_start = uv_hrtime();
    if (!r->admitted_once) {
        r->admitted_once = true;
        uv_mutex_lock(&s->mu);
        s->n_queued_new--;
        s->n_queued_tokens -= r->n_prompt;
        uv_mutex_unlock(&s->mu);
        s->c_prompt_total += (uint64_t)r->n_prompt;
    }
    return 1;
}

/* ---- sampling ----------------------------------------------------------------------------------------------- */
static void sample_choice(srv_sched *s, sched_req *r, sched_choice *c, float *logits) {
    if (r->ignore_eos)
        for (int32_t k = 0; k < s->n_eog; k++) logits[s->eog[k]] = -INFINITY;
    eng_sample smp;
    memset(&smp, 0, sizeof smp);
    if (s->ops.sampler_sample(s->ops.ctx, c->sampler, logits, &smp) != 0 || smp.token < 0 ||
        smp.token >= s->ops.n_vocab) {
        finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "sampling failed");
        return;
    }
    if (c->n_gen == c->cap_gen) {
        int32_t cap = c->cap_gen ? c->cap_gen * 2 : 64;
        int32_t *g = realloc(c->gen, (size_t)cap * sizeof *g);
        if (!g) {
            finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "out of memory");
            return;
        }
        c->gen = g;
        c->cap_gen = cap;
    }
    c->gen[c->n_gen++] = smp.token;
    r->usage.completion_tokens++;
    s->c_gen_total++;
    if (r->timings.t_first_token == 0) r->timings.t_first_token = uv_hrtime();
    r->protect = false;
    if (!r->ignore_eos && s->ops.token_is_eog(s->ops.ctx, smp.token)) {
        finish_choice(s, r, c, SRV_SCHED_FINISH_STOP, NULL);
        return;
    }
    if (c->n_smp == c->cap_smp) {
        int32_t cap = c->cap_smp ? c->cap_smp * 2 : 4;
        eng_sample *p = realloc(c->smp, (size_t)cap * sizeof *p);
        if (!p) {
            finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "out of memory");
            return;
        }
        c->smp = p;
        c->cap_smp = cap;
    }
    c->smp[c->n_smp++] = smp;
    char *heap;
    const char *t;
    size_t n = 0;
    int rc = detok_call(s, &c->detok, smp.token, false, &heap, &t, &n);
    if (rc != ENG_OK) {
        free(heap);
        finish_choice(s, r, c, SRV_SCHED_FINISH_ERROR, "detokenization failed");
        return;
    }
    feed_text(s, r, c, t, n);
    free(heap);
    if (c->finished) return;
    if ((r->max_tokens > 0 && c->n_gen >= r->max_tokens) || (s->p.n_ctx > 0 && known_len(r, c) >= s->p.n_ctx))
        finish_choice(s, r, c, SRV_SCHED_FINISH_LENGTH, NULL);
}

static void fail_request(srv_sched *s, sched_req *r, const char *msg) {
    for (int32_t i = 0; i < r->n; i++) finish_choice(s, r, &r->ch[i], SRV_SCHED_FINISH_ERROR, msg);
}

/* The logits of the last entry of choice c's group: sample (for a fresh request with n > 1, first copy the
 * prompt into the other choices' sequences and sample them all from these logits). */
static void handle_logits(srv_sched *s, sched_req *r, sched_choice *c, int32_t entry) {
    const float *lg = s->ops.get_logits(s->ops.ctx, entry);
    if (!lg) {
        fail_request(s, r, "the engine returned no logits");
        return;
    }
    size_t bytes = (size_t)s->ops.n_vocab * sizeof(float);
    bool fan_out = c->idx == 0 && c->n_gen == 0 && r->n > 1;
    if (fan_out) {
        for (int32_t i = 1; i < r->n; i++) {
            sched_choice *d = &r->ch[i];
            if (d->finished || d->seq >= 0 || d->n_gen != 0) continue;
            int32_t seq;
            if (kvc_seq_alloc(s->cache, &seq) != KVC_OK) continue; /* recomputed later */
            if (kvc_copy_prefix(s->cache, c->seq, seq, r->n_prompt) != KVC_OK) {
                kvc_seq_free(s->cache, seq);
                continue;
            }
            d->seq = seq;
            d->n_cached = r->n_prompt;
        }
    }
    memcpy(s->logit_buf, lg, bytes);
    sample_choice(s, r, c, s->logit_buf);
    if (fan_out) {
        for (int32_t i = 1; i < r->n; i++) {
            sched_choice *d = &r->ch[i];
            if (d->finished || d->n_gen != 0) continue;
            memcpy(s->logit_buf, lg, bytes);
            sample_choice(s, r, d, s->logit_buf);
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

/* ---- one step ------------------------------------------------------------------------------------------------ */
static void handle_cancels(srv_sched *s, int32_t *dropped_new) {
    req_vec *lists[2] = {&s->running, &s->waiting};
    for (int l = 0; l < 2; l++) {
        for (int32_t i = lists[l]->n - 1; i >= 0; i--) {
            sched_req *r = lists[l]->v[i];
            if (r->cancel_handled || !atomic_load(&r->cancelled)) continue;
            r->cancel_handled = true;
            for (int32_t j = 0; j < r->n; j++) finish_choice(s, r, &r->ch[j], SRV_SCHED_FINISH_CANCELLED, NULL);
            bool never = !r->admitted_once;
            if (emit_outputs(s, r) && never) { (*dropped_new)++; s->dropped_tokens += r->n_prompt; }
        }
    }
}

/* Builds the batch. Returns 0 when built (possibly empty), 1 when the state changed (a preemption, a choice
 * that cannot grow) and the batch must be rebuilt. */
static int build(srv_sched *s, int32_t *dropped_new) {
    s->n_entries = s->n_groups = 0;
    int32_t reserved = 0, budget = s->p.batch_tokens;
    /* 1. decode tokens of running choices, FCFS */
    for (int32_t i = 0; i < s->running.n && budget > 0; i++) {
        sched_req *r = s->running.v[i];
        for (int32_t j = 0; j < r->n && budget > 0; j++) {
            sched_choice *c = &r->ch[j];
            if (c->finished || c->seq < 0 || known_len(r, c) - c->n_cached != 1) continue;
            int32_t need = kvc_blocks_needed(s->cache, c->seq, 1);
            if (need < 0 || need > blocks_avail(s, reserved)) {
                sched_req *victim = pick_victim(s);
                if (victim) {
                    preempt(s, victim);
                } else {
                    /* alone and the pool is full: this choice cannot grow */
                    finish_choice(s, r, c, SRV_SCHED_FINISH_LENGTH, NULL);
                }
                return 1;
            }
            add_group(s, r, c, 1, true, false);
            reserved += need;
            budget--;
        }
    }
    /* 2. prompt chunks and recomputation of admitted requests */
    for (int32_t i = 0; i < s->running.n && budget > 0; i++) prefill_request(s, s->running.v[i], &budget, &reserved);
    /* 3. admissions, FCFS: stop at the first request that must wait */
    while (s->waiting.n > 0 && budget > 0) {
        sched_req *h = s->waiting.v[0];
        int rc = admit_head(s);
        if (rc == 0) break;
        if (rc < 0) {
            bool never = !h->admitted_once;
            if (emit_outputs(s, h) && never) { (*dropped_new)++; s->dropped_tokens += h->n_prompt; }
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
                    fail_request(s, h, "the request cannot be scheduled");
                    if (emit_outputs(s, h) && never) { dropped_new++; s->dropped_tokens += h->n_prompt; }
                    continue;
                }
                break;
            }
            sched_req *victim = pick_victim(s);
            if (victim) {
                preempt(s, victim);
                continue;
            }
            /* a single running request that cannot progress: it does not fit the pool */
            sched_req *r = s->running.v[0];
            finish_no_room(s, r);
            emit_outputs(s, r);
            continue;
        }
        eng_batch b = {.n = s->n_entries, .token = s->b_token, .pos = s->b_pos, .seq = s->b_seq,
                       .want_logits = s->b_logits};
        int rc = s->ops.decode(s->ops.ctx, &b);
        if (rc == ENG_ERR_KV_FULL) {
            sched_req *victim = pick_victim(s);
            if (victim) {
                preempt(s, victim);
                continue;
            }
            sched_req *r = s->running.v[0];
            finish_no_room(s, r);
            emit_outputs(s, r);
            continue;
        }
        s->c_steps++;
        s->c_batch_tokens += (uint64_t)s->n_entries;
        if (rc != ENG_OK) {
            const char *msg = engine_error(rc);
            for (int32_t g = 0; g < s->n_groups; g++) fail_request(s, s->groups[g].r, msg);
            break;
        }
        for (int32_t g = 0; g < s->n_groups; g++) {
            batch_group *gr = &s->groups[g];
            sched_choice *c = gr->c;
            if (c->finished) continue;
            c->n_cached += gr->n;
            if (gr->prompt) {
                s->c_prompt_computed += (uint64_t)gr->n;
                gr->r->timings.n_prompt_computed += gr->n;
            }
            if (gr->logits) handle_logits(s, gr->r, c, gr->first + gr->n - 1);
        }
        break;
    }
    for (int32_t i = s->running.n - 1; i >= 0; i--) emit_outputs(s, s->running.v[i]);
    if (s->p.on_step) s->p.on_step(s->p.on_step_ctx);
    post_events(s, dropped_new);
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
        bool ok = true;
        for (int32_t i = 0; i < s->incoming.n && ok; i++) ok = vec_insert_sorted(&s->waiting, s->incoming.v[i]) == 0;
        if (ok) s->incoming.n = 0;
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
        if (!(e->ev.type == SRV_SCHED_EV_DELTA && atomic_load(&r->cancelled))) r->cb(&e->ev, r->user);
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
    free(s->incoming.v);
    free(s->waiting.v);
    free(s->running.v);
    free(s->eog);
    free(s->b_token);
    free(s->b_pos);
    free(s->b_seq);
    free(s->b_logits);
    free(s->groups);
    free(s->logit_buf);
    free(s->tok_buf);
    free(s);
}

/* ---- API ------------------------------------------------------------------------------------------------------- */
int srv_sched_create(const srv_sched_params *params, const srv_engine_ops *ops, uv_loop_t *loop, srv_sched **out) {
    if (!params || !ops || !loop || !out) return SRV_SCHED_ERR_INVALID;
    *out = NULL;
    if (params->batch_tokens < 1 || params->parallel < 1 || params->max_queue < 1 || params->n_ctx < 0 ||
        params->max_queued_tokens < 0)
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
    s->cache = cache;
    kvc_layout lay;
    kvc_get_layout(cache, &lay);
    s->block_size = lay.block_size;
    s->blocks_total = lay.n_blocks;
    s->next_id = 1;
    size_t nb = (size_t)params->batch_tokens;
    s->b_token = malloc(nb * sizeof *s->b_token);
    s->b_pos = malloc(nb * sizeof *s->b_pos);
    s->b_seq = malloc(nb * sizeof *s->b_seq);
    s->b_logits = malloc(nb * sizeof *s->b_logits);
    s->groups = malloc(nb * sizeof *s->groups);
    s->logit_buf = malloc((size_t)ops->n_vocab * sizeof *s->logit_buf);
    if (!s->b_token || !s->b_pos || !s->b_seq || !s->b_logits || !s->groups || !s->logit_buf) goto nomem;
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
    refresh_stats_locked(s);
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
    for (int32_t i = 0; i < s->incoming.n; i++)
        if (vec_insert_sorted(&s->waiting, s->incoming.v[i]) != 0) {
            /* cannot list it: end it directly */
            sched_req *r = s->incoming.v[i];
            for (int32_t j = 0; j < r->n; j++) finish_choice(s, r, &r->ch[j], SRV_SCHED_FINISH_CANCELLED, NULL);
            emit_outputs(s, r);
        }
    s->incoming.n = 0;
    while (s->running.n > 0) {
        sched_req *r = s->running.v[s->running.n - 1];
        for (int32_t j = 0; j < r->n; j++) finish_choice(s, r, &r->ch[j], SRV_SCHED_FINISH_CANCELLED, NULL);
        emit_outputs(s, r);
    }
    while (s->waiting.n > 0) {
        sched_req *r = s->waiting.v[s->waiting.n - 1];
        for (int32_t j = 0; j < r->n; j++) finish_choice(s, r, &r->ch[j], SRV_SCHED_FINISH_CANCELLED, NULL);
        emit_outputs(s, r);
    }
    post_events(s, 0);
    dispatch(s);
    uv_cond_destroy(&s->cv);
    uv_mutex_destroy(&s->mu);
    if (s->async) uv_close((uv_handle_t *)s->async, on_async_close);
    free_bufs(s);
}

int srv_sched_submit(srv_sched *s, const srv_sched_request *req, uint64_t *id) {
    if (!s || !req || !id || !req->cb || !req->prompt || req->n_prompt < 1 || req->n < 1 ||
        req->n > s->p.parallel || (req->n_stop > 0 && !req->stop) ||
        (req->sampling.n_logit_bias > 0 && !req->sampling.logit_bias) || req->sampling.n_top_logprobs < 0 ||
        req->sampling.n_top_logprobs > 20)
        return SRV_SCHED_ERR_INVALID;
    for (int32_t i = 0; i < req->n_prompt; i++)
        if (req->prompt[i] < 0 || req->prompt[i] >= s->ops.n_vocab) return SRV_SCHED_ERR_INVALID;
    if (s->p.n_ctx > 0 && req->n_prompt >= s->p.n_ctx) return SRV_SCHED_ERR_TOO_LONG;
    sched_req *r = calloc(1, sizeof *r);
    if (!r) return SRV_SCHED_ERR_NOMEM;
    r->n = req->n;
    r->ch = calloc((size_t)req->n, sizeof *r->ch);
    r->prompt = malloc((size_t)req->n_prompt * sizeof *r->prompt);
    r->end_ev = calloc((size_t)req->n, sizeof *r->end_ev);
    r->done_ev = calloc(1, sizeof *r->done_ev);
    if (!r->ch || !r->prompt || !r->end_ev || !r->done_ev) goto nomem;
    memcpy(r->prompt, req->prompt, (size_t)req->n_prompt * sizeof *r->prompt);
    r->n_prompt = req->n_prompt;
    r->max_tokens = req->max_tokens;
    r->sp = req->sampling;
    if (req->sampling.n_logit_bias > 0) {
        r->bias = malloc(req->sampling.n_logit_bias * sizeof *r->bias);
        if (!r->bias) goto nomem;
        memcpy(r->bias, req->sampling.logit_bias, req->sampling.n_logit_bias * sizeof *r->bias);
    }
    r->sp.logit_bias = r->bias;
    r->ignore_eos = req->ignore_eos;
    r->penalize_prompt = req->penalize_prompt;
    r->cb = req->cb;
    r->user = req->user;
    atomic_init(&r->cancelled, false);
    r->n_unfinished = req->n;
    r->usage.prompt_tokens = req->n_prompt;
    for (int32_t i = 0; i < req->n; i++) {
        r->ch[i].idx = i;
        r->ch[i].seq = -1;
        if (srv_stop_create(req->stop, req->n_stop, &r->ch[i].stop) != SRV_STOP_OK) goto nomem;
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
    if (vec_insert(&s->incoming, s->incoming.n, r) != 0) {
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
