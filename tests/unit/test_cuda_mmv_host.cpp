/* test_cuda_mmv_host.cpp: the decode products of cuda/cud_mmv.cuh compiled for the host, on every machine.
 *  - activation quantization: k_act_quant's per-thread steps and reductions (run as arrays) give the CPU
 *    engine's eng_quantize_row Q8_0 and Q8_K bytes bit for bit (ties of magnitude, zero blocks included);
 *  - integer block sums: the units' integer sums, turned into block terms and added in the CPU engine's
 *    order, give eng_vec_dot's scalar-level result bit for bit (so every integer sum and block term equals the CPU's);
 *  - index maps: at awkward shapes (one block per row, rows not a multiple of anything, rows wider than one
 *    staging chunk, every m from 1 to 8), every byte of the matrix is staged, every unit computed exactly once,
 *    and no 16-byte word read lies past the matrix padded to 16 bytes;
 *  - whole thread blocks: k_mmv run phase by phase (staging, units, 8-lane integer shuffles, warp and group
 *    float reductions, all as arrays) equals eng_vec_dot within the CPU engine's own tolerance between its
 *    SIMD levels (1e-5 * sum |w_i x_i|). */
#include <criterion/criterion.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "engine/engine.h"
#include "engine/kernels/quant.h"
#include "engine/kernels/quant_impl.h"
}

#include "tests/unit/helper_cuda_host.h"

#define CUD_DEQ_FN inline
#define CUD_MMV_FN inline
#include "cuda/cud_mmv.cuh"

using namespace cud_deq;
using namespace cud_mv;

/* ---- activation quantization, as k_act_quant runs it ----------------------------------------------------- */
struct host_act {
    int m = 0;
    int64_t k = 0;
    std::vector<float> xf, d8, dk;
    std::vector<int8_t> q8, qk;
    std::vector<int16_t> bk;
    mmv_act view() const { return mmv_act{q8.data(), d8.data(), qk.data(), dk.data(), bk.data(), xf.data(), k}; }
};

/* One 256-thread block per row: thread tid holds element base + tid of each 256-wide piece. */
static void act_quant_host(const std::vector<float> &x, int m, int64_t k, host_act *o) {
    const int NT = 256;
    o->m = m;
    o->k = k;
    o->xf = x;
    o->q8.assign((size_t)m * k, 0);
    o->qk.assign((size_t)m * k, 0);
    o->d8.assign((size_t)m * k / 32, 0.f);
    o->dk.assign((size_t)m * (k / 256 > 0 ? k / 256 : 1), 0.f);
    o->bk.assign((size_t)m * k / 16, 0);
    const bool kq = k % 256 == 0;
    for (int r = 0; r < m; r++) {
        const float *xr = x.data() + (size_t)r * k;
        for (int64_t base = 0; base < k; base += NT) {
            float v[NT];
            for (int t = 0; t < NT; t++) v[t] = base + t < k ? xr[base + t] : 0.f;
            for (int w = 0; w < NT / 32; w++) {
                if (base + 32 * w >= k) continue;
                float amax = 0.f;
                for (int l = 0; l < 32; l++) amax = std::fmax(amax, std::fabs(v[32 * w + l]));
                float d, id;
                mmv_q8_0_scale(amax, &d, &id);
                for (int l = 0; l < 32; l++) o->q8[(size_t)r * k + base + 32 * w + l] = mmv_q8_code(v[32 * w + l], id);
                o->d8[(size_t)r * (k / 32) + (base + 32 * w) / 32] = d;
            }
            if (!kq) continue;
            /* the xor butterfly of (magnitude, index) within each warp, then the warps in order */
            float pa[NT];
            int pi[NT];
            for (int t = 0; t < NT; t++) {
                pa[t] = std::fabs(v[t]);
                pi[t] = t;
            }
            for (int off = 16; off > 0; off >>= 1) {
                float na[NT];
                int ni[NT];
                for (int t = 0; t < NT; t++) {
                    int s = (t & ~31) | ((t & 31) ^ off);
                    na[t] = pa[t];
                    ni[t] = pi[t];
                    mmv_absmax_pick(&na[t], &ni[t], pa[s], pi[s]);
                }
                memcpy(pa, na, sizeof pa);
                memcpy(pi, ni, sizeof pi);
            }
            float ba = pa[0];
            int bi = pi[0];
            for (int w = 1; w < NT / 32; w++) mmv_absmax_pick(&ba, &bi, pa[32 * w], pi[32 * w]);
            float iscale, dkv;
            mmv_q8_k_scale(ba == 0.f ? 0.f : v[bi], &iscale, &dkv);
            for (int t = 0; t < NT; t++)
                o->qk[(size_t)r * k + base + t] = ba == 0.f ? (int8_t)0 : mmv_q8_code(v[t], iscale);
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int j = 0; j < 16; j++) s += o->qk[(size_t)r * k + base + 16 * g + j];
                o->bk[(size_t)r * (k / 16) + (base + 16 * g) / 16] = (int16_t)s;
            }
            o->dk[(size_t)r * (k / 256) + base / 256] = dkv;
        }
    }
}

