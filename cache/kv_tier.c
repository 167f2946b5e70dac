/* kv_tier.c: the disk tier's index, its lookups and loads, and its life (see kv_tier.h; the files and the writer
 * thread are in kv_tier_file.c). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cache/kvc_internal.h"
#include "cache/kvt_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- small helpers ---------------------------------------------------------------------------------------- */
void kvt_warn(kvt_tier *t, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (t->p.warn) t->p.warn(t->p.warn_ctx, msg);
    else fprintf(stderr, "kvserve: kv disk tier: %s\n", msg);
}

int kvt_path(const kvt_tier *t, uint64_t id, const char *suffix, char *out, size_t cap) {
    int n = snprintf(out, cap, "%s/%s%llu%s", t->dir, !strcmp(suffix, ".part") ? ".tmp-" : "",
                     (unsigned long long)id, suffix);
    return n > 0 && (size_t)n < cap ? KVS_OK : KVS_ERR_TOO_LARGE;
}

void kvt_file_free(kvt_file *f) {
    if (!f) return;
    free(f->hashes);
    free(f->sums);
    free(f->tokens);
    free(f);
}

/* ---- tier events (mu held) --------------------------------------------------------------------------------------- */
static void record(kvt_tier *t, kvc_event_kind kind, const kvt_file *f, int32_t b) {
    if (!t->events_on) return;
    if (t->ev.len / sizeof(kvt_ev) >= KVT_EVENTS_MAX) {
        t->stats.events_dropped++;
        return;
    }
    size_t bs = (size_t)t->lay.block_size;
    kvt_ev e = {.kind = kind, .hash = f->hashes[b], .tok = t->ev_tok.len / sizeof(int32_t)};
    if (kind == KVC_EVENT_STORED) {
        e.has_parent = b > 0 || f->has_parent;
        e.parent = b > 0 ? f->hashes[b - 1] : f->parent_hash;
        if (kvs_buf_append(&t->ev_tok, f->tokens + (size_t)b * bs, bs * sizeof(int32_t)) != KVS_OK) {
            t->stats.events_dropped++;
            return;
        }
    }
    if (kvs_buf_append(&t->ev, &e, sizeof e) != KVS_OK) t->stats.events_dropped++;
}

void kvt_events_enable(kvt_tier *t) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    if (!t->events_on) {
        t->events_on = true;
        for (int32_t i = 0; i < t->n_files; i++)
            for (int32_t b = 0; t->files[i] && b < t->files[i]->n_blocks; b++) record(t, KVC_EVENT_STORED, t->files[i], b);
    }
    pthread_mutex_unlock(&t->mu);
}

void kvt_drain_events(kvt_tier *t, kvc_event_cb cb, void *ctx) {
    if (!t || !cb) return;
    pthread_mutex_lock(&t->mu);
    if (!t->ev.len) {
        pthread_mutex_unlock(&t->mu);
        return;
    }
    kvs_buf ev = t->ev, tok = t->ev_tok;
    memset(&t->ev, 0, sizeof t->ev);
    memset(&t->ev_tok, 0, sizeof t->ev_tok);
    pthread_mutex_unlock(&t->mu);
    const kvt_ev *e = (const kvt_ev *)(const void *)ev.data;
    for (size_t i = 0; i < ev.len / sizeof *e; i++) {
        kvc_event k = {.kind = e[i].kind, .block = -1, .hash = e[i].hash, .has_parent = e[i].has_parent,
                       .parent_hash = e[i].parent, .block_size = t->lay.block_size,
                       .tokens = e[i].kind == KVC_EVENT_STORED ? (const int32_t *)(const void *)tok.data + e[i].tok : NULL};
        cb(ctx, &k);
    }
    kvs_buf_free(&ev);
    kvs_buf_free(&tok);
}

/* ---- the index (mu held) ------------------------------------------------------------------------------------- */
static uint32_t bucket(const kvt_tier *t, uint64_t h) { return (uint32_t)(h ^ (h >> 29)) & t->bucket_mask; }

