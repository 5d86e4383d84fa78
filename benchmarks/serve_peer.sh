#!/usr/bin/env bash
# `specdec serve` beside llama.cpp's llama-server on the same GGUF (SmolLM2-135M-Instruct Q4_1),
# measured by benchmarks/serve_load.py (closed-loop streaming clients, greedy): measurement only,
# not run in CI. llama-server is built for measurement from the source benchmarks/llama_cpp_peer.sh
# uses (PyPI's llama-cpp-python sdist under bench-peers/, git-ignored, the same version; none of its
# code enters specdec), into the same build directory, target llama-server only.
#   bash benchmarks/serve_peer.sh [BUILD_DIR]
# One server at a time, each on all cores (SERVE_THREADS, default nproc: specdec --threads N,
# llama-server -t N -tb N); a server is stopped before the next starts. Parts (SERVE_PARTS, default
# peer,lookup,goodput,http):
#   peer     specdec serve --max-batch 8 --ctx 2048 and llama-server --parallel 8 -c 16384 (its
#            context is shared among the slots: 2048 each; continuous batching is its default),
#            concurrency SERVE_CONCURRENCY (default 1,4,8,16), chat prompts of
#            benchmarks/prompts/serve_chat.jsonl (answers that run to max_tokens) -> results/serve_peer.jsonl
#   lookup   specdec --prompt-lookup 10 (constant K; as given, i.e. under goodput; with the latest
#            match) against specdec target-only, and the latest match against target-only with
#            --int8-activations, on the grounded prompts
#            (benchmarks/prompts/grounded.txt: rewrite, extract, fix ...: answers that copy the
#            prompt), concurrency SERVE_LOOKUP_CONCURRENCY (default 1), SERVE_LOOKUP_TOKENS (128)
#            new tokens -> results/serve_lookup.jsonl
#   goodput  specdec --draft D --schedule goodput against specdec target-only, chat prompts, all
#            concurrencies -> results/serve_goodput.jsonl. D is SERVE_DRAFT, by default an early-exit
#            draft cut from the model (4 layers, make-fixture --draft-of, as smollm2_speculation.sh):
#            it rarely agrees with the target, so this measures what goodput costs when drafting
#            does not pay; give a trained draft (benchmarks/make_draft.sh smollm2) to see it pay.
#   http     the HTTP layer's cost: the requests that 8 clients send (chat prompts) through
#            `specdec generate --prompts-file FILE --batch-size 8` (in one process, tokens/s
#            of its own summary, after an 8-request warm-up run that is subtracted) against the
#            same requests through specdec serve --prefix-cache 0 at concurrency 8, SERVE_HTTP_ROUNDS
#            (default 5) rounds of both -> results/serve_http.jsonl
# The peer and lookup parts run SERVE_ROUNDS (default 3) rounds, each server once per round, in turn:
# the machine's speed drifts between minutes (a ratio of single runs moved by 30%), and a ratio within
# a round compares runs minutes apart at most; the report gives the medians.
# SERVE_FLAGS: more flags for specdec serve in the peer part (e.g. --int8-activations, which
# quantizes activations to 8 bits as llama.cpp does for these weights);
# SERVE_REQUESTS (default 4) requests per client, SERVE_MAX_TOKENS (default 64) tokens each;
# SERVE_RESULTS: the folder of the result files (default benchmarks/results, made if missing); each part
# appends its records (benchmarks/bench_record.py's schema; run = this invocation's start time, command
# = this script's command line, server = the server's) to its file, and benchmarks/report.py writes
# them into docs/benchmarks.md.
# LLAMA_BUILD, LLAMA_FLAGS: as in llama_cpp_peer.sh. Both servers keep prompt caches (specdec's
# --prefix-cache 8, llama-server's cache_prompt): the warm-up and the levels repeat prompts.
# Greedy answers of the two engines can differ (llama.cpp quantizes activations to 8 bits; specdec
# computes float32 by default), so lengths can too: compare tokens/s, not seconds.
# Prints a table of ratios at the end.
set -euo pipefail
command="bash benchmarks/serve_peer.sh$(printf ' %q' "$@")"
cd "$(dirname "$0")/.."
build=${1:-build}
bin=$build/specdec
[ -x "$bin" ] || { echo "no $bin: build first" >&2; exit 1; }
model=models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
[ -e "$model" ] || bash scripts/get_models.sh
threads=${SERVE_THREADS:-$(nproc)}
per_client=${SERVE_REQUESTS:-4}
max_tokens=${SERVE_MAX_TOKENS:-64}
levels=${SERVE_CONCURRENCY:-1,4,8,16}
lookup_levels=${SERVE_LOOKUP_CONCURRENCY:-1}
lookup_tokens=${SERVE_LOOKUP_TOKENS:-128}
http_rounds=${SERVE_HTTP_ROUNDS:-5}
rounds=${SERVE_ROUNDS:-3}
parts=${SERVE_PARTS:-peer,lookup,goodput,http}
has() { [[ ",$parts," == *",$1,"* ]]; }
prompts=benchmarks/prompts/serve_chat.jsonl
grounded=benchmarks/prompts/grounded.txt
n_grounded=$(grep -c . "$grounded")
results=${SERVE_RESULTS:-benchmarks/results}
mkdir -p "$results"
run=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
command=$(python3 -c 'import sys; sys.path.insert(0, "benchmarks"); import bench_record
print(bench_record.with_env(sys.argv[1], "SERVE_THREADS SERVE_REQUESTS SERVE_MAX_TOKENS SERVE_CONCURRENCY SERVE_LOOKUP_CONCURRENCY SERVE_LOOKUP_TOKENS SERVE_HTTP_ROUNDS SERVE_ROUNDS SERVE_PARTS SERVE_DRAFT SERVE_RESULTS SERVE_FLAGS LLAMA_BUILD LLAMA_FLAGS".split()))' "$command")
load=(python3 benchmarks/serve_load.py)
tmp=$(mktemp -d)
server_pid=
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2> /dev/null || true
    wait "$server_pid" 2> /dev/null || true
    server_pid=
  fi
}
trap 'stop_server; rm -rf "$tmp"' EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# start_server NAME COMMAND...: starts it in the background on $port (set by the caller), waits
# for GET /health 200; its log is $tmp/NAME.log.
start_server() {
  local name=$1; shift
  echo "== $name: $*" >&2
  "$@" > "$tmp/$name.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1200); do
    kill -0 "$server_pid" 2> /dev/null || { echo "$name exited:" >&2; tail -20 "$tmp/$name.log" >&2; exit 1; }
    python3 -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2).status != 200)" \
      2> /dev/null && return 0
    sleep 0.5
  done
  echo "$name: /health was not 200 within 600 s" >&2; tail -20 "$tmp/$name.log" >&2; exit 1
}
meta() { # meta SERVER_COMMAND...: the fields every result line of this server gets (and "round": $round_meta if set)
  python3 -c 'import json, os, sys; r = os.environ.get("round_meta")
print(json.dumps({"run": sys.argv[1], "command": sys.argv[2], "threads": int(sys.argv[3]), "server": " ".join(sys.argv[4:]),
                  **({"round": int(r)} if r else {})}))' "$run" "$command" "$threads" "$@"
}
# specdec_run OUT LABEL API PROMPTS LEVELS TOKENS PER_CLIENT [serve flags...]
specdec_run() {
  local out=$1 label=$2 api=$3 file=$4 lv=$5 tokens=$6 per=$7; shift 7
  port=$(free_port)
  local cmd=("$bin" serve --model "$model" --port "$port" --max-batch 8 --ctx 2048 --threads "$threads" "$@")
  start_server "$label" "${cmd[@]}"
  "${load[@]}" --url "http://127.0.0.1:$port" --api "$api" --prompts "$file" --concurrency "$lv" \
    --requests-per-client "$per" --max-tokens "$tokens" --label "$label" --out "$out" \
    --meta "$(meta "${cmd[@]}")" > /dev/null
  stop_server
}

