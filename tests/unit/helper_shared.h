/* helper_shared.h: finding and reading ../shared test material (helper_shared.c, linked into every suite). */
#ifndef KVSERVE_TEST_HELPER_SHARED_H
#define KVSERVE_TEST_HELPER_SHARED_H

#include <stddef.h>
#include <cjson/cJSON.h>

/* The shared material directory: $KVSERVE_SHARED (set by ctest) when set and not empty, else the
 * KVSERVE_SHARED_DIR compile definition (../shared beside the source tree). It may not exist. */
const char *kvt_shared_dir(void);

/* The whole file, NUL-terminated (malloc'd; the caller frees it), its length in *len when len is not NULL;
 * NULL when the file cannot be opened or read. Fails the test when memory runs out. */
char *kvt_read_file(const char *path, size_t *len);

/* The file parsed as JSON (the caller frees it with cJSON_Delete); fails the test when it cannot be read or
 * parsed. */
cJSON *kvt_read_json(const char *path);

/* Runs the kvserve binary (KVSERVE_BINARY) with args (NULL-terminated, without the program name), its stdout
 * and stderr going to dir/log, and returns its exit status. Fails the test when it cannot run, does not exit
 * normally, or its output holds a sanitizer report (the ASan build's binary is sanitized too). With log not
 * NULL, *log receives the output (malloc'd, NUL-terminated; the caller frees it). */
int kvt_run_kvserve(const char *dir, const char *const *args, char **log);

#endif
