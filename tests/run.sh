#!/usr/bin/env bash
# Usage: tests/run.sh [fast|slow] [bats|py ...] [--selection] [-- extra pytest args]
# Summary: Set up what the tests need, run the bats and pytest suites (all, or one tier), end with "N passed, N failed"
#
# With no suite named, runs both. With no tier named, runs every test but the slow proofs (what CI runs:
# about 43 minutes on 2 cores). The tiers:
#   fast   only the tests that start nothing real (no training job, Slurm cluster, container, Ray node,
#          Prometheus or browser; a few minutes): it leaves out the tests tagged e2e, with pytest's
#          -m "not e2e and not slow" (the markers are given in tests/py/conftest.py) and bats'
#          --filter-tags '!e2e'.
#   slow   only the slow proofs, the pytest tests marked slow (-m slow; 6-12 minutes each, real jobs that
#          wait out the hang watchdog's default 300 s floor or need a 3-node Slurm cluster). Without a suite
#          named it runs py alone (no bats test is slow). Every other run leaves them out (-m "not slow").
#   tests/run.sh fast                 the fast tier of both suites
#   tests/run.sh fast py -- -k tgs    the fast tier of the pytest suite, narrowed further
#   tests/run.sh slow                 the slow proofs (as root: they start the local Slurm cluster)
#   tests/run.sh slow --selection     print the pytest -m expression and bats filter of a tier, run nothing
# Exit status is non-zero when any test fails or a suite cannot run.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_PROG=tests/run.sh
cd "$REPO_DIR"

_usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

passed=0 failed=0 skipped=0 broken="" tier=""

# The pytest marker expression and the bats tag filter of each tier ("" runs every bats test).
_pytest_markers() {
  case $tier in
    fast) echo "not e2e and not slow" ;;
    slow) echo "slow" ;;
    *) echo "not slow" ;;
  esac
}
_bats_filter() {
  case $tier in
    fast) echo '!e2e' ;;
    slow) echo "slow" ;;
  esac
}

_run_bats() {
  local tap rc=0 filter
  filter=$(_bats_filter)
  tap=$(mktemp)
  bats --tap ${filter:+--filter-tags "$filter"} tests/bats | tee "$tap" || rc=$?
  local ok not_ok skip
  ok=$(grep -c '^ok ' "$tap" || true)
  skip=$(grep -Ec '^ok .* # skip' "$tap" || true)
  not_ok=$(grep -c '^not ok ' "$tap" || true)
  passed=$((passed + ok - skip)) skipped=$((skipped + skip)) failed=$((failed + not_ok))
  if (( rc != 0 && not_ok == 0 )); then broken+=" bats(exit $rc)"; fi
  rm -f "$tap"
}

_run_pytest() {
  local xml rc=0 arg where=tests/py
  xml=$(mktemp --suffix=.xml)
  # Test files or node ids given (`-- tests/py/test_x.py`): only those, not the whole directory as well.
  for arg; do [[ $arg == tests/py/* ]] && where=""; done
  python -m pytest ${where:+"$where"} -p no:cacheprovider -rfE --junitxml="$xml" -m "$(_pytest_markers)" "$@" || rc=$?
  if [[ -s $xml ]]; then
    local counts
    counts=$(python tests/junit_counts.py "$xml")
    read -r p f k <<<"$counts"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + k))
    if (( rc != 0 && f == 0 )); then broken+=" pytest(exit $rc)"; fi
  else
    broken+=" pytest(no report, exit $rc)"
  fi
  rm -f "$xml"
}

_tier_note() {
  case $tier in
    fast) echo " (fast tier: e2e and slow tests left out)" ;;
    slow) echo " (slow tier: only the slow proofs)" ;;
    *) echo " (slow proofs left out: tests/run.sh slow)" ;;
  esac
}

main() {
  local -a suites=() pytest_args=()
  local selection=""
  while (( $# )); do
    case $1 in
      -h|--help) _usage; exit 0 ;;
      fast|slow)
        [[ -z $tier || $tier == "$1" ]] || { echo "$_PROG: name one tier, not both '$tier' and '$1'" >&2; exit 2; }
        tier=$1 ;;
      bats|py) suites+=("$1") ;;
      --selection) selection=1 ;;
      --) shift; pytest_args=("$@"); break ;;
      *) echo "$_PROG: unknown argument '$1' (tiers: fast, slow; suites: bats, py; --selection)" >&2; exit 2 ;;
    esac
    shift
  done
  if (( ! ${#suites[@]} )); then
    # No bats test is slow: the slow tier alone would run bats for nothing.
    if [[ $tier == slow ]]; then suites=(py); else suites=(bats py); fi
  fi
  if [[ -n $selection ]]; then
    echo "pytest: -m \"$(_pytest_markers)\""
    local filter
    filter=$(_bats_filter)
    echo "bats: ${filter:+--filter-tags $filter}"
    echo "suites: ${suites[*]}"
    exit 0
  fi

  utils/setup_env.sh || { echo "$_PROG: could not set up .venv (see above)"; echo "0 passed, 1 failed"; exit 1; }
  export PATH=$REPO_DIR/.venv/bin:$PATH

  local start=$SECONDS suite
  for suite in "${suites[@]}"; do
    echo "=== $suite ==="
    case $suite in
      bats) _run_bats ;;
      py) _run_pytest "${pytest_args[@]}" ;;
    esac
  done
  echo
  echo "suites: ${suites[*]}$(_tier_note); ${skipped} skipped; $((SECONDS - start)) s${broken:+; could not finish:$broken}"
  if [[ -n $broken ]]; then failed=$((failed + 1)); fi
  echo "$passed passed, $failed failed"
  (( failed == 0 ))
}

main "$@"
