/* grammar_cache.c: the compiled response grammars (see grammar_cache_internal.h and api.h). */
#include "server/api/grammar_cache_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

struct srv_grammar_cache_entry {
    srv_grammar_cache_entry *prev, *next; /* the LRU list, most recent first (NULL links when dropped) */
    char *key;
    gmr_grammar *g;
    gmr_matcher *tmpl;
    int32_t refs;
    bool listed;
};

struct srv_grammar_cache {
    gmr_vocab *vocab;
    int32_t max_entries;
    size_t mask_bytes;
    uv_mutex_t mu;
    srv_grammar_cache_entry *head, *tail;
    int32_t n;
    uint64_t hits, misses;
};

int srv_grammar_cache_vocab_from_model(const eng_model *model, gmr_vocab **out) {
    if (!model || !out) return KVS_ERR_INVALID;
    *out = NULL;
    int32_t n = eng_model_hparams(model)->n_vocab;
    char **pieces = calloc((size_t)n, sizeof *pieces);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    uint8_t *flags = calloc((size_t)n, 1);
    int rc = pieces && lens && flags ? 0 : KVS_ERR_NOMEM;
    char buf[1100];
    for (int32_t t = 0; t < n && !rc; t++) {
        size_t len = 0;
        rc = eng_token_to_piece(model, t, false, buf, sizeof buf, &len);
        if (rc == ENG_ERR_TOO_LARGE) { /* a piece longer than the trie takes: never allowed */
            rc = 0;
            len = 0;
        }
        if (rc) break;
        if (!(pieces[t] = malloc(len + 1))) rc = KVS_ERR_NOMEM;
        else memcpy(pieces[t], buf, len);
        lens[t] = len;
        flags[t] = (uint8_t)((eng_token_is_eog(model, t) ? GMR_TOKEN_EOG : 0) |
                             (eng_token_is_special(model, t) ? GMR_TOKEN_SPECIAL : 0));
    }
    if (!rc) rc = gmr_vocab_create((const char *const *)pieces, lens, flags, n, out);
    for (int32_t t = 0; pieces && t < n; t++) free(pieces[t]);
    free(pieces);
    free(lens);
    free(flags);
    return rc;
}

int srv_grammar_cache_create(gmr_vocab *vocab, int32_t max_entries, size_t mask_cache_bytes, srv_grammar_cache **out) {
    if (!out || !vocab || max_entries < 1) {
        gmr_vocab_free(vocab);
        return KVS_ERR_INVALID;
    }
    *out = NULL;
    srv_grammar_cache *c = calloc(1, sizeof *c);
    if (!c) {
        gmr_vocab_free(vocab);
        return KVS_ERR_NOMEM;
    }
    if (uv_mutex_init(&c->mu) != 0) {
        free(c);
        gmr_vocab_free(vocab);
        return KVS_ERR_THREAD;
    }
    c->vocab = vocab;
    c->max_entries = max_entries;
    c->mask_bytes = mask_cache_bytes ? mask_cache_bytes : (size_t)16 << 20;
    *out = c;
    return KVS_OK;
}

static void entry_free(srv_grammar_cache_entry *e) {
    if (!e) return;
    gmr_matcher_free(e->tmpl);
    gmr_grammar_free(e->g);
    free(e->key);
    free(e);
}

static void unlink_entry(srv_grammar_cache *c, srv_grammar_cache_entry *e) {
    if (e->prev) e->prev->next = e->next;
    else c->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else c->tail = e->prev;
    e->prev = e->next = NULL;
    e->listed = false;
    c->n--;
}

static void push_front(srv_grammar_cache *c, srv_grammar_cache_entry *e) {
    e->prev = NULL;
    e->next = c->head;
    if (c->head) c->head->prev = e;
    else c->tail = e;
    c->head = e;
    e->listed = true;
    c->n++;
}

/* Drops unreferenced entries from the cold end while the list is over its bound (under mu). */
static void trim(srv_grammar_cache *c) {
    srv_grammar_cache_entry *e = c->tail;
    while (c->n > c->max_entries && e) {
        srv_grammar_cache_entry *prev = e->prev;
        if (e->refs == 0) {
            unlink_entry(c, e);
            entry_free(e);
        }
        e = prev;
    }
}

