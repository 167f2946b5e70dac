// cud_mmv.cuh: the quantized matrix-vector products of decode (m <= 8 activation rows), as per-thread
// arithmetic and index maps that compile for the device and for the host (internal to the cuda module).
//
// A product y[a][j] = sum_i W[j][i] * x[a][i], a < m <= 8, runs in three parts:
//   1. activation quantization (k_act_quant in cud_kernels.cu, optionally fused with the RMSNorm before it):
//      each activation row becomes int8 codes with the CPU engine's own quantizers' rules
//      (engine/kernels/quant.c): Q8_0 (32 values, d = amax / 127 stored as fp16, codes round half to even)
//      for Q4_0 / Q5_0 / Q8_0 weights and Q8_K (256 values, iscale = -127 / (the signed value of largest
//      magnitude, first one on ties), f32 d = 1 / iscale, sums of 16 codes) for Q4_K / Q5_K / Q6_K weights,
//      so that every integer block sum equals the CPU engine's;
//   2. k_mmv: a thread block of MMV_THREADS threads owns `rows_per_block` consecutive weight rows. Their bytes
//      are one contiguous range of whole quant blocks; the block reads it in chunks (at most MMV_CHUNK_BYTES)
//      as aligned 16-byte words, consecutive threads reading consecutive words (mmv_chunk_words), into shared
//      memory, whatever the row width: every lane loads, even when a row is shorter than a warp's stride;
//   3. every thread then takes work units out of shared memory (mmv_unit_block): a unit is 32 weights (one
//      Q4_0 / Q5_0 / Q8_0 block, one of the 8 sub-blocks of a K-quant super-block) or 8 F16 / BF16 weights. A
//      unit's integer dot products with up to 8 activation rows use dp4a; the 8 units of a super-block sit on
//      8 consecutive lanes, whose integer sums are added by shuffles (exact) before one lane forms the
//      super-block's float term exactly as the CPU engine does. Float terms are summed per thread, then per
//      warp, then over the warps of the row in a fixed order (deterministic, within the CPU engine's
//      tolerance of its own SIMD levels: 1e-5 * sum |w_i x_i|).
//
// Everything a thread computes is a function below; tests/unit/test_cuda_mmv_host.cpp compiles them for the
// host (CUD_MMV_FN = inline, host versions of the intrinsics) and runs whole thread blocks phase by phase.
#ifndef KVSERVE_CUD_MMV_CUH
#define KVSERVE_CUD_MMV_CUH

#include <cstdint>

#include "cuda/cud_deq.cuh"

#ifndef CUD_MMV_FN
#define CUD_MMV_FN __device__ __forceinline__
#endif

#ifdef __CUDACC__
#define CUD_MV_UNROLL _Pragma("unroll")
#else
#define CUD_MV_UNROLL
#endif

