/* batch.c: see batch.h. */
#include <stdlib.h>

#include "engine/runtime/batch.h"

int eng_batch_map(const eng_batch *b, int32_t max_batch, int32_t n_vocab, kvc_entry *entries, int32_t *logit_idx,
                  int32_t *out_rows, int32_t *n_out, float **logits, int32_t *logits_cap) {
    if (b->n < 1 || b->n > max_batch || !b->token || !b->pos || !b->seq) return ENG_ERR_INVALID;
    int32_t n = 0;
    for (int32_t i = 0; i < b->n; i++) {
        if (b->token[i] < 0 || b->token[i] >= n_vocab) return ENG_ERR_INVALID;
        if (b->pos[i] < 0) return ENG_ERR_INVALID;
        entries[i] = (kvc_entry){.seq = b->seq[i], .pos = b->pos[i], .token = b->token[i]};
        if (b->want_logits && b->want_logits[i]) {
            logit_idx[i] = n;
            out_rows[n++] = i;
        } else {
            logit_idx[i] = -1;
        }
    }
    if (n > *logits_cap) {
        /* Grows once to the largest number of logit rows seen (not per call). */
        float *nl = realloc(*logits, (size_t)n * (size_t)n_vocab * sizeof(float));
        if (!nl) return ENG_ERR_NOMEM;
        *logits = nl;
        *logits_cap = n;
    }
    *n_out = n;
    return ENG_OK;
}
