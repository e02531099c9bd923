#!/usr/bin/env bats
# The container tier: runtime detection (utils/lib/container_runtime.sh) and _container.sh in docker, podman
# (stubbed CLIs that record their argv) and native mode (for real, with a stub _train.sh).
# Literal $ in single quotes is meant (SC2016); bats runs each test in a subshell on purpose (SC2030/SC2031).
# shellcheck disable=SC2016,SC2030,SC2031

load test_helper
load container_helper

setup() {
  # shellcheck disable=SC2046
  unset CONTAINER_RUNTIME DOCKER_IMAGE DOCKER_REGISTRY MAXTEXT_REPO_DIR DATASET_DIR CONTAINER_NOFILE \
    CONTAINER_PTRACE CONTAINER_RUN_EXTRA_ARGS DOCKER_USERNAME DOCKER_TOKEN VIRTUAL_ENV VENV_DIR $(allowlist_names)
  export STUB_LOG_DIR=$BATS_TEST_TMPDIR/log
  export JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws
  export _DEV_ROOT=$BATS_TEST_TMPDIR/devroot
  export DATASET_DIR=$BATS_TEST_TMPDIR/no-datasets
  export HOME=$BATS_TEST_TMPDIR/home
  mkdir -p "$STUB_LOG_DIR" "$_DEV_ROOT/dev" "$HOME"
  make_scripts_copy
}

# detect ARG...: runs detect_container_runtime in a fresh bash under the sandbox PATH.
detect() {
  run env PATH="$SANDBOX_BIN" bash -c 'source "$1"; detect_container_runtime' run_local.sh "$REPO_DIR/utils/lib/container_runtime.sh"
}

# ---------------------------------------------------------------------------------------- detection

@test "detect: podman is preferred when both runtimes answer" {
  make_sandbox docker podman
  STUB_PODMAN_INFO_RC=0 STUB_DOCKER_INFO_RC=0 detect
  [ "$status" -eq 0 ]
  [ "$output" = podman ]
}

@test "detect: docker when podman does not answer" {
  make_sandbox docker podman
  STUB_PODMAN_INFO_RC=1 STUB_DOCKER_INFO_RC=0 detect
  [ "$status" -eq 0 ]
  [ "$output" = docker ]
}

@test "detect: a docker CLI without an engine is none" {
  make_sandbox docker
  STUB_DOCKER_INFO_RC=1 detect
  [ "$status" -eq 0 ]
  [ "$output" = none ]
  grep -qx 'docker info' "$STUB_LOG_DIR/docker.calls"
}

@test "detect: no runtime binaries at all is none" {
  make_sandbox
  detect
  [ "$status" -eq 0 ]
  [ "$output" = none ]
}

@test "detect: a hanging 'podman info' is cut off by the probe timeout" {
  make_sandbox podman
  local start=$SECONDS
  CONTAINER_RUNTIME_PROBE_TIMEOUT=1 STUB_INFO_SLEEP=30 STUB_PODMAN_INFO_RC=0 detect
  [ "$status" -eq 0 ]
  [ "$output" = none ]
  (( SECONDS - start < 10 ))
}

@test "detect: an engine without the image on a CPU host trains natively and says why" {
  make_sandbox docker podman
  STUB_PODMAN_INFO_RC=0 STUB_IMAGE_PRESENT=0 DOCKER_IMAGE=team/jax:1 detect
  [ "$status" -eq 0 ]
  [ "${lines[-1]}" = none ]
  [[ $output == *"podman answers, but DOCKER_IMAGE=team/jax:1 is not on this host"* ]]
  [[ $output == *"utils/build_image.sh"* ]]
  grep -qx 'podman image inspect team/jax:1' "$STUB_LOG_DIR/podman.calls"
}

@test "detect: an engine is taken for an image tarball that exists, or on a GPU host" {
  make_sandbox podman
  : >"$BATS_TEST_TMPDIR/image.tar"
  STUB_PODMAN_INFO_RC=0 STUB_IMAGE_PRESENT=0 DOCKER_IMAGE=$BATS_TEST_TMPDIR/image.tar detect
  [ "$output" = podman ]
  STUB_PODMAN_INFO_RC=0 STUB_IMAGE_PRESENT=0 DOCKER_IMAGE=$BATS_TEST_TMPDIR/missing.tar detect
  [ "${lines[-1]}" = none ]
  mkdir -p "$_DEV_ROOT/dev" && : >"$_DEV_ROOT/dev/kfd"
  STUB_PODMAN_INFO_RC=0 STUB_IMAGE_PRESENT=0 DOCKER_IMAGE=team/jax:1 detect
  [ "$output" = podman ]
}

# host_args [FUNCTION-OVERRIDES]: container_host_run_args podman under the sandbox PATH, one option a line.
host_args() {
  run env PATH="$SANDBOX_BIN" bash -c 'source "$1"; eval "$2"; container_host_run_args "$3"' _ \
    "$REPO_DIR/utils/lib/container_runtime.sh" "${HOST_ARGS_EVAL:-}" "${1:-podman}"
}

