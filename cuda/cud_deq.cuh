// cud_deq.cuh: element-wise dequantization of the ggml block formats for the CUDA kernels (internal to the
// cuda module). deq<T>(block, e) is element e of one block of type T; deq_at<T>(row, i) element i of a row.
// Every operation is explicitly rounded (__fmul_rn, __fadd_rn, __fsub_rn) in the CPU engine's order
// (engine/kernels/quant.c), so the values are bit-identical to eng_dequantize_row.
//
// The code is plain enough to be compiled for the host as well: tests/unit/test_cuda_deq_host.cpp defines
// CUD_DEQ_FN and host versions of the intrinsics and checks every type against the CPU engine on a machine
// without a GPU.
#ifndef KVSERVE_CUD_DEQ_CUH
#define KVSERVE_CUD_DEQ_CUH

#include <cstdint>
#include <cstring>

#ifndef CUD_DEQ_FN
#define CUD_DEQ_FN __device__ __forceinline__
#endif

// ggml type ids (engine/kernels/quant.h).
enum : uint32_t {
    CUD_F32 = 0, CUD_F16 = 1, CUD_Q4_0 = 2, CUD_Q4_1 = 3, CUD_Q5_0 = 6, CUD_Q5_1 = 7, CUD_Q8_0 = 8,
    CUD_Q2_K = 10, CUD_Q3_K = 11, CUD_Q4_K = 12, CUD_Q5_K = 13, CUD_Q6_K = 14, CUD_BF16 = 30, CUD_MXFP4 = 39,
};

// Every type the kernels read, as X(id, elements per block, bytes per block). The one list serves blk<T> below
// and, in cud_kernels.cu, the runtime type dispatch and cud_type_block_elems / cud_type_block_bytes.
#define CUD_TYPES(X)                                                                                               \
    X(CUD_F32, 1, 4) X(CUD_F16, 1, 2) X(CUD_BF16, 1, 2) X(CUD_Q8_0, 32, 34) X(CUD_Q4_0, 32, 18)                    \
    X(CUD_Q4_1, 32, 20) X(CUD_Q5_0, 32, 22) X(CUD_Q5_1, 32, 24) X(CUD_Q2_K, 256, 84) X(CUD_Q3_K, 256, 110)          \
    X(CUD_Q4_K, 256, 144) X(CUD_Q5_K, 256, 176) X(CUD_Q6_K, 256, 210) X(CUD_MXFP4, 32, 17)

