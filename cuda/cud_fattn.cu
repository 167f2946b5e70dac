// cud_fattn.cu: prefill attention on the tensor cores (k_fattn) and its GPU self-test. The fragment layouts,
// index maps and per-lane phases are in cud_fattn.cuh; see cud_fattn.h for the launcher's contract.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <random>
#include <vector>

#include "common/common.h"
#include "cuda/cud_fattn.cuh"
#include "cuda/cud_fattn.h"

namespace {

using namespace cud_fa;

// grid: (n_tiles, n_kv_head), block: FA_THREADS. Tiles run last first (a run's later tiles see more keys).
template <int HD>
__global__ void __launch_bounds__(FA_THREADS) k_fattn(cud_at::attn_kv kv, int layer, cud_fattn_args a) {
    __shared__ __align__(16) uint16_t sk[fa_smem<HD>::K_ELEMS]; // the Q tile, then K tiles [FA_BC][LDK]
    __shared__ __align__(16) uint16_t sv[fa_smem<HD>::V_ELEMS]; // V^T tiles [HD][LDV]
    const int ti = a.n_tiles - 1 - (int)blockIdx.x, kvh = blockIdx.y;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    fa_tile t;
    t.row0 = a.tiles[2 * ti];
    t.n = a.tiles[2 * ti + 1];
    t.pos0 = a.pos[t.row0];
    t.kv_end = t.pos0 + t.n;
    t.G = a.n_head / a.n_kv_head;
    t.h0 = kvh * t.G;
    const int32_t *table = a.tables + (int64_t)a.seq_index[t.row0] * a.stride;

#pragma unroll 4
    for (int k = 0; k < fa_smem<HD>::Q_STEPS; k++) {
        int qr, d2;
        if (fa_q_elem<HD>(tid, k, &qr, &d2)) fa_copy_q<HD>(t, a.q, a.n_head, qr, d2, sk);
    }
    __syncthreads();
    fa_lane<HD> st;
    fa_init<HD>(&st);
    fa_load_q<HD>(&st, sk, warp, lane);
    __syncthreads();

    const float scale_log2 = a.scale * FA_LOG2E;
    for (int32_t t0 = 0; t0 < t.kv_end; t0 += FA_BC) {
#pragma unroll
        for (int k = 0; k < fa_smem<HD>::KV_STEPS; k++) {
            int p, c;
            fa_k_word<HD>(tid, k, &p, &c);
            fa_copy_kv<HD>(kv, layer, 0, table, kvh, t.kv_end, t0, p, c, sk, sv);
            fa_v_word<HD>(tid, k, &p, &c);
            fa_copy_kv<HD>(kv, layer, 1, table, kvh, t.kv_end, t0, p, c, sk, sv);
        }
        __syncthreads();
        if (fa_warp_sees(t, warp, t0)) { // uniform over the warp
            fa_zero_s<HD>(&st);
#pragma unroll
            for (int j = 0; j < FA_BC / 8; j++)
#pragma unroll
                for (int kc = 0; kc < HD / 16; kc++) {
                    uint32_t b[2];
                    fa_k_frag<HD>(sk, j, kc, lane, b);
                    fa_mma(st.s[j], st.qa[kc], b);
                }
            float mx[2];
            fa_scores<HD>(&st, t, warp, lane, t0, scale_log2, mx);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            }
            fa_rescale<HD>(&st, mx);
#pragma unroll
            for (int kk = 0; kk < FA_BC / 16; kk++) {
                uint32_t pa[4];
                fa_p_frag<HD>(st, kk, pa);
#pragma unroll
                for (int dn = 0; dn < HD / 8; dn++) {
                    uint32_t b[2];
                    fa_v_frag<HD>(sv, dn, kk, lane, b);
                    fa_mma(st.o[dn], pa, b);
                }
            }
        }
        __syncthreads();
    }
    float lsum[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        lsum[h] = st.l[h];
        lsum[h] += __shfl_xor_sync(0xffffffffu, lsum[h], 1);
        lsum[h] += __shfl_xor_sync(0xffffffffu, lsum[h], 2);
    }
    fa_store<HD>(st, t, warp, lane, lsum, a.n_head, a.out);
}

