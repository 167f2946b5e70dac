#!/usr/bin/env python3
"""The 64-session benchmark of issue 29: SESSIONS long-prefix sessions (a PREFIX-token prefix of their own plus a
short TURN-token turn that changes every round), revisited round-robin by CLIENTS concurrent clients, against a KV
pool a quarter of their working set. The same workload runs three times, each on a fresh server: no tiers, the host
tier (kv_host_gb), the disk tier (kv_disk_dir). Round 1 fills the caches (every prefix is computed); rounds 2..ROUNDS
are measured: TTFT p50/p90 (client side: the request sent -> its first streamed token), requests/s and prompt
tokens/s over the measured rounds, and the prompt tokens each request found cached (usage.cached_tokens).

Usage: bench/tier_sessions.py [--bin build/kvserve] [--model M] [--sessions 64] [--prefix 1024] [--turn 32]
                              [--gen 8] [--rounds 2] [--clients 4] [--threads 2] [--configs none,host,disk]
Prompts are token ids (no tokenizer involved); temperature 0.
"""
import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ids(seed, n, vocab=20000):
    x = seed * 2654435761 % 4294967296 or 1
    out = []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2147483648
        out.append(100 + x % vocab)
    return out


def start(args, extra, workdir):
    port = free_port()
    log = open(os.path.join(workdir, "server.log"), "w")
    cmd = [args.bin, "serve", "-m", args.model, "--port", str(port), "--threads", str(args.threads),
           "--parallel", str(args.clients), "--ctx-size", str(args.prefix + args.turn * 2 + args.gen + 64),
           "--batch-tokens", "512", "--kv-blocks", str(args.pool_blocks)] + extra
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p, port
        except OSError:
            pass
        if p.poll() is not None:
            break
        time.sleep(0.2)
    p.kill()
    sys.exit("the server did not start: " + " ".join(cmd))


def one(port, prompt, gen):
    """One streamed completion: (ttft seconds, cached tokens, prompt tokens)."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": gen, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}, "ignore_eos": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"content-type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:300]}")
    ttft, usage = None, None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ttft is None and ev.get("choices") and ev["choices"][0].get("text"):
            ttft = time.perf_counter() - t0
        if ev.get("usage"):
            usage = ev["usage"]
    c.close()
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return ttft, cached, (usage or {}).get("prompt_tokens", len(prompt))


def run_config(args, name, extra):
    workdir = tempfile.mkdtemp(prefix=f"kvs-sessions-{name}-")
    try:
        extra = [e.replace("@DIR@", workdir) for e in extra]
        p, port = start(args, extra, workdir)
        rows = []
        lock = threading.Lock()
        try:
            for rnd in range(1, args.rounds + 1):
                todo = list(range(args.sessions))
                t0 = time.perf_counter()

                def worker():
                    while True:
                        with lock:
                            if not todo:
                                return
                            s = todo.pop(0)
                        prompt = ids(s + 1, args.prefix) + ids(1000003 * rnd + s, args.turn)
                        ttft, cached, n = one(port, prompt, args.gen)
                        with lock:
                            rows.append((rnd, s, ttft, cached, n))

                th = [threading.Thread(target=worker) for _ in range(args.clients)]
                for t in th:
                    t.start()
                for t in th:
                    t.join()
                wall = time.perf_counter() - t0
                rr = [x for x in rows if x[0] == rnd]
                print(f"  {name} round {rnd}: {wall:.1f} s, TTFT p50 {statistics.median(x[2] for x in rr) * 1000:.0f} ms, "
                      f"cached {sum(x[3] for x in rr)} of {sum(x[4] for x in rr)} prompt tokens", flush=True)
                rows_wall = (rnd, wall)
                rows.append(("wall",) + rows_wall)
            m = subprocess.run(["curl", "-s", f"http://127.0.0.1:{port}/metrics"], capture_output=True, text=True).stdout
            tiers = [l for l in m.splitlines() if l.startswith("kvserve:prefix_cache_tier_hits_total{")]
        finally:
            p.terminate()
            p.wait()
        meas = [x for x in rows if x[0] != "wall" and x[0] >= 2]
        walls = sum(x[2] for x in rows if x[0] == "wall" and x[1] >= 2)
        ttfts = sorted(x[2] for x in meas)
        return {"name": name, "p50": statistics.median(ttfts), "p90": ttfts[int(0.9 * (len(ttfts) - 1))],
                "rps": len(meas) / walls, "ptps": sum(x[4] for x in meas) / walls,
                "cached": sum(x[3] for x in meas) / max(1, sum(x[4] for x in meas)), "tiers": tiers}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/kvserve")
    ap.add_argument("--model", default="/work/bench-models/bench-135m-q8_0.gguf")
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--turn", type=int, default=32)
    ap.add_argument("--gen", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-bytes-per-token", type=int, default=23040,
                    help="bytes of K and V per token (bench-135m, f16: 30 layers x 2 x 3 heads x 64 x 2 bytes)")
    ap.add_argument("--configs", default="none,host,disk")
    args = ap.parse_args()
    per_session = args.prefix + args.turn + args.gen
    ws_blocks = args.sessions * -(-per_session // 16)
    args.pool_blocks = max(ws_blocks // 4, args.clients * (-(-per_session // 16) + 2))
    ws_gb = ws_blocks * 16 * args.kv_bytes_per_token / 1e9
    lower_gb = f"{ws_gb * 1.25:.3f}"
    print(f"# {args.sessions} sessions x ({args.prefix} + {args.turn} prompt + {args.gen} generated tokens): working set "
          f"{ws_blocks} blocks ({ws_gb:.2f} GB), pool {args.pool_blocks} blocks; {args.clients} clients, "
          f"{args.rounds} rounds (round 1 not measured); load average {os.getloadavg()[0]:.1f}", flush=True)
    configs = {"none": [], "host": ["--kv-host-gb", lower_gb],
               "disk": ["--kv-disk-dir", "@DIR@/kv", "--kv-disk-gb", lower_gb]}
    res = [run_config(args, c, configs[c]) for c in args.configs.split(",")]
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")
    print("| tiers | TTFT p50 | TTFT p90 | requests/s | prompt tok/s | prompt tokens cached |")
    print("|---|---|---|---|---|---|")
    for r in res:
        print(f"| {r['name']} | {r['p50'] * 1000:.0f} ms | {r['p90'] * 1000:.0f} ms | {r['rps']:.2f} | {r['ptps']:.0f} | "
              f"{r['cached'] * 100:.1f}% |")
    for r in res:
        print(f"# {r['name']}: " + "; ".join(r["tiers"]))


if __name__ == "__main__":
    main()
