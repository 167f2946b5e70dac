/* encoder.c: loading bert and nomic-bert GGUFs (see encoder.h for the tensors and keys). */
#include "engine/model/encoder.h"
#include "common/common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/quant.h"
#include "engine/text/tokenizer.h"

bool eng_encoder_arch(const char *arch_name, eng_arch *arch) {
    if (!strcmp(arch_name, "bert")) *arch = ENG_ARCH_BERT;
    else if (!strcmp(arch_name, "nomic-bert")) *arch = ENG_ARCH_NOMIC_BERT;
    else if (!strcmp(arch_name, "jina-bert-v2")) *arch = ENG_ARCH_JINA_BERT_V2;
    else return false;
    return true;
}

typedef struct enc_loader {
    eng_model *m;
    const char *path;
    char *err;
    size_t err_len;
} enc_loader;

/* The tensor `name` checked to be [ne0] (ne1 == 0) or [ne0, ne1] in a supported type with all its bytes; NULL
 * with *rc set when it is absent (an error only when required) or wrong. */
static const eng_gguf_tensor *find_checked(enc_loader *L, const char *name, int64_t ne0, int64_t ne1, bool required,
                                           int *rc) {
    *rc = 0;
    const eng_gguf_tensor *t = eng_gguf_find_tensor(L->m->gguf, name);
    if (!t) {
        if (required) *rc = kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: missing tensor %s", L->path, name);
        return NULL;
    }
    const eng_qtype_info *qi = eng_qtype_get(t->type);
    if (!qi || !qi->supported) {
        *rc = kvs_errf(L->err, L->err_len, ENG_ERR_UNSUPPORTED, "%s: tensor %s has unsupported type %u", L->path, name,
                       t->type);
        return NULL;
    }
    int64_t want1 = ne1 > 0 ? ne1 : 1;
    if (t->ne[0] != ne0 || t->ne[1] != want1 || t->ne[2] != 1 || t->ne[3] != 1) {
        *rc = kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: tensor %s has dims [%lld, %lld, %lld, %lld], expected "
                       "[%lld, %lld]", L->path, name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                       (long long)t->ne[3], (long long)ne0, (long long)want1);
        return NULL;
    }
    size_t rb = eng_qtype_row_bytes(t->type, ne0);
    if (rb == 0 || t->nbytes < rb * (size_t)want1) {
        *rc = kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: tensor %s: %zu bytes, expected %zu", L->path, name,
                       t->nbytes, rb * (size_t)want1);
        return NULL;
    }
    L->m->weight_bytes += t->nbytes;
    return t;
}

/* A matrix [k -> n]; absent and not required: *out stays zeroed and 0 is returned. */
static int enc_matrix(enc_loader *L, const char *name, int64_t k, int64_t n, bool required, eng_matrix *out) {
    int rc;
    memset(out, 0, sizeof *out);
    const eng_gguf_tensor *t = find_checked(L, name, k, n, required, &rc);
    if (!t) return rc;
    const eng_qtype_info *qi = eng_qtype_get(t->type);
    if (eng_qtype_row_bytes(qi->dot_type, k) == 0)
        return kvs_errf(L->err, L->err_len, ENG_ERR_UNSUPPORTED, "%s: tensor %s: row length %lld does not fit the "
                        "activation format of its type", L->path, name, (long long)k);
    out->data = t->data;
    out->type = t->type;
    out->dot_type = qi->dot_type;
    out->k = k;
    out->n_out = n;
    out->row_bytes = eng_qtype_row_bytes(t->type, k);
    return 0;
}

/* A vector of n floats dequantized into a new array (NULL when absent and not required). */
static int enc_vector(enc_loader *L, const char *name, int64_t n, bool required, float **out) {
    int rc;
    *out = NULL;
    const eng_gguf_tensor *t = find_checked(L, name, n, 0, required, &rc);
    if (!t) return rc;
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return kvs_errf(L->err, L->err_len, ENG_ERR_NOMEM, "%s: out of memory", L->path);
    if ((rc = eng_dequantize_row(t->type, t->data, v, n)) != 0) {
        free(v);
        return kvs_errf(L->err, L->err_len, rc, "%s: tensor %s: cannot dequantize", L->path, name);
    }
    *out = v;
    return 0;
}

