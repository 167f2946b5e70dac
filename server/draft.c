/* draft.c: the draft model of speculative decoding: spec_type resolved, the model loaded, its vocabulary checked
 * (see draft_internal.h). */
#include "server/draft_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

srv_sched_spec_type srv_draft_spec_type(const srv_config *cfg) {
    if (!strcmp(cfg->spec_type, "ngram")) return SRV_SCHED_SPEC_NGRAM;
    if (!strcmp(cfg->spec_type, "draft")) return SRV_SCHED_SPEC_DRAFT;
    if (!cfg->spec_type[0] && cfg->model_draft[0]) return SRV_SCHED_SPEC_DRAFT;
    return SRV_SCHED_SPEC_NONE;
}

int srv_draft_check_vocab(const eng_model *model, const eng_model *draft, const char *draft_path, char *err,
                          size_t err_len) {
    int32_t t = -1, nv = eng_model_hparams(model)->n_vocab, nd = eng_model_hparams(draft)->n_vocab;
    int rc = eng_vocab_compare(model, draft, &t);
    if (rc == ENG_ERR_NOMEM) snprintf(err, err_len, "draft model '%s': out of memory", draft_path);
    if (rc != ENG_ERR_INVALID) return rc;
    if (nv != nd) {
        snprintf(err, err_len, "draft model '%s': its vocabulary has %d tokens, the model's %d (a draft model needs "
                 "the model's vocabulary)", draft_path, (int)nd, (int)nv);
        return KVS_ERR_INVALID;
    }
    char a[64] = "", b[64] = "";
    size_t na = 0, nb = 0;
    if (eng_token_to_piece(model, t, true, a, sizeof a, &na) != ENG_OK) na = 0;
    if (eng_token_to_piece(draft, t, true, b, sizeof b, &nb) != ENG_OK) nb = 0;
    snprintf(err, err_len, "draft model '%s': its vocabulary differs from the model's: token %d is '%.*s' there, "
             "'%.*s' in the model", draft_path, (int)t, (int)(nb < sizeof b ? nb : 0), b, (int)(na < sizeof a ? na : 0), a);
    return KVS_ERR_INVALID;
}

static kvc_dtype dtype_of(const char *s) {
    return !strcmp(s, "f32") ? KVC_DTYPE_F32 : !strcmp(s, "q8_0") ? KVC_DTYPE_Q8_0 : KVC_DTYPE_F16;
}

int srv_draft_open(const srv_config *cfg, const eng_model *model, int32_t n_ctx, srv_draft *out, char *err,
                   size_t err_len) {
    srv_draft d;
    memset(&d, 0, sizeof d);
    err[0] = 0;
    eng_load_params lp;
    eng_load_params_default(&lp);
    char sub[768] = "";
    int rc = eng_model_load(cfg->model_draft, &lp, &d.model, sub, sizeof sub);
    if (rc != 0) {
        snprintf(err, err_len, "draft model: %s", sub[0] ? sub : kvs_strerror(rc));
        return rc;
    }
    rc = srv_draft_check_vocab(model, d.model, cfg->model_draft, err, err_len);
    if (rc == 0) {
        eng_ctx_params cp;
        eng_ctx_params_default(&cp);
        cp.n_threads = cfg->threads;
        cp.n_ctx = n_ctx;
        cp.max_seqs = cfg->parallel;
        cp.max_batch_tokens = cfg->batch_tokens;
        cp.kv_block_size = cfg->block_size;
        cp.kv_dtype = dtype_of(cfg->kv_dtype);
        cp.prefix_caching = false; /* the scheduler never attaches a draft prefix */
        cp.device = !strcmp(cfg->device, "cpu") ? ENG_DEVICE_CPU : !strcmp(cfg->device, "cuda") ? ENG_DEVICE_CUDA
                                                                                          : ENG_DEVICE_AUTO;
        cp.gpu_memory_fraction = (float)cfg->gpu_memory_fraction;
        rc = eng_ctx_create(d.model, &cp, &d.ctx, sub, sizeof sub);
        if (rc != 0) snprintf(err, err_len, "draft model '%s': %s", cfg->model_draft, sub[0] ? sub : kvs_strerror(rc));
    }
    if (rc == 0) {
        rc = srv_engine_ops_init(&d.ops, d.model, d.ctx);
        d.have_ops = rc == 0;
        if (rc != 0) snprintf(err, err_len, "draft model '%s': %s", cfg->model_draft, kvs_strerror(rc));
    }
    if (rc != 0) {
        srv_draft_close(&d);
        return rc;
    }
    *out = d;
    return 0;
}

void srv_draft_close(srv_draft *d) {
    if (!d) return;
    if (d->have_ops) srv_engine_ops_release(&d->ops);
    eng_ctx_free(d->ctx);
    eng_model_free(d->model);
    memset(d, 0, sizeof *d);
}
