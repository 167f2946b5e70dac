/* model.c: loading a GGUF model (llama, qwen2, qwen3, qwen3moe, gpt-oss, gemma3, phi3) into struct eng_model, with
 * every tensor checked. */
#include "engine/model/model.h"
#include "common/common.h"

#include <errno.h>
#include <math.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/quant.h"
#include "engine/kernels/quant_kpacked.h"
#include "engine/text/tokenizer.h"
#include "engine/model/encoder.h"
#include "engine/model/rank_head.h"

void eng_load_params_default(eng_load_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->use_mmap = true;
    p->vocab_only = false;
}

/* Loader state: the model being built and where messages go. */
typedef struct loader {
    eng_model *m;
    const char *path;
    char *err;
    size_t err_len;
    char key[160];
} loader;

static const char *akey(loader *L, const char *suffix) {
    snprintf(L->key, sizeof L->key, "%s.%s", L->m->hp.arch_name, suffix);
    return L->key;
}

/* Reads an integer hparam <arch>.suffix into *out: required (missing -> error) or defaulted. */
static int get_int(loader *L, const char *suffix, bool required, int32_t def, int32_t *out) {
    int64_t v = 0;
    const char *key = akey(L, suffix);
    int rc = eng_gguf_get_i64(L->m->gguf, key, &v);
    if (rc == ENG_ERR_NOT_FOUND) {
        if (required) return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: missing key %s", L->path, key);
        *out = def;
        return 0;
    }
    if (rc != 0) return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: key %s is not an integer", L->path, key);
    if (v < 0 || v > INT32_MAX)
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: key %s out of range (%lld)", L->path, key,
                    (long long)v);
    *out = (int32_t)v;
    return 0;
}

static int get_float(loader *L, const char *suffix, float def, float *out) {
    const char *key = akey(L, suffix);
    int rc = eng_gguf_get_f32(L->m->gguf, key, out);
    if (rc == ENG_ERR_NOT_FOUND) {
        *out = def;
        return 0;
    }
    if (rc != 0) return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: key %s is not a float", L->path, key);
    return 0;
}

static void copy_str(char *dst, size_t cap, eng_gguf_str s) {
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(dst, s.ptr, n);
    dst[n] = '\0';
}

static const eng_gguf_tensor *find_tensor(loader *L, const char *name, bool required, int *rc) {
    const eng_gguf_tensor *t = eng_gguf_find_tensor(L->m->gguf, name);
    if (!t && required)
        *rc = kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: missing tensor %s", L->path, name);
    return t;
}

/* Checks a tensor's dims (n_dims given, ne as expected) and that its type is supported. */
static int check_tensor(loader *L, const eng_gguf_tensor *t, const char *name, int n_dims, int64_t ne0,
                        int64_t ne1) {
    const eng_qtype_info *qi = eng_qtype_get(t->type);
    if (!qi || !qi->supported)
        return kvs_errf(L->err, L->err_len, ENG_ERR_UNSUPPORTED, "%s: tensor %s has unsupported type %s (%u)",
                    L->path, name, qi && qi->name ? qi->name : "unknown", t->type);
    int64_t want[4] = {ne0, n_dims > 1 ? ne1 : 1, 1, 1};
    bool ok = true;
    for (int d = 0; d < 4; d++)
        if (t->ne[d] != want[d]) ok = false;
    if (!ok) {
        if (n_dims == 1)
            return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT,
                        "%s: tensor %s has dims [%lld, %lld, %lld, %lld], expected [%lld]", L->path, name,
                        (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                        (long long)ne0);
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT,
                    "%s: tensor %s has dims [%lld, %lld, %lld, %lld], expected [%lld, %lld]", L->path, name,
                    (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                    (long long)ne0, (long long)ne1);
    }
    size_t need = eng_qtype_row_bytes(t->type, ne0);
    if (need == 0)
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: tensor %s: row length %lld is not a multiple of "
                    "the %s block size", L->path, name, (long long)ne0, qi->name);
    if (t->nbytes < need * (size_t)want[1])
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: tensor %s: %zu bytes, expected %zu", L->path,
                    name, t->nbytes, need * (size_t)want[1]);
    L->m->weight_bytes += t->nbytes;
    return 0;
}

static int load_matrix(loader *L, const char *name, int64_t k, int64_t n_out, eng_matrix *out) {
    int rc = 0;
    const eng_gguf_tensor *t = find_tensor(L, name, true, &rc);
    if (!t) return rc;
    if ((rc = check_tensor(L, t, name, 2, k, n_out)) != 0) return rc;
    const eng_qtype_info *qi = eng_qtype_get(t->type);
    if (eng_qtype_row_bytes(qi->dot_type, k) == 0)
        return kvs_errf(L->err, L->err_len, ENG_ERR_UNSUPPORTED, "%s: tensor %s: row length %lld does not fit the "
                    "activation format of type %s", L->path, name, (long long)k, qi->name);
    out->data = t->data;
    out->type = t->type;
    out->dot_type = qi->dot_type;
    out->k = k;
    out->n_out = n_out;
    out->row_bytes = eng_qtype_row_bytes(t->type, k);
    return 0;
}

