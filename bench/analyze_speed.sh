#!/usr/bin/env bash
# Usage: bench/analyze_speed.sh [--runs R] [--nodes N] [--steps S] [--hours H] [--interval I] [--workspace WS --id ID]
# Summary: Cost of `jobkit analyze` on a big job: an 8-node, 2000-step, 1-hour RAY=1 job's log and TSDB
#
# Makes a synthetic finished job in a scratch workspace with bench/make_synthetic_job.py (N nodes, default 8;
# S steps, default 2000; H hours, default 1; a scrape every I seconds, default 5: the series of an 8-GPU node,
# written as OpenMetrics and turned into TSDB blocks by promtool), or, with --workspace WS --id ID, uses job
# ID of WS as it is (it must have a TSDB in <job dir>/prometheus/). Then, R times (default 3), interleaved:
# `promtool tsdb dump` alone with analyze's own --match (jobkit.analysis.hosts.hosts_families(), its output
# to a file), and `jobkit analyze ID --workspace WS`, the venv's console script as a user runs it (start-up,
# promtool, report and all). Wall seconds and max RSS come from /usr/bin/time (else Python's resource module).
# Prints each run, then one summary row: nodes, steps, series, samples, TSDB size, dump size, dump and analyze
# seconds (min/median), report.html and analysis.json sizes, analyze's max RSS; then where one analyze's time
# goes, timed in one Python process (imports, log, promtool dump and its capture, parse, per-host lines,
# anomalies and document, report). No timing is asserted. Its scratch dir is removed on exit (with --workspace,
# the job's analysis/ is rewritten, as `jobkit analyze` does). Not part of CI.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
die() { echo "analyze_speed.sh: $*" >&2; exit 2; }
RUNS=3 NODES=8 STEPS=2000 HOURS=1 INTERVAL=5 WS='' ID=''
while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --runs) RUNS=${2:-}; shift 2 || die "--runs needs a number" ;;
    --nodes) NODES=${2:-}; shift 2 || die "--nodes needs a number" ;;
    --steps) STEPS=${2:-}; shift 2 || die "--steps needs a number" ;;
    --hours) HOURS=${2:-}; shift 2 || die "--hours needs a number" ;;
    --interval) INTERVAL=${2:-}; shift 2 || die "--interval needs a number of seconds" ;;
    --workspace) WS=${2:-}; shift 2 || die "--workspace needs a directory" ;;
    --id) ID=${2:-}; shift 2 || die "--id needs a job id" ;;
    *) die "unknown argument '$1'; see --help" ;;
  esac
done
for value in "$RUNS" "$NODES" "$STEPS"; do
  [[ $value =~ ^[1-9][0-9]*$ ]] || die "'$value' is not a positive whole number; see --help"
done
for value in "$HOURS" "$INTERVAL"; do
  [[ $value =~ ^[0-9]*\.?[0-9]+$ ]] || die "'$value' is not a positive number; see --help"
done
[[ -n $WS && -z $ID || -z $WS && -n $ID ]] && die "--workspace and --id go together"
# shellcheck source=utils/lib/process.sh
source "$REPO_DIR/utils/lib/process.sh"
PYTHON=$(proc_python "$REPO_DIR") || die "no Python found; run utils/setup_env.sh"
JOBKIT=$(proc_jobkit "$REPO_DIR")
PROMTOOL=${PROMTOOL:-$(command -v promtool || echo /usr/bin/promtool)}
[[ -x $PROMTOOL ]] || die "promtool is not installed; run utils/prometheus.sh install"
export PROMTOOL

