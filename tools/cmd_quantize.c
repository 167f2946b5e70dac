/*
 * cmd_quantize.c: `kvserve quantize IN.gguf OUT.gguf TYPE [--threads N]` converts the F32/F16/BF16 matrices of
 * a GGUF model to a quantized file type, choosing each tensor's type as llama.cpp's llama-quantize does without
 * an importance matrix, with the same block bytes (engine/quantize.c).
 *
 * Tensor types (facts of llama-quantize's policy, for the file types offered here):
 *   - Only tensors with at least 2 dimensions whose name ends in "weight" are quantized, except norms and a
 *     list of small or special tensors (k_keep); others are copied in their own type.
 *   - output.weight, and token_embd.weight when the model has no output.weight (tied embeddings), get Q6_K
 *     (Q8_0 stays Q8_0; Q8_0 also when the row length is not a multiple of the base type's block, or for falcon).
 *   - Q4_K_M / Q5_K_M raise attn_v (and fused qkv) to Q6_K for the layers use_more_bits picks (the first and
 *     last eighth, and every third layer between), and ffn_down the same way; fused qkv goes to Q5_K / Q6_K.
 *     Q4_K_S raises the first 4 attn_v and the first eighth of ffn_down to Q5_K. 8-expert models and
 *     llama's 70B shape have their own rules (implemented as llama.cpp states them).
 *   - MXFP4_MOE: tensors with a third dimension above 1 (the stacked experts, ffn_*_exps) get MXFP4, every other
 *     quantizable tensor Q8_0 (output.weight and tied embeddings included).
 *   - A row length that is not a multiple of the chosen type's block falls back: Q4_K to Q5_0, Q5_K to Q5_1,
 *     Q6_K to Q8_0, and to F16 when even 32 does not divide it.
 * Tensors are visited (and written) in llama.cpp's order: by layer number (non-layer tensors first), then name;
 * the per-category counters that the policy reads follow that order.
 *
 * Output: the input's key/value pairs (split keys dropped), then general.quantization_version = 2 and
 * general.file_type = llama.cpp's file type number, the input's alignment. It is written to OUT.tmp-XXXXXX
 * in OUT's folder, fsynced and renamed over OUT at the end; on any failure (or SIGINT/SIGTERM) the temporary
 * file is removed and OUT is left as it was.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "engine/kernels/quant.h"
#include "engine/runtime/threadpool.h"
#include "tools/cli.h"
#include "tools/commands.h"

/* ---- file types ------------------------------------------------------------------------------------------------ */
typedef enum { QZ_Q4_0, QZ_Q8_0, QZ_Q4_K_S, QZ_Q4_K_M, QZ_Q5_K_S, QZ_Q5_K_M, QZ_Q6_K, QZ_MXFP4_MOE } qz_kind;

typedef struct qz_ftype {
    const char *name;
    qz_kind kind;
    uint32_t file_type;   /* llama.cpp's llama_ftype number, stored in general.file_type */
    uint32_t base;        /* the type most matrices get */
} qz_ftype;

static const qz_ftype k_ftypes[] = {
    {"Q4_0", QZ_Q4_0, 2, ENG_Q_Q4_0},       {"Q8_0", QZ_Q8_0, 7, ENG_Q_Q8_0},
    {"Q4_K_S", QZ_Q4_K_S, 14, ENG_Q_Q4_K},  {"Q4_K_M", QZ_Q4_K_M, 15, ENG_Q_Q4_K},
    {"Q5_K_S", QZ_Q5_K_S, 16, ENG_Q_Q5_K},  {"Q5_K_M", QZ_Q5_K_M, 17, ENG_Q_Q5_K},
    {"Q6_K", QZ_Q6_K, 18, ENG_Q_Q6_K},      {"MXFP4_MOE", QZ_MXFP4_MOE, 38, ENG_Q_MXFP4},
};

static const qz_ftype *ftype_find(const char *s) {
    if (!strcasecmp(s, "Q4_K")) s = "Q4_K_M";
    if (!strcasecmp(s, "Q5_K")) s = "Q5_K_M";
    for (size_t i = 0; i < sizeof k_ftypes / sizeof k_ftypes[0]; i++)
        if (!strcasecmp(s, k_ftypes[i].name)) return &k_ftypes[i];
    return NULL;
}

/* ---- tensor plan ----------------------------------------------------------------------------------------------- */
typedef enum {
    CAT_TOKEN_EMBD, CAT_ATTN_Q, CAT_ATTN_V, CAT_ATTN_K, CAT_ATTN_QKV, CAT_ATTN_KV_B, CAT_ATTN_OUTPUT, CAT_FFN_UP,
    CAT_FFN_GATE, CAT_FFN_DOWN, CAT_OUTPUT, CAT_OTHER
} qz_cat;

