/* test_web.c: the CORS policy (settings, the headers each request gets, preflight lines, the automatic rule),
 * the HTTP layer's header hook over a real socket (plain, streamed, bodiless and the layer's own 413), and the
 * embedded chat page (the bytes of web/index.html, its CSP hashes, ETag revalidation) and /props. */
#include <criterion/criterion.h>

#include <cjson/cJSON.h>

#include <signal.h>

#include "common/common.h"
#include "server/http/http.h"
#include "helper_shared.h"
#include "srv_test_client.h"

/* A request with the given "name: value" headers (names lower-case, as the HTTP layer stores them). */
typedef struct fake_req { srv_http_req req; srv_http_header h[4]; } fake_req;

static srv_http_req *mkreq(fake_req *f, const char *origin, const char *asked) {
    memset(f, 0, sizeof *f);
    f->req.headers = f->h;
    if (origin) f->h[f->req.n_headers++] = (srv_http_header){"origin", (char *)origin};
    if (asked) f->h[f->req.n_headers++] = (srv_http_header){"access-control-request-headers", (char *)asked};
    return &f->req;
}

static srv_cors *cors(const char *setting, const char *host) {
    srv_cors *c = NULL;
    char err[256] = "";
    cr_assert_eq(srv_cors_create(setting, host, &c, err, sizeof err), SRV_CORS_OK, "%s: %s", setting, err);
    return c;
}

/* ---- the policy -------------------------------------------------------------------------------------------- */
Test(cors, automatic_rule_follows_the_listen_address) {
    static const struct { const char *host; bool loop; } H[] = {
        {"127.0.0.1", true}, {"127.4.5.6", true}, {"::1", true}, {"localhost", true}, {"LOCALHOST", true},
        {"0.0.0.0", false}, {"::", false}, {"10.0.0.1", false}, {"128.0.0.1", false}, {"::2", false},
        {"::ffff:127.0.0.1", false}, {"", false}, {"not-an-address", false},
    };
    for (size_t i = 0; i < sizeof H / sizeof H[0]; i++) {
        cr_assert_eq(srv_cors_is_loopback(H[i].host), H[i].loop, "%s", H[i].host);
        srv_cors *c = cors("", H[i].host);
        cr_assert_eq(srv_cors_enabled(c), H[i].loop, "%s", H[i].host);
        srv_cors_free(c);
    }
    cr_assert(!srv_cors_is_loopback(NULL));
}

Test(cors, headers_for_each_kind_of_setting) {
    static const struct { const char *setting; const char *origin; const char *want; } T[] = {
        {"*", "http://a.test", "Access-Control-Allow-Origin: *\r\nAccess-Control-Expose-Headers: Retry-After, WWW-Authenticate\r\n"},
        {"*", NULL, "Access-Control-Allow-Origin: *\r\nAccess-Control-Expose-Headers: Retry-After, WWW-Authenticate\r\n"},
        {"none", "http://a.test", ""},
        {"http://a.test, https://b.test:8443", "https://b.test:8443",
         "Vary: Origin\r\nAccess-Control-Allow-Origin: https://b.test:8443\r\nAccess-Control-Expose-Headers: Retry-After, WWW-Authenticate\r\n"},
        {"http://a.test", "HTTP://A.TEST",
         "Vary: Origin\r\nAccess-Control-Allow-Origin: HTTP://A.TEST\r\nAccess-Control-Expose-Headers: Retry-After, WWW-Authenticate\r\n"},
        {"http://a.test", "http://a.test:80", "Vary: Origin\r\n"},
        {"http://a.test", "http://a.test.evil", "Vary: Origin\r\n"},
        {"http://a.test", NULL, "Vary: Origin\r\n"},
        {"null", "null", "Vary: Origin\r\nAccess-Control-Allow-Origin: null\r\nAccess-Control-Expose-Headers: Retry-After, WWW-Authenticate\r\n"},
        {"http://a.test, *", "http://z.test", "Access-Control-Allow-Origin: *\r\nAccess-Control-Expose-Headers: Retry-After, WWW-Authenticate\r\n"},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        srv_cors *c = cors(T[i].setting, "10.0.0.1");
        fake_req f;
        char buf[512];
        size_t n = srv_cors_headers(c, mkreq(&f, T[i].origin, NULL), buf, sizeof buf);
        cr_assert_eq(n, strlen(T[i].want), "case %zu", i);
        cr_assert_str_eq(buf, T[i].want, "case %zu", i);
        /* too small a buffer: nothing, and a length >= cap says so */
        if (n > 0) {
            char small[8];
            cr_assert_geq(srv_cors_headers(c, &f.req, small, sizeof small), sizeof small);
            cr_assert_str_eq(small, "");
        }
        srv_cors_free(c);
    }
    char buf[64];
    fake_req f;
    cr_assert_eq(srv_cors_headers(NULL, mkreq(&f, "http://a.test", NULL), buf, sizeof buf), 0);
}

