/*
 * tokenizer.c: vocabulary loading, SPM and byte-level BPE tokenization, pieces and streaming detokenization.
 * See tokenizer.h for the contract. The behaviour follows llama.cpp's tokenizer (facts only; code is ours).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "engine/text/tokenizer.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void set_err(char *err, size_t err_len, const char *fmt, ...) {
    if (!err || err_len == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;   /* FNV-1a 64 */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* Length of the UTF-8 sequence a lead byte announces, by its high nibble (continuation and invalid bytes: 1;
 * the length is not validated, as in llama.cpp). */
static size_t utf8_len_lead(uint8_t c) {
    static const uint8_t tab[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return tab[c >> 4];
}

static size_t utf8_encode(uint32_t cp, char *out) {
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
static void utf8_check(const uint8_t *s, size_t n, size_t *have, size_t *need) {
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

static int ivec_push(ivec *v, int32_t x) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 64;
        int32_t *na = realloc(v->a, nc * sizeof *na);
        if (!na) return ENG_ERR_NOMEM;
        v->a = na;
        v->cap = nc;
    }
    v->a[v->n++] = x;
    return ENG_OK;
}

/* A growable byte buffer. */
typedef struct bbuf { char *p; size_t n, cap; } bbuf;

static int bbuf_put(bbuf *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) return ENG_ERR_NOMEM;
        b->p = np;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return ENG_OK;
}

/* ---- lookups ---------------------------------------------------------------------------------------------- */

int32_t eng_vocab_find(const eng_vocab *v, const char *text, size_t len) {
    if (!v || (!text && len)) return -1;
    uint64_t h = hash_bytes(text, len);
    for (uint32_t i = (uint32_t)h & v->tmap_mask;; i = (i + 1) & v->tmap_mask) {
        int32_t id = v->tmap[i];
        if (id < 0) return -1;
        const tok_entry *t = &v->tok[id];
        if (t->len == len && memcmp(v->text + t->off, text, len) == 0) return id;
    }
}

static int32_t merge_rank(const eng_vocab *v, int32_t left, int32_t right) {
    if (!v->has_merges || left < 0 || right < 0) return -1;
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    for (uint64_t i = hash_u64(key) & v->mmask;; i = (i + 1) & v->mmask) {
        if (v->mkey[i] == UINT64_MAX) return -1;
        if (v->mkey[i] == key) return v->mrank[i];
    }
}

/* ---- loading ---------------------------------------------------------------------------------------------- */

/* A special-token id key. Absent, "none" (-1 / 0xFFFFFFFF) or out of range: the default stays (llama.cpp warns
 * and keeps its default for out-of-range ids too), except that "none" clears it. */
static int get_int_key(const eng_gguf *g, const char *key, int32_t n_tokens, int32_t *out, char *err,
                       size_t err_len) {
    int64_t x;
    int rc = eng_gguf_get_i64(g, key, &x);
    if (rc == ENG_ERR_NOT_FOUND) return ENG_OK;
    if (rc != ENG_OK) {
        set_err(err, err_len, "%s: %s is not an integer", eng_gguf_name(g), key);
        return ENG_ERR_FORMAT;
    }
    if (x == 0xFFFFFFFFLL || x == -1) *out = -1;
    else if (x >= 0 && x < n_tokens) *out = (int32_t)x;
    return ENG_OK;
}

static int get_bool_key(const eng_gguf *g, const char *key, bool *out, char *err, size_t err_len) {
    bool b;
    int rc = eng_gguf_get_bool(g, key, &b);
    if (rc == ENG_ERR_NOT_FOUND) return ENG_OK;
    if (rc != ENG_OK) {
        set_err(err, err_len, "%s: %s is not a bool", eng_gguf_name(g), key);
        return ENG_ERR_FORMAT;
    }
    *out = b;
    return ENG_OK;
}

