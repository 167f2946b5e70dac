/*
 * encoder_fwd.h: the forward pass of an encoder model (bert, nomic-bert; engine/model/encoder.h) on a CPU engine
 * context (internal to the engine module). eng_decode hands an encoder's batches here.
 *
 * Contract of a batch: every sequence in it is whole, its rows at positions 0 .. n-1 in order, one after the
 * other (a prompt is never split across batches: attention is bidirectional, so no row's hidden state is final
 * before every row of its sequence is known). The KV cache is only kept consistent (the rows get slots as in a
 * decoder, so the scheduler's accounting holds); nothing is read from or written to it, and nothing of a
 * sequence is needed after its batch.
 *
 * Outputs, valid until the next eng_decode: the last layer's hidden state of every row that wants it
 * (eng_get_embeddings; no final norm: BERT's last LayerNorm is inside its last layer) and, for a model with a
 * classification head, the head's n_cls_out outputs for each wanting row at position 0 (eng_get_rank).
 * Results are batch-invariant bit for bit: a row's numbers depend only on its own sequence.
 *
 * Errors: ENG_ERR_INVALID (a batch that breaks the contract, a position past the model's context, a bad token),
 * ENG_ERR_NOMEM, or the KV cache's error as eng_decode reports it.
 */
#ifndef KVSERVE_ENGINE_ENCODER_FWD_H
#define KVSERVE_ENGINE_ENCODER_FWD_H

#include "engine/engine.h"

struct eng_ctx;

int eng_encoder_decode(struct eng_ctx *c, const eng_batch *b);
void eng_encoder_ctx_free(struct eng_ctx *c); /* the encoder's scratch of a context; safe to call on any context */

#endif /* KVSERVE_ENGINE_ENCODER_FWD_H */
