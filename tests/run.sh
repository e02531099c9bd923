#!/usr/bin/env bash
# Usage: tests/run.sh [fast] [bats|py ...] [-- extra pytest args]
# Summary: Set up what the tests need, run the bats and pytest suites (all, or the fast tier), end with "N passed, N failed"
#
# With no suite named, runs both. With no tier named, runs every test (what CI runs: about 27 minutes on 2
# cores). `fast` runs only the tests that start nothing real (no training job, Slurm cluster, container,
# Ray node, Prometheus or browser; a few minutes): it leaves out the tests tagged e2e, with pytest's
# -m "not e2e" (the marker is given in tests/py/conftest.py) and bats' --filter-tags '!e2e'.
#   tests/run.sh fast                 the fast tier of both suites
#   tests/run.sh fast py -- -k tgs    the fast tier of the pytest suite, narrowed further
# Exit status is non-zero when any test fails or a suite cannot run.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_PROG=tests/run.sh
cd "$REPO_DIR"

_usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

passed=0 failed=0 skipped=0 broken="" fast=""

_run_bats() {
  local tap rc=0
  tap=$(mktemp)
  bats --tap ${fast:+--filter-tags '!e2e'} tests/bats | tee "$tap" || rc=$?
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
  python -m pytest ${where:+"$where"} -p no:cacheprovider -rfE --junitxml="$xml" ${fast:+-m "not e2e"} "$@" || rc=$?
  if [[ -s $xml ]]; then
    local counts
    counts=$(python - "$xml" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
t = sum(int(s.get("tests", 0)) for s in suites)
f = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
k = sum(int(s.get("skipped", 0)) for s in suites)
print(t - f - k, f, k)
PY
)
    read -r p f k <<<"$counts"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + k))
    if (( rc != 0 && f == 0 )); then broken+=" pytest(exit $rc)"; fi
  else
    broken+=" pytest(no report, exit $rc)"
  fi
  rm -f "$xml"
}

main() {
  local -a suites=() pytest_args=()
  while (( $# )); do
    case $1 in
      -h|--help) _usage; exit 0 ;;
      fast) fast=1 ;;
      bats|py) suites+=("$1") ;;
      --) shift; pytest_args=("$@"); break ;;
      *) echo "$_PROG: unknown argument '$1' (tier: fast; suites: bats, py)" >&2; exit 2 ;;
    esac
    shift
  done
  (( ${#suites[@]} )) || suites=(bats py)

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
  echo "suites: ${suites[*]}${fast:+ (fast tier: e2e tests left out)}; ${skipped} skipped; $((SECONDS - start)) s${broken:+; could not finish:$broken}"
  if [[ -n $broken ]]; then failed=$((failed + 1)); fi
  echo "$passed passed, $failed failed"
  (( failed == 0 ))
}

main "$@"
