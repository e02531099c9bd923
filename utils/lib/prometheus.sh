# shellcheck shell=bash
# Summary: The per-job Prometheus: find or install it, start it on a job dir, stop it, list the TSDBs (sourced library)
#
# prometheus_find
#   Prints "<path> <version line>" of the prometheus binary (PROMETHEUS_BIN, else PATH, else /usr/bin/prometheus).
#   1 with one error line naming the fix when there is none. Never installs anything: this is what a job uses
#   (audit row O1: a job must not run apt-get as root on a compute node, or in its container, at run time).
# prometheus_install
#   The explicit setup step (`utils/prometheus.sh install`, by hand, once per machine or image): prometheus_find,
#   and without a binary, as root, installs Debian's package first (apt-get install --no-install-recommends
#   prometheus; no daemon is started). 1 with one error line when there is none and it cannot install one.
# prometheus_start JOB_DIR [--port P] [--sd-dir DIR] [--nodes N] [--scrape-interval S]
#   Runs a Prometheus for one job in the background, in its own session: TSDB, config (prometheus.yml), log
#   (prometheus.log) and PID file (prometheus.pid) all in JOB_DIR/prometheus/. Listens on 127.0.0.1 only, port P
#   (default PROMETHEUS_PORT, else 9190) or the next free one of PROMETHEUS_PORT_TRIES (10). Scrapes itself, as
#   job "exporters" every target listed in DIR/*.json|*.yml|*.yaml (file_sd; default JOB_DIR/prometheus/targets/,
#   exporters drop files there; honor_labels) and as job "ray" those in DIR/ray/ (at least 15 s apart), every S
#   (default: prometheus_scrape_interval N, the job's node count N, default 1). Each
#   scrape is in the WAL once committed, so a kill -9 loses at most the scrape in flight. Waits for /-/ready
#   (PROMETHEUS_READY_TIMEOUT s, default 30), then prints the port on stdout. 1 with one error line otherwise
#   (bad argument, a Prometheus already serving that TSDB, no free port, Prometheus's own start-up error).
# prometheus_scrape_interval NODES
#   Prints the scrape interval a job of NODES nodes gets: 5s up to 64 nodes, 10s up to 256, 15s above.
# prometheus_stop JOB_DIR
#   Stops that job's Prometheus by the PID in its PID file, after checking that the PID is a prometheus serving
#   that TSDB: TERM, PROMETHEUS_STOP_GRACE s (default 20), KILL (proc_stop). A stale PID file is removed and
#   nothing is signalled. 0 when it is gone; 1 with one error line for a bad JOB_DIR or a process that survived.
# prometheus_list [WORKSPACE]
#   One line per job dir of WORKSPACE (default JOB_WORKSPACE, else <repo>/outputs) holding a TSDB: name, size,
#   time range of the data (offline: block meta.json and WAL file times), "(running, pid N)"; a prometheus/ dir
#   it may not read as "cannot read <dir>: permission denied". Then each RAY=1 job without a TSDB:
#   "<name>  off  no TSDB: <the reason its log gives>" (`jobkit metrics-state --off`). 1 when WORKSPACE is not a
#   readable directory.
# prometheus_resolve_tsdb WHAT [WORKSPACE]
#   Prints the absolute TSDB dir for a job id prefix or job dir name in WORKSPACE, a job dir path or a prometheus/
#   dir path. 1 with one error line when nothing or several match.
# prometheus_range_text TSDB
#   Prints "YYYY-mm-dd HH:MM:SS .. YYYY-mm-dd HH:MM:SS" of the data in TSDB, or "no data yet"; a block whose
#   meta.json Prometheus would skip (`jobkit tsdb blocks`: unreadable, not JSON, no whole-number minTime/maxTime,
#   not version 1) is counted as damaged and said so.
# prometheus_serving_pid TSDB
#   Prints the PID from TSDB/prometheus.pid when that process is a prometheus serving TSDB; else 1.
#
# Errors are printed as "prometheus.sh: ..." (the command these functions serve), progress as "[Prometheus] ...",
# both on stderr. Defines functions only; sourcing it changes no variable and no shell option.

