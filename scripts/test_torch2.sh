#!/usr/bin/env bash
# The second build configuration: libtorch 2.x from PyPI's `torch` wheel (a CUDA 12.8 build that
# runs on the CPU when no GPU is present) in the project-local .venv-torch2, built in build-torch2/,
# running the tests of what can differ between libtorch versions (ctest labels, tests/CMakeLists.txt):
# loading, kernels, exactness, statistics, the references, the device path and find_package.
# Downloads about 4 GB the first time (torch and the NVIDIA runtime wheels that libtorch_cuda
# links; scripts/wheels.sh keeps them in a wheelhouse for the next venv) and needs about 10 GB of disk with the
# build; with less free, it says so loudly and stops without failing (CI runs it: see .ci/run and
# docs/build.md, "libtorch 2.x").
# Usage: scripts/test_torch2.sh [TORCH_VERSION]   (default 2.9.1)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-2.9.1}
bash scripts/setup.sh
source scripts/wheels.sh
if ! [ -x .venv-torch2/bin/python ] || ! .venv-torch2/bin/python -c "import torch" 2>/dev/null; then
  free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
  if [ "$free_gb" -lt 10 ]; then
    echo "######## libtorch 2.x configuration NOT RUN: ${free_gb} GB free here, about 10 GB needed ########" >&2
    [ -z "${CI_NOT_RUN:-}" ] || echo "torch2 (libtorch 2.x): ${free_gb} GB free, about 10 GB needed" >> "$CI_NOT_RUN"
    exit 0
  fi
  [ -x .venv-torch2/bin/python ] || python3 -m venv .venv-torch2
  pip_install .venv-torch2/bin/pip "torch==$version"
fi
py() { .venv-torch2/bin/python -c "$1" 2>/dev/null; }
torch_dir=$(py "import os, torch; print(os.path.dirname(torch.__file__))")
# Debian's GoogleTest, Benchmark and CLI11 use the C++11 ABI; so must libtorch (PyPI's wheels do
# from torch 2.7 on).
[ "$(py "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))")" = 1 ] ||
  { echo "torch $version is built with the pre-C++11 ABI: use torch >= 2.7" >&2; exit 1; }
echo "libtorch $(py "import torch; print(torch.__version__)") from $torch_dir"
# Both the package root (its lib/, include/) and its CMake configs: otherwise TorchConfig finds
# Debian's /usr/lib/libtorch.so first.
cmake -S . -B build-torch2 -DCMAKE_BUILD_TYPE=Release -DSPECDEC_BUILD_BENCHMARKS=OFF -DSPECDEC_BUILD_EXAMPLES=OFF \
  -DCMAKE_PREFIX_PATH="$torch_dir;$torch_dir/share/cmake" > build-torch2.log 2>&1 || { tail -30 build-torch2.log; exit 1; }
cmake --build build-torch2 -j"$(nproc)" >> build-torch2.log 2>&1 || { tail -60 build-torch2.log; exit 1; }
cd build-torch2 && ctest --output-on-failure -j"$(nproc)" -L '^(loading.*|kernels|exactness|statistical|reference|device|package)$'
