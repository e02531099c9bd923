#!/usr/bin/env bats
# Code snapshots for submitted jobs (utils/lib/artifact.sh).

load test_helper

setup() {
  source "$REPO_DIR/utils/lib/artifact.sh"
  SRC=$BATS_TEST_TMPDIR/src WS=$BATS_TEST_TMPDIR/ws
  mkdir -p "$SRC/utils" "$SRC/outputs/old" "$SRC/.venv/bin"
  (cd "$SRC" && git init -q && git config user.email t@t && git config user.name t)
  printf 'outputs/\n.venv/\n*.log\n' >"$SRC/.gitignore"
  echo 'echo v1' >"$SRC/run.sh"; echo lib >"$SRC/utils/lib.sh"; echo gone >"$SRC/deleted.txt"
  ln -s run.sh "$SRC/link.sh"
  (cd "$SRC" && git add -A && git commit -qm first)
  rm "$SRC/deleted.txt"
  echo new >"$SRC/untracked.sh"; echo x >"$SRC/outputs/old/result"; echo x >"$SRC/.venv/bin/python"
  echo x >"$SRC/debug.log"; echo 'echo v2' >"$SRC/run.sh"
}

@test "the snapshot holds what git calls the project: tracked + untracked-not-ignored, no .git" {
  dest=$(make_artifact "$SRC" "$WS")
  [[ $dest == "$WS"/.artifacts/"$(id -un)"/artifact_[0-9]*_[0-9]*_[0-9a-f][0-9a-f][0-9a-f][0-9a-f] ]]
  [ "$(cat "$dest/run.sh")" = "echo v2" ]          # the work tree as it is, edits included
  [ -f "$dest/utils/lib.sh" ]
  [ -f "$dest/untracked.sh" ]
  [ -L "$dest/link.sh" ]
  [ ! -e "$dest/.git" ]
  [ ! -e "$dest/outputs" ]
  [ ! -e "$dest/.venv" ]
  [ ! -e "$dest/debug.log" ]
  [ ! -e "$dest/deleted.txt" ]
}

@test "git_summary.txt records branch, commit, changes and untracked files" {
  dest=$(make_artifact "$SRC" "$WS")
  grep -q '^== COMMIT ==' "$dest/git_summary.txt"
  grep -q '^first$' "$dest/git_summary.txt"
  grep -q 'M run.sh' "$dest/git_summary.txt"
  grep -q '^untracked.sh$' "$dest/git_summary.txt"
  grep -q '^+echo v2$' "$dest/git_summary.txt"
}

@test "the snapshot is read-only, later edits to the source do not reach it, and it can be removed" {
  dest=$(make_artifact "$SRC" "$WS")
  echo 'echo v3' >"$SRC/run.sh"
  [ "$(cat "$dest/run.sh")" = "echo v2" ]
  [ ! -w "$dest/run.sh" ] || [ "$(id -u)" -eq 0 ]
  [ "$(stat -c %A "$dest/run.sh")" = "-r--------" ]   # and private: nobody else needs the code a job ran
  [ "$(stat -c %A "$dest/utils")" = "dr-x------" ]
  remove_artifact "$dest"
  [ ! -e "$dest" ]
}

@test "submit_cmd.txt: non-default environment prefixes and the exact quoted command" {
  dest=$(make_artifact "$SRC" "$WS")
  RAY=1 STAGE_TIMEOUTS="train:60" write_submit_cmd "$dest" ./submit.sh tiny -N 2 -- "a=b c"
  [ "$(cat "$dest/submit_cmd.txt")" = 'RAY=1 STAGE_TIMEOUTS=train:60 ./submit.sh tiny -N 2 -- a=b\ c' ]
}

@test "submit_cmd.txt: a credential's value after -- is ***, the names PASS_ENV hands over are kept" {
  local dest=$BATS_TEST_TMPDIR/a
  mkdir -p "$dest"
  PASS_ENV=HF_TOKEN write_submit_cmd "$dest" ./submit.sh tiny -- steps=3 _env_WANDB_API_KEY=FAKE0000SECRET _env_FOO=x
  [ "$(cat "$dest/submit_cmd.txt")" = 'PASS_ENV=HF_TOKEN ./submit.sh tiny -- steps=3 _env_WANDB_API_KEY=\*\*\* _env_FOO=x' ]
}

