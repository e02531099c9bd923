#!/usr/bin/env bats
# The training tier (_train.sh + train_env.sh): env layering, _env_ visibility, TUNE_PROFILE, output path,
# and the MaxText command line. The Python interpreter is a stub that records what it was given.

load test_helper

setup() {
  REPO=$(copy_repo)
  export JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws JOB_DIR=local_1-JAX-tiny MODEL_NAME_ALIAS=""
  mkdir -p "$JOB_WORKSPACE/$JOB_DIR"
  export GPU_DETECT_ROOT=$BATS_TEST_TMPDIR/nogpu   # no GPU unless a test says so
  unset XLA_FLAGS TUNE_PROFILE ENABLE_XLA_DUMP JAX_PLATFORMS XLA_PYTHON_CLIENT_MEM_FRACTION NCCL_PROTO
  RECORD=$BATS_TEST_TMPDIR/record
  make_stub fakepython "printf '%s\n' \"\$@\" >'$RECORD.argv'; env >'$RECORD.env'"
  export TRAIN_PYTHON=fakepython
  # The stub records the last call only: no watchdog process beside training (its own test is below).
  export HANG_TIMEOUT=off
}

env_of() { sed -n "s/^$1=//p" "$RECORD.env"; }

@test "the MaxText command line: launcher module, config, our defaults, then the user's args" {
  run "$REPO/_train.sh" tiny -- steps=7 _env_FOO=bar
  [ "$status" -eq 0 ]
  mapfile -t argv <"$RECORD.argv"
  [ "${argv[0]}" = -u ]
  [ "${argv[1]}" = "$REPO/py/bin/jobkit" ]
  [ "${argv[2]}" = launch ]
  [ "${argv[3]}" = "$REPO/configs/tiny.yml" ]
  [ "${argv[4]}" = "base_output_directory=$JOB_WORKSPACE/$JOB_DIR" ]
  [ "${argv[5]}" = "jax_cache_dir=$JOB_WORKSPACE/.jax_cache/uid-$EUID" ]
  [ "${argv[6]}" = steps=7 ]
  [ "${#argv[@]}" -eq 7 ]   # the _env_ arg never reaches MaxText
  [ "$(env_of FOO)" = bar ]
  [ -z "$(env_of PYTHONPATH)" ]   # jobkit is found without it
}

@test "user-given base_output_directory and jax_cache_dir are not duplicated" {
  "$REPO/_train.sh" tiny -- base_output_directory=/x jax_cache_dir=/y
  run cat "$RECORD.argv"
  [[ $output != *"base_output_directory=$JOB_WORKSPACE"* ]]
  [[ $output != *"jax_cache_dir=$JOB_WORKSPACE"* ]]
  [[ $output == *"base_output_directory=/x"* ]]
}

@test "the compile cache is each user's own (0700); one others can write or own is not used" {
  "$REPO/_train.sh" tiny
  local mine=$JOB_WORKSPACE/.jax_cache/uid-$EUID
  [ "$(stat -c '%u %a' "$mine")" = "$EUID 700" ]
  [ "$(env_of JAX_COMPILATION_CACHE_DIR)" = "$mine" ]
  # A team workspace: the shared cache dir is the group's to write, so a teammate could swap an executable.
  local shared=$JOB_WORKSPACE/shared_cache
  mkdir -m 0777 "$shared"
  export JAX_CACHE_DIR=$shared
  run "$REPO/_train.sh" tiny
  [ "$status" -eq 0 ]
  [[ $output == *"[_train] warning: JAX_CACHE_DIR: $shared is writable by group or others (mode 777); running without the compilation cache (set JAX_CACHE_DIR to a dir of yours that group and others cannot write)"* ]]
  grep -qx "jax_cache_dir=" "$RECORD.argv"
  [ -z "$(env_of JAX_COMPILATION_CACHE_DIR)" ]
  # Planted by a teammate at the default's name: theirs (nobody), or a link to a dir of theirs.
  unset JAX_CACHE_DIR
  rm -rf "$mine" && mkdir -m 0700 "$mine" && chown 65534 "$mine"
  run "$REPO/_train.sh" tiny
  [[ $output == *"warning: JAX_CACHE_DIR: $mine belongs to uid 65534, not to uid $EUID; running without"* ]]
  grep -qx "jax_cache_dir=" "$RECORD.argv"
  rmdir "$mine" && ln -s "$shared" "$mine"
  run "$REPO/_train.sh" tiny
  [[ $output == *"warning: JAX_CACHE_DIR: $mine is a symlink; running without"* ]]
}

