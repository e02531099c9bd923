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

# A stand-in for `ray start` (RAY_BIN): makes TEMP_DIR's raylet socket, listens on the GCS port (--port), then
# waits for the file $STUB_GO and exits with the status written there, after a line like Ray's dashboard error.
# STUB_GO holding "now:N" exits with N at once, before anything is up.
fake_ray_start() {
  make_stub ray '
for a; do case $a in --temp-dir=*) dir=${a#*=} ;; --port=*) port=${a#*=} ;; esac; done
if [[ $(cat "$STUB_GO" 2>/dev/null) == now:* ]]; then echo "RuntimeError: boom before the GCS"; exit "$(cut -d: -f2 "$STUB_GO")"; fi
mkdir -p "$dir/session_1/sockets" && ln -sfn "$dir/session_1" "$dir/session_latest"
echo "${JOBKIT_RAY_SPAWN_NICE-unset}" >"$dir/spawn_nice"
[[ -n ${port:-} ]] && python3 -c "import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((\"127.0.0.1\", int(sys.argv[1]))); s.listen(); time.sleep(600)" "$port" &
: >"$dir/session_1/sockets/raylet"
: >"$dir/session_1/metrics_agent_port_0123"
while [[ ! -f $STUB_GO ]]; do sleep 0.05; done
echo "Failed to start the dashboard , return code 1"
exit "$(<"$STUB_GO")"'
  export RAY_BIN=$BATS_TEST_TMPDIR/stubs/ray STUB_GO=$BATS_TEST_TMPDIR/go
}

# Waits (at most 60 s) until the command in "$@" succeeds.
wait_until() {
  local i
  for ((i = 0; i < 1200; i++)); do "$@" && return 0; sleep 0.05; done
  return 1
}

@test "ray_start_head returns once the GCS and raylet are up; a later failure of ray start is one line and the node stays up" {
  fake_ray_start
  source "$REPO_DIR/utils/lib/ray_cluster.sh"
  local dir; dir=$(mktemp -d /tmp/mxr-b.XXXXXX)
  local gcs dash met; gcs=$(pick_free_port) dash=$(pick_free_port "$gcs") met=$(pick_free_port "$gcs" "$dash")
  ray_start_head "$dir" 127.0.0.1 "$gcs" "$dash" "$met" 2>"$BATS_TEST_TMPDIR/err" &
  local head=$!
  # It returns while `ray start` still runs (the stub waits for the go file, which nobody wrote yet).
  wait "$head"
  [ ! -e "$dir/ray_start.rc" ]
  [ -n "$(ray_node_pids "$dir")" ]
  [ ! -s "$BATS_TEST_TMPDIR/err" ]
  echo 1 >"$STUB_GO"
  wait_until test -s "$BATS_TEST_TMPDIR/err"
  [ "$(<"$dir/ray_start.rc")" = 1 ]
  run cat "$BATS_TEST_TMPDIR/err"
  [ "${#lines[@]}" -eq 1 ]
  [[ $output == *"ray start\` failed after its GCS and raylet came up (Failed to start the dashboard"* ]]
  [[ $output == *"training goes on"* && $output == *"$dir/ray_start.log"* ]]
  # The GCS (the stub's listener) is still there: a dashboard failure stops nothing.
  _ray_listening "$gcs"
  ray_stop_node "$dir" 0
  [ -z "$(ray_node_pids "$dir")" ]
  rm -rf "$dir"
}

@test "ray_start_head: RAY_SERVICES_NICE reaches jobkit ray-start as the niceness a deferred dashboard starts with" {
  fake_ray_start
  source "$REPO_DIR/utils/lib/ray_cluster.sh"
  local dir nice expected; dir=$(mktemp -d /tmp/mxr-b.XXXXXX)
  local gcs dash met; gcs=$(pick_free_port) dash=$(pick_free_port "$gcs") met=$(pick_free_port "$gcs" "$dash")
  echo 0 >"$STUB_GO"
  for nice in 7 ""; do
    expected=${nice:-unset}
    RAY_SERVICES_NICE=$nice ray_start_head "$dir" 127.0.0.1 "$gcs" "$dash" "$met"
    wait_until test -f "$dir/ray_start.rc"
    [ "$(<"$dir/spawn_nice")" = "$expected" ]
    ray_stop_node "$dir" 0
  done
  rm -rf "$dir"
}

@test "ray_start_head: a ray start that fails before the GCS is up fails in one line and leaves nothing; a stop by ray_stop_node is not reported" {
  fake_ray_start
  source "$REPO_DIR/utils/lib/ray_cluster.sh"
  local dir; dir=$(mktemp -d /tmp/mxr-b.XXXXXX)
  local gcs dash met; gcs=$(pick_free_port) dash=$(pick_free_port "$gcs") met=$(pick_free_port "$gcs" "$dash")
  echo now:3 >"$STUB_GO"
  run ray_start_head "$dir" 127.0.0.1 "$gcs" "$dash" "$met"
  [ "$status" -eq 1 ] && [ "${#lines[@]}" -eq 1 ]
  [[ $output == *"did not start: RuntimeError: boom before the GCS"* ]]
  [ -z "$(ray_node_pids "$dir")" ]
  # A node stopped while its `ray start` still runs: no "failed" line afterwards.
  rm -f "$STUB_GO"
  ray_start_head "$dir" 127.0.0.1 "$gcs" "$dash" "$met" 2>"$BATS_TEST_TMPDIR/err"
  ray_stop_node "$dir" 0
  wait_until test -f "$dir/ray_start.rc"
  [ "$(<"$dir/ray_start.rc")" -gt 128 ]
  sleep 0.3 # the watcher reports right after it writes the status; give it the chance to (wrongly) do so
  [ ! -s "$BATS_TEST_TMPDIR/err" ]
  rm -rf "$dir"
}

@test "ray_join_cluster: while the head does not answer yet, it joins as soon as the head's port opens, not DELAY s later" {
  fake_ray_start
  echo 0 >"$STUB_GO"
  source "$REPO_DIR/utils/lib/ray_cluster.sh"
  local dir; dir=$(mktemp -d /tmp/mxr-b.XXXXXX)
  local head_port met; head_port=$(pick_free_port) met=$(pick_free_port "$head_port")
  SECONDS=0
  ray_join_cluster "$dir" 127.0.0.1 "127.0.0.1:$head_port" "$met" 2 120 2>"$BATS_TEST_TMPDIR/err" &
  local join=$!
  wait_until grep -q "attempt 1/2: nothing answers" "$BATS_TEST_TMPDIR/err"
  python3 -c "import socket, sys, time
s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(600)" "$head_port" &
  local listener=$!
  wait "$join"
  ((SECONDS < 60)) # DELAY is 120 s: it went on once the port answered
  [ "$(grep -c attempt "$BATS_TEST_TMPDIR/err")" -eq 1 ]
  [ -e "$dir/session_latest/sockets/raylet" ] # the second attempt ran `ray start`
  kill "$listener"
  ray_stop_node "$dir" 0
  rm -rf "$dir"
}
