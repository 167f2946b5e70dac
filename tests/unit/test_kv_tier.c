/* test_kv_tier.c: the disk tier below the KV pool (cache/kv_tier.h): its files and index against a reference
 * (every block's rows are a pure function of (token, position): helper_kvc.h), over random prompts with shared
 * heads, and its faults: files truncated or flipped byte by byte, a tier of another model or layout, kill -9
 * during writes, a full disk (the kv_disk_gb bound and an injected write failure). Whatever is loaded must be
 * exactly what was saved; anything else is not loaded, and nothing crashes. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache/kv_tier.h"
#include "cache/kvt_internal.h"
#include "helper_kvc.h"
#include "helper_tmpdir.h"

/* ---- injected write failure (the linker sends the tier's write() here: see CMakeLists.txt) ------------------- */
ssize_t __real_write(int fd, const void *buf, size_t n);
static volatile int fail_writes; /* > 0: that many more writes of the tier fail with ENOSPC */
ssize_t __wrap_write(int fd, const void *buf, size_t n) {
    if (fail_writes > 0) {
        fail_writes--;
        errno = ENOSPC;
        return -1;
    }
    return __real_write(fd, buf, n);
}

static void quiet(void *ctx, const char *msg) {
    (void)msg;
    if (ctx) (*(int *)ctx)++;
}

enum { BS = 4, NB = 96 };

static char dir[256];

static void mk_dir(void) {
    snprintf(dir, sizeof dir, "/tmp/kvs-tier-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void rm_dir(void) { tmpt_rm_flat(dir); }

static int count_files(const char *suffix) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name), s = strlen(suffix);
        if (l > s && !strcmp(e->d_name + l - s, suffix)) n++;
    }
    closedir(d);
    return n;
}

static kvt_params tparams(uint64_t max_bytes, uint8_t id, int *warnings) {
    kvt_params p = {.dir = dir, .max_bytes = max_bytes, .warn = quiet, .warn_ctx = warnings};
    memset(p.identity, id, sizeof p.identity);
    return p;
}

/* A cache with a tier attached; its events go to the tier. */
static kvc_cache *open_pair(uint64_t max_bytes, uint8_t id, int32_t bs, kvt_tier **t, int *warnings) {
    kvc_cache *c = kvct_make(NB, bs, 4, 256);
    cr_assert_not_null(c);
    kvt_params p = tparams(max_bytes, id, warnings);
    cr_assert_eq(kvt_open(&p, c, t), KVS_OK);
    kvc_set_event_cb(c, kvt_on_cache_event, *t);
    return c;
}

static void close_pair(kvc_cache *c, kvt_tier *t) {
    kvc_set_event_cb(c, NULL, NULL);
    kvt_close(t);
    kvc_free(c);
}

/* Prefills tokens[0..n) in a fresh sequence (in chunks), ends the step, frees the sequence. */
static void prefill(kvc_cache *c, kvt_tier *t, const int32_t *tokens, int32_t n, uint64_t *rng) {
    int32_t seq;
    cr_assert_eq(kvc_seq_alloc(c, &seq), KVC_OK);
    for (int32_t at = 0; at < n;) {
        int32_t k = 1 + kvct_range(rng, 40);
        if (k > n - at) k = n - at;
        cr_assert_eq(kvct_append(c, seq, tokens, k), KVC_OK);
        kvt_step_end(t);
        at += k;
    }
    cr_assert_eq(kvc_seq_free(c, seq), KVC_OK);
}

/* Loads tokens[0..n) into a fresh sequence from the pool then the tier; checks every loaded row against the
 * reference and the cache's invariants; returns the tokens held. */
