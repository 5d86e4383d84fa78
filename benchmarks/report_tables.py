"""Markdown helpers and the sections of docs/benchmarks.md but the llama.cpp peer benchmark's
(benchmarks/report_peer.py). A section gets the runs of its benchmark, latest first (Run objects of
benchmarks/report.py), and returns Markdown lines: the latest run in full, then the earlier ones as
one row each."""
import statistics
from collections import defaultdict

med = statistics.median


# --- formatting ---
def fmt(v, spec="{:.1f}"):
    return "-" if v is None else spec.format(v)


def ratio(a, b, spec="{:.2f}x"):
    return spec.format(a / b) if a is not None and b else "-"


def span(vals, spec="{:.2f}", suffix=""):
    """'lo-hi' (or the one value) of the values that are not None."""
    vals = sorted(v for v in vals if v is not None)
    if not vals:
        return "-"
    lo, hi = spec.format(vals[0]), spec.format(vals[-1])
    return (lo if lo == hi else f"{lo}-{hi}") + suffix


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out + [""]


def ms(seconds, spec="{:.1f}"):
    return fmt(None if seconds is None else 1e3 * seconds, spec)


def short_file(name):
    """SmolLM2-135M-Instruct.Q4_1.gguf -> SmolLM2 Q4_1; synthetic-target.Q8_0.gguf -> 1.1B Q8_0."""
    stem = name[:-5] if name.endswith(".gguf") else name
    if "." not in stem:
        return stem
    model, f = stem.split(".", 1)
    return ("SmolLM2" if model.startswith("SmolLM2") else "1.1B" if "target" in model else "1-layer draft") + " " + f


# --- runs ---
def run_header(run, what="Latest run"):
    commits = " / ".join(run.commits)
    threads = ", ".join(map(str, run.threads)) or "-"
    cpus = f", {run.cpus} CPUs" if run.cpus else ""
    lines = [f"**{what}**, {run.date_text}: specdec {commits}; CPU {run.cpu}{cpus}; threads {threads}.",
             f"Command: `{run.command}`."]
    if run.note:
        lines.append(f"({run.note}.)")
    if run.source:
        lines.append(f"(Converted from {run.source}, in git history.)")
    return [" ".join(lines), ""]


def history(runs, title, columns):
    """One row per run: date, commit, CPU, then `columns` [(header, fn(run) -> text)]."""
    if not runs:
        return []
    rows = [[r.date_text, " / ".join(r.commits), r.cpu] + [fn(r) for _, fn in columns] for r in runs]
    return [f"#### {title}", ""] + table(["date", "specdec", "CPU"] + [h for h, _ in columns], rows)


def generic(runs, columns=None):
    """The latest run's records as a table of `columns` (default: every figure), earlier runs by command."""
    latest, rest = runs[0], runs[1:]
    keys = columns or [k for k in dict.fromkeys(k for r in latest.records for k in r) if k not in latest.META]
    rows = [[fmt_any(r.get(k)) for k in keys] for r in latest.records]
    out = run_header(latest) + table(keys, rows)
    return out + history(rest, "Earlier runs", [("command", lambda r: f"`{r.command}`"),
                                                ("records", lambda r: str(len(r.records)))])


def fmt_any(v):
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {fmt_any(x)}" for k, x in v.items())
    return "-" if v is None else str(v)


# --- serving (benchmarks/serve_peer.sh) ---
def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def at(run, label, c):
    """The record of a server at c clients; of a run in rounds, each number the median over them, taken
    field by field (so one row's TTFT and ITL may come from different rounds)."""
    rs = [r for r in run.records if r.get("label") == label and r.get("concurrency") == c]
    if len(rs) <= 1:
        return rs[0] if rs else None
    return {k: med([r[k] for r in rs if _is_number(r.get(k))]) if _is_number(v) else v for k, v in rs[0].items()}


def tput(r):
    return (r or {}).get("throughput_tokens_per_s")


