#!/usr/bin/env bash
# The transformers 5 virtual environment, .venv-hf (no system site packages: its own torch 2.9.1
# wheel, not Debian's 1.13), for the scripts that record Hugging Face ground truth with transformers 5:
# scripts/hf_reference_archs.py (tiny Gemma 3 / Qwen 3 checkpoints, tests/data/hf) and
# scripts/hf_reference_gemma3.py (the real Gemma 3 270M GGUF, tests/data/gemma3). The project's other
# Python tooling stays on transformers 4.47 in .venv (scripts/setup_python.sh).
# accelerate: transformers 5 refuses to load a GGUF without it. Installs through the wheelhouse of
# scripts/wheels.sh, so a second clone installs from local files.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/wheels.sh
[[ -x .venv-hf/bin/pip ]] || python3 -m venv .venv-hf
pip_install .venv-hf/bin/pip "torch==2.9.1"
pip_install .venv-hf/bin/pip "transformers==5.24.0" "gguf==0.19.0" "accelerate==1.16.0" "numpy<3" sentencepiece protobuf
.venv-hf/bin/python -c "import transformers, gguf, torch; print('setup_hf: .venv-hf ready: transformers', transformers.__version__, 'torch', torch.__version__)"
