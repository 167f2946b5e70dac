/*
 * tok_ugm.c: SentencePiece unigram ("t5" vocabularies: T5, XLM-RoBERTa, bge-m3) as llama.cpp tokenizes them.
 *
 * Normalization, byte by byte of the input: a prefix that starts some user-defined token's text is kept as it is
 * (as far as it matches); else the longest prefix the precompiled charsmap maps (tokenizer.ggml.precompiled_charsmap:
 * a little-endian uint32 byte count, then a XOR-compressed compact double array of that many bytes, then the
 * NUL-terminated replacement strings) is replaced; else one valid UTF-8 character is kept, or one invalid byte
 * becomes U+FFFD. Spaces of the result become U+2581 (tokenizer.ggml.escape_whitespaces, default true); with
 * add_space_prefix one is put before the first non-space run; remove_extra_whitespaces drops leading and trailing
 * spaces and merges runs into one.
 *
 * Segmentation: the Viterbi best path over the normalized bytes, advancing one UTF-8 character at a time: every
 * normal, user-defined (score 0) or unused token that matches at the position is a candidate edge scored by the
 * token's score (sums in double, ties keep the first found: the shorter edge from the earlier position); a
 * character no single token covers gets the unknown token with the lowest normal score minus 10. Consecutive
 * unknown tokens of the result are merged into one.
 */
#include "engine/text/tok_internal.h"

#include <float.h>
#include <stdlib.h>

/* XCDA node fields (the charsmap's double array): BASE in bits 10-30 (shifted by 8 more when bit 9 is set), LCHECK in
 * bits 0-7 plus bit 31, LEAF in bit 8, and the value of a leaf's target in bits 0-30. */
static int xcda_node(const eng_vocab *v, uint32_t i, uint32_t *out) {
    if (i >= v->xcda_n) return -1;
    memcpy(out, v->charsmap + 4 + (size_t)i * 4, 4);
    return 0;
}
static uint32_t xcda_base(uint32_t n) { return (n >> 10) << ((n & (1u << 9)) >> 6); }
static uint32_t xcda_lcheck(uint32_t n) { return n & ((1u << 31) | 0xffu); }

/* The longest charsmap match at s[0..n): its length (0: none) and the replacement (NUL-terminated inside the map). */
static size_t charsmap_match(const eng_vocab *v, const uint8_t *s, size_t n, const char **repl, size_t *repl_len) {
    if (v->xcda_n == 0) return 0;
    uint32_t node, idx = 0, best_off = 0;
    size_t best = 0;
    if (xcda_node(v, 0, &node)) return 0;
    idx = xcda_base(node);
    for (size_t k = 0; k < n && s[k] != 0; k++) {
        idx ^= s[k];
        if (xcda_node(v, idx, &node) || xcda_lcheck(node) != s[k]) break;
        bool leaf = (node >> 8) & 1;
        idx ^= xcda_base(node);
        if (leaf) {
            uint32_t vn;
            if (xcda_node(v, idx, &vn)) break;
            best = k + 1;
            best_off = vn & ((1u << 31) - 1);
        }
    }
    if (best == 0) return 0;
    const char *r = (const char *)v->charsmap + 4 + (size_t)v->xcda_n * 4, *end = (const char *)v->charsmap + v->charsmap_len;
    if (best_off >= (size_t)(end - r)) return 0; /* out of the strings: ignored (checked at load too) */
    const char *p = r + best_off, *z = memchr(p, 0, (size_t)(end - p));
    if (!z) return 0;
    *repl = p;
    *repl_len = (size_t)(z - p);
    return best;
}

/* How far s[0..n) runs along some user-defined token's text (0: none). */
static size_t user_prefix(const eng_vocab *v, const uint8_t *s, size_t n) {
    size_t best = 0;
    for (int32_t i = 0; i < v->n_user; i++) {
        const tok_entry *t = &v->tok[v->user[i]];
        const uint8_t *p = (const uint8_t *)v->text + t->off;
        size_t k = 0;
        while (k < n && k < t->len && p[k] == s[k]) k++;
        if (k > best) best = k;
    }
    return best;
}

