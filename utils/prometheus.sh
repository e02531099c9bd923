#!/usr/bin/env bash
# Usage: prometheus.sh install
#        prometheus.sh start <job_dir> [--port P] [--sd-dir DIR] [--scrape-interval S]
#        prometheus.sh stop <job_dir>
#        prometheus.sh list [workspace]
#        prometheus.sh view <job|dir> [-p|--port P]
#        prometheus.sh -h|--help
# Summary: A per-job Prometheus (TSDB in <job_dir>/prometheus/) and a viewer for it after the job ended
#
#   install   finds `prometheus` (PATH, then /usr/bin/prometheus); else, as root, installs Debian's package
#             (apt-get install --no-install-recommends prometheus; no daemon is started). Prints path and version.
#   start     runs a Prometheus for one job in the background: TSDB, config, log (prometheus.log) and PID file
#             (prometheus.pid) all in <job_dir>/prometheus/. Listens on 127.0.0.1 only, port 9190 or the next
#             free one. Scrapes itself, as job "exporters" every target listed in <sd-dir>/*.json or *.yml
#             (file_sd; default <job_dir>/prometheus/targets/, exporters drop files there; changes are picked
#             up at once) and as job "ray" those in <sd-dir>/ray/ (each node's Ray metrics export port).
#             Each scrape is written to the WAL as it is committed, so even a kill -9 loses at most the scrape
#             in flight. Waits for /-/ready, then prints the port on stdout.
#   stop      stops the Prometheus of that job, by the PID in its PID file, after checking that the PID is a
#             prometheus serving that TSDB; waits for it to exit (KILL after PROMETHEUS_STOP_GRACE s).
#   list      one line per job of the workspace (default $JOB_WORKSPACE, else <repo>/outputs) that holds a
#             TSDB: job dir name, size, time range of the data. Offline: reads block meta.json and WAL times.
#   view      serves a finished job's TSDB for browsing on 127.0.0.1 (port 9190 or the next free one), in the
#             foreground until Ctrl-C. <job> is a job id prefix or job dir name in the workspace, or a path
#             to a job dir or to its prometheus/ dir. No scrape targets; 10y retention (retention counts from
#             today: a shorter one would delete older data at startup); --query.lookback-delta=1h so sparse
#             series still show. Note: Prometheus has no read-only mode. At startup it replays the WAL and
#             may compact it into blocks IN PLACE; the samples are kept, but the files change. Copy the dir
#             first if it must stay byte-identical.
#
# Environment:
#   PROMETHEUS_BIN          the binary to use (default: found by `install`'s rules)
#   PROMETHEUS_PORT         first port to try (default 9190); PROMETHEUS_PORT_TRIES ports are tried (default 10)
#   PROMETHEUS_READY_TIMEOUT seconds to wait for /-/ready (default 30)
#   PROMETHEUS_STOP_GRACE   seconds between TERM and KILL in `stop` (default 20)
#   JOB_WORKSPACE           workspace for `list` and `view <job>` (default <repo>/outputs)
#
# Sourced, this file only defines functions: prometheus_install, prometheus_start, prometheus_stop,
# prometheus_list, prometheus_view (each returns non-zero after printing a one-line error).

_PROMETHEUS_SH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=utils/lib/free_port.sh
source "$_PROMETHEUS_SH_DIR/lib/free_port.sh"

_prom_err() { echo "prometheus.sh: $*" >&2; }
_prom_log() { echo "[Prometheus] $*" >&2; }

# Prints the prometheus binary, or returns 1.
_prom_bin() {
  local bin
  if [[ -n ${PROMETHEUS_BIN:-} ]]; then
    [[ -x $PROMETHEUS_BIN ]] && { echo "$PROMETHEUS_BIN"; return 0; }
    return 1
  fi
  bin=$(command -v prometheus 2>/dev/null) && { echo "$bin"; return 0; }
  [[ -x /usr/bin/prometheus ]] && { echo /usr/bin/prometheus; return 0; }
  return 1
}

