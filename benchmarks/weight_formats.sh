#!/usr/bin/env bash
# Greedy decode of one model in every weight format, interleaved rounds in one run: ms per token
# (decode passes only), prefill time and peak resident memory per format (median of the rounds); one
# record per format appended to benchmarks/results/weight_formats.jsonl (benchmarks/bench_record.py's schema).
#   bash benchmarks/weight_formats.sh [BUILD_DIR] [MODEL] [ROUNDS] [THREADS]
# Defaults: build, the SmolLM2-135M-Instruct GGUF of scripts/get_models.sh, 3 rounds, 2 threads.
set -euo pipefail
command="bash benchmarks/weight_formats.sh$(printf ' %q' "$@")"
build=${1:-build}
model=${2:-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
rounds=${3:-3}
threads=${4:-2}
[ -x "$build/specdec" ] || { echo "no $build/specdec: build first" >&2; exit 1; }
[ -e "$model" ] || { echo "no $model: run scripts/get_models.sh" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
formats="as-stored float32 bfloat16 float16 q8_0 q4_0"
for r in $(seq "$rounds"); do
  for f in $formats; do
    # 128 new tokens from a 3-token prompt; EOS never stops it (id 0 is <|endoftext|>, rarely produced).
    /usr/bin/time -f "%M" -o "$out/$f.$r.rss" "$build/specdec" generate --model "$model" --weights "$f" \
      --prompt-ids 1,2,3 --max-new-tokens 128 --threads "$threads" --json > "$out/$f.$r.json"
  done
done
python3 - "$(dirname "$0")" "$command" "$model" "$threads" "$out" "$rounds" $formats <<'PY'
import json, statistics, sys
sys.path.insert(0, sys.argv[1])
import bench_record
command, model, threads = sys.argv[2], sys.argv[3], int(sys.argv[4])
out, rounds, formats = sys.argv[5], int(sys.argv[6]), sys.argv[7:]
base = bench_record.common("weight_formats", command, threads)
base.update(model=model, rounds=rounds)
records = []
print(f"{'weights':10} {'ms/token':>9} {'prefill ms':>10} {'peak RSS MB':>11}  (median of {rounds}; tokens)")
for f in formats:
    ms, pre, rss, n = [], [], [], 0
    for r in range(1, rounds + 1):
        s = json.load(open(f"{out}/{f}.{r}.json"))["stats"]
        ms.append(1000 * s["target_seconds_per_pass"]); pre.append(1000 * s["prefill_seconds"]); n = s["new_tokens"]
        rss.append(int(open(f"{out}/{f}.{r}.rss").read().split()[-1]) / 1024)
    print(f"{f:10} {statistics.median(ms):9.2f} {statistics.median(pre):10.1f} {statistics.median(rss):11.0f}  ({n})")
    records.append(bench_record.complete({"weights": f, "new_tokens": n, "ms_per_token": round(statistics.median(ms), 2),
                                          "prefill_ms": round(statistics.median(pre), 1),
                                          "peak_rss_mb": round(statistics.median(rss))}, base))
bench_record.append("weight_formats", records)
PY
