/*
 * sched.h: the public header of server/sched/: kvserve's continuous-batching scheduler (sched_*.c, prefix
 * srv_sched_) and its engine adapter (engine_ops.c, srv_engine_ops_). Includes no other server folder.
 *
 * Threads
 *   A dedicated scheduler thread owns the engine (through srv_engine_ops: eng_ctx and its kvc_cache). The
 *   libuv loop thread (the thread that runs the uv_loop_t given to srv_sched_create) submits and cancels
 *   requests. Results travel back through a mutex-protected event queue and a uv_async_t that the scheduler
 *   creates on that loop; the loop thread drains the queue and calls each request's callback ON THE LOOP
 *   THREAD. srv_sched_submit, srv_sched_cancel and srv_sched_free must be called on the loop thread;
 *   srv_sched_get_stats may be called from any thread.
 *
 * Steps
 *   Each step builds one ragged eng_batch: first the next decode token of every running choice, then chunks
 *   of prompts (new requests, and preempted ones that recompute), in queue order (see Order), until the
 *   step's token budget (batch_tokens) is spent. A long prompt is split across steps (chunked prefill). Logits are asked
 *   only for decode tokens and for the last prompt token. At most `parallel` sequences (choices) are
 *   admitted at once.
 *
 * Prefix sharing
 *   - Automatic prefix caching: a new request attaches the cached full blocks of its prompt
 *     (kvc_attach_prefix with n = prompt length - 1) and reports them as usage.cached_tokens. With a host tier
 *     (params.host) the prefix then continues with the full blocks it holds, copied into the pool at once; with a
 *     disk tier (params.tier), with the blocks the disk holds, read and checked by the tier's loader thread while
 *     the sequence waits (loading: no rows in the batch) and the other sequences keep stepping, then placed into
 *     the pool (at most the blocks available to the step; sched_load.c). Tier blocks count in usage.cached_tokens.
 *   - n > 1: the prompt is prefilled once in choice 0's sequence, then copied (kvc_copy_prefix) into n - 1
 *     more sequences; every choice samples independently from the same last-prompt-token logits with its own
 *     sampler (choice i uses seed + i).
 *   - A waiting request whose prompt shares at least one full block with a request that is still
 *     prefilling waits until those blocks are committed, instead of prefilling them a second time. When a
 *     running sequence then holds a longer common prefix than the cached full blocks (its partial last
 *     block included), the prefix is copied from it (kvc_copy_prefix: full blocks shared, the partial block
 *     copied); such copies count as prefix-cache queries and hits in the stats.
 *
 * Order (scheduling policy, srv_sched_params.policy; vLLM's --scheduling-policy)
 *   Both queues are ordered by the key (priority, arrival): the waiting queue is admitted in that order and
 *   the running requests get their decode tokens and prompt chunks in that order. Under SRV_SCHED_FCFS (the
 *   default) every priority is 0 (submit refuses another value), so the order is arrival order. Under
 *   SRV_SCHED_PRIORITY a lower srv_sched_request.priority is more urgent; equal priorities keep arrival order.
 *   As in vLLM's scheduler, a waiting request never preempts a running one, however urgent: it goes to the
 *   head of the queue and is admitted as soon as it fits.
 *
 * Admission
 *   The head of the waiting queue is admitted when its choices fit the sequence limit (parallel) and its
 *   whole known context (+1 token per choice) fits the blocks that are available (free + cached) minus what
 *   the running requests still need to reach their known length (+1 token per choice); prefix blocks that a
 *   running sequence holds are credited. When the head must wait, nobody behind it is admitted.
 *
 * KV pool exhaustion
 *   When a decode token finds no block (or decode returns ENG_ERR_KV_FULL), the least urgent running request
 *   is preempted: the one with the largest priority value, among those the latest arrival. Its sequences are
 *   freed and it goes back to the waiting queue at its (priority, arrival) place (ahead of every later
 *   arrival of its priority); later it recomputes prompt + already generated tokens (prefix caching usually
 *   makes this cheap), keeping its samplers, detokenizers and stop-string state, so the client sees no
 *   difference. Among the running requests of that largest priority, one that was preempted and has not
 *   generated a token since is passed over (no thrash); only when every one of them is in that state is the
 *   latest preempted anyway (counted in stats.counters.preemptions_repeated). A request running alone is never
 *   preempted. A request whose prompt cannot fit even alone finishes with SRV_SCHED_FINISH_ERROR "prompt does not fit in the KV cache";
 *   a choice whose growing context no longer fits the pool while it runs alone finishes with
 *   SRV_SCHED_FINISH_LENGTH and its CHOICE_END has `truncated` set (counted in
 *   stats.counters.choices_truncated), so the caller can tell the client why.
 *
 * Context shift (params.context_shift, as llama.cpp's --context-shift)
 *   When a choice's context (the n_cached tokens its sequence holds plus the one just sampled) reaches n_ctx
 *   and its request has max_tokens > 0, not reached: keep = the request's n_keep (leading prompt tokens),
 *   n_discard = (n_cached - keep) / 2; positions [keep, keep + n_discard) are dropped, the later tokens move
 *   down by n_discard, and generation goes on (n_discard == 0: the choice ends with "length"). The sequence
 *   is shifted in place through ops.seq_remove (the moved keys re-rotated by -n_discard); when that is not
 *   possible (blocks shared with another sequence, released by a sliding window, no seq_remove) the sequence
 *   is freed and the kept tokens are recomputed, as after a preemption. From then on the choice's context is
 *   the kept tokens: a preemption recomputes exactly these at their new positions, i.e. a fresh prefill of
 *   them, which equals the shifted cache in the first layer only (deeper layers of a shifted cache still
 *   carry what attention saw of the dropped tokens), so the tokens after a recompute may differ from those
 *   of an uninterrupted run. A shifted sequence lends no position at or after keep to another sequence
 *   (prefix copy), and the cache never publishes its shifted blocks to the prefix cache (kvc_remove drops
 *   their hashes). Without context_shift, or without max_tokens (so that no request generates without
 *   bound), a choice reaching n_ctx ends with "length". usage.completion_tokens counts every token sampled.
 *
 * Speculative decoding (srv_sched_params.spec_type; sched_spec.c, the proposer in ngram.c)
 *   With SRV_SCHED_SPEC_NGRAM, a decoding choice may have k tokens guessed for it (prompt lookup: the last
 *   2..4 tokens of its prompt + generated tokens found earlier in them, the tokens that followed guessed to
 *   follow again). Its next input and the k guesses join the step as k + 1 consecutive rows of its sequence,
 *   all with logits. The choice's sampler then samples from row 0, row 1, ... exactly as plain decoding would
 *   from successive steps (same masks, penalties, random draws, logprobs, stop strings, grammar, max_tokens,
 *   EOG), and stops after the first row whose sampled token differs from the guess that follows it (or after
 *   the last row, or when the choice ends); the rows whose inputs were wrong guesses are removed from its
 *   sequence (tail removal). So up to k + 1 tokens come out of one step, and they are the tokens plain
 *   decoding would have produced: bit for bit on the CPU, whose numbers do not depend on how rows are batched.
 *   At temperature > 0 this is the rejection-sampling rule for a draft that is a point mass on the guess g
 *   (accept g with probability p(g); else draw from p without g, renormalized): drawing x ~ p and accepting
 *   when x == g gives exactly that, so the output distribution is the model's, seed for seed.
 *   k per choice: between the request's n_min and n_max (spec_n_min / spec_n_max, else the scheduler's); with
 *   spec_adaptive it follows the choice's recent acceptance rate, and the step's guessed rows are kept only
 *   while they raise the expected tokens per second of the step, from a cost model of step time against rows
 *   measured online (a big batch gets no guesses when extra rows cost more than they are expected to yield).
 *   Guesses never preempt: they take only the token budget (at most half of what the decode tokens leave) and
 *   the blocks left after every decode token is placed. No guesses when n_ctx is 0, past n_ctx - 2, for
 *   embedding requests, nor for a choice's first token after its prompt.
 *   With SRV_SCHED_SPEC_DRAFT the guesses come from a draft model (params.draft, sched_draft.c): ONE draft
 *   context serves every sequence. Each speculating choice has its own sequence in the draft's KV cache (its own
 *   block tables in the draft context's pool: the target's pool cannot hold them, its blocks are shaped by the
 *   target's layers and heads), opened when the choice first drafts and closed when the choice ends, is
 *   preempted or shifts its context. A step first brings every drafting choice's draft sequence up to its known
 *   tokens (one batched prefill, in chunks of batch_tokens rows), then runs up to k greedy draft steps, one row
 *   per still-drafting choice each, batched; the draft's argmax is the guess. A draft is a point mass on its
 *   greedy guess, so verification is the rule above, and the output is plain decoding's, seed for seed. After
 *   verification the draft sequence keeps only the guesses that were accepted (kvc_remove of the rest). How many
 *   guesses: the cost model above, with the measured time of one batched draft step added to every guess that
 *   deepens the step's draft; a choice whose guesses keep failing stops being drafted for, and a new choice starts
 *   from what the draft achieved across all choices lately (not a fixed prior: its first draft costs a catch-up of
 *   its whole context on the draft), at most 2 choices starting to draft per step. A choice drafts only
 *   when its catch-up and guesses fit what the draft's pool has left (its sequence is kept while the choice runs);
 *   a draft that cannot run (no room, no free sequence, an engine error) only costs the guesses: the step runs
 *   without them (an engine error also closes the draft sequences of that step's choices).
 *
 * Events and lifetimes
 *   For every accepted request the callback receives, on the loop thread, in this order:
 *     - per choice, zero or more SRV_SCHED_EV_DELTA events (new text and the sampled tokens),
 *     - per choice, exactly one SRV_SCHED_EV_CHOICE_END (its finish reason; may carry the last text),
 *     - exactly one SRV_SCHED_EV_DONE (usage and timings). Nothing follows DONE: the request's memory
 *       is released after the callback returns, so the caller may free `user` inside the DONE callback.
 *   Events of different choices may interleave; events of one choice are in order.
 *   Event pointers (text, samples, error) are valid only during the callback.
 *
 * Cancellation
 *   srv_sched_cancel takes effect within one step: the request's sequences are freed (its blocks return to
 *   the pool or the prefix cache) and no more DELTA events are delivered after srv_sched_cancel returns.
 *   Choices that had not finished get a CHOICE_END with SRV_SCHED_FINISH_CANCELLED, then DONE follows.
 *   (So the caller can always release its per-request state in DONE.)
 *
 * Errors: functions return 0 (SRV_SCHED_OK) or a negative SRV_SCHED_ERR_* code.
 */