static eng_matrix rows_of(const eng_matrix *w, int64_t r0, int64_t n) {
    eng_matrix v = *w;
    v.data = (const char *)w->data + (size_t)r0 * w->row_bytes;
    v.n_out = n;
    v.packed = NULL;
    return v;
}

/* Splits a fused bias [3E] into three owned vectors. */
static int split_bias(enc_loader *L, const float *b, int64_t E, eng_enc_layer *el) {
    float **dst[3] = {&el->bq, &el->bk, &el->bv};
    for (int i = 0; i < 3; i++) {
        if (!(*dst[i] = malloc((size_t)E * sizeof(float))))
            return kvs_errf(L->err, L->err_len, ENG_ERR_NOMEM, "%s: out of memory", L->path);
        memcpy(*dst[i], b + (size_t)i * (size_t)E, (size_t)E * sizeof(float));
    }
    return 0;
}

static int load_attn(enc_loader *L, int l, eng_layer *ly, eng_enc_layer *el, int64_t E) {
    char name[96];
    int rc;
    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", l);
    if (eng_gguf_find_tensor(L->m->gguf, name)) {
        eng_matrix qkv;
        if ((rc = enc_matrix(L, name, E, 3 * E, true, &qkv)) != 0) return rc;
        ly->wq = rows_of(&qkv, 0, E);
        ly->wk = rows_of(&qkv, E, E);
        ly->wv = rows_of(&qkv, 2 * E, E);
        ly->fused = true;
        float *b = NULL;
        snprintf(name, sizeof name, "blk.%d.attn_qkv.bias", l);
        if ((rc = enc_vector(L, name, 3 * E, false, &b)) != 0) return rc;
        if (b) {
            rc = split_bias(L, b, E, el);
            free(b);
            return rc;
        }
    } else {
        static const char *const qkv[3] = {"attn_q", "attn_k", "attn_v"};
        eng_matrix *ms[3] = {&ly->wq, &ly->wk, &ly->wv};
        for (int i = 0; i < 3; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, qkv[i]);
            if ((rc = enc_matrix(L, name, E, E, true, ms[i])) != 0) return rc;
        }
    }
    float **bs[3] = {&el->bq, &el->bk, &el->bv};
    static const char *const bn[3] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "blk.%d.%s", l, bn[i]);
        if ((rc = enc_vector(L, name, E, false, bs[i])) != 0) return rc;
    }
    return 0;
}

/* jina-bert-v2's feed-forward: ffn_up [n_embd, 2 n_ff] (gate rows first, then up; its bias split likewise) or
 * ffn_up [n_embd, n_ff] with ffn_gate [n_embd, n_ff] (GEGLU), or ffn_up alone (GELU); the choice of layer 0 for all.
 * The optional tensors llama.cpp would apply and this engine does not are refused. */
