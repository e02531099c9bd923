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
#                       An engine that answers is taken only when it can run the configured image here:
#                       DOCKER_IMAGE (configs/container_settings.sh) is a tarball that exists or an image the
#                       engine already has, or this host has a GPU (then a missing image is pulled). A CPU
#                       host with an engine but no image trains natively, and says so on stderr.
#   Every probe is cut off after CONTAINER_RUNTIME_PROBE_TIMEOUT seconds (default 10).
#
# container_host_run_args RUNTIME
#   Prints, one per line, the `RUNTIME run` options this host needs that CONTAINER_RUN_EXTRA_ARGS does not
#   already set (a user's own options always win, and then nothing is added for that setting):
#     podman   --runtime runc, when podman's default OCI runtime is crun and the cgroup layout is hybrid
#              (v1 controllers beside a v2 mount): crun refuses that layout, runc does not.
#              --ulimit nproc=N:N with N the smaller of this shell's hard limit and kernel.pid_max: rootful
#              podman otherwise asks for a process limit above what a host without CAP_SYS_RESOURCE may
#              grant, and the container fails to start ("error setting rlimit type 6").
#     docker   nothing (the daemon's own defaults are what docker users expect).
#
# container_memlock RUNTIME
#   Prints the locked-memory limit for `--ulimit memlock=N:N` (RDMA registers, i.e. pins, its buffers): -1
#   (unlimited) for docker (its daemon sets it), and for podman where this shell may raise its own hard limit
#   (root with CAP_SYS_RESOURCE); else (rootless podman, or a root without that capability, which makes runc
#   fail with "error setting rlimit type 8") this shell's hard limit in bytes, all it may grant. Nothing when
#   CONTAINER_RUN_EXTRA_ARGS already sets memlock.
#
# container_ptrace_wanted
#   True when the container should get CAP_SYS_PTRACE, for py-spy: CONTAINER_PTRACE=1, or auto (the default)
#   while the hang watchdog (stack dumps of a hung training) or Ray (its dashboard's stack traces) is on.
#   CONTAINER_PTRACE=0: never (a hang is still detected and acted on, without stacks).
#
# container_runtime_nvidia_present
#   True when `nvidia-smi -L` answers within 30 s (an NVIDIA GPU to hand to a container).
#
# container_nofile
#   Prints the open-files limit for the container: CONTAINER_NOFILE when it is a number, else ("auto", the
#   default) the smaller of 1048576 and this shell's hard limit, which an engine cannot raise.
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

# _container_runtime_cgroup_hybrid: true when /sys/fs/cgroup holds v1 controllers with a v2 tree beside them.
_container_runtime_cgroup_hybrid() {
  [[ $(stat -fc %T /sys/fs/cgroup 2>/dev/null) != cgroup2fs && $(stat -fc %T /sys/fs/cgroup/unified 2>/dev/null) == cgroup2fs ]]
}

# container_runtime_nvidia_present: `nvidia-smi -L` answers in time (also used by _container.sh's device flags).
container_runtime_nvidia_present() {
  command -v nvidia-smi >/dev/null 2>&1 && timeout -k 2 30 nvidia-smi -L >/dev/null 2>&1
}

# _container_runtime_has_gpu: an AMD GPU (/dev/kfd) or an NVIDIA one.
_container_runtime_has_gpu() {
  [[ -e ${_DEV_ROOT:-}/dev/kfd ]] || container_runtime_nvidia_present
}

# _container_runtime_image_usable RUNTIME: prints the image and returns 0 when RUNTIME can run DOCKER_IMAGE
# here without a registry, or when this host has a GPU (a missing image is then pulled as usual); prints
# the image and returns 1 otherwise. The settings are read in a subshell, so the caller's variables stay.
_container_runtime_image_usable() (
  local runtime=$1 settings=${BASH_SOURCE[0]%/*}/../../configs/container_settings.sh
  # shellcheck source=configs/container_settings.sh
  if [[ -f $settings ]]; then source "$settings"; fi
  local image=${DOCKER_IMAGE:-}
  echo "$image"
  [[ -n $image ]] || return 1
  if [[ $image == *.tar ]]; then [[ -f $image ]]; return; fi
  timeout -k 2 "${CONTAINER_RUNTIME_PROBE_TIMEOUT:-10}" "$runtime" image inspect "$image" >/dev/null 2>&1 && return 0
  _container_runtime_has_gpu
)

detect_container_runtime() {
  local requested=${CONTAINER_RUNTIME:-} runtime image passed=""
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
        _container_runtime_answers "$runtime" || continue
        if image=$(_container_runtime_image_usable "$runtime"); then echo "$runtime"; return 0; fi
        passed=${passed:-$runtime}
      done
      if [[ -n $passed ]]; then
        _container_runtime_err "note: $passed answers, but DOCKER_IMAGE=$image is not on this host and there" \
          "is no GPU to pull it for; training natively (build a CPU image with utils/build_image.sh, or set CONTAINER_RUNTIME=$passed)"
      fi
      echo none ;;
    *)
      _container_runtime_err "unknown CONTAINER_RUNTIME '$requested' (use podman, docker or none)"
      return 2 ;;
  esac
}

container_host_run_args() {
  local runtime=$1 extra=" ${CONTAINER_RUN_EXTRA_ARGS:-} " oci limit pid_max
  [[ $runtime == podman ]] || return 0
  if [[ $extra != *" --runtime"[\ =]* ]] && _container_runtime_cgroup_hybrid; then
    oci=$(timeout -k 2 "${CONTAINER_RUNTIME_PROBE_TIMEOUT:-10}" podman info --format '{{.Host.OCIRuntime.Name}}' 2>/dev/null || true)
    if [[ $oci == crun ]] && command -v runc >/dev/null 2>&1; then
      printf '%s\n' --runtime runc
    fi
  fi
  if [[ $extra != *"nproc="* ]]; then
    limit=$(ulimit -Hu)
    pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 4194304)
    if [[ $limit == unlimited ]] || (( limit > pid_max )); then limit=$pid_max; fi
    printf '%s\n' --ulimit "nproc=$limit:$limit"
  fi
}

container_memlock() {
  local runtime=$1 hard
  [[ " ${CONTAINER_RUN_EXTRA_ARGS:-} " != *memlock=* ]] || return 0
  if [[ $runtime == docker ]]; then echo -1; return 0; fi
  hard=$(ulimit -Hl)
  # podman's runtime sets the limit with our privileges: unlimited only where this shell could raise its own.
  if [[ $hard == unlimited ]] || (ulimit -Hl unlimited) 2>/dev/null; then echo -1; else echo $((hard * 1024)); fi
}

container_ptrace_wanted() {
  case ${CONTAINER_PTRACE:-auto} in
    1) return 0 ;;
    0) return 1 ;;
  esac
  [[ ! ${HANG_TIMEOUT:-} =~ ^(off|0|false|no)$ || ${RAY:-0} =~ ^(1|true|yes)$ ]]
}

container_nofile() {
  local want=${CONTAINER_NOFILE:-auto} hard
  if [[ $want != auto ]]; then echo "$want"; return 0; fi
  hard=$(ulimit -Hn)
  if [[ $hard == unlimited ]] || (( hard > 1048576 )); then hard=1048576; fi
  echo "$hard"
}
