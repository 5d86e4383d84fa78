#!/usr/bin/env bash
# Installs what is missing, builds, and runs the greedy-vs-assisted demo on generated checkpoints.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 || { cat build.log; exit 1; }
cmake --build build -j"$(nproc)" --target greedy_vs_assisted >> build.log 2>&1 || { tail -50 build.log; exit 1; }
./build/greedy_vs_assisted demo-models "${1:-64}"
