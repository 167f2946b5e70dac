/*
 * rng.h: the sampler's random stream, xoshiro256** seeded through splitmix64 (internal to the engine and the cuda
 * module; prefix eng_rng_). Written once for the CPU sampler (engine/runtime/sampler.c) and the GPU one
 * (cuda/cud_sample.cuh): static inline functions that compile as C and, under nvcc, for the host and the device
 * (KVS_HD), so both draw the same numbers from the same seed bit for bit.
 */
#ifndef KVSERVE_ENGINE_RNG_H
#define KVSERVE_ENGINE_RNG_H

#include <stdint.h>

#ifdef __CUDACC__
#define KVS_HD __host__ __device__
#else
#define KVS_HD
#endif

static inline KVS_HD uint64_t eng_rng_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* s = the four splitmix64 outputs that follow seed. */
static inline KVS_HD void eng_rng_seed(uint64_t s[4], uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) {
        uint64_t z = (x += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        s[i] = z ^ (z >> 31);
    }
}

/* The next 64-bit output; advances s. */
static inline KVS_HD uint64_t eng_rng_next(uint64_t s[4]) {
    uint64_t result = eng_rng_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = eng_rng_rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits (on the device a rounded multiply nothing can contract). */
static inline KVS_HD double eng_rng_uniform(uint64_t s[4]) {
#ifdef __CUDA_ARCH__
    return __dmul_rn((double)(eng_rng_next(s) >> 11), 1.0 / 9007199254740992.0);
#else
    return (double)(eng_rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
#endif
}

#endif