/* A vector of n values, dequantized into a new f32 array (*out NULL when absent and not required). */
static int load_vector(loader *L, const char *name, int64_t n, bool required, float **out) {
    int rc = 0;
    *out = NULL;
    const eng_gguf_tensor *t = find_tensor(L, name, required, &rc);
    if (!t) return rc;
    if ((rc = check_tensor(L, t, name, 1, n, 1)) != 0) return rc;
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return kvs_errf(L->err, L->err_len, ENG_ERR_NOMEM, "%s: out of memory", L->path);
    rc = eng_dequantize_row(t->type, t->data, v, n);
    if (rc != 0) {
        free(v);
        return kvs_errf(L->err, L->err_len, rc, "%s: tensor %s: cannot dequantize", L->path, name);
    }
    *out = v;
    return 0;
}

static int load_hparams(loader *L, bool vocab_only) {
    eng_model *m = L->m;
    eng_hparams *hp = &m->hp;
    eng_gguf_str s;
    if (eng_gguf_get_str(m->gguf, "general.architecture", &s) != 0)
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: missing key general.architecture", L->path);
    copy_str(hp->arch_name, sizeof hp->arch_name, s);
    if (eng_gguf_get_str(m->gguf, "general.name", &s) == 0) {
        copy_str(hp->name, sizeof hp->name, s);
    } else {
        const char *base = strrchr(L->path, '/');
        snprintf(hp->name, sizeof hp->name, "%s", base ? base + 1 : L->path);
    }
    if (!strcmp(hp->arch_name, "llama")) hp->arch = ENG_ARCH_LLAMA;
    else if (!strcmp(hp->arch_name, "qwen2")) hp->arch = ENG_ARCH_QWEN2;
    else if (!strcmp(hp->arch_name, "qwen3")) hp->arch = ENG_ARCH_QWEN3;
    else if (!strcmp(hp->arch_name, "gemma3")) hp->arch = ENG_ARCH_GEMMA3;
    else if (!strcmp(hp->arch_name, "phi3")) hp->arch = ENG_ARCH_PHI3;
    else if (!strcmp(hp->arch_name, "qwen3moe")) hp->arch = ENG_ARCH_QWEN3MOE;
    else if (!strcmp(hp->arch_name, "gpt-oss")) hp->arch = ENG_ARCH_GPT_OSS;
    else if (eng_encoder_arch(hp->arch_name, &hp->arch)) {} /* bert, nomic-bert: engine/model/encoder.c */
    else if (vocab_only) return 0; /* a tokenizer-only load does not need the architecture */
    else return kvs_errf(L->err, L->err_len, ENG_ERR_UNSUPPORTED, "%s: unsupported architecture %s", L->path,
                     hp->arch_name);
    hp->neox_rope = hp->arch != ENG_ARCH_LLAMA;

    int rc;
    if ((rc = get_int(L, "context_length", !vocab_only, 0, &hp->n_ctx_train)) != 0) return rc;
    if ((rc = get_int(L, "embedding_length", !vocab_only, 0, &hp->n_embd)) != 0) return rc;
    if ((rc = get_int(L, "block_count", !vocab_only, 0, &hp->n_layer)) != 0) return rc;
    if ((rc = get_int(L, "feed_forward_length", !vocab_only, 0, &hp->n_ff)) != 0) return rc;
    if ((rc = get_int(L, "attention.head_count", !vocab_only, 0, &hp->n_head)) != 0) return rc;
    if ((rc = get_int(L, "attention.head_count_kv", false, hp->n_head, &hp->n_head_kv)) != 0) return rc;
    if ((rc = get_int(L, "pooling_type", false, -1, &hp->pooling_type)) != 0) return rc;
    if (vocab_only) return 0;
    if (hp->n_embd < 1 || hp->n_layer < 1 || hp->n_head < 1 || hp->n_ff < 1 || hp->n_ctx_train < 1)
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: embedding_length, block_count, head_count, "
                    "feed_forward_length and context_length must be positive", L->path);
    if (hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv != 0)
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: head_count %d is not a multiple of head_count_kv "
                    "%d", L->path, hp->n_head, hp->n_head_kv);
    int32_t def_hd = hp->n_embd % hp->n_head == 0 ? hp->n_embd / hp->n_head : 0;
    if ((rc = get_int(L, "attention.key_length", false, def_hd, &hp->head_dim)) != 0) return rc;
    int32_t vlen = 0;
    if ((rc = get_int(L, "attention.value_length", false, hp->head_dim, &vlen)) != 0) return rc;
    if (hp->head_dim < 1 || hp->head_dim % 2 != 0 || vlen != hp->head_dim)
        return kvs_errf(L->err, L->err_len, ENG_ERR_UNSUPPORTED, "%s: unsupported head size (key_length %d, "
                    "value_length %d)", L->path, hp->head_dim, vlen);
    if ((rc = get_int(L, "rope.dimension_count", false, hp->head_dim, &hp->n_rot)) != 0) return rc;
    if (hp->n_rot < 2 || hp->n_rot % 2 != 0 || hp->n_rot > hp->head_dim)
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: rope.dimension_count %d must be even and at most "
                    "the head size %d", L->path, hp->n_rot, hp->head_dim);
    if ((rc = get_float(L, "rope.freq_base", 10000.0f, &hp->rope_freq_base)) != 0) return rc;
    /* rope.scaling.factor, else the older rope.scale_linear (llama.cpp reads both, in that order; 0 means 1) */
    float scale_linear = 0.0f;
    if ((rc = get_float(L, "rope.scaling.factor", 0.0f, &scale_linear)) != 0) return rc;
    if (scale_linear == 0.0f && (rc = get_float(L, "rope.scale_linear", 0.0f, &scale_linear)) != 0) return rc;
    if (scale_linear == 0.0f) scale_linear = 1.0f;
    if (!(scale_linear > 0.0f) || isinf(scale_linear) || !(hp->rope_freq_base > 0.0f))
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: rope.freq_base and rope.scaling.factor (or "
                    "rope.scale_linear) must be positive", L->path);
    hp->rope_freq_scale = 1.0f / scale_linear;
    if ((rc = get_float(L, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->rms_eps)) != 0) return rc;
    if (!(hp->rms_eps >= 0.0f))
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: negative rms epsilon", L->path);
    return eng_model_family_hparams(m, L->path, L->err, L->err_len);
}

