#!/usr/bin/env bash
# Usage: submit.sh <MODEL_SPEC> [sbatch args ...] [-- <maxtext key=value | _env_KEY=VALUE> ...]
# Summary: Submit a training job to Slurm, running from an immutable snapshot of this repo
#
#   MODEL_SPEC   model | model:tag | model:alias: | model:alias:tag   (same grammar as run_local.sh)
#   sbatch args  passed to sbatch verbatim: -N 2, -w node[1-2], -p gpu, --time=24:00:00, --exclude=...
#
# Environment: JOB_WORKSPACE (default <repo>/outputs; should be on a shared filesystem), STAGE_TIMEOUTS
# (e.g. "preflight:600,train:86400"), RAY=1, CONTAINER_RUNTIME, DOCKER_IMAGE and the other settings in
# configs/container_settings.sh. No Slurm at hand? `utils/local_cluster.sh up -N 2` starts one here.
# MAX_RETRIES=N (default 0) submits a job that hangs, loses a node, is preempted or reaches its time limit
# again, up to N times (py/jobkit/ops/requeue.py). Slurm warns the job TIME_LIMIT_SIGNAL_LEAD seconds (default
# 300) before its time limit (--signal=B:USR1@...), so training can save a checkpoint and stop.
#
# Writes <JOB_WORKSPACE>/<jobid>-<JOB_NAME>.log, the job dir <jobid>-<JOB_NAME>/ (artifact and log links)
# and the snapshot <JOB_WORKSPACE>/.artifacts/<user>/artifact_<ts>_<hex>/ with git_summary.txt and submit_cmd.txt
# (its sha256 goes to the job as ARTIFACT_SHA256, checked by _job.sbatch before it runs anything from it).
#
# Examples:
#   submit.sh 70b -N 8
#   submit.sh llama2-70b:baseline -N 2 --time=2:00:00 -- per_device_batch_size=2
#   STAGE_TIMEOUTS="train:3600" submit.sh tiny -N 2 -- steps=30
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CONFIGS_DIR=$SCRIPT_DIR/configs
for _lib in launch_args resolve_model container_runtime artifact stage_timeout workspace process settings tune_profile; do
  # shellcheck source=/dev/null
  source "$SCRIPT_DIR/utils/lib/$_lib.sh"
done
unset _lib

_PROG=submit.sh
# _die MESSAGE [EXIT_CODE]: one line on stderr (the message only: users copy the hints in it), then exit.
_die() { echo "$_PROG: $1" >&2; exit "${2:-1}"; }
_say() { echo "[submit] $*" >&2; }
_usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

# Slurm job ids have at most 10 digits in practice; the log name "<id>-<name>.log" must fit 255 bytes.
_LONGEST_JOB_ID=9999999999
# Job states that mean the job died before it could write its log.
_EARLY_DEATH_STATES="FAILED CANCELLED NODE_FAIL BOOT_FAIL TIMEOUT OUT_OF_MEMORY DEADLINE"

