#!/usr/bin/env bash
# Usage: prometheus.sh install
#        prometheus.sh list [workspace]
#        prometheus.sh view <job|dir> [-p|--port P]
#        prometheus.sh -h|--help
# Summary: Find or install Prometheus, list the jobs' TSDBs, browse one after its job ended
#
#   install   finds `prometheus` (PROMETHEUS_BIN, PATH, then /usr/bin/prometheus); else, as root, installs
#             Debian's package (apt-get install --no-install-recommends prometheus; no daemon is started).
#             Prints path and version. A setup step, run by hand on each node (or baked into the image): a
#             RAY=1 job only looks for the binary, and without one trains with metrics off and says so.
#   list      one line per job of the workspace (default $JOB_WORKSPACE, else <repo>/outputs) that holds a
#             TSDB: job dir name, size, time range of the data. Offline: reads block meta.json and WAL times.
#             A prometheus/ dir it may not read is listed as "cannot read", a block whose meta.json is not
#             readable JSON as "damaged". Then every RAY=1 job without a TSDB, as "<job dir>  off  no TSDB:
#             <why>" with the reason its log gives (e.g. no prometheus binary on the node).
#             A job stopped before its teardown finished (scancel, time limit, kill -9) left its TensorBoard
#             backfill pending: list and view complete it first, and say so.
#   view      serves a finished job's TSDB for browsing on 127.0.0.1 (port 9190 or the next free one), in the
#             foreground until Ctrl-C. <job> is a job id prefix or job dir name in the workspace, or a path
#             to a job dir or to its prometheus/ dir. No scrape targets; 10y retention (retention counts from
#             today: a shorter one would delete older data at startup); --query.lookback-delta=1h so sparse
#             series still show. A damaged WAL is refused before anything starts (Prometheus would truncate
#             it); a start that fails leaves the TSDB as it was. Note: Prometheus has no read-only mode: at
#             startup it replays the WAL and may compact it into blocks IN PLACE; the samples are kept, but the
#             files change. Copy the dir first if it must stay byte-identical. (Runs `jobkit tsdb view`.)
#
# Environment:
#   PROMETHEUS_BIN          the binary to use (default: found by `install`'s rules)
#   PROMETHEUS_PORT         first port to try (default 9190); PROMETHEUS_PORT_TRIES ports are tried (default 10)
#   PROMETHEUS_READY_TIMEOUT seconds to wait for /-/ready (default 30)
#   JOB_WORKSPACE           workspace for `list` and `view <job>` (default <repo>/outputs)
#
# The job's own Prometheus (start/stop during a job) is in utils/lib/prometheus.sh; this file is only the command.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

_PROMETHEUS_SH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=utils/lib/prometheus.sh
source "$_PROMETHEUS_SH_DIR/lib/prometheus.sh"

# prometheus_view <job|dir> [-p P]: resolves the TSDB here, then `jobkit tsdb view` serves it in the foreground.
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
  local tsdb pid range
  tsdb=$(prometheus_resolve_tsdb "$target") || return 1
  if pid=$(prometheus_serving_pid "$tsdb"); then
    if ! _prom_job_ended "$tsdb"; then
      _prom_err "view: the job's own Prometheus (pid $pid) still serves $tsdb; browse that one, or stop it first"
      return 1
    fi
    # The job's summary is written, so its teardown was cut short (Slurm's KillWait) before it stopped its
    # Prometheus: an orphan of an ended job, which nothing else will stop.
    _prom_log "the job has ended but its Prometheus (pid $pid) outlived it: stopping it"
    prometheus_stop "$(dirname "$tsdb")" || return 1
  fi
  range=$(prometheus_range_text "$tsdb") # before startup: replaying the WAL touches its files
  # The viewer replaces this shell: a TERM to the script's PID reaches it, and it stops its Prometheus by PID
  # (a foreground child would be orphaned by a TERM to bash).
  exec "$(proc_jobkit "$(dirname "$_PROMETHEUS_SH_DIR")")" tsdb view "$tsdb" --port "$port" --data-range "$range"
}

# _prom_job_ended TSDB: true when the job whose <job dir>/prometheus TSDB is has written its JOB SUMMARY.
_prom_job_ended() {
  local job_dir
  job_dir=$(dirname "$1")
  grep -qs '^==== JOB SUMMARY ====$' "$job_dir.log" "$job_dir/log"
}

_prom_usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

prometheus_main() {
  local cmd=${1:-}
  (($#)) && shift
  case $cmd in
    install) prometheus_install "$@" ;;
    list) prometheus_list "$@" ;;
    view) prometheus_view "$@" ;;
    -h | --help | help) _prom_usage ;;
    '') _prom_err "no command given; run 'prometheus.sh --help'"; return 1 ;;
    *) _prom_err "unknown command '$cmd'; run 'prometheus.sh --help'"; return 1 ;;
  esac
}

prometheus_main "$@"
