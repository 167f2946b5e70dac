/*
 * quant_kpacked.c: packed layouts of Q4_0, Q5_0, MXFP4, Q4_K, Q5_K and Q6_K matrices, their scalar reference
 * kernels, and the entry points of quant_kpacked.h for every packed type (see there for the contract).
 *
 * Layouts. Rows are taken 16 at a time (a group; rows past n_out are zero). A group is one record per
 * super-block (256 values), records one after the other; every record is a multiple of 64 bytes. In every
 * 64-byte code line, bytes 4i..4i+3 belong to row i, so that one vpdpbusd lane (or, in the AVX2 kernels, one
 * pair of vpmaddubsw lanes of a 32-byte half line) works on one row, and a group's 16 rows need no horizontal
 * sums. Codes are unsigned; the activation quad they multiply is broadcast to all lanes.
 *
 * Q4_K record (2368 bytes, the GGUF rows take 2304): for sub-block j (32 values) and t = 0..3, line j * 4 + t
 * holds in byte 4i + e the codes of values 4t + e (low nibble) and 16 + 4t + e (high nibble) of sub-block j of
 * row i; then the 6-bit scales [8][16] and mins [4][16][2] as bytes, d [16] and dmin [16] as fp16.
 * Q5_K record (2880 bytes, GGUF 2816): as Q4_K with a fifth line after the 4 of each sub-block (5 j + 4), whose
 * byte 4i + e holds the fifth bits of the values of line t at bits t (low nibble) and 4 + t (high nibble).
 * Q4_0 / Q5_0 (18 / 22 bytes per row and block, as in GGUF): per block of 32 values, 4 code lines as one
 * sub-block of Q4_K (Q5_0: and a fifth-bit line as Q5_K's), the codes of all blocks first, then the fp16 scales
 * [nb][16]; the block's integer sum starts at -offset * sum(x) (offset 8 / 16) and the packed Q8_0 kernels'
 * float operations follow. MXFP4 (17 bytes per row and block in GGUF, 18 here): Q4_0's code lines with its 4-bit
 * codes, and the e8m0 exponent in the first byte of each 2-byte scale slot; the SIMD kernels look each code up as
 * its doubled e2m1 value + 12 (0..24) and start the block's sum at -12 * sum(x).
 * Q6_K record (3392 bytes, the GGUF rows take 3360): for sub-block g (16 values), lines 3g and 3g + 1 hold in
 * byte 4i + e the low 4 bits of values 4q + e of row i, q = 0 and 1 (line 3g: low / high nibble) and q = 2
 * and 3 (line 3g + 1); line 3g + 2 holds in byte 4i + e the high 2 bits of values 4q + e at bits 2q..2q+1;
 * then the scales [16][16] (int8) and d [16] as float. (Lines in the order the kernels read them: with the high
 * bits in a separate region, single-row products streamed at a third of the speed.)
 *
 * Kernels. Per super-block and row the integer sum of the scalar row kernel (quant.c dot_q4_K / dot_q6_K):
 * Q4_K sumi = sum_j sc_j * sum(code * x) and summ = sum_j min_j * (bsums of x over sub-block j); Q6_K
 * sumi = sum_g sc_g * sum((code - 32) * x), computed as sum_g sc_g * (sum(code * x) - 32 * bsum_g). Those are
 * exact, whatever the order; then the same float operations as the row kernel in the same order
 * (Q4_K: s += (d * d_x) * sumi - (dmin * d_x) * summ; Q6_K: s += (d * d_x) * sumi), so every level gives the
 * scalar row kernel's floats bit for bit.
 */
#include "engine/kernels/quant_kpacked.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engine/engine.h"
#include "engine/kernels/quant_kpacked_impl.h"

_Static_assert(KP4_REC % 64 == 0 && KP5_REC % 64 == 0 && KP6_REC % 64 == 0, "records are whole lines");

/* ---- Q4_0 / Q5_0 packing --------------------------------------------------------------------------------- */
/* The 4- (Q4_0, MXFP4) or 5-bit (Q5_0) code of value e (0..31) of a block. */
static int q0_code(uint32_t type, const uint8_t *blk, int e) {
    if (type == ENG_Q_Q4_0 || type == ENG_Q_MXFP4) {
        const uint8_t *qs = blk + (type == ENG_Q_Q4_0 ? 2 : 1);
        return e < 16 ? qs[e] & 0xF : qs[e - 16] >> 4;
    }
    const eng_blk_q5_0 *b = (const eng_blk_q5_0 *)blk;
    int lo = e < 16 ? b->qs[e] & 0xF : b->qs[e - 16] >> 4;
    return lo | (((b->qh[e / 8] >> (e % 8)) & 1) << 4);
}

