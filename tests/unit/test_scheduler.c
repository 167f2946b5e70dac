/* test_scheduler.c: the continuous-batching scheduler over a mock engine with a REAL kvc_cache.
 *
 * The mock forward pass writes each token (K row) and its position (V row) into the cache slots that
 * kvc_start_forward hands out, and computes an entry's logits from the sequence's whole history read back
 * through the block table. So logits are a pure function of the token history, and any cache corruption
 * (wrong block shared, lost copy-on-write, a preemption that recomputes wrongly) changes the tokens
 * generated: outputs under pressure are compared with the same request run alone in a roomy pool.
 *
 * Prompts use token ids 1..15 and the mock only ever generates 0 (EOG) or 16..31, so a batch entry whose
 * token is >= 16 is a generated token being decoded (or recomputed after a preemption). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "server/sched/sched.h"

#define NV 32
#define GEN0 16
#define MAXB 1024

/* ---- mock engine ----------------------------------------------------------------------------------------- */
typedef struct batch_log {
    int32_t n;
    int32_t *token, *pos, *seq;
    bool *logits;
} batch_log;

typedef struct mock {
    kvc_cache *cache;
    kvc_layout lay;
    int32_t max_batch;
    float *logits;          /* [max_batch][NV] */
    int32_t *slots;
    kvc_entry *entries;
    float eog_logit;        /* added to the EOG logit */
    atomic_int decode_calls;
    atomic_llong tokens_total;
    atomic_int accepted;    /* sampler_accept calls */
    bool corrupt;           /* a position read back wrong */
    char check_msg[256];    /* first kvc_check failure */
    int other_errors;       /* kvc errors other than FULL */
    batch_log *log;         /* every successful batch (when log_batches) */
    int32_t n_log, cap_log;
    bool log_batches;
    int inject_full_every;  /* > 0: every k-th call with >= 2 sequences returns ENG_ERR_KV_FULL */
    int injected;
    int fail_at;            /* > 0: that decode call (1-based) fails with ENG_ERR_DEVICE */
    /* gate: when set, decode blocks until opened (for queue tests) */
    bool record_times;      /* record uv_hrtime() at the start of every decode */
    uint64_t times[100000];
    int32_t n_times;
    uv_mutex_t gmu;
    uv_cond_t gcv;
    bool gate_closed, in_gate;
    int close_at;           /* > 0: the gate closes by itself before that decode call (1-based) ... */
    bool released;          /* ... unless the test has released it already */
    bool lockstep;          /* decode k+1 waits for the loop thread to dispatch step k's events */
    int granted;
    int decode_sleep_us;    /* > 0: every decode call takes at least this long */
} mock;

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static kvc_cache *m_cache(void *p) { return ((mock *)p)->cache; }

static int m_decode(void *p, const eng_batch *b) {
    mock *m = p;
    uv_mutex_lock(&m->gmu);
    if (m->close_at > 0 && !m->released && atomic_load(&m->decode_calls) + 1 == m->close_at) m->gate_closed = true;
    m->in_gate = true;
    uv_cond_broadcast(&m->gcv);
    while (m->gate_closed) uv_cond_wait(&m->gcv, &m->gmu);
    m->in_gate = false;
    if (m->lockstep) {
        /* wait until the loop thread has dispatched the events of the previous step (its check handle
         * grants the next decode); a step without events never wakes the loop, so give up after 20 ms */
        int calls = atomic_load(&m->decode_calls);
        while (m->granted <= calls)
            if (uv_cond_timedwait(&m->gcv, &m->gmu, 20 * 1000 * 1000) != 0) break;
    }
    uv_mutex_unlock(&m->gmu);
    atomic_fetch_add(&m->decode_calls, 1);
    if (m->record_times && m->n_times < 100000) m->times[m->n_times++] = uv_hrtime();
    if (m->decode_sleep_us > 0) {
        struct timespec ts = {0, (long)m->decode_sleep_us * 1000L};
        nanosleep(&ts, NULL);
    }
    if (b->n < 1 || b->n > m->max_batch) return ENG_ERR_INVALID;
    int32_t distinct = 0;
    for (int32_t i = 0; i < b->n; i++) {
        if (b->token[i] < 0 || b->token[i] >= NV) return ENG_ERR_INVALID;
        if (i == 0 || b->seq[i] != b->seq[i - 1]) distinct++;
        m->entries[i] = (kvc_entry){.seq = b->seq[i], .pos = b->pos[i], .token = b->token[i]};
    }
    if (m->inject_full_every > 0 && distinct >= 2 && ++m->injected % m->inject_full_every == 0)
        return ENG_ERR_KV_FULL;
    if (m->fail_at > 0 && atomic_load(&m->decode_calls) == m->fail_at) return ENG_ERR_DEVICE;
    int rc = kvc_start_forward(m->cache, m->entries, b->n, m->slots);
    if (rc == KVC_ERR_FULL) return ENG_ERR_KV_FULL;
    if (rc != KVC_OK) {
        m->other_errors++;
        return ENG_ERR_KV;
    }
    for (int32_t i = 0; i < b->n; i++) {
        *(float *)kvc_row_ptr(&m->lay, 0, 0, m->slots[i], 0) = (float)b->token[i];
        *(float *)kvc_row_ptr(&m->lay, 0, 1, m->slots[i], 0) = (float)b->pos[i];
    }
    int32_t bs = m->lay.block_size;
    for (int32_t i = 0; i < b->n; i++) {
        if (!b->want_logits[i]) continue;
        const int32_t *tab;
        int32_t nb, len;
        if (kvc_block_table(m->cache, b->seq[i], &tab, &nb, &len) != KVC_OK || b->pos[i] >= len) {
            m->corrupt = true;
            continue;
        }
        uint64_t h = 0x1234567;
        for (int32_t q = 0; q <= b->pos[i]; q++) {
            int32_t slot = tab[q / bs] * bs + q % bs;
            float tok = *(float *)kvc_row_ptr(&m->lay, 0, 0, slot, 0);
            float pos = *(float *)kvc_row_ptr(&m->lay, 0, 1, slot, 0);
            if (pos != (float)q) m->corrupt = true;
            h = mix64(h ^ (uint64_t)(int64_t)tok);
        }
        float *lg = m->logits + (size_t)i * NV;
        for (int32_t v = 0; v < NV; v++) {
            if (v > 0 && v < GEN0) lg[v] = -INFINITY;
            else lg[v] = (float)(mix64(h + (uint64_t)v * 0x9e37) % 2000) / 250.0f - 4.0f;
        }
        lg[0] += m->eog_logit;
    }
    kvc_finish_forward(m->cache, true);
    atomic_fetch_add(&m->tokens_total, b->n);
    if (kvc_check(m->cache, m->check_msg[0] ? NULL : m->check_msg, m->check_msg[0] ? 0 : sizeof m->check_msg) !=
        KVC_OK && !m->check_msg[0])
        snprintf(m->check_msg, sizeof m->check_msg, "kvc_check failed");
    if (m->log_batches) {
        if (m->n_log == m->cap_log) {
            m->cap_log = m->cap_log ? m->cap_log * 2 : 64;
            m->log = realloc(m->log, (size_t)m->cap_log * sizeof *m->log);
        }
        batch_log *l = &m->log[m->n_log++];
        l->n = b->n;
        l->token = malloc((size_t)b->n * sizeof(int32_t));
        l->pos = malloc((size_t)b->n * sizeof(int32_t));
        l->seq = malloc((size_t)b->n * sizeof(int32_t));
        l->logits = malloc((size_t)b->n * sizeof(bool));
        memcpy(l->token, b->token, (size_t)b->n * sizeof(int32_t));
        memcpy(l->pos, b->pos, (size_t)b->n * sizeof(int32_t));
        memcpy(l->seq, b->seq, (size_t)b->n * sizeof(int32_t));
        memcpy(l->logits, b->want_logits, (size_t)b->n * sizeof(bool));
    }
    return ENG_OK;
}

static float *m_logits(void *p, int32_t i) {
    mock *m = p;
    return i >= 0 && i < m->max_batch ? m->logits + (size_t)i * NV : NULL;
}

static bool m_eog(void *p, int32_t t) {
    (void)p;
    return t == 0;
}

static const char *const PIECES[NV - GEN0] = {"x", "y", " ", "ab", "ba", "\n", "st", "op",
                                             "s", "t", "o", "p", "!", "q", "zz", "."};

static const char *piece_of(int32_t t) { return t >= GEN0 ? PIECES[t - GEN0] : t == 0 ? "" : "P"; }

static int m_push(void *p, eng_detok *d, int32_t t, char *buf, size_t cap, size_t *n) {
    (void)p;
    (void)d;
    const char *s = piece_of(t);
    *n = strlen(s);
    if (*n > cap) return ENG_ERR_TOO_LARGE;
    memcpy(buf, s, *n);
    return ENG_OK;
}

/* control tokens printed (render_special): every piece in angle brackets, so the text tells which op ran */
static int m_push_special(void *p, eng_detok *d, int32_t t, char *buf, size_t cap, size_t *n) {
    (void)p;
    (void)d;
    char tmp[16];
    *n = (size_t)snprintf(tmp, sizeof tmp, "<%s>", piece_of(t));
    if (*n > cap) return ENG_ERR_TOO_LARGE;
    memcpy(buf, tmp, *n);
    return ENG_OK;
}

static int m_flush(void *p, eng_detok *d, char *buf, size_t cap, size_t *n) {
    (void)p;
    (void)d;
    (void)buf;
    (void)cap;
    *n = 0;
    return ENG_OK;
}

/* A small seeded sampler: temperature sampling over the raw logits (greedy when temperature <= 0), raw
 * log-softmax logprob and top-N. */
typedef struct msampler {
    uint64_t rng;
    float temp;
    int32_t n_top;
} msampler;

static int m_screate(void *p, const eng_sampling_params *sp, void **out) {
    (void)p;
    msampler *s = malloc(sizeof *s);
    if (!s) return ENG_ERR_NOMEM;
    s->rng = sp->seed * 0x9e3779b97f4a7c15ULL + 1;
    s->temp = sp->temperature;
    s->n_top = sp->n_top_logprobs;
    *out = s;
    return ENG_OK;
}

static void m_accept(void *p, void *s, int32_t token) {
    (void)s;
    (void)token;
    atomic_fetch_add(&((mock *)p)->accepted, 1);
}

static void m_sfree(void *p, void *s) {
    (void)p;
    free(s);
}

static int m_sample(void *p, void *sv, float *lg, eng_sample *out) {
    (void)p;
    msampler *s = sv;
    float mx = -INFINITY;
    int32_t arg = 0;
    for (int32_t v = 0; v < NV; v++)
        if (lg[v] > mx) {
            mx = lg[v];
            arg = v;
        }
    double z = 0;
    for (int32_t v = 0; v < NV; v++) z += isinf(lg[v]) ? 0.0 : exp(lg[v] - mx);
    double lse = mx + log(z);
    int32_t tok = arg;
    if (s->temp > 0) {
        double w[NV], tot = 0;
        for (int32_t v = 0; v < NV; v++) {
            w[v] = isinf(lg[v]) ? 0.0 : exp((lg[v] - mx) / s->temp);
            tot += w[v];
        }
        s->rng = mix64(s->rng + 0x9e3779b97f4a7c15ULL);
        double u = (double)(s->rng >> 11) / 9007199254740992.0 * tot;
        tok = -1;
        for (int32_t v = 0; v < NV; v++) {
            if (w[v] == 0) continue;
            tok = v;
            if (u < w[v]) break;
            u -= w[v];
        }
    }
    out->token = tok;
    out->logprob = (float)(lg[tok] - lse);
    out->n_top = 0;
    bool used[NV] = {0};
    for (int32_t k = 0; k < s->n_top && k < 20; k++) {
        int32_t b = -1;
        for (int32_t v = 0; v < NV; v++)
            if (!used[v] && !isinf(lg[v]) && (b < 0 || lg[v] > lg[b])) b = v;
        if (b < 0) break;
        used[b] = true;
        out->top_token[k] = b;
        out->top_logprob[k] = (float)(lg[b] - lse);
        out->n_top = k + 1;
    }
    return ENG_OK;
}

