/*
 * kv_events.c: KV-cache events in vLLM's wire format (see obs.h).
 *
 * Collector (the scheduler thread): cache events go into a srv_kv_events_batch (merged: consecutive STORED blocks of
 * one chain share one BlockStored, consecutive REMOVED share one BlockRemoved). At the end of a step the batch is
 * encoded and the bytes are pushed on a bounded queue (a mutex held for a pointer swap only), and one byte on a
 * pipe wakes the publisher thread. Publisher thread: polls the pipe and the replay ROUTER socket; sends queued
 * batches on the PUB socket and keeps the last buffer_steps of them in a ring for replay.
 */
#include "server/obs/obs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <msgpack.h>
#include <uv.h>
#include <zmq.h>

/* ---- configuration ---------------------------------------------------------------------------------------- */
void srv_kv_events_config_default(srv_kv_events_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->publisher, sizeof c->publisher, "null");
    snprintf(c->endpoint, sizeof c->endpoint, "tcp://*:5557");
    c->buffer_steps = 10000;
    c->hwm = 100000;
    c->max_queue_size = 100000;
    c->max_queue_bytes = 64 << 20;
    c->buffer_bytes = 256 << 20;
}

bool srv_kv_events_config_active(const srv_kv_events_config *c) {
    return c && c->enable && !strcmp(c->publisher, "zmq");
}

static int cfg_str(const cJSON *it, char *dst, size_t cap, bool nullable, char *err, size_t el) {
    if (nullable && cJSON_IsNull(it)) {
        dst[0] = 0;
        return KVS_OK;
    }
    if (!cJSON_IsString(it)) {
        snprintf(err, el, "kv_events_config: '%s' must be a string%s", it->string, nullable ? " or null" : "");
        return KVS_ERR_INVALID;
    }
    if (strlen(it->valuestring) >= cap) {
        snprintf(err, el, "kv_events_config: '%s' is too long (at most %zu bytes)", it->string, cap - 1);
        return KVS_ERR_INVALID;
    }
    snprintf(dst, cap, "%s", it->valuestring);
    return KVS_OK;
}

static int cfg_int(const cJSON *it, int32_t *dst, double lo, double hi, char *err, size_t el) {
    if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int64_t)it->valuedouble || it->valuedouble < lo ||
        it->valuedouble > hi) {
        snprintf(err, el, "kv_events_config: '%s' must be an integer in [%.0f, %.0f]", it->string, lo, hi);
        return KVS_ERR_INVALID;
    }
    *dst = (int32_t)it->valuedouble;
    return KVS_OK;
}

int srv_kv_events_config_parse(const char *json, srv_kv_events_config *out, char *err, size_t el) {
    srv_kv_events_config c;
    srv_kv_events_config_default(&c);
    if (err && el) err[0] = 0;
    if (!json || !*json) {
        *out = c;
        return KVS_OK;
    }
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        snprintf(err, el, "kv_events_config: must be a JSON object");
        cJSON_Delete(root);
        return KVS_ERR_INVALID;
    }
    int rc = KVS_OK;
    bool publisher_set = false;
    for (const cJSON *it = root->child; it && rc == KVS_OK; it = it->next) {
        const char *k = it->string;
        if (!strcmp(k, "enable_kv_cache_events")) {
            if (!cJSON_IsBool(it)) {
                snprintf(err, el, "kv_events_config: 'enable_kv_cache_events' must be true or false");
                rc = KVS_ERR_INVALID;
            } else {
                c.enable = cJSON_IsTrue(it);
            }
        } else if (!strcmp(k, "publisher")) {
            publisher_set = !cJSON_IsNull(it);
            rc = cfg_str(it, c.publisher, sizeof c.publisher, true, err, el);
            if (rc == KVS_OK && publisher_set && strcmp(c.publisher, "zmq") && strcmp(c.publisher, "null")) {
                snprintf(err, el, "kv_events_config: 'publisher' must be \"zmq\" or \"null\"");
                rc = KVS_ERR_INVALID;
            }
        } else if (!strcmp(k, "endpoint")) {
            rc = cfg_str(it, c.endpoint, sizeof c.endpoint, false, err, el);
        } else if (!strcmp(k, "replay_endpoint")) {
            rc = cfg_str(it, c.replay_endpoint, sizeof c.replay_endpoint, true, err, el);
        } else if (!strcmp(k, "topic")) {
            rc = cfg_str(it, c.topic, sizeof c.topic, false, err, el);
        } else if (!strcmp(k, "buffer_steps")) {
            rc = cfg_int(it, &c.buffer_steps, 1, 1e7, err, el);
        } else if (!strcmp(k, "hwm")) {
            rc = cfg_int(it, &c.hwm, 0, 1e9, err, el);
        } else if (!strcmp(k, "max_queue_size")) {
            rc = cfg_int(it, &c.max_queue_size, 1, 1e9, err, el);
        } else if (!strcmp(k, "max_queue_bytes")) {
            rc = cfg_int(it, &c.max_queue_bytes, 1, 2147483647.0, err, el);
        } else if (!strcmp(k, "buffer_bytes")) {
            rc = cfg_int(it, &c.buffer_bytes, 1, 2147483647.0, err, el);
        } else {
            snprintf(err, el, "kv_events_config: unknown key '%s'", k);
            rc = KVS_ERR_INVALID;
        }
    }
    cJSON_Delete(root);
    if (rc != KVS_OK) return rc;
    if (!publisher_set) snprintf(c.publisher, sizeof c.publisher, "%s", c.enable ? "zmq" : "null");
    if (srv_kv_events_config_active(&c) && !c.endpoint[0]) {
        snprintf(err, el, "kv_events_config: 'endpoint' must not be empty");
        return KVS_ERR_INVALID;
    }
    *out = c;
    return KVS_OK;
}