#ifndef KVSERVE_SERVER_SCHED_H
#define KVSERVE_SERVER_SCHED_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include <uv.h>

#include "common/common.h"

#include "cache/kv_cache.h"
#include "cache/kv_host.h"
#include "cache/kv_tier.h"
#include "engine/engine.h"
#include "grammar/grammar.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    SRV_SCHED_OK = KVS_OK,
    SRV_SCHED_ERR_INVALID = KVS_ERR_INVALID,       /* an argument is out of range (empty prompt, n < 1, NULL callback
                                                      ...) */
    SRV_SCHED_ERR_NOMEM = KVS_ERR_NOMEM,           /* an allocation failed */
    SRV_SCHED_ERR_QUEUE_FULL = KVS_ERR_QUEUE_FULL, /* the waiting queue is at max_queue requests or
                                                      max_queued_tokens prompt tokens: answer 429 + Retry-After */
    SRV_SCHED_ERR_NOT_FOUND = KVS_ERR_NOT_FOUND,   /* no live request has that id (already done, or never existed) */
    SRV_SCHED_ERR_STOPPED = KVS_ERR_STOPPED,       /* the scheduler is shutting down */
    SRV_SCHED_ERR_THREAD = KVS_ERR_THREAD,         /* a thread, mutex or uv handle could not be created */
    SRV_SCHED_ERR_TOO_LONG = KVS_ERR_TOO_LONG,     /* prompt longer than n_ctx (the API layer answers 400) */
};