static void mock_init(mock *m, int32_t block_size, int32_t n_blocks, int32_t max_seqs, int32_t max_batch) {
    memset(m, 0, sizeof *m);
    kvc_params p;
    kvc_params_default(&p);
    p.n_layer = 1;
    p.n_kv_head = 1;
    p.head_dim = 1;
    p.block_size = block_size;
    p.n_blocks = n_blocks;
    p.max_seqs = max_seqs;
    p.max_batch_tokens = max_batch;
    p.dtype = KVC_DTYPE_F32;
    p.prefix_caching = true;
    cr_assert_eq(kvc_create(&p, &m->cache), KVC_OK);
    kvc_get_layout(m->cache, &m->lay);
    m->max_batch = max_batch;
    m->logits = calloc((size_t)max_batch * NV, sizeof(float));
    m->slots = calloc((size_t)max_batch, sizeof(int32_t));
    m->entries = calloc((size_t)max_batch, sizeof(kvc_entry));
    m->eog_logit = -3.0f;
    cr_assert(m->logits && m->slots && m->entries);
    uv_mutex_init(&m->gmu);
    uv_cond_init(&m->gcv);
}

static void mock_free(mock *m) {
    for (int32_t i = 0; i < m->n_log; i++) {
        free(m->log[i].token);
        free(m->log[i].pos);
        free(m->log[i].seq);
        free(m->log[i].logits);
    }
    free(m->log);
    free(m->logits);
    free(m->slots);
    free(m->entries);
    kvc_free(m->cache);
    uv_cond_destroy(&m->gcv);
    uv_mutex_destroy(&m->gmu);
}

static srv_engine_ops mock_ops(mock *m) {
    srv_engine_ops o = {
        .ctx = m, .n_vocab = NV, .cache = m_cache, .decode = m_decode, .get_logits = m_logits,
        .token_is_eog = m_eog, .detok_push = m_push, .detok_push_special = m_push_special, .detok_flush = m_flush,
        .sampler_create = m_screate,
        .sampler_free = m_sfree, .sampler_sample = m_sample, .sampler_accept = m_accept,
    };
    return o;
}

typedef struct req_spec {
    int32_t prompt[512];
    int32_t n_prompt;
    int32_t n;
    int32_t max_tokens;
    float temp;
    uint64_t seed;
    const char *stop[2];
    size_t n_stop;
    bool ignore_eos;
    bool penalize_prompt;
    int32_t top;
    const gmr_matcher *grammar;
    int32_t priority;
    bool render_special;
} req_spec;

/* ---- collecting results ----------------------------------------------------------------------------------- */
#define MAXC 4
typedef struct result {
    int32_t n;
    char text[MAXC][MAXB];
    size_t text_len[MAXC];
    int32_t toks[MAXC][MAXB];
    int32_t n_toks[MAXC];
    int ends[MAXC];
    srv_sched_finish finish[MAXC];
    bool truncated[MAXC];      /* CHOICE_END said: cut by the KV pool */
    int32_t stop_match[MAXC];  /* CHOICE_END: 1 + the stop string that ended it, 0: none */
    char error[128];
    int done;
    srv_sched_finish done_finish;
    srv_sched_usage usage;
    srv_sched_timings timings;
    int order_errors;          /* events out of the documented order */
    int deltas_after_cancel;
    bool cancel_called, cancel_tried;
    int done_seq;              /* position in the global DONE order */
    /* hooks */
    struct harness *hz;
    int cancel_after_tokens;   /* > 0: cancel after this many tokens of choice 0 */
    uint64_t id;
    uint64_t t_cancel, t_done_ev;
    int32_t kv_used_at_done;
} result;

typedef struct harness {
    uv_loop_t loop;
    mock m;
    srv_sched *s;
    int n_done;
    int done_counter;
    /* chained submissions: every DONE submits chain[chain_next] (from inside the callback) */
    const struct req_spec *chain;
    struct result *chain_res;
    int chain_next, chain_n;
    const int *chain_cancel; /* cancel_after_tokens per chained request */
} harness;

static int submit(harness *h, const struct req_spec *q, struct result *r);

static void on_event(const srv_sched_event *ev, void *user) {
    result *r = user;
    if (r->done) {
        r->order_errors++;
        return;
    }
    switch (ev->type) {
    case SRV_SCHED_EV_DELTA:
        if (ev->choice < 0 || ev->choice >= r->n || r->ends[ev->choice]) {
            r->order_errors++;
            return;
        }
        if (r->cancel_called) r->deltas_after_cancel++;
        if (ev->text_len) memcpy(r->text[ev->choice] + r->text_len[ev->choice], ev->text, ev->text_len);
        r->text_len[ev->choice] += ev->text_len;
        for (int32_t i = 0; i < ev->n_samples; i++) r->toks[ev->choice][r->n_toks[ev->choice]++] = ev->samples[i].token;
        if (r->cancel_after_tokens > 0 && !r->cancel_tried && r->n_toks[0] >= r->cancel_after_tokens) {
            r->cancel_tried = true;
            r->t_cancel = uv_hrtime();
            int crc = srv_sched_cancel(r->hz->s, r->id);
            /* NOT_FOUND: the request already ended (its DONE is queued behind this event) */
            cr_assert(crc == SRV_SCHED_OK || crc == SRV_SCHED_ERR_NOT_FOUND);
            r->cancel_called = crc == SRV_SCHED_OK;
            mock *m = &r->hz->m;
            uv_mutex_lock(&m->gmu);
            m->gate_closed = false;
            m->released = true;
            uv_cond_broadcast(&m->gcv);
            uv_mutex_unlock(&m->gmu);
        }
        break;
    case SRV_SCHED_EV_CHOICE_END:
        if (ev->choice < 0 || ev->choice >= r->n || r->ends[ev->choice]) {
            r->order_errors++;
            return;
        }
        if (ev->text_len) memcpy(r->text[ev->choice] + r->text_len[ev->choice], ev->text, ev->text_len);
        r->text_len[ev->choice] += ev->text_len;
        r->ends[ev->choice]++;
        r->finish[ev->choice] = ev->finish;
        r->truncated[ev->choice] = ev->truncated;
        r->stop_match[ev->choice] = ev->stop_match;
        if (ev->stop_match && ev->finish != SRV_SCHED_FINISH_STOP) r->order_errors++;
        if (ev->truncated && ev->finish != SRV_SCHED_FINISH_LENGTH) r->order_errors++;
        if (ev->error) snprintf(r->error, sizeof r->error, "%s", ev->error);
        break;
    case SRV_SCHED_EV_DONE:
        for (int32_t i = 0; i < r->n; i++)
            if (r->ends[i] != 1) r->order_errors++;
        r->done = 1;
        r->done_finish = ev->finish;
        r->usage = ev->usage;
        r->timings = ev->timings;
        r->done_seq = r->hz->done_counter++;
        r->t_done_ev = ev->t;
        srv_sched_stats st;
        srv_sched_get_stats(r->hz->s, &st); /* refreshed together with posting this DONE */
        r->kv_used_at_done = st.kv_blocks_used;
        r->hz->n_done++;
        if (r->hz->chain && r->hz->chain_next < r->hz->chain_n) {
            harness *hz = r->hz;
            int k = hz->chain_next++;
            cr_assert_eq(submit(hz, &hz->chain[k], &hz->chain_res[k]), SRV_SCHED_OK);
            hz->chain_res[k].cancel_after_tokens = hz->chain_cancel[k];
        }
        break;
    }
}

static void hz_init(harness *h, int32_t block_size, int32_t n_blocks, const srv_sched_params *sp) {
    memset(h, 0, sizeof *h);
    cr_assert_eq(uv_loop_init(&h->loop), 0);
    mock_init(&h->m, block_size, n_blocks, sp->parallel, sp->batch_tokens);
    srv_engine_ops ops = mock_ops(&h->m);
    cr_assert_eq(srv_sched_create(sp, &ops, &h->loop, &h->s), SRV_SCHED_OK);
}

static void on_check(uv_check_t *c) {
    mock *m = c->data;
    uv_mutex_lock(&m->gmu);
    m->granted = atomic_load(&m->decode_calls) + 1;
    uv_cond_broadcast(&m->gcv);
    uv_mutex_unlock(&m->gmu);
}

static void hz_run(harness *h, int n_done) {
    while (h->n_done < n_done) uv_run(&h->loop, UV_RUN_ONCE);
}

static void hz_free(harness *h) {
    srv_sched_free(h->s);
    uv_run(&h->loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&h->loop), 0);
    cr_assert(!h->m.corrupt, "mock read back a wrong position");
    cr_assert_eq(h->m.other_errors, 0);
    cr_assert(!h->m.check_msg[0], "kvc_check: %s", h->m.check_msg);
    mock_free(&h->m);
}


static int submit(harness *h, const struct req_spec *q, struct result *r) {
    memset(r, 0, sizeof *r);
    r->n = q->n;
    r->hz = h;
    srv_sched_request rq;
    memset(&rq, 0, sizeof rq);
    rq.prompt = q->prompt;
    rq.n_prompt = q->n_prompt;
    rq.n = q->n;
    rq.max_tokens = q->max_tokens;
    eng_sampling_params sp;
    memset(&sp, 0, sizeof sp);
    sp.temperature = q->temp;
    sp.seed = q->seed;
    sp.n_top_logprobs = q->top;
    rq.sampling = sp;
    rq.stop = q->stop;
    rq.n_stop = q->n_stop;
    rq.ignore_eos = q->ignore_eos;
    rq.penalize_prompt = q->penalize_prompt;
    rq.grammar = q->grammar;
    rq.priority = q->priority;
    rq.render_special = q->render_special;
    rq.cb = on_event;
    rq.user = r;
    return srv_sched_submit(h->s, &rq, &r->id);
}

static void rand_prompt(uint64_t *rng, req_spec *q, int32_t n) {
    q->n_prompt = n;
    for (int32_t i = 0; i < n; i++) q->prompt[i] = 1 + (int32_t)(mix64((*rng)++) % (GEN0 - 1));
}

static srv_sched_params params(int32_t batch, int32_t parallel) {
    srv_sched_params p;
    srv_sched_params_default(&p);
    p.batch_tokens = batch;
    p.parallel = parallel;
    return p;
}

/* Runs one request alone in a roomy pool (fcfs: its priority cannot matter alone) and returns its result. */
static void run_alone(const req_spec *q, result *out) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(64, 8);
    hz_init(h, 8, 1024, &p);
    req_spec one = *q;
    one.priority = 0;
    cr_assert_eq(submit(h, &one, out), SRV_SCHED_OK);
    hz_run(h, 1);
    hz_free(h);
    free(h);
}

static void assert_same(const result *a, const result *b, const char *what) {
    cr_assert_eq(a->n, b->n);
    for (int32_t c = 0; c < a->n; c++) {
        cr_assert_eq(a->n_toks[c], b->n_toks[c], "%s: choice %d: %d vs %d tokens", what, c, a->n_toks[c],
                     b->n_toks[c]);
        cr_assert(memcmp(a->toks[c], b->toks[c], (size_t)a->n_toks[c] * sizeof(int32_t)) == 0,
                  "%s: choice %d tokens differ", what, c);
        cr_assert_eq(a->text_len[c], b->text_len[c], "%s: choice %d text", what, c);
        cr_assert(memcmp(a->text[c], b->text[c], a->text_len[c]) == 0, "%s: choice %d text differs", what, c);
        cr_assert_eq(a->finish[c], b->finish[c], "%s: choice %d finish", what, c);
    }
    cr_assert_eq(a->usage.completion_tokens, b->usage.completion_tokens, "%s", what);
}

static void assert_clean(const result *r) {
    cr_assert_eq(r->done, 1);
    cr_assert_eq(r->order_errors, 0, "events out of order");
}

