/*
 * sampler.c: token sampling (engine.h, eng_sampler_* and eng_sampling_params_default).
 *
 * One step of eng_sampler_sample, in order:
 *   1. log-probabilities of the RAW logits (before any transform, logit bias included): the log-sum-exp over
 *      the whole vocabulary with max subtraction (expf per logit, summed in double), and the n_top_logprobs best tokens by raw logit
 *      (a bounded insertion list, O(n_vocab * N) worst case, N <= 20). eng_sample.logprob / top_* report these.
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
 *      renormalized kept set with the sampler's RNG. Temperature is applied BEFORE the filters (the
 *      HF transformers / vLLM order; llama.cpp's default chain applies it after them).
 *   5. the chosen token is appended to the penalty history.
 * Logits that are NaN count as -inf. When every logit is -inf after the transforms, sampling fails with
 * ENG_ERR_INVALID.
 *
 * Work memory is allocated once in eng_sampler_create (a copy buffer and an index buffer of n_vocab each,
 * and the penalty bookkeeping when a penalty is on); a call allocates nothing. top-k and top-p use
 * quickselect partitions (O(n_vocab) expected) and sort only the selected prefix.
 *
 * RNG: xoshiro256** seeded through splitmix64 from params->seed; same seed and same logits give the same tokens.
 */
#include "engine/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- RNG: xoshiro256**, seeded with splitmix64 ------------------------------------------------------------- */
typedef struct eng_rng { uint64_t s[4]; } eng_rng;

