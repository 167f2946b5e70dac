/*
 * test_sampler.c: properties of eng_sampler_* over randomized logits, each checked against an independent
 * reference computed here (argmax, softmax in double, explicit sorted top-k / top-p / min-p sets, the penalty
 * formulas). Seeds are fixed and printed on failure.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kernels/sampler_kernels.h"

/* ---- test helpers --------------------------------------------------------------------------------------- */
typedef struct { uint64_t s; } trng;

static uint64_t trng_next(trng *r) { /* 64-bit LCG + xorshift output: independent of the sampler's RNG */
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t x = r->s;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}
static double trng_u(trng *r) { return (double)(trng_next(r) >> 11) / 9007199254740992.0; }
static float trng_normal(trng *r) {
    double u1 = trng_u(r), u2 = trng_u(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Logits ~ N(0, scale^2), with a few exact ties planted when ties is set. */
static float *rand_logits(uint64_t seed, int32_t n, float scale, bool ties) {
    trng r = { seed * 2654435761u + 12345 };
    float *l = malloc((size_t)n * sizeof(float));
    cr_assert_not_null(l);
    for (int32_t i = 0; i < n; i++) l[i] = trng_normal(&r) * scale;
    if (ties && n > 4) {
        for (int k = 0; k < 4; k++) l[trng_next(&r) % (uint64_t)n] = l[trng_next(&r) % (uint64_t)n];
    }
    return l;
}

static int32_t ref_argmax(const float *l, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++) if (l[i] > l[best]) best = i;
    return best;
}

/* Reference log-softmax in double without shortcuts. */
static void ref_log_softmax(const float *l, int32_t n, double *out) {
    double m = -INFINITY;
    for (int32_t i = 0; i < n; i++) if (l[i] > m) m = l[i];
    double s = 0;
    for (int32_t i = 0; i < n; i++) s += exp((double)l[i] - m);
    double lse = m + log(s);
    for (int32_t i = 0; i < n; i++) out[i] = (double)l[i] - lse;
}

static const float *g_sort_l;
static int cmp_desc(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g_sort_l[x] > g_sort_l[y]) return -1;
    if (g_sort_l[x] < g_sort_l[y]) return 1;
    return x < y ? -1 : (x > y);
}
/* All ids sorted by logit descending, ties by id. */
static int32_t *ref_order(const float *l, int32_t n) {
    int32_t *o = malloc((size_t)n * sizeof(int32_t));
    cr_assert_not_null(o);
    for (int32_t i = 0; i < n; i++) o[i] = i;
    g_sort_l = l;
    qsort(o, (size_t)n, sizeof(int32_t), cmp_desc);
    return o;
}

static eng_sampler *make(const eng_sampling_params *p, int32_t n_vocab) {
    eng_sampler *s = NULL;
    int rc = eng_sampler_create(p, n_vocab, &s);
    cr_assert_eq(rc, ENG_OK, "eng_sampler_create: %d", rc);
    cr_assert_not_null(s);
    return s;
}

/* One sample on a private copy of the logits (the sampler may modify its input). */
static eng_sample sample_copy(eng_sampler *s, const float *l, int32_t n) {
    float *c = malloc((size_t)n * sizeof(float));
    cr_assert_not_null(c);
    memcpy(c, l, (size_t)n * sizeof(float));
    eng_sample out;
    int rc = eng_sampler_sample(s, c, &out);
    cr_assert_eq(rc, ENG_OK, "eng_sampler_sample: %d", rc);
    free(c);
    return out;
}

/* ---- tests ---------------------------------------------------------------------------------------------- */
Test(sampler, defaults) {
    eng_sampling_params p;
    memset(&p, 0x5a, sizeof(p));
    eng_sampling_params_default(&p);
    cr_assert_eq(p.temperature, 1.0f);
    cr_assert_leq(p.top_k, 0);
    cr_assert_geq(p.top_p, 1.0f);
    cr_assert_leq(p.min_p, 0.0f);
    cr_assert_eq(p.repetition_penalty, 1.0f);
    cr_assert_eq(p.presence_penalty, 0.0f);
    cr_assert_eq(p.frequency_penalty, 0.0f);
    cr_assert_null(p.logit_bias);
    cr_assert_eq(p.n_logit_bias, 0);
    cr_assert_eq(p.n_top_logprobs, 0);
}

