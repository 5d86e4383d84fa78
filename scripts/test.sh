#!/usr/bin/env bash
# Installs what is missing, builds everything, runs the whole test suite with ctest, then the
# documentation's commands (scripts/doc_commands.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/get_models.sh   # the real model for the tests on trained weights (they skip without it)
# SPECDEC_REQUIRE_DATA=1 (.ci/run): what the reference tests read must be there, since without it
# they skip (or leave their cases out) and the run stays green.
if [ "${SPECDEC_REQUIRE_DATA:-0}" = 1 ]; then
  for f in "${SPECDEC_FIXTURES:-../shared/fixtures}/hf" models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
    models/gemma3/gemma-3-270m-q4_k_m.gguf; do
    [ -e "$f" ] || { echo "test.sh: $f is missing: the tests that read it would skip" >&2; exit 1; }
  done
fi
# Tests and benchmarks on, also in a build folder that scripts/demo.sh made without them.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DSPECDEC_BUILD_TESTS=ON -DSPECDEC_BUILD_BENCHMARKS=ON \
  > build.log 2>&1 || { cat build.log; exit 1; }
cmake --build build -j"$(nproc)" >> build.log 2>&1 || { tail -80 build.log; exit 1; }
(cd build && ctest --output-on-failure -j"$(nproc)")
bash scripts/doc_commands.sh   # the commands of README.md and docs/ marked `sh test`
