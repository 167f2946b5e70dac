#!/usr/bin/env bash
# Runs every libFuzzer harness of a KVSERVE_FUZZ=ON build for SECONDS each (make fuzz: FUZZ_SECONDS, default 60)
# and prints executions, coverage (cov: edges, ft: features), corpus size and crashes per harness.
#   usage: fuzz/run.sh BUILD_DIR SECONDS [HARNESS...]
# Each harness starts from its seeds (fuzz/corpus/NAME, read only) and grows a working corpus in
# BUILD_DIR/fuzz-work/NAME/corpus; crashing inputs land in BUILD_DIR/fuzz-work/NAME/ (crash-*, leak-*,
# timeout-*). A fixed crash's input belongs in fuzz/corpus/NAME/ as a regression (make test runs it).
# Exit status 1 when any harness found a crash.
set -uo pipefail
build=${1:?usage: fuzz/run.sh BUILD_DIR SECONDS [HARNESS...]}
secs=${2:?usage: fuzz/run.sh BUILD_DIR SECONDS [HARNESS...]}
shift 2
build=$(cd "$build" && pwd) || exit 1
src=$(cd "$(dirname "$0")" && pwd)
if [ $# -gt 0 ]; then harnesses=("$@"); else
  harnesses=()
  for f in "$src"/fuzz_*.c; do n=$(basename "$f" .c); harnesses+=("${n#fuzz_}"); done
fi
export KVSERVE_SHARED=${KVSERVE_SHARED:-$src/../../shared}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
status=0
summary=()
for h in "${harnesses[@]}"; do
  bin=$build/fuzz/fuzz_$h
  if [ ! -x "$bin" ]; then echo "fuzz: $bin is not built (configure with -DKVSERVE_FUZZ=ON)" >&2; status=1; continue; fi
  work=$build/fuzz-work/$h
  mkdir -p "$work/corpus"
  log=$work/last.log
  echo "fuzz: $h for ${secs}s ..." >&2
  (cd "$work" && "$bin" -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$work/" corpus "$src/corpus/$h") >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  line=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(echo "$line" | grep -o 'cov: [0-9]*' | grep -o '[0-9]*')
  ft=$(echo "$line" | grep -o 'ft: [0-9]*' | grep -o '[0-9]*')
  corp=$(echo "$line" | grep -o 'corp: [0-9]*' | grep -o '[0-9]*')
  crashes=$(ls "$work" | grep -cE '^(crash|leak|timeout|oom)-' || true)
  summary+=("$(printf '%-10s execs %10s  cov %6s  ft %7s  corpus %6s  crashes %s%s' "$h" "${execs:-?}" "${cov:-?}" \
    "${ft:-?}" "${corp:-?}" "$crashes" "$([ $rc -ne 0 ] && echo "  (exit $rc: see $log)")")")
  if [ $rc -ne 0 ] || [ "$crashes" -gt 0 ]; then status=1; fi
done
printf '%s\n' "${summary[@]}"
exit $status
