#!/usr/bin/env bash
# Runs the documentation's commands: every fenced block whose info string is `sh test` in README.md
# and docs/*.md, each in its own `bash -euo pipefail` from the repository root (stdin /dev/null), in
# file order. Prints FILE:LINE of each block and stops at the first that fails (exit 1).
# Needs a build in build/ and the model of scripts/get_models.sh (what CI has after scripts/test.sh).
# Mark a block `sh test` only when it runs in well under a minute on a 2-core CPU without a GPU.
# Usage: scripts/doc_commands.sh [--list] [FILE...]   (--list: print the blocks, run nothing)
set -euo pipefail
cd "$(dirname "$0")/.."
list=0
if [[ ${1:-} == --list ]]; then list=1; shift; fi
files=("$@")
((${#files[@]})) || files=(README.md docs/*.md)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Block N: its commands in N.sh, its FILE:LINE (of the opening fence) in N.where.
awk -v dir="$tmp" '
  function unterminated() { print "doc_commands: " where ": unterminated sh test block" > "/dev/stderr"; bad = 1; exit 1 }
  FNR == 1 && inside { unterminated() }
  !inside && /^```sh test[ \t]*$/ {
    inside = 1; n++; where = FILENAME ":" FNR; body = sprintf("%s/%04d.sh", dir, n)
    print where > sprintf("%s/%04d.where", dir, n); printf "" > body; next }
  inside && /^```[ \t]*$/ { inside = 0; close(body); next }
  inside { print > body }
  END { if (inside && !bad) unterminated() }
' "${files[@]}"
if ((!list)); then
  [[ -x build/specdec ]] || { echo "doc_commands: build/specdec is missing (docs/build.md)" >&2; exit 1; }
  [[ -f models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ]] ||
    { echo "doc_commands: the model is missing (bash scripts/get_models.sh)" >&2; exit 1; }
fi
n=0
for body in "$tmp"/*.sh; do
  [[ -e $body ]] || { echo "doc_commands: no sh test block in ${files[*]}" >&2; exit 1; }
  where=$(<"${body%.sh}.where")
  n=$((n + 1))
  echo "== $where"
  if ((list)); then cat "$body"; continue; fi
  t0=$SECONDS
  bash -euo pipefail "$body" < /dev/null || { echo "doc_commands: FAILED: the block at $where" >&2; exit 1; }
  echo "-- ok, $((SECONDS - t0)) s"
done
((list)) && echo "doc_commands: $n blocks" || echo "doc_commands: $n blocks passed"