/* Whatever the Origin header holds, the output is whole header lines and echoes only a listed origin. */
Test(cors, random_origins_never_break_the_header_block) {
    srv_cors *c = cors("http://a.test, https://b.test:1", "127.0.0.1");
    uint64_t x = 99;
    const char alphabet[] = "ab.:/-_htps\r\n\" *%AB0";
    for (int i = 0; i < 20000; i++) {
        char origin[24];
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        int n = (int)(x % 20);
        for (int k = 0; k < n; k++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; origin[k] = alphabet[x % (sizeof alphabet - 1)]; }
        origin[n] = 0;
        if (i % 7 == 0) snprintf(origin, sizeof origin, "%s", i % 2 ? "http://a.test" : "https://B.test:1");
        fake_req f;
        char buf[512];
        size_t len = srv_cors_headers(c, mkreq(&f, origin, NULL), buf, sizeof buf);
        cr_assert_lt(len, sizeof buf);
        bool listed = !strcasecmp(origin, "http://a.test") || !strcasecmp(origin, "https://b.test:1");
        cr_assert_eq(strstr(buf, "Access-Control-Allow-Origin") != NULL, listed, "origin '%s'", origin);
        /* every CR is followed by LF and every LF preceded by CR: no injected lines */
        for (size_t k = 0; k < len; k++) {
            if (buf[k] == '\r') cr_assert_eq(buf[k + 1], '\n');
            if (buf[k] == '\n') cr_assert(k > 0 && buf[k - 1] == '\r');
        }
        cr_assert(len == 0 || (len >= 2 && !memcmp(buf + len - 2, "\r\n", 2)));
    }
    srv_cors_free(c);
}

Test(cors, preflight_lines) {
    srv_cors *c = cors("*", "10.0.0.1");
    fake_req f;
    char buf[1024];
    srv_cors_preflight(c, mkreq(&f, "http://a.test", "content-type, authorization, x-stainless-os"), "POST", buf, sizeof buf);
    cr_assert_str_eq(buf, "Access-Control-Allow-Methods: POST, OPTIONS\r\n"
                          "Access-Control-Allow-Headers: content-type, authorization, x-stainless-os\r\n"
                          "Access-Control-Max-Age: 7200\r\n");
    static const char *const refused[] = {"a\r\nb", "x;y", "a=b", "\"q\"", "", "(x)"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        srv_cors_preflight(c, mkreq(&f, "http://a.test", refused[i]), "GET", buf, sizeof buf);
        cr_assert(strstr(buf, "Access-Control-Allow-Headers: Authorization, Content-Type\r\n"), "'%s': %s", refused[i], buf);
    }
    char longest[600];
    memset(longest, 'a', sizeof longest - 1);
    longest[sizeof longest - 1] = 0;
    srv_cors_preflight(c, mkreq(&f, "http://a.test", longest), "GET", buf, sizeof buf);
    cr_assert(strstr(buf, "Allow-Headers: Authorization, Content-Type"), "an overlong list is not echoed");
    srv_cors_free(c);
    c = cors("none", "127.0.0.1");
    srv_cors_preflight(c, mkreq(&f, "http://a.test", NULL), "GET", buf, sizeof buf);
    cr_assert_str_eq(buf, "Allow: GET, OPTIONS\r\n");
    srv_cors_free(c);
}