static int load_jina_ffn(enc_loader *L, int l, eng_layer *ly, eng_enc_layer *el) {
    eng_model *m = L->m;
    const int64_t E = m->hp.n_embd, F = m->hp.n_ff;
    char name[96];
    static const char *const refused[] = {"attn_q_norm.weight", "attn_k_norm.weight", "attn_norm_2.weight"};
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "blk.%d.%s", l, refused[i]);
        if (eng_gguf_find_tensor(m->gguf, name))
            return kvs_errf(L->err, L->err_len, ENG_ERR_UNSUPPORTED, "%s: tensor %s: jina-bert-v2's Q/K LayerNorms "
                            "and second attention norm are not supported", L->path, name);
    }
    snprintf(name, sizeof name, "blk.%d.ffn_up.weight", l);
    const eng_gguf_tensor *t = eng_gguf_find_tensor(m->gguf, name);
    bool fused = t && t->n_dims == 2 && t->ne[1] == 2 * F;
    snprintf(name, sizeof name, "blk.%d.ffn_gate.weight", l);
    bool gate = eng_gguf_find_tensor(m->gguf, name) != NULL;
    bool geglu = fused || gate;
    if (l == 0) m->enc->geglu = geglu;
    else if (geglu != m->enc->geglu)
        return kvs_errf(L->err, L->err_len, ENG_ERR_UNSUPPORTED, "%s: layer %d's feed-forward is %s, layer 0's is "
                        "not (mixed GELU and GEGLU layers are not supported)", L->path, l, geglu ? "gated" : "plain");
    int rc;
    snprintf(name, sizeof name, "blk.%d.ffn_up.weight", l);
    if (!fused) {
        if ((rc = enc_matrix(L, name, E, F, true, &ly->w_up)) != 0) return rc;
        snprintf(name, sizeof name, "blk.%d.ffn_gate.weight", l);
        if (gate && (rc = enc_matrix(L, name, E, F, true, &ly->w_gate)) != 0) return rc;
        snprintf(name, sizeof name, "blk.%d.ffn_up.bias", l);
        return enc_vector(L, name, F, false, &el->b_up);
    }
    eng_matrix both;
    if ((rc = enc_matrix(L, name, E, 2 * F, true, &both)) != 0) return rc;
    ly->w_gate = rows_of(&both, 0, F);
    ly->w_up = rows_of(&both, F, F);
    float *b = NULL;
    snprintf(name, sizeof name, "blk.%d.ffn_up.bias", l);
    if ((rc = enc_vector(L, name, 2 * F, false, &b)) != 0 || !b) return rc;
    el->b_gate = malloc((size_t)F * sizeof(float));
    el->b_up = malloc((size_t)F * sizeof(float));
    if (el->b_gate && el->b_up) {
        memcpy(el->b_gate, b, (size_t)F * sizeof(float));
        memcpy(el->b_up, b + F, (size_t)F * sizeof(float));
    }
    free(b);
    return el->b_gate && el->b_up ? 0 : kvs_errf(L->err, L->err_len, ENG_ERR_NOMEM, "%s: out of memory", L->path);
}

static int load_layer(enc_loader *L, int l) {
    eng_model *m = L->m;
    const eng_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff;
    eng_layer *ly = &m->layers[l];
    eng_enc_layer *el = &m->enc->layers[l];
    int rc = load_attn(L, l, ly, el, E);
    if (rc != 0) return rc;
    char name[96];
#define MAT(suffix, k, n, req, dst) \
    (snprintf(name, sizeof name, "blk.%d." suffix, l), enc_matrix(L, name, k, n, req, dst))
#define VEC(suffix, n, req, dst) (snprintf(name, sizeof name, "blk.%d." suffix, l), enc_vector(L, name, n, req, dst))
    if ((rc = MAT("attn_output.weight", E, E, true, &ly->wo)) != 0) return rc;
    if ((rc = VEC("attn_output.bias", E, false, &el->bo)) != 0) return rc;
    if ((rc = VEC("attn_output_norm.weight", E, true, &el->attn_ln_w)) != 0) return rc;
    if ((rc = VEC("attn_output_norm.bias", E, true, &el->attn_ln_b)) != 0) return rc;
    if (m->enc->alibi) {
        if ((rc = load_jina_ffn(L, l, ly, el)) != 0) return rc;
    } else {
        if ((rc = MAT("ffn_up.weight", E, F, true, &ly->w_up)) != 0) return rc;
        if ((rc = VEC("ffn_up.bias", F, false, &el->b_up)) != 0) return rc;
    }
    if (m->enc->swiglu || m->enc->alibi) {
        if (m->enc->swiglu && (rc = MAT("ffn_gate.weight", E, F, true, &ly->w_gate)) != 0) return rc;
    } else {
        ly->w_gate = ly->w_up; /* unused by GELU; the same rows (not packed twice: see eng_model_pack_cpu) */
    }
    if ((rc = MAT("ffn_down.weight", F, E, true, &ly->w_down)) != 0) return rc;
    if ((rc = VEC("ffn_down.bias", E, false, &el->b_down)) != 0) return rc;
    if ((rc = VEC("layer_output_norm.weight", E, true, &el->out_ln_w)) != 0) return rc;
    if ((rc = VEC("layer_output_norm.bias", E, true, &el->out_ln_b)) != 0) return rc;
#undef MAT
#undef VEC
    return 0;
}

