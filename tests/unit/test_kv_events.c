/*
 * test_kv_events.c: KV-cache events in vLLM's wire format (server/obs/obs.h): the configuration keys, the
 * msgpack encoding (decoded back with msgpack-c and checked field by field: tags, order, nil, uint64 hashes,
 * merging of consecutive blocks), and the ZeroMQ publisher end to end over ipc:// sockets: frames [topic, seq,
 * payload], sequence numbers, the replay ROUTER protocol (replies then the -1 end marker), and drop accounting
 * with a tiny queue.
 */
#include <criterion/criterion.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "server/obs/obs.h"

/* ---- configuration ---------------------------------------------------------------------------------------- */
Test(kv_events, config_keys) {
    srv_kv_events_config c;
    char err[256];
    cr_assert_eq(srv_kv_events_config_parse(NULL, &c, err, sizeof err), 0);
    cr_assert(!c.enable);
    cr_assert_str_eq(c.publisher, "null");
    cr_assert_str_eq(c.endpoint, "tcp://*:5557");
    cr_assert_eq(c.buffer_steps, 10000);
    cr_assert_eq(c.hwm, 100000);
    cr_assert(!srv_kv_events_config_active(&c));
    cr_assert_eq(srv_kv_events_config_parse("{\"enable_kv_cache_events\": true, \"endpoint\": \"tcp://*:6000\", "
                                       "\"replay_endpoint\": \"tcp://*:6001\", \"topic\": \"kv@pod@m\", "
                                       "\"buffer_steps\": 5, \"hwm\": 7, \"max_queue_size\": 9}",
                                       &c, err, sizeof err),
                 0, "%s", err);
    cr_assert(srv_kv_events_config_active(&c));
    cr_assert_str_eq(c.publisher, "zmq", "publisher defaults to zmq when enabled, as vLLM");
    cr_assert_str_eq(c.replay_endpoint, "tcp://*:6001");
    cr_assert_str_eq(c.topic, "kv@pod@m");
    cr_assert_eq(c.buffer_steps, 5);
    cr_assert_eq(c.hwm, 7);
    cr_assert_eq(c.max_queue_size, 9);
    cr_assert_eq(srv_kv_events_config_parse("{\"enable_kv_cache_events\": true, \"publisher\": \"null\", "
                                       "\"replay_endpoint\": null}", &c, err, sizeof err), 0);
    cr_assert(!srv_kv_events_config_active(&c));
    cr_assert_eq(c.replay_endpoint[0], 0);
    static const char *const bad[] = {
        "[]", "{\"enable_kv_cache_events\": 1}", "{\"publisher\": \"kafka\"}", "{\"buffer_steps\": 0}",
        "{\"hwm\": 1.5}", "{\"endpoint\": 5}", "{\"no_such_key\": true}", "{", "{\"topic\": null}",
        "{\"enable_kv_cache_events\": true, \"endpoint\": \"\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        cr_assert_eq(srv_kv_events_config_parse(bad[i], &c, err, sizeof err), KVS_ERR_INVALID, "%s", bad[i]);
        cr_assert(strstr(err, "kv_events_config"), "message names the setting: %s", err);
    }
    cr_assert(strstr((srv_kv_events_config_parse("{\"no_such_key\": 1}", &c, err, sizeof err), err), "no_such_key"));
}

/* ---- encoding ------------------------------------------------------------------------------------------------ */
static void assert_str(const msgpack_object *o, const char *s) {
    cr_assert_eq(o->type, MSGPACK_OBJECT_STR);
    cr_assert_eq(o->via.str.size, strlen(s));
    cr_assert(!memcmp(o->via.str.ptr, s, strlen(s)), "expected %s", s);
}

