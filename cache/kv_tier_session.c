/* kv_tier_session.c: saved sessions over the disk tier: a chain of blocks exported into one file, and such a file
 * checked and imported back (see kv_tier.h, kvt_export / kvt_import). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cache/kvc_internal.h"
#include "cache/kvt_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Where block k of an export comes from. */
typedef struct src_block {
    uint64_t file_id, off, sum;
} src_block;

/* The chain of tokens' full blocks held by the index, from the first: its sources; returns the count. mu held. */
static int32_t find_chain(kvt_tier *t, const int32_t *tokens, int32_t nb, uint64_t *hashes, src_block *src) {
    int32_t bs = t->lay.block_size, k = 0;
    uint64_t parent = KVC_HASH_ROOT;
    for (; k < nb; k++) {
        const int32_t *tok = tokens + (size_t)k * bs;
        uint64_t h = chain_hash(t->cache, parent, tok);
        int32_t e = kvt_index_find(t, h, k > 0, parent, tok);
        if (e < 0) break;
        const kvt_file *f = t->files[t->ents[e].file];
        int32_t b = t->ents[e].blk;
        hashes[k] = h;
        src[k] = (src_block){f->id, sizeof(kvt_file_header) + (uint64_t)f->n_blocks * t->table_entry +
                                        (uint64_t)b * t->block_bytes, f->sums[b]};
        parent = h;
    }
    return k;
}

/* Writes header, table and the blocks' data (read from their files, checked) to fd. */
static int write_export(kvt_tier *t, int fd, const int32_t *tokens, int32_t m, const uint64_t *hashes,
                        const src_block *src) {
    size_t bs = (size_t)t->lay.block_size, tb = (size_t)m * t->table_entry;
    uint8_t *meta = malloc(sizeof(kvt_file_header) + tb), *data = malloc(t->block_bytes);
    int rc = meta && data ? KVS_OK : KVS_ERR_NOMEM;
    for (int32_t b = 0; rc == KVS_OK && b < m; b++) {
        uint8_t *e = meta + sizeof(kvt_file_header) + (size_t)b * t->table_entry;
        memcpy(e, &hashes[b], 8);
        memcpy(e + 8, &src[b].sum, 8);
        memcpy(e + 16, tokens + (size_t)b * bs, bs * sizeof *tokens);
    }
    if (rc == KVS_OK) {
        kvt_file_header h;
        kvt_fill_header(t, &h, m);
        h.table_checksum = XXH3_64bits(meta + sizeof h, tb);
        h.header_checksum = XXH3_64bits(&h, offsetof(kvt_file_header, header_checksum));
        memcpy(meta, &h, sizeof h);
        rc = kvt_write_all(fd, meta, sizeof h + tb);
    }
    int in = -1;
    uint64_t in_id = UINT64_MAX;
    for (int32_t b = 0; rc == KVS_OK && b < m; b++) {
        if (src[b].file_id != in_id) {
            char p[4096];
            if (in >= 0) close(in);
            in_id = src[b].file_id;
            in = kvt_path(t, in_id, ".kvt", p, sizeof p) == KVS_OK ? open(p, O_RDONLY | O_CLOEXEC) : -1;
        }
        if (in < 0 || pread(in, data, t->block_bytes, (off_t)src[b].off) != (ssize_t)t->block_bytes ||
            XXH3_64bits(data, t->block_bytes) != src[b].sum)
            rc = KVS_ERR_IO;
        else
            rc = kvt_write_all(fd, data, t->block_bytes);
    }
    if (in >= 0) close(in);
    free(meta);
    free(data);
    return rc;
}

int kvt_export(kvt_tier *t, const int32_t *tokens, int32_t n, const char *path, int32_t *n_saved, uint64_t *bytes) {
    if (!t || !path || !n_saved || !bytes || n < 0 || (n > 0 && !tokens)) return KVS_ERR_INVALID;
    *n_saved = 0;
    *bytes = 0;
    int32_t nb = n / t->lay.block_size;
    if (nb > KVT_FILE_MAX_BLOCKS) nb = KVT_FILE_MAX_BLOCKS;
    if (nb == 0) return KVS_ERR_NOT_FOUND;
    kvt_flush(t);
    uint64_t *hashes = malloc((size_t)nb * sizeof *hashes);
    src_block *src = malloc((size_t)nb * sizeof *src);
    char tmp[4200];
    if (!hashes || !src || snprintf(tmp, sizeof tmp, "%s.part", path) >= (int)sizeof tmp) {
        free(hashes);
        free(src);
        return hashes && src ? KVS_ERR_INVALID : KVS_ERR_NOMEM;
    }
    pthread_mutex_lock(&t->mu);
    int32_t m = find_chain(t, tokens, nb, hashes, src);
    pthread_mutex_unlock(&t->mu);
    int rc = m > 0 ? KVS_OK : KVS_ERR_NOT_FOUND;
    int fd = rc == KVS_OK ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
    if (rc == KVS_OK && fd < 0) rc = KVS_ERR_IO;
    if (rc == KVS_OK) rc = write_export(t, fd, tokens, m, hashes, src);
    if (rc == KVS_OK && fdatasync(fd) != 0) rc = KVS_ERR_IO;
    if (fd >= 0 && close(fd) != 0 && rc == KVS_OK) rc = KVS_ERR_IO;
    if (rc == KVS_OK && rename(tmp, path) != 0) rc = KVS_ERR_IO;
    if (rc != KVS_OK && fd >= 0) unlink(tmp);
    if (rc == KVS_OK) {
        *n_saved = m * t->lay.block_size;
        *bytes = kvt_file_bytes(t, m);
    }
    free(hashes);
    free(src);
    return rc;
}

