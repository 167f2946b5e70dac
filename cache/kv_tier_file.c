/* kv_tier_file.c: the disk tier's file format, its start-up scan and its writer thread (see kv_tier.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cache/kvc_internal.h"
#include "cache/kvt_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(sizeof(kvt_file_header) == 120, "the header's layout is the file format");

uint64_t kvt_file_bytes(const kvt_tier *t, int32_t n_blocks) {
    return sizeof(kvt_file_header) + (uint64_t)n_blocks * (t->table_entry + t->block_bytes);
}

void kvt_run_free(kvt_run *r) {
    if (!r) return;
    free(r->tokens);
    free(r->data);
    free(r);
}

void kvt_fill_header(const kvt_tier *t, kvt_file_header *h, int32_t n_blocks) {
    memset(h, 0, sizeof *h);
    memcpy(h->magic, KVT_MAGIC, 8);
    h->version = KVT_VERSION;
    h->endian = KVT_ENDIAN;
    memcpy(h->identity, t->p.identity, sizeof h->identity);
    h->dtype = (int32_t)t->lay.dtype;
    h->block_size = t->lay.block_size;
    h->n_layer = t->lay.n_layer;
    h->n_kv_head = t->lay.n_kv_head;
    h->head_dim = t->lay.head_dim;
    h->n_blocks = n_blocks;
    h->row_bytes = t->lay.row_bytes;
    h->block_stride = t->lay.block_stride;
}

/* ---- the start-up scan ------------------------------------------------------------------------------------- */
/* Why the header h (read from a file of `size` bytes) is not this tier's, or NULL when it is. */
static const char *header_problem(const kvt_tier *t, const kvt_file_header *h, uint64_t size) {
    if (memcmp(h->magic, KVT_MAGIC, 8)) return "not a kv tier file";
    if (h->endian != KVT_ENDIAN || h->version != KVT_VERSION) return "another version or byte order";
    if (XXH3_64bits(h, offsetof(kvt_file_header, header_checksum)) != h->header_checksum) return "corrupt header";
    kvt_file_header mine;
    kvt_fill_header(t, &mine, h->n_blocks);
    if (memcmp(h->identity, mine.identity, sizeof mine.identity)) return "written for another model or setting";
    if (h->dtype != mine.dtype || h->block_size != mine.block_size || h->n_layer != mine.n_layer ||
        h->n_kv_head != mine.n_kv_head || h->head_dim != mine.head_dim || h->row_bytes != mine.row_bytes ||
        h->block_stride != mine.block_stride)
        return "another KV layout (dtype, block size or shapes)";
    if (h->n_blocks < 1 || h->n_blocks > KVT_FILE_MAX_BLOCKS || h->has_parent > 1) return "corrupt header";
    if (size != kvt_file_bytes(t, h->n_blocks)) return size < kvt_file_bytes(t, h->n_blocks) ? "truncated" : "too long";
    return NULL;
}

kvt_file *kvt_file_load(kvt_tier *t, const char *path, uint64_t id, const char **why) {
    *why = "cannot be read";
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    kvt_file *f = NULL;
    uint8_t *table = NULL;
    struct stat st;
    kvt_file_header h;
    if (fstat(fd, &st) != 0) goto out;
    *why = "truncated";
    if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) goto out;
    if ((*why = header_problem(t, &h, (uint64_t)st.st_size))) goto out;
    *why = "out of memory";
    size_t tb = (size_t)h.n_blocks * t->table_entry, bs = (size_t)t->lay.block_size;
    table = malloc(tb);
    f = calloc(1, sizeof *f);
    if (!table || !f) goto fail;
    f->hashes = malloc((size_t)h.n_blocks * sizeof *f->hashes);
    f->sums = malloc((size_t)h.n_blocks * sizeof *f->sums);
    f->tokens = malloc((size_t)h.n_blocks * bs * sizeof *f->tokens);
    if (!f->hashes || !f->sums || !f->tokens) goto fail;
    *why = "truncated";
    if (pread(fd, table, tb, sizeof h) != (ssize_t)tb) goto fail;
    *why = "corrupt table";
    if (XXH3_64bits(table, tb) != h.table_checksum) goto fail;
    for (int32_t b = 0; b < h.n_blocks; b++) {
        const uint8_t *e = table + (size_t)b * t->table_entry;
        memcpy(&f->hashes[b], e, 8);
        memcpy(&f->sums[b], e + 8, 8);
        memcpy(f->tokens + (size_t)b * bs, e + 16, bs * sizeof *f->tokens);
        uint64_t parent = b ? f->hashes[b - 1] : h.has_parent ? h.parent_hash : KVC_HASH_ROOT;
        if (chain_hash(t->cache, parent, f->tokens + (size_t)b * bs) != f->hashes[b]) goto fail;
    }
    f->id = id;
    f->n_blocks = h.n_blocks;
    f->bytes = (uint64_t)st.st_size;
    f->tick = id;
    f->has_parent = h.has_parent != 0;
    f->parent_hash = h.parent_hash;
    *why = NULL;
    goto out;
