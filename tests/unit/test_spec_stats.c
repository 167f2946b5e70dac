/* test_spec_stats.c: at temperature > 0, speculative decoding keeps the model's output distribution. Thousands of
 * sampled continuations (many seeds) of a prompt that holds every token of a tiny random model once, with
 * prompt lookup (n-gram length 1) on, so that the second token always comes out of a verification row against a
 * guess: the empirical distribution of the pairs (first, second token) must pass a chi-square goodness-of-fit
 * test against the model's own p(t1) * p(t2 | t1), computed here directly with the engine (softmax of the logits
 * at the temperature, EOG banned as ignore_eos does).
 *
 * The false-failure rate: bins with expected count >= 5 (the rest pooled), statistic compared with the upper
 * 1e-4 quantile of chi-square with bins - 1 degrees of freedom (Wilson-Hilferty): a correct implementation fails
 * for at most about 1 in 10,000 choices of seeds. The seeds are fixed, so the test is deterministic. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "server/sched/sched.h"

#define NCH 64     /* choices per request */
#define NREQ 48    /* requests: NCH * NREQ samples */
#define TEMP 0.8f

typedef struct pairs {
    int32_t *t;       /* [NREQ * NCH][2] */
    int32_t *n_tok;   /* [NREQ * NCH] */
    int32_t base;     /* this request's first sample */
    int *n_done;
} pairs;

static void on_event(const srv_sched_event *ev, void *user) {
    pairs *p = user;
    if (ev->type == SRV_SCHED_EV_DONE) {
        (*p->n_done)++;
        return;
    }
    int32_t idx = p->base + ev->choice;
    for (int32_t i = 0; i < ev->n_samples; i++)
        if (p->n_tok[idx] < 2) p->t[2 * idx + p->n_tok[idx]++] = ev->samples[i].token;
}

/* softmax(logits / TEMP) in double with the EOG tokens banned. */
static void probs(const eng_model *m, const float *lg, int32_t n_vocab, double *out) {
    double mx = -INFINITY, sum = 0;
    for (int32_t t = 0; t < n_vocab; t++)
        if (!eng_token_is_eog(m, t) && lg[t] / TEMP > mx) mx = lg[t] / TEMP;
    for (int32_t t = 0; t < n_vocab; t++) {
        out[t] = eng_token_is_eog(m, t) ? 0.0 : exp(lg[t] / TEMP - mx);
        sum += out[t];
    }
    for (int32_t t = 0; t < n_vocab; t++) out[t] /= sum;
}

/* The model's p(t1) [n_vocab] and p(t2 | t1) [n_vocab][n_vocab] for the t1 that matter (rows with
 * N * p(t1) < 1 are left 0: they only feed the pooled bin, through p(t1)). */
static void reference(eng_model *m, const int32_t *prompt, int32_t n_prompt, int32_t N, double *p1, double *p2) {
    int32_t V = eng_model_hparams(m)->n_vocab;
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_threads = 1;
    cp.n_ctx = 2048;
    cp.max_seqs = 1;
    cp.max_batch_tokens = 2048;
    cp.device = ENG_DEVICE_CPU;
    eng_ctx *ctx = NULL;
    char err[256] = "";
    cr_assert_eq(eng_ctx_create(m, &cp, &ctx, err, sizeof err), ENG_OK, "%s", err);
    int32_t seq;
    cr_assert_eq(kvc_seq_alloc(eng_ctx_cache(ctx), &seq), KVC_OK);
    int32_t *pos = malloc((size_t)n_prompt * sizeof *pos), *sq = malloc((size_t)n_prompt * sizeof *sq);
    bool *wl = calloc((size_t)n_prompt, sizeof *wl);
    cr_assert(pos && sq && wl);
    for (int32_t i = 0; i < n_prompt; i++) {
        pos[i] = i;
        sq[i] = seq;
    }
    wl[n_prompt - 1] = true;
    eng_batch b = {.n = n_prompt, .token = prompt, .pos = pos, .seq = sq, .want_logits = wl};
    cr_assert_eq(eng_decode(ctx, &b), ENG_OK);
    probs(m, eng_get_logits(ctx, n_prompt - 1), V, p1);
    for (int32_t t1 = 0; t1 < V; t1++) {
        if (N * p1[t1] < 1) continue;
        int32_t p = n_prompt;
        bool yes = true;
        eng_batch one = {.n = 1, .token = &t1, .pos = &p, .seq = &seq, .want_logits = &yes};
        cr_assert_eq(eng_decode(ctx, &one), ENG_OK);
        probs(m, eng_get_logits(ctx, 0), V, p2 + (size_t)t1 * (size_t)V);
        cr_assert_eq(eng_seq_remove(ctx, seq, n_prompt, INT32_MAX), ENG_OK);
    }
    free(pos);
    free(sq);
    free(wl);
    eng_ctx_free(ctx);
}

