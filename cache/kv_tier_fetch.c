/* kv_tier_fetch.c: the disk tier's asynchronous loads: a loader thread reads and checks the runs of blocks a fetch
 * asks for, the cache thread places them (see kv_tier.h, kvt_fetch_*). */
#include "cache/kvc_internal.h"
#include "cache/kvt_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct kvt_fetch {
    struct kvt_fetch *next;
    int32_t k0;               /* first block (of the prompt) asked for */
    int32_t n_blocks;         /* blocks asked for */
    int32_t n_good;           /* blocks read and checked, from k0 on (the loader's answer) */
    bool done, cancelled;     /* guarded by the tier's mu */
    uint64_t *hashes;         /* [k0 + n_blocks] the prompt's chain hashes up to the last block asked for */
    int32_t *tokens;          /* [k0 + n_blocks][block_size] the prompt's tokens up to there */
    uint8_t *data;            /* [n_blocks][block_bytes] */
};

static void fetch_free(kvt_fetch *f) {
    if (!f) return;
    KVS_FREE_ALL(f->hashes, f->tokens, f->data);
    free(f);
}

/* The loader's work on one fetch (mu not held): runs found in the index, read, checked, until one is missing. */
static void fetch_run(kvt_tier *t, kvt_fetch *f) {
    int32_t k = f->k0, end = f->k0 + f->n_blocks;
    uint64_t sums[KVT_RUN_MAX];
    while (k < end) {
        int32_t slot, b, kmax = end - k > KVT_RUN_MAX ? k + KVT_RUN_MAX : end;
        uint64_t id;
        pthread_mutex_lock(&t->mu);
        bool stop = f->cancelled;
        int32_t m = stop ? 0 : kvt_find_run(t, f->hashes, f->tokens, k, kmax, &slot, &b, &id, sums);
        pthread_mutex_unlock(&t->mu);
        if (m <= 0) break;
        int32_t good = kvt_read_run(t, slot, id, b, m, sums, f->data + (size_t)(k - f->k0) * t->block_bytes);
        if (good <= 0) break;
        pthread_mutex_lock(&t->mu);
        t->stats.bytes_read += (uint64_t)good * t->block_bytes;
        pthread_mutex_unlock(&t->mu);
        k += good;
        if (good < m) break;
    }
    f->n_good = k - f->k0;
}

static void *loader_main(void *arg) {
    kvt_tier *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->lstop && !t->lq_head) pthread_cond_wait(&t->lcv, &t->mu);
        if (t->lstop) { /* what is still queued is answered empty: its owners place nothing and free it */
            for (kvt_fetch *f = t->lq_head; f; f = f->next) f->done = true;
            t->lq_head = t->lq_tail = NULL;
            pthread_cond_broadcast(&t->dcv);
            break;
        }
        kvt_fetch *f = t->lq_head;
        t->lq_head = f->next;
        if (!t->lq_head) t->lq_tail = NULL;
        f->next = NULL;
        pthread_mutex_unlock(&t->mu);
        fetch_run(t, f);
        pthread_mutex_lock(&t->mu);
        f->done = true;
        if (f->cancelled) fetch_free(f);
        pthread_cond_broadcast(&t->dcv);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int kvt_loader_start(kvt_tier *t) {
    pthread_cond_init(&t->lcv, NULL);
    pthread_cond_init(&t->dcv, NULL);
    if (pthread_create(&t->loader, NULL, loader_main, t) != 0) return KVS_ERR_THREAD;
    t->loader_started = true;
    return KVS_OK;
}

void kvt_loader_stop(kvt_tier *t) {
    if (!t->loader_started) return;
    pthread_mutex_lock(&t->mu);
    t->lstop = true;
    pthread_cond_broadcast(&t->lcv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->loader, NULL);
    t->loader_started = false;
    pthread_cond_destroy(&t->lcv);
    pthread_cond_destroy(&t->dcv);
}

