#!/usr/bin/env bash
# Usage: bench/sweep_models.sh [LAYERS]
# Summary: The model sweep across two commits catches a deliberately slowed model config (tiny, --local)
#
# Clones this repo's HEAD into a temp dir and commits on top of it a configs/tiny.yml with LAYERS decoder
# layers (default 8, against tiny's 2): the same model, several times the work per token, so a lower TGS.
# Then runs, from the clone, `jobkit sweep models --local --only tiny --commits <HEAD> <slowed>`: each
# commit in a git worktree of its own, tiny at 1 node from each (--local runs 1-node entries only), and
# prints the sweep's side-by-side table; it should flag tiny 1N as a REGRESSION. This checkout is only
# read (the clone is made from its HEAD and shares its venv). The two jobs take about a minute; it refuses
# to start while other training runs here (it would skew the TGS, and a local Slurm job's preflight
# stops `run_local.sh` training it does not know). Not part of CI.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-} in -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;; esac
LAYERS=${1:-8}
if [[ ! $LAYERS =~ ^[0-9]+$ ]] || ((LAYERS < 3)); then
  echo "sweep_models.sh: LAYERS must be a number >= 3 (tiny has 2), got '$LAYERS'" >&2
  exit 2
fi

if others=$(pgrep -f 'jobkit launch' | tr '\n' ' ') && [[ -n $others ]]; then
  echo "sweep_models.sh: training already runs on this machine (PIDs $others); rerun when it is quiet" >&2
  exit 2
fi

"$REPO_DIR/utils/setup_env.sh"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# The clone's jobs share this checkout's venv (same requirements.lock, so setup_env.sh finds it current).
export VENV_DIR=$REPO_DIR/.venv JOB_WORKSPACE=$WORK/ws JAX_CACHE_DIR=$WORK/jax_cache CONTAINER_RUNTIME=none

# 1. a clone with one more commit: tiny slowed down
CLONE=$WORK/repo
git clone --quiet --no-hardlinks "$REPO_DIR" "$CLONE"
git -C "$CLONE" config user.email bench@example.invalid
git -C "$CLONE" config user.name "sweep_models.sh"
BASE=$(git -C "$CLONE" rev-parse HEAD)
sed -i "s/^base_num_decoder_layers: .*/base_num_decoder_layers: $LAYERS/" "$CLONE/configs/tiny.yml"
grep -q "^base_num_decoder_layers: $LAYERS\$" "$CLONE/configs/tiny.yml" ||
  { echo "sweep_models.sh: configs/tiny.yml has no base_num_decoder_layers line to change" >&2; exit 1; }
git -C "$CLONE" commit --quiet -am "bench: tiny with $LAYERS layers (deliberately slower)"
SLOW=$(git -C "$CLONE" rev-parse HEAD)
echo "baseline  ${BASE:0:10}  $(git -C "$CLONE" log -1 --format=%s "$BASE")"
echo "candidate ${SLOW:0:10}  $(git -C "$CLONE" log -1 --format=%s "$SLOW")"

# 2. the sweep, run by the clone's own jobkit so that its worktrees are made from the clone
rc=0
"$VENV_DIR/bin/python" "$CLONE/py/bin/jobkit" sweep models --local --only tiny --poll 2 --id bench-models \
  --commits "$BASE" "$SLOW" || rc=$?
summary=$JOB_WORKSPACE/sweeps/bench-models/summary.md
if [[ $rc -ne 0 || ! -f $summary ]]; then
  echo "sweep_models.sh: the sweep ended with exit $rc; job logs are in $JOB_WORKSPACE (removed on exit)" >&2
  exit 1
fi
leftover=$(git -C "$CLONE" worktree list | tail -n +2)
[[ -z $leftover ]] || { echo "sweep_models.sh: worktrees left behind: $leftover" >&2; exit 1; }
if grep -q '^| tiny .*REGRESSION' "$summary"; then
  echo "result: tiny 1N flagged as a REGRESSION on the slowed commit (worktrees removed)"
else
  echo "result: tiny 1N NOT flagged; see the table above" >&2
  exit 1
fi
