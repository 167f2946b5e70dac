/*
 * driver.c: a standalone main for the fuzz harnesses, so that every harness runs as a regression test over its
 * seed corpus with any compiler (gcc, clang) and any sanitizer, without libFuzzer.
 *
 * usage: fuzz_NAME_run PATH...   each PATH is a file or a directory (its regular files, sorted by name, are run;
 * not recursive). Every file is read whole and handed to LLVMFuzzerTestOneInput once. LLVMFuzzerInitialize runs
 * first when the harness defines it. Prints one line per directory and exits 0 when every input ran (a harness
 * signals a failure by aborting, as under libFuzzer), 1 when a path cannot be read or holds no input.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "fuzz driver: cannot open %s\n", path); return -1; }
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return -1; }
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); return -1; }
    /* an exact-size allocation, as libFuzzer makes: ASan then sees any read past the input */
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf) { fclose(f); return -1; }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) { free(buf); fprintf(stderr, "fuzz driver: short read of %s\n", path); return -1; }
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_dir(const char *dir, long *count) {
    DIR *d = opendir(dir);
    if (!d) { fprintf(stderr, "fuzz driver: cannot open directory %s\n", dir); return -1; }
    char **names = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **p = realloc(names, cap * sizeof *p);
            if (!p) break;
            names = p;
        }
        size_t l = strlen(dir) + strlen(e->d_name) + 2;
        if (!(names[n] = malloc(l))) break;
        snprintf(names[n], l, "%s/%s", dir, e->d_name);
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
            if (run_file(names[i]) != 0) rc = -1;
            else (*count)++;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    if (argc < 2) { fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]); return 1; }
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        long count = 0;
        if (stat(argv[i], &st) != 0) { fprintf(stderr, "fuzz driver: %s does not exist\n", argv[i]); rc = 1; continue; }
        if (S_ISDIR(st.st_mode)) {
            if (run_dir(argv[i], &count) != 0) rc = 1;
            if (count == 0) { fprintf(stderr, "fuzz driver: no input in %s\n", argv[i]); rc = 1; }
            printf("%s: %ld inputs ran\n", argv[i], count);
        } else if (run_file(argv[i]) != 0) {
            rc = 1;
        }
    }
    return rc;
}
