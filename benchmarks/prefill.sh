#!/usr/bin/env bash
# Prefill of 128 tokens on GGUF files, alternating in each round, at 1 and 2 threads: specdec
# `generate --prompts-file` with the same 128-token request twice (the first warms up; the second's
# stats.prefill_seconds) under each kernel family in KERNELS and activation mode in ACTIVATIONS, and
# llama.cpp's `llama-bench -p 128 -n 0 -r 2` when LLAMA_BUILD has one.
# Usage: benchmarks/prefill.sh BUILD_DIR ROUNDS FILE.gguf...
#   KERNELS="amx avx512": the SPECDEC_KERNELS families to time, side by side (default: the default one)
#   ACTIVATIONS="int8 float32": with --int8-activations (which the float formats ignore) and without,
#   side by side (default: int8)
#   LLAMA_BUILD=DIR: llama.cpp's build (default bench-peers/llama.cpp-build, benchmarks/llama_cpp_peer.sh's);
#   ratios are the first family's (and mode's) time over llama.cpp's. LLAMA_BUILD=none: specdec only.
# Prints one line per round, file and thread count, and appends each as a record to
# benchmarks/results/prefill.jsonl (benchmarks/bench_record.py's schema; specdec_ms maps "FAMILY/MODE" to ms).
set -euo pipefail
command="bash benchmarks/prefill.sh$(printf ' %q' "$@")"
cd "$(dirname "$0")/.."
build=$1 rounds=$2; shift 2
run=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
read -r -a kernels <<< "${KERNELS:-default}"
read -r -a activations <<< "${ACTIVATIONS:-int8}"
bench=${LLAMA_BUILD:-bench-peers/llama.cpp-build}/bin/llama-bench
[ -x "$bench" ] || bench=""
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -c "import json; r = json.dumps({'prompt_ids': list(range(100, 228)), 'max_new_tokens': 1}); print(r); print(r)" \
  > "$tmp/requests.jsonl"
echo "# $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, specdec $(git rev-parse --short HEAD), llama.cpp: ${bench:-none}"
for r in $(seq "$rounds"); do
  for f in "$@"; do
    for t in 1 2; do
      line="round $r $(basename "$f") threads $t:" first="" times=()
      for k in "${kernels[@]}"; do
        for a in "${activations[@]}"; do
          case $a in int8) flag=(--int8-activations) ;; float32) flag=() ;; *) echo "ACTIVATIONS: int8 or float32, not $a" >&2; exit 2 ;; esac
          env=(); [ "$k" = default ] || env=(SPECDEC_KERNELS="$k")
          ms=$(env "${env[@]}" "$build/specdec" generate --model "$f" "${flag[@]}" --prompts-file "$tmp/requests.jsonl" \
                 --threads "$t" 2>/dev/null | tail -1 |
               python3 -c "import json, sys; print('%.1f' % (1000 * json.load(sys.stdin)['stats']['prefill_seconds']))")
          line="$line specdec[$k,$a] $ms ms" first=${first:-$ms} times+=("$k/$a" "$ms")
        done
      done
      if [ -n "$bench" ]; then
        l=$("$bench" -m "$f" -p 128 -n 0 -t "$t" -r 2 -o json 2>/dev/null |
            python3 -c "import json, sys; print('%.1f' % (json.load(sys.stdin)[0]['avg_ns'] / 1e6))")
        line="$line, llama.cpp $l ms, ratio $(python3 -c "print('%.2f' % ($first / $l))")"
      fi
      echo "$line"
      python3 -c "import json, sys
f, r, t, l, *times = sys.argv[1:]
rec = {'file': f, 'round': int(r), 'threads': int(t), 'tokens': 128,
       'specdec_ms': {k: float(v) for k, v in zip(times[::2], times[1::2])}}
if l:
    rec.update(llama_cpp_ms=float(l), ratio=round(float(times[1]) / float(l), 2))
print(json.dumps(rec))" "$(basename "$f")" "$r" "$t" "${l:-}" "${times[@]}" |
        python3 benchmarks/bench_record.py prefill --run "$run" --command "$command" --env KERNELS,ACTIVATIONS,LLAMA_BUILD
    done
  done
done
