# shellcheck shell=bash
# Usage: source utils/lib/settings.sh
# Summary: Numeric settings from the environment, checked before shell arithmetic sees them (sourced library)
#
#   grace=$(setting_uint TASK_KILL_GRACE 2) || exit 2    # the value, or 2 when unset or empty
#
# Why: bash arithmetic ($((...)), ((...)), [[ -lt ]]) evaluates a variable's value as an expression, and an
# expression may index an array, which runs $(...): RAY_START_TIMEOUT='a[$(id)]', set by a tuning profile
# file or an _env_ argument, ran a command as the job's owner. A value that reaches arithmetic only through
# setting_uint is a plain number. Errors: one line on stderr naming the setting and the fix; return 2.

# setting_uint NAME DEFAULT: prints NAME's value (DEFAULT when NAME is unset or empty) as a decimal whole
# number; leading zeros are read as decimal, not octal. Anything but 1-9 digits is refused.
setting_uint() {
  local name=$1 default=$2 value
  value=${!name:-$default}  # indirect expansion reads the text, it evaluates nothing
  if [[ $value =~ ^[0-9]{1,9}$ ]]; then
    echo "$((10#$value))"
    return 0
  fi
  printf '%s: %s=%q is not a whole number of 1 to 9 digits; set it to one (e.g. %s=%s) or unset it\n' \
    "${0##*/}" "$name" "$value" "$name" "$default" >&2
  return 2
}