/* ---- tests ---------------------------------------------------------------------------------------------------- */

/* Every batch respects the token budget, puts decode tokens before prompt chunks, asks logits only for the
 * last token of a sequence's run, and long prompts are split across steps (chunked prefill). */
Test(scheduler, budget_decode_first_chunked_prefill) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(24, 8);
    hz_init(h, 8, 512, &p);
    h->m.log_batches = true;
    enum { NR = 6 };
    req_spec q[NR];
    result *res = calloc(NR, sizeof *res);
    uint64_t rng = 7;
    for (int i = 0; i < NR; i++) {
        memset(&q[i], 0, sizeof q[i]);
        rand_prompt(&rng, &q[i], i == 0 ? 100 : 5 + 11 * i);
        q[i].n = 1;
        q[i].max_tokens = 12;
        q[i].temp = 1.0f;
        q[i].seed = (uint64_t)i;
        q[i].ignore_eos = true;
        cr_assert_eq(submit(h, &q[i], &res[i]), SRV_SCHED_OK);
    }
    hz_run(h, NR);
    int mixed = 0, chunks_of_long = 0;
    for (int32_t b = 0; b < h->m.n_log; b++) {
        batch_log *l = &h->m.log[b];
        cr_assert(l->n <= 24, "batch %d has %d tokens", b, l->n);
        bool seen_prompt = false, has_decode = false;
        for (int32_t i = 0; i < l->n; i++) {
            bool gen = l->token[i] >= GEN0;
            if (gen) cr_assert(!seen_prompt, "batch %d: decode token after a prompt chunk", b);
            else seen_prompt = true;
            has_decode |= gen;
            bool last_of_run = i == l->n - 1 || l->seq[i + 1] != l->seq[i];
            if (l->logits[i]) cr_assert(last_of_run, "batch %d: logits inside a run", b);
            if (gen) cr_assert(l->logits[i]);
        }
        if (has_decode && seen_prompt) mixed++;
        /* the 100-token prompt: count batches holding its positions 0..99 as prompt tokens */
        for (int32_t i = 0; i < l->n; i++)
            if (!(l->token[i] >= GEN0) && l->pos[i] == 99 && l->token[i] == q[0].prompt[99]) {
                cr_assert(l->logits[i], "last prompt token must want logits");
            }
    }
    /* the long prompt needed ceil(100 / 24) >= 5 steps: find its sequence's prompt entries */
    for (int32_t b = 0; b < h->m.n_log; b++) {
        batch_log *l = &h->m.log[b];
        for (int32_t i = 0; i < l->n; i++)
            if (l->pos[i] < 100 && l->token[i] < GEN0 && l->pos[i] > 40) { chunks_of_long++; break; }
    }
    cr_assert_geq(chunks_of_long, 3, "long prompt was not chunked");
    cr_assert_gt(mixed, 0, "no step mixed decode and prefill");
    for (int i = 0; i < NR; i++) {
        assert_clean(&res[i]);
        cr_assert_eq(res[i].n_toks[0], 12);
        cr_assert_eq(res[i].finish[0], SRV_SCHED_FINISH_LENGTH);
        result alone;
        run_alone(&q[i], &alone);
        assert_same(&res[i], &alone, "budget");
    }
    srv_sched_stats st;
    srv_sched_get_stats(h->s, &st);
    cr_assert_eq(st.counters.generation_tokens_total, NR * 12);
    cr_assert_eq(st.counters.requests_finished[SRV_SCHED_FINISH_LENGTH], NR);
    hz_free(h);
    free(h);
    free(res);
}

/* parallel = 1: requests run one at a time in submission order. */
Test(scheduler, fcfs) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(64, 1);
    hz_init(h, 8, 256, &p);
    enum { NR = 5 };
    req_spec q[NR];
    result *res = calloc(NR, sizeof *res);
    uint64_t rng = 11;
    for (int i = 0; i < NR; i++) {
        memset(&q[i], 0, sizeof q[i]);
        rand_prompt(&rng, &q[i], 10 + 3 * i);
        q[i].n = 1;
        q[i].max_tokens = 5;
        q[i].temp = 0;
        q[i].ignore_eos = true;
        cr_assert_eq(submit(h, &q[i], &res[i]), SRV_SCHED_OK);
    }
    hz_run(h, NR);
    for (int i = 0; i < NR; i++) {
        assert_clean(&res[i]);
        cr_assert_eq(res[i].done_seq, i, "request %d finished %d-th", i, res[i].done_seq);
        if (i > 0) cr_assert_geq(res[i].timings.t_start, res[i - 1].timings.t_end);
        cr_assert(res[i].timings.t_submit <= res[i].timings.t_start);
        cr_assert(res[i].timings.t_start <= res[i].timings.t_first_token);
        cr_assert(res[i].timings.t_first_token <= res[i].timings.t_end);
    }
    hz_free(h);
    free(h);
    free(res);
}

/* render_special: the request's text comes from ops.detok_push_special (gpt-oss's channel markers are control
 * tokens), the same tokens as without it; other requests keep detok_push. */
Test(scheduler, render_special_uses_its_detokenizer) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(64, 2);
    hz_init(h, 8, 256, &p);
    req_spec q[2];
    result *res = calloc(2, sizeof *res);
    uint64_t rng = 5;
    for (int i = 0; i < 2; i++) {
        memset(&q[i], 0, sizeof q[i]);
        rand_prompt(&rng, &q[i], 12);
        if (i) memcpy(&q[1], &q[0], sizeof q[0]);
        q[i].n = 1;
        q[i].max_tokens = 6;
        q[i].ignore_eos = true;
        q[i].render_special = i == 1;
        cr_assert_eq(submit(h, &q[i], &res[i]), SRV_SCHED_OK);
    }
    hz_run(h, 2);
    char want[MAXB] = "", plain[MAXB] = "";
    for (int32_t k = 0; k < res[1].n_toks[0]; k++) {
        snprintf(want + strlen(want), sizeof want - strlen(want), "<%s>", piece_of(res[1].toks[0][k]));
        snprintf(plain + strlen(plain), sizeof plain - strlen(plain), "%s", piece_of(res[0].toks[0][k]));
    }
    cr_assert_eq(res[0].n_toks[0], res[1].n_toks[0]);
    cr_assert_eq(memcmp(res[0].toks[0], res[1].toks[0], (size_t)res[0].n_toks[0] * sizeof(int32_t)), 0);
    cr_assert_eq(res[1].text_len[0], strlen(want));
    cr_assert(!memcmp(res[1].text[0], want, strlen(want)), "%.*s", (int)res[1].text_len[0], res[1].text[0]);
    cr_assert_eq(res[0].text_len[0], strlen(plain));
    cr_assert(!memcmp(res[0].text[0], plain, strlen(plain)));
    hz_free(h);
    free(h);
    free(res);
}

/* n > 1: one prefill of the prompt, then every choice continues independently and equals the same request
 * with n = 1 and seed + i. */
Test(scheduler, n_choices_share_one_prefill) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(64, 8);
    hz_init(h, 8, 256, &p);
    req_spec q;
    memset(&q, 0, sizeof q);
    uint64_t rng = 3;
    rand_prompt(&rng, &q, 43);
    q.n = 4;
    q.max_tokens = 20;
    q.temp = 1.0f;
    q.seed = 100;
    q.top = 3;
    result *r = calloc(1, sizeof *r);
    cr_assert_eq(submit(h, &q, r), SRV_SCHED_OK);
    hz_run(h, 1);
    assert_clean(r);
    srv_sched_stats st;
    srv_sched_get_stats(h->s, &st);
    cr_assert_eq(st.counters.prompt_tokens_computed, 43, "prompt computed %llu times its length",
                 (unsigned long long)st.counters.prompt_tokens_computed);
    int32_t gen = 0;
    for (int c = 0; c < 4; c++) gen += r->n_toks[c] + (r->finish[c] == SRV_SCHED_FINISH_STOP ? 1 : 0);
    cr_assert_eq(r->usage.completion_tokens, gen);
    /* tokens through the engine: the prompt once, then every generated token except each choice's last */
    int64_t expect = 43;
    for (int c = 0; c < 4; c++) {
        int32_t g = r->n_toks[c] + (r->finish[c] == SRV_SCHED_FINISH_STOP ? 1 : 0);
        expect += g - 1;
    }
    cr_assert_eq(atomic_load(&h->m.tokens_total), expect);
    bool differ = false;
    for (int c = 0; c < 4; c++) {
        req_spec one = q;
        one.n = 1;
        one.seed = q.seed + (uint64_t)c;
        result alone;
        run_alone(&one, &alone);
        cr_assert_eq(alone.n_toks[0], r->n_toks[c], "choice %d", c);
        cr_assert(memcmp(alone.toks[0], r->toks[c], (size_t)r->n_toks[c] * sizeof(int32_t)) == 0, "choice %d", c);
        cr_assert_eq(alone.text_len[0], r->text_len[c]);
        if (c > 0 && (r->n_toks[c] != r->n_toks[0] || memcmp(r->toks[c], r->toks[0], (size_t)r->n_toks[0] * 4)))
            differ = true;
    }
    cr_assert(differ, "all choices identical: seeds not applied per choice");
    cr_assert_eq(atomic_load(&h->m.accepted), 0, "prompt shown to the penalties without penalize_prompt");
    /* penalize_prompt: every choice's sampler sees the prompt once */
    req_spec pp = q;
    pp.penalize_prompt = true;
    pp.max_tokens = 2;
    result *rp = calloc(1, sizeof *rp);
    cr_assert_eq(submit(h, &pp, rp), SRV_SCHED_OK);
    hz_run(h, 2);
    assert_clean(rp);
    cr_assert_eq(atomic_load(&h->m.accepted), 4 * 43);
    free(rp);
    hz_free(h);
    free(h);
    free(r);
}

/* A second request with a shared prefix attaches the cached full blocks and reports them. */
Test(scheduler, prefix_cache_reports_cached_tokens) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(64, 8);
    hz_init(h, 16, 256, &p);
    req_spec a, b;
    memset(&a, 0, sizeof a);
    uint64_t rng = 5;
    rand_prompt(&rng, &a, 50);
    a.n = 1;
    a.max_tokens = 4;
    a.ignore_eos = true;
    b = a;
    for (int i = 40; i < 50; i++) b.prompt[i] = 1 + (b.prompt[i] % 14); /* same first 40 tokens */
    b.prompt[40] = a.prompt[40] == 1 ? 2 : 1;
    result *ra = calloc(1, sizeof *ra), *rb = calloc(1, sizeof *rb);
    cr_assert_eq(submit(h, &a, ra), SRV_SCHED_OK);
    hz_run(h, 1);
    cr_assert_eq(ra->usage.cached_tokens, 0);
    cr_assert_eq(submit(h, &b, rb), SRV_SCHED_OK);
    hz_run(h, 2);
    assert_clean(ra);
    assert_clean(rb);
    cr_assert_eq(rb->usage.cached_tokens, 32, "cached %d", rb->usage.cached_tokens);
    cr_assert_eq(rb->usage.prompt_tokens, 50);
    srv_sched_stats st;
    srv_sched_get_stats(h->s, &st);
    cr_assert_eq(st.counters.prompt_tokens_computed, 50 + 18);
    cr_assert_geq(st.prefix_hit_tokens, 32);
    result alone;
    run_alone(&b, &alone);
    assert_same(rb, &alone, "prefix");
    /* the same prompt again: everything but the last block's partial tail is cached */
    result *rc = calloc(1, sizeof *rc);
    cr_assert_eq(submit(h, &a, rc), SRV_SCHED_OK);
    hz_run(h, 3);
    cr_assert_eq(rc->usage.cached_tokens, 48);
    assert_same(rc, ra, "same prompt");
    hz_free(h);
    free(h);
    free(ra);
    free(rb);
    free(rc);
}