cJSON *srv_kv_events_config_to_json(const srv_kv_events_config *c) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    bool ok = cJSON_AddBoolToObject(o, "enable_kv_cache_events", c->enable) &&
              cJSON_AddStringToObject(o, "publisher", c->publisher) &&
              cJSON_AddStringToObject(o, "endpoint", c->endpoint) &&
              (c->replay_endpoint[0] ? cJSON_AddStringToObject(o, "replay_endpoint", c->replay_endpoint)
                                     : cJSON_AddNullToObject(o, "replay_endpoint")) &&
              cJSON_AddNumberToObject(o, "buffer_steps", c->buffer_steps) &&
              cJSON_AddNumberToObject(o, "hwm", c->hwm) &&
              cJSON_AddNumberToObject(o, "max_queue_size", c->max_queue_size) &&
              cJSON_AddNumberToObject(o, "max_queue_bytes", c->max_queue_bytes) &&
              cJSON_AddNumberToObject(o, "buffer_bytes", c->buffer_bytes) &&
              cJSON_AddStringToObject(o, "topic", c->topic);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* ---- batches ---------------------------------------------------------------------------------------------- */
typedef struct kvev_item {
    kvc_event_kind kind;
    int32_t first_hash, n_hash; /* into hashes */
    int32_t first_tok, n_tok;   /* into tokens (STORED) */
    bool has_parent;
    uint64_t parent;
    int32_t block_size;
    srv_kv_events_medium medium;
} kvev_item;

struct srv_kv_events_batch {
    kvs_buf items, hashes, tokens; /* arrays of kvev_item, uint64_t, int32_t */
};

int srv_kv_events_batch_create(srv_kv_events_batch **out) {
    if (!out) return KVS_ERR_INVALID;
    *out = calloc(1, sizeof **out);
    return *out ? KVS_OK : KVS_ERR_NOMEM;
}

void srv_kv_events_batch_free(srv_kv_events_batch *b) {
    if (!b) return;
    kvs_buf_free(&b->items);
    kvs_buf_free(&b->hashes);
    kvs_buf_free(&b->tokens);
    free(b);
}

void srv_kv_events_batch_clear(srv_kv_events_batch *b) {
    if (!b) return;
    kvs_buf_clear(&b->items);
    kvs_buf_clear(&b->hashes);
    kvs_buf_clear(&b->tokens);
}

int32_t srv_kv_events_batch_len(const srv_kv_events_batch *b) {
    return b ? (int32_t)(b->items.len / sizeof(kvev_item)) : 0;
}

static kvev_item *batch_item(const srv_kv_events_batch *b, int32_t i) { return (kvev_item *)b->items.data + i; }
static const uint64_t *batch_hashes(const srv_kv_events_batch *b) {
    return (const uint64_t *)(const void *)b->hashes.data;
}

static const char *medium_name(srv_kv_events_medium m) {
    return m == SRV_KV_EVENTS_DISK ? "DISK" : m == SRV_KV_EVENTS_HOST ? "CPU" : "GPU";
}

