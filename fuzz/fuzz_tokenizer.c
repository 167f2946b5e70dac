/*
 * fuzz_tokenizer.c: the tokenizers over arbitrary bytes, with each vocabulary of ../shared/models/vocab-only/
 * (skipped, with a message, when absent) and the built-in default vocabulary (the one `kvserve mkmodel` writes;
 * the build generates it next to the harness).
 *
 * Input: byte 0 picks the vocabulary, byte 1 the mode and flags; the rest is text (modes 0-1) or token ids
 * (mode 2: little-endian 16-bit values, some out of range on purpose).
 * Checks, encode: every id is in range; with add_special and a vocabulary that adds BOS, BOS comes first; a
 * byte-level BPE vocabulary gives the input back exactly (any bytes); an SPM vocabulary does too (after its
 * space prefix) for printable ASCII without the characters of special-token texts.
 * Checks, decode: token_to_piece refuses out-of-range ids and reports the length it needs; the streaming
 * detokenizer's output over any id sequence is valid UTF-8.
 */
#include "fuzz_util.h"

#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "engine/text/tokenizer.h"

#ifndef FUZZ_DEFAULT_VOCAB
#define FUZZ_DEFAULT_VOCAB ""
#endif
#ifndef KVSERVE_SHARED_DIR
#define KVSERVE_SHARED_DIR "../shared"
#endif

#define MAX_VOCABS 8
typedef struct fz_tok { eng_gguf *g[MAX_VOCABS]; eng_vocab *v[MAX_VOCABS]; int n; } fz_tok;
static fz_tok G; /* the harness's one state (libFuzzer gives no user pointer) */

static void load(const char *path, bool required) {
    if (G.n >= MAX_VOCABS) return;
    char err[256] = "";
    eng_gguf *g = NULL;
    eng_vocab *v = NULL;
    if (eng_gguf_open(path, &g, err, sizeof err) != 0 || eng_vocab_load(g, &v, err, sizeof err) != 0) {
        eng_gguf_close(g);
        fprintf(stderr, "fuzz_tokenizer: %s %s: %s\n", required ? "cannot load" : "skipping", path, err);
        if (required) abort();
        return;
    }
    G.g[G.n] = g;
    G.v[G.n] = v;
    G.n++;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    const char *def = getenv("KVSERVE_FUZZ_DEFAULT_VOCAB");
    if (!def || !def[0]) def = FUZZ_DEFAULT_VOCAB;
    load(def, true);
    const char *shared = getenv("KVSERVE_SHARED");
    if (!shared || !shared[0]) shared = KVSERVE_SHARED_DIR;
    static const char *const names[] = {"gpt-2", "llama-bpe", "llama-spm", "phi-3", "qwen2"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/models/vocab-only/ggml-vocab-%s.gguf", shared, names[i]);
        if (access(path, R_OK) == 0) load(path, false);
        else fprintf(stderr, "fuzz_tokenizer: skipping %s (shared test material absent)\n", path);
    }
    return 0;
}

static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t l = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (!l || i + l > n) return false;
        unsigned cp = l == 1 ? c : l == 2 ? (c & 0x1Fu) : l == 3 ? (c & 0x0Fu) : (c & 0x07u);
        for (size_t k = 1; k < l; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + k] & 0x3Fu);
        }
        if ((l == 3 && cp < 0x800) || (l == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += l;
    }
    return true;
}

/* Concatenated pieces (render_special) of ids; malloc'd, length in *n. */
static char *decode_all(const eng_vocab *v, const int32_t *ids, int32_t n, size_t *len) {
    kvs_buf b = {0};
    char piece[4096];
    for (int32_t i = 0; i < n; i++) {
        size_t pl = 0;
        int r = eng_vocab_token_to_piece(v, ids[i], true, piece, sizeof piece, &pl);
        FZ_CHECK(r == 0, "token_to_piece(%d): %d", ids[i], r);
        kvs_buf_append(&b, piece, pl);
    }
    FZ_CHECK(!b.oom, "out of memory");
    *len = b.len;
    return b.data ? kvs_buf_take(&b) : calloc(1, 1);
}

