/*
 * kv_group.c: the public calls of kv_cache.h that change sequences, over the main pool and, when the cache has
 * one, its sliding-window group (a second pool for the sliding layers, see "Sliding-window group" in kv_cache.h).
 *
 * The two pools hold the same sequences: ids are allocated lowest-free in both, so they agree as long as every
 * call goes through this file; lengths agree because every change is applied to both. A call changes the main
 * pool first and then the group; when the group's part fails, the main pool's part is undone (a forward rolled
 * back, a copied or attached prefix removed again), so each call stays all or nothing over the pair. The group's
 * blocks are released as its sequences leave the window, which is the memory bound; the main pool keeps every
 * position, which is what the global layers attend to.
 */
#include "cache/kvc_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The sliding group's default size (kv_cache.h, swa_blocks), or -1 when it does not fit a slot id. */
static int64_t group_default_blocks(const kvc_params *p, int32_t bs) {
    int64_t per_seq = ceil_div(p->sliding_window, bs) + 4;
    int64_t n = (int64_t)p->max_seqs * per_seq + ceil_div(p->max_batch_tokens, bs);
    return n > INT32_MAX / bs ? -1 : n;
}

int kvc_create(const kvc_params *params, kvc_cache **out) {
    if (!params || !out) return KVC_ERR_INVALID;
    *out = NULL;
    if (params->swa_layers < 0 || params->swa_blocks < 0) return KVC_ERR_INVALID;
    if (params->swa_layers == 0) return kvc_pool_create(params, out);
    if (params->sliding_window <= 0 || params->max_seqs < 1 || params->max_batch_tokens < 1 ||
        params->block_size < 0)
        return KVC_ERR_INVALID;
    int32_t bs = params->block_size ? params->block_size : 16;
    kvc_params mp = *params, gp = *params;
    mp.sliding_window = 0; /* the global layers keep everything */
    mp.swa_layers = gp.swa_layers = 0;
    mp.swa_blocks = gp.swa_blocks = 0;
    gp.n_layer = params->swa_layers;
    gp.mem_bytes = 0;
    int64_t nb = params->swa_blocks > 0 ? params->swa_blocks : group_default_blocks(params, bs);
    if (nb < 1) return KVC_ERR_INVALID;
    gp.n_blocks = (int32_t)nb;
    kvc_cache *c = NULL;
    int rc = kvc_pool_create(&mp, &c);
    if (rc != KVC_OK) return rc;
    rc = kvc_pool_create(&gp, &c->swa);
    if (rc == KVC_OK) {
        c->swa_slots = malloc((size_t)params->max_batch_tokens * sizeof *c->swa_slots);
        if (!c->swa_slots) rc = KVC_ERR_NOMEM;
    }
    if (rc != KVC_OK) {
        kvc_free(c);
        return rc;
    }
    *out = c;
    return KVC_OK;
}

void kvc_free(kvc_cache *c) {
    if (!c) return;
    kvc_pool_free(c->swa);
    free(c->swa_slots);
    kvc_pool_free(c);
}

const kvc_cache *kvc_swa_group(const kvc_cache *c) { return c ? c->swa : NULL; }

const int32_t *kvc_swa_slots(const kvc_cache *c) {
    return c && c->swa && c->swa_slots_valid ? c->swa_slots : NULL;
}

int kvc_seq_alloc(kvc_cache *c, int32_t *seq_out) {
    int rc = kvc_pool_seq_alloc(c, seq_out);
    if (rc != KVC_OK || !c->swa) return rc;
    int32_t other;
    rc = kvc_pool_seq_alloc(c->swa, &other);
    if (rc == KVC_OK && other == *seq_out) return KVC_OK;
    /* the pools disagree (cannot happen while every call comes through here): refuse, change nothing */
    if (rc == KVC_OK) kvc_pool_seq_free(c->swa, other);
    kvc_pool_seq_free(c, *seq_out);
    return KVC_ERR_STATE;
}

int kvc_seq_free(kvc_cache *c, int32_t seq) {
    int rc = kvc_pool_seq_free(c, seq);
    if (rc == KVC_OK && c->swa) kvc_pool_seq_free(c->swa, seq);
    return rc;
}

int kvc_start_forward(kvc_cache *c, const kvc_entry *entries, int32_t n, int32_t *slots_out) {
    int rc = kvc_pool_start_forward(c, entries, n, slots_out);
    if (rc != KVC_OK || !c->swa) return rc;
    rc = kvc_pool_start_forward(c->swa, entries, n, c->swa_slots);
    if (rc != KVC_OK) {
        (void)kvc_pool_finish_forward(c, false);
        return rc;
    }
    c->swa_slots_valid = true;
    return KVC_OK;
}

int kvc_finish_forward(kvc_cache *c, bool ok) {
    int rc = kvc_pool_finish_forward(c, ok);
    if (rc == KVC_OK && c->swa) {
        kvc_pool_finish_forward(c->swa, ok);
        c->swa_slots_valid = false;
    }
    return rc;
}

int kvc_copy_prefix(kvc_cache *c, int32_t src, int32_t dst, int32_t len) {
    int rc = kvc_pool_copy_prefix(c, src, dst, len);
    if (rc != KVC_OK || !c->swa) return rc;
    rc = kvc_pool_copy_prefix(c->swa, src, dst, len);
    if (rc != KVC_OK) kvc_pool_remove(c, dst, 0, INT32_MAX, NULL); /* dst was empty: empty again */
    return rc;
}

