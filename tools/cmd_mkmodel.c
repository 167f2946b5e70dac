/*
 * cmd_mkmodel.c: `kvserve mkmodel` writes a llama/qwen2/phi3 GGUF with deterministic random weights.
 *
 * The weights are a pure function of (--seed, tensor name, shape, --std): each tensor has its own PRNG stream
 * (splitmix64 seeded by the seed and an FNV-1a hash of the name), and normal values are made with integer
 * arithmetic and one correctly rounded multiplication (an Irwin-Hall sum of eight 16-bit uniforms, scaled to
 * unit variance) instead of libm's log/sin/cos, whose last bits may differ between C libraries. So the file
 * is byte-identical across runs and machines. Quantization uses the engine's own eng_quantize_row.
 *
 * The tokenizer block is copied from another GGUF (--vocab-from: every tokenizer.* key) or built in: a small
 * SentencePiece-style ("llama") vocabulary with byte fallback, ChatML special tokens and a ChatML template.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "engine/kernels/quant.h"
#include "tools/commands.h"

/* ---- options ------------------------------------------------------------------------------------------------ */
typedef struct mk_opts {
    const char *out;
    const char *preset;
    const char *vocab_from;
    char arch[16];          /* "llama", "qwen2" or "phi3" */
    int64_t n_embd;
    int64_t n_layer;
    int64_t n_head;
    int64_t n_head_kv;
    int64_t n_ff;
    int64_t n_ctx;
    int64_t head_dim;       /* 0: n_embd / n_head */
    double rope_base;
    double rms_eps;         /* < 0: the arch default (1e-5 llama, 1e-6 qwen2) */
    uint32_t wtype;         /* matrices: ENG_Q_F32, ENG_Q_F16 or ENG_Q_Q8_0 */
    bool tied;
    bool fim;               /* built-in vocabulary: add <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|> and their
                               tokenizer.ggml.fim_{pre,suf,mid}_token_id keys */
    bool rope_factors;      /* phi3: rope_factors_long/short.weight (LongRoPE, as Phi-3 128k / Phi-3.5 have) */
    int64_t orig_ctx;       /* > 0: <arch>.rope.scaling.original_context_length */
    double rope_attn;       /* > 0: <arch>.rope.scaling.attn_factor; 0: LongRoPE's default (see parse_args) */
    uint64_t seed;
    double std;             /* matrices and biases */
    double embd_std;        /* token_embd and output */
} mk_opts;

static void usage(FILE *f) {
    fprintf(f,
        "usage: kvserve mkmodel -o OUT.gguf [OPTIONS]\n"
        "\n"
        "Writes a llama/qwen2/phi3 GGUF model with deterministic random weights (same options, same bytes on every\n"
        "machine). Useful for tests, benchmarks and the embedded default model; its output is gibberish.\n"
        "\n"
        "  -o, --output FILE     output path (required); written atomically\n"
        "  --preset NAME         starting shape, changed by the options below (default: default):\n"
        "                          default     llama, embd 256, 4 blocks, 8 heads, 4 kv heads, ff 768, ctx 2048,\n"
        "                                    untied, q8_0, built-in vocabulary (the model of `make run`)\n"
        "                          tiny        llama, embd 64, 2 blocks, 4 heads, 2 kv heads, ff 128, ctx 512,\n"
        "                                      separate output.weight, f32 (fast tests)\n"
        "                          bench-135m  llama, embd 576, 30 blocks, 9 heads, 3 kv heads, ff 1536,\n"
        "                                      ctx 4096, tied, q8_0 (pass --vocab-from a gpt-2 vocabulary)\n"
        "                          llama-1b    llama, embd 2048, 16 blocks, 32 heads, 8 kv heads, ff 8192,\n"
        "                                      ctx 8192, rope base 500000, tied, q8_0\n"
        "                          bench-1b    the Llama-3.2-1B shape: llama-1b with ctx 131072, f16 (pass\n"
        "                                      --vocab-from a llama 3 vocabulary; `kvserve quantize` makes the\n"
        "                                      Q4_K_M/Q5_K_M/Q6_K/Q8_0 bench models from it)\n"
        "  --arch llama|qwen2|phi3  architecture (qwen2 adds Q/K/V biases and uses rms eps 1e-6 by default;\n"
        "                        phi3 fuses Q/K/V into attn_qkv and gate|up into ffn_up, and rotates halves)\n"
        "  --embd N              embedding length\n"
        "  --layers N            number of blocks\n"
        "  --heads N             attention heads\n"
        "  --kv-heads N          key/value heads (must divide --heads)\n"
        "  --ff N                feed-forward length\n"
        "  --ctx N               training context length written to the metadata\n"
        "  --head-dim N          per-head dimension (default embd / heads; even)\n"
        "  --rope-base F         rope frequency base (default 10000)\n"
        "  --rms-eps F           RMS norm epsilon\n"
        "  --type f32|f16|q8_0   type of the matrices and embeddings (norms and biases are always f32);\n"
        "                        q8_0 needs embd, heads*head-dim and ff to be multiples of 32\n"
        "  --tied / --untied     without / with a separate output.weight\n"
        "  --fim                 (built-in vocabulary) add the fill-in-the-middle control tokens <|fim_prefix|>,\n"
        "                        <|fim_suffix|>, <|fim_middle|> at the end and name them in\n"
        "                        tokenizer.ggml.fim_pre/suf/mid_token_id\n"
        "  --vocab-from FILE     copy every tokenizer.* key from this GGUF (e.g. a vocab-only file); the\n"
        "                        vocabulary size follows it. Default: a built-in 'llama' (SPM) vocabulary\n"
        "  --rope-factors        (phi3) add LongRoPE's rope_factors_short.weight (1 + 0.25 t) and\n"
        "                        rope_factors_long.weight (1 + 15 t^2), t = i / (head-dim / 2 - 1)\n"
        "  --orig-ctx N          rope.scaling.original_context_length: contexts longer than N use the long\n"
        "                        factors, others the short ones\n"
        "  --rope-attn-factor F  rope.scaling.attn_factor; default with --rope-factors and ctx > orig-ctx:\n"
        "                        sqrt(1 + ln(ctx / orig-ctx) / ln(orig-ctx)), as llama.cpp's converter writes\n"
        "  --seed N              random seed (default 42)\n"
        "  --std F               standard deviation of matrices (default 0.05); embeddings use 0.5\n"
        "  --embd-std F          standard deviation of token_embd/output (default 0.5)\n"
        "  -h, --help            this text\n");
}

