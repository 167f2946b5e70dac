/*
 * tok_api.c: engine.h's token functions over the model's vocabulary (eng_model_vocab, model.h).
 * Kept apart from text/tokenizer.c, which knows vocabularies only, not models.
 */
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
