# shellcheck shell=bash
# Summary: RAY=1 on one node: metrics exporter, Ray head or worker, Prometheus, TensorBoard, training under Ray (sourced library)
#
# run_with_observability CMD...
#     Runs the training command CMD (an argv; the same on every node) with the observability stack around it and
#     returns training's exit status. The steps, in order:
#       every node   start the metrics exporter
#       rank 0       make the job's Ray token (<job_dir>/.ray/auth/token, 0600 in a 0700 dir: every Ray process
#                    of the job, and anyone who drives it, needs it), start the Ray head (in the background) on the cluster-private address, Prometheus (TSDB in
#                    <job_dir>/prometheus/), TensorBoard, the driver (`jobkit ray-launch`: one actor per node,
#                    training in its own process); print the SSH tunnel for whatever started; wait for training
#       other ranks  join the Ray cluster, wait for rank 0's verdict
#       every node   teardown: stop what this node started by PID (Ray by its own temp dir), copy Ray's logs to
#                    <job_dir>/ray_logs/<host>/; rank 0 backfills every TensorBoard step into the TSDB
#     If Ray cannot start (or a node cannot join) the job says why and trains without Ray: every node runs CMD.
#
# Reads the tier contract (JOB_WORKSPACE JOB_DIR JOB_ID NODE_RANK NNODES OUTPUT_PATH JAX_COORDINATOR_IP) and:
#   RAY_PORT            Ray GCS port on rank 0 (picked when unset; multi-node jobs get it from _job.sbatch)
#   RAY_DASHBOARD_PORT  first port tried for the Ray dashboard on 127.0.0.1 (default 8265)
#   RAY_METRICS_PORT    first port tried for Ray's metrics export on every node (default 55080)
#   TENSORBOARD_PORT    first port tried for TensorBoard on 127.0.0.1 (default 6006); TENSORBOARD=0 skips it
#   PROMETHEUS_PORT     first port tried for Prometheus on 127.0.0.1 (default 9190)
#   PROMETHEUS_SCRAPE_INTERVAL  seconds between scrapes (default by node count: prometheus_scrape_interval)
#   EXPORTER_PORT       first port tried for the metrics exporter (default 9500), EXPORTER_INTERVAL (default 10 s)
#   RAY_JOIN_TRIES / RAY_JOIN_DELAY   a worker's attempts to join the head (default 12, 5 s apart)
#   RAY_NODES_TIMEOUT   seconds rank 0 waits for all nodes to join (default 120)
#   OBS_PYTHON          interpreter for the tools (default: the project's, see proc_python in process.sh)
#   OBS_NICE            niceness of the exporter (and its plugins), Prometheus, TensorBoard and Ray's services
#                       (default 10), so that training wins the CPU when a node is busy. Ray's raylet and
#                       workers keep 0: training runs under them.

_OBS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=utils/lib/process.sh
source "$_OBS_DIR/process.sh"
# shellcheck source=utils/lib/cluster_ip.sh
source "$_OBS_DIR/cluster_ip.sh"
# shellcheck source=utils/lib/free_port.sh
source "$_OBS_DIR/free_port.sh"
# shellcheck source=utils/lib/ray_cluster.sh
source "$_OBS_DIR/ray_cluster.sh"
# shellcheck source=utils/lib/workspace.sh
source "$_OBS_DIR/workspace.sh"
# shellcheck source=utils/lib/prometheus.sh
source "$_OBS_DIR/prometheus.sh"

# Exit status of `jobkit ray-launch` when no training process was started (cluster unreachable, not every node
# joined): safe to train without Ray, nothing ran twice.
OBS_RAY_UNREACHABLE_RC=75

