#!/usr/bin/env bats
# The launch grammar (utils/lib/launch_args.sh): spec parsing, passthrough validation, tags, name length.

load test_helper

setup() {
  # shellcheck source=../../utils/lib/launch_args.sh
  source "$REPO_DIR/utils/lib/launch_args.sh"
}

@test "plain model: no alias, no tag" {
  parse_launch_args llama2-70b
  [ "$MODEL_INPUT" = llama2-70b ]
  [ -z "$MODEL_NAME_ALIAS" ]
  [ -z "$EXP_TAG" ]
}

@test "one colon is always model:tag" {
  parse_launch_args 70b:baseline
  [ "$MODEL_INPUT" = 70b ]
  [ -z "$MODEL_NAME_ALIAS" ]
  [ "$EXP_TAG" = baseline ]
}

@test "trailing colon after two fields is an alias without tag" {
  parse_launch_args 70b:run-a:
  [ "$MODEL_INPUT" = 70b ]
  [ "$MODEL_NAME_ALIAS" = run-a ]
  [ -z "$EXP_TAG" ]
}

@test "model:alias:tag" {
  parse_launch_args 70b:run-a:exp1
  [ "$MODEL_NAME_ALIAS" = run-a ]
  [ "$EXP_TAG" = exp1 ]
}

@test "more than two colons is an error naming the forms" {
  run parse_launch_args a:b:c:d
  [ "$status" -ne 0 ]
  [[ $output == *"too many ':'"* ]]
  [[ $output == *"model:alias:tag"* ]]
}

@test "empty spec is an error" {
  run parse_launch_args ""
  [ "$status" -ne 0 ]
  [[ $output == *"empty model spec"* ]]
}

@test "spec with no model before the colon is an error" {
  run parse_launch_args :tag
  [ "$status" -ne 0 ]
  [[ $output == *"no model before ':'"* ]]
}

@test "no arguments at all is an error with usage" {
  run parse_launch_args
  [ "$status" -ne 0 ]
  [[ $output == *"no model given"* ]]
}

@test "an option in place of the model is rejected" {
  run parse_launch_args -N 2 tiny
  [ "$status" -ne 0 ]
  [[ $output == *"first argument must be the model"* ]]
}

@test "unsafe characters in a tag are rejected" {
  run parse_launch_args 'tiny:a/b'
  [ "$status" -ne 0 ]
  [[ $output == *"unsafe in file names"* ]]
}

@test "arguments split at the first --: scheduler args before, passthrough after, empty strings dropped" {
  parse_launch_args tiny -N 2 --time=1:00 -- steps=5 "" remat_policy=full
  [ "${SCHEDULER_ARGS[*]}" = "-N 2 --time=1:00" ]
  [ "${#PASSTHROUGH_ARGS[@]}" -eq 2 ]
  [ "${PASSTHROUGH_ARGS[1]}" = remat_policy=full ]
}

@test "a second -- is an ordinary passthrough arg, so it is rejected as not key=value" {
  run parse_launch_args tiny -- steps=5 -- x=1
  [ "$status" -ne 0 ]
  [[ $output == *"'--' is not key=value"* ]]
}

@test "passthrough args become the tag suffix: = to _, joined with -" {
  parse_launch_args llama2-70b:exp1 -- remat_policy=full _env_NCCL_DEBUG=INFO
  [ "$EXP_TAG" = "exp1-remat_policy_full-_env_NCCL_DEBUG_INFO" ]
  [ "${PASSTHROUGH_ARGS[0]}" = remat_policy=full ]
  [ "${PASSTHROUGH_ARGS[1]}" = _env_NCCL_DEBUG=INFO ]
}

@test "suffix alone becomes the tag when the spec has none" {
  parse_launch_args tiny -- steps=7
  [ "$EXP_TAG" = steps_7 ]
}

@test "characters unsafe in file names are replaced in the tag, the arg itself is untouched" {
  parse_launch_args tiny -- 'dataset_path=gs://b/c d' '_env_XLA_FLAGS="--a=1 --b"'
  [ "$EXP_TAG" = "dataset_path_gs___b_c_d-_env_XLA_FLAGS__--a_1_--b_" ]
  [ "${PASSTHROUGH_ARGS[0]}" = 'dataset_path=gs://b/c d' ]
}

@test "leading dashes are dropped from tag words" {
  [ "$(passthrough_tag_word --foo=bar)" = foo_bar ]
  [ "$(passthrough_tag_word -x)" = x ]
}

