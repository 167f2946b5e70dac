/*
 * sampler.c: token sampling (engine.h, eng_sampler_* and eng_sampling_params_default).
 *
 * One step of eng_sampler_sample, in order:
 *   1. log-probabilities of the RAW logits (before any transform, logit bias included): the log-sum-exp over
 *      the whole vocabulary with max subtraction (exponentials summed in double), and the n_top_logprobs best
 *      tokens by raw logit (a bounded insertion list; ties: the lower id first). eng_sample.logprob and
 *      top_* report these.
 *   2. logit bias: added to the logits (a bias of -INFINITY, or any bias that makes a logit -inf, bans the
 *      token; a bias of -100 makes it practically impossible, as in the OpenAI API).
 *   3. penalties over the tokens in the history window (the last penalty_last_n accepted tokens; -1: all of
 *      them; 0: none): repetition penalty (llama.cpp meaning: a seen token's logit is divided by the penalty
 *      when > 0, multiplied by it otherwise), then frequency / presence (OpenAI meaning:
 *      logit -= count * frequency_penalty + (count > 0) * presence_penalty).
 *   4. temperature <= 0: greedy, the argmax of the transformed logits (ties: the lowest id). O(n_vocab).
 *      temperature > 0: logits / temperature, then top-k, then top-p (smallest set of the most likely tokens
 *      whose probability reaches top_p, on the tempered distribution restricted to the top-k set), then min-p
 *      (keeps tokens whose probability is >= min_p times the most likely token's), then one draw from the
 *      renormalized kept set with the sampler's RNG, walking the kept tokens in id order (u = uniform * their
 *      total mass; the first token whose cumulative mass exceeds u; the GPU sampler draws the same way). Temperature is applied BEFORE the filters (the
 *      HF transformers / vLLM order; llama.cpp's default chain applies it after them).
 *   5. the chosen token is appended to the penalty history.
 * Logits that are NaN count as -inf (a bias that turns a logit into NaN, -inf + inf, bans it). When every
 * logit is -inf after the transforms, sampling fails with ENG_ERR_INVALID. A +inf logit takes all the mass.
 *
 * Cost: no allocation per call (work buffers of n_vocab floats and ids, and the penalty bookkeeping when a
 * penalty is on, are allocated in eng_sampler_create). The vocabulary-wide loops (max, first index of a
 * value, exponentials with their sum) are sampler_kernels.c's, AVX2 when the CPU has it. Greedy is O(n_vocab)
 * (a copy, the max, the first index of it, plus the raw log-sum-exp). top-k <= 256 uses a bounded heap
 * (one comparison for most tokens), larger k a quickselect; top-p finds, with a histogram of the probability
 * mass by binary exponent, the bucket where the cumulative mass reaches top_p and then runs a mass-guided
 * quickselect over the tokens of that bucket and above: O(n_vocab) expected; the kept set is put in id order for the
 * draw (a sort of at most 256 ids after a top-k <= 256, else one O(n_vocab) scan).
 * Probabilities use eng_smp_exp (relative error < 3.6e-7), exactly 1 for the most likely token.
 *
 * Parameters (eng_sampler_create returns ENG_ERR_INVALID otherwise): n_vocab > 0; temperature, top_p not NaN;
 * min_p <= 1 (top_p <= 0 keeps only the most likely token); repetition_penalty finite and > 0; presence and
 * frequency penalties finite; penalty_last_n >= -1; n_top_logprobs 0..20; every logit_bias token in
 * [0, n_vocab) with a non-NaN bias. ENG_ERR_NOMEM when an allocation fails. eng_sampler_accept ignores ids
 * outside [0, n_vocab).
 *
 * RNG: xoshiro256** seeded through splitmix64 from params->seed; same seed and same logits give the same tokens.
 */
