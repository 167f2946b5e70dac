/*
 * forward_cuda.h: the GPU path of an engine context (internal to the engine module). forward.c calls these
 * hooks only when the context runs on CUDA; everything CUDA-specific (building the cuda/ model description,
 * the device KV pool, batch marshalling, context-shift re-rotation) lives in forward_cuda.c.
 *
 * Threads: like eng_ctx, single-owner. Errors: ENG_ERR_* codes of engine/engine.h.
 */
#ifndef KVSERVE_ENGINE_FORWARD_CUDA_H
#define KVSERVE_ENGINE_FORWARD_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "cache/kv_cache.h"
#include "engine/engine.h"

typedef struct eng_cuda eng_cuda;

/* Resolves the device of a context. p has n_ctx, max_seqs, max_batch_tokens and kv_block_size already
 * resolved (positive) by eng_ctx_create.
 *   device CPU: returns 0 with *out = NULL, *cache_out untouched (the caller runs on the CPU).
 *   device AUTO: with no CUDA device (or a build without CUDA), or a model the CUDA kernels cannot run or
 *     that does not fit in device memory (ENG_ERR_UNSUPPORTED / ENG_ERR_NOMEM from cud_backend_create: a
 *     note goes to stderr), returns 0 with *out = NULL; else as CUDA.
 *   device CUDA: uploads the model, creates the KV cache in device memory (*cache_out, owned by the caller,
 *     which frees it with kvc_free BEFORE eng_cuda_free) and returns 0 with *out set.
 * Errors (err gets a message): ENG_ERR_DEVICE ("no CUDA device found"), ENG_ERR_UNSUPPORTED ("built without
 * CUDA", a KV dtype other than f16/f32, a tensor type without CUDA kernels), ENG_ERR_INVALID (parameters),
 * ENG_ERR_NOMEM (host or device memory; err gives sizes). Nothing is left allocated on error. */
int eng_cuda_create(const eng_model *model, const eng_ctx_params *p, eng_cuda **out, kvc_cache **cache_out,
                    char *err, size_t err_len);
/* Frees the backend (after the cache that lives in its memory). NULL is a no-op. */
void eng_cuda_free(eng_cuda *g);

/* eng_decode, eng_get_logits and eng_seq_remove of a CUDA context (same contracts as in engine.h). */
int eng_cuda_decode(eng_cuda *g, kvc_cache *cache, const eng_batch *b);
float *eng_cuda_get_logits(eng_cuda *g, int32_t i);
int eng_cuda_seq_remove(eng_cuda *g, kvc_cache *cache, int32_t seq, int32_t begin, int32_t end);

/* The GPU's name ("" when none). */
const char *eng_cuda_device_name(const eng_cuda *g);

#endif /* KVSERVE_ENGINE_FORWARD_CUDA_H */