/* NR requests arrive together (the later ones while the first one's prefill is in the engine); their prompts of len tokens agree on the first `common` tokens and differ after.
 * Only the first request computes the common prefix: the others wait for it and reuse `reused` tokens of it
 * (prefix-cache blocks, or a copy from the first request's sequence), so the engine computes
 * len + (NR - 1) * (len - common) prompt tokens, and every request equals its run alone. */
static void check_concurrent_prefix(uint64_t seed, int32_t len, int32_t common, int32_t mix, int32_t reused) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(512, 8);
    hz_init(h, 16, 256, &p);
    enum { NR = 4 };
    req_spec q[NR];
    result *res = calloc(NR, sizeof *res);
    uint64_t rng = seed;
    req_spec base;
    memset(&base, 0, sizeof base);
    rand_prompt(&rng, &base, len);
    for (int i = 0; i < NR; i++) {
        q[i] = base;
        for (int k = common; k < len; k++) q[i].prompt[k] = 1 + (int32_t)((k * mix + i * 3) % 15);
        q[i].n = 1;
        q[i].max_tokens = 6;
        q[i].temp = 1.0f;
        q[i].seed = (uint64_t)i;
        q[i].ignore_eos = true;
    }
    /* "together": the others are submitted while the first one's prefill is held inside the engine, so it is
     * still running (a donor) when they are admitted, however the threads are scheduled */
    uv_mutex_lock(&h->m.gmu);
    h->m.gate_closed = true;
    uv_mutex_unlock(&h->m.gmu);
    cr_assert_eq(submit(h, &q[0], &res[0]), SRV_SCHED_OK);
    uv_mutex_lock(&h->m.gmu);
    while (!h->m.in_gate) uv_cond_wait(&h->m.gcv, &h->m.gmu);
    uv_mutex_unlock(&h->m.gmu);
    for (int i = 1; i < NR; i++) cr_assert_eq(submit(h, &q[i], &res[i]), SRV_SCHED_OK);
    uv_mutex_lock(&h->m.gmu);
    h->m.gate_closed = false;
    uv_cond_broadcast(&h->m.gcv);
    uv_mutex_unlock(&h->m.gmu);
    hz_run(h, NR);
    srv_sched_stats st;
    srv_sched_get_stats(h->s, &st);
    cr_assert_eq(st.counters.prompt_tokens_computed, (uint64_t)(len + (NR - 1) * (len - common)),
                 "computed %llu prompt tokens", (unsigned long long)st.counters.prompt_tokens_computed);
    cr_assert_geq(st.prefix_hit_tokens, (uint64_t)(NR - 1) * (uint64_t)reused,
                  "reused prefixes count as prefix hits (%llu)", (unsigned long long)st.prefix_hit_tokens);
    int reusing = 0;
    for (int i = 0; i < NR; i++) {
        assert_clean(&res[i]);
        reusing += res[i].usage.cached_tokens == reused;
        result alone;
        run_alone(&q[i], &alone);
        assert_same(&res[i], &alone, "concurrent common prefix");
    }
    cr_assert_eq(reusing, NR - 1);
    hz_free(h);
    free(h);
    free(res);
}

/* A common prefix of whole blocks (64 tokens): the others attach the first request's blocks. */
Test(scheduler, concurrent_same_prefix_prefilled_once) { check_concurrent_prefix(9, 69, 64, 7, 64); }

/* A common prefix ending inside a block (69 tokens): the others copy it from the first request's sequence,
 * partial block included, so only their own 5 tokens are computed. */
Test(scheduler, concurrent_prefix_partial_block_copied) { check_concurrent_prefix(11, 74, 69, 5, 69); }

/* A tiny pool forces preemptions: every request still completes with exactly the output it has alone,
 * nothing is preempted twice without progress, and the cache stays consistent (kvc_check after every
 * forward, positions read back through the block tables). */
static void preemption_round(uint64_t seed, int inject, uint64_t *preemptions) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(32, 8);
    hz_init(h, 4, 28, &p);
    h->m.inject_full_every = inject;
    enum { NR = 8 };
    req_spec *q = calloc(NR, sizeof *q);
    result *res = calloc(NR, sizeof *res);
    uint64_t rng = seed;
    for (int i = 0; i < NR; i++) {
        rand_prompt(&rng, &q[i], 3 + (int32_t)(mix64(rng++) % 30));
        q[i].n = inject ? 1 : 1 + (int32_t)(mix64(rng++) % 2);
        q[i].max_tokens = 8 + (int32_t)(mix64(rng++) % 24);
        q[i].temp = 1.0f;
        q[i].seed = seed * 100 + (uint64_t)i;
        q[i].ignore_eos = (mix64(rng++) % 2) == 0;
        if (mix64(rng++) % 3 == 0) {
            q[i].stop[0] = "op";
            q[i].n_stop = 1;
        }
    }
    for (int i = 0; i < NR; i++) cr_assert_eq(submit(h, &q[i], &res[i]), SRV_SCHED_OK);
    hz_run(h, NR);
    srv_sched_stats st;
    srv_sched_get_stats(h->s, &st);
    for (int i = 0; i < NR; i++) {
        assert_clean(&res[i]);
        cr_assert_neq(res[i].done_finish, SRV_SCHED_FINISH_ERROR, "seed %llu req %d: %s",
                      (unsigned long long)seed, i, res[i].error);
        result alone;
        run_alone(&q[i], &alone);
        char what[64];
        snprintf(what, sizeof what, "seed %llu req %d", (unsigned long long)seed, i);
        assert_same(&res[i], &alone, what);
    }
    cr_assert_eq(st.counters.preemptions_repeated, 0, "seed %llu: thrash", (unsigned long long)seed);
    *preemptions += st.counters.preemptions;
    cr_assert_eq(st.kv_blocks_used, 0);
    hz_free(h);
    free(h);
    free(q);
    free(res);
}

/* How many preemptions a round sees depends on how the burst of submissions interleaves with the first
 * steps, so the check that the pool really filled up is over all rounds. */
Test(scheduler, preemption_tiny_pool_matches_alone) {
    uint64_t pre = 0;
    for (uint64_t seed = 1; seed <= 12; seed++) preemption_round(seed, 0, &pre);
    cr_assert_gt(pre, 0, "the pool never filled up");
}

Test(scheduler, engine_kv_full_is_retried) {
    uint64_t pre = 0;
    for (uint64_t seed = 20; seed <= 23; seed++) preemption_round(seed, 3, &pre);
    cr_assert_gt(pre, 0);
}

/* A prompt larger than the whole pool ends with an error; the next request is served normally. */
Test(scheduler, prompt_does_not_fit) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(32, 4);
    hz_init(h, 4, 4, &p);
    req_spec big, small;
    memset(&big, 0, sizeof big);
    uint64_t rng = 1;
    rand_prompt(&rng, &big, 30);
    big.n = 1;
    big.max_tokens = 3;
    small = big;
    small.n_prompt = 5;
    result *rb = calloc(1, sizeof *rb), *rs = calloc(1, sizeof *rs);
    cr_assert_eq(submit(h, &big, rb), SRV_SCHED_OK);
    cr_assert_eq(submit(h, &small, rs), SRV_SCHED_OK);
    hz_run(h, 2);
    assert_clean(rb);
    assert_clean(rs);
    cr_assert_eq(rb->done_finish, SRV_SCHED_FINISH_ERROR);
    cr_assert_str_eq(rb->error, "prompt does not fit in the KV cache");
    cr_assert_neq(rs->done_finish, SRV_SCHED_FINISH_ERROR);
    cr_assert_gt(rs->n_toks[0] + (rs->finish[0] == SRV_SCHED_FINISH_STOP), 0);
    /* generation that outgrows the whole pool (16 tokens) ends with "length" once the pool is full: the
     * cache holds 16 tokens, plus the one sampled last that no longer fits */
    req_spec grow = small;
    grow.n_prompt = 6;
    grow.max_tokens = 1000;
    grow.ignore_eos = true;
    result *rg = calloc(1, sizeof *rg);
    cr_assert_eq(submit(h, &grow, rg), SRV_SCHED_OK);
    hz_run(h, 3);
    assert_clean(rg);
    cr_assert_eq(rg->done_finish, SRV_SCHED_FINISH_LENGTH);
    cr_assert_eq(rg->n_toks[0], 16 + 1 - 6, "%d tokens", rg->n_toks[0]);
    /* and says so: the choice end is marked truncated and counted, unlike an end by max_tokens */
    cr_assert(rg->truncated[0]);
    cr_assert(!rs->truncated[0]);
    srv_sched_stats st;
    srv_sched_get_stats(h->s, &st);
    cr_assert_eq(st.counters.choices_truncated, 1);
    /* an end by max_tokens is not a truncation */
    req_spec edge = grow;
    edge.max_tokens = 3;
    result *re = calloc(1, sizeof *re);
    cr_assert_eq(submit(h, &edge, re), SRV_SCHED_OK);
    hz_run(h, 4);
    assert_clean(re);
    cr_assert_eq(re->finish[0], SRV_SCHED_FINISH_LENGTH);
    cr_assert(!re->truncated[0]);
    srv_sched_get_stats(h->s, &st);
    cr_assert_eq(st.counters.choices_truncated, 1);
    free(re);
    free(rg);
    hz_free(h);
    free(h);
    free(rb);
    free(rs);
}

/* Cancelling a running request frees its blocks within one step, delivers no DELTA afterwards, and ends its
 * choices as cancelled. */
Test(scheduler, cancel_running_frees_within_one_step) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(32, 2);
    hz_init(h, 4, 256, &p);
    h->m.record_times = true;
    h->m.close_at = 12; /* the engine waits there until the test has cancelled: the pool cannot run out */
    req_spec a;
    memset(&a, 0, sizeof a);
    uint64_t rng = 2;
    rand_prompt(&rng, &a, 20);
    a.n = 2;
    a.max_tokens = 100000;
    a.ignore_eos = true;
    a.temp = 1.0f;
    result *ra = calloc(1, sizeof *ra);
    cr_assert_eq(submit(h, &a, ra), SRV_SCHED_OK);
    ra->cancel_after_tokens = 5;
    hz_run(h, 1);
    assert_clean(ra);
    cr_assert_eq(ra->done_finish, SRV_SCHED_FINISH_CANCELLED);
    cr_assert_eq(ra->finish[0], SRV_SCHED_FINISH_CANCELLED);
    cr_assert_eq(ra->finish[1], SRV_SCHED_FINISH_CANCELLED);
    cr_assert_eq(ra->deltas_after_cancel, 0);
    /* decode calls that started between the cancel and the moment the scheduler produced DONE: at most the
     * one that may have been under way */
    int started = 0;
    for (int32_t i = 0; i < h->m.n_times; i++)
        if (h->m.times[i] > ra->t_cancel && h->m.times[i] <= ra->t_done_ev) started++;
    cr_assert_leq(started, 1, "%d decodes started after the cancel", started);
    cr_assert_eq(ra->kv_used_at_done, 0, "blocks still used after the cancelled request ended");
    cr_assert_eq(srv_sched_cancel(h->s, ra->id), SRV_SCHED_ERR_NOT_FOUND);
    kvc_stats ks;
    kvc_get_stats(h->m.cache, &ks);
    cr_assert_eq(ks.seqs_live, 0);
    hz_free(h);
    free(h);
    free(ra);
}

/* Cancelling a waiting request ends it without running it; the running one is unaffected. */
Test(scheduler, cancel_waiting) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(32, 1);
    hz_init(h, 4, 256, &p);
    req_spec a;
    memset(&a, 0, sizeof a);
    uint64_t rng = 12;
    rand_prompt(&rng, &a, 20);
    a.n = 1;
    a.max_tokens = 6;
    a.ignore_eos = true;
    result *ra = calloc(1, sizeof *ra), *rb = calloc(1, sizeof *rb);
    cr_assert_eq(submit(h, &a, ra), SRV_SCHED_OK);
    cr_assert_eq(submit(h, &a, rb), SRV_SCHED_OK);
    cr_assert_eq(srv_sched_cancel(h->s, rb->id), SRV_SCHED_OK);
    rb->cancel_called = true;
    hz_run(h, 2);
    assert_clean(ra);
    assert_clean(rb);
    cr_assert_eq(rb->done_finish, SRV_SCHED_FINISH_CANCELLED);
    cr_assert_eq(rb->n_toks[0], 0);
    cr_assert_eq(rb->deltas_after_cancel, 0);
    cr_assert_eq(ra->done_finish, SRV_SCHED_FINISH_LENGTH);
    cr_assert_eq(ra->n_toks[0], 6);
    hz_free(h);
    free(h);
    free(ra);
    free(rb);
}