/* ---- the engine, abstracted ------------------------------------------------------------------------------
 * Everything the scheduler needs from the engine, so that tests can run it over a mock. Every function is
 * called only from the scheduler thread (the cache() result is used only there, and by
 * srv_sched_get_stats through kvc_get_stats, which the cache allows from any thread). `ctx` is passed
 * through. Samplers are opaque void * (the real implementation passes eng_sampler *). srv_sched_create
 * calls token_is_eog for every token id once (to know which tokens ignore_eos bans), and srv_sched_free
 * calls sampler_free / cache functions on the loop thread after the scheduler thread has ended. */
typedef struct srv_engine_ops {
    void *ctx;
    int32_t n_vocab;
    /* The KV cache the engine's forward pass uses. */
    kvc_cache *(*cache)(void *ctx);
    /* Runs one ragged batch; returns ENG_OK, ENG_ERR_KV_FULL (nothing changed: the scheduler preempts and
     * retries) or another ENG_ERR_* (the scheduler fails every request in the batch with that error). */
    int (*decode)(void *ctx, const eng_batch *batch);
    /* Logits [n_vocab] of batch entry i of the last decode (i wanted logits); the scheduler may modify them. */
    float *(*get_logits)(void *ctx, int32_t i);
    /* Whether token ends generation. */
    bool (*token_is_eog)(void *ctx, int32_t token);
    /* Streaming detokenization (eng_detok_push / eng_detok_flush semantics: complete UTF-8 only). They
     * return ENG_ERR_TOO_LARGE with the needed size in *n_out when cap is too small. */
    int (*detok_push)(void *ctx, eng_detok *d, int32_t token, char *buf, size_t cap, size_t *n_out);
    /* Optional (may be NULL: specials are then never printed): detok_push with control tokens printed as their
     * text, for requests with render_special. */
    int (*detok_push_special)(void *ctx, eng_detok *d, int32_t token, char *buf, size_t cap, size_t *n_out);
    int (*detok_flush)(void *ctx, eng_detok *d, char *buf, size_t cap, size_t *n_out);
    /* Samplers (eng_sampler_create / _free / _sample semantics). */
    int (*sampler_create)(void *ctx, const eng_sampling_params *params, void **out);
    void (*sampler_free)(void *ctx, void *sampler);
    int (*sampler_sample)(void *ctx, void *sampler, float *logits, eng_sample *out);
    /* Optional (may be NULL): eng_sampler_accept, used to show prompt tokens to the penalties. */
    void (*sampler_accept)(void *ctx, void *sampler, int32_t token);
    /* Optional (may be NULL: embedding requests are then refused with KVS_ERR_UNSUPPORTED): the normed final
     * hidden state [n_embd] of batch entry i of the last decode, for entries whose want_embd was set
     * (eng_get_embeddings semantics). */
    float *(*get_embd)(void *ctx, int32_t i);
    int32_t n_embd;          /* the hidden size (needed with get_embd) */
    /* Optional (may be NULL: SRV_SCHED_POOL_RANK requests are then refused with KVS_ERR_UNSUPPORTED): the n_rank
     * values of the model's classification head for batch entry i of the last decode, an embedding request's
     * first row, or its last row with rank_last (eng_get_rank semantics). */
    float *(*get_rank)(void *ctx, int32_t i);
    int32_t n_rank;          /* the head's outputs (1 <= n_rank <= n_embd with get_rank) */
    bool rank_last;          /* the head reads the prompt's last row (a decoder reranker), else its first */
    /* An encoder (bidirectional attention): a prompt runs whole in one batch (never chunked), only embedding
     * requests are taken, and a prompt longer than batch_tokens is refused with SRV_SCHED_ERR_TOO_LONG. */
    bool whole_prompts;
    /* Optional (may be NULL): eng_seq_remove semantics, for the context shift (srv_sched_params.context_shift):
     * removes positions [begin, end) of seq, moves the later ones down and re-rotates their keys. Any error
     * (ENG_ERR_UNSUPPORTED when the sequence shares the blocks involved or a sliding window released them,
     * ...) makes the scheduler recompute the shifted context instead; NULL: it always recomputes. */
    int (*seq_remove)(void *ctx, int32_t seq, int32_t begin, int32_t end);
} srv_engine_ops;