// One mma.sync per lane of one warp on given fragments: d [32][4] = A B + c.
__global__ void k_mma_probe(const uint32_t *a, const uint32_t *b, const float *c, float *d, int bf16) {
    const int lane = threadIdx.x;
    uint32_t ar[4], br[2];
    float acc[4];
    for (int i = 0; i < 4; i++) ar[i] = a[lane * 4 + i];
    for (int i = 0; i < 2; i++) br[i] = b[lane * 2 + i];
    for (int i = 0; i < 4; i++) acc[i] = c[lane * 4 + i];
    if (bf16) fa_mma_bf16(acc, ar, br);
    else fa_mma(acc, ar, br);
    for (int i = 0; i < 4; i++) d[lane * 4 + i] = acc[i];
}

} // namespace

bool cud_fattn_supported(int32_t n_head, int32_t n_kv_head, int32_t head_dim, bool f16) {
    return f16 && (head_dim == 64 || head_dim == 128) && n_kv_head >= 1 && n_head >= n_kv_head &&
           n_head % n_kv_head == 0 && n_head / n_kv_head <= FA_MAX_G;
}

int cud_fattn_tile_rows(int32_t n_head, int32_t n_kv_head) { return fa_tile_rows(n_head / n_kv_head); }

int32_t cud_fattn_plan(const int32_t *pos, const int32_t *seq, int32_t n, int32_t n_head, int32_t n_kv_head,
                       int32_t *tiles, int32_t *longest) {
    return fa_plan_tiles(pos, seq, n, cud_fattn_tile_rows(n_head, n_kv_head), tiles, longest);
}

cudaError_t cud_fattn(const cud_kv_view *kv, int32_t layer, const cud_fattn_args *a, cudaStream_t st) {
    if (!cud_fattn_supported(a->n_head, a->n_kv_head, a->hd, kv->f16) || a->n_tiles < 0 || a->n_tiles > 65535)
        return cudaErrorInvalidValue;
    if (a->n_tiles == 0) return cudaSuccess;
    const cud_at::attn_kv v{(const char *)kv->base, kv->layer_bytes, kv->block_stride, kv->head_stride,
                            kv->row_bytes, kv->block_size};
    const dim3 grid((unsigned)a->n_tiles, (unsigned)a->n_kv_head);
    if (a->hd == 64) k_fattn<64><<<grid, FA_THREADS, 0, st>>>(v, layer, *a);
    else k_fattn<128><<<grid, FA_THREADS, 0, st>>>(v, layer, *a);
    return cudaGetLastError();
}

// ---- the GPU self-test ----------------------------------------------------------------------------------------

