#!/usr/bin/env bash
# The project's Python tooling, in .venv (system site packages, so Debian's python3-torch 1.13 is
# used): transformers 4.47 with gguf and accelerate for scripts/hf_reference_smollm2.py, numpy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
need=(python3-torch python3-numpy)
missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[[ -x .venv/bin/pip ]] || /usr/bin/python3 -m venv --system-site-packages .venv
.venv/bin/pip install --quiet "transformers==4.47.*" "tokenizers<0.22" gguf "accelerate<1.3" "jinja2>=3.1" "numpy<2"
echo "setup_python: .venv ready"
