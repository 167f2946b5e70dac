#!/usr/bin/env bash
# Reproduces the figures in bench/RESULTS.md on this machine:
#   1. writes bench-135m (../shared/bench-model.md) with `kvserve mkmodel --preset bench-135m`, the gpt-2
#      vocabulary copied from ../shared/models/vocab-only (a built-in vocabulary when ../shared is absent),
#   2. `kvserve bench` (prefill 128 tokens, decode with 1/4/16/32 sequences), 2 threads,
#   3. `kvserve serve` with default settings and the load client: 1 client, 32 clients with distinct prompts,
#      32 clients sharing an 800-word prefix; 64 tokens each, temperature 0, ignore_eos.
# Usage: bench/run.sh [--models LIST] [BUILD_DIR] [OUT_DIR]     (defaults: build, bench/out)
#   --models LIST   instead of the run above, `kvserve bench -p 128 -n 64 -b 1,4,16,32` on each listed model
#                   (comma-separated, or `all`): bench-135m-q8_0, bench-135m-q4_k_m, bench-1b-q8_0,
#                   bench-1b-q4_k_m, bench-1b-q5_k_m, bench-1b-q6_k (the table of issue 9). Missing models are
#                   made under models/ with `kvserve mkmodel` (f16) and `kvserve quantize`; the f16 files are
#                   deleted afterwards unless KEEP_F16=1. Results: OUT_DIR/engine-<model>.json.
#                   Also settable as BENCH_MODELS=LIST.
set -euo pipefail
cd "$(dirname "$0")/.."
models_arg=${BENCH_MODELS:-}
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models_arg=${2:?--models needs a list}; shift 2 ;;
    --models=*) models_arg=${1#--models=}; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
build=${args[0]:-build}
out=${args[1]:-bench/out}
bin=$build/kvserve
threads=${THREADS:-2}
mkdir -p "$out" models
[ -x "$bin" ] || { echo "bench: $bin not found: run 'make build' first" >&2; exit 1; }

shared=${KVSERVE_SHARED:-../shared}

# Sets vocab_opts to the --vocab-from option for a vocabulary file of ../shared (empty, with a warning, when
# ../shared is absent: mkmodel's built-in vocabulary, a smaller output layer).
vocab_opts=()
set_vocab() {
  vocab_opts=()
  if [ -f "$shared/models/vocab-only/$1" ]; then
    vocab_opts=(--vocab-from "$shared/models/vocab-only/$1")
  else
    echo "bench: $shared absent: the built-in vocabulary replaces $1 (a smaller output layer)" >&2
  fi
}

model=models/bench-135m.gguf
make_bench_135m() {
  [ -f "$model" ] && return
  set_vocab ggml-vocab-gpt-2.gguf
  "$bin" mkmodel --preset bench-135m "${vocab_opts[@]}" -o "$model"
}

# models/<name>.gguf for a name of the list, made when missing (an f16 model from mkmodel, then quantize).
made_f16=()
ensure_model() {
  local name=$1 base type f16 vfile mk
  case "$name" in
    bench-135m-q8_0) make_bench_135m; return ;;
    bench-135m-*) base=bench-135m; vfile=ggml-vocab-gpt-2.gguf; mk=(--preset bench-135m --type f16) ;;
    bench-1b-*) base=bench-1b; vfile=ggml-vocab-llama-bpe.gguf; mk=(--preset bench-1b) ;;
    *) echo "bench: unknown model '$name'" >&2; exit 2 ;;
  esac
  type=${name#"$base"-}
  case "$type" in
    q8_0|q4_0|q4_k_m|q4_k_s|q5_k_m|q5_k_s|q6_k) ;;
    *) echo "bench: unknown type in '$name'" >&2; exit 2 ;;
  esac
  [ -f "models/$name.gguf" ] && return
  f16=models/$base-f16.gguf
  if [ ! -f "$f16" ]; then
    set_vocab "$vfile"
    nice -n 10 "$bin" mkmodel "${mk[@]}" "${vocab_opts[@]}" -o "$f16"
    made_f16+=("$f16")
  fi
  nice -n 10 "$bin" quantize "$f16" "models/$name.gguf" "${type^^}" --threads "$threads"
}

if [ -n "$models_arg" ]; then
  all=bench-135m-q8_0,bench-135m-q4_k_m,bench-1b-q8_0,bench-1b-q4_k_m,bench-1b-q5_k_m,bench-1b-q6_k
  [ "$models_arg" = all ] && models_arg=$all
  IFS=, read -r -a names <<< "$models_arg"
  for name in "${names[@]}"; do ensure_model "$name"; done
  if [ "${KEEP_F16:-0}" != 1 ]; then
    for f in "${made_f16[@]}"; do rm -f "$f"; done
  fi
  for name in "${names[@]}"; do
    file=models/$name.gguf
    [ "$name" = bench-135m-q8_0 ] && file=$model
    echo "== kvserve bench $name ($(du -h "$file" | cut -f1), $threads threads)"
    "$bin" bench -m "$file" -p 128 -n 64 -b 1,4,16,32 --threads "$threads" --json | tee "$out/engine-$name.json"
  done
  echo "bench: results in $out"
  exit 0
fi

make_bench_135m

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
