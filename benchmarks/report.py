"""Tables and plots from benchmarks/llama_cpp_peer.sh's JSON Lines: prints the tables and writes
docs/benchmarks.md with PNG plots beside it (matplotlib; --no-plots: the tables only, on stdout).
Usage: python benchmarks/report.py [--no-plots] [RESULTS.jsonl] [--docs DIR]
Every figure is the median over the file's rounds."""
import argparse
import json
import os
import statistics
from collections import defaultdict

ap = argparse.ArgumentParser()
ap.add_argument("results", nargs="?", default="benchmarks/results_llama_cpp_peer.jsonl")
ap.add_argument("--docs", default="docs")
ap.add_argument("--no-plots", action="store_true")
args = ap.parse_args()

recs = [json.loads(l) for l in open(args.results) if l.strip()]
run = next(r for r in recs if r.get("kind") == "run")
med = statistics.median


def short(name):  # SmolLM2-135M-Instruct.Q4_1.gguf -> SmolLM2 Q4_1; synthetic-target.Q8_0.gguf -> 1.1B Q8_0
    stem = name[:-5] if name.endswith(".gguf") else name
    model, fmt = stem.split(".", 1)
    return ("SmolLM2" if model.startswith("SmolLM2") else "1.1B" if "target" in model else "1-layer draft") + " " + fmt


# --- passes: decode, pass cost by rows, RSS ---
passes = defaultdict(list)  # (file, threads, engine/mode) -> records
for r in recs:
    if r.get("kind") == "passes":
        key = "specdec" if r["engine"] == "specdec" and r["mode"] == "float" else \
              "specdec int8" if r["engine"] == "specdec" else "llama.cpp"
        passes[(r["file"], r["threads"], key)].append(r)
files = list(dict.fromkeys(r["file"] for r in recs if r.get("kind") == "passes"))
threads = sorted({r["threads"] for r in recs if r.get("kind") == "passes"})
engines = ["specdec", "specdec int8", "llama.cpp"]


def fig(file, t, engine, what, rows=None):
    rs = passes.get((file, t, engine))
    if not rs:
        return None
    if what == "decode":
        return med(r["decode_ms"] for r in rs)
    if what == "pass":
        vals = [r["pass_ms"].get(str(rows)) for r in rs]
        return med(vals) if None not in vals else None
    return med(r["rss_mb"] for r in rs)


def best(vals):  # specdec's best of its two activation modes
    return min((x for x in vals if x is not None), default=None)


def cell(v, fmt="{:.1f}"):
    return fmt.format(v) if v is not None else "-"


def ratio(a, b):
    return f"{a / b:.2f}x" if a is not None and b else "-"


lines = []
md = lines.append
md(f"Machine: {run['machine']}, {run['cpus']} CPUs; specdec {run['specdec']}, llama.cpp from llama-cpp-python "
   f"{run['llama_cpp']}; medians of {run['rounds']} interleaved rounds. Command: "
   f"`bash benchmarks/llama_cpp_peer.sh build {run['rounds']} {' '.join(map(str, threads))}`.\n")
md("### Decode and prefill, ms\n")
md("specdec = float32 activations (default), int8 = `--int8-activations`; ratio = specdec's best / llama.cpp "
   "(below 1: specdec faster).\n")
md("| file | threads | decode specdec | int8 | llama.cpp | ratio | prefill 16 specdec | int8 | llama.cpp | ratio "
   "| prefill 128 specdec | int8 | llama.cpp | ratio |")