@test "a checkpoint dir of the alias that appeared as another user's while the job was queued stops training" {
  mkdir -p "$JOB_WORKSPACE/tiny"   # our own dir, from an earlier run: used
  "$REPO/_train.sh" tiny -- enable_checkpointing=true
  grep -qx "base_output_directory=$JOB_WORKSPACE/tiny" "$RECORD.argv"
  [[ $EUID == 0 ]] || skip "planting a teammate's dir needs root (chown)"
  rm "$RECORD.argv"
  export MODEL_NAME_ALIAS=ck2
  mkdir -p "$JOB_WORKSPACE/ck2" && chown 65534 "$JOB_WORKSPACE/ck2"
  run "$REPO/_train.sh" tiny -- enable_checkpointing=true
  [ "$status" -eq 2 ]
  [[ $output == *"_train.sh: checkpoint dir $JOB_WORKSPACE/ck2 belongs to uid 65534, not to you (uid 0)"* ]]
  ! grep -qx launch "$RECORD.argv"   # only the settings checks ran   # training never started
}

@test "layering, last wins: train_env.sh < configs/<model>.env.sh < _env_" {
  echo 'export XLA_PYTHON_CLIENT_MEM_FRACTION=.50 MODEL_ONLY=1' >"$REPO/configs/tiny.env.sh"
  "$REPO/_train.sh" tiny
  [ "$(env_of XLA_PYTHON_CLIENT_MEM_FRACTION)" = .50 ]
  [ "$(env_of MODEL_ONLY)" = 1 ]
  "$REPO/_train.sh" tiny -- _env_XLA_PYTHON_CLIENT_MEM_FRACTION=.70
  [ "$(env_of XLA_PYTHON_CLIENT_MEM_FRACTION)" = .70 ]
  rm "$REPO/configs/tiny.env.sh"
  "$REPO/_train.sh" tiny
  [ "$(env_of XLA_PYTHON_CLIENT_MEM_FRACTION)" = .93 ]
}

@test "one layer of surrounding quotes is stripped from _env_ values" {
  "$REPO/_train.sh" tiny -- '_env_A="two words"' "_env_B='x'" '_env_C=""q""'
  [ "$(env_of A)" = "two words" ]
  [ "$(env_of B)" = x ]
  [ "$(env_of C)" = '"q"' ]
}

@test "train_env.sh sees _env_ switches before they are exported (ENABLE_XLA_DUMP)" {
  "$REPO/_train.sh" tiny -- _env_ENABLE_XLA_DUMP=1
  [[ $(env_of XLA_FLAGS) == *"--xla_dump_to=$JOB_WORKSPACE/$JOB_DIR/xla_dump"* ]]
}

@test "the HLO dump is rank 0 only" {
  NODE_RANK=1 "$REPO/_train.sh" tiny -- _env_ENABLE_XLA_DUMP=1
  [[ $(env_of XLA_FLAGS) != *xla_dump_to* ]]
}

@test "no GPU: JAX_PLATFORMS=cpu said once, CPU device emulation, XLA_FLAGS never empty" {
  run "$REPO/_train.sh" tiny
  [ "$(env_of JAX_PLATFORMS)" = cpu ]
  [ "$(grep -c 'JAX_PLATFORMS=cpu' <<<"$output")" -ge 1 ]
  [ "$(grep -c 'no GPU on' <<<"$output")" -eq 1 ]
  [ "$(env_of XLA_FLAGS)" = "--xla_force_host_platform_device_count=1" ]
  "$REPO/_train.sh" tiny -- _env_CPU_DEVICES_PER_NODE=4
  [ "$(env_of XLA_FLAGS)" = "--xla_force_host_platform_device_count=4" ]
}

