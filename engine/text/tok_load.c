/*
 * tok_load.c: building an eng_vocab from GGUF metadata (tokens, scores, types, special ids, merges, pre-tokenizer
 * regexes), the text -> id lookup and the vocabulary's accessors. See tokenizer.h for the contract.
 */
#include "engine/text/tok_internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- loading ---------------------------------------------------------------------------------------------- */

/* A special-token id key. Absent, "none" (-1 / 0xFFFFFFFF) or out of range: the default stays (llama.cpp warns
 * and keeps its default for out-of-range ids too), except that "none" clears it. */
static int get_int_key(const eng_gguf *g, const char *key, int32_t n_tokens, int32_t *out, char *err,
                       size_t err_len) {
    int64_t x;
    int rc = eng_gguf_get_i64(g, key, &x);
    if (rc == ENG_ERR_NOT_FOUND) return ENG_OK;
    if (rc != ENG_OK) {
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: %s is not an integer", eng_gguf_name(g), key);
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
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: %s is not a bool", eng_gguf_name(g), key);
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

/* gpt-4o (o200k): words split by case, an uppercase run then lowercase letters, each with an optional contraction;
 * "uppercase" is any letter but a-z and "lowercase" any letter but A-Z, as llama.cpp writes the classes (the form
 * its tokenizer runs, not tokenizer.json's \p{Lu}/\p{Ll}); numbers by three; '/' after punctuation runs. */
static const char *const RE_GPT4O =
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]"
    "|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]"
    "|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static int pre_from_name(eng_gguf_str s, eng_pre_type *pre, bool *ignore_merges, bool *add_bos_default) {
    static const char *const llama3[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", NULL};
    static const char *const gpt2[] = {"gpt-2", "phi-2", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de",
                                       "mpt", "olmo", "jais", "gigachat", NULL};
    static const char *const qwen2[] = {"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", NULL};
    static const char *const gpt4o[] = {"gpt-4o", "llama4", NULL};
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
    for (int i = 0; gpt4o[i]; i++)
        if (str_is(s, gpt4o[i])) { *pre = ENG_PRE_GPT4O; return ENG_OK; }
    return ENG_ERR_UNSUPPORTED;
}

static int compile_regexes(eng_vocab *v, char *err, size_t err_len, const char *name) {
    const char *pats[TOK_MAX_REGEX] = {0};
    int n = 0;
    switch (v->pre) {
    case ENG_PRE_GPT2: pats[n++] = RE_GPT2; break;
    case ENG_PRE_LLAMA3: pats[n++] = RE_LLAMA3; break;
    case ENG_PRE_QWEN2: pats[n++] = RE_QWEN2; break;
    case ENG_PRE_GPT4O: pats[n++] = RE_GPT4O; break;
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
            return kvs_errf(err, err_len, ENG_ERR_UNSUPPORTED, "%s: pre-tokenizer regex %d does not compile: %s", name, i, (const char *)msg);
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
    KVS_FREE_ALL(v->tok, v->text, v->tmap, v->mkey, v->mrank, v->eog, v->specials, v->charsmap, v->user, v);
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
            return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: tokenizer.ggml.merges[%llu] is not \"left right\"", name,
                    (unsigned long long)r);
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

/* Token texts into one block, with their offsets. */
static int load_texts(eng_vocab *v, const eng_gguf_str *strs, uint64_t n, const char *name, char *err,
                      size_t err_len) {
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (strs[i].len > 0xFFFFFF || total + strs[i].len > UINT32_MAX)
            return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: token %llu text is too long", name,
                            (unsigned long long)i);
        total += strs[i].len;
    }
    v->text = malloc(total ? total : 1);
    if (!v->text) return ENG_ERR_NOMEM;
    v->text_len = total;
    total = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (strs[i].len) memcpy(v->text + total, strs[i].ptr, strs[i].len);
        v->tok[i].off = (uint32_t)total;
        v->tok[i].len = (uint32_t)strs[i].len;
        v->tok[i].type = ENG_TOKTYPE_NORMAL;
        total += strs[i].len;
    }
    return ENG_OK;
}