# The whole state of one run, set by _obs_init and read by every step and by the teardown (global: the
# signal trap and the teardown need it; -g because _train.sh sources this file inside a function).
#   host ip nice           short hostname, the address the exporter and Ray bind, niceness of the services
#   job_path shared state  <job_dir>, <job_dir>/.ray (rank 0's verdict for the other ranks), a private temp dir
#   python                 interpreter for TensorBoard
#   ray_tmp                this node's Ray --temp-dir (short: Ray's socket paths under it must fit in 107 bytes),
#                          a fresh 0700 directory (mktemp): no other user can plant or replace anything in it
#   token                  the job's Ray token file, on the shared filesystem
#   ray                    off | starting | up | failed; ray_rc_file (the head's start status), ray_head_pid,
#                          ray_started (there may be Ray processes to stop), ray_metrics_port, ray_sd_file
#   dash_port prom_port tb_port   the ports of what started on 127.0.0.1 ("" when it did not start)
#   exporter_pid tb_pid child_pid (the driver or plain training), cancelled (a TERM/INT arrived)
#   sink                   where training started by this node's actor writes (see _obs_init)
declare -gA _OBS=()
# `jobkit` as a command line (an interpreter and a script, or one console script): an argv, not a string.
declare -ga _OBS_JOBKIT=()

_obs_log() { echo "[observability] $*"; }

# Prints the first port from START on that no TCP socket of this node uses (tries 20).
_obs_port_from() {
  local port=$1 used i
  used=" $(tcp_ports_in_use | tr '\n' ' ') "
  for ((i = 0; i < 20; i++, port++)); do
    [[ $used == *" $port "* ]] || { echo "$port"; return 0; }
  done
  return 1
}

# Sets up _OBS and _OBS_JOBKIT; fails (after a log line) when this node has no address to bind.
_obs_init() {
  local repo host ip_err
  repo=$(cd "$_OBS_DIR/../.." && pwd)
  host=$(hostname -s 2>/dev/null || hostname)
  _OBS=(
    [host]=${host%%.*} [job_path]=$JOB_WORKSPACE/$JOB_DIR [nice]=${OBS_NICE:-10} [cancelled]=0
    [ray]=off [ray_started]="" [ray_head_pid]="" [ray_sd_file]="" [dash_port]="" [prom_port]="" [tb_port]=""
    [exporter_pid]="" [tb_pid]="" [child_pid]="" [sink]="" [record_pid]=""
  )
  _OBS[shared]=${_OBS[job_path]}/.ray
  _OBS[token]=${_OBS[shared]}/auth/token
  # OBS_PYTHON runs the package from this checkout with that interpreter (it may be an image's, without jobkit).
  if [[ -n ${OBS_PYTHON:-} ]]; then
    _OBS[python]=$OBS_PYTHON
    _OBS_JOBKIT=("$OBS_PYTHON" "$repo/py/bin/jobkit")
  else
    _OBS[python]=$(proc_python "$repo") || _OBS[python]=python3
    _OBS_JOBKIT=("$(proc_jobkit "$repo")")
  fi
  _OBS[state]=$(mktemp -d "${TMPDIR:-/tmp}/obs.XXXXXX") || { _obs_log "cannot create a temp dir in ${TMPDIR:-/tmp}: training without observability"; return 1; }
  _OBS[ray_rc_file]=${_OBS[state]}/ray_head.rc
  # /tmp itself, not TMPDIR: Ray's unix socket paths under it must stay short.
  _OBS[ray_tmp]=$(mktemp -d /tmp/mxray.XXXXXX) || {
    _obs_log "cannot create a temp dir in /tmp: training without observability"
    rm -rf "${_OBS[state]}"
    return 1
  }
  # Training started by this node's Ray actor writes here, this shell's own stdout (the job log, through
  # srun's per-task prefix under Slurm), instead of streaming every line through Ray to rank 0.
  # Only a pipe or a terminal: a regular file's shared offset would let the shell's writes overwrite the child's.
  [[ -p /dev/stdout || -t 1 ]] && _OBS[sink]=/proc/$$/fd/1
  # Rank 0's verdict for the other ranks lives here: nobody else may plant one (every rank runs as the same uid).
  if ! ip_err=$(workspace_private_dir "${_OBS[shared]}"); then
    _obs_log "[!] $ip_err: training without observability (remove it, or use a job dir only you can write)"
    rm -rf "${_OBS[state]}" "${_OBS[ray_tmp]}"
    return 1
  fi

  ip_err=${_OBS[state]}/ip.err
  if ((NNODES == 1)); then
    # One node: nothing outside it needs to reach Ray or the exporter, so nothing outside it may: loopback,
    # even where the node has a cluster address (Ray's services would otherwise face the whole network).
    _OBS[ip]=127.0.0.1
    _obs_log "one node: Ray and the exporter bind ${_OBS[ip]}"
    return 0
  elif _OBS[ip]=$(detect_cluster_ip 2>"$ip_err"); then
    return 0
  fi
  _obs_log "no cluster-private address ($(<"$ip_err")): training without observability"
  rm -rf "${_OBS[state]}" "${_OBS[ray_tmp]}"
  return 1
}

