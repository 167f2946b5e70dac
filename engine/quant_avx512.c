#include "engine/quant_impl.h"
bool eng_vec_dot_avx512(uint32_t wtype, int64_t n, const void *w_row, const void *x_row, float *out) {
    (void)wtype; (void)n; (void)w_row; (void)x_row; (void)out; return false;
}
bool eng_gemm_avx512(uint32_t wtype, const void *W, int64_t k, const void *xq, int64_t m, float *y, int64_t ldy,
                   int64_t j_begin, int64_t j_end) {
    (void)wtype; (void)W; (void)k; (void)xq; (void)m; (void)y; (void)ldy; (void)j_begin; (void)j_end; return false;
}
