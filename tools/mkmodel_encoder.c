/*
 * mkmodel_encoder.c: `kvserve mkmodel --arch bert|nomic-bert|jina-bert-v2 [--rerank]`: BERT-family encoders with
 * the tensor names and keys llama.cpp reads (engine/model/encoder.h lists them) and a small built-in WordPiece
 * vocabulary. jina-bert-v2 is written as jina-embeddings-v2 converts: bert's tensors without position_embd, the
 * GEGLU feed-forward as one ffn_up [embd, 2 ff] without bias (gate rows first); its reranker head is
 * jina-reranker-v1's, cls [embd, 1] + cls.bias and no cls.output.
 *
 * The vocabulary, as llama.cpp's converter writes BERT vocabularies: word-initial pieces carry a U+2581 prefix,
 * continuation pieces ("##x" in the original) none. ids 0 [PAD], 1 [UNK], 2 [CLS], 3 [SEP], 4 [MASK] (control
 * tokens), then every character of the built-in set both word-initial and as a continuation, a few common
 * suffixes as continuations, and the built-in words (lowercased) word-initial.
 *
 * --vocab ugm writes an XLM-RoBERTa-style SentencePiece unigram vocabulary instead ("t5", as llama.cpp names it):
 * <s> <pad> </s> <unk>, U+2581, every character alone and after U+2581, the built-in words after U+2581 and split in
 * two, each with a score (log-probability-like: words above their halves above characters), and a small
 * precompiled charsmap (the ligature fi -> "fi", the ellipsis -> "...", the ideographic space -> " ") built as the
 * XOR-compressed double array llama.cpp walks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kernels/quant.h"
#include "tools/mkmodel.h"

#define WPM_SPACE "\xe2\x96\x81"

bool kvs_mk_is_encoder(const mk_opts *o) {
    return !strcmp(o->arch, "bert") || !strcmp(o->arch, "nomic-bert") || !strcmp(o->arch, "jina-bert-v2");
}

bool kvs_mk_set_pooling(void *field, const char *v) {
    int *p = field;
    if (!strcmp(v, "mean")) *p = 1;
    else if (!strcmp(v, "cls")) *p = 2;
    else if (!strcmp(v, "last")) *p = 3;
    else return false;
    return true;
}

bool kvs_mk_set_vocab(void *field, const char *v) {
    bool *u = field;
    if (!strcmp(v, "wpm")) *u = false;
    else if (!strcmp(v, "ugm")) *u = true;
    else return false;
    return true;
}

typedef struct wpm_list {
    char **tok;
    int32_t *type;
    size_t n, cap;
} wpm_list;

static int wl_add(wpm_list *l, const char *s, int32_t type) {
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->tok[i], s)) return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 512;
        char **t = realloc(l->tok, cap * sizeof *t);
        if (!t) return -1;
        l->tok = t;
        int32_t *ty = realloc(l->type, cap * sizeof *ty);
        if (!ty) return -1;
        l->type = ty;
        l->cap = cap;
    }
    if (!(l->tok[l->n] = strdup(s))) return -1;
    l->type[l->n++] = type;
    return 0;
}

static int wpm_build(wpm_list *l) {
    static const char *const specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    static const char chars[] = "abcdefghijklmnopqrstuvwxyz0123456789.,!?'\"-:;()/&%$#@*+=<>[]{}_~`^|\\";
    static const char *const suffixes[] = {"s", "es", "ed", "ing", "er", "ly", "est", "ion", "ful", "ness"};
    for (int i = 0; i < 5; i++)
        if (wl_add(l, specials[i], 3)) return -1;
    char piece[80];
    for (const char *c = chars; *c; c++) {
        snprintf(piece, sizeof piece, WPM_SPACE "%c", *c);
        if (wl_add(l, piece, 1)) return -1;
        snprintf(piece, sizeof piece, "%c", *c);
        if (wl_add(l, piece, 1)) return -1;
    }
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++)
        if (wl_add(l, suffixes[i], 1)) return -1;
    size_t nw;
    const char *const *words = kvs_mk_words(&nw);
    for (size_t i = 0; i < nw; i++) {
        size_t len = strlen(words[i]);
        if (len + 4 > sizeof piece) continue;
        memcpy(piece, WPM_SPACE, 3);
        for (size_t k = 0; k <= len; k++) {
            char ch = words[i][k];
            piece[3 + k] = (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
        }
        if (strchr(piece + 3, '\'')) continue; /* "don't" splits at the apostrophe */
        if (wl_add(l, piece, 1)) return -1;
    }
    return 0;
}

