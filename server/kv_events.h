/*
 * kv_events.h: KV-cache events in vLLM's wire format (internal to server/, prefix srv_kvev_).
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
 *     ["BlockStored", [hash, ...], parent_hash | nil, [token_id, ...], block_size, nil (lora_id), "GPU" (medium),
 *      nil (lora_name)]
 *     ["BlockRemoved", [hash, ...], "GPU"]
 *     ["AllBlocksCleared"]
 *   Hashes are the cache's 64-bit chained block hashes (cache/kv_cache.h "prefix-cache events"), always as
 *   msgpack uint64. A BlockStored covers consecutive blocks of one chain (parent_hash: the block before the first,
 *   nil at the chain's root); token_ids are the blocks' tokens concatenated (block_size per block).
 * Replay (vLLM's protocol): a client sends [start_seq (8 bytes big-endian)] to the ROUTER socket (a REQ socket
 *   adds the empty delimiter, a DEALER must send it first); the reply is one message [seq (8 bytes), payload] per
 *   buffered batch with seq >= start_seq, in order, then [-1 as 8 bytes (all 0xff), ""] to end.
 *
 * Threads: the collector calls (srv_kvev_on_cache_event, srv_kvev_step_end) belong to the cache owner's thread
 * (the scheduler thread); a publisher thread owns the sockets; srv_kvev_get_stats may be called from any thread.
 * Publishing never blocks the collector: a full queue drops the batch and counts it.
 *
 * Errors: KVS_OK or a negative kvs_err (common/common.h); functions that read user input write a message into err.
 */
#ifndef KVSERVE_SERVER_KV_EVENTS_H
#define KVSERVE_SERVER_KV_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/kv_cache.h"
#include "common/common.h"

typedef struct srv_kvev_config {
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
} srv_kvev_config;

/* vLLM's defaults (disabled, publisher "null"). */
void srv_kvev_config_default(srv_kvev_config *c);

/* Parses a JSON object of the keys above (NULL or "" gives the defaults). Unknown keys, wrong types and values out
 * of range are KVS_ERR_INVALID with a message naming the key. */
int srv_kvev_config_parse(const char *json, srv_kvev_config *out, char *err, size_t err_len);

/* The settings as a JSON object with every key (replay_endpoint null when empty); NULL when out of memory. The
 * caller owns it (cJSON_Delete). */
struct cJSON;
struct cJSON *srv_kvev_config_to_json(const srv_kvev_config *c);

/* Whether the configuration publishes anything (enabled with publisher "zmq"). */
bool srv_kvev_config_active(const srv_kvev_config *c);

typedef struct srv_kvev srv_kvev;

/* Creates the publisher: opens the sockets (bind or connect) and starts its thread. Errors: KVS_ERR_INVALID (not
 * active), KVS_ERR_BIND (an endpoint could not be bound or connected: see err), KVS_ERR_NOMEM, KVS_ERR_THREAD. */
int srv_kvev_create(const srv_kvev_config *cfg, srv_kvev **out, char *err, size_t err_len);

/* Publishes what is queued, stops the thread, closes the sockets and frees. Events collected since the last
 * srv_kvev_step_end are discarded. NULL is a no-op. Call it after the collector thread has stopped. */
void srv_kvev_free(srv_kvev *p);

/* The PUB socket's endpoint as bound (with the port a '*' port resolved to), or the configured one. */
const char *srv_kvev_endpoint(const srv_kvev *p);

/* kvc_event_cb: collects one cache event into the current batch (ctx is the srv_kvev). Collector thread. */
void srv_kvev_on_cache_event(void *ctx, const kvc_event *ev);

/* Ends an engine step: hands the collected events, if any, to the publisher thread as one batch (ctx is the
 * srv_kvev; NULL is a no-op). Never blocks on the sockets. Collector thread. */
void srv_kvev_step_end(void *ctx);

typedef struct srv_kvev_stats {
    uint64_t batches_queued;    /* batches handed to the publisher thread */
    uint64_t batches_published; /* batches sent on the PUB socket */
    uint64_t batches_dropped;   /* batches lost: queue full, or memory ran out while collecting */
    uint64_t events;            /* events in queued batches (after merging consecutive blocks) */
    uint64_t replays;           /* replay requests served */
    uint64_t queue_bytes;       /* bytes of the batches waiting for the publisher thread now */
    uint64_t buffer_bytes;      /* bytes of the batches kept for replay now */
} srv_kvev_stats;

/* Counters (relaxed atomics). NULL p gives zeros. */
void srv_kvev_get_stats(const srv_kvev *p, srv_kvev_stats *out);

/* ---- the encoder, for tests ------------------------------------------------------------------------------------ */
typedef struct srv_kvev_batch srv_kvev_batch;

/* An empty batch builder (events merged as srv_kvev_on_cache_event does). */
int srv_kvev_batch_create(srv_kvev_batch **out);
void srv_kvev_batch_free(srv_kvev_batch *b);
/* Adds one event; KVS_ERR_NOMEM (the batch is then unusable until cleared), KVS_ERR_INVALID (bad kind). */
int srv_kvev_batch_add(srv_kvev_batch *b, const kvc_event *ev);
/* Number of (merged) events. */
int32_t srv_kvev_batch_len(const srv_kvev_batch *b);
void srv_kvev_batch_clear(srv_kvev_batch *b);
/* Encodes the batch as the msgpack EventBatch above into out (appended). */
int srv_kvev_batch_encode(const srv_kvev_batch *b, double ts, int32_t dp_rank, kvs_buf *out);

#endif /* KVSERVE_SERVER_KV_EVENTS_H */