static bool str_is(eng_gguf_str s, const char *lit) {
    size_t n = strlen(lit);
    return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

/* Pre-tokenizer regexes (facts from llama.cpp's llm_tokenizer_bpe). */
static const char *const RE_GPT2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
static const char *const RE_LLAMA3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const RE_QWEN2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static int pre_from_name(eng_gguf_str s, eng_pre_type *pre, bool *ignore_merges, bool *add_bos_default) {
    static const char *const llama3[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", NULL};
    static const char *const gpt2[] = {"gpt-2", "phi-2", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de",
                                       "mpt", "olmo", "jais", "gigachat", NULL};
    static const char *const qwen2[] = {"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", NULL};
    static const char *const smollm[] = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                                         "minerva-7b", NULL};
    *ignore_merges = false;
    *add_bos_default = false;
    if (s.len == 0 || str_is(s, "default")) { *pre = ENG_PRE_DEFAULT; return ENG_OK; }
    for (int i = 0; llama3[i]; i++)
        if (str_is(s, llama3[i])) { *pre = ENG_PRE_LLAMA3; *ignore_merges = true; *add_bos_default = true; return ENG_OK; }
    for (int i = 0; gpt2[i]; i++)
        if (str_is(s, gpt2[i])) { *pre = ENG_PRE_GPT2; return ENG_OK; }
    for (int i = 0; qwen2[i]; i++)
        if (str_is(s, qwen2[i])) { *pre = ENG_PRE_QWEN2; return ENG_OK; }
    for (int i = 0; smollm[i]; i++)
        if (str_is(s, smollm[i])) { *pre = ENG_PRE_SMOLLM; return ENG_OK; }
    return ENG_ERR_UNSUPPORTED;
}

static int compile_regexes(eng_vocab *v, char *err, size_t err_len, const char *name) {
    const char *pats[TOK_MAX_REGEX] = {0};
    int n = 0;
    switch (v->pre) {
    case ENG_PRE_GPT2: pats[n++] = RE_GPT2; break;
    case ENG_PRE_LLAMA3: pats[n++] = RE_LLAMA3; break;
    case ENG_PRE_QWEN2: pats[n++] = RE_QWEN2; break;
    case ENG_PRE_SMOLLM: pats[n++] = "\\p{N}"; pats[n++] = RE_GPT2; break;
    case ENG_PRE_DEFAULT:
    default:
        pats[n++] = "[\\p{P}\\$\\+<=>\\^~\\|]+";
        pats[n++] = RE_GPT2;
        pats[n++] = "\\p{N}+";
        pats[n++] = "[0-9][0-9][0-9]";
        break;
    }
    for (int i = 0; i < n; i++) {
        int ecode;
        PCRE2_SIZE eoff;
        v->re[i] = pcre2_compile((PCRE2_SPTR)pats[i], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ecode, &eoff, NULL);
        if (!v->re[i]) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(ecode, msg, sizeof msg);
            set_err(err, err_len, "%s: pre-tokenizer regex %d does not compile: %s", name, i, (const char *)msg);
            return ENG_ERR_UNSUPPORTED;
        }
        v->n_regex = i + 1;
        (void)pcre2_jit_compile(v->re[i], PCRE2_JIT_COMPLETE);   /* optional: the interpreter is the fallback */
    }
    return ENG_OK;
}

static void init_byte_map(eng_vocab *v) {
    for (int i = 0; i < 512; i++) v->cp_byte[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        uint16_t cp = keep ? (uint16_t)b : (uint16_t)(256 + extra++);
        v->byte_cp[b] = cp;
        v->cp_byte[cp] = (int16_t)b;
    }
}

