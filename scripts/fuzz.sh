#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ (clang, ASan + UBSan) and runs each for a bounded
# time on a copy of its seed corpus, so the committed corpus never grows.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      SECONDS per target (default 20); TARGET: safetensors,
#                                              checkpoint, idx, ... (default: every tests/fuzz/fuzz_*.cpp)
#
# Prints one line per target: executions, exec/s, coverage (libFuzzer's cov: edges and ft:
# features at the end of the run), corpus size (seeds + what the run added) and crashes. Exits 1
# when any target found a crash, leak, timeout, out-of-memory or sanitizer report; its log and the
# reproducer (crash-*, leak-*, timeout-*, oom-*) stay under the work folder and are printed. Rerun a
# reproducer with:  <build>/tests/fuzz/fuzz_<target> <reproducer>
#
# Environment: FUZZ_BUILD (build folder, default build-fuzz), FUZZ_WORK (default <build>/fuzz-runs),
# FUZZ_JOBS (build parallelism, default 2), FUZZ_RSS_MB (default 2048), FUZZ_TIMEOUT (seconds one
# input may take, default 10). Needs clang and libomp (scripts/install-deps.sh --fuzz).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() { echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]" >&2; exit 2; }
seconds=20
if [[ $# -gt 0 ]]; then
  [[ "$1" =~ ^[0-9]+$ && "$1" -gt 0 ]] || usage
  seconds=$1
  shift
fi
build=${FUZZ_BUILD:-build-fuzz}
work=${FUZZ_WORK:-$build/fuzz-runs}
rss_mb=${FUZZ_RSS_MB:-2048}
timeout_s=${FUZZ_TIMEOUT:-10}

all=()
for f in tests/fuzz/fuzz_*.cpp; do
  n=$(basename "$f" .cpp)
  all+=("${n#fuzz_}")
done
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=("${all[@]}")
for t in "${targets[@]}"; do
  [[ -f tests/fuzz/fuzz_$t.cpp ]] || { echo "fuzz.sh: no target '$t' (have: ${all[*]})" >&2; exit 2; }
done

command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found: scripts/install-deps.sh --fuzz" >&2; exit 2; }
if [[ ! -f $build/CMakeCache.txt ]]; then
  # through ccache when installed (CMakeLists.txt, ATTOGRAD_CCACHE)
  CC=clang CXX=clang++ cmake -S . -B "$build" -DATTOGRAD_FUZZ=ON -DATTOGRAD_CUDA=OFF -DATTOGRAD_TESTS=OFF \
    -DATTOGRAD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build.configure.log" 2>&1 ||
    { cat "$build.configure.log" >&2; exit 1; }
fi
cmake --build "$build" -j"${FUZZ_JOBS:-2}" --target "${targets[@]/#/fuzz_}" >"$build/fuzz-build.log" 2>&1 ||
  { grep -E "error" "$build/fuzz-build.log" >&2 || tail -30 "$build/fuzz-build.log" >&2; exit 1; }

# halt on the first report of any sanitizer; leaks are reported by libFuzzer (-detect_leaks=1)
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:color=never}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:color=never}
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

failed=0
summary=()
for t in "${targets[@]}"; do
  dir=$work/$t
  rm -rf "$dir"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp tests/fuzz/corpus/"$t"/* "$dir/corpus/"
  seeds=$(ls "$dir/corpus" | wc -l)
  dict=()
  [[ -f tests/fuzz/$t.dict ]] && dict=(-dict="tests/fuzz/$t.dict")
  log=$dir/fuzz.log
  rc=0
  "$build/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -rss_limit_mb="$rss_mb" -timeout="$timeout_s" \
    -print_final_stats=1 -detect_leaks=1 -artifact_prefix="$dir/artifacts/" "${dict[@]}" "$dir/corpus" \
    >"$log" 2>&1 || rc=$?
  stat() { grep -m1 "^stat::$1:" "$log" | awk '{print $2}'; }
  execs=$(stat number_of_executed_units)
  rate=$(stat average_exec_per_sec)
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
  files=$(ls "$dir/corpus" | wc -l)
  kb=$(( $(du -sk "$dir/corpus" | cut -f1) ))
  mapfile -t repro < <(find "$dir/artifacts" -type f | sort)
  status=ok
  if [[ $rc -ne 0 || ${#repro[@]} -gt 0 ]]; then
    status="FAILED (exit $rc)"
    failed=1
  fi
  line=$(printf "fuzz_%-12s %10s execs  %7s exec/s  cov %5s  ft %6s  corpus %4s files (%s new, %s KB)  crashes %s  %s" \
    "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$files" "$((files - seeds))" "$kb" "${#repro[@]}" "$status")
  echo "$line"
  summary+=("$line")
  if [[ $status != ok ]]; then
    echo "--- $log (the report):" >&2
    grep -nE "ERROR|FINDING|SUMMARY|runtime error|Test unit written|deadly signal|timeout|out-of-memory" "$log" | head -20 >&2 || true
    for r in "${repro[@]}"; do echo "reproducer: $r  (rerun: $build/tests/fuzz/fuzz_$t $r)" >&2; done
  fi
done

echo
echo "fuzz.sh: ${#targets[@]} targets, $seconds s each (logs and corpora under $work)"
printf '%s\n' "${summary[@]}" >"$work/summary.txt"
exit $failed