def round_ratio(run, a, b, key="throughput_tokens_per_s"):
    """a's key over b's, a and b (label, clients): the median over the run's rounds of the ratio in each
    round, where the two ran one after the other (a run before rounds: its one ratio), or None."""
    vals = []
    for rnd in {r.get("round") for r in run.records}:
        pick = lambda lc: next((r for r in run.records if r.get("round") == rnd and r.get("label") == lc[0]
                                and r.get("concurrency") == lc[1]), None)
        x, y = (pick(a) or {}).get(key), (pick(b) or {}).get(key)
        if x is not None and y:
            vals.append(x / y)
    return med(vals) if vals else None


def rounds_note(run):
    n = len({r.get("round") for r in run.records})
    return ([f"Medians over {n} rounds (a round runs every server once, one after the other); a ratio is the "
             "median of the rounds' ratios.", ""] if n > 1 else [])


def _peer_rows(latest, keys):
    """Per client count: clients, both tok/s, their ratio, then "specdec / llama-server" of each latency key."""
    rows = []
    for c in sorted({r["concurrency"] for r in latest.records}):
        s, l = at(latest, "specdec", c), at(latest, "llama-server", c)
        g = lambda r, k: ms((r or {}).get(k), "{:.2f}" if k.startswith("itl") else "{:.1f}")
        rows.append([c, fmt(tput(s)), fmt(tput(l)), fmt(round_ratio(latest, ("specdec", c), ("llama-server", c)), "{:.2f}")]
                    + [f"{g(s, k)} / {g(l, k)}" for k in keys])
    return rows


def serve_peer(runs):
    latest = runs[0]
    out = run_header(latest) + rounds_note(latest)
    rows = _peer_rows(latest, ["ttft_p50", "ttft_p99", "itl_p50", "itl_p99"])
    out += table(["clients", "specdec tok/s", "llama-server tok/s", "specdec / llama-server", "TTFT p50 ms, specdec / llama",
                  "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms"], rows)
    for label in ("specdec", "llama-server"):
        lv = sorted({r["concurrency"] for r in latest.records if r.get("label") == label})
        if len(lv) > 1 and 8 in lv:
            out.append(f"- {label}: 8 clients make {fmt(round_ratio(latest, (label, 8), (label, lv[0])), '{:.2f}x')} "
                       f"the throughput of {lv[0]}.")
    out.append("")
    per = lambda label: lambda r: " / ".join(fmt(tput(at(r, label, c))) for c in
                                             sorted({x["concurrency"] for x in r.records if x.get("label") == label}))
    return out + history(runs[1:], "Earlier runs", [("specdec tok/s per client count", per("specdec")),
                                                    ("llama-server tok/s", per("llama-server"))])


def serve_peer_readme(latest):
    """The README's performance table: the latest serve_peer run, in short (no dates or commits)."""
    cpus = f"{latest.cpus}-vCPU " if latest.cpus else ""
    threads = ", ".join(map(str, latest.threads)) or "-"
    n = len({r.get("round") for r in latest.records})
    rounds = (f" (medians of {n} rounds, the servers taking turns; a ratio is the median of the rounds' ratios)"
              if n > 1 else "")
    out = ["`specdec serve` beside llama.cpp's `llama-server` on the same SmolLM2-135M-Instruct Q4_1 GGUF.",
           f"Machine: {cpus}{latest.cpu}, both servers on {threads} threads, one at a time{rounds}; greedy chat requests "
           "of 64 tokens from closed-loop streaming clients. Command: `bash benchmarks/serve_peer.sh build`"
           + ("" if latest.command == "bash benchmarks/serve_peer.sh build" else
              " (this run's exact command, with its llama.cpp build flags, is in "
              "[docs/benchmarks.md](docs/benchmarks.md#serving-specdec-serve-beside-llama-server))") + ".", ""]
    return out + table(["clients", "specdec tok/s", "llama-server tok/s", "ratio", "TTFT p50 ms, specdec / llama-server",
                        "ITL p50 ms, specdec / llama-server"], _peer_rows(latest, ["ttft_p50", "itl_p50"]))


