/* test_cuda_sample_host.cpp: GPU sampling's per-row logic (cuda/cud_sample.cuh) compiled for the host, on every
 * machine: whole k_sample blocks run by smp_host_exec (the block's threads one after another, shared memory as
 * an array, the reductions in the kernel's tree order) against eng_sampler_sample on the CPU.
 *  - eng_smp_exp and the RNG seeding: bit for bit;
 *  - random rows (vocabularies 1 .. 40000, ties, -inf and NaN logits) under greedy, temperature, top-k on both
 *    sides of 256, top-p, min-p, their combinations, logit bias (bans included), repetition / presence /
 *    frequency penalties over a window, grammar bitmasks (all banned included), several steps per sampler with
 *    its state carried: the same token, status and RNG stream; the chosen token's logprob and the top-N within
 *    1e-5 (the log-sum-exp's double sum is in another order: ~1e-15 relative). */
#include <criterion/criterion.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "common/common.h"
#include "engine/engine.h"
#include "engine/kernels/sampler_kernels.h"
#include "cuda/cud_sample.h"
}
#include "cuda/cud_sample.cuh"

Test(cuda_sample_host, exp_and_seed_bit_for_bit) {
    std::mt19937 g(1);
    std::uniform_real_distribution<float> U(-100.0f, 100.0f);
    static const float edge[16] = {0.0f, -0.0f, -INFINITY, INFINITY, NAN, -87.3365478515625f, 88.0f, 88.5f,
                                   -87.34f, 1e-30f, -1e-30f, 0.5f, -0.5f, 1.0f, -1.0f, -20.0f};
    for (int i = 0; i < 2000000; i++) {
        float x = i < 16 ? edge[i] : (i & 1 ? U(g) : U(g) * 0.01f);
        float a = smp_exp(x), b = eng_smp_exp(x);
        cr_assert(memcmp(&a, &b, 4) == 0, "exp(%a): %a vs %a", (double)x, (double)a, (double)b);
    }
    uint64_t s1[4], s2[4];
    cud_sample_rng_seed(42, s1);
    eng_rng_seed(s2, 42);
    cr_assert(memcmp(s1, s2, sizeof s1) == 0);
}

