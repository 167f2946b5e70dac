#!/usr/bin/env python3
"""End-to-end test of kvserve's KV-cache events (vLLM's wire format) used for prefix-aware routing.

Starts three kvserve replicas with --kv-events-config (replica 0 on tcp://*:PORT, the others on ipc://), and one
subscriber that rebuilds each replica's block index from the events alone (BlockStored / BlockRemoved /
AllBlocksCleared; a multiset of block hashes plus, per hash, its parent and token ids). Seed prompts built from a
few shared stems go to different replicas; then, for every new probe prompt, the subscriber predicts from its
indexes how many prompt tokens each replica holds (walking the prompt's full blocks by token ids, parent by
parent, as a router would) and routes to the best one. The probe is then sent to every replica and each one's own
usage.prompt_tokens_details.cached_tokens must equal the prediction for it. The pool is small, so evictions
(BlockRemoved) happen along the way. Replica 2 has a small host-memory tier (--kv-host-gb): the blocks its pool evicts
are copied there and announced with medium "CPU"; its index keeps one multiset per medium, and a block is predicted
servable when either medium holds it (pool first, then the host tier, as kvserve looks them up). Also checked: the documented hash rule (XXH3-64 of the block's int32 tokens
seeded by the parent hash, root seed 0x6b76736572766531), consecutive sequence numbers, the replay socket
(the index rebuilt from replayed batches equals the live one), and the kvserve:kv_events_* and vllm:* metrics.

Run by ctest (e2e_kv_events); exits 77 (skipped) when python3-zmq or python3-msgpack is missing.
Environment: KVSERVE_BINARY (default ../../build/kvserve), KVSERVE_SHARED (default ../../../shared).
"""
import collections
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

try:
    import msgpack
    import zmq
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (install python3-zmq and python3-msgpack: scripts/install-deps.sh)")
    sys.exit(77)
try:
    import xxhash
except ImportError:
    xxhash = None