# --- llama-server, built once (measurement only) ---
if has peer; then
  source benchmarks/llama_cpp_source.sh  # peers, version, src (the same llama.cpp as llama_cpp_peer.sh)
  [ -f "$src/tools/server/server.cpp" ] || [ -f "$src/examples/server/server.cpp" ] ||
    { echo "$src has no llama-server source (tools/server or examples/server)" >&2; exit 1; }
  lbuild=${LLAMA_BUILD:-$peers/llama.cpp-build}
  if [ ! -x "$lbuild/bin/llama-server" ]; then
    echo "building llama.cpp $version llama-server (several minutes)" >&2
    # shellcheck disable=SC2086  # LLAMA_FLAGS is a list of flags
    cmake -S "$src" -B "$lbuild" -DCMAKE_BUILD_TYPE=Release ${LLAMA_FLAGS:--DGGML_NATIVE=ON} -DLLAMA_CURL=OFF \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON > "$peers/cmake-server.log" 2>&1 ||
      { tail -20 "$peers/cmake-server.log"; exit 1; }
    cmake --build "$lbuild" -j"$(nproc)" --target llama-server > "$peers/build-server.log" 2>&1 ||
      { tail -20 "$peers/build-server.log"; exit 1; }
  fi
fi

# --- measurements ---
if has peer; then
  for round in $(seq "$rounds"); do
    # shellcheck disable=SC2086  # SERVE_FLAGS is a list of flags
    round_meta=$round specdec_run "$results/serve_peer.jsonl" specdec chat "$prompts" "$levels" "$max_tokens" \
      "$per_client" ${SERVE_FLAGS:-}
    port=$(free_port)
    cmd=("$lbuild/bin/llama-server" -m "$model" --host 127.0.0.1 --port "$port" --parallel 8 -c $((2048 * 8))
         -t "$threads" -tb "$threads")
    start_server llama-server "${cmd[@]}"
    "${load[@]}" --url "http://127.0.0.1:$port" --api chat --prompts "$prompts" --concurrency "$levels" \
      --requests-per-client "$per_client" --max-tokens "$max_tokens" --label llama-server \
      --out "$results/serve_peer.jsonl" --meta "$(round_meta=$round meta "${cmd[@]}")" > /dev/null
    stop_server
  done