static void preset_defaults(mk_opts *o) {
    snprintf(o->arch, sizeof o->arch, "llama");
    o->n_embd = 256; o->n_layer = 4; o->n_head = 8; o->n_head_kv = 4; o->n_ff = 768; o->n_ctx = 2048;
    o->head_dim = 0; o->rope_base = 10000.0; o->rms_eps = -1; o->wtype = ENG_Q_Q8_0; o->tied = true;
    o->seed = 42; o->std = 0.05; o->embd_std = 0.5;
}

static int apply_preset(mk_opts *o, const char *name) {
    preset_defaults(o);
    o->preset = name;
    if (!strcmp(name, "default")) {
        /* Untied: with tied random embeddings a model mostly repeats its last input token, which reads as
         * a bug to someone trying `make run`; a separate random output layer gives varied (random) text. */
        o->tied = false;
        return 0;
    }
    if (!strcmp(name, "tiny")) {
        o->n_embd = 64; o->n_layer = 2; o->n_head = 4; o->n_head_kv = 2; o->n_ff = 128; o->n_ctx = 512;
        o->wtype = ENG_Q_F32; o->tied = false;
        return 0;
    }
    if (!strcmp(name, "bench-135m")) {
        o->n_embd = 576; o->n_layer = 30; o->n_head = 9; o->n_head_kv = 3; o->n_ff = 1536; o->n_ctx = 4096;
        return 0;
    }
    if (!strcmp(name, "llama-1b") || !strcmp(name, "bench-1b")) {
        o->n_embd = 2048; o->n_layer = 16; o->n_head = 32; o->n_head_kv = 8; o->n_ff = 8192; o->n_ctx = 8192;
        o->rope_base = 500000.0;
        if (!strcmp(name, "bench-1b")) {
            o->n_ctx = 131072;  /* Llama 3.2's context_length */
            o->wtype = ENG_Q_F16;
        }
        return 0;
    }
    return -1;
}