typedef struct qz_tensor {
    const eng_gguf_tensor *t;
    char *name;          /* NUL-terminated copy */
    int layer;           /* blk.N., or -1 */
    qz_cat cat;
    uint32_t out_type;
    int64_t rows;        /* ne[1] * ne[2] * ne[3] */
} qz_tensor;

/* The policy's state: what llama.cpp's quantize_state_impl counts. */
typedef struct qz_policy {
    const qz_ftype *ft;
    bool falcon;
    bool is_70b;         /* llama with 80 blocks and grouped-query attention */
    bool tied;           /* no output.weight: token_embd is also the output layer */
    int64_t n_expert;
    int n_layer;
    int n_attn_v, i_attn_v;
    int i_ffn_down, i_ffn_gate, i_ffn_up;
    int n_fallback;
} qz_policy;

static qz_cat category(const char *n) {
    if (!strcmp(n, "output.weight")) return CAT_OUTPUT;
    if (!strcmp(n, "token_embd.weight") || !strcmp(n, "per_layer_token_embd.weight")) return CAT_TOKEN_EMBD;
    static const struct { const char *s; qz_cat c; } k[] = {
        {"attn_qkv.weight", CAT_ATTN_QKV}, {"attn_kv_b.weight", CAT_ATTN_KV_B}, {"attn_v.weight", CAT_ATTN_V},
        {"attn_k.weight", CAT_ATTN_K},     {"attn_q.weight", CAT_ATTN_Q},       {"attn_output.weight", CAT_ATTN_OUTPUT},
        {"ffn_up", CAT_FFN_UP},            {"ffn_gate", CAT_FFN_GATE},          {"ffn_down", CAT_FFN_DOWN},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strstr(n, k[i].s)) return k[i].c;
    return CAT_OTHER;
}

static bool cat_is_attn_v(qz_cat c) { return c == CAT_ATTN_V || c == CAT_ATTN_QKV || c == CAT_ATTN_KV_B; }

/* Name parts of tensors llama-quantize never quantizes (small, positional, routing or multimodal tensors). */
static const char *const k_keep[] = {
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight",
    "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd",
    "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook",
    "mm.a.code_embd",
};

/* ggml's dimension count: 1 + the index of the last dimension above 1. */
static int effective_dims(const eng_gguf_tensor *t) {
    int n = 1;
    for (int d = 1; d < 4; d++)
        if (t->ne[d] > 1) n = d + 1;
    return n;
}

static bool allows_quantization(const qz_tensor *q) {
    const char *n = q->name;
    size_t len = strlen(n);
    if (effective_dims(q->t) < 2) return false;
    if (len < 6 || strcmp(n + len - 6, "weight")) return false;
    if (!strcmp(n, "position_embd.weight") || !strcmp(n, "token_types.weight")) return false;
    for (size_t i = 0; i < sizeof k_keep / sizeof k_keep[0]; i++)
        if (strstr(n, k_keep[i])) return false;
    return true;
}

static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* The layer a per-layer counter stands for: the counter itself, or for expert models (whose tensors are not
 * one per layer in order) the number in the name. */
static int layer_of(const qz_policy *p, const qz_tensor *q, int counter, char *err, size_t err_len) {
    if (p->n_expert <= 1) return counter;
    if (q->layer < 0 || q->layer >= p->n_layer) {
        snprintf(err, err_len, "tensor '%s': cannot tell its layer (must be blk.N. with N < %d)", q->name,
                 p->n_layer);
        return -1;
    }
    return q->layer;
}