namespace cud_deq {

CUD_DEQ_FN float h2f(const uint8_t *p) {
    uint16_t h = (uint16_t)p[0] | ((uint16_t)p[1] << 8);
    return __half2float(__ushort_as_half(h));
}

CUD_DEQ_FN void scale_min_k4(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Element e of one block of type T. Rounded operations keep the CPU engine's order and rounding.
template <uint32_t T> CUD_DEQ_FN float deq(const uint8_t *b, int e);

template <> CUD_DEQ_FN float deq<CUD_F32>(const uint8_t *b, int) {
    float v;
    memcpy(&v, b, 4);
    return v;
}
template <> CUD_DEQ_FN float deq<CUD_F16>(const uint8_t *b, int) { return h2f(b); }
template <> CUD_DEQ_FN float deq<CUD_BF16>(const uint8_t *b, int) {
    uint32_t u = ((uint32_t)b[0] | ((uint32_t)b[1] << 8)) << 16;
    return __uint_as_float(u);
}
template <> CUD_DEQ_FN float deq<CUD_Q8_0>(const uint8_t *b, int e) {
    return __fmul_rn((float)(int8_t)b[2 + e], h2f(b));
}
template <> CUD_DEQ_FN float deq<CUD_Q4_0>(const uint8_t *b, int e) {
    int q = e < 16 ? (b[2 + e] & 0xF) : (b[2 + e - 16] >> 4);
    return __fmul_rn((float)(q - 8), h2f(b));
}
template <> CUD_DEQ_FN float deq<CUD_Q4_1>(const uint8_t *b, int e) {
    int q = e < 16 ? (b[4 + e] & 0xF) : (b[4 + e - 16] >> 4);
    return __fadd_rn(__fmul_rn((float)q, h2f(b)), h2f(b + 2));
}
template <> CUD_DEQ_FN float deq<CUD_Q5_0>(const uint8_t *b, int e) {
    uint32_t qh = (uint32_t)b[2] | ((uint32_t)b[3] << 8) | ((uint32_t)b[4] << 16) | ((uint32_t)b[5] << 24);
    const uint8_t *qs = b + 6;
    int x;
    if (e < 16) x = ((qs[e] & 0xF) | (((qh >> e) << 4) & 0x10)) - 16;
    else x = ((qs[e - 16] >> 4) | ((qh >> (e - 16 + 12)) & 0x10)) - 16;
    return __fmul_rn((float)x, h2f(b));
}
template <> CUD_DEQ_FN float deq<CUD_Q5_1>(const uint8_t *b, int e) {
    uint32_t qh = (uint32_t)b[4] | ((uint32_t)b[5] << 8) | ((uint32_t)b[6] << 16) | ((uint32_t)b[7] << 24);
    const uint8_t *qs = b + 8;
    int x;
    if (e < 16) x = (qs[e] & 0xF) | (((qh >> e) << 4) & 0x10);
    else x = (qs[e - 16] >> 4) | ((qh >> (e - 16 + 12)) & 0x10);
    return __fadd_rn(__fmul_rn((float)x, h2f(b)), h2f(b + 2));
}
// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin. Element e: half e/128; within it,
// 2-bit field r/32 (shift 2 * (r/32)) of byte qs[32 * half + r % 32], sub-block scale 8 * half + r / 16.
template <> CUD_DEQ_FN float deq<CUD_Q2_K>(const uint8_t *b, int e) {
    const uint8_t *scales = b, *qs = b + 16;
    const float d = h2f(b + 80), dmin = h2f(b + 82);
    int half = e / 128, r = e % 128, si = r / 32;
    uint8_t sc = scales[half * 8 + r / 16];
    int v = (qs[32 * half + r % 32] >> (2 * si)) & 3;
    return __fsub_rn(__fmul_rn(__fmul_rn(d, (float)(sc & 0xF)), (float)v), __fmul_rn(dmin, (float)(sc >> 4)));
}
// Q3_K: hmask[32], qs[64], scales[12] (16 packed 6-bit scales, offset 32), d. The high-mask bit of element e
// is bit (4 * half + r / 32) of hmask[r % 32]; a clear bit subtracts 4.
template <> CUD_DEQ_FN float deq<CUD_Q3_K>(const uint8_t *b, int e) {
    const uint8_t *hmask = b, *qs = b + 32, *packed = b + 96;
    const float d = h2f(b + 108);
    int half = e / 128, r = e % 128, si = r / 32, ll = r % 32, j = half * 8 + r / 16;
    int lo = j < 8 ? (packed[j] & 0xF) : (packed[j - 8] >> 4);
    int hi = (packed[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    int sc = (lo | (hi << 4)) - 32;
    int v = ((qs[32 * half + ll] >> (2 * si)) & 3) - ((hmask[ll] >> (4 * half + si)) & 1 ? 0 : 4);
    return __fmul_rn(__fmul_rn(d, (float)sc), (float)v);
}
template <> CUD_DEQ_FN float deq<CUD_Q4_K>(const uint8_t *b, int e) {
    const float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *scales = b + 4, *qs = b + 16;
    int c = e / 64, w = e % 64, l = w % 32, is = 2 * c + (w >= 32);
    int sc, m;
    scale_min_k4(is, scales, &sc, &m);
    uint8_t q = qs[32 * c + l];
    int nib = w < 32 ? (q & 0xF) : (q >> 4);
    return __fsub_rn(__fmul_rn(__fmul_rn(d, (float)sc), (float)nib), __fmul_rn(dmin, (float)m));
}
template <> CUD_DEQ_FN float deq<CUD_Q5_K>(const uint8_t *b, int e) {
    const float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + 48;
    int c = e / 64, w = e % 64, l = w % 32, hi = w >= 32, is = 2 * c + hi;
    int sc, m;
    scale_min_k4(is, scales, &sc, &m);
    uint8_t q = qs[32 * c + l];
    int v = (hi ? (q >> 4) : (q & 0xF)) + (((qh[l] >> (2 * c + hi)) & 1) ? 16 : 0);
    return __fsub_rn(__fmul_rn(__fmul_rn(d, (float)sc), (float)v), __fmul_rn(dmin, (float)m));
}
template <> CUD_DEQ_FN float deq<CUD_Q6_K>(const uint8_t *b, int e) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = h2f(b + 208);
    int n = e / 128, r = e % 128, quarter = r / 32, l = r % 32, is = l / 16;
    ql += 64 * n;
    qh += 32 * n;
    sc += 8 * n;
    int q;
    switch (quarter) {
    case 0: q = (ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4); break;
    case 1: q = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4); break;
    case 2: q = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4); break;
    default: q = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4); break;
    }
    return __fmul_rn(__fmul_rn(d, (float)sc[is + 2 * quarter]), (float)(q - 32));
}
// MXFP4: e (e8m0 exponent), qs[16] (element e < 16 in the low nibble of qs[e], e + 16 in the high one). The
// code's doubled e2m1 value times half the exponent's value, 2^(e - 128), built from its bits as the CPU does
// (e = 0 and 1 are the subnormals 2^-128 and 2^-127).
template <> CUD_DEQ_FN float deq<CUD_MXFP4>(const uint8_t *b, int e) {
    int c = e < 16 ? (b[1 + e] & 0xF) : (b[1 + e - 16] >> 4);
    int mag = (c & 7) < 4 ? (c & 7) : (c & 7) == 4 ? 4 : (c & 7) == 5 ? 6 : (c & 7) == 6 ? 8 : 12;
    uint32_t bits = b[0] < 2 ? (uint32_t)0x00200000u << b[0] : (uint32_t)(b[0] - 1) << 23;
    return __fmul_rn((float)(c & 8 ? -mag : mag), __uint_as_float(bits));
}

template <uint32_t T> struct blk;
#define CUD_BLK(T_, E_, B_) template <> struct blk<T_> { static constexpr int E = E_, B = B_; };
CUD_TYPES(CUD_BLK)
#undef CUD_BLK

template <uint32_t T> CUD_DEQ_FN float deq_at(const uint8_t *row, int64_t i) {
    return deq<T>(row + (i / blk<T>::E) * blk<T>::B, (int)(i % blk<T>::E));
}

} // namespace cud_deq

#endif