static void encode(const eng_vocab *v, const char *text, size_t n, bool add_special, bool parse_special) {
    int32_t cap = (int32_t)n + 8, got = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    FZ_CHECK(ids, "out of memory");
    int r = eng_vocab_tokenize(v, text, n, add_special, parse_special, ids, cap, &got);
    if (r == ENG_ERR_TOO_LARGE) { /* more tokens than bytes + 8 (special tokens): retry at the size asked */
        FZ_CHECK(got > cap, "TOO_LARGE with %d <= %d", got, cap);
        free(ids);
        cap = got;
        ids = malloc((size_t)cap * sizeof *ids);
        FZ_CHECK(ids, "out of memory");
        r = eng_vocab_tokenize(v, text, n, add_special, parse_special, ids, cap, &got);
    }
    FZ_CHECK(r == 0 && got >= 0 && got <= cap, "tokenize: %d (%d tokens)", r, got);
    int32_t nv = eng_vocab_n_tokens(v);
    for (int32_t i = 0; i < got; i++) FZ_CHECK(ids[i] >= 0 && ids[i] < nv, "id %d of %d", ids[i], nv);
    if (add_special && eng_vocab_add_bos(v) && eng_vocab_bos(v) >= 0)
        FZ_CHECK(got > 0 && ids[0] == eng_vocab_bos(v), "no BOS first");
    if (!add_special && n > 0) {
        bool bpe = eng_vocab_get_type(v) == ENG_VOCAB_BPE;
        bool plain = !parse_special;
        for (size_t i = 0; plain && i < n; i++)
            plain = text[i] >= 0x20 && text[i] < 0x7F && !strchr("<>[]|", text[i]);
        if (bpe || plain) {
            size_t dl;
            char *d = decode_all(v, ids, got, &dl);
            size_t off = (!bpe && eng_vocab_add_space_prefix(v)) ? 1 : 0;
            if (off) FZ_CHECK(dl >= 1 && d[0] == ' ', "SPM: no space prefix");
            FZ_CHECK(dl - off == n && memcmp(d + off, text, n) == 0, "round trip lost the text (%zu bytes -> %zu)", n,
                     dl - off);
            free(d);
        }
    }
    free(ids);
}

static void decode(const eng_vocab *v, fz_in *in) {
    int32_t nv = eng_vocab_n_tokens(v);
    eng_detok d;
    memset(&d, 0, sizeof d);
    kvs_buf out = {0};
    char buf[4096];
    while (fz_left(in) >= 2) {
        int32_t id = (int32_t)fz_u16(in);
        if (id >= 0xFFF0) id = id - 0xFFF0 + nv - 8; /* around the end of the vocabulary and past it */
        else id %= nv + 1;                            /* nv itself: out of range */
        bool special = id & 1;
        size_t pl = 0;
        int r = eng_vocab_token_to_piece(v, id, special, buf, 0, &pl);
        if (id < 0 || id >= nv) { FZ_CHECK(r == ENG_ERR_INVALID, "bad id %d accepted: %d", id, r); continue; }
        FZ_CHECK(r == 0 || (r == ENG_ERR_TOO_LARGE && pl > 0), "token_to_piece(%d, cap 0): %d len %zu", id, r, pl);
        size_t n = 0;
        r = eng_vocab_detok_push(v, &d, id, special, buf, sizeof buf, &n);
        FZ_CHECK(r == 0, "detok_push(%d): %d", id, r);
        kvs_buf_append(&out, buf, n);
    }
    size_t n = 0;
    FZ_CHECK(eng_detok_flush(&d, buf, sizeof buf, &n) == 0, "flush");
    kvs_buf_append(&out, buf, n);
    FZ_CHECK(!out.oom, "out of memory");
    FZ_CHECK(valid_utf8((const unsigned char *)out.data, out.len), "streamed text is not valid UTF-8");
    kvs_buf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (G.n == 0) LLVMFuzzerInitialize(NULL, NULL);
    if (size < 2) return 0;
    const eng_vocab *v = G.v[data[0] % G.n];
    uint8_t mode = data[1];
    fz_in in = {data + 2, size - 2, 0};
    if ((mode & 3) == 2) decode(v, &in);
    else encode(v, (const char *)data + 2, size - 2, mode & 4, mode & 8);
    return 0;
}