static uint64_t as_u64(const msgpack_object *o) {
    cr_assert_eq(o->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    return o->via.u64;
}

static kvc_event stored(uint64_t h, bool has_parent, uint64_t parent, const int32_t *toks, int32_t bs) {
    return (kvc_event){.kind = KVC_EVENT_STORED, .block = 0, .hash = h, .has_parent = has_parent,
                       .parent_hash = parent, .tokens = toks, .block_size = bs};
}

/* Counts the msgpack uint64 markers (0xcf) followed by the big-endian value v in buf. */
static int count_u64(const char *buf, size_t len, uint64_t v) {
    int n = 0;
    for (size_t i = 0; i + 9 <= len; i++) {
        if ((uint8_t)buf[i] != 0xcf) continue;
        uint64_t x = 0;
        for (int k = 1; k <= 8; k++) x = x << 8 | (uint8_t)buf[i + k];
        n += x == v;
    }
    return n;
}

Test(kv_events, encode_matches_vllm_array_like_layout) {
    srv_kv_events_batch *b = NULL;
    cr_assert_eq(srv_kv_events_batch_create(&b), 0);
    int32_t t1[4] = {1, 2, 3, 4}, t2[4] = {5, 6, 7, 100000}, t3[4] = {9, 9, 9, 9};
    /* a chain root, its child (merged into one BlockStored), an unrelated chain, two removals, a clear */
    kvc_event s1 = stored(11, false, 0, t1, 4), s2 = stored(12, true, 11, t2, 4),
              s3 = stored(0xfedcba9876543210ull, true, 77, t3, 4);
    cr_assert_eq(srv_kv_events_batch_add(b, &s1), 0);
    cr_assert_eq(srv_kv_events_batch_add(b, &s2), 0);
    cr_assert_eq(srv_kv_events_batch_add(b, &s3), 0);
    cr_assert_eq(srv_kv_events_batch_add(b, &(kvc_event){.kind = KVC_EVENT_REMOVED, .hash = 11}), 0);
    cr_assert_eq(srv_kv_events_batch_add(b, &(kvc_event){.kind = KVC_EVENT_REMOVED, .hash = 12}), 0);
    cr_assert_eq(srv_kv_events_batch_add(b, &(kvc_event){.kind = KVC_EVENT_CLEARED}), 0);
    cr_assert_eq(srv_kv_events_batch_add(b, &(kvc_event){.kind = 99}), KVS_ERR_INVALID);
    cr_assert_eq(srv_kv_events_batch_len(b), 4);
    kvs_buf out = {0};
    cr_assert_eq(srv_kv_events_batch_encode(b, 1700000000.25, 0, &out), 0);
    /* hashes always use the 9-byte uint64 form, even small ones (Go decoders then see uint64) */
    cr_assert_eq(count_u64(out.data, out.len, 11), 2);
    cr_assert_eq(count_u64(out.data, out.len, 12), 2);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    cr_assert_eq(msgpack_unpack_next(&u, out.data, out.len, &off), MSGPACK_UNPACK_SUCCESS);
    cr_assert_eq(off, out.len);
    const msgpack_object *root = &u.data;
    cr_assert_eq(root->type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(root->via.array.size, 3, "[ts, events, data_parallel_rank]");
    cr_assert_eq(root->via.array.ptr[0].type, MSGPACK_OBJECT_FLOAT64);
    cr_assert_float_eq(root->via.array.ptr[0].via.f64, 1700000000.25, 1e-6);
    cr_assert_eq(as_u64(&root->via.array.ptr[2]), 0);
    const msgpack_object_array *ev = &root->via.array.ptr[1].via.array;
    cr_assert_eq(ev->size, 4);
    /* BlockStored merged: [tag, [11, 12], nil, tokens, 4, nil, "GPU", nil]: exactly 8 elements, since array-form
     * decoders (llm-d's vLLM adapter) refuse any other count */
    const msgpack_object_array *e0 = &ev->ptr[0].via.array;
    cr_assert_eq(e0->size, 8);
    assert_str(&e0->ptr[0], "BlockStored");
    cr_assert_eq(e0->ptr[1].via.array.size, 2);
    cr_assert_eq(as_u64(&e0->ptr[1].via.array.ptr[0]), 11);
    cr_assert_eq(as_u64(&e0->ptr[1].via.array.ptr[1]), 12);
    cr_assert_eq(e0->ptr[2].type, MSGPACK_OBJECT_NIL, "a chain root has no parent");
    cr_assert_eq(e0->ptr[3].via.array.size, 8);
    int32_t want[8] = {1, 2, 3, 4, 5, 6, 7, 100000};
    for (int i = 0; i < 8; i++) cr_assert_eq(as_u64(&e0->ptr[3].via.array.ptr[i]), (uint64_t)want[i]);
    cr_assert_eq(as_u64(&e0->ptr[4]), 4);
    cr_assert_eq(e0->ptr[5].type, MSGPACK_OBJECT_NIL, "lora_id");
    assert_str(&e0->ptr[6], "GPU");
    cr_assert_eq(e0->ptr[7].type, MSGPACK_OBJECT_NIL, "lora_name");
    const msgpack_object_array *e1 = &ev->ptr[1].via.array;
    assert_str(&e1->ptr[0], "BlockStored");
    cr_assert_eq(as_u64(&e1->ptr[1].via.array.ptr[0]), 0xfedcba9876543210ull);
    cr_assert_eq(as_u64(&e1->ptr[2]), 77);
    const msgpack_object_array *e2 = &ev->ptr[2].via.array;
    cr_assert_eq(e2->size, 3);
    assert_str(&e2->ptr[0], "BlockRemoved");
    cr_assert_eq(e2->ptr[1].via.array.size, 2);
    assert_str(&e2->ptr[2], "GPU");
    const msgpack_object_array *e3 = &ev->ptr[3].via.array;
    cr_assert_eq(e3->size, 1);
    assert_str(&e3->ptr[0], "AllBlocksCleared");
    msgpack_unpacked_destroy(&u);
    kvs_buf_free(&out);
    srv_kv_events_batch_clear(b);
    cr_assert_eq(srv_kv_events_batch_len(b), 0);
    srv_kv_events_batch_free(b);
}

/* ---- the publisher over ipc:// ------------------------------------------------------------------------------- */
typedef struct frames {
    int n;
    char *part[4];
    size_t len[4];
} frames;

static int recv_frames(void *sock, frames *f, int timeout_ms) {
    memset(f, 0, sizeof *f);
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) <= 0) return -1;
    int more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, 0) < 0) return -1;
        if (f->n < 4) {
            f->len[f->n] = zmq_msg_size(&m);
            f->part[f->n] = malloc(f->len[f->n] + 1);
            memcpy(f->part[f->n], zmq_msg_data(&m), f->len[f->n]);
        }
        f->n++;
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    return 0;
}

