#!/usr/bin/env bats
# utils/build_image.sh without building: usage, bad input (one line, exit 2, nothing made), and the cache key.
# The real build, its cache hit and its tarball are exercised in tests/py/test_containers.py.

load test_helper

setup() {
  export IMAGE_CACHE_DIR=$BATS_TEST_TMPDIR/cache
}

@test "--help prints the header" {
  run "$REPO_DIR/utils/build_image.sh" --help
  [ "$status" -eq 0 ]
  [[ ${lines[0]} == "Usage: utils/build_image.sh [--save FILE]"* ]]
  [[ $output == *"cached by the lock's hash"* ]]
}

@test "bad arguments: one line naming the fix, exit 2, nothing created" {
  local -a cases=(
    "--engine lxc|--engine 'lxc' is not podman or docker"
    "--name Bad:Tag|--name 'Bad:Tag' is not an image repository"
    "--save $BATS_TEST_TMPDIR/image.tgz|the file name must end in .tar"
    "--save $BATS_TEST_TMPDIR/no/such/dir/image.tar|directory $BATS_TEST_TMPDIR/no/such/dir does not exist"
    "--frobnicate|unknown argument '--frobnicate'"
    "--save|--save needs a file path"
    "--tag-only --rebuild|--tag-only prints the tag and builds nothing, --rebuild forces a build; give one of them"
    "--rebuild --tag-only|--tag-only prints the tag and builds nothing, --rebuild forces a build"
    "--tag-only --save $BATS_TEST_TMPDIR/image.tar|--save writes the built image; give one of them"
  )
  local case args want
  for case in "${cases[@]}"; do
    args=${case%%|*} want=${case#*|}
    # shellcheck disable=SC2086  # the arguments are split on purpose
    run "$REPO_DIR/utils/build_image.sh" $args
    [ "$status" -eq 2 ] || { echo "$args: status $status"; false; }
    [ "${#lines[@]}" -eq 1 ] || { echo "$args: $output"; false; }
    [[ $output == "build_image.sh: "*"$want"* ]] || { echo "$args: $output"; false; }
  done
  [ ! -e "$IMAGE_CACHE_DIR" ]
}

@test "--tag-only: the tag follows requirements.lock and the Python, not the rest of the checkout" {
  local repo tag1 tag2 tag3
  repo=$(copy_repo)
  tag1=$("$repo/utils/build_image.sh" --tag-only)
  [[ $tag1 =~ ^localhost/maxtext-cpu:[0-9a-f]{12}$ ]]
  echo "# a comment in the README" >>"$repo/README.md"
  tag2=$("$repo/utils/build_image.sh" --tag-only)
  [ "$tag1" = "$tag2" ]
  echo "six==1.16.0" >>"$repo/requirements.lock"
  tag3=$("$repo/utils/build_image.sh" --tag-only --name registry.example:5000/team/cpu)
  [[ $tag3 == registry.example:5000/team/cpu:* ]]
  [ "${tag3##*:}" != "${tag1##*:}" ]
  [ ! -e "$IMAGE_CACHE_DIR" ]
}