static int32_t load_check(kvc_cache *c, kvt_tier *t, const int32_t *tokens, int32_t n) {
    int32_t seq, have = 0, got = 0;
    cr_assert_eq(kvc_seq_alloc(c, &seq), KVC_OK);
    cr_assert_eq(kvc_attach_prefix(c, seq, tokens, n, &have), KVC_OK);
    int rc = kvt_load(t, seq, tokens, n, have, NB, &got);
    cr_assert(rc == KVS_OK, "kvt_load: %d", rc);
    cr_assert_eq(got % BS, 0);
    cr_assert_eq(kvc_seq_len(c, seq), have + got);
    kvc_layout lay;
    kvc_get_layout(c, &lay);
    const int32_t *blocks;
    int32_t nbk, len;
    cr_assert_eq(kvc_block_table(c, seq, &blocks, &nbk, &len), KVC_OK);
    for (int32_t pos = 0; pos < len; pos++) {
        int bad = kvct_check_slot(&lay, blocks[pos / BS] * BS + pos % BS, tokens[pos], pos);
        cr_assert_eq(bad, 0, "position %d (of %d, %d loaded) holds a wrong row %d", pos, len, got, bad - 1);
    }
    char msg[256];
    cr_assert_eq(kvc_check(c, msg, sizeof msg), KVC_OK, "%s", msg);
    cr_assert_eq(kvc_seq_free(c, seq), KVC_OK);
    return have + got;
}

/* Random prompts with shared heads (a few stems, random tails). */
static int32_t make_prompts(uint64_t *rng, int32_t np, int32_t (*pr)[200], int32_t *len) {
    int32_t stems[3][200];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 200; i++) stems[s][i] = kvct_range(rng, 50);
    for (int32_t i = 0; i < np; i++) {
        int32_t head = kvct_range(rng, 120), s = kvct_range(rng, 3);
        len[i] = 1 + kvct_range(rng, 199);
        for (int32_t j = 0; j < len[i]; j++) pr[i][j] = j < head ? stems[s][j] : kvct_range(rng, 50);
    }
    return np;
}

Test(kv_tier, random_prompts_survive_a_restart) {
    for (uint64_t seed = 1; seed <= 6; seed++) {
        mk_dir();
        uint64_t rng = seed;
        int32_t pr[12][200], len[12];
        int32_t np = make_prompts(&rng, 12, pr, len);
        kvt_tier *t;
        int warn = 0;
        kvc_cache *c = open_pair(1 << 30, 7, BS, &t, &warn);
        for (int32_t i = 0; i < np; i++) prefill(c, t, pr[i], len[i], &rng);
        kvt_flush(t);
        kvt_stats st;
        kvt_get_stats(t, &st);
        cr_assert_gt(st.blocks_written, 0);
        cr_assert_eq(st.blocks_dropped, 0);
        close_pair(c, t);
        /* a new process: the pool is empty, everything comes from the files */
        c = open_pair(1 << 30, 7, BS, &t, &warn);
        kvt_get_stats(t, &st);
        cr_assert_eq(st.files, (uint64_t)count_files(".kvt"));
        for (int32_t i = 0; i < np; i++) {
            int32_t held = load_check(c, t, pr[i], len[i]);
            /* every full block was saved (the pool of NB blocks evicted some, the disk kept them) */
            cr_assert_eq(held, len[i] / BS * BS, "seed %llu prompt %d: %d of %d", (unsigned long long)seed, i, held,
                         len[i]);
        }
        kvt_get_stats(t, &st);
        cr_assert_eq(st.files_rejected, 0);
        cr_assert_eq(warn, 0);
        close_pair(c, t);
        rm_dir();
    }
}

