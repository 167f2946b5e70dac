/*
 * test_families.c: model-family behaviour beyond the reference completions (test_reference.c): gemma3's
 * sliding-window layers (the window is what they see; a model whose layers all slide keeps only the window's
 * blocks; with the default pattern the sliding layers' KV lives in the cache's sliding group, bounded by the
 * window, while the global layers keep everything), the block manager's CanResume check before it reuses a
 * prefix in a sliding-window cache, and context shift's re-rotation per layer.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/kv_cache.h"
#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "server/sched/block_manager_internal.h"
#include "tests/unit/helper_shared.h"

enum { BS = 4, N_TOK = 96 };

/* ../shared's syn-gemma3 rewritten with attention.sliding_window_pattern = pattern (0: every layer slides), at
 * out (size cap); skips the test when the material is absent. */
static void gemma3_with_pattern(uint32_t pattern, char *out, size_t cap) {
    char src[1024];
    snprintf(src, sizeof src, "%s/models/families/syn-gemma3-q8_0.gguf", kvt_shared_dir());
    if (access(src, R_OK) != 0) cr_skip_test("shared test material not found (%s)", src);
    eng_gguf *g = NULL;
    char err[256];
    cr_assert_eq(eng_gguf_open(src, &g, err, sizeof err), 0, "%s", err);
    eng_gguf_writer *w = NULL;
    cr_assert_eq(eng_gguf_writer_create(&w), 0);
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++) {
        const eng_gguf_kv *kv = eng_gguf_kv_at(g, i);
        if (!(kv->key.len == 17 && memcmp(kv->key.ptr, "general.alignment", 17) == 0))
            cr_assert_eq(eng_gguf_add_kv_from(w, kv), 0);
    }
    cr_assert_eq(eng_gguf_add_u32(w, "gemma3.attention.sliding_window_pattern", pattern), 0);
    for (int64_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        cr_assert_eq(eng_gguf_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->nbytes), 0);
    }
    snprintf(out, cap, "/tmp/kvserve-test-families-%d-%u.gguf", (int)getpid(), pattern);
    cr_assert_eq(eng_gguf_write(w, out, err, sizeof err), 0, "%s", err);
    eng_gguf_writer_free(w);
    eng_gguf_close(g);
}

static eng_ctx *open_ctx_swa(eng_model *m, int32_t max_seqs, bool swa_full) {
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_ctx = 256;
    cp.max_seqs = max_seqs;
    cp.max_batch_tokens = 128;
    cp.kv_block_size = BS;
    cp.kv_dtype = KVC_DTYPE_F32;
    cp.prefix_caching = false;
    cp.device = ENG_DEVICE_CPU;
    cp.swa_full = swa_full;
    eng_ctx *c = NULL;
    char err[256];
    cr_assert_eq(eng_ctx_create(m, &cp, &c, err, sizeof err), 0, "%s", err);
    return c;
}

static eng_ctx *open_ctx(eng_model *m, int32_t max_seqs) { return open_ctx_swa(m, max_seqs, false); }

/* Runs tokens [0, n) of toks on a fresh sequence in chunks of `chunk` rows, keeping the logits of every
 * position in lg[n][n_vocab]; after every step, when max_held > 0, checks that at most `max_held` blocks of the
 * sequence are held (-1 entries of the block table are released) in the pool that slides: the cache's sliding
 * group when it has one (and then that the main pool holds every block), else the cache itself. */
