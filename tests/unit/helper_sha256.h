/* helper_sha256.h: SHA-256 (FIPS 180-4) for the suites that compare bytes with recorded hashes (helper_sha256.c,
 * linked into every suite). */
#ifndef KVSERVE_TEST_HELPER_SHA256_H
#define KVSERVE_TEST_HELPER_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvt_sha256 {
    uint32_t h[8];
    uint8_t buf[64];
    size_t n;
    uint64_t len;
} kvt_sha256;

void kvt_sha256_init(kvt_sha256 *c);
void kvt_sha256_update(kvt_sha256 *c, const void *data, size_t n);
/* Finishes the hash and writes it as 64 lowercase hex digits and a NUL; c must be initialized again to reuse. */
void kvt_sha256_hex(kvt_sha256 *c, char out[65]);
/* The hex SHA-256 of n bytes. */
void kvt_sha256_of(const void *data, size_t n, char out[65]);

#endif
