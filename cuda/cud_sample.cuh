// cud_sample.cuh: the per-row logic of GPU sampling (k_sample in cud_sample.cu), as functions that compile for
// the device and for the host (internal to the cuda module; the C view is cuda/cud_sample.h).
//
// A thread block of SMP_THREADS threads owns one row. Thread t handles the tokens t, t + T, t + 2T ... of the
// vocabulary; every vocabulary-wide quantity is a per-thread partial (in that order) followed by a reduction
// over the T partials in one fixed binary tree (smp_tree). The row's algorithm (smp_row) is written once,
// against an executor: smp_dev_exec runs it as a CUDA block (shared memory, __syncthreads), smp_host_exec runs
// the same threads one after another with the shared memory as an array, so the host tests execute exactly the
// device's arithmetic in the device's order.
//
// Semantics are eng_sampler_sample's (engine/runtime/sampler.c), step by step:
//   - raw logits: the grammar mask first (a clear bit: -inf), then the log-sum-exp (max, then the sum of
//     eng_smp_exp(x - max) in double) and the top-N by raw logit (NaN as -inf, ties: lower id);
//   - logit bias in list order, then penalties (repetition, then frequency / presence) over the window counts;
//   - greedy (or a +inf logit): the lowest id holding the maximum;
//   - otherwise top-k (1..256: on the untempered logits; larger: on the probabilities), top-p (the smallest
//     best-first set whose mass reaches top_p * sum), min-p, and one draw u = uniform * total walking the kept
//     tokens in id order (the CPU sampler walks them in id order too).
// Sets defined by rank (top-k, top-p) are found by a deterministic threshold search: a binary search over the
// 64-bit key (orderable value << 32 | ~id), each probe a block-wide count or mass; the token drawn is the lowest
// id whose prefix mass exceeds u (a binary search over ids). Counts, maxima, comparisons and every float
// operation are the CPU's exactly (no contraction: SMP_MUL / SMP_ADD are _rn intrinsics on the device); only
// double sums differ in order (the CPU adds in id order, here per thread then the tree), so the log-sum-exp
// agrees to ~1e-15 relative and a sampled token can differ only when u or a top-p cut falls within ~1e-15 of
// a cumulative boundary.
//
// Cost: a row is O(n_vocab) per pass; greedy takes 3 passes plus N for top-N, a top-k or top-p cut up to 64
// probes, the draw up to 32 (first version: correctness over speed; a radix histogram would cut the probes).
#ifndef KVSERVE_CUD_SAMPLE_CUH
#define KVSERVE_CUD_SAMPLE_CUH

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda/cud_bits.cuh"
#include "engine/kernels/rng.h" // the RNG, shared with the CPU sampler

#ifdef __CUDACC__
#define SMP_FN __host__ __device__ inline
#else
#define SMP_FN inline
#endif

#if defined(__CUDA_ARCH__)
#define SMP_MUL(a, b) __fmul_rn((a), (b))
#define SMP_ADD(a, b) __fadd_rn((a), (b))
#define SMP_SUB(a, b) __fsub_rn((a), (b))
#define SMP_DIV(a, b) __fdiv_rn((a), (b))
#define SMP_DADD(a, b) __dadd_rn((a), (b))
#define SMP_DMUL(a, b) __dmul_rn((a), (b))
#else
#define SMP_MUL(a, b) ((a) * (b))
#define SMP_ADD(a, b) ((a) + (b))
#define SMP_SUB(a, b) ((a) - (b))
#define SMP_DIV(a, b) ((a) / (b))
#define SMP_DADD(a, b) ((a) + (b))
#define SMP_DMUL(a, b) ((a) * (b))
#endif

constexpr int SMP_THREADS = 512; // a power of two (the tree)
constexpr int SMP_MAX_TOP = 20;  // KVS_MAX_TOP_LOGPROBS

// ---- bits ---------------------------------------------------------------------------------------------------
SMP_FN bool smp_isnan(float x) { return x != x; }
SMP_FN float smp_clean(float x) { return smp_isnan(x) ? -INFINITY : x; }
SMP_FN bool smp_isfinite(float x) { return SMP_SUB(x, x) == 0.0f; }

