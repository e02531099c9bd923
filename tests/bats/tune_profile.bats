#!/usr/bin/env bats
# TUNE_PROFILE_FILE: a tuning profile as data (what `jobkit sweep xla` writes per catalog profile), read by
# train_env.sh's apply_tune_profile after the named TUNE_PROFILE and before the _env_ overrides. The
# Python interpreter is a stub that records the environment training would get.

load test_helper

setup() {
  REPO=$(copy_repo)
  export JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws JOB_DIR=local_1-JAX-tiny MODEL_NAME_ALIAS=""
  mkdir -p "$JOB_WORKSPACE/$JOB_DIR"
  export GPU_DETECT_ROOT=$BATS_TEST_TMPDIR/nogpu   # CPU node: XLA_FLAGS starts as the device-count flag
  unset XLA_FLAGS TUNE_PROFILE TUNE_PROFILE_FILE ENABLE_XLA_DUMP JAX_PLATFORMS XLA_PYTHON_CLIENT_MEM_FRACTION NCCL_PROTO
  RECORD=$BATS_TEST_TMPDIR/record
  make_stub fakepython "printf '%s\n' \"\$@\" >'$RECORD.argv'; env >'$RECORD.env'"
  export TRAIN_PYTHON=fakepython HANG_TIMEOUT=off   # no watchdog process calling the stub beside training
  PROFILE=$JOB_WORKSPACE/profiles/p.profile
  mkdir -p "${PROFILE%/*}"
}

env_of() { sed -n "s/^$1=//p" "$RECORD.env"; }
BASE_FLAGS=--xla_force_host_platform_device_count=1

@test "flags are appended in file order after the model env file; NAME=VALUE lines are exported" {
  echo 'append_xla_flags --xla_cpu_enable_fast_math=false' >"$REPO/configs/tiny.env.sh"
  printf '%s\n' '# a comment' '' '--xla_cpu_enable_fast_math=true' '  NCCL_PROTO=Simple  ' \
    '--xla_cpu_multi_thread_eigen=false' 'NCCL_TWO_WORDS=a b=c' >"$PROFILE"
  run "$REPO/_train.sh" tiny -- "_env_TUNE_PROFILE_FILE=$PROFILE"
  [ "$status" -eq 0 ]
  [ "$(env_of XLA_FLAGS)" = "$BASE_FLAGS --xla_cpu_enable_fast_math=false --xla_cpu_enable_fast_math=true --xla_cpu_multi_thread_eigen=false" ]
  [ "$(env_of NCCL_PROTO)" = Simple ]
  [ "$(env_of NCCL_TWO_WORDS)" = "a b=c" ]
  [[ $output == *"TUNE_PROFILE_FILE=$PROFILE applied: 2 XLA flag(s), 2 setting(s)"* ]]
}

@test "a relative path starts at JOB_WORKSPACE (the container sees the workspace elsewhere)" {
  printf '%s\n' '--xla_cpu_use_thunk_runtime=false' >"$PROFILE"
  "$REPO/_train.sh" tiny -- _env_TUNE_PROFILE_FILE=profiles/p.profile
  [ "$(env_of XLA_FLAGS)" = "$BASE_FLAGS --xla_cpu_use_thunk_runtime=false" ]
}

@test "the file applies on top of restore_default, and _env_ overrides still win over its settings" {
  echo 'append_xla_flags --xla_model_specific=1' >"$REPO/configs/tiny.env.sh"
  printf '%s\n' '--xla_cpu_enable_fast_math=true' 'XLA_PYTHON_CLIENT_MEM_FRACTION=.80' >"$PROFILE"
  "$REPO/_train.sh" tiny -- _env_TUNE_PROFILE=restore_default "_env_TUNE_PROFILE_FILE=$PROFILE"
  [ "$(env_of XLA_FLAGS)" = "$BASE_FLAGS --xla_cpu_enable_fast_math=true" ]
  [ "$(env_of XLA_PYTHON_CLIENT_MEM_FRACTION)" = .80 ]
  "$REPO/_train.sh" tiny -- "_env_TUNE_PROFILE_FILE=$PROFILE" _env_XLA_PYTHON_CLIENT_MEM_FRACTION=.70
  [ "$(env_of XLA_PYTHON_CLIENT_MEM_FRACTION)" = .70 ]
}

@test "a bad line stops the job before training, naming the file and line, and applies nothing" {
  for bad in 'rm -rf /' 'export FOO=1' '--flag with spaces' 'XLA_FLAGS=--x=1' '-single_dash=1' '1BAD=x'; do
    printf '%s\n' '--xla_cpu_enable_fast_math=true' '# fine so far' "$bad" >"$PROFILE"
    rm -f "$RECORD.env"
    run "$REPO/_train.sh" tiny -- "_env_TUNE_PROFILE_FILE=$PROFILE"
    [ "$status" -ne 0 ]
    [ ! -e "$RECORD.env" ]   # training never started
    [ "$(grep -c 'ERROR' <<<"$output")" -eq 1 ]
    [[ $output == *"ERROR: $PROFILE:3: '$bad' is not an XLA flag"* ]]
  done
}

@test "the file is read, never run: shell syntax in a value stays text" {
  # shellcheck disable=SC2016  # shell syntax that must stay text
  printf '%s\n' 'NCCL_GREETING=$(touch pwned)`touch pwned2`' >"$PROFILE"
  cd "$BATS_TEST_TMPDIR"
  "$REPO/_train.sh" tiny -- "_env_TUNE_PROFILE_FILE=$PROFILE"
  # shellcheck disable=SC2016
  [ "$(env_of NCCL_GREETING)" = '$(touch pwned)`touch pwned2`' ]
  [ ! -e pwned ] && [ ! -e pwned2 ]
}