Test(sampler, invalid_arguments) {
    eng_sampling_params p;
    eng_sampling_params_default(&p);
    eng_sampler *s = (eng_sampler *)&p;
    cr_assert_eq(eng_sampler_create(&p, 0, &s), ENG_ERR_INVALID);
    cr_assert_null(s);
    cr_assert_eq(eng_sampler_create(NULL, 10, &s), ENG_ERR_INVALID);
    p.n_top_logprobs = 21;
    cr_assert_eq(eng_sampler_create(&p, 10, &s), ENG_ERR_INVALID);
    eng_sampling_params_default(&p);
    eng_logit_bias b = { 10, 1.0f };
    p.logit_bias = &b;
    p.n_logit_bias = 1;
    cr_assert_eq(eng_sampler_create(&p, 10, &s), ENG_ERR_INVALID, "bias token out of range");
    eng_sampling_params_default(&p);
    p.repetition_penalty = 0.0f;
    cr_assert_eq(eng_sampler_create(&p, 10, &s), ENG_ERR_INVALID);
    eng_sampling_params_default(&p);
    p.penalty_last_n = -2;
    cr_assert_eq(eng_sampler_create(&p, 10, &s), ENG_ERR_INVALID);
    eng_sampling_params_default(&p);
    p.temperature = NAN;
    cr_assert_eq(eng_sampler_create(&p, 10, &s), ENG_ERR_INVALID);
    eng_sampler_free(NULL);

    /* everything banned */
    eng_sampling_params_default(&p);
    s = make(&p, 4);
    float l[4] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY };
    eng_sample out;
    cr_assert_eq(eng_sampler_sample(s, l, &out), ENG_ERR_INVALID);
    cr_assert_eq(eng_sampler_sample(s, NULL, &out), ENG_ERR_INVALID);
    eng_sampler_free(s);
}

Test(sampler, greedy_is_argmax) {
    for (uint64_t seed = 1; seed <= 200; seed++) {
        int32_t n = 1 + (int32_t)(seed * 7919 % 5000);
        float *l = rand_logits(seed, n, 1.0f + (float)(seed % 5), seed % 3 == 0);
        eng_sampling_params p;
        eng_sampling_params_default(&p);
        p.temperature = (seed % 2) ? 0.0f : -1.0f;
        p.seed = seed;
        eng_sampler *s = make(&p, n);
        int32_t want = ref_argmax(l, n);
        eng_sample out = sample_copy(s, l, n);
        cr_assert_eq(out.token, want, "seed %llu n %d: got %d want %d", (unsigned long long)seed, n, out.token,
                     want);
        eng_sampler_free(s);
        free(l);
    }
}

Test(sampler, greedy_ties_pick_lowest_id) {
    float l[6] = { 0.5f, 2.0f, -1.0f, 2.0f, 2.0f, 1.0f };
    eng_sampling_params p;
    eng_sampling_params_default(&p);
    p.temperature = 0.0f;
    eng_sampler *s = make(&p, 6);
    eng_sample out = sample_copy(s, l, 6);
    cr_assert_eq(out.token, 1);
    eng_sampler_free(s);
}

Test(sampler, top_k_1_is_greedy_at_any_temperature) {
    const float temps[] = { 0.01f, 0.3f, 1.0f, 2.5f, 100.0f, 1e6f };
    for (uint64_t seed = 1; seed <= 120; seed++) {
        int32_t n = 2 + (int32_t)(seed * 104729 % 3000);
        float *l = rand_logits(seed, n, 3.0f, seed % 2 == 0);
        eng_sampling_params p;
        eng_sampling_params_default(&p);
        p.top_k = 1;
        p.temperature = temps[seed % 6];
        p.seed = seed;
        p.top_p = (seed % 4 == 0) ? 0.5f : 1.0f;
        eng_sampler *s = make(&p, n);
        int32_t want = ref_argmax(l, n);
        for (int rep = 0; rep < 5; rep++) {
            eng_sample out = sample_copy(s, l, n);
            cr_assert_eq(out.token, want, "seed %llu T %g: got %d want %d", (unsigned long long)seed,
                         (double)p.temperature, out.token, want);
        }
        eng_sampler_free(s);
        free(l);
    }
}

/* The allowed set under the documented rules, from a full sort in double: top-k, then the smallest best-first
 * prefix whose tempered probability (renormalized over the top-k set) reaches top_p, then p >= min_p * p_max.
 * Marks allowed[i] and returns the set size. Tokens whose mass sits within 1e-5 of a cut are marked 2
 * (borderline: float rounding in the sampler may legitimately include them). */