static int parse_i64(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "kvserve mkmodel: %s wants an integer in %lld..%lld, got '%s'\n", opt, (long long)lo,
                (long long)hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_f64(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "kvserve mkmodel: %s wants a number in %g..%g, got '%s'\n", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* Returns 0 to go on, 1 after --help, 2 on a usage error. */
static int parse_args(int argc, char **argv, mk_opts *o) {
    const char *preset = "default";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { usage(stdout); return 1; }
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[i + 1];
        else if (!strncmp(argv[i], "--preset=", 9)) preset = argv[i] + 9;
    }
    if (apply_preset(o, preset) != 0) {
        fprintf(stderr, "kvserve mkmodel: unknown preset '%s' (default, tiny, bench-135m, llama-1b, bench-1b)\n", preset);
        return 2;
    }
    const int64_t big = 1 << 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        char name[32];
        /* --name=value or --name value */
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        if (eq) {
            size_t n = (size_t)(eq - a);
            if (n >= sizeof name) n = sizeof name - 1;
            memcpy(name, a, n);
            name[n] = 0;
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a);
        }
        bool flag = !strcmp(name, "--tied") || !strcmp(name, "--untied") || !strcmp(name, "--fim") ||
                    !strcmp(name, "--rope-factors");
        if (flag) {
            if (val) { fprintf(stderr, "kvserve mkmodel: %s takes no value\n", name); return 2; }
            if (!strcmp(name, "--fim")) o->fim = true;
            else if (!strcmp(name, "--rope-factors")) o->rope_factors = true;
            else o->tied = !strcmp(name, "--tied");
            continue;
        }
        if (!val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kvserve mkmodel: %s needs a value (or unknown option; see --help)\n", a);
                return 2;
            }
            val = argv[++i];
        }
        int rc = 0;
        if (!strcmp(name, "-o") || !strcmp(name, "--output")) o->out = val;
        else if (!strcmp(name, "--preset")) { /* applied above */ }
        else if (!strcmp(name, "--arch")) {
            if (strcmp(val, "llama") && strcmp(val, "qwen2") && strcmp(val, "phi3")) {
                fprintf(stderr, "kvserve mkmodel: --arch must be llama, qwen2 or phi3, got '%s'\n", val);
                return 2;
            }
            snprintf(o->arch, sizeof o->arch, "%s", val);
        }
        else if (!strcmp(name, "--embd")) rc = parse_i64(name, val, 1, big, &o->n_embd);
        else if (!strcmp(name, "--layers")) rc = parse_i64(name, val, 1, 4096, &o->n_layer);
        else if (!strcmp(name, "--heads")) rc = parse_i64(name, val, 1, 4096, &o->n_head);
        else if (!strcmp(name, "--kv-heads")) rc = parse_i64(name, val, 1, 4096, &o->n_head_kv);
        else if (!strcmp(name, "--ff")) rc = parse_i64(name, val, 1, big, &o->n_ff);
        else if (!strcmp(name, "--ctx")) rc = parse_i64(name, val, 1, INT32_MAX, &o->n_ctx);
        else if (!strcmp(name, "--head-dim")) rc = parse_i64(name, val, 2, 4096, &o->head_dim);
        else if (!strcmp(name, "--rope-base")) rc = parse_f64(name, val, 1.0, 1e12, &o->rope_base);
        else if (!strcmp(name, "--orig-ctx")) rc = parse_i64(name, val, 1, INT32_MAX, &o->orig_ctx);
        else if (!strcmp(name, "--rope-attn-factor")) rc = parse_f64(name, val, 1e-3, 1e3, &o->rope_attn);
        else if (!strcmp(name, "--rms-eps")) rc = parse_f64(name, val, 1e-12, 1.0, &o->rms_eps);
        else if (!strcmp(name, "--std")) rc = parse_f64(name, val, 0.0, 100.0, &o->std);
        else if (!strcmp(name, "--embd-std")) rc = parse_f64(name, val, 0.0, 100.0, &o->embd_std);
        else if (!strcmp(name, "--vocab-from")) o->vocab_from = val;
        else if (!strcmp(name, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(val, &end, 0);
            if (errno || end == val || *end || val[0] == '-') {
                fprintf(stderr, "kvserve mkmodel: --seed wants a non-negative integer, got '%s'\n", val);
                return 2;
            }
            o->seed = v;
        } else if (!strcmp(name, "--type")) {
            if (!strcmp(val, "f32")) o->wtype = ENG_Q_F32;
            else if (!strcmp(val, "f16")) o->wtype = ENG_Q_F16;
            else if (!strcmp(val, "q8_0")) o->wtype = ENG_Q_Q8_0;
            else {
                fprintf(stderr, "kvserve mkmodel: --type must be f32, f16 or q8_0, got '%s'\n", val);
                return 2;
            }
        } else {
            fprintf(stderr, "kvserve mkmodel: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (rc) return 2;
    }
    if (!o->out) {
        fprintf(stderr, "kvserve mkmodel: -o OUT is required (see --help)\n");
        return 2;
    }
    if (o->rms_eps < 0) o->rms_eps = !strcmp(o->arch, "qwen2") ? 1e-6 : 1e-5;
    if (o->head_dim == 0) {
        if (o->n_embd % o->n_head) {
            fprintf(stderr, "kvserve mkmodel: embd %lld is not divisible by heads %lld; give --head-dim\n",
                    (long long)o->n_embd, (long long)o->n_head);
            return 2;
        }
        o->head_dim = o->n_embd / o->n_head;
    }
    if (o->rope_factors && strcmp(o->arch, "phi3")) {
        fprintf(stderr, "kvserve mkmodel: --rope-factors needs --arch phi3\n");
        return 2;
    }
    if (o->rope_factors && o->orig_ctx > 0 && o->n_ctx > o->orig_ctx && o->rope_attn == 0) {
        double scale = (double)o->n_ctx / (double)o->orig_ctx; /* LongRoPE's attention factor */
        o->rope_attn = sqrt(1.0 + log(scale) / log((double)o->orig_ctx));
    }
    if (o->head_dim % 2) {
        fprintf(stderr, "kvserve mkmodel: head dim %lld must be even (rope rotates pairs)\n", (long long)o->head_dim);
        return 2;
    }
    if (o->n_head % o->n_head_kv) {
        fprintf(stderr, "kvserve mkmodel: kv-heads %lld must divide heads %lld\n", (long long)o->n_head_kv,
                (long long)o->n_head);
        return 2;
    }
    if (o->n_head * o->head_dim > big) {
        fprintf(stderr, "kvserve mkmodel: heads * head-dim is too large\n");
        return 2;
    }
    if (o->wtype == ENG_Q_Q8_0) {
        const struct { const char *what; int64_t v; } rows[] = {
            {"embd", o->n_embd}, {"heads * head-dim", o->n_head * o->head_dim}, {"ff", o->n_ff}};
        for (int i = 0; i < 3; i++)
            if (rows[i].v % 32) {
                fprintf(stderr, "kvserve mkmodel: --type q8_0 needs %s (%lld) to be a multiple of 32\n",
                        rows[i].what, (long long)rows[i].v);
                return 2;
            }
    }
    return 0;
}

/* ---- deterministic random numbers ------------------------------------------------------------------------- */
typedef struct mk_rng { uint64_t s; } mk_rng;

static uint64_t mk_next(mk_rng *r) {  /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static mk_rng mk_rng_for(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull;
    for (const char *p = name; *p; p++) { h ^= (uint8_t)*p; h *= 1099511628211ull; }
    mk_rng r = {seed ^ h};
    mk_next(&r);
    return r;
}

/* Approximately standard normal: the sum of eight uniform 16-bit integers, centred and scaled to unit
 * variance (range +-4.9). Exact integer arithmetic, then one multiplication: the same bits everywhere. */
static double mk_normal(mk_rng *r) {
    uint64_t a = mk_next(r), b = mk_next(r);
    int64_t s = 0;
    for (int i = 0; i < 4; i++) s += (int64_t)((a >> (16 * i)) & 0xffff) + (int64_t)((b >> (16 * i)) & 0xffff);
    double c = (double)(2 * s - 8 * 65535);      /* 2 * (s - mean): an exact integer */
    return c * (1.2247448713915890491 / 131072.0); /* * sqrt(12 / 8) / (2 * 65536) */
}

/* ---- built-in vocabulary ------------------------------------------------------------------------------------ */
static const char *const k_words[] = {
    "the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "with",
    "as", "I", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "not", "word",
    "but", "what", "some", "we", "can", "out", "other", "were", "all", "there", "when", "up", "use", "your",
    "how", "said", "an", "each", "she", "which", "do", "their", "time", "if", "will", "way", "about", "many",
    "then", "them", "write", "would", "like", "so", "these", "her", "long", "make", "thing", "see", "him",
    "two", "has", "look", "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most",
    "people", "my", "over", "know", "water", "than", "call", "first", "who", "may", "down", "side", "been",
    "now", "find", "any", "new", "work", "part", "take", "get", "place", "made", "live", "where", "after",
    "back", "little", "only", "round", "man", "year", "came", "show", "every", "good", "me", "give", "our",
    "under", "name", "very", "through", "just", "form", "sentence", "great", "think", "say", "help", "low",
    "line", "differ", "turn", "cause", "much", "mean", "before", "move", "right", "boy", "old", "too", "same",
    "tell", "does", "set", "three", "want", "air", "well", "also", "play", "small", "end", "put", "home",
    "read", "hand", "port", "large", "spell", "add", "even", "land", "here", "must", "big", "high", "such",
    "follow", "act", "why", "ask", "men", "change", "went", "light", "kind", "off", "need", "house",
    "picture", "try", "us", "again", "animal", "point", "mother", "world", "near", "build", "self", "earth",
    "father", "head", "stand", "own", "page", "should", "country", "found", "answer", "school", "grow",
    "study", "still", "learn", "plant", "cover", "food", "sun", "four", "between", "state", "keep", "eye",
    "never", "last", "let", "thought", "city", "tree", "cross", "farm", "hard", "start", "might", "story",
    "saw", "far", "sea", "draw", "left", "late", "run", "don't", "while", "press", "close", "night", "real",
    "life", "few", "north", "open", "seem", "together", "next", "white", "children", "begin", "got", "walk",
    "example", "ease", "paper", "group", "always", "music", "those", "both", "mark", "often", "letter",
    "until", "mile", "river", "car", "feet", "care", "second", "book", "carry", "took", "science", "eat",
    "room", "friend", "began", "idea", "fish", "mountain", "stop", "once", "base", "hear", "horse", "cut",
    "sure", "watch", "color", "face", "wood", "main", "enough", "plain", "girl", "usual", "young", "ready",
    "above", "ever", "red", "list", "though", "feel", "talk", "bird", "soon", "body", "dog", "family",
    "direct", "leave", "song", "door", "hello", "yes", "thank", "thanks", "please", "question", "model",
    "server", "token", "text", "The", "It", "He", "She", "We", "You", "They", "This", "What", "Hello", "Once",
    "One", "There", "In", "A", "My", "How", "Why", "Yes", "No", "user", "assistant", "system", "is", "am",
    "happy", "sad", "love", "loved", "played", "wanted", "upon", "day", "named", "Lily", "Tom", "ball",
    "park", "sky", "blue", "green", "tall",
};
static const char k_chars[] =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"-:;()/&%$#@*+=<>[]{}_~`^|\\";

typedef struct mk_vocab {
    char **tok;
    float *score;
    int32_t *type;
    size_t n, cap;
} mk_vocab;

static void vocab_free(mk_vocab *v) {
    for (size_t i = 0; i < v->n; i++) free(v->tok[i]);
    free(v->tok);
    free(v->score);
    free(v->type);
}

static int vocab_add(mk_vocab *v, const char *s, size_t len, int32_t type, float score) {
    for (size_t i = 0; i < v->n; i++)
        if (strlen(v->tok[i]) == len && !memcmp(v->tok[i], s, len)) return 0;  /* already there */
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 1024;
        char **t = realloc(v->tok, cap * sizeof *t);
        if (!t) return -1;
        v->tok = t;
        float *sc = realloc(v->score, cap * sizeof *sc);
        if (!sc) return -1;
        v->score = sc;
        int32_t *ty = realloc(v->type, cap * sizeof *ty);
        if (!ty) return -1;
        v->type = ty;
        v->cap = cap;
    }
    char *c = malloc(len + 1);
    if (!c) return -1;
    memcpy(c, s, len);
    c[len] = 0;
    v->tok[v->n] = c;
    v->type[v->n] = type;
    v->score[v->n] = score;
    v->n++;
    return 0;
}

#define SPM_SPACE "\xe2\x96\x81"  /* U+2581, the SentencePiece space marker */

/* ids: 0 <unk>, 1 <s>, 2 </s>, 3 <|im_start|>, 4 <|im_end|>, 5..260 byte tokens, then characters and words.
 * Every word comes with all of its "\u2581"-prefixed prefixes, and there are no other multi-character pieces,
 * so SPM merging grows each word left to right and known words become one token. */
static int vocab_builtin(mk_vocab *v) {
    static const char *const specials[] = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"};
    static const int32_t special_type[] = {2, 3, 3, 3, 3};
    for (int i = 0; i < 5; i++)
        if (vocab_add(v, specials[i], strlen(specials[i]), special_type[i], 0.0f)) return -1;
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        if (vocab_add(v, s, 6, 6, 0.0f)) return -1;
    }
    float score = 0.0f;
    if (vocab_add(v, SPM_SPACE, 3, 1, score)) return -1;
    for (const char *c = k_chars; *c; c++) {
        score -= 1.0f;
        if (vocab_add(v, c, 1, 1, score)) return -1;
    }
    for (size_t w = 0; w < sizeof k_words / sizeof k_words[0]; w++) {
        char piece[64];
        size_t wl = strlen(k_words[w]);
        if (wl + 4 > sizeof piece) return -1;
        memcpy(piece, SPM_SPACE, 3);
        memcpy(piece + 3, k_words[w], wl);
        for (size_t l = 1; l <= wl; l++) {
            size_t before = v->n;
            if (vocab_add(v, piece, 3 + l, 1, score - 1.0f)) return -1;
            if (v->n > before) score -= 1.0f;
        }
    }
    return 0;
}