/* A view of rows [r0, r0 + n) of matrix w. */
static eng_matrix row_range(const eng_matrix *w, int64_t r0, int64_t n) {
    eng_matrix v = *w;
    v.data = (const char *)w->data + (size_t)r0 * w->row_bytes;
    v.n_out = n;
    v.packed = NULL;
    return v;
}

/* phi3's fused attn_qkv ([n_embd -> QD + 2 KD]: Q rows, then K, then V) and ffn_up ([n_embd -> 2 n_ff]: gate
 * rows, then up) as views of their row ranges; 1 when the layer has them, 0 when not, or an error. */
static int load_fused(loader *L, int l, eng_layer *ly, int64_t E, int64_t QD, int64_t KD, int64_t F) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", l);
    if (!eng_gguf_find_tensor(L->m->gguf, name)) return 0;
    eng_matrix qkv, gu;
    int rc = load_matrix(L, name, E, QD + 2 * KD, &qkv);
    if (rc != 0) return rc;
    snprintf(name, sizeof name, "blk.%d.ffn_up.weight", l);
    if ((rc = load_matrix(L, name, E, 2 * F, &gu)) != 0) return rc;
    ly->wq = row_range(&qkv, 0, QD);
    ly->wk = row_range(&qkv, QD, KD);
    ly->wv = row_range(&qkv, QD + KD, KD);
    ly->w_gate = row_range(&gu, 0, F);
    ly->w_up = row_range(&gu, F, F);
    ly->fused = true;
    return 1;
}

/* One tensor of a layer, blk.<l>.<suffix>: a matrix [k -> n] into mat (always required), or (mat NULL) a vector
 * of k floats into vec, absent only when not required. */
typedef struct layer_tensor {
    const char *suffix;
    eng_matrix *mat;
    float **vec;
    int64_t k, n;
    bool required;
} layer_tensor;

/* Loads ts[0..n) of layer l in order; returns 0 or the first error. */
static int load_layer_tensors(loader *L, int l, const layer_tensor *ts, size_t n) {
    char name[96];
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "blk.%d.%s", l, ts[i].suffix);
        int rc = ts[i].mat ? load_matrix(L, name, ts[i].k, ts[i].n, ts[i].mat)
                           : load_vector(L, name, ts[i].k, ts[i].required, ts[i].vec);
        if (rc != 0) return rc;
    }
    return 0;
}

/* The stacked expert tensor blk.<l>.<suffix> ([k, n, n_expert], one [k -> n] matrix per expert) as n_expert
 * matrix views into *out (a new array). */
