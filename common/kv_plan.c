/* kv_plan.c: kvs_kv_plan, the one rule that sizes a context's KV block pool (CPU and CUDA). */
#include <stdint.h>

#include "common/common.h"

int kvs_kv_plan(const kvs_kv_plan_req *q, int32_t *n_blocks, char *err, size_t err_len) {
    if (!q || !n_blocks || q->block_bytes == 0) return kvs_errf(err, err_len, KVS_ERR_INVALID, "invalid KV plan");
    int64_t n = q->kv_blocks;
    if (n > 0 && q->device && (double)n * (double)q->block_bytes > (double)q->budget)
        return kvs_errf(err, err_len, KVS_ERR_NOMEM,
                        "%lld KV blocks need %zu bytes of device memory but only %zu remain under "
                        "gpu_memory_fraction %.2f",
                        (long long)n, (size_t)n * q->block_bytes, q->budget, q->budget_fraction);
    if (n <= 0) {
        size_t mem;
        if (q->kv_mem_bytes > 0) {
            if (q->device && q->kv_mem_bytes > q->budget)
                return kvs_errf(err, err_len, KVS_ERR_NOMEM,
                                "kv_mem_bytes %zu exceeds the %zu bytes of device memory left under "
                                "gpu_memory_fraction %.2f",
                                q->kv_mem_bytes, q->budget, q->budget_fraction);
            mem = q->kv_mem_bytes;
        } else {
            mem = q->default_cap;
            double want = (double)q->default_seqs * (double)q->blocks_per_seq * (double)q->block_bytes;
            if (want < (double)mem) mem = (size_t)want;
        }
        n = (int64_t)(mem / q->block_bytes);
        if (n > INT32_MAX) n = INT32_MAX;
    }
    if (n < 1) {
        if (!q->device) return kvs_errf(err, err_len, KVS_ERR_INVALID, "the KV budget is below one block");
        return kvs_errf(err, err_len, KVS_ERR_NOMEM,
                        "no device memory left for the KV cache (%zu bytes under gpu_memory_fraction %.2f; one "
                        "block is %zu bytes)",
                        q->budget, q->budget_fraction, q->block_bytes);
    }
    *n_blocks = (int32_t)n;
    return KVS_OK;
}
