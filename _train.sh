#!/usr/bin/env bash
# Usage: _train.sh <MODEL_NAME> [-- <maxtext key=value | _env_KEY=VALUE> ...]
# Summary: Training tier: layer the runtime environment and start MaxText for one node
#
# Reads the tier contract (JOB_WORKSPACE, JOB_DIR, NNODES, NODE_RANK, JAX_COORDINATOR_IP/PORT,
# MODEL_NAME_ALIAS) from the environment; runs inside the container or natively.
# Environment layering, last wins: train_env.sh -> configs/<model>.env.sh -> _env_KEY=VALUE args.
# Exports OUTPUT_PATH, MaxText's base_output_directory: the job dir, or <workspace>/<alias or model> when
# enable_checkpointing=true is on the command line, so that a rerun of the same alias resumes.
# RAY=1 runs training under utils/lib/observability.sh (metrics exporter, Ray, Prometheus, TensorBoard) instead of
# exec'ing it; training's exit status is kept.
# Beside training, the hang watchdog (jobkit hang-watchdog; HANG_TIMEOUT, HANG_COMPILE_TIMEOUT,
# HANG_STEP_FACTOR, HANG_ACTION; HANG_TIMEOUT=off turns it off) follows this rank's steps in the job log; while
# it runs, training is this script's child rather than exec'd, and the script ends after the watchdog does.
# LOCAL_WORLD_SIZE=N (>1: a process per device) runs training as N processes on this node through `jobkit procs`
# (py/jobkit/launch/procs.py: LOCAL_RANK, GLOBAL_RANK, NPROCS; each line behind `[rank<G>]: `).
# COREDUMP=1 (utils/lib/coredump.sh) raises the core limit, sends cores to <job dir>/cores/ where this node lets
# it (else says where they go), runs training as a child instead of exec'ing it, and after a crash prints
# "== CORE DUMP <path> (<size>) ==" (waiting up to COREDUMP_WAIT s while the core grows).
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_PROG=_train.sh
_die() { echo "$_PROG: $*" >&2; exit 2; }
_usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