@test "a snapshot of this repo carries its scripts and none of its local state" {
  dest=$(make_artifact "$REPO_DIR" "$WS")
  [ -x "$dest/run_local.sh" ]
  [ -x "$dest/_job.sbatch" ]
  [ -f "$dest/requirements.lock" ]
  [ ! -e "$dest/.venv" ]
  [ ! -e "$dest/outputs" ]
  [ ! -e "$dest/.git" ]
}

@test "untracked files named like secrets stay out of the snapshot, and the submitter is told" {
  echo 'HF_TOKEN=FAKE0000SECRET' >"$SRC/.env"; echo key >"$SRC/deploy.pem"; echo m >"$SRC/.netrc"
  mkdir -p "$SRC/configs"; echo 'DOCKER_TOKEN=x' >"$SRC/configs/site.local.sh"
  run make_artifact "$SRC" "$WS"
  [ "$status" -eq 0 ]
  dest=${lines[-1]}
  [ -f "$dest/untracked.sh" ]   # untracked code still runs as it is
  for name in .env deploy.pem .netrc configs/site.local.sh; do
    [ ! -e "$dest/$name" ]
    [[ $output == *"left out of the code snapshot: $name "* ]]
  done
  ! grep -rq 0000SECRET "$dest"
}

@test "a checkout owned by another account is still read through git, not copied whole" {
  (( EUID == 0 )) || skip "needs root to give the checkout to another account"
  echo 'DOCKER_TOKEN=FAKE0000SECRET' >"$SRC/container_settings.local.sh"
  printf 'outputs/\n.venv/\n*.log\n*.local.sh\n' >"$SRC/.gitignore"
  chown -R 65534:65534 "$SRC"   # git now refuses it ("dubious ownership") unless told it is safe
  run git -C "$SRC" rev-parse --is-inside-work-tree
  [ "$status" -ne 0 ]
  dest=$(make_artifact "$SRC" "$WS")
  [ -f "$dest/run.sh" ] && [ -f "$dest/untracked.sh" ]
  [ ! -e "$dest/container_settings.local.sh" ] && [ ! -e "$dest/debug.log" ] && [ ! -e "$dest/outputs" ]
  grep -q '^== COMMIT ==' "$dest/git_summary.txt"
}

@test "snapshots go to a private per-user dir, which must be a real dir of ours (F2)" {
  umask 002   # a team workspace's umask: the per-user dir is still 0700
  dest=$(make_artifact "$SRC" "$WS")
  [ "$(dirname "$dest")" = "$WS/.artifacts/$(id -un)" ]
  [ "$(stat -c %a "$WS/.artifacts/$(id -un)")" = 700 ]
  [ "$(stat -c %a "$WS/.artifacts")" = 1775 ]   # sticky: a teammate cannot rename our dir away
  chmod 0770 "$WS/.artifacts/$(id -un)"          # as an older submit.sh left it: made private again
  make_artifact "$SRC" "$WS" >/dev/null
  [ "$(stat -c %a "$WS/.artifacts/$(id -un)")" = 700 ]

  local ws2=$BATS_TEST_TMPDIR/ws2
  mkdir -p "$ws2/.artifacts" "$BATS_TEST_TMPDIR/elsewhere"
  ln -s "$BATS_TEST_TMPDIR/elsewhere" "$ws2/.artifacts/$(id -un)"   # planted by someone who may write .artifacts
  run make_artifact "$SRC" "$ws2"
  [ "$status" -eq 1 ]
  [[ $output == *"$ws2/.artifacts/$(id -un) is not a directory (a symlink or a file); remove it and submit again" ]]
  [ -z "$(ls -A "$BATS_TEST_TMPDIR/elsewhere")" ]
  if [ "$(id -u)" -eq 0 ]; then
    rm "$ws2/.artifacts/$(id -un)"; mkdir "$ws2/.artifacts/$(id -un)"; chown 65534 "$ws2/.artifacts/$(id -un)"
    run make_artifact "$SRC" "$ws2"
    [ "$status" -eq 1 ]
    [[ $output == *"$ws2/.artifacts/$(id -un) is owned by uid 65534, not by you ($(id -un))"* ]]
    [ -z "$(ls -A "$ws2/.artifacts/$(id -un)")" ]
  fi
}
