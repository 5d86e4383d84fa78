#!/usr/bin/env python3
"""Throughput of batched generation: tokens/s at batch sizes 1, 2, 4, 8 with ragged prompts,
target-only and assisted (constant K=5, dynamic, goodput, prompt lookup alone and under goodput), through
`specdec generate --prompts-file FILE --batch-size B` (at most B requests at once, the next joining
as one finishes; the figure excludes loading: it is the program's own tokens/s over the requests;
"after the prefill" leaves the passes over the prompts out). Prints one JSON line per run, then a table with the
speedup of each mode over target-only at the same B (medians over --rounds interleaved rounds) and the
gain of batching over B = 1, and appends
the runs to benchmarks/results/batch_throughput.jsonl (benchmarks/bench_record.py's schema; one record
per mode and B, with "identical": whether greedy output was the same in every run).

Usage: benchmarks/batch_throughput.py BUILD_DIR TARGET [DRAFT] [--requests N] [--new-tokens N]
       [--threads N] [--batch-sizes 1,2,4,8] [--rounds N] [--text] [--modes A,B]
       [--extra 'flags for both models']
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import bench_record

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("target")
ap.add_argument("draft", nargs="?")
ap.add_argument("--requests", type=int, default=8)
ap.add_argument("--new-tokens", type=int, default=16)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--batch-sizes", default="1,2,4,8")
ap.add_argument("--rounds", type=int, default=1, help="rounds of every mode and B, interleaved; medians reported")
ap.add_argument("--text", action="store_true", help="chat prompts from benchmarks/prompts/grounded.txt (needs a tokenizer)")
ap.add_argument("--extra", default="")
ap.add_argument("--modes", default="", help="comma-separated subset of the modes (target-only always runs)")
a = ap.parse_args()

# Ragged prompts: lengths 8, 15, 22, ... tokens of a fixed pseudo-random sequence, or chat prompts.
requests = []
if a.text:
    lines = [l.strip() for l in open(os.path.join(os.path.dirname(__file__), "prompts", "grounded.txt")) if l.strip()]
    for i in range(a.requests):
        requests.append({"prompt": lines[i % len(lines)], "max_new_tokens": a.new_tokens})
else:
    for i in range(a.requests):
        n = 8 + 7 * i
        requests.append({"prompt_ids": [3 + (j * 7919 + i * 104729) % 31000 for j in range(n)], "max_new_tokens": a.new_tokens})
fd, path = tempfile.mkstemp(suffix=".jsonl")
with os.fdopen(fd, "w") as f:
    for r in requests:
        f.write(json.dumps(r) + "\n")

modes = [("target-only", [])]
if a.draft:
    modes += [("constant K=5", ["--draft", a.draft, "--schedule", "constant", "--num-assistant-tokens", "5"]),
              ("dynamic", ["--draft", a.draft, "--schedule", "dynamic"]),
              ("goodput", ["--draft", a.draft, "--schedule", "goodput"])]
# Prompt lookup and suffix speculation schedule by goodput unless told otherwise.
modes += [("prompt lookup 5 (constant)", ["--prompt-lookup", "5", "--schedule", "constant"]),
          ("prompt lookup 5 (goodput)", ["--prompt-lookup", "5"]),
          ("suffix (goodput)", ["--speculate", "suffix"])]
if a.modes:
    keep = set(a.modes.split(",")) | {"target-only"}
    modes = [m for m in modes if m[0] in keep]
sizes = [int(x) for x in a.batch_sizes.split(",")]
results = {}
base = bench_record.common("batch_throughput", bench_record.command_line(), a.threads)
base.update(model=a.target, draft=a.draft, requests=a.requests, new_tokens=a.new_tokens, extra=a.extra,
            prompts="grounded.txt (chat)" if a.text else "token ids")
records = []
try:
    for rnd in range(a.rounds):
        for b in sizes:  # interleaved: every mode at one B before the next B
            for name, flags in modes:
                cmd = [os.path.join(a.build, "specdec"), "generate", "--model", a.target, "--prompts-file", path,
                       "--batch-size", str(b), "--threads", str(a.threads)] + (["--chat"] if a.text else []) + flags + a.extra.split()
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
                # The program's summary: tokens/s over the requests, and with the passes over prompts left out.
                rate, decode = map(float, re.findall(r"([0-9.]+) tokens/s \(([0-9.]+) after the prefill\)", p.stderr)[-1])
                outs = [json.loads(l) for l in p.stdout.splitlines()]
                tokens = [o["tokens"] for o in outs]
                results.setdefault((name, b), []).append((rate, tokens, decode))
                line = {"mode": name, "batch": b, "round": rnd, "tokens_per_second": rate,
                        "after_prefill_tokens_per_second": round(decode, 2),
                        "acceptance": round(sum(o["stats"]["accepted_tokens"] for o in outs) /
                                            max(1, sum(o["stats"]["drafted_tokens"] for o in outs)), 3)}
                print(json.dumps(line), flush=True)
                records.append(bench_record.complete(line, {**base, "date": bench_record.now()}))
finally:
    os.unlink(path)

# Greedy output must not depend on the mode, the batch size or the round.
ref = results[("target-only", sizes[0])][0][1]
same = all(r[1] == ref for runs in results.values() for r in runs)
print("appended to " + bench_record.append("batch_throughput", [{**r, "identical": same} for r in records]), file=sys.stderr)
def median(results, name, b, i):
    return statistics.median(r[i] for r in results[(name, b)])


print(f"\nidentical greedy output in every run: {same}")
print("| mode | " + " | ".join(f"B={b} tok/s (vs target-only)" for b in sizes) + f" | B={sizes[-1]} / B={sizes[0]} |")
print("|---|" + "---|" * (len(sizes) + 1))
for what, i in (("whole requests", 0), ("after the prefill", 2)):
    print(f"| {what} |" + " |" * (len(sizes) + 1))
    for name, _ in modes:
        cells = []
        for b in sizes:
            r = median(results, name, b, i)
            ratios = [x[i] / t[i] for x, t in zip(results[(name, b)], results[("target-only", b)])]
            cells.append(f"{r:.1f} ({statistics.median(ratios):.2f}x)")
        gain = median(results, name, sizes[-1], i) / median(results, name, sizes[0], i)
        print(f"| {name} | " + " | ".join(cells) + f" | {gain:.2f}x |")
if not same:
    sys.exit("greedy output differs between runs")