int srv_kv_events_batch_add(srv_kv_events_batch *b, const kvc_event *ev) {
    return srv_kv_events_batch_add_medium(b, ev, SRV_KV_EVENTS_POOL);
}

int srv_kv_events_batch_add_medium(srv_kv_events_batch *b, const kvc_event *ev, srv_kv_events_medium medium) {
    if (!b || !ev || (medium != SRV_KV_EVENTS_POOL && medium != SRV_KV_EVENTS_DISK &&
                          medium != SRV_KV_EVENTS_HOST))
        return KVS_ERR_INVALID;
    if (b->items.oom || b->hashes.oom || b->tokens.oom) return KVS_ERR_NOMEM;
    int32_t n = srv_kv_events_batch_len(b);
    int32_t n_hash = (int32_t)(b->hashes.len / sizeof(uint64_t));
    kvev_item *last = n > 0 ? batch_item(b, n - 1) : NULL;
    switch (ev->kind) {
    case KVC_EVENT_STORED: {
        if (ev->block_size < 1 || !ev->tokens) return KVS_ERR_INVALID;
        bool extend = last && last->kind == KVC_EVENT_STORED && last->medium == medium && ev->has_parent &&
                      last->block_size == ev->block_size && batch_hashes(b)[n_hash - 1] == ev->parent_hash &&
                      last->first_hash + last->n_hash == n_hash;
        if (kvs_buf_append(&b->hashes, &ev->hash, sizeof ev->hash) ||
            kvs_buf_append(&b->tokens, ev->tokens, (size_t)ev->block_size * sizeof(int32_t)))
            return KVS_ERR_NOMEM;
        if (extend) {
            last->n_hash++;
            last->n_tok += ev->block_size;
            return KVS_OK;
        }
        kvev_item it = {KVC_EVENT_STORED, n_hash, 1,
                        (int32_t)(b->tokens.len / sizeof(int32_t)) - ev->block_size, ev->block_size,
                        ev->has_parent, ev->has_parent ? ev->parent_hash : 0, ev->block_size, medium};
        return kvs_buf_append(&b->items, &it, sizeof it) ? KVS_ERR_NOMEM : KVS_OK;
    }
    case KVC_EVENT_REMOVED: {
        if (kvs_buf_append(&b->hashes, &ev->hash, sizeof ev->hash)) return KVS_ERR_NOMEM;
        if (last && last->kind == KVC_EVENT_REMOVED && last->medium == medium &&
            last->first_hash + last->n_hash == n_hash) {
            last->n_hash++;
            return KVS_OK;
        }
        kvev_item it = {KVC_EVENT_REMOVED, n_hash, 1, 0, 0, false, 0, 0, medium};
        return kvs_buf_append(&b->items, &it, sizeof it) ? KVS_ERR_NOMEM : KVS_OK;
    }
    case KVC_EVENT_CLEARED: {
        if (medium != SRV_KV_EVENTS_POOL) return KVS_ERR_INVALID;
        kvev_item it = {KVC_EVENT_CLEARED, 0, 0, 0, 0, false, 0, 0, medium};
        return kvs_buf_append(&b->items, &it, sizeof it) ? KVS_ERR_NOMEM : KVS_OK;
    }
    default: return KVS_ERR_INVALID;
    }
}

static int pack_write(void *data, const char *buf, size_t len) {
    return kvs_buf_append(data, buf, len) == KVS_OK ? 0 : -1;
}

static int pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    return msgpack_pack_str(pk, n) | msgpack_pack_str_body(pk, s, n);
}

static int pack_hashes(msgpack_packer *pk, const uint64_t *h, int32_t n) {
    int r = msgpack_pack_array(pk, (size_t)n);
    for (int32_t i = 0; i < n; i++) r |= msgpack_pack_fix_uint64(pk, h[i]);
    return r;
}

