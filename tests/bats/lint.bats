#!/usr/bin/env bats
# Every shell file in the project is shellcheck-clean, and every entry point prints its usage on --help.

load test_helper

shell_files() {
  cd "$REPO_DIR" && git ls-files -co --exclude-standard -- '*.sh' '*.bash' '*.bats' '*.sbatch' '.ci/run'
}

@test "shellcheck finds nothing at warning level or above" {
  cd "$REPO_DIR"
  mapfile -t files < <(shell_files | grep -v '\.bats$')
  [ "${#files[@]}" -gt 5 ]
  run shellcheck -x -S warning "${files[@]}"
  echo "$output"
  [ "$status" -eq 0 ]
}

@test "entry points have a Usage/Summary header that --help prints" {
  local f
  for f in run_local.sh submit.sh _container.sh _train.sh utils/setup_env.sh tests/run.sh; do
    grep -q '^# Usage: ' "$REPO_DIR/$f"
    grep -q '^# Summary: ' "$REPO_DIR/$f"
    run "$REPO_DIR/$f" --help
    [ "$status" -eq 0 ]
    [[ ${lines[0]} == "Usage: "* ]]
  done
}
