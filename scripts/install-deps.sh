#!/usr/bin/env bash
# Installs the Debian packages attograd needs to build, test and run its demo; with --bench also
# what bench/compare_pytorch needs for its PyTorch side (a venv for pip's torch, tcmalloc); with
# --fuzz what scripts/fuzz.sh needs (clang with libFuzzer and its sanitizers, clang's OpenMP).
# Idempotent: prints nothing and exits 0 when everything is already installed.
# Without root (and without passwordless sudo) it prints the exact apt-get line and exits 1.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libopenblas-dev      # BLAS (sgemm/dgemm) for matmul
  libfmt-dev           # formatting of tensors and errors
  doctest-dev          # unit tests
  zlib1g-dev           # gzip-compressed datasets
  libcli11-dev         # command-line parsing in apps and benchmarks
  nlohmann-json3-dev   # JSON headers of checkpoints
  libopenmpi-dev openmpi-bin  # dist/: data-parallel training under mpirun (and its tests)
  ccache               # recompiles only what changed (used when found)
  # the apps' default data (apps/, data/)
  dataset-fashion-mnist                 # vit: Fashion-MNIST, gzipped IDX
  fortunes fortunes-de fortunes-es fortunes-it fortunes-br fortunes-ru fortunes-cs fortunes-pl  # textclf
  bible-kjv                             # gpt: the King James Bible
)
if [[ "${1:-}" == "--bench" ]]; then
  PACKAGES+=(
    python3-venv           # bench/compare_pytorch: a virtual environment for pip's newest torch
    libtcmalloc-minimal4   # preloaded into the PyTorch processes: their fastest malloc here
  )
elif [[ "${1:-}" == "--fuzz" ]]; then
  PACKAGES+=(
    clang libclang-rt-dev   # clang++ (Debian's default version) and libFuzzer + ASan/UBSan runtimes
    libomp-dev              # OpenMP for clang: the library is built with -fopenmp
    ccache                  # the fuzz build compiles the whole library again, with clang
  )
elif [[ $# -gt 0 ]]; then
  echo "usage: scripts/install-deps.sh [--bench | --fuzz]" >&2
  exit 2
fi

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
  [[ "$status" == ii* ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

line="apt-get install -y --no-install-recommends ${missing[*]}"
if [[ $(id -u) -eq 0 ]]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
else
  echo "attograd: missing Debian packages: ${missing[*]}" >&2
  echo "run as root:  apt-get update && $line" >&2
  exit 1
fi
echo "attograd: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq >&2
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
