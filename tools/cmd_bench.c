/*
 * cmd_bench.c: `kvserve bench -m MODEL [-p 128] [-n 64] [-b 1,4,16,32] [--threads N] [--device D] [--json]`
 *
 * Measures the CPU engine: prefill speed for a P-token prompt (one batch, after an untimed warm-up prefill),
 * then for each B the aggregate decode speed of B sequences decoding together (one token each per batch) for
 * N tokens each. As llama.cpp's llama-batched-bench does, every sequence first gets its own P-token prompt
 * (untimed), so the timed decode steps attend over contexts of P..P+N-1 tokens. Token ids are fixed
 * pseudo-random values (the speed does not depend on them). Output: a table, or with --json one object
 *   {"model":..., "threads":..., "device":"cpu"|"cuda", ["gpu":NAME,] "prefill_tokens":P, "prefill_tok_s":...,
 *    "decode":[{"sequences":B,"tok_s":...}], "rss_after_load_bytes":..., "rss_peak_bytes":...,
 *    "huge_pages_after_load_bytes":...,
 *    "read_gb_s":..., "decode_bytes_per_token":..., "decode_limit_tok_s":...} (GPU: bandwidth of a device-to-device copy)
 * Also (both outputs) the read bandwidth of the machine: the best of BW_ROUNDS rounds in which the context's threads
 * each sum their part of a BW_BYTES buffer (larger than the caches), "read_gb_s"; the matrix bytes one decode step of
 * one sequence reads, "decode_bytes_per_token" (eng_model_decode_bytes: packed sizes); and their quotient
 * "decode_limit_tok_s", the speed single-sequence decoding could reach if streaming the weights were all it did.
 * RSS after load: the process's resident memory (VmRSS of /proc/self/status) once the model is loaded and the
 * context created (the CPU weights repacked, their mapped pages released), before any batch runs; the peak
 * (VmHWM) at the same moment; and how much of it is in transparent huge pages ("huge_pages_after_load_bytes",
 * AnonHugePages of /proc/self/smaps_rollup: the repacked weights ask for them). All are 0 where /proc is absent.
 *
 *
 * Unlike `generate` and `serve`, bench drives eng_decode with its own loop, on purpose: it measures the
 * engine alone (fixed batch shapes, no scheduler, sampling or detokenizing in the timed region). The
 * scheduler's own overhead is measured end to end by bench/loadgen.mjs against `serve`.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine/engine.h"
#include "engine/gpu_backend.h"
#include "tools/cli.h"
#include "tools/commands.h"

enum { MAX_B = 64 };

/* The kB figure after key in a /proc file ("VmRSS:" in /proc/self/status), in bytes; 0 when absent. */
static size_t proc_kb_field(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t v = 0, klen = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) == 0) {
            v = (size_t)strtoull(line + klen, NULL, 10) * 1024;
            break;
        }
    }
    fclose(f);
    return v;
}

/* ---- read bandwidth ------------------------------------------------------------------------------------- */
enum { BW_BYTES = 256 << 20, BW_ROUNDS = 5, BW_MAX_THREADS = 256 };
typedef unsigned long long bw_vec __attribute__((vector_size(16)));

typedef struct bw_arg {
    const bw_vec *p;        /* this thread's part */
    size_t n;               /* its vectors (a multiple of 4) */
    unsigned long long sum; /* kept so that the loads are not optimized away */
} bw_arg;

static void *bw_worker(void *v) {
    bw_arg *a = v;
    bw_vec s0 = {0, 0}, s1 = s0, s2 = s0, s3 = s0; /* four chains, 64 bytes per iteration */
    for (size_t i = 0; i < a->n; i += 4) {
        s0 += a->p[i];
        s1 += a->p[i + 1];
        s2 += a->p[i + 2];
        s3 += a->p[i + 3];
    }
    bw_vec s = s0 + s1 + s2 + s3;
    a->sum += s[0] + s[1];
    return NULL;
}

/* Bytes per second that nth threads read together from a buffer larger than the caches (each its own part; the
 * best of BW_ROUNDS rounds, wall time from starting the threads to joining them), or 0 when it cannot be
 * measured (out of memory, threads that cannot start). */
