/* engine_ops.c: srv_engine_ops over the real engine (engine/engine.h). */
#include "server/sched/sched.h"

#include <stdlib.h>

typedef struct {
    const eng_model *model;
    eng_ctx *ctx;
} real_engine;

static kvc_cache *re_cache(void *p) { return eng_ctx_cache(((real_engine *)p)->ctx); }
static int re_decode(void *p, const eng_batch *b) { return eng_decode(((real_engine *)p)->ctx, b); }
static float *re_logits(void *p, int32_t i) { return eng_get_logits(((real_engine *)p)->ctx, i); }
static float *re_embd(void *p, int32_t i) { return eng_get_embeddings(((real_engine *)p)->ctx, i); }
static float *re_rank(void *p, int32_t i) { return eng_get_rank(((real_engine *)p)->ctx, i); }
static bool re_eog(void *p, int32_t t) { return eng_token_is_eog(((real_engine *)p)->model, t); }
static int re_seq_remove(void *p, int32_t seq, int32_t begin, int32_t end) {
    return eng_seq_remove(((real_engine *)p)->ctx, seq, begin, end);
}
static int re_push(void *p, eng_detok *d, int32_t t, char *buf, size_t cap, size_t *n) {
    return eng_detok_push(((real_engine *)p)->model, d, t, false, buf, cap, n);
}
static int re_push_special(void *p, eng_detok *d, int32_t t, char *buf, size_t cap, size_t *n) {
    return eng_detok_push(((real_engine *)p)->model, d, t, true, buf, cap, n);
}
static int re_flush(void *p, eng_detok *d, char *buf, size_t cap, size_t *n) {
    (void)p;
    return eng_detok_flush(d, buf, cap, n);
}
static int re_sampler_create(void *p, const eng_sampling_params *sp, void **out) {
    const eng_hparams *hp = eng_model_hparams(((real_engine *)p)->model);
    eng_sampler *s = NULL;
    int rc = eng_sampler_create(sp, hp->n_vocab, &s);
    *out = s;
    return rc;
}
static void re_sampler_free(void *p, void *s) {
    (void)p;
    eng_sampler_free(s);
}
static void re_accept(void *p, void *s, int32_t token) {
    (void)p;
    eng_sampler_accept(s, token);
}
static int re_sample(void *p, void *s, float *logits, eng_sample *out) {
    (void)p;
    return eng_sampler_sample(s, logits, out);
}

/* The wrapper state (model + context) is allocated here, stored in out->ctx and released by
 * srv_engine_ops_release. */
int srv_engine_ops_init(srv_engine_ops *out, const eng_model *model, eng_ctx *ctx) {
    if (!out || !model || !ctx) return SRV_SCHED_ERR_INVALID;
    real_engine *re = malloc(sizeof *re);
    if (!re) return SRV_SCHED_ERR_NOMEM;
    re->model = model;
    re->ctx = ctx;
    out->ctx = re;
    out->n_vocab = eng_model_hparams(model)->n_vocab;
    out->cache = re_cache;
    out->decode = re_decode;
    out->get_logits = re_logits;
    out->token_is_eog = re_eog;
    out->detok_push = re_push;
    out->detok_push_special = re_push_special;
    out->detok_flush = re_flush;
    out->sampler_create = re_sampler_create;
    out->sampler_free = re_sampler_free;
    out->sampler_sample = re_sample;
    out->sampler_accept = re_accept;
    /* hidden states come from the CPU forward pass only (eng_get_embeddings) */
    out->get_embd = eng_ctx_device(ctx) == ENG_DEVICE_CPU ? re_embd : NULL;
    out->n_embd = eng_model_hparams(model)->n_embd;
    out->whole_prompts = eng_model_is_encoder(model); /* bidirectional attention: a prompt runs whole */
    out->n_rank = eng_model_n_cls_out(model);
    out->get_rank = out->n_rank > 0 && out->get_embd ? re_rank : NULL;
    out->rank_last = eng_model_rank_last(model); /* a decoder reranker: causal, the last row has seen the pair */
    out->seq_remove = re_seq_remove; /* the context shift (CPU and CUDA contexts both re-rotate) */
    return SRV_SCHED_OK;
}

void srv_engine_ops_release(srv_engine_ops *ops) {
    if (!ops) return;
    free(ops->ctx);
    ops->ctx = NULL;
}
