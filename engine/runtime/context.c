/*
 * context.c: the CPU engine context's life (engine.h: eng_ctx_params_default, eng_ctx_create, eng_ctx_free and
 * the accessors): the KV pool, the rotation frequencies and every scratch buffer of the forward pass
 * (forward.c), allocated once for max_batch_tokens rows. A context on the GPU hands its work to forward_cuda.c.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine/kernels/ops.h"
#include "engine/model/model.h"
#include "engine/runtime/forward_ctx.h"
#include "engine/runtime/encoder_fwd.h"
#include "engine/runtime/kv_pool.h"

void eng_ctx_params_default(eng_ctx_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->n_threads = 0;
    p->n_ctx = 0;
    p->max_seqs = 1;
    p->max_batch_tokens = 512;
    p->kv_block_size = 16;
    p->kv_blocks = 0;
    p->kv_mem_bytes = 0;
    p->kv_dtype = KVC_DTYPE_F16;
    p->prefix_caching = true;
    p->device = ENG_DEVICE_AUTO;
    p->gpu_memory_fraction = 0.9f;
}

static void *zalloc(size_t n, size_t size) {
    if (n == 0) n = 1;
    return calloc(n, size);
}

void eng_ctx_free(eng_ctx *c) {
    if (!c) return;
    eng_encoder_ctx_free(c);
    eng_pool_free(c->pool);
    kvc_free(c->cache);
    eng_cuda_free(c->cuda); /* after the cache, which lives in its device memory */
    KVS_FREE_ALL(c->inv_freq, c->kv_layer, c->kv_in_swa, (void *)c->row_blocks_swa, c->inv_freq_swa, c->entries,
                 c->slots, (void *)c->row_blocks, c->rope_cs, c->rope_cs_swa, c->logit_idx, c->logit_src, c->x,
                 c->x2, c->th_xq, c->th_xn, c->th_embd, c->xn, c->q, c->k, c->v, c->att, c->tmp, c->gate, c->up,
                 c->xq_att, c->xq_ffn, c->th_scores, c->th_q, c->th_o, c->th_work, c->th_kv, c->tile_rows,
                 c->tile_len, c->seq_tile, c->th_units, (void *)c->dyn, c->logits, c->embd, c->embd_rows);
    for (int i = 0; i < MAX_GROUP; i++) free(c->xq[i]);
    eng_fwd_moe_free(c);
    free(c);
}

/* Largest quantized row of any matrix input, and a check that every dot type can be produced. */
static int check_matrix(const eng_matrix *w, size_t *cap) {
    size_t rb = eng_qtype_row_bytes(w->dot_type, w->k);
    if (rb == 0) return ENG_ERR_UNSUPPORTED;
    if (rb > *cap) *cap = rb;
    return 0;
}

/* YaRN's correction dimension of a rotation count (llama.cpp's formula, in its float arithmetic). */
static float yarn_corr_dim(int32_t n_rot, int32_t n_ctx_orig, float n_turns, float base) {
    return (float)n_rot * logf((float)n_ctx_orig / (n_turns * 2.0f * 3.14159265358979323846f)) / (2.0f * logf(base));
}

/* The factor of pair i's angle over base^(-2i/n): s = rope_freq_scale without YaRN; with it, s (1 - r_i) + r_i, r_i
 * the ramp between the correction dimensions of the base (see eng_hparams.rope_yarn_ext): YaRN's mix of the
 * interpolated angle s theta and the extrapolated theta, which is linear in the position. */
static double yarn_mix(const eng_hparams *hp, float base, int32_t i) {
    const float s = hp->rope_freq_scale;
    if (hp->rope_yarn_ext == 0.0f) return s;
    float lo = floorf(yarn_corr_dim(hp->n_rot, hp->n_ctx_orig, hp->rope_yarn_beta_fast, base));
    float hi = ceilf(yarn_corr_dim(hp->n_rot, hp->n_ctx_orig, hp->rope_yarn_beta_slow, base));
    lo = lo > 0.0f ? lo : 0.0f;
    hi = hi < (float)(hp->n_rot - 1) ? hi : (float)(hp->n_rot - 1);
    float y = ((float)i - lo) / (hi - lo > 0.001f ? hi - lo : 0.001f);
    float ramp = (1.0f - (y < 0.0f ? 0.0f : y > 1.0f ? 1.0f : y)) * hp->rope_yarn_ext;
    return (double)s * (1.0 - (double)ramp) + (double)ramp;
}

