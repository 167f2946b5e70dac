/*
 * sampler_kernels.h: the vocabulary-wide loops of the sampler (internal to the engine; prefix eng_smp_).
 * A scalar version of each kernel and an AVX2 version selected at run time (cpuid); they compute the same
 * exponentials bit for bit (same operations, no FMA) and differ only in the order of the double sums.
 */
#ifndef KVSERVE_ENGINE_SAMPLER_KERNELS_H
#define KVSERVE_ENGINE_SAMPLER_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct eng_smp_kernels {
    /* Largest x[i] (NaN ignored); -INFINITY when n == 0 or every value is NaN or -inf. */
    float (*max)(const float *x, int32_t n);
    /* Lowest i with x[i] == v, or -1. */
    int32_t (*first_eq)(const float *x, int32_t n, float v);
    /* Sum over i of e_i = eng_smp_exp((x[i] - m) * scale), summed in double, where NaN x[i] count as -inf
     * (e_i = 0). Writes e_i to out[i] when out is not NULL (out may be x). Requires x[i] <= m or NaN. */
    double (*expsum)(const float *x, int32_t n, float m, float scale, float *out);
    const char *name;  /* "scalar" or "avx2" */
} eng_smp_kernels;

/* e^x for x <= 88 (Cephes-style range reduction and polynomial, relative error < 3.6e-7; exactly 1 at 0);
 * 0 for x < -87.3365 (results that would be denormal), -inf and NaN. */
float eng_smp_exp(float x);

void eng_smp_kernels_scalar(eng_smp_kernels *k);
/* Fills k with the AVX2 kernels and returns true when the CPU has AVX2; false (k untouched) otherwise. */
bool eng_smp_kernels_avx2(eng_smp_kernels *k);
/* The fastest kernels this CPU runs. */
void eng_smp_kernels_best(eng_smp_kernels *k);
/* The best kernels for a CPU level (kvs_cpu_level) the caller detected once. */
void eng_smp_kernels_for(eng_smp_kernels *k, int simd);

#endif /* KVSERVE_ENGINE_SAMPLER_KERNELS_H */
