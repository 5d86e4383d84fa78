#!/usr/bin/env bash
# specdec beside llama.cpp on the same GGUF files, interleaved in one run (measurement only: llama.cpp
# is built from the source that PyPI's llama-cpp-python sdist carries, under bench-peers/, which is
# git-ignored; none of its code enters specdec).
#   bash benchmarks/llama_cpp_peer.sh [BUILD_DIR] [ROUNDS] [THREADS...]
# Files: SmolLM2-135M-Instruct Q4_1 as shipped (scripts/get_models.sh), and Q8_0 / F16 / F32 made
# from it with llama-quantize --allow-requantize (F16/F32 hold the Q4_1 values exactly; Q8_0 is a
# requantization: both engines read the same file). Per file and thread count: decode ms/token
# (llama-bench tg64; specdec: 64 greedy tokens after a 3-token prompt, decode passes only) and
# prefill time for 16 and 128 tokens (llama-bench pp; specdec: the first pass of a 16/128-token
# prompt). Medians over ROUNDS rounds (default 3), threads 1 and 2 by default.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-3}
shift 2 || true
threads=("$@"); ((${#threads[@]})) || threads=(1 2)
peers=bench-peers
version=0.3.36
model=models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
[ -x "$build/specdec" ] || { echo "no $build/specdec: build first" >&2; exit 1; }
[ -e "$model" ] || bash scripts/get_models.sh
mkdir -p "$peers"
src="$peers/llama_cpp_python-$version/vendor/llama.cpp"
if [ ! -d "$src" ]; then
  [ -x .venv/bin/pip ] || python3 -m venv .venv
  .venv/bin/pip download "llama-cpp-python==$version" --no-deps --no-binary :all: -d "$peers" -q
  tar xzf "$peers/llama_cpp_python-$version.tar.gz" -C "$peers"
fi
lbuild="$peers/llama.cpp-build"
if [ ! -x "$lbuild/bin/llama-bench" ] || [ ! -x "$lbuild/bin/llama-quantize" ]; then
  echo "building llama.cpp $version (llama-bench, llama-quantize; several minutes)" >&2
  cmake -S "$src" -B "$lbuild" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF > "$peers/cmake.log" 2>&1
  cmake --build "$lbuild" -j"$(nproc)" --target llama-bench llama-quantize > "$peers/build.log" 2>&1 ||
    { tail -20 "$peers/build.log"; exit 1; }
fi
files=("$model")
for t in Q8_0 F16 F32; do
  f="$peers/SmolLM2-135M-Instruct.$t.gguf"
  [ -e "$f" ] || "$lbuild/bin/llama-quantize" --allow-requantize "$model" "$f" "$t" > "$peers/quantize.log" 2>&1
  files+=("$f")
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ids() { python3 -c "print(','.join(str(1000 + 37 * i % 20000) for i in range($1)))"; }
p16=$(ids 16); p128=$(ids 128)
for r in $(seq "$rounds"); do
  for f in "${files[@]}"; do
    name=$(basename "$f" .gguf); name=${name##*.}
    for t in "${threads[@]}"; do
      "$build/specdec" generate --model "$f" --prompt-ids 1,2,3 --max-new-tokens 64 --threads "$t" --json \
        > "$out/specdec.$name.$t.tg.$r.json"
      for p in 16 128; do
        v=p$p
        "$build/specdec" generate --model "$f" --prompt-ids "${!v}" --max-new-tokens 1 --threads "$t" --json \
          > "$out/specdec.$name.$t.pp$p.$r.json"
      done
      "$lbuild/bin/llama-bench" -m "$f" -t "$t" -p 16,128 -n 64 -r 1 -o json > "$out/llama.$name.$t.$r.json" 2> /dev/null
    done
  done
done
python3 - "$out" "$rounds" "${threads[*]}" "${files[@]}" <<'PY'
import json, os, statistics, sys
out, rounds, threads, files = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
med = statistics.median
print(f"{'file':6} {'thr':>3} | {'decode ms/token':>22} | {'prefill 16 ms':>20} | {'prefill 128 ms':>20}")
print(f"{'':6} {'':>3} | {'specdec':>10} {'llama.cpp':>11} | {'specdec':>9} {'llama.cpp':>10} | {'specdec':>9} {'llama.cpp':>10}")
for f in files:
    name = os.path.basename(f)[:-5].split(".")[-1]
    for t in threads:
        s_tg, s_pp, l_tg, l_pp = [], {16: [], 128: []}, [], {16: [], 128: []}
        for r in range(1, rounds + 1):
            s_tg.append(1000 * json.load(open(f"{out}/specdec.{name}.{t}.tg.{r}.json"))["stats"]["target_seconds_per_pass"])
            for p in (16, 128):
                s_pp[p].append(1000 * json.load(open(f"{out}/specdec.{name}.{t}.pp{p}.{r}.json"))["stats"]["prefill_seconds"])
            for row in json.load(open(f"{out}/llama.{name}.{t}.{r}.json")):
                ms = 1000 / row["avg_ts"] if row["n_gen"] else None
                if row["n_gen"]: l_tg.append(ms)
                else: l_pp[row["n_prompt"]].append(1000 * row["n_prompt"] / row["avg_ts"])
        print(f"{name:6} {t:>3} | {med(s_tg):10.2f} {med(l_tg):11.2f} | {med(s_pp[16]):9.1f} {med(l_pp[16]):10.1f} | "
              f"{med(s_pp[128]):9.1f} {med(l_pp[128]):10.1f}")
PY
