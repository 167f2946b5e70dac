/*
 * test_tokenizer.c: the SPM and BPE tokenizers (engine/text/tokenizer.h).
 *
 * Without ../shared: tiny vocabularies written with the GGUF writer; randomized differential tests of the merge
 * algorithms against naive reference implementations (quadratic "find the best pair, merge, repeat"), round trips
 * of random UTF-8 text, streaming detokenization against an independent UTF-8 sanitizer, special-token parsing,
 * BOS/EOS/EOG rules, error paths.
 * With ../shared: llama.cpp's own tokenizer tests for the 5 vocab-only files, the prompt_tokens of every
 * reference completion file, the chat prompt token counts, and the same differential/round-trip tests on the real
 * vocabularies.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <cjson/cJSON.h>

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/format/gguf.h"
#include "engine/text/tokenizer.h"
#include "helper_shared.h"

/* ---- utilities ---------------------------------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {   /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static uint32_t rng_below(uint64_t *s, uint32_t n) { return (uint32_t)(rng_next(s) % n); }

static const char *shared_dir(void) {
    const char *d = kvt_shared_dir();
    static char path[4096];
    snprintf(path, sizeof path, "%s/models/vocab-only", d);
    struct stat st;
    if (stat(path, &st) != 0) return NULL;
    return d;
}

static eng_vocab *load_vocab(const char *path, eng_gguf **gout) {
    eng_gguf *g = NULL;
    char err[512] = "";
    int rc = eng_gguf_open(path, &g, err, sizeof err);
    cr_assert_eq(rc, ENG_OK, "open %s: %s", path, err);
    eng_vocab *v = NULL;
    rc = eng_vocab_load(g, &v, err, sizeof err);
    cr_assert_eq(rc, ENG_OK, "vocab %s: %s", path, err);
    if (gout) *gout = g;
    else eng_gguf_close(g);
    return v;
}

/* Tokenizes into a malloc'd array (exercising the TOO_LARGE protocol). */
static int32_t *tok(const eng_vocab *v, const char *s, size_t len, bool add, bool parse, int32_t *n) {
    int32_t probe[2];
    int rc = eng_vocab_tokenize(v, s, len, add, parse, probe, 2, n);
    cr_assert(rc == ENG_OK || rc == ENG_ERR_TOO_LARGE, "tokenize rc %d", rc);
    cr_assert_eq(rc == ENG_ERR_TOO_LARGE, *n > 2);
    int32_t *ids = malloc(sizeof *ids * (size_t)(*n + 1));
    cr_assert_not_null(ids);
    int32_t n2;
    rc = eng_vocab_tokenize(v, s, len, add, parse, ids, *n, &n2);
    cr_assert_eq(rc, ENG_OK);
    cr_assert_eq(n2, *n);
    for (int32_t i = 0; i < *n && i < 2; i++) cr_assert_eq(ids[i], probe[i]);
    return ids;
}

/* Concatenated pieces, malloc'd (NUL-terminated for messages; *len is the byte count). */
static char *detok(const eng_vocab *v, const int32_t *ids, int32_t n, bool render_special, size_t *len) {
    size_t cap = 64, used = 0;
    char *out = malloc(cap);
    cr_assert_not_null(out);
    for (int32_t i = 0; i < n; i++) {
        size_t pn;
        int rc = eng_vocab_token_to_piece(v, ids[i], render_special, NULL, 0, &pn);
        cr_assert(rc == ENG_OK || rc == ENG_ERR_TOO_LARGE);
        while (used + pn + 1 > cap) { cap *= 2; out = realloc(out, cap); cr_assert_not_null(out); }
        size_t pn2;
        rc = eng_vocab_token_to_piece(v, ids[i], render_special, out + used, pn, &pn2);
        cr_assert_eq(rc, ENG_OK);
        cr_assert_eq(pn, pn2);
        used += pn;
    }
    out[used] = 0;
    *len = used;
    return out;
}

static size_t put_utf8(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 63)); o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63)); o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* Random valid UTF-8 text of up to max_cps code points, from a mix of scripts, spaces, digits, punctuation and
 * (with tags) the text of the tiny vocabularies' special tokens. */
static size_t random_utf8(uint64_t *s, char *out, size_t max_cps, bool tags) {
    static const char *const words[] = {"'s", "'ll", "'RE", " the", "Hello", "<|im_end|>", "<tag>", "123456",
                                        "  ", "\n\n", " \t", "...", "<s>"};
    size_t n = 0, k = 1 + rng_below(s, (uint32_t)max_cps);
    for (size_t i = 0; i < k; i++) {
        uint32_t r = rng_below(s, 100), cp;
        if (r < 40) cp = 0x20 + rng_below(s, 0x5F);                    /* printable ASCII */
        else if (r < 50) cp = " \n\t\r"[rng_below(s, 4)];
        else if (r < 58) cp = 0xA0 + rng_below(s, 0x160);               /* Latin-1 and Latin Extended */
        else if (r < 64) cp = 0x400 + rng_below(s, 0x100);              /* Cyrillic */
        else if (r < 70) cp = 0x4E00 + rng_below(s, 0x5000);            /* CJK */
        else if (r < 75) cp = 0x1F300 + rng_below(s, 0x300);            /* emoji */
        else if (r < 78) cp = 0x300 + rng_below(s, 0x70);               /* combining marks */
        else if (r < 81) cp = 0x10000 + rng_below(s, 0x100000 - 0x10000 + 0xFFFF); /* any astral */
        else if (r < 84) cp = 0x2000 + rng_below(s, 0x70);              /* unicode spaces, punctuation */
        else if (r < 90) cp = '0' + rng_below(s, 10);
        else {
            const char *w = words[rng_below(s, sizeof words / sizeof words[0])];
            if (!tags && w[0] == '<') w = " <x";
            memcpy(out + n, w, strlen(w));
            n += strlen(w);
            continue;
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
        if (cp > 0x10FFFF) cp = 0x10FFFF;
        n += put_utf8(cp, out + n);
    }
    return n;
}

/* ---- an independent UTF-8 sanitizer (reference for the streaming detokenizer) -------------------------------- */

typedef struct utf8ref { uint8_t p1[256]; uint8_t p2[65536]; uint8_t *p3; /* bitmap of 3-byte prefixes */ } utf8ref;

static utf8ref *utf8ref_new(void) {
    utf8ref *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    r->p3 = calloc(1 << 21, 1);
    cr_assert_not_null(r->p3);
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {   /* mark every prefix of every encoding */
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        char b[4];
        size_t n = put_utf8(cp, b);
        uint8_t *u = (uint8_t *)b;
        r->p1[u[0]] = 1;
        if (n >= 2) r->p2[u[0] << 8 | u[1]] = 1;
        if (n >= 3) { uint32_t k = (uint32_t)u[0] << 16 | u[1] << 8 | u[2]; r->p3[k >> 3] |= (uint8_t)(1 << (k & 7)); }
    }
    return r;
}

static void utf8ref_free(utf8ref *r) { if (r) { free(r->p3); free(r); } }

/* whether u[0..k) is a prefix of (or equal to) some encoding */
static bool ref_prefix(const utf8ref *r, const uint8_t *u, size_t k) {
    if (k == 1) return r->p1[u[0]];
    if (k == 2) return r->p2[u[0] << 8 | u[1]];
    if (k == 3) { uint32_t x = (uint32_t)u[0] << 16 | u[1] << 8 | u[2]; return r->p3[x >> 3] >> (x & 7) & 1; }
    /* k == 4: complete 4-byte encodings: decode and re-encode */
    uint32_t cp = (uint32_t)(u[0] & 7) << 18 | (uint32_t)(u[1] & 63) << 12 | (uint32_t)(u[2] & 63) << 6 | (u[3] & 63);
    char b[4];
    return cp >= 0x10000 && cp <= 0x10FFFF && put_utf8(cp, b) == 4 && memcmp(b, u, 4) == 0;
}

static bool ref_complete(const utf8ref *r, const uint8_t *u, size_t k) {
    if (!ref_prefix(r, u, k)) return false;
    size_t want = u[0] < 0x80 ? 1 : u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : 4;
    return want == k;
}

/* Valid UTF-8 of in[0..n): each maximal invalid subpart becomes U+FFFD. Returns malloc'd text, length in *on. */
static char *ref_sanitize(const utf8ref *r, const uint8_t *in, size_t n, size_t *on) {
    char *o = malloc(3 * n + 1);
    cr_assert_not_null(o);
    size_t k = 0, i = 0;
    while (i < n) {
        size_t best = 0;
        for (size_t l = 1; l <= 4 && i + l <= n; l++)
            if (ref_prefix(r, in + i, l)) best = l; else break;
        if (best && ref_complete(r, in + i, best)) {
            memcpy(o + k, in + i, best);
            k += best;
            i += best;
        } else {
            memcpy(o + k, "\xef\xbf\xbd", 3);
            k += 3;
            i += best ? best : 1;
        }
    }
    *on = k;
    o[k] = 0;
    return o;
}

/* ---- naive reference tokenizers ------------------------------------------------------------------------------- */

typedef struct rsym { size_t off, len; } rsym;

/* SPM: repeatedly merge the adjacent pair whose concatenation is the best-scoring token (leftmost on ties). */
static int32_t naive_spm(const eng_vocab *v, const char *text, size_t len, int32_t *out) {
    rsym *s = malloc(sizeof *s * (len + 1));
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint8_t c = (uint8_t)text[i];
        size_t l = c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (l > len - i) l = len - i;
        s[n++] = (rsym){i, l};
        i += l;
    }
    for (;;) {
        size_t best = SIZE_MAX;
        float bs = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            int32_t id = eng_vocab_find(v, text + s[i].off, s[i].len + s[i + 1].len);
            if (id < 0) continue;
            float sc = eng_vocab_token_score(v, id);
            if (best == SIZE_MAX || sc > bs) { best = i; bs = sc; }
        }
        if (best == SIZE_MAX) break;
        s[best].len += s[best + 1].len;
        memmove(&s[best + 1], &s[best + 2], (n - best - 2) * sizeof *s);
        n--;
    }
    int32_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = eng_vocab_find(v, text + s[i].off, s[i].len);
        if (id >= 0) { out[k++] = id; continue; }
        for (size_t j = 0; j < s[i].len; j++) {
            char hex[8];
            snprintf(hex, sizeof hex, "<0x%02X>", (uint8_t)text[s[i].off + j]);
            out[k++] = eng_vocab_find(v, hex, 6);
        }
    }
    free(s);
    return k;
}

