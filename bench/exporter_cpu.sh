#!/usr/bin/env bash
# Usage: bench/exporter_cpu.sh [--root DIR] [--base REV] [--tb RANK] [CYCLES] [INTERVAL]
# Summary: CPU cost of one metrics-exporter cycle (engine + plugins), with the repo's plugins, synthetic ones, and none
#
# Runs utils/metrics_exporter.sh on 127.0.0.1 at INTERVAL seconds (default 0.25) for CYCLES cycles (default 40,
# at least 30) after two warm-up cycles, once per plugin set:
#   repo       the utils/plugins/*_metrics_plugin.* present now (skipped when there are none)
#   base       with --base REV: the exporter and plugins of git revision REV (a `git archive` copy whose `jobkit`
#              is its own py/bin/jobkit run by this repo's venv python), measured in the same run, before `repo`
#   synthetic  3 small bash plugins that read /proc files with builtins only
#   none       an empty plugins dir: the engine's own cost
#   --root DIR   point the host and GPU plugins at a recorded tree (HOST_METRICS_ROOT=GPU_METRICS_ROOT=DIR), e.g.
#                tests/fixtures/metrics/node8 (8 MI300X, 8 RDMA devices); default: this machine's own /proc and /sys
#   --tb RANK    the TensorBoard plugin on: NODE_RANK=RANK and OUTPUT_PATH a fresh job dir per plugin set, whose
#                event file (bench/make_event_file.py, 20 scalars a step) grows by one step per cycle while it
#                is measured (TB_BRIDGE_INTERVAL = INTERVAL/10 for the old plugin's daemon); a reader daemon the plugin starts (the bash plugin's `jobkit tb-bridge serve`, found
#                by its pid file under the job's TMPDIR) is counted with the plugins. Without --tb, OUTPUT_PATH is
#                unset (the TensorBoard plugin retires itself).
# CPU comes from /proc: utime+stime of the engine, cutime+cstime of its reaped children (plugins run per cycle and
# whatever they run), plus utime+stime+cutime+cstime of its live descendants (long-lived plugin workers), in clock
# ticks, as the difference between the first counted cycle and the last. Cycles are counted by
# hw_exporter_cycles_total. Prints a table of milliseconds per cycle. Not part of CI.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-} in -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;; esac
ROOT="" BASE="" TB=""
while (($#)); do
  case $1 in
    --root) ROOT=${2:?--root needs a directory}; shift 2 ;;
    --tb) TB=${2:?--tb needs a node rank}; shift 2 ;;
    --base) BASE=${2:?--base needs a git revision}; shift 2 ;;
    *) break ;;
  esac
done
[[ -z $ROOT || -d $ROOT ]] || { echo "exporter_cpu.sh: --root $ROOT is not a directory: pass a tree such as tests/fixtures/metrics/node8" >&2; exit 2; }
[[ -z $ROOT ]] || ROOT=$(cd "$ROOT" && pwd)
[[ -z $TB || $TB =~ ^[0-9]+$ ]] || { echo "exporter_cpu.sh: --tb needs a node rank (0 reads TensorBoard), got '$TB'" >&2; exit 2; }
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
pid="" grow=""
_cleanup() {
  [[ -z $pid ]] || proc_stop 10 "$pid" || true
  [[ -z $grow ]] || proc_stop 10 "$grow" || true
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

# Prints "<own ticks> <children ticks>" of a process: children = its reaped children plus its live descendants
# (with what they reaped). A plugin run that is live at one sample and reaped by the next is counted in both:
# noise of at most one run per sample.
_ticks() {
  # awk, not a bash loop: a process that ends between the glob and the read must not stop the count
  awk -v root="$1" '{
    line = $0; sub(/^.*\) /, "", line); split(line, r, " ")
    pid = FILENAME; gsub(/[^0-9]/, "", pid)
    par[pid] = r[2]; t[pid] = r[12] + r[13] + r[14] + r[15]
    if (pid == root) { own = r[12] + r[13]; desc = r[14] + r[15] }
    nextfile
  } END {
    for (p in par) {
      f = par[p]; n = 0
      while (f != "" && f != 0 && f != 1 && f != root && n++ < 64) f = par[f]
      if (f == root && p != root) desc += t[p]
    }
    print own + 0, desc + 0
  }' /proc/[0-9]*/stat 2>/dev/null || true
}

