#!/usr/bin/env bash
# Usage: bench/ray_overhead.sh [--no-setup] [--stack] [ROUNDS] [STEPS]
# Summary: What RAY=1 costs: steady-state TGS and time to the first training step, RAY=1 vs RAY=0, interleaved
#
# Runs `run_local.sh tiny -- steps=STEPS` (default 200) ROUNDS times (default 3) with RAY=0 and with RAY=1,
# alternating, on one warm JAX compile cache, so that machine noise hits both alike. Per run it records:
#   first step   seconds from starting run_local.sh to the log's "completed step: 0" line (polled every 0.05 s)
#   TGS          steady-state tokens/s/device over steps 20..STEPS-1 (`jobkit tgs --json`)
# and prints one table row per round plus the mean and median of the ratios: TGS(RAY=1)/TGS(RAY=0) (goal >= 0.98) and first-step
# delta RAY=1 - RAY=0 (goal <= 5 s). Not part of CI.
#   --no-setup  use .venv as it is instead of running utils/setup_env.sh first (a shared or read-only venv)
#   --stack     no MaxText: seconds from the start of the launcher's RAY=1 stack (utils/lib/observability.sh on
#               one node: exporter, Ray head, Prometheus, TensorBoard, driver, actor) to the first instruction of
#               the training command, against RAY=0 (the command started directly); ROUNDS interleaved pairs,
#               STEPS unused. Also prints how long the head took until its GCS and raylet were up.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-} in -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;; esac
setup=1 stack=0
while [[ ${1:-} == --* ]]; do
  case $1 in
    --no-setup) setup=0 ;;
    --stack) stack=1 ;;
    *) echo "ray_overhead.sh: unknown option '$1' (--no-setup, --stack)" >&2; exit 2 ;;
  esac
  shift
done
ROUNDS=${1:-3} STEPS=${2:-200}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "ray_overhead.sh: ROUNDS must be a positive number, got '$ROUNDS'" >&2; exit 2; }
[[ $STEPS =~ ^[0-9]+$ ]] && ((STEPS >= 40)) || { echo "ray_overhead.sh: STEPS must be a number >= 40, got '$STEPS'" >&2; exit 2; }

if ((setup)); then
  "$REPO_DIR/utils/setup_env.sh"
elif [[ ! -x $REPO_DIR/.venv/bin/python ]]; then
  echo "ray_overhead.sh: --no-setup needs $REPO_DIR/.venv (run utils/setup_env.sh once, or drop --no-setup)" >&2
  exit 2
fi
export PATH=$REPO_DIR/.venv/bin:$PATH
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export JAX_CACHE_DIR=$WORK/jax_cache CONTAINER_RUNTIME=none
# shellcheck source=utils/lib/process.sh
source "$REPO_DIR/utils/lib/process.sh"
PY=$(proc_python "$REPO_DIR")
JOBKIT=$(proc_jobkit "$REPO_DIR")

_now() { date +%s.%N; }

# _run RAY_VALUE NAME: runs one job in its own workspace; prints "<first-step seconds> <steady TGS>".
_run() {
  local ray=$1 ws=$WORK/$2 t0 first="" log pid
  mkdir -p "$ws"
  t0=$(_now)
  RAY=$ray JOB_WORKSPACE=$ws "$REPO_DIR/run_local.sh" tiny -- "steps=$STEPS" >/dev/null 2>&1 &
  pid=$!
  # Polls only until the first step: polling on would take CPU from the steps being measured.
  while [[ -z $first ]] && kill -0 "$pid" 2>/dev/null; do
    log=$(compgen -G "$ws/*.log" | head -n 1 || true)
    if [[ -n $log ]] && grep -q 'completed step: 0,' "$log"; then
      first=$(awk -v a="$t0" -v b="$(_now)" 'BEGIN { printf "%.2f", b - a }')
    fi
    sleep 0.05
  done
  log=$(compgen -G "$ws/*.log" | head -n 1 || true)
  if ! wait "$pid"; then
    local kept
    kept=$(mktemp "${TMPDIR:-/tmp}/ray_overhead-failed.XXXXXX")
    cat "$log" >"$kept" 2>/dev/null || true
    echo "ray_overhead.sh: the RAY=$ray run failed; its log is kept in $kept" >&2
    exit 1
  fi
  "$JOBKIT" tgs --json --steady "20:$((STEPS - 1))" "$log" |
    "$PY" -c 'import json,sys; print(sys.argv[1], json.load(sys.stdin)["windows"]["steady"]["tgs"]["mean"])' "${first:-nan}"
}

