#!/usr/bin/env bash
# gpu-kit-run.sh KIT OUT: the GPU checks of issue 23 on a machine that cannot build kvserve (see
# ../shared/gpu/README.md). Builds nothing. KIT is a folder made by ../shared/gpu/pack.sh (bin/ with kvserve and
# the test binaries, lib/ with their shared libraries, shared/ with the test models and vocabularies); this
# script may be copied into it. Every figure and log goes to OUT:
#   run.log                 everything printed
#   fattn-selftest.log      test_cuda_fattn_gpu (when the kit has it: pack.sh with TESTS="test_cuda_engine
#                           test_reference test_cuda_fattn_gpu"): mma.sync against its host emulation, k_fattn
#                           against a softmax in double
#   tests-{new,old,attn-old,fattn-old}.log  test_cuda_engine and test_reference on the GPU, CUDA graphs on, per
#                           kernel path: new (the new decode products, the split-KV attention, the tensor-core
#                           prefill attention), old (all old: KVSERVE_CUDA_MMV=old KVSERVE_CUDA_ATTN=old
#                           KVSERVE_CUDA_FATTN=old), attn-old (new products, old decode attention), fattn-old
#                           (everything new but the prefill attention);
#                           graphs-off.log and graphs-off-attn-old.log once more without graphs
#   gen-{cpu,cuda-new,cuda-old,cuda-attn-old}.txt   greedy stories260K text (must be identical)
#   bench.jsonl             `kvserve bench --device cuda --json` per model and kernel path ("file", "path" fields);
#                           each line has decode_bytes_per_token, read_gb_s (device copy) and decode_limit_tok_s;
#                           "ctx": "long" lines are -p 4000 -n 64 (attention reads dominate more) on new and attn-old
# Steps that fail are reported and the run goes on; exit status 1 when any failed.
set -u
KIT=$(cd "${1:?usage: gpu-kit-run.sh KIT OUT}" && pwd)
OUT=${2:?usage: gpu-kit-run.sh KIT OUT}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/run.log") 2>&1
status=0
fail() { echo "!! FAILED: $*"; status=1; }
t0=$(date +%s); step() { echo; echo "== [t+$(( $(date +%s) - t0 ))s] $*"; }
# kernel paths: the environment each one runs with
PATHS="new old attn-old fattn-old"
path_env() {
    case $1 in
        new) echo "KVSERVE_CUDA_MMV=new KVSERVE_CUDA_ATTN=new KVSERVE_CUDA_FATTN=new" ;;
        old) echo "KVSERVE_CUDA_MMV=old KVSERVE_CUDA_ATTN=old KVSERVE_CUDA_FATTN=old" ;;
        attn-old) echo "KVSERVE_CUDA_MMV=new KVSERVE_CUDA_ATTN=old KVSERVE_CUDA_FATTN=new" ;;
        fattn-old) echo "KVSERVE_CUDA_MMV=new KVSERVE_CUDA_ATTN=new KVSERVE_CUDA_FATTN=old" ;;
    esac
}

step "GPU"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || fail nvidia-smi
CUL=$(dirname "$(find / -name 'libcublas.so.1*' -not -path '/proc/*' 2>/dev/null | head -n 1)")
export LD_LIBRARY_PATH="$KIT/lib:$CUL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KVSERVE_SHARED=$KIT/shared KVSERVE_BIN=$KIT/bin/kvserve
B=$KIT/bin M=$KIT/shared/models W=$(mktemp -d /tmp/kvs-gpu-XXXXXX)
ldd "$B/kvserve" | grep "not found" && fail "missing shared libraries (above)"

if [ -f "$M/synthetic/syn-llama-f16.gguf" ]; then
    step "quantize the synthetic llama (Q8_0, Q4_0, Q4_K_M, Q6_K) for test_reference"
    for q in Q8_0 Q4_0 Q4_K_M Q6_K; do lq=$(echo $q | tr A-Z a-z)
        [ -f "$M/synthetic/syn-llama-$lq.gguf" ] ||
            "$B/kvserve" quantize "$M/synthetic/syn-llama-f16.gguf" "$M/synthetic/syn-llama-$lq.gguf" $q >/dev/null ||
            fail "quantize $q"
    done
fi

if [ -x "$B/test_cuda_fattn_gpu" ]; then
    step "tensor-core attention self-test (mma.sync against the host emulation, k_fattn against the host)"
    timeout 120 "$B/test_cuda_fattn_gpu" -j1 --verbose >"$OUT/fattn-selftest.log" 2>&1 || fail "test_cuda_fattn_gpu"
    grep -E "^\[(FAIL|----|====)\]" "$OUT/fattn-selftest.log" | tail -5