def reference_label(label):  # what a label is measured against: target-only with the same activations
    return "specdec-target-only" + ("-int8" if label.endswith("-int8") else "")


def _against_target_only(run, labels):
    rows = []
    for c in sorted({r["concurrency"] for r in run.records}):
        for label in labels:
            k = at(run, label, c)
            if k:
                rows.append([c, label, fmt(tput(k)), fmt(round_ratio(run, (label, c), (reference_label(label), c)),
                                                         "{:.2f}x"), ms(k.get("itl_p50"), "{:.2f}"),
                             fmt(k.get("tokens_per_target_pass"), "{:.2f}"), fmt(k.get("acceptance_rate"), "{:.3f}")])
    return table(["clients", "server", "tok/s", "vs target-only", "ITL p50 ms", "tokens per target pass", "acceptance"], rows)


def _ratios(labels):
    def cell(run):
        return "; ".join(f"{label} " + " / ".join(fmt(round_ratio(run, (label, c), (reference_label(label), c)), "{:.2f}x")
                                               for c in sorted({r["concurrency"] for r in run.records}))
                         for label in labels if any(r.get("label") == label for r in run.records))
    return cell


def serve_lookup(runs):
    # The labels of every run (before goodput became prompt lookup's default, "specdec-lookup10" was
    # constant K and "specdec-lookup10-goodput" goodput with the latest match).
    labels = ["specdec-target-only", "specdec-lookup10-constant", "specdec-lookup10", "specdec-lookup10-last",
              "specdec-lookup10-goodput", "specdec-target-only-int8", "specdec-lookup10-last-int8"]
    return (run_header(runs[0]) + rounds_note(runs[0]) + _against_target_only(runs[0], labels) +
            history(runs[1:], "Earlier runs", [("vs target-only", _ratios(labels[1:]))]))


def serve_goodput(runs):
    labels = ["specdec-target-only", "specdec-goodput"]
    return (run_header(runs[0]) + _against_target_only(runs[0], labels) +
            history(runs[1:], "Earlier runs", [("goodput vs target-only per client count", _ratios(labels[1:]))]))


def serve_http(runs):
    def rounds(run):
        """[(generate tok/s, serve tok/s)] per round that has both (runs before rounds: one)."""
        pairs = []
        for rnd in sorted({r.get("round") for r in run.records}, key=lambda x: x or 0):
            recs = [r for r in run.records if r.get("round") == rnd]
            g = next((r for r in recs if r.get("label") == "specdec-generate"), None)
            s = next((r for r in recs if r.get("label") == "specdec-serve"), None)
            if tput(g) and tput(s):
                pairs.append((tput(g), tput(s)))
        return pairs

    def client_cpu(run):
        """The load generator's CPU time as a share of the serve runs' seconds (of one CPU)."""
        shares = [100 * r["client_cpu_seconds"] / r["seconds"] for r in run.records
                  if r.get("label") == "specdec-serve" and r.get("client_cpu_seconds") is not None and r.get("seconds")]
        return _median_span(shares) if shares else "-"

    def row(run):
        pairs = rounds(run)
        if not pairs:
            return ["-", "-", "-", "-", "0"]
        ratios = [s / g for g, s in pairs]
        return [_median_span([g for g, _ in pairs]), _median_span([s for _, s in pairs]),
                _median_span(ratios, "{:.3f}"), client_cpu(run), str(len(pairs))]
    out = run_header(runs[0]) + ["Medians over the rounds (range in brackets); a round runs both, one after the other. "
                                 "The load generator (Python, streaming) runs on the same CPUs as the server: its CPU "
                                 "time, in % of one CPU over the serve run, is time the server could not use.", ""]
    out += table(["`specdec generate --batch-size 8` tok/s", "`specdec serve`, 8 clients, tok/s",
                  "serve / generate", "load generator CPU %", "rounds"], [row(runs[0])])
    return out + history(runs[1:], "Earlier runs", [("serve / generate", lambda r: row(r)[2])])


