/*
 * fuzz_gguf.c: GGUF loading from memory (engine/format/gguf.h) and the vocabulary loader over whatever metadata it
 * yields (engine/text/tokenizer.h).
 *
 * Input: the file bytes. Checks: eng_gguf_open_memory either fails with an error code and a message, or every
 * key and tensor it reports is readable and consistent (typed getters agree with the key's type, tensor data
 * lies inside the buffer); a vocabulary that loads tokenizes and detokenizes a short text into valid ids.
 */
#include "fuzz_util.h"

#include "engine/format/gguf.h"
#include "engine/text/tokenizer.h"

static volatile unsigned g_sink; /* reads whose only purpose is to let ASan see them */

static void touch(const void *p, uint64_t n) {
    const unsigned char *b = p;
    for (uint64_t k = 0; k < n; k += 61) g_sink += b[k];
    if (n) g_sink += b[n - 1];
}

/* A NUL-terminated copy of a GGUF string; NULL when it holds a NUL byte (not addressable by name) or on OOM. */
static char *cstr(eng_gguf_str s) {
    if (memchr(s.ptr, 0, s.len)) return NULL;
    char *c = malloc(s.len + 1);
    if (!c) return NULL;
    memcpy(c, s.ptr, s.len);
    c[s.len] = 0;
    return c;
}

static void walk(const eng_gguf *g, const uint8_t *base, size_t size) {
    int64_t nkv = eng_gguf_n_kv(g);
    FZ_CHECK(nkv >= 0, "n_kv %lld", (long long)nkv);
    for (int64_t i = 0; i < nkv; i++) {
        const eng_gguf_kv *kv = eng_gguf_kv_at(g, i);
        FZ_CHECK(kv, "kv %lld missing", (long long)i);
        touch(kv->key.ptr, kv->key.len);
        char *key = cstr(kv->key);
        if (key) {
            FZ_CHECK(eng_gguf_find(g, key) == kv, "find(%s) gives another key", key);
            uint32_t u; int64_t l; float f; bool b; eng_gguf_str s;
            (void)eng_gguf_get_u32(g, key, &u);
            (void)eng_gguf_get_i64(g, key, &l);
            (void)eng_gguf_get_f32(g, key, &f);
            (void)eng_gguf_get_bool(g, key, &b);
            if (eng_gguf_get_str(g, key, &s) == 0) touch(s.ptr, s.len);
            uint32_t et; uint64_t n; const void *d; const eng_gguf_str *strs;
            if (eng_gguf_get_arr(g, key, &et, &n, &d, &strs) == 0) {
                FZ_CHECK(et == kv->v.arr.type && n == kv->v.arr.n, "array facts differ");
                if (et == ENG_GGUF_STRING) for (uint64_t k = 0; k < n; k++) touch(strs[k].ptr, strs[k].len);
                else if (n) touch(d, 1);
            }
            free(key);
        }
    }
    int64_t nt = eng_gguf_n_tensors(g);
    FZ_CHECK(nt >= 0, "n_tensors");
    for (int64_t i = 0; i < nt; i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        FZ_CHECK(t, "tensor %lld missing", (long long)i);
        FZ_CHECK(t->n_dims >= 1 && t->n_dims <= 4, "n_dims %u", t->n_dims);
        const uint8_t *d = t->data;
        FZ_CHECK(t->nbytes == 0 || (d >= base && d + t->nbytes <= base + size && d + t->nbytes >= d),
                 "tensor %lld data outside the buffer", (long long)i);
        touch(t->data, t->nbytes);
        char *name = cstr(t->name);
        if (name) FZ_CHECK(eng_gguf_find_tensor(g, name) == t, "find_tensor(%s)", name);
        free(name);
        (void)eng_gguf_type_name(t->type);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    eng_gguf *g = NULL;
    char err[256] = "";
    int rc = eng_gguf_open_memory(data, size, "fuzz", &g, err, sizeof err);
    if (rc != 0) {
        FZ_CHECK(rc < 0 && err[0] && !g, "failure %d without a message", rc);
        return 0;
    }
    walk(g, data, size);
    eng_vocab *v = NULL;
    char verr[256] = "";
    if (eng_vocab_load(g, &v, verr, sizeof verr) == 0) {
        int32_t ids[64], n = 0;
        static const char text[] = "Hello world! <s> \xe2\x96\x81 caf\xc3\xa9 \xff";
        int r = eng_vocab_tokenize(v, text, sizeof text - 1, true, true, ids, 64, &n);
        FZ_CHECK(r == 0 || r == ENG_ERR_TOO_LARGE, "tokenize: %d", r);
        for (int32_t i = 0; i < n && i < 64; i++) {
            FZ_CHECK(ids[i] >= 0 && ids[i] < eng_vocab_n_tokens(v), "id %d", ids[i]);
            char piece[256];
            size_t pl;
            (void)eng_vocab_token_to_piece(v, ids[i], true, piece, sizeof piece, &pl);
        }
        eng_vocab_free(v);
    } else {
        FZ_CHECK(verr[0], "vocab failure without a message");
    }
    eng_gguf_close(g);
    return 0;
}