namespace cud_mv {

constexpr int MMV_MAX_M = 8;          // activation rows per pass
constexpr int MMV_THREADS = 256;      // threads of one k_mmv block
constexpr int MMV_WARPS = MMV_THREADS / 32;
constexpr int MMV_CHUNK_BYTES = 8192; // weight bytes staged in shared memory per chunk
constexpr int MMV_SMEM_WORDS = MMV_CHUNK_BYTES / 16 + 2; // 16-byte words of the staging buffer

// Per weight type: elements and bytes of one block, 32-value units per block (F16/BF16: a "block" is one
// 16-byte word of 8 values), and the activation format it reads (0: f32 rows, 1: Q8_0, 2: Q8_K).
template <uint32_t T> struct mmv_traits;
template <> struct mmv_traits<CUD_Q4_0> { static constexpr int BE = 32, BB = 18, UPB = 1, ACT = 1; };
template <> struct mmv_traits<CUD_Q5_0> { static constexpr int BE = 32, BB = 22, UPB = 1, ACT = 1; };
template <> struct mmv_traits<CUD_Q8_0> { static constexpr int BE = 32, BB = 34, UPB = 1, ACT = 1; };
template <> struct mmv_traits<CUD_Q4_K> { static constexpr int BE = 256, BB = 144, UPB = 8, ACT = 2; };
template <> struct mmv_traits<CUD_Q5_K> { static constexpr int BE = 256, BB = 176, UPB = 8, ACT = 2; };
template <> struct mmv_traits<CUD_Q6_K> { static constexpr int BE = 256, BB = 210, UPB = 8, ACT = 2; };
template <> struct mmv_traits<CUD_F16> { static constexpr int BE = 8, BB = 16, UPB = 1, ACT = 0; };
template <> struct mmv_traits<CUD_BF16> { static constexpr int BE = 8, BB = 16, UPB = 1, ACT = 0; };

// The quantized activation rows a product reads (device memory; m rows of k values).
struct mmv_act {
    const int8_t *q8;    // [m][k]      Q8_0 codes
    const float *d8;     // [m][k/32]   Q8_0 scales (the fp16 value, as f32)
    const int8_t *qk;    // [m][k]      Q8_K codes
    const float *dk;     // [m][k/256]  Q8_K scales
    const int16_t *bk;   // [m][k/16]   Q8_K sums of 16 codes
    const float *xf;     // [m][k]      the f32 rows (F16 / BF16 weights)
    int64_t k;
};

// ---- launch plan (host) and index maps --------------------------------------------------------------------

struct mmv_plan {
    int rows_per_block;  // R: 1, 2, 4 or 8 rows per thread block (R > 1: the R rows fit one chunk)
    int chunk_blocks;    // quant blocks per chunk when R == 1 (a row wider than one chunk)
    int64_t grid;        // thread blocks: ceil(n_out / R)
};

// The plan for a [n_out][k] matrix of type T on n_sm multiprocessors: as many rows per block as fit one
// chunk (up to MMV_WARPS, a power of two) while the grid keeps >= 4 blocks per multiprocessor.
// Returns false for shapes k_mmv does not take (k not a multiple of the block, n_out < 1).
template <uint32_t T> inline bool mmv_make_plan(int64_t n_out, int64_t k, int n_sm, mmv_plan *p) {
    using tr = mmv_traits<T>;
    if (n_out < 1 || k < tr::BE || k % tr::BE != 0 || n_sm < 1) return false;
    const int64_t nb = k / tr::BE, rb = nb * tr::BB;
    int r = MMV_WARPS;
    while (r > 1 && (r * rb > MMV_CHUNK_BYTES - 16 || (n_out + r - 1) / r < 4 * (int64_t)n_sm)) r /= 2;
    p->rows_per_block = r;
    int cb = (MMV_CHUNK_BYTES - 16) / tr::BB;
    p->chunk_blocks = cb;
    p->grid = (n_out + r - 1) / r;
    return true;
}

// Chunk ch of thread block bid covers flat quant blocks [*fb0, *fb1) of the matrix (row j has flat blocks
// [j * nb, (j + 1) * nb)); returns false past the block's last chunk.
CUD_MMV_FN bool mmv_chunk(const mmv_plan &p, int64_t n_out, int64_t nb, int64_t bid, int64_t ch, int64_t *fb0,
                          int64_t *fb1) {
    const int64_t j0 = bid * p.rows_per_block;
    int64_t j1 = j0 + p.rows_per_block;
    if (j1 > n_out) j1 = n_out;
    if (p.rows_per_block > 1) {
        if (ch > 0) return false;
        *fb0 = j0 * nb;
        *fb1 = j1 * nb;
        return true;
    }
    const int64_t s = ch * p.chunk_blocks;
    if (s >= nb) return false;
    *fb0 = j0 * nb + s;
    *fb1 = j0 * nb + (s + p.chunk_blocks < nb ? s + p.chunk_blocks : nb);
    return true;
}

// The aligned 16-byte words [*w0, *w1) that hold the bytes of flat blocks [fb0, fb1) (bb bytes each). The
// matrix allocation is padded to a multiple of 16 bytes, so every word read lies inside it. Thread tid loads
// words *w0 + tid + i * MMV_THREADS into staging word tid + i * MMV_THREADS.
CUD_MMV_FN void mmv_chunk_words(int64_t fb0, int64_t fb1, int bb, int64_t *w0, int64_t *w1) {
    *w0 = fb0 * bb / 16;
    *w1 = (fb1 * bb + 15) / 16;
}

// The thread's share of the chunk's units: rows_per_block groups of MMV_THREADS / R threads (whole warps),
// group g working on row j0 + g. Unit u of the group (u = t + i * group_threads, t the thread's index in it)
// is sub-unit u % UPB of flat block blk0 + u / UPB; *n_iter, uniform over the group, counts its iterations.
struct mmv_share {
    int64_t row;         // output row of the group (-1: the group has no row in this block)
    int64_t blk0;        // first flat block of that row inside the chunk
    int64_t units;       // units of that row inside the chunk
    int t, group_threads;
    int64_t n_iter;
};
CUD_MMV_FN mmv_share mmv_thread_share(const mmv_plan &p, int64_t n_out, int64_t nb, int upb, int64_t bid,
                                      int64_t fb0, int64_t fb1, int tid) {
    mmv_share s;
    const int gt = MMV_THREADS / p.rows_per_block, g = tid / gt;
    s.t = tid % gt;
    s.group_threads = gt;
    s.row = bid * p.rows_per_block + g;
    int64_t a = s.row * nb, b = a + nb;
    if (a < fb0) a = fb0;
    if (b > fb1) b = fb1;
    if (s.row >= n_out || b <= a) {
        s.row = -1;
        s.blk0 = 0;
        s.units = 0;
        s.n_iter = 0;
        return s;
    }
    s.blk0 = a;
    s.units = (b - a) * upb;
    s.n_iter = (s.units + gt - 1) / gt;
    return s;
}

// ---- per-thread arithmetic --------------------------------------------------------------------------------

CUD_MMV_FN uint32_t mmv_ld4(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
CUD_MMV_FN int mmv_ld_act4(const int8_t *p) { // 4-byte aligned activation codes
    return *(const int *)p;
}

// Round to nearest, ties to even, as the CPU engine's nearest_int (exact for |v| < 2^22).
CUD_MMV_FN int mmv_nearest(float v) { return __float2int_rn(v); }

// Q8_0 activation block: d = amax / 127 (its fp16 value is stored), id = 1 / d (0 for an all-zero block);
// code = nearest(x * id) clamped to [-127, 127].
CUD_MMV_FN void mmv_q8_0_scale(float amax, float *d_store, float *id) {
    float d = __fdiv_rn(amax, 127.f);
    *id = d != 0.f ? __fdiv_rn(1.f, d) : 0.f;
    *d_store = __half2float(__float2half_rn(d));
}
CUD_MMV_FN int8_t mmv_q8_code(float x, float id) {
    int v = mmv_nearest(__fmul_rn(id, x));
    return (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
}
// Q8_K activation block: mx is the value of largest magnitude (first on ties); iscale = -127 / mx,
// d = 1 / iscale; an all-zero block (|mx| == 0) has codes 0, d 0.
CUD_MMV_FN void mmv_q8_k_scale(float mx, float *iscale, float *d) {
    if (mx == 0.f) {
        *iscale = 0.f;
        *d = 0.f;
        return;
    }
    *iscale = __fdiv_rn(-127.f, mx);
    *d = __fdiv_rn(1.f, *iscale);
}
// The reduction of (magnitude, index) pairs that finds the CPU engine's signed maximum: larger magnitude
// wins, the lower index on ties (the CPU keeps the first of equal magnitudes).
CUD_MMV_FN void mmv_absmax_pick(float *a, int *ia, float b, int ib) {
    if (b > *a || (b == *a && ib < *ia)) {
        *a = b;
        *ia = ib;
    }
}

// dp4a-style: c + the four products of signed bytes.
CUD_MMV_FN int mmv_dot4(int a, int b, int c) { return __dp4a(a, b, c); }

// Packs 4 small signed values (each in [-128, 127]) as int8 bytes.
CUD_MMV_FN int mmv_pack4(int v0, int v1, int v2, int v3) {
    return (int)((uint32_t)(v0 & 0xFF) | ((uint32_t)(v1 & 0xFF) << 8) | ((uint32_t)(v2 & 0xFF) << 16) |
                 ((uint32_t)(v3 & 0xFF) << 24));
}

// Weight values 4i..4i+3 of unit `sub` of block b of type T, as packed int8 (Q4_0: q - 8; Q5_0: q - 16;
// Q8_0: q; Q4_K: nibble; Q5_K: nibble + 16 * high bit; Q6_K: q - 32). Values are in unit order (unit sub
// covers the block's elements 32 * sub .. 32 * sub + 31).
template <uint32_t T> CUD_MMV_FN int mmv_wq4(const uint8_t *b, int sub, int i);

template <> CUD_MMV_FN int mmv_wq4<CUD_Q8_0>(const uint8_t *b, int, int i) {
    return (int)mmv_ld4(b + 2 + 4 * i);
}
template <> CUD_MMV_FN int mmv_wq4<CUD_Q4_0>(const uint8_t *b, int, int i) {
    // elements 0..15 are low nibbles of qs[0..15], 16..31 the high nibbles
    const uint32_t w = mmv_ld4(b + 2 + 4 * (i & 3));
    const uint32_t n = i < 4 ? (w & 0x0F0F0F0Fu) : ((w >> 4) & 0x0F0F0F0Fu);
    return mmv_pack4((int)(n & 0xF) - 8, (int)((n >> 8) & 0xF) - 8, (int)((n >> 16) & 0xF) - 8,
                     (int)((n >> 24) & 0xF) - 8);
}
template <> CUD_MMV_FN int mmv_wq4<CUD_Q5_0>(const uint8_t *b, int, int i) {
    // as Q4_0, plus bit e of qh as the fifth bit of element e (elements 4i .. 4i + 3)
    const uint32_t qh = mmv_ld4(b + 2);
    const uint32_t w = mmv_ld4(b + 6 + 4 * (i & 3));
    const uint32_t n = i < 4 ? (w & 0x0F0F0F0Fu) : ((w >> 4) & 0x0F0F0F0Fu);
    const uint32_t hb = (qh >> (4 * i)) & 0xFu;
    const uint32_t q = n | ((hb & 1u) << 4) | ((hb & 2u) << 11) | ((hb & 4u) << 18) | ((hb & 8u) << 25);
    return mmv_pack4((int)(q & 0xFF) - 16, (int)((q >> 8) & 0xFF) - 16, (int)((q >> 16) & 0xFF) - 16,
                     (int)((q >> 24) & 0xFF) - 16);
}
template <> CUD_MMV_FN int mmv_wq4<CUD_Q4_K>(const uint8_t *b, int sub, int i) {
    const uint32_t w = mmv_ld4(b + 16 + 32 * (sub / 2) + 4 * i);
    return (int)((sub & 1) ? ((w >> 4) & 0x0F0F0F0Fu) : (w & 0x0F0F0F0Fu));
}
template <> CUD_MMV_FN int mmv_wq4<CUD_Q5_K>(const uint8_t *b, int sub, int i) {
    const uint32_t w = mmv_ld4(b + 48 + 32 * (sub / 2) + 4 * i);
    const uint32_t h = mmv_ld4(b + 16 + 4 * i);
    const uint32_t lo = (sub & 1) ? ((w >> 4) & 0x0F0F0F0Fu) : (w & 0x0F0F0F0Fu);
    const uint32_t hi = ((h >> sub) & 0x01010101u) << 4;
    return (int)(lo | hi);
}
template <> CUD_MMV_FN int mmv_wq4<CUD_Q6_K>(const uint8_t *b, int sub, int i) {
    const int n = sub / 4, quarter = sub % 4;
    const uint32_t l = mmv_ld4(b + 64 * n + 32 * (quarter & 1) + 4 * i);
    const uint32_t h = mmv_ld4(b + 128 + 32 * n + 4 * i);
    const uint32_t lo = quarter >= 2 ? ((l >> 4) & 0x0F0F0F0Fu) : (l & 0x0F0F0F0Fu);
    const uint32_t hi = ((h >> (2 * quarter)) & 0x03030303u) << 4;
    const uint32_t q = lo | hi; // 0..63 per byte
    return mmv_pack4((int)(q & 0xFF) - 32, (int)((q >> 8) & 0xFF) - 32, (int)((q >> 16) & 0xFF) - 32,
                     (int)((q >> 24) & 0xFF) - 32);
}

// Integer sums of one unit with m activation rows: isum[a] (Q4_0/Q5_0/Q8_0: the block's dot product;
// Q4_K/Q5_K: scale_sub * dot; Q6_K: the two 16-value halves times their scales) and msum[a] (Q4_K/Q5_K:
// min_sub * (the two 16-code sums of the activation); else 0). col is the unit's first element in the row.
template <uint32_t T>
CUD_MMV_FN void mmv_unit_ints(const uint8_t *b, int sub, const mmv_act &x, int64_t col, int m, int *isum,
                              int *msum) {
    using tr = mmv_traits<T>;
    const int8_t *xq = tr::ACT == 1 ? x.q8 : x.qk;
    int dot[MMV_MAX_M], dot2[MMV_MAX_M];
CUD_MV_UNROLL
    for (int a = 0; a < MMV_MAX_M; a++) dot[a] = dot2[a] = 0;
CUD_MV_UNROLL
    for (int i = 0; i < 8; i++) {
        const int w = mmv_wq4<T>(b, sub, i);
CUD_MV_UNROLL
        for (int a = 0; a < MMV_MAX_M; a++) {
            if (a >= m) break;
            const int xv = mmv_ld_act4(xq + a * x.k + col + 4 * i);
            if (T == CUD_Q6_K && i >= 4) dot2[a] = mmv_dot4(w, xv, dot2[a]);
            else dot[a] = mmv_dot4(w, xv, dot[a]);
        }
    }
CUD_MV_UNROLL
    for (int a = 0; a < MMV_MAX_M; a++) {
        if (a >= m) break;
        if constexpr (T == CUD_Q4_K || T == CUD_Q5_K) {
            int sc, mn;
            cud_deq::scale_min_k4(sub, b + 4, &sc, &mn);
            const int16_t *bs = x.bk + a * (x.k / 16) + col / 16;
            isum[a] = sc * dot[a];
            msum[a] = mn * ((int)bs[0] + (int)bs[1]);
        } else if constexpr (T == CUD_Q6_K) {
            const int8_t *sc = (const int8_t *)(b + 192) + 8 * (sub / 4) + 2 * (sub % 4);
            isum[a] = (int)sc[0] * dot[a] + (int)sc[1] * dot2[a];
            msum[a] = 0;
        } else {
            isum[a] = dot[a];
            msum[a] = 0;
        }
    }
}

// The float term of one block with activation row a (blk_col: the block's index within the row), from the
// block's integer sums, with the CPU engine's operations and rounding: Q4_0/Q5_0/Q8_0 (float)isum *
// (d_w * d_x); Q4_K/Q5_K (d_w * d_x) * sumi - (dmin_w * d_x) * summ; Q6_K (d_w * d_x) * sumi.
template <uint32_t T>
CUD_MMV_FN float mmv_block_term(const uint8_t *b, const mmv_act &x, int64_t blk_col, int a, int isum, int msum) {
    using namespace cud_deq;
    if constexpr (T == CUD_Q4_0 || T == CUD_Q5_0 || T == CUD_Q8_0) {
        const float dx = x.d8[a * (x.k / 32) + blk_col];
        return __fmul_rn((float)isum, __fmul_rn(h2f(b), dx));
    } else if constexpr (T == CUD_Q6_K) {
        const float dx = x.dk[a * (x.k / 256) + blk_col];
        return __fmul_rn(__fmul_rn(h2f(b + 208), dx), (float)isum);
    } else {
        const float dx = x.dk[a * (x.k / 256) + blk_col];
        const float dd = __fmul_rn(h2f(b), dx), dm = __fmul_rn(h2f(b + 2), dx);
        return __fsub_rn(__fmul_rn(dd, (float)isum), __fmul_rn(dm, (float)msum));
    }
}

// F16 / BF16: one 16-byte word of 8 weights times the f32 activations (acc[a] += w_e * x_e in order).
template <uint32_t T>
CUD_MMV_FN void mmv_unit_float(const uint8_t *b, const mmv_act &x, int64_t col, int m, float *acc) {
    float w[8];
CUD_MV_UNROLL
    for (int e = 0; e < 8; e++) w[e] = cud_deq::deq<T>(b + 2 * e, 0);
CUD_MV_UNROLL
    for (int a = 0; a < MMV_MAX_M; a++) {
        if (a >= m) break;
        const float *xr = x.xf + a * x.k + col;
        float s = acc[a];
CUD_MV_UNROLL
        for (int e = 0; e < 8; e++) s = __fmaf_rn(w[e], xr[e], s);
        acc[a] = s;
    }
}

} // namespace cud_mv

#endif
