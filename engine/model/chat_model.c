/*
 * chat_model.c: eng_chat_render (engine.h) over a loaded model: its tokenizer.chat_template and the text of
 * its BOS / EOS tokens, handed to eng_chat_render_text (chat.h). Kept apart from chat.c so that chat.c and
 * its tests do not depend on the model and tokenizer code.
 */
#include "engine/text/chat.h"

#include <stdlib.h>

/* The text of a special token (render_special), or NULL when the model has none or it cannot be read. */
static char *token_text(const eng_model *model, int32_t tok) {
    if (tok < 0) return NULL;
    size_t need = 0;
    char small[64];
    int rc = eng_token_to_piece(model, tok, true, small, sizeof(small), &need);
    if (rc != ENG_OK && rc != ENG_ERR_TOO_LARGE) return NULL;
    char *s = malloc(need + 1);
    if (!s) return NULL;
    if (eng_token_to_piece(model, tok, true, s, need + 1, &need) != ENG_OK) {
        free(s);
        return NULL;
    }
    s[need] = '\0';
    return s;
}

int eng_chat_render(const eng_model *model, const eng_chat_msg *msgs, size_t n_msgs, bool add_generation_prompt,
                    eng_chat_family family, char **out, bool *used_fallback) {
    if (out) *out = NULL;
    if (used_fallback) *used_fallback = false;
    if (!model) return ENG_ERR_INVALID;
    char *bos = token_text(model, eng_token_bos(model));
    char *eos = token_text(model, eng_token_eos(model));
    int rc = eng_chat_render_text(eng_model_chat_template(model), bos, eos, msgs, n_msgs, add_generation_prompt,
                                  family, out, used_fallback);
    free(bos);
    free(eos);
    return rc;
}
