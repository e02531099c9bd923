# shellcheck shell=bash
# COREDUMP_DIR, COREDUMP_SET and COREDUMP_WHERE are for the caller, which shellcheck cannot see.
# shellcheck disable=SC2034
# Summary: Core dumps of training (COREDUMP=1): the core limit, where cores go, the core after a crash (sourced library)
#
#   coredump_check              COREDUMP is 0 or 1 (default 0), COREDUMP_WAIT a positive number of seconds
#                               (default 60); else one line "<caller>: COREDUMP=abc is not 0 or 1; ..." on stderr,
#                               return 2. Called by run_local.sh / submit.sh before a job exists, and by _train.sh.
#   coredump_enabled            true when COREDUMP=1
#   coredump_setup JOB_PATH EXE raises the soft core limit to the hard one, makes JOB_PATH/cores/, points this
#                               node's core_pattern there (through a short link, below) when it may, and prints
#                               "[coredump] ..." lines: the limit, "cores go to: ...", the executable (for gdb).
#   coredump_restore            puts core_pattern back; idempotent, so an EXIT trap may call it again
#   coredump_after RC [PID]     after training (PID) ended with RC: on a signal that dumps core, waits (at most
#                               COREDUMP_WAIT s) while the core still grows, then prints
#                               "== CORE DUMP <path> (<size>) ==", or "== NO CORE DUMP (SIG...) on <host>: <where> =="
#   coredump_where PATTERN [PID]
#                               prints where a core_pattern value sends cores, in words a user can act on
#
# core_pattern is one value for the whole machine (every job, every user, every "node" of a one-machine test
# cluster), so it is changed only as root, with a writable file, and only from the kernel's default `core`
# or from one of ours. Anything else (a systemd-coredump or apport pipe, a site's own pattern) is left alone and
# the log says where that node's cores go. Each job of this node that sets the pattern has an entry in
# COREDUMP_STATE_DIR (default /run/jobkit-coredump): users/<pid>.<start time of _train.sh>, a symlink to its
# <job dir>/cores, and the pattern is <that link>/core.%h.%e.%p: the kernel keeps at most 127 bytes of a
# pattern (silently cut), and a job dir's path alone may be longer. Entries change under a flock. When a job
# ends, the pattern goes to the newest job still running, and the last one puts `core` back. A job killed with
# KILL cannot restore; the next COREDUMP job on the node finds its entry dead and does.
# COREDUMP_PATTERN_FILE replaces /proc/sys/kernel/core_pattern (tests).

# shellcheck source=utils/lib/process.sh
source "$(dirname "${BASH_SOURCE[0]}")/process.sh"
# shellcheck source=utils/lib/settings.sh
source "$(dirname "${BASH_SOURCE[0]}")/settings.sh"

# The signals whose default action is to dump core (signal(7)).
_COREDUMP_SIGNALS=" QUIT ILL TRAP ABRT BUS FPE SEGV XCPU XFSZ SYS "
_COREDUMP_DEFAULT=core

