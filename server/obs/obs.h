/*
 * obs.h: the public header of server/obs/ (observability): the Prometheus metrics (metrics.c, prefix
 * srv_metrics_) and the KV-cache event publisher (kv_events.c, prefix srv_kv_events_). Reads the scheduler's
 * statistics (server/sched/sched.h); used by server/api/ and serve.c.
 *
 * Metrics: histograms and HTTP counters are fed on the loop thread by the API layer; gauges and engine counters come
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
#ifndef KVSERVE_SERVER_OBS_H
#define KVSERVE_SERVER_OBS_H

#include <stddef.h>
#include <stdint.h>

#include "cache/kv_cache.h"
#include "common/common.h"

#include "server/sched/sched.h"

enum { SRV_METRICS_OK = KVS_OK, SRV_METRICS_ERR_NOMEM = KVS_ERR_NOMEM };

#define SRV_METRICS_HIST_MAX_BUCKETS 24
typedef struct srv_metrics_histogram {
    int32_t n_bounds;                          /* upper bounds, ascending (the +Inf bucket is implicit) */
    double bounds[SRV_METRICS_HIST_MAX_BUCKETS];
    uint64_t counts[SRV_METRICS_HIST_MAX_BUCKETS + 1]; /* per bucket, NOT cumulative; [n_bounds] is (last, +Inf) */
    double sum;
    uint64_t count;
} srv_metrics_histogram;

/* Sets the bounds (ascending, n <= SRV_METRICS_HIST_MAX_BUCKETS; extra ones dropped) and zeroes the counts. */
void srv_metrics_histogram_init(srv_metrics_histogram *h, const double *bounds, int32_t n);
/* Adds one observation (NaN is ignored; a value equal to a bound falls in that bound's bucket). */
void srv_metrics_histogram_observe(srv_metrics_histogram *h, double v);

enum { SRV_METRICS_STATUS_CLASSES = 5 }; /* 1xx..5xx */

struct srv_kv_events;

typedef struct srv_metrics {
    srv_metrics_histogram ttft, itl, e2e, queue;       /* seconds */
    srv_metrics_histogram prompt_len, gen_len;         /* tokens per request */
    uint64_t http_requests[SRV_METRICS_STATUS_CLASSES]; /* by status class */
    uint64_t requests_finished_stop, requests_finished_length, requests_finished_abort, requests_finished_error;
    bool draining;                 /* graceful drain under way (srv_api_set_draining): kvserve:draining 1 */
    uint64_t requests_refused_draining; /* requests answered 503 because the server was draining */
    char model_name[256];          /* the model_name label of the vllm: metrics ("" until the model is loaded) */
    const struct srv_kv_events *kvev;   /* the KV-cache event publisher (its counters), NULL when disabled */
} srv_metrics;

/* Zeroes the counters and sets the standard bucket bounds. */
void srv_metrics_init(srv_metrics *m);
void srv_metrics_count_http(srv_metrics *m, int status);

/* Renders the exposition text into a malloc'd NUL-terminated string (*out, length *len).
 * st may be NULL (engine gauges then read 0, e.g. while the model loads). */
int srv_metrics_render(const srv_metrics *m, const srv_sched_stats *st, char **out, size_t *len);