# Ticks (utime+stime) of the TensorBoard reader daemons started for the current plugin set (0 when none): they
# leave the engine's process tree (their starting shell exits), so _ticks does not see them.
_daemon_ticks() {
  local f sum=0 d stat
  for f in "$WORK"/tmp/tb_bridge.*.prom.pid; do
    [[ -r $f ]] || continue
    read -r d <"$f" || continue
    stat=$(<"/proc/$d/stat") 2>/dev/null || continue  # it may have exited
    stat=${stat##*) }
    read -ra stat <<<"$stat"
    sum=$((sum + stat[11] + stat[12]))
  done
  echo "$sum"
}

# Starts the growing event file of a plugin set (--tb): a fresh job dir, one step's records appended per INTERVAL.
_tb_start() {
  rm -rf "$WORK/tmp" "$WORK/ws"
  mkdir -p "$WORK/tmp" "$WORK/ws/job/run/tensorboard/run"
  export TMPDIR=$WORK/tmp JOB_WORKSPACE=$WORK/ws JOB_DIR=job OUTPUT_PATH=$WORK/ws/job NODE_RANK=$TB
  # the bash plugin's daemon polls 10 times per cycle, as its default 1 s does at the job's 10 s cycles
  TB_BRIDGE_INTERVAL=$(awk -v i="$INTERVAL" 'BEGIN { print i / 10 }')
  export TB_BRIDGE_INTERVAL
  local ev=$OUTPUT_PATH/run/tensorboard/run/events.out.tfevents.1700000000.bench step_bytes
  step_bytes=$(( ($(stat -c %s "$WORK/events") - HEAD_BYTES) / TB_STEPS ))
  head -c "$((HEAD_BYTES + step_bytes))" "$WORK/events" >"$ev"
  (
    off=$((HEAD_BYTES + step_bytes))
    while sleep "$INTERVAL"; do
      tail -c +$((off + 1)) "$WORK/events" | head -c "$step_bytes" >>"$ev"
      off=$((off + step_bytes))
    done
  ) &
  grow=$!
}

_cycles() {
  curl -s --noproxy '*' --max-time 2 "http://127.0.0.1:$1/metrics" 2>/dev/null |
    sed -n 's/^hw_exporter_cycles_total{[^}]*} \([0-9]*\)\(\.0\)\{0,1\}$/\1/p'  # prometheus_client writes 12.0
}

_wait_cycles() { # PORT MIN
  local c deadline=$((SECONDS + 120))
  while ((SECONDS < deadline)); do
    c=$(_cycles "$1") || c=""  # nothing listening yet: curl fails, and pipefail would end the script
    if [[ -n $c ]] && ((c >= $2)); then echo "$c"; return 0; fi
    sleep 0.05
  done
  echo "exporter_cpu.sh: the exporter did not reach cycle $2 (log: $WORK/log)" >&2
  return 1
}

_measure() { # LABEL DIR [REPO]
  local port=0 c0 c1 own0 kids0 own1 kids1 n repo=${3:-$REPO_DIR}
  port=$(FREE_PORT_RANGE=20000-29999 pick_free_port "$port")
  [[ -z $TB ]] || _tb_start
  "$repo/utils/metrics_exporter.sh" --address 127.0.0.1 --port "$port" --interval "$INTERVAL" \
    --plugins-dir "$2" 2>>"$WORK/log" &
  pid=$!
  c0=$(_wait_cycles "$port" 2)
  read -r own0 kids0 < <(_ticks "$pid")
  kids0=$((kids0 + $(_daemon_ticks)))
  sleep "$(awk -v n="$CYCLES" -v i="$INTERVAL" 'BEGIN { print n * i }')"
  c1=$(_wait_cycles "$port" $((c0 + CYCLES)))
  read -r own1 kids1 < <(_ticks "$pid")
  kids1=$((kids1 + $(_daemon_ticks)))
  proc_stop 10 "$pid" || echo "exporter_cpu.sh: exporter pid $pid did not stop" >&2
  pid=""
  if [[ -n $grow ]]; then proc_stop 10 "$grow" || true; grow=""; fi
  n=$(find "$2" -maxdepth 1 -name '*_metrics_plugin.*' | wc -l)
  awk -v l="$1" -v n="$n" -v c=$((c1 - c0)) -v o=$((own1 - own0)) -v k=$((kids1 - kids0)) -v t="$TICK" 'BEGIN {
    printf "%-12s %8d %7d %12.2f %13.2f %12.2f\n", l, n, c, o * 1000 / t / c, k * 1000 / t / c, (o + k) * 1000 / t / c }'
}

printf '%-12s %8s %7s %12s %13s %12s\n' "plugin set" plugins cycles "engine ms" "plugins ms" "total ms"
if [[ -n $ROOT ]]; then export HOST_METRICS_ROOT=$ROOT GPU_METRICS_ROOT=$ROOT; fi
unset OUTPUT_PATH _PLUGIN_STATE
if [[ -n $TB ]]; then
  # enough steps for every plugin set's cycles, one per cycle; the first record (file_version) is the head
  TB_STEPS=$((CYCLES * 4 + 100))
  "$REPO_DIR/.venv/bin/python" "$REPO_DIR/bench/make_event_file.py" "$WORK/events" "$TB_STEPS" 20
  "$REPO_DIR/.venv/bin/python" "$REPO_DIR/bench/make_event_file.py" "$WORK/events0" 0 20
  HEAD_BYTES=$(stat -c %s "$WORK/events0")
fi
if [[ -n $BASE ]]; then
  mkdir -p "$WORK/base"
  git -C "$REPO_DIR" archive "$BASE" | tar -x -C "$WORK/base" ||
    { echo "exporter_cpu.sh: cannot export revision '$BASE' of $REPO_DIR: pass a commit, e.g. HEAD~3" >&2; exit 2; }
  # the copy's own package, run by this venv's interpreter (proc_jobkit runs <copy>/.venv/bin/jobkit)
  mkdir -p "$WORK/base/.venv/bin"
  printf '#!/bin/sh\nexec %q %q "$@"\n' "$REPO_DIR/.venv/bin/python" "$WORK/base/py/bin/jobkit" >"$WORK/base/.venv/bin/jobkit"
  chmod +x "$WORK/base/.venv/bin/jobkit"
  _measure "base" "$WORK/base/utils/plugins" "$WORK/base"
fi
repo_plugins=("$REPO_DIR"/utils/plugins/*_metrics_plugin.*)
if [[ -e ${repo_plugins[0]} ]]; then _measure repo "$REPO_DIR/utils/plugins"; else printf '%-12s %8s\n' repo "(none present)"; fi
_measure synthetic "$WORK/synthetic"
_measure none "$WORK/none"
echo "(ms = CPU milliseconds per cycle at a ${INTERVAL}s interval; clock tick $((1000 / TICK)) ms; tree: ${ROOT:-this machine}${BASE:+; base: $BASE}${TB:+; TensorBoard: rank $TB, a 20-scalar step per cycle}; repo plugins: $(find "$REPO_DIR/utils/plugins" -maxdepth 1 -name '*_metrics_plugin.*' -printf '%f '))"
