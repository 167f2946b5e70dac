// cud_attn.cuh: decode attention over the paged KV pool in the split-KV style, as per-thread arithmetic and
// index maps that compile for the device and for the host (internal to the cuda module).
//
// One query row r (a token at position pos[r] of sequence seq[r]) attends to positions [0, ctx), ctx =
// pos[r] + 1, of its sequence. k_attn_split (cud_attn.cu) runs one thread block of ATTN_THREADS threads per
// (split, KV head, row):
//   1. splits: the context is cut into attn_n_split(ctx) contiguous ranges (attn_split_range). The count is a
//      function of ctx alone, never of the batch, so a row's numbers do not depend on what it was scheduled
//      with; the grid has attn_grid_splits(longest context) splits and blocks past a row's count exit;
//   2. teams: a K (or V) row of head_dim values is row_words 16-byte words; a team of `tp` consecutive lanes
//      (a power of two, <= 32) reads one position's row, lane l taking words l, l + tp, ... (`w` words each,
//      attn_word_of), so a warp reads 32 / tp consecutive positions' rows as consecutive words. Each iteration
//      every team takes ATTN_P positions (attn_pos_of): the block covers nteam * ATTN_P positions per
//      iteration, with all of them in flight at once;
//   3. per position every lane forms the partial dot products of its dims with the G query heads of the KV
//      head's group (the K/V words are read once for the whole group), the team adds them by xor shuffles,
//      and every lane updates its team's online softmax (max m, sum l) and its dims of the G accumulators;
//   4. the teams are merged in team order through shared memory (attn_team_weights, attn_team_output); with
//      one split the block writes the normalized output, else the split's unnormalized output and (max, sum),
//      which k_attn_merge combines in split order (attn_merge_splits).
// Scores are q . k with q pre-multiplied by the attention scale, as the old k_paged_attention does.
//
// Everything a thread computes is a function below; tests/unit/test_cuda_attn_host.cpp compiles them for the
// host (CUD_ATTN_FN = inline) and runs whole thread blocks phase by phase against a one-pass softmax.
#ifndef KVSERVE_CUD_ATTN_CUH
#define KVSERVE_CUD_ATTN_CUH

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

#include "cuda/cud_bits.cuh"
#include "cuda/cud_deq.cuh"

#ifndef CUD_ATTN_FN
#define CUD_ATTN_FN __host__ __device__ __forceinline__
#endif

#ifdef __CUDA_ARCH__
#define CUD_AT_UNROLL _Pragma("unroll")
#else
#define CUD_AT_UNROLL
#endif