static int cmp_special(const void *a, const void *b, void *ctx) {
    const eng_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (v->tok[x].len != v->tok[y].len) return v->tok[x].len > v->tok[y].len ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* qsort_r is a GNU extension; a plain insertion-free merge sort keeps this portable. */
static void sort_specials(eng_vocab *v, int32_t *a, int32_t n, int32_t *tmp) {
    if (n < 2) return;
    int32_t h = n / 2;
    sort_specials(v, a, h, tmp);
    sort_specials(v, a + h, n - h, tmp);
    int32_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = cmp_special(&a[j], &a[i], v) < 0 ? a[j++] : a[i++];
    while (i < h) tmp[k++] = a[i++];
    while (j < n) tmp[k++] = a[j++];
    memcpy(a, tmp, (size_t)n * sizeof *a);
}

void eng_vocab_free(eng_vocab *v) {
    if (!v) return;
    for (int i = 0; i < v->n_regex; i++) pcre2_code_free(v->re[i]);
    free(v->tok);
    free(v->text);
    free(v->tmap);
    free(v->mkey);
    free(v->mrank);
    free(v->eog);
    free(v->specials);
    free(v);
}

static int build_merges(eng_vocab *v, const eng_gguf_str *m, uint64_t n, const char *name, char *err,
                        size_t err_len) {
    uint64_t cap = 16;
    while (cap < n * 2) cap *= 2;
    v->mkey = malloc(cap * sizeof *v->mkey);
    v->mrank = malloc(cap * sizeof *v->mrank);
    if (!v->mkey || !v->mrank) return ENG_ERR_NOMEM;
    for (uint64_t i = 0; i < cap; i++) v->mkey[i] = UINT64_MAX;
    v->mmask = cap - 1;
    v->has_merges = true;
    for (uint64_t r = 0; r < n; r++) {
        const char *s = m[r].ptr;
        uint64_t len = m[r].len;
        /* "left right": split at the first space after the first byte */
        uint64_t sp = 1;
        while (sp < len && s[sp] != ' ') sp++;
        if (len < 3 || sp >= len) {
            set_err(err, err_len, "%s: tokenizer.ggml.merges[%llu] is not \"left right\"", name,
                    (unsigned long long)r);
            return ENG_ERR_FORMAT;
        }
        int32_t l = eng_vocab_find(v, s, sp), rt = eng_vocab_find(v, s + sp + 1, len - sp - 1);
        if (l < 0 || rt < 0) continue;   /* can never apply: symbols are vocabulary tokens */
        uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)rt;
        for (uint64_t i = hash_u64(key) & v->mmask;; i = (i + 1) & v->mmask) {
            if (v->mkey[i] == key) break;    /* a repeated merge keeps its first (best) rank */
            if (v->mkey[i] == UINT64_MAX) {
                v->mkey[i] = key;
                v->mrank[i] = (int32_t)r;
                break;
            }
        }
    }
    return ENG_OK;
}

