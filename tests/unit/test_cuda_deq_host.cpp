/* test_cuda_deq_host.cpp: the CUDA kernels' dequantization (cuda/cud_deq.cuh) compiled for the host and
 * compared bit for bit with the CPU engine's eng_dequantize_row, for every type the kernels support, on
 * random blocks (finite f16 scales). Runs on every machine; a GPU run (test_cuda_engine) checks the same on
 * the device. The intrinsics get host versions with the same IEEE single-precision rounding. */
#include <criterion/criterion.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "engine/engine.h"
#include "engine/kernels/quant.h"
}

#include "tests/unit/helper_cuda_host.h"

#define CUD_DEQ_FN inline
#include "cuda/cud_deq.cuh"

using namespace cud_deq;

/* Byte offsets of the f16 scale fields of one block (kept finite so that NaN payloads do not matter). */
static std::vector<int> scale_offsets(uint32_t t) {
    switch (t) {
    case CUD_F16: return {0};
    case CUD_Q8_0: case CUD_Q4_0: case CUD_Q5_0: return {0};
    case CUD_Q4_1: case CUD_Q5_1: case CUD_Q4_K: case CUD_Q5_K: return {0, 2};
    case CUD_Q6_K: return {208};
    case CUD_Q2_K: return {80, 82};
    case CUD_Q3_K: return {108};
    default: return {};
    }
}

/* Byte offsets of e8m0 exponents (kept below 0xFF, the NaN code the loader refuses). */
static std::vector<int> e8m0_offsets(uint32_t t) { return t == CUD_MXFP4 ? std::vector<int>{0} : std::vector<int>{}; }

template <uint32_t T> static void check(const char *name) {
    const unsigned seed = 1234u + T;
    std::mt19937 rng(seed);
    const int blocks_per_row = 4, rows = 16, k = blk<T>::E * blocks_per_row;
    const size_t rb = (size_t)blocks_per_row * blk<T>::B;
    cr_assert_eq(eng_qtype_row_bytes(T, k), rb, "%s: block size differs from the CPU engine's", name);
    std::vector<uint8_t> buf(rb * rows);
    std::vector<float> cpu((size_t)rows * k), dev((size_t)rows * k);
    for (int trial = 0; trial < 50; trial++) {
        for (auto &b : buf) b = (uint8_t)rng();
        for (size_t off = 0; off < buf.size(); off += blk<T>::B)
            for (int so : scale_offsets(T)) {
                buf[off + so] = (uint8_t)rng();
                buf[off + so + 1] = (uint8_t)(rng() % 0x78); /* exponent below 30: finite, sign + */
                if (rng() & 1) buf[off + so + 1] |= 0x80;
            }
        for (size_t off = 0; off < buf.size(); off += blk<T>::B)
            for (int eo : e8m0_offsets(T)) buf[off + eo] = (uint8_t)(rng() % 255);
        for (int r = 0; r < rows; r++) {
            cr_assert_eq(eng_dequantize_row(T, buf.data() + r * rb, cpu.data() + (size_t)r * k, k), ENG_OK);
            for (int i = 0; i < k; i++) dev[(size_t)r * k + i] = deq_at<T>(buf.data() + r * rb, i);
        }
        for (size_t i = 0; i < cpu.size(); i++)
            cr_assert(memcmp(&cpu[i], &dev[i], 4) == 0, "%s (seed %u, trial %d): element %zu: CPU %a, kernel %a",
                      name, seed, trial, i, (double)cpu[i], (double)dev[i]);
    }
}

Test(cuda_deq_host, f32) { check<CUD_F32>("f32"); }
Test(cuda_deq_host, f16) { check<CUD_F16>("f16"); }
Test(cuda_deq_host, bf16) { check<CUD_BF16>("bf16"); }
Test(cuda_deq_host, q4_0) { check<CUD_Q4_0>("q4_0"); }
Test(cuda_deq_host, q4_1) { check<CUD_Q4_1>("q4_1"); }
Test(cuda_deq_host, q5_0) { check<CUD_Q5_0>("q5_0"); }
Test(cuda_deq_host, q5_1) { check<CUD_Q5_1>("q5_1"); }
Test(cuda_deq_host, q8_0) { check<CUD_Q8_0>("q8_0"); }
Test(cuda_deq_host, q2_k) { check<CUD_Q2_K>("q2_K"); }
Test(cuda_deq_host, q3_k) { check<CUD_Q3_K>("q3_K"); }
Test(cuda_deq_host, q4_k) { check<CUD_Q4_K>("q4_K"); }
Test(cuda_deq_host, q5_k) { check<CUD_Q5_K>("q5_K"); }
Test(cuda_deq_host, q6_k) { check<CUD_Q6_K>("q6_K"); }
Test(cuda_deq_host, mxfp4) { check<CUD_MXFP4>("mxfp4"); }