_PROM_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=utils/lib/free_port.sh
source "$_PROM_LIB_DIR/free_port.sh"
# shellcheck source=utils/lib/process.sh
source "$_PROM_LIB_DIR/process.sh"

_prom_err() { echo "prometheus.sh: $*" >&2; }
_prom_log() { echo "[Prometheus] $*" >&2; }

# Where Debian's package puts the binary (tests point it elsewhere).
_PROM_SYSTEM_BIN=${_PROM_SYSTEM_BIN:-/usr/bin/prometheus}

# Prints the prometheus binary, or returns 1.
_prom_bin() {
  local bin
  if [[ -n ${PROMETHEUS_BIN:-} ]]; then
    [[ -x $PROMETHEUS_BIN ]] && { echo "$PROMETHEUS_BIN"; return 0; }
    return 1
  fi
  bin=$(command -v prometheus 2>/dev/null) && { echo "$bin"; return 0; }
  [[ -x $_PROM_SYSTEM_BIN ]] && { echo "$_PROM_SYSTEM_BIN"; return 0; }
  return 1
}

# _prom_version BIN: prints "BIN <version line>".
_prom_version() {
  local version
  version=$("$1" --version 2>&1 | head -n 1)
  echo "$1 ${version:-(version unknown)}"
}

prometheus_find() {
  local bin
  if bin=$(_prom_bin); then _prom_version "$bin"; return 0; fi
  if [[ -n ${PROMETHEUS_BIN:-} ]]; then
    _prom_err "PROMETHEUS_BIN=$PROMETHEUS_BIN is not an executable; point it at a prometheus binary or unset it"
  else
    _prom_err "no prometheus binary (PROMETHEUS_BIN, PATH, $_PROM_SYSTEM_BIN); put one in the image or on the nodes (as root: utils/prometheus.sh install), or set PROMETHEUS_BIN"
  fi
  return 1
}

prometheus_install() {
  local bin
  if ! bin=$(_prom_bin); then
    if [[ -n ${PROMETHEUS_BIN:-} ]]; then
      prometheus_find
      return 1
    fi
    if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
      _prom_err "prometheus is not installed; install it as root with 'apt-get install -y --no-install-recommends prometheus' (Debian/Ubuntu) or put a prometheus 2.x binary on PATH"
      return 1
    fi
    _prom_log "installing Debian package prometheus (apt-get) ..."
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
  _prom_version "$bin"
}

# _prom_http_ok PORT PATH: true when GET http://127.0.0.1:PORT/PATH answers 200 (bash /dev/tcp: no curl needed).
_prom_http_ok() {
  local port=$1 path=$2
  (
    exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$path" >&3
    IFS= read -r -t 5 line <&3 || exit 1
    [[ $line == HTTP/1.?" 200"* ]]
  ) 2>/dev/null
}

# _prom_wait_ready PID PORT: 0 once PID serves /-/ready on PORT, 1 when PID died, 2 after the timeout.
_prom_wait_ready() {
  local pid=$1 port=$2 timeout=${PROMETHEUS_READY_TIMEOUT:-30} i
  for ((i = 0; i < timeout * 10; i++)); do
    proc_alive "$pid" || return 1
    _prom_http_ok "$port" /-/ready && return 0
    sleep 0.1
  done
  return 2
}

# _prom_pid_matches PID TSDB: true when PID is a live prometheus whose command line names TSDB (absolute path).
_prom_pid_matches() {
  local pid=$1 tsdb=$2 cmdline
  [[ $pid =~ ^[0-9]+$ ]] && proc_alive "$pid" || return 1
  cmdline=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $(head -n 1 <<<"$cmdline") == *prometheus ]] || return 1
  grep -qxF -- "--storage.tsdb.path=$tsdb" <<<"$cmdline"
}