/* Row i of a Q4_0 / Q5_0 block b into a group (nb blocks): line 4 b + t holds in byte 4i + e the low 4 bits of
 * values 4t + e (low nibble) and 16 + 4t + e (high nibble); Q5_0's fifth line holds their fifth bits at bits t and
 * 4 + t; the scale goes to the scales [nb][16] after the codes. */
static void pack_q0_block(uint32_t type, const uint8_t *blk, int64_t b, int64_t nb, int i, uint8_t *grp) {
    uint8_t *code = grp + b * kp0_code_bytes(type);
    for (int t = 0; t < 4; t++)
        for (int e = 0; e < 4; e++) {
            int lo = q0_code(type, blk, 4 * t + e), hi = q0_code(type, blk, 16 + 4 * t + e);
            code[64 * t + 4 * i + e] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
            if (type == ENG_Q_Q5_0) code[256 + 4 * i + e] |= (uint8_t)(((lo >> 4) << t) | ((hi >> 4) << (4 + t)));
        }
    uint8_t *slot = grp + nb * kp0_code_bytes(type) + 32 * b + 2 * i;
    if (type == ENG_Q_MXFP4) slot[0] = blk[0], slot[1] = 0; /* the e8m0 exponent */
    else memcpy(slot, blk, 2);                                /* d is the first field of Q4_0 and Q5_0 blocks */
}

/* ---- Q4_K / Q6_K packing -------------------------------------------------------------------------------- */
/* The 6-bit code (value + 32) of value e (0..255) of a Q6_K block. */
static int q6_code(const eng_blk_q6_K *b, int e) {
    int n = e / 128, a = e % 128 / 32, l = e % 32;
    uint8_t lo = b->ql[64 * n + l + 32 * (a & 1)];
    int nib = a >= 2 ? lo >> 4 : lo & 0xF;
    return nib | (((b->qh[32 * n + l] >> (2 * a)) & 3) << 4);
}
/* The low 4 bits of the code of value e of a Q4_K / Q5_K block's qs. */
static int q4k_code(const uint8_t *qs, int e) {
    int j = e / 32, l = e % 32;
    uint8_t q = qs[32 * (j / 2) + l];
    return j % 2 ? q >> 4 : q & 0xF;
}

/* Row i of a Q4_K (qh NULL) or Q5_K super-block (fields of either block) into record rec. */
static void pack_q45_K_rec(uint16_t d, uint16_t dmin, const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, int i,
                           uint8_t *rec) {
    const bool q5 = qh != NULL;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, mn;
        eng_k4_scale_min(j, scales, &sc, &mn);
        rec[KP45_SC(q5) + 16 * j + i] = sc;
        rec[KP45_MN(q5) + 32 * (j / 2) + 2 * i + j % 2] = mn;
        for (int t = 0; t < 4; t++)
            for (int e = 0; e < 4; e++) {
                int lo = 32 * j + 4 * t + e, hi = lo + 16; /* values of sub-block j in this byte */
                rec[KP45_SUB(q5) * j + 64 * t + 4 * i + e] = (uint8_t)(q4k_code(qs, lo) | (q4k_code(qs, hi) << 4));
                if (qh) /* fifth bits: value l of sub-block j is bit j of qh[l] */
                    rec[KP45_SUB(q5) * j + 256 + 4 * i + e] |=
                        (uint8_t)((((qh[lo % 32] >> j) & 1) << t) | (((qh[hi % 32] >> j) & 1) << (4 + t)));
            }
    }
    memcpy(rec + KP45_D(q5) + 2 * i, &d, 2);
    memcpy(rec + KP45_DMIN(q5) + 2 * i, &dmin, 2);
}

