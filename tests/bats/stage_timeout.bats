#!/usr/bin/env bats
# Stage time limits (utils/lib/stage_timeout.sh): defaults, STAGE_TIMEOUTS overrides and their errors, stage lines.

load test_helper

# The UTC time that ends every stage line (ISO 8601, seconds).
ISO_UTC='[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z'

# stage_line LINE REGEX: LINE is "== <REGEX> <UTC time> ==", whole.
stage_line() {
  local want="^== $2 $ISO_UTC ==\$"
  [[ $1 =~ $want ]] || { echo "not a stage line like '$2': $1"; false; }
}

setup() {
  source "$REPO_DIR/utils/lib/stage_timeout.sh"
  unset STAGE_TIMEOUTS
}

@test "defaults apply; overrides take seconds or none, case-insensitive, spaces tolerated" {
  stage_timeouts_init preflight:900 pull:900 ecc:300 train:none
  [ "${STAGE_LIMITS[preflight]}" = 900 ]
  [ "${STAGE_LIMITS[train]}" = none ]
  STAGE_TIMEOUTS="preflight:600, train:86400,ecc:NONE,pull:-1" stage_timeouts_init preflight:900 pull:900 ecc:300 train:none
  [ "${STAGE_LIMITS[preflight]}" = 600 ]
  [ "${STAGE_LIMITS[train]}" = 86400 ]
  [ "${STAGE_LIMITS[ecc]}" = none ]
  [ "${STAGE_LIMITS[pull]}" = none ]
}

@test "an unknown stage is rejected, listing the valid stages" {
  STAGE_TIMEOUTS="trian:5" run stage_timeouts_init preflight:900 train:none
  [ "$status" -ne 0 ]
  [[ $output == *"unknown stage 'trian'; valid stages:"*preflight* ]]
  [[ $output == *train* ]]
}

@test "0, text and a missing value are rejected with the valid forms" {
  STAGE_TIMEOUTS="train:0" run stage_timeouts_init train:none
  [ "$status" -ne 0 ]
  [[ $output == *"0 is ambiguous"* ]]
  STAGE_TIMEOUTS="train:soon" run stage_timeouts_init train:none
  [ "$status" -ne 0 ]
  [[ $output == *"'soon' for stage 'train' is not a positive number"* ]]
  STAGE_TIMEOUTS="train" run stage_timeouts_init train:none
  [ "$status" -ne 0 ]
  [[ $output == *"is not stage:seconds"* ]]
}

@test "the table shows every stage and how to override" {
  STAGE_TIMEOUTS="train:3" stage_timeouts_init preflight:900 train:none
  run print_stage_timeouts preflight train
  [[ ${lines[0]} == *'STAGE_TIMEOUTS="stage:seconds,...'* ]]
  [[ ${lines[1]} =~ preflight\ +900s ]]
  [[ ${lines[2]} =~ train\ +3s ]]
}

@test "a stage that finishes prints BEGIN and END and returns 0" {
  stage_timeouts_init train:5
  run run_stage train "Training" true
  [ "$status" -eq 0 ]
  stage_line "${lines[0]}" 'Training BEGIN \(timeout=5s\)'
  stage_line "${lines[1]}" 'Training END \([0-9]+s\)'
}

@test "stage lines carry the UTC time they were printed, so stages can be placed on a time axis" {
  stage_timeouts_init train:none
  local before after stamp
  before=$(date -u +%s)
  run run_stage train "Training" sleep 1
  after=$(date -u +%s)
  [[ ${lines[1]} =~ ($ISO_UTC) ]]
  stamp=$(date -u -d "${BASH_REMATCH[1]}" +%s)
  (( stamp >= before + 1 && stamp <= after ))   # END is stamped after the 1 s stage, not at BEGIN
  [[ ${lines[0]} =~ ($ISO_UTC) ]]
  stamp=$(date -u -d "${BASH_REMATCH[1]}" +%s)
  (( stamp >= before && stamp <= after - 1 ))
}

@test "a stage past its limit prints TIMEOUT with the override hint and is stopped" {
  stage_timeouts_init train:1
  local start=$SECONDS
  run run_stage train "Training" sleep 30
  [ "$status" -eq 124 ]
  (( SECONDS - start < 10 ))
  stage_line "$(grep '^== Training TIMEOUT' <<<"$output")" 'Training TIMEOUT \([0-9]+s/1s\)'
  [[ $output == *'STAGE_TIMEOUTS="train:<seconds>"'* ]]
}

@test "a failing stage prints FAILED with its exit code and sets the summary text" {
  stage_timeouts_init ecc:none
  run_stage ecc "ECC check" bash -c 'exit 3' >"$BATS_TEST_TMPDIR/out" || rc=$?
  [ "$rc" -eq 3 ]
  grep -qE "^== ECC check BEGIN \(no timeout\) $ISO_UTC ==$" "$BATS_TEST_TMPDIR/out"
  grep -q "== ECC check FAILED (exit=3, " "$BATS_TEST_TMPDIR/out"
  [ "$STAGE_FAILURE" = "ECC check FAILED (exit=3)" ]
}

@test "the run-and-triage skill shows the stage lines as the log has them" {
  local skill=$REPO_DIR/skills/run-and-triage/SKILL.md line
  stage_timeouts_init train:none
  line=$(run_stage train "Training" true | head -n 1)
  stage_line "$line" 'Training BEGIN \(no timeout\)'
  grep -qF -- "${line%% 20*} 20" "$skill"   # the same line, at another time
  stage_timeouts_init train:3600
  line=$(run_stage train "Training" true | head -n 1)
  grep -qF -- "${line%% 20*} 20" "$skill"
  line=$(run_stage train "Training" bash -c 'exit 1' | sed -n 2p)
  stage_line "$line" 'Training FAILED \(exit=1, [0-9]+s\)'
  grep -qE "== Training FAILED \(exit=[0-9]+, [0-9]+s\) $ISO_UTC ==" "$skill"
  grep -qE "== Training END \([0-9]+s\) $ISO_UTC ==" "$skill"
  grep -qE "== Training TIMEOUT \([0-9]+s/[0-9]+s\) $ISO_UTC ==" "$skill"
}