/* llama-quantize's mixture rules for one quantizable tensor. Returns the type, or -1 (err set). */
static int64_t mixture_type(qz_policy *p, const qz_tensor *q, char *err, size_t err_len) {
    const qz_kind k = p->ft->kind;
    uint32_t type = p->ft->base;
    const qz_cat c = q->cat;
    if (k == QZ_MXFP4_MOE) /* stacked experts (3-D) to MXFP4, every other matrix (the output too) to Q8_0 */
        return (c == CAT_OUTPUT || (p->tied && c == CAT_TOKEN_EMBD) || q->t->ne[2] <= 1) ? ENG_Q_Q8_0 : ENG_Q_MXFP4;
    if (c == CAT_OUTPUT || (p->tied && c == CAT_TOKEN_EMBD)) {
        int32_t blk = eng_qtype_get(type)->block_elems;
        if (p->falcon || q->t->ne[0] % blk != 0) type = ENG_Q_Q8_0;
        else if (type != ENG_Q_Q8_0) type = ENG_Q_Q6_K;
    } else if (c == CAT_TOKEN_EMBD) {
        /* untied embeddings keep the base type for these file types */
    } else if (cat_is_attn_v(c)) {
        if ((k == QZ_Q4_K_M || k == QZ_Q5_K_M) && use_more_bits(p->i_attn_v, p->n_attn_v)) type = ENG_Q_Q6_K;
        else if (k == QZ_Q4_K_S && p->i_attn_v < 4) type = ENG_Q_Q5_K;
        if (p->is_70b && type == ENG_Q_Q4_K) type = ENG_Q_Q5_K;
        if (p->n_expert == 8) type = ENG_Q_Q8_0;
        p->i_attn_v++;
    } else if (c == CAT_ATTN_K) {
        if (p->n_expert == 8) type = ENG_Q_Q8_0;
    } else if (c == CAT_FFN_DOWN) {
        int il = layer_of(p, q, p->i_ffn_down, err, err_len), nl = p->n_layer;
        if (il < 0) return -1;
        if (k == QZ_Q4_K_M) {
            if (p->falcon) type = il < nl / 16 ? ENG_Q_Q6_K : use_more_bits(il, nl) ? ENG_Q_Q5_K : ENG_Q_Q4_K;
            else if (use_more_bits(il, nl)) type = ENG_Q_Q6_K;
        } else if (k == QZ_Q5_K_M && use_more_bits(il, nl)) {
            type = ENG_Q_Q6_K;
        } else if (k == QZ_Q4_K_S && !p->falcon && il < nl / 8) {
            type = ENG_Q_Q5_K;
        }
        p->i_ffn_down++;
    } else if (c == CAT_ATTN_OUTPUT) {
        if (!p->falcon && p->n_expert == 8 && (k == QZ_Q4_K_S || k == QZ_Q4_K_M)) type = ENG_Q_Q5_K;
    } else if (c == CAT_ATTN_QKV) {
        if (k == QZ_Q4_K_M) type = ENG_Q_Q5_K;
        else if (k == QZ_Q5_K_M) type = ENG_Q_Q6_K;
    } else if (c == CAT_FFN_GATE) {
        if (layer_of(p, q, p->i_ffn_gate, err, err_len) < 0) return -1;
        p->i_ffn_gate++;
    } else if (c == CAT_FFN_UP) {
        if (layer_of(p, q, p->i_ffn_up, err, err_len) < 0) return -1;
        p->i_ffn_up++;
    }
    return type;
}

/* A row length the type's block does not divide: the next type llama-quantize falls back to. */
static uint32_t fallback_type(qz_policy *p, const qz_tensor *q, uint32_t type) {
    int64_t ncols = q->t->ne[0];
    if (ncols % eng_qtype_get(type)->block_elems == 0) return type;
    p->n_fallback++;
    uint32_t to = type == ENG_Q_Q4_K ? ENG_Q_Q5_0 : type == ENG_Q_Q5_K ? ENG_Q_Q5_1
                : type == ENG_Q_Q6_K ? ENG_Q_Q8_0 : type;
    if (ncols % eng_qtype_get(to)->block_elems != 0) to = ENG_Q_F16;
    fprintf(stderr, "kvserve quantize: %s: row length %lld is not a multiple of %d (%s): using %s\n", q->name,
            (long long)ncols, eng_qtype_get(type)->block_elems, eng_qtype_get(type)->name, eng_qtype_get(to)->name);
    return to;
}

static int parse_layer(const char *n) {
    int l;
    return sscanf(n, "blk.%d.", &l) == 1 ? l : -1;
}