static std::vector<float> random_acts(std::mt19937 &rng, int m, int64_t k, int trial) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> x((size_t)m * k);
    for (auto &v : x) v = nd(rng) * (trial % 3 == 0 ? 1e-3f : trial % 3 == 1 ? 1.f : 40.f);
    /* awkward blocks: ties of magnitude with opposite signs, a zero block, one huge value */
    if (k >= 64) {
        x[5] = 7.5f;
        x[9] = -7.5f;
        x[40] = -9.25f;
        x[47] = 9.25f;
    }
    if (k >= 256 && trial % 2 == 0)
        for (int i = 0; i < 32; i++) x[(size_t)(k - 32) + i] = 0.f;
    if (k >= 512) {
        for (int i = 256; i < 512; i++) x[i] = 0.f;
        if (trial % 2) x[300] = -0.f;
    }
    return x;
}

Test(cuda_mmv_host, act_quant_matches_cpu) {
    std::mt19937 rng(77);
    for (int64_t k : {32, 96, 256, 512, 576, 2048, 2304}) {
        for (int trial = 0; trial < 6; trial++) {
            const int m = 1 + trial % 8;
            std::vector<float> x = random_acts(rng, m, k, trial);
            host_act a;
            act_quant_host(x, m, k, &a);
            std::vector<eng_blk_q8_0> c8((size_t)k / 32);
            std::vector<eng_blk_q8_K> ck((size_t)(k / 256 > 0 ? k / 256 : 1));
            for (int r = 0; r < m; r++) {
                cr_assert_eq(eng_quantize_row(ENG_Q_Q8_0, x.data() + (size_t)r * k, c8.data(), k), ENG_OK);
                for (int64_t b = 0; b < k / 32; b++) {
                    float dc = eng_fp16_to_f32(c8[b].d), dg = a.d8[(size_t)r * (k / 32) + b];
                    cr_assert(memcmp(&dc, &dg, 4) == 0, "k %ld row %d Q8_0 block %ld: d %a vs %a", (long)k, r,
                              (long)b, (double)dc, (double)dg);
                    cr_assert(memcmp(c8[b].qs, &a.q8[(size_t)r * k + 32 * b], 32) == 0,
                              "k %ld row %d Q8_0 block %ld: codes differ", (long)k, r, (long)b);
                }
                if (k % 256) continue;
                cr_assert_eq(eng_quantize_row(ENG_Q_Q8_K, x.data() + (size_t)r * k, ck.data(), k), ENG_OK);
                for (int64_t b = 0; b < k / 256; b++) {
                    float dg = a.dk[(size_t)r * (k / 256) + b];
                    cr_assert(memcmp(&ck[b].d, &dg, 4) == 0, "k %ld row %d Q8_K block %ld: d %a vs %a", (long)k,
                              r, (long)b, (double)ck[b].d, (double)dg);
                    cr_assert(memcmp(ck[b].qs, &a.qk[(size_t)r * k + 256 * b], 256) == 0,
                              "k %ld row %d Q8_K block %ld: codes differ", (long)k, r, (long)b);
                    cr_assert(memcmp(ck[b].bsums, &a.bk[(size_t)r * (k / 16) + 16 * b], 32) == 0,
                              "k %ld row %d Q8_K block %ld: sums differ", (long)k, r, (long)b);
                }
            }
        }
    }
}

/* ---- weights ------------------------------------------------------------------------------------------- */
static std::vector<int> scale_offsets(uint32_t t) {
    switch (t) {
    case CUD_Q8_0: case CUD_Q4_0: case CUD_Q5_0: return {0};
    case CUD_Q4_K: case CUD_Q5_K: return {0, 2};
    case CUD_Q6_K: return {208};
    default: return {};
    }
}

