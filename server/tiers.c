/* tiers.c: the daemon's KV tiers below the pool: the disk tier opened with the model's identity, and the cache-event
 * fan-out (see tiers_internal.h). */
#include "server/tiers_internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/kernels/quant.h"

#define MIB ((uint64_t)1 << 20)

/* Hashes len bytes at off of fd (fewer at the end of the file). */
static int hash_slice(kvs_sha256_ctx *h, int fd, uint64_t off, uint64_t len, uint8_t *buf) {
    while (len > 0) {
        size_t want = len > MIB ? (size_t)MIB : (size_t)len;
        ssize_t got = pread(fd, buf, want, (off_t)off);
        if (got < 0) return KVS_ERR_IO;
        if (got == 0) break;
        kvs_sha256_update(h, buf, (size_t)got);
        off += (uint64_t)got;
        len -= (uint64_t)got;
    }
    return KVS_OK;
}

int srv_tiers_identity(const char *model_path, const eng_hparams *hp, int32_t n_ctx, const char *kv_dtype,
                       int32_t block_size, const char *device, const char *simd, uint8_t out[32], char *err,
                       size_t err_len) {
    int fd = open(model_path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return kvs_errf(err, err_len, KVS_ERR_IO, "kv_disk_dir: cannot read the model file '%s' for its identity",
                        model_path);
    }
    uint8_t *buf = malloc(MIB);
    if (!buf) {
        close(fd);
        return kvs_errf(err, err_len, KVS_ERR_NOMEM, "kv_disk_dir: out of memory");
    }
    kvs_sha256_ctx h;
    kvs_sha256_init(&h);
    char text[1024];
    uint64_t size = (uint64_t)st.st_size;
    int n = snprintf(text, sizeof text,
                     "kvserve kv tier 1|size %llu|arch %s|layers %d|kv heads %d|head dim %d|rot %d|base %.9g|"
                     "scale %.9g|neox %d|swa %d|base swa %.9g|ctx orig %d|attn factor %.9g|yarn %.9g %.9g %.9g|"
                     "n_ctx %d|kv %s|block %d|device %s|simd %s",
                     (unsigned long long)size, hp->arch_name, (int)hp->n_layer, (int)hp->n_head_kv, (int)hp->head_dim,
                     (int)hp->n_rot, (double)hp->rope_freq_base, (double)hp->rope_freq_scale, (int)hp->neox_rope,
                     (int)hp->n_swa, (double)hp->rope_freq_base_swa, (int)hp->n_ctx_orig,
                     (double)hp->rope_attn_factor, (double)hp->rope_yarn_ext, (double)hp->rope_yarn_beta_fast,
                     (double)hp->rope_yarn_beta_slow, (int)n_ctx, kv_dtype, (int)block_size, device, simd);
    kvs_sha256_update(&h, text, n > 0 && (size_t)n < sizeof text ? (size_t)n : sizeof text - 1);
    int rc = hash_slice(&h, fd, 0, MIB, buf);
    for (int i = 1; i <= 16 && rc == KVS_OK; i++) rc = hash_slice(&h, fd, size / 17 * (uint64_t)i, 64 << 10, buf);
    if (rc == KVS_OK) rc = hash_slice(&h, fd, size > MIB ? size - MIB : 0, MIB, buf);
    free(buf);
    close(fd);
    if (rc != KVS_OK)
        return kvs_errf(err, err_len, rc, "kv_disk_dir: cannot read the model file '%s' for its identity", model_path);
    kvs_sha256_final(&h, out);
    return KVS_OK;
}