/* Fills *out with the real engine (server/sched/engine_ops.c): decode = eng_decode, the context's cache, the
 * model's vocabulary and detokenizer (special tokens not rendered), eng_sampler_*. out->ctx is a small
 * allocation: release it with srv_engine_ops_release after srv_sched_free. model and ctx must outlive the
 * scheduler. Returns SRV_SCHED_OK, SRV_SCHED_ERR_INVALID (NULL arguments) or SRV_SCHED_ERR_NOMEM. */
int srv_engine_ops_init(srv_engine_ops *out, const eng_model *model, eng_ctx *ctx);
void srv_engine_ops_release(srv_engine_ops *ops); /* NULL is a no-op */

/* ---- parameters ------------------------------------------------------------------------------------------- */
/* How the queues are ordered (see "Order" above). */
typedef enum {
    SRV_SCHED_FCFS = 0,     /* arrival order; every request's priority must be 0 */
    SRV_SCHED_PRIORITY = 1, /* (priority, arrival): lower priority values first */
} srv_sched_policy;

/* Speculative decoding proposers (srv_sched_params.spec_type). */
typedef enum {
    SRV_SCHED_SPEC_NONE = 0,  /* plain decoding */
    SRV_SCHED_SPEC_NGRAM = 1, /* prompt lookup (n-gram) */
    SRV_SCHED_SPEC_DRAFT = 2, /* a draft model (srv_sched_params.draft) */
} srv_sched_spec_type;

#define SRV_SCHED_SPEC_MAX 32 /* most guessed tokens per choice and step */

/* What the optional trace observer is told (srv_sched_params.on_trace). */
typedef enum {
    SRV_SCHED_TRACE_QUEUED = 1,    /* a submitted request entered the waiting queue */
    SRV_SCHED_TRACE_ADMITTED = 2,  /* it moved from the waiting queue to the running requests */
    SRV_SCHED_TRACE_PREEMPTED = 3, /* it moved back from running to waiting (KV pool full) */
    SRV_SCHED_TRACE_ENDED = 4,     /* it left the queues for good (its DONE event is posted) */
} srv_sched_trace_kind;

typedef struct srv_sched_trace {
    srv_sched_trace_kind kind;
    uint64_t id;              /* the request id submit returned */
    int32_t priority;         /* its srv_sched_request.priority */
    bool repeated;            /* PREEMPTED: it had not generated a token since its previous preemption */
} srv_sched_trace;