_coredump_err() { echo "${0##*/}: $*" >&2; }
_coredump_pattern_file() { echo "${COREDUMP_PATTERN_FILE:-/proc/sys/kernel/core_pattern}"; }
_coredump_state_dir() { echo "${COREDUMP_STATE_DIR:-/run/jobkit-coredump}"; }
_coredump_host() { local h=${HOSTNAME:-$(uname -n)}; echo "${h%%.*}"; }
_coredump_is_ours() { [[ $1 == "$(_coredump_state_dir)"/users/*/core.%h.%e.%p ]]; }
_COREDUMP_PATTERN_MAX=127   # bytes the kernel keeps (CORENAME_MAX_SIZE less the NUL)
_coredump_read() { local v; { v=$(<"$1"); } 2>/dev/null || return 1; printf '%s' "$v"; }

coredump_check() {
  case ${COREDUMP:-0} in
    0|1) ;;
    *) _coredump_err "COREDUMP=$COREDUMP is not 0 or 1; COREDUMP=1 keeps a core dump of a crashed training process, COREDUMP=0 (the default) does not"
       return 2 ;;
  esac
  if [[ -n ${COREDUMP_WAIT:-} && ! $COREDUMP_WAIT =~ ^[1-9][0-9]*$ ]]; then
    _coredump_err "COREDUMP_WAIT=$COREDUMP_WAIT is not a positive number of seconds; e.g. COREDUMP_WAIT=60"
    return 2
  fi
}

coredump_enabled() { [[ ${COREDUMP:-0} == 1 ]]; }

coredump_where() {
  local pattern=$1 pid=${2:-} host
  host=$(_coredump_host)
  case $pattern in
    '|'*systemd-coredump*)
      echo "systemd-coredump on $host: coredumpctl list${pid:+; coredumpctl info $pid; coredumpctl debug $pid}" ;;
    '|'*apport*)
      echo "apport on $host: reports in /var/crash (apport-unpack <report> <dir> extracts the CoreDump), cores in /var/lib/apport/coredump" ;;
    '|'*)
      local handler=${pattern#|}
      echo "the crash handler ${handler%% *} on $host (core_pattern '$pattern'): ask the node's admin where it keeps cores" ;;
    /*) echo "${pattern%/*}/ on $host (core_pattern '$pattern')" ;;
    */*) echo "$PWD/${pattern%/*}/ on $host, relative to the crashing process's working directory (core_pattern '$pattern')" ;;
    *) echo "$PWD/ on $host, the crashing process's working directory (core_pattern '$pattern')" ;;
  esac
}

# Soft limit up to the hard one: that is all an unprivileged process may do, and a hard 0 means no cores.
_coredump_raise_limit() {
  local soft hard
  soft=$(ulimit -Sc) hard=$(ulimit -Hc)
  if [[ $hard == 0 ]]; then
    echo "[coredump] core limit: the hard limit is 0 on $(_coredump_host), so this node writes no cores (raise it where training is started: limits.conf, LimitCORE= of slurmd, or the container engine's --ulimit core=-1)"
    return 0
  fi
  ulimit -Sc "$hard"
  echo "[coredump] core limit: $hard (was $soft)"
}

# _coredump_locked CMD...: CMD under the node-wide lock, so that two jobs' setups and restores do not interleave.
_coredump_locked() {
  local dir fd rc=0
  dir=$(_coredump_state_dir)
  mkdir -p "$dir/users" 2>/dev/null || return 1
  exec {fd}>>"$dir/lock" || return 1
  if command -v flock >/dev/null 2>&1; then flock -w 10 "$fd" || true; fi
  "$@" || rc=$?
  exec {fd}>&-
  return "$rc"
}

# Entries of jobs that ended without restoring (KILL) do not hold the pattern any more.
_coredump_prune() {
  local f name
  for f in "$(_coredump_state_dir)"/users/*; do
    [[ -L $f ]] || continue
    name=${f##*/}
    proc_alive "${name%%.*}" "${name#*.}" || rm -f "$f"
  done
}

# _coredump_claim: registers this job (its link) and writes its pattern; 3 when the current value is not ours
# to change. A write the kernel refused or cut puts the old value back.
_coredump_claim() {
  local file current link
  file=$(_coredump_pattern_file) link=$(_coredump_state_dir)/users/$_COREDUMP_TOKEN
  _coredump_prune
  current=$(_coredump_read "$file") || return 1
  [[ $current == "$_COREDUMP_DEFAULT" ]] || _coredump_is_ours "$current" || return 3
  COREDUMP_OLD_PATTERN=$current
  ln -sfn "$COREDUMP_DIR" "$link" || return 1
  if ! { printf '%s\n' "$COREDUMP_PATTERN" >"$file"; } 2>/dev/null || [[ $(_coredump_read "$file") != "$COREDUMP_PATTERN" ]]; then
    { printf '%s\n' "$current" >"$file"; } 2>/dev/null
    rm -f "$link"
    return 1
  fi
}

