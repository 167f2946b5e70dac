/* test_cuda_fattn_host.cpp: the tensor-core prefill attention of cuda/cud_fattn.cuh compiled for the host, on
 * every machine.
 *  - fragments: the m16n8k16 A, B and C/D layouts each own every element of their tile exactly once, the
 *    register pairs the kernel reads as one 32-bit word are adjacent columns (A) and adjacent k (B), and the
 *    host emulation of the instruction (fed through those layouts) equals a plain 16 x 16 by 16 x 8 product,
 *    for f16 and bf16 values;
 *  - f16 rounding: fa_f2h rounds to nearest even as the CPU engine's eng_f32_to_fp16 does (every f16 value and
 *    the midpoints between them), fa_h2f is exact;
 *  - the P repack: every A element fa_p_frag builds comes from the C element at the same (row, column);
 *  - tiles: fa_plan_tiles covers every batch row exactly once with runs of one sequence at consecutive
 *    positions, at most R rows each;
 *  - whole blocks: k_fattn's blocks run phase by phase (threads' copies, then each warp's lanes with the
 *    instruction emulated and the shuffles done on arrays) over a paged f16 pool with shuffled block tables:
 *    every K/V word of a key tile copied exactly once, and every output row equals a softmax in double within
 *    f16 tolerance, at edge shapes (1 query row, rows not a multiple of 16 or of R, prefixes not a multiple of
 *    the block size, GQA 1/3/4/8, head_dim 64 and 128), the batch holding a decode row of another sequence. */
#include <criterion/criterion.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "engine/kernels/quant.h"
}

#include "tests/unit/helper_cuda_host.h"

#define CUD_DEQ_FN inline
#define CUD_ATTN_FN inline
#define CUD_FA_FN inline
#include "cuda/cud_fattn.cuh"

using namespace cud_fa;

/* ---- fragments --------------------------------------------------------------------------------------------- */
Test(cuda_fattn_host, fragment_layouts_own_every_element_once) {
    int a[16][16] = {}, b[16][8] = {}, c[16][8] = {};
    for (int lane = 0; lane < 32; lane++) {
        for (int i = 0; i < 8; i++) {
            const int r = fa_a_row(lane, i), k = fa_a_col(lane, i);
            cr_assert(r >= 0 && r < 16 && k >= 0 && k < 16);
            a[r][k]++;
            if (i & 1) cr_assert(r == fa_a_row(lane, i - 1) && k == fa_a_col(lane, i - 1) + 1);
        }
        for (int i = 0; i < 4; i++) {
            const int k = fa_b_k(lane, i), n = fa_b_n(lane, i);
            cr_assert(k >= 0 && k < 16 && n >= 0 && n < 8);
            b[k][n]++;
            if (i & 1) cr_assert(n == fa_b_n(lane, i - 1) && k == fa_b_k(lane, i - 1) + 1);
        }
        for (int i = 0; i < 4; i++) {
            const int r = fa_c_row(lane, i), n = fa_c_col(lane, i);
            cr_assert(r >= 0 && r < 16 && n >= 0 && n < 8);
            c[r][n]++;
        }
    }
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < 16; k++) cr_assert_eq(a[r][k], 1, "A (%d, %d)", r, k);
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 8; n++) cr_assert_eq(b[k][n], 1, "B (%d, %d)", k, n);
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) cr_assert_eq(c[r][n], 1, "C (%d, %d)", r, n);
    /* the documented examples: lane 5 (group 1, thread 1) holds A (1, 2), (1, 3), (9, 2), (9, 3), (1, 10), ... */
    cr_assert(fa_a_row(5, 0) == 1 && fa_a_col(5, 0) == 2 && fa_a_row(5, 2) == 9 && fa_a_col(5, 5) == 11);
    cr_assert(fa_b_k(5, 0) == 2 && fa_b_k(5, 3) == 11 && fa_b_n(5, 0) == 1);
    cr_assert(fa_c_row(5, 3) == 9 && fa_c_col(5, 3) == 3);
}

