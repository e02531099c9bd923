#!/usr/bin/env bats
# Credentials stay out of what other users of a cluster see (issue 21, audit rows S1, S4, I3): the tag (Slurm
# job name, log and job dir names), the log header, `_DEBUG` traces; PASS_ENV hands a credential to training
# by name, its value on no command line. Without Slurm: sbatch, srun, squeue and scontrol are stubs.
# Literal $ in single quotes is meant (SC2016); bats runs each test in a subshell on purpose (SC2030/SC2031).
# shellcheck disable=SC2016,SC2030,SC2031

load test_helper
load container_helper

SECRET=FAKEpassthru0000SECRET
ENV_SECRET=FAKEenvhf0000SECRET

setup() {
  export JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws CONTAINER_RUNTIME=none
  unset PASS_ENV _DEBUG MAX_RETRIES
}

# hashed_snapshot: a copy of the scripts as submit.sh leaves them (private, read by the batch script only with its
# sha256), in SNAP and SNAP_SHA: _job.sbatch runs nothing from a snapshot it cannot verify.
hashed_snapshot() {
  SNAP=$(copy_repo)
  chmod go-w "$SNAP" "${SNAP%/*}"
  SNAP_SHA=$("$SNAP/_job.sbatch" --snapshot-sha256 "$SNAP")
}

# stub_slurm: an sbatch that records its argv and environment and answers job 7; squeue and scontrol.
stub_slurm() {
  make_stub sbatch "printf '%s\n' \"\$@\" >'$BATS_TEST_TMPDIR/sbatch.args'; env >'$BATS_TEST_TMPDIR/sbatch.env'; echo 7"
  make_stub squeue 'echo RUNNING'
  make_stub scontrol '[[ $* == "show hostnames"* ]] && echo node1; exit 0'
}

# value_after FILE ARG: the line after the line ARG in FILE (an option's value in a recorded argv).
value_after() { grep -A1 -x -- "$2" "$1" | sed -n 2p; }

@test "the tag keeps an _env_ credential's name, never its value; training's own knobs keep theirs" {
  source "$REPO_DIR/utils/lib/launch_args.sh"
  parse_launch_args tiny:a -- steps=3 "_env_WANDB_API_KEY=$SECRET" "_env_MY_DB=postgres://u:$SECRET@h/d" \
    "_env_FOO=$SECRET" _env_TUNE_PROFILE=mem95 "hf_access_token=$SECRET" "dataset_path=https://u:$SECRET@h/x" \
    _env_XLA_FLAGS=--xla_a=1
  [ "$EXP_TAG" = "a-steps_3-_env_WANDB_API_KEY-_env_MY_DB-_env_FOO-_env_TUNE_PROFILE_mem95-hf_access_token-dataset_path-_env_XLA_FLAGS_--xla_a_1" ]
  # the arguments themselves are untouched: training gets the values
  [ "${PASSTHROUGH_ARGS[1]}" = "_env_WANDB_API_KEY=$SECRET" ]
}

@test "submit.sh: the job name, the log and job dir names and what it prints carry no _env_ value" {
  stub_slurm
  EARLY_DEATH_CHECK_SECONDS=0 run "$REPO_DIR/submit.sh" tiny -N 1 -- steps=3 "_env_WANDB_API_KEY=$SECRET"
  [ "$status" -eq 0 ]
  [ "$(value_after "$BATS_TEST_TMPDIR/sbatch.args" -J)" = JAX-tiny-steps_3-_env_WANDB_API_KEY ]
  grep -qx -- "--output=$JOB_WORKSPACE/%j-JAX-tiny-steps_3-_env_WANDB_API_KEY.log" "$BATS_TEST_TMPDIR/sbatch.args"
  [ -d "$JOB_WORKSPACE/7-JAX-tiny-steps_3-_env_WANDB_API_KEY" ]
  ! grep -q 0000SECRET <<<"$output" || false
  [ -z "$(find "$JOB_WORKSPACE" -name "*0000SECRET*")" ]
  # what the batch script gets besides its arguments: EXP_TAG is the tag, and no PASSTHROUGH_ARGS copy of them
  grep -qx 'EXP_TAG=steps_3-_env_WANDB_API_KEY' "$BATS_TEST_TMPDIR/sbatch.env"
  ! grep -q '^PASSTHROUGH_ARGS=' "$BATS_TEST_TMPDIR/sbatch.env" || false
}

