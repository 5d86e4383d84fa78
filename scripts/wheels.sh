# Sourced by the scripts that make virtual environments: pip installs through a wheelhouse outside
# the clone (SPECDEC_WHEELS, default ~/.cache/specdec/wheels), so that a second venv, in this
# clone or a fresh one, installs from local files. pip's own HTTP cache is not enough: behind some
# proxies (this workplace's among them) it stores nothing, and every clean clone downloaded the
# 4 GB of torch 2.x wheels again.
wheelhouse=${SPECDEC_WHEELS:-$HOME/.cache/specdec/wheels}

# pip_install PIP REQUIREMENT...: from the wheelhouse when it holds everything they need, else
# downloaded into it first (dependencies included), then installed from it.
pip_install() {
  local pip=$1
  shift
  mkdir -p "$wheelhouse"
  "$pip" install -q --no-index --find-links "$wheelhouse" "$@" 2> /dev/null && return 0
  echo "pip: downloading $* into $wheelhouse"
  "$pip" download -q -d "$wheelhouse" "$@"
  "$pip" install -q --no-index --find-links "$wheelhouse" "$@"
}
