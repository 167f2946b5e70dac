/* api_budget.c: up-front checks that a request's whole demand fits what the server has (issue 30): n choices of
 * up to max_tokens each against the whole KV pool (see api_internal.h). */
#include "server/api_internal.h"

#include <stdint.h>

int api_check_kv_fit_choices(const srv_api *api, int32_t n_prompt, int32_t n, int32_t max_tokens,
                             srv_api_error *e) {
    if (api->kv_blocks <= 0 || api->kv_block_size <= 0 || n_prompt < 1 || n < 2 || max_tokens < 1) return 0;
    int64_t bs = api->kv_block_size;
    int64_t len = (int64_t)n_prompt + max_tokens; /* the longest context one choice reaches */
    if (api->n_ctx > 0 && len > api->n_ctx) len = api->n_ctx; /* a shifted context stays within n_ctx */
    /* every choice's sequence holds its whole context (+1 token, as admission counts); the others share the
     * prompt's full blocks with the first */
    int64_t first = (len + 1 + bs - 1) / bs, other = first - (int64_t)n_prompt / bs;
    int64_t need = first + (int64_t)(n - 1) * other;
    if (need <= api->kv_blocks) return 0;
    srv_api_set_error(e, 400, NULL, "n", "context_length_exceeded",
                      "n=%d choices of up to %lld tokens each (%d in the prompt, max_tokens %d) need %lld KV-cache "
                      "blocks of %d tokens, but the server's whole KV cache is %d blocks (%lld tokens), so the "
                      "choices would be cut short. Reduce n or max_tokens.", (int)n, (long long)len, (int)n_prompt,
                      (int)max_tokens, (long long)need, (int)bs, (int)api->kv_blocks,
                      (long long)api->kv_blocks * bs);
    return -1;
}