/* Holds the mock engine inside its next decode (after the caller's next submit) until gate_open. */
static void gate_close(harness *h) {
    uv_mutex_lock(&h->m.gmu);
    h->m.gate_closed = true;
    uv_mutex_unlock(&h->m.gmu);
}
static void gate_wait_inside(harness *h) {
    uv_mutex_lock(&h->m.gmu);
    while (!h->m.in_gate) uv_cond_wait(&h->m.gcv, &h->m.gmu);
    uv_mutex_unlock(&h->m.gmu);
}
static void gate_open(harness *h) {
    uv_mutex_lock(&h->m.gmu);
    h->m.gate_closed = false;
    uv_cond_broadcast(&h->m.gcv);
    uv_mutex_unlock(&h->m.gmu);
}

/* The waiting queue is bounded: submit answers QUEUE_FULL beyond max_queue (the engine is held in a decode
 * so that nothing moves meanwhile). */
Test(scheduler, queue_full) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(32, 1);
    p.max_queue = 2;
    hz_init(h, 4, 256, &p);
    req_spec a;
    memset(&a, 0, sizeof a);
    uint64_t rng = 4;
    rand_prompt(&rng, &a, 8);
    a.n = 1;
    a.max_tokens = 3;
    a.ignore_eos = true;
    result *res = calloc(4, sizeof *res);
    gate_close(h);
    cr_assert_eq(submit(h, &a, &res[0]), SRV_SCHED_OK);
    gate_wait_inside(h); /* res[0] admitted, engine busy */
    cr_assert_eq(submit(h, &a, &res[1]), SRV_SCHED_OK);
    cr_assert_eq(submit(h, &a, &res[2]), SRV_SCHED_OK);
    result extra;
    cr_assert_eq(submit(h, &a, &extra), SRV_SCHED_ERR_QUEUE_FULL);
    srv_sched_stats st;
    srv_sched_get_stats(h->s, &st);
    cr_assert_eq(st.requests_rejected, 1);
    gate_open(h);
    hz_run(h, 3);
    for (int i = 0; i < 3; i++) {
        assert_clean(&res[i]);
        cr_assert_eq(res[i].n_toks[0], 3);
        cr_assert_eq(res[i].done_seq, i);
    }
    /* room again */
    cr_assert_eq(submit(h, &a, &res[3]), SRV_SCHED_OK);
    hz_run(h, 4);
    assert_clean(&res[3]);
    hz_free(h);
    free(h);
    free(res);
}

/* Stop strings cut the text exactly where the request alone without stop strings first shows them. */
Test(scheduler, stop_strings_and_eog) {
    for (uint64_t seed = 1; seed <= 20; seed++) {
        req_spec q;
        memset(&q, 0, sizeof q);
        uint64_t rng = seed * 31;
        rand_prompt(&rng, &q, 6);
        q.n = 1;
        q.max_tokens = 60;
        q.temp = 1.0f;
        q.seed = seed;
        result *plain = calloc(1, sizeof *plain), *stopped = calloc(1, sizeof *stopped);
        run_alone(&q, plain);
        req_spec qs = q;
        qs.stop[0] = "ab";
        qs.stop[1] = "\n";
        qs.n_stop = 2;
        run_alone(&qs, stopped);
        size_t cut = plain->text_len[0];
        int32_t which = 0;
        for (size_t i = 0; i < plain->text_len[0]; i++)
            if (plain->text[0][i] == '\n' ||
                (i + 1 < plain->text_len[0] && plain->text[0][i] == 'a' && plain->text[0][i + 1] == 'b')) {
                cut = i;
                which = plain->text[0][i] == '\n' ? 2 : 1;
                break;
            }
        cr_assert_eq(stopped->text_len[0], cut, "seed %llu", (unsigned long long)seed);
        cr_assert(memcmp(stopped->text[0], plain->text[0], cut) == 0);
        if (cut < plain->text_len[0]) cr_assert_eq(stopped->finish[0], SRV_SCHED_FINISH_STOP);
        else cr_assert_eq(stopped->finish[0], plain->finish[0]);
        cr_assert_eq(stopped->stop_match[0], which, "seed %llu: the stop string that matched",
                     (unsigned long long)seed);
        cr_assert_eq(plain->stop_match[0], 0);
        /* without ignore_eos an EOG ends with "stop"; the EOG token is not in the samples */
        if (plain->finish[0] == SRV_SCHED_FINISH_STOP) {
            cr_assert_eq(plain->usage.completion_tokens, plain->n_toks[0] + 1);
            for (int32_t i = 0; i < plain->n_toks[0]; i++) cr_assert_neq(plain->toks[0][i], 0);
        }
        free(plain);
        free(stopped);
    }
}

/* ignore_eos bans the EOG token even where the model prefers it. */
Test(scheduler, ignore_eos_bans_eog) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(32, 4);
    hz_init(h, 8, 256, &p);
    h->m.eog_logit = 6.0f; /* EOG very likely */
    req_spec q;
    memset(&q, 0, sizeof q);
    uint64_t rng = 8;
    rand_prompt(&rng, &q, 10);
    q.n = 2;
    q.max_tokens = 30;
    q.temp = 1.0f;
    q.ignore_eos = true;
    q.top = 5;
    result *r = calloc(1, sizeof *r), *r2 = calloc(1, sizeof *r2);
    cr_assert_eq(submit(h, &q, r), SRV_SCHED_OK);
    q.ignore_eos = false;
    cr_assert_eq(submit(h, &q, r2), SRV_SCHED_OK);
    hz_run(h, 2);
    for (int c = 0; c < 2; c++) {
        cr_assert_eq(r->n_toks[c], 30);
        cr_assert_eq(r->finish[c], SRV_SCHED_FINISH_LENGTH);
        for (int32_t i = 0; i < 30; i++) cr_assert_neq(r->toks[c][i], 0);
        cr_assert_eq(r2->finish[c], SRV_SCHED_FINISH_STOP);
        cr_assert_lt(r2->n_toks[c], 30);
    }
    hz_free(h);
    free(h);
    free(r);
    free(r2);
}

/* Argument checks and freeing with requests in flight (they end as cancelled inside srv_sched_free). */
Test(scheduler, errors_and_free_with_requests) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(16, 2);
    p.n_ctx = 40;
    hz_init(h, 4, 1024, &p);
    req_spec q;
    memset(&q, 0, sizeof q);
    uint64_t rng = 6;
    rand_prompt(&rng, &q, 10);
    q.n = 1;
    q.max_tokens = 0; /* until n_ctx */
    q.ignore_eos = true;
    result *r = calloc(4, sizeof *r);
    req_spec bad = q;
    bad.n = 3; /* > parallel */
    cr_assert_eq(submit(h, &bad, &r[0]), SRV_SCHED_ERR_INVALID);
    bad = q;
    bad.prompt[0] = NV;
    cr_assert_eq(submit(h, &bad, &r[0]), SRV_SCHED_ERR_INVALID);
    bad = q;
    bad.n_prompt = 40;
    cr_assert_eq(submit(h, &bad, &r[0]), SRV_SCHED_ERR_TOO_LONG);
    cr_assert_eq(submit(h, &q, &r[0]), SRV_SCHED_OK);
    hz_run(h, 1);
    cr_assert_eq(r[0].finish[0], SRV_SCHED_FINISH_LENGTH);
    cr_assert_eq(r[0].n_toks[0], 30, "n_ctx 40 - prompt 10 = 30 tokens, got %d", r[0].n_toks[0]);
    q.max_tokens = 100000;
    q.n_prompt = 5;
    srv_sched_free(h->s);
    srv_sched_params p2 = params(16, 2);
    srv_engine_ops ops = mock_ops(&h->m);
    cr_assert_eq(srv_sched_create(&p2, &ops, &h->loop, &h->s), SRV_SCHED_OK);
    cr_assert_eq(submit(h, &q, &r[1]), SRV_SCHED_OK);
    cr_assert_eq(submit(h, &q, &r[2]), SRV_SCHED_OK);
    cr_assert_eq(submit(h, &q, &r[3]), SRV_SCHED_OK);
    while (r[1].n_toks[0] < 3) uv_run(&h->loop, UV_RUN_ONCE);
    srv_sched_free(h->s);
    h->s = NULL;
    for (int i = 1; i < 4; i++) assert_clean(&r[i]);
    /* every request got its DONE inside srv_sched_free: cancelled, or "length" if the pool ran out first
     * (the scheduler runs freely until free stops it, so which one is not deterministic) */
    for (int i = 1; i < 4; i++)
        cr_assert(r[i].done_finish == SRV_SCHED_FINISH_CANCELLED || r[i].done_finish == SRV_SCHED_FINISH_LENGTH);
    kvc_stats ks;
    kvc_get_stats(h->m.cache, &ks);
    cr_assert_eq(ks.blocks_used, 0);
    cr_assert_eq(ks.seqs_live, 0);
    hz_free(h);
    free(h);
    free(r);
    srv_sched_free(NULL);
    cr_assert_str_eq(srv_sched_finish_name(SRV_SCHED_FINISH_LENGTH), "length");
}

/* Randomized mix: shared prefixes, n up to 3, stop strings, ignore_eos, greedy and sampled, a pool small
 * enough to preempt, random cancellations, half of the requests submitted from inside DONE callbacks.
 * Uncancelled requests must equal their run alone; cancelled ones must have emitted a prefix of it. */