static void pack_q6_K_rec(const eng_blk_q6_K *b, int i, uint8_t *rec) {
    for (int g = 0; g < 16; g++) {
        rec[KP6_SC + 16 * g + i] = (uint8_t)b->scales[g];
        for (int e = 0; e < 4; e++) {
            int c[4], hb = 0;
            for (int q = 0; q < 4; q++) {
                c[q] = q6_code(b, 16 * g + 4 * q + e);
                hb |= (c[q] >> 4) << (2 * q);
            }
            rec[KP6_SUB * g + 4 * i + e] = (uint8_t)((c[0] & 0xF) | ((c[1] & 0xF) << 4));
            rec[KP6_SUB * g + 64 + 4 * i + e] = (uint8_t)((c[2] & 0xF) | ((c[3] & 0xF) << 4));
            rec[KP6_SUB * g + 128 + 4 * i + e] = (uint8_t)hb;
        }
    }
    float d = eng_fp16_to_f32(b->d);
    memcpy(rec + KP6_D + 4 * i, &d, 4);
}

size_t eng_wpack_bytes(uint32_t type, int64_t n_out, int64_t k) {
    switch (type) {
    case ENG_Q_Q8_0: return eng_packed_q8_0_bytes(n_out, k);
    case ENG_Q_Q4_0:
    case ENG_Q_Q5_0:
    case ENG_Q_MXFP4:
        if (n_out < 1 || k < ENG_QK || k % ENG_QK != 0 || k > ENG_PACK_MAX_K) return 0;
        return (size_t)((n_out + KP_ROWS - 1) / KP_ROWS) * (size_t)kp0_group_bytes(type, k / ENG_QK);
    case ENG_Q_Q4_K:
    case ENG_Q_Q5_K:
    case ENG_Q_Q6_K:
        if (n_out < 1 || k < ENG_QKK || k % ENG_QKK != 0 || k > ENG_PACK_MAX_K) return 0;
        return (size_t)((n_out + KP_ROWS - 1) / KP_ROWS) * (size_t)(k / ENG_QKK) * (size_t)kp_rec_bytes(type);
    default: return 0;
    }
}

int eng_wpack(uint32_t type, const void *W, int64_t n_out, int64_t k, void *dst) {
    size_t total = eng_wpack_bytes(type, n_out, k);
    if (!W || !dst || total == 0) return ENG_ERR_INVALID;
    if (type == ENG_Q_Q8_0) return eng_pack_q8_0(W, n_out, k, dst);
    const size_t rb = eng_qtype_row_bytes(type, k);
    memset(dst, 0, total);
    if (kp0_type(type)) {
        const int64_t nb = k / ENG_QK, bsz = eng_qtype_get(type)->block_bytes;
        for (int64_t j = 0; j < n_out; j++)
            for (int64_t b = 0; b < nb; b++)
                pack_q0_block(type, (const uint8_t *)W + (size_t)j * rb + (size_t)(b * bsz), b, nb, (int)(j % KP_ROWS),
                              (uint8_t *)dst + (size_t)(j / KP_ROWS) * (size_t)kp0_group_bytes(type, nb));
        return 0;
    }
    const int64_t nsb = k / ENG_QKK, rec = kp_rec_bytes(type);
    for (int64_t j = 0; j < n_out; j++) {
        const uint8_t *row = (const uint8_t *)W + (size_t)j * rb;
        uint8_t *grp = (uint8_t *)dst + (size_t)(j / KP_ROWS) * (size_t)(nsb * rec);
        for (int64_t sb = 0; sb < nsb; sb++) {
            const int i = (int)(j % KP_ROWS);
            if (type == ENG_Q_Q4_K) {
                const eng_blk_q4_K *b = (const eng_blk_q4_K *)row + sb;
                pack_q45_K_rec(b->d, b->dmin, b->scales, b->qs, NULL, i, grp + sb * rec);
            } else if (type == ENG_Q_Q5_K) {
                const eng_blk_q5_K *b = (const eng_blk_q5_K *)row + sb;
                pack_q45_K_rec(b->d, b->dmin, b->scales, b->qs, b->qh, i, grp + sb * rec);
            } else {
                pack_q6_K_rec((const eng_blk_q6_K *)row + sb, i, grp + sb * rec);
            }
        }
    }
    return 0;
}

/* ---- reading one row back ----------------------------------------------------------------------------------
 * The inverse of the packing functions above: row i of a group back into GGUF blocks. Every field of a block is
 * kept by the packed layout (Q4_K / Q5_K's 12 bytes of scales hold exactly the 8 six-bit scales and mins; Q6_K's d
 * was widened from fp16 to float exactly), so the bytes are those of the row that was packed. */
