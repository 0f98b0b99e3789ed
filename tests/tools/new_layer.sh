#!/usr/bin/env bash
# The CTest "tools: new-layer writes a layer that builds and passes its tests":
#   1. tools/new-layer refuses a bad name and an existing layer (exit 2, a message);
#   2. it writes a layer into an empty temporary tree;
#   3. a small CMake project there builds the layer and its test against this build of attograd
#      (find_package(attograd) with attograd_DIR = the build directory) and doctest's main;
#   4. the test binary passes (its cases, the layer inside a TransformerBlock among them), its
#      PyTorch parity case is reported skipped, and run with --no-skip that case fails (it is not a
#      test that passes on nothing).
# Arguments: SOURCE_DIR BUILD_DIR CXX_COMPILER [COMPILER_LAUNCHER] [EXTRA_CXX_FLAGS]
set -euo pipefail

src="$1" build="$2" cxx="$3" launcher="${4:-}" flags="${5:-}"
work="$(mktemp -d "${TMPDIR:-/tmp}/attograd-new-layer.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() {
  echo "new-layer test: FAILED: $*" >&2
  exit 1
}
# expect STATUS FRAGMENT COMMAND...: runs the command, requires its exit status and the fragment
# in its output.
expect() {
  local want="$1" fragment="$2" rc=0 out
  shift 2
  out="$("$@" 2>&1)" || rc=$?
  echo "$out"
  ((rc == want)) || fail "'$*' exited $rc, expected $want"
  [[ "$out" == *"$fragment"* ]] || fail "'$*' did not print '$fragment'"
}

tree="$work/tree"
mkdir -p "$tree"
echo "== refusals"
expect 2 "is not a snake_case name" "$src/tools/new-layer" --root "$tree" GatedUnit
expect 2 "is not a snake_case name" "$src/tools/new-layer" --root "$tree" 2fast
[[ -z "$(ls -A "$tree")" ]] || fail "a refused name wrote files: $(ls -A "$tree")"

echo "== write the layer"
expect 0 "GatedCheck" "$src/tools/new-layer" --root "$tree" gated_check
for f in nn/gated_check.h nn/gated_check.cpp tests/nn/test_gated_check.cpp docs/layers/gated_check.md; do
  [[ -s "$tree/$f" ]] || fail "$f was not written"
done
expect 2 "refusing to overwrite" "$src/tools/new-layer" --root "$tree" gated_check

echo "== build it against this build of attograd"
{
  echo 'cmake_minimum_required(VERSION 3.25)'
  echo 'project(new_layer_check LANGUAGES CXX)'
  echo 'set(CMAKE_CXX_STANDARD 20)'
  echo 'set(CMAKE_CXX_STANDARD_REQUIRED ON)'
  echo 'find_package(attograd 0.1 REQUIRED)'
  echo 'find_package(doctest REQUIRED)'
  echo "add_executable(layer_tests nn/gated_check.cpp tests/nn/test_gated_check.cpp \"$src/tests/main.cpp\")"
  echo '# this tree first ("nn/gated_check.h"), then attograd'"'"'s headers ("nn/linear.h", "tests/helpers.h")'
  echo 'target_include_directories(layer_tests BEFORE PRIVATE ${CMAKE_SOURCE_DIR})'
  echo 'target_compile_options(layer_tests PRIVATE -Wall -Wextra -Wpedantic -Werror -Wno-unused-parameter)'
  echo 'target_link_libraries(layer_tests PRIVATE attograd::attograd doctest::doctest)'
} > "$tree/CMakeLists.txt"
config=(-S "$tree" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -Dattograd_DIR="$build" -DCMAKE_CXX_COMPILER="$cxx")
[[ -z "$launcher" ]] || config+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher")
[[ -z "$flags" ]] || config+=(-DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags")
cmake "${config[@]}" > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configure"; }
cmake --build "$work/build" -j 2 > "$work/build.log" 2>&1 || { cat "$work/build.log"; fail "build"; }

echo "== run its tests"
expect 0 "| 3 passed | 0 failed | 1 skipped" "$work/build/layer_tests"
expect 0 "GatedCheck: as the feed-forward of a TransformerBlock" "$work/build/layer_tests" --list-test-cases
echo "== the parity case, forced to run, fails on its empty reference"
expect 1 "1 failed" "$work/build/layer_tests" --no-skip -tc="GatedCheck: matches PyTorch"
echo "new-layer test: passed"
