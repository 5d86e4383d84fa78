"""Writes docs/benchmarks.md, its plots and the README's table, from the records in benchmarks/results/*.jsonl (the schema of
benchmarks/bench_record.py): per benchmark the latest run in full (machine, threads, command, commit,
date, its tables), the earlier runs below it, one row each.
Usage: python benchmarks/report.py [--results FILE_OR_DIR ...] [--docs DIR] [--readme FILE] [--no-plots]
--no-plots writes the Markdown only (no matplotlib needed; the plots already in DIR stay)."""
import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report_peer  # noqa: E402
import report_tables as T  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
COMMON = ("benchmark", "run", "date", "commit", "cpu", "cpus", "threads", "command")
META = set(COMMON) | {"note", "source"}

# (benchmark, title, what it measures, section function); benchmarks not listed get T.generic at the end.
SECTIONS = [
    ("llama_cpp_peer", "specdec beside llama.cpp on the same GGUF files",
     "`bash benchmarks/llama_cpp_peer.sh build 3 1 2`: decode, passes of 1-128 tokens, peak RSS, the memory-bandwidth "
     "floor and speculative decoding, both engines interleaved on the same files (SmolLM2-135M-Instruct as shipped and "
     "requantized, Gemma 3 270M Q4_K_M as shipped, the synthetic 1.1B Llama pair converted by llama.cpp's own "
     "converter; `PEER_PARTS` runs some of them).", report_peer.section),
    ("serve_peer", "Serving: `specdec serve` beside llama-server",
     "`bash benchmarks/serve_peer.sh build`: closed-loop streaming chat clients (`benchmarks/serve_load.py`), greedy, "
     "SmolLM2-135M-Instruct Q4_1 for both servers, one server at a time; TTFT = time to first token, ITL = inter-token "
     "latency.", T.serve_peer),
    ("serve_lookup", "Serving: prompt lookup", "Part `lookup` of `benchmarks/serve_peer.sh`: `--prompt-lookup 10` "
     "under constant K, as given (goodput) and with `--prompt-lookup-match last`, against target-only on the grounded "
     "prompts (`benchmarks/prompts/grounded.txt`); the `-int8` rows against target-only with `--int8-activations`.",
     T.serve_lookup),
    ("serve_goodput", "Serving: goodput with a draft", "Part `goodput` of `benchmarks/serve_peer.sh`: `--draft D "
     "--schedule goodput` against target-only on the chat prompts (by default a 4-layer early-exit draft the target "
     "rejects: what goodput costs when drafting does not pay).", T.serve_goodput),
    ("serve_http", "Serving: the HTTP layer's cost", "Part `http` of `benchmarks/serve_peer.sh`: the requests of 8 "
     "clients through `specdec generate --batch-size 8` in one process against the same through `specdec serve` at 8 "
     "clients.", T.serve_http),
    ("llama_cpp_decode", "Decode beside llama.cpp", "`bash benchmarks/llama_cpp_decode.sh BUILD ROUNDS FILE...`: a "
     "32-token greedy decode, specdec and `llama-bench -p 0 -n 32` alternating on the same files.", T.llama_cpp_decode),
    ("prefill", "Prefill of 128 tokens", "`bash benchmarks/prefill.sh BUILD ROUNDS FILE...`: specdec per kernel family "
     "and activation mode beside `llama-bench -p 128 -n 0`.", T.prefill),
    ("peak_rss", "Peak resident memory", "`bash benchmarks/peak_rss.sh BUILD FILE...`: peak RSS of `specdec generate` "
     "(a 128-token prompt, 1 thread) less the runtime's (`specdec --help`), against the file's size.", T.peak_rss),
    ("weight_formats", "SmolLM2 in every weight format", "`bash benchmarks/weight_formats.sh`: greedy decode of 128 "
     "tokens with `--weights FORMAT`, formats interleaved, medians of the rounds.", T.generic),
    ("batch_throughput", "Batches: throughput", "`python3 benchmarks/batch_throughput.py BUILD TARGET [DRAFT]`: 8 "
     "requests with ragged prompts through `specdec generate --prompts-file --batch-size B`, target-only and assisted, "
     "tokens/s over the whole requests and after the prefill.", T.batch_throughput),
    ("continuous_batching", "Continuous batching", "`python3 benchmarks/continuous_batching.py`: requests of ragged "
     "lengths through `--batch-size B` in one run against consecutive groups of B.", T.generic),
    ("schedule_rounds", "Schedules at B = 1, round by round", "Rounds of one `specdec generate --prompts-file` run per "
     "schedule (goodput against fixed K), interleaved, as kept in the logs of the goodput work.", T.schedule_rounds),
    ("e2e_speedup", "Speculation on the synthetic pair", "`bash benchmarks/e2e_speedup.sh`: `specdec compare` per "
     "configuration on the synthetic 1.1B Llama pair (random weights, early-exit draft) or its T5 counterpart.",
     T.per_config),
    ("smollm2_speculation", "Speculation on SmolLM2", "`bash benchmarks/smollm2_speculation.sh`: prompt lookup on "
     "grounded prompts and early-exit drafts cut from the model, one `specdec compare --chat` per line.", T.per_config),
    ("make_draft_smollm2", "Drafts made for SmolLM2 (`specdec make-draft`)", "`bash "
     "benchmarks/make_draft.sh smollm2`: a draft trained on the target's own answers, evaluated with `specdec compare "
     "--chat` on 12 prompts outside training.", T.make_draft),
    ("make_draft_gemma3", "Drafts made for Gemma 3 270M (`specdec make-draft`)", "`bash "
     "benchmarks/make_draft.sh gemma3`: a draft trained on the base model's continuations of text openings it wrote "
     "itself, evaluated with `specdec compare` on the 12 text openings of "
     "`benchmarks/prompts/continuation_eval.txt`.", T.make_draft),
    ("suffix", "Suffix speculation on a repetitive workload", "`python3 benchmarks/suffix.py BUILD MODEL`: the 36 "
     "chat requests of `benchmarks/prompts/repetitive.jsonl` (JSON extraction, edits of one file, questions over one "
     "passage, interleaved) one after another through one `specdec generate --chat --prompts-file`; generation time "
     "after the prefill, medians of interleaved rounds; greedy output identical in every setting.", T.generic),
    ("prompt_lookup", "Prompt lookup on a copying target", "`bash benchmarks/prompt_lookup.sh`: a target of the pair's "
     "size whose output copies its input.", T.per_config),
    ("arch_timings", "Architectures at one size", "`bash benchmarks/arch_timings.sh`: prefill and decode per "
     "architecture, hidden 1024, 12 layers, float32.", T.generic),
]


