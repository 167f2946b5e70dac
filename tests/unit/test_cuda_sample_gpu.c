/* test_cuda_sample_gpu.c: GPU sampling on a GPU (skips without one): k_sample through cud_sample_rows on random
 * rows against the host emulation of the same block (cud_sample_selftest, cuda/cud_sample.h); the emulation
 * itself equals eng_sampler_sample (test_cuda_sample_host). */
#include <criterion/criterion.h>

#include "common/common.h"
#include "cuda/cud_sample.h"
#include "cuda/cuda_engine.h"

Test(cuda_sample_gpu, k_sample_matches_the_host) {
    char name[128], msg[512];
    if (cud_available(name, sizeof name) < 1) cr_skip_test("no CUDA device");
    int rc = cud_sample_selftest(msg, sizeof msg);
    cr_assert_eq(rc, KVS_OK, "cud_sample_selftest on %s: %d: %s", name, rc, msg);
    cr_log_info("%s: %s", name, msg);
}

Test(cuda_sample_gpu, rng_seed_and_invalid_arguments) {
    uint64_t a[4], b[4];
    cud_sample_rng_seed(7, a);
    cud_sample_rng_seed(7, b);
    cr_assert(a[0] == b[0] && a[3] == b[3]);
    int rc = cud_sample_rows(NULL, NULL, 0, 1, 10, NULL, NULL, NULL); /* a build without CUDA: UNSUPPORTED */
    cr_assert(rc == KVS_ERR_INVALID || rc == KVS_ERR_UNSUPPORTED, "rc %d", rc);
}