@test "the log header shows a credential's passthrough value as ***" {
  source "$REPO_DIR/utils/lib/job_log.sh"
  PASSTHROUGH_ARGS=(steps=7 _env_FOO=bar "_env_HF_TOKEN=$SECRET" "hf_access_token=$SECRET" "_env_DATA=s3://u:$SECRET@b/k")
  run print_job_header PASSTHROUGH_ARGS
  [ "$output" = 'PASSTHROUGH_ARGS="steps=7 _env_FOO=bar _env_HF_TOKEN=*** hf_access_token=*** _env_DATA=s3://***@b/k"' ]
}

@test "_job.sbatch under _DEBUG=1: the trace holds no value of the submit environment; the header is masked" {
  stub_slurm
  make_stub srun 'exit 0'   # every stage "passes" without running: this test is about the batch script
  hashed_snapshot
  mkdir -p "$JOB_WORKSPACE"
  local log=$JOB_WORKSPACE/77-JAX-tiny.log
  # MAX_RETRIES=1: the requeue step hands the captured environment to `jobkit requeue` (it decides not to).
  HF_TOKEN=$ENV_SECRET _DEBUG=1 MAX_RETRIES=1 SLURM_JOB_ID=77 SLURM_JOB_NAME=JAX-tiny SLURM_JOB_NUM_NODES=1 \
    SLURM_JOB_NODELIST=node1 MAXTEXT_LAUNCHER_DIR=$SNAP ARTIFACT_SHA256=$SNAP_SHA \
    "$SNAP/_job.sbatch" tiny -- steps=3 "_env_WANDB_API_KEY=$SECRET" >"$log" 2>&1
  grep -q '^+ _SUBMIT_ENV\|^+ TRAIN_ARGS=' "$log"     # it was traced: set -x was on
  grep -q '== JOB SUMMARY ==' "$log"
  grep -q '^== not requeued: ' "$log"   # the requeue step ran, the environment on its stdin
  ! grep -q "$ENV_SECRET" "$log" || { grep -n "$ENV_SECRET" "$log"; false; }
  grep -qx 'PASSTHROUGH_ARGS="steps=3 _env_WANDB_API_KEY=\*\*\*"' "$log"
}

@test "_job.sbatch refuses a job name that is not a file name (renamed after submit.sh), creating nothing" {
  stub_slurm
  make_stub srun 'exit 0'
  hashed_snapshot
  SLURM_JOB_ID=78 SLURM_JOB_NAME='../../x' SLURM_JOB_NUM_NODES=1 SLURM_JOB_NODELIST=node1 \
    MAXTEXT_LAUNCHER_DIR=$SNAP ARTIFACT_SHA256=$SNAP_SHA run "$SNAP/_job.sbatch" tiny -- steps=3
  [ "$status" -eq 2 ]
  [ "$output" = "_job.sbatch: job name '../../x' is not a file name (letters, digits, . _ + -); submit with submit.sh, which names the job" ]
  [ ! -e "$JOB_WORKSPACE" ]
}

@test "_train.sh under _DEBUG=1: the environment record is written untraced" {
  local ws=$BATS_TEST_TMPDIR/tws
  mkdir -p "$ws/local_1-JAX-tiny"
  make_stub fakepython 'exit 0'
  HF_TOKEN=$ENV_SECRET _DEBUG=1 TRAIN_PYTHON=fakepython HANG_TIMEOUT=off JOB_WORKSPACE=$ws JOB_DIR=local_1-JAX-tiny \
    GPU_DETECT_ROOT=$BATS_TEST_TMPDIR/nogpu run "$REPO_DIR/_train.sh" tiny -- steps=1
  [ "$status" -eq 0 ]
  [[ $output == *"+ "* ]]                                             # traced
  grep -qx 'HF_TOKEN=\*\*\*' "$ws/local_1-JAX-tiny/environment.node0.txt"  # and recorded
  ! grep -q "$ENV_SECRET" <<<"$output" || { grep -n "$ENV_SECRET" <<<"$output"; false; }
}

@test "_container.sh under _DEBUG=1: the registry token is never traced" {
  make_scripts_copy
  export STUB_LOG_DIR=$BATS_TEST_TMPDIR/log HOME=$BATS_TEST_TMPDIR/home
  mkdir -p "$STUB_LOG_DIR" "$HOME"
  make_sandbox docker
  _DEBUG=1 DOCKER_USERNAME=me DOCKER_TOKEN=$ENV_SECRET STUB_IMAGE_PRESENT=0 STUB_PULL_NEEDS_LOGIN=1 \
    CONTAINER_RUNTIME=docker run_container tiny
  [ "$status" -eq 0 ]
  [ "$(cat "$STUB_LOG_DIR/login.stdin")" = "$ENV_SECRET" ]   # the login got it, on its stdin
  [[ $output == *"+ "* ]]
  ! grep -q "$ENV_SECRET" <<<"$output" || { grep -n "$ENV_SECRET" <<<"$output"; false; }
}

