#!/usr/bin/env bats
# utils/plugins/tb_metrics_plugin.sh: rank-0 gate, the reader daemon's start and reuse, output with bash builtins only.
# The fixture is a trimmed copy of a real MaxText run's event file (tests/fixtures/tensorboard/).

load test_helper
bats_require_minimum_version 1.5.0

setup() {
  PLUGIN=$REPO_DIR/utils/plugins/tb_metrics_plugin.sh
  export VENV_DIR=$REPO_DIR/.venv TMPDIR=$BATS_TEST_TMPDIR TB_BRIDGE_INTERVAL=0.2
  export JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws JOB_DIR=local_20261123_000000_ab12-JAX-tiny NODE_RANK=0
  export OUTPUT_PATH=$JOB_WORKSPACE/$JOB_DIR
  unset _PLUGIN_STATE JOB_ID
  mkdir -p "$OUTPUT_PATH"
  cp -r "$REPO_DIR/tests/fixtures/tensorboard/tiny" "$OUTPUT_PATH/"
  PARENT_PID="" DAEMON_PID=""
}

teardown() {
  local pid
  for pid in $DAEMON_PID $PARENT_PID; do
    kill "$pid" 2>/dev/null || true
  done
}

# The "# STATE " line of $output, without the prefix.
state_of() { sed -n 's/^# STATE //p' <<<"$output"; }

@test "tb plugin: exits 99 on ranks other than 0 and without OUTPUT_PATH, before starting anything" {
  NODE_RANK=1 run bash "$PLUGIN" n1
  [ "$status" -eq 99 ]
  [ -z "$output" ]
  OUTPUT_PATH="" run bash "$PLUGIN" n1
  [ "$status" -eq 99 ]
  run -0 bash "$PLUGIN" --help
  [[ $output == "Usage: tb_metrics_plugin.sh <short hostname>" ]]
  run -2 bash "$PLUGIN"
  shopt -s nullglob
  local started=("$BATS_TEST_TMPDIR"/tb_bridge.*)
  [ "${#started[@]}" -eq 0 ]
}

@test "tb plugin: starts the daemon once, prints its exposition, reuses it, and it follows its parent" {
  sleep 60 &
  PARENT_PID=$!
  export TB_BRIDGE_PARENT_PID=$PARENT_PID
  run -0 bash "$PLUGIN" n1
  local state
  state=$(state_of)
  [[ $state =~ ^tb1\ ([0-9]+)\ 0\ 0\ (.+\.prom)$ ]] || false
  DAEMON_PID=${BASH_REMATCH[1]}
  local out=${BASH_REMATCH[2]}
  [[ $out == "$BATS_TEST_TMPDIR"/tb_bridge.* ]] || false
  kill -0 "$DAEMON_PID"
  # started as the venv's `jobkit tb-bridge serve` (once the forked shell has exec'd it), without PYTHONPATH
  local i cmdline=''
  for ((i = 0; i < 50; i++)); do
    cmdline=$(tr '\0' ' ' <"/proc/$DAEMON_PID/cmdline")
    [[ $cmdline == *" tb-bridge serve "* ]] && break
    sleep 0.1
  done
  [[ $cmdline == *"$VENV_DIR/bin/jobkit tb-bridge serve --logdir $OUTPUT_PATH "* ]] || false
  run ! grep -qz '^PYTHONPATH=' "/proc/$DAEMON_PID/environ"

  for ((i = 0; i < 50; i++)); do [[ -s $out ]] && break; sleep 0.2; done
  [[ -s $out ]] || false
  [ "$(<"$out.pid")" = "$DAEMON_PID" ]

  # steady state: bash alone on PATH (no cat, no python lookup), same daemon, its file printed verbatim
  local onlybash=$BATS_TEST_TMPDIR/onlybash
  mkdir -p "$onlybash"
  ln -sf "$(command -v bash)" "$onlybash/bash"
  _PLUGIN_STATE=$state PATH=$onlybash run -0 bash "$PLUGIN" n1
  [[ $output == *'tb_learning_loss{host="n1"} 6.020145893096924 1795412855889'* ]] || false
  [[ $output == *'tb_step{host="n1"} 5.0 1795412855889'* ]] || false
  [[ $output == *'tb_metrics_plugin_staleness_fill{host="n1"} 0'* ]] || false
  [[ $output != *text_summary* && $output != *tb_run_name* ]] || false
  [ "${lines[${#lines[@]} - 1]}" = "# STATE $state" ]
  [ "$(state_of)" = "$state" ]
  grep -q "reading $OUTPUT_PATH/tiny/tensorboard/tiny/events.out.tfevents.1795412855.vm" \
    "$OUTPUT_PATH/metrics_exporter/tb_bridge.n1.log"

  # the exporter (here: the sleep) goes away -> the daemon exits and cleans up
  kill "$PARENT_PID"
  for ((i = 0; i < 25; i++)); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.2; done
  run ! kill -0 "$DAEMON_PID"
  [ ! -e "$out" ] && [ ! -e "$out.pid" ]
}

@test "tb plugin: a dead daemon is started again; the restarts are counted in the state" {
  sleep 60 &
  PARENT_PID=$!
  export TB_BRIDGE_PARENT_PID=$PARENT_PID
  run -0 bash "$PLUGIN" n1
  local state
  state=$(state_of)
  [[ $state =~ ^tb1\ ([0-9]+)\ 0\ 0\ (.+)$ ]] || false
  local first=${BASH_REMATCH[1]} out=${BASH_REMATCH[2]}
  kill "$first"
  local i
  for ((i = 0; i < 25; i++)); do kill -0 "$first" 2>/dev/null || break; sleep 0.2; done
  _PLUGIN_STATE=$state run -0 bash "$PLUGIN" n1
  state=$(state_of)
  [[ $state =~ ^tb1\ ([0-9]+)\ 0\ 1\ (.+)$ ]] || false
  DAEMON_PID=${BASH_REMATCH[1]}
  [ "$DAEMON_PID" != "$first" ]
  [ "${BASH_REMATCH[2]}" = "$out" ]
  kill -0 "$DAEMON_PID"
}

@test "tb plugin: an output dir shared with earlier jobs ignores their event files" {
  export OUTPUT_PATH=$BATS_TEST_TMPDIR/shared-ckpt-dir
  mkdir -p "$OUTPUT_PATH"
  cp -r "$REPO_DIR/tests/fixtures/tensorboard/tiny" "$OUTPUT_PATH/"
  sleep 60 &
  PARENT_PID=$!
  export TB_BRIDGE_PARENT_PID=$PARENT_PID
  run -0 bash "$PLUGIN" n1
  local state
  state=$(state_of)
  [[ $state =~ ^tb1\ ([0-9]+)\ ([0-9]+)\ 0\ (.+)$ ]] || false
  DAEMON_PID=${BASH_REMATCH[1]}
  local since=${BASH_REMATCH[2]}
  ((since > 1795412855)) || false
  sleep 1
  _PLUGIN_STATE=$state run -0 bash "$PLUGIN" n1
  [ "$output" = "# STATE $state" ]
}