/* Rotation frequencies of the model, for the global and the sliding-window layers, and the scale of cos and sin
 * (rope_attn_factor, times YaRN's magnitude correction 1 + 0.1 ln(1 / s) when it applies). The frequency factors
 * are rope_freqs, else phi3's long factors for a context longer than n_ctx_orig, else its short ones. */
static int init_rope(eng_ctx *c, const eng_model *model) {
    const eng_hparams *hp = c->hp;
    int32_t half = hp->n_rot / 2;
    c->inv_freq = zalloc((size_t)half, sizeof *c->inv_freq);
    c->inv_freq_swa = zalloc((size_t)half, sizeof *c->inv_freq_swa);
    if (!c->inv_freq || !c->inv_freq_swa) return ENG_ERR_NOMEM;
    c->rope_mscale = hp->rope_attn_factor;
    if (hp->rope_yarn_ext != 0.0f) c->rope_mscale *= 1.0f + 0.1f * logf(1.0f / hp->rope_freq_scale);
    const float *factors = model->rope_freqs ? model->rope_freqs
                           : c->n_ctx > hp->n_ctx_orig ? model->rope_long : model->rope_short;
    for (int32_t i = 0; i < half; i++) {
        double f = yarn_mix(hp, hp->rope_freq_base, i) * pow((double)hp->rope_freq_base, -2.0 * i / hp->n_rot);
        double fs = yarn_mix(hp, hp->rope_freq_base_swa, i) * pow((double)hp->rope_freq_base_swa, -2.0 * i / hp->n_rot);
        if (factors) {
            f /= factors[i];
            fs /= factors[i];
        }
        c->inv_freq[i] = (float)f;
        c->inv_freq_swa[i] = (float)fs;
    }
    return ENG_OK;
}

/* The scratch buffers of a CPU context: ENG_ERR_NOMEM, or ENG_ERR_UNSUPPORTED when a matrix's activation format
 * cannot be produced. */
