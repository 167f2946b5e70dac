/* test_common.c: kvs_strerror covers every code; kvs_buf grows, caps and fails stickily; SHA-256 and base64
 * against their standards' vectors. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
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

static void hex32(const uint8_t d[32], char out[65]) {
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

Test(common, sha256_known_answers) {
    /* FIPS 180-4 examples and the usual long vectors */
    static const struct { const char *msg; const char *hex; } V[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrst"
         "nopqrstu", "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    uint8_t d[32];
    char hex[65];
    for (size_t i = 0; i < sizeof V / sizeof V[0]; i++) {
        kvs_sha256(V[i].msg, strlen(V[i].msg), d);
        hex32(d, hex);
        cr_assert_str_eq(hex, V[i].hex, "message %zu", i);
    }
    kvs_sha256_ctx c;
    kvs_sha256_init(&c);
    char a[1000];
    memset(a, 'a', sizeof a);
    for (int i = 0; i < 1000; i++) kvs_sha256_update(&c, a, sizeof a);
    kvs_sha256_final(&c, d);
    hex32(d, hex);
    cr_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

Test(common, sha256_split_updates_agree) {
    uint8_t data[777], one[32], split[32];
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    for (size_t i = 0; i < sizeof data; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; data[i] = (uint8_t)x; }
    for (size_t n = 0; n <= sizeof data; n += 37) {
        kvs_sha256(data, n, one);
        kvs_sha256_ctx c;
        kvs_sha256_init(&c);
        for (size_t off = 0; off < n;) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            size_t take = 1 + (size_t)(x % 130);
            if (take > n - off) take = n - off;
            kvs_sha256_update(&c, data + off, take);
            off += take;
        }
        kvs_sha256_final(&c, split);
        cr_assert_eq(memcmp(one, split, 32), 0, "length %zu", n);
    }
}

static int b64_value(char ch) {
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    return ch == '+' ? 62 : ch == '/' ? 63 : -1;
}

Test(common, base64_rfc4648_vectors_and_roundtrip) {
    static const char *const V[][2] = {{"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"},
                                       {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"}};
    char out[64];
    for (size_t i = 0; i < sizeof V / sizeof V[0]; i++) {
        cr_assert_eq(kvs_base64_encode(V[i][0], strlen(V[i][0]), out, sizeof out), (int)strlen(V[i][1]));
        cr_assert_str_eq(out, V[i][1]);
    }
    cr_assert_eq(kvs_base64_encode("foo", 3, out, 4), KVS_ERR_TOO_LARGE, "no room for the NUL");
    cr_assert_str_eq(out, "");
    cr_assert_eq(kvs_base64_encode("foo", 3, out, 5), 4);
    /* random bytes decode back (a plain decoder written here) */
    uint8_t src[100], back[100];
    char enc[200];
    uint64_t x = 12345;
    for (size_t n = 0; n <= sizeof src; n++) {
        for (size_t i = 0; i < n; i++) { x = x * 6364136223846793005ULL + 1442695040888963407ULL; src[i] = (uint8_t)(x >> 56); }
        int len = kvs_base64_encode(src, n, enc, sizeof enc);
        cr_assert_eq(len, (int)((n + 2) / 3 * 4));
        size_t m = 0;
        for (int i = 0; i < len; i += 4) {
            uint32_t v = 0;
            int pad = 0;
            for (int k = 0; k < 4; k++) {
                int d = enc[i + k] == '=' ? (pad++, 0) : b64_value(enc[i + k]);
                cr_assert_geq(d, 0, "bad character '%c'", enc[i + k]);
                v = v << 6 | (uint32_t)d;
            }
            for (int k = 0; k < 3 - pad; k++) back[m++] = (uint8_t)(v >> (16 - 8 * k));
        }
        cr_assert_eq(m, n);
        cr_assert_eq(memcmp(src, back, n), 0, "length %zu", n);
    }
}