/* A [n_out][k] matrix of random blocks (finite fp16 scales; F16 / BF16 finite values), padded with junk to
 * a multiple of 16 bytes as the device allocation is. */
template <uint32_t T> static std::vector<uint8_t> random_matrix(std::mt19937 &rng, int64_t n_out, int64_t k,
                                                                 size_t *bytes) {
    using tr = mmv_traits<T>;
    const size_t n = (size_t)n_out * (size_t)(k / tr::BE) * tr::BB;
    std::vector<uint8_t> w((n + 15) / 16 * 16);
    for (auto &b : w) b = (uint8_t)rng();
    if constexpr (T == CUD_F16 || T == CUD_BF16) {
        std::normal_distribution<float> nd(0.f, 0.5f);
        for (size_t i = 0; i < n; i += 2) {
            uint16_t h = T == CUD_F16 ? eng_f32_to_fp16(nd(rng)) : eng_f32_to_bf16(nd(rng));
            memcpy(&w[i], &h, 2);
        }
    } else {
        for (size_t off = 0; off < n; off += tr::BB)
            for (int so : scale_offsets(T)) {
                w[off + so] = (uint8_t)rng();
                w[off + so + 1] = (uint8_t)(0x10 + rng() % 0x18); /* |d| in about [2^-11, 2^-3] */
                if (rng() & 1) w[off + so + 1] |= 0x80;
            }
    }
    *bytes = n;
    return w;
}

/* ---- integer block sums: CPU order, bit for bit --------------------------------------------------------- */
template <uint32_t T> static void check_block_terms(const char *name) {
    using tr = mmv_traits<T>;
    std::mt19937 rng(1000 + T);
    for (int64_t k : {256, 512, 2048, 4096}) {
        for (int trial = 0; trial < 4; trial++) {
            const int m = 1 + (trial * 3) % 8, n_out = 5;
            size_t nbytes;
            std::vector<uint8_t> w = random_matrix<T>(rng, n_out, k, &nbytes);
            std::vector<float> x = random_acts(rng, m, k, trial);
            host_act a;
            act_quant_host(x, m, k, &a);
            const mmv_act av = a.view();
            const uint32_t dt = tr::ACT == 1 ? ENG_Q_Q8_0 : ENG_Q_Q8_K;
            std::vector<uint8_t> xq(eng_qtype_row_bytes(dt, k));
            const int64_t nb = k / tr::BE;
            for (int a_ = 0; a_ < m; a_++) {
                cr_assert_eq(eng_quantize_row(dt, x.data() + (size_t)a_ * k, xq.data(), k), ENG_OK);
                for (int j = 0; j < n_out; j++) {
                    const uint8_t *row = w.data() + (size_t)j * nb * tr::BB;
                    float s = 0.f;
                    for (int64_t b = 0; b < nb; b++) {
                        int isum = 0, msum = 0;
                        for (int sub = 0; sub < tr::UPB; sub++) {
                            int is[MMV_MAX_M], ms[MMV_MAX_M];
                            mmv_unit_ints<T>(row + b * tr::BB, sub, av, b * tr::BE + 32 * sub, m, is, ms);
                            isum += is[a_];
                            msum += ms[a_];
                        }
                        s += mmv_block_term<T>(row + b * tr::BB, av, b, a_, isum, msum);
                    }
                    float c = eng_vec_dot(ENG_SIMD_SCALAR, T, k, row, xq.data());
                    cr_assert(memcmp(&s, &c, 4) == 0, "%s k %ld trial %d act %d row %d: kernel %a, CPU %a", name,
                              (long)k, trial, a_, j, (double)s, (double)c);
                }
            }
        }
    }
}

Test(cuda_mmv_host, block_sums_q4_0) { check_block_terms<CUD_Q4_0>("q4_0"); }
Test(cuda_mmv_host, block_sums_q5_0) { check_block_terms<CUD_Q5_0>("q5_0"); }
Test(cuda_mmv_host, block_sums_q8_0) { check_block_terms<CUD_Q8_0>("q8_0"); }
Test(cuda_mmv_host, block_sums_q4_k) { check_block_terms<CUD_Q4_K>("q4_K"); }
Test(cuda_mmv_host, block_sums_q5_k) { check_block_terms<CUD_Q5_K>("q5_K"); }
Test(cuda_mmv_host, block_sums_q6_k) { check_block_terms<CUD_Q6_K>("q6_K"); }

