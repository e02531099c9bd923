#!/usr/bin/env bash
# Usage: bench/backfill_speed.sh [--steps N] [--big-steps M] [--scalars K] [--runs R] [--base DIR] [--old REV] [--promtool]
# Summary: Speed of `jobkit tb-bridge backfill` end to end: fixed cost and samples per second into a scratch TSDB
#
# Writes TensorBoard event files of K scalars a step (default 10), as TFRecords of TensorBoard's Event protos
# (what tensorboardX writes, written directly: much faster to make), and runs the backfill of each into an
# empty scratch TSDB R times (default 3), as a user would: `jobkit tb-bridge backfill --logdir ... --tsdb ...`,
# the venv's console script, start-up and promtool included. Three inputs:
#   tiny  10 steps: what every backfill costs before it reads a sample (process start, imports, block files)
#   std   N steps (default 50000, 550k samples with tb_step): the line earlier rounds reported
#   big   M steps (default 500000, 5.5 M samples: a week-long run at one step a second); --big-steps 0 skips it
# The per-sample rate is (big - tiny) samples over (big - tiny) seconds, so the start-up is not in it.
# With --base DIR, the jobkit of another checkout DIR (e.g. a `git worktree add` of main) is run too, as
# `python -m jobkit` from DIR/py (the working directory comes first on sys.path), interleaved with this tree's on the same files, so both see the same machine load ("base").
# With --old REV, the py/jobkit/tb_bridge.py of git revision REV (the single-file argparse version) is run too,
# also interleaved. With --promtool, this tree is also run with TB_BACKFILL_WRITER=promtool (the blocks written
# by promtool, as before jobkit.observe.tsdb_block), again interleaved ("promtool"). Prints a table: version,
# input, run, samples (including the tb_step series), wall seconds, samples/s, and CPU seconds (user+sys of the
# backfill and every process it ran, promtool included; from /usr/bin/time, "-" without it: on a shared machine
# the CPU column is the steadier one); then the medians, then per version the fixed cost (tiny's medians) and
# the per-sample rate, by wall and by CPU. Everything it starts is a foreground child; its scratch dir is
# removed on exit. Not part of CI.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
die() { echo "backfill_speed.sh: $*" >&2; exit 2; }
STEPS=50000 BIG_STEPS=500000 SCALARS=10 RUNS=3 BASE='' OLD='' PROMTOOL=0
while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --steps) STEPS=${2:-}; shift 2 || die "--steps needs a number" ;;
    --big-steps) BIG_STEPS=${2:-}; shift 2 || die "--big-steps needs a number" ;;
    --scalars) SCALARS=${2:-}; shift 2 || die "--scalars needs a number" ;;
    --runs) RUNS=${2:-}; shift 2 || die "--runs needs a number" ;;
    --base) BASE=${2:-}; shift 2 || die "--base needs a checkout dir" ;;
    --old) OLD=${2:-}; shift 2 || die "--old needs a git revision" ;;
    --promtool) PROMTOOL=1; shift ;;
    *) die "unknown argument '$1'; see --help" ;;
  esac
done
for value in "$STEPS" "$SCALARS" "$RUNS"; do
  [[ $value =~ ^[1-9][0-9]*$ ]] || die "'$value' is not a positive whole number; see --help"
done
[[ $BIG_STEPS =~ ^(0|[1-9][0-9]*)$ ]] || die "--big-steps '$BIG_STEPS' is not a whole number (0 skips the big input); see --help"
if [[ -n $BASE ]]; then
  [[ -f $BASE/py/jobkit/observe/tb_bridge.py ]] ||
    die "--base '$BASE' is not a checkout with py/jobkit/observe/tb_bridge.py; make one with git worktree add DIR REV"
  BASE=$(cd "$BASE" && pwd)
fi
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

inputs=(tiny std)
declare -A STEPS_OF=([tiny]=10 [std]=$STEPS [big]=$BIG_STEPS)
((BIG_STEPS)) && inputs+=(big)
for input in "${inputs[@]}"; do
  mkdir -p "$WORK/logs.$input"
  "$PYTHON" "$REPO_DIR/bench/make_event_file.py" \
    "$WORK/logs.$input/events.out.tfevents.1700000000.bench" "${STEPS_OF[$input]}" "$SCALARS"
done

