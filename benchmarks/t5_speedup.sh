#!/usr/bin/env bash
# End-to-end speedup of an encoder-decoder pair: T5 target with 12 encoder and 12 decoder layers,
# hidden 1024, 16 heads, ReLU MLP 4096, vocab 32000, decoder o/wo of layers >= 1 scaled by 0.03
# (--exit-scale), and its early-exit draft: the same encoder (so one encoder pass serves both) and
# 1 decoder layer. 64-token encoder input, 32 new tokens, float32, 2 threads.
# Usage: benchmarks/t5_speedup.sh [BUILD_DIR] [MODELS_DIR]; prints one JSON line per configuration.
set -euo pipefail
build=${1:-build} models=${2:-bench-models}
bin=$build/specdec
if [ ! -f "$models/t5-target/config.json" ]; then
  "$bin" make-fixture --out "$models/t5-target" --arch t5 --layers 12 --hidden 1024 --heads 16 \
    --intermediate 4096 --vocab 32000 --seed 1 --exit-layers 1 --exit-scale 0.03 --tie-word-embeddings
fi
[ -f "$models/t5-draft/config.json" ] || "$bin" make-fixture --draft-of "$models/t5-target" --out "$models/t5-draft" --layers 1
prompt=$(python3 -c "print(','.join(str(3 + (i * 7919) % 31000) for i in range(64)))")
run() { # run LABEL ARGS...
  local label=$1; shift
  "$bin" compare --model "$models/t5-target" --draft "$models/t5-draft" --prompt-ids "$prompt" \
    --max-new-tokens 32 --threads 2 --json "$@" |
    python3 "$(dirname "$0")/compare_summary.py" "$label"
}
run "t5 constant K=5" --num-assistant-tokens 5 --schedule constant
run "t5 dynamic (adaptive)" --schedule dynamic
run "t5 sampling T=0.7 K=5" --num-assistant-tokens 5 --do-sample --temperature 0.7 --seed 1
