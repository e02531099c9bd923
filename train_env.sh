# shellcheck shell=bash
# Summary: Runtime environment defaults for training (sourced by _train.sh, never run directly)
#
# Layering, last wins: this file -> configs/<model>.env.sh -> _env_KEY=VALUE passthrough args.
# Read a switch with `train_setting NAME DEFAULT`: it sees a value given as _env_NAME=... on the command
# line even though _train.sh exports those only after this file, so this file can branch on them.
# XLA_FLAGS is only ever appended to: flags baked into a training image stay in force.
#
# Switches (as environment or _env_ overrides):
#   TUNE_PROFILE=<name>     named XLA / collective tuning profile (listed in utils/lib/tune_profile.sh)
#   TUNE_PROFILE_FILE=<f>   a tuning profile as data: --xla flags and NAME=VALUE lines (see Tuning profiles)
#   ENABLE_XLA_DUMP=1       dump HLO of the train step into <job dir>/xla_dump (node rank 0 only)
#   CPU_DEVICES_PER_NODE=N  on a CPU-only node, emulate N devices in one process (default 1)
#   JAX_CACHE_DIR=<dir>     persistent JAX compilation cache (default <workspace>/.jax_cache/uid-<uid>: each
#                           user's own, since its entries are executables training runs; _train.sh does not
#                           use one that is not this user's alone)

# train_setting NAME DEFAULT: the real environment, else a command-line _env_ value, else DEFAULT.
train_setting() {
  local name=$1 default=${2-}
  if [[ -v $name ]]; then printf '%s' "${!name}"
  elif [[ -v "ENV_OVERRIDES[$name]" ]]; then printf '%s' "${ENV_OVERRIDES[$name]}"
  else printf '%s' "$default"
  fi
}

_is_true() { [[ ${1,,} =~ ^(1|y|yes|true|on)$ ]]; }

append_xla_flags() {
  XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }$*"
  export XLA_FLAGS
}

# Flags a node needs to work at all (device emulation, HLO dump); restore_default keeps them.
_add_functional_xla_flags() {
  _FUNCTIONAL_XLA_FLAGS="${_FUNCTIONAL_XLA_FLAGS:+$_FUNCTIONAL_XLA_FLAGS }$*"
  append_xla_flags "$@"
}

_IMAGE_XLA_FLAGS=${XLA_FLAGS:-}
_FUNCTIONAL_XLA_FLAGS=""

# --- Accelerator ---
GPU_VENDOR=$(detect_gpu_vendor)
export GPU_VENDOR
if [[ $GPU_VENDOR == none ]]; then
  export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
  echo "[train_env] no GPU on $(hostname -s): JAX_PLATFORMS=$JAX_PLATFORMS (CPU backend)"
  if [[ ${XLA_FLAGS:-} != *xla_force_host_platform_device_count* ]]; then
    _add_functional_xla_flags "--xla_force_host_platform_device_count=$(train_setting CPU_DEVICES_PER_NODE 1)"
  fi
else
  # Command buffers (CUDA/HIP graphs) have hung collective-heavy steps on recent JAX; opt back in per job.
  append_xla_flags "--xla_gpu_enable_command_buffer="
fi

# --- Python / JAX process ---
export PYTHONUNBUFFERED=1
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-.93}
JAX_CACHE_DIR=$(train_setting JAX_CACHE_DIR "${JOB_WORKSPACE:-$PWD}/.jax_cache/uid-$EUID")
export JAX_CACHE_DIR JAX_COMPILATION_CACHE_DIR=$JAX_CACHE_DIR

# --- Collectives (NCCL on NVIDIA, RCCL reads the same names on AMD) ---
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export NCCL_CHECKS_DISABLE=${NCCL_CHECKS_DISABLE:-1}
export NCCL_IB_QPS_PER_CONNECTION=${NCCL_IB_QPS_PER_CONNECTION:-4}
export NCCL_NSOCKS_PERTHREAD=${NCCL_NSOCKS_PERTHREAD:-4}
export NCCL_SOCKET_NTHREADS=${NCCL_SOCKET_NTHREADS:-8}
export NCCL_NCHANNELS_PER_NET_PEER=${NCCL_NCHANNELS_PER_NET_PEER:-4}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}

# Network for collectives (IB HCAs, RoCE GID index, socket interface), read from sysfs; values already in
# the environment win, and _env_ overrides are exported after this file.
if [[ $GPU_VENDOR != none ]]; then detect_nccl_env; fi

if [[ $GPU_VENDOR == amd ]]; then
  export HSA_FORCE_FINE_GRAIN_PCIE=${HSA_FORCE_FINE_GRAIN_PCIE:-1}
  export HSA_NO_SCRATCH_RECLAIM=${HSA_NO_SCRATCH_RECLAIM:-1}
  export GPU_MAX_HW_QUEUES=${GPU_MAX_HW_QUEUES:-2}
  export NVTE_FRAMEWORK=${NVTE_FRAMEWORK:-jax}
  export NVTE_USE_ROCM=${NVTE_USE_ROCM:-1}
  export NVTE_FUSED_ATTN=${NVTE_FUSED_ATTN:-1}
  export NVTE_FUSED_ATTN_CK=${NVTE_FUSED_ATTN_CK:-1}
  export NVTE_FUSED_ATTN_AOTRITON=${NVTE_FUSED_ATTN_AOTRITON:-0}
