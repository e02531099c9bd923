#!/usr/bin/env bats
# Core dumps (utils/lib/coredump.sh, COREDUMP=1): the setting's check, the core limit, when core_pattern is
# changed and when it is only reported, its restore (with another job of the node still running), the core
# after a crash, and _train.sh running training as a child for it. A temp file stands in for
# /proc/sys/kernel/core_pattern (COREDUMP_PATTERN_FILE), except where a test says it reads the real one.
# bats runs each test in a subshell on purpose (SC2030/SC2031).
# shellcheck disable=SC2030,SC2031

load test_helper

setup() {
  source "$REPO_DIR/utils/lib/coredump.sh"
  export COREDUMP_PATTERN_FILE=$BATS_TEST_TMPDIR/core_pattern COREDUMP_STATE_DIR=$BATS_TEST_TMPDIR/state
  unset COREDUMP COREDUMP_WAIT
  JOB=$BATS_TEST_TMPDIR/ws/local_1-JAX-tiny
  # The pattern goes through this shell's entry (the kernel keeps 127 bytes of it; a job dir may be longer).
  OURS=$COREDUMP_STATE_DIR/users/$$.$(proc_start_time $$)/core.%h.%e.%p
  HOST=$(uname -n)
  HOST=${HOST%%.*}
}

@test "check: COREDUMP is 0 or 1 and COREDUMP_WAIT seconds; anything else is one line naming the fix, status 2" {
  coredump_check
  COREDUMP=0 coredump_check
  COREDUMP=1 COREDUMP_WAIT=5 coredump_check
  COREDUMP=abc run coredump_check
  [ "$status" -eq 2 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ $output == *"COREDUMP=abc is not 0 or 1; COREDUMP=1 keeps a core dump"* ]]
  COREDUMP=yes run coredump_check
  [ "$status" -eq 2 ]
  COREDUMP=1 COREDUMP_WAIT=0 run coredump_check
  [ "$status" -eq 2 ]
  [[ $output == *"COREDUMP_WAIT=0 is not a positive number of seconds; e.g. COREDUMP_WAIT=60" ]]
}

@test "run_local.sh: COREDUMP=abc is a one-line error before anything is created" {
  export JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws-bad CONTAINER_RUNTIME=none
  COREDUMP=abc run "$REPO_DIR/run_local.sh" tiny -- steps=2
  [ "$status" -eq 2 ]
  [ "$output" = "run_local.sh: COREDUMP=abc is not 0 or 1; COREDUMP=1 keeps a core dump of a crashed training process, COREDUMP=0 (the default) does not" ]
  [ -z "$(ls -A "$JOB_WORKSPACE" 2>/dev/null)" ]
}

@test "the default pattern is pointed at the job's cores/ and put back; the soft core limit goes up to the hard one" {
  echo core >"$COREDUMP_PATTERN_FILE"
  ulimit -Sc 0
  run bash -c 'source "$1"; ulimit -Hc unlimited; coredump_setup "$2" /x/python3; ulimit -Sc' _ "$REPO_DIR/utils/lib/coredump.sh" "$JOB"
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "[coredump] core limit: unlimited (was 0)" ]
  [[ ${lines[1]} =~ ^"[coredump] cores go to: $JOB/cores/ on $HOST (core_pattern set to '$COREDUMP_STATE_DIR/users/"[0-9]+\.[0-9]+"/core.%h.%e.%p', a link to it; was 'core'; restored when training ends)"$ ]]
  [ "${lines[2]}" = "[coredump] executable: /x/python3" ]
  [ "${lines[3]}" = unlimited ]   # the shell that runs training has the raised limit
  [ -d "$JOB/cores" ]
  # run's subshell ended: its registry entry is dead, and the pattern still says ours. In this shell now:
  coredump_setup "$JOB" /x/python3 >/dev/null
  [ "$(cat "$COREDUMP_PATTERN_FILE")" = "$OURS" ]
  [ "$(ls "$COREDUMP_STATE_DIR/users")" = "$$.$(proc_start_time $$)" ]   # the dead entry is gone
  [ "$(readlink "$COREDUMP_STATE_DIR/users/$$.$(proc_start_time $$)")" = "$JOB/cores" ]
  run coredump_restore
  [ "$output" = "[coredump] core_pattern on $HOST: restored to 'core'" ]
  coredump_restore
  [ "$(cat "$COREDUMP_PATTERN_FILE")" = core ]
  [ -z "$(ls "$COREDUMP_STATE_DIR/users")" ]
  coredump_restore   # idempotent: nothing more to say or do
  [ "$(cat "$COREDUMP_PATTERN_FILE")" = core ]
}

