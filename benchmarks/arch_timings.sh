#!/usr/bin/env bash
# Prefill and decode time per token for each architecture at one comparable size: hidden 1024,
# 12 layers, 16 heads (no grouped-query attention), MLP 4096, vocab 32000, float32, 2 threads;
# 128-token prompt, 64 new tokens, target only. t5 has 12 encoder and 12 decoder layers; its prefill
# is the encoder over the prompt plus the first decoder step. Prints one JSON line per architecture
# (ARCHS="t5 llama" picks some) and appends it as a record to benchmarks/results/arch_timings.jsonl
# (benchmarks/bench_record.py's schema).
# Usage: benchmarks/arch_timings.sh [BUILD_DIR] [MODELS_DIR]
set -euo pipefail
command="bash benchmarks/arch_timings.sh$(printf ' %q' "$@")"
run=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
build=${1:-build} models=${2:-bench-models}
bin=$build/specdec
prompt=$(python3 -c "print(','.join(str(3 + (i * 7919) % 31000) for i in range(128)))")
for arch in ${ARCHS:-llama gpt_neox gpt2 opt t5}; do
  dir=$models/arch-$arch
  [ -f "$dir/config.json" ] || "$bin" make-fixture --out "$dir" --arch $arch --layers 12 --hidden 1024 \
    --heads 16 --intermediate 4096 --vocab 32000 --max-pos 1024 --seed 1 2>/dev/null
  "$bin" generate --model "$dir" --prompt-ids "$prompt" --max-new-tokens 64 --threads 2 --json |
    python3 -c "
import json,sys
s=json.load(sys.stdin)['stats']
decode=(s['total_seconds']-s['prefill_seconds'])/max(1,s['new_tokens']-1)
print(json.dumps({'arch':sys.argv[1],'prefill_ms_per_prompt_token':round(1e3*s['prefill_seconds']/128,2),
  'prefill_s':round(s['prefill_seconds'],3),'decode_ms_per_token':round(1e3*decode,1)}))" $arch |
    python3 "$(dirname "$0")/bench_record.py" arch_timings --run "$run" --command "$command" --env ARCHS --threads 2 --tee
done