prometheus_install() {
  local bin version
  if ! bin=$(_prom_bin); then
    if [[ -n ${PROMETHEUS_BIN:-} ]]; then
      _prom_err "PROMETHEUS_BIN=$PROMETHEUS_BIN is not an executable; point it at a prometheus binary or unset it"
      return 1
    fi
    if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
      _prom_err "prometheus is not installed; install it as root with 'apt-get install -y --no-install-recommends prometheus' (Debian/Ubuntu) or put a prometheus 2.x binary on PATH"
      return 1
    fi
    echo "[Prometheus] installing Debian package prometheus (apt-get) ..." >&2
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1; then
      # a clean machine may have no package lists yet
      if ! { DEBIAN_FRONTEND=noninteractive apt-get update >/dev/null 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1; }; then
        _prom_err "apt-get install prometheus failed; run 'apt-get update && apt-get install -y --no-install-recommends prometheus' to see why"
        return 1
      fi
    fi
    if ! bin=$(_prom_bin); then
      _prom_err "apt-get installed prometheus but no binary was found; check 'dpkg -L prometheus'"
      return 1
    fi
  fi
  version=$("$bin" --version 2>&1 | head -n 1)
  echo "$bin ${version:-(version unknown)}"
}

# True when GET http://127.0.0.1:PORT/PATH answers 200 (bash /dev/tcp: no curl needed).
_prom_http_ok() {
  local port=$1 path=$2
  (
    exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$path" >&3
    IFS= read -r -t 5 line <&3 || exit 1
    [[ $line == HTTP/1.?" 200"* ]]
  ) 2>/dev/null
}

# Waits until PID serves /-/ready on PORT (0), PID died (1) or the timeout passed (2).
_prom_wait_ready() {
  local pid=$1 port=$2 timeout=${PROMETHEUS_READY_TIMEOUT:-30} i
  for ((i = 0; i < timeout * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || return 1
    _prom_http_ok "$port" /-/ready && return 0
    sleep 0.1
  done
  return 2
}

# True when PID is a live prometheus whose command line names TSDB (absolute path).
_prom_pid_matches() {
  local pid=$1 tsdb=$2 cmdline
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
  cmdline=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $(head -n 1 <<<"$cmdline") == *prometheus ]] || return 1
  grep -qxF -- "--storage.tsdb.path=$tsdb" <<<"$cmdline"
}