typedef struct srv_sched_params {
    int32_t batch_tokens; /* token budget of one step (decode tokens + prompt chunks), default 512; must not
                             exceed the engine's max_batch_tokens */
    int32_t parallel;     /* most sequences (choices) running at once, default 64; must not exceed the
                             cache's max_seqs (the engine context's max_seqs) */
    int32_t max_queue;    /* most waiting (not yet admitted) requests, default 256; submit beyond it
                             returns SRV_SCHED_ERR_QUEUE_FULL */
    int64_t max_queued_tokens; /* most prompt tokens of waiting (never admitted) requests, 0 (default): no
                             limit; a submit that would pass it returns SRV_SCHED_ERR_QUEUE_FULL, except into
                             an empty queue (so a long prompt is never refused forever) */
    int32_t n_ctx;        /* longest sequence (prompt + generated) in tokens; a choice reaching it ends with
                             "length" (unless context_shift). 0: unlimited (the cache's own max_seq_len still
                             applies) */
    bool context_shift;   /* default false. With n_ctx > 0: a choice whose context reaches n_ctx while its
                             request's max_tokens (> 0) is not reached shifts its context instead of ending:
                             see "Context shift" above */
    void (*on_step)(void *ctx); /* optional (NULL by default): called on the scheduler thread at the end of every
                                   step, after the cache calls of that step (KV-cache events flush per step) */
    void *on_step_ctx;
    srv_sched_policy policy;  /* SRV_SCHED_FCFS (default) or SRV_SCHED_PRIORITY */
    void (*on_trace)(void *ctx, const srv_sched_trace *t); /* optional observer (NULL by default) of every move of a
                                   request between the queues, in the order the scheduler makes them: on the
                                   scheduler thread, and inside srv_sched_free (loop thread, after the scheduler
                                   thread has ended) for the requests it ends. Must not call the scheduler. */
    void *on_trace_ctx;
    /* speculative decoding (see "Speculative decoding" above) */
    srv_sched_spec_type spec_type; /* SRV_SCHED_SPEC_NONE (default), SRV_SCHED_SPEC_NGRAM or SRV_SCHED_SPEC_DRAFT */
    int32_t spec_n_max;   /* most tokens guessed per choice and step, 1 .. SRV_SCHED_SPEC_MAX, default 16
                             (llama.cpp's --draft-max) */
    int32_t spec_n_min;   /* fewest: a guess shorter than this is not tried, 0 .. spec_n_max, default 0
                             (--draft-min) */
    int32_t spec_ngram_min, spec_ngram_max; /* n-gram lengths looked up, 1 <= min <= max <= 64, default 2 .. 4 */
    bool spec_adaptive;   /* default true: k from the acceptance rate and the step cost model; false: every
                             decoding choice with a match gets spec_n_max guesses (tests, benchmarks) */
    const srv_engine_ops *draft; /* SRV_SCHED_SPEC_DRAFT (required then, else ignored; NULL by default): the draft
                             model's engine, copied; its context must not be used by anyone else until
                             srv_sched_free, and its vocabulary must be the model's (n_vocab equal, else
                             SRV_SCHED_ERR_INVALID; the caller checks the token texts). Its context needs max_seqs
                             >= parallel and max_batch_tokens >= batch_tokens. Only cache, decode and get_logits
                             are used (see "Speculative decoding") */
    float spec_p_min;     /* SRV_SCHED_SPEC_DRAFT: a draft stops guessing at the first token whose draft
                             probability is below this, 0 .. 1, default 0 (llama.cpp's --draft-p-min) */
    uint64_t (*step_clock)(void *ctx); /* optional (NULL by default: uv_hrtime): the nanosecond clock read around
                             each engine call to time the steps the speculation cost model learns from; called on the
                             scheduler thread, must never go backwards. Tests give a virtual clock that the mock
                             engine advances by its step law, so the model's choices do not depend on the machine's
                             load. Request timings (TTFT, durations) always use uv_hrtime. */
    void *step_clock_ctx;
    kvt_tier *tier;           /* optional (NULL by default): the disk tier below the pool (cache/kv_tier.h), borrowed
                                 for the scheduler's lifetime. A new sequence continues its cached prefix with the
                                 blocks the tier holds (read by the tier's loader thread while the sequence waits,
                                 placed on the scheduler thread, counted in usage.cached_tokens), and the tier's run
                                 is closed at the end of every step.
                                 The caller routes the cache's events to kvt_on_cache_event. */
    kvh_tier *host;           /* optional (NULL by default): the host-memory tier (cache/kv_host.h), borrowed likewise:
                                 a new sequence's prefix continues pool -> host -> disk (blocks copied back into the
                                 pool on the scheduler thread, counted in usage.cached_tokens). The caller routes the
                                 cache's events to kvh_on_cache_event. */
} srv_sched_params;

void srv_sched_params_default(srv_sched_params *p);

/* ---- requests --------------------------------------------------------------------------------------------- */
typedef enum {
    SRV_SCHED_FINISH_NONE = 0,   /* not finished (DELTA events) */
    SRV_SCHED_FINISH_STOP,       /* an end-of-generation token or a stop string */
    SRV_SCHED_FINISH_LENGTH,     /* max_tokens or n_ctx reached, or the KV pool (event.truncated) */
    SRV_SCHED_FINISH_CANCELLED,  /* srv_sched_cancel or srv_sched_free */
    SRV_SCHED_FINISH_ERROR,      /* see the event's error message */
} srv_sched_finish;

/* How an embedding request pools its tokens' hidden states into one vector. */
typedef enum {
    SRV_SCHED_POOL_MEAN = 0, /* the mean over every prompt token */
    SRV_SCHED_POOL_CLS = 1,  /* the first token's */
    SRV_SCHED_POOL_LAST = 2, /* the last token's */
    SRV_SCHED_POOL_RANK = 3, /* the classification head's values for the first token, or the last with
                                srv_engine_ops.rank_last (srv_engine_ops.get_rank): the DONE event's embd holds the
                                n_rank values as the head gives them (not normalized) */
} srv_sched_pooling;

