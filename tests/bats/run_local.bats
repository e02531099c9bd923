#!/usr/bin/env bats
# run_local.sh front door: every bad input gives one clear line, a non-zero exit, and creates nothing.
# (Real training through run_local.sh is exercised end to end in tests/py/test_run_local.py.)

load test_helper

setup() {
  export JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws CONTAINER_RUNTIME=none
}

# bad_input ARGS...: runs run_local.sh, expects failure with a one-line error and no workspace.
bad_input() {
  run "$REPO_DIR/run_local.sh" "$@"
  [ "$status" -ne 0 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ ${lines[0]} == run_local.sh:* ]]
  [ ! -e "$JOB_WORKSPACE" ]
}

@test "--help prints usage" {
  run "$REPO_DIR/run_local.sh" --help
  [ "$status" -eq 0 ]
  [[ ${lines[0]} == "Usage: run_local.sh"* ]]
}

@test "unknown model" {
  bad_input nosuchmodel
  [[ $output == *"unknown model 'nosuchmodel'; known models:"*tiny* ]]
}

@test "ambiguous short name" {
  bad_input llama3
  [[ $output == *"ambiguous model 'llama3' matches:"* ]]
}

@test "too many colons" {
  bad_input a:b:c:d
  [[ $output == *"too many ':'"* ]]
}

@test "empty spec" {
  bad_input ""
  [[ $output == *"empty model spec"* ]]
}

@test "passthrough arg that is not key=value" {
  bad_input tiny -- steps
  [[ $output == *"not key=value"* ]]
}

@test "_env_ with no name, and with no =" {
  bad_input tiny -- _env_=1
  [[ $output == *"names no variable"* ]]
  bad_input tiny -- _env_FOO
  [[ $output == *"has no '='"* ]]
}

@test "over-long job name says what to shorten" {
  bad_input tiny -- "run_name=$(printf 'x%.0s' $(seq 240))"
  [[ $output == *"limit 255"*"shorten the passthrough args or use model:alias:tag"* ]]
}

@test "scheduler options are refused: overrides belong after --" {
  bad_input tiny steps=5
  [[ $output == *"MaxText overrides go after '--'"* ]]
}

@test "an error line ends with its hint, not with the exit code" {
  bad_input tiny -N 2
  [ "$status" -eq 2 ]
  [[ $output == *"(run_local.sh tiny -- steps=10)" ]]
}

@test "-N before the model: says run_local.sh runs on this machine and suggests commands that work" {
  bad_input -N 2 tiny -- steps=3
  [ "$status" -eq 2 ]
  [[ $output == *"'-N' is not a model"* ]]
  [[ $output == *"run_local.sh tiny -- steps=3;"* ]]
  [[ $output == *"submit.sh tiny -N <nodes> -- steps=3" ]]
  [[ $output != *"run_local.sh tiny -N"* ]]
  # the suggested run_local.sh command gets past the argument checks (it fails later only on the workspace)
  JOB_WORKSPACE=/proc/ws run "$REPO_DIR/run_local.sh" tiny -- steps=3
  [[ $output == *"JOB_WORKSPACE=/proc/ws is not writable"* ]]
  bad_input -N 2 nosuchmodel
  [[ $output == *"run_local.sh <model>;"* ]]
}

@test "unknown CONTAINER_RUNTIME" {
  CONTAINER_RUNTIME=lxc bad_input tiny
  [[ $output == *"CONTAINER_RUNTIME"*lxc* ]]
}

@test "JOB_WORKSPACE under a file, and on a filesystem that refuses new files" {
  touch "$BATS_TEST_TMPDIR/file"
  JOB_WORKSPACE=$BATS_TEST_TMPDIR/file/ws run "$REPO_DIR/run_local.sh" tiny
  [ "$status" -ne 0 ]
  [[ $output == *"not a directory; set JOB_WORKSPACE"* ]]
  JOB_WORKSPACE=/proc/ws run "$REPO_DIR/run_local.sh" tiny
  [ "$status" -ne 0 ]
  [[ $output == *"JOB_WORKSPACE=/proc/ws is not writable"* ]]
  [ ! -e /proc/ws ]
}

