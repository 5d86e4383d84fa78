"""Benchmark records: one JSON object per line in benchmarks/results/NAME.jsonl, one schema for every
benchmark (benchmarks/report.py turns the files into docs/benchmarks.md). Every record has

  benchmark  which benchmark (or part of one) measured it: the file's NAME
  run        the run it belongs to (records of one run share it; the scripts write its start time)
  date       when it was measured, ISO 8601 (UTC)
  commit     the specdec commit measured (git rev-parse --short HEAD), or "unknown"
  cpu        the CPU model (lscpu's model name, with its family and model)
  cpus       the CPUs the machine has
  threads    the threads the measurement used
  command    the command that produced it

and then its figures (see docs/benchmarks.md). Used as a module (`common`, `append`) and from shell:

  ... | python3 benchmarks/bench_record.py NAME --command CMD [--run RUN] [--threads N] [--env VAR,VAR]
        [--set KEY=VALUE ...] [--tee] [--out FILE]

reads JSON objects from stdin, one per line, gives each the common fields it does not have (and
the --set ones), and appends them to benchmarks/results/NAME.jsonl (--out: another file); --tee
also prints every input line unchanged. --env VAR,VAR puts the variables that are set in the
environment in front of the command (VAR=value ...)."""
import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
COMMON = ("benchmark", "run", "date", "commit", "cpu", "cpus", "threads", "command")


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def cpu_model():
    """lscpu's "Model name", with "(family F, model M)" where lscpu gives them; /proc/cpuinfo without lscpu."""
    fields = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        fields = dict(l.split(":", 1) for l in out.splitlines() if ":" in l)
    except (OSError, subprocess.SubprocessError):
        try:
            with open("/proc/cpuinfo") as f:
                fields = {"Model name": next(l.split(":", 1)[1] for l in f if l.startswith("model name"))}
        except (OSError, StopIteration):
            pass
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    name = fields.get("Model name", "unknown")
    if fields.get("CPU family") and fields.get("Model"):
        name += f" (family {fields['CPU family']}, model {fields['Model']})"
    return name


def git_commit():
    try:
        p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                           cwd=os.path.dirname(os.path.abspath(__file__)))
        return p.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def with_env(command, env=()):
    """command with the variables of env that are set in the environment before it (VAR=value ...)."""
    return " ".join([f"{v}={shlex.quote(os.environ[v])}" for v in env if os.environ.get(v)] + [command])


def command_line(argv=None, env=()):
    """This process's command as typed (python3 and argv quoted), with the variables of env before it."""
    argv = sys.argv if argv is None else argv
    return with_env(" ".join(["python3"] + [shlex.quote(a) for a in argv]), env)


def common(benchmark, command, threads, run=None):
    """The common fields of a record measured now; run defaults to now."""
    date = now()
    return {"benchmark": benchmark, "run": run or date, "date": date, "commit": git_commit(), "cpu": cpu_model(),
            "cpus": os.cpu_count(), "threads": threads, "command": command}


def complete(rec, base):
    """rec with the fields of base it lacks; the common fields first."""
    merged = {**base, **rec}
    return {**{k: merged[k] for k in COMMON if k in merged}, **{k: v for k, v in merged.items() if k not in COMMON}}


def append(name, records, out=None):
    path = out or os.path.join(RESULTS, name + ".jsonl")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path


def main():
    ap = argparse.ArgumentParser(description="Append JSON lines from stdin as benchmark records.")
    ap.add_argument("name", help="the benchmark: records go to benchmarks/results/NAME.jsonl")
    ap.add_argument("--command", required=True, help="the command that produced the records")
    ap.add_argument("--run", default=None, help="the run's id (default: now)")
    ap.add_argument("--threads", type=int, default=None, help="threads, for records without a threads field")
    ap.add_argument("--env", default="", help="comma-separated environment variables to put before the command")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a field for every record (VALUE as JSON where it parses, else as text)")
    ap.add_argument("--tee", action="store_true", help="also print the input lines")
    ap.add_argument("--out", default=None, help="append to this file instead")
    a = ap.parse_args()
    base = common(a.name, with_env(a.command, [v for v in a.env.split(",") if v]), a.threads, a.run)
    for kv in a.set:
        k, _, v = kv.partition("=")
        try:
            base[k] = json.loads(v)
        except ValueError:
            base[k] = v
    recs = []
    for line in sys.stdin:
        if not line.strip():
            continue
        if a.tee:
            print(line, end="", flush=True)
        rec = json.loads(line)
        base["date"] = now()
        recs.append(complete(rec, base))
        append(a.name, recs[-1:], a.out)


if __name__ == "__main__":
    main()