@test "a missing file is one clear error and the job does not start" {
  run "$REPO/_train.sh" tiny -- _env_TUNE_PROFILE_FILE=profiles/nope.profile
  [ "$status" -ne 0 ]
  [ ! -e "$RECORD.env" ]
  [[ $output == *"ERROR: TUNE_PROFILE_FILE=profiles/nope.profile: no readable file at $JOB_WORKSPACE/profiles/nope.profile"* ]]
}

@test "CRLF line ends and a last line without newline are read" {
  printf -- '--xla_cpu_enable_fast_math=true\r\nNCCL_PROTO=LL128' >"$PROFILE"
  "$REPO/_train.sh" tiny -- "_env_TUNE_PROFILE_FILE=$PROFILE"
  [ "$(env_of XLA_FLAGS)" = "$BASE_FLAGS --xla_cpu_enable_fast_math=true" ]
  [ "$(env_of NCCL_PROTO)" = LL128 ]
}

@test "without TUNE_PROFILE_FILE nothing changes" {
  "$REPO/_train.sh" tiny
  [ "$(env_of XLA_FLAGS)" = "$BASE_FLAGS" ]
  [ -z "$(env_of TUNE_PROFILE_FILE)" ]
}

@test "a profile may set only tuning variables: LD_PRELOAD, PYTHONPATH, BASH_ENV stop the job and nothing is applied" {
  local name
  for name in LD_PRELOAD PYTHONPATH BASH_ENV PATH; do
    printf '%s\n' '--xla_cpu_use_thunk_runtime=false' 'NCCL_PROTO=Simple' "$name=/tmp/evil" >"$PROFILE"
    rm -f "$RECORD.env"
    run "$REPO/_train.sh" tiny -- "_env_TUNE_PROFILE_FILE=$PROFILE"
    [ "$status" -eq 2 ]
    [[ $output == *"$PROFILE:3: $name is not a tuning variable; a profile may set only names starting with XLA_ JAX_ NCCL_"* ]]
    [ ! -e "$RECORD.env" ]   # training never started
  done
}

@test "a profile file others can write, or another user's, is refused before training" {
  printf '%s\n' 'NCCL_PROTO=Simple' >"$PROFILE"
  chmod 0664 "$PROFILE"
  run "$REPO/_train.sh" tiny -- "_env_TUNE_PROFILE_FILE=$PROFILE"
  [ "$status" -eq 2 ]
  [[ $output == *"(owner uid $EUID, mode 664) is not a file only you can write"* ]]
  [ ! -e "$RECORD.env" ]
  chmod 0644 "$PROFILE"
  if (( EUID == 0 )); then
    chown 65534 "$PROFILE"
    run "$REPO/_train.sh" tiny -- "_env_TUNE_PROFILE_FILE=$PROFILE"
    [ "$status" -eq 2 ] && [[ $output == *"(owner uid 65534, mode 644)"* ]]
    chown 0 "$PROFILE"
  fi
  run "$REPO/_train.sh" tiny -- "_env_TUNE_PROFILE_FILE=$PROFILE"
  [ "$status" -eq 0 ] && [ "$(env_of NCCL_PROTO)" = Simple ]
}

@test "a binary profile stops the job in one line of text; its bytes are not echoed" {
  printf 'NCCL_X=\001\033[2J\000\377\n--xla_ok=1\n' >"$PROFILE"
  run "$REPO/_train.sh" tiny -- "_env_TUNE_PROFILE_FILE=$PROFILE"
  [ "$status" -eq 2 ]
  [ ! -e "$RECORD.env" ]
  [[ $output == *"ERROR: TUNE_PROFILE_FILE=$PROFILE: $PROFILE is not a text file (it holds control bytes)"* ]]
  ! grep -q $'[\x01\x1b]' <<<"$output" || false   # (bats: a bare `! cmd` never fails a test)
}

@test "a directory is named as one, not as a missing file" {
  run "$REPO/_train.sh" tiny -- _env_TUNE_PROFILE_FILE=profiles
  [ "$status" -eq 2 ]
  [[ $output == *"TUNE_PROFILE_FILE=profiles: $JOB_WORKSPACE/profiles is a directory; give a profile file in it"* ]]
}

@test "named profiles come from the one list in utils/lib/tune_profile.sh: flags in order, settings exported" {
  "$REPO/_train.sh" tiny -- _env_TUNE_PROFILE=pipelined_collectives
  [ "$(env_of XLA_FLAGS)" = "$BASE_FLAGS --xla_gpu_enable_pipelined_all_gather=true --xla_gpu_enable_pipelined_reduce_scatter=true --xla_gpu_enable_pipelined_all_reduce=true" ]
  "$REPO/_train.sh" tiny -- _env_TUNE_PROFILE=mem95
  [ "$(env_of XLA_PYTHON_CLIENT_MEM_FRACTION)" = .95 ]
  [ "$(env_of XLA_FLAGS)" = "$BASE_FLAGS" ]
  # shellcheck source=utils/lib/tune_profile.sh
  source "$REPO/utils/lib/tune_profile.sh"
  run tune_profile_check_name "x: " ag_combine_1g
  [ "$status" -eq 0 ] && [ -z "$output" ]
  run tune_profile_check_name "x: " $'no\033such'
  [ "$status" -eq 2 ]
  [[ $output == "x: TUNE_PROFILE='no?such' is not a tuning profile; use one of: ag_combine_1g ag_combine_256m "* ]]
}
