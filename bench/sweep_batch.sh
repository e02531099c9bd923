#!/usr/bin/env bash
# Usage: bench/sweep_batch.sh [LIMIT_MIB] [START]
# Summary: The batch sweep on tiny under a real memory limit: the optimum in a few runs, the ceiling a real OOM
#
# Runs `jobkit sweep batch tiny --local --start START --repeats 1` (default 256) with the whole sweep (the driver,
# run_local.sh and training) inside a cgroup v1 memory group limited to LIMIT_MIB (default 600): past
# the limit the kernel's OOM killer ends training, run_local.sh names it (`oom-kill` line), and the
# sweep must classify it as OOM, never retry it, and converge below it. Prints the sweep's table and
# the probes it needed. Needs root and a writable v1 memory cgroup. A few minutes; not part of CI.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-} in -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;; esac
LIMIT_MIB=${1:-600} START=${2:-256}
_die() { echo "sweep_batch.sh: $*" >&2; exit 2; }
[[ $LIMIT_MIB =~ ^[1-9][0-9]*$ ]] || _die "LIMIT_MIB must be a whole number of MiB, got '$LIMIT_MIB'"
[[ $START =~ ^[1-9][0-9]*$ ]] || _die "START must be a positive batch size, got '$START'"
((EUID == 0)) || _die "needs root (a memory cgroup)"
own=/sys/fs/cgroup/memory$(awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3 }' /proc/self/cgroup)
[[ -w $own ]] || _die "no writable v1 memory cgroup at $own"

"$REPO_DIR/utils/setup_env.sh"
WORK=$(mktemp -d)
GROUP=$own/sweep-batch-bench-$$
_cleanup() {
  local rc=$?
  # rmdir needs the group empty; the sweep and its jobs have ended by now.
  [[ -d $GROUP ]] && { rmdir "$GROUP" 2>/dev/null || echo "sweep_batch.sh: could not remove $GROUP" >&2; }
  rm -rf "$WORK"
  exit "$rc"
}
trap _cleanup EXIT
mkdir "$GROUP"
echo $((LIMIT_MIB << 20)) > "$GROUP/memory.limit_in_bytes"

export JOB_WORKSPACE=$WORK/ws JAX_CACHE_DIR=$WORK/jax_cache CONTAINER_RUNTIME=none VENV_DIR=$REPO_DIR/.venv
unset XLA_FLAGS JAX_PLATFORMS TUNE_PROFILE STAGE_TIMEOUTS VIRTUAL_ENV PYTHONPATH

echo "== jobkit sweep batch tiny --local --start $START, memory limit $LIMIT_MIB MiB"
# The subshell joins the group first, so everything it starts is inside the limit.
rc=0
(
  echo "$BASHPID" > "$GROUP/tasks"
  # On CPU --device-memory is the RAM a device may use (it bounds the probe): the cgroup's limit.
  exec "$VENV_DIR/bin/jobkit" sweep batch --id bench-batch --local --poll 2 --start "$START" --repeats 1 \
    --device-memory "$(awk -v mib="$LIMIT_MIB" 'BEGIN { printf "%.3f", mib / 1024 }')" tiny
) || rc=$?
echo "== probes: $(grep -c '"submitted"' "$JOB_WORKSPACE/sweeps/bench-batch/points.jsonl") jobs;" \
  "OOM kills seen by the kernel: $(awk '$1 == "oom_kill" { print $2 }' "$GROUP/memory.oom_control")"
exit "$rc"
