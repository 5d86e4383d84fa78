#!/usr/bin/env bash
# Installs this build into a scratch prefix, then configures and builds examples/embed as a separate
# CMake project with find_package(specdec), and runs it.
# Usage: test_find_package.sh BUILD_DIR EMBED_SOURCE_DIR WORK_DIR [EXTRA_PREFIX_PATH]
set -euo pipefail
build=$1 src=$2 work=$3 extra=${4:-}
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
# An application that asks for C++14 (libtorch 1.13's own target does): specdec::specdec raises it
# to the C++17 its headers need.
cmake -S "$src" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix;$extra" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_STANDARD=14 > "$work/configure.log"
cmake --build "$work/build" -j2 > "$work/build.log"
"$build/specdec" make-fixture --out "$work/model" --layers 1 --hidden 32 --heads 2 --vocab 64 2>/dev/null
out=$("$work/build/embed" "$work/model")
echo "$out"
grep -q "generated 8 tokens" <<<"$out"

# With a SentencePiece tokenizer: the installed program finds the installed SentencePiece shim
# (prefix/lib, beside prefix/bin) and runs it next to libtorch.
for i in $(seq 200); do echo "hello world, the draft proposes and the target verifies $i times"; done > "$work/corpus.txt"
"$build/specdec" make-tokenizer --input "$work/corpus.txt" --out "$work/tok" --vocab-size 400 2>/dev/null
"$build/specdec" make-fixture --out "$work/model_tok" --layers 1 --hidden 32 --heads 2 --tokenizer "$work/tok" 2>/dev/null
test -f "$work/prefix/lib/libspecdec_spm.so" || test -n "$(find "$work/prefix" -name libspecdec_spm.so)"
# A program built anywhere finds the shim on the run path that find_package(specdec) gives it.
shim_dir=$(dirname "$(find "$work/prefix" -name libspecdec_spm.so | head -1)")
readelf -d "$work/build/embed" | grep -E 'R(UN)?PATH' | grep -qF "$shim_dir"
# ... the install's copy, not the build tree's (which the library also knows of).
loaded=$(env -u SPECDEC_SPM_LIBRARY LD_DEBUG=files "$work/build/embed" "$work/model_tok" 2>&1 >/dev/null |
  grep -o 'calling init: [^ ]*libspecdec_spm.so' | head -1)
[ "$loaded" = "calling init: $shim_dir/libspecdec_spm.so" ] ||
  { echo "the shim loaded was '${loaded#calling init: }', not $shim_dir's" >&2; exit 1; }
# A module of another interface version first on the loader's path (a stale install) is passed over.
mkdir -p "$work/stale" && echo 'int specdec_spm_interface(void) { return 0; }' > "$work/stale/v.c"
cc -shared -fPIC -o "$work/stale/libspecdec_spm.so" "$work/stale/v.c"
out=$(env -u SPECDEC_SPM_LIBRARY LD_LIBRARY_PATH="$work/stale" "$work/build/embed" "$work/model_tok")
grep -q "generated 8 tokens" <<<"$out"
mkdir -p "$work/prefix/bin" && cp "$work/build/embed" "$work/prefix/bin/embed"
out=$(env -u SPECDEC_SPM_LIBRARY "$work/prefix/bin/embed" "$work/model_tok")
echo "$out"
grep -q "^prompt ids: 1 " <<<"$out"  # BOS, then the pieces of "Hello"
grep -q "generated 8 tokens" <<<"$out"
