# shellcheck shell=bash
# Summary: The job workspace: where it is, and whether we may write there (sourced library)
#
#   resolve_workspace SCRIPT_DIR      prints the absolute JOB_WORKSPACE (default SCRIPT_DIR/outputs)
#   check_workspace_writable DIR      returns 1 with a one-line error unless DIR exists and takes new files,
#                                     or could be created under its nearest existing parent; creates nothing
#   workspace_fstype DIR              prints the filesystem type holding DIR (or its nearest parent)
#   workspace_umask                   applies JOB_UMASK (default 077) to this shell and exports it; returns 1
#                                     with a one-line error when it is not an octal umask
#   workspace_private_dir DIR [UID [MODE]]  creates DIR (MODE, default 0700) if absent; returns 1, saying why on stdout,
#                                     unless DIR is a real dir (no link) of UID (default: this user) that
#                                     group and others cannot write (what nobody else may plant files in)
#
# JOB_UMASK: everything a job writes (logs, job dirs, TensorBoard events, TSDBs, checkpoints, compile cache)
# is created under it. 077 (the default) keeps it the submitter's alone; a team that shares a workspace on
# purpose sets 027 (the group reads) or 007 (the group reads and writes).

_workspace_err() { echo "${0##*/}: $*" >&2; }

resolve_workspace() {
  local dir=${JOB_WORKSPACE:-$1/outputs}
  dir=${dir%/}
  [[ $dir == /* ]] || dir=$PWD/$dir
  printf '%s\n' "$dir"
}

_nearest_existing() {
  local dir=$1
  while [[ ! -e $dir ]]; do dir=$(dirname "$dir"); done
  printf '%s\n' "$dir"
}

check_workspace_writable() {
  local want=$1 dir probe
  dir=$(_nearest_existing "$want")
  if [[ ! -d $dir ]]; then
    _workspace_err "JOB_WORKSPACE=$want cannot be created: $dir is not a directory; set JOB_WORKSPACE to a writable directory"
    return 1
  fi
  # access(2) says yes to root even on read-only mounts, so try for real and clean up.
  if ! probe=$(mktemp -d "$dir/.workspace_probe.XXXXXX" 2>/dev/null); then
    _workspace_err "JOB_WORKSPACE=$want is not writable ($dir refuses new files); set JOB_WORKSPACE to a writable directory"
    return 1
  fi
  rmdir "$probe"
}

workspace_fstype() {
  df -PT "$(_nearest_existing "$1")" 2>/dev/null | awk 'NR == 2 { print $2 }'
}

workspace_umask() {
  local mask=${JOB_UMASK:-077}
  if [[ ! $mask =~ ^0?[0-7]{3}$ ]]; then
    _workspace_err "JOB_UMASK=$mask is not an octal umask; unset it (077: what a job writes is yours alone) or set 027 / 007 for a team workspace"
    return 1
  fi
  umask "$mask"
  export JOB_UMASK=$mask
}

workspace_private_dir() {
  local dir=$1 uid=${2:-$EUID} owner mode
  if [[ ! -e $dir && ! -L $dir ]]; then
    mkdir -p "$(dirname "$dir")" 2>/dev/null && mkdir -m "${3:-0700}" "$dir" 2>/dev/null
  fi
  # lstat-like checks: a link planted at DIR's name is refused, not followed to wherever it points.
  if [[ -L $dir ]]; then echo "$dir is a symlink"; return 1; fi
  if [[ ! -d $dir ]]; then echo "$dir is not a directory (or cannot be created)"; return 1; fi
  read -r owner mode < <(stat -c '%u %a' "$dir")
  if [[ $owner != "$uid" ]]; then echo "$dir belongs to uid $owner, not to uid $uid"; return 1; fi
  if (( 8#$mode & 8#022 )); then echo "$dir is writable by group or others (mode $mode)"; return 1; fi
}
