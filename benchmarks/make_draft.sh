#!/usr/bin/env bash
# make-draft on a real model: drafts distilled from the model itself, measured on prompts not used in
# training. TARGET:
#   smollm2  SmolLM2-135M-Instruct (Q4_1 GGUF), a chat model: its on-policy text is its own answers
#            (128 new tokens, greedy and at temperature 0.7: GEN_TEMPERATURE) to
#            benchmarks/prompts/draft_train.txt (640 prompts); evaluated with `specdec compare --chat`
#            on the odd lines of benchmarks/prompts/draft_eval.txt (12 prompts; other topics and
#            phrasings than the training prompts).
#   gemma3   Gemma 3 270M (Q4_K_M GGUF), a base model: its on-policy text is SELF_PROMPTS (default
#            640) text openings it samples itself from BOS (make-draft --self-prompts), each
#            continued as above; evaluated with `specdec compare` (plain text) on the 12 prompts of
#            benchmarks/prompts/continuation_eval.txt (openings of kinds written by hand, none seen
#            in training).
#   1. `make-draft` builds each draft; later drafts reuse the first one's text and labels
#      (DATA_FROM). STEPS=0 gives the untrained draft.
#   2. `specdec compare`: target-only greedy vs assisted greedy (draft quantized at load to
#      DRAFT_WEIGHTS, default q8_0; EVAL_ARGS adds flags to both sides, e.g. "--int8-activations
#      --draft-int8-activations"), for each schedule of SCHEDULES (default: constant K=4 and
#      dynamic); one JSON line per run (compare_summary.py), then the mean per draft and schedule.
#      make-draft itself is given the same 12 prompts as --eval-prompts: its last line is the
#      draft's greedy agreement on the target's answers to them (offline, no timing).
#   MAKE_DRAFT_ARGS adds flags to make-draft (e.g. "--features" for a feature-fed draft).
# Usage: benchmarks/make_draft.sh TARGET BUILD_DIR WORK_DIR NAME LAYERS VOCAB_SUBSET STEPS [DATA_FROM]
#        (VOCAB_SUBSET 0 = full head; STEPS "-" evaluates WORK_DIR/NAME as it is). Output:
#        WORK_DIR/NAME (the draft) and WORK_DIR/NAME.eval.jsonl (EVAL_TAG, when set, goes into the
#        file name and the config labels). Every evaluation line, and make-draft's held-out lines when
#        it trained, are appended as records to benchmarks/results/make_draft_TARGET.jsonl
#        (benchmarks/bench_record.py's schema; kind "compare" and "held_out").
set -euo pipefail
command="bash benchmarks/make_draft.sh$(printf ' %q' "$@")"
run=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
cd "$(dirname "$0")/.."
target=$1 build=$2 work=$3 name=$4 layers=$5 vocab=$6 steps=$7 from=${8:-}
bin=$build/specdec
case $target in
  smollm2) model=models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf chat=(--chat)
           train=(--prompts benchmarks/prompts/draft_train.txt) ;;
  gemma3)  model=models/gemma3/gemma-3-270m-q4_k_m.gguf chat=()
           train=(--self-prompts "${SELF_PROMPTS:-640}") ;;
  *) echo "TARGET must be smollm2 or gemma3, not $target" >&2; exit 2 ;;
esac
[ -f "$model" ] || bash scripts/get_models.sh "$target"
mkdir -p "$work"
if [ "$target" = smollm2 ]; then awk 'NR % 2 == 1' benchmarks/prompts/draft_eval.txt
else cat benchmarks/prompts/continuation_eval.txt; fi > "$work/eval_prompts.txt"
args=(--target "$model" --out "$work/$name" --layers "$layers" --steps "$steps" --seq-len 128 --batch 8 --threads 2
      --checkpoint-every 250 --eval-prompts "$work/eval_prompts.txt")
