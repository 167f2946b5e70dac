/* cud_sample_stub.c: GPU sampling in a build without CUDA (no device), and the RNG seeding every build has. */
#include <stdio.h>

#include "common/common.h"
#include "cuda/cud_sample.h"

void cud_sample_rng_seed(uint64_t seed, uint64_t rng[4]) {
    uint64_t x = seed; /* splitmix64, as eng_sampler_create (and smp_rng_seed in cud_sample.cuh) */
    for (int i = 0; i < 4; i++) {
        uint64_t z = (x += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        rng[i] = z ^ (z >> 31);
    }
}

#ifndef KVSERVE_HAVE_CUDA
int cud_sampler_create(cud_sampler **out) {
    if (out) *out = NULL;
    return KVS_ERR_UNSUPPORTED;
}
void cud_sampler_free(cud_sampler *s) { (void)s; }
int cud_sample_rows(cud_sampler *s, const float *d_logits, int64_t ld, int32_t n_rows, int32_t n_vocab,
                    const cud_sample_row *rows, cud_sample_out *out, void *stream) {
    (void)s; (void)d_logits; (void)ld; (void)n_rows; (void)n_vocab; (void)rows; (void)out; (void)stream;
    return KVS_ERR_UNSUPPORTED;
}
int cud_sample_selftest(char *msg, size_t msg_len) {
    if (msg && msg_len) snprintf(msg, msg_len, "built without CUDA");
    return KVS_ERR_UNSUPPORTED;
}
#endif