WORK=$(mktemp -d "${TMPDIR:-/tmp}/analyze_speed.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

series=- samples=-
if [[ -z $WS ]]; then
  WS=$WORK/ws ID=424242
  mkdir "$WS"
  start=$EPOCHREALTIME
  made=$("$PYTHON" "$REPO_DIR/bench/make_synthetic_job.py" "$WS" --id "$ID" --nodes "$NODES" --steps "$STEPS" \
    --hours "$HOURS" --interval "$INTERVAL") || die "bench/make_synthetic_job.py failed"
  end=$EPOCHREALTIME
  [[ $made =~ series\ ([0-9]+)\ samples\ ([0-9]+) ]] || die "bench/make_synthetic_job.py said no counts: $made"
  series=${BASH_REMATCH[1]} samples=${BASH_REMATCH[2]}
  echo "synthetic job made in $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s: ${made//$'\n'/; }"
else
  [[ -d $WS ]] || die "no workspace $WS"
  NODES=- STEPS=-
fi
LOG=$("$PYTHON" -c 'import sys; from pathlib import Path; from jobkit import jobs; print(jobs.resolve(Path(sys.argv[1]), sys.argv[2]))' \
  "$WS" "$ID") || die "no job '$ID' in $WS"
JOB_DIR=${LOG%.log}
TSDB=$JOB_DIR/prometheus
[[ -d $TSDB ]] || die "$JOB_DIR has no prometheus/ dir (a RAY=1 job has one)"
FAMILIES=$("$PYTHON" -c 'from jobkit.analysis.hosts import hosts_families; print(hosts_families())')
TSDB_BYTES=$(du -sb "$TSDB" | cut -f1)

# timed OUT COMMAND...: runs COMMAND (stdout to OUT); prints "SECONDS MAX_RSS_KB"
timed() {
  local out=$1
  shift
  if [[ -x /usr/bin/time ]]; then
    /usr/bin/time -f '%e %M' -o "$WORK/time" "$@" >"$out" || die "failed: $*"
    cat "$WORK/time"
  else
    # no GNU time: wall time from bash's clock, max RSS unknown (0)
    local t0=$EPOCHREALTIME
    "$@" >"$out" || die "failed: $*"
    awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f 0\n", b - a }'
  fi
}
median() { tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
minimum() { tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -n | head -n 1; }
mb() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1e6 }'; }

DUMP_S='' ANALYZE_S='' RSS_MAX=0 DUMP_BYTES=0
printf '%-4s %8s %12s %10s %15s\n' run dump_s dump_rss_MB analyze_s analyze_rss_MB
for ((r = 1; r <= RUNS; r++)); do
  read -r dump_s dump_kb < <(timed "$WORK/dump.txt" "$PROMTOOL" tsdb dump "--match={__name__=~\"$FAMILIES\"}" "$TSDB")
  DUMP_BYTES=$(stat -c %s "$WORK/dump.txt")
  [[ $samples == - ]] && samples=$(grep -c '^{' "$WORK/dump.txt" || true)
  if [[ $series == - ]]; then series=$(awk '/^\{/ { NF -= 2; print }' "$WORK/dump.txt" | sort -u | wc -l); fi
  rm -f "$WORK/dump.txt"
  read -r analyze_s analyze_kb < <(timed "$WORK/analyze.out" "$JOBKIT" analyze "$ID" --workspace "$WS")
  DUMP_S+="$dump_s " ANALYZE_S+="$analyze_s "
  ((analyze_kb > RSS_MAX)) && RSS_MAX=$analyze_kb
  printf '%-4d %8.2f %12.0f %10.2f %15.0f\n' "$r" "$dump_s" "$((dump_kb / 1024))" "$analyze_s" "$((analyze_kb / 1024))"
done
echo
echo "jobkit analyze says:"
sed 's/^/  /' "$WORK/analyze.out"
echo
REPORT_BYTES=$(stat -c %s "$JOB_DIR/analysis/report.html")
JSON_BYTES=$(stat -c %s "$JOB_DIR/analysis/analysis.json")
printf '%-5s %5s %6s %8s %7s %7s %13s %16s %9s %7s %10s\n' nodes steps series samples tsdb_MB dump_MB \
  dump_s_min/med analyze_s_min/med report_KB json_KB max_rss_MB
printf '%-5s %5s %6s %8s %7s %7s %13s %16s %9.0f %7.0f %10.0f\n' "$NODES" "$STEPS" "$series" "$samples" \
  "$(mb "$TSDB_BYTES")" "$(mb "$DUMP_BYTES")" "$(minimum "$DUMP_S")/$(median "$DUMP_S")" \
  "$(minimum "$ANALYZE_S")/$(median "$ANALYZE_S")" "$((REPORT_BYTES / 1000))" "$((JSON_BYTES / 1000))" \
  "$((RSS_MAX / 1024))"

echo
echo "where one analyze's time goes (its steps timed in one Python process; nothing written):"
"$PYTHON" "$REPO_DIR/bench/analyze_phases.py" "$LOG" "$PROMTOOL"
echo "($(uname -n), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $("$PROMTOOL" --version 2>&1 | head -n 1))"
