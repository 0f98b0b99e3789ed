#!/usr/bin/env bash
# Runs every benchmark of bench/ from a build directory (default: build) and prints their tables.
set -euo pipefail
build=${1:-build}
for b in bench_matmul bench_ops bench_alloc bench_attention bench_checkpoint; do
  echo "== $b"
  "$build/$b"
  echo
done
