// cud_fattn.cuh: prefill attention over the paged KV pool on the tensor cores (mma.sync m16n8k16, f16 inputs,
// f32 accumulation), as fragment layouts, index maps and per-lane phases that compile for the device and for
// the host (internal to the cuda module).
//
// Fragments of mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 (PTX ISA, "matrix fragments
// for mma.m16n8k16 with floating point type"): with gid = lane >> 2 and tig = lane & 3,
//   A (16 x 16, row): 4 registers of two 16-bit values, element i < 8 of a lane (register i / 2, low half for
//     even i) at row gid + 8 * ((i >> 1) & 1), column 2 tig + (i & 1) + 8 * (i >= 4);
//   B (16 x 8, col): 2 registers, element i < 4 at k = 2 tig + (i & 1) + 8 * (i >= 2), n = gid;
//   C, D (16 x 8, f32): 4 floats, element i < 4 at row gid + 8 * (i >= 2), column 2 tig + (i & 1).
// fa_a_row .. fa_c_col below are those maps; everything that builds or reads a fragment goes through them, and
// fa_mma_emul computes one instruction from the 32 lanes' registers on the host, so a host harness can run a
// whole thread block with the instruction emulated (tests/unit/test_cuda_fattn_host.cpp), and one GPU test
// (cud_fattn_selftest) compares the emulation with the instruction.
//
// k_fattn (cud_fattn.cu) runs one block of FA_THREADS threads (FA_WARPS warps) per (tile, KV head). A tile is
// up to R = FA_BR / G consecutive batch rows of one sequence at consecutive positions pos0, pos0 + 1, ...
// (fa_plan_tiles makes them from the batch); with the G query heads of the KV head's GQA group that is up to
// FA_BR "query rows" qr = i * G + g (position i of the tile, head g), 16 per warp. The keys are the sequence's
// positions [0, pos0 + n) read through the block table from the pool, including the chunk's own rows (stored
// before the attention runs), so a chunk on top of cached prefix blocks needs nothing more.
//   1. the query tile, f32 -> f16, goes to shared memory (fa_q_elem: which thread converts which pair) and each
//      warp takes its A fragments into registers (fa_load_q);
//   2. per key tile of FA_BC positions from 0: the block copies the K rows to shared memory as they are (one
//      16-byte word per thread and step, fa_k_word) and the V rows transposed (fa_v_word: dims x positions,
//      so the B fragments of P V are 32-bit reads), zeros past the keys; then every warp whose rows see any
//      position of the tile (fa_warp_sees) forms S = Q K^T (mma over HD / 16 k-steps for each of the FA_BC / 8
//      column tiles), masks and scales it (fa_scores: causal, log2 domain), takes the row maxima across the
//      four lanes of a row (xor shuffles 1 and 2), rescales (fa_rescale: online softmax, P = exp2(s - m) in
//      place, the lane's part of each row sum, O *= exp2(m_old - m)), and adds P V (P repacked as f16 A
//      fragments by fa_p_frag, V^T as B fragments);
//   3. the row sums are added across the four lanes, and fa_store writes O / l for the valid rows.
// The scores are (q . k) * scale with q and k rounded to f16 (the old kernels use f32 q and the pool's values).
// No sliding window and no logit soft-capping: the CUDA backend does not take models that need them.
#ifndef KVSERVE_CUD_FATTN_CUH
#define KVSERVE_CUD_FATTN_CUH

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include "cuda/cud_attn.cuh" // attn_kv, attn_row_offset, attn_ld16

#ifndef CUD_FA_FN
#define CUD_FA_FN __host__ __device__ __forceinline__
#endif

#ifdef __CUDA_ARCH__
#define CUD_FA_UNROLL _Pragma("unroll")
#else
#define CUD_FA_UNROLL
#endif