/* ---- KV-cache events (obs/kv_events.c, prefix srv_kv_events_) ------------------------------------------------------
 * KV-cache events in vLLM's wire format.
 *
 * Routers that score replicas by prefix-cache contents (llm-d's precise prefix-cache scorer, NVIDIA Dynamo's
 * KV router) subscribe to vLLM's KV-cache events. kvserve publishes the same stream, so they work unmodified.
 *
 * Configuration: vLLM's KVEventsConfig as a JSON object (--kv-events-config JSON, config key kv_events_config):
 *   enable_kv_cache_events  bool, default false
 *   publisher               "null" | "zmq"; default "zmq" when enabled, else "null"
 *   endpoint                PUB endpoint, default "tcp://" "*:5557" (bound when it holds '*' or "::" or is ipc:// or
 *                           inproc://, else connected, as vLLM does)
 *   replay_endpoint         ROUTER endpoint (bound) or null (default: no replay)
 *   topic                   first frame of every message, default "" (llm-d expects "kv@<pod>@<model>")
 *   buffer_steps            batches kept for replay, default 10000, 1..10^7
 *   hwm                     ZeroMQ send high-water mark of the PUB socket, default 100000, 0..10^9 (0: none)
 *   max_queue_size          batches waiting for the publisher thread before new ones are dropped, default 100000
 *   max_queue_bytes         (kvserve) bytes of the batches waiting for the publisher thread: a batch that would pass
 *                           it is dropped; default 64 MiB, 1..2^31-1 (issue 30: the counts alone let a slow
 *                           publisher hold max_queue_size batches of any size)
 *   buffer_bytes            (kvserve) bytes of the replay buffer: the oldest batches leave it first; a batch larger
 *                           than this is published but not kept for replay; default 256 MiB, 1..2^31-1
 *   The PUB socket's own queue for a subscriber that does not read is ZeroMQ's, bounded by hwm in messages
 *   (ZeroMQ has no byte bound): with a batch at most max_queue_bytes, and usually a few KiB, keep hwm modest.
 *
 * Wire format (one ZeroMQ multipart message per engine step that changed the prefix index):
 *   frame 0: topic (UTF-8), frame 1: sequence number (8 bytes big-endian, from 0, +1 per batch; a batch dropped
 *   because the queue was full leaves a gap), frame 2: msgpack EventBatch, msgspec's array_like form:
 *     [ts (float64 Unix seconds), [event, ...], data_parallel_rank (0)]
 *   events, tagged arrays with the tag first:
 *     ["BlockStored", [hash, ...], parent_hash | nil, [token_id, ...], block_size, nil (lora_id), medium,
 *      nil (lora_name)]
 *     ["BlockRemoved", [hash, ...], medium]
 *   medium: "GPU" for the KV pool (vLLM's name for its main pool, whatever the device), "CPU" for the host-memory
 *   tier (kv_host_gb: vLLM's name for its CPU offloading), "DISK" for the disk tier (kv_disk_dir): blocks a replica
 *   can load instead of computing
 *     ["AllBlocksCleared"]
 *   Hashes are the cache's 64-bit chained block hashes (cache/kv_cache.h "prefix-cache events"), always as
 *   msgpack uint64. A BlockStored covers consecutive blocks of one chain (parent_hash: the block before the first,
 *   nil at the chain's root); token_ids are the blocks' tokens concatenated (block_size per block).
 * Replay (vLLM's protocol): a client sends [start_seq (8 bytes big-endian)] to the ROUTER socket (a REQ socket
 *   adds the empty delimiter, a DEALER must send it first); the reply is one message [seq (8 bytes), payload] per
 *   buffered batch with seq >= start_seq, in order, then [-1 as 8 bytes (all 0xff), ""] to end.
 *
 * Threads: the collector calls (srv_kv_events_on_cache_event, srv_kv_events_step_end) belong to the cache owner's
 * thread (the scheduler thread); a publisher thread owns the sockets; srv_kv_events_get_stats may be called from any
 * thread. Publishing never blocks the collector: a full queue drops the batch and counts it.
 *
 * Errors: KVS_OK or a negative kvs_err (common/common.h); functions that read user input write a message into err. */
typedef struct srv_kv_events_config {
    bool enable;               /* enable_kv_cache_events */
    char publisher[8];         /* "null" or "zmq" */
    char endpoint[256];
    char replay_endpoint[256]; /* "": no replay socket */
    char topic[256];
    int32_t buffer_steps;
    int32_t hwm;
    int32_t max_queue_size;
    int32_t max_queue_bytes;
    int32_t buffer_bytes;
} srv_kv_events_config;

/* vLLM's defaults (disabled, publisher "null"). */
void srv_kv_events_config_default(srv_kv_events_config *c);

/* Parses a JSON object of the keys above (NULL or "" gives the defaults). Unknown keys, wrong types and values out
 * of range are KVS_ERR_INVALID with a message naming the key. */
int srv_kv_events_config_parse(const char *json, srv_kv_events_config *out, char *err, size_t err_len);

/* The settings as a JSON object with every key (replay_endpoint null when empty); NULL when out of memory. The
 * caller owns it (cJSON_Delete). */
struct cJSON;
struct cJSON *srv_kv_events_config_to_json(const srv_kv_events_config *c);