// Order-preserving 32-bit key of a float: NaN as -inf, -0 as +0 (the CPU's comparisons treat them so).
SMP_FN uint32_t smp_okey(float x) {
    x = smp_clean(x);
    if (x == 0.0f) x = 0.0f;
    uint32_t u = cud_f2u(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
SMP_FN float smp_okey_value(uint32_t k) { return cud_u2f((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k); }
// Rank key: higher value first, then lower id (the CPU's `better`): larger key = better.
SMP_FN uint64_t smp_rkey(float x, int32_t id) {
    return ((uint64_t)smp_okey(x) << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)id);
}
SMP_FN int32_t smp_rkey_id(uint64_t k) { return (int32_t)(0xFFFFFFFFu - (uint32_t)(k & 0xFFFFFFFFu)); }

// ---- eng_smp_exp, the same operations in the same order ---------------------------------------------------
SMP_FN float smp_exp(float x) {
    if (!(x >= -87.3365478515625f)) return 0.0f;
    if (x > 88.0f) x = 88.0f;
    float n = rintf(SMP_MUL(x, 1.44269504088896341f));
    float r = SMP_SUB(x, SMP_MUL(n, 0.693359375f));
    r = SMP_SUB(r, SMP_MUL(n, -2.12194440e-4f));
    float p = 1.9875691500E-4f;
    p = SMP_ADD(SMP_MUL(p, r), 1.3981999507E-3f);
    p = SMP_ADD(SMP_MUL(p, r), 8.3334519073E-3f);
    p = SMP_ADD(SMP_MUL(p, r), 4.1665795894E-2f);
    p = SMP_ADD(SMP_MUL(p, r), 1.6666665459E-1f);
    p = SMP_ADD(SMP_MUL(p, r), 5.0000001201E-1f);
    float rr = SMP_MUL(r, r);
    float y = SMP_ADD(SMP_ADD(SMP_MUL(p, rr), r), 1.0f);
    return SMP_MUL(y, cud_u2f((uint32_t)(((int32_t)n + 127) << 23)));
}

// ---- the fixed reduction tree ------------------------------------------------------------------------------
// sh[0..SMP_THREADS) holds the partials; level w = T/2, T/4 ... 1 combines sh[t] and sh[t + w] for t < w.
// One level for thread t (the device runs a level then syncs; the host runs every t of a level, then the next).
struct smp_op_dsum { SMP_FN double operator()(double a, double b) const { return SMP_DADD(a, b); } };
struct smp_op_isum { SMP_FN int64_t operator()(int64_t a, int64_t b) const { return a + b; } };
struct smp_op_umax { SMP_FN uint64_t operator()(uint64_t a, uint64_t b) const { return a > b ? a : b; } };

// ---- the host executor: the block's threads one after another, shared memory as an array ------------------
struct smp_host_exec {
    alignas(8) unsigned char sh[SMP_THREADS * 8];
    template <class F> SMP_FN void par(F f) { for (int t = 0; t < SMP_THREADS; t++) f(t); }
    template <class F> SMP_FN void single(F f) { f(); }
    SMP_FN bool lead() const { return true; }
    template <class V, class Op, class F> SMP_FN V red(F f, Op op) {
        V *s = (V *)(void *)sh;
        for (int t = 0; t < SMP_THREADS; t++) s[t] = f(t);
        for (int w = SMP_THREADS / 2; w > 0; w >>= 1)
            for (int t = 0; t < w; t++) s[t] = op(s[t], s[t + w]);
        return s[0];
    }
    template <class F> SMP_FN double dsum(F f) { return red<double>(f, smp_op_dsum()); }
    template <class F> SMP_FN int64_t isum(F f) { return red<int64_t>(f, smp_op_isum()); }
    template <class F> SMP_FN uint64_t umax(F f) { return red<uint64_t>(f, smp_op_umax()); }
};

// ---- per-row inputs -----------------------------------------------------------------------------------------
struct smp_row_args {
    const float *logits;      // [n] raw logits (not modified)
    const uint32_t *mask;     // NULL or [(n + 31) / 32]: bit clear = banned
    float *work;              // [n] transformed logits, then probabilities
    int32_t n;
    float temperature, top_p, min_p, rep, pres, freq;
    int32_t top_k, n_top;
    const int32_t *bias_tok; const float *bias_val; int32_t n_bias;
    const int32_t *pen_tok; const int32_t *pen_cnt; int32_t n_pen;
};
struct smp_row_out {
    int32_t status;           // 0, or -1 when every token is banned
    int32_t token;
    float logprob;
    int32_t n_top;
    int32_t top_token[SMP_MAX_TOP];
    float top_logprob[SMP_MAX_TOP];
    uint64_t rng[4];          // in: the state before; out: after
};

SMP_FN float smp_raw(const smp_row_args &a, int32_t i) {
    if (a.mask && !((a.mask[i >> 5] >> (i & 31)) & 1u)) return -INFINITY;
    return a.logits[i];
}

// The largest 64-bit x with pred(x) true, pred monotone (true at 0, which the caller guarantees), probing from
// the top bit down: at most 64 probes, each a block-wide reduction (uniform control flow across the block).
template <class Ex, class Pred>
SMP_FN uint64_t smp_search_max(Ex &ex, uint64_t lo, uint64_t hi, Pred pred) {
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2 + 1; // no overflow: hi - lo >= 1
        if (pred(mid)) lo = mid;
        else hi = mid - 1;
    }
    (void)ex;
    return lo;
}

// Phase 1 of a row: the raw log-sum-exp, returned, and the top-N raw log-probabilities (written by the lead).
template <class Ex>
SMP_FN double smp_raw_logprobs(Ex &ex, const smp_row_args &a, smp_row_out &o) {
    const int32_t n = a.n;
    const int T = SMP_THREADS;
    const bool lead = ex.lead();
    const uint64_t mk = ex.umax([&](int t) {
        uint64_t m = 0;
        for (int32_t i = t; i < n; i += T) { uint64_t k = smp_okey(smp_raw(a, i)); m = k > m ? k : m; }
        return m;
    });
    const float mraw = smp_okey_value((uint32_t)mk);
    double lse;
    if (smp_isfinite(mraw)) {
        double s = ex.dsum([&](int t) {
            double p = 0.0;
            for (int32_t i = t; i < n; i += T) p = SMP_DADD(p, (double)smp_exp(SMP_SUB(smp_raw(a, i), mraw)));
            return p;
        });
        lse = SMP_DADD((double)mraw, log(s));
    } else {
        lse = (double)mraw;
    }
    int32_t ntop = a.n_top < n ? a.n_top : n;
    uint64_t prev = ~0ull;
    for (int32_t j = 0; j < ntop; j++) { // the j-th best: the largest rank key below the (j-1)-th
        uint64_t k = ex.umax([&](int t) {
            uint64_t m = 0;
            for (int32_t i = t; i < n; i += T) {
                uint64_t r = smp_rkey(smp_raw(a, i), i);
                if (r < prev && r > m) m = r;
            }
            return m;
        });
        int32_t id = smp_rkey_id(k);
        if (lead) {
            o.top_token[j] = id;
            o.top_logprob[j] = (float)((double)smp_clean(smp_raw(a, id)) - lse);
        }
        prev = k;
    }
    if (lead) o.n_top = ntop;
    return lse;
}

// Phase 2: a.work gets the transformed logits (bias in list order, then penalties, on one thread: the lists are
// short and may repeat tokens); returns their maximum.
template <class Ex>
SMP_FN float smp_transform(Ex &ex, const smp_row_args &a) {
    const int32_t n = a.n;
    const int T = SMP_THREADS;
    ex.par([&](int t) { for (int32_t i = t; i < n; i += T) a.work[i] = smp_raw(a, i); });
    ex.single([&]() {
        for (int32_t b = 0; b < a.n_bias; b++) a.work[a.bias_tok[b]] = SMP_ADD(a.work[a.bias_tok[b]], a.bias_val[b]);
        for (int32_t q = 0; q < a.n_pen; q++) {
            float v = a.work[a.pen_tok[q]];
            if (a.rep != 1.0f) v = v > 0.0f ? SMP_DIV(v, a.rep) : SMP_MUL(v, a.rep);
            v = SMP_SUB(v, SMP_ADD(SMP_MUL((float)a.pen_cnt[q], a.freq), a.pres));
            a.work[a.pen_tok[q]] = v;
        }
    });
    const float *w = a.work;
    return smp_okey_value((uint32_t)ex.umax([&](int t) {
        uint64_t mm = 0;
        for (int32_t i = t; i < n; i += T) { uint64_t k = smp_okey(w[i]); mm = k > mm ? k : mm; }
        return mm;
    }));
}

// The candidate set after phase 3: every token when all (the CPU's nc < 0: no candidate list); else a token whose
// w is >= 0 after the top-k <= 256 pass (heap: zeros included), or > 0 otherwise (the CPU's candidates are the
// positive probabilities), with its rank key at or above kcut. sum: the members' mass.
struct smp_cands {
    uint64_t kcut;
    bool all, heap;
    double sum;
    SMP_FN bool member(const float *w, int32_t i) const {
        return (heap ? w[i] >= 0.0f : w[i] > 0.0f) && smp_rkey(w[i], i) >= kcut;
    }
};

// Phase 3a: a.work becomes the probabilities e^((w - m) / T) (of the top-k members only when top_k <= 256: the
// others get -1); the cut of a top-k over 256 is found on the probabilities.
template <class Ex>
SMP_FN void smp_top_k(Ex &ex, const smp_row_args &a, float m, smp_cands &c) {
    const int32_t n = a.n;
    const int T = SMP_THREADS;
    float *w = a.work;
    const float inv_t = SMP_DIV(1.0f, a.temperature);
    c.kcut = 0;
    c.heap = a.top_k > 0 && a.top_k <= 256;
    c.all = false;
    const int64_t k = a.top_k;
    if (c.heap) {
        int64_t nvalid = ex.isum([&](int t) {
            int64_t cnt = 0;
            for (int32_t i = t; i < n; i += T) cnt += w[i] > -INFINITY;
            return cnt;
        });
        uint64_t kcut = 0;
        if (nvalid > k) {
            kcut = smp_search_max(ex, 0, ~0ull, [&](uint64_t x) {
                return ex.isum([&](int t) {
                    int64_t cnt = 0;
                    for (int32_t i = t; i < n; i += T) cnt += w[i] > -INFINITY && smp_rkey(w[i], i) >= x;
                    return cnt;
                }) >= k;
            });
        }
        // probabilities of the members only (the CPU leaves the others' logits in place)
        ex.par([&](int t) {
            for (int32_t i = t; i < n; i += T)
                if (w[i] > -INFINITY && smp_rkey(w[i], i) >= kcut) w[i] = smp_exp(SMP_MUL(SMP_SUB(w[i], m), inv_t));
                else w[i] = -1.0f; // not a member (members are >= 0)
        });
        return; // members: w >= 0 (zeros included: the CPU keeps underflowed top-k tokens), kcut 0
    }
    ex.par([&](int t) {
        for (int32_t i = t; i < n; i += T) w[i] = smp_exp(SMP_MUL(SMP_SUB(w[i], m), inv_t));
    });
    if (a.top_k <= 0 && !(a.top_p < 1.0f)) { c.all = true; return; }
    if (a.top_k > 0) { // top-k > 256 on the probabilities
        int64_t nc = ex.isum([&](int t) {
            int64_t cnt = 0;
            for (int32_t i = t; i < n; i += T) cnt += w[i] > 0.0f;
            return cnt;
        });
        if (k < nc)
            c.kcut = smp_search_max(ex, 0, ~0ull, [&](uint64_t x) {
                return ex.isum([&](int t) {
                    int64_t cnt = 0;
                    for (int32_t i = t; i < n; i += T) cnt += w[i] > 0.0f && smp_rkey(w[i], i) >= x;
                    return cnt;
                }) >= k;
            });
    }
}

// Phase 3b: the members' mass, then the top-p cut: the largest cut whose best-first mass still reaches the
// target (all members if none; only the best member when the target is not positive).
template <class Ex>
SMP_FN void smp_top_p(Ex &ex, const smp_row_args &a, smp_cands &c) {
    const int32_t n = a.n;
    const int T = SMP_THREADS;
    const float *w = a.work;
    c.sum = ex.dsum([&](int t) {
        double s = 0.0;
        for (int32_t i = t; i < n; i += T) if (c.all || c.member(w, i)) s = SMP_DADD(s, (double)w[i]);
        return s;
    });
    if (c.all || !(a.top_p < 1.0f)) return;
    int64_t nc = ex.isum([&](int t) {
        int64_t cnt = 0;
        for (int32_t i = t; i < n; i += T) cnt += c.member(w, i);
        return cnt;
    });
    if (nc <= 1) return;
    const double target = SMP_DMUL((double)a.top_p, c.sum);
    const uint64_t base = c.kcut;
    if (!(target > 0.0)) {
        c.kcut = ex.umax([&](int t) {
            uint64_t mm = 0;
            for (int32_t i = t; i < n; i += T)
                if (c.member(w, i)) { uint64_t r = smp_rkey(w[i], i); mm = r > mm ? r : mm; }
            return mm;
        });
        return;
    }
    const smp_cands cb = c; // the search's predicate reads the set before the cut moves
    c.kcut = smp_search_max(ex, base, ~0ull, [&](uint64_t x) {
        return ex.dsum([&](int t) {
            double s = 0.0;
            for (int32_t i = t; i < n; i += T)
                if (cb.member(w, i) && smp_rkey(w[i], i) >= x) s = SMP_DADD(s, (double)w[i]);
            return s;
        }) >= target;
    });
}

// Phase 4: min-p (relative to the best token, whose probability is exactly 1), then the draw in id order: the
// lowest id whose prefix mass exceeds u. -1 when nothing is kept (unreachable: the best token always is).
template <class Ex>
SMP_FN int32_t smp_draw(Ex &ex, const smp_row_args &a, const smp_cands &c, uint64_t rng[4]) {
    const int32_t n = a.n;
    const int T = SMP_THREADS;
    const float *w = a.work;
    const float thr = a.min_p > 0.0f ? a.min_p : 0.0f;
    auto kept = [&](int32_t i) {
        return c.all ? (w[i] > 0.0f && w[i] >= thr) : (c.member(w, i) && w[i] >= thr);
    };
    auto prefix = [&](int32_t last) { // mass of the kept tokens with id <= last
        return ex.dsum([&](int t) {
            double s = 0.0;
            for (int32_t i = t; i <= last; i += T) if (kept(i)) s = SMP_DADD(s, (double)w[i]);
            return s;
        });
    };
    const double total = prefix(n - 1);
    const uint64_t last_kept = ex.umax([&](int t) {
        uint64_t mm = 0;
        for (int32_t i = t; i < n; i += T) if (kept(i)) mm = (uint64_t)i + 1 > mm ? (uint64_t)i + 1 : mm;
        return mm;
    });
    if (last_kept == 0) return -1;
    const double u = SMP_DMUL(eng_rng_uniform(rng), total);
    // the largest j with prefix(j - 1) <= u, j in [0, n)
    int32_t j = (int32_t)smp_search_max(ex, 0, (uint64_t)(n - 1), [&](uint64_t x) {
        return prefix((int32_t)x - 1) <= u;
    });
    return prefix(j) > u ? j : (int32_t)(last_kept - 1);
}

// One row. The executor provides, for a per-thread functor f(t):
//   ex.par(f)               every thread runs f(t), then a barrier;
//   ex.single(f)            thread 0 runs f(), then a barrier;
//   ex.dsum / isum / umax(f) every thread's partial f(t) reduced by the tree, the result seen by every thread.
//   ex.lead()                true on the thread that writes the results (thread 0).
// o (global memory on the device) holds in o.rng the state before the step, read by every thread at the start;
// the lead thread writes the results and the state after (advanced only by a draw).
template <class Ex>
SMP_FN void smp_row(Ex &ex, const smp_row_args &a, smp_row_out &o) {
    const int32_t n = a.n;
    const int T = SMP_THREADS;
    const bool lead = ex.lead();
    uint64_t rng[4] = {o.rng[0], o.rng[1], o.rng[2], o.rng[3]}; // read before the first barrier
    if (lead) {
        o.status = 0;
        o.token = -1;
        o.logprob = 0.0f;
        o.n_top = 0;
    }
    const double lse = smp_raw_logprobs(ex, a, o);
    const float m = smp_transform(ex, a);
    if (!(m > -INFINITY)) {
        if (lead) o.status = -1;
        return;
    }
    const float *w = a.work;
    int32_t chosen;
    if (!(a.temperature > 0.0f) || m == INFINITY) {
        // the lowest id holding the maximum: the best rank key among the tokens equal to m
        uint64_t k = ex.umax([&](int t) {
            uint64_t mm = 0;
            for (int32_t i = t; i < n; i += T) if (w[i] == m) { uint64_t r = smp_rkey(w[i], i); mm = r > mm ? r : mm; }
            return mm;
        });
        chosen = smp_rkey_id(k);
    } else {
        smp_cands c;
        smp_top_k(ex, a, m, c);
        smp_top_p(ex, a, c);
        chosen = smp_draw(ex, a, c, rng);
        if (chosen < 0) {
            if (lead) o.status = -1;
            return;
        }
    }
    if (lead) {
        o.token = chosen;
        o.logprob = (float)((double)smp_clean(smp_raw(a, chosen)) - lse);
        for (int i = 0; i < 4; i++) o.rng[i] = rng[i];
    }
}

#endif
