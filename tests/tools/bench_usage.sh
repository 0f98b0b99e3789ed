#!/usr/bin/env bash
# The CTest "bench: every tool answers bad usage with exit 2 and one line, --help with 0": each
# bench/ program given an option it does not have, a value its option refuses, and --help.
# Arguments: BUILD_DIR TOOL...
set -uo pipefail

build="$1"
shift
status=0
fail() {
  echo "bench usage test: FAILED: $*" >&2
  status=1
}
# expect WANT TOOL ARGS...: the tool's exit status must be WANT; for WANT 2 its stderr must be one
# line that names the tool.
expect() {
  local want="$1" tool="$2" rc=0 err
  shift 2
  err="$("$build/$tool" "$@" 2>&1 >/dev/null)" || rc=$?
  echo "$tool $*: exit $rc: $err"
  ((rc == want)) || fail "'$tool $*' exited $rc, expected $want"
  if ((want == 2)); then
    [[ "$err" == "$tool"* ]] || fail "'$tool $*' did not name itself: '$err'"
    (($(printf '%s\n' "$err" | wc -l) == 1)) || fail "'$tool $*' printed more than one line"
  fi
}
for tool in "$@"; do
  expect 2 "$tool" --no-such-option
  expect 0 "$tool" --help
done
# a value out of its option's range
expect 2 bench_decode --precision bf8
expect 2 bench_train --configs Q
expect 2 bench_train --paired
expect 2 bench_block --d 64 --heads 3
expect 2 bench_why_attention --kernel 1
expect 2 bench_decode --per-token --json
exit $status
