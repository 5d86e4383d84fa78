#!/usr/bin/env bash
# specdec beside llama.cpp on the same GGUF files, interleaved in one run (measurement only: llama.cpp
# is built from the source that PyPI's llama-cpp-python sdist carries, under bench-peers/, which is
# git-ignored; none of its code enters specdec).
#   bash benchmarks/llama_cpp_peer.sh [BUILD_DIR] [ROUNDS] [THREADS...]
#   PEER_PARTS=smollm2,gemma3,synthetic,speculative (default: all four)   PEER_OUT=FILE (default below)
#   LLAMA_BUILD=DIR: llama.cpp's build directory (default bench-peers/llama.cpp-build); LLAMA_FLAGS: its
#   CMake flags when the script builds it (default -DGGML_NATIVE=ON; on a CPU where llama.cpp's native
#   AMX kernel faults, e.g. "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
#   -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX512_VBMI=ON")
# Files:
#   smollm2:   SmolLM2-135M-Instruct Q4_1 as shipped (scripts/get_models.sh), and Q8_0 / F16 / F32 made
#              from it with llama-quantize --allow-requantize (F16/F32 hold the Q4_1 values exactly).
#   gemma3:    Gemma 3 270M Q4_K_M as shipped (scripts/get_models.sh): a 262,144-token tied head in Q8_0.
#   synthetic: the synthetic 1.1B Llama pair (benchmarks/synthetic_pair.sh) given the Llama 2 tokenizer
#              of ../shared/fixtures/tokenizers (32000 ids, its vocabulary) and converted by llama.cpp's
#              own convert_hf_to_gguf.py to F32; target F16 / Q8_0 / Q4_0 / Q4_K_M and a Q4_0 draft
#              made with llama-quantize (whose Q4_0 keeps the output matrix in Q6_K; Q4_K_M mixes
#              Q4_K and Q6_K).
# Per file and thread count, each engine in one process (peak RSS of that process):
#   llama.cpp: llama-bench, passes of 1, 2, 4, 6, 8, 16, 128 tokens (pp) and decode (tg), the mean
#              of 2 repetitions;
#   specdec:   `generate --prompts-file`: a warm-up request, a decode of the same length (decode
#              passes only), then two requests per pass size (their first pass; the mean of the
#              two). Decode: 64 tokens on SmolLM2, 32 on the 1.1B target. Block formats run twice:
#              float32 activations (the default: bitwise the dequantized float32 model) and
#              --int8-activations (llama.cpp's arithmetic).
#   floor:     the memory-bandwidth floor of a decode step: the time a plain read of the bytes a
#              one-token pass reads (every tensor of the file but the token embedding, unless the
#              output matrix is that embedding; benchmarks/pass_bytes.py) takes at the same thread
#              count, from huge pages (specdec_micro_bench's BM_ReadBandwidth, median of 3; skipped
#              when the build has no micro bench).
# speculative (last thread count): two synthetic pairs, Q8_0 target + Q4_0 draft and F32 + F32, on one
#   text prompt, 64 new tokens: `specdec compare` (target-only and assisted in one process, after a
#   warm-up) with constant K=5, dynamic and goodput (on the Q8_0 + Q4_0 pair also goodput with
#   --int8-activations on both models, llama.cpp's arithmetic); llama-speculative-simple with K=5 (draft 5,
#   minimum 0) and with draft up to 16 under p-min 0.75; llama.cpp's target-only time from
#   llama-bench (prompt pass + 64 decode steps).
# Every measurement is one JSON line appended to PEER_OUT (default benchmarks/results/llama_cpp_peer.jsonl,
# the common schema of benchmarks/bench_record.py: benchmark, run, date, commit, cpu, cpus, threads,
# command, then the figures); ROUNDS rounds (default 3) interleave the engines. benchmarks/report.py
# then writes docs/benchmarks.md with its plots from benchmarks/results/ (for another PEER_OUT,
# bench-peers/docs-NAME/benchmarks.md from that file alone).
set -euo pipefail
command="bash benchmarks/llama_cpp_peer.sh$(printf ' %q' "$@")"
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-3}
shift 2 || true
threads=("$@"); ((${#threads[@]})) || threads=(1 2)
parts=${PEER_PARTS:-smollm2,gemma3,synthetic,speculative}
default_out=benchmarks/results/llama_cpp_peer.jsonl
out=${PEER_OUT:-$default_out}
smollm2=models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
gemma3=models/gemma3/gemma-3-270m-q4_k_m.gguf
tokenizer=../shared/fixtures/tokenizers/llama2_legacy
has() { [[ ",$parts," == *",$1,"* ]]; }
[ -x "$build/specdec" ] || { echo "no $build/specdec: build first" >&2; exit 1; }

# --- llama.cpp, built once ---
source benchmarks/llama_cpp_source.sh  # peers, version, src
lbuild=${LLAMA_BUILD:-$peers/llama.cpp-build}
tools=(llama-bench llama-quantize llama-speculative-simple)
for t in "${tools[@]}"; do
  [ -x "$lbuild/bin/$t" ] && continue
  echo "building llama.cpp $version (${tools[*]}; several minutes)" >&2
  cmake -S "$src" -B "$lbuild" -DCMAKE_BUILD_TYPE=Release ${LLAMA_FLAGS:--DGGML_NATIVE=ON} -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF > "$peers/cmake.log" 2>&1
  cmake --build "$lbuild" -j"$(nproc)" --target "${tools[@]}" > "$peers/build.log" 2>&1 ||
    { tail -20 "$peers/build.log"; exit 1; }
  break
done
quantize() { # quantize FROM TO TYPE (once)
  [ -e "$2" ] || "$lbuild/bin/llama-quantize" --allow-requantize "$1" "$2" "$3" > "$peers/quantize.log" 2>&1 ||
    { tail -5 "$peers/quantize.log"; exit 1; }
}

# --- the files ---
files=()
if has smollm2; then
  [ -e "$smollm2" ] || bash scripts/get_models.sh
  files+=("$smollm2")
  for t in Q8_0 F16 F32; do
    quantize "$smollm2" "$peers/SmolLM2-135M-Instruct.$t.gguf" "$t"
    files+=("$peers/SmolLM2-135M-Instruct.$t.gguf")
  done
fi
if has gemma3; then
  [ -e "$gemma3" ] || bash scripts/get_models.sh
  files+=("$gemma3")
fi
# Python tooling: gguf (the bytes a pass reads), matplotlib (benchmarks/report.py); for the
# synthetic pair also llama.cpp's converter's torch (reused from .venv-torch2 when
# scripts/test_torch2.sh made it), transformers, sentencepiece.
venv="$peers/venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c "import gguf, matplotlib" 2>/dev/null || "$venv/bin/pip" install -q "numpy<2.3" "gguf==0.19.*" matplotlib
if has synthetic || has speculative; then
  bash benchmarks/synthetic_pair.sh "$build" bench-models
  if ! "$venv/bin/python" -c "import torch, transformers, sentencepiece" 2>/dev/null; then
    site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    if [ -d .venv-torch2 ] && .venv-torch2/bin/python -c "import torch" 2>/dev/null; then
      .venv-torch2/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$site/torch2.pth"
    else
      "$venv/bin/pip" install -q --no-cache-dir torch
    fi
    "$venv/bin/pip" install -q "sentencepiece<0.3" "transformers==4.57.*" "protobuf<5"
  fi
  for m in target draft; do
    dir=bench-models/$m
    if [ ! -e "$dir/tokenizer.model" ]; then
      [ -e "$tokenizer/tokenizer.model" ] || { echo "no $tokenizer: llama.cpp's converter needs a tokenizer" >&2; exit 1; }
      cp "$tokenizer/tokenizer.model" "$tokenizer/tokenizer_config.json" "$dir/"
    fi
    [ -e "$peers/synthetic-$m.F32.gguf" ] ||
      "$venv/bin/python" "$src/convert_hf_to_gguf.py" "$dir" --outtype f32 --outfile "$peers/synthetic-$m.F32.gguf" \
        > "$peers/convert.log" 2>&1 || { tail -5 "$peers/convert.log"; exit 1; }
  done
  for t in F16 Q8_0 Q4_0 Q4_K_M; do quantize "$peers/synthetic-target.F32.gguf" "$peers/synthetic-target.$t.gguf" "$t"; done
  quantize "$peers/synthetic-draft.F32.gguf" "$peers/synthetic-draft.Q4_0.gguf" Q4_0
  if has synthetic; then
    for t in F32 F16 Q8_0 Q4_0 Q4_K_M; do files+=("$peers/synthetic-target.$t.gguf"); done
  fi
fi

# --- measurements ---
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$(dirname "$out")"
# specdec's resident memory before any model: the libtorch runtime
/usr/bin/time -f %M -o "$tmp/rss" "$build/specdec" --help > /dev/null
# The fields every record of this run shares (bench_record.common: run, commit, cpu, cpus, command; the
# date is each record's own), with llama.cpp's version, the rounds and that runtime's RSS.
meta=$(python3 - "$command" "$version" "$rounds" "$tmp/rss" <<'PY'
import json, sys
sys.path.insert(0, "benchmarks")
import bench_record
command, version, rounds, rss = sys.argv[1:]
m = bench_record.common("llama_cpp_peer", bench_record.with_env(command, ["PEER_PARTS", "PEER_OUT", "LLAMA_BUILD", "LLAMA_FLAGS"]),
                        None)
del m["date"], m["threads"]
m.update(llama_cpp=version, rounds=int(rounds), runtime_rss_mb=round(int(open(rss).read().split()[-1]) / 1024, 1))
print(json.dumps(m))
PY
)
passes=(1 2 4 6 8 16 128)
ids() { python3 -c "print(','.join(str(1000 + 37 * i % 20000) for i in range($1)))"; }
record() { python3 benchmarks/peer_record.py "$out" "$meta" "$@"; }
declare -A read_mb  # file -> the MB a one-token pass reads (the floor's read), counted once
prompt="Once upon a time, in a small village by the sea, there lived an old fisherman who"
for r in $(seq "$rounds"); do
  for f in "${files[@]}"; do
    name=$(basename "$f" .gguf)
    [[ $name == synthetic-* ]] && n_decode=32 || n_decode=64
    {
      printf '{"prompt_ids":[1,2,3],"max_new_tokens":2}\n{"prompt_ids":[1,2,3],"max_new_tokens":%d}\n' "$n_decode"
      for p in "${passes[@]}" "${passes[@]}"; do printf '{"prompt_ids":[%s],"max_new_tokens":1}\n' "$(ids "$p")"; done
    } > "$tmp/requests.jsonl"
    for t in "${threads[@]}"; do
      echo "round $r: $name, $t threads" >&2
      for mode in float int8; do
        flag=(); [ $mode = int8 ] && flag=(--int8-activations)
        [ $mode = int8 ] && [[ $name == *F16* || $name == *F32* ]] && continue  # no integer kernel
        /usr/bin/time -f %M -o "$tmp/rss" "$build/specdec" generate --model "$f" "${flag[@]}" \
          --prompts-file "$tmp/requests.jsonl" --threads "$t" > "$tmp/specdec.jsonl" 2> /dev/null
        record specdec "$f" "$t" "$r" "$mode" "$tmp/rss" "$tmp/specdec.jsonl" "${passes[*]}"
      done
      /usr/bin/time -f %M -o "$tmp/rss" "$lbuild/bin/llama-bench" -m "$f" -t "$t" \
        -p "$(IFS=,; echo "${passes[*]}")" -n "$n_decode" -r 2 -o json > "$tmp/llama.json" 2> /dev/null
      record llama-bench "$f" "$t" "$r" - "$tmp/rss" "$tmp/llama.json"
      if [ -x "$build/benchmarks/specdec_micro_bench" ]; then
        [ -n "${read_mb[$f]:-}" ] || read_mb[$f]=$("$venv/bin/python" benchmarks/pass_bytes.py "$f")
        mb=${read_mb[$f]}
        SPECDEC_BENCH_READ_MB=$mb BENCH_THREADS=$t "$build/benchmarks/specdec_micro_bench" \
          --benchmark_filter="ReadBandwidth/$mb\$" --benchmark_repetitions=3 --benchmark_format=json \
          > "$tmp/floor.json" 2> /dev/null
        record floor "$f" "$t" "$r" - - "$tmp/floor.json" "$mb"
      fi
    done
  done
  if has speculative; then
    t=${threads[-1]}
    for pair in Q8_0:Q4_0 F32:F32; do
      target="$peers/synthetic-target.${pair%%:*}.gguf" draft="$peers/synthetic-draft.${pair##*:}.gguf"
      echo "round $r: speculative $pair, $t threads" >&2
      scheds=("constant --num-assistant-tokens 5" dynamic goodput)
      [ "$pair" = Q8_0:Q4_0 ] && scheds+=("goodput+int8 --int8-activations --draft-int8-activations")
      for sched in "${scheds[@]}"; do
        set -- $sched
        /usr/bin/time -f %M -o "$tmp/rss" "$build/specdec" compare --model "$target" --draft "$draft" \
          --prompt "$prompt" --max-new-tokens 64 --threads "$t" --schedule "${1%+*}" "${@:2}" --json \
          > "$tmp/compare.json" 2> /dev/null
        record specdec-compare "$target" "$t" "$r" "$1" "$tmp/rss" "$tmp/compare.json" "$draft"
      done
      n_prompt=$(python3 -c "import json; print(json.load(open('$tmp/compare.json'))['target_only']['stats']['prompt_tokens'])")
      "$lbuild/bin/llama-bench" -m "$target" -t "$t" -p "$n_prompt" -n 64 -r 1 -o json > "$tmp/llama.json" 2> /dev/null
      record llama-target-only "$target" "$t" "$r" - - "$tmp/llama.json"
      for spec in "5 0.0" "16 0.75"; do
        set -- $spec
        /usr/bin/time -f %M -o "$tmp/rss" "$lbuild/bin/llama-speculative-simple" -m "$target" -md "$draft" \
          --spec-type draft-simple -p "$prompt" -n 64 --spec-draft-n-max "$1" --spec-draft-n-min 0 \
          --spec-draft-p-min "$2" --temp 0 -t "$t" -c 512 > "$tmp/spec.log" 2>&1
        record llama-speculative "$target" "$t" "$r" "max$1-pmin$2" "$tmp/rss" "$tmp/spec.log" "$draft"
      done
    done
  fi
done
echo "appended to $out" >&2
# docs/ holds the report of benchmarks/results/; another output file's goes under bench-peers/.
if [ "$out" = "$default_out" ]; then
  "$venv/bin/python" benchmarks/report.py
else
  "$venv/bin/python" benchmarks/report.py --results "$out" --docs "$peers/docs-$(basename "$out" .jsonl)"
fi
