#!/usr/bin/env bash
# Checks that attograd installs and can be consumed by an outside project:
#   1. configures a Release build of the library (CUDA, tests and benchmarks off) in a temp dir,
#   2. `cmake --install`s it into a temp prefix,
#   3. configures and builds examples/consumer/ against that prefix (find_package(attograd)),
#   4. runs the consumer (a few training steps and ag::testing::gradcheck),
#   5. configures, builds and tests examples/extending (docs/extending.md) against the prefix.
# Exits non-zero at the first failure. Uses ccache when installed. Keeps nothing: everything
# happens under one temp dir, removed on exit (KEEP=1 keeps it and prints where it is).
#
#   scripts/check-install.sh            JOBS=<n> to set the build parallelism (default: nproc)
set -euo pipefail

src="$(cd "$(dirname "$0")/.." && pwd)"
jobs="${JOBS:-$(nproc)}"
work="$(mktemp -d "${TMPDIR:-/tmp}/attograd-check-install.XXXXXX")"
if [[ "${KEEP:-0}" == 1 ]]; then
  trap 'echo "check-install: kept $work"' EXIT
else
  trap 'rm -rf "$work"' EXIT
fi

launcher=()
if command -v ccache > /dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi

step() { echo "== check-install: $*"; }
# Runs a step quietly; on failure prints its log and exits with its status.
quiet() {
  local log="$work/step.log" rc=0
  "$@" > "$log" 2>&1 || rc=$?
  if ((rc != 0)); then
    cat "$log"
    echo "check-install: FAILED (exit $rc): $*" >&2
    exit "$rc"
  fi
}

start=$SECONDS
step "configure the library (Release, CUDA off, tests and benchmarks off)"
quiet cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DATTOGRAD_CUDA=OFF \
  -DATTOGRAD_TESTS=OFF -DATTOGRAD_BENCH=OFF "${launcher[@]}"
step "build the library"
# Only the library, one static library per layer (and the layer link checks, which fail on a call
# that runs up a layer): the apps are not installed, so they need not be built.
layers=(core autograd nn optim training data dist)
quiet cmake --build "$work/build" -j "$jobs" --target "${layers[@]/#/attograd_}" "${layers[@]/#/layer_check_}"
step "install into $work/prefix"
quiet cmake --install "$work/build" --prefix "$work/prefix"
# What an outside project sees: the package files, a library per layer and the header tree,
# nothing of apps/.
libs=()
for l in "${layers[@]}"; do libs+=("lib/libattograd_$l.a"); done
for f in lib/cmake/attograd/attogradConfig.cmake lib/cmake/attograd/attogradConfigVersion.cmake \
         lib/cmake/attograd/attogradTargets.cmake "${libs[@]}" include/attograd/attograd.h \
         include/attograd/autograd/testing.h include/attograd/core/tensor.h include/attograd/nn/linear.h \
         include/attograd/optim/adam.h include/attograd/training/checkpoint.h include/attograd/data/loader.h \
         include/attograd/core/dispatch.h include/attograd/cuda/memory.h; do
  [[ -f "$work/prefix/$f" ]] || { echo "check-install: FAILED: $f is not installed" >&2; exit 1; }
done
[[ ! -e "$work/prefix/include/attograd/apps" ]] || { echo "check-install: FAILED: apps/ was installed" >&2; exit 1; }

step "configure and build examples/consumer against the install"
quiet cmake -S "$src/examples/consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" "${launcher[@]}"
quiet cmake --build "$work/consumer" -j "$jobs"
step "run the consumer"
"$work/consumer/consumer"

# docs/extending.md's example (a new op with its kernels, a new layer, their doctest tests) as
# an outside project: the same sources that build inside attograd's tree, here through the package.
step "configure, build and test examples/extending against the install"
quiet cmake -S "$src/examples/extending" -B "$work/extending" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" "${launcher[@]}"
quiet cmake --build "$work/extending" -j "$jobs"
(cd "$work/extending" && OMP_WAIT_POLICY=PASSIVE ctest --output-on-failure -j "$jobs") > "$work/step.log" 2>&1 ||
  { cat "$work/step.log"; echo "check-install: FAILED: the tests of examples/extending" >&2; exit 1; }
grep -E "tests passed" "$work/step.log" | sed 's/^/  /' || true
step "passed in $((SECONDS - start)) s"