@test "host args: podman's crun on a hybrid cgroup layout becomes --runtime runc; the user's --runtime wins" {
  make_sandbox podman
  ln -sf "$(command -v true)" "$SANDBOX_BIN/runc"
  ln -sf "$(command -v stat)" "$SANDBOX_BIN/stat"
  HOST_ARGS_EVAL='_container_runtime_cgroup_hybrid() { return 0; }' STUB_OCI_RUNTIME=crun host_args
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = --runtime ] && [ "${lines[1]}" = runc ]
  HOST_ARGS_EVAL='_container_runtime_cgroup_hybrid() { return 1; }' STUB_OCI_RUNTIME=crun host_args
  [[ $output != *--runtime* ]]
  HOST_ARGS_EVAL='_container_runtime_cgroup_hybrid() { return 0; }' STUB_OCI_RUNTIME=runc host_args
  [[ $output != *--runtime* ]]
  CONTAINER_RUN_EXTRA_ARGS="--runtime crun" HOST_ARGS_EVAL='_container_runtime_cgroup_hybrid() { return 0; }' \
    STUB_OCI_RUNTIME=crun host_args
  [[ $output != *--runtime* ]]
}

@test "host args: podman gets an nproc limit it may set (hard limit, at most pid_max); docker gets nothing" {
  make_sandbox podman docker
  ln -sf "$(command -v cat)" "$SANDBOX_BIN/cat"
  host_args podman
  local want hard pid_max
  hard=$(ulimit -Hu) pid_max=$(cat /proc/sys/kernel/pid_max)
  if [[ $hard == unlimited ]] || (( hard > pid_max )); then want=$pid_max; else want=$hard; fi
  [ "${lines[-2]}" = --ulimit ]
  [ "${lines[-1]}" = "nproc=$want:$want" ]
  CONTAINER_RUN_EXTRA_ARGS="--ulimit nproc=100:100" host_args podman
  [[ $output != *nproc* ]]
  host_args docker
  [ -z "$output" ]
}

@test "CONTAINER_RUNTIME picks the runtime without probing; none wins over an answering podman" {
  make_sandbox docker podman
  CONTAINER_RUNTIME=docker STUB_DOCKER_INFO_RC=1 detect
  [ "$output" = docker ]
  CONTAINER_RUNTIME=none STUB_PODMAN_INFO_RC=0 detect
  [ "$output" = none ]
  CONTAINER_RUNTIME=podman detect
  [ "$output" = podman ]
  [ ! -e "$STUB_LOG_DIR/podman-info.argv" ]
  [ ! -e "$STUB_LOG_DIR/docker-info.argv" ]
}

@test "CONTAINER_RUNTIME=podman without podman on PATH: one-line error naming the fix, status 2" {
  make_sandbox docker
  CONTAINER_RUNTIME=podman detect
  [ "$status" -eq 2 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ $output == *"CONTAINER_RUNTIME=podman but 'podman' is not on PATH"*"CONTAINER_RUNTIME=none"* ]]
}

@test "unknown CONTAINER_RUNTIME: the library returns 2 with the one-line error" {
  make_sandbox docker podman
  CONTAINER_RUNTIME=lxc detect
  [ "$status" -eq 2 ]
  [ "$output" = "run_local.sh: unknown CONTAINER_RUNTIME 'lxc' (use podman, docker or none)" ]
}

@test "unknown CONTAINER_RUNTIME: _container.sh exits 2 and creates and calls nothing" {
  make_sandbox docker podman
  CONTAINER_RUNTIME=lxc STUB_DOCKER_INFO_RC=0 run_container tiny -- steps=1
  [ "$status" -eq 2 ]
  [ "$output" = "_container.sh: unknown CONTAINER_RUNTIME 'lxc' (use podman, docker or none)" ]
  [ ! -e "$JOB_WORKSPACE" ]
  [ -z "$(ls "$STUB_LOG_DIR")" ]
}

# ---------------------------------------------------------------------------------------- usage

@test "usage errors exit 2 with one line; --help prints the header" {
  make_sandbox docker
  local bad
  for bad in "--" "-x" "tiny extra" "bad/model" ""; do
    # shellcheck disable=SC2086
    run env PATH="$SANDBOX_BIN" "$SCRIPTS/_container.sh" ${bad:-""}
    [ "$status" -eq 2 ] || { echo "status $status for '$bad'"; false; }
    [ "${#lines[@]}" -eq 1 ]
    [[ $output == "_container.sh: "*"--help"* ]]
  done
  run "$SCRIPTS/_container.sh" --help
  [ "$status" -eq 0 ]
  [[ ${lines[0]} == "Usage: _container.sh [<MODEL_NAME> [-- <passthrough> ...] | --pull]" ]]
  [[ $output == *"Summary:"* ]]
}

@test "a missing _train.sh is an error naming the fix" {
  make_sandbox
  rm "$SCRIPTS/_train.sh"
  CONTAINER_RUNTIME=none run_container tiny
  [ "$status" -eq 1 ]
  [[ $output == *"_train.sh is missing or not executable; restore it"* ]]
}

# ---------------------------------------------------------------------------------------- docker run argv