@test "a GPU node keeps the image's XLA_FLAGS and appends ours; JAX_PLATFORMS untouched" {
  GPU_DETECT_ROOT=$REPO_DIR/tests/fixtures/sysfs/mi300x XLA_FLAGS="--image_flag=1" "$REPO/_train.sh" tiny
  [[ $(env_of XLA_FLAGS) == "--image_flag=1 --xla_gpu_enable_command_buffer="* ]]
  [ -z "$(env_of JAX_PLATFORMS)" ]
  [ "$(env_of GPU_VENDOR)" = amd ]
  [ "$(env_of NVTE_USE_ROCM)" = 1 ]
}

@test "TUNE_PROFILE appends flags after the model env file, and env knobs from block 2" {
  echo 'append_xla_flags --xla_gpu_all_gather_combine_threshold_bytes=8' >"$REPO/configs/tiny.env.sh"
  GPU_DETECT_ROOT=$REPO_DIR/tests/fixtures/sysfs/h100 "$REPO/_train.sh" tiny -- _env_TUNE_PROFILE=ag_combine_1g
  [[ $(env_of XLA_FLAGS) == *"threshold_bytes=8 --xla_gpu_all_gather_combine_threshold_bytes=1073741824" ]]
  GPU_DETECT_ROOT=$REPO_DIR/tests/fixtures/sysfs/h100 "$REPO/_train.sh" tiny -- _env_TUNE_PROFILE=nccl_chan8
  [ "$(env_of NCCL_NCHANNELS_PER_NET_PEER)" = 8 ]
}

@test "restore_default puts back the image's XLA_FLAGS, keeping what the node needs to work" {
  echo 'append_xla_flags --xla_gpu_model_specific=1' >"$REPO/configs/tiny.env.sh"
  GPU_DETECT_ROOT=$REPO_DIR/tests/fixtures/sysfs/h100 XLA_FLAGS="--image_flag=1" \
    "$REPO/_train.sh" tiny -- _env_TUNE_PROFILE=restore_default
  [ "$(env_of XLA_FLAGS)" = "--image_flag=1" ]
  "$REPO/_train.sh" tiny -- _env_TUNE_PROFILE=restore_default _env_ENABLE_XLA_DUMP=1
  [[ $(env_of XLA_FLAGS) == "--xla_force_host_platform_device_count=1 --xla_dump_to="* ]]
}

@test "an unknown TUNE_PROFILE stops the job before training (a typo must not train untuned and pass)" {
  rm -f "$RECORD.env"
  run "$REPO/_train.sh" tiny -- _env_TUNE_PROFILE=no_such_profile
  [ "$status" -eq 2 ]
  [[ $output == *"ERROR: TUNE_PROFILE='no_such_profile' is not a tuning profile; use one of: "*" mem95 "* ]]
  [ ! -e "$RECORD.env" ]   # training never started
}

@test "enable_checkpointing=true switches the output to a stable per-alias (or per-model) dir" {
  "$REPO/_train.sh" tiny -- enable_checkpointing=true
  [ "$(env_of OUTPUT_PATH)" = "$JOB_WORKSPACE/tiny" ]
  MODEL_NAME_ALIAS=run-a "$REPO/_train.sh" tiny -- enable_checkpointing=True
  [ "$(env_of OUTPUT_PATH)" = "$JOB_WORKSPACE/run-a" ]
  [ -d "$JOB_WORKSPACE/run-a" ]
  "$REPO/_train.sh" tiny -- enable_checkpointing=false
  [ "$(env_of OUTPUT_PATH)" = "$JOB_WORKSPACE/$JOB_DIR" ]
}

@test "the training environment is recorded in the job dir with secrets masked" {
  HF_TOKEN=hunter2 "$REPO/_train.sh" tiny -- _env_FOO=bar
  local f=$JOB_WORKSPACE/$JOB_DIR/environment.node0.txt
  grep -qx 'FOO=bar' "$f"
  grep -qx 'HF_TOKEN=\*\*\*' "$f"
  ! grep -q hunter2 "$f" || false   # a bare `! cmd` never fails a bats test
}