# True when DIR looks like a Prometheus TSDB: a wal/ dir or a block dir (ULID name with meta.json).
_prom_is_tsdb() {
  local dir=$1 meta
  [[ -d $dir/wal ]] && return 0
  for meta in "$dir"/*/meta.json; do
    [[ -f $meta && $(basename "$(dirname "$meta")") =~ ^[0-9A-HJKMNP-TV-Z]{26}$ ]] && return 0
  done
  return 1
}

_prom_fmt_time() { date -d "@$1" '+%Y-%m-%d %H:%M:%S'; }

# Prints "MIN MAX" (epoch seconds) of the data in TSDB, from block meta.json and WAL/head-chunk file times.
_prom_time_range() {
  local dir=$1 min='' max='' meta text t f
  local re_min='"minTime":[[:space:]]*([0-9]+)' re_max='"maxTime":[[:space:]]*([0-9]+)'
  for meta in "$dir"/*/meta.json; do
    [[ -f $meta ]] || continue
    text=$(<"$meta")
    if [[ $text =~ $re_min ]]; then
      t=$((BASH_REMATCH[1] / 1000))
      [[ -z $min || $t -lt $min ]] && min=$t
    fi
    if [[ $text =~ $re_max ]]; then
      t=$((BASH_REMATCH[1] / 1000))
      [[ -z $max || $t -gt $max ]] && max=$t
    fi
  done
  if [[ -d $dir/wal ]]; then
    # the WAL starts when wal/ was created (birth time; else its oldest file) and ends at its last write
    t=$(stat -c %W "$dir/wal" 2>/dev/null) || t=0
    if [[ ! $t =~ ^[1-9][0-9]*$ ]]; then
      t=$(find "$dir/wal" -type f -printf '%T@\n' 2>/dev/null | sort -n | head -n 1)
      t=${t%.*}
    fi
    [[ -n $t && (-z $min || $t -lt $min) ]] && min=$t
    for f in "$dir"/wal/* "$dir"/chunks_head/*; do
      [[ -f $f ]] || continue
      t=$(stat -c %Y "$f")
      [[ -z $max || $t -gt $max ]] && max=$t
    done
  fi
  [[ -n $min && -n $max ]] || return 1
  echo "$min $max"
}

_prom_range_text() {
  local range min max
  range=$(_prom_time_range "$1") || { echo "no data yet"; return 0; }
  read -r min max <<<"$range"
  echo "$(_prom_fmt_time "$min") .. $(_prom_fmt_time "$max")"
}

# Starts prometheus with CONFIG over TSDB on the first free port from PORT; logs to LOG.
# Extra flags follow "--". Sets _PROM_PID and _PROM_PORT. CONFIG_WRITER is called with the port first.
_prom_launch() {
  local tsdb=$1 log=$2 port=$3 config_writer=$4 config=$5
  shift 5
  [[ ${1:-} == -- ]] && shift
  local bin tries=${PROMETHEUS_PORT_TRIES:-10} first=$port pid rc i
  bin=$(_prom_bin) || {
    _prom_err "prometheus is not installed; run 'utils/prometheus.sh install'"
    return 1
  }
  for ((i = 0; i < tries; i++, port++)); do
    tcp_port_in_use "$port" && continue
    "$config_writer" "$port" >"$config" || return 1
    local -a prom_cmd=("$bin" "--config.file=$config" "--storage.tsdb.path=$tsdb"
      "--web.listen-address=127.0.0.1:$port" "--storage.tsdb.retention.time=10y" "$@")
    local mark
    mark=$( [[ -f $log ]] && wc -l <"$log" || echo 0)
    setsid "${prom_cmd[@]}" </dev/null >>"$log" 2>&1 &
    pid=$!
    rc=0
    _prom_wait_ready "$pid" "$port" || rc=$?
    if ((rc == 0)); then
      _PROM_PID=$pid _PROM_PORT=$port
      _prom_log "Started on port $port"
      ((port != first)) && _prom_log "WARNING: port $first was occupied; using $port instead"
      return 0
    fi
    if ((rc == 2)); then
      kill "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      _prom_err "prometheus (pid $pid) was not ready after ${PROMETHEUS_READY_TIMEOUT:-30}s on port $port; see $log"
      return 1
    fi
    wait "$pid" 2>/dev/null
    # died: another process may have bound the port in the meantime; else it is a real error
    if tail -n "+$((mark + 1))" "$log" | grep -q 'address already in use'; then
      continue
    fi
    local why
    why=$(tail -n "+$((mark + 1))" "$log" | grep -E 'level=(error|fatal)|err=' | tail -n 1)
    _prom_err "prometheus exited at startup: ${why:-see $log}; fix that (a TSDB from another Prometheus version must be opened with that version)"
    return 1
  done
  _prom_err "no free port in $first-$((first + tries - 1)); stop what uses them or pass another port"
  return 1
}

# Ray's metrics at least every 15 s apart: rendering them costs its agent ~5 ms per scrape, and they are
# slower-moving than the exporters' (prints the interval to use for a global INTERVAL).
_prom_ray_interval() {
  local interval=$1
  if [[ $interval =~ ^([0-9]+)s$ ]] && ((BASH_REMATCH[1] < 15)); then interval=15s; fi
  echo "$interval"
}

# Config writers for _prom_launch (they read the caller's locals via dynamic scope).
_prom_job_config() {
  local port=$1
  cat <<EOF
# written by utils/prometheus.sh start
global:
  scrape_interval: $_prom_interval
  scrape_timeout: $_prom_interval
  evaluation_interval: $_prom_interval
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ['127.0.0.1:$port']
  - job_name: exporters
    honor_labels: true
    file_sd_configs:
      - files: ['$_prom_sd_dir/*.json', '$_prom_sd_dir/*.yml', '$_prom_sd_dir/*.yaml']
        refresh_interval: 30s
  - job_name: ray
    scrape_interval: $(_prom_ray_interval "$_prom_interval")
    scrape_timeout: $(_prom_ray_interval "$_prom_interval")
    file_sd_configs:
      - files: ['$_prom_sd_dir/ray/*.json', '$_prom_sd_dir/ray/*.yml', '$_prom_sd_dir/ray/*.yaml']
        refresh_interval: 30s
EOF
}

_prom_view_config() {
  cat <<'EOF'
# written by utils/prometheus.sh view: no scrape targets
global:
  scrape_interval: 999h
  evaluation_interval: 999h
scrape_configs: []
EOF
}

prometheus_start() {
  local job_dir='' port=${PROMETHEUS_PORT:-9190} _prom_sd_dir='' _prom_interval=5s
  while (($#)); do
    case $1 in
      --port) port=${2:-}; shift 2 || break ;;
      --port=*) port=${1#*=}; shift ;;
      --sd-dir) _prom_sd_dir=${2:-}; shift 2 || break ;;
      --sd-dir=*) _prom_sd_dir=${1#*=}; shift ;;
      --scrape-interval) _prom_interval=${2:-}; shift 2 || break ;;
      --scrape-interval=*) _prom_interval=${1#*=}; shift ;;
      -*) _prom_err "start: unknown option $1; see --help"; return 1 ;;
      *)
        [[ -z $job_dir ]] || { _prom_err "start: one job dir only (got '$job_dir' and '$1'); see --help"; return 1; }
        job_dir=$1; shift ;;
    esac
  done
  [[ -n $job_dir ]] || { _prom_err "start: no job dir given; usage: prometheus.sh start <job_dir> [--port P]"; return 1; }
  [[ -d $job_dir ]] || { _prom_err "start: job dir $job_dir does not exist; create it first"; return 1; }
  [[ $port =~ ^[0-9]+$ ]] && ((port >= 1 && port <= 65535)) ||
    { _prom_err "start: port '$port' is not a TCP port; pass --port 1-65535"; return 1; }
  [[ $_prom_interval =~ ^[0-9]+$ ]] && _prom_interval+=s
  [[ $_prom_interval =~ ^[0-9]+(ms|s|m|h)$ ]] ||
    { _prom_err "start: scrape interval '$_prom_interval' is not a duration; use e.g. --scrape-interval 5s"; return 1; }
  local tsdb
  tsdb=$(cd "$job_dir" && pwd)/prometheus
  [[ -n $_prom_sd_dir ]] || _prom_sd_dir=$tsdb/targets
  mkdir -p "$tsdb" "$_prom_sd_dir" || { _prom_err "start: cannot create $tsdb; check permissions"; return 1; }
  _prom_sd_dir=$(cd "$_prom_sd_dir" && pwd)
  local pidfile=$tsdb/prometheus.pid old
  if [[ -f $pidfile ]]; then
    old=$(<"$pidfile")
    if _prom_pid_matches "$old" "$tsdb"; then
      _prom_err "start: a Prometheus (pid $old) already serves $tsdb; run 'prometheus.sh stop $job_dir' first"
      return 1
    fi
    rm -f "$pidfile"
  fi
  _prom_launch "$tsdb" "$tsdb/prometheus.log" "$port" _prom_job_config "$tsdb/prometheus.yml" -- || return 1
  echo "$_PROM_PID" >"$pidfile"
  echo "$_PROM_PORT"
}

prometheus_stop() {
  local job_dir=${1:-}
  [[ -n $job_dir ]] || { _prom_err "stop: no job dir given; usage: prometheus.sh stop <job_dir>"; return 1; }
  [[ -d $job_dir ]] || { _prom_err "stop: job dir $job_dir does not exist; pass the dir given to start"; return 1; }
  local tsdb pidfile pid grace=${PROMETHEUS_STOP_GRACE:-20} i
  tsdb=$(cd "$job_dir" && pwd)/prometheus
  pidfile=$tsdb/prometheus.pid
  [[ -f $pidfile ]] || { _prom_log "no PID file in $tsdb: nothing to stop"; return 0; }
  pid=$(<"$pidfile")
  if ! _prom_pid_matches "$pid" "$tsdb"; then
    _prom_log "pid ${pid:-?} from $pidfile is not running (or not this job's prometheus): removing the PID file"
    rm -f "$pidfile"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < grace * 10; i++)); do
    _prom_pid_matches "$pid" "$tsdb" || break
    sleep 0.1
  done
  if _prom_pid_matches "$pid" "$tsdb"; then
    _prom_log "pid $pid did not exit within ${grace}s of TERM: sending KILL (the WAL keeps the data)"
    kill -KILL "$pid" 2>/dev/null
    for ((i = 0; i < 50; i++)); do
      _prom_pid_matches "$pid" "$tsdb" || break
      sleep 0.1
    done
  fi
  rm -f "$pidfile"
  _prom_log "Stopped (pid $pid)"
}

_prom_workspace() {
  if [[ -n ${1:-} ]]; then echo "$1"
  elif [[ -n ${JOB_WORKSPACE:-} ]]; then echo "$JOB_WORKSPACE"
  else echo "$(dirname "$_PROMETHEUS_SH_DIR")/outputs"
  fi
}

prometheus_list() {
  local ws dir name size note pid n=0
  ws=$(_prom_workspace "${1:-}")
  [[ -d $ws ]] || { _prom_err "list: workspace $ws does not exist; pass one or set JOB_WORKSPACE"; return 1; }
  for dir in "$ws"/*/prometheus; do
    [[ -d $dir ]] && _prom_is_tsdb "$dir" || continue
    name=$(basename "$(dirname "$dir")")
    size=$(du -sh "$dir" 2>/dev/null | cut -f1)
    note=''
    pid=$(cat "$dir/prometheus.pid" 2>/dev/null) &&
      _prom_pid_matches "$pid" "$(cd "$dir" && pwd)" && note="  (running, pid $pid)"
    printf '%s  %s  %s%s\n' "$name" "${size:-?}" "$(_prom_range_text "$dir")" "$note"
    n=$((n + 1))
  done
  ((n > 0)) || _prom_log "no job with a Prometheus TSDB in $ws"
  return 0
}

