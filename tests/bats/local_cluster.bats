#!/usr/bin/env bats
# utils/local_cluster.sh's state dir (LOCAL_CLUSTER_DIR, default /tmp/mxlc): root's Slurm config, pid files and
# state live there, so a dir another user made first is refused before anything starts. These tests never
# start a cluster (another test run may be using the real one): every tool `up` would reach for is a stub
# that fails, so even a regression here could not build a network or start a daemon.

load test_helper

setup() {
  [[ $EUID == 0 ]] || skip "local_cluster.sh up/down need root"
  for tool in ip nsenter unshare apt-get slurmctld slurmd munged mungekey sinfo squeue scancel flock; do
    make_stub "$tool" "echo \"stub $tool called\" >>'$BATS_TEST_TMPDIR/called'; exit 1"
  done
  export LOCAL_CLUSTER_DIR=$BATS_TEST_TMPDIR/lc
}

# refused CMD: local_cluster.sh CMD fails with one line naming the state dir, and nothing was run or made.
refused() {
  run "$REPO_DIR/utils/local_cluster.sh" "$@"
  [ "$status" -eq 1 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ ${lines[0]} == "local_cluster.sh: state dir $LOCAL_CLUSTER_DIR "*": another user could steer root's cluster through it; remove it (check what it holds first) or set LOCAL_CLUSTER_DIR to a dir of root's" ]]
  [ ! -e "$BATS_TEST_TMPDIR/called" ]
  [ -z "$(ls -A "$LOCAL_CLUSTER_DIR")" ]   # no lock, no conf, no pids
}

@test "a state dir another user made is refused by up, down, status and env" {
  mkdir -m 0755 "$LOCAL_CLUSTER_DIR" && chown 65534:65534 "$LOCAL_CLUSTER_DIR"
  for cmd in up down status env; do
    refused "$cmd"
    [[ ${lines[0]} == *"lc belongs to uid 65534, not to uid 0:"* ]]
  done
}

@test "a state dir of root's that group or others can write is refused; a link is refused" {
  mkdir -m 0777 "$LOCAL_CLUSTER_DIR"
  refused up
  [[ ${lines[0]} == *"lc is writable by group or others (mode 777):"* ]]
  rmdir "$LOCAL_CLUSTER_DIR" && mkdir -m 0755 "$BATS_TEST_TMPDIR/theirs" && ln -s theirs "$LOCAL_CLUSTER_DIR"
  run "$REPO_DIR/utils/local_cluster.sh" up
  [ "$status" -eq 1 ]
  [[ ${lines[0]} == *"state dir $LOCAL_CLUSTER_DIR is a symlink:"* ]]
  [ -z "$(ls -A "$BATS_TEST_TMPDIR/theirs")" ]
}

@test "up creates a missing state dir as root's, 0755 (munged, user munge, reaches its socket inside)" {
  run "$REPO_DIR/utils/local_cluster.sh" up   # stops at the first stubbed tool (flock), after the check
  [ "$status" -ne 0 ]
  [ "$(stat -c '%u %a' "$LOCAL_CLUSTER_DIR")" = "0 755" ]
  [[ $output != *"state dir"* ]]
}

@test "status and env of a state dir that does not exist create nothing" {
  run "$REPO_DIR/utils/local_cluster.sh" status
  [ "$status" -eq 1 ] && [[ $output == *"down (no cluster recorded in $LOCAL_CLUSTER_DIR)"* ]]
  [ ! -e "$LOCAL_CLUSTER_DIR" ]
}

@test "up installs what a RAY=1 job needs first, and says so when Prometheus cannot be had" {
  rm "$BATS_TEST_TMPDIR/stubs/flock"   # the real lock, so that up gets past it to its set-up (every daemon stays a stub)
  PROMETHEUS_BIN=$BATS_TEST_TMPDIR/no-prometheus run "$REPO_DIR/utils/local_cluster.sh" up
  [ "$status" -ne 0 ]   # a stubbed tool stops it later
  [[ $output == *"[local_cluster] warning: no Prometheus ("*"no-prometheus"*"): RAY=1 jobs on this cluster will run with metrics off"* ]]
  [[ $(<"$BATS_TEST_TMPDIR/called") != *"stub apt-get"* ]]   # PROMETHEUS_BIN was given: nothing is installed in its place
}
