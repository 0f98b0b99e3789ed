#!/usr/bin/env bash
# The one-call GPU check: on a machine with an NVIDIA GPU, builds attograd Release with CUDA from
# scratch, runs the GPU tests (every CTest case whose name says CUDA or GPU, in any case: CUDA
# against the CPU backend), then the GPU benchmarks beside PyTorch eager on the same GPU (bench/compare_gpu), and
# writes into OUT_DIR:
#   summary.txt, summary.json   the benchmark tables (compare_gpu) with the test counts added
#   tests.txt                   the GPU tests' CTest output
#   optim.txt                   AdamW multi-tensor vs per tensor (bench/bench_optim.cpp)
#   build.log, machine.txt      configure and build output; the commit, GPU, driver and versions
#
#   scripts/gpu-check.sh OUT_DIR [--profile]
#
# --profile builds bench_train, bench_attention and the test program only, runs that program's GPU
# cases (tests.txt) and, instead of the benchmarks, writes where the training steps' time goes
# (a few minutes in all):
#   profile.txt                 bench_train --profile: each config's kernels by time, ours
#                               (ag::KernelProfiler, core/profile.h) beside PyTorch's (torch.profiler),
#                               for V, G, C in fp32, G and L in bf16, L in fp32
#   profile.jsonl               our side of the same, one JSON line per run (bench_train --json)
#   ncu.txt                     Nsight Compute's speed-of-light section of the fused attention kernels
#                               at T 1024, where the machine lets ncu read its counters
#
# Needs on that machine: the CUDA toolkit (nvcc, cuBLAS), a C++20 compiler, CMake >= 3.25 and
# Python with PyTorch; ninja when present. The other build dependencies (OpenBLAS with its Fortran
# runtime, fmt, nlohmann-json, CLI11, doctest, zlib's headers) come from Debian 12's .deb files in
# .gpu-deps/ (made by scripts/gpu-deps.sh on a Debian machine, carried along), unpacked with
# `dpkg -x` into a private prefix inside the build folder: nothing is installed into the system.
# Without .gpu-deps/ the system's own packages are used. MPI is off in this build (dist/ is tested
# on the CPU). Budget: under 8 minutes on one H200 (16 cores), each step with its own limit:
# configure 60 s, build 270 s, GPU tests 60 s, benchmarks what is left of 420 s (compare_gpu
# --budget), then the optimizer benchmark 40 s; a step that runs out is reported as such and the
# summary is still written.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:?usage: scripts/gpu-check.sh OUT_DIR [--profile]}
profile=0
case "${2:-}" in
  --profile) profile=1 ;;
  "") ;;
  *) echo "gpu-check: unknown option '$2' (expected --profile)" >&2; exit 2 ;;
esac
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${GPU_BUILD:-build-gpu}
t0=$(date +%s)
say() { echo "[gpu-check $(($(date +%s) - t0)) s] $*"; }

command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { say "no nvcc on PATH or in /usr/local/cuda/bin"; exit 1; }
say "nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), $(c++ --version | head -1)"

