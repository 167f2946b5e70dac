/*
 * forward_cuda.c: the GPU path of an engine context (see forward_cuda.h). The cuda/ backend runs the forward
 * pass; this file owns the bookkeeping around it: the model description handed to the backend, the KV cache
 * created in device memory through the backend's allocator, batch validation and marshalling (the distinct
 * sequences of a batch, their block tables including the pending batch, the rows that want logits), and
 * context-shift re-rotation.
 */
#include "engine/runtime/forward_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine/gpu_backend.h"
#include "engine/runtime/kv_pool.h"
#include "engine/runtime/batch.h"
#include "engine/model/model.h"

struct eng_cuda {
    cud_backend *be;
    char name[256];            /* the GPU's name */
    int32_t n_vocab, n_ctx, max_batch, max_seqs, block_size;

    /* per-batch bookkeeping, [max_batch] each unless noted */
    kvc_entry *entries;
    int32_t *slots;
    int32_t *seq_index;        /* row -> index into the batch's sequence list */
    int32_t *seq_map;          /* [max_seqs] sequence id -> index in this batch, -1 when absent */
    int32_t *seq_ids;          /* [max_batch] the batch's sequences in order of first appearance */
    const int32_t **tables;    /* [max_batch] their block tables */
    int32_t *n_blocks;         /* [max_batch] */
    int32_t *seq_len;          /* [max_batch] lengths including the batch */
    int32_t *out_rows;         /* [max_batch] rows that want logits, ascending */
    int32_t *logit_idx;        /* [max_batch] row -> logits row, or -1 */
    int32_t *shift_slots;      /* [n_ctx] slots of the keys a context shift moved */

    float *logits;             /* [logits_cap][n_vocab] */
    int32_t logits_cap;
    int32_t last_n;            /* rows of the last successful decode (0 after a failure) */
};

static cud_tensor mat_tensor(const eng_matrix *m) {
    cud_tensor t = {0};
    if (!m->data) return t;
    t.data = m->data;
    t.nbytes = m->row_bytes * (size_t)m->n_out;
    t.type = m->type;
    t.ne0 = m->k;
    t.ne1 = m->n_out;
    return t;
}

static cud_tensor vec_tensor(const float *v, int64_t n) {
    cud_tensor t = {0};
    if (!v) return t;
    t.data = v;
    t.nbytes = (size_t)n * sizeof(float);
    t.type = 0; /* F32 */
    t.ne0 = n;
    t.ne1 = 1;
    return t;
}

void eng_cuda_free(eng_cuda *g) {
    if (!g) return;
    cud_backend_free(g->be);
    KVS_FREE_ALL(g->entries, g->slots, g->seq_index, g->seq_map, g->seq_ids, g->tables, g->n_blocks, g->seq_len,
                 g->out_rows, g->logit_idx, g->shift_slots, g->logits, g);
}

/* Which device a context gets: 1 = CUDA, 0 = the CPU (device cpu, or auto without a usable device), or an
 * error (err gets a message). name receives the GPU's name. */
static int pick_device(const eng_ctx_params *p, char *name, size_t name_len, char *err, size_t err_len) {
    if (p->device == ENG_DEVICE_CPU) return 0;
    if (p->device != ENG_DEVICE_AUTO && p->device != ENG_DEVICE_CUDA)
        return kvs_errf(err, err_len, ENG_ERR_INVALID, "eng_ctx_create: unknown device");
    char why[256];
    if (cud_available_why(name, name_len, why, sizeof why) < 1) {
        if (p->device == ENG_DEVICE_AUTO) return 0;
#ifdef KVSERVE_HAVE_CUDA
        return kvs_errf(err, err_len, ENG_ERR_DEVICE, "eng_ctx_create: device cuda: no CUDA device found (%s)", why);
#else
        return kvs_errf(err, err_len, ENG_ERR_UNSUPPORTED,
                        "eng_ctx_create: device cuda: this kvserve was built without CUDA (KVSERVE_CUDA=OFF or no "
                        "nvcc)");
#endif
    }
    if (p->kv_dtype != KVC_DTYPE_F16 && p->kv_dtype != KVC_DTYPE_F32)
        return kvs_errf(err, err_len, ENG_ERR_UNSUPPORTED,
                        "eng_ctx_create: the GPU KV cache supports f16 and f32 (use one of them, or device cpu)");
    if (!(p->gpu_memory_fraction > 0.0f && p->gpu_memory_fraction <= 1.0f))
        return kvs_errf(err, err_len, ENG_ERR_INVALID, "eng_ctx_create: gpu_memory_fraction must be in (0, 1]");
    if (p->max_batch_tokens > 65535)
        return kvs_errf(err, err_len, ENG_ERR_INVALID, "eng_ctx_create: max_batch_tokens above 65535 on CUDA");
    return 1;
}

