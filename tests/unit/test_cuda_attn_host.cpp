/* test_cuda_attn_host.cpp: the split-KV decode attention of cuda/cud_attn.cuh compiled for the host, on every
 * machine.
 *  - splits: a context's splits are contiguous, non-empty, cover [0, ctx) exactly, number at most
 *    ATTN_MAX_SPLITS, and never exceed the grid planned for any longer context (a function of ctx only);
 *  - index map: k_attn_split's blocks run phase by phase over a paged pool with shuffled block tables read
 *    every 16-byte word of every K and V row of a row's context exactly once per KV head, nothing past the
 *    context (no block-table entry past the sequence's blocks, no byte outside the pool), at edge shapes:
 *    1 position, block edges, split edges, GQA groups of 1, 2, 3, 4 and 8, head_dim 8 / 64 / 128 / 256, f16 and
 *    f32 caches (the pool types the CUDA backend takes);
 *  - results: the blocks' team merge and k_attn_merge's split merge equal a one-pass softmax in double on the
 *    host within float tolerance, and a row's output is bit for bit the same whatever the batch's grid (the
 *    longest context of the batch) it ran in. */
#include <criterion/criterion.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "engine/engine.h"
#include "engine/kernels/quant.h"
}

#include "tests/unit/helper_cuda_host.h"

#define CUD_DEQ_FN inline
#define CUD_ATTN_FN inline
#include "cuda/cud_attn.cuh"

using namespace cud_at;

/* ---- splits -------------------------------------------------------------------------------------------- */
Test(cuda_attn_host, splits_cover_each_context_and_fit_the_grid) {
    int prev_grid = 0;
    for (int32_t ctx = 1; ctx <= 70000; ctx += ctx < 20000 ? 1 : 97) {
        const int n = attn_n_split(ctx), grid = attn_grid_splits(ctx);
        cr_assert(n >= 1 && n <= ATTN_MAX_SPLITS, "ctx %d: %d splits", ctx, n);
        cr_assert(n <= grid, "ctx %d: %d splits, grid %d", ctx, n, grid);
        cr_assert(grid >= prev_grid, "the grid shrinks at ctx %d", ctx); /* so it bounds every shorter context */
        prev_grid = grid;
        int32_t next = 0;
        for (int s = 0; s < n; s++) {
            int32_t t0, t1;
            attn_split_range(ctx, s, &t0, &t1);
            cr_assert(t0 == next && t1 > t0 && t1 <= ctx, "ctx %d split %d: [%d, %d)", ctx, s, t0, t1);
            next = t1;
        }
        cr_assert_eq(next, ctx, "ctx %d: splits end at %d", ctx, next);
    }
    cr_assert_eq(attn_n_split(1 << 24), ATTN_MAX_SPLITS);
    cr_assert_eq(attn_grid_splits(1 << 24), ATTN_MAX_SPLITS);
}

Test(cuda_attn_host, geometry) {
    attn_geom g{};
    cr_assert(attn_make_geom(128, true, &g) && g.tp == 16 && g.w == 1 && g.dt == 8 && g.nteam == 8);
    cr_assert(attn_make_geom(64, true, &g) && g.tp == 8 && g.w == 1 && g.nteam == 16);
    cr_assert(attn_make_geom(256, true, &g) && g.tp == 32 && g.w == 1);
    cr_assert(attn_make_geom(8, true, &g) && g.tp == 1 && g.nteam == ATTN_THREADS);
    cr_assert(attn_make_geom(128, false, &g) && g.tp == 32 && g.w == 1 && g.dt == 4);
    cr_assert(attn_make_geom(256, false, &g) && g.tp == 32 && g.w == 2 && g.dt == 8);
    cr_assert(!attn_make_geom(80, true, &g));   /* 10 words: not a power of two */
    cr_assert(!attn_make_geom(512, true, &g));  /* head_dim > 256 */
    cr_assert(!attn_make_geom(512, false, &g)); /* 128 words */
    cr_assert(!attn_make_geom(6, false, &g));
    for (int hd : {8, 16, 32, 64, 128, 256})
        for (bool f16 : {true, false}) {
            cr_assert(attn_make_geom(hd, f16, &g));
            /* dynamic shared memory stays under the 48 KiB a launch gets without opting in */
            cr_assert(attn_shmem_bytes(g, ATTN_MAX_G, hd) <= 48 * 1024, "hd %d: %zu bytes", hd,
                      attn_shmem_bytes(g, ATTN_MAX_G, hd));
        }
}