int eng_vocab_load(const eng_gguf *g, eng_vocab **out, char *err, size_t err_len) {
    if (!g || !out) return ENG_ERR_INVALID;
    *out = NULL;
    const char *name = eng_gguf_name(g);
    eng_gguf_str model;
    int rc = eng_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (rc != ENG_OK) {
        set_err(err, err_len, "%s: no tokenizer.ggml.model string", name);
        return ENG_ERR_FORMAT;
    }
    eng_vocab_type type;
    if (str_is(model, "llama")) type = ENG_VOCAB_SPM;
    else if (str_is(model, "gpt2")) type = ENG_VOCAB_BPE;
    else {
        set_err(err, err_len, "%s: unsupported tokenizer model '%.*s' (supported: llama, gpt2)", name,
                (int)(model.len > 64 ? 64 : model.len), model.ptr);
        return ENG_ERR_UNSUPPORTED;
    }

    uint32_t et;
    uint64_t n;
    const void *data;
    const eng_gguf_str *strs;
    rc = eng_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &data, &strs);
    if (rc != ENG_OK || et != ENG_GGUF_STRING || !strs) {
        set_err(err, err_len, "%s: no tokenizer.ggml.tokens string array", name);
        return ENG_ERR_FORMAT;
    }
    if (n == 0 || n > INT32_MAX / 4) {
        set_err(err, err_len, "%s: tokenizer.ggml.tokens has %llu entries", name, (unsigned long long)n);
        return ENG_ERR_FORMAT;
    }

    eng_vocab *v = calloc(1, sizeof *v);
    if (!v) return ENG_ERR_NOMEM;
    v->type = type;
    v->n_tokens = (int32_t)n;
    v->bos = v->eos = v->eot = v->eom = v->unk = -1;
    rc = ENG_ERR_NOMEM;
    v->tok = calloc(n, sizeof *v->tok);
    v->eog = calloc(n, 1);
    if (!v->tok || !v->eog) goto fail;

    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (strs[i].len > 0xFFFFFF || total + strs[i].len > UINT32_MAX) {
            set_err(err, err_len, "%s: token %llu text is too long", name, (unsigned long long)i);
            rc = ENG_ERR_FORMAT;
            goto fail;
        }
        total += strs[i].len;
    }
    v->text = malloc(total ? total : 1);
    if (!v->text) goto fail;
    v->text_len = total;
    total = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (strs[i].len) memcpy(v->text + total, strs[i].ptr, strs[i].len);
        v->tok[i].off = (uint32_t)total;
        v->tok[i].len = (uint32_t)strs[i].len;
        v->tok[i].type = ENG_TOKTYPE_NORMAL;
        total += strs[i].len;
    }

    /* scores (optional) */
    rc = eng_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, &data, &strs);
    if (rc == ENG_OK) {
        if (et != ENG_GGUF_FLOAT32 || n != (uint64_t)v->n_tokens) {
            set_err(err, err_len, "%s: tokenizer.ggml.scores must be %d float32", name, (int)v->n_tokens);
            rc = ENG_ERR_FORMAT;
            goto fail;
        }
        for (int32_t i = 0; i < v->n_tokens; i++) memcpy(&v->tok[i].score, (const char *)data + 4 * (size_t)i, 4);
    } else if (rc != ENG_ERR_NOT_FOUND) {
        set_err(err, err_len, "%s: tokenizer.ggml.scores is not an array", name);
        rc = ENG_ERR_FORMAT;
        goto fail;
    }

    /* token types (optional) */
    rc = eng_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &data, &strs);
    if (rc == ENG_OK) {
        if ((et != ENG_GGUF_INT32 && et != ENG_GGUF_UINT32) || n != (uint64_t)v->n_tokens) {
            set_err(err, err_len, "%s: tokenizer.ggml.token_type must be %d int32", name, (int)v->n_tokens);
            rc = ENG_ERR_FORMAT;
            goto fail;
        }
        for (int32_t i = 0; i < v->n_tokens; i++) {
            int32_t t;
            memcpy(&t, (const char *)data + 4 * (size_t)i, 4);
            v->tok[i].type = (t >= ENG_TOKTYPE_NORMAL && t <= ENG_TOKTYPE_BYTE) ? (uint8_t)t : ENG_TOKTYPE_UNDEFINED;
        }
    } else if (rc != ENG_ERR_NOT_FOUND) {
        set_err(err, err_len, "%s: tokenizer.ggml.token_type is not an array", name);
        rc = ENG_ERR_FORMAT;
        goto fail;
    }

    /* text -> id map (later ids win for repeated texts, as llama.cpp's map assignment does) */
    {
        uint32_t cap = 16;
        while (cap < (uint32_t)v->n_tokens * 2u) cap *= 2;
        v->tmap = malloc((size_t)cap * sizeof *v->tmap);
        rc = ENG_ERR_NOMEM;
        if (!v->tmap) goto fail;
        memset(v->tmap, 0xFF, (size_t)cap * sizeof *v->tmap);
        v->tmap_mask = cap - 1;
        for (int32_t id = 0; id < v->n_tokens; id++) {
            const tok_entry *t = &v->tok[id];
            const char *s = v->text + t->off;
            for (uint32_t i = (uint32_t)hash_bytes(s, t->len) & v->tmap_mask;; i = (i + 1) & v->tmap_mask) {
                int32_t o = v->tmap[i];
                if (o < 0) { v->tmap[i] = id; break; }
                if (v->tok[o].len == t->len && memcmp(v->text + v->tok[o].off, s, t->len) == 0) {
                    v->tmap[i] = id;
                    break;
                }
            }
        }
    }

    /* defaults per tokenizer model, then the metadata */
    bool add_bos_default = false;
    if (type == ENG_VOCAB_SPM) {
        v->pre = ENG_PRE_DEFAULT;
        v->add_space_prefix = true;
        add_bos_default = true;
        v->bos = 1 < v->n_tokens ? 1 : -1;
        v->eos = 2 < v->n_tokens ? 2 : -1;
        v->unk = 0;
    } else {
        eng_gguf_str pre = {"", 0};
        rc = eng_gguf_get_str(g, "tokenizer.ggml.pre", &pre);
        if (rc != ENG_OK && rc != ENG_ERR_NOT_FOUND) {
            set_err(err, err_len, "%s: tokenizer.ggml.pre is not a string", name);
            rc = ENG_ERR_FORMAT;
            goto fail;
        }
        if (rc == ENG_ERR_NOT_FOUND) pre.len = 0;
        rc = pre_from_name(pre, &v->pre, &v->ignore_merges, &add_bos_default);
        if (rc != ENG_OK) {
            set_err(err, err_len, "%s: unsupported pre-tokenizer '%.*s'", name, (int)(pre.len > 64 ? 64 : pre.len),
                    pre.ptr);
            goto fail;
        }
        v->bos = 11 < v->n_tokens ? 11 : -1;   /* llama.cpp's defaults for gpt2 vocabularies */
        v->eos = 11 < v->n_tokens ? 11 : -1;
        v->unk = -1;
    }
    v->add_bos = add_bos_default;
    v->add_eos = false;
    if ((rc = get_int_key(g, "tokenizer.ggml.bos_token_id", v->n_tokens, &v->bos, err, err_len))) goto fail;
    if ((rc = get_int_key(g, "tokenizer.ggml.eos_token_id", v->n_tokens, &v->eos, err, err_len))) goto fail;
    if ((rc = get_int_key(g, "tokenizer.ggml.unknown_token_id", v->n_tokens, &v->unk, err, err_len))) goto fail;
    if ((rc = get_int_key(g, "tokenizer.ggml.eot_token_id", v->n_tokens, &v->eot, err, err_len))) goto fail;
    if ((rc = get_int_key(g, "tokenizer.ggml.eom_token_id", v->n_tokens, &v->eom, err, err_len))) goto fail;
    if ((rc = get_bool_key(g, "tokenizer.ggml.add_bos_token", &v->add_bos, err, err_len))) goto fail;
    if ((rc = get_bool_key(g, "tokenizer.ggml.add_eos_token", &v->add_eos, err, err_len))) goto fail;
    if (type == ENG_VOCAB_SPM &&
        (rc = get_bool_key(g, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix, err, err_len)))
        goto fail;
    if (v->add_bos && v->bos < 0) v->add_bos = false;
    if (v->add_eos && v->eos < 0) v->add_eos = false;

    /* merges */
    if (type == ENG_VOCAB_BPE) {
        rc = eng_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n, &data, &strs);
        if (rc != ENG_OK || et != ENG_GGUF_STRING || !strs) {
            set_err(err, err_len, "%s: no tokenizer.ggml.merges string array (needed by gpt2 vocabularies)", name);
            rc = ENG_ERR_FORMAT;
            goto fail;
        }
        if (n > INT32_MAX / 4) {
            set_err(err, err_len, "%s: too many merges", name);
            rc = ENG_ERR_FORMAT;
            goto fail;
        }
        if ((rc = build_merges(v, strs, n, name, err, err_len))) goto fail;
        init_byte_map(v);
        if ((rc = compile_regexes(v, err, err_len, name))) goto fail;
    }

    if (type == ENG_VOCAB_SPM) {
        v->spm_split = true;
        for (int32_t i = 0; i < v->n_tokens && v->spm_split; i++) {
            const char *p = v->text + v->tok[i].off;
            uint32_t l = v->tok[i].len;
            for (uint32_t k = 1; k + 3 <= l; k++)
                if (memcmp(p + k, "\xe2\x96\x81", 3) == 0 && (k < 3 || memcmp(p + k - 3, "\xe2\x96\x81", 3) != 0)) {
                    v->spm_split = false;
                    break;
                }
        }
    }

    /* byte tokens (SPM byte fallback) */
    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int32_t id = eng_vocab_find(v, hex, 6);
        if (id < 0 && b < 0x80) {   /* else the byte itself as a token */
            char c = (char)b;
            id = eng_vocab_find(v, &c, 1);
        }
        v->byte_tok[b] = id;
    }

    /* end-of-generation tokens, found by text as llama.cpp does; they become control tokens */
    {
        static const char *const eot_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                                "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
                                                "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                                "<end_of_utterance>", NULL};
        static const char *const eog_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
                                                "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>",
                                                "<|end_of_text|>", "<end_of_utterance>", NULL};
        if (v->eot < 0) {
            for (int i = 0; eot_texts[i] && v->eot < 0; i++) {
                int32_t id = eng_vocab_find(v, eot_texts[i], strlen(eot_texts[i]));
                if (id >= 0) v->eot = id;
            }
            if (v->eot >= 0) v->tok[v->eot].type = ENG_TOKTYPE_CONTROL;
        }
        if (v->eom < 0) {
            int32_t id = eng_vocab_find(v, "<|eom_id|>", 10);
            if (id >= 0) { v->eom = id; v->tok[id].type = ENG_TOKTYPE_CONTROL; }
        }
        for (int i = 0; eog_texts[i]; i++) {
            int32_t id = eng_vocab_find(v, eog_texts[i], strlen(eog_texts[i]));
            if (id >= 0) { v->eog[id] = 1; v->tok[id].type = ENG_TOKTYPE_CONTROL; }
        }
        if (v->eos >= 0) v->eog[v->eos] = 1;
        if (v->eot >= 0) v->eog[v->eot] = 1;
        if (v->eom >= 0) v->eog[v->eom] = 1;
    }

    /* special tokens for partitioning */
    {
        int32_t cnt = 0;
        for (int32_t i = 0; i < v->n_tokens; i++) {
            uint8_t t = v->tok[i].type;
            if ((t == ENG_TOKTYPE_CONTROL || t == ENG_TOKTYPE_USER_DEFINED || t == ENG_TOKTYPE_UNKNOWN) &&
                v->tok[i].len > 0)
                cnt++;
        }
        rc = ENG_ERR_NOMEM;
        v->specials = malloc((size_t)(cnt ? cnt : 1) * sizeof *v->specials);
        int32_t *tmp = malloc((size_t)(cnt ? cnt : 1) * sizeof *tmp);
        if (!v->specials || !tmp) { free(tmp); goto fail; }
        cnt = 0;
        for (int32_t i = 0; i < v->n_tokens; i++) {
            uint8_t t = v->tok[i].type;
            if ((t == ENG_TOKTYPE_CONTROL || t == ENG_TOKTYPE_USER_DEFINED || t == ENG_TOKTYPE_UNKNOWN) &&
                v->tok[i].len > 0)
                v->specials[cnt++] = i;
        }
        v->n_specials = cnt;
        sort_specials(v, v->specials, cnt, tmp);
        free(tmp);
    }

    /* Phi-3 models: special tokens swallow the whitespace after them (llama.cpp sets this by model name) */
    {
        eng_gguf_str gname;
        if (eng_gguf_get_str(g, "general.name", &gname) == ENG_OK) {
            char low[256];
            size_t k = gname.len < sizeof low - 1 ? gname.len : sizeof low - 1;
            for (size_t i = 0; i < k; i++) low[i] = (char)tolower((unsigned char)gname.ptr[i]);
            low[k] = 0;
            if (strstr(low, "phi-3") || strstr(low, "phi3")) {
                for (int32_t i = 0; i < v->n_specials; i++) v->tok[v->specials[i]].attr |= TOKATTR_RSTRIP;
                int32_t id = eng_vocab_find(v, "</s>", 4);
                if (id >= 0) v->tok[id].attr |= TOKATTR_RSTRIP;
                static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
                for (int i = 0; i < 3; i++) {
                    id = eng_vocab_find(v, keep[i], strlen(keep[i]));
                    if (id >= 0) v->tok[id].attr &= (uint8_t)~TOKATTR_RSTRIP;
                }
            }
        }
    }

    *out = v;
    return ENG_OK;
