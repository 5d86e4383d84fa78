"""The llama.cpp peer benchmark's section of docs/benchmarks.md (benchmarks/llama_cpp_peer.sh's records) and
its plots: decode.png, pass_cost.png, speculative.png. Every figure is the median over the run's rounds."""
import os
from collections import defaultdict

from report_tables import fmt, history, med, ratio, run_header, short_file, span, table

ENGINES = ["specdec", "specdec int8", "llama.cpp"]


def engine(r):
    if r["engine"] != "specdec":
        return r["engine"]
    return "specdec" if r["mode"] == "float" else "specdec int8"


class Peer:
    """One run's records, indexed."""

    def __init__(self, run):
        self.run = run
        recs = run.records
        self.passes = defaultdict(list)  # (file, threads, engine) -> records
        self.floors = defaultdict(list)  # (file, threads) -> records
        self.spec = defaultdict(list)  # (target, draft, engine, config) -> records
        self.target_only = defaultdict(list)  # (target, engine) -> ms
        for r in recs:
            k = r.get("kind")
            if k == "passes":
                self.passes[(r["file"], r["threads"], engine(r))].append(r)
            elif k == "floor":
                self.floors[(r["file"], r["threads"])].append(r)
            elif k == "speculative":
                self.spec[(r["file"], r["draft"], r["engine"], r["config"])].append(r)
                if r["engine"].startswith("specdec"):
                    self.target_only[(r["file"], r["engine"])].append(r["target_only_ms"])
            elif k == "target_only":
                self.target_only[(r["file"], r["engine"])].append(r["ms"])
        self.files = list(dict.fromkeys(r["file"] for r in recs if r.get("kind") == "passes"))
        self.threads = sorted({r["threads"] for r in recs if r.get("kind") == "passes"})
        self.sizes = {r["file"]: r["file_mb"] for r in recs if "file_mb" in r}
        self.runtime = next((r["runtime_rss_mb"] for r in recs if r.get("runtime_rss_mb")), None)

    def fig(self, file, t, eng, what, rows=None):
        rs = self.passes.get((file, t, eng))
        if not rs:
            return None
        if what == "decode":
            return med(r["decode_ms"] for r in rs)
        if what == "pass":
            vals = [r["pass_ms"].get(str(rows)) for r in rs]
            if None in vals and rows == 6 and all("pass6_over_decode" in r for r in rs):  # a run kept as medians only
                return med(r["pass6_over_decode"] * r["decode_ms"] for r in rs)
            return med(vals) if None not in vals else None
        vals = [r.get("rss_mb") for r in rs]
        return med(vals) if None not in vals else None

    def best(self, file, t, what, rows=None):  # specdec's best of its two activation modes
        return min((x for x in (self.fig(file, t, e, what, rows) for e in ENGINES[:2]) if x is not None), default=None)

    def spec_ms(self, key):
        return med(r["ms"] for r in self.spec[key])


