# shellcheck shell=bash
# TUNE_PROFILE_FLAGS, TUNE_PROFILE_SETTINGS and TUNE_PROFILE_PATH are for the caller, which shellcheck cannot see.
# shellcheck disable=SC2034
# Summary: Tuning profiles: the one list of named profiles (TUNE_PROFILE) and the one reader of profile files (TUNE_PROFILE_FILE) (sourced library)
# Usage: source utils/lib/tune_profile.sh, then:
#   tune_profile_check_name PREFIX NAME
#                          NAME is empty or a named profile; else one line "<PREFIX>TUNE_PROFILE='x' is not a
#                          tuning profile; ..." on stderr, return 2
#   tune_profile_named_lines NAME
#                          the named profile's items, one a line, in TUNE_PROFILE_FILE's grammar (--flag=value,
#                          NAME=VALUE); restore_default and baseline have none (train_env.sh handles restore_default)
#   tune_profile_read_file PREFIX VALUE WORKSPACE
#                          checks the profile file VALUE (relative to WORKSPACE): a readable regular text file,
#                          yours (or WORKSPACE's owner's, for root in a container) and writable by nobody else,
#                          every line a flag, an allowed setting, a # comment or blank. Sets TUNE_PROFILE_PATH,
#                          TUNE_PROFILE_FLAGS and TUNE_PROFILE_SETTINGS (arrays); else one line "<PREFIX>..." on
#                          stderr naming the file (and line) and the fix, return 2, and nothing is set
#   tune_profile_launch_check WORKSPACE PASSTHROUGH_ARG...
#                          what run_local.sh and submit.sh call before a job exists: the TUNE_PROFILE and
#                          TUNE_PROFILE_FILE the job will read (the environment's, else the last _env_NAME= after
#                          `--`, as train_env.sh's train_setting does), checked by the two functions above
#
# train_env.sh runs the same checks again at job time (the file may change while a job is queued); a launcher
# runs them first so that a typo is refused before a job id, log or job dir exists.

_TUNE_PROFILE_LIB_DIR=$(dirname "${BASH_SOURCE[0]}")

# The named profiles: name -> its items (space-separated; no item holds a space). The first block appends XLA
# flags (XLA keeps the last value of a repeated flag); the second sets collective / runtime knobs.
# restore_default puts XLA_FLAGS back to what the image gave (train_env.sh does it: it knows those flags).
declare -gA TUNE_PROFILE_NAMED=(
  [baseline]=""
  [restore_default]=""
  [ag_combine_256m]="--xla_gpu_all_gather_combine_threshold_bytes=268435456"
  [ag_combine_1g]="--xla_gpu_all_gather_combine_threshold_bytes=1073741824"
  [ag_rs_combine_1g]="--xla_gpu_all_gather_combine_threshold_bytes=1073741824 --xla_gpu_reduce_scatter_combine_threshold_bytes=1073741824"
  [overlap_limit_2]="--xla_gpu_experimental_parallel_collective_overlap_limit=2"
  [overlap_limit_4]="--xla_gpu_experimental_parallel_collective_overlap_limit=4"
  [priority_stream]="--xla_gpu_enable_highest_priority_async_stream=true"
  [lhs_on]="--xla_gpu_enable_latency_hiding_scheduler=true"
  [double_buffer]="--xla_gpu_enable_while_loop_double_buffering=true"
  [pipelined_collectives]="--xla_gpu_enable_pipelined_all_gather=true --xla_gpu_enable_pipelined_reduce_scatter=true --xla_gpu_enable_pipelined_all_reduce=true"
  [nccl_chan8]="NCCL_NCHANNELS_PER_NET_PEER=8"
  [nccl_chan2]="NCCL_NCHANNELS_PER_NET_PEER=2"
  [nccl_simple]="NCCL_PROTO=Simple"
  [nccl_ll128]="NCCL_PROTO=LL128"
  [mem95]="XLA_PYTHON_CLIENT_MEM_FRACTION=.95"
)

tune_profile_check_name() {
  local prefix=$1 name=$2 names
  [[ -z $name || -v "TUNE_PROFILE_NAMED[$name]" ]] && return 0
  names=$(printf '%s\n' "${!TUNE_PROFILE_NAMED[@]}" | sort | paste -sd ' ')
  # The name is shown with control characters replaced: it may come from a typo'd environment.
  echo "${prefix}TUNE_PROFILE='$(_tune_profile_printable "$name")' is not a tuning profile; use one of: $names (utils/lib/tune_profile.sh), or unset it to train untuned" >&2
  return 2
}

