# shellcheck shell=bash
# Summary: Immutable snapshots of the launcher's code for submitted jobs (sourced library)
#
# A queued job runs from its own copy of the code, so editing the repo after submit.sh changes nothing for
# jobs already submitted.
#
#   make_artifact SRC_DIR WORKSPACE   prints the new snapshot dir WORKSPACE/.artifacts/<user>/artifact_<ts>_<4 hex>
#   artifact_user_dir WORKSPACE       makes (if needed) and checks WORKSPACE/.artifacts/<user>: a real dir,
#                                     ours, mode 0700; prints it, or returns 1 with a one-line error
#   write_submit_cmd ARTIFACT_DIR ARGS...  records how the job was submitted (submit_cmd.txt)
#
# In a git checkout the snapshot holds exactly what git would consider the project: tracked files and
# untracked files that .gitignore does not exclude (so no .git, .venv or outputs), except untracked files
# whose names say they hold secrets (.env, *.pem, *.key, .netrc, *.local.sh, ssh keys: said on stderr,
# left out). A checkout owned by another account (git's "dubious ownership") is still read through git.
# Files are made read-only and private (the job runs as its owner; nobody else needs the code it ran).
#
# Snapshots live in a per-user dir (audit row F2): in a workspace shared with a group, a teammate who may
# write in .artifacts/ could otherwise rename a queued job's snapshot and put a copy with a payload in its
# place, which then runs as the job's owner. .artifacts/ itself gets the sticky bit when we make it (as /tmp:
# only an entry's owner renames or removes it). submit.sh also records a hash of the snapshot
# (ARTIFACT_SHA256, `_job.sbatch --snapshot-sha256`) that _job.sbatch checks before it runs any of it.

# shellcheck source=utils/lib/env_mask.sh
source "$(dirname "${BASH_SOURCE[0]}")/env_mask.sh"

_artifact_err() { echo "${0##*/}: $*" >&2; }

# _artifact_secret_name PATH: true when PATH's file name is one that holds credentials, not code.
_artifact_secret_name() {
  case ${1##*/} in
    .env|.env.*|*.pem|*.key|*.p12|.netrc|*.local.sh|id_rsa*|id_ecdsa*|id_ed25519*) return 0 ;;
  esac
  return 1
}

# _project_files SRC_DIR: NUL-separated relative paths to copy.
_project_files() {
  local src=$1 path
  # safe.directory for this one command: a checkout owned by another account is read as it is, not
  # swapped for a copy of everything in the directory (ignored files with tokens included).
  local -a git=(git -c "safe.directory=$src" -C "$src")
  if "${git[@]}" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # -c lists tracked files even when deleted from the work tree: keep only those that exist.
    "${git[@]}" ls-files -z --cached | while IFS= read -r -d '' path; do
      [[ -e $src/$path || -L $src/$path ]] && printf '%s\0' "$path"
    done
    "${git[@]}" ls-files -z --others --exclude-standard | _artifact_drop_secrets
  else
    (cd "$src" && find . -path ./.git -prune -o -path ./.venv -prune -o -path ./outputs -prune -o \
      -path ./.cache -prune -o \( -type f -o -type l \) -print0) | _artifact_drop_secrets
  fi
}

# _artifact_drop_secrets: passes NUL-separated paths through, minus secret-looking ones (named on stderr).
_artifact_drop_secrets() {
  local path
  while IFS= read -r -d '' path; do
    if _artifact_secret_name "$path"; then
      _artifact_err "left out of the code snapshot: ${path#./} (an untracked file whose name says it holds secrets)"
    else
      printf '%s\0' "$path"
    fi
  done
}