/* merges "l r" -> rank, sorted for bsearch */
typedef struct rmerge { const char *s; size_t len; int32_t rank; } rmerge;
typedef struct rmerges { rmerge *a; size_t n; } rmerges;

static int rmerge_cmp(const void *x, const void *y) {
    const rmerge *a = x, *b = y;
    size_t m = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->s, b->s, m);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

static rmerges rmerges_from(const eng_gguf *g) {
    uint32_t et;
    uint64_t n;
    const void *data;
    const eng_gguf_str *strs;
    cr_assert_eq(eng_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n, &data, &strs), ENG_OK);
    rmerges m = {calloc(n ? n : 1, sizeof(rmerge)), 0};
    cr_assert_not_null(m.a);
    for (uint64_t i = 0; i < n; i++) m.a[m.n++] = (rmerge){strs[i].ptr, strs[i].len, (int32_t)i};
    /* stable by rank among equal strings: sort by (string, rank) */
    qsort(m.a, m.n, sizeof *m.a, rmerge_cmp);
    return m;
}

static int32_t rmerge_rank(const rmerges *m, const char *l, size_t ll, const char *r, size_t rl) {
    char buf[1024];
    if (ll + rl + 1 > sizeof buf) return -1;
    memcpy(buf, l, ll);
    buf[ll] = ' ';
    memcpy(buf + ll + 1, r, rl);
    rmerge key = {buf, ll + rl + 1, 0};
    rmerge *hit = bsearch(&key, m->a, m->n, sizeof *m->a, rmerge_cmp);
    if (!hit) return -1;
    int32_t best = hit->rank;   /* the lowest rank among duplicates */
    for (rmerge *p = hit; p > m->a && rmerge_cmp(p - 1, &key) == 0; p--) if ((p - 1)->rank < best) best = (p - 1)->rank;
    for (rmerge *p = hit; p + 1 < m->a + m->n && rmerge_cmp(p + 1, &key) == 0; p++) if ((p + 1)->rank < best) best = (p + 1)->rank;
    return best;
}

/* GPT-2 byte-to-unicode table, written out from its definition */
static uint32_t byte_cp(uint8_t b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    uint32_t k = 0;
    for (uint32_t x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) k++;
    return 256 + k;
}

/* BPE of one word (raw bytes): byte-map, then repeatedly merge the lowest-rank adjacent pair (leftmost). */
static int32_t naive_bpe_word(const eng_vocab *v, const rmerges *m, bool ignore_merges, const char *w, size_t wl,
                              int32_t *out) {
    char *t = calloc(wl * 2 + 1, 1);
    cr_assert_not_null(t);
    size_t tl = 0;
    for (size_t i = 0; i < wl; i++) tl += put_utf8(byte_cp((uint8_t)w[i]), t + tl);
    if (ignore_merges) {
        int32_t id = eng_vocab_find(v, t, tl);
        if (id >= 0) { out[0] = id; free(t); return 1; }
    }
    rsym *s = malloc(sizeof *s * (tl + 1));
    cr_assert_not_null(s);
    size_t n = 0;
    for (size_t i = 0; i < tl;) {
        uint8_t c = (uint8_t)t[i];
        size_t l = c < 0xC0 ? 1 : c < 0xE0 ? 2 : 3;
        s[n++] = (rsym){i, l};
        i += l;
    }
    for (;;) {
        size_t best = SIZE_MAX;
        int32_t br = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            int32_t r = rmerge_rank(m, t + s[i].off, s[i].len, t + s[i + 1].off, s[i + 1].len);
            if (r >= 0 && (best == SIZE_MAX || r < br)) { best = i; br = r; }
        }
        if (best == SIZE_MAX) break;
        s[best].len += s[best + 1].len;
        memmove(&s[best + 1], &s[best + 2], (n - best - 2) * sizeof *s);
        n--;
    }
    int32_t k = 0;
    for (size_t i = 0; i < n; i++) out[k++] = eng_vocab_find(v, t + s[i].off, s[i].len);
    free(s);
    free(t);
    return k;
}

/* ---- tiny vocabularies written with the GGUF writer -------------------------------------------------------------- */

typedef struct tmpdir { char path[64]; } tmpdir;

static void tmpdir_make(tmpdir *d) {
    snprintf(d->path, sizeof d->path, "/tmp/kvs_tok_XXXXXX");
    cr_assert_not_null(mkdtemp(d->path));
}