/* Whether a layer has a part the CUDA kernels lack: gemma3's post norms, attn_output biases, attention sinks. */
static bool cpu_only_layers(const eng_model *model) {
    for (int32_t l = 0; model->layers && l < model->hp.n_layer; l++) {
        const eng_layer *ly = &model->layers[l];
        if (ly->post_attn_norm || ly->bo || ly->attn_sinks) return true;
    }
    return false;
}

/* The model description (host pointers into the mapping and the model's f32 vectors) handed to
 * cud_backend_create, which uploads it. *budget receives the device bytes left for the KV pool; berr the
 * backend's message. */
static int create_backend(eng_cuda *g, const eng_model *model, const eng_ctx_params *p, size_t *budget,
                          char *berr, size_t berr_len) {
    const eng_hparams *hp = &model->hp;
    /* the CUDA kernels do not have gemma3's sliding windows, post norms, GELU, scales or soft-capping, nor
     * phi3's long/short rope factors and attention factor, nor YaRN, attn_output biases, attention sinks, the
     * clamped SwiGLU (ffn_act) or experts: such a model runs on the CPU (AUTO) or is refused */
    if (hp->n_swa > 0 || hp->ffn_act != ENG_ACT_SILU || hp->embd_scale != 1.0f || hp->logit_softcap > 0.0f ||
        hp->attn_scale != 1.0f / sqrtf((float)hp->head_dim) || model->rope_long || model->rope_short ||
        hp->rope_attn_factor != 1.0f || hp->rope_yarn_ext != 0.0f || hp->n_expert > 0 || cpu_only_layers(model))
        return kvs_errf(berr, berr_len, ENG_ERR_UNSUPPORTED, "the %s family is not supported by the CUDA backend",
                        hp->arch_name);
    cud_layer_desc *layers = calloc((size_t)hp->n_layer, sizeof *layers);
    if (!layers) return kvs_errf(berr, berr_len, ENG_ERR_NOMEM, "out of host memory");
    const int64_t E = hp->n_embd, QD = (int64_t)hp->n_head * hp->head_dim, KD = (int64_t)hp->n_head_kv * hp->head_dim;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const eng_layer *ly = &model->layers[l];
        cud_layer_desc *d = &layers[l];
        d->attn_norm = vec_tensor(ly->attn_norm, E);
        d->wq = mat_tensor(&ly->wq);
        d->wk = mat_tensor(&ly->wk);
        d->wv = mat_tensor(&ly->wv);
        d->wo = mat_tensor(&ly->wo);
        d->bq = vec_tensor(ly->bq, QD);
        d->bk = vec_tensor(ly->bk, KD);
        d->bv = vec_tensor(ly->bv, KD);
        d->q_norm = vec_tensor(ly->q_norm, hp->head_dim);
        d->k_norm = vec_tensor(ly->k_norm, hp->head_dim);
        d->ffn_norm = vec_tensor(ly->ffn_norm, E);
        d->w_gate = mat_tensor(&ly->w_gate);
        d->w_up = mat_tensor(&ly->w_up);
        d->w_down = mat_tensor(&ly->w_down);
    }
    cud_model_desc md = {
        .n_vocab = hp->n_vocab, .n_embd = hp->n_embd, .n_layer = hp->n_layer, .n_head = hp->n_head,
        .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim, .n_ff = hp->n_ff, .n_rot = hp->n_rot,
        .rope_freq_base = hp->rope_freq_base, .rope_freq_scale = hp->rope_freq_scale, .rms_eps = hp->rms_eps,
        .neox_rope = hp->neox_rope,
        .tok_embd = mat_tensor(&model->tok_embd),
        .output_norm = vec_tensor(model->output_norm, E),
        .output = mat_tensor(&model->output),
        .rope_freqs = vec_tensor(model->rope_freqs, hp->n_rot / 2),
        .layers = layers,
    };
    const char *graphs_env = getenv("KVSERVE_CUDA_GRAPHS"); /* "0": no CUDA graphs (debugging) */
    cud_params cp = {
        .device = 0,
        .memory_fraction = p->gpu_memory_fraction,
        .max_batch_tokens = p->max_batch_tokens,
        .max_seqs = p->max_seqs,
        .max_blocks_per_seq = (p->n_ctx + p->kv_block_size - 1) / p->kv_block_size,
        .block_size = p->kv_block_size,
        .kv_dtype = p->kv_dtype,
        .use_graphs = !(graphs_env && strcmp(graphs_env, "0") == 0),
    };
    int rc = cud_backend_create(&md, &cp, &g->be, budget, berr, berr_len);
    free(layers);
    return rc;
}

