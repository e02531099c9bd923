#!/usr/bin/env bats
# The job log's header and summary (utils/lib/job_log.sh): shapes that tools parse.

load test_helper

setup() { source "$REPO_DIR/utils/lib/job_log.sh"; }

@test "local job ids look like local_<YYYYmmdd_HHMMSS>_<4 hex> and differ" {
  local a b
  a=$(new_local_job_id); b=$(new_local_job_id)
  [[ $a =~ ^local_[0-9]{8}_[0-9]{6}_[0-9a-f]{4}$ ]]
  [ "$a" != "$b" ] || [ "$(new_local_job_id)" != "$a" ]
}

@test "durations print as Hh Mm Ss, Mm Ss or Ss" {
  [ "$(format_duration 5)" = 5s ]
  [ "$(format_duration 65)" = "1m 5s" ]
  [ "$(format_duration 3725)" = "1h 2m 5s" ]
}

@test "header prints KEY=VALUE for set names only, arrays quoted and joined" {
  JOB_ID=42 MODEL_NAME=tiny
  PASSTHROUGH_ARGS=(steps=7 _env_FOO=bar)
  unset EXP_TAG
  run print_job_header JOB_ID EXP_TAG MODEL_NAME PASSTHROUGH_ARGS
  [ "${lines[0]}" = JOB_ID=42 ]
  [ "${lines[1]}" = MODEL_NAME=tiny ]
  [ "${lines[2]}" = 'PASSTHROUGH_ARGS="steps=7 _env_FOO=bar"' ]
  [ "${#lines[@]}" -eq 3 ]
  PASSTHROUGH_ARGS=()
  run print_job_header PASSTHROUGH_ARGS
  [ "$output" = 'PASSTHROUGH_ARGS=""' ]
}

@test "status word: cancelled beats exit code, 0 is success" {
  [ "$(job_status_word 0 0)" = SUCCESS ]
  [ "$(job_status_word 1 0)" = FAILED ]
  [ "$(job_status_word 143 1)" = CANCELLED ]
}

@test "summary block has the parsed fields and no colour when not a terminal" {
  run print_job_summary local_x JAX-tiny tiny 1 65 0 SUCCESS
  [ "${lines[0]}" = "==== JOB SUMMARY ====" ]
  [[ ${lines[1]} == *"Job:    local_x (JAX-tiny)" ]]
  [[ ${lines[4]} == *"Wall:   1m 5s" ]]
  [[ ${lines[5]} == *"Status: SUCCESS (exit 0)" ]]
  [[ $output != *$'\e['* ]]
}

@test "a RAY=1 job's Metrics line comes after Status, and logparse still reads the status" {
  run print_job_summary 31 JAX-tiny tiny 1 65 0 SUCCESS "" "off (prometheus.sh: apt-get install prometheus failed)"
  [[ ${lines[5]} == *"Status: SUCCESS (exit 0)" ]]
  [ "${lines[6]}" = "  Metrics: off (prometheus.sh: apt-get install prometheus failed)" ]
  [ "${lines[7]}" = "=====================" ]
  printf 'JOB_ID=31\nNNODES=1\n%s\n' "$output" >"$BATS_TEST_TMPDIR/31-JAX-tiny.log"
  source "$REPO_DIR/utils/lib/process.sh"
  run "$(proc_jobkit "$REPO_DIR")" tgs --line "$BATS_TEST_TMPDIR/31-JAX-tiny.log"  # the verdict reads the Status
  [[ $output == *" — PASS" ]]
  run print_job_summary 31 JAX-tiny tiny 1 65 0 SUCCESS
  [ "${lines[6]}" = "=====================" ]
}

@test "job_metrics_state: a RAY=1 job without a TSDB is off with the log's reason; with one, its TSDB; RAY unset, nothing" {
  source "$REPO_DIR/utils/lib/process.sh"
  local ws=$BATS_TEST_TMPDIR jobkit
  jobkit=$(proc_jobkit "$REPO_DIR")
  printf 'JOB_ID=31\nNNODES=2\nRAY=1\n0: [observability] metrics are off: prometheus.sh: apt-get install prometheus failed (training goes on)\n' >"$ws/31-a.log"
  mkdir -p "$ws/31-a/prometheus/targets"  # the exporter's targets dir alone is no TSDB
  [ "$(job_metrics_state "$jobkit" "$ws/31-a.log")" = "off (prometheus.sh: apt-get install prometheus failed)" ]
  printf 'JOB_ID=32\nNNODES=1\nRAY=1\n' >"$ws/32-b.log"
  [ "$(job_metrics_state "$jobkit" "$ws/32-b.log")" = "off (no TSDB, and the log says no reason)" ]
  mkdir -p "$ws/32-b/prometheus/wal"
  [ "$(job_metrics_state "$jobkit" "$ws/32-b.log")" = "$ws/32-b/prometheus" ]
  printf 'JOB_ID=33\nNNODES=1\nRAY=0\n' >"$ws/33-c.log"
  [ -z "$(job_metrics_state "$jobkit" "$ws/33-c.log")" ]
  # jobkit that cannot run: no Metrics line, and the summary goes on
  [ -z "$(job_metrics_state "$ws/no-such-jobkit" "$ws/31-a.log")" ]
}

