#!/usr/bin/env bats
# utils/container_init.sh, PID 1 of every training container: signals reach training, its status is kept.
# Literal $ in single quotes is meant (SC2016).
# shellcheck disable=SC2016

load test_helper

INIT=$BATS_TEST_DIRNAME/../../utils/container_init.sh

setup() {
  STARTED=()
}

# Each init runs in a process group of its own (setsid), so that teardown stops its command too: an orphaned
# command would keep bats' output pipe open and hang the whole run.
teardown() {
  local pid
  for pid in "${STARTED[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true; done
}

# wait_for_line FILE TEXT: up to 10 s.
wait_for_line() {
  local i
  for ((i = 0; i < 200; i++)); do
    grep -qF "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "timed out waiting for '$2' in $1:"; cat "$1"
  return 1
}

# A child that reports the signals it gets and exits 7 on TERM.
CHILD='trap "echo got-HUP" HUP; trap "echo got-TERM; exit 7" TERM; echo ready; while :; do sleep 0.1; done'

@test "no command: exit 2 with a usage line; --help prints the header" {
  run "$INIT"
  [ "$status" -eq 2 ]
  [[ $output == *"no command given; usage: container_init.sh COMMAND"* ]]
  run "$INIT" --help
  [ "$status" -eq 0 ]
  [[ ${lines[0]} == "Usage: utils/container_init.sh COMMAND [ARG...]" ]]
}

@test "exit status and arguments are the command's" {
  run "$INIT" bash -c 'printf "[%s]" "$@"; exit 5' _ "a b" '' 'c'
  [ "$status" -eq 5 ]
  [ "$output" = "[a b][][c]" ]
}

@test "TERM and HUP are passed to the command; the init waits for it and exits with its status" {
  # Under nohup HUP is ignored from the start, and a shell cannot trap a signal ignored on entry.
  local ignored
  ignored=$(sed -n 's/^SigIgn:[[:space:]]*//p' /proc/$$/status)
  (( (16#$ignored & 1) == 0 )) || skip "SIGHUP is ignored in this environment (nohup?): it cannot be trapped"
  local out=$BATS_TEST_TMPDIR/out
  setsid "$INIT" bash -c "$CHILD" >"$out" 2>&1 &
  local pid=$!
  STARTED+=("$pid")
  wait_for_line "$out" ready
  kill -HUP "$pid"
  wait_for_line "$out" got-HUP
  kill -TERM "$pid"
  local rc=0
  wait "$pid" || rc=$?
  [ "$rc" -eq 7 ]
  grep -qx got-TERM "$out"
}

@test "as PID 1 of a new PID namespace, a TERM from outside still reaches the command" {
  [[ $(id -u) == 0 ]] || skip "needs root for a PID namespace"
  command -v unshare >/dev/null || skip "no unshare"
  local out=$BATS_TEST_TMPDIR/out
  unshare --pid --fork --kill-child "$INIT" bash -c "$CHILD" >"$out" 2>&1 &
  local outer=$! pid1="" i
  STARTED+=("$outer")
  wait_for_line "$out" ready
  # The init is unshare's only child; in the namespace it is PID 1.
  for ((i = 0; i < 50; i++)); do
    pid1=$(cat "/proc/$outer/task/$outer/children" 2>/dev/null | tr -d ' ')
    [[ -n $pid1 ]] && break
    sleep 0.1
  done
  [ -n "$pid1" ]
  grep -q '^NSpid:.*[[:space:]]1$' "/proc/$pid1/status"
  kill -TERM "$pid1"
  local rc=0
  wait "$outer" || rc=$?
  [ "$rc" -eq 7 ]
  grep -qx got-TERM "$out"
}
