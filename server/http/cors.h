/*
 * cors.h: Cross-Origin Resource Sharing for kvserve's HTTP API (internal to server/, prefix srv_cors_).
 *
 * Lets a page served from another origin (a browser app, a notebook, an IDE's webview) call the API. Built from
 * the `cors_origins` setting:
 *   ""            automatic: "*" when the server listens on a loopback address (127.0.0.0/8, ::1, localhost),
 *                 no CORS headers otherwise
 *   "none"        no CORS headers (browsers then refuse cross-origin calls)
 *   "*"           any origin: Access-Control-Allow-Origin: * on every response
 *   a list        origins separated by commas (spaces around them are ignored), each "*", "null" or
 *                 scheme://host[:port] without a path, e.g. "http://localhost:3000, https://app.example.com".
 *                 A request whose Origin matches one (ASCII case-insensitively) gets it echoed in
 *                 Access-Control-Allow-Origin; every response carries Vary: Origin so that caches keep them
 *                 apart. A "*" anywhere in the list means any origin.
 * A response that allows the origin also says Access-Control-Expose-Headers: Retry-After, WWW-Authenticate (the
 * headers besides the CORS-safelisted ones that clients read). Credentials (cookies) are never allowed: the API
 * authenticates with a bearer key.
 *
 * Preflight (OPTIONS with Access-Control-Request-Method) is answered by the API layer with 204 and the lines of
 * srv_cors_preflight: the route's methods, the request headers the browser asked for (echoed when they are a
 * plain comma list of header names; otherwise Authorization, Content-Type) and Access-Control-Max-Age.
 *
 * Ownership: a srv_cors is created once (srv_cors_create) and read-only afterwards, so any thread may read it.
 */
#ifndef KVSERVE_SERVER_CORS_H
#define KVSERVE_SERVER_CORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/http/http.h"

enum {
    SRV_CORS_OK = 0,
    SRV_CORS_ERR_INVALID = -1,  /* the setting is malformed: err names the entry and why */
    SRV_CORS_ERR_NOMEM = -2,
};

#define SRV_CORS_MAX_ORIGINS 64     /* entries in one list */
#define SRV_CORS_MAX_ORIGIN_LEN 255 /* bytes of one entry */
#define SRV_CORS_MAX_AGE 7200       /* seconds a browser may cache a preflight answer (Chromium's cap) */

typedef struct srv_cors srv_cors;

/* Checks a cors_origins value without keeping it (what configuration loading calls). SRV_CORS_OK or
 * SRV_CORS_ERR_INVALID with a message in err (err_len may be 0). NULL is "". */
int srv_cors_check(const char *setting, char *err, size_t err_len);

/* Builds the policy from the setting and the listen address (for the automatic rule). Errors as
 * srv_cors_check, plus SRV_CORS_ERR_NOMEM. Free with srv_cors_free. */
int srv_cors_create(const char *setting, const char *host, srv_cors **out, char *err, size_t err_len);
void srv_cors_free(srv_cors *c);

/* True when host (an address literal or "localhost") is a loopback address. */
bool srv_cors_is_loopback(const char *host);
/* True when the policy adds any CORS header at all. */
bool srv_cors_enabled(const srv_cors *c);

/* The srv_http_header_hook (ud: the srv_cors, may be NULL): the Access-Control-Allow-Origin, Vary and
 * Access-Control-Expose-Headers lines this request's response needs. Returns their length (0: none; >= cap:
 * did not fit, buf then holds ""). */
size_t srv_cors_headers(void *ud, const srv_http_req *req, char *buf, size_t cap);

/* The preflight answer's lines for a route allowing `methods` (e.g. "POST"): Access-Control-Allow-Methods
 * (methods plus OPTIONS), Access-Control-Allow-Headers and Access-Control-Max-Age; without CORS (c NULL or
 * disabled) only "Allow: <methods>, OPTIONS". Same return convention as srv_cors_headers. */
size_t srv_cors_preflight(const srv_cors *c, const srv_http_req *req, const char *methods, char *buf, size_t cap);

#endif /* KVSERVE_SERVER_CORS_H */