/* The string array at key into *strs (n of them): 0, or ENG_ERR_NOT_FOUND (absent) / ENG_ERR_TYPE (another kind
 * of value). */
static int get_strings(const eng_gguf *g, const char *key, const eng_gguf_str **strs, uint64_t *n) {
    uint32_t et;
    const void *data;
    int rc = eng_gguf_get_arr(g, key, &et, n, &data, strs);
    if (rc == ENG_OK && (et != ENG_GGUF_STRING || !*strs)) rc = ENG_ERR_TYPE;
    return rc;
}

/* The optional per-token arrays: scores and token types. */
static int load_scores_types(const eng_gguf *g, eng_vocab *v, const char *name, char *err, size_t err_len) {
    uint32_t et;
    uint64_t n;
    const void *data;
    const eng_gguf_str *strs;
    int rc = eng_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, &data, &strs);
    if (rc == ENG_OK) {
        if (et != ENG_GGUF_FLOAT32 || n != (uint64_t)v->n_tokens)
            return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: tokenizer.ggml.scores must be %d float32", name,
                            (int)v->n_tokens);
        for (int32_t i = 0; i < v->n_tokens; i++) memcpy(&v->tok[i].score, (const char *)data + 4 * (size_t)i, 4);
    } else if (rc != ENG_ERR_NOT_FOUND) {
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: tokenizer.ggml.scores is not an array", name);
    }
    rc = eng_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &data, &strs);
    if (rc == ENG_OK) {
        if ((et != ENG_GGUF_INT32 && et != ENG_GGUF_UINT32) || n != (uint64_t)v->n_tokens)
            return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: tokenizer.ggml.token_type must be %d int32", name,
                            (int)v->n_tokens);
        for (int32_t i = 0; i < v->n_tokens; i++) {
            int32_t t;
            memcpy(&t, (const char *)data + 4 * (size_t)i, 4);
            v->tok[i].type = (t >= ENG_TOKTYPE_NORMAL && t <= ENG_TOKTYPE_BYTE) ? (uint8_t)t : ENG_TOKTYPE_UNDEFINED;
        }
    } else if (rc != ENG_ERR_NOT_FOUND) {
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: tokenizer.ggml.token_type is not an array", name);
    }
    return ENG_OK;
}

/* text -> id map (later ids win for repeated texts, as llama.cpp's map assignment does) */
static int build_text_map(eng_vocab *v) {
    uint32_t cap = 16;
    while (cap < (uint32_t)v->n_tokens * 2u) cap *= 2;
    v->tmap = malloc((size_t)cap * sizeof *v->tmap);
    if (!v->tmap) return ENG_ERR_NOMEM;
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
    return ENG_OK;
}