static int32_t ref_allowed(const float *l, int32_t n, float temp, int32_t top_k, float top_p, float min_p,
                           unsigned char *allowed) {
    int32_t *o = ref_order(l, n);
    int32_t k = (top_k > 0 && top_k < n) ? top_k : n;
    double m = l[o[0]];
    double *pr = malloc((size_t)k * sizeof(double));
    cr_assert_not_null(pr);
    double sum = 0;
    for (int32_t i = 0; i < k; i++) { pr[i] = exp(((double)l[o[i]] - m) / temp); sum += pr[i]; }
    int32_t keep = k;
    int32_t border_lo = k, border_hi = k;
    if (top_p < 1.0f) {
        double acc = 0;
        for (int32_t i = 0; i < k; i++) {
            acc += pr[i] / sum;
            if (acc >= top_p) { keep = i + 1; break; }
        }
        /* borderline: positions where acc is within 1e-5 of top_p */
        acc = 0;
        border_lo = keep; border_hi = keep;
        for (int32_t i = 0; i < k; i++) {
            acc += pr[i] / sum;
            if (fabs(acc - top_p) < 1e-5) { if (i + 1 < border_lo) border_lo = i + 1; if (i + 2 > border_hi) border_hi = i + 2; }
        }
    }
    memset(allowed, 0, (size_t)n);
    int32_t cnt = 0;
    for (int32_t i = 0; i < k; i++) {
        bool in_p = i < keep;
        bool in_min = !(min_p > 0) || pr[i] >= min_p;
        bool border = (i >= border_lo && i < border_hi) || (min_p > 0 && fabs(pr[i] - min_p) < 1e-5);
        if (in_p && in_min) { allowed[o[i]] = 1; cnt++; }
        else if (border) allowed[o[i]] = 2;
    }
    free(pr);
    free(o);
    return cnt;
}

Test(sampler, sampled_token_lies_in_allowed_set) {
    unsigned char *allowed = malloc(20000);
    cr_assert_not_null(allowed);
    for (uint64_t seed = 1; seed <= 150; seed++) {
        trng r = { seed };
        int32_t n = 2 + (int32_t)(trng_next(&r) % 20000);
        float *l = rand_logits(seed, n, 0.5f + (float)(trng_u(&r) * 4.0), seed % 5 == 0);
        eng_sampling_params p;
        eng_sampling_params_default(&p);
        p.seed = seed;
        p.temperature = 0.2f + (float)(trng_u(&r) * 2.0);
        int mode = (int)(seed % 4); /* 0: top-k, 1: top-p, 2: min-p, 3: all three */
        if (mode == 0 || mode == 3) p.top_k = 1 + (int32_t)(trng_next(&r) % (seed % 3 ? 300 : 5000));
        if (mode == 1 || mode == 3) p.top_p = 0.05f + (float)(trng_u(&r) * 0.9);
        if (mode == 2 || mode == 3) p.min_p = 0.01f + (float)(trng_u(&r) * 0.5);
        int32_t cnt = ref_allowed(l, n, p.temperature, p.top_k, p.top_p, p.min_p, allowed);
        cr_assert_gt(cnt, 0);
        eng_sampler *s = make(&p, n);
        for (int d = 0; d < 40; d++) {
            eng_sample out = sample_copy(s, l, n);
            cr_assert(out.token >= 0 && out.token < n);
            cr_assert(allowed[out.token] != 0,
                      "seed %llu mode %d n %d T %g k %d p %g minp %g: token %d (logit %g) outside the allowed "
                      "set of %d", (unsigned long long)seed, mode, n, (double)p.temperature, p.top_k,
                      (double)p.top_p, (double)p.min_p, out.token, (double)l[out.token], cnt);
        }
        eng_sampler_free(s);
        free(l);
    }
    free(allowed);
}

/* The kept set is exactly the documented one: every sample lies in it (above) AND every token of it whose
 * renormalized probability is >= 1% shows up in 3000 draws (a miss has probability < e^-30). */
Test(sampler, allowed_set_is_covered) {
    unsigned char allowed[64];
    for (uint64_t seed = 1; seed <= 200; seed++) {
        trng r = { seed * 7 + 3 };
        int32_t n = 2 + (int32_t)(trng_next(&r) % 62);
        float *l = rand_logits(seed + 500, n, 0.3f + (float)(trng_u(&r) * 2.0), false);
        eng_sampling_params p;
        eng_sampling_params_default(&p);
        p.seed = seed;
        p.temperature = 0.3f + (float)(trng_u(&r) * 1.5);
        int mode = (int)(seed % 4);
        if (mode == 0 || mode == 3) p.top_k = 1 + (int32_t)(trng_next(&r) % (uint64_t)n);
        if (mode == 1 || mode == 3) p.top_p = 0.1f + (float)(trng_u(&r) * 0.85);
        if (mode == 2 || mode == 3) p.min_p = 0.02f + (float)(trng_u(&r) * 0.3);
        int32_t cnt = ref_allowed(l, n, p.temperature, p.top_k, p.top_p, p.min_p, allowed);
        /* renormalized probabilities of the allowed set */
        double pr[64], tot = 0, m = -INFINITY;
        for (int32_t i = 0; i < n; i++) if (allowed[i] == 1 && l[i] > m) m = l[i];
        for (int32_t i = 0; i < n; i++) { pr[i] = allowed[i] == 1 ? exp((l[i] - m) / p.temperature) : 0; tot += pr[i]; }
        int seen[64] = { 0 };
        eng_sampler *s = make(&p, n);
        for (int d = 0; d < 3000; d++) {
            eng_sample out = sample_copy(s, l, n);
            cr_assert(allowed[out.token] != 0, "seed %llu: token %d outside the set", (unsigned long long)seed,
                      out.token);
            seen[out.token]++;
        }
        for (int32_t i = 0; i < n; i++) {
            if (allowed[i] == 1 && pr[i] / tot >= 0.01)
                cr_assert(seen[i] > 0, "seed %llu mode %d (k %d p %g minp %g T %g): token %d (p %.3f) of the "
                          "allowed set of %d never sampled", (unsigned long long)seed, mode, p.top_k,
                          (double)p.top_p, (double)p.min_p, (double)p.temperature, i, pr[i] / tot, cnt);
        }
        eng_sampler_free(s);
        free(l);
    }
}

