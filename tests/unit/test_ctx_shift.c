/* test_ctx_shift.c: the context shift (issue 16 part 3), on real models.
 *
 * Engine and cache: after eng_seq_remove from the middle, the first layer's keys and values (which depend only on
 * a token and its position) equal those of a fresh prefill of the kept tokens at their new positions; in every
 * layer the moved values are the old ones and the moved keys the old ones rotated back by the removed count (a
 * reference rotation written here); the shifted blocks are never found by the prefix cache. Randomized over the
 * context size, n_keep, block size and KV type, on the shared models (stories260K, syn-llama, syn-qwen2,
 * syn-gemma3, syn-phi3; skipped when ../shared is absent) and a one-layer model that `kvserve mkmodel` writes.
 *
 * Scheduler over the real engine (context_shift on): a request whose max_tokens passes the context keeps
 * generating; its tokens equal an engine-driven run that shifts by hand (in place, bit for bit), equal a fresh
 * request whose prompt is the kept tokens (bit for bit on the recompute path; within float tolerance in place
 * on the one-layer model, where the shifted cache is exactly a fresh prefill); without context_shift or without
 * max_tokens it stops with "length" at the context size; under preemption the recompute path is bit for bit the
 * run alone; gemma3 (sliding window) and phi3 (rope factors) shift in place as the engine driven by hand. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "engine/engine.h"
#include "engine/kernels/quant.h"
#include "helper_shared.h"
#include "server/sched/sched.h"

/* ---- small helpers ----------------------------------------------------------------------------------------- */
static uint64_t rnd(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static int32_t rnd_int(uint64_t *s, int32_t n) { return n <= 0 ? 0 : (int32_t)(rnd(s) % (uint64_t)n); }

/* The shared model rel (under models/) in buf, or NULL when it is not there. */
static const char *shared_model(const char *rel, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/models/%s", kvt_shared_dir(), rel);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

static eng_model *load_model(const char *path) {
    eng_model *m = NULL;
    char err[512] = "";
    cr_assert_eq(eng_model_load(path, NULL, &m, err, sizeof err), ENG_OK, "%s: %s", path, err);
    return m;
}

/* A model written by `kvserve mkmodel` with the given options into dir/name. */
static eng_model *mk_model(const char *dir, const char *name, const char *opts, char *path, size_t cap) {
    char cmd[1024];
    snprintf(path, cap, "%s/%s", dir, name);
    snprintf(cmd, sizeof cmd, "'%s' mkmodel -o '%s' %s >/dev/null 2>&1", KVSERVE_BINARY, path, opts);
    cr_assert_eq(system(cmd), 0, "%s failed", cmd);
    return load_model(path);
}

static eng_ctx *open_ctx(eng_model *m, int32_t n_ctx, int32_t block, int32_t max_seqs, int32_t kv_blocks,
                         kvc_dtype dt) {
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_threads = 2;
    cp.n_ctx = n_ctx;
    cp.max_seqs = max_seqs;
    cp.max_batch_tokens = 64;
    cp.kv_block_size = block;
    cp.kv_blocks = kv_blocks;
    cp.kv_dtype = dt;
    cp.prefix_caching = true;
    cp.device = ENG_DEVICE_CPU;
    /* gemma3: every layer in one pool, which can shift in place past the window (the default sliding group
     * refuses a shift into positions it released, and the scheduler then recomputes: test_families.c) */
    cp.swa_full = true;
    eng_ctx *c = NULL;
    char err[512] = "";
    cr_assert_eq(eng_ctx_create(m, &cp, &c, err, sizeof err), ENG_OK, "%s", err);
    return c;
}

/* Puts toks[0..n) at positions pos0.. of seq through the engine in chunks of at most `chunk`; returns the batch
 * entry of the last token (whose logits eng_get_logits gives). */
static int32_t feed(eng_ctx *c, int32_t seq, const int32_t *toks, int32_t pos0, int32_t n, int32_t chunk) {
    int32_t last = 0;
    int32_t pos[64], sq[64];
    bool want[64];
    if (chunk > 64) chunk = 64;
    for (int32_t i = 0; i < n; i += chunk) {
        int32_t k = n - i < chunk ? n - i : chunk;
        for (int32_t j = 0; j < k; j++) {
            pos[j] = pos0 + i + j;
            sq[j] = seq;
            want[j] = i + j == n - 1;
        }
        eng_batch b = {.n = k, .token = toks + i, .pos = pos, .seq = sq, .want_logits = want};
        cr_assert_eq(eng_decode(c, &b), ENG_OK, "decode of %d tokens at %d", k, pos0 + i);
        last = k - 1;
    }
    return last;
}

/* Row (layer, kv, position, head) of seq as floats (F32 copied, F16 converted). */
static void get_row(kvc_cache *kc, int32_t seq, int32_t l, int kv, int32_t p, int32_t h, float *out) {
    kvc_layout lay;
    kvc_get_layout(kc, &lay);
    const int32_t *blocks;
    int32_t nb, len;
    cr_assert_eq(kvc_block_table(kc, seq, &blocks, &nb, &len), KVC_OK);
    cr_assert_lt(p, len);
    cr_assert_geq(blocks[p / lay.block_size], 0);
    const void *ptr = kvc_row_ptr(&lay, l, kv, blocks[p / lay.block_size] * lay.block_size + p % lay.block_size, h);
    if (lay.dtype == KVC_DTYPE_F32) {
        memcpy(out, ptr, (size_t)lay.head_dim * sizeof(float));
    } else {
        cr_assert_eq(lay.dtype, KVC_DTYPE_F16);
        const uint16_t *hv = ptr;
        for (int32_t i = 0; i < lay.head_dim; i++) out[i] = eng_fp16_to_f32(hv[i]);
    }
}

/* max |a - b| / (1 + max |b|) */
static double rel_diff(const float *a, const float *b, int32_t n) {
    double d = 0, m = 0;
    for (int32_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - (double)b[i]);
        if (!(x <= d)) d = x;
        if (fabs((double)b[i]) > m) m = fabs((double)b[i]);
    }
    return d / (1.0 + m);
}

/* Rotates x's first n_rot values by delta positions (pairs (i, i + n_rot/2) with neox, else (2i, 2i+1)),
 * angle delta * scale * base^(-2i/n_rot), in double precision: the reference for the re-rotation. */
static void ref_rotate(float *x, int32_t n_rot, bool neox, double base, double scale, int32_t delta) {
    int32_t half = n_rot / 2;
    for (int32_t i = 0; i < half; i++) {
        double th = delta * scale * pow(base, -2.0 * i / n_rot), cs = cos(th), sn = sin(th);
        int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        double x0 = x[a], x1 = x[b];
        x[a] = (float)(x0 * cs - x1 * sn);
        x[b] = (float)(x0 * sn + x1 * cs);
    }
}

/* ---- engine and cache ------------------------------------------------------------------------------------- */
typedef struct shift_stats {
    int rounds, unsupported;
    double l0, rot; /* worst first-layer difference to the fresh prefill, worst rotated-key difference */
} shift_stats;

/* One randomized round on model m: a context of n_ctx tokens with block size bs and KV type dt; L tokens
 * prefilled, then [keep, keep + nd) removed (the scheduler's choice: nd = (L - keep) / 2). all_layers: also
 * check every layer against the reference rotation (models whose rope is one base for every layer, no
 * frequency factors). */
static void shift_round(eng_model *m, uint64_t *rs, bool all_layers, shift_stats *st) {
    const eng_hparams *hp = eng_model_hparams(m);
    static const int32_t bss[] = {4, 8, 16};
    int32_t bs = bss[rnd_int(rs, 3)], n_ctx = 24 + rnd_int(rs, 73);
    kvc_dtype dt = rnd_int(rs, 4) == 0 ? KVC_DTYPE_F16 : KVC_DTYPE_F32;
    int32_t L = n_ctx - 1 - rnd_int(rs, n_ctx / 3);
    int32_t keep = rnd_int(rs, 3) == 0 ? rnd_int(rs, L - 1) : rnd_int(rs, L < 14 ? L - 1 : 12);
    int32_t nd = (L - keep) / 2, kept = L - nd;
    cr_assert_geq(nd, 1);
    int32_t *toks = malloc((size_t)L * sizeof *toks), *kt = malloc((size_t)kept * sizeof *kt);
    cr_assert(toks && kt);
    for (int32_t i = 0; i < L; i++) toks[i] = 1 + rnd_int(rs, hp->n_vocab - 1);
    for (int32_t i = 0; i < kept; i++) kt[i] = toks[i < keep ? i : i + nd];
    eng_ctx *c = open_ctx(m, n_ctx, bs, 4, 4 * (n_ctx / bs + 2), dt);
    kvc_cache *kc = eng_ctx_cache(c);
    int32_t a, b, o;
    cr_assert_eq(kvc_seq_alloc(kc, &a), KVC_OK);
    cr_assert_eq(kvc_seq_alloc(kc, &b), KVC_OK);
    cr_assert_eq(kvc_seq_alloc(kc, &o), KVC_OK);
    feed(c, a, toks, 0, L, 1 + rnd_int(rs, 40));
    int rc = eng_seq_remove(c, a, keep, keep + nd);
    if (rc == ENG_ERR_UNSUPPORTED && hp->n_swa > 0) {
        /* a sliding window released blocks of the range: the scheduler recomputes instead (tested below) */
        st->unsupported++;
        goto done;
    }
    cr_assert_eq(rc, ENG_OK, "%s: eng_seq_remove(%d, %d) of %d: %s", hp->name, keep, keep + nd, L, kvs_strerror(rc));
    cr_assert_eq(kvc_seq_len(kc, a), kept);
    /* the prefix cache finds the unshifted full blocks before keep and nothing after: neither under the old
     * tokens nor under the shifted ones */
    int32_t matched = -1;
    cr_assert_eq(kvc_prefix_match(kc, toks, L, &matched), KVC_OK);
    cr_assert_eq(matched, keep / bs * bs, "old tokens: %d matched, keep %d, block %d", matched, keep, bs);
    cr_assert_eq(kvc_prefix_match(kc, kt, kept, &matched), KVC_OK);
    cr_assert_eq(matched, keep / bs * bs, "shifted tokens: %d matched, keep %d, block %d", matched, keep, bs);

    /* the shifted sequence goes on; its new full blocks are not published either */
    int32_t more[24];
    int32_t n_more = n_ctx - kept < 24 ? n_ctx - kept : 24;
    for (int32_t i = 0; i < n_more; i++) more[i] = 1 + rnd_int(rs, hp->n_vocab - 1);
    feed(c, a, more, kept, n_more, 1);
    const float *lg = eng_get_logits(c, 0);
    cr_assert_not_null(lg);
    for (int32_t i = 0; i < hp->n_vocab; i++) cr_assert(isfinite(lg[i]));
    int32_t *all = malloc((size_t)(kept + n_more) * sizeof *all);
    cr_assert_not_null(all);
    memcpy(all, kt, (size_t)kept * sizeof *all);
    memcpy(all + kept, more, (size_t)n_more * sizeof *all);
    cr_assert_eq(kvc_prefix_match(kc, all, kept + n_more, &matched), KVC_OK);
    cr_assert_eq(matched, keep / bs * bs, "after decoding on: %d matched, keep %d, block %d", matched, keep, bs);
    free(all);

    feed(c, b, kt, 0, kept, 1 + rnd_int(rs, 40)); /* the fresh prefill of the kept tokens */
    if (all_layers) feed(c, o, toks, 0, L, 64);    /* the unshifted original */
    float *x = malloc((size_t)hp->head_dim * sizeof *x), *y = malloc((size_t)hp->head_dim * sizeof *y);
    cr_assert(x && y);
    double tol = dt == KVC_DTYPE_F32 ? 1e-4 : 4e-3;
    for (int32_t p = 0; p < kept; p++)
        for (int32_t h = 0; h < hp->n_head_kv; h++)
            for (int kv = 0; kv < 2; kv++) {
                get_row(kc, a, 0, kv, p, h, x);
                get_row(kc, b, 0, kv, p, h, y);
                double d = rel_diff(x, y, hp->head_dim);
                if (d > st->l0) st->l0 = d;
                cr_assert_leq(d, tol, "%s (block %d, %s, keep %d, drop %d of %d): layer 0 %s at %d head %d differs "
                              "from a fresh prefill by %g", hp->name, bs, dt == KVC_DTYPE_F32 ? "f32" : "f16", keep,
                              nd, L, kv ? "V" : "K", p, h, d);
            }
    if (all_layers) {
        for (int32_t l = 0; l < hp->n_layer; l++)
            for (int32_t p = 0; p < kept; p++)
                for (int32_t h = 0; h < hp->n_head_kv; h++) {
                    int32_t old = p < keep ? p : p + nd;
                    get_row(kc, a, l, 1, p, h, x);
                    get_row(kc, o, l, 1, old, h, y);
                    cr_assert(memcmp(x, y, (size_t)hp->head_dim * sizeof *x) == 0,
                              "%s: V of layer %d moved wrong to %d", hp->name, l, p);
                    get_row(kc, a, l, 0, p, h, x);
                    get_row(kc, o, l, 0, old, h, y);
                    if (p >= keep)
                        ref_rotate(y, hp->n_rot, hp->neox_rope, hp->rope_freq_base, hp->rope_freq_scale, -nd);
                    double d = rel_diff(x, y, hp->head_dim);
                    if (d > st->rot) st->rot = d;
                    cr_assert_leq(d, tol, "%s: K of layer %d at %d (was %d) differs from the reference rotation "
                                  "by %g", hp->name, l, p, old, d);
                }
    }
    free(x);
    free(y);
    st->rounds++;
done:;
    char msg[256];
    cr_assert_eq(kvc_check(kc, msg, sizeof msg), KVC_OK, "%s", msg);
    eng_ctx_free(c);
    free(toks);
    free(kt);
}

static void shift_model(const char *path, bool all_layers, uint64_t seed, int rounds) {
    eng_model *m = load_model(path);
    uint64_t rs = seed;
    shift_stats st = {0};
    for (int i = 0; i < rounds; i++) shift_round(m, &rs, all_layers, &st);
    cr_log_info("%s: %d rounds shifted (%d refused by the sliding window), worst layer-0 difference %.3g, worst "
                "rotated key %.3g", eng_model_hparams(m)->name, st.rounds, st.unsupported, st.l0, st.rot);
    cr_assert_gt(st.rounds, 0);
    eng_model_free(m);
}

Test(ctx_shift, engine_shift_equals_fresh_prefill_shared_models, .timeout = 600) {
    static const struct { const char *rel; bool all_layers; } M[] = {
        {"stories260K.gguf", true},
        {"synthetic/syn-llama-q8_0.gguf", true},
        {"synthetic/syn-qwen2-q8_0.gguf", true},
        {"families/syn-gemma3-q8_0.gguf", false}, /* per-layer rope bases: tests/unit/test_families.c */
        {"families/syn-phi3-q8_0.gguf", false},   /* rope frequency factors */
    };
    char buf[1024];
    int found = 0;
    for (size_t i = 0; i < sizeof M / sizeof M[0]; i++) {
        if (!shared_model(M[i].rel, buf, sizeof buf)) {
            cr_log_warn("SKIPPED: %s not found in %s/models", M[i].rel, kvt_shared_dir());
            continue;
        }
        found++;
        shift_model(buf, M[i].all_layers, 1000 + i, 6);
    }
    if (!found) cr_skip_test("no shared model found in %s/models (KVSERVE_SHARED)", kvt_shared_dir());
}

Test(ctx_shift, engine_shift_equals_fresh_prefill_mkmodel, .timeout = 300) {
    char dir[] = "/tmp/kvs_ctxshift_XXXXXX", path[512];
    cr_assert_not_null(mkdtemp(dir));
    eng_model *m = mk_model(dir, "q.gguf", "--preset tiny --arch qwen2 --layers 3", path, sizeof path);
    eng_model_free(m);
    shift_model(path, true, 77, 8);
    remove(path);
    rmdir(dir);
}

/* ---- the scheduler over the real engine ------------------------------------------------------------------ */
#define MAXT 400
typedef struct res {
    int32_t toks[MAXT];
    float lp[MAXT], top2[MAXT]; /* logprob of each token, and of the second best */
    int32_t n_toks;
    srv_sched_finish finish;
    srv_sched_usage usage;
    int done;
    int *n_done;
} res;

static void on_event(const srv_sched_event *ev, void *user) {
    res *r = user;
    if (ev->type == SRV_SCHED_EV_DONE) {
        r->done = 1;
        r->usage = ev->usage;
        (*r->n_done)++;
        return;
    }
    for (int32_t i = 0; i < ev->n_samples && r->n_toks < MAXT; i++) {
        r->toks[r->n_toks] = ev->samples[i].token;
        r->lp[r->n_toks] = ev->samples[i].logprob;
        r->top2[r->n_toks] = ev->samples[i].n_top > 1 ? ev->samples[i].top_logprob[1] : -INFINITY;
        r->n_toks++;
    }
    if (ev->type == SRV_SCHED_EV_CHOICE_END) r->finish = ev->finish;
}

typedef struct rq {
    int32_t prompt[128];
    int32_t n_prompt, max_tokens, n_keep;
} rq;

typedef struct run_cfg {
    int32_t n_ctx, kv_blocks, batch_tokens;
    bool context_shift;
    bool no_seq_remove; /* the recompute path only */
} run_cfg;

/* Runs the requests concurrently (greedy, EOS ignored); returns the scheduler's final stats. */
static srv_sched_stats run_sched(eng_model *m, const rq *q, int n, run_cfg cfg, res *out) {
    eng_ctx *c = open_ctx(m, cfg.n_ctx, 16, 8, cfg.kv_blocks, KVC_DTYPE_F32);
    srv_engine_ops ops;
    cr_assert_eq(srv_engine_ops_init(&ops, m, c), SRV_SCHED_OK);
    if (cfg.no_seq_remove) ops.seq_remove = NULL;
    uv_loop_t loop;
    uv_loop_init(&loop);
    srv_sched_params p;
    srv_sched_params_default(&p);
    p.batch_tokens = cfg.batch_tokens;
    p.parallel = 8;
    p.n_ctx = cfg.n_ctx;
    p.context_shift = cfg.context_shift;
    srv_sched *s = NULL;
    cr_assert_eq(srv_sched_create(&p, &ops, &loop, &s), SRV_SCHED_OK);
    int n_done = 0;
    for (int i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].n_done = &n_done;
        srv_sched_request r;
        memset(&r, 0, sizeof r);
        r.prompt = q[i].prompt;
        r.n_prompt = q[i].n_prompt;
        r.n = 1;
        r.max_tokens = q[i].max_tokens;
        r.n_keep = q[i].n_keep;
        eng_sampling_params_default(&r.sampling);
        r.sampling.temperature = 0.0f;
        r.sampling.n_top_logprobs = 2;
        r.ignore_eos = true;
        r.cb = on_event;
        r.user = &out[i];
        uint64_t id;
        cr_assert_eq(srv_sched_submit(s, &r, &id), SRV_SCHED_OK);
    }
    while (n_done < n) uv_run(&loop, UV_RUN_ONCE);
    srv_sched_stats st;
    srv_sched_get_stats(s, &st);
    cr_assert_eq(st.kv_blocks_used, 0);
    srv_sched_free(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&loop), 0);
    char msg[256];
    cr_assert_eq(kvc_check(eng_ctx_cache(c), msg, sizeof msg), KVC_OK, "%s", msg);
    srv_engine_ops_release(&ops);
    eng_ctx_free(c);
    return st;
}