void srv_grammar_cache_free(srv_grammar_cache *c) {
    if (!c) return;
    while (c->head) {
        srv_grammar_cache_entry *e = c->head;
        unlink_entry(c, e);
        entry_free(e);
    }
    uv_mutex_destroy(&c->mu);
    gmr_vocab_free(c->vocab);
    free(c);
}

const gmr_vocab *srv_grammar_cache_vocab(const srv_grammar_cache *c) { return c ? c->vocab : NULL; }

static srv_grammar_cache_entry *find(srv_grammar_cache *c, const char *key) {
    for (srv_grammar_cache_entry *e = c->head; e; e = e->next)
        if (!strcmp(e->key, key)) return e;
    return NULL;
}

/* A cache hit (under mu, which it unlocks): the entry becomes the most recent and gains a reference. */
static srv_grammar_cache_entry *take_hit(srv_grammar_cache *c, srv_grammar_cache_entry *e) {
    unlink_entry(c, e);
    push_front(c, e);
    e->refs++;
    c->hits++;
    uv_mutex_unlock(&c->mu);
    return e;
}

typedef struct schema_src { const cJSON *schema; } schema_src;

static int compile_schema(void *ud, gmr_grammar **g, char *err, size_t err_len) {
    const cJSON *schema = ((const schema_src *)ud)->schema;
    return schema ? gmr_compile_schema(schema, NULL, g, err, err_len) : gmr_compile_json_object(NULL, g, err, err_len);
}

int srv_grammar_cache_get(srv_grammar_cache *c, const char *key, const cJSON *schema, srv_grammar_cache_entry **out,
                          char *err, size_t err_len) {
    if (err && err_len) err[0] = 0;
    if (schema && !key) return KVS_ERR_INVALID;
    schema_src src = {schema};
    return srv_grammar_cache_get_with(c, schema ? key : "\001json_object", compile_schema, &src, out, err, err_len);
}

int srv_grammar_cache_get_with(srv_grammar_cache *c, const char *k, srv_grammar_cache_compile_fn compile, void *ud,
                               srv_grammar_cache_entry **out, char *err, size_t err_len) {
    if (err && err_len) err[0] = 0;
    if (!c || !out || !k || !compile) return KVS_ERR_INVALID;
    *out = NULL;
    uv_mutex_lock(&c->mu);
    srv_grammar_cache_entry *e = find(c, k);
    if (e) {
        *out = take_hit(c, e);
        return KVS_OK;
    }
    uv_mutex_unlock(&c->mu);
    /* compile outside the lock: it may take a while for a large schema */
    e = calloc(1, sizeof *e);
    if (!e || !(e->key = strdup(k))) {
        free(e);
        return KVS_ERR_NOMEM;
    }
    int rc = compile(ud, &e->g, err, err_len);
    if (rc == KVS_OK) rc = gmr_matcher_create(e->g, c->vocab, c->mask_bytes, &e->tmpl);
    if (rc != KVS_OK) {
        if (err && err_len && !err[0]) snprintf(err, err_len, "%s", kvs_strerror(rc));
        entry_free(e);
        return rc;
    }
    uv_mutex_lock(&c->mu);
    srv_grammar_cache_entry *other = find(c, k); /* compiled meanwhile by another request: keep that one */
    if (other) {
        *out = take_hit(c, other);
        entry_free(e);
        return KVS_OK;
    }
    e->refs = 1;
    push_front(c, e);
    c->misses++;
    trim(c);
    uv_mutex_unlock(&c->mu);
    *out = e;
    return KVS_OK;
}

const gmr_matcher *srv_grammar_cache_matcher(const srv_grammar_cache_entry *e) { return e ? e->tmpl : NULL; }

void srv_grammar_cache_release(srv_grammar_cache *c, srv_grammar_cache_entry *e) {
    if (!c || !e) return;
    uv_mutex_lock(&c->mu);
    e->refs--;
    if (e->refs == 0) trim(c);
    uv_mutex_unlock(&c->mu);
}

void srv_grammar_cache_get_stats(srv_grammar_cache *c, srv_grammar_cache_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!c) return;
    uv_mutex_lock(&c->mu);
    out->hits = c->hits;
    out->misses = c->misses;
    out->entries = c->n;
    uv_mutex_unlock(&c->mu);
}