/* top-k boundaries on a nearly flat distribution over a shuffled vocabulary, through both top-k paths (the
 * bounded heap for k <= 256 and the partition for larger k): exactly the k best are ever sampled, and all
 * of them are (each has probability ~1/k; 30 k draws make a miss practically impossible). */
Test(sampler, top_k_exact_set_flat) {
    const int32_t n = 3000;
    float *l = malloc(n * sizeof(float));
    int32_t *rank_of = malloc(n * sizeof(int32_t));
    int32_t *perm = malloc(n * sizeof(int32_t));
    cr_assert(l && rank_of && perm);
    trng r = { 99 };
    for (int32_t i = 0; i < n; i++) perm[i] = i;
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = (int32_t)(trng_next(&r) % (uint64_t)(i + 1));
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    for (int32_t k = 0; k < n; k++) { l[perm[k]] = -1e-4f * (float)k; rank_of[perm[k]] = k; }
    const int32_t ks[] = { 1, 7, 256, 257, 300, 1000 };
    for (size_t c = 0; c < sizeof(ks) / sizeof(ks[0]); c++) {
        eng_sampling_params p;
        eng_sampling_params_default(&p);
        p.top_k = ks[c];
        p.seed = 1000 + c;
        eng_sampler *s = make(&p, n);
        int *seen = calloc((size_t)n, sizeof(int));
        cr_assert_not_null(seen);
        for (int d = 0; d < 30 * ks[c]; d++) {
            eng_sample out = sample_copy(s, l, n);
            cr_assert_lt(rank_of[out.token], ks[c], "k %d: sampled rank %d", ks[c], rank_of[out.token]);
            seen[rank_of[out.token]]++;
        }
        for (int32_t k = 0; k < ks[c]; k++) cr_assert(seen[k] > 0, "k %d: rank %d never sampled", ks[c], k);
        free(seen);
        eng_sampler_free(s);
    }
    free(perm);
    free(rank_of);
    free(l);
}

/* With a top-p set of exactly known size: logits whose softmax puts 0.5, 0.25, 0.125, ... mass on ids in a
 * shuffled order; top_p = 0.7 must allow exactly the two best. */
Test(sampler, top_p_exact_set) {
    const int32_t n = 1000;
    float *l = malloc(n * sizeof(float));
    cr_assert_not_null(l);
    for (int32_t i = 0; i < n; i++) l[i] = -1000.0f; /* negligible */
    int32_t ids[4] = { 777, 3, 512, 90 };
    for (int k = 0; k < 4; k++) l[ids[k]] = (float)(-k * log(2.0));
    eng_sampling_params p;
    eng_sampling_params_default(&p);
    p.top_p = 0.7f;
    p.seed = 99;
    eng_sampler *s = make(&p, n);
    int seen[2] = { 0, 0 };
    for (int d = 0; d < 400; d++) {
        eng_sample out = sample_copy(s, l, n);
        cr_assert(out.token == ids[0] || out.token == ids[1], "token %d", out.token);
        seen[out.token == ids[1]]++;
    }
    cr_assert(seen[0] > 0 && seen[1] > 0);
    eng_sampler_free(s);
    free(l);
}

/* Empirical frequencies at temperature 1 against the softmax: Pearson chi-square over a small vocabulary,
 * bound far above the critical value so that the fixed-seed test is not flaky, yet far below what a wrong
 * temperature or a biased walk produces (checked below with T = 1.3 logits). */