static int load_experts(loader *L, int l, const char *suffix, int64_t k, int64_t n, eng_matrix **out) {
    const int64_t ne = L->m->hp.n_expert;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", l, suffix);
    int rc = 0;
    const eng_gguf_tensor *t = find_tensor(L, name, true, &rc);
    if (!t) return rc;
    const eng_qtype_info *qi = eng_qtype_get(t->type);
    if (!qi || !qi->supported)
        return kvs_errf(L->err, L->err_len, ENG_ERR_UNSUPPORTED, "%s: tensor %s has unsupported type %s (%u)",
                        L->path, name, qi && qi->name ? qi->name : "unknown", t->type);
    if (t->ne[0] != k || t->ne[1] != n || t->ne[2] != ne || t->ne[3] != 1)
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: tensor %s has dims [%lld, %lld, %lld, %lld], "
                        "expected [%lld, %lld, %lld] (expert_count %lld)", L->path, name, (long long)t->ne[0],
                        (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], (long long)k, (long long)n,
                        (long long)ne, (long long)ne);
    size_t rb = eng_qtype_row_bytes(t->type, k);
    if (rb == 0 || eng_qtype_row_bytes(qi->dot_type, k) == 0)
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: tensor %s: row length %lld does not fit the %s "
                        "block size or its activation format", L->path, name, (long long)k, qi->name);
    if (t->nbytes < rb * (size_t)n * (size_t)ne)
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: tensor %s: %zu bytes, expected %zu", L->path, name,
                        t->nbytes, rb * (size_t)n * (size_t)ne);
    eng_matrix *ms = calloc((size_t)ne, sizeof *ms);
    if (!ms) return kvs_errf(L->err, L->err_len, ENG_ERR_NOMEM, "%s: out of memory", L->path);
    for (int64_t e = 0; e < ne; e++)
        ms[e] = (eng_matrix){(const char *)t->data + (size_t)e * (size_t)n * rb, t->type, qi->dot_type, k, n, rb, NULL};
    L->m->weight_bytes += t->nbytes;
    *out = ms;
    return 0;
}

/* A per-expert bias blk.<l>.<suffix> ([n, n_expert], optional) into *out (n_expert x n floats). */
static int load_expert_bias(loader *L, int l, const char *suffix, int64_t n, float **out) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", l, suffix);
    *out = NULL;
    const eng_gguf_tensor *t = eng_gguf_find_tensor(L->m->gguf, name);
    if (!t) return 0;
    int rc = check_tensor(L, t, name, 2, n, L->m->hp.n_expert);
    if (rc != 0) return rc;
    int64_t total = n * L->m->hp.n_expert;
    float *v = malloc((size_t)total * sizeof *v);
    if (!v) return kvs_errf(L->err, L->err_len, ENG_ERR_NOMEM, "%s: out of memory", L->path);
    if ((rc = eng_dequantize_row(t->type, t->data, v, total)) != 0) {
        free(v);
        return kvs_errf(L->err, L->err_len, rc, "%s: tensor %s: cannot dequantize", L->path, name);
    }
    *out = v;
    return 0;
}

/* Layer l's router and experts (an MoE model). */
static int load_moe(loader *L, int l, eng_layer *ly) {
    const eng_hparams *hp = &L->m->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff_exp, NE = hp->n_expert;
    eng_moe *x = &ly->moe;
    x->act = hp->ffn_act;
    const layer_tensor router[] = {{"ffn_gate_inp.weight", &x->router, NULL, E, NE, true},
                                   {"ffn_gate_inp.bias", NULL, &x->router_b, NE, 0, false}};
    int rc = load_layer_tensors(L, l, router, 2);
    eng_matrix *g = NULL, *u = NULL, *d = NULL; /* set together, so that a layer has all three or none */
    if (rc == 0) rc = load_experts(L, l, "ffn_gate_exps.weight", E, F, &g);
    if (rc == 0) rc = load_experts(L, l, "ffn_up_exps.weight", E, F, &u);
    if (rc == 0) rc = load_experts(L, l, "ffn_down_exps.weight", F, E, &d);
    if (rc != 0) {
        KVS_FREE_ALL(g, u, d);
        return rc;
    }
    x->gate = g;
    x->up = u;
    x->down = d;
    if (rc == 0) rc = load_expert_bias(L, l, "ffn_gate_exps.bias", F, &x->gate_b);
    if (rc == 0) rc = load_expert_bias(L, l, "ffn_up_exps.bias", F, &x->up_b);
    if (rc == 0) rc = load_expert_bias(L, l, "ffn_down_exps.bias", E, &x->down_b);
    /* gpt-oss: the router's and the experts' biases are required (llama.cpp's loader requires them) */
    const char *missing = !x->router_b ? "ffn_gate_inp.bias" : !x->gate_b ? "ffn_gate_exps.bias"
                          : !x->up_b ? "ffn_up_exps.bias" : !x->down_b ? "ffn_down_exps.bias" : NULL;
    if (rc == 0 && hp->arch == ENG_ARCH_GPT_OSS && missing)
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: missing tensor blk.%d.%s (gpt-oss)", L->path, l,
                        missing);
    return rc;
}

/* gpt-oss's own tensors of layer l: attn_sinks [n_head] and attn_output.bias, required as llama.cpp requires them
 * (its pre-FFN norm, post_attention_norm, is loaded as ffn_norm). */