static void tmpdir_rm(tmpdir *d) {
    DIR *dir = opendir(d->path);
    if (dir) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(dir)))
            if (e->d_name[0] != '.') { snprintf(p, sizeof p, "%s/%s", d->path, e->d_name); unlink(p); }
        closedir(dir);
    }
    rmdir(d->path);
}

typedef struct strlist { eng_gguf_str *a; char **own; size_t n, cap; } strlist;

static int32_t sl_add(strlist *l, const char *s, size_t len) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->a = realloc(l->a, l->cap * sizeof *l->a);
        l->own = realloc(l->own, l->cap * sizeof *l->own);
        cr_assert(l->a && l->own);
    }
    char *c = malloc(len + 1);
    memcpy(c, s, len);
    c[len] = 0;
    l->own[l->n] = c;
    l->a[l->n] = (eng_gguf_str){c, len};
    return (int32_t)l->n++;
}

static int32_t sl_find(const strlist *l, const char *s, size_t len) {
    for (size_t i = 0; i < l->n; i++)
        if (l->a[i].len == len && memcmp(l->a[i].ptr, s, len) == 0) return (int32_t)i;
    return -1;
}

static void sl_free(strlist *l) {
    for (size_t i = 0; i < l->n; i++) free(l->own[i]);
    free(l->a);
    free(l->own);
}

/* Tiny SPM vocabulary: <unk> <s> </s>, 256 byte tokens, every string of length 1..3 over {▁,a,b,c,d,e} with a
 * random score, a control "<|im_end|>" and a user-defined "<tag>". */
static void write_tiny_spm(const char *path, uint64_t seed, int add_space_prefix /* -1: key absent */) {
    strlist t = {0};
    int32_t types[600];
    float scores[600];
    uint64_t s = seed;
    const char *base[] = {"<unk>", "<s>", "</s>"};
    int32_t bt[] = {2, 3, 3};
    for (int i = 0; i < 3; i++) { types[t.n] = bt[i]; scores[t.n] = 0; sl_add(&t, base[i], strlen(base[i])); }
    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        types[t.n] = 6; scores[t.n] = 0;
        sl_add(&t, hex, 6);
    }
    const char *alpha[] = {"\xe2\x96\x81", "a", "b", "c", "d", "e"};
    for (int len = 1; len <= 3; len++) {
        int total = len == 1 ? 6 : len == 2 ? 36 : 216;
        for (int k = 0; k < total; k++) {
            char buf[16];
            size_t bl = 0;
            int x = k;
            for (int j = 0; j < len; j++) { const char *a = alpha[x % 6]; x /= 6; memcpy(buf + bl, a, strlen(a)); bl += strlen(a); }
            if (len == 3 && rng_below(&s, 3) == 0) continue;   /* leave holes so merges sometimes stop */
            /* even seeds: no token has U+2581 after another character (the tokenizer then merges each run-of-
             * U+2581-started piece on its own: both paths get compared with the naive tokenizer) */
            bool inner = false;
            for (size_t q = 1; q + 3 <= bl; q++)
                if (memcmp(buf + q, "\xe2\x96\x81", 3) == 0 && (q < 3 || memcmp(buf + q - 3, "\xe2\x96\x81", 3) != 0)) inner = true;
            if (inner && seed % 2 == 0) continue;
            types[t.n] = 1;
            scores[t.n] = -(float)rng_below(&s, 50) / 4.0f;   /* ties happen on purpose */
            sl_add(&t, buf, bl);
        }
    }
    types[t.n] = 3; scores[t.n] = 0; sl_add(&t, "<|im_end|>", 10);
    types[t.n] = 4; scores[t.n] = 0; sl_add(&t, "<tag>", 5);
    cr_assert_lt(t.n, 600);

    eng_gguf_writer *w;
    cr_assert_eq(eng_gguf_writer_create(&w), ENG_OK);
    cr_assert_eq(eng_gguf_add_str(w, "general.architecture", "llama", 5), ENG_OK);
    cr_assert_eq(eng_gguf_add_str(w, "tokenizer.ggml.model", "llama", 5), ENG_OK);
    cr_assert_eq(eng_gguf_add_str_arr(w, "tokenizer.ggml.tokens", t.a, t.n), ENG_OK);
    cr_assert_eq(eng_gguf_add_arr(w, "tokenizer.ggml.scores", ENG_GGUF_FLOAT32, scores, t.n), ENG_OK);
    cr_assert_eq(eng_gguf_add_arr(w, "tokenizer.ggml.token_type", ENG_GGUF_INT32, types, t.n), ENG_OK);
    cr_assert_eq(eng_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", 1), ENG_OK);
    cr_assert_eq(eng_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", 2), ENG_OK);
    cr_assert_eq(eng_gguf_add_u32(w, "tokenizer.ggml.unknown_token_id", 0), ENG_OK);
    if (add_space_prefix >= 0)
        cr_assert_eq(eng_gguf_add_bool(w, "tokenizer.ggml.add_space_prefix", add_space_prefix != 0), ENG_OK);
    char err[256];
    cr_assert_eq(eng_gguf_write(w, path, err, sizeof err), ENG_OK, "%s", err);
    eng_gguf_writer_free(w);
    sl_free(&t);
}

/* Tiny byte-level BPE vocabulary: the 256 byte characters, ~300 random merges over "abcde Ġ" characters, a
 * control <|endoftext|> and a user-defined "<tag>". pre is tokenizer.ggml.pre (NULL: absent). */
static void write_tiny_bpe(const char *path, uint64_t seed, const char *pre, int add_bos /* -1: absent */) {
    strlist t = {0}, m = {0};
    uint64_t s = seed;
    for (int b = 0; b < 256; b++) {
        char u[4];
        size_t n = put_utf8(byte_cp((uint8_t)b), u);
        sl_add(&t, u, n);
    }
    /* pool of merge candidates: the characters of "abcde " (space as Ġ) and every merged token */
    const char *seedc = "abcde ";
    int32_t pool[1024];
    int np = 0;
    for (int i = 0; seedc[i]; i++) {
        char u[4];
        size_t n = put_utf8(byte_cp((uint8_t)seedc[i]), u);
        pool[np++] = sl_find(&t, u, n);
    }
    for (int k = 0; k < 300; k++) {
        int32_t a = pool[rng_below(&s, (uint32_t)np)], b = pool[rng_below(&s, (uint32_t)np)];
        char cat[256], mg[260];
        size_t la = t.a[a].len, lb = t.a[b].len;
        if (la + lb > 40) continue;
        memcpy(cat, t.a[a].ptr, la);
        memcpy(cat + la, t.a[b].ptr, lb);
        if (sl_find(&t, cat, la + lb) >= 0) continue;
        memcpy(mg, t.a[a].ptr, la);
        mg[la] = ' ';
        memcpy(mg + la + 1, t.a[b].ptr, lb);
        sl_add(&m, mg, la + lb + 1);
        pool[np++] = sl_add(&t, cat, la + lb);
    }
    int32_t *types = malloc(sizeof *types * (t.n + 2));
    for (size_t i = 0; i < t.n; i++) types[i] = 1;
    types[t.n] = 3; sl_add(&t, "<|endoftext|>", 13);
    types[t.n] = 4; sl_add(&t, "<tag>", 5);

    eng_gguf_writer *w;
    cr_assert_eq(eng_gguf_writer_create(&w), ENG_OK);
    cr_assert_eq(eng_gguf_add_str(w, "tokenizer.ggml.model", "gpt2", 4), ENG_OK);
    if (pre) cr_assert_eq(eng_gguf_add_str(w, "tokenizer.ggml.pre", pre, strlen(pre)), ENG_OK);
    cr_assert_eq(eng_gguf_add_str_arr(w, "tokenizer.ggml.tokens", t.a, t.n), ENG_OK);
    cr_assert_eq(eng_gguf_add_arr(w, "tokenizer.ggml.token_type", ENG_GGUF_INT32, types, t.n), ENG_OK);
    cr_assert_eq(eng_gguf_add_str_arr(w, "tokenizer.ggml.merges", m.a, m.n), ENG_OK);
    cr_assert_eq(eng_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)t.n - 2), ENG_OK);
    cr_assert_eq(eng_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)t.n - 2), ENG_OK);
    if (add_bos >= 0) cr_assert_eq(eng_gguf_add_bool(w, "tokenizer.ggml.add_bos_token", add_bos != 0), ENG_OK);
    char err[256];
    cr_assert_eq(eng_gguf_write(w, path, err, sizeof err), ENG_OK, "%s", err);
    eng_gguf_writer_free(w);
    free(types);
    sl_free(&t);
    sl_free(&m);
}

