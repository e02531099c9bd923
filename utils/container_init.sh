#!/usr/bin/env bash
# Usage: utils/container_init.sh COMMAND [ARG...]
# Summary: PID 1 of a training container: runs COMMAND as its child, passes signals on, exits with its status
#
# _container.sh starts every container with this as its command (the repo is mounted in every image), so
# `podman stop` / `docker stop` and a Ctrl-C reach training the way they do natively:
#   TERM INT HUP USR1 USR2   passed to COMMAND; this script keeps waiting until COMMAND has ended
#   exit status              COMMAND's (128 + signal when a signal ended it)
#
# Why not exec COMMAND: the kernel drops any signal sent to a namespace's PID 1 that has no handler for it,
# so a training process running as PID 1 never sees the engine's SIGTERM (no preemption checkpoint, and a
# SIGKILL 10 s later). Why not the engine's --init: podman's needs catatonit on the host, which many hosts
# lack; bash is in every training image.
set -uo pipefail

_PROG=container_init.sh
case ${1:-} in
  -h | --help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
  "") echo "$_PROG: no command given; usage: $_PROG COMMAND [ARG...]" >&2; exit 2 ;;
esac

# shellcheck source=utils/lib/process.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/process.sh"

# The handlers go in before COMMAND starts: a signal that came between its start and the trap would otherwise
# find no handler (lost, or the end of this PID 1). One that comes before COMMAND exists is kept and sent to it
# as soon as it does.
_child=""
_pending=()
_init_forward() {
  if [[ -n $_child ]]; then kill "-$1" "$_child" 2>/dev/null; else _pending+=("$1"); fi
}
for _sig in TERM INT HUP USR1 USR2; do
  # shellcheck disable=SC2064  # the signal name is fixed now, on purpose
  trap "_init_forward $_sig" "$_sig"
done
"$@" &
_child=$!
for _sig in "${_pending[@]}"; do kill "-$_sig" "$_child" 2>/dev/null; done
proc_wait "$_child"