# ---- steps ----------------------------------------------------------------------------------------------

_obs_start_exporter() {
  local dir=${_OBS[job_path]}
  local log=$dir/metrics_exporter/${_OBS[host]}.log
  mkdir -p "$dir/metrics_exporter" "$dir/prometheus/targets/ray"
  # Its own process group, so that teardown stops the watchdog, engine and plugins together.
  nice -n "${_OBS[nice]}" setsid "$_OBS_DIR/../metrics_exporter.sh" --watchdog --address "${_OBS[ip]}" \
    --port "${EXPORTER_PORT:-9500}" --interval "${EXPORTER_INTERVAL:-10}" --sd-dir "$dir/prometheus/targets" \
    </dev/null >>"$log" 2>&1 &
  _OBS[exporter_pid]=$!
  _obs_log "metrics exporter started (pid ${_OBS[exporter_pid]}, log $log)"
  _OBS[ray_metrics_port]=$(_obs_port_from "${RAY_METRICS_PORT:-55080}") || _OBS[ray_metrics_port]=${RAY_METRICS_PORT:-55080}
}

# True when this node has a ray CLI; else says why not, once.
_obs_ray_installed() {
  local why
  why=$(_ray_cli 2>&1 >/dev/null) && return 0
  _obs_log "[!] ${why#ray_cluster: }: training without Ray"
  return 1
}

# Rank 0: starts the Ray head in the background (it takes seconds); its status lands in _OBS[ray_rc_file].
_obs_start_head() {
  local rc_file=${_OBS[ray_rc_file]}
  RAY_PORT=${RAY_PORT:-$(pick_free_port)} || { _obs_log "[!] no free port for Ray's GCS: training without Ray"; return 1; }
  local why
  if ! why=$(ray_make_token "${_OBS[token]}" 2>&1); then
    _obs_log "[!] ${why#ray_cluster: }: training without Ray"
    return 1
  fi
  _obs_use_token
  _OBS[dash_port]=$(_obs_port_from "${RAY_DASHBOARD_PORT:-8265}") || _OBS[dash_port]=${RAY_DASHBOARD_PORT:-8265}
  _OBS[ray_t0]=$EPOCHREALTIME
  _OBS[ray]=starting _OBS[ray_started]=1 # from here on there may be Ray processes to stop, even of a half-started head
  (
    rc=0
    # Returns once the GCS and raylet are up; the dashboard comes up behind it, and its services are reniced
    # once it has (ray_start_head's own background watcher, which also reports a late failure to this log).
    RAY_SERVICES_NICE=${_OBS[nice]} JOBKIT_OUTPUT_SINK=${_OBS[sink]} ray_start_head "${_OBS[ray_tmp]}" \
      "${_OBS[ip]}" "$RAY_PORT" "${_OBS[dash_port]}" "${_OBS[ray_metrics_port]}" || rc=$?
    echo "$rc" >"$rc_file.tmp" && mv -f "$rc_file.tmp" "$rc_file"
  ) &
  _OBS[ray_head_pid]=$!
}