static int load_gpt_oss_layer(loader *L, int l, eng_layer *ly) {
    const eng_hparams *hp = &L->m->hp;
    const layer_tensor ts[] = {{"attn_sinks.weight", NULL, &ly->attn_sinks, hp->n_head, 0, true},
                               {"attn_output.bias", NULL, &ly->bo, hp->n_embd, 0, true}};
    return load_layer_tensors(L, l, ts, 2);
}

static int load_tensors(loader *L) {
    eng_model *m = L->m;
    eng_hparams *hp = &m->hp;
    int rc = 0;
    const eng_gguf_tensor *te = find_tensor(L, "token_embd.weight", true, &rc);
    if (!te) return rc;
    if (te->n_dims != 2 || te->ne[0] != hp->n_embd || te->ne[1] < 1 || te->ne[1] > INT32_MAX)
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: tensor token_embd.weight has dims [%lld, %lld], "
                    "expected [%d, n_vocab]", L->path, (long long)te->ne[0], (long long)te->ne[1], hp->n_embd);
    if (hp->n_vocab > 0 && te->ne[1] != hp->n_vocab)
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: tensor token_embd.weight has %lld rows but the "
                    "vocabulary has %d tokens", L->path, (long long)te->ne[1], hp->n_vocab);
    hp->n_vocab = (int32_t)te->ne[1];
    if (hp->arch >= ENG_ARCH_BERT) return eng_encoder_load(m, L->path, L->err, L->err_len); /* the encoders: 32 on */
    const int64_t E = hp->n_embd, V = hp->n_vocab, HD = hp->head_dim;
    const int64_t QD = (int64_t)hp->n_head * HD, KD = (int64_t)hp->n_head_kv * HD, F = hp->n_ff;
    if ((rc = load_matrix(L, "token_embd.weight", E, V, &m->tok_embd)) != 0) return rc;
    if (hp->arch == ENG_ARCH_GPT_OSS && !eng_gguf_find_tensor(m->gguf, "output.weight"))
        return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: missing tensor output.weight", L->path);
    if (eng_gguf_find_tensor(m->gguf, "output.weight")) {
        if ((rc = load_matrix(L, "output.weight", E, V, &m->output)) != 0) return rc;
        hp->tied_embeddings = false;
    } else {
        m->output = m->tok_embd;
        hp->tied_embeddings = true;
    }
    if ((rc = load_vector(L, "output_norm.weight", E, true, &m->output_norm)) != 0) return rc;
    if ((rc = load_vector(L, "rope_freqs.weight", hp->n_rot / 2, false, &m->rope_freqs)) != 0) return rc;
    if ((rc = load_vector(L, "rope_factors_long.weight", hp->n_rot / 2, false, &m->rope_long)) != 0) return rc;
    if ((rc = load_vector(L, "rope_factors_short.weight", hp->n_rot / 2, false, &m->rope_short)) != 0) return rc;
    const float *factors[] = {m->rope_freqs, m->rope_long, m->rope_short};
    for (int f = 0; f < 3; f++)
        for (int32_t i = 0; factors[f] && i < hp->n_rot / 2; i++)
            if (!(factors[f][i] > 0.0f))
                return kvs_errf(L->err, L->err_len, ENG_ERR_FORMAT, "%s: rope factor %d of %s is not positive",
                            L->path, i, f == 0 ? "rope_freqs" : f == 1 ? "rope_factors_long" : "rope_factors_short");

    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return kvs_errf(L->err, L->err_len, ENG_ERR_NOMEM, "%s: out of memory", L->path);
    bool biases_required = hp->arch == ENG_ARCH_QWEN2;
    bool qk_norm_required = hp->arch == ENG_ARCH_QWEN3 || hp->arch == ENG_ARCH_QWEN3MOE || hp->arch == ENG_ARCH_GEMMA3;
    const bool moe = hp->n_expert > 0;
    bool post_norms = hp->arch == ENG_ARCH_GEMMA3;
    const bool oss = hp->arch == ENG_ARCH_GPT_OSS;
    for (int l = 0; l < hp->n_layer; l++) {
        eng_layer *ly = &m->layers[l];
        const layer_tensor norm[] = {{"attn_norm.weight", NULL, &ly->attn_norm, E, 0, true}};
        if ((rc = load_layer_tensors(L, l, norm, 1)) != 0) return rc;
        int fused = hp->arch == ENG_ARCH_PHI3 ? load_fused(L, l, ly, E, QD, KD, F) : 0;
        if (fused < 0) return fused;
        const layer_tensor unfused[] = {
            {"attn_q.weight", &ly->wq, NULL, E, QD, true},
            {"attn_k.weight", &ly->wk, NULL, E, KD, true},
            {"attn_v.weight", &ly->wv, NULL, E, KD, true},
            {"ffn_gate.weight", &ly->w_gate, NULL, E, F, true},
            {"ffn_up.weight", &ly->w_up, NULL, E, F, true},
        };
        size_t n_unfused = sizeof unfused / sizeof unfused[0] - (moe ? 2 : 0);
        if (!fused && (rc = load_layer_tensors(L, l, unfused, n_unfused)) != 0) return rc;
        const layer_tensor rest[] = {
            {"attn_output.weight", &ly->wo, NULL, QD, E, true},
            {"attn_q.bias", NULL, &ly->bq, QD, 0, biases_required},
            {"attn_k.bias", NULL, &ly->bk, KD, 0, biases_required},
            {"attn_v.bias", NULL, &ly->bv, KD, 0, biases_required},
            {"attn_q_norm.weight", NULL, &ly->q_norm, HD, 0, qk_norm_required},
            {"attn_k_norm.weight", NULL, &ly->k_norm, HD, 0, qk_norm_required},
            /* gpt-oss's pre-FFN norm is named post_attention_norm (not gemma3's norm of the attention output) */
            {oss ? "post_attention_norm.weight" : "ffn_norm.weight", NULL, &ly->ffn_norm, E, 0, true},
            {"post_attention_norm.weight", NULL, &ly->post_attn_norm, E, 0, post_norms},
            {"post_ffw_norm.weight", NULL, &ly->post_ffn_norm, E, 0, post_norms},
            {"ffn_down.weight", &ly->w_down, NULL, F, E, true},
        };
        for (size_t i = 0; i < sizeof rest / sizeof rest[0] - (moe ? 1 : 0) && rc == 0; i++)
            if (post_norms || (rest[i].vec != &ly->post_attn_norm && rest[i].vec != &ly->post_ffn_norm))
                rc = load_layer_tensors(L, l, &rest[i], 1); /* the post-norms: gemma3 only */
        if (rc != 0) return rc;
        /* llama.cpp reads an optional attn_output.bias for llama only (gpt-oss requires it) */
        const layer_tensor out_bias[] = {{"attn_output.bias", NULL, &ly->bo, E, 0, false}};
        if (hp->arch == ENG_ARCH_LLAMA && (rc = load_layer_tensors(L, l, out_bias, 1)) != 0) return rc;
        if (oss && (rc = load_gpt_oss_layer(L, l, ly)) != 0) return rc;
        if (moe && (rc = load_moe(L, l, ly)) != 0) return rc;
    }
    if ((rc = eng_model_family_swa_layers(m, L->path, L->err, L->err_len)) != 0) return rc;
    return eng_rank_head_load(m, L->path, L->err, L->err_len); /* a Qwen3-Reranker's cls.output, if any */
}

