#!/usr/bin/env bats
# utils/lib/workspace.sh: where the workspace is, whether it takes files, and the umask a job writes under.

load test_helper

setup() {
  # shellcheck source=utils/lib/workspace.sh
  source "$REPO_DIR/utils/lib/workspace.sh"
  cd "$BATS_TEST_TMPDIR"
}

@test "workspace_umask: private by default, a team's umask when asked, exported for the other tiers" {
  unset JOB_UMASK
  umask 022
  workspace_umask
  [ "$(umask)" = 0077 ] && [ "$JOB_UMASK" = 077 ]
  touch private && [ "$(stat -c %a private)" = 600 ]
  JOB_UMASK=027 workspace_umask
  [ "$(umask)" = 0027 ]
  mkdir team && [ "$(stat -c %a team)" = 750 ]
  [ "$(bash -c 'echo $JOB_UMASK')" = 027 ]
}

@test "workspace_umask: a value that is not an octal umask is one line, and the umask is left as it was" {
  local bad
  umask 022
  for bad in 78 abc '0777 ' '$(touch canary)' 1234 -077; do
    JOB_UMASK=$bad run workspace_umask
    [ "$status" -eq 1 ]
    [ "${#lines[@]}" -eq 1 ]
    [[ $output == *"JOB_UMASK="*"is not an octal umask"*"027 / 007"* ]]
  done
  [ "$(umask)" = 0022 ] && [ ! -e canary ]
}

@test "run_local.sh: a bad JOB_UMASK stops before anything is made" {
  local ws=$BATS_TEST_TMPDIR/ws
  JOB_UMASK=9 JOB_WORKSPACE=$ws CONTAINER_RUNTIME=none run "$REPO_DIR/run_local.sh" tiny
  [ "$status" -eq 2 ]
  [[ $output == *"JOB_UMASK=9 is not an octal umask"* ]]
  [ ! -e "$ws" ] || [ -z "$(ls -A "$ws")" ]
}