# ---- dependencies from .gpu-deps/ ----------------------------------------------------------------
rm -rf "$build"
mkdir -p "$build"
deps_args=()
if compgen -G ".gpu-deps/*.deb" >/dev/null; then
  prefix=$(cd "$build" && pwd)/deps  # GPU_BUILD may be relative or absolute
  for f in .gpu-deps/*.deb; do dpkg -x "$f" "$prefix" || { say "cannot unpack $f"; exit 1; }; done
  lib=$prefix/usr/lib/x86_64-linux-gnu
  # Debian links libopenblas.so through update-alternatives, which dpkg -x does not run
  ln -sf libopenblas.so.0 "$lib/openblas-pthread/libopenblas.so"
  export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  deps_args=(-DCMAKE_PREFIX_PATH="$prefix/usr"
             -DCBLAS_INCLUDE_DIR="$prefix/usr/include/x86_64-linux-gnu/openblas-pthread"
             -DOPENBLAS_LIBRARY="$lib/openblas-pthread/libopenblas.so"
             -DZLIB_INCLUDE_DIR="$prefix/usr/include" -DZLIB_LIBRARY="$lib/libz.a")
  say "dependencies: $(ls .gpu-deps/*.deb | wc -l) Debian packages unpacked into $build/deps"
else
  say "dependencies: the system's (no .gpu-deps/; scripts/gpu-deps.sh makes it)"
fi

# ---- build ---------------------------------------------------------------------------------------
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
say "configure and build (Release, CUDA on)"
{
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
  echo "nvcc: $(nvcc --version | tail -1)"
  echo "cxx: $(c++ --version | head -1)"
  echo "torch: $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null || echo none)"
} >"$out/machine.txt"
cat "$out/machine.txt"
targets=()
((profile)) && targets=(--target bench_train bench_attention attograd_tests)
# this GPU's architecture only (GPU_CUDA_ARCHS overrides): the default build's sm_80 + sm_90 + PTX
# compiles every kernel three times, and CI compiles those already
if ! timeout 60 cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DATTOGRAD_CUDA=ON \
       -DCMAKE_CUDA_ARCHITECTURES="${GPU_CUDA_ARCHS:-native}" -DATTOGRAD_MPI=OFF "${deps_args[@]}" >"$out/build.log" 2>&1 ||
   ! timeout 270 cmake --build "$build" -j "$(nproc)" ${targets[@]+"${targets[@]}"} >>"$out/build.log" 2>&1; then
  say "build FAILED (the end of $out/build.log):"
  tail -40 "$out/build.log"
  echo "build failed" >"$out/summary.txt"
  exit 1
fi
say "built"

# ---- --profile: where the steps' time goes -----------------------------------------------------
if ((profile)); then
  : >"$out/profile.txt"
  : >"$out/profile.jsonl"
  # the GPU cases of the test program (doctest's filters ignore case; the app programs' GPU cases
  # need the apps, which this build leaves out: the full check runs them)
  say "profile: the GPU cases of attograd_tests"
  timeout 60 "$build/attograd_tests" -tc="*cuda*,*gpu*" >"$out/tests.txt" 2>&1
  say "  $(grep -E "^\[doctest\] test cases" "$out/tests.txt" | tail -1)"
  grep -E "ERROR|FAILED" "$out/tests.txt" | head -20
  # config list, precision, timed steps, profiled steps, time limit in seconds
  for run in "V,G,C fp32 10 5 60" "G bf16 10 5 30" "L bf16 5 2 60" "L fp32 3 2 60"; do
    read -r configs precision reps steps limit <<<"$run"
    say "profile: $configs $precision"
    args=(--device cuda --configs "$configs" --precision "$precision" --reps "$reps" --warmup 2 --profile "$steps")
    timeout "$limit" "$build/bench_train" "${args[@]}" --profile-top 20 >>"$out/profile.txt" 2>&1 ||
      say "  bench_train ${args[*]} failed or ran out of time (see profile.txt)"
    timeout $((limit / 2)) "$build/bench_train" "${args[@]}" --json >>"$out/profile.jsonl" 2>>"$out/profile.txt" ||
      say "  bench_train ${args[*]} --json failed or ran out of time"
  done
  # the fused attention kernels' speed of light (compute and memory throughput against the peaks),
  # where ncu can read the counters (on some machines it cannot: then the reason is in ncu.txt)
  say "profile: ncu on the fused attention at T 1024"
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [[ -n $ncu_bin ]]; then
    timeout 60 "$ncu_bin" --clock-control none --section SpeedOfLight --section Occupancy -k "regex:attention" -c 4 \
      "$build/bench_attention" --device cuda --batch 8 --heads 8 --T 1024 --d 64 --reps 1 --json >"$out/ncu.txt" 2>&1 ||
      say "  ncu failed or ran out of time (see ncu.txt)"
  else
    echo "no ncu on this machine" >"$out/ncu.txt"
  fi
  grep -E "^Kernel profile|attograd:|PyTorch:" "$out/profile.txt"
  say "done: $out/profile.txt, profile.jsonl, ncu.txt, tests.txt"
  exit 0
fi

# ---- GPU tests -------------------------------------------------------------------------------------
say "GPU tests"
# every case that names CUDA or a GPU in any case: CTest's -R is case-sensitive ("serialize: tensors
# on a GPU ..." and "cuda: ..." alike)
(cd "$build" && timeout 60 ctest -R "[Cc][Uu][Dd][Aa]|[Gg][Pp][Uu]" --output-on-failure --timeout 50 -j 4) >"$out/tests.txt" 2>&1
test_rc=$?
tests_line=$(grep -E "tests passed|tests failed" "$out/tests.txt" | tail -1)
skipped=$(grep -c "\*\*\*Skipped" "$out/tests.txt")
say "GPU tests: ${tests_line:-no result} ($skipped skipped)"
grep -E "\*\*\*Failed|\*\*\*Timeout|Exception" "$out/tests.txt" | head -40

# ---- GPU benchmarks ----------------------------------------------------------------------------
say "benchmarks beside PyTorch eager"
python3 bench/compare_gpu --build "$build" --out "$out" --timeout 90 --budget $((420 - ($(date +%s) - t0)))
bench_rc=$?
# the optimizer step, multi-tensor vs one launch per tensor (bench/bench_optim.cpp): the app GPT and
# the larger GPT's parameter lists
{
  timeout 15 "$build/bench_optim" --device cuda
  timeout 25 "$build/bench_optim" --device cuda --d-model 768 --layers 12 --vocab 50304 --context 1024 --reps 20
} >"$out/optim.txt" 2>&1
tee -a "$out/summary.txt" <"$out/optim.txt"
python3 - "$out" "$tests_line" "$skipped" "$test_rc" <<'EOF'
import json, sys
out, line, skipped, rc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
path = f"{out}/summary.json"
try:
    s = json.load(open(path))
except (OSError, ValueError):
    s = {}
s["gpu_tests"] = {"summary": line, "skipped": skipped, "ctest_exit": rc}
json.dump(s, open(path, "w"), indent=1)
with open(f"{out}/summary.txt", "a") as f:
    f.write(f"\nGPU tests: {line or 'no result'} ({skipped} skipped), ctest exit {rc}\n")
EOF
say "done: $out/summary.txt, summary.json, tests.txt, build.log"
[[ $test_rc -eq 0 && $bench_rc -eq 0 ]]
