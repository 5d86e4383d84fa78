#!/usr/bin/env bash
# Prefill of 128 tokens, specdec beside llama.cpp on the same GGUF files, alternating, 2 rounds, 1
# and 2 threads: specdec `generate --prompts-file` (the same 128-token request twice; the second's
# stats.prefill_seconds; --int8-activations, which the float formats ignore), llama.cpp `llama-bench -p 128
# -n 0 -r 2`. LLAMA_BENCH names the llama-bench to use (default: the peer script's build).
# Usage: benchmarks/llama_cpp_prefill.sh FILE.gguf...
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${LLAMA_BENCH:-bench-peers/llama.cpp-build/bin/llama-bench}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -c "import json; r = json.dumps({'prompt_ids': list(range(100, 228)), 'max_new_tokens': 1}); print(r); print(r)" > "$tmp/requests.jsonl"
echo "# prefill 128 tokens, specdec vs $bench; $(lscpu | sed -n 's/^Model name: *//p'), specdec $(git rev-parse --short HEAD)"
for r in 1 2; do for f in "$@"; do for t in 1 2; do
  s=$(build/specdec generate --model "$f" --int8-activations --prompts-file "$tmp/requests.jsonl" --threads $t 2>/dev/null | tail -1 | python3 -c "import json,sys; print('%.1f' % (1000*json.load(sys.stdin)['stats']['prefill_seconds']))")
  l=$("$bench" -m "$f" -p 128 -n 0 -t $t -r 2 -o json 2>/dev/null | python3 -c "import json,sys; print('%.1f' % (json.load(sys.stdin)[0]['avg_ns']/1e6))")
  echo "round $r $(basename $f) threads $t: specdec $s ms, llama.cpp $l ms, ratio $(python3 -c "print('%.2f' % ($s/$l))")"
done; done; done
