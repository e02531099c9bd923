# shellcheck shell=bash
# The variables documented below are outputs for the caller, which shellcheck cannot see.
# shellcheck disable=SC2034
# Summary: The launch grammar shared by run_local.sh and submit.sh (sourced library)
#
#   <entry> <MODEL_SPEC> [scheduler args ...] [-- <maxtext key=value | _env_KEY=VALUE> ...]
#
# MODEL_SPEC is model | model:tag | model:alias: | model:alias:tag. Functions report errors on stderr as
# "<calling script>: <problem>; <fix>" and return non-zero; they never exit the caller.
#
# parse_launch_args sets these variables in the caller, and only these:
#   MODEL_INPUT        the model part as typed (resolve it with resolve_model)
#   MODEL_NAME_ALIAS   alias part or empty
#   EXP_TAG            tag part plus the passthrough suffix, or empty
#   SCHEDULER_ARGS     array: arguments between MODEL_SPEC and "--"
#   PASSTHROUGH_ARGS   array: arguments after "--", empty strings dropped

_launch_err() { echo "${0##*/}: $*" >&2; }

# shellcheck source=utils/lib/env_mask.sh
source "$(dirname "${BASH_SOURCE[0]}")/env_mask.sh"

# jobkit's exit code for a refused setting (jobkit.core.errors.EXIT_SETTINGS; tests/py/test_errors.py holds the
# two equal): `jobkit hang-watchdog --check` and `jobkit procs --check` give it for a bad HANG_* or
# LOCAL_WORLD_SIZE, which stops the launch; any other failure of theirs means this host cannot run jobkit.
LAUNCH_SETTING_REFUSED_RC=5

# Characters kept in names that become file names; anything else turns into "_".
_LAUNCH_NAME_SAFE='A-Za-z0-9._+-'

