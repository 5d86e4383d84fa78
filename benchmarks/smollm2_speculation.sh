#!/usr/bin/env bash
# Speculation on a trained model: SmolLM2-135M-Instruct (Q4_1 GGUF run as stored; the early-exit
# drafts cut from it are float32 safetensors folders), chat
# prompts. (a) prompt lookup on input-grounded prompts (benchmarks/prompts/grounded.txt: rewrite,
# extract, summarise, fix code ...); (b) early-exit drafts cut from the model itself at a few depths
# (make-fixture --draft-of), constant K; (c) the dynamic schedule with those drafts. Each line is
# one `specdec compare --chat` run (target-only and assisted in one process, after a warm-up),
# summarised by compare_summary.py with the prompt number added, and appended as a record to
# benchmarks/results/smollm2_speculation.jsonl (benchmarks/bench_record.py's schema).
# Usage: benchmarks/smollm2_speculation.sh [BUILD_DIR] [NEW_TOKENS] [THREADS]
set -euo pipefail
command="bash benchmarks/smollm2_speculation.sh$(printf ' %q' "$@")"
run=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
cd "$(dirname "$0")/.."
build=${1:-build} n=${2:-128} threads=${3:-2}
bin=$build/specdec
model=models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] || bash scripts/get_models.sh
for layers in 2 4 8; do
  [ -f "models/smollm2-draft$layers/config.json" ] ||
    "$bin" make-fixture --draft-of "$model" --layers $layers --out "models/smollm2-draft$layers"
done
run() {  # label, prompt number, compare flags...
  local label=$1 i=$2; shift 2
  sed -n "${i}p" benchmarks/prompts/grounded.txt |
    "$bin" compare --model "$model" --chat --max-new-tokens "$n" --threads "$threads" --json "$@" |
    python3 benchmarks/compare_summary.py "$label" "$i" |
    python3 benchmarks/bench_record.py smollm2_speculation --run "$run" --command "$command" --env SPECDEC_KERNELS \
      --threads "$threads" --set "new_tokens=$n" --tee
}
for i in 1 2 3 4 5 6 7 8; do run "prompt lookup 10" $i --prompt-lookup 10; done
for layers in 2 4 8; do
  for i in 1 3; do
    run "draft $layers layers, K=3" $i --draft "models/smollm2-draft$layers" --schedule constant --num-assistant-tokens 3
    run "draft $layers layers, dynamic" $i --draft "models/smollm2-draft$layers" --schedule dynamic
  done
done
