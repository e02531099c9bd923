#!/usr/bin/env bats
# utils/lib/prometheus.sh: finding the binary. A job never installs Prometheus (audit row O1); only the
# explicit setup step `utils/prometheus.sh install` may. No Prometheus is started here.

load test_helper

setup() {
  # PATH: this machine's tools less any prometheus (one may be installed here), then the stubs first.
  local sealed=$BATS_TEST_TMPDIR/sealed tool
  mkdir -p "$sealed"
  for tool in /usr/bin/* /bin/*; do
    [[ ${tool##*/} == prometheus* || ${tool##*/} == apt* || -e $sealed/${tool##*/} ]] || ln -s "$tool" "$sealed/"
  done
  PATH=$sealed
  # An apt-get that records being called: it must not be, at job time.
  make_stub apt-get "echo \"\$*\" >>'$BATS_TEST_TMPDIR/apt-get.calls'; exit 0"
  # Nor where Debian's package would be.
  export _PROM_SYSTEM_BIN=$BATS_TEST_TMPDIR/no/prometheus
  unset PROMETHEUS_BIN
  ! command -v prometheus || false
}

@test "prometheus_find: the binary from PROMETHEUS_BIN or PATH, with its version" {
  make_stub prometheus 'echo "prometheus, version 2.99.0 (stub)"'
  run bash -c 'source "$1"; prometheus_find' x "$REPO_DIR/utils/lib/prometheus.sh"
  [ "$status" -eq 0 ]
  [ "$output" = "$BATS_TEST_TMPDIR/stubs/prometheus prometheus, version 2.99.0 (stub)" ]
  PROMETHEUS_BIN=$BATS_TEST_TMPDIR/stubs/prometheus run bash -c 'source "$1"; prometheus_find' x \
    "$REPO_DIR/utils/lib/prometheus.sh"
  [ "$status" -eq 0 ]
}

@test "prometheus_find without a binary: one line naming the fix, and nothing installed, even as root" {
  run bash -c 'source "$1"; prometheus_find' x "$REPO_DIR/utils/lib/prometheus.sh"
  [ "$status" -eq 1 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ $output == "prometheus.sh: no prometheus binary (PROMETHEUS_BIN, PATH, $_PROM_SYSTEM_BIN); put one in the image or on the nodes (as root: utils/prometheus.sh install), or set PROMETHEUS_BIN" ]]
  PROMETHEUS_BIN=/nonexistent run bash -c 'source "$1"; prometheus_find' x "$REPO_DIR/utils/lib/prometheus.sh"
  [ "$status" -eq 1 ]
  [[ $output == *"PROMETHEUS_BIN=/nonexistent is not an executable"* ]]
  [ ! -e "$BATS_TEST_TMPDIR/apt-get.calls" ]
}

@test "a RAY=1 job without Prometheus trains with metrics off, says how to fix it, and runs no apt-get" {
  export JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws JOB_DIR=1-x TMPDIR=$BATS_TEST_TMPDIR
  mkdir -p "$JOB_WORKSPACE/$JOB_DIR"
  # The job-time step of utils/lib/observability.sh, on its own.
  run bash -c 'source "$1"; _OBS=([state]=$(mktemp -d) [job_path]=$JOB_WORKSPACE/$JOB_DIR); _obs_start_prometheus' x \
    "$REPO_DIR/utils/lib/observability.sh"
  [ "$status" -eq 0 ]
  [[ $output == "[observability] metrics are off: prometheus.sh: no prometheus binary "*"(as root: utils/prometheus.sh install), or set PROMETHEUS_BIN (training goes on)" ]]
  [ ! -e "$BATS_TEST_TMPDIR/apt-get.calls" ]
  [ ! -e "$JOB_WORKSPACE/$JOB_DIR/prometheus" ]
}

@test "a PROMETHEUS_SCRAPE_INTERVAL that is not whole seconds turns the metrics off in one line, before anything starts" {
  export JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws JOB_DIR=1-x TMPDIR=$BATS_TEST_TMPDIR
  mkdir -p "$JOB_WORKSPACE/$JOB_DIR"
  for bad in fast 0 1.5s 2m; do
    PROMETHEUS_SCRAPE_INTERVAL=$bad run bash -c 'source "$1"; _OBS=([state]=$(mktemp -d) [job_path]=$JOB_WORKSPACE/$JOB_DIR); _obs_start_prometheus' x \
      "$REPO_DIR/utils/lib/observability.sh"
    [ "$status" -eq 0 ]
    [ "$output" = "[observability] metrics are off: PROMETHEUS_SCRAPE_INTERVAL='$bad' is not a number of seconds (e.g. 5s); fix or unset it (training goes on)" ]
    [ ! -e "$JOB_WORKSPACE/$JOB_DIR/prometheus" ]
  done
}