Test(cors, malformed_settings_name_the_entry) {
    static const struct { const char *s; const char *needle; } B[] = {
        {"http://a.test/", "entry 1 'http://a.test/' must not end with '/'"},
        {"http://a.test, https://b.test/x", "entry 2 'https://b.test/x' must not have a path"},
        {"a.test", "scheme://host"},
        {"http://", "scheme://host"},
        {"http://a.test,", "entry 2 '' is empty"},
        {"http://a b", "not allowed"},
        {"http://a.test?x", "query"},
    };
    for (size_t i = 0; i < sizeof B / sizeof B[0]; i++) {
        char err[256] = "";
        cr_assert_eq(srv_cors_check(B[i].s, err, sizeof err), SRV_CORS_ERR_INVALID, "%s", B[i].s);
        cr_assert(strstr(err, B[i].needle), "%s: %s", B[i].s, err);
        srv_cors *c = (srv_cors *)1;
        cr_assert_eq(srv_cors_create(B[i].s, "127.0.0.1", &c, err, sizeof err), SRV_CORS_ERR_INVALID);
        cr_assert_null(c);
    }
    char many[64 * 20 + 64] = "";
    for (int i = 0; i < 65; i++) snprintf(many + strlen(many), sizeof many - strlen(many), "%shttp://h%d.test", i ? "," : "", i);
    char err[256];
    cr_assert_eq(srv_cors_check(many, err, sizeof err), SRV_CORS_ERR_INVALID);
    cr_assert(strstr(err, "at most 64"), "%s", err);
    static const char *const good[] = {"", "none", "*", "null", " http://a.test ,https://[::1]:8080 ",
                                       "chrome-extension://abcdef", "http://xn--bcher-kva.test:1"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        cr_assert_eq(srv_cors_check(good[i], err, sizeof err), SRV_CORS_OK, "%s: %s", good[i], err);
    cr_assert_eq(srv_cors_check(NULL, err, sizeof err), SRV_CORS_OK);
}

/* ---- the header hook in the HTTP layer, over a socket ------------------------------------------------------- */
typedef struct hook_srv { tc_loop L; srv_http *h; srv_cors *cors; int port; } hook_srv;

static void hook_handler(void *ud, srv_http_req *req) {
    (void)ud;
    if (!strcmp(req->path, "/stream")) {
        srv_http_stream_begin(req, 200, "text/event-stream", NULL);
        srv_http_stream_write(req, "data: 1\n\n", 9);
        srv_http_stream_end(req);
    } else if (!strcmp(req->path, "/empty")) {
        srv_http_respond(req, 204, NULL, "X-Extra: 1\r\n", "ignored", 7);
    } else {
        srv_http_respond(req, 200, "text/plain", NULL, "ok", 2);
    }
}

static void hook_stop(uv_loop_t *loop, void *ud) {
    (void)loop;
    srv_http_close(((hook_srv *)ud)->h);
}

Test(cors, hook_adds_headers_to_every_response) {
    signal(SIGPIPE, SIG_IGN);
    hook_srv s;
    memset(&s, 0, sizeof s);
    s.cors = cors("http://a.test", "127.0.0.1");
    srv_http_limits lim;
    srv_http_limits_default(&lim);
    lim.body_limit = 16;
    cr_assert_eq(tc_loop_init(&s.L, hook_stop, &s), 0);
    cr_assert_eq(srv_http_create(&s.L.loop, &lim, hook_handler, &s, &s.h), 0);
    srv_http_set_header_hook(s.h, srv_cors_headers, s.cors);
    char err[128];
    cr_assert_eq(srv_http_listen(s.h, "127.0.0.1", 0, err, sizeof err), 0, "%s", err);
    s.port = srv_http_port(s.h);
    cr_assert_eq(tc_loop_start(&s.L), 0);

    static const struct { const char *raw; int status; } R[] = {
        {"GET /plain HTTP/1.1\r\nHost: x\r\nOrigin: http://a.test\r\n\r\n", 200},
        {"GET /stream HTTP/1.1\r\nHost: x\r\nOrigin: http://a.test\r\n\r\n", 200},
        {"GET /empty HTTP/1.1\r\nHost: x\r\nOrigin: http://a.test\r\n\r\n", 204},
        {"POST /plain HTTP/1.1\r\nHost: x\r\nOrigin: http://a.test\r\nContent-Length: 100\r\n\r\n", 413},
    };
    for (size_t i = 0; i < sizeof R / sizeof R[0]; i++) {
        tc_resp r;
        memset(&r, 0, sizeof r);
        cr_assert_eq(tc_roundtrip(s.port, R[i].raw, &r), R[i].status, "request %zu", i);
        cr_assert(tc_has_header(&r, "access-control-allow-origin", "http://a.test"), "request %zu: %s", i, r.headers);
        cr_assert(tc_has_header(&r, "vary", "Origin"), "request %zu", i);
        if (R[i].status == 204) {
            cr_assert_null(strstr(r.headers, "content-length"), "204 without Content-Length: %s", r.headers);
            cr_assert_null(strstr(r.headers, "content-type"));
            cr_assert(tc_has_header(&r, "x-extra", "1"));
            cr_assert_eq(r.body_len, 0);
        }
        tc_resp_free(&r);
    }
    tc_resp r;
    memset(&r, 0, sizeof r);
    cr_assert_eq(tc_roundtrip(s.port, "GET /plain HTTP/1.1\r\nHost: x\r\nOrigin: http://b.test\r\n\r\n", &r), 200);
    cr_assert_null(strstr(r.headers, "access-control-allow-origin"));
    tc_resp_free(&r);
    tc_loop_stop(&s.L);
    srv_http_free(s.h);
    srv_cors_free(s.cors);
}

/* ---- the page and /props --------------------------------------------------------------------------------------- */
/* 'sha256-<base64>' of what lies between open and close in s. */
static void hash_between(const char *s, const char *open, const char *close, char *out, size_t cap) {
    const char *a = strstr(s, open);
    cr_assert_not_null(a);
    a += strlen(open);
    const char *b = strstr(a, close);
    cr_assert_not_null(b);
    uint8_t d[32];
    kvs_sha256(a, (size_t)(b - a), d);
    char b64[48];
    cr_assert_eq(kvs_base64_encode(d, 32, b64, sizeof b64), 44);
    snprintf(out, cap, "'sha256-%s'", b64);
}

Test(web, page_is_web_index_html_with_its_hashes_in_the_csp) {
    size_t len = 0, elen = 0;
    char *src = kvt_read_file(KVSERVE_SOURCE_DIR "/web/index.html", &len);
    cr_assert_not_null(src);
    const unsigned char *emb = srv_web_page_bytes(&elen);
    cr_assert_eq(elen, len);
    cr_assert_eq(memcmp(emb, src, len), 0, "the binary embeds web/index.html as it is now");
    cr_assert_eq(emb[elen], 0, "NUL-terminated");
    srv_web *w = NULL;
    cr_assert_eq(srv_web_create(&w), SRV_WEB_OK);
    char script[80], style[80], want[200];
    hash_between(src, "<script>", "</script>", script, sizeof script);
    hash_between(src, "<style>", "</style>", style, sizeof style);
    snprintf(want, sizeof want, "script-src %s; style-src %s;", script, style);
    cr_assert(strstr(srv_web_csp(w), want), "%s", srv_web_csp(w));
    cr_assert(strstr(srv_web_csp(w), "default-src 'none'"));
    int status;
    const char *ct, *hdr, *body;
    size_t blen;
    srv_web_page(w, NULL, &status, &ct, &hdr, &body, &blen);
    cr_assert_eq(status, 200);
    cr_assert_str_eq(ct, "text/html; charset=utf-8");
    cr_assert_eq(blen, len);
    cr_assert(strstr(hdr, "Content-Security-Policy: default-src 'none'"));
    cr_assert(strstr(hdr, "Cache-Control: no-cache\r\n"));
    const char *et = strstr(hdr, "ETag: \"");
    cr_assert_not_null(et);
    char etag[32];
    snprintf(etag, sizeof etag, "%.18s", et + 6);
    /* revalidation: the ETag in any of its spellings, or "*", gives 304; anything else the page */
    char weak[40], list[80], partial[16];
    snprintf(weak, sizeof weak, "W/%s", etag);
    snprintf(list, sizeof list, "\"0123\", %s", etag);
    snprintf(partial, sizeof partial, "%.9s\"", etag);
    const struct { const char *inm; int status; } R[] = {
        {etag, 304}, {weak, 304}, {list, 304}, {"*", 304},
        {"\"0000000000000000\"", 200}, {partial, 200}, {etag + 1, 200}, {"", 200},
    };
    for (size_t i = 0; i < sizeof R / sizeof R[0]; i++) {
        fake_req f;
        mkreq(&f, NULL, NULL);
        f.h[f.req.n_headers++] = (srv_http_header){"if-none-match", (char *)R[i].inm};
        srv_web_page(w, &f.req, &status, &ct, &hdr, &body, &blen);
        cr_assert_eq(status, R[i].status, "'%s'", R[i].inm);
        cr_assert_eq(blen, status == 304 ? 0 : len);
        cr_assert(strstr(hdr, etag));
    }
    srv_web_free(w);
    free(src);
}

Test(web, props_after_the_model_is_set) {
    srv_web *w = NULL;
    cr_assert_eq(srv_web_create(&w), SRV_WEB_OK);
    cr_assert_null(srv_web_props_json(w), "nothing to tell before the model is loaded");
    srv_web_model m = {.model_id = "m", .model_path = "/x/m.gguf", .chat_template = NULL, .chat_family = "chatml",
                       .n_ctx = 4096, .parallel = 8, .batch_tokens = 256, .threads = 3, .device = "cpu", .simd = "avx2"};
    cr_assert_eq(srv_web_set_model(w, &m), SRV_WEB_OK);
    char *s = srv_web_props_json(w);
    cJSON *o = cJSON_Parse(s);
    cr_assert_not_null(o, "%s", s);
    cr_assert_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "default_generation_settings"), "n_ctx")->valueint, 4096);
    cr_assert_eq(cJSON_GetObjectItem(o, "total_slots")->valueint, 8);
    cr_assert_str_eq(cJSON_GetObjectItem(o, "model_alias")->valuestring, "m");
    cr_assert_str_eq(cJSON_GetObjectItem(o, "model_path")->valuestring, "/x/m.gguf");
    cr_assert_str_eq(cJSON_GetObjectItem(o, "chat_template")->valuestring, "", "no template: \"\"");
    cr_assert_str_eq(cJSON_GetObjectItem(o, "chat_template_family")->valuestring, "chatml");
    cr_assert_eq(cJSON_GetObjectItem(o, "batch_tokens")->valueint, 256);
    cJSON *b = cJSON_GetObjectItem(o, "build");
    cr_assert_str_eq(cJSON_GetObjectItem(b, "simd")->valuestring, "avx2");
    cr_assert_str_eq(cJSON_GetObjectItem(b, "device")->valuestring, "cpu");
    cr_assert_eq(cJSON_GetObjectItem(b, "threads")->valueint, 3);
    cr_assert(strstr(cJSON_GetObjectItem(o, "build_info")->valuestring, "cpu avx2"));
    cJSON_Delete(o);
    free(s);
    m.chat_template = "{{ x }}";
    m.model_id = "second";
    cr_assert_eq(srv_web_set_model(w, &m), SRV_WEB_OK, "setting again replaces");
    s = srv_web_props_json(w);
    cr_assert(strstr(s, "\"model_alias\":\"second\"") && strstr(s, "\"chat_template\":\"{{ x }}\""), "%s", s);
    free(s);
    cr_assert_eq(srv_web_set_model(w, NULL), SRV_WEB_ERR_INVALID);
    srv_web_free(w);
    srv_web_free(NULL);
}
