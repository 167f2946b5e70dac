#!/bin/bash
# TTFT of a repeated long prompt after a restart (issue 29): recomputed by a server whose disk tier is empty, then
# served from the disk tier by a restarted server. The prompt is TOKENS token ids (max_tokens 1, temperature 0); the
# TTFT is the server's own (request log, ttft=). Usage: bench/tier_restart.sh [rounds]
#   MODEL (default /work/bench-models/bench-1b-q4_k_m.gguf), TOKENS (8000), THREADS (2), BIN (build/kvserve)
set -euo pipefail
MODEL=${MODEL:-/work/bench-models/bench-1b-q4_k_m.gguf}
TOKENS=${TOKENS:-8000}
THREADS=${THREADS:-2}
BIN=${BIN:-build/kvserve}
ROUNDS=${1:-1}
PORT=${PORT:-18733}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -c "import json; print(json.dumps({'model':'m','prompt':[100 + (i * 7919) % 20000 for i in range($TOKENS)],'max_tokens':1,'temperature':0}))" > "$work/body.json"

# one server life: start with the tier in $1, one request, stop; prints the request's ttft in ms and cached tokens
life() {
  "$BIN" serve -m "$MODEL" --port "$PORT" --threads "$THREADS" --parallel 1 --ctx-size $((TOKENS + 64)) \
    --batch-tokens 512 --kv-disk-dir "$1" --kv-disk-gb 20 > "$work/log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do curl -sf "localhost:$PORT/health" > /dev/null && break; sleep 0.2; done
  curl -sf "localhost:$PORT/v1/completions" -H 'content-type: application/json' -d @"$work/body.json" > "$work/out"
  sleep 1
  kill "$pid"; wait "$pid" || true
  local line; line=$(grep 'POST /v1/completions' "$work/log" | tail -1)
  echo "$2 ttft=$(sed -E 's/.*ttft=([0-9.]+)ms.*/\1/' <<< "$line") ms cached=$(sed -E 's/.*cached=([0-9]+).*/\1/' <<< "$line")"
}
for r in $(seq "$ROUNDS"); do
  rm -rf "$work/kv"
  life "$work/kv" "round $r recompute (empty tier):"
  life "$work/kv" "round $r after a restart (disk tier):"
done
