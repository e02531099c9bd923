#!/usr/bin/env bash
# Usage: _container.sh [<MODEL_NAME> [-- <passthrough> ...] | --pull]
# Summary: Run _train.sh, or with no arguments an interactive bash, in the training environment
#
# The runtime is CONTAINER_RUNTIME (podman | docker | none), or detected when empty (utils/lib/container_runtime.sh).
#
#   none             native: exec <repo>/_train.sh in this environment, all of it inherited. The project venv
#                    ${VENV_DIR:-<repo>/.venv}, when it exists, comes first on PATH and is VIRTUAL_ENV.
#   docker, podman   a fresh container named maxtext-<JOB_ID>-node<NODE_RANK>, labelled maxtext-launcher=1
#                    (a leftover container of ours with that name is removed first), on the host network and
#                    IPC namespace, with the GPUs found here (AMD /dev/kfd + /dev/dri, else NVIDIA) and
#                    /dev/infiniband when present. Mounts:
#                      <repo>          -> /workspace/launcher   read-only (also the working directory)
#                      JOB_WORKSPACE   -> /outputs
#                      DATASET_DIR     -> /datasets, read-only, only when it exists
#                    Only the variables named in _CONTAINER_ENV_ALLOWLIST below cross, and only when set,
#                    plus JOB_WORKSPACE=/outputs, JOB_WORKSPACE_HOST (the host path of /outputs, for the
#                    paths printed for the user) and MAXTEXT_REPO_DIR, and the variables PASS_ENV names
#                    (by name: `--env NAME`, the value on no command line). Nothing else of this environment does.
#                    Hardening (audit row C1): no-new-privileges, every capability dropped but CHOWN,
#                    DAC_OVERRIDE and FOWNER (a rootful engine's root writes in the user's workspace), IPC_LOCK
#                    (RDMA pins memory) and SYS_PTRACE while py-spy needs it (CONTAINER_PTRACE); memlock
#                    unlimited (as far as the host lets the engine). Still root inside: the images expect it
#                    (their venv, HOME=/root caches, GPU device groups), and rootless podman maps it to the user.
#                    `_env_NAME=VALUE` arguments reach _train.sh through `run --env-file` (a 0600 file in a
#                    private temp dir, removed when the container ends), never on the run command line, which
#                    every local user can read (ps, /proc/<pid>/cmdline).
#
# --pull only makes the image present on this node (load a tarball, or pull what is missing) and exits;
# natively there is nothing to pull. The Slurm job runs it on every node as an all-nodes-ready barrier.
#
# Both run from the repo directory; with no arguments the same environment opens as an interactive bash.
#
# Settings (configs/container_settings.sh, each overridable from the environment): DOCKER_IMAGE,
# DOCKER_REGISTRY, MAXTEXT_REPO_DIR, DATASET_DIR, CONTAINER_NOFILE, CONTAINER_PTRACE, CONTAINER_RUN_EXTRA_ARGS,
# DOCKER_USERNAME / DOCKER_TOKEN. Also read: JOB_ID, NODE_RANK, JOB_WORKSPACE (default <repo>/outputs), VENV_DIR.
#
# Exit status: training's (the container's). SIGINT / SIGTERM stop our container only
# (`<runtime> stop -t $CONTAINER_STOP_TIMEOUT <name>`: TERM to training, KILL after that many seconds, default
# 10) and exit 130 / 143. Usage or settings errors exit 2.
#
# Examples:
#   _container.sh                                   # a shell where training would run
#   _container.sh tiny -- steps=5
#   CONTAINER_RUNTIME=docker DOCKER_IMAGE=./image.tar _container.sh tiny
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

_PROG=_container.sh
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=utils/lib/container_runtime.sh
source "$SCRIPT_DIR/utils/lib/container_runtime.sh"
# shellcheck source=utils/lib/process.sh
source "$SCRIPT_DIR/utils/lib/process.sh"
# shellcheck source=utils/lib/env_mask.sh
source "$SCRIPT_DIR/utils/lib/env_mask.sh"

# Where things appear inside the container.
_IN_SCRIPTS=/workspace/launcher
_IN_OUTPUTS=/outputs
_IN_DATASETS=/datasets
# Label key that marks containers this launcher started; nothing without it is ever removed or stopped by name.
_LABEL=maxtext-launcher

