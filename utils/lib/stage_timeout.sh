# shellcheck shell=bash
# STAGE_LIMITS, STAGE_FAILURE and STAGE_RUNNING_PID are for the caller, which shellcheck cannot see.
# shellcheck disable=SC2034
# Summary: Named job stages with per-stage time limits that STAGE_TIMEOUTS can override (sourced library)
#
#   stage_timeouts_init preflight:900 pull:900 ecc:300 train:none   # defaults; then STAGE_TIMEOUTS applies
#   print_stage_timeouts                                            # the table, for the log
#   run_stage train "Training" cmd args...                          # BEGIN / END / TIMEOUT / FAILED lines
#
# Each stage line ends with the UTC time it was printed, ISO 8601, before the closing "==" (so that a report can
# place stages on a time axis; readers that match "== <Stage> END (12s)" from the start of the line still do):
#   == Training BEGIN (timeout=3600s) 2026-11-25T21:19:51Z ==
#   == Training END (95s) 2026-11-25T21:21:26Z ==
#
# STAGE_TIMEOUTS="stage:seconds,stage:none": seconds is a positive integer; none (or -1) means no limit.
# State lives in two caller-visible variables: STAGE_LIMITS (assoc array stage -> seconds|none) and
# STAGE_FAILURE (text of the last failed stage, for the job summary). Errors: "<caller>: ..." on stderr.

# shellcheck source=utils/lib/process.sh
source "$(dirname "${BASH_SOURCE[0]}")/process.sh"

_stage_err() { echo "${0##*/}: $*" >&2; }

# stage_timestamp: now, in UTC, as ISO 8601 to the second (2026-11-25T21:19:51Z).
stage_timestamp() { date -u +%Y-%m-%dT%H:%M:%SZ; }

# _stage_limit_value TEXT -> seconds or "none"; returns 1 for anything else.
_stage_limit_value() {
  case ${1,,} in
    none|-1) echo none ;;
    *) [[ $1 =~ ^[1-9][0-9]*$ ]] || return 1; echo "$1" ;;
  esac
}

stage_timeouts_init() {
  declare -gA STAGE_LIMITS=()
  STAGE_FAILURE=""
  local pair stage value
  for pair in "$@"; do
    STAGE_LIMITS[${pair%%:*}]=${pair#*:}
  done
  [[ -n ${STAGE_TIMEOUTS:-} ]] || return 0
  local -a pairs
  IFS=, read -ra pairs <<<"$STAGE_TIMEOUTS"
  for pair in "${pairs[@]}"; do
    pair=${pair// /}
    [[ -n $pair ]] || continue
    stage=${pair%%:*}
    if [[ $pair != *:* || -z $stage ]]; then
      _stage_err "STAGE_TIMEOUTS entry '$pair' is not stage:seconds; e.g. STAGE_TIMEOUTS=\"train:86400,preflight:600\""
      return 1
    fi
    if [[ ! -v "STAGE_LIMITS[$stage]" ]]; then
      _stage_err "STAGE_TIMEOUTS names unknown stage '$stage'; valid stages: ${!STAGE_LIMITS[*]}"
      return 1
    fi
    if ! value=$(_stage_limit_value "${pair#*:}"); then
      _stage_err "STAGE_TIMEOUTS value '${pair#*:}' for stage '$stage' is not a positive number of seconds or 'none' (0 is ambiguous: write none for no limit)"
      return 1
    fi
    STAGE_LIMITS[$stage]=$value
  done
}

print_stage_timeouts() {
  local stage
  echo "== STAGE TIMEOUTS (override: STAGE_TIMEOUTS=\"stage:seconds,...\") =="
  for stage in "$@"; do
    if [[ ${STAGE_LIMITS[$stage]} == none ]]; then printf '  %-10s none\n' "$stage"
    else printf '  %-10s %ss\n' "$stage" "${STAGE_LIMITS[$stage]}"
    fi
  done
}

# run_stage STAGE DESCRIPTION CMD...: runs CMD under the stage's limit; returns CMD's status (124 on timeout).
# CMD runs in the background and is waited for, so the caller's INT/TERM traps fire at once. CMD must be
# a program (coreutils timeout runs it), not a shell function.
run_stage() {
  local stage=$1 description=$2 limit start rc=0 pid
  shift 2
  limit=${STAGE_LIMITS[$stage]:?run_stage: unknown stage $stage}
  start=$SECONDS
  if [[ $limit == none ]]; then
    echo "== $description BEGIN (no timeout) $(stage_timestamp) =="
    "$@" &
  else
    echo "== $description BEGIN (timeout=${limit}s) $(stage_timestamp) =="
    # --kill-after: a stage that ignores TERM still ends; -v would print nothing useful to the log.
    timeout --kill-after=15 "$limit" "$@" &
  fi
  pid=$!
  STAGE_RUNNING_PID=$pid
  # proc_wait outlasts a trap that interrupts it, and returns the stage's real status.
  proc_wait "$pid" || rc=$?
  STAGE_RUNNING_PID=""
  local elapsed=$((SECONDS - start))
  if (( rc == 0 )); then
    echo "== $description END (${elapsed}s) $(stage_timestamp) =="
  elif [[ $limit != none ]] && (( rc == 124 || rc == 137 )); then
    echo "== $description TIMEOUT (${elapsed}s/${limit}s) $(stage_timestamp) =="
    echo "Hint: give the stage more time with STAGE_TIMEOUTS=\"$stage:<seconds>\" (or $stage:none)"
    STAGE_FAILURE="$description TIMEOUT after ${elapsed}s (limit ${limit}s)"
  else
    echo "== $description FAILED (exit=$rc, ${elapsed}s) $(stage_timestamp) =="
    STAGE_FAILURE="$description FAILED (exit=$rc)"
  fi
  return "$rc"
}
