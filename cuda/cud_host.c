/* cud_host.c: host-side logic of the CUDA backend (block-table marshalling, launch geometry, graph
 * bookkeeping). Plain C, built in every configuration and tested without a GPU. In a build without CUDA it
 * also provides the device entry points, which report that no device exists. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_engine.h"
#include "engine/engine.h"

static int grow(void **buf, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return KVS_OK;
    size_t n = *cap ? *cap : 64;
    while (n < need) {
        if (n > SIZE_MAX / 2 / elem) return KVS_ERR_NOMEM;
        n *= 2;
    }
    void *p = realloc(*buf, n * elem);
    if (!p) return KVS_ERR_NOMEM;
    *buf = p;
    *cap = n;
    return KVS_OK;
}

int cud_tables_build(cud_tables *t, const cud_batch *b, int32_t block_size) {
    if (!t || !b || b->n_seqs < 1 || block_size < 1 || b->n < 0 || !b->seq_len || !b->block_tables ||
        !b->n_blocks)
        return KVS_ERR_INVALID;
    int32_t stride = 1;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int32_t len = b->seq_len[s];
        if (len < 0) return KVS_ERR_INVALID;
        int32_t need = (int32_t)(((int64_t)len + block_size - 1) / block_size);
        if (b->n_blocks[s] < need || (need > 0 && !b->block_tables[s])) return KVS_ERR_INVALID;
        if (need > stride) stride = need;
    }
    for (int32_t i = 0; i < b->n; i++)
        if (!b->seq_index || b->seq_index[i] < 0 || b->seq_index[i] >= b->n_seqs) return KVS_ERR_INVALID;
    if ((size_t)b->n_seqs > SIZE_MAX / (size_t)stride) return KVS_ERR_NOMEM;
    size_t total = (size_t)b->n_seqs * (size_t)stride;
    if (grow((void **)&t->tables, &t->cap, total, sizeof(int32_t)) ||
        grow((void **)&t->seq_len, &t->seq_cap, (size_t)b->n_seqs, sizeof(int32_t)))
        return KVS_ERR_NOMEM;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int32_t need = (int32_t)(((int64_t)b->seq_len[s] + block_size - 1) / block_size);
        int32_t *row = t->tables + (size_t)s * (size_t)stride;
        if (need > 0) memcpy(row, b->block_tables[s], (size_t)need * sizeof(int32_t));
        for (int32_t k = need; k < stride; k++) row[k] = -1;
        t->seq_len[s] = b->seq_len[s];
    }
    t->n_seqs = b->n_seqs;
    t->stride = stride;
    return KVS_OK;
}

void cud_tables_free(cud_tables *t) {
    if (!t) return;
    free(t->tables);
    free(t->seq_len);
    memset(t, 0, sizeof *t);
}

int cud_attn_plan(int32_t n_rows, int32_t n_head, int32_t head_dim, int32_t block_size, int32_t max_ctx,
                  int32_t n_sm, cud_attn_geometry *out) {
    if (!out || n_rows < 1 || n_head < 1 || head_dim < 1 || head_dim > 256 || block_size < 1 || max_ctx < 1 ||
        n_sm < 1)
        return KVS_ERR_INVALID;
    memset(out, 0, sizeof *out);
    /* One block of threads per (q head, row, partition). Without splitting there are n_rows * n_head
     * blocks; aim for at least 2 waves of blocks over the SMs, splitting long contexts into partitions of at
     * least 256 tokens (shorter partitions cost more in the reduction than they win in parallelism). */
    int64_t base_blocks = (int64_t)n_rows * n_head;
    int64_t want_blocks = 2LL * n_sm * 4; /* ~4 resident blocks per SM, two waves */
    int32_t parts = 1;
    if (base_blocks < want_blocks) {
        int64_t p = (want_blocks + base_blocks - 1) / base_blocks;
        int64_t max_p = (max_ctx + 255) / 256;
        parts = (int32_t)(p < max_p ? p : max_p);
        if (parts < 1) parts = 1;
    }
    int32_t part_tokens = (max_ctx + parts - 1) / parts;
    part_tokens = ((part_tokens + block_size - 1) / block_size) * block_size; /* whole blocks */
    parts = (max_ctx + part_tokens - 1) / part_tokens;
    out->partition_tokens = part_tokens;
    out->max_partitions = parts;
    out->grid_x = n_head;
    out->grid_y = n_rows;
    out->grid_z = parts;
    out->threads = 128;
    /* shared memory: the query vector (f32) and one score per token of a block, per warp. */
    out->shmem_bytes = (size_t)head_dim * sizeof(float) + (size_t)(out->threads / 32) * (size_t)block_size *
                                                              sizeof(float);
    out->needs_reduce = parts > 1;
    return KVS_OK;
}