static int cmp_tensor(const void *a, const void *b) {
    const qz_tensor *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Reads an unsigned integer key "<arch>.<suffix>"; *out unchanged when absent. Returns -1 for a bad value. */
static int arch_u32(const eng_gguf *g, const char *arch, const char *suffix, int64_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    int rc = eng_gguf_get_i64(g, key, &v);
    if (rc == ENG_ERR_NOT_FOUND) return 0;
    if (rc || v < 0 || v > INT32_MAX) return -1;
    *out = v;
    return 0;
}

typedef struct qz_plan {
    qz_tensor *t;
    int64_t n;
    qz_policy pol;
} qz_plan;

static void plan_free(qz_plan *pl) {
    for (int64_t i = 0; i < pl->n; i++) free(pl->t[i].name);
    free(pl->t);
}

/* Decides every tensor's output type. err receives the message on failure. */
static int plan_build(const eng_gguf *g, const qz_ftype *ft, qz_plan *pl, char *err, size_t err_len) {
    const char *path = eng_gguf_name(g);
    memset(pl, 0, sizeof *pl);
    qz_policy *p = &pl->pol;
    p->ft = ft;
    eng_gguf_str as;
    if (eng_gguf_get_str(g, "general.architecture", &as) || as.len == 0 || as.len > 63 ||
        memchr(as.ptr, 0, (size_t)as.len)) {
        snprintf(err, err_len, "%s: no usable general.architecture string", path);
        return ENG_ERR_FORMAT;
    }
    char arch[64];
    memcpy(arch, as.ptr, (size_t)as.len);
    arch[as.len] = 0;
    int64_t n_layer = -1, n_head = 0, n_head_kv = -1, n_expert = 0;
    if (arch_u32(g, arch, "block_count", &n_layer) || n_layer < 1 || arch_u32(g, arch, "expert_count", &n_expert) ||
        arch_u32(g, arch, "attention.head_count", &n_head) ||
        arch_u32(g, arch, "attention.head_count_kv", &n_head_kv)) {
        snprintf(err, err_len, "%s: %s.block_count (or a head/expert count) is missing or invalid", path, arch);
        return ENG_ERR_FORMAT;
    }
    if (n_head_kv < 0) n_head_kv = n_head;
    p->n_layer = (int)n_layer;
    p->n_expert = n_expert;
    p->falcon = !strcmp(arch, "falcon");
    p->is_70b = !strcmp(arch, "llama") && n_layer == 80 && n_head != n_head_kv;
    p->tied = true;

    pl->n = eng_gguf_n_tensors(g);
    if (pl->n == 0) {
        snprintf(err, err_len, "%s: the file has no tensors (a vocabulary-only file?)", path);
        return ENG_ERR_FORMAT;
    }
    pl->t = calloc((size_t)pl->n, sizeof *pl->t);
    if (!pl->t) {
        snprintf(err, err_len, "out of memory");
        return ENG_ERR_NOMEM;
    }
    for (int64_t i = 0; i < pl->n; i++) {
        qz_tensor *q = &pl->t[i];
        q->t = eng_gguf_tensor_at(g, i);
        q->name = malloc((size_t)q->t->name.len + 1);
        if (!q->name) {
            snprintf(err, err_len, "out of memory");
            return ENG_ERR_NOMEM;
        }
        memcpy(q->name, q->t->name.ptr, (size_t)q->t->name.len);
        q->name[q->t->name.len] = 0;
        if (strlen(q->name) != q->t->name.len) {
            snprintf(err, err_len, "%s: tensor %lld has a NUL byte in its name", path, (long long)i);
            return ENG_ERR_FORMAT;
        }
        q->layer = parse_layer(q->name);
        q->cat = category(q->name);
        q->rows = q->t->ne[1] * q->t->ne[2] * q->t->ne[3];
        if (cat_is_attn_v(q->cat)) p->n_attn_v++;
        if (q->cat == CAT_OUTPUT) p->tied = false;
    }
    qsort(pl->t, (size_t)pl->n, sizeof *pl->t, cmp_tensor);
    for (int64_t i = 0; i < pl->n; i++) {
        qz_tensor *q = &pl->t[i];
        q->out_type = q->t->type;
        if (!allows_quantization(q)) continue;
        int64_t type = mixture_type(p, q, err, err_len);
        if (type < 0) return ENG_ERR_FORMAT;
        q->out_type = fallback_type(p, q, (uint32_t)type);
        if (q->out_type != q->t->type && q->t->type != ENG_Q_F32 && q->t->type != ENG_Q_F16 &&
            q->t->type != ENG_Q_BF16) {
            const char *tn = eng_gguf_type_name(q->t->type);
            snprintf(err, err_len, "%s: tensor '%s' is %s: only f32, f16 and bf16 tensors can be quantized "
                     "(requantizing is not supported)", path, q->name, tn ? tn : "of an unknown type");
            return ENG_ERR_UNSUPPORTED;
        }
    }
    return 0;
}

/* ---- the temporary output file ---------------------------------------------------------------------------------- */
/* The signal handler needs the temporary file's name without an argument: this is the one file-scope variable
 * of the command, set while the file exists. */
static char g_tmp_path[PATH_MAX + 32];

static void on_signal(int sig) {
    if (g_tmp_path[0]) unlink(g_tmp_path);
    signal(sig, SIG_DFL);
    raise(sig);
}

typedef struct qz_out {
    int fd;
    char tmp[PATH_MAX + 32];
    uint64_t written;
    struct sigaction old_int, old_term;
} qz_out;

static int out_open(qz_out *o, const char *path, char *err, size_t err_len) {
    o->fd = -1;
    o->written = 0;
    if (strlen(path) > PATH_MAX) {
        snprintf(err, err_len, "%.200s...: path too long", path);
        return ENG_ERR_INVALID;
    }
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp-XXXXXX", path);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    /* block the signals while the name is published, so the handler never sees half a name */
    sigset_t block, prev;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &prev);
    o->fd = mkstemp(o->tmp);
    int e = errno;
    if (o->fd >= 0) {
        memcpy(g_tmp_path, o->tmp, sizeof g_tmp_path);
        sigaction(SIGINT, &sa, &o->old_int);
        sigaction(SIGTERM, &sa, &o->old_term);
    }
    sigprocmask(SIG_SETMASK, &prev, NULL);
    if (o->fd < 0) {
        snprintf(err, err_len, "%s: cannot create a temporary file beside it: %s", path, strerror(e));
        return ENG_ERR_IO;
    }
    return 0;
}