static int grow_entries(kvt_tier *t, int32_t need) {
    int32_t n_free = 0;
    for (int32_t e = t->free_ent; e >= 0 && n_free < need; e = t->ents[e].next) n_free++;
    if (n_free >= need) return KVS_OK;
    int32_t cap = t->cap_ents ? t->cap_ents : 256;
    while (cap - t->cap_ents + n_free < need) cap *= 2;
    kvt_entry *e = realloc(t->ents, (size_t)cap * sizeof *e);
    if (!e) return KVS_ERR_NOMEM;
    t->ents = e;
    for (int32_t i = cap - 1; i >= t->cap_ents; i--) {
        e[i].next = t->free_ent;
        t->free_ent = i;
    }
    t->cap_ents = cap;
    return KVS_OK;
}

int kvt_index_add(kvt_tier *t, kvt_file *f) {
    int32_t slot = -1;
    for (int32_t i = 0; i < t->n_files && slot < 0; i++)
        if (!t->files[i]) slot = i;
    if (slot < 0) {
        if (t->n_files == t->cap_files) {
            int32_t cap = t->cap_files ? 2 * t->cap_files : 64;
            kvt_file **nf = realloc(t->files, (size_t)cap * sizeof *nf);
            if (!nf) return KVS_ERR_NOMEM;
            t->files = nf;
            t->cap_files = cap;
        }
        slot = t->n_files++;
        t->files[slot] = NULL;
    }
    if (grow_entries(t, f->n_blocks) != KVS_OK) return KVS_ERR_NOMEM;
    t->files[slot] = f;
    for (int32_t b = 0; b < f->n_blocks; b++) {
        int32_t e = t->free_ent;
        t->free_ent = t->ents[e].next;
        uint32_t k = bucket(t, f->hashes[b]);
        t->ents[e] = (kvt_entry){.hash = f->hashes[b], .file = slot, .blk = b, .next = t->buckets[k]};
        t->buckets[k] = e;
        record(t, KVC_EVENT_STORED, f, b);
    }
    t->total_bytes += f->bytes;
    t->stats.files++;
    t->stats.blocks += (uint64_t)f->n_blocks;
    t->stats.bytes = t->total_bytes;
    return KVS_OK;
}

void kvt_index_drop(kvt_tier *t, int32_t slot, bool unlink_it) {
    kvt_file *f = t->files[slot];
    if (!f) return;
    for (int32_t b = 0; b < f->n_blocks; b++) {
        int32_t *pp = &t->buckets[bucket(t, f->hashes[b])];
        while (*pp >= 0 && !(t->ents[*pp].file == slot && t->ents[*pp].blk == b)) pp = &t->ents[*pp].next;
        if (*pp < 0) continue;
        int32_t e = *pp;
        *pp = t->ents[e].next;
        t->ents[e].next = t->free_ent;
        t->free_ent = e;
        record(t, KVC_EVENT_REMOVED, f, b);
    }
    if (unlink_it) {
        char path[4096];
        if (kvt_path(t, f->id, ".kvt", path, sizeof path) == KVS_OK && unlink(path) != 0 && errno != ENOENT)
            kvt_warn(t, "cannot delete %s: %s", path, strerror(errno));
    }
    t->total_bytes -= f->bytes;
    t->stats.files--;
    t->stats.blocks -= (uint64_t)f->n_blocks;
    t->stats.bytes = t->total_bytes;
    t->files[slot] = NULL;
    kvt_file_free(f);
}

void kvt_index_trim(kvt_tier *t) {
    while (t->total_bytes > t->p.max_bytes) {
        int32_t lru = -1;
        for (int32_t i = 0; i < t->n_files; i++)
            if (t->files[i] && (lru < 0 || t->files[i]->tick < t->files[lru]->tick)) lru = i;
        if (lru < 0) return;
        kvt_index_drop(t, lru, true);
        t->stats.files_evicted++;
    }
}