@test "PASS_ENV: a container gets the named variables by name, their values on no command line" {
  make_scripts_copy
  export STUB_LOG_DIR=$BATS_TEST_TMPDIR/log HOME=$BATS_TEST_TMPDIR/home
  mkdir -p "$STUB_LOG_DIR" "$HOME"
  make_sandbox docker
  PASS_ENV=SECRET_TOKEN SECRET_TOKEN=$SECRET STUB_RUN_EXEC=1 CONTAINER_RUNTIME=docker run_container tiny
  [ "$status" -eq 0 ]
  [[ $output == *"SECRET_TOKEN=$SECRET"* ]]   # training has it (the stub _train.sh prints it)
  local argv=$STUB_LOG_DIR/docker-run.argv
  assert_argv_has "$argv" --env SECRET_TOKEN
  assert_argv_has "$argv" --env PASS_ENV=SECRET_TOKEN
  ! grep -q 0000SECRET "$argv" || false
  # without PASS_ENV it does not cross (the allow-list)
  SECRET_TOKEN=$SECRET STUB_RUN_EXEC=1 CONTAINER_RUNTIME=docker run_container tiny
  [[ $output == *"SECRET_TOKEN=<unset>"* ]]
}

@test "PASS_ENV: names only, each set here; refused before anything is created" {
  stub_slurm
  local script
  for script in submit.sh run_local.sh; do
    PASS_ENV=NOT_SET_HERE_X run "$REPO_DIR/$script" tiny
    [ "$status" -eq 2 ]
    [ "${#lines[@]}" -eq 1 ]
    [ "$output" = "$script: PASS_ENV names NOT_SET_HERE_X, which is not set here; export NOT_SET_HERE_X first, or drop it from PASS_ENV" ]
    PASS_ENV="HF_TOKEN=$SECRET" run "$REPO_DIR/$script" tiny
    [ "$status" -eq 2 ]
    [[ $output == "$script: PASS_ENV names 'HF_TOKEN=$SECRET', which is not a variable name; list names only"* ]]
    [ ! -e "$JOB_WORKSPACE" ]
  done
  [ ! -e "$BATS_TEST_TMPDIR/sbatch.args" ]
}

# refused ARGS...: submit.sh fails with one line, before creating anything or calling sbatch.
refused() {
  stub_slurm
  run "$REPO_DIR/submit.sh" "$@"
  [ "$status" -eq 2 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ ${lines[0]} == submit.sh:* ]]
  [ ! -e "$JOB_WORKSPACE" ]
  [ ! -e "$BATS_TEST_TMPDIR/sbatch.args" ]
}

@test "submit.sh refuses the sbatch options it sets itself, with the fix" {
  refused tiny -N 1 -J 'x/../../y'
  [ "$output" = "submit.sh: '-J' (-J/--job-name) is set by submit.sh itself and cannot be given; submit.sh names the job JAX-<model>-<tag>; put your name in the tag: submit.sh tiny:<tag> ..." ]
  local arg
  for arg in -Jx --job-name=x --job-name --job=x -o/tmp/f --output=f --out=f -e/tmp/f --error=f --err=f \
      -D/tmp --chdir=/tmp --export=NONE --exp=ALL; do
    refused tiny "$arg"
    [[ $output == *"'$arg' ("*") is set by submit.sh itself and cannot be given; "* ]]
  done
  refused tiny --output=f
  [[ $output == *'set JOB_WORKSPACE to choose where it goes' ]]
  refused tiny --export=NONE
  [[ $output == *'pass secrets by name with PASS_ENV=NAME,...' ]]
}

@test "a control character in a passthrough value is refused, for submit.sh and run_local.sh" {
  refused tiny -- steps=3 $'hf_eval_split=a\ntouch /tmp/x'
  [ "$output" = "submit.sh: passthrough argument 'hf_eval_split=a...' has a control character (newline, tab, ...); write it on one line, without tabs" ]
  refused tiny -- $'_env_FOO=a\rb'
  refused tiny -- $'run_name=a\tb'
  run "$REPO_DIR/run_local.sh" tiny -- $'_env_X=a\nb'
  [ "$status" -eq 2 ]
  [[ $output == "run_local.sh: passthrough argument '_env_X=a...' has a control character"* ]]
  [ ! -e "$JOB_WORKSPACE" ]
}
