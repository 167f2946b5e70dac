/* helper_vocab.h: a model's vocabulary as a gmr_vocab (the token pieces and flags through engine.h), shared by
 * test_grammar and bench/grammar_bench.c. */
#ifndef KVSERVE_TEST_HELPER_VOCAB_H
#define KVSERVE_TEST_HELPER_VOCAB_H

#include <stddef.h>

#include "grammar/grammar.h"

/* Loads the GGUF file's vocabulary (vocab_only) into *out: token t's piece as eng_token_to_piece gives it
 * (special tokens not rendered), eog and special flags from the engine. 0, or a kvs_err / eng code with a
 * message in err. */
int kvt_load_vocab(const char *gguf_path, gmr_vocab **out, char *err, size_t err_len);

#endif