Test(kv_tier, the_bound_deletes_least_recently_used_files) {
    mk_dir();
    uint64_t rng = 42;
    int32_t pr[16][200], len[16];
    make_prompts(&rng, 16, pr, len);
    kvt_tier *t;
    int warn = 0;
    kvc_cache *c = open_pair(1 << 30, 7, BS, &t, &warn);
    uint64_t one = kvt_file_bytes(t, 1), cap = 12 * one; /* a few blocks' worth */
    close_pair(c, t);
    c = open_pair(cap, 7, BS, &t, &warn);
    for (int32_t i = 0; i < 16; i++) {
        prefill(c, t, pr[i], len[i], &rng);
        kvt_flush(t);
        kvt_stats st;
        kvt_get_stats(t, &st);
        cr_assert_leq(st.bytes, cap);
    }
    kvt_stats st;
    kvt_get_stats(t, &st);
    cr_assert_gt(st.files_evicted, 0);
    close_pair(c, t);
    c = open_pair(cap, 7, BS, &t, &warn);
    for (int32_t i = 0; i < 16; i++) load_check(c, t, pr[i], len[i]); /* what is left is right */
    close_pair(c, t);
    rm_dir();
}

/* Writes one prompt's files with identity 7, returns its tokens. */
static int32_t write_one(int32_t *tok, int32_t n) {
    uint64_t rng = 99;
    for (int32_t i = 0; i < n; i++) tok[i] = kvct_range(&rng, 50);
    kvt_tier *t;
    kvc_cache *c = open_pair(1 << 30, 7, BS, &t, NULL);
    prefill(c, t, tok, n, &rng);
    close_pair(c, t);
    return n;
}

static char *only_file(char *path, size_t cap) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    path[0] = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, ".kvt")) snprintf(path, cap, "%s/%s", dir, e->d_name);
    closedir(d);
    return path[0] ? path : NULL;
}

Test(kv_tier, every_flipped_byte_is_caught) {
    mk_dir();
    int32_t tok[9];
    write_one(tok, 9); /* two full blocks in one file */
    char path[512];
    cr_assert_not_null(only_file(path, sizeof path));
    size_t size;
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    uint8_t orig[8192];
    size = fread(orig, 1, sizeof orig, f);
    fclose(f);
    cr_assert_gt(size, sizeof(kvt_file_header));
    for (size_t i = 0; i < size; i++) {
        uint8_t bad[8192];
        memcpy(bad, orig, size);
        bad[i] ^= (uint8_t)(1u << (i % 8));
        rm_dir(); /* only the flipped file (a good block loaded last round is saved again in a new file) */
        cr_assert_eq(mkdir(dir, 0700), 0);
        FILE *w = fopen(path, "wb");
        cr_assert_not_null(w);
        cr_assert_eq(fwrite(bad, 1, size, w), size);
        fclose(w);
        kvt_tier *t;
        int warn = 0;
        kvc_cache *c = open_pair(1 << 30, 7, BS, &t, &warn);
        int32_t held = load_check(c, t, tok, 9); /* checks every loaded row */
        /* a flip in the header or table rejects the file; in block 1's data, block 0 still loads */
        cr_assert_lt(held, 8, "byte %zu flipped: the corrupt block was loaded", i);
        cr_assert_neq(access(path, F_OK), 0, "byte %zu flipped: the file was kept", i);
        cr_assert_geq(warn, 1);
        close_pair(c, t);
    }
    rm_dir();
}

Test(kv_tier, every_truncation_is_caught) {
    mk_dir();
    int32_t tok[9];
    write_one(tok, 9);
    char path[512];
    cr_assert_not_null(only_file(path, sizeof path));
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    FILE *f = fopen(path, "rb");
    uint8_t orig[8192];
    size_t size = fread(orig, 1, sizeof orig, f);
    fclose(f);
    for (size_t keep = 0; keep < size; keep += 7) {
        FILE *w = fopen(path, "wb");
        cr_assert_eq(fwrite(orig, 1, keep, w), keep);
        fclose(w);
        kvt_tier *t;
        kvc_cache *c = open_pair(1 << 30, 7, BS, &t, NULL);
        cr_assert_eq(load_check(c, t, tok, 9), 0, "truncated to %zu bytes", keep);
        cr_assert_eq(count_files(".kvt"), 0);
        close_pair(c, t);
    }
    rm_dir();
}