namespace {

struct dev_bufs {
    std::vector<void *> p;
    ~dev_bufs() {
        for (void *x : p) cudaFree(x);
    }
    template <typename T> cudaError_t get(T **out, size_t n) {
        void *x = nullptr;
        cudaError_t e = cudaMalloc(&x, n * sizeof(T) + 16);
        if (e != cudaSuccess) return e;
        p.push_back(x);
        *out = (T *)x;
        return cudaSuccess;
    }
};

#define ST_CK(call)                                                                                              \
    do {                                                                                                         \
        cudaError_t e_ = (call);                                                                                 \
        if (e_ != cudaSuccess) {                                                                                 \
            snprintf(msg, msg_len, "%s: %s", #call, cudaGetErrorString(e_));                                    \
            return KVS_ERR_DEVICE;                                                                               \
        }                                                                                                        \
    } while (0)

int mma_check(std::mt19937 &rng, bool bf16, double *worst, char *msg, size_t msg_len) {
    std::uniform_real_distribution<float> U(-2.f, 2.f);
    uint32_t a[32][4], b[32][2];
    float c[32][4], d[32][4], e[32][4];
    auto bits = [&](float f) -> uint16_t {
        if (!bf16) return fa_f2h(f);
        return (uint16_t)(cud_f2u(f) >> 16); // truncation: any bf16 value will do
    };
    for (int l = 0; l < 32; l++) {
        for (int r = 0; r < 4; r++) a[l][r] = fa_pack(bits(U(rng)), bits(U(rng)));
        for (int r = 0; r < 2; r++) b[l][r] = fa_pack(bits(U(rng)), bits(U(rng)));
        for (int r = 0; r < 4; r++) c[l][r] = U(rng);
    }
    dev_bufs m;
    uint32_t *da, *db;
    float *dc, *dd;
    ST_CK(m.get(&da, 128));
    ST_CK(m.get(&db, 64));
    ST_CK(m.get(&dc, 128));
    ST_CK(m.get(&dd, 128));
    ST_CK(cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice));
    ST_CK(cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice));
    ST_CK(cudaMemcpy(dc, c, sizeof c, cudaMemcpyHostToDevice));
    k_mma_probe<<<1, 32>>>(da, db, dc, dd, bf16 ? 1 : 0);
    ST_CK(cudaGetLastError());
    ST_CK(cudaMemcpy(d, dd, sizeof d, cudaMemcpyDeviceToHost));
    fa_mma_emul(a, b, c, e, bf16);
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++) {
            // 16 products of values up to 2 plus c: the hardware's sum is within a few ulps of 70
            const double err = fabs((double)d[l][i] - (double)e[l][i]);
            if (err > *worst) *worst = err;
            if (err > 1e-4) {
                snprintf(msg, msg_len, "mma %s lane %d element %d: GPU %.9g, emulation %.9g", bf16 ? "bf16" : "f16", l,
                         i, d[l][i], e[l][i]);
                return KVS_ERR_DEVICE;
            }
        }
    return KVS_OK;
}