# --- decode and prefill beside llama.cpp (llama_cpp_decode.sh, prefill.sh) ---
def by_file_threads(run):
    groups = defaultdict(list)
    for r in run.records:
        groups[(r["file"], r["threads"])].append(r)
    return groups


def _median_span(vals, spec="{:.1f}"):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    return spec.format(med(vals)) + (f" ({span(vals, spec)})" if len(vals) > 1 else "")


def _ratio_by_threads(run):
    t = defaultdict(list)
    for r in run.records:
        if r.get("ratio") is not None:
            t[r["threads"]].append(r["ratio"])
    return "; ".join(f"{k} thread{'s' if k > 1 else ''} {span(v, suffix='x')}" for k, v in sorted(t.items())) or "-"


def _files(run):
    return ", ".join(short_file(f) for f in dict.fromkeys(r["file"] for r in run.records))


def llama_cpp_decode(runs):
    latest = runs[0]
    base = any("base_ms" in r for r in latest.records)
    rows = []
    for (f, t), rs in by_file_threads(latest).items():
        row = [short_file(f), t, _median_span([r["specdec_ms"] for r in rs]), _median_span([r["llama_cpp_ms"] for r in rs]),
               _median_span([r["ratio"] for r in rs], "{:.2f}")]
        if base:
            row += [_median_span([r.get("base_ms") for r in rs]), _median_span([r.get("ratio_base") for r in rs], "{:.2f}")]
        rows.append(row)
    header = ["file", "threads", "specdec ms/token", "llama.cpp ms/token", "specdec / llama.cpp"]
    header += ["base build ms/token", "specdec / base"] if base else []
    out = run_header(latest) + ["Medians over the rounds (range in brackets); 32 tokens after a 3-token prompt, specdec "
                                "with `--int8-activations` (which the float formats ignore).", ""] + table(header, rows)
    return out + history(runs[1:], "Earlier runs", [("files", _files), ("specdec / llama.cpp", _ratio_by_threads)])


def prefill(runs):
    latest = runs[0]
    modes = list(dict.fromkeys(k for r in latest.records for k in r["specdec_ms"]))
    peer = any(r.get("llama_cpp_ms") is not None for r in latest.records)
    rows = []
    for (f, t), rs in by_file_threads(latest).items():
        row = [short_file(f), t] + [_median_span([r["specdec_ms"].get(m) for r in rs], "{:.0f}") for m in modes]
        if peer:
            row += [_median_span([r.get("llama_cpp_ms") for r in rs], "{:.0f}"), _median_span([r.get("ratio") for r in rs], "{:.2f}")]
        rows.append(row)
    header = ["file", "threads"] + [f"specdec {m} ms" for m in modes] + (["llama.cpp ms", "ratio"] if peer else [])
    out = run_header(latest) + [f"Prefill of 128 tokens; medians over the rounds (range in brackets); specdec per kernel "
                                f"family / activations; ratio: the first of them / llama.cpp.", ""] + table(header, rows)
    return out + history(runs[1:], "Earlier runs", [("files", _files), ("specdec / llama.cpp", _ratio_by_threads),
                                                    ("first / second specdec mode", _mode_ratio)])


def _mode_ratio(run):
    """The first specdec family/mode over the second, per thread count (e.g. amx/int8 over avx512/int8)."""
    modes = list(dict.fromkeys(k for r in run.records for k in r["specdec_ms"]))
    if len(modes) < 2:
        return "-"
    t = defaultdict(list)
    for r in run.records:
        a, b = r["specdec_ms"].get(modes[0]), r["specdec_ms"].get(modes[1])
        if a and b:
            t[r["threads"]].append(a / b)
    return f"{modes[0]} / {modes[1]}: " + "; ".join(f"{k} thread{'s' if k > 1 else ''} {span(v, suffix='x')}"
                                                     for k, v in sorted(t.items()))


