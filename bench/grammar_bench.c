/*
 * grammar_bench.c: micro-benchmark of the grammar masks (not a test: timing only).
 *
 *   kvgrammar-bench [SHARED_DIR] [n_seqs]     SHARED_DIR default ../shared, n_seqs default 32
 *
 * For the gpt-2 (50257 tokens) and qwen2 (151936) vocabularies of SHARED_DIR/models/vocab-only and two typical
 * schemas (an object with strings, a bounded integer, an enum, an array of strings, a nested object with a
 * pattern and a date; once with maxLength on the strings, once without), n_seqs sequences (clones of one matcher, so one shared mask cache) each pick random
 * allowed tokens until eog (at most 256 tokens), as a model constrained by this schema at temperature 1 would
 * without any preference. Reported, in thread CPU time per token:
 *   cold:    the mask computed from scratch every step (cache disabled);
 *   average: the mask with the shared cache over the n_seqs sequences (first sequences fill it, later ones hit);
 *   hit:     a mask served from the cache;
 *   accept:  advancing the matcher by the chosen token;
 * then n_seqs other walks on the same cache (a cache kept across requests).
 * Also the time to build the vocabulary trie and to compile the schema.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/grammar.h"
#include "helper_vocab.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Two typical schemas: strings bounded by maxLength (every length left is another grammar state), and the same
 * without bounds on the strings (as pydantic writes most schemas). */
static const char *SCHEMAS[2] = {
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":40},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
    "\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":20},\"maxItems\":5},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"},\"since\":{\"type\":\"string\",\"format\":\"date\"}},"
    "\"required\":[\"street\",\"zip\"],\"additionalProperties\":false},"
    "\"active\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"age\",\"role\"],\"additionalProperties\":false}",
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\"},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
    "\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"},\"since\":{\"type\":\"string\",\"format\":\"date\"}},"
    "\"required\":[\"street\",\"zip\"],\"additionalProperties\":false},"
    "\"active\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"age\",\"role\"],\"additionalProperties\":false}"};

static uint64_t rng_s = 0x9E3779B97F4A7C15ULL;
static uint64_t rnd(void) {
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return rng_s;
}

typedef struct figs { double mask_s, accept_s; long masks, tokens, hits; } figs;

/* n_seqs random walks from clones of base; masks with base's cache. */
static void walks(gmr_matcher *base, const gmr_vocab *v, int n_seqs, figs *f, double *hit_s, long *n_hit) {
    size_t words = gmr_mask_words(v);
    int32_t n = gmr_vocab_size(v);
    uint32_t *mask = malloc(words * sizeof *mask);
    int32_t *allowed = malloc((size_t)n * sizeof *allowed);
    for (int s = 0; s < n_seqs; s++) {
        gmr_matcher *m = NULL;
        if (gmr_matcher_clone(base, &m)) exit(1);
        for (int step = 0; step < 256 && !gmr_matcher_is_finished(m); step++) {
            uint64_t h0;
            gmr_matcher_cache_stats(m, NULL, &h0);
            double t0 = now_s();
            if (gmr_matcher_fill_mask(m, mask, words)) exit(1);
            double dt = now_s() - t0;
            uint64_t h1;
            gmr_matcher_cache_stats(m, NULL, &h1);
            f->mask_s += dt;
            f->masks++;
            if (h1 > h0) {
                *hit_s += dt;
                (*n_hit)++;
            }
            int na = 0;
            for (int32_t t = 0; t < n; t++)
                if (mask[t >> 5] >> (t & 31) & 1) allowed[na++] = t;
            if (!na) break;
            int32_t tok = allowed[rnd() % (uint64_t)na];
            t0 = now_s();
            if (gmr_matcher_accept_token(m, tok)) exit(1);
            f->accept_s += now_s() - t0;
            f->tokens++;
        }
        gmr_matcher_free(m);
    }
    free(mask);
    free(allowed);
}

int main(int argc, char **argv) {
    const char *shared = argc > 1 ? argv[1] : "../shared";
    int n_seqs = argc > 2 ? atoi(argv[2]) : 32;
    static const char *vocabs[2] = {"ggml-vocab-gpt-2.gguf", "ggml-vocab-qwen2.gguf"};
    static const char *names[2] = {"bounded strings", "unbounded strings"};
    char err[512];
    for (int k = 0; k < 2; k++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/models/vocab-only/%s", shared, vocabs[k]);
        gmr_vocab *v = NULL;
        double t0 = now_s();
        if (kvt_load_vocab(path, &v, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        printf("\n%s: %d tokens, loaded and trie built in %.0f ms\n", vocabs[k], gmr_vocab_size(v), (now_s() - t0) * 1e3);
        for (int si = 0; si < 2; si++) {
            cJSON *schema = cJSON_Parse(SCHEMAS[si]);
            gmr_grammar *g = NULL;
            t0 = now_s();
            if (!schema || gmr_compile_schema(schema, NULL, &g, err, sizeof err)) {
                fprintf(stderr, "schema: %s\n", err);
                return 1;
            }
            printf(" schema with %s (compiled in %.2f ms)\n", names[si], (now_s() - t0) * 1e3);
            /* cold: a cache too small to hold a mask */
            gmr_matcher *cold = NULL;
            if (gmr_matcher_create(g, v, 1, &cold)) return 1;
            figs fc = {0};
            double hs = 0;
            long nh = 0;
            rng_s = 0x9E3779B97F4A7C15ULL;
            walks(cold, v, 4, &fc, &hs, &nh);
            gmr_matcher_free(cold);
            printf("  cold (no cache), 4 sequences: %ld tokens, mask %.3f ms/token, accept %.4f ms/token\n", fc.tokens,
                   fc.mask_s / (double)fc.masks * 1e3, fc.accept_s / (double)fc.tokens * 1e3);
            gmr_matcher *warm = NULL;
            if (gmr_matcher_create(g, v, 0, &warm)) return 1;
            figs fw = {0};
            hs = 0;
            nh = 0;
            rng_s = 0x9E3779B97F4A7C15ULL;
            walks(warm, v, n_seqs, &fw, &hs, &nh);
            uint64_t comp, hits;
            gmr_matcher_cache_stats(warm, &comp, &hits);
            printf("  cached, %d sequences: %ld tokens, mask %.3f ms/token on average (%llu computed, %llu hits, "
                   "hit %.4f ms), accept %.4f ms/token\n",
                   n_seqs, fw.tokens, fw.mask_s / (double)fw.masks * 1e3, (unsigned long long)comp,
                   (unsigned long long)hits, nh ? hs / (double)nh * 1e3 : 0, fw.accept_s / (double)fw.tokens * 1e3);
            /* the same sequences once more: a cache kept across requests (a template matcher per schema) */
            fw = (figs){0};
            rng_s = 0x1234567ULL;
            walks(warm, v, n_seqs, &fw, &hs, &nh);
            gmr_matcher_cache_stats(warm, &comp, &hits);
            printf("  cached, %d more sequences on the same cache: mask %.3f ms/token on average (%llu computed in all)\n",
                   n_seqs, fw.mask_s / (double)fw.masks * 1e3, (unsigned long long)comp);
            gmr_matcher_free(warm);
            gmr_grammar_free(g);
            cJSON_Delete(schema);
        }
        gmr_vocab_free(v);
    }
    return 0;
}
