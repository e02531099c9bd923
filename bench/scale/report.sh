#!/usr/bin/env bash
# Usage: bench/scale/report.sh [--nodes 8,64,256,512] [--steps 1000] [--big-steps 4000] [--jobs 5000] [--day-steps 86400] [--before FILE]
# Summary: Prints the Scale table: time and peak memory of every per-job operation at 8 to 512 simulated nodes
#
# Simulates (bench/scale/simulate.py) the job log of N ranks x STEPS steps for each N, the largest point
# 512 x BIG_STEPS, hang stacks of N hosts and a workspace of JOBS jobs, times each operation on them
# (bench/scale/measure.py: the end-of-run verdict, tgs, why, jobs, tag, metrics-state --summary, analyze,
# compare, dashboard, a monitor poll (the first, and a steady one once caught up), a hang-watchdog look, the
# stacks collection; and analyze's TSDB part at 8 and 64 nodes x 1 h of TSDB, by the dump before and PromQL
# after, ~2 min) and prints one table (bench/scale/table.py) with the growth
# order and the model's prediction at 512 nodes x 24 h, or, for the log readers, their measurement on a
# 512 x DAY_STEPS log whose middle is a sparse hole (its ends and step summary are real; 0: none). Then the live scrape (bench/scale/scrape.py: the job's
# Prometheus scraping N loopback endpoints that serve a recorded 8-GPU node's exporter page, ~100 s per N, at 5 s
# and at the job's interval by node count; SCALE_SCRAPE=0 skips it, ~15 min). --before FILE: a results file of an earlier run (kept
# with SCALE_KEEP=FILE) shown as `before -> after`. SCALE_PYTHON=<another checkout's .venv/bin/python>
# measures that checkout's jobkit.
# Writes under a fresh /tmp/scale-* (about 1 GB at the defaults) and deletes it. Takes ~30 min on 2 busy cores (~15 without the scrape).
# Not part of CI.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
case ${1:-} in -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;; esac
args=() before=
while (($#)); do
  case $1 in
    --before) [[ -r ${2:-} ]] || { echo "report.sh: --before needs a readable results file, got '${2:-}'" >&2; exit 2; }
      before=$2; shift 2 ;;
    --nodes|--steps|--big-steps|--jobs|--day-steps) [[ -n ${2:-} ]] || { echo "report.sh: $1 needs a value" >&2; exit 2; }
      args+=("$1" "$2"); shift 2 ;;
    *) echo "report.sh: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
# nodes_arg ARGS...: the --nodes value among ARGS (default 8,64,256,512).
nodes_arg() {
  local nodes=8,64,256,512
  while (($#)); do [[ $1 == --nodes ]] && nodes=$2; shift; done
  echo "$nodes"
}
# shellcheck source=utils/lib/process.sh
source "$HERE/../../utils/lib/process.sh"
PY=$(proc_python "$HERE/../..")
WORK=$(mktemp -d /tmp/scale-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
"$PY" "$HERE/measure.py" "$WORK/run" --day-steps 86400 "${args[@]}" >"$WORK/results.jsonl"  # a later --day-steps wins
if [[ ${SCALE_SCRAPE:-1} != 0 ]]; then
  "$PY" "$HERE/scrape.py" "$WORK/scrape" --nodes "$(nodes_arg "${args[@]}")" >>"$WORK/results.jsonl"
fi
[[ -n ${SCALE_KEEP:-} ]] && cp "$WORK/results.jsonl" "$SCALE_KEEP"
"$PY" "$HERE/table.py" "$WORK/results.jsonl" ${before:+"$before"}