int32_t kvt_index_find(const kvt_tier *t, uint64_t hash, bool has_parent, uint64_t parent, const int32_t *tok) {
    int32_t bs = t->lay.block_size;
    for (int32_t e = t->buckets[bucket(t, hash)]; e >= 0; e = t->ents[e].next) {
        const kvt_entry *en = &t->ents[e];
        if (en->hash != hash) continue;
        const kvt_file *f = t->files[en->file];
        bool hp = en->blk > 0 || f->has_parent;
        uint64_t ph = en->blk > 0 ? f->hashes[en->blk - 1] : f->parent_hash;
        if (hp != has_parent || (hp && ph != parent)) continue;
        if (memcmp(f->tokens + (size_t)en->blk * bs, tok, (size_t)bs * sizeof *tok)) continue;
        return e;
    }
    return -1;
}

/* ---- life ------------------------------------------------------------------------------------------------------ */
static int make_dir(kvt_tier *t) {
    struct stat st;
    if (stat(t->dir, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return KVS_OK;
        kvt_warn(t, "%s is not a directory", t->dir);
        return KVS_ERR_IO;
    }
    if (mkdir(t->dir, 0700) != 0 && errno != EEXIST) {
        kvt_warn(t, "cannot create the directory %s: %s", t->dir, strerror(errno));
        return KVS_ERR_IO;
    }
    return KVS_OK;
}

int kvt_open(const kvt_params *params, kvc_cache *cache, kvt_tier **out) {
    if (!params || !cache || !out || !params->dir || !params->dir[0]) return KVS_ERR_INVALID;
    *out = NULL;
    if (cache->swa || cache->p.sliding_window > 0 || cache->alloc != kvc_host_allocator()) return KVS_ERR_UNSUPPORTED;
    kvt_tier *t = calloc(1, sizeof *t);
    if (!t) return KVS_ERR_NOMEM;
    t->p = *params;
    if (!t->p.queue_bytes) t->p.queue_bytes = (uint64_t)256 << 20;
    t->cache = cache;
    kvc_get_layout(cache, &t->lay);
    t->table_entry = 16 + 4 * (size_t)t->lay.block_size;
    t->block_bytes = 2 * (size_t)t->lay.n_layer * t->lay.block_stride;
    t->free_ent = -1;
    t->dir = strdup(params->dir);
    uint32_t nb = 1024;
    t->buckets = malloc(nb * sizeof *t->buckets);
    if (!t->dir || !t->buckets) {
        free(t->dir);
        free(t->buckets);
        free(t);
        return KVS_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < nb; i++) t->buckets[i] = -1;
    t->bucket_mask = nb - 1;
    t->p.dir = t->dir;
    if (t->p.max_bytes < kvt_file_bytes(t, 1)) {
        free(t->dir);
        free(t->buckets);
        free(t);
        return KVS_ERR_INVALID;
    }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    int rc = make_dir(t);
    if (rc == KVS_OK) rc = kvt_scan(t);
    if (rc == KVS_OK) {
        pthread_mutex_lock(&t->mu);
        kvt_index_trim(t);
        pthread_mutex_unlock(&t->mu);
        rc = kvt_writer_start(t);
    }
    if (rc == KVS_OK) rc = kvt_loader_start(t);
    if (rc != KVS_OK) {
        kvt_close(t);
        return rc;
    }
    *out = t;
    return KVS_OK;
}

void kvt_close(kvt_tier *t) {
    if (!t) return;
    kvt_loader_stop(t);
    if (t->thread_started) {
        kvt_step_end(t);
        kvt_writer_stop(t);
    }
    kvt_run_free(t->cur);
    for (kvt_run *r = t->q_head, *n; r; r = n) {
        n = r->next;
        kvt_run_free(r);
    }
    for (int32_t i = 0; i < t->n_files; i++) kvt_file_free(t->files[i]);
    free(t->files);
    free(t->ents);
    free(t->buckets);
    free(t->rbuf);
    free(t->hbuf);
    kvs_buf_free(&t->ev);
    kvs_buf_free(&t->ev_tok);
    free(t->dir);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

void kvt_get_stats(kvt_tier *t, kvt_stats *out) {
    memset(out, 0, sizeof *out);
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    *out = t->stats;
    pthread_mutex_unlock(&t->mu);
}

/* ---- saving (cache thread) --------------------------------------------------------------------------------- */
static bool in_index(kvt_tier *t, const kvc_event *ev) {
    pthread_mutex_lock(&t->mu);
    bool hit = kvt_index_find(t, ev->hash, ev->has_parent, ev->parent_hash, ev->tokens) >= 0;
    pthread_mutex_unlock(&t->mu);
    return hit;
}

/* Appends block ev->block of the pool (or, when data is not NULL, the block_bytes at data, in the files' order) to
 * the current run (a new one when the chain breaks or the run is full). */
static void run_append(kvt_tier *t, const kvc_event *ev, const uint8_t *data) {
    kvt_run *r = t->cur;
    if (r && (r->n == KVT_RUN_MAX || !ev->has_parent || ev->parent_hash != r->hashes[r->n - 1])) {
        kvt_step_end(t);
        r = NULL;
    }
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) goto dropped;
        r->has_parent = ev->has_parent;
        r->parent_hash = ev->parent_hash;
        t->cur = r;
    }
    if (r->n == r->cap) {
        int32_t cap = r->cap ? 2 * r->cap : 4;
        if (cap > KVT_RUN_MAX) cap = KVT_RUN_MAX;
        int32_t *tk = realloc(r->tokens, (size_t)cap * (size_t)t->lay.block_size * sizeof *tk);
        if (tk) r->tokens = tk;
        uint8_t *d = tk ? realloc(r->data, (size_t)cap * t->block_bytes) : NULL;
        if (!d) goto dropped;
        r->data = d;
        r->cap = cap;
    }
    size_t bs = (size_t)t->lay.block_size;
    r->hashes[r->n] = ev->hash;
    memcpy(r->tokens + (size_t)r->n * bs, ev->tokens, bs * sizeof *ev->tokens);
    uint8_t *dst = r->data + (size_t)r->n * t->block_bytes;
    if (data) memcpy(dst, data, t->block_bytes);
    for (int32_t l = 0; !data && l < 2 * t->lay.n_layer; l++) {
        const uint8_t *src = (const uint8_t *)t->lay.base + (size_t)l * t->lay.layer_bytes +
                             (size_t)ev->block * t->lay.block_stride;
        memcpy(dst + (size_t)l * t->lay.block_stride, src, t->lay.block_stride);
    }
    r->n++;
    return;
dropped:
    pthread_mutex_lock(&t->mu);
    t->stats.blocks_dropped++;
    pthread_mutex_unlock(&t->mu);
}