# Prints the TSDB dir for a job id prefix, job dir name, job dir path or prometheus dir path.
_prom_resolve() {
  local arg=$1 ws cand
  if [[ -d $arg ]]; then
    if _prom_is_tsdb "$arg"; then (cd "$arg" && pwd); return 0; fi
    if [[ -d $arg/prometheus ]] && _prom_is_tsdb "$arg/prometheus"; then (cd "$arg/prometheus" && pwd); return 0; fi
    _prom_err "view: $arg is not a Prometheus TSDB (no wal/ and no block dirs, nor in $arg/prometheus); pass a job dir or its prometheus/ dir"
    return 1
  fi
  if [[ $arg == */* ]]; then
    _prom_err "view: $arg does not exist; pass an existing job dir, its prometheus/ dir, or a job id"
    return 1
  fi
  ws=$(_prom_workspace)
  local -a found=()
  for cand in "$ws/$arg"*/prometheus; do
    [[ -d $cand ]] && _prom_is_tsdb "$cand" && found+=("$cand")
  done
  if [[ -d $ws/$arg/prometheus ]] && _prom_is_tsdb "$ws/$arg/prometheus"; then found=("$ws/$arg/prometheus"); fi
  case ${#found[@]} in
    0) _prom_err "view: no job matching '$arg' with a Prometheus TSDB in $ws; see 'prometheus.sh list'"; return 1 ;;
    1) (cd "${found[0]}" && pwd) ;;
    *)
      local names=() f
      for f in "${found[@]}"; do names+=("$(basename "$(dirname "$f")")"); done
      _prom_err "view: '$arg' matches ${#found[@]} jobs (${names[*]}); give more of the job id"
      return 1 ;;
  esac
}