/* ---- shared checks, used on tiny and real vocabularies ----------------------------------------------------------- */

/* detokenize(tokenize(s)) == s (with SPM's leading space) for random UTF-8 text, with and without parse_special
 * (the pieces of special tokens rendered). */
static void check_round_trips(const eng_vocab *v, uint64_t seed, int iters, const char *label) {
    char *s = malloc(8192), *expect = malloc(8200);
    for (int it = 0; it < iters; it++) {
        uint64_t st = seed * 1000003u + (uint64_t)it;
        /* SPM puts a space before the text after a user-defined token (which is split out even without
         * parse_special), so its round trips leave those texts out */
        size_t n = random_utf8(&st, s, 60, eng_vocab_get_type(v) == ENG_VOCAB_BPE);
        size_t en = 0;
        if (eng_vocab_add_space_prefix(v)) expect[en++] = ' ';
        memcpy(expect + en, s, n);
        en += n;
        int32_t nt;
        int32_t *ids = tok(v, s, n, false, false, &nt);
        size_t dn;
        char *d = detok(v, ids, nt, true, &dn);
        cr_assert(dn == en && memcmp(d, expect, en) == 0, "%s: round trip failed, seed %llu iter %d:\n[%.*s]\n[%s]",
                  label, (unsigned long long)seed, it, (int)n, s, d);
        free(d);
        free(ids);
        if (eng_vocab_get_type(v) == ENG_VOCAB_BPE) {   /* SPM adds a space after special tokens */
            ids = tok(v, s, n, false, true, &nt);
            d = detok(v, ids, nt, true, &dn);
            cr_assert(dn == n && memcmp(d, s, n) == 0, "%s: round trip (parse_special) failed, seed %llu iter %d",
                      label, (unsigned long long)seed, it);
            free(d);
            free(ids);
        }
    }
    /* arbitrary bytes (invalid UTF-8 included): BPE is lossless; SPM gives valid ids (llama.cpp's SPM is lossy
     * when a bad lead byte swallows an escaped space, so no round trip is asked of it) */
    for (int it = 0; it < iters; it++) {
        uint64_t st = seed * 15485863u + (uint64_t)it;
        size_t n = rng_below(&st, 80);
        for (size_t i = 0; i < n; i++) s[i] = rng_below(&st, 3) ? (char)rng_below(&st, 256) : "a \n\xe2\x96\x81"[rng_below(&st, 6)];
        int32_t nt;
        int32_t *ids = tok(v, s, n, false, rng_below(&st, 2), &nt);
        for (int32_t i = 0; i < nt; i++) cr_assert(ids[i] >= 0 && ids[i] < eng_vocab_n_tokens(v));
        if (eng_vocab_get_type(v) == ENG_VOCAB_BPE) {
            size_t dn;
            char *d = detok(v, ids, nt, true, &dn);
            cr_assert(dn == n && memcmp(d, s, n) == 0, "%s: byte round trip failed, seed %llu iter %d", label,
                      (unsigned long long)seed, it);
            free(d);
        }
        free(ids);
    }
    free(s);
    free(expect);
}

/* Streaming detok over random token sequences == the reference sanitizer over the concatenated pieces; every
 * chunk valid UTF-8. */
static void check_streaming(const eng_vocab *v, const utf8ref *ref, uint64_t seed, int iters, const char *label) {
    int32_t nv = eng_vocab_n_tokens(v);
    int32_t ids[64];
    for (int it = 0; it < iters; it++) {
        uint64_t st = seed * 7919u + (uint64_t)it;
        int32_t n = (int32_t)rng_below(&st, 64);
        bool rs = rng_below(&st, 2);
        for (int32_t i = 0; i < n; i++) {
            uint32_t r = rng_below(&st, 4);
            /* bias towards low ids (byte tokens in SPM vocabs, single bytes in BPE vocabs) */
            ids[i] = (int32_t)(r == 0 ? rng_below(&st, (uint32_t)nv) : rng_below(&st, nv < 300 ? (uint32_t)nv : 300u));
        }
        size_t wn;
        char *whole = detok(v, ids, n, rs, &wn);
        size_t en;
        char *expect = ref_sanitize(ref, (const uint8_t *)whole, wn, &en);
        char *stream = malloc(3 * wn + 16);
        size_t sn = 0;
        eng_detok d;
        eng_detok_reset(&d);
        for (int32_t i = 0; i < n; i++) {
            char buf[4096];
            size_t k;
            int rc = eng_vocab_detok_push(v, &d, ids[i], rs, buf, sizeof buf, &k);
            cr_assert_eq(rc, ENG_OK);
            size_t vn;
            char *valid = ref_sanitize(ref, (const uint8_t *)buf, k, &vn);
            cr_assert(vn == k && memcmp(valid, buf, k) == 0, "%s: chunk is not valid UTF-8 (seed %llu iter %d)",
                      label, (unsigned long long)seed, it);
            free(valid);
            memcpy(stream + sn, buf, k);
            sn += k;
        }
        char buf[64];
        size_t k;
        cr_assert_eq(eng_detok_flush(&d, buf, sizeof buf, &k), ENG_OK);
        memcpy(stream + sn, buf, k);
        sn += k;
        cr_assert(sn == en && memcmp(stream, expect, en) == 0, "%s: streamed != whole (seed %llu iter %d)", label,
                  (unsigned long long)seed, it);
        free(stream);
        free(expect);
        free(whole);
    }
}

/* Random words of letters (one pre-token each) against the naive BPE; SPM: random letter/space strings against
 * the naive SPM. */