# Gives the pattern to the newest job of ours still running on this node, else back to the default; a value
# someone else has set since is left alone.
_coredump_release() {
  local file dir current next=$_COREDUMP_DEFAULT newest
  file=$(_coredump_pattern_file) dir=$(_coredump_state_dir)
  rm -f "$dir/users/$_COREDUMP_TOKEN"
  _coredump_prune
  current=$(_coredump_read "$file") || return 1
  if ! _coredump_is_ours "$current"; then
    echo "[coredump] core_pattern on $(_coredump_host) is '$current' now (not ours): left as it is"
    return 0
  fi
  newest=$(find "$dir/users" -type l -printf '%T@ %p\n' 2>/dev/null | sort -rn | head -1 | cut -d' ' -f2-)
  [[ -z $newest ]] || next=$newest/core.%h.%e.%p
  [[ $current == "$next" ]] || printf '%s\n' "$next" >"$file"
  echo "[coredump] core_pattern on $(_coredump_host): restored to '$next'${newest:+ (another job of this node still keeps its cores)}"
}

coredump_setup() {
  local job_path=$1 exe=$2 file current reason="" rc=0
  COREDUMP_DIR=$job_path/cores COREDUMP_SET=0 COREDUMP_OLD_PATTERN="" COREDUMP_SINCE=$(date +%s)
  _COREDUMP_TOKEN="$$.$(proc_start_time $$)"
  COREDUMP_PATTERN=$(_coredump_state_dir)/users/$_COREDUMP_TOKEN/core.%h.%e.%p
  mkdir -p "$COREDUMP_DIR"
  COREDUMP_DIR=$(cd "$COREDUMP_DIR" && pwd)   # the link must not depend on a working directory
  _coredump_raise_limit
  file=$(_coredump_pattern_file)
  if ! current=$(_coredump_read "$file"); then
    COREDUMP_WHERE="unknown: $file cannot be read on $(_coredump_host)"
    echo "[coredump] cores go to: $COREDUMP_WHERE"
  else
    if [[ ! -w $file ]]; then
      if (( EUID != 0 )); then reason="only root may change it"; else reason="$file is read-only here"; fi
    elif (( ${#COREDUMP_PATTERN} > _COREDUMP_PATTERN_MAX )); then
      reason="'$COREDUMP_PATTERN' is longer than the kernel's $_COREDUMP_PATTERN_MAX bytes (a shorter COREDUMP_STATE_DIR fixes it)"
    else
      _coredump_locked _coredump_claim || rc=$?
      case $rc in
        0) COREDUMP_SET=1 ;;
        3) reason="it is not the kernel default '$_COREDUMP_DEFAULT', and this node's setting is not ours to change" ;;
        *) reason="writing $file failed" ;;
      esac
    fi
    if (( COREDUMP_SET )); then
      COREDUMP_WHERE="$COREDUMP_DIR/ on $(_coredump_host)"
      echo "[coredump] cores go to: $COREDUMP_WHERE (core_pattern set to '$COREDUMP_PATTERN', a link to it; was '$COREDUMP_OLD_PATTERN'; restored when training ends)"
    else
      COREDUMP_WHERE=$(coredump_where "$current")
      echo "[coredump] cores go to: $COREDUMP_WHERE (core_pattern not changed: $reason)"
    fi
  fi
  echo "[coredump] executable: $exe"
}

coredump_restore() {
  [[ ${COREDUMP_SET:-0} == 1 ]] || return 0
  COREDUMP_SET=0
  _coredump_locked _coredump_release || echo "[coredump] could not restore core_pattern ($(_coredump_pattern_file))"
}