Test(kv_tier, a_tier_of_another_model_or_layout_is_never_used) {
    mk_dir();
    int32_t tok[9];
    write_one(tok, 9);
    kvt_tier *t;
    int warn = 0;
    kvc_cache *c = open_pair(1 << 30, 8, BS, &t, &warn); /* another identity */
    cr_assert_eq(load_check(c, t, tok, 9), 0);
    cr_assert_eq(count_files(".kvt"), 0);
    cr_assert_eq(warn, 1);
    close_pair(c, t);
    write_one(tok, 9);
    kvc_cache *c2 = kvct_make(NB, 8, 4, 256); /* another block size */
    kvt_params p = tparams(1 << 30, 7, &warn);
    cr_assert_eq(kvt_open(&p, c2, &t), KVS_OK);
    cr_assert_eq(count_files(".kvt"), 0);
    kvt_close(t);
    kvc_free(c2);
    rm_dir();
}

Test(kv_tier, a_failed_write_saves_nothing_and_leaves_no_file) {
    mk_dir();
    uint64_t rng = 5;
    int32_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = kvct_range(&rng, 50);
    kvt_tier *t;
    int warn = 0;
    kvc_cache *c = open_pair(1 << 30, 7, BS, &t, &warn);
    fail_writes = 1000000;
    prefill(c, t, tok, 64, &rng);
    kvt_flush(t);
    fail_writes = 0;
    kvt_stats st;
    kvt_get_stats(t, &st);
    cr_assert_gt(st.write_errors, 0);
    cr_assert_eq(st.blocks_written, 0);
    cr_assert_eq(st.blocks_dropped, 16);
    cr_assert_eq(count_files(".kvt") + count_files(".part"), 0);
    cr_assert_gt(warn, 0);
    close_pair(c, t);
    c = open_pair(1 << 30, 7, BS, &t, &warn);
    cr_assert_eq(load_check(c, t, tok, 64), 0);
    close_pair(c, t);
    rm_dir();
}

/* Prompt i of pass p of a writer (random tokens, 9 .. 200 of them). */
static int32_t gen_prompt(uint64_t seed, int32_t *out) {
    uint64_t rng = seed * 0x9e3779b97f4a7c15ULL + 1;
    int32_t n = 9 + kvct_range(&rng, 192);
    for (int32_t j = 0; j < n; j++) out[j] = kvct_range(&rng, 50);
    return n;
}

Test(kv_tier, kill_9_during_writes_never_leaves_a_file_that_loads_wrong) {
    for (int round = 0; round < 4; round++) {
        mk_dir();
        uint64_t base = 7919u * (uint64_t)(round + 1);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) { /* the writer: prefills new prompts until it is killed */
            kvt_tier *t;
            kvc_cache *c = kvct_make(NB, BS, 4, 256);
            kvt_params p = tparams(1 << 30, 7, NULL);
            if (!c || kvt_open(&p, c, &t) != KVS_OK) _exit(1);
            kvc_set_event_cb(c, kvt_on_cache_event, t);
            int32_t tok[200], seq;
            for (uint64_t i = 0;; i++) {
                int32_t n = gen_prompt(base + i, tok);
                if (kvc_seq_alloc(c, &seq) != KVC_OK || kvct_append(c, seq, tok, n) != KVC_OK) _exit(2);
                kvt_step_end(t);
                kvc_seq_free(c, seq);
            }
        }
        /* kill it while it writes: once its first files are there, after a random moment */
        for (int i = 0; i < 2000 && count_files(".kvt") < 2; i++) usleep(5000);
        usleep(1000 + 7000 * (useconds_t)round);
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        cr_assert(WIFSIGNALED(status), "the writer ended by itself: %d", status);
        kvt_tier *t;
        kvc_cache *c = open_pair(1 << 30, 7, BS, &t, NULL);
        cr_assert_eq(count_files(".part"), 0);
        int32_t tok[200], misses = 0, loaded = 0;
        for (uint64_t i = 0; misses < 8; i++) { /* every prompt it wrote, until 8 in a row are not there */
            int32_t n = gen_prompt(base + i, tok), held = load_check(c, t, tok, n);
            misses = held ? 0 : misses + 1;
            loaded += held;
        }
        cr_assert_gt(loaded, 0, "round %d: nothing was saved before the kill", round);
        close_pair(c, t);
        rm_dir();
    }
}

