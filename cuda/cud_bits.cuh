// cud_bits.cuh: a float's bits and back, for the code that compiles for the device and for the host (internal to
// the cuda module): the intrinsics on the device, memcpy on the host.
#ifndef KVSERVE_CUD_BITS_CUH
#define KVSERVE_CUD_BITS_CUH

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define CUD_BITS_FN __host__ __device__ __forceinline__
#else
#define CUD_BITS_FN inline
#endif

CUD_BITS_FN uint32_t cud_f2u(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

CUD_BITS_FN float cud_u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

#endif