static void unpack_q0_block(uint32_t type, const uint8_t *grp, int64_t b, int64_t nb, int i, uint8_t *blk) {
    const uint8_t *code = grp + b * kp0_code_bytes(type);
    uint8_t *qs = blk + (type == ENG_Q_Q4_0 ? 2 : type == ENG_Q_MXFP4 ? 1 : 6), *qh = blk + 2;
    memcpy(blk, grp + nb * kp0_code_bytes(type) + 32 * b + 2 * i, type == ENG_Q_MXFP4 ? 1 : 2);
    if (type == ENG_Q_Q5_0) memset(qh, 0, 4);
    for (int t = 0; t < 4; t++)
        for (int e = 0; e < 4; e++) {
            const int lo = 4 * t + e, hi = 16 + lo; /* value lo in the low nibble of qs[lo], hi in its high one */
            qs[lo] = code[64 * t + 4 * i + e];
            if (type == ENG_Q_Q5_0) {
                const uint8_t h = code[256 + 4 * i + e];
                qh[lo / 8] |= (uint8_t)(((h >> t) & 1) << (lo % 8));
                qh[hi / 8] |= (uint8_t)(((h >> (4 + t)) & 1) << (hi % 8));
            }
        }
}

/* Row i of a Q4_K (qh NULL) or Q5_K record back into the fields of its block. */
static void unpack_q45_K_rec(const uint8_t *rec, int i, uint16_t *d, uint16_t *dmin, uint8_t *scales, uint8_t *qs,
                             uint8_t *qh) {
    const bool q5 = qh != NULL;
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = rec[KP45_SC(q5) + 16 * j + i];
        mn[j] = rec[KP45_MN(q5) + 32 * (j / 2) + 2 * i + j % 2];
    }
    for (int j = 0; j < 4; j++) { /* the inverse of eng_k4_scale_min */
        scales[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
    }
    memset(qs, 0, 128);
    if (qh) memset(qh, 0, 32);
    for (int j = 0; j < 8; j++)
        for (int t = 0; t < 4; t++)
            for (int e = 0; e < 4; e++) {
                const int lo = 32 * j + 4 * t + e, hi = lo + 16;
                const uint8_t c = rec[KP45_SUB(q5) * j + 64 * t + 4 * i + e];
                const int vals[2] = {lo, hi}, nib[2] = {c & 0xF, c >> 4};
                for (int v = 0; v < 2; v++) { /* value l of sub-block j: qs[32 (j / 2) + l], nibble j % 2 */
                    const int l = vals[v] % 32;
                    qs[32 * (j / 2) + l] |= (uint8_t)(nib[v] << (4 * (j % 2)));
                    if (qh) qh[l] |= (uint8_t)(((rec[KP45_SUB(q5) * j + 256 + 4 * i + e] >> (4 * v + t)) & 1) << j);
                }
            }
    memcpy(d, rec + KP45_D(q5) + 2 * i, 2);
    memcpy(dmin, rec + KP45_DMIN(q5) + 2 * i, 2);
}

static void unpack_q6_K_rec(const uint8_t *rec, int i, eng_blk_q6_K *b) {
    memset(b->ql, 0, sizeof b->ql);
    memset(b->qh, 0, sizeof b->qh);
    for (int g = 0; g < 16; g++) {
        b->scales[g] = (int8_t)rec[KP6_SC + 16 * g + i];
        for (int q = 0; q < 4; q++)
            for (int e = 0; e < 4; e++) {
                const uint8_t lo = rec[KP6_SUB * g + 64 * (q / 2) + 4 * i + e];
                const int c = ((q % 2 ? lo >> 4 : lo & 0xF) | (((rec[KP6_SUB * g + 128 + 4 * i + e] >> (2 * q)) & 3) << 4));
                const int v = 16 * g + 4 * q + e, n = v / 128, a = v % 128 / 32, l = v % 32; /* as q6_code */
                b->ql[64 * n + l + 32 * (a & 1)] |= (uint8_t)((c & 0xF) << (a >= 2 ? 4 : 0));
                b->qh[32 * n + l] |= (uint8_t)((c >> 4) << (2 * a));
            }
    }
    float d;
    memcpy(&d, rec + KP6_D + 4 * i, 4);
    b->d = eng_f32_to_fp16(d);
}