prometheus_view() {
  local target='' port=${PROMETHEUS_PORT:-9190}
  while (($#)); do
    case $1 in
      -p | --port) port=${2:-}; shift 2 || break ;;
      --port=*) port=${1#*=}; shift ;;
      -*) _prom_err "view: unknown option $1; see --help"; return 1 ;;
      *)
        [[ -z $target ]] || { _prom_err "view: one job only (got '$target' and '$1'); see --help"; return 1; }
        target=$1; shift ;;
    esac
  done
  [[ -n $target ]] || { _prom_err "view: no job given; usage: prometheus.sh view <job|dir> [-p port]"; return 1; }
  [[ $port =~ ^[0-9]+$ ]] && ((port >= 1 && port <= 65535)) ||
    { _prom_err "view: port '$port' is not a TCP port; pass -p 1-65535"; return 1; }
  local tsdb
  tsdb=$(_prom_resolve "$target") || return 1
  if [[ -f $tsdb/prometheus.pid ]] && _prom_pid_matches "$(<"$tsdb/prometheus.pid")" "$tsdb"; then
    _prom_err "view: the job's own Prometheus (pid $(<"$tsdb/prometheus.pid")) still serves $tsdb; browse that one, or run 'prometheus.sh stop <job_dir>' first"
    return 1
  fi
  local tmp range
  range=$(_prom_range_text "$tsdb") # before startup: replaying the WAL touches its files
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/prometheus-view.XXXXXX") || { _prom_err "view: cannot create a temp dir; check TMPDIR"; return 1; }
  _prom_launch "$tsdb" "$tmp/prometheus.log" "$port" _prom_view_config "$tmp/view.yml" -- \
    --query.lookback-delta=1h || { rm -rf "$tmp"; return 1; }
  local pid=$_PROM_PID host user problem
  # data it could not read (e.g. blocks of another Prometheus version) is skipped with an error line
  problem=$(grep -m 1 -E 'level=(error|fatal)' "$tmp/prometheus.log" 2>/dev/null) &&
    _prom_log "WARNING: prometheus reports a problem with this TSDB (some data may be missing): ${problem#*msg=}"
  port=$_PROM_PORT
  host=$(hostname -f 2>/dev/null || hostname)
  user=${USER:-$(id -un)}
  cat <<EOF