/* ---- a paged pool on the host ----------------------------------------------------------------------------- */
struct host_pool {
    int hd = 0, n_kv = 0, bs = 0, n_blocks = 0, n_layer = 2;
    bool f16 = true;
    attn_kv kv{};
    std::vector<uint8_t> bytes; /* [n_layer][2][n_blocks][n_kv][bs][row] */
    float value(int layer, int which, int32_t block, int kvh, int off, int d) const {
        const uint8_t *row = bytes.data() + (size_t)(2 * layer + which) * kv.layer_bytes +
                             (size_t)block * kv.block_stride + (size_t)kvh * kv.head_stride + (size_t)off * kv.row_bytes;
        if (f16) {
            uint16_t h;
            memcpy(&h, row + 2 * d, 2);
            return eng_fp16_to_f32(h);
        }
        float f;
        memcpy(&f, row + 4 * d, 4);
        return f;
    }
};

static void pool_make(host_pool *p, int hd, int n_kv, int bs, int n_blocks, bool f16, std::mt19937 &rng) {
    p->hd = hd;
    p->n_kv = n_kv;
    p->bs = bs;
    p->n_blocks = n_blocks;
    p->f16 = f16;
    p->kv.row_bytes = (size_t)hd * (f16 ? 2 : 4);
    p->kv.head_stride = (size_t)bs * p->kv.row_bytes;
    p->kv.block_stride = (size_t)n_kv * p->kv.head_stride;
    p->kv.layer_bytes = (size_t)n_blocks * p->kv.block_stride;
    p->kv.block_size = bs;
    p->bytes.resize((size_t)2 * p->n_layer * p->kv.layer_bytes);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (size_t i = 0; i < p->bytes.size(); i += f16 ? 2 : 4) {
        float v = u(rng);
        if (f16) {
            uint16_t h = eng_f32_to_fp16(v);
            memcpy(&p->bytes[i], &h, 2);
        } else {
            memcpy(&p->bytes[i], &v, 4);
        }
    }
    p->kv.base = (const char *)p->bytes.data();
}

/* One batch: rows with their contexts, each row its own sequence and block table (distinct blocks, shuffled;
 * entries past the sequence are -1 so that reading one would be caught). */
struct host_batch {
    int n_head = 0, n_kv = 0, hd = 0, rows = 0;
    int32_t stride = 0;
    float scale = 0.f;
    std::vector<int32_t> pos, seq, tables;
    std::vector<float> q; /* [rows][n_head][hd] */
};

struct read_log { /* reads of one (row, KV head): [2][ctx][row_words] */
    int32_t ctx = 0;
    int row_words = 0;
    std::vector<int> n;
    int &at(int which, int32_t t, int w) { return n[((size_t)which * ctx + t) * row_words + w]; }
};

/* k_attn_split's block (s, kvh, r) phase by phase: every thread's loads through the index map (checked and
 * logged), the team shuffles, the online softmax, the team merge through "shared memory". Writes the row's
 * output for one split, else the split's partial results. */
