// cud_sample.cu: k_sample (one thread block per row runs smp_row of cud_sample.cuh), its launcher
// cud_sample_rows and the GPU self-test (cuda/cud_sample.h). Not wired into the forward path or the scheduler
// yet (docs/DEVELOPERS.md, GPU section).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "common/common.h"
#include "cuda/cud_kernels.cuh"
#include "cuda/cud_sample.cuh"
#include "cuda/cud_sample.h"

namespace {

// The device executor: the threads of the block, shared memory for the tree.
struct smp_dev_exec {
    void *sh; // [SMP_THREADS] 8-byte slots
    template <class F> __host__ __device__ void par(F f) {
#ifdef __CUDA_ARCH__
        f((int)threadIdx.x);
        __syncthreads();
#else
        (void)f;
#endif
    }
    template <class F> __host__ __device__ void single(F f) {
#ifdef __CUDA_ARCH__
        if (threadIdx.x == 0) f();
        __syncthreads();
#else
        (void)f;
#endif
    }
    __host__ __device__ bool lead() const {
#ifdef __CUDA_ARCH__
        return threadIdx.x == 0;
#else
        return true;
#endif
    }
    template <class V, class Op, class F> __host__ __device__ V red(F f, Op op) {
#ifdef __CUDA_ARCH__
        V *s = (V *)sh;
        const int t = (int)threadIdx.x;
        s[t] = f(t);
        __syncthreads();
        for (int w = SMP_THREADS / 2; w > 0; w >>= 1) {
            if (t < w) s[t] = op(s[t], s[t + w]);
            __syncthreads();
        }
        V r = s[0];
        __syncthreads();
        return r;
#else
        (void)f; (void)op;
        return V();
#endif
    }
    template <class F> __host__ __device__ double dsum(F f) { return red<double>(f, smp_op_dsum()); }
    template <class F> __host__ __device__ int64_t isum(F f) { return red<int64_t>(f, smp_op_isum()); }
    template <class F> __host__ __device__ uint64_t umax(F f) { return red<uint64_t>(f, smp_op_umax()); }
};

// A row's parameters as uploaded: offsets into the flat bias, penalty and mask arrays.
struct dev_row {
    float temperature, top_p, min_p, rep, pres, freq;
    int32_t top_k, n_top;
    int32_t bias_off, n_bias, pen_off, n_pen;
    int64_t mask_off; // -1: no mask
    uint64_t rng[4];
};

__global__ void __launch_bounds__(SMP_THREADS, 2)
k_sample(const float *logits, int64_t ld, int32_t n_vocab, const dev_row *rows, const int32_t *bias_tok,
         const float *bias_val, const int32_t *pen_tok, const int32_t *pen_cnt, const uint32_t *masks, float *work,
         smp_row_out *out) {
    __shared__ double sh[SMP_THREADS];
    const int r = (int)blockIdx.x;
    const dev_row p = rows[r];
    smp_row_args a;
    a.logits = logits + (int64_t)r * ld;
    a.mask = p.mask_off >= 0 ? masks + p.mask_off : nullptr;
    a.work = work + (int64_t)r * n_vocab;
    a.n = n_vocab;
    a.temperature = p.temperature; a.top_p = p.top_p; a.min_p = p.min_p;
    a.rep = p.rep; a.pres = p.pres; a.freq = p.freq;
    a.top_k = p.top_k; a.n_top = p.n_top;
    a.bias_tok = bias_tok + p.bias_off; a.bias_val = bias_val + p.bias_off; a.n_bias = p.n_bias;
    a.pen_tok = pen_tok + p.pen_off; a.pen_cnt = pen_cnt + p.pen_off; a.n_pen = p.n_pen;
    smp_row_out &o = out[r];
    if (threadIdx.x == 0)
        for (int i = 0; i < 4; i++) o.rng[i] = p.rng[i];
    __syncthreads(); // every thread reads o.rng (global memory) next
    smp_dev_exec ex{sh};
    smp_row(ex, a, o);
}

} // namespace

