/* ngram.c: the n-gram (prompt lookup) proposer (see ngram_internal.h). */
#include "server/sched/ngram_internal.h"

#include <string.h>

/* The start of the most recent earlier occurrence of the n-gram toks[len - n .. len), or -1. */
static int32_t last_occurrence(const int32_t *toks, int32_t len, int32_t n) {
    const int32_t *suf = toks + len - n;
    for (int32_t i = len - n - 1; i >= 0; i--) {
        if (toks[i] != suf[0] || toks[i + n - 1] != suf[n - 1]) continue;
        if (memcmp(toks + i, suf, (size_t)n * sizeof *toks) == 0) return i;
    }
    return -1;
}

int32_t srv_ngram_propose(const int32_t *toks, int32_t len, int32_t n_min, int32_t n_max, int32_t k, int32_t *out) {
    if (!toks || !out || len < 2 || k < 1 || n_min < 1 || n_max < n_min) return 0;
    if (n_max > len - 1) n_max = len - 1;
    for (int32_t n = n_max; n >= n_min; n--) {
        int32_t at = last_occurrence(toks, len, n);
        if (at < 0) continue;
        int32_t d = len - n - at; /* the period: token len + j is guessed to equal token len + j - d */
        for (int32_t j = 0; j < k; j++) out[j] = j < d ? toks[len - d + j] : out[j - d];
        return k;
    }
    return 0;
}