static double read_bandwidth(int nth) {
    if (nth < 1 || nth > BW_MAX_THREADS) return 0;
    bw_vec *buf = aligned_alloc(64, BW_BYTES);
    if (!buf) return 0;
    memset(buf, 1, BW_BYTES);
    const size_t nv = BW_BYTES / sizeof(bw_vec);
    bw_arg args[BW_MAX_THREADS];
    pthread_t th[BW_MAX_THREADS];
    size_t bytes = 0;
    for (int i = 0; i < nth; i++) {
        size_t b = nv * (size_t)i / (size_t)nth / 4 * 4, e = nv * (size_t)(i + 1) / (size_t)nth / 4 * 4;
        args[i] = (bw_arg){buf + b, e - b, 0};
        bytes += (e - b) * sizeof(bw_vec);
    }
    double best = 0;
    bool ok = true;
    for (int r = 0; r < BW_ROUNDS && ok; r++) {
        double t0 = kvs_now_s();
        int started = 1;
        for (; started < nth; started++)
            if (pthread_create(&th[started], NULL, bw_worker, &args[started]) != 0) break;
        bw_worker(&args[0]);
        for (int i = 1; i < started; i++) pthread_join(th[i], NULL);
        double t = kvs_now_s() - t0;
        ok = started == nth;
        if (best == 0 || t < best) best = t;
    }
    unsigned long long sum = 0;
    for (int i = 0; i < nth; i++) sum += args[i].sum;
    free(buf);
    return ok && best > 0 && sum != 0 ? (double)bytes / best : 0;
}

typedef struct bench_list { int v[16]; int n; } bench_list;

typedef struct bench_opts {
    const char *model;
    long p, n, threads;
    int device;
    bench_list b;
    bool json;
} bench_opts;

/* -b: a comma-separated list of 1..16 sequence counts, each in 1..MAX_B */
static bool set_list(void *field, const char *s) {
    bench_list *l = field, r = {.n = 0};
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 1 || v > MAX_B || r.n >= 16) return false;
        r.v[r.n++] = (int)v;
        if (*end == ',') end++;
        else if (*end) return false;
        p = end;
    }
    if (r.n == 0) return false;
    *l = r;
    return true;
}

#define O(f) offsetof(bench_opts, f)
static const kvs_opt bench_opts_table[] = {
    {"--model", "-m", KVS_OPT_STR, O(model), .arg = "FILE", .help = "GGUF model"},
    {"-p", NULL, KVS_OPT_LONG, O(p), 1, 8192, .arg = "N", .help = "prompt length for the prefill measurement (default 128)"},
    {"-n", NULL, KVS_OPT_LONG, O(n), 1, 8192, .arg = "N", .help = "tokens each sequence decodes (default 64)"},
    {"-b", NULL, KVS_OPT_SET, O(b), .set = set_list, .expect = "a comma-separated list of integers in 1..64",
     .arg = "LIST", .help = "numbers of sequences decoding together (default 1,4,16,32; each <= 64)"},
    KVS_OPT_THREADS(bench_opts, threads),
    KVS_OPT_DEVICE(bench_opts, device),
    {"--json", NULL, KVS_OPT_FLAG, O(json), .flag_value = true, .help = "one JSON object instead of a table"},
};
#undef O
static const kvs_cli bench_cli = {
    "bench", "-m MODEL [-p 128] [-n 64] [-b 1,4,16,32] [--threads N] [--device D] [--json]", NULL, NULL,
    bench_opts_table, sizeof bench_opts_table / sizeof bench_opts_table[0], 0,
};

/* Fills a batch with sequence s's p-token prompt (ids depend on salt, so sequences differ). */
static eng_batch prompt_batch(int32_t *tok, int32_t *pos, int32_t *seq, bool *want, int32_t p, int32_t s,
                              uint32_t salt, int32_t n_vocab) {
    for (int32_t i = 0; i < p; i++) {
        tok[i] = (int32_t)(((uint32_t)i * 2654435761u + 17u + salt * 40503u) % (uint32_t)n_vocab);
        pos[i] = i;
        seq[i] = s;
        want[i] = i == p - 1;
    }
    return (eng_batch){p, tok, pos, seq, want, NULL};
}

/* Prefills a p-token prompt into a fresh sequence; returns seconds, or < 0 on error. */
static double run_prefill(eng_ctx *ctx, int32_t *tok, int32_t *pos, int32_t *seq, bool *want, int32_t p, int32_t n_vocab) {
    kvc_cache *kv = eng_ctx_cache(ctx);
    int32_t s;
    if (kvc_seq_alloc(kv, &s) != 0) return -1;
    eng_batch b = prompt_batch(tok, pos, seq, want, p, s, 0, n_vocab);
    double t0 = kvs_now_s();
    int rc = eng_decode(ctx, &b);
    double t = kvs_now_s() - t0;
    kvc_seq_free(kv, s);
    if (rc != 0) {
        fprintf(stderr, "kvserve bench: prefill failed: %s\n", kvs_strerror(rc));
        return -1;
    }
    return t;
}

/* B sequences each get a p-token prompt (untimed), then decode `steps` tokens together at positions
 * p..p+steps-1; returns the seconds of the decode steps, or < 0 on error. */