@test "an OOM kill in the job's memory cgroup is counted and named; none, no note" {
  local own group
  own=/sys/fs/cgroup/memory$(awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3 }' /proc/self/cgroup)
  [[ $EUID -eq 0 && -w $own ]] || skip "needs root and a writable v1 memory cgroup"
  group=$own/bats-oom-$$
  mkdir "$group"
  echo $((64 << 20)) > "$group/memory.limit_in_bytes"
  # A shell in the group records the count, grows past the limit in a child (the kernel kills it), then
  # prints the note as a job would.
  run bash -c "echo \$\$ > '$group/tasks'; source '$REPO_DIR/utils/lib/job_log.sh'
    before=\$(memory_oom_kills); print_oom_kill_note \"\$before\"; echo \"before=\$before\"
    (python3 -c 'x = bytearray(256 << 20)') 2>/dev/null; echo \"child exit \$?\"; print_oom_kill_note \"\$before\"" 2>/dev/null
  rmdir "$group"
  [ "${lines[0]}" = "before=0" ]   # no note before anything was killed
  [[ $output == *$'\nchild exit 137\n'* ]]
  [[ ${lines[-1]} == "[job] oom-kill: the kernel's OOM killer ended 1 process(es) of this job"* ]]
}

@test "status word: an exit 0 after MaxText stopped training early is STOPPED, with where it can resume" {
  local log=$BATS_TEST_DIRNAME/../fixtures/joblog/preempted-2node-sigterm.log
  [ "$(job_status_word 0 0 "" "$log")" = STOPPED ]
  [ "$(job_status_word 0 1 "" "$log")" = CANCELLED ]
  [ "$(job_status_word 0 0 "")" = SUCCESS ]
  mkdir -p "$BATS_TEST_TMPDIR/ws/pre1/tiny/checkpoints/46"
  run job_stop_detail "$log" "$BATS_TEST_TMPDIR/ws" pre1
  [ "$output" = "Job received termination signal (SIGTERM); last step 45; checkpoint at step 46 in $BATS_TEST_TMPDIR/ws/pre1/tiny/checkpoints/46" ]
}

@test "status word: a _DEBUG trace of the summary's own search for an early stop is not an early stop" {
  printf '%s\n' "0: I1124 05:43:10.913525 1 train.py:1400] completed step: 2, seconds: 0.1" \
    "+ grep -m1 -o 'Training stopped: .*' /ws/1-JAX-tiny.log" \
    "0: ++ grep -m1 -o 'Training stopped: .*' /ws/1-JAX-tiny.log" >"$BATS_TEST_TMPDIR/debug.log"
  [ "$(job_status_word 0 0 "" "$BATS_TEST_TMPDIR/debug.log")" = SUCCESS ]
  echo "0: I1124 05:43:11.0 1 train.py:1454] Training stopped: Job received termination signal (SIGTERM)." \
    >>"$BATS_TEST_TMPDIR/debug.log"
  [ "$(job_status_word 0 0 "" "$BATS_TEST_TMPDIR/debug.log")" = STOPPED ]
}

@test "status word: an early stop is found under pipefail in a log far longer than a pipe's buffer" {
  # The batch script runs with pipefail: a search that cut its own pipe short (SIGPIPE) read as "not stopped".
  local log=$BATS_TEST_TMPDIR/long.log
  {
    echo "0: I1125 22:12:42.268580 1 train.py:1454] Training stopped: Job received termination signal (SIGTERM)."
    for ((i = 0; i < 4000; i++)); do echo "0: I1125 22:12:43.0 1 metric_logger.py:265] padding line $i of the log tail"; done
  } >"$log"
  set -o pipefail
  run job_stopped_early "$log"
  [ "$status" -eq 0 ] && [ "$output" = "Job received termination signal (SIGTERM)" ]
}

@test "status word: a reached target loss is a success; a hang marker makes a failure HANG" {
  printf 'I1124 05:43:10.913525 1 train.py:1454] Training stopped: Target loss self.config.target_eval_loss=2.0 is achieved.\n' \
    >"$BATS_TEST_TMPDIR/target.log"
  [ "$(job_status_word 0 0 "" "$BATS_TEST_TMPDIR/target.log")" = SUCCESS ]
  [ "$(job_status_word 143 0 "")" = FAILED ]
  local hang="phase training, last step 3, 9 s since"   # the marker's line, as `jobkit hang-watchdog --marker` gives it
  [ "$(job_status_word 143 0 "$hang")" = HANG ]
  [ "$(job_status_word 143 1 "$hang")" = CANCELLED ]
  # with checkpointing, MaxText answers the watchdog's TERM by saving and exiting 0: still a hang
  local stopped=$BATS_TEST_DIRNAME/../fixtures/joblog/preempted-2node-sigterm.log
  [ "$(job_status_word 0 0 "$hang" "$stopped")" = HANG ]
  # a hang reported (HANG_ACTION=report) that training got over, finishing its run: a success
  [ "$(job_status_word 0 0 "$hang" "$BATS_TEST_TMPDIR/target.log")" = SUCCESS ]
}

@test "cancel detail: Slurm's reason when it cancelled the job, else a person's scancel" {
  local log=$BATS_TEST_TMPDIR/j.log
  echo "slurmstepd-node1: error: *** JOB 148 ON node1 CANCELLED AT 2026-11-24T07:52:53 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***" >"$log"
  [ "$(job_cancel_detail "$log")" = "cancelled by Slurm: node failure" ]
  echo "slurmstepd: error: *** JOB 9 ON node1 CANCELLED AT 2026-11-24T07:52:53 DUE TO TIME LIMIT ***" >"$log"
  [ "$(job_cancel_detail "$log")" = "cancelled by Slurm: time limit" ]
  echo "slurmstepd: error: *** JOB 9 ON node1 CANCELLED AT 2026-11-24T07:52:53 ***" >"$log"
  [ "$(job_cancel_detail "$log")" = "scancel / SIGTERM" ]
  [ "$(job_cancel_detail "$BATS_TEST_TMPDIR/missing.log")" = "scancel / SIGTERM" ]
}