static const char k_chatml_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

static int add_builtin_vocab(eng_gguf_writer *w, bool fim, int64_t *n_vocab) {
    static const char *const fim_tok[3] = {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"};
    mk_vocab v = {0};
    int rc = vocab_builtin(&v) ? ENG_ERR_NOMEM : 0;
    size_t fim0 = v.n;
    for (int i = 0; fim && !rc && i < 3; i++)
        if (vocab_add(&v, fim_tok[i], strlen(fim_tok[i]), 3, 0.0f)) rc = ENG_ERR_NOMEM;
    eng_gguf_str *strs = NULL;
    if (!rc) {
        strs = malloc(v.n * sizeof *strs);
        if (!strs) rc = ENG_ERR_NOMEM;
    }
    if (!rc) {
        for (size_t i = 0; i < v.n; i++) { strs[i].ptr = v.tok[i]; strs[i].len = strlen(v.tok[i]); }
        if (!rc) rc = eng_gguf_add_str(w, "tokenizer.ggml.model", "llama", 5);
        if (!rc) rc = eng_gguf_add_str_arr(w, "tokenizer.ggml.tokens", strs, v.n);
        if (!rc) rc = eng_gguf_add_arr(w, "tokenizer.ggml.scores", ENG_GGUF_FLOAT32, v.score, v.n);
        if (!rc) rc = eng_gguf_add_arr(w, "tokenizer.ggml.token_type", ENG_GGUF_INT32, v.type, v.n);
        if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
        if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
        if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
        if (!rc) rc = eng_gguf_add_u32(w, "tokenizer.ggml.eot_token_id", 4);
        if (!rc) rc = eng_gguf_add_bool(w, "tokenizer.ggml.add_bos_token", true);
        if (!rc) rc = eng_gguf_add_bool(w, "tokenizer.ggml.add_eos_token", false);
        if (!rc && fim) rc = eng_gguf_add_u32(w, "tokenizer.ggml.fim_pre_token_id", (uint32_t)fim0);
        if (!rc && fim) rc = eng_gguf_add_u32(w, "tokenizer.ggml.fim_suf_token_id", (uint32_t)fim0 + 1);
        if (!rc && fim) rc = eng_gguf_add_u32(w, "tokenizer.ggml.fim_mid_token_id", (uint32_t)fim0 + 2);
        if (!rc) rc = eng_gguf_add_str(w, "tokenizer.chat_template", k_chatml_template, strlen(k_chatml_template));
        *n_vocab = (int64_t)v.n;
    }
    free(strs);
    vocab_free(&v);
    return rc;
}

static int add_vocab_from(eng_gguf_writer *w, const char *path, int64_t *n_vocab) {
    eng_gguf *g;
    char err[512];
    int rc = eng_gguf_open(path, &g, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvserve mkmodel: %s\n", err);
        return rc;
    }
    uint32_t et;
    uint64_t n;
    rc = eng_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, NULL, NULL);
    if (rc || et != ENG_GGUF_STRING || n == 0 || n > INT32_MAX) {
        fprintf(stderr, "kvserve mkmodel: %s: no usable tokenizer.ggml.tokens string array\n", path);
        eng_gguf_close(g);
        return ENG_ERR_FORMAT;
    }
    *n_vocab = (int64_t)n;
    for (int64_t i = 0; i < eng_gguf_n_kv(g) && !rc; i++) {
        const eng_gguf_kv *kv = eng_gguf_kv_at(g, i);
        if (kv->key.len > 10 && !memcmp(kv->key.ptr, "tokenizer.", 10)) rc = eng_gguf_add_kv_from(w, kv);
    }
    if (rc) fprintf(stderr, "kvserve mkmodel: %s: cannot copy the tokenizer block: %s\n", path, kvs_strerror(rc));
    eng_gguf_close(g);
    return rc;
}

