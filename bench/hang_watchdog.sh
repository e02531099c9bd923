#!/usr/bin/env bash
# Usage: bench/hang_watchdog.sh [ROUNDS] [STEPS]
# Summary: What the hang watchdog costs and how fast it notices: TGS on vs off, CPU per look, SIGSTOP to HANG
#
# 1. Runs `run_local.sh tiny -- steps=STEPS` (default 2000) ROUNDS times (default 3) with the watchdog on
#    (default settings) and off (HANG_TIMEOUT=off), alternating, on one warm compile cache, and prints the
#    steady-state TGS (steps 20..STEPS-1) of each and their ratio (goal: within noise of 1.00). In each "on"
#    run it also reads the watchdog's own CPU time from /proc at a quarter and at three quarters of the run
#    and divides the difference by the looks it made meanwhile (one per 2 s): CPU per look.
# 2. Runs one job with HANG_TIMEOUT=3 HANG_STEP_FACTOR=3, freezes training with SIGSTOP after step 30 and
#    prints the seconds from the freeze to the HANG marker and to the end of the job.
# Not part of CI; run on a quiet machine.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-} in -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;; esac
ROUNDS=${1:-3} STEPS=${2:-2000}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "hang_watchdog.sh: ROUNDS must be a positive number, got '$ROUNDS'" >&2; exit 2; }
[[ $STEPS =~ ^[0-9]+$ ]] && ((STEPS >= 60)) || { echo "hang_watchdog.sh: STEPS must be a number >= 60, got '$STEPS'" >&2; exit 2; }

"$REPO_DIR/utils/setup_env.sh"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export JAX_CACHE_DIR=$WORK/jax_cache CONTAINER_RUNTIME=none
# shellcheck source=utils/lib/process.sh
source "$REPO_DIR/utils/lib/process.sh"
PY=$(proc_python "$REPO_DIR")
JOBKIT=$(proc_jobkit "$REPO_DIR")
TICK=$(getconf CLK_TCK)

# _pid_with ENV_ENTRY CMDLINE_PART: the first process whose environment has ENV_ENTRY and command line CMDLINE_PART.
_pid_with() {
  local f p
  for f in /proc/[0-9]*/environ; do
    p=${f#/proc/} p=${p%/environ}
    { tr '\0' '\n' <"$f"; } 2>/dev/null | grep -qx "$1" || continue
    { tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null | grep -q -- "$2" && { echo "$p"; return 0; }
  done
  return 1
}

# _cpu_ticks PID: the process's user+system CPU so far, in clock ticks (fields 14 and 15 of /proc/PID/stat;
# comm has no spaces here).
_cpu_ticks() {
  local stat
  read -r -a stat <"/proc/$1/stat"
  echo $((stat[13] + stat[14]))
}

# _run on|off NAME: one job; prints "<steady TGS> <watchdog CPU ms per look or ->".
_run() {
  local mode=$1 ws=$WORK/$2 pid log cpu=- dog job
  mkdir -p "$ws"
  if [[ $mode == off ]]; then export HANG_TIMEOUT=off; else unset HANG_TIMEOUT; fi
  JOB_WORKSPACE=$ws "$REPO_DIR/run_local.sh" tiny -- "steps=$STEPS" >"$ws.out" 2>&1 &
  pid=$!
  if [[ $mode == on ]]; then
    # CPU per look in steady state: the watchdog's CPU between a quarter and three quarters of the run,
    # divided by the looks it made meanwhile (one per 2 s); its start-up (Python imports) is left out.
    local t1 t2 c1 c2
    while kill -0 "$pid" 2>/dev/null && ! grep -q "completed step: $((STEPS / 4))," "$ws.out"; do sleep 0.2; done
    job=$(sed -n 's/^JOB_ID=//p' "$ws.out" | head -n 1)
    if dog=$(_pid_with "JOB_ID=$job" hang-watchdog); then
      c1=$(_cpu_ticks "$dog") t1=$(date +%s.%N)
      while kill -0 "$pid" 2>/dev/null && ! grep -q "completed step: $((STEPS * 3 / 4))," "$ws.out"; do sleep 0.2; done
      c2=$(_cpu_ticks "$dog") t2=$(date +%s.%N)
      cpu=$(awk -v a="$c1" -v b="$c2" -v t1="$t1" -v t2="$t2" -v hz="$TICK" \
        'BEGIN { looks = (t2 - t1) / 2; printf "%.2f", (b - a) * 1000 / hz / (looks > 0 ? looks : 1) }')
    fi
  fi
  wait "$pid" || { echo "hang_watchdog.sh: the $mode run failed; see $ws.out" >&2; cp "$ws.out" "${TMPDIR:-/tmp}/"; exit 1; }
  log=$(compgen -G "$ws/*.log" | head -n 1)
  "$JOBKIT" tgs --json --steady "20:$((STEPS - 1))" "$log" |
    "$PY" -c 'import json,sys; print(json.load(sys.stdin)["windows"]["steady"]["tgs"]["mean"], sys.argv[1])' "$cpu"
  unset HANG_TIMEOUT
}

_run off warmup >/dev/null # fills the compile cache so that no measured run pays for the first compile
printf '%-6s %14s %14s %10s %16s\n' round "TGS off" "TGS on" "on/off" "CPU ms per look"
ratios=()
for ((r = 1; r <= ROUNDS; r++)); do
  read -r tgs_off _ < <(_run off "off$r")
  read -r tgs_on cpu < <(_run on "on$r")
  ratio=$(awk -v a="$tgs_on" -v b="$tgs_off" 'BEGIN { printf "%.3f", a / b }')
  ratios+=("$ratio")
  printf '%-6s %14.0f %14.0f %10s %16s\n' "$r" "$tgs_off" "$tgs_on" "$ratio" "$cpu"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ a[NR] = $1; s += $1 } END { printf "mean ratio %.3f, median %.3f\n", s / NR, a[int((NR + 1) / 2)] }'

# --- time to notice ---
ws=$WORK/hang
mkdir -p "$ws"
HANG_TIMEOUT=3 HANG_STEP_FACTOR=3 JOB_WORKSPACE=$ws "$REPO_DIR/run_local.sh" tiny -- steps=100000 >"$ws.out" 2>&1 &
pid=$!
while kill -0 "$pid" 2>/dev/null && ! grep -q 'completed step: 30,' "$ws.out"; do sleep 0.1; done
job=$(sed -n 's/^JOB_ID=//p' "$ws.out" | head -n 1)
train=$(_pid_with "JOB_ID=$job" 'jobkit launch')
t0=$(date +%s.%N)
kill -STOP "$train"
marker=""
while kill -0 "$pid" 2>/dev/null; do
  [[ -z $marker ]] && marker=$(compgen -G "$ws/*/hang/HANG" | head -n 1 || true)
  sleep 0.05
done
t_end=$(date +%s.%N)
wait "$pid" || true
t_marker=$(stat -c %.Y "$marker")
echo
printf '%-34s %s\n' "limit (HANG_TIMEOUT=3, factor 3)" "$(sed -n 's/.*== HANG detected (\(.*\)) ==/\1/p' "$ws.out")"
printf '%-34s %.1f s\n' "SIGSTOP to HANG marker" "$(awk -v a="$t0" -v b="$t_marker" 'BEGIN { print b - a }')"
printf '%-34s %.1f s\n' "SIGSTOP to job end (status HANG)" "$(awk -v a="$t0" -v b="$t_end" 'BEGIN { print b - a }')"
grep -o 'Status: .*' "$ws.out" | head -n 1