int srv_kv_events_batch_encode(const srv_kv_events_batch *b, double ts, int32_t dp_rank, kvs_buf *out) {
    if (!b || !out) return KVS_ERR_INVALID;
    if (b->items.oom || b->hashes.oom || b->tokens.oom) return KVS_ERR_NOMEM;
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, pack_write);
    int32_t n = srv_kv_events_batch_len(b);
    const uint64_t *hashes = batch_hashes(b);
    const int32_t *tokens = (const int32_t *)(const void *)b->tokens.data;
    int r = msgpack_pack_array(&pk, 3) | msgpack_pack_double(&pk, ts) | msgpack_pack_array(&pk, (size_t)n);
    for (int32_t i = 0; i < n && r == 0; i++) {
        const kvev_item *it = batch_item(b, i);
        switch (it->kind) {
        case KVC_EVENT_STORED:
            r |= msgpack_pack_array(&pk, 8) | pack_str(&pk, "BlockStored") |
                 pack_hashes(&pk, hashes + it->first_hash, it->n_hash);
            r |= it->has_parent ? msgpack_pack_fix_uint64(&pk, it->parent) : msgpack_pack_nil(&pk);
            r |= msgpack_pack_array(&pk, (size_t)it->n_tok);
            for (int32_t t = 0; t < it->n_tok; t++) r |= msgpack_pack_int32(&pk, tokens[it->first_tok + t]);
            /* block_size, lora_id nil, medium ("GPU": the pool; "DISK": the disk tier), lora_name nil: every field
             * is written (no defaults), and array-form decoders (llm-d's) require exactly these 8 elements */
            r |= msgpack_pack_int32(&pk, it->block_size) | msgpack_pack_nil(&pk) |
                 pack_str(&pk, medium_name(it->medium)) | msgpack_pack_nil(&pk);
            break;
        case KVC_EVENT_REMOVED:
            r |= msgpack_pack_array(&pk, 3) | pack_str(&pk, "BlockRemoved") |
                 pack_hashes(&pk, hashes + it->first_hash, it->n_hash) | pack_str(&pk, medium_name(it->medium));
            break;
        default:
            r |= msgpack_pack_array(&pk, 1) | pack_str(&pk, "AllBlocksCleared");
            break;
        }
    }
    r |= msgpack_pack_int32(&pk, dp_rank);
    return r == 0 && !out->oom ? KVS_OK : KVS_ERR_NOMEM;
}

/* ---- the publisher ------------------------------------------------------------------------------------------ */
typedef struct kvev_msg {
    struct kvev_msg *next;
    uint64_t seq;
    size_t len;
    char *data;
} kvev_msg;

struct srv_kv_events {
    srv_kv_events_config cfg;
    /* collector thread */
    srv_kv_events_batch *batch;
    bool batch_lost;         /* an event could not be recorded: the batch is dropped at step end */
    uint64_t next_seq;
    kvs_buf enc;
    /* queue: collector -> publisher */
    uv_mutex_t mu;
    bool mu_ok;
    kvev_msg *q_head, *q_tail;
    int32_t q_len;
    size_t q_bytes;          /* bytes of the queued batches (max_queue_bytes) */
    bool stop;
    int wake[2];             /* pipe: [0] read by the publisher, [1] written by the collector */
    /* publisher thread */
    uv_thread_t thread;
    bool thread_started;
    void *zctx, *pub, *replay;
    kvev_msg **ring;         /* [buffer_steps] oldest at ring_head */
    int32_t ring_head, ring_len;
    size_t ring_bytes;       /* bytes of the batches in the ring (buffer_bytes) */
    char endpoint[512];
    /* stats */
    _Atomic uint64_t queued, published, dropped, events, replays;
    _Atomic uint64_t queue_bytes, buffer_bytes_now;
};

static void msg_free(kvev_msg *m) {
    if (!m) return;
    free(m->data);
    free(m);
}

static int send_frame(void *sock, const void *data, size_t len, int flags) {
    return zmq_send(sock, data, len, flags) < 0 ? -1 : 0;
}

static void be64(uint8_t out[8], uint64_t v) {
    for (int i = 7; i >= 0; i--, v >>= 8) out[i] = (uint8_t)v;
}

static void ring_pop_oldest(srv_kv_events *p) {
    kvev_msg *o = p->ring[p->ring_head];
    p->ring_bytes -= o->len;
    msg_free(o);
    p->ring[p->ring_head] = NULL;
    p->ring_head = (p->ring_head + 1) % p->cfg.buffer_steps;
    p->ring_len--;
}

/* Keeps m for replay within buffer_steps batches and buffer_bytes bytes (the oldest leave first; a batch larger
 * than buffer_bytes is not kept). Takes m. */
