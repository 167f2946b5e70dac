/*
 * tok_api.c: engine.h's token functions over the model's vocabulary (eng_model_vocab, model.h).
 * Kept apart from text/tokenizer.c, which knows vocabularies only, not models.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/text/tokenizer.h"
#include "engine/model/model.h"

int32_t eng_token_bos(const eng_model *model) {
    return model ? eng_vocab_bos(eng_model_vocab(model)) : -1;
}

int eng_token_fim(const eng_model *model, int32_t *pre, int32_t *suf, int32_t *mid) {
    static const char *const keys[3] = {"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id",
                                        "tokenizer.ggml.fim_mid_token_id"};
    int32_t *out[3] = {pre, suf, mid};
    for (int i = 0; i < 3; i++) *out[i] = -1;
    if (!model) return ENG_ERR_INVALID;
    int32_t got[3], n_vocab = eng_vocab_n_tokens(eng_model_vocab(model));
    for (int i = 0; i < 3; i++) {
        uint32_t v;
        if (eng_gguf_get_u32(model->gguf, keys[i], &v) != 0 || (int64_t)v >= n_vocab) return ENG_ERR_NOT_FOUND;
        got[i] = (int32_t)v;
    }
    for (int i = 0; i < 3; i++) *out[i] = got[i];
    return 0;
}

int32_t eng_token_eos(const eng_model *model) {
    return model ? eng_vocab_eos(eng_model_vocab(model)) : -1;
}

bool eng_token_is_eog(const eng_model *model, int32_t token) {
    return model && eng_vocab_is_eog(eng_model_vocab(model), token);
}

bool eng_token_is_special(const eng_model *model, int32_t token) {
    return model && eng_vocab_is_special(eng_model_vocab(model), token);
}

int eng_tokenize(const eng_model *model, const char *text, size_t len, bool add_special, bool parse_special,
                 int32_t *out, int32_t cap, int32_t *n_out) {
    if (!model) return ENG_ERR_INVALID;
    const eng_vocab *v = eng_model_vocab(model);
    if (!v) return ENG_ERR_INVALID;
    return eng_vocab_tokenize(v, text, len, add_special, parse_special, out, cap, n_out);
}

int eng_token_to_piece(const eng_model *model, int32_t token, bool render_special, char *buf, size_t cap,
                       size_t *n_out) {
    if (!model) return ENG_ERR_INVALID;
    const eng_vocab *v = eng_model_vocab(model);
    if (!v) return ENG_ERR_INVALID;
    return eng_vocab_token_to_piece(v, token, render_special, buf, cap, n_out);
}

int eng_detok_push(const eng_model *model, eng_detok *d, int32_t token, bool render_special, char *buf,
                   size_t cap, size_t *n_out) {
    if (!model) return ENG_ERR_INVALID;
    const eng_vocab *v = eng_model_vocab(model);
    if (!v) return ENG_ERR_INVALID;
    return eng_vocab_detok_push(v, d, token, render_special, buf, cap, n_out);
}

/* A token's text into *buf (grown as needed, *cap its size), its length in *n. */
static int piece_grow(const eng_model *m, int32_t t, char **buf, size_t *cap, size_t *n) {
    int rc = eng_token_to_piece(m, t, true, *buf, *cap, n);
    if (rc != ENG_ERR_TOO_LARGE) return rc;
    char *p = realloc(*buf, *n);
    if (!p) return ENG_ERR_NOMEM;
    *buf = p;
    *cap = *n;
    return eng_token_to_piece(m, t, true, *buf, *cap, n);
}

int eng_vocab_compare(const eng_model *a, const eng_model *b, int32_t *first_diff) {
    if (!a || !b || !first_diff) return ENG_ERR_INVALID;
    int32_t na = eng_model_hparams(a)->n_vocab, nb = eng_model_hparams(b)->n_vocab;
    *first_diff = -1;
    size_t ca = 64, cb = 64, la = 0, lb = 0;
    char *pa = malloc(ca), *pb = malloc(cb);
    int rc = pa && pb ? ENG_OK : ENG_ERR_NOMEM;
    int32_t n = na < nb ? na : nb;
    for (int32_t t = 0; rc == ENG_OK && t < n; t++) {
        int ra = piece_grow(a, t, &pa, &ca, &la), rb = ra == ENG_OK ? piece_grow(b, t, &pb, &cb, &lb) : ra;
        if (ra == ENG_ERR_NOMEM || rb == ENG_ERR_NOMEM) rc = ENG_ERR_NOMEM;
        else if (ra != rb || (ra == ENG_OK && (la != lb || memcmp(pa, pb, la) != 0))) {
            *first_diff = t;
            rc = ENG_ERR_INVALID;
        }
    }
    if (rc == ENG_OK && na != nb) {
        *first_diff = n;
        rc = ENG_ERR_INVALID;
    }
    free(pa);
    free(pb);
    return rc;
}