int eng_wpack_row(uint32_t type, const void *P, int64_t n_out, int64_t k, int64_t j, void *row) {
    if (type == ENG_Q_Q8_0) return eng_packed_q8_0_row(P, n_out, k, j, row);
    if (!P || !row || j < 0 || j >= n_out || eng_wpack_bytes(type, n_out, k) == 0) return ENG_ERR_INVALID;
    int64_t nb = 0;
    size_t gbytes = 0, xb = 0;
    eng_kp_shape(type, k, &nb, &gbytes, &xb);
    const uint8_t *grp = (const uint8_t *)P + (size_t)(j / KP_ROWS) * gbytes;
    const int i = (int)(j % KP_ROWS);
    const int64_t bsz = eng_qtype_get(type)->block_bytes;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = (uint8_t *)row + b * bsz;
        if (kp0_type(type)) {
            unpack_q0_block(type, grp, b, nb, i, blk);
        } else if (type == ENG_Q_Q4_K) {
            eng_blk_q4_K q;
            unpack_q45_K_rec(grp + b * KP4_REC, i, &q.d, &q.dmin, q.scales, q.qs, NULL);
            memcpy(blk, &q, sizeof q);
        } else if (type == ENG_Q_Q5_K) {
            eng_blk_q5_K q;
            unpack_q45_K_rec(grp + b * KP5_REC, i, &q.d, &q.dmin, q.scales, q.qs, q.qh);
            memcpy(blk, &q, sizeof q);
        } else {
            eng_blk_q6_K q;
            unpack_q6_K_rec(grp + b * KP6_REC, i, &q);
            memcpy(blk, &q, sizeof q);
        }
    }
    return 0;
}

/* ---- scalar reference kernels ----------------------------------------------------------------------------- */
static float kx_d(const uint8_t *xb) {
    float d;
    memcpy(&d, xb, 4);
    return d;
}
static int kx_bsum(const uint8_t *xb, int g) {
    int16_t v;
    memcpy(&v, xb + KX_BSUMS + 2 * g, 2);
    return v;
}

/* Row i of a Q4_K (q5 false) or Q5_K group times activation row x (nsb super-blocks), as dot_q4_K / dot_q5_K
 * compute it. */
static float dot_q45_K_packed(bool q5, const uint8_t *grp, int i, int64_t nsb, const uint8_t *x) {
    float s = 0.f;
    for (int64_t sb = 0; sb < nsb; sb++, x += KX_BYTES) {
        const uint8_t *rec = grp + sb * (q5 ? KP5_REC : KP4_REC);
        const int8_t *qx = (const int8_t *)(x + KX_QS);
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            int a = 0;
            for (int t = 0; t < 4; t++)
                for (int e = 0; e < 4; e++) {
                    uint8_t c = rec[KP45_SUB(q5) * j + 64 * t + 4 * i + e], h = q5 ? rec[KP45_SUB(q5) * j + 256 + 4 * i + e] : 0;
                    int lo = (c & 0xF) | (((h >> t) & 1) << 4), hi = (c >> 4) | (((h >> (4 + t)) & 1) << 4);
                    a += lo * qx[32 * j + 4 * t + e] + hi * qx[32 * j + 16 + 4 * t + e];
                }
            sumi += rec[KP45_SC(q5) + 16 * j + i] * a;
            summ += rec[KP45_MN(q5) + 32 * (j / 2) + 2 * i + j % 2] * (kx_bsum(x, 2 * j) + kx_bsum(x, 2 * j + 1));
        }
        uint16_t d, dmin;
        memcpy(&d, rec + KP45_D(q5) + 2 * i, 2);
        memcpy(&dmin, rec + KP45_DMIN(q5) + 2 * i, 2);
        float dd = eng_fp16_to_f32(d) * kx_d(x), dm = eng_fp16_to_f32(dmin) * kx_d(x);
        s += dd * (float)sumi - dm * (float)summ;
    }
    return s;
}

/* Row i of a Q6_K group times activation row x, as dot_q6_K computes it. */
static float dot_q6_K_packed(const uint8_t *grp, int i, int64_t nsb, const uint8_t *x) {
    float s = 0.f;
    for (int64_t sb = 0; sb < nsb; sb++, x += KX_BYTES) {
        const uint8_t *rec = grp + sb * KP6_REC;
        const int8_t *qx = (const int8_t *)(x + KX_QS);
        int sumi = 0;
        for (int g = 0; g < 16; g++) {
            int a = 0;
            for (int q = 0; q < 4; q++)
                for (int e = 0; e < 4; e++) {
                    uint8_t lo = rec[KP6_SUB * g + 64 * (q / 2) + 4 * i + e];
                    int code = (q % 2 ? lo >> 4 : lo & 0xF) | (((rec[KP6_SUB * g + 128 + 4 * i + e] >> (2 * q)) & 3) << 4);
                    a += (code - 32) * qx[16 * g + 4 * q + e];
                }
            sumi += (int8_t)rec[KP6_SC + 16 * g + i] * a;
        }
        float d;
        memcpy(&d, rec + KP6_D + 4 * i, 4);
        s += (d * kx_d(x)) * (float)sumi;
    }
    return s;
}

