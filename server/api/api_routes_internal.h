/* api_routes_internal.h: the routes of server/api/ that api_routes.c dispatches to (private to the folder), the
 * top of the folder: each uses the generation pipeline (api_gen_internal.h) and the low level (api_internal.h),
 * never another route.
 *   api_generate.c   /v1/completions, /v1/chat/completions (and /infill, whose body api_fim.c translates)
 *   api_responses.c  /v1/responses, and the store behind previous_response_id
 *   api_embed.c      /v1/embeddings
 *   api_messages.c   /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API)
 * api_routes.c itself holds the dispatch, the simple routes (health, models, metrics, tokenize, detokenize,
 * props, the page) and the srv_api lifetime.
 */
#ifndef KVSERVE_API_ROUTES_INTERNAL_H
#define KVSERVE_API_ROUTES_INTERNAL_H

#include "server/api/api_internal.h"

/* api_generate.c: registers the call, prepares it off the loop, then queues it (loop thread). */
void api_route_generate(srv_api *api, srv_http_req *req, srv_api_kind kind);

/* api_responses.c */
void api_route_responses(srv_api *api, srv_http_req *req);
api_resp_store *api_resp_store_create(void); /* NULL on failure */
void api_resp_store_free(api_resp_store *s);

/* api_messages.c: count_tokens answers {"input_tokens": N} without generating. */
void api_route_messages(srv_api *api, srv_http_req *req, bool count_tokens);

/* api_embed.c */
void api_route_embeddings(srv_api *api, srv_http_req *req);
/* POST /v1/rerank, /rerank, /v2/rerank (api_rerank.c). */
void api_route_rerank(srv_api *api, srv_http_req *req);

/* api_slots.c: POST /slots/{id}?action=save|restore|erase (id_text: what follows "/slots/"). */
void api_route_slots(srv_api *api, srv_http_req *req, const char *id_text);
/* Whether a slot file name is safe to join to the slot directory (no path, see api_slots.c). */
bool api_slot_filename_ok(const char *name);

#endif /* KVSERVE_API_ROUTES_INTERNAL_H */
