# shellcheck shell=bash
# Summary: deepseek3-671b runtime env: XLA collective flags chosen by the parallelism actually in use
#
# Sourced by _train.sh after train_env.sh and before TUNE_PROFILE and _env_KEY=VALUE overrides, so
# both still win. Only appends to XLA_FLAGS (XLA keeps the last value of a repeated flag).
# The layout comes from configs/deepseek3-671b.yml, overridden by any key=value in PASSTHROUGH_ARGS,
# so `submit.sh deepseek -N 16 -- dcn_pipeline_parallelism=4 dcn_fsdp_parallelism=4` switches sets.
#
# No pipeline stages (the shipped layout: experts inside a node, FSDP across nodes): each of the
# 58 MoE layers all-gathers its 256 experts' weights across nodes as many small collectives;
# combining them into up to 1 GiB messages trades a little HBM for far fewer, bandwidth-bound launches.
# Pipeline stages: the stage-to-stage transfers must overlap the in-stage collectives, so allow two
# collectives in flight; with the ragged all-to-all of sparse_matmul on the critical path, also give
# async collectives the highest-priority stream so they do not queue behind compute.

# _ds3_setting KEY: KEY's value from the command line, else from the yml next to this file, else 1.
_ds3_setting() {
  local key=$1 arg value="" yml=${BASH_SOURCE[0]%.env.sh}.yml
  local -a args=()
  read -r -a args <<<"${PASSTHROUGH_ARGS:-}"
  for arg in "${args[@]}"; do
    [[ $arg == "$key="* ]] && value=${arg#*=}
  done
  if [[ -z $value && -f $yml ]]; then
    value=$(sed -n "s/^$key:[[:space:]]*\([^[:space:]#]*\).*/\1/p" "$yml" | tail -n 1)
  fi
  value=${value//[\"\']/}
  printf '%s' "${value:-1}"
}

_ds3_pipelined() {  # true when either pipeline axis is more than 1 stage (-1: sized by MaxText, so > 1)
  local axis value
  for axis in dcn_pipeline_parallelism ici_pipeline_parallelism; do
    value=$(_ds3_setting "$axis")
    [[ $value == -1 ]] && return 0
    [[ $value =~ ^[0-9]+$ ]] && (( value > 1 )) && return 0
  done
  return 1
}

_ds3_flags=()
if _ds3_pipelined; then
  _ds3_flags+=(--xla_gpu_experimental_parallel_collective_overlap_limit=2)
  if [[ $(_ds3_setting sparse_matmul) =~ ^([Tt]rue|1)$ ]]; then
    _ds3_flags+=(--xla_gpu_enable_highest_priority_async_stream=true)
  fi
else
  _ds3_flags+=(--xla_gpu_all_gather_combine_threshold_bytes=1073741824)
fi
XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }${_ds3_flags[*]}"
export XLA_FLAGS
echo "[deepseek3-671b.env.sh] appended to XLA_FLAGS: ${_ds3_flags[*]}"
unset -v _ds3_flags
unset -f _ds3_setting _ds3_pipelined
