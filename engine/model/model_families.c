/*
 * model_families.c: the hyper-parameters that differ between model families (gemma3's sliding-window layers,
 * attention scale, embedding scale and logit soft-capping; phi3's context length for its rope factors and
 * LongRoPE's attention factor; the experts of qwen3moe and gpt-oss, gpt-oss's alternating sliding layers). The
 * tensors of each family are loaded by model.c; the forward pass reads the fields set here.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "engine/model/model.h"

/* <arch>.suffix as a float (*out unchanged when absent): 0 or ENG_ERR_FORMAT */
static int arch_float(eng_model *m, const char *suffix, float *out, const char *path, char *err, size_t err_len) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", m->hp.arch_name, suffix);
    int rc = eng_gguf_get_f32(m->gguf, key, out);
    if (rc == ENG_ERR_NOT_FOUND) return 0;
    if (rc != 0) return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: key %s is not a float", path, key);
    return 0;
}

/* <arch>.suffix as a non-negative int32 (*out unchanged when absent): 0 or ENG_ERR_FORMAT */
static int arch_int(eng_model *m, const char *suffix, int32_t *out, const char *path, char *err, size_t err_len) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", m->hp.arch_name, suffix);
    int64_t v;
    int rc = eng_gguf_get_i64(m->gguf, key, &v);
    if (rc == ENG_ERR_NOT_FOUND) return 0;
    if (rc != 0 || v < 0 || v > INT32_MAX)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: key %s is not an integer in [0, 2^31)", path, key);
    *out = (int32_t)v;
    return 0;
}

/* <arch>.rope.scaling.type (llama.cpp's names; "linear" when absent): "none" undoes the scaling factor, "yarn" turns
 * on YaRN's mix, "linear" and "longrope" (phi3's factor sets) change nothing here. 0 or ENG_ERR_FORMAT. */
static int rope_scaling_type(eng_model *m, const char *path, char *err, size_t err_len) {
    eng_hparams *hp = &m->hp;
    char key[160];
    snprintf(key, sizeof key, "%s.rope.scaling.type", hp->arch_name);
    eng_gguf_str s;
    int rc = eng_gguf_get_str(m->gguf, key, &s);
    if (rc == ENG_ERR_NOT_FOUND) return 0;
    if (rc != 0) return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: key %s is not a string", path, key);
    if (s.len == 4 && !memcmp(s.ptr, "none", 4)) hp->rope_freq_scale = 1.0f;
    else if (s.len == 4 && !memcmp(s.ptr, "yarn", 4)) hp->rope_yarn_ext = 1.0f;
    else if (!(s.len == 6 && !memcmp(s.ptr, "linear", 6)) && !(s.len == 8 && !memcmp(s.ptr, "longrope", 8)))
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: %s '%.*s' is not none, linear, yarn or longrope", path, key,
                        (int)(s.len > 64 ? 64 : s.len), s.ptr);
    return 0;
}

/* The expert counts of an MoE family (qwen3moe): expert_count >= 1, 1 <= expert_used_count <= expert_count,
 * expert_feed_forward_length (default feed_forward_length / expert_used_count) >= 1, expert_weights_scale. */
static int moe_hparams(eng_model *m, const char *path, char *err, size_t err_len) {
    eng_hparams *hp = &m->hp;
    const char *a = hp->arch_name;
    int rc;
    if ((rc = arch_int(m, "expert_count", &hp->n_expert, path, err, err_len)) != 0) return rc;
    if ((rc = arch_int(m, "expert_used_count", &hp->n_expert_used, path, err, err_len)) != 0) return rc;
    if (hp->n_expert < 1 || hp->n_expert > ENG_MAX_EXPERTS)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: %s.expert_count is %d: must be in [1, %d]", path, a,
                        hp->n_expert, ENG_MAX_EXPERTS);
    if (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: %s.expert_used_count is %d: must be in [1, "
                        "expert_count %d]", path, a, hp->n_expert_used, hp->n_expert);
    hp->n_ff_exp = hp->n_ff / hp->n_expert_used;
    if ((rc = arch_int(m, "expert_feed_forward_length", &hp->n_ff_exp, path, err, err_len)) != 0) return rc;
    if (hp->n_ff_exp < 1)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: %s.expert_feed_forward_length must be positive", path, a);
    if ((rc = arch_float(m, "expert_weights_scale", &hp->expert_weights_scale, path, err, err_len)) != 0) return rc;
    if (!isfinite(hp->expert_weights_scale) || hp->expert_weights_scale < 0.0f)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: %s.expert_weights_scale must be finite and >= 0", path, a);
    return 0;
}

/* gpt-oss (facts as llama.cpp v0.5.0 reads them): attention.sliding_window (required, > 0) for the sliding layers
 * (every other one, eng_model_family_swa_layers), their rope base rope.freq_base_swa (default rope.freq_base), the
 * expert counts and expert_feed_forward_length (required), expert_weights_scale not read (the weights are not
 * scaled), top-k-then-softmax gating, the clamped SwiGLU (alpha 1.702, limit 7), q.k scaled by 1/sqrt(n_rot). */
