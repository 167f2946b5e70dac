/* test_spec_adaptive.c: the adaptive side of speculative decoding (server/sched/sched_spec.c) over a mock engine
 * with a REAL kvc_cache whose step time is a + b * rows on a virtual clock (the scheduler's step_clock, advanced by
 * each decode call), so the scheduler's cost model sees a known law whatever the machine's load. The mock "model" is a cycle of period 12 (greedy output repeats, so prompt lookup guesses right once a
 * period has passed). With the same per-row cost:
 *   - one stream: an extra row is cheap against the step (a = b), guesses pay, most tokens come from them;
 *   - 24 streams: a row costs about as much as a whole token of the batch (24 b >> a), guesses at the starting
 *     acceptance estimate do not pay and the steps run without them (spec_steps_off counts them).
 * Both runs must also give exactly the tokens of plain decoding, and the cache must check out at the end.
 * With a mock draft model (its own cache, its own step law a_d + b_d * rows):
 *   - a draft that knows the cycle, 10x cheaper than the model: most tokens come from its guesses;
 *   - a draft that is always wrong, a quarter of the model's step: after a few failed drafts it is seldom run, so
 *     the time it and its rejected rows add stays a small share of plain decoding's (the adaptive k). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "server/sched/sched.h"

#define NV 32
#define MAXB 512

typedef struct amock {
    kvc_cache *cache;
    kvc_layout lay;
    float *logits;      /* [MAXB][NV] */
    int32_t *slots;     /* [MAXB] */
    kvc_entry *entries; /* [MAXB] */
    long a_us, b_us;    /* step time: a + b * rows microseconds, added to *clock_ns */
    uint64_t *clock_ns; /* the scheduler's step clock (shared by the model and its draft) */
    bool corrupt;
    bool wrong;         /* a draft that always guesses wrong (the token after the right one) */
    int32_t calls;      /* decode calls */
} amock;

/* The cycle: tokens 20..31 follow each other; a prompt token t < 20 leads into it at 20 + t % 12. */
static int32_t next_of(int32_t t) { return t >= 20 ? 20 + (t - 20 + 1) % 12 : 20 + t % 12; }

static kvc_cache *a_cache(void *p) { return ((amock *)p)->cache; }

static int a_decode(void *p, const eng_batch *b) {
    amock *m = p;
    if (b->n < 1 || b->n > MAXB) return ENG_ERR_INVALID;
    for (int32_t i = 0; i < b->n; i++) m->entries[i] = (kvc_entry){.seq = b->seq[i], .pos = b->pos[i], .token = b->token[i]};
    int rc = kvc_start_forward(m->cache, m->entries, b->n, m->slots);
    if (rc == KVC_ERR_FULL) return ENG_ERR_KV_FULL;
    if (rc != KVC_OK) return ENG_ERR_KV;
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
        for (int32_t q = 0; q <= b->pos[i]; q++) /* every position holds what was written there */
            if (*(float *)kvc_row_ptr(&m->lay, 0, 1, tab[q / bs] * bs + q % bs, 0) != (float)q) m->corrupt = true;
        float *lg = m->logits + (size_t)i * NV;
        for (int32_t v = 0; v < NV; v++) lg[v] = -4.0f + 0.01f * (float)v;
        lg[m->wrong ? next_of(next_of(b->token[i])) : next_of(b->token[i])] = 4.0f;
    }
    m->calls++;
    kvc_finish_forward(m->cache, true);
    *m->clock_ns += (uint64_t)(m->a_us + m->b_us * b->n) * 1000u; /* the step's time by the law, not the machine's */
    return ENG_OK;
}

static float *a_logits(void *p, int32_t i) { return ((amock *)p)->logits + (size_t)i * NV; }
static bool a_eog(void *p, int32_t t) {
    (void)p;
    return t == 0;
}
static int a_push(void *p, eng_detok *d, int32_t t, char *buf, size_t cap, size_t *n) {
    (void)p;
    (void)d;
    if (cap < 1) {
        *n = 1;
        return ENG_ERR_TOO_LARGE;
    }
    buf[0] = (char)('A' + t % 26);
    *n = 1;
    return ENG_OK;
}
static int a_flush(void *p, eng_detok *d, char *buf, size_t cap, size_t *n) {
    (void)p;
    (void)d;
    (void)buf;
    (void)cap;
    *n = 0;
    return ENG_OK;
}
static int a_sampler_create(void *p, const eng_sampling_params *sp, void **out) {
    (void)p;
    eng_sampler *s = NULL;
    int rc = eng_sampler_create(sp, NV, &s);
    *out = s;
    return rc;
}
static void a_sampler_free(void *p, void *s) {
    (void)p;
    eng_sampler_free(s);
}
static int a_sample(void *p, void *s, float *logits, eng_sample *out) {
    (void)p;
    return eng_sampler_sample(s, logits, out);
}