@test "the environment record shows what shapes training and masks every credential, however it is named" {
  local multi=$'first line\nFAKEmulti0000SECRET'
  HF_TOKEN=FAKEhf0000SECRET GH_PAT=FAKEpat0000SECRET OPENAI_KEY=FAKEoai0000SECRET AWS_ACCESS_KEY_ID=FAKEaws0000SECRET \
    JOBKIT_NOTIFY_URLS=tgram://123:FAKEtg0000SECRET/chat PIP_INDEX_URL=https://user:FAKEpip0000SECRET@pypi.example/simple \
    MULTI_LINE="$multi" NCCL_DEBUG=INFO SOME_RANDOM_SETTING=FAKErandom0000SECRET \
    run "$REPO/_train.sh" tiny -- _env_FOO=bar _env_WANDB_API_KEY=FAKEwandb0000SECRET \
      _env_XLA_PYTHON_CLIENT_MEM_FRACTION=.5 _env_DATASET_SOURCE=https://u:FAKEdata0000SECRET@example/d
  [ "$status" -eq 0 ]
  local f=$JOB_WORKSPACE/$JOB_DIR/environment.node0.txt
  grep -qx 'FOO=bar' "$f"                                  # an _env_ override is training's own setting
  grep -qx 'XLA_PYTHON_CLIENT_MEM_FRACTION=.5' "$f"
  grep -qx 'NCCL_DEBUG=INFO' "$f"
  grep -qx 'JAX_PLATFORMS=cpu' "$f"
  grep -qx 'DATASET_SOURCE=https://\*\*\*@example/d' "$f"          # shown, but not its password
  for name in HF_TOKEN GH_PAT OPENAI_KEY AWS_ACCESS_KEY_ID JOBKIT_NOTIFY_URLS PIP_INDEX_URL MULTI_LINE \
      SOME_RANDOM_SETTING WANDB_API_KEY; do
    grep -qx "$name=\*\*\*" "$f"
  done
  ! grep -q 0000SECRET "$f" || false
  ! grep -q 0000SECRET <<<"$output" || false                # nor in the log lines of the overrides
  [[ $output == *"_env_ override: WANDB_API_KEY=***"* ]]
}

@test "_env_ overrides that _container.sh passed as variables (run --env-file) are applied like the arguments" {
  run env _env_FOO=from-file "_env_QUOTED='q v'" _env_WANDB_API_KEY=FAKEwandb0000SECRET \
    "$REPO/_train.sh" tiny -- _env_FOO=from-arg
  [ "$status" -eq 0 ]
  local f=$JOB_WORKSPACE/$JOB_DIR/environment.node0.txt
  grep -qx 'FOO=from-arg' "$f"                   # an argument after it still wins
  grep -qx 'QUOTED=q v' "$f"                     # quotes stripped as for an argument
  grep -qx 'WANDB_API_KEY=\*\*\*' "$f"
  ! grep -q '^_env_' "$f" || false                # the carrier variables themselves are gone
  [[ $output == *"_env_ override: WANDB_API_KEY=***"* ]]
}

@test "an unknown model and a missing contract variable fail with the fix" {
  run "$REPO/_train.sh" nosuch
  [ "$status" -eq 2 ]
  [[ $output == *"no config for model 'nosuch'"* ]]
  run env -u JOB_DIR "$REPO/_train.sh" tiny
  [ "$status" -ne 0 ]
  [[ $output == *"JOB_DIR is not set"* ]]
}

@test "GPU nodes get the collective network from sysfs; a user's _env_ value wins" {
  export GPU_DETECT_ROOT=$REPO_DIR/tests/fixtures/sysfs/h100 NCCL_SYSFS_ROOT=$REPO_DIR/tests/fixtures/net/roce-bnxt
  unset NCCL_IB_HCA NCCL_IB_GID_INDEX
  "$REPO/_train.sh" tiny
  [[ $(env_of NCCL_IB_HCA) == bnxt_re* ]]
  [[ $(env_of NCCL_IB_GID_INDEX) =~ ^[0-9]+$ ]]
  "$REPO/_train.sh" tiny -- _env_NCCL_IB_HCA=mlx5_0
  [ "$(env_of NCCL_IB_HCA)" = mlx5_0 ]
  GPU_DETECT_ROOT=$BATS_TEST_TMPDIR/nogpu "$REPO/_train.sh" tiny
  [ -z "$(env_of NCCL_IB_HCA)" ]   # CPU nodes: nothing to detect
}