int kvt_fetch_start(kvt_tier *t, const int32_t *tokens, int32_t n, int32_t have, int32_t max_blocks, kvt_fetch **out) {
    if (out) *out = NULL;
    if (!t || !out || !tokens || have < 0 || n < have || max_blocks < 1 || have % t->lay.block_size)
        return KVS_ERR_INVALID;
    int32_t bs = t->lay.block_size, k0 = have / bs, nb = n / bs;
    if (nb - k0 > max_blocks) nb = k0 + max_blocks;
    if (k0 >= nb || !t->loader_started) return KVS_ERR_NOT_FOUND;
    int rc = kvt_chain_hashes(t, tokens, nb);
    if (rc != KVS_OK) return rc;
    pthread_mutex_lock(&t->mu);
    t->stats.lookups++;
    int32_t e = kvt_index_find(t, t->hbuf[k0], k0 > 0, k0 > 0 ? t->hbuf[k0 - 1] : 0, tokens + (size_t)k0 * bs);
    pthread_mutex_unlock(&t->mu);
    if (e < 0) return KVS_ERR_NOT_FOUND;
    kvt_fetch *f = calloc(1, sizeof *f);
    if (!f) return KVS_ERR_NOMEM;
    f->k0 = k0;
    f->n_blocks = nb - k0;
    f->hashes = malloc((size_t)nb * sizeof *f->hashes);
    f->tokens = malloc((size_t)nb * (size_t)bs * sizeof *f->tokens);
    f->data = malloc((size_t)f->n_blocks * t->block_bytes);
    if (!f->hashes || !f->tokens || !f->data) {
        fetch_free(f);
        return KVS_ERR_NOMEM;
    }
    memcpy(f->hashes, t->hbuf, (size_t)nb * sizeof *f->hashes);
    memcpy(f->tokens, tokens, (size_t)nb * (size_t)bs * sizeof *f->tokens);
    pthread_mutex_lock(&t->mu);
    if (t->lq_tail) t->lq_tail->next = f;
    else t->lq_head = f;
    t->lq_tail = f;
    pthread_cond_broadcast(&t->lcv);
    pthread_mutex_unlock(&t->mu);
    *out = f;
    return KVS_OK;
}

bool kvt_fetch_done(kvt_tier *t, const kvt_fetch *f) {
    if (!t || !f) return true;
    pthread_mutex_lock(&t->mu);
    bool done = f->done;
    pthread_mutex_unlock(&t->mu);
    return done;
}

int kvt_fetch_place(kvt_tier *t, kvt_fetch *f, int32_t seq, int32_t max_blocks, int32_t *n_loaded) {
    if (n_loaded) *n_loaded = 0;
    if (!t || !f || !n_loaded) return KVS_ERR_INVALID;
    if (!kvt_fetch_done(t, f)) return KVS_ERR_STATE;
    int32_t bs = t->lay.block_size, placed = 0;
    int rc = KVS_OK;
    if (!kvc_seq_is_live(t->cache, seq) || kvc_seq_len(t->cache, seq) != f->k0 * bs) rc = KVS_ERR_INVALID;
    for (; rc == KVS_OK && placed < f->n_good && placed < max_blocks; placed++) {
        int32_t k = f->k0 + placed;
        rc = kvt_place_block(t, seq, k * bs, f->tokens + (size_t)k * bs, f->data + (size_t)placed * t->block_bytes);
        if (rc != KVS_OK) break;
    }
    pthread_mutex_lock(&t->mu);
    t->stats.hit_blocks += (uint64_t)placed;
    t->stats.hit_tokens += (uint64_t)placed * (uint64_t)bs;
    pthread_mutex_unlock(&t->mu);
    *n_loaded = placed * bs;
    fetch_free(f);
    return rc == KVC_ERR_FULL ? KVS_OK : rc;
}

void kvt_fetch_cancel(kvt_tier *t, kvt_fetch *f) {
    if (!t || !f) return;
    pthread_mutex_lock(&t->mu);
    bool free_now = f->done;
    if (!free_now) {
        f->cancelled = true; /* the loader frees it when it is done with it */
        /* still queued: unlink it and answer it now */
        kvt_fetch **pp = &t->lq_head, *prev = NULL;
        while (*pp && *pp != f) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp == f) {
            *pp = f->next;
            if (t->lq_tail == f) t->lq_tail = prev;
            free_now = true;
        }
    }
    pthread_mutex_unlock(&t->mu);
    if (free_now) fetch_free(f);
}

void kvt_fetch_wait(kvt_tier *t, uint64_t timeout_ns) {
    if (!t || !t->loader_started) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + timeout_ns;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    pthread_mutex_lock(&t->mu);
    pthread_cond_timedwait(&t->dcv, &t->mu, &ts);
    pthread_mutex_unlock(&t->mu);
}
