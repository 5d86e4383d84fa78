#!/usr/bin/env python3
"""Suffix speculation on a repetitive workload: the chat requests of benchmarks/prompts/repetitive.jsonl
(JSON extraction from short biographies, edits of one Python file, questions over one passage,
interleaved) one after another through one Generator (`specdec generate --chat --prompts-file`),
target-only against prompt lookup (under goodput and constant K) and suffix speculation, chains and
trees (--suffix-tree). The figure is the generation time after the prefill (the sum of each
request's total_seconds - prefill_seconds, the program's own timing); rounds interleave the settings
and the medians are kept. Greedy output must be the same token for token in every setting. One
record per setting is appended to benchmarks/results/suffix.jsonl (benchmarks/bench_record.py's
schema).

Usage: benchmarks/suffix.py BUILD_DIR MODEL [--prompts FILE] [--threads 2] [--rounds 3]
       [--activations float32 int8]   (one table per activation mode, in one run)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import bench_record

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("model")
ap.add_argument("--prompts", default=os.path.join(HERE, "prompts", "repetitive.jsonl"))
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--activations", nargs="+", choices=["float32", "int8"], default=["float32", "int8"],
                help="int8: every setting with --int8-activations")
a = ap.parse_args()

SETTINGS = [
    ("target-only", []),
    ("prompt lookup 3 (goodput)", ["--prompt-lookup", "3"]),
    ("prompt lookup 10 (goodput)", ["--prompt-lookup", "10"]),
    ("prompt lookup 10 (constant)", ["--prompt-lookup", "10", "--schedule", "constant"]),
    ("suffix (goodput)", ["--speculate", "suffix"]),
    ("suffix (constant 16)", ["--speculate", "suffix", "--schedule", "constant"]),
    ("suffix tree (goodput)", ["--speculate", "suffix", "--suffix-tree"]),
    ("suffix tree (constant 8)", ["--speculate", "suffix", "--suffix-tree", "--schedule", "constant",
                                  "--num-assistant-tokens", "8"]),
]


def run(flags, int8):
    """(decode seconds, prefill seconds, new tokens, target passes, outputs) of one run."""
    cmd = [os.path.join(a.build, "specdec"), "generate", "--model", a.model, "--chat", "--prompts-file", a.prompts,
           "--threads", str(a.threads)] + (["--int8-activations"] if int8 else []) + flags
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    st = [l["stats"] for l in lines]
    return (sum(s["total_seconds"] - s["prefill_seconds"] for s in st), sum(s["prefill_seconds"] for s in st),
            sum(s["new_tokens"] for s in st), sum(s["target_passes"] for s in st), [l["tokens"] for l in lines])


base = bench_record.common("suffix", bench_record.command_line(), a.threads)
records = []
for activations in a.activations:
    samples = {name: [] for name, _ in SETTINGS}
    for r in range(a.rounds):
        for name, flags in SETTINGS:
            samples[name].append(run(flags, activations == "int8"))
            print(f"{activations}, round {r + 1}: {name}: {samples[name][-1][0]:.2f} s after the prefill",
                  file=sys.stderr)
    # int8 activations change the target's numbers: each mode's settings are compared among themselves.
    reference = samples["target-only"][0][4]
    base_decode = statistics.median(s[0] for s in samples["target-only"])
    best_lookup = min(statistics.median(s[0] for s in samples[n]) for n, _ in SETTINGS
                      if n.startswith("prompt lookup"))
    for name, _ in SETTINGS:
        runs = samples[name]
        decode = statistics.median(s[0] for s in runs)
        tokens, passes = runs[0][2], runs[0][3]
        rec = {"config": name, "activations": activations, "requests": len(reference), "new_tokens": tokens,
               "identical": all(s[4] == reference for s in runs),
               "decode_seconds": round(decode, 3),
               "prefill_seconds": round(statistics.median(s[1] for s in runs), 3),
               "decode_tokens_per_s": round(tokens / decode, 2), "speedup": round(base_decode / decode, 3),
               "over_best_lookup": round(best_lookup / decode, 3), "target_passes": passes,
               "tokens_per_pass": round(tokens / passes, 2), "rounds": a.rounds}
        records.append(bench_record.complete(rec, base))
        print(json.dumps(records[-1]))
bench_record.append("suffix", records)
if not all(r["identical"] for r in records):
    sys.exit("greedy outputs differ between settings")
