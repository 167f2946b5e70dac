/* Host-side logic of the CUDA backend, tested without a GPU: block-table marshalling, attention launch
 * geometry, graph buckets. Randomized against direct recomputation. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_engine.h"
#include "engine/engine.h"

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int32_t rnd(uint64_t *s, int32_t lo, int32_t hi) { return lo + (int32_t)(rng_next(s) % (uint64_t)(hi - lo + 1)); }

Test(cuda_host, tables_randomized) {
    cud_tables t = {0};
    for (uint64_t seed = 1; seed <= 300; seed++) {
        uint64_t s = seed;
        int32_t bs = rnd(&s, 1, 32), n_seqs = rnd(&s, 1, 12);
        int32_t lens[12], nblk[12], *tabs[12];
        for (int i = 0; i < n_seqs; i++) {
            lens[i] = rnd(&s, 0, 300);
            int32_t need = (lens[i] + bs - 1) / bs;
            nblk[i] = need + rnd(&s, 0, 2); /* a table may be longer than needed */
            tabs[i] = malloc(sizeof(int32_t) * (size_t)(nblk[i] ? nblk[i] : 1));
            for (int k = 0; k < nblk[i]; k++) tabs[i][k] = rnd(&s, 0, 100000);
        }
        int32_t n_rows = rnd(&s, 1, 20), seq_index[20];
        for (int r = 0; r < n_rows; r++) seq_index[r] = rnd(&s, 0, n_seqs - 1);
        cud_batch b = {.n = n_rows, .seq_index = seq_index, .n_seqs = n_seqs, .seq_len = lens,
                       .block_tables = (const int32_t *const *)tabs, .n_blocks = nblk};
        cr_assert_eq(cud_tables_build(&t, &b, bs), ENG_OK, "seed %llu", (unsigned long long)seed);
        int32_t stride = 1;
        for (int i = 0; i < n_seqs; i++) if ((lens[i] + bs - 1) / bs > stride) stride = (lens[i] + bs - 1) / bs;
        cr_assert_eq(t.stride, stride, "seed %llu", (unsigned long long)seed);
        cr_assert_eq(t.n_seqs, n_seqs);
        for (int i = 0; i < n_seqs; i++) {
            int32_t need = (lens[i] + bs - 1) / bs;
            cr_assert_eq(t.seq_len[i], lens[i]);
            for (int k = 0; k < stride; k++)
                cr_assert_eq(t.tables[i * stride + k], k < need ? tabs[i][k] : -1, "seed %llu seq %d blk %d",
                             (unsigned long long)seed, i, k);
        }
        for (int i = 0; i < n_seqs; i++) free(tabs[i]);
    }
    cud_tables_free(&t);
}

Test(cuda_host, tables_reject_bad_input) {
    cud_tables t = {0};
    int32_t len[1] = {33}, nb[1] = {2}, tab[2] = {0, 1}, seq[1] = {0};
    const int32_t *tabs[1] = {tab};
    cud_batch b = {.n = 1, .seq_index = seq, .n_seqs = 1, .seq_len = len, .block_tables = tabs, .n_blocks = nb};
    cr_assert_eq(cud_tables_build(&t, &b, 16), ENG_ERR_INVALID, "33 tokens need 3 blocks of 16");
    cr_assert_eq(cud_tables_build(&t, &b, 17), ENG_OK);
    seq[0] = 1;
    cr_assert_eq(cud_tables_build(&t, &b, 17), ENG_ERR_INVALID, "row points outside the sequence list");
    seq[0] = 0;
    b.n_seqs = 0;
    cr_assert_eq(cud_tables_build(&t, &b, 17), ENG_ERR_INVALID);
    cr_assert_eq(cud_tables_build(NULL, &b, 17), ENG_ERR_INVALID);
    cud_tables_free(&t);
    cud_tables_free(NULL);
}