template <int GB, bool F16, int W>
static void run_block(const host_pool &P, int layer, const attn_geom &geo, const host_batch &B, int s, int kvh,
                      int r, read_log *log, std::vector<float> &out, std::vector<float> &part_acc,
                      std::vector<float> &part_ml) {
    constexpr int DT = W * (F16 ? 8 : 4);
    const int32_t ctx = B.pos[r] + 1;
    const int n_split = attn_n_split(ctx);
    if (s >= n_split) return;
    int32_t t0, t1;
    attn_split_range(ctx, s, &t0, &t1);
    const int G = B.n_head / B.n_kv, h0 = kvh * G, hd = B.hd, tp = geo.tp, nteam = geo.nteam;
    const int32_t *table = B.tables.data() + (size_t)B.seq[r] * B.stride;
    const int32_t need = (ctx + P.bs - 1) / P.bs;
    std::vector<attn_state<GB, DT>> st(ATTN_THREADS);
    for (int tid = 0; tid < ATTN_THREADS; tid++)
        attn_init<GB, DT>(&st[tid], B.q.data() + (size_t)r * B.n_head * hd, h0, G, hd, tp, geo.vpw, tid % tp,
                          B.scale);
    const int32_t n_iter = attn_n_iter(geo, t0, t1);
    std::vector<float> sc((size_t)ATTN_THREADS * ATTN_P * GB), sc2(sc.size());
    std::vector<float> v((size_t)ATTN_THREADS * ATTN_P * DT);
    std::vector<char> valid((size_t)ATTN_THREADS * ATTN_P);
    for (int32_t it = 0; it < n_iter; it++) {
        for (int tid = 0; tid < ATTN_THREADS; tid++) {
            const int team = tid / tp, lane = tid % tp;
            for (int p = 0; p < ATTN_P; p++) {
                const int32_t t = attn_pos_of(geo, t0, it, p, team);
                const bool ok = t < t1;
                valid[tid * ATTN_P + p] = ok;
                float k[DT] = {0};
                float *vp = &v[((size_t)tid * ATTN_P + p) * DT];
                for (int e = 0; e < DT; e++) vp[e] = 0.f;
                if (ok) {
                    cr_assert(t >= t0 && t / P.bs < need, "row %d: position %d read (ctx %d)", r, t, ctx);
                    cr_assert(table[t / P.bs] >= 0 && table[t / P.bs] < P.n_blocks, "bad table entry read");
                    for (int which = 0; which < 2; which++) {
                        const size_t off = attn_row_offset(P.kv, layer, which, table, t, kvh);
                        for (int j = 0; j < W; j++) {
                            const int word = attn_word_of(geo, lane, j);
                            cr_assert(word < geo.row_words);
                            cr_assert(off % 16 == 0 && off + (size_t)(word + 1) * 16 <= P.bytes.size(),
                                      "read outside the pool");
                            log->at(which, t, word)++;
                        }
                        attn_row_dims<F16, W>(P.kv.base + off, tp, lane, which == 0 ? k : vp);
                    }
                }
                attn_partial_dots<GB, DT>(st[tid], k, &sc[((size_t)tid * ATTN_P + p) * GB]);
            }
        }
        /* sc += __shfl_xor_sync(sc, o) for o = tp/2 .. 1, inside aligned groups of tp lanes */
        for (int o = tp / 2; o > 0; o >>= 1) {
            for (int tid = 0; tid < ATTN_THREADS; tid++)
                for (int i = 0; i < ATTN_P * GB; i++)
                    sc2[(size_t)tid * ATTN_P * GB + i] =
                        sc[(size_t)tid * ATTN_P * GB + i] + sc[(size_t)(tid ^ o) * ATTN_P * GB + i];
            sc.swap(sc2);
        }
        for (int tid = 0; tid < ATTN_THREADS; tid++) {
            float scp[ATTN_P][GB], vv[ATTN_P][DT];
            bool ok[ATTN_P];
            for (int p = 0; p < ATTN_P; p++) {
                ok[p] = valid[tid * ATTN_P + p];
                for (int g = 0; g < GB; g++) scp[p][g] = sc[((size_t)tid * ATTN_P + p) * GB + g];
                for (int e = 0; e < DT; e++) vv[p][e] = v[((size_t)tid * ATTN_P + p) * DT + e];
            }
            attn_update<GB, DT>(&st[tid], scp, vv, ok);
        }
    }
    /* shared memory, as the kernel lays it out */
    std::vector<float> sh(attn_shmem_bytes(geo, G, hd) / sizeof(float), NAN);
    float *tm = sh.data(), *tl = tm + nteam * G, *tw = tl + nteam * G, *hM = tw + nteam * G, *hL = hM + G;
    float *tacc = hL + G;
    for (int tid = 0; tid < ATTN_THREADS; tid++) {
        const int team = tid / tp, lane = tid % tp;
        for (int g = 0; g < G; g++) {
            if (lane == 0) {
                tm[team * G + g] = st[tid].m[g];
                tl[team * G + g] = st[tid].l[g];
            }
            for (int e = 0; e < DT; e++) {
                const int d = (lane + (e / geo.vpw) * tp) * geo.vpw + e % geo.vpw;
                cr_assert(d < hd);
                tacc[((size_t)team * G + g) * hd + d] = st[tid].acc[g][e];
            }
        }
    }
    for (size_t i = 0; i < sh.size(); i++)
        if (i < (size_t)2 * nteam * G || i >= (size_t)3 * nteam * G + 2 * G)
            cr_assert(!std::isnan(sh[i]), "shared word %zu not written", i);
    for (int g = 0; g < G; g++) attn_team_weights(tm, tl, nteam, G, g, tw, &hM[g], &hL[g]);
    for (int i = 0; i < G * hd; i++) {
        const int g = i / hd, d = i % hd;
        const float o = attn_team_output(tacc, tw, nteam, G, hd, g, d);
        const size_t rh = (size_t)r * B.n_head + h0 + g;
        if (n_split == 1) {
            out[rh * hd + d] = hL[g] > 0.f ? o / hL[g] : 0.f;
        } else {
            part_acc[(rh * ATTN_MAX_SPLITS + s) * hd + d] = o;
            if (d == 0) {
                part_ml[(rh * ATTN_MAX_SPLITS + s) * 2] = hM[g];
                part_ml[(rh * ATTN_MAX_SPLITS + s) * 2 + 1] = hL[g];
            }
        }
    }
}