@test "the hang watchdog starts beside training with the job's log and dir; a bad HANG_* setting stops the job" {
  unset HANG_TIMEOUT
  make_stub fakepython "printf '%s\\n' \"\$*\" >>'$RECORD.calls'"
  run "$REPO/_train.sh" tiny -- steps=7
  [ "$status" -eq 0 ]
  [[ $output == *"[_train] hang watchdog: pid "*"HANG_ACTION=cancel)"* ]]
  local i
  for ((i = 0; i < 50; i++)); do [[ $(wc -l <"$RECORD.calls") -ge 3 ]] && break; sleep 0.1; done
  grep -qx -- "$REPO/py/bin/jobkit hang-watchdog --check" "$RECORD.calls"
  grep -qx -- "$REPO/py/bin/jobkit hang-watchdog --log $JOB_WORKSPACE/$JOB_DIR.log --job-dir $JOB_WORKSPACE/$JOB_DIR" "$RECORD.calls"
  grep -q -- "-u $REPO/py/bin/jobkit launch " "$RECORD.calls"
  # A real interpreter checks the settings: the job stops before training, with the one-line reason.
  TRAIN_PYTHON=$REPO_DIR/.venv/bin/python HANG_TIMEOUT=abc run "$REPO/_train.sh" tiny -- steps=7
  [ "$status" -eq 2 ]
  [[ $output == *"jobkit hang-watchdog: HANG_TIMEOUT=abc is not a positive number of seconds"* ]]
  [[ $output != *"jobkit launch"* ]]
  # nan passed a `<= 0` check and made the limit the floor, silently (audit rl4).
  TRAIN_PYTHON=$REPO_DIR/.venv/bin/python HANG_STEP_FACTOR=nan run "$REPO/_train.sh" tiny -- steps=7
  [ "$status" -eq 2 ]
  [[ $output == *"jobkit hang-watchdog: HANG_STEP_FACTOR=nan is not a positive number; e.g. HANG_STEP_FACTOR=10"* ]]
  [[ $output != *"jobkit launch"* ]]
}

@test "LOCAL_WORLD_SIZE>1 runs training under jobkit procs; 1 or unset does not" {
  LOCAL_WORLD_SIZE=2 run "$REPO/_train.sh" tiny -- steps=7
  [ "$status" -eq 0 ]
  mapfile -t argv <"$RECORD.argv"
  [ "${argv[*]:0:4}" = "-u $REPO/py/bin/jobkit procs --" ]
  [ "${argv[*]:4:4}" = "fakepython -u $REPO/py/bin/jobkit launch" ]
  [ "$(env_of LOCAL_WORLD_SIZE)" = 2 ]
  _env_LOCAL_WORLD_SIZE=1 run "$REPO/_train.sh" tiny -- steps=7
  mapfile -t argv <"$RECORD.argv"
  [ "${argv[*]:0:3}" = "-u $REPO/py/bin/jobkit launch" ]
}

@test "LOCAL_WORLD_SIZE: auto is one per usable GPU; more than the usable GPUs, or a bad value, stops before training" {
  export GPU_DETECT_ROOT=$REPO_DIR/tests/fixtures/sysfs/h100   # two GPUs
  run "$REPO/_train.sh" tiny -- _env_LOCAL_WORLD_SIZE=auto
  [ "$status" -eq 0 ]
  [[ $output == *"[_train] LOCAL_WORLD_SIZE=auto: 2 (usable GPUs on this node: 2)"* ]]
  [ "$(env_of LOCAL_WORLD_SIZE)" = 2 ]
  grep -qx procs "$RECORD.argv"
  rm "$RECORD.argv"
  CUDA_VISIBLE_DEVICES=1 LOCAL_WORLD_SIZE=2 run "$REPO/_train.sh" tiny
  [ "$status" -eq 2 ]
  [ "${lines[-1]}" = "_train.sh: LOCAL_WORLD_SIZE=2 is more processes than the 1 nvidia GPU(s) this node lets training use; set LOCAL_WORLD_SIZE=1 (or auto)" ]
  ! grep -qx launch "$RECORD.argv"   # only the settings checks ran
  TRAIN_PYTHON=$REPO_DIR/.venv/bin/python LOCAL_WORLD_SIZE=two run "$REPO/_train.sh" tiny
  [ "$status" -eq 2 ]
  [[ $output == *"jobkit procs: LOCAL_WORLD_SIZE=two is not a whole number; set 1..64 or auto (one per GPU)"* ]]
  [[ $output != *"jobkit launch"* ]]
}
