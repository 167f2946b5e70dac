/*
 * chat.h: chat template rendering over template text (internal to the engine). eng_chat_render (engine.h)
 * is a thin wrapper that fetches the model's template and BOS/EOS texts and calls eng_chat_render_text.
 */
#ifndef KVSERVE_ENGINE_CHAT_H
#define KVSERVE_ENGINE_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/engine.h"

/* Renders msgs[0..n) in `family` (ENG_CHAT_AUTO: detect it from template_text; NULL or unrecognized text
 * falls back to ChatML and sets *used_fallback). When template_text is recognized as the same family, its
 * known variants are reproduced too (ChatML with a default system prompt, Llama 2 with/without <<SYS>>,
 * BOS inside history, stripped content, Phi-3 templates without a system role); see chat.c.
 * bos_text / eos_text: the model's BOS / EOS token text (NULL or "" when unknown; "</s>" is assumed where a
 * family needs an end-of-sequence text and eos_text is unknown). The result never starts with BOS.
 * *out is malloc'd and NUL-terminated; the caller frees it. used_fallback may be NULL.
 * Errors: ENG_ERR_INVALID (msgs or out NULL, n == 0, a NULL role or content, family out of range),
 * ENG_ERR_NOMEM. Thread-safe (no shared state). */
int eng_chat_render_text(const char *template_text, const char *bos_text, const char *eos_text,
                         const eng_chat_msg *msgs, size_t n, bool add_generation_prompt, eng_chat_family family,
                         char **out, bool *used_fallback);

#endif /* KVSERVE_ENGINE_CHAT_H */