_obs_start_prometheus() {
  local port err=${_OBS[state]}/prometheus.err dir=${_OBS[job_path]} interval
  # The interval grows with the node count (prometheus_scrape_interval) unless PROMETHEUS_SCRAPE_INTERVAL says.
  interval=${PROMETHEUS_SCRAPE_INTERVAL:-$(prometheus_scrape_interval "${NNODES:-1}")}
  [[ $interval =~ ^[0-9]+$ ]] && interval+=s
  if [[ ! $interval =~ ^[1-9][0-9]*s$ ]]; then
    _obs_log "metrics are off: PROMETHEUS_SCRAPE_INTERVAL='$PROMETHEUS_SCRAPE_INTERVAL' is not a number of seconds (e.g. 5s); fix or unset it (training goes on)"
    return 0
  fi
  _OBS[prom_interval]=${interval%s}
  # Found, never installed: no apt-get as root on a compute node or in its container at job time (O1).
  if prometheus_find >/dev/null 2>"$err" &&
    port=$(PROMETHEUS_PORT=${PROMETHEUS_PORT:-9190} prometheus_start "$dir" --nodes "${NNODES:-1}" \
      --scrape-interval "$interval" 2>"$err"); then
    _OBS[prom_port]=$port
    renice -n "${_OBS[nice]}" -p "$(<"$dir/prometheus/prometheus.pid")" >/dev/null 2>&1 || true
    # Say which interval this job got.
    _obs_log "Prometheus on 127.0.0.1:$port, TSDB $dir/prometheus, scraping ${NNODES:-1} node(s) every $interval (${PROMETHEUS_SCRAPE_INTERVAL:+PROMETHEUS_SCRAPE_INTERVAL; }by node count: 5s up to 64 nodes, 10s up to 256, 15s above)"
    _obs_record_backfill &
    _OBS[record_pid]=$!
  else
    _obs_log "metrics are off: $(tail -n 1 "$err") (training goes on)"
  fi
}

_obs_start_tensorboard() {
  [[ ${TENSORBOARD:-1} == 0 ]] && return 0
  local port log=${_OBS[job_path]}/tensorboard.log
  if ! "${_OBS[python]}" -c 'import tensorboard' 2>/dev/null; then
    _obs_log "TensorBoard is not installed for ${_OBS[python]}: skipped"
    return 0
  fi
  port=$(_obs_port_from "${TENSORBOARD_PORT:-6006}") || { _obs_log "no free port from ${TENSORBOARD_PORT:-6006}: TensorBoard skipped"; return 0; }
  nice -n "${_OBS[nice]}" setsid "${_OBS[python]}" -m tensorboard.main --logdir "$OUTPUT_PATH" --host 127.0.0.1 \
    --port "$port" </dev/null >>"$log" 2>&1 &
  _OBS[tb_pid]=$! _OBS[tb_port]=$port
  _obs_log "TensorBoard on 127.0.0.1:$port (pid ${_OBS[tb_pid]}, log $log)"
}

# Rank 0: the driver, started while the head still comes up: it imports Ray meanwhile and connects once the
# head's status file says 0 (else it exits OBS_RAY_UNREACHABLE_RC).
_obs_start_driver() {
  local start_limit=${RAY_START_TIMEOUT:-90}
  [[ $start_limit =~ ^[0-9]+$ ]] || start_limit=90
  # The wait for the head's status must outlast the head's own start limit, or a slow but good start
  # would leave training without Ray.
  "${_OBS_JOBKIT[@]}" ray-launch --address "${_OBS[ip]}:$RAY_PORT" --nodes "$NNODES" \
    --nodes-timeout "${RAY_NODES_TIMEOUT:-120}" --ready-file "${_OBS[ray_rc_file]}" \
    --connect-timeout "$((10#$start_limit + 30))" -- "$@" &
  _OBS[child_pid]=$!
}

# Rank 0: waits for the head's GCS and raylet; on success publishes its metrics port (its services are reniced
# by ray_start_head's watcher once the whole `ray start` is done: RAY_SERVICES_NICE above).
_obs_await_head() {
  proc_wait "${_OBS[ray_head_pid]}"
  if [[ $(cat "${_OBS[ray_rc_file]}" 2>/dev/null) == 0 ]]; then
    _OBS[ray]=up
    _obs_log "Ray head's GCS and raylet up in $(awk -v a="${_OBS[ray_t0]}" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s (its dashboard follows)"
    _obs_publish_ray_metrics
  else
    _OBS[ray]=failed _OBS[dash_port]=""
    ((_OBS[cancelled])) || _obs_log "[!] Ray cluster failed to start (see above): training without Ray"
  fi
}