static void ring_push(srv_kv_events *p, kvev_msg *m) {
    int32_t cap = p->cfg.buffer_steps;
    size_t max_bytes = (size_t)p->cfg.buffer_bytes;
    if (m->len > max_bytes) {
        msg_free(m);
        return;
    }
    while (p->ring_len > 0 && (p->ring_len == cap || p->ring_bytes + m->len > max_bytes)) ring_pop_oldest(p);
    p->ring[(p->ring_head + p->ring_len) % cap] = m;
    p->ring_len++;
    p->ring_bytes += m->len;
    atomic_store_explicit(&p->buffer_bytes_now, p->ring_bytes, memory_order_relaxed);
}

/* Answers every replay request waiting on the ROUTER socket. */
static void serve_replay(srv_kv_events *p) {
    for (;;) {
        zmq_msg_t part[3];
        int n = 0;
        bool more = true;
        while (more) {
            zmq_msg_t *m = &part[n < 3 ? n : 2];
            if (n >= 3) zmq_msg_close(m); /* extra frames: keep only the first three */
            zmq_msg_init(m);
            if (zmq_msg_recv(m, p->replay, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(m);
                if (n == 0) return; /* nothing waiting */
                break;              /* cannot happen: multipart messages arrive whole */
            }
            more = zmq_msg_more(m);
            n++;
        }
        int kept = n < 3 ? n : 3;
        if (n == 3 && zmq_msg_size(&part[1]) == 0 && zmq_msg_size(&part[2]) == 8) {
            const uint8_t *s = zmq_msg_data(&part[2]);
            uint64_t start = 0;
            for (int i = 0; i < 8; i++) start = start << 8 | s[i];
            const void *id = zmq_msg_data(&part[0]);
            size_t id_len = zmq_msg_size(&part[0]);
            for (int32_t i = 0; i < p->ring_len; i++) {
                const kvev_msg *m = p->ring[(p->ring_head + i) % p->cfg.buffer_steps];
                if (m->seq < start) continue;
                uint8_t seq[8];
                be64(seq, m->seq);
                if (send_frame(p->replay, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) ||
                    send_frame(p->replay, "", 0, ZMQ_SNDMORE) || send_frame(p->replay, seq, 8, ZMQ_SNDMORE) ||
                    send_frame(p->replay, m->data, m->len, 0))
                    break;
            }
            uint8_t end[8];
            memset(end, 0xff, sizeof end); /* -1 as a signed 64-bit big-endian integer */
            if (!send_frame(p->replay, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) &&
                !send_frame(p->replay, "", 0, ZMQ_SNDMORE) && !send_frame(p->replay, end, 8, ZMQ_SNDMORE))
                send_frame(p->replay, "", 0, 0);
            atomic_fetch_add_explicit(&p->replays, 1, memory_order_relaxed);
        }
        for (int i = 0; i < kept; i++) zmq_msg_close(&part[i]);
    }
}

static void publish_queued(srv_kv_events *p, bool *stop) {
    uv_mutex_lock(&p->mu);
    kvev_msg *m = p->q_head;
    p->q_head = p->q_tail = NULL;
    p->q_len = 0;
    p->q_bytes = 0;
    atomic_store_explicit(&p->queue_bytes, 0, memory_order_relaxed);
    *stop = p->stop;
    uv_mutex_unlock(&p->mu);
    size_t topic_len = strlen(p->cfg.topic);
    while (m) {
        kvev_msg *next = m->next;
        m->next = NULL;
        uint8_t seq[8];
        be64(seq, m->seq);
        /* PUB never blocks: past the high-water mark ZeroMQ drops the message for that subscriber */
        if (!send_frame(p->pub, p->cfg.topic, topic_len, ZMQ_SNDMORE) && !send_frame(p->pub, seq, 8, ZMQ_SNDMORE) &&
            !send_frame(p->pub, m->data, m->len, 0))
            atomic_fetch_add_explicit(&p->published, 1, memory_order_relaxed);
        ring_push(p, m);
        m = next;
    }
}

static void publisher_main(void *arg) {
    srv_kv_events *p = arg;
    for (;;) {
        zmq_pollitem_t items[2] = {{NULL, p->wake[0], ZMQ_POLLIN, 0}, {p->replay, 0, ZMQ_POLLIN, 0}};
        int n_items = p->replay ? 2 : 1;
        if (zmq_poll(items, n_items, -1) < 0 && zmq_errno() != EINTR) break;
        if (items[0].revents & ZMQ_POLLIN) {
            char drain[256];
            while (read(p->wake[0], drain, sizeof drain) > 0) {}
        }
        if (n_items == 2 && (items[1].revents & ZMQ_POLLIN)) serve_replay(p);
        bool stop = false;
        publish_queued(p, &stop);
        if (stop) break;
    }
}

static bool wants_bind(const char *ep) {
    return strchr(ep, '*') || strstr(ep, "::") || !strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9);
}