int srv_tiers_open(const srv_config *cfg, const eng_model *model, eng_ctx *ctx, kvt_tier **out, char *err,
                   size_t err_len) {
    *out = NULL;
    if (!cfg->kv_disk_dir[0]) return KVS_OK;
    if (eng_ctx_device(ctx) != ENG_DEVICE_CPU)
        return kvs_errf(err, err_len, KVS_ERR_UNSUPPORTED, "kv_disk_dir: the disk tier takes a CPU KV pool only "
                        "(this context runs on the GPU; use --device cpu or leave kv_disk_dir empty)");
    const eng_hparams *hp = eng_model_hparams(model);
    kvt_params p;
    memset(&p, 0, sizeof p);
    p.dir = cfg->kv_disk_dir;
    p.max_bytes = (uint64_t)(cfg->kv_disk_gb * 1e9);
    int32_t n_ctx = cfg->ctx_size > 0 ? cfg->ctx_size : hp->n_ctx_train;
    int rc = srv_tiers_identity(cfg->model, hp, n_ctx, cfg->kv_dtype, cfg->block_size, "cpu",
                                eng_simd_name(eng_simd_detect()), p.identity, err, err_len);
    if (rc != KVS_OK) return rc;
    rc = kvt_open(&p, eng_ctx_cache(ctx), out);
    switch (rc) {
    case KVS_OK: return KVS_OK;
    case KVS_ERR_UNSUPPORTED:
        return kvs_errf(err, err_len, rc, "kv_disk_dir: the disk tier does not take this model's KV cache (a "
                        "sliding-window cache)");
    case KVS_ERR_INVALID:
        return kvs_errf(err, err_len, rc, "kv_disk_gb: %g GB is below one KV block's file", cfg->kv_disk_gb);
    case KVS_ERR_IO:
        return kvs_errf(err, err_len, rc, "kv_disk_dir: '%s' cannot be created or read", cfg->kv_disk_dir);
    default: return kvs_errf(err, err_len, rc, "kv_disk_dir: cannot open the disk tier: %s", kvs_strerror(rc));
    }
}

static void spill_to_disk(void *ctx, const kvh_block *b) {
    kvt_save(ctx, b->hash, b->has_parent, b->parent_hash, b->tokens, b->data, b->bytes);
}

int srv_tiers_open_host(const srv_config *cfg, eng_ctx *ctx, kvt_tier *disk, kvh_tier **out, char *err,
                        size_t err_len) {
    *out = NULL;
    if (cfg->kv_host_gb <= 0) return KVS_OK;
    if (eng_ctx_device(ctx) != ENG_DEVICE_CPU)
        return kvs_errf(err, err_len, KVS_ERR_UNSUPPORTED, "kv_host_gb: the host tier takes a CPU KV pool only (this "
                        "context runs on the GPU, whose pinned-memory copies are not built; use --device cpu or set "
                        "kv_host_gb 0)");
    kvh_params p;
    memset(&p, 0, sizeof p);
    p.max_bytes = (uint64_t)(cfg->kv_host_gb * 1e9);
    if (disk) {
        p.spill = spill_to_disk;
        p.spill_ctx = disk;
    }
    int rc = kvh_open(&p, eng_ctx_cache(ctx), out);
    switch (rc) {
    case KVS_OK: return KVS_OK;
    case KVS_ERR_UNSUPPORTED:
        return kvs_errf(err, err_len, rc, "kv_host_gb: the host tier does not take this model's KV cache (a "
                        "sliding-window cache)");
    case KVS_ERR_INVALID: return kvs_errf(err, err_len, rc, "kv_host_gb: %g GB is below one KV block", cfg->kv_host_gb);
    default:
        return kvs_errf(err, err_len, rc, "kv_host_gb: cannot allocate %g GB for the host tier: %s", cfg->kv_host_gb,
                        kvs_strerror(rc));
    }
}