/* Defaults per tokenizer model, then the special-token ids and flags from the metadata. */
static int load_special_ids(const eng_gguf *g, eng_vocab *v, const char *name, char *err, size_t err_len) {
    bool add_bos_default = false;
    int rc;
    if (v->type == ENG_VOCAB_SPM) {
        v->pre = ENG_PRE_DEFAULT;
        v->add_space_prefix = true;
        add_bos_default = true;
        v->bos = 1 < v->n_tokens ? 1 : -1;
        v->eos = 2 < v->n_tokens ? 2 : -1;
        v->unk = 0;
    } else if (v->type == ENG_VOCAB_WPM) { /* llama.cpp's defaults for "bert" vocabularies */
        v->pre = ENG_PRE_DEFAULT;
        add_bos_default = true;
        v->add_sep = true;
        v->bos = 101 < v->n_tokens ? 101 : -1;
        v->unk = 100 < v->n_tokens ? 100 : -1;
        v->sep = 102 < v->n_tokens ? 102 : -1;
        v->wpm_lower = true;
        if ((rc = get_bool_key(g, "tokenizer.ggml.normalizer.lowercase", &v->wpm_lower, err, err_len))) return rc;
        v->wpm_strip = v->wpm_lower;
        if ((rc = get_bool_key(g, "tokenizer.ggml.normalizer.strip_accents", &v->wpm_strip, err, err_len))) return rc;
        if ((rc = get_int_key(g, "tokenizer.ggml.seperator_token_id", v->n_tokens, &v->sep, err, err_len))) return rc;
        if ((rc = get_bool_key(g, "tokenizer.ggml.add_sep_token", &v->add_sep, err, err_len))) return rc;
        for (int32_t i = 0; i < v->n_tokens; i++)
            if (v->tok[i].len > v->max_tok_len) v->max_tok_len = v->tok[i].len;
    } else if (v->type == ENG_VOCAB_UGM) { /* llama.cpp's defaults for "t5" vocabularies */
        v->pre = ENG_PRE_DEFAULT;
        v->eos = 1 < v->n_tokens ? 1 : -1;
        v->unk = 2 < v->n_tokens ? 2 : -1;
        v->add_eos = true;
        v->ugm_escape = true;
        if ((rc = get_bool_key(g, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix, err, err_len))) return rc;
        if ((rc = get_bool_key(g, "tokenizer.ggml.remove_extra_whitespaces", &v->ugm_merge_spaces, err, err_len)))
            return rc;
    } else {
        eng_gguf_str pre = {"", 0};
        rc = eng_gguf_get_str(g, "tokenizer.ggml.pre", &pre);
        if (rc != ENG_OK && rc != ENG_ERR_NOT_FOUND)
            return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: tokenizer.ggml.pre is not a string", name);
        if (rc == ENG_ERR_NOT_FOUND) pre.len = 0;
        rc = pre_from_name(pre, &v->pre, &v->ignore_merges, &add_bos_default);
        if (rc != ENG_OK)
            return kvs_errf(err, err_len, rc, "%s: unsupported pre-tokenizer '%.*s'", name,
                            (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
        v->bos = 11 < v->n_tokens ? 11 : -1;   /* llama.cpp's defaults for gpt2 vocabularies */
        v->eos = 11 < v->n_tokens ? 11 : -1;
        v->unk = -1;
    }
    v->add_bos = add_bos_default;
    v->add_eos = v->type == ENG_VOCAB_UGM;
    if ((rc = get_int_key(g, "tokenizer.ggml.bos_token_id", v->n_tokens, &v->bos, err, err_len))) return rc;
    if ((rc = get_int_key(g, "tokenizer.ggml.eos_token_id", v->n_tokens, &v->eos, err, err_len))) return rc;
    if ((rc = get_int_key(g, "tokenizer.ggml.unknown_token_id", v->n_tokens, &v->unk, err, err_len))) return rc;
    if ((rc = get_int_key(g, "tokenizer.ggml.eot_token_id", v->n_tokens, &v->eot, err, err_len))) return rc;
    if ((rc = get_int_key(g, "tokenizer.ggml.eom_token_id", v->n_tokens, &v->eom, err, err_len))) return rc;
    if ((rc = get_bool_key(g, "tokenizer.ggml.add_bos_token", &v->add_bos, err, err_len))) return rc;
    if ((rc = get_bool_key(g, "tokenizer.ggml.add_eos_token", &v->add_eos, err, err_len))) return rc;
    if (v->type == ENG_VOCAB_SPM &&
        (rc = get_bool_key(g, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix, err, err_len)))
        return rc;
    if (v->add_bos && v->bos < 0) v->add_bos = false;
    if (v->add_eos && v->eos < 0) v->add_eos = false;
    if (v->add_sep && v->sep < 0) v->add_sep = false;
    return ENG_OK;
}

/* UGM: the longest token, the unknown token's score, the user-defined tokens and the precompiled charsmap. */
static int load_ugm(const eng_gguf *g, eng_vocab *v, const char *name, char *err, size_t err_len) {
    if (v->unk < 0) return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: a t5 vocabulary needs an unknown token", name);
    float min_score = 3.4e38f;
    for (int32_t i = 0; i < v->n_tokens; i++) {
        const tok_entry *t = &v->tok[i];
        if (t->len > v->max_tok_len) v->max_tok_len = t->len;
        if (t->type == ENG_TOKTYPE_NORMAL && t->score < min_score) min_score = t->score;
        if (t->type == ENG_TOKTYPE_USER_DEFINED) v->n_user++;
    }
    v->ugm_unk_score = (min_score < 3.4e38f ? min_score : 0.0f) - 10.0f;
    if (v->n_user > 0 && !(v->user = malloc((size_t)v->n_user * sizeof *v->user))) return ENG_ERR_NOMEM;
    for (int32_t i = 0, k = 0; i < v->n_tokens; i++)
        if (v->tok[i].type == ENG_TOKTYPE_USER_DEFINED) v->user[k++] = i;
    uint32_t et;
    uint64_t n;
    const void *data;
    const eng_gguf_str *strs;
    int rc = eng_gguf_get_arr(g, "tokenizer.ggml.precompiled_charsmap", &et, &n, &data, &strs);
    if (rc == ENG_ERR_NOT_FOUND) return ENG_OK;
    if (rc != ENG_OK || (et != ENG_GGUF_INT8 && et != ENG_GGUF_UINT8))
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: tokenizer.ggml.precompiled_charsmap is not a byte array", name);
    uint32_t blob = 0;
    if (n >= 4) memcpy(&blob, data, 4); /* little-endian in the file, as every supported host */
    if (n < 4 || (uint64_t)blob + 4 >= n || blob % 4 != 0)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: tokenizer.ggml.precompiled_charsmap is malformed (%llu bytes, "
                        "double array of %u)", name, (unsigned long long)n, blob);
    if (!(v->charsmap = malloc((size_t)n))) return ENG_ERR_NOMEM;
    memcpy(v->charsmap, data, (size_t)n);
    v->charsmap_len = (size_t)n;
    v->xcda_n = blob / 4;
    return ENG_OK;
}

/* BPE: the merges, the byte <-> code point map and the pre-tokenizer regexes. */
static int load_bpe(const eng_gguf *g, eng_vocab *v, const char *name, char *err, size_t err_len) {
    const eng_gguf_str *strs;
    uint64_t n;
    int rc = get_strings(g, "tokenizer.ggml.merges", &strs, &n);
    if (rc != ENG_OK)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT,
                        "%s: no tokenizer.ggml.merges string array (needed by gpt2 vocabularies)", name);
    if (n > INT32_MAX / 4) return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: too many merges", name);
    if ((rc = build_merges(v, strs, n, name, err, err_len))) return rc;
    init_byte_map(v);
    return compile_regexes(v, err, err_len, name);
}

/* SPM: whether merging can never cross the start of a run of U+2581 (see eng_vocab.spm_split). */
static void find_spm_split(eng_vocab *v) {
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
static void find_byte_tokens(eng_vocab *v) {
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
}

/* end-of-generation tokens, found by text as llama.cpp does; they become control tokens */
static void find_eog(eng_vocab *v) {
    static const char *const eot_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                            "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
                                            "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                            "<end_of_utterance>", NULL};
    /* llama.cpp's list of end-of-generation texts (</s> included: the qwen2 vocabulary's </s> is a normal token
     * in the file, and becomes one control token here, as in llama.cpp) */
    static const char *const eog_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
                                            "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>",
                                            "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
                                            "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                                            "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                            "[e~[", NULL};
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
    /* harmony-style vocabularies (<|return|> and <|call|>, or <|calls|> and <|flush|>) end a message with <|end|>
     * and go on: <|end|> is then no end of generation, and a user-defined token */
    int32_t end = eng_vocab_find(v, "<|end|>", 7);
    bool has_return = eng_vocab_find(v, "<|return|>", 10) >= 0, has_flush = eng_vocab_find(v, "<|flush|>", 9) >= 0;
    bool has_call = eng_vocab_find(v, "<|call|>", 8) >= 0 || eng_vocab_find(v, "<|calls|>", 9) >= 0;
    if (end >= 0 && has_call && (has_return || has_flush)) {
        v->eog[end] = 0;
        v->tok[end].type = ENG_TOKTYPE_USER_DEFINED;
    }
    /* vocabularies with <|tool_response> (gemma4) use </s> as text: a normal token again */
    int32_t s_end = eng_vocab_find(v, "</s>", 4);
    if (s_end >= 0 && eng_vocab_find(v, "<|tool_response>", 16) >= 0) {
        v->eog[s_end] = 0;
        v->tok[s_end].type = ENG_TOKTYPE_NORMAL;
    }
    if (v->eos >= 0) v->eog[v->eos] = 1;
    if (v->eot >= 0) v->eog[v->eot] = 1;
    if (v->eom >= 0) v->eog[v->eom] = 1;
}

/* special tokens for partitioning, longest text first */
static int build_specials(eng_vocab *v) {
    int32_t cnt = 0;
    for (int32_t i = 0; i < v->n_tokens; i++) {
        uint8_t t = v->tok[i].type;
        if ((t == ENG_TOKTYPE_CONTROL || t == ENG_TOKTYPE_USER_DEFINED || t == ENG_TOKTYPE_UNKNOWN) &&
            v->tok[i].len > 0)
            cnt++;
    }
    v->specials = malloc((size_t)(cnt ? cnt : 1) * sizeof *v->specials);
    int32_t *tmp = malloc((size_t)(cnt ? cnt : 1) * sizeof *tmp);
    if (!v->specials || !tmp) { free(tmp); return ENG_ERR_NOMEM; }
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
    return ENG_OK;
}

/* Phi-3 models: special tokens swallow the whitespace after them (llama.cpp sets this by model name) */
static void phi3_rstrip(const eng_gguf *g, eng_vocab *v) {
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

int eng_vocab_load(const eng_gguf *g, eng_vocab **out, char *err, size_t err_len) {
    if (!g || !out) return ENG_ERR_INVALID;
    *out = NULL;
    const char *name = eng_gguf_name(g);
    eng_gguf_str model;
    int rc = eng_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (rc != ENG_OK) return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: no tokenizer.ggml.model string", name);
    eng_vocab_type type;
    if (str_is(model, "llama")) type = ENG_VOCAB_SPM;
    else if (str_is(model, "gpt2")) type = ENG_VOCAB_BPE;
    else if (str_is(model, "bert")) type = ENG_VOCAB_WPM;
    else if (str_is(model, "t5")) type = ENG_VOCAB_UGM;
    else
        return kvs_errf(err, err_len, ENG_ERR_UNSUPPORTED, "%s: unsupported tokenizer model '%.*s' (supported: llama, gpt2, bert, t5)",
                        name, (int)(model.len > 64 ? 64 : model.len), model.ptr);

    const eng_gguf_str *strs;
    uint64_t n;
    rc = get_strings(g, "tokenizer.ggml.tokens", &strs, &n);
    if (rc != ENG_OK)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: no tokenizer.ggml.tokens string array", name);
    if (n == 0 || n > INT32_MAX / 4)
        return kvs_errf(err, err_len, ENG_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries", name,
                        (unsigned long long)n);

    eng_vocab *v = calloc(1, sizeof *v);
    if (!v) return ENG_ERR_NOMEM;
    v->type = type;
    v->n_tokens = (int32_t)n;
    v->bos = v->eos = v->eot = v->eom = v->unk = v->sep = -1;
    rc = ENG_ERR_NOMEM;
    v->tok = calloc(n, sizeof *v->tok);
    v->eog = calloc(n, 1);
    if (!v->tok || !v->eog) goto fail;
    if ((rc = load_texts(v, strs, n, name, err, err_len))) goto fail;
    if ((rc = load_scores_types(g, v, name, err, err_len))) goto fail;
    if ((rc = build_text_map(v))) goto fail;
    if ((rc = load_special_ids(g, v, name, err, err_len))) goto fail;
    if (type == ENG_VOCAB_BPE && (rc = load_bpe(g, v, name, err, err_len))) goto fail;
    if (type == ENG_VOCAB_SPM) find_spm_split(v);
    if (type == ENG_VOCAB_UGM && (rc = load_ugm(g, v, name, err, err_len))) goto fail;
    find_byte_tokens(v);
    find_eog(v);
    if ((rc = build_specials(v))) goto fail;
    phi3_rstrip(g, v);
    *out = v;
    return ENG_OK;
fail:
    if (rc == ENG_ERR_NOMEM) kvs_errf(err, err_len, rc, "%s: out of memory loading the vocabulary", name);
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
int32_t eng_vocab_sep(const eng_vocab *v) { return v ? v->sep : -1; }
bool eng_vocab_add_sep(const eng_vocab *v) { return v && v->add_sep; }
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