static uint16_t to_bits(float f, bool bf16) { return bf16 ? eng_f32_to_bf16(f) : eng_f32_to_fp16(f); }
static double from_bits(uint16_t h, bool bf16) {
    if (!bf16) return eng_fp16_to_f32(h);
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

Test(cuda_fattn_host, emulation_is_the_plain_product) {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> U(-3.f, 3.f);
    for (int round = 0; round < 40; round++) {
        const bool bf16 = round & 1;
        uint16_t A[16][16], B[16][8];
        float C[16][8];
        for (auto &row : A)
            for (auto &x : row) x = to_bits(U(rng), bf16);
        for (auto &row : B)
            for (auto &x : row) x = to_bits(U(rng), bf16);
        for (auto &row : C)
            for (auto &x : row) x = U(rng);
        uint32_t a[32][4] = {}, b[32][2] = {};
        float c[32][4], d[32][4];
        for (int lane = 0; lane < 32; lane++) {
            for (int i = 0; i < 8; i++)
                a[lane][i / 2] |= (uint32_t)A[fa_a_row(lane, i)][fa_a_col(lane, i)] << (16 * (i & 1));
            for (int i = 0; i < 4; i++)
                b[lane][i / 2] |= (uint32_t)B[fa_b_k(lane, i)][fa_b_n(lane, i)] << (16 * (i & 1));
            for (int i = 0; i < 4; i++) c[lane][i] = C[fa_c_row(lane, i)][fa_c_col(lane, i)];
        }
        fa_mma_emul(a, b, c, d, bf16);
        float D[16][8];
        for (int lane = 0; lane < 32; lane++)
            for (int i = 0; i < 4; i++) D[fa_c_row(lane, i)][fa_c_col(lane, i)] = d[lane][i];
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 8; n++) {
                double s = C[r][n];
                for (int k = 0; k < 16; k++) s += from_bits(A[r][k], bf16) * from_bits(B[k][n], bf16);
                cr_assert(fabs(D[r][n] - s) <= 1e-6 * (1 + fabs(s)), "%s D(%d, %d) = %g, plain %g",
                          bf16 ? "bf16" : "f16", r, n, D[r][n], s);
            }
    }
}

Test(cuda_fattn_host, f16_rounding_is_the_cpu_engines) {
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue; /* NaN */
        const float f = fa_h2f((uint16_t)h);
        cr_assert_eq(f, eng_fp16_to_f32((uint16_t)h), "h2f %04x", h);
        cr_assert_eq(fa_f2h(f), (uint16_t)h, "f2h(h2f(%04x))", h);
        if ((h & 0x7FFF) < 0x7BFF) { /* the midpoint to the next value up (away from zero) and around it */
            const double mid = ((double)f + (double)fa_h2f((uint16_t)(h + 1))) / 2;
            for (float x : {(float)mid, nextafterf((float)mid, 0.f), nextafterf((float)mid, (float)(2 * mid))})
                cr_assert_eq(fa_f2h(x), eng_f32_to_fp16(x), "f2h(%a): %04x, engine %04x", (double)x, fa_f2h(x),
                             eng_f32_to_fp16(x));
        }
    }
    for (float x : {65504.f, 65519.f, 65520.f, 1e6f, -1e6f, INFINITY, -INFINITY, 1e-8f, -3e-5f, 0.f, -0.f})
        cr_assert_eq(fa_f2h(x), eng_f32_to_fp16(x), "f2h(%g)", (double)x);
}

Test(cuda_fattn_host, p_fragments_come_from_the_same_row_and_column) {
    fa_lane<64> st[32];
    for (int lane = 0; lane < 32; lane++)
        for (int j = 0; j < FA_BC / 8; j++)
            for (int e = 0; e < 4; e++) /* value = row * 64 + key column: exact in f16 (< 1024) */
                st[lane].s[j][e] = (float)(fa_c_row(lane, e) * 64 + 8 * j + fa_c_col(lane, e));
    for (int kk = 0; kk < FA_BC / 16; kk++)
        for (int lane = 0; lane < 32; lane++) {
            uint32_t a[4];
            fa_p_frag<64>(st[lane], kk, a);
            for (int i = 0; i < 8; i++) {
                const float v = fa_h2f(fa_elem16(a, i));
                cr_assert_eq(v, (float)(fa_a_row(lane, i) * 64 + 16 * kk + fa_a_col(lane, i)), "lane %d kk %d i %d",
                             lane, kk, i);
            }
        }
}

