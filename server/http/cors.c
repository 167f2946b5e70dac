/* cors.c: the CORS policy and its response headers (see http.h). */
#include "server/http/http.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <uv.h>

#define EXPOSE "Access-Control-Expose-Headers: Retry-After, WWW-Authenticate\r\n"
#define DEFAULT_ALLOW_HEADERS "Authorization, Content-Type"
#define MAX_REQUEST_HEADERS_LEN 512 /* longest Access-Control-Request-Headers echoed back */

struct srv_cors {
    bool enabled;   /* false: no CORS headers */
    bool any;       /* "*": every origin */
    int32_t n;      /* listed origins (when !any) */
    char **origins;
};

/* scheme://host[:port], "null" or "*"; the reason for a bad one into why. */
static bool origin_ok(const char *o, size_t n, const char **why) {
    if (n == 1 && o[0] == '*') return true;
    if (n == 4 && !memcmp(o, "null", 4)) return true;
    if (n > SRV_CORS_MAX_ORIGIN_LEN) { *why = "is too long"; return false; }
    size_t i = 0;
    if (!isalpha((unsigned char)o[0])) { *why = "must look like scheme://host[:port]"; return false; }
    while (i < n && (isalnum((unsigned char)o[i]) || o[i] == '+' || o[i] == '-' || o[i] == '.')) i++;
    if (n - i < 4 || memcmp(o + i, "://", 3)) { *why = "must look like scheme://host[:port]"; return false; }
    i += 3;
    for (size_t k = i; k < n; k++) {
        unsigned char ch = (unsigned char)o[k];
        if (ch == '/' && k == n - 1) { *why = "must not end with '/' (an origin has no path)"; return false; }
        if (ch == '/' || ch == '?' || ch == '#') { *why = "must not have a path, query or fragment"; return false; }
        if (!(isalnum(ch) || strchr(".-_~%[]:", ch))) { *why = "has a character not allowed in an origin"; return false; }
    }
    return true;
}

/* Parses the setting; with c, fills it (c->origins allocated). */
static int parse(const char *setting, const char *host, srv_cors *c, char *err, size_t el) {
    const char *s = setting ? setting : "";
    while (*s == ' ' || *s == '\t') s++;
    if (!*s) { /* automatic */
        if (c) c->enabled = c->any = host && srv_cors_is_loopback(host);
        return SRV_CORS_OK;
    }
    if (!strcmp(s, "none")) return SRV_CORS_OK;
    int32_t count = 0;
    for (const char *p = s;;) {
        const char *e = strchr(p, ',');
        const char *end = e ? e : p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
        size_t n = (size_t)(b - a);
        const char *why = NULL;
        if (n == 0) why = "is empty";
        else if (count >= SRV_CORS_MAX_ORIGINS) why = "is one too many (at most 64 origins)";
        else origin_ok(a, n, &why);
        if (why) {
            if (el) snprintf(err, el, "entry %d '%.*s' %s", (int)count + 1, (int)(n > 80 ? 80 : n), a, why);
            return SRV_CORS_ERR_INVALID;
        }
        if (c) {
            c->enabled = true;
            if (n == 1 && a[0] == '*') c->any = true;
            char *copy = malloc(n + 1);
            if (!copy) return SRV_CORS_ERR_NOMEM;
            memcpy(copy, a, n);
            copy[n] = 0;
            c->origins[c->n++] = copy;
        }
        count++;
        if (!e) break;
        p = e + 1;
    }
    return SRV_CORS_OK;
}

int srv_cors_check(const char *setting, char *err, size_t el) { return parse(setting, NULL, NULL, err, el); }

int srv_cors_create(const char *setting, const char *host, srv_cors **out, char *err, size_t el) {
    if (!out) return SRV_CORS_ERR_INVALID;
    *out = NULL;
    int r = srv_cors_check(setting, err, el);
    if (r) return r;
    srv_cors *c = calloc(1, sizeof *c);
    if (!c || !(c->origins = calloc(SRV_CORS_MAX_ORIGINS, sizeof *c->origins))) {
        free(c);
        if (el) snprintf(err, el, "out of memory");
        return SRV_CORS_ERR_NOMEM;
    }
    r = parse(setting, host, c, err, el);
    if (r) {
        srv_cors_free(c);
        if (el) snprintf(err, el, "out of memory");
        return r;
    }
    *out = c;
    return SRV_CORS_OK;
}

