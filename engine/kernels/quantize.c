/*
 * quantize.c: weight quantizers with the rounding rules of ggml's reference quantizers (the ones llama.cpp's
 * llama-quantize runs without an importance matrix), and the finiteness check of quantized rows. See quant.h.
 *
 * Bit-exactness: every float operation below is done in the same order and the same precision as the
 * reference (single precision, no fused multiply-add: the project builds ISO C without -march, so the compiler
 * does not contract a*b+c). Products like w * x * l are (w * x) * l, sums are accumulated left to right, and
 * integers are converted to float before they meet a float. Changing the order of any of these changes
 * the bytes of some blocks.
 */
#include <math.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kernels/quant.h"
#include "engine/kernels/quant_impl.h"

/* Round to nearest, ties to even, through the 1.5 * 2^23 trick. Exact for |v| < 2^22; for larger values the
 * result is the same (meaningless but deterministic) integer the reference gets, which the callers clamp. */
static inline int round_even(float v) {
    float t = v + 12582912.f;
    int32_t i;
    memcpy(&i, &t, 4);
    return (i & 0x007FFFFF) - 0x00400000;
}

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }
static inline float h2f(uint16_t h) { return eng_fp16_to_f32(h); }

/* A block whose largest magnitude is below this is all zeros for Q6_K. */
#define TINY_GROUP 1e-15f

/* ---- Q8_0 ---------------------------------------------------------------------------------------------------- */
/* d = max |x| / 127; q = x / d rounded half away from zero. */
void eng_weights_q8_0(const float *x, void *dst, int64_t nb) {
    eng_blk_q8_0 *b = dst;
    for (int64_t i = 0; i < nb; i++, x += ENG_QK) {
        float amax = 0.f;
        for (int j = 0; j < ENG_QK; j++) {
            float a = fabsf(x[j]);
            amax = amax > a ? amax : a;
        }
        float d = amax / 127.f;
        float id = d != 0.f ? 1.f / d : 0.f;
        b[i].d = eng_f32_to_fp16(d);
        for (int j = 0; j < ENG_QK; j++) b[i].qs[j] = (int8_t)eng_trunc_i8(roundf(x[j] * id));
    }
}

/* ---- Q4_K / Q5_K: a scale and a min per 32 values ---------------------------------------------------------- */
typedef struct fit_params {
    int nmax;     /* codes 0..nmax */
    float rmin;   /* the search tries nmax + rmin + rdelta * s levels over the range, s = 0..steps */
    float rdelta;
    int steps;
} fit_params;

/* Fits x[i] ~ scale * L[i] - mn over 32 values with weights w, L in [0, p->nmax], mn >= 0: starts from the
 * min..max grid (the min clipped to 0 when all values are positive), then tries the grids of p->steps + 1
 * other level counts, solves the weighted least-squares scale and offset for the codes each gives, and keeps
 * the one with the smallest weighted squared error. Writes the codes to L and the min to *mn; returns scale. */
static float fit_scale_min(const float *x, const float *w, const fit_params *p, uint8_t *L, float *mn) {
    enum { N = 32 };
    float lo = x[0], hi = x[0];
    float sw = w[0];
    float sx = sw * x[0];
    for (int i = 1; i < N; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sw += w[i];
        sx += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        memset(L, 0, N);
        *mn = -lo;
        return 0.f;
    }
    float inv = (float)p->nmax / (hi - lo);
    float scale = 1.f / inv;
    float best = 0.f;
    for (int i = 0; i < N; i++) {
        int l = round_even(inv * (x[i] - lo));
        L[i] = (uint8_t)imax(0, imin(p->nmax, l));
        float e = scale * (float)L[i] + lo - x[i];
        best += w[i] * (e * e);
    }
    uint8_t trial[N];
    for (int s = 0; s <= p->steps; s++) {
        inv = (p->rmin + p->rdelta * (float)s + (float)p->nmax) / (hi - lo);
        float sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < N; i++) {
            int l = imax(0, imin(p->nmax, round_even(inv * (x[i] - lo))));
            trial[i] = (uint8_t)l;
            float fl = (float)l;
            sl += w[i] * fl;
            sl2 += w[i] * fl * fl;
            sxl += w[i] * fl * x[i];
        }
        float det = sw * sl2 - sl * sl;
        if (!(det > 0)) continue;
        float t_scale = (sw * sxl - sx * sl) / det;
        float t_min = (sl2 * sx - sl * sxl) / det;
        if (t_min > 0) {
            t_min = 0;
            t_scale = sxl / sl2;
        }
        float err = 0;
        for (int i = 0; i < N; i++) {
            float e = t_scale * (float)trial[i] + t_min - x[i];
            err += w[i] * (e * e);
        }
        if (err < best) {
            memcpy(L, trial, N);
            best = err;
            scale = t_scale;
            lo = t_min;
        }
    }
    *mn = -lo;
    return scale;
}

/* The fits of the 8 sub-blocks of one 256-value super-block, the 6-bit scales and mins packed into the 12
 * bytes of Q4_K / Q5_K, and the final codes recomputed against the stored (quantized) scales. */