# The allow-list: the only host variables that enter the container, each as --env NAME=VALUE when set (even
# to ""). JOB_WORKSPACE is added separately with its in-container value, and MAXTEXT_REPO_DIR from the
# settings. A new input of the training tier is added here and nowhere else.
_CONTAINER_ENV_ALLOWLIST=(
  JOB_ID JOB_NAME JOB_DIR                       # job identity; JOB_DIR is relative to JOB_WORKSPACE
  NNODES NODE_RANK                              # node count and this node's 0-based rank
  JAX_COORDINATOR_IP JAX_COORDINATOR_PORT JAX_COORDINATOR_BIND_ADDRESS  # rank 0's address (multi-node only)
  MODEL_NAME MODEL_NAME_ALIAS EXP_TAG           # from the MODEL_SPEC
  NODELIST_EXPANDED                             # comma-separated hostnames of the job
  RAY RAY_PORT                                  # observability switch and Ray's GCS port
  RAY_DASHBOARD_PORT RAY_METRICS_PORT RAY_JOIN_TRIES RAY_JOIN_DELAY RAY_NODES_TIMEOUT   # RAY=1 knobs,
  PROMETHEUS_PORT PROMETHEUS_SCRAPE_INTERVAL TENSORBOARD TENSORBOARD_PORT EXPORTER_PORT EXPORTER_INTERVAL  # observability.sh
  CLUSTER_IP SLURM_SUBMIT_HOST                  # this node's address when set by hand; login node for tunnel hints
  RAY_START_TIMEOUT RAY_STOP_GRACE RAY_START_ARGS RAY_BIN RAY_REPORTER_INTERVAL_MS    # Ray node start/stop,
  RAY_DASHBOARD_ENABLE_PROFILING RAY_DASHBOARD_SELF_METRICS_INTERVAL_S               # see utils/lib/ray_cluster.sh
  RAY_DASHBOARD_FIRST RAY_DASHBOARD_ORDER RAY_DASHBOARD_ALL_MODULES RAY_CLIENT_SERVER   # and jobkit ray-start
  RAY_SERVICES_NICE                             # (utils/lib/ray_cluster.sh)
  RAY_PRESTART_WORKERS                          # (py/jobkit/observe/ray_start.py)
  OBS_NICE OBS_PYTHON TB_BACKFILL_WRITER        # observability services' niceness, interpreter; backfill writer
  STAGE_TIMEOUTS                                # per-stage timeout overrides
  HARDWARE_PEAK_TFLOPS TUNE_PROFILE TUNE_PROFILE_FILE ENABLE_XLA_DUMP CPU_DEVICES_PER_NODE   # training-tier knobs (train_env.sh)
  TRAIN_PYTHON MAXTEXT_FAST_EXIT                # training's interpreter; 0 = let Python exit slowly
  LOCAL_WORLD_SIZE                              # processes per node, one per device (py/jobkit/launch/procs.py)
  HANG_TIMEOUT HANG_COMPILE_TIMEOUT HANG_STEP_FACTOR HANG_ACTION   # the hang watchdog (py/jobkit/ops/hang_watchdog.py)
  JAX_HEARTBEAT_TIMEOUT                         # JAX's heartbeat timeout (py/jobkit/core/hang_settings.py)
  COREDUMP COREDUMP_WAIT                        # core limit and where cores go (utils/lib/coredump.sh)
  JOB_UMASK                                     # the mode of what the job writes (utils/lib/workspace.sh)
  PASS_ENV                                      # names of variables that cross by name (see _add_pass_env)
  _DEBUG                                        # set -x in the training tier too
)
# Deliberately not on the list (tests/bats/container.bats keeps these two lists honest against docs/settings.md
# and the training tier's sources): JOB_WORKSPACE and DATASET_DIR are mounts; CONTAINER_RUNTIME,
# DOCKER_IMAGE, DOCKER_REGISTRY choose the container; CONTAINER_NOFILE, CONTAINER_PTRACE, CONTAINER_RUN_EXTRA_ARGS
# and CONTAINER_STOP_TIMEOUT say how it is run; JAX_CACHE_DIR and VENV_DIR are host paths (the cache
# is <workspace>/.jax_cache on the /outputs mount, the image brings its Python); XLA_FLAGS is the image's
# own (change it per job with _env_XLA_FLAGS or TUNE_PROFILE); TMPDIR and USER are the container's own.
# MAX_RETRIES and TIME_LIMIT_* are the batch script's (requeue, Slurm's time-limit warning);
# JOBKIT_NOTIFY_URLS is the login node's (jobkit notify / monitor).
# RAY_AUTH_TOKEN_PATH is set inside the training tier (observability.sh: the job's own Ray token).
# PROCS_EXIT_FILE is set inside the training tier too (_train.sh, for jobkit procs: the failed process whose core to find).

