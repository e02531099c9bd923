#!/usr/bin/env bats
# submit.sh front door without a cluster: every bad input gives one clear line, a non-zero exit, and
# creates nothing. (Real submissions to a local Slurm cluster are in tests/py/test_slurm.py.)

load test_helper

setup() {
  export JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws CONTAINER_RUNTIME=none
  # An sbatch that must never be reached by these tests.
  make_stub sbatch "echo called >'$BATS_TEST_TMPDIR/sbatch-called'; exit 1"
  make_stub scontrol 'exit 0'
}

bad_input() {
  run "$REPO_DIR/submit.sh" "$@"
  [ "$status" -ne 0 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ ${lines[0]} == submit.sh:* ]]
  [ ! -e "$JOB_WORKSPACE" ]
  [ ! -e "$BATS_TEST_TMPDIR/sbatch-called" ]
}

@test "--help prints usage" {
  run "$REPO_DIR/submit.sh" --help
  [ "$status" -eq 0 ]
  [[ ${lines[0]} == "Usage: submit.sh"* ]]
}

@test "the foundation's bad inputs are refused the same way through submit.sh" {
  bad_input nosuchmodel -N 1
  [[ $output == *"unknown model 'nosuchmodel'"* ]]
  bad_input llama3 -N 1
  [[ $output == *"ambiguous model 'llama3'"* ]]
  bad_input a:b:c:d
  [[ $output == *"too many ':'"* ]]
  bad_input ""
  [[ $output == *"empty model spec"* ]]
  bad_input tiny -- steps
  [[ $output == *"not key=value"* ]]
  bad_input tiny -- _env_=1
  [[ $output == *"names no variable"* ]]
  bad_input tiny -- "run_name=$(printf 'x%.0s' $(seq 240))"
  [[ $output == *"limit 255"* ]]
  CONTAINER_RUNTIME=lxc bad_input tiny
  [[ $output == *"unknown CONTAINER_RUNTIME 'lxc'"* ]]
}

@test "-N must be a positive count or a min-max range" {
  bad_input tiny -N x
  [[ $output == *"node count 'x' is not a positive number"* ]]
  bad_input tiny -N 0
  [[ $output == *"node count '0'"* ]]
  bad_input tiny --nodes=-2
  [[ $output == *"node count '-2'"* ]]
  bad_input tiny -N
  [[ $output == *"node count ''"* ]]
  bad_input tiny -N 3-1
  [[ $output == *"node count '3-1' has its minimum above its maximum"*"-N 1-3" ]]
  bad_input tiny --nodes=10-9
  [[ $output == *"node count '10-9' has its minimum above its maximum"* ]]
}

@test "STAGE_TIMEOUTS with an unknown stage, 0 or text is refused before submitting" {
  STAGE_TIMEOUTS="warmup:5" bad_input tiny -N 1
  [[ $output == *"unknown stage 'warmup'; valid stages:"* ]]
  STAGE_TIMEOUTS="train:0" bad_input tiny -N 1
  [[ $output == *"0 is ambiguous"* ]]
  STAGE_TIMEOUTS="train:later" bad_input tiny -N 1
  [[ $output == *"'later' for stage 'train'"* ]]
}

@test "MAX_RETRIES, TIME_LIMIT_SIGNAL_LEAD and REQUEUE_ARTIFACT are checked before submitting" {
  MAX_RETRIES=abc bad_input tiny -N 1
  [[ $output == *"MAX_RETRIES='abc' is not a number of retries; set MAX_RETRIES=0 (no requeue) or e.g. MAX_RETRIES=2"* ]]
  MAX_RETRIES=-1 bad_input tiny -N 1
  TIME_LIMIT_SIGNAL_LEAD=0 bad_input tiny -N 1
  [[ $output == *"TIME_LIMIT_SIGNAL_LEAD='0' is not a number of seconds from 1 to 65535"* ]]
  TIME_LIMIT_SIGNAL_LEAD=99999 bad_input tiny -N 1
  REQUEUE_ARTIFACT=$BATS_TEST_TMPDIR bad_input tiny -N 1
  [[ $output == *"is not a code snapshot (no _job.sbatch)"* ]]
}

