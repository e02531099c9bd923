#!/usr/bin/env bats
# submit.sh front door without a cluster: every bad input gives one clear line, a non-zero exit, and
# creates nothing. (Real submissions to a local Slurm cluster are in tests/py/test_slurm.py.)

load test_helper

setup() {
  export JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws CONTAINER_RUNTIME=none
  # An sbatch that must never be reached by these tests.
  make_stub sbatch "echo called >'$BATS_TEST_TMPDIR/sbatch-called'; exit 1"
  make_stub scontrol 'exit 0'
}

bad_input() {
  run "$REPO_DIR/submit.sh" "$@"
  [ "$status" -ne 0 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ ${lines[0]} == submit.sh:* ]]
  [ ! -e "$JOB_WORKSPACE" ]
  [ ! -e "$BATS_TEST_TMPDIR/sbatch-called" ]
}

@test "--help prints usage" {
  run "$REPO_DIR/submit.sh" --help
  [ "$status" -eq 0 ]
  [[ ${lines[0]} == "Usage: submit.sh"* ]]
}

@test "the foundation's bad inputs are refused the same way through submit.sh" {
  bad_input nosuchmodel -N 1
  [[ $output == *"unknown model 'nosuchmodel'"* ]]
  bad_input llama3 -N 1
  [[ $output == *"ambiguous model 'llama3'"* ]]
  bad_input a:b:c:d
  [[ $output == *"too many ':'"* ]]
  bad_input ""
  [[ $output == *"empty model spec"* ]]
  bad_input tiny -- steps
  [[ $output == *"not key=value"* ]]
  bad_input tiny -- _env_=1
  [[ $output == *"names no variable"* ]]
  bad_input tiny -- "run_name=$(printf 'x%.0s' $(seq 240))"
  [[ $output == *"limit 255"* ]]
  CONTAINER_RUNTIME=lxc bad_input tiny
  [[ $output == *"unknown CONTAINER_RUNTIME 'lxc'"* ]]
}

@test "-N must be a positive count or a min-max range" {
  bad_input tiny -N x
  [[ $output == *"node count 'x' is not a positive number"* ]]
  bad_input tiny -N 0
  [[ $output == *"node count '0'"* ]]
  bad_input tiny --nodes=-2
  [[ $output == *"node count '-2'"* ]]
  bad_input tiny -N
  [[ $output == *"node count ''"* ]]
}

@test "STAGE_TIMEOUTS with an unknown stage, 0 or text is refused before submitting" {
  STAGE_TIMEOUTS="warmup:5" bad_input tiny -N 1
  [[ $output == *"unknown stage 'warmup'; valid stages:"* ]]
  STAGE_TIMEOUTS="train:0" bad_input tiny -N 1
  [[ $output == *"0 is ambiguous"* ]]
  STAGE_TIMEOUTS="train:later" bad_input tiny -N 1
  [[ $output == *"'later' for stage 'train'"* ]]
}

@test "no Slurm on PATH: says how to get one, including the local cluster" {
  # Only what submit.sh needs up to its sbatch check: a real Slurm installed on this machine must not count.
  local bin=$BATS_TEST_TMPDIR/bin tool
  mkdir -p "$bin"
  for tool in bash env dirname sort; do ln -s "$(command -v "$tool")" "$bin/$tool"; done
  PATH=$bin bad_input tiny -N 1
  [[ $output == *"no sbatch on PATH"*"utils/local_cluster.sh up -N 2"* ]]
}

@test "JOB_WORKSPACE that cannot be written is refused" {
  JOB_WORKSPACE=/proc/ws run "$REPO_DIR/submit.sh" tiny -N 1
  [ "$status" -ne 0 ]
  [[ $output == *"JOB_WORKSPACE=/proc/ws is not writable"* ]]
}

@test "sbatch refusing the job: its message is shown and the snapshot is removed" {
  make_stub sbatch 'echo "sbatch: error: unrecognized option '"'"'--bogus'"'"'" >&2; exit 1'
  run "$REPO_DIR/submit.sh" tiny --bogus
  [ "$status" -ne 0 ]
  [[ $output == *"sbatch refused the job: sbatch: error: unrecognized option '--bogus'"* ]]
  [ -z "$(ls -A "$JOB_WORKSPACE/.artifacts" 2>/dev/null)" ]
  [ ! -e "$JOB_WORKSPACE/.artifacts" ]
}