def passes_tables(p):
    out = ["#### Decode and prefill, ms", "",
           "specdec = float32 activations (default), int8 = `--int8-activations`; ratio = specdec's best / llama.cpp "
           "(below 1: specdec faster).", ""]
    rows = []
    for f in p.files:
        for t in p.threads:
            row = [short_file(f), t]
            for what, n in (("decode", None), ("pass", 16), ("pass", 128)):
                v = [p.fig(f, t, e, what, n) for e in ENGINES]
                row += [fmt(x) for x in v] + [ratio(p.best(f, t, what, n), v[2])]
            rows.append(row)
    out += table(["file", "threads", "decode specdec", "int8", "llama.cpp", "ratio", "prefill 16 specdec", "int8", "llama.cpp",
                  "ratio", "prefill 128 specdec", "int8", "llama.cpp", "ratio"], rows)
    if p.floors:
        out += ["#### Decode against the memory-bandwidth floor", "",
                "Floor: the time a plain read of the bytes one decode step reads (every weight matrix once; "
                "`benchmarks/pass_bytes.py`) takes at the same thread count, from huge pages, measured in the same round as "
                "the engines (`specdec_micro_bench`'s `BM_ReadBandwidth`). Ratio = decode / floor (specdec's best of its two "
                "activation modes).", ""]
        rows = []
        for f in p.files:
            for t in p.threads:
                rs = p.floors.get((f, t))
                if not rs:
                    continue
                floor, mb = med(r["ms"] for r in rs), rs[0]["read_mb"]
                ours, peer = p.best(f, t, "decode"), p.fig(f, t, "llama.cpp", "decode")
                rows.append([short_file(f), t, mb, f"{floor:.1f}", f"{mb / floor:.1f}", fmt(ours), ratio(ours, floor),
                             fmt(peer), ratio(peer, floor)])
        out += table(["file", "threads", "MB read per token", "floor ms", "GB/s", "specdec decode", "/ floor",
                      "llama.cpp decode", "/ floor"], rows)
    base = p.runtime or 0.0
    out += ["#### Verification pass cost and peak memory", "",
            "Pass cost: one pass over 6 new tokens (a K = 5 verification) divided by one decode step. Peak RSS of the whole "
            "process (both engines' include a 128-token prefill), against the file's size; specdec's less "
            f"{base:.0f} MB, the resident memory of `specdec --help` (the libtorch runtime, before any model).", ""]
    rows = []
    for f in p.files:
        size = p.sizes[f]
        for t in p.threads:
            c = [ratio(p.fig(f, t, e, "pass", 6), p.fig(f, t, e, "decode")) for e in ("specdec", "llama.cpp")]
            rss = [p.fig(f, t, e, "rss") for e in ("specdec", "llama.cpp")]
            rows.append([short_file(f), t, c[0], c[1], fmt(rss[0], "{:.0f}"), fmt(rss[1], "{:.0f}"), f"{size:.0f}",
                         ratio(rss[0], size), ratio(rss[0] - base if rss[0] else None, size)])
    return out + table(["file", "threads", "6-row pass / decode, specdec", "llama.cpp", "peak RSS MB, specdec", "llama.cpp",
                        "file MB", "specdec RSS / file", "(RSS - runtime) / file"], rows)


def speculative_table(p):
    out = ["#### Speculative decoding, synthetic 1.1B pair", "",
           "ms per generated token over the whole request (prompt pass included, 64 new tokens), one text prompt; speedup "
           "against the same engine's target-only run; acceptance = accepted / drafted tokens. specdec's `compare` checks "
           "that the assisted tokens equal the target-only ones.", ""]
    rows = []
    for (tf, df, eng, conf), rs in p.spec.items():
        ms = p.spec_ms((tf, df, eng, conf))
        base = med(p.target_only[(tf, eng)]) if p.target_only[(tf, eng)] else None
        pred = fmt(med(r["predicted"] for r in rs), "{:.2f}x") if eng.startswith("specdec") else "-"
        ident = str(all(r["identical"] for r in rs)) if eng.startswith("specdec") else "-"
        rss = [r.get("rss_mb") for r in rs]
        rows.append([f"{short_file(tf)} + {short_file(df).split()[-1]} draft", eng, conf, f"{ms:.1f}", fmt(base),
                     ratio(base, ms), f"{med(r['acceptance'] for r in rs):.2f}", pred, ident,
                     fmt(med(rss), "{:.0f}") if None not in rss else "-"])
    return out + table(["target + draft", "engine", "configuration", "ms/token", "target-only ms/token", "speedup",
                        "acceptance", "predicted (Leviathan)", "identical", "peak RSS MB"], rows)


def best_pair(p, target_fmt):
    """specdec's and llama.cpp's best ms/token on the pair whose target is target_fmt (e.g. Q8_0)."""
    best = {}
    for key in p.spec:
        if key[0].endswith(f".{target_fmt}.gguf"):
            side = "llama.cpp" if key[2] == "llama.cpp" else "specdec"
            best[side] = min(best.get(side, 1e30), p.spec_ms(key))
    return best


