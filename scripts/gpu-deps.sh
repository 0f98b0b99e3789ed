#!/usr/bin/env bash
# Run here, on Debian 12: downloads the .deb files of the build dependencies that a GPU machine
# without Debian's packages lacks (OpenBLAS with its Fortran runtime, fmt, nlohmann-json, CLI11,
# doctest, zlib's headers) into .gpu-deps/ (ignored by git, about 14 MB), so that
# scripts/gpu-check.sh can unpack them there into a private prefix with `dpkg -x` (never into /).
# The CUDA toolkit, cuBLAS, a C++ compiler, CMake, ninja and Python with PyTorch are expected on
# the GPU machine itself.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PACKAGES=(libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread libgfortran5
          libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev doctest-dev zlib1g-dev)
rm -rf .gpu-deps
mkdir -p .gpu-deps
(cd .gpu-deps && apt-get download -qq "${PACKAGES[@]}" 2>&1) | { grep -v "Download is performed unsandboxed" || true; } >&2
echo "gpu-deps.sh: $(ls .gpu-deps/*.deb | wc -l) packages in .gpu-deps/ ($(du -sh .gpu-deps | cut -f1))"
