/*
 * tokenizer.c: the tokenize entry point (special-token partitioning, then SPM or BPE per text fragment) and the
 * merge queue both algorithms use. Loading is in tok_load.c, SPM in tok_spm.c, BPE in tok_bpe.c, pieces and
 * streaming detokenization in tok_detok.c. See tokenizer.h for the contract. The behaviour follows llama.cpp's
 * tokenizer (facts only; code is ours).
 */
#include "engine/text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

int tok_ivec_push(ivec *v, int32_t x) {
    int rc = ENG_OK;
    KVS_GROW_ONE(rc, v->a, v->n, v->cap, 64);
    if (rc == ENG_OK) v->a[v->n++] = x;
    return rc;
}

/* ---- merge queue ------------------------------------------------------------------------------------------ */

static bool bg_before(const heap *h, const bigram *x, const bigram *y) {
    if (h->spm) {
        if (x->score != y->score) return x->score > y->score;
    } else if (x->rank != y->rank) {
        return x->rank < y->rank;
    }
    return x->left < y->left;
}

int tok_heap_push(heap *h, bigram b) {
    int rc = ENG_OK;
    KVS_GROW_ONE(rc, h->a, h->n, h->cap, 64);
    if (rc != ENG_OK) return rc;
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bg_before(h, &b, &h->a[p])) break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = b;
    return ENG_OK;
}

bigram tok_heap_pop(heap *h) {
    bigram top = h->a[0];
    bigram last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && bg_before(h, &h->a[c + 1], &h->a[c])) c++;
        if (!bg_before(h, &h->a[c], &last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n) h->a[i] = last;
    return top;
}

int tok_work_syms(work *w, size_t n) {
    if (n > w->caps) {
        sym *ns = realloc(w->s, n * sizeof *ns);
        if (!ns) return ENG_ERR_NOMEM;
        w->s = ns;
        w->caps = n;
    }
    w->ns = 0;
    return ENG_OK;
}

int tok_split_chars(const eng_vocab *v, work *w, const char *text, size_t len) {
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
        s->id = v ? eng_vocab_find(v, text + s->off, n) : -1;
        w->ns++;
    }
    return ENG_OK;
}

/* ---- special-token partitioning and the tokenize entry point ---------------------------------------------- */

typedef struct frag { size_t off, len; int32_t tok; /* -1: raw text */ } frag;
typedef struct fragvec { frag *a; size_t n, cap; } fragvec;

static int frag_push(fragvec *f, frag x) {
    int rc = ENG_OK;
    KVS_GROW_ONE(rc, f->a, f->n, f->cap, 16);
    if (rc == ENG_OK) f->a[f->n++] = x;
    return rc;
}