static void run_chunks(eng_ctx *c, const int32_t *toks, int32_t n, int32_t chunk, int32_t n_vocab, float *lg,
                       int32_t max_held) {
    kvc_cache *kc = eng_ctx_cache(c);
    int32_t seq;
    cr_assert_eq(kvc_seq_alloc(kc, &seq), 0);
    int32_t pos[128], sq[128];
    bool want[128];
    for (int32_t p0 = 0; p0 < n; p0 += chunk) {
        int32_t k = n - p0 < chunk ? n - p0 : chunk;
        for (int32_t i = 0; i < k; i++) {
            pos[i] = p0 + i;
            sq[i] = seq;
            want[i] = true;
        }
        eng_batch b = {.n = k, .token = toks + p0, .pos = pos, .seq = sq, .want_logits = want};
        cr_assert_eq(eng_decode(c, &b), 0);
        for (int32_t i = 0; i < k; i++)
            memcpy(lg + (size_t)(p0 + i) * n_vocab, eng_get_logits(c, i), (size_t)n_vocab * sizeof(float));
        const int32_t *blocks;
        int32_t nb, len, held = 0;
        cr_assert_eq(kvc_block_table(kc, seq, &blocks, &nb, &len), 0);
        for (int32_t i = 0; i < nb; i++) held += blocks[i] >= 0;
        if (kvc_swa_group(kc)) {
            cr_assert_eq(held, nb, "the global layers' pool released a block");
            cr_assert_eq(kvc_block_table(kvc_swa_group(kc), seq, &blocks, &nb, &len), 0);
            held = 0;
            for (int32_t i = 0; i < nb; i++) held += blocks[i] >= 0;
        }
        if (max_held > 0) cr_assert_leq(held, max_held, "%d blocks held at length %d", held, len);
    }
    kvc_seq_free(kc, seq);
}