static double run_decode(eng_ctx *ctx, int32_t *tok, int32_t *pos, int32_t *seq, bool *want, int b, int32_t p,
                         int32_t steps, int32_t n_vocab) {
    kvc_cache *kv = eng_ctx_cache(ctx);
    int32_t ids[MAX_B];
    double t = -1;
    int n_alloc = 0;
    for (; n_alloc < b; n_alloc++)
        if (kvc_seq_alloc(kv, &ids[n_alloc]) != 0) goto out;
    for (int i = 0; i < b; i++) {
        eng_batch pb = prompt_batch(tok, pos, seq, want, p, ids[i], (uint32_t)i + 1, n_vocab);
        int rc = eng_decode(ctx, &pb);
        if (rc != 0) {
            fprintf(stderr, "kvserve bench: prefill of sequence %d failed: %s\n", i, kvs_strerror(rc));
            goto out;
        }
    }
    t = 0;
    for (int32_t step = 0; step < steps; step++) {
        for (int i = 0; i < b; i++) {
            tok[i] = (int32_t)(((uint32_t)(step * 31 + i) * 2654435761u) % (uint32_t)n_vocab);
            pos[i] = p + step;
            seq[i] = ids[i];
            want[i] = true;
        }
        eng_batch bt = {b, tok, pos, seq, want, NULL};
        double t0 = kvs_now_s();
        int rc = eng_decode(ctx, &bt);
        if (rc != 0) {
            fprintf(stderr, "kvserve bench: decode failed: %s\n", kvs_strerror(rc));
            t = -1;
            goto out;
        }
        t += kvs_now_s() - t0;
    }
out:
    for (int i = 0; i < n_alloc; i++) kvc_seq_free(kv, ids[i]);
    return t;
}

/* What one run measured, for print_report. */
typedef struct bench_result {
    const char *name, *arch;
    double weight_bytes;
    int threads;
    bool on_gpu;
    size_t rss_load, rss_peak, huge_load;
    double prefill_tok_s;
    double dec[16];              /* [b.n] aggregate decode tok/s per entry of -b */
    double bw, dbytes;           /* read bandwidth (bytes/s) and decode bytes per token; 0 when not measured */
} bench_result;

static void print_json(const bench_opts *o, const bench_result *r) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", r->name);
    cJSON_AddNumberToObject(j, "threads", r->threads);
    cJSON_AddStringToObject(j, "device", r->on_gpu ? "cuda" : "cpu");
    char gpu[256];
    if (r->on_gpu && cud_available(gpu, sizeof gpu) > 0) cJSON_AddStringToObject(j, "gpu", gpu);
    cJSON_AddNumberToObject(j, "prefill_tokens", (double)o->p);
    cJSON_AddNumberToObject(j, "prefill_tok_s", r->prefill_tok_s);
    cJSON_AddNumberToObject(j, "decode_tokens", (double)o->n);
    cJSON_AddNumberToObject(j, "rss_after_load_bytes", (double)r->rss_load);
    cJSON_AddNumberToObject(j, "rss_peak_bytes", (double)r->rss_peak);
    cJSON_AddNumberToObject(j, "huge_pages_after_load_bytes", (double)r->huge_load);
    if (r->bw > 0 && r->dbytes > 0) {
        cJSON_AddNumberToObject(j, "read_gb_s", r->bw / 1e9);
        cJSON_AddNumberToObject(j, "decode_bytes_per_token", r->dbytes);
        cJSON_AddNumberToObject(j, "decode_limit_tok_s", r->bw / r->dbytes);
    }
    cJSON *arr = cJSON_AddArrayToObject(j, "decode");
    for (int i = 0; i < o->b.n; i++) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddNumberToObject(d, "sequences", o->b.v[i]);
        cJSON_AddNumberToObject(d, "tok_s", r->dec[i]);
        cJSON_AddItemToArray(arr, d);
    }
    char *s = cJSON_PrintUnformatted(j);
    if (s) printf("%s\n", s);
    free(s);
    cJSON_Delete(j);
}

static void print_table(const bench_opts *o, const bench_result *r) {
    printf("model: %s (%s, %.1f MB of weights), %d thread(s), device %s\n", r->name, r->arch, r->weight_bytes / 1e6,
           r->threads, r->on_gpu ? "cuda" : "cpu");
    printf("resident memory after load: %.1f MB (peak %.1f MB)\n", (double)r->rss_load / 1e6, (double)r->rss_peak / 1e6);
    if (r->bw > 0 && r->dbytes > 0)
        printf("read bandwidth %.1f GB/s (%d threads); a decode step reads %.1f MB of weights: at most %.1f tok/s "
               "for one sequence\n", r->bw / 1e9, r->threads, r->dbytes / 1e6, r->bw / r->dbytes);
    printf("%-28s %12s\n", "test", "tok/s");
    char label[64];
    snprintf(label, sizeof label, "prefill %ld tokens", o->p);
    printf("%-28s %12.1f\n", label, r->prefill_tok_s);
    for (int i = 0; i < o->b.n; i++) {
        snprintf(label, sizeof label, "decode %ld x %d sequence%s", o->n, o->b.v[i], o->b.v[i] > 1 ? "s" : "");
        printf("%-28s %12.1f\n", label, r->dec[i]);
    }
}