@test "a passthrough arg that is not key=value is rejected with the fix" {
  run parse_launch_args tiny -- steps
  [ "$status" -ne 0 ]
  [[ $output == *"'steps' is not key=value"* ]]
  run parse_launch_args tiny -- --steps=5
  [ "$status" -ne 0 ]
  [[ $output == *"no leading dashes"* ]]
}

@test "_env_ with no name or no = is rejected" {
  run parse_launch_args tiny -- _env_=x
  [ "$status" -ne 0 ]
  [[ $output == *"names no variable"* ]]
  run parse_launch_args tiny -- _env_FOO
  [ "$status" -ne 0 ]
  [[ $output == *"has no '='"* ]]
  run parse_launch_args tiny -- _env_1BAD=x
  [ "$status" -ne 0 ]
  [[ $output == *"not a valid environment variable name"* ]]
}

@test "_env_ values may contain = and spaces" {
  parse_launch_args tiny -- '_env_XLA_FLAGS=--a=1 --b=2'
  [ "${PASSTHROUGH_ARGS[0]}" = '_env_XLA_FLAGS=--a=1 --b=2' ]
}

@test "job name is JAX-<model>[-<tag>]; the alias is not part of it" {
  [ "$(job_name llama2-70b "")" = JAX-llama2-70b ]
  [ "$(job_name llama2-70b exp1-steps_5)" = JAX-llama2-70b-exp1-steps_5 ]
}

@test "the log file name <id>-<name>.log must fit 255 bytes" {
  local id=local_20260101_000000_abcd   # 26 bytes; with '-' and '.log' the name may be 224
  local ok; ok=JAX-$(printf 'x%.0s' $(seq 220))
  [ ${#ok} -eq 224 ]
  check_job_name_length "$ok" "$id"
  run check_job_name_length "${ok}y" "$id"
  [ "$status" -ne 0 ]
  [[ $output == *"256 bytes"* ]]
  [[ $output == *"alias"* ]]
}

@test "launch_check_procs: every value given is checked; the one training uses (the last _env_, else the environment's) is exported" {
  local jobkit=$REPO_DIR/py/bin/jobkit
  run bash -c "source '$REPO_DIR/utils/lib/launch_args.sh'; unset LOCAL_WORLD_SIZE; launch_check_procs '$jobkit' steps=1 && echo \"\${LOCAL_WORLD_SIZE-unset}\""
  [ "$status" -eq 0 ] && [ "$output" = unset ]
  run bash -c "source '$REPO_DIR/utils/lib/launch_args.sh'; LOCAL_WORLD_SIZE=3 launch_check_procs '$jobkit' _env_LOCAL_WORLD_SIZE=4 \"_env_LOCAL_WORLD_SIZE='2'\" && echo \"\$LOCAL_WORLD_SIZE\""
  [ "$status" -eq 0 ] && [ "$output" = 2 ]
  run bash -c "source '$REPO_DIR/utils/lib/launch_args.sh'; LOCAL_WORLD_SIZE=auto launch_check_procs '$jobkit' && echo \"\$LOCAL_WORLD_SIZE\""
  [ "$status" -eq 0 ] && [ "$output" = auto ]
  run bash -c "source '$REPO_DIR/utils/lib/launch_args.sh'; LOCAL_WORLD_SIZE=2 launch_check_procs '$jobkit' _env_LOCAL_WORLD_SIZE=0"
  [ "$status" -eq 2 ]
  [[ $output == "jobkit procs: LOCAL_WORLD_SIZE=0 is not a process count per node; set 1..64 or auto (one per GPU)" ]]
}

@test "launch_check_procs: a host that cannot run jobkit (any exit but LAUNCH_SETTING_REFUSED_RC) leaves the check to the nodes" {
  local rc
  for rc in 1 2 6 70 127; do   # 2 was jobkit's refused setting once; it is a usage error now (errors.py)
    make_stub nojobkit "echo 'ModuleNotFoundError: No module named click' >&2; exit $rc"
    run bash -c "source '$REPO_DIR/utils/lib/launch_args.sh'; LOCAL_WORLD_SIZE=2 launch_check_procs nojobkit && echo \"\$LOCAL_WORLD_SIZE\""
    [ "$status" -eq 0 ] && [ "$output" = 2 ] || { echo "exit $rc: $status $output"; false; }
  done
}
