#!/usr/bin/env bash
# Peak resident memory of `specdec generate` per GGUF file against the file's size (issue 13's goal:
# the model's share within 1.15x of its weight bytes). Per file: one process, 1 thread, a 3-token
# request then a 128-token prompt; float32 activations and, for the integer formats,
# --int8-activations. The runtime (libtorch, the program: `specdec --help`'s peak) is measured in
# the same run and subtracted. Prints one Markdown row per file and mode, and appends each as a record
# to benchmarks/results/peak_rss.jsonl (benchmarks/bench_record.py's schema).
# Usage: benchmarks/peak_rss.sh BUILD_DIR FILE.gguf...
set -euo pipefail
command="bash benchmarks/peak_rss.sh$(printf ' %q' "$@")"
run=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
record=(python3 "$(dirname "$0")/bench_record.py" peak_rss --run "$run" --command "$command" --threads 1)
build=$1; shift
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ids=$(python3 -c "print(','.join(str(1000 + 37 * i % 20000) for i in range(128)))")
printf '{"prompt_ids":[1,2,3],"max_new_tokens":2}\n{"prompt_ids":[%s],"max_new_tokens":1}\n' "$ids" > "$tmp/requests.jsonl"
/usr/bin/time -f %M -o "$tmp/rss" "$build/specdec" --help > /dev/null
runtime=$(tail -1 "$tmp/rss")
echo "runtime (specdec --help): $((runtime / 1024)) MB"
echo "| file | activations | peak RSS MB | file MB | (peak - runtime) / file |"
echo "|---|---|---|---|---|"
for f in "$@"; do
  for mode in float int8; do
    flag=(); [ $mode = int8 ] && flag=(--int8-activations)
    [ $mode = int8 ] && [[ $f == *F16* || $f == *F32* ]] && continue  # no integer kernel
    /usr/bin/time -f %M -o "$tmp/rss" "$build/specdec" generate --model "$f" "${flag[@]}" \
      --prompts-file "$tmp/requests.jsonl" --threads 1 > /dev/null 2>&1
    python3 -c "import json, os, sys
peak, runtime, f = int(sys.argv[1]) * 1024, int(sys.argv[2]) * 1024, sys.argv[3]
size = os.path.getsize(f)
print('| %s | %s | %.0f | %.0f | %.2fx |' % (os.path.basename(f), sys.argv[4], peak / 2**20, size / 2**20, (peak - runtime) / size))
rec = {'file': os.path.basename(f), 'activations': sys.argv[4], 'peak_rss_mb': round(peak / 2**20), 'file_mb': round(size / 2**20),
       'runtime_rss_mb': round(runtime / 2**20), 'ratio': round((peak - runtime) / size, 2)}
open(sys.argv[5], 'w').write(json.dumps(rec) + '\\n')" \
      "$(tail -1 "$tmp/rss")" "$runtime" "$f" "$mode" "$tmp/record.json"
    "${record[@]}" < "$tmp/record.json"
  done
done
