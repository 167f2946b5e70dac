/* test_ngram.c: the n-gram (prompt lookup) proposer of speculative decoding (server/sched/ngram.c) against a
 * plain reference on random sequences over small alphabets (so that matches of every length occur), plus the
 * cases a server meets: periodic output, no match, argument limits. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "server/sched/ngram_internal.h"

/* The reference: the definition, written as directly as possible. For n from n_max down to n_min: the largest
 * start i < len - n with toks[i .. i+n) == toks[len-n .. len); the guesses continue the sequence as if it
 * repeated from there: s[len + j] = s[i + n + j] over the sequence extended by the guesses. */
static int32_t ref_propose(const int32_t *toks, int32_t len, int32_t n_min, int32_t n_max, int32_t k, int32_t *out) {
    static int32_t ext[4096];
    for (int32_t n = n_max; n >= n_min; n--) {
        if (n > len - 1) continue;
        for (int32_t i = len - n - 1; i >= 0; i--) {
            int32_t same = 1;
            for (int32_t t = 0; t < n; t++)
                if (toks[i + t] != toks[len - n + t]) same = 0;
            if (!same) continue;
            memcpy(ext, toks, (size_t)len * sizeof *ext);
            for (int32_t j = 0; j < k; j++) ext[len + j] = ext[i + n + j];
            memcpy(out, ext + len, (size_t)k * sizeof *out);
            return k;
        }
    }
    return 0;
}

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

Test(ngram, random_against_reference) {
    int32_t toks[1024], got[40], want[40];
    int64_t matched = 0;
    for (int it = 0; it < 20000; it++) {
        int32_t len = 2 + (int32_t)rnd(it % 10 == 0 ? 1000 : 60);
        int32_t alpha = 2 + (int32_t)rnd(it % 3 == 0 ? 4 : 300);
        for (int32_t i = 0; i < len; i++) toks[i] = (int32_t)rnd((uint32_t)alpha);
        if (it % 4 == 0 && len > 8) { /* a copied stretch: the lookup's real case */
            int32_t a = (int32_t)rnd((uint32_t)(len / 2)), n = 1 + (int32_t)rnd((uint32_t)(len - a - 1));
            int32_t at = len - n;
            if (at > a) memmove(toks + at, toks + a, (size_t)n * sizeof *toks);
        }
        int32_t n_min = 1 + (int32_t)rnd(4), n_max = n_min + (int32_t)rnd(5), k = 1 + (int32_t)rnd(32);
        memset(got, 0x7f, sizeof got);
        int32_t ng = srv_ngram_propose(toks, len, n_min, n_max, k, got);
        int32_t nw = ref_propose(toks, len, n_min, n_max, k, want);
        cr_assert_eq(ng, nw, "it %d: len %d n %d..%d k %d: %d guesses, the reference %d", it, len, n_min, n_max, k, ng,
                     nw);
        cr_assert(memcmp(got, want, (size_t)ng * sizeof *got) == 0, "it %d: guesses differ from the reference", it);
        cr_assert_eq(got[ng], 0x7f7f7f7f, "it %d: wrote past its count", it);
        matched += ng > 0;
    }
    cr_assert_gt(matched, 5000, "too few cases had a match to mean anything");
}

Test(ngram, periodic_sequence_continues_its_period) {
    int32_t toks[64], out[16];
    for (int32_t i = 0; i < 10; i++) toks[i] = 5 + i % 3; /* 5 6 7 5 6 7 5 6 7 5 */
    cr_assert_eq(srv_ngram_propose(toks, 10, 2, 4, 7, out), 7);
    int32_t want[7] = {6, 7, 5, 6, 7, 5, 6};
    cr_assert(memcmp(out, want, sizeof want) == 0);
    /* a constant run proposes more of the same */
    for (int32_t i = 0; i < 5; i++) toks[i] = 9;
    cr_assert_eq(srv_ngram_propose(toks, 5, 2, 4, 5, out), 5);
    for (int32_t j = 0; j < 5; j++) cr_assert_eq(out[j], 9);
}

Test(ngram, longest_ngram_wins_over_a_more_recent_short_one) {
    /* "1 2 3 9 ... 8 3 4 ... 1 2 3": the 3-gram 1 2 3 occurred at 0 (followed by 9); the 1-gram 3 more recently
     * (followed by 4) */
    int32_t toks[] = {1, 2, 3, 9, 8, 3, 4, 1, 2, 3}, out[4];
    cr_assert_eq(srv_ngram_propose(toks, 10, 1, 3, 1, out), 1);
    cr_assert_eq(out[0], 9);
    cr_assert_eq(srv_ngram_propose(toks, 10, 1, 1, 1, out), 1);
    cr_assert_eq(out[0], 4);
}

Test(ngram, no_match_and_bad_arguments) {
    int32_t toks[] = {1, 2, 3, 4, 5, 6}, out[4];
    cr_assert_eq(srv_ngram_propose(toks, 6, 1, 3, 4, out), 0);
    cr_assert_eq(srv_ngram_propose(NULL, 6, 1, 3, 4, out), 0);
    cr_assert_eq(srv_ngram_propose(toks, 6, 1, 3, 4, NULL), 0);
    cr_assert_eq(srv_ngram_propose(toks, 1, 1, 3, 4, out), 0);
    cr_assert_eq(srv_ngram_propose(toks, 6, 0, 3, 4, out), 0);
    cr_assert_eq(srv_ngram_propose(toks, 6, 3, 2, 4, out), 0);
    cr_assert_eq(srv_ngram_propose(toks, 6, 1, 3, 0, out), 0);
    int32_t two[] = {7, 7};
    cr_assert_eq(srv_ngram_propose(two, 2, 1, 8, 3, out), 3); /* n_max is capped by what can recur */
    cr_assert(out[0] == 7 && out[1] == 7 && out[2] == 7);
}