namespace cud_fa {

constexpr int FA_WARPS = 4;
constexpr int FA_THREADS = FA_WARPS * 32;
constexpr int FA_BR = 16 * FA_WARPS; // query rows (position, head) of a block
constexpr int FA_BC = 64;            // key positions per key tile
constexpr int FA_PAD = 8;            // f16 values of padding per shared row (rows 16 bytes apart mod 128)
constexpr int FA_MAX_G = 16;         // query heads per KV head the kernel takes
constexpr float FA_LOG2E = 1.4426950408889634f;
constexpr float FA_NEG = -3.402823466e+38f; // the running max before any key (-FLT_MAX)

// ---- f16 / bf16 values as 16-bit patterns ----------------------------------------------------------------

// f32 -> f16, round to nearest even (overflow to infinity), as __float2half_rn.
CUD_FA_FN uint16_t fa_f2h(float f) {
#ifdef __CUDA_ARCH__
    return __half_as_ushort(__float2half_rn(f));
#else
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0u));
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); // at or past the midpoint 65520: infinity
    if (ax < 0x38800000u) {                                   // below 2^-14: a subnormal (or zero) f16
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f)); // exact scaling, rint: nearest even
    }
    const uint32_t r = ax + 0xFFFu + ((ax >> 13) & 1u); // round the 13 dropped bits to nearest even
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13)); // exponent bias 127 -> 15
#endif
}

CUD_FA_FN float fa_h2f(uint16_t h) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#else
    const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 0x400u), (int)e - 25);
    return (h & 0x8000u) ? -v : v;
#endif
}

CUD_FA_FN float fa_bf2f(uint16_t h) { return cud_u2f((uint32_t)h << 16); }

// 32-bit load and store of two adjacent 16-bit values (4-byte aligned) in shared memory.
CUD_FA_FN uint32_t fa_ld32(const uint16_t *p) {
#ifdef __CUDA_ARCH__
    return *(const uint32_t *)p;
#else
    uint32_t u;
    memcpy(&u, p, 4);
    return u;
#endif
}
CUD_FA_FN void fa_st32(uint16_t *p, uint32_t u) {
#ifdef __CUDA_ARCH__
    *(uint32_t *)p = u;
#else
    memcpy(p, &u, 4);
#endif
}

// Two 16-bit values as one register: lo in bits 0-15 (the lower-indexed element of a fragment pair).
CUD_FA_FN uint32_t fa_pack(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

// ---- fragment layouts of m16n8k16 -------------------------------------------------------------------------

CUD_FA_FN int fa_gid(int lane) { return lane >> 2; }
CUD_FA_FN int fa_tig(int lane) { return lane & 3; }
// A element i < 8 of a lane: row and column of the 16 x 16 tile.
CUD_FA_FN int fa_a_row(int lane, int i) { return fa_gid(lane) + 8 * ((i >> 1) & 1); }
CUD_FA_FN int fa_a_col(int lane, int i) { return 2 * fa_tig(lane) + (i & 1) + 8 * (i >> 2); }
// B element i < 4 of a lane: k (row of the 16 x 8 tile) and n (column).
CUD_FA_FN int fa_b_k(int lane, int i) { return 2 * fa_tig(lane) + (i & 1) + 8 * (i >> 1); }
CUD_FA_FN int fa_b_n(int lane, int i) { (void)i; return fa_gid(lane); }
// C / D element i < 4 of a lane: row and column of the 16 x 8 tile.
CUD_FA_FN int fa_c_row(int lane, int i) { return fa_gid(lane) + 8 * (i >> 1); }
CUD_FA_FN int fa_c_col(int lane, int i) { return 2 * fa_tig(lane) + (i & 1); }

// The value of element i of a fragment register array (16-bit element i is half i & 1 of register i / 2).
CUD_FA_FN uint16_t fa_elem16(const uint32_t *regs, int i) {
    return (uint16_t)((i & 1) ? regs[i >> 1] >> 16 : regs[i >> 1] & 0xFFFFu);
}

// One instruction for the 32 lanes of a warp, computed on the host from their registers: d[lane] = A B +
// c[lane] with A and B assembled through the layouts above (bf16: the 16-bit values are bf16, else f16).
// Products are exact in double; the sum of the 16 products and c is rounded once to f32 (the hardware keeps
// at least f32 precision in its sum: the GPU test allows a few ulps between the two).
inline void fa_mma_emul(const uint32_t a[32][4], const uint32_t b[32][2], const float c[32][4], float d[32][4],
                        bool bf16) {
    double A[16][16], B[16][8];
    for (int lane = 0; lane < 32; lane++) {
        for (int i = 0; i < 8; i++) {
            const uint16_t v = fa_elem16(a[lane], i);
            A[fa_a_row(lane, i)][fa_a_col(lane, i)] = bf16 ? fa_bf2f(v) : fa_h2f(v);
        }
        for (int i = 0; i < 4; i++) {
            const uint16_t v = fa_elem16(b[lane], i);
            B[fa_b_k(lane, i)][fa_b_n(lane, i)] = bf16 ? fa_bf2f(v) : fa_h2f(v);
        }
    }
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            const int r = fa_c_row(lane, i), n = fa_c_col(lane, i);
            double s = c[lane][i];
            for (int k = 0; k < 16; k++) s += A[r][k] * B[k][n];
            d[lane][i] = (float)s;
        }
}

