/*
 * batch.h: batch checks shared by the CPU and CUDA forward paths (internal to the engine module).
 */
#ifndef KVSERVE_ENGINE_BATCH_H
#define KVSERVE_ENGINE_BATCH_H

#include <stdint.h>

#include "cache/kv_cache.h"
#include "engine/engine.h"

/* Validates b (1 <= n <= max_batch, arrays present, tokens in [0, n_vocab), positions >= 0), writes the
 * cache entries of its rows to entries[n], maps each row to its logits row in logit_idx[n] (-1 when the row
 * wants none) and the logits rows back to batch rows in out_rows[*n_out] (ascending), and grows *logits
 * ([*logits_cap][n_vocab], caller-owned) to hold *n_out rows. The arrays hold max_batch elements.
 * Errors: ENG_ERR_INVALID (nothing else changed then), ENG_ERR_NOMEM. */
int eng_batch_map(const eng_batch *b, int32_t max_batch, int32_t n_vocab, kvc_entry *entries, int32_t *logit_idx,
                  int32_t *out_rows, int32_t *n_out, float **logits, int32_t *logits_cap);

#endif /* KVSERVE_ENGINE_BATCH_H */
