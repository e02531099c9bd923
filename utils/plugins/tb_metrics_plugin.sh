#!/usr/bin/env bash
# Summary: metrics exporter plugin: MaxText's TensorBoard scalars as tb_* gauges (rank 0), read by a daemon.
# Usage: tb_metrics_plugin.sh <short hostname>
#
# Called once per exporter cycle (see utils/metrics_exporter.sh) with the training environment. Only rank 0
# reads TensorBoard: NODE_RANK other than 0, or no OUTPUT_PATH (MaxText's base_output_directory), exits 99
# (never called again). The first call starts the reader daemon (jobkit tb-bridge serve, see
# py/jobkit/observe/tb_serve.py) in the background, in its own session, watching OUTPUT_PATH for the newest
# events.out.tfevents.* file; it exits by itself when the exporter engine (this plugin's parent) exits. Every
# call prints the daemon's exposition file (per scalar tag the newest step's value, e.g.
# tb_learning_loss{host="<$1>"}, with the event's own time as sample timestamp, plus tb_step and
# tb_metrics_plugin_staleness_fill) with bash builtins only, then "# STATE tb1 <pid> <since> <restarts> <file>".
# A dead daemon is started again on the next call (at most 10 times, then exit 99).
#
#   <since>  event files created before this epoch second are ignored: 0 when OUTPUT_PATH is the job's own
#            dir ($JOB_WORKSPACE/$JOB_DIR), else the first call's time minus 60 s (a checkpointing run's
#            output dir is shared with earlier jobs)
#   <file>   ${TMPDIR:-/tmp}/tb_bridge.<job>.<host>.<exporter pid>.prom (daemon pid in <file>.pid)
# Daemon log: $JOB_WORKSPACE/$JOB_DIR/metrics_exporter/tb_bridge.<host>.log, else <file>.log.
#   VENV_DIR   Python environment whose `jobkit` runs the daemon (default <repo>/.venv; else `jobkit` on PATH,
#              else <repo>/py/bin/jobkit: see proc_jobkit in utils/lib/process.sh)
#   TB_BRIDGE_INTERVAL     daemon poll interval in seconds (default 1)
#   TB_BRIDGE_PARENT_PID   the daemon exits with this process (default $PPID, the exporter engine)
set -u

HOST=${1:-}
if [[ -z $HOST ]]; then
  echo "Usage: tb_metrics_plugin.sh <short hostname>" >&2
  exit 2
fi
[[ $HOST == -h || $HOST == --help ]] && { echo "Usage: tb_metrics_plugin.sh <short hostname>"; exit 0; }
[[ ${NODE_RANK:-0} == 0 ]] || exit 99
[[ -n ${OUTPUT_PATH:-} ]] || exit 99


# --- state from the previous call: "tb1 <pid> <since> <restarts> <file>" -----------------------------------
pid="" since="" restarts=0 out=""
state=${_PLUGIN_STATE:-}
if [[ $state == "tb1 "* ]]; then
  state=${state#tb1 }
  pid=${state%% *} state=${state#* }
  since=${state%% *} state=${state#* }
  restarts=${state%% *} out=${state#* }
  [[ $pid =~ ^[0-9]+$ && $since =~ ^[0-9]+$ && $restarts =~ ^[0-9]+$ && -n $out ]] || pid="" since="" restarts=0 out=""
fi
if [[ -z $since ]]; then
  job_path=${JOB_WORKSPACE:-}/${JOB_DIR:-}
  if [[ -n ${JOB_WORKSPACE:-} && -n ${JOB_DIR:-} && ${OUTPUT_PATH%/} == "${job_path%/}" ]]; then
    since=0
  else
    since=$((EPOCHSECONDS - 60))
  fi
fi
if [[ -z $out ]]; then
  key=${JOB_ID:-${JOB_DIR:-job}}
  out=${TMPDIR:-/tmp}/tb_bridge.${key//[^A-Za-z0-9_.-]/_}.${HOST//[^A-Za-z0-9_.-]/_}.$PPID.prom
fi

# --- is the daemon still there? (builtins only: its /proc cmdline names the same --out file) ------------------
daemon_alive() {
  local -a argv
  [[ -n $pid ]] || return 1
  mapfile -d '' -t argv 2>/dev/null <"/proc/$pid/cmdline" || return 1
  [[ " ${argv[*]} " == *" tb-bridge serve "* && " ${argv[*]} " == *" --out $out "* ]]
}

start_daemon() {
  local jobkit log dir repo
  # the exporter may call us through a symlink: the repo is where the real file is (only here: the steady
  # state needs bash builtins only)
  repo=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd) ||
    { echo "tb_metrics_plugin: cannot find the repo of ${BASH_SOURCE[0]}" >&2; return 1; }
  # shellcheck source=utils/lib/process.sh
  source "$repo/utils/lib/process.sh" || return 1
  jobkit=$(proc_jobkit "$repo")
  log=$out.log
  if [[ -n ${JOB_WORKSPACE:-} && -n ${JOB_DIR:-} ]]; then
    dir=$JOB_WORKSPACE/$JOB_DIR/metrics_exporter
    if [[ -d $dir ]] || mkdir -p "$dir" 2>/dev/null; then log=$dir/tb_bridge.$HOST.log; fi
  fi
  "$jobkit" tb-bridge serve --logdir "$OUTPUT_PATH" \
    --host "$HOST" --out "$out" --interval "${TB_BRIDGE_INTERVAL:-1}" --since "$since" \
    --parent-pid "${TB_BRIDGE_PARENT_PID:-$PPID}" </dev/null >>"$log" 2>&1 &
  pid=$!
}

if ! daemon_alive; then
  if [[ -n $pid ]]; then
    restarts=$((restarts + 1))
    if ((restarts > 10)); then
      echo "tb_metrics_plugin: the TensorBoard reader died $restarts times; giving up (see its log)" >&2
      exit 99
    fi
  fi
  start_daemon || exit 99
fi

body=""
[[ -r $out ]] && IFS= read -r -d '' body <"$out"
printf '%s# STATE tb1 %s %s %s %s\n' "$body" "$pid" "$since" "$restarts" "$out"