/* The engine driven by hand as the scheduler should: prefill, greedy steps, and when the context (held tokens +
 * the sampled one) reaches n_ctx, eng_seq_remove(keep, keep + (held - keep) / 2). Writes the tokens and their
 * logprobs; returns the number of shifts. */
static int hand_shift(eng_model *m, const rq *q, int32_t n_ctx, res *out) {
    const eng_hparams *hp = eng_model_hparams(m);
    eng_ctx *c = open_ctx(m, n_ctx, 16, 2, 2 * (n_ctx / 16 + 2), KVC_DTYPE_F32);
    kvc_cache *kc = eng_ctx_cache(c);
    eng_sampling_params sp;
    eng_sampling_params_default(&sp);
    sp.temperature = 0.0f;
    sp.n_top_logprobs = 2;
    eng_sampler *smp = NULL;
    cr_assert_eq(eng_sampler_create(&sp, hp->n_vocab, &smp), ENG_OK);
    int32_t seq;
    cr_assert_eq(kvc_seq_alloc(kc, &seq), KVC_OK);
    int32_t li = feed(c, seq, q->prompt, 0, q->n_prompt, 64);
    int32_t held = q->n_prompt, keep = q->n_keep < 0 || q->n_keep > q->n_prompt ? q->n_prompt : q->n_keep;
    int shifts = 0;
    memset(out, 0, sizeof *out);
    for (;;) {
        eng_sample s;
        float *lg = eng_get_logits(c, li);
        for (int32_t t = 0; t < hp->n_vocab; t++) /* as the scheduler's ignore_eos */
            if (eng_token_is_eog(m, t)) lg[t] = -INFINITY;
        cr_assert_eq(eng_sampler_sample(smp, lg, &s), ENG_OK);
        out->toks[out->n_toks] = s.token;
        out->lp[out->n_toks] = s.logprob;
        out->top2[out->n_toks] = s.top_logprob[1];
        out->n_toks++;
        if (out->n_toks >= q->max_tokens) break;
        if (held + 1 >= n_ctx) {
            int32_t nd = (held - keep) / 2;
            cr_assert_geq(nd, 1);
            cr_assert_eq(eng_seq_remove(c, seq, keep, keep + nd), ENG_OK);
            held -= nd;
            shifts++;
        }
        li = feed(c, seq, &s.token, held, 1, 1);
        held++;
    }
    eng_sampler_free(smp);
    eng_ctx_free(c);
    return shifts;
}

