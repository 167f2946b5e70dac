/* gmr_match.c: the vocabulary trie, the matcher (a set of parse stacks advanced byte by byte) and the token
 * masks with their shared cache.
 *
 * A parse stack is a chain of frames (element position, repetition count) from the top (the position the next
 * byte is matched at) down to the start. Frames live in a scratch arena as nodes pointing at their parent, so
 * that advancing one byte creates only the few frames that change; a state is the list of its top nodes.
 * Stepping over a byte expands rules lazily, entering only the alternatives whose FIRST set holds the byte (or
 * that can be empty). Between tokens a matcher keeps its state flattened (the serialization is also the key
 * of the mask cache, with repetition counts clamped: see make_key). A mask is computed by walking the vocabulary
 * trie in preorder: each trie node advances its parent's state by one byte, and a node whose state dies skips its
 * whole subtree.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gmr_internal.h"

#define MAX_STACK_DEPTH 2048u  /* frames in one stack (JSON nesting), deeper stacks are dropped */
#define MAX_STACKS 512u        /* stacks in one state (ambiguity), more are dropped */
#define MAX_STEP_DEPTH 512     /* nested rule entries while stepping one byte */
#define MAX_FRAMES (1u << 22)  /* frames in one scratch (a mask walk): beyond, the call fails with NOMEM */
#define MAX_TOPS (1u << 24)    /* top ids in one scratch */

/* ---- vocabulary ------------------------------------------------------------------------------------------- */

/* A token trie in preorder, the root excluded. */
typedef struct trie {
    uint32_t n_nodes;
    uint32_t max_depth;
    uint8_t *nbyte;       /* [n_nodes] the byte on the edge into the node */
    uint16_t *ndepth;     /* [n_nodes] 1 + depth of the parent */
    uint32_t *nskip;      /* [n_nodes] the first node after the subtree */
    int32_t *ntok;        /* [n_nodes] a token with exactly these bytes, or -1 (more: tok_next) */
} trie;

/* Tokens longer than this many bytes also sit in a second trie: a cached mask may be keyed on repetition counts
 * clamped at LONG_TOKEN (a token this short cannot tell a larger count from another), and then the long tokens
 * are checked on every use. */
#define LONG_TOKEN 16u

struct gmr_vocab {
    int32_t n_vocab;
    trie all;             /* every token but eog, special and empty ones */
    trie lng;             /* those longer than LONG_TOKEN bytes */
    int32_t *tok_next;    /* [n_vocab] the next token with the same bytes, or -1 */
    uint8_t *flags;       /* [n_vocab] */
    char *bytes;          /* all pieces */
    uint32_t *off;        /* [n_vocab + 1] */
    int32_t *eog;         /* the eog tokens */
    int32_t n_eog;
    int32_t *long_tok;    /* the tokens of lng */
    int32_t n_long;
};

typedef struct tokref { const char *p; uint32_t n; int32_t id; } tokref;