static void check_differential(const eng_vocab *v, const eng_gguf *g, const char *alphabet, uint64_t seed,
                               int iters, const char *label) {
    rmerges m = {0};
    bool bpe = eng_vocab_get_type(v) == ENG_VOCAB_BPE;
    if (bpe) m = rmerges_from(g);
    size_t na = strlen(alphabet);
    for (int it = 0; it < iters; it++) {
        uint64_t st = seed * 31337u + (uint64_t)it;
        char s[64];
        size_t n = 0;
        if (bpe && rng_below(&st, 2)) s[n++] = ' ';
        size_t k = 1 + rng_below(&st, 16);
        for (size_t i = 0; i < k; i++) s[n++] = alphabet[rng_below(&st, (uint32_t)na)];
        int32_t nt;
        int32_t *ids = tok(v, s, n, false, false, &nt);
        int32_t want[256];
        int32_t nw;
        if (bpe) {
            nw = naive_bpe_word(v, &m, eng_vocab_pre(v) == ENG_PRE_LLAMA3, s, n, want);
        } else {
            char esc[256];
            size_t en = 0;
            if (eng_vocab_add_space_prefix(v)) { memcpy(esc, "\xe2\x96\x81", 3); en = 3; }
            for (size_t i = 0; i < n; i++) {
                if (s[i] == ' ') { memcpy(esc + en, "\xe2\x96\x81", 3); en += 3; }
                else esc[en++] = s[i];
            }
            nw = naive_spm(v, esc, en, want);
        }
        bool same = nw == nt && memcmp(want, ids, sizeof *ids * (size_t)nt) == 0;
        cr_assert(same, "%s: differs from the naive tokenizer on [%.*s] (seed %llu iter %d): %d vs %d tokens", label,
                  (int)n, s, (unsigned long long)seed, it, nt, nw);
        free(ids);
    }
    free(m.a);
}

/* ---- tests without shared material ------------------------------------------------------------------------------- */

Test(tokenizer, spm_tiny_differential_round_trip_streaming, .timeout = 120) {
    tmpdir d;
    tmpdir_make(&d);
    utf8ref *ref = utf8ref_new();
    for (uint64_t seed = 1; seed <= 4; seed++) {
        for (int asp = -1; asp <= 0; asp++) {
            char path[128];
            snprintf(path, sizeof path, "%s/spm%llu_%d.gguf", d.path, (unsigned long long)seed, asp);
            write_tiny_spm(path, seed, asp);
            eng_gguf *g;
            eng_vocab *v = load_vocab(path, &g);
            cr_assert_eq(eng_vocab_get_type(v), ENG_VOCAB_SPM);
            cr_assert_eq(eng_vocab_add_space_prefix(v), asp == -1);
            check_differential(v, g, "abcde ", seed, 400, "tiny spm");
            check_round_trips(v, seed, 300, "tiny spm");
            check_streaming(v, ref, seed, 300, "tiny spm");
            eng_vocab_free(v);
            eng_gguf_close(g);
        }
    }
    utf8ref_free(ref);
    tmpdir_rm(&d);
}

Test(tokenizer, bpe_tiny_differential_round_trip_streaming, .timeout = 120) {
    tmpdir d;
    tmpdir_make(&d);
    utf8ref *ref = utf8ref_new();
    const char *pres[] = {"gpt-2", "llama-bpe", "qwen2", "smollm", "default", NULL};
    for (int p = 0; p < 6; p++) {
        uint64_t seed = 100 + (uint64_t)p;
        char path[128];
        snprintf(path, sizeof path, "%s/bpe%d.gguf", d.path, p);
        write_tiny_bpe(path, seed, pres[p], -1);
        eng_gguf *g;
        eng_vocab *v = load_vocab(path, &g);
        cr_assert_eq(eng_vocab_get_type(v), ENG_VOCAB_BPE);
        cr_assert_eq(eng_vocab_add_space_prefix(v), false);
        check_differential(v, g, "abcde", seed, 400, pres[p] ? pres[p] : "(no pre)");
        check_round_trips(v, seed, 300, pres[p] ? pres[p] : "(no pre)");
        check_streaming(v, ref, seed, 300, pres[p] ? pres[p] : "(no pre)");
        eng_vocab_free(v);
        eng_gguf_close(g);
    }
    utf8ref_free(ref);
    tmpdir_rm(&d);
}

static bool contains(const int32_t *ids, int32_t n, int32_t id) {
    for (int32_t i = 0; i < n; i++) if (ids[i] == id) return true;
    return false;
}

