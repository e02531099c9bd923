#!/usr/bin/env bats
# utils/lib/ray_cluster.sh helpers that need no running Ray node (starting, joining and stopping nodes is tested
# with real Ray in tests/py/test_ray_launch.py).

load test_helper

# Runs _ray_start_cmd on $1 and leaves its words in the array CMD.
start_cmd_of() {
  source "$REPO_DIR/utils/lib/ray_cluster.sh"
  mapfile -d '' -t CMD < <(_ray_start_cmd "$1")
}

@test "ray start: a pip console script of Ray runs 'jobkit ray-start' under its own interpreter" {
  local cli=$BATS_TEST_TMPDIR/bin/ray
  mkdir -p "${cli%/*}"
  # What pip writes for Ray's console script; "/usr/bin/env python3" as some installers do.
  printf '%s\n' '#!/usr/bin/env python3' '# -*- coding: utf-8 -*-' 'import re' 'import sys' \
    'from ray.scripts.scripts import main' 'if __name__ == "__main__":' '    sys.exit(main())' >"$cli"
  chmod +x "$cli"
  start_cmd_of "$cli"
  [ "${#CMD[@]}" -eq 4 ]
  [ "${CMD[0]}" = /usr/bin/env ]
  [ "${CMD[1]}" = python3 ]
  # The package from this checkout, so that Ray's interpreter needs no jobkit installed.
  [ "${CMD[2]}" = "$REPO_DIR/py/bin/jobkit" ]
  [ "${CMD[3]}" = ray-start ]
}

@test "ray start: a ray that is not Ray's Python console script (a wrapper, a binary) runs as it is" {
  make_stub ray 'echo wrapped "$@"'
  start_cmd_of "$BATS_TEST_TMPDIR/stubs/ray"
  [ "${CMD[*]}" = "$BATS_TEST_TMPDIR/stubs/ray start" ]
  start_cmd_of /bin/ls
  [ "${CMD[*]}" = "/bin/ls start" ]
}

@test "ray start: jobkit ray-start is the installed Ray's 'ray start', without importing the serve/job/state groups" {
  [ -x "$REPO_DIR/.venv/bin/ray" ] || skip "no .venv with Ray (utils/setup_env.sh builds it)"
  start_cmd_of "$REPO_DIR/.venv/bin/ray"
  [ "${CMD[0]}" = "$REPO_DIR/.venv/bin/python" ]
  run "${CMD[@]}" --help
  [ "$status" -eq 0 ]
  [[ ${lines[0]} == 'Usage: ray start [OPTIONS]' ]]
  [[ $output == *'--head'* && $output == *'--temp-dir'* ]]
  # -X importtime lists every module imported, on stderr (the skipped ones too, as a 0-cost line): what
  # the groups pull in must be missing.
  run "${CMD[0]}" -X importtime "${CMD[@]:1}" --help
  [ "$status" -eq 0 ]
  [[ $output == *' ray.scripts.scripts'* ]]
  [[ $output != *' ray.util.state.api'* && $output != *' ray.dashboard.modules.job.sdk'* ]]
  [[ $output != *' ray.serve.schema'* ]]
  # The full CLI does import them: the slim start is what leaves them out.
  run "$REPO_DIR/.venv/bin/python" -X importtime "$REPO_DIR/.venv/bin/ray" --help
  [[ $output == *' ray.util.state.api'* && $output == *' ray.dashboard.modules.job.sdk'* ]]
}

@test "ray_make_token: 64 hex digits in a 0600 file of a 0700 dir it creates; refuses to overwrite or to use a shared dir" {
  source "$REPO_DIR/utils/lib/ray_cluster.sh"
  local token=$BATS_TEST_TMPDIR/job/.ray/auth/token
  mkdir -p "$BATS_TEST_TMPDIR/job/.ray"
  run ray_make_token "$token"
  [ "$status" -eq 0 ] && [ -z "$output" ]
  [[ $(<"$token") =~ ^[0-9a-f]{64}$ ]]
  [ "$(stat -c %a "$token")" = 600 ] && [ "$(stat -c %a "${token%/*}")" = 700 ]
  local first; first=$(<"$token")
  run ray_make_token "$token"
  [ "$status" -eq 1 ] && [[ $output == *"already exists"* ]]
  [ "$(<"$token")" = "$first" ]
  # Two tokens differ (random, not derived from anything guessable).
  run ray_make_token "$BATS_TEST_TMPDIR/other/token"
  [ "$(<"$BATS_TEST_TMPDIR/other/token")" != "$first" ]
  # A directory others may write: someone could swap the token under us.
  mkdir -m 0777 "$BATS_TEST_TMPDIR/shared"
  chmod 0777 "$BATS_TEST_TMPDIR/shared"
  run ray_make_token "$BATS_TEST_TMPDIR/shared/token"
  [ "$status" -eq 1 ] && [[ $output == *"not a private directory of yours"* ]]
  [ ! -e "$BATS_TEST_TMPDIR/shared/token" ]
  run ray_make_token relative/token
  [ "$status" -eq 2 ] && [ "${#lines[@]}" -eq 1 ]
}

@test "ray start with RAY_AUTH_TOKEN_PATH: a token others can read, or no token file, is refused before Ray starts" {
  make_stub ray 'echo started >>"$STUB_LOG_DIR/ray.calls"'
  export RAY_BIN=$BATS_TEST_TMPDIR/stubs/ray STUB_LOG_DIR=$BATS_TEST_TMPDIR
  source "$REPO_DIR/utils/lib/ray_cluster.sh"
  local token=$BATS_TEST_TMPDIR/auth/token
  ray_make_token "$token"
  chmod 0644 "$token"
  RAY_AUTH_TOKEN_PATH=$token run _ray_run_start "$BATS_TEST_TMPDIR/rt" 127.0.0.1 --head
  [ "$status" -eq 1 ] && [ "${#lines[@]}" -eq 1 ]
  [[ $output == *"must be yours and 0600"* ]]
  RAY_AUTH_TOKEN_PATH=$BATS_TEST_TMPDIR/auth/missing run _ray_run_start "$BATS_TEST_TMPDIR/rt" 127.0.0.1 --head
  [ "$status" -eq 1 ] && [[ $output == *"is not a regular file"* ]]
  [ ! -e "$BATS_TEST_TMPDIR/ray.calls" ]
  # With a private token, Ray starts with token authentication on and the file's path (never its content).
  chmod 0600 "$token"
  make_stub ray 'env >"$STUB_LOG_DIR/ray.env"; echo "$@" >"$STUB_LOG_DIR/ray.args"'
  RAY_AUTH_TOKEN_PATH=$token run _ray_run_start "$BATS_TEST_TMPDIR/rt" 127.0.0.1 --head
  [ "$status" -eq 0 ]
  grep -qx 'RAY_AUTH_MODE=token' "$BATS_TEST_TMPDIR/ray.env"
  grep -qx "RAY_AUTH_TOKEN_PATH=$token" "$BATS_TEST_TMPDIR/ray.env"
  ! grep -q "$(<"$token")" "$BATS_TEST_TMPDIR/ray.env" "$BATS_TEST_TMPDIR/ray.args"
}
