// cud_bits.cuh: a float's bits and back, for the code that compiles for the device and for the host (internal to
// the cuda module), through memcpy on both.
#ifndef KVSERVE_CUD_BITS_CUH
#define KVSERVE_CUD_BITS_CUH

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define CUD_BITS_FN __host__ __device__ __forceinline__
#else
#define CUD_BITS_FN inline
#endif

/* memcpy, not a pointer cast: defined behaviour on the host, and nvcc compiles it to a register move on the device
 * (as it does __float_as_uint) */
CUD_BITS_FN uint32_t cud_f2u(float f) { uint32_t u; memcpy(&u, &f, sizeof u); return u; }
CUD_BITS_FN float cud_u2f(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }

#endif