// One synthetic prefill: a sequence with `prefix` cached positions and a chunk of n rows after it (batch rows
// 1 .. n; row 0 is a decode row of another sequence at position 40), in an f16 pool of 2 layers.
int fattn_check(std::mt19937 &rng, int hd, int G, int bs, int32_t prefix, int32_t n, double *worst, char *msg,
                size_t msg_len) {
    const int n_kv = 2, n_head = n_kv * G, layer = 1;
    const int32_t len1 = prefix + n, len0 = 41;
    const int32_t nb1 = (len1 + bs - 1) / bs, nb0 = (len0 + bs - 1) / bs, nblocks = nb0 + nb1 + 3;
    const size_t row_bytes = (size_t)hd * 2, head_stride = row_bytes * bs, block_stride = head_stride * n_kv;
    const size_t layer_bytes = block_stride * nblocks, pool_bytes = layer_bytes * 4;
    std::vector<uint16_t> pool(pool_bytes / 2);
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    for (auto &x : pool) x = fa_f2h(U(rng));
    std::vector<int32_t> perm(nblocks);
    for (int i = 0; i < nblocks; i++) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    const int32_t stride = nb0 > nb1 ? nb0 : nb1;
    std::vector<int32_t> tables(2 * (size_t)stride, -1);
    for (int i = 0; i < nb0; i++) tables[i] = perm[i];
    for (int i = 0; i < nb1; i++) tables[stride + i] = perm[nb0 + i];
    const int32_t rows = n + 1;
    std::vector<int32_t> pos(rows), seq(rows);
    pos[0] = len0 - 1;
    seq[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        pos[1 + i] = prefix + i;
        seq[1 + i] = 1;
    }
    std::vector<float> q((size_t)rows * n_head * hd), out(q.size());
    for (auto &x : q) x = 2.f * U(rng);
    std::vector<int32_t> tiles(2 * (size_t)rows);
    const int32_t n_tiles = cud_fattn_plan(pos.data(), seq.data(), rows, n_head, n_kv, tiles.data(), nullptr);

    dev_bufs m;
    char *dpool;
    float *dq, *dout;
    int32_t *dpos, *dseq, *dtab, *dtiles;
    ST_CK(m.get(&dpool, pool_bytes));
    ST_CK(m.get(&dq, q.size()));
    ST_CK(m.get(&dout, q.size()));
    ST_CK(m.get(&dpos, rows));
    ST_CK(m.get(&dseq, rows));
    ST_CK(m.get(&dtab, tables.size()));
    ST_CK(m.get(&dtiles, tiles.size()));
    ST_CK(cudaMemcpy(dpool, pool.data(), pool_bytes, cudaMemcpyHostToDevice));
    ST_CK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
    ST_CK(cudaMemset(dout, 0xFF, q.size() * 4)); // NaN: a row the kernel misses shows
    ST_CK(cudaMemcpy(dpos, pos.data(), rows * 4, cudaMemcpyHostToDevice));
    ST_CK(cudaMemcpy(dseq, seq.data(), rows * 4, cudaMemcpyHostToDevice));
    ST_CK(cudaMemcpy(dtab, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
    ST_CK(cudaMemcpy(dtiles, tiles.data(), tiles.size() * 4, cudaMemcpyHostToDevice));
    cud_kv_view kv{};
    kv.base = dpool;
    kv.layer_bytes = layer_bytes;
    kv.block_stride = block_stride;
    kv.head_stride = head_stride;
    kv.row_bytes = row_bytes;
    kv.block_size = bs;
    kv.n_kv_head = n_kv;
    kv.head_dim = hd;
    kv.f16 = true;
    cud_fattn_args a{};
    a.q = dq;
    a.out = dout;
    a.pos = dpos;
    a.seq_index = dseq;
    a.tables = dtab;
    a.stride = stride;
    a.tiles = dtiles;
    a.n_tiles = n_tiles;
    a.n_head = n_head;
    a.n_kv_head = n_kv;
    a.hd = hd;
    a.scale = 1.0f / sqrtf((float)hd);
    ST_CK(cud_fattn(&kv, layer, &a, 0));
    ST_CK(cudaDeviceSynchronize());
    ST_CK(cudaMemcpy(out.data(), dout, q.size() * 4, cudaMemcpyDeviceToHost));
    const cud_at::attn_kv hk{(const char *)pool.data(), layer_bytes, block_stride, head_stride, row_bytes, bs};
    std::vector<double> ref(hd);
    for (int32_t r = 0; r < rows; r++)
        for (int h = 0; h < n_head; h++) {
            const float *qh = q.data() + ((size_t)r * n_head + h) * hd;
            fa_reference(hk, layer, tables.data() + (size_t)seq[r] * stride, pos[r], qh, h / G, hd, a.scale, ref.data());
            for (int d = 0; d < hd; d++) {
                const double got = out[((size_t)r * n_head + h) * hd + d], err = fabs(got - ref[d]);
                if (err > *worst) *worst = err;
                if (!(err <= 2e-3)) {
                    snprintf(msg, msg_len, "k_fattn hd %d G %d block %d prefix %d rows %d: row %d head %d dim %d: "
                             "GPU %.6g, reference %.6g", hd, G, bs, prefix, n, r, h, d, got, ref[d]);
                    return KVS_ERR_DEVICE;
                }
            }
        }
    return KVS_OK;
}

} // namespace

extern "C" int cud_fattn_selftest(char *msg, size_t msg_len) {
    char dummy[8];
    int rc = cud_selftest_open(&msg, &msg_len, dummy, sizeof dummy);
    if (rc) return rc;
    std::mt19937 rng(24);
    double w_mma = 0., w_fa = 0.;
    for (int round = 0; round < 8; round++)
        if ((rc = mma_check(rng, round & 1, &w_mma, msg, msg_len))) return rc;
    struct shape { int hd, G, bs, prefix, n; };
    const shape shapes[] = {{64, 1, 16, 0, 1},   {64, 4, 16, 0, 7},    {64, 4, 13, 37, 7},  {128, 8, 16, 21, 64},
                            {128, 4, 32, 100, 200}, {64, 8, 16, 5, 200}, {128, 1, 16, 0, 130}, {128, 4, 16, 300, 1}};
    for (const shape &s : shapes)
        if ((rc = fattn_check(rng, s.hd, s.G, s.bs, s.prefix, s.n, &w_fa, msg, msg_len))) return rc;
    snprintf(msg, msg_len, "mma f16/bf16: worst difference from the emulation %.3g; k_fattn: worst difference "
             "from the reference %.3g over %d shapes", w_mma, w_fa, (int)(sizeof shapes / sizeof shapes[0]));
    return KVS_OK;
}
