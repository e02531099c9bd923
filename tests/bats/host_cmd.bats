#!/usr/bin/env bats
# utils/host_cmd.py, the bridge's client, as an agent in a container meets it: --help, bad usage, no server.
# (What the server does with requests is tests/py/test_bridge.py.)

load test_helper

@test "host_cmd.py --help prints its usage, every option and the exit codes" {
  run "$REPO_DIR/utils/host_cmd.py" --help
  [ "$status" -eq 0 ]
  [[ ${lines[0]} == "Usage: utils/host_cmd.py"* ]]
  local opt
  for opt in --ping --timeout --cwd --json --async --result --node --dir "Exit codes"; do
    [[ $output == *"$opt"* ]] || { echo "missing $opt"; false; }
  done
}

@test "host_cmd.py: bad usage is one line and exit 2, and nothing is written" {
  export JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws
  mkdir -p "$JOB_WORKSPACE/.bridge/n1/requests"
  run "$REPO_DIR/utils/host_cmd.py"
  [ "$status" -eq 2 ] && [[ $output == "host_cmd: give one of"* ]]
  run "$REPO_DIR/utils/host_cmd.py" --timeout 0 squeue
  [ "$status" -eq 2 ] && [[ $output == "host_cmd: --timeout 0:"* ]]
  run "$REPO_DIR/utils/host_cmd.py" --result ../../x
  [ "$status" -eq 2 ] && [[ $output == *"not a request id"* ]]
  [ -z "$(ls -A "$JOB_WORKSPACE/.bridge/n1/requests")" ]
}

@test "host_cmd.py with no server running says so, names who starts it, and takes its request back" {
  export JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws
  mkdir -p "$JOB_WORKSPACE/.bridge/n1/requests"
  run "$REPO_DIR/utils/host_cmd.py" --ping
  [ "$status" -eq 69 ]
  [[ $output == *"ask the person to start \`jobkit bridge serve\`"* ]]
  [ -z "$(ls -A "$JOB_WORKSPACE/.bridge/n1/requests")" ]
}
