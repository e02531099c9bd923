#!/usr/bin/env bats
# utils/lib/process.sh against real processes: stat fields, trees, stopping by PID, signal-safe waits.

load test_helper
bats_require_minimum_version 1.5.0

setup() {
  # shellcheck source=utils/lib/process.sh
  source "$REPO_DIR/utils/lib/process.sh"
  STARTED=()
}

teardown() {
  local pid
  for pid in "${STARTED[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

# spawn CMD...: runs CMD in the background, records its PID in SPAWNED and STARTED (for teardown).
spawn() {
  "$@" &
  SPAWNED=$!
  STARTED+=("$SPAWNED")
}

# tree_of ROOT N: waits (up to 10 s, a loaded machine forks slowly) until ROOT's tree has N processes, and
# leaves them in TREE.
tree_of() {
  local i
  for ((i = 0; i < 100; i++)); do
    mapfile -t TREE < <(proc_tree "$1")
    ((${#TREE[@]} >= $2)) && return 0
    sleep 0.1
  done
  return 1
}

@test "proc_stat reads state, parent, group and start time, also for a name with spaces and parentheses" {
  spawn bash -c 'exec -a "odd (name) x" sleep 30'
  sleep 0.2
  proc_stat "$SPAWNED"
  [ "$PROC_PPID" = "$$" ]
  [[ $PROC_STATE == [SR] ]]
  [ "$PROC_START" = "$(cut -d' ' -f22 "/proc/$SPAWNED/stat")" ]   # comm "sleep" has no spaces: plain fields
  [ "$PROC_PGID" = "$(ps -o pgid= -p "$SPAWNED" | tr -d ' ')" ]
  run proc_stat 999999999
  [ "$status" -eq 1 ]
}

@test "proc_alive: a zombie and a changed start time count as gone" {
  # The child's parent execs a sleep that never reaps it, so once it exits it stays a zombie.
  spawn bash -c "sleep 0.3 & echo \$! >'$BATS_TEST_TMPDIR/child'; exec sleep 30"
  tree_of "$SPAWNED" 2
  local pid start
  pid=$(<"$BATS_TEST_TMPDIR/child")
  start=$(proc_start_time "$pid")
  proc_alive "$pid" "$start"
  run proc_alive "$pid" "$((start + 1))"
  [ "$status" -eq 1 ]
  for ((i = 0; i < 50; i++)); do [ "$(cut -d' ' -f3 "/proc/$pid/stat")" = Z ] && break; sleep 0.1; done
  [ "$(cut -d' ' -f3 "/proc/$pid/stat")" = Z ]
  run proc_alive "$pid"
  [ "$status" -eq 1 ]
}

@test "proc_tree lists a process and all its descendants, parents first" {
  spawn bash -c 'sleep 30 & bash -c "sleep 31 & wait" & wait'
  local root=$SPAWNED
  tree_of "$root" 4
  [ "${TREE[0]}" = "$root" ]
  [ "${#TREE[@]}" -eq 4 ]   # root bash, sleep 30, inner bash, sleep 31
  local pid i
  for i in "${!TREE[@]}"; do
    ((i)) || continue
    proc_stat "${TREE[i]}"
    [[ " ${TREE[*]:0:i} " == *" $PROC_PPID "* ]]   # its parent was listed before it
  done
  run proc_tree 999999999
  [ "$status" -eq 1 ]
  proc_stop -g 2 "$root"
}

@test "proc_stop: TERM ends a polite process without KILL" {
  spawn sleep 30
  proc_stop 5 "$SPAWNED"
  [ "${#PROC_STOP_KILLED[@]}" -eq 0 ]
  run proc_alive "$SPAWNED"
  [ "$status" -eq 1 ]
}

@test "proc_stop: a process that ignores TERM is KILLed after the grace period, and said so" {
  spawn bash -c 'trap "" TERM; while :; do sleep 0.1; done'
  local stubborn=$SPAWNED
  spawn sleep 30
  local polite=$SPAWNED
  sleep 0.2
  local t0=$SECONDS
  proc_stop 1 "$stubborn" "$polite"
  [ "${PROC_STOP_KILLED[*]}" = "$stubborn" ]
  [ "${#PROC_STOP_LEFT[@]}" -eq 0 ]
  (( SECONDS - t0 <= 4 ))
  run proc_alive "$stubborn"
  [ "$status" -eq 1 ]
}

@test "proc_stop -g stops a whole process group; without -g only the PID" {
  spawn setsid bash -c 'sleep 30 & sleep 31 & wait'
  local leader=$SPAWNED
  tree_of "$leader" 3
  local -a members=("${TREE[@]}")
  proc_stat "$leader"
  [ "$PROC_PGID" = "$leader" ]
  proc_stop -g 2 "$leader"
  local pid
  for pid in "${members[@]}"; do run proc_alive "$pid"; [ "$status" -eq 1 ]; done

  spawn setsid bash -c 'sleep 30 & wait'
  leader=$SPAWNED
  tree_of "$leader" 2
  proc_stop 2 "$leader"
  proc_alive "${TREE[1]}"   # the child keeps running
  kill "${TREE[1]}"
}

@test "proc_stop leaves gone and unknown PIDs alone and returns at once" {
  local t0=$SECONDS
  proc_stop 5 999999999 ""
  (( SECONDS - t0 <= 1 ))
}

# The whole tree is stopped, grandchild too: a sleep left running would hold bats' output pipe for its 31 s.
@test "the toolkit works in a caller that runs with set -euo pipefail" {
  run bash -c "set -euo pipefail; source '$REPO_DIR/utils/lib/process.sh'
    sleep 30 & p=\$!; bash -c 'sleep 31 >/dev/null 2>&1 & wait' & q=\$!
    sleep 0.3; tree=\$(proc_tree \$q); wc -l <<<\"\$tree\"; kill \$p; sleep 0.2
    proc_stop 2 \$p \$tree; echo stopped"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = 2 ]
  [ "${lines[1]}" = stopped ]
}

@test "proc_wait returns the child's status even when a trapped signal interrupts wait" {
  local got
  trap 'got=usr1' USR1
  spawn bash -c 'sleep 1; exit 7'
  local child=$SPAWNED
  (sleep 0.3; kill -USR1 $$) &
  local rc=0
  proc_wait "$child" || rc=$?
  trap - USR1
  [ "$got" = usr1 ]
  [ "$rc" -eq 7 ]
}

@test "proc_wait on a PID that is not our child waits for it to end and returns 127" {
  sleep 0.5 &
  local other=$!
  run -127 bash -c "source '$REPO_DIR/utils/lib/process.sh'; proc_wait $other"
  [ "$status" -eq 127 ]
  run proc_alive "$other"
  [ "$status" -eq 1 ]
}

@test "proc_kill_after KILLs a target that outlives the grace; cancelling spares it" {
  spawn bash -c 'trap "" TERM; sleep 30'
  local target=$SPAWNED watcher
  watcher=$(proc_kill_after 0.3 "$target")
  sleep 1
  run proc_alive "$target"
  [ "$status" -eq 1 ]
  spawn sleep 30
  target=$SPAWNED
  watcher=$(proc_kill_after 0.5 "$target")
  proc_cancel_kill_after "$watcher"
  sleep 1
  proc_alive "$target"
}

@test "proc_python and proc_jobkit prefer the venv, then PATH, then the checkout's own entry" {
  [ "$(proc_python)" = "$REPO_DIR/.venv/bin/python" ]
  [ "$(proc_jobkit)" = "$REPO_DIR/.venv/bin/jobkit" ]
  VENV_DIR=$BATS_TEST_TMPDIR/none PATH=/usr/bin:/bin run proc_jobkit
  [ "$output" = "$REPO_DIR/py/bin/jobkit" ]
  VENV_DIR=$BATS_TEST_TMPDIR/none PATH=/usr/bin:/bin run proc_python
  [ "$output" = "$(PATH=/usr/bin:/bin command -v python3)" ]
  # the checkout's entry really runs the CLI
  run "$REPO_DIR/.venv/bin/python" "$REPO_DIR/py/bin/jobkit" mfu --list
  [ "$status" -eq 0 ]
  [[ $output == *"known accelerators"* ]]
}

@test "py/bin/jobkit under a Python without jobkit's libraries says what to install in one line" {
  local bare=/usr/bin/python3
  "$bare" -c 'import click' 2>/dev/null && skip "the system python3 has click"
  run "$bare" -I "$REPO_DIR/py/bin/jobkit" tgs some.log
  [ "$status" -eq 6 ]   # EXIT_SETUP: this machine lacks what jobkit needs (tests/py/test_errors.py)
  [ "${#lines[@]}" -eq 1 ]
  [[ $output == "jobkit: $bare cannot import click; install jobkit's tools with utils/setup_env.sh --tools"* ]]
}

@test "proc_table lists every process once with the same fields proc_stat reads" {
  spawn setsid bash -c 'sleep 30 & wait'
  tree_of "$SPAWNED" 2
  local row pid state ppid pgid sid start n=0
  while read -r pid state ppid pgid sid start; do
    [[ $pid == "${TREE[1]}" ]] || continue
    n=$((n + 1))
    proc_stat "$pid"
    [ "$state $ppid $pgid $sid $start" = "$PROC_STATE $PROC_PPID $PROC_PGID $PROC_SID $PROC_START" ]
    [ "$ppid" = "$SPAWNED" ] && [ "$sid" = "$SPAWNED" ]   # setsid made the bash a session leader
  done < <(proc_table)
  [ "$n" -eq 1 ]
  [ "$(proc_table | wc -l)" -ge "$(find /proc -maxdepth 1 -name '[0-9]*' | wc -l | awk '{print int($1 * 0.9)}')" ]
  proc_stop -g 2 "$SPAWNED"
}

@test "proc_reaper: the words that run a command under jobkit reap; nothing but a warning when Python cannot run it" {
  local -a words=()
  mapfile -d '' -t words < <(proc_reaper "$REPO_DIR")
  [ "${words[*]: -4}" = "reap --grace 0 --" ]
  [ "${words[1]}" = "$REPO_DIR/py/bin/jobkit" ]
  run "${words[@]}" bash -c 'exit 5'
  [ "$status" -eq 5 ]
  # A Python without click (an image's bare interpreter): the caller runs the command as it is, and says why.
  mkdir -p "$BATS_TEST_TMPDIR/venv/bin"
  printf '#!/bin/sh\nexit 1\n' >"$BATS_TEST_TMPDIR/venv/bin/python"
  chmod +x "$BATS_TEST_TMPDIR/venv/bin/python"
  VENV_DIR=$BATS_TEST_TMPDIR/venv run proc_reaper "$REPO_DIR"
  [ "$status" -eq 0 ]
  [ "$output" = "warning: $BATS_TEST_TMPDIR/venv/bin/python cannot run jobkit reap: a process that detaches from this job may outlive it" ]
}
