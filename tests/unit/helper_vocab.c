/* helper_vocab.c: see helper_vocab.h. */
#include "helper_vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "server/api/grammar_cache_internal.h"

void kvt_pieces_free(kvt_pieces *p) {
    if (!p) return;
    for (int32_t t = 0; p->pieces && t < p->n; t++) free(p->pieces[t]);
    free(p->pieces);
    free(p->lens);
    free(p->flags);
    memset(p, 0, sizeof *p);
}

static int fill_pieces(const eng_model *model, kvt_pieces *p) {
    int32_t n = eng_model_hparams(model)->n_vocab;
    p->n = n;
    p->pieces = calloc((size_t)n, sizeof *p->pieces);
    p->lens = calloc((size_t)n, sizeof *p->lens);
    p->flags = calloc((size_t)n, 1);
    if (!p->pieces || !p->lens || !p->flags) return KVS_ERR_NOMEM;
    for (int32_t t = 0; t < n; t++) {
        char buf[1100];
        int rc = eng_token_to_piece(model, t, false, buf, sizeof buf, &p->lens[t]);
        if (rc) return rc;
        if (!(p->pieces[t] = malloc(p->lens[t] + 1))) return KVS_ERR_NOMEM;
        memcpy(p->pieces[t], buf, p->lens[t]);
        p->pieces[t][p->lens[t]] = 0;
        p->flags[t] = (uint8_t)((eng_token_is_eog(model, t) ? GMR_TOKEN_EOG : 0) |
                                (eng_token_is_special(model, t) ? GMR_TOKEN_SPECIAL : 0));
    }
    return 0;
}

int kvt_load_vocab_pieces(const char *gguf_path, gmr_vocab **out, kvt_pieces *pieces, char *err, size_t err_len) {
    *out = NULL;
    if (pieces) memset(pieces, 0, sizeof *pieces);
    eng_load_params lp;
    eng_load_params_default(&lp);
    lp.vocab_only = true;
    eng_model *model = NULL;
    int rc = eng_model_load(gguf_path, &lp, &model, err, err_len);
    if (rc) return rc;
    rc = srv_grammar_cache_vocab_from_model(model, out); /* the server's own index: tests and bench see what it serves */
    if (rc) snprintf(err, err_len, "%s: cannot build the vocabulary (%d)", gguf_path, rc);
    if (!rc && pieces && (rc = fill_pieces(model, pieces)) != 0) {
        snprintf(err, err_len, "%s: cannot read the token pieces (%d)", gguf_path, rc);
        kvt_pieces_free(pieces);
        gmr_vocab_free(*out);
        *out = NULL;
    }
    eng_model_free(model);
    return rc;
}

int kvt_load_vocab(const char *gguf_path, gmr_vocab **out, char *err, size_t err_len) {
    return kvt_load_vocab_pieces(gguf_path, out, NULL, err, err_len);
}