namespace {
struct rowcase {
    int32_t n;
    std::vector<float> logits;
    std::vector<uint32_t> mask; // empty: none
    eng_sampling_params p;
    std::vector<eng_logit_bias> bias;
    std::vector<int32_t> history;
};

// The penalty window's distinct tokens and counts, as the CPU sampler keeps them.
void window_counts(const rowcase &c, std::vector<int32_t> &tok, std::vector<int32_t> &cnt) {
    tok.clear();
    cnt.clear();
    const eng_sampling_params &p = c.p;
    bool on = p.penalty_last_n != 0 &&
              (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f);
    if (!on) return;
    size_t from = 0;
    if (p.penalty_last_n > 0 && c.history.size() > (size_t)p.penalty_last_n) from = c.history.size() - (size_t)p.penalty_last_n;
    for (size_t i = from; i < c.history.size(); i++) {
        int32_t t = c.history[i];
        size_t j = 0;
        while (j < tok.size() && tok[j] != t) j++;
        if (j == tok.size()) { tok.push_back(t); cnt.push_back(0); }
        cnt[j]++;
    }
}

void run_case(rowcase &c, int steps, const char *what, int *n_draws) {
    eng_sampler *s = nullptr;
    cr_assert_eq(eng_sampler_create(&c.p, c.n, &s), 0);
    for (int32_t t : c.history) eng_sampler_accept(s, t);
    uint64_t rng[4];
    cud_sample_rng_seed(c.p.seed, rng);
    std::vector<float> work((size_t)c.n), masked(c.logits);
    if (!c.mask.empty())
        for (int32_t i = 0; i < c.n; i++) if (!((c.mask[(size_t)i >> 5] >> (i & 31)) & 1u)) masked[(size_t)i] = -INFINITY;
    std::vector<int32_t> bt;
    std::vector<float> bv;
    for (auto &b : c.bias) { bt.push_back(b.token); bv.push_back(b.bias); }
    static smp_host_exec ex;
    for (int step = 0; step < steps; step++) {
        std::vector<float> l(masked); // the scheduler applies the mask, then the sampler runs
        eng_sample want;
        int rc = eng_sampler_sample(s, l.data(), &want);
        std::vector<int32_t> pt, pc;
        window_counts(c, pt, pc);
        smp_row_args a = {c.logits.data(), c.mask.empty() ? nullptr : c.mask.data(), work.data(), c.n,
                          c.p.temperature, c.p.top_p, c.p.min_p, c.p.repetition_penalty, c.p.presence_penalty,
                          c.p.frequency_penalty, c.p.top_k, c.p.n_top_logprobs, bt.data(), bv.data(),
                          (int32_t)bt.size(), pt.data(), pc.data(), (int32_t)pt.size()};
        smp_row_out o;
        memcpy(o.rng, rng, sizeof rng);
        smp_row(ex, a, o);
        const eng_sampling_params &p = c.p;
        cr_assert_eq(rc == 0, o.status == 0, "%s n %d step %d: CPU rc %d, emulation status %d", what, c.n, step, rc,
                     o.status);
        if (rc != 0) break;
        cr_assert_eq(o.token, want.token,
                     "%s n %d step %d (T %g k %d p %g minp %g rep %g pres %g freq %g bias %zu mask %d): emulation "
                     "%d, CPU %d", what, c.n, step, (double)p.temperature, p.top_k, (double)p.top_p, (double)p.min_p,
                     (double)p.repetition_penalty, (double)p.presence_penalty, (double)p.frequency_penalty,
                     c.bias.size(), !c.mask.empty(), o.token, want.token);
        cr_assert(std::fabs(o.logprob - want.logprob) <= 1e-5f || o.logprob == want.logprob ||
                      (std::isnan(o.logprob) && std::isnan(want.logprob)), "%s: logprob %g vs %g",
                  what, (double)o.logprob, (double)want.logprob);
        cr_assert_eq(o.n_top, want.n_top);
        for (int j = 0; j < o.n_top; j++) {
            cr_assert_eq(o.top_token[j], want.top_token[j], "%s n %d top %d: %d vs %d", what, c.n, j, o.top_token[j],
                         want.top_token[j]);
            cr_assert(std::fabs(o.top_logprob[j] - want.top_logprob[j]) <= 1e-5f || o.top_logprob[j] == want.top_logprob[j] ||
                          (std::isnan(o.top_logprob[j]) && std::isnan(want.top_logprob[j])),
                      "%s top %d: %g vs %g", what, j, (double)o.top_logprob[j], (double)want.top_logprob[j]);
        }
        if (memcmp(o.rng, rng, sizeof rng) != 0) (*n_draws)++;
        memcpy(rng, o.rng, sizeof rng);
        c.history.push_back(want.token); // the CPU sampler accepted it itself
    }
    eng_sampler_free(s);
}

rowcase random_case(std::mt19937_64 &g, int mode) {
    std::uniform_real_distribution<float> U(0.0f, 1.0f);
    rowcase c;
    const int32_t sizes[] = {1, 2, 31, 32, 33, 511, 512, 513, 1000, 5000, 40000};
    c.n = sizes[g() % (sizeof sizes / sizeof sizes[0])];
    float scale = 0.3f + 8.0f * U(g);
    bool ties = g() % 3 == 0;
    c.logits.resize((size_t)c.n);
    for (int32_t i = 0; i < c.n; i++) {
        float v = (U(g) - 0.5f) * 2.0f * scale;
        if (ties) v = std::round(v * 2.0f) / 2.0f;
        if (g() % 61 == 0) v = -INFINITY;
        if (g() % 173 == 0) v = NAN;
        c.logits[(size_t)i] = v;
    }
    if (g() % 200 == 0) c.logits[(size_t)(g() % (uint64_t)c.n)] = INFINITY;
    eng_sampling_params_default(&c.p);
    c.p.seed = g();
    c.p.n_top_logprobs = (int32_t)(g() % 21);
    c.p.temperature = mode == 0 ? (g() % 2 ? 0.0f : -1.0f) : 0.05f + 3.0f * U(g);
    if (mode == 1 || mode == 4) c.p.top_k = 1 + (int32_t)(g() % 300);
    if (mode == 2) c.p.top_k = 1 + (int32_t)(g() % 6000);
    if (mode == 3 || mode == 4 || (mode == 2 && g() % 2)) c.p.top_p = g() % 10 == 0 ? 0.0f : 0.02f + 0.97f * U(g);
    if (mode == 5 || (mode == 4 && g() % 2)) c.p.min_p = g() % 10 == 0 ? 1.0f : 0.5f * U(g);
    if (g() % 3 == 0) {
        c.p.repetition_penalty = 0.5f + 1.5f * U(g);
        c.p.presence_penalty = g() % 2 ? 2.0f * (U(g) - 0.5f) : 0.0f;
        c.p.frequency_penalty = g() % 2 ? 2.0f * (U(g) - 0.5f) : 0.0f;
        c.p.penalty_last_n = (int32_t)(g() % 3) == 0 ? -1 : (int32_t)(g() % 12);
        for (int i = 0, k = (int)(g() % 30); i < k; i++) c.history.push_back((int32_t)(g() % (uint64_t)c.n));
    }
    if (g() % 3 == 0)
        for (int b = 0, k = 1 + (int)(g() % 8); b < k; b++) {
            float v = g() % 6 == 0 ? -INFINITY : (g() % 6 == 1 ? 100.0f : 20.0f * (U(g) - 0.5f));
            int32_t t = (int32_t)(g() % (uint64_t)c.n);
            c.bias.push_back({t, v});
            if (g() % 4 == 0) c.bias.push_back({t, 1.5f}); // a repeated token adds up
        }
    c.p.logit_bias = c.bias.data();
    c.p.n_logit_bias = c.bias.size();
    if (g() % 3 == 0) {
        c.mask.assign(((size_t)c.n + 31) / 32, 0u);
        uint64_t keep = 1 + g() % 8;
        for (int32_t i = 0; i < c.n; i++) if (g() % keep == 0) c.mask[(size_t)i >> 5] |= 1u << (i & 31);
        if (g() % 10 == 0) std::fill(c.mask.begin(), c.mask.end(), 0u);
    }
    return c;
}
} // namespace