@test "a job dir longer than the kernel keeps in a pattern still gets its cores; a state dir that long is refused" {
  echo core >"$COREDUMP_PATTERN_FILE"
  local long
  long=$BATS_TEST_TMPDIR/ws/local_1-JAX-$(printf 'x%.0s' {1..200})
  coredump_setup "$long" python3 >/dev/null
  [ "$(cat "$COREDUMP_PATTERN_FILE")" = "$OURS" ]
  (( ${#OURS} <= 127 ))
  [ "$(readlink "${OURS%/*}")" = "$long/cores" ]
  coredump_restore >/dev/null
  COREDUMP_STATE_DIR=$BATS_TEST_TMPDIR/$(printf 's%.0s' {1..120}) run coredump_setup "$JOB" python3
  [[ ${lines[1]} == *"(core_pattern not changed: '"*"/core.%h.%e.%p' is longer than the kernel's 127 bytes (a shorter COREDUMP_STATE_DIR fixes it))" ]]
  [ "$(cat "$COREDUMP_PATTERN_FILE")" = core ]
}

@test "a hard limit of 0 is said: this node writes no cores" {
  echo core >"$COREDUMP_PATTERN_FILE"
  run bash -c 'source "$1"; ulimit -c 0; coredump_setup "$2" python3' _ "$REPO_DIR/utils/lib/coredump.sh" "$JOB"
  [[ ${lines[0]} == "[coredump] core limit: the hard limit is 0 on $HOST, so this node writes no cores (raise it"* ]]
}

@test "two jobs of one node: the first to end hands the pattern to the other, the last one puts the default back" {
  echo core >"$COREDUMP_PATTERN_FILE"
  # Another job of this node, still running, that set its own pattern.
  sleep 60 &
  local other=$! other_entry other_pattern
  other_entry=$COREDUMP_STATE_DIR/users/$other.$(proc_start_time "$other")
  other_pattern=$other_entry/core.%h.%e.%p
  mkdir -p "$COREDUMP_STATE_DIR/users" "$BATS_TEST_TMPDIR/ws/local_2-JAX-tiny/cores"
  ln -s "$BATS_TEST_TMPDIR/ws/local_2-JAX-tiny/cores" "$other_entry"
  echo "$other_pattern" >"$COREDUMP_PATTERN_FILE"
  run coredump_setup "$JOB" python3   # ours replaces ours
  [[ $output == *"core_pattern set to '$OURS', a link to it; was '$other_pattern'"* ]]
  coredump_setup "$JOB" python3 >/dev/null
  run coredump_restore
  [ "$output" = "[coredump] core_pattern on $HOST: restored to '$other_pattern' (another job of this node still keeps its cores)" ]
  coredump_restore
  [ "$(cat "$COREDUMP_PATTERN_FILE")" = "$other_pattern" ]
  kill "$other"; wait "$other" 2>/dev/null || true
  # The other job died without restoring (KILL): the next job's restore finds its entry dead.
  coredump_setup "$JOB" python3 >/dev/null
  coredump_restore >/dev/null
  [ "$(cat "$COREDUMP_PATTERN_FILE")" = core ]
  [ -z "$(ls "$COREDUMP_STATE_DIR/users")" ]
}

@test "a pattern someone set while training ran is left alone at the end" {
  echo core >"$COREDUMP_PATTERN_FILE"
  coredump_setup "$JOB" python3 >/dev/null
  echo '/var/crash/core.%e' >"$COREDUMP_PATTERN_FILE"
  run coredump_restore
  [ "$output" = "[coredump] core_pattern on $HOST is '/var/crash/core.%e' now (not ours): left as it is" ]
  [ "$(cat "$COREDUMP_PATTERN_FILE")" = /var/crash/core.%e ]
}

@test "patterns that are not ours stay as they are, and the log says where this node's cores go" {
  local pattern
  pattern='|/usr/lib/systemd/systemd-coredump %P %u %g %s %t 9223372036854775808 %h %d %F'
  echo "$pattern" >"$COREDUMP_PATTERN_FILE"
  run coredump_setup "$JOB" python3
  [ "${lines[1]}" = "[coredump] cores go to: systemd-coredump on $HOST: coredumpctl list (core_pattern not changed: it is not the kernel default 'core', and this node's setting is not ours to change)" ]
  [ "$(cat "$COREDUMP_PATTERN_FILE")" = "$pattern" ]
  [ ! -e "$COREDUMP_STATE_DIR/users" ] || [ -z "$(ls "$COREDUMP_STATE_DIR/users")" ]

  echo '|/usr/share/apport/apport -p%p -s%s -c%c -d%d -P%P -u%u -g%g -- %E' >"$COREDUMP_PATTERN_FILE"
  run coredump_setup "$JOB" python3
  [[ ${lines[1]} == "[coredump] cores go to: apport on $HOST: reports in /var/crash (apport-unpack <report> <dir> extracts the CoreDump), cores in /var/lib/apport/coredump (core_pattern not changed: "* ]]

  echo '|/opt/site/bin/crashcollect %p' >"$COREDUMP_PATTERN_FILE"
  run coredump_setup "$JOB" python3
  [[ ${lines[1]} == "[coredump] cores go to: the crash handler /opt/site/bin/crashcollect on $HOST (core_pattern '|/opt/site/bin/crashcollect %p'): ask the node's admin"* ]]

  echo '/var/cores/core.%e.%p' >"$COREDUMP_PATTERN_FILE"
  run coredump_setup "$JOB" python3
  [[ ${lines[1]} == "[coredump] cores go to: /var/cores/ on $HOST (core_pattern '/var/cores/core.%e.%p') (core_pattern not changed: "* ]]
  [ "$(cat "$COREDUMP_PATTERN_FILE")" = /var/cores/core.%e.%p ]

  echo 'dumps/core' >"$COREDUMP_PATTERN_FILE"
  run coredump_setup "$JOB" python3
  [[ ${lines[1]} == "[coredump] cores go to: $PWD/dumps/ on $HOST, relative to the crashing process's working directory"* ]]
}

@test "not root: the pattern cannot be set, and the log says where cores go (the real core_pattern too)" {
  command -v setpriv >/dev/null || skip "no setpriv to drop root"
  (( EUID == 0 )) || skip "needs root to become another user"
  # bats' own temp dirs are root's alone: the unprivileged user works in one it can reach.
  local dir
  dir=$(mktemp -d /tmp/coredump-bats.XXXXXX)
  chmod 755 "$dir"
  echo core >"$dir/core_pattern"
  mkdir -m 777 "$dir/job"
  # The library from a copy nobody can read: the checkout itself may sit in a 700 dir (mktemp -d).
  mkdir -m 755 "$dir/lib"
  cp "$REPO_DIR/utils/lib/coredump.sh" "$REPO_DIR/utils/lib/process.sh" "$REPO_DIR/utils/lib/settings.sh" "$dir/lib/"
  chmod 644 "$dir/lib/"*
  local -a as_nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="$dir" COREDUMP_STATE_DIR="$dir/state")
  run "${as_nobody[@]}" COREDUMP_PATTERN_FILE="$dir/core_pattern" bash -c 'cd "$2"; source "$1"; coredump_setup "$2/job" python3' _ "$dir/lib/coredump.sh" "$dir"
  [ "$status" -eq 0 ]
  [ "${lines[1]}" = "[coredump] cores go to: $dir/ on $HOST, the crashing process's working directory (core_pattern 'core') (core_pattern not changed: only root may change it)" ]
  [ "$(cat "$dir/core_pattern")" = core ]
  # The node's real core_pattern, which no unprivileged process may write.
  local real
  real=$(cat /proc/sys/kernel/core_pattern)
  run "${as_nobody[@]}" bash -c 'unset COREDUMP_PATTERN_FILE; source "$1"; coredump_setup "$2/job" python3' _ "$dir/lib/coredump.sh" "$dir"
  rm -rf "$dir"
  [ "$status" -eq 0 ]
  [[ ${lines[1]} == "[coredump] cores go to: "*" on $HOST"*"(core_pattern not changed: only root may change it)" ]]
  [ "$(cat /proc/sys/kernel/core_pattern)" = "$real" ]
}

@test "after a dumping signal: waits while the core grows, then names it with its size" {
  echo core >"$COREDUMP_PATTERN_FILE"
  coredump_setup "$JOB" python3 >/dev/null
  coredump_restore >/dev/null
  local core=$JOB/cores/core.$HOST.python3.4242
  # A core still being written (a pipe handler, a slow filesystem): 3 more appends, 1 s apart.
  (for i in 1 2 3 4; do head -c 1048576 /dev/zero >>"$core"; sleep 1; done) &
  local writer=$!
  sleep 0.2
  run coredump_after 139 4242
  wait "$writer"
  [ "${lines[0]}" = "[coredump] training killed by SIGSEGV (exit 139) on $HOST" ]
  [ "${lines[1]}" = "== CORE DUMP $core (4.0MiB) ==" ]
  # Another node's core in the shared dir (its %h), and a leftover from before training started, are not ours.
  touch -d '1 hour ago' "$JOB/cores/core.$HOST.python3.1"
  : >"$JOB/cores/core.othernode.python3.4243"
  run coredump_after 134 4242
  [ "${lines[1]}" = "== CORE DUMP $core (4.0MiB) ==" ]
}

@test "after a dumping signal without a core: where the node sends cores; other exits say nothing" {
  echo '|/usr/lib/systemd/systemd-coredump %P %u %g %s %t %c %h' >"$COREDUMP_PATTERN_FILE"
  coredump_setup "$JOB" python3 >/dev/null
  SECONDS=0
  COREDUMP_WAIT=2 run coredump_after 134 777
  [ "${lines[0]}" = "[coredump] training killed by SIGABRT (exit 134) on $HOST" ]
  [ "${lines[1]}" = "== NO CORE DUMP (SIGABRT) on $HOST: cores go to systemd-coredump on $HOST: coredumpctl list; coredumpctl info 777; coredumpctl debug 777; core limit $(ulimit -Sc) ==" ]
  ((SECONDS <= 4))   # waited for a core to appear, bounded by COREDUMP_WAIT
  run coredump_after 143 777   # SIGTERM does not dump core
  [ -z "$output" ]
  run coredump_after 1 777
  [ -z "$output" ]
}

# _train.sh with COREDUMP=1, a stub interpreter and the stand-in pattern file.
train_env() {
  export JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws JOB_DIR=local_1-JAX-tiny HANG_TIMEOUT=off COREDUMP=1 TRAIN_PYTHON=fakepython
  export GPU_DETECT_ROOT=$BATS_TEST_TMPDIR/nogpu
  mkdir -p "$JOB_WORKSPACE/$JOB_DIR"
  echo core >"$COREDUMP_PATTERN_FILE"
}

@test "_train.sh: training dies of SIGSEGV: exit 139, the pattern restored, the signal and the missing core said" {
  # The stub is training: it checks the pattern is set while it runs, then crashes without a core of its own
  # (its limit is 0, so nothing lands in this directory).
  make_stub fakepython '[[ $1 == -c ]] && { echo /opt/py/bin/python3; exit 0; }; [[ $* == *" launch "* ]] || exit 0; grep -q "%h.%e.%p" "$COREDUMP_PATTERN_FILE" || exit 9; ulimit -c 0; kill -SEGV $$'
  train_env
  run "$REPO_DIR/_train.sh" tiny -- steps=3
  [ "$status" -eq 139 ]
  [[ $output == *"[coredump] executable: /opt/py/bin/python3"* ]]
  [[ $output == *"[coredump] core_pattern on $HOST: restored to 'core'"* ]]
  [[ $output == *"[coredump] training killed by SIGSEGV (exit 139) on $HOST"* ]]
  [[ $output == *"== NO CORE DUMP (SIGSEGV) on $HOST: cores go to $JOB/cores/ on $HOST; core limit "* ]]
  [ "$(cat "$COREDUMP_PATTERN_FILE")" = core ]
}

@test "_train.sh: a TERM to the training tier reaches training, which is still a child (exit 143, pattern restored)" {
  make_stub fakepython '[[ $1 == -c ]] && exit 1; [[ $* == *" launch "* ]] || exit 0; trap "echo got-TERM; kill \$!; exit 143" TERM; sleep 30 & wait'
  train_env
  "$REPO_DIR/_train.sh" tiny >"$BATS_TEST_TMPDIR/out" 2>&1 &
  local pid=$! i rc=0
  for ((i = 0; i < 50; i++)); do grep -q 'executable:' "$BATS_TEST_TMPDIR/out" && break; sleep 0.1; done
  sleep 0.5
  kill -TERM "$pid"
  wait "$pid" || rc=$?
  cat "$BATS_TEST_TMPDIR/out"
  [ "$rc" -eq 143 ]
  grep -q got-TERM "$BATS_TEST_TMPDIR/out"
  grep -q "executable: $BATS_TEST_TMPDIR/stubs/fakepython" "$BATS_TEST_TMPDIR/out"   # fallback: the command itself
  [ "$(cat "$COREDUMP_PATTERN_FILE")" = core ]
  ! grep -q 'CORE DUMP' "$BATS_TEST_TMPDIR/out"
}

@test "_train.sh: COREDUMP=abc stops the job before training" {
  make_stub fakepython 'echo TRAINING-RAN'
  train_env
  COREDUMP=abc run "$REPO_DIR/_train.sh" tiny
  [ "$status" -eq 2 ]
  [[ $output == *"_train.sh: COREDUMP=abc is not 0 or 1"* ]]
  [[ $output != *TRAINING-RAN* ]]
  [ "$(cat "$COREDUMP_PATTERN_FILE")" = core ]
}
