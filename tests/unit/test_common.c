/* test_common.c: kvs_strerror covers every code; kvs_buf grows, caps and fails stickily. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

Test(common, strerror_every_code_distinct) {
    const char *seen[64] = {0};
    for (int e = 0; e >= KVS_ERR_HELP; e--) {
        const char *s = kvs_strerror(e);
        cr_assert(s && strcmp(s, "unknown error"), "code %d has no text", e);
        for (int j = 0; j < -e; j++) cr_assert(strcmp(seen[j], s), "codes %d and %d share '%s'", -j, e, s);
        seen[-e] = s;
    }
    cr_assert_str_eq(kvs_strerror(KVS_ERR_HELP - 1), "unknown error");
    cr_assert_str_eq(kvs_strerror(5), "unknown error");
}

Test(common, buf_grows_and_takes) {
    kvs_buf b = {0};
    for (int i = 0; i < 1000; i++) cr_assert_eq(kvs_buf_printf(&b, "%d,", i), 0);
    cr_assert_eq(kvs_buf_putc(&b, 'x'), 0);
    cr_assert_eq(kvs_buf_append(&b, "ab\0c", 4), 0);
    size_t len = b.len;
    cr_assert_eq(memcmp(b.data, "0,1,2,", 6), 0);
    cr_assert_eq(memcmp(b.data + len - 5, "xab\0c", 5), 0);
    cr_assert_eq(b.data[len], 0);
    char *s = kvs_buf_take(&b);
    cr_assert(s && !b.data && b.len == 0);
    free(s);
    s = kvs_buf_take(&b); /* empty buffer gives "" */
    cr_assert(s && s[0] == 0);
    free(s);
}

Test(common, buf_max_is_sticky) {
    kvs_buf b = {.max = 8};
    cr_assert_eq(kvs_buf_puts(&b, "12345678"), 0);
    cr_assert_eq(kvs_buf_putc(&b, '9'), KVS_ERR_TOO_LARGE);
    cr_assert(b.oom);
    cr_assert_eq(kvs_buf_putc(&b, 'a'), KVS_ERR_NOMEM);
    cr_assert_eq(b.len, 8);
    cr_assert_null(kvs_buf_take(&b));
    cr_assert_eq(b.max, 8);
    kvs_buf_clear(&b);
    cr_assert_eq(kvs_buf_puts(&b, "ok"), 0);
    cr_assert_str_eq(b.data, "ok");
    kvs_buf_free(&b);
}