prometheus_serving_pid() {
  local tsdb=$1 pid
  [[ -f $tsdb/prometheus.pid ]] || return 1
  pid=$(<"$tsdb/prometheus.pid")
  _prom_pid_matches "$pid" "$tsdb" || return 1
  echo "$pid"
}

# _prom_is_tsdb DIR: true when DIR looks like a Prometheus TSDB: a wal/ dir or a block dir (ULID with meta.json).
_prom_is_tsdb() {
  local dir=$1 meta
  [[ -d $dir/wal ]] && return 0
  for meta in "$dir"/*/meta.json; do
    [[ -f $meta && $(basename "$(dirname "$meta")") =~ ^[0-9A-HJKMNP-TV-Z]{26}$ ]] && return 0
  done
  return 1
}

_prom_fmt_time() { date -d "@$1" '+%Y-%m-%d %H:%M:%S'; }

# _prom_time_range TSDB: prints "MIN MAX DAMAGED": the time range of the data (epoch seconds; "- -" when there
# is none) from the blocks' meta.json and the WAL/head-chunk file times, and how many blocks are damaged. Which
# block is damaged is decided in one place for every reader, `jobkit tsdb blocks` (jobkit.observe.tsdb_blocks:
# the meta.json Prometheus would skip), so list, view and `jobkit analyze` agree.
_prom_time_range() {
  local dir=$1 min='' max='' name state t0 t1 t f damaged=0
  while read -r name state t0 t1; do
    if [[ $state != ok || ! $t0 =~ ^-?[0-9]+$ || ! $t1 =~ ^-?[0-9]+$ ]]; then
      damaged=$((damaged + 1))
      continue
    fi
    t=$((t0 / 1000))
    [[ -z $min || $t -lt $min ]] && min=$t
    t=$((t1 / 1000))
    [[ -z $max || $t -gt $max ]] && max=$t
  done < <("$(proc_jobkit)" tsdb blocks "$dir" 2>/dev/null)
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
  [[ -n $min && -n $max ]] || { min=- max=-; }
  echo "$min $max $damaged"
}

prometheus_range_text() {
  local min max damaged text
  read -r min max damaged <<<"$(_prom_time_range "$1")"
  if [[ $min == - ]]; then
    text="no data yet"
    ((damaged == 0)) || text="damaged: $damaged block meta.json cannot be read"
  else
    text="$(_prom_fmt_time "$min") .. $(_prom_fmt_time "$max")"
    ((damaged == 0)) || text+=" (and $damaged damaged block(s): their meta.json cannot be read)"
  fi
  echo "$text"
}

# Ray's metrics at least every 15 s apart: rendering them costs its agent ~5 ms per scrape, and they are
# slower-moving than the exporters' (prints the interval to use for a global INTERVAL).
_prom_ray_interval() {
  local interval=$1
  if [[ $interval =~ ^([0-9]+)s$ ]] && ((BASH_REMATCH[1] < 15)); then interval=15s; fi
  echo "$interval"
}

# _prom_job_config PORT INTERVAL SD_DIR: prints the scrape config of a job's Prometheus.
_prom_job_config() {
  local port=$1 interval=$2 sd_dir=$3 ray_interval
  ray_interval=$(_prom_ray_interval "$interval")
  cat <<EOC
# written by utils/lib/prometheus.sh (prometheus_start)
global:
  scrape_interval: $interval
  scrape_timeout: $interval
  evaluation_interval: $interval
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ['127.0.0.1:$port']
  - job_name: exporters
    honor_labels: true
    file_sd_configs:
      - files: ['$sd_dir/*.json', '$sd_dir/*.yml', '$sd_dir/*.yaml']
        refresh_interval: 30s
  - job_name: ray
    scrape_interval: $ray_interval
    scrape_timeout: $ray_interval
    file_sd_configs:
      - files: ['$sd_dir/ray/*.json', '$sd_dir/ray/*.yml', '$sd_dir/ray/*.yaml']
        refresh_interval: 30s
EOC
}

# prometheus_scrape_interval NODES: prints the exporters' scrape interval for a job of NODES nodes: 5s up to
# 64 nodes, 10s up to 256, 15s above. Measured (bench/scale/scrape.py, docs/scale.md): the job's Prometheus
# costs ~5 us of CPU and the TSDB ~3 B per sample, and a node's page is ~320 samples, so at 5s a 512-node job
# would append 33k samples/s: ~17 % of a core on the first node and ~9 GB of TSDB (plus ~0.8 GB/h of WAL) a
# day. 10s is the exporter's own cycle (EXPORTER_INTERVAL): a 5s scrape of it stores every value twice; 15s is
# Ray's interval. At 512 nodes that is 11k samples/s, ~6 % of a core and ~3 GB a day. Every family is kept:
# the rarely-moving ones (RAS, AER, link state) are what a failure's triage reads, and they compress best.
prometheus_scrape_interval() {
  local nodes=$1
  if ((nodes <= 64)); then echo 5s
  elif ((nodes <= 256)); then echo 10s
  else echo 15s
  fi
}

# _prom_launch TSDB PORT INTERVAL SD_DIR: starts the job's prometheus on the first free port from PORT, config
# TSDB/prometheus.yml, log TSDB/prometheus.log. Sets _PROM_PID and _PROM_PORT; 1 with one error line.
_prom_launch() {
  local tsdb=$1 port=$2 interval=$3 sd_dir=$4
  local bin tries=${PROMETHEUS_PORT_TRIES:-10} first=$port pid rc i mark why
  local log=$tsdb/prometheus.log config=$tsdb/prometheus.yml
  bin=$(_prom_bin) || {
    _prom_err "prometheus is not installed; run 'utils/prometheus.sh install'"
    return 1
  }
  for ((i = 0; i < tries; i++, port++)); do
    tcp_port_in_use "$port" && continue
    _prom_job_config "$port" "$interval" "$sd_dir" >"$config" || return 1
    mark=$([[ -f $log ]] && wc -l <"$log" || echo 0)
    setsid "$bin" "--config.file=$config" "--storage.tsdb.path=$tsdb" "--web.listen-address=127.0.0.1:$port" \
      "--storage.tsdb.retention.time=10y" </dev/null >>"$log" 2>&1 &
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
      proc_stop 10 "$pid" || true
      _prom_err "prometheus (pid $pid) was not ready after ${PROMETHEUS_READY_TIMEOUT:-30}s on port $port; see $log"
      return 1
    fi
    proc_wait "$pid" || true
    # died: another process may have bound the port in the meantime; else it is a real error
    if tail -n "+$((mark + 1))" "$log" | grep -q 'address already in use'; then
      continue
    fi
    why=$(tail -n "+$((mark + 1))" "$log" | grep -E 'level=(error|fatal)|err=' | tail -n 1)
    _prom_err "prometheus exited at startup: ${why:-see $log}; fix that (a TSDB from another Prometheus version must be opened with that version)"
    return 1
  done
  _prom_err "no free port in $first-$((first + tries - 1)); stop what uses them or pass another port"
  return 1
}

prometheus_start() {
  local job_dir='' port=${PROMETHEUS_PORT:-9190} sd_dir='' interval='' nodes=1
  while (($#)); do
    case $1 in
      --port) port=${2:-}; shift 2 || break ;;
      --port=*) port=${1#*=}; shift ;;
      --sd-dir) sd_dir=${2:-}; shift 2 || break ;;
      --sd-dir=*) sd_dir=${1#*=}; shift ;;
      --scrape-interval) interval=${2:-}; shift 2 || break ;;
      --scrape-interval=*) interval=${1#*=}; shift ;;
      --nodes) nodes=${2:-}; shift 2 || break ;;
      --nodes=*) nodes=${1#*=}; shift ;;
      -*) _prom_err "start: unknown option $1; see utils/lib/prometheus.sh"; return 1 ;;
      *)
        [[ -z $job_dir ]] || { _prom_err "start: one job dir only (got '$job_dir' and '$1')"; return 1; }
        job_dir=$1; shift ;;
    esac
  done
  [[ -n $job_dir ]] || { _prom_err "start: no job dir given; usage: prometheus_start <job_dir> [--port P]"; return 1; }
  [[ -d $job_dir ]] || { _prom_err "start: job dir $job_dir does not exist; create it first"; return 1; }
  [[ $port =~ ^[0-9]+$ ]] && ((port >= 1 && port <= 65535)) ||
    { _prom_err "start: port '$port' is not a TCP port; pass --port 1-65535"; return 1; }
  if [[ ! $nodes =~ ^[0-9]+$ ]] || ((10#$nodes < 1)); then
    _prom_err "start: node count '$nodes' is not a whole number >= 1; pass --nodes N (the job's node count)"
    return 1
  fi
  [[ -n $interval ]] || interval=$(prometheus_scrape_interval "$((10#$nodes))")
  [[ $interval =~ ^[0-9]+$ ]] && interval+=s
  [[ $interval =~ ^[0-9]+(ms|s|m|h)$ ]] ||
    { _prom_err "start: scrape interval '$interval' is not a duration; use e.g. --scrape-interval 5s"; return 1; }
  local tsdb old
  tsdb=$(cd "$job_dir" && pwd)/prometheus
  [[ -n $sd_dir ]] || sd_dir=$tsdb/targets
  mkdir -p "$tsdb" "$sd_dir" || { _prom_err "start: cannot create $tsdb; check permissions"; return 1; }
  sd_dir=$(cd "$sd_dir" && pwd)
  if old=$(prometheus_serving_pid "$tsdb"); then
    _prom_err "start: a Prometheus (pid $old) already serves $tsdb; stop it first (prometheus_stop $job_dir)"
    return 1
  fi
  rm -f "$tsdb/prometheus.pid"
  _prom_launch "$tsdb" "$port" "$interval" "$sd_dir" || return 1
  echo "$_PROM_PID" >"$tsdb/prometheus.pid"
  echo "$_PROM_PORT"
}

prometheus_stop() {
  local job_dir=${1:-}
  [[ -n $job_dir ]] || { _prom_err "stop: no job dir given; usage: prometheus_stop <job_dir>"; return 1; }
  [[ -d $job_dir ]] || { _prom_err "stop: job dir $job_dir does not exist; pass the dir given to start"; return 1; }
  local tsdb pidfile pid
  tsdb=$(cd "$job_dir" && pwd)/prometheus
  pidfile=$tsdb/prometheus.pid
  [[ -f $pidfile ]] || { _prom_log "no PID file in $tsdb: nothing to stop"; return 0; }
  if ! pid=$(prometheus_serving_pid "$tsdb"); then
    _prom_log "pid $(<"$pidfile") from $pidfile is not running (or not this job's prometheus): removing the PID file"
    rm -f "$pidfile"
    return 0
  fi
  if ! proc_stop "${PROMETHEUS_STOP_GRACE:-20}" "$pid"; then
    _prom_err "stop: pid $pid survived TERM and KILL; look at it with 'ps -p $pid'"
    return 1
  fi
  ((${#PROC_STOP_KILLED[@]})) &&
    _prom_log "pid $pid did not exit within ${PROMETHEUS_STOP_GRACE:-20}s of TERM: it was KILLed (the WAL keeps the data)"
  rm -f "$pidfile"
  _prom_log "Stopped (pid $pid)"
}

_prom_workspace() {
  if [[ -n ${1:-} ]]; then echo "$1"
  elif [[ -n ${JOB_WORKSPACE:-} ]]; then echo "$JOB_WORKSPACE"
  else echo "$(dirname "$(dirname "$_PROM_LIB_DIR")")/outputs"
  fi
}

# _prom_check_workspace CMD WS: 1 with one error line when WS is not a directory this user can read.
_prom_check_workspace() {
  local cmd=$1 ws=$2
  if [[ -d $ws ]]; then
    [[ -r $ws && -x $ws ]] && return 0
    _prom_err "$cmd: cannot read workspace $ws: permission denied; pass one you can read or set JOB_WORKSPACE"
  elif [[ -e $ws || -L $ws ]]; then
    _prom_err "$cmd: workspace $ws is a file, not a directory; pass the directory that holds the job dirs or set JOB_WORKSPACE"
  else
    _prom_err "$cmd: workspace $ws does not exist; pass one or set JOB_WORKSPACE"
  fi
  return 1
}

prometheus_list() {
  local ws dir name size note pid n=0
  ws=$(_prom_workspace "${1:-}")
  _prom_check_workspace list "$ws" || return 1
  for dir in "$ws"/*/prometheus; do
    name=$(basename "$(dirname "$dir")")
    if [[ -d $dir && ! (-r $dir && -x $dir) ]]; then # a TSDB or not: either way the user should hear of it
      printf '%s  ?  cannot read %s: permission denied\n' "$name" "$dir"
      n=$((n + 1))
      continue
    fi
    [[ -d $dir ]] && _prom_is_tsdb "$dir" || continue
    size=$(du -sh "$dir" 2>/dev/null | cut -f1)
    note=''
    pid=$(prometheus_serving_pid "$(cd "$dir" && pwd)") && note="  (running, pid $pid)"
    # A job stopped before its teardown finished left its TensorBoard backfill pending: complete it first,
    # so that the range below covers every step (py/jobkit/observe/tb_backfill.py, PENDING / DONE).
    if [[ -z $note && -f $dir/tb_backfill.pending.json && ! -f $dir/tb_backfill.done.json ]]; then
      "$(proc_jobkit)" tb-bridge complete --tsdb "$dir" 2>&1 | sed "s|^|[prometheus] $name: |" >&2 || true
    fi
    printf '%s  %s  %s%s\n' "$name" "${size:-?}" "$(prometheus_range_text "$dir")" "$note"
    n=$((n + 1))
  done
  ((n > 0)) || _prom_log "no job with a Prometheus TSDB in $ws"
  # RAY=1 jobs that asked for a TSDB and have none, with the reason their log gives: jobkit decides what that
  # is (core/metrics_state.py), as it does for the JOB SUMMARY, `jobkit jobs` and the monitor.
  "$(proc_jobkit)" metrics-state --off --workspace "$ws" || true
  return 0
}