/* N = NCH * NREQ samples of two tokens (t[2i], t[2i+1]) with speculation on: n-gram length 1, one guess. */
static void sample_pairs(eng_model *model, const int32_t *prompt, int32_t n_prompt, int32_t *t,
                         srv_sched_counters *counters) {
    const int32_t N = NCH * NREQ;
    char err[256] = "";
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_threads = 1;
    cp.n_ctx = 2048;
    cp.max_seqs = NCH;
    cp.max_batch_tokens = 512;
    cp.kv_blocks = 512;
    cp.device = ENG_DEVICE_CPU;
    eng_ctx *ctx = NULL;
    cr_assert_eq(eng_ctx_create(model, &cp, &ctx, err, sizeof err), ENG_OK, "%s", err);
    srv_engine_ops ops;
    cr_assert_eq(srv_engine_ops_init(&ops, model, ctx), SRV_SCHED_OK);
    uv_loop_t loop;
    uv_loop_init(&loop);
    srv_sched_params sp;
    srv_sched_params_default(&sp);
    sp.batch_tokens = 512;
    sp.parallel = NCH;
    sp.n_ctx = 2048;
    sp.spec_type = SRV_SCHED_SPEC_NGRAM;
    sp.spec_ngram_min = 1;
    sp.spec_ngram_max = 1;
    sp.spec_n_max = 1;
    sp.spec_adaptive = false;
    srv_sched *s = NULL;
    cr_assert_eq(srv_sched_create(&sp, &ops, &loop, &s), SRV_SCHED_OK);
    int32_t *n_tok = calloc((size_t)N, sizeof *n_tok);
    pairs *pr = calloc(NREQ, sizeof *pr);
    cr_assert(n_tok && pr);
    int n_done = 0;
    for (int i = 0; i < NREQ; i++) {
        pr[i] = (pairs){.t = t, .n_tok = n_tok, .base = i * NCH, .n_done = &n_done};
        srv_sched_request rq;
        memset(&rq, 0, sizeof rq);
        rq.prompt = prompt;
        rq.n_prompt = n_prompt;
        rq.n = NCH;
        rq.max_tokens = 2;
        eng_sampling_params_default(&rq.sampling);
        rq.sampling.temperature = TEMP;
        rq.sampling.seed = 1000 + (uint64_t)i * NCH; /* choice c: seed + c, all different */
        rq.ignore_eos = true;
        rq.spec_n_max = -1;
        rq.spec_n_min = -1;
        rq.cb = on_event;
        rq.user = &pr[i];
        uint64_t id;
        cr_assert_eq(srv_sched_submit(s, &rq, &id), SRV_SCHED_OK);
    }
    while (n_done < NREQ) uv_run(&loop, UV_RUN_ONCE);
    srv_sched_stats st;
    srv_sched_get_stats(s, &st);
    *counters = st.counters;
    srv_sched_free(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0);
    srv_engine_ops_release(&ops);
    eng_ctx_free(ctx);

    for (int32_t i = 0; i < N; i++) cr_assert_eq(n_tok[i], 2, "sample %d has %d tokens", i, n_tok[i]);
    free(n_tok);
    free(pr);
}

