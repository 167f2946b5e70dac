/* metrics.c: Prometheus text exposition (see obs.h). */
#include "server/obs/obs.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


void srv_metrics_histogram_init(srv_metrics_histogram *h, const double *bounds, int32_t n) {
    memset(h, 0, sizeof *h);
    if (n > SRV_METRICS_HIST_MAX_BUCKETS) n = SRV_METRICS_HIST_MAX_BUCKETS;
    if (n < 0) n = 0;
    for (int32_t i = 0; i < n; i++) h->bounds[i] = bounds[i];
    h->n_bounds = n;
}

void srv_metrics_histogram_observe(srv_metrics_histogram *h, double v) {
    if (isnan(v)) return;
    int32_t i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

static const double TTFT_B[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                                7.5, 10.0, 20.0, 40.0, 80.0};
static const double ITL_B[] = {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
                               0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5};
static const double E2E_B[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                               120.0, 240.0, 480.0, 960.0, 1920.0};
static const double LEN_B[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000,
                               100000};

#define NB(a) ((int32_t)(sizeof a / sizeof a[0]))

void srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    srv_metrics_histogram_init(&m->ttft, TTFT_B, NB(TTFT_B));
    srv_metrics_histogram_init(&m->itl, ITL_B, NB(ITL_B));
    srv_metrics_histogram_init(&m->e2e, E2E_B, NB(E2E_B));
    srv_metrics_histogram_init(&m->queue, E2E_B, NB(E2E_B));
    srv_metrics_histogram_init(&m->prompt_len, LEN_B, NB(LEN_B));
    srv_metrics_histogram_init(&m->gen_len, LEN_B, NB(LEN_B));
}

void srv_metrics_count_http(srv_metrics *m, int status) {
    int c = status / 100 - 1;
    if (c >= 0 && c < SRV_METRICS_STATUS_CLASSES) m->http_requests[c]++;
}

/* Prometheus float formatting: integers without exponent noise, +Inf/-Inf/NaN spelled out. */
static void fmt_num(char *s, size_t n, double v) {
    if (isnan(v)) snprintf(s, n, "NaN");
    else if (isinf(v)) snprintf(s, n, v > 0 ? "+Inf" : "-Inf");
    else snprintf(s, n, "%.17g", v);
}

