/* tok_bpe.c: byte-level BPE: the pre-tokenizer regexes split the text into words, each word's bytes are mapped
 * to code points and merged by rank. See tokenizer.h for the contract. */
#include "engine/text/tok_internal.h"

#include <stdlib.h>

static int32_t merge_rank(const eng_vocab *v, int32_t left, int32_t right) {
    if (!v->has_merges || left < 0 || right < 0) return -1;
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    for (uint64_t i = hash_u64(key) & v->mmask;; i = (i + 1) & v->mmask) {
        if (v->mkey[i] == UINT64_MAX) return -1;
        if (v->mkey[i] == key) return v->mrank[i];
    }
}

static int bpe_add_bigram(const eng_vocab *v, work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return ENG_OK;
    int32_t rank = merge_rank(v, w->s[l].id, w->s[r].id);
    if (rank < 0) return ENG_OK;
    bigram b = {.rank = rank, .left = l, .right = r, .lid = w->s[l].id, .rid = w->s[r].id};
    return tok_heap_push(&w->h, b);
}

/* Byte-level BPE of one pre-tokenized word word[0..len) (raw bytes). */
static int bpe_word(const eng_vocab *v, work *w, const char *word, size_t len, ivec *out) {
    kvs_buf_clear(&w->buf);
    for (size_t i = 0; i < len; i++) {
        char u[4];
        size_t k = utf8_encode(v->byte_cp[(uint8_t)word[i]], u);
        if (kvs_buf_append(&w->buf, u, k)) return ENG_ERR_NOMEM;
    }
    const char *t = w->buf.data;
    size_t n = w->buf.len;
    if (n == 0) return ENG_OK;
    if (v->ignore_merges) {
        int32_t id = eng_vocab_find(v, t, n);
        if (id >= 0) return tok_ivec_push(out, id);
    }
    if (tok_split_chars(v, w, t, n)) return ENG_ERR_NOMEM;
    w->h.n = 0;
    w->h.spm = false;
    for (size_t i = 1; i < w->ns; i++)
        if (bpe_add_bigram(v, w, (int32_t)i - 1, (int32_t)i)) return ENG_ERR_NOMEM;
    while (w->h.n) {
        bigram b = tok_heap_pop(&w->h);
        sym *l = &w->s[b.left], *r = &w->s[b.right];
        if (l->n == 0 || r->n == 0 || l->id != b.lid || r->id != b.rid || l->next != b.right) continue;
        l->n += r->n;
        r->n = 0;
        l->id = eng_vocab_find(v, t + l->off, l->n);
        l->next = r->next;
        if (r->next >= 0) w->s[r->next].prev = b.left;
        if (bpe_add_bigram(v, w, l->prev, b.left)) return ENG_ERR_NOMEM;
        if (bpe_add_bigram(v, w, b.left, l->next)) return ENG_ERR_NOMEM;
    }
    for (int32_t i = 0; i != -1; i = w->s[i].next) {
        const sym *s = &w->s[i];
        if (s->n == 0) continue;
        if (s->id >= 0) {
            if (tok_ivec_push(out, s->id)) return ENG_ERR_NOMEM;
            continue;
        }
        for (uint32_t j = 0; j < s->n; j++) {   /* no token: single bytes that happen to be tokens */
            int32_t id = eng_vocab_find(v, t + s->off + j, 1);
            if (id >= 0 && tok_ivec_push(out, id)) return ENG_ERR_NOMEM;
        }
    }
    return ENG_OK;
}

typedef struct span { size_t off, len; } span;
typedef struct spanvec { span *a; size_t n, cap; } spanvec;

static int span_push(spanvec *v, size_t off, size_t len) {
    int rc = ENG_OK;
    if (len == 0) return rc;
    KVS_GROW_ONE(rc, v->a, v->n, v->cap, 64);
    if (rc == ENG_OK) v->a[v->n++] = (span){off, len};
    return rc;
}

/* Splits text[sp.off .. +sp.len) by one regex into matches and the gaps between them (both kept). */
static int regex_split(const pcre2_code *re, pcre2_match_data *md, const char *text, span sp, spanvec *out) {
    PCRE2_SPTR subj = (PCRE2_SPTR)(text + sp.off);
    size_t pos = 0, gap = 0;
    while (pos < sp.len) {
        int rc = pcre2_match(re, subj, sp.len, pos, 0, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) rc = pcre2_match(re, subj, sp.len, pos, PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc == PCRE2_ERROR_NOMEMORY) return ENG_ERR_NOMEM;
        if (rc < 0) return ENG_ERR_INVALID;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t s = ov[0], e = ov[1];
        if (e <= s) {   /* empty match: step one character */
            pos = s + utf8_len_lead(subj[s]);
            if (pos > sp.len) pos = sp.len;
            continue;
        }
        if (span_push(out, sp.off + gap, s - gap)) return ENG_ERR_NOMEM;
        if (span_push(out, sp.off + s, e - s)) return ENG_ERR_NOMEM;
        pos = gap = e;
    }
    return span_push(out, sp.off + gap, sp.len - gap);
}

int tok_bpe_tokenize(const eng_vocab *v, work *w, const char *text, size_t len, ivec *out) {
    if (len == 0) return ENG_OK;
    spanvec a = {0}, b = {0};
    int rc = ENG_ERR_NOMEM;
    pcre2_match_data *md = NULL;
    if (span_push(&a, 0, len)) goto done;
    for (int r = 0; r < v->n_regex; r++) {
        md = pcre2_match_data_create_from_pattern(v->re[r], NULL);
        if (!md) goto done;
        b.n = 0;
        for (size_t i = 0; i < a.n; i++)
            if ((rc = regex_split(v->re[r], md, text, a.a[i], &b))) goto done;
        pcre2_match_data_free(md);
        md = NULL;
        spanvec t = a; a = b; b = t;
    }
    for (size_t i = 0; i < a.n; i++)
        if ((rc = bpe_word(v, w, text + a.a[i].off, a.a[i].len, out))) goto done;
    rc = ENG_OK;
done:
    pcre2_match_data_free(md);
    free(a.a);
    free(b.a);
    return rc;
}