# Every Ray process this node starts and the driver authenticate with the job's token (Ray reads both variables;
# the file's path is no secret, its content is). Training does not get them: the actor strips RAY_* from its env.
_obs_use_token() {
  export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=${_OBS[token]}
}

# Other ranks: join rank 0's head (whose token exists once its GCS answers: rank 0 makes it first).
_obs_join_head() {
  local head=${JAX_COORDINATOR_IP:?}:${RAY_PORT:?RAY_PORT is not set for a multi-node RAY=1 job}
  _OBS[ray_started]=1
  _obs_use_token
  if JOBKIT_OUTPUT_SINK=${_OBS[sink]} ray_join_cluster "${_OBS[ray_tmp]}" "${_OBS[ip]}" "$head" \
    "${_OBS[ray_metrics_port]}" "${RAY_JOIN_TRIES:-12}" "${RAY_JOIN_DELAY:-5}"; then
    _OBS[ray]=up
    ray_renice_services "${_OBS[ray_tmp]}" "${_OBS[nice]}"
    _obs_publish_ray_metrics
  else
    _OBS[ray]=failed
    _obs_log "[!] could not join the Ray head at $head: rank 0 will fall back to training without Ray"
  fi
}

# Publishes this node's Ray metrics port to Prometheus (file_sd, job "ray").
_obs_publish_ray_metrics() {
  local file=${_OBS[job_path]}/prometheus/targets/ray/${_OBS[host]}.json tmp
  # A fresh name (mktemp: O_EXCL), renamed over the target: nothing planted at a fixed temp name is followed.
  tmp=$(mktemp "$file.XXXXXX") || return 0
  printf '[{"targets": ["%s:%s"], "labels": {"host": "%s"}}]\n' "${_OBS[ip]}" "${_OBS[ray_metrics_port]}" \
    "${_OBS[host]}" >"$tmp" && mv -f "$tmp" "$file"
  _OBS[ray_sd_file]=$file
}