#ifdef __CUDACC__
// The instruction itself: d += A B for this lane's fragments (device code only), on f16 (fa_mma) or bf16
// (fa_mma_bf16) inputs with f32 sums.
#ifdef __CUDA_ARCH__
#define FA_MMA_ASM(AB)                                                                                           \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." AB "." AB ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, " \
                 "{%8, %9}, {%0, %1, %2, %3};\n"                                                                \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
#else
#define FA_MMA_ASM(AB) ((void)d, (void)a, (void)b)
#endif
__device__ __forceinline__ void fa_mma(float d[4], const uint32_t a[4], const uint32_t b[2]) { FA_MMA_ASM("f16"); }
__device__ __forceinline__ void fa_mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    FA_MMA_ASM("bf16");
}
#undef FA_MMA_ASM
#endif

// ---- tiles of a batch -------------------------------------------------------------------------------------

// Rows per tile for G query heads per KV head.
CUD_FA_FN int fa_tile_rows(int G) { return FA_BR / G; }

// Cuts the batch's n rows (pos[i], seq[i]) into tiles of at most R rows, each a run of consecutive rows of
// one sequence at consecutive positions: tiles[2 t] = first row, tiles[2 t + 1] = row count. Writes at most n
// tiles (tiles holds 2 n values) and returns the count; *longest: the longest run (1 for a decode batch).
inline int32_t fa_plan_tiles(const int32_t *pos, const int32_t *seq, int32_t n, int R, int32_t *tiles,
                             int32_t *longest) {
    int32_t nt = 0, best = 0;
    for (int32_t i = 0; i < n;) {
        int32_t j = i + 1;
        while (j < n && seq[j] == seq[i] && pos[j] == pos[j - 1] + 1) j++;
        if (j - i > best) best = j - i;
        for (int32_t r = i; r < j; r += R) {
            tiles[2 * nt] = r;
            tiles[2 * nt + 1] = j - r < R ? j - r : R;
            nt++;
        }
        i = j;
    }
    if (longest) *longest = best;
    return nt;
}

// ---- shared memory and the copies into it ------------------------------------------------------------------

// f16 values per shared row: Q and K tiles [FA_BR or FA_BC][HD + FA_PAD], V^T [HD][FA_BC + FA_PAD].
template <int HD> struct fa_smem {
    static constexpr int LDK = HD + FA_PAD;
    static constexpr int LDV = FA_BC + FA_PAD;
    static constexpr int K_ELEMS = (FA_BR > FA_BC ? FA_BR : FA_BC) * LDK; // the Q tile uses it first
    static constexpr int V_ELEMS = HD * LDV;
    static constexpr int BYTES = (K_ELEMS + V_ELEMS) * 2;
    static constexpr int Q_STEPS = FA_BR * HD / 2 / FA_THREADS;  // steps of fa_q_elem (exact)
    static constexpr int KV_STEPS = FA_BC * HD / 8 / FA_THREADS; // steps of fa_k_word / fa_v_word (exact)
};

// The tile's geometry as the kernel sees it.
struct fa_tile {
    int32_t row0, n;   // first batch row, rows (positions pos0 .. pos0 + n - 1)
    int32_t pos0;      // position of the first row
    int32_t kv_end;    // keys [0, kv_end): pos0 + n
    int G, h0;         // query heads per KV head, first query head of the group
};

// Query row qr < FA_BR of the tile: its position index i (< n when valid) and head g; false for rows past
// the tile (qr >= R G or i >= n).
CUD_FA_FN bool fa_qrow(const fa_tile &t, int qr, int *i, int *g) {
    *i = qr / t.G;
    *g = qr % t.G;
    return *i < t.n && *i < FA_BR / t.G;
}

