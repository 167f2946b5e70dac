/* helper_kvc.h: deterministic K/V row contents for the kv_cache tests (helper_kvc_rows.c). */
#ifndef KVSERVE_TEST_HELPER_KVC_H
#define KVSERVE_TEST_HELPER_KVC_H

#include <stdint.h>
#include "cache/kv_cache.h"

/* IEEE half bits of an integer v with |v| <= 2048 (exactly representable). */
uint16_t kvct_half_from_int(int v);

/* Writes the row (kvc_row_bytes(dtype, head_dim) bytes) that token `token` at value-position vpos holds in
 * (layer, kv, head). A pure function of its arguments, independent of the sequence, so identical prefixes
 * hold identical data. F32 values are integers below 2^24, F16 values integers in [-1024, 1024] (both
 * exact); Q8_0 blocks get an exact f16 scale and arbitrary int8 quants. */
void kvct_gen_row(kvc_dtype dtype, int32_t head_dim, int32_t token, int32_t vpos, int32_t layer, int kv,
                  int32_t head, uint8_t *out);

/* Writes all rows (every layer, K and V, every head) of one slot. */
void kvct_write_slot(const kvc_layout *l, int32_t slot, int32_t token, int32_t vpos);

/* Returns 0 when every row of the slot equals kvct_gen_row(token, vpos); else 1 + the first bad row index. */
int kvct_check_slot(const kvc_layout *l, int32_t slot, int32_t token, int32_t vpos);

/* Parameters of a small F32 cache: 2 layers, 2 KV heads, head_dim 4, prefix caching on. */
kvc_params kvct_params(int32_t n_blocks, int32_t block_size, int32_t max_seqs, int32_t max_batch);

/* A cache with kvct_params, for the prefix-cache tests; NULL when kvc_create fails. */
kvc_cache *kvct_make(int32_t n_blocks, int32_t block_size, int32_t max_seqs, int32_t max_batch);

/* Appends tokens[len..len+n) of seq (tokens holds its whole content) in one forward, writing every slot with
 * kvct_write_slot, and commits it. Returns kvc_start_forward's code, else kvc_finish_forward's; KVC_ERR_NOMEM
 * when the scratch arrays cannot be allocated. */
int kvct_append(kvc_cache *c, int32_t seq, const int32_t *tokens, int32_t n);

/* splitmix64 step: a small deterministic RNG for the tests. */
static inline uint64_t kvct_rand(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static inline int32_t kvct_range(uint64_t *s, int32_t n) { return n <= 0 ? 0 : (int32_t)(kvct_rand(s) % (uint64_t)n); }

#endif