static bool is_space_c(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Splits raw fragments at occurrences of special tokens, longest token first (llama.cpp's order: each token
 * in turn splits every raw fragment left to right). With parse_special false only user-defined tokens are split
 * out. Each pass rebuilds the fragment list into *tmp, so a pass is linear in the text and fragments. */
static int partition(const eng_vocab *v, const char *text, fragvec *f, fragvec *tmp, bool parse_special) {
    for (int32_t si = 0; si < v->n_specials; si++) {
        int32_t id = v->specials[si];
        const tok_entry *t = &v->tok[id];
        if (!parse_special && t->type != ENG_TOKTYPE_USER_DEFINED) continue;
        const char *pat = v->text + t->off;
        bool any = false;
        for (size_t i = 0; i < f->n && !any; i++)
            any = f->a[i].tok < 0 && f->a[i].len >= t->len && memmem(text + f->a[i].off, f->a[i].len, pat, t->len);
        if (!any) continue;
        tmp->n = 0;
        for (size_t i = 0; i < f->n; i++) {
            frag fr = f->a[i];
            if (fr.tok >= 0) {
                if (frag_push(tmp, fr)) return ENG_ERR_NOMEM;
                continue;
            }
            size_t off = fr.off, len = fr.len;
            for (;;) {
                const char *hit = len >= t->len ? memmem(text + off, len, pat, t->len) : NULL;
                if (!hit) {
                    if (len > 0 && frag_push(tmp, (frag){off, len, -1})) return ENG_ERR_NOMEM;
                    break;
                }
                size_t p = (size_t)(hit - text);
                size_t ll = p - off;                       /* left remainder [off, off + ll) */
                size_t ro = p + t->len, rl = off + len - ro; /* right remainder [ro, ro + rl) */
                if (t->attr & TOKATTR_LSTRIP)
                    while (ll > 0 && is_space_c(text[off + ll - 1])) ll--;
                if (t->attr & TOKATTR_RSTRIP)
                    while (rl > 0 && is_space_c(text[ro])) { ro++; rl--; }
                if (ll > 0 && frag_push(tmp, (frag){off, ll, -1})) return ENG_ERR_NOMEM;
                if (frag_push(tmp, (frag){p, t->len, id})) return ENG_ERR_NOMEM;
                off = ro;
                len = rl;
            }
        }
        fragvec sw = *f;
        *f = *tmp;
        *tmp = sw;
    }
    return ENG_OK;
}

int eng_vocab_tokenize(const eng_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                       int32_t *out, int32_t cap, int32_t *n_out) {
    if (!v || !n_out || (!text && len) || cap < 0 || (!out && cap > 0)) return ENG_ERR_INVALID;
    *n_out = 0;
    if (len > ENG_TOK_MAX_TEXT) return ENG_ERR_INVALID;   /* offsets inside are 32-bit (escaped text is 3x) */
    ivec ids = {0};
    fragvec f = {0}, ftmp = {0};
    work w = {0};
    kvs_buf esc = {0};
    int rc = ENG_ERR_NOMEM;

    if (len > 0) {
        if (frag_push(&f, (frag){0, len, -1})) goto done;
        if ((rc = partition(v, text, &f, &ftmp, parse_special))) goto done;
    }
    if (add_special && v->add_bos && tok_ivec_push(&ids, v->bos)) { rc = ENG_ERR_NOMEM; goto done; }
    bool prev_special = true;   /* SPM: a text fragment at the start or after a special token gets the space */
    for (size_t i = 0; i < f.n; i++) {
        const frag *fr = &f.a[i];
        if (fr->tok >= 0) {
            if (tok_ivec_push(&ids, fr->tok)) { rc = ENG_ERR_NOMEM; goto done; }
            prev_special = true;
            continue;
        }
        if (v->type == ENG_VOCAB_SPM) {
            kvs_buf_clear(&esc);
            if (v->add_space_prefix && prev_special && kvs_buf_append(&esc, "\xe2\x96\x81", 3)) { rc = ENG_ERR_NOMEM; goto done; }
            const char *p = text + fr->off;
            for (size_t k = 0; k < fr->len; k++) {
                int e = p[k] == ' ' ? kvs_buf_append(&esc, "\xe2\x96\x81", 3) : kvs_buf_append(&esc, p + k, 1);
                if (e) { rc = ENG_ERR_NOMEM; goto done; }
            }
            if ((rc = tok_spm_tokenize(v, &w, esc.data, esc.len, &ids))) goto done;
        } else if (v->type == ENG_VOCAB_WPM) {
            if ((rc = tok_wpm_tokenize(v, &esc, text + fr->off, fr->len, &ids))) goto done;
        } else if (v->type == ENG_VOCAB_UGM) {
            if ((rc = tok_ugm_tokenize(v, &esc, text + fr->off, fr->len, &ids))) goto done;
        } else {
            if ((rc = tok_bpe_tokenize(v, &w, text + fr->off, fr->len, &ids))) goto done;
        }
        prev_special = false;
    }
    if (add_special && v->add_eos && tok_ivec_push(&ids, v->eos)) { rc = ENG_ERR_NOMEM; goto done; }
    if (add_special && v->add_sep && tok_ivec_push(&ids, v->sep)) { rc = ENG_ERR_NOMEM; goto done; }

    if (ids.n > INT32_MAX) { rc = ENG_ERR_TOO_LARGE; goto done; }
    *n_out = (int32_t)ids.n;
    size_t ncopy = ids.n < (size_t)cap ? ids.n : (size_t)cap;
    if (ncopy) memcpy(out, ids.a, ncopy * sizeof *out);
    rc = ids.n > (size_t)cap ? ENG_ERR_TOO_LARGE : ENG_OK;
done:
    free(ids.a);
    free(f.a);
    free(ftmp.a);
    free(w.s);
    free(w.h.a);
    kvs_buf_free(&w.buf);
    kvs_buf_free(&esc);
    return rc;
}