read -r -a eval_args <<<"${EVAL_ARGS:-}"
read -r -a make_draft_args <<<"${MAKE_DRAFT_ARGS:-}"
args+=("${make_draft_args[@]}")
IFS=';' read -r -a schedules <<<"${SCHEDULES:---schedule constant --num-assistant-tokens 4;--schedule dynamic}"
tag=${EVAL_TAG:+.$EVAL_TAG}
[ "$vocab" -gt 0 ] && args+=(--vocab-subset "$vocab")
if [ -n "$from" ]; then args+=(--data-from "$from"); else
  args+=("${train[@]}" --gen-tokens 128 --gen-temperature "${GEN_TEMPERATURE:-0,0.7}"); fi
trained=0
if [ "$steps" != - ] && [ ! -d "$work/$name" ]; then
  { time "$bin" make-draft "${args[@]}"; } 2>&1 | tee "$work/$name.train.log" | grep -v '^\s*$' | tail -5
  trained=1
fi
out=$work/$name$tag.eval.jsonl
: > "$out"
for i in $(seq "$(wc -l < "$work/eval_prompts.txt")"); do
  for sched in "${schedules[@]}"; do
    # shellcheck disable=SC2086  # a schedule is a flag and its value
    sed -n "${i}p" "$work/eval_prompts.txt" |
      "$bin" compare --model "$model" --draft "$work/$name" --draft-weights "${DRAFT_WEIGHTS:-q8_0}" ${chat[@]+"${chat[@]}"} --max-new-tokens 128 \
        --threads 2 --json "${eval_args[@]}" $sched | python3 benchmarks/compare_summary.py "$name$tag ${sched##* }" "$i" >> "$out"
  done
done
python3 - "$out" "$run" "$command" "$name" "${EVAL_TAG:-}" "$work/$name.train.log" "$trained" "make_draft_$target" <<'PY'
import json, re, sys, collections
sys.path.insert(0, "benchmarks")
import bench_record
out, run, command, name, tag, train_log, trained, benchmark = sys.argv[1:]
env = ["MAKE_DRAFT_ARGS", "GEN_TEMPERATURE", "SELF_PROMPTS", "DRAFT_WEIGHTS", "EVAL_TAG", "EVAL_ARGS", "SCHEDULES"]
base = bench_record.common(benchmark, bench_record.with_env(command, env), 2, run)
records = []
if trained == "1":  # make-draft's own held-out figures, before and after training
    for m in re.finditer(r"held-out, (before training|after (\d+) steps): kl ([\d.]+), acceptance >= ([\d.]+), "
                         r"greedy agreement ([\d.]+) \((\d+) positions\)", open(train_log, errors="replace").read()):
        records.append(bench_record.complete({"kind": "held_out", "draft": name, "steps": int(m.group(2) or 0),
                                              "kl": float(m.group(3)), "acceptance_bound": float(m.group(4)),
                                              "greedy_agreement": float(m.group(5)), "positions": int(m.group(6))}, base))
rows = collections.defaultdict(list)
for line in open(out):
    j = json.loads(line); rows[j["config"]].append(j)
    sched = j["config"].rsplit(" ", 1)[1]
    fig = {k: v for k, v in j.items() if k != "config"}
    records.append(bench_record.complete({"kind": "compare", "draft": name, "tag": tag or None,
                                          "schedule": f"K={sched}" if sched.isdigit() else sched, **fig}, base))
bench_record.append(benchmark, records)
for cfg, rs in rows.items():
    mean = lambda k: sum(r[k] for r in rs) / len(rs)
    print(json.dumps({"config": cfg, "prompts": len(rs), "all_identical": all(r["identical"] for r in rs),
                      "speedup": round(mean("speedup"), 2), "acceptance": round(mean("acceptance"), 3),
                      "tokens_per_pass": round(mean("tokens_per_pass"), 2), "cost_ratio": round(mean("cost_ratio"), 3),
                      "greedy_ms_per_token": round(mean("greedy_ms_per_token"), 1),
                      "assisted_ms_per_token": round(mean("assisted_ms_per_token"), 1)}))
PY