/* The finish_reason the API reports: "stop", "length", "abort" (cancelled), "error" ("" for NONE). */
const char *srv_sched_finish_name(srv_sched_finish f);

typedef enum {
    SRV_SCHED_EV_DELTA = 1,      /* a choice produced tokens (text may be empty: held back) */
    SRV_SCHED_EV_CHOICE_END = 2, /* a choice finished (text: the last text, may be empty) */
    SRV_SCHED_EV_DONE = 3,       /* the whole request finished: usage + timings; the last event */
} srv_sched_event_type;

typedef struct srv_sched_usage {
    int32_t prompt_tokens;     /* the prompt's length */
    int32_t completion_tokens; /* tokens sampled over all choices (an EOG token that ended a choice counts) */
    int32_t cached_tokens;     /* prompt tokens attached from the prefix cache instead of computed, at the
                                  request's first admission (blocks committed by a concurrent request with
                                  the same prefix count too); a multiple of the block size, < prompt_tokens */
} srv_sched_usage;

/* Timestamps are uv_hrtime() nanoseconds (monotonic); 0 when the moment never happened. */
typedef struct srv_sched_timings {
    uint64_t t_submit;        /* srv_sched_submit */
    uint64_t t_start;         /* first admitted into a step (queue time = t_start - t_submit) */
    uint64_t t_first_token;   /* first token sampled (TTFT = t_first_token - t_submit) */
    uint64_t t_end;           /* the last choice finished (e2e = t_end - t_submit) */
    int32_t n_prompt_computed;/* prompt (and recomputed) tokens this request put through decode */
    int32_t n_preempted;      /* times this request was preempted */
} srv_sched_timings;

typedef struct srv_sched_event {
    srv_sched_event_type type;
    uint64_t id;              /* the request id submit returned */
    int32_t choice;           /* 0 .. n-1 (DELTA, CHOICE_END); -1 for DONE */
    const char *text;         /* new UTF-8 text (DELTA, CHOICE_END), stop strings already cut; not NUL-
                                 terminated; NULL when text_len == 0 */
    size_t text_len;
    const eng_sample *samples;/* DELTA: the tokens sampled for this choice since its last event, with logprob
                                 and the top-N (sampling.n_top_logprobs); an EOG token that ended the choice
                                 is not included (it has no text; unless the request asked report_eog) but
                                 counts in usage.completion_tokens;
                                 CHOICE_END: none */
    int32_t n_samples;
    uint64_t t;               /* uv_hrtime() when the step that produced this event ended (ITL source) */
    srv_sched_finish finish;  /* CHOICE_END: the reason; DONE: the request's overall reason (ERROR if any
                                 choice failed, else CANCELLED if any was cancelled, else LENGTH if any
                                 reached its length, else STOP) */
    const char *error;        /* FINISH_ERROR: a message ("prompt does not fit in the KV cache", ...) */
    bool truncated;           /* CHOICE_END with FINISH_LENGTH: the choice was cut because its context no
                                 longer fits the whole KV pool, not by max_tokens or n_ctx */
    int32_t stop_match;       /* CHOICE_END with FINISH_STOP: 1 + the index in request.stop of the stop string
                                 that ended the choice; 0 otherwise (an EOG token, or another event) */
    srv_sched_usage usage;    /* DONE */
    srv_sched_timings timings;/* DONE */
    const float *embd;        /* DONE of an embedding request that finished with STOP: the pooled, L2-normalized
                                 vector [n_embd] (valid during the callback only); NULL otherwise */
    int32_t n_embd;
} srv_sched_event;

/* Called on the loop thread. Must not call srv_sched_free; may call srv_sched_submit / srv_sched_cancel. */
typedef void (*srv_sched_event_cb)(const srv_sched_event *ev, void *user);

