#!/usr/bin/env python3
"""How far prompt lookup can go on a workload, whatever the engine: replays the target's own greedy
answers (`specdec generate --chat --prompts-file FILE`) and counts, for each way of choosing
what to verify, the tokens kept per pass and the speedup at a cost model where a pass over 1 + k
tokens costs 1 + slope x k one-token passes (no other overhead). The rules:
  hf K          Hugging Face's prompt lookup (leftmost match of the last 2 tokens, then 1), K tokens
  estimate      the same copy, cut to the length with the most expected tokens per cost by specdec's
                own estimates (PromptLookupGenerator: hits / places x (x - 0.8) / (x + 0.2), x the
                match's span plus the token's depth)
  hf, cut right Hugging Face's copy (10 tokens) cut where the answer leaves it: what a perfect
                estimate of how far each copy goes on would reach
  oracle        the longest continuation of any earlier position that the answer really takes (an
                upper bound for every rule that copies from the text)
Usage: benchmarks/lookup_replay.py BUILD_DIR MODEL PROMPTS [--slope 0.28 0.16] [--max-new-tokens 128]
(PROMPTS: JSON Lines as --prompts-file takes them, or one prompt a line)
First it prints how often a copy goes on, by how long the match is (the longest earlier context
that agrees with the text's end) and by depth (given the tokens before it were right): the table
the estimate's second factor follows.
(slopes: what one more token adds to a pass, relative to a one-token pass; `specdec_micro_bench`'s
ModelPass gives them for a CPU: 0.28 float32 and 0.16 8-bit activations on SmolLM2 Q4_1, 2 threads,
a 2-vCPU Intel Xeon with AMX). Prints one table per slope; the answers are computed once."""
import argparse
import json
import subprocess

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("model")
ap.add_argument("prompts")
ap.add_argument("--slope", type=float, nargs="+", default=[0.28, 0.16])
ap.add_argument("--max-new-tokens", type=int, default=128, help="for a prompt file of one prompt a line")
a = ap.parse_args()
specdec = f"{a.build}/specdec"
if a.prompts.endswith(".jsonl"):
    requests = [json.loads(l) for l in open(a.prompts) if l.strip()]
else:  # one prompt a line (benchmarks/prompts/grounded.txt)
    requests = [{"prompt": l.strip(), "max_new_tokens": a.max_new_tokens} for l in open(a.prompts) if l.strip()]
run = subprocess.run([specdec, "generate", "--model", a.model, "--chat", "--prompts-file", "-",
                      "--max-new-tokens", str(a.max_new_tokens)],
                     input="".join(json.dumps(r) + "\n" for r in requests), capture_output=True, text=True, check=True)
answers = [json.loads(l) for l in run.stdout.splitlines() if l.strip()]
# The context a copy can come from: the prompt's text tokenized alone (the chat template's markers,
# which answers do not copy, left out), then the answer so far.
seqs = []
for req, ans in zip(requests, answers):
    ids = json.loads(subprocess.run([specdec, "tokenize", "--tokenizer", a.model, "--no-special", "--json",
                                     "--text", req.get("system", "") + "\n" + req["prompt"]],
                                    capture_output=True, text=True, check=True).stdout)["ids"]
    seqs.append((ids, ans["tokens"]))


def hf_match(ctx):
    """Hugging Face's rule (max_matching_ngram_size 2): (n, start of the copy) or (0, None)."""
    for n in range(min(2, len(ctx) - 1), 0, -1):
        for s in range(len(ctx) - n):
            if ctx[s:s + n] == ctx[len(ctx) - n:]:
                return n, s + n
    return 0, None


def estimates(ctx, n, j, copy):
    """PromptLookupGenerator's estimate of each copied token (src/candidates.cpp, lookup_probs)."""
    s, span = j - n, n
    while span < 64 and s - 1 - (span - n) >= 0 and ctx[s - 1 - (span - n)] == ctx[len(ctx) - 1 - span]:
        span += 1
    out = []
    for d, t in enumerate(copy):
        seq = ctx + copy[:d]
        pat = seq[len(seq) - (n + d):]
        places = [i for i in range(len(seq) - (n + d)) if seq[i:i + n + d] == pat]
        hits = sum(seq[i + n + d] == t for i in places)
        x = span + d
        out.append(hits / len(places) * (x - 0.8) / (x + 0.2))
    return out


