/* test_kv_tier_engine.c: a prompt served from the disk tier gives the same logits, bit for bit on the CPU, as the
 * same prompt recomputed: on stories260K (../shared), with f16 and f32 pools, random prompts and chunkings, a
 * prefix from the pool continued from disk, and a corrupt file (its good blocks load, the rest is recomputed). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/kv_tier.h"
#include "engine/engine.h"
#include "helper_rng.h"
#include "helper_shared.h"
#include "helper_tmpdir.h"

enum { MAXP = 300, STEPS = 4 };

static char dir[256];

static void rm_dir(void) { tmpt_rm_flat(dir); }

static eng_model *load_model(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", kvt_shared_dir());
    if (access(path, R_OK) != 0) return NULL;
    eng_load_params lp;
    eng_load_params_default(&lp);
    eng_model *m = NULL;
    char err[256] = "";
    cr_assert_eq(eng_model_load(path, &lp, &m, err, sizeof err), ENG_OK, "%s", err);
    return m;
}

static eng_ctx *make_ctx(eng_model *m, kvc_dtype dt) {
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_threads = 2;
    cp.n_ctx = 512;
    cp.max_seqs = 4;
    cp.max_batch_tokens = 128;
    cp.kv_block_size = 16;
    cp.kv_blocks = 64;
    cp.kv_dtype = dt;
    cp.device = ENG_DEVICE_CPU;
    eng_ctx *ctx = NULL;
    char err[256] = "";
    cr_assert_eq(eng_ctx_create(m, &cp, &ctx, err, sizeof err), ENG_OK, "%s", err);
    return ctx;
}

static kvt_tier *open_tier(eng_ctx *ctx) {
    kvt_params p = {.dir = dir, .max_bytes = (uint64_t)1 << 30};
    memset(p.identity, 3, sizeof p.identity);
    kvt_tier *t = NULL;
    cr_assert_eq(kvt_open(&p, eng_ctx_cache(ctx), &t), KVS_OK);
    kvc_set_event_cb(eng_ctx_cache(ctx), kvt_on_cache_event, t);
    return t;
}

/* Runs tokens[from..n) of seq in chunks of at most `chunk`, then STEPS greedy decode steps; writes the logits of
 * the last prompt token and of every step into out[(STEPS + 1) * n_vocab]. */
static void run(eng_ctx *ctx, kvt_tier *t, int32_t seq, const int32_t *tokens, int32_t from, int32_t n, int32_t chunk,
                int32_t n_vocab, float *out) {
    int32_t tok[128], pos[128], sq[128];
    bool want[128];
    for (int32_t at = from; at < n;) {
        int32_t k = n - at < chunk ? n - at : chunk;
        for (int32_t i = 0; i < k; i++) {
            tok[i] = tokens[at + i];
            pos[i] = at + i;
            sq[i] = seq;
            want[i] = at + i == n - 1;
        }
        eng_batch b = {.n = k, .token = tok, .pos = pos, .seq = sq, .want_logits = want};
        cr_assert_eq(eng_decode(ctx, &b), ENG_OK);
        kvt_step_end(t);
        at += k;
    }
    memcpy(out, eng_get_logits(ctx, 0 + (n - from - 1) % chunk), (size_t)n_vocab * sizeof *out);
    for (int32_t s = 0; s < STEPS; s++) {
        const float *lg = out + (size_t)s * n_vocab;
        int32_t best = 0;
        for (int32_t v = 1; v < n_vocab; v++)
            if (lg[v] > lg[best]) best = v;
        int32_t p = n + s;
        bool w = true;
        eng_batch b = {.n = 1, .token = &best, .pos = &p, .seq = &seq, .want_logits = &w};
        cr_assert_eq(eng_decode(ctx, &b), ENG_OK);
        memcpy(out + (size_t)(s + 1) * n_vocab, eng_get_logits(ctx, 0), (size_t)n_vocab * sizeof *out);
    }
}