_die() { echo "$_PROG: $1" >&2; exit "${2:-1}"; }
_usage_error() { _die "$1; see '$_PROG --help'" 2; }
_say() { echo "[container] $*" >&2; }
_usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

# --- native -------------------------------------------------------------------------------------------

# Puts the project venv first on PATH when it exists; returns 1 (changing nothing) when it does not.
_activate_venv() {
  local venv=${VENV_DIR:-$SCRIPT_DIR/.venv}
  [[ $venv == /* ]] || venv=$PWD/$venv
  [[ -x $venv/bin/python ]] || return 1
  export VIRTUAL_ENV=$venv
  export PATH=$venv/bin:$PATH
  unset PYTHONHOME
}

_native_train() {
  if ! _activate_venv; then
    _say "no venv at ${VENV_DIR:-$SCRIPT_DIR/.venv}; using this environment's python as is"
  fi
  cd "$SCRIPT_DIR"
  _say "runtime: none (native), venv: ${VIRTUAL_ENV:-none}"
  exec "$SCRIPT_DIR/_train.sh" "$@"
}

_native_shell() {
  if ! _activate_venv; then
    _say "no venv at ${VENV_DIR:-$SCRIPT_DIR/.venv}; run utils/setup_env.sh to create it"
  fi
  cd "$SCRIPT_DIR"
  # ~/.bashrc may put other interpreters first on PATH (pyenv shims); the rc file re-activates the venv after it.
  TRAIN_SHELL_VENV=${VIRTUAL_ENV:-} exec bash --rcfile "$SCRIPT_DIR/utils/lib/train_shell.bashrc" -i
}

# --- container ----------------------------------------------------------------------------------------

# maxtext-<JOB_ID>-node<NODE_RANK>, with every character docker and podman refuse in a name turned into "_".
_container_name() {
  local raw="maxtext-${JOB_ID:-unknown-$$}-node${NODE_RANK:-0}"
  printf '%s' "${raw//[^A-Za-z0-9_.-]/_}"
}

# True when the first path component of an image reference is a registry host (has . or :, or is localhost).
_names_registry() {
  local first=${1%%/*}
  [[ $1 == */* ]] && [[ $first == *.* || $first == *:* || $first == localhost ]]
}