/* ---- the unigram vocabulary and its charsmap ------------------------------------------------------------------ */
typedef struct cm_node { uint8_t c; int32_t parent, first_child, next; bool term; uint32_t repl, pos; } cm_node;

/* The charsmap blob of MAPS: a trie of the keys placed into a double array (each node at a position P whose
 * children's slots P ^ byte and, for a key's end, the value slot P are free), then the replacements. */
static int charsmap_build(uint8_t **out, size_t *out_len) {
    static const char *const maps[][2] = {{"\xef\xac\x81", "fi"}, {"\xe2\x80\xa6", "..."}, {"\xe3\x80\x80", " "}};
    enum { N_ARR = 2048, MAXN = 32 };
    cm_node nd[MAXN] = {{0, -1, -1, -1, false, 0, 0}};
    int nn = 1;
    char strs[64];
    size_t sl = 0;
    for (size_t m = 0; m < sizeof maps / sizeof maps[0]; m++) {
        int cur = 0;
        for (const uint8_t *p = (const uint8_t *)maps[m][0]; *p; p++) {
            int ch = nd[cur].first_child;
            while (ch >= 0 && nd[ch].c != *p) ch = nd[ch].next;
            if (ch < 0) {
                if (nn == MAXN) return ENG_ERR_INVALID;
                ch = nn++;
                nd[ch] = (cm_node){*p, cur, -1, nd[cur].first_child, false, 0, 0};
                nd[cur].first_child = ch;
            }
            cur = ch;
        }
        nd[cur].term = true;
        nd[cur].repl = (uint32_t)sl;
        size_t rl = strlen(maps[m][1]) + 1;
        memcpy(strs + sl, maps[m][1], rl);
        sl += rl;
    }
    uint32_t *arr = calloc(N_ARR, sizeof *arr);
    bool *used = calloc(N_ARR, 1), *taken = calloc(N_ARR, 1); /* slots in use; positions given to a node */
    if (!arr || !used || !taken) { KVS_FREE_ALL(arr, used, taken); return ENG_ERR_NOMEM; }
    used[0] = true;
    for (int i = 0; i < nn; i++) { /* parents before children: nodes were made in that order */
        uint32_t P = 1;
        for (;; P++) {
            bool ok = P < N_ARR && !taken[P] && !(nd[i].term && used[P]);
            for (int ch = nd[i].first_child; ok && ch >= 0; ch = nd[ch].next)
                ok = (P ^ nd[ch].c) < N_ARR && !used[P ^ nd[ch].c] && (P ^ nd[ch].c) != P;
            if (ok || P >= N_ARR) break;
        }
        if (P >= N_ARR) { KVS_FREE_ALL(arr, used, taken); return ENG_ERR_INVALID; }
        nd[i].pos = P;
        taken[P] = true; /* two nodes at one position would continue each other's walks */
        if (nd[i].term) { used[P] = true; arr[P] = (1u << 31) | nd[i].repl; }
        for (int ch = nd[i].first_child; ch >= 0; ch = nd[ch].next) used[P ^ nd[ch].c] = true;
    }
    arr[0] = nd[0].pos << 10; /* the root's base: its position */
    for (int i = 1; i < nn; i++) { /* a child's entry: base (to its own position), leaf bit, its byte */
        uint32_t idx = nd[nd[i].parent].pos ^ nd[i].c;
        arr[idx] = ((idx ^ nd[i].pos) << 10) | (nd[i].term ? 1u << 8 : 0) | nd[i].c;
    }
    uint32_t blob = N_ARR * 4;
    *out_len = 4 + blob + sl;
    if (!(*out = malloc(*out_len))) { KVS_FREE_ALL(arr, used, taken); return ENG_ERR_NOMEM; }
    for (int b = 0; b < 4; b++) (*out)[b] = (uint8_t)(blob >> (8 * b));
    for (uint32_t i = 0; i < N_ARR; i++)
        for (int b = 0; b < 4; b++) (*out)[4 + 4 * i + (uint32_t)b] = (uint8_t)(arr[i] >> (8 * b));
    memcpy(*out + 4 + blob, strs, sl);
    KVS_FREE_ALL(arr, used, taken);
    return 0;
}

