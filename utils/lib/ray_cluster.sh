# shellcheck shell=bash
# Usage: source utils/lib/ray_cluster.sh
# Summary: Start, join, stop and save the logs of ONE Ray node, identified by its own --temp-dir (sourced library)
#
# ray_start_head TEMP_DIR NODE_IP GCS_PORT DASHBOARD_PORT METRICS_PORT
#     Starts a Ray head: GCS on NODE_IP:GCS_PORT (the cluster-private address), dashboard on
#     127.0.0.1:DASHBOARD_PORT, Prometheus metrics on METRICS_PORT, sessions and logs under TEMP_DIR. Returns 0
#     as soon as the GCS listens, the raylet's socket exists and the dashboard agent wrote the port file the
#     raylet waits for before it registers (bounded by RAY_START_TIMEOUT): a driver can
#     connect then. `ray start` goes on in the background until the dashboard is up too; if it fails after
#     that (the dashboard did not start, or RAY_START_TIMEOUT ran out), one line on stderr says so and the GCS
#     and raylet stay up (the dashboard is for people, training does not need it). Its status lands in
#     TEMP_DIR/ray_start.rc once it ends; then, with RAY_SERVICES_NICE set, ray_renice_services runs on the
#     node. A start that fails before the GCS and raylet are up fails as a whole. NODE_IP 127.0.0.1 makes a
#     single-node cluster (Ray otherwise swaps loopback for the first routable address).
# ray_join_cluster TEMP_DIR NODE_IP HEAD_ADDR METRICS_PORT [TRIES] [DELAY]
#     Starts a Ray worker node that joins the head at HEAD_ADDR (IP:PORT); TRIES attempts (default 12),
#     DELAY seconds apart (default 5). Each failed attempt is cleaned up before the next. While nothing
#     answers at HEAD_ADDR (the head still starting), it knocks every 0.25 s within those DELAY seconds, so
#     that a worker joins as soon as the head's GCS is up rather than up to DELAY s later.
# ray_stop_node TEMP_DIR [GRACE]
#     Stops every process of the Ray node that runs under TEMP_DIR: TERM (all but the GCS server and the
#     autoscaler monitor, which ignore it), KILL for what is left once the others are gone or after GRACE
#     seconds (default RAY_STOP_GRACE or 5). Typically takes ~0.3 s. Never touches another Ray node on the
#     machine (no `ray stop`, which stops them all and takes ~6.5 s).
# ray_save_logs TEMP_DIR DEST_DIR
#     Copies the node's session logs (TEMP_DIR/session_latest/logs/*) and the output of `ray start`
#     (ray_start.log) into DEST_DIR (created if needed).
# ray_node_pids TEMP_DIR
#     Prints the PIDs of the node's processes, one per line (what ray_stop_node stops).
# ray_make_token FILE
#     Writes a new random token (64 hex digits) to FILE, mode 0600, its directory created 0700 when missing;
#     refuses a FILE that exists, or a directory that is not ours or that others may write. Every node of the
#     cluster is then started with RAY_AUTH_TOKEN_PATH=FILE (below).
# ray_renice_services TEMP_DIR INCREMENT
#     Lowers the priority of the node's service processes (GCS, dashboard and its workers, dashboard and
#     runtime-env agents, client server, autoscaler monitor) by INCREMENT. Not the raylet (workers inherit its
#     niceness) nor workers and what they started: training keeps its priority.
#
# Each returns non-zero after one line on stderr naming the problem and the fix; a failed start or join leaves
# no process behind. Which processes belong to a node: those whose command line names TEMP_DIR (gcs_server,
# raylet, dashboard, autoscaler monitor), every process of their session (`ray start` runs under
# setsid, so the whole node shares one session; that catches the Ray client server, which names no directory)
# and every descendant of those (workers, agents, and what actors started, e.g. training).
#
# py-spy: `ray start` runs with utils/shims first on PATH, so the dashboard's "Stack Trace" and
# "CPU Flame Graph" buttons on an actor reach the training process the actor started (see the shim).
#
# Environment:
#   RAY_BIN            the ray CLI (default: `ray` on PATH)
#   RAY_AUTH_TOKEN_PATH  the cluster's token file (ray_make_token): when set, every node starts with Ray's token
#                      authentication on (RAY_AUTH_MODE=token), so that GCS, raylets, workers, the dashboard
#                      and its agents refuse any client without the token. The file must be ours and 0600 (or
#                      stricter): a token others can read protects nothing. Drivers need the same two variables.
#   RAY_START_TIMEOUT  seconds one `ray start` may take until its services listen (default 90)
#   RAY_SERVICES_NICE  ray_start_head: the INCREMENT for ray_renice_services once the head's `ray start` ended
#                      (unset: no renice); a dashboard started after the raylet starts at it already
#   RAY_DASHBOARD_ORDER  when the head starts its dashboard: last (default; once the raylet and its agents are
#                      up), first (Ray's order) or beside (right after the raylet); see py/jobkit/observe/ray_start.py
#   RAY_PRESTART_WORKERS  Python workers each raylet starts with itself, ready for the actor (default 1; see
#                      py/jobkit/observe/ray_start.py)
#   RAY_STOP_GRACE     default GRACE of ray_stop_node (default 5)
#   RAY_START_ARGS     extra words appended to every `ray start` (e.g. "--num-gpus=0")
#   RAY_REPORTER_INTERVAL_MS  how often the node's ray_node_* metrics are refreshed (default 10000)
#   RAY_DASHBOARD_SELF_METRICS_INTERVAL_S  how often the dashboard records its own CPU/memory (default 60)
# No log monitor: it polls every worker log 10 times a second to forward lines to drivers, and the launcher
# does not need it (training's output has its own path; Ray's logs stay in the session dir).

