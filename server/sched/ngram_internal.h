/*
 * ngram_internal.h: the n-gram (prompt lookup) proposer of speculative decoding (sched/ngram.c, prefix
 * srv_ngram_; private to server/sched/). Pure: no state, no allocation, no thread of its own.
 *
 * The proposal: the last n tokens of a sequence (its prompt and what it generated so far) are looked up among
 * its earlier tokens, the longest n from n_max down to n_min that occurs, its most recent occurrence; the tokens
 * that followed that occurrence are the guess for what follows now. When the occurrence ends fewer than k tokens
 * before the end (a sequence that repeats with a short period d), the guess keeps repeating that period: the
 * proposed token j is the one d places before it in the sequence extended by the guess itself.
 */
#ifndef KVSERVE_SERVER_NGRAM_INTERNAL_H
#define KVSERVE_SERVER_NGRAM_INTERNAL_H

#include <stdint.h>

/* Writes up to k proposed tokens for the continuation of toks[0..len) into out[0..k) and returns how many
 * (0 when no n-gram of length n_min..n_max occurs earlier, or when the arguments are out of range: toks or out
 * NULL, len < 2, k < 1, n_min < 1, n_max < n_min). Any thread; reads toks, writes only out. */
int32_t srv_ngram_propose(const int32_t *toks, int32_t len, int32_t n_min, int32_t n_max, int32_t k, int32_t *out);

#endif
