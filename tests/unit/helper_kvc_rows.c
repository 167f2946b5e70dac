/* helper_kvc_rows.c: deterministic K/V rows for the kv_cache tests (see helper_kvc.h). */
#include "helper_kvc.h"

#include <stdlib.h>
#include <string.h>

uint16_t kvct_half_from_int(int v) {
    if (v == 0) return 0;
    uint16_t sign = v < 0 ? 0x8000 : 0;
    unsigned a = (unsigned)(v < 0 ? -v : v);
    int e = 31 - __builtin_clz(a); /* a in [2^e, 2^(e+1)), e <= 11 */
    unsigned mant = e <= 10 ? (a << (10 - e)) & 0x3FF : (a >> (e - 10)) & 0x3FF;
    return (uint16_t)(sign | (unsigned)(e + 15) << 10 | mant);
}

void kvct_gen_row(kvc_dtype dtype, int32_t head_dim, int32_t token, int32_t vpos, int32_t layer, int kv,
                  int32_t head, uint8_t *out) {
    uint64_t x = (uint64_t)(uint32_t)token * 0x100000001b3ULL ^ (uint64_t)(uint32_t)vpos << 20 ^
                 (uint64_t)layer << 52 ^ (uint64_t)kv << 58 ^ (uint64_t)head << 60;
    uint64_t s = x;
    switch (dtype) {
    case KVC_DTYPE_F32:
        for (int32_t i = 0; i < head_dim; i++) {
            float f = (float)((int32_t)(kvct_rand(&s) >> 40) - (1 << 23));
            memcpy(out + 4 * (size_t)i, &f, 4);
        }
        break;
    case KVC_DTYPE_F16:
        for (int32_t i = 0; i < head_dim; i++) {
            uint16_t h = kvct_half_from_int((int)(kvct_rand(&s) % 2049) - 1024);
            memcpy(out + 2 * (size_t)i, &h, 2);
        }
        break;
    case KVC_DTYPE_Q8_0:
        for (int32_t b = 0; b < head_dim / 32; b++) {
            uint8_t *blk = out + 34 * (size_t)b;
            uint16_t d = kvct_half_from_int(1 + (int)(kvct_rand(&s) % 64));
            memcpy(blk, &d, 2);
            for (int i = 0; i < 32; i++) blk[2 + i] = (uint8_t)(kvct_rand(&s) >> 56);
        }
        break;
    }
}

void kvct_write_slot(const kvc_layout *l, int32_t slot, int32_t token, int32_t vpos) {
    for (int32_t layer = 0; layer < l->n_layer; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int32_t h = 0; h < l->n_kv_head; h++)
                kvct_gen_row(l->dtype, l->head_dim, token, vpos, layer, kv, h,
                             kvc_row_ptr(l, layer, kv, slot, h));
}

int kvct_check_slot(const kvc_layout *l, int32_t slot, int32_t token, int32_t vpos) {
    uint8_t buf[4096];
    if (l->row_bytes > sizeof buf) return 1;
    int idx = 0;
    for (int32_t layer = 0; layer < l->n_layer; layer++)
        for (int kv = 0; kv < 2; kv++)
            for (int32_t h = 0; h < l->n_kv_head; h++, idx++) {
                kvct_gen_row(l->dtype, l->head_dim, token, vpos, layer, kv, h, buf);
                if (memcmp(buf, kvc_row_ptr(l, layer, kv, slot, h), l->row_bytes) != 0) return 1 + idx;
            }
    return 0;
}

kvc_params kvct_params(int32_t n_blocks, int32_t block_size, int32_t max_seqs, int32_t max_batch) {
    kvc_params p;
    kvc_params_default(&p);
    p.n_layer = 2;
    p.n_kv_head = 2;
    p.head_dim = 4;
    p.dtype = KVC_DTYPE_F32;
    p.block_size = block_size;
    p.n_blocks = n_blocks;
    p.max_seqs = max_seqs;
    p.max_batch_tokens = max_batch;
    return p;
}

kvc_cache *kvct_make(int32_t n_blocks, int32_t block_size, int32_t max_seqs, int32_t max_batch) {
    kvc_params p = kvct_params(n_blocks, block_size, max_seqs, max_batch);
    kvc_cache *c = NULL;
    return kvc_create(&p, &c) == KVC_OK ? c : NULL;
}

int kvct_append(kvc_cache *c, int32_t seq, const int32_t *tokens, int32_t n) {
    kvc_entry *e = malloc((size_t)n * sizeof *e);
    int32_t *slots = malloc((size_t)n * sizeof *slots);
    int rc = KVC_ERR_NOMEM;
    if (e && slots) {
        int32_t len = kvc_seq_len(c, seq);
        for (int32_t i = 0; i < n; i++) e[i] = (kvc_entry){seq, len + i, tokens[len + i]};
        rc = kvc_start_forward(c, e, n, slots);
        if (rc == KVC_OK) {
            kvc_layout l;
            kvc_get_layout(c, &l);
            for (int32_t i = 0; i < n; i++) kvct_write_slot(&l, slots[i], e[i].token, e[i].pos);
            rc = kvc_finish_forward(c, true);
        }
    }
    free(e);
    free(slots);
    return rc;
}
