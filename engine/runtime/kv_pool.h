/*
 * kv_pool.h: the KV cache of an engine context, sized by one rule for the CPU and the CUDA contexts (internal to
 * the engine module; the rule itself is common's kvs_kv_plan). Also the one translation of kvc_* results into
 * the engine's codes.
 */
#ifndef KVSERVE_ENGINE_KV_POOL_H
#define KVSERVE_ENGINE_KV_POOL_H

#include <stddef.h>

#include "cache/kv_cache.h"
#include "engine/engine.h"

/* Creates the cache of a context with resolved parameters p (n_ctx, max_seqs, max_batch_tokens, kv_block_size
 * positive). swa_layers > 0 (host memory only): that many of the model's layers slide and keep their KV in the
 * cache's sliding group (bounded by hp->n_swa), the other n_layer - swa_layers in the pool sized here. alloc
 * NULL: host memory, default pool max_seqs full-length sequences capped at 1 GiB. alloc set:
 * device memory through alloc, at most `budget` bytes, default pool four times max_seqs full-length sequences
 * (room for cached prefixes) within the budget. Errors (err gets a message starting "eng_ctx_create: "):
 * ENG_ERR_INVALID (a KV dtype that does not fit head_dim, a host budget below one block, cache parameters),
 * ENG_ERR_NOMEM (memory; a device request above the budget). */
int eng_kv_pool_create(const eng_hparams *hp, const eng_ctx_params *p, int32_t swa_layers,
                       const kvc_allocator *alloc, size_t budget, kvc_cache **out, char *err, size_t err_len);

/* The engine code of a kvc_* result: 0, ENG_ERR_KV_FULL, ENG_ERR_NOMEM, ENG_ERR_INVALID, else ENG_ERR_KV. */
int eng_kv_err(int kvc_rc);

#endif