static void meta(kvs_buf *b, const char *name, const char *type, const char *help) {
    kvs_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* labels: "" or the inside of {...} without braces, already escaped */
static void sample(kvs_buf *b, const char *name, const char *labels, const char *value) {
    kvs_buf_printf(b, "%s%s%s%s %s\n", name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "", value);
}

static void gauge_l(kvs_buf *b, const char *name, const char *help, const char *labels, double v) {
    char s[64];
    fmt_num(s, sizeof s, v);
    meta(b, name, "gauge", help);
    sample(b, name, labels, s);
}

static void counter_l(kvs_buf *b, const char *name, const char *help, const char *labels, uint64_t v) {
    char s[32];
    snprintf(s, sizeof s, "%llu", (unsigned long long)v);
    meta(b, name, "counter", help);
    sample(b, name, labels, s);
}

static void gauge(kvs_buf *b, const char *name, const char *help, double v) { gauge_l(b, name, help, "", v); }
static void counter(kvs_buf *b, const char *name, const char *help, uint64_t v) { counter_l(b, name, help, "", v); }

static void hist_l(kvs_buf *b, const char *name, const char *help, const char *labels, const srv_metrics_histogram *h) {
    char s[64];
    const char *sep = labels[0] ? "," : "";
    meta(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int32_t i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        fmt_num(s, sizeof s, h->bounds[i]);
        kvs_buf_printf(b, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, labels, sep, s, (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    kvs_buf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)cum);
    fmt_num(s, sizeof s, h->sum);
    char n[32];
    snprintf(n, sizeof n, "%llu", (unsigned long long)h->count);
    kvs_buf_printf(b, "%s_sum%s%s%s %s\n", name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "", s);
    kvs_buf_printf(b, "%s_count%s%s%s %s\n", name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "", n);
}

static void hist(kvs_buf *b, const char *name, const char *help, const srv_metrics_histogram *h) {
    hist_l(b, name, help, "", h);
}

/* A label value in the exposition format: backslash, double quote and newline escaped. */
static void escape_label(char *out, size_t cap, const char *v) {
    size_t o = 0;
    for (; *v && o + 3 < cap; v++) {
        if (*v == '\\' || *v == '"') { out[o++] = '\\'; out[o++] = *v; }
        else if (*v == '\n') { out[o++] = '\\'; out[o++] = 'n'; }
        else out[o++] = *v;
    }
    out[o] = 0;
}

/* Speculative decoding's counters under vLLM's names (prefix "vllm:spec_decode") or kvserve's, only when it is on:
 * drafts verified, tokens guessed, guesses accepted, and per guess position the drafts that accepted it. */
static void render_spec(kvs_buf *b, const char *prefix, const char *labels, const srv_sched_stats *st) {
    if (st->spec_n_max <= 0) return;
    const srv_sched_counters *k = &st->counters;
    char name[96];
    snprintf(name, sizeof name, "%s_num_drafts_total", prefix);
    counter_l(b, name, "Number of spec decoding drafts.", labels, k->spec_drafts);
    snprintf(name, sizeof name, "%s_num_draft_tokens_total", prefix);
    counter_l(b, name, "Number of draft tokens.", labels, k->spec_draft_tokens);
    snprintf(name, sizeof name, "%s_num_accepted_tokens_total", prefix);
    counter_l(b, name, "Number of accepted tokens.", labels, k->spec_accepted_tokens);
    snprintf(name, sizeof name, "%s_num_accepted_tokens_per_pos_total", prefix);
    meta(b, name, "counter", "Accepted tokens per draft position.");
    int32_t n = st->spec_n_max < SRV_SCHED_SPEC_MAX ? st->spec_n_max : SRV_SCHED_SPEC_MAX;
    for (int32_t j = 0; j < n; j++)
        kvs_buf_printf(b, "%s{%s%sposition=\"%d\"} %llu\n", name, labels, labels[0] ? "," : "", (int)j,
                       (unsigned long long)k->spec_accepted_per_pos[j]);
}

/* vLLM's names and meanings (see obs.h), from the same numbers as kvserve's own. */
static void render_vllm(kvs_buf *b, const srv_metrics *m, const srv_sched_stats *st) {
    char name[600], L[700], s[800];
    escape_label(name, sizeof name, m->model_name);
    snprintf(L, sizeof L, "model_name=\"%s\",engine=\"0\"", name);
    gauge_l(b, "vllm:num_requests_running", "Number of requests in model execution batches.", L,
            st->requests_running);
    gauge_l(b, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", L, st->requests_waiting);
    gauge_l(b, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", L, st->kv_usage);
    gauge_l(b, "vllm:gpu_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage (older name).", L,
            st->kv_usage);
    counter_l(b, "vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
              L, st->prefix_query_tokens);
    counter_l(b, "vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", L,
              st->prefix_hit_tokens);
    counter_l(b, "vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", L,
              st->counters.preemptions);
    counter_l(b, "vllm:prompt_tokens_total", "Number of prefill tokens processed.", L,
              st->counters.prompt_tokens_total);
    counter_l(b, "vllm:generation_tokens_total", "Number of generation tokens processed.", L,
              st->counters.generation_tokens_total);
    meta(b, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
    static const char *const reasons[] = {"stop", "length", "abort"};
    const uint64_t counts[] = {m->requests_finished_stop, m->requests_finished_length, m->requests_finished_abort};
    for (int i = 0; i < 3; i++)
        kvs_buf_printf(b, "vllm:request_success_total{%s,finished_reason=\"%s\"} %llu\n", L, reasons[i],
                (unsigned long long)counts[i]);
    hist_l(b, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", L, &m->ttft);
    hist_l(b, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", L, &m->itl);
    hist_l(b, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", L, &m->e2e);
    hist_l(b, "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", L,
           &m->queue);
    hist_l(b, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", L, &m->prompt_len);
    hist_l(b, "vllm:request_generation_tokens", "Number of generation tokens processed.", L, &m->gen_len);
    meta(b, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
    snprintf(s, sizeof s, "block_size=\"%d\",engine=\"0\",num_gpu_blocks=\"%d\"", (int)st->kv_block_size,
             (int)st->kv_blocks_total);
    sample(b, "vllm:cache_config_info", s, "1");
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    char t[64];
    fmt_num(t, sizeof t, (double)now.tv_sec + (double)(now.tv_nsec / 1000000) / 1e3);
    render_spec(b, "vllm:spec_decode", L, st);
    meta(b, "vllm:lora_requests_info", "gauge", "Running stats on lora requests.");
    sample(b, "vllm:lora_requests_info", "max_lora=\"0\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"", t);
}

/* The kvserve:* series that show one srv_sched_stats field as is, in output order. An int32 or double field
 * is a gauge, a uint64 one a counter. */
typedef enum { ST_I32, ST_F64, ST_U64 } st_field_type;
typedef struct st_series {
    const char *name, *help;
    st_field_type type;
    size_t off;
} st_series;
#define ST(name, help, type, field) {name, help, type, offsetof(srv_sched_stats, field)}
static const st_series k_st_series[] = {
    ST("kvserve:num_requests_running", "Requests admitted to the engine (prefilling or decoding).", ST_I32,
       requests_running),
    ST("kvserve:num_requests_waiting", "Requests queued, not yet admitted (including preempted ones).", ST_I32,
       requests_waiting),
    ST("kvserve:kv_cache_usage_perc", "Fraction of KV blocks in use (0..1).", ST_F64, kv_usage),
    ST("kvserve:kv_blocks_total", "KV blocks in the pool.", ST_I32, kv_blocks_total),
    ST("kvserve:kv_blocks_used", "KV blocks referenced by running sequences.", ST_I32, kv_blocks_used),
    ST("kvserve:kv_blocks_cached", "Unreferenced KV blocks kept for prefix reuse (evictable).", ST_I32,
       kv_blocks_cached),
    ST("kvserve:kv_blocks_free", "KV blocks neither used nor cached.", ST_I32, kv_blocks_free),
    ST("kvserve:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", ST_U64,
       prefix_query_tokens),
    ST("kvserve:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", ST_U64, prefix_hit_tokens),
    ST("kvserve:prompt_tokens_total", "Prompt tokens of admitted requests.", ST_U64, counters.prompt_tokens_total),
    ST("kvserve:generation_tokens_total", "Tokens generated.", ST_U64, counters.generation_tokens_total),
    ST("kvserve:num_preemptions_total", "Requests preempted because the KV pool was full.", ST_U64,
       counters.preemptions),
    ST("kvserve:kv_pool_truncations_total",
       "Choices cut with finish_reason length because the whole KV pool could not hold their context.", ST_U64,
       counters.choices_truncated),
    ST("kvserve:context_shifts_total", "Context shifts (context_shift): half of a full context dropped after n_keep.",
       ST_U64, counters.context_shifts),
    ST("kvserve:context_shifts_recomputed_total", "Context shifts done by recomputing the kept tokens.", ST_U64,
       counters.context_shifts_recomputed),
};
#undef ST

static void st_series_render(kvs_buf *b, const srv_sched_stats *st) {
    for (size_t i = 0; i < sizeof k_st_series / sizeof k_st_series[0]; i++) {
        const st_series *s = &k_st_series[i];
        const char *f = (const char *)st + s->off;
        if (s->type == ST_I32) {
            int32_t v;
            memcpy(&v, f, sizeof v);
            gauge(b, s->name, s->help, v);
        } else if (s->type == ST_F64) {
            double v;
            memcpy(&v, f, sizeof v);
            gauge(b, s->name, s->help, v);
        } else {
            uint64_t v;
            memcpy(&v, f, sizeof v);
            counter(b, s->name, s->help, v);
        }
    }
}

/* The host tier's own counters (kv_host_gb). */
static void render_host(kvs_buf *b, const kvh_stats *h) {
    gauge(b, "kvserve:kv_host_tier_blocks", "KV blocks held by the host-memory tier.", (double)h->blocks);
    gauge(b, "kvserve:kv_host_tier_capacity_blocks", "KV blocks the host-memory tier can hold (kv_host_gb).",
          (double)h->capacity_blocks);
    counter(b, "kvserve:kv_host_tier_lookups_total", "New sequences whose prefix was looked up in the host tier.",
            h->lookups);
    counter(b, "kvserve:kv_host_tier_hit_blocks_total", "KV blocks copied from the host tier back into the pool.",
            h->hit_blocks);
    counter(b, "kvserve:kv_host_tier_stored_total", "KV blocks the pool evicted that the host tier copied.", h->stored);
    counter(b, "kvserve:kv_host_tier_evicted_total", "KV blocks dropped from the host tier to make room (handed to "
            "the disk tier when there is one).", h->evicted);
    counter(b, "kvserve:kv_host_tier_copy_errors_total", "Failed copies between the pool and the host tier.",
            h->copy_errors);
}

/* The KV tiers: prefix tokens served per tier (the pool, the host tier, the disk tier), bytes moved, and each lower
 * tier's own counters when the daemon has it (kv_host_gb, kv_disk_dir). */
static void render_tiers(kvs_buf *b, const srv_sched_stats *st) {
    const kvt_stats *t = &st->tier;
    meta(b, "kvserve:prefix_cache_tier_hits_total", "counter",
         "Prompt tokens served from a KV tier instead of computed, by tier (pool: the prefix cache; host: kv_host_gb; "
         "disk: kv_disk_dir).");
    kvs_buf_printf(b, "kvserve:prefix_cache_tier_hits_total{tier=\"pool\"} %llu\n",
                   (unsigned long long)st->prefix_hit_tokens);
    kvs_buf_printf(b, "kvserve:prefix_cache_tier_hits_total{tier=\"host\"} %llu\n",
                   (unsigned long long)st->host.hit_tokens);
    kvs_buf_printf(b, "kvserve:prefix_cache_tier_hits_total{tier=\"disk\"} %llu\n", (unsigned long long)t->hit_tokens);
    if (!st->has_tier && !st->has_host) return;
    meta(b, "kvserve:kv_tier_bytes_total", "counter", "Bytes of KV moved between the pool and a lower tier "
         "(host: read = copied back into the pool, write = copied out of it).");
    if (st->has_host) {
        kvs_buf_printf(b, "kvserve:kv_tier_bytes_total{tier=\"host\",direction=\"read\"} %llu\n",
                       (unsigned long long)st->host.bytes_out);
        kvs_buf_printf(b, "kvserve:kv_tier_bytes_total{tier=\"host\",direction=\"write\"} %llu\n",
                       (unsigned long long)st->host.bytes_in);
    }
    if (!st->has_tier) {
        render_host(b, &st->host);
        return;
    }
    kvs_buf_printf(b, "kvserve:kv_tier_bytes_total{tier=\"disk\",direction=\"read\"} %llu\n",
                   (unsigned long long)t->bytes_read);
    kvs_buf_printf(b, "kvserve:kv_tier_bytes_total{tier=\"disk\",direction=\"write\"} %llu\n",
                   (unsigned long long)t->bytes_written);
    if (st->has_host) render_host(b, &st->host);
    gauge(b, "kvserve:kv_disk_tier_blocks", "KV blocks held by the disk tier.", (double)t->blocks);
    gauge(b, "kvserve:kv_disk_tier_files", "Files of the disk tier.", (double)t->files);
    gauge(b, "kvserve:kv_disk_tier_bytes", "Bytes of the disk tier's files (bounded by kv_disk_gb).", (double)t->bytes);
    counter(b, "kvserve:kv_disk_tier_lookups_total", "New sequences whose prefix was looked up on disk.", t->lookups);
    counter(b, "kvserve:kv_disk_tier_hit_blocks_total", "KV blocks loaded from disk into the pool.", t->hit_blocks);
    counter(b, "kvserve:kv_disk_tier_blocks_written_total", "KV blocks saved to disk.", t->blocks_written);
    counter(b, "kvserve:kv_disk_tier_blocks_dropped_total",
            "KV blocks not saved (the writer's queue was full, or a write failed).", t->blocks_dropped);
    counter(b, "kvserve:kv_disk_tier_write_errors_total", "Disk tier files that could not be written.",
            t->write_errors);
    counter(b, "kvserve:kv_disk_tier_files_rejected_total",
            "Disk tier files deleted as truncated, corrupt or written for another model or setting.",
            t->files_rejected);
    counter(b, "kvserve:kv_disk_tier_files_evicted_total", "Disk tier files deleted to stay under kv_disk_gb.",
            t->files_evicted);
}

int srv_metrics_render(const srv_metrics *m, const srv_sched_stats *st_in, char **out, size_t *len) {
    srv_sched_stats zero;
    memset(&zero, 0, sizeof zero);
    const srv_sched_stats *st = st_in ? st_in : &zero;
    kvs_buf b = {0};
    if (kvs_buf_reserve(&b, 8192) != 0) return SRV_METRICS_ERR_NOMEM;
    st_series_render(&b, st);
    meta(&b, "kvserve:requests_rejected_total", "counter",
         "Requests refused with 429 because the waiting queue was at a limit (max_queue, max_queued_tokens).");
    kvs_buf_printf(&b, "kvserve:requests_rejected_total{reason=\"max_queue\"} %llu\n",
            (unsigned long long)st->requests_rejected);
    kvs_buf_printf(&b, "kvserve:requests_rejected_total{reason=\"max_queued_tokens\"} %llu\n",
            (unsigned long long)st->requests_rejected_tokens);
    gauge(&b, "kvserve:queued_prompt_tokens", "Prompt tokens of waiting, never admitted requests.",
          (double)st->queued_tokens);
    gauge(&b, "kvserve:draining",
          "1 while the server drains after SIGTERM/SIGINT (health 503, new requests 503), else 0.",
          m->draining ? 1 : 0);
    counter(&b, "kvserve:requests_refused_draining_total", "Requests answered 503 because the server was draining.",
            m->requests_refused_draining);
    meta(&b, "kvserve:request_success_total", "counter", "Finished generation requests by finish reason.");
    kvs_buf_printf(&b, "kvserve:request_success_total{finished_reason=\"stop\"} %llu\n",
            (unsigned long long)m->requests_finished_stop);
    kvs_buf_printf(&b, "kvserve:request_success_total{finished_reason=\"length\"} %llu\n",
            (unsigned long long)m->requests_finished_length);
    kvs_buf_printf(&b, "kvserve:request_success_total{finished_reason=\"abort\"} %llu\n",
            (unsigned long long)m->requests_finished_abort);
    kvs_buf_printf(&b, "kvserve:request_success_total{finished_reason=\"error\"} %llu\n",
            (unsigned long long)m->requests_finished_error);
    meta(&b, "kvserve:http_requests_total", "counter", "HTTP responses by status class.");
    for (int i = 0; i < SRV_METRICS_STATUS_CLASSES; i++)
        kvs_buf_printf(&b, "kvserve:http_requests_total{code=\"%dxx\"} %llu\n", i + 1,
                (unsigned long long)m->http_requests[i]);
    hist(&b, "kvserve:time_to_first_token_seconds", "Time from request arrival to the first generated token.",
         &m->ttft);
    hist(&b, "kvserve:inter_token_latency_seconds", "Time between consecutive generated tokens of a choice.",
         &m->itl);
    hist(&b, "kvserve:e2e_request_latency_seconds", "Time from request arrival to its last token.", &m->e2e);
    hist(&b, "kvserve:request_queue_time_seconds", "Time a request waited before its first engine step.",
         &m->queue);
    hist(&b, "kvserve:request_prompt_tokens", "Prompt length of finished requests.", &m->prompt_len);
    hist(&b, "kvserve:request_generation_tokens", "Generated tokens of finished requests.", &m->gen_len);
    {
        srv_kv_events_stats ks; /* zeros when events are disabled */
        srv_kv_events_get_stats(m->kvev, &ks);
        counter(&b, "kvserve:kv_events_queued_total",
                "KV-cache event batches handed to the publisher (every step that changed the prefix index).",
                ks.batches_queued);
        counter(&b, "kvserve:kv_events_published_total", "KV-cache event batches sent on the PUB socket.",
                ks.batches_published);
        counter(&b, "kvserve:kv_events_dropped_total",
                "KV-cache event batches dropped (publisher queue full, or out of memory).", ks.batches_dropped);
    }
    render_spec(&b, "kvserve:spec_decode", "", st);
    if (st->spec_n_max > 0)
        counter(&b, "kvserve:spec_decode_steps_off_total",
                "Steps whose guesses the step cost model dropped (extra rows would cost more than they yield).",
                st->counters.spec_steps_off);
    if (st->spec_draft) {
        counter(&b, "kvserve:spec_decode_draft_calls_total", "Draft model forward passes (spec_type draft).",
                st->counters.spec_draft_calls);
        counter(&b, "kvserve:spec_decode_draft_rows_total", "Rows the draft model computed (catch-up and guesses).",
                st->counters.spec_draft_rows);
        counter(&b, "kvserve:spec_decode_draft_catchup_rows_total",
                "Rows the draft model computed to catch up on known tokens it had not seen.",
                st->counters.spec_draft_catchup_rows);
        char v[64];
        fmt_num(v, sizeof v, (double)st->counters.spec_draft_ns / 1e9);
        meta(&b, "kvserve:spec_decode_draft_seconds_total", "counter", "Seconds spent in the draft model.");
        sample(&b, "kvserve:spec_decode_draft_seconds_total", "", v);
    }
    render_tiers(&b, st);
    render_vllm(&b, m, st);
    size_t n = b.len;
    char *text = kvs_buf_take(&b); /* NULL when an append failed */
    if (!text) return SRV_METRICS_ERR_NOMEM;
    *out = text;
    *len = n;
    return SRV_METRICS_OK;
}
