/*
 * fuzz_json.c: the strict JSON pass (server/api/json_check_internal.h) against cJSON.
 *
 * Input: the text. Checks: when srv_json_check accepts, cJSON parses the same text completely and its tree has
 * the same number of values and strings and the same total string length (so no escape ends or cuts a string,
 * as "\u12zz" and "\u0000" did); cJSON's own printing of that tree is accepted again with the same string facts.
 * When it refuses, the message is set and the offset lies within the text.
 */
#include "fuzz_util.h"

#include <cjson/cJSON.h>

#include "server/api/json_check_internal.h"

typedef struct tally { size_t n_strings, bytes, n_values; } tally;

static void walk(const cJSON *j, tally *t) {
    for (; j; j = j->next) {
        t->n_values++;
        if (j->string) { t->n_strings++; t->bytes += strlen(j->string); }
        if (cJSON_IsString(j)) { t->n_strings++; t->bytes += strlen(j->valuestring); }
        if (cJSON_IsArray(j) || cJSON_IsObject(j)) walk(j->child, t);
    }
}

static void same_facts(const srv_json_check_result *r, const cJSON *root, const char *what) {
    tally t = {0, 0, 0};
    walk(root, &t);
    FZ_CHECK(t.n_values == r->n_values, "%s: %zu values, cJSON has %zu", what, r->n_values, t.n_values);
    FZ_CHECK(t.n_strings == r->n_strings, "%s: %zu strings, cJSON has %zu", what, r->n_strings, t.n_strings);
    FZ_CHECK(t.bytes == r->string_bytes, "%s: %zu string bytes, cJSON has %zu (text cut or changed)", what,
             r->string_bytes, t.bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    srv_json_check_result res;
    int rc = srv_json_check(text, size, SRV_JSON_CHECK_MAX_DEPTH, &res);
    if (rc != 0) {
        FZ_CHECK(rc == KVS_ERR_FORMAT || rc == KVS_ERR_LIMIT, "code %d", rc);
        FZ_CHECK(res.message[0] && res.offset <= size, "message '%s' offset %zu of %zu", res.message, res.offset, size);
        return 0;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, size, &end, false);
    FZ_CHECK(root, "accepted, but cJSON fails near byte %td", end ? end - text : (ptrdiff_t)-1);
    while (end < text + size && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    FZ_CHECK(end == text + size, "cJSON stopped at byte %td of %zu", end - text, size);
    same_facts(&res, root, "input");
    char *printed = cJSON_PrintUnformatted(root);
    FZ_CHECK(printed, "print failed");
    srv_json_check_result again;
    FZ_CHECK(srv_json_check(printed, strlen(printed), SRV_JSON_CHECK_MAX_DEPTH, &again) == 0,
             "cJSON's printing refused: %s", again.message);
    FZ_CHECK(again.n_strings == res.n_strings && again.string_bytes == res.string_bytes,
             "strings changed by printing");
    free(printed);
    cJSON_Delete(root);
    return 0;
}