fi

# --- HLO dump (rank 0 only: every rank compiles the same program) ---
if _is_true "$(train_setting ENABLE_XLA_DUMP 0)" && [[ ${NODE_RANK:-0} == 0 ]]; then
  XLA_DUMP_DIR=${JOB_WORKSPACE:-$PWD}/${JOB_DIR:-xla}/xla_dump
  _add_functional_xla_flags "--xla_dump_to=$XLA_DUMP_DIR" --xla_dump_hlo_as_text "--xla_dump_hlo_module_re=.*train_step.*"
  echo "[train_env] ENABLE_XLA_DUMP: HLO of the train step goes to $XLA_DUMP_DIR"
fi

# --- Tuning profiles ---
# apply_tune_profile runs after configs/<model>.env.sh (called by _train.sh), so a profile is measured
# against what is deployed. The named profiles (TUNE_PROFILE) are listed in utils/lib/tune_profile.sh: XLA
# flags are appended (XLA keeps the last value of a repeated flag), collective / runtime knobs exported.
# `restore_default` puts XLA_FLAGS back to what the image gave (plus the flags this node needs to work at all)
# to measure the image alone. An unknown name stops the job (run_local.sh and submit.sh refuse it first).
#
# TUNE_PROFILE_FILE=<file> is a profile as data, applied after the named one: what `jobkit sweep xla` writes
# for each catalog profile, so a new profile needs no edit here. One item a line: `--name[=value]` is
# appended to XLA_FLAGS like the named profiles' flags, `NAME=VALUE` is exported (value taken literally),
# `#` comments and blank lines are skipped; any other line stops the job before training, naming the file
# and line. A setting's name must start with a prefix of configs/tune_env_prefixes.txt (XLA_, NCCL_, ...: the
# list `jobkit sweep xla` holds catalogs to), so that a profile stays data (no LD_PRELOAD, PYTHONPATH,
# BASH_ENV); and the file must be yours (or the workspace owner's, for root in a container) and writable by
# nobody else, since whoever can edit it decides what training runs with. The file is only read, never
# sourced. A relative path is taken from JOB_WORKSPACE, which is the same directory under another path inside
# the container. utils/lib/tune_profile.sh holds these checks; the launchers make them before a job exists,
# and they are made again here because the file may change while a job is queued.
# shellcheck source=utils/lib/tune_profile.sh
source "${BASH_SOURCE[0]%/*}/utils/lib/tune_profile.sh"
TUNE_PROFILE=$(train_setting TUNE_PROFILE baseline)
TUNE_PROFILE_FILE=$(train_setting TUNE_PROFILE_FILE "")
export TUNE_PROFILE
apply_tune_profile() {
  _apply_named_tune_profile || return
  if [[ -n $TUNE_PROFILE_FILE ]]; then _apply_tune_profile_file "$TUNE_PROFILE_FILE" || return; fi
  return 0
}

# _apply_tune_profile_file FILE: checks every line first, then applies them all (a bad line changes nothing).
_apply_tune_profile_file() {
  local line name
  tune_profile_read_file "[train_env] ERROR: " "$1" "${JOB_WORKSPACE:-$PWD}" || return 2
  if ((${#TUNE_PROFILE_FLAGS[@]})); then append_xla_flags "${TUNE_PROFILE_FLAGS[@]}"; fi
  for line in "${TUNE_PROFILE_SETTINGS[@]}"; do
    name=${line%%=*}
    export "$name=${line#*=}"
  done
  echo "[train_env] TUNE_PROFILE_FILE=$1 applied: ${#TUNE_PROFILE_FLAGS[@]} XLA flag(s), ${#TUNE_PROFILE_SETTINGS[@]} setting(s)"
}

_apply_named_tune_profile() {
  local item
  local -a flags=()
  tune_profile_check_name "[train_env] ERROR: " "$TUNE_PROFILE" || return 2
  case $TUNE_PROFILE in
    baseline|"") return 0 ;;
    restore_default)
      XLA_FLAGS="${_IMAGE_XLA_FLAGS:+$_IMAGE_XLA_FLAGS }$_FUNCTIONAL_XLA_FLAGS"
      XLA_FLAGS=${XLA_FLAGS% }; export XLA_FLAGS ;;
  esac
  while IFS= read -r item; do
    if [[ $item == --* ]]; then flags+=("$item"); else export "${item%%=*}=${item#*=}"; fi
  done < <(tune_profile_named_lines "$TUNE_PROFILE")
  if ((${#flags[@]})); then append_xla_flags "${flags[@]}"; fi
  echo "[train_env] TUNE_PROFILE=$TUNE_PROFILE applied"
}
