/* tok_detok.c: token pieces (a token's bytes as text) and streaming detokenization that holds back incomplete
 * UTF-8. See tokenizer.h for the contract. */
#include "engine/text/tok_internal.h"

#include <stdlib.h>

/* ---- pieces ------------------------------------------------------------------------------------------------- */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Writes the piece into buf when it fits; always returns its length through *n. */
static void put(char *buf, size_t cap, size_t *n, const char *s, size_t k) {
    if (*n + k <= cap && k) memcpy(buf + *n, s, k);
    *n += k;
}

int eng_vocab_token_to_piece(const eng_vocab *v, int32_t id, bool render_special, char *buf, size_t cap,
                             size_t *n_out) {
    if (!v || !n_out || id < 0 || id >= v->n_tokens || (!buf && cap)) return ENG_ERR_INVALID;
    const tok_entry *t = &v->tok[id];
    const char *s = v->text + t->off;
    size_t n = 0;
    switch (t->type) {
    case ENG_TOKTYPE_CONTROL:
    case ENG_TOKTYPE_UNKNOWN:
        if (render_special) put(buf, cap, &n, s, t->len);
        break;
    case ENG_TOKTYPE_USER_DEFINED:
        put(buf, cap, &n, s, t->len);
        break;
    case ENG_TOKTYPE_BYTE:
        if (v->type == ENG_VOCAB_SPM && t->len == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>' &&
            hexval(s[3]) >= 0 && hexval(s[4]) >= 0) {
            char c = (char)(hexval(s[3]) * 16 + hexval(s[4]));
            put(buf, cap, &n, &c, 1);
        }
        break;
    case ENG_TOKTYPE_NORMAL:
        if (v->type != ENG_VOCAB_BPE) { /* U+2581 is a space (WPM: a word's start) */
            for (size_t i = 0; i < t->len;) {
                if (i + 3 <= t->len && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                    put(buf, cap, &n, " ", 1);
                    i += 3;
                } else {
                    put(buf, cap, &n, s + i, 1);
                    i++;
                }
            }
        } else {
            for (size_t i = 0; i < t->len;) {
                size_t have, need;
                utf8_check((const uint8_t *)s + i, t->len - i, &have, &need);
                if (have == need && have > 0) {
                    uint32_t cp;
                    const uint8_t *u = (const uint8_t *)s + i;
                    if (need == 1) cp = u[0];
                    else if (need == 2) cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
                    else if (need == 3) cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
                    else cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
                              ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
                    if (cp < 512 && v->cp_byte[cp] >= 0) {
                        char c = (char)v->cp_byte[cp];
                        put(buf, cap, &n, &c, 1);
                    } else {
                        put(buf, cap, &n, s + i, need);   /* not a byte-level character: kept as is */
                    }
                    i += need;
                } else {
                    put(buf, cap, &n, s + i, 1);
                    i++;
                }
            }
        }
        break;
    default:
        break;   /* unused / undefined: nothing */
    }
    *n_out = n;
    return n > cap ? ENG_ERR_TOO_LARGE : ENG_OK;
}

/* ---- streaming detokenization -------------------------------------------------------------------------------- */

/* Appends the valid UTF-8 of in[0..n) to out (invalid bytes as U+FFFD, maximal-subpart rule). When hold, a
 * trailing incomplete-but-valid prefix is not emitted; its length goes to *held. Returns the output length. */
static size_t sanitize(const uint8_t *in, size_t n, bool hold, char *out, size_t *held) {
    size_t o = 0, i = 0;
    *held = 0;
    while (i < n) {
        size_t have, need;
        utf8_check(in + i, n - i, &have, &need);
        if (have == need) {
            memcpy(out + o, in + i, need);
            o += need;
            i += need;
        } else if (hold && have > 0 && i + have == n) {
            *held = have;
            break;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i += have > 0 ? have : 1;
        }
    }
    return o;
}

int eng_vocab_detok_push(const eng_vocab *v, eng_detok *d, int32_t id, bool render_special, char *buf,
                         size_t cap, size_t *n_out) {
    if (!v || !d || !n_out || (!buf && cap) || d->n_pending > 3) return ENG_ERR_INVALID;
    size_t plen;
    int rc = eng_vocab_token_to_piece(v, id, render_special, NULL, 0, &plen);
    if (rc != ENG_OK && rc != ENG_ERR_TOO_LARGE) return rc;
    size_t in_len = d->n_pending + plen;
    uint8_t stack_in[256];
    char stack_out[768];
    uint8_t *in = in_len <= sizeof stack_in ? stack_in : malloc(in_len);
    char *tmp = in_len * 3 <= sizeof stack_out ? stack_out : malloc(in_len * 3);
    if (!in || !tmp) {
        if (in != stack_in) free(in);
        if (tmp != stack_out) free(tmp);
        return ENG_ERR_NOMEM;
    }
    memcpy(in, d->pending, d->n_pending);
    size_t got;
    eng_vocab_token_to_piece(v, id, render_special, (char *)in + d->n_pending, plen, &got);
    size_t held;
    size_t o = sanitize(in, in_len, true, tmp, &held);
    *n_out = o;
    if (o > cap) {
        rc = ENG_ERR_TOO_LARGE;
    } else {
        if (o) memcpy(buf, tmp, o);
        memcpy(d->pending, in + in_len - held, held);
        d->n_pending = (uint8_t)held;
        rc = ENG_OK;
    }
    if (in != stack_in) free(in);
    if (tmp != stack_out) free(tmp);
    return rc;
}

void eng_detok_reset(eng_detok *d) {
    if (d) memset(d, 0, sizeof *d);
}

int eng_detok_flush(eng_detok *d, char *buf, size_t cap, size_t *n_out) {
    if (!d || !n_out || (!buf && cap) || d->n_pending > sizeof d->pending) return ENG_ERR_INVALID;
    char tmp[3 * sizeof d->pending];
    size_t held;
    size_t o = sanitize(d->pending, d->n_pending, false, tmp, &held);
    *n_out = o;
    if (o > cap) return ENG_ERR_TOO_LARGE;
    if (o) memcpy(buf, tmp, o);
    d->n_pending = 0;
    return ENG_OK;
}
