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
 *    "read_gb_s":..., "decode_bytes_per_token":..., "decode_limit_tok_s":...} (the last three on the CPU only)
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

static void bench_usage(FILE *f) {
    fprintf(f, "usage: kvserve bench -m MODEL [-p 128] [-n 64] [-b 1,4,16,32] [--threads N] [--device D] [--json]\n"
               "  -m, --model FILE   GGUF model\n"
               "  -p N               prompt length for the prefill measurement (default 128)\n"
               "  -n N               tokens each sequence decodes (default 64)\n"
               "  -b LIST            numbers of sequences decoding together (default 1,4,16,32; each <= %d)\n"
               "  --threads N        worker threads (default: the number of cores)\n"
               "  --device D         auto (default: the GPU when there is one), cpu or cuda\n"
               "  --json             one JSON object instead of a table\n", MAX_B);
}

static int parse_list(const char *s, int *out, int cap, int *n) {
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 1 || v > MAX_B || *n >= cap) return -1;
        out[(*n)++] = (int)v;
        if (*end == ',') end++;
        else if (*end) return -1;
        p = end;
    }
    return *n > 0 ? 0 : -1;
}

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

int kvs_cmd_bench(int argc, char **argv) {
    const char *model_path = NULL;
    long p = 128, n = 64, threads = 0;
    int device = ENG_DEVICE_AUTO;
    int bl[16] = {1, 4, 16, 32}, nb = 4;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
            continue;
        } else if (!v) ok = false;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "-p")) ok = kvs_parse_long(v, 1, 8192, &p);
        else if (!strcmp(a, "-n")) ok = kvs_parse_long(v, 1, 8192, &n);
        else if (!strcmp(a, "-b")) ok = parse_list(v, bl, 16, &nb) == 0;
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) ok = kvs_parse_long(v, 1, 1024, &threads);
        else if (!strcmp(a, "--device")) ok = kvs_parse_device(v, &device);
        else {
            fprintf(stderr, "kvserve bench: unknown option '%s'\n", a);
            bench_usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "kvserve bench: bad or missing value for %s\n", a);
            return 2;
        }
        i++;
    }
    if (!model_path) {
        bench_usage(stderr);
        return 2;
    }
    int max_b = 1;
    for (int i = 0; i < nb; i++)
        if (bl[i] > max_b) max_b = bl[i];

    char err[512];
    eng_model *model = NULL;
    eng_ctx *ctx = NULL;
    int status = 1;
    int32_t *tok = NULL, *pos = NULL, *seq = NULL;
    bool *want = NULL;
    double dec[16] = {0};
    if (eng_model_load(model_path, NULL, &model, err, sizeof err) != 0) {
        fprintf(stderr, "kvserve bench: %s\n", err);
        return 1;
    }
    const eng_hparams *hp = eng_model_hparams(model);
    int32_t n_ctx = (int32_t)(p + n);
    if (n_ctx > hp->n_ctx_train) {
        fprintf(stderr, "kvserve bench: -p/-n exceed the model context %d\n", hp->n_ctx_train);
        goto done;
    }
    eng_ctx_params cp;
    eng_ctx_params_default(&cp);
    cp.n_threads = (int32_t)threads;
    cp.device = (eng_device)device;
    cp.n_ctx = n_ctx;
    cp.max_seqs = max_b;
    cp.max_batch_tokens = (int32_t)(p > max_b ? p : max_b);
    cp.prefix_caching = false;
    if (eng_ctx_create(model, &cp, &ctx, err, sizeof err) != 0) {
        fprintf(stderr, "kvserve bench: %s\n", err);
        goto done;
    }
    size_t rss_load = proc_kb_field("/proc/self/status", "VmRSS:");
    size_t rss_peak = proc_kb_field("/proc/self/status", "VmHWM:");
    size_t huge_load = proc_kb_field("/proc/self/smaps_rollup", "AnonHugePages:");
    size_t mb = (size_t)cp.max_batch_tokens;
    tok = malloc(mb * sizeof *tok);
    pos = malloc(mb * sizeof *pos);
    seq = malloc(mb * sizeof *seq);
    want = malloc(mb * sizeof *want);
    if (!tok || !pos || !seq || !want) goto done;

    if (run_prefill(ctx, tok, pos, seq, want, (int32_t)p, hp->n_vocab) < 0) goto done; /* warm-up */
    double tp = run_prefill(ctx, tok, pos, seq, want, (int32_t)p, hp->n_vocab);
    if (tp < 0) goto done;
    double prefill_tok_s = (double)p / tp;
    for (int i = 0; i < nb; i++) {
        double t = run_decode(ctx, tok, pos, seq, want, bl[i], (int32_t)p, (int32_t)n, hp->n_vocab);
        if (t < 0) goto done;
        dec[i] = (double)bl[i] * (double)n / t;
    }
    /* after the timed runs (its buffer is not in the RSS figures); CPU contexts only */
    const bool on_gpu = eng_ctx_device(ctx) == ENG_DEVICE_CUDA;
    const double bw = on_gpu ? 0 : read_bandwidth(eng_ctx_n_threads(ctx));
    const double dbytes = on_gpu ? 0 : (double)eng_model_decode_bytes(model);

    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", hp->name);
        cJSON_AddNumberToObject(o, "threads", eng_ctx_n_threads(ctx));
        cJSON_AddStringToObject(o, "device", on_gpu ? "cuda" : "cpu");
        char gpu[256];
        if (on_gpu && cud_available(gpu, sizeof gpu) > 0) cJSON_AddStringToObject(o, "gpu", gpu);
        cJSON_AddNumberToObject(o, "prefill_tokens", (double)p);
        cJSON_AddNumberToObject(o, "prefill_tok_s", prefill_tok_s);
        cJSON_AddNumberToObject(o, "decode_tokens", (double)n);
        cJSON_AddNumberToObject(o, "rss_after_load_bytes", (double)rss_load);
        cJSON_AddNumberToObject(o, "rss_peak_bytes", (double)rss_peak);
        cJSON_AddNumberToObject(o, "huge_pages_after_load_bytes", (double)huge_load);
        if (bw > 0 && dbytes > 0) {
            cJSON_AddNumberToObject(o, "read_gb_s", bw / 1e9);
            cJSON_AddNumberToObject(o, "decode_bytes_per_token", dbytes);
            cJSON_AddNumberToObject(o, "decode_limit_tok_s", bw / dbytes);
        }
        cJSON *arr = cJSON_AddArrayToObject(o, "decode");
        for (int i = 0; i < nb; i++) {
            cJSON *d = cJSON_CreateObject();
            cJSON_AddNumberToObject(d, "sequences", bl[i]);
            cJSON_AddNumberToObject(d, "tok_s", dec[i]);
            cJSON_AddItemToArray(arr, d);
        }
        char *s = cJSON_PrintUnformatted(o);
        if (s) printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
    } else {
        printf("model: %s (%s, %.1f MB of weights), %d thread(s), device %s\n", hp->name, hp->arch_name,
               (double)eng_model_weight_bytes(model) / 1e6, eng_ctx_n_threads(ctx),
               on_gpu ? "cuda" : "cpu");
        printf("resident memory after load: %.1f MB (peak %.1f MB)\n", (double)rss_load / 1e6, (double)rss_peak / 1e6);
        if (bw > 0 && dbytes > 0)
            printf("read bandwidth %.1f GB/s (%d threads); a decode step reads %.1f MB of weights: at most %.1f tok/s "
                   "for one sequence\n", bw / 1e9, eng_ctx_n_threads(ctx), dbytes / 1e6, bw / dbytes);
        printf("%-28s %12s\n", "test", "tok/s");
        char label[64];
        snprintf(label, sizeof label, "prefill %ld tokens", p);
        printf("%-28s %12.1f\n", label, prefill_tok_s);
        for (int i = 0; i < nb; i++) {
            snprintf(label, sizeof label, "decode %ld x %d sequence%s", n, bl[i], bl[i] > 1 ? "s" : "");
            printf("%-28s %12.1f\n", label, dec[i]);
        }
    }
    status = 0;
done:
    free(tok);
    free(pos);
    free(seq);
    free(want);
    eng_ctx_free(ctx);
    eng_model_free(model);
    return status;
}
