#!/usr/bin/env bats
# utils/lib/settings.sh: numeric settings are checked as text before any arithmetic evaluates them.

load test_helper

setup() {
  # shellcheck source=utils/lib/settings.sh
  source "$REPO_DIR/utils/lib/settings.sh"
  cd "$BATS_TEST_TMPDIR"
}

@test "setting_uint: the value, the default when unset or empty, leading zeros as decimal" {
  unset WAIT_S
  [ "$(setting_uint WAIT_S 90)" = 90 ]
  WAIT_S="" ; [ "$(setting_uint WAIT_S 90)" = 90 ]
  WAIT_S=0  ; [ "$(setting_uint WAIT_S 90)" = 0 ]
  WAIT_S=010; [ "$(setting_uint WAIT_S 90)" = 10 ]
}

@test "setting_uint: an expression is refused as text and never evaluated (the arithmetic canary)" {
  local value
  for value in 'a[$(touch canary)]' 'BASH_VERSINFO[$(touch canary)]' '1+1' '-5' ' 7' '1e3' '0x10' '1234567890'; do
    WAIT_S=$value run setting_uint WAIT_S 90
    [ "$status" -eq 2 ]
    [[ $output == *"WAIT_S="*"is not a whole number"*"WAIT_S=90"* ]]
    [ "${#lines[@]}" -eq 1 ]
  done
  [ ! -e canary ]
}

@test "no setting from the environment reaches shell arithmetic unchecked" {
  # ${NAME:-default} inside $((...)) or ((...)) evaluates NAME's text: read it through setting_uint first.
  run grep -rnE '\(\([^)]*\$\{[A-Z][A-Z0-9_]*:-' "$REPO_DIR"/*.sh "$REPO_DIR/_job.sbatch" "$REPO_DIR/utils"
  [ "$status" -eq 1 ] || { echo "$output"; false; }
}