/* token_types row 0, position_embd, the embedding LayerNorm. */
static int load_inputs(enc_loader *L) {
    eng_model *m = L->m;
    eng_encoder *enc = m->enc;
    const int64_t E = m->hp.n_embd;
    int rc;
    const eng_gguf_tensor *tt = eng_gguf_find_tensor(m->gguf, "token_types.weight");
    if (tt) {
        if (tt->n_dims < 1 || tt->n_dims > 2 || tt->ne[0] != E || tt->ne[1] < 1)
            return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: tensor token_types.weight has dims [%lld, %lld], "
                            "expected [%lld, n_types]", L->path, (long long)tt->ne[0], (long long)tt->ne[1],
                            (long long)E);
        eng_matrix types;
        if ((rc = enc_matrix(L, "token_types.weight", E, tt->ne[1], true, &types)) != 0) return rc;
        if (!(enc->type_row = malloc((size_t)E * sizeof(float))))
            return kvs_errf(L->err, L->err_len, ENG_ERR_NOMEM, "%s: out of memory", L->path);
        if ((rc = eng_dequantize_row(types.type, types.data, enc->type_row, E)) != 0)
            return kvs_errf(L->err, L->err_len, rc, "%s: token_types.weight: cannot dequantize", L->path);
    }
    if (!enc->rope && !enc->alibi &&
        (rc = enc_matrix(L, "position_embd.weight", E, m->hp.n_ctx_train, true, &enc->pos_embd)) != 0)
        return rc;
    if ((rc = enc_vector(L, "token_embd_norm.weight", E, true, &enc->embd_ln_w)) != 0) return rc;
    return enc_vector(L, "token_embd_norm.bias", E, true, &enc->embd_ln_b);
}

static int load_head(enc_loader *L) {
    eng_model *m = L->m;
    eng_encoder *enc = m->enc;
    const int64_t E = m->hp.n_embd;
    int rc;
    const eng_gguf_tensor *co = eng_gguf_find_tensor(m->gguf, "cls.output.weight");
    const eng_gguf_tensor *ct = eng_gguf_find_tensor(m->gguf, "cls.weight");
    /* without cls.output, cls alone is the head: [n_embd, n_cls] (jina-reranker-v1: one output) */
    int64_t n_cls = !co && ct && ct->n_dims <= 2 && ct->ne[1] >= 1 && ct->ne[1] <= E ? ct->ne[1] : E;
    if ((rc = enc_matrix(L, "cls.weight", E, n_cls, false, &enc->cls)) != 0) return rc;
    if ((rc = enc_vector(L, "cls.bias", n_cls, false, &enc->cls_b)) != 0) return rc;
    int64_t n_out = co && co->n_dims == 2 ? co->ne[1] : 1;
    if (n_out < 1 || n_out > E)
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: cls.output.weight has %lld outputs (1 to %lld "
                        "supported)", L->path, (long long)n_out, (long long)E);
    if ((rc = enc_matrix(L, "cls.output.weight", E, n_out, false, &enc->cls_out)) != 0) return rc;
    if ((rc = enc_vector(L, "cls.output.bias", n_out, false, &enc->cls_out_b)) != 0) return rc;
    if (enc->cls_out.data) enc->n_cls_out = (int32_t)n_out;
    else if (enc->cls.data) enc->n_cls_out = (int32_t)n_cls; /* a head without its output layer: its values */
    if (enc->cls_b && !enc->cls.data)
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: cls.bias without cls.weight", L->path);
    if (enc->cls_out_b && !enc->cls_out.data)
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: cls.output.bias without cls.output.weight",
                        L->path);
    return 0;
}

