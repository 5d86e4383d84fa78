#!/usr/bin/env bash
# Makes the synthetic Llama pair once (random weights, 4.4 GB + 0.8 GB, a few minutes): the
# target of the issues' figures (hidden 2048, 16 layers, 32/8 heads, MLP 8192, vocab 32000; its
# output projections above layer 1 scaled by 0.03, so its 1-layer early exit, the draft, agrees
# with it often).
#   bash benchmarks/synthetic_pair.sh [BUILD_DIR] [MODELS_DIR]   -> MODELS_DIR/target, MODELS_DIR/draft
set -euo pipefail
build=${1:-build} models=${2:-bench-models}
bin=$build/specdec
[ -f "$models/target/config.json" ] || "$bin" make-fixture --out "$models/target" --arch llama --layers 16 \
  --hidden 2048 --heads 32 --kv-heads 8 --intermediate 8192 --vocab 32000 --max-pos 4096 --seed 1 \
  --exit-layers 1 --exit-scale 0.03
[ -f "$models/draft/config.json" ] || "$bin" make-fixture --draft-of "$models/target" --out "$models/draft" --layers 1
