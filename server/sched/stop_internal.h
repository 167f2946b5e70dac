/*
 * stop_internal.h: streaming stop-string matching over detokenized text (sched/stop.c, prefix srv_stop_;
 * private to server/sched/). Pure, no threads.
 *
 * Text arrives in arbitrary pieces (one token's text at a time). The matcher emits text as soon as it cannot
 * be part of a stop string, holds back a tail that could still be the start of one, and on a match cuts the
 * text right before the earliest-starting stop string (matches across piece boundaries, inside one piece,
 * overlapping partial matches and several stop strings are all handled). After a match it emits nothing
 * more. At the end of a stream srv_stop_flush releases the held-back tail (nothing if stopped).
 *
 * Invariant: after every call, the concatenation of everything emitted equals T[0..k) where T is all text
 * pushed so far and k is the smallest position where either a stop string occurs in T or T[k..) is a proper
 * prefix of some stop string (k = |T| if neither). Valid UTF-8 in gives valid UTF-8 out when the stop
 * strings are valid UTF-8 (a cut falls on a stop string's first byte, a character boundary).
 */
#ifndef KVSERVE_SERVER_STOP_INTERNAL_H
#define KVSERVE_SERVER_STOP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    SRV_STOP_OK = KVS_OK,
    SRV_STOP_ERR_INVALID = KVS_ERR_INVALID, /* NULL where not allowed */
    SRV_STOP_ERR_NOMEM = KVS_ERR_NOMEM,
};

typedef struct srv_stop srv_stop;

/* Creates a matcher for stops[0..n_stops) (copied; NULL or empty strings are ignored; n_stops may be 0, then
 * everything passes through). Errors: SRV_STOP_ERR_INVALID (stops NULL with n_stops > 0), SRV_STOP_ERR_NOMEM. */
int srv_stop_create(const char *const *stops, size_t n_stops, srv_stop **out);
void srv_stop_free(srv_stop *s); /* NULL is a no-op */

/* Feeds text[0..len) and returns in *out / *out_len the text now safe to emit (pointing into the matcher,
 * valid until the next call on it; *out may be NULL when *out_len == 0). *stopped becomes true (and stays
 * true) once a stop string matched; then the emitted text ends right before it and later pushes emit
 * nothing. Errors: SRV_STOP_ERR_INVALID, SRV_STOP_ERR_NOMEM (nothing consumed). */
int srv_stop_push(srv_stop *s, const char *text, size_t len, const char **out, size_t *out_len, bool *stopped);

/* End of stream: returns the held-back text (empty after a match) and empties the matcher's buffer. */
int srv_stop_flush(srv_stop *s, const char **out, size_t *out_len);

/* Whether a stop string matched, and which (index into the stops given to create, or -1). */
bool srv_stop_is_stopped(const srv_stop *s);
int32_t srv_stop_matched_index(const srv_stop *s);

/* Bytes currently held back. */
size_t srv_stop_held(const srv_stop *s);

#ifdef __cplusplus
}
#endif
#endif /* KVSERVE_SERVER_STOP_INTERNAL_H */