Test(scheduler, randomized_mix_with_cancels) {
    uint64_t preempts = 0, hits = 0;
    int cancelled = 0;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        harness *h = malloc(sizeof *h);
        srv_sched_params p = params(24, 8);
        hz_init(h, 4, 48, &p);
        enum { NR = 24, FIRST = 12 };
        req_spec *q = calloc(NR, sizeof *q);
        result *res = calloc(NR, sizeof *res);
        int cancel_at[NR];
        uint64_t rng = seed * 1000;
        req_spec bases[3];
        for (int b = 0; b < 3; b++) rand_prompt(&rng, &bases[b], 12 + 9 * b);
        for (int i = 0; i < NR; i++) {
            const req_spec *b = &bases[mix64(rng++) % 3];
            memcpy(q[i].prompt, b->prompt, (size_t)b->n_prompt * sizeof(int32_t));
            int32_t extra = 1 + (int32_t)(mix64(rng++) % 10);
            for (int32_t k = 0; k < extra; k++) q[i].prompt[b->n_prompt + k] = 1 + (int32_t)(mix64(rng++) % 15);
            q[i].n_prompt = b->n_prompt + extra;
            q[i].n = 1 + (int32_t)(mix64(rng++) % 3);
            q[i].max_tokens = 5 + (int32_t)(mix64(rng++) % 26);
            q[i].temp = mix64(rng++) % 4 == 0 ? 0.0f : 1.0f;
            q[i].seed = seed * 7919 + (uint64_t)i;
            q[i].ignore_eos = mix64(rng++) % 2;
            q[i].top = (int32_t)(mix64(rng++) % 3);
            if (mix64(rng++) % 3 == 0) {
                q[i].stop[0] = "st";
                q[i].stop[1] = "a";
                q[i].n_stop = 2;
            }
            cancel_at[i] = mix64(rng++) % 4 == 0 ? 1 + (int)(mix64(rng++) % 6) : 0;
        }
        h->chain = q;
        h->chain_res = res;
        h->chain_next = FIRST;
        h->chain_n = NR;
        h->chain_cancel = cancel_at;
        uv_check_t check;
        uv_check_init(&h->loop, &check);
        check.data = &h->m;
        uv_check_start(&check, on_check);
        h->m.lockstep = true;
        for (int i = 0; i < FIRST; i++) {
            cr_assert_eq(submit(h, &q[i], &res[i]), SRV_SCHED_OK);
            res[i].cancel_after_tokens = cancel_at[i];
        }
        hz_run(h, NR);
        uv_close((uv_handle_t *)&check, NULL);
        srv_sched_stats st;
        srv_sched_get_stats(h->s, &st);
        cr_assert_eq(st.counters.preemptions_repeated, 0, "seed %llu", (unsigned long long)seed);
        cr_assert_eq(st.kv_blocks_used, 0);
        cr_assert_eq(st.requests_running + st.requests_waiting, 0);
        preempts += st.counters.preemptions;
        hits += st.prefix_hit_tokens;
        for (int i = 0; i < NR; i++) {
            assert_clean(&res[i]);
            result alone;
            run_alone(&q[i], &alone);
            char what[64];
            snprintf(what, sizeof what, "seed %llu req %d", (unsigned long long)seed, i);
            cr_assert_neq(res[i].done_finish, SRV_SCHED_FINISH_ERROR, "%s: %s", what, res[i].error);
            if (!res[i].cancel_called) {
                assert_same(&res[i], &alone, what);
                continue;
            }
            cancelled++;
            cr_assert_eq(res[i].deltas_after_cancel, 0, "%s", what);
            for (int32_t c = 0; c < q[i].n; c++) {
                cr_assert_leq(res[i].n_toks[c], alone.n_toks[c], "%s", what);
                cr_assert(memcmp(res[i].toks[c], alone.toks[c], (size_t)res[i].n_toks[c] * sizeof(int32_t)) == 0,
                          "%s: choice %d", what, c);
                cr_assert(res[i].text_len[c] <= alone.text_len[c] &&
                          memcmp(res[i].text[c], alone.text[c], res[i].text_len[c]) == 0, "%s: choice %d", what, c);
            }
        }
        hz_free(h);
        free(h);
        free(q);
        free(res);
    }
    /* the mix exercised what it is meant to */
    cr_assert_gt(preempts, 0);
    cr_assert_gt(hits, 0);
    cr_assert_gt(cancelled, 0);
}

/* An engine failure ends the requests of that batch with an error; the scheduler keeps serving. */
Test(scheduler, engine_error_fails_batch) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(64, 4);
    hz_init(h, 8, 256, &p);
    h->m.fail_at = 3;
    req_spec q;
    memset(&q, 0, sizeof q);
    uint64_t rng = 77;
    rand_prompt(&rng, &q, 12);
    q.n = 1;
    q.max_tokens = 10;
    q.ignore_eos = true;
    result *r = calloc(2, sizeof *r);
    cr_assert_eq(submit(h, &q, &r[0]), SRV_SCHED_OK);
    hz_run(h, 1);
    assert_clean(&r[0]);
    cr_assert_eq(r[0].done_finish, SRV_SCHED_FINISH_ERROR);
    cr_assert_str_eq(r[0].error, "engine: device error");
    cr_assert_eq(r[0].n_toks[0], 2, "tokens from the two decodes before the failure");
    cr_assert_eq(submit(h, &q, &r[1]), SRV_SCHED_OK);
    hz_run(h, 2);
    assert_clean(&r[1]);
    cr_assert_eq(r[1].done_finish, SRV_SCHED_FINISH_LENGTH);
    cr_assert_eq(r[1].n_toks[0], 10);
    cr_assert(memcmp(r[1].toks[0], r[0].toks[0], 2 * sizeof(int32_t)) == 0);
    hz_free(h);
    free(h);
    free(r);
}

/* ---- constrained decoding (srv_sched_request.grammar) ---------------------------------------------------- */
/* The mock's vocabulary for grammar/: 0 is EOG, 1..15 the prompt tokens (special: never allowed), 16..31 the
 * PIECES. */
static gmr_vocab *mock_vocab(int32_t n_vocab) {
    const char *pieces[NV + 1];
    size_t lens[NV + 1];
    uint8_t flags[NV + 1];
    for (int32_t t = 0; t < n_vocab; t++) {
        pieces[t] = t < NV ? piece_of(t) : "x";
        lens[t] = strlen(pieces[t]);
        flags[t] = t == 0 ? GMR_TOKEN_EOG : (t < GEN0 ? GMR_TOKEN_SPECIAL : 0);
    }
    gmr_vocab *v = NULL;
    cr_assert_eq(gmr_vocab_create(pieces, lens, flags, n_vocab, &v), KVS_OK);
    return v;
}

/* Whether text is a complete value of the template's grammar (a fresh clone reads it as bytes). */
static bool text_matches(const gmr_matcher *tmpl, const char *text, size_t len) {
    gmr_matcher *m = NULL;
    cr_assert_eq(gmr_matcher_clone(tmpl, &m), KVS_OK);
    bool ok = gmr_matcher_accept_bytes(m, text, len) == KVS_OK && gmr_matcher_is_complete(m);
    gmr_matcher_free(m);
    return ok;
}

/* Random constrained requests at temperature 1 in a pool small enough to preempt: every choice is a complete
 * value of its grammar, ends with "stop", and equals the same request run alone (preemption keeps the
 * matcher in step with the tokens). Grammar A ends after "." or "!" (nothing may follow: stop without an EOG);
 * in grammar B an EOG is allowed once "x" is there, banned when ignore_eos is set. */
Test(scheduler, grammar_constrains_every_choice_through_preemption) {
    gmr_vocab *v = mock_vocab(NV);
    const char *bnf[2] = {"root ::= \"x\" (\"y\" | \"ab\" | \" \" | \"st\" | \"op\"){0,10} (\".\" | \"!\")",
                          "root ::= \"x\" (\"y\" | \"ab\"){0,6}"};
    gmr_grammar *g[2];
    gmr_matcher *tm[2];
    char err[256];
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(gmr_compile_bnf(bnf[k], NULL, 0, &g[k], err, sizeof err), KVS_OK, "%s", err);
        cr_assert_eq(gmr_matcher_create(g[k], v, 0, &tm[k]), KVS_OK);
    }
    uint64_t pre = 0, eog_ends = 0, grammar_ends = 0;
    for (uint64_t seed = 1; seed <= 8; seed++) {
        harness *h = malloc(sizeof *h);
        srv_sched_params p = params(32, 8);
        hz_init(h, 4, 24, &p);
        enum { NR = 8 };
        req_spec *q = calloc(NR, sizeof *q);
        result *res = calloc(NR, sizeof *res);
        uint64_t rng = seed * 7;
        for (int i = 0; i < NR; i++) {
            rand_prompt(&rng, &q[i], 3 + (int32_t)(mix64(rng++) % 30));
            q[i].n = 1 + (int32_t)(mix64(rng++) % 2);
            q[i].max_tokens = 40;
            q[i].temp = 1.0f;
            q[i].seed = seed * 100 + (uint64_t)i;
            q[i].ignore_eos = (mix64(rng++) % 3) == 0;
            q[i].grammar = tm[i % 2];
        }
        for (int i = 0; i < NR; i++) cr_assert_eq(submit(h, &q[i], &res[i]), SRV_SCHED_OK);
        hz_run(h, NR);
        srv_sched_stats st;
        srv_sched_get_stats(h->s, &st);
        pre += st.counters.preemptions;
        for (int i = 0; i < NR; i++) {
            assert_clean(&res[i]);
            for (int32_t c = 0; c < q[i].n; c++) {
                cr_assert_eq(res[i].finish[c], SRV_SCHED_FINISH_STOP, "seed %llu req %d choice %d: finish %d %s",
                             (unsigned long long)seed, i, c, res[i].finish[c], res[i].error);
                cr_assert(text_matches(q[i].grammar, res[i].text[c], res[i].text_len[c]),
                          "seed %llu req %d choice %d: '%.*s' is not in the grammar", (unsigned long long)seed, i,
                          c, (int)res[i].text_len[c], res[i].text[c]);
                for (int32_t k = 0; k < res[i].n_toks[c]; k++) cr_assert_geq(res[i].toks[c][k], GEN0);
            }
            /* usage counts an EOG that ended a choice, the samples do not: grammar A never needs one */
            int32_t reported = 0;
            for (int32_t c = 0; c < q[i].n; c++) reported += res[i].n_toks[c];
            if (i % 2 == 0) {
                cr_assert_eq(res[i].usage.completion_tokens, reported, "grammar A sampled an EOG");
                grammar_ends++;
            } else {
                eog_ends += res[i].usage.completion_tokens > reported;
            }
            result alone;
            run_alone(&q[i], &alone);
            char what[64];
            snprintf(what, sizeof what, "grammar seed %llu req %d", (unsigned long long)seed, i);
            assert_same(&res[i], &alone, what);
        }
        cr_assert_eq(st.kv_blocks_used, 0);
        hz_free(h);
        free(h);
        free(q);
        free(res);
    }
    cr_assert_gt(pre, 0, "the pool never filled up");
    cr_assert_gt(eog_ends, 0, "grammar B never ended with an EOG");
    cr_assert_gt(grammar_ends, 0);
    for (int k = 0; k < 2; k++) {
        gmr_matcher_free(tm[k]);
        gmr_grammar_free(g[k]);
    }
    gmr_vocab_free(v);
}

/* A grammar over another vocabulary size is refused at submit; nothing is called back. */
Test(scheduler, grammar_vocab_mismatch_is_invalid) {
    gmr_vocab *v = mock_vocab(NV - 1);
    gmr_grammar *g = NULL;
    gmr_matcher *tm = NULL;
    char err[128];
    cr_assert_eq(gmr_compile_bnf("root ::= \"x\"", NULL, 0, &g, err, sizeof err), KVS_OK);
    cr_assert_eq(gmr_matcher_create(g, v, 0, &tm), KVS_OK);
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(32, 4);
    hz_init(h, 4, 64, &p);
    req_spec q;
    memset(&q, 0, sizeof q);
    uint64_t rng = 3;
    rand_prompt(&rng, &q, 4);
    q.n = 1;
    q.max_tokens = 4;
    q.grammar = tm;
    result r;
    cr_assert_eq(submit(h, &q, &r), SRV_SCHED_ERR_INVALID);
    hz_free(h);
    free(h);
    gmr_matcher_free(tm);
    gmr_grammar_free(g);
    gmr_vocab_free(v);
}

/* max_queued_tokens bounds the prompt tokens waiting for admission: a submit that would pass it is refused with
 * QUEUE_FULL (the API answers 429), except into an empty queue; admission gives the tokens back. */
Test(scheduler, queued_tokens_limit) {
    harness *h = malloc(sizeof *h);
    srv_sched_params p = params(32, 1);
    p.max_queue = 100;
    p.max_queued_tokens = 20;
    hz_init(h, 4, 256, &p);
    req_spec small, big;
    memset(&small, 0, sizeof small);
    memset(&big, 0, sizeof big);
    uint64_t rng = 9;
    rand_prompt(&rng, &small, 8);
    rand_prompt(&rng, &big, 30);
    small.n = big.n = 1;
    small.max_tokens = big.max_tokens = 2;
    small.ignore_eos = big.ignore_eos = true;
    result *res = calloc(6, sizeof *res);
    gate_close(h);
    cr_assert_eq(submit(h, &small, &res[0]), SRV_SCHED_OK);
    gate_wait_inside(h); /* res[0] admitted, engine busy */
    cr_assert_eq(submit(h, &big, &res[1]), SRV_SCHED_OK, "30 tokens into an empty queue: accepted");
    result extra;
    cr_assert_eq(submit(h, &small, &extra), SRV_SCHED_ERR_QUEUE_FULL, "30 + 8 > 20");
    srv_sched_stats st;
    srv_sched_get_stats(h->s, &st);
    cr_assert_eq(st.requests_rejected_tokens, 1);
    cr_assert_eq(st.requests_rejected, 0);
    cr_assert_eq(st.queued_tokens, 30);
    gate_open(h);
    hz_run(h, 2);
    srv_sched_get_stats(h->s, &st);
    cr_assert_eq(st.queued_tokens, 0, "admitted requests give their tokens back");
    /* now two small ones fit (8 + 8 <= 20) behind a held engine, a third does not */
    gate_close(h);
    cr_assert_eq(submit(h, &small, &res[2]), SRV_SCHED_OK);
    gate_wait_inside(h);
    cr_assert_eq(submit(h, &small, &res[3]), SRV_SCHED_OK);
    cr_assert_eq(submit(h, &small, &res[4]), SRV_SCHED_OK);
    cr_assert_eq(submit(h, &small, &extra), SRV_SCHED_ERR_QUEUE_FULL);
    gate_open(h);
    hz_run(h, 5);
    for (int i = 0; i < 5; i++) {
        assert_clean(&res[i]);
        cr_assert_eq(res[i].n_toks[0], 2);
    }
    srv_sched_get_stats(h->s, &st);
    cr_assert_eq(st.requests_rejected_tokens, 2);
    cr_assert_eq(st.queued_tokens, 0);
    hz_free(h);
    free(h);
    free(res);
}