# One passthrough arg -> its experiment-tag form: leading dashes dropped, "=" and unsafe chars -> "_". The tag
# is the Slurm job name every cluster user sees: a value that may be a credential's is left out, the name
# kept (env_mask_tag_word: _env_WANDB_API_KEY=... -> _env_WANDB_API_KEY).
passthrough_tag_word() {
  local word
  word=$(env_mask_tag_word "$1")
  while [[ $word == -* ]]; do word=${word#-}; done
  printf '%s' "${word//[^$_LAUNCH_NAME_SAFE]/_}"
}

# Joins the tag forms of all passthrough args with "-".
passthrough_tag_suffix() {
  local arg out=""
  for arg in "$@"; do
    out+=${out:+-}$(passthrough_tag_word "$arg")
  done
  printf '%s' "$out"
}

# Accepts `key=value` (a MaxText override) and `_env_NAME=VALUE` (an environment override). No control
# characters: a newline would start a line of its own in the log's KEY=VALUE header, which tools parse.
validate_passthrough_arg() {
  local arg=$1
  if [[ $arg == *[[:cntrl:]]* ]]; then
    _launch_err "passthrough argument '${arg%%[[:cntrl:]]*}...' has a control character (newline, tab, ...); write it on one line, without tabs"
    return 1
  fi
  if [[ $arg == _env_* ]]; then
    if [[ $arg != *=* ]]; then
      _launch_err "'$arg' has no '='; write environment overrides as _env_NAME=VALUE"; return 1
    fi
    local name=${arg%%=*}; name=${name#_env_}
    if [[ -z $name ]]; then
      _launch_err "'$arg' names no variable; write environment overrides as _env_NAME=VALUE"; return 1
    fi
    if [[ ! $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
      _launch_err "'$name' in '$arg' is not a valid environment variable name; use letters, digits and _"; return 1
    fi
    return 0
  fi
  if [[ ! $arg =~ ^[A-Za-z_][A-Za-z0-9_.]*= ]]; then
    _launch_err "passthrough argument '$arg' is not key=value; MaxText overrides after '--' look like steps=10 (no leading dashes)"
    return 1
  fi
}

# Splits MODEL_SPEC into MODEL_INPUT, MODEL_NAME_ALIAS and the tag (before any passthrough suffix).
parse_model_spec() {
  local spec=$1 colons
  if [[ -z $spec ]]; then
    _launch_err "empty model spec; give a model, e.g. tiny or llama2-70b:mytag"; return 1
  fi
  colons=${spec//[^:]/}
  MODEL_INPUT=$spec MODEL_NAME_ALIAS="" EXP_TAG=""
  case ${#colons} in
    0) ;;
    1) MODEL_INPUT=${spec%%:*} EXP_TAG=${spec#*:} ;;
    2) MODEL_INPUT=${spec%%:*}; local rest=${spec#*:}; MODEL_NAME_ALIAS=${rest%%:*} EXP_TAG=${rest#*:} ;;
    *) _launch_err "too many ':' in model spec '$spec'; use model, model:tag, model:alias: or model:alias:tag"; return 1 ;;
  esac
  if [[ -z $MODEL_INPUT ]]; then
    _launch_err "model spec '$spec' has no model before ':'; e.g. tiny:$EXP_TAG"; return 1
  fi
  local field
  for field in "$MODEL_INPUT" "$MODEL_NAME_ALIAS" "$EXP_TAG"; do
    if [[ $field =~ [^$_LAUNCH_NAME_SAFE] ]]; then
      _launch_err "'$field' in model spec '$spec' has characters unsafe in file names; use letters, digits and . _ + -"
      return 1
    fi
  done
  if [[ -n $MODEL_NAME_ALIAS && $MODEL_NAME_ALIAS == .* ]]; then
    _launch_err "alias '$MODEL_NAME_ALIAS' would be a hidden directory; start it with a letter or digit"; return 1
  fi
}

# parse_launch_args "$@": see the header for what it sets.
parse_launch_args() {
  SCHEDULER_ARGS=() PASSTHROUGH_ARGS=()
  local -a script_args=()
  local seen_separator=0 arg
  for arg in "$@"; do
    if (( ! seen_separator )) && [[ $arg == -- ]]; then seen_separator=1; continue; fi
    if (( seen_separator )); then
      [[ -n $arg ]] && PASSTHROUGH_ARGS+=("$arg")
    else
      script_args+=("$arg")
    fi
  done
  if (( ${#script_args[@]} == 0 )); then
    _launch_err "no model given; usage: ${0##*/} <model>[:tag] [-- key=value ...]"; return 1
  fi
  if [[ ${script_args[0]} == -* ]]; then
    _launch_err "the first argument must be the model, got '${script_args[0]}'; e.g. ${0##*/} tiny ${script_args[0]} ..."
    return 1
  fi
  parse_model_spec "${script_args[0]}" || return 1
  SCHEDULER_ARGS=("${script_args[@]:1}")
  for arg in "${PASSTHROUGH_ARGS[@]}"; do
    validate_passthrough_arg "$arg" || return 1
  done
  if (( ${#PASSTHROUGH_ARGS[@]} )); then
    local suffix
    suffix=$(passthrough_tag_suffix "${PASSTHROUGH_ARGS[@]}")
    EXP_TAG=${EXP_TAG:+$EXP_TAG-}$suffix
  fi
}

# job_name MODEL_NAME EXP_TAG -> JAX-<model>[-<tag>]
job_name() { printf 'JAX-%s%s' "$1" "${2:+-$2}"; }

# check_job_name_length JOB_NAME JOB_ID: "<JOB_ID>-<JOB_NAME>.log" must fit one file name (255 bytes).
check_job_name_length() {
  local name=$1 job_id=$2 length
  length=$(( $(LC_ALL=C; printf '%s' "$job_id-$name.log" | wc -c) ))
  if (( length > 255 )); then
    _launch_err "job name is $length bytes as a log file name (limit 255); shorten the passthrough args or use model:alias:tag with a short tag"
    return 1
  fi
}

# launch_args_json ARG... -> the arguments as a JSON array of strings, so that they can be read back exactly
# (printf %q writes $'...' for a tab, which Python's shlex cannot read). Control characters become \uXXXX.
launch_args_json() {
  local arg out="" sep="" c i escaped
  for arg in "$@"; do
    arg=${arg//\\/\\\\}
    arg=${arg//\"/\\\"}
    if [[ $arg == *[[:cntrl:]]* ]]; then
      escaped=""
      for ((i = 0; i < ${#arg}; i++)); do
        c=${arg:i:1}
        [[ $c == [[:cntrl:]] ]] && printf -v c '\\u%04x' "'$c"
        escaped+=$c
      done
      arg=$escaped
    fi
    out+=$sep\"$arg\"
    sep=,
  done
  printf '[%s]' "$out"
}

# launch_check_alias_dir WORKSPACE NAME [PASSTHROUGH ...]: with enable_checkpointing=true among the
# passthrough args, training resumes from, and writes its checkpoints into, WORKSPACE/NAME (NAME: the alias,
# else the model; see _train.sh's _output_path), a dir found by name alone. Returns 1 with a one-line error
# when it exists and is another user's (or a link of theirs): resuming would load their checkpoint, and
# training would write into their run. Root in a rootful container may use the workspace owner's dir.
launch_check_alias_dir() {
  local ws=$1 name=$2 arg dir owner link_owner
  shift 2
  for arg in "$@"; do
    [[ ${arg,,} =~ ^enable_checkpointing=(true|1|yes)$ ]] || continue
    dir=$ws/$name
    [[ -e $dir || -L $dir ]] || return 0
    link_owner=$(stat -c %u "$dir") && owner=$(stat -L -c %u "$dir" 2>/dev/null) || owner=$link_owner
    if ! _launch_own_uid "$link_owner" "$ws" || ! _launch_own_uid "$owner" "$ws"; then
      (( link_owner == owner )) || owner="$link_owner/$owner"
      _launch_err "checkpoint dir $dir belongs to uid $owner, not to you (uid $EUID): enable_checkpointing=true would resume from their checkpoint and write into it; use an alias of your own (model:<alias>:) or your own JOB_WORKSPACE"
      return 1
    fi
    return 0
  done
}

# launch_setting NAME ARG...: what the training tier will read for the setting NAME (train_env.sh's
# train_setting): the environment's value, else the last _env_NAME= among ARGs with one pair of surrounding
# quotes taken off (_train.sh's _strip_quotes). Prints nothing and returns 1 when neither sets it.
launch_setting() {
  local name=$1 arg value found=0
  shift
  if [[ -v $name ]]; then printf '%s' "${!name}"; return 0; fi
  for arg; do
    if [[ $arg == "_env_$name="* ]]; then value=${arg#*=}; found=1; fi
  done
  ((found)) || return 1
  if [[ ${#value} -ge 2 && ( ($value == \"*\" ) || ($value == \'*\') ) ]]; then value=${value:1:-1}; fi
  printf '%s' "$value"
}

# launch_check_procs JOBKIT ARG...: LOCAL_WORLD_SIZE (a process per device, py/jobkit/launch/procs.py; a count or
# auto), checked before the job exists: the environment's value and every _env_LOCAL_WORLD_SIZE= among ARGs, so
# that none is found bad only on the nodes. Exports the value training will use, so the job's header shows it:
# _train.sh applies _env_ overrides after the environment, so the last _env_ one, else the environment's.
# Returns 2 after the checker's one-line error.
launch_check_procs() {
  local jobkit=$1 arg value used="" given=0
  shift
  local -a values=()
  [[ -v LOCAL_WORLD_SIZE ]] && values+=("$LOCAL_WORLD_SIZE")
  for arg; do
    [[ $arg == _env_LOCAL_WORLD_SIZE=* ]] || continue
    value=${arg#*=}
    if [[ ${#value} -ge 2 && ( ($value == \"*\" ) || ($value == \'*\') ) ]]; then value=${value:1:-1}; fi
    values+=("$value")
  done
  for value in "${values[@]}"; do
    given=1 used=$value
    # auto (one per usable GPU) is resolved on each node by _train.sh, where the GPUs are.
    [[ $value == auto ]] && continue
    # LAUNCH_SETTING_REFUSED_RC is a bad value. Anything else means this host cannot run jobkit (a container
    # runtime with no host tools, as for the hang watchdog's check): each node's _train.sh checks it again.
    local rc=0 err
    err=$(LOCAL_WORLD_SIZE=$value NNODES=1 NODE_RANK=0 "$jobkit" procs --check 2>&1 >/dev/null) || rc=$?
    if (( rc == LAUNCH_SETTING_REFUSED_RC )); then echo "$err" >&2; return 2; fi
  done
  (( given )) || return 0
  export LOCAL_WORLD_SIZE=$used
}

# _launch_own_uid UID WORKSPACE: UID is this user's, or (running as root: a rootful container) the workspace's owner's.
_launch_own_uid() {
  [[ $1 == "$EUID" ]] || { (( EUID == 0 )) && [[ $1 == "$(stat -c %u "$2")" ]]; }
}
