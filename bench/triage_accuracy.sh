#!/usr/bin/env bash
# Usage: bench/triage_accuracy.sh [CORPUS_DIR]
# Summary: How often `jobkit why` gets the failure class and the blamed host right on a corpus of job logs
#
# Runs `jobkit why --json` (in one Python process, bench/triage_accuracy.py) on every <case>.log of CORPUS_DIR
# (default tests/fixtures/failures/corpus, written by its make_corpus.py from the real message texts) and
# compares with the corpus' expected.yaml. Prints the confusion table (per expected class: how many logs, how
# many given that class, and what was given instead), the class and host accuracy, and one line per miss.
# Exits 1 when anything is wrong, 2 on a usage error. Reads only; writes nothing. Not part of CI (the test
# tests/py/test_failure_corpus.py asserts the same per log).
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
die() { echo "triage_accuracy.sh: $*" >&2; exit 2; }
case ${1:-} in
  -h | --help) usage; exit 0 ;;
esac
(($# <= 1)) || die "one corpus dir at most; see --help"
corpus=${1:-$REPO_DIR/tests/fixtures/failures/corpus}
[[ -f $corpus/expected.yaml ]] || die "$corpus has no expected.yaml; give a corpus dir (see tests/fixtures/failures/make_corpus.py)"
python=$REPO_DIR/.venv/bin/python
[[ -x $python ]] || die "no $python; run utils/setup_env.sh first (it installs jobkit into the venv)"
exec "$python" "$REPO_DIR/bench/triage_accuracy.py" "$corpus"