static int ugm_build(wpm_list *l, float **scores) {
    static const char *const specials[] = {"<s>", "<pad>", "</s>", "<unk>"};
    static const int32_t stype[] = {3, 3, 3, 2};
    static const char chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"-:;()/&%$#@*+=";
    size_t nw;
    const char *const *words = kvs_mk_words(&nw);
    size_t cap = 8 + 2 * (sizeof chars) + 3 * nw;
    *scores = malloc(cap * sizeof **scores);
    if (!*scores) return -1;
    float *sc = *scores;
#define ADD(text, type, score) do { size_t before = l->n; if (wl_add(l, text, type)) return -1; \
        if (l->n > before) sc[l->n - 1] = (score); } while (0)
    for (int i = 0; i < 4; i++) ADD(specials[i], stype[i], 0.0f);
    ADD(WPM_SPACE, 1, -3.0f);
    char piece[80];
    for (const char *c = chars; *c; c++) {
        snprintf(piece, sizeof piece, "%c", *c);
        ADD(piece, 1, -8.0f - 0.01f * (float)(c - chars));
        snprintf(piece, sizeof piece, WPM_SPACE "%c", *c);
        ADD(piece, 1, -7.5f - 0.01f * (float)(c - chars));
    }
    for (size_t i = 0; i < nw; i++) {
        size_t len = strlen(words[i]);
        if (len + 4 > sizeof piece || strchr(words[i], '\'')) continue;
        snprintf(piece, sizeof piece, WPM_SPACE "%s", words[i]);
        ADD(piece, 1, -4.0f - 0.002f * (float)i);
        if (len >= 4) { /* its halves, so that segmentations compete */
            snprintf(piece, sizeof piece, WPM_SPACE "%.*s", (int)(len / 2), words[i]);
            ADD(piece, 1, -5.0f - 0.002f * (float)i);
            ADD(words[i] + len / 2, 1, -5.5f - 0.002f * (float)i);
        }
    }
#undef ADD
    return 0;
}

static int ugm_vocab(eng_gguf_writer *w, int64_t *n_vocab) {
    wpm_list l = {0};
    float *scores = NULL;
    uint8_t *cm = NULL;
    size_t cm_len = 0;
    int rc = ugm_build(&l, &scores) ? ENG_ERR_NOMEM : 0;
    if (!rc) rc = charsmap_build(&cm, &cm_len);
    eng_gguf_str *strs = rc ? NULL : malloc(l.n * sizeof *strs);
    if (!rc && !strs) rc = ENG_ERR_NOMEM;
    for (size_t i = 0; !rc && i < l.n; i++) {
        strs[i].ptr = l.tok[i];
        strs[i].len = strlen(l.tok[i]);
    }
    if (!rc) rc = eng_gguf_add_str(w, "tokenizer.ggml.model", "t5", 2);
    if (!rc) rc = eng_gguf_add_str(w, "tokenizer.ggml.pre", "default", 7);
    if (!rc) rc = eng_gguf_add_str_arr(w, "tokenizer.ggml.tokens", strs, l.n);
    if (!rc) rc = eng_gguf_add_arr(w, "tokenizer.ggml.scores", ENG_GGUF_FLOAT32, scores, l.n);
    if (!rc) rc = eng_gguf_add_arr(w, "tokenizer.ggml.token_type", ENG_GGUF_INT32, l.type, l.n);
    if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.token_type_count", 1);
    if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", 0);
    if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.padding_token_id", 1);
    if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
    if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.unknown_token_id", 3);
    if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.seperator_token_id", 2);
    if (!rc) rc = eng_gguf_add_bool(w, "tokenizer.ggml.add_bos_token", true);
    if (!rc) rc = eng_gguf_add_bool(w, "tokenizer.ggml.add_eos_token", true);
    if (!rc) rc = eng_gguf_add_bool(w, "tokenizer.ggml.add_space_prefix", true);
    if (!rc) rc = eng_gguf_add_bool(w, "tokenizer.ggml.remove_extra_whitespaces", true);
    if (!rc) rc = eng_gguf_add_arr(w, "tokenizer.ggml.precompiled_charsmap", ENG_GGUF_UINT8, cm, cm_len);
    if (rc) fprintf(stderr, "kvserve mkmodel: cannot build the unigram vocabulary: %s\n", kvs_strerror(rc));
    *n_vocab = (int64_t)l.n;
    for (size_t i = 0; i < l.n; i++) free(l.tok[i]);
    KVS_FREE_ALL(l.tok, l.type, strs, scores, cm);
    return rc;
}