tune_profile_named_lines() {
  [[ -v "TUNE_PROFILE_NAMED[$1]" ]] || return 1
  local -a items
  read -ra items <<<"${TUNE_PROFILE_NAMED[$1]}"
  ((${#items[@]} == 0)) || printf '%s\n' "${items[@]}"
}

# _tune_profile_printable TEXT: TEXT with every byte outside printable ASCII as '?', so that an error line
# quoting a binary file's line stays one line of text on the terminal and in the log.
_tune_profile_printable() {
  local LC_ALL=C
  printf '%s' "${1//[^[:print:]]/?}"
}

# _tune_profile_name_allowed NAME PREFIX...: true when NAME starts with one of the PREFIXes.
_tune_profile_name_allowed() {
  local name=$1 prefix
  shift
  for prefix; do [[ $name == "$prefix"* ]] && return 0; done
  return 1
}

tune_profile_read_file() {
  local prefix=$1 value=$2 workspace=$3 file line number=0 name
  local -a flags=() settings=() prefixes=()
  file=$value
  [[ $file == /* ]] || file=$workspace/$file
  local where
  where="${prefix}TUNE_PROFILE_FILE=$(_tune_profile_printable "$value")"
  if [[ -d $file ]]; then
    echo "$where: $file is a directory; give a profile file in it (e.g. $file/<name>.profile)" >&2
    return 2
  fi
  if [[ ! -f $file || ! -r $file ]]; then
    echo "$where: no readable file at $file; give an existing profile file (relative paths start at JOB_WORKSPACE)" >&2
    return 2
  fi
  local owner mode ws_owner=""
  read -r owner mode < <(stat -L -c '%u %a' -- "$file")
  [[ -n $workspace ]] && ws_owner=$(stat -c %u -- "$workspace" 2>/dev/null)
  if [[ $owner != "$EUID" && ! ($EUID == 0 && $owner == "$ws_owner") ]] || ((8#$mode & 022)); then
    echo "$where: $file (owner uid $owner, mode $mode) is not a file only you can write; whoever can edit it decides what training runs with: copy it to a file of yours (chmod go-w)" >&2
    return 2
  fi
  # Control bytes (NUL above all: `read` would drop them) mean a binary file, not a damaged line.
  if LC_ALL=C grep -q $'[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]' -- "$file" || [[ $(LC_ALL=C tr -d '\000' <"$file" | wc -c) != $(wc -c <"$file") ]]; then
    echo "$where: $file is not a text file (it holds control bytes); a profile is lines of --xla flags and NAME=VALUE settings" >&2
    return 2
  fi
  mapfile -t prefixes < <(grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$_TUNE_PROFILE_LIB_DIR/../../configs/tune_env_prefixes.txt")
  while IFS= read -r line || [[ -n $line ]]; do
    number=$((number + 1))
    line=${line%$'\r'}
    line=${line#"${line%%[![:space:]]*}"}   # trim leading, then trailing, blanks
    line=${line%"${line##*[![:space:]]}"}
    if [[ -z $line || $line == '#'* ]]; then continue
    elif [[ $line =~ ^--[A-Za-z0-9_]+(=[^[:space:]]*)?$ ]]; then flags+=("$line")
    elif [[ $line =~ ^([A-Za-z_][A-Za-z0-9_]*)=(.*)$ && ${BASH_REMATCH[1]} != XLA_FLAGS ]]; then
      name=${BASH_REMATCH[1]}
      if ! _tune_profile_name_allowed "$name" "${prefixes[@]}"; then
        echo "${prefix}$file:$number: $name is not a tuning variable; a profile may set only names starting with ${prefixes[*]} (configs/tune_env_prefixes.txt)" >&2
        return 2
      fi
      settings+=("$line")
    else
      echo "${prefix}$file:$number: '$(_tune_profile_printable "$line")' is not an XLA flag (--name=value, no spaces), a setting (NAME=VALUE, not XLA_FLAGS) or a # comment; fix that line" >&2
      return 2
    fi
  done <"$file"
  TUNE_PROFILE_PATH=$file
  TUNE_PROFILE_FLAGS=("${flags[@]}")
  TUNE_PROFILE_SETTINGS=("${settings[@]}")
}

# tune_profile_launch_check WORKSPACE ARG...: the launchers' check (reads the settings with launch_args.sh's
# launch_setting, so that library is sourced first).
tune_profile_launch_check() {
  local workspace=$1 name file
  shift
  name=$(launch_setting TUNE_PROFILE "$@") || name=""
  tune_profile_check_name "${0##*/}: " "$name" || return 2
  file=$(launch_setting TUNE_PROFILE_FILE "$@") || file=""
  [[ -z $file ]] || tune_profile_read_file "${0##*/}: " "$file" "$workspace" || return 2
}