namespace cud_at {

constexpr int ATTN_THREADS = 128;     // threads of one k_attn_split block
constexpr int ATTN_MAX_G = 8;         // query heads per KV head the kernel takes (more: the old kernel)
constexpr int ATTN_MAX_SPLITS = 32;   // splits of one context at most (the partial buffers' stride)
constexpr int ATTN_SPLIT_MIN = 128;   // positions of a split at least (shorter ones cost more to merge)
constexpr int ATTN_SPLIT_ALIGN = 64;  // split lengths are multiples of this
constexpr int ATTN_P = 2;             // positions per team per iteration
constexpr float ATTN_NEG = -3.402823466e+38f; // the running max before any position (-FLT_MAX)

// ---- splits: functions of the context length only ---------------------------------------------------------

// Positions per split of a context of ctx >= 1 positions: ATTN_SPLIT_MIN up to ATTN_MAX_SPLITS splits, then
// ceil(ctx / ATTN_MAX_SPLITS) rounded up to ATTN_SPLIT_ALIGN.
CUD_ATTN_FN int32_t attn_split_len(int32_t ctx) {
    int32_t len = (int32_t)(((int64_t)ctx + ATTN_MAX_SPLITS - 1) / ATTN_MAX_SPLITS);
    len = (len + ATTN_SPLIT_ALIGN - 1) / ATTN_SPLIT_ALIGN * ATTN_SPLIT_ALIGN;
    return len < ATTN_SPLIT_MIN ? ATTN_SPLIT_MIN : len;
}
CUD_ATTN_FN int attn_n_split(int32_t ctx) {
    const int32_t len = attn_split_len(ctx);
    return (int)((ctx + len - 1) / len);
}
// Split s < attn_n_split(ctx) covers positions [*t0, *t1) (non-empty, in order, together exactly [0, ctx)).
CUD_ATTN_FN void attn_split_range(int32_t ctx, int s, int32_t *t0, int32_t *t1) {
    const int32_t len = attn_split_len(ctx);
    *t0 = s * len;
    *t1 = *t0 + len < ctx ? *t0 + len : ctx;
}
// Splits of the grid for rows whose contexts are at most max_ctx: an upper bound of attn_n_split(ctx) for every
// ctx <= max_ctx (attn_n_split is not monotonic where the split length starts to grow).
CUD_ATTN_FN int attn_grid_splits(int32_t max_ctx) {
    const int64_t n = ((int64_t)max_ctx + ATTN_SPLIT_MIN - 1) / ATTN_SPLIT_MIN;
    return (int)(n < ATTN_MAX_SPLITS ? (n < 1 ? 1 : n) : ATTN_MAX_SPLITS);
}

// ---- teams and the index map ------------------------------------------------------------------------------

struct attn_geom {
    int vpw;       // values per 16-byte word: 8 (f16 cache) or 4 (f32)
    int row_words; // 16-byte words of one K or V row (head_dim values)
    int tp;        // lanes per position (a team), a power of two <= 32
    int w;         // words per lane: row_words / tp (1 or 2)
    int dt;        // dims per lane: w * vpw
    int nteam;     // teams per block: ATTN_THREADS / tp
};

// The geometry for head_dim values per row in an f16 (else f32) cache; false when the kernel does not take it
// (head_dim > 256, or a row not a power-of-two count of 16-byte words).
CUD_ATTN_FN bool attn_make_geom(int head_dim, bool f16, attn_geom *g) {
    const int es = f16 ? 2 : 4;
    if (head_dim < 1 || head_dim > 256 || (head_dim * es) % 16 != 0) return false;
    const int rw = head_dim * es / 16;
    if (rw > 64 || (rw & (rw - 1)) != 0) return false;
    g->vpw = 16 / es;
    g->row_words = rw;
    g->tp = rw < 32 ? rw : 32;
    g->w = rw / g->tp;
    g->dt = g->w * g->vpw;
    g->nteam = ATTN_THREADS / g->tp;
    return true;
}

// Iterations of a block over [t0, t1): ceil((t1 - t0) / (nteam * ATTN_P)), the same for every thread.
CUD_ATTN_FN int32_t attn_n_iter(const attn_geom &g, int32_t t0, int32_t t1) {
    const int32_t per = g.nteam * ATTN_P;
    return (t1 - t0 + per - 1) / per;
}
// Position of slot p < ATTN_P of team `team` in iteration it (valid when < t1): for a given slot the teams of
// a warp take consecutive positions, so the warp's reads are consecutive rows.
CUD_ATTN_FN int32_t attn_pos_of(const attn_geom &g, int32_t t0, int32_t it, int p, int team) {
    return t0 + (it * ATTN_P + p) * g.nteam + team;
}
// Word index (within the row) of the lane's word j < w: lane + j * tp; it holds dims [word * vpw, + vpw).
CUD_ATTN_FN int attn_word_of(const attn_geom &g, int lane, int j) { return lane + j * g.tp; }

// The paged pool as the kernels see it (cud_kv_view's fields; kvc_layout's layout).
struct attn_kv {
    const char *base;
    size_t layer_bytes, block_stride, head_stride, row_bytes;
    int32_t block_size;
};

// Byte offset (from base) of position t's row of KV head kvh in layer `layer`, K (which 0) or V (1), through
// the sequence's block table.
CUD_ATTN_FN size_t attn_row_offset(const attn_kv &kv, int layer, int which, const int32_t *table, int32_t t,
                                   int kvh) {
    const int32_t block = table[t / kv.block_size], off = t % kv.block_size;
    return (size_t)(2 * layer + which) * kv.layer_bytes + (size_t)block * kv.block_stride +
           (size_t)kvh * kv.head_stride + (size_t)off * kv.row_bytes;
}

// ---- per-thread arithmetic --------------------------------------------------------------------------------

// One aligned 16-byte word as four 32-bit values.
CUD_ATTN_FN void attn_ld16(const char *p, uint32_t u[4]) {
#ifdef __CUDA_ARCH__
    const uint4 v = __ldg((const uint4 *)p);
    u[0] = v.x;
    u[1] = v.y;
    u[2] = v.z;
    u[3] = v.w;
#else
    memcpy(u, p, 16);
#endif
}

// The lane's dims of one row (words attn_word_of(lane, j), j < W) as floats, in word order.
template <bool F16, int W>
CUD_ATTN_FN void attn_row_dims(const char *row, int tp, int lane, float *out) {
CUD_AT_UNROLL
    for (int j = 0; j < W; j++) {
        uint32_t u[4];
        attn_ld16(row + (size_t)(lane + j * tp) * 16, u);
CUD_AT_UNROLL
        for (int i = 0; i < 4; i++) {
            if constexpr (F16) {
                out[j * 8 + 2 * i] = __half2float(__ushort_as_half((uint16_t)(u[i] & 0xFFFFu)));
                out[j * 8 + 2 * i + 1] = __half2float(__ushort_as_half((uint16_t)(u[i] >> 16)));
            } else {
                out[j * 4 + i] = cud_u2f(u[i]);
            }
        }
    }
}

// A thread's state: its dims of the group's G <= GB query heads (scaled) and accumulators, and its team's
// running max and sum per head (the same in every lane of the team).
template <int GB, int DT> struct attn_state {
    float q[GB][DT];
    float acc[GB][DT];
    float m[GB], l[GB];
};

// Loads q [n_head][hd] of the row (heads h0 .. h0 + G - 1) times scale into the lane's dims (dims of word
// attn_word_of(lane, j) are q[j * vpw .. ]); heads past G are zero.
template <int GB, int DT>
CUD_ATTN_FN void attn_init(attn_state<GB, DT> *s, const float *q_row, int h0, int G, int hd, int tp, int vpw,
                           int lane, float scale) {
CUD_AT_UNROLL
    for (int g = 0; g < GB; g++) {
        s->m[g] = ATTN_NEG;
        s->l[g] = 0.f;
CUD_AT_UNROLL
        for (int e = 0; e < DT; e++) {
            const int d = (lane + (e / vpw) * tp) * vpw + e % vpw;
            s->q[g][e] = g < G ? q_row[(size_t)(h0 + g) * hd + d] * scale : 0.f;
            s->acc[g][e] = 0.f;
        }
    }
}

// The lane's part of q_g . k for every head of the group.
template <int GB, int DT>
CUD_ATTN_FN void attn_partial_dots(const attn_state<GB, DT> &s, const float *k, float *dots) {
CUD_AT_UNROLL
    for (int g = 0; g < GB; g++) {
        float d = 0.f;
CUD_AT_UNROLL
        for (int e = 0; e < DT; e++) d = fmaf(s.q[g][e], k[e], d);
        dots[g] = d;
    }
}

// The online softmax over the ATTN_P positions of one iteration: sc[p][g] the full scores, v[p] the lane's
// dims of the V rows, valid[p] whether slot p holds a position of the split. For each head: m' = max(m, the
// valid scores), c = exp(m - m'), p_i = exp(s_i - m'), l' = l c + sum p_i, acc' = acc c + sum p_i v_i (slots in
// order).
template <int GB, int DT>
CUD_ATTN_FN void attn_update(attn_state<GB, DT> *s, const float (*sc)[GB], const float (*v)[DT], const bool *valid) {
CUD_AT_UNROLL
    for (int g = 0; g < GB; g++) {
        float mx = s->m[g];
CUD_AT_UNROLL
        for (int p = 0; p < ATTN_P; p++)
            if (valid[p]) mx = fmaxf(mx, sc[p][g]);
        const float c = expf(s->m[g] - mx);
        float pr[ATTN_P];
        float l = s->l[g] * c;
CUD_AT_UNROLL
        for (int p = 0; p < ATTN_P; p++) {
            pr[p] = valid[p] ? expf(sc[p][g] - mx) : 0.f;
            l += pr[p];
        }
        s->l[g] = l;
        s->m[g] = mx;
CUD_AT_UNROLL
        for (int e = 0; e < DT; e++) {
            float a = s->acc[g][e] * c;
CUD_AT_UNROLL
            for (int p = 0; p < ATTN_P; p++) a = fmaf(pr[p], v[p][e], a);
            s->acc[g][e] = a;
        }
    }
}

// The merge of the teams for head g (run by one thread per head): from the teams' (m, l) in shared memory
// (tm[team * G + g], tl[...]), the weight of every team tw[team * G + g] = exp(m_team - M) (0 for a team that
// saw no position), *M the largest max, *L = sum l_team * weight in team order.
CUD_ATTN_FN void attn_team_weights(const float *tm, const float *tl, int nteam, int G, int g, float *tw, float *M,
                                   float *L) {
    float mx = ATTN_NEG;
    for (int t = 0; t < nteam; t++)
        if (tl[t * G + g] > 0.f) mx = fmaxf(mx, tm[t * G + g]);
    float sum = 0.f;
    for (int t = 0; t < nteam; t++) {
        const float w = tl[t * G + g] > 0.f ? expf(tm[t * G + g] - mx) : 0.f;
        tw[t * G + g] = w;
        sum = fmaf(tl[t * G + g], w, sum);
    }
    *M = mx;
    *L = sum;
}

// Element (g, d) of the block's output: sum over the teams in order of acc_team[g][d] * weight (tacc
// [nteam][G][hd] in shared memory).
CUD_ATTN_FN float attn_team_output(const float *tacc, const float *tw, int nteam, int G, int hd, int g, int d) {
    float o = 0.f;
    for (int t = 0; t < nteam; t++) o = fmaf(tacc[((size_t)t * G + g) * hd + d], tw[t * G + g], o);
    return o;
}

// The merge of a row's n splits for dim d of one head: ml [ATTN_MAX_SPLITS][2] (max, sum) and acc
// [ATTN_MAX_SPLITS][hd] (unnormalized outputs), combined in split order; returns the normalized output.
CUD_ATTN_FN float attn_merge_splits(const float *ml, const float *acc, int n, int hd, int d) {
    float mx = ATTN_NEG;
    for (int s = 0; s < n; s++)
        if (ml[2 * s + 1] > 0.f) mx = fmaxf(mx, ml[2 * s]);
    float L = 0.f, o = 0.f;
    for (int s = 0; s < n; s++) {
        const float ls = ml[2 * s + 1];
        if (!(ls > 0.f)) continue;
        const float w = expf(ml[2 * s] - mx);
        L = fmaf(ls, w, L);
        o = fmaf(acc[(size_t)s * hd + d], w, o);
    }
    return L > 0.f ? o / L : 0.f;
}

// Dynamic shared memory of one block: (m, l, weight) per team and head, (M, L) per head, acc per team, head
// and dim.
CUD_ATTN_FN size_t attn_shmem_bytes(const attn_geom &g, int G, int hd) {
    return ((size_t)3 * g.nteam * G + 2 * (size_t)G + (size_t)g.nteam * G * hd) * sizeof(float);
}

} // namespace cud_at

#endif
