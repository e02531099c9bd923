# shellcheck shell=bash
# Summary: Choose the runtime that hosts training: podman, docker or none (native) (sourced library)
#
# detect_container_runtime
#   Prints podman | docker | none and returns 0, or prints one error line on stderr and returns 2.
#   CONTAINER_RUNTIME decides when it is set:
#     podman | docker   that runtime; its binary must be on PATH (its engine is not probed: the run will say)
#     none              native: training runs in this host's environment, no container
#     empty / unset     detect: podman when `podman info` answers, else docker when `docker info` answers,
#                       else none. A docker CLI with no reachable engine answers nothing, so it does not count.
#   Every probe is cut off after CONTAINER_RUNTIME_PROBE_TIMEOUT seconds (default 10).
#
# Defines functions only; sourcing it changes no variable and no shell option.

_container_runtime_err() { echo "${0##*/}: $*" >&2; }

# _container_runtime_answers RUNTIME: true when RUNTIME is on PATH and `RUNTIME info` succeeds in time.
_container_runtime_answers() {
  local runtime=$1 limit=${CONTAINER_RUNTIME_PROBE_TIMEOUT:-10}
  command -v "$runtime" >/dev/null 2>&1 || return 1
  if command -v timeout >/dev/null 2>&1; then
    timeout -k 2 "$limit" "$runtime" info </dev/null >/dev/null 2>&1
  else
    "$runtime" info </dev/null >/dev/null 2>&1
  fi
}

detect_container_runtime() {
  local requested=${CONTAINER_RUNTIME:-} runtime
  case $requested in
    none)
      echo none ;;
    podman | docker)
      if ! command -v "$requested" >/dev/null 2>&1; then
        _container_runtime_err "CONTAINER_RUNTIME=$requested but '$requested' is not on PATH;" \
          "install $requested, or set CONTAINER_RUNTIME=none to train natively (empty: detect)"
        return 2
      fi
      echo "$requested" ;;
    "")
      for runtime in podman docker; do
        if _container_runtime_answers "$runtime"; then echo "$runtime"; return 0; fi
      done
      echo none ;;
    *)
      _container_runtime_err "unknown CONTAINER_RUNTIME '$requested' (use podman, docker or none)"
      return 2 ;;
  esac
}