/* Whether the configuration publishes anything (enabled with publisher "zmq"). */
bool srv_kv_events_config_active(const srv_kv_events_config *c);

typedef struct srv_kv_events srv_kv_events;

/* Creates the publisher: opens the sockets (bind or connect) and starts its thread. Errors: KVS_ERR_INVALID (not
 * active), KVS_ERR_BIND (an endpoint could not be bound or connected: see err), KVS_ERR_NOMEM, KVS_ERR_THREAD. */
int srv_kv_events_create(const srv_kv_events_config *cfg, srv_kv_events **out, char *err, size_t err_len);

/* Publishes what is queued, stops the thread, closes the sockets and frees. Events collected since the last
 * srv_kv_events_step_end are discarded. NULL is a no-op. Call it after the collector thread has stopped. */
void srv_kv_events_free(srv_kv_events *p);

/* The PUB socket's endpoint as bound (with the port a '*' port resolved to), or the configured one. */
const char *srv_kv_events_endpoint(const srv_kv_events *p);

/* kvc_event_cb: collects one cache event into the current batch (ctx is the srv_kv_events). Collector thread. */
void srv_kv_events_on_cache_event(void *ctx, const kvc_event *ev);

/* kvc_event_cb for the disk tier's events (kvt_drain_events): collected like the cache's, with medium "DISK".
 * Collector thread. */
void srv_kv_events_on_tier_event(void *ctx, const kvc_event *ev);

/* kvc_event_cb for the host tier's events (kvh_drain_events): collected like the cache's, with medium "CPU".
 * Collector thread. */
void srv_kv_events_on_host_event(void *ctx, const kvc_event *ev);

/* Ends an engine step: hands the collected events, if any, to the publisher thread as one batch (ctx is the
 * srv_kv_events; NULL is a no-op). Never blocks on the sockets. Collector thread. */
void srv_kv_events_step_end(void *ctx);

typedef struct srv_kv_events_stats {
    uint64_t batches_queued;    /* batches handed to the publisher thread */
    uint64_t batches_published; /* batches sent on the PUB socket */
    uint64_t batches_dropped;   /* batches lost: queue full, or memory ran out while collecting */
    uint64_t events;            /* events in queued batches (after merging consecutive blocks) */
    uint64_t replays;           /* replay requests served */
    uint64_t queue_bytes;       /* bytes of the batches waiting for the publisher thread now */
    uint64_t buffer_bytes;      /* bytes of the batches kept for replay now */
} srv_kv_events_stats;

/* Counters (relaxed atomics). NULL p gives zeros. */
void srv_kv_events_get_stats(const srv_kv_events *p, srv_kv_events_stats *out);

/* ---- the encoder, for tests ------------------------------------------------------------------------------------ */
typedef struct srv_kv_events_batch srv_kv_events_batch;

/* An empty batch builder (events merged as srv_kv_events_on_cache_event does). */
int srv_kv_events_batch_create(srv_kv_events_batch **out);
void srv_kv_events_batch_free(srv_kv_events_batch *b);
/* Where the blocks of an event are. */
typedef enum {
    SRV_KV_EVENTS_POOL = 0, /* "GPU" */
    SRV_KV_EVENTS_DISK = 1, /* "DISK" */
    SRV_KV_EVENTS_HOST = 2, /* "CPU": the host-memory tier (vLLM's name for its CPU offloading medium) */
} srv_kv_events_medium;
/* Adds one event of the pool; KVS_ERR_NOMEM (the batch is then unusable until cleared), KVS_ERR_INVALID (bad kind). */
int srv_kv_events_batch_add(srv_kv_events_batch *b, const kvc_event *ev);
/* The same for a medium (events of different media never merge; CLEARED is the pool's only: else KVS_ERR_INVALID). */
int srv_kv_events_batch_add_medium(srv_kv_events_batch *b, const kvc_event *ev, srv_kv_events_medium medium);
/* Number of (merged) events. */
int32_t srv_kv_events_batch_len(const srv_kv_events_batch *b);
void srv_kv_events_batch_clear(srv_kv_events_batch *b);
/* Encodes the batch as the msgpack EventBatch above into out (appended). */
int srv_kv_events_batch_encode(const srv_kv_events_batch *b, double ts, int32_t dp_rank, kvs_buf *out);

#endif /* KVSERVE_SERVER_OBS_H */
