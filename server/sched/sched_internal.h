/* sched_internal.h: what the scheduler's files share; only server/sched/sched_*.c include it.
 *
 *   sched_core.c    the queue, the threads, batch building and one step (decode, hand logits on)
 *   sched_policy.c  admission (who may start, how many blocks a request needs) and preemption
 *   sched_output.c  sampling, detokenizing, stop strings, the events posted to the loop thread, statistics
 *   sched_grammar.c constrained decoding; sched_shift.c the context shift
 *
 * All of it runs on the scheduler thread except where a comment says the loop thread.
 */
#ifndef KVSERVE_SCHED_INTERNAL_H
#define KVSERVE_SCHED_INTERNAL_H

#include <stdatomic.h>

#include "server/sched/block_manager_internal.h"
#include "server/sched/sched.h"
#include "server/sched/stop_internal.h"

/* ---- data ------------------------------------------------------------------------------------------------ */
typedef struct sched_choice {
    int32_t idx;
    int32_t seq;            /* cache sequence id, -1 when none */
    int32_t n_cached;       /* tokens of the known tokens committed in seq */
    int32_t *gen;           /* generated tokens [n_gen] */
    int32_t n_gen, cap_gen;
    /* after a context shift (sched_shift.c): the choice's context, which replaces prompt + gen as its known
     * tokens; NULL before the first shift */
    int32_t *shctx;
    int32_t n_shctx, cap_shctx;
    int32_t clean;          /* leading positions of seq whose K/V are a plain prefill of the known tokens (what
                               another sequence may copy): INT32_MAX, or keep after an in-place shift */
    void *sampler;          /* created on the scheduler thread at first admission */
    eng_detok detok;
    srv_stop *stop;
    gmr_matcher *gm;        /* the grammar's matcher (NULL: unconstrained; see sched_grammar.c) */
    uint32_t *gmask;        /* [mask words] the allowed tokens of the next step, when gmask_ready */
    bool gmask_ready;
    bool finished;
    bool pool_cut;          /* finished with LENGTH because the whole KV pool cannot hold its context */
    srv_sched_finish reason;
    const char *error;      /* static message for FINISH_ERROR */
    /* output of the current step */
    kvs_buf txt;             /* text not yet sent in an event */
    eng_sample *smp;
    int32_t n_smp, cap_smp;
    bool end_pending;       /* finished in this step: post CHOICE_END */
    /* speculative decoding (sched_spec.c) */
    int32_t draft[SRV_SCHED_SPEC_MAX]; /* the guesses of the current step [n_draft of its batch group] */
    float spec_acc;         /* recent acceptance: decayed count of accepted guesses (per-position success) */
    float spec_tries;       /* ... and of guesses tried up to the first rejection (sched_spec.c adds a prior) */
    /* the draft model (sched_draft.c): the choice's sequence in the draft's cache, -1 when none (every choice
     * starts with 0 and no draft_open: draft_open says whether dseq is meaningful) */
    bool draft_open;
    int32_t dseq;
    int32_t d_len;          /* positions of dseq filled: known tokens up to d_base, then guesses c->draft[0..) */
    int32_t d_base;         /* the known length when the last guesses were made (guess j sits at d_base + j) */
} sched_choice;

typedef struct sched_req {
    uint64_t id;
    srv_sched_request rq;    /* the request as submitted, copied whole, except: prompt and sampling.logit_bias
                                point to the owned copies below, stop is NULL (each choice holds its srv_stop),
                                grammar is NULL (each choice holds its clone), n_keep is clamped to 0 .. n_prompt;
                                rq.priority is the queues' key with the id: (priority, id) */
    struct sched_req *live_prev, *live_next; /* the live list (under mu) */
    int32_t *prompt;         /* [rq.n_prompt] owned */
    eng_logit_bias *bias;    /* [rq.sampling.n_logit_bias] owned */
    double *embd_acc;        /* embed: [n_embd] the pooling accumulator (reset when the sequence restarts) */
    float *embd;             /* embed: [n_embd] the final vector, filled when the prompt is done */
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
    struct sched_event *end_ev; /* [rq.n] CHOICE_END events, allocated at submit */
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
    int32_t n_draft; /* speculative decoding: the last n_draft entries are the choice's guesses c->draft (every
                        entry wants logits); 0 otherwise */
} batch_group;

/* The step cost model of speculative decoding (sched_spec.c): step time ~ a + b * rows, fitted by least squares
 * over recent steps (exponentially decayed sums). */
typedef struct sched_cost {
    double w, sx, sy, sxx, sxy; /* decayed weight, sum rows, sum ns, sum rows^2, sum rows * ns */
} sched_cost;