int kvs_mk_encoder_vocab(eng_gguf_writer *w, const mk_opts *o, int64_t *n_vocab) {
    if (o->ugm) return ugm_vocab(w, n_vocab);
    wpm_list l = {0};
    int rc = wpm_build(&l) ? ENG_ERR_NOMEM : 0;
    eng_gguf_str *strs = rc ? NULL : malloc(l.n * sizeof *strs);
    float *scores = rc ? NULL : calloc(l.n, sizeof *scores);
    if (!rc && (!strs || !scores)) rc = ENG_ERR_NOMEM;
    for (size_t i = 0; !rc && i < l.n; i++) {
        strs[i].ptr = l.tok[i];
        strs[i].len = strlen(l.tok[i]);
    }
    if (!rc) rc = eng_gguf_add_str(w, "tokenizer.ggml.model", "bert", 4);
    if (!rc) rc = eng_gguf_add_str_arr(w, "tokenizer.ggml.tokens", strs, l.n);
    if (!rc) rc = eng_gguf_add_arr(w, "tokenizer.ggml.scores", ENG_GGUF_FLOAT32, scores, l.n);
    if (!rc) rc = eng_gguf_add_arr(w, "tokenizer.ggml.token_type", ENG_GGUF_INT32, l.type, l.n);
    if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.token_type_count", 2);
    if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.padding_token_id", 0);
    if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.unknown_token_id", 1);
    if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", 2);
    if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.cls_token_id", 2);
    if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.seperator_token_id", 3);
    if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.mask_token_id", 4);
    if (rc) fprintf(stderr, "kvserve mkmodel: cannot build the WordPiece vocabulary: %s\n", kvs_strerror(rc));
    *n_vocab = (int64_t)l.n;
    for (size_t i = 0; i < l.n; i++) free(l.tok[i]);
    KVS_FREE_ALL(l.tok, l.type, strs, scores);
    return rc;
}

int kvs_mk_encoder_metadata(eng_gguf_writer *w, const mk_opts *o, int64_t n_vocab) {
    char key[96], name[96];
    const char *a = o->arch;
    snprintf(name, sizeof name, "kvserve-mkmodel-%s%s", a, o->rerank ? "-reranker" : "");
    int rc = kvs_mk_common_metadata(w, o, n_vocab, name);
#define U32(k, v) do { if (!rc) { snprintf(key, sizeof key, "%s." k, a); rc = eng_gguf_add_u32(w, key, (uint32_t)(v)); } } while (0)
#define F32(k, v) do { if (!rc) { snprintf(key, sizeof key, "%s." k, a); rc = eng_gguf_add_f32(w, key, (float)(v)); } } while (0)
    F32("attention.layer_norm_epsilon", o->rms_eps);
    U32("pooling_type", o->rerank ? 4 : o->pooling ? o->pooling : 1);
    if (!rc) {
        snprintf(key, sizeof key, "%s.attention.causal", a);
        rc = eng_gguf_add_bool(w, key, false);
    }
    if (!strcmp(a, "nomic-bert")) {
        F32("rope.freq_base", o->rope_base);
        U32("rope.dimension_count", o->head_dim);
    }
#undef U32
#undef F32
    if (rc) fprintf(stderr, "kvserve mkmodel: cannot build the metadata: %s\n", kvs_strerror(rc));
    return rc;
}