int srv_tiers_slot(srv_sched *sched, kvt_tier *tier, const char *slot_dir, srv_api_slot_op *op) {
    op->err[0] = 0;
    op->n_tokens = 0;
    op->n_bytes = 0;
    if (!sched || !tier || !slot_dir || !slot_dir[0])
        return kvs_errf(op->err, sizeof op->err, KVS_ERR_UNSUPPORTED, "saved sessions need slot_save_path and "
                        "kv_disk_dir (the sessions' KV is kept by the disk tier)");
    int32_t *tok = NULL, n = 0;
    if (op->action == SRV_API_SLOT_ERASE) {
        int rc = srv_sched_slot_set(sched, op->id, NULL, 0, &op->n_tokens);
        return rc == KVS_ERR_INVALID ? kvs_errf(op->err, sizeof op->err, rc, "no slot %d", (int)op->id) : rc;
    }
    char path[2048];
    if (snprintf(path, sizeof path, "%s/%s", slot_dir, op->filename) >= (int)sizeof path)
        return kvs_errf(op->err, sizeof op->err, KVS_ERR_INVALID, "the file name is too long");
    if (op->action == SRV_API_SLOT_SAVE) {
        int rc = srv_sched_slot_tokens(sched, op->id, &tok, &n);
        if (rc == KVS_ERR_INVALID) return kvs_errf(op->err, sizeof op->err, rc, "no slot %d", (int)op->id);
        if (rc != KVS_OK) return kvs_errf(op->err, sizeof op->err, rc, "out of memory");
        if (n == 0) return kvs_errf(op->err, sizeof op->err, KVS_ERR_NOT_FOUND, "slot %d holds no conversation", (int)op->id);
        rc = kvt_export(tier, tok, n, path, &op->n_tokens, &op->n_bytes);
        free(tok);
        if (rc == KVS_ERR_NOT_FOUND)
            return kvs_errf(op->err, sizeof op->err, rc, "the KV of slot %d is no longer held (not one full block of "
                            "it is in the disk tier)", (int)op->id);
        if (rc != KVS_OK) return kvs_errf(op->err, sizeof op->err, rc, "cannot write %s: %s", op->filename, kvs_strerror(rc));
        return KVS_OK;
    }
    if (access(path, R_OK) != 0) return kvs_errf(op->err, sizeof op->err, KVS_ERR_NOT_FOUND, "no saved session %s", op->filename);
    int32_t old = 0;
    int rc = srv_sched_slot_tokens(sched, op->id, &tok, &old); /* checks the slot id first */
    free(tok);
    tok = NULL;
    if (rc == KVS_ERR_INVALID) return kvs_errf(op->err, sizeof op->err, rc, "no slot %d", (int)op->id);
    rc = kvt_import(tier, path, &tok, &n, &op->n_bytes);
    if (rc == KVS_ERR_FORMAT)
        return kvs_errf(op->err, sizeof op->err, rc, "%s is not a saved session of this model and its settings, or "
                        "is damaged", op->filename);
    if (rc == KVS_ERR_TOO_LARGE)
        return kvs_errf(op->err, sizeof op->err, KVS_ERR_INVALID, "%s is larger than kv_disk_gb", op->filename);
    if (rc != KVS_OK) return kvs_errf(op->err, sizeof op->err, rc, "cannot restore %s: %s", op->filename, kvs_strerror(rc));
    rc = srv_sched_slot_set(sched, op->id, tok, n, NULL);
    free(tok);
    if (rc != KVS_OK) return kvs_errf(op->err, sizeof op->err, rc, "out of memory");
    op->n_tokens = n;
    return KVS_OK;
}

void srv_tiers_on_cache_event(void *ctx, const kvc_event *ev) {
    srv_tiers_events *e = ctx;
    if (e->host) kvh_on_cache_event(e->host, ev);
    if (e->tier) kvt_on_cache_event(e->tier, ev);
    if (e->kvev) srv_kv_events_on_cache_event(e->kvev, ev);
}

void srv_tiers_step_end(void *ctx) {
    srv_tiers_events *e = ctx;
    if (!e->kvev) return;
    kvh_drain_events(e->host, srv_kv_events_on_host_event, e->kvev);
    kvt_drain_events(e->tier, srv_kv_events_on_tier_event, e->kvev);
    srv_kv_events_step_end(e->kvev);
}
