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
  # One shellcheck per core, each on its share of the files: one process for all took ~34 s of the fast tier.
  local cores per
  cores=$(nproc)
  per=$(( (${#files[@]} + cores - 1) / cores ))
  run bash -c 'c=$1 n=$2; shift 2; printf "%s\0" "$@" | xargs -0 -P "$c" -n "$n" shellcheck -x -S warning' \
    _ "$cores" "$per" "${files[@]}"
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

@test "hadolint: every Containerfile is clean" {
  local -a files=()
  mapfile -t files < <(find "$REPO_DIR" -path "$REPO_DIR/.git" -prune -o -path "$REPO_DIR/.venv" -prune \
    -o -path "$REPO_DIR/.cache" -prune -o -type f \( -name 'Containerfile*' -o -name 'Dockerfile*' \) -print)
  (( ${#files[@]} > 0 ))
  run hadolint --no-color "${files[@]}"
  echo "$output"
  [ "$status" -eq 0 ]
}

@test "ruff: py/ and tests/py lint clean and formatted (config in py/pyproject.toml)" {
  cd "$REPO_DIR/py"
  run ruff check --no-cache . ../tests/py ../utils/plugins
  echo "$output"
  [ "$status" -eq 0 ]
  run ruff format --no-cache --check . ../tests/py ../utils/plugins
  echo "$output"
  [ "$status" -eq 0 ]
}

@test "every jobkit command and subcommand prints its help; no PYTHONPATH is set by hand anywhere" {
  run jobkit --help
  [ "$status" -eq 0 ]
  local -a commands
  mapfile -t commands < <(sed -n '/^Commands:/,$p' <<<"$output" | awk 'NR > 1 && NF {print $1}')
  [ "${#commands[@]}" -ge 8 ]
  local cmd sub
  for cmd in "${commands[@]}"; do
    run jobkit "$cmd" --help
    [ "$status" -eq 0 ] || { echo "jobkit $cmd --help: status $status: $output"; false; }
    [[ $output == *Usage:* || $output == usage:* ]] || { echo "jobkit $cmd --help: $output"; false; }
    for sub in $(sed -n '/^Commands:/,$p' <<<"$output" | awk 'NR > 1 && NF {print $1}'); do
      run jobkit "$cmd" "$sub" --help
      [ "$status" -eq 0 ] || { echo "jobkit $cmd $sub --help: status $status: $output"; false; }
    done
  done
  cd "$REPO_DIR"
  # (a test may look for '^PYTHONPATH=' in a process's environment to prove it is not there)
  run git grep -nE '(^|[^^])PYTHONPATH=' -- ':!tests/bats/lint.bats'
  echo "$output"
  [ "$status" -ne 0 ]
}

@test "utils/ layout: commands at the top, sourced libraries in lib/, metrics plugins in plugins/" {
  cd "$REPO_DIR"
  local f
  for f in utils/*.sh; do   # commands: executable, a Usage header that --help prints
    [ -x "$f" ] || { echo "$f: a command must be executable"; false; }
    run "$f" --help
    [ "$status" -eq 0 ] && [[ ${lines[0]} == "Usage: "* ]] || { echo "$f --help: $output"; false; }
  done
  for f in utils/lib/*; do   # libraries: sourced only, and sourcing must not change the caller's shell options
    [ ! -x "$f" ] || { echo "$f: a sourced library must not be executable"; false; }
    ! grep -Eq '^set -[a-z]*e' "$f" || { echo "$f: a library must not set shell options"; false; }
  done
  for f in utils/plugins/*; do   # the exporter runs every executable *_metrics_plugin.sh and *_metrics_plugin.py here
    [[ ($f == *_metrics_plugin.sh || $f == *_metrics_plugin.py) && -x $f ]] || { echo "$f: only executable *_metrics_plugin.sh/.py belong here"; false; }
  done
  # nothing else that looks like a plugin or a library sits at the top
  run find utils -maxdepth 1 -name '*_metrics_plugin.sh'
  [ -z "$output" ]
}