/* ---- k_mmv, one grid run on the host thread block by thread block ----------------------------------------- */
static float warp_sum_host(const float *v) { /* the xor butterfly of warp_sum: lane 0's value */
    float a[32];
    memcpy(a, v, sizeof a);
    for (int o = 16; o > 0; o >>= 1) {
        float b[32];
        for (int l = 0; l < 32; l++) b[l] = a[l] + a[l ^ o];
        memcpy(a, b, sizeof a);
    }
    return a[0];
}

template <uint32_t T>
static void run_mmv_host(const std::vector<uint8_t> &w, size_t nbytes, int64_t n_out, int64_t k, const mmv_act &x,
                         int m, int n_sm, std::vector<float> *y) {
    using tr = mmv_traits<T>;
    mmv_plan p{};
    cr_assert(mmv_make_plan<T>(n_out, k, n_sm, &p));
    cr_assert(p.rows_per_block >= 1 && p.rows_per_block <= MMV_WARPS && MMV_WARPS % p.rows_per_block == 0);
    const int64_t nb = k / tr::BE;
    y->assign((size_t)m * n_out, NAN);
    std::vector<uint8_t> staged(nbytes, 0);                       /* bytes staged at least once */
    std::vector<uint8_t> done((size_t)n_out * nb * tr::UPB, 0);   /* units computed */
    for (int64_t bid = 0; bid < p.grid; bid++) {
        std::vector<float> acc((size_t)MMV_THREADS * MMV_MAX_M, 0.f);
        std::vector<int64_t> row(MMV_THREADS, -1);
        int64_t fb0, fb1;
        for (int64_t ch = 0; mmv_chunk(p, n_out, nb, bid, ch, &fb0, &fb1); ch++) {
            cr_assert(fb0 < fb1 && fb1 <= n_out * nb, "chunk [%ld, %ld) outside the matrix", (long)fb0, (long)fb1);
            int64_t w0, w1;
            mmv_chunk_words(fb0, fb1, tr::BB, &w0, &w1);
            cr_assert(w1 - w0 <= MMV_SMEM_WORDS, "chunk of %ld words > staging %d", (long)(w1 - w0), MMV_SMEM_WORDS);
            cr_assert((size_t)w1 * 16 <= w.size(), "word %ld read past the padded matrix (%zu bytes)", (long)w1 - 1,
                      w.size());
            std::vector<uint8_t> stage((size_t)MMV_SMEM_WORDS * 16, 0xAB);
            for (int tid = 0; tid < MMV_THREADS; tid++)
                for (int64_t i = tid; w0 + i < w1; i += MMV_THREADS) {
                    memcpy(&stage[(size_t)i * 16], &w[(size_t)(w0 + i) * 16], 16);
                    for (int b = 0; b < 16; b++)
                        if ((size_t)(w0 + i) * 16 + b < nbytes) staged[(size_t)(w0 + i) * 16 + b] = 1;
                }
            mmv_share sh[MMV_THREADS];
            int64_t n_iter = 0;
            for (int tid = 0; tid < MMV_THREADS; tid++) {
                sh[tid] = mmv_thread_share(p, n_out, nb, tr::UPB, bid, fb0, fb1, tid);
                row[tid] = sh[tid].row;
                if (sh[tid].n_iter > n_iter) n_iter = sh[tid].n_iter;
                /* the group's iteration count is uniform (shuffles need whole warps) */
                cr_assert_eq(sh[tid].n_iter, sh[tid - tid % 32].n_iter);
            }
            for (int64_t it = 0; it < n_iter; it++) {
                std::vector<int> is((size_t)MMV_THREADS * MMV_MAX_M, 0), ms((size_t)MMV_THREADS * MMV_MAX_M, 0);
                std::vector<char> valid(MMV_THREADS, 0);
                std::vector<int64_t> fbv(MMV_THREADS, 0);
                std::vector<int> subv(MMV_THREADS, 0);
                for (int tid = 0; tid < MMV_THREADS; tid++) {
                    const mmv_share &s = sh[tid];
                    if (it >= s.n_iter) continue;
                    const int64_t u = s.t + it * s.group_threads;
                    valid[tid] = u < s.units;
                    const int64_t fb = s.blk0 + (valid[tid] ? u / tr::UPB : 0);
                    const int sub = (int)(u % tr::UPB);
                    fbv[tid] = fb;
                    subv[tid] = sub;
                    if (!valid[tid]) continue;
                    const int64_t off = fb * tr::BB - w0 * 16;
                    cr_assert(off >= 0 && off + tr::BB <= (w1 - w0) * 16, "unit outside the staged words");
                    const int64_t bcol = fb - s.row * nb;
                    cr_assert(bcol >= 0 && bcol < nb);
                    uint8_t &d = done[(size_t)(s.row * nb + bcol) * tr::UPB + sub];
                    cr_assert_eq(d, 0, "unit computed twice");
                    d = 1;
                    const uint8_t *blk = &stage[(size_t)off];
                    if constexpr (tr::ACT == 0) mmv_unit_float<T>(blk, x, bcol * tr::BE, m, &acc[(size_t)tid * MMV_MAX_M]);
                    else mmv_unit_ints<T>(blk, sub, x, bcol * tr::BE + 32 * sub, m, &is[(size_t)tid * MMV_MAX_M],
                                          &ms[(size_t)tid * MMV_MAX_M]);
                }
                if constexpr (tr::ACT != 0) {
                    if constexpr (tr::UPB == 8) { /* the xor shuffles 1, 2, 4 over 8 lanes: exact integer sums */
                        for (int g = 0; g < MMV_THREADS; g += 8) {
                            for (int q = 1; q < 8; q++)
                                if (valid[g + q] != valid[g] || (valid[g] && fbv[g + q] != fbv[g]))
                                    cr_assert_fail("8-lane group %d mixes super-blocks", g);
                            for (int a = 0; a < m; a++) {
                                int si = 0, sm = 0;
                                for (int q = 0; q < 8; q++) {
                                    si += is[(size_t)(g + q) * MMV_MAX_M + a];
                                    sm += ms[(size_t)(g + q) * MMV_MAX_M + a];
                                }
                                for (int q = 0; q < 8; q++) {
                                    is[(size_t)(g + q) * MMV_MAX_M + a] = si;
                                    ms[(size_t)(g + q) * MMV_MAX_M + a] = sm;
                                }
                            }
                        }
                    }
                    for (int tid = 0; tid < MMV_THREADS; tid++) {
                        if (!valid[tid] || subv[tid] != 0) continue;
                        const int64_t off = fbv[tid] * tr::BB - w0 * 16, bcol = fbv[tid] - sh[tid].row * nb;
                        for (int a = 0; a < m; a++)
                            acc[(size_t)tid * MMV_MAX_M + a] +=
                                mmv_block_term<T>(&stage[(size_t)off], x, bcol, a, is[(size_t)tid * MMV_MAX_M + a],
                                                  ms[(size_t)tid * MMV_MAX_M + a]);
                    }
                }
            }
        }
        /* warp sums, then each group's warps in order */
        float red[MMV_WARPS][MMV_MAX_M];
        for (int wp = 0; wp < MMV_WARPS; wp++)
            for (int a = 0; a < m; a++) {
                float v[32];
                for (int l = 0; l < 32; l++) v[l] = acc[(size_t)(32 * wp + l) * MMV_MAX_M + a];
                red[wp][a] = warp_sum_host(v);
            }
        const int wpg = MMV_WARPS / p.rows_per_block;
        for (int tid = 0; tid < MMV_THREADS; tid += wpg * 32) {
            if (row[tid] < 0) continue;
            for (int a = 0; a < m; a++) {
                float s = 0.f;
                for (int g = 0; g < wpg; g++) s += red[tid / 32 + g][a];
                cr_assert(std::isnan((*y)[(size_t)a * n_out + row[tid]]), "row written twice");
                (*y)[(size_t)a * n_out + row[tid]] = s;
            }
        }
    }
    for (size_t i = 0; i < nbytes; i++) cr_assert(staged[i], "matrix byte %zu never staged", i);
    for (size_t i = 0; i < done.size(); i++) cr_assert(done[i], "unit %zu never computed", i);
}