static int out_write(qz_out *o, const void *p, size_t n, const char *path, char *err, size_t err_len) {
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t k = write(o->fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0) {
            if (errno == EINTR) continue;
            snprintf(err, err_len, "%s: cannot write: %s", path, strerror(errno));
            return ENG_ERR_IO;
        }
        b += k;
        n -= (size_t)k;
        o->written += (uint64_t)k;
    }
    return 0;
}

static int out_pad(qz_out *o, uint32_t align, const char *path, char *err, size_t err_len) {
    static const uint8_t zeros[256];
    size_t pad = (size_t)((align - o->written % align) % align);
    while (pad > 0) {
        size_t k = pad < sizeof zeros ? pad : sizeof zeros;
        int rc = out_write(o, zeros, k, path, err, err_len);
        if (rc) return rc;
        pad -= k;
    }
    return 0;
}

/* Ends the file: with ok, fsync + rename over path (and fsync of the folder); otherwise (or when that
 * fails) removes the temporary file. Returns 0 or ENG_ERR_IO (err set). */
static int out_close(qz_out *o, bool ok, const char *path, char *err, size_t err_len) {
    int rc = 0;
    if (ok) {
        const char *step = "fsync";
        int bad = fsync(o->fd);
        if (!bad) { step = "chmod"; bad = fchmod(o->fd, 0644); }
        int e = errno;
        if (close(o->fd) != 0 && !bad) { step = "close"; bad = 1; e = errno; }
        o->fd = -1;
        if (!bad && rename(o->tmp, path) != 0) { step = "rename"; bad = 1; e = errno; }
        if (bad) {
            snprintf(err, err_len, "%s: cannot finish the file (%s): %s", path, step, strerror(e));
            rc = ENG_ERR_IO;
        } else {
            char dir[PATH_MAX + 32];
            snprintf(dir, sizeof dir, "%s", path);
            int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
            if (dfd >= 0) {
                (void)fsync(dfd);
                close(dfd);
            }
        }
    }
    if (o->fd >= 0) close(o->fd);
    o->fd = -1;
    if (!ok || rc) unlink(o->tmp);
    sigset_t block, prev;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &prev);
    g_tmp_path[0] = 0;
    sigaction(SIGINT, &o->old_int, NULL);
    sigaction(SIGTERM, &o->old_term, NULL);
    sigprocmask(SIG_SETMASK, &prev, NULL);
    return rc;
}

/* ---- converting one tensor ----------------------------------------------------------------------------------------- */
typedef struct qz_job {
    const qz_tensor *q;
    const uint8_t *src;       /* the slab's first row */
    uint8_t *dst;
    float *f32;               /* [rows][ncols] scratch */
    int64_t rows, ncols;
    size_t src_row, dst_row;  /* bytes per row */
    int64_t chunk;            /* rows per work item */
    atomic_llong next;
    atomic_llong bad;         /* the first failure, row * 4 + kind (kind 1: input not finite, 2: a block
                                 scale overflows fp16, 3: another error), or LLONG_MAX */
} qz_job;

/* Keeps the failure with the lowest row, so the message does not depend on thread timing. */
static void record_bad(qz_job *j, int64_t row, int kind) {
    long long v = (long long)row * 4 + kind;
    long long cur = atomic_load(&j->bad);
    while (v < cur && !atomic_compare_exchange_weak(&j->bad, &cur, v)) {}
}