int srv_kv_events_create(const srv_kv_events_config *cfg, srv_kv_events **out, char *err, size_t el) {
    if (!out) return KVS_ERR_INVALID;
    *out = NULL;
    if (!srv_kv_events_config_active(cfg)) {
        snprintf(err, el, "kv events are not enabled");
        return KVS_ERR_INVALID;
    }
    srv_kv_events *p = calloc(1, sizeof *p);
    if (!p) return KVS_ERR_NOMEM;
    p->cfg = *cfg;
    p->wake[0] = p->wake[1] = -1;
    int rc = KVS_ERR_NOMEM;
    p->ring = calloc((size_t)cfg->buffer_steps, sizeof *p->ring);
    if (!p->ring || srv_kv_events_batch_create(&p->batch) != KVS_OK) goto fail;
    if (uv_mutex_init(&p->mu) != 0) {
        free(p->ring);
        srv_kv_events_batch_free(p->batch);
        free(p);
        return KVS_ERR_THREAD;
    }
    p->mu_ok = true;
    if (pipe(p->wake) != 0 || fcntl(p->wake[0], F_SETFL, O_NONBLOCK) != 0 ||
        fcntl(p->wake[1], F_SETFL, O_NONBLOCK) != 0) {
        snprintf(err, el, "kv events: cannot create a pipe: %s", strerror(errno));
        rc = KVS_ERR_IO;
        goto fail;
    }
    fcntl(p->wake[0], F_SETFD, FD_CLOEXEC);
    fcntl(p->wake[1], F_SETFD, FD_CLOEXEC);
    p->zctx = zmq_ctx_new();
    if (!p->zctx || !(p->pub = zmq_socket(p->zctx, ZMQ_PUB))) goto fail;
    int linger = 0, hwm = cfg->hwm;
    zmq_setsockopt(p->pub, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(p->pub, ZMQ_SNDHWM, &hwm, sizeof hwm);
    bool bind = wants_bind(cfg->endpoint);
    if ((bind ? zmq_bind(p->pub, cfg->endpoint) : zmq_connect(p->pub, cfg->endpoint)) != 0) {
        snprintf(err, el, "kv events: cannot %s '%s': %s", bind ? "bind" : "connect", cfg->endpoint,
                 zmq_strerror(zmq_errno()));
        rc = KVS_ERR_BIND;
        goto fail;
    }
    size_t ep_len = sizeof p->endpoint;
    if (!bind || zmq_getsockopt(p->pub, ZMQ_LAST_ENDPOINT, p->endpoint, &ep_len) != 0)
        snprintf(p->endpoint, sizeof p->endpoint, "%s", cfg->endpoint);
    if (cfg->replay_endpoint[0]) {
        if (!(p->replay = zmq_socket(p->zctx, ZMQ_ROUTER))) goto fail;
        zmq_setsockopt(p->replay, ZMQ_LINGER, &linger, sizeof linger);
        if (zmq_bind(p->replay, cfg->replay_endpoint) != 0) {
            snprintf(err, el, "kv events: cannot bind the replay endpoint '%s': %s", cfg->replay_endpoint,
                     zmq_strerror(zmq_errno()));
            rc = KVS_ERR_BIND;
            goto fail;
        }
    }
    if (uv_thread_create(&p->thread, publisher_main, p) != 0) {
        snprintf(err, el, "kv events: cannot start the publisher thread");
        rc = KVS_ERR_THREAD;
        goto fail;
    }
    p->thread_started = true;
    *out = p;
    return KVS_OK;
fail:
    if (rc == KVS_ERR_NOMEM) snprintf(err, el, "kv events: out of memory");
    srv_kv_events_free(p);
    return rc;
}

void srv_kv_events_free(srv_kv_events *p) {
    if (!p) return;
    if (p->thread_started) {
        uv_mutex_lock(&p->mu);
        p->stop = true;
        uv_mutex_unlock(&p->mu);
        char one = 1;
        if (write(p->wake[1], &one, 1) < 0) {} /* a full pipe already wakes the thread */
        uv_thread_join(&p->thread);
    }
    if (p->pub) zmq_close(p->pub);
    if (p->replay) zmq_close(p->replay);
    if (p->zctx) zmq_ctx_term(p->zctx);
    for (kvev_msg *m = p->q_head; m;) {
        kvev_msg *next = m->next;
        msg_free(m);
        m = next;
    }
    if (p->ring)
        for (int32_t i = 0; i < p->ring_len; i++) msg_free(p->ring[(p->ring_head + i) % p->cfg.buffer_steps]);
    free(p->ring);
    if (p->wake[0] >= 0) close(p->wake[0]);
    if (p->wake[1] >= 0) close(p->wake[1]);
    if (p->mu_ok) uv_mutex_destroy(&p->mu);
    srv_kv_events_batch_free(p->batch);
    kvs_buf_free(&p->enc);
    free(p);
}

const char *srv_kv_events_endpoint(const srv_kv_events *p) { return p ? p->endpoint : ""; }

void srv_kv_events_on_cache_event(void *ctx, const kvc_event *ev) {
    srv_kv_events *p = ctx;
    if (!p || p->batch_lost) return;
    if (srv_kv_events_batch_add(p->batch, ev) != KVS_OK) p->batch_lost = true;
}

void srv_kv_events_on_tier_event(void *ctx, const kvc_event *ev) {
    srv_kv_events *p = ctx;
    if (!p || p->batch_lost) return;
    if (srv_kv_events_batch_add_medium(p->batch, ev, SRV_KV_EVENTS_DISK) != KVS_OK) p->batch_lost = true;
}

void srv_kv_events_on_host_event(void *ctx, const kvc_event *ev) {
    srv_kv_events *p = ctx;
    if (!p || p->batch_lost) return;
    if (srv_kv_events_batch_add_medium(p->batch, ev, SRV_KV_EVENTS_HOST) != KVS_OK) p->batch_lost = true;
}

void srv_kv_events_step_end(void *ctx) {
    srv_kv_events *p = ctx;
    if (!p) return;
    int32_t n = srv_kv_events_batch_len(p->batch);
    if (n == 0 && !p->batch_lost) return;
    uint64_t seq = p->next_seq++;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    kvs_buf_clear(&p->enc);
    kvev_msg *m = NULL;
    double ts = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
    bool ok = !p->batch_lost && srv_kv_events_batch_encode(p->batch, ts, 0, &p->enc) == KVS_OK &&
              (m = calloc(1, sizeof *m)) != NULL && (m->data = malloc(p->enc.len)) != NULL;
    srv_kv_events_batch_clear(p->batch);
    p->batch_lost = false;
    if (ok) {
        memcpy(m->data, p->enc.data, p->enc.len);
        m->len = p->enc.len;
        m->seq = seq;
        uv_mutex_lock(&p->mu);
        ok = p->q_len < p->cfg.max_queue_size && p->q_bytes + m->len <= (size_t)p->cfg.max_queue_bytes;
        if (ok) {
            if (p->q_tail) p->q_tail->next = m;
            else p->q_head = m;
            p->q_tail = m;
            p->q_len++;
            p->q_bytes += m->len;
            atomic_store_explicit(&p->queue_bytes, p->q_bytes, memory_order_relaxed);
        }
        uv_mutex_unlock(&p->mu);
    }
    if (!ok) {
        msg_free(m);
        atomic_fetch_add_explicit(&p->dropped, 1, memory_order_relaxed);
        return;
    }
    atomic_fetch_add_explicit(&p->queued, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->events, (uint64_t)n, memory_order_relaxed);
    char one = 1;
    if (write(p->wake[1], &one, 1) < 0) {} /* EAGAIN: a wake-up is already pending */
}

void srv_kv_events_get_stats(const srv_kv_events *p, srv_kv_events_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!p) return;
    srv_kv_events *q = (srv_kv_events *)p;
    out->batches_queued = atomic_load_explicit(&q->queued, memory_order_relaxed);
    out->batches_published = atomic_load_explicit(&q->published, memory_order_relaxed);
    out->batches_dropped = atomic_load_explicit(&q->dropped, memory_order_relaxed);
    out->events = atomic_load_explicit(&q->events, memory_order_relaxed);
    out->replays = atomic_load_explicit(&q->replays, memory_order_relaxed);
    out->queue_bytes = atomic_load_explicit(&q->queue_bytes, memory_order_relaxed);
    out->buffer_bytes = atomic_load_explicit(&q->buffer_bytes_now, memory_order_relaxed);
}