/* The chi-square statistic of the pairs against p1 * p2: a bin per pair with expected >= 5, a bin per first token
 * for its other pairs (when >= 5), everything else in one pooled bin (checked on its own when too small). */
static double chi_square(const int32_t *t, int32_t N, int32_t V, const double *p1, const double *p2, int32_t *n_bins) {
    int32_t *cnt = calloc((size_t)V * (size_t)V, sizeof *cnt);
    cr_assert_not_null(cnt);
    for (int32_t i = 0; i < N; i++) cnt[(size_t)t[2 * i] * (size_t)V + (size_t)t[2 * i + 1]]++;
    double chi = 0, pool_e = 0, pool_o = 0;
    int32_t bins = 0;
    for (int32_t a = 0; a < V; a++) {
        double row_e = 0, row_o = 0;
        for (int32_t b = 0; b < V; b++) {
            double e = N * p1[a] * p2[(size_t)a * (size_t)V + (size_t)b];
            double o = cnt[(size_t)a * (size_t)V + (size_t)b];
            if (e >= 5) {
                chi += (o - e) * (o - e) / e;
                bins++;
            } else {
                row_e += e;
                row_o += o;
            }
        }
        /* a first token whose row was not computed (N p(t1) < 1) contributes its whole mass to the pool */
        if (N * p1[a] < 1) {
            row_e = N * p1[a];
            row_o = 0;
            for (int32_t b = 0; b < V; b++) row_o += cnt[(size_t)a * (size_t)V + (size_t)b];
        }
        if (row_e >= 5) {
            chi += (row_o - row_e) * (row_o - row_e) / row_e;
            bins++;
        } else {
            pool_e += row_e;
            pool_o += row_o;
        }
    }
    if (pool_e >= 5) {
        chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        bins++;
    } else {
        /* too small for chi-square: Poisson(5) reaches 20 with probability ~1e-6 */
        cr_assert_leq(pool_o, 20, "%.0f samples fell where the model expects %.2f", pool_o, pool_e);
    }
    free(cnt);
    *n_bins = bins;
    return chi;
}

