# shellcheck shell=bash
# Helpers for container.bats: a sealed PATH with stub runtimes, a throwaway scripts dir, argv assertions.

STUBS_DIR=$BATS_TEST_DIRNAME/stubs

# make_sandbox [STUB...]: $SANDBOX_BIN holds the few real tools the scripts need plus the named stubs, and
# nothing else, so a docker, podman or nvidia-smi installed on this machine can never answer.
make_sandbox() {
  SANDBOX_BIN=$BATS_TEST_TMPDIR/bin
  mkdir -p "$SANDBOX_BIN"
  local tool
  for tool in bash env timeout sleep mkdir dirname cat; do
    ln -sf "$(command -v "$tool")" "$SANDBOX_BIN/$tool"
  done
  for tool in "$@"; do ln -sf "$STUBS_DIR/$tool" "$SANDBOX_BIN/$tool"; done
}

# make_scripts_copy: $SCRIPTS is a copy of the container tier's files with a stub _train.sh that prints its
# argv (ARG[...] per argument), a few variables (NAME=value or NAME=<unset>) and its cwd, then exits
# $TRAIN_EXIT.
make_scripts_copy() {
  SCRIPTS=$BATS_TEST_TMPDIR/scripts
  mkdir -p "$SCRIPTS/utils/lib" "$SCRIPTS/configs"
  cp "$REPO_DIR/_container.sh" "$SCRIPTS/"
  cp "$REPO_DIR/utils/lib/container_runtime.sh" "$REPO_DIR/utils/lib/process.sh" "$SCRIPTS/utils/lib/"
  cp "$REPO_DIR/configs/container_settings.sh" "$SCRIPTS/configs/"
  cat >"$SCRIPTS/_train.sh" <<'EOF'
#!/usr/bin/env bash
printf 'ARG[%s]\n' "$@"
for v in VIRTUAL_ENV SECRET_TOKEN JOB_ID NODE_RANK JOB_WORKSPACE MAXTEXT_REPO_DIR; do
  printf '%s=%s\n' "$v" "${!v-<unset>}"
done
printf 'PATH0=%s\n' "${PATH%%:*}"
printf 'CWD=%s\n' "$PWD"
exit "${TRAIN_EXIT:-0}"
EOF
  chmod +x "$SCRIPTS/_train.sh"
}

# run_container ARG...: bats-run the copied _container.sh under the sandbox PATH.
run_container() {
  run env PATH="$SANDBOX_BIN" "$SCRIPTS/_container.sh" "$@"
}

# wait_for_file FILE: up to 5 s.
wait_for_file() {
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -s $1 ]] && return 0
    sleep 0.05
  done
  echo "timed out waiting for $1"
  return 1
}

# _argv_index FILE ARG...: prints the index where ARG... appear consecutively in FILE (one per line).
_argv_index() {
  local file=$1 i j
  shift
  local -a argv want=("$@")
  mapfile -t argv <"$file"
  for ((i = 0; i + ${#want[@]} <= ${#argv[@]}; i++)); do
    for ((j = 0; j < ${#want[@]}; j++)); do
      [[ ${argv[i + j]} == "${want[j]}" ]] || continue 2
    done
    echo "$i"
    return 0
  done
  return 1
}

# assert_argv_has FILE ARG...: the ARGs appear consecutively in the recorded argv.
assert_argv_has() {
  local file=$1
  shift
  _argv_index "$file" "$@" >/dev/null && return 0
  echo "expected consecutive arguments [$*] in $file, which holds:"
  cat "$file"
  return 1
}

# refute_argv_has FILE ARG...: they do not.
refute_argv_has() {
  local file=$1
  shift
  _argv_index "$file" "$@" >/dev/null || return 0
  echo "did not expect arguments [$*] in $file, which holds:"
  cat "$file"
  return 1
}

# argv_env_names FILE: the NAME of every `--env NAME=VALUE` in the recorded argv, one per line.
argv_env_names() {
  local -a argv
  local i
  mapfile -t argv <"$1"
  for ((i = 0; i + 1 < ${#argv[@]}; i++)); do
    if [[ ${argv[i]} == --env ]]; then echo "${argv[i + 1]%%=*}"; fi
  done
}