# -N/--nodes must be a positive count or min-max range with min <= max; sbatch's own messages for these are
# obscure. Sets MAX_NODES: the most nodes the job may get (1 when no -N is given: sbatch's default).
_check_node_count() {
  local value="" arg i
  MAX_NODES=1
  for ((i = 0; i < ${#SCHEDULER_ARGS[@]}; i++)); do
    arg=${SCHEDULER_ARGS[i]}
    case $arg in
      -N|--nodes) value=${SCHEDULER_ARGS[i + 1]:-} ;;
      -N*) value=${arg#-N} ;;
      --nodes=*) value=${arg#--nodes=} ;;
      *) continue ;;
    esac
    if [[ ! $value =~ ^[1-9][0-9]*(-[1-9][0-9]*)?$ ]]; then
      _die "node count '$value' is not a positive number (or min-max range); e.g. -N 2" 2
    fi
    if [[ $value == *-* ]] && (( 10#${value%-*} > 10#${value#*-} )); then
      _die "node count '$value' has its minimum above its maximum; write MIN-MAX with MIN <= MAX, e.g. -N ${value#*-}-${value%-*}" 2
    fi
    MAX_NODES=$(( 10#${value#*-} ))
  done
}

# Options submit.sh sets itself, refused among the user's sbatch arguments: a second -J renames the job, so
# its job dir no longer matches its log (and a "/" in it walks out of the workspace); --output, --error and
# --chdir move the log and the run away from the layout every tool reads; --export would cut the
# environment that training and a requeue are given. Long options may be abbreviated (sbatch takes --out).
_check_scheduler_args() {
  local arg name fix
  for arg in "${SCHEDULER_ARGS[@]}"; do
    case $arg in
      -J*|--job|--job=*|--job-*) name="-J/--job-name" ;;
      -o*|--ou*) name="-o/--output" ;;
      -e*|--er*) name="-e/--error" ;;
      -D*|--ch*) name="-D/--chdir" ;;
      --exp*) name="--export" ;;
      *) continue ;;
    esac
    case $name in
      -J*) fix="submit.sh names the job JAX-<model>-<tag>; put your name in the tag: submit.sh $MODEL_INPUT:<tag> ..." ;;
      -D*) fix="the job runs in its code snapshot; paths after '--' may be absolute" ;;
      --export) fix="submit.sh passes your whole environment (--export=ALL); set variables before submitting, or pass secrets by name with PASS_ENV=NAME,..." ;;
      *) fix="the job's log is \$JOB_WORKSPACE/<jobid>-<JOB_NAME>.log; set JOB_WORKSPACE to choose where it goes" ;;
    esac
    _die "'$arg' ($name) is set by submit.sh itself and cannot be given; $fix" 2
  done
}

# True when the job may span more than one node: -N above 1, or a -w/--nodelist naming several hosts
# (sbatch then allocates all of them).
_spans_nodes() {
  local arg i list=""
  (( MAX_NODES > 1 )) && return 0
  for ((i = 0; i < ${#SCHEDULER_ARGS[@]}; i++)); do
    arg=${SCHEDULER_ARGS[i]}
    case $arg in
      -w|--nodelist) list=${SCHEDULER_ARGS[i + 1]:-} ;;
      -w*) list=${arg#-w} ;;
      --nodelist=*) list=${arg#--nodelist=} ;;
      *) continue ;;
    esac
    [[ $list == *[,[]* ]] && return 0
  done
  return 1
}

# Multi-node jobs need the workspace on storage every node sees; warn (only) when it looks node-local.
_warn_if_node_local() {
  local fstype
  _spans_nodes || return 0
  fstype=$(workspace_fstype "$1") || true
  case $fstype in
    nfs|nfs4|lustre|gpfs|beegfs|cifs|smb3|panfs|pvfs2|orangefs|wekafs|ceph|fuse.*|"") ;;
    *) _say "WARNING: JOB_WORKSPACE=$1 is on '$fstype', which is usually node-local; multi-node jobs need it on a shared filesystem" ;;
  esac
}

# MAX_RETRIES, TIME_LIMIT_SIGNAL_LEAD and, for a requeued attempt (set by py/jobkit/ops/requeue.py), the snapshot
# it reuses.
_check_requeue_settings() {
  [[ ${MAX_RETRIES:-0} =~ ^[0-9]+$ ]] ||
    _die "MAX_RETRIES='$MAX_RETRIES' is not a number of retries; set MAX_RETRIES=0 (no requeue) or e.g. MAX_RETRIES=2" 2
  local lead=${TIME_LIMIT_SIGNAL_LEAD:-300}
  [[ $lead =~ ^[1-9][0-9]{0,4}$ ]] && (( lead <= 65535 )) ||
    _die "TIME_LIMIT_SIGNAL_LEAD='$TIME_LIMIT_SIGNAL_LEAD' is not a number of seconds from 1 to 65535; e.g. TIME_LIMIT_SIGNAL_LEAD=300" 2
  if [[ -n ${REQUEUE_ARTIFACT:-} && ! -f $REQUEUE_ARTIFACT/_job.sbatch ]]; then
    _die "REQUEUE_ARTIFACT=$REQUEUE_ARTIFACT is not a code snapshot (no _job.sbatch); unset it to submit from this checkout" 2
  fi
}