struct cud_sampler {
    void *d[8];     // rows, bias_tok, bias_val, pen_tok, pen_cnt, masks, work, out
    size_t cap[8];  // bytes
};

static int grow(cud_sampler *s, int i, size_t bytes) {
    if (bytes == 0) bytes = 8;
    if (s->cap[i] >= bytes) return KVS_OK;
    if (s->d[i]) cudaFree(s->d[i]);
    s->d[i] = nullptr;
    s->cap[i] = 0;
    cudaError_t e = cudaMalloc(&s->d[i], bytes);
    if (e != cudaSuccess) {
        fprintf(stderr, "cud_sample: cudaMalloc(%zu): %s\n", bytes, cudaGetErrorString(e));
        cudaGetLastError();
        return e == cudaErrorMemoryAllocation ? KVS_ERR_NOMEM : KVS_ERR_DEVICE;
    }
    s->cap[i] = bytes;
    return KVS_OK;
}

extern "C" int cud_sampler_create(cud_sampler **out) {
    if (!out) return KVS_ERR_INVALID;
    *out = (cud_sampler *)calloc(1, sizeof(cud_sampler));
    return *out ? KVS_OK : KVS_ERR_NOMEM;
}

extern "C" void cud_sampler_free(cud_sampler *s) {
    if (!s) return;
    for (int i = 0; i < 8; i++) if (s->d[i]) cudaFree(s->d[i]);
    free(s);
}

static bool params_ok(const cud_sample_row *r, int32_t n_vocab) {
    const cud_sample_params *p = &r->p;
    if (std::isnan(p->temperature) || std::isnan(p->top_p) || std::isnan(p->min_p) || p->min_p > 1.0f ||
        !std::isfinite(p->repetition_penalty) || p->repetition_penalty <= 0.0f || !std::isfinite(p->presence_penalty) ||
        !std::isfinite(p->frequency_penalty) || p->n_top_logprobs < 0 || p->n_top_logprobs > SMP_MAX_TOP ||
        r->n_bias < 0 || r->n_pen < 0 || (r->n_bias > 0 && !r->bias) || (r->n_pen > 0 && (!r->pen_token || !r->pen_count)))
        return false;
    for (int32_t i = 0; i < r->n_bias; i++)
        if (r->bias[i].token < 0 || r->bias[i].token >= n_vocab || std::isnan(r->bias[i].bias)) return false;
    for (int32_t i = 0; i < r->n_pen; i++)
        if (r->pen_token[i] < 0 || r->pen_token[i] >= n_vocab || r->pen_count[i] <= 0) return false;
    return true;
}

#define SMP_CK(call)                                                                                           \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "cud_sample: %s: %s\n", #call, cudaGetErrorString(e_));                            \
            cudaGetLastError();                                                                                \
            rc = KVS_ERR_DEVICE;                                                                               \
            goto done;                                                                                         \
        }                                                                                                      \
    } while (0)

