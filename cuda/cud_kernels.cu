// cud_kernels.cu: kernels of the CUDA backend. See cud_kernels.cuh.
#include "cuda/cud_kernels.cuh"
#include "cuda/cud_mmv.cuh"

#include <cfloat>
#include <cstdio>

#include "common/common.h"

namespace {

constexpr int WARP = 32;

using namespace cud_deq;


// grid.y strides over the rows (a grid's y dimension is limited to 65535; vocabularies are larger).
template <uint32_t T, typename O>
__global__ void k_dequant(const uint8_t *w, int64_t rows, int64_t k, O *y) {
    for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
        const uint8_t *r = w + row * (k / blk<T>::E) * blk<T>::B;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < k;
             i += (int64_t)gridDim.x * blockDim.x) {
            float v = deq_at<T>(r, i);
            if constexpr (sizeof(O) == 2) y[row * k + i] = __float2half_rn(v);
            else y[row * k + i] = v;
        }
    }
}

template <uint32_t T>
__global__ void k_get_rows(const uint8_t *table, int64_t k, const int32_t *ids, int32_t n, float *y) {
    for (int64_t r = blockIdx.y; r < n; r += gridDim.y) {
        const uint8_t *row = table + (int64_t)ids[r] * (k / blk<T>::E) * blk<T>::B;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < k;
             i += (int64_t)gridDim.x * blockDim.x)
            y[r * k + i] = deq_at<T>(row, i);
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

constexpr int MV_MAX_M = 8;

// A weight or activation as the matrix products read it: f32 with f32 weights; rounded to f16 otherwise, as
// the cuBLAS path (batches over MATVEC_MAX_ROWS rows) reads both, so that a row's result does not depend on
// the batch size beyond summation order.
template <uint32_t T> __device__ __forceinline__ float act(float v) {
    if constexpr (T == CUD_F32) return v;
    else return __half2float(__float2half_rn(v));
}

// One warp per output row; each lane takes whole blocks, so a block's scales are read once per lane.
template <uint32_t T>
__global__ void k_matvec(const uint8_t *w, int64_t n_out, int64_t k, const float *x, int m, float *y) {
    int64_t j = (int64_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (j >= n_out) return;
    const int64_t nb = k / blk<T>::E;
    const uint8_t *row = w + j * nb * blk<T>::B;
    float acc[MV_MAX_M];
#pragma unroll
    for (int r = 0; r < MV_MAX_M; r++) acc[r] = 0.f;
    if constexpr (blk<T>::E == 1) {
        for (int64_t i = lane; i < k; i += WARP) {
            float wv = act<T>(deq<T>(row + i * blk<T>::B, 0));
#pragma unroll
            for (int r = 0; r < MV_MAX_M; r++)
                if (r < m) acc[r] += wv * act<T>(x[(int64_t)r * k + i]);
        }
    } else {
        for (int64_t b = lane; b < nb; b += WARP) {
            const uint8_t *bp = row + b * blk<T>::B;
            for (int e = 0; e < blk<T>::E; e++) {
                float wv = act<T>(deq<T>(bp, e));
                int64_t i = b * blk<T>::E + e;
#pragma unroll
                for (int r = 0; r < MV_MAX_M; r++)
                    if (r < m) acc[r] += wv * act<T>(x[(int64_t)r * k + i]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MV_MAX_M; r++) {
        if (r >= m) break;
        float s = warp_sum(acc[r]);
        if (lane == 0) y[(int64_t)r * n_out + j] = s;
    }
}

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The CPU engine's scale: (float)(1 / sqrt(ss / n + eps)) with ss the sum of squares in double.
__device__ __forceinline__ float rms_scale(double ss, int n, float eps) {
    return (float)(1.0 / sqrt(ss / (double)n + (double)eps));
}

// One block per row (x and y may alias).
__global__ void k_rmsnorm(const float *x, const float *w, float *y, int n, float eps) {
    const float *xr = x + (int64_t)blockIdx.x * n;
    float *yr = y + (int64_t)blockIdx.x * n;
    __shared__ double red[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += (double)xr[i] * (double)xr[i];
    s = warp_sum_d(s);
    if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = s;
    __syncthreads();
    if (threadIdx.x < WARP) {
        double t = threadIdx.x < blockDim.x / WARP ? red[threadIdx.x] : 0.0;
        t = warp_sum_d(t);
        if (threadIdx.x == 0) red[0] = t;
    }
    __syncthreads();
    const float scale = rms_scale(red[0], n, eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

// One warp per (row, head).
__global__ void k_head_rmsnorm(float *x, const float *w, int total, int hd, float eps) {
    int idx = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (idx >= total) return;
    float *v = x + (int64_t)idx * hd;
    double s = 0.0;
    for (int i = lane; i < hd; i += WARP) s += (double)v[i] * (double)v[i];
    s = warp_sum_d(s);
    const float scale = rms_scale(s, hd, eps);
    for (int i = lane; i < hd; i += WARP) v[i] = __fmul_rn(__fmul_rn(v[i], scale), w[i]);
}

__global__ void k_add_bias(float *x, const float *b, int64_t total, int n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += b[i % n];
}
__global__ void k_add(float *x, const float *y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}
__global__ void k_swiglu(float *g, const float *u, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float a = g[i];
        g[i] = a / (1.f + expf(-a)) * u[i];
    }
}
__global__ void k_f32_to_f16(const float *x, __half *y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2half_rn(x[i]);
}

// x0' = x0 c - x1 s, x1' = x0 s + x1 c, each product and sum rounded (no FMA contraction), as on the CPU.
__device__ __forceinline__ void rope_pair(float *a, float *b, float c, float s) {
    float x0 = *a, x1 = *b;
    *a = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    *b = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// grid: rows, threads: pairs
__global__ void k_rope_cs(const int32_t *pos, const float *inv_freq, int half, float *cs) {
    const int r = blockIdx.x;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double th = (double)pos[r] * (double)inv_freq[i], sn, cn;
        sincos(th, &sn, &cn);
        cs[((int64_t)r * half + i) * 2] = (float)cn;
        cs[((int64_t)r * half + i) * 2 + 1] = (float)sn;
    }
}

// grid: (rows * n_heads), threads: n_rot / 2 pairs
__global__ void k_rope(float *x, const float *cs, int n_heads, cud_rope_params rp) {
    const int rh = blockIdx.x, r = rh / n_heads, half = rp.n_rot / 2;
    float *v = x + (int64_t)rh * rp.head_dim;
    const float *c = cs + (int64_t)r * rp.n_rot;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        if (rp.neox) rope_pair(&v[i], &v[i + half], c[2 * i], c[2 * i + 1]);
        else rope_pair(&v[2 * i], &v[2 * i + 1], c[2 * i], c[2 * i + 1]);
    }
}

__device__ __forceinline__ char *kv_row(const cud_kv_view &kv, int layer, int which, int32_t slot, int head) {
    int32_t block = slot / kv.block_size, off = slot % kv.block_size;
    return (char *)kv.base + (size_t)(2 * layer + which) * kv.layer_bytes + (size_t)block * kv.block_stride +
           (size_t)head * kv.head_stride + (size_t)off * kv.row_bytes;
}

__device__ __forceinline__ float kv_load(const char *row, int d, bool f16) {
    if (f16) return __half2float(((const __half *)row)[d]);
    return ((const float *)row)[d];
}

// The store kv_load reads back: v rounded to nearest f16, or as is in an f32 cache.
__device__ __forceinline__ void kv_store(char *row, int d, bool f16, float v) {
    if (f16) ((__half *)row)[d] = __float2half_rn(v);
    else ((float *)row)[d] = v;
}

// grid: rows, threads: any; writes every kv head's K and V row.
__global__ void k_kv_store(cud_kv_view kv, int layer, const float *k, const float *v, const int32_t *slot) {
    int r = blockIdx.x;
    int32_t s = slot[r];
    if (s < 0) return;
    int width = kv.n_kv_head * kv.head_dim;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        int h = i / kv.head_dim, d = i % kv.head_dim;
        char *kr = kv_row(kv, layer, 0, s, h), *vr = kv_row(kv, layer, 1, s, h);
        float kval = k[(int64_t)r * width + i], vval = v[(int64_t)r * width + i];
        kv_store(kr, d, kv.f16, kval);
        kv_store(vr, d, kv.f16, vval);
    }
}

// grid: (n slots, n_layer * n_kv_head), threads: n_rot / 2
__global__ void k_kv_rerotate(cud_kv_view kv, const int32_t *slots, const float *cs, cud_rope_params rp) {
    int32_t s = slots[blockIdx.x];
    int layer = blockIdx.y / kv.n_kv_head, h = blockIdx.y % kv.n_kv_head;
    char *row = kv_row(kv, layer, 0, s, h);
    for (int i = threadIdx.x; i < rp.n_rot / 2; i += blockDim.x) {
        int a = rp.neox ? i : 2 * i, b = rp.neox ? i + rp.n_rot / 2 : 2 * i + 1;
        float x0 = kv_load(row, a, kv.f16), x1 = kv_load(row, b, kv.f16);
        rope_pair(&x0, &x1, cs[2 * i], cs[2 * i + 1]);
        kv_store(row, a, kv.f16, x0);
        kv_store(row, b, kv.f16, x1);
    }
}

constexpr int ATT_WARPS = 4;
constexpr int ATT_MAX_PER_LANE = 8; // head_dim <= 256

// grid: (n_head, rows, partitions), block: ATT_WARPS warps. Each warp walks tokens of the partition with an
// online softmax; warps are merged at the end; partitions are merged by k_attn_reduce.
__global__ void k_paged_attention(cud_kv_view kv, int layer, cud_attn_args a) {
    const int h = blockIdx.x, r = blockIdx.y, part = blockIdx.z;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int hd = a.hd, per_lane = (hd + WARP - 1) / WARP;
    const int kvh = h / (a.n_head / a.n_kv_head);
    const int32_t seq = a.seq_index[r];
    const int32_t n_ctx = a.pos[r] + 1;
    const int32_t t0 = part * a.partition_tokens;
    const int32_t t1 = min(n_ctx, t0 + a.partition_tokens);
    const int32_t *table = a.tables + (int64_t)seq * a.stride;
    const float *q = a.q + ((int64_t)r * a.n_head + h) * hd;

    float qv[ATT_MAX_PER_LANE], acc[ATT_MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
        int d = lane + i * WARP;
        qv[i] = (i < per_lane && d < hd) ? q[d] * a.scale : 0.f;
        acc[i] = 0.f;
    }
    float m = -FLT_MAX, l = 0.f;
    for (int32_t t = t0 + warp; t < t1; t += ATT_WARPS) {
        int32_t block = table[t / kv.block_size];
        int32_t slot = block * kv.block_size + t % kv.block_size;
        const char *krow = kv_row(kv, layer, 0, slot, kvh);
        const char *vrow = kv_row(kv, layer, 1, slot, kvh);
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
            int d = lane + i * WARP;
            if (i < per_lane && d < hd) s += qv[i] * kv_load(krow, d, kv.f16);
        }
        s = warp_sum(s);
        float m_new = fmaxf(m, s);
        float corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
            int d = lane + i * WARP;
            if (i < per_lane && d < hd) acc[i] = acc[i] * corr + p * kv_load(vrow, d, kv.f16);
        }
        m = m_new;
    }
    // Merge the warps: shared (m, l) per warp and acc per warp.
    extern __shared__ float sh[]; // [ATT_WARPS][2] + [ATT_WARPS][hd]
    float *sml = sh, *sacc = sh + 2 * ATT_WARPS;
    if (lane == 0) {
        sml[2 * warp] = m;
        sml[2 * warp + 1] = l;
    }
#pragma unroll
    for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
        int d = lane + i * WARP;
        if (i < per_lane && d < hd) sacc[warp * hd + d] = acc[i];
    }
    __syncthreads();
    if (warp != 0) return;
    float M = -FLT_MAX;
    for (int w = 0; w < ATT_WARPS; w++)
        if (sml[2 * w + 1] > 0.f) M = fmaxf(M, sml[2 * w]);
    float L = 0.f;
    float wsc[ATT_WARPS];
    for (int w = 0; w < ATT_WARPS; w++) {
        wsc[w] = sml[2 * w + 1] > 0.f ? expf(sml[2 * w] - M) : 0.f;
        L += sml[2 * w + 1] * wsc[w];
    }
    for (int i = 0; i < per_lane; i++) {
        int d = lane + i * WARP;
        if (d >= hd) break;
        float o = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) o += sacc[w * hd + d] * wsc[w];
        if (a.partitions == 1) {
            a.out[((int64_t)r * a.n_head + h) * hd + d] = L > 0.f ? o / L : 0.f;
        } else {
            a.part_acc[(((int64_t)r * a.n_head + h) * a.partitions + part) * hd + d] = o;
        }
    }
    if (a.partitions > 1 && lane == 0) {
        float *ml = a.part_ml + (((int64_t)r * a.n_head + h) * a.partitions + part) * 2;
        ml[0] = M;
        ml[1] = L;
    }
}

// grid: (n_head, rows), threads: hd (<= 256)
__global__ void k_attn_reduce(cud_attn_args a) {
    const int h = blockIdx.x, r = blockIdx.y, d = threadIdx.x;
    if (d >= a.hd) return;
    const int64_t base = ((int64_t)r * a.n_head + h) * a.partitions;
    const int n_ctx = a.pos[r] + 1;
    const int used = (n_ctx + a.partition_tokens - 1) / a.partition_tokens;
    float M = -FLT_MAX;
    for (int p = 0; p < used; p++)
        if (a.part_ml[(base + p) * 2 + 1] > 0.f) M = fmaxf(M, a.part_ml[(base + p) * 2]);
    float L = 0.f, o = 0.f;
    for (int p = 0; p < used; p++) {
        float lp = a.part_ml[(base + p) * 2 + 1];
        if (lp <= 0.f) continue;
        float w = expf(a.part_ml[(base + p) * 2] - M);
        L += lp * w;
        o += a.part_acc[(base + p) * a.hd + d] * w;
    }
    a.out[((int64_t)r * a.n_head + h) * a.hd + d] = L > 0.f ? o / L : 0.f;
}


// ---- decode products: activation quantization and k_mmv (see cud_mmv.cuh) ---------------------------------
using namespace cud_mv;

constexpr int AQ_THREADS = 256; // must equal k_rmsnorm's launch width: the fused norm gives the same bits

// One block per activation row: optionally the RMSNorm (k_rmsnorm's arithmetic and reduction order), then
// the f32 row, its Q8_0 form and (k % 256 == 0) its Q8_K form.
__global__ void __launch_bounds__(AQ_THREADS) k_act_quant(const float *x, const float *nw, float eps, int64_t k,
                                                          float *xf, int8_t *q8, float *d8, int8_t *qk, float *dk,
                                                          int16_t *bk) {
    const int64_t r = blockIdx.x;
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const float *xr = x + r * k;
    __shared__ double red[32];
    __shared__ float pick_a[AQ_THREADS / WARP];
    __shared__ int pick_i[AQ_THREADS / WARP];
    __shared__ float pick_v[AQ_THREADS / WARP];
    float scale = 1.f;
    if (nw) {
        double s = 0.0;
        for (int64_t i = tid; i < k; i += blockDim.x) s += (double)xr[i] * (double)xr[i];
        s = warp_sum_d(s);
        if (lane == 0) red[warp] = s;
        __syncthreads();
        if (tid < WARP) {
            double t = tid < (int)blockDim.x / WARP ? red[tid] : 0.0;
            t = warp_sum_d(t);
            if (tid == 0) red[0] = t;
        }
        __syncthreads();
        scale = rms_scale(red[0], (int)k, eps);
    }
    const bool kq = k % 256 == 0;
    for (int64_t base = 0; base < k; base += AQ_THREADS) {
        const int64_t i = base + tid;
        const bool in = i < k; // k % 32 == 0: a warp is all in or all out
        float v = 0.f;
        if (in) {
            v = nw ? __fmul_rn(__fmul_rn(xr[i], scale), nw[i]) : xr[i];
            xf[r * k + i] = v;
        }
        // Q8_0: one warp per 32-value block
        float amax = fabsf(v);
        for (int o = WARP / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        float d, id;
        mmv_q8_0_scale(amax, &d, &id);
        if (in) {
            q8[r * k + i] = mmv_q8_code(v, id);
            if (lane == 0) d8[r * (k / 32) + i / 32] = d;
        }
        if (!kq) continue; // uniform over the block
        // Q8_K: the whole block is one 256-value super-block
        float a = fabsf(v);
        int ia = tid;
        for (int o = WARP / 2; o > 0; o >>= 1) {
            float b = __shfl_xor_sync(0xffffffffu, a, o);
            int ib = __shfl_xor_sync(0xffffffffu, ia, o);
            mmv_absmax_pick(&a, &ia, b, ib);
        }
        __syncthreads();
        if (lane == 0) {
            pick_a[warp] = a;
            pick_i[warp] = ia;
        }
        __syncthreads();
        float ba = pick_a[0];
        int bi = pick_i[0];
        for (int w = 1; w < AQ_THREADS / WARP; w++) mmv_absmax_pick(&ba, &bi, pick_a[w], pick_i[w]);
        __syncthreads();
        if (tid == bi) pick_v[0] = v;
        __syncthreads();
        float iscale, dkv;
        mmv_q8_k_scale(ba == 0.f ? 0.f : pick_v[0], &iscale, &dkv);
        const int8_t c = ba == 0.f ? (int8_t)0 : mmv_q8_code(v, iscale);
        qk[r * k + i] = c;
        int sum = c;
        for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if ((lane & 15) == 0) bk[r * (k / 16) + i / 16] = (int16_t)sum;
        if (tid == 0) dk[r * (k / 256) + i / 256] = dkv;
    }
}

// The decode product of cud_mmv.cuh: see the index maps and per-thread functions there.
template <uint32_t T>
__global__ void __launch_bounds__(MMV_THREADS) k_mmv(const uint8_t *w, int64_t n_out, int64_t k, mmv_plan p,
                                                     mmv_act x, int m, float *y) {
    using tr = mmv_traits<T>;
    __shared__ uint4 stage[MMV_SMEM_WORDS];
    __shared__ float red[MMV_WARPS][MMV_MAX_M];
    const int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const int64_t nb = k / tr::BE, bid = blockIdx.x;
    float acc[MMV_MAX_M];
#pragma unroll
    for (int a = 0; a < MMV_MAX_M; a++) acc[a] = 0.f;
    int64_t row = -1, fb0, fb1;
    const uint4 *src = (const uint4 *)w;
    for (int64_t ch = 0; mmv_chunk(p, n_out, nb, bid, ch, &fb0, &fb1); ch++) {
        int64_t w0, w1;
        mmv_chunk_words(fb0, fb1, tr::BB, &w0, &w1);
        __syncthreads(); // the previous chunk is consumed
        for (int64_t i = tid; w0 + i < w1; i += MMV_THREADS) stage[i] = __ldg(src + w0 + i);
        __syncthreads();
        const mmv_share s = mmv_thread_share(p, n_out, nb, tr::UPB, bid, fb0, fb1, tid);
        row = s.row;
        const uint8_t *sb = (const uint8_t *)stage;
        for (int64_t it = 0; it < s.n_iter; it++) {
            const int64_t u = s.t + it * s.group_threads;
            const bool valid = u < s.units;
            const int64_t fb = s.blk0 + (valid ? u / tr::UPB : 0);
            const int sub = (int)(u % tr::UPB);
            const uint8_t *blk = sb + (fb * tr::BB - w0 * 16);
            const int64_t bcol = fb - s.row * nb;
            if constexpr (tr::ACT == 0) {
                if (valid) mmv_unit_float<T>(blk, x, bcol * tr::BE, m, acc);
            } else {
                int is[MMV_MAX_M], ms[MMV_MAX_M];
#pragma unroll
                for (int a = 0; a < MMV_MAX_M; a++) is[a] = ms[a] = 0;
                if (valid) mmv_unit_ints<T>(blk, sub, x, bcol * tr::BE + 32 * sub, m, is, ms);
                if constexpr (tr::UPB == 8) {
#pragma unroll
                    for (int a = 0; a < MMV_MAX_M; a++) {
                        if (a >= m) break;
#pragma unroll
                        for (int o = 1; o < 8; o <<= 1) {
                            is[a] += __shfl_xor_sync(0xffffffffu, is[a], o);
                            ms[a] += __shfl_xor_sync(0xffffffffu, ms[a], o);
                        }
                    }
                }
                if (valid && sub == 0) {
#pragma unroll
                    for (int a = 0; a < MMV_MAX_M; a++) {
                        if (a >= m) break;
                        acc[a] = __fadd_rn(acc[a], mmv_block_term<T>(blk, x, bcol, a, is[a], ms[a]));
                    }
                }
            }
        }
    }
#pragma unroll
    for (int a = 0; a < MMV_MAX_M; a++) {
        if (a >= m) break;
        const float v = warp_sum(acc[a]);
        if (lane == 0) red[warp][a] = v;
    }
    __syncthreads();
    const int wpg = MMV_WARPS / p.rows_per_block; // warps per row
    if (row >= 0 && tid % (wpg * WARP) == 0) {
        for (int a = 0; a < m; a++) {
            float s = 0.f;
            for (int g = 0; g < wpg; g++) s = __fadd_rn(s, red[warp + g][a]);
            y[(int64_t)a * n_out + row] = s;
        }
    }
}

// grid: n_out rows; y[i][:] = x[rows[i]][:]
__global__ void k_gather_rows(const float *x, int64_t n, const int32_t *rows, float *y) {
    const float *src = x + (int64_t)rows[blockIdx.x] * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[(int64_t)blockIdx.x * n + i] = src[i];
}

int grid_for(int64_t n, int threads) {
    int64_t g = (n + threads - 1) / threads;
    return (int)(g < 65535 ? (g < 1 ? 1 : g) : 65535);
}

} // namespace

int cud_type_block_elems(uint32_t type) {
    switch (type) {
#define CUD_CASE(T_, E_, B_) case T_: return E_;
    CUD_TYPES(CUD_CASE)
#undef CUD_CASE
    default: return 0;
    }
}

int cud_type_block_bytes(uint32_t type) {
    switch (type) {
#define CUD_CASE(T_, E_, B_) case T_: return B_;
    CUD_TYPES(CUD_CASE)
#undef CUD_CASE
    default: return 0;
    }
}

// Calls F.template operator()<T>() for the runtime type id; returns cudaErrorInvalidValue for unknown types.
template <typename F> static cudaError_t dispatch(uint32_t type, F &&f) {
    switch (type) {
#define CUD_CASE(T_, E_, B_) case T_: f.template operator()<T_>(); break;
    CUD_TYPES(CUD_CASE)
#undef CUD_CASE
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

static unsigned grid_rows(int64_t rows) { return (unsigned)(rows < 65535 ? rows : 65535); }

cudaError_t cud_dequant_f32(uint32_t type, const void *w, int64_t rows, int64_t k, float *y, cudaStream_t st) {
    if (rows < 1 || k < 1) return cudaErrorInvalidValue;
    return dispatch(type, [&]<uint32_t T>() {
        dim3 grid(grid_for(k, 256), grid_rows(rows));
        k_dequant<T, float><<<grid, 256, 0, st>>>((const uint8_t *)w, rows, k, y);
    });
}

cudaError_t cud_dequant_f16(uint32_t type, const void *w, int64_t rows, int64_t k, __half *y, cudaStream_t st) {
    if (rows < 1 || k < 1) return cudaErrorInvalidValue;
    return dispatch(type, [&]<uint32_t T>() {
        dim3 grid(grid_for(k, 256), grid_rows(rows));
        k_dequant<T, __half><<<grid, 256, 0, st>>>((const uint8_t *)w, rows, k, y);
    });
}

cudaError_t cud_get_rows(uint32_t type, const void *table, int64_t k, const int32_t *ids, int32_t n, float *y,
                         cudaStream_t st) {
    if (n < 1) return cudaSuccess;
    return dispatch(type, [&]<uint32_t T>() {
        dim3 grid(grid_for(k, 256), grid_rows(n));
        k_get_rows<T><<<grid, 256, 0, st>>>((const uint8_t *)table, k, ids, n, y);
    });
}

cudaError_t cud_matvec(uint32_t type, const void *w, int64_t n_out, int64_t k, const float *x, int32_t m,
                       float *y, cudaStream_t st) {
    if (m < 1 || m > MV_MAX_M) return cudaErrorInvalidValue;
    return dispatch(type, [&]<uint32_t T>() {
        const int warps = 8;
        k_matvec<T><<<(unsigned)((n_out + warps - 1) / warps), warps * WARP, 0, st>>>(
            (const uint8_t *)w, n_out, k, x, m, y);
    });
}

cudaError_t cud_rmsnorm(const float *x, const float *w, float *y, int32_t rows, int32_t n, float eps,
                        cudaStream_t st) {
    if (rows < 1) return cudaSuccess;
    k_rmsnorm<<<rows, 256, 0, st>>>(x, w, y, n, eps);
    return cudaGetLastError();
}

cudaError_t cud_head_rmsnorm(float *x, const float *w, int32_t rows, int32_t n_heads, int32_t hd, float eps,
                             cudaStream_t st) {
    int total = rows * n_heads, warps = 8;
    k_head_rmsnorm<<<(total + warps - 1) / warps, warps * WARP, 0, st>>>(x, w, total, hd, eps);
    return cudaGetLastError();
}

cudaError_t cud_add_bias(float *x, const float *b, int32_t rows, int32_t n, cudaStream_t st) {
    int64_t total = (int64_t)rows * n;
    k_add_bias<<<grid_for(total, 256), 256, 0, st>>>(x, b, total, n);
    return cudaGetLastError();
}

cudaError_t cud_add(float *x, const float *y, int64_t n, cudaStream_t st) {
    k_add<<<grid_for(n, 256), 256, 0, st>>>(x, y, n);
    return cudaGetLastError();
}

cudaError_t cud_swiglu(float *g, const float *u, int64_t n, cudaStream_t st) {
    k_swiglu<<<grid_for(n, 256), 256, 0, st>>>(g, u, n);
    return cudaGetLastError();
}

cudaError_t cud_f32_to_f16(const float *x, __half *y, int64_t n, cudaStream_t st) {
    k_f32_to_f16<<<grid_for(n, 256), 256, 0, st>>>(x, y, n);
    return cudaGetLastError();
}

static int pair_threads(int32_t n_rot) { return n_rot / 2 < 128 ? (n_rot / 2 < 1 ? 1 : n_rot / 2) : 128; }

cudaError_t cud_rope_cs(const int32_t *pos, const float *inv_freq, int32_t rows, int32_t n_rot, float *cs,
                        cudaStream_t st) {
    if (rows < 1 || n_rot < 2) return cudaSuccess;
    k_rope_cs<<<rows, pair_threads(n_rot), 0, st>>>(pos, inv_freq, n_rot / 2, cs);
    return cudaGetLastError();
}

cudaError_t cud_rope(float *x, const float *cs, int32_t rows, int32_t n_heads, const cud_rope_params *rp,
                     cudaStream_t st) {
    if (rows < 1 || rp->n_rot < 2) return cudaSuccess;
    k_rope<<<rows * n_heads, pair_threads(rp->n_rot), 0, st>>>(x, cs, n_heads, *rp);
    return cudaGetLastError();
}

cudaError_t cud_kv_store(const cud_kv_view *kv, int32_t layer, const float *k, const float *v,
                         const int32_t *slot, int32_t rows, cudaStream_t st) {
    k_kv_store<<<rows, 128, 0, st>>>(*kv, layer, k, v, slot);
    return cudaGetLastError();
}

cudaError_t cud_kv_rerotate(const cud_kv_view *kv, int32_t n_layer, const int32_t *slots, int32_t n,
                            const float *cs, const cud_rope_params *rp, cudaStream_t st) {
    if (n < 1 || rp->n_rot < 2) return cudaSuccess;
    if (n_layer * kv->n_kv_head > 65535) return cudaErrorInvalidValue;
    dim3 grid((unsigned)n, (unsigned)(n_layer * kv->n_kv_head));
    k_kv_rerotate<<<grid, pair_threads(rp->n_rot), 0, st>>>(*kv, slots, cs, *rp);
    return cudaGetLastError();
}

cudaError_t cud_paged_attention(const cud_kv_view *kv, int32_t layer, const cud_attn_args *a, cudaStream_t st) {
    if (a->hd > ATT_MAX_PER_LANE * WARP || a->n_head % a->n_kv_head != 0) return cudaErrorInvalidValue;
    dim3 grid((unsigned)a->n_head, (unsigned)a->rows, (unsigned)a->partitions);
    size_t shmem = (size_t)(2 * ATT_WARPS + ATT_WARPS * a->hd) * sizeof(float);
    k_paged_attention<<<grid, ATT_WARPS * WARP, shmem, st>>>(*kv, layer, *a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || a->partitions == 1) return e;
    k_attn_reduce<<<dim3((unsigned)a->n_head, (unsigned)a->rows), (unsigned)a->hd, 0, st>>>(*a);
    return cudaGetLastError();
}

cudaError_t cud_gather_rows(const float *x, int64_t n, const int32_t *rows, int32_t n_rows, float *y,
                            cudaStream_t st) {
    if (n_rows < 1) return cudaSuccess;
    k_gather_rows<<<n_rows, 256, 0, st>>>(x, n, rows, y);
    return cudaGetLastError();
}

bool cud_mmv_supported(uint32_t type, int64_t k) {
    switch (type) {
    case CUD_Q4_0: case CUD_Q5_0: case CUD_Q8_0: return k > 0 && k % 32 == 0;
    case CUD_Q4_K: case CUD_Q5_K: case CUD_Q6_K: return k > 0 && k % 256 == 0;
    case CUD_F16: case CUD_BF16: return k > 0 && k % 32 == 0; // the activations are quantized too
    default: return false;
    }
}

cudaError_t cud_act_quant(const float *x, const float *norm_w, float eps, int32_t m, int64_t k,
                          const cud_act_bufs *o, cudaStream_t st) {
    if (m < 1 || k < 32 || k % 32 != 0 || k > INT32_MAX) return cudaErrorInvalidValue;
    k_act_quant<<<(unsigned)m, AQ_THREADS, 0, st>>>(x, norm_w, eps, k, o->xf, o->q8, o->d8, o->qk, o->dk, o->bk);
    return cudaGetLastError();
}

cudaError_t cud_mmv(uint32_t type, const void *w, int64_t n_out, int64_t k, const cud_act_bufs *xa, int32_t m,
                    float *y, int n_sm, cudaStream_t st) {
    if (m < 1 || m > MMV_MAX_M || !cud_mmv_supported(type, k)) return cudaErrorInvalidValue;
    mmv_act x{xa->q8, xa->d8, xa->qk, xa->dk, xa->bk, xa->xf, k};
    cudaError_t e = cudaErrorInvalidValue;
    auto go = [&]<uint32_t T>() {
        mmv_plan p;
        if (!mmv_make_plan<T>(n_out, k, n_sm, &p) || p.grid > INT32_MAX) return;
        k_mmv<T><<<(unsigned)p.grid, MMV_THREADS, 0, st>>>((const uint8_t *)w, n_out, k, p, x, m, y);
        e = cudaGetLastError();
    };
    switch (type) {
    case CUD_Q4_0: go.template operator()<CUD_Q4_0>(); break;
    case CUD_Q5_0: go.template operator()<CUD_Q5_0>(); break;
    case CUD_Q8_0: go.template operator()<CUD_Q8_0>(); break;
    case CUD_Q4_K: go.template operator()<CUD_Q4_K>(); break;
    case CUD_Q5_K: go.template operator()<CUD_Q5_K>(); break;
    case CUD_Q6_K: go.template operator()<CUD_Q6_K>(); break;
    case CUD_F16: go.template operator()<CUD_F16>(); break;
    case CUD_BF16: go.template operator()<CUD_BF16>(); break;
    default: break;
    }
    return e;
}

int cud_selftest_open(char **msg, size_t *msg_len, char *scratch, size_t scratch_len) {
    if (!*msg || !*msg_len) {
        *msg = scratch;
        *msg_len = scratch_len;
    }
    (*msg)[0] = '\0';
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        cudaGetLastError();
        snprintf(*msg, *msg_len, "no CUDA device");
        return KVS_ERR_UNSUPPORTED;
    }
    return KVS_OK;
}