#include "engine/engine.h"
#include "engine/kernels/rng.h"
#include "engine/kernels/sampler_kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the sampler ------------------------------------------------------------------------------------------- */
struct eng_sampler {
    eng_sampling_params p;     /* copy; p.logit_bias points at bias below */
    int32_t n_vocab;
    eng_logit_bias *bias;      /* [n_bias] */
    size_t n_bias;
    uint64_t rng[4];           /* xoshiro256** state (engine/kernels/rng.h), seeded from p.seed */

    eng_smp_kernels k;         /* vocabulary-wide loops (scalar or AVX2, chosen at create) */
    float *work;               /* [n_vocab] transformed logits, then probabilities */
    int32_t *idx;              /* [n_vocab] candidate ids */

    /* penalty bookkeeping (NULL when no penalty is on) */
    bool penalties;
    int32_t *count;            /* [n_vocab] occurrences in the window */
    int32_t *seen;             /* [n_seen] distinct tokens with count > 0 */
    int32_t *seen_pos;         /* [n_vocab] position of a token in seen, -1 when absent */
    int32_t n_seen;
    int32_t *ring;             /* [penalty_last_n] the window when it is bounded */
    int32_t ring_len, ring_head;
};

void eng_sampling_params_default(eng_sampling_params *p) {
    if (!p) return;
    memset(p, 0, sizeof(*p));
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->penalty_last_n = -1;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->seed = 0;
    p->logit_bias = NULL;
    p->n_logit_bias = 0;
    p->n_top_logprobs = 0;
}

void eng_sampler_free(eng_sampler *s) {
    if (!s) return;
    KVS_FREE_ALL(s->bias, s->work, s->idx, s->count, s->seen, s->seen_pos, s->ring, s);
}

int eng_sampler_create(const eng_sampling_params *params, int32_t n_vocab, eng_sampler **out) {
    if (out) *out = NULL;
    if (!params || !out || n_vocab <= 0) return ENG_ERR_INVALID;
    const eng_sampling_params *p = params;
    if (isnan(p->temperature) || isnan(p->top_p) || isnan(p->min_p) || p->min_p > 1.0f || !isfinite(p->repetition_penalty) ||
        p->repetition_penalty <= 0.0f || !isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty) ||
        p->penalty_last_n < -1 || p->n_top_logprobs < 0 || p->n_top_logprobs > KVS_MAX_TOP_LOGPROBS ||
        (p->n_logit_bias > 0 && !p->logit_bias))
        return ENG_ERR_INVALID;
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= n_vocab || isnan(p->logit_bias[i].bias))
            return ENG_ERR_INVALID;
    }

    eng_sampler *s = calloc(1, sizeof(*s));
    if (!s) return ENG_ERR_NOMEM;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->p.logit_bias = NULL;
    s->p.n_logit_bias = 0;
    if (p->n_logit_bias > 0) {
        s->bias = malloc(p->n_logit_bias * sizeof(*s->bias));
        if (!s->bias) goto nomem;
        memcpy(s->bias, p->logit_bias, p->n_logit_bias * sizeof(*s->bias));
        s->n_bias = p->n_logit_bias;
        s->p.logit_bias = s->bias;
        s->p.n_logit_bias = s->n_bias;
    }
    s->work = malloc((size_t)n_vocab * sizeof(float));
    s->idx = malloc((size_t)n_vocab * sizeof(int32_t));
    if (!s->work || !s->idx) goto nomem;

    s->penalties = p->penalty_last_n != 0 &&
                   (p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);
    if (s->penalties) {
        s->count = calloc((size_t)n_vocab, sizeof(int32_t));
        s->seen = malloc((size_t)n_vocab * sizeof(int32_t));
        s->seen_pos = malloc((size_t)n_vocab * sizeof(int32_t));
        if (!s->count || !s->seen || !s->seen_pos) goto nomem;
        for (int32_t i = 0; i < n_vocab; i++) s->seen_pos[i] = -1;
        if (p->penalty_last_n > 0) {
            s->ring = malloc((size_t)p->penalty_last_n * sizeof(int32_t));
            if (!s->ring) goto nomem;
        }
    }
    eng_rng_seed(s->rng, p->seed);
    eng_smp_kernels_best(&s->k);
    *out = s;
    return ENG_OK;