/* ---- tensors --------------------------------------------------------------------------------------------------- */
enum { MK_MATRIX, MK_EMBED, MK_NORM, MK_BIAS };

/* One tensor of a block: blk.N.<suffix>, [ne0, ne1] */
typedef struct mk_tdef { const char *suffix; int kind; int64_t ne0, ne1; } mk_tdef;

/* Generates tensor `name` of [ne0, ne1] and adds it in type (norms and biases: f32). */
static int add_tensor(eng_gguf_writer *w, const mk_opts *o, const char *name, int kind, int64_t ne0, int64_t ne1,
                      size_t *total_bytes) {
    uint32_t type = (kind == MK_MATRIX || kind == MK_EMBED) ? o->wtype : ENG_Q_F32;
    int64_t n = ne0 * ne1;
    float *vals = malloc((size_t)n * sizeof *vals);
    size_t row_bytes = eng_qtype_row_bytes(type, ne0);
    size_t nbytes = row_bytes * (size_t)ne1;
    uint8_t *data = row_bytes ? malloc(nbytes) : NULL;
    if (!vals || !data) {
        free(vals);
        free(data);
        fprintf(stderr, "kvserve mkmodel: out of memory for %s (%zu bytes)\n", name, nbytes);
        return ENG_ERR_NOMEM;
    }
    mk_rng r = mk_rng_for(o->seed, name);
    double std = kind == MK_EMBED ? o->embd_std : kind == MK_NORM ? 0.02 : o->std;
    double mean = kind == MK_NORM ? 1.0 : 0.0;
    for (int64_t i = 0; i < n; i++) {
        double z = mk_normal(&r);
        double x = z * std;
        vals[i] = (float)(mean + x);
    }
    int rc = 0;
    for (int64_t row = 0; row < ne1 && !rc; row++)
        rc = eng_quantize_row(type, vals + row * ne0, data + (size_t)row * row_bytes, ne0);
    if (!rc) {
        const int64_t ne[2] = {ne0, ne1};
        rc = eng_gguf_add_tensor(w, name, type, ne1 > 1 ? 2 : 1, ne, data, nbytes);
    }
    if (rc) fprintf(stderr, "kvserve mkmodel: cannot make tensor %s: %s\n", name, kvs_strerror(rc));
    *total_bytes += nbytes;
    free(vals);
    free(data);
    return rc;
}