/* The context of request q right after its first shift (n_ctx tokens: prompt + the first n_ctx - n_prompt
 * tokens of `got`, minus [keep, keep + nd)), as a prompt; returns its length and the index in `got` of the first
 * token generated after the shift. */
static int32_t kept_after_first_shift(const rq *q, const res *got, int32_t n_ctx, int32_t *kept, int32_t *first) {
    int32_t keep = q->n_keep < 0 || q->n_keep > q->n_prompt ? q->n_prompt : q->n_keep;
    int32_t held = n_ctx - 1, nd = (held - keep) / 2, n = 0;
    for (int32_t i = 0; i < n_ctx; i++) {
        if (i >= keep && i < keep + nd) continue;
        kept[n++] = i < q->n_prompt ? q->prompt[i] : got->toks[i - q->n_prompt];
    }
    *first = n_ctx - q->n_prompt;
    return n;
}

static void random_prompt(rq *q, uint64_t *rs, int32_t n_vocab, int32_t n) {
    q->n_prompt = n;
    q->prompt[0] = 1; /* BOS of the SPM vocabularies */
    for (int32_t i = 1; i < n; i++) q->prompt[i] = 3 + rnd_int(rs, n_vocab - 3);
}

/* stories260K when ../shared has it, else a random 4-layer model (written to dir). */
/* The scheduler tests' model: ../shared's stories260K when present, else one written by `kvserve mkmodel` into
 * dir (a mkdtemp template). dir is left as the template when the shared model is used, so sched_model_drop
 * removes the files only when this test wrote them: a test removes only what it made (issue 30: the old check,
 * "the path starts with /tmp/", deleted ../shared's model when the checkout lived under /tmp). */
