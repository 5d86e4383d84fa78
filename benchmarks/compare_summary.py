"""Reads one `specdec compare --json` object on stdin; prints one JSON line of its key figures.
Usage: specdec compare ... --json | python3 benchmarks/compare_summary.py LABEL [PROMPT]
(PROMPT, when given: the prompt's number, a "prompt" field after "config")"""
import json
import sys

j = json.load(sys.stdin)
a, t = j["assisted"]["stats"], j["target_only"]["stats"]
print(json.dumps({
    "config": sys.argv[1], **({"prompt": int(sys.argv[2])} if len(sys.argv) > 2 else {}), "identical": j["identical"],
    "greedy_ms_per_token": round(1e3 * t["total_seconds"] / t["new_tokens"], 1),
    "assisted_ms_per_token": round(1e3 * a["total_seconds"] / a["new_tokens"], 1),
    # None for trees, when nothing was drafted, or when the draft's cost was not measured
    "speedup": round(j["speedup"], 2), "predicted": j["predicted_speedup"] and round(j["predicted_speedup"], 2),
    "share_of_predicted": round(j["speedup"] / j["predicted_speedup"], 2) if j["predicted_speedup"] else None,
    # the same with the verification passes' measured cost (None also when no pass after the first was timed)
    "predicted_with_pass_cost": j.get("predicted_speedup_with_pass_cost") and round(j["predicted_speedup_with_pass_cost"], 2),
    "pass_ratio": j.get("pass_ratio") and round(j["pass_ratio"], 3),
    "target_passes": a["target_passes"], "draft_passes": a["draft_passes"],
    "acceptance": round(a["acceptance_rate"], 3), "tokens_per_pass": round(a["tokens_per_target_pass"], 2),
    "cost_ratio": j["cost_ratio"] and round(j["cost_ratio"], 3),  # None when not measured
    "encoder_passes": a["encoder_passes"]}))
