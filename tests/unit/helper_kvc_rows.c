/* helper_kvc_rows.c: deterministic K/V rows for the kv_cache tests (see helper_kvc.h). */
#include "helper_kvc.h"

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
