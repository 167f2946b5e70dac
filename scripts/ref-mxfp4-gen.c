/*
 * ref-mxfp4-gen.c: MXFP4 blocks through ggml's own code, for scripts/ref-mxfp4.py (not part of the kvserve
 * build; the script compiles it against a llama.cpp tree and links libggml-base).
 *
 * usage: ref-mxfp4-gen N_BLOCKS > out.bin
 * The inputs come from a generator that tests/unit/test_quant_mxfp4.c repeats (xorshift64, seed 0x9E3779B97F4A7C15,
 * one 64-bit draw per byte or per float):
 *   - N_BLOCKS random blocks: byte 0 (the exponent) = draw % 255 (never 0xFF, the NaN code), 16 code bytes = draw
 *     & 0xFF each;
 *   - 32 * N_BLOCKS floats in blocks of 32: block b has the exponent draw % 61 - 30, then per value a draw d:
 *     kind b % 4 == 0: ((d >> 40) / 2^24 * 2 - 1) * 2^exp (uniform); == 1: the same with one value in four 0;
 *     == 2: an e2m1 midpoint ((d % 16) * 0.25 + 0.125, sign from bit 20) * 2^exp, ties between levels included;
 *     == 3 with b % 16 == 3: all zeros.
 * Output (little-endian): the dequantized floats of the random blocks (ggml's to_float), then the 17-byte blocks of
 * the floats quantized with ggml's reference quantizer (from_float_ref).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"

static uint64_t next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float gen_value(uint64_t *s, int64_t b, int exp) {
    uint64_t d = next(s);
    float sc = ldexpf(1.f, exp);
    switch (b % 4) {
    case 0: return ((float)(d >> 40) / 16777216.f * 2.f - 1.f) * sc;
    case 1: return (d & 3) == 0 ? 0.f : ((float)(d >> 40) / 16777216.f * 2.f - 1.f) * sc;
    case 2: return ((float)(d % 16) * 0.25f + 0.125f) * ((d >> 20) & 1 ? -sc : sc);
    default: return b % 16 == 3 ? 0.f : ((float)(d >> 40) / 16777216.f * 2.f - 1.f) * sc;
    }
}

int main(int argc, char **argv) {
    if (argc != 2 || atol(argv[1]) <= 0) {
        fprintf(stderr, "usage: %s N_BLOCKS > out.bin\n", argv[0]);
        return 2;
    }
    int64_t nb = atol(argv[1]);
    const struct ggml_type_traits *t = ggml_get_type_traits(GGML_TYPE_MXFP4);
    if (t->blck_size != 32 || t->type_size != 17) return 1;
    uint8_t *blk = malloc((size_t)nb * 17);
    float *f = malloc((size_t)nb * 32 * sizeof(float));
    if (!blk || !f) return 1;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < nb * 17; i++) {
        uint64_t d = next(&s);
        blk[i] = (uint8_t)(i % 17 == 0 ? d % 255 : d & 0xFF);
    }
    t->to_float(blk, f, nb * 32);
    fwrite(f, sizeof(float), (size_t)nb * 32, stdout);
    for (int64_t b = 0; b < nb; b++) {
        int exp = (int)(next(&s) % 61) - 30;
        for (int j = 0; j < 32; j++) f[b * 32 + j] = gen_value(&s, b, exp);
    }
    t->from_float_ref(f, blk, nb * 32);
    fwrite(blk, 17, (size_t)nb, stdout);
    free(blk);
    free(f);
    return 0;
}
