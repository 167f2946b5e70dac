/* helper_shared.c: see helper_shared.h. */
#include "helper_shared.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

const char *kvt_shared_dir(void) {
    const char *d = getenv("KVSERVE_SHARED");
    return d && *d ? d : KVSERVE_SHARED_DIR;
}

char *kvt_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    char *buf = malloc((size_t)n + 1);
    cr_assert_not_null(buf, "%s: out of memory for %ld bytes", path, n);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len) *len = (size_t)n;
    return buf;
}

cJSON *kvt_read_json(const char *path) {
    char *buf = kvt_read_file(path, NULL);
    cr_assert_not_null(buf, "%s: cannot read", path);
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    cr_assert_not_null(j, "%s: invalid JSON", path);
    return j;
}
