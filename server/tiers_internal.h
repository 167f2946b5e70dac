/*
 * tiers_internal.h: the daemon's KV tiers below the pool (server/tiers.c, prefix srv_tiers_; private to server/'s
 * top, used by serve.c): the disk tier (cache/kv_tier.h) opened from the configuration with the model's identity,
 * and the cache-event fan-out to the tier and the KV-event publisher.
 */
#ifndef KVSERVE_SERVER_TIERS_INTERNAL_H
#define KVSERVE_SERVER_TIERS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "cache/kv_host.h"
#include "cache/kv_tier.h"
#include "engine/engine.h"
#include "server/api/api.h"
#include "server/obs/obs.h"
#include "server/sched/sched.h"
#include "server/server.h"

/* The 32 bytes that say which KV a model computes: SHA-256 of the model file's size and samples of its bytes (its
 * first and last MiB and 16 slices of 64 KiB evenly spread: a cheap stable fingerprint, not a whole-file hash), the
 * shapes and rope settings (hparams), the context length (phi3's LongRoPE factors depend on it), the KV dtype, the
 * block size, the device and the CPU kernel level (the kernels' bits may differ between levels).
 * Errors: KVS_ERR_IO (the model file cannot be read; err names it). Off the loop thread (reads the file). */
int srv_tiers_identity(const char *model_path, const eng_hparams *hp, int32_t n_ctx, const char *kv_dtype,
                       int32_t block_size, const char *device, const char *simd, uint8_t out[32], char *err,
                       size_t err_len);

/* Opens the disk tier of cfg->kv_disk_dir over ctx's cache (*out NULL when kv_disk_dir is ""). Errors, with a message
 * in err: KVS_ERR_UNSUPPORTED (a GPU pool or a sliding-window cache), KVS_ERR_IO (the directory or the model file),
 * KVS_ERR_NOMEM, KVS_ERR_THREAD. Off the loop thread (scans the directory). */
int srv_tiers_open(const srv_config *cfg, const eng_model *model, eng_ctx *ctx, kvt_tier **out, char *err,
                   size_t err_len);

/* Opens the host-memory tier of cfg->kv_host_gb over ctx's cache (*out NULL when kv_host_gb is 0); blocks leaving it
 * go to `disk` (may be NULL) when the disk does not hold them yet. Errors, with a message in err: KVS_ERR_UNSUPPORTED
 * (a GPU pool or a sliding-window cache), KVS_ERR_INVALID (kv_host_gb below one block), KVS_ERR_NOMEM (the region
 * cannot be allocated). Off the loop thread. */
int srv_tiers_open_host(const srv_config *cfg, eng_ctx *ctx, kvt_tier *disk, kvh_tier **out, char *err,
                        size_t err_len);

/* A saved-session action (srv_api_backend.slot) over the scheduler's slot records and the disk tier: save exports
 * the KV blocks of slot op->id's record to <slot_dir>/<op->filename> (kvt_export), restore imports such a file into
 * the tier and makes its tokens the slot's record (kvt_import), erase drops the record. The errors of
 * srv_api_backend.slot, with op->err set. A pool thread (reads and writes files). */
int srv_tiers_slot(srv_sched *sched, kvt_tier *tier, const char *slot_dir, srv_api_slot_op *op);

/* The fan-out of the cache's events: to the host tier, the disk tier, then to the KV-event publisher. */
typedef struct srv_tiers_events {
    kvt_tier *tier;        /* may be NULL */
    kvh_tier *host;        /* may be NULL */
    srv_kv_events *kvev;   /* may be NULL */
} srv_tiers_events;

/* kvc_event_cb over a srv_tiers_events (ctx). */
void srv_tiers_on_cache_event(void *ctx, const kvc_event *ev);

/* srv_sched_params.on_step over a srv_tiers_events (ctx): the tiers' own events (blocks copied into the host tier or
 * dropped from it, medium "CPU"; written to disk or deleted from it, medium "DISK") join the step's batch, which the publisher then closes (srv_kv_events_step_end). */
void srv_tiers_step_end(void *ctx);

#endif