int eng_encoder_load(eng_model *m, const char *path, char *err, size_t err_len) {
    enc_loader L = {m, path, err, err_len};
    eng_hparams *hp = &m->hp;
    if (hp->n_head_kv != hp->n_head || hp->head_dim * hp->n_head != hp->n_embd)
        return kvs_errf(err, err_len, ENG_ERR_UNSUPPORTED, "%s: an encoder needs head_count_kv == head_count and "
                        "head size * heads == embedding_length", path);
    m->enc = calloc(1, sizeof *m->enc);
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (m->enc) m->enc->layers = calloc((size_t)hp->n_layer, sizeof *m->enc->layers);
    if (!m->enc || !m->layers || !m->enc->layers) return kvs_errf(err, err_len, ENG_ERR_NOMEM, "%s: out of memory", path);
    eng_encoder *enc = m->enc;
    enc->rope = hp->arch == ENG_ARCH_NOMIC_BERT;
    enc->swiglu = hp->arch == ENG_ARCH_NOMIC_BERT;
    enc->alibi = hp->arch == ENG_ARCH_JINA_BERT_V2;
    enc->alibi_max_bias = enc->alibi ? 8.0f : 0.0f;
    char key[96];
    snprintf(key, sizeof key, "%s.attention.layer_norm_epsilon", hp->arch_name);
    int rc = eng_gguf_get_f32(m->gguf, key, &enc->ln_eps);
    if (rc == ENG_ERR_NOT_FOUND) enc->ln_eps = 1e-12f;
    else if (rc != 0 || !(enc->ln_eps >= 0.0f))
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: key %s is not a non-negative float", path, key);
    const eng_gguf_tensor *te = eng_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!te || te->n_dims != 2 || te->ne[0] != hp->n_embd || te->ne[1] < 1 || te->ne[1] > INT32_MAX ||
        (hp->n_vocab > 0 && te->ne[1] != hp->n_vocab))
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: tensor token_embd.weight is missing or not [%d, n_vocab]",
                        path, hp->n_embd);
    hp->n_vocab = (int32_t)te->ne[1];
    if (!enc->swiglu) {
        if (!(enc->gelu_tab = malloc(65536 * sizeof(float))))
            return kvs_errf(err, err_len, ENG_ERR_NOMEM, "%s: out of memory", path);
        for (uint32_t h = 0; h < 65536; h++) {
            float x = eng_fp16_to_f32((uint16_t)h);
            float g = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
            enc->gelu_tab[h] = eng_fp16_to_f32(eng_f32_to_fp16(g));
        }
    }
    if ((rc = enc_matrix(&L, "token_embd.weight", hp->n_embd, hp->n_vocab, true, &m->tok_embd)) != 0) return rc;
    m->output = m->tok_embd; /* no output projection; kept consistent for the context's checks */
    hp->tied_embeddings = true;
    if ((rc = load_inputs(&L)) != 0) return rc;
    for (int l = 0; l < hp->n_layer; l++)
        if ((rc = load_layer(&L, l)) != 0) return rc;
    return load_head(&L);
}

void eng_encoder_free(eng_encoder *enc, int32_t n_layer) {
    if (!enc) return;
    for (int32_t l = 0; enc->layers && l < n_layer; l++) {
        eng_enc_layer *el = &enc->layers[l];
        KVS_FREE_ALL(el->bq, el->bk, el->bv, el->bo, el->attn_ln_w, el->attn_ln_b, el->b_up, el->b_gate, el->b_down,
                     el->out_ln_w, el->out_ln_b);
    }
    KVS_FREE_ALL(enc->layers, enc->gelu_tab, enc->type_row, enc->embd_ln_w, enc->embd_ln_b, enc->cls_b, enc->cls_out_b, enc);
}

void eng_rerank_tokens(const eng_model *m, int32_t *bos, int32_t *eos, int32_t *sep) {
    *bos = *eos = *sep = -1;
    const struct eng_vocab *v = m ? m->vocab : NULL;
    if (!v) return;
    if (eng_vocab_add_bos(v)) *bos = eng_vocab_bos(v);
    if (eng_vocab_add_eos(v)) *eos = eng_vocab_eos(v) >= 0 ? eng_vocab_eos(v) : eng_vocab_sep(v);
    if (eng_vocab_add_sep(v)) *sep = eng_vocab_sep(v);
}