nomem:
    eng_sampler_free(s);
    return ENG_ERR_NOMEM;
}

static void count_add(eng_sampler *s, int32_t t) {
    if (s->count[t]++ == 0) {
        s->seen_pos[t] = s->n_seen;
        s->seen[s->n_seen++] = t;
    }
}

static void count_remove(eng_sampler *s, int32_t t) {
    if (--s->count[t] == 0) {
        int32_t pos = s->seen_pos[t];
        int32_t last = s->seen[--s->n_seen];
        s->seen[pos] = last;
        s->seen_pos[last] = pos;
        s->seen_pos[t] = -1;
    }
}

void eng_sampler_accept(eng_sampler *s, int32_t token) {
    if (!s || !s->penalties || token < 0 || token >= s->n_vocab) return;
    int32_t n = s->p.penalty_last_n;
    if (n < 0) {
        if (s->count[token] == INT32_MAX) return; /* cannot happen in practice; keeps the counter defined */
        count_add(s, token);
        return;
    }
    if (s->ring_len == n) { /* evict the oldest */
        count_remove(s, s->ring[s->ring_head]);
        s->ring[s->ring_head] = token;
        s->ring_head = (s->ring_head + 1) % n;
    } else {
        s->ring[(s->ring_head + s->ring_len) % n] = token;
        s->ring_len++;
    }
    count_add(s, token);
}

/* Candidate order: higher logit first, then lower id (a strict total order, so results are deterministic). */
static inline bool better(const float *l, int32_t a, int32_t b) {
    return l[a] > l[b] || (l[a] == l[b] && a < b);
}

/* Rearranges idx[lo..hi) so that its first k (k <= hi-lo) entries are the k best by `better` (in any order). */
static void select_top(const float *l, int32_t *idx, int32_t lo, int32_t hi, int32_t k) {
    int32_t target = lo + k; /* positions [lo, target) must hold the best */
    while (hi - lo > 1 && target > lo && target < hi) {
        /* median of three as the pivot */
        int32_t mid = lo + (hi - lo) / 2;
        int32_t a = idx[lo], b = idx[mid], c = idx[hi - 1];
        int32_t piv;
        if (better(l, a, b)) piv = better(l, b, c) ? b : (better(l, a, c) ? c : a);
        else piv = better(l, a, c) ? a : (better(l, b, c) ? c : b);
        /* three-way split is unnecessary: the order is strict, so only the pivot itself compares equal */
        int32_t i = lo, j = hi - 1;
        while (i <= j) {
            while (better(l, idx[i], piv)) i++;
            while (better(l, piv, idx[j])) j--;
            if (i <= j) {
                int32_t t = idx[i]; idx[i] = idx[j]; idx[j] = t;
                i++; j--;
            }
        }
        /* now [lo, j] are >= pivot side, [i, hi) are <= pivot side, (j, i) equal the pivot */
        if (target <= j + 1) hi = j + 1;
        else if (target >= i) lo = i;
        else return;
    }
}

static inline float clean(float x) { return isnan(x) ? -INFINITY : x; }

/* Raw log-probabilities: the log-sum-exp (max subtraction, double sum) and the n_top best by raw logit, best
 * first (an insertion list: one comparison for most tokens). */
