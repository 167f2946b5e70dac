/*
 * quant_kpacked_avx2.c: AVX2 kernels for the packed Q4_K and Q6_K layouts (quant_kpacked.c).
 */
#include "engine/quant_kpacked_impl.h"

bool eng_kp_gemm_avx2(uint32_t type, const uint8_t *P, int64_t k, const uint8_t *xq, int64_t m, float *y,
                      int64_t ldy, int64_t jb, int64_t je) {
    (void)type, (void)P, (void)k, (void)xq, (void)m, (void)y, (void)ldy, (void)jb, (void)je;
    return false;
}