static int alloc_scratch(eng_ctx *c, const eng_model *model, const eng_ctx_params *p) {
    const eng_hparams *hp = c->hp;
    size_t MB = (size_t)p->max_batch_tokens, E = (size_t)hp->n_embd, F = (size_t)hp->n_ff;
    size_t QD = (size_t)hp->n_head * hp->head_dim, KD = (size_t)hp->n_head_kv * hp->head_dim;
    size_t cap = 0;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const eng_matrix *w;
        for (size_t i = 0; (w = eng_layer_matrix(&model->layers[l], hp->n_expert, i)) != NULL; i++)
            if (w->data && check_matrix(w, &cap) != 0) return ENG_ERR_UNSUPPORTED;
    }
    if (check_matrix(&model->output, &cap) != 0) return ENG_ERR_UNSUPPORTED;
    c->xq_row_cap = (cap + 63) / 64 * 64;
    c->entries = zalloc(MB, sizeof *c->entries);
    c->slots = zalloc(MB, sizeof *c->slots);
    c->row_blocks = zalloc(MB, sizeof *c->row_blocks);
    c->rope_cs = zalloc(MB * (size_t)hp->n_rot, sizeof(float));
    c->rope_cs_swa = zalloc(MB * (size_t)hp->n_rot, sizeof(float));
    if (!c->rope_cs_swa) return ENG_ERR_NOMEM;
    c->logit_idx = zalloc(MB, sizeof *c->logit_idx);
    c->logit_src = zalloc(MB, sizeof *c->logit_src);
    c->x = zalloc(MB * E, sizeof(float));
    c->x2 = zalloc(MB * E, sizeof(float));
    c->th_xq = zalloc((size_t)p->n_threads * MAX_GROUP * SMALL_M, c->xq_row_cap);
    c->th_xn = zalloc((size_t)p->n_threads * SMALL_M * E, sizeof(float));
    c->embd_row_cap = (model->tok_embd.row_bytes + 63) / 64 * 64;
    c->th_embd = zalloc((size_t)p->n_threads, c->embd_row_cap);
    if (!c->x2 || !c->th_xq || !c->th_xn || !c->th_embd) return ENG_ERR_NOMEM;
    c->xn = zalloc(MB * E, sizeof(float));
    c->q = zalloc(MB * QD, sizeof(float));
    c->k = zalloc(MB * KD, sizeof(float));
    c->v = zalloc(MB * KD, sizeof(float));
    c->att = zalloc(MB * QD, sizeof(float));
    c->tmp = zalloc(MB * E, sizeof(float));
    c->gate = zalloc(MB * F, sizeof(float));
    c->up = zalloc(MB * F, sizeof(float));
    for (int i = 0; i < MAX_GROUP; i++) {
        c->xq[i] = zalloc(MB, c->xq_row_cap);
        if (!c->xq[i]) return ENG_ERR_NOMEM;
    }
    c->xq_att = zalloc(MB, c->xq_row_cap);
    c->xq_ffn = zalloc(MB, c->xq_row_cap);
    if (!c->xq_att || !c->xq_ffn) return ENG_ERR_NOMEM;
    size_t T = (size_t)p->n_threads, HD = (size_t)hp->head_dim;
    int32_t G = hp->n_head / hp->n_head_kv;
    size_t q_fit = ATT_SCORES_BYTES / ((size_t)p->n_ctx * sizeof(float));
    c->att_q = q_fit < 1 ? 1 : q_fit < ATT_MAX_Q ? (int32_t)q_fit : ATT_MAX_Q;
    c->grp_max = G < c->att_q ? G : c->att_q;
    c->tile_r = c->att_q / c->grp_max < ATT_MAX_R ? c->att_q / c->grp_max : ATT_MAX_R;
    c->th_scores = zalloc(T * (size_t)c->att_q * (size_t)p->n_ctx, sizeof(float));
    c->th_q = zalloc(T * (size_t)c->att_q * HD, sizeof(float));
    c->th_o = zalloc(T * (size_t)c->att_q * HD, sizeof(float));
    c->th_work = zalloc(T * ENG_ATTN_WORK(HD), sizeof(float));
    c->th_kv = zalloc(T * (size_t)p->kv_block_size * HD, sizeof(float));
    c->tile_rows = zalloc(MB * ATT_MAX_R, sizeof *c->tile_rows);
    c->tile_len = zalloc(MB, sizeof *c->tile_len);
    c->seq_tile = zalloc((size_t)p->max_seqs, sizeof *c->seq_tile);
    c->th_units = zalloc(T + 1, sizeof *c->th_units);
    if (!c->th_q || !c->th_o || !c->th_work || !c->th_kv || !c->tile_rows || !c->tile_len || !c->seq_tile ||
        !c->th_units)
        return ENG_ERR_NOMEM;
    for (int32_t i = 0; i < p->max_seqs; i++) c->seq_tile[i] = -1;
    c->dyn = zalloc((size_t)hp->n_layer * N_DYN + 1, sizeof *c->dyn);
    if (!c->dyn) return ENG_ERR_NOMEM;
    if (eng_fwd_moe_alloc(c) != 0) return ENG_ERR_NOMEM;
    c->logits_cap = p->max_seqs < p->max_batch_tokens ? p->max_seqs : p->max_batch_tokens;
    c->logits = zalloc((size_t)c->logits_cap * (size_t)hp->n_vocab, sizeof(float));
    if (!c->entries || !c->slots || !c->row_blocks || !c->rope_cs || !c->logit_idx || !c->logit_src || !c->x ||
        !c->xn || !c->q || !c->k || !c->v || !c->att || !c->tmp || !c->gate || !c->up || !c->th_scores ||
        !c->logits)
        return ENG_ERR_NOMEM;
    return ENG_OK;
}