prometheus_resolve_tsdb() {
  local arg=$1 ws cand
  if [[ -d $arg ]]; then
    if _prom_is_tsdb "$arg"; then (cd "$arg" && pwd); return 0; fi
    if [[ -d $arg/prometheus ]] && _prom_is_tsdb "$arg/prometheus"; then (cd "$arg/prometheus" && pwd); return 0; fi
    _prom_err "view: $arg is not a Prometheus TSDB (no wal/ and no block dirs, nor in $arg/prometheus); pass a job dir or its prometheus/ dir"
    return 1
  fi
  if [[ $arg == */* ]]; then
    if [[ -e $arg || -L $arg ]]; then
      _prom_err "view: $arg is a file, not a directory; pass a job dir, its prometheus/ dir, or a job id"
    else
      _prom_err "view: $arg does not exist; pass an existing job dir, its prometheus/ dir, or a job id"
    fi
    return 1
  fi
  ws=$(_prom_workspace "${2:-}")
  _prom_check_workspace view "$ws" || return 1
  local -a found=() closed=()
  for cand in "$ws/$arg"*/prometheus; do
    if [[ -d $cand && ! (-r $cand && -x $cand) ]]; then closed+=("$cand"); continue; fi
    [[ -d $cand ]] && _prom_is_tsdb "$cand" && found+=("$cand")
  done
  if [[ -d $ws/$arg/prometheus ]] && _prom_is_tsdb "$ws/$arg/prometheus"; then found=("$ws/$arg/prometheus"); fi
  if ((${#found[@]} == 0 && ${#closed[@]})); then
    _prom_err "view: cannot read ${closed[0]}: permission denied; ask its owner, or view it as a user who may read it"
    return 1
  fi
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