void kvt_on_cache_event(void *ctx, const kvc_event *ev) {
    kvt_tier *t = ctx;
    if (!t || !ev || ev->kind != KVC_EVENT_STORED || ev->block_size != t->lay.block_size) return;
    if (t->cur && t->cur->n > 0 && t->cur->hashes[t->cur->n - 1] == ev->hash) return;
    if (in_index(t, ev)) return;
    run_append(t, ev, NULL);
}

void kvt_save(kvt_tier *t, uint64_t hash, bool has_parent, uint64_t parent_hash, const int32_t *tokens,
              const void *data, size_t bytes) {
    if (!t || !tokens || !data || bytes != t->block_bytes) return;
    kvc_event ev = {.kind = KVC_EVENT_STORED, .block = -1, .hash = hash, .has_parent = has_parent,
                    .parent_hash = has_parent ? parent_hash : 0, .tokens = tokens, .block_size = t->lay.block_size};
    if (t->cur && t->cur->n > 0 && t->cur->hashes[t->cur->n - 1] == hash) return;
    if (in_index(t, &ev)) return;
    run_append(t, &ev, data);
}

void kvt_step_end(kvt_tier *t) {
    if (!t || !t->cur) return;
    kvt_run *r = t->cur;
    t->cur = NULL;
    if (r->n == 0) {
        kvt_run_free(r);
        return;
    }
    uint64_t bytes = kvt_file_bytes(t, r->n);
    pthread_mutex_lock(&t->mu);
    if (t->stop || t->q_bytes + bytes > t->p.queue_bytes) {
        t->stats.blocks_dropped += (uint64_t)r->n;
        pthread_mutex_unlock(&t->mu);
        kvt_run_free(r);
        return;
    }
    if (t->q_tail) t->q_tail->next = r;
    else t->q_head = r;
    t->q_tail = r;
    t->q_bytes += bytes;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

void kvt_flush(kvt_tier *t) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    while (t->thread_started && (t->q_head || t->writing)) pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

/* ---- loading (cache thread) ------------------------------------------------------------------------------- */
/* Finds the longest run of blocks k0.. (hashes h[k0..kmax)) held by one file, consecutively; writes its slot, first
 * block and the data checksums; returns the count (0: not found). mu held. */
int32_t kvt_find_run(kvt_tier *t, const uint64_t *h, const int32_t *tokens, int32_t k0, int32_t kmax,
                     int32_t *slot, int32_t *blk, uint64_t *path_id, uint64_t *sums) {
    int32_t bs = t->lay.block_size;
    int32_t e = kvt_index_find(t, h[k0], k0 > 0, k0 > 0 ? h[k0 - 1] : 0, tokens + (size_t)k0 * bs);
    if (e < 0) return 0;
    kvt_file *f = t->files[t->ents[e].file];
    int32_t b = t->ents[e].blk, m = 0;
    while (k0 + m < kmax && b + m < f->n_blocks && f->hashes[b + m] == h[k0 + m] &&
           !memcmp(f->tokens + (size_t)(b + m) * bs, tokens + (size_t)(k0 + m) * bs, (size_t)bs * sizeof *tokens)) {
        sums[m] = f->sums[b + m];
        m++;
    }
    f->tick = ++t->tick;
    *slot = t->ents[e].file;
    *blk = b;
    *path_id = f->id;
    return m;
}

int32_t kvt_read_run(kvt_tier *t, int32_t slot, uint64_t id, int32_t b, int32_t m, const uint64_t *sums,
                     uint8_t *buf) {
    char path[4096];
    if (kvt_path(t, id, ".kvt", path, sizeof path) != KVS_OK) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t len = (size_t)m * t->block_bytes;
    uint64_t off = 0;
    pthread_mutex_lock(&t->mu);
    kvt_file *f = t->files[slot];
    bool same = f && f->id == id;
    if (same) off = sizeof(kvt_file_header) + (uint64_t)f->n_blocks * t->table_entry + (uint64_t)b * t->block_bytes;
    pthread_mutex_unlock(&t->mu);
    if (same && t->p.read_hook) t->p.read_hook(t->p.read_hook_ctx);
    ssize_t got = same ? pread(fd, buf, len, (off_t)off) : -1;
    close(fd);
    int32_t good = 0;
    if (got == (ssize_t)len)
        while (good < m && XXH3_64bits(buf + (size_t)good * t->block_bytes, t->block_bytes) == sums[good]) good++;
    if (got < 0 && !same) return -1;
    if (good < m) {
        pthread_mutex_lock(&t->mu);
        if (t->files[slot] && t->files[slot]->id == id) {
            kvt_index_drop(t, slot, true);
            t->stats.files_rejected++;
        }
        pthread_mutex_unlock(&t->mu);
        kvt_warn(t, "%s: block %d does not match its checksum (%s): the file is deleted", path, (int)(b + good),
                 got == (ssize_t)len ? "corrupt" : "truncated");
    }
    return good;
}

int kvt_place_block(kvt_tier *t, int32_t seq, int32_t pos, const int32_t *tok, const uint8_t *data) {
    int32_t bs = t->lay.block_size;
    kvc_entry ent[1024];
    int32_t slots[1024];
    if (bs < 1 || bs > 1024) return KVS_ERR_UNSUPPORTED;
    for (int32_t i = 0; i < bs; i++) ent[i] = (kvc_entry){.seq = seq, .pos = pos + i, .token = tok[i]};
    int rc = kvc_start_forward(t->cache, ent, bs, slots);
    if (rc != KVC_OK) return rc;
    int32_t blk = slots[0] / bs;
    for (int32_t i = 0; i < bs; i++)
        if (slots[i] != blk * bs + i) {
            kvc_finish_forward(t->cache, false);
            return KVS_ERR_STATE;
        }
    for (int32_t l = 0; l < 2 * t->lay.n_layer; l++)
        memcpy((uint8_t *)t->lay.base + (size_t)l * t->lay.layer_bytes + (size_t)blk * t->lay.block_stride,
               data + (size_t)l * t->lay.block_stride, t->lay.block_stride);
    return kvc_finish_forward(t->cache, true);
}

int kvt_chain_hashes(kvt_tier *t, const int32_t *tokens, int32_t nb) {
    if (nb > t->hcap) {
        uint64_t *h = realloc(t->hbuf, (size_t)nb * sizeof *h);
        if (!h) return KVS_ERR_NOMEM;
        t->hbuf = h;
        t->hcap = nb;
    }
    uint64_t parent = KVC_HASH_ROOT;
    for (int32_t k = 0; k < nb; k++)
        parent = t->hbuf[k] = chain_hash(t->cache, parent, tokens + (size_t)k * t->lay.block_size);
    return KVS_OK;
}

int kvt_load(kvt_tier *t, int32_t seq, const int32_t *tokens, int32_t n, int32_t have, int32_t max_blocks,
             int32_t *n_loaded) {
    if (n_loaded) *n_loaded = 0;
    if (!t || !n_loaded || n < have || have < 0 || (n > 0 && !tokens)) return KVS_ERR_INVALID;
    int32_t bs = t->lay.block_size;
    if (have % bs || kvc_seq_len(t->cache, seq) != have || !kvc_seq_is_live(t->cache, seq)) return KVS_ERR_INVALID;
    int32_t k = have / bs, nb = n / bs;
    if (k >= nb || max_blocks <= 0) return KVS_OK;
    if (nb - k > max_blocks) nb = k + max_blocks;
    if (!t->rbuf && !(t->rbuf = malloc((size_t)KVT_RUN_MAX * t->block_bytes))) return KVS_ERR_NOMEM;
    int rc = kvt_chain_hashes(t, tokens, nb);
    if (rc != KVS_OK) return rc;
    pthread_mutex_lock(&t->mu);
    t->stats.lookups++;
    pthread_mutex_unlock(&t->mu);
    while (k < nb) {
        int32_t slot, b, kmax = nb - k > KVT_RUN_MAX ? k + KVT_RUN_MAX : nb;
        uint64_t id, sums[KVT_RUN_MAX];
        pthread_mutex_lock(&t->mu);
        int32_t m = kvt_find_run(t, t->hbuf, tokens, k, kmax, &slot, &b, &id, sums);
        pthread_mutex_unlock(&t->mu);
        if (m <= 0) break;
        int32_t good = kvt_read_run(t, slot, id, b, m, sums, t->rbuf);
        if (good <= 0) break;
        int32_t placed = 0;
        for (; placed < good; placed++) {
            rc = kvt_place_block(t, seq, (k + placed) * bs, tokens + (size_t)(k + placed) * bs,
                             t->rbuf + (size_t)placed * t->block_bytes);
            if (rc != KVS_OK) break;
        }
        pthread_mutex_lock(&t->mu);
        t->stats.hit_blocks += (uint64_t)placed;
        t->stats.hit_tokens += (uint64_t)placed * (uint64_t)bs;
        t->stats.bytes_read += (uint64_t)good * t->block_bytes;
        pthread_mutex_unlock(&t->mu);
        *n_loaded += placed * bs;
        k += placed;
        if (rc != KVS_OK) return rc == KVC_ERR_FULL ? KVS_OK : rc;
        if (good < m) break;
    }
    return KVS_OK;
}