# Rank 0: how to reach whatever did start (Ray dashboard, TensorBoard, Prometheus) and read it afterwards.
_obs_print_access() {
  local user=${USER:-$(id -un)} login=${SLURM_SUBMIT_HOST:-} host=${_OBS[host]} forwards="" urls="" name port
  local -a names=("Ray dashboard" TensorBoard Prometheus) ports=("${_OBS[dash_port]}" "${_OBS[tb_port]}" "${_OBS[prom_port]}")
  local i
  for i in "${!names[@]}"; do
    name=${names[i]} port=${ports[i]}
    [[ -n $port ]] || continue
    forwards+="${forwards:+ }-L $port:127.0.0.1:$port" urls+="${urls:+, }$name http://localhost:$port"
  done
  [[ -n $forwards ]] || return 0
  echo "================ Observability (RAY=1) ================"
  echo "Dashboards listen on $host's loopback only. From your machine:"
  if [[ -n $login && ${login%%.*} != "$host" ]]; then
    echo "  ssh -N $forwards -J $user@$login $user@$host"
  else
    echo "  ssh -N $forwards $user@$host"
  fi
  echo "  then open $urls"
  port=${forwards#-L } port=${port%%:*}
  echo "  (several jobs at once: change the local side, e.g. -L 1$port:127.0.0.1:$port)"
  if [[ -n ${_OBS[prom_port]} ]]; then
    echo "After the job:"
    # In a container, the workspace is /outputs; the user runs these on the host, where it is JOB_WORKSPACE_HOST.
    echo "  utils/prometheus.sh list ${JOB_WORKSPACE_HOST:-$JOB_WORKSPACE}"
    echo "  utils/prometheus.sh view ${JOB_WORKSPACE_HOST:-$JOB_WORKSPACE}/$JOB_DIR"
  fi
  if [[ ${_OBS[ray]} == up ]]; then
    echo "Ray asks for the job's token (the dashboard's login page too): ${_OBS[token]}"
    echo "Ray logs: ${_OBS[job_path]}/ray_logs/<host>/   debug: RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=${_OBS[token]} ray status --address ${_OBS[ip]}:$RAY_PORT"
  fi
  echo "========================================================"
}

# Waits for the child started last (the driver or plain training), across trapped signals; its status.
_obs_wait_child() {
  local rc=0
  proc_wait "${_OBS[child_pid]}" || rc=$?
  _OBS[child_pid]=""
  return "$rc"
}

# Training without Ray, as a child so that teardown still runs.
_obs_run_plain() {
  "$@" &
  _OBS[child_pid]=$!
  _obs_wait_child
}

# Rank 0: training's status, under Ray when the driver could run it, else without; tells the other ranks.
_obs_train_rank0() {
  local rc=0 ran=0
  if [[ -n ${_OBS[child_pid]} ]]; then
    _obs_wait_child || rc=$?
    ran=1
    if ((rc == OBS_RAY_UNREACHABLE_RC && !_OBS[cancelled])); then
      [[ ${_OBS[ray]} == up ]] && _obs_log "[!] Ray could not run training on all $NNODES node(s): training without Ray"
      ran=0
    fi
  fi
  if ((!ran && !_OBS[cancelled])); then
    : >"${_OBS[shared]}/fallback"
    _obs_run_plain "$@" && rc=0 || rc=$?
  fi
  _OBS[train_end]=${EPOCHREALTIME/,/.} # a locale may write a decimal comma
  ((_OBS[cancelled])) && rc=143
  echo "$rc" >"${_OBS[shared]}/done.tmp" && mv -f "${_OBS[shared]}/done.tmp" "${_OBS[shared]}/done"
  return "$rc"
}

# Other ranks: rank 0's verdict in the shared job dir: "done" (training ran under Ray; its status) or "fallback"
# (train here without Ray).
_obs_wait_for_rank0() {
  local verdict=${_OBS[shared]}
  while :; do
    if [[ -f $verdict/done ]]; then return "$(<"$verdict/done")"; fi
    if [[ -f $verdict/fallback ]]; then
      _obs_log "rank 0 trains without Ray: training here without it too"
      _obs_run_plain "$@"
      return
    fi
    # A child sleep, so that a TERM ends the wait at once (the trap kills the child).
    sleep 1 &
    _OBS[child_pid]=$!
    wait "${_OBS[child_pid]}" 2>/dev/null
    _OBS[child_pid]=""
    ((_OBS[cancelled])) && return 143
  done
}

_obs_on_signal() {
  _OBS[cancelled]=1
  [[ -n ${_OBS[child_pid]} ]] && kill -TERM "${_OBS[child_pid]}" 2>/dev/null
  return 0
}

# ---- teardown -------------------------------------------------------------------------------------------

_obs_stop_ray() {
  [[ -n ${_OBS[ray_started]} ]] || return 0
  local logs=${_OBS[job_path]}/ray_logs/${_OBS[host]}
  mkdir -p "$logs"
  ray_save_logs "${_OBS[ray_tmp]}" "$logs" || true
  ray_stop_node "${_OBS[ray_tmp]}" || true
}

# The exporter's scrape address (the instance label of its samples), from the file_sd file it writes once it
# listens; nothing when it has not (yet).
_obs_exporter_instance() {
  local sd=${_OBS[job_path]}/prometheus/targets/${_OBS[host]}.json
  [[ -f $sd ]] && sed -n 's/.*"targets": *\["\([^"]*\)".*/\1/p' "$sd"
}

# Records what the teardown will backfill, as soon as the exporter's address is known (in the background: it
# may take a few seconds). A job killed before its teardown ends leaves the record pending, and the next reader
# of the TSDB (prometheus.sh view / list) completes it. The exporter removes its address file when it stops,
# which is why the address is taken now.
_obs_record_backfill() {
  local i instance=""
  for ((i = 0; i < 120; i++)); do
    instance=$(_obs_exporter_instance) && [[ -n $instance ]] && break
    sleep 0.5
  done
  [[ -n $instance ]] || return 0
  "${_OBS_JOBKIT[@]}" tb-bridge backfill --record --logdir "$OUTPUT_PATH" --tsdb "${_OBS[job_path]}/prometheus" \
    --job-log "$JOB_WORKSPACE/$JOB_DIR.log" \
    --label "host=${_OBS[host]}" --label job=exporters --label "instance=$instance" 2>&1 |
    sed 's/^/[observability] TensorBoard backfill: /' || true
}

# Adds every TensorBoard step to the TSDB, with the labels the exporter's scrape gives them (Prometheus stopped).
_obs_backfill_tensorboard() {
  local instance
  instance=$(_obs_exporter_instance) || return 0
  [[ -n $instance ]] || return 0
  "${_OBS_JOBKIT[@]}" tb-bridge backfill --logdir "$OUTPUT_PATH" --tsdb "${_OBS[job_path]}/prometheus" \
    --job-log "$JOB_WORKSPACE/$JOB_DIR.log" \
    --label "host=${_OBS[host]}" --label job=exporters --label "instance=$instance" 2>&1 |
    sed 's/^/[observability] TensorBoard backfill: /' || true
}

_obs_stop_prometheus() {
  [[ -n ${_OBS[prom_port]} ]] || return 0
  # Training's last seconds reach the TSDB (one more sample of every series, which a short job's rates need):
  # every target scraped once after training ended, waited for at most two intervals and 5 s. Not after a
  # cancel: the rest of the teardown needs the grace before Slurm's KILL.
  if [[ -n ${_OBS[train_end]:-} ]] && ((!_OBS[cancelled])); then
    "${_OBS_JOBKIT[@]}" tsdb await-scrape --port "${_OBS[prom_port]}" --after "${_OBS[train_end]}" \
      --timeout "$((2 * _OBS[prom_interval] + 5))" 2>&1 | sed 's/^/[observability] /'
  fi
  prometheus_stop "${_OBS[job_path]}" 2>&1 | sed 's/^/[observability] /'
  _obs_backfill_tensorboard
}

# Stops what this node started, in an order that keeps data: training (if still running), Prometheus, then
# the TensorBoard backfill (needs the exporter's address file), Ray (logs copied first), exporter, TensorBoard.
# The backfill comes before Ray, whose stop takes seconds: after a scancel, Slurm's KillWait ends the job
# soon, and whatever the teardown does not finish is left pending for the next reader of the TSDB.
_obs_teardown() {
  [[ -n ${_OBS[child_pid]} ]] && proc_stop -g 10 "${_OBS[child_pid]}"
  [[ -n ${_OBS[record_pid]} ]] && proc_stop 2 "${_OBS[record_pid]}"
  [[ -n ${_OBS[ray_sd_file]} ]] && rm -f "${_OBS[ray_sd_file]}"
  _obs_stop_prometheus
  _obs_stop_ray
  proc_stop -g 5 "${_OBS[exporter_pid]}" "${_OBS[tb_pid]}"
  rm -rf "${_OBS[state]}" "${_OBS[ray_tmp]}"
  _obs_log "stopped everything this node started"
}

# ---- the sequence -------------------------------------------------------------------------------------------

_obs_rank0() {
  _obs_ray_installed && _obs_start_head
  _obs_start_prometheus
  _obs_start_tensorboard
  if [[ ${_OBS[ray]} == starting ]]; then
    _obs_start_driver "$@"
    _obs_await_head
  fi
  _obs_print_access
  _obs_train_rank0 "$@"
}

_obs_other_rank() {
  _obs_ray_installed && _obs_join_head
  _obs_wait_for_rank0 "$@"
}

run_with_observability() {
  if ! _obs_init; then
    "$@" &
    proc_wait $!
    return
  fi
  local rc=0
  trap '_obs_on_signal' TERM INT
  _obs_start_exporter
  if ((NODE_RANK == 0)); then
    _obs_rank0 "$@" || rc=$?
  else
    _obs_other_rank "$@" || rc=$?
  fi
  trap - TERM INT
  _obs_teardown
  return "$rc"
}
