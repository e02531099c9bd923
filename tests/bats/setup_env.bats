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

@test "PYTHON must run Python: a program that only exits 0, or echoes, is refused (--python only)" {
  make_stub fakepy 'echo "Python 3.12.1"; exit 0'   # claims a version, runs no code
  local fake
  for fake in /bin/true "$BATS_TEST_TMPDIR/stubs/fakepy"; do
    PYTHON=$fake run "$REPO_DIR/utils/setup_env.sh" --python
    [ "$status" -ne 0 ]
    [ "${#lines[@]}" -eq 1 ]
    [[ $output == *"PYTHON=$fake is not a working Python >= 3.12 with venv; point PYTHON at one"* ]]
  done
  # the interpreter that runs this suite's jobkit is a real one and still passes
  local real
  real=$("$REPO_DIR/.venv/bin/python" -c 'import sys; print(sys._base_executable)')
  PYTHON=$real run "$REPO_DIR/utils/setup_env.sh" --python
  [ "$status" -eq 0 ] && [ "$output" = "$real" ]
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

# e2e (tests/run.sh fast leaves it out): it builds a real venv, installing from the package index.
# bats test_tags=e2e
@test "--tools builds the light set: the jobkit command and its libraries, no MaxText, JAX or Ray" {
  local venv=$BATS_TEST_TMPDIR/tools-venv
  VENV_DIR=$venv run "$REPO_DIR/utils/setup_env.sh" --tools
  echo "$output"
  [ "$status" -eq 0 ]
  [[ $(<"$venv/.lock-stamp") == "tools "* ]]
  run "$venv/bin/jobkit" tgs "$REPO_DIR/tests/fixtures/jobkit/launch-tiny-20steps-mfu.log"
  [ "$status" -eq 0 ]
  [[ $output == *"steady   5-14"* ]]
  "$venv/bin/python" -c 'import click, yaml, numpy, prometheus_client, tensorboard, google_crc32c'
  run "$venv/bin/python" -c 'import importlib.util as u; print([m for m in ("jax", "maxtext", "ray") if u.find_spec(m)])'
  [ "$output" = "[]" ]
  # compiled at install, packages and jobkit alike (uv compiles nothing unless asked)
  run "$venv/bin/python" -c 'import importlib.util as u, os, click.core, jobkit.cli
print([m.__file__ for m in (click.core, jobkit.cli) if not os.path.exists(u.cache_from_source(m.__file__))])'
  [ "$output" = "[]" ]
  # the versions are the lock's
  local pinned; pinned=$(grep -i '^prometheus[-_]client==' "$REPO_DIR/requirements.lock" | cut -d= -f3)
  run "$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("prometheus-client"))'
  [ "$output" = "$pinned" ]
  # a second run has nothing to do
  VENV_DIR=$venv run "$REPO_DIR/utils/setup_env.sh" --tools
  [ "$status" -eq 0 ]
  [ -z "$output" ]
}

@test "the first job's modules are compiled when setup returns; the rest of the venv by its background compile" {
  "$REPO_DIR/utils/setup_env.sh"
  local site missing
  site=$(echo "$REPO_DIR"/.venv/lib/python3*/site-packages)
  # Every listed module this lock installed has its bytecode now, whether or not the background compile ended.
  missing=$(cd "$site" && "$REPO_DIR/.venv/bin/python" -c 'import importlib.util as u, os, sys
names = [n for n in open(sys.argv[1]).read().split() if os.path.isfile(n)]
print(len(names), [n for n in names if not os.path.exists(u.cache_from_source(n))][:5])' "$REPO_DIR/configs/first_job_modules.txt")
  [[ $missing =~ ^[0-9]{4,}\ \[\]$ ]] || { echo "listed, installed, not compiled: $missing"; false; }
  # The background compile holds its lock while it runs: taking it waits for its end (no timer).
  flock "$REPO_DIR/.venv/.bytecode.lock" true
  [ -e "$REPO_DIR/.venv/.bytecode-complete" ]
}

@test "the project venv holds its modules compiled: Ray's processes and jobkit's do not compile them at each start" {
  flock "$REPO_DIR/.venv/.bytecode.lock" true   # the background compile (previous test) has ended
  run "$REPO_DIR/.venv/bin/python" -c 'import importlib.util as u, os, ray._private.worker, ray.dashboard.agent, jobkit.observe.ray_start
print([m.__file__ for m in (ray._private.worker, ray.dashboard.agent, jobkit.observe.ray_start) if not os.path.exists(u.cache_from_source(m.__file__))])'
  [ "$status" -eq 0 ]
  [ "$output" = "[]" ]
}

@test "a full venv also serves a --tools request" {
  run "$REPO_DIR/utils/setup_env.sh" --tools
  [ "$status" -eq 0 ]
  [ -z "$output" ]
}

@test "a venv holding another checkout's jobkit is not reinstalled from this one" {
  local venv=$BATS_TEST_TMPDIR/their-venv site
  site=$venv/lib/python3.12/site-packages/jobkit-0.2.0.dist-info
  mkdir -p "$venv/bin" "$site"
  ln -s "$(command -v python3.12 || command -v python3)" "$venv/bin/python"
  printf '{"url":"file:///elsewhere/checkout/py","dir_info":{"editable":true}}' >"$site/direct_url.json"
  VENV_DIR=$venv run "$REPO_DIR/utils/setup_env.sh"
  [ "$status" -ne 0 ]
  [[ $output == *"holds jobkit from another checkout (/elsewhere/checkout/py); run that checkout's utils/setup_env.sh, or set VENV_DIR"* ]]
  [ "$(find "$venv" | wc -l)" -eq 8 ]   # untouched: no stamp, nothing installed
  [ ! -e "$venv.lock" ]
}