# _coredump_candidates DIR...: core* files in DIRs written since training started, newest first.
_coredump_candidates() {
  local dir f
  for dir in "$@"; do
    for f in "$dir"/core*; do
      [[ -f $f ]] && (($(stat -c %Y "$f") >= ${COREDUMP_SINCE:-0})) && echo "$(stat -c %Y "$f") $f"
    done
  done | sort -rn -k1,1 | cut -d' ' -f2- | awk '!seen[$0]++'
}

# _coredump_find PID: this training's core. In the job's cores/ dir: the one named with PID (%p), else with
# this host (%h: nodes of a job share the dir), else the newest. Where a pattern we did not set writes plain
# files (or another job of this node took the pattern), only a core named with PID counts, when PID is known.
_coredump_find() {
  local pid=$1 host f pattern other=""
  local -a found=()
  host=$(uname -n)
  mapfile -t found < <(_coredump_candidates "$COREDUMP_DIR")
  if [[ -n $pid ]]; then
    for f in "${found[@]}"; do [[ ${f##*/} =~ (^|\.)$pid$ ]] && { echo "$f"; return 0; }; done
  fi
  for f in "${found[@]}"; do [[ ${f##*/} == *".$host."* ]] && { echo "$f"; return 0; }; done
  ((${#found[@]} == 0)) || { echo "${found[0]}"; return 0; }
  pattern=$(_coredump_read "$(_coredump_pattern_file)") || return 1
  case $pattern in
    '|'*) return 1 ;;
    /*) other=${pattern%/*} ;;
    */*) other=$PWD/${pattern%/*} ;;
    *) other=$PWD ;;
  esac
  if [[ -z $pid ]] && _coredump_is_ours "$pattern"; then return 1; fi   # another job's dir: only with our PID
  mapfile -t found < <(_coredump_candidates "$other")
  for f in "${found[@]}"; do
    if [[ -z $pid || ${f##*/} =~ (^|\.)$pid$ ]]; then echo "$f"; return 0; fi
  done
  return 1
}

# Waits while FILE still grows (a pipe handler or a slow filesystem may still be writing it).
_coredump_settle() {
  local file=$1 size last=-1 limit=${COREDUMP_WAIT:-60}
  local deadline=$((SECONDS + limit))
  while ((SECONDS < deadline)); do
    size=$(stat -c %s "$file" 2>/dev/null) || return 0
    ((size == last)) && return 0
    last=$size
    sleep 1
  done
  echo "[coredump] $file still grew after ${limit} s (COREDUMP_WAIT=$limit)"
}

_coredump_size() {
  local bytes
  bytes=$(stat -c %s "$1")
  numfmt --to=iec-i --suffix=B "$bytes" 2>/dev/null || echo "$bytes bytes"
}

coredump_after() {
  local rc=$1 pid=${2:-} name core wait_s
  ((rc > 128)) || return 0
  name=$(kill -l $((rc - 128)) 2>/dev/null) || return 0
  [[ $_COREDUMP_SIGNALS == *" $name "* ]] || return 0
  echo "[coredump] training killed by SIG$name (exit $rc) on $(_coredump_host)"
  # A file pattern is written before the parent sees the death; a pipe handler may take a moment.
  wait_s=$(setting_uint COREDUMP_WAIT 60) || wait_s=5
  ((wait_s < 5)) || wait_s=5
  local deadline=$((SECONDS + wait_s))
  until core=$(_coredump_find "$pid"); do
    ((SECONDS < deadline)) || break
    sleep 1
  done
  if [[ -n $core ]]; then
    _coredump_settle "$core"
    echo "== CORE DUMP $core ($(_coredump_size "$core")) =="
  else
    local where=${COREDUMP_WHERE:-$COREDUMP_DIR/}
    # systemd-coredump finds a core by PID: name it.
    [[ ${where%% *} != systemd-coredump ]] || where=$(coredump_where "$(_coredump_read "$(_coredump_pattern_file)")" "$pid")
    echo "== NO CORE DUMP (SIG$name) on $(_coredump_host): cores go to $where; core limit $(ulimit -Sc) =="
  fi
}