fail:
    if (rc == ENG_ERR_NOMEM) set_err(err, err_len, "%s: out of memory loading the vocabulary", name);
    eng_vocab_free(v);
    return rc;
}

/* ---- accessors -------------------------------------------------------------------------------------------- */

eng_vocab_type eng_vocab_get_type(const eng_vocab *v) { return v->type; }
eng_pre_type eng_vocab_pre(const eng_vocab *v) { return v->pre; }
int32_t eng_vocab_n_tokens(const eng_vocab *v) { return v ? v->n_tokens : 0; }
int32_t eng_vocab_bos(const eng_vocab *v) { return v ? v->bos : -1; }
int32_t eng_vocab_eos(const eng_vocab *v) { return v ? v->eos : -1; }
int32_t eng_vocab_eot(const eng_vocab *v) { return v ? v->eot : -1; }
int32_t eng_vocab_unk(const eng_vocab *v) { return v ? v->unk : -1; }
bool eng_vocab_add_bos(const eng_vocab *v) { return v && v->add_bos; }
bool eng_vocab_add_eos(const eng_vocab *v) { return v && v->add_eos; }
bool eng_vocab_add_space_prefix(const eng_vocab *v) { return v && v->type == ENG_VOCAB_SPM && v->add_space_prefix; }

int eng_vocab_token_type(const eng_vocab *v, int32_t id) {
    if (!v || id < 0 || id >= v->n_tokens) return -1;
    return v->tok[id].type;
}

