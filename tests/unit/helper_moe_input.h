/*
 * helper_moe_input.h: a small model with stacked expert tensors for the MXFP4_MOE quantizer test
 * (test_quant_mxfp4.c) and its reference recorder (scripts/ref-mxfp4-quant.c, through scripts/ref-mxfp4.py).
 * Header-only (static functions), so that both build the same bytes: the recorder runs llama-quantize on the file,
 * the test runs `kvserve quantize`.
 *
 * kvt_moe_input(src, dst) copies every key and tensor of the GGUF src (a `kvserve mkmodel` f32 model) into dst and
 * adds, per layer l, blk.l.ffn_gate_exps.weight and blk.l.ffn_up_exps.weight [n_embd, 64, 4] and
 * blk.l.ffn_down_exps.weight [64, n_embd, 4] (f32), plus blk.0.ffn_norm_exps.weight [48, 2, 3] whose rows are not
 * a whole number of MXFP4 blocks (the F16 fallback). Values: xorshift64 from seed 0xC0FFEE, one draw per value,
 * uniform in [-1, 1) times 2^(draw-chosen exponent in [-12, 3] per 32 values), and every 7th block of 32 all zero.
 *
 * kvt_tensor_sha256(t, hex) writes the SHA-256 of a tensor's stored bytes as 64 hex digits.
 */
#ifndef KVSERVE_TESTS_HELPER_MOE_INPUT_H
#define KVSERVE_TESTS_HELPER_MOE_INPUT_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine/format/gguf.h"
#include "engine/kernels/quant.h"

static uint64_t kvt_moe_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* n values (a multiple of 32) of the documented distribution into v. */
static void kvt_moe_values(uint64_t *s, float *v, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++) {
        float scale = ldexpf(1.f, (int)(kvt_moe_next(s) % 16) - 12);
        bool zero = b % 7 == 6;
        for (int j = 0; j < 32; j++) {
            uint64_t d = kvt_moe_next(s);
            v[b * 32 + j] = zero ? 0.f : ((float)(d >> 40) / 16777216.f * 2.f - 1.f) * scale;
        }
    }
}

static int kvt_moe_add(eng_gguf_writer *w, uint64_t *s, const char *name, int64_t ne0, int64_t ne1, int64_t ne2) {
    int64_t ne[3] = {ne0, ne1, ne2}, n = ne0 * ne1 * ne2;
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return KVS_ERR_NOMEM;
    kvt_moe_values(s, v, n);
    int rc = eng_gguf_add_tensor(w, name, ENG_Q_F32, 3, ne, v, (size_t)n * sizeof *v);
    free(v);
    return rc;
}

static int kvt_moe_input(const char *src, const char *dst, char *err, size_t err_len) {
    eng_gguf *g = NULL;
    eng_gguf_writer *w = NULL;
    int rc = eng_gguf_open(src, &g, err, err_len);
    if (rc) return rc;
    rc = eng_gguf_writer_create(&w);
    for (int64_t i = 0; !rc && i < eng_gguf_n_kv(g); i++) rc = eng_gguf_add_kv_from(w, eng_gguf_kv_at(g, i));
    int64_t n_embd = 0, n_layer = 0;
    char name[128];
    for (int64_t i = 0; !rc && i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        rc = eng_gguf_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->nbytes);
        if (!strcmp(name, "token_embd.weight")) n_embd = t->ne[0];
        int l;
        if (sscanf(name, "blk.%d.", &l) == 1 && l + 1 > n_layer) n_layer = l + 1;
    }
    if (!rc && (n_embd < 32 || n_embd % 32)) rc = KVS_ERR_INVALID;
    uint64_t s = 0xC0FFEE;
    static const char *const parts[] = {"gate", "up", "down"};
    for (int64_t l = 0; !rc && l < n_layer; l++)
        for (int p = 0; !rc && p < 3; p++) {
            snprintf(name, sizeof name, "blk.%lld.ffn_%s_exps.weight", (long long)l, parts[p]);
            rc = p < 2 ? kvt_moe_add(w, &s, name, n_embd, 64, 4) : kvt_moe_add(w, &s, name, 64, n_embd, 4);
        }
    if (!rc) rc = kvt_moe_add(w, &s, "blk.0.ffn_norm_exps.weight", 48, 2, 3);
    if (!rc) rc = eng_gguf_write(w, dst, err, err_len);
    else snprintf(err, err_len, "%s: cannot build the expert tensors: %s", src, kvs_strerror(rc));
    eng_gguf_writer_free(w);
    eng_gguf_close(g);
    return rc;
}

static void kvt_tensor_sha256(const eng_gguf_tensor *t, char hex[65]) {
    uint8_t h[32];
    kvs_sha256(t->data, t->nbytes, h);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
}

#endif /* KVSERVE_TESTS_HELPER_MOE_INPUT_H */
