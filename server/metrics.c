/* metrics.c: Prometheus text exposition (see metrics.h). */
#include "server/metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void srv_histogram_init(srv_histogram *h, const double *bounds, int32_t n) {
    memset(h, 0, sizeof *h);
    if (n > SRV_HIST_MAX_BUCKETS) n = SRV_HIST_MAX_BUCKETS;
    if (n < 0) n = 0;
    for (int32_t i = 0; i < n; i++) h->bounds[i] = bounds[i];
    h->n_bounds = n;
}

void srv_histogram_observe(srv_histogram *h, double v) {
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
    srv_histogram_init(&m->ttft, TTFT_B, NB(TTFT_B));
    srv_histogram_init(&m->itl, ITL_B, NB(ITL_B));
    srv_histogram_init(&m->e2e, E2E_B, NB(E2E_B));
    srv_histogram_init(&m->queue, E2E_B, NB(E2E_B));
    srv_histogram_init(&m->prompt_len, LEN_B, NB(LEN_B));
    srv_histogram_init(&m->gen_len, LEN_B, NB(LEN_B));
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

static void gauge(kvs_buf *b, const char *name, const char *help, double v) {
    char s[64];
    fmt_num(s, sizeof s, v);
    meta(b, name, "gauge", help);
    kvs_buf_printf(b, "%s %s\n", name, s);
}

static void counter(kvs_buf *b, const char *name, const char *help, uint64_t v) {
    meta(b, name, "counter", help);
    kvs_buf_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

static void hist(kvs_buf *b, const char *name, const char *help, const srv_histogram *h) {
    char s[64];
    meta(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int32_t i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        fmt_num(s, sizeof s, h->bounds[i]);
        kvs_buf_printf(b, "%s_bucket{le=\"%s\"} %llu\n", name, s, (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    kvs_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    fmt_num(s, sizeof s, h->sum);
    kvs_buf_printf(b, "%s_sum %s\n%s_count %llu\n", name, s, name, (unsigned long long)h->count);
}

int srv_metrics_render(const srv_metrics *m, const srv_sched_stats *st_in, char **out, size_t *len) {
    srv_sched_stats zero;
    memset(&zero, 0, sizeof zero);
    const srv_sched_stats *st = st_in ? st_in : &zero;
    kvs_buf b = {0};
    if (kvs_buf_reserve(&b, 8192) != 0) return SRV_METRICS_ERR_NOMEM;
    gauge(&b, "kvserve:num_requests_running", "Requests admitted to the engine (prefilling or decoding).",
          st->requests_running);
    gauge(&b, "kvserve:num_requests_waiting", "Requests queued, not yet admitted (including preempted ones).",
          st->requests_waiting);
    gauge(&b, "kvserve:kv_cache_usage_perc", "Fraction of KV blocks in use (0..1).", st->kv_usage);
    gauge(&b, "kvserve:kv_blocks_total", "KV blocks in the pool.", st->kv_blocks_total);
    gauge(&b, "kvserve:kv_blocks_used", "KV blocks referenced by running sequences.", st->kv_blocks_used);
    gauge(&b, "kvserve:kv_blocks_cached", "Unreferenced KV blocks kept for prefix reuse (evictable).",
          st->kv_blocks_cached);
    gauge(&b, "kvserve:kv_blocks_free", "KV blocks neither used nor cached.", st->kv_blocks_free);
    counter(&b, "kvserve:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
            st->prefix_query_tokens);
    counter(&b, "kvserve:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
            st->prefix_hit_tokens);
    counter(&b, "kvserve:prompt_tokens_total", "Prompt tokens of admitted requests.", st->prompt_tokens_total);
    counter(&b, "kvserve:generation_tokens_total", "Tokens generated.", st->generation_tokens_total);
    counter(&b, "kvserve:num_preemptions_total", "Requests preempted because the KV pool was full.",
            st->preemptions);
    counter(&b, "kvserve:requests_rejected_total", "Requests refused because the queue was full.",
            st->requests_rejected);
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
    size_t n = b.len;
    char *text = kvs_buf_take(&b); /* NULL when an append failed */
    if (!text) return SRV_METRICS_ERR_NOMEM;
    *out = text;
    *len = n;
    return SRV_METRICS_OK;
}
