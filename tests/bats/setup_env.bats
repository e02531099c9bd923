#!/usr/bin/env bats
# utils/setup_env.sh: interpreter search, the up-to-date stamp, images that bring MaxText.

load test_helper

@test "--help prints the usage header" {
  run "$REPO_DIR/utils/setup_env.sh" --help
  [ "$status" -eq 0 ]
  [[ ${lines[0]} == "Usage: utils/setup_env.sh"* ]]
}

@test "PYTHON pointing at an old interpreter is refused with the fix" {
  make_stub oldpy 'echo "Python 3.11.7"; exit 1'
  PYTHON=oldpy run "$REPO_DIR/utils/setup_env.sh" --python
  [ "$status" -ne 0 ]
  [[ $output == *"PYTHON=oldpy is not a working Python >= 3.12"* ]]
}

@test "no Python >= 3.12 anywhere: one clear error naming what was tried and how to fix it" {
  make_stub python3.12 'echo "pyenv: python3.12: command not found" >&2; exit 127'
  make_stub python3 'exit 1'
  HOME=$BATS_TEST_TMPDIR PYENV_ROOT=$BATS_TEST_TMPDIR/nopyenv PATH=$BATS_TEST_TMPDIR/stubs:/usr/bin:/bin \
    run "$REPO_DIR/utils/setup_env.sh" --python
  [ "$status" -ne 0 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ $output == *"no Python >= 3.12 found"* ]]
  [[ $output == *"PYTHON=/path/to/python3.12"* ]]
}

@test "a pyenv shim that fails is skipped and the real interpreter found" {
  make_stub python3.12 'exit 127'
  run "$REPO_DIR/utils/setup_env.sh" --python
  [ "$status" -eq 0 ]
  "$output" -c 'import sys; assert sys.version_info >= (3, 12)'
}

@test "an unchanged lock is up to date at once; a changed lock is not" {
  run "$REPO_DIR/utils/setup_env.sh" --check
  [ "$status" -eq 0 ]
  local repo; repo=$(copy_repo)
  echo "# changed" >>"$repo/requirements.lock"
  VENV_DIR=$REPO_DIR/.venv run "$repo/utils/setup_env.sh" --check
  [ "$status" -eq 1 ]
}

@test "inside an image that brings MaxText no venv is created" {
  VENV_DIR=$BATS_TEST_TMPDIR/venv SKIP_VENV=1 run "$REPO_DIR/utils/setup_env.sh"
  [ "$status" -eq 0 ]
  [[ $output == *"no venv needed"* ]]
  [ ! -e "$BATS_TEST_TMPDIR/venv" ]
  make_stub python3 'exit 0'   # answers "yes" to the find_spec probe for MaxText
  VENV_DIR=$BATS_TEST_TMPDIR/venv run "$REPO_DIR/utils/setup_env.sh"
  [ "$status" -eq 0 ]
  [ ! -e "$BATS_TEST_TMPDIR/venv" ]
}
