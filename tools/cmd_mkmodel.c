/*
 * cmd_mkmodel.c: `kvserve mkmodel` writes a llama/qwen2/qwen3/qwen3moe/gpt-oss/phi3 GGUF with deterministic random
 * weights (gpt-oss's own parts: mkmodel_oss.c).
 *
 * The weights are a pure function of (--seed, tensor name, shape, --std): each tensor has its own PRNG stream
 * (splitmix64 seeded by the seed and an FNV-1a hash of the name), and normal values are made with integer
 * arithmetic and one correctly rounded multiplication (an Irwin-Hall sum of eight 16-bit uniforms, scaled to
 * unit variance) instead of libm's log/sin/cos, whose last bits may differ between C libraries. So the file
 * is byte-identical across runs and machines. Quantization uses the engine's own eng_quantize_row. The file is
 * streamed: the header first, then each tensor generated and written in turn, so a model larger than memory can be
 * made (only one tensor is held at a time).
 *
 * The tokenizer block is copied from another GGUF (--vocab-from: every tokenizer.* key) or built in: a small
 * SentencePiece-style ("llama") vocabulary with byte fallback, ChatML special tokens and a ChatML template. The
 * encoders (bert, nomic-bert) are written by mkmodel_encoder.c with a built-in WordPiece or unigram vocabulary.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "engine/kernels/quant.h"
#include "tools/cli.h"
#include "tools/commands.h"

#include "tools/mkmodel.h"

/* The starting shapes of --preset (one row each; the options change them afterwards). */
typedef struct mk_preset {
    const char *name;
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx;
    double rope_base;
    uint32_t wtype;
    bool tied;
    const char *arch;       /* NULL: llama */
    int64_t head_dim, n_expert, n_expert_used, n_ff_exp; /* 0: the defaults */
    double rms_eps;         /* 0: the arch default */
} mk_preset;

static const mk_preset mk_presets[] = {
    /* untied: with tied random embeddings a model mostly repeats its last input token, which reads as a bug to
     * someone trying `make run`; a separate random output layer gives varied (random) text */
    {"default", 256, 4, 8, 4, 768, 2048, 10000.0, ENG_Q_Q8_0, false, NULL, 0, 0, 0, 0, 0},
    {"tiny", 64, 2, 4, 2, 128, 512, 10000.0, ENG_Q_F32, false, NULL, 0, 0, 0, 0, 0},
    {"bench-135m", 576, 30, 9, 3, 1536, 4096, 10000.0, ENG_Q_Q8_0, true, NULL, 0, 0, 0, 0, 0},    /* SmolLM2-135M */
    {"llama-1b", 2048, 16, 32, 8, 8192, 8192, 500000.0, ENG_Q_Q8_0, true, NULL, 0, 0, 0, 0, 0},
    {"bench-1b", 2048, 16, 32, 8, 8192, 131072, 500000.0, ENG_Q_F16, true, NULL, 0, 0, 0, 0, 0},  /* Llama-3.2-1B */
    {"bench-8b", 4096, 32, 32, 8, 14336, 131072, 500000.0, ENG_Q_F16, false, NULL, 0, 0, 0, 0, 0}, /* Llama-3.1-8B */
    /* Qwen3-30B-A3B's layer shape on 16 of its 48 layers */
    {"bench-moe", 2048, 16, 32, 4, 6144, 40960, 1000000.0, ENG_Q_F16, false, "qwen3moe", 128, 128, 8, 768, 1e-6},
    {"tiny-moe", 64, 2, 4, 2, 128, 512, 10000.0, ENG_Q_F32, false, "qwen3moe", 0, 8, 2, 64, 0},
    {"tiny-oss", 64, 2, 4, 2, 128, 512, 10000.0, ENG_Q_F32, false, "gpt-oss", 0, 8, 2, 64, 0},
};
enum { MK_N_PRESETS = sizeof mk_presets / sizeof mk_presets[0] };

static int apply_preset(mk_opts *o, const char *name) {
    for (size_t i = 0; i < MK_N_PRESETS; i++) {
        const mk_preset *p = &mk_presets[i];
        if (strcmp(name, p->name)) continue;
        snprintf(o->arch, sizeof o->arch, "%s", p->arch ? p->arch : "llama");
        o->preset = p->name;
        o->n_embd = p->n_embd; o->n_layer = p->n_layer; o->n_head = p->n_head; o->n_head_kv = p->n_head_kv;
        o->n_ff = p->n_ff; o->n_ctx = p->n_ctx; o->rope_base = p->rope_base; o->wtype = p->wtype; o->tied = p->tied;
        o->head_dim = p->head_dim; o->rms_eps = p->rms_eps > 0 ? p->rms_eps : -1; o->seed = 42; o->std = 0.05;
        o->embd_std = 0.5; o->router_std = -1;
        o->n_expert = p->n_expert ? p->n_expert : 8; o->n_expert_used = p->n_expert_used ? p->n_expert_used : 2;
        o->n_ff_exp = p->n_ff_exp;
        return 0;
    }
    return -1;
}

static bool set_rope_scaling(void *field, const char *v) {
    if (strcmp(v, "none") && strcmp(v, "linear") && strcmp(v, "yarn")) return false;
    snprintf(field, 8, "%s", v);
    return true;
}

static bool set_arch(void *field, const char *v) {
    if (strcmp(v, "llama") && strcmp(v, "qwen2") && strcmp(v, "qwen3") && strcmp(v, "qwen3moe") && strcmp(v, "phi3") &&
        strcmp(v, "gpt-oss") && strcmp(v, "bert") && strcmp(v, "nomic-bert") && strcmp(v, "jina-bert-v2"))
        return false;
    snprintf(field, sizeof ((mk_opts *)0)->arch, "%s", v);
    return true;
}

static bool set_type(void *field, const char *v) {
    uint32_t *t = field;
    if (!strcmp(v, "f32")) *t = ENG_Q_F32;
    else if (!strcmp(v, "f16")) *t = ENG_Q_F16;
    else if (!strcmp(v, "q8_0")) *t = ENG_Q_Q8_0;
    else return false;
    return true;
}

static bool set_seed(void *field, const char *v) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || end == v || *end || v[0] == '-') return false;
    *(uint64_t *)field = x;
    return true;
}