def peak_rss(runs):
    latest = runs[0]
    rows = [[short_file(r["file"]), r["activations"], fmt(r.get("peak_rss_mb"), "{:.0f}"), fmt(r.get("file_mb"), "{:.0f}"),
             fmt(r.get("runtime_rss_mb"), "{:.0f}"), fmt(r.get("ratio"), "{:.2f}x")] for r in latest.records]
    out = run_header(latest) + table(["file", "activations", "peak RSS MB", "file MB", "runtime MB (`specdec --help`)",
                                      "(peak - runtime) / file"], rows)
    cell = lambda run: "; ".join(f"{short_file(r['file'])} {r['activations']} {fmt(r.get('ratio'), '{:.2f}x')}"
                                 for r in run.records)
    return out + history(runs[1:], "Earlier runs", [("(peak - runtime) / file", cell)])


# --- batches (batch_throughput.py) ---
def _batch_cells(run, key):
    """(variant, mode) -> {B: (median tokens/s, median over the rounds of mode / target-only)} for key
    (tokens_per_second or after_prefill_tokens_per_second); the variant names the build or the --extra flags
    where they differ within the run (its rounds)."""
    many_commits = len({r["commit"] for r in run.records}) > 1
    many_extras = len({r.get("extra") or "" for r in run.records}) > 1
    vals = defaultdict(lambda: defaultdict(dict))  # (variant, mode) -> B -> round -> value
    for r in run.records:
        if r.get(key) is not None:
            variant = " ".join(([r["commit"]] if many_commits else []) +
                               ([r.get("extra") or "(no --extra)"] if many_extras else []))
            vals[(variant, r["mode"])][r["batch"]][r.get("round")] = r[key]
    out = {}
    for (variant, mode), bs in vals.items():
        base = vals.get((variant, "target-only"), {})
        out[(variant, mode)] = {b: (med(v.values()), med([x / base[b][k] for k, x in v.items() if base.get(b, {}).get(k)] or [None])
                                    if mode != "target-only" and base.get(b) else None) for b, v in bs.items()}
    return out


def _cell(v, b, with_value=True):
    """'tokens/s (ratio)' of B b, or the ratio alone."""
    if b not in v:
        return "-"
    value, rel = v[b]
    r = fmt(rel, "{:.2f}x")
    return (fmt(value) + (f" ({r})" if rel is not None else "")) if with_value else r


def _rounds(run):
    n = len({r.get("round") for r in run.records})
    return f"Medians of {n} rounds (invocations reported together). " if n > 1 else ""


def batch_throughput(runs):
    out = []
    for subject in dict.fromkeys(r.subject for r in runs):
        rs = [r for r in runs if r.subject == subject]
        latest = rs[0]
        sizes = sorted({r["batch"] for r in latest.records})
        out += [f"### {subject}", ""] + run_header(latest)
        rows = []
        for what, key in (("whole requests", "tokens_per_second"), ("after the prefill", "after_prefill_tokens_per_second")):
            cells = _batch_cells(latest, key)
            if not cells:
                continue
            rows.append([f"*{what}*"] + [""] * (len(sizes) + 1))
            for (variant, mode), v in cells.items():
                row = [f"{variant} {mode}".strip()] + [_cell(v, b) for b in sizes]
                rows.append(row + [ratio(v.get(sizes[-1], (None,))[0], v.get(sizes[0], (None,))[0])])
        out += [_rounds(latest) + "In brackets: against target-only at the same B (the median of the rounds' ratios).", ""]
        out += table(["mode"] + [f"B={b} tok/s" for b in sizes] + [f"B={sizes[-1]} / B={sizes[0]}"], rows)
        if {r.get("identical") for r in latest.records} == {True}:
            out += ["Greedy output identical in every run of every mode and B.", ""]
        out += history(rs[1:], f"Earlier runs, {subject}",
                       [("after the prefill (else whole requests): tok/s per B, other modes against target-only", _batch_summary)])
    return out