static void convert_worker(void *arg, int ith, int nth) {
    (void)ith;
    (void)nth;
    qz_job *j = arg;
    const uint32_t in = j->q->t->type, out = j->q->out_type;
    for (;;) {
        int64_t r0 = atomic_fetch_add(&j->next, j->chunk);
        if (r0 >= j->rows || atomic_load(&j->bad) != LLONG_MAX) break;
        int64_t nr = j->rows - r0 < j->chunk ? j->rows - r0 : j->chunk;
        for (int64_t r = r0; r < r0 + nr; r++) {
            int64_t bad;
            if (eng_check_row_data(in, j->src + (size_t)r * j->src_row, j->ncols, &bad) != 0) {
                record_bad(j, r, 1);
                return;
            }
            if (eng_dequantize_row(in, j->src + (size_t)r * j->src_row, j->f32 + r * j->ncols, j->ncols) != 0) {
                record_bad(j, r, 3);
                return;
            }
        }
        uint8_t *d = j->dst + (size_t)r0 * j->dst_row;
        if (eng_quantize_weights(out, j->f32 + r0 * j->ncols, d, nr, j->ncols) != 0) {
            record_bad(j, r0, 3);
            return;
        }
        for (int64_t r = 0; r < nr; r++) {
            int64_t bad;
            if (eng_check_row_data(out, d + (size_t)r * j->dst_row, j->ncols, &bad) != 0) {
                record_bad(j, r0 + r, 2);
                return;
            }
        }
    }
}

typedef struct qz_bufs {
    float *f32;
    uint8_t *dst;
    size_t f32_cap, dst_cap;  /* elements, bytes */
} qz_bufs;

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    void *n = realloc(*p, need * elem);
    if (!n) return ENG_ERR_NOMEM;
    *p = n;
    *cap = need;
    return 0;
}

enum { SLAB_FLOATS = 1 << 23 }; /* 32 MiB of float32 scratch per slab (at least one row) */

/* Writes tensor q's output bytes: a copy, or the conversion in slabs of rows over the pool. */
static int write_tensor(const qz_tensor *q, eng_pool *pool, qz_bufs *b, qz_out *o, const char *in_path,
                        const char *out_path, char *err, size_t err_len) {
    const eng_gguf_tensor *t = q->t;
    if (q->out_type == t->type) {
        /* copied as is, after the check llama.cpp's loader makes (types the engine does not know: none) */
        const eng_qtype_info *ti = eng_qtype_get(t->type);
        int64_t bad = 0;
        int rc = ti ? eng_check_row_data(t->type, t->data,
                                         (int64_t)(t->nbytes / (size_t)ti->block_bytes) * ti->block_elems, &bad)
                    : ENG_ERR_UNSUPPORTED;
        if (rc == ENG_ERR_FORMAT) {
            snprintf(err, err_len, "%s: tensor '%s' holds a NaN or infinity (value %lld)", in_path, q->name,
                     (long long)bad);
            return rc;
        }
        return out_write(o, t->data, t->nbytes, out_path, err, err_len);
    }
    const int64_t ncols = t->ne[0];
    qz_job j;
    memset(&j, 0, sizeof j);
    j.q = q;
    j.ncols = ncols;
    j.src_row = eng_qtype_row_bytes(t->type, ncols);
    j.dst_row = eng_qtype_row_bytes(q->out_type, ncols);
    int64_t slab = SLAB_FLOATS / ncols;
    if (slab < 1) slab = 1;
    if (slab > q->rows) slab = q->rows;
    if (grow((void **)&b->f32, &b->f32_cap, (size_t)(slab * ncols), sizeof(float)) ||
        grow((void **)&b->dst, &b->dst_cap, (size_t)slab * j.dst_row, 1)) {
        snprintf(err, err_len, "out of memory for tensor '%s'", q->name);
        return ENG_ERR_NOMEM;
    }
    j.f32 = b->f32;
    j.dst = b->dst;
    /* work items of at least 16384 values, so threads take few of them */
    j.chunk = (16384 + ncols - 1) / ncols;
    for (int64_t r0 = 0; r0 < q->rows; r0 += slab) {
        j.rows = q->rows - r0 < slab ? q->rows - r0 : slab;
        j.src = (const uint8_t *)t->data + (size_t)r0 * j.src_row;
        atomic_store(&j.next, 0);
        atomic_store(&j.bad, LLONG_MAX);
        eng_pool_run(pool, convert_worker, &j);
        long long code = atomic_load(&j.bad);
        if (code != LLONG_MAX) {
            long long bad = code / 4;
            int kind = (int)(code % 4);
            if (kind == 1)
                snprintf(err, err_len, "%s: tensor '%s' holds a NaN or infinity (row %lld)", in_path, q->name,
                         (long long)(r0 + bad));
            else if (kind == 2)
                snprintf(err, err_len, "%s: tensor '%s' row %lld: values too large for %s (a block scale "
                         "overflows fp16)", in_path, q->name, (long long)(r0 + bad), eng_qtype_get(q->out_type)->name);
            else
                snprintf(err, err_len, "%s: tensor '%s': cannot convert %s to %s", in_path, q->name,
                         eng_gguf_type_name(t->type), eng_qtype_get(q->out_type)->name);
            return ENG_ERR_FORMAT;
        }
        int rc = out_write(o, j.dst, (size_t)j.rows * j.dst_row, out_path, err, err_len);
        if (rc) return rc;
    }
    return 0;
}