/* The timed runs on a created context: the prefill (after a warm-up), then each -b entry; then the read
 * bandwidth (the CPU's read loop, or the GPU's device-to-device copy; after the timed runs: its buffer is not in
 * the RSS figures). 0, or -1 (printed). */
static int run_all(const bench_opts *o, const eng_model *model, eng_ctx *ctx, int32_t max_batch, bench_result *r) {
    const eng_hparams *hp = eng_model_hparams(model);
    size_t mb = (size_t)max_batch;
    int32_t *tok = malloc(mb * sizeof *tok), *pos = malloc(mb * sizeof *pos), *seq = malloc(mb * sizeof *seq);
    bool *want = malloc(mb * sizeof *want);
    int rc = -1;
    if (!tok || !pos || !seq || !want) goto done;
    if (run_prefill(ctx, tok, pos, seq, want, (int32_t)o->p, hp->n_vocab) < 0) goto done; /* warm-up */
    double tp = run_prefill(ctx, tok, pos, seq, want, (int32_t)o->p, hp->n_vocab);
    if (tp < 0) goto done;
    r->prefill_tok_s = (double)o->p / tp;
    for (int i = 0; i < o->b.n; i++) {
        double t = run_decode(ctx, tok, pos, seq, want, o->b.v[i], (int32_t)o->p, (int32_t)o->n, hp->n_vocab);
        if (t < 0) goto done;
        r->dec[i] = (double)o->b.v[i] * (double)o->n / t;
    }
    r->on_gpu = eng_ctx_device(ctx) == ENG_DEVICE_CUDA;
    /* GPU: the bytes per second of a device-to-device copy (cud_measure_bandwidth) */
    if (!r->on_gpu) r->bw = read_bandwidth(eng_ctx_n_threads(ctx));
    else if (cud_measure_bandwidth(0, &r->bw) != 0) r->bw = 0;
    r->dbytes = (double)eng_model_decode_bytes(model);
    rc = 0;
done:
    free(tok);
    free(pos);
    free(seq);
    free(want);
    return rc;
}

int kvs_cmd_bench(int argc, char **argv) {
    bench_opts o = {.p = 128, .n = 64, .device = ENG_DEVICE_AUTO, .b = {{1, 4, 16, 32}, 4}};
    int prc = kvs_cli_parse(&bench_cli, &o, argc, argv, NULL, NULL);
    if (prc) return prc == 1 ? 0 : 2;
    if (!o.model) {
        kvs_cli_usage(&bench_cli, stderr);
        return 2;
    }
    int max_b = 1;
    for (int i = 0; i < o.b.n; i++)
        if (o.b.v[i] > max_b) max_b = o.b.v[i];

    char err[512];
    eng_model *model = NULL;
    eng_ctx *ctx = NULL;
    int status = 1;
    if (eng_model_load(o.model, NULL, &model, err, sizeof err) != 0) {
        fprintf(stderr, "kvserve bench: %s\n", err);
        return 1;
    }
    const eng_hparams *hp = eng_model_hparams(model);
    int32_t n_ctx = (int32_t)(o.p + o.n);
    if (n_ctx > hp->n_ctx_train) {
        fprintf(stderr, "kvserve bench: -p/-n exceed the model context %d\n", hp->n_ctx_train);
        goto done;
    }
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_threads = (int32_t)o.threads;
    cp.device = (eng_device)o.device;
    cp.n_ctx = n_ctx;
    cp.max_seqs = max_b;
    cp.max_batch_tokens = (int32_t)(o.p > max_b ? o.p : max_b);
    cp.prefix_caching = false;
    if (eng_ctx_create(model, &cp, &ctx, err, sizeof err) != 0) {
        fprintf(stderr, "kvserve bench: %s\n", err);
        goto done;
    }
    bench_result r = {.name = hp->name, .arch = hp->arch_name, .weight_bytes = (double)eng_model_weight_bytes(model),
                      .threads = eng_ctx_n_threads(ctx)};
    r.rss_load = proc_kb_field("/proc/self/status", "VmRSS:");
    r.rss_peak = proc_kb_field("/proc/self/status", "VmHWM:");
    r.huge_load = proc_kb_field("/proc/self/smaps_rollup", "AnonHugePages:");
    if (run_all(&o, model, ctx, cp.max_batch_tokens, &r) != 0) goto done;
    if (o.json) print_json(&o, &r);
    else print_table(&o, &r);
    status = 0;
done:
    eng_ctx_free(ctx);
    eng_model_free(model);
    return status;
}