fi
if has lookup; then
  # every grounded prompt once per client: target-only; --prompt-lookup 10 under constant K (Hugging
  # Face's schedule), as given (goodput, which caps each pass's lookahead by the measured pass
  # costs) and copying the latest match; then target-only and the latest match with 8-bit activations
  lookup_run() {
    round_meta=$round specdec_run "$results/serve_lookup.jsonl" "$1" chat "$grounded" "$lookup_levels" \
      "$lookup_tokens" "$n_grounded" "${@:2}"
  }
  for round in $(seq "$rounds"); do
    lookup_run specdec-target-only
    lookup_run specdec-lookup10-constant --prompt-lookup 10 --schedule constant
    lookup_run specdec-lookup10 --prompt-lookup 10
    lookup_run specdec-lookup10-last --prompt-lookup 10 --prompt-lookup-match last
    lookup_run specdec-target-only-int8 --int8-activations
    lookup_run specdec-lookup10-last-int8 --prompt-lookup 10 --prompt-lookup-match last --int8-activations
  done
fi
if has goodput; then
  draft=${SERVE_DRAFT:-models/smollm2-draft4}
  if [ -z "${SERVE_DRAFT:-}" ] && [ ! -f "$draft/config.json" ]; then
    "$bin" make-fixture --draft-of "$model" --layers 4 --out "$draft" > /dev/null
  fi
  specdec_run "$results/serve_goodput.jsonl" specdec-target-only chat "$prompts" "$levels" "$max_tokens" "$per_client"
  specdec_run "$results/serve_goodput.jsonl" specdec-goodput chat "$prompts" "$levels" "$max_tokens" "$per_client" \
    --draft "$draft" --schedule goodput
