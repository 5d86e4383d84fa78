#!/usr/bin/env bash
# Builds the libFuzzer targets with clang, AddressSanitizer and UndefinedBehaviorSanitizer (in
# build-fuzz/), and runs each for SECONDS seconds on its seed corpus (tests/fuzz/corpus/<target>,
# grown in build-fuzz/corpus/<target>). Findings are written to build-fuzz/findings/.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]     (default: 60 seconds, every target)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}; shift || true
targets=("$@"); ((${#targets[@]})) || targets=(gguf safetensors safetensors_index config tokenizer_json vocab_merges tokenizer_config sentencepiece generation_options)
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
if [[ ! -f build-fuzz/CMakeCache.txt ]]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DSPECDEC_BUILD_FUZZERS=ON \
    -DSPECDEC_BUILD_TESTS=OFF -DSPECDEC_BUILD_BENCHMARKS=OFF -DSPECDEC_BUILD_EXAMPLES=OFF -DSPECDEC_BUILD_TOOLS=OFF \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" > build-fuzz.log 2>&1 ||
    { tail -30 build-fuzz.log; exit 1; }
fi
cmake --build build-fuzz -j"$(nproc)" >> build-fuzz.log 2>&1 || { tail -30 build-fuzz.log; exit 1; }
mkdir -p build-fuzz/findings
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t"
  echo "fuzz_$t: ${seconds}s"
  # ASan: libtorch is not instrumented; its allocations are not checked, ours are.
  ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 ./build-fuzz/fuzz_"$t" -max_total_time="$seconds" \
    -rss_limit_mb=4096 -malloc_limit_mb=2048 -timeout=10 -artifact_prefix=build-fuzz/findings/"$t"- \
    "build-fuzz/corpus/$t" "tests/fuzz/corpus/$t"
done
