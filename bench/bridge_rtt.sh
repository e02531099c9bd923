#!/usr/bin/env bash
# Usage: bench/bridge_rtt.sh [ROUNDS]
# Summary: The host-command bridge's round trip: --ping, and a stub squeue direct vs through utils/host_cmd.py
#
# Starts `jobkit bridge serve` on a throwaway workspace with a stub `squeue` first on PATH, then times ROUNDS
# (default 20) calls of each: the stub directly, `host_cmd.py 'squeue'`, `host_cmd.py --ping`, and a bare
# `python3 -c pass` (the client's interpreter start, paid by any Python client). Prints the median and the
# slowest in milliseconds, and the bridge's added time (bridge squeue minus direct squeue; target < 200 ms).
# Not part of CI.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-} in -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;; esac
ROUNDS=${1:-20}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "bridge_rtt.sh: ROUNDS must be a positive number, got '$ROUNDS'" >&2; exit 2; }

PY=$REPO_DIR/.venv/bin/python
[[ -x $PY ]] || PY=python3
WORK=$(mktemp -d)
SERVER=""
_cleanup() {
  [[ -n $SERVER ]] && kill "$SERVER" 2>/dev/null && wait "$SERVER" 2>/dev/null
  rm -rf "$WORK"
}
trap _cleanup EXIT
mkdir -p "$WORK/ws" "$WORK/bin"
printf '#!/bin/sh\necho "123 tiny RUNNING"\n' >"$WORK/bin/squeue"
chmod +x "$WORK/bin/squeue"
export JOB_WORKSPACE=$WORK/ws BRIDGE_NODE=bench PATH=$WORK/bin:$PATH
"$PY" -m jobkit bridge serve 2>"$WORK/serve.log" &   # the venv's jobkit (PYTHONPATH, if set, picks another)
SERVER=$!
for _ in $(seq 100); do "$PY" "$REPO_DIR/utils/host_cmd.py" --ping >/dev/null 2>&1 && break; sleep 0.1; done
"$PY" "$REPO_DIR/utils/host_cmd.py" --ping >/dev/null || { cat "$WORK/serve.log" >&2; exit 1; }

# Milliseconds of one run of "$@" (output discarded).
_ms() {
  local t0 t1
  t0=$(date +%s%N)
  "$@" >/dev/null
  t1=$(date +%s%N)
  echo $(((t1 - t0) / 1000000))
}

# "median max" of ROUNDS runs of "$@".
_stats() {
  local i
  for ((i = 0; i < ROUNDS; i++)); do _ms "$@"; done | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)], v[NR] }'
}

read -r direct_med direct_max < <(_stats squeue)
read -r bridge_med bridge_max < <(_stats "$PY" "$REPO_DIR/utils/host_cmd.py" squeue)
read -r ping_med ping_max < <(_stats "$PY" "$REPO_DIR/utils/host_cmd.py" --ping)
read -r py_med py_max < <(_stats "$PY" -c pass)

printf '%-34s %10s %10s\n' "($ROUNDS rounds)" "median ms" "max ms"
printf '%-34s %10s %10s\n' "squeue (stub), direct" "$direct_med" "$direct_max"
printf '%-34s %10s %10s\n' "host_cmd.py squeue" "$bridge_med" "$bridge_max"
printf '%-34s %10s %10s\n' "host_cmd.py --ping" "$ping_med" "$ping_max"
printf '%-34s %10s %10s\n' "python3 -c pass (client start)" "$py_med" "$py_max"
added=$((bridge_med - direct_med))
printf 'added by the bridge (median): %d ms  (target < 200 ms: %s)\n' "$added" "$([[ $added -lt 200 ]] && echo met || echo MISSED)"