static double chi_square(const float *l, int32_t n, float temp_logits, uint64_t seed, int draws, float top_k_T) {
    (void)top_k_T;
    eng_sampling_params p;
    eng_sampling_params_default(&p);
    p.seed = seed;
    eng_sampler *s = make(&p, n);
    int *cnt = calloc((size_t)n, sizeof(int));
    cr_assert_not_null(cnt);
    float *scaled = malloc((size_t)n * sizeof(float));
    cr_assert_not_null(scaled);
    for (int32_t i = 0; i < n; i++) scaled[i] = l[i] * temp_logits;
    for (int d = 0; d < draws; d++) {
        eng_sample out = sample_copy(s, scaled, n);
        cnt[out.token]++;
    }
    double *lp = malloc((size_t)n * sizeof(double));
    cr_assert_not_null(lp);
    ref_log_softmax(l, n, lp); /* the expected distribution is always softmax(l) */
    double chi = 0;
    for (int32_t i = 0; i < n; i++) {
        double e = exp(lp[i]) * draws;
        chi += (cnt[i] - e) * (cnt[i] - e) / e;
    }
    free(lp);
    free(scaled);
    free(cnt);
    eng_sampler_free(s);
    return chi;
}

Test(sampler, frequencies_match_softmax) {
    const int32_t n = 16; /* df = 15: mean 15, sd ~5.5; 99.99th percentile ~ 44 */
    for (uint64_t seed = 1; seed <= 4; seed++) {
        float *l = rand_logits(seed + 1000, n, 1.0f, false);
        double chi = chi_square(l, n, 1.0f, seed, 40000, 0);
        cr_assert_lt(chi, 60.0, "seed %llu: chi-square %g over %d draws", (unsigned long long)seed, chi, 40000);
        /* power check: the same draws from logits * 1.3 are rejected by the same bound */
        double chi_bad = chi_square(l, n, 1.3f, seed, 40000, 0);
        cr_assert_gt(chi_bad, 60.0, "seed %llu: the bound cannot tell T=1 from T=1/1.3 (chi %g)",
                     (unsigned long long)seed, chi_bad);
        free(l);
    }
}

Test(sampler, temperature_scales_distribution) {
    /* sampling logits l at temperature T must match softmax(l / T) */
    const int32_t n = 12;
    float *l = rand_logits(4242, n, 1.5f, false);
    float *lt = malloc(n * sizeof(float));
    cr_assert_not_null(lt);
    const float T = 0.6f;
    for (int32_t i = 0; i < n; i++) lt[i] = l[i] / T;
    eng_sampling_params p;
    eng_sampling_params_default(&p);
    p.temperature = T;
    p.seed = 5;
    eng_sampler *s = make(&p, n);
    int cnt[12] = { 0 };
    const int draws = 40000;
    for (int d = 0; d < draws; d++) cnt[sample_copy(s, l, n).token]++;
    double lp[12];
    ref_log_softmax(lt, n, lp);
    double chi = 0;
    for (int32_t i = 0; i < n; i++) {
        double e = exp(lp[i]) * draws;
        chi += (cnt[i] - e) * (cnt[i] - e) / e;
    }
    cr_assert_lt(chi, 50.0, "chi-square %g (df 11)", chi);
    eng_sampler_free(s);
    free(lt);
    free(l);
}

Test(sampler, seed_determinism) {
    const int32_t n = 5000;
    float *l = rand_logits(77, n, 2.0f, false);
    int32_t seq[4][64];
    const uint64_t seeds[4] = { 123, 123, 124, 0xFFFFFFFFFFFFFFFFull };
    for (int k = 0; k < 4; k++) {
        eng_sampling_params p;
        eng_sampling_params_default(&p);
        p.seed = seeds[k];
        p.top_p = 0.95f;
        p.top_k = 1000;
        eng_sampler *s = make(&p, n);
        for (int i = 0; i < 64; i++) seq[k][i] = sample_copy(s, l, n).token;
        eng_sampler_free(s);
    }
    cr_assert_arr_eq(seq[0], seq[1], sizeof(seq[0]), "same seed, different sequences");
    cr_assert(memcmp(seq[0], seq[2], sizeof(seq[0])) != 0, "seeds 123 and 124 gave the same 64 tokens");
    cr_assert(memcmp(seq[0], seq[3], sizeof(seq[0])) != 0, "seeds 123 and 2^64-1 gave the same 64 tokens");
    free(l);
}

/* Penalties, checked through greedy: a seen token t and a rival r (unseen) with r's logit set just below / above
 * the value the documented formula gives t. The greedy choice flips exactly at the formula's value. */
static float penalized(float logit, int count, float rep, float freq, float pres) {
    float v = logit;
    if (count > 0) {
        if (rep != 1.0f) v = v > 0 ? v / rep : v * rep;
        v -= (float)count * freq + pres;
    }
    return v;
}

