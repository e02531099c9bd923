# shellcheck shell=bash
# Summary: Exposition-text output buffer for bash metrics plugins (*_metrics_plugin.sh) to source; the shipped host and GPU plugins are Python
#
# Samples are grouped per metric family and families printed in first-seen order, each with its HELP and
# TYPE lines. The buffer lives in the sourcing plugin (FAM_* arrays); every sample gets host="$HOST".
# Builtins only: plugins run every cycle and must not fork.
#   add NAME TYPE HELP LABELS VALUE   LABELS is ',k="v",...' or empty; a non-numeric VALUE is skipped
#   flush                             prints the buffer
#   readval FILE                      first word of FILE into REPLY (empty if unreadable)

declare -A FAM_TYPE=() FAM_HELP=() FAM_BODY=()
FAM_ORDER=()

add() {
  [[ $5 =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]] || return 0
  if [[ -z ${FAM_TYPE[$1]+x} ]]; then
    FAM_ORDER+=("$1"); FAM_TYPE[$1]=$2; FAM_HELP[$1]=$3
  fi
  FAM_BODY[$1]+="$1{host=\"$HOST\"$4} $5"$'\n'
}

flush() {
  local n
  for n in "${FAM_ORDER[@]}"; do
    printf '# HELP %s %s\n# TYPE %s %s\n%s' "$n" "${FAM_HELP[$n]}" "$n" "${FAM_TYPE[$n]}" "${FAM_BODY[$n]}"
  done
}

readval() { REPLY=; [[ -r $1 ]] && read -r REPLY _ <"$1" 2>/dev/null; REPLY=${REPLY:-}; }