_RAY_CLUSTER_SH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_RAY_CLUSTER_JOBKIT=$(cd "$_RAY_CLUSTER_SH_DIR/../../py/bin" && pwd)/jobkit  # the package, run from this checkout
# shellcheck source=utils/lib/free_port.sh disable=SC1091 # followed with shellcheck -x
source "$_RAY_CLUSTER_SH_DIR/free_port.sh"
# shellcheck source=utils/lib/process.sh disable=SC1091
source "$_RAY_CLUSTER_SH_DIR/process.sh"
# shellcheck source=utils/lib/settings.sh disable=SC1091
source "$_RAY_CLUSTER_SH_DIR/settings.sh"
# shellcheck source=utils/lib/workspace.sh disable=SC1091
source "$_RAY_CLUSTER_SH_DIR/workspace.sh"

_ray_err() { echo "ray_cluster: $*" >&2; }

# What Ray puts after TEMP_DIR in its longest unix socket path (Ray 2.60):
# "/session_YYYY-mm-dd_HH-MM-SS_ffffff_<pid>/sockets/dash_MetricsHead", the pid as long as pid_max allows.
_ray_socket_suffix_len() {
  local pid_max=4194304
  read -r pid_max 2>/dev/null </proc/sys/kernel/pid_max
  echo $((1 + 35 + ${#pid_max} + 9 + 16))
}

# Prints the ray CLI, or fails with a one-line error.
_ray_cli() {
  local bin=${RAY_BIN:-}
  if [[ -n $bin ]]; then
    [[ -x $bin ]] && { echo "$bin"; return 0; }
    _ray_err "RAY_BIN=$bin is not executable; point it at the ray CLI (e.g. .venv/bin/ray) or unset it"
    return 1
  fi
  bin=$(command -v ray 2>/dev/null) && { echo "$bin"; return 0; }
  _ray_err "the ray CLI is not on PATH; pip install 'ray[default]' in the training environment or set RAY_BIN"
  return 1
}

# Prints, NUL-terminated, the words that run `ray start` for the ray CLI at $1. For Ray's own Python console
# script (a "#!" interpreter line and Ray's entry point): `jobkit ray-start` under that interpreter, the same Ray
# minus the CLI groups `ray start` never uses (0.7 s instead of 2 s of imports on every node's start; see
# py/jobkit/observe/ray_start.py). The package runs from this checkout (py/bin/jobkit), so that interpreter needs no
# jobkit installed. Any other `ray` (a wrapper, a binary): `$1 start` as it is.
_ray_start_cmd() {
  local cli=$1 shebang=""
  IFS= read -r shebang <"$cli" 2>/dev/null || true
  if [[ $shebang == '#!/'* ]] && grep -q 'from ray.scripts.scripts import main' "$cli" 2>/dev/null; then
    local -a interp
    read -r -a interp <<<"${shebang#\#!}"
    printf '%s\0' "${interp[@]}" "$_RAY_CLUSTER_JOBKIT" ray-start
  else
    printf '%s\0' "$cli" start
  fi
}

# Checks TEMP_DIR: absolute, and short enough for Ray's unix sockets (107 bytes).
_ray_check_temp_dir() {
  local dir=$1
  if [[ $dir != /* || $dir == */ || $dir == *[[:space:]]* ]]; then
    _ray_err "TEMP_DIR '$dir' must be an absolute path without spaces or trailing slash; use e.g. /tmp/mxray-<job>-<rank>"
    return 1
  fi
  local max=$((107 - $(_ray_socket_suffix_len)))
  if ((${#dir} > max)); then
    _ray_err "TEMP_DIR '$dir' is too long for Ray's unix sockets (at most $max characters); use a shorter path such as /tmp/mxray-<job>-<rank>"
    return 1
  fi
}

_ray_check_port() {
  [[ $2 =~ ^[0-9]+$ ]] && ((10#$2 >= 1 && 10#$2 <= 65535)) && return 0
  _ray_err "$1 '$2' is not a TCP port number (1-65535); pass a free port, e.g. from pick_free_port"
  return 1
}

# True when some TCP socket of this machine listens on PORT (any address, IPv4 or IPv6).
_ray_listening() { tcp_port_in_use "$1" --listening; }

# Fails with a one-line error when one of the "NAME=PORT" pairs is already listened on.
_ray_ports_free() {
  local pair
  for pair in "$@"; do
    if _ray_listening "${pair#*=}"; then
      _ray_err "port ${pair#*=} ($pair) is already in use on this machine; pick another one (pick_free_port from utils/lib/free_port.sh)"
      return 1
    fi
  done
}

# True when a TCP connection to HOST PORT opens within 3 s.
_ray_tcp_open() {
  # shellcheck disable=SC2016 # expanded by the inner bash
  timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# True as soon as a TCP connection to HOST PORT opens, knocking every 0.25 s; false once SECONDS passed.
_ray_knock_within() {
  local host=$1 port=$2 until
  until=$(awk -v now="$EPOCHREALTIME" -v s="$3" 'BEGIN { printf "%d", (now + s) * 1000 }')
  while :; do
    sleep 0.25
    _ray_tcp_open "$host" "$port" && return 0
    (($(_ray_now_ms) >= until)) && return 1
  done
}

_ray_now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo "${t:0:-3}"; }

_ray_is_loopback() { [[ $1 == 127.* || $1 == localhost || $1 == ::1 ]]; }

# Prints the real py-spy (not the shim), or nothing.
_ray_real_pyspy() {
  local cli=$1 dir candidate
  candidate=$(dirname "$cli")/py-spy
  [[ -x $candidate ]] && { echo "$candidate"; return 0; }
  local IFS=:
  for dir in $PATH; do
    [[ -n $dir && $dir != "$_RAY_CLUSTER_SH_DIR/../shims" && -x $dir/py-spy ]] && { echo "$dir/py-spy"; return 0; }
  done
  return 0
}

# Runs `ray start ARGS...` for TEMP_DIR in a session of its own, its output in TEMP_DIR/ray_start.log, with the
# py-spy shim first on PATH. Waits for it (at most RAY_START_TIMEOUT s).
_ray_run_start() {
  local dir=$1 node_ip=$2 cli real_pyspy
  shift 2
  cli=$(_ray_cli) || return 1
  real_pyspy=$(_ray_real_pyspy "$cli")
  mkdir -p "$dir" || { _ray_err "cannot create TEMP_DIR $dir; choose a writable place such as /tmp"; return 1; }
  local -a auth=()
  if [[ -n ${RAY_AUTH_TOKEN_PATH:-} ]]; then
    _ray_check_token "$RAY_AUTH_TOKEN_PATH" || return 1
    auth=(RAY_AUTH_MODE=token "RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH")
  fi
  local -a env_args=(
    "PATH=$_RAY_CLUSTER_SH_DIR/../shims:$PATH"
    "JOBKIT_PYSPY_SHIM_DIR=$_RAY_CLUSTER_SH_DIR/../shims"
    "JOBKIT_PYSPY_REAL=$real_pyspy"
    RAY_USAGE_STATS_ENABLED=0
    # Ray 2.60 refuses the dashboard's stack trace / flame graph unless this is on; the dashboard listens on
    # 127.0.0.1 only. RAY_DASHBOARD_ENABLE_PROFILING=0 in the caller's environment keeps it off.
    "RAY_DASHBOARD_ENABLE_PROFILING=${RAY_DASHBOARD_ENABLE_PROFILING:-1}"
    # Ray starts its workers at nice 15 by default, and training, started by an actor, would inherit that:
    # every other process on the node then preempts it (-20% throughput on the tiny CPU model).
    RAY_worker_niceness=0
    # The dashboard agent's resource report (the ray_node_* metrics) every 10 s, not 5: it walks every
    # process of the node each time, 2% of a core on a small machine; the exporter's cycle is 10 s too.
    "REPORTER_UPDATE_INTERVAL_MS=${RAY_REPORTER_INTERVAL_MS:-10000}"
    # The dashboard measures its own CPU and memory (smaps_rollup of each of its processes) every 5 s by
    # default: 1-2% of a core for ray_component_* metrics nobody needs every 5 s.
    "METRICS_RECORD_INTERVAL_S=${RAY_DASHBOARD_SELF_METRICS_INTERVAL_S:-60}"
    # Housekeeping ticks of raylet, GCS and workers, tuned for schedulers juggling many short tasks; one
    # long-running actor per node needs none of them 10 times a second. Each stays overridable.
    "RAY_raylet_report_resources_period_milliseconds=${RAY_raylet_report_resources_period_milliseconds:-1000}"
    "RAY_raylet_check_gc_period_milliseconds=${RAY_raylet_check_gc_period_milliseconds:-10000}"
    "RAY_task_events_report_interval_ms=${RAY_task_events_report_interval_ms:-5000}"
    "${auth[@]}"
  )
  # Without this, Ray replaces a loopback --node-ip-address by the first routable address.
  _ray_is_loopback "$node_ip" && env_args+=(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0)
  local -a extra=()
  # shellcheck disable=SC2206 # RAY_START_ARGS is a list of words by design
  [[ -n ${RAY_START_ARGS:-} ]] && extra=($RAY_START_ARGS)
  # setsid: the node gets a session of its own, which ray_stop_node uses to find every process of it.
  local -a ray_cmd
  mapfile -d '' -t ray_cmd < <(_ray_start_cmd "$cli")
  timeout -k 5 "${RAY_START_TIMEOUT:-90}" setsid -w env "${env_args[@]}" "${ray_cmd[@]}" \
    --temp-dir="$dir" --node-ip-address="$node_ip" --disable-usage-stats --include-log-monitor=false \
    "$@" "${extra[@]}" \
    </dev/null >"$dir/ray_start.log" 2>&1
}

# Fails with a one-line error unless FILE is a regular file of ours, not a symlink, that nobody else may read
# or write (what Ray reads as the cluster's token).
_ray_check_token() {
  local file=$1 owner mode
  if [[ -L $file || ! -f $file ]] || ! read -r owner mode < <(stat -c '%u %a' -- "$file" 2>/dev/null); then
    _ray_err "RAY_AUTH_TOKEN_PATH=$file is not a regular file; create it with ray_make_token or unset RAY_AUTH_TOKEN_PATH"
    return 1
  fi
  if [[ $owner != "$EUID" ]] || ((8#$mode & 077)); then
    _ray_err "RAY_AUTH_TOKEN_PATH=$file has owner uid $owner and mode $mode: it must be yours and 0600 (chmod 600 it, or make a new one with ray_make_token)"
    return 1
  fi
}

ray_make_token() {
  local file=${1:-} dir why tmp
  if [[ -z $file || $file != /* ]]; then
    _ray_err "ray_make_token needs an absolute FILE path (got '${file}')"
    return 2
  fi
  dir=$(dirname -- "$file")
  if ! why=$(workspace_private_dir "$dir"); then
    _ray_err "$why: not a private directory of yours; use a directory only you can write for the Ray token"
    return 1
  fi
  if [[ -e $file || -L $file ]]; then
    _ray_err "$file already exists; a cluster's token is made once: remove it or pick another path"
    return 1
  fi
  # Written under another name first and renamed (atomic, and no other process ever reads half a token);
  # mktemp makes the file 0600 and refuses to follow a planted link.
  tmp=$(mktemp "$dir/.token.XXXXXX") || { _ray_err "cannot write in $dir"; return 1; }
  if ! od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$tmp" || [[ $(wc -c <"$tmp") != 64 ]]; then
    rm -f -- "$tmp"
    _ray_err "could not read 32 random bytes from /dev/urandom for the Ray token"
    return 1
  fi
  mv -T -- "$tmp" "$file"
}

# Prints the most telling line of a failed `ray start`'s output.
_ray_start_reason() {
  local log=$1 line
  line=$(grep -E 'Error|error:|Exception|failed|Failed' "$log" 2>/dev/null | grep -v '^ *File ' | tail -n 1)
  [[ -n $line ]] || line=$(grep -v '^[[:space:]]*$' "$log" 2>/dev/null | tail -n 1)
  line=${line//$'\r'/}
  ((${#line} > 300)) && line="${line:0:300}..."
  echo "${line:-no output}"
}

# Waits until every port in $2.. listens and the raylet socket exists, or the deadline (epoch s, $1) passes.
_ray_wait_listening() {
  local deadline=$1 dir=$2 port ok
  shift 2
  while :; do
    ok=1
    compgen -G "$dir/session_latest/sockets/raylet*" >/dev/null || ok=0
    for port in "$@"; do _ray_listening "$port" || { ok=0; break; }; done
    ((ok)) && return 0
    ((EPOCHSECONDS >= deadline)) && return 1
    sleep 0.1
  done
}

ray_start_head() {
  if (($# != 5)); then
    _ray_err "ray_start_head needs TEMP_DIR NODE_IP GCS_PORT DASHBOARD_PORT METRICS_PORT (got $# arguments)"
    return 2
  fi
  local dir=$1 node_ip=$2 gcs_port=$3 dash_port=$4 metrics_port=$5 agent_port client_port rc=0
  _ray_check_temp_dir "$dir" || return 2
  _ray_check_port GCS_PORT "$gcs_port" && _ray_check_port DASHBOARD_PORT "$dash_port" &&
    _ray_check_port METRICS_PORT "$metrics_port" || return 2
  if [[ -n $(ray_node_pids "$dir") ]]; then
    _ray_err "a Ray node already runs under $dir; stop it first (ray_stop_node $dir) or use another TEMP_DIR"
    return 1
  fi
  # Ray's fixed defaults (dashboard agent 52365, client server 10001) would collide with any other Ray node
  # on the machine: take free ones.
  agent_port=$(pick_free_port "$gcs_port" "$dash_port" "$metrics_port") &&
    client_port=$(pick_free_port "$gcs_port" "$dash_port" "$metrics_port" "$agent_port") || return 1
  _ray_ports_free "GCS_PORT=$gcs_port" "DASHBOARD_PORT=$dash_port" "METRICS_PORT=$metrics_port" || return 1

  local start_limit deadline nice=${RAY_SERVICES_NICE:-}
  start_limit=$(setting_uint RAY_START_TIMEOUT 90) || return 2
  if [[ -n $nice && ! $nice =~ ^[0-9]+$ ]]; then
    _ray_err "RAY_SERVICES_NICE='$nice' must be a number >= 0 (the renice increment of Ray's services)"
    return 2
  fi
  case ${RAY_DASHBOARD_ORDER:-last} in
    first | beside | last) ;;
    *)
      _ray_err "RAY_DASHBOARD_ORDER='$RAY_DASHBOARD_ORDER' must be first, beside or last (when the head starts its dashboard)"
      return 2
      ;;
  esac
  deadline=$((EPOCHSECONDS + start_limit))
  # A socket left by an earlier node under TEMP_DIR must not pass for this one's raylet.
  rm -rf "$dir/session_latest" "$dir/ray_start.rc" "$dir/ray_start.err" "$dir/.ray_start_returned" \
    "$dir/.ray_start_reported"
  # --no-monitor: the autoscaler's monitor has nothing to do for a fixed set of Slurm nodes. In the background:
  # the caller goes on once the GCS and raylet are up, not after the dashboard too (seconds later).
  _ray_head_watch "$dir" "$node_ip" "$gcs_port" "$nice" --head --port="$gcs_port" --num-cpus=0 --no-monitor \
    --include-dashboard=true --dashboard-host=127.0.0.1 --dashboard-port="$dash_port" \
    --metrics-export-port="$metrics_port" --dashboard-agent-listen-port="$agent_port" \
    --ray-client-server-port="$client_port" >/dev/null &
  rc=0
  _ray_wait_head_up "$deadline" "$dir" "$gcs_port" || rc=$?
  if ((rc == 0)); then
    # From here on a failure of `ray start` is the watcher's to report (or ours, when it ended just now).
    : >"$dir/.ray_start_returned"
    [[ -f $dir/ray_start.rc ]] && _ray_head_report_late "$dir" "$node_ip" "$gcs_port" "$(<"$dir/ray_start.rc")"
    return 0
  fi
  local reason status="" own=""
  [[ -f $dir/ray_start.rc ]] && status=$(<"$dir/ray_start.rc")
  own=$(grep -m 1 '^ray_cluster: ' "$dir/ray_start.err" 2>/dev/null)
  if [[ -n $own && ! -s $dir/ray_start.log ]]; then
    # Refused before `ray start` ran (no ray CLI, a bad token): that line says it all.
    ray_stop_node "$dir" 0 >/dev/null 2>&1
    echo "$own" >&2
    return 1
  elif ((rc == 2)); then
    reason="its GCS and raylet were not up within ${RAY_START_TIMEOUT:-90} s (see $dir/session_latest/logs/, or raise RAY_START_TIMEOUT)"
  elif [[ $status == 124 || $status == 137 ]]; then
    reason="ray start took longer than ${RAY_START_TIMEOUT:-90} s"
  else
    reason=$(_ray_start_reason "$dir/ray_start.log")
  fi
  ray_stop_node "$dir" 0 >/dev/null 2>&1
  _ray_err "Ray head on $node_ip:$gcs_port did not start: $reason (full output: $dir/ray_start.log)"
  return 1
}

# Runs the head's `ray start ARGS...` (after DIR NODE_IP GCS_PORT NICE), then writes its status to
# DIR/ray_start.rc; once it ended, renices the node's services by NICE (when set), and reports a failure that
# came after ray_start_head returned (see the header).
_ray_head_watch() {
  local dir=$1 node_ip=$2 gcs_port=$3 nice=$4 rc=0
  shift 4
  # `jobkit ray-start` starts a dashboard that nothing waits for (the one started after the raylet,
  # RAY_DASHBOARD_ORDER=beside or last) at this niceness from its spawn (this function runs in a background subshell).
  [[ -n $nice ]] && export JOBKIT_RAY_SPAWN_NICE=$nice
  # Its own errors (no ray CLI, a bad token) go to a file that ray_start_head repeats; so does the shell's
  # "Terminated" when ray_stop_node stops `ray start`, which is no news for the caller's log.
  _ray_run_start "$dir" "$node_ip" "$@" 2>"$dir/ray_start.err" || rc=$?
  # (TEMP_DIR may be gone already: the caller's teardown removes it after ray_stop_node.)
  { echo "$rc" >"$dir/ray_start.rc.tmp" && mv -f "$dir/ray_start.rc.tmp" "$dir/ray_start.rc"; } 2>/dev/null
  [[ -n $nice ]] && ray_renice_services "$dir" "$nice"
  [[ -f $dir/.ray_start_returned ]] && _ray_head_report_late "$dir" "$node_ip" "$gcs_port" "$rc"
  return 0
}

# Says, once, that the head's `ray start` failed with STATUS after its GCS and raylet were up. 129-159 but 137
# (a signal from outside: ray_stop_node stopping the node) is no failure; 124/137 are RAY_START_TIMEOUT.
_ray_head_report_late() {
  local dir=$1 node_ip=$2 gcs_port=$3 status=$4 reason
  [[ $status == 0 ]] && return 0
  ((status > 128 && status < 160 && status != 137)) && return 0
  mkdir "$dir/.ray_start_reported" 2>/dev/null || return 0
  if [[ $status == 124 || $status == 137 ]]; then
    reason="it took longer than ${RAY_START_TIMEOUT:-90} s"
  else
    reason=$(_ray_start_reason "$dir/ray_start.log")
  fi
  _ray_err "[!] Ray head on $node_ip:$gcs_port: \`ray start\` failed after its GCS and raylet came up ($reason); training goes on, the Ray dashboard may be missing (full output: $dir/ray_start.log)"
}

# Waits until the head's GCS listens on GCS_PORT, its raylet socket exists and its dashboard agent wrote its
# port file (or `ray start` ended with 0): 0. 1 when its `ray start`
# ended with a non-zero status first, 2 when the deadline (epoch s) passes first.
_ray_wait_head_up() {
  local deadline=$1 dir=$2 port=$3 status
  while :; do
    if [[ -f $dir/ray_start.rc ]]; then
      status=$(<"$dir/ray_start.rc")
      [[ $status == 0 ]] || return 1
    fi
    # The dashboard agent's port file too: the raylet waits for it before it registers (and aborts when it
    # does not come within 15 s, seen at a load of 10 on 2 cores); a `ray start` that ended with 0 is up anyway.
    if compgen -G "$dir/session_latest/sockets/raylet*" >/dev/null && _ray_listening "$port" &&
      { [[ ${status:-} == 0 ]] || compgen -G "$dir/session_latest/metrics_agent_port_*" >/dev/null; }; then
      return 0
    fi
    ((EPOCHSECONDS >= deadline)) && return 2
    sleep 0.1
  done
}

ray_join_cluster() {
  if (($# < 4 || $# > 6)); then
    _ray_err "ray_join_cluster needs TEMP_DIR NODE_IP HEAD_ADDR METRICS_PORT [TRIES] [DELAY] (got $# arguments)"
    return 2
  fi
  local dir=$1 node_ip=$2 head=$3 metrics_port=$4 tries=${5:-12} delay=${6:-5}
  _ray_check_temp_dir "$dir" || return 2
  _ray_check_port METRICS_PORT "$metrics_port" || return 2
  if [[ ! $head =~ ^[^:]+:[0-9]+$ ]]; then
    _ray_err "HEAD_ADDR '$head' is not IP:PORT; pass the head's cluster address and GCS port, e.g. 10.0.0.1:6379"
    return 2
  fi
  if [[ ! $tries =~ ^[1-9][0-9]*$ || ! $delay =~ ^[0-9]+([.][0-9]+)?$ ]]; then
    _ray_err "TRIES '$tries' must be a positive number and DELAY '$delay' a number of seconds"
    return 2
  fi
  if [[ -n $(ray_node_pids "$dir") ]]; then
    _ray_err "a Ray node already runs under $dir; stop it first (ray_stop_node $dir) or use another TEMP_DIR"
    return 1
  fi
  local i rc reason="" agent_port client_port deadline start_limit knocked=0
  start_limit=$(setting_uint RAY_START_TIMEOUT 90) || return 2
  for ((i = 1; i <= tries; i++)); do
    # `ray start --address` at a head that does not answer retries for minutes: knock first (unless the wait
    # before this attempt just got an answer).
    if ((!knocked)) && ! _ray_tcp_open "${head%:*}" "${head##*:}"; then
      reason="nothing answers at $head yet"
    elif _ray_ports_free "METRICS_PORT=$metrics_port" 2>/dev/null; then
      rc=0
      agent_port=$(pick_free_port "$metrics_port") && client_port=$(pick_free_port "$metrics_port" "$agent_port") || return 1
      deadline=$((EPOCHSECONDS + start_limit))
      _ray_run_start "$dir" "$node_ip" --address="$head" --num-cpus=0 --metrics-export-port="$metrics_port" \
        --dashboard-agent-listen-port="$agent_port" --ray-client-server-port="$client_port" || rc=$?
      if ((rc == 0)) && _ray_wait_listening "$deadline" "$dir"; then
        return 0
      fi
      if ((rc == 124 || rc == 137)); then
        reason="ray start took longer than ${RAY_START_TIMEOUT:-90} s"
      elif ((rc != 0)); then
        reason=$(_ray_start_reason "$dir/ray_start.log")
      else
        reason="the raylet did not come up"
      fi
      ray_stop_node "$dir" 0 >/dev/null 2>&1
    else
      reason="port $metrics_port (METRICS_PORT) is already in use on this machine"
    fi
    knocked=0
    if ((i < tries)); then
      echo "ray_cluster: joining $head failed (attempt $i/$tries: $reason); retrying in $delay s at most" >&2
      if [[ $reason == "nothing answers"* ]]; then
        # The head is still starting: go as soon as its GCS answers, not up to DELAY s later.
        _ray_knock_within "${head%:*}" "${head##*:}" "$delay" && knocked=1
      else
        sleep "$delay"
      fi
    fi
  done
  local more=""
  [[ -s $dir/ray_start.log ]] && more=" (last ray start output: $dir/ray_start.log)"
  _ray_err "could not join the Ray head at $head after $tries attempts: $reason; check that the head runs and $node_ip can reach it$more"
  return 1
}

# True when the NUL-separated command line in file $1 has an option whose value is directory $2 or a path
# under it (--temp-dir=DIR, --log_dir=DIR/..., --session-dir=DIR/...): how Ray's own processes name it. A
# shell or `tail` that merely mentions the path does not count.
_ray_cmdline_names() {
  local arg dir=$2
  while IFS= read -r -d '' arg; do
    case $arg in
      --*="$dir" | --*="$dir"/*) return 0 ;;
    esac
  done 2>/dev/null <"$1"
  return 1
}

ray_node_pids() {
  local dir=${1:?ray_node_pids needs TEMP_DIR}
  dir=${dir%/}
  local self_sid pid ppid sid f row
  local -A seed=() sessions=() children=() chosen=() mine=()
  local -a table=()
  mapfile -t table < <(proc_table)
  for row in "${table[@]}"; do
    read -r pid _ ppid _ sid _ <<<"$row"
    children[$ppid]+=" $pid"
  done
  # This shell and its ancestors are never part of the node, whatever their command lines say.
  pid=$BASHPID
  while [[ -n $pid && $pid != 0 && -z ${mine[$pid]:-} ]]; do
    mine[$pid]=1
    proc_stat "$pid" || break
    pid=$PROC_PPID
  done
  mine[$$]=1
  proc_stat "$BASHPID"
  self_sid=$PROC_SID
  for f in /proc/[0-9]*/cmdline; do
    pid=${f#/proc/} pid=${pid%/cmdline}
    [[ -z ${mine[$pid]:-} ]] && _ray_cmdline_names "$f" "$dir" && seed[$pid]=1
  done
  local -a queue=("${!seed[@]}")
  for row in "${table[@]}"; do
    read -r pid _ ppid _ sid _ <<<"$row"
    # The session of a seed is the node's own when its leader is gone (the setsid'd `ray start` exited) or is
    # a seed itself; never the caller's, nor one led by, e.g., a login shell.
    if [[ -n ${seed[$pid]:-} && $sid != "$self_sid" && $sid != 0 && -z ${mine[$sid]:-} ]] &&
      [[ ! -e /proc/$sid || -n ${seed[$sid]:-} ]]; then
      sessions[$sid]=1
    fi
  done
  for row in "${table[@]}"; do
    read -r pid _ ppid _ sid _ <<<"$row"
    [[ -n ${sessions[$sid]:-} ]] && queue+=("$pid")
  done
  while ((${#queue[@]})); do
    pid=${queue[0]}
    queue=("${queue[@]:1}")
    [[ -n ${chosen[$pid]:-} || -n ${mine[$pid]:-} ]] && continue
    chosen[$pid]=1
    # shellcheck disable=SC2206 # a space-separated list of PIDs
    [[ -n ${children[$pid]:-} ]] && queue+=(${children[$pid]})
  done
  ((${#chosen[@]})) && printf '%s\n' "${!chosen[@]}" | sort -n
  return 0
}

# True when every PID given is Ray's GCS server or autoscaler monitor (processes that outlive TERM).
_ray_only_term_ignorers() {
  local pid exe cmd
  for pid in "$@"; do
    exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
    [[ ${exe##*/} == gcs_server ]] && continue
    cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")
    [[ $cmd == *"/ray/autoscaler/_private/monitor.py"* ]] && continue
    return 1
  done
  return 0
}

ray_stop_node() {
  local dir=${1:-} grace=${2:-${RAY_STOP_GRACE:-5}}
  if [[ -z $dir ]]; then
    _ray_err "ray_stop_node needs TEMP_DIR (the --temp-dir of the node to stop)"
    return 2
  fi
  if [[ ! $grace =~ ^[0-9]+([.][0-9]+)?$ ]]; then
    _ray_err "GRACE '$grace' is not a number of seconds; use e.g. 5"
    return 2
  fi
  # proc_stop counts whole seconds: a fraction rounds up.
  [[ $grace == *.* ]] && grace=$((10#${grace%%.*} + 1))
  local -a pids=() first=() left=()
  local pid round
  mapfile -t pids < <(ray_node_pids "$dir")
  ((${#pids[@]})) || return 0
  # TERM all but the GCS server and the autoscaler monitor: the raylet unregisters from the GCS on TERM and
  # hangs for seconds when the GCS is already gone, while those two ignore TERM (measured, Ray 2.60). With the
  # GCS still up, everything else is gone within ~0.1 s; then the two are KILLed (they hold nothing to save).
  for pid in "${pids[@]}"; do _ray_only_term_ignorers "$pid" || first+=("$pid"); done
  ((${#first[@]})) && proc_stop "$grace" "${first[@]}"
  # Then what is left, and anything of the node that appeared meanwhile; twice, for late forks.
  for round in 1 2 3; do
    mapfile -t left < <({
      for pid in "${pids[@]}"; do proc_alive "$pid" && echo "$pid"; done
      ray_node_pids "$dir"
    } | sort -un)
    ((${#left[@]})) || return 0
    ((round < 3)) && proc_stop 0 "${left[@]}"
  done
  _ray_err "processes of the Ray node in $dir survived KILL: ${left[*]}; check them with ps -fp ${left[0]}"
  return 1
}

ray_save_logs() {
  local dir=${1:-} dest=${2:-} logs
  if [[ -z $dir || -z $dest ]]; then
    _ray_err "ray_save_logs needs TEMP_DIR DEST_DIR"
    return 2
  fi
  logs=$dir/session_latest/logs
  if [[ ! -d $logs && ! -f $dir/ray_start.log ]]; then
    _ray_err "no Ray session logs in $logs; was a Ray node started with --temp-dir $dir?"
    return 1
  fi
  mkdir -p "$dest" || { _ray_err "cannot create $dest; check that it is writable"; return 1; }
  # A start that failed early has only the output of `ray start`.
  local ok=1
  if [[ -f $dir/ray_start.log ]]; then cp "$dir/ray_start.log" "$dest"/ 2>/dev/null || ok=0; fi
  if [[ -d $logs ]]; then cp -R "$logs"/. "$dest"/ 2>/dev/null || ok=0; fi
  if ((!ok)); then
    _ray_err "copying the Ray logs of $dir to $dest failed (disk full or not writable?); they stay in $dir until it is removed"
    return 1
  fi
}

# The program a command line runs: argv[0], or for a python the script or `-m` module.
_ray_program() {
  [[ ${1##*/} == python* ]] || { echo "$1"; return; }
  shift
  while (($#)); do
    case $1 in
      -m) echo "${2:-}"; return ;;
      -*) shift ;;
      *) echo "$1"; return ;;
    esac
  done
}

# Lowers the priority of the node's own services; see the header. Matched on the program (argv[0], or the
# script or module a python runs), never on the whole command line: the raylet's names the agents' scripts.
ray_renice_services() {
  local dir=${1:?ray_renice_services needs TEMP_DIR} increment=${2:?ray_renice_services needs INCREMENT} pid program
  local -a services=() argv=()
  [[ $increment =~ ^[0-9]+$ ]] || { _ray_err "INCREMENT must be a number >= 0, got '$increment'"; return 1; }
  ((increment)) || return 0
  while read -r pid; do
    mapfile -d '' argv 2>/dev/null <"/proc/$pid/cmdline" || continue
    ((${#argv[@]})) || continue
    program=$(_ray_program "${argv[@]}")
    case $program in
      */gcs_server | */dashboard/dashboard.py | ray-dashboard-* | ray::DashboardAgent* | ray::RuntimeEnvAgent* | \
        */dashboard/agent.py | */runtime_env/agent/main.py | ray.util.client.server | */autoscaler/_private/monitor.py)
        services+=("$pid") ;;
    esac
  done < <(ray_node_pids "$dir")
  ((${#services[@]})) || return 0
  renice -n "$increment" -p "${services[@]}" >/dev/null 2>&1 || true
}