#define O(f) offsetof(mk_opts, f)
#define MK_BIG (1 << 20)
static const kvs_opt mk_opts_table[] = {
    {"--output", "-o", KVS_OPT_STR, O(out), .arg = "FILE", .help = "output path (required); written atomically"},
    {"--preset", NULL, KVS_OPT_STR, O(preset), .arg = "NAME",
     .help = "starting shape, changed by the options below (default: default):\n"
             "  default     llama, embd 256, 4 blocks, 8 heads, 4 kv heads, ff 768, ctx 2048,\n"
             "              untied, q8_0, built-in vocabulary (the model of `make run`)\n"
             "  tiny        llama, embd 64, 2 blocks, 4 heads, 2 kv heads, ff 128, ctx 512,\n"
             "              separate output.weight, f32 (fast tests)\n"
             "  bench-135m  llama, embd 576, 30 blocks, 9 heads, 3 kv heads, ff 1536,\n"
             "              ctx 4096, tied, q8_0 (pass --vocab-from a gpt-2 vocabulary)\n"
             "  llama-1b    llama, embd 2048, 16 blocks, 32 heads, 8 kv heads, ff 8192,\n"
             "              ctx 8192, rope base 500000, tied, q8_0\n"
             "  bench-1b    the Llama-3.2-1B shape: llama-1b with ctx 131072, f16 (pass\n"
             "              --vocab-from a llama 3 vocabulary; `kvserve quantize` makes the\n"
             "              Q4_K_M/Q5_K_M/Q6_K/Q8_0 bench models from it)\n"
             "  bench-8b    the Llama-3.1-8B shape: llama, embd 4096, 32 blocks, 32 heads,\n"
             "              8 kv heads, ff 14336, ctx 131072, rope base 500000, untied, f16\n"
             "              (pass --vocab-from a llama 3 vocabulary: about 16 GB, streamed\n"
             "              to disk; --dry-run shows the header)\n"
             "  bench-moe   Qwen3-30B-A3B's layer shape on 16 of its 48 layers: qwen3moe,\n"
             "              embd 2048, 16 blocks, 32 heads of 128, 4 kv heads, 128 experts,\n"
             "              8 used, expert ff 768, ctx 40960, rope base 1e6, untied, f16\n"
             "              (pass --vocab-from a qwen2 vocabulary: about 19 GB, streamed)\n"
             "  tiny-moe    qwen3moe, embd 64, 2 blocks, 4 heads, 2 kv heads, 8 experts,\n"
             "              2 used, expert ff 64, f32 (fast tests)\n"
             "  tiny-oss    gpt-oss, the same shape (one sliding and one global block)"},
    {"--arch", NULL, KVS_OPT_SET, O(arch), .set = set_arch,
     .expect = "llama, qwen2, qwen3, qwen3moe, gpt-oss, phi3, bert, nomic-bert or jina-bert-v2", .arg = "A",
     .help = "llama|qwen2|qwen3|qwen3moe|gpt-oss|phi3|bert|nomic-bert|jina-bert-v2\n"
             "(qwen2 adds Q/K/V biases and uses rms eps 1e-6 by default; qwen3 adds\n"
             "per-head Q/K norms;\n"
             "qwen3moe too, with a router and stacked experts in place of the\n"
             "feed-forward; gpt-oss has Q/K/V/O biases, attention sinks, biased router\n"
             "and experts, every other block sliding (--swa), always untied, and its\n"
             "built-in vocabulary has harmony's tokens and chat template; phi3\n"
             "fuses Q/K/V into attn_qkv and gate|up into ffn_up, and rotates halves;\n"
             "bert and nomic-bert are encoders with a built-in WordPiece vocabulary: bert\n"
             "with absolute positions, biases and GELU, nomic-bert with rotary positions\n"
             "(--rope-base), a fused attn_qkv and SwiGLU; jina-bert-v2 with ALiBi and a\n"
             "GEGLU feed-forward; all post-norm with LayerNorm, kv heads = heads)"},
    {"--rerank", NULL, KVS_OPT_FLAG, O(rerank), .flag_value = true,
     .help = "(encoders) add a classification head (cls, cls.output: one score;\n"
             "jina-bert-v2: cls [embd, 1] alone, as jina-reranker-v1) and write\n"
             "pooling type rank: a reranker; (qwen3) a\n"
             "Qwen3-Reranker: cls.output from the output rows of \"yes\" and \"no\",\n"
             "pooling type rank and the rerank prompt (needs a vocabulary with\n"
             "those tokens: --vocab-from a qwen2 vocabulary)"},
    {"--pooling", NULL, KVS_OPT_SET, O(pooling), .set = kvs_mk_set_pooling, .expect = "mean, cls or last",
     .arg = "P", .help = "(encoders) <arch>.pooling_type: mean (default), cls or last"},
    {"--vocab", NULL, KVS_OPT_SET, O(ugm), .set = kvs_mk_set_vocab, .expect = "wpm or ugm", .arg = "V",
     .help = "(encoders) the built-in vocabulary: wpm (BERT WordPiece, default)\n"
             "or ugm (an XLM-RoBERTa-style SentencePiece unigram vocabulary with a\n"
             "small precompiled charsmap, tokenizer model t5)"},
    {"--experts", NULL, KVS_OPT_I64, O(n_expert), 1, 512, .arg = "N",
     .help = "(qwen3moe, gpt-oss) experts per layer (default 8)"},
    {"--experts-used", NULL, KVS_OPT_I64, O(n_expert_used), 1, 512, .arg = "N",
     .help = "(qwen3moe, gpt-oss) experts per token (default 2; at most --experts)"},
    {"--expert-ff", NULL, KVS_OPT_I64, O(n_ff_exp), 1, MK_BIG, .arg = "N",
     .help = "(qwen3moe, gpt-oss) an expert's feed-forward length (default ff /\n"
             "experts-used)"},
    {"--swa", NULL, KVS_OPT_I64, O(n_swa), 1, INT32_MAX, .arg = "N",
     .help = "(gpt-oss) attention.sliding_window: the sliding blocks (0, 2, 4...)\n"
             "see the last N positions (default 128, as gpt-oss)"},
    {"--embd", NULL, KVS_OPT_I64, O(n_embd), 1, MK_BIG, .arg = "N", .help = "embedding length"},
    {"--layers", NULL, KVS_OPT_I64, O(n_layer), 1, 4096, .arg = "N", .help = "number of blocks"},
    {"--heads", NULL, KVS_OPT_I64, O(n_head), 1, 4096, .arg = "N", .help = "attention heads"},
    {"--kv-heads", NULL, KVS_OPT_I64, O(n_head_kv), 1, 4096, .arg = "N", .help = "key/value heads (must divide --heads)"},
    {"--ff", NULL, KVS_OPT_I64, O(n_ff), 1, MK_BIG, .arg = "N", .help = "feed-forward length"},
    {"--ctx", NULL, KVS_OPT_I64, O(n_ctx), 1, INT32_MAX, .arg = "N",
     .help = "training context length written to the metadata"},
    {"--head-dim", NULL, KVS_OPT_I64, O(head_dim), 2, 4096, .arg = "N",
     .help = "per-head dimension (default embd / heads; even)"},
    {"--rope-base", NULL, KVS_OPT_DOUBLE, O(rope_base), 1.0, 1e12, .arg = "F",
     .help = "rope frequency base (default 10000)"},
    {"--rms-eps", NULL, KVS_OPT_DOUBLE, O(rms_eps), 1e-12, 1.0, .arg = "F", .help = "RMS norm epsilon"},
    {"--type", NULL, KVS_OPT_SET, O(wtype), .set = set_type, .expect = "f32, f16 or q8_0", .arg = "T",
     .help = "f32|f16|q8_0: type of the matrices and embeddings (norms and biases\n"
             "are always f32); q8_0 needs embd, heads*head-dim and ff to be\n"
             "multiples of 32"},
    {"--tied", NULL, KVS_OPT_FLAG, O(tied), .flag_value = true, .help = "no separate output.weight"},
    {"--untied", NULL, KVS_OPT_FLAG, O(tied), .flag_value = false, .help = "a separate output.weight"},
    {"--fim", NULL, KVS_OPT_FLAG, O(fim), .flag_value = true,
     .help = "(built-in vocabulary) add the fill-in-the-middle control tokens\n"
             "<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|> at the end and name them\n"
             "in tokenizer.ggml.fim_pre/suf/mid_token_id"},
    {"--vocab-from", NULL, KVS_OPT_STR, O(vocab_from), .arg = "FILE",
     .help = "copy every tokenizer.* key from this GGUF (e.g. a vocab-only file); the\n"
             "vocabulary size follows it. Default: a built-in 'llama' (SPM) vocabulary"},
    {"--rope-factors", NULL, KVS_OPT_FLAG, O(rope_factors), .flag_value = true,
     .help = "(phi3) add LongRoPE's rope_factors_short.weight (1 + 0.25 t) and\n"
             "rope_factors_long.weight (1 + 15 t^2), t = i / (head-dim / 2 - 1)"},
    {"--orig-ctx", NULL, KVS_OPT_I64, O(orig_ctx), 1, INT32_MAX, .arg = "N",
     .help = "rope.scaling.original_context_length: contexts longer than N use the\n"
             "long factors, others the short ones"},
    {"--rope-attn-factor", NULL, KVS_OPT_DOUBLE, O(rope_attn), 1e-3, 1e3, .arg = "F",
     .help = "rope.scaling.attn_factor; default with --rope-factors and ctx > orig-ctx:\n"
             "sqrt(1 + ln(ctx / orig-ctx) / ln(orig-ctx)), as llama.cpp's converter writes"},
    {"--rope-scaling", NULL, KVS_OPT_SET, O(rope_scaling), .set = set_rope_scaling,
     .expect = "none, linear or yarn", .arg = "TYPE", .help = "rope.scaling.type (yarn: YaRN over --orig-ctx)"},
    {"--rope-scale", NULL, KVS_OPT_DOUBLE, O(rope_scale), 1e-3, 1e3, .arg = "F",
     .help = "rope.scaling.factor (the context extension factor)"},
    {"--biases", NULL, KVS_OPT_FLAG, O(out_bias), .flag_value = true,
     .help = "(llama) add Q/K/V biases and attn_output.bias"},
    {"--seed", NULL, KVS_OPT_SET, O(seed), .set = set_seed, .expect = "a non-negative integer", .arg = "N",
     .help = "random seed (default 42)"},
    {"--std", NULL, KVS_OPT_DOUBLE, O(std), 0.0, 100.0, .arg = "F",
     .help = "standard deviation of matrices (default 0.05)"},
    {"--router-std", NULL, KVS_OPT_DOUBLE, O(router_std), 0.0, 100.0, .arg = "F",
     .help = "(qwen3moe) standard deviation of the routers (default: --std); larger\n"
             "values separate the experts' scores, so that no token's choice of\n"
             "experts hangs on a near-tie (reference models)"},
    {"--embd-std", NULL, KVS_OPT_DOUBLE, O(embd_std), 0.0, 100.0, .arg = "F",
     .help = "standard deviation of token_embd/output (default 0.5)"},
    {"--dry-run", NULL, KVS_OPT_FLAG, O(dry_run), .flag_value = true,
     .help = "write nothing: print the header the options give (every metadata key\n"
             "with its value, arrays by their length), the tensor count and the\n"
             "weight bytes (-o is then optional)"},
};
#undef O
static const kvs_cli mk_cli = {
    "mkmodel", "-o OUT.gguf [OPTIONS]",
    "Writes a llama/qwen2/qwen3/qwen3moe/gpt-oss/phi3 GGUF model with deterministic random weights (same options, same\n"
    "bytes on every machine). Useful for tests, benchmarks and the embedded default model; its output is\n"
    "gibberish.\n",
    NULL, mk_opts_table, sizeof mk_opts_table / sizeof mk_opts_table[0], 0,
};