/* Row i of an MXFP4 group times Q8_0 activation row x: per block the exact integer sum of kvalue * q, then
 * (float)isum * (half e8m0 * d_x), as eng_dot_mxfp4. */
static float dot_mxfp4_packed(const uint8_t *grp, int i, int64_t nb, const uint8_t *x) {
    float s = 0.f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *code = grp + b * 256;
        const eng_blk_q8_0 *xb = (const eng_blk_q8_0 *)x + b;
        int isum = 0;
        for (int t = 0; t < 4; t++)
            for (int e = 0; e < 4; e++) {
                uint8_t c = code[64 * t + 4 * i + e];
                isum += eng_mxfp4_kvalues[c & 0xF] * xb->qs[4 * t + e];
                isum += eng_mxfp4_kvalues[c >> 4] * xb->qs[16 + 4 * t + e];
            }
        s += (float)isum * (eng_e8m0_half(grp[nb * 256 + 32 * b + 2 * i]) * eng_fp16_to_f32(xb->d));
    }
    return s;
}

/* Row i of a Q4_0 / Q5_0 / MXFP4 group times Q8_0 activation row x, as dot_q4_0 / dot_q5_0 / eng_dot_mxfp4 compute
 * it. */
static float dot_q0_packed(uint32_t type, const uint8_t *grp, int i, int64_t nb, const uint8_t *x) {
    if (type == ENG_Q_MXFP4) return dot_mxfp4_packed(grp, i, nb, x);
    const int off = type == ENG_Q_Q4_0 ? 8 : 16;
    float s = 0.f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *code = grp + b * kp0_code_bytes(type);
        const eng_blk_q8_0 *xb = (const eng_blk_q8_0 *)x + b;
        int isum = 0;
        for (int t = 0; t < 4; t++)
            for (int e = 0; e < 4; e++) {
                uint8_t c = code[64 * t + 4 * i + e], h = type == ENG_Q_Q5_0 ? code[256 + 4 * i + e] : 0;
                int lo = (c & 0xF) | (((h >> t) & 1) << 4), hi = (c >> 4) | (((h >> (4 + t)) & 1) << 4);
                isum += (lo - off) * xb->qs[4 * t + e] + (hi - off) * xb->qs[16 + 4 * t + e];
            }
        uint16_t d;
        memcpy(&d, grp + nb * kp0_code_bytes(type) + 32 * b + 2 * i, 2);
        s += (float)isum * (eng_fp16_to_f32(d) * eng_fp16_to_f32(xb->d));
    }
    return s;
}

static void gemm_kpacked_scalar(uint32_t type, const uint8_t *P, int64_t k, const uint8_t *xq, int64_t m, float *y,
                                int64_t ldy, int64_t jb, int64_t je) {
    if (kp0_type(type)) {
        const int64_t nb = k / ENG_QK;
        const size_t gbytes = (size_t)kp0_group_bytes(type, nb), xb = (size_t)nb * sizeof(eng_blk_q8_0);
        for (int64_t j = jb; j < je; j++)
            for (int64_t r = 0; r < m; r++)
                y[r * ldy + j] = dot_q0_packed(type, P + (size_t)(j / KP_ROWS) * gbytes, (int)(j % KP_ROWS), nb,
                                               xq + (size_t)r * xb);
        return;
    }
    const int64_t nsb = k / ENG_QKK;
    const size_t gbytes = (size_t)(nsb * kp_rec_bytes(type)), xb = (size_t)nsb * KX_BYTES;
    for (int64_t j = jb; j < je; j++) {
        const uint8_t *grp = P + (size_t)(j / KP_ROWS) * gbytes;
        for (int64_t r = 0; r < m; r++) {
            const uint8_t *x = xq + (size_t)r * xb;
            y[r * ldy + j] = type == ENG_Q_Q6_K ? dot_q6_K_packed(grp, (int)(j % KP_ROWS), nsb, x)
                                                : dot_q45_K_packed(type == ENG_Q_Q5_K, grp, (int)(j % KP_ROWS), nsb, x);
        }
    }
}