@test "the explicit setup step still installs, as root, through apt-get" {
  [ "$(id -u)" -eq 0 ] || skip "installing needs root"
  # apt-get "installs" a prometheus where Debian's package puts it.
  make_stub apt-get "echo \"\$*\" >>'$BATS_TEST_TMPDIR/apt-get.calls'
    mkdir -p '${_PROM_SYSTEM_BIN%/*}'; printf '#!/bin/sh\necho prometheus, version 2.42.0\n' >'$_PROM_SYSTEM_BIN'
    chmod +x '$_PROM_SYSTEM_BIN'"
  run "$REPO_DIR/utils/prometheus.sh" install
  [ "$status" -eq 0 ]
  [ "$output" = "$_PROM_SYSTEM_BIN prometheus, version 2.42.0" ] || [[ $output == *$'\n'"$_PROM_SYSTEM_BIN prometheus, version 2.42.0" ]]
  grep -q 'install -y --no-install-recommends prometheus' "$BATS_TEST_TMPDIR/apt-get.calls"
}

@test "prometheus_scrape_interval: 5s up to 64 nodes, 10s up to 256, 15s above" {
  local n want
  for n in 1:5s 8:5s 64:5s 65:10s 256:10s 257:15s 512:15s 4096:15s; do
    want=${n#*:}
    run bash -c 'source "$1"; prometheus_scrape_interval "$2"' x "$REPO_DIR/utils/lib/prometheus.sh" "${n%%:*}"
    [ "$status" -eq 0 ]
    [ "$output" = "$want" ] || { echo "nodes ${n%%:*}: got '$output', want $want"; false; }
  done
}

@test "prometheus_start --nodes writes the node count's interval into the job's scrape config; --scrape-interval wins" {
  # A prometheus that fails at startup: the config is written before it runs, and stays.
  make_stub prometheus 'echo "level=error msg=\"stub prometheus\"" >&2; exit 1'
  local job=$BATS_TEST_TMPDIR/job cfg=$BATS_TEST_TMPDIR/job/prometheus/prometheus.yml
  mkdir -p "$job"
  for case in "512::15s" "100::10s" "8::5s" "512:7s:7s"; do
    IFS=: read -r nodes given want <<<"$case"
    run bash -c 'source "$1"; prometheus_start "$2" --port 19190 --nodes "$3" ${4:+--scrape-interval "$4"}' x \
      "$REPO_DIR/utils/lib/prometheus.sh" "$job" "$nodes" "$given"
    [ "$status" -eq 1 ]
    [[ $output == *"prometheus exited at startup"*"stub prometheus"* ]]
    grep -qx "  scrape_interval: $want" "$cfg" || { cat "$cfg"; false; }
  done
  # without --nodes: a job of one node
  run bash -c 'source "$1"; prometheus_start "$2" --port 19190' x "$REPO_DIR/utils/lib/prometheus.sh" "$job"
  grep -qx "  scrape_interval: 5s" "$cfg"
}

@test "prometheus_start --nodes that is not a count: one line naming the fix, nothing started or written" {
  make_stub prometheus "touch '$BATS_TEST_TMPDIR/started'; exit 1"
  mkdir -p "$BATS_TEST_TMPDIR/job"
  for bad in 0 -3 x 1.5 ''; do
    run bash -c 'source "$1"; prometheus_start "$2" --nodes "$3"' x "$REPO_DIR/utils/lib/prometheus.sh" \
      "$BATS_TEST_TMPDIR/job" "$bad"
    [ "$status" -eq 1 ]
    [ "${#lines[@]}" -eq 1 ]
    [ "$output" = "prometheus.sh: start: node count '$bad' is not a whole number >= 1; pass --nodes N (the job's node count)" ]
  done
  [ ! -e "$BATS_TEST_TMPDIR/started" ]
  [ ! -e "$BATS_TEST_TMPDIR/job/prometheus" ]
}
