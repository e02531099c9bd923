#!/usr/bin/env bats
# utils/lib/ray_cluster.sh helpers that need no running Ray node (starting, joining and stopping nodes is tested
# with real Ray in tests/py/test_ray_launch.py).

load test_helper

# Runs _ray_start_cmd on $1 and leaves its words in the array CMD.
start_cmd_of() {
  source "$REPO_DIR/utils/lib/ray_cluster.sh"
  mapfile -d '' -t CMD < <(_ray_start_cmd "$1")
}

@test "ray start: a pip console script of Ray runs through its own interpreter, with the slim import" {
  local cli=$BATS_TEST_TMPDIR/bin/ray
  mkdir -p "${cli%/*}"
  # What pip writes for Ray's console script; "/usr/bin/env python3" as some installers do.
  printf '%s\n' '#!/usr/bin/env python3' '# -*- coding: utf-8 -*-' 'import re' 'import sys' \
    'from ray.scripts.scripts import main' 'if __name__ == "__main__":' '    sys.exit(main())' >"$cli"
  chmod +x "$cli"
  start_cmd_of "$cli"
  [ "${#CMD[@]}" -eq 4 ]
  [ "${CMD[0]}" = /usr/bin/env ]
  [ "${CMD[1]}" = python3 ]
  [ "${CMD[2]}" = -c ]
  [[ ${CMD[3]} == *'sys.modules[name] = None'* ]]
}

@test "ray start: a ray that is not Ray's Python console script (a wrapper, a binary) runs as it is" {
  make_stub ray 'echo wrapped "$@"'
  start_cmd_of "$BATS_TEST_TMPDIR/stubs/ray"
  [ "${#CMD[@]}" -eq 1 ]
  [ "${CMD[0]}" = "$BATS_TEST_TMPDIR/stubs/ray" ]
  start_cmd_of /bin/ls
  [ "${CMD[*]}" = /bin/ls ]
}

@test "ray start: the slim CLI of the installed Ray still has 'start' and skips the serve/job/state groups" {
  [ -x "$REPO_DIR/.venv/bin/ray" ] || skip "no .venv with Ray (utils/setup_env.sh builds it)"
  start_cmd_of "$REPO_DIR/.venv/bin/ray"
  [ "${CMD[0]}" = "$REPO_DIR/.venv/bin/python" ]
  run "${CMD[@]}" --help
  [ "$status" -eq 0 ]
  [[ $output == *$'\n  start '* ]]
  [[ $output == *$'\n  stop '* ]]
  [[ $output != *$'\n  serve '* && $output != *$'\n  job '* && $output != *$'\n  list '* ]]
  # The full CLI has them (serve only where its extras are installed): the slim start is what drops them.
  run "$REPO_DIR/.venv/bin/ray" --help
  [[ $output == *$'\n  job '* && $output == *$'\n  list '* ]]
}
