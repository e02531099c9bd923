#!/usr/bin/env bash
# Usage: run_local.sh [<MODEL_SPEC> [-- <maxtext key=value | _env_KEY=VALUE> ...]]
# Summary: Train a model on this machine, no scheduler; with no arguments, open a shell in the training environment
#
#   MODEL_SPEC   model | model:tag | model:alias: | model:alias:tag
#                model is a config name in configs/, an alias from configs/aliases, or a unique part of a name
#   key=value    MaxText overrides, e.g. steps=10 per_device_batch_size=4
#   _env_K=V     set K=V in the training environment (last layer: wins over train_env.sh and configs/<model>.env.sh)
#
# Environment: JOB_WORKSPACE (default <repo>/outputs), CONTAINER_RUNTIME (podman|docker|none, default: detect),
# RAY, DOCKER_IMAGE and the other settings in configs/container_settings.sh.
#
# Writes <JOB_WORKSPACE>/<JOB_ID>-<JOB_NAME>.log and the job dir <JOB_WORKSPACE>/<JOB_ID>-<JOB_NAME>/.
# Exit status is training's; Ctrl-C / SIGTERM stop training and exit 130 / 143.
#
# Examples:
#   run_local.sh tiny
#   run_local.sh tiny:baseline -- steps=30 _env_TUNE_PROFILE=restore_default
#   run_local.sh llama2-70b:ckpt-a: -- enable_checkpointing=true
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CONFIGS_DIR=$SCRIPT_DIR/configs
# shellcheck source=utils/lib/launch_args.sh
source "$SCRIPT_DIR/utils/lib/launch_args.sh"
# shellcheck source=utils/lib/resolve_model.sh
source "$SCRIPT_DIR/utils/lib/resolve_model.sh"
# shellcheck source=utils/lib/container_runtime.sh
source "$SCRIPT_DIR/utils/lib/container_runtime.sh"
# shellcheck source=utils/lib/job_log.sh
source "$SCRIPT_DIR/utils/lib/job_log.sh"
# shellcheck source=utils/lib/process.sh
source "$SCRIPT_DIR/utils/lib/process.sh"
# shellcheck source=utils/lib/workspace.sh
source "$SCRIPT_DIR/utils/lib/workspace.sh"
# shellcheck source=utils/lib/tune_profile.sh
source "$SCRIPT_DIR/utils/lib/tune_profile.sh"

_PROG=run_local.sh
# _die MESSAGE [EXIT_CODE]: one line on stderr (the message only: users copy the hints in it), then exit.
_die() { echo "$_PROG: $1" >&2; exit "${2:-1}"; }
_usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

# Prints the one-line TGS/MFU verdict; a missing interpreter or unparsable log never changes the exit code.
_print_tgs_line() {
  local log=$1 status=$2 rc=$3
  "$(proc_jobkit "$SCRIPT_DIR")" tgs --line "$log" --status "$status" --exit-code "$rc" 2>&1 || true
}

# _spec_in_args ARG...: the first argument before '--' that names a model, or "<model>" when none does.
_spec_in_args() {
  local arg
  for arg; do
    [[ $arg == -- ]] && break
    [[ -n $arg && $arg != -* ]] || continue
    if (parse_model_spec "$arg" && resolve_model "$MODEL_INPUT" "$CONFIGS_DIR") >/dev/null 2>&1; then
      printf '%s' "$arg"; return 0
    fi
  done
  printf '<model>'
}

