// cud_attn.cu: split-KV decode attention (k_attn_split, k_attn_merge). The index maps and per-thread
// arithmetic are in cud_attn.cuh; see cud_kernels.cuh for the launcher's contract.
#include "cuda/cud_attn.cuh"
#include "cuda/cud_kernels.cuh"

namespace {

using namespace cud_at;

constexpr int WARP = 32;

// grid: (splits, n_kv_head, rows), block: ATTN_THREADS. GB >= G query heads per KV head; F16: the cache's
// type; W: 16-byte words per lane of a row (see attn_make_geom).
template <int GB, bool F16, int W>
__global__ void __launch_bounds__(ATTN_THREADS) k_attn_split(attn_kv kv, int layer, attn_geom geo, cud_attn_args a) {
    constexpr int DT = W * (F16 ? 8 : 4);
    const int s = blockIdx.x, kvh = blockIdx.y, r = blockIdx.z;
    const int32_t ctx = a.pos[r] + 1;
    const int n_split = attn_n_split(ctx);
    if (s >= n_split) return; // uniform over the block
    int32_t t0, t1;
    attn_split_range(ctx, s, &t0, &t1);
    const int G = a.n_head / a.n_kv_head, h0 = kvh * G, hd = a.hd;
    const int tid = threadIdx.x, tp = geo.tp, team = tid / tp, lane = tid % tp;
    const int32_t *table = a.tables + (int64_t)a.seq_index[r] * a.stride;

    attn_state<GB, DT> st;
    attn_init<GB, DT>(&st, a.q + (int64_t)r * a.n_head * hd, h0, G, hd, tp, geo.vpw, lane, a.scale);
    const int32_t n_iter = attn_n_iter(geo, t0, t1);
    for (int32_t it = 0; it < n_iter; it++) {
        float sc[ATTN_P][GB], v[ATTN_P][DT];
        bool valid[ATTN_P];
#pragma unroll
        for (int p = 0; p < ATTN_P; p++) {
            const int32_t t = attn_pos_of(geo, t0, it, p, team);
            valid[p] = t < t1;
            float k[DT];
            if (valid[p]) {
                attn_row_dims<F16, W>(kv.base + attn_row_offset(kv, layer, 0, table, t, kvh), tp, lane, k);
                attn_row_dims<F16, W>(kv.base + attn_row_offset(kv, layer, 1, table, t, kvh), tp, lane, v[p]);
            } else {
#pragma unroll
                for (int e = 0; e < DT; e++) k[e] = v[p][e] = 0.f;
            }
            attn_partial_dots<GB, DT>(st, k, sc[p]);
        }
        // the team's sums: xor shuffles inside aligned groups of tp lanes (every lane of the warp takes part)
#pragma unroll
        for (int p = 0; p < ATTN_P; p++)
#pragma unroll
            for (int g = 0; g < GB; g++)
                for (int o = tp / 2; o > 0; o >>= 1) sc[p][g] += __shfl_xor_sync(0xffffffffu, sc[p][g], o);
        attn_update<GB, DT>(&st, sc, v, valid);
    }

    // merge the teams (in team order) through shared memory
    extern __shared__ float sh[];
    const int nteam = geo.nteam;
    float *tm = sh, *tl = tm + nteam * G, *tw = tl + nteam * G, *hM = tw + nteam * G, *hL = hM + G;
    float *tacc = hL + G; // [nteam][G][hd]
#pragma unroll
    for (int g = 0; g < GB; g++) {
        if (g >= G) break;
        if (lane == 0) {
            tm[team * G + g] = st.m[g];
            tl[team * G + g] = st.l[g];
        }
#pragma unroll
        for (int e = 0; e < DT; e++) {
            const int d = (lane + (e / geo.vpw) * tp) * geo.vpw + e % geo.vpw;
            tacc[((size_t)team * G + g) * hd + d] = st.acc[g][e];
        }
    }
    __syncthreads();
    if (tid < G) attn_team_weights(tm, tl, nteam, G, tid, tw, &hM[tid], &hL[tid]);
    __syncthreads();
    for (int i = tid; i < G * hd; i += ATTN_THREADS) {
        const int g = i / hd, d = i % hd;
        const float o = attn_team_output(tacc, tw, nteam, G, hd, g, d);
        const int64_t rh = (int64_t)r * a.n_head + h0 + g;
        if (n_split == 1) {
            a.out[rh * hd + d] = hL[g] > 0.f ? o / hL[g] : 0.f;
        } else {
            a.part_acc[(rh * ATTN_MAX_SPLITS + s) * hd + d] = o;
            if (d == 0) {
                a.part_ml[(rh * ATTN_MAX_SPLITS + s) * 2] = hM[g];
                a.part_ml[(rh * ATTN_MAX_SPLITS + s) * 2 + 1] = hL[g];
            }
        }
    }
}

// grid: (n_head, rows), threads: >= hd. Rows of one split were written by k_attn_split directly.
__global__ void k_attn_merge(cud_attn_args a) {
    const int h = blockIdx.x, r = blockIdx.y, d = threadIdx.x;
    const int n = attn_n_split(a.pos[r] + 1);
    if (n == 1 || d >= a.hd) return;
    const int64_t rh = (int64_t)r * a.n_head + h;
    a.out[rh * a.hd + d] =
        attn_merge_splits(a.part_ml + rh * ATTN_MAX_SPLITS * 2, a.part_acc + rh * ATTN_MAX_SPLITS * a.hd, n, a.hd, d);
}

template <int GB, bool F16, int W>
cudaError_t launch(const attn_kv &kv, int layer, const attn_geom &geo, const cud_attn_args *a, int splits,
                   cudaStream_t st) {
    const int G = a->n_head / a->n_kv_head;
    dim3 grid((unsigned)splits, (unsigned)a->n_kv_head, (unsigned)a->rows);
    k_attn_split<GB, F16, W><<<grid, ATTN_THREADS, attn_shmem_bytes(geo, G, a->hd), st>>>(kv, layer, geo, *a);
    return cudaGetLastError();
}

template <bool F16, int W>
cudaError_t launch_g(const attn_kv &kv, int layer, const attn_geom &geo, const cud_attn_args *a, int splits,
                     cudaStream_t st) {
    const int G = a->n_head / a->n_kv_head;
    if (G <= 1) return launch<1, F16, W>(kv, layer, geo, a, splits, st);
    if (G <= 2) return launch<2, F16, W>(kv, layer, geo, a, splits, st);
    if (G <= 4) return launch<4, F16, W>(kv, layer, geo, a, splits, st);
    return launch<8, F16, W>(kv, layer, geo, a, splits, st);
}

} // namespace