/* ---- scheduling policy (fcfs | priority) ----------------------------------------------------------------------- */
/* The scheduler's moves between its queues, as the trace observer reports them (scheduler thread), replayed
 * afterwards against a model of the two queues. */
typedef struct trace_log {
    uv_mutex_t mu;
    srv_sched_trace *t;
    int32_t n, cap;
    bool oom;
} trace_log;

static void on_trace(void *ctx, const srv_sched_trace *t) {
    trace_log *l = ctx;
    uv_mutex_lock(&l->mu);
    if (l->n == l->cap) {
        int32_t cap = l->cap ? l->cap * 2 : 256;
        srv_sched_trace *v = realloc(l->t, (size_t)cap * sizeof *v);
        if (!v) l->oom = true;
        else { l->t = v; l->cap = cap; }
    }
    if (l->n < l->cap) l->t[l->n++] = *t;
    uv_mutex_unlock(&l->mu);
}

static trace_log *trace_log_new(void) {
    trace_log *l = calloc(1, sizeof *l);
    cr_assert(l);
    uv_mutex_init(&l->mu);
    return l;
}

static void trace_log_free(trace_log *l) {
    uv_mutex_destroy(&l->mu);
    free(l->t);
    free(l);
}

enum { Q_NONE = 0, Q_WAITING, Q_RUNNING, Q_ENDED };

typedef struct replay_stats {
    int32_t preemptions;      /* PREEMPTED moves */
    int32_t by_priority;      /* preemptions where a later-arrived, more urgent request kept running */
    int32_t urgent_first;     /* admissions of a request that arrived after another still waiting one */
    int32_t repeated;         /* preemptions of a request that had not progressed since its previous one */
} replay_stats;

/* Replays the trace of requests with ids 1..n (arrival order; prio[id - 1] their priorities) and checks every
 * move against the policy: an admission takes the first waiting request by (priority, arrival); a preemption
 * takes a running request of the largest priority value, passing over only later arrivals of that priority that
 * were preempted before (not yet progressed, hence protected), and the latest of them when it is a repeated
 * one; never a request running alone. Under fcfs, first admissions come in arrival order (no request is
 * overtaken, so none starves). Every request ends. */
static replay_stats replay_trace(const trace_log *l, const int32_t *prio, int32_t n, bool fcfs, const char *what) {
    replay_stats rs = {0, 0, 0, 0};
    int *state = calloc((size_t)n + 1, sizeof *state), *preempted = calloc((size_t)n + 1, sizeof *preempted);
    cr_assert(state && preempted && !l->oom);
    int32_t last_first_admit = 0;
    bool *admitted = calloc((size_t)n + 1, sizeof *admitted);
    cr_assert(admitted);
    for (int32_t k = 0; k < l->n; k++) {
        const srv_sched_trace *t = &l->t[k];
        cr_assert(t->id >= 1 && t->id <= (uint64_t)n, "%s: move %d: unknown id %llu", what, k,
                  (unsigned long long)t->id);
        int32_t id = (int32_t)t->id;
        cr_assert_eq(t->priority, prio[id - 1], "%s: move %d: priority of %d", what, k, id);
        switch (t->kind) {
        case SRV_SCHED_TRACE_QUEUED:
            cr_assert_eq(state[id], Q_NONE, "%s: move %d: %d queued twice", what, k, id);
            state[id] = Q_WAITING;
            break;
        case SRV_SCHED_TRACE_ADMITTED: {
            cr_assert_eq(state[id], Q_WAITING, "%s: move %d: %d admitted but not waiting", what, k, id);
            for (int32_t j = 1; j <= n; j++) {
                if (state[j] != Q_WAITING || j == id) continue;
                bool before = prio[j - 1] < prio[id - 1] || (prio[j - 1] == prio[id - 1] && j < id);
                cr_assert(!before, "%s: move %d: admitted %d (priority %d) while %d (priority %d) waits ahead of it",
                          what, k, id, prio[id - 1], j, prio[j - 1]);
                if (j < id) rs.urgent_first++;
            }
            if (!admitted[id]) {
                if (fcfs) cr_assert_gt(id, last_first_admit, "%s: fcfs: %d first admitted after %d", what, id,
                                       last_first_admit);
                if (id > last_first_admit) last_first_admit = id;
                admitted[id] = true;
            }
            state[id] = Q_RUNNING;
            break;
        }
        case SRV_SCHED_TRACE_PREEMPTED: {
            cr_assert_eq(state[id], Q_RUNNING, "%s: move %d: %d preempted but not running", what, k, id);
            int32_t n_run = 0, maxp = INT32_MIN;
            bool overtook = false; /* a later arrival, more urgent, kept running */
            for (int32_t j = 1; j <= n; j++) {
                if (state[j] != Q_RUNNING) continue;
                n_run++;
                if (prio[j - 1] > maxp) maxp = prio[j - 1];
                if (j > id && prio[j - 1] < prio[id - 1]) overtook = true;
            }
            cr_assert_geq(n_run, 2, "%s: move %d: the only running request was preempted", what, k);
            cr_assert_eq(prio[id - 1], maxp, "%s: move %d: preempted %d (priority %d) while a running request has "
                         "priority %d", what, k, id, prio[id - 1], maxp);
            for (int32_t j = id + 1; j <= n; j++) {
                if (state[j] != Q_RUNNING || prio[j - 1] != maxp) continue;
                cr_assert(!t->repeated, "%s: move %d: repeated preemption of %d, not of the latest %d", what, k, id, j);
                cr_assert_gt(preempted[j], 0, "%s: move %d: preempted %d, but the later %d of the same priority has "
                             "never been preempted (it cannot be protected)", what, k, id, j);
            }
            rs.preemptions++;
            if (overtook) rs.by_priority++;
            preempted[id]++;
            state[id] = Q_WAITING;
            break;
        }
        case SRV_SCHED_TRACE_ENDED:
            cr_assert(state[id] == Q_WAITING || state[id] == Q_RUNNING, "%s: move %d: %d ended twice or unqueued",
                      what, k, id);
            state[id] = Q_ENDED;
            break;
        default: cr_assert_fail("%s: move %d: kind %d", what, k, (int)t->kind);
        }
    }
    for (int32_t j = 1; j <= n; j++) cr_assert_eq(state[j], Q_ENDED, "%s: request %d never ended", what, j);
    free(state);
    free(preempted);
    free(admitted);
    return rs;
}

/* Randomized arrivals (a first burst, then one more from inside every DONE callback), random priorities and a
 * tiny pool, under both policies: every move between the queues follows the policy (replay_trace), every request
 * completes with exactly the output it has alone (preemption and recomputation change nothing), and nothing is
 * left in the pool. */
static replay_stats priority_round(uint64_t seed, srv_sched_policy policy, int32_t n_prio) {
    harness *h = malloc(sizeof *h);
    trace_log *log = trace_log_new();
    cr_assert(h);
    uint64_t rng = seed * 7777 + (uint64_t)policy;
    /* small step budgets too: a recomputing request then takes several steps, during which the pool may fill up
     * again (the protected case of the victim rule) */
    srv_sched_params p = params(seed % 2 ? 4 + (int32_t)(mix64(rng++) % 8) : 16 + (int32_t)(mix64(rng++) % 24), 8);
    p.policy = policy;
    p.on_trace = on_trace;
    p.on_trace_ctx = log;
    hz_init(h, 4, 24 + (int32_t)(mix64(rng++) % 12), &p);
    /* every third round the engine also reports a full pool every third batch of several sequences: preemptions
     * then also hit requests that are still recomputing (protected), which the victim rule must handle */
    bool inject = seed % 3 == 0;
    if (inject) h->m.inject_full_every = 3;
    enum { NR = 20, FIRST = 8 };
    req_spec *q = calloc(NR, sizeof *q);
    result *res = calloc(NR, sizeof *res);
    int32_t prio[NR];
    int cancel_at[NR];
    for (int i = 0; i < NR; i++) {
        rand_prompt(&rng, &q[i], 3 + (int32_t)(mix64(rng++) % 28));
        q[i].n = inject ? 1 : 1 + (int32_t)(mix64(rng++) % 2);
        q[i].max_tokens = 6 + (int32_t)(mix64(rng++) % 22);
        q[i].temp = mix64(rng++) % 3 == 0 ? 0.0f : 1.0f;
        q[i].seed = seed * 131 + (uint64_t)i;
        q[i].ignore_eos = mix64(rng++) % 2 == 0;
        q[i].priority = policy == SRV_SCHED_PRIORITY ? (int32_t)(mix64(rng++) % (uint64_t)n_prio) - 1 : 0;
        prio[i] = q[i].priority;
        cancel_at[i] = 0;
    }
    h->chain = q;
    h->chain_res = res;
    h->chain_next = FIRST;
    h->chain_n = NR;
    h->chain_cancel = cancel_at;
    for (int i = 0; i < FIRST; i++) cr_assert_eq(submit(h, &q[i], &res[i]), SRV_SCHED_OK);
    hz_run(h, NR);
    srv_sched_stats st;
    srv_sched_get_stats(h->s, &st);
    cr_assert_eq(st.kv_blocks_used, 0);
    cr_assert_eq(st.requests_running + st.requests_waiting, 0);
    char what[96];
    snprintf(what, sizeof what, "%s seed %llu", policy == SRV_SCHED_PRIORITY ? "priority" : "fcfs",
             (unsigned long long)seed);
    uv_mutex_lock(&log->mu);
    replay_stats rs = replay_trace(log, prio, NR, policy == SRV_SCHED_FCFS, what);
    uv_mutex_unlock(&log->mu);
    cr_assert_eq((uint64_t)rs.preemptions, st.counters.preemptions, "%s: every preemption is traced", what);
    rs.repeated = (int32_t)st.counters.preemptions_repeated;
    for (int i = 0; i < NR; i++) {
        assert_clean(&res[i]);
        cr_assert_neq(res[i].done_finish, SRV_SCHED_FINISH_ERROR, "%s req %d: %s", what, i, res[i].error);
        result alone;
        run_alone(&q[i], &alone);
        char w[128];
        snprintf(w, sizeof w, "%s req %d", what, i);
        assert_same(&res[i], &alone, w);
    }
    hz_free(h);
    trace_log_free(log);
    free(h);
    free(q);
    free(res);
    return rs;
}

