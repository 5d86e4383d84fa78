#!/usr/bin/env bash
# The portable build (-DSPECDEC_X86_KERNELS=OFF): what a host without AVX2 (or a non-x86 one)
# compiles. Proves that no AVX2 kernel is in the library, then runs the tests that exercise the
# linear kernel on it (ctest labels, tests/CMakeLists.txt: kernels, exactness, statistical,
# reference). Usage: scripts/test_portable.sh [BUILD_DIR (build-portable)]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-portable}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DSPECDEC_X86_KERNELS=OFF -DSPECDEC_BUILD_BENCHMARKS=OFF \
  -DSPECDEC_BUILD_EXAMPLES=OFF > "$dir.log"
cmake --build "$dir" -j"$(nproc)" >> "$dir.log"
if nm -C "$dir/libspecdec.a" | grep -qE 'rows_avx2|rows_avx512'; then
  echo "test_portable: the x86 kernels were compiled into $dir/libspecdec.a" >&2
  exit 1
fi
echo "test_portable: no x86 kernel in $dir/libspecdec.a"
# Gemma 3 270M is left to the x86 configurations: at the portable kernels' speed its reference test
# takes minutes, and its formats (Q4_K, Q5_0, Q6_K, Q8_0) are checked here by WeightFormats, and a real
# model's exactness by SmolLM2.
cd "$dir" && ctest --output-on-failure -j"$(nproc)" -L '^(kernels|exactness|statistical|reference)$' -E '^Gemma3\.'