@test "no Python >= 3.12 for the venv: clear error, no job created" {
  VENV_DIR=$BATS_TEST_TMPDIR/venv PYTHON=/usr/bin/python3.11 run "$REPO_DIR/run_local.sh" tiny
  [ "$status" -ne 0 ]
  [[ $output == *"not a working Python >= 3.12"* ]]
  [ ! -e "$JOB_WORKSPACE" ]
  [ ! -e "$BATS_TEST_TMPDIR/venv" ]
}

@test "no arguments: an interactive shell in the training environment (native venv)" {
  run bash -c "echo 'echo VENV=\$VIRTUAL_ENV; echo PY=\$(command -v python3); exit 7' | '$REPO_DIR/run_local.sh' 2>/dev/null"
  [ "$status" -eq 7 ]
  [[ $output == *"VENV=$REPO_DIR/.venv"* ]]
  [[ $output == *"PY=$REPO_DIR/.venv/bin/python3"* ]]
  [ ! -e "$JOB_WORKSPACE" ]
}

@test "a checkpoint dir of the alias that is another user's is refused before anything is made" {
  [[ $EUID == 0 ]] || skip "planting a teammate's dir needs root (chown)"
  mkdir -p "$JOB_WORKSPACE/ck1/tiny/checkpoints/2" && chown -R 65534:65534 "$JOB_WORKSPACE/ck1"
  run "$REPO_DIR/run_local.sh" tiny:ck1: -- enable_checkpointing=true
  [ "$status" -eq 2 ]
  [ "${#lines[@]}" -eq 1 ]
  [ "${lines[0]}" = "run_local.sh: checkpoint dir $JOB_WORKSPACE/ck1 belongs to uid 65534, not to you (uid 0): enable_checkpointing=true would resume from their checkpoint and write into it; use an alias of your own (model:<alias>:) or your own JOB_WORKSPACE" ]
  [ "$(ls -A "$JOB_WORKSPACE")" = ck1 ]   # no job dir, no log
  # A link of theirs to their run is refused the same way.
  mv "$JOB_WORKSPACE/ck1" "$JOB_WORKSPACE/theirs" && ln -s theirs "$JOB_WORKSPACE/ck1"
  run "$REPO_DIR/run_local.sh" tiny:ck1: -- enable_checkpointing=true
  [ "$status" -eq 2 ]
  [[ ${lines[0]} == *"ck1 belongs to uid 0/65534, not to you"* ]]
}

# refused_before_job ARGS...: run_local.sh refuses in one line (exit 2) and the workspace holds only what the
# test put there: no log, no job dir.
refused_before_job() {
  local before
  before=$(cd "$JOB_WORKSPACE" && find . | sort)
  run "$REPO_DIR/run_local.sh" "$@"
  [ "$status" -eq 2 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ ${lines[0]} == run_local.sh:* ]]
  [ "$(cd "$JOB_WORKSPACE" && find . | sort)" = "$before" ]
}

@test "a bad TUNE_PROFILE_FILE is refused before a job id, log or job dir exists (tp1-tp5)" {
  mkdir -p "$JOB_WORKSPACE/tp"
  TUNE_PROFILE_FILE=nosuch.profile refused_before_job tiny -- steps=3
  [[ $output == *"TUNE_PROFILE_FILE=nosuch.profile: no readable file at $JOB_WORKSPACE/nosuch.profile"* ]]
  TUNE_PROFILE_FILE=tp refused_before_job tiny -- steps=3
  [[ $output == *"TUNE_PROFILE_FILE=tp: $JOB_WORKSPACE/tp is a directory"* ]]
  printf '%s\n' '--xla_cpu_enable_fast_math=true' 'this is not a flag' >"$JOB_WORKSPACE/tp/badline.profile"
  TUNE_PROFILE_FILE=tp/badline.profile refused_before_job tiny -- steps=3
  [[ $output == *"tp/badline.profile:2: 'this is not a flag' is not an XLA flag"* ]]
  printf '%s\n' '# a comment' 'FOO BAR=1' >"$JOB_WORKSPACE/tp/badname.profile"
  TUNE_PROFILE_FILE=tp/badname.profile refused_before_job tiny -- steps=3
  [[ $output == *"tp/badname.profile:2: 'FOO BAR=1' is not an XLA flag"* ]]
  printf '%s\n' 'LD_PRELOAD=/tmp/evil.so' >"$JOB_WORKSPACE/tp/preload.profile"
  TUNE_PROFILE_FILE=tp/preload.profile refused_before_job tiny -- steps=3
  [[ $output == *"tp/preload.profile:1: LD_PRELOAD is not a tuning variable"* ]]
  printf '%s\n' 'NCCL_PROTO=Simple' >"$JOB_WORKSPACE/tp/shared.profile"
  chmod 0666 "$JOB_WORKSPACE/tp/shared.profile"
  TUNE_PROFILE_FILE=$JOB_WORKSPACE/tp/shared.profile refused_before_job tiny -- steps=3
  [[ $output == *"(owner uid $EUID, mode 666) is not a file only you can write"* ]]
}

