# Sourced by the peer benchmarks: the llama.cpp source they build for measurement only, from
# PyPI's llama-cpp-python source distribution, unpacked once under bench-peers/ (git-ignored;
# none of its code enters specdec). Sets peers, version and src (the llama.cpp tree).
peers=bench-peers
version=0.3.36
src="$peers/llama_cpp_python-$version/vendor/llama.cpp"
mkdir -p "$peers"
if [ ! -d "$src" ]; then
  [ -x .venv/bin/pip ] || python3 -m venv .venv
  .venv/bin/pip download "llama-cpp-python==$version" --no-deps --no-binary :all: -d "$peers" -q
  tar xzf "$peers/llama_cpp_python-$version.tar.gz" -C "$peers"
fi