static void raw_logprobs(const eng_smp_kernels *k, const float *logits, int32_t n_vocab, int32_t n_top,
                         double *lse_out, eng_sample *out) {
    float m = k->max(logits, n_vocab);
    if (isfinite(m)) *lse_out = (double)m + log(k->expsum(logits, n_vocab, m, 1.0f, NULL));
    else *lse_out = m; /* every logit is -inf or NaN (-inf), or one is +inf (+inf) */

    int32_t cnt = 0;
    if (n_top > n_vocab) n_top = n_vocab;
    float worst = -INFINITY; /* value of the last kept entry when the list is full */
    for (int32_t i = 0; i < n_vocab && n_top > 0; i++) {
        if (cnt == n_top && !(logits[i] > worst)) continue; /* ties keep the lower id, which came first */
        float v = clean(logits[i]);
        if (cnt == n_top) cnt--;
        int32_t j = cnt;
        while (j > 0 && v > clean(logits[out->top_token[j - 1]])) {
            out->top_token[j] = out->top_token[j - 1];
            j--;
        }
        out->top_token[j] = i;
        cnt++;
        worst = clean(logits[out->top_token[cnt - 1]]);
    }
    out->n_top = cnt;
    for (int32_t j = 0; j < cnt; j++) {
        double v = clean(logits[out->top_token[j]]);
        out->top_logprob[j] = (float)(v - *lse_out);
    }
}

static void apply_penalties(eng_sampler *s, float *l) {
    const float rep = s->p.repetition_penalty;
    const float freq = s->p.frequency_penalty;
    const float pres = s->p.presence_penalty;
    for (int32_t i = 0; i < s->n_seen; i++) {
        int32_t t = s->seen[i];
        int32_t c = s->count[t];
        float v = l[t];
        if (rep != 1.0f) v = v > 0.0f ? v / rep : v * rep;
        v -= (float)c * freq + pres;
        l[t] = v;
    }
}

/* The k best valid (> -inf, not NaN) tokens of l by `better`, into idx[0..) in heap order; returns how many
 * (k, or fewer when fewer are valid). A bounded heap whose root is the worst kept: most tokens cost one
 * comparison. */
static int32_t heap_top(const float *l, int32_t n, int32_t k, int32_t *idx) {
    int32_t cnt = 0;
    float root_v = -INFINITY; /* l of the heap's root (the worst kept) */
    for (int32_t i = 0; i < n; i++) {
        if (!(l[i] > -INFINITY)) continue;
        int32_t pos;
        if (cnt < k) { /* sift up */
            pos = cnt++;
            while (pos > 0) {
                int32_t parent = (pos - 1) / 2;
                if (!better(l, idx[parent], i)) break;
                idx[pos] = idx[parent];
                pos = parent;
            }
            idx[pos] = i;
            root_v = l[idx[0]];
            continue;
        }
        if (!(l[i] >= root_v) || !better(l, i, idx[0])) continue; /* most tokens stop at the first test */
        pos = 0; /* replace the root, sift down */
        for (;;) {
            int32_t c = 2 * pos + 1;
            if (c >= cnt) break;
            if (c + 1 < cnt && better(l, idx[c], idx[c + 1])) c++;
            if (!better(l, i, idx[c])) break;
            idx[pos] = idx[c];
            pos = c;
        }
        idx[pos] = i;
        root_v = l[idx[0]];
    }
    return cnt;
}

/* top-p over candidates idx[0..nc) with probabilities p[] (unnormalized, total `sum`): moves the smallest
 * best-first set whose mass reaches target to the front of idx (in no particular order) and returns its size.
 * A quickselect that partitions by rank and descends on mass: O(nc) expected, no sort. */