Test(tokenizer, special_tokens_parsing_and_flags) {
    tmpdir d;
    tmpdir_make(&d);
    char sp[128], bp[128];
    snprintf(sp, sizeof sp, "%s/spm.gguf", d.path);
    snprintf(bp, sizeof bp, "%s/bpe.gguf", d.path);
    write_tiny_spm(sp, 7, -1);
    write_tiny_bpe(bp, 7, "gpt-2", -1);
    eng_vocab *vs = load_vocab(sp, NULL), *vb = load_vocab(bp, NULL);

    /* SPM: control token parsed only with parse_special; user-defined always; the text after a special token
     * gets the leading space, as the first fragment does */
    int32_t ctl = eng_vocab_find(vs, "<|im_end|>", 10), ud = eng_vocab_find(vs, "<tag>", 5);
    cr_assert(ctl >= 0 && ud >= 0);
    const char *txt = "ab<|im_end|>cd<tag>e";
    int32_t n;
    int32_t *ids = tok(vs, txt, strlen(txt), false, true, &n);
    cr_assert(contains(ids, n, ctl) && contains(ids, n, ud));
    size_t dn;
    char *dt = detok(vs, ids, n, true, &dn);
    cr_assert_str_eq(dt, " ab<|im_end|> cd<tag> e");
    free(dt);
    dt = detok(vs, ids, n, false, &dn);   /* control text hidden, user-defined shown */
    cr_assert_str_eq(dt, " ab cd<tag> e");
    free(dt);
    free(ids);
    ids = tok(vs, txt, strlen(txt), false, false, &n);
    cr_assert(!contains(ids, n, ctl) && contains(ids, n, ud));
    dt = detok(vs, ids, n, false, &dn);
    cr_assert_str_eq(dt, " ab<|im_end|>cd<tag> e");
    free(dt);
    free(ids);

    /* the special token alone: no space token after it */
    ids = tok(vs, "<|im_end|>", 10, false, true, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(ids[0], ctl);
    free(ids);

    /* BOS/EOS: SPM adds BOS by default, not EOS; empty text gives only BOS */
    ids = tok(vs, "", 0, true, true, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(ids[0], eng_vocab_bos(vs));
    free(ids);
    ids = tok(vs, "", 0, false, true, &n);
    cr_assert_eq(n, 0);
    free(ids);
    cr_assert(eng_vocab_is_eog(vs, eng_vocab_eos(vs)));
    cr_assert(eng_vocab_is_eog(vs, ctl));          /* <|im_end|> by its text */
    cr_assert(!eng_vocab_is_eog(vs, ud));
    cr_assert(eng_vocab_is_special(vs, ctl) && eng_vocab_is_special(vs, ud));
    cr_assert(!eng_vocab_is_special(vs, eng_vocab_find(vs, "a", 1)));

    /* BPE: gpt2 vocabularies add no BOS unless the metadata says so */
    int32_t eot = eng_vocab_find(vb, "<|endoftext|>", 13);
    cr_assert(eot >= 0);
    ids = tok(vb, "ab", 2, true, true, &n);
    cr_assert(!contains(ids, n, eng_vocab_bos(vb)));
    free(ids);
    const char *bt = "x<|endoftext|> y";
    ids = tok(vb, bt, strlen(bt), false, true, &n);
    cr_assert(contains(ids, n, eot));
    dt = detok(vb, ids, n, true, &dn);
    cr_assert_str_eq(dt, bt);
    free(dt);
    free(ids);
    ids = tok(vb, bt, strlen(bt), false, false, &n);
    cr_assert(!contains(ids, n, eot));
    dt = detok(vb, ids, n, false, &dn);
    cr_assert_str_eq(dt, bt);
    free(dt);
    free(ids);
    cr_assert(eng_vocab_is_eog(vb, eot));
    eng_vocab_free(vb);

    snprintf(bp, sizeof bp, "%s/bpe_bos.gguf", d.path);
    write_tiny_bpe(bp, 7, "gpt-2", 1);
    vb = load_vocab(bp, NULL);
    ids = tok(vb, "ab", 2, true, true, &n);
    cr_assert_eq(ids[0], eng_vocab_bos(vb));
    free(ids);
    eng_vocab_free(vb);
    snprintf(bp, sizeof bp, "%s/bpe_l3.gguf", d.path);
    write_tiny_bpe(bp, 7, "llama-bpe", -1);   /* llama3 pre-tokenizer: BOS by default */
    vb = load_vocab(bp, NULL);
    cr_assert(eng_vocab_add_bos(vb));
    eng_vocab_free(vb);

    eng_vocab_free(vs);
    tmpdir_rm(&d);
}

Test(tokenizer, errors_and_buffers) {
    tmpdir d;
    tmpdir_make(&d);
    char sp[128];
    snprintf(sp, sizeof sp, "%s/spm.gguf", d.path);
    write_tiny_spm(sp, 9, -1);
    eng_vocab *v = load_vocab(sp, NULL);
    int32_t n, out[4];
    const char *txt = "abcdeabcde edcba";
    cr_assert_eq(eng_vocab_tokenize(v, txt, strlen(txt), true, true, out, 1, &n), ENG_ERR_TOO_LARGE);
    cr_assert_gt(n, 1);
    cr_assert_eq(out[0], eng_vocab_bos(v));
    cr_assert_eq(eng_vocab_tokenize(v, NULL, 3, true, true, out, 4, &n), ENG_ERR_INVALID);
    cr_assert_eq(eng_vocab_tokenize(v, txt, 3, true, true, out, -1, &n), ENG_ERR_INVALID);
    cr_assert_eq(eng_vocab_tokenize(v, txt, ENG_TOK_MAX_TEXT + 1, true, true, out, 4, &n), ENG_ERR_INVALID);
    char buf[2];
    size_t pn;
    cr_assert_eq(eng_vocab_token_to_piece(v, -1, true, buf, 2, &pn), ENG_ERR_INVALID);
    cr_assert_eq(eng_vocab_token_to_piece(v, eng_vocab_n_tokens(v), true, buf, 2, &pn), ENG_ERR_INVALID);
    int32_t ctl = eng_vocab_find(v, "<|im_end|>", 10);
    cr_assert_eq(eng_vocab_token_to_piece(v, ctl, true, buf, 2, &pn), ENG_ERR_TOO_LARGE);
    cr_assert_eq(pn, 10);
    cr_assert_eq(eng_vocab_token_to_piece(v, ctl, false, buf, 2, &pn), ENG_OK);
    cr_assert_eq(pn, 0);
    /* detok_push with a too-small buffer leaves the state alone */
    eng_detok dt;
    eng_detok_reset(&dt);
    cr_assert_eq(eng_vocab_detok_push(v, &dt, ctl, true, buf, 2, &pn), ENG_ERR_TOO_LARGE);
    cr_assert_eq(dt.n_pending, 0);
    /* a lone lead byte is held back, then flushed as U+FFFD */
    int32_t b_e2 = eng_vocab_find(v, "<0xE2>", 6);
    char big[16];
    cr_assert_eq(eng_vocab_detok_push(v, &dt, b_e2, false, big, sizeof big, &pn), ENG_OK);
    cr_assert_eq(pn, 0);
    cr_assert_eq(dt.n_pending, 1);
    cr_assert_eq(eng_detok_flush(&dt, big, sizeof big, &pn), ENG_OK);
    cr_assert(pn == 3 && memcmp(big, "\xef\xbf\xbd", 3) == 0);
    eng_vocab_free(v);
    eng_vocab_free(NULL);

    /* bad vocabularies */
    struct { const char *model; const char *pre; int want; } cases[] = {
        {"rwkv", NULL, ENG_ERR_UNSUPPORTED}, {"gpt2", "no-such-pre", ENG_ERR_UNSUPPORTED}, {NULL, NULL, ENG_ERR_FORMAT},
    };
    for (int i = 0; i < 3; i++) {
        eng_gguf_writer *w;
        cr_assert_eq(eng_gguf_writer_create(&w), ENG_OK);
        if (cases[i].model) cr_assert_eq(eng_gguf_add_str(w, "tokenizer.ggml.model", cases[i].model, strlen(cases[i].model)), ENG_OK);
        if (cases[i].pre) cr_assert_eq(eng_gguf_add_str(w, "tokenizer.ggml.pre", cases[i].pre, strlen(cases[i].pre)), ENG_OK);
        eng_gguf_str toks[2] = {{"a", 1}, {"b", 1}}, merges[1] = {{"a b", 3}};
        cr_assert_eq(eng_gguf_add_str_arr(w, "tokenizer.ggml.tokens", toks, 2), ENG_OK);
        cr_assert_eq(eng_gguf_add_str_arr(w, "tokenizer.ggml.merges", merges, 1), ENG_OK);
        char path[128], err[256] = "";
        snprintf(path, sizeof path, "%s/bad%d.gguf", d.path, i);
        cr_assert_eq(eng_gguf_write(w, path, err, sizeof err), ENG_OK);
        eng_gguf_writer_free(w);
        eng_gguf *g;
        cr_assert_eq(eng_gguf_open(path, &g, err, sizeof err), ENG_OK);
        eng_vocab *bv = (eng_vocab *)1;
        err[0] = 0;
        cr_assert_eq(eng_vocab_load(g, &bv, err, sizeof err), cases[i].want, "case %d", i);
        cr_assert_null(bv);
        cr_assert_neq(err[0], 0, "case %d: no message", i);
        eng_gguf_close(g);
    }
    tmpdir_rm(&d);
}

/* ---- tests with shared material ----------------------------------------------------------------------------------- */

static const char *const VOCABS[] = {"ggml-vocab-llama-spm.gguf", "ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf",
                                     "ggml-vocab-gpt-2.gguf", "ggml-vocab-phi-3.gguf"};

Test(tokenizer_shared, llama_cpp_vocab_tests, .timeout = 120) {
    const char *sd = shared_dir();
    if (!sd) cr_skip_test("shared material (../shared/models/vocab-only) not found: llama.cpp vocab tests skipped");
    int all_pass = 0, all_total = 0;
    for (size_t f = 0; f < sizeof VOCABS / sizeof VOCABS[0]; f++) {
        char path[4096], pin[4200], pout[4200];
        snprintf(path, sizeof path, "%s/models/vocab-only/%s", sd, VOCABS[f]);
        snprintf(pin, sizeof pin, "%s.inp", path);
        snprintf(pout, sizeof pout, "%s.out", path);
        eng_vocab *v = load_vocab(path, NULL);
        size_t ni, no;
        char *inp = kvt_read_file(pin, &ni), *outp = kvt_read_file(pout, &no);
        cr_assert(inp && outp, "%s: missing .inp/.out", path);
        /* each test string is followed by "\n__ggml_vocab_test__\n"; the .out has one line of ids per string */
        const char *sep = "\n__ggml_vocab_test__\n";
        size_t sl = strlen(sep);
        char *p = inp, *q = outp;
        int pass = 0, total = 0;
        while (p < inp + ni) {
            char *e = memmem(p, (size_t)(inp + ni - p), sep, sl);
            if (!e) break;
            char *nl = strchr(q, '\n');
            cr_assert_not_null(nl, "%s: fewer .out lines than strings", VOCABS[f]);
            int32_t want[4096];
            int nw = 0;
            for (char *r = q; r < nl;) {
                while (r < nl && *r == ' ') r++;
                if (r >= nl) break;
                want[nw++] = (int32_t)strtol(r, &r, 10);
            }
            int32_t n;
            int32_t *ids = tok(v, p, (size_t)(e - p), false, false, &n);
            total++;
            if (n == nw && memcmp(ids, want, sizeof *ids * (size_t)n) == 0) pass++;
            else cr_log_error("%s: string %d [%.*s] differs", VOCABS[f], total, (int)(e - p), p);
            free(ids);
            p = e + sl;
            q = nl + 1;
        }
        cr_log_info("%s: %d/%d", VOCABS[f], pass, total);
        fprintf(stderr, "conformance %s: %d/%d\n", VOCABS[f], pass, total);
        cr_expect_eq(pass, total, "%s: %d/%d strings tokenize as llama.cpp", VOCABS[f], pass, total);
        cr_expect_gt(total, 0);
        all_pass += pass;
        all_total += total;
        free(inp);
        free(outp);
        eng_vocab_free(v);
    }
    cr_assert_eq(all_pass, all_total);
}

static bool model_path_for(const char *sd, const char *base, char *out, size_t cap) {
    struct stat st;
    snprintf(out, cap, "%s/models/%s.gguf", sd, base);
    if (stat(out, &st) == 0) return true;
    snprintf(out, cap, "%s/models/synthetic/%s.gguf", sd, base);
    return stat(out, &st) == 0;
}

Test(tokenizer_shared, reference_prompt_tokens, .timeout = 120) {
    const char *sd = shared_dir();
    if (!sd) cr_skip_test("shared material (../shared) not found: reference prompt tokens skipped");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/reference", sd);
    DIR *dd = opendir(dir);
    cr_assert_not_null(dd);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(dd))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".json") != 0) continue;
        bool chat = l > 10 && strcmp(e->d_name + l - 10, ".chat.json") == 0;
        char base[256];
        snprintf(base, sizeof base, "%.*s", (int)(l - (chat ? 10 : 5)), e->d_name);
        char mp[4096], jp[8300];
        if (!model_path_for(sd, base, mp, sizeof mp)) continue;
        snprintf(jp, sizeof jp, "%s/%s", dir, e->d_name);
        size_t jn;
        char *js = kvt_read_file(jp, &jn);
        cJSON *root = cJSON_Parse(js);
        cr_assert_not_null(root, "%s: bad JSON", jp);
        eng_vocab *v = load_vocab(mp, NULL);
        cJSON *c;
        int pass = 0, total = 0;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
            cJSON *pt = cJSON_GetObjectItem(c, "prompt_tokens");
            const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(c, chat ? "rendered_prompt" : "prompt"));
            cr_assert(text && pt);
            int32_t n;
            int32_t *ids = tok(v, text, strlen(text), true, true, &n);
            bool ok;
            if (chat) {   /* the usage count (BOS included as the metadata says) */
                ok = cJSON_IsNumber(pt) && n == pt->valueint;
            } else {
                ok = cJSON_GetArraySize(pt) == n;
                for (int32_t i = 0; ok && i < n; i++) ok = cJSON_GetArrayItem(pt, i)->valueint == ids[i];
            }
            total++;
            pass += ok;
            if (!ok) cr_log_error("%s: prompt %d differs", e->d_name, total);
            free(ids);
        }
        fprintf(stderr, "reference %s: %d/%d\n", e->d_name, pass, total);
        cr_expect_eq(pass, total, "%s: %d/%d prompts", e->d_name, pass, total);
        cr_expect_gt(total, 0);
        files++;
        eng_vocab_free(v);
        cJSON_Delete(root);
        free(js);
    }
    closedir(dd);
    cr_assert_gt(files, 0, "no reference files with models found in %s", dir);
}

