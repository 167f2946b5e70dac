/*
 * tok_internal.h: what the tokenizer's files share (tok_load.c, tok_spm.c, tok_bpe.c, tok_detok.c, tokenizer.c).
 * Not a public header: only those files include it. The vocabulary's layout, the scratch of one tokenize call and
 * small UTF-8 and hashing helpers.
 */
#ifndef KVSERVE_TOK_INTERNAL_H
#define KVSERVE_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdint.h>
#include <string.h>

#include "common/common.h"
#include "engine/text/tokenizer.h"

#define TOK_MAX_REGEX 4

/* per-token attribute bits beyond the GGUF type */
enum { TOKATTR_LSTRIP = 1, TOKATTR_RSTRIP = 2 };

typedef struct tok_entry {
    uint32_t off;      /* into eng_vocab.text */
    uint32_t len;
    float score;
    uint8_t type;      /* ENG_TOKTYPE_* */
    uint8_t attr;      /* TOKATTR_* */
} tok_entry;

struct eng_vocab {
    eng_vocab_type type;
    eng_pre_type pre;
    int32_t n_tokens;
    tok_entry *tok;         /* [n_tokens] */
    char *text;             /* all token texts, concatenated */
    size_t text_len;

    /* text -> id: open addressing over ids, capacity a power of two (-1 = empty) */
    int32_t *tmap;
    uint32_t tmap_mask;

    /* BPE merges: (left id, right id) -> rank, open addressing (key UINT64_MAX = empty) */
    uint64_t *mkey;
    int32_t *mrank;
    uint64_t mmask;
    bool has_merges;

    int32_t bos, eos, eot, eom, unk;
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    int32_t sep;            /* WPM: [SEP] (-1 when none) */
    bool add_sep;           /* WPM: add_special appends sep */
    bool wpm_lower, wpm_strip; /* WPM: BertNormalizer lowercase / strip_accents */
    uint32_t max_tok_len;   /* WPM, UGM: longest token text in bytes */
    /* UGM ("t5" unigram, tok_ugm.c) */
    uint8_t *charsmap;      /* tokenizer.ggml.precompiled_charsmap (owned copy), or NULL */
    size_t charsmap_len;
    uint32_t xcda_n;        /* its double array's entries (uint32 each, after the 4-byte size) */
    int32_t *user;          /* ids of the user-defined tokens (owned) */
    int32_t n_user;
    bool ugm_escape;        /* spaces become U+2581 */
    bool ugm_merge_spaces;  /* tokenizer.ggml.remove_extra_whitespaces */
    float ugm_unk_score;    /* the lowest normal token score - 10 */
    bool spm_split;         /* SPM: no token has U+2581 after another character, so merging never crosses the
                               start of a run of U+2581 and each such piece can be merged on its own (exact) */
    uint8_t *eog;           /* [n_tokens] 0/1 */

    int32_t *specials;      /* control/user-defined/unknown ids with non-empty text, longest text first */
    int32_t n_specials;

    int32_t byte_tok[256];  /* SPM: the token of each byte (<0xXX>), -1 when none */

    /* BPE byte-level mapping */
    uint16_t byte_cp[256];  /* byte -> code point */
    int16_t cp_byte[512];   /* code point -> byte, -1 when not a mapped code point */

    int n_regex;
    pcre2_code *re[TOK_MAX_REGEX];
};

/* ---- small helpers --------------------------------------------------------------------------------------- */

static inline uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;   /* FNV-1a 64 */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

static inline uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* Length of the UTF-8 sequence a lead byte announces, by its high nibble (continuation and invalid bytes: 1;
 * the length is not validated, as in llama.cpp). */
static inline size_t utf8_len_lead(uint8_t c) {
    static const uint8_t tab[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return tab[c >> 4];
}

static inline size_t utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Strict UTF-8 (Unicode table 3-7): at s[0..n), how many bytes of a well-formed sequence are present (*have,
 * 0 when s[0] cannot start one) and how many the sequence needs (*need). Complete when *have == *need. */
static inline void utf8_check(const uint8_t *s, size_t n, size_t *have, size_t *need) {
    uint8_t c = s[0];
    uint8_t lo = 0x80, hi = 0xBF;
    size_t len;
    if (c < 0x80) { *have = *need = 1; return; }
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else { *have = 0; *need = 1; return; }
    *need = len;
    size_t k = 1;
    for (; k < len && k < n; k++) {
        uint8_t b = s[k];
        uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) break;
    }
    *have = k;
}

/* A growable int32 array. */
typedef struct ivec { int32_t *a; size_t n, cap; } ivec;

int tok_ivec_push(ivec *v, int32_t x);

/* ---- merge queue (SPM and BPE) ----------------------------------------------------------------------------- */

typedef struct sym {
    int32_t prev, next;
    uint32_t off, n;   /* bytes of the work text */
    int32_t id;        /* BPE: the token of the symbol's text, -1 when none */
} sym;

typedef struct bigram {
    float score;       /* SPM: higher first */
    int32_t rank;      /* BPE: lower first */
    int32_t left, right;
    uint32_t size;     /* SPM: bytes of the pair when queued */
    int32_t lid, rid;  /* BPE: the symbols' tokens when queued */
} bigram;

typedef struct heap { bigram *a; size_t n, cap; bool spm; } heap;

int tok_heap_push(heap *h, bigram b);
bigram tok_heap_pop(heap *h);

/* scratch shared by one tokenize call */
typedef struct work {
    sym *s;
    size_t ns, caps;
    heap h;
    kvs_buf buf;  /* escaped / byte-mapped text */
} work;


/* Makes room for n symbols and empties the list. */
int tok_work_syms(work *w, size_t n);
/* Fills w's symbol list with the UTF-8 characters of text[0..len), linked in order; each symbol's id is its
 * token when v is given (BPE), else -1 (SPM). */
int tok_split_chars(const eng_vocab *v, work *w, const char *text, size_t len);

/* SPM over an already escaped text (tok_spm.c); byte-level BPE over raw text (tok_bpe.c). Append to *out. */
int tok_spm_tokenize(const eng_vocab *v, work *w, const char *text, size_t len, ivec *out);
int tok_bpe_tokenize(const eng_vocab *v, work *w, const char *text, size_t len, ivec *out);
/* WordPiece over raw text (tok_wpm.c): normalized, split into words, each word greedily longest-match first with
 * a U+2581 prefix; a word with an unmatched rest becomes [UNK]. buf is scratch. Appends to *out. */
int tok_wpm_tokenize(const eng_vocab *v, kvs_buf *buf, const char *text, size_t len, ivec *out);
/* Unigram over raw text (tok_ugm.c): normalized (charsmap, spaces), then the best-scoring segmentation. */
int tok_ugm_tokenize(const eng_vocab *v, kvs_buf *buf, const char *text, size_t len, ivec *out);

#endif