int eng_ctx_create(eng_model *model, const eng_ctx_params *params, eng_ctx **out, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!model || !out) return kvs_errf(err, err_len, ENG_ERR_INVALID, "eng_ctx_create: NULL argument");
    *out = NULL;
    if (model->vocab_only)
        return kvs_errf(err, err_len, ENG_ERR_INVALID, "eng_ctx_create: the model was loaded vocab_only");
    eng_ctx_params p;
    if (params) p = *params;
    else eng_ctx_params_default(&p);
    const eng_hparams *hp = &model->hp;
    int cores = eng_cpu_count();
    if (p.n_threads <= 0 || p.n_threads > cores) p.n_threads = cores;
    if (p.n_ctx <= 0) p.n_ctx = hp->n_ctx_train;
    if (p.max_seqs < 1 || p.max_batch_tokens < 1 || p.kv_block_size < 0 || p.kv_blocks < 0)
        return kvs_errf(err, err_len, ENG_ERR_INVALID, "eng_ctx_create: max_seqs and max_batch_tokens must be >= 1");
    if (p.kv_block_size == 0) p.kv_block_size = 16;

    eng_ctx *c = calloc(1, sizeof *c);
    if (!c) return kvs_errf(err, err_len, ENG_ERR_NOMEM, "eng_ctx_create: out of memory");
    c->model = model;
    c->hp = hp;
    c->n_threads = p.n_threads;
    c->n_ctx = p.n_ctx;
    c->max_seqs = p.max_seqs;
    c->max_batch = p.max_batch_tokens;
    c->simd = eng_simd_detect(); /* once per context; every kernel below gets this level */
    c->attn_level = eng_ops_attn_level_for(c->simd);
    eng_smp_kernels_for(&c->smp, c->simd);
    int rc = 0;
    if (model->enc && p.device == ENG_DEVICE_CUDA) {
        free(c);
        return kvs_errf(err, err_len, ENG_ERR_UNSUPPORTED, "eng_ctx_create: encoder models (%s) run on the CPU only",
                        hp->arch_name);
    }
    if (model->enc) {
        p.device = ENG_DEVICE_CPU;  /* AUTO: the encoder forward pass is the CPU's */
        p.prefix_caching = false;   /* its blocks hold no K/V: nothing of a sequence is kept after its request */
    }
    if (p.device != ENG_DEVICE_CPU) {
        rc = eng_cuda_create(model, &p, &c->cuda, &c->cache, err, err_len);
        if (rc != 0 || c->cuda) {
            if (rc != 0) eng_ctx_free(c);
            else *out = c;
            return rc;
        }
    }

    /* The AVX2 and AVX-512 VNNI kernels read matrices repacked 16 rows at a time (quant_kpacked.h). */
    if (c->simd >= ENG_SIMD_AVX2 && eng_model_pack_cpu(model) != 0) {
        eng_ctx_free(c);
        return kvs_errf(err, err_len, ENG_ERR_NOMEM, "eng_ctx_create: out of memory repacking the weights");
    }
    /* The sliding layers of a model that also has global ones keep only their window (unless swa_full). */
    int32_t n_sliding = 0;
    c->kv_layer = zalloc((size_t)hp->n_layer, sizeof *c->kv_layer);
    c->kv_in_swa = zalloc((size_t)hp->n_layer, sizeof *c->kv_in_swa);
    c->row_blocks_swa = zalloc((size_t)p.max_batch_tokens, sizeof *c->row_blocks_swa);
    if (!c->kv_layer || !c->kv_in_swa || !c->row_blocks_swa) {
        eng_ctx_free(c);
        return kvs_errf(err, err_len, ENG_ERR_NOMEM, "eng_ctx_create: out of memory");
    }
    for (int32_t l = 0, n_global = 0; l < hp->n_layer; l++) {
        c->kv_in_swa[l] = hp->n_swa > 0 && !hp->swa_all && !p.swa_full && model->layers[l].swa;
        c->kv_layer[l] = c->kv_in_swa[l] ? n_sliding++ : n_global++;
    }
    rc = eng_kv_pool_create(hp, &p, n_sliding, NULL, 0, &c->cache, err, err_len);
    if (rc != 0) {
        eng_ctx_free(c);
        return rc;
    }
    kvc_get_layout(c->cache, &c->lay);
    if (kvc_swa_group(c->cache)) kvc_get_layout(kvc_swa_group(c->cache), &c->lay_swa);
    rc = init_rope(c, model);
    if (rc == 0) rc = alloc_scratch(c, model, &p);
    if (rc == 0) rc = eng_pool_create(p.n_threads, &c->pool) != 0 ? ENG_ERR_NOMEM : 0;
    if (rc != 0) {
        eng_ctx_free(c);
        if (rc == ENG_ERR_UNSUPPORTED)
            return kvs_errf(err, err_len, rc, "eng_ctx_create: a matrix's activation format is unsupported");
        return kvs_errf(err, err_len, ENG_ERR_NOMEM, "eng_ctx_create: out of memory");
    }
    *out = c;
    return 0;
}

kvc_cache *eng_ctx_cache(eng_ctx *c) { return c ? c->cache : NULL; }
eng_device eng_ctx_device(const eng_ctx *c) { return c && c->cuda ? ENG_DEVICE_CUDA : ENG_DEVICE_CPU; }
int32_t eng_ctx_n_threads(const eng_ctx *c) { return c ? c->n_threads : 0; }
