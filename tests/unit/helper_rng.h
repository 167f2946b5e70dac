/*
 * helper_rng.h: the xorshift64 generator the randomized engine tests share (test_forward, test_ops), so their
 * seeds mean the same streams. Header-only: static inline functions, no state outside the caller's rng.
 */
#ifndef KVSERVE_TESTS_HELPER_RNG_H
#define KVSERVE_TESTS_HELPER_RNG_H

#include <stdint.h>

typedef struct rng { uint64_t s; } rng; /* s must start non-zero */
static inline uint64_t rng_next(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s;
}
static inline float rng_uniform(rng *r, float a) { /* in [-a, a) */
    return (float)((double)(rng_next(r) >> 11) / 9007199254740992.0 * 2.0 - 1.0) * a;
}
static inline int rng_int(rng *r, int n) { return (int)(rng_next(r) % (uint64_t)n); } /* in [0, n) */

#endif /* KVSERVE_TESTS_HELPER_RNG_H */
