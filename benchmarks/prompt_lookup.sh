#!/usr/bin/env bash
# Prompt lookup on an input-grounded prompt: the prompt quotes a passage, then starts it again, and
# the output copies the passage. Random-weight models do not copy their input, so the target here
# is the issue pair's size (Llama hidden 2048, 16 layers, 32/8 heads, MLP 8192, vocab 32000) with
# every o_proj/down_proj multiplied by 0 (--exit-layers 0 --exit-scale 0): every layer still runs
# and costs what it costs, but the next token depends on the current token only. The passage is
# that model's own greedy walk from a start token, so a prompt that contains it and ends on the
# start token is continued by copying it, as a trained model copies a quoted span.
# Usage: benchmarks/prompt_lookup.sh [BUILD_DIR] [MODELS_DIR]; prints one JSON line per setting and
# appends it as a record to benchmarks/results/prompt_lookup.jsonl (benchmarks/bench_record.py's schema).
set -euo pipefail
command="bash benchmarks/prompt_lookup.sh$(printf ' %q' "$@")"
run=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
build=${1:-build} models=${2:-bench-models}
bin=$build/specdec
if [ ! -f "$models/bigram/config.json" ]; then
  "$bin" make-fixture --out "$models/bigram" --arch llama --layers 16 --hidden 2048 --heads 32 \
    --kv-heads 8 --intermediate 8192 --vocab 32000 --max-pos 4096 --seed 1 --exit-layers 0 --exit-scale 0
fi
start=306
passage=$("$bin" generate --model "$models/bigram" --prompt-ids $start --max-new-tokens 64 --threads 2 --json |
  python3 -c "import json,sys; print(','.join(map(str, json.load(sys.stdin)['tokens'])))")
prompt="1,450,1234,338,29871,$start,$passage,29889,450,1234,338,$start"
for n in 5 10 20; do
  "$bin" compare --model "$models/bigram" --prompt-ids "$prompt" --prompt-lookup $n \
    --max-new-tokens 48 --threads 2 --json |
    python3 "$(dirname "$0")/compare_summary.py" "prompt lookup $n" |
    python3 "$(dirname "$0")/bench_record.py" prompt_lookup --run "$run" --command "$command" --threads 2 --tee
done