# _after_separator ARG...: the arguments after the first '--', shell-quoted, with a leading " -- ".
_after_separator() {
  local i
  for ((i = 1; i <= $#; i++)); do
    if [[ ${!i} == -- ]]; then
      (( i < $# )) && printf ' --' && printf ' %q' "${@:i+1}"
      return 0
    fi
  done
}

_interactive() {
  local runtime
  runtime=$(detect_container_runtime) || exit 2
  if [[ $runtime == none ]]; then "$SCRIPT_DIR/utils/setup_env.sh" || exit 1; fi
  CONTAINER_RUNTIME=$runtime exec "$SCRIPT_DIR/_container.sh"
}

main() {
  if (( $# == 0 )); then _interactive; fi
  case $1 in
    -h|--help) _usage; exit 0 ;;
    # An option first is usually a scheduler option (-N 2): there is none here, so say where those go.
    -*)
      local spec
      spec=$(_spec_in_args "$@")
      _die "'$1' is not a model; run_local.sh takes the model first and no scheduler options (it trains on this one machine): run_local.sh $spec$(_after_separator "$@"); for several nodes: submit.sh $spec -N <nodes>$(_after_separator "$@")" 2 ;;
  esac

  # --- Validate everything before anything is created. ---
  parse_launch_args "$@" || exit 2
  if (( ${#SCHEDULER_ARGS[@]} )); then
    _die "unexpected '${SCHEDULER_ARGS[*]}' before '--'; run_local.sh takes no scheduler options (it trains on this one machine; several nodes: submit.sh), MaxText overrides go after '--' (run_local.sh $1 -- steps=10)" 2
  fi
  MODEL_NAME=$(resolve_model "$MODEL_INPUT" "$CONFIGS_DIR") || exit 2
  env_mask_pass_env_names >/dev/null || exit 2   # PASS_ENV: names only, each set here
  CONTAINER_RUNTIME=$(detect_container_runtime) || exit 2
  JOB_WORKSPACE=$(resolve_workspace "$SCRIPT_DIR")
  check_workspace_writable "$JOB_WORKSPACE" || exit 1
  launch_check_alias_dir "$JOB_WORKSPACE" "${MODEL_NAME_ALIAS:-$MODEL_NAME}" "${PASSTHROUGH_ARGS[@]}" || exit 2
  # TUNE_PROFILE / TUNE_PROFILE_FILE: the checks train_env.sh makes at job time, made before the job exists.
  tune_profile_launch_check "$JOB_WORKSPACE" "${PASSTHROUGH_ARGS[@]}" || exit 2
  workspace_umask || exit 2
  JOB_ID=$(new_local_job_id)
  JOB_NAME=$(job_name "$MODEL_NAME" "$EXP_TAG")
  check_job_name_length "$JOB_NAME" "$JOB_ID" || exit 2
  if [[ $CONTAINER_RUNTIME == none ]]; then
    "$SCRIPT_DIR/utils/setup_env.sh" || exit 1
  else
    # Training brings its own stack in the image; this host only needs jobkit for the verdict line.
    "$SCRIPT_DIR/utils/setup_env.sh" --tools || echo "$_PROG: warning: no jobkit tools on this host; the job runs, without the TGS verdict line" >&2
  fi

  # HANG_* settings reach the training tier; checked here by the watchdog's own parser, before the job exists.
  local check=0
  "$(proc_jobkit "$SCRIPT_DIR")" hang-watchdog --check || check=$?
  (( check != LAUNCH_SETTING_REFUSED_RC )) || exit 2
  launch_check_procs "$(proc_jobkit "$SCRIPT_DIR")" "${PASSTHROUGH_ARGS[@]}" || exit 2
  # shellcheck source=utils/lib/coredump.sh
  source "$SCRIPT_DIR/utils/lib/coredump.sh"
  coredump_check || exit 2   # COREDUMP / COREDUMP_WAIT reach the training tier too

  # --- The job exists from here on. ---
  JOB_DIR=$JOB_ID-$JOB_NAME
  local log_file=$JOB_WORKSPACE/$JOB_DIR.log
  mkdir -p "$JOB_WORKSPACE/$JOB_DIR"
  ln -s "../$JOB_DIR.log" "$JOB_WORKSPACE/$JOB_DIR/log"
  NNODES=1 NODE_RANK=0
  JOB_NODELIST=$(hostname -s) NODELIST_EXPANDED=$(hostname -s)
  export JOB_ID JOB_NAME JOB_DIR JOB_WORKSPACE NNODES NODE_RANK JOB_NODELIST NODELIST_EXPANDED
  export MODEL_NAME MODEL_NAME_ALIAS EXP_TAG CONTAINER_RUNTIME

  # Everything below goes to the terminal and the log. tee ignores INT/TERM so a Ctrl-C cannot cut the
  # log short before the summary is written.
  exec > >(trap '' INT TERM; exec tee -a "$log_file") 2>&1
  local tee_pid=$!
  print_job_header JOB_ID JOB_NAME NNODES JOB_NODELIST MODEL_NAME MODEL_NAME_ALIAS EXP_TAG PASSTHROUGH_ARGS \
    JOB_WORKSPACE CONTAINER_RUNTIME RAY LOCAL_WORLD_SIZE
  echo "[run_local] log: $log_file"

  local start=$SECONDS rc=0 cancelled=0 train_pid killer_pid="" oom_before
  oom_before=$(memory_oom_kills)
  # Training runs in its own session: a terminal's Ctrl-C reaches only us, and we stop its whole group. Under
  # `jobkit reap` (proc_reaper) when native: what its tree detaches into sessions of its own (RAY=1's Ray
  # daemons), which that group kill would miss, is KILLed when it ends. Not for a container: all of training is
  # in it, and podman's conmon detaches on purpose and must outlive the client to stop it cleanly.
  local -a reaper=()
  [[ $CONTAINER_RUNTIME == none ]] && mapfile -d '' -t reaper < <(proc_reaper "$SCRIPT_DIR")
  setsid "${reaper[@]}" "$SCRIPT_DIR/_container.sh" "$MODEL_NAME" -- "${PASSTHROUGH_ARGS[@]}" &
  train_pid=$!
  _cancel() {
    (( cancelled )) && return 0
    cancelled=$1
    echo "[run_local] caught SIG$2: stopping training (process group $train_pid)"
    kill -TERM -- "-$train_pid" 2>/dev/null || true
    killer_pid=$(proc_kill_after "${CANCEL_GRACE_SECONDS:-20}" "-$train_pid")
  }
  trap '_cancel 130 INT' INT
  trap '_cancel 143 TERM' TERM
  proc_wait "$train_pid" || rc=$?   # keeps waiting when a trap interrupts it; rc is training's
  proc_cancel_kill_after "$killer_pid"
  # A member of the group may outlive its leader (e.g. a forked helper); it must not outlive the job.
  kill -KILL -- "-$train_pid" 2>/dev/null || true
  trap - INT TERM
  if (( cancelled )); then rc=$cancelled; fi

  local status hang
  # The watchdog's marker, only if it is this job's own (a planted one is ignored, and said so).
  hang=$("$(proc_jobkit "$SCRIPT_DIR")" hang-watchdog --marker --job-dir "$JOB_WORKSPACE/$JOB_DIR") || hang=""
  status=$(job_status_word "$rc" "$(( cancelled ? 1 : 0 ))" "$hang" "$log_file")
  # Training that saved and exited 0 when the watchdog stopped it still hung: the exit status says so.
  [[ $status == HANG ]] && (( rc == 0 )) && rc=1
  (( rc == 0 )) || print_oom_kill_note "$oom_before"
  local detail=""
  [[ $status == HANG ]] && detail=$hang
  [[ $status == STOPPED ]] && detail=$(job_stop_detail "$log_file" "$JOB_WORKSPACE" "${MODEL_NAME_ALIAS:-$MODEL_NAME}")
  print_job_summary "$JOB_ID" "$JOB_NAME" "$MODEL_NAME" "$NNODES" $((SECONDS - start)) "$rc" "$status" "$detail" \
    "$(job_metrics_state "$(proc_jobkit "$SCRIPT_DIR")" "$log_file")"
  _print_tgs_line "$log_file" "$status" "$rc"
  exec >&- 2>&-
  wait "$tee_pid" 2>/dev/null || true
  exit "$rc"
}

main "$@"