Test(sampler, penalties_flip_greedy_at_formula) {
    trng r = { 31337 };
    for (int it = 0; it < 300; it++) {
        const int32_t n = 50;
        float l[50];
        for (int32_t i = 0; i < n; i++) l[i] = -100.0f + (float)trng_u(&r); /* far below the two under test */
        eng_sampling_params p;
        eng_sampling_params_default(&p);
        p.temperature = 0.0f;
        int kind = it % 4;
        p.repetition_penalty = (kind == 0 || kind == 3) ? 1.0f + (float)trng_u(&r) * 2.0f : 1.0f;
        p.frequency_penalty = (kind == 1 || kind == 3) ? (float)trng_u(&r) * 2.0f : 0.0f;
        p.presence_penalty = (kind == 2 || kind == 3) ? (float)trng_u(&r) * 2.0f : 0.0f;
        if (kind == 3 && it % 8 == 3) p.frequency_penalty = -p.frequency_penalty; /* negative: a bonus */
        p.penalty_last_n = -1;
        int32_t t = (int32_t)(trng_next(&r) % n);
        int32_t rv = (int32_t)((t + 1 + trng_next(&r) % (n - 1)) % n);
        int count = 1 + (int)(trng_next(&r) % 4);
        float lt = (float)(trng_u(&r) * 8.0 - 4.0);
        l[t] = lt;
        float expect = penalized(lt, count, p.repetition_penalty, p.frequency_penalty, p.presence_penalty);
        for (int side = 0; side < 2; side++) {
            eng_sampler *s = make(&p, n);
            for (int c = 0; c < count; c++) eng_sampler_accept(s, t);
            float lr = side == 0 ? expect - 1e-3f * (1.0f + fabsf(expect)) : expect + 1e-3f * (1.0f + fabsf(expect));
            float ll[50];
            memcpy(ll, l, sizeof(ll));
            ll[rv] = lr;
            eng_sample out = sample_copy(s, ll, n);
            int32_t want = side == 0 ? t : rv;
            cr_assert_eq(out.token, want,
                         "it %d kind %d: logit %g count %d rep %g freq %g pres %g -> expected %g, rival %g: "
                         "got %d want %d", it, kind, (double)lt, count, (double)p.repetition_penalty,
                         (double)p.frequency_penalty, (double)p.presence_penalty, (double)expect, (double)lr,
                         out.token, want);
            /* the logprob is still that of the raw logits */
            double lp[50];
            ref_log_softmax(ll, n, lp);
            cr_assert_float_eq(out.logprob, lp[out.token], 1e-4);
            eng_sampler_free(s);
        }
    }
}