fi
if has http; then
  "${load[@]}" --url http://127.0.0.1:1 --api chat --prompts "$prompts" --concurrency 8 \
    --requests-per-client "$per_client" --max-tokens "$max_tokens" --dump-requests "$tmp/requests.jsonl"
  # A warm-up run first: 8 requests with prompt lookup (requests with and without it form separate
  # runs of the batch), whose tokens and seconds are subtracted from the summary.
  python3 - "$prompts" "$tmp/warmup.jsonl" <<'PY'
import json, sys
prompts = [json.loads(l)["prompt"] for l in open(sys.argv[1]) if l.strip()]
with open(sys.argv[2], "w") as f:
    for p in prompts[:8]:
        f.write(json.dumps({"prompt": p, "max_new_tokens": 8, "prompt_lookup_num_tokens": 1}) + "\n")
PY
  cat "$tmp/warmup.jsonl" "$tmp/requests.jsonl" > "$tmp/generate.jsonl"
  gen=("$bin" generate --model "$model" --chat --prompts-file "$tmp/generate.jsonl" --batch-size 8
       --threads "$threads")
  # Rounds of both, one after the other: the ratio is within a few percent, the noise of one
  # measurement on a shared machine too; the report gives the medians.
  for round in $(seq "$http_rounds"); do
    echo "== generate (round $round): ${gen[*]}" >&2
    "${gen[@]}" > "$tmp/generate.out" 2> "$tmp/generate.err" || { tail -20 "$tmp/generate.err" >&2; exit 1; }
    python3 - "$tmp/generate.out" "$tmp/generate.err" "$results/serve_http.jsonl" "$(round_meta=$round meta "${gen[@]}")" <<'PY'
import json, re, sys
sys.path.insert(0, "benchmarks")
import bench_record
out, err, dest, meta = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
lines = [json.loads(l) for l in open(out) if l.strip()]
warm = [l for l in lines if l["line"] <= 8]
m = re.search(r"(\d+) requests, (\d+) tokens in ([0-9.]+) s", open(err).read())
if not m:
    sys.exit(f"no summary line in {err}")
tokens = int(m.group(2)) - sum(l["stats"]["new_tokens"] for l in warm)
seconds = float(m.group(3)) - max(l["stats"]["total_seconds"] for l in warm)
rec = {"label": "specdec-generate", "url": None, "api": "chat", "concurrency": 8, "requests": len(lines) - len(warm),
       "errors": 0, "tokens": tokens, "seconds": round(seconds, 4), "throughput_tokens_per_s": round(tokens / seconds, 3),
       **meta}
rec = bench_record.complete(rec, bench_record.common("serve_http", meta["command"], meta["threads"], meta["run"]))
print(json.dumps(rec))
bench_record.append("serve_http", [rec], dest)
PY
    # No prefix cache: generate's batch reuses no prompt either (serve_load's warm-up sends the same prompts).
    round_meta=$round specdec_run "$results/serve_http.jsonl" specdec-serve chat "$prompts" 8 "$max_tokens" "$per_client" \
      --prefix-cache 0
  done
fi

# --- the table (this run's records) ---
python3 - "$results" "$run" <<'PY'
import json, os, sys, types
sys.path.insert(0, "benchmarks")
import report_tables
from report_tables import reference_label
d, run = sys.argv[1], sys.argv[2]
def load(name):
    p = os.path.join(d, name)
    rows = [json.loads(l) for l in open(p) if l.strip()] if os.path.exists(p) else []
    return [r for r in rows if r.get("run") == run]
# (rows of rounds: each number the median over them, each ratio the median of the rounds' ratios)
def at(rows, label, c):
    return report_tables.at(types.SimpleNamespace(records=rows), label, c)
def ratio(a, b, key):  # a, b: (rows, label, clients)
    v = report_tables.round_ratio(types.SimpleNamespace(records=a[0]), a[1:], b[1:], key)
    return f"{v:.2f}" if v else "-"