/* The checks and derived values after parsing: 0, or 2 after a message. */
static int check_opts(mk_opts *o) {
    if (!o->out && !o->dry_run) return kvs_cli_fail(&mk_cli, "-o OUT is required (see --help)");
    const bool moe = !strcmp(o->arch, "qwen3moe") || kvs_mk_is_oss(o);
    if (o->n_swa && !kvs_mk_is_oss(o)) return kvs_cli_fail(&mk_cli, "--swa needs --arch gpt-oss");
    if (kvs_mk_is_oss(o) && o->n_swa == 0) o->n_swa = 128;
    if (kvs_mk_is_oss(o) && o->tied) return kvs_cli_fail(&mk_cli, "gpt-oss has a separate output.weight: no --tied");
    if (o->rms_eps < 0) o->rms_eps = !strncmp(o->arch, "qwen", 4) ? 1e-6 : kvs_mk_is_encoder(o) ? 1e-12 : 1e-5;
    if (kvs_mk_is_encoder(o)) o->n_head_kv = o->n_head; /* encoders: one K/V head per query head */
    if ((o->pooling || o->ugm) && !kvs_mk_is_encoder(o))
        return kvs_cli_fail(&mk_cli, "--pooling and --vocab need --arch bert, nomic-bert or jina-bert-v2");
    if (o->rerank && !kvs_mk_is_encoder(o) && !kvs_mk_is_decoder_reranker(o))
        return kvs_cli_fail(&mk_cli, "--rerank needs --arch bert, nomic-bert, jina-bert-v2 or qwen3");
    if (moe && o->n_ff_exp == 0) o->n_ff_exp = o->n_ff / o->n_expert_used > 0 ? o->n_ff / o->n_expert_used : 1;
    if (moe && o->n_expert_used > o->n_expert)
        return kvs_cli_fail(&mk_cli, "--experts-used %lld must be at most --experts %lld", (long long)o->n_expert_used,
                            (long long)o->n_expert);
    if (o->head_dim == 0) {
        if (o->n_embd % o->n_head)
            return kvs_cli_fail(&mk_cli, "embd %lld is not divisible by heads %lld; give --head-dim",
                                (long long)o->n_embd, (long long)o->n_head);
        o->head_dim = o->n_embd / o->n_head;
    }
    if (o->rope_factors && strcmp(o->arch, "phi3")) return kvs_cli_fail(&mk_cli, "--rope-factors needs --arch phi3");
    if (o->out_bias && strcmp(o->arch, "llama")) return kvs_cli_fail(&mk_cli, "--biases needs --arch llama");
    if (o->rope_factors && o->orig_ctx > 0 && o->n_ctx > o->orig_ctx && o->rope_attn == 0) {
        double scale = (double)o->n_ctx / (double)o->orig_ctx; /* LongRoPE's attention factor */
        o->rope_attn = sqrt(1.0 + log(scale) / log((double)o->orig_ctx));
    }
    if (o->head_dim % 2)
        return kvs_cli_fail(&mk_cli, "head dim %lld must be even (rope rotates pairs)", (long long)o->head_dim);
    if (o->n_head % o->n_head_kv)
        return kvs_cli_fail(&mk_cli, "kv-heads %lld must divide heads %lld", (long long)o->n_head_kv,
                            (long long)o->n_head);
    if (o->n_head * o->head_dim > MK_BIG) return kvs_cli_fail(&mk_cli, "heads * head-dim is too large");
    if (o->wtype == ENG_Q_Q8_0) {
        const struct { const char *what; int64_t v; } rows[] = {
            {"embd", o->n_embd}, {"heads * head-dim", o->n_head * o->head_dim}, {moe ? "expert ff" : "ff",
            moe ? o->n_ff_exp : o->n_ff}};
        for (int i = 0; i < 3; i++)
            if (rows[i].v % 32)
                return kvs_cli_fail(&mk_cli, "--type q8_0 needs %s (%lld) to be a multiple of 32", rows[i].what,
                                    (long long)rows[i].v);
    }
    return 0;
}

