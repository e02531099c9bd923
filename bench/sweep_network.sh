#!/usr/bin/env bash
# Usage: bench/sweep_network.sh [NODE] [RATE] [TOLERANCE]
# Summary: The network sweep names the node whose link is rate-limited (4-node local cluster, tiny)
#
# On a 4-node utils/local_cluster.sh (started here when none is up, left alone when one is up with 4 idle
# nodes; refused when it is up with another size):
#   1. `jobkit sweep nodes tiny` (--serial: the nodes share this machine's cores): each node alone.
#   2. one unthrottled all-node job (a network sweep that passes at once) measures what 4 healthy nodes
#      together make: the expected TGS. A 1-node job is no yardstick here: 4 processes on one machine run
#      far slower per device than one.
#   3. node NODE's link (default 3) is rate-limited to RATE (default 20mbit: a 2-node tiny job loses
#      75-80 % of its TGS with one direction limited) in both directions with tc tbf (the host's veth
#      mxlc-vnNODE and eth0 inside its namespace);
#   4. `jobkit sweep network tiny --baseline <2.> --from-sweep <1.> --tolerance TOLERANCE` (default 30:
#      jobs sharing two cores are noisy, the throttle is not subtle) bisects to it;
# then prints the tables, removes the qdiscs, and stops the cluster if it started it. Needs root. Takes
# about 10 minutes. Refuses to start while any other training runs on this machine: it would skew every
# timing, and a Slurm job's preflight stops `run_local.sh` training it does not know. Not part of CI.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-} in -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;; esac
NODE=${1:-3} RATE=${2:-20mbit} TOLERANCE=${3:-30}
_die() { echo "sweep_network.sh: $*" >&2; exit 2; }
[[ $NODE =~ ^[1-4]$ ]] || _die "NODE must be 1..4 (one of the 4 nodes), got '$NODE'"
[[ $RATE =~ ^[0-9]+(kbit|mbit)$ ]] || _die "RATE must be a tc rate like 1mbit or 500kbit, got '$RATE'"
if [[ ! $TOLERANCE =~ ^[0-9]+$ ]] || ((TOLERANCE < 1 || TOLERANCE > 99)); then
  _die "TOLERANCE must be 1..99 (percent), got '$TOLERANCE'"
fi
((EUID == 0)) || _die "needs root (network namespaces, tc)"
if others=$(pgrep -f 'jobkit launch' | tr '\n' ' ') && [[ -n $others ]]; then
  _die "training already runs on this machine (PIDs $others); rerun when it is quiet"
fi

"$REPO_DIR/utils/setup_env.sh"
CLUSTER=$REPO_DIR/utils/local_cluster.sh
VETH=mxlc-vn$NODE NETNS=mxlc-node$NODE
WORK=$(mktemp -d)
started=0 shaped_host=0 shaped_ns=0

_cleanup() {
  local rc=$?
  # What this script changed, in reverse: the throttle, then the cluster it started.
  if ((shaped_ns)) && ! tc -n "$NETNS" qdisc del dev eth0 root; then
    echo "sweep_network.sh: could not remove the qdisc on eth0 in $NETNS" >&2
  fi
  if ((shaped_host)) && ! tc qdisc del dev "$VETH" root; then
    echo "sweep_network.sh: could not remove the qdisc on $VETH" >&2
  fi
  if ((started)); then "$CLUSTER" down >/dev/null 2>&1 || echo "sweep_network.sh: utils/local_cluster.sh down failed" >&2; fi
  rm -rf "$WORK"
  exit "$rc"
}
trap _cleanup EXIT

# 1. a 4-node cluster: ours, or an idle one that is already up
if "$CLUSTER" status >/dev/null 2>&1; then
  eval "$("$CLUSTER" env)"
  nodes=$(sinfo -h -N -o '%N' | sort -u | wc -l)
  ((nodes == 4)) || _die "the local cluster is up with $nodes nodes; this bench needs 4 and leaves a running cluster alone (utils/local_cluster.sh down, then rerun)"
  [[ -z $(squeue -h -o '%i') ]] || _die "the local cluster has jobs in its queue; they would skew every timing here: rerun when it is idle"
  if tc qdisc show dev "$VETH" | grep -q tbf; then
    _die "$VETH already has a tbf qdisc (someone else's experiment?); rerun when it is gone"
  fi
else
  eval "$("$CLUSTER" up -N 4)"
  started=1
fi

export JOB_WORKSPACE=$WORK/ws JAX_CACHE_DIR=$WORK/jax_cache CONTAINER_RUNTIME=none VENV_DIR=$REPO_DIR/.venv
unset XLA_FLAGS JAX_PLATFORMS TUNE_PROFILE STAGE_TIMEOUTS VIRTUAL_ENV PYTHONPATH
JOBKIT=$VENV_DIR/bin/jobkit
ALL='node[1-4]'

echo "== 1. node sweep (each node alone, unthrottled)"
"$JOBKIT" sweep nodes --id bench-nodes --serial --poll 2 tiny -w "$ALL"

echo "== 2. the 4 nodes together, unthrottled: the expected TGS"
"$JOBKIT" sweep network --id bench-reference --poll 2 tiny -w "$ALL" --baseline 1 >/dev/null
# The "all" row of the reference sweep's table: | all | node[1-4] | <job> | <TGS/device> | ...
EXPECTED=$(awk -F'|' '$2 ~ /^ *all *$/ { gsub(/[ ,]/, "", $5); print $5 }' \
  "$JOB_WORKSPACE/sweeps/bench-reference/summary.md")
[[ $EXPECTED =~ ^[0-9]+$ ]] || { echo "sweep_network.sh: the unthrottled 4-node job did not pass; see $JOB_WORKSPACE" >&2; exit 1; }
echo "4 healthy nodes together: $EXPECTED TGS/device"

echo "== 3. node$NODE's link limited to $RATE (tc tbf on $VETH and on eth0 in $NETNS)"
tc qdisc add dev "$VETH" root tbf rate "$RATE" burst 32kbit latency 400ms
shaped_host=1
tc -n "$NETNS" qdisc add dev eth0 root tbf rate "$RATE" burst 32kbit latency 400ms
shaped_ns=1

echo "== 4. network sweep"
"$JOBKIT" sweep network --id bench-network --poll 2 tiny -w "$ALL" --baseline "$EXPECTED" \
  --from-sweep bench-nodes --tolerance "$TOLERANCE"

conclusion=$(grep '^Conclusion:' "$JOB_WORKSPACE/sweeps/bench-network/summary.md" || true)
if [[ $conclusion == *"node$NODE's network"* || $conclusion == "Conclusion: node$NODE:"* ]]; then
  echo "result: the sweep named node$NODE, the throttled one"
else
  echo "result: the sweep did NOT single out node$NODE (${conclusion:-no conclusion})" >&2
  exit 1
fi
