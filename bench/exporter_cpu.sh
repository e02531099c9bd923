#!/usr/bin/env bash
# Usage: bench/exporter_cpu.sh [CYCLES] [INTERVAL]
# Summary: CPU cost of one metrics-exporter cycle (engine + plugins), with the repo's plugins, synthetic ones, and none
#
# Runs utils/metrics_exporter.sh on 127.0.0.1 at INTERVAL seconds (default 0.25) for CYCLES cycles (default 40,
# at least 30) after two warm-up cycles, once per plugin set:
#   repo       the utils/plugins/*_metrics_plugin.sh present now (skipped when there are none)
#   synthetic  3 small bash plugins that read /proc files with builtins only
#   none       an empty plugins dir: the engine's own cost
# CPU comes from /proc/<engine pid>/stat: utime+stime of the engine, cutime+cstime of its reaped children (the
# plugins and whatever they run), in clock ticks. Cycles are counted by hw_exporter_cycles_total. Prints a table
# of milliseconds per cycle. Not part of CI.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-} in -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;; esac
CYCLES=${1:-40}
INTERVAL=${2:-0.25}
if [[ ! $CYCLES =~ ^[0-9]+$ ]] || ((CYCLES < 30)); then echo "exporter_cpu.sh: CYCLES must be a number >= 30, got '$CYCLES'" >&2; exit 2; fi
[[ $INTERVAL =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "exporter_cpu.sh: INTERVAL must be seconds, e.g. 0.25, got '$INTERVAL'" >&2; exit 2; }
command -v curl >/dev/null || { echo "exporter_cpu.sh: needs curl" >&2; exit 2; }
# shellcheck source=utils/lib/free_port.sh
source "$REPO_DIR/utils/lib/free_port.sh"
# shellcheck source=utils/lib/process.sh
source "$REPO_DIR/utils/lib/process.sh"
TICK=$(getconf CLK_TCK)

WORK=$(mktemp -d)
pid=""
_cleanup() {
  [[ -z $pid ]] || proc_stop 10 "$pid" || true
  rm -rf "$WORK"
}
trap _cleanup EXIT

mkdir -p "$WORK/none" "$WORK/synthetic"
# shellcheck disable=SC2016  # the plugin bodies are written out unexpanded
for name in load mem stat; do
  case $name in
    load) src=/proc/loadavg body='read -r a _ <"$src"; echo "syn_load1{host=\"$1\"} $a"' ;;
    mem) src=/proc/meminfo body='while read -r k v _; do [[ $k == MemFree: ]] && echo "syn_mem_free_kb{host=\"$1\"} $v"; done <"$src"' ;;
    stat) src=/proc/stat body='while read -r k v _; do [[ $k == ctxt ]] && echo "syn_ctxt_total{host=\"$1\"} $v"; done <"$src"' ;;
  esac
  printf '#!/bin/bash\nsrc=%s\n%s\n' "$src" "$body" >"$WORK/synthetic/${name}_metrics_plugin.sh"
  chmod +x "$WORK/synthetic/${name}_metrics_plugin.sh"
done

# Prints "<own ticks> <children ticks>" of a process.
_ticks() {
  local stat rest
  stat=$(<"/proc/$1/stat")
  read -r -a rest <<<"${stat##*) }"
  echo "$((rest[11] + rest[12])) $((rest[13] + rest[14]))"
}

_cycles() {
  curl -s --noproxy '*' --max-time 2 "http://127.0.0.1:$1/metrics" 2>/dev/null |
    sed -n 's/^hw_exporter_cycles_total{[^}]*} \([0-9]*\)\(\.0\)\{0,1\}$/\1/p'  # prometheus_client writes 12.0
}

_wait_cycles() { # PORT MIN
  local c deadline=$((SECONDS + 120))
  while ((SECONDS < deadline)); do
    c=$(_cycles "$1")
    if [[ -n $c ]] && ((c >= $2)); then echo "$c"; return 0; fi
    sleep 0.05
  done
  echo "exporter_cpu.sh: the exporter did not reach cycle $2 (log: $WORK/log)" >&2
  return 1
}

_measure() { # LABEL DIR
  local port=0 c0 c1 own0 kids0 own1 kids1 n
  port=$(FREE_PORT_RANGE=20000-29999 pick_free_port "$port")
  "$REPO_DIR/utils/metrics_exporter.sh" --address 127.0.0.1 --port "$port" --interval "$INTERVAL" \
    --plugins-dir "$2" 2>>"$WORK/log" &
  pid=$!
  c0=$(_wait_cycles "$port" 2)
  read -r own0 kids0 < <(_ticks "$pid")
  sleep "$(awk -v n="$CYCLES" -v i="$INTERVAL" 'BEGIN { print n * i }')"
  c1=$(_wait_cycles "$port" $((c0 + CYCLES)))
  read -r own1 kids1 < <(_ticks "$pid")
  proc_stop 10 "$pid" || echo "exporter_cpu.sh: exporter pid $pid did not stop" >&2
  pid=""
  n=$(find "$2" -maxdepth 1 -name '*_metrics_plugin.sh' | wc -l)
  awk -v l="$1" -v n="$n" -v c=$((c1 - c0)) -v o=$((own1 - own0)) -v k=$((kids1 - kids0)) -v t="$TICK" 'BEGIN {
    printf "%-12s %8d %7d %12.2f %13.2f %12.2f\n", l, n, c, o * 1000 / t / c, k * 1000 / t / c, (o + k) * 1000 / t / c }'
}

printf '%-12s %8s %7s %12s %13s %12s\n' "plugin set" plugins cycles "engine ms" "plugins ms" "total ms"
repo_plugins=("$REPO_DIR"/utils/plugins/*_metrics_plugin.sh)
if [[ -e ${repo_plugins[0]} ]]; then _measure repo "$REPO_DIR/utils/plugins"; else printf '%-12s %8s\n' repo "(none present)"; fi
_measure synthetic "$WORK/synthetic"
_measure none "$WORK/none"
echo "(ms = CPU milliseconds per cycle at a ${INTERVAL}s interval; clock tick $((1000 / TICK)) ms; repo plugins: $(find "$REPO_DIR/utils/plugins" -maxdepth 1 -name '*_metrics_plugin.sh' -printf '%f '))"
