/* test_api_spec.c: the request fields of speculative decoding, llama.cpp's flat keys "speculative.n_max" and
 * "speculative.n_min": absent is -1 (the server's settings), 0..32 taken, anything else a 400 naming the key. */
#include <criterion/criterion.h>
#include <string.h>

#include "server/api/api.h"

static int parse(const char *body, srv_api_gen *g, srv_api_error *e) {
    return srv_api_parse_gen(SRV_API_COMPLETION, body, strlen(body), NULL, g, e);
}

Test(api_spec, fields) {
    srv_api_gen g;
    srv_api_error e;
    cr_assert_eq(parse("{\"prompt\":\"x\"}", &g, &e), 0, "%s", e.message);
    cr_assert_eq(g.spec_n_max, -1);
    cr_assert_eq(g.spec_n_min, -1);
    srv_api_gen_free(&g);
    cr_assert_eq(parse("{\"prompt\":\"x\",\"speculative.n_max\":5,\"speculative.n_min\":2}", &g, &e), 0, "%s",
                 e.message);
    cr_assert_eq(g.spec_n_max, 5);
    cr_assert_eq(g.spec_n_min, 2);
    srv_api_gen_free(&g);
    cr_assert_eq(parse("{\"prompt\":\"x\",\"speculative.n_max\":0,\"speculative.n_min\":null}", &g, &e), 0, "%s",
                 e.message);
    cr_assert_eq(g.spec_n_max, 0);
    cr_assert_eq(g.spec_n_min, -1);
    srv_api_gen_free(&g);
    static const char *const bad[] = {
        "{\"prompt\":\"x\",\"speculative.n_max\":33}",   "{\"prompt\":\"x\",\"speculative.n_max\":-1}",
        "{\"prompt\":\"x\",\"speculative.n_max\":1.5}",  "{\"prompt\":\"x\",\"speculative.n_max\":\"4\"}",
        "{\"prompt\":\"x\",\"speculative.n_min\":-2}",   "{\"prompt\":\"x\",\"speculative.n_min\":true}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = parse(bad[i], &g, &e);
        cr_assert_neq(rc, 0, "%s was accepted", bad[i]);
        cr_assert_eq(e.status, 400, "%s", bad[i]);
        cr_assert(strstr(e.message, "speculative.n_m"), "%s: %s", bad[i], e.message);
    }
}
