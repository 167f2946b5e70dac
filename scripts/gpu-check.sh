#!/usr/bin/env bash
# gpu-check.sh: the checks that need an NVIDIA GPU, in one run (no make needed).
#   1. builds with CUDA ON into build-cuda (KVSERVE_CUDA_ARCHS overrides the architectures, e.g. "90")
#   2. test_cuda_engine (dequantization bit-exactness GPU vs CPU, GPU-vs-CPU logits, batch scripts), with CUDA
#      graphs and again without (KVSERVE_CUDA_GRAPHS=0) and without the f16 weight copies
#      (KVSERVE_CUDA_F16_CACHE=0), and test_reference on the GPU (KVSERVE_TEST_DEVICE=cuda)
#   3. the same under compute-sanitizer memcheck when it is installed (a subset; MEMCHECK_FULL=1: everything)
#   4. greedy `kvserve generate` on stories260K on the CPU and on the GPU (the texts should match)
#   5. `kvserve bench --device cuda --json` on mkmodel's bench-135m (gpt-2 vocabulary) and llama-1b (llama-bpe
#      vocabulary); the JSON lines also go to $OUT/gpu-bench.json when OUT is set (BENCH=0 skips this step)
# The shared test material is $KVSERVE_SHARED, else ./shared or ../shared. Exit status: 0 when every step
# passed, 1 otherwise (every step runs regardless).
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1
JOBS=${JOBS:-$(nproc)}
ARCHS=${KVSERVE_CUDA_ARCHS:-80;86;89;90}
if [ -z "${KVSERVE_SHARED:-}" ]; then
    for d in shared ../shared; do
        if [ -d "$d/models" ]; then KVSERVE_SHARED=$(cd "$d" && pwd); break; fi
    done
fi
export KVSERVE_SHARED=${KVSERVE_SHARED:-}
status=0
fail() { echo "!! FAILED: $*"; status=1; }
step() { echo; echo "== $* ($(date -u +%H:%M:%S))"; }

step "GPU"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null ||
    echo "nvidia-smi not available"
echo "shared test material: ${KVSERVE_SHARED:-<none>}"

step "build (CUDA ON, archs $ARCHS)"
mkdir -p build-cuda
if ! cmake -S . -B build-cuda -DKVSERVE_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS" >build-cuda/configure.log 2>&1; then
    cat build-cuda/configure.log
    echo "!! configure failed"
    exit 1
fi
if ! cmake --build build-cuda -j"$JOBS" 2>&1 | tee build-cuda/build.log | grep -E "warning|error" ; then :; fi
if [ ! -x build-cuda/kvserve ] || [ ! -x build-cuda/test_cuda_engine ] || [ ! -x build-cuda/test_reference ]; then
    tail -40 build-cuda/build.log
    echo "!! build failed"
    exit 1
fi
B=build-cuda

step "test_cuda_engine (CUDA graphs on)"
"$B/test_cuda_engine" -j1 --verbose 2>&1 | grep -v "^\[RUN" || fail test_cuda_engine
step "test_cuda_engine (CUDA graphs off)"
KVSERVE_CUDA_GRAPHS=0 "$B/test_cuda_engine" -j1 --verbose --filter 'cuda_engine/script*' 2>&1 | grep -v "^\[RUN" ||
    fail "test_cuda_engine without graphs"
step "test_cuda_engine scripts (per-product weight dequantization: KVSERVE_CUDA_F16_CACHE=0)"
KVSERVE_CUDA_F16_CACHE=0 "$B/test_cuda_engine" -j1 --verbose --filter 'cuda_engine/script*' 2>&1 | grep -v "^\[RUN" ||
    fail "test_cuda_engine without the f16 weight cache"
step "test_reference on the GPU"
KVSERVE_TEST_DEVICE=cuda "$B/test_reference" -j1 --verbose 2>&1 | grep -v "^\[RUN" || fail "test_reference (cuda)"

CS=$(command -v compute-sanitizer || true)
[ -z "$CS" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && CS=/usr/local/cuda/bin/compute-sanitizer
if [ -n "$CS" ]; then
    MC=("$CS" --tool memcheck --error-exitcode 97 --target-processes all --leak-check full)
    F1='cuda_engine/script_llama_f32*' F2='reference/stories260K*'
    if [ "${MEMCHECK_FULL:-0}" = 1 ]; then F1='*' F2='*'; fi
    step "compute-sanitizer memcheck: test_cuda_engine ($F1)"
    "${MC[@]}" "$B/test_cuda_engine" -j1 --filter "$F1" 2>&1 | tail -25 || fail "memcheck test_cuda_engine"
    step "compute-sanitizer memcheck: test_reference on the GPU ($F2)"
    KVSERVE_TEST_DEVICE=cuda "${MC[@]}" "$B/test_reference" -j1 --filter "$F2" 2>&1 | tail -25 ||
        fail "memcheck test_reference"
else
    step "compute-sanitizer not found: memcheck skipped"
fi

if [ -n "$KVSERVE_SHARED" ] && [ -f "$KVSERVE_SHARED/models/stories260K.gguf" ]; then
    step "greedy generate on stories260K, CPU vs GPU"
    for dev in cpu cuda; do
        "$B/kvserve" generate -m "$KVSERVE_SHARED/models/stories260K.gguf" -p "Once upon a time" -n 48 --device "$dev" \
            >"$B/gen-$dev.txt" 2>"$B/gen-$dev.err" || fail "generate --device $dev"
        echo "--- $dev:"; cat "$B/gen-$dev.txt" "$B/gen-$dev.err"
    done
    cmp -s "$B/gen-cpu.txt" "$B/gen-cuda.txt" && echo "identical texts" || echo "texts differ (see above)"
fi

bench_json=()
BENCH_SPECS=("bench-135m ggml-vocab-gpt-2.gguf" "llama-1b ggml-vocab-llama-bpe.gguf")
if [ "${BENCH:-1}" = 0 ]; then BENCH_SPECS=(); fi
step "bench on the GPU (${#BENCH_SPECS[@]} models; BENCH=0 skips)"
mkdir -p "$B/models"
for spec in "${BENCH_SPECS[@]}"; do
    read -r name vocab_file <<<"$spec"
    model="$B/models/$name.gguf" vocab="$KVSERVE_SHARED/models/vocab-only/$vocab_file"
    if [ ! -f "$vocab" ]; then echo "$vocab not found: $name skipped"; fail "bench $name (no vocabulary)"; continue; fi
    if [ ! -f "$model" ] && ! "$B/kvserve" mkmodel --preset "$name" --vocab-from "$vocab" -o "$model"; then
        fail "mkmodel $name"
        continue
    fi
    line=$("$B/kvserve" bench -m "$model" --device cuda -p 512 -n 64 -b 1,4,16,32,64 --json) ||
        { fail "bench $name"; continue; }
    echo "$line"
    bench_json+=("$line")
done
if [ -n "${OUT:-}" ] && [ ${#bench_json[@]} -gt 0 ]; then printf '%s\n' "${bench_json[@]}" >"$OUT/gpu-bench.json"; fi

step "done: $([ $status = 0 ] && echo 'all passed' || echo 'FAILURES above')"
exit $status
