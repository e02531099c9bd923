#!/usr/bin/env bash
# Usage: bench/launch_overhead.sh [ROUNDS] [-- maxtext key=value ...]
# Summary: What the launcher costs: run_local.sh tiny vs the same MaxText training started directly
#
# Runs the two alternately (ROUNDS pairs, default 3) on a warm JAX compile cache, so machine noise hits
# both alike, and prints a table of wall seconds and the per-round ratio. Not part of CI.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-} in -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;; esac
ROUNDS=${1:-3}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "launch_overhead.sh: ROUNDS must be a positive number, got '$ROUNDS'" >&2; exit 2; }
shift || true
[[ ${1:-} == -- ]] && shift
EXTRA=("$@")

"$REPO_DIR/utils/setup_env.sh"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export JAX_CACHE_DIR=$WORK/jax_cache JOB_WORKSPACE=$WORK/ws CONTAINER_RUNTIME=none

_direct() {
  JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=1 \
    "$REPO_DIR/.venv/bin/python" -m maxtext.trainers.pre_train.train "$REPO_DIR/configs/tiny.yml" \
    "base_output_directory=$WORK/direct" "jax_cache_dir=$JAX_CACHE_DIR" "${EXTRA[@]}" >"$WORK/direct.log" 2>&1
}
_launcher() { "$REPO_DIR/run_local.sh" tiny -- "${EXTRA[@]}" >"$WORK/launcher.log" 2>&1; }

_seconds() { local t0; t0=$(date +%s.%N); "$@"; awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }'; }

_direct   # warm the compile cache so neither side pays for the first compile
printf '%-6s %12s %12s %8s\n' round "direct (s)" "launcher (s)" ratio
for ((i = 1; i <= ROUNDS; i++)); do
  d=$(_seconds _direct)
  l=$(_seconds _launcher)
  printf '%-6s %12.2f %12.2f %8.2f\n' "$i" "$d" "$l" "$(awk -v l="$l" -v d="$d" 'BEGIN { print l / d }')"
done
