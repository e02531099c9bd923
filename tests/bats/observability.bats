#!/usr/bin/env bats
# utils/lib/observability.sh pieces that need no Ray, Prometheus or training (RAY=1 jobs themselves run in
# tests/py/test_observability.py and test_slurm.py).

load test_helper

setup() {
  export JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws JOB_DIR=1-JAX-tiny JOB_ID=1 NNODES=1 NODE_RANK=0 TMPDIR=$BATS_TEST_TMPDIR
  mkdir -p "$JOB_WORKSPACE/$JOB_DIR"
  source "$REPO_DIR/utils/lib/observability.sh"
}

@test "_obs_init: the job's .ray dir (rank 0's verdict for the others, the Ray token) is made private" {
  _obs_init
  [ "$(stat -c %a "$JOB_WORKSPACE/$JOB_DIR/.ray")" = 700 ]
  # Ray's temp dir: fresh, private, not a name another user could guess and plant first.
  [[ ${_OBS[ray_tmp]} == /tmp/mxray.?????? ]]
  [ "$(stat -c %u:%a "${_OBS[ray_tmp]}")" = "$EUID:700" ]
  rm -rf "${_OBS[state]}" "${_OBS[ray_tmp]}"
}

@test "_obs_init: a .ray dir that others may write (a teammate's plant) turns observability off, creating nothing" {
  mkdir -m 0777 "$JOB_WORKSPACE/$JOB_DIR/.ray"
  chmod 0777 "$JOB_WORKSPACE/$JOB_DIR/.ray"
  local before
  before=$(find /tmp -maxdepth 1 -name 'mxray.*' 2>/dev/null | sort)
  run _obs_init
  [ "$status" -eq 1 ]
  [ "$output" = "[observability] [!] $JOB_WORKSPACE/$JOB_DIR/.ray is writable by group or others (mode 777): training without observability (remove it, or use a job dir only you can write)" ]
  [ "$(find /tmp -maxdepth 1 -name 'mxray.*' 2>/dev/null | sort)" = "$before" ]
  ! compgen -G "$BATS_TEST_TMPDIR/obs.*" >/dev/null || false
}