# _strip_quotes VALUE: drops one layer of matching surrounding quotes.
_strip_quotes() {
  local value=$1
  if [[ ${#value} -ge 2 && ( ($value == \"*\" ) || ($value == \'*\') ) ]]; then value=${value:1:-1}; fi
  printf '%s' "$value"
}

# _has_maxtext_key KEY ARGS...: true when the user already set KEY on the command line.
_has_maxtext_key() {
  local key=$1 arg; shift
  for arg in "$@"; do [[ $arg == "$key="* ]] && return 0; done
  return 1
}

# Output root: checkpointing runs share a stable directory per alias (or model) so they resume.
_output_path() {
  local arg
  for arg in "${MAXTEXT_ARGS[@]}"; do
    if [[ ${arg,,} =~ ^enable_checkpointing=(true|1|yes)$ ]]; then
      printf '%s/%s' "$JOB_WORKSPACE" "${MODEL_NAME_ALIAS:-$MODEL_NAME}"; return
    fi
  done
  printf '%s/%s' "$JOB_WORKSPACE" "$JOB_DIR"
}

# The environment record (environment.node<rank>.txt) shows the values of what shapes training and says
# where it ran, and the job's own _env_ overrides; everything else, any name that looks like a credential's,
# a value of several lines and the user:password part of a URL as *** (utils/lib/env_mask.sh).
# shellcheck source=utils/lib/env_mask.sh
source "$SCRIPT_DIR/utils/lib/env_mask.sh"
# shellcheck source=utils/lib/process.sh
source "$SCRIPT_DIR/utils/lib/process.sh"

# _train_shown_value NAME VALUE: VALUE as the record shows it (one of the job's own _env_ overrides is shown).
_train_shown_value() {
  local own=0
  [[ -v "ENV_OVERRIDES[$1]" ]] && own=1
  env_mask_value "$1" "$2" "$own"
}

# Writes the training environment next to the job's outputs (see ENV_MASK_SHOWN), for post-mortems.
# Never traced: under _DEBUG, set -x would print every value it reads, credentials included.
_record_environment() {
  local file=$JOB_WORKSPACE/$JOB_DIR/environment.node$NODE_RANK.txt entry xtrace=${-//[^x]/}
  [[ -d $JOB_WORKSPACE/$JOB_DIR ]] || return 0
  { set +x; } 2>/dev/null
  while IFS= read -r -d '' entry; do   # env -0: a value of several lines is one entry, masked whole
    printf '%s=%s\n' "${entry%%=*}" "$(_train_shown_value "${entry%%=*}" "${entry#*=}")"
  done < <(env -0) | LC_ALL=C sort >"$file"
  [[ -z $xtrace ]] || set -x
}

# The hang watchdog (py/jobkit/ops/hang_watchdog.py) follows the job log beside training on every node, and on a
# hang captures stacks into the job dir's hang/ and stops training. Started before training is exec'd, so it
# is running before training; it finds training by JOB_ID and NODE_RANK (each of the LOCAL_WORLD_SIZE processes by
# its LOCAL_RANK) and ends on its own when training does (a pidfd wakes it at training's exit).
# _HANG_WATCHDOG_PID: its pid, empty while none runs.
_HANG_WATCHDOG_PID=""
_start_hang_watchdog() {
  if [[ ${HANG_TIMEOUT:-} =~ ^(off|0|false|no)$ ]]; then
    echo "[_train] hang watchdog: off (HANG_TIMEOUT=$HANG_TIMEOUT)"
    return 0
  fi
  "$1" "$SCRIPT_DIR/py/bin/jobkit" hang-watchdog --log "$JOB_WORKSPACE/$JOB_DIR.log" \
    --job-dir "$JOB_WORKSPACE/$JOB_DIR" </dev/null &
  _HANG_WATCHDOG_PID=$!
  echo "[_train] hang watchdog: pid $_HANG_WATCHDOG_PID (HANG_TIMEOUT=${HANG_TIMEOUT:-300} s floor, before step 0 ${HANG_COMPILE_TIMEOUT:-3600} s, x${HANG_STEP_FACTOR:-10} median step, HANG_ACTION=${HANG_ACTION:-cancel})"
}

# _end_hang_watchdog: after training ended, waits for the watchdog's last look (it ends by itself, within a
# second); one still running 30 s later is stopped by its pid, with a line that says so. Why wait at all: this script's end is the node's, and whatever outlives it is stopped as
# left behind (`jobkit reap` when native, srun's step cleanup under Slurm), which on a clean run reads as a bug.
_end_hang_watchdog() {
  [[ -n $_HANG_WATCHDOG_PID ]] || return 0
  local pid=$_HANG_WATCHDOG_PID wait_s=30 killer
  _HANG_WATCHDOG_PID=""
  killer=$(proc_kill_after "$wait_s" "$pid")
  proc_wait "$pid" || true  # its status is the watchdog's (9, EXIT_STOPPED: it stopped a hung training), not the job's
  if proc_alive "$killer"; then
    proc_cancel_kill_after "$killer"
  else
    echo "[_train] warning: the hang watchdog (pid $pid) was still running ${wait_s} s after training ended; stopped it"
  fi
}

# _train_child CMD...: runs training as a child of this shell, which then outlives it. TERM/INT given to this
# shell (a stop by PID, PID 1 of a container) reach training; returns training's exit status.
_train_child() {
  local rc=0
  # An async command ignores INT and QUIT; the subshell gives training the dispositions exec would have.
  (trap - INT QUIT; exec "$@") &
  _TRAIN_PID=$!
  trap 'kill -TERM "$_TRAIN_PID" 2>/dev/null || true' TERM
  trap 'kill -INT "$_TRAIN_PID" 2>/dev/null || true' INT
  proc_wait "$_TRAIN_PID" || rc=$?
  trap - TERM INT
  return "$rc"
}

# A process per device (LOCAL_WORLD_SIZE): `auto` becomes one per GPU this process may use (1 on a CPU node).
# More processes than usable GPUs would leave one without its device (JAX fails on a local_device_ids entry that
# does not exist, after minutes of start-up on a big node), so that is a one-line error here, before training.
_train_resolve_procs() {
  [[ -n ${LOCAL_WORLD_SIZE:-} ]] || return 0
  local gpus
  gpus=$(count_visible_gpus "$GPU_VENDOR")
  if [[ $LOCAL_WORLD_SIZE == auto ]]; then
    LOCAL_WORLD_SIZE=$(( gpus > 0 ? gpus : 1 ))
    echo "[_train] LOCAL_WORLD_SIZE=auto: $LOCAL_WORLD_SIZE (usable GPUs on this node: $gpus)"
  elif [[ $LOCAL_WORLD_SIZE =~ ^[0-9]+$ ]] && (( gpus > 0 && 10#$LOCAL_WORLD_SIZE > gpus )); then
    echo "$_PROG: LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE is more processes than the $gpus $GPU_VENDOR GPU(s) this node lets training use; set LOCAL_WORLD_SIZE=$gpus (or auto)" >&2
    return 1
  fi
  return 0
}

# _train_keeping_cores CMD...: runs training as a child (_train_child), so that this shell outlives it to put
# core_pattern back and find the core.
_train_keeping_cores() {
  local rc=0
  _train_child "$@" || rc=$?
  coredump_restore
  # With `jobkit procs` between, the core is the failed process's (named with its pid), not the supervisor's.
  local pid=$_TRAIN_PID failed_pid _
  if [[ -n ${PROCS_EXIT_FILE:-} && -s $PROCS_EXIT_FILE ]] && read -r failed_pid _ <"$PROCS_EXIT_FILE" &&
    [[ $failed_pid =~ ^[0-9]+$ ]]; then
    pid=$failed_pid
  fi
  [[ -z ${PROCS_EXIT_FILE:-} ]] || rm -f "$PROCS_EXIT_FILE"
  coredump_after "$rc" "$pid"
  return "$rc"
}

main() {
  case ${1:-} in
    ""|-h|--help) _usage; [[ -n ${1:-} ]] && exit 0; exit 2 ;;
  esac
  MODEL_NAME=$1; shift
  [[ ${1:-} == -- ]] && shift
  local config=$SCRIPT_DIR/configs/$MODEL_NAME.yml
  [[ -f $config ]] || _die "no config for model '$MODEL_NAME' ($config); pick one of configs/*.yml"
  : "${JOB_WORKSPACE:?$_PROG: JOB_WORKSPACE is not set; start training through run_local.sh or submit.sh}"
  : "${JOB_DIR:?$_PROG: JOB_DIR is not set; start training through run_local.sh or submit.sh}"
  NNODES=${NNODES:-1} NODE_RANK=${NODE_RANK:-0}
  export MODEL_NAME NNODES NODE_RANK

  # Split the passthrough list: _env_ overrides are held back until the env layers below have run.
  declare -gA ENV_OVERRIDES=()
  local -a override_order=()
  MAXTEXT_ARGS=()
  local arg name var
  # In a container, _container.sh passes _env_NAME=VALUE through `run --env-file` as variables of that name
  # (off the command line, which every local user can read): the same overrides, taken before the arguments.
  for var in $(compgen -v _env_); do
    name=${var#_env_}
    [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
    [[ -v "ENV_OVERRIDES[$name]" ]] || override_order+=("$name")
    ENV_OVERRIDES[$name]=$(_strip_quotes "${!var}")
    unset "$var"
  done
  for arg in "$@"; do
    if [[ $arg =~ ^_env_([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]]; then
      name=${BASH_REMATCH[1]}
      [[ -v "ENV_OVERRIDES[$name]" ]] || override_order+=("$name")
      ENV_OVERRIDES[$name]=$(_strip_quotes "${BASH_REMATCH[2]}")
    else
      MAXTEXT_ARGS+=("$arg")
    fi
  done
  PASSTHROUGH_ARGS="$*"   # visible to configs/<model>.env.sh, which may branch on CLI overrides
  export PASSTHROUGH_ARGS

  # A container does not inherit the host's umask: files written here follow JOB_UMASK. Not when this tier
  # runs as another uid than the workspace's owner (a rootful docker's root): its files would be owned by
  # that uid, and a private mode would lock their owner out of them.
  # shellcheck source=utils/lib/workspace.sh
  source "$SCRIPT_DIR/utils/lib/workspace.sh"
  if [[ $(stat -c %u "$JOB_WORKSPACE") == "$EUID" ]]; then
    workspace_umask || exit 2
  else
    echo "[_train] warning: training runs as uid $EUID, not as the workspace's owner: the job's files are theirs to read only under this image's umask ($(umask)), JOB_UMASK is not applied; rootless podman keeps them yours and private"
  fi
  # Checked again here: the alias dir may have appeared (someone else's) while the job was queued.
  # shellcheck source=utils/lib/launch_args.sh
  source "$SCRIPT_DIR/utils/lib/launch_args.sh"
  launch_check_alias_dir "$JOB_WORKSPACE" "${MODEL_NAME_ALIAS:-$MODEL_NAME}" "${MAXTEXT_ARGS[@]}" || exit 2
  OUTPUT_PATH=$(_output_path)
  export OUTPUT_PATH
  mkdir -p "$OUTPUT_PATH"

  # shellcheck source=utils/lib/gpu_detect.sh
  source "$SCRIPT_DIR/utils/lib/gpu_detect.sh"
  # shellcheck source=utils/lib/nccl_env.sh
  source "$SCRIPT_DIR/utils/lib/nccl_env.sh"
  # shellcheck source=train_env.sh
  source "$SCRIPT_DIR/train_env.sh"
  if [[ -f $SCRIPT_DIR/configs/$MODEL_NAME.env.sh ]]; then
    echo "[_train] sourcing configs/$MODEL_NAME.env.sh"
    # shellcheck source=/dev/null
    source "$SCRIPT_DIR/configs/$MODEL_NAME.env.sh"
  fi
  apply_tune_profile
  for name in "${override_order[@]}"; do
    export "$name=${ENV_OVERRIDES[$name]}"
    echo "[_train] _env_ override: $name=$(_train_shown_value "$name" "${ENV_OVERRIDES[$name]}")"
  done
  if [[ -n ${PASS_ENV:-} ]]; then
    local passed
    passed=$(env_mask_pass_env_names) || exit 2
    echo "[_train] PASS_ENV: ${passed//$'\n'/ } (from the submitting environment; values not shown)"
  fi
  # MaxText switches on an HLO dump into /tmp when XLA_FLAGS is empty.
  [[ -n ${XLA_FLAGS:-} ]] || export XLA_FLAGS=--xla_dump_hlo_as_text=false

  local -a defaults=()
  _has_maxtext_key base_output_directory "${MAXTEXT_ARGS[@]}" || defaults+=("base_output_directory=$OUTPUT_PATH")
  # The compile cache holds executables training loads and runs: entries another user could write would run
  # as you. A cache dir that is not yours alone is not used (a warning, then training compiles afresh): a
  # missing cache costs minutes of compiling, not the job.
  local why
  if [[ -n $JAX_CACHE_DIR ]] && ! why=$(workspace_private_dir "$JAX_CACHE_DIR"); then
    echo "[_train] warning: JAX_CACHE_DIR: $why; running without the compilation cache (set JAX_CACHE_DIR to a dir of yours that group and others cannot write)"
    JAX_CACHE_DIR=""
    unset JAX_COMPILATION_CACHE_DIR
  fi
  # An empty jax_cache_dir turns MaxText's own default cache (~/jax_cache) off too.
  _has_maxtext_key jax_cache_dir "${MAXTEXT_ARGS[@]}" || defaults+=("jax_cache_dir=$JAX_CACHE_DIR")
  _record_environment

  local python=${TRAIN_PYTHON:-python3}
  # shellcheck source=utils/lib/coredump.sh
  source "$SCRIPT_DIR/utils/lib/coredump.sh"
  coredump_check || exit 2
  # LAUNCH_SETTING_REFUSED_RC is a bad HANG_* setting (the job stops here, exit 2); anything else means this
  # interpreter cannot run jobkit (an image without click): training still runs, without the watchdog.
  local check=0
  "$python" "$SCRIPT_DIR/py/bin/jobkit" hang-watchdog --check || check=$?
  if (( check == LAUNCH_SETTING_REFUSED_RC )); then exit 2; fi
  local per_device=0
  _train_resolve_procs || exit 2
  if [[ -n ${LOCAL_WORLD_SIZE:-} && $LOCAL_WORLD_SIZE != 1 ]]; then
    "$python" "$SCRIPT_DIR/py/bin/jobkit" procs --check >/dev/null || exit 2
    export LOCAL_WORLD_SIZE
    per_device=1
  fi
  if (( check == 0 )); then
    _start_hang_watchdog "$python"
  else
    echo "[_train] warning: $python cannot run jobkit (exit $check): no hang watchdog for this job"
  fi
  echo "[_train] node $NODE_RANK/$NNODES: OUTPUT_PATH=$OUTPUT_PATH"
  echo "[_train] XLA_FLAGS=$XLA_FLAGS"
  echo "[_train] jobkit launch configs/$MODEL_NAME.yml ${defaults[*]} ${MAXTEXT_ARGS[*]}"
  # py/bin/jobkit runs the package from this checkout, so training needs no install of jobkit in an image
  # that mounts the repo; TRAIN_PYTHON still picks the interpreter (the one with MaxText).
  local -a train_cmd=("$python" -u "$SCRIPT_DIR/py/bin/jobkit" launch "$config" "${defaults[@]}" "${MAXTEXT_ARGS[@]}")
  if (( per_device )); then
    train_cmd=("$python" -u "$SCRIPT_DIR/py/bin/jobkit" procs -- "${train_cmd[@]}")
  fi
  if coredump_enabled; then
    # The interpreter itself, for `gdb <executable> <core>`: a pyenv shim or a wrapper script on PATH is not it.
    local exe
    exe=$("$python" -c 'import sys; print(sys.executable)' 2>/dev/null) && [[ -n $exe ]] ||
      exe=$(command -v "$python" || echo "$python")
    coredump_setup "$JOB_WORKSPACE/$JOB_DIR" "$exe"
    # core_pattern is the whole machine's: put it back however this script ends.
    trap coredump_restore EXIT
  fi
  local rc=0
  if [[ ${RAY:-0} =~ ^(1|true|yes)$ ]]; then
    # shellcheck source=utils/lib/observability.sh
    source "$SCRIPT_DIR/utils/lib/observability.sh"
    OBS_PYTHON=$(command -v "$python") run_with_observability "${train_cmd[@]}" || rc=$?
    if coredump_enabled; then coredump_restore; coredump_after "$rc"; fi
  elif coredump_enabled; then
    # jobkit procs says which of its processes failed first (its pid names the core): see _train_keeping_cores
    if (( per_device )); then
      PROCS_EXIT_FILE=$(mktemp "${TMPDIR:-/tmp}/jobkit-procs-exit.XXXXXX") && export PROCS_EXIT_FILE
    fi
    _train_keeping_cores "${train_cmd[@]}" || rc=$?
  elif [[ -n $_HANG_WATCHDOG_PID ]]; then
    _train_child "${train_cmd[@]}" || rc=$?
  else
    exec "${train_cmd[@]}"
  fi
  _end_hang_watchdog
  exit "$rc"
}

main "$@"
