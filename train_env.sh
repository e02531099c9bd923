# shellcheck shell=bash
# Summary: Runtime environment defaults for training (sourced by _train.sh, never run directly)
#
# Layering, last wins: this file -> configs/<model>.env.sh -> _env_KEY=VALUE passthrough args.
# Read a switch with `train_setting NAME DEFAULT`: it sees a value given as _env_NAME=... on the command
# line even though _train.sh exports those only after this file, so this file can branch on them.
# XLA_FLAGS is only ever appended to: flags baked into a training image stay in force.
#
# Switches (as environment or _env_ overrides):
#   TUNE_PROFILE=<name>     named XLA / collective tuning profile (see the two case blocks below)
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
# against what is deployed. Block 1 appends XLA flags (XLA keeps the last value of a repeated flag);
# block 2 sets collective / runtime knobs. `restore_default` puts XLA_FLAGS back to what the image gave
# (plus the flags this node needs to work at all) to measure the image alone.
#
# TUNE_PROFILE_FILE=<file> is a profile as data, applied after the named one: what `jobkit sweep xla` writes
# for each catalog profile, so a new profile needs no edit here. One item a line: `--name[=value]` is
# appended to XLA_FLAGS like the named profiles' flags, `NAME=VALUE` is exported (value taken literally),
# `#` comments and blank lines are skipped; any other line stops the job before training, naming the file
# and line. A setting's name must start with a prefix of configs/tune_env_prefixes.txt (XLA_, NCCL_, ...: the
# list `jobkit sweep xla` holds catalogs to), so that a profile stays data (no LD_PRELOAD, PYTHONPATH,
# BASH_ENV); and the file must be yours (or the workspace owner's, for root in a container) and writable by
# nobody else, since whoever can edit it decides what training runs with. The file is only read, never sourced. A relative path is taken from JOB_WORKSPACE, which is
# the same directory under another path inside the container.
TUNE_PROFILE=$(train_setting TUNE_PROFILE baseline)
TUNE_PROFILE_FILE=$(train_setting TUNE_PROFILE_FILE "")
export TUNE_PROFILE
apply_tune_profile() {
  _apply_named_tune_profile
  if [[ -n $TUNE_PROFILE_FILE ]]; then _apply_tune_profile_file "$TUNE_PROFILE_FILE" || return; fi
  return 0
}

# _tune_name_allowed NAME PREFIX...: true when NAME starts with one of the PREFIXes.
_tune_name_allowed() {
  local name=$1 prefix
  shift
  for prefix; do [[ $name == "$prefix"* ]] && return 0; done
  return 1
}

