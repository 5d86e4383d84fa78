#!/usr/bin/env bash
# Peak resident memory of `specdec generate` per GGUF file against the file's size (issue 13's goal:
# the model's share within 1.15x of its weight bytes). Per file: one process, 1 thread, a 3-token
# request then a 128-token prompt; float32 activations and, for the integer formats,
# --int8-activations. The runtime (libtorch, the program: `specdec --help`'s peak) is measured in
# the same run and subtracted. Prints one Markdown row per file and mode.
# Usage: benchmarks/peak_rss.sh BUILD_DIR FILE.gguf...
set -euo pipefail
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
    python3 -c "import os, sys
peak, runtime, f = int(sys.argv[1]) * 1024, int(sys.argv[2]) * 1024, sys.argv[3]
size = os.path.getsize(f)
print('| %s | %s | %.0f | %.0f | %.2fx |' % (os.path.basename(f), sys.argv[4], peak / 2**20, size / 2**20, (peak - runtime) / size))" \
      "$(tail -1 "$tmp/rss")" "$runtime" "$f" "$mode"
  done
done