static int32_t top_p_select(const float *p, int32_t *idx, int32_t nc, double target) {
    if (!(target > 0.0)) { /* top_p <= 0: only the most likely token */
        select_top(p, idx, 0, nc, 1);
        return 1;
    }
    int32_t lo = 0, hi = nc;
    double acc = 0.0; /* mass of idx[0..lo), all in the set */
    while (hi - lo > 1) {
        /* median of three pivot, moved to hi - 1 */
        int32_t mid = lo + (hi - lo) / 2;
        int32_t a = idx[lo], b = idx[mid], c = idx[hi - 1];
        int32_t pv_pos;
        if (better(p, a, b)) pv_pos = better(p, b, c) ? mid : (better(p, a, c) ? hi - 1 : lo);
        else pv_pos = better(p, a, c) ? lo : (better(p, b, c) ? hi - 1 : mid);
        int32_t piv = idx[pv_pos];
        idx[pv_pos] = idx[hi - 1];
        idx[hi - 1] = piv;
        /* Lomuto: [lo, w) better than the pivot */
        int32_t w = lo;
        double mass = 0.0;
        for (int32_t i = lo; i < hi - 1; i++) {
            if (better(p, idx[i], piv)) {
                int32_t t = idx[i]; idx[i] = idx[w]; idx[w] = t;
                mass += p[idx[w]];
                w++;
            }
        }
        idx[hi - 1] = idx[w];
        idx[w] = piv;
        if (acc + mass >= target) {
            hi = w;                       /* the cut lies among the better ones */
            if (hi == lo) return lo;      /* unreachable with target > acc; kept as a guard */
        } else if (acc + mass + p[piv] >= target) {
            return w + 1;                 /* the pivot completes the mass */
        } else {
            acc += mass + p[piv];
            lo = w + 1;
        }
    }
    return hi; /* one candidate left (or none): it is needed, or everything is */
}

static int cmp_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Puts the kept tokens idx[0..*nc) in id order, the order of the draw (the GPU sampler, cuda/cud_sample.cuh,
 * walks them so). After a top-k <= 256 (from_heap) there are at most 256: a sort. Otherwise l[0..n) holds
 * probabilities (>= +0) for every token: the kept ones are marked by their sign bit and collected by one scan. */
static void ids_in_order(float *l, int32_t *idx, int32_t *nc, int32_t n, bool from_heap) {
    if (from_heap) {
        qsort(idx, (size_t)*nc, sizeof *idx, cmp_id);
        return;
    }
    for (int32_t i = 0; i < *nc; i++) l[idx[i]] = -l[idx[i]]; /* +0 becomes -0: still marked */
    int32_t w = 0;
    for (int32_t i = 0; i < n; i++) {
        if (signbit(l[i])) {
            l[i] = -l[i];
            idx[w++] = i;
        }
    }
    *nc = w;
}

/* Top-p only: a histogram of the mass by binary exponent of the probability finds the exponent bucket where the
 * best-first cumulative mass reaches target; the set lies among the tokens of that bucket and above (they outrank
 * all others), usually a small fraction of the vocabulary. l[0..n) holds probabilities in [0, 1], the best at 1.
 * Writes the candidates' ids to idx in id order and returns their count (>= 1). */
static int32_t top_p_candidates(const float *l, int32_t n, double target, int32_t *idx) {
    double bucket[256] = { 0 };
    for (int32_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &l[i], sizeof(bits));
        bucket[bits >> 23] += l[i]; /* l[i] in [0, 1]: the sign bit is clear */
    }
    uint32_t cut = 1; /* default: every nonzero probability */
    double acc = 0.0;
    for (uint32_t e = 255; e >= 1; e--) {
        acc += bucket[e];
        if (acc >= target) { cut = e; break; }
    }
    const uint32_t min_bits = cut << 23;
    int32_t nc = 0;
    for (int32_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &l[i], sizeof(bits));
        if (bits >= min_bits) idx[nc++] = i;
    }
    if (nc == 0) { /* defensive: the best token has probability 1, exponent 127 >= cut */
        for (int32_t i = 0; i < n; i++) if (l[i] > 0.0f) idx[nc++] = i;
    }
    return nc;
}