@test "Slurm is asked to warn the job before its time limit, unless the user set their own --signal" {
  # each call a new job id, as Slurm gives
  make_stub sbatch 'printf "%s\n" "$@" >"'"$BATS_TEST_TMPDIR"'/sbatch.args"; echo x >>"'"$BATS_TEST_TMPDIR"'/n"; wc -l <"'"$BATS_TEST_TMPDIR"'/n"'
  make_stub squeue 'echo RUNNING'
  TIME_LIMIT_SIGNAL_LEAD=120 EARLY_DEATH_CHECK_SECONDS=0 run "$REPO_DIR/submit.sh" tiny -N 1 --time=5
  [ "$status" -eq 0 ]
  grep -qx -- '--signal=B:USR1@120' "$BATS_TEST_TMPDIR/sbatch.args"
  EARLY_DEATH_CHECK_SECONDS=0 run "$REPO_DIR/submit.sh" tiny -N 1 --signal=B:USR2@60
  [ "$status" -eq 0 ]
  [ "$(grep -c -- '--signal' "$BATS_TEST_TMPDIR/sbatch.args")" -eq 1 ]
  grep -qx -- '--signal=B:USR2@60' "$BATS_TEST_TMPDIR/sbatch.args"
}

@test "no Slurm on PATH: says how to get one, including the local cluster" {
  # Only what submit.sh needs up to its sbatch check: a real Slurm installed on this machine must not count.
  local bin=$BATS_TEST_TMPDIR/bin tool
  mkdir -p "$bin"
  for tool in bash env dirname sort; do ln -s "$(command -v "$tool")" "$bin/$tool"; done
  PATH=$bin bad_input tiny -N 1
  [[ $output == *"no sbatch on PATH"*"utils/local_cluster.sh up -N 2"* ]]
  # the line ends with the command to copy, not with the exit code
  [[ $output == *' && eval "$(utils/local_cluster.sh env)"' ]]
}

@test "JOB_WORKSPACE that cannot be written is refused" {
  JOB_WORKSPACE=/proc/ws run "$REPO_DIR/submit.sh" tiny -N 1
  [ "$status" -ne 0 ]
  [[ $output == *"JOB_WORKSPACE=/proc/ws is not writable"* ]]
}

@test "sbatch refusing the job: its message is shown and the snapshot is removed" {
  make_stub sbatch 'echo "sbatch: error: unrecognized option '"'"'--bogus'"'"'" >&2; exit 1'
  run "$REPO_DIR/submit.sh" tiny --bogus
  [ "$status" -ne 0 ]
  [[ $output == *"sbatch refused the job: sbatch: error: unrecognized option '--bogus'"* ]]
  [ -z "$(ls -A "$JOB_WORKSPACE/.artifacts" 2>/dev/null)" ]
  [ ! -e "$JOB_WORKSPACE/.artifacts" ]
}

# refused_by_sbatch MESSAGE...: an sbatch that prints MESSAGE lines on stderr and fails, as a real one does.
refused_by_sbatch() {
  local body="" line
  for line; do body+="echo $(printf '%q' "$line") >&2; "; done
  make_stub sbatch "${body}exit 1"
  run "$REPO_DIR/submit.sh" tiny -N 2
  [ "$status" -ne 0 ]
  [ "$(grep -c '^submit.sh: ' <<<"$output")" -eq 1 ]
  [[ ${lines[-1]} == "submit.sh: "* ]]
  [ ! -e "$JOB_WORKSPACE/.artifacts" ]
}

@test "sbatch with no Slurm configuration or controller behind it: says so instead of blaming the arguments" {
  refused_by_sbatch "sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host" \
    "sbatch: error: fetch_config: DNS SRV lookup failed" \
    "sbatch: error: _establish_config_source: failed to fetch config" \
    "sbatch: fatal: Could not establish a configuration source"
  [[ $output == *"no Slurm configuration or controller is reachable from this host"*"set SLURM_CONF"*"login node"* ]]
  [[ $output == *"; sbatch said: sbatch: error: resolve_ctls_from_dns_srv"* ]]
  [[ $output != *"fix the sbatch arguments"* ]]

  refused_by_sbatch "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"
  [[ $output == *"no Slurm configuration or controller is reachable"*"set SLURM_CONF"* ]]

  refused_by_sbatch "sbatch: error: s_p_parse_file: unable to status file /etc/slurm/slurm.conf: No such file or directory, retrying in 1sec up to 60sec" \
    "sbatch: fatal: Unable to process configuration file"
  [[ $output == *"no Slurm configuration or controller is reachable"* ]]

  refused_by_sbatch "sbatch: error: Munge encode failed: Failed to access \"/run/munge/munge.socket.2\": No such file or directory (retrying ...)" \
    "sbatch: error: Batch job submission failed: Protocol authentication error"
  [[ $output == *"munge is not running"* ]]
}

# submit_ok ARGS...: submit.sh with a docker runtime stub and an sbatch that accepts the job (ids 4201,
# 4202, ...) and records its argv, one argument per line; squeue says the job runs.
submit_ok() {
  make_stub docker 'exit 0'
  make_stub sbatch "printf '%s\\n' \"\$@\" >'$BATS_TEST_TMPDIR/sbatch.argv'
    echo x >>'$BATS_TEST_TMPDIR/sbatch.count'; echo \$((4200 + \$(wc -l <'$BATS_TEST_TMPDIR/sbatch.count')))"
  make_stub squeue 'echo RUNNING'
  CONTAINER_RUNTIME=docker EARLY_DEATH_CHECK_SECONDS=1 run "$REPO_DIR/submit.sh" "$@"
  [ "$status" -eq 0 ]
  [[ $output == *"Submitted job 42"[0-9][0-9]" (JAX-tiny)"* ]]
}