static int put_norm(const eng_vocab *v, kvs_buf *out, const char *p, size_t n, bool *in_word, bool *prepended) {
    const char *space = v->ugm_escape ? "\xe2\x96\x81" : " ";
    size_t sl = v->ugm_escape ? 3 : 1;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != ' ') {
            if (!*in_word) {
                *in_word = true;
                if ((v->add_space_prefix && !*prepended) || v->ugm_merge_spaces) {
                    if (kvs_buf_append(out, space, sl)) return ENG_ERR_NOMEM;
                    *prepended = true;
                }
            }
            if (kvs_buf_append(out, p + i, 1)) return ENG_ERR_NOMEM;
        } else {
            *in_word = false;
            if (!v->ugm_merge_spaces && kvs_buf_append(out, space, sl)) return ENG_ERR_NOMEM;
        }
    }
    return ENG_OK;
}

static int normalize(const eng_vocab *v, const char *text, size_t len, kvs_buf *out) {
    kvs_buf_clear(out);
    const uint8_t *s = (const uint8_t *)text;
    bool in_word = false, prepended = false;
    for (size_t i = 0; i < len;) {
        const char *r = text + i;
        size_t rl, used = user_prefix(v, s + i, len - i);
        if (used > 0) {
            rl = used;
        } else if ((used = charsmap_match(v, s + i, len - i, &r, &rl)) == 0) {
            size_t have, need;
            utf8_check(s + i, len - i, &have, &need);
            if (have > 0 && have == need) {
                used = rl = need;
            } else {
                r = "\xef\xbf\xbd";
                rl = 3;
                used = 1;
            }
        }
        if (put_norm(v, out, r, rl, &in_word, &prepended)) return ENG_ERR_NOMEM;
        i += used;
    }
    return ENG_OK;
}

typedef struct best { int32_t tok; uint32_t from; double score; } best;

int tok_ugm_tokenize(const eng_vocab *v, kvs_buf *buf, const char *text, size_t len, ivec *out) {
    int rc = normalize(v, text, len, buf);
    if (rc) return rc;
    const size_t n = buf->len;
    if (n == 0) return ENG_OK;
    const char *s = buf->data;
    best *b = malloc((n + 1) * sizeof *b);
    if (!b) return ENG_ERR_NOMEM;
    for (size_t i = 0; i <= n; i++) b[i] = (best){v->unk, 0, -DBL_MAX};
    b[0].score = 0;
    for (size_t i = 0; i < n;) {
        size_t cl = utf8_len_lead((uint8_t)s[i]);
        if (cl > n - i) cl = n - i;
        bool whole = false;
        size_t lim = n - i < v->max_tok_len ? n - i : v->max_tok_len;
        for (size_t l = 1; l <= lim; l++) {
            int32_t id = eng_vocab_find(v, s + i, l);
            if (id < 0) continue;
            uint8_t ty = v->tok[id].type;
            if (ty != ENG_TOKTYPE_NORMAL && ty != ENG_TOKTYPE_USER_DEFINED && ty != ENG_TOKTYPE_UNUSED) continue;
            if (l == cl) whole = true;
            double sc = b[i].score + (ty == ENG_TOKTYPE_USER_DEFINED ? 0.0 : (double)v->tok[id].score);
            if (sc > b[i + l].score) b[i + l] = (best){id, (uint32_t)i, sc};
        }
        if (!whole) {
            double sc = b[i].score + (double)v->ugm_unk_score;
            if (sc > b[i + cl].score) b[i + cl] = (best){v->unk, (uint32_t)i, sc};
        }
        i += cl;
    }
    size_t start = out->n;
    bool prev_unk = false;
    for (size_t at = n;;) { /* backwards, then reversed */
        bool unk = b[at].tok == v->unk;
        if (!(prev_unk && unk) && tok_ivec_push(out, b[at].tok)) { free(b); return ENG_ERR_NOMEM; }
        if (b[at].from == 0) break;
        prev_unk = unk;
        at = b[at].from;
    }
    for (size_t a = start, z = out->n - 1; a < z; a++, z--) {
        int32_t t = out->a[a];
        out->a[a] = out->a[z];
        out->a[z] = t;
    }
    free(b);
    return ENG_OK;
}