static int gpt_oss_hparams(eng_model *m, const char *path, char *err, size_t err_len) {
    eng_hparams *hp = &m->hp;
    int rc;
    hp->n_ff_exp = 0;
    if ((rc = arch_int(m, "attention.sliding_window", &hp->n_swa, path, err, err_len)) != 0) return rc;
    if ((rc = arch_float(m, "rope.freq_base_swa", &hp->rope_freq_base_swa, path, err, err_len)) != 0) return rc;
    if ((rc = arch_int(m, "expert_feed_forward_length", &hp->n_ff_exp, path, err, err_len)) != 0) return rc;
    if (hp->n_swa < 1 || hp->n_ff_exp < 1)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: gpt-oss needs %s.attention.sliding_window and "
                        "%s.expert_feed_forward_length (both positive)", path, hp->arch_name, hp->arch_name);
    if (!(hp->rope_freq_base_swa > 0.0f) || isinf(hp->rope_freq_base_swa))
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: rope.freq_base_swa must be positive", path);
    const int32_t n_ff_exp = hp->n_ff_exp;
    if ((rc = moe_hparams(m, path, err, err_len)) != 0) return rc;
    hp->n_ff_exp = n_ff_exp;
    hp->expert_weights_scale = 0.0f;
    hp->moe_gating = ENG_MOE_SOFTMAX_WEIGHT;
    hp->ffn_act = ENG_ACT_SWIGLU_OAI;
    hp->attn_scale = 1.0f / sqrtf((float)hp->n_rot);
    return 0;
}

int eng_model_family_hparams(eng_model *m, const char *path, char *err, size_t err_len) {
    eng_hparams *hp = &m->hp;
    int rc;
    hp->rope_yarn_ext = 0.0f;
    hp->rope_yarn_beta_fast = 32.0f;
    hp->rope_yarn_beta_slow = 1.0f;
    hp->swiglu_alpha = 1.702f;
    hp->swiglu_limit = 7.0f;
    if ((rc = rope_scaling_type(m, path, err, err_len)) != 0) return rc;
    hp->n_swa = 0;
    hp->rope_freq_base_swa = hp->rope_freq_base;
    hp->n_ctx_orig = hp->n_ctx_train;
    hp->rope_attn_factor = 1.0f;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    hp->embd_scale = 1.0f;
    hp->logit_softcap = 0.0f;
    hp->ffn_act = ENG_ACT_SILU;
    if ((rc = arch_int(m, "rope.scaling.original_context_length", &hp->n_ctx_orig, path, err, err_len)) != 0)
        return rc;
    if ((rc = arch_float(m, "rope.scaling.attn_factor", &hp->rope_attn_factor, path, err, err_len)) != 0) return rc;
    if (!(hp->rope_attn_factor > 0.0f) || isinf(hp->rope_attn_factor))
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: rope.scaling.attn_factor must be positive", path);
    hp->moe_gating = ENG_MOE_SOFTMAX;
    if (hp->arch == ENG_ARCH_QWEN3MOE) return moe_hparams(m, path, err, err_len);
    if (hp->arch == ENG_ARCH_GPT_OSS) return gpt_oss_hparams(m, path, err, err_len);
    if (hp->arch != ENG_ARCH_GEMMA3) return 0;

    /* Gemma 3 (facts as llama.cpp applies them): sliding layers when attention.sliding_window > 0, with their
     * own rope base; q scaled by 1/sqrt(head_dim), or 1/sqrt(n_embd / n_head) for the 62-layer (27B) model;
     * embeddings times sqrt(n_embd); GELU feed-forward; optional final soft-capping. */
    if ((rc = arch_int(m, "attention.sliding_window", &hp->n_swa, path, err, err_len)) != 0) return rc;
    if (hp->n_swa > 0 &&
        (rc = arch_float(m, "rope.freq_base_swa", &hp->rope_freq_base_swa, path, err, err_len)) != 0)
        return rc;
    if (!(hp->rope_freq_base_swa > 0.0f))
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: rope.freq_base_swa must be positive", path);
    if (hp->n_layer == 62) hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->ffn_act = ENG_ACT_GELU_TANH;
    if ((rc = arch_float(m, "final_logit_softcapping", &hp->logit_softcap, path, err, err_len)) != 0) return rc;
    if (!(hp->logit_softcap >= 0.0f) || isinf(hp->logit_softcap))
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: final_logit_softcapping must be >= 0", path);
    return 0;
}

static int swa_layers(eng_model *m, const char *path, char *err, size_t err_len) {
    eng_hparams *hp = &m->hp;
    for (int32_t l = 0; l < hp->n_layer; l++) m->layers[l].swa = false;
    if (hp->n_swa <= 0) return 0;
    char key[160];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", hp->arch_name);
    uint32_t et;
    uint64_t n;
    const void *data;
    const eng_gguf_str *strs;
    if (eng_gguf_get_arr(m->gguf, key, &et, &n, &data, &strs) == 0) {
        if (et != ENG_GGUF_BOOL || n < (uint64_t)hp->n_layer)
            return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: %s must be an array of %d bools", path, key,
                            hp->n_layer);
        for (int32_t l = 0; l < hp->n_layer; l++) m->layers[l].swa = ((const uint8_t *)data)[l] != 0;
        return 0;
    }
    int32_t pattern = m->hp.arch == ENG_ARCH_GPT_OSS ? 2 : 6; /* gpt-oss: even layers slide, odd ones are global */
    int rc = arch_int(m, "attention.sliding_window_pattern", &pattern, path, err, err_len);
    if (rc != 0) return rc;
    for (int32_t l = 0; l < hp->n_layer; l++) m->layers[l].swa = pattern == 0 || l % pattern < pattern - 1;
    return 0;
}

/* hp.swa_all from the layers' flags */
static void set_swa_all(eng_model *m) {
    bool all = m->hp.n_swa > 0;
    for (int32_t l = 0; l < m->hp.n_layer; l++) all = all && m->layers[l].swa;
    m->hp.swa_all = all;
}

int eng_model_family_swa_layers(eng_model *m, const char *path, char *err, size_t err_len) {
    int rc = swa_layers(m, path, err, err_len);
    if (rc == 0) set_swa_all(m);
    return rc;
}