/* The whole launch: k_attn_split over the grid (splits of the longest context, KV heads, rows), then
 * k_attn_merge; checks the read log of every (row, KV head). */
template <int GB, bool F16, int W>
static void run_attention(const host_pool &P, int layer, const host_batch &B, int grid_splits,
                          std::vector<float> &out) {
    attn_geom geo{};
    cr_assert(attn_make_geom(B.hd, F16, &geo) && geo.w == W);
    out.assign((size_t)B.rows * B.n_head * B.hd, NAN);
    std::vector<float> part_acc((size_t)B.rows * B.n_head * ATTN_MAX_SPLITS * B.hd, NAN);
    std::vector<float> part_ml((size_t)B.rows * B.n_head * ATTN_MAX_SPLITS * 2, NAN);
    for (int r = 0; r < B.rows; r++)
        for (int kvh = 0; kvh < B.n_kv; kvh++) {
            read_log log;
            log.ctx = B.pos[r] + 1;
            log.row_words = geo.row_words;
            log.n.assign((size_t)2 * log.ctx * geo.row_words, 0);
            cr_assert(attn_n_split(log.ctx) <= grid_splits, "the grid misses splits of row %d", r);
            for (int s = 0; s < grid_splits; s++)
                run_block<GB, F16, W>(P, layer, geo, B, s, kvh, r, &log, out, part_acc, part_ml);
            for (int which = 0; which < 2; which++)
                for (int32_t t = 0; t < log.ctx; t++)
                    for (int w = 0; w < geo.row_words; w++)
                        cr_assert_eq(log.at(which, t, w), 1, "row %d kv head %d: %c word %d of position %d read %d times",
                                     r, kvh, which ? 'V' : 'K', w, t, log.at(which, t, w));
        }
    if (grid_splits == 1) return;
    for (int r = 0; r < B.rows; r++) {
        const int n = attn_n_split(B.pos[r] + 1);
        if (n == 1) continue;
        for (int h = 0; h < B.n_head; h++) {
            const size_t rh = (size_t)r * B.n_head + h;
            for (int d = 0; d < B.hd; d++)
                out[rh * B.hd + d] = attn_merge_splits(&part_ml[rh * ATTN_MAX_SPLITS * 2],
                                                       &part_acc[rh * ATTN_MAX_SPLITS * B.hd], n, B.hd, d);
        }
    }
}

