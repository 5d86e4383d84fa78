#!/usr/bin/env python3
"""How far suffix speculation can go on a workload, whatever the engine: replays the target's own
greedy answers to a --prompts-file of chat requests (`specdec generate --chat --prompts-file FILE`,
one Generator, in order) and counts, for each way of choosing what to verify, the tokens kept per
pass and the speedup at a cost model where a pass over 1 + k tokens costs 1 + slope x k one-token
passes (no other overhead), as benchmarks/lookup_replay.py does for prompt lookup. The proposals
follow SuffixTree's rules (include/specdec/suffix.hpp, the defaults of SuffixOptions): a tree over
the request's prompt and answer so far, one over the earlier answers (each with the last 8 prompt
tokens before it); for each suffix of the text that occurs followed by something, its most frequent
continuation while the product of each token's count / (siblings' counts + 1 / (x - 0.8)) stays at
or above 0.1, at most the match's length and 16 tokens; the highest sum of those products wins.
The rules:
  suffix          the proposal as it is (a constant schedule)
  estimate (cut)  cut to the length with the most expected tokens per cost by those products
                  (goodput's cut before its calibration)
  cut right       cut where the answer leaves it: what a perfect estimate of how far each
                  proposal goes on would reach with these proposals
  oracle          the longest continuation of any earlier position, in the request or in an
                  earlier request's prompt and answer, that the answer really takes (an upper bound
                  for every rule that copies earlier text)
  oracle, m-token match   the same among the earlier positions after the text's last m tokens
                  (m = 1, 2): m = 1 bounds every chain copied from after a match of the text's
                  last tokens, as suffix trees and prompt lookup propose
Usage: benchmarks/suffix_replay.py BUILD_DIR MODEL [--prompts FILE] [--slope 0.28 0.16]
(FILE: JSON Lines of {"prompt", "system"?, "max_new_tokens"?}; default benchmarks/prompts/repetitive.jsonl.
Slopes: what one more token adds to a pass, relative to a one-token pass, as lookup_replay.py's.)"""
import argparse
import json
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("model")
ap.add_argument("--prompts", default=os.path.join(HERE, "prompts", "repetitive.jsonl"))
ap.add_argument("--slope", type=float, nargs="+", default=[0.28, 0.16])
a = ap.parse_args()
specdec = os.path.join(a.build, "specdec")
requests = [json.loads(l) for l in open(a.prompts) if l.strip()]
run = subprocess.run([specdec, "generate", "--model", a.model, "--chat", "--prompts-file", a.prompts],
                     capture_output=True, text=True, check=True)
answers = [json.loads(l)["tokens"] for l in run.stdout.splitlines() if l.strip()]
prompts = []
for r in requests:
    cmd = [specdec, "tokenize", "--tokenizer", a.model, "--chat", "--json", "--text", r["prompt"]]
    if "system" in r:
        cmd += ["--system", r["system"]]
    prompts.append(json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["ids"])
eos = set(json.loads(subprocess.run([specdec, "tokenize", "--tokenizer", a.model, "--no-special", "--json",
                                     "--text", "<|im_end|>"], capture_output=True, text=True,
                                    check=True).stdout)["ids"][-1:])
MAX_DEPTH, MIN_PROB, FACTOR, MAX_TOKENS, CONTEXT = 32, 0.1, 1.0, 16, 8