extern "C" int cud_sample_rows(cud_sampler *s, const float *d_logits, int64_t ld, int32_t n_rows, int32_t n_vocab,
                               const cud_sample_row *rows, cud_sample_out *out, void *stream) {
    if (!s || n_rows < 0 || n_vocab <= 0 || ld < n_vocab || (n_rows > 0 && (!d_logits || !rows || !out)))
        return KVS_ERR_INVALID;
    if (n_rows == 0) return KVS_OK;
    int64_t nb = 0, np = 0, nm = 0;
    const int64_t words = ((int64_t)n_vocab + 31) / 32;
    for (int32_t r = 0; r < n_rows; r++) {
        if (!params_ok(&rows[r], n_vocab)) return KVS_ERR_INVALID;
        nb += rows[r].n_bias;
        np += rows[r].n_pen;
        nm += rows[r].mask ? words : 0;
    }
    cudaStream_t st = (cudaStream_t)stream;
    int rc = KVS_OK;
    std::vector<dev_row> h_rows((size_t)n_rows);
    std::vector<int32_t> h_bt((size_t)nb), h_pt((size_t)np), h_pc((size_t)np);
    std::vector<float> h_bv((size_t)nb);
    std::vector<uint32_t> h_m((size_t)nm);
    std::vector<smp_row_out> h_out((size_t)n_rows);
    int64_t ob = 0, op = 0, om = 0;
    for (int32_t r = 0; r < n_rows; r++) {
        const cud_sample_row *x = &rows[r];
        dev_row &d = h_rows[(size_t)r];
        d.temperature = x->p.temperature; d.top_p = x->p.top_p; d.min_p = x->p.min_p;
        d.rep = x->p.repetition_penalty; d.pres = x->p.presence_penalty; d.freq = x->p.frequency_penalty;
        d.top_k = x->p.top_k; d.n_top = x->p.n_top_logprobs;
        d.bias_off = (int32_t)ob; d.n_bias = x->n_bias;
        d.pen_off = (int32_t)op; d.n_pen = x->n_pen;
        for (int32_t i = 0; i < x->n_bias; i++) { h_bt[(size_t)ob] = x->bias[i].token; h_bv[(size_t)ob++] = x->bias[i].bias; }
        for (int32_t i = 0; i < x->n_pen; i++) { h_pt[(size_t)op] = x->pen_token[i]; h_pc[(size_t)op++] = x->pen_count[i]; }
        d.mask_off = -1;
        if (x->mask) {
            memcpy(&h_m[(size_t)om], x->mask, (size_t)words * 4);
            d.mask_off = om;
            om += words;
        }
        for (int i = 0; i < 4; i++) d.rng[i] = x->p.rng[i];
    }
    const size_t sizes[8] = {(size_t)n_rows * sizeof(dev_row), (size_t)nb * 4, (size_t)nb * 4, (size_t)np * 4,
                             (size_t)np * 4, (size_t)nm * 4, (size_t)n_rows * (size_t)n_vocab * 4,
                             (size_t)n_rows * sizeof(smp_row_out)};
    for (int i = 0; i < 8; i++)
        if ((rc = grow(s, i, sizes[i]))) return rc;
    SMP_CK(cudaMemcpyAsync(s->d[0], h_rows.data(), sizes[0], cudaMemcpyHostToDevice, st));
    if (nb) SMP_CK(cudaMemcpyAsync(s->d[1], h_bt.data(), sizes[1], cudaMemcpyHostToDevice, st));
    if (nb) SMP_CK(cudaMemcpyAsync(s->d[2], h_bv.data(), sizes[2], cudaMemcpyHostToDevice, st));
    if (np) SMP_CK(cudaMemcpyAsync(s->d[3], h_pt.data(), sizes[3], cudaMemcpyHostToDevice, st));
    if (np) SMP_CK(cudaMemcpyAsync(s->d[4], h_pc.data(), sizes[4], cudaMemcpyHostToDevice, st));
    if (nm) SMP_CK(cudaMemcpyAsync(s->d[5], h_m.data(), sizes[5], cudaMemcpyHostToDevice, st));
    k_sample<<<n_rows, SMP_THREADS, 0, st>>>(d_logits, ld, n_vocab, (const dev_row *)s->d[0], (const int32_t *)s->d[1],
                                             (const float *)s->d[2], (const int32_t *)s->d[3], (const int32_t *)s->d[4],
                                             (const uint32_t *)s->d[5], (float *)s->d[6], (smp_row_out *)s->d[7]);
    SMP_CK(cudaGetLastError());
    SMP_CK(cudaMemcpyAsync(h_out.data(), s->d[7], sizes[7], cudaMemcpyDeviceToHost, st));
    SMP_CK(cudaStreamSynchronize(st));
    for (int32_t r = 0; r < n_rows; r++) {
        const smp_row_out &o = h_out[(size_t)r];
        cud_sample_out *y = &out[r];
        memset(y, 0, sizeof *y);
        y->status = o.status == 0 ? KVS_OK : KVS_ERR_INVALID;
        y->s.token = o.token;
        y->s.logprob = o.logprob;
        y->s.n_top = o.n_top;
        for (int j = 0; j < o.n_top; j++) { y->s.top_token[j] = o.top_token[j]; y->s.top_logprob[j] = o.top_logprob[j]; }
        for (int i = 0; i < 4; i++) y->rng[i] = o.rng[i];
    }
done:
    return rc;
}