/* Flips one byte of every tier file's last block (its data), so that loads stop there. */
static void corrupt_files(void) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    char p[512];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strstr(e->d_name, ".kvt")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        FILE *f = fopen(p, "r+b");
        cr_assert_not_null(f);
        fseek(f, -100, SEEK_END);
        int c = fgetc(f);
        fseek(f, -100, SEEK_END);
        fputc(c ^ 0x40, f);
        fclose(f);
    }
    closedir(d);
}

static void one_case(eng_model *m, kvc_dtype dt, rng *r, int variant) {
    int32_t n_vocab = eng_model_hparams(m)->n_vocab, n = 40 + rng_int(r, MAXP - 40), tokens[MAXP];
    for (int32_t i = 0; i < n; i++) tokens[i] = 1 + rng_int(r, n_vocab - 1);
    size_t sz = (size_t)(STEPS + 1) * n_vocab;
    float *ref = malloc(sz * sizeof *ref), *got = malloc(sz * sizeof *got);
    cr_assert(ref && got);
    snprintf(dir, sizeof dir, "/tmp/kvs-tier-eng-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    /* the first process computes the prompt (saving its blocks) */
    eng_ctx *a = make_ctx(m, dt);
    kvt_tier *ta = open_tier(a);
    int32_t seq;
    cr_assert_eq(kvc_seq_alloc(eng_ctx_cache(a), &seq), KVC_OK);
    run(a, ta, seq, tokens, 0, n, 1 + rng_int(r, 128), n_vocab, ref);
    kvc_set_event_cb(eng_ctx_cache(a), NULL, NULL);
    kvt_close(ta);
    eng_ctx_free(a);
    if (variant == 2) corrupt_files();
    /* the second loads what the disk holds (after a pool prefix in variant 1) and computes the rest */
    eng_ctx *b = make_ctx(m, dt);
    kvt_tier *tb = open_tier(b);
    kvc_cache *c = eng_ctx_cache(b);
    int32_t have = 0, loaded = 0;
    if (variant == 1) { /* a shorter prompt computed first leaves its blocks in the pool */
        int32_t s0, k = 16 * (1 + rng_int(r, (n - 1) / 16));
        cr_assert_eq(kvc_seq_alloc(c, &s0), KVC_OK);
        float *tmp = malloc(sz * sizeof *tmp);
        run(b, tb, s0, tokens, 0, k, 128, n_vocab, tmp);
        free(tmp);
        cr_assert_eq(kvc_seq_free(c, s0), KVC_OK);
    }
    cr_assert_eq(kvc_seq_alloc(c, &seq), KVC_OK);
    cr_assert_eq(kvc_attach_prefix(c, seq, tokens, n - 1, &have), KVC_OK);
    cr_assert_eq(kvt_load(tb, seq, tokens, n - 1, have, 1000, &loaded), KVS_OK);
    if (variant != 2) cr_assert_eq(have + loaded, (n - 1) / 16 * 16, "%d + %d of %d", have, loaded, n);
    else cr_assert_lt(have + loaded, (n - 1) / 16 * 16);
    run(b, tb, seq, tokens, have + loaded, n, 1 + rng_int(r, 128), n_vocab, got);
    for (size_t i = 0; i < sz; i++)
        cr_assert(!memcmp(&got[i], &ref[i], sizeof *got), "dtype %d variant %d n %d (%d from the pool, %d from disk): "
                  "logit %zu is %.9g, recomputed %.9g", (int)dt, variant, n, have, loaded, i, (double)got[i],
                  (double)ref[i]);
    kvc_set_event_cb(c, NULL, NULL);
    kvt_close(tb);
    eng_ctx_free(b);
    rm_dir();
    free(ref);
    free(got);
}

Test(kv_tier_engine, served_from_disk_equals_recomputed_bit_for_bit) {
    eng_model *m = load_model();
    if (!m) cr_skip_test("models/stories260K.gguf not found in ../shared (KVSERVE_SHARED)");
    rng r = {0x5eed};
    for (int i = 0; i < 6; i++) one_case(m, i % 2 ? KVC_DTYPE_F32 : KVC_DTYPE_F16, &r, i % 3);
    eng_model_free(m);
}
