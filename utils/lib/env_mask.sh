# shellcheck shell=bash
# Summary: What of a variable or a passthrough argument may be shown, and where (sourced library)
#
# One policy for every place that shows settings: the environment record and the `_env_ override:` lines
# (_train.sh), the log header's PASSTHROUGH_ARGS (utils/lib/job_log.sh) and the experiment tag, which becomes
# the Slurm job name (everyone's squeue) and the log and job dir names (utils/lib/launch_args.sh).
#
#   env_mask_secret_name NAME            true when NAME is a credential's (HF_TOKEN, WANDB_API_KEY, GH_PAT, ...)
#   env_mask_value NAME VALUE [OWN]      VALUE as a record shows it, or *** (OWN=1: a setting the job gave itself)
#   env_mask_in_text TEXT                TEXT with URL passwords and credential _env_ values masked
#   env_mask_arg ARG                     a passthrough argument as a log shows it
#   env_mask_tag_word ARG                the part of a passthrough argument that a public name may carry
#   env_mask_pass_env_names              the names in PASS_ENV, one per line; non-zero with a message if bad

# Values shown in records: what shapes training and says where it ran. Every other variable is recorded as
# NAME=*** (that it was set is worth knowing; its value may be a credential).
ENV_MASK_SHOWN='^((XLA|JAX|NCCL|RCCL|NVTE|HSA|HIP|ROCM|ROCR|GPU|CUDA|TF|UCX|FI|OMP|MKL|RAY|SLURM|HANG|COREDUMP|TUNE|STAGE|JOB|MODEL|EXP|CONTAINER|MAXTEXT|TRAIN|OBS|TB|PROMETHEUS|TENSORBOARD|EXPORTER|NODELIST|LC)_[A-Za-z0-9_]*|PATH|LD_LIBRARY_PATH|PYTHONPATH|PYTHONUNBUFFERED|VIRTUAL_ENV|HOSTNAME|HOME|USER|LANG|NNODES|NODE_RANK|OUTPUT_PATH|PASSTHROUGH_ARGS|DOCKER_IMAGE|DATASET_DIR|CPU_DEVICES_PER_NODE|HARDWARE_PEAK_TFLOPS|ENABLE_XLA_DUMP|PASS_ENV)$'
# Names that look like a credential's, whatever their prefix (matched upper-cased).
ENV_MASK_SECRET='(TOKEN|SECRET|PASSW|API_?KEY|_KEY$|_PAT$|KEY_ID|CREDENTIAL|AUTH|PRIVATE|COOKIE|WEBHOOK|_URLS?$)'

# env_mask_secret_name NAME: true when NAME is a credential's name.
env_mask_secret_name() { [[ ${1^^} =~ $ENV_MASK_SECRET ]]; }

# env_mask_value NAME VALUE [OWN]: VALUE whole, with URL passwords and secret _env_ arguments in it masked; or
# *** when NAME is a credential's, VALUE has several lines, or NAME is neither in ENV_MASK_SHOWN nor OWN=1
# (one of the job's own _env_ overrides).
env_mask_value() {
  local name=$1 value=$2 own=${3:-0}
  if env_mask_secret_name "$name" || [[ $value == *$'\n'* ]] ||
     ! { (( own )) || [[ $name =~ $ENV_MASK_SHOWN ]]; }; then
    printf '***'
    return
  fi
  env_mask_in_text "$value"
}

# env_mask_in_text TEXT: TEXT with the user:password of any URL and the value of any credential's _env_
# argument in it (a PASSTHROUGH_ARGS string) masked.
env_mask_in_text() {
  local text=$1
  if [[ $text == *://*@* || $text == *_env_* ]]; then
    text=$(sed -E 's#(://)[^/@[:space:]]*@#\1***@#g;
      s/(_env_[A-Za-z0-9_]*(TOKEN|SECRET|PASSW|API_?KEY|_KEY|_PAT|KEY_ID|CREDENTIAL|AUTH|PRIVATE|COOKIE|WEBHOOK|_URL)[A-Za-z0-9_]*=)[^ ]*/\1***/Ig' <<<"$text")
  fi
  printf '%s' "$text"
}

# env_mask_arg ARG: `_env_NAME=VALUE` as `_env_NAME=<env_mask_value NAME VALUE 1>`, a MaxText `key=value` with
# a credential's key (hf_access_token) as `key=***`; URL passwords masked in any value.
env_mask_arg() {
  local arg=$1 key value
  if [[ $arg != *=* ]]; then printf '%s' "$arg"; return; fi
  key=${arg%%=*} value=${arg#*=}
  if [[ $key == _env_* ]]; then
    printf '%s=%s' "$key" "$(env_mask_value "${key#_env_}" "$value" 1)"
  elif env_mask_secret_name "$key" || [[ $value == *$'\n'* ]]; then
    printf '%s=***' "$key"
  else
    printf '%s=%s' "$key" "$(env_mask_in_text "$value")"
  fi
}

# env_mask_tag_word ARG: ARG for a name every cluster user sees (the tag, hence the Slurm job name and the
# log and job dir names). An _env_ value is kept only for a name in ENV_MASK_SHOWN (training's own knobs:
# _env_TUNE_PROFILE=mem95, _env_XLA_FLAGS=...) that is not a credential's; otherwise, and for a MaxText
# key=value with a credential's key or a URL with a password, the name alone (_env_WANDB_API_KEY).
env_mask_tag_word() {
  local arg=$1 key value
  if [[ $arg != *=* ]]; then printf '%s' "$arg"; return; fi
  key=${arg%%=*} value=${arg#*=}
  if [[ $key == _env_* ]]; then
    local name=${key#_env_}
    if env_mask_secret_name "$name" || [[ ! $name =~ $ENV_MASK_SHOWN || $value == *://*@* ]]; then
      printf '%s' "$key"; return
    fi
  elif env_mask_secret_name "$key" || [[ $value == *://*@* ]]; then
    printf '%s' "$key"; return
  fi
  printf '%s' "$arg"
}

# env_mask_pass_env_names: PASS_ENV (names separated by commas or spaces) one name per line. Each must be a
# variable name that is set here: the point of PASS_ENV is a value taken from this environment by name.
env_mask_pass_env_names() {
  local -a names=()
  local name
  IFS=', ' read -r -a names <<<"${PASS_ENV:-}"
  for name in "${names[@]}"; do
    [[ -n $name ]] || continue
    if [[ ! $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
      echo "${0##*/}: PASS_ENV names '$name', which is not a variable name; list names only, e.g. PASS_ENV=HF_TOKEN,WANDB_API_KEY (the values stay in your environment)" >&2
      return 1
    fi
    if [[ ! -v $name ]]; then
      echo "${0##*/}: PASS_ENV names $name, which is not set here; export $name first, or drop it from PASS_ENV" >&2
      return 1
    fi
    printf '%s\n' "$name"
  done
}