static eng_model *sched_model(char *dir, char *path, size_t cap) {
    char buf[1024];
    if (shared_model("stories260K.gguf", buf, sizeof buf)) {
        snprintf(path, cap, "%s", buf);
        return load_model(buf);
    }
    cr_log_warn("stories260K not found in %s/models: a model from kvserve mkmodel instead", kvt_shared_dir());
    cr_assert_not_null(mkdtemp(dir));
    return mk_model(dir, "m.gguf", "--preset tiny --layers 4", path, cap);
}

/* Frees m and removes the model file and its folder only if sched_model made them (dir no longer ends in the
 * template's XXXXXX). */
static void sched_model_drop(eng_model *m, const char *dir, const char *path) {
    eng_model_free(m);
    size_t n = strlen(dir);
    if (n >= 6 && strcmp(dir + n - 6, "XXXXXX") == 0) return; /* not ours */
    remove(path);
    rmdir(dir);
}

/* Regression (issue 30): with ../shared under /tmp, the scheduler tests must leave its model alone. A copy of
 * the shared model in a fresh /tmp folder plays ../shared. */
Test(ctx_shift, shared_model_under_tmp_survives) {
    char src[1024];
    if (!shared_model("stories260K.gguf", src, sizeof src)) cr_skip_test("stories260K not found (KVSERVE_SHARED)");
    char fake[] = "/tmp/kvs_ctxshift_shared_XXXXXX", models[512], copy[600];
    cr_assert_not_null(mkdtemp(fake));
    snprintf(models, sizeof models, "%s/models", fake);
    cr_assert_eq(mkdir(models, 0755), 0);
    snprintf(copy, sizeof copy, "%s/stories260K.gguf", models);
    size_t len = 0;
    char *bytes = kvt_read_file(src, &len);
    cr_assert_not_null(bytes);
    FILE *f = fopen(copy, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(bytes, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
    free(bytes);
    cr_assert_eq(setenv("KVSERVE_SHARED", fake, 1), 0);
    char dir[] = "/tmp/kvs_ctxshift_XXXXXX", path[1024];
    eng_model *m = sched_model(dir, path, sizeof path);
    cr_assert_str_eq(path, copy);
    sched_model_drop(m, dir, path);
    cr_assert_eq(access(copy, R_OK), 0, "the test removed ../shared's model %s", copy);
    remove(copy);
    rmdir(models);
    rmdir(fake);
}

/* In place: the scheduler's tokens and logprobs equal the engine driven by hand, bit for bit, over several
 * shifts and n_keep values; without context_shift (or without max_tokens) the same request stops with "length"
 * at the context size. */
/* Runs q with the context shift in place and checks it against hand_shift bit for bit; returns the shifts. */
static int in_place_vs_hand(eng_model *m, const rq *q, int32_t n_ctx, res *want) {
    res got;
    srv_sched_stats st = run_sched(m, q, 1, (run_cfg){n_ctx, 64, 32, true, false}, &got);
    int shifts = hand_shift(m, q, n_ctx, want);
    cr_log_info("%s: n_ctx %d, prompt %d, n_keep %d: %d tokens, %d shifts", eng_model_hparams(m)->name, n_ctx,
                q->n_prompt, q->n_keep, got.n_toks, shifts);
    cr_assert_gt(shifts, 1);
    cr_assert_eq(got.finish, SRV_SCHED_FINISH_LENGTH);
    cr_assert_eq(got.n_toks, q->max_tokens);
    cr_assert_eq(got.usage.completion_tokens, q->max_tokens);
    cr_assert_eq(st.counters.context_shifts, (uint64_t)shifts);
    cr_assert_eq(st.counters.context_shifts_recomputed, 0);
    for (int32_t i = 0; i < got.n_toks; i++)
        cr_assert(got.toks[i] == want->toks[i] && memcmp(&got.lp[i], &want->lp[i], sizeof(float)) == 0,
                  "n_keep %d token %d: %d (%.9g), by hand %d (%.9g)", q->n_keep, i, got.toks[i], (double)got.lp[i],
                  want->toks[i], (double)want->lp[i]);
    return shifts;
}

Test(ctx_shift, sched_keeps_generating_past_the_context, .timeout = 600) {
    char dir[] = "/tmp/kvs_ctxshift_XXXXXX", path[1024];
    eng_model *m = sched_model(dir, path, sizeof path);
    int32_t n_vocab = eng_model_hparams(m)->n_vocab;
    uint64_t rs = 4242;
    static const int32_t keeps[] = {0, 1, 5, -1};
    for (int k = 0; k < 4; k++) {
        int32_t n_ctx = 40 + rnd_int(&rs, 40);
        rq q;
        random_prompt(&q, &rs, n_vocab, 6 + rnd_int(&rs, 12));
        q.max_tokens = 3 * n_ctx;
        q.n_keep = keeps[k];
        res want;
        in_place_vs_hand(m, &q, n_ctx, &want);
        /* without the shift: "length" when the context is full */
        res off;
        srv_sched_stats st = run_sched(m, &q, 1, (run_cfg){n_ctx, 64, 32, false, false}, &off);
        cr_assert_eq(off.finish, SRV_SCHED_FINISH_LENGTH);
        cr_assert_eq(off.n_toks, n_ctx - q.n_prompt);
        cr_assert_eq(st.counters.context_shifts, 0);
        cr_assert(memcmp(off.toks, want.toks, (size_t)off.n_toks * sizeof(int32_t)) == 0);
        /* with the shift but no max_tokens: no unbounded generation */
        rq q0 = q;
        q0.max_tokens = 0;
        st = run_sched(m, &q0, 1, (run_cfg){n_ctx, 64, 32, true, false}, &off);
        cr_assert_eq(off.finish, SRV_SCHED_FINISH_LENGTH);
        cr_assert_eq(off.n_toks, n_ctx - q.n_prompt);
        cr_assert_eq(st.counters.context_shifts, 0);
    }
    /* nothing to discard (n_keep covers the whole context): "length" */
    rq q;
    random_prompt(&q, &rs, n_vocab, 30);
    q.max_tokens = 100;
    q.n_keep = -1;
    res got;
    srv_sched_stats st = run_sched(m, &q, 1, (run_cfg){32, 64, 32, true, false}, &got);
    cr_assert_eq(got.finish, SRV_SCHED_FINISH_LENGTH);
    cr_assert_eq(got.n_toks, 2);
    cr_assert_eq(st.counters.context_shifts, 0);
    sched_model_drop(m, dir, path);
}

/* After the first shift, a request continues as a fresh request whose prompt is the kept tokens: bit for bit on
 * the recompute path (which prefills exactly that), and within float tolerance in place on a one-layer model
 * (whose K/V depend only on token and position, so the shifted cache is a fresh prefill up to rounding). */
Test(ctx_shift, sched_after_shift_equals_fresh_prompt, .timeout = 600) {
    char dir[] = "/tmp/kvs_ctxshift_XXXXXX", path[1024], d1[] = "/tmp/kvs_ctxshift1_XXXXXX", p1[512];
    eng_model *m = sched_model(dir, path, sizeof path);
    cr_assert_not_null(mkdtemp(d1));
    eng_model *one = mk_model(d1, "one.gguf", "--preset tiny --arch qwen2 --layers 1 --std 0.2", p1, sizeof p1);
    uint64_t rs = 99;
    double worst = 0;
    int near_ties = 0;
    for (int round = 0; round < 6; round++) {
        bool in_place = round % 2 == 1;
        eng_model *mm = in_place ? one : m;
        int32_t n_vocab = eng_model_hparams(mm)->n_vocab, n_ctx = 32 + rnd_int(&rs, 48);
        rq q;
        random_prompt(&q, &rs, n_vocab, 4 + rnd_int(&rs, 16));
        q.max_tokens = 2 * n_ctx;
        q.n_keep = rnd_int(&rs, q.n_prompt + 1);
        res got, fresh;
        srv_sched_stats st = run_sched(mm, &q, 1, (run_cfg){n_ctx, 64, 24, true, !in_place}, &got);
        cr_assert_eq(got.n_toks, q.max_tokens);
        cr_assert_gt(st.counters.context_shifts, 0);
        cr_assert_eq(st.counters.context_shifts_recomputed, in_place ? 0 : st.counters.context_shifts);
        rq f;
        int32_t first;
        f.n_prompt = kept_after_first_shift(&q, &got, n_ctx, f.prompt, &first);
        f.n_keep = 0;
        /* the fresh request generates until its own context is full: the tokens up to the next shift */
        f.max_tokens = n_ctx - f.n_prompt;
        run_sched(mm, &f, 1, (run_cfg){n_ctx, 64, 24, false, false}, &fresh);
        cr_assert_eq(fresh.n_toks, f.max_tokens);
        for (int32_t i = 0; i < fresh.n_toks; i++) {
            int32_t g = first + i;
            if (!in_place) {
                cr_assert(got.toks[g] == fresh.toks[i] && memcmp(&got.lp[g], &fresh.lp[i], sizeof(float)) == 0,
                          "recompute path, token %d after the shift: %d (%.9g), fresh %d (%.9g)", i, got.toks[g],
                          (double)got.lp[g], fresh.toks[i], (double)fresh.lp[i]);
                continue;
            }
            if (got.toks[g] != fresh.toks[i]) {
                /* only a near tie may go the other way; the sequences then diverge */
                cr_assert_lt(fabs((double)fresh.lp[i] - (double)fresh.top2[i]), 1e-3,
                             "in place, token %d after the shift: %d, fresh %d (no near tie: %.9g vs %.9g)", i,
                             got.toks[g], fresh.toks[i], (double)fresh.lp[i], (double)fresh.top2[i]);
                near_ties++;
                break;
            }
            double d = fabs((double)got.lp[g] - (double)fresh.lp[i]);
            if (d > worst) worst = d;
            cr_assert_lt(d, 1e-4, "in place, token %d after the shift: logprob %.9g, fresh %.9g", i, (double)got.lp[g],
                         (double)fresh.lp[i]);
        }
    }
    cr_log_info("in place on one layer: worst logprob difference %.3g, %d near ties", worst, near_ties);
    eng_model_free(one);
    remove(p1);
    rmdir(d1);
    sched_model_drop(m, dir, path);
}

/* Shifting requests in a pool small enough to preempt: on the recompute path every request equals itself run
 * alone, bit for bit (a preempted shifted request recomputes exactly its kept context); in place every request
 * still generates all its tokens and the cache stays consistent. */
Test(ctx_shift, sched_shift_under_preemption, .timeout = 600) {
    char dir[] = "/tmp/kvs_ctxshift_XXXXXX", path[1024];
    eng_model *m = sched_model(dir, path, sizeof path);
    int32_t n_vocab = eng_model_hparams(m)->n_vocab;
    uint64_t rs = 2024;
    enum { NR = 5 };
    rq q[NR];
    const int32_t n_ctx = 64;
    for (int i = 0; i < NR; i++) {
        random_prompt(&q[i], &rs, n_vocab, 5 + rnd_int(&rs, 30));
        q[i].max_tokens = 60 + rnd_int(&rs, 80);
        q[i].n_keep = rnd_int(&rs, 8);
    }
    res together[NR], alone;
    /* 12 blocks of 16 for 5 sequences of up to 64 tokens */
    srv_sched_stats st = run_sched(m, q, NR, (run_cfg){n_ctx, 12, 32, true, true}, together);
    cr_assert_gt(st.counters.preemptions, 0, "the small pool never preempted");
    cr_assert_gt(st.counters.context_shifts, 0);
    for (int i = 0; i < NR; i++) {
        run_sched(m, &q[i], 1, (run_cfg){n_ctx, 64, 32, true, true}, &alone);
        cr_assert_eq(together[i].n_toks, q[i].max_tokens);
        cr_assert(memcmp(together[i].toks, alone.toks, (size_t)alone.n_toks * sizeof(int32_t)) == 0 &&
                      memcmp(together[i].lp, alone.lp, (size_t)alone.n_toks * sizeof(float)) == 0,
                  "request %d differs from its run alone", i);
    }
    st = run_sched(m, q, NR, (run_cfg){n_ctx, 12, 32, true, false}, together);
    cr_log_info("in place under preemption: %llu preemptions, %llu shifts (%llu recomputed)",
                (unsigned long long)st.counters.preemptions, (unsigned long long)st.counters.context_shifts,
                (unsigned long long)st.counters.context_shifts_recomputed);
    cr_assert_gt(st.counters.preemptions, 0);
    for (int i = 0; i < NR; i++) {
        cr_assert_eq(together[i].n_toks, q[i].max_tokens);
        cr_assert_eq(together[i].finish, SRV_SCHED_FINISH_LENGTH);
    }
    sched_model_drop(m, dir, path);
}

/* The families with their own rope: gemma3 (sliding layers with rope base 10000 and a window of 16, so the window
 * matters past the shift; global layers with 1e6) and phi3 (rope frequency factors): the scheduler's in-place shift
 * equals the engine driven by hand, bit for bit. */
Test(ctx_shift, sched_shift_on_gemma3_and_phi3, .timeout = 600) {
    static const char *const rel[] = {"families/syn-gemma3-q8_0.gguf", "families/syn-phi3-q8_0.gguf"};
    char buf[1024];
    int found = 0;
    uint64_t rs = 316;
    for (int i = 0; i < 2; i++) {
        if (!shared_model(rel[i], buf, sizeof buf)) {
            cr_log_warn("SKIPPED: %s not found in %s/models", rel[i], kvt_shared_dir());
            continue;
        }
        found++;
        eng_model *m = load_model(buf);
        rq q;
        random_prompt(&q, &rs, eng_model_hparams(m)->n_vocab, 8 + rnd_int(&rs, 10));
        int32_t n_ctx = 40 + rnd_int(&rs, 16);
        q.max_tokens = 2 * n_ctx + 10;
        q.n_keep = 1 + rnd_int(&rs, 4);
        res want;
        in_place_vs_hand(m, &q, n_ctx, &want);
        eng_model_free(m);
    }
    if (!found) cr_skip_test("no family model found in %s/models (KVSERVE_SHARED)", kvt_shared_dir());
}