int eng_sampler_sample(eng_sampler *s, float *logits, eng_sample *out) {
    if (!s || !logits || !out) return ENG_ERR_INVALID;
    const int32_t n = s->n_vocab;
    memset(out, 0, sizeof(*out));

    double lse;
    raw_logprobs(&s->k, logits, n, s->p.n_top_logprobs, &lse, out);

    /* transformed logits; NaN stays NaN and every comparison below treats it as -inf */
    float *l = s->work;
    memcpy(l, logits, (size_t)n * sizeof(float));
    for (size_t i = 0; i < s->n_bias; i++) l[s->bias[i].token] += s->bias[i].bias; /* -inf + inf: NaN, banned */
    if (s->penalties) apply_penalties(s, l);

    int32_t chosen = -1;
    const float m = s->k.max(l, n);
    if (!(m > -INFINITY)) return ENG_ERR_INVALID; /* everything banned */
    if (!(s->p.temperature > 0.0f) || m == INFINITY) {
        /* greedy; or a +inf logit, which takes all the mass: the lowest id holding the maximum */
        chosen = s->k.first_eq(l, n, m);
        goto done;
    }

    const float inv_t = 1.0f / s->p.temperature;
    int32_t *idx = s->idx;
    int32_t nc = -1; /* candidates in idx[0..nc); -1: all tokens, probabilities in l[] */
    double sum = 0.0;
    const bool from_heap = s->p.top_k > 0 && s->p.top_k <= 256;
    if (from_heap) {
        /* top-k on the untempered logits (tempering is monotonic: same set, and top_k = 1 stays greedy
         * even where tempering would round two logits to one value) */
        nc = heap_top(l, n, s->p.top_k, idx);
        for (int32_t i = 0; i < nc; i++) {
            float e = eng_smp_exp((l[idx[i]] - m) * inv_t);
            l[idx[i]] = e;
            sum += e;
        }
    } else {
        /* unnormalized probabilities e^((l - max) / T) in [0, 1] for the whole vocabulary, the best at 1 */
        sum = s->k.expsum(l, n, m, inv_t, l);
        if (s->p.top_k <= 0 && s->p.top_p < 1.0f) {
            nc = top_p_candidates(l, n, (double)s->p.top_p * sum, idx);
        } else if (s->p.top_k > 0) {
            nc = 0;
            for (int32_t i = 0; i < n; i++) if (l[i] > 0.0f) idx[nc++] = i;
            if (s->p.top_k > 0 && s->p.top_k < nc) {
                /* probabilities rank like the logits except where they round to equal values (ties by id) */
                select_top(l, idx, 0, nc, s->p.top_k);
                nc = s->p.top_k;
                sum = 0.0;
                for (int32_t i = 0; i < nc; i++) sum += l[idx[i]];
            }
        }
    }
    if (s->p.top_p < 1.0f && nc > 1) nc = top_p_select(l, idx, nc, (double)s->p.top_p * sum);

    /* min-p relative to the most likely token, whose value is exactly 1 (and it always stays: min_p <= 1) */
    const float thr = s->p.min_p > 0.0f ? s->p.min_p : 0.0f;
    double total = 0.0;
    if (nc >= 0) {
        if (thr > 0.0f) {
            int32_t w = 0;
            for (int32_t i = 0; i < nc; i++) if (l[idx[i]] >= thr) idx[w++] = idx[i];
            nc = w;
        }
        if (nc == 0) return ENG_ERR_INVALID; /* unreachable: the best token is always kept */
        ids_in_order(l, idx, &nc, n, from_heap);
        for (int32_t i = 0; i < nc; i++) total += l[idx[i]];
        double u = eng_rng_uniform(s->rng) * total, acc = 0.0;
        chosen = idx[nc - 1];
        for (int32_t i = 0; i < nc; i++) {
            acc += l[idx[i]];
            if (u < acc) { chosen = idx[i]; break; }
        }
    } else {
        if (thr > 0.0f) {
            for (int32_t i = 0; i < n; i++) if (l[i] >= thr) total += l[i];
        } else {
            total = sum;
        }
        double u = eng_rng_uniform(s->rng) * total, acc = 0.0;
        for (int32_t i = 0; i < n; i++) {
            if (l[i] > 0.0f && l[i] >= thr) {
                chosen = i;
                acc += l[i];
                if (u < acc) break;
            }
        }
    }
    if (chosen < 0) return ENG_ERR_INVALID; /* unreachable */
done:
    out->token = chosen;
    out->logprob = (float)((double)clean(logits[chosen]) - lse);
    eng_sampler_accept(s, chosen);
    return ENG_OK;
}