fi

for path in $PATHS; do
    step "CUDA tests, kernel path: $path ($(path_env $path))"
    for t in test_cuda_engine test_reference; do
        [ -x "$B/$t" ] || { echo "$t not in the kit"; continue; }
        env $(path_env $path) KVSERVE_TEST_DEVICE=cuda timeout 300 "$B/$t" -j1 --verbose >>"$OUT/tests-$path.log" 2>&1 ||
            fail "$t ($path)"
        grep -E "^\[(FAIL|====)\]" "$OUT/tests-$path.log" | tail -5
    done
done
if [ -x "$B/test_cuda_engine" ]; then
    for path in new attn-old; do
        log=$OUT/graphs-off$([ $path = new ] || echo "-$path").log
        step "test_cuda_engine without CUDA graphs ($path)"
        env $(path_env $path) KVSERVE_CUDA_GRAPHS=0 timeout 300 "$B/test_cuda_engine" -j1 --verbose >"$log" 2>&1 ||
            fail "test_cuda_engine without graphs ($path)"
        grep -E "^\[(FAIL|====)\]" "$log" | tail -5
    done
fi

if [ -f "$M/stories260K.gguf" ]; then
    step "greedy stories260K: CPU and GPU on every kernel path"
    "$B/kvserve" generate -m "$M/stories260K.gguf" -p "Once upon a time" -n 48 --device cpu >"$OUT/gen-cpu.txt" 2>/dev/null
    for path in $PATHS; do
        env $(path_env $path) "$B/kvserve" generate -m "$M/stories260K.gguf" -p "Once upon a time" -n 48 \
            --device cuda >"$OUT/gen-cuda-$path.txt" 2>/dev/null || fail "generate cuda $path"
        cmp -s "$OUT/gen-cpu.txt" "$OUT/gen-cuda-$path.txt" && echo "$path: identical to the CPU" ||
            fail "stories260K text differs ($path)"
    done
fi

step "bench models"
V=$M/vocab-only
"$B/kvserve" mkmodel --preset bench-135m --vocab-from "$V/ggml-vocab-gpt-2.gguf" -o "$W/b135-q8_0.gguf" >/dev/null ||
    fail "mkmodel bench-135m"
if "$B/kvserve" mkmodel --preset bench-1b --type f16 --vocab-from "$V/ggml-vocab-llama-bpe.gguf" -o "$W/b1b-f16.gguf" >/dev/null; then
    for q in Q8_0 Q4_K_M; do lq=$(echo $q | tr A-Z a-z)
        "$B/kvserve" quantize "$W/b1b-f16.gguf" "$W/b1b-$lq.gguf" $q >/dev/null || fail "quantize bench-1b $q"
    done
else
    fail "mkmodel bench-1b"
fi
for m in b1b-q4_k_m b1b-q8_0 b1b-f16 b135-q8_0; do
    [ -f "$W/$m.gguf" ] || continue
    for path in $PATHS; do
        step "kvserve bench $m ($path)"
        env $(path_env $path) timeout 120 "$B/kvserve" bench -m "$W/$m.gguf" --device cuda -p 512 -n 128 -b 1,2,4,8,16,64 \
            --json | sed "s/^{/{\"file\":\"$m\",\"path\":\"$path\",/" | tee -a "$OUT/bench.jsonl" || fail "bench $m $path"
    done
done
# A long context, where the attention's KV reads weigh more: split-KV against the old attention, and the
# 4000-token prefill with the tensor-core attention (new) against the old kernel (fattn-old).
for m in b1b-q4_k_m b135-q8_0; do
    [ -f "$W/$m.gguf" ] || continue
    for path in new attn-old fattn-old; do
        step "kvserve bench $m, 4000-token prompt ($path)"
        env $(path_env $path) timeout 180 "$B/kvserve" bench -m "$W/$m.gguf" --device cuda -p 4000 -n 64 -b 1,8,16 \
            --json | sed "s/^{/{\"file\":\"$m\",\"path\":\"$path\",\"ctx\":\"long\",/" | tee -a "$OUT/bench.jsonl" ||
            fail "bench $m long $path"
    done
done
rm -rf "$W"
step "done: $([ $status = 0 ] && echo 'all passed' || echo 'FAILURES above')"
exit $status