@test "C1: SYS_PTRACE only while py-spy may be needed (CONTAINER_PTRACE); memlock as the engine may grant it" {
  make_sandbox docker podman
  CONTAINER_RUNTIME=docker run_container tiny
  [ "$status" -eq 0 ]
  assert_argv_has "$STUB_LOG_DIR/docker-run.argv" --cap-add=SYS_PTRACE   # auto, the hang watchdog is on
  CONTAINER_RUNTIME=docker HANG_TIMEOUT=off run_container tiny
  [ "$status" -eq 0 ]
  refute_argv_has "$STUB_LOG_DIR/docker-run.argv" --cap-add=SYS_PTRACE
  assert_argv_has "$STUB_LOG_DIR/docker-run.argv" --cap-drop=ALL
  CONTAINER_RUNTIME=docker HANG_TIMEOUT=off RAY=1 run_container tiny   # Ray's dashboard stack traces
  assert_argv_has "$STUB_LOG_DIR/docker-run.argv" --cap-add=SYS_PTRACE
  CONTAINER_RUNTIME=docker CONTAINER_PTRACE=0 run_container tiny
  refute_argv_has "$STUB_LOG_DIR/docker-run.argv" --cap-add=SYS_PTRACE
  CONTAINER_RUNTIME=docker CONTAINER_PTRACE=sometimes run_container tiny
  [ "$status" -eq 2 ]
  [[ $output == *"CONTAINER_PTRACE='sometimes' is not auto, 0 or 1"* ]]
  # memlock: the user's own setting wins; rootless podman asks only for what this shell's hard limit allows
  CONTAINER_RUNTIME=docker CONTAINER_RUN_EXTRA_ARGS="--ulimit memlock=65536:65536" run_container tiny
  [ "$(grep -c 'memlock=' "$STUB_LOG_DIR/docker-run.argv")" -eq 1 ]
  assert_argv_has "$STUB_LOG_DIR/docker-run.argv" --ulimit memlock=65536:65536
  local -a as_user=()   # a user's rootless podman: as nobody when we are root
  if (( EUID == 0 )); then as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups); fi
  run "${as_user[@]}" bash -c "$(cat "$REPO_DIR/utils/lib/container_runtime.sh")"$'\n''container_memlock podman'
  local hard
  hard=$(ulimit -Hl)
  if [[ $hard == unlimited ]]; then [ "$output" = -1 ]; else [ "$output" = $((hard * 1024)) ]; fi
}

@test "C1: _env_ values reach the container through a private --env-file, never on the run command line" {
  make_sandbox docker
  export JOB_ID=j5 NODE_RANK=0 TMPDIR=$BATS_TEST_TMPDIR/tmp
  mkdir -p "$TMPDIR"
  CONTAINER_RUNTIME=docker STUB_RUN_EXEC=1 run_container tiny -- steps=2 _env_HF_TOKEN=hf_FAKE0000SECRET \
    "_env_MSG=a b" _env_HF_TOKEN=hf_FAKE0000SECRET2
  [ "$status" -eq 0 ]
  local argv=$STUB_LOG_DIR/docker-run.argv
  ! grep -q 'FAKE0000SECRET\|_env_' "$argv" "$STUB_LOG_DIR/docker.calls" || false
  assert_argv_has "$argv" /workspace/launcher/_train.sh tiny -- steps=2
  [ "$(tail -n 1 "$argv")" = steps=2 ]
  local file
  file=$(grep -A1 -x -- --env-file "$argv" | tail -n 1)
  [[ $file == "$TMPDIR"/container-env.*/env ]]
  [ "$(cat "$STUB_LOG_DIR/docker-run.env-file.mode")" = 600 ]
  [ "$(cat "$STUB_LOG_DIR/docker-run.env-file")" = "$(printf '%s\n' _env_HF_TOKEN=hf_FAKE0000SECRET2 '_env_MSG=a b')" ]
  [ ! -e "$(dirname "$file")" ]   # removed when the container ended
  # inside, the stub _train.sh sees them as variables (the real one takes them as its _env_ overrides)
  [[ $output == *$'ARG[tiny]\nARG[--]\nARG[steps=2]\nVIRTUAL_ENV'* ]]
  # a newline cannot be carried by an env file: refused, nothing run
  rm "$argv"
  CONTAINER_RUNTIME=docker run_container tiny -- $'_env_X=a\nb'
  [ "$status" -eq 2 ]
  [[ $output == *"the value of _env_X holds a newline"* ]]
  [ ! -e "$argv" ]
  [ -z "$(ls -A "$TMPDIR")" ]
}