Test(tokenizer_shared, real_vocabs_differential_round_trip_streaming, .timeout = 180) {
    const char *sd = shared_dir();
    if (!sd) cr_skip_test("shared material (../shared/models/vocab-only) not found: real-vocabulary tests skipped");
    utf8ref *ref = utf8ref_new();
    for (size_t f = 0; f < sizeof VOCABS / sizeof VOCABS[0]; f++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/models/vocab-only/%s", sd, VOCABS[f]);
        eng_gguf *g;
        eng_vocab *v = load_vocab(path, &g);
        check_differential(v, g, eng_vocab_get_type(v) == ENG_VOCAB_SPM ? "abcdefghijklmnopqrstuvwxyz " :
                                 "abcdefghijklmnopqrstuvwxyz", 1000 + f, 150, VOCABS[f]);
        check_round_trips(v, 2000 + f, 150, VOCABS[f]);
        check_streaming(v, ref, 3000 + f, 150, VOCABS[f]);
        eng_vocab_free(v);
        eng_gguf_close(g);
    }
    utf8ref_free(ref);
}

/* ---- the `kvserve tokenize` command ---------------------------------------------------------------------------- */

/* Runs a shell command, returns its stdout (malloc'd) and exit status. */
static char *run_cmd(const char *cmd, int *status) {
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "popen %s", cmd);
    size_t cap = 4096, n = 0;
    char *out = malloc(cap);
    size_t r;
    while ((r = fread(out + n, 1, cap - n - 1, p)) > 0) {
        n += r;
        if (n + 1 == cap) { cap *= 2; out = realloc(out, cap); cr_assert_not_null(out); }
    }
    out[n] = 0;
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

Test(tokenizer, cli_tokenize_matches_library) {
    tmpdir d;
    tmpdir_make(&d);
    char vp[128], tp[128];
    snprintf(vp, sizeof vp, "%s/spm.gguf", d.path);
    snprintf(tp, sizeof tp, "%s/text.txt", d.path);
    write_tiny_spm(vp, 11, -1);
    eng_vocab *v = load_vocab(vp, NULL);
    /* a file with a trailing newline, a special token's text and a partial UTF-8 sequence: its exact bytes count */
    const char text[] = "abc de<|im_end|>ca\n\xe2\x96";
    FILE *f = fopen(tp, "wb");
    cr_assert_not_null(f);
    fwrite(text, 1, sizeof text - 1, f);
    fclose(f);
    struct { const char *flags; bool add, parse; } cases[] = {
        {"", true, true}, {"--no-special", false, true}, {"--no-parse-special", true, false},
        {"--no-special --no-parse-special", false, false},
    };
    for (int c = 0; c < 4; c++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "%s tokenize -m %s -f %s %s --json", KVSERVE_BINARY, vp, tp, cases[c].flags);
        int st;
        char *out = run_cmd(cmd, &st);
        cr_assert_eq(st, 0, "%s", cmd);
        int32_t n;
        int32_t *ids = tok(v, text, sizeof text - 1, cases[c].add, cases[c].parse, &n);
        char want[4096];
        size_t k = (size_t)snprintf(want, sizeof want, "{\"tokens\":[");
        for (int32_t i = 0; i < n; i++) k += (size_t)snprintf(want + k, sizeof want - k, i ? ",%d" : "%d", ids[i]);
        snprintf(want + k, sizeof want - k, "]}\n");
        cr_assert_str_eq(out, want, "%s", cmd);
        free(ids);
        free(out);
    }
    /* text output: one line per token, "id 'piece'" */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s -p 'ab<|im_end|>' --no-special", KVSERVE_BINARY, vp);
    int st;
    char *out = run_cmd(cmd, &st);
    cr_assert_eq(st, 0);
    int32_t n;
    int32_t *ids = tok(v, "ab<|im_end|>", 12, false, true, &n);
    char want[4096];
    size_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        char piece[64];
        size_t pn;
        cr_assert_eq(eng_vocab_token_to_piece(v, ids[i], true, piece, sizeof piece, &pn), ENG_OK);
        k += (size_t)snprintf(want + k, sizeof want - k, "%d '%.*s'\n", ids[i], (int)pn, piece);
    }
    cr_assert_str_eq(out, want);
    free(ids);
    free(out);
    /* usage errors */
    snprintf(cmd, sizeof cmd, "%s tokenize -p x 2>/dev/null", KVSERVE_BINARY);
    out = run_cmd(cmd, &st);
    cr_assert_eq(st, 2);
    free(out);
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s/missing.gguf -p x 2>/dev/null", KVSERVE_BINARY, d.path);
    out = run_cmd(cmd, &st);
    cr_assert_eq(st, 1);
    free(out);
    eng_vocab_free(v);
    tmpdir_rm(&d);
}

