#!/usr/bin/env bats
# Model resolution (utils/lib/resolve_model.sh): exact name, alias table, unique substring, clear errors.

load test_helper

setup() {
  source "$REPO_DIR/utils/lib/resolve_model.sh"
  CONFIGS=$BATS_TEST_TMPDIR/configs
  mkdir -p "$CONFIGS"
  for m in ds-proxy ds-proxy-e128 grok-1 grok-2 llama2-70b llama3-70b; do : >"$CONFIGS/$m.yml"; done
  printf '# alias model\n70b llama2-70b\ngrok grok-1   # the docs say grok\n' >"$CONFIGS/aliases"
}

@test "an exact config name wins over a longer name containing it" {
  run resolve_model ds-proxy "$CONFIGS"
  [ "$status" -eq 0 ]
  [ "$output" = ds-proxy ]
}

@test "the alias table resolves names that would be ambiguous substrings" {
  [ "$(resolve_model 70b "$CONFIGS")" = llama2-70b ]
  [ "$(resolve_model grok "$CONFIGS")" = grok-1 ]
}

@test "a unique substring resolves" {
  [ "$(resolve_model e128 "$CONFIGS")" = ds-proxy-e128 ]
  [ "$(resolve_model llama2 "$CONFIGS")" = llama2-70b ]
}

@test "an ambiguous name lists its candidates on one line" {
  run resolve_model llama "$CONFIGS"
  [ "$status" -ne 0 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ $output == *"ambiguous model 'llama' matches: llama2-70b llama3-70b"* ]]
}

@test "an unknown name lists every model on one line" {
  run resolve_model mistral "$CONFIGS"
  [ "$status" -ne 0 ]
  [ "${#lines[@]}" -eq 1 ]
  [[ $output == *"unknown model 'mistral'; known models: ds-proxy ds-proxy-e128 grok-1 grok-2 llama2-70b llama3-70b"* ]]
}

@test "an alias to a missing config is reported, not followed" {
  echo "gone no-such-model" >>"$CONFIGS/aliases"
  run resolve_model gone "$CONFIGS"
  [ "$status" -ne 0 ]
  [[ $output == *"alias 'gone' points at 'no-such-model'"* ]]
}

@test "the real configs: the names our docs and users type" {
  local c=$REPO_DIR/configs
  [ "$(resolve_model 70b "$c")" = llama2-70b ]
  [ "$(resolve_model mixtral "$c")" = mixtral-8x22b ]
  [ "$(resolve_model grok "$c")" = grok-1 ]
  [ "$(resolve_model 405b "$c")" = llama3.1-405b ]
  [ "$(resolve_model tiny "$c")" = tiny ]
}

@test "the real configs: every config resolves to itself" {
  local c=$REPO_DIR/configs m
  while read -r m; do
    [ "$(resolve_model "$m" "$c")" = "$m" ]
  done < <(list_models "$c")
  [ "$(list_models "$c" | wc -l)" -ge 12 ]
}