@test "a binary TUNE_PROFILE_FILE is refused in one line of text, its bytes not echoed (tp3)" {
  mkdir -p "$JOB_WORKSPACE"
  printf 'NCCL_X=\001\033[2J\000\377\n' >"$JOB_WORKSPACE/garbage.profile"
  TUNE_PROFILE_FILE=garbage.profile refused_before_job tiny -- steps=3
  [[ $output == *"garbage.profile is not a text file (it holds control bytes)"* ]]
  [[ $output != *[[:cntrl:]]* ]]
}

@test "_env_TUNE_PROFILE_FILE after -- is checked the same way, and its quotes taken off as _train.sh does" {
  mkdir -p "$JOB_WORKSPACE"
  refused_before_job tiny -- steps=3 "_env_TUNE_PROFILE_FILE='missing.profile'"
  [[ $output == *"TUNE_PROFILE_FILE=missing.profile: no readable file at $JOB_WORKSPACE/missing.profile"* ]]
}

@test "an unknown TUNE_PROFILE name is refused before the job exists, listing the names (tp6)" {
  mkdir -p "$JOB_WORKSPACE"
  TUNE_PROFILE=nosuch refused_before_job tiny -- steps=3
  [[ $output == *"TUNE_PROFILE='nosuch' is not a tuning profile; use one of: "*" restore_default "* ]]
  refused_before_job tiny -- _env_TUNE_PROFILE=ag_combine_2g
  [[ $output == *"TUNE_PROFILE='ag_combine_2g' is not a tuning profile"* ]]
}

# bad_procs ARGS...: run_local.sh refuses a LOCAL_WORLD_SIZE in one line with exit 2, and leaves no job behind.
bad_procs() {
  mkdir -p "$JOB_WORKSPACE"
  run "$REPO_DIR/run_local.sh" "$@"
  [ "$status" -eq 2 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ ${lines[0]} == *"; set 1..64"* ]]
  [ -z "$(find "$JOB_WORKSPACE" -mindepth 1 -name 'local_*')" ]
}

@test "a bad LOCAL_WORLD_SIZE (0, x, _env_ abc) is refused in one line naming the fix, and no job is left" {
  LOCAL_WORLD_SIZE=0 bad_procs tiny -- steps=6
  [[ $output == *"LOCAL_WORLD_SIZE=0 is not a process count per node; set 1..64"* ]]
  LOCAL_WORLD_SIZE=x bad_procs tiny -- steps=6
  [[ $output == *"LOCAL_WORLD_SIZE=x is not a whole number; set 1..64"* ]]
  bad_procs tiny -- steps=6 _env_LOCAL_WORLD_SIZE=abc
  [[ $output == *"LOCAL_WORLD_SIZE=abc is not a whole number; set 1..64"* ]]
  # Every value given is checked: a bad one in the environment is refused though an _env_ one would win.
  LOCAL_WORLD_SIZE=65 bad_procs tiny -- steps=6 _env_LOCAL_WORLD_SIZE=2
  [[ $output == *"LOCAL_WORLD_SIZE=65 is not a process count per node"* ]]
}
