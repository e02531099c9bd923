#!/usr/bin/env bash
# Usage: bench/sweep_xla.sh [REPEATS] [-- maxtext key=value | _env_KEY=VALUE ...]
# Summary: The XLA sweep for real on this machine: tiny, the CPU catalog, --local, REPEATS runs per profile
#
# Runs `jobkit sweep xla tiny --local --catalog configs/xla_catalogs/cpu.yml --repeats REPEATS` (default 2)
# with a fresh workspace and compile cache, prints the leaderboard and where the full report
# (tiny-tuning.md) is. The catalog's llvm_o0 profile is harmful on purpose: the run proves the ranking
# when it lands below baseline-deployed as a loss outside the noise band. About 25 s per job on two cores
# (2 x (2 baselines + 9 profiles) = 22 jobs, ~10 min, by default); give PROFILES=a,b to run a subset.
# Run it on a quiet machine: other work widens the noise band (it warns when utils/local_cluster.sh is
# up, whose jobs compete for the same cores).
# Without EXTRA every job runs per_device_batch_size=32: at tiny's own batch (2) a step is mostly dispatch
# overhead and flags that change the generated kernels barely show.
# Environment: PROFILES (catalog subset), BENCH_WORKSPACE (keep state there; default a new temp dir, kept).
# Not part of CI.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-} in -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;; esac
REPEATS=2
if [[ -n ${1:-} && $1 != -- ]]; then REPEATS=$1; shift; fi
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || { echo "sweep_xla.sh: REPEATS must be a positive number, got '$REPEATS'" >&2; exit 2; }
[[ ${1:-} == -- ]] && shift
EXTRA=("$@")
((${#EXTRA[@]})) || EXTRA=(per_device_batch_size=32)

"$REPO_DIR/utils/setup_env.sh"
WORK=${BENCH_WORKSPACE:-$(mktemp -d /tmp/sweep_xla.XXXXXX)}
export JOB_WORKSPACE=$WORK CONTAINER_RUNTIME=none JAX_CACHE_DIR=$WORK/jax_cache
SWEEP_ID=xla-bench-$(date +%Y%m%d-%H%M%S)
echo "[bench] workspace $WORK; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
if "$REPO_DIR/utils/local_cluster.sh" status >/dev/null 2>&1; then
  echo "[bench] WARNING: a local cluster is up; its jobs share these cores and widen the noise band" >&2
fi

args=(sweep xla tiny --local --id "$SWEEP_ID" --catalog "$REPO_DIR/configs/xla_catalogs/cpu.yml"
  --repeats "$REPEATS" --hang-after 600 --poll 2)
[[ -n ${PROFILES:-} ]] && args+=(--profiles "$PROFILES")
rc=0
"$REPO_DIR/.venv/bin/jobkit" "${args[@]}" -- "${EXTRA[@]}" >"$WORK/sweep.out" 2>&1 || rc=$?
grep -E '^\[(xla|sweep)\]|^\[[A-Za-z0-9_.-]+#[0-9]+\]' "$WORK/sweep.out" || true
echo
sed -n '/^| Profile/,$p' "$WORK/sweeps/$SWEEP_ID/summary.md" 2>/dev/null || tail -20 "$WORK/sweep.out"
echo
echo "[bench] exit $rc; load after: $(cut -d' ' -f1-3 /proc/loadavg); report: $WORK/sweeps/$SWEEP_ID/tiny-tuning.md"
exit "$rc"