# _git_summary SRC_DIR: where the code came from, for the job's provenance.
_git_summary() {
  local src=$1
  local -a git=(git -c "safe.directory=$src" -C "$src")  # as in _project_files: another account's checkout
  "${git[@]}" rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "not a git checkout: $src"; return 0; }
  echo "== SOURCE =="; echo "$src"
  echo "== BRANCH =="; "${git[@]}" status --branch --short | head -1
  echo "== COMMIT =="; "${git[@]}" log -1 --format='%H%n%s%n%ad %an' 2>/dev/null || echo "(no commits)"
  echo "== CHANGED FILES =="; "${git[@]}" status --short --untracked-files=no
  echo "== UNTRACKED FILES =="; "${git[@]}" ls-files --others --exclude-standard
  echo "== DIFF AGAINST HEAD =="; "${git[@]}" diff HEAD 2>/dev/null || true
}

artifact_user_dir() {
  local arts=$1/.artifacts user dir owner mode
  user=$(id -un) || return 1
  dir=$arts/$user
  if [[ ! -d $arts ]]; then
    mkdir -p "$arts" || { _artifact_err "cannot create $arts; check JOB_WORKSPACE"; return 1; }
    chmod +t "$arts"   # teammates (in a group workspace) cannot rename or remove each other's dirs in it
  fi
  if [[ ! -e $dir && ! -L $dir ]]; then
    mkdir -m 0700 "$dir" || { _artifact_err "cannot create $dir; check JOB_WORKSPACE"; return 1; }
  fi
  if [[ -L $dir || ! -d $dir ]]; then
    _artifact_err "$dir is not a directory (a symlink or a file); remove it and submit again"; return 1
  fi
  read -r owner mode < <(stat -c '%u %a' "$dir")
  if [[ $owner != "$(id -u)" ]]; then
    _artifact_err "$dir is owned by uid $owner, not by you ($user); your code snapshots must be yours alone: remove it (or ask its owner to) and submit again"
    return 1
  fi
  # Ours: private whatever the umask made it (an older submit.sh made it with the workspace's mode).
  [[ $mode == 700 ]] || chmod 0700 "$dir" || return 1
  printf '%s\n' "$dir"
}

make_artifact() {
  local src=$1 workspace=$2 name dest user_dir
  user_dir=$(artifact_user_dir "$workspace") || return 1
  name=artifact_$(date +%Y%m%d_%H%M%S)_$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')
  dest=$user_dir/$name
  mkdir "$dest" || { _artifact_err "cannot create $dest; check JOB_WORKSPACE"; return 1; }
  if ! _project_files "$src" | (cd "$src" && tar --null -T - -cf -) | tar -xf - -C "$dest"; then
    _artifact_err "copying $src into $dest failed"; rm -rf "$dest"; return 1
  fi
  _git_summary "$src" >"$dest/git_summary.txt" 2>&1
  chmod -R a-w,go-rwx "$dest"   # a job's code cannot be edited in place by mistake, nor read by others
  printf '%s\n' "$dest"
}

# Removes a snapshot made by make_artifact (read-only by design, so writable again first).
remove_artifact() {
  local dest=$1
  [[ $dest == */.artifacts/*/artifact_* && -d $dest && ! -L $dest ]] || return 0
  chmod -R u+w "$dest" && rm -rf "$dest"
}

# write_submit_cmd ARTIFACT_DIR ARGV...: the environment prefixes that differ from defaults, then the command,
# a credential's value after '--' as *** (env_mask_arg: _env_HF_TOKEN=***).
write_submit_cmd() {
  local dest=$1 name line="" arg after=0
  local -a argv=()
  shift
  for name in JOB_WORKSPACE RAY STAGE_TIMEOUTS CONTAINER_RUNTIME DOCKER_IMAGE TUNE_PROFILE MAX_RETRIES PASS_ENV; do
    [[ -n ${!name:-} ]] && line+="$name=$(printf '%q' "${!name}") "
  done
  for arg in "$@"; do
    if (( after )); then arg=$(env_mask_arg "$arg"); elif [[ $arg == -- ]]; then after=1; fi
    argv+=("$arg")
  done
  line+=$(printf '%q ' "${argv[@]}")
  chmod u+w "$dest"
  printf '%s\n' "${line% }" >"$dest/submit_cmd.txt"
  chmod a-w "$dest/submit_cmd.txt" "$dest"
}