static float max_abs_diff(const float *a, const float *b, size_t n) {
    float d = 0.0f;
    for (size_t i = 0; i < n; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

/* Every layer sliding (pattern 0): the cache releases the blocks before the window (memory bounded by the
 * window: at most ceil(window / BS) + 1 blocks plus one batch's worth), and the logits do not depend on how the
 * sequence was cut into batches, so nothing released was read. The default pattern (a global layer) runs too
 * (its bound: gemma3_sliding_group_memory_bound). */
Test(families, gemma3_sliding_window_memory_bound, .timeout = 120) {
    char path_all[256], path_def[256];
    gemma3_with_pattern(0, path_all, sizeof path_all);
    gemma3_with_pattern(6, path_def, sizeof path_def);
    eng_model *m_all = NULL, *m_def = NULL;
    char err[256];
    cr_assert_eq(eng_model_load(path_all, NULL, &m_all, err, sizeof err), 0, "%s", err);
    cr_assert_eq(eng_model_load(path_def, NULL, &m_def, err, sizeof err), 0, "%s", err);
    const eng_hparams *hp = eng_model_hparams(m_all);
    cr_assert_eq(hp->n_swa, 16);
    cr_assert(hp->swa_all);
    cr_assert(!eng_model_hparams(m_def)->swa_all);
    int32_t V = hp->n_vocab, toks[N_TOK];
    for (int i = 0; i < N_TOK; i++) toks[i] = 3 + (int32_t)((i * 7919u + 13u) % (uint32_t)(V - 3));
    float *a = malloc((size_t)N_TOK * V * sizeof(float)), *b = malloc((size_t)N_TOK * V * sizeof(float));
    float *d = malloc((size_t)N_TOK * V * sizeof(float));
    cr_assert(a && b && d);

    eng_ctx *c = open_ctx(m_all, 2);
    int32_t bound = (hp->n_swa + BS - 1) / BS + 1;
    run_chunks(c, toks, N_TOK, 1, V, a, bound + 1);      /* decode token by token */
    run_chunks(c, toks, N_TOK, 7, V, b, bound + 7 / BS + 2); /* prefill-sized chunks */
    float diff = max_abs_diff(a, b, (size_t)N_TOK * V);
    cr_expect_leq(diff, 1e-4f, "chunked logits differ by %g", diff);
    eng_ctx_free(c);

    c = open_ctx(m_def, 2); /* global layer 5: every block stays */
    run_chunks(c, toks, N_TOK, 32, V, d, 0);
    eng_ctx_free(c);
    eng_model_free(m_all);
    eng_model_free(m_def);
    free(a);
    free(b);
    free(d);
    unlink(path_all);
    unlink(path_def);
}

/* Gemma 3's default pattern (layers 0-4 slide, layer 5 is global): the sliding layers' KV lives in the cache's
 * sliding group, where a sequence holds at most the window's blocks however far it grows beyond the window (200
 * tokens, window 16), while the global layer's pool keeps every position. The logits are bit for bit those of the
 * same model with every layer keeping everything in one pool (swa_full), decoded token by token or in chunks of 7. */
Test(families, gemma3_sliding_group_memory_bound, .timeout = 180) {
    enum { N = 200 };
    char path[256];
    gemma3_with_pattern(6, path, sizeof path);
    eng_model *m = NULL;
    char err[256];
    cr_assert_eq(eng_model_load(path, NULL, &m, err, sizeof err), 0, "%s", err);
    const eng_hparams *hp = eng_model_hparams(m);
    cr_assert(!hp->swa_all);
    int32_t V = hp->n_vocab, toks[N];
    for (int i = 0; i < N; i++) toks[i] = 3 + (int32_t)((i * 7919u + 13u) % (uint32_t)(V - 3));
    size_t sz = (size_t)N * V * sizeof(float);
    float *a1 = malloc(sz), *a7 = malloc(sz), *f1 = malloc(sz), *f7 = malloc(sz);
    cr_assert(a1 && a7 && f1 && f7);

    eng_ctx *split = open_ctx_swa(m, 2, false), *full = open_ctx_swa(m, 2, true);
    kvc_stats ss, fs;
    kvc_get_stats(eng_ctx_cache(split), &ss);
    kvc_get_stats(eng_ctx_cache(full), &fs);
    /* sliding group: max_seqs * (ceil(16 / 4) + 4) + ceil(128 / 4) blocks of 5 layers, whatever n_ctx */
    cr_expect_eq(ss.swa_blocks_total, 2 * (16 / BS + 4) + 128 / BS);
    cr_expect_eq(fs.swa_blocks_total, 0);
    cr_expect_eq(ss.blocks_total, fs.blocks_total); /* the global pool: max_seqs full-length sequences */
    cr_expect_lt(ss.bytes_total, fs.bytes_total / 2, "split %zu bytes, full %zu", ss.bytes_total, fs.bytes_total);
    cr_log_info("gemma3 KV storage, 2 sequences of 256 positions: %zu bytes with the sliding group (%d + %d blocks), "
                "%zu with every layer in one pool", ss.bytes_total, ss.blocks_total, ss.swa_blocks_total, fs.bytes_total);

    int32_t bound = (hp->n_swa + BS - 1) / BS + 1;
    run_chunks(split, toks, N, 1, V, a1, bound + 1);
    run_chunks(split, toks, N, 7, V, a7, bound + 7 / BS + 2);
    run_chunks(full, toks, N, 1, V, f1, 0);
    run_chunks(full, toks, N, 7, V, f7, 0);
    cr_expect(memcmp(a1, f1, sz) == 0, "token by token: split cache differs from swa_full by %g",
              max_abs_diff(a1, f1, (size_t)N * V));
    cr_expect(memcmp(a7, f7, sz) == 0, "chunks of 7: split cache differs from swa_full by %g",
              max_abs_diff(a7, f7, (size_t)N * V));
    cr_expect(memcmp(a1, a7, sz) == 0, "decode and chunked prefill differ by %g", max_abs_diff(a1, a7, (size_t)N * V));
    eng_ctx_free(split);
    eng_ctx_free(full);
    eng_model_free(m);
    free(a1);
    free(a7);
    free(f1);
    free(f7);
    unlink(path);
}

/* Fills seq with tokens [0, n) through forwards of one token each (no engine: the cache alone). */
static void fill(kvc_cache *kc, int32_t seq, const int32_t *toks, int32_t from, int32_t n) {
    for (int32_t p = from; p < n; p++) {
        kvc_entry e = {.seq = seq, .pos = p, .token = toks[p]};
        int32_t slot;
        int rc = kvc_start_forward(kc, &e, 1, &slot);
        cr_assert_eq(rc, 0, "seq %d pos %d: %d", seq, p, rc);
        cr_assert_eq(kvc_finish_forward(kc, true), 0);
    }
}

/* The block manager reuses a running sequence's prefix only when the new sequence can resume from it: a
 * donor further along has released the blocks the copy would need, so the prefix comes from the prefix cache
 * (whose attach keeps the window) or is recomputed, and the new sequence can always continue. */
/* A small F32 cache with a window of 8: one layer in the main pool, swa_layers in a sliding group. */
static kvc_cache *window_cache(int32_t swa_layers, bool prefix_caching) {
    kvc_params p;
    kvc_params_default(&p);
    p.n_layer = 1;
    p.swa_layers = swa_layers;
    p.n_kv_head = 1;
    p.head_dim = 32;
    p.block_size = BS;
    p.n_blocks = 64;
    p.max_seqs = 4;
    p.max_batch_tokens = 16;
    p.sliding_window = 8;
    p.dtype = KVC_DTYPE_F32;
    p.prefix_caching = prefix_caching;
    kvc_cache *kc = NULL;
    cr_assert_eq(kvc_create(&p, &kc), 0);
    return kc;
}

Test(families, block_manager_asks_can_resume) {
    kvc_cache *kc = window_cache(0, false); /* nothing to attach from the cache: a refused copy means recompute */
    srv_block_manager bm;
    srv_block_manager_init(&bm, kc);
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = 100 + i;
    int32_t donor, fresh;
    cr_assert_eq(srv_block_manager_seq_open(&bm, &donor), 0);
    fill(kc, donor, toks, 0, 60);
    cr_assert(!kvc_can_resume(kc, donor, 20), "position 20 of a 60-token window-8 sequence was released");

    /* a copy of 20 tokens would start with released blocks: refused, the sequence stays empty */
    cr_assert_eq(srv_block_manager_seq_open(&bm, &fresh), 0);
    bool copied = true;
    int32_t got = srv_block_manager_attach_prefix(&bm, fresh, toks, 40, donor, 20, &copied);
    cr_expect_eq(got, 0);
    cr_expect(!copied);
    cr_expect_eq(srv_block_manager_seq_len(&bm, fresh), 0);
    cr_expect(kvc_can_resume(kc, fresh, 0));
    fill(kc, fresh, toks, 0, 24); /* and it computes its own */
    srv_block_manager_seq_close(&bm, fresh);

    /* 58 tokens: positions 50 and 51 of the window were released with their block: refused too */
    cr_assert_eq(srv_block_manager_seq_open(&bm, &fresh), 0);
    got = srv_block_manager_attach_prefix(&bm, fresh, toks, 59, donor, 58, &copied);
    cr_expect_eq(got, 0);
    cr_expect(!copied);
    srv_block_manager_seq_close(&bm, fresh);

    /* the whole donor (60 tokens) holds its window: accepted, and the copy goes on */
    cr_assert_eq(srv_block_manager_seq_open(&bm, &fresh), 0);
    got = srv_block_manager_attach_prefix(&bm, fresh, toks, 61, donor, 60, &copied);
    cr_expect_eq(got, 60);
    cr_expect(copied);
    cr_expect(kvc_can_resume(kc, fresh, 60));
    fill(kc, fresh, toks, 60, 64);
    srv_block_manager_seq_close(&bm, fresh);
    srv_block_manager_seq_close(&bm, donor);
    kvc_free(kc);
}

/* The same with a sliding group (gemma3's default pattern: the global layers' pool keeps every block, the sliding
 * group only the window): a copy whose next positions the group released is refused, the donor's whole length is
 * accepted; with prefix caching, a finished prompt's blocks come back from both pools (the group keeps released
 * blocks cached) and the sequence can resume. */
Test(families, block_manager_sliding_group) {
    for (int caching = 0; caching < 2; caching++) {
        kvc_cache *kc = window_cache(2, caching);
        srv_block_manager bm;
        srv_block_manager_init(&bm, kc);
        int32_t toks[64], donor, fresh;
        for (int i = 0; i < 64; i++) toks[i] = 100 + i;
        cr_assert_eq(srv_block_manager_seq_open(&bm, &donor), 0);
        fill(kc, donor, toks, 0, 60);
        const int32_t *blocks;
        int32_t nb, len, held = 0;
        cr_assert_eq(kvc_block_table(kc, donor, &blocks, &nb, &len), 0);
        for (int32_t i = 0; i < nb; i++) cr_assert_geq(blocks[i], 0, "the global pool released block %d", i);
        cr_assert_eq(kvc_block_table(kvc_swa_group(kc), donor, &blocks, &nb, &len), 0);
        for (int32_t i = 0; i < nb; i++) held += blocks[i] >= 0;
        cr_expect_leq(held, 8 / BS + 1, "the group holds %d blocks of a 60-token sequence", held);
        bool copied = true;
        if (!caching) {
            cr_assert(!kvc_can_resume(kc, donor, 20));
            cr_assert_eq(srv_block_manager_seq_open(&bm, &fresh), 0);
            cr_expect_eq(srv_block_manager_attach_prefix(&bm, fresh, toks, 40, donor, 20, &copied), 0);
            cr_expect(!copied);
            cr_expect_eq(srv_block_manager_seq_len(&bm, fresh), 0);
            srv_block_manager_seq_close(&bm, fresh);
            cr_assert_eq(srv_block_manager_seq_open(&bm, &fresh), 0);
            cr_expect_eq(srv_block_manager_attach_prefix(&bm, fresh, toks, 61, donor, 60, &copied), 60);
            cr_expect(copied);
            cr_expect(kvc_can_resume(kc, fresh, 60));
            fill(kc, fresh, toks, 60, 64);
            srv_block_manager_seq_close(&bm, fresh);
        } else {
            srv_block_manager_seq_close(&bm, donor); /* its blocks stay cached in both pools */
            cr_assert_eq(srv_block_manager_seq_open(&bm, &fresh), 0);
            cr_expect_eq(srv_block_manager_attach_prefix(&bm, fresh, toks, 41, -1, 0, &copied), 40);
            cr_expect(!copied);
            cr_expect(kvc_can_resume(kc, fresh, 40));
            fill(kc, fresh, toks, 40, 44);
            srv_block_manager_seq_close(&bm, fresh);
        }
        char msg[256];
        cr_expect_eq(kvc_check(kc, msg, sizeof msg), 0, "%s", msg);
        if (!caching) srv_block_manager_seq_close(&bm, donor);
        kvc_free(kc);
    }
}

/* K (kv = 0) or V (kv = 1) row of gemma3 layer l (default pattern: l % 6 < 5 slides), head h at position p of
 * seq, as floats (F32 cache): in the sliding group when the cache has one and the layer slides. */
static const float *cache_row(kvc_cache *kc, int32_t seq, int32_t l, int kv, int32_t p, int32_t h) {
    const kvc_cache *pool = kc;
    int32_t idx = l;
    if (kvc_swa_group(kc)) { /* sliding layers 0-4, 6-10, ... in the group; 5, 11, ... in the main pool */
        bool slides = l % 6 < 5;
        pool = slides ? kvc_swa_group(kc) : kc;
        idx = slides ? l - l / 6 : l / 6;
    }
    kvc_layout lay;
    kvc_get_layout(pool, &lay);
    const int32_t *blocks;
    int32_t nb, len;
    cr_assert_eq(kvc_block_table(pool, seq, &blocks, &nb, &len), 0);
    cr_assert_lt(p, len);
    cr_assert_geq(blocks[p / lay.block_size], 0, "layer %d position %d was released", l, p);
    return (const float *)kvc_row_ptr(&lay, idx, kv, blocks[p / lay.block_size] * lay.block_size + p % lay.block_size,
                                      h);
}

/* Rotates x (NEOX pairs (i, i + n_rot / 2)) by delta positions with rope base `base`, in double precision. */
static void ref_rotate(float *x, int32_t n_rot, double base, int32_t delta) {
    int32_t half = n_rot / 2;
    for (int32_t i = 0; i < half; i++) {
        double th = delta * pow(base, -2.0 * i / n_rot), c = cos(th), sn = sin(th);
        double x0 = x[i], x1 = x[i + half];
        x[i] = (float)(x0 * c - x1 * sn);
        x[i + half] = (float)(x0 * sn + x1 * c);
    }
}

/* Context shift on gemma3 (sliding layers with rope base 10000, every 6th layer global with 1e6): after
 * eng_seq_remove from the middle, every moved key equals the same token's key of an unshifted copy rotated back
 * by the removed count with its layer's base (a reference rotation written here), values moved unchanged, and
 * generation continues. Run with every layer in one pool (swa_full) on 40 tokens, and with the sliding group on
 * 18 (the window, 16, still holds every position: a removal into released positions is not supported there). */
static void shift_check(eng_model *m, bool swa_full, int32_t N, int32_t KEEP, int32_t DROP) {
    const eng_hparams *hp = eng_model_hparams(m);
    eng_ctx *c = open_ctx_swa(m, 2, swa_full);
    kvc_cache *kc = eng_ctx_cache(c);
    cr_assert_eq(kvc_swa_group(kc) == NULL, swa_full);
    int32_t toks[64], V = hp->n_vocab;
    cr_assert_lt(N, 64);
    for (int i = 0; i <= N; i++) toks[i] = 3 + (int32_t)((i * 104729u + 7u) % (uint32_t)(V - 3));
    int32_t a, b, sq[128];
    bool want[128];
    int32_t tt[128], pp[128];
    cr_assert_eq(kvc_seq_alloc(kc, &a), 0);
    cr_assert_eq(kvc_seq_alloc(kc, &b), 0);
    for (int i = 0; i < 2 * N; i++) {
        tt[i] = toks[i % N];
        pp[i] = i % N;
        sq[i] = i < N ? a : b;
        want[i] = false;
    }
    eng_batch ba = {.n = 2 * N, .token = tt, .pos = pp, .seq = sq, .want_logits = want};
    cr_assert_eq(eng_decode(c, &ba), 0);
    cr_assert_eq(eng_seq_remove(c, a, KEEP, KEEP + DROP), 0);
    cr_assert_eq(kvc_seq_len(kc, a), N - DROP);

    float kmax = 0.0f, *ref = malloc((size_t)hp->head_dim * sizeof(float));
    cr_assert_not_null(ref);
    for (int32_t l = 0; l < hp->n_layer; l++) {
        double base = l % 6 < 5 ? 10000.0 : 1000000.0;
        for (int32_t h = 0; h < hp->n_head_kv; h++)
            for (int32_t p = 0; p < N - DROP; p++) {
                int32_t old = p < KEEP ? p : p + DROP;
                memcpy(ref, cache_row(kc, b, l, 0, old, h), (size_t)hp->head_dim * sizeof(float));
                if (p >= KEEP) ref_rotate(ref, hp->n_rot, base, -DROP);
                kmax = fmaxf(kmax, max_abs_diff(ref, cache_row(kc, a, l, 0, p, h), (size_t)hp->head_dim));
                cr_assert_eq(memcmp(cache_row(kc, a, l, 1, p, h), cache_row(kc, b, l, 1, old, h),
                                    (size_t)hp->head_dim * sizeof(float)), 0, "V moved wrong: layer %d pos %d", l, p);
            }
    }
    free(ref);
    cr_expect_leq(kmax, 1e-4f, "shifted keys differ from the reference rotation by %g", kmax);

    /* the shifted sequence goes on */
    int32_t next = toks[N], p1 = N - DROP, s1 = a;
    bool w1 = true;
    eng_batch one = {.n = 1, .token = &next, .pos = &p1, .seq = &s1, .want_logits = &w1};
    cr_assert_eq(eng_decode(c, &one), 0);
    const float *lg = eng_get_logits(c, 0);
    for (int32_t i = 0; i < V; i++) cr_assert(isfinite(lg[i]));
    cr_assert_eq(kvc_seq_len(kc, a), N - DROP + 1);
    eng_ctx_free(c);
}

Test(families, gemma3_context_shift_rerotates_per_layer, .timeout = 120) {
    char path[256];
    gemma3_with_pattern(6, path, sizeof path);
    eng_model *m = NULL;
    char err[256];
    cr_assert_eq(eng_model_load(path, NULL, &m, err, sizeof err), 0, "%s", err);
    shift_check(m, true, 40, 4, 16);
    shift_check(m, false, 18, 4, 8);

    /* the sliding group released positions 0-19 of a 40-token sequence: the shift is refused, nothing changes */
    eng_ctx *c = open_ctx(m, 1);
    kvc_cache *kc = eng_ctx_cache(c);
    int32_t seq, tt[40], pp[40], sq[40];
    bool want[40] = {false};
    cr_assert_eq(kvc_seq_alloc(kc, &seq), 0);
    for (int i = 0; i < 40; i++) {
        tt[i] = 3 + i;
        pp[i] = i;
        sq[i] = seq;
    }
    eng_batch ba = {.n = 40, .token = tt, .pos = pp, .seq = sq, .want_logits = want};
    cr_assert_eq(eng_decode(c, &ba), 0);
    cr_expect_eq(eng_seq_remove(c, seq, 4, 20), ENG_ERR_UNSUPPORTED);
    cr_expect_eq(kvc_seq_len(kc, seq), 40);
    cr_expect(kvc_can_resume(kc, seq, 40));
    eng_ctx_free(c);
    eng_model_free(m);
    unlink(path);
}