typedef struct run_out {
    int32_t toks[24][128];
    int32_t n[24];
    int done;
} run_out;

static void on_event(const srv_sched_event *ev, void *user) {
    run_out *o = user;
    if (ev->type == SRV_SCHED_EV_DONE) {
        o->done++;
        return;
    }
    for (int32_t i = 0; i < ev->n_samples; i++)
        if (o->n[ev->choice] < 128) o->toks[ev->choice][o->n[ev->choice]++] = ev->samples[i].token;
}

static void mock_init(amock *m, long a_us, long b_us, uint64_t *clock_ns) {
    memset(m, 0, sizeof *m);
    m->clock_ns = clock_ns;
    kvc_params kp;
    kvc_params_default(&kp);
    kp.n_layer = 1;
    kp.n_kv_head = 1;
    kp.head_dim = 1;
    kp.block_size = 16;
    kp.n_blocks = 512;
    kp.max_seqs = 32;
    kp.max_batch_tokens = MAXB;
    kp.dtype = KVC_DTYPE_F32;
    cr_assert_eq(kvc_create(&kp, &m->cache), KVC_OK);
    kvc_get_layout(m->cache, &m->lay);
    m->logits = calloc((size_t)MAXB * NV, sizeof *m->logits);
    m->slots = calloc(MAXB, sizeof *m->slots);
    m->entries = calloc(MAXB, sizeof *m->entries);
    cr_assert(m->logits && m->slots && m->entries);
    m->a_us = a_us;
    m->b_us = b_us;
}

/* The mock's cache checks out and holds nothing; then it is freed. */
static void mock_done(amock *m) {
    cr_assert(!m->corrupt, "a position read back wrong");
    char msg[256];
    cr_assert_eq(kvc_check(m->cache, msg, sizeof msg), KVC_OK, "%s", msg);
    kvc_stats ks;
    kvc_get_stats(m->cache, &ks);
    cr_assert_eq(ks.blocks_used, 0);
    kvc_free(m->cache);
    free(m->logits);
    free(m->slots);
    free(m->entries);
}

static uint64_t read_clock(void *ctx) { return *(const uint64_t *)ctx; }

/* A draft's step law and kind (run_draft). */
typedef struct draft_law {
    long a_us, b_us;
    bool wrong;
    int32_t calls; /* out: the draft's decode calls */
} draft_law;

/* `streams` greedy choices (one request with n = streams) of max_tokens each; returns the counters. With dl, a
 * mock draft model (its own cache) proposes the guesses. */
static srv_sched_counters run_draft(int streams, int32_t max_tokens, bool spec, long a_us, long b_us, run_out *o,
                                    draft_law *dl) {
    amock m, dm;
    uint64_t clock_ns = 0; /* the virtual step clock of the model and its draft */
    mock_init(&m, a_us, b_us, &clock_ns);
    srv_engine_ops ops = {.ctx = &m, .n_vocab = NV, .cache = a_cache, .decode = a_decode, .get_logits = a_logits,
                          .token_is_eog = a_eog, .detok_push = a_push, .detok_flush = a_flush,
                          .sampler_create = a_sampler_create, .sampler_free = a_sampler_free,
                          .sampler_sample = a_sample};
    uv_loop_t loop;
    uv_loop_init(&loop);
    srv_sched_params p;
    srv_sched_params_default(&p);
    p.batch_tokens = MAXB;
    p.parallel = 32;
    p.n_ctx = 1024;
    p.step_clock = read_clock;
    p.step_clock_ctx = &clock_ns;
    p.spec_type = !spec ? SRV_SCHED_SPEC_NONE : dl ? SRV_SCHED_SPEC_DRAFT : SRV_SCHED_SPEC_NGRAM;
    srv_engine_ops dops;
    if (dl) {
        mock_init(&dm, dl->a_us, dl->b_us, &clock_ns);
        dm.wrong = dl->wrong;
        dops = ops;
        dops.ctx = &dm;
        p.draft = &dops;
    }
    srv_sched *s = NULL;
    cr_assert_eq(srv_sched_create(&p, &ops, &loop, &s), SRV_SCHED_OK);
    int32_t prompt[8] = {3, 9, 4, 7, 1, 5, 2, 6};
    srv_sched_request rq;
    memset(&rq, 0, sizeof rq);
    rq.prompt = prompt;
    rq.n_prompt = 8;
    rq.n = streams;
    rq.max_tokens = max_tokens;
    eng_sampling_params_default(&rq.sampling);
    rq.sampling.temperature = 0;
    rq.ignore_eos = true;
    rq.spec_n_max = -1;
    rq.spec_n_min = -1;
    rq.cb = on_event;
    rq.user = o;
    memset(o, 0, sizeof *o);
    uint64_t id;
    cr_assert_eq(srv_sched_submit(s, &rq, &id), SRV_SCHED_OK);
    while (!o->done) uv_run(&loop, UV_RUN_ONCE);
    srv_sched_stats st;
    srv_sched_get_stats(s, &st);
    srv_sched_free(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0);
    cr_assert_eq(st.kv_blocks_used, 0);
    mock_done(&m);
    if (dl) {
        dl->calls = dm.calls;
        mock_done(&dm);
    }
    return st.counters;
}

