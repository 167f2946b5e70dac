/*
 * quant_tiles.h: the tile kernels of one SIMD level, for every tile size up to 4 x 4 (internal to quant).
 * A level's file includes this after defining TGT (its target attribute) and a static inline
 * tile(type, RM, RN, W, wb, X, xb, nb, y, ldy) that computes an RM x RN tile; this header instantiates the
 * 16 sizes for Q8_0, Q4_0, Q5_0 and MXFP4 weights as the tables t_q8_0_tab, t_q4_0_tab, t_q5_0_tab and t_mxfp4_tab
 * ([RM-1][RN-1]),
 * which the level's eng_qlevel entries point at. The edges of a gemm use the smaller tiles.
 */
#ifndef KVSERVE_ENGINE_QUANT_TILES_H
#define KVSERVE_ENGINE_QUANT_TILES_H

#define TILE_FN(T, NAME, RM, RN)                                                                            \
    static TGT void NAME##_##RM##_##RN(const uint8_t *W, size_t wb, const uint8_t *X, size_t xb, int64_t nb, \
                                       float *y, int64_t ldy) {                                             \
        tile(T, RM, RN, W, wb, X, xb, nb, y, ldy);                                                          \
    }
#define TILE_ROW(T, NAME, RM)                                                                               \
    TILE_FN(T, NAME, RM, 1) TILE_FN(T, NAME, RM, 2) TILE_FN(T, NAME, RM, 3) TILE_FN(T, NAME, RM, 4)
#define TAB_ROW(NAME, RM) {NAME##_##RM##_1, NAME##_##RM##_2, NAME##_##RM##_3, NAME##_##RM##_4}
#define TILE_SET(T, NAME)                                                                                   \
    TILE_ROW(T, NAME, 1) TILE_ROW(T, NAME, 2) TILE_ROW(T, NAME, 3) TILE_ROW(T, NAME, 4)                     \
    static const eng_tile_fn NAME##_tab[4][4] = {TAB_ROW(NAME, 1), TAB_ROW(NAME, 2), TAB_ROW(NAME, 3),          \
                                             TAB_ROW(NAME, 4)};

TILE_SET(ENG_Q_Q8_0, t_q8_0)
TILE_SET(ENG_Q_Q4_0, t_q4_0)
TILE_SET(ENG_Q_Q5_0, t_q5_0)
TILE_SET(ENG_Q_MXFP4, t_mxfp4)

#endif /* KVSERVE_ENGINE_QUANT_TILES_H */
