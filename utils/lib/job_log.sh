# shellcheck shell=bash
# Summary: The job log's KEY=VALUE header and its closing JOB SUMMARY block (sourced library)
#
# Tools and skills parse both, so their shape is part of the contract:
#   header   one KEY=VALUE per line at the top of the log
#   summary  "==== JOB SUMMARY ====" ... "Status: SUCCESS (exit 0)" [a RAY=1 job's "Metrics: ..."] a closing "=" rule

# new_local_job_id -> local_<YYYYmmdd_HHMMSS>_<4 hex>
new_local_job_id() {
  printf 'local_%s_%s' "$(date +%Y%m%d_%H%M%S)" "$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')"
}

# format_duration SECONDS -> "1h 2m 3s" | "2m 3s" | "3s"
format_duration() {
  local total=$1 h m s
  h=$((total / 3600)) m=$((total % 3600 / 60)) s=$((total % 60))
  if (( h )); then printf '%dh %dm %ds' "$h" "$m" "$s"
  elif (( m )); then printf '%dm %ds' "$m" "$s"
  else printf '%ds' "$s"
  fi
}

# shellcheck source=utils/lib/env_mask.sh
source "$(dirname "${BASH_SOURCE[0]}")/env_mask.sh"

# print_job_header NAME... : prints NAME=VALUE for each named variable that is set. An array (the passthrough
# arguments) is joined by spaces, each element as env_mask_arg shows it: a credential's value is ***.
print_job_header() {
  local name element
  local -a shown
  for name in "$@"; do
    # declare -p, not -v: an empty array is still a value worth printing (PASSTHROUGH_ARGS="").
    declare -p "$name" >/dev/null 2>&1 || continue
    local -n _value=$name
    if [[ $(declare -p "$name" 2>/dev/null) == "declare -a"* ]]; then
      shown=()
      for element in "${_value[@]}"; do shown+=("$(env_mask_arg "$element")"); done
      printf '%s="%s"\n' "$name" "${shown[*]}"
    else
      printf '%s=%s\n' "$name" "$_value"
    fi
    unset -n _value
  done
}

# job_status_word EXIT_CODE CANCELLED(0|1) [HANG_MARKER [LOG]] -> SUCCESS | FAILED | CANCELLED | HANG | STOPPED
# HANG: the hang watchdog wrote JOB_DIR/hang/HANG (py/jobkit/ops/hang_watchdog.py; HANG_MARKER is its line, as
# `jobkit hang-watchdog --marker` prints it after checking it is this job's own) and training then failed, or
# stopped early (with checkpointing on, MaxText answers the watchdog's TERM by saving and exiting 0).
# STOPPED: training exited 0 but stopped early (job_stopped_early): not a success.
job_status_word() {
  local hung=0 early=0
  [[ -n ${3:-} ]] && hung=1
  [[ -n ${4:-} ]] && job_stopped_early "$4" >/dev/null && early=1
  if (( $2 )); then echo CANCELLED
  elif (( $1 == 0 && ! early )); then echo SUCCESS
  elif (( hung )); then echo HANG
  elif (( $1 == 0 )); then echo STOPPED
  else echo FAILED
  fi
}

