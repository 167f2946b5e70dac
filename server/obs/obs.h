/*
 * metrics.h: Prometheus metrics of the server (internal to server/, prefix srv_metrics_).
 *
 * Histograms and HTTP counters are fed on the loop thread by the API layer; gauges and engine counters come
 * from a srv_sched_stats snapshot passed to srv_metrics_render. Text exposition format 0.0.4: every metric
 * has # HELP and # TYPE lines; histograms have cumulative _bucket{le="..."} lines ending with le="+Inf",
 * then _sum and _count. Single-threaded (the loop thread).
 *
 * Two families: kvserve's own (kvserve:*) and, from the same numbers, vLLM's names and meanings (vllm:*, labels
 * model_name and engine="0" as vLLM's v1 engine writes them), so that routers built for vLLM (the Gateway API
 * Inference Extension's endpoint picker) read kvserve unmodified: vllm:num_requests_running/_waiting,
 * vllm:kv_cache_usage_perc (0..1; also the older vllm:gpu_cache_usage_perc), vllm:prefix_cache_queries_total /
 * _hits_total (tokens), vllm:num_preemptions_total, vllm:prompt_tokens_total, vllm:generation_tokens_total,
 * vllm:request_success_total{finished_reason}, the latency and length histograms, vllm:cache_config_info
 * {block_size, num_gpu_blocks} = 1 (blocks of the pool whatever the device) and vllm:lora_requests_info
 * {max_lora="0", running_lora_adapters="", waiting_lora_adapters=""} = the current Unix time (vLLM sets it to
 * the time of its last update).
 */
#ifndef KVSERVE_SERVER_METRICS_H
#define KVSERVE_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#include "server/sched/sched.h"

enum { SRV_METRICS_OK = KVS_OK, SRV_METRICS_ERR_NOMEM = KVS_ERR_NOMEM };

#define SRV_HIST_MAX_BUCKETS 24
typedef struct srv_histogram {
    int32_t n_bounds;                          /* upper bounds, ascending (the +Inf bucket is implicit) */
    double bounds[SRV_HIST_MAX_BUCKETS];
    uint64_t counts[SRV_HIST_MAX_BUCKETS + 1]; /* per bucket, NOT cumulative; [n_bounds] is (last, +Inf) */
    double sum;
    uint64_t count;
} srv_histogram;

/* Sets the bounds (ascending, n <= SRV_HIST_MAX_BUCKETS; extra ones dropped) and zeroes the counts. */
void srv_histogram_init(srv_histogram *h, const double *bounds, int32_t n);
/* Adds one observation (NaN is ignored; a value equal to a bound falls in that bound's bucket). */
void srv_histogram_observe(srv_histogram *h, double v);

enum { SRV_METRICS_STATUS_CLASSES = 5 }; /* 1xx..5xx */

struct srv_kvev;

typedef struct srv_metrics {
    srv_histogram ttft, itl, e2e, queue;       /* seconds */
    srv_histogram prompt_len, gen_len;         /* tokens per request */
    uint64_t http_requests[SRV_METRICS_STATUS_CLASSES]; /* by status class */
    uint64_t requests_finished_stop, requests_finished_length, requests_finished_abort, requests_finished_error;
    bool draining;                 /* graceful drain under way (srv_api_set_draining): kvserve:draining 1 */
    uint64_t requests_refused_draining; /* requests answered 503 because the server was draining */
    char model_name[256];          /* the model_name label of the vllm: metrics ("" until the model is loaded) */
    const struct srv_kvev *kvev;   /* the KV-cache event publisher (its counters), NULL when disabled */
} srv_metrics;

/* Zeroes the counters and sets the standard bucket bounds. */
void srv_metrics_init(srv_metrics *m);
void srv_metrics_count_http(srv_metrics *m, int status);

/* Renders the exposition text into a malloc'd NUL-terminated string (*out, length *len).
 * st may be NULL (engine gauges then read 0, e.g. while the model loads). */
int srv_metrics_render(const srv_metrics *m, const srv_sched_stats *st, char **out, size_t *len);

#endif /* KVSERVE_SERVER_METRICS_H */