/* Collects tier events: STORED hashes and REMOVED hashes, in order. */
typedef struct evlog {
    uint64_t stored[4096], removed[4096];
    int32_t n_stored, n_removed;
    bool bad; /* a STORED without its tokens, or out of chain order */
} evlog;

static void on_ev(void *ctx, const kvc_event *ev) {
    evlog *l = ctx;
    if (ev->kind == KVC_EVENT_STORED) {
        if (!ev->tokens || ev->block_size != BS || ev->block != -1) l->bad = true;
        if (l->n_stored < 4096) l->stored[l->n_stored++] = ev->hash;
    } else if (ev->kind == KVC_EVENT_REMOVED && l->n_removed < 4096) {
        l->removed[l->n_removed++] = ev->hash;
    }
}

static bool has(const uint64_t *v, int32_t n, uint64_t h) {
    for (int32_t i = 0; i < n; i++)
        if (v[i] == h) return true;
    return false;
}

Test(kv_tier, events_mirror_what_the_disk_holds) {
    mk_dir();
    uint64_t rng = 77;
    int32_t pr[16][200], len[16];
    make_prompts(&rng, 16, pr, len);
    kvt_tier *t;
    kvc_cache *c = open_pair(1 << 30, 7, BS, &t, NULL);
    uint64_t cap = 40 * kvt_file_bytes(t, 1);
    prefill(c, t, pr[0], len[0], &rng);
    close_pair(c, t);
    c = open_pair(cap, 7, BS, &t, NULL);
    evlog *l = calloc(1, sizeof *l);
    cr_assert_not_null(l);
    kvt_events_enable(t); /* announces what the scan found */
    kvt_drain_events(t, on_ev, l);
    kvt_stats st;
    kvt_get_stats(t, &st);
    cr_assert_eq((uint64_t)l->n_stored, st.blocks);
    for (int32_t i = 1; i < 16; i++) {
        prefill(c, t, pr[i], len[i], &rng);
        kvt_flush(t);
        kvt_drain_events(t, on_ev, l);
    }
    cr_assert(!l->bad);
    kvt_get_stats(t, &st);
    cr_assert_gt(st.files_evicted, 0);
    /* a mirror that counts stored minus removed holds exactly what the index holds */
    cr_assert_eq((uint64_t)(l->n_stored - l->n_removed), st.blocks);
    for (int32_t i = 0; i < l->n_removed; i++) cr_assert(has(l->stored, l->n_stored, l->removed[i]));
    close_pair(c, t);
    free(l);
    rm_dir();
}

