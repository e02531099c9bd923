# shellcheck shell=bash
# Summary: Stop a process we started: TERM now, KILL after a grace period (sourced library)
#
# Some training processes outlive TERM (JAX's distributed runtime installs its own SIGTERM handler for
# preemption notices), and schedulers SIGKILL a job that does not end within their kill wait. So:
#
#   kill_after GRACE TARGET       prints the PID of a watcher that sends KILL to TARGET after GRACE seconds;
#                                 TARGET is a PID, or -PGID for a whole process group
#   cancel_kill_after WATCHER     stops that watcher (and its sleep) when TARGET ended in time

kill_after() {
  local grace=$1 target=$2
  (
    trap 'kill "$sleep_pid" 2>/dev/null; exit 0' TERM
    sleep "$grace" &
    sleep_pid=$!
    wait "$sleep_pid"
    kill -KILL -- "$target" 2>/dev/null
  ) >/dev/null 2>&1 &
  echo $!
}

cancel_kill_after() {
  [[ -n ${1:-} ]] && kill "$1" 2>/dev/null
  return 0
}