# job_stopped_early LOG -> MaxText's reason when it stopped training before its last step and exited 0
# ("Training stopped: Job received termination signal (SIGTERM)." after a preemption checkpoint, or the data
# ran out); returns 1 when it did not. A reached target loss is a success, not an early stop.
job_stopped_early() {
  local line
  # Not from a `set -x` trace line ("+ ...", "0: + ..."): under _DEBUG this very search is traced into the log.
  # One awk, no pipe: under pipefail a `grep | grep -m1` fails when the first grep is cut off (SIGPIPE).
  line=$(awk '!/^([0-9]+: )?[+]+ / && /Training stopped: / { sub(/.*Training stopped: /, "Training stopped: "); print; exit }' \
    "$1" 2>/dev/null) && [[ -n $line ]] || return 1
  [[ $line != *"Target loss"* ]] || return 1
  line=${line#Training stopped: }
  echo "${line%.}"
}

# job_stop_detail LOG WORKSPACE ALIAS_OR_MODEL -> "<reason>; last step N; checkpoint at step M in <dir>"
# for an early stop: what a rerun with the same model:alias: resumes from.
job_stop_detail() {
  local log=$1 ws=$2 name=$3 why last saved dir=""
  why=$(job_stopped_early "$log") || return 0
  last=$(grep -o 'completed step: [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$')
  saved=$(grep -o 'Saved a checkpoint at step [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$')
  if [[ -n $saved ]]; then dir=$(compgen -G "$ws/$name/*/checkpoints/$saved" | head -n 1 || true); fi
  printf '%s; last step %s' "$why" "${last:-none}"
  if [[ -n $saved ]]; then printf '; checkpoint at step %s%s' "$saved" "${dir:+ in $dir}"; else printf '; no checkpoint saved'; fi
}

# job_cancel_detail LOG -> why a cancelled job was cancelled: Slurm's reason when its "*** JOB ... CANCELLED AT
# ... DUE TO <reason>" line is in LOG (time limit, node failure, preemption), else a person's scancel.
job_cancel_detail() {
  local reason
  reason=$(grep -m1 -o 'CANCELLED AT [^ ]* DUE TO [A-Z ]*' "$1" 2>/dev/null | sed 's/.* DUE TO //; s/ *$//') || true
  if [[ -n $reason ]]; then echo "cancelled by Slurm: ${reason,,}"; else echo "scancel / SIGTERM"; fi
}

# memory_oom_kills -> how many processes the kernel's OOM killer has ended so far in this shell's memory
# cgroup (v1 memory.oom_control or v2 memory.events, line "oom_kill N"); prints nothing when it cannot
# tell. A job under a memory limit that is not Slurm's own cgroup plugin (which reports OOM kills itself:
# task/none, a login node, a container) otherwise ends as a bare SIGKILL with no reason in its log.
memory_oom_kills() {
  local _h controllers path file=""
  while IFS=: read -r _h controllers path; do
    if [[ ,$controllers, == *,memory,* ]]; then file=/sys/fs/cgroup/memory$path/memory.oom_control; break; fi
    if [[ -z $controllers ]]; then
      for file in "/sys/fs/cgroup$path/memory.events" "/sys/fs/cgroup/unified$path/memory.events"; do
        [[ -r $file ]] && break
      done
    fi
  done < /proc/self/cgroup
  [[ -n $file && -r $file ]] || return 0
  awk '$1 == "oom_kill" { print $2; exit }' "$file" 2>/dev/null || true
}

# print_oom_kill_note BEFORE: when the OOM killer ended processes in our memory cgroup since BEFORE (an
# earlier memory_oom_kills), one line saying so; jobkit's failure classes read it as an out-of-memory.
print_oom_kill_note() {
  local before=$1 after
  after=$(memory_oom_kills)
  [[ -n $before && -n $after ]] && (( after > before )) || return 0
  echo "[job] oom-kill: the kernel's OOM killer ended $((after - before)) process(es) of this job (memory cgroup limit reached)"
}

# job_metrics_state JOBKIT LOG -> the JOB SUMMARY's Metrics value of the job ending now: its TSDB, "off (<why>)"
# for a RAY=1 job without one, nothing for a job that did not ask. `jobkit metrics-state` decides (one place for
# the summary, `jobkit jobs`, the monitor and `prometheus.sh list`); a jobkit that cannot run prints nothing.
job_metrics_state() {
  "$1" metrics-state --summary "$2" 2>/dev/null || true
}

# print_job_summary JOB_ID JOB_NAME MODEL NNODES WALL_SECONDS EXIT_CODE STATUS [DETAIL [METRICS]]
# METRICS: a RAY=1 job's `Metrics:` line, its TSDB or "off (<why>)" (job_metrics_state); no line when empty.
# It comes after Status, so readers that take the block's first lines or its Status line read what they did.
print_job_summary() {
  local job_id=$1 name=$2 model=$3 nodes=$4 wall=$5 rc=$6 status=$7 detail=${8:-} metrics=${9:-}
  local color="" reset=""
  if [[ -t 1 ]]; then
    reset=$'\e[0m'
    [[ $status == SUCCESS ]] && color=$'\e[32m' || color=$'\e[31m'
  fi
  echo "==== JOB SUMMARY ===="
  echo "  Job:    $job_id ($name)"
  echo "  Model:  $model"
  echo "  Nodes:  $nodes"
  echo "  Wall:   $(format_duration "$wall")"
  echo "  Status: ${color}$status (exit $rc)${reset}${detail:+ — $detail}"
  [[ -z $metrics ]] || echo "  Metrics: $metrics"
  echo "====================="
}
