/* helper_vocab.h: a model's vocabulary as a gmr_vocab (the token pieces and flags through engine.h), shared by
 * test_grammar and bench/grammar_bench.c. */
#ifndef KVSERVE_TEST_HELPER_VOCAB_H
#define KVSERVE_TEST_HELPER_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"

/* Loads the GGUF file's vocabulary (vocab_only) into *out: token t's piece as eng_token_to_piece gives it
 * (special tokens not rendered), eog and special flags from the engine. 0, or a kvs_err / eng code with a
 * message in err. */
int kvt_load_vocab(const char *gguf_path, gmr_vocab **out, char *err, size_t err_len);

/* A vocabulary's token bytes, for tests that brute-force masks or print outputs: pieces[t] (lens[t] bytes, NUL
 * added) as eng_token_to_piece gives it (special tokens not rendered), flags[t] GMR_TOKEN_EOG / _SPECIAL. */
typedef struct kvt_pieces {
    int32_t n;
    char **pieces;
    size_t *lens;
    uint8_t *flags;
} kvt_pieces;

/* kvt_load_vocab that also fills *pieces from the same load (pieces may be NULL). On failure nothing is left
 * allocated. */
int kvt_load_vocab_pieces(const char *gguf_path, gmr_vocab **out, kvt_pieces *pieces, char *err, size_t err_len);
void kvt_pieces_free(kvt_pieces *p);

#endif