@test "the batch script asks for all of each node's memory (--mem=0), among its leading #SBATCH lines" {
  submit_ok tiny -N 1
  local script
  script=$(grep '/_job.sbatch$' "$BATS_TEST_TMPDIR/sbatch.argv")
  # sbatch reads #SBATCH lines only up to the first command
  sed -n '2,/^[^#]/p' "$script" | grep -qx '#SBATCH --mem=0'
}

@test "the node-local workspace warning is only for jobs that may span several nodes" {
  make_stub df 'printf "Filesystem Type 1024-blocks Used Available Capacity Mounted\n/dev/sda1 ext4 1 1 1 1%% /\n"'
  submit_ok tiny -N 1
  [[ $output != *"node-local"* ]]
  submit_ok tiny
  [[ $output != *"node-local"* ]]
  submit_ok tiny -w node1
  [[ $output != *"node-local"* ]]
  submit_ok tiny -N 2
  [[ $output == *"WARNING: JOB_WORKSPACE=$JOB_WORKSPACE is on 'ext4', which is usually node-local"* ]]
  submit_ok tiny --nodes=1-2
  [[ $output == *"node-local"* ]]
  submit_ok tiny -w 'node[1-2]'
  [[ $output == *"node-local"* ]]
}

@test "a checkpoint dir of the alias that is another user's is refused before anything is made" {
  [[ $EUID == 0 ]] || skip "planting a teammate's dir needs root (chown)"
  mkdir -p "$JOB_WORKSPACE/tiny/checkpoints/2" && chown -R 65534:65534 "$JOB_WORKSPACE/tiny"
  run "$REPO_DIR/submit.sh" tiny -N 1 -- enable_checkpointing=true
  [ "$status" -eq 2 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ ${lines[0]} == "submit.sh: checkpoint dir $JOB_WORKSPACE/tiny belongs to uid 65534, not to you (uid 0): "* ]]
  [ "$(ls -A "$JOB_WORKSPACE")" = tiny ]   # no snapshot, no log dir
  [ ! -e "$BATS_TEST_TMPDIR/sbatch-called" ]
}

# submitted_job: submit_ok tiny -N 1 with an sbatch stub that also keeps the job's environment, then a copy of
# the batch script where Slurm keeps it (outside the workspace). Sets SNAP, SHA and BATCH.
submitted_job() {
  make_stub docker 'exit 0'
  make_stub sbatch "printf '%s\\n' \"\$@\" >'$BATS_TEST_TMPDIR/sbatch.argv'
    printf '%s\\n' \"\$MAXTEXT_LAUNCHER_DIR\" \"\$ARTIFACT_SHA256\" >'$BATS_TEST_TMPDIR/sbatch.env'; echo 4301"
  make_stub squeue 'echo RUNNING'
  CONTAINER_RUNTIME=docker EARLY_DEATH_CHECK_SECONDS=1 run "$REPO_DIR/submit.sh" tiny -N 1
  [ "$status" -eq 0 ]
  { read -r SNAP; read -r SHA; } <"$BATS_TEST_TMPDIR/sbatch.env"
  BATCH=$BATS_TEST_TMPDIR/slurmd-spool-job.sbatch
  cp "$(grep '/_job.sbatch$' "$BATS_TEST_TMPDIR/sbatch.argv")" "$BATCH"
}

# run_batch: the stored batch script as Slurm starts it, with the job's environment (no Slurm here: a
# script that passes the snapshot check stops later, at the first SLURM_* name).
run_batch() {
  run env MAXTEXT_LAUNCHER_DIR="$SNAP" ARTIFACT_SHA256="$SHA" bash "$BATCH" tiny -- steps=1
}

@test "the snapshot is in a private per-user dir and its sha256 goes to the job (F2)" {
  submitted_job
  [ "$SNAP" = "$JOB_WORKSPACE/.artifacts/$(id -un)/$(basename "$SNAP")" ]
  [ "$(stat -c %a "$JOB_WORKSPACE/.artifacts/$(id -un)")" = 700 ]
  [ -k "$JOB_WORKSPACE/.artifacts" ]   # sticky: nobody renames another user's dir in it
  [[ $SHA =~ ^[0-9a-f]{64}$ ]]
  [ "$SHA" = "$("$REPO_DIR/_job.sbatch" --snapshot-sha256 "$SNAP")" ]
  [ "$(readlink "$JOB_WORKSPACE/4301-JAX-tiny/artifact")" = "../.artifacts/$(id -un)/$(basename "$SNAP")" ]
  run_batch
  [[ $output != *"refusing to run"* ]]
  [[ $output == *"SLURM_JOB_"*": unbound variable"* ]]   # got past the check, to the Slurm names
}

