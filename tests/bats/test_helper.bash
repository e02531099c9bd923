# shellcheck shell=bash
# Shared setup for the bats suites: repo paths and PATH stubs.

REPO_DIR=$(cd "$BATS_TEST_DIRNAME/../.." && pwd)
export REPO_DIR

# make_stub NAME BODY: an executable NAME on a stub dir placed first on PATH; BODY is bash.
make_stub() {
  local dir=$BATS_TEST_TMPDIR/stubs
  mkdir -p "$dir"
  printf '#!/usr/bin/env bash\n%s\n' "$2" >"$dir/$1"
  chmod +x "$dir/$1"
  [[ :$PATH: == *":$dir:"* ]] || PATH=$dir:$PATH
}

# A throwaway copy of the scripts (not outputs, not .venv) that a test may edit freely.
copy_repo() {
  local dest=$BATS_TEST_TMPDIR/repo
  mkdir -p "$dest"
  (cd "$REPO_DIR" && tar -cf - --exclude=./.venv --exclude=./outputs --exclude=./.git --exclude=./.cache .) | tar -xf - -C "$dest"
  echo "$dest"
}