bool cud_attn_split_supported(int32_t n_head, int32_t n_kv_head, int32_t head_dim, bool f16) {
    attn_geom g;
    if (n_kv_head < 1 || n_head < n_kv_head || n_head % n_kv_head != 0 || n_head / n_kv_head > ATTN_MAX_G)
        return false;
    return attn_make_geom(head_dim, f16, &g);
}

int cud_attn_split_grid(int32_t max_ctx) { return attn_grid_splits(max_ctx); }

cudaError_t cud_attn_split(const cud_kv_view *kv, int32_t layer, const cud_attn_args *a, cudaStream_t st) {
    attn_geom geo{};
    if (!cud_attn_split_supported(a->n_head, a->n_kv_head, a->hd, kv->f16) ||
        !attn_make_geom(a->hd, kv->f16, &geo) || a->partitions < 1 || a->partitions > ATTN_MAX_SPLITS ||
        a->rows < 1 || a->rows > 65535 || a->hd > 1024)
        return cudaErrorInvalidValue;
    const attn_kv v{(const char *)kv->base, kv->layer_bytes, kv->block_stride, kv->head_stride, kv->row_bytes,
                    kv->block_size};
    cudaError_t e;
    if (kv->f16) e = launch_g<true, 1>(v, layer, geo, a, a->partitions, st);
    else if (geo.w == 1) e = launch_g<false, 1>(v, layer, geo, a, a->partitions, st);
    else e = launch_g<false, 2>(v, layer, geo, a, a->partitions, st);
    if (e != cudaSuccess || a->partitions == 1) return e;
    const unsigned threads = (unsigned)((a->hd + WARP - 1) / WARP * WARP);
    k_attn_merge<<<dim3((unsigned)a->n_head, (unsigned)a->rows), threads, 0, st>>>(*a);
    return cudaGetLastError();
}