const char *eng_vocab_token_text(const eng_vocab *v, int32_t id, size_t *len) {
    if (!v || id < 0 || id >= v->n_tokens) return NULL;
    if (len) *len = v->tok[id].len;
    return v->text + v->tok[id].off;
}

float eng_vocab_token_score(const eng_vocab *v, int32_t id) {
    if (!v || id < 0 || id >= v->n_tokens) return 0.0f;
    return v->tok[id].score;
}

bool eng_vocab_is_eog(const eng_vocab *v, int32_t id) {
    return v && id >= 0 && id < v->n_tokens && v->eog[id];
}

bool eng_vocab_is_control(const eng_vocab *v, int32_t id) {
    return v && id >= 0 && id < v->n_tokens && v->tok[id].type == ENG_TOKTYPE_CONTROL;
}

bool eng_vocab_is_special(const eng_vocab *v, int32_t id) {
    return v && id >= 0 && id < v->n_tokens &&
           (v->tok[id].type == ENG_TOKTYPE_CONTROL || v->tok[id].type == ENG_TOKTYPE_USER_DEFINED);
}

/* ---- SPM ---------------------------------------------------------------------------------------------------- */

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

static bool bg_before(const heap *h, const bigram *x, const bigram *y) {
    if (h->spm) {
        if (x->score != y->score) return x->score > y->score;
    } else if (x->rank != y->rank) {
        return x->rank < y->rank;
    }
    return x->left < y->left;
}