/* Checks every block's data of f (read from fd) and copies the whole file to out_fd. */
static int check_copy(kvt_tier *t, const kvt_file *f, int fd, int out_fd) {
    size_t head = sizeof(kvt_file_header) + (size_t)f->n_blocks * t->table_entry;
    size_t chunk = head > t->block_bytes ? head : t->block_bytes;
    uint8_t *buf = malloc(chunk);
    if (!buf) return KVS_ERR_NOMEM;
    int rc = pread(fd, buf, head, 0) == (ssize_t)head ? kvt_write_all(out_fd, buf, head) : KVS_ERR_IO;
    for (int32_t b = 0; rc == KVS_OK && b < f->n_blocks; b++) {
        if (pread(fd, buf, t->block_bytes, (off_t)(head + (size_t)b * t->block_bytes)) != (ssize_t)t->block_bytes)
            rc = KVS_ERR_IO;
        else if (XXH3_64bits(buf, t->block_bytes) != f->sums[b])
            rc = KVS_ERR_FORMAT;
        else
            rc = kvt_write_all(out_fd, buf, t->block_bytes);
    }
    free(buf);
    return rc;
}

int kvt_import(kvt_tier *t, const char *path, int32_t **tokens, int32_t *n_tokens, uint64_t *bytes) {
    if (!t || !path || !tokens || !n_tokens || !bytes) return KVS_ERR_INVALID;
    *tokens = NULL;
    *n_tokens = 0;
    *bytes = 0;
    pthread_mutex_lock(&t->mu);
    uint64_t id = t->next_id++;
    pthread_mutex_unlock(&t->mu);
    const char *why;
    kvt_file *f = kvt_file_load(t, path, id, &why);
    if (!f) {
        if (!strcmp(why, "out of memory")) return KVS_ERR_NOMEM;
        if (!strcmp(why, "cannot be read")) return KVS_ERR_IO;
        kvt_warn(t, "%s cannot be restored: %s", path, why);
        return KVS_ERR_FORMAT;
    }
    if (f->has_parent) {
        kvt_warn(t, "%s cannot be restored: its blocks do not start a prompt", path);
        kvt_file_free(f);
        return KVS_ERR_FORMAT;
    }
    if (f->bytes > t->p.max_bytes) {
        kvt_file_free(f);
        return KVS_ERR_TOO_LARGE;
    }
    char tmp[4096], dst[4096];
    int fd = open(path, O_RDONLY | O_CLOEXEC), out = -1;
    int rc = fd >= 0 && kvt_path(t, id, ".part", tmp, sizeof tmp) == KVS_OK &&
                     kvt_path(t, id, ".kvt", dst, sizeof dst) == KVS_OK
                 ? KVS_OK
                 : KVS_ERR_IO;
    if (rc == KVS_OK && (out = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) < 0) rc = KVS_ERR_IO;
    if (rc == KVS_OK) rc = check_copy(t, f, fd, out);
    if (rc == KVS_OK && fdatasync(out) != 0) rc = KVS_ERR_IO;
    if (out >= 0 && close(out) != 0 && rc == KVS_OK) rc = KVS_ERR_IO;
    if (fd >= 0) close(fd);
    if (rc == KVS_OK && rename(tmp, dst) != 0) rc = KVS_ERR_IO;
    if (rc != KVS_OK) {
        if (out >= 0) unlink(tmp);
        if (rc == KVS_ERR_FORMAT) kvt_warn(t, "%s cannot be restored: a block does not match its checksum", path);
        kvt_file_free(f);
        return rc;
    }
    size_t nt = (size_t)f->n_blocks * (size_t)t->lay.block_size;
    int32_t *tk = malloc(nt * sizeof *tk);
    if (tk) memcpy(tk, f->tokens, nt * sizeof *tk);
    uint64_t size = f->bytes;
    pthread_mutex_lock(&t->mu);
    f->tick = ++t->tick;
    rc = tk ? kvt_index_add(t, f) : KVS_ERR_NOMEM;
    if (rc == KVS_OK) kvt_index_trim(t);
    pthread_mutex_unlock(&t->mu);
    if (rc != KVS_OK) {
        unlink(dst);
        kvt_file_free(f);
        free(tk);
        return rc;
    }
    *tokens = tk;
    *n_tokens = (int32_t)nt;
    *bytes = size;
    return KVS_OK;
}