int kvc_attach_prefix(kvc_cache *c, int32_t seq, const int32_t *tokens, int32_t n, int32_t *n_cached) {
    int rc = kvc_pool_attach_prefix(c, seq, tokens, n, n_cached);
    if (rc != KVC_OK || !c->swa) return rc;
    /* The group may have evicted blocks of the chain the main pool still has: keep what both hold. */
    int32_t got = 0;
    rc = kvc_pool_attach_prefix(c->swa, seq, tokens, *n_cached, &got);
    if (rc != KVC_OK) got = 0;
    if (got < *n_cached) {
        (void)kvc_pool_remove(c, seq, got, INT32_MAX, NULL);
        c->prefix_hit_tokens -= (uint64_t)(*n_cached - got);
        *n_cached = got;
    }
    return rc;
}

int kvc_prefix_match(const kvc_cache *c, const int32_t *tokens, int32_t n, int32_t *n_matched) {
    int rc = kvc_pool_prefix_match(c, tokens, n, n_matched);
    if (rc != KVC_OK || !c->swa) return rc;
    return kvc_pool_prefix_match(c->swa, tokens, *n_matched, n_matched);
}

/* Whether the group's sequence could go on at new_len after a move that keeps positions before begin in place
 * (every block from begin's on is held, kvc_pool_can_move): the window before new_len must not reach a position
 * before begin that the group released. A removal that would leave the sequence stuck is refused instead. */
static bool group_resumes_after(const kvc_cache *g, int32_t seq, int32_t new_len, int32_t begin) {
    int32_t lo = new_len > g->p.sliding_window ? new_len - g->p.sliding_window : 0;
    return lo >= begin || g->seqs[seq].table[lo / g->lay.block_size] >= 0; /* released blocks lead the table */
}

int kvc_remove(kvc_cache *c, int32_t seq, int32_t begin, int32_t end, kvc_shift *shift) {
    if (!c || !c->swa) return kvc_pool_remove(c, seq, begin, end, shift);
    if (!kvc_seq_is_live(c, seq)) return KVC_ERR_BAD_SEQ;
    if (c->pending) return KVC_ERR_STATE;
    if (begin < 0 || end < begin) return KVC_ERR_INVALID;
    int32_t len = kvc_seq_len(c, seq);
    if (begin < len && end > begin && end < len &&
        (!kvc_pool_can_move(c, seq, begin) || !kvc_pool_can_move(c->swa, seq, begin) ||
         !group_resumes_after(c->swa, seq, len - (end - begin), begin))) {
        if (shift) *shift = (kvc_shift){begin, 0, 0};
        return KVC_ERR_NOT_SUPPORTED;
    }
    int rc = kvc_pool_remove(c, seq, begin, end, shift);
    if (rc != KVC_OK) { /* a failed move left the main pool truncated to begin: so is the group */
        (void)kvc_pool_remove(c->swa, seq, begin, INT32_MAX, NULL);
        return rc;
    }
    rc = kvc_pool_remove(c->swa, seq, begin, end, NULL);
    if (rc != KVC_OK) {
        (void)kvc_pool_remove(c, seq, begin, INT32_MAX, NULL);
        if (shift) *shift = (kvc_shift){begin, 0, 0};
    }
    return rc;
}

bool kvc_can_resume(const kvc_cache *c, int32_t seq, int32_t pos) {
    return kvc_pool_can_resume(c, seq, pos) && (!c->swa || kvc_pool_can_resume(c->swa, seq, pos));
}

int kvc_reset_prefix_cache(kvc_cache *c) {
    int rc = kvc_pool_reset_prefix_cache(c);
    if (rc != KVC_OK || !c->swa) return rc;
    return kvc_pool_reset_prefix_cache(c->swa);
}

void kvc_get_stats(const kvc_cache *c, kvc_stats *o) {
    kvc_pool_get_stats(c, o);
    if (!c || !o || !c->swa) return;
    kvc_stats g;
    kvc_pool_get_stats(c->swa, &g);
    o->swa_blocks_total = g.blocks_total;
    o->swa_blocks_used = g.blocks_used;
    o->bytes_total += g.bytes_total;
}

int kvc_check(const kvc_cache *c, char *msg, size_t msg_len) {
    int rc = kvc_pool_check(c, msg, msg_len);
    if (rc != KVC_OK || !c->swa) return rc;
    char sub[200] = "";
    rc = kvc_pool_check(c->swa, sub, sizeof sub);
    if (rc != KVC_OK) {
        if (msg && msg_len > 0) snprintf(msg, msg_len, "sliding group: %s", sub);
        return rc;
    }
    if (c->pending != c->swa->pending) {
        if (msg && msg_len > 0) snprintf(msg, msg_len, "a forward is pending in one pool only");
        return KVC_ERR_STATE;
    }
    for (int32_t s = 0; s < c->p.max_seqs; s++) {
        const kvc_seq *a = &c->seqs[s], *b = &c->swa->seqs[s];
        if (a->live != b->live || a->len != b->len || a->pending != b->pending) {
            if (msg && msg_len > 0)
                snprintf(msg, msg_len, "seq %d: main pool (live %d, len %d) and sliding group (live %d, len %d) "
                         "differ", s, a->live, a->len, b->live, b->len);
            return KVC_ERR_STATE;
        }
    }
    return KVC_OK;
}