class Run:
    """The records of one run of one benchmark."""
    META = META

    def __init__(self, benchmark, rid, records, order):
        self.benchmark, self.id, self.records, self.order = benchmark, rid, records, order
        first = records[0]
        self.date = min(r["date"] for r in records)
        self.date_text = self.date[:16].replace("T", " ") + (" UTC" if "T" in self.date else "")
        self.commits = list(dict.fromkeys(r["commit"] for r in records))
        self.cpu, self.cpus, self.command = first["cpu"], first.get("cpus"), first["command"]
        self.threads = sorted({r["threads"] for r in records if r.get("threads") is not None})
        self.note, self.source = first.get("note"), first.get("source")
        model = first.get("model") or ""
        self.subject = ("SmolLM2-135M-Instruct" if "SmolLM2" in model else "the synthetic 1.1B pair" if "target" in model
                        else model)


def load(paths):
    files = []
    for p in paths:
        files += sorted(glob.glob(os.path.join(p, "*.jsonl"))) if os.path.isdir(p) else [p]
    by_run, order = {}, 0
    for f in files:
        for n, line in enumerate(open(f, encoding="utf-8"), 1):
            if not line.strip():
                continue
            r = json.loads(line)
            missing = [k for k in COMMON if k not in r]
            if missing:
                sys.exit(f"{f}:{n}: a record without {', '.join(missing)}")
            key = (r["benchmark"], r["run"])
            if key not in by_run:
                by_run[key] = (order, [])
                order += 1
            by_run[key][1].append(r)
    runs = {}
    for (bench, rid), (o, recs) in by_run.items():
        runs.setdefault(bench, []).append(Run(bench, rid, recs, o))
    for bench in runs:  # latest first: by date, then by place in the file
        runs[bench].sort(key=lambda r: (r.date[:10], r.date, r.order), reverse=True)
    return runs


