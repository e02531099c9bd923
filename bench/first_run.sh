#!/usr/bin/env bash
# Usage: bench/first_run.sh [--rounds N] [REV ...]
# Summary: A newcomer's first run, timed by phase: fresh clone, empty caches, `./run_local.sh tiny` to its PASS line
#
# For each REV (default: HEAD; give an older one beside it to compare, e.g. `bench/first_run.sh 5c18e36 HEAD`),
# N rounds (default 1) interleaved: clones the checkout into a scratch directory, gives it empty caches (uv's,
# pip's, the JAX compile cache: XDG_CACHE_HOME and the workspace are new), and runs `./run_local.sh tiny` there.
# Prints one row per run: the seconds from the start at which each phase ended (uv bootstrapped, packages
# installed, the first job's modules compiled, venv ready, training's first step, the PASS line) and the total.
# A dash is a phase that revision does not have. Needs PyPI (the first install downloads ~1.6 GB unless a
# proxy caches it). Each run's stamped output is kept as first-run-<rev>-<round>.log in the scratch directory
# it prints; the clones are removed. Not part of CI.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-} in -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;; esac
rounds=1
if [[ ${1:-} == --rounds ]]; then
  [[ ${2:-} =~ ^[1-9][0-9]?$ ]] || { echo "first_run.sh: --rounds takes a whole number 1-99" >&2; exit 2; }
  rounds=$2; shift 2
fi
(($#)) || set -- HEAD
for rev; do
  git -C "$REPO_DIR" rev-parse --verify --quiet "$rev^{commit}" >/dev/null ||
    { echo "first_run.sh: '$rev' is not a commit of $REPO_DIR; name one (git log --oneline)" >&2; exit 2; }
done

scratch=$(mktemp -d "${TMPDIR:-/tmp}/first-run.XXXXXX")
echo "scratch (logs): $scratch"
printf '%-14s %7s %7s %7s %7s %7s %7s %7s\n' run uv install compile ready step0 PASS total
for ((round = 1; round <= rounds; round++)); do
  for rev in "$@"; do
    short=$(git -C "$REPO_DIR" rev-parse --short "$rev")
    clone=$scratch/clone-$short
    git clone --quiet --no-hardlinks "$REPO_DIR" "$clone"
    git -C "$clone" checkout --quiet "$short"
    mkdir -p "$scratch/cache-$short"
    # Empty caches: nothing downloaded or compiled before. PYTHON stays the caller's choice.
    (cd "$clone" && env -u VIRTUAL_ENV -u VENV_DIR -u UV_CACHE_DIR -u JAX_CACHE_DIR -u JOB_WORKSPACE \
      XDG_CACHE_HOME="$scratch/cache-$short" FIRST_RUN_LOG="$scratch/first-run-$short-$round.log" \
      "$REPO_DIR/bench/first_run_phases.py" "$short#$round" ./run_local.sh tiny) || true
    # The venv's background compile (setup_env.sh) may still run: let it end before the clone goes.
    flock "$clone/.venv/.bytecode.lock" true 2>/dev/null || true
    rm -rf "$clone" "$scratch/cache-$short"
  done
done
