/*
 * fuzz_tool_calls.c: tool calls parsed out of generated text (server/api/tool_call_internal.h).
 *
 * Input: the generated text (any bytes). Checks: srv_tool_call_parse succeeds; content_len is the whole text when there
 * are no calls and at most the text otherwise; every call has a non-empty name and arguments that parse as a
 * JSON object. Streaming: fed byte by byte, srv_tool_call_stream_safe's incremental scan agrees with a scan from the
 * start, never takes back what it sent, never sends past the final content, and never sends text it held.
 */
#include "fuzz_util.h"

#include <cjson/cJSON.h>

#include "server/api/tool_call_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    srv_tool_call_result r;
    int rc = srv_tool_call_parse(size ? text : NULL, size, &r);
    FZ_CHECK(rc == 0 || rc == KVS_ERR_NOMEM, "parse: code %d", rc);
    if (rc != 0) return 0;
    FZ_CHECK(r.n_calls > 0 ? r.content_len <= size : r.content_len == size, "content_len %zu of %zu (%d calls)",
             r.content_len, size, r.n_calls);
    for (int i = 0; i < r.n_calls; i++) {
        FZ_CHECK(r.calls[i].name && r.calls[i].name[0], "call %d without a name", i);
        cJSON *a = cJSON_Parse(r.calls[i].arguments);
        FZ_CHECK(cJSON_IsObject(a), "call %d: arguments '%s' are not a JSON object", i, r.calls[i].arguments);
        cJSON_Delete(a);
    }
    size_t end = r.n_calls > 0 ? r.content_len : size;
    srv_tool_call_result_free(&r);
    if (size > 4096) return 0; /* the byte-by-byte stream is quadratic in the full rescans it checks against */
    size_t sent = 0;
    bool held = false;
    for (size_t k = 0; k <= size; k++) {
        size_t full = srv_tool_call_stream_safe(text, k, 0, NULL);
        if (held) { FZ_CHECK(full == sent, "held text released at %zu: %zu after %zu", k, full, sent); continue; }
        size_t safe = srv_tool_call_stream_safe(text, k, sent, &held);
        FZ_CHECK(safe == full, "prefix %zu: incremental %zu, full %zu", k, safe, full);
        FZ_CHECK(safe >= sent, "prefix %zu: %zu after %zu was sent", k, safe, sent);
        FZ_CHECK(safe <= end, "prefix %zu: %zu sent, but the content is %zu", k, safe, end);
        sent = safe;
    }
    return 0;
}