static int32_t round_rows(int32_t n) {
    if (n <= 1) return 1;
    if (n <= 2) return 2;
    if (n <= 4) return 4;
    return (n + 7) / 8 * 8;
}

static int32_t round_pow2(int32_t n) {
    int32_t p = 1;
    while (p < n && p < (1 << 30)) p <<= 1;
    return p;
}

bool cud_graph_bucket(const cud_batch *b, int32_t max_rows, int32_t max_stride, cud_graph_key *out) {
    if (!b || !out || b->n < 1 || b->n_out != b->n || b->n_seqs != b->n) return false;
    int32_t stride = 1;
    for (int32_t s = 0; s < b->n_seqs; s++)
        if (b->n_blocks[s] > stride) stride = b->n_blocks[s];
    int32_t rows = round_rows(b->n);
    stride = round_pow2(stride);
    if (rows > max_rows || stride > max_stride) return false;
    out->n_rows = rows;
    out->table_stride = stride;
    return true;
}

#ifndef KVSERVE_HAVE_CUDA
/* A build without CUDA: no device, and the backend cannot be created. */
int32_t cud_available(char *name, size_t name_len) {
    if (name && name_len) name[0] = '\0';
    return 0;
}

int32_t cud_available_why(char *name, size_t name_len, char *why, size_t why_len) {
    if (why && why_len) snprintf(why, why_len, "built without CUDA");
    return cud_available(name, name_len);
}

int cud_measure_bandwidth(int32_t device, double *bytes_per_s) {
    (void)device;
    if (bytes_per_s) *bytes_per_s = 0;
    return KVS_ERR_UNSUPPORTED;
}

int cud_backend_create(const cud_model_desc *model, const cud_params *params, cud_backend **out,
                       size_t *kv_budget_bytes, char *err, size_t err_len) {
    (void)model; (void)params;
    if (out) *out = NULL;
    if (kv_budget_bytes) *kv_budget_bytes = 0;
    if (err && err_len) {
        strncpy(err, "this kvserve was built without CUDA (KVSERVE_CUDA=OFF or no nvcc)", err_len - 1);
        err[err_len - 1] = '\0';
    }
    return KVS_ERR_UNSUPPORTED;
}

void cud_backend_free(cud_backend *be) { (void)be; }
int cud_dequantize_host(uint32_t type, const void *data, size_t nbytes, int64_t rows, int64_t k, float *out) {
    (void)type; (void)data; (void)nbytes; (void)rows; (void)k; (void)out;
    return KVS_ERR_UNSUPPORTED;
}
const kvc_allocator *cud_kv_allocator(cud_backend *be) { (void)be; return NULL; }
int cud_backend_set_kv(cud_backend *be, const kvc_layout *layout) { (void)be; (void)layout; return KVS_ERR_UNSUPPORTED; }
int cud_forward(cud_backend *be, const cud_batch *batch, float *logits) {
    (void)be; (void)batch; (void)logits;
    return KVS_ERR_UNSUPPORTED;
}
int cud_rerotate(cud_backend *be, const int32_t *slots, int32_t n, int32_t delta) {
    (void)be; (void)slots; (void)n; (void)delta;
    return KVS_ERR_UNSUPPORTED;
}
#endif
