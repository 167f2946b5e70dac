/* rank_head.c: a decoder reranker's classification head (rank_head.h). */
#include "engine/model/rank_head.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine/format/gguf.h"
#include "engine/kernels/quant.h"

/* cls.output.weight [n_embd, n_out] into h->out; its optional bias. */
static int load_tensors(eng_rank_head *h, const eng_model *m, const eng_gguf_tensor *t, const char *path, char *err,
                        size_t err_len) {
    const int64_t E = m->hp.n_embd;
    if (t->n_dims != 2 || t->ne[0] != E || t->ne[1] < 1 || t->ne[1] > E)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: tensor cls.output.weight has dims [%lld, %lld], expected "
                        "[%lld, n_out] with 1 <= n_out <= %lld", path, (long long)t->ne[0], (long long)t->ne[1],
                        (long long)E, (long long)E);
    const eng_qtype_info *qi = eng_qtype_get(t->type);
    if (!qi || !qi->supported || eng_qtype_row_bytes(t->type, E) == 0)
        return kvs_errf(err, err_len, ENG_ERR_UNSUPPORTED, "%s: tensor cls.output.weight has a type the engine cannot "
                        "read (%s)", path, eng_gguf_type_name(t->type) ? eng_gguf_type_name(t->type) : "unknown");
    h->n_out = (int32_t)t->ne[1];
    h->out = (eng_matrix){.data = t->data, .type = t->type, .dot_type = qi->dot_type, .k = E, .n_out = t->ne[1],
                          .row_bytes = eng_qtype_row_bytes(t->type, E)};
    const eng_gguf_tensor *b = eng_gguf_find_tensor(m->gguf, "cls.output.bias");
    if (!b) return 0;
    if (b->n_dims != 1 || b->ne[0] != h->n_out)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: tensor cls.output.bias has %lld values, expected %d", path,
                        (long long)b->ne[0], (int)h->n_out);
    if (!(h->out_b = malloc((size_t)h->n_out * sizeof *h->out_b)))
        return kvs_errf(err, err_len, ENG_ERR_NOMEM, "%s: out of memory", path);
    int rc = eng_dequantize_row(b->type, b->data, h->out_b, h->n_out);
    return rc ? kvs_errf(err, err_len, rc, "%s: tensor cls.output.bias: cannot dequantize", path) : 0;
}

/* <arch>.classifier.output_labels, when present, must name the head's outputs; the rerank prompt. */
static int load_keys(eng_rank_head *h, const eng_model *m, const char *path, char *err, size_t err_len) {
    char key[96];
    snprintf(key, sizeof key, "%s.classifier.output_labels", m->hp.arch_name);
    uint32_t et;
    uint64_t n;
    const void *data;
    const eng_gguf_str *strs;
    int rc = eng_gguf_get_arr(m->gguf, key, &et, &n, &data, &strs);
    if (rc == 0 && n != (uint64_t)h->n_out)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: key %s has %llu labels but cls.output.weight has %d "
                        "outputs", path, key, (unsigned long long)n, (int)h->n_out);
    if (rc != 0 && rc != ENG_ERR_NOT_FOUND)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: key %s is not an array", path, key);
    eng_gguf_str p;
    rc = eng_gguf_get_str(m->gguf, "tokenizer.chat_template.rerank", &p);
    if (rc == ENG_ERR_NOT_FOUND) return 0;
    if (rc != 0)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: key tokenizer.chat_template.rerank is not a string", path);
    if (!(h->prompt = malloc((size_t)p.len + 1))) return kvs_errf(err, err_len, ENG_ERR_NOMEM, "%s: out of memory", path);
    memcpy(h->prompt, p.ptr, (size_t)p.len);
    h->prompt[p.len] = '\0';
    if (strlen(h->prompt) != (size_t)p.len)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: key tokenizer.chat_template.rerank holds a NUL byte", path);
    return 0;
}

int eng_rank_head_load(eng_model *m, const char *path, char *err, size_t err_len) {
    m->rank = NULL;
    const eng_gguf_tensor *t = eng_gguf_find_tensor(m->gguf, "cls.output.weight");
    if (!t || m->hp.arch != ENG_ARCH_QWEN3) return 0;
    eng_rank_head *h = calloc(1, sizeof *h);
    if (!h) return kvs_errf(err, err_len, ENG_ERR_NOMEM, "%s: out of memory", path);
    h->softmax = true;
    int rc = load_tensors(h, m, t, path, err, err_len);
    if (rc == 0) rc = load_keys(h, m, path, err, err_len);
    if (rc != 0) {
        eng_rank_head_free(h);
        return rc;
    }
    m->rank = h;
    return 0;
}

int eng_rank_head_apply(const eng_rank_head *h, const float *x, float *out) {
    const int64_t E = h->out.k;
    size_t xb = eng_qtype_row_bytes(h->out.dot_type, E);
    void *xq = malloc(xb ? xb : 1);
    if (!xq) return ENG_ERR_NOMEM;
    /* x quantized to the weights' activation type, as a matrix product does (and llama.cpp's mul_mat); the scalar
     * kernel: the same floats on every CPU */
    int rc = eng_quantize_row(h->out.dot_type, x, xq, E);
    for (int32_t j = 0; rc == 0 && j < h->n_out; j++) {
        const void *row = (const char *)h->out.data + (size_t)j * h->out.row_bytes;
        out[j] = eng_vec_dot(ENG_SIMD_SCALAR, h->out.type, E, row, xq) + (h->out_b ? h->out_b[j] : 0.0f);
    }
    free(xq);
    if (rc != 0 || !h->softmax) return rc;
    float mx = out[0];
    for (int32_t j = 1; j < h->n_out; j++) mx = out[j] > mx ? out[j] : mx;
    double sum = 0;
    for (int32_t j = 0; j < h->n_out; j++) sum += exp((double)out[j] - (double)mx);
    for (int32_t j = 0; j < h->n_out; j++) out[j] = (float)(exp((double)out[j] - (double)mx) / sum);
    return 0;
}

void eng_rank_head_free(eng_rank_head *h) {
    if (!h) return;
    free(h->out_b);
    free(h->prompt);
    free(h);
}
