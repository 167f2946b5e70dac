/*
 * fuzz_kv_tier.c: the disk tier's file reader (cache/kv_tier.h) against damaged files. For each input a tier writes
 * the blocks of a prompt (rows from helper_kvc.h: a pure function of token and position) into its files and saves
 * them as a session; the input then damages one file and the session (bytes 0-1: a truncation, then 3-byte edits:
 * an offset and an xor mask), and a new tier over the directory scans, loads the prompt and imports the session.
 * Properties: no crash; every row that reaches the pool is the reference row of its token and position; the pool's
 * invariants hold; an imported session is the original prompt's blocks.
 */
#include "fuzz_util.h"


#include "cache/kv_tier.h"
#include "helper_kvc.h"
#include "helper_tmpdir.h"

enum { BS = 4, NB = 64, NTOK = 40 };

static char dir[64];

static void rm_tree(void) { tmpt_rm_flat(dir); }

static void quiet(void *ctx, const char *msg) { (void)ctx; (void)msg; }

static kvt_tier *open_tier(kvc_cache *c) {
    kvt_params p = {.dir = dir, .max_bytes = (uint64_t)1 << 30, .warn = quiet};
    memset(p.identity, 7, sizeof p.identity);
    kvt_tier *t = NULL;
    FZ_CHECK(kvt_open(&p, c, &t) == KVS_OK, "%s", "kvt_open");
    kvc_set_event_cb(c, kvt_on_cache_event, t);
    return t;
}

static void close_tier(kvc_cache *c, kvt_tier *t) {
    kvc_set_event_cb(c, NULL, NULL);
    kvt_close(t);
}

/* Loads tokens[0..n) into a fresh sequence (pool, then tier) and checks every row it holds. */
static int32_t load_check(kvc_cache *c, kvt_tier *t, const int32_t *tok, int32_t n) {
    int32_t seq, have = 0, got = 0;
    FZ_CHECK(kvc_seq_alloc(c, &seq) == KVC_OK, "%s", "seq");
    FZ_CHECK(kvc_attach_prefix(c, seq, tok, n, &have) == KVC_OK, "%s", "attach");
    (void)kvt_load(t, seq, tok, n, have, NB, &got);
    kvc_layout lay;
    kvc_get_layout(c, &lay);
    const int32_t *blocks;
    int32_t nbk, len;
    FZ_CHECK(kvc_block_table(c, seq, &blocks, &nbk, &len) == KVC_OK, "%s", "table");
    FZ_CHECK(len == have + got, "%d != %d + %d", len, have, got);
    for (int32_t pos = 0; pos < len; pos++)
        FZ_CHECK(kvct_check_slot(&lay, blocks[pos / BS] * BS + pos % BS, tok[pos], pos) == 0,
                 "position %d holds a wrong row", pos);
    char msg[256];
    FZ_CHECK(kvc_check(c, msg, sizeof msg) == KVC_OK, "%s", msg);
    kvc_seq_free(c, seq);
    return len;
}

/* Applies the input's damage to the file at path. */
static void damage(const char *path, fz_in *in) {
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    uint32_t cut = fz_u16(in);
    for (int k = 0; k < 8 && fz_left(in) >= 3; k++) {
        long off = (long)(fz_u16(in) % (uint32_t)(size > 0 ? size : 1));
        uint8_t x = (uint8_t)fz_byte(in);
        fseek(f, off, SEEK_SET);
        int b = fgetc(f);
        if (b == EOF) break;
        fseek(f, off, SEEK_SET);
        fputc(b ^ x, f);
    }
    fclose(f);
    if (cut && (long)cut < size && truncate(path, (off_t)cut) != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size, 0};
    snprintf(dir, sizeof dir, "/tmp/kvs-fuzz-tier-XXXXXX");
    FZ_CHECK(mkdtemp(dir) != NULL, "%s", "mkdtemp");
    int32_t tok[NTOK];
    uint64_t rng = size + 1;
    for (int i = 0; i < NTOK; i++) tok[i] = kvct_range(&rng, 30);
    kvc_cache *c = kvct_make(NB, BS, 2, 64);
    FZ_CHECK(c != NULL, "%s", "cache");
    kvt_tier *t = open_tier(c);
    int32_t seq;
    FZ_CHECK(kvc_seq_alloc(c, &seq) == KVC_OK, "%s", "seq");
    FZ_CHECK(kvct_append(c, seq, tok, 24) == KVC_OK && (kvt_step_end(t), kvct_append(c, seq, tok, 16)) == KVC_OK,
             "%s", "prefill");
    kvc_seq_free(c, seq);
    char sess[128];
    snprintf(sess, sizeof sess, "%s/session", dir);
    int32_t saved;
    uint64_t bytes;
    kvt_step_end(t);
    FZ_CHECK(kvt_export(t, tok, NTOK, sess, &saved, &bytes) == KVS_OK && saved == NTOK, "%s", "export");
    close_tier(c, t);
    kvc_free(c);
    /* the damage: the first run's file and the session */
    char first[128];
    snprintf(first, sizeof first, "%s/0.kvt", dir);
    damage(first, &in);
    damage(sess, &in);
    c = kvct_make(NB, BS, 2, 64);
    FZ_CHECK(c != NULL, "%s", "cache");
    t = open_tier(c);
    load_check(c, t, tok, NTOK);
    int32_t *rt = NULL, nt = 0;
    int rc = kvt_import(t, sess, &rt, &nt, &bytes);
    FZ_CHECK(rc == KVS_OK || rc == KVS_ERR_FORMAT || rc == KVS_ERR_IO, "import: %d", rc);
    if (rc == KVS_OK) {
        FZ_CHECK(nt == NTOK && !memcmp(rt, tok, sizeof tok), "%s", "an imported session is not the prompt");
        FZ_CHECK(load_check(c, t, tok, NTOK) == NTOK, "%s", "an imported session does not load");
    }
    free(rt);
    close_tier(c, t);
    kvc_free(c);
    rm_tree();
    return 0;
}