_pull_image() {
  local runtime=$1 image=$2 registry=""
  if [[ $image == *@sha256:* ]]; then
    _say "pulling $image (pinned by digest: the engine checks the content against it)"
  else
    _say "pulling $image (a tag, which its registry may move; DOCKER_IMAGE=<name>@sha256:<digest> pins it)"
  fi
  if "$runtime" pull "$image" >&2; then return 0; fi
  # Untraced while the token is in a command (_DEBUG's set -x would print it).
  local xtrace=${-//[^x]/} login=1
  { set +x; } 2>/dev/null
  if [[ -n $DOCKER_USERNAME && -n $DOCKER_TOKEN ]]; then
    if _names_registry "$image"; then registry=${image%%/*}; fi
    _say "anonymous pull failed; logging in${registry:+ to $registry} as $DOCKER_USERNAME"
    printf '%s\n' "$DOCKER_TOKEN" |
      "$runtime" login --username "$DOCKER_USERNAME" --password-stdin ${registry:+"$registry"} >&2 && login=0
  fi
  [[ -z $xtrace ]] || set -x
  if (( login == 0 )) && "$runtime" pull "$image" >&2; then
    return 0
  fi
  _die "cannot pull $image with $runtime; check DOCKER_IMAGE / DOCKER_REGISTRY, or put DOCKER_USERNAME and DOCKER_TOKEN in configs/container_settings.local.sh"
}

# Prints the image reference to run: a local tarball is loaded first; a name without a registry gets
# DOCKER_REGISTRY in front; a missing image is pulled. A reference pinned by digest (name@sha256:<64 hex>,
# with or without a tag before the @) is used as it is, pulled by that digest, never by a tag.
_resolve_image() {
  local runtime=$1 image=$DOCKER_IMAGE out line loaded=""
  if [[ $image == *@* && ! $image =~ ^[^@]+@sha256:[0-9a-f]{64}$ ]]; then
    _die "DOCKER_IMAGE=$image is not a valid digest reference; pin an image as <name>@sha256:<64 hex digits> (see '$runtime image inspect --format {{.RepoDigests}} <image>')" 2
  fi
  if [[ $image == *.tar ]]; then
    [[ -f $image ]] || _die "DOCKER_IMAGE=$image is not a file; point it at an image tarball or set an image name" 2
    _say "loading $image"
    out=$("$runtime" load -i "$image") || _die "'$runtime load -i $image' failed; check that the file is an image tarball"
    printf '%s\n' "$out" >&2
    while IFS= read -r line; do
      # docker: "Loaded image: NAME" or "Loaded image ID: sha256:..."; podman: "Loaded image(s): A,B"
      if [[ $line == "Loaded image"*": "* ]]; then loaded=${line#*: }; fi
    done <<<"$out"
    loaded=${loaded%%,*}
    [[ -n $loaded ]] || _die "'$runtime load' named no image for $image; load it by hand and set DOCKER_IMAGE to its name"
    printf '%s' "$loaded"
    return 0
  fi
  if [[ -n $DOCKER_REGISTRY ]] && ! _names_registry "$image"; then image=$DOCKER_REGISTRY/$image; fi
  if ! "$runtime" image inspect "$image" >/dev/null 2>&1; then _pull_image "$runtime" "$image"; fi
  printf '%s' "$image"
}

# Removes a container of ours left over under NAME (a crashed earlier attempt of the same job and rank).
# A container with that name that is not ours is left alone, and the run refused.
_remove_leftover() {
  local runtime=$1 name=$2 label
  label=$("$runtime" container inspect --format "{{ index .Config.Labels \"$_LABEL\" }}" "$name" 2>/dev/null) || return 0
  if [[ $label != 1 ]]; then
    _die "a container named $name exists that this launcher did not start; remove it ($runtime rm -f $name) or use another JOB_ID"
  fi
  _say "removing leftover container $name"
  "$runtime" rm -f "$name" >/dev/null || _die "cannot remove leftover container $name; remove it by hand ($runtime rm -f $name)"
}

# Appends the device flags for this host's GPUs and InfiniBand to _RUN_ARGS. _DEV_ROOT (tests only) is
# prepended to /dev.
_add_device_args() {
  local runtime=$1 dev=${_DEV_ROOT:-}/dev
  if [[ -e $dev/kfd && -d $dev/dri ]]; then
    _RUN_ARGS+=(--device "$dev/kfd" --device "$dev/dri" --group-add video)
    _say "GPUs: AMD ($dev/kfd, $dev/dri)"
  elif container_runtime_nvidia_present; then
    if [[ $runtime == podman ]]; then _RUN_ARGS+=(--device nvidia.com/gpu=all); else _RUN_ARGS+=(--gpus all); fi
    _say "GPUs: NVIDIA (all)"
  else
    echo "$_PROG: warning: no GPU found (no $dev/kfd with $dev/dri, and 'nvidia-smi -L' fails); the container gets no GPU" >&2
  fi
  if [[ -e $dev/infiniband ]]; then _RUN_ARGS+=(--device "$dev/infiniband"); fi
}

# Appends `--env NAME` (no value: the engine takes it from its own environment, so it is on no command line)
# for every variable that PASS_ENV names, the user's way to hand a credential to training.
_add_pass_env() {
  local names name
  names=$(env_mask_pass_env_names) || exit 2
  for name in $names; do _RUN_ARGS+=(--env "$name"); done
}

# Sources configs/container_settings.sh (and its .local.sh) untraced: under _DEBUG, set -x would print
# DOCKER_TOKEN's value from those lines.
_source_settings() {
  local xtrace=${-//[^x]/}
  { set +x; } 2>/dev/null
  # shellcheck source=configs/container_settings.sh
  source "$SCRIPT_DIR/configs/container_settings.sh"
  [[ -z $xtrace ]] || set -x
}

# Sets _RUNTIME, _CONTAINER_NAME, _IMAGE and _RUN_ARGS (everything between `run` and the image).
_prepare_container() {
  _RUNTIME=$1
  _source_settings
  [[ $CONTAINER_NOFILE =~ ^([0-9]+|auto)$ ]] ||
    _die "CONTAINER_NOFILE='$CONTAINER_NOFILE' is not a number; set it to an open-files limit such as 1048576, or auto" 2
  [[ $CONTAINER_PTRACE =~ ^(auto|0|1)$ ]] ||
    _die "CONTAINER_PTRACE='$CONTAINER_PTRACE' is not auto, 0 or 1; unset it (auto: py-spy may attach while the hang watchdog or Ray is on)" 2
  local nofile memlock
  nofile=$(container_nofile)
  memlock=$(container_memlock "$_RUNTIME")
  local workspace=${JOB_WORKSPACE:-$SCRIPT_DIR/outputs} var
  [[ $workspace == /* ]] || workspace=$PWD/$workspace
  mkdir -p "$workspace" || _die "cannot create JOB_WORKSPACE $workspace; set JOB_WORKSPACE to a writable directory"
  local -a extra=() host_args=()
  read -r -a extra <<<"$CONTAINER_RUN_EXTRA_ARGS"
  mapfile -t host_args < <(container_host_run_args "$_RUNTIME")

  _CONTAINER_NAME=$(_container_name)
  _IMAGE=$(_resolve_image "$_RUNTIME") || exit
  _remove_leftover "$_RUNTIME" "$_CONTAINER_NAME"

  # Host network and IPC: RDMA/RoCE, the JAX coordinator and NCCL/RCCL bootstrap, large shared memory.
  _RUN_ARGS=(--rm --name "$_CONTAINER_NAME" --label "$_LABEL=1" --label "$_LABEL.job=${JOB_ID:-unknown}"
    --network=host --ipc=host --security-opt=no-new-privileges --cap-drop=ALL
    --cap-add=CHOWN --cap-add=DAC_OVERRIDE --cap-add=FOWNER --cap-add=IPC_LOCK)
  if container_ptrace_wanted; then _RUN_ARGS+=(--cap-add=SYS_PTRACE); fi
  _RUN_ARGS+=(--ulimit "nofile=$nofile:$nofile")
  if [[ -n $memlock ]]; then _RUN_ARGS+=(--ulimit "memlock=$memlock:$memlock"); fi
  # The launcher read-only: root in the container would otherwise bypass the snapshot's a-w.
  _RUN_ARGS+=(-v "$SCRIPT_DIR:$_IN_SCRIPTS:ro" -w "$_IN_SCRIPTS" -v "$workspace:$_IN_OUTPUTS")
  if [[ -d $DATASET_DIR ]]; then _RUN_ARGS+=(-v "$DATASET_DIR:$_IN_DATASETS:ro"); fi
  _add_device_args "$_RUNTIME"
  for var in "${_CONTAINER_ENV_ALLOWLIST[@]}"; do
    if [[ -v $var ]]; then _RUN_ARGS+=(--env "$var=${!var}"); fi
  done
  _add_pass_env
  # JOB_WORKSPACE_HOST: where /outputs is on the host, for the paths training prints for the user to run later.
  _RUN_ARGS+=(--env "JOB_WORKSPACE=$_IN_OUTPUTS" --env "JOB_WORKSPACE_HOST=$workspace"
    --env "MAXTEXT_REPO_DIR=$MAXTEXT_REPO_DIR")
  # This host's needs first, the user's own options last (they win where both set something).
  if (( ${#host_args[@]} )); then _say "host settings for $_RUNTIME: ${host_args[*]}"; fi
  _RUN_ARGS+=("${host_args[@]}" "${extra[@]}")
  _say "runtime: $_RUNTIME, image: $_IMAGE, container: $_CONTAINER_NAME"
}

# Trap body: stop our container by name (nothing else), reap the client we started, exit 128+signal.
_on_signal() {
  trap '' INT TERM
  _say "caught SIG$1: stopping container $_CONTAINER_NAME"
  # stop: TERM to the container's PID 1 (utils/container_init.sh passes it to training), KILL after the timeout.
  timeout -k 5 $((CONTAINER_STOP_TIMEOUT + 50)) "$_RUNTIME" stop -t "$CONTAINER_STOP_TIMEOUT" "$_CONTAINER_NAME" \
    >/dev/null 2>&1 || true
  # The client normally ends with its container; give it 5 s more, then KILL it.
  if [[ -n ${_RUN_PID:-} ]]; then proc_stop 5 "$_RUN_PID" || true; fi
  exit "$2"
}

# _env_file ARG...: sets _TRAIN_ARGV to ARG... less its `_env_NAME=VALUE` arguments, and when there were any,
# _ENV_FILE to a 0600 file in a private temp dir holding them as `_env_NAME=VALUE` lines (the last value of a
# name wins, as in _train.sh) for `run --env-file`; _train.sh takes such variables as it takes the arguments.
_env_file() {
  local arg name
  local -A value=()
  local -a order=()
  _TRAIN_ARGV=() _ENV_FILE=""
  for arg in "$@"; do
    if [[ $arg =~ ^_env_([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]]; then
      name=${BASH_REMATCH[1]}
      [[ $arg != *$'\n'* ]] ||
        _die "the value of _env_$name holds a newline, which cannot reach a container (run --env-file is one line per variable); pass it without one" 2
      [[ -v "value[$name]" ]] || order+=("$name")
      value[$name]=${BASH_REMATCH[2]}
    else
      _TRAIN_ARGV+=("$arg")
    fi
  done
  (( ${#order[@]} )) || return 0
  _ENV_DIR=$(mktemp -d "${TMPDIR:-/tmp}/container-env.XXXXXX") || _die "cannot make a private temp dir; check TMPDIR"
  _ENV_FILE=$_ENV_DIR/env
  trap 'rm -rf "$_ENV_DIR"' EXIT
  (
    umask 077
    for name in "${order[@]}"; do printf '_env_%s=%s\n' "$name" "${value[$name]}"; done >"$_ENV_FILE"
  ) || _die "cannot write $_ENV_FILE; check TMPDIR"
}

_container_train() {
  local runtime=$1 rc=0
  shift
  CONTAINER_STOP_TIMEOUT=${CONTAINER_STOP_TIMEOUT:-10}
  [[ $CONTAINER_STOP_TIMEOUT =~ ^[0-9]+$ ]] ||
    _die "CONTAINER_STOP_TIMEOUT='$CONTAINER_STOP_TIMEOUT' is not a number of seconds; e.g. CONTAINER_STOP_TIMEOUT=10" 2
  _prepare_container "$runtime"
  _env_file "$@"
  if [[ -n $_ENV_FILE ]]; then _RUN_ARGS+=(--env-file "$_ENV_FILE"); fi
  _RUN_PID=""
  trap '_on_signal INT 130' INT
  trap '_on_signal TERM 143' TERM
  # --sig-proxy=false: a signal to us is passed on by `stop` in _on_signal, once; the client's own forwarding
  # raced the container's end and printed an error line into the job log.
  "$_RUNTIME" run --sig-proxy=false "${_RUN_ARGS[@]}" "$_IMAGE" \
    bash "$_IN_SCRIPTS/utils/container_init.sh" "$_IN_SCRIPTS/_train.sh" "${_TRAIN_ARGV[@]}" &
  _RUN_PID=$!
  proc_wait "$_RUN_PID" || rc=$?
  exit "$rc"
}

_container_shell() {
  local tty=-i
  _prepare_container "$1"
  if [[ -t 0 && -t 1 ]]; then tty=-it; fi
  exec "$_RUNTIME" run "$tty" "${_RUN_ARGS[@]}" "$_IMAGE" bash
}

# --- entry --------------------------------------------------------------------------------------------

main() {
  local runtime
  if (( $# == 0 )); then
    runtime=$(detect_container_runtime) || exit 2
    if [[ $runtime == none ]]; then _native_shell; else _container_shell "$runtime"; fi
  fi
  case $1 in
    -h | --help) _usage; exit 0 ;;
    --pull)
      runtime=$(detect_container_runtime) || exit 2
      if [[ $runtime == none ]]; then _say "runtime: none (native): no image to pull"; exit 0; fi
      _source_settings
      local image
      image=$(_resolve_image "$runtime") || exit
      _say "image ready on $(hostname -s): $image"
      exit 0 ;;
    --) _usage_error "missing MODEL_NAME before '--'" ;;
    -*) _usage_error "unknown option '$1'" ;;
  esac
  [[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9._+-]*$ ]] ||
    _usage_error "'$1' is not a model name (letters, digits and . _ + - only)"
  if (( $# > 1 )) && [[ $2 != -- ]]; then
    _usage_error "unexpected '$2' after MODEL_NAME; passthrough arguments go after '--'"
  fi
  runtime=$(detect_container_runtime) || exit 2
  [[ -x $SCRIPT_DIR/_train.sh ]] ||
    _die "$SCRIPT_DIR/_train.sh is missing or not executable; restore it (git checkout -- _train.sh)"
  if [[ $runtime == none ]]; then _native_train "$@"; else _container_train "$runtime" "$@"; fi
}

main "$@"