def anchor(title):
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c in "-_")


README_BEGIN = "<!-- generated by benchmarks/report.py from the latest serve_peer run -->"
README_END = "<!-- end of generated -->"


def readme(path, lines):
    """Puts `lines` between the README's markers (its one current table), leaving the rest as it is."""
    text = open(path, encoding="utf-8").read()
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        sys.exit(f"{path}: the markers of the generated table are missing ({README_BEGIN} ... {README_END})")
    new = text[:begin + len(README_BEGIN)] + "\n" + "\n".join(lines) + "\n" + text[end:]
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", nargs="+", default=[os.path.join(HERE, "results")],
                    help="JSON Lines files or folders of them (default benchmarks/results)")
    ap.add_argument("--docs", default=os.path.join(os.path.dirname(HERE), "docs"))
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--readme", help="the README whose table to write (default: the repository's, when the results "
                                     "are benchmarks/results; none otherwise)")
    args = ap.parse_args()
    runs = load(args.results)
    known = [s for s in SECTIONS if s[0] in runs]
    known += [(b, b, "", T.generic) for b in sorted(runs) if b not in {s[0] for s in SECTIONS}]
    body, toc, peer_latest = [], [], None
    for bench, title, what, fn in known:
        toc.append(f"- [{title}](#{anchor(title)}) (`benchmarks/results/{bench}.jsonl`, {len(runs[bench])} "
                   f"run{'s' if len(runs[bench]) > 1 else ''}; latest {runs[bench][0].date_text})")
        body += [f"## {title}", ""] + ([what, ""] if what else [])
        lines = fn(runs[bench])
        if bench == "llama_cpp_peer":
            lines, peer_latest = lines
        body += lines
    default = args.results == [os.path.join(HERE, "results")]
    source = "`benchmarks/results/*.jsonl`" if default else ", ".join(f"`{p}`" for p in args.results)
    text = "\n".join(
        [f"*Generated by `python benchmarks/report.py` from {source}: do not edit this file by hand.*",
         "", "# Benchmarks", "",
         "Every benchmark script appends its measurements to `benchmarks/results/NAME.jsonl`, one JSON object each: "
         "benchmark, run, date, commit, cpu, cpus, threads, command, then the figures (`benchmarks/bench_record.py` "
         "describes the schema). Per benchmark the latest run comes first, the earlier runs below it. Runs converted "
         "from the text logs kept before these records existed say where they came from; a commit of `unknown` is one "
         "those logs did not state.", ""] + toc + [""] + body).rstrip() + "\n"
    os.makedirs(args.docs, exist_ok=True)
    out = os.path.join(args.docs, "benchmarks.md")
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    readme_path = args.readme or (os.path.join(os.path.dirname(HERE), "README.md") if default else None)
    # The README shows what a user gets by default: the latest run without SERVE_FLAGS.
    default_runs = [r for r in runs.get("serve_peer", []) if "SERVE_FLAGS=" not in r.command]
    if readme_path and default_runs:
        readme(readme_path, T.serve_peer_readme(default_runs[0]))
    plots = []
    if peer_latest and not args.no_plots:
        plots = report_peer.plots(peer_latest, args.docs)
    print(f"wrote {out} ({len(runs)} benchmarks, {sum(map(len, runs.values()))} runs)"
          + (f" and {', '.join(plots)}" if plots else ""))


if __name__ == "__main__":
    main()