// ---- self-test: the device kernel against the host emulation of the same block -----------------------------
extern "C" int cud_sample_selftest(char *msg, size_t msg_len) {
    char dummy[8];
    int rc = cud_selftest_open(&msg, &msg_len, dummy, sizeof dummy);
    if (rc) return rc;
    std::mt19937_64 g(25);
    std::uniform_real_distribution<float> U(0.0f, 1.0f);
    cud_sampler *smp = nullptr;
    rc = cud_sampler_create(&smp);
    if (rc) return rc;
    float *d_l = nullptr;
    const int32_t vocabs[] = {1, 7, 513, 4099, 32000, 128256};
    int checked = 0;
    double worst = 0.0;
    for (int32_t n : vocabs) {
        const int32_t R = n > 30000 ? 6 : 24;
        std::vector<float> l((size_t)R * n);
        std::vector<cud_sample_row> rows((size_t)R);
        std::vector<std::vector<uint32_t>> masks((size_t)R);
        std::vector<std::vector<eng_logit_bias>> bias((size_t)R);
        std::vector<std::vector<int32_t>> pt((size_t)R), pc((size_t)R);
        for (int32_t r = 0; r < R; r++) {
            float scale = 0.5f + 6.0f * U(g);
            bool ties = g() % 3 == 0;
            for (int32_t i = 0; i < n; i++) {
                float v = (U(g) - 0.5f) * 2.0f * scale;
                if (ties) v = std::round(v * 2.0f) / 2.0f;
                if (g() % 97 == 0) v = -INFINITY;
                if (g() % 211 == 0) v = NAN;
                l[(size_t)r * n + i] = v;
            }
            cud_sample_row &x = rows[(size_t)r];
            memset(&x, 0, sizeof x);
            x.p.temperature = (r % 5 == 0) ? 0.0f : 0.1f + 2.0f * U(g);
            x.p.top_p = (r % 3 == 1) ? 0.05f + 0.9f * U(g) : 1.0f;
            x.p.top_k = (r % 4 == 1) ? 1 + (int32_t)(g() % 300) : (r % 4 == 2 ? 257 + (int32_t)(g() % 3000) : 0);
            x.p.min_p = (r % 6 == 3) ? 0.3f * U(g) : 0.0f;
            x.p.repetition_penalty = (r % 2) ? 1.3f : 1.0f;
            x.p.presence_penalty = (r % 7 == 2) ? 0.7f : 0.0f;
            x.p.frequency_penalty = (r % 7 == 3) ? 0.4f : 0.0f;
            x.p.n_top_logprobs = (int32_t)(g() % 21);
            cud_sample_rng_seed(g(), x.p.rng);
            for (int b = 0, nb = (int)(g() % 6); b < nb; b++)
                bias[(size_t)r].push_back({(int32_t)(g() % (uint64_t)n), (g() % 5 == 0) ? -INFINITY : 10.0f * (U(g) - 0.5f)});
            x.bias = bias[(size_t)r].data();
            x.n_bias = (int32_t)bias[(size_t)r].size();
            if (r % 2 || x.p.presence_penalty != 0.0f || x.p.frequency_penalty != 0.0f)
                for (int q = 0, nq = (int)(g() % 20); q < nq; q++) {
                    int32_t t = (int32_t)(g() % (uint64_t)n);
                    bool dup = false;
                    for (int32_t u : pt[(size_t)r]) dup |= u == t;
                    if (dup) continue;
                    pt[(size_t)r].push_back(t);
                    pc[(size_t)r].push_back(1 + (int32_t)(g() % 4));
                }
            x.pen_token = pt[(size_t)r].data();
            x.pen_count = pc[(size_t)r].data();
            x.n_pen = (int32_t)pt[(size_t)r].size();
            if (r % 3 == 2) {
                masks[(size_t)r].assign(((size_t)n + 31) / 32, 0u);
                for (int32_t i = 0; i < n; i++) if (g() % 4 == 0 || i == n - 1) masks[(size_t)r][(size_t)i >> 5] |= 1u << (i & 31);
                if (r % 9 == 8) std::fill(masks[(size_t)r].begin(), masks[(size_t)r].end(), 0u); // all banned
                x.mask = masks[(size_t)r].data();
            }
        }
        std::vector<cud_sample_out> got((size_t)R);
        if (cudaMalloc(&d_l, l.size() * 4) != cudaSuccess ||
            cudaMemcpy(d_l, l.data(), l.size() * 4, cudaMemcpyHostToDevice) != cudaSuccess) {
            cudaGetLastError();
            snprintf(msg, msg_len, "cudaMalloc / cudaMemcpy of %zu logits failed", l.size());
            rc = KVS_ERR_DEVICE;
            goto out;
        }
        if ((rc = cud_sample_rows(smp, d_l, n, R, n, rows.data(), got.data(), nullptr))) {
            snprintf(msg, msg_len, "cud_sample_rows: %d", rc);
            goto out;
        }
        cudaFree(d_l);
        d_l = nullptr;
        std::vector<float> work((size_t)n);
        smp_host_exec *ex = new smp_host_exec;
        for (int32_t r = 0; r < R; r++) {
            const cud_sample_row &x = rows[(size_t)r];
            std::vector<int32_t> bt;
            std::vector<float> bv;
            for (int32_t b = 0; b < x.n_bias; b++) { bt.push_back(x.bias[b].token); bv.push_back(x.bias[b].bias); }
            smp_row_args a = {&l[(size_t)r * n], x.mask, work.data(), n, x.p.temperature, x.p.top_p, x.p.min_p,
                              x.p.repetition_penalty, x.p.presence_penalty, x.p.frequency_penalty, x.p.top_k,
                              x.p.n_top_logprobs, bt.data(), bv.data(), x.n_bias, x.pen_token, x.pen_count, x.n_pen};
            smp_row_out o;
            for (int i = 0; i < 4; i++) o.rng[i] = x.p.rng[i];
            smp_row(*ex, a, o);
            const cud_sample_out &y = got[(size_t)r];
            bool same = (o.status == 0) == (y.status == KVS_OK) && memcmp(o.rng, y.rng, sizeof o.rng) == 0;
            if (same && o.status == 0) {
                same = o.token == y.s.token && o.n_top == y.s.n_top && std::fabs(o.logprob - y.s.logprob) <= 1e-6f;
                worst = std::fmax(worst, std::fabs((double)o.logprob - y.s.logprob));
                for (int j = 0; same && j < o.n_top; j++)
                    same = o.top_token[j] == y.s.top_token[j] &&
                           (std::fabs(o.top_logprob[j] - y.s.top_logprob[j]) <= 1e-6f ||
                            (std::isinf(o.top_logprob[j]) && o.top_logprob[j] == y.s.top_logprob[j]));
            }
            if (!same) {
                snprintf(msg, msg_len, "n_vocab %d row %d: device token %d status %d, host token %d status %d",
                         n, r, y.s.token, y.status, o.token, o.status);
                delete ex;
                rc = KVS_ERR_DEVICE;
                goto out;
            }
            checked++;
        }
        delete ex;
    }
    snprintf(msg, msg_len, "%d rows: k_sample equals the host emulation (worst logprob difference %.3g)", checked,
             worst);
out:
    if (d_l) cudaFree(d_l);
    cud_sampler_free(smp);
    return rc;
}
