// helper_cuda_host.h: the CUDA intrinsics the kernels' host-compiled code uses, as plain C++ for the host tests
// (test_cuda_*_host.cpp): rounded float operations (volatile keeps each rounding, as the device's _rn forms do),
// bit casts, f16 through the CPU engine's conversions, dp4a. Include after engine/kernels/quant.h.
#ifndef KVSERVE_HELPER_CUDA_HOST_H
#define KVSERVE_HELPER_CUDA_HOST_H

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline int __float2int_rn(float v) { return (int)std::nearbyint(v); }
inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
struct host_half { uint16_t bits; };
inline host_half __ushort_as_half(uint16_t h) { return host_half{h}; }
inline host_half __float2half_rn(float f) { return host_half{eng_f32_to_fp16(f)}; }
inline float __half2float(host_half h) { return eng_fp16_to_f32(h.bits); }
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
} // namespace

#endif
