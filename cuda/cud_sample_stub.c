/* cud_sample_stub.c: GPU sampling in a build without CUDA (no device), and the RNG seeding every build has. */
#include <stdio.h>

#include "common/common.h"
#include "cuda/cud_sample.h"
#include "engine/kernels/rng.h"

void cud_sample_rng_seed(uint64_t seed, uint64_t rng[4]) { eng_rng_seed(rng, seed); }

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
