/* test_cuda_fattn_gpu.c: the tensor-core prefill attention on a GPU (skips without one): mma.sync m16n8k16 (f16
 * and bf16) against the host emulation the host tests rely on, and k_fattn on a synthetic paged pool against a
 * softmax in double (cud_fattn_selftest, cuda/cud_fattn.h). */
#include <criterion/criterion.h>

#include "common/common.h"
#include "cuda/cud_fattn.h"
#include "cuda/cuda_engine.h"

Test(cuda_fattn_gpu, mma_and_k_fattn_match_the_host) {
    char name[128], msg[512];
    if (cud_available(name, sizeof name) < 1) cr_skip_test("no CUDA device");
    int rc = cud_fattn_selftest(msg, sizeof msg);
    cr_assert_eq(rc, KVS_OK, "cud_fattn_selftest on %s: %d: %s", name, rc, msg);
    cr_log_info("%s: %s", name, msg);
}
