# shellcheck shell=bash
# Summary: RAY=1 on one node: metrics exporter, Ray head or worker, Prometheus, TensorBoard, training under Ray (sourced library)
#
# run_with_observability CMD...
#     Runs the training command CMD (an argv; the same on every node) with the observability stack around it and
#     returns training's exit status. Every node starts a metrics exporter. Rank 0 starts the Ray head on the
#     cluster-private address, Prometheus (TSDB in <job_dir>/prometheus/) and TensorBoard, prints the SSH tunnel
#     commands, then runs CMD on every node through py/jobkit/ray_launch.py (one actor per node, training in its
#     own process). Other ranks join the Ray cluster and wait for rank 0's verdict. If Ray cannot start (or a
#     node cannot join) the job says why and trains without Ray: every node runs CMD itself. On return,
#     whatever this function started is stopped by PID (Ray by its own temp dir), Ray's logs are copied to
#     <job_dir>/ray_logs/<host>/ and, on rank 0, every TensorBoard step is backfilled into the TSDB.
#
# Reads the tier contract (JOB_WORKSPACE JOB_DIR JOB_ID NODE_RANK NNODES OUTPUT_PATH JAX_COORDINATOR_IP) and:
#   RAY_PORT            Ray GCS port on rank 0 (picked when unset; multi-node jobs get it from _job.sbatch)
#   RAY_DASHBOARD_PORT  first port tried for the Ray dashboard on 127.0.0.1 (default 8265)
#   RAY_METRICS_PORT    first port tried for Ray's metrics export on every node (default 55080)
#   TENSORBOARD_PORT    first port tried for TensorBoard on 127.0.0.1 (default 6006); TENSORBOARD=0 skips it
#   PROMETHEUS_PORT     first port tried for Prometheus on 127.0.0.1 (default 9190)
#   EXPORTER_PORT       first port tried for the metrics exporter (default 9500), EXPORTER_INTERVAL (default 10 s)
#   RAY_JOIN_TRIES / RAY_JOIN_DELAY   a worker's attempts to join the head (default 12, 5 s apart)
#   RAY_NODES_TIMEOUT   seconds rank 0 waits for all nodes to join (default 120)
#   OBS_PYTHON          interpreter for the tools (default: python3 on PATH)
#   OBS_NICE            niceness of the exporter (and its plugins), Prometheus, TensorBoard and Ray's services
#                       (default 10), so that training wins the CPU when a node is busy. Ray's raylet and
#                       workers keep 0: training runs under them.
#
# State shared with the teardown lives in variables named _OBS_*; nothing else is global.

_OBS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=utils/lib/cluster_ip.sh
source "$_OBS_DIR/cluster_ip.sh"
# shellcheck source=utils/lib/free_port.sh
source "$_OBS_DIR/free_port.sh"
# shellcheck source=utils/lib/ray_cluster.sh
source "$_OBS_DIR/ray_cluster.sh"
# shellcheck source=utils/prometheus.sh
source "$_OBS_DIR/../prometheus.sh"
# shellcheck source=utils/lib/process_stop.sh
source "$_OBS_DIR/process_stop.sh"

# Exit status of py/jobkit/ray_launch.py when no training process was started (cluster unreachable, not every
# node joined): safe to train without Ray, nothing ran twice.
OBS_RAY_UNREACHABLE_RC=75

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

# Waits for PID, even across trapped signals; returns its exit status.
_obs_wait() {
  local pid=$1 rc
  while :; do
    rc=0
    wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || return "$rc"
  done
}

