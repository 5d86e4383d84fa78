#!/usr/bin/env bash
# End-to-end speedup of a synthetic pair with real costs (random weights; the target's output
# projections above layer 1 scaled by 0.03 so that its early exit agrees with it often), float32,
# 2 threads, 32 new tokens. Prints one JSON line per configuration and appends it as a record to
# benchmarks/results/e2e_speedup.jsonl (benchmarks/bench_record.py's schema, with pair, device and dtype).
# Usage: [SPECDEC_ARGS="--device cuda --dtype bfloat16"] benchmarks/e2e_speedup.sh [BUILD_DIR] [MODELS_DIR] [PAIR]
#   SPECDEC_ARGS: more `specdec compare` options for every run (e.g. a GPU and its dtype).
#   PAIR llama (default): the issue's pair: Llama target hidden 2048, 16 layers, 32/8 heads, MLP
#     8192, vocab 32000, and its 1-layer early-exit draft; 16-token prompt.
#   PAIR t5: T5 target with 12 encoder and 12 decoder layers, hidden 1024, 16 heads, ReLU MLP 4096,
#     vocab 32000, tied head, and its early-exit draft: the same encoder (one encoder pass serves
#     both) and 1 decoder layer; 64-token encoder input.
set -euo pipefail
command="bash benchmarks/e2e_speedup.sh$(printf ' %q' "$@")"
run=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
build=${1:-build} models=${2:-bench-models} pair=${3:-llama}
device=$(sed -n 's/.*--device[= ]\([^ ]*\).*/\1/p' <<< "${SPECDEC_ARGS:-}")
dtype=$(sed -n 's/.*--dtype[= ]\([^ ]*\).*/\1/p' <<< "${SPECDEC_ARGS:-}")
bin=$build/specdec
case $pair in
  llama)
    target=$models/target draft=$models/draft
    prompt=1,306,4658,278,6593,310,2834,338,29871,29946,29906,29889,450,1234,338,29871
    bash "$(dirname "$0")/synthetic_pair.sh" "$build" "$models"
    ;;
  t5)
    target=$models/t5-target draft=$models/t5-draft
    prompt=$(python3 -c "print(','.join(str(3 + (i * 7919) % 31000) for i in range(64)))")
    [ -f "$target/config.json" ] || "$bin" make-fixture --out "$target" --arch t5 --layers 12 --hidden 1024 \
      --heads 16 --intermediate 4096 --vocab 32000 --seed 1 --exit-layers 1 --exit-scale 0.03 --tie-word-embeddings
    ;;
  *) echo "unknown pair '$pair' (llama or t5)" >&2; exit 2 ;;
esac
[ -f "$draft/config.json" ] || "$bin" make-fixture --draft-of "$target" --out "$draft" --layers 1
run() { # run LABEL ARGS...
  local label=$1; shift
  "$bin" compare --model "$target" --draft "$draft" --prompt-ids "$prompt" \
    --max-new-tokens 32 --threads 2 --json ${SPECDEC_ARGS:-} "$@" |
    python3 "$(dirname "$0")/compare_summary.py" "$label" |
    python3 "$(dirname "$0")/bench_record.py" e2e_speedup --run "$run" --command "$command" --env SPECDEC_ARGS --threads 2 \
      --set "pair=$pair" --set "device=${device:-cpu}" --set "dtype=${dtype:-float32}" --tee
}
if [ "$pair" = t5 ]; then
  run "t5 constant K=5" --num-assistant-tokens 5 --schedule constant
  run "t5 dynamic (adaptive)" --schedule dynamic
  run "t5 sampling T=0.7 K=5" --num-assistant-tokens 5 --do-sample --temperature 0.7 --seed 1
  exit 0
fi
run "constant K=5" --num-assistant-tokens 5 --schedule constant
run "heuristic K=5" --num-assistant-tokens 5 --schedule heuristic
run "dynamic (adaptive)" --schedule dynamic
run "dynamic (fixed 0.4)" --schedule dynamic --no-adaptive-threshold
run "goodput" --schedule goodput
run "prompt lookup 10" --prompt-lookup 10
for t in 0.3 0.7 1.0; do run "sampling T=$t K=5" --num-assistant-tokens 5 --do-sample --temperature $t --seed 1; done
run "sampling T=0.7 goodput" --schedule goodput --do-sample --temperature 0.7 --seed 1
