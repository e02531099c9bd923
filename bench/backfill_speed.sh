#!/usr/bin/env bash
# Usage: bench/backfill_speed.sh [--steps N] [--scalars K] [--runs R] [--old REV] [--promtool]
# Summary: Speed of `jobkit tb-bridge backfill` end to end: samples per second into a scratch TSDB
#
# Writes one TensorBoard event file of N steps (default 50000) x K scalars (default 10), as TFRecords of
# TensorBoard's Event protos (what tensorboardX writes, written directly: much faster to make), then runs the
# backfill into an empty scratch TSDB R times (default 3), as a user would: `jobkit tb-bridge backfill --logdir
# ... --tsdb ...`, the venv's console script, start-up and promtool included. With --old REV, the
# py/jobkit/tb_bridge.py of git revision REV (the single-file argparse version) is run too, interleaved with the
# new one on the same file, so that both see the same machine load. With --promtool, the new one is also run
# with TB_BACKFILL_WRITER=promtool (the blocks written by promtool, as before jobkit.observe.tsdb_block), again
# interleaved ("promtool" in the table). Prints a table: version, run, samples
# (including the tb_step series), wall seconds, samples/s, and CPU seconds (user+sys of the backfill and every
# process it ran, promtool included; from /usr/bin/time, "-" without it: on a shared machine the CPU column is
# the steadier one), and the median per version. Everything it starts is a
# foreground child; its scratch dir is removed on exit. Not part of CI.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
die() { echo "backfill_speed.sh: $*" >&2; exit 2; }
STEPS=50000 SCALARS=10 RUNS=3 OLD='' PROMTOOL=0
while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --steps) STEPS=${2:-}; shift 2 || die "--steps needs a number" ;;
    --scalars) SCALARS=${2:-}; shift 2 || die "--scalars needs a number" ;;
    --runs) RUNS=${2:-}; shift 2 || die "--runs needs a number" ;;
    --old) OLD=${2:-}; shift 2 || die "--old needs a git revision" ;;
    --promtool) PROMTOOL=1; shift ;;
    *) die "unknown argument '$1'; see --help" ;;
  esac
done
for value in "$STEPS" "$SCALARS" "$RUNS"; do
  [[ $value =~ ^[1-9][0-9]*$ ]] || die "'$value' is not a positive whole number; see --help"
done
# shellcheck source=utils/lib/process.sh
source "$REPO_DIR/utils/lib/process.sh"
PYTHON=$(proc_python "$REPO_DIR") || die "no Python found; run utils/setup_env.sh"
JOBKIT=$(proc_jobkit "$REPO_DIR")
command -v promtool >/dev/null || [[ -x /usr/bin/promtool ]] || die "promtool is not installed; run utils/prometheus.sh install"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/backfill_speed.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
if [[ -n $OLD ]]; then
  git -C "$REPO_DIR" show "$OLD:py/jobkit/tb_bridge.py" >"$WORK/tb_bridge_old.py" 2>/dev/null ||
    die "git revision '$OLD' has no py/jobkit/tb_bridge.py; pass a commit before the split"
  grep -q '^import argparse' "$WORK/tb_bridge_old.py" || die "py/jobkit/tb_bridge.py of '$OLD' is not the argparse version"
  # jobkit.argtypes is gone; the old file only needs it for serve's --interval
  sed -i 's/^from jobkit.argtypes import positive_seconds$/positive_seconds = float/' "$WORK/tb_bridge_old.py"
fi

mkdir -p "$WORK/logs"
"$PYTHON" "$REPO_DIR/bench/make_event_file.py" "$WORK/logs/events.out.tfevents.1700000000.bench" "$STEPS" "$SCALARS"

# run VERSION: one backfill into a fresh TSDB; prints "SAMPLES SECONDS CPU_SECONDS"
run() {
  local version=$1 tsdb=$WORK/tsdb.$1 out start end cpu=-
  rm -rf "$tsdb" && mkdir "$tsdb"
  local -a command=("$JOBKIT" tb-bridge backfill)
  [[ $version == old ]] && command=("$PYTHON" "$WORK/tb_bridge_old.py" backfill)
  [[ $version == promtool ]] && command=(env TB_BACKFILL_WRITER=promtool "${command[@]}")
  [[ -x /usr/bin/time ]] && command=(/usr/bin/time -f '%U %S' -o "$WORK/cpu" "${command[@]}")
  start=$EPOCHREALTIME
  out=$("${command[@]}" --logdir "$WORK/logs" --tsdb "$tsdb" --label job=bench --label host=bench 2>&1) ||
    die "the $version backfill failed: $out"
  end=$EPOCHREALTIME
  [[ $out =~ backfilled\ ([0-9]+)\ samples ]] || die "the $version backfill said no sample count: $out"
  [[ -s $WORK/cpu ]] && cpu=$(awk '{ printf "%.2f", $1 + $2 }' "$WORK/cpu")
  echo "${BASH_REMATCH[1]} $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }') $cpu"
}

median() { tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

declare -A WALL_OF=() CPU_OF=()
versions=(new)
[[ -n $OLD ]] && versions=(old new)
((PROMTOOL)) && versions=(promtool "${versions[@]}")
rate() { awk -v n="$1" -v s="$2" 'BEGIN { print n / s }'; }
printf '%-8s %6s %10s %9s %11s %9s\n' version run samples seconds samples/s cpu_s
for ((r = 1; r <= RUNS; r++)); do
  for version in "${versions[@]}"; do
    read -r samples seconds cpu < <(run "$version")
    WALL_OF[$version]+="$seconds " CPU_OF[$version]+="$cpu "
    printf '%-8s %6d %10d %9.2f %11.0f %9s\n' "$version" "$r" "$samples" "$seconds" "$(rate "$samples" "$seconds")" "$cpu"
  done
done
for version in "${versions[@]}"; do
  seconds=$(median "${WALL_OF[$version]}")
  printf '%-8s %6s %10d %9.2f %11.0f %9s\n' "$version" median "$samples" "$seconds" "$(rate "$samples" "$seconds")" \
    "$(median "${CPU_OF[$version]}")"
done
echo "($(uname -n), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg))"