struct srv_sched {
    srv_sched_params p;
    srv_engine_ops ops;
    srv_block_manager bm;               /* the scheduler's only access to the KV cache */
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
    req_vec waiting;         /* sorted by (priority, id) (preempted requests keep their place) */
    req_vec running;         /* sorted by (priority, id) */
    int32_t seqs_reserved;   /* unfinished choices of running requests */
    int32_t *b_token, *b_pos, *b_seq;
    bool *b_logits;
    bool *b_embd;            /* want_embd of the batch being built */
    bool batch_embd;         /* some group of it belongs to an embedding request */
    kvc_entry *b_entries;
    batch_group *groups;
    int32_t n_entries, n_groups;
    float *logit_buf;        /* [n_vocab] scratch */
    int32_t *tok_buf;        /* scratch for attach/match, grown on demand */
    int32_t tok_cap;
    char piece[256];
    sched_event *out_head, *out_tail; /* events of the current step, posted at its end */
    srv_sched_counters counters; /* owned by the thread, copied into stats */
    uint64_t c_copy_query, c_copy_hit; /* prefix lookups served by copying from a running sequence */
    uint64_t step_no;        /* steps started (numbering for preempt_step) */
    sched_cost cost;         /* speculative decoding's step cost model */
    int32_t *spec_buf;       /* [max known length] scratch for the proposer's view of a choice's tokens */
    int32_t spec_cap;
    int32_t *spec_want, *spec_take; /* [batch_tokens] each, one allocation (spec_want): per decode group, its
                                       proposed and its kept guesses of the step being built */
    /* the draft model (sched_draft.c; spec_type SRV_SCHED_SPEC_DRAFT) */
    srv_engine_ops dops;                /* the draft's engine (params.draft copied) */
    srv_block_manager dbm;              /* the draft's KV cache, its own pool (see sched.h) */
    int32_t *d_token, *d_pos, *d_seq;   /* [batch_tokens] each: the draft batch being built */
    bool *d_logits;                     /* [batch_tokens] */
    int32_t *d_group;                   /* [batch_tokens]: the decode group a row belongs to */
    int32_t *d_got;                     /* [batch_tokens]: per decode group, the guesses made in this step */
    bool *d_stop;                       /* [batch_tokens]: per decode group, no more guesses in this step */
    double d_step_ns;                   /* measured time of one batched draft step (decayed mean), 0: unknown */
    double g_acc, g_tries;              /* the draft's acceptance over every choice (decayed counts, sched_spec.c) */
    /* saved sessions (sched_slots.c), under mu: what each sequence id held when its last choice ended normally */
    int32_t **slot_tok;      /* [n_slots] malloc'd, NULL: none */
    int32_t *slot_n;         /* [n_slots] */
    int32_t n_slots;         /* params.parallel */
};
/* A choice's known tokens: prompt + generated, or after a context shift its shifted context. */
static inline int32_t known_len(const sched_req *r, const sched_choice *c) {
    return c->shctx ? c->n_shctx : r->rq.n_prompt + c->n_gen;
}

static inline int32_t token_at(const sched_req *r, const sched_choice *c, int32_t pos) {
    if (c->shctx) return c->shctx[pos];
    return pos < r->rq.n_prompt ? r->prompt[pos] : c->gen[pos - r->rq.n_prompt];
}

/* ---- shared between the files ---------------------------------------------------------------------------- */

/* sched_slots.c: records the committed tokens of choice c's sequence as its slot's (before the sequence is closed;
 * an allocation failure leaves the slot without a record). Scheduler thread. */
void sched_slot_record(srv_sched *s, const sched_req *r, const sched_choice *c);
void sched_slots_free(srv_sched *s);

/* sched_core.c: request vectors and the prefix-sharing wait */
bool sched_prefix_wait(srv_sched *s, const sched_req *r, const sched_choice *c);
int sched_vec_insert(req_vec *q, int32_t at, sched_req *r);
/* Inserts keeping the vector sorted by (priority, id). */
int sched_vec_insert_sorted(req_vec *q, sched_req *r);
void sched_vec_remove(req_vec *q, sched_req *r);
/* Tells the trace observer (srv_sched_params.on_trace), if any, that r moved (see srv_sched_trace_kind). */
void sched_trace(srv_sched *s, srv_sched_trace_kind kind, const sched_req *r, bool repeated);

/* sched_policy.c: admission and preemption */
int sched_admit_head(srv_sched *s);
void sched_finish_no_room(srv_sched *s, sched_req *r);
void sched_cut_by_pool(srv_sched *s, sched_req *r, sched_choice *c);
sched_req *sched_pick_victim(srv_sched *s);
void sched_preempt(srv_sched *s, sched_req *r);
/* The pool cannot hold the next step: preempts the least urgent request that may be (sched_pick_victim), or
 * (one request running) ends the request that cannot fit even alone. */
void sched_relieve_pool(srv_sched *s);