static int tokref_cmp(const void *x, const void *y) {
    const tokref *a = x, *b = y;
    uint32_t m = a->n < b->n ? a->n : b->n;
    int r = memcmp(a->p, b->p, m);
    if (r) return r;
    if (a->n != b->n) return a->n < b->n ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static void trie_free(trie *t) {
    free(t->nbyte);
    free(t->ndepth);
    free(t->nskip);
    free(t->ntok);
}

void gmr_vocab_free(gmr_vocab *v) {
    if (!v) return;
    trie_free(&v->all);
    trie_free(&v->lng);
    KVS_FREE_ALL(v->tok_next, v->flags, v->bytes, v->off, v->eog, v->long_tok, v);
}

/* Builds the trie of tr[0..n) (sorted by bytes); chains tokens with equal bytes through tok_next. */
static int trie_build(trie *T, const tokref *tr, size_t n_tr, int32_t *tok_next) {
    size_t n_max = 0;
    for (size_t i = 0; i < n_tr; i++) n_max += tr[i].n;
    T->nbyte = malloc(n_max + 1);
    T->ndepth = malloc((n_max + 1) * sizeof *T->ndepth);
    T->nskip = malloc((n_max + 1) * sizeof *T->nskip);
    T->ntok = malloc((n_max + 1) * sizeof *T->ntok);
    uint32_t *open = malloc(1026 * sizeof *open);    /* the node at each depth on the current path */
    if (!T->nbyte || !T->ndepth || !T->nskip || !T->ntok || !open) {
        free(open);
        return KVS_ERR_NOMEM;
    }
    uint32_t n = 0, n_open = 0;
    for (size_t i = 0; i < n_tr; i++) {
        uint32_t l = 0;
        if (i > 0) {
            const tokref *p = &tr[i - 1];
            while (l < p->n && l < tr[i].n && p->p[l] == tr[i].p[l]) l++;
        }
        /* close the nodes deeper than the common prefix */
        while (n_open > l) T->nskip[open[--n_open]] = n;
        if (l == tr[i].n) {   /* same bytes as the previous token: chain it */
            int32_t t = T->ntok[open[l - 1]];
            while (tok_next[t] >= 0) t = tok_next[t];
            tok_next[t] = tr[i].id;
            continue;
        }
        for (uint32_t d = l; d < tr[i].n; d++) {
            T->nbyte[n] = (uint8_t)tr[i].p[d];
            T->ndepth[n] = (uint16_t)(d + 1);
            T->ntok[n] = d + 1 == tr[i].n ? tr[i].id : -1;
            if (d + 1 > T->max_depth) T->max_depth = d + 1;
            open[n_open++] = n++;
        }
    }
    while (n_open > 0) T->nskip[open[--n_open]] = n;
    free(open);
    T->n_nodes = n;
    return 0;
}

int gmr_vocab_create(const char *const *pieces, const size_t *lens, const uint8_t *flags, int32_t n_vocab,
                     gmr_vocab **out) {
    if (!out) return KVS_ERR_INVALID;
    *out = NULL;
    if (!pieces || !lens || n_vocab < 1 || n_vocab > (1 << 24)) return KVS_ERR_INVALID;
    size_t total = 0;
    for (int32_t t = 0; t < n_vocab; t++) {
        if (lens[t] > 1024 || (lens[t] && !pieces[t])) return KVS_ERR_INVALID;
        total += lens[t];
    }
    gmr_vocab *v = calloc(1, sizeof *v);
    tokref *tr = malloc((size_t)n_vocab * sizeof *tr);
    if (!v || !tr) goto oom;
    v->n_vocab = n_vocab;
    v->flags = calloc((size_t)n_vocab, 1);
    v->bytes = malloc(total + 1);
    v->off = malloc(((size_t)n_vocab + 1) * sizeof *v->off);
    v->tok_next = malloc((size_t)n_vocab * sizeof *v->tok_next);
    v->eog = malloc((size_t)n_vocab * sizeof *v->eog);
    v->long_tok = malloc((size_t)n_vocab * sizeof *v->long_tok);
    if (!v->flags || !v->bytes || !v->off || !v->tok_next || !v->eog || !v->long_tok) goto oom;
    size_t o = 0, n_tr = 0;
    for (int32_t t = 0; t < n_vocab; t++) {
        v->off[t] = (uint32_t)o;
        if (lens[t]) memcpy(v->bytes + o, pieces[t], lens[t]);
        o += lens[t];
        v->flags[t] = flags ? flags[t] : 0;
        v->tok_next[t] = -1;
        if (v->flags[t] & GMR_TOKEN_EOG) v->eog[v->n_eog++] = t;
        else if (!(v->flags[t] & GMR_TOKEN_SPECIAL) && lens[t]) tr[n_tr++] = (tokref){v->bytes + v->off[t], (uint32_t)lens[t], t};
    }
    v->off[n_vocab] = (uint32_t)o;
    qsort(tr, n_tr, sizeof *tr, tokref_cmp);
    if (trie_build(&v->all, tr, n_tr, v->tok_next)) goto oom;
    size_t n_long = 0;
    for (size_t i = 0; i < n_tr; i++)
        if (tr[i].n > LONG_TOKEN) {
            tr[n_long++] = tr[i];
            v->long_tok[v->n_long++] = tr[i].id;
        }
    /* the chains of equal bytes were made by the first build (equal bytes have equal lengths) */
    int32_t *scratch_next = malloc((size_t)n_vocab * sizeof *scratch_next);
    if (!scratch_next) goto oom;
    for (int32_t t = 0; t < n_vocab; t++) scratch_next[t] = -1;
    int rc = trie_build(&v->lng, tr, n_long, scratch_next);
    free(scratch_next);
    if (rc) goto oom;
    free(tr);
    *out = v;
    return 0;
oom:
    free(tr);
    gmr_vocab_free(v);
    return KVS_ERR_NOMEM;
}

int32_t gmr_vocab_size(const gmr_vocab *v) { return v ? v->n_vocab : 0; }
size_t gmr_mask_words(const gmr_vocab *v) { return v ? ((size_t)v->n_vocab + 31) / 32 : 0; }

void gmr_mask_apply(const uint32_t *mask, float *logits, int32_t n_vocab) {
    for (int32_t t = 0; t < n_vocab; t++)
        if (!(mask[t >> 5] >> (t & 31) & 1)) logits[t] = -INFINITY;
}

/* ---- mask cache ------------------------------------------------------------------------------------------------ */

typedef struct centry { uint64_t h; uint32_t *key; uint32_t klen; uint32_t *mask; } centry;

typedef struct gcache {
    pthread_mutex_t mu;
    int refs;
    centry *tab;
    size_t cap, n;        /* open addressing, cap a power of two */
    size_t bytes, limit;
    size_t words;
    uint64_t computed, hits;
} gcache;

static void cache_clear(gcache *c) {
    for (size_t i = 0; i < c->cap; i++) {
        free(c->tab[i].key);
        free(c->tab[i].mask);
    }
    memset(c->tab, 0, c->cap * sizeof *c->tab);
    c->n = 0;
    c->bytes = 0;
}

static void cache_unref(gcache *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    int left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left) return;
    cache_clear(c);
    free(c->tab);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static uint64_t key_hash(const uint32_t *k, uint32_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (uint32_t i = 0; i < n; i++) {
        h ^= k[i];
        h *= 1099511628211ULL;
        h ^= h >> 29;
    }
    return h | 1;   /* 0 marks an empty slot */
}

/* Copies the cached mask into out; false when absent. */
static bool cache_get(gcache *c, const uint32_t *key, uint32_t klen, uint64_t h, uint32_t *out) {
    bool found = false;
    pthread_mutex_lock(&c->mu);
    for (size_t i = h & (c->cap - 1);; i = (i + 1) & (c->cap - 1)) {
        centry *e = &c->tab[i];
        if (!e->h) break;
        if (e->h == h && e->klen == klen && !memcmp(e->key, key, klen * sizeof *key)) {
            memcpy(out, e->mask, c->words * sizeof *out);
            found = true;
            c->hits++;
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return found;
}

static void cache_put(gcache *c, const uint32_t *key, uint32_t klen, uint64_t h, const uint32_t *mask) {
    size_t need = klen * sizeof *key + c->words * sizeof *mask + sizeof(centry);
    uint32_t *k = malloc(klen * sizeof *key), *m = malloc(c->words * sizeof *mask);
    if (!k || !m) {
        free(k);
        free(m);
        return;   /* the cache is an optimization: no entry, no error */
    }
    memcpy(k, key, klen * sizeof *key);
    memcpy(m, mask, c->words * sizeof *mask);
    pthread_mutex_lock(&c->mu);
    c->computed++;
    if (c->bytes + need > c->limit || (c->n + 1) * 2 > c->cap) cache_clear(c);
    if ((c->n + 1) * 2 > c->cap || need > c->limit) {
        pthread_mutex_unlock(&c->mu);
        free(k);
        free(m);
        return;
    }
    size_t i = h & (c->cap - 1);
    while (c->tab[i].h) {
        if (c->tab[i].h == h && c->tab[i].klen == klen && !memcmp(c->tab[i].key, key, klen * sizeof *key)) break;
        i = (i + 1) & (c->cap - 1);
    }
    if (c->tab[i].h) {   /* another clone computed it meanwhile */
        free(k);
        free(m);
    } else {
        c->tab[i] = (centry){h, k, klen, m};
        c->n++;
        c->bytes += need;
    }
    pthread_mutex_unlock(&c->mu);
}

/* ---- parse stacks ---------------------------------------------------------------------------------------------- */

typedef struct mnode { uint32_t elem, cnt; int32_t parent; uint32_t depth; } mnode;

/* Frames are interned (equal frames, equal ids), so equal stacks have equal top ids; a mask walk also interns
 * its states (lists of tops) and remembers each state's transition by each byte, so that the trie nodes below a
 * state that recurs (the inside of a string) cost one table lookup. */
#define MEMO_STATES 2048u      /* states with a transition table in one walk */
#define SCRATCH_KEEP 4096u     /* hash tables larger than this are freed when the scratch is reset */

typedef struct scratch {
    mnode *nd; uint32_t nn, capn;
    uint32_t *nh; uint32_t nh_cap;     /* frame intern table: id + 1, 0 empty */
    uint32_t *tp; uint32_t nt, capt;   /* top lists of states */
    uint32_t *s_off, *s_n; uint32_t ns, cap_s;   /* interned states: tops tp[s_off .. s_off + s_n) */
    uint32_t *sh; uint32_t sh_cap;     /* state intern table: id + 1 */
    uint32_t *tr; uint32_t tr_states;  /* [tr_states][256]: 0 unknown, 1 dead, k + 2 state k */
    bool oom;
} scratch;

struct gmr_matcher {
    const gmr_grammar *g;
    const gmr_vocab *v;
    gcache *c;
    uint32_t *st; uint32_t n_st, cap_st;   /* the current state, flattened (also the cache key) */
    bool complete, finished;
    scratch sc;
    uint32_t *key; uint32_t cap_key;       /* the cache key of the current state */
    uint32_t *lv;                          /* walk levels: [max_depth + 1] state ids */
};

static inline uint32_t node_hash(uint32_t elem, uint32_t cnt, int32_t parent) {
    uint32_t h = elem * 0x9E3779B1u ^ cnt * 0x85EBCA77u ^ (uint32_t)parent * 0xC2B2AE3Du;
    return h ^ h >> 15;
}

/* Replaces an intern table (*tab of *tab_cap slots holding id + 1, 0 empty; linear probing) by one twice as large
 * (first slots when empty) holding ids 0..n placed by hash(sc, id). false when out of memory (the old one kept).
 * Serves the frame table and the state table. */
static bool tab_rehash(const scratch *sc, uint32_t **tab, uint32_t *tab_cap, uint32_t first, uint32_t n,
                       uint32_t (*hash)(const scratch *, uint32_t)) {
    uint32_t cap = *tab_cap ? *tab_cap * 2 : first;
    uint32_t *t = calloc(cap, sizeof *t);
    if (!t) return false;
    for (uint32_t id = 0; id < n; id++) {
        uint32_t h = hash(sc, id) & (cap - 1);
        while (t[h]) h = (h + 1) & (cap - 1);
        t[h] = id + 1;
    }
    free(*tab);
    *tab = t;
    *tab_cap = cap;
    return true;
}

/* Empties an intern table; one a large walk grew is freed rather than cleared. */
static void tab_reset(uint32_t **tab, uint32_t *tab_cap) {
    if (*tab_cap > SCRATCH_KEEP) {
        free(*tab);
        *tab = NULL;
        *tab_cap = 0;
    } else if (*tab) {
        memset(*tab, 0, *tab_cap * sizeof **tab);
    }
}

static uint32_t node_hash_id(const scratch *sc, uint32_t id) {
    const mnode *x = &sc->nd[id];
    return node_hash(x->elem, x->cnt, x->parent);
}

static bool node_rehash(scratch *sc) { return tab_rehash(sc, &sc->nh, &sc->nh_cap, 1024, sc->nn, node_hash_id); }

/* The id of the frame (elem, cnt) on parent, created when new; -2 when the stack would be too deep or memory
 * ran out. */
static int32_t node_new(scratch *sc, uint32_t elem, uint32_t cnt, int32_t parent) {
    uint32_t depth = parent < 0 ? 1 : sc->nd[parent].depth + 1;
    if (depth > MAX_STACK_DEPTH) return -2;
    if (sc->nn >= MAX_FRAMES || ((sc->nn + 1) * 2 > sc->nh_cap && !node_rehash(sc))) {
        sc->oom = true;
        return -2;
    }
    uint32_t h = node_hash(elem, cnt, parent) & (sc->nh_cap - 1);
    for (uint32_t e; (e = sc->nh[h]) != 0; h = (h + 1) & (sc->nh_cap - 1)) {
        const mnode *x = &sc->nd[e - 1];
        if (x->elem == elem && x->cnt == cnt && x->parent == parent) return (int32_t)(e - 1);
    }
    if (sc->nn == sc->capn) {
        uint32_t cap = sc->capn ? sc->capn * 2 : 1024;
        mnode *n = realloc(sc->nd, cap * sizeof *n);
        if (!n) {
            sc->oom = true;
            return -2;
        }
        sc->nd = n;
        sc->capn = cap;
    }
    sc->nd[sc->nn] = (mnode){elem, cnt, parent, depth};
    sc->nh[h] = sc->nn + 1;
    return (int32_t)sc->nn++;
}

static void top_push(scratch *sc, uint32_t id) {
    if (sc->nt >= MAX_TOPS) {
        sc->oom = true;
        return;
    }
    if (sc->nt == sc->capt) {
        uint32_t cap = sc->capt ? sc->capt * 2 : 1024;
        uint32_t *n = realloc(sc->tp, cap * sizeof *n);
        if (!n) {
            sc->oom = true;
            return;
        }
        sc->tp = n;
        sc->capt = cap;
    }
    sc->tp[sc->nt++] = id;
}

static inline bool has_byte(const uint8_t *set, uint8_t b) { return set[b >> 3] >> (b & 7) & 1; }

/* Matches byte b from position (elem, cnt) of a stack whose rest is `parent`; appends the resulting tops. */
static void step(const gmr_grammar *g, scratch *sc, uint32_t elem, uint32_t cnt, int32_t parent, uint8_t b,
                 int rdepth) {
    if (rdepth > MAX_STEP_DEPTH) return;
    for (;;) {
        const gmr_el *e = &g->el[elem];
        switch (e->kind) {
        case GK_BYTES:
            if (has_byte(g->cls[e->a], b)) {
                int32_t id = node_new(sc, elem + 1, 0, parent);
                if (id >= 0) top_push(sc, (uint32_t)id);
            }
            return;
        case GK_END:
            if (parent < 0) return;
            elem = sc->nd[parent].elem;
            cnt = sc->nd[parent].cnt;
            parent = sc->nd[parent].parent;
            continue;
        case GK_RULE: {
            int32_t ret = -3;   /* created on first use */
            for (uint32_t a = g->rule_alt[e->a]; a < g->rule_alt[e->a + 1]; a++) {
                if (!has_byte(g->alt_first[a], b) && !g->alt_null[a]) continue;
                if (ret == -3) ret = g->el[elem + 1].kind == GK_END ? parent : node_new(sc, elem + 1, 0, parent);
                if (ret == -2) return;
                step(g, sc, g->alt_el[a], 0, ret, b, rdepth + 1);
            }
            return;
        }
        default: { /* GK_REPEAT */
            uint32_t min = e->min, max = e->max, body = e->a;
            if (cnt < max) {
                uint32_t nc = cnt + 1;
                if (max == GMR_INF && nc > min) nc = min;   /* past min, unbounded: the count no longer matters */
                int32_t ret = -3;
                for (uint32_t a = g->rule_alt[body]; a < g->rule_alt[body + 1]; a++) {
                    if (!has_byte(g->alt_first[a], b) && !g->alt_null[a]) continue;
                    if (ret == -3) ret = node_new(sc, elem, nc, parent);
                    if (ret == -2) break;
                    step(g, sc, g->alt_el[a], 0, ret, b, rdepth + 1);
                }
            }
            if (cnt < min) return;
            elem++;
            cnt = 0;
            continue;
        }
        }
    }
}

/* Whether the stack with top node id can end here (derive the empty string to the bottom). */
static bool node_complete(const gmr_grammar *g, const scratch *sc, int32_t id) {
    while (id >= 0) {
        const mnode *n = &sc->nd[id];
        const gmr_el *e = &g->el[n->elem];
        bool nul = e->kind == GK_REPEAT ? (n->cnt >= e->min || g->rule_null[e->a]) && g->null_from[n->elem + 1]
                                        : g->null_from[n->elem];
        if (!nul) return false;
        id = n->parent;
    }
    return true;
}

/* Advances the tops tp[off .. off+n) by byte b; the new tops are appended (deduplicated, at most MAX_STACKS). */
static void advance(const gmr_grammar *g, scratch *sc, uint32_t off, uint32_t n, uint8_t b) {
    uint32_t start = sc->nt;
    for (uint32_t i = 0; i < n; i++) {
        const mnode *t = &sc->nd[sc->tp[off + i]];
        step(g, sc, t->elem, t->cnt, t->parent, b, 0);
    }
    uint32_t m = start;
    for (uint32_t i = start; i < sc->nt; i++) {
        const mnode *x = &sc->nd[sc->tp[i]];
        bool dup = false;
        for (uint32_t j = start; j < m && !dup; j++) {
            const mnode *y = &sc->nd[sc->tp[j]];
            dup = x->elem == y->elem && x->cnt == y->cnt && x->parent == y->parent;
        }
        if (!dup && m - start < MAX_STACKS) sc->tp[m++] = sc->tp[i];
    }
    sc->nt = m;
}

/* Empties the scratch; tables a large walk grew are freed rather than cleared. */
static void scratch_reset(scratch *sc) {
    sc->nn = sc->nt = sc->ns = 0;
    sc->oom = false;
    tab_reset(&sc->nh, &sc->nh_cap);
    tab_reset(&sc->sh, &sc->sh_cap);
    if (sc->tr_states > 64) {
        free(sc->tr);
        sc->tr = NULL;
        sc->tr_states = 0;
    } else if (sc->tr) {
        memset(sc->tr, 0, (size_t)sc->tr_states * 256 * sizeof *sc->tr);
    }
}

static uint32_t state_hash(const uint32_t *t, uint32_t n) {
    uint32_t h = n * 0x9E3779B1u;
    for (uint32_t i = 0; i < n; i++) h = (h ^ t[i]) * 0x85EBCA77u;
    return h ^ h >> 16;
}

static uint32_t state_hash_id(const scratch *sc, uint32_t id) {
    return state_hash(sc->tp + sc->s_off[id], sc->s_n[id]);
}

static bool state_rehash(scratch *sc) { return tab_rehash(sc, &sc->sh, &sc->sh_cap, 256, sc->ns, state_hash_id); }

/* The id of the state whose tops were just appended at tp[start .. start + n) (dropped again when the state
 * is known); UINT32_MAX when memory ran out. */
static uint32_t state_intern(scratch *sc, uint32_t start, uint32_t n) {
    if ((sc->ns + 1) * 2 > sc->sh_cap && !state_rehash(sc)) return sc->oom = true, UINT32_MAX;
    uint32_t h = state_hash(sc->tp + start, n) & (sc->sh_cap - 1);
    for (uint32_t e; (e = sc->sh[h]) != 0; h = (h + 1) & (sc->sh_cap - 1))
        if (sc->s_n[e - 1] == n && !memcmp(sc->tp + sc->s_off[e - 1], sc->tp + start, n * sizeof *sc->tp)) {
            sc->nt = start;
            return e - 1;
        }
    if (sc->ns == sc->cap_s) {
        uint32_t cap = sc->cap_s ? sc->cap_s * 2 : 256;
        uint32_t *a = realloc(sc->s_off, cap * sizeof *a);
        if (a) sc->s_off = a;
        uint32_t *b = a ? realloc(sc->s_n, cap * sizeof *b) : NULL;
        if (!b) return sc->oom = true, UINT32_MAX;
        sc->s_n = b;
        sc->cap_s = cap;
    }
    if (sc->ns >= sc->tr_states && sc->tr_states < MEMO_STATES) {   /* room for its transitions */
        uint32_t cap = sc->tr_states ? sc->tr_states * 2 : 16;
        uint32_t *t = realloc(sc->tr, (size_t)cap * 256 * sizeof *t);
        if (t) {
            memset(t + (size_t)sc->tr_states * 256, 0, (size_t)(cap - sc->tr_states) * 256 * sizeof *t);
            sc->tr = t;
            sc->tr_states = cap;
        }
    }
    sc->s_off[sc->ns] = start;
    sc->s_n[sc->ns] = n;
    sc->sh[h] = sc->ns + 1;
    return sc->ns++;
}

/* Loads the flattened state into the (emptied) scratch: its tops are tp[0 .. return value). */
static uint32_t load_state(gmr_matcher *m) {
    scratch *sc = &m->sc;
    scratch_reset(sc);
    uint32_t ns = m->st[0], p = 1;
    for (uint32_t s = 0; s < ns; s++) {
        uint32_t len = m->st[p++];
        int32_t parent = -1;
        for (uint32_t k = 0; k < len; k++, p += 2) parent = node_new(sc, m->st[p], m->st[p + 1], parent);
        if (parent >= 0) top_push(sc, (uint32_t)parent);
    }
    return sc->nt;
}

static int st_reserve(gmr_matcher *m, uint32_t n) {
    if (n <= m->cap_st) return 0;
    uint32_t cap = m->cap_st ? m->cap_st : 64;
    while (cap < n) cap *= 2;
    uint32_t *s = realloc(m->st, cap * sizeof *s);
    if (!s) return KVS_ERR_NOMEM;
    m->st = s;
    m->cap_st = cap;
    return 0;
}

/* Flattens the tops tp[off .. off+n) into m->st (bottom frame first). */
static int store_state(gmr_matcher *m, uint32_t off, uint32_t n) {
    scratch *sc = &m->sc;
    uint32_t need = 1;
    for (uint32_t i = 0; i < n; i++) need += 1 + 2 * sc->nd[sc->tp[off + i]].depth;
    if (st_reserve(m, need)) return KVS_ERR_NOMEM;
    uint32_t p = 1;
    m->complete = false;
    for (uint32_t i = 0; i < n; i++) {
        int32_t id = (int32_t)sc->tp[off + i];
        uint32_t d = sc->nd[id].depth;
        m->st[p] = d;
        for (uint32_t k = d; id >= 0; id = sc->nd[id].parent, k--) {
            m->st[p + 1 + 2 * (k - 1)] = sc->nd[id].elem;
            m->st[p + 2 + 2 * (k - 1)] = sc->nd[id].cnt;
        }
        if (node_complete(m->g, sc, (int32_t)sc->tp[off + i])) m->complete = true;
        p += 1 + 2 * d;
    }
    m->st[0] = n;
    m->n_st = p;
    return 0;
}

/* ---- matchers -------------------------------------------------------------------------------------------------- */

void gmr_matcher_reset(gmr_matcher *m) {
    if (!m) return;
    m->st[0] = 1;
    m->st[1] = 1;
    m->st[2] = 0;   /* element 0: RULE root */
    m->st[3] = 0;
    m->n_st = 4;
    m->complete = m->g->null_from[0];
    m->finished = false;
}

static int matcher_alloc(const gmr_grammar *g, const gmr_vocab *v, gmr_matcher **out) {
    gmr_matcher *m = calloc(1, sizeof *m);
    if (!m) return KVS_ERR_NOMEM;
    m->g = g;
    m->v = v;
    m->lv = malloc(((size_t)v->all.max_depth + 1) * sizeof *m->lv);
    if (!m->lv || st_reserve(m, 64)) {
        free(m->lv);
        free(m->st);
        free(m);
        return KVS_ERR_NOMEM;
    }
    *out = m;
    return 0;
}

int gmr_matcher_create(const gmr_grammar *g, const gmr_vocab *v, size_t cache_bytes, gmr_matcher **out) {
    if (!out) return KVS_ERR_INVALID;
    *out = NULL;
    if (!g || !v) return KVS_ERR_INVALID;
    gmr_matcher *m;
    int rc = matcher_alloc(g, v, &m);
    if (rc) return rc;
    gcache *c = calloc(1, sizeof *c);
    if (c) c->tab = calloc(1024, sizeof *c->tab);
    if (!c || !c->tab || pthread_mutex_init(&c->mu, NULL)) {
        if (c) free(c->tab);
        free(c);
        m->c = NULL;
        gmr_matcher_free(m);
        return KVS_ERR_NOMEM;
    }
    c->cap = 1024;
    c->refs = 1;
    c->limit = cache_bytes ? cache_bytes : (size_t)32 << 20;
    c->words = gmr_mask_words(v);
    m->c = c;
    gmr_matcher_reset(m);
    *out = m;
    return 0;
}

const gmr_vocab *gmr_matcher_vocab(const gmr_matcher *m) { return m ? m->v : NULL; }

int gmr_matcher_clone(const gmr_matcher *m, gmr_matcher **out) {
    if (!out) return KVS_ERR_INVALID;
    *out = NULL;
    if (!m) return KVS_ERR_INVALID;
    gmr_matcher *n;
    int rc = matcher_alloc(m->g, m->v, &n);
    if (rc) return rc;
    if (st_reserve(n, m->n_st)) {
        gmr_matcher_free(n);
        return KVS_ERR_NOMEM;
    }
    memcpy(n->st, m->st, m->n_st * sizeof *m->st);
    n->n_st = m->n_st;
    n->complete = m->complete;
    n->finished = m->finished;
    pthread_mutex_lock(&m->c->mu);
    m->c->refs++;
    pthread_mutex_unlock(&m->c->mu);
    n->c = m->c;
    *out = n;
    return 0;
}

void gmr_matcher_free(gmr_matcher *m) {
    if (!m) return;
    cache_unref(m->c);
    free(m->st);
    free(m->sc.nd);
    free(m->sc.nh);
    free(m->sc.tp);
    free(m->sc.s_off);
    free(m->sc.s_n);
    free(m->sc.sh);
    free(m->sc.tr);
    free(m->lv);
    free(m->key);
    free(m);
}

bool gmr_matcher_is_complete(const gmr_matcher *m) { return m && !m->finished && m->complete; }
bool gmr_matcher_is_finished(const gmr_matcher *m) { return m && m->finished; }

void gmr_matcher_cache_stats(const gmr_matcher *m, uint64_t *computed, uint64_t *hits) {
    pthread_mutex_lock(&m->c->mu);
    if (computed) *computed = m->c->computed;
    if (hits) *hits = m->c->hits;
    pthread_mutex_unlock(&m->c->mu);
}

/* Loads the state and advances it by bytes[0..n): the resulting tops are tp[*off .. *off + return value). */
static uint32_t run_bytes(gmr_matcher *m, const char *bytes, size_t n, uint32_t *off) {
    uint32_t cnt = load_state(m);
    *off = 0;
    for (size_t i = 0; i < n && cnt; i++) {
        uint32_t start = m->sc.nt;
        advance(m->g, &m->sc, *off, cnt, (uint8_t)bytes[i]);
        *off = start;
        cnt = m->sc.nt - start;
    }
    return cnt;
}

int gmr_matcher_accept_bytes(gmr_matcher *m, const char *bytes, size_t n) {
    if (!m || (n && !bytes)) return KVS_ERR_INVALID;
    if (m->finished) return n ? KVS_ERR_INVALID : 0;
    if (!n) return 0;
    uint32_t off, cnt = run_bytes(m, bytes, n, &off);
    if (m->sc.oom) return KVS_ERR_NOMEM;
    if (!cnt) return KVS_ERR_INVALID;
    return store_state(m, off, cnt);
}

int gmr_matcher_accept_token(gmr_matcher *m, int32_t token) {
    if (!m || token < 0 || token >= m->v->n_vocab || m->finished) return KVS_ERR_INVALID;
    const gmr_vocab *v = m->v;
    if (v->flags[token] & GMR_TOKEN_EOG) {
        if (!m->complete) return KVS_ERR_INVALID;
        m->finished = true;
        return 0;
    }
    uint32_t len = v->off[token + 1] - v->off[token];
    if ((v->flags[token] & GMR_TOKEN_SPECIAL) || !len) return KVS_ERR_INVALID;
    return gmr_matcher_accept_bytes(m, v->bytes + v->off[token], len);
}

bool gmr_matcher_allows(gmr_matcher *m, int32_t token) {
    if (!m || token < 0 || token >= m->v->n_vocab || m->finished) return false;
    const gmr_vocab *v = m->v;
    if (v->flags[token] & GMR_TOKEN_EOG) return m->complete;
    uint32_t len = v->off[token + 1] - v->off[token];
    if ((v->flags[token] & GMR_TOKEN_SPECIAL) || !len) return false;
    uint32_t off;
    return run_bytes(m, v->bytes + v->off[token], len, &off) > 0 && !m->sc.oom;
}

/* ORs into mask the tokens of trie T that the current state accepts, by a preorder walk. */
static int walk_trie(gmr_matcher *m, const trie *T, uint32_t *mask) {
    const gmr_vocab *v = m->v;
    scratch *sc = &m->sc;
    uint32_t n0 = load_state(m);
    uint32_t *lv = m->lv;   /* the state at each depth */
    lv[0] = state_intern(sc, 0, n0);
    if (lv[0] == UINT32_MAX) return KVS_ERR_NOMEM;
    for (uint32_t i = 0; i < T->n_nodes;) {
        uint32_t d = T->ndepth[i], ps = lv[d - 1], ns;
        uint8_t b = T->nbyte[i];
        bool memo = ps < sc->tr_states;
        uint32_t known = memo ? sc->tr[(size_t)ps * 256 + b] : 0;
        if (known) {
            ns = known == 1 ? UINT32_MAX : known - 2;
        } else {
            uint32_t start = sc->nt;
            advance(m->g, sc, sc->s_off[ps], sc->s_n[ps], b);
            if (sc->oom) return KVS_ERR_NOMEM;
            ns = sc->nt > start ? state_intern(sc, start, sc->nt - start) : UINT32_MAX;
            if (sc->oom) return KVS_ERR_NOMEM;
            if (memo) sc->tr[(size_t)ps * 256 + b] = ns == UINT32_MAX ? 1 : ns + 2;   /* (tr may have moved) */
        }
        if (ns == UINT32_MAX) {
            i = T->nskip[i];
            continue;
        }
        for (int32_t t = T->ntok[i]; t >= 0; t = v->tok_next[t]) mask[t >> 5] |= 1u << (t & 31);
        lv[d] = ns;
        i++;
    }
    return sc->oom ? KVS_ERR_NOMEM : 0;
}

/* The cache key of the state: the flattened state with the count of every repetition frame replaced by what a
 * token of at most LONG_TOKEN bytes can observe: the iterations still needed and still allowed, each clamped at
 * LONG_TOKEN + 1 (every iteration takes at least one byte). Returns whether anything was clamped: the cached
 * mask is then exact for short tokens only. */
static bool make_key(gmr_matcher *m) {
    const gmr_grammar *g = m->g;
    bool clamped = false;
    memcpy(m->key, m->st, m->n_st * sizeof *m->key);
    uint32_t ns = m->key[0], p = 1;
    for (uint32_t s = 0; s < ns; s++) {
        uint32_t len = m->key[p++];
        for (uint32_t k = 0; k < len; k++, p += 2) {
            const gmr_el *e = &g->el[m->key[p]];
            if (e->kind != GK_REPEAT) continue;
            uint32_t cnt = m->key[p + 1];
            uint32_t need = cnt < e->min ? e->min - cnt : 0, rem = e->max == GMR_INF ? 0xFFFFu : e->max - cnt;
            if (need > LONG_TOKEN) need = LONG_TOKEN + 1, clamped = true;
            if (rem != 0xFFFFu && rem > LONG_TOKEN) rem = LONG_TOKEN + 1, clamped = true;
            m->key[p + 1] = need << 16 | rem;
        }
    }
    return clamped;
}

int gmr_matcher_fill_mask(gmr_matcher *m, uint32_t *mask, size_t n_words) {
    if (!m || !mask || n_words < gmr_mask_words(m->v)) return KVS_ERR_INVALID;
    const gmr_vocab *v = m->v;
    memset(mask, 0, n_words * sizeof *mask);
    if (m->finished) return 0;
    if (m->n_st > m->cap_key) {
        uint32_t *k = realloc(m->key, m->cap_st * sizeof *k);
        if (!k) return KVS_ERR_NOMEM;
        m->key = k;
        m->cap_key = m->cap_st;
    }
    bool clamped = make_key(m);
    uint64_t h = key_hash(m->key, m->n_st);
    int rc = 0;
    if (cache_get(m->c, m->key, m->n_st, h, mask)) {
        if (clamped) rc = walk_trie(m, &v->lng, mask);   /* the long tokens against the exact counts */
    } else {
        rc = walk_trie(m, &v->all, mask);
        if (!rc && m->complete)
            for (int32_t k = 0; k < v->n_eog; k++) mask[v->eog[k] >> 5] |= 1u << (v->eog[k] & 31);
        if (!rc && clamped) {   /* cache the part that holds for every count with this key */
            for (int32_t k = 0; k < v->n_long; k++) mask[v->long_tok[k] >> 5] &= ~(1u << (v->long_tok[k] & 31));
            cache_put(m->c, m->key, m->n_st, h, mask);
            rc = walk_trie(m, &v->lng, mask);
        } else if (!rc) {
            cache_put(m->c, m->key, m->n_st, h, mask);
        }
    }
    if (rc) memset(mask, 0, n_words * sizeof *mask);
    return rc;
}