void srv_cors_free(srv_cors *c) {
    if (!c) return;
    for (int32_t i = 0; i < c->n; i++) free(c->origins[i]);
    free(c->origins);
    free(c);
}

bool srv_cors_is_loopback(const char *host) {
    if (!host) return false;
    if (!strcasecmp(host, "localhost")) return true;
    struct sockaddr_in a4;
    if (uv_ip4_addr(host, 0, &a4) == 0) return (ntohl(a4.sin_addr.s_addr) >> 24) == 127;
    struct sockaddr_in6 a6;
    if (uv_ip6_addr(host, 0, &a6) == 0) {
        static const unsigned char one[16] = {[15] = 1};
        return !memcmp(&a6.sin6_addr, one, 16);
    }
    return false;
}

bool srv_cors_enabled(const srv_cors *c) { return c && c->enabled; }

/* Appends printf output to buf at *len; false when it does not fit. */
static bool put(char *buf, size_t cap, size_t *len, const char *fmt, const char *arg) {
    if (*len >= cap) return false;
    int n = snprintf(buf + *len, cap - *len, fmt, arg);
    if (n < 0 || (size_t)n >= cap - *len) return false;
    *len += (size_t)n;
    return true;
}

static size_t overflow(char *buf, size_t cap) {
    if (cap) buf[0] = 0;
    return cap ? cap : 1;
}

size_t srv_cors_headers(void *ud, const srv_http_req *req, char *buf, size_t cap) {
    const srv_cors *c = ud;
    if (cap) buf[0] = 0;
    if (!c || !c->enabled || !req) return 0;
    size_t len = 0;
    if (c->any) {
        if (!put(buf, cap, &len, "Access-Control-Allow-Origin: *\r\n%s", EXPOSE)) return overflow(buf, cap);
        return len;
    }
    if (!put(buf, cap, &len, "%s", "Vary: Origin\r\n")) return overflow(buf, cap);
    const char *origin = srv_http_header_get(req, "origin");
    if (!origin) return len;
    for (int32_t i = 0; i < c->n; i++) {
        if (strcasecmp(origin, c->origins[i])) continue;
        /* echo the request's spelling (it equals a validated entry, so it is safe in a header) */
        if (!put(buf, cap, &len, "Access-Control-Allow-Origin: %s\r\n", origin) || !put(buf, cap, &len, "%s", EXPOSE))
            return overflow(buf, cap);
        break;
    }
    return len;
}

/* A comma list of header names (RFC 9110 tokens) of reasonable length. */
static bool header_list_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > MAX_REQUEST_HEADERS_LEN) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (!(isalnum(ch) || strchr("!#$%&'*+-.^_`|~, ", ch))) return false;
    }
    return true;
}

size_t srv_cors_preflight(const srv_cors *c, const srv_http_req *req, const char *methods, char *buf, size_t cap) {
    if (cap) buf[0] = 0;
    size_t len = 0;
    if (!methods) methods = "GET";
    if (!c || !c->enabled) {
        if (!put(buf, cap, &len, "Allow: %s, OPTIONS\r\n", methods)) return overflow(buf, cap);
        return len;
    }
    const char *asked = req ? srv_http_header_get(req, "access-control-request-headers") : NULL;
    char age[32];
    snprintf(age, sizeof age, "%d", SRV_CORS_MAX_AGE);
    if (!put(buf, cap, &len, "Access-Control-Allow-Methods: %s, OPTIONS\r\n", methods) ||
        !put(buf, cap, &len, "Access-Control-Allow-Headers: %s\r\n",
             asked && header_list_ok(asked) ? asked : DEFAULT_ALLOW_HEADERS) ||
        !put(buf, cap, &len, "Access-Control-Max-Age: %s\r\n", age))
        return overflow(buf, cap);
    return len;
}
