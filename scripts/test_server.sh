#!/usr/bin/env bash
# Runs the `specdec serve` tests (tests/server: pytest with the official openai client) against a
# built binary and the real model. Makes or updates the virtual environment .venv-server through
# the wheelhouse (scripts/wheels.sh). Arguments go to pytest (e.g. -k stop -x).
#   SPECDEC              the specdec binary (default build/specdec)
#   SPECDEC_SERVE_MODEL  the model the servers load (default the SmolLM2-135M-Instruct GGUF of
#                        scripts/get_models.sh)
#   SPECDEC_SHARED_DIR   the shared/ folder whose T5 tokenizer one test reads (default ../shared)
#   SPECDEC_SERVE_GEMMA  the Gemma 3 GGUF that one test serves (default that of scripts/get_models.sh)
# The chat page's test needs Debian's chromium and chromium-driver. Missing data (the model, the
# T5 tokenizer) skips, the model with exit 77 (ctest reports it skipped), unless
# SPECDEC_REQUIRE_DATA=1 (CI): then it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export SPECDEC=${SPECDEC:-build/specdec}
export SPECDEC_SERVE_MODEL=${SPECDEC_SERVE_MODEL:-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}

if [[ ! -e $SPECDEC_SERVE_MODEL ]]; then
  echo "test_server: the model $SPECDEC_SERVE_MODEL is missing (bash scripts/get_models.sh fetches it)" >&2
  [[ ${SPECDEC_REQUIRE_DATA:-0} = 1 ]] && exit 1
  exit 77
fi
skip=()
t5_tokenizer=${SPECDEC_SHARED_DIR:-../shared}/fixtures/tokenizers/t5_nonlegacy
if [[ ! -d $t5_tokenizer && ${SPECDEC_REQUIRE_DATA:-0} != 1 ]]; then
  echo "test_server: skip the T5 test: $t5_tokenizer is missing (../shared beside the repository, or SPECDEC_SHARED_DIR)" >&2
  skip=(--deselect tests/server/test_api.py::test_an_encoder_decoder_model_serves_requests_that_join_the_running_batch)
fi
if [[ ! -x $SPECDEC ]]; then
  echo "test_server: $SPECDEC is not an executable (build it first, or set SPECDEC)" >&2
  exit 1
fi

[[ -x .venv-server/bin/python ]] || python3 -m venv .venv-server
source scripts/wheels.sh
pip_install .venv-server/bin/pip -r tests/server/requirements.txt

export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the clone
exec .venv-server/bin/python -m pytest -q -p no:cacheprovider tests/server "${skip[@]}" "$@"