/* One-pass softmax in double over the dequantized pool (q pre-scaled in float as the kernel does). */
static void reference(const host_pool &P, int layer, const host_batch &B, int r, int h, std::vector<double> &o,
                      std::vector<double> &mag) {
    const int G = B.n_head / B.n_kv, kvh = h / G, hd = B.hd;
    const int32_t ctx = B.pos[r] + 1;
    const int32_t *table = B.tables.data() + (size_t)B.seq[r] * B.stride;
    std::vector<double> s(ctx);
    double mx = -1e300;
    for (int32_t t = 0; t < ctx; t++) {
        double d = 0;
        for (int i = 0; i < hd; i++)
            d += (double)(B.q[((size_t)r * B.n_head + h) * hd + i] * B.scale) *
                 P.value(layer, 0, table[t / P.bs], kvh, t % P.bs, i);
        s[t] = d;
        mx = std::fmax(mx, d);
    }
    double L = 0;
    for (int32_t t = 0; t < ctx; t++) L += (s[t] = std::exp(s[t] - mx));
    o.assign(hd, 0.0);
    mag.assign(hd, 0.0);
    for (int32_t t = 0; t < ctx; t++)
        for (int i = 0; i < hd; i++) {
            const double v = P.value(layer, 1, table[t / P.bs], kvh, t % P.bs, i);
            o[i] += s[t] / L * v;
            mag[i] += s[t] / L * std::fabs(v);
        }
}

template <int GB, bool F16, int W>
static void check_shape(int hd, int n_kv, int G, int bs, const std::vector<int32_t> &ctxs, uint32_t seed) {
    std::mt19937 rng(seed);
    host_batch B;
    B.n_kv = n_kv;
    B.n_head = n_kv * G;
    B.hd = hd;
    B.rows = (int)ctxs.size();
    B.scale = 1.0f / std::sqrt((float)hd);
    int32_t max_ctx = 1, total_blocks = 0;
    for (int32_t c : ctxs) {
        max_ctx = c > max_ctx ? c : max_ctx;
        total_blocks += (c + bs - 1) / bs;
    }
    B.stride = (max_ctx + bs - 1) / bs + 1; /* one -1 entry past every table at least */
    host_pool P;
    pool_make(&P, hd, n_kv, bs, total_blocks + 3, F16, rng);
    std::vector<int32_t> perm(P.n_blocks);
    for (int i = 0; i < P.n_blocks; i++) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    B.tables.assign((size_t)B.rows * B.stride, -1);
    int next = 0;
    for (int r = 0; r < B.rows; r++) {
        B.pos.push_back(ctxs[r] - 1);
        B.seq.push_back(B.rows - 1 - r); /* rows and sequences in different orders */
        for (int32_t b = 0; b < (ctxs[r] + bs - 1) / bs; b++) B.tables[(size_t)(B.rows - 1 - r) * B.stride + b] = perm[next++];
    }
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    B.q.resize((size_t)B.rows * B.n_head * hd);
    for (float &x : B.q) x = u(rng);
    const int layer = 1;
    std::vector<float> out;
    run_attention<GB, F16, W>(P, layer, B, attn_grid_splits(max_ctx), out);
    std::vector<double> ref, mag;
    for (int r = 0; r < B.rows; r++)
        for (int h = 0; h < B.n_head; h++) {
            reference(P, layer, B, r, h, ref, mag);
            for (int d = 0; d < hd; d++) {
                const float got = out[((size_t)r * B.n_head + h) * hd + d];
                const double tol = 2e-6 * (double)(ctxs[r] > 64 ? 8 : 1) * mag[d] + 1e-7;
                cr_assert(std::fabs(got - ref[d]) <= tol,
                          "hd %d G %d kv %d bs %d ctx %d head %d dim %d: %.9g vs %.9g (tol %.3g)", hd, G, n_kv, bs,
                          ctxs[r], h, d, got, ref[d], tol);
            }
        }
    /* the same rows alone, each in the grid of its own context: bit for bit the batch's numbers */
    for (int r = 0; r < B.rows; r += 2) {
        host_batch one = B;
        one.rows = 1;
        one.pos = {B.pos[r]};
        one.seq = {B.seq[r]};
        one.q.assign(B.q.begin() + (size_t)r * B.n_head * hd, B.q.begin() + (size_t)(r + 1) * B.n_head * hd);
        std::vector<float> o1;
        run_attention<GB, F16, W>(P, layer, one, attn_grid_splits(B.pos[r] + 1), o1);
        cr_assert(memcmp(o1.data(), out.data() + (size_t)r * B.n_head * hd, o1.size() * sizeof(float)) == 0,
                  "row %d (ctx %d) differs alone and in the batch", r, ctxs[r]);
    }
}

