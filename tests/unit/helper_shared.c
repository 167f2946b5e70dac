/* helper_shared.c: see helper_shared.h. */
#include "helper_shared.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

int kvt_run_kvserve(const char *dir, const char *const *args, char **log) {
    char path[1024];
    snprintf(path, sizeof path, "%s/log", dir);
    const char *argv[72];
    int n = 0;
    argv[n++] = KVSERVE_BINARY;
    for (int i = 0; args[i]; i++) {
        cr_assert_lt(n, 71, "kvt_run_kvserve: too many arguments");
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(127);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    char *text = kvt_read_file(path, NULL);
    cr_assert_not_null(text, "cannot read %s", path);
    cr_assert(!strstr(text, "Sanitizer") && !strstr(text, "runtime error"), "kvserve %s: %s", args[0], text);
    unlink(path);
    if (log) *log = text;
    else free(text);
    cr_assert(WIFEXITED(st), "kvserve did not exit normally");
    return WEXITSTATUS(st);
}