Test(kv_tier, a_saved_session_restores_into_another_tier_and_a_bad_one_never_does) {
    mk_dir();
    uint64_t rng = 31;
    int32_t tok[200];
    for (int i = 0; i < 200; i++) tok[i] = kvct_range(&rng, 50);
    kvt_tier *t;
    int warn = 0;
    kvc_cache *c = open_pair(1 << 30, 7, BS, &t, &warn);
    prefill(c, t, tok, 150, &rng); /* several runs (files) */
    char sess[300], other[300];
    snprintf(sess, sizeof sess, "%s/session", dir);
    snprintf(other, sizeof other, "%s/../kvs-tier-session-other", dir);
    int32_t saved;
    uint64_t bytes;
    cr_assert_eq(kvt_export(t, tok, 200, sess, &saved, &bytes), KVS_OK);
    cr_assert_eq(saved, 148, "the chain of full blocks held: 37 blocks");
    int32_t none[8] = {99, 99, 99, 99, 99, 99, 99, 99};
    cr_assert_eq(kvt_export(t, none, 8, other, &saved, &bytes), KVS_ERR_NOT_FOUND);
    cr_assert_neq(access(other, F_OK), 0);
    close_pair(c, t);
    /* a tier in another directory: the session's blocks come back through kvt_import */
    char keep[256];
    snprintf(keep, sizeof keep, "%s", dir);
    mk_dir();
    c = open_pair(1 << 30, 7, BS, &t, &warn);
    int32_t *rt = NULL, nt = 0;
    cr_assert_eq(kvt_import(t, sess, &rt, &nt, &bytes), KVS_OK);
    cr_assert_eq(nt, 148);
    cr_assert(!memcmp(rt, tok, 148 * sizeof *rt));
    free(rt);
    cr_assert_eq(load_check(c, t, tok, 150), 148);
    close_pair(c, t);
    rm_dir();
    /* flipped bytes (a sample of positions), a truncation, another identity: KVS_ERR_FORMAT, nothing indexed */
    FILE *f = fopen(sess, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    uint8_t *orig = malloc((size_t)size), *bad = malloc((size_t)size);
    fseek(f, 0, SEEK_SET);
    cr_assert_eq(fread(orig, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    char badp[320];
    snprintf(badp, sizeof badp, "%s.bad", sess);
    for (int trial = 0; trial < 60; trial++) {
        memcpy(bad, orig, (size_t)size);
        long len = size;
        if (trial == 0) len = size - 1;
        else bad[kvct_range(&rng, (int32_t)size)] ^= (uint8_t)(1 + kvct_range(&rng, 255));
        f = fopen(badp, "wb");
        cr_assert_eq(fwrite(bad, 1, (size_t)len, f), (size_t)len);
        fclose(f);
        mk_dir();
        c = open_pair(1 << 30, trial == 1 ? 8 : 7, BS, &t, &warn);
        cr_assert_eq(kvt_import(t, badp, &rt, &nt, &bytes), KVS_ERR_FORMAT, "trial %d", trial);
        cr_assert_null(rt);
        cr_assert_eq(load_check(c, t, tok, 150), 0);
        cr_assert_eq(count_files(".kvt") + count_files(".part"), 0);
        close_pair(c, t);
        rm_dir();
    }
    unlink(badp);
    unlink(sess);
    free(orig);
    free(bad);
    snprintf(dir, sizeof dir, "%s", keep);
    rm_dir();
}

Test(kv_tier, bad_arguments) {
    mk_dir();
    kvc_cache *c = kvct_make(NB, BS, 4, 256);
    kvt_tier *t = NULL;
    kvt_params p = tparams(1 << 30, 7, NULL);
    cr_assert_eq(kvt_open(NULL, c, &t), KVS_ERR_INVALID);
    p.max_bytes = 10;
    cr_assert_eq(kvt_open(&p, c, &t), KVS_ERR_INVALID);
    p = tparams(1 << 30, 7, NULL);
    char file[300];
    snprintf(file, sizeof file, "%s/x", dir);
    FILE *f = fopen(file, "w");
    fclose(f);
    p.dir = file;
    cr_assert_eq(kvt_open(&p, c, &t), KVS_ERR_IO);
    unlink(file);
    p.dir = dir;
    cr_assert_eq(kvt_open(&p, c, &t), KVS_OK);
    int32_t seq, got = 5, tok[8] = {0};
    cr_assert_eq(kvc_seq_alloc(c, &seq), KVC_OK);
    cr_assert_eq(kvt_load(t, seq, tok, 8, 3, 10, &got), KVS_ERR_INVALID); /* have not a block multiple */
    cr_assert_eq(got, 0);
    cr_assert_eq(kvt_load(t, seq, tok, 8, 4, 10, &got), KVS_ERR_INVALID); /* have is not seq's length */
    cr_assert_eq(kvt_load(t, seq, tok, 8, 0, 10, &got), KVS_OK);           /* nothing on disk */
    cr_assert_eq(got, 0);
    kvt_close(t);
    kvc_free(c);
    rm_dir();
}