HERE = os.path.dirname(os.path.abspath(__file__))
BINARY = os.environ.get("KVSERVE_BINARY") or os.path.join(HERE, "..", "..", "build", "kvserve")
SHARED = os.environ.get("KVSERVE_SHARED") or os.path.join(HERE, "..", "..", "..", "shared")
BLOCK = 8
ROOT_SEED = 0x6B76736572766531
N_REPLICAS = 3


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http(base, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        raw = r.read().decode()
        return json.loads(raw) if path != "/metrics" else raw


class Replica:
    def __init__(self, idx, model, tmp):
        self.idx = idx
        self.port = free_port()
        if idx == 0:
            self.endpoint = f"tcp://*:{free_port()}"
            self.connect = self.endpoint.replace("*", "127.0.0.1")
        else:
            self.endpoint = self.connect = f"ipc://{tmp}/r{idx}.pub"
        self.replay = f"ipc://{tmp}/r{idx}.replay"
        self.topic = f"kv@replica-{idx}@test"
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.endpoint,
               "replay_endpoint": self.replay, "topic": self.topic, "buffer_steps": 100000}
        self.log_path = os.path.join(tmp, f"r{idx}.log")
        self.log = open(self.log_path, "w+")
        args = [BINARY, "serve", "-m", model, "--host", "127.0.0.1", "--port", str(self.port), "--block-size",
                str(BLOCK), "--kv-blocks", "40", "--parallel", "2", "--threads", "1", "--log-format", "none",
                "--kv-events-config", json.dumps(cfg)]
        if idx == 2:
            args += ["--kv-host-gb", "0.0001"]  # a few dozen blocks of the tiny model: it evicts too
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log)
        self.base = f"http://127.0.0.1:{self.port}"

    def wait_healthy(self):
        deadline = time.time() + 90
        while True:
            if self.proc.poll() is not None:
                fail(f"replica {self.idx} exited with {self.proc.returncode}:\n{self.read_log()}")
            try:
                urllib.request.urlopen(self.base + "/health", timeout=2)
                return
            except Exception:
                pass
            if time.time() > deadline:
                fail(f"replica {self.idx} did not become healthy:\n{self.read_log()}")
            time.sleep(0.1)

    def read_log(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-20000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        log = self.read_log()
        if re.search(r"ERROR: (Address|Leak)Sanitizer|runtime error:", log):
            fail(f"replica {self.idx}: sanitizer error:\n{log}")
        return self.proc.returncode

    def complete(self, tokens):
        r = http(self.base, "/v1/completions", {"model": "m", "prompt": tokens, "max_tokens": 1, "temperature": 0})
        return r["usage"]["prompt_tokens_details"]["cached_tokens"]


class Index:
    """One replica's prefix-cache blocks, rebuilt from its events alone."""

    def __init__(self):
        self.count = collections.Counter()   # hash -> how many pool blocks hold it ("GPU")
        self.host = collections.Counter()    # hash -> how many host-tier blocks hold it ("CPU")
        self.by_key = {}                      # (parent hash or None, token tuple) -> hash
        self.events = collections.Counter()
        self.last_seq = None
        self.gaps = 0
        self.received = 0

    def apply_batch(self, payload):
        batch = msgpack.unpackb(payload, raw=False)
        if not (isinstance(batch, list) and len(batch) == 3 and isinstance(batch[0], float)
                and isinstance(batch[1], list) and batch[2] == 0):
            fail(f"EventBatch is not [ts, events, 0]: {batch!r:.200}")
        for ev in batch[1]:
            tag = ev[0]
            self.events[tag] += 1
            if tag == "BlockStored":
                if len(ev) != 8 or ev[5] is not None or ev[6] not in ("GPU", "CPU") or ev[7] is not None \
                        or ev[4] != BLOCK:
                    fail(f"BlockStored layout: {ev!r:.200}")
                self.events["CPU"] += ev[6] == "CPU"
                count = self.count if ev[6] == "GPU" else self.host
                hashes, parent, toks = ev[1], ev[2], ev[3]
                if len(toks) != len(hashes) * BLOCK:
                    fail("BlockStored token_ids must hold block_size tokens per hash")
                for i, h in enumerate(hashes):
                    t = tuple(toks[i * BLOCK:(i + 1) * BLOCK])
                    if xxhash is not None:
                        seed = ROOT_SEED if parent is None else parent
                        want = xxhash.xxh3_64_intdigest(b"".join(x.to_bytes(4, "little", signed=True) for x in t),
                                                        seed=seed)
                        if want != h:
                            fail(f"block hash {h:#x} does not follow the documented rule (want {want:#x})")
                    count[h] += 1
                    self.by_key[(parent, t)] = h
                    parent = h
            elif tag == "BlockRemoved":
                if len(ev) != 3 or ev[2] not in ("GPU", "CPU"):
                    fail(f"BlockRemoved layout: {ev!r:.200}")
                count = self.count if ev[2] == "GPU" else self.host
                for h in ev[1]:
                    if count[h] <= 0:
                        fail(f"BlockRemoved for a block never stored: {h:#x}")
                    count[h] -= 1
            elif tag == "AllBlocksCleared":
                self.count.clear()
                self.by_key.clear()
            else:
                fail(f"unknown event tag {tag!r}")

    def predict(self, tokens):
        """Tokens kvserve will attach: whole blocks of the prompt but its last token, found parent by parent."""
        usable = (len(tokens) - 1) // BLOCK
        parent, n = None, 0
        for i in range(usable):
            h = self.by_key.get((parent, tuple(tokens[i * BLOCK:(i + 1) * BLOCK])))
            if h is None or (self.count[h] <= 0 and self.host[h] <= 0):
                break
            parent, n = h, n + 1
        return n * BLOCK

    def snapshot(self):
        return ({h: c for h, c in self.count.items() if c > 0}, {h: c for h, c in self.host.items() if c > 0})


def drain(subs, indexes, replicas, timeout=30.0):
    """Applies event batches until each subscriber has every batch its replica had queued when asked: a batch is
    queued before the responses of its step are sent, so kvserve:kv_events_queued_total read now covers every
    request answered so far."""
    want = [metric(http(r.base, "/metrics"), "kvserve:kv_events_queued_total") for r in replicas]
    poller = zmq.Poller()
    for s in subs:
        poller.register(s, zmq.POLLIN)
    deadline = time.time() + timeout
    while any(idx.received < w for idx, w in zip(indexes, want)):
        if time.time() > deadline:
            fail(f"events missing: received {[i.received for i in indexes]}, queued {want}")
        for sock, _ in poller.poll(50):
            i = subs.index(sock)
            topic, seq, payload = sock.recv_multipart()
            idx = indexes[i]
            seq = int.from_bytes(seq, "big")
            if idx.last_seq is not None and seq != idx.last_seq + 1:
                idx.gaps += 1
            idx.last_seq = seq
            idx.received += 1
            idx.apply_batch(payload)


def replay_index(endpoint, ctx):
    """Rebuilds an index from the replay socket alone (vLLM's protocol: 8-byte start, replies, -1 end)."""
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send_multipart([b"", (0).to_bytes(8, "big")])
    idx = Index()
    n = 0
    while True:
        if not sock.poll(10000):
            fail("replay did not answer")
        empty, seq, payload = sock.recv_multipart()
        if seq == b"\xff" * 8:
            if payload != b"":
                fail("replay end marker must carry an empty payload")
            break
        if int.from_bytes(seq, "big") != n:
            fail(f"replayed seq {int.from_bytes(seq, 'big')}, expected {n}")
        idx.apply_batch(payload)
        n += 1
    sock.close(0)
    return idx, n


def metric(text, name):
    for line in text.splitlines():
        m = re.match(r"^([^\s{]+)(\{[^}]*\})?\s+(\S+)", line)
        if m and m.group(1) == name:
            return float(m.group(3))
    return None


def main():
    if not os.path.exists(BINARY):
        fail(f"no kvserve binary at {BINARY}")
    tmp = tempfile.mkdtemp(prefix="kvserve-kvev-")
    model = os.path.join(SHARED, "models", "stories260K.gguf")
    if not os.path.exists(model):
        print(f"# {SHARED} has no stories260K: using a model written by kvserve mkmodel")
        model = os.path.join(tmp, "tiny.gguf")
        subprocess.run([BINARY, "mkmodel", "--preset", "tiny", "-o", model], check=True)
    replicas = [Replica(i, model, tmp) for i in range(N_REPLICAS)]
    ctx = zmq.Context()
    subs = []
    try:
        for r in replicas:
            r.wait_healthy()
            s = ctx.socket(zmq.SUB)
            s.connect(r.connect)
            s.setsockopt(zmq.SUBSCRIBE, b"kv@")
            subs.append(s)
        time.sleep(0.5)  # let the subscriptions reach the PUB sockets before anything is published
        indexes = [Index() for _ in replicas]
        rng = random.Random(1234)
        stems = [[rng.randrange(10, 250) for _ in range(rng.randrange(24, 64))] for _ in range(6)]

        def prompt(stem):
            return stems[stem] + [rng.randrange(10, 250) for _ in range(rng.randrange(3, 40))]

        # seeding: stem s lives on replica s % 3
        for s in range(len(stems)):
            for _ in range(2):
                replicas[s % N_REPLICAS].complete(prompt(s))
                drain(subs, indexes, replicas)
        # phase A: route each probe to the replica predicted to hold its longest prefix and send it there only
        # (the caches stay apart, as behind a real router); that replica's cached_tokens must equal the prediction
        routed_tokens = rr_tokens = 0
        for k in range(40):
            p = prompt(rng.randrange(len(stems)))
            drain(subs, indexes, replicas)
            pred = [idx.predict(p) for idx in indexes]
            route = max(range(N_REPLICAS), key=lambda i: (pred[i], -i))
            got = replicas[route].complete(p)
            if got != pred[route]:
                fail(f"routed probe {k}: replica {route} cached {got}, predicted {pred[route]}")
            routed_tokens += got
            rr_tokens += pred[k % N_REPLICAS]
        drain(subs, indexes, replicas)
        # phase B: every probe goes to every replica; each replica's own cached_tokens must equal its prediction
        exact = total = routed_best = 0
        for k in range(30):
            p = prompt(rng.randrange(len(stems))) if rng.random() < 0.85 else [rng.randrange(10, 250) for _ in range(40)]
            drain(subs, indexes, replicas)
            pred = [idx.predict(p) for idx in indexes]
            route = max(range(N_REPLICAS), key=lambda i: (pred[i], -i))
            got = [r.complete(p) for r in replicas]
            drain(subs, indexes, replicas)
            for i in range(N_REPLICAS):
                total += 1
                if pred[i] == got[i]:
                    exact += 1
                else:
                    print(f"# probe {k} replica {i}: predicted {pred[i]} cached {got[i]} (prompt {len(p)} tokens)")
            routed_best += got[route] == max(got)
        removed = sum(i.events["BlockRemoved"] for i in indexes)
        stored = sum(i.events["BlockStored"] for i in indexes)
        print(f"# routing (40 routed probes): cached tokens at the routed replica {routed_tokens}, "
              f"round robin would have had {rr_tokens}")
        print(f"# prediction (30 probes x {N_REPLICAS} replicas): {exact}/{total} exact; the predicted best replica "
              f"was a best one in {routed_best}/30; events: {stored} BlockStored, {removed} BlockRemoved")
        if exact != total:
            fail(f"{total - exact} predictions differ from the replicas' cached_tokens")
        if routed_best != 30:
            fail("a probe's predicted best replica did not hold the longest cached prefix")
        if removed == 0:
            fail("the small pool should have evicted blocks (BlockRemoved)")
        if indexes[2].events["CPU"] == 0 or sum(indexes[i].events["CPU"] for i in (0, 1)):
            fail("only replica 2 (host tier) should announce blocks with medium CPU, and it should")
        host_hits = float(re.search(r'kvserve:prefix_cache_tier_hits_total\{tier="host"\} (\S+)',
                                    http(replicas[2].base, "/metrics")).group(1))
        print(f"# replica 2: {indexes[2].events['CPU']} BlockStored CPU, {host_hits:.0f} prompt tokens from its host tier")
        if routed_tokens <= rr_tokens:
            fail("prefix-aware routing should beat round robin")
        for i, idx in enumerate(indexes):
            if idx.gaps:
                fail(f"replica {i}: {idx.gaps} gaps in the sequence numbers")
        # replay: the index rebuilt from the replay socket equals the live one
        for i, r in enumerate(replicas):
            ridx, n = replay_index(r.replay, ctx)
            if ridx.snapshot() != indexes[i].snapshot():
                fail(f"replica {i}: the replayed index differs from the live one")
            if n != indexes[i].last_seq + 1:
                fail(f"replica {i}: replayed {n} batches, live stream had {indexes[i].last_seq + 1}")
            text = http(r.base, "/metrics")
            if metric(text, "kvserve:kv_events_dropped_total") != 0:
                fail("events were dropped")
            if metric(text, "kvserve:kv_events_published_total") != n:
                fail(f"replica {i}: kvserve:kv_events_published_total {metric(text, 'kvserve:kv_events_published_total')} != {n}")
            for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                         "vllm:lora_requests_info", "vllm:cache_config_info", "vllm:prefix_cache_hits_total",
                         "vllm:prefix_cache_queries_total", "vllm:prompt_tokens_total"):
                if metric(text, name) is None:
                    fail(f"/metrics lacks {name}")
            if f'vllm:cache_config_info{{block_size="{BLOCK}",engine="0",num_gpu_blocks="40"}} 1' not in text:
                fail("vllm:cache_config_info does not report block_size and num_gpu_blocks")
            print(f"# replica {i}: replayed {n} batches = live; "
                  f"prefix hits {metric(text, 'vllm:prefix_cache_hits_total'):.0f} of "
                  f"{metric(text, 'vllm:prefix_cache_queries_total'):.0f} queried tokens")
    finally:
        for s in subs:
            s.close(0)
        ctx.term()
        codes = [r.stop() for r in replicas]
        shutil.rmtree(tmp, ignore_errors=True)
    if any(c != 0 for c in codes):
        fail(f"replica exit codes {codes}")
    print("PASS")


if __name__ == "__main__":
    main()