def _batch_summary(run):
    cells = _batch_cells(run, "after_prefill_tokens_per_second") or _batch_cells(run, "tokens_per_second")
    sizes = sorted({b for v in cells.values() for b in v})
    parts = []
    for (variant, mode), v in cells.items():
        name = f"{variant} {mode}".strip()
        parts.append(f"{name} {' / '.join(_cell(v, b, mode == 'target-only') for b in sizes)}")
    extras = {(r.get("extra") or "").strip() for r in run.records}
    extra = extras.pop() if len(extras) == 1 else ""
    n = len({r.get("round") for r in run.records})
    return (f"B = {'/'.join(map(str, sizes))}{' ' + extra if extra else ''}{f', {n} rounds' if n > 1 else ''}: "
            + "; ".join(parts))


# --- schedules one `specdec generate --prompts-file` run each (schedule_rounds) ---
def _sched_groups(run):
    many = len(run.commits) > 1
    groups = defaultdict(list)
    for r in run.records:
        build = f"{r['build']} ({r['commit']})" if r.get("build") else r["commit"] if many else ""
        groups[(build, r["schedule"], r.get("k"))].append(r)
    return groups


def schedule_rounds(runs):
    latest = runs[0]
    cols = [k for k in ("tokens_per_second", "after_prefill_tokens_per_second", "total_s", "req1_s", "rest_s",
                        "req1_after_prefill_s", "rest_after_prefill_s", "tokens_per_pass", "acceptance")
            if any(k in r for r in latest.records)]
    rows = [[b or "-", s, k if k is not None else "-", len(rs)] + [_median_span([r.get(c) for r in rs], "{:.2f}") for c in cols]
            for (b, s, k), rs in _sched_groups(latest).items()]
    out = run_header(latest) + [f"Pair: {latest.records[0].get('pair')}; medians over the rounds (range in brackets).", ""]
    out += table(["build", "schedule", "K cap", "rounds"] + cols, rows)

    def cell(run):
        key = next((k for k in ("after_prefill_tokens_per_second", "total_s", "rest_after_prefill_s") if any(k in r for r in run.records)))
        return f"{key}: " + "; ".join(f"{(b + ' ') if b else ''}{s} {k}: {fmt(med([r[key] for r in rs if key in r]), '{:.2f}')}"
                                     for (b, s, k), rs in _sched_groups(run).items() if any(key in r for r in rs))
    return out + history(runs[1:], "Earlier runs", [("pair", lambda r: r.records[0].get("pair", "-")), ("medians", cell)])


# --- speculation with specdec compare (make_draft.sh, smollm2_speculation.sh, e2e_speedup.sh, ...) ---
COMPARE = ["greedy_ms_per_token", "assisted_ms_per_token", "speedup", "predicted", "acceptance", "tokens_per_pass",
           "cost_ratio", "identical"]


def _mean(rs, k):
    vals = [r[k] for r in rs if r.get(k) is not None]
    return sum(vals) / len(vals) if vals else None


