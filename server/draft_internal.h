/*
 * draft_internal.h: the draft model of speculative decoding (server/draft.c, prefix srv_draft_; private to server/'s
 * top, used by serve.c): the configuration's spec_type resolved, the draft model loaded with its own engine context
 * (its own KV pool: see server/sched/sched.h, "Speculative decoding") and its vocabulary checked against the model's.
 */
#ifndef KVSERVE_SERVER_DRAFT_INTERNAL_H
#define KVSERVE_SERVER_DRAFT_INTERNAL_H

#include <stddef.h>

#include "engine/engine.h"
#include "server/sched/sched.h"
#include "server/server.h"

typedef struct srv_draft {
    eng_model *model;   /* owned */
    eng_ctx *ctx;       /* owned */
    srv_engine_ops ops; /* over model and ctx; what srv_sched_params.draft points to */
    bool have_ops;
} srv_draft;

/* The proposer cfg asks for: spec_type, or when it is "" SRV_SCHED_SPEC_DRAFT with a model_draft, else NONE. */
srv_sched_spec_type srv_draft_spec_type(const srv_config *cfg);

/* Whether two models' vocabularies are the same: the same number of tokens and every token the same text (special
 * tokens' texts included). 0 when they are; KVS_ERR_INVALID with a message naming draft_path, the first token that
 * differs and both texts; KVS_ERR_NOMEM. */
int srv_draft_check_vocab(const eng_model *model, const eng_model *draft, const char *draft_path, char *err,
                          size_t err_len);

/* Loads cfg->model_draft, checks its vocabulary against `model` and creates its context for n_ctx tokens and
 * cfg->parallel sequences (cfg's threads, batch_tokens, block size, KV type and device; its KV pool from the
 * engine's default rule). *out is filled only on success (release it with srv_draft_close after srv_sched_free).
 * Errors, with a message naming the file in err: the loader's and the context's codes, KVS_ERR_INVALID (another
 * vocabulary), KVS_ERR_NOMEM. Off the loop thread (reads the file). */
int srv_draft_open(const srv_config *cfg, const eng_model *model, int32_t n_ctx, srv_draft *out, char *err,
                   size_t err_len);
void srv_draft_close(srv_draft *d); /* a zeroed or closed srv_draft is a no-op */

#endif