# Stops PID (and its process group when it leads one): TERM, then KILL after GRACE seconds.
_obs_stop_pid() {
  local pid=$1 grace=${2:-5} i target
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
  target=$pid
  [[ $(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ') == "$pid" ]] && target=-$pid
  kill -TERM -- "$target" 2>/dev/null
  for ((i = 0; i < grace * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL -- "$target" 2>/dev/null
  wait "$pid" 2>/dev/null
  return 0
}

_obs_start_exporter() {
  local log=$_OBS_JOB_PATH/metrics_exporter/$_OBS_HOST.log
  mkdir -p "$_OBS_JOB_PATH/metrics_exporter" "$_OBS_JOB_PATH/prometheus/targets/ray"
  # Its own process group, so that teardown stops the watchdog, engine and plugins together.
  nice -n "$_OBS_NICE" setsid "$_OBS_DIR/../metrics_exporter.sh" --watchdog --address "$_OBS_IP" --port "${EXPORTER_PORT:-9500}" \
    --interval "${EXPORTER_INTERVAL:-10}" --sd-dir "$_OBS_JOB_PATH/prometheus/targets" </dev/null >>"$log" 2>&1 &
  _OBS_EXPORTER_PID=$!
  _obs_log "metrics exporter started (pid $_OBS_EXPORTER_PID, log $log)"
}

# Publishes this node's Ray metrics port to Prometheus (file_sd, job "ray").
_obs_publish_ray_metrics() {
  local file=$_OBS_JOB_PATH/prometheus/targets/ray/$_OBS_HOST.json
  printf '[{"targets": ["%s:%s"], "labels": {"host": "%s"}}]\n' "$_OBS_IP" "$_OBS_RAY_METRICS_PORT" "$_OBS_HOST" \
    >"$file.tmp" && mv -f "$file.tmp" "$file"
  _OBS_RAY_SD_FILE=$file
}

_obs_start_prometheus() {
  local port
  if ! prometheus_install >/dev/null 2>"$_OBS_STATE/prometheus.err"; then
    _obs_log "metrics are off: $(tail -n 1 "$_OBS_STATE/prometheus.err") (training goes on)"
    return 0
  fi
  if port=$(PROMETHEUS_PORT=${PROMETHEUS_PORT:-9190} prometheus_start "$_OBS_JOB_PATH" 2>"$_OBS_STATE/prometheus.err"); then
    _OBS_PROM_PORT=$port
    renice -n "$_OBS_NICE" -p "$(<"$_OBS_JOB_PATH/prometheus/prometheus.pid")" >/dev/null 2>&1 || true
    _obs_log "Prometheus on 127.0.0.1:$port, TSDB $_OBS_JOB_PATH/prometheus"
  else
    _obs_log "metrics are off: $(tail -n 1 "$_OBS_STATE/prometheus.err") (training goes on)"
  fi
}

_obs_start_tensorboard() {
  [[ ${TENSORBOARD:-1} == 0 ]] && return 0
  local port log=$_OBS_JOB_PATH/tensorboard.log
  if ! "$_OBS_PYTHON" -c 'import tensorboard' 2>/dev/null; then
    _obs_log "TensorBoard is not installed for $_OBS_PYTHON: skipped"
    return 0
  fi
  port=$(_obs_port_from "${TENSORBOARD_PORT:-6006}") || { _obs_log "no free port from ${TENSORBOARD_PORT:-6006}: TensorBoard skipped"; return 0; }
  nice -n "$_OBS_NICE" setsid "$_OBS_PYTHON" -m tensorboard.main --logdir "$OUTPUT_PATH" --host 127.0.0.1 --port "$port" \
    </dev/null >>"$log" 2>&1 &
  _OBS_TB_PID=$! _OBS_TB_PORT=$port
  _obs_log "TensorBoard on 127.0.0.1:$port (pid $_OBS_TB_PID, log $log)"
}

_obs_print_tunnels() {
  local user=${USER:-$(id -un)} login=${SLURM_SUBMIT_HOST:-} forwards="" urls=""
  forwards="-L $_OBS_DASH_PORT:127.0.0.1:$_OBS_DASH_PORT" urls="Ray dashboard http://localhost:$_OBS_DASH_PORT"
  if [[ -n ${_OBS_TB_PORT:-} ]]; then
    forwards+=" -L $_OBS_TB_PORT:127.0.0.1:$_OBS_TB_PORT" urls+=", TensorBoard http://localhost:$_OBS_TB_PORT"
  fi
  if [[ -n ${_OBS_PROM_PORT:-} ]]; then
    forwards+=" -L $_OBS_PROM_PORT:127.0.0.1:$_OBS_PROM_PORT" urls+=", Prometheus http://localhost:$_OBS_PROM_PORT"
  fi
  echo "================ Observability (RAY=1) ================"
  echo "Dashboards listen on $_OBS_HOST's loopback only. From your machine:"
  if [[ -n $login && ${login%%.*} != "$_OBS_HOST" ]]; then
    echo "  ssh -N $forwards -J $user@$login $user@$_OBS_HOST"
  else
    echo "  ssh -N $forwards $user@$_OBS_HOST"
  fi
  echo "  then open $urls"
  echo "  (several jobs at once: change the local side, e.g. -L 1$_OBS_DASH_PORT:127.0.0.1:$_OBS_DASH_PORT)"
  echo "After the job:"
  echo "  utils/prometheus.sh list $JOB_WORKSPACE"
  echo "  utils/prometheus.sh view $_OBS_JOB_PATH"
  echo "Ray logs: $_OBS_JOB_PATH/ray_logs/<host>/   debug: ray status --address $_OBS_IP:$RAY_PORT"
  echo "========================================================"
}

# Rank 0: starts the Ray head in the background (it takes seconds); its status lands in $_OBS_RAY_RC_FILE.
_obs_start_head_async() {
  local rc_file=$_OBS_RAY_RC_FILE
  RAY_PORT=${RAY_PORT:-$(pick_free_port)} || { echo 1 >"$rc_file"; return 1; }
  _OBS_DASH_PORT=$(_obs_port_from "${RAY_DASHBOARD_PORT:-8265}") || _OBS_DASH_PORT=${RAY_DASHBOARD_PORT:-8265}
  (
    rc=0
    JOBKIT_OUTPUT_SINK=$_OBS_OUTPUT_SINK \
      ray_start_head "$_OBS_RAY_TMP" "$_OBS_IP" "$RAY_PORT" "$_OBS_DASH_PORT" "$_OBS_RAY_METRICS_PORT" || rc=$?
    echo "$rc" >"$rc_file.tmp" && mv -f "$rc_file.tmp" "$rc_file"
  ) &
  _OBS_RAY_HEAD_PID=$!
}

# Rank 0: the driver (py/jobkit/ray_launch.py), started while the head still comes up: it imports Ray
# meanwhile and connects once the head's status file says 0 (else it exits OBS_RAY_UNREACHABLE_RC).
_obs_start_driver() {
  local start_limit=${RAY_START_TIMEOUT:-90}
  [[ $start_limit =~ ^[0-9]+$ ]] || start_limit=90
  # The wait for the head's status must outlast the head's own start limit, or a slow but good start
  # would leave training without Ray.
  "$_OBS_PYTHON" -m jobkit.ray_launch --address "$_OBS_IP:$RAY_PORT" --nodes "$NNODES" \
    --nodes-timeout "${RAY_NODES_TIMEOUT:-120}" --ready-file "$_OBS_RAY_RC_FILE" \
    --connect-timeout "$((10#$start_limit + 30))" -- "$@" &
  _OBS_CHILD_PID=$!
}

# Returns the status of the child started last (the driver or plain training), across trapped signals.
_obs_wait_child() {
  local rc
  _obs_wait "$_OBS_CHILD_PID" && rc=0 || rc=$?
  _OBS_CHILD_PID=""
  return "$rc"
}

# Training without Ray, as a child so that teardown still runs.
_obs_run_plain() {
  local rc
  "$@" &
  _OBS_CHILD_PID=$!
  _obs_wait "$_OBS_CHILD_PID" && rc=0 || rc=$?
  _OBS_CHILD_PID=""
  return "$rc"
}

# Ranks > 0: wait for rank 0's verdict in the shared job dir: "done" (training ran under Ray; its status) or
# "fallback" (train here without Ray).
_obs_wait_for_rank0() {
  local verdict=$_OBS_RAY_SHARED
  while :; do
    if [[ -f $verdict/done ]]; then return "$(<"$verdict/done")"; fi
    if [[ -f $verdict/fallback ]]; then
      _obs_log "rank 0 trains without Ray: training here without it too"
      _obs_run_plain "$@"
      return
    fi
    sleep 1 &
    _OBS_CHILD_PID=$!
    wait "$_OBS_CHILD_PID" 2>/dev/null
    _OBS_CHILD_PID=""
    ((_OBS_CANCELLED)) && return 143
  done
}

_obs_on_signal() {
  _OBS_CANCELLED=1
  [[ -n ${_OBS_CHILD_PID:-} ]] && kill -TERM "$_OBS_CHILD_PID" 2>/dev/null
  return 0
}

_obs_backfill_tensorboard() {
  local sd=$_OBS_JOB_PATH/prometheus/targets/$_OBS_HOST.json instance
  [[ -f $sd ]] || return 0
  instance=$(sed -n 's/.*"targets": *\["\([^"]*\)".*/\1/p' "$sd")
  [[ -n $instance ]] || return 0
  "$_OBS_PYTHON" -m jobkit.tb_bridge backfill --logdir "$OUTPUT_PATH" --tsdb "$_OBS_JOB_PATH/prometheus" \
    --label "host=$_OBS_HOST" --label job=exporters --label "instance=$instance" 2>&1 |
    sed 's/^/[observability] TensorBoard backfill: /' || true
}

# Stops what this node started, in an order that keeps data: Ray (logs copied first), Prometheus, then the
# TensorBoard backfill (needs the exporter's address file), exporter, TensorBoard.
_obs_teardown() {
  [[ -n ${_OBS_CHILD_PID:-} ]] && _obs_stop_pid "$_OBS_CHILD_PID" 10
  if [[ -n ${_OBS_RAY_STARTED:-} ]]; then
    mkdir -p "$_OBS_JOB_PATH/ray_logs/$_OBS_HOST"
    ray_save_logs "$_OBS_RAY_TMP" "$_OBS_JOB_PATH/ray_logs/$_OBS_HOST" || true
    ray_stop_node "$_OBS_RAY_TMP" || true
    rm -rf "$_OBS_RAY_TMP"
  fi
  [[ -n ${_OBS_RAY_SD_FILE:-} ]] && rm -f "$_OBS_RAY_SD_FILE"
  if [[ -n ${_OBS_PROM_PORT:-} ]]; then
    prometheus_stop "$_OBS_JOB_PATH" 2>&1 | sed 's/^/[observability] /'
    _obs_backfill_tensorboard
  fi
  _obs_stop_pid "${_OBS_EXPORTER_PID:-}" 5
  _obs_stop_pid "${_OBS_TB_PID:-}" 5
  _obs_log "stopped everything this node started"
}

run_with_observability() {
  local rc=0
  _OBS_HOST=$(hostname -s 2>/dev/null || hostname) _OBS_HOST=${_OBS_HOST%%.*}
  _OBS_JOB_PATH=$JOB_WORKSPACE/$JOB_DIR
  _OBS_RAY_SHARED=$_OBS_JOB_PATH/.ray
  # Short on purpose: Ray's socket paths under it must fit in 107 bytes.
  _OBS_RAY_TMP=/tmp/mxray-$(printf '%s' "${JOB_ID:-$$}" | cksum | cut -d' ' -f1)-${NODE_RANK:-0}
  _OBS_PYTHON=${OBS_PYTHON:-$(command -v python3)}
  _OBS_NICE=${OBS_NICE:-10}
  _OBS_CANCELLED=0 _OBS_CHILD_PID="" _OBS_RAY_STARTED="" _OBS_PROM_PORT="" _OBS_TB_PORT="" _OBS_TB_PID=""
  _OBS_EXPORTER_PID="" _OBS_RAY_SD_FILE=""
  _OBS_STATE=$(mktemp -d "${TMPDIR:-/tmp}/obs.XXXXXX")
  _OBS_RAY_RC_FILE=$_OBS_STATE/ray_head.rc _OBS_RAY_HEAD_PID=""
  # Training started by this node's Ray actor writes here, this shell's own stdout (the job log, through
  # srun's per-task prefix under Slurm), instead of streaming every line through Ray to rank 0.
  # Only a pipe or a terminal: a regular file's shared offset would let the shell's writes overwrite the child's.
  _OBS_OUTPUT_SINK=""
  [[ -p /dev/stdout || -t 1 ]] && _OBS_OUTPUT_SINK=/proc/$$/fd/1
  mkdir -p "$_OBS_RAY_SHARED"

  if ! _OBS_IP=$(detect_cluster_ip 2>"$_OBS_STATE/ip.err") && ((NNODES == 1)); then
    # One node: nothing outside it needs to reach Ray or the exporter, loopback will do.
    _OBS_IP=127.0.0.1
    _obs_log "no cluster-private address on this node: Ray and the exporter bind $_OBS_IP (one node)"
  elif [[ -z $_OBS_IP ]]; then
    _obs_log "no cluster-private address ($(<"$_OBS_STATE/ip.err")): training without observability"
    rm -rf "$_OBS_STATE"
    _obs_run_plain "$@"
    return
  fi
  trap '_obs_on_signal' TERM INT
  _obs_start_exporter
  _OBS_RAY_METRICS_PORT=$(_obs_port_from "${RAY_METRICS_PORT:-55080}") || _OBS_RAY_METRICS_PORT=${RAY_METRICS_PORT:-55080}

  local use_ray=1
  if ! command -v ray >/dev/null 2>&1; then
    _obs_log "[!] ray is not installed here (pip install 'ray[default]'): training without Ray"
    use_ray=0
  fi
  if ((NODE_RANK == 0)); then
    ((use_ray)) && _obs_start_head_async
    _obs_start_prometheus
    _obs_start_tensorboard
    if ((use_ray)); then
      _OBS_RAY_STARTED=1 # from here on there may be Ray processes to stop, even of a half-started head
      _obs_start_driver "$@"
      _obs_wait "$_OBS_RAY_HEAD_PID"
      if [[ $(cat "$_OBS_RAY_RC_FILE" 2>/dev/null) == 0 ]]; then
        ray_renice_services "$_OBS_RAY_TMP" "$_OBS_NICE"
        _obs_publish_ray_metrics
        _obs_print_tunnels
      elif ((!_OBS_CANCELLED)); then
        _obs_log "[!] Ray cluster failed to start (see above): training without Ray"
      fi
      _obs_wait_child && rc=0 || rc=$?
      if ((rc == OBS_RAY_UNREACHABLE_RC)) && ((!_OBS_CANCELLED)); then
        [[ $(cat "$_OBS_RAY_RC_FILE" 2>/dev/null) == 0 ]] &&
          _obs_log "[!] Ray could not run training on all $NNODES node(s): training without Ray"
        use_ray=0
      fi
    fi
    if ((!use_ray)) && ((!_OBS_CANCELLED)); then
      : >"$_OBS_RAY_SHARED/fallback"
      _obs_run_plain "$@" && rc=0 || rc=$?
    fi
    ((_OBS_CANCELLED)) && rc=143
    echo "$rc" >"$_OBS_RAY_SHARED/done.tmp" && mv -f "$_OBS_RAY_SHARED/done.tmp" "$_OBS_RAY_SHARED/done"
  else
    if ((use_ray)); then
      if JOBKIT_OUTPUT_SINK=$_OBS_OUTPUT_SINK ray_join_cluster "$_OBS_RAY_TMP" "$_OBS_IP" "${JAX_COORDINATOR_IP:?}:${RAY_PORT:?RAY_PORT is not set for a multi-node RAY=1 job}" \
        "$_OBS_RAY_METRICS_PORT" "${RAY_JOIN_TRIES:-12}" "${RAY_JOIN_DELAY:-5}"; then
        _OBS_RAY_STARTED=1
        ray_renice_services "$_OBS_RAY_TMP" "$_OBS_NICE"
        _obs_publish_ray_metrics
      else
        _OBS_RAY_STARTED=1
        _obs_log "[!] could not join the Ray head at $JAX_COORDINATOR_IP:$RAY_PORT: rank 0 will fall back to training without Ray"
      fi
    fi
    _obs_wait_for_rank0 "$@" && rc=0 || rc=$?
  fi
  trap - TERM INT
  _obs_teardown
  rm -rf "$_OBS_STATE"
  return "$rc"
}