def summary(run):
    p = Peer(run)
    cells = []
    for t in p.threads:
        rs = [ratio(p.best(f, t, "decode"), p.fig(f, t, "llama.cpp", "decode")) for f in p.files]
        cells.append(f"{t}t " + span([float(x[:-1]) for x in rs if x != "-"], suffix="x"))
    pre = [p.best(f, t, "pass", 128) / p.fig(f, t, "llama.cpp", "pass", 128) for f in p.files for t in p.threads
           if p.best(f, t, "pass", 128) and p.fig(f, t, "llama.cpp", "pass", 128)]
    spec = []
    for fmt_ in ("Q8_0", "F32"):
        b = best_pair(p, fmt_)
        if "specdec" in b and "llama.cpp" in b:
            spec.append(f"{fmt_} pair {b['specdec']:.1f} / {b['llama.cpp']:.1f} ms")
    return [", ".join(dict.fromkeys(short_file(f).split()[0] for f in p.files)) or "speculative only", "; ".join(cells) or "-",
            span(pre, suffix="x"), "; ".join(spec) or "-"]


def section(runs):
    """runs: llama_cpp_peer runs, latest first. The latest run that timed passes, then each earlier one that timed
    files the later ones did not (e.g. a run of one part: PEER_PARTS), and the latest with speculative runs."""
    out = ["Ratios below 1: specdec faster. Plots at the end of this section.", ""]
    with_passes, shown, covered = [], [], set()  # shown: each run's files no later run timed
    for r in runs:
        files = [f for f in Peer(r).files if f not in covered]
        if files:
            with_passes.append(r)
            shown.append(files)
            covered |= set(files)
    with_spec = next((r for r in runs if any(x.get("kind") == "speculative" for x in r.records)), None)
    for i, (run, files) in enumerate(zip(with_passes, shown)):
        p = Peer(run)
        p.files = files
        if i:
            out += run_header(run, "Latest run of " + ", ".join(short_file(f) for f in p.files))
        else:
            out += run_header(run)
        out += [f"llama.cpp from llama-cpp-python {run.records[0].get('llama_cpp', '?')}; "
                f"medians of {run.records[0].get('rounds', '?')} interleaved rounds.", ""]
        out += passes_tables(p)
    if with_spec:
        if with_spec not in with_passes:
            out += run_header(with_spec, "Latest run with speculative decoding")
        out += speculative_table(Peer(with_spec))
    rest = [r for r in runs if r not in with_passes and r is not with_spec]
    cols = ["files", "decode, specdec / llama.cpp (range over files)", "prefill 128 ratio", "speculative: best specdec / best llama.cpp"]
    out += history(rest, "Earlier runs", [(c, (lambda i: lambda r: summary(r)[i])(i)) for i, c in enumerate(cols)])
    # The plots of passes: the shown run with the most files.
    plotted = max(with_passes, key=lambda r: len(Peer(r).files), default=None)
    plots = []
    if plotted:
        plots += ["![decode ms/token per engine and format](decode.png)", "", "![cost of a pass against its tokens](pass_cost.png)", ""]
    if with_spec:
        plots += ["![measured speedup against acceptance, with the Leviathan prediction](speculative.png)", ""]
    return out + ["#### Plots", ""] + plots, (plotted, with_spec)