# run VERSION INPUT: one backfill of INPUT into a fresh TSDB; prints "SAMPLES SECONDS CPU_SECONDS"
run() {
  local version=$1 input=$2 tsdb=$WORK/tsdb out start end cpu=-
  rm -rf "$tsdb" "$WORK/cpu" && mkdir "$tsdb"
  # this checkout's venv runs this checkout's jobkit; another checkout's runs from its py/ dir, which `python -m`
  # puts first on sys.path (every path given below is absolute)
  local -a command=("$JOBKIT" tb-bridge backfill)
  [[ $version == base ]] && command=(env -C "$BASE/py" "$PYTHON" -m jobkit tb-bridge backfill)
  [[ $version == old ]] && command=("$PYTHON" "$WORK/tb_bridge_old.py" backfill)
  [[ $version == promtool ]] && command=(env TB_BACKFILL_WRITER=promtool "${command[@]}")
  [[ -x /usr/bin/time ]] && command=(/usr/bin/time -f '%U %S' -o "$WORK/cpu" "${command[@]}")
  start=$EPOCHREALTIME
  out=$("${command[@]}" --logdir "$WORK/logs.$input" --tsdb "$tsdb" --label job=bench --label host=bench 2>&1) ||
    die "the $version backfill of $input failed: $out"
  end=$EPOCHREALTIME
  [[ $out =~ backfilled\ ([0-9]+)\ samples ]] || die "the $version backfill of $input said no sample count: $out"
  [[ -s $WORK/cpu ]] && cpu=$(awk '{ printf "%.2f", $1 + $2 }' "$WORK/cpu")
  echo "${BASH_REMATCH[1]} $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }') $cpu"
}

median() { tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
rate() { awk -v n="$1" -v s="$2" 'BEGIN { if (s > 0) printf "%.0f", n / s; else print "-" }'; }
# per-sample rate: the samples past tiny's over the seconds past tiny's ("-" where a column has no number)
marginal() { awk -v n="$1" -v n0="$2" -v s="$3" -v s0="$4" 'BEGIN { if (s != "-" && s0 != "-" && s > s0) printf "%.0f", (n - n0) / (s - s0); else print "-" }'; }

declare -A WALL_OF=() CPU_OF=() SAMPLES_OF=()
versions=(new)
[[ -n $BASE ]] && versions=(base "${versions[@]}")
[[ -n $OLD ]] && versions=(old "${versions[@]}")
((PROMTOOL)) && versions=(promtool "${versions[@]}")
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %-5s %6s %10s %9s %11s %9s\n' version input run samples seconds samples/s cpu_s
for input in "${inputs[@]}"; do
  for ((r = 1; r <= RUNS; r++)); do
    for version in "${versions[@]}"; do
      read -r samples seconds cpu < <(run "$version" "$input")
      WALL_OF[$version.$input]+="$seconds " CPU_OF[$version.$input]+="$cpu " SAMPLES_OF[$input]=$samples
      printf '%-8s %-5s %6d %10d %9.3f %11s %9s\n' "$version" "$input" "$r" "$samples" "$seconds" \
        "$(rate "$samples" "$seconds")" "$cpu"
    done
  done
done
declare -A MEDIAN_WALL=() MEDIAN_CPU=()
for input in "${inputs[@]}"; do
  for version in "${versions[@]}"; do
    MEDIAN_WALL[$version.$input]=$(median "${WALL_OF[$version.$input]}")
    MEDIAN_CPU[$version.$input]=$(median "${CPU_OF[$version.$input]}")
    printf '%-8s %-5s %6s %10d %9.3f %11s %9s\n' "$version" "$input" median "${SAMPLES_OF[$input]}" \
      "${MEDIAN_WALL[$version.$input]}" "$(rate "${SAMPLES_OF[$input]}" "${MEDIAN_WALL[$version.$input]}")" \
      "${MEDIAN_CPU[$version.$input]}"
  done
done
last=${inputs[-1]}
printf '\n%-8s %13s %12s %27s %26s\n' version fixed_wall_s fixed_cpu_s "per-sample (wall) samples/s" "per-sample (cpu) samples/s"
for version in "${versions[@]}"; do
  printf '%-8s %13s %12s %27s %26s\n' "$version" "${MEDIAN_WALL[$version.tiny]}" "${MEDIAN_CPU[$version.tiny]}" \
    "$(marginal "${SAMPLES_OF[$last]}" "${SAMPLES_OF[tiny]}" "${MEDIAN_WALL[$version.$last]}" "${MEDIAN_WALL[$version.tiny]}")" \
    "$(marginal "${SAMPLES_OF[$last]}" "${SAMPLES_OF[tiny]}" "${MEDIAN_CPU[$version.$last]}" "${MEDIAN_CPU[$version.tiny]}")"
done
echo "(per-sample from tiny and $last; $(uname -n), $(nproc) cores, load average after $(cut -d' ' -f1-3 /proc/loadavg))"
