/*
 * json_check_internal.h: a strict JSON validator run on request bodies before cJSON parses them (api/json_check.c,
 * prefix srv_json_check; private to server/api/).
 *
 * cJSON is lenient where a server must not be: an invalid escape such as "\u12zz" is read as U+0000 and ends
 * the string there, "\u0000" silently cuts the text, unpaired surrogates and raw control characters pass.
 * srv_json_check walks the text once (RFC 8259 grammar, no allocation, no recursion) and rejects:
 *   - anything outside the grammar (trailing data, bad literals, numbers such as 01, .5, 1., +1, NaN);
 *   - an escape other than \" \\ \/ \b \f \n \r \t \uXXXX (four hex digits);
 *   - a \u high surrogate (D800-DBFF) not followed by a \u low surrogate (DC00-DFFF), a lone low surrogate;
 *   - \u0000: NUL is never allowed inside request strings (the C strings behind them would be cut);
 *   - raw bytes below 0x20 inside strings, and any byte sequence that is not well-formed UTF-8 (overlong
 *     forms, encoded surrogates, code points above U+10FFFF, truncated sequences) anywhere in the text;
 *   - nesting of arrays/objects deeper than max_depth.
 * Whatever it accepts, cJSON parses to the same values (the fuzz harness fuzz_json checks this).
 *
 * Thread-safe and reentrant: it touches only its arguments.
 */
#ifndef KVSERVE_SERVER_JSON_CHECK_INTERNAL_H
#define KVSERVE_SERVER_JSON_CHECK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#define SRV_JSON_CHECK_MAX_DEPTH 256 /* the depth request bodies may nest to (cJSON's own limit is 1000) */

typedef struct srv_json_check_result {
    size_t offset;          /* on failure: byte offset of the problem in the text */
    char message[160];      /* on failure: what is wrong, naming the byte offset; "" on success */
    /* On success, facts of the text (tests and the fuzzer compare them with cJSON's tree): */
    size_t n_strings;       /* strings, object keys included */
    size_t string_bytes;    /* UTF-8 bytes of all strings after unescaping, keys included */
    size_t n_values;        /* values (objects, arrays, strings that are not keys, numbers, literals) */
} srv_json_check_result;

/* Validates text[0..len) (text need not be NUL-terminated; no byte past len is read). max_depth >= 1 (values
 * below 1 mean 1). Returns 0 (KVS_OK) when it is one JSON value with optional surrounding whitespace, else
 * KVS_ERR_FORMAT with res->message and res->offset set (KVS_ERR_LIMIT when only the depth is exceeded,
 * KVS_ERR_INVALID when text is NULL with len > 0 or res is NULL). */
int srv_json_check(const char *text, size_t len, int32_t max_depth, srv_json_check_result *res);

/* Duplicate object keys (issue 30): cJSON keeps every member and its lookups find the first, where Python and
 * JavaScript keep the last, so a gateway that validated the body would see another request. Walks the tree
 * (objects nested up to SRV_JSON_CHECK_MAX_DEPTH, which srv_json_check enforces; deeper ones are not looked into) and
 * returns 0 when no object holds the same key twice, else KVS_ERR_FORMAT with res->message naming the key
 * (cut to 64 bytes) and its object's path ("messages[1]"); KVS_ERR_NOMEM when the sort of a large object's keys
 * cannot allocate; KVS_ERR_INVALID when res is NULL. O(n log n) in the keys of each object. */
int srv_json_check_dup_keys(const cJSON *root, srv_json_check_result *res);

#endif /* KVSERVE_SERVER_JSON_CHECK_INTERNAL_H */