md("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for f in files:
    for t in threads:
        row = [short(f), str(t)]
        for what, n in (("decode", None), ("pass", 16), ("pass", 128)):
            v = [fig(f, t, e, what, n) for e in engines]
            row += [cell(x) for x in v] + [ratio(best(v[:2]), v[2])]
        md("| " + " | ".join(row) + " |")
floors = defaultdict(list)  # (file, threads) -> records
for r in recs:
    if r.get("kind") == "floor":
        floors[(r["file"], r["threads"])].append(r)
if floors:
    md("\n### Decode against the memory-bandwidth floor\n")
    md("Floor: the time a plain read of the bytes one decode step reads (every weight matrix once; "
       "`benchmarks/pass_bytes.py`) takes at the same thread count, from huge pages, measured in the same "
       "round as the engines (`specdec_micro_bench`'s `BM_ReadBandwidth`). Ratio = decode / floor "
       "(specdec's best of its two activation modes).\n")
    md("| file | threads | MB read per token | floor ms | GB/s | specdec decode | / floor | llama.cpp decode | / floor |")
    md("|---|---|---|---|---|---|---|---|---|")
    for f in files:
        for t in threads:
            rs = floors.get((f, t))
            if not rs:
                continue
            floor, mb = med(r["ms"] for r in rs), rs[0]["read_mb"]
            ours, peer = best(fig(f, t, e, "decode") for e in engines[:2]), fig(f, t, "llama.cpp", "decode")
            md(f"| {short(f)} | {t} | {mb} | {floor:.1f} | {mb / floor:.1f} | {cell(ours)} | {ratio(ours, floor)} "
               f"| {cell(peer)} | {ratio(peer, floor)} |")
md("\n### Verification pass cost and peak memory\n")
base = next((r["rss_mb"] for r in recs if r.get("kind") == "baseline"), 0.0)
md("Pass cost: one pass over 6 new tokens (a K = 5 verification) divided by one decode step. "
   "Peak RSS of the whole process (both engines' include a 128-token prefill), against the file's size; "
   f"specdec's less {base:.0f} MB, the resident memory of `specdec --help` (the libtorch runtime, before any model).\n")
md("| file | threads | 6-row pass / decode, specdec | llama.cpp | peak RSS MB, specdec | llama.cpp | file MB "
   "| specdec RSS / file | (RSS - runtime) / file |")
md("|---|---|---|---|---|---|---|---|---|")
for f in files:
    size = next(r["file_mb"] for r in recs if r.get("file") == f)
    for t in threads:
        c = [ratio(fig(f, t, e, "pass", 6), fig(f, t, e, "decode")) for e in ("specdec", "llama.cpp")]
        rss = [fig(f, t, e, "rss") for e in ("specdec", "llama.cpp")]
        md(f"| {short(f)} | {t} | {c[0]} | {c[1]} | {cell(rss[0], '{:.0f}')} | {cell(rss[1], '{:.0f}')} | {size:.0f} "
           f"| {ratio(rss[0], size)} | {ratio(rss[0] - base if rss[0] else None, size)} |")

# --- speculative ---
spec = defaultdict(list)  # (target, draft, engine, config) -> records
target_only = defaultdict(list)  # (target, engine) -> ms
for r in recs:
    if r.get("kind") == "speculative":
        spec[(r["file"], r["draft"], r["engine"], r["config"])].append(r)
        if r["engine"].startswith("specdec"):
            target_only[(r["file"], r["engine"])].append(r["target_only_ms"])
    elif r.get("kind") == "target_only":
        target_only[(r["file"], r["engine"])].append(r["ms"])
if spec:
    md("\n### Speculative decoding, synthetic 1.1B pair\n")
    md("ms per generated token over the whole request (prompt pass included, 64 new tokens), one text prompt; "
       "speedup against the same engine's target-only run; acceptance = accepted / drafted tokens. "
       "specdec's `compare` checks that the assisted tokens equal the target-only ones.\n")
    md("| target + draft | engine | configuration | ms/token | target-only ms/token | speedup | acceptance "
       "| predicted (Leviathan) | identical | peak RSS MB |")
    md("|---|---|---|---|---|---|---|---|---|---|")
    for (tf, df, eng, conf), rs in spec.items():
        ms = med(r["ms"] for r in rs)
        base = med(target_only[(tf, eng)]) if target_only[(tf, eng)] else None
        pred = cell(med(r["predicted"] for r in rs), "{:.2f}x") if eng.startswith("specdec") else "-"
        ident = str(all(r["identical"] for r in rs)) if eng.startswith("specdec") else "-"
        md(f"| {short(tf)} + {short(df).split()[-1]} draft | {eng} | {conf} | {ms:.1f} | {cell(base)} | "
           f"{ratio(base, ms)} | {med(r['acceptance'] for r in rs):.2f} | {pred} | {ident} | "
           f"{med(r['rss_mb'] for r in rs):.0f} |")
text = "\n".join(lines)
print(text)
if args.no_plots:
    raise SystemExit

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

os.makedirs(args.docs, exist_ok=True)
colors = {"specdec": "tab:blue", "specdec int8": "tab:cyan", "llama.cpp": "tab:orange"}

# 1. and 2. only when the run timed passes (PEER_PARTS=speculative times none)
if files:
    # 1. decode ms/token per engine and format, one panel per thread count
    fig_, axes = plt.subplots(1, len(threads), figsize=(6 * len(threads), 4.5), squeeze=False)
    for ax, t in zip(axes[0], threads):
        width = 0.27
        for i, e in enumerate(engines):
            vals = [fig(f, t, e, "decode") or 0 for f in files]
            ax.bar([x + (i - 1) * width for x in range(len(files))], vals, width, label=e, color=colors[e])
        ax.set_xticks(range(len(files)), [short(f) for f in files], rotation=35, ha="right")
        ax.set_yscale("log")
        ax.set_ylabel("decode ms/token (log)")
        ax.set_title(f"{t} thread{'s' if t > 1 else ''}")
        ax.legend()
    fig_.tight_layout()
    fig_.savefig(os.path.join(args.docs, "decode.png"), dpi=110)

    # 2. pass cost against rows (ms of a pass / ms of a decode step), last thread count
    t = threads[-1]
    sizes = sorted({int(n) for rs in passes.values() for r in rs for n in r["pass_ms"]})
    fig_, axes = plt.subplots(2, (len(files) + 1) // 2, figsize=(4 * ((len(files) + 1) // 2), 7), squeeze=False)
    for ax, f in zip(axes.flat, files):
        for e in engines:
            d = fig(f, t, e, "decode")
            pts = [(n, fig(f, t, e, "pass", n)) for n in sizes if n <= 16]
            pts = [(n, v / d) for n, v in pts if v is not None and d]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=e, color=colors[e])
        ax.plot([1, 16], [1, 16], ls=":", color="grey", label="linear")
        ax.set_title(short(f))
        ax.set_xlabel("tokens in the pass")
        ax.set_ylabel("pass / decode step")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(files):]:
        ax.axis("off")
    fig_.suptitle(f"Cost of one pass against its tokens, {t} threads")
    fig_.tight_layout()
    fig_.savefig(os.path.join(args.docs, "pass_cost.png"), dpi=110)

