#!/usr/bin/env bash
# Usage: utils/metrics_exporter.sh [--watchdog] [--address A] [--port|-p P] [--interval|-i S] [--timeout S]
#                                  [--plugins-dir D] [--sd-dir DIR]
# Summary: Serve this node's hardware metrics on http://A:P/metrics, collected every S seconds by utils/plugins/*_metrics_plugin.{sh,py}
#
# Runs the engine `jobkit exporter` (py/jobkit/observe/exporter.py, one long-lived process). Every S seconds (default 10)
# it finds the plugins anew (`D/*_metrics_plugin.sh` and `.py`, default utils/plugins) and runs them all at once, each with
# the short host name as $1 and POLL_INTERVAL and _PLUGIN_STATE (the plugin's last `# STATE <value>` line) set: a .sh
# is started every cycle, a .py is loaded once into a long-lived worker whose collect(host, state) is called. Exit 99
# retires a plugin for good; a plugin that fails or runs past --timeout (default 5 s, its process group is
# killed) has its last good output served again. Lines that are not Prometheus exposition text are dropped
# and logged. Scrapes are answered from memory; any path other than /metrics is a 404.
#
#   --address A     IP address to listen on (default: this node's cluster-private IP, from utils/lib/cluster_ip.sh)
#   --port P        first port to try (default 9500; 9400 is DCGM's); a taken port moves on to the next, logged
#   --plugins-dir D directory of the plugins (default utils/plugins); must exist
#   --sd-dir DIR    write DIR/<host>.json for Prometheus file_sd (atomically); removed on a clean stop
#   --watchdog      keep the engine running: restart it (backoff 1, 2, 4 ... 30 s) when it dies of a signal or
#                   a non-zero exit other than 2 (bad arguments); SIGTERM stops the engine (KILL after 10 s)
#                   and exits 0
# Bad arguments (an unknown flag, an address that is not one of this node's, a missing plugins dir) get
# click's usage error, whose `Error:` line names the option and the fix, and exit 2 before anything is
# served or run. `jobkit exporter --help` lists the engine's options.
#
# Log lines go to stderr, prefixed "[exporter <host>]". Added metrics: hw_scrape_duration_seconds and
# hw_plugin_up per plugin, hw_exporter_cycles_total.
#   VENV_DIR   Python environment whose `jobkit` runs the engine (default <repo>/.venv; see proc_jobkit in
#              utils/lib/process.sh)
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

_UTILS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_REPO_DIR=$(cd "$_UTILS_DIR/.." && pwd)
_HOST=$(hostname -s 2>/dev/null || hostname)
_HOST=${_HOST%%.*}

_usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
_log() { echo "[exporter $_HOST] $*" >&2; }

watchdog=0 have_address=0 args=()
for arg in "$@"; do
  case $arg in
    -h | --help) _usage; exit 0 ;;
    --watchdog) watchdog=1 ;;
    --address | --address=*) have_address=1; args+=("$arg") ;;
    *) args+=("$arg") ;;
  esac
done
# shellcheck source=utils/lib/process.sh
source "$_UTILS_DIR/lib/process.sh"
if ((!have_address)); then
  # shellcheck source=utils/lib/cluster_ip.sh
  source "$_UTILS_DIR/lib/cluster_ip.sh"
  # Without an address the engine reports it, after its own argument checks, so that an unknown flag is
  # reported as such and not as a failed detection.
  if addr=$(detect_cluster_ip 2>/dev/null); then args=(--address "$addr" "${args[@]}"); fi
fi

engine=("$(proc_jobkit "$_REPO_DIR")" exporter "${args[@]}")

((watchdog)) || exec "${engine[@]}"

engine_pid="" sleep_pid="" stopping=0
# shellcheck disable=SC2329  # invoked by the trap below
_stop() {
  stopping=1
  proc_stop 10 "$sleep_pid" "$engine_pid" || _log "watchdog: engine pid $engine_pid did not stop, even after KILL"
  return 0
}
trap _stop TERM INT HUP

backoff=1
while ((!stopping)); do
  started=$SECONDS
  "${engine[@]}" &
  engine_pid=$!
  _log "watchdog (pid $$): engine started, pid $engine_pid"
  proc_wait "$engine_pid" && rc=0 || rc=$?
  engine_pid=""
  ((stopping)) && break
  if ((rc == 0)); then _log "watchdog: engine exited 0"; exit 0; fi
  if ((rc == 2)); then _log "watchdog: engine rejected its arguments (exit 2), not restarting"; exit 2; fi
  ((SECONDS - started >= 60)) && backoff=1
  _log "watchdog: engine died (status $rc), restarting in ${backoff}s"
  sleep "$backoff" &
  sleep_pid=$!
  proc_wait "$sleep_pid" || true
  sleep_pid=""
  backoff=$((backoff * 2 > 30 ? 30 : backoff * 2))
done
_log "watchdog: stopped"
exit 0