// Step k of thread tid copying the query tile: pair e = tid + k FA_THREADS < FA_BR HD / 2 holds dims (2 d2,
// 2 d2 + 1) of query row qr; returns false past the tile.
template <int HD> CUD_FA_FN bool fa_q_elem(int tid, int k, int *qr, int *d2) {
    const int e = tid + k * FA_THREADS;
    if (e >= FA_BR * HD / 2) return false;
    *qr = e / (HD / 2);
    *d2 = e % (HD / 2);
    return true;
}

// Converts one pair of the query tile into shared memory (zeros for rows past the tile). q: the batch's
// queries [rows][n_head][HD].
template <int HD>
CUD_FA_FN void fa_copy_q(const fa_tile &t, const float *q, int n_head, int qr, int d2, uint16_t *sq) {
    int i, g;
    float x0 = 0.f, x1 = 0.f;
    if (fa_qrow(t, qr, &i, &g)) {
        const float *src = q + ((size_t)(t.row0 + i) * n_head + t.h0 + g) * HD + 2 * d2;
        x0 = src[0];
        x1 = src[1];
    }
    fa_st32(sq + qr * fa_smem<HD>::LDK + 2 * d2, fa_pack(fa_f2h(x0), fa_f2h(x1)));
}

// Step k of thread tid copying a key tile: K word w = tid + k FA_THREADS (< FA_BC HD / 8) is 16-byte word c
// of position p's row (consecutive threads: consecutive words of a row); the V map takes consecutive
// positions for consecutive threads (p = w % FA_BC, c = w / FA_BC) so the transposed 2-byte stores of a warp
// fall in different banks.
template <int HD> CUD_FA_FN void fa_k_word(int tid, int k, int *p, int *c) {
    const int w = tid + k * FA_THREADS;
    *p = w / (HD / 8);
    *c = w % (HD / 8);
}
template <int HD> CUD_FA_FN void fa_v_word(int tid, int k, int *p, int *c) {
    const int w = tid + k * FA_THREADS;
    *p = w % FA_BC;
    *c = w / FA_BC;
}

// Copies word c of key position t0 + p (K: which 0, into sk; V: which 1, transposed into sv) of KV head kvh,
// zeros when the position is at or past kv_end.
template <int HD>
CUD_FA_FN void fa_copy_kv(const cud_at::attn_kv &kv, int layer, int which, const int32_t *table, int kvh,
                          int32_t kv_end, int32_t t0, int p, int c, uint16_t *sk, uint16_t *sv) {
    uint32_t u[4] = {0u, 0u, 0u, 0u};
    const int32_t t = t0 + p;
    if (t < kv_end) cud_at::attn_ld16(kv.base + cud_at::attn_row_offset(kv, layer, which, table, t, kvh) + 16 * c, u);
    if (which == 0) {
        uint16_t *dst = sk + p * fa_smem<HD>::LDK + 8 * c;
#ifdef __CUDA_ARCH__
        *(uint4 *)dst = make_uint4(u[0], u[1], u[2], u[3]); // 16-byte aligned: LDK is a multiple of 8
#else
        memcpy(dst, u, 16);
#endif
    } else {
CUD_FA_UNROLL
        for (int j = 0; j < 8; j++)
            sv[(8 * c + j) * fa_smem<HD>::LDV + p] = (uint16_t)((j & 1) ? u[j >> 1] >> 16 : u[j >> 1] & 0xFFFFu);
    }
}

// ---- a lane's state and the per-lane phases of a warp ----------------------------------------------------------

template <int HD> struct fa_lane {
    uint32_t qa[HD / 16][4];    // A fragments of the warp's 16 query rows, one per 16 dims
    float s[FA_BC / 8][4];      // scores, then probabilities, of the key tile: C fragments per 8 positions
    float o[HD / 8][4];         // output accumulator: C fragments per 8 dims
    float m[2], l[2];           // running max (log2 domain) and the lane's part of the sum, rows gid, gid + 8
};

template <int HD> CUD_FA_FN void fa_init(fa_lane<HD> *st) {
CUD_FA_UNROLL
    for (int j = 0; j < HD / 8; j++)
CUD_FA_UNROLL
        for (int i = 0; i < 4; i++) st->o[j][i] = 0.f;
    st->m[0] = st->m[1] = FA_NEG;
    st->l[0] = st->l[1] = 0.f;
}

