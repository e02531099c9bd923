# shellcheck shell=bash
# Summary: Resolve what the user typed to a model config name (sourced library)
#
# resolve_model INPUT [CONFIGS_DIR] prints the config name, in this order of preference:
#   1. an exact config name (CONFIGS_DIR/<name>.yml)
#   2. an entry of the alias table CONFIGS_DIR/aliases ("alias model" per line, # comments)
#   3. the one config whose name contains INPUT
# Otherwise it prints a one-line error (ambiguous: the candidates; unknown: every model) and returns 1.

_resolve_err() { echo "${0##*/}: $*" >&2; }

# Prints every model config name in CONFIGS_DIR, sorted, one per line.
list_models() {
  local dir=$1 file
  for file in "$dir"/*.yml; do
    [[ -f $file ]] || continue
    file=${file##*/}
    printf '%s\n' "${file%.yml}"
  done | LC_ALL=C sort
}

# Prints the target of alias INPUT from the table, or nothing.
_alias_target() {
  local input=$1 table=$2 alias target _rest
  [[ -f $table ]] || return 0
  while read -r alias target _rest; do
    [[ -z $alias || $alias == \#* ]] && continue
    if [[ $alias == "$input" ]]; then printf '%s' "$target"; return 0; fi
  done <"$table"
}

resolve_model() {
  local input=$1 dir=${2:-${CONFIGS_DIR:?}} target
  local -a models=() matches=()
  mapfile -t models < <(list_models "$dir")
  if (( ${#models[@]} == 0 )); then
    _resolve_err "no model configs in $dir; restore configs/ from git"; return 1
  fi
  if [[ -f $dir/$input.yml ]]; then printf '%s\n' "$input"; return 0; fi

  target=$(_alias_target "$input" "$dir/aliases")
  if [[ -n $target ]]; then
    if [[ ! -f $dir/$target.yml ]]; then
      _resolve_err "alias '$input' points at '$target', which has no config; fix $dir/aliases"; return 1
    fi
    printf '%s\n' "$target"; return 0
  fi

  local model
  for model in "${models[@]}"; do
    [[ $model == *"$input"* ]] && matches+=("$model")
  done
  case ${#matches[@]} in
    1) printf '%s\n' "${matches[0]}" ;;
    0) _resolve_err "unknown model '$input'; known models: ${models[*]}"; return 1 ;;
    *) _resolve_err "ambiguous model '$input' matches: ${matches[*]}; type more of the name or add an alias to configs/aliases"
       return 1 ;;
  esac
}