Test(sampler, penalty_window_and_own_choices) {
    /* window 2: after accepting t, x, y the token t has left the window and is no longer penalized */
    const int32_t n = 8;
    float l[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
    l[5] = 3.0f; /* t */
    l[6] = 2.0f; /* rival */
    eng_sampling_params p;
    eng_sampling_params_default(&p);
    p.temperature = 0.0f;
    p.presence_penalty = 2.0f; /* 3 - 2 = 1 < 2 */
    p.penalty_last_n = 2;
    eng_sampler *s = make(&p, n);
    eng_sampler_accept(s, 5);
    cr_assert_eq(sample_copy(s, l, n).token, 6, "t in the window must be penalized");
    /* the sampler accepted its own choice (6): window = {5, 6}; now both are penalized: 1 vs 0 -> 5 */
    cr_assert_eq(sample_copy(s, l, n).token, 5);
    /* window = {6, 5}; accept 0 and 1: window = {0, 1}, neither 5 nor 6 penalized */
    eng_sampler_accept(s, 0);
    eng_sampler_accept(s, 1);
    cr_assert_eq(sample_copy(s, l, n).token, 5);
    eng_sampler_free(s);

    /* penalty_last_n = 0: penalties see nothing */
    p.penalty_last_n = 0;
    s = make(&p, n);
    eng_sampler_accept(s, 5);
    cr_assert_eq(sample_copy(s, l, n).token, 5);
    eng_sampler_free(s);
}

Test(sampler, logit_bias) {
    for (uint64_t seed = 1; seed <= 60; seed++) {
        const int32_t n = 300;
        float *l = rand_logits(seed, n, 2.0f, false);
        int32_t top = ref_argmax(l, n);
        eng_logit_bias b[2] = { { top, seed % 2 ? -INFINITY : -100.0f }, { (top + 7) % n, 0.0f } };
        eng_sampling_params p;
        eng_sampling_params_default(&p);
        p.logit_bias = b;
        p.n_logit_bias = 2;
        p.seed = seed;
        p.temperature = seed % 3 == 0 ? 0.0f : 1.5f;
        p.n_top_logprobs = 3;
        eng_sampler *s = make(&p, n);
        b[0].token = 0; /* the sampler must have copied the bias */
        double *lp = malloc(n * sizeof(double));
        cr_assert_not_null(lp);
        ref_log_softmax(l, n, lp);
        for (int d = 0; d < 200; d++) {
            eng_sample out = sample_copy(s, l, n);
            cr_assert_neq(out.token, top, "seed %llu: banned token %d sampled", (unsigned long long)seed, top);
            /* the reported logprobs ignore the bias: the banned token is still the best by raw logit */
            cr_assert_eq(out.top_token[0], top);
            cr_assert_float_eq(out.logprob, lp[out.token], 1e-4);
        }
        /* a positive bias makes a token win greedily */
        eng_sampler_free(s);
        eng_logit_bias up = { (top + 11) % n, 1000.0f };
        eng_sampling_params_default(&p);
        p.temperature = 0.0f;
        p.logit_bias = &up;
        p.n_logit_bias = 1;
        s = make(&p, n);
        cr_assert_eq(sample_copy(s, l, n).token, up.token);
        eng_sampler_free(s);
        free(lp);
        free(l);
    }
}

Test(sampler, logprob_and_top_n) {
    for (uint64_t seed = 1; seed <= 60; seed++) {
        int32_t n = 1 + (int32_t)(seed * 2003 % 30000);
        float *l = rand_logits(seed, n, seed % 2 ? 1.0f : 15.0f, seed % 3 == 0);
        if (seed % 7 == 0 && n > 3) { l[1] = -INFINITY; l[n - 1] = 40.0f; } /* a -inf and a dominant logit */
        double *lp = malloc((size_t)n * sizeof(double));
        cr_assert_not_null(lp);
        ref_log_softmax(l, n, lp);
        int32_t *o = ref_order(l, n);
        eng_sampling_params p;
        eng_sampling_params_default(&p);
        p.seed = seed;
        p.n_top_logprobs = (int32_t)(seed % 21);
        p.temperature = seed % 2 ? 0.0f : 0.8f;
        eng_sampler *s = make(&p, n);
        eng_sample out = sample_copy(s, l, n);
        int32_t want_n = p.n_top_logprobs < n ? p.n_top_logprobs : n;
        cr_assert_eq(out.n_top, want_n);
        double tol = 1e-4 * (1.0 + fabs(lp[out.token]));
        cr_assert(fabs(out.logprob - lp[out.token]) <= tol, "seed %llu: logprob %g want %g",
                  (unsigned long long)seed, (double)out.logprob, lp[out.token]);
        for (int32_t j = 0; j < out.n_top; j++) {
            cr_assert_eq(out.top_token[j], o[j], "seed %llu rank %d: token %d want %d", (unsigned long long)seed,
                         j, out.top_token[j], o[j]);
            cr_assert(fabs(out.top_logprob[j] - lp[o[j]]) <= 1e-4 * (1.0 + fabs(lp[o[j]])));
            if (j > 0) cr_assert_geq(out.top_logprob[j - 1], out.top_logprob[j]);
        }
        eng_sampler_free(s);
        free(o);
        free(lp);
        free(l);
    }
}

/* A vocabulary of realistic size through every path: the result is valid and sampling allocates nothing
 * that leaks (ASan); top-p on a flat distribution forces the growing-chunk selection past its first rounds. */
Test(sampler, large_vocab_paths) {
    const int32_t n = 151936;
    float *l = rand_logits(2024, n, 0.05f, false); /* nearly flat */
    unsigned char *allowed = malloc((size_t)n);
    cr_assert_not_null(allowed);
    struct { float t; int32_t k; float p; float mp; } cfg[] = {
        { 0.0f, 0, 1.0f, 0.0f }, { 1.0f, 40, 1.0f, 0.0f }, { 1.0f, 0, 0.9f, 0.0f }, { 0.7f, 0, 1.0f, 0.95f },
        { 1.2f, 50000, 0.5f, 0.9f },
    };
    for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
        eng_sampling_params p;
        eng_sampling_params_default(&p);
        p.temperature = cfg[c].t;
        p.top_k = cfg[c].k;
        p.top_p = cfg[c].p;
        p.min_p = cfg[c].mp;
        p.seed = c;
        p.n_top_logprobs = 20;
        p.repetition_penalty = 1.1f;
        eng_sampler *s = make(&p, n);
        int32_t cnt = p.temperature > 0 ? ref_allowed(l, n, p.temperature, p.top_k, p.top_p, p.min_p, allowed) : 0;
        for (int d = 0; d < 3; d++) {
            /* penalties change the distribution after the first draw; check the set on the first draw only */
            eng_sample out = sample_copy(s, l, n);
            cr_assert(out.token >= 0 && out.token < n);
            if (d == 0 && p.temperature > 0) cr_assert(allowed[out.token], "config %zu: token outside the set of %d", c, cnt);
            if (d == 0 && p.temperature <= 0) cr_assert_eq(out.token, ref_argmax(l, n));
        }
        eng_sampler_free(s);
    }
    free(allowed);
    free(l);
}

