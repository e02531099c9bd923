# shellcheck shell=bash
# Summary: Start, find, wait for and stop processes, by PID only (sourced library; sourcing changes nothing)
#
# Safe under `set -euo pipefail`, which most callers run with. Every script that stops or watches a process
# uses this file, so "stop" means the same everywhere: TERM,
# a bounded wait, then KILL; never a match by name (other users' jobs share the node). A PID is only ever
# signalled while it still has the start time it had when we looked at it, so a PID the kernel recycled
# for someone else's process is left alone.
#
#   proc_stat PID              sets PROC_STATE PROC_PPID PROC_PGID PROC_SID PROC_START; 1 when there is no such
#                              process
#   proc_table                 prints "PID STATE PPID PGID SID START" for every process, one pass over /proc
#   proc_start_time PID        prints the start time (clock ticks since boot) of a live, non-zombie PID; else 1
#   proc_alive PID [START]     true while PID runs (not a zombie) and, if START is given, still has that start
#   proc_tree PID              prints PID and all its descendants, parents before children
#   proc_stop [-g] GRACE PID...
#                              TERM every PID (with -g, the whole group of a PID that leads one), waits up to
#                              GRACE seconds for all to end, then KILLs the rest and waits up to 5 s more.
#                              Sets PROC_STOP_KILLED (PIDs that needed KILL) and PROC_STOP_LEFT (PIDs still
#                              alive at the end). Returns 0 when all ended, 1 otherwise.
#   proc_wait PID              waits for the child PID across trapped signals; returns its exit status (127 when
#                              PID is not a child of this shell: then it only waits for it to end)
#   proc_kill_after GRACE TARGET
#                              prints the PID of a watcher that KILLs TARGET (PID, or -PGID) after GRACE s
#   proc_cancel_kill_after W   stops that watcher when TARGET ended in time
#   proc_python [REPO]         prints the project's Python: $VENV_DIR/bin/python, else <REPO>/.venv/bin/python,
#                              else python3 on PATH; 1 when there is none
#   proc_jobkit [REPO]         prints the project's `jobkit` command: the venv's console script, else `jobkit`
#                              on PATH, else <REPO>/py/bin/jobkit (runs the package from the checkout)
#   proc_reaper [REPO]         prints, NUL-terminated, the words that run a command under `jobkit reap --grace 0`
#                              (REPO's package, the project's Python): a child subreaper, so that what the
#                              command's tree detaches (Ray's daemons) stays below it and is KILLed when the
#                              command ends. Prints nothing, after one warning on stderr, when that Python
#                              cannot run it: the caller then runs the command as it is.

