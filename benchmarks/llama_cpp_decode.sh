#!/usr/bin/env bash
# Decode only, specdec beside llama.cpp, alternating on the same GGUF files: ms per token of a
# 32-token greedy decode after a 3-token prompt, at 1 and 2 threads. specdec: `specdec generate`
# (a warm-up request first, then stats.target_seconds_per_pass; --int8-activations, which the
# float formats ignore: the integer ones compute as llama.cpp does); llama.cpp: `llama-bench -p 0
# -n 32 -r 2`. A quicker check than benchmarks/llama_cpp_peer.sh, whose llama.cpp build and
# converted files it uses (run that once first, e.g. with PEER_PARTS=synthetic).
# Usage: benchmarks/llama_cpp_decode.sh BUILD_DIR ROUNDS FILE.gguf...
#   LLAMA_BUILD=DIR: llama.cpp's build (default bench-peers/llama.cpp-build).
#   BASE_BUILD=DIR also times the specdec of another build (e.g. the commit before, built in a git
#   worktree) in the same rounds: "base X ms" and the ratio specdec / base.
# Prints one line per round, file and thread count, and appends each as a record to
# benchmarks/results/llama_cpp_decode.jsonl (benchmarks/bench_record.py's schema).
set -euo pipefail
command="bash benchmarks/llama_cpp_decode.sh$(printf ' %q' "$@")"
cd "$(dirname "$0")/.."
build=$1 rounds=$2; shift 2
run=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
# record FIELDS_JSON: one record of this run
record() { python3 benchmarks/bench_record.py llama_cpp_decode --run "$run" --command "$command" --env LLAMA_BUILD,BASE_BUILD <<< "$1"; }
bench=${LLAMA_BUILD:-bench-peers/llama.cpp-build}/bin/llama-bench
[ -x "$bench" ] || { echo "no $bench: run benchmarks/llama_cpp_peer.sh first" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
printf '{"prompt_ids":[1,2,3],"max_new_tokens":2}\n{"prompt_ids":[1,2,3],"max_new_tokens":32}\n' > "$tmp/requests.jsonl"
echo "# $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, specdec $(git rev-parse --short HEAD)"
for r in $(seq "$rounds"); do
  for f in "$@"; do
    for t in 1 2; do
      ms() { "$1/specdec" generate --model "$f" --int8-activations --prompts-file "$tmp/requests.jsonl" --threads "$t" 2>/dev/null |
             tail -1 | python3 -c "import json, sys; print('%.1f' % (1000 * json.load(sys.stdin)['stats']['target_seconds_per_pass']))"; }
      b=""; [ -z "${BASE_BUILD:-}" ] || b=$(ms "$BASE_BUILD")
      s=$(ms "$build")
      base=""; [ -z "$b" ] || base=", base $b ms, specdec / base $(python3 -c "print('%.2f' % ($s / $b))")"
      l=$("$bench" -m "$f" -p 0 -n 32 -t "$t" -r 2 -o json 2>/dev/null |
          python3 -c "import json, sys; print('%.1f' % (json.load(sys.stdin)[0]['avg_ns'] / 1e6 / 32))")
      echo "round $r $(basename "$f") threads $t: specdec $s ms, llama.cpp $l ms, ratio $(python3 -c "print('%.2f' % ($s / $l))")$base"
      record "$(python3 -c "import json, sys
f, r, t, s, l, b = sys.argv[1:]
rec = {'file': f, 'round': int(r), 'threads': int(t), 'activations': 'int8', 'specdec_ms': float(s), 'llama_cpp_ms': float(l),
       'ratio': round(float(s) / float(l), 2)}
if b:
    rec.update(base_ms=float(b), ratio_base=round(float(s) / float(b), 2))
print(json.dumps(rec))" "$(basename "$f")" "$r" "$t" "$s" "$l" "$b")"
    done
  done
done
