#!/usr/bin/env bash
# Usage: utils/setup_env.sh [--tools | --check | --python | --help]
# Summary: Create or refresh the project's Python venv from requirements.lock, with jobkit installed editable
#
# Finds a Python >= 3.12 (PYTHON=<path> wins), creates ${VENV_DIR:-<repo>/.venv} and installs the pinned
# set in requirements.lock (no dependency resolution: the lock is complete), then the `jobkit` package from
# py/ in editable mode, which puts the `jobkit` command in the venv. It installs with uv, which it first
# bootstraps from PyPI into <repo>/.cache/uv/ (or takes from PATH); where uv cannot be had it falls back to
# pip. A stamp records what was installed, so a second run with nothing changed returns at once. Inside an
# image that already provides MaxText (set SKIP_VENV=1, or MaxText importable by the system python) nothing
# is created.
#
# Bytecode: the packages are installed as source, then the modules a first job imports (the list in
# configs/first_job_modules.txt, recorded by utils/first_job_modules.py) are compiled before the venv is
# called ready, and the rest of the venv (~3/4 of its ~17,000 modules) in the background at nice 19, logged
# to <venv>/.bytecode.log; <venv>/.bytecode-complete marks its end, and a later run resumes one that was cut
# off. Compiling everything first took ~50 s of a 2-core machine's first run.
#
#   --tools    the light set for hosts that only read jobs (login nodes, container hosts where training
#              runs in an image): jobkit with click, pyyaml, numpy, prometheus-client, tensorboard, at the
#              lock's versions, without MaxText, JAX or Ray (~1/10 of the size). A full venv serves too.
#   --check    exit 0 if the venv is up to date, 1 if it would be (re)built; changes nothing
#   --python   print the interpreter that would be used, and exit
#
#   PYTHON=<path>     interpreter to build the venv with
#   SETUP_USE_PIP=1   skip uv and install with pip
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

_PROG=setup_env.sh
_REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_LOCK_FILE=$_REPO_DIR/requirements.lock
_VENV_DIR=${VENV_DIR:-$_REPO_DIR/.venv}
_STAMP=$_VENV_DIR/.lock-stamp
_PYPROJECT=$_REPO_DIR/py/pyproject.toml
_UV_VERSION=0.13.9
# What a venv built by this script holds beyond the lock's packages; part of the stamp, so that a venv built
# before a change here is refreshed once. "bytecode": every module compiled at install (see _compile_bytecode).
_LAYOUT=bytecode-first-job
_UV_HOME=$_REPO_DIR/.cache/uv
_FIRST_MODULES=$_REPO_DIR/configs/first_job_modules.txt
_COMPLETE=$_VENV_DIR/.bytecode-complete
# uv ships its own root certificates; sites that reach PyPI through a proxy with its own CA put that CA in the
# system store, which pip uses. Make uv trust the same store.
export UV_SYSTEM_CERTS=${UV_SYSTEM_CERTS:-1}

_die() { echo "$_PROG: $*" >&2; exit 1; }
_say() { echo "[setup_env] $*" >&2; }

_usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