static void fit_super_block(const float *x, const fit_params *p, uint8_t packed[12], uint16_t *d_out,
                            uint16_t *dmin_out, uint8_t L[ENG_QKK]) {
    float scales[8], mins[8], w[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float s2 = 0;
        for (int l = 0; l < 32; l++) s2 += xs[l] * xs[l];
        float rms = sqrtf(s2 / 32.f);
        for (int l = 0; l < 32; l++) w[l] = rms + fabsf(xs[l]);
        scales[j] = fit_scale_min(xs, w, p, L + 32 * j, &mins[j]);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; j++) {
        /* the reference stores the rounded value in a byte before clamping: a negative scale wraps */
        uint8_t ls = (uint8_t)round_even(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)round_even(inv_min * mins[j]);
        if (ls > 63) ls = 63;
        if (lm > 63) lm = 63;
        if (j < 4) {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            packed[j - 4] |= (uint8_t)((ls >> 4) << 6);
            packed[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = eng_f32_to_fp16(max_scale / 63.f);
    *dmin_out = eng_f32_to_fp16(max_min / 63.f);
    float d = h2f(*d_out), dmin = h2f(*dmin_out);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        eng_k4_scale_min(j, packed, &sc, &m);
        float ds = d * (float)sc;
        if (ds == 0.f) continue; /* keeps the fit's codes */
        float dm = dmin * (float)m;
        for (int l = 0; l < 32; l++) {
            int q = round_even((x[32 * j + l] + dm) / ds);
            L[32 * j + l] = (uint8_t)imax(0, imin(p->nmax, q));
        }
    }
}

void eng_weights_q4_K(const float *x, void *dst, int64_t nb) {
    eng_blk_q4_K *b = dst;
    static const fit_params p = {15, -1.f, 0.1f, 20};
    uint8_t L[ENG_QKK];
    for (int64_t i = 0; i < nb; i++, x += ENG_QKK) {
        fit_super_block(x, &p, b[i].scales, &b[i].d, &b[i].dmin, L);
        /* 64 values per 32 bytes: the first 32 in the low nibbles, the next 32 in the high ones */
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++)
                b[i].qs[32 * g + l] = (uint8_t)(L[64 * g + l] | (L[64 * g + 32 + l] << 4));
    }
}

void eng_weights_q5_K(const float *x, void *dst, int64_t nb) {
    eng_blk_q5_K *b = dst;
    static const fit_params p = {31, -0.5f, 0.1f, 15};
    uint8_t L[ENG_QKK];
    for (int64_t i = 0; i < nb; i++, x += ENG_QKK) {
        fit_super_block(x, &p, b[i].scales, &b[i].d, &b[i].dmin, L);
        /* low 4 bits as in Q4_K; bit 4 of value 64g + l goes to qh[l] bit 2g, of 64g + 32 + l to bit 2g + 1 */
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                int lo = L[64 * g + l], hi = L[64 * g + 32 + l];
                if (lo > 15) b[i].qh[l] |= (uint8_t)(1u << (2 * g));
                if (hi > 15) b[i].qh[l] |= (uint8_t)(2u << (2 * g));
                b[i].qs[32 * g + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
            }
    }
}

/* ---- Q6_K: a signed scale per 16 values ----------------------------------------------------------------------- */
/* Fits x[i] ~ scale * (L[i] - 32), L in [0, 63], weighting each value by x[i]^2: starts from the grid that maps
 * the largest magnitude to -32, then tries 18 grids of 32 -+ 0.1 s levels (s = 1..9) and keeps the one with
 * the best weighted fit (largest sum(w x l)^2 / sum(w l^2)). Returns the least-squares scale. */
static float fit_scale_sym(const float *x, int8_t *L) {
    enum { N = 16, NMAX = 32 };
    float amax;
    float vmax = eng_absmax_signed(x, N, &amax);
    if (amax < TINY_GROUP) {
        memset(L, 0, N);
        return 0.f;
    }
    float inv = (float)-NMAX / vmax;
    float sxl = 0, sl2 = 0;
    for (int i = 0; i < N; i++) {
        int l = imax(-NMAX, imin(NMAX - 1, round_even(inv * x[i])));
        L[i] = (int8_t)(l + NMAX);
        float w = x[i] * x[i];
        float fl = (float)l;
        sxl += w * x[i] * fl;
        sl2 += w * fl * fl;
    }
    float scale = sl2 != 0.f ? sxl / sl2 : 0.f;
    float best = scale * sxl;
    for (int s = -9; s <= 9; s++) {
        if (s == 0) continue;
        inv = -((float)NMAX + 0.1f * (float)s) / vmax;
        sxl = sl2 = 0;
        for (int i = 0; i < N; i++) {
            float fl = (float)imax(-NMAX, imin(NMAX - 1, round_even(inv * x[i])));
            float w = x[i] * x[i];
            sxl += w * x[i] * fl;
            sl2 += w * fl * fl;
        }
        if (sl2 > 0 && sxl * sxl > best * sl2) {
            for (int i = 0; i < N; i++)
                L[i] = (int8_t)(NMAX + imax(-NMAX, imin(NMAX - 1, round_even(inv * x[i]))));
            scale = sxl / sl2;
            best = scale * sxl;
        }
    }
    return scale;
}

void eng_weights_q6_K(const float *x, void *dst, int64_t nb) {
    eng_blk_q6_K *b = dst;
    int8_t L[ENG_QKK];
    float scales[16];
    for (int64_t i = 0; i < nb; i++, x += ENG_QKK) {
        float max_abs = 0, max_scale = 0;
        for (int s = 0; s < 16; s++) {
            scales[s] = fit_scale_sym(x + 16 * s, L + 16 * s);
            float a = fabsf(scales[s]);
            if (a > max_abs) {
                max_abs = a;
                max_scale = scales[s];
            }
        }
        if (max_abs < TINY_GROUP) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        float inv = -128.f / max_scale;
        b[i].d = eng_f32_to_fp16(1.f / inv);
        for (int s = 0; s < 16; s++) b[i].scales[s] = (int8_t)imin(127, round_even(inv * scales[s]));
        float d = h2f(b[i].d);
        for (int s = 0; s < 16; s++) {
            float ds = d * (float)b[i].scales[s];
            if (ds == 0.f) continue; /* keeps the fit's codes */
            for (int l = 0; l < 16; l++) {
                int q = imax(-32, imin(31, round_even(x[16 * s + l] / ds)));
                L[16 * s + l] = (int8_t)(q + 32);
            }
        }
        /* per 128 values: ql[l] holds values l (low nibble) and l + 64 (high), ql[l + 32] values l + 32 and
         * l + 96; qh[l] the top 2 bits of values l, l + 32, l + 64, l + 96 */
        for (int h = 0; h < 2; h++) {
            const int8_t *q = L + 128 * h;
            uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                int q1 = q[l], q2 = q[l + 32], q3 = q[l + 64], q4 = q[l + 96];
                ql[l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
                ql[l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
                qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
        }
    }
}

/* ---- entry points -------------------------------------------------------------------------------------------- */
bool eng_quantize_weights_supported(uint32_t type) {
    const eng_qtraits *t = eng_qtraits_get(type);
    return t && t->quantize_weights;
}

int eng_quantize_weights(uint32_t type, const float *src, void *dst, int64_t nrows, int64_t n_per_row) {
    if (!eng_quantize_weights_supported(type)) return ENG_ERR_UNSUPPORTED;
    const eng_qtraits *t = eng_qtraits_get(type);
    if (nrows < 0 || n_per_row <= 0 || n_per_row % t->info.block_elems != 0) return ENG_ERR_INVALID;
    if (nrows == 0) return ENG_OK;
    if (!src || !dst) return ENG_ERR_INVALID;
    if (nrows > INT64_MAX / n_per_row) return ENG_ERR_INVALID;
    /* Rows are whole blocks, so a matrix is one long row of blocks. F32/F16/BF16 and the 32-value formats
     * use the scalar quantizers of quant.c (their rules are the reference ones). */
    t->quantize_weights(src, dst, nrows * n_per_row / t->info.block_elems);
    return ENG_OK;
}

/* ---- finiteness check ----------------------------------------------------------------------------------------- */
/* Whether the field f of the block at blk holds a finite value. */
static bool field_finite(eng_qfield f, const uint8_t *blk) {
    uint16_t h;
    float v;
    switch ((eng_qfield_kind)f.kind) {
    case ENG_QF_F16: memcpy(&h, blk + f.off, 2); return (h & 0x7C00) != 0x7C00;
    case ENG_QF_BF16: memcpy(&h, blk + f.off, 2); return (h & 0x7F80) != 0x7F80;
    case ENG_QF_F32: memcpy(&v, blk + f.off, 4); return isfinite(v);
    case ENG_QF_E8M0: return blk[f.off] != 0xFF;
    case ENG_QF_NONE: break;
    }
    return true;
}

int eng_check_row_data(uint32_t type, const void *data, int64_t n, int64_t *bad_at) {
    const eng_qtraits *t = eng_qtraits_get(type);
    if (!t) return ENG_ERR_UNSUPPORTED;
    if (n < 0 || n % t->info.block_elems != 0 || (n > 0 && !data)) return ENG_ERR_INVALID;
    if (t->finite[0].kind == ENG_QF_NONE) return ENG_ERR_UNSUPPORTED;
    const uint8_t *p = data;
    int64_t bad = -1, nb = n / t->info.block_elems;
    for (int64_t i = 0; i < nb && bad < 0; i++) {
        const uint8_t *blk = p + (size_t)i * (size_t)t->info.block_bytes;
        if (!field_finite(t->finite[0], blk) || !field_finite(t->finite[1], blk)) bad = i * t->info.block_elems;
    }
    if (bad >= 0) {
        if (bad_at) *bad_at = bad;
        return ENG_ERR_FORMAT;
    }
    return ENG_OK;
}