@test "docker run: name, labels, flags, mounts, workdir, image, command" {
  make_sandbox docker
  mkdir -p "$BATS_TEST_TMPDIR/datasets"
  JOB_ID=job42 NODE_RANK=1 DATASET_DIR=$BATS_TEST_TMPDIR/datasets STUB_DOCKER_INFO_RC=0 \
    run_container tiny -- steps=3
  [ "$status" -eq 0 ]
  local argv=$STUB_LOG_DIR/docker-run.argv
  [ "$(head -n 1 "$argv")" = run ]
  assert_argv_has "$argv" --rm
  assert_argv_has "$argv" --name maxtext-job42-node1
  assert_argv_has "$argv" --label maxtext-launcher=1
  assert_argv_has "$argv" --label maxtext-launcher.job=job42
  assert_argv_has "$argv" --network=host
  assert_argv_has "$argv" --ipc=host
  # C1: no new privileges, every capability dropped but the few training needs (SYS_PTRACE: py-spy for the
  # hang watchdog, on by default), memlock unlimited for RDMA, the launcher read-only.
  assert_argv_has "$argv" --security-opt=no-new-privileges --cap-drop=ALL --cap-add=CHOWN --cap-add=DAC_OVERRIDE \
    --cap-add=FOWNER --cap-add=IPC_LOCK --cap-add=SYS_PTRACE
  [ "$(grep -c -- '^--cap-add' "$argv")" -eq 5 ]
  ! grep -qx -- '--privileged\|--pid=host\|--user' "$argv" || false
  local hard
  hard=$(ulimit -Hn)
  if [[ $hard == unlimited ]] || (( hard > 1048576 )); then hard=1048576; fi
  assert_argv_has "$argv" --ulimit "nofile=$hard:$hard"
  assert_argv_has "$argv" --ulimit memlock=-1:-1
  assert_argv_has "$argv" -v "$SCRIPTS:/workspace/launcher:ro"
  refute_argv_has "$argv" -v "$SCRIPTS:/workspace/launcher"
  assert_argv_has "$argv" -w /workspace/launcher
  assert_argv_has "$argv" -v "$JOB_WORKSPACE:/outputs"
  assert_argv_has "$argv" -v "$BATS_TEST_TMPDIR/datasets:/datasets:ro"
  assert_argv_has "$argv" --sig-proxy=false
  assert_argv_has "$argv" docker.io/rocm/jax-training:maxtext-v26.2 bash /workspace/launcher/utils/container_init.sh \
    /workspace/launcher/_train.sh tiny -- steps=3
  [ "$(tail -n 1 "$argv")" = "steps=3" ]
  [ -d "$JOB_WORKSPACE" ]
}