/* LongRoPE's per-frequency divisors (rope_factors_short/long.weight, [half] f32, all >= 1): growing from the fast
 * rotations (i = 0, factor 1) to the slow ones, much more for the long set, as in Phi-3.5's files. Only basic
 * arithmetic, so the values are the same on every machine. */
static int add_rope_factors(eng_gguf_writer *w, int64_t half, size_t *total_bytes) {
    float *f = malloc((size_t)half * sizeof *f);
    if (!f) return ENG_ERR_NOMEM;
    int rc = 0;
    for (int set = 0; set < 2 && !rc; set++) {
        for (int64_t i = 0; i < half; i++) {
            double t = half > 1 ? (double)i / (double)(half - 1) : 0.0;
            f[i] = (float)(set == 0 ? 1.0 + 0.25 * t : 1.0 + 15.0 * t * t);
        }
        const int64_t ne[1] = {half};
        rc = eng_gguf_add_tensor(w, set == 0 ? "rope_factors_short.weight" : "rope_factors_long.weight", ENG_Q_F32,
                                 1, ne, f, (size_t)half * sizeof *f);
        *total_bytes += (size_t)half * sizeof *f;
    }
    if (rc) fprintf(stderr, "kvserve mkmodel: cannot add the rope factors: %s\n", kvs_strerror(rc));
    free(f);
    return rc;
}