Test(cuda_host, attention_plan_covers_context) {
    uint64_t s = 42;
    for (int it = 0; it < 2000; it++) {
        int32_t rows = rnd(&s, 1, 512), heads = rnd(&s, 1, 64), hd = 32 * rnd(&s, 1, 8), bs = rnd(&s, 1, 64);
        int32_t ctx = rnd(&s, 1, 131072), sms = rnd(&s, 1, 144);
        cud_attn_geometry g;
        cr_assert_eq(cud_attn_plan(rows, heads, hd, bs, ctx, sms, &g), ENG_OK);
        cr_assert_eq(g.partition_tokens % bs, 0, "partitions are whole blocks");
        cr_assert_geq((int64_t)g.partition_tokens * g.max_partitions, ctx, "partitions cover the context");
        cr_assert_lt((int64_t)g.partition_tokens * (g.max_partitions - 1), ctx, "no empty trailing partition");
        cr_assert_eq(g.grid_x, heads);
        cr_assert_eq(g.grid_y, rows);
        cr_assert_eq(g.grid_z, g.max_partitions);
        cr_assert_eq(g.needs_reduce, g.max_partitions > 1);
        cr_assert_leq(g.max_partitions, (ctx + 255) / 256, "partitions of at least ~256 tokens");
        cr_assert_gt(g.threads, 0);
    }
    cud_attn_geometry g;
    cr_assert_eq(cud_attn_plan(0, 1, 64, 16, 10, 1, &g), ENG_ERR_INVALID);
    cr_assert_eq(cud_attn_plan(1, 1, 512, 16, 10, 1, &g), ENG_ERR_INVALID, "head_dim over 256");
    /* One long sequence on a big GPU is split; many rows are not. */
    cr_assert_eq(cud_attn_plan(1, 32, 64, 16, 32768, 132, &g), ENG_OK);
    cr_assert_gt(g.max_partitions, 1);
    cr_assert_eq(cud_attn_plan(256, 32, 64, 16, 32768, 132, &g), ENG_OK);
    cr_assert_eq(g.max_partitions, 1);
}

Test(cuda_host, graph_buckets) {
    int32_t nb[40], lens[40], seq[40], out[40], tok[40], pos[40], slot[40];
    const int32_t *tabs[40] = {0};
    for (int i = 0; i < 40; i++) { nb[i] = 1 + i % 5; lens[i] = 1; seq[i] = i; out[i] = i; tok[i] = pos[i] = slot[i] = 0; }
    cud_batch b = {.n = 3, .token = tok, .pos = pos, .seq_index = seq, .slot = slot, .n_seqs = 3, .seq_len = lens,
                   .block_tables = tabs, .n_blocks = nb, .n_out = 3, .out_rows = out};
    cud_graph_key k;
    cr_assert(cud_graph_bucket(&b, 512, 1024, &k));
    cr_assert_eq(k.n_rows, 4);
    cr_assert_eq(k.table_stride, 4, "max blocks 3 rounds up to 4");
    int32_t expect_rows[] = {0, 1, 2, 4, 4, 8, 8, 8, 8, 16, 16};
    for (int n = 1; n <= 10; n++) {
        b.n = b.n_seqs = b.n_out = n;
        cr_assert(cud_graph_bucket(&b, 512, 1024, &k));
        cr_assert_eq(k.n_rows, expect_rows[n], "n %d", n);
        cr_assert_geq(k.n_rows, n);
    }
    b.n = 33; b.n_seqs = 33; b.n_out = 33;
    cr_assert(cud_graph_bucket(&b, 512, 1024, &k));
    cr_assert_eq(k.n_rows, 40);
    b.n_out = 32; /* a prefill row: not graph-eligible */
    cr_assert_not(cud_graph_bucket(&b, 512, 1024, &k));
    b.n_out = 33;
    cr_assert_not(cud_graph_bucket(&b, 32, 1024, &k), "over max rows");
}

Test(cuda_host, no_device_is_reported_cleanly) {
    char name[64];
    int32_t n = cud_available(name, sizeof name);
    cr_assert_geq(n, 0);
    if (n == 0) cr_assert_eq(name[0], '\0');
}
