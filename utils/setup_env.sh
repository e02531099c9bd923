#!/usr/bin/env bash
# Usage: utils/setup_env.sh [--check | --python | --help]
# Summary: Create or refresh the project's Python venv from requirements.lock
#
# Finds a Python >= 3.12 (PYTHON=<path> wins), creates ${VENV_DIR:-<repo>/.venv} and installs the pinned
# set in requirements.lock with `pip install --no-deps`. A stamp records the lock's checksum and the
# interpreter, so a second run with an unchanged lock returns at once. Inside an image that already
# provides MaxText (set SKIP_VENV=1, or MaxText importable by the system python) nothing is created.
#
#   --check    exit 0 if the venv is up to date, 1 if it would be (re)built; changes nothing
#   --python   print the interpreter that would be used, and exit
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

_PROG=setup_env.sh
_REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_LOCK_FILE=$_REPO_DIR/requirements.lock
_VENV_DIR=${VENV_DIR:-$_REPO_DIR/.venv}
_STAMP=$_VENV_DIR/.lock-stamp

_die() { echo "$_PROG: $*" >&2; exit 1; }
_say() { echo "[setup_env] $*" >&2; }

_usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

# True when "$1" runs and reports version >= 3.12 with a working venv module.
_python_ok() {
  "$1" -c 'import sys, venv, ensurepip; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1
}

# Prints the first usable interpreter. pyenv shims exist even when the version is not active (they then
# fail), so every candidate is run, not just looked up.
_find_python() {
  local candidate
  if [[ -n ${PYTHON:-} ]]; then
    _python_ok "$PYTHON" || _die "PYTHON=$PYTHON is not a working Python >= 3.12 with venv; point PYTHON at one"
    echo "$PYTHON"; return
  fi
  local -a candidates=(python3.12 python3.13 python3.14 python3 python)
  local pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
  for candidate in "$pyenv_root"/versions/3.1[2-9]*/bin/python3 /usr/local/bin/python3.1[2-9] /usr/bin/python3.1[2-9]; do
    [[ -x $candidate ]] && candidates+=("$candidate")
  done
  for candidate in "${candidates[@]}"; do
    if command -v "$candidate" >/dev/null 2>&1 && _python_ok "$candidate"; then
      command -v "$candidate"; return
    fi
  done
  _die "no Python >= 3.12 found (tried ${candidates[*]}); install one (e.g. pyenv install 3.12, apt install python3.12-venv) or set PYTHON=/path/to/python3.12"
}

# The stamp covers the lock's content and the interpreter's version (not its path, which has many spellings).
_lock_digest() { { sha256sum "$_LOCK_FILE" | cut -d' ' -f1; "$1" -V 2>&1; } | sha256sum | cut -d' ' -f1; }

_up_to_date() { [[ -f $_STAMP && -x $_VENV_DIR/bin/python && $(<"$_STAMP") == "$1" ]]; }

# MaxText importable by a python3 that is not itself a venv's means we are inside a training image.
_image_has_maxtext() {
  local py
  py=$(command -v python3 || true)
  [[ -n $py ]] && "$py" -c '
import importlib.util as u, sys
in_venv = sys.prefix != sys.base_prefix
sys.exit(0 if not in_venv and (u.find_spec("MaxText") or u.find_spec("maxtext")) else 1)' 2>/dev/null
}

main() {
  case "${1:-}" in
    -h|--help) _usage; exit 0 ;;
    --python) _find_python; exit 0 ;;
    --check|"") ;;
    *) _die "unknown option '$1' (see --help)" ;;
  esac
  [[ -f $_LOCK_FILE ]] || _die "missing $_LOCK_FILE; restore it from git"

  if [[ ! -d $_VENV_DIR ]] && { [[ ${SKIP_VENV:-0} == 1 ]] || _image_has_maxtext; }; then
    _say "MaxText is provided by this environment; no venv needed"
    exit 0
  fi

  local python digest
  if [[ -x $_VENV_DIR/bin/python ]]; then
    python=$_VENV_DIR/bin/python
  else
    python=$(_find_python)
  fi
  digest=$(_lock_digest "$python")
  if _up_to_date "$digest"; then exit 0; fi
  [[ ${1:-} == --check ]] && exit 1

  mkdir -p "$(dirname "$_VENV_DIR")"
  # Two launches on a fresh checkout must not install into the same venv at once.
  exec 9>"$_VENV_DIR.lock"
  flock 9
  if _up_to_date "$digest"; then exit 0; fi

  local start=$SECONDS
  if [[ ! -x $_VENV_DIR/bin/python ]]; then
    _say "creating $_VENV_DIR with $python ($("$python" -V 2>&1))"
    "$python" -m venv "$_VENV_DIR" || _die "could not create a venv with $python; install its venv module (e.g. apt install python3.12-venv)"
  fi
  _say "installing $(grep -c '==' "$_LOCK_FILE") pinned packages (a first install takes ~2 min)"
  # Some machines' pip config names local wheel folders that do not exist; pip warns once per package.
  if ! "$_VENV_DIR/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-input \
      -r "$_LOCK_FILE" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; } >&2; then
    _die "pip install from requirements.lock failed (see above); check network access to PyPI and rerun"
  fi
  echo "$digest" >"$_STAMP"
  _say "ready in $((SECONDS - start)) s: $_VENV_DIR"
}

main "$@"