def make_draft(runs):
    latest = runs[0]
    out = run_header(latest)
    held = [r for r in latest.records if r["kind"] == "held_out"]
    if held:
        when = lambda r: "after %d steps" % r["steps"] if r["steps"] else "before training"
        out += ["make-draft's held-out figures: " + "; ".join(f"{when(r)}: KL {r['kl']:.3f}, greedy agreement "
                                                             f"{r['greedy_agreement']:.3f}" for r in held), ""]
    groups = defaultdict(list)
    for r in latest.records:
        if r["kind"] in ("compare", "mean"):
            groups[(r["draft"] + (f".{r['tag']}" if r.get("tag") else ""), r["schedule"])].append(r)
    rows = []
    for (d, s), rs in groups.items():
        n = sum(r.get("prompts", 1) for r in rs)
        ident = all(r.get("identical", r.get("all_identical")) for r in rs)
        rows.append([d, s, n, fmt(_mean(rs, "speedup"), "{:.2f}x") + (f" ({span([r['speedup'] for r in rs])})" if len(rs) > 1 else ""),
                     fmt(_mean(rs, "acceptance"), "{:.3f}"), fmt(_mean(rs, "tokens_per_pass"), "{:.2f}"),
                     fmt(_mean(rs, "cost_ratio"), "{:.3f}"), fmt(_mean(rs, "greedy_ms_per_token")),
                     fmt(_mean(rs, "assisted_ms_per_token")), ident])
    out += ["Means over the evaluation prompts (range over them in brackets).", ""]
    out += table(["draft", "schedule", "prompts", "speedup", "acceptance", "tokens/pass", "cost ratio c", "greedy ms/token",
                  "assisted ms/token", "identical"], rows)

    def cell(run):
        g = defaultdict(list)
        for r in run.records:
            if r["kind"] in ("compare", "mean"):
                g[(r["draft"] + (f".{r['tag']}" if r.get("tag") else ""), r["schedule"])].append(r)
        parts = [f"{d} {s} {fmt(_mean(rs, 'speedup'), '{:.2f}x')} ({fmt(_mean(rs, 'tokens_per_pass'), '{:.2f}')}/pass)"
                 for (d, s), rs in g.items()]
        h = [r for r in run.records if r["kind"] == "held_out" and r["steps"]]
        rates = [r for r in run.records if r["kind"] == "data_rate"]
        if h:
            parts.append(f"held-out agreement {h[0]['greedy_agreement']:.3f} after {h[0]['steps']} steps")
        parts += [f"make-draft data rate, round {r['round']} {r['activations']}: labelling {r['labelling_tokens_per_s']} "
                  f"tok/s, answering {r['answering_tokens_per_s']}" for r in rates]
        return "; ".join(parts)
    return out + history(runs[1:], "Earlier runs", [("draft, schedule: mean speedup (tokens per target pass)", cell)])


def per_config(runs, keys=("device", "dtype", "kernels")):
    """Compare-line benchmarks: the latest run's lines (per prompt: one column each); earlier runs as speedups per
    configuration."""
    latest = runs[0]
    extra = [k for k in keys if any(k in r for r in latest.records)]
    prompts = sorted({r["prompt"] for r in latest.records if r.get("prompt") is not None})
    out = run_header(latest)
    if prompts:  # one row per configuration, a column per prompt
        groups = defaultdict(dict)
        for r in latest.records:
            groups[tuple(r.get(k, "-") for k in extra) + (r["config"],)][r["prompt"]] = r
        rows = [list(key) + [f"{fmt(g[p]['speedup'], '{:.2f}x')} ({fmt(g[p]['tokens_per_pass'], '{:.2f}')})" if p in g else "-"
                             for p in prompts] + [all(x["identical"] for x in g.values())] for key, g in groups.items()]
        out += ["Speedup over target-only per prompt (tokens per target pass in brackets).", ""]
        out += table(extra + ["configuration"] + [f"prompt {p}" for p in prompts] + ["identical"], rows)
    else:
        cols = [c for c in COMPARE if any(c in r for r in latest.records)]
        rows = [[r.get(k, "-") for k in extra] + [r["config"]] + [fmt_any(r.get(c)) for c in cols] for r in latest.records]
        out += table(extra + ["configuration"] + cols, rows)

    def cell(run):
        g = defaultdict(list)
        for r in run.records:
            g[" ".join(str(r[k]) for k in keys if len({x.get(k) for x in run.records}) > 1) + " " + r["config"]].append(r.get("speedup"))
        return "; ".join(f"{c.strip()} {span(v, suffix='x')}" for c, v in g.items())
    return out + history(runs[1:], "Earlier runs", [("command", lambda r: f"`{r.command}`"), ("speedup per configuration", cell)])