@test "a snapshot swapped while the job is queued is refused before any of it runs (F2)" {
  submitted_job
  local canary=$BATS_TEST_TMPDIR/payload-ran
  # What the audit's teammate did: move the snapshot aside and put a copy with a payload in its place.
  mv "$SNAP" "$SNAP.orig"
  cp -a "$SNAP.orig" "$SNAP"
  chmod u+w "$SNAP/utils/lib/job_log.sh"
  echo "touch '$canary'" >>"$SNAP/utils/lib/job_log.sh"
  chmod u-w "$SNAP/utils/lib/job_log.sh"
  run_batch
  [ "$status" -eq 2 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ ${lines[0]} == "_job.sbatch: refusing to run: the code snapshot $SNAP changed after submit (sha256 "*", submitted $SHA); resubmit with submit.sh" ]]
  [ ! -e "$canary" ]
  # A requeue of that job (its submit-time ARTIFACT_SHA256, the same snapshot) is refused too.
  REQUEUE_ARTIFACT=$SNAP ARTIFACT_SHA256=$SHA CONTAINER_RUNTIME=docker run "$REPO_DIR/submit.sh" tiny -N 1
  [ "$status" -eq 2 ]
  [[ ${lines[-1]} == "submit.sh: the snapshot $SNAP changed since the first attempt was submitted"* ]]
}

@test "a snapshot or user dir someone else owns or may write is refused, as is a job without the hash (F2)" {
  submitted_job
  local user_dir=${SNAP%/*}
  chmod g+w "$user_dir"
  run_batch
  [ "$status" -eq 2 ]
  [ "$output" = "_job.sbatch: refusing to run: $user_dir is writable by group or others (mode 720); resubmit with submit.sh" ]
  chmod g-w "$user_dir"
  if [ "$(id -u)" -eq 0 ]; then
    chown 65534 "$SNAP"
    run_batch
    [ "$status" -eq 2 ]
    [ "$output" = "_job.sbatch: refusing to run: $SNAP is owned by uid 65534, not by this job's uid 0; resubmit with submit.sh" ]
    chown 0 "$SNAP"
  fi
  SHA="" run_batch
  [ "$status" -eq 2 ]
  [[ $output == *"refusing to run: ARTIFACT_SHA256 (the code snapshot's hash) is not set; submit jobs with submit.sh" ]]
}

# refused_before_job ARGS...: submit.sh refuses in one line (exit 2), sbatch is never called and the workspace
# holds only what the test put there: no snapshot under .artifacts, no log dir.
refused_before_job() {
  local before
  before=$(cd "$JOB_WORKSPACE" && find . | sort)
  run "$REPO_DIR/submit.sh" "$@"
  [ "$status" -eq 2 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ ${lines[0]} == submit.sh:* ]]
  [ "$(cd "$JOB_WORKSPACE" && find . | sort)" = "$before" ]
  [ ! -e "$BATS_TEST_TMPDIR/sbatch-called" ]
}

@test "a bad TUNE_PROFILE_FILE or an unknown TUNE_PROFILE is refused before the snapshot and sbatch" {
  mkdir -p "$JOB_WORKSPACE/tp"
  TUNE_PROFILE_FILE=nosuch.profile refused_before_job tiny -N 1 -- steps=3
  [[ $output == *"TUNE_PROFILE_FILE=nosuch.profile: no readable file at $JOB_WORKSPACE/nosuch.profile"* ]]
  refused_before_job tiny -N 1 -- steps=3 _env_TUNE_PROFILE_FILE=tp
  [[ $output == *"TUNE_PROFILE_FILE=tp: $JOB_WORKSPACE/tp is a directory"* ]]
  printf '%s\n' '--xla_ok=1' 'this is not a flag' >"$JOB_WORKSPACE/tp/badline.profile"
  TUNE_PROFILE_FILE=tp/badline.profile refused_before_job tiny -N 1
  [[ $output == *"tp/badline.profile:2: 'this is not a flag' is not an XLA flag"* ]]
  printf 'NCCL_X=\001\000\377\n' >"$JOB_WORKSPACE/tp/garbage.profile"
  TUNE_PROFILE_FILE=tp/garbage.profile refused_before_job tiny -N 1
  [[ $output == *"is not a text file"* && $output != *[[:cntrl:]]* ]]
  TUNE_PROFILE=nosuch refused_before_job tiny -N 1
  [[ $output == *"TUNE_PROFILE='nosuch' is not a tuning profile; use one of: "* ]]
}
