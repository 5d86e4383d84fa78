#!/usr/bin/env bash
# End-to-end speedup on the issue's synthetic pair: Llama target hidden 2048, 16 layers, 32/8 heads,
# MLP 8192, vocab 32000, o_proj/down_proj of layers >= 1 scaled by 0.03 (--exit-scale), and its
# 1-layer early-exit draft. 16-token prompt, 32 new tokens, float32, 2 threads.
# Usage: benchmarks/e2e_speedup.sh [BUILD_DIR] [MODELS_DIR]; prints one JSON line per configuration.
set -euo pipefail
build=${1:-build} models=${2:-bench-models}
bin=$build/specdec
if [ ! -f "$models/target/config.json" ]; then
  "$bin" make-fixture --out "$models/target" --arch llama --layers 16 --hidden 2048 --heads 32 \
    --kv-heads 8 --intermediate 8192 --vocab 32000 --max-pos 4096 --seed 1 --exit-layers 1 --exit-scale 0.03
fi
[ -f "$models/draft/config.json" ] || "$bin" make-fixture --draft-of "$models/target" --out "$models/draft" --layers 1
prompt=1,306,4658,278,6593,310,2834,338,29871,29946,29906,29889,450,1234,338,29871
run() { # run LABEL ARGS...
  local label=$1; shift
  "$bin" compare --model "$models/target" --draft "$models/draft" --prompt-ids "$prompt" \
    --max-new-tokens 32 --threads 2 --json "$@" |
    python3 "$(dirname "$0")/compare_summary.py" "$label"
}
run "constant K=5" --num-assistant-tokens 5 --schedule constant
run "heuristic K=5" --num-assistant-tokens 5 --schedule heuristic
run "dynamic (adaptive)" --schedule dynamic
run "dynamic (fixed 0.4)" --schedule dynamic --no-adaptive-threshold
run "prompt lookup 10" --prompt-lookup 10
for t in 0.3 0.7 1.0; do run "sampling T=$t K=5" --num-assistant-tokens 5 --do-sample --temperature $t --seed 1; done
