/*
 * tok_wpm.c: BERT's WordPiece as llama.cpp tokenizes "bert" vocabularies (facts from its llm_tokenizer_wpm):
 * the text is normalized (lowercased and accents stripped unless tokenizer.ggml.normalizer.* say otherwise),
 * split at whitespace, and every punctuation character (and ASCII symbol, and CJK ideograph) is a word of its
 * own; control characters, U+0000 and U+FFFD are dropped. Each word, prefixed with U+2581 (the converter writes
 * word-initial pieces with it and "##" continuations without), is cut greedily into the longest vocabulary
 * pieces from the left; a word with a rest no piece matches becomes one [UNK].
 *
 * Unicode coverage: the character classes and case mapping are exact for ASCII and Latin-1 and cover the common
 * ranges beyond it (general punctuation, combining marks, Latin Extended-A, Greek, Cyrillic, CJK); accents are
 * stripped from Latin-1 letters and combining marks. Rarer scripts may differ from llama.cpp's full tables.
 */
#include "engine/text/tok_internal.h"

#include <stdbool.h>
#include <stdint.h>

static bool wpm_space(uint32_t c) {
    return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool wpm_control(uint32_t c) {
    return c < 0x20 || (c >= 0x7F && c <= 0x9F) || c == 0xAD || (c >= 0x200B && c <= 0x200F) ||
           (c >= 0x202A && c <= 0x202E) || (c >= 0x2060 && c <= 0x206F) || c == 0xFEFF ||
           (c >= 0xE000 && c <= 0xF8FF);
}

static bool wpm_punct(uint32_t c) {
    if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                         (c >= 0x7B && c <= 0x7E); /* ASCII punctuation and symbols alike */
    return c == 0xA1 || c == 0xA7 || c == 0xAB || c == 0xB6 || c == 0xB7 || c == 0xBB || c == 0xBF ||
           c == 0x37E || c == 0x387 || (c >= 0x2010 && c <= 0x2027) || (c >= 0x2030 && c <= 0x205E) ||
           (c >= 0x3001 && c <= 0x3003) || (c >= 0x3008 && c <= 0x3011) || (c >= 0x3014 && c <= 0x301F) ||
           (c >= 0xFF01 && c <= 0xFF0F && c != 0xFF04 && c != 0xFF0B) || c == 0xFF1A || c == 0xFF1B ||
           c == 0xFF1F || c == 0xFF20;
}

static bool wpm_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static bool wpm_mark(uint32_t c) {
    return (c >= 0x300 && c <= 0x36F) || (c >= 0x1AB0 && c <= 0x1AFF) || (c >= 0x1DC0 && c <= 0x1DFF) ||
           (c >= 0x20D0 && c <= 0x20FF) || (c >= 0xFE20 && c <= 0xFE2F);
}

static uint32_t wpm_lower(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c < 0xC0) return c;
    if (c <= 0xDE && c != 0xD7) return c + 32;
    if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x138 && c != 0x149 && c != 0x17F) {
        bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
        if (odd_upper ? (c % 2 == 1) : (c % 2 == 0)) return c + 1;
        return c;
    }
    if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    return c;
}

/* The base letter of a Latin-1 letter with a diacritic (its NFD without the mark), else c. */
static uint32_t wpm_strip_latin1(uint32_t c) {
    static const char base[64] = "AAAAAA\0CEEEEIIII\0NOOOOO\0\0UUUUY\0\0aaaaaa\0ceeeeiiii\0nooooo\0\0uuuuy\0y";
    if (c < 0xC0 || c > 0xFF) return c;
    char b = base[c - 0xC0];
    return b ? (uint32_t)(unsigned char)b : c;
}

/* Next code point of s[*i..n), advancing *i; an invalid sequence gives U+FFFD (one byte consumed). */
static uint32_t next_cp(const uint8_t *s, size_t n, size_t *i) {
    size_t have, need;
    utf8_check(s + *i, n - *i, &have, &need);
    if (have == 0 || have < need) {
        (*i)++;
        return 0xFFFD;
    }
    uint32_t c = need == 1 ? s[*i] : need == 2 ? (s[*i] & 0x1Fu) : need == 3 ? (s[*i] & 0x0Fu) : (s[*i] & 0x07u);
    for (size_t k = 1; k < need; k++) c = (c << 6) | (s[*i + k] & 0x3Fu);
    *i += need;
    return c;
}

/* Greedy longest-match of one word (U+2581 + its text, in w[0..n)) into out. */
static int wpm_word(const eng_vocab *v, const char *w, size_t n, ivec *out) {
    size_t start = out->n;
    for (size_t i = 0; i < n;) {
        size_t hi = i + (size_t)v->max_tok_len < n ? i + (size_t)v->max_tok_len : n;
        int32_t id = -1;
        size_t j = hi;
        for (; j > i; j--)
            if ((id = eng_vocab_find(v, w + i, j - i)) >= 0) break;
        if (id < 0) { /* the rest of the word matches nothing: the whole word is unknown */
            out->n = start;
            break;
        }
        if (tok_ivec_push(out, id)) return ENG_ERR_NOMEM;
        i = j;
    }
    if (out->n == start && v->unk >= 0 && tok_ivec_push(out, v->unk)) return ENG_ERR_NOMEM;
    return ENG_OK;
}

/* Ends the word being built in buf (if any) and tokenizes it. */
static int flush_word(const eng_vocab *v, kvs_buf *buf, ivec *out) {
    if (buf->len <= 3) { /* only the U+2581 prefix */
        buf->len = 3;
        return ENG_OK;
    }
    int rc = wpm_word(v, buf->data, buf->len, out);
    buf->len = 3;
    return rc;
}

int tok_wpm_tokenize(const eng_vocab *v, kvs_buf *buf, const char *text, size_t len, ivec *out) {
    kvs_buf_clear(buf);
    if (kvs_buf_append(buf, "\xe2\x96\x81", 3)) return ENG_ERR_NOMEM;
    const uint8_t *s = (const uint8_t *)text;
    int rc = ENG_OK;
    for (size_t i = 0; i < len && rc == ENG_OK;) {
        uint32_t c = next_cp(s, len, &i);
        if (wpm_space(c)) {
            rc = flush_word(v, buf, out);
            continue;
        }
        if (c == 0 || c == 0xFFFD || wpm_control(c)) continue;
        if (v->wpm_strip) {
            if (wpm_mark(c)) continue;
            c = wpm_strip_latin1(c);
        }
        if (v->wpm_lower) c = wpm_lower(c);
        char enc[4];
        size_t el = utf8_encode(c, enc);
        if (wpm_punct(c) || wpm_cjk(c)) { /* a word of its own */
            if ((rc = flush_word(v, buf, out)) != ENG_OK) break;
            if (kvs_buf_append(buf, enc, el)) return ENG_ERR_NOMEM;
            rc = flush_word(v, buf, out);
        } else if (kvs_buf_append(buf, enc, el)) {
            return ENG_ERR_NOMEM;
        }
    }
    if (rc == ENG_OK) rc = flush_word(v, buf, out);
    return rc;
}