fail:
    kvt_file_free(f);
    f = NULL;
out:
    free(table);
    close(fd);
    return f;
}

/* A name of the form <digits><suffix>; its number in *id. */
static bool parse_name(const char *name, const char *suffix, uint64_t *id) {
    size_t n = strlen(name), sl = strlen(suffix);
    if (n <= sl || n - sl > 19 || strcmp(name + n - sl, suffix)) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n - sl; i++) {
        if (name[i] < '0' || name[i] > '9') return false;
        v = v * 10 + (uint64_t)(name[i] - '0');
    }
    *id = v;
    return true;
}

static void scan_one(kvt_tier *t, const char *name) {
    char path[4096];
    uint64_t id;
    if (snprintf(path, sizeof path, "%s/%s", t->dir, name) >= (int)sizeof path) return;
    if (!strncmp(name, ".tmp-", 5) && parse_name(name + 5, ".part", &id)) {
        if (unlink(path) == 0) kvt_warn(t, "deleted %s (a write that did not finish)", path);
        if (id >= t->next_id) t->next_id = id + 1;
        return;
    }
    if (!parse_name(name, ".kvt", &id)) return; /* not the tier's: left alone */
    if (id >= t->next_id) t->next_id = id + 1;
    const char *why;
    kvt_file *f = kvt_file_load(t, path, id, &why);
    if (f && kvt_index_add(t, f) == KVS_OK) {
        if (id > t->tick) t->tick = id;
        return;
    }
    if (f) { /* out of memory: the file is fine, just not used */
        kvt_file_free(f);
        return;
    }
    if (!strcmp(why, "out of memory") || !strcmp(why, "cannot be read")) return;
    kvt_warn(t, "skipped %s (%s): deleted", path, why);
    unlink(path);
    t->stats.files_rejected++;
}

int kvt_scan(kvt_tier *t) {
    DIR *d = opendir(t->dir);
    if (!d) {
        kvt_warn(t, "cannot read the directory %s: %s", t->dir, strerror(errno));
        return KVS_ERR_IO;
    }
    pthread_mutex_lock(&t->mu);
    for (struct dirent *e; (e = readdir(d));) scan_one(t, e->d_name);
    pthread_mutex_unlock(&t->mu);
    closedir(d);
    return KVS_OK;
}

/* ---- the writer thread --------------------------------------------------------------------------------------- */
int kvt_write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return KVS_ERR_IO;
        b += w;
        n -= (size_t)w;
    }
    return KVS_OK;
}

/* Builds the kvt_file of run r (its first n blocks) and the header + table bytes in *meta. */
static kvt_file *run_to_file(kvt_tier *t, const kvt_run *r, int32_t n, uint64_t id, uint8_t **meta) {
    size_t bs = (size_t)t->lay.block_size, tb = (size_t)n * t->table_entry;
    kvt_file *f = calloc(1, sizeof *f);
    uint8_t *m = malloc(sizeof(kvt_file_header) + tb);
    if (f) {
        f->hashes = malloc((size_t)n * sizeof *f->hashes);
        f->sums = malloc((size_t)n * sizeof *f->sums);
        f->tokens = malloc((size_t)n * bs * sizeof *f->tokens);
    }
    if (!f || !m || !f->hashes || !f->sums || !f->tokens) {
        kvt_file_free(f);
        free(m);
        return NULL;
    }
    uint8_t *table = m + sizeof(kvt_file_header);
    for (int32_t b = 0; b < n; b++) {
        f->hashes[b] = r->hashes[b];
        f->sums[b] = XXH3_64bits(r->data + (size_t)b * t->block_bytes, t->block_bytes);
        memcpy(f->tokens + (size_t)b * bs, r->tokens + (size_t)b * bs, bs * sizeof *f->tokens);
        uint8_t *e = table + (size_t)b * t->table_entry;
        memcpy(e, &f->hashes[b], 8);
        memcpy(e + 8, &f->sums[b], 8);
        memcpy(e + 16, f->tokens + (size_t)b * bs, bs * sizeof *f->tokens);
    }
    kvt_file_header h;
    kvt_fill_header(t, &h, n);
    h.has_parent = r->has_parent;
    h.parent_hash = r->has_parent ? r->parent_hash : 0;
    h.table_checksum = XXH3_64bits(table, tb);
    h.header_checksum = XXH3_64bits(&h, offsetof(kvt_file_header, header_checksum));
    memcpy(m, &h, sizeof h);
    f->id = id;
    f->n_blocks = n;
    f->bytes = kvt_file_bytes(t, n);
    f->has_parent = r->has_parent;
    f->parent_hash = h.parent_hash;
    *meta = m;
    return f;
}