typedef struct srv_sched_request {
    const int32_t *prompt;    /* prompt token ids (copied), n_prompt >= 1 */
    int32_t n_prompt;
    int32_t n;                /* choices, 1 .. parallel */
    int32_t max_tokens;       /* per choice; <= 0: until n_ctx / the cache's max_seq_len */
    eng_sampling_params sampling; /* copied (logit_bias deep-copied); choice i uses seed + i */
    const char *const *stop;  /* stop strings (copied; empty strings ignored) */
    size_t n_stop;
    bool ignore_eos;          /* EOG tokens are banned (logit -inf) and never end the choice */
    bool penalize_prompt;     /* the repetition/presence/frequency penalties also see the prompt tokens (as
                                 llama.cpp's server does); false: only generated tokens (needs
                                 ops.sampler_accept, ignored without it) */
    int32_t n_keep;           /* context shift: leading prompt tokens kept when the context is shifted (the API
                                 layer counts the BOS token in); < 0 or > n_prompt: the whole prompt */
    bool render_special;      /* control tokens the model generates are printed in the text (ops.detok_push_special;
                                 gpt-oss's <|channel|> ... markers, which the API layer parses); EOG tokens never */
    bool report_eog;          /* the EOG token that ended a choice is reported too, as the last sample of its
                                 last DELTA (for callers that print token ids, like `kvserve generate`) */
    bool embed;               /* an embedding request: the prompt is prefilled like any other (same batches,
                                 token budget, KV pool and preemption; no prefix-cache attach, since every
                                 token's hidden state is needed), nothing is sampled, the choice ends with
                                 STOP after its last prompt token and DONE carries the pooled vector. Needs
                                 n == 1 and ops.get_embd (else KVS_ERR_UNSUPPORTED); sampling fields ignored */
    srv_sched_pooling pooling;/* embed: how the rows are pooled */
    const gmr_matcher *grammar; /* NULL: unconstrained. Otherwise a matcher at the start of a grammar over the
                                 model's vocabulary (gmr_vocab_size == ops.n_vocab, else SRV_SCHED_ERR_INVALID):
                                 each choice gets its own clone at submit (sharing the template's mask cache).
                                 At every sampling step the choice's allowed-token mask is applied to the logits
                                 before the sampler (so logit_bias, penalties, top-k/p, min-p and seeds act on
                                 the allowed tokens only) and the sampled token is accepted; an EOG token is
                                 allowed only when the value is complete, and a choice whose value is complete
                                 with nothing that can follow ends with FINISH_STOP without sampling an EOG.
                                 A dead grammar state ends the choice with FINISH_LENGTH. Preemption keeps the
                                 matchers (like the samplers). The template, its grammar and its vocabulary
                                 must outlive the request (until its DONE event); the scheduler frees its clones
                                 before posting DONE. */
    int32_t priority;         /* lower is more urgent (vLLM's `priority`), any int32; must be 0 under
                                 SRV_SCHED_FCFS (else SRV_SCHED_ERR_INVALID) */
    int32_t spec_n_max;       /* speculative decoding (llama.cpp's speculative.n_max): -1 the scheduler's
                                 spec_n_max, 0 none for this request, else 1 .. SRV_SCHED_SPEC_MAX */
    int32_t spec_n_min;       /* -1 the scheduler's spec_n_min, else 0 .. SRV_SCHED_SPEC_MAX (speculative.n_min);
                                 a request whose n_min exceeds its n_max gets no guesses */
    srv_sched_event_cb cb;    /* required */
    void *user;               /* passed to cb */
} srv_sched_request;

/* ---- the scheduler ---------------------------------------------------------------------------------------- */
typedef struct srv_sched srv_sched;

/* Creates the scheduler: copies *ops, creates a uv_async_t on loop (so call it on the loop thread) and
 * starts the scheduler thread. The engine must not be used by anyone else until srv_sched_free.
 * Errors: SRV_SCHED_ERR_INVALID (NULL or out-of-range params/ops), SRV_SCHED_ERR_NOMEM, SRV_SCHED_ERR_THREAD. */
int srv_sched_create(const srv_sched_params *params, const srv_engine_ops *ops, uv_loop_t *loop,
                     srv_sched **out);

/* Stops the thread, finishes every outstanding request as CANCELLED (their CHOICE_END and DONE callbacks run
 * inside this call), frees the scheduler and uv_close()s its async handle (whose memory is released in the
 * close callback: run the loop once more before uv_loop_close). NULL is a no-op. Loop thread only. */
void srv_sched_free(srv_sched *s);

/* Queues a request (everything is copied; req may be freed on return) and writes its id (> 0) to *id.
 * Errors: SRV_SCHED_ERR_INVALID (also a nonzero priority under SRV_SCHED_FCFS), SRV_SCHED_ERR_TOO_LONG (n_prompt >= n_ctx), SRV_SCHED_ERR_QUEUE_FULL,
 * SRV_SCHED_ERR_NOMEM, SRV_SCHED_ERR_STOPPED. On error no callback is ever made. Loop thread only. */
int srv_sched_submit(srv_sched *s, const srv_sched_request *req, uint64_t *id);

/* Cancels a request (client disconnect, abort): see "Cancellation" above. SRV_SCHED_ERR_NOT_FOUND when the
 * request already ended (its DONE was delivered or is queued) or never existed. Loop thread only. */
int srv_sched_cancel(srv_sched *s, uint64_t id);

/* The scheduler thread's cumulative counters: it counts them in one of these and copies it whole into
 * srv_sched_stats.counters. */