def plots(latest, docs):
    """Writes decode.png and pass_cost.png (the shown run of passes with the most files) and speculative.png (the
    latest with speculative runs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_passes, with_spec = latest
    colors = {"specdec": "tab:blue", "specdec int8": "tab:cyan", "llama.cpp": "tab:orange"}
    written = []
    if with_passes:
        p = Peer(with_passes)
        # 1. decode ms/token per engine and format, one panel per thread count
        fig, axes = plt.subplots(1, len(p.threads), figsize=(6 * len(p.threads), 4.5), squeeze=False)
        for ax, t in zip(axes[0], p.threads):
            width = 0.27
            for i, e in enumerate(ENGINES):
                vals = [p.fig(f, t, e, "decode") or 0 for f in p.files]
                ax.bar([x + (i - 1) * width for x in range(len(p.files))], vals, width, label=e, color=colors[e])
            ax.set_xticks(range(len(p.files)), [short_file(f) for f in p.files], rotation=35, ha="right")
            ax.set_yscale("log")
            ax.set_ylabel("decode ms/token (log)")
            ax.set_title(f"{t} thread{'s' if t > 1 else ''}")
            ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(docs, "decode.png"), dpi=110)
        plt.close(fig)
        # 2. pass cost against rows (ms of a pass / ms of a decode step), last thread count
        t = p.threads[-1]
        sizes = sorted({int(n) for rs in p.passes.values() for r in rs for n in r["pass_ms"]})
        cols = (len(p.files) + 1) // 2
        fig, axes = plt.subplots(2, cols, figsize=(4 * cols, 7), squeeze=False)
        for ax, f in zip(axes.flat, p.files):
            for e in ENGINES:
                d = p.fig(f, t, e, "decode")
                pts = [(n, p.fig(f, t, e, "pass", n)) for n in sizes if n <= 16]
                pts = [(n, v / d) for n, v in pts if v is not None and d]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=e, color=colors[e])
            ax.plot([1, 16], [1, 16], ls=":", color="grey", label="linear")
            ax.set_title(short_file(f))
            ax.set_xlabel("tokens in the pass")
            ax.set_ylabel("pass / decode step")
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(p.files):]:
            ax.axis("off")
        fig.suptitle(f"Cost of one pass against its tokens, {t} threads")
        fig.tight_layout()
        fig.savefig(os.path.join(docs, "pass_cost.png"), dpi=110)
        plt.close(fig)
        written += ["decode.png", "pass_cost.png"]
    if with_spec:
        # 3. measured speedup against acceptance, with the Leviathan prediction for K = 5
        p = Peer(with_spec)
        fig, ax = plt.subplots(figsize=(7, 5))
        marks = {"constant": "o", "dynamic": "s", "goodput": "D", "max5-pmin0.0": "^", "max16-pmin0.75": "v"}
        pairs = list(dict.fromkeys((tf, df) for tf, df, _, _ in p.spec))
        for pi, (tf, df) in enumerate(pairs):
            col = f"C{pi}"
            cs = [r["cost_ratio"] for (a, b, e, _), rs in p.spec.items() if (a, b) == (tf, df) and e.startswith("specdec")
                  for r in rs if r["cost_ratio"] is not None]
            if cs:
                c, g = med(cs), 5
                al = [i / 200 for i in range(1, 200)]
                ax.plot([(a - a ** (g + 1)) / ((1 - a) * g) for a in al],
                        [(1 - a ** (g + 1)) / ((1 - a) * (g * c + 1)) for a in al], color=col, ls="--",
                        label=f"{short_file(tf)} + {short_file(df).split()[-1]}: Leviathan, K=5, c={c:.2f}")
            for (a, b, e, conf), rs in p.spec.items():
                if (a, b) != (tf, df) or not p.target_only[(a, e)]:
                    continue
                sp = med(p.target_only[(a, e)]) / p.spec_ms((a, b, e, conf))
                ax.scatter(med(r["acceptance"] for r in rs), sp, color=col, marker=marks.get(conf, "x"),
                           edgecolors="black" if e == "llama.cpp" else None, s=60, label=f"{e} {conf}")
        ax.axhline(1, color="grey", lw=0.8)
        ax.set_xlabel("acceptance rate (accepted / drafted)")
        ax.set_ylabel("speedup over the same engine's target-only")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(docs, "speculative.png"), dpi=110)
        plt.close(fig)
        written.append("speculative.png")
    return written
