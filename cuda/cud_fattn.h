/* cud_fattn.h: the tensor-core prefill attention (cuda/cud_fattn.cuh) as the rest of the module and the tests see
 * it (internal to the cuda module).
 *
 * The C part is the GPU self-test, callable from the C test suites: it exists in every build (a build without
 * CUDA returns KVS_ERR_UNSUPPORTED from cuda/cud_fattn_stub.c). The CUDA part (the launcher) is compiled only
 * by nvcc. */
#ifndef KVSERVE_CUD_FATTN_H
#define KVSERVE_CUD_FATTN_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Runs on the GPU: (1) mma.sync m16n8k16 f16 and bf16 with random fragments in every lane against the host
 * emulation fa_mma_emul (within a few f32 ulps of the sum of |products|), (2) k_fattn on a synthetic f16 paged
 * pool (shuffled block tables, cached prefixes not a multiple of the block size, chunks of 1, 7, 64 and 200
 * rows, GQA groups 1, 4 and 8, head_dim 64 and 128) against a softmax in double on the host. Returns KVS_OK,
 * KVS_ERR_UNSUPPORTED without a device, KVS_ERR_DEVICE on a mismatch or a CUDA error; msg
 * (msg_len bytes, may be NULL) says what was checked or what differed. */
int cud_fattn_selftest(char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <cuda_runtime.h>

#include "cuda/cud_kernels.cuh"

typedef struct cud_fattn_args {
    const float *q;           /* [rows][n_head][hd] */
    float *out;               /* [rows][n_head][hd] */
    const int32_t *pos;       /* [rows] */
    const int32_t *seq_index; /* [rows] */
    const int32_t *tables;    /* [n_seqs][stride] */
    int32_t stride;
    const int32_t *tiles;     /* [n_tiles][2] first row, row count (fa_plan_tiles with cud_fattn_tile_rows) */
    int32_t n_tiles;
    int32_t n_head, n_kv_head, hd;
    float scale;
} cud_fattn_args;

/* Whether cud_fattn takes the shape: an f16 pool, head_dim 64 or 128, n_head / n_kv_head <= 16. */
bool cud_fattn_supported(int32_t n_head, int32_t n_kv_head, int32_t head_dim, bool f16);
/* Rows per tile for the shape (the R of fa_plan_tiles). */
int cud_fattn_tile_rows(int32_t n_head, int32_t n_kv_head);
/* Tiles of the batch (host arrays of n rows): writes at most n tiles (tiles [2 n]) and returns the count;
 * *longest: the longest run of consecutive positions of one sequence. */
int32_t cud_fattn_plan(const int32_t *pos, const int32_t *seq, int32_t n, int32_t n_head, int32_t n_kv_head,
                       int32_t *tiles, int32_t *longest);
/* The same attention as cud_paged_attention for the rows of a->tiles, one layer. */
cudaError_t cud_fattn(const cud_kv_view *kv, int32_t layer, const cud_fattn_args *a, cudaStream_t st);
#endif

#endif