static srv_sched_counters run(int streams, int32_t max_tokens, bool spec, long a_us, long b_us, run_out *o) {
    return run_draft(streams, max_tokens, spec, a_us, b_us, o, NULL);
}

static void same_tokens(const run_out *a, const run_out *b, int streams, int32_t max_tokens) {
    for (int c = 0; c < streams; c++) {
        cr_assert_eq(a->n[c], max_tokens);
        cr_assert_eq(b->n[c], max_tokens);
        cr_assert(memcmp(a->toks[c], b->toks[c], (size_t)max_tokens * sizeof(int32_t)) == 0, "choice %d differs", c);
    }
}

Test(spec_adaptive, one_stream_guesses_pay, .timeout = 120) {
    static run_out plain, spec;
    run(1, 120, false, 2000, 2000, &plain);
    srv_sched_counters c = run(1, 120, true, 2000, 2000, &spec);
    same_tokens(&spec, &plain, 1, 120);
    cr_log_info("1 stream: %llu steps, %llu drafts, %llu guessed, %llu accepted, %llu steps off",
                (unsigned long long)c.steps, (unsigned long long)c.spec_drafts,
                (unsigned long long)c.spec_draft_tokens, (unsigned long long)c.spec_accepted_tokens,
                (unsigned long long)c.spec_steps_off);
    cr_assert_gt(c.spec_accepted_tokens, 60, "most of the 120 tokens should come from guesses");
    cr_assert_lt(c.steps, 50, "%llu steps for 120 tokens", (unsigned long long)c.steps);
}

Test(spec_adaptive, many_streams_switch_guesses_off, .timeout = 120) {
    static run_out plain, spec;
    run(24, 40, false, 2000, 2000, &plain);
    srv_sched_counters c = run(24, 40, true, 2000, 2000, &spec);
    same_tokens(&spec, &plain, 24, 40);
    cr_log_info("24 streams: %llu steps, %llu drafts, %llu guessed, %llu accepted, %llu steps off",
                (unsigned long long)c.steps, (unsigned long long)c.spec_drafts,
                (unsigned long long)c.spec_draft_tokens, (unsigned long long)c.spec_accepted_tokens,
                (unsigned long long)c.spec_steps_off);
    cr_assert_gt(c.spec_steps_off, 20, "the cost model should have dropped the guesses of most steps");
    cr_assert_lt(c.spec_draft_tokens, 24 * 40 / 10, "guessed rows should be rare when a row costs a token's worth");
}

Test(spec_adaptive, draft_model_guesses_pay, .timeout = 120) {
    static run_out plain, spec;
    run(1, 120, false, 2000, 2000, &plain);
    draft_law dl = {200, 200, false, 0};
    srv_sched_counters c = run_draft(1, 120, true, 2000, 2000, &spec, &dl);
    same_tokens(&spec, &plain, 1, 120);
    cr_log_info("right draft: %llu steps, %d draft calls, %llu drafts, %llu guessed, %llu accepted",
                (unsigned long long)c.steps, (int)dl.calls, (unsigned long long)c.spec_drafts,
                (unsigned long long)c.spec_draft_tokens, (unsigned long long)c.spec_accepted_tokens);
    cr_assert_gt(c.spec_accepted_tokens, 60, "most of the 120 tokens should come from the draft's guesses");
    cr_assert_lt(c.steps, 50, "%llu steps for 120 tokens", (unsigned long long)c.steps);
}

Test(spec_adaptive, a_wrong_draft_model_costs_little, .timeout = 120) {
    static run_out plain, spec;
    run(1, 120, false, 2000, 2000, &plain);
    draft_law dl = {1000, 0, true, 0};
    srv_sched_counters c = run_draft(1, 120, true, 2000, 2000, &spec, &dl);
    same_tokens(&spec, &plain, 1, 120);
    /* the law's time of what speculation added: the draft's calls and the rejected rows */
    double extra = (double)dl.calls * 1000 + (double)c.spec_draft_tokens * 2000;
    double base = 120.0 * (2000 + 2000);
    cr_log_info("wrong draft: %llu steps, %d draft calls, %llu guessed, %llu accepted: %.1f%% of plain decoding's time "
                "added", (unsigned long long)c.steps, (int)dl.calls, (unsigned long long)c.spec_draft_tokens,
                (unsigned long long)c.spec_accepted_tokens, 100 * extra / base);
    cr_assert_eq(c.spec_accepted_tokens, 0);
    cr_assert_lt(extra, 0.15 * base, "a draft that never helps must cost under 15%% of plain decoding's time");
}