Test(scheduler, priority_policy_randomized_tiny_pool) {
    replay_stats tot = {0, 0, 0, 0};
    for (uint64_t seed = 1; seed <= 60; seed++) {
        replay_stats r = priority_round(seed, SRV_SCHED_PRIORITY, seed % 2 ? 3 : 8);
        tot.preemptions += r.preemptions;
        tot.by_priority += r.by_priority;
        tot.urgent_first += r.urgent_first;
        tot.repeated += r.repeated;
    }
    cr_log_info("priority rounds: %d preemptions (%d repeated), %d of them of a request a later arrival outranked, "
                "%d admissions ahead of an earlier arrival", tot.preemptions, tot.repeated, tot.by_priority,
                tot.urgent_first);
    /* the rounds exercised what they are meant to: the pool filled up, priorities chose victims other than the
     * latest arrival, and later arrivals were admitted ahead of earlier, less urgent ones */
    cr_assert_gt(tot.preemptions, 0, "the pool never filled up");
    cr_assert_gt(tot.by_priority, 0, "priority never changed the preemption victim");
    cr_assert_gt(tot.urgent_first, 0, "priority never changed the admission order");
}

/* fcfs: the same randomized arrivals; admission is in arrival order (no request is ever overtaken, so none
 * starves), victims follow the arrival rule (the latest that may be preempted), every request completes. */
Test(scheduler, fcfs_policy_randomized_tiny_pool) {
    int32_t pre = 0;
    for (uint64_t seed = 1; seed <= 8; seed++) {
        replay_stats r = priority_round(seed, SRV_SCHED_FCFS, 1);
        cr_assert_eq(r.urgent_first, 0);
        pre += r.preemptions;
    }
    cr_log_info("fcfs rounds: %d preemptions", pre);
    cr_assert_gt(pre, 0, "the pool never filled up");
}

/* One request at a time (parallel 1): while the first one runs, requests with priorities 5, 1, 5, -3, 1 arrive;
 * they run in the order -3, 1, 1, 5, 5 (equal priorities in arrival order). Under fcfs a nonzero priority is
 * refused, and zero runs in arrival order. */
Test(scheduler, priority_orders_the_queue) {
    for (int pol = 0; pol < 2; pol++) {
        harness *h = malloc(sizeof *h);
        srv_sched_params p = params(32, 1);
        p.policy = pol ? SRV_SCHED_PRIORITY : SRV_SCHED_FCFS;
        hz_init(h, 4, 256, &p);
        enum { NR = 6 };
        static const int32_t prios[NR] = {0, 5, 1, 5, -3, 1};
        static const int expect_done[NR] = {0, 4, 2, 5, 1, 3}; /* position of request i in the DONE order */
        req_spec q[NR];
        result *res = calloc(NR, sizeof *res);
        uint64_t rng = 21;
        for (int i = 0; i < NR; i++) {
            memset(&q[i], 0, sizeof q[i]);
            rand_prompt(&rng, &q[i], 6 + i);
            q[i].n = 1;
            q[i].max_tokens = 3;
            q[i].ignore_eos = true;
            q[i].priority = pol ? prios[i] : 0;
        }
        if (!pol) {
            req_spec bad = q[1];
            bad.priority = 5;
            result r;
            cr_assert_eq(submit(h, &bad, &r), SRV_SCHED_ERR_INVALID, "fcfs accepted a nonzero priority");
        }
        gate_close(h);
        cr_assert_eq(submit(h, &q[0], &res[0]), SRV_SCHED_OK);
        gate_wait_inside(h); /* q[0] admitted, engine held: the others queue behind it */
        for (int i = 1; i < NR; i++) cr_assert_eq(submit(h, &q[i], &res[i]), SRV_SCHED_OK);
        gate_open(h);
        hz_run(h, NR);
        for (int i = 0; i < NR; i++) {
            assert_clean(&res[i]);
            cr_assert_eq(res[i].done_seq, pol ? expect_done[i] : i, "%s: request %d (priority %d) finished %d-th",
                         pol ? "priority" : "fcfs", i, q[i].priority, res[i].done_seq);
        }
        hz_free(h);
        free(h);
        free(res);
    }
}

/* Under KV pressure the least urgent running request gives way, even when it arrived first: a request with
 * priority 9 is admitted first, then two with priority 0 fill the pool; the first preemption takes the
 * priority-9 request (fcfs would take the latest arrival), and all three still equal their runs alone. */
Test(scheduler, priority_preempts_least_urgent_first) {
    harness *h = malloc(sizeof *h);
    trace_log *log = trace_log_new();
    srv_sched_params p = params(64, 8);
    p.policy = SRV_SCHED_PRIORITY;
    p.on_trace = on_trace;
    p.on_trace_ctx = log;
    hz_init(h, 4, 16, &p); /* 64 tokens for three requests of 12 + 20 tokens */
    enum { NR = 3 };
    static const int32_t prios[NR] = {9, 0, 0};
    req_spec q[NR];
    result *res = calloc(NR, sizeof *res);
    uint64_t rng = 5;
    for (int i = 0; i < NR; i++) {
        memset(&q[i], 0, sizeof q[i]);
        rand_prompt(&rng, &q[i], 12);
        q[i].n = 1;
        q[i].max_tokens = 20;
        q[i].ignore_eos = true;
        q[i].temp = 1.0f;
        q[i].seed = 40 + (uint64_t)i;
        q[i].priority = prios[i];
    }
    gate_close(h);
    cr_assert_eq(submit(h, &q[0], &res[0]), SRV_SCHED_OK);
    gate_wait_inside(h); /* the priority-9 request runs first */
    for (int i = 1; i < NR; i++) cr_assert_eq(submit(h, &q[i], &res[i]), SRV_SCHED_OK);
    gate_open(h);
    hz_run(h, NR);
    uv_mutex_lock(&log->mu);
    replay_stats rs = replay_trace(log, prios, NR, false, "least urgent first");
    int32_t first_victim = 0;
    for (int32_t k = 0; k < log->n && !first_victim; k++)
        if (log->t[k].kind == SRV_SCHED_TRACE_PREEMPTED) first_victim = (int32_t)log->t[k].id;
    uv_mutex_unlock(&log->mu);
    cr_assert_gt(rs.preemptions, 0, "the pool never filled up");
    cr_assert_eq(first_victim, 1, "the first victim was %d, not the priority-9 request", first_victim);
    cr_assert_gt(res[0].timings.n_preempted, 0);
    for (int i = 0; i < NR; i++) {
        assert_clean(&res[i]);
        result alone;
        run_alone(&q[i], &alone);
        assert_same(&res[i], &alone, "least urgent first");
    }
    hz_free(h);
    trace_log_free(log);
    free(h);
    free(res);
}

/* ---- asynchronous loads from the disk tier (issue 29) ------------------------------------------------------------
 * A prompt whose prefix is on disk waits for its blocks while the other sequences keep stepping: the disk's reads
 * are slowed down by a hook, and the decode calls that happen while they run are counted. */
typedef struct slow_disk {
    int delay_ms;
    atomic_int *decode_calls;  /* the mock's */
    atomic_int reads;
    _Atomic uint64_t t_first, t_last; /* the first read's start, the last read's end (uv_hrtime) */
} slow_disk;

/* Every read takes delay_ms, and more until the engine has decoded 3 more steps (at most 2 s: a scheduler that waits
 * for the read never gets there). */
static void slow_read(void *ctx) {
    slow_disk *d = ctx;
    uint64_t zero = 0, t0 = uv_hrtime();
    atomic_compare_exchange_strong(&d->t_first, &zero, t0);
    atomic_fetch_add(&d->reads, 1);
    int calls = atomic_load(d->decode_calls);
    struct timespec ts = {0, (long)d->delay_ms * 1000000L}, ms = {0, 1000000L};
    nanosleep(&ts, NULL);
    while (atomic_load(d->decode_calls) < calls + 3 && uv_hrtime() - t0 < 2000000000ull) nanosleep(&ms, NULL);
    atomic_store(&d->t_last, uv_hrtime());
}

static void quiet_warn(void *ctx, const char *msg) {
    (void)ctx;
    (void)msg;
}

/* A harness whose scheduler has a disk tier in dir (its reads slowed down by d when d is not NULL). */
static kvt_tier *hz_init_tier(harness *h, const char *dir, slow_disk *d) {
    memset(h, 0, sizeof *h);
    cr_assert_eq(uv_loop_init(&h->loop), 0);
    srv_sched_params p = params(64, 4);
    mock_init(&h->m, 8, 256, p.parallel, p.batch_tokens);
    kvt_params tp = {.dir = dir, .max_bytes = 1 << 30, .warn = quiet_warn, .read_hook = d ? slow_read : NULL,
                     .read_hook_ctx = d};
    kvt_tier *t;
    cr_assert_eq(kvt_open(&tp, h->m.cache, &t), KVS_OK);
    kvc_set_event_cb(h->m.cache, kvt_on_cache_event, t);
    p.tier = t;
    srv_engine_ops ops = mock_ops(&h->m);
    cr_assert_eq(srv_sched_create(&p, &ops, &h->loop, &h->s), SRV_SCHED_OK);
    return t;
}

static void hz_free_tier(harness *h, kvt_tier *t) {
    srv_sched_free(h->s);
    uv_run(&h->loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&h->loop), 0);
    kvc_set_event_cb(h->m.cache, NULL, NULL);
    kvt_close(t);
    cr_assert(!h->m.corrupt, "mock read back a wrong position");
    cr_assert_eq(h->m.other_errors, 0);
    cr_assert(!h->m.check_msg[0], "kvc_check: %s", h->m.check_msg);
    mock_free(&h->m);
}

Test(scheduler, a_prefix_loading_from_disk_does_not_stall_other_sequences, .timeout = 60) {
    char dir[] = "/tmp/kvs-sched-load-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    uint64_t rng = 77;
    req_spec a = {.n = 1, .max_tokens = 4}, b = {.n = 1, .max_tokens = 1000, .ignore_eos = true};
    rand_prompt(&rng, &a, 400);
    rand_prompt(&rng, &b, 20);
    result *ra1 = calloc(1, sizeof *ra1), *ra2 = calloc(1, sizeof *ra2), *rb = calloc(1, sizeof *rb),
           *rb_alone = calloc(1, sizeof *rb_alone);
    /* a first process computes a's prompt; the tier writes its blocks through */
    harness *h = malloc(sizeof *h);
    kvt_tier *t = hz_init_tier(h, dir, NULL);
    cr_assert_eq(submit(h, &a, ra1), SRV_SCHED_OK);
    hz_run(h, 1);
    kvt_flush(t);
    hz_free_tier(h, t);
    /* a second one (an empty pool): a's prefix comes from a slow disk while b decodes */
    slow_disk d = {.delay_ms = 20};
    t = hz_init_tier(h, dir, &d);
    d.decode_calls = &h->m.decode_calls;
    h->m.record_times = true;
    h->m.decode_sleep_us = 500; /* b's 1000 steps outlast the load by far */
    cr_assert_eq(submit(h, &b, rb), SRV_SCHED_OK);
    cr_assert_eq(submit(h, &a, ra2), SRV_SCHED_OK);
    hz_run(h, 2);
    uint64_t t0 = atomic_load(&d.t_first), t1 = atomic_load(&d.t_last);
    int during = 0;
    for (int32_t i = 0; i < h->m.n_times; i++) during += h->m.times[i] > t0 && h->m.times[i] < t1;
    int reads = atomic_load(&d.reads);
    hz_free_tier(h, t);
    cr_assert_gt(reads, 1, "the prefix was read in %d runs", reads);
    cr_assert_gt(t1, t0);
    cr_assert_geq(during, 5, "only %d decode steps ran during the %.0f ms of disk reads", during, (t1 - t0) / 1e6);
    /* the loaded prefix is the computed one: the same tokens, and every full block of it came from disk */
    assert_same(ra1, ra2, "a from disk vs computed");
    cr_assert_eq(ra2->usage.cached_tokens, (400 - 1) / 8 * 8);
    run_alone(&b, rb_alone);
    assert_same(rb, rb_alone, "b beside the load vs alone");
    free(h);
    free(ra1);
    free(ra2);
    free(rb);
    free(rb_alone);
    char path[512];
    DIR *dd = opendir(dir);
    for (struct dirent *e; dd && (e = readdir(dd));) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (dd) closedir(dd);
    rmdir(dir);
}
