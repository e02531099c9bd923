# shellcheck shell=bash
# Helpers for container.bats: a sealed PATH with stub runtimes, a throwaway scripts dir, argv assertions.

STUBS_DIR=$BATS_TEST_DIRNAME/stubs

# make_sandbox [STUB...]: $SANDBOX_BIN holds the few real tools the scripts need plus the named stubs, and
# nothing else, so a docker, podman or nvidia-smi installed on this machine can never answer.
make_sandbox() {
  SANDBOX_BIN=$BATS_TEST_TMPDIR/bin
  mkdir -p "$SANDBOX_BIN"
  local tool
  for tool in bash env timeout sleep mkdir dirname cat mktemp rm stat; do
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
  cp "$REPO_DIR/utils/container_init.sh" "$SCRIPTS/utils/"
  cp "$REPO_DIR/utils/lib/container_runtime.sh" "$REPO_DIR/utils/lib/process.sh" "$REPO_DIR/utils/lib/env_mask.sh" \
    "$SCRIPTS/utils/lib/"
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

# allowlist_names: the names on _container.sh's _CONTAINER_ENV_ALLOWLIST, one per line.
allowlist_names() {
  sed -n '/^_CONTAINER_ENV_ALLOWLIST=(/,/^)/{/^_CONTAINER_ENV_ALLOWLIST=(/d;/^)/d;s/#.*//;p}' "$REPO_DIR/_container.sh" |
    tr -s ' ' '\n' | sed '/^$/d'
}

# Sections of docs/settings.md whose settings do not cross into a container from the host's environment, as
# each section's first lines say: read on the host only (the launchers, the batch script, the engine, preflight,
# the login node's tools, setup), or set by train_env.sh / read by Prometheus's programs, which a container
# job takes as _env_NAME=VALUE. A section renamed or added is checked until it is listed here.
_SETTINGS_HOST_SECTIONS="Stages, stops, time limits and ports|Containers|Defaults train_env.sh sets"
_SETTINGS_HOST_SECTIONS+="|Preflight and ECC check|Prometheus and promtool|Requeue, monitor and notifications"
_SETTINGS_HOST_SECTIONS+="|Bridge|Setting up the venv|Local Slurm cluster and benchmarks"

# settings_table_vars: every variable in the first column of a docs/settings.md table (`NAME`, one per line),
# less the sections above.
settings_table_vars() {
  awk -v host_sections="$_SETTINGS_HOST_SECTIONS" '
    BEGIN { n = split(host_sections, names, "|"); for (i = 1; i <= n; i++) host[names[i]] = 1 }
    /^## / { section = substr($0, 4); next }
    /^\|/ && !(section in host) { split($0, cell, "|"); print cell[2] }
  ' "$REPO_DIR/docs/settings.md" | grep -oE '^ *`_?[A-Z][A-Z0-9_]*` *$' | tr -d '` ' | sort -u
}

# training_tier_vars: the settings the training tier reads: ${NAME:-...} in its shell sources (less the
# `export NAME=${NAME:-default}` lines of train_env.sh, which are defaults for the image's own environment),
# the names train_env.sh reads with train_setting, and os.environ reads in the training entry.
training_tier_vars() {
  local f
  for f in utils/lib/observability.sh utils/lib/ray_cluster.sh _train.sh train_env.sh; do
    grep -vE '^\s*(#|export ([A-Z_][A-Z0-9_]*)=\$\{\2:-)' "$REPO_DIR/$f" | grep -oE '\$\{[A-Z][A-Z0-9_]*:-' |
      sed 's/^..//; s/:-$//'
  done
  grep -v '^\s*#' "$REPO_DIR/train_env.sh" | grep -oE 'train_setting [A-Z][A-Z0-9_]*' | cut -d' ' -f2
  grep -v '^\s*#' "$REPO_DIR/py/jobkit/launch/entry.py" | grep -oE '\.get\("[A-Z][A-Z0-9_]*"' | cut -d'"' -f2
}