Test(cuda_fattn_host, tiles_cover_the_batch_in_runs) {
    std::mt19937 rng(9);
    for (int round = 0; round < 300; round++) {
        const int R = 1 + (int)(rng() % 64);
        const int32_t n = 1 + (int32_t)(rng() % 300);
        std::vector<int32_t> pos(n), seq(n), tiles(2 * (size_t)n), seen(n, 0);
        int32_t s = 0, p = (int32_t)(rng() % 50);
        for (int32_t i = 0; i < n; i++) {
            if (rng() % 10 == 0) s = (int32_t)(rng() % 5), p = (int32_t)(rng() % 100);
            else if (rng() % 20 == 0) p += 2; /* a gap: a new run */
            pos[i] = p++;
            seq[i] = s;
        }
        int32_t longest = 0;
        const int32_t nt = fa_plan_tiles(pos.data(), seq.data(), n, R, tiles.data(), &longest);
        cr_assert(nt >= 1 && nt <= n);
        int32_t best = 0;
        for (int32_t t = 0; t < nt; t++) {
            const int32_t r0 = tiles[2 * t], cnt = tiles[2 * t + 1];
            cr_assert(cnt >= 1 && cnt <= R && r0 >= 0 && r0 + cnt <= n);
            for (int32_t i = r0; i < r0 + cnt; i++) {
                seen[i]++;
                if (i > r0) cr_assert(seq[i] == seq[r0] && pos[i] == pos[i - 1] + 1);
            }
        }
        for (int32_t i = 0; i < n; i++) cr_assert_eq(seen[i], 1, "row %d", i);
        for (int32_t i = 0, run = 0; i < n; i++) {
            run = i > 0 && seq[i] == seq[i - 1] && pos[i] == pos[i - 1] + 1 ? run + 1 : 1;
            best = run > best ? run : best;
        }
        cr_assert_eq(longest, best);
    }
}

/* ---- whole blocks ------------------------------------------------------------------------------------------ */

/* One batch as in the GPU self-test: row 0 a decode row of sequence 0 at position 40, rows 1 .. n a chunk of
 * sequence 1 at positions prefix .. prefix + n - 1, two KV heads, layer 1 of a 2-layer f16 pool. */
