/* kv_pool.c: the KV cache of an engine context (see kv_pool.h). */
#include "engine/runtime/kv_pool.h"

#include "common/common.h"

int eng_kv_err(int rc) {
    switch (rc) {
    case KVC_OK: return ENG_OK;
    case KVC_ERR_FULL: return ENG_ERR_KV_FULL;
    case KVC_ERR_NOMEM: return ENG_ERR_NOMEM;
    case KVC_ERR_INVALID: return ENG_ERR_INVALID;
    default: return ENG_ERR_KV;
    }
}

int eng_kv_pool_create(const eng_hparams *hp, const eng_ctx_params *p, int32_t swa_layers,
                       const kvc_allocator *alloc, size_t budget, kvc_cache **out, char *err, size_t err_len) {
    size_t row_bytes = kvc_row_bytes(p->kv_dtype, hp->head_dim);
    if (row_bytes == 0)
        return kvs_errf(err, err_len, ENG_ERR_INVALID, "eng_ctx_create: the KV dtype does not fit the head size");
    int64_t per_seq = (p->n_ctx + p->kv_block_size - 1) / p->kv_block_size;
    kvs_kv_plan_req q = {
        .block_bytes = (size_t)(hp->n_layer - swa_layers) * 2 * (size_t)hp->n_head_kv * (size_t)p->kv_block_size *
                       row_bytes,
        .blocks_per_seq = per_seq,
        .kv_blocks = p->kv_blocks,
        .kv_mem_bytes = p->kv_mem_bytes,
        .default_seqs = alloc ? 4 * (int64_t)p->max_seqs : (int64_t)p->max_seqs,
        .default_cap = alloc ? budget : (size_t)1 << 30,
        .device = alloc != NULL,
        .budget = budget,
        .budget_fraction = p->gpu_memory_fraction,
    };
    int32_t n_blocks = 0;
    char msg[256];
    int rc = kvs_kv_plan(&q, &n_blocks, msg, sizeof msg);
    if (rc != 0) return kvs_errf(err, err_len, rc, "eng_ctx_create: %s", msg);
    /* every field set; mem_bytes and swa_blocks (the group's default size) stay 0. A model whose layers all slide
     * keeps only the window's blocks of each sequence; one that mixes them keeps every position of its global
     * layers and only the window of the sliding ones (the sliding group), unless swa_layers is 0 (swa_full, or
     * device memory), when every layer keeps every position. */
    kvc_params kp = {.n_layer = hp->n_layer - swa_layers, .swa_layers = swa_layers, .n_kv_head = hp->n_head_kv,
                     .head_dim = hp->head_dim, .block_size = p->kv_block_size, .n_blocks = n_blocks,
                     .max_seqs = p->max_seqs, .max_batch_tokens = p->max_batch_tokens, .max_seq_len = p->n_ctx,
                     .dtype = p->kv_dtype, .prefix_caching = p->prefix_caching, .allocator = alloc,
                     .sliding_window = hp->swa_all || swa_layers > 0 ? hp->n_swa : 0};
    rc = kvc_create(&kp, out);
    if (rc == 0) return ENG_OK;
    int code = rc == KVC_ERR_NOMEM ? ENG_ERR_NOMEM : ENG_ERR_INVALID;
    if (alloc)
        return kvs_errf(err, err_len, code, "eng_ctx_create: KV cache of %lld blocks in device memory: %s",
                        (long long)n_blocks, kvs_strerror(rc));
    return kvs_errf(err, err_len, code, "eng_ctx_create: KV cache: %s", kvs_strerror(rc));
}