Test(cuda_sample_host, rows_equal_the_cpu_sampler) {
    std::mt19937_64 g(2025);
    const char *names[] = {"greedy", "top-k<=256", "top-k", "top-p", "top-k+p+min-p", "min-p", "temperature"};
    int draws = 0;
    for (int it = 0; it < 700; it++) {
        int mode = it % 7;
        rowcase c = random_case(g, mode);
        c.p.logit_bias = c.bias.data();
        run_case(c, 3, names[mode], &draws);
    }
    cr_assert_gt(draws, 600, "the RNG stream was exercised (%d draws)", draws);
}

/* The draw itself: a flat row (every token kept, the cumulative walk decides) over many seeds. */
Test(cuda_sample_host, flat_rows_many_seeds) {
    std::mt19937_64 g(7);
    int draws = 0;
    for (int it = 0; it < 200; it++) {
        rowcase c;
        c.n = 300 + (int32_t)(g() % 3000);
        c.logits.assign((size_t)c.n, 0.0f);
        for (int32_t i = 0; i < c.n; i++) c.logits[(size_t)i] = (float)(g() % 3) * 0.25f;
        eng_sampling_params_default(&c.p);
        c.p.seed = g();
        c.p.temperature = 1.0f;
        if (it % 2) c.p.top_p = 0.9f;
        if (it % 3 == 1) c.p.top_k = 200;
        run_case(c, 4, "flat", &draws);
    }
    cr_assert_gt(draws, 700);
}