static int read_whole_file(const char *path, void **out, size_t *size, char *err, size_t err_len) {
    FILE *f = fopen(path, "rb");
    if (!f) return kvs_errf(err, err_len, ENG_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    int rc = 0;
    void *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len < 0 || fseek(f, 0, SEEK_SET) != 0) {
        rc = kvs_errf(err, err_len, ENG_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    } else if (!(buf = malloc(len > 0 ? (size_t)len : 1))) {
        rc = kvs_errf(err, err_len, ENG_ERR_NOMEM, "%s: out of memory (%ld bytes)", path, len);
    } else if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
        rc = kvs_errf(err, err_len, ENG_ERR_IO, "%s: short read", path);
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *out = buf;
    *size = (size_t)(len > 0 ? len : 0);
    return rc;
}

int eng_model_load(const char *path, const eng_load_params *params, eng_model **out, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!path || !out) return kvs_errf(err, err_len, ENG_ERR_INVALID, "eng_model_load: NULL argument");
    *out = NULL;
    eng_load_params defp;
    if (!params) {
        eng_load_params_default(&defp);
        params = &defp;
    }
    eng_model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        free(m);
        return kvs_errf(err, err_len, ENG_ERR_NOMEM, "%s: out of memory", path);
    }
    pthread_mutex_init(&m->pack_lock, NULL);
    int rc;
    if (params->use_mmap) {
        rc = eng_gguf_open(path, &m->gguf, err, err_len);
    } else {
        size_t size = 0;
        rc = read_whole_file(path, &m->file_buf, &size, err, err_len);
        if (rc == 0) rc = eng_gguf_open_memory(m->file_buf, size, path, &m->gguf, err, err_len);
    }
    if (rc != 0) goto out;
    loader L = {.m = m, .path = path, .err = err, .err_len = err_len};
    m->vocab_only = params->vocab_only;
    if ((rc = load_hparams(&L, params->vocab_only)) != 0) goto out;

    uint32_t et;
    uint64_t n_tokens = 0;
    const void *data;
    const eng_gguf_str *strs;
    if (eng_gguf_get_arr(m->gguf, "tokenizer.ggml.tokens", &et, &n_tokens, &data, &strs) == 0) {
        if (n_tokens > INT32_MAX) {
            rc = kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: too many tokens", path);
            goto out;
        }
        m->hp.n_vocab = (int32_t)n_tokens;
    }
    if ((rc = eng_vocab_load(m->gguf, &m->vocab, err, err_len)) != 0) goto out;

    eng_gguf_str tmpl;
    if (eng_gguf_get_str(m->gguf, "tokenizer.chat_template", &tmpl) == 0) {
        m->chat_template = malloc((size_t)tmpl.len + 1);
        if (!m->chat_template) {
            rc = kvs_errf(err, err_len, ENG_ERR_NOMEM, "%s: out of memory", path);
            goto out;
        }
        memcpy(m->chat_template, tmpl.ptr, (size_t)tmpl.len);
        m->chat_template[tmpl.len] = '\0';
    }
    if (!params->vocab_only) rc = load_tensors(&L);
