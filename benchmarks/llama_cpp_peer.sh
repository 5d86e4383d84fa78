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
# prompt). specdec runs twice on the block formats: float32 activations (the default: bitwise the
# dequantized float32 model) and --int8-activations (llama.cpp's arithmetic). Medians over ROUNDS
# rounds (default 3), threads 1 and 2 by default.
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
      for mode in float int8; do
        flag=(); [ $mode = int8 ] && flag=(--int8-activations)
        [ $mode = int8 ] && [[ $name == F* ]] && continue  # float formats have no integer kernel
        "$build/specdec" generate --model "$f" "${flag[@]}" --prompt-ids 1,2,3 --max-new-tokens 64 --threads "$t" \
          --json > "$out/specdec.$mode.$name.$t.tg.$r.json"
        for p in 16 128; do
          v=p$p
          "$build/specdec" generate --model "$f" "${flag[@]}" --prompt-ids "${!v}" --max-new-tokens 1 --threads "$t" \
            --json > "$out/specdec.$mode.$name.$t.pp$p.$r.json"
        done
      done
      "$lbuild/bin/llama-bench" -m "$f" -t "$t" -p 16,128 -n 64 -r 1 -o json > "$out/llama.$name.$t.$r.json" 2> /dev/null
    done
  done
done
python3 - "$out" "$rounds" "${threads[*]}" "${files[@]}" <<'PY'
import json, os, statistics, sys
out, rounds, threads, files = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
med = statistics.median
def specdec(mode, name, t, what):
    vals = []
    for r in range(1, rounds + 1):
        path = f"{out}/specdec.{mode}.{name}.{t}.{what}.{r}.json"
        if not os.path.exists(path): return None
        st = json.load(open(path))["stats"]
        vals.append(1000 * (st["target_seconds_per_pass"] if what == "tg" else st["prefill_seconds"]))
    return med(vals)
fmt = lambda v: f"{v:7.1f}" if v is not None else f"{'-':>7}"
print("ms; specdec = float32 activations, int8 = --int8-activations, llama = llama.cpp (llama-bench)")
print(f"{'file':5} {'thr':>3} | {'decode ms/token':^23} | {'prefill 16 tokens':^23} | {'prefill 128 tokens':^23}")
print(f"{'':5} {'':>3} |" + " specdec    int8   llama |" * 3)
for f in files:
    name = os.path.basename(f)[:-5].split(".")[-1]
    for t in threads:
        l_tg, l_pp = [], {16: [], 128: []}
        for r in range(1, rounds + 1):
            for row in json.load(open(f"{out}/llama.{name}.{t}.{r}.json")):
                if row["n_gen"]: l_tg.append(1000 / row["avg_ts"])
                else: l_pp[row["n_prompt"]].append(1000 * row["n_prompt"] / row["avg_ts"])
        cells = []
        for what, llama in (("tg", med(l_tg)), ("pp16", med(l_pp[16])), ("pp128", med(l_pp[128]))):
            cells.append(" ".join(fmt(v) for v in (specdec("float", name, t, what), specdec("int8", name, t, what), llama)))
        print(f"{name:5} {t:>3} | " + " | ".join(cells))
PY