def fmt(r, key, scale=1, digits=1):
    v = (r or {}).get(key)
    return f"{v * scale:.{digits}f}" if v is not None else "-"
peer = load("serve_peer.jsonl")
if peer:
    print("\nspecdec serve vs llama-server (chat, greedy; tok/s, ttft/itl p50 in ms; ratios specdec/llama-server)")
    print(f"{'clients':>7} {'specdec':>9} {'llama':>9} {'tput':>6} {'ttft sd':>8} {'ttft ll':>8} {'ttft':>6} "
          f"{'itl sd':>7} {'itl ll':>7} {'itl':>6}")
    for c in sorted({r["concurrency"] for r in peer}):
        s, l = at(peer, "specdec", c), at(peer, "llama-server", c)
        sl = lambda key: ratio((peer, "specdec", c), (peer, "llama-server", c), key)
        print(f"{c:>7} {fmt(s, 'throughput_tokens_per_s'):>9} {fmt(l, 'throughput_tokens_per_s'):>9} "
              f"{sl('throughput_tokens_per_s'):>6} {fmt(s, 'ttft_p50', 1e3):>8} {fmt(l, 'ttft_p50', 1e3):>8} "
              f"{sl('ttft_p50'):>6} {fmt(s, 'itl_p50', 1e3, 2):>7} {fmt(l, 'itl_p50', 1e3, 2):>7} {sl('itl_p50'):>6}")
    for label in ("specdec", "llama-server"):
        print(f"scaling 8 vs 1 client, {label}: {ratio((peer, label, 8), (peer, label, 1), 'throughput_tokens_per_s')}x")
lookup = load("serve_lookup.jsonl")
for c in sorted({r["concurrency"] for r in lookup}):
    for label in ("specdec-lookup10-constant", "specdec-lookup10", "specdec-lookup10-last", "specdec-lookup10-last-int8"):
        k = at(lookup, label, c)
        t = at(lookup, reference_label(label), c)
        if not k:
            continue
        kt = lambda key: ratio((lookup, label, c), (lookup, reference_label(label), c), key)
        print(f"\n{label} vs target-only, grounded prompts, {c} client(s): throughput "
              f"{kt('throughput_tokens_per_s')}x ({fmt(k, 'throughput_tokens_per_s')} vs {fmt(t, 'throughput_tokens_per_s')} tok/s), "
              f"itl p50 {kt('itl_p50')}x, {fmt(k, 'tokens_per_target_pass', 1, 2)} tokens per target pass")
good = load("serve_goodput.jsonl")
if good:
    print("\ngoodput (draft) vs target-only, specdec: throughput ratio per client count")
    for c in sorted({r["concurrency"] for r in good}):
        g, t = at(good, "specdec-goodput", c), at(good, "specdec-target-only", c)
        print(f"{c:>7} clients: {ratio((good, 'specdec-goodput', c), (good, 'specdec-target-only', c), 'throughput_tokens_per_s')}x ({fmt(g, 'throughput_tokens_per_s')} vs "
              f"{fmt(t, 'throughput_tokens_per_s')} tok/s; {fmt(g, 'tokens_per_target_pass', 1, 2)} tokens per target pass)")
http = load("serve_http.jsonl")
if http:
    for rnd in sorted({r.get("round") for r in http}, key=lambda x: x or 0):
        rows = [r for r in http if r.get("round") == rnd]
        s, g = at(rows, "specdec-serve", 8), at(rows, "specdec-generate", 8)
        print(f"\nHTTP layer, round {rnd}: specdec serve at 8 clients / `specdec generate --batch-size 8`, the same requests: "
              f"{ratio((rows, 'specdec-serve', 8), (rows, 'specdec-generate', 8), 'throughput_tokens_per_s')} ({fmt(s, 'throughput_tokens_per_s')} vs {fmt(g, 'throughput_tokens_per_s')} tok/s)")
PY