/* ---- kernels ------------------------------------------------------------------------------------------------ */
Test(sampler_kernels, exp_accuracy) {
    double worst = 0;
    float worst_x = 0;
    for (int32_t i = 0; i <= 2000000; i++) {
        float x = -87.3f * (float)i / 2000000.0f;
        double want = exp((double)x);
        double got = eng_smp_exp(x);
        double rel = fabs(got - want) / want;
        if (want < 1.2e-38) continue; /* denormal results: absolute error below the smallest normal */
        if (rel > worst) { worst = rel; worst_x = x; }
    }
    cr_assert_lt(worst, 3.6e-7, "eng_smp_exp: worst relative error %g at x = %.9g", worst, (double)worst_x);
    cr_assert_eq(eng_smp_exp(0.0f), 1.0f, "e^0 must be exactly 1 (min-p relies on it)");
    cr_assert_eq(eng_smp_exp(-INFINITY), 0.0f);
    cr_assert_eq(eng_smp_exp(NAN), 0.0f);
    cr_assert_eq(eng_smp_exp(-90.0f), 0.0f);
    cr_assert(fabs(eng_smp_exp(10.0f) - exp(10.0)) / exp(10.0) < 3.6e-7);
}

/* The AVX2 kernels against the scalar ones on random arrays with NaN, -inf and lengths not a multiple of 8. */
Test(sampler_kernels, avx2_matches_scalar) {
    eng_smp_kernels sc, vk;
    eng_smp_kernels_scalar(&sc);
    if (!eng_smp_kernels_avx2(&vk)) {
        cr_log_warn("no AVX2 on this CPU: only the scalar kernels are in use (and tested through the sampler)");
        return;
    }
    cr_assert_str_eq(vk.name, "avx2");
    for (uint64_t seed = 1; seed <= 300; seed++) {
        trng r = { seed };
        int32_t n = (int32_t)(trng_next(&r) % 3000);
        float *x = malloc(((size_t)n + 1) * sizeof(float));
        float *o1 = malloc(((size_t)n + 1) * sizeof(float));
        float *o2 = malloc(((size_t)n + 1) * sizeof(float));
        cr_assert(x && o1 && o2);
        for (int32_t i = 0; i < n; i++) {
            uint64_t k = trng_next(&r) % 50;
            x[i] = k == 0 ? NAN : k == 1 ? -INFINITY : trng_normal(&r) * 20.0f;
        }
        float m1 = sc.max(x, n), m2 = vk.max(x, n);
        cr_assert(m1 == m2 || (isnan(m1) && isnan(m2)), "seed %llu n %d: max %g vs %g", (unsigned long long)seed,
                  n, (double)m1, (double)m2);
        if (n > 0) {
            float v = x[trng_next(&r) % (uint64_t)n];
            cr_assert_eq(sc.first_eq(x, n, v), vk.first_eq(x, n, v), "seed %llu", (unsigned long long)seed);
        }
        cr_assert_eq(sc.first_eq(x, n, 12345.0f), -1);
        cr_assert_eq(vk.first_eq(x, n, 12345.0f), -1);
        if (m1 > -INFINITY) {
            float scale = (float)(0.1 + trng_u(&r) * 3.0);
            double s1 = sc.expsum(x, n, m1, scale, o1);
            double s2 = vk.expsum(x, n, m1, scale, o2);
            cr_assert(fabs(s1 - s2) <= 1e-12 * s1, "seed %llu: sums %.17g vs %.17g", (unsigned long long)seed, s1, s2);
            cr_assert_eq(memcmp(o1, o2, (size_t)n * sizeof(float)), 0, "seed %llu: exponentials differ",
                         (unsigned long long)seed);
            cr_assert_eq(vk.expsum(x, n, m1, scale, NULL), s2);
            /* against libm in double */
            double ref = 0;
            for (int32_t i = 0; i < n; i++) if (!isnan(x[i])) ref += exp(((double)x[i] - m1) * scale);
            cr_assert(fabs(s1 - ref) <= 1e-6 * ref, "seed %llu: sum %.17g vs libm %.17g", (unsigned long long)seed,
                      s1, ref);
        }
        free(x);
        free(o1);
        free(o2);
    }
}
