/* helper_vocab.c: see helper_vocab.h. */
#include "helper_vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "server/grammar_cache.h"

int kvt_load_vocab(const char *gguf_path, gmr_vocab **out, char *err, size_t err_len) {
    *out = NULL;
    eng_load_params lp;
    eng_load_params_default(&lp);
    lp.vocab_only = true;
    eng_model *model = NULL;
    int rc = eng_model_load(gguf_path, &lp, &model, err, err_len);
    if (rc) return rc;
    rc = srv_gcache_vocab_from_model(model, out); /* the server's own index: tests and bench see what it serves */
    if (rc) snprintf(err, err_len, "%s: cannot build the vocabulary (%d)", gguf_path, rc);
    eng_model_free(model);
    return rc;
}