# The sbatch option that makes Slurm warn the batch script ahead of the time limit, unless the user set
# their own --signal (theirs wins: _job.sbatch only acts on USR1).
_time_limit_signal() {
  local arg
  for arg in "${SCHEDULER_ARGS[@]}"; do [[ $arg == --signal* ]] && return 0; done
  echo "--signal=B:USR1@${TIME_LIMIT_SIGNAL_LEAD:-300}"
}

# Prints the newest active reservation that names $USER, or nothing.
_active_reservation() {
  local user=${USER:-$(id -un)} now line name start end users best="" best_start=0 s e
  now=$(date +%s)
  while IFS= read -r line; do
    [[ $line =~ ReservationName=([^ ]+) ]] || continue
    name=${BASH_REMATCH[1]}
    [[ $line =~ StartTime=([^ ]+) ]] && start=${BASH_REMATCH[1]} || continue
    [[ $line =~ EndTime=([^ ]+) ]] && end=${BASH_REMATCH[1]} || continue
    [[ $line =~ Users=([^ ]+) ]] && users=${BASH_REMATCH[1]} || continue
    [[ ,$users, == *",$user,"* ]] || continue
    s=$(date -d "$start" +%s 2>/dev/null) || s=0
    e=$(date -d "$end" +%s 2>/dev/null) || e=$((now + 1))
    if (( s <= now && now <= e && s >= best_start )); then best=$name best_start=$s; fi
  done < <(scontrol show reservation -o 2>/dev/null || true)
  printf '%s' "$best"
}

# After submission: a job that dies in its prolog never writes a log; say so and remove its empty dirs.
_check_early_death() {
  local job_id=$1 log=$2 state i
  local checks
  checks=$(setting_uint EARLY_DEATH_CHECK_SECONDS 3) || checks=3
  for ((i = 0; i < checks; i++)); do
    sleep 1
    state=$(squeue -h -t all -j "$job_id" -o %T 2>/dev/null | head -1) || state=""
    case $state in PENDING|CONFIGURING|"") continue ;; esac
    if [[ " $_EARLY_DEATH_STATES " == *" $state "* && ! -s $log ]]; then
      return 1
    fi
    [[ $state == RUNNING || $state == COMPLETING || $state == COMPLETED ]] && return 0
  done
  return 0
}

# _sbatch_refusal OUTPUT: the one-line error for a failed sbatch. sbatch fails the same way for a job it
# rejects and for a host that has no Slurm behind it; only the first is fixed in the sbatch arguments.
_sbatch_refusal() {
  local said
  said=$(tr '\n' ' ' <<<"$1" | sed 's/  */ /g; s/ *$//')
  case $said in
    *"Could not establish a configuration source"*|*"Unable to process configuration file"*|\
    *"slurm.conf"*"No such file"*|*"unable to status file"*|*"Unable to contact slurm controller"*|\
    *"Unable to establish controller"*|*"Zero Bytes were transmitted or received"*)
      echo "no Slurm configuration or controller is reachable from this host ($(hostname -s)); sbatch said: $said; set SLURM_CONF to your cluster's slurm.conf or submit from a login node (local test cluster: eval \"\$(utils/local_cluster.sh env)\")" ;;
    *[Mm]"unge"*)
      echo "sbatch cannot authenticate to Slurm from this host ($(hostname -s)): munge is not running or its key is not the cluster's; sbatch said: $said; start munged with the cluster's key or submit from a login node" ;;
    *)
      echo "sbatch refused the job: $said; fix the sbatch arguments before '--'" ;;
  esac
}

