"""Appends one measurement of benchmarks/llama_cpp_peer.sh to its JSON Lines file, as a record of
benchmarks/bench_record.py's schema (META: the JSON object of the fields the run's records share).
Usage: peer_record.py OUT META SOURCE FILE THREADS ROUND MODE RSS_FILE|- OUTPUT [EXTRA]
SOURCE: specdec (generate --prompts-file output; EXTRA = the pass sizes, each requested twice), llama-bench (its -o json),
specdec-compare (compare --json; EXTRA = the draft; MODE = the schedule, with "+int8" for 8-bit activations), llama-target-only (llama-bench -p N -n 64),
llama-speculative (llama-speculative-simple's log; EXTRA = the draft), floor (specdec_micro_bench's JSON of
BM_ReadBandwidth; EXTRA = the MB read)."""
import json
import os
import re
import sys

import bench_record

out, meta, source, path, threads, rnd, mode, rss_file, output = sys.argv[1:10]
extra = sys.argv[10] if len(sys.argv) > 10 else ""
rec = {"file": os.path.basename(path), "file_mb": round(os.path.getsize(path) / 2**20, 1), "threads": int(threads),
       "round": int(rnd)}
if rss_file != "-":
    rec["rss_mb"] = round(int(open(rss_file).read().split()[-1]) / 1024, 1)


def llama_bench_rows(text):
    rows = json.loads(text)
    passes = {r["n_prompt"]: 1e3 * r["n_prompt"] / r["avg_ts"] for r in rows if r["n_gen"] == 0}
    decode = [1e3 / r["avg_ts"] for r in rows if r["n_gen"]]
    return passes, decode[0] if decode else None


text = open(output, errors="replace").read()
if source == "specdec":
    lines = [json.loads(l) for l in text.splitlines() if l.strip()]
    stats = [l["stats"] for l in lines]
    sizes = [int(s) for s in extra.split()]
    rec.update(kind="passes", engine="specdec", mode=mode, decode_ms=1e3 * stats[1]["target_seconds_per_pass"],
               pass_ms={str(n): 1e3 * (a["prefill_seconds"] + b["prefill_seconds"]) / 2
                        for n, a, b in zip(sizes, stats[2:], stats[2 + len(sizes):])})
elif source == "llama-bench":
    passes, decode = llama_bench_rows(text)
    rec.update(kind="passes", engine="llama.cpp", mode="-", decode_ms=decode,
               pass_ms={str(n): ms for n, ms in passes.items()})
elif source == "specdec-compare":
    j = json.loads(text)
    a, t = j["assisted"]["stats"], j["target_only"]["stats"]
    config, _, int8 = mode.partition("+")  # MODE: a schedule, "+int8" for --int8-activations on both models
    rec.update(kind="speculative", engine="specdec int8" if int8 else "specdec", config=config,
               draft=os.path.basename(extra),
               target_only_ms=1e3 * t["total_seconds"] / t["new_tokens"],
               ms=1e3 * a["total_seconds"] / a["new_tokens"], tokens=a["new_tokens"],
               acceptance=a["acceptance_rate"], tokens_per_pass=a["tokens_per_target_pass"],
               cost_ratio=j["cost_ratio"], predicted=j["predicted_speedup"], identical=j["identical"])
elif source == "llama-target-only":
    passes, decode = llama_bench_rows(text)
    (n_prompt, prompt_ms), = passes.items()
    rec.update(kind="target_only", engine="llama.cpp", ms=(prompt_ms + 64 * decode) / 64)
elif source == "llama-speculative":
    def grab(pattern):
        m = re.search(pattern, text)
        if not m:
            sys.exit(f"peer_record: '{pattern}' not in llama-speculative-simple's output:\n{text[-2000:]}")
        return float(m.group(1))
    enc, dec = grab(r"encoded +\d+ tokens in +([\d.]+) seconds"), grab(r"decoded +\d+ tokens in +([\d.]+) seconds")
    n, drafted, accepted = grab(r"n_predict += (\d+)"), grab(r"n_drafted += (\d+)"), grab(r"n_accept += (\d+)")
    rec.update(kind="speculative", engine="llama.cpp", config=mode, draft=os.path.basename(extra),
               ms=1e3 * (enc + dec) / n, tokens=int(n), acceptance=accepted / drafted if drafted else 0.0)
elif source == "floor":
    median, = [b["real_time"] for b in json.loads(text)["benchmarks"] if b["name"].endswith("_median")]
    rec.update(kind="floor", read_mb=int(extra), ms=median)
else:
    sys.exit(f"peer_record: unknown source {source}")
bench_record.append("llama_cpp_peer", [bench_record.complete(rec, {**json.loads(meta), "date": bench_record.now()})], out)