def replay(choose, slope):
    """(tokens per pass, speedup) when choose(ctx, answer, i) gives the candidates verified at i."""
    tokens = cost = passes = 0
    for prompt, answer in seqs:
        i = 0
        while i < len(answer):
            cand = choose(prompt + answer[:i], answer, i)[:max(0, len(answer) - i - 1)]
            kept = 0
            while kept < len(cand) and cand[kept] == answer[i + kept]:
                kept += 1
            tokens, cost, passes, i = tokens + kept + 1, cost + 1 + slope * len(cand), passes + 1, i + kept + 1
    return tokens / passes, tokens / cost


def hf(k):
    return lambda ctx, answer, i: (lambda n, j: ctx[j:j + k] if j is not None else [])(*hf_match(ctx))


def by_estimate(slope):
    def choose(ctx, answer, i):
        n, j = hf_match(ctx)
        if j is None:
            return []
        copy = ctx[j:j + 10]
        best, best_rate, reach, expected = 0, 1.0, 1.0, 1.0
        for k, p in enumerate(estimates(ctx, n, j, copy), 1):
            reach *= p
            expected += reach
            if expected / (1 + slope * k) > best_rate:
                best, best_rate = k, expected / (1 + slope * k)
        return copy[:best]
    return choose


def hf_cut_right(ctx, answer, i):
    n, j = hf_match(ctx)
    copy = [] if j is None else ctx[j:j + 10]
    k = 0
    while k < len(copy) and i + k < len(answer) and copy[k] == answer[i + k]:
        k += 1
    return copy[:k]


def oracle(ctx, answer, i):
    best = []
    for j in range(1, len(ctx)):
        k = 0
        while j + k < len(ctx) and i + k < len(answer) - 1 and ctx[j + k] == answer[i + k]:
            k += 1
        if k > len(best):
            best = ctx[j:j + k]
    return best


def longest_match(ctx, cap=64):
    """(m, j): the copy start j whose preceding tokens agree longest (m, at most cap) with the end of
    ctx (the most recent of the longest); (0, None) when no token agrees."""
    best_m, best_j = 0, None
    for j in range(1, len(ctx)):
        m = 0
        while m < cap and j - 1 - m >= 0 and j - 1 - m != len(ctx) - 1 - m and ctx[j - 1 - m] == ctx[len(ctx) - 1 - m]:
            m += 1
        if m and m >= best_m:
            best_m, best_j = m, j
    return best_m, best_j


n_tokens = sum(len(t) for _, t in seqs)
print(f"{len(seqs)} answers, {n_tokens} tokens ({a.prompts})")
# At every position of the answers: the longest match's copy, and how far the answer follows it.
buckets = [(1, 1), (2, 2), (3, 3), (4, 4), (5, 7), (8, 15), (16, 64)]
tries = [[0] * 6 for _ in buckets]
kept = [[0] * 6 for _ in buckets]
for prompt, answer in seqs:
    for i in range(len(answer) - 1):
        m, j = longest_match(prompt + answer[:i])
        if j is None:
            continue
        b = next(n for n, (lo, hi) in enumerate(buckets) if lo <= m <= hi)
        ctx = prompt + answer[:i]
        for d, t in enumerate(ctx[j:j + 6]):
            if i + d >= len(answer):
                break
            tries[b][d] += 1
            if t != answer[i + d]:
                break
            kept[b][d] += 1
print("\nhow often the copy's token at depth d is the answer's, given the ones before it were, by match length"
      " (tries in brackets)\n| match | " + " | ".join(f"d = {d}" for d in range(6)) + " |\n|---|" + "---|" * 6)
for (lo, hi), t, k in zip(buckets, tries, kept):
    name = str(lo) if lo == hi else f"{lo}-{hi}"
    print(f"| {name} | " + " | ".join(f"{k[d] / t[d]:.2f} ({t[d]})" if t[d] else "-" for d in range(6)) + " |")
for slope in a.slope:
    print(f"\npass over 1 + k tokens = 1 + {slope} k one-token passes\n| rule | tokens per pass | speedup |\n|---|---|---|")
    rules = [(f"hf K={k}", hf(k)) for k in (1, 2, 3, 5, 10)] + [("estimate (cut)", by_estimate(slope)),
                                                         ("hf, cut right", hf_cut_right), ("oracle", oracle)]
    for name, rule in rules:
        tpp, speedup = replay(rule, slope)
        print(f"| {name} | {tpp:.2f} | {speedup:.2f}x |")
