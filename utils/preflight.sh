#!/usr/bin/env bash
# Usage: utils/preflight.sh [--help]
# Summary: Per-node health report and cleanup before training; touches only what this launcher started
#
# Safe on shared machines: it acts on exactly two kinds of leftovers, both of an earlier job of ours that is
# over (Slurm no longer lists it; an id Slurm does not know counts as over):
#   - running docker/podman containers labelled maxtext-launcher=1 (their maxtext-launcher.job label names a job
#     other than $JOB_ID): stopped
#   - processes of the current user whose command line runs `jobkit launch` (the training entry) and whose
#     environment has a JOB_ID other than $JOB_ID: SIGTERM, then SIGKILL after PREFLIGHT_KILL_WAIT seconds
# Everything else is reported and left alone: our containers/processes of a job Slurm still runs, other users'
# processes, containers without our label, processes using the GPUs. Also reported: free space in /tmp and in
# $JOB_WORKSPACE, transparent hugepages, NUMA balancing, the GPUs the kernel shows.
# Every line starts with "[preflight <host>]". Exit status: 0, or 1 when $JOB_WORKSPACE cannot be written to.
#
#   JOB_ID                 this job; its own containers and processes are never touched
#   JOB_WORKSPACE          output root that must be writable (default <repo>/outputs)
#   PREFLIGHT_KILL_WAIT    seconds between SIGTERM and SIGKILL (default 10)
#   PREFLIGHT_MIN_FREE_GB  free space below which a warning is printed (default 20)
#   PREFLIGHT_SYSFS_ROOT   prefix for the /sys and /proc/sys files read for THP and NUMA (tests)
#   GPU_DETECT_ROOT        prefix for the GPU sysfs files (tests)
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

_PROG=preflight.sh
_UTILS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_REPO_DIR=$(cd "$_UTILS_DIR/.." && pwd)
_LABEL=maxtext-launcher

_usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

case ${1:-} in
  -h | --help) _usage; exit 0 ;;
  "") ;;
  *) echo "$_PROG: unexpected argument '$1'; it takes no arguments (settings come from the environment, see --help)" >&2; exit 2 ;;
esac

# shellcheck source=utils/lib/gpu_detect.sh
source "$_UTILS_DIR/lib/gpu_detect.sh"
# shellcheck source=utils/lib/process.sh
source "$_UTILS_DIR/lib/process.sh"

_HOST=${SLURMD_NODENAME:-$(hostname -s 2>/dev/null || uname -n)}
_HOST=${_HOST%%.*}
_JOB=${JOB_ID:-}
_KILL_WAIT=${PREFLIGHT_KILL_WAIT:-10}
_MIN_FREE_GB=${PREFLIGHT_MIN_FREE_GB:-20}
_SYSROOT=${PREFLIGHT_SYSFS_ROOT:-}
_FATAL=0
[[ $_KILL_WAIT =~ ^[0-9]+$ ]] || { echo "$_PROG: PREFLIGHT_KILL_WAIT=$_KILL_WAIT is not a number of seconds; e.g. PREFLIGHT_KILL_WAIT=10" >&2; exit 2; }
[[ $_MIN_FREE_GB =~ ^[0-9]+$ ]] || { echo "$_PROG: PREFLIGHT_MIN_FREE_GB=$_MIN_FREE_GB is not a whole number; e.g. PREFLIGHT_MIN_FREE_GB=20" >&2; exit 2; }

say() { echo "[preflight $_HOST] $*"; }