/* Returns 0 to go on, 1 after --help, 2 on a usage error. The preset is the starting point of the other
 * options, wherever --preset stands: a first pass finds it (and every usage error), the second applies the
 * options over it. */
static int parse_args(int argc, char **argv, mk_opts *o) {
    mk_opts first;
    memset(&first, 0, sizeof first);
    first.preset = "default";
    int prc = kvs_cli_parse(&mk_cli, &first, argc, argv, NULL, NULL);
    if (prc) return prc;
    if (apply_preset(o, first.preset) != 0) {
        char names[256];
        size_t len = 0;
        for (size_t i = 0; i < MK_N_PRESETS && len < sizeof names; i++)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "", mk_presets[i].name);
        return kvs_cli_fail(&mk_cli, "unknown preset '%s' (%s)", first.preset, names);
    }
    if (kvs_cli_parse(&mk_cli, o, argc, argv, NULL, NULL) != 0) return 2; /* the same arguments: cannot fail */
    return check_opts(o);
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
static const char *const mk_words[] = {
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

const char *const *kvs_mk_words(size_t *n) {
    *n = sizeof mk_words / sizeof mk_words[0];
    return mk_words;
}
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

/* ids: the n specials (0 <unk>, 1 BOS, 2 EOS, then control tokens: <|im_start|>, <|im_end|> for ChatML), then 256
 * byte tokens, then characters and words. Every word comes with all of its "\u2581"-prefixed prefixes, and there
 * are no other multi-character pieces, so SPM merging grows each word left to right and known words become one
 * token. */
static int vocab_builtin(mk_vocab *v, const char *const *specials, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (vocab_add(v, specials[i], strlen(specials[i]), i == 0 ? 2 : 3, 0.0f)) return -1;
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
    for (size_t w = 0; w < sizeof mk_words / sizeof mk_words[0]; w++) {
        char piece[64];
        size_t wl = strlen(mk_words[w]);
        if (wl + 4 > sizeof piece) return -1;
        memcpy(piece, SPM_SPACE, 3);
        memcpy(piece + 3, mk_words[w], wl);
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

static int add_builtin_vocab(eng_gguf_writer *w, const mk_opts *o, int64_t *n_vocab) {
    static const char *const fim_tok[3] = {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"};
    static const char *const chatml[] = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"};
    const bool fim = o->fim, oss = kvs_mk_is_oss(o);
    size_t n_sp = 5;
    const char *const *sp = oss ? kvs_mk_oss_specials(&n_sp) : chatml;
    const char *tmpl = oss ? kvs_mk_oss_template() : k_chatml_template;
    mk_vocab v = {0};
    int rc = vocab_builtin(&v, sp, n_sp) ? ENG_ERR_NOMEM : 0;
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
        if (!rc && !oss) rc = eng_gguf_add_u32(w, "tokenizer.ggml.eot_token_id", 4); /* harmony: <|end|> goes on */
        if (!rc) rc = eng_gguf_add_bool(w, "tokenizer.ggml.add_bos_token", true);
        if (!rc) rc = eng_gguf_add_bool(w, "tokenizer.ggml.add_eos_token", false);
        if (!rc && fim) rc = eng_gguf_add_u32(w, "tokenizer.ggml.fim_pre_token_id", (uint32_t)fim0);
        if (!rc && fim) rc = eng_gguf_add_u32(w, "tokenizer.ggml.fim_suf_token_id", (uint32_t)fim0 + 1);
        if (!rc && fim) rc = eng_gguf_add_u32(w, "tokenizer.ggml.fim_mid_token_id", (uint32_t)fim0 + 2);
        if (!rc) rc = eng_gguf_add_str(w, "tokenizer.chat_template", tmpl, strlen(tmpl));
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

static uint32_t tensor_type(const mk_opts *o, int kind) {
    return (kind == MK_MATRIX || kind == MK_EMBED) ? o->wtype : ENG_Q_F32; /* norms, biases, routers: f32 */
}

/* Generates tensor `name` of [ne0, ne1, ne2] and writes its bytes (padded) to f. */
static int write_tensor(FILE *f, uint32_t align, const mk_opts *o, const char *name, int kind, int64_t ne0,
                        int64_t rows) {
    uint32_t type = tensor_type(o, kind);
    int64_t n = ne0 * rows;
    size_t row_bytes = eng_qtype_row_bytes(type, ne0), nbytes = row_bytes * (size_t)rows;
    float *vals = malloc((size_t)n * sizeof *vals);
    uint8_t *data = row_bytes ? malloc(nbytes) : NULL;
    if (!vals || !data) {
        free(vals);
        free(data);
        fprintf(stderr, "kvserve mkmodel: out of memory for %s (%zu bytes)\n", name, nbytes);
        return ENG_ERR_NOMEM;
    }
    mk_rng r = mk_rng_for(o->seed, name);
    double std = kind == MK_EMBED || kind == MK_EMBED_F32 ? o->embd_std : kind == MK_NORM ? 0.02
                 : kind == MK_ROUTER && o->router_std >= 0 ? o->router_std : o->std;
    double mean = kind == MK_NORM ? 1.0 : 0.0;
    for (int64_t i = 0; i < n; i++) {
        double z = mk_normal(&r);
        double x = z * std;
        vals[i] = (float)(mean + x);
    }
    int rc = 0;
    for (int64_t row = 0; row < rows && !rc; row++)
        rc = eng_quantize_row(type, vals + row * ne0, data + (size_t)row * row_bytes, ne0);
    static const uint8_t zeros[256];
    size_t pad = (align - nbytes % align) % align;
    if (!rc && (fwrite(data, 1, nbytes, f) != nbytes || fwrite(zeros, 1, pad, f) != pad)) rc = ENG_ERR_IO;
    if (rc) fprintf(stderr, "kvserve mkmodel: cannot make tensor %s: %s\n", name, kvs_strerror(rc));
    free(vals);
    free(data);
    return rc;
}

int kvs_mk_tensor_one(const mk_sink *sk, const mk_opts *o, const char *name, int kind, int64_t ne0, int64_t ne1,
                      int64_t ne2, size_t *total, int *count) {
    (*count)++;
    uint32_t type = tensor_type(o, kind);
    *total += eng_qtype_row_bytes(type, ne0) * (size_t)ne1 * (size_t)ne2;
    if (sk->f) return write_tensor(sk->f, sk->align, o, name, kind, ne0, ne1 * ne2);
    if (!sk->w) return 0;
    const int64_t ne[3] = {ne0, ne1, ne2};
    int rc = eng_gguf_add_tensor_info(sk->w, name, type, ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1, ne);
    if (rc) fprintf(stderr, "kvserve mkmodel: cannot add tensor %s: %s\n", name, kvs_strerror(rc));
    return rc;
}

int kvs_mk_tensor_rows(const mk_sink *sk, const mk_opts *o, const char *name, const char *src, int kind, int64_t ne0,
                       const int32_t *rows, int n_rows, size_t *total, int *count) {
    uint32_t type = tensor_type(o, kind);
    size_t row_bytes = eng_qtype_row_bytes(type, ne0), nbytes = row_bytes * (size_t)n_rows;
    (*count)++;
    *total += nbytes;
    if (!sk->f) {
        const int64_t ne[2] = {ne0, n_rows};
        int rc = sk->w ? eng_gguf_add_tensor_info(sk->w, name, type, 2, ne) : 0;
        if (rc) fprintf(stderr, "kvserve mkmodel: cannot add tensor %s: %s\n", name, kvs_strerror(rc));
        return rc;
    }
    int32_t last = 0;
    for (int i = 0; i < n_rows; i++) last = rows[i] > last ? rows[i] : last;
    float *vals = malloc((size_t)ne0 * sizeof *vals);
    uint8_t *data = malloc(nbytes);
    int rc = vals && data ? 0 : ENG_ERR_NOMEM;
    /* the source's values in its order (write_tensor's), rows 0 .. last; the wanted rows quantized as it does */
    mk_rng r = mk_rng_for(o->seed, src);
    double std = kind == MK_EMBED || kind == MK_EMBED_F32 ? o->embd_std : o->std;
    for (int32_t row = 0; row <= last && !rc; row++) {
        for (int64_t i = 0; i < ne0; i++) vals[i] = (float)(0.0 + mk_normal(&r) * std);
        for (int i = 0; i < n_rows && !rc; i++)
            if (rows[i] == row) rc = eng_quantize_row(type, vals, data + (size_t)i * row_bytes, ne0);
    }
    static const uint8_t zeros[256];
    size_t pad = (sk->align - nbytes % sk->align) % sk->align;
    if (!rc && (fwrite(data, 1, nbytes, sk->f) != nbytes || fwrite(zeros, 1, pad, sk->f) != pad)) rc = ENG_ERR_IO;
    if (rc) fprintf(stderr, "kvserve mkmodel: cannot make tensor %s: %s\n", name, kvs_strerror(rc));
    free(vals);
    free(data);
    return rc;
}

/* LongRoPE's per-frequency divisors (rope_factors_short/long.weight, [half] f32, all >= 1): growing from the fast
 * rotations (i = 0, factor 1) to the slow ones, much more for the long set, as in Phi-3.5's files. Only basic
 * arithmetic, so the values are the same on every machine. */
static int add_rope_factors(const mk_sink *sk, int64_t half, size_t *total_bytes) {
    float *f = malloc((size_t)half * sizeof *f);
    if (!f) return ENG_ERR_NOMEM;
    int rc = 0;
    for (int set = 0; set < 2 && !rc; set++) {
        for (int64_t i = 0; i < half; i++) {
            double t = half > 1 ? (double)i / (double)(half - 1) : 0.0;
            f[i] = (float)(set == 0 ? 1.0 + 0.25 * t : 1.0 + 15.0 * t * t);
        }
        const int64_t ne[1] = {half};
        size_t nb = (size_t)half * sizeof *f, pad = (sk->align - nb % sk->align) % sk->align;
        static const uint8_t zeros[256];
        if (sk->f) rc = fwrite(f, 1, nb, sk->f) != nb || fwrite(zeros, 1, pad, sk->f) != pad ? ENG_ERR_IO : 0;
        else if (sk->w)
            rc = eng_gguf_add_tensor_info(sk->w, set == 0 ? "rope_factors_short.weight" : "rope_factors_long.weight",
                                          ENG_Q_F32, 1, ne);
        *total_bytes += nb;
    }
    if (rc) fprintf(stderr, "kvserve mkmodel: cannot add the rope factors: %s\n", kvs_strerror(rc));
    free(f);
    return rc;
}

int kvs_mk_common_metadata(eng_gguf_writer *w, const mk_opts *o, int64_t n_vocab, const char *name) {
    char key[96];
    const char *a = o->arch;
    int rc = eng_gguf_add_str(w, "general.architecture", a, strlen(a));
    if (!rc) rc = eng_gguf_add_str(w, "general.name", name, strlen(name));
    uint32_t ftype = o->wtype == ENG_Q_F32 ? 0 : o->wtype == ENG_Q_F16 ? 1 : 7;  /* llama.cpp's file types */
    if (!rc) rc = eng_gguf_add_u32(w, "general.file_type", ftype);
    if (!rc && o->wtype == ENG_Q_Q8_0) rc = eng_gguf_add_u32(w, "general.quantization_version", 2);
#define U32(k, v) do { if (!rc) { snprintf(key, sizeof key, "%s." k, a); rc = eng_gguf_add_u32(w, key, (uint32_t)(v)); } } while (0)
    U32("vocab_size", n_vocab);
    U32("context_length", o->n_ctx);
    U32("embedding_length", o->n_embd);
    U32("block_count", o->n_layer);
    U32("feed_forward_length", o->n_ff);
    U32("attention.head_count", o->n_head);
#undef U32
    return rc;
}

static int add_metadata(eng_gguf_writer *w, const mk_opts *o, int64_t n_vocab) {
    char key[96], name[96];
    const char *a = o->arch;
    snprintf(name, sizeof name, "kvserve-mkmodel-%s", o->preset);
    int rc = kvs_mk_common_metadata(w, o, n_vocab, name);
#define U32(k, v) do { if (!rc) { snprintf(key, sizeof key, "%s." k, a); rc = eng_gguf_add_u32(w, key, (uint32_t)(v)); } } while (0)
#define F32(k, v) do { if (!rc) { snprintf(key, sizeof key, "%s." k, a); rc = eng_gguf_add_f32(w, key, (float)(v)); } } while (0)
    U32("attention.head_count_kv", o->n_head_kv);
    F32("attention.layer_norm_rms_epsilon", o->rms_eps);
    F32("rope.freq_base", o->rope_base);
    U32("rope.dimension_count", o->head_dim);
    if (!strcmp(a, "qwen3moe")) {
        U32("expert_count", o->n_expert);
        U32("expert_used_count", o->n_expert_used);
        U32("expert_feed_forward_length", o->n_ff_exp);
    }
    if (!rc && kvs_mk_is_oss(o)) rc = kvs_mk_oss_metadata(w, o);
    if (o->orig_ctx > 0) U32("rope.scaling.original_context_length", o->orig_ctx);
    if (o->rope_attn > 0) F32("rope.scaling.attn_factor", o->rope_attn);
    if (o->rope_scale > 0) F32("rope.scaling.factor", o->rope_scale);
    if (!rc && o->rope_scaling[0]) {
        snprintf(key, sizeof key, "%s.rope.scaling.type", a);
        rc = eng_gguf_add_str(w, key, o->rope_scaling, strlen(o->rope_scaling));
    }
    if (o->head_dim * o->n_head != o->n_embd) {
        U32("attention.key_length", o->head_dim);
        U32("attention.value_length", o->head_dim);
    }
#undef U32
#undef F32
    return rc;
}

/* The metadata and the tokenizer block into w; *n_vocab gets the vocabulary size. 0, or an error (printed). */
static int build_metadata(eng_gguf_writer *w, mk_opts *o, int64_t *n_vocab) {
    int rc = 0;
    /* Metadata first needs n_vocab: build the tokenizer block into a scratch writer, then copy it after. */
    eng_gguf_writer *tw;
    if (eng_gguf_writer_create(&tw)) rc = ENG_ERR_NOMEM;
    if (o->fim && o->vocab_from) {
        fprintf(stderr, "kvserve mkmodel: --fim adds tokens to the built-in vocabulary; it cannot be combined with "
                "--vocab-from\n");
        rc = ENG_ERR_INVALID;
    }
    if (!rc) rc = o->vocab_from ? add_vocab_from(tw, o->vocab_from, n_vocab)
                  : kvs_mk_is_encoder(o) ? kvs_mk_encoder_vocab(tw, o, n_vocab) : add_builtin_vocab(tw, o, n_vocab);
    if (!rc) rc = kvs_mk_is_encoder(o) ? kvs_mk_encoder_metadata(w, o, *n_vocab) : add_metadata(w, o, *n_vocab);
    if (!rc) {
        /* Copy the tokenizer block through a reader over the scratch writer's bytes. */
        void *mem = NULL;
        size_t size = 0;
        eng_gguf *g = NULL;
        char err[256];
        rc = eng_gguf_write_memory(tw, &mem, &size);
        if (!rc) rc = eng_gguf_open_memory(mem, size, "tokenizer block", &g, err, sizeof err);
        for (int64_t i = 0; !rc && i < eng_gguf_n_kv(g); i++) rc = eng_gguf_add_kv_from(w, eng_gguf_kv_at(g, i));
        if (!rc && kvs_mk_is_decoder_reranker(o) && !(rc = kvs_mk_rerank_tokens(g, o)))
            rc = kvs_mk_rerank_metadata(w, o);
        eng_gguf_close(g);
        free(mem);
    }
    eng_gguf_writer_free(tw);
    if (rc && rc != ENG_ERR_IO && rc != ENG_ERR_FORMAT && rc != ENG_ERR_UNSUPPORTED)
        fprintf(stderr, "kvserve mkmodel: cannot build the metadata: %s\n", kvs_strerror(rc));
    return rc;
}

/* Every tensor of the model, in file order, into the sink. *total gets their bytes, *count their number. 0, or an
 * error (printed). */
static int add_tensors(const mk_sink *sk, const mk_opts *o, int64_t n_vocab, size_t *total, int *count) {
    const int64_t E = o->n_embd, Q = o->n_head * o->head_dim, KV = o->n_head_kv * o->head_dim, F = o->n_ff;
    const int64_t HD = o->head_dim, X = o->n_expert, FX = o->n_ff_exp;
    const mk_tdef t[] = {
        {"attn_norm.weight", MK_NORM, E, 1, 1},   {"attn_q.weight", MK_MATRIX, E, Q, 1},
        {"attn_k.weight", MK_MATRIX, E, KV, 1},   {"attn_v.weight", MK_MATRIX, E, KV, 1},
        {"attn_q.bias", MK_BIAS, Q, 1, 1},        {"attn_k.bias", MK_BIAS, KV, 1, 1},
        {"attn_v.bias", MK_BIAS, KV, 1, 1},       {"attn_q_norm.weight", MK_NORM, HD, 1, 1},
        {"attn_k_norm.weight", MK_NORM, HD, 1, 1}, {"attn_output.weight", MK_MATRIX, Q, E, 1},
        {"attn_output.bias", MK_BIAS, E, 1, 1},
        {"ffn_norm.weight", MK_NORM, E, 1, 1},    {"ffn_gate.weight", MK_MATRIX, E, F, 1},
        {"ffn_up.weight", MK_MATRIX, E, F, 1},    {"ffn_down.weight", MK_MATRIX, F, E, 1},
        {"ffn_gate_inp.weight", MK_ROUTER, E, X, 1}, {"ffn_gate_exps.weight", MK_MATRIX, E, FX, X},
        {"ffn_up_exps.weight", MK_MATRIX, E, FX, X}, {"ffn_down_exps.weight", MK_MATRIX, FX, E, X},
    };
    /* phi3: Q, K, V rows fused in attn_qkv, gate then up rows fused in ffn_up */
    const mk_tdef fused[] = {
        {"attn_norm.weight", MK_NORM, E, 1, 1},       {"attn_qkv.weight", MK_MATRIX, E, Q + 2 * KV, 1},
        {"attn_output.weight", MK_MATRIX, Q, E, 1},   {"ffn_norm.weight", MK_NORM, E, 1, 1},
        {"ffn_up.weight", MK_MATRIX, E, 2 * F, 1},    {"ffn_down.weight", MK_MATRIX, F, E, 1},
    };
    const bool biases = !strcmp(o->arch, "qwen2") || o->out_bias, phi3 = !strcmp(o->arch, "phi3");
    const bool moe = !strcmp(o->arch, "qwen3moe"), qk_norm = moe || !strcmp(o->arch, "qwen3");
    const mk_tdef *td = phi3 ? fused : t;
    const size_t nt = phi3 ? sizeof fused / sizeof fused[0] : sizeof t / sizeof t[0];
    char name[96];
    *total = 0;
    *count = 0;
    if (kvs_mk_is_encoder(o)) return kvs_mk_encoder_tensors(sk, o, n_vocab, total, count);
    int rc = kvs_mk_tensor_one(sk, o, "token_embd.weight", MK_EMBED, E, n_vocab, 1, total, count);
    for (int64_t l = 0; kvs_mk_is_oss(o) && l < o->n_layer && !rc; l++) rc = kvs_mk_oss_layer(sk, o, l, total, count);
    for (int64_t l = 0; !kvs_mk_is_oss(o) && l < o->n_layer && !rc; l++) {
        for (size_t i = 0; i < nt && !rc; i++) {
            if (td[i].kind == MK_BIAS && !biases) continue;
            if (!strcmp(td[i].suffix, "attn_output.bias") && !o->out_bias) continue; /* qwen2 has none */
            const char *sx = td[i].suffix;
            if (!qk_norm && (!strcmp(sx, "attn_q_norm.weight") || !strcmp(sx, "attn_k_norm.weight"))) continue;
            bool expert = td[i].kind == MK_ROUTER || td[i].ne2 > 1;  /* router + experts, or the dense FFN */
            bool dense_ffn = !strcmp(sx, "ffn_gate.weight") || !strcmp(sx, "ffn_up.weight") ||
                             !strcmp(sx, "ffn_down.weight");
            if (moe ? dense_ffn : expert) continue;
            snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, td[i].suffix);
            rc = kvs_mk_tensor_one(sk, o, name, td[i].kind, td[i].ne0, td[i].ne1, td[i].ne2, total, count);
        }
    }
    if (!rc) rc = kvs_mk_tensor_one(sk, o, "output_norm.weight", MK_NORM, E, 1, 1, total, count);
    const bool rerank = kvs_mk_is_decoder_reranker(o); /* the conversion drops an untied output.weight */
    if (!rc && !o->tied && !rerank)
        rc = kvs_mk_tensor_one(sk, o, "output.weight", MK_EMBED, E, n_vocab, 1, total, count);
    if (!rc && rerank)
        rc = kvs_mk_tensor_rows(sk, o, "cls.output.weight", o->tied ? "token_embd.weight" : "output.weight", MK_EMBED,
                                E, o->rank_tok, 2, total, count);
    if (!rc && o->rope_factors) {
        *count += 2;
        rc = add_rope_factors(sk, o->head_dim / 2, total);
    }
    return rc;
}

/* Streams the model to path: the header of w (which holds the tensor infos), then every tensor generated in turn,
 * into a temporary file beside path renamed over it at the end (removed on failure). 0, or an error (printed). */
static int write_model(const eng_gguf_writer *w, const mk_opts *o, int64_t n_vocab) {
    void *hdr = NULL;
    size_t hlen = 0, total = 0;
    int count = 0;
    int rc = eng_gguf_write_header(w, &hdr, &hlen);
    if (rc) {
        fprintf(stderr, "kvserve mkmodel: cannot build the header: %s\n", kvs_strerror(rc));
        return rc;
    }
    size_t plen = strlen(o->out);
    char *tmp = malloc(plen + 16);
    int fd = -1;
    if (tmp) {
        memcpy(tmp, o->out, plen);
        memcpy(tmp + plen, ".tmp.XXXXXX", 12);
        fd = mkstemp(tmp);
    }
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        fprintf(stderr, "kvserve mkmodel: %s: cannot create a temporary file beside it: %s\n", o->out, strerror(errno));
        if (fd >= 0) close(fd), unlink(tmp);
        free(tmp);
        free(hdr);
        return ENG_ERR_IO;
    }
    mk_sink sk = {NULL, f, eng_gguf_writer_alignment(w)};
    rc = fwrite(hdr, 1, hlen, f) == hlen ? 0 : ENG_ERR_IO;
    free(hdr);
    if (!rc) rc = add_tensors(&sk, o, n_vocab, &total, &count);
    if (!rc && (fflush(f) != 0 || fsync(fileno(f)) != 0 || fchmod(fileno(f), 0644) != 0)) rc = ENG_ERR_IO;
    if (fclose(f) != 0 && !rc) rc = ENG_ERR_IO;
    if (!rc && rename(tmp, o->out) != 0) rc = ENG_ERR_IO;
    if (rc) {
        fprintf(stderr, "kvserve mkmodel: %s: cannot write: %s\n", o->out, strerror(errno));
        unlink(tmp);
    }
    free(tmp);
    return rc;
}

/* --dry-run: the header's keys as a reader sees them (through the bytes the writer makes), then the tensors. */
static int print_header(const eng_gguf_writer *w) {
    void *mem = NULL;
    size_t size = 0;
    eng_gguf *g = NULL;
    char err[256];
    int rc = eng_gguf_write_memory(w, &mem, &size);
    if (!rc) rc = eng_gguf_open_memory(mem, size, "header", &g, err, sizeof err);
    for (int64_t i = 0; !rc && i < eng_gguf_n_kv(g); i++) {
        const eng_gguf_kv *kv = eng_gguf_kv_at(g, i);
        printf("%.*s = ", (int)kv->key.len, kv->key.ptr);
        switch (kv->type) {
        case ENG_GGUF_STRING:
            if (kv->v.str.len > 60) printf("(%llu bytes of text)\n", (unsigned long long)kv->v.str.len);
            else printf("%.*s\n", (int)kv->v.str.len, kv->v.str.ptr);
            break;
        case ENG_GGUF_ARRAY: printf("[%llu x %s]\n", (unsigned long long)kv->v.arr.n, kv->v.arr.type == ENG_GGUF_STRING ? "string" : "number"); break;
        case ENG_GGUF_FLOAT32: case ENG_GGUF_FLOAT64: printf("%.9g\n", kv->v.f64); break;
        case ENG_GGUF_BOOL: printf("%s\n", kv->v.b ? "true" : "false"); break;
        case ENG_GGUF_INT8: case ENG_GGUF_INT16: case ENG_GGUF_INT32: case ENG_GGUF_INT64:
            printf("%lld\n", (long long)kv->v.i64);
            break;
        default: printf("%llu\n", (unsigned long long)kv->v.u64); break;
        }
    }
    eng_gguf_close(g);
    free(mem);
    if (rc) fprintf(stderr, "kvserve mkmodel: cannot read the header back: %s\n", kvs_strerror(rc));
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
    size_t total = 0;
    int count = 0;
    int rc = build_metadata(w, &o, &n_vocab);
    if (!rc && o.dry_run) {
        rc = print_header(w);
        const mk_sink count_only = {NULL, NULL, 1};
        if (!rc) rc = add_tensors(&count_only, &o, n_vocab, &total, &count);
    } else if (!rc) {
        const mk_sink infos = {w, NULL, 1};
        rc = add_tensors(&infos, &o, n_vocab, &total, &count);
        if (!rc) rc = write_model(w, &o, n_vocab);
    }
    eng_gguf_writer_free(w);
    if (rc) return 1;
    static const char *const tnames[] = {[ENG_Q_F32] = "f32", [ENG_Q_F16] = "f16", [ENG_Q_Q8_0] = "q8_0"};
    char experts[96] = "";
    if (!strcmp(o.arch, "qwen3moe") || kvs_mk_is_oss(&o))
        snprintf(experts, sizeof experts, ", %lld experts (%lld used, ff %lld)", (long long)o.n_expert,
                 (long long)o.n_expert_used, (long long)o.n_ff_exp);
    printf("%s %s: %s, embd %lld, %lld blocks, %lld/%lld heads (dim %lld), ff %lld%s, vocab %lld, %s%s, "
           "%d tensors, %.1f MiB of weights\n", o.dry_run ? "would write" : "wrote", o.out ? o.out : "(dry run)",
           o.arch, (long long)o.n_embd, (long long)o.n_layer, (long long)o.n_head, (long long)o.n_head_kv,
           (long long)o.head_dim, (long long)o.n_ff, experts, (long long)n_vocab, tnames[o.wtype],
           o.tied ? ", tied" : "", count, (double)total / (1024.0 * 1024.0));
    return 0;
}