Test(spec_stats, sampling_keeps_the_model_distribution, .timeout = 600) {
    char dir[] = "/tmp/kvs_specstat_XXXXXX", path[256], cmd[512];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    snprintf(cmd, sizeof cmd, "'%s' mkmodel -o '%s' --preset tiny >/dev/null 2>&1", KVSERVE_BINARY, path);
    cr_assert_eq(system(cmd), 0, "%s failed", cmd);
    eng_load_params lp;
    eng_load_params_default(&lp);
    eng_model *model = NULL;
    char err[256] = "";
    cr_assert_eq(eng_model_load(path, &lp, &model, err, sizeof err), ENG_OK, "%s", err);
    remove(path);
    rmdir(dir);
    int32_t V = eng_model_hparams(model)->n_vocab;

    /* the prompt: every non-EOG token once (at most 1500), in a fixed shuffled order */
    int32_t *prompt = malloc((size_t)V * sizeof *prompt), n_prompt = 0, n_eog = 0;
    cr_assert_not_null(prompt);
    for (int32_t t = 0; t < V; t++) {
        if (eng_token_is_eog(model, t)) n_eog++;
        else if (n_prompt < 1500) prompt[n_prompt++] = t;
    }
    bool every_token = n_prompt == V - n_eog; /* then every first token has a guess after it */
    uint64_t rs = 0x2545f4914f6cdd1dull;
    for (int32_t i = n_prompt - 1; i > 0; i--) {
        rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
        int32_t j = (int32_t)(rs % (uint64_t)(i + 1)), x = prompt[i];
        prompt[i] = prompt[j];
        prompt[j] = x;
    }

    const int32_t N = NCH * NREQ;
    double *p1 = calloc((size_t)V, sizeof *p1), *p2 = calloc((size_t)V * (size_t)V, sizeof *p2);
    cr_assert(p1 && p2);
    /* Guesses worth testing: the prompt starts with pairs (a, b) for the likely first tokens a, b one of the likely
     * tokens after a (the best or the second best, alternately), then holds every other token once; so the lookup's
     * guess after a is b, sometimes right, sometimes wrong. The pairs are chosen from the distributions of the
     * previous prompt, three times over (each choice changes the context a little); the distributions the test
     * uses are then computed for the final prompt. */
    int32_t *shuffled = prompt, n_shuffled = n_prompt;
    prompt = malloc((size_t)(n_shuffled + 2 * V) * sizeof *prompt);
    bool *in_a = calloc((size_t)V, sizeof *in_a);
    cr_assert(prompt && in_a);
    memcpy(prompt, shuffled, (size_t)n_shuffled * sizeof *prompt);
    for (int round = 0; round < 3; round++) {
        reference(model, prompt, n_prompt, N, p1, p2);
        int32_t n = 0;
        memset(in_a, 0, (size_t)V * sizeof *in_a);
        for (int32_t a = 0, nth = 0; a < V; a++) {
            if (N * p1[a] < 1) continue;
            const double *row = p2 + (size_t)a * (size_t)V;
            int32_t b0 = -1, b1 = -1;
            for (int32_t b = 0; b < V; b++) {
                if (b0 < 0 || row[b] > row[b0]) {
                    b1 = b0;
                    b0 = b;
                } else if (b1 < 0 || row[b] > row[b1]) {
                    b1 = b;
                }
            }
            prompt[n++] = a;
            prompt[n++] = nth++ % 2 ? b1 : b0;
            in_a[a] = true;
        }
        cr_assert_gt(n, 4, "too few likely first tokens");
        for (int32_t i = 0; i < n_shuffled; i++)
            if (!in_a[shuffled[i]]) prompt[n++] = shuffled[i];
        n_prompt = n;
        memset(p1, 0, (size_t)V * sizeof *p1);
        memset(p2, 0, (size_t)V * (size_t)V * sizeof *p2);
    }
    reference(model, prompt, n_prompt, N, p1, p2);
    free(shuffled);
    free(in_a);

    int32_t *t = calloc((size_t)N * 2, sizeof *t);
    cr_assert_not_null(t);
    srv_sched_counters st;
    sample_pairs(model, prompt, n_prompt, t, &st);

    /* every second token was verified against a guess; some guesses were taken, some refused */
    cr_log_info("%d samples, vocabulary %d: %llu drafts, %llu accepted", N, V,
                (unsigned long long)st.spec_drafts, (unsigned long long)st.spec_accepted_tokens);
    if (every_token)
        cr_assert_eq(st.spec_drafts, (uint64_t)N, "each second token must come from a verified guess");
    else
        cr_assert_gt(st.spec_drafts, (uint64_t)N / 2, "too few second tokens came from a guess");
    cr_assert_gt(st.spec_accepted_tokens, 0);
    cr_assert_lt(st.spec_accepted_tokens, (uint64_t)N);

    int32_t bins;
    double chi = chi_square(t, N, V, p1, p2, &bins);
    cr_assert_gt(bins, 10, "too few bins (%d) for the test to mean anything", bins);
    double df = bins - 1, z = 3.719; /* the normal's upper 1e-4 quantile */
    double crit = df * pow(1 - 2 / (9 * df) + z * sqrt(2 / (9 * df)), 3);
    cr_log_info("chi-square %.1f over %d bins (critical %.1f at 1e-4)", chi, bins, crit);
    cr_assert_lt(chi, crit, "chi-square %.1f over %d bins is above the 1e-4 critical value %.1f: the sampled "
                            "pairs do not follow the model's distribution", chi, bins, crit);
    free(t);
    free(p1);
    free(p2);
    free(prompt);
    eng_model_free(model);
}