int kvs_mk_encoder_tensors(const mk_sink *sk, const mk_opts *o, int64_t n_vocab, size_t *total, int *count) {
    const int64_t E = o->n_embd, F = o->n_ff;
    const bool nomic = !strcmp(o->arch, "nomic-bert"), jina = !strcmp(o->arch, "jina-bert-v2");
    const mk_tdef bert[] = {
        {"attn_q.weight", MK_MATRIX, E, E, 1},          {"attn_q.bias", MK_BIAS, E, 1, 1},
        {"attn_k.weight", MK_MATRIX, E, E, 1},          {"attn_k.bias", MK_BIAS, E, 1, 1},
        {"attn_v.weight", MK_MATRIX, E, E, 1},          {"attn_v.bias", MK_BIAS, E, 1, 1},
        {"attn_output.weight", MK_MATRIX, E, E, 1},     {"attn_output.bias", MK_BIAS, E, 1, 1},
        {"attn_output_norm.weight", MK_NORM, E, 1, 1},  {"attn_output_norm.bias", MK_BIAS, E, 1, 1},
        {"ffn_up.weight", MK_MATRIX, E, F, 1},          {"ffn_up.bias", MK_BIAS, F, 1, 1},
        {"ffn_down.weight", MK_MATRIX, F, E, 1},        {"ffn_down.bias", MK_BIAS, E, 1, 1},
        {"layer_output_norm.weight", MK_NORM, E, 1, 1}, {"layer_output_norm.bias", MK_BIAS, E, 1, 1},
    };
    const mk_tdef nomic_t[] = {
        {"attn_qkv.weight", MK_MATRIX, E, 3 * E, 1},    {"attn_output.weight", MK_MATRIX, E, E, 1},
        {"attn_output_norm.weight", MK_NORM, E, 1, 1},  {"attn_output_norm.bias", MK_BIAS, E, 1, 1},
        {"ffn_up.weight", MK_MATRIX, E, F, 1},          {"ffn_gate.weight", MK_MATRIX, E, F, 1},
        {"ffn_down.weight", MK_MATRIX, F, E, 1},
        {"layer_output_norm.weight", MK_NORM, E, 1, 1}, {"layer_output_norm.bias", MK_BIAS, E, 1, 1},
    };
    const mk_tdef jina_t[] = {
        {"attn_q.weight", MK_MATRIX, E, E, 1},          {"attn_q.bias", MK_BIAS, E, 1, 1},
        {"attn_k.weight", MK_MATRIX, E, E, 1},          {"attn_k.bias", MK_BIAS, E, 1, 1},
        {"attn_v.weight", MK_MATRIX, E, E, 1},          {"attn_v.bias", MK_BIAS, E, 1, 1},
        {"attn_output.weight", MK_MATRIX, E, E, 1},     {"attn_output.bias", MK_BIAS, E, 1, 1},
        {"attn_output_norm.weight", MK_NORM, E, 1, 1},  {"attn_output_norm.bias", MK_BIAS, E, 1, 1},
        {"ffn_up.weight", MK_MATRIX, E, 2 * F, 1},
        {"ffn_down.weight", MK_MATRIX, F, E, 1},        {"ffn_down.bias", MK_BIAS, E, 1, 1},
        {"layer_output_norm.weight", MK_NORM, E, 1, 1}, {"layer_output_norm.bias", MK_BIAS, E, 1, 1},
    };
    const mk_tdef *td = nomic ? nomic_t : jina ? jina_t : bert;
    const size_t nt = nomic ? sizeof nomic_t / sizeof nomic_t[0] : jina ? sizeof jina_t / sizeof jina_t[0]
                                                                       : sizeof bert / sizeof bert[0];
    char name[96];
    int rc = kvs_mk_tensor_one(sk, o, "token_embd.weight", MK_EMBED, E, n_vocab, 1, total, count);
    /* as many token types as the vocabulary says: 2 for BERT, 1 for XLM-RoBERTa */
    if (!rc) rc = kvs_mk_tensor_one(sk, o, "token_types.weight", MK_EMBED_F32, E, o->ugm ? 1 : 2, 1, total, count);
    if (!rc && !nomic && !jina)
        rc = kvs_mk_tensor_one(sk, o, "position_embd.weight", MK_EMBED, E, o->n_ctx, 1, total, count);
    if (!rc) rc = kvs_mk_tensor_one(sk, o, "token_embd_norm.weight", MK_NORM, E, 1, 1, total, count);
    if (!rc) rc = kvs_mk_tensor_one(sk, o, "token_embd_norm.bias", MK_BIAS, E, 1, 1, total, count);
    for (int64_t l = 0; l < o->n_layer && !rc; l++)
        for (size_t i = 0; i < nt && !rc; i++) {
            snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, td[i].suffix);
            rc = kvs_mk_tensor_one(sk, o, name, td[i].kind, td[i].ne0, td[i].ne1, 1, total, count);
        }
    if (jina && o->rerank) { /* jina-reranker-v1's head: one linear output, tanh */
        if (!rc) rc = kvs_mk_tensor_one(sk, o, "cls.weight", MK_BIAS, E, 1, 1, total, count);
        if (!rc) rc = kvs_mk_tensor_one(sk, o, "cls.bias", MK_BIAS, 1, 1, 1, total, count);
        return rc;
    }
    if (!rc && o->rerank) rc = kvs_mk_tensor_one(sk, o, "cls.weight", MK_MATRIX, E, E, 1, total, count);
    if (!rc && o->rerank) rc = kvs_mk_tensor_one(sk, o, "cls.bias", MK_BIAS, E, 1, 1, total, count);
    /* the output layer as f32 [E, 1] (one row: q8_0 would need nothing more, but keep the score exact) */
    if (!rc && o->rerank) rc = kvs_mk_tensor_one(sk, o, "cls.output.weight", MK_BIAS, E, 1, 1, total, count);
    if (!rc && o->rerank) rc = kvs_mk_tensor_one(sk, o, "cls.output.bias", MK_BIAS, 1, 1, 1, total, count);
    return rc;
}