class Tree:
    """Counts of every token string of up to MAX_DEPTH tokens: node = [count, {token: node}]."""

    def __init__(self):
        self.root, self.open = [0, {}], {}

    def extend(self, seq, tokens):
        for t in tokens:
            nodes = []
            for node, depth in self.open.get(seq, []) + [(self.root, 0)]:
                child = node[1].setdefault(t, [0, {}])
                child[0] += 1
                if depth + 1 < MAX_DEPTH:
                    nodes.append((child, depth + 1))
            self.open[seq] = nodes

    def propose(self, ctx):
        """(tokens, per-token probabilities, score): SuffixTree::propose."""
        best = ([], [], 0.0)
        for m in range(1, min(len(ctx), MAX_DEPTH - 1) + 1):
            node = self.root
            for t in ctx[len(ctx) - m:]:
                node = node[1].get(t)
                if node is None:
                    return best
            if not node[1]:
                return best
            limit = min(MAX_TOKENS, max(1, int(FACTOR * m)))
            toks, probs, score, reach = [], [], 0.0, 1.0
            while len(toks) < limit and node[1]:
                total = sum(c[0] for c in node[1].values())
                t, node = max(node[1].items(), key=lambda kv: (kv[1][0], -kv[0]))
                x = m + len(toks)
                own = node[0] / (total + (x + 0.2) / (x - 0.8) - 1)
                reach *= own
                if reach < MIN_PROB:
                    break
                toks.append(t)
                probs.append(own)
                score += reach
                if t in eos:
                    break
            if toks and score >= best[2]:
                best = (toks, probs, score)
        return best


def replay(cut, slope):
    """(tokens per pass, speedup) when cut(proposal, probs, answer, i, earlier) gives what is verified."""
    shared, earlier = Tree(), []
    tokens = cost = passes = 0
    for n, (prompt, answer) in enumerate(zip(prompts, answers)):
        own = Tree()
        own.extend(0, prompt)
        i = 0
        while i < len(answer):
            ctx = prompt + answer[:i]
            mine, theirs = own.propose(ctx), shared.propose(ctx)
            cand, probs, _ = theirs if theirs[2] > mine[2] else mine
            cand = cut(cand, probs, ctx, answer, i, earlier, slope)[:max(0, len(answer) - i - 1)]
            kept = 0
            while kept < len(cand) and cand[kept] == answer[i + kept]:
                kept += 1
            own.extend(0, answer[i:i + kept + 1])
            tokens, cost, passes, i = tokens + kept + 1, cost + 1 + slope * len(cand), passes + 1, i + kept + 1
        kept_seq = prompt[-CONTEXT:] + answer
        shared.extend(n, kept_seq)
        earlier.append(prompt + answer)
    return tokens / passes, tokens / cost


def as_proposed(cand, probs, ctx, answer, i, earlier, slope):
    return cand


def estimate_cut(cand, probs, ctx, answer, i, earlier, slope):
    best, best_rate, reach, expected = 0, 1.0, 1.0, 1.0
    for k, p in enumerate(probs, 1):
        reach *= p
        expected += reach
        if expected / (1 + slope * k) > best_rate:
            best, best_rate = k, expected / (1 + slope * k)
    return cand[:best]


def cut_right(cand, probs, ctx, answer, i, earlier, slope):
    k = 0
    while k < len(cand) and i + k < len(answer) and cand[k] == answer[i + k]:
        k += 1
    return cand[:k]


def oracle(m):
    """The longest continuation the answer takes of any earlier position whose m tokens before it
    are the text's last m tokens (m = 0: of any earlier position)."""
    return lambda cand, probs, ctx, answer, i, earlier, slope: longest_copy(ctx, answer, i, earlier, m)


def longest_copy(ctx, answer, i, earlier, m):
    best, tail = [], ctx[len(ctx) - m:]
    for text in earlier + [ctx]:
        for j in range(max(1, m), len(text)):
            if m and text[j - m:j] != tail:
                continue
            k = 0
            while j + k < len(text) and i + k < len(answer) - 1 and text[j + k] == answer[i + k]:
                k += 1
            if k > len(best):
                best = text[j:j + k]
    return best


print(f"{len(answers)} answers, {sum(map(len, answers))} tokens ({a.prompts})")
for slope in a.slope:
    print(f"\npass over 1 + k tokens = 1 + {slope} k one-token passes\n| rule | tokens per pass | speedup |\n|---|---|---|")
    for name, rule in [("suffix", as_proposed), ("estimate (cut)", estimate_cut), ("cut right", cut_right),
                       ("oracle", oracle(0)), ("oracle, 1-token match", oracle(1)),
                       ("oracle, 2-token match", oracle(2))]:
        tpp, speedup = replay(rule, slope)
        print(f"| {name} | {tpp:.2f} | {speedup:.2f}x |")
