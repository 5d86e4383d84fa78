#!/usr/bin/env bash
# Prefill of 128 tokens with --int8-activations under two kernel families (SPECDEC_KERNELS),
# alternating in each round, at 1 and 2 threads: `specdec generate --prompts-file` with the same
# 128-token request twice (the first warms up; the second's stats.prefill_seconds is printed).
# Usage: benchmarks/prefill_isa.sh BUILD_DIR ROUNDS ISA_A ISA_B FILE.gguf...   (e.g. amx avx512)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$1 rounds=$2 isa_a=$3 isa_b=$4; shift 4
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -c "import json; r = json.dumps({'prompt_ids': list(range(100, 228)), 'max_new_tokens': 1}); print(r); print(r)" \
  > "$tmp/requests.jsonl"
echo "# $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, specdec $(git rev-parse --short HEAD)"
for r in $(seq "$rounds"); do
  for f in "$@"; do
    for t in 1 2; do
      line="round $r $(basename "$f") threads $t:"
      for isa in "$isa_a" "$isa_b"; do
        ms=$(SPECDEC_KERNELS=$isa "$build/specdec" generate --model "$f" --int8-activations --prompts-file "$tmp/requests.jsonl" \
               --threads "$t" | tail -1 |
             python3 -c "import json, sys; print('%.1f' % (1000 * json.load(sys.stdin)['stats']['prefill_seconds']))")
        line="$line $isa $ms ms"
      done
      echo "$line"
    done
  done
done
