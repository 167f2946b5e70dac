#!/usr/bin/env bash
# spec_bench.sh: speculative decoding (n-gram / prompt lookup) on and off, the figures of bench/RESULTS.md
# "Speculative decoding". Usage: bash bench/spec_bench.sh [MODEL] [KVSERVE] [OUTDIR]
#   MODEL   default /work/bench-models/bench-1b-q4_k_m.gguf
#   KVSERVE default build/kvserve
# Workloads (prompts written into OUTDIR):
#   code    a code-editing request: server/sched/stop.c (about 1,670 tokens with the instruction) to be
#           rewritten with one rename; 1 stream, 128 tokens
#   self    the code prompt, the model's own greedy answer to it, then "The rewritten file, again:": a prompt
#           whose answer may repeat the model's own earlier output (1 stream, 128 tokens)
#   code32  32 streams of the code prompt (prefix-cached once), 64 tokens each
#   rand32  32 streams of 40 random words, 64 tokens each
# code runs off, on, off, on (alternating, so that a machine shared with other work hits both alike); the others
# off then on.
set -euo pipefail
MODEL=${1:-/work/bench-models/bench-1b-q4_k_m.gguf}
KV=${2:-build/kvserve}
OUT=${3:-$(mktemp -d /tmp/kvs_specbench_XXXXXX)}
SRC=$(cd "$(dirname "$0")/.." && pwd)/server/sched/stop.c
mkdir -p "$OUT"
python3 - "$SRC" "$OUT" <<'PY'
import json, random, sys
src, out = open(sys.argv[1]).read(), sys.argv[2]
p = ("Rewrite this C file, renaming the function srv_stop_push to srv_stop_feed and changing nothing else.\n\n"
     + src + "\n\nThe rewritten file:\n\n")
open(out + "/code.jsonl", "w").write(json.dumps(p) + "\n")
open(out + "/code32.jsonl", "w").write((json.dumps(p) + "\n") * 32)
random.seed(7)
letters = "abcdefghijklmnopqrstuvwxyz"
words = ["".join(random.choice(letters) for _ in range(random.randint(3, 8))) for _ in range(2000)]
open(out + "/rand32.jsonl", "w").write("".join(json.dumps(" ".join(random.choice(words) for _ in range(40))) + "\n"
                                             for _ in range(32)))
PY
gen() { # name file n spec
    local log="$OUT/$1-$4.log"
    "$KV" generate -m "$MODEL" -f "$OUT/$2" -n "$3" --threads 2 --spec-type "$4" --json >"$OUT/$1-$4.jsonl" 2>"$log"
    echo "$1 $4: $(grep -E 'decoded|speculative' "$log" | tr '\n' ' ')"
}
# the self-repeating prompt: the code prompt + the model's own greedy answer + the instruction again
gen code code.jsonl 128 none
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
p = json.loads(open(out + "/code.jsonl").readline())
ans = json.loads(open(out + "/code-none.jsonl").readline())["text"]
open(out + "/self.jsonl", "w").write(json.dumps(p + ans + "\n\nThe rewritten file, again:\n\n") + "\n")
PY
gen code code.jsonl 128 ngram
gen code code.jsonl 128 none
gen code code.jsonl 128 ngram
for w in self:self.jsonl:128 code32:code32.jsonl:64 rand32:rand32.jsonl:64; do
    IFS=: read -r name file n <<<"$w"
    for s in none ngram; do gen "$name" "$file" "$n" "$s"; done
    # the answers must not depend on speculation
    cmp -s "$OUT/$name-none.jsonl" "$OUT/$name-ngram.jsonl" && echo "$name: identical output on and off" ||
        echo "$name: OUTPUT DIFFERS"
done
echo "logs in $OUT"
