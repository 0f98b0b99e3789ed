#!/usr/bin/env bash
# Runs every benchmark of bench/ from a build directory (default: build) and prints their tables.
# bench_attention, bench_block and bench_train add a PyTorch column when a Python with torch is found
# ($ATTOGRAD_PYTHON, python3, /usr/bin/python3). On a machine shared with other jobs, export
# GOMP_SPINCOUNT=2000 first (docs/benchmarks.md, "OpenMP wait policy"). make compare runs the
# side-by-side comparison with PyTorch that the speed targets are measured with.
set -euo pipefail
build=${1:-build}
for b in bench_matmul bench_ops bench_alloc bench_optim bench_attention bench_block bench_checkpoint bench_train; do
  echo "== $b"
  "$build/$b"
  echo
done