static void frames_free(frames *f) {
    for (int i = 0; i < 4 && i < f->n; i++) free(f->part[i]);
}

static uint64_t be_u64(const char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | (uint8_t)p[i];
    return v;
}

/* First block hash of the first event of an encoded batch. */
static uint64_t first_hash(const char *payload, size_t len) {
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    cr_assert_eq(msgpack_unpack_next(&u, payload, len, &off), MSGPACK_UNPACK_SUCCESS);
    uint64_t h = as_u64(&u.data.via.array.ptr[1].via.array.ptr[0].via.array.ptr[1].via.array.ptr[0]);
    msgpack_unpacked_destroy(&u);
    return h;
}

/* An enabled zmq configuration publishing on endpoint. */
static srv_kv_events_config zmq_config(const char *endpoint) {
    srv_kv_events_config c;
    srv_kv_events_config_default(&c);
    c.enable = true;
    snprintf(c.publisher, sizeof c.publisher, "zmq");
    snprintf(c.endpoint, sizeof c.endpoint, "%s", endpoint);
    return c;
}

static void one_step(srv_kv_events *p, uint64_t h) {
    int32_t toks[2] = {(int32_t)h, 1};
    kvc_event ev = stored(h, false, 0, toks, 2);
    srv_kv_events_on_cache_event(p, &ev);
    srv_kv_events_step_end(p);
}

/* The ipc endpoints these tests bind are socket files under /tmp that this test made: removed after each test. */
static void unlink_ipc(const char *ep) {
    if (!strncmp(ep, "ipc://", 6)) unlink(ep + 6);
}

