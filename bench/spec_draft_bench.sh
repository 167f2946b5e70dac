#!/usr/bin/env bash
# spec_draft_bench.sh: speculative decoding with a draft model beside plain decoding, kvserve's n-gram lookup and
# llama.cpp's llama-speculative-simple / llama-lookup, in one run: the figures of bench/RESULTS.md "Speculative
# decoding with a draft model". Usage: bash bench/spec_draft_bench.sh [OUTDIR]
# Environment: MODEL (bench-1b-q4_k_m), DRAFT (see below), KV (build/kvserve), LLAMA (llama.cpp's bin/),
# STORIES (../shared/models/stories260K.gguf), N (tokens of the 1-stream runs, 64), N32 (of the 32-stream runs, 32).
# Workloads: `code` is bench/spec_bench.sh's code-editing request (server/sched/stop.c to be rewritten with one
# rename), 1 stream; `rand32` 32 streams of 40 random words; `stories` stories260K (trained) on a story opening,
# 1 stream, with the n-gram lookup and drafting for itself. Runs alternate (off, on, ..., off, on) so that a machine
# shared with other work hits both alike; every kvserve output must be the same with speculation on and off.
# The draft: bench-135m-q8_0 has another vocabulary than bench-1b (Llama 3's), so it cannot
# draft for it (the script shows kvserve refusing it); the default DRAFT is the bench-135m shape (SmolLM2-135M:
# 30 blocks, embd 576, q8_0, tied) written by `kvserve mkmodel --vocab-from` bench-1b, made here when missing.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODEL=${MODEL:-/work/bench-models/bench-1b-q4_k_m.gguf}
ORIG_DRAFT=/work/bench-models/bench-135m-q8_0.gguf
DRAFT=${DRAFT:-/work/bench-models/bench-135m-llama3vocab-draft.gguf}
KV=${KV:-$ROOT/build/kvserve}
LLAMA=${LLAMA:-/work/llama/src/build/bin}
STORIES=${STORIES:-$ROOT/../shared/models/stories260K.gguf}
N=${N:-64}
N32=${N32:-32}
OUT=${1:-$(mktemp -d /tmp/kvs_draftbench_XXXXXX)}
mkdir -p "$OUT"
python3 - "$ROOT/server/sched/stop.c" "$OUT" <<'PY'
import json, random, sys
src, out = open(sys.argv[1]).read(), sys.argv[2]
p = ("Rewrite this C file, renaming the function srv_stop_push to srv_stop_feed and changing nothing else.\n\n"
     + src + "\n\nThe rewritten file:\n\n")
open(out + "/code.jsonl", "w").write(json.dumps(p) + "\n")
open(out + "/code.txt", "w").write(p)
random.seed(7)
letters = "abcdefghijklmnopqrstuvwxyz"
words = ["".join(random.choice(letters) for _ in range(random.randint(3, 8))) for _ in range(2000)]
open(out + "/rand32.jsonl", "w").write("".join(json.dumps(" ".join(random.choice(words) for _ in range(40))) + "\n"
                                             for _ in range(32)))
open(out + "/stories.jsonl", "w").write(json.dumps("Once upon a time, there was a little girl named Lily. She loved to"
                                                   " play outside. One day,") + "\n")
PY
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -f "$ORIG_DRAFT" ]; then
    echo "bench-135m-q8_0 as a draft for $(basename "$MODEL"):"
    "$KV" generate -m "$MODEL" -md "$ORIG_DRAFT" -p "hello" -n 1 --threads 2 2>&1 >/dev/null | tail -1 || true
fi
[ -f "$DRAFT" ] || "$KV" mkmodel --preset bench-135m --vocab-from "$MODEL" -o "$DRAFT"
# the two models' vocabularies must agree (kvserve refuses a draft otherwise)
"$KV" generate -m "$MODEL" -md "$DRAFT" -p "hello" -n 1 --threads 2 >/dev/null 2>"$OUT/vocab.log" &&
    echo "vocabularies: $(basename "$DRAFT") and $(basename "$MODEL") agree" ||
    { echo "vocabularies differ:"; cat "$OUT/vocab.log"; exit 1; }

kv() { # tag model file n spec [extra...]
    local tag=$1 model=$2 file=$3 n=$4 spec=$5
    shift 5
    local log="$OUT/$tag.log"
    "$KV" generate -m "$model" -f "$OUT/$file" -n "$n" --threads 2 --spec-type "$spec" "$@" --json \
        >"$OUT/$tag.jsonl" 2>"$log"
    echo "kvserve $tag: $(grep -E 'decoded|speculative' "$log" | sed 's/kvserve generate: //' | tr '\n' ' ')"
}
same() { cmp -s "$OUT/$1.jsonl" "$OUT/$2.jsonl" && echo "  $1 = $2: identical output" || echo "  $1 != $2: OUTPUT DIFFERS"; }
ll() { # tag binary [args...]
    local tag=$1 bin=$2
    shift 2
    "$LLAMA/$bin" -m "$MODEL" -f "$OUT/code.txt" -n "$N" -t 2 -c 4096 --temp 0 -lv 4 "$@" >"$OUT/$tag.log" 2>&1 || true
    echo "llama.cpp $tag: $(grep -E 'decoded|n_drafted|n_accept|accept  ' "$OUT/$tag.log" | sed 's/^[0-9.]* I //' |
                            tr -s ' ' | tr '\n' ' ')"
}

echo "== code, 1 stream, $N tokens (bench-1b; draft bench-135m)"
kv code-none-1 "$MODEL" code.jsonl "$N" none
kv code-draft-1 "$MODEL" code.jsonl "$N" draft -md "$DRAFT"
kv code-ngram "$MODEL" code.jsonl "$N" ngram
ll llama-spec-simple llama-speculative-simple -md "$DRAFT" --spec-type draft-simple
ll llama-lookup llama-lookup
kv code-none-2 "$MODEL" code.jsonl "$N" none
kv code-draft-2 "$MODEL" code.jsonl "$N" draft -md "$DRAFT"
for t in code-draft-1 code-ngram code-none-2 code-draft-2; do same code-none-1 "$t"; done

echo "== self-draft sanity: bench-135m drafting for itself, code, 1 stream, $N tokens"
kv self-none "$DRAFT" code.jsonl "$N" none
kv self-draft "$DRAFT" code.jsonl "$N" draft -md "$DRAFT"
same self-none self-draft

echo "== rand32: 32 streams x $N32 tokens (bench-1b; draft bench-135m)"
kv rand-none-1 "$MODEL" rand32.jsonl "$N32" none
kv rand-draft-1 "$MODEL" rand32.jsonl "$N32" draft -md "$DRAFT"
kv rand-none-2 "$MODEL" rand32.jsonl "$N32" none
kv rand-draft-2 "$MODEL" rand32.jsonl "$N32" draft -md "$DRAFT"
for t in rand-draft-1 rand-none-2 rand-draft-2; do same rand-none-1 "$t"; done

if [ -f "$STORIES" ]; then
    echo "== stories260K (trained), 1 stream, 512 tokens"
    for r in 1 2; do
        kv "st-none-$r" "$STORIES" stories.jsonl 512 none
        kv "st-ngram-$r" "$STORIES" stories.jsonl 512 ngram
        kv "st-self-$r" "$STORIES" stories.jsonl 512 draft -md "$STORIES"
        kv "st-selffixed-$r" "$STORIES" stories.jsonl 512 draft -md "$STORIES" --spec-fixed --draft-max 8
    done
    for t in st-ngram-1 st-self-1 st-selffixed-1 st-none-2; do same st-none-1 "$t"; done
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "logs in $OUT"