template <uint32_t T> static void check_grid(const char *name, std::initializer_list<int64_t> ks) {
    using tr = mmv_traits<T>;
    std::mt19937 rng(5000 + T);
    for (int64_t k : ks) {
        for (int64_t n_out : {1, 3, 17, 64}) {
            for (int n_sm : {1, 132}) {
                const int m = 1 + (int)((k / tr::BE + n_out + n_sm) % 8);
                size_t nbytes;
                std::vector<uint8_t> w = random_matrix<T>(rng, n_out, k, &nbytes);
                std::vector<float> x = random_acts(rng, m, k, (int)n_out);
                host_act a;
                act_quant_host(x, m, k, &a);
                std::vector<float> y;
                run_mmv_host<T>(w, nbytes, n_out, k, a.view(), m, n_sm, &y);
                /* the CPU engine: its activation format, its dot product; tolerance from sum |w_i x_i| */
                const uint32_t dt = tr::ACT == 0 ? ENG_Q_F32 : tr::ACT == 1 ? ENG_Q_Q8_0 : ENG_Q_Q8_K;
                std::vector<uint8_t> xq(eng_qtype_row_bytes(dt, k));
                std::vector<float> wd((size_t)k), xd((size_t)k);
                const size_t rb = (size_t)(k / tr::BE) * tr::BB;
                for (int r = 0; r < m; r++) {
                    cr_assert_eq(eng_quantize_row(dt, x.data() + (size_t)r * k, xq.data(), k), ENG_OK);
                    cr_assert_eq(eng_dequantize_row(dt, xq.data(), xd.data(), k), ENG_OK);
                    for (int64_t j = 0; j < n_out; j++) {
                        cr_assert_eq(eng_dequantize_row(T, w.data() + j * rb, wd.data(), k), ENG_OK);
                        double mag = 0;
                        for (int64_t i = 0; i < k; i++) mag += std::fabs((double)wd[i] * xd[i]);
                        float c = eng_vec_dot(ENG_SIMD_SCALAR, T, k, w.data() + j * rb, xq.data());
                        float g = y[(size_t)r * n_out + j];
                        cr_assert(std::fabs((double)g - c) <= 1e-5 * mag + 1e-30,
                                  "%s k %ld n_out %ld n_sm %d m %d: y[%d][%ld] kernel %g, CPU %g (mag %g)", name,
                                  (long)k, (long)n_out, n_sm, m, r, (long)j, (double)g, (double)c, mag);
                    }
                }
            }
        }
    }
}