/* ---- concurrency: a vocab is read-only, any number of threads may tokenize at once -------------------------------- */

typedef struct conc_arg { const eng_vocab *v; uint64_t seed; int bad; uint64_t sum; } conc_arg;

static void *conc_worker(void *p) {
    conc_arg *a = p;
    char s[2048];
    for (int it = 0; it < 200; it++) {
        uint64_t st = a->seed + (uint64_t)it;
        size_t n = random_utf8(&st, s, 100, true);
        int32_t ids[4096], ids2[4096], k1, k2;
        if (eng_vocab_tokenize(a->v, s, n, true, true, ids, 4096, &k1) != ENG_OK) { a->bad++; continue; }
        /* the same text again, after other threads ran in between: identical */
        if (eng_vocab_tokenize(a->v, s, n, true, true, ids2, 4096, &k2) != ENG_OK || k1 != k2 ||
            memcmp(ids, ids2, sizeof *ids * (size_t)k1) != 0)
            a->bad++;
        for (int32_t i = 0; i < k1; i++) a->sum = a->sum * 1000003u + (uint64_t)ids[i];
    }
    return NULL;
}

Test(tokenizer, concurrent_tokenize) {
    tmpdir d;
    tmpdir_make(&d);
    char bp[128];
    snprintf(bp, sizeof bp, "%s/bpe.gguf", d.path);
    write_tiny_bpe(bp, 5, "llama-bpe", -1);
    eng_vocab *v = load_vocab(bp, NULL);
    conc_arg ref = {v, 77, 0, 0};
    conc_worker(&ref);   /* single-threaded reference */
    pthread_t th[4];
    conc_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (conc_arg){v, 77, 0, 0};   /* same seed: all threads tokenize the same texts at the same time */
        cr_assert_eq(pthread_create(&th[i], NULL, conc_worker, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(args[i].bad, 0, "thread %d saw %d differing results", i, args[i].bad);
        cr_assert_eq(args[i].sum, ref.sum, "thread %d tokenized differently from the single-threaded run", i);
    }
    eng_vocab_free(v);
    tmpdir_rm(&d);
}

/* Phi-3: llama.cpp strips the whitespace after special tokens for models named phi-3/phi3 (RSTRIP, keyed on
 * general.name) and SPM then gives the next text fragment its leading space. The expected ids are llama.cpp's
 * output for this chat turn; a copy of the same vocabulary under another name keeps the whitespace. */
Test(tokenizer_shared, phi3_special_token_whitespace) {
    const char *sd = shared_dir();
    if (!sd) cr_skip_test("shared material (../shared/models/vocab-only) not found: phi-3 test skipped");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/vocab-only/ggml-vocab-phi-3.gguf", sd);
    eng_gguf *g;
    eng_vocab *v = load_vocab(path, &g);
    const char *turn = "<|user|>\nSYS\nHI<|end|>\n<|assistant|>\n";
    const int32_t want[] = {1, 32010, 317, 21554, 13, 17628, 32007, 32001};
    int32_t n;
    int32_t *ids = tok(v, turn, strlen(turn), true, true, &n);
    cr_assert_eq(n, 8);
    cr_assert_arr_eq(ids, want, sizeof want);
    size_t dn;
    char *d = detok(v, ids, n, true, &dn);
    cr_assert_str_eq(d, "<s><|user|> SYS\nHI<|end|><|assistant|>");
    free(d);
    free(ids);
    eng_vocab_free(v);

    /* the same tokenizer block under another general.name */
    tmpdir td;
    tmpdir_make(&td);
    eng_gguf_writer *w;
    cr_assert_eq(eng_gguf_writer_create(&w), ENG_OK);
    cr_assert_eq(eng_gguf_add_str(w, "general.name", "other", 5), ENG_OK);
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++) {
        const eng_gguf_kv *kv = eng_gguf_kv_at(g, i);
        if (kv->key.len > 10 && memcmp(kv->key.ptr, "tokenizer.", 10) == 0)
            cr_assert_eq(eng_gguf_add_kv_from(w, kv), ENG_OK);
    }
    char cp[128], err[256];
    snprintf(cp, sizeof cp, "%s/other.gguf", td.path);
    cr_assert_eq(eng_gguf_write(w, cp, err, sizeof err), ENG_OK, "%s", err);
    eng_gguf_writer_free(w);
    eng_gguf_close(g);
    v = load_vocab(cp, NULL);
    ids = tok(v, turn, strlen(turn), true, true, &n);
    d = detok(v, ids, n, true, &dn);
    cr_assert_str_eq(d, "<s><|user|> \nSYS\nHI<|end|> \n<|assistant|> \n");
    free(d);
    free(ids);
    eng_vocab_free(v);
    tmpdir_rm(&td);
}

/* The end-of-generation set as llama.cpp builds it: the qwen2 vocabulary's </s> (a normal token in the file) and
 * <|endoftext|>/<|im_end|> end generation and tokenize as one control token with parse_special; without it </s>
 * is plain text. */
Test(tokenizer_shared, eog_set_by_text, .timeout = 60) {
    const char *sd = shared_dir();
    if (!sd) cr_skip_test("shared material (../shared/models/vocab-only) not found: end-of-generation test skipped");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/vocab-only/ggml-vocab-qwen2.gguf", sd);
    eng_vocab *v = load_vocab(path, NULL);
    const char *texts[] = {"</s>", "<|endoftext|>", "<|im_end|>"};
    for (int i = 0; i < 3; i++) {
        int32_t id = eng_vocab_find(v, texts[i], strlen(texts[i]));
        cr_assert_geq(id, 0, "%s not in the qwen2 vocabulary", texts[i]);
        cr_assert(eng_vocab_is_eog(v, id), "%s does not end generation", texts[i]);
        int32_t n;
        int32_t *ids = tok(v, texts[i], strlen(texts[i]), false, true, &n);
        cr_assert_eq(n, 1, "%s with special parsing: %d tokens, expected 1", texts[i], n);
        cr_assert_eq(ids[0], id);
        free(ids);
    }
    int32_t n;
    int32_t *ids = tok(v, "</s>", 4, false, false, &n);
    cr_assert_gt(n, 1, "</s> as plain text must not become the control token");
    free(ids);
    int32_t hello = eng_vocab_find(v, "hello", 5);
    cr_assert(hello < 0 || !eng_vocab_is_eog(v, hello));
    eng_vocab_free(v);
}