/* Writes run r as a new file (temp name, data synced, renamed) and indexes it. */
static void write_run(kvt_tier *t, const kvt_run *r) {
    int32_t n = r->n;
    while (n > 0 && kvt_file_bytes(t, n) > t->p.max_bytes) n--; /* a run larger than the whole tier: its head */
    pthread_mutex_lock(&t->mu);
    uint64_t id = t->next_id++;
    t->stats.blocks_dropped += (uint64_t)(r->n - n);
    pthread_mutex_unlock(&t->mu);
    char tmp[4096], path[4096];
    uint8_t *meta = NULL;
    kvt_file *f = n > 0 ? run_to_file(t, r, n, id, &meta) : NULL;
    if (!f || kvt_path(t, id, ".part", tmp, sizeof tmp) || kvt_path(t, id, ".kvt", path, sizeof path)) goto failed;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) goto failed;
    int rc = kvt_write_all(fd, meta, sizeof(kvt_file_header) + (size_t)n * t->table_entry);
    if (rc == KVS_OK) rc = kvt_write_all(fd, r->data, (size_t)n * t->block_bytes);
    if (rc == KVS_OK && fdatasync(fd) != 0) rc = KVS_ERR_IO;
    int err = errno;
    if (close(fd) != 0 && rc == KVS_OK) rc = KVS_ERR_IO;
    if (rc == KVS_OK && rename(tmp, path) != 0) rc = KVS_ERR_IO;
    if (rc != KVS_OK) {
        err = errno ? errno : err;
        unlink(tmp);
        kvt_warn(t, "cannot write %s: %s (%d blocks not saved)", path, strerror(err), (int)n);
        goto failed;
    }
    free(meta);
    pthread_mutex_lock(&t->mu);
    f->tick = ++t->tick;
    if (kvt_index_add(t, f) != KVS_OK) {
        unlink(path);
        pthread_mutex_unlock(&t->mu);
        kvt_file_free(f);
        return;
    }
    t->stats.blocks_written += (uint64_t)n;
    t->stats.bytes_written += f->bytes;
    kvt_index_trim(t);
    pthread_mutex_unlock(&t->mu);
    return;
failed:
    free(meta);
    kvt_file_free(f);
    pthread_mutex_lock(&t->mu);
    if (n > 0) t->stats.write_errors++;
    t->stats.blocks_dropped += (uint64_t)n;
    pthread_mutex_unlock(&t->mu);
}

static void *writer_main(void *arg) {
    kvt_tier *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->q_head && !t->stop) pthread_cond_wait(&t->cv, &t->mu);
        if (!t->q_head) break;
        kvt_run *r = t->q_head;
        t->q_head = r->next;
        if (!t->q_head) t->q_tail = NULL;
        t->writing = true;
        pthread_mutex_unlock(&t->mu);
        write_run(t, r);
        pthread_mutex_lock(&t->mu);
        t->q_bytes -= kvt_file_bytes(t, r->n);
        t->writing = false;
        kvt_run_free(r);
        pthread_cond_broadcast(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int kvt_writer_start(kvt_tier *t) {
    if (pthread_create(&t->thread, NULL, writer_main, t) != 0) return KVS_ERR_THREAD;
    t->thread_started = true;
    return KVS_OK;
}

void kvt_writer_stop(kvt_tier *t) {
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
    t->thread_started = false;
}