main() {
  case ${1:-} in -h|--help) _usage; exit 0 ;; esac
  (( $# )) || _die "no model given; usage: submit.sh <model>[:tag] [sbatch args] [-- key=value ...]" 2

  # --- Validate everything before anything is created. ---
  parse_launch_args "$@" || exit 2
  MODEL_NAME=$(resolve_model "$MODEL_INPUT" "$CONFIGS_DIR") || exit 2
  _check_scheduler_args
  _check_node_count
  _check_requeue_settings
  env_mask_pass_env_names >/dev/null || exit 2
  stage_timeouts_init preflight:900 pull:900 ecc:300 train:none || exit 2
  if ! command -v sbatch >/dev/null 2>&1; then
    _die "no sbatch on PATH; install the Slurm client (e.g. apt install slurm-client) and point it at your cluster, or start a local one: utils/local_cluster.sh up -N 2 && eval \"\$(utils/local_cluster.sh env)\"" 2
  fi
  local runtime
  runtime=$(detect_container_runtime) || exit 2
  local user_workspace=${JOB_WORKSPACE:-}
  JOB_WORKSPACE=$(resolve_workspace "$SCRIPT_DIR")
  JOB_NAME=$(job_name "$MODEL_NAME" "$EXP_TAG")
  check_job_name_length "$JOB_NAME" "$_LONGEST_JOB_ID" || exit 2
  check_workspace_writable "$JOB_WORKSPACE" || exit 1
  launch_check_alias_dir "$JOB_WORKSPACE" "${MODEL_NAME_ALIAS:-$MODEL_NAME}" "${PASSTHROUGH_ARGS[@]}" || exit 2
  # TUNE_PROFILE / TUNE_PROFILE_FILE: the checks train_env.sh makes at job time, made before the job exists.
  tune_profile_launch_check "$JOB_WORKSPACE" "${PASSTHROUGH_ARGS[@]}" || exit 2
  workspace_umask || exit 2   # the snapshot, the log dir and (through Slurm's propagation) the job itself
  _warn_if_node_local "$JOB_WORKSPACE"
  # Natively, every node uses this checkout's venv (on the shared filesystem, like the workspace). With a
  # container runtime, training brings its own stack and the batch host only needs jobkit for the verdict.
  if [[ $runtime == none ]]; then
    "$SCRIPT_DIR/utils/setup_env.sh" || exit 1
  else
    "$SCRIPT_DIR/utils/setup_env.sh" --tools || _say "warning: no jobkit tools on this host; the job runs, without the TGS verdict line"
  fi
  export VENV_DIR=${VENV_DIR:-$SCRIPT_DIR/.venv}
  # HANG_* settings reach every node's training tier; checked here by the watchdog's own parser.
  local check=0
  "$(proc_jobkit "$SCRIPT_DIR")" hang-watchdog --check || check=$?
  (( check != LAUNCH_SETTING_REFUSED_RC )) || exit 2
  launch_check_procs "$(proc_jobkit "$SCRIPT_DIR")" "${PASSTHROUGH_ARGS[@]}" || exit 2
  # shellcheck source=utils/lib/coredump.sh
  source "$SCRIPT_DIR/utils/lib/coredump.sh"
  coredump_check || exit 2   # COREDUMP / COREDUMP_WAIT reach the training tier too
  local -a extra_sbatch=()
  local reservation
  reservation=$(_active_reservation)
  if [[ -n $reservation ]]; then
    _say "using your active reservation '$reservation'"
    extra_sbatch+=("--reservation=$reservation")
  fi

  local signal_opt
  signal_opt=$(_time_limit_signal)
  [[ -z $signal_opt ]] || extra_sbatch+=("$signal_opt")

  # --- Snapshot (a requeued attempt reuses its first attempt's), then submit. ---
  local start_ns artifact
  start_ns=$(date +%s%N)
  mkdir -p "$JOB_WORKSPACE"
  # The snapshot's hash travels in the job's environment; _job.sbatch checks it before it runs anything.
  local artifact_sha
  if [[ -n ${REQUEUE_ARTIFACT:-} ]]; then
    artifact=$REQUEUE_ARTIFACT
    artifact_sha=$("$SCRIPT_DIR/_job.sbatch" --snapshot-sha256 "$artifact") || _die "cannot read the snapshot $artifact"
    # A requeue carries the first attempt's hash (its submit-time environment): the snapshot must still match.
    if [[ -n ${ARTIFACT_SHA256:-} && $ARTIFACT_SHA256 != "$artifact_sha" ]]; then
      _die "the snapshot $artifact changed since the first attempt was submitted (sha256 $artifact_sha, submitted $ARTIFACT_SHA256); not submitting it again: resubmit from your checkout" 2
    fi
    _say "attempt ${ATTEMPT:-?} of job ${RETRY_OF:-?}: reusing snapshot $artifact"
  else
    artifact=$(make_artifact "$SCRIPT_DIR" "$JOB_WORKSPACE") || exit 1
    (JOB_WORKSPACE=$user_workspace write_submit_cmd "$artifact" "$0" "$@")
    artifact_sha=$("$SCRIPT_DIR/_job.sbatch" --snapshot-sha256 "$artifact") || _die "cannot read the snapshot $artifact"
    _say "snapshot $artifact ($(du -sh "$artifact" | cut -f1), $(( ($(date +%s%N) - start_ns) / 1000000 )) ms)"
  fi
  # What a requeue submits again: these very arguments, as a JSON array (py/jobkit/ops/requeue.py reads it).
  local submit_argv
  submit_argv=$(launch_args_json "$@")

  local sbatch_out job_id
  if ! sbatch_out=$(
    env MAXTEXT_LAUNCHER_DIR="$artifact" JOB_WORKSPACE="$JOB_WORKSPACE" MODEL_NAME="$MODEL_NAME" \
      MODEL_NAME_ALIAS="$MODEL_NAME_ALIAS" EXP_TAG="$EXP_TAG" SUBMIT_ARGV="$submit_argv" ARTIFACT_SHA256="$artifact_sha" \
      sbatch --parsable -J "$JOB_NAME" --output="$JOB_WORKSPACE/%j-$JOB_NAME.log" --chdir="$artifact" \
      --export=ALL "${extra_sbatch[@]}" "${SCHEDULER_ARGS[@]}" \
      "$artifact/_job.sbatch" "$MODEL_NAME" -- "${PASSTHROUGH_ARGS[@]}" 2>&1
  ); then
    if [[ -z ${REQUEUE_ARTIFACT:-} ]]; then
      remove_artifact "$artifact"
      rmdir "${artifact%/*}" "$JOB_WORKSPACE/.artifacts" 2>/dev/null || true
    fi
    _die "$(_sbatch_refusal "$sbatch_out")"
  fi
  job_id=${sbatch_out##*$'\n'}
  job_id=${job_id%%;*}
  if [[ ! $job_id =~ ^[0-9]+$ ]]; then
    [[ -n ${REQUEUE_ARTIFACT:-} ]] || remove_artifact "$artifact"
    _die "could not read a job id from sbatch's answer: $sbatch_out"
  fi

  local job_dir=$JOB_WORKSPACE/$job_id-$JOB_NAME log=$JOB_WORKSPACE/$job_id-$JOB_NAME.log
  mkdir -p "$job_dir"
  ln -s "../.artifacts/$(basename "$(dirname "$artifact")")/${artifact##*/}" "$job_dir/artifact"
  ln -s "../$job_id-$JOB_NAME.log" "$job_dir/log"
  [[ -z ${REQUEUE_PREVIOUS_DIR:-} ]] || ln -s "../$REQUEUE_PREVIOUS_DIR" "$job_dir/previous"
  # What a requeue needs when the batch script cannot run it (its host died: `jobkit monitor --requeue`; a
  # requeue by hand): the snapshot and these arguments, for the owner only (the arguments may hold _env_ values).
  if [[ ${MAX_RETRIES:-0} == *[1-9]* ]] &&
    ! (umask 077 && launch_args_json "MAXTEXT_LAUNCHER_DIR=$artifact" "ARTIFACT_SHA256=$artifact_sha" \
      "SUBMIT_ARGV=$submit_argv" "JOB_WORKSPACE=$JOB_WORKSPACE" >"$job_dir/submit_env.json"); then
    _say "cannot write $job_dir/submit_env.json: only the batch script can requeue this job"
  fi
  if ! _check_early_death "$job_id" "$log"; then
    echo "$_PROG: job $job_id died before writing its log (state $(squeue -h -t all -j "$job_id" -o %T 2>/dev/null)); see 'scontrol show job $job_id' and the slurmd log of its node" >&2
    rm -f "$job_dir/artifact" "$job_dir/log" "$job_dir/previous" "$job_dir/submit_env.json"; rmdir "$job_dir" 2>/dev/null || true
    [[ -n ${REQUEUE_ARTIFACT:-} ]] || remove_artifact "$artifact"
    exit 1
  fi
  echo "Submitted job $job_id ($JOB_NAME)"
  echo "  log:      $log"
  echo "  job dir:  $job_dir"
  echo "  follow:   tail -F $log"
}

main "$@"