# _stack RAY_VALUE NAME: prints the seconds from the start to the command's first instruction and, for RAY=1,
# those from the head's start to its GCS and raylet being up (the job log says; "-" for RAY=0).
_stack() {
  local ray=$1 sdir=$WORK/$2 st0 sfirst sup=-
  mkdir -p "$sdir/job/out"
  st0=$EPOCHREALTIME
  if [[ $ray == 1 ]]; then
    if ! (_stack_ray1 "$sdir") >"$sdir/job.log" 2>&1; then
      cp "$sdir/job.log" "${TMPDIR:-/tmp}/ray_overhead-stack.log"
      echo "ray_overhead.sh: the RAY=1 stack failed; its log is kept in ${TMPDIR:-/tmp}/ray_overhead-stack.log" >&2
      exit 1
    fi
    sup=$(sed -n 's/.*GCS and raylet up in \([0-9.]*\) s.*/\1/p' "$sdir/job.log" | head -n 1)
  else
    _stamp "$sdir/first"
  fi
  sfirst=$(<"$sdir/first")
  awk -v a="$st0" -v b="$sfirst" -v u="${sup:--}" 'BEGIN { printf "%.2f %s\n", b - a, u }'
}

# The "training command": writes the time of its first instruction to $1.
_stamp() {
  # shellcheck disable=SC2016 # expanded by the inner bash
  bash -c 'echo "$EPOCHREALTIME" >"$1"' _ "$1"
}

# One node's RAY=1 stack around _stamp, with the tier contract that _train.sh gives it (run in a subshell, so
# that each run sources the library afresh).
_stack_ray1() {
  export JOB_WORKSPACE=$1 JOB_DIR=job JOB_ID=1 NODE_RANK=0 NNODES=1 OUTPUT_PATH=$1/job/out
  # shellcheck source=utils/lib/observability.sh
  source "$REPO_DIR/utils/lib/observability.sh"
  # shellcheck disable=SC2016 # expanded by the inner bash
  run_with_observability bash -c 'echo "$EPOCHREALTIME" >"$1"' _ "$1/first"
}

if ((stack)); then
  printf '%-6s %12s %12s %16s %10s\n' round "RAY=0 (s)" "RAY=1 (s)" "RAY=1 head up" "delta (s)"
  deltas=() ups=()
  for ((i = 1; i <= ROUNDS; i++)); do
    read -r f0 _ < <(_stack 0 "r$i-ray0")
    read -r f1 u1 < <(_stack 1 "r$i-ray1")
    delta=$(awk -v a="$f1" -v b="$f0" 'BEGIN { printf "%.2f", a - b }')
    deltas+=("$delta") ups+=("$u1")
    printf '%-6s %12s %12s %16s %10s\n' "$i" "$f0" "$f1" "$u1" "$delta"
  done
  printf '%-6s %12s %12s %16s %10s\n' median "" "" \
    "$(printf '%s\n' "${ups[@]}" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')" \
    "$(printf '%s\n' "${deltas[@]}" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')"
  echo "goal: delta <= 5 s (to the training command's first instruction, no MaxText); $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
  exit 0
fi

_run 0 warmup >/dev/null # fills the compile cache so that no measured run pays for the first compile
printf '%-6s %14s %14s %10s %12s %12s %10s\n' round "TGS RAY=0" "TGS RAY=1" "TGS ratio" "1st step 0" "1st step 1" "delta (s)"
ratios=() deltas=()
for ((i = 1; i <= ROUNDS; i++)); do
  read -r f0 t0 < <(_run 0 "r$i-ray0")
  read -r f1 t1 < <(_run 1 "r$i-ray1")
  ratio=$(awk -v a="$t1" -v b="$t0" 'BEGIN { printf "%.3f", a / b }')
  delta=$(awk -v a="$f1" -v b="$f0" 'BEGIN { printf "%.2f", a - b }')
  ratios+=("$ratio") deltas+=("$delta")
  printf '%-6s %14.0f %14.0f %10s %12s %12s %10s\n' "$i" "$t0" "$t1" "$ratio" "$f0" "$f1" "$delta"
done
# Mean and median: on a shared machine one disturbed run moves the mean a lot, the median little.
_stats() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1; s += $1 } END {
  m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.3f %.3f\n", s / NR, m }'; }
read -r ratio_mean ratio_median < <(_stats "${ratios[@]}")
read -r delta_mean delta_median < <(_stats "${deltas[@]}")
printf '%-6s %14s %14s %10.3f %12s %12s %10.2f\n' mean "" "" "$ratio_mean" "" "" "$delta_mean"
printf '%-6s %14s %14s %10.3f %12s %12s %10.2f\n' median "" "" "$ratio_median" "" "" "$delta_median"
echo "goals: TGS ratio >= 0.98, first-step delta <= 5 s; steps=$STEPS, steady window 20..$((STEPS - 1)), $(nproc) CPUs"