static int add_metadata(eng_gguf_writer *w, const mk_opts *o, int64_t n_vocab) {
    char key[96], name[96];
    const char *a = o->arch;
    int rc = eng_gguf_add_str(w, "general.architecture", a, strlen(a));
    snprintf(name, sizeof name, "kvserve-mkmodel-%s", o->preset);
    if (!rc) rc = eng_gguf_add_str(w, "general.name", name, strlen(name));
    uint32_t ftype = o->wtype == ENG_Q_F32 ? 0 : o->wtype == ENG_Q_F16 ? 1 : 7;  /* llama.cpp's file types */
    if (!rc) rc = eng_gguf_add_u32(w, "general.file_type", ftype);
    if (!rc && o->wtype == ENG_Q_Q8_0) rc = eng_gguf_add_u32(w, "general.quantization_version", 2);
#define U32(k, v) do { if (!rc) { snprintf(key, sizeof key, "%s." k, a); rc = eng_gguf_add_u32(w, key, (uint32_t)(v)); } } while (0)
#define F32(k, v) do { if (!rc) { snprintf(key, sizeof key, "%s." k, a); rc = eng_gguf_add_f32(w, key, (float)(v)); } } while (0)
    U32("vocab_size", n_vocab);
    U32("context_length", o->n_ctx);
    U32("embedding_length", o->n_embd);
    U32("block_count", o->n_layer);
    U32("feed_forward_length", o->n_ff);
    U32("attention.head_count", o->n_head);
    U32("attention.head_count_kv", o->n_head_kv);
    F32("attention.layer_norm_rms_epsilon", o->rms_eps);
    F32("rope.freq_base", o->rope_base);
    U32("rope.dimension_count", o->head_dim);
    if (o->orig_ctx > 0) U32("rope.scaling.original_context_length", o->orig_ctx);
    if (o->rope_attn > 0) F32("rope.scaling.attn_factor", o->rope_attn);
    if (o->head_dim * o->n_head != o->n_embd) {
        U32("attention.key_length", o->head_dim);
        U32("attention.value_length", o->head_dim);
    }
#undef U32
#undef F32
    return rc;
}