Prometheus for $tsdb
  URL:        http://127.0.0.1:$port
  data:       $range  (set the graph's end time inside this range)
  from your laptop:  ssh -L $port:127.0.0.1:$port $user@$host   then open http://localhost:$port
  log:        $tmp/prometheus.log
Ctrl-C stops it.
EOF
  # Ctrl-C / TERM: stop our child by PID, then return normally (also when this file is sourced)
  local stopping=0 rc=0
  # shellcheck disable=SC2064  # expand pid now
  trap "stopping=1; kill -TERM $pid 2>/dev/null" INT TERM
  while :; do
    rc=0
    wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || break # else wait was interrupted by the trap: wait again
  done
  trap - INT TERM
  rm -rf "$tmp"
  if ((stopping)); then
    _prom_log "Stopped (pid $pid)"
    return 0
  fi
  _prom_err "view: prometheus (pid $pid) exited with status $rc; rerun to see its log"
  return 1
}

_prom_usage() { sed -n '2,/^$/{s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

prometheus_main() {
  local cmd=${1:-}
  (($#)) && shift
  case $cmd in
    install) prometheus_install "$@" ;;
    start) prometheus_start "$@" ;;
    stop) prometheus_stop "$@" ;;
    list) prometheus_list "$@" ;;
    view) prometheus_view "$@" ;;
    -h | --help | help) _prom_usage ;;
    '') _prom_err "no command given; run 'prometheus.sh --help'"; return 1 ;;
    *) _prom_err "unknown command '$cmd'; run 'prometheus.sh --help'"; return 1 ;;
  esac
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -euo pipefail
  [[ -n ${_DEBUG:-} ]] && set -x
  prometheus_main "$@"
fi