/* The per-batch bookkeeping arrays. */
static int alloc_batch_state(eng_cuda *g, const eng_ctx_params *p, int32_t n_vocab) {
    size_t MB = (size_t)p->max_batch_tokens;
    g->entries = calloc(MB, sizeof *g->entries);
    g->slots = calloc(MB, sizeof *g->slots);
    g->seq_index = calloc(MB, sizeof *g->seq_index);
    g->seq_map = malloc((size_t)p->max_seqs * sizeof *g->seq_map);
    g->seq_ids = calloc(MB, sizeof *g->seq_ids);
    g->tables = calloc(MB, sizeof *g->tables);
    g->n_blocks = calloc(MB, sizeof *g->n_blocks);
    g->seq_len = calloc(MB, sizeof *g->seq_len);
    g->out_rows = calloc(MB, sizeof *g->out_rows);
    g->logit_idx = calloc(MB, sizeof *g->logit_idx);
    g->shift_slots = calloc((size_t)p->n_ctx, sizeof *g->shift_slots);
    g->logits_cap = p->max_seqs < p->max_batch_tokens ? p->max_seqs : p->max_batch_tokens;
    g->logits = calloc((size_t)g->logits_cap * (size_t)n_vocab, sizeof(float));
    if (!g->entries || !g->slots || !g->seq_index || !g->seq_map || !g->seq_ids || !g->tables || !g->n_blocks ||
        !g->seq_len || !g->out_rows || !g->logit_idx || !g->shift_slots || !g->logits) {
        return ENG_ERR_NOMEM;
    }
    for (int32_t s = 0; s < p->max_seqs; s++) g->seq_map[s] = -1;
    return ENG_OK;
}

int eng_cuda_create(const eng_model *model, const eng_ctx_params *p, eng_cuda **out, kvc_cache **cache_out,
                    char *err, size_t err_len) {
    if (!model || !p || !out || !cache_out)
        return kvs_errf(err, err_len, ENG_ERR_INVALID, "eng_ctx_create: NULL argument");
    *out = NULL;
    char name[256];
    int rc = pick_device(p, name, sizeof name, err, err_len);
    if (rc <= 0) return rc;

    const eng_hparams *hp = &model->hp;
    eng_cuda *g = calloc(1, sizeof *g);
    if (!g) return kvs_errf(err, err_len, ENG_ERR_NOMEM, "eng_ctx_create: out of memory");
    snprintf(g->name, sizeof g->name, "%s", name);
    g->n_vocab = hp->n_vocab;
    g->n_ctx = p->n_ctx;
    g->max_batch = p->max_batch_tokens;
    g->max_seqs = p->max_seqs;
    g->block_size = p->kv_block_size;

    size_t budget = 0;
    char berr[512] = "";
    rc = create_backend(g, model, p, &budget, berr, sizeof berr);
    if (rc != 0) {
        eng_cuda_free(g);
        if ((rc == ENG_ERR_UNSUPPORTED || rc == ENG_ERR_NOMEM) && p->device == ENG_DEVICE_AUTO) {
            /* a model the kernels cannot run (tensor type, head size) or that does not fit: AUTO runs it on
             * the CPU */
            fprintf(stderr, "kvserve: the CUDA backend cannot run this model (%s); using the CPU\n", berr);
            return ENG_OK;
        }
        return kvs_errf(err, err_len, rc, "eng_ctx_create: CUDA backend (%s): %s", name, berr);
    }

    /* KV pool in device memory: kv_blocks, else kv_mem_bytes (within the device budget), else the device
     * budget, capped at four times what max_seqs full-length sequences need (room for cached prefixes beyond
     * the live ones, without host bookkeeping for millions of blocks of a tiny model). */
    kvc_cache *cache = NULL;
    rc = eng_kv_pool_create(hp, p, 0, cud_kv_allocator(g->be), budget, &cache, err, err_len);
    if (rc != 0) {
        eng_cuda_free(g);
        return rc;
    }
    kvc_layout lay;
    kvc_get_layout(cache, &lay);
    rc = cud_backend_set_kv(g->be, &lay);
    if (rc != 0) {
        kvc_free(cache);
        eng_cuda_free(g);
        return kvs_errf(err, err_len, rc, "eng_ctx_create: the CUDA backend rejected the KV layout");
    }
    if (alloc_batch_state(g, p, hp->n_vocab) != 0) {
        kvc_free(cache);
        eng_cuda_free(g);
        return kvs_errf(err, err_len, ENG_ERR_NOMEM, "eng_ctx_create: out of memory");
    }
    *cache_out = cache;
    *out = g;
    return ENG_OK;
}

