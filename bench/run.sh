#!/usr/bin/env bash
# Reproduces the figures in bench/RESULTS.md on this machine:
#   1. writes bench-135m (../shared/bench-model.md) with `kvserve mkmodel --preset bench-135m`, the gpt-2
#      vocabulary copied from ../shared/models/vocab-only (a built-in vocabulary when ../shared is absent),
#   2. `kvserve bench` (prefill 128 tokens, decode with 1/4/16/32 sequences), 2 threads,
#   3. `kvserve serve` with default settings and the load client: 1 client, 32 clients with distinct prompts,
#      32 clients sharing an 800-word prefix; 64 tokens each, temperature 0, ignore_eos.
# Usage: bench/run.sh [BUILD_DIR] [OUT_DIR]     (defaults: build, bench/out)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-bench/out}
bin=$build/kvserve
threads=${THREADS:-2}
mkdir -p "$out" models
[ -x "$bin" ] || { echo "bench: $bin not found: run 'make build' first" >&2; exit 1; }

shared=${KVSERVE_SHARED:-../shared}
model=models/bench-135m.gguf
if [ ! -f "$model" ]; then
  vocab=()
  if [ -f "$shared/models/vocab-only/ggml-vocab-gpt-2.gguf" ]; then
    vocab=(--vocab-from "$shared/models/vocab-only/ggml-vocab-gpt-2.gguf")
  else
    echo "bench: $shared absent: bench-135m gets the built-in vocabulary (its output layer is smaller)" >&2
  fi
  "$bin" mkmodel --preset bench-135m "${vocab[@]}" -o "$model"
fi

echo "== kvserve bench ($threads threads)"
"$bin" bench -m "$model" -p 128 -n 64 -b 1,4,16,32 --threads "$threads" --json | tee "$out/engine.json"

port=$((20000 + RANDOM % 20000))
"$bin" serve -m "$model" --threads "$threads" --port "$port" --log-format none 2>"$out/serve.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.2
done
url="http://127.0.0.1:$port"
# A short warm-up so first-touch page faults of the weights are not measured.
node bench/loadgen.mjs --url "$url" --clients 1 --tokens 8 >/dev/null

echo "== server: 1 client"
node bench/loadgen.mjs --url "$url" --clients 1 --tokens 64 --rounds 3 --json | tee "$out/server-1.json"
echo "== server: 32 clients, distinct prompts"
node bench/loadgen.mjs --url "$url" --clients 32 --tokens 64 --json | tee "$out/server-32.json"
echo "== server: 32 clients, shared 800-word prefix"
node bench/loadgen.mjs --url "$url" --clients 32 --tokens 64 --shared-prefix-words 800 --json \
  | tee "$out/server-32-prefix.json"
curl -fsS "$url/metrics" > "$out/metrics.txt"
echo "bench: results in $out"
