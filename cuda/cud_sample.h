/* cud_sample.h: token sampling on the GPU (cuda/cud_sample.cuh, cuda/cud_sample.cu) as C code sees it (internal
 * to the cuda module; the engine and the scheduler do not use it yet: see docs/DEVELOPERS.md, GPU section).
 *
 * One thread block per row over the vocabulary runs eng_sampler_sample's pipeline (engine/runtime/sampler.c) on
 * logits that stay on the device: the grammar mask (bit t of the row's mask clear: token t is -inf, as
 * gmr_mask_apply), raw log-probabilities and the top-N by raw logit, logit bias, penalties, greedy, temperature,
 * top-k, top-p, min-p and one draw with the row's xoshiro256** state. Only the results come back.
 * What a caller owns: the CPU sampler's state that the kernel cannot know — the RNG state (cud_sample_rng_seed
 * gives the state eng_sampler_create starts from) and the penalty window's counts (distinct tokens with their
 * counts; leave n_pen 0 when the sampler's penalties are off: penalty_last_n 0 or every penalty neutral). */
#ifndef KVSERVE_CUD_SAMPLE_H
#define KVSERVE_CUD_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One row's sampling parameters (the meaning of eng_sampling_params, checked the same way by cud_sample_rows). */
typedef struct cud_sample_params {
    float temperature, top_p, min_p;
    float repetition_penalty, presence_penalty, frequency_penalty;
    int32_t top_k;
    int32_t n_top_logprobs;   /* 0..KVS_MAX_TOP_LOGPROBS */
    uint64_t rng[4];          /* xoshiro256** state before this step */
} cud_sample_params;

typedef struct cud_sample_row {
    cud_sample_params p;
    const eng_logit_bias *bias; int32_t n_bias;           /* applied in order (repeated tokens add up) */
    const int32_t *pen_token, *pen_count; int32_t n_pen;  /* [n_pen] distinct tokens of the window, counts > 0 */
    const uint32_t *mask;     /* NULL, or [(n_vocab + 31) / 32] words: bit t set = token t allowed */
} cud_sample_row;

typedef struct cud_sample_out {
    int32_t status;           /* KVS_OK, or KVS_ERR_INVALID when every token is banned (as eng_sampler_sample) */
    eng_sample s;             /* token, its raw logprob, the top-N by raw logit */
    uint64_t rng[4];          /* the state after the step (advanced only when a draw was made) */
} cud_sample_out;

/* The xoshiro256** state eng_sampler_create derives from seed (splitmix64). */
void cud_sample_rng_seed(uint64_t seed, uint64_t rng[4]);

/* Device buffers of the sampler (parameters, bias and penalty lists, masks, the per-row work rows, the results),
 * grown on demand. Single-owner. */
typedef struct cud_sampler cud_sampler;
int cud_sampler_create(cud_sampler **out);
void cud_sampler_free(cud_sampler *s);

/* Samples n_rows rows of d_logits (device memory, row r at d_logits + r * ld, n_vocab floats each; not
 * modified) with rows[r], writing out[r]. stream: a cudaStream_t (NULL: the default stream); returns after the
 * results are on the host. Errors: KVS_ERR_INVALID (bad sizes or parameters, as eng_sampler_create),
 * KVS_ERR_NOMEM, KVS_ERR_DEVICE, KVS_ERR_UNSUPPORTED in a build without CUDA. */
int cud_sample_rows(cud_sampler *s, const float *d_logits, int64_t ld, int32_t n_rows, int32_t n_vocab,
                    const cud_sample_row *rows, cud_sample_out *out, void *stream);

/* Runs on the GPU: random rows (every option, masks, ties, -inf and NaN logits, vocabularies from 1 to 128k)
 * through k_sample and through the host emulation of the same block; tokens, statuses and RNG states must be
 * equal, logprobs within 1e-6. KVS_OK, KVS_ERR_UNSUPPORTED without a device, KVS_ERR_DEVICE on a mismatch. */
int cud_sample_selftest(char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif
#endif
