# shellcheck shell=bash
# Summary: Install missing Debian packages with apt-get, once, with one clear error (sourced library)
#
# apt_install PACKAGE...
#   Installs the named packages (--no-install-recommends), refreshing the package lists and trying once
#   more when the first attempt fails (a fresh machine has stale or no lists). Returns 0 when installed;
#   otherwise prints one line naming the packages and the manual command, and returns 1. Needs root and
#   apt-get: without either it says so and returns 1. Progress goes to stderr.
#
# Callers decide what is missing (a command, not a package, is what they need); this only installs.
# Defines functions only; sourcing it changes no variable and no shell option.

apt_install() {
  (( $# )) || return 0
  local who=${0##*/}
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "$who: missing $*, and there is no apt-get here; install them with this system's package manager" >&2
    return 1
  fi
  if [[ $(id -u) != 0 ]]; then
    echo "$who: missing $*; install them as root: apt-get install -y --no-install-recommends $*" >&2
    return 1
  fi
  echo "[$who] installing $* with apt-get" >&2
  # 9>&-: a service that a postinst script might start must not inherit (and hold) a caller's lock on fd 9.
  local -a apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 -q)
  if "${apt[@]}" install -y --no-install-recommends "$@" >&2 9>&-; then return 0; fi
  echo "[$who] install failed; refreshing the package lists and trying once more" >&2
  "${apt[@]}" update >&2 9>&- || true
  if "${apt[@]}" install -y --no-install-recommends "$@" >&2 9>&-; then return 0; fi
  echo "$who: apt-get could not install $*; run 'apt-get update && apt-get install -y --no-install-recommends $*' to see why" >&2
  return 1
}