/* ---- the command -------------------------------------------------------------------------------------------------- */
static bool is_split_key(eng_gguf_str k) {
    static const char *const keys[] = {"split.no", "split.count", "split.tensors.count",
                                       "general.quantization_version", "general.file_type"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (k.len == strlen(keys[i]) && !memcmp(k.ptr, keys[i], (size_t)k.len)) return true;
    return false;
}

/* The output's header: the input's kvs (minus split keys and the two that are set last), then the tensors. */
static int build_writer(const eng_gguf *g, const qz_plan *pl, eng_gguf_writer **out, char *err, size_t err_len) {
    eng_gguf_writer *w;
    int rc = eng_gguf_writer_create(&w);
    for (int64_t i = 0; !rc && i < eng_gguf_n_kv(g); i++) {
        const eng_gguf_kv *kv = eng_gguf_kv_at(g, i);
        if (is_split_key(kv->key)) continue;
        rc = eng_gguf_add_kv_from(w, kv);
        if (rc) snprintf(err, err_len, "%s: cannot copy key '%.*s': %s", eng_gguf_name(g), (int)kv->key.len,
                         kv->key.ptr, kvs_strerror(rc));
    }
    if (!rc) rc = eng_gguf_add_u32(w, "general.quantization_version", 2);
    if (!rc) rc = eng_gguf_add_u32(w, "general.file_type", pl->pol.ft->file_type);
    for (int64_t i = 0; !rc && i < pl->n; i++) {
        const qz_tensor *q = &pl->t[i];
        rc = eng_gguf_add_tensor_info(w, q->name, q->out_type, q->t->n_dims, q->t->ne);
        if (rc) snprintf(err, err_len, "%s: tensor '%s': cannot describe it as %s", eng_gguf_name(g), q->name,
                         eng_qtype_get(q->out_type) ? eng_qtype_get(q->out_type)->name : "?");
    }
    if (rc && !err[0]) snprintf(err, err_len, "cannot build the header: %s", kvs_strerror(rc));
    if (rc) {
        eng_gguf_writer_free(w);
        return rc;
    }
    *out = w;
    return 0;
}

static void shape_str(const eng_gguf_tensor *t, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%lld", (long long)t->ne[0]);
    for (uint32_t d = 1; d < t->n_dims && n > 0 && (size_t)n < cap; d++)
        n += snprintf(buf + n, cap - (size_t)n, " x %lld", (long long)t->ne[d]);
}

typedef struct qz_args {
    const char *in, *out;
    const qz_ftype *ft;
    long threads;
} qz_args;

static const kvs_opt qz_opts_table[] = {
    KVS_OPT_THREADS(qz_args, threads),
};
static const kvs_cli qz_cli = {
    "quantize", "IN.gguf OUT.gguf TYPE [--threads N]",
    "Quantizes the f32/f16/bf16 matrices of a GGUF model as llama.cpp's llama-quantize does without an\n"
    "importance matrix (same per-tensor types, same bytes). 1-D tensors and norms keep their type.\n"
    "\n"
    "  TYPE                  Q4_0, Q8_0, Q4_K_M (or Q4_K), Q4_K_S, Q5_K_M (or Q5_K), Q5_K_S, Q6_K, MXFP4_MOE\n",
    "OUT is written to a temporary file beside it and renamed at the end: a failure leaves no partial file.\n",
    qz_opts_table, sizeof qz_opts_table / sizeof qz_opts_table[0], 3,
};

/* 0 to go on, 1 after --help, 2 on a usage error. */
static int parse_args(int argc, char **argv, qz_args *a) {
    const char *pos[3];
    int npos = 0;
    a->threads = 0;
    int prc = kvs_cli_parse(&qz_cli, a, argc, argv, pos, &npos);
    if (prc) return prc;
    if (npos != 3) {
        kvs_cli_usage(&qz_cli, stderr);
        return 2;
    }
    a->in = pos[0];
    a->out = pos[1];
    a->ft = ftype_find(pos[2]);
    if (!a->ft)
        return kvs_cli_fail(&qz_cli, "unknown type '%s' (Q4_0, Q8_0, Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q6_K, MXFP4_MOE)",
                            pos[2]);
    return 0;
}

int kvs_cmd_quantize(int argc, char **argv) {
    qz_args a;
    int prc = parse_args(argc, argv, &a);
    if (prc == 1) return 0;
    if (prc) return 2;
    double t0 = kvs_now_s();
    char err[1024] = "";
    eng_gguf *g = NULL;
    eng_gguf_writer *w = NULL;
    eng_pool *pool = NULL;
    qz_plan pl;
    memset(&pl, 0, sizeof pl);
    qz_bufs bufs = {0};
    void *hdr = NULL;
    size_t hdr_len = 0;
    bool opened = false;
    qz_out o;
    memset(&o, 0, sizeof o);
    int rc = eng_gguf_open(a.in, &g, err, sizeof err);
    if (!rc) rc = plan_build(g, a.ft, &pl, err, sizeof err);
    if (!rc) rc = build_writer(g, &pl, &w, err, sizeof err);
    if (!rc && (rc = eng_gguf_write_header(w, &hdr, &hdr_len)) != 0) snprintf(err, sizeof err, "out of memory");
    int threads = a.threads > 0 ? (int)a.threads : eng_cpu_count();
    if (!rc && (rc = eng_pool_create(threads, &pool)) != 0)
        snprintf(err, sizeof err, "cannot start %d threads: %s", threads, kvs_strerror(rc));
    if (!rc) {
        rc = out_open(&o, a.out, err, sizeof err);
        opened = rc == 0;
    }
    if (!rc) rc = out_write(&o, hdr, hdr_len, a.out, err, sizeof err);
    uint64_t size_in = 0, size_out = 0, n_elem = 0;
    uint32_t align = eng_gguf_writer_alignment(w);
    for (int64_t i = 0; !rc && i < pl.n; i++) {
        const qz_tensor *q = &pl.t[i];
        char shape[96];
        shape_str(q->t, shape, sizeof shape);
        size_t out_bytes = eng_gguf_tensor_bytes(q->out_type, q->t->n_dims, q->t->ne);
        fprintf(stderr, "[%4lld/%4lld] %-36s [%s] %s", (long long)(i + 1), (long long)pl.n, q->name, shape,
                eng_gguf_type_name(q->t->type));
        if (q->out_type != q->t->type) fprintf(stderr, " -> %s", eng_qtype_get(q->out_type)->name);
        fprintf(stderr, ", %.2f MiB -> %.2f MiB\n", (double)q->t->nbytes / 1048576.0, (double)out_bytes / 1048576.0);
        rc = write_tensor(q, pool, &bufs, &o, a.in, a.out, err, sizeof err);
        if (!rc) rc = out_pad(&o, align, a.out, err, sizeof err);
        size_in += q->t->nbytes;
        size_out += out_bytes;
        n_elem += (uint64_t)(q->t->ne[0] * q->rows);
    }
    if (opened) {
        int crc = out_close(&o, rc == 0, a.out, err, sizeof err);
        if (!rc) rc = crc;
    }
    if (rc) fprintf(stderr, "kvserve quantize: %s\n", err[0] ? err : kvs_strerror(rc));
    else {
        double dt = kvs_now_s() - t0;
        if (pl.pol.n_fallback)
            fprintf(stderr, "kvserve quantize: %d of %lld tensors fell back to another type (row length)\n",
                    pl.pol.n_fallback, (long long)pl.n);
        printf("kvserve quantize: wrote %s (%s, file type %u): tensors %.2f MiB (%.2f bits per weight) -> "
               "%.2f MiB (%.2f bits per weight), file %.2f MiB, in %.1f s with %d thread%s\n",
               a.out, a.ft->name, a.ft->file_type, (double)size_in / 1048576.0, 8.0 * (double)size_in / (double)n_elem,
               (double)size_out / 1048576.0, 8.0 * (double)size_out / (double)n_elem, (double)o.written / 1048576.0,
               dt, threads, threads == 1 ? "" : "s");
    }
    free(hdr);
    free(bufs.f32);
    free(bufs.dst);
    eng_pool_free(pool);
    eng_gguf_writer_free(w);
    plan_free(&pl);
    eng_gguf_close(g);
    return rc ? 1 : 0;
}
