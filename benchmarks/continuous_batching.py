#!/usr/bin/env python3
"""Continuous batching against consecutive groups, target-only: N requests with ragged prompts and
ragged lengths (request i asks for NEW * (1 + i % 4) / 4 tokens) through `specdec generate
--prompts-file FILE --batch-size B` in one run (at most B at once, the next joining as one
finishes), against the same requests in consecutive groups of B (one run per group: a group
ends with its longest request). Tokens/s are the program's own (loading left out); rounds
interleave the two. Greedy output must be the same. The medians are appended as a record to
benchmarks/results/continuous_batching.jsonl (benchmarks/bench_record.py's schema).

Usage: benchmarks/continuous_batching.py BUILD_DIR MODEL [--requests 16] [--new-tokens 32]
       [--batch-size 4] [--threads 2] [--rounds 3]
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
ap.add_argument("model")
ap.add_argument("--requests", type=int, default=16)
ap.add_argument("--new-tokens", type=int, default=32)
ap.add_argument("--batch-size", type=int, default=4)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--rounds", type=int, default=3)
a = ap.parse_args()

requests = []
for i in range(a.requests):
    n = 8 + 7 * (i % 8)
    requests.append({"prompt_ids": [3 + (j * 7919 + i * 104729) % 31000 for j in range(n)],
                     "max_new_tokens": max(1, a.new_tokens * (1 + i % 4) // 4)})


def run(lines):
    """Tokens, seconds (the program's summary) and output tokens of one run over `lines`."""
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    try:
        with os.fdopen(fd, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in lines)
        cmd = [os.path.join(a.build, "specdec"), "generate", "--model", a.model, "--prompts-file", path,
               "--batch-size", str(a.batch_size), "--threads", str(a.threads)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
        tokens, seconds = re.findall(r"(\d+) tokens in ([0-9.]+) s", p.stderr)[-1]
        return int(tokens), float(seconds), [json.loads(l)["tokens"] for l in p.stdout.splitlines()]
    finally:
        os.unlink(path)


base = bench_record.common("continuous_batching", bench_record.command_line(), a.threads)
rates = {"continuous": [], "groups": []}
for _ in range(a.rounds):
    tokens, seconds, cont = run(requests)
    rates["continuous"].append(tokens / seconds)
    tokens = seconds = 0
    grouped = []
    for g in range(0, len(requests), a.batch_size):
        t, s, out = run(requests[g:g + a.batch_size])
        tokens, seconds, grouped = tokens + t, seconds + s, grouped + out
    rates["groups"].append(tokens / seconds)
    if cont != grouped:
        sys.exit("greedy output differs between continuous batching and groups")
    print(json.dumps({k: round(v[-1], 1) for k, v in rates.items()}), flush=True)
c, g = statistics.median(rates["continuous"]), statistics.median(rates["groups"])
print(f"B={a.batch_size}, {a.requests} requests: continuous {c:.1f} tokens/s, groups of {a.batch_size} {g:.1f} "
      f"tokens/s: {c / g:.2f}x (medians of {a.rounds}); identical greedy output")
bench_record.append("continuous_batching", [bench_record.complete(
    {"model": a.model, "batch_size": a.batch_size, "requests": a.requests, "new_tokens": a.new_tokens, "rounds": a.rounds,
     "continuous_tokens_per_s": round(c, 1), "groups_tokens_per_s": round(g, 1), "ratio": round(c / g, 2),
     "identical": True}, {**base, "date": bench_record.now()})])