/* k: one block per row, odd block counts, rows around and beyond one staging chunk (8 KiB) */
Test(cuda_mmv_host, grid_q4_0) { check_grid<CUD_Q4_0>("q4_0", {32, 96, 576, 2048, 14336}); }
Test(cuda_mmv_host, grid_q5_0) { check_grid<CUD_Q5_0>("q5_0", {32, 160, 576, 12288}); }
Test(cuda_mmv_host, grid_q8_0) { check_grid<CUD_Q8_0>("q8_0", {32, 64, 576, 2048, 8192}); }
Test(cuda_mmv_host, grid_q4_k) { check_grid<CUD_Q4_K>("q4_K", {256, 768, 2048, 14336}); }
Test(cuda_mmv_host, grid_q5_k) { check_grid<CUD_Q5_K>("q5_K", {256, 1280, 12288}); }
Test(cuda_mmv_host, grid_q6_k) { check_grid<CUD_Q6_K>("q6_K", {256, 768, 2048, 14336}); }
Test(cuda_mmv_host, grid_f16) { check_grid<CUD_F16>("f16", {32, 96, 576, 4128}); }
Test(cuda_mmv_host, grid_bf16) { check_grid<CUD_BF16>("bf16", {32, 160, 2048, 4128}); }

Test(cuda_mmv_host, every_m) {
    std::mt19937 rng(9);
    for (int m = 1; m <= MMV_MAX_M; m++) {
        const int64_t k = 768, n_out = 11;
        size_t nbytes;
        std::vector<uint8_t> w = random_matrix<CUD_Q4_K>(rng, n_out, k, &nbytes);
        std::vector<float> x = random_acts(rng, m, k, m);
        host_act a;
        act_quant_host(x, m, k, &a);
        std::vector<float> y;
        run_mmv_host<CUD_Q4_K>(w, nbytes, n_out, k, a.view(), m, 2, &y);
        std::vector<uint8_t> xq(eng_qtype_row_bytes(ENG_Q_Q8_K, k));
        for (int r = 0; r < m; r++) {
            cr_assert_eq(eng_quantize_row(ENG_Q_Q8_K, x.data() + (size_t)r * k, xq.data(), k), ENG_OK);
            for (int64_t j = 0; j < n_out; j++) {
                float c = eng_vec_dot(ENG_SIMD_SCALAR, CUD_Q4_K, k, w.data() + j * (k / 256) * 144, xq.data());
                float g = y[(size_t)r * n_out + j];
                cr_assert(std::fabs(g - c) <= 1e-4f * (std::fabs(c) + 1.f), "m %d y[%d][%ld] %g vs %g", m, r,
                          (long)j, (double)g, (double)c);
            }
        }
    }
}