# True when "$1" is a Python >= 3.12 with a working venv module. Its exit status alone proves nothing (any
# program that exits 0, /bin/true, would pass): it must compute a number chosen here and print it with its
# version, which only a Python that ran the code can.
_python_ok() {
  local nonce=$((RANDOM * 32768 + RANDOM)) out
  out=$("$1" -c "import sys, venv, ensurepip; print($nonce * 7, *sys.version_info[:2])" 2>/dev/null) || return 1
  [[ $out =~ ^$((nonce * 7))\ ([0-9]+)\ ([0-9]+)$ ]] || return 1
  (( BASH_REMATCH[1] > 3 || (BASH_REMATCH[1] == 3 && BASH_REMATCH[2] >= 12) ))
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

# The stamp is "<set> <digest>": the digest covers the lock, jobkit's pyproject and the interpreter's version
# (not its path, which has many spellings). A full set also serves a --tools request.
_digest() { { sha256sum "$_LOCK_FILE" "$_PYPROJECT" | cut -d' ' -f1; "$1" -V 2>&1; echo "$_LAYOUT"; } | sha256sum | cut -d' ' -f1; }

_up_to_date() {
  local want=$1 digest=$2 have
  [[ -f $_STAMP && -x $_VENV_DIR/bin/python ]] || return 1
  have=$(<"$_STAMP")
  [[ $have == "full $digest" || $have == "$want $digest" ]]
}

# Prints a working uv: one on PATH, else ours under .cache/uv, else one bootstrapped there now from PyPI with
# the interpreter's own pip. Returns 1 (and says why) when none can be had; the caller then uses pip.
_find_uv() {
  local python=$1
  if command -v uv >/dev/null 2>&1 && uv --version >/dev/null 2>&1; then command -v uv; return 0; fi
  if [[ -x $_UV_HOME/bin/uv ]] && "$_UV_HOME/bin/uv" --version >/dev/null 2>&1; then echo "$_UV_HOME/bin/uv"; return 0; fi
  _say "bootstrapping uv $_UV_VERSION into $_UV_HOME"
  if "$python" -m pip install --quiet --disable-pip-version-check --no-input --target "$_UV_HOME.tmp" \
      "uv==$_UV_VERSION" >/dev/null 2>&1 && [[ -x $_UV_HOME.tmp/bin/uv ]]; then
    rm -rf "$_UV_HOME" && mv "$_UV_HOME.tmp" "$_UV_HOME"   # a half-made bootstrap is never taken for a good one
    echo "$_UV_HOME/bin/uv"; return 0
  fi
  rm -rf "$_UV_HOME.tmp"
  _say "could not bootstrap uv (no pip for $python, or PyPI unreachable); installing with pip instead"
  return 1
}

# The tools set: jobkit's own dependencies, resolved against the lock so they match a full venv.
_install_with_uv() {
  local uv=$1 python=$2 set=$3
  if [[ ! -x $_VENV_DIR/bin/python ]]; then
    _say "creating $_VENV_DIR with $python ($("$python" -V 2>&1))"
    "$uv" venv --quiet --python "$python" "$_VENV_DIR" || _die "uv could not create a venv with $python; set PYTHON to another interpreter"
  fi
  # No --compile-bytecode: _compile_bytecode compiles what a first job needs first, the rest in the
  # background. On a terminal uv shows its own progress; elsewhere (a log) it stays quiet.
  local -a install=("$uv" pip install --python "$_VENV_DIR/bin/python")
  [[ -t 2 ]] || install+=(--quiet)
  if [[ $set == full ]]; then
    _say "installing $(grep -c '==' "$_LOCK_FILE") pinned packages with uv"
    "${install[@]}" --no-deps -r "$_LOCK_FILE" || _die "uv pip install from requirements.lock failed (see above); check network access to PyPI and rerun"
    "${install[@]}" --no-deps -e "$_REPO_DIR/py" || _die "installing jobkit from py/ failed (see above)"
  else
    _say "installing jobkit and its tools with uv (constrained by requirements.lock)"
    "${install[@]}" -c "$_LOCK_FILE" -e "$_REPO_DIR/py" || _die "uv could not install jobkit's tools (see above); check network access to PyPI and rerun"
  fi
}

_install_with_pip() {
  local python=$1 set=$2
  if [[ ! -x $_VENV_DIR/bin/python ]]; then
    _say "creating $_VENV_DIR with $python ($("$python" -V 2>&1))"
    "$python" -m venv "$_VENV_DIR" || _die "could not create a venv with $python; install its venv module (e.g. apt install python3.12-venv)"
  fi
  local -a pip=("$_VENV_DIR/bin/python" -m pip install --quiet --no-compile --disable-pip-version-check --no-input)
  # Some machines' pip config names local wheel folders that do not exist; pip warns once per package.
  local filter="^WARNING: Location 'file:"
  if [[ $set == full ]]; then
    _say "installing $(grep -c '==' "$_LOCK_FILE") pinned packages with pip (a first install takes ~2 min)"
    "${pip[@]}" --no-deps -r "$_LOCK_FILE" 2>&1 | { grep -v "$filter" || true; } >&2
    ((PIPESTATUS[0] == 0)) || _die "pip install from requirements.lock failed (see above); check network access to PyPI and rerun"
    "${pip[@]}" --no-deps --no-build-isolation -e "$_REPO_DIR/py" 2>&1 | { grep -v "$filter" || true; } >&2
    ((PIPESTATUS[0] == 0)) || _die "installing jobkit from py/ failed (see above)"
  else
    _say "installing jobkit and its tools with pip (constrained by requirements.lock)"
    "${pip[@]}" -c "$_LOCK_FILE" -e "$_REPO_DIR/py" 2>&1 | { grep -v "$filter" || true; } >&2
    ((PIPESTATUS[0] == 0)) || _die "pip could not install jobkit's tools (see above); check network access to PyPI and rerun"
  fi
}

# Python writes a module's bytecode on its first import only where it may: not under
# PYTHONDONTWRITEBYTECODE, nor in a read-only or another user's venv. Without it every process compiles every
# module it imports, every time: `import ray` takes 1.4 s instead of 0.6 s on a 2-core VM, a RAY=1 node starts
# about six Python processes that import Ray, and training's imports take twice as long.
_site_packages() { local d; for d in "$_VENV_DIR"/lib/python3*/site-packages; do [[ -d $d ]] && echo "$d"; done | tail -n 1; }

# _compile_bytecode SET: jobkit's own modules (installed editable, so no installer compiles them), then for a
# tools venv everything (it is small), for a full one the first job's modules now, split over the cores, and
# the rest in the background (_compile_rest). A checkout this user may not write still gets its venv.
_compile_bytecode() {
  local set=$1 site start=$SECONDS
  "$_VENV_DIR/bin/python" -m compileall -q "$_REPO_DIR/py/jobkit" >/dev/null 2>&1 ||
    _say "could not write bytecode under $_REPO_DIR/py/jobkit (read-only?): jobkit's modules are compiled at each start"
  site=$(_site_packages)
  [[ -n $site ]] || return 0
  if [[ $set == tools ]]; then
    "$_VENV_DIR/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1 && : >"$_COMPLETE"
    return 0
  fi
  if [[ ! -f $_FIRST_MODULES ]]; then
    _say "no $_FIRST_MODULES (restore it from git): the first job compiles its modules as it imports them"
    _compile_rest "$site"
    return 0
  fi
  local shards tmp i count
  shards=$(nproc 2>/dev/null || echo 2)
  tmp=$(mktemp -d)
  # Only the listed modules this lock installed (a list recorded against another lock may name more).
  (cd "$site" && while IFS= read -r rel; do [[ -f $rel ]] && echo "$rel"; done <"$_FIRST_MODULES") >"$tmp/all"
  count=$(wc -l <"$tmp/all")
  _say "compiling the $count modules a first job imports ($shards processes)"
  split -n "r/$shards" "$tmp/all" "$tmp/shard."
  for i in "$tmp"/shard.*; do
    (cd "$site" && "$_VENV_DIR/bin/python" -m compileall -q -i "$i" >/dev/null 2>&1) &
  done
  wait
  rm -rf "$tmp"
  _say "compiled in $((SECONDS - start)) s"
  _compile_rest "$site"
}

# _compile_rest SITE: compiles the rest of the venv in the background at the lowest priority, once at a time
# (the flock), in a session of its own so a Ctrl-C of the job that set the venv up does not stop it; then
# marks the venv complete. compileall skips the modules already compiled, so a resumed run costs only what is
# left. It inherits no descriptor of ours (fd 9 is the install lock).
_compile_rest() {
  local site=$1 log=$_VENV_DIR/.bytecode.log
  [[ -e $_COMPLETE ]] && return 0
  command -v setsid >/dev/null 2>&1 || { _say "no setsid: the rest of the venv is compiled at first import"; return 0; }
  # shellcheck disable=SC2016  # the inner shell expands its own arguments
  setsid flock -n "$_VENV_DIR/.bytecode.lock" sh -c 'nice -n 19 "$1" -m compileall -q -j 0 "$2" && : >"$3"' \
    compile-rest "$_VENV_DIR/bin/python" "$site" "$_COMPLETE" >"$log" 2>&1 </dev/null 9>&- &
  _say "compiling the rest of the venv in the background (pid $!, nice 19; log $log)"
}

# MaxText importable by a python3 that is not itself a venv's means we are inside a training image.
_image_has_maxtext() {
  local py
  py=$(command -v python3 || true)
  [[ -n $py ]] && "$py" -c '
import importlib.util as u, sys
in_venv = sys.prefix != sys.base_prefix
sys.exit(0 if not in_venv and (u.find_spec("MaxText") or u.find_spec("maxtext")) else 1)' 2>/dev/null
}

# Prints where the venv's jobkit was installed editable from (PEP 610's direct_url.json), or nothing.
_venv_jobkit_source() {
  local record url
  for record in "$_VENV_DIR"/lib/python3*/site-packages/jobkit-*.dist-info/direct_url.json; do
    [[ -f $record ]] || continue
    url=$(head -c 4096 "$record")
    [[ $url == *'"url":"file://'* ]] || continue
    url=${url#*\"url\":\"file://}
    printf '%s\n' "${url%%\"*}"
    return 0
  done
}

main() {
  local set=full check=0
  case "${1:-}" in
    -h|--help) _usage; exit 0 ;;
    --python) _find_python; exit 0 ;;
    --check) check=1 ;;
    --tools) set=tools ;;
    "") ;;
    *) _die "unknown option '$1' (see --help)" ;;
  esac
  [[ -f $_LOCK_FILE ]] || _die "missing $_LOCK_FILE; restore it from git"

  if [[ $set == full && ! -d $_VENV_DIR ]] && { [[ ${SKIP_VENV:-0} == 1 ]] || _image_has_maxtext; }; then
    _say "MaxText is provided by this environment; no venv needed"
    exit 0
  fi

  local python digest
  if [[ -x $_VENV_DIR/bin/python ]]; then
    python=$_VENV_DIR/bin/python
  else
    python=$(_find_python)
  fi
  digest=$(_digest "$python")
  if _up_to_date "$set" "$digest"; then
    # A background compile that was cut off (a reboot, a kill) is resumed; one still running holds its lock.
    if ((!check)) && [[ ! -e $_COMPLETE ]] && flock -n "$_VENV_DIR/.bytecode.lock" true 2>/dev/null; then
      _compile_rest "$(_site_packages)"
    fi
    exit 0
  fi
  ((check)) && exit 1
  # A venv serves the checkout whose py/ it holds editable: installing this one's into it would move every
  # user of that venv's jobkit onto this checkout's code without a word.
  local source
  source=$(_venv_jobkit_source)
  if [[ -n $source && $(realpath -m "$source") != "$(realpath -m "$_REPO_DIR/py")" ]]; then
    _die "$_VENV_DIR holds jobkit from another checkout ($source); run that checkout's utils/setup_env.sh, or set VENV_DIR to a venv of this checkout's own"
  fi

  mkdir -p "$(dirname "$_VENV_DIR")"
  # Two launches on a fresh checkout must not install into the same venv at once.
  exec 9>"$_VENV_DIR.lock"
  flock 9
  if _up_to_date "$set" "$digest"; then exit 0; fi

  local start=$SECONDS uv base_python=$python
  # A venv's python cannot bootstrap uv when the venv was made by uv (it has no pip): use the base interpreter.
  [[ $python == "$_VENV_DIR/bin/python" ]] && base_python=$("$python" -c 'import sys; print(sys._base_executable)')
  if [[ ${SETUP_USE_PIP:-0} != 1 ]] && uv=$(_find_uv "$base_python"); then
    _install_with_uv "$uv" "$python" "$set"
  else
    _install_with_pip "$python" "$set"
  fi
  _say "installed in $((SECONDS - start)) s"
  rm -f "$_COMPLETE"
  _compile_bytecode "$set"
  echo "$set $digest" >"$_STAMP"
  _say "ready in $((SECONDS - start)) s: $_VENV_DIR ($set, $(du -sh "$_VENV_DIR" 2>/dev/null | cut -f1))"
}

main "$@"