Test(kv_events, publish_and_replay) {
    char pub_ep[128], rep_ep[128], err[256];
    snprintf(pub_ep, sizeof pub_ep, "ipc:///tmp/kvserve-test-kvev-%d.pub", (int)getpid());
    snprintf(rep_ep, sizeof rep_ep, "ipc:///tmp/kvserve-test-kvev-%d.replay", (int)getpid());
    srv_kv_events_config c = zmq_config(pub_ep);
    snprintf(c.replay_endpoint, sizeof c.replay_endpoint, "%s", rep_ep);
    snprintf(c.topic, sizeof c.topic, "kv@test@m");
    c.buffer_steps = 3;
    srv_kv_events *p = NULL;
    cr_assert_eq(srv_kv_events_create(&c, &p, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(srv_kv_events_endpoint(p), pub_ep);
    void *zctx = zmq_ctx_new();
    void *sub = zmq_socket(zctx, ZMQ_SUB);
    cr_assert_eq(zmq_connect(sub, pub_ep), 0);
    cr_assert_eq(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "kv@", 3), 0);
    /* the PUB side drops messages until the subscription has arrived: probe until one gets through */
    frames f;
    uint64_t h = 1000;
    for (int tries = 0;; tries++) {
        cr_assert_lt(tries, 100, "the subscriber never received anything");
        one_step(p, h++);
        if (recv_frames(sub, &f, 50) == 0) break;
    }
    uint64_t base = be_u64(f.part[1]);
    frames_free(&f);
    srv_kv_events_step_end(p); /* an empty step publishes nothing */
    for (uint64_t i = 0; i < 5; i++) one_step(p, 5000 + i);
    for (uint64_t i = 0; i < 5; i++) {
        cr_assert_eq(recv_frames(sub, &f, 2000), 0);
        cr_assert_eq(f.n, 3, "[topic, seq, payload]");
        cr_assert_eq(f.len[0], strlen("kv@test@m"));
        cr_assert(!memcmp(f.part[0], "kv@test@m", f.len[0]));
        cr_assert_eq(f.len[1], 8);
        cr_assert_eq(be_u64(f.part[1]), base + 1 + i, "consecutive sequence numbers");
        cr_assert_eq(first_hash(f.part[2], f.len[2]), 5000 + i);
        frames_free(&f);
    }
    /* replay from base + 3: the ring holds the last 3 batches (base+3 .. base+5) */
    /* A DEALER client sends the empty delimiter itself and sees it in replies (a REQ socket would accept only the
     * first reply of the stream). */
    void *req = zmq_socket(zctx, ZMQ_DEALER);
    cr_assert_eq(zmq_connect(req, rep_ep), 0);
    for (int round = 0; round < 2; round++) {
        uint64_t from = round == 0 ? base + 4 : 0; /* from the middle of the ring; from before its start */
        char start[8];
        for (int i = 0; i < 8; i++) start[i] = (char)(from >> (56 - 8 * i));
        cr_assert_eq(zmq_send(req, "", 0, ZMQ_SNDMORE), 0);
        cr_assert_eq(zmq_send(req, start, 8, 0), 8);
        uint64_t expect = round == 0 ? base + 4 : base + 3;
        for (;;) {
            cr_assert_eq(recv_frames(req, &f, 2000), 0, "replay answered (round %d)", round);
            cr_assert_eq(f.n, 3, "['', seq, payload]");
            cr_assert_eq(f.len[0], 0);
            uint64_t seq = be_u64(f.part[1]);
            if (seq == UINT64_MAX) {
                cr_assert_eq(f.len[2], 0, "the end marker has an empty payload");
                frames_free(&f);
                break;
            }
            cr_assert_eq(seq, expect, "replayed in order");
            cr_assert_eq(first_hash(f.part[2], f.len[2]), 5000 + (seq - base - 1));
            expect++;
            frames_free(&f);
        }
        cr_assert_eq(expect, base + 6, "every buffered batch from the start was replayed");
    }
    srv_kv_events_stats st;
    srv_kv_events_get_stats(p, &st);
    cr_assert_eq(st.replays, 2);
    cr_assert_eq(st.batches_dropped, 0);
    cr_assert_eq(st.batches_queued, st.batches_published);
    zmq_close(req);
    zmq_close(sub);
    zmq_ctx_term(zctx);
    srv_kv_events_free(p);
    unlink_ipc(pub_ep);
    unlink_ipc(rep_ep);
}

Test(kv_events, full_queue_drops_and_leaves_a_gap) {
    char ep[128], err[256];
    snprintf(ep, sizeof ep, "ipc:///tmp/kvserve-test-kvev-drop-%d.pub", (int)getpid());
    srv_kv_events_config c = zmq_config(ep);
    c.max_queue_size = 1;
    srv_kv_events *p = NULL;
    cr_assert_eq(srv_kv_events_create(&c, &p, err, sizeof err), 0, "%s", err);
    enum { STEPS = 20000 };
    for (uint64_t i = 0; i < STEPS; i++) one_step(p, i + 1);
    srv_kv_events_stats st;
    srv_kv_events_get_stats(p, &st);
    cr_assert_eq(st.batches_queued + st.batches_dropped, STEPS, "every step is either queued or counted dropped");
    srv_kv_events_free(p);
    unlink_ipc(ep);
    cr_assert_eq(srv_kv_events_create(&(srv_kv_events_config){0}, &p, err, sizeof err), KVS_ERR_INVALID);
    c = zmq_config("bogus://x");
    cr_assert_eq(srv_kv_events_create(&c, &p, err, sizeof err), KVS_ERR_BIND);
    cr_assert(strstr(err, "bogus://x"), "%s", err);
}

/* The queue to the publisher thread is bounded by bytes as well as batches (issue 30): with max_queue_bytes
 * below one batch every batch is dropped and counted, and nothing is held; the keys parse and print. */
Test(kv_events, queue_bounded_by_bytes) {
    char ep[128], err[256];
    snprintf(ep, sizeof ep, "ipc:///tmp/kvserve-test-kvev-bytes-%d.pub", (int)getpid());
    srv_kv_events_config c = zmq_config(ep);
    c.max_queue_bytes = 8; /* smaller than any encoded batch */
    srv_kv_events *p = NULL;
    cr_assert_eq(srv_kv_events_create(&c, &p, err, sizeof err), 0, "%s", err);
    enum { STEPS = 200 };
    for (uint64_t i = 0; i < STEPS; i++) one_step(p, i + 1);
    srv_kv_events_stats st;
    srv_kv_events_get_stats(p, &st);
    cr_assert_eq(st.batches_dropped, STEPS, "%llu dropped", (unsigned long long)st.batches_dropped);
    cr_assert_eq(st.batches_queued, 0);
    cr_assert_eq(st.queue_bytes, 0);
    srv_kv_events_free(p);
    unlink_ipc(ep);
    cr_assert_eq(srv_kv_events_config_parse("{\"max_queue_bytes\": 1000, \"buffer_bytes\": 2000}", &c, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(c.max_queue_bytes, 1000);
    cr_assert_eq(c.buffer_bytes, 2000);
    cr_assert_eq(srv_kv_events_config_parse("{\"max_queue_bytes\": 0}", &c, err, sizeof err), KVS_ERR_INVALID);
    srv_kv_events_config_default(&c);
    cr_assert_eq(c.max_queue_bytes, 64 << 20);
}

/* The disk tier's events (issue 29) carry medium "DISK" and never merge with the pool's ("GPU"). */
Test(kv_events, disk_tier_events_carry_their_medium) {
    srv_kv_events_batch *b = NULL;
    cr_assert_eq(srv_kv_events_batch_create(&b), 0);
    int32_t t1[4] = {1, 2, 3, 4}, t2[4] = {5, 6, 7, 8};
    kvc_event s1 = stored(21, false, 0, t1, 4), s2 = stored(22, true, 21, t2, 4);
    cr_assert_eq(srv_kv_events_batch_add(b, &s1), 0);
    cr_assert_eq(srv_kv_events_batch_add_medium(b, &s2, SRV_KV_EVENTS_DISK), 0); /* same chain, other medium */
    cr_assert_eq(srv_kv_events_batch_add_medium(b, &(kvc_event){.kind = KVC_EVENT_REMOVED, .hash = 21},
                                                 SRV_KV_EVENTS_DISK), 0);
    cr_assert_eq(srv_kv_events_batch_add(b, &(kvc_event){.kind = KVC_EVENT_REMOVED, .hash = 22}), 0);
    cr_assert_eq(srv_kv_events_batch_add_medium(b, &(kvc_event){.kind = KVC_EVENT_CLEARED}, SRV_KV_EVENTS_DISK),
                 KVS_ERR_INVALID);
    cr_assert_eq(srv_kv_events_batch_add_medium(b, &s1, (srv_kv_events_medium)7), KVS_ERR_INVALID);
    cr_assert_eq(srv_kv_events_batch_len(b), 4);
    kvs_buf out = {0};
    cr_assert_eq(srv_kv_events_batch_encode(b, 1.0, 0, &out), 0);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    cr_assert_eq(msgpack_unpack_next(&u, out.data, out.len, &off), MSGPACK_UNPACK_SUCCESS);
    const msgpack_object_array *ev = &u.data.via.array.ptr[1].via.array;
    cr_assert_eq(ev->size, 4);
    assert_str(&ev->ptr[0].via.array.ptr[6], "GPU");
    assert_str(&ev->ptr[1].via.array.ptr[0], "BlockStored");
    cr_assert_eq(as_u64(&ev->ptr[1].via.array.ptr[2]), 21, "the parent travels with the split chain");
    assert_str(&ev->ptr[1].via.array.ptr[6], "DISK");
    assert_str(&ev->ptr[2].via.array.ptr[2], "DISK");
    assert_str(&ev->ptr[3].via.array.ptr[2], "GPU");
    msgpack_unpacked_destroy(&u);
    kvs_buf_free(&out);
    srv_kv_events_batch_free(b);
}

/* The host tier's events carry vLLM's medium "CPU", apart from the pool's and the disk's. */
Test(kv_events, host_tier_events_carry_medium_cpu) {
    srv_kv_events_batch *b = NULL;
    cr_assert_eq(srv_kv_events_batch_create(&b), 0);
    int32_t t1[4] = {1, 2, 3, 4}, t2[4] = {5, 6, 7, 8};
    kvc_event s1 = stored(31, false, 0, t1, 4), s2 = stored(32, true, 31, t2, 4);
    cr_assert_eq(srv_kv_events_batch_add_medium(b, &s1, SRV_KV_EVENTS_HOST), 0);
    cr_assert_eq(srv_kv_events_batch_add_medium(b, &s2, SRV_KV_EVENTS_HOST), 0); /* one chain: one event */
    cr_assert_eq(srv_kv_events_batch_add_medium(b, &s2, SRV_KV_EVENTS_DISK), 0);
    cr_assert_eq(srv_kv_events_batch_add_medium(b, &(kvc_event){.kind = KVC_EVENT_REMOVED, .hash = 31},
                                                 SRV_KV_EVENTS_HOST), 0);
    cr_assert_eq(srv_kv_events_batch_add_medium(b, &(kvc_event){.kind = KVC_EVENT_CLEARED}, SRV_KV_EVENTS_HOST),
                 KVS_ERR_INVALID);
    cr_assert_eq(srv_kv_events_batch_len(b), 3);
    kvs_buf out = {0};
    cr_assert_eq(srv_kv_events_batch_encode(b, 1.0, 0, &out), 0);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    cr_assert_eq(msgpack_unpack_next(&u, out.data, out.len, &off), MSGPACK_UNPACK_SUCCESS);
    const msgpack_object_array *ev = &u.data.via.array.ptr[1].via.array;
    cr_assert_eq(ev->size, 3);
    assert_str(&ev->ptr[0].via.array.ptr[6], "CPU");
    cr_assert_eq(ev->ptr[0].via.array.ptr[1].via.array.size, 2, "both blocks in one BlockStored");
    assert_str(&ev->ptr[1].via.array.ptr[6], "DISK");
    assert_str(&ev->ptr[2].via.array.ptr[0], "BlockRemoved");
    assert_str(&ev->ptr[2].via.array.ptr[2], "CPU");
    msgpack_unpacked_destroy(&u);
    kvs_buf_free(&out);
    srv_kv_events_batch_free(b);
}