# 3. measured speedup against acceptance, with the Leviathan prediction for K = 5
if spec:
    fig_, ax = plt.subplots(figsize=(7, 5))
    marks = {"constant": "o", "dynamic": "s", "goodput": "D", "max5-pmin0.0": "^", "max16-pmin0.75": "v"}
    pairs = list(dict.fromkeys((tf, df) for tf, df, _, _ in spec))
    for pi, (tf, df) in enumerate(pairs):
        col = f"C{pi}"
        cs = [r["cost_ratio"] for (a, b, e, _), rs in spec.items() if (a, b) == (tf, df) and e.startswith("specdec") for r in rs]
        if cs:
            c, g = med(cs), 5
            al = [i / 200 for i in range(1, 200)]
            ax.plot([(a - a ** (g + 1)) / ((1 - a) * g) for a in al],
                    [(1 - a ** (g + 1)) / ((1 - a) * (g * c + 1)) for a in al], color=col, ls="--",
                    label=f"{short(tf)} + {short(df).split()[-1]}: Leviathan, K=5, c={c:.2f}")
        for (a, b, e, conf), rs in spec.items():
            if (a, b) != (tf, df) or not target_only[(a, e)]:
                continue
            sp = med(target_only[(a, e)]) / med(r["ms"] for r in rs)
            ax.scatter(med(r["acceptance"] for r in rs), sp, color=col, marker=marks.get(conf, "x"),
                       edgecolors="black" if e == "llama.cpp" else None, s=60, label=f"{e} {conf}")
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_xlabel("acceptance rate (accepted / drafted)")
    ax.set_ylabel("speedup over the same engine's target-only")
    ax.legend(fontsize=7)
    fig_.tight_layout()
    fig_.savefig(os.path.join(args.docs, "speculative.png"), dpi=110)

with open(os.path.join(args.docs, "benchmarks.md"), "w") as f:
    f.write("# specdec beside llama.cpp\n\n")
    f.write("Written by `benchmarks/report.py` from `" + args.results + "` (do not edit by hand).\n\n")
    f.write(text + "\n\n")
    f.write("### Plots\n\n")
    if files:
        f.write("![decode ms/token per engine and format](decode.png)\n\n"
                "![cost of a pass against its tokens](pass_cost.png)\n\n")
    if spec:
        f.write("![measured speedup against acceptance, with the Leviathan prediction](speculative.png)\n")
print(f"wrote {args.docs}/benchmarks.md and its plots")