static int heap_push(heap *h, bigram b) {
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 64;
        bigram *na = realloc(h->a, nc * sizeof *na);
        if (!na) return ENG_ERR_NOMEM;
        h->a = na;
        h->cap = nc;
    }
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

static bigram heap_pop(heap *h) {
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

/* scratch shared by one tokenize call */
typedef struct work {
    sym *s;
    size_t ns, caps;
    heap h;
    bbuf buf;     /* escaped / byte-mapped text */
} work;

static int work_syms(work *w, size_t n) {
    if (n > w->caps) {
        sym *ns = realloc(w->s, n * sizeof *ns);
        if (!ns) return ENG_ERR_NOMEM;
        w->s = ns;
        w->caps = n;
    }
    w->ns = 0;
    return ENG_OK;
}

static int spm_try_bigram(const eng_vocab *v, work *w, const char *text, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return ENG_OK;
    uint32_t size = w->s[l].n + w->s[r].n;
    int32_t id = eng_vocab_find(v, text + w->s[l].off, size);
    if (id < 0) return ENG_OK;
    bigram b = {.score = v->tok[id].score, .left = l, .right = r, .size = size};
    return heap_push(&w->h, b);
}

static int spm_emit_bytes(const eng_vocab *v, const char *p, size_t n, ivec *out) {
    for (size_t j = 0; j < n; j++) {
        int32_t id = v->byte_tok[(uint8_t)p[j]];
        if (id < 0) id = v->unk;
        if (id >= 0 && ivec_push(out, id)) return ENG_ERR_NOMEM;
    }
    return ENG_OK;
}

/* SPM merging of one piece of escaped text. */
static int spm_segment(const eng_vocab *v, work *w, const char *text, size_t len, ivec *out) {
    if (len == 0) return ENG_OK;
    if (work_syms(w, len)) return ENG_ERR_NOMEM;
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
        bigram b = heap_pop(&w->h);
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
            if (ivec_push(out, id)) return ENG_ERR_NOMEM;
        } else if (spm_emit_bytes(v, text + s->off, s->n, out)) {
            return ENG_ERR_NOMEM;
        }
    }
    return ENG_OK;
}

/* SPM over an already escaped text: split before each run of U+2581 when the vocabulary allows it (keeps the
 * merge queue small; the result is the same, see spm_split), else all at once. */
static int spm_tokenize(const eng_vocab *v, work *w, const char *text, size_t len, ivec *out) {
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

/* ---- BPE ---------------------------------------------------------------------------------------------------- */

static int bpe_add_bigram(const eng_vocab *v, work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return ENG_OK;
    int32_t rank = merge_rank(v, w->s[l].id, w->s[r].id);
    if (rank < 0) return ENG_OK;
    bigram b = {.rank = rank, .left = l, .right = r, .lid = w->s[l].id, .rid = w->s[r].id};
    return heap_push(&w->h, b);
}

/* Byte-level BPE of one pre-tokenized word word[0..len) (raw bytes). */
static int bpe_word(const eng_vocab *v, work *w, const char *word, size_t len, ivec *out) {
    w->buf.n = 0;
    for (size_t i = 0; i < len; i++) {
        char u[4];
        size_t k = utf8_encode(v->byte_cp[(uint8_t)word[i]], u);
        if (bbuf_put(&w->buf, u, k)) return ENG_ERR_NOMEM;
    }
    const char *t = w->buf.p;
    size_t n = w->buf.n;
    if (n == 0) return ENG_OK;
    if (v->ignore_merges) {
        int32_t id = eng_vocab_find(v, t, n);
        if (id >= 0) return ivec_push(out, id);
    }
    if (work_syms(w, n)) return ENG_ERR_NOMEM;
    size_t off = 0;
    while (off < n) {
        size_t cl = utf8_len_lead((uint8_t)t[off]);
        if (cl > n - off) cl = n - off;
        sym *s = &w->s[w->ns];
        s->off = (uint32_t)off;
        s->n = (uint32_t)cl;
        s->prev = (int32_t)w->ns - 1;
        off += cl;
        s->next = off == n ? -1 : (int32_t)w->ns + 1;
        s->id = eng_vocab_find(v, t + s->off, cl);
        w->ns++;
    }
    w->h.n = 0;
    w->h.spm = false;
    for (size_t i = 1; i < w->ns; i++)
        if (bpe_add_bigram(v, w, (int32_t)i - 1, (int32_t)i)) return ENG_ERR_NOMEM;
    while (w->h.n) {
        bigram b = heap_pop(&w->h);
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
            if (ivec_push(out, s->id)) return ENG_ERR_NOMEM;
            continue;
        }
        for (uint32_t j = 0; j < s->n; j++) {   /* no token: single bytes that happen to be tokens */
            int32_t id = eng_vocab_find(v, t + s->off + j, 1);
            if (id >= 0 && ivec_push(out, id)) return ENG_ERR_NOMEM;
        }
    }
    return ENG_OK;
}