# The fields of /proc/PID/stat after "(comm) ": comm may hold spaces and parentheses, so split at the last ") ".
proc_stat() {
  local line rest
  PROC_STATE='' PROC_PPID='' PROC_PGID='' PROC_SID='' PROC_START=''
  read -r line 2>/dev/null <"/proc/$1/stat" || return 1
  rest=${line##*) }
  read -r -a rest <<<"$rest"
  # shellcheck disable=SC2034  # named state for the caller
  PROC_STATE=${rest[0]} PROC_PPID=${rest[1]} PROC_PGID=${rest[2]} PROC_SID=${rest[3]} PROC_START=${rest[19]}
}

# For callers that need the whole tree at once (parents, sessions): one read per process, no subshell each.
proc_table() {
  local f line
  local -a rest
  for f in /proc/[0-9]*/stat; do
    read -r line 2>/dev/null <"$f" || continue
    rest=${line##*) }
    read -r -a rest <<<"$rest"
    echo "${line%% *} ${rest[0]} ${rest[1]} ${rest[2]} ${rest[3]} ${rest[19]}"
  done
}

proc_start_time() {
  proc_stat "$1" || return 1
  [[ $PROC_STATE != Z && $PROC_STATE != X ]] || return 1
  echo "$PROC_START"
}

proc_alive() {
  local start
  start=$(proc_start_time "$1") || return 1
  [[ -z ${2:-} || $start == "$2" ]]
}

# The kernel lists each thread's children in /proc/PID/task/TID/children; reading every thread's file
# finds children forked by any thread.
proc_tree() {
  local -a queue=("$1") kids
  local pid f
  proc_stat "$1" || return 1
  while ((${#queue[@]})); do
    pid=${queue[0]} queue=("${queue[@]:1}")
    echo "$pid"
    for f in /proc/"$pid"/task/*/children; do
      kids=()
      read -r -a kids 2>/dev/null <"$f" || true   # the list has no newline at its end: read "fails" with data
      queue+=("${kids[@]}")
    done
  done
}

proc_stop() {
  local group=0
  if [[ ${1:-} == -g ]]; then group=1; shift; fi
  local grace=$1 pid i start
  shift
  PROC_STOP_KILLED=() PROC_STOP_LEFT=()
  local -a pids=() starts=() targets=()
  for pid; do
    [[ -n $pid ]] && start=$(proc_start_time "$pid") || continue
    pids+=("$pid") starts+=("$start") targets+=("$pid")
    if ((group)) && proc_stat "$pid" && [[ $PROC_PGID == "$pid" ]]; then targets[-1]=-$pid; fi
  done
  ((${#pids[@]})) || return 0
  for i in "${!pids[@]}"; do kill -TERM -- "${targets[i]}" 2>/dev/null || true; done
  _proc_wait_gone "$grace" pids starts && return 0
  for i in "${!pids[@]}"; do
    proc_alive "${pids[i]}" "${starts[i]}" || continue
    PROC_STOP_KILLED+=("${pids[i]}")
    kill -KILL -- "${targets[i]}" 2>/dev/null || true
  done
  _proc_wait_gone 5 pids starts && return 0
  for i in "${!pids[@]}"; do proc_alive "${pids[i]}" "${starts[i]}" && PROC_STOP_LEFT+=("${pids[i]}"); done
  return 1
}

# Polls every 0.1 s until none of the named PIDs runs with its recorded start time; reaps our own children
# on the way so they do not linger as zombies. 1 when some still run after SECONDS.
_proc_wait_gone() {
  local -n _pids=$2 _starts=$3
  local i n tries=$(($1 * 10)) left
  for ((n = 0; n <= tries; n++)); do
    left=0
    for i in "${!_pids[@]}"; do
      if proc_alive "${_pids[i]}" "${_starts[i]}"; then left=1; else wait "${_pids[i]}" 2>/dev/null || true; fi
    done
    ((left)) || return 0
    if ((n < tries)); then sleep 0.1; fi
  done
  return 1
}

# `wait` returns early (status > 128) when a trapped signal arrives; the child may still be running, so wait
# again until it is really gone. Traps stay deliverable because bash runs them between the waits.
proc_wait() {
  local pid=$1 rc
  while :; do
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    kill -0 "$pid" 2>/dev/null || return "$rc"
    # 127: not our child (we cannot reap it), so poll until it is gone rather than spin on `wait`.
    if ((rc == 127)); then
      while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
      return 127
    fi
  done
}

# A subshell with its own sleep, so cancelling it does not leave a sleep behind holding the caller's output.
proc_kill_after() {
  local grace=$1 target=$2
  (
    trap 'kill "$sleep_pid" 2>/dev/null; exit 0' TERM
    sleep "$grace" &
    sleep_pid=$!
    wait "$sleep_pid"
    kill -KILL -- "$target" 2>/dev/null
  ) >/dev/null 2>&1 &
  echo $!
}

proc_cancel_kill_after() {
  [[ -n ${1:-} ]] && kill "$1" 2>/dev/null
  return 0
}

_proc_repo() { echo "${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"; }
_proc_venv_bin() { echo "${VENV_DIR:-$(_proc_repo "${1:-}")/.venv}/bin"; }

proc_python() {
  local bin
  bin=$(_proc_venv_bin "${1:-}")
  if [[ -x $bin/python ]]; then echo "$bin/python"; return 0; fi
  command -v python3 || return 1
}

proc_jobkit() {
  local bin
  bin=$(_proc_venv_bin "${1:-}")
  if [[ -x $bin/jobkit ]]; then echo "$bin/jobkit"; return 0; fi
  command -v jobkit && return 0
  echo "$(_proc_repo "${1:-}")/py/bin/jobkit"
}

proc_reaper() {
  local repo python
  repo=$(_proc_repo "${1:-}")
  # No grace: what is left when the command ended had its teardown already (and training ignores TERM).
  if python=$(proc_python "$repo") && "$python" "$repo/py/bin/jobkit" reap -- true 2>/dev/null; then
    printf '%s\0' "$python" "$repo/py/bin/jobkit" reap --grace 0 --
  else
    echo "warning: ${python:-python3} cannot run jobkit reap: a process that detaches from this job may outlive it" >&2
  fi
}