# _apply_tune_profile_file FILE: checks every line first, then applies them all (a bad line changes nothing).
_apply_tune_profile_file() {
  local file=$1 line number=0 name
  local -a flags=() settings=()
  [[ $file == /* ]] || file=${JOB_WORKSPACE:-$PWD}/$file
  if [[ ! -f $file || ! -r $file ]]; then
    echo "[train_env] ERROR: TUNE_PROFILE_FILE=$1: no readable file at $file; give an existing profile file (relative paths start at JOB_WORKSPACE)" >&2
    return 2
  fi
  local owner mode ws_owner=""
  read -r owner mode < <(stat -L -c '%u %a' -- "$file")
  [[ -n ${JOB_WORKSPACE:-} ]] && ws_owner=$(stat -c %u -- "$JOB_WORKSPACE" 2>/dev/null)
  if [[ $owner != "$EUID" && ! ($EUID == 0 && $owner == "$ws_owner") ]] || ((8#$mode & 022)); then
    echo "[train_env] ERROR: TUNE_PROFILE_FILE=$1: $file (owner uid $owner, mode $mode) is not a file only you can write; whoever can edit it decides what training runs with: copy it to a file of yours (chmod go-w)" >&2
    return 2
  fi
  local -a prefixes=()
  mapfile -t prefixes < <(grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "${BASH_SOURCE[0]%/*}/configs/tune_env_prefixes.txt")
  while IFS= read -r line || [[ -n $line ]]; do
    number=$((number + 1))
    line=${line%$'\r'}
    line=${line#"${line%%[![:space:]]*}"}   # trim leading, then trailing, blanks
    line=${line%"${line##*[![:space:]]}"}
    if [[ -z $line || $line == '#'* ]]; then continue
    elif [[ $line =~ ^--[A-Za-z0-9_]+(=[^[:space:]]*)?$ ]]; then flags+=("$line")
    elif [[ $line =~ ^([A-Za-z_][A-Za-z0-9_]*)=(.*)$ && ${BASH_REMATCH[1]} != XLA_FLAGS ]]; then
      name=${BASH_REMATCH[1]}
      if ! _tune_name_allowed "$name" "${prefixes[@]}"; then
        echo "[train_env] ERROR: $file:$number: $name is not a tuning variable; a profile may set only names starting with ${prefixes[*]} (configs/tune_env_prefixes.txt)" >&2
        return 2
      fi
      settings+=("$line")
    else
      echo "[train_env] ERROR: $file:$number: '$line' is not an XLA flag (--name=value, no spaces), a setting (NAME=VALUE, not XLA_FLAGS) or a # comment; fix that line" >&2
      return 2
    fi
  done <"$file"
  if ((${#flags[@]})); then append_xla_flags "${flags[@]}"; fi
  for line in "${settings[@]}"; do
    name=${line%%=*}
    export "$name=${line#*=}"
  done
  echo "[train_env] TUNE_PROFILE_FILE=$1 applied: ${#flags[@]} XLA flag(s), ${#settings[@]} setting(s)"
}

_apply_named_tune_profile() {
  case $TUNE_PROFILE in
    baseline|"") ;;
    restore_default)
      XLA_FLAGS="${_IMAGE_XLA_FLAGS:+$_IMAGE_XLA_FLAGS }$_FUNCTIONAL_XLA_FLAGS"
      XLA_FLAGS=${XLA_FLAGS% }; export XLA_FLAGS ;;
    ag_combine_256m) append_xla_flags "--xla_gpu_all_gather_combine_threshold_bytes=268435456" ;;
    ag_combine_1g) append_xla_flags "--xla_gpu_all_gather_combine_threshold_bytes=1073741824" ;;
    ag_rs_combine_1g)
      append_xla_flags "--xla_gpu_all_gather_combine_threshold_bytes=1073741824" \
        "--xla_gpu_reduce_scatter_combine_threshold_bytes=1073741824" ;;
    overlap_limit_2) append_xla_flags "--xla_gpu_experimental_parallel_collective_overlap_limit=2" ;;
    overlap_limit_4) append_xla_flags "--xla_gpu_experimental_parallel_collective_overlap_limit=4" ;;
    priority_stream) append_xla_flags "--xla_gpu_enable_highest_priority_async_stream=true" ;;
    lhs_on) append_xla_flags "--xla_gpu_enable_latency_hiding_scheduler=true" ;;
    double_buffer) append_xla_flags "--xla_gpu_enable_while_loop_double_buffering=true" ;;
    pipelined_collectives)
      append_xla_flags "--xla_gpu_enable_pipelined_all_gather=true" "--xla_gpu_enable_pipelined_reduce_scatter=true" \
        "--xla_gpu_enable_pipelined_all_reduce=true" ;;
    nccl_chan8|nccl_chan2|nccl_simple|nccl_ll128|mem95) ;;  # environment-only: block 2
    *) echo "[train_env] WARNING: unknown TUNE_PROFILE='$TUNE_PROFILE'; running without tuning changes (profiles are listed in train_env.sh)" >&2
       return 0 ;;
  esac
  case $TUNE_PROFILE in
    nccl_chan8) export NCCL_NCHANNELS_PER_NET_PEER=8 ;;
    nccl_chan2) export NCCL_NCHANNELS_PER_NET_PEER=2 ;;
    nccl_simple) export NCCL_PROTO=Simple ;;
    nccl_ll128) export NCCL_PROTO=LL128 ;;
    mem95) export XLA_PYTHON_CLIENT_MEM_FRACTION=.95 ;;
  esac
  [[ $TUNE_PROFILE == baseline ]] || echo "[train_env] TUNE_PROFILE=$TUNE_PROFILE applied"
}