typedef struct srv_sched_counters {
    uint64_t prompt_tokens_total;     /* prompt tokens of finished and running requests (usage) */
    uint64_t prompt_tokens_computed;  /* tokens put through decode as prompt (incl. recompute after preempt) */
    uint64_t generation_tokens_total; /* tokens sampled */
    uint64_t preemptions;
    uint64_t preemptions_repeated;    /* preemptions of a request that had not progressed since its last one
                                         (only when nothing else could be preempted; 0 in a healthy run) */
    uint64_t choices_truncated;       /* choices ended with LENGTH because the whole pool could not hold their
                                         context (CHOICE_END.truncated) */
    uint64_t steps;                   /* decode calls */
    uint64_t batch_tokens_total;      /* sum of the batch sizes */
    uint64_t requests_finished[5];    /* indexed by srv_sched_finish of DONE (STOP, LENGTH, CANCELLED, ERROR) */
    uint64_t context_shifts;          /* context shifts (params.context_shift), in place or recomputed */
    uint64_t context_shifts_recomputed; /* of those, shifts done by recomputing the kept tokens */
    /* speculative decoding, as vLLM counts it: a draft is one choice's guesses verified in one step */
    uint64_t spec_drafts;             /* drafts verified */
    uint64_t spec_draft_tokens;       /* tokens guessed in them */
    uint64_t spec_accepted_tokens;    /* guessed tokens that were the sampled ones */
    uint64_t spec_accepted_per_pos[SRV_SCHED_SPEC_MAX]; /* [j]: drafts whose guess j (0-based) was accepted */
    uint64_t spec_steps_off;          /* steps where the cost model dropped every guess (spec_adaptive) */
    uint64_t spec_draft_calls;        /* SRV_SCHED_SPEC_DRAFT: the draft model's decode calls */
    uint64_t spec_draft_rows;         /* ... their rows (catch-up rows and guess rows) */
    uint64_t spec_draft_catchup_rows; /* ... of which catch-up: known tokens the draft had not seen */
    uint64_t spec_draft_ns;           /* ... and the time they took (ns) */
} srv_sched_counters;

/* Raw numbers for logs and /metrics; any thread (a consistent snapshot taken under a mutex, refreshed at
 * every step and every submit). Histograms are fed by the caller from the DONE/DELTA events' timings. */
typedef struct srv_sched_stats {
    int32_t requests_running;     /* admitted requests (prefilling or decoding) */
    int32_t requests_waiting;     /* queued, not admitted (including preempted ones) */
    int32_t seqs_running;         /* sequences in use by running choices */
    int32_t kv_blocks_total, kv_blocks_used, kv_blocks_cached, kv_blocks_free;
    int32_t kv_block_size;        /* tokens per block */
    double kv_usage;              /* used / total */
    uint64_t prefix_query_tokens; /* kvc stats: tokens offered to the prefix cache */
    uint64_t prefix_hit_tokens;   /* kvc stats: tokens found there */
    srv_sched_counters counters;  /* the scheduler thread's cumulative counters */
    uint64_t requests_rejected;       /* submit refused with QUEUE_FULL because of max_queue */
    uint64_t requests_rejected_tokens;/* submit refused with QUEUE_FULL because of max_queued_tokens */
    int64_t queued_tokens;            /* prompt tokens of waiting, never admitted requests */
    int32_t spec_n_max;               /* params.spec_n_max when speculative decoding is on, else 0 */
    bool spec_draft;                  /* the guesses come from a draft model (SRV_SCHED_SPEC_DRAFT) */
    bool has_tier;                    /* params.tier was set; then `tier` holds its counters */
    kvt_stats tier;
    bool has_host;                    /* params.host was set; then `host` holds its counters */
    kvh_stats host;
} srv_sched_stats;

void srv_sched_get_stats(srv_sched *s, srv_sched_stats *out);

/* ---- saved sessions (slots) ---------------------------------------------------------------------------------
 * A slot is a sequence id, 0 .. params.parallel - 1 (llama.cpp's id_slot). Its record is the token ids the sequence
 * held (committed: prompt and generated tokens) when its last choice ended with STOP or LENGTH; a cancelled, failed,
 * preempted or embedding choice leaves the record as it was. The server saves the record's KV blocks to a file and
 * restores them from one through the disk tier (cache/kv_tier.h: kvt_export, kvt_import).
 *
 * The record of `slot`, copied into *out (malloc'd, the caller frees; NULL when *n is 0: no record). Any thread.
 * Errors: SRV_SCHED_ERR_INVALID (NULL, slot out of range), SRV_SCHED_ERR_NOMEM. */
int srv_sched_slot_tokens(srv_sched *s, int32_t slot, int32_t **out, int32_t *n);

/* Replaces the record of `slot` with tokens[0..n) (copied; n == 0 erases it) and writes the length of the record it
 * replaced to *n_old (may be NULL). Any thread. Errors: SRV_SCHED_ERR_INVALID, SRV_SCHED_ERR_NOMEM (nothing
 * changed). */
int srv_sched_slot_set(srv_sched *s, int32_t slot, const int32_t *tokens, int32_t n, int32_t *n_old);

#ifdef __cplusplus
}
#endif
#endif /* KVSERVE_SERVER_SCHED_H */