template <bool F16, int W>
static void check_groups(int hd, int bs, const std::vector<int32_t> &ctxs, uint32_t seed) {
    check_shape<1, F16, W>(hd, 2, 1, bs, ctxs, seed + 1);
    check_shape<2, F16, W>(hd, 2, 2, bs, ctxs, seed + 2);
    check_shape<4, F16, W>(hd, 1, 3, bs, ctxs, seed + 3); /* G = 3 runs in the GB = 4 instance */
    check_shape<4, F16, W>(hd, 2, 4, bs, ctxs, seed + 4);
    check_shape<8, F16, W>(hd, 1, 8, bs, ctxs, seed + 5);
}

/* contexts at the edges: one position, around a block, around the first split edge (128) and around the
 * point where splits start to lengthen (4096) */
static std::vector<int32_t> edge_ctxs(int bs) { return {1, bs - 1, bs, bs + 1, 127, 128, 129, 300, 4097}; }

Test(cuda_attn_host, f16_head_dim_128, .timeout = 600) { check_groups<true, 1>(128, 16, edge_ctxs(16), 100); }
Test(cuda_attn_host, f16_head_dim_64, .timeout = 600) { check_groups<true, 1>(64, 32, edge_ctxs(32), 200); }
Test(cuda_attn_host, f32_head_dim_128, .timeout = 600) { check_groups<false, 1>(128, 16, edge_ctxs(16), 300); }
Test(cuda_attn_host, f32_head_dim_64, .timeout = 600) { check_groups<false, 1>(64, 16, {1, 15, 16, 17, 129, 4100}, 400); }
Test(cuda_attn_host, small_and_wide_heads, .timeout = 600) {
    /* stories260K's head_dim 8 (one lane per position), head_dim 256 (f32: two words per lane) */
    check_shape<2, true, 1>(8, 4, 2, 16, {1, 2, 16, 17, 200, 5000}, 500);
    check_shape<8, true, 1>(256, 1, 8, 16, {1, 16, 129, 1000}, 501);
    check_shape<4, false, 2>(256, 2, 4, 32, {1, 31, 32, 33, 129, 1000}, 502);
    check_shape<1, false, 1>(16, 1, 1, 16, {1, 3, 16, 130}, 503);
}
Test(cuda_attn_host, long_contexts, .timeout = 600) {
    /* past 4096 positions the split length grows: 20 000 positions in 32 splits of 640 */
    check_shape<4, true, 1>(64, 1, 4, 16, {8191, 8192, 20000}, 600);
}