int eng_kp_shape(uint32_t type, int64_t k, int64_t *nb, size_t *gbytes, size_t *xb) {
    static const uint32_t order[6] = {ENG_Q_Q4_0, ENG_Q_Q5_0, ENG_Q_Q4_K, ENG_Q_Q5_K, ENG_Q_Q6_K, ENG_Q_MXFP4};
    for (int i = 0; i < 6; i++) {
        if (order[i] != type) continue;
        const bool k32 = kp0_type(type);
        *nb = k32 ? k / ENG_QK : k / ENG_QKK;
        *gbytes = k32 ? (size_t)kp0_group_bytes(type, *nb) : (size_t)(*nb * kp_rec_bytes(type));
        *xb = k32 ? (size_t)*nb * sizeof(eng_blk_q8_0) : (size_t)*nb * KX_BYTES;
        return i;
    }
    return -1;
}

void eng_kp_prep(uint32_t type, bool pairs16, const uint8_t *xr, size_t xb, int rn, int64_t nb, int maxc, float *xd,
                 int32_t *xp) {
    for (int c = 0; c < rn; c++) {
        for (int64_t b = 0; b < nb; b++) {
            if (kp0_type(type)) {
                const eng_blk_q8_0 *x = (const eng_blk_q8_0 *)(xr + (size_t)c * xb) + b;
                int sum = 0;
                for (int e = 0; e < 32; e++) sum += x->qs[e];
                xd[b * maxc + c] = eng_fp16_to_f32(x->d);
                xp[b * maxc + c] = (type == ENG_Q_Q4_0 ? -8 : type == ENG_Q_MXFP4 ? -KP_MX_OFFSET : -16) * sum;
                continue;
            }
            const uint8_t *x = xr + (size_t)c * xb + (size_t)b * KX_BYTES;
            int16_t bs[16];
            memcpy(&xd[b * maxc + c], x, 4);
            memcpy(bs, x + KX_BSUMS, sizeof bs);
            int32_t *o = xp + (b * maxc + c) * KP_XP;
            if (type != ENG_Q_Q6_K) {
                for (int p = 0; p < 4; p++) {
                    int b0 = bs[4 * p] + bs[4 * p + 1], b1 = bs[4 * p + 2] + bs[4 * p + 3];
                    o[p] = (int32_t)((uint32_t)(uint16_t)b0 | ((uint32_t)(uint16_t)b1 << 16));
                }
            } else {
                for (int g = 0; g < 16; g++)
                    o[g] = pairs16 ? (int32_t)((uint32_t)(uint16_t)(-16 * bs[g]) * 0x10001u) : -32 * bs[g];
            }
        }
    }
}

void *eng_wpack_alloc(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    if (bytes == 0 || bytes > SIZE_MAX - huge) return NULL;
    if (bytes < huge) return aligned_alloc(64, (bytes + 63) / 64 * 64);
    void *p = aligned_alloc(huge, (bytes + huge - 1) / huge * huge);
    if (p) (void)madvise(p, bytes / huge * huge, MADV_HUGEPAGE);
    return p;
}

void eng_gemm_wpacked(eng_simd_level l, uint32_t type, const void *P, int64_t n_out, int64_t k, const void *xq,
                      int64_t m, float *y, int64_t ldy, int64_t j_begin, int64_t j_end) {
    if (type == ENG_Q_Q8_0) {
        if (eng_wpack_bytes(type, n_out, k) != 0)
            eng_gemm_packed_q8_0(l, P, n_out, k, xq, m, y, ldy, j_begin, j_end);
        return;
    }
    if (j_end > n_out) j_end = n_out;
    if (!P || !xq || !y || m <= 0 || j_end <= j_begin || j_begin < 0 || eng_wpack_bytes(type, n_out, k) == 0) return;
    for (int lv = (int)l; lv > ENG_SIMD_SCALAR; lv--) {
        eng_packed_gemm_fn f = eng_qkernels_at((eng_simd_level)lv, type)->packed_gemm;
        if (f && f(type, P, k, xq, m, y, ldy, j_begin, j_end)) return;
    }
    gemm_kpacked_scalar(type, P, k, xq, m, y, ldy, j_begin, j_end);
}