@test "docker run: only allow-listed variables cross, JOB_WORKSPACE as /outputs" {
  make_sandbox docker
  export SECRET_TOKEN=hunter2 PYTHONHOME=/host/site-packages JOB_ID=j1 JOB_NAME=JAX-tiny NODE_RANK=0 NNODES=1 \
    TUNE_PROFILE=fast RAY='' MAXTEXT_REPO_DIR=/opt/maxtext
  CONTAINER_RUNTIME=docker run_container tiny
  [ "$status" -eq 0 ]
  local argv=$STUB_LOG_DIR/docker-run.argv
  assert_argv_has "$argv" --env JOB_ID=j1
  assert_argv_has "$argv" --env JOB_NAME=JAX-tiny
  assert_argv_has "$argv" --env NNODES=1
  assert_argv_has "$argv" --env NODE_RANK=0
  assert_argv_has "$argv" --env TUNE_PROFILE=fast
  assert_argv_has "$argv" --env RAY=
  assert_argv_has "$argv" --env JOB_WORKSPACE=/outputs
  assert_argv_has "$argv" --env "JOB_WORKSPACE_HOST=$JOB_WORKSPACE"
  assert_argv_has "$argv" --env MAXTEXT_REPO_DIR=/opt/maxtext
  ! grep -q hunter2 "$argv" || false
  ! grep -q /host/site-packages "$argv" || false
  # unset allow-listed variables do not cross either
  refute_argv_has "$argv" --env JAX_COORDINATOR_IP=
  local allowed=" JOB_ID JOB_NAME JOB_DIR NNODES NODE_RANK JAX_COORDINATOR_IP JAX_COORDINATOR_PORT MODEL_NAME
    MODEL_NAME_ALIAS EXP_TAG NODELIST_EXPANDED RAY RAY_PORT STAGE_TIMEOUTS HARDWARE_PEAK_TFLOPS TUNE_PROFILE
    ENABLE_XLA_DUMP JOB_WORKSPACE JOB_WORKSPACE_HOST MAXTEXT_REPO_DIR " name
  allowed=${allowed//$'\n'/ }
  for name in $(argv_env_names "$argv"); do
    [[ $allowed == *" $name "* ]] || { echo "not allow-listed: $name"; false; }
  done
  [ "$(argv_env_names "$argv" | wc -l)" -eq 9 ]
}

# Names that do not cross on purpose (the comment under the allow-list in _container.sh says why):
HOST_ONLY="DATASET_DIR CONTAINER_RUNTIME DOCKER_IMAGE DOCKER_REGISTRY"   # mounts and the choice of container
HOST_ONLY+=" CONTAINER_NOFILE CONTAINER_PTRACE CONTAINER_RUN_EXTRA_ARGS CONTAINER_STOP_TIMEOUT"   # how it is run
HOST_ONLY+=" JAX_CACHE_DIR VENV_DIR"                  # host paths; the container has its own
HOST_ONLY+=" XLA_FLAGS TMPDIR USER"                   # the image's / the container's own
HOST_ONLY+=" OUTPUT_PATH RAY_AUTH_TOKEN_PATH PROCS_EXIT_FILE"   # set inside the training tier itself
HOST_ONLY+=" CANCEL_GRACE_SECONDS TASK_KILL_GRACE STAGE_STOP_GRACE EARLY_DEATH_CHECK_SECONDS"   # orchestration's own
HOST_ONLY+=" MAX_RETRIES TIME_LIMIT_SIGNAL_LEAD TIME_LIMIT_SAVE_GRACE"   # the batch script's: requeue, time limit
HOST_ONLY+=" JOBKIT_NOTIFY_URLS"                      # the login node's: jobkit notify / monitor
HOST_ONLY+=" FAILURE_SIGNATURES_FILE"                 # the batch host's and login node's: why, requeue, monitor
HOST_ONLY+=" BRIDGE_DIR BRIDGE_NODE BRIDGE_POLICY_FILE"   # the host-command bridge: a server on the host, not training

@test "docker run: every training-side setting in docs/settings.md and the training tier's sources crosses" {
  make_sandbox docker
  local -a wanted=() missing=()
  local name
  mapfile -t wanted < <({ settings_table_vars; training_tier_vars; } | sort -u)
  (( ${#wanted[@]} > 40 ))   # the settings page and the sources were found and read
  for name in "${wanted[@]}"; do
    # JOB_WORKSPACE stays the sandbox's: a relative "v-JOB_WORKSPACE" was made in the caller's directory.
    [[ " $HOST_ONLY " == *" $name "* || $name == JOB_WORKSPACE ]] && continue
    export "$name=v-$name"
  done
  [[ ! -v PASS_ENV ]] || export PASS_ENV=HOME   # PASS_ENV holds names of variables that are set
  CONTAINER_RUNTIME=docker run_container tiny
  [ "$status" -eq 0 ]
  local crossed
  crossed=" $(argv_env_names "$STUB_LOG_DIR/docker-run.argv" | tr '\n' ' ') "
  for name in "${wanted[@]}"; do
    [[ " $HOST_ONLY " == *" $name "* || $crossed == *" $name "* ]] || missing+=("$name")
  done
  (( ${#missing[@]} == 0 )) || { echo "not passed into the container: ${missing[*]}"; false; }
  # and none of the host-only ones
  for name in $HOST_ONLY; do
    [[ $crossed != *" $name "* || $name == JOB_WORKSPACE ]] || { echo "host-only $name crossed"; false; }
  done
}

@test "docker run: no dataset mount when DATASET_DIR does not exist; the container name is sanitised" {
  make_sandbox docker
  JOB_ID='a/b:c d' NODE_RANK=0 CONTAINER_RUNTIME=docker run_container tiny
  [ "$status" -eq 0 ]
  local argv=$STUB_LOG_DIR/docker-run.argv
  assert_argv_has "$argv" --name maxtext-a_b_c_d-node0
  ! grep -q ':/datasets' "$argv" || false
}

@test "docker run: the container's exit status is _container.sh's" {
  make_sandbox docker
  CONTAINER_RUNTIME=docker STUB_RUN_RC=7 run_container tiny
  [ "$status" -eq 7 ]
}

@test "settings: DOCKER_IMAGE/DOCKER_REGISTRY/CONTAINER_NOFILE/CONTAINER_RUN_EXTRA_ARGS come from the environment" {
  make_sandbox docker
  CONTAINER_RUNTIME=docker DOCKER_REGISTRY=registry.example:5000 DOCKER_IMAGE=team/jax:1 CONTAINER_NOFILE=4096 \
    CONTAINER_RUN_EXTRA_ARGS='--runtime runc --security-opt seccomp=unconfined' run_container tiny
  [ "$status" -eq 0 ]
  local argv=$STUB_LOG_DIR/docker-run.argv
  assert_argv_has "$argv" --ulimit nofile=4096:4096
  assert_argv_has "$argv" --runtime runc --security-opt seccomp=unconfined registry.example:5000/team/jax:1 bash
  CONTAINER_RUNTIME=docker DOCKER_IMAGE=ghcr.io/org/jax:2 run_container tiny
  assert_argv_has "$argv" ghcr.io/org/jax:2 bash
  CONTAINER_RUNTIME=docker CONTAINER_NOFILE=lots run_container tiny
  [ "$status" -eq 2 ]
  [[ $output == *"CONTAINER_NOFILE='lots' is not a number"* ]]
}

@test "settings file: environment wins, the .local file is read, defaults otherwise" {
  run bash -c 'source "$1"; echo "$DOCKER_IMAGE|$DOCKER_REGISTRY|$MAXTEXT_REPO_DIR"' _ \
    "$SCRIPTS/configs/container_settings.sh"
  [ "$output" = "rocm/jax-training:maxtext-v26.2|docker.io|/workspace/maxtext" ]
  echo 'DOCKER_USERNAME=${DOCKER_USERNAME:-site-user}' >"$SCRIPTS/configs/container_settings.local.sh"
  DOCKER_IMAGE=mine:1 run bash -c 'source "$1"; echo "$DOCKER_IMAGE|$DOCKER_USERNAME"' _ \
    "$SCRIPTS/configs/container_settings.sh"
  [ "$output" = "mine:1|site-user" ]
  DOCKER_USERNAME=env-user run bash -c 'source "$1"; echo "$DOCKER_USERNAME"' _ \
    "$SCRIPTS/configs/container_settings.sh"
  [ "$output" = env-user ]
}

@test "image: a local *.tar is loaded and the loaded name is run; a missing one is an error" {
  make_sandbox docker
  : >"$BATS_TEST_TMPDIR/img.tar"
  CONTAINER_RUNTIME=docker DOCKER_IMAGE=$BATS_TEST_TMPDIR/img.tar STUB_LOADED_IMAGE=jax:local run_container tiny
  [ "$status" -eq 0 ]
  assert_argv_has "$STUB_LOG_DIR/docker-load.argv" load -i "$BATS_TEST_TMPDIR/img.tar"
  assert_argv_has "$STUB_LOG_DIR/docker-run.argv" jax:local bash /workspace/launcher/utils/container_init.sh
  CONTAINER_RUNTIME=docker DOCKER_IMAGE=$BATS_TEST_TMPDIR/none.tar run_container tiny
  [ "$status" -eq 2 ]
  [[ $output == *"none.tar is not a file"* ]]
}

@test "image: missing locally is pulled; a refused pull logs in with the token on stdin, never in argv" {
  make_sandbox docker
  CONTAINER_RUNTIME=docker STUB_IMAGE_PRESENT=0 run_container tiny
  [ "$status" -eq 0 ]
  assert_argv_has "$STUB_LOG_DIR/docker-pull.argv" pull docker.io/rocm/jax-training:maxtext-v26.2
  [ ! -e "$STUB_LOG_DIR/docker-login.argv" ]

  CONTAINER_RUNTIME=docker STUB_IMAGE_PRESENT=0 STUB_PULL_NEEDS_LOGIN=1 DOCKER_USERNAME=me DOCKER_TOKEN=s3cret \
    run_container tiny
  [ "$status" -eq 0 ]
  assert_argv_has "$STUB_LOG_DIR/docker-login.argv" login --username me --password-stdin docker.io
  [ "$(cat "$STUB_LOG_DIR/login.stdin")" = s3cret ]
  ! grep -rq s3cret "$STUB_LOG_DIR"/*.argv "$STUB_LOG_DIR"/*.calls || false

  rm "$STUB_LOG_DIR/logged-in"
  CONTAINER_RUNTIME=docker STUB_IMAGE_PRESENT=0 STUB_PULL_NEEDS_LOGIN=1 STUB_RUN_RC=0 run_container tiny
  [ "$status" -eq 1 ]
  [[ $output == *"cannot pull docker.io/rocm/jax-training:maxtext-v26.2 with docker; "*"DOCKER_TOKEN"* ]]
}

@test "C2: an image pinned by digest is pulled and run by that digest, untouched; a malformed one is refused" {
  make_sandbox docker
  local digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
  CONTAINER_RUNTIME=docker STUB_IMAGE_PRESENT=0 DOCKER_IMAGE=rocm/jax-training@$digest run_container tiny
  [ "$status" -eq 0 ]
  [ "$(cat "$STUB_LOG_DIR/docker-pull.argv")" = "$(printf '%s\n' pull "docker.io/rocm/jax-training@$digest")" ]
  assert_argv_has "$STUB_LOG_DIR/docker-run.argv" "docker.io/rocm/jax-training@$digest" bash
  [[ $output == *"pinned by digest"* ]]
  # with a tag and a registry port: nothing is added or cut
  CONTAINER_RUNTIME=docker STUB_IMAGE_PRESENT=0 DOCKER_IMAGE=reg.example:5000/team/jax:v1@$digest run_container --pull
  [ "$status" -eq 0 ]
  [ "$(cat "$STUB_LOG_DIR/docker-pull.argv")" = "$(printf '%s\n' pull "reg.example:5000/team/jax:v1@$digest")" ]
  # a tag is pulled with a note on pinning
  CONTAINER_RUNTIME=docker STUB_IMAGE_PRESENT=0 run_container --pull
  [[ $output == *"(a tag, which its registry may move; DOCKER_IMAGE=<name>@sha256:<digest> pins it)"* ]]
  rm "$STUB_LOG_DIR"/docker-*.argv
  CONTAINER_RUNTIME=docker DOCKER_IMAGE=rocm/jax-training@sha256:abc run_container tiny
  [ "$status" -eq 2 ]
  [[ $output == *"DOCKER_IMAGE=rocm/jax-training@sha256:abc is not a valid digest reference; pin an image as <name>@sha256:<64 hex digits>"* ]]
  [ ! -e "$STUB_LOG_DIR/docker-pull.argv" ] && [ ! -e "$STUB_LOG_DIR/docker-run.argv" ]
}

@test "--pull: pulls a missing image and runs nothing; natively there is nothing to pull" {
  make_sandbox docker
  CONTAINER_RUNTIME=docker STUB_IMAGE_PRESENT=0 run_container --pull
  [ "$status" -eq 0 ]
  assert_argv_has "$STUB_LOG_DIR/docker-pull.argv" pull docker.io/rocm/jax-training:maxtext-v26.2
  [ ! -e "$STUB_LOG_DIR/docker-run.argv" ]
  [[ $output == *"image ready on"* ]]
  rm "$STUB_LOG_DIR/docker-pull.argv"
  CONTAINER_RUNTIME=docker run_container --pull
  [ "$status" -eq 0 ]
  [ ! -e "$STUB_LOG_DIR/docker-pull.argv" ]   # present already: no pull
  CONTAINER_RUNTIME=none run_container --pull
  [ "$status" -eq 0 ]
  [[ $output == *"no image to pull"* ]]
}

@test "leftover: our container with the same name is removed first; someone else's is refused" {
  make_sandbox docker
  JOB_ID=j7 CONTAINER_RUNTIME=docker STUB_LEFTOVER_LABEL=1 run_container tiny
  [ "$status" -eq 0 ]
  assert_argv_has "$STUB_LOG_DIR/docker-container-inspect.argv" maxtext-j7-node0
  assert_argv_has "$STUB_LOG_DIR/docker-rm.argv" rm -f maxtext-j7-node0
  # rm happens before run
  [ "$(grep -n '^docker rm ' "$STUB_LOG_DIR/docker.calls" | cut -d: -f1)" -lt \
    "$(grep -n '^docker run ' "$STUB_LOG_DIR/docker.calls" | cut -d: -f1)" ]

  rm "$STUB_LOG_DIR"/*
  JOB_ID=j7 CONTAINER_RUNTIME=docker STUB_LEFTOVER_LABEL='' run_container tiny
  [ "$status" -eq 1 ]
  [[ $output == *"a container named maxtext-j7-node0 exists that this launcher did not start"* ]]
  ! grep -q '^docker \(rm\|run\) ' "$STUB_LOG_DIR/docker.calls" || false
}

# ---------------------------------------------------------------------------------------- devices

@test "devices: AMD /dev/kfd + /dev/dri, and /dev/infiniband" {
  make_sandbox docker nvidia-smi
  touch "$_DEV_ROOT/dev/kfd"
  mkdir -p "$_DEV_ROOT/dev/dri" "$_DEV_ROOT/dev/infiniband"
  CONTAINER_RUNTIME=docker run_container tiny
  [ "$status" -eq 0 ]
  local argv=$STUB_LOG_DIR/docker-run.argv
  assert_argv_has "$argv" --device "$_DEV_ROOT/dev/kfd" --device "$_DEV_ROOT/dev/dri" --group-add video
  assert_argv_has "$argv" --device "$_DEV_ROOT/dev/infiniband"
  refute_argv_has "$argv" --gpus all
}

@test "devices: NVIDIA is --gpus all for docker, --device nvidia.com/gpu=all for podman" {
  make_sandbox docker podman nvidia-smi
  CONTAINER_RUNTIME=docker run_container tiny
  [ "$status" -eq 0 ]
  assert_argv_has "$STUB_LOG_DIR/docker-run.argv" --gpus all
  refute_argv_has "$STUB_LOG_DIR/docker-run.argv" --group-add video
  STUB_PODMAN_INFO_RC=0 run_container tiny
  [ "$status" -eq 0 ]
  [ "$(head -n 1 "$STUB_LOG_DIR/podman-run.argv")" = run ]
  assert_argv_has "$STUB_LOG_DIR/podman-run.argv" --device nvidia.com/gpu=all
  refute_argv_has "$STUB_LOG_DIR/podman-run.argv" --gpus all
  grep -qx 'maxtext-unknown-[0-9]*-node0' "$STUB_LOG_DIR/podman-run.argv"
}

@test "devices: no GPU at all is a warning line and no device flags" {
  make_sandbox docker nvidia-smi
  CONTAINER_RUNTIME=docker STUB_NVIDIA_RC=9 run_container tiny
  [ "$status" -eq 0 ]
  [[ $output == *"_container.sh: warning: no GPU found"* ]]
  ! grep -qx -- '--device\|--gpus' "$STUB_LOG_DIR/docker-run.argv" || false
}

# ---------------------------------------------------------------------------------------- inside the container

@test "container: passthrough with spaces and quotes arrives intact; only the allow-list is set inside" {
  make_sandbox docker
  export SECRET_TOKEN=hunter2 JOB_ID=j9 NODE_RANK=0
  CONTAINER_RUNTIME=docker STUB_RUN_EXEC=1 run_container tiny -- steps=2 "run_name=a b" "x='q'\"dq\"" '$HOME' ''
  [ "$status" -eq 0 ]
  local expected
  expected=$(printf '%s\n' 'ARG[tiny]' 'ARG[--]' 'ARG[steps=2]' 'ARG[run_name=a b]' "ARG[x='q'\"dq\"]" \
    'ARG[$HOME]' 'ARG[]' 'VIRTUAL_ENV=<unset>' 'SECRET_TOKEN=<unset>' 'JOB_ID=j9' 'NODE_RANK=0' \
    'JOB_WORKSPACE=/outputs' 'MAXTEXT_REPO_DIR=/workspace/maxtext')
  [[ $output == *"$expected"* ]] || { echo "expected:"; echo "$expected"; false; }
}

@test "container: no arguments opens an interactive bash in a container with the same mounts" {
  make_sandbox docker
  JOB_ID=j3 CONTAINER_RUNTIME=docker run_container </dev/null
  [ "$status" -eq 0 ]
  local argv=$STUB_LOG_DIR/docker-run.argv
  assert_argv_has "$argv" run -i --rm --name maxtext-j3-node0
  assert_argv_has "$argv" -v "$SCRIPTS:/workspace/launcher:ro" -w /workspace/launcher
  assert_argv_has "$argv" --security-opt=no-new-privileges --cap-drop=ALL
  [ "$(tail -n 2 "$argv" | head -n 1)" = docker.io/rocm/jax-training:maxtext-v26.2 ]
  [ "$(tail -n 1 "$argv")" = bash ]
}

# ---------------------------------------------------------------------------------------- cancellation

# start_and_signal SIGNAL [env-option]: starts a training run whose container sleeps, signals _container.sh
# once the container is up, and sets rc to _container.sh's exit status.
start_and_signal() {
  make_sandbox docker
  export JOB_ID=jc NODE_RANK=2 CONTAINER_RUNTIME=docker STUB_RUN_SLEEP=30
  env ${2:+"$2"} PATH="$SANDBOX_BIN" "$SCRIPTS/_container.sh" tiny -- steps=1 >"$BATS_TEST_TMPDIR/out" 2>&1 &
  local pid=$!
  wait_for_file "$STUB_LOG_DIR/sleep.pid"
  kill "-$1" "$pid"
  rc=0
  wait "$pid" || rc=$?
}

# assert_only_our_container_stopped: `docker stop -t 10 maxtext-jc-node2` and nothing else was stopped or
# killed; the container's processes are gone.
assert_only_our_container_stopped() {
  [ "$(cat "$STUB_LOG_DIR/docker-stop.argv")" = "$(printf '%s\n' stop -t 10 maxtext-jc-node2)" ]
  [ "$(grep -c '^docker stop ' "$STUB_LOG_DIR/docker.calls")" -eq 1 ]
  ! grep -q '^docker \(kill\|rm\)' "$STUB_LOG_DIR/docker.calls" || false
  ! kill -0 "$(cat "$STUB_LOG_DIR/sleep.pid")" 2>/dev/null || false
  ! kill -0 "$(cat "$STUB_LOG_DIR/run.pid")" 2>/dev/null || false
}

@test "SIGTERM: stops only our container by name and exits 143, leaving no process behind" {
  start_and_signal TERM
  cat "$BATS_TEST_TMPDIR/out"
  [ "$rc" -eq 143 ]
  assert_only_our_container_stopped
  grep -q 'caught SIGTERM: stopping container maxtext-jc-node2' "$BATS_TEST_TMPDIR/out"
}

@test "SIGINT: stops only our container by name and exits 130" {
  # A background job starts with SIGINT ignored; give the script the default disposition, as a terminal would.
  start_and_signal INT --default-signal=INT
  cat "$BATS_TEST_TMPDIR/out"
  [ "$rc" -eq 130 ]
  assert_only_our_container_stopped
}

# ---------------------------------------------------------------------------------------- native

# make_venv: a fake venv whose bin/ holds an executable python.
make_venv() {
  export VENV_DIR=$BATS_TEST_TMPDIR/venv
  mkdir -p "$VENV_DIR/bin"
  printf '#!/usr/bin/env bash\necho fake-python\n' >"$VENV_DIR/bin/python"
  chmod +x "$VENV_DIR/bin/python"
}

@test "native: _train.sh gets the passthrough intact, the venv first on PATH and the whole environment" {
  make_sandbox docker
  make_venv
  export SECRET_TOKEN='s p a c e s' JOB_ID=n1
  cd "$BATS_TEST_TMPDIR"
  CONTAINER_RUNTIME=none TRAIN_EXIT=5 run_container tiny -- steps=2 "run_name=a b" "x='q'\"dq\"" '$HOME'
  [ "$status" -eq 5 ]
  local expected
  expected=$(printf '%s\n' 'ARG[tiny]' 'ARG[--]' 'ARG[steps=2]' 'ARG[run_name=a b]' "ARG[x='q'\"dq\"]" \
    'ARG[$HOME]' "VIRTUAL_ENV=$VENV_DIR" 'SECRET_TOKEN=s p a c e s' 'JOB_ID=n1' 'NODE_RANK=<unset>' \
    "JOB_WORKSPACE=$JOB_WORKSPACE" 'MAXTEXT_REPO_DIR=<unset>' "PATH0=$VENV_DIR/bin" "CWD=$SCRIPTS")
  [[ $output == *"$expected"* ]] || { echo "expected:"; echo "$expected"; false; }
  # native touches no runtime, not even to probe
  [ -z "$(ls "$STUB_LOG_DIR")" ]
}

@test "native: without the venv, training still runs with PATH untouched" {
  make_sandbox
  export VENV_DIR=$BATS_TEST_TMPDIR/absent-venv
  CONTAINER_RUNTIME=none run_container tiny
  [ "$status" -eq 0 ]
  [[ $output == *"VIRTUAL_ENV=<unset>"* ]]
  [[ $output == *"PATH0=$SANDBOX_BIN"* ]]
  [[ $output == *"no venv at $VENV_DIR"* ]]
}

@test "native: auto-detect with only an engine-less docker CLI trains natively" {
  make_sandbox docker
  make_venv
  run_container tiny -- steps=1
  [ "$status" -eq 0 ]
  [[ $output == *"ARG[steps=1]"* ]]
  [[ $output == *"VIRTUAL_ENV=$VENV_DIR"* ]]
  [ ! -e "$STUB_LOG_DIR/docker-run.argv" ]
}

@test "native: no arguments opens a bash in the repo with the venv active" {
  make_sandbox
  make_venv
  CONTAINER_RUNTIME=none run env PATH="$SANDBOX_BIN" "$SCRIPTS/_container.sh" \
    <<<'echo "VE=$VIRTUAL_ENV"; echo "WD=$PWD"; echo "P0=${PATH%%:*}"; exit 3'
  [ "$status" -eq 3 ]
  [[ $output == *"VE=$VENV_DIR"* ]]
  [[ $output == *"WD=$SCRIPTS"* ]]
  [[ $output == *"P0=$VENV_DIR/bin"* ]]
}
