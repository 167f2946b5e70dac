/* tok_spm.c: SentencePiece-style (SPM) merging by token score over escaped text (spaces as U+2581), with byte
 * fallback. See tokenizer.h for the contract. */
#include "engine/text/tok_internal.h"

static int spm_try_bigram(const eng_vocab *v, work *w, const char *text, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return ENG_OK;
    uint32_t size = w->s[l].n + w->s[r].n;
    int32_t id = eng_vocab_find(v, text + w->s[l].off, size);
    if (id < 0) return ENG_OK;
    bigram b = {.score = v->tok[id].score, .left = l, .right = r, .size = size};
    return tok_heap_push(&w->h, b);
}

static int spm_emit_bytes(const eng_vocab *v, const char *p, size_t n, ivec *out) {
    for (size_t j = 0; j < n; j++) {
        int32_t id = v->byte_tok[(uint8_t)p[j]];
        if (id < 0) id = v->unk;
        if (id >= 0 && tok_ivec_push(out, id)) return ENG_ERR_NOMEM;
    }
    return ENG_OK;
}

/* SPM merging of one piece of escaped text. */
static int spm_segment(const eng_vocab *v, work *w, const char *text, size_t len, ivec *out) {
    if (len == 0) return ENG_OK;
    if (tok_work_syms(w, len)) return ENG_ERR_NOMEM;
    size_t off = 0;
    while (off < len) {
        size_t n = utf8_len_lead((uint8_t)text[off]);
        if (n > len - off) n = len - off;
        sym *s = &w->s[w->ns];
        s->off = (uint32_t)off;
        s->n = (uint32_t)n;
        s->prev = (int32_t)w->ns - 1;
        off += n;
        s->next = off == len ? -1 : (int32_t)w->ns + 1;
        s->id = -1;
        w->ns++;
    }
    w->h.n = 0;
    w->h.spm = true;
    for (size_t i = 1; i < w->ns; i++)
        if (spm_try_bigram(v, w, text, (int32_t)i - 1, (int32_t)i)) return ENG_ERR_NOMEM;
    while (w->h.n) {
        bigram b = tok_heap_pop(&w->h);
        sym *l = &w->s[b.left], *r = &w->s[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->s[r->next].prev = b.left;
        if (spm_try_bigram(v, w, text, l->prev, b.left)) return ENG_ERR_NOMEM;
        if (spm_try_bigram(v, w, text, b.left, l->next)) return ENG_ERR_NOMEM;
    }
    for (int32_t i = 0; i != -1; i = w->s[i].next) {
        const sym *s = &w->s[i];
        if (s->n == 0) continue;
        int32_t id = eng_vocab_find(v, text + s->off, s->n);
        if (id >= 0) {
            if (tok_ivec_push(out, id)) return ENG_ERR_NOMEM;
        } else if (spm_emit_bytes(v, text + s->off, s->n, out)) {
            return ENG_ERR_NOMEM;
        }
    }
    return ENG_OK;
}

/* SPM over an already escaped text: split before each run of U+2581 when the vocabulary allows it (keeps the
 * merge queue small; the result is the same, see spm_split), else all at once. */
int tok_spm_tokenize(const eng_vocab *v, work *w, const char *text, size_t len, ivec *out) {
    if (!v->spm_split) return spm_segment(v, w, text, len, out);
    size_t start = 0, off = 0;
    bool prev_sp = false;
    while (off < len) {
        size_t n = utf8_len_lead((uint8_t)text[off]);
        if (n > len - off) n = len - off;
        bool sp = n == 3 && memcmp(text + off, "\xe2\x96\x81", 3) == 0;
        if (sp && !prev_sp && off > start) {
            int rc = spm_segment(v, w, text + start, off - start, out);
            if (rc) return rc;
            start = off;
        }
        prev_sp = sp;
        off += n;
    }
    return spm_segment(v, w, text + start, len - start, out);
}
