#!/usr/bin/env bash
# The CUDA configuration, on a host with an NVIDIA GPU: builds specdec against the libtorch inside
# python3's `torch` (a CUDA build with the C++11 ABI, e.g. PyPI's) in build-cuda/, runs the
# device-agnostic tests on the GPU (SPECDEC_TEST_DEVICE=cuda: the Hugging Face references, exactness,
# statistics, batches, and the synchronisation count of tests/integration/test_device.cpp), then the
# whole suite on the CPU with that libtorch. Needs scripts/setup.sh's packages except libtorch-dev.
# Usage: scripts/test_cuda.sh [PYTHON]     (logs in build-cuda/*.log; GPU_TESTS=FILTER narrows the GPU run)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-python3}
torch_dir=$("$py" -c "import os, torch; print(os.path.dirname(torch.__file__))")
"$py" -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'; \
assert torch._C._GLIBCXX_USE_CXX11_ABI, 'libtorch uses the pre-C++11 ABI'; \
print('libtorch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name(0))"
mkdir -p build-cuda
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DSPECDEC_BUILD_BENCHMARKS=OFF \
  -DCMAKE_PREFIX_PATH="$torch_dir;$torch_dir/share/cmake" > build-cuda/configure.log 2>&1 ||
  { tail -40 build-cuda/configure.log; exit 1; }
cmake --build build-cuda -j"$(nproc)" > build-cuda/build.log 2>&1 || { grep -B2 -A12 "error" build-cuda/build.log | head -80; exit 1; }
echo "== on the GPU"
status=0
SPECDEC_TEST_DEVICE=cuda build-cuda/tests/specdec_tests \
  --gtest_filter="${GPU_TESTS:-Fixtures/Hf*:Extra/HfExtra.*:Exactness.*:Statistical.*:Batch.*:Device.*:Cases/CudaSyncs.*:CudaBatchSyncs.*:RejectionSamplingVerifier.*}" \
  2>&1 | tee build-cuda/gpu.log | grep -E "^\[ *(syncs|FAILED|PASSED|SKIPPED) *\]|tests ran" || true
grep -q "^\[  PASSED  \]" build-cuda/gpu.log && ! grep -q "^\[  FAILED  \]" build-cuda/gpu.log || status=1
echo "== the whole suite on the CPU"
(cd build-cuda && ctest -j"$(nproc)" --output-on-failure > cpu.log 2>&1) || status=1
tail -15 build-cuda/cpu.log
exit $status