const char *eng_cuda_device_name(const eng_cuda *g) { return g ? g->name : ""; }

int eng_cuda_decode(eng_cuda *g, kvc_cache *cache, const eng_batch *b) {
    if (!g || !cache || !b) return ENG_ERR_INVALID;
    g->last_n = 0;
    int32_t n_out = 0;
    int rc = eng_batch_map(b, g->max_batch, g->n_vocab, g->entries, g->logit_idx, g->out_rows, &n_out, &g->logits,
                           &g->logits_cap);
    if (rc != 0) return rc;
    rc = kvc_start_forward(cache, g->entries, b->n, g->slots);
    if (rc != 0) return eng_kv_err(rc);
    /* The batch's distinct sequences (ids were validated by kvc_start_forward) and their block tables,
     * which include the pending batch. */
    int32_t n_seqs = 0;
    for (int32_t i = 0; i < b->n; i++) {
        int32_t s = b->seq[i];
        if (s < 0 || s >= g->max_seqs) {
            rc = ENG_ERR_KV;
            break;
        }
        if (g->seq_map[s] < 0) {
            int32_t len;
            rc = kvc_block_table(cache, s, &g->tables[n_seqs], &g->n_blocks[n_seqs], &len);
            if (rc != 0) {
                rc = eng_kv_err(rc);
                break;
            }
            g->seq_ids[n_seqs] = s;
            g->seq_len[n_seqs] = len;
            g->seq_map[s] = n_seqs++;
        }
        int32_t si = g->seq_map[s];
        if (b->pos[i] >= g->seq_len[si] || b->pos[i] >= g->n_ctx) {
            rc = ENG_ERR_KV;
            break;
        }
        g->seq_index[i] = si;
    }
    for (int32_t s = 0; s < n_seqs; s++) g->seq_map[g->seq_ids[s]] = -1;
    if (rc == 0) {
        cud_batch cb = {
            .n = b->n, .token = b->token, .pos = b->pos, .seq_index = g->seq_index, .slot = g->slots,
            .n_seqs = n_seqs, .seq_len = g->seq_len, .block_tables = g->tables, .n_blocks = g->n_blocks,
            .n_out = n_out, .out_rows = g->out_rows,
        };
        rc = cud_forward(g->be, &cb, g->logits);
    }
    int frc = kvc_finish_forward(cache, rc == 0);
    if (rc != 0) return rc;
    if (frc != 0) return eng_kv_err(frc);
    g->last_n = b->n;
    return ENG_OK;
}

float *eng_cuda_get_logits(eng_cuda *g, int32_t i) {
    if (!g || i < 0 || i >= g->last_n || g->logit_idx[i] < 0) return NULL;
    return g->logits + (size_t)g->logit_idx[i] * (size_t)g->n_vocab;
}

int eng_cuda_seq_remove(eng_cuda *g, kvc_cache *cache, int32_t seq, int32_t begin, int32_t end) {
    if (!g || !cache) return ENG_ERR_INVALID;
    kvc_shift sh = {0};
    int rc = kvc_remove(cache, seq, begin, end, &sh);
    if (rc == KVC_ERR_NOT_SUPPORTED) return ENG_ERR_UNSUPPORTED;
    if (rc == KVC_ERR_BAD_SEQ) return ENG_ERR_INVALID;
    if (rc != 0) return eng_kv_err(rc);
    if (sh.n <= 0 || sh.delta == 0) return ENG_OK;
    /* Context shift: the keys now at [sh.pos, sh.pos + sh.n) were rotated for positions delta further on;
     * one more rotation by delta * theta puts them right. */
    const int32_t *blocks;
    int32_t nb, len;
    if (kvc_block_table(cache, seq, &blocks, &nb, &len) != 0) return ENG_ERR_KV;
    int32_t n = 0;
    for (int32_t p = sh.pos; p < sh.pos + sh.n && p < len && n < g->n_ctx; p++)
        g->shift_slots[n++] = blocks[p / g->block_size] * g->block_size + p % g->block_size;
    return cud_rerotate(g->be, g->shift_slots, n, sh.delta);
}