out:
    if (rc != 0) {
        /* a failure deep inside (an allocation in the vocabulary or the tensor index) may leave no message */
        if (err && err_len && !err[0]) kvs_errf(err, err_len, rc, "%s: %s", path, kvs_strerror(rc));
        eng_model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* Packs one matrix; release: drop the mapped pages of its original rows afterwards. */
static int pack_matrix(eng_model *m, eng_matrix *w, bool release) {
    if (w->packed) return 0;
    size_t bytes = eng_wpack_bytes(w->type, w->n_out, w->k);
    if (bytes == 0) return 0;
    void *p = eng_wpack_alloc(bytes); /* on huge pages when 2 MiB or more */
    if (!p) return ENG_ERR_NOMEM;
    int rc = eng_wpack(w->type, w->data, w->n_out, w->k, p);
    if (rc != 0) {
        free(p);
        return rc == ENG_ERR_NOMEM ? rc : 0;
    }
    w->packed = p;
    long page = sysconf(_SC_PAGESIZE);
    if (release && !m->file_buf && page > 0) {
        uintptr_t a = (uintptr_t)w->data, e = a + w->row_bytes * (size_t)w->n_out;
        uintptr_t pa = (a + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
        uintptr_t pe = e / (uintptr_t)page * (uintptr_t)page;
        if (pe > pa) (void)madvise((void *)pa, pe - pa, MADV_DONTNEED); /* advice only: failure is harmless */
    }
    return 0;
}

/* Packs the n experts of one stacked tensor (set) into one buffer (*buf), expert after expert, each at a multiple of
 * 64 bytes; then drops the mapped pages of the stacked rows. */
static int pack_stack(eng_model *m, eng_matrix *set, int32_t n, void **buf) {
    if (*buf || n < 1 || !set[0].data) return 0;
    const size_t each = eng_wpack_bytes(set[0].type, set[0].n_out, set[0].k), stride = (each + 63) / 64 * 64;
    if (each == 0) return 0;
    if (stride > SIZE_MAX / (size_t)n) return ENG_ERR_NOMEM;
    char *p = eng_wpack_alloc(stride * (size_t)n); /* on huge pages */
    if (!p) return ENG_ERR_NOMEM;
    for (int32_t e = 0; e < n; e++) {
        int rc = eng_wpack(set[e].type, set[e].data, set[e].n_out, set[e].k, p + (size_t)e * stride);
        if (rc != 0) { /* cannot happen for a loaded model (the experts share type and shape); unpacked then */
            for (int32_t i = 0; i < e; i++) set[i].packed = NULL;
            free(p);
            return rc == ENG_ERR_NOMEM ? rc : 0;
        }
        set[e].packed = p + (size_t)e * stride;
    }
    *buf = p;
    long page = sysconf(_SC_PAGESIZE);
    if (!m->file_buf && page > 0) {
        const eng_matrix *last = &set[n - 1];
        uintptr_t a = (uintptr_t)set[0].data, z = (uintptr_t)last->data + last->row_bytes * (size_t)last->n_out;
        uintptr_t pa = (a + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
        uintptr_t pe = z / (uintptr_t)page * (uintptr_t)page;
        if (pe > pa) (void)madvise((void *)pa, pe - pa, MADV_DONTNEED); /* advice only: failure is harmless */
    }
    return 0;
}

int eng_model_pack_cpu(eng_model *m) {
    if (!m || m->vocab_only) return ENG_ERR_INVALID;
    pthread_mutex_lock(&m->pack_lock);
    int rc = 0;
    if (!m->packed) {
        for (int32_t l = 0; l < m->hp.n_layer && rc == 0; l++) {
            eng_layer *ly = &m->layers[l];
            eng_matrix *w; /* matrices 0..7: attention, dense FFN, router; the experts are packed per stack below */
            for (size_t i = 0; rc == 0 && i < 8 && (w = eng_layer_matrix(ly, m->hp.n_expert, i)) != NULL; i++)
                if (w->data && (w != &ly->w_gate || ly->w_gate.data != ly->w_up.data)) /* an encoder's GELU FFN:
                                                                                           w_gate is w_up */
                    rc = pack_matrix(m, w, true);
            eng_matrix *sets[3] = {ly->moe.gate, ly->moe.up, ly->moe.down};
            for (int s = 0; s < 3 && rc == 0 && ly->moe.gate; s++)
                rc = pack_stack(m, sets[s], m->hp.n_expert, &ly->moe.packed_exps[s]);
        }
        /* a tied output shares token_embd's rows: embedding lookups then read the packed copy (eng_model_embd_row),
         * so its mapped pages go as well */
        if (rc == 0) rc = pack_matrix(m, &m->output, true);
        m->packed = rc == 0;
    }
    pthread_mutex_unlock(&m->pack_lock);
    return rc;
}

int eng_model_embd_row(const eng_model *m, int32_t t, float *dst, void *scratch) {
    const eng_matrix *e = &m->tok_embd;
    if (t < 0 || t >= e->n_out) return ENG_ERR_INVALID;
    const void *row = (const char *)e->data + (size_t)t * e->row_bytes;
    if (m->output.packed && m->output.data == e->data) { /* tied and packed: the mapped rows were released */
        int rc = eng_wpack_row(e->type, m->output.packed, e->n_out, e->k, t, scratch);
        if (rc != 0) return rc;
        row = scratch;
    }
    return eng_dequantize_row(e->type, row, dst, e->k);
}

void eng_model_free(eng_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int32_t l = 0; l < m->hp.n_layer; l++) {
            eng_layer *ly = &m->layers[l];
            eng_matrix *w; /* the experts' packed rows are in moe.packed_exps */
            for (size_t i = 0; i < 8 && (w = eng_layer_matrix(ly, m->hp.n_expert, i)) != NULL; i++) free(w->packed);
            for (int s = 0; s < 3; s++) free(ly->moe.packed_exps[s]);
            KVS_FREE_ALL(ly->attn_norm, ly->ffn_norm, ly->bq, ly->bk, ly->bv, ly->q_norm, ly->k_norm,
                         ly->post_attn_norm, ly->post_ffn_norm, ly->bo, ly->attn_sinks, ly->moe.router_b, ly->moe.gate,
                         ly->moe.up, ly->moe.down, ly->moe.gate_b, ly->moe.up_b, ly->moe.down_b);
        }
        free(m->layers);
    }
    free(m->output.packed);
    eng_encoder_free(m->enc, m->hp.n_layer);
    eng_rank_head_free(m->rank);
    pthread_mutex_destroy(&m->pack_lock);
    eng_vocab_free(m->vocab);
    eng_gguf_close(m->gguf);
    KVS_FREE_ALL(m->output_norm, m->rope_freqs, m->rope_long, m->rope_short, m->chat_template, m->file_buf, m->path,
                 m);
}

const eng_hparams *eng_model_hparams(const eng_model *m) { return m ? &m->hp : NULL; }
size_t eng_model_weight_bytes(const eng_model *m) { return m ? m->weight_bytes : 0; }
static size_t matrix_stream_bytes(const eng_matrix *w) {
    size_t pb = w->packed ? eng_wpack_bytes(w->type, w->n_out, w->k) : 0;
    return pb ? pb : w->row_bytes * (size_t)w->n_out;
}

size_t eng_model_decode_bytes(const eng_model *m) {
    if (!m || m->vocab_only || !m->layers) return 0;
    size_t n = matrix_stream_bytes(&m->output), experts = 0;
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const eng_matrix *w;
        for (size_t i = 0; (w = eng_layer_matrix(&m->layers[l], m->hp.n_expert, i)) != NULL; i++)
            if (w->data) *(i >= 8 ? &experts : &n) += matrix_stream_bytes(w);
    }
    /* one token reads n_expert_used of the n_expert experts of each layer */
    return n + (m->hp.n_expert > 0 ? experts / (size_t)m->hp.n_expert * (size_t)m->hp.n_expert_used : 0);
}

eng_matrix *eng_layer_matrix(eng_layer *ly, int32_t n_expert, size_t i) {
    eng_matrix *dense[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w_gate, &ly->w_up, &ly->w_down, &ly->moe.router};
    if (i < 8) return dense[i];
    i -= 8;
    if (!ly->moe.gate || i >= 3 * (size_t)n_expert) return NULL;
    eng_matrix *set = i % 3 == 0 ? ly->moe.gate : i % 3 == 1 ? ly->moe.up : ly->moe.down;
    return &set[i / 3];
}

const char *eng_model_chat_template(const eng_model *m) { return m ? m->chat_template : NULL; }
const struct eng_vocab *eng_model_vocab(const eng_model *m) { return m ? m->vocab : NULL; }