template <int HD> static void run_case(int G, int bs, int32_t prefix, int32_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    const int n_kv = 2, n_head = n_kv * G, layer = 1;
    const int32_t len1 = prefix + n, len0 = 41;
    const int32_t nb1 = (len1 + bs - 1) / bs, nb0 = (len0 + bs - 1) / bs, nblocks = nb0 + nb1 + 3;
    const size_t row_bytes = (size_t)HD * 2, head_stride = row_bytes * bs, block_stride = head_stride * n_kv;
    const size_t layer_bytes = block_stride * nblocks;
    std::vector<uint16_t> pool(layer_bytes * 4 / 2);
    for (auto &x : pool) x = eng_f32_to_fp16(U(rng));
    std::vector<int32_t> perm(nblocks);
    for (int i = 0; i < nblocks; i++) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    const int32_t stride = std::max(nb0, nb1);
    std::vector<int32_t> tables(2 * (size_t)stride, -1);
    for (int i = 0; i < nb0; i++) tables[i] = perm[i];
    for (int i = 0; i < nb1; i++) tables[stride + i] = perm[nb0 + i];
    const int32_t rows = n + 1;
    std::vector<int32_t> pos(rows), seq(rows);
    pos[0] = len0 - 1;
    seq[0] = 0;
    for (int32_t i = 0; i < n; i++) pos[1 + i] = prefix + i, seq[1 + i] = 1;
    std::vector<float> q((size_t)rows * n_head * HD), out(q.size(), NAN);
    for (auto &x : q) x = 2.f * U(rng);
    std::vector<int32_t> tiles(2 * (size_t)rows);
    const int32_t n_tiles = fa_plan_tiles(pos.data(), seq.data(), rows, fa_tile_rows(G), tiles.data(), nullptr);
    const cud_at::attn_kv kv{(const char *)pool.data(), layer_bytes, block_stride, head_stride, row_bytes, bs};
    const float scale = 1.0f / sqrtf((float)HD), scale_log2 = scale * FA_LOG2E;

    std::vector<uint16_t> sk(fa_smem<HD>::K_ELEMS), sv(fa_smem<HD>::V_ELEMS);
    std::vector<fa_lane<HD>> lanes(FA_THREADS);
    for (int ti = 0; ti < n_tiles; ti++)
        for (int kvh = 0; kvh < n_kv; kvh++) {
            fa_tile t;
            t.row0 = tiles[2 * ti];
            t.n = tiles[2 * ti + 1];
            t.pos0 = pos[t.row0];
            t.kv_end = t.pos0 + t.n;
            t.G = G;
            t.h0 = kvh * G;
            const int32_t *table = tables.data() + (size_t)seq[t.row0] * stride;
            /* the query tile: every pair written once */
            std::fill(sk.begin(), sk.end(), (uint16_t)0x7E00); /* NaN: a read of an unwritten value shows */
            std::vector<int> qseen(FA_BR * HD / 2, 0);
            for (int tid = 0; tid < FA_THREADS; tid++)
                for (int k = 0; k < fa_smem<HD>::Q_STEPS; k++) {
                    int qr, d2;
                    cr_assert(fa_q_elem<HD>(tid, k, &qr, &d2));
                    qseen[qr * (HD / 2) + d2]++;
                    fa_copy_q<HD>(t, q.data(), n_head, qr, d2, sk.data());
                }
            for (int v : qseen) cr_assert_eq(v, 1);
            for (int tid = 0; tid < FA_THREADS; tid++) {
                fa_init<HD>(&lanes[tid]);
                fa_load_q<HD>(&lanes[tid], sk.data(), tid / 32, tid % 32);
            }
            for (int32_t t0 = 0; t0 < t.kv_end; t0 += FA_BC) {
                std::fill(sk.begin(), sk.end(), (uint16_t)0x7E00);
                std::fill(sv.begin(), sv.end(), (uint16_t)0x7E00);
                std::vector<int> kseen(FA_BC * HD / 8, 0), vseen(FA_BC * HD / 8, 0);
                for (int tid = 0; tid < FA_THREADS; tid++)
                    for (int k = 0; k < fa_smem<HD>::KV_STEPS; k++) {
                        int p, c;
                        fa_k_word<HD>(tid, k, &p, &c);
                        cr_assert(p >= 0 && p < FA_BC && c >= 0 && c < HD / 8);
                        kseen[p * (HD / 8) + c]++;
                        fa_copy_kv<HD>(kv, layer, 0, table, kvh, t.kv_end, t0, p, c, sk.data(), sv.data());
                        fa_v_word<HD>(tid, k, &p, &c);
                        cr_assert(p >= 0 && p < FA_BC && c >= 0 && c < HD / 8);
                        vseen[p * (HD / 8) + c]++;
                        fa_copy_kv<HD>(kv, layer, 1, table, kvh, t.kv_end, t0, p, c, sk.data(), sv.data());
                    }
                for (size_t i = 0; i < kseen.size(); i++) cr_assert(kseen[i] == 1 && vseen[i] == 1, "word %zu", i);
                for (int warp = 0; warp < FA_WARPS; warp++) {
                    fa_lane<HD> *L = &lanes[32 * warp];
                    if (!fa_warp_sees(t, warp, t0)) continue;
                    uint32_t a[32][4], b[32][2];
                    float c[32][4], d[32][4];
                    for (int l = 0; l < 32; l++) fa_zero_s<HD>(&L[l]);
                    for (int j = 0; j < FA_BC / 8; j++)
                        for (int kc = 0; kc < HD / 16; kc++) {
                            for (int l = 0; l < 32; l++) {
                                memcpy(a[l], L[l].qa[kc], sizeof a[l]);
                                fa_k_frag<HD>(sk.data(), j, kc, l, b[l]);
                                memcpy(c[l], L[l].s[j], sizeof c[l]);
                            }
                            fa_mma_emul(a, b, c, d, false);
                            for (int l = 0; l < 32; l++) memcpy(L[l].s[j], d[l], sizeof d[l]);
                        }
                    float mx[32][2];
                    for (int l = 0; l < 32; l++) fa_scores<HD>(&L[l], t, warp, l, t0, scale_log2, mx[l]);
                    for (int o : {1, 2}) { /* __shfl_xor_sync: every lane reads the others' values before writing */
                        float prev[32][2];
                        memcpy(prev, mx, sizeof prev);
                        for (int l = 0; l < 32; l++)
                            for (int h = 0; h < 2; h++) mx[l][h] = fmaxf(prev[l][h], prev[l ^ o][h]);
                    }
                    for (int l = 0; l < 32; l++) fa_rescale<HD>(&L[l], mx[l]);
                    for (int kk = 0; kk < FA_BC / 16; kk++)
                        for (int dn = 0; dn < HD / 8; dn++) {
                            for (int l = 0; l < 32; l++) {
                                fa_p_frag<HD>(L[l], kk, a[l]);
                                fa_v_frag<HD>(sv.data(), dn, kk, l, b[l]);
                                memcpy(c[l], L[l].o[dn], sizeof c[l]);
                            }
                            fa_mma_emul(a, b, c, d, false);
                            for (int l = 0; l < 32; l++) memcpy(L[l].o[dn], d[l], sizeof d[l]);
                        }
                }
            }
            for (int warp = 0; warp < FA_WARPS; warp++) {
                float ls[32][2];
                for (int l = 0; l < 32; l++) ls[l][0] = lanes[32 * warp + l].l[0], ls[l][1] = lanes[32 * warp + l].l[1];
                for (int o : {1, 2}) {
                    float prev[32][2];
                    memcpy(prev, ls, sizeof prev);
                    for (int l = 0; l < 32; l++)
                        for (int h = 0; h < 2; h++) ls[l][h] = prev[l][h] + prev[l ^ o][h];
                }
                for (int l = 0; l < 32; l++) fa_store<HD>(lanes[32 * warp + l], t, warp, l, ls[l], n_head, out.data());
            }
        }
    std::vector<double> ref(HD);
    double worst = 0;
    for (int32_t r = 0; r < rows; r++)
        for (int h = 0; h < n_head; h++) {
            fa_reference(kv, layer, tables.data() + (size_t)seq[r] * stride, pos[r],
                         q.data() + ((size_t)r * n_head + h) * HD, h / G, HD, scale, ref.data());
            for (int d = 0; d < HD; d++) {
                const double got = out[((size_t)r * n_head + h) * HD + d], err = fabs(got - ref[d]);
                worst = std::max(worst, err);
                cr_assert(err <= 2e-3, "hd %d G %d block %d prefix %d rows %d: row %d head %d dim %d: %g, reference %g",
                          HD, G, bs, prefix, n, r, h, d, got, ref[d]);
            }
        }
    cr_log_info("hd %d G %d block %d prefix %d rows %d: %d tiles, worst difference %.3g", HD, G, bs, prefix, n,
                n_tiles, worst);
}

Test(cuda_fattn_host, blocks_hd64) {
    run_case<64>(1, 16, 0, 1, 1);    /* one query row, no prefix */
    run_case<64>(4, 16, 0, 7, 2);    /* a chunk of 7 */
    run_case<64>(4, 13, 37, 7, 3);   /* prefix not a multiple of the block size */
    run_case<64>(8, 16, 5, 17, 4);   /* 17 rows: tiles of 8 with a remainder */
    run_case<64>(3, 16, 11, 45, 5);  /* G 3: 21 rows per tile, query row 63 unused */
    run_case<64>(1, 32, 70, 130, 6); /* several key tiles, tiles of 64 */
}

Test(cuda_fattn_host, blocks_hd128) {
    run_case<128>(1, 16, 0, 1, 11);
    run_case<128>(4, 16, 21, 16, 12);
    run_case<128>(8, 13, 100, 9, 13);
    run_case<128>(4, 16, 300, 1, 14); /* one row after a long prefix (five key tiles) */
    run_case<128>(1, 16, 3, 70, 15);
}
