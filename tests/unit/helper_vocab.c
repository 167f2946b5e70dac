/* helper_vocab.c: see helper_vocab.h. */
#include "helper_vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

int kvt_load_vocab(const char *gguf_path, gmr_vocab **out, char *err, size_t err_len) {
    *out = NULL;
    eng_load_params lp;
    eng_load_params_default(&lp);
    lp.vocab_only = true;
    eng_model *model = NULL;
    int rc = eng_model_load(gguf_path, &lp, &model, err, err_len);
    if (rc) return rc;
    int32_t n = eng_model_hparams(model)->n_vocab;
    char **pieces = calloc((size_t)n, sizeof *pieces);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    uint8_t *flags = calloc((size_t)n, 1);
    rc = pieces && lens && flags ? 0 : KVS_ERR_NOMEM;
    char buf[1100];
    for (int32_t t = 0; t < n && !rc; t++) {
        size_t len = 0;
        rc = eng_token_to_piece(model, t, false, buf, sizeof buf, &len);
        if (rc) break;
        pieces[t] = malloc(len + 1);
        if (!pieces[t]) rc = KVS_ERR_NOMEM;
        else memcpy(pieces[t], buf, len);
        lens[t] = len;
        flags[t] = (uint8_t)((eng_token_is_eog(model, t) ? GMR_TOKEN_EOG : 0) |
                             (eng_token_is_special(model, t) ? GMR_TOKEN_SPECIAL : 0));
    }
    if (!rc) rc = gmr_vocab_create((const char *const *)pieces, lens, flags, n, out);
    if (rc) snprintf(err, err_len, "%s: cannot build the vocabulary (%d)", gguf_path, rc);
    for (int32_t t = 0; pieces && t < n; t++) free(pieces[t]);
    free(pieces);
    free(lens);
    free(flags);
    eng_model_free(model);
    return rc;
}