// The warp's A fragments of the query tile (rows 16 warp .. + 15) from shared memory.
template <int HD> CUD_FA_FN void fa_load_q(fa_lane<HD> *st, const uint16_t *sq, int warp, int lane) {
    constexpr int LD = fa_smem<HD>::LDK;
CUD_FA_UNROLL
    for (int kc = 0; kc < HD / 16; kc++)
CUD_FA_UNROLL
        for (int r = 0; r < 4; r++) {
            const int row = 16 * warp + fa_a_row(lane, 2 * r), col = 16 * kc + fa_a_col(lane, 2 * r);
            st->qa[kc][r] = fa_ld32(sq + row * LD + col); // elements 2r, 2r + 1: adjacent columns
        }
}

template <int HD> CUD_FA_FN void fa_zero_s(fa_lane<HD> *st) {
CUD_FA_UNROLL
    for (int j = 0; j < FA_BC / 8; j++)
CUD_FA_UNROLL
        for (int i = 0; i < 4; i++) st->s[j][i] = 0.f;
}

// B fragment of K^T for key columns 8 j .. 8 j + 7 and dims 16 kc .. + 15: element (k = dim, n = position)
// is sk[position][dim], two adjacent dims per register.
template <int HD> CUD_FA_FN void fa_k_frag(const uint16_t *sk, int j, int kc, int lane, uint32_t b[2]) {
    constexpr int LD = fa_smem<HD>::LDK;
CUD_FA_UNROLL
    for (int r = 0; r < 2; r++)
        b[r] = fa_ld32(sk + (8 * j + fa_b_n(lane, 2 * r)) * LD + 16 * kc + fa_b_k(lane, 2 * r));
}

// Whether any query row of the warp sees a key of the tile starting at t0 (else the warp skips the tile: its
// scores would all be masked, which changes nothing).
CUD_FA_FN bool fa_warp_sees(const fa_tile &t, int warp, int32_t t0) {
    const int rmax = FA_BR / t.G < t.n ? FA_BR / t.G : t.n; // valid positions of the tile
    int last = (16 * warp + 15) / t.G;
    if (last > rmax - 1) last = rmax - 1;
    if ((16 * warp) / t.G > last) return false; // no valid row in the warp
    return t0 <= t.pos0 + last;
}