static uint64_t splitmix64_next(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static void rng_seed(eng_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64_next(&x);
}

static uint64_t rng_next(eng_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(eng_rng *r) { return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

/* ---- the sampler ------------------------------------------------------------------------------------------- */
struct eng_sampler {
    eng_sampling_params p;     /* copy; p.logit_bias points at bias below */
    int32_t n_vocab;
    eng_logit_bias *bias;      /* [n_bias] */
    size_t n_bias;
    eng_rng rng;

    float *work;               /* [n_vocab] transformed logits */
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
    free(s->bias);
    free(s->work);
    free(s->idx);
    free(s->count);
    free(s->seen);
    free(s->seen_pos);
    free(s->ring);
    free(s);
}

int eng_sampler_create(const eng_sampling_params *params, int32_t n_vocab, eng_sampler **out) {
    if (out) *out = NULL;
    if (!params || !out || n_vocab <= 0) return ENG_ERR_INVALID;
    const eng_sampling_params *p = params;
    if (isnan(p->temperature) || isnan(p->top_p) || isnan(p->min_p) || p->min_p > 1.0f || !isfinite(p->repetition_penalty) ||
        p->repetition_penalty <= 0.0f || !isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty) ||
        p->penalty_last_n < -1 || p->n_top_logprobs < 0 || p->n_top_logprobs > 20 ||
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
    rng_seed(&s->rng, p->seed);
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

/* Sorts idx[0..n) best first by `better`: insertion sort for short runs, heap sort otherwise. */
static void sort_desc(const float *l, int32_t *idx, int32_t n) {
    if (n <= 32) {
        for (int32_t i = 1; i < n; i++) {
            int32_t v = idx[i], j = i;
            while (j > 0 && better(l, v, idx[j - 1])) { idx[j] = idx[j - 1]; j--; }
            idx[j] = v;
        }
        return;
    }
    /* heap sort: deterministic, in place, O(n log n), no allocation (qsort has no context argument in C11) */
    /* build a heap whose root is the WORST element, then pop to the end: yields best-first order */
    for (int32_t start = n / 2 - 1; start >= 0; start--) {
        int32_t root = start;
        for (;;) {
            int32_t child = 2 * root + 1;
            if (child >= n) break;
            if (child + 1 < n && better(l, idx[child], idx[child + 1])) child++;
            if (better(l, idx[root], idx[child])) {
                int32_t t = idx[root]; idx[root] = idx[child]; idx[child] = t;
                root = child;
            } else break;
        }
    }
    for (int32_t end = n - 1; end > 0; end--) {
        int32_t t = idx[0]; idx[0] = idx[end]; idx[end] = t;
        int32_t root = 0;
        for (;;) {
            int32_t child = 2 * root + 1;
            if (child >= end) break;
            if (child + 1 < end && better(l, idx[child], idx[child + 1])) child++;
            if (better(l, idx[root], idx[child])) {
                int32_t t2 = idx[root]; idx[root] = idx[child]; idx[child] = t2;
                root = child;
            } else break;
        }
    }
}

static inline float clean(float x) { return isnan(x) ? -INFINITY : x; }

/* Raw log-probabilities: log-sum-exp (double) and the top n by raw logit, best first. */
static void raw_logprobs(const float *logits, int32_t n_vocab, int32_t n_top, double *lse_out, eng_sample *out) {
    double m = -INFINITY;
    for (int32_t i = 0; i < n_vocab; i++) {
        float v = clean(logits[i]);
        if (v > m) m = v;
    }
    double sum = 0.0;
    if (isfinite(m)) {
        for (int32_t i = 0; i < n_vocab; i++) {
            float v = clean(logits[i]);
            if (v != -INFINITY) sum += (double)expf((float)((double)v - m));
        }
        *lse_out = m + log(sum);
    } else {
        *lse_out = m; /* every logit is -inf (or +inf: then the lse is +inf) */
    }

    int32_t k = 0;
    if (n_top > n_vocab) n_top = n_vocab;
    for (int32_t i = 0; i < n_vocab && n_top > 0; i++) {
        float v = clean(logits[i]);
        if (k == n_top) {
            int32_t w = out->top_token[k - 1];
            float wv = clean(logits[w]);
            if (!(v > wv)) continue; /* ties keep the lower id, which came first */
            k--;
        }
        int32_t j = k;
        while (j > 0) {
            float pv = clean(logits[out->top_token[j - 1]]);
            if (v > pv) { out->top_token[j] = out->top_token[j - 1]; j--; }
            else break;
        }
        out->top_token[j] = i;
        k++;
    }
    out->n_top = k;
    for (int32_t j = 0; j < k; j++) {
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

int eng_sampler_sample(eng_sampler *s, float *logits, eng_sample *out) {
    if (!s || !logits || !out) return ENG_ERR_INVALID;
    const int32_t n = s->n_vocab;
    memset(out, 0, sizeof(*out));

    double lse;
    raw_logprobs(logits, n, s->p.n_top_logprobs, &lse, out);

    float *l = s->work;
    for (int32_t i = 0; i < n; i++) l[i] = clean(logits[i]);
    for (size_t i = 0; i < s->n_bias; i++) {
        float v = l[s->bias[i].token] + s->bias[i].bias;
        l[s->bias[i].token] = isnan(v) ? -INFINITY : v; /* -inf + +inf: banned */
    }
    if (s->penalties) apply_penalties(s, l);

    int32_t chosen = -1;
    if (!(s->p.temperature > 0.0f)) {
        float best = -INFINITY;
        for (int32_t i = 0; i < n; i++) {
            if (l[i] > best) { best = l[i]; chosen = i; }
        }
        if (chosen < 0) return ENG_ERR_INVALID;
    } else {
        const double inv_t = 1.0 / (double)s->p.temperature;
        int32_t *idx = s->idx;
        int32_t nc = 0;
        float m = -INFINITY;
        for (int32_t i = 0; i < n; i++) {
            if (l[i] == -INFINITY) continue;
            if (l[i] > m) m = l[i];
            idx[nc++] = i;
        }
        if (nc == 0) return ENG_ERR_INVALID;
        if (m == INFINITY) { /* a +inf logit takes all the mass: the lowest such id */
            for (int32_t i = 0; i < nc; i++) {
                if (l[idx[i]] == INFINITY) { chosen = idx[i]; break; }
            }
            goto done;
        }
        /* top-k on the untempered logits (tempering is monotonic, so the set is the same, and this keeps
         * top_k = 1 identical to greedy even where tempering would round two logits to one value) */
        if (s->p.top_k > 0 && s->p.top_k < nc) {
            select_top(l, idx, 0, nc, s->p.top_k);
            nc = s->p.top_k;
        }
        /* unnormalized probabilities exp((l - max) / T) in (0, 1], the best token at exactly 1; l[] holds
         * them from here on. exp is monotonic, so `better` ranks the candidates the same way (ties broken by
         * id, also where distinct logits underflow to the same probability). */
        double sum = 0.0;
        for (int32_t i = 0; i < nc; i++) {
            float pv = expf((float)(((double)l[idx[i]] - (double)m) * inv_t));
            l[idx[i]] = pv;
            sum += pv;
        }
        if (s->p.top_p < 1.0f) {
            /* the smallest best-first prefix whose mass reaches top_p: select and sort growing chunks
             * (64, 128, ...) of the best candidates instead of sorting them all */
            double target = (double)s->p.top_p * sum;
            int32_t lo = 0, chunk = nc < 64 ? nc : 64;
            double acc = 0.0;
            int32_t keep = nc;
            for (;;) {
                select_top(l, idx, lo, nc, chunk - lo);
                sort_desc(l, idx + lo, chunk - lo);
                bool reached = false;
                for (int32_t i = lo; i < chunk; i++) {
                    acc += l[idx[i]];
                    if (acc >= target) { keep = i + 1; reached = true; break; }
                }
                if (reached || chunk == nc) break;
                lo = chunk;
                chunk = (nc - chunk) > chunk ? 2 * chunk : nc;
            }
            nc = keep;
        }
        if (s->p.min_p > 0.0f) {
            /* relative to the most likely token, whose value is exactly 1 (and it always stays: min_p <= 1) */
            int32_t w = 0;
            for (int32_t i = 0; i < nc; i++) {
                if (l[idx[i]] >= s->p.min_p) idx[w++] = idx[i];
            }
            nc = w;
            if (nc == 0) return ENG_ERR_INVALID; /* unreachable: create rejects min_p > 1 */
        }
        double total = 0.0;
        for (int32_t i = 0; i < nc; i++) total += l[idx[i]];
        double u = rng_uniform(&s->rng) * total;
        double acc = 0.0;
        chosen = idx[nc - 1];
        for (int32_t i = 0; i < nc; i++) {
            acc += l[idx[i]];
            if (u < acc) { chosen = idx[i]; break; }
        }
    }
done:
    out->token = chosen;
    {
        double v = clean(logits[chosen]);
        out->logprob = (float)(v - lse);
    }
    eng_sampler_accept(s, chosen);
    return ENG_OK;
}