int kvs_cmd_mkmodel(int argc, char **argv) {
    mk_opts o;
    memset(&o, 0, sizeof o);
    int prc = parse_args(argc, argv, &o);
    if (prc == 1) return 0;
    if (prc) return 2;

    eng_gguf_writer *w;
    if (eng_gguf_writer_create(&w)) {
        fprintf(stderr, "kvserve mkmodel: out of memory\n");
        return 1;
    }
    int64_t n_vocab = 0;
    int rc = 0;
    /* Metadata first needs n_vocab: build the tokenizer block into a scratch writer, then copy it after. */
    eng_gguf_writer *tw;
    if (eng_gguf_writer_create(&tw)) rc = ENG_ERR_NOMEM;
    if (o.fim && o.vocab_from) {
        fprintf(stderr, "kvserve mkmodel: --fim adds tokens to the built-in vocabulary; it cannot be combined with "
                "--vocab-from\n");
        rc = ENG_ERR_INVALID;
    }
    if (!rc) rc = o.vocab_from ? add_vocab_from(tw, o.vocab_from, &n_vocab) : add_builtin_vocab(tw, o.fim, &n_vocab);
    if (!rc) rc = add_metadata(w, &o, n_vocab);
    if (!rc) {
        /* Copy the tokenizer block through a reader over the scratch writer's bytes. */
        void *mem = NULL;
        size_t size = 0;
        eng_gguf *g = NULL;
        char err[256];
        rc = eng_gguf_write_memory(tw, &mem, &size);
        if (!rc) rc = eng_gguf_open_memory(mem, size, "tokenizer block", &g, err, sizeof err);
        for (int64_t i = 0; !rc && i < eng_gguf_n_kv(g); i++) rc = eng_gguf_add_kv_from(w, eng_gguf_kv_at(g, i));
        eng_gguf_close(g);
        free(mem);
    }
    eng_gguf_writer_free(tw);
    if (rc && rc != ENG_ERR_IO && rc != ENG_ERR_FORMAT && rc != ENG_ERR_UNSUPPORTED)
        fprintf(stderr, "kvserve mkmodel: cannot build the metadata: %s\n", kvs_strerror(rc));

    const int64_t E = o.n_embd, Q = o.n_head * o.head_dim, KV = o.n_head_kv * o.head_dim, F = o.n_ff;
    size_t total = 0;
    char name[96];
    if (!rc) rc = add_tensor(w, &o, "token_embd.weight", MK_EMBED, E, n_vocab, &total);
    for (int64_t l = 0; l < o.n_layer && !rc; l++) {
        const mk_tdef t[] = {
            {"attn_norm.weight", MK_NORM, E, 1},   {"attn_q.weight", MK_MATRIX, E, Q},
            {"attn_k.weight", MK_MATRIX, E, KV},   {"attn_v.weight", MK_MATRIX, E, KV},
            {"attn_q.bias", MK_BIAS, Q, 1},        {"attn_k.bias", MK_BIAS, KV, 1},
            {"attn_v.bias", MK_BIAS, KV, 1},       {"attn_output.weight", MK_MATRIX, Q, E},
            {"ffn_norm.weight", MK_NORM, E, 1},    {"ffn_gate.weight", MK_MATRIX, E, F},
            {"ffn_up.weight", MK_MATRIX, E, F},    {"ffn_down.weight", MK_MATRIX, F, E},
        };
        /* phi3: Q, K, V rows fused in attn_qkv, gate then up rows fused in ffn_up */
        const mk_tdef fused[] = {
            {"attn_norm.weight", MK_NORM, E, 1},       {"attn_qkv.weight", MK_MATRIX, E, Q + 2 * KV},
            {"attn_output.weight", MK_MATRIX, Q, E},   {"ffn_norm.weight", MK_NORM, E, 1},
            {"ffn_up.weight", MK_MATRIX, E, 2 * F},    {"ffn_down.weight", MK_MATRIX, F, E},
        };
        bool biases = !strcmp(o.arch, "qwen2"), phi3 = !strcmp(o.arch, "phi3");
        const mk_tdef *td = phi3 ? fused : t;
        size_t nt = phi3 ? sizeof fused / sizeof fused[0] : sizeof t / sizeof t[0];
        for (size_t i = 0; i < nt && !rc; i++) {
            if (td[i].kind == MK_BIAS && !biases) continue;
            snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, td[i].suffix);
            rc = add_tensor(w, &o, name, td[i].kind, td[i].ne0, td[i].ne1, &total);
        }
    }
    if (!rc) rc = add_tensor(w, &o, "output_norm.weight", MK_NORM, E, 1, &total);
    if (!rc && !o.tied) rc = add_tensor(w, &o, "output.weight", MK_EMBED, E, n_vocab, &total);
    if (!rc && o.rope_factors) rc = add_rope_factors(w, o.head_dim / 2, &total);
    if (!rc) {
        char err[512];
        rc = eng_gguf_write(w, o.out, err, sizeof err);
        if (rc) fprintf(stderr, "kvserve mkmodel: %s\n", err);
    }
    eng_gguf_writer_free(w);
    if (rc) return 1;
    static const char *const tnames[] = {[ENG_Q_F32] = "f32", [ENG_Q_F16] = "f16", [ENG_Q_Q8_0] = "q8_0"};
    printf("wrote %s: %s, embd %lld, %lld blocks, %lld/%lld heads (dim %lld), ff %lld, vocab %lld, %s%s, "
           "%.1f MiB of weights\n", o.out, o.arch, (long long)E, (long long)o.n_layer, (long long)o.n_head,
           (long long)o.n_head_kv, (long long)o.head_dim, (long long)F, (long long)n_vocab, tnames[o.wtype],
           o.tied ? ", tied" : "", (double)total / (1024.0 * 1024.0));
    return 0;
}