// Scores of the key tile at t0: s = (q . k) scale log2(e), -inf where the key is after the row's position
// (and for rows past the tile); mx[h]: the lane's maximum of row gid + 8 h (FA_NEG when all masked).
template <int HD>
CUD_FA_FN void fa_scores(fa_lane<HD> *st, const fa_tile &t, int warp, int lane, int32_t t0, float scale_log2,
                         float mx[2]) {
    int32_t qpos[2];
CUD_FA_UNROLL
    for (int h = 0; h < 2; h++) {
        int i, g;
        qpos[h] = fa_qrow(t, 16 * warp + fa_c_row(lane, 2 * h), &i, &g) ? t.pos0 + i : -1;
        mx[h] = FA_NEG;
    }
CUD_FA_UNROLL
    for (int j = 0; j < FA_BC / 8; j++)
CUD_FA_UNROLL
        for (int e = 0; e < 4; e++) {
            const int32_t key = t0 + 8 * j + fa_c_col(lane, e);
            const float v = key <= qpos[e >> 1] ? st->s[j][e] * scale_log2 : -INFINITY;
            st->s[j][e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
        }
}

// Online softmax with the row maxima mx (the four lanes of a row agree): m' = max(m, mx), P = exp2(s - m')
// in place, l = l exp2(m - m') + the lane's part of sum P, O *= exp2(m - m').
template <int HD> CUD_FA_FN void fa_rescale(fa_lane<HD> *st, const float mx[2]) {
    float corr[2];
CUD_FA_UNROLL
    for (int h = 0; h < 2; h++) {
        const float mn = fmaxf(st->m[h], mx[h]);
        corr[h] = exp2f(st->m[h] - mn);
        st->m[h] = mn;
        st->l[h] *= corr[h];
    }
CUD_FA_UNROLL
    for (int j = 0; j < FA_BC / 8; j++)
CUD_FA_UNROLL
        for (int e = 0; e < 4; e++) {
            const float p = exp2f(st->s[j][e] - st->m[e >> 1]);
            st->s[j][e] = p;
            st->l[e >> 1] += p;
        }
CUD_FA_UNROLL
    for (int j = 0; j < HD / 8; j++)
CUD_FA_UNROLL
        for (int e = 0; e < 4; e++) st->o[j][e] *= corr[e >> 1];
}

// A fragment of P for key positions 16 kk .. + 15 from the C fragments of column tiles 2 kk and 2 kk + 1 (the
// same lane holds A element (row, col) as C element (row, col mod 8) of tile 2 kk + col / 8), rounded to f16.
template <int HD> CUD_FA_FN void fa_p_frag(const fa_lane<HD> &st, int kk, uint32_t a[4]) {
CUD_FA_UNROLL
    for (int r = 0; r < 4; r++) {
        const float *c = st.s[2 * kk + (r >> 1)];
        const int e = 2 * (r & 1); // registers 0, 2: row gid (C elements 0, 1); 1, 3: row gid + 8 (2, 3)
        a[r] = fa_pack(fa_f2h(c[e]), fa_f2h(c[e + 1]));
    }
}

// B fragment of V for key positions 16 kk .. + 15 (k) and dims 8 dn .. + 7 (n): element (k, n) is
// sv[dim][position] of the transposed tile, two adjacent positions per register.
template <int HD> CUD_FA_FN void fa_v_frag(const uint16_t *sv, int dn, int kk, int lane, uint32_t b[2]) {
    constexpr int LD = fa_smem<HD>::LDV;
CUD_FA_UNROLL
    for (int r = 0; r < 2; r++)
        b[r] = fa_ld32(sv + (8 * dn + fa_b_n(lane, 2 * r)) * LD + 16 * kk + fa_b_k(lane, 2 * r));
}

// Writes the lane's outputs O / l (l: the row's full sum) for the valid rows: out [rows][n_head][HD].
template <int HD>
CUD_FA_FN void fa_store(const fa_lane<HD> &st, const fa_tile &t, int warp, int lane, const float lsum[2],
                        int n_head, float *out) {
CUD_FA_UNROLL
    for (int h = 0; h < 2; h++) {
        int i, g;
        if (!fa_qrow(t, 16 * warp + fa_c_row(lane, 2 * h), &i, &g)) continue;
        const float inv = lsum[h] > 0.f ? 1.f / lsum[h] : 0.f;
        float *dst = out + ((size_t)(t.row0 + i) * n_head + t.h0 + g) * HD;
CUD_FA_UNROLL
        for (int j = 0; j < HD / 8; j++)
CUD_FA_UNROLL
            for (int e = 0; e < 2; e++) dst[8 * j + fa_c_col(lane, 2 * h + e)] = st.o[j][2 * h + e] * inv;
    }
}

// ---- the host reference ----------------------------------------------------------------------------------------

// Attention of one query head (q [hd], f32) at position pos of a sequence over keys [0, pos] of KV head kvh in
// an f16 pool (host memory laid out as attn_kv says): softmax of (q . k) scale in double, out [hd].
inline void fa_reference(const cud_at::attn_kv &kv, int layer, const int32_t *table, int32_t pos, const float *q,
                         int kvh, int hd, float scale, double *out) {
    double mx = -INFINITY, sum = 0.;
    for (int d = 0; d < hd; d++) out[d] = 0.;
    for (int pass = 0; pass < 2; pass++)
        for (int32_t t = 0; t <= pos; t++) {
            uint16_t k[256], v[256];
            memcpy(k, kv.base + cud_at::attn_row_offset(kv, layer, 0, table, t, kvh), (size_t)hd * 2);
            double s = 0.;
            for (int d = 0; d < hd; d++) s += (double)q[d] * fa_h2f(k[d]);
            s *= scale;
            if (pass == 0) {
                mx = s > mx ? s : mx;
                continue;
            }
            memcpy(v, kv.base + cud_at::attn_row_offset(kv, layer, 1, table, t, kvh), (size_t)hd * 2);
            const double p = exp(s - mx);
            sum += p;
            for (int d = 0; d < hd; d++) out[d] += p * fa_h2f(v[d]);
        }
    for (int d = 0; d < hd; d++) out[d] /= sum;
}

} // namespace cud_fa

#endif