/* sched_output.c: sampling, outputs, events and statistics */
bool sched_emit_outputs(srv_sched *s, sched_req *r);
void sched_fail_request(srv_sched *s, sched_req *r, const char *msg);
void sched_finish_choice(srv_sched *s, sched_req *r, sched_choice *c, srv_sched_finish reason, const char *error);
void sched_post_events(srv_sched *s, int32_t dropped_new);
void sched_refresh_stats_locked(srv_sched *s);
void sched_sample_choice(srv_sched *s, sched_req *r, sched_choice *c, float *logits);
/* An embedding request's group just ran (rows first .. first + n - 1 at positions pos0 ..): pools the rows and,
 * after the last prompt token, writes the vector and ends the choice. */
void sched_pool_rows(srv_sched *s, sched_req *r, sched_choice *c, int32_t first, int32_t n, int32_t pos0);

/* sched_shift.c: the context shift (sched.h, "Context shift") */
/* Choice c has just sampled the token that brought its context to n_ctx: shifts the context and returns true
 * (it goes on), or returns false (nothing left to discard, or out of memory: the caller ends it with "length"). */
bool sched_context_shift(srv_sched *s, sched_req *r, sched_choice *c);
/* Appends a sampled token to a shifted choice's context; false when out of memory. No-op before a shift. */
bool sched_shift_push(sched_choice *c, int32_t token);

/* sched_spec.c: speculative decoding (sched.h, "Speculative decoding") */
/* After the decode tokens of the step were placed (the first n_groups groups, one entry each, consecutive):
 * gives some of them guesses within *budget and the blocks left beyond *reserved, moving the entries apart. */
void sched_spec_extend(srv_sched *s, int32_t *budget, int32_t *reserved);
/* After decode: samples group g's rows in order while the guesses hold, removes the rows of wrong guesses from
 * the sequence and counts the draft. */
void sched_spec_verify(srv_sched *s, const batch_group *g);
/* The clock of the step cost model, in nanoseconds: params.step_clock or uv_hrtime. */
uint64_t sched_step_clock(const srv_sched *s);
/* A decode call of `rows` entries took `ns` nanoseconds (sched_step_clock): updates the cost model. */
void sched_spec_observe(srv_sched *s, int32_t rows, uint64_t ns);
/* Frees the proposer's scratch (srv_sched_free). */
void sched_spec_release(srv_sched *s);

/* sched_load.c: a new sequence's prefix from the tiers below the pool (host at once, disk asynchronously) */
/* start_seq's step after the pool: the tokens added at once to seq (holding `cached` of toks[0..n)), at most avail
 * blocks; a disk fetch may be left running for seq (the block manager's). */
int32_t sched_load_begin(srv_sched *s, int32_t seq, const int32_t *toks, int32_t n, int32_t cached, int32_t avail);
/* Whether choice c still waits for its disk fetch; once it has ended, its blocks (at most avail) are placed and
 * counted (n_cached, usage.cached_tokens) and false is returned. */
bool sched_load_pending(srv_sched *s, sched_req *r, sched_choice *c, const int32_t *toks, int32_t avail);
/* A step with nothing to run: waits up to 2 ms for a fetch to end; whether any is in flight. */
bool sched_load_idle(srv_sched *s);

/* sched_draft.c: the draft model's guesses (spec_type SRV_SCHED_SPEC_DRAFT) */
/* Binds the draft's engine and allocates its batch (srv_sched_create); SRV_SCHED_ERR_INVALID or _NOMEM. */
int sched_draft_init(srv_sched *s);
void sched_draft_release(srv_sched *s);
/* Writes into the choices' c->draft up to want[g] greedy guesses for each of the nd decode groups (the first nd
 * groups of the batch being built) and lowers want[g] to the guesses made (0 where the draft could not run). */
void sched_draft_propose(srv_sched *s, int32_t nd, int32_t *want);
/* Closes the choice's draft sequence, if any (its known tokens changed, or its target sequence closed). */
void sched_draft_drop(srv_sched *s, sched_choice *c);

/* sched_grammar.c: constrained decoding (srv_sched_request.grammar) */
/* Clones the template for every choice (submit, loop thread). SRV_SCHED_ERR_INVALID (vocabulary size) or _NOMEM. */
int sched_grammar_init(srv_sched *s, sched_req *r, const gmr_matcher *tmpl);
/* Frees a choice's matcher and mask (any thread that owns the request). */
void sched_grammar_release(sched_choice *c);
/* Before sampling: applies the choice's mask to logits. false when the choice was ended instead (dead state). */
bool sched_grammar_mask(srv_sched *s, sched_req *r, sched_choice *c, float *logits);
/* After sampling token: advances the matcher. false when the choice was ended (the token was refused, or the
 * value is complete and nothing can follow: FINISH_STOP). */
bool sched_grammar_accept(srv_sched *s, sched_req *r, sched_choice *c, int32_t token);
/* After a non-EOG token: whether the value is complete and only an EOG token may follow (then the caller ends
 * the choice with FINISH_STOP). Computes the next step's mask on the way; false also when the choice ended. */
bool sched_grammar_only_eog(srv_sched *s, sched_req *r, sched_choice *c);

#endif
