/* block_manager.c: the scheduler's view of the KV cache (see block_manager_internal.h). */
#include <stdint.h>
#include "server/sched/block_manager_internal.h"

void srv_block_manager_init(srv_block_manager *bm, kvc_cache *cache) {
    kvc_layout lay;
    kvc_get_layout(cache, &lay);
    bm->cache = cache;
    bm->block_size = lay.block_size;
    bm->n_blocks = lay.n_blocks;
    bm->tier = NULL;
    bm->host = NULL;
    bm->n_fetch = 0;
}

int srv_block_manager_seq_open(srv_block_manager *bm, int32_t *seq) { return kvc_seq_alloc(bm->cache, seq); }

static int32_t fetch_find(const srv_block_manager *bm, int32_t seq) {
    for (int32_t i = 0; i < bm->n_fetch; i++)
        if (bm->fetch[i].seq == seq) return i;
    return -1;
}

static void fetch_forget(srv_block_manager *bm, int32_t i) { bm->fetch[i] = bm->fetch[--bm->n_fetch]; }

void srv_block_manager_seq_close(srv_block_manager *bm, int32_t seq) {
    int32_t i = fetch_find(bm, seq);
    if (i >= 0) {
        kvt_fetch_cancel(bm->tier, bm->fetch[i].f);
        fetch_forget(bm, i);
    }
    kvc_seq_free(bm->cache, seq);
}

int32_t srv_block_manager_seq_len(const srv_block_manager *bm, int32_t seq) { return kvc_seq_len(bm->cache, seq); }

int32_t srv_block_manager_attach_prefix(srv_block_manager *bm, int32_t seq, const int32_t *tokens, int32_t n,
                                        int32_t donor, int32_t shared, bool *copied) {
    int32_t matched = 0, cached = 0;
    *copied = false;
    if (shared > 0 && kvc_prefix_match(bm->cache, tokens, n, &matched) == KVC_OK && shared > matched &&
        kvc_copy_prefix(bm->cache, donor, seq, shared) == KVC_OK) {
        /* with a sliding window the donor may have released blocks the new sequence would need */
        if (kvc_can_resume(bm->cache, seq, shared)) {
            *copied = true;
            return shared;
        }
        (void)kvc_remove(bm->cache, seq, 0, INT32_MAX, NULL); /* tail removal: always succeeds */
    }
    if (kvc_attach_prefix(bm->cache, seq, tokens, n, &cached) != KVC_OK) return 0;
    if (cached > 0 && !kvc_can_resume(bm->cache, seq, cached)) { /* recompute rather than miss the window */
        (void)kvc_remove(bm->cache, seq, 0, INT32_MAX, NULL);
        return 0;
    }
    return cached;
}

int32_t srv_block_manager_load_tier(srv_block_manager *bm, int32_t seq, const int32_t *tokens, int32_t n,
                                    int32_t have, int32_t max_blocks) {
    int32_t total = 0;
    if ((!bm->tier && !bm->host) || have % bm->block_size) return 0;
    for (;;) { /* on an error each call reports what it loaded before it */
        int32_t from_host = 0, from_disk = 0, left = max_blocks - total / bm->block_size;
        if (bm->host && left > 0) (void)kvh_load(bm->host, seq, tokens, n, have + total, left, &from_host);
        total += from_host;
        left -= from_host / bm->block_size;
        if (bm->tier && left > 0) (void)kvt_load(bm->tier, seq, tokens, n, have + total, left, &from_disk);
        total += from_disk;
        if (from_disk == 0 || !bm->host) return total;
    }
}

int32_t srv_block_manager_fetch_start(srv_block_manager *bm, int32_t seq, const int32_t *tokens, int32_t n,
                                      int32_t have, int32_t max_blocks, bool *pending) {
    *pending = false;
    if (!bm->tier || bm->n_fetch == SRV_BLOCK_MANAGER_FETCH_MAX || have % bm->block_size || fetch_find(bm, seq) >= 0)
        return srv_block_manager_load_tier(bm, seq, tokens, n, have, max_blocks);
    int32_t got = 0;
    if (bm->host) (void)kvh_load(bm->host, seq, tokens, n, have, max_blocks, &got);
    kvt_fetch *f = NULL;
    int32_t left = max_blocks - got / bm->block_size;
    if (left > 0 && kvt_fetch_start(bm->tier, tokens, n, have + got, left, &f) == KVS_OK) {
        bm->fetch[bm->n_fetch].seq = seq;
        bm->fetch[bm->n_fetch++].f = f;
        *pending = true;
    }
    return got;
}

int srv_block_manager_fetch_poll(srv_block_manager *bm, int32_t seq, const int32_t *tokens, int32_t n, int32_t max_blocks,
                                 int32_t *added) {
    *added = 0;
    int32_t i = fetch_find(bm, seq);
    if (i < 0) return 0;
    if (!kvt_fetch_done(bm->tier, bm->fetch[i].f)) return 1;
    kvt_fetch *f = bm->fetch[i].f;
    fetch_forget(bm, i);
    int32_t got = 0, more = 0;
    (void)kvt_fetch_place(bm->tier, f, seq, max_blocks, &got); /* on an error: what it placed before */
    int32_t len = kvc_seq_len(bm->cache, seq), left = max_blocks - got / bm->block_size;
    if (bm->host && got > 0 && left > 0 && len % bm->block_size == 0)
        (void)kvh_load(bm->host, seq, tokens, n, len, left, &more);
    *added = got + more;
    return 2;
}

bool srv_block_manager_fetch_wait(srv_block_manager *bm, uint64_t timeout_ns) {
    if (bm->n_fetch == 0) return false;
    for (int32_t i = 0; i < bm->n_fetch; i++)
        if (kvt_fetch_done(bm->tier, bm->fetch[i].f)) return true;
    kvt_fetch_wait(bm->tier, timeout_ns);
    return true;
}

int srv_block_manager_fork(srv_block_manager *bm, int32_t src, int32_t len, int32_t *dst) {
    int32_t seq;
    int rc = kvc_seq_alloc(bm->cache, &seq);
    if (rc != KVC_OK) return rc;
    rc = kvc_copy_prefix(bm->cache, src, seq, len);
    if (rc != KVC_OK) {
        kvc_seq_free(bm->cache, seq);
        return rc;
    }
    *dst = seq;
    return KVS_OK;
}

int srv_block_manager_truncate(srv_block_manager *bm, int32_t seq, int32_t len) {
    int rc = kvc_remove(bm->cache, seq, len, INT32_MAX, NULL);
    if (rc != KVC_OK) return rc;
    return kvc_can_resume(bm->cache, seq, len) ? KVS_OK : KVS_ERR_UNSUPPORTED;
}

int32_t srv_block_manager_available(const srv_block_manager *bm) { return kvc_blocks_available(bm->cache); }

int32_t srv_block_manager_needed(const srv_block_manager *bm, int32_t seq, int32_t n_tokens) {
    return kvc_blocks_needed(bm->cache, seq, n_tokens);
}

void srv_block_manager_stats(const srv_block_manager *bm, kvc_stats *out) { kvc_get_stats(bm->cache, out); }