typedef struct span { size_t off, len; } span;
typedef struct spanvec { span *a; size_t n, cap; } spanvec;

static int span_push(spanvec *v, size_t off, size_t len) {
    if (len == 0) return ENG_OK;
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 64;
        span *na = realloc(v->a, nc * sizeof *na);
        if (!na) return ENG_ERR_NOMEM;
        v->a = na;
        v->cap = nc;
    }
    v->a[v->n++] = (span){off, len};
    return ENG_OK;
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

static int bpe_tokenize(const eng_vocab *v, work *w, const char *text, size_t len, ivec *out) {
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

/* ---- special-token partitioning and the tokenize entry point ---------------------------------------------- */

typedef struct frag { size_t off, len; int32_t tok; /* -1: raw text */ } frag;
typedef struct fragvec { frag *a; size_t n, cap; } fragvec;

static int frag_push(fragvec *f, frag x) {
    if (f->n == f->cap) {
        size_t nc = f->cap ? f->cap * 2 : 16;
        frag *na = realloc(f->a, nc * sizeof *na);
        if (!na) return ENG_ERR_NOMEM;
        f->a = na;
        f->cap = nc;
    }
    f->a[f->n++] = x;
    return ENG_OK;
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
    bbuf esc = {0};
    int rc = ENG_ERR_NOMEM;

    if (len > 0) {
        if (frag_push(&f, (frag){0, len, -1})) goto done;
        if ((rc = partition(v, text, &f, &ftmp, parse_special))) goto done;
    }
    if (add_special && v->add_bos && ivec_push(&ids, v->bos)) { rc = ENG_ERR_NOMEM; goto done; }
    bool prev_special = true;   /* SPM: a text fragment at the start or after a special token gets the space */
    for (size_t i = 0; i < f.n; i++) {
        const frag *fr = &f.a[i];
        if (fr->tok >= 0) {
            if (ivec_push(&ids, fr->tok)) { rc = ENG_ERR_NOMEM; goto done; }
            prev_special = true;
            continue;
        }
        if (v->type == ENG_VOCAB_SPM) {
            esc.n = 0;
            if (v->add_space_prefix && prev_special && bbuf_put(&esc, "\xe2\x96\x81", 3)) { rc = ENG_ERR_NOMEM; goto done; }
            const char *p = text + fr->off;
            for (size_t k = 0; k < fr->len; k++) {
                int e = p[k] == ' ' ? bbuf_put(&esc, "\xe2\x96\x81", 3) : bbuf_put(&esc, p + k, 1);
                if (e) { rc = ENG_ERR_NOMEM; goto done; }
            }
            if ((rc = spm_tokenize(v, &w, esc.p, esc.n, &ids))) goto done;
        } else {
            if ((rc = bpe_tokenize(v, &w, text + fr->off, fr->len, &ids))) goto done;
        }
        prev_special = false;
    }
    if (add_special && v->add_eos && ivec_push(&ids, v->eos)) { rc = ENG_ERR_NOMEM; goto done; }

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
    free(w.buf.p);
    free(esc.p);
    return rc;
}

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
        if (v->type == ENG_VOCAB_SPM) {
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