# job_state JOB prints alive, over or unknown. Only Slurm can vouch for a job: an id it does not know (a local
# run's id, or a job purged from its memory) is over; when Slurm cannot be asked, the answer is unknown.
job_state() {
  local job=$1 out rc=0
  if [[ ! $job =~ ^[0-9]+(_[0-9]+)?$ ]] || ! command -v squeue >/dev/null 2>&1; then echo over; return; fi
  out=$(timeout 20 squeue -h -j "$job" -o %T 2>&1) || rc=$?
  if ((rc == 0)); then
    if [[ -n ${out//[[:space:]]/} ]]; then echo alive; else echo over; fi
  elif [[ $out == *"Invalid job id"* ]]; then
    echo over
  else
    echo unknown
  fi
}

# Why an item of JOB may not be touched, or nothing when it may.
keep_reason() {
  local job=$1
  if [[ -z $job ]]; then echo "carries no job id"; return; fi
  if [[ $job == "$_JOB" ]]; then echo "belongs to this job"; return; fi
  # run_local.sh ids: Slurm never knew these jobs, so its answer says nothing about them; on a shared
  # host (or a one-machine cluster) they are someone's live runs, stopped by their own run_local.sh.
  if [[ $job == local_* ]]; then echo "belongs to run_local.sh job $job, which Slurm cannot vouch for"; return; fi
  case $(job_state "$job") in
    alive) echo "belongs to job $job, which Slurm still runs" ;;
    unknown) echo "belongs to job $job, and Slurm could not be asked whether it still runs" ;;
  esac
}

# --- containers -------------------------------------------------------------------------------------------------
check_containers() {
  local rt ours all id name job reason
  local -a others
  local -A handled=()
  for rt in docker podman; do
    command -v "$rt" >/dev/null 2>&1 || continue
    if ! ours=$(timeout 20 "$rt" ps -q --filter "label=$_LABEL=1" 2>/dev/null); then
      say "$rt: no engine answering; nothing to check"
      continue
    fi
    # id and name, so the note about containers we leave alone can say which they are.
    all=$(timeout 20 "$rt" ps --format '{{.ID}} {{.Names}}' 2>/dev/null || true)
    for id in $ours; do
      [[ -z ${handled[$id]:-} ]] || continue
      handled[$id]=1
      job=$(timeout 20 "$rt" container inspect --format "{{ index .Config.Labels \"$_LABEL.job\" }}" "$id" 2>/dev/null || true)
      [[ $job == "<no value>" ]] && job=""
      reason=$(keep_reason "$job")
      if [[ -n $reason && -n $job ]]; then
        say "$rt container $id (our label) $reason: left alone"
        continue
      fi
      say "stopping $rt container $id (label $_LABEL=1, job ${job:-unknown}): left over from an earlier run"
      if timeout 60 "$rt" stop -t 10 "$id" >/dev/null 2>&1; then
        say "stopped $rt container $id"
      else
        say "warning: could not stop $rt container $id; stop it by hand: $rt stop $id"
      fi
    done
    others=()
    while read -r id name; do
      [[ -n $id && -z ${handled[$id]:-} ]] && others+=("${name:-$id}")
    done <<<"$all"
    if ((${#others[@]})); then
      say "$rt: ${#others[@]} other running container(s) not started by this launcher, left alone: ${others[*]}"
    fi
  done
}

# --- stale training processes --------------------------------------------------------------------------------------
proc_cmd() {
  local -a argv=()
  mapfile -d '' argv 2>/dev/null <"/proc/$1/cmdline" || true
  echo "${argv[*]}"
}

proc_job() {
  local -a envs=()
  local e
  mapfile -d '' envs 2>/dev/null <"/proc/$1/environ" || true
  for e in "${envs[@]}"; do
    if [[ $e == JOB_ID=* ]]; then echo "${e#JOB_ID=}"; return; fi
  done
}

proc_user() {
  local uid
  uid=$(stat -c %u "/proc/$1" 2>/dev/null) || { echo "?"; return; }
  getent passwd "$uid" | cut -d: -f1 | grep . || echo "uid $uid"
}

check_processes() {
  local d pid cmd job reason
  local -a stale=() jobs=() argv=()
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    ((pid == $$ || pid == PPID)) && continue
    argv=()
    mapfile -d '' argv 2>/dev/null <"$d/cmdline" || continue
    cmd="${argv[*]}"
    [[ $cmd == *jobkit?launch* ]] || continue   # `jobkit launch`, or `-m jobkit.launch` of older launchers
    proc_alive "$pid" || continue
    if [[ ! -O $d ]]; then
      say "PID $pid of user $(proc_user "$pid") runs training ($cmd): not ours, left alone"
      continue
    fi
    job=$(proc_job "$pid")
    reason=$(keep_reason "$job")
    if [[ -n $reason ]]; then
      say "PID $pid runs training ($cmd) and $reason: left alone"
      continue
    fi
    stale+=("$pid") jobs+=("$job")
  done
  if ((${#stale[@]} == 0)); then
    say "no stale training processes of earlier jobs"
    return
  fi

  local i
  for i in "${!stale[@]}"; do
    say "stale training process PID ${stale[i]} of job ${jobs[i]} ($(proc_cmd "${stale[i]}")): sending SIGTERM"
  done
  proc_stop "$_KILL_WAIT" "${stale[@]}" || true
  for i in "${!stale[@]}"; do
    if [[ " ${PROC_STOP_LEFT[*]} " == *" ${stale[i]} "* ]]; then
      say "warning: PID ${stale[i]} survived SIGKILL (stuck in the kernel?); the node may need attention"
    elif [[ " ${PROC_STOP_KILLED[*]} " == *" ${stale[i]} "* ]]; then
      say "PID ${stale[i]} (job ${jobs[i]}) ignored SIGTERM for ${_KILL_WAIT}s: killed with SIGKILL"
    else
      say "PID ${stale[i]} (job ${jobs[i]}) ended after SIGTERM"
    fi
  done
}

# --- GPUs -------------------------------------------------------------------------------------------------------
check_gpus() {
  local vendor count expected=${SLURM_GPUS_ON_NODE:-}
  vendor=$(detect_gpu_vendor)
  if [[ $vendor == none ]]; then
    say "GPUs: none visible to the kernel (CPU-only node)"
  else
    count=$(count_gpus "$vendor")
    say "GPUs: $count $vendor"
    if [[ $expected =~ ^[0-9]+$ ]] && ((expected != count)); then
      say "warning: Slurm allocated $expected GPU(s) on this node but the kernel shows $count"
    fi
  fi

  local users=0 p pid
  for p in "${GPU_DETECT_ROOT:-}"/sys/class/kfd/kfd/proc/*; do
    pid=${p##*/}
    [[ $pid =~ ^[0-9]+$ ]] || continue
    users=$((users + 1))
    if [[ -d /proc/$pid ]]; then
      say "PID $pid of user $(proc_user "$pid") has the AMD GPUs open ($(proc_cmd "$pid")): not started by this job, left alone"
    else
      say "PID $pid has the AMD GPUs open (not visible from here): not started by this job, left alone"
    fi
  done
  if [[ $vendor == nvidia ]] && command -v nvidia-smi >/dev/null 2>&1; then
    local line
    while IFS= read -r line; do
      [[ $line =~ ^[0-9]+, ]] || continue
      users=$((users + 1))
      say "GPU process ${line}: not started by this job, left alone"
    done < <(timeout 30 nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null || true)
  fi
  ((users)) || [[ $vendor == none ]] || say "no process has the GPUs open"
}

# --- host settings and disk ----------------------------------------------------------------------------------------
selected() { # prints the bracketed choice of a sysfs "a [b] c" file, or the whole content
  local v=""
  read -r v 2>/dev/null <"$1" || return 1
  if [[ $v =~ \[([^]]+)\] ]]; then echo "${BASH_REMATCH[1]}"; else echo "$v"; fi
}

check_host() {
  local thp=$_SYSROOT/sys/kernel/mm/transparent_hugepage enabled defrag numa
  if enabled=$(selected "$thp/enabled"); then
    defrag=$(selected "$thp/defrag" || echo "?")
    say "transparent hugepages: enabled=$enabled defrag=$defrag (reported only)"
  else
    say "transparent hugepages: not available"
  fi
  if read -r numa 2>/dev/null <"$_SYSROOT/proc/sys/kernel/numa_balancing"; then
    if [[ $numa == 0 ]]; then
      say "NUMA balancing: off"
    else
      say "NUMA balancing: on ($numa); AMD's MI300X tuning guide recommends off: echo 0 | sudo tee /proc/sys/kernel/numa_balancing"
    fi
  else
    say "NUMA balancing: not available (single NUMA node or kernel without it)"
  fi
}

free_gb() { df -Pk "$1" 2>/dev/null | awk 'NR == 2 { printf "%d", $4 / 1048576 }'; }

check_disk() {
  local ws=${JOB_WORKSPACE:-$_REPO_DIR/outputs} dir gb probe
  if ! mkdir -p "$ws" 2>/dev/null || ! probe=$(mktemp "$ws/.preflight.XXXXXX" 2>/dev/null); then
    echo "$_PROG: JOB_WORKSPACE=$ws cannot be written by $(id -un) on $_HOST; fix its permissions or point JOB_WORKSPACE at a writable directory" >&2
    say "FATAL: JOB_WORKSPACE=$ws is not writable"
    _FATAL=1
  else
    rm -f "$probe"
  fi
  for dir in /tmp "$ws"; do
    [[ -d $dir ]] || continue
    gb=$(free_gb "$dir")
    [[ -n $gb ]] || continue
    if ((gb < _MIN_FREE_GB)); then
      say "warning: $dir has only ${gb} GiB free (less than PREFLIGHT_MIN_FREE_GB=${_MIN_FREE_GB})"
    else
      say "$dir: ${gb} GiB free"
    fi
  done
}

say "job ${_JOB:-<no JOB_ID>} on $_HOST"
check_containers
check_processes
check_gpus
check_host
check_disk
exit "$_FATAL"
