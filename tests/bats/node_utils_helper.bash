# shellcheck shell=bash
# Helpers for node_utils.bats: recorded `ip` output, real listening sockets, a private PID namespace.

export NET_FIX=$REPO_DIR/tests/fixtures/net
export GPU_FIX=$REPO_DIR/tests/fixtures/gpu-tools

# ip_from FILE: an `ip` stub on PATH that prints FILE (a recorded `ip -4 -o addr show`) and logs its argv.
ip_from() {
  make_stub ip "echo \"\$*\" >>\"$BATS_TEST_TMPDIR/ip.calls\"; cat \"$1\""
}

# network_spies: curl, wget, dig, nc and host stubs that record being called, to prove nothing went to the network.
network_spies() {
  local tool
  for tool in curl wget dig nc host nslookup; do
    make_stub "$tool" "echo \"$tool \$*\" >>\"$BATS_TEST_TMPDIR/network.calls\"; exit 7"
  done
}

# tool_prints TOOL FILE: TOOL is a stub that prints the recorded FILE and logs its argv.
tool_prints() {
  make_stub "$1" "echo \"\$*\" >>\"$BATS_TEST_TMPDIR/$1.calls\"; cat \"$2\""
}

# sandbox_path TOOL...: a directory holding only links to the named real tools (plus the test's stubs dir after
# it), for runs where a real rocm-smi, nvidia-smi or ip must not be found.
sandbox_path() {
  local dir=$BATS_TEST_TMPDIR/sandbox tool
  mkdir -p "$dir"
  for tool in "$@"; do ln -sf "$(command -v "$tool")" "$dir/$tool"; done
  echo "$dir:$BATS_TEST_TMPDIR/stubs"
}

# start_listener 4|6: a real TCP listener on 127.0.0.1 or ::1 at a port the kernel picks; sets LISTENER_PID and
# LISTENER_PORT. teardown stops it by PID.
start_listener() {
  local out=$BATS_TEST_TMPDIR/listener.$1 i
  python3 -c '
import socket, sys, time
six = sys.argv[1] == "6"
s = socket.socket(socket.AF_INET6 if six else socket.AF_INET, socket.SOCK_STREAM)
s.bind(("::1" if six else "127.0.0.1", 0))
s.listen(1)
print(s.getsockname()[1], flush=True)
time.sleep(120)
' "$1" >"$out" 2>&1 3>&- &
  LISTENER_PID=$!
  for ((i = 0; i < 100; i++)); do
    [[ -s $out ]] && break
    sleep 0.05
  done
  LISTENER_PORT=$(<"$out")
  [[ $LISTENER_PORT =~ ^[0-9]+$ ]] || { echo "listener did not start: $LISTENER_PORT"; return 1; }
}

stop_listener() {
  if [[ -n ${LISTENER_PID:-} ]]; then
    kill "$LISTENER_PID" 2>/dev/null || true
    wait "$LISTENER_PID" 2>/dev/null || true
    LISTENER_PID=""
  fi
}

# in_pidns SCRIPT: runs bash SCRIPT in a new PID namespace with its own /proc, so preflight.sh sees and can
# signal only the processes the test starts there (never a real training run of this machine); everything still
# running in it is killed when SCRIPT ends. SCRIPT can use:
#   fake_training JOB_ID TAG [ignore-term]  starts `python -m jobkit.launch TAG` (a sleep) with JOB_ID in its
#                                            environment; sets FAKE_PID
#   state_of PID                             prints alive or gone (a zombie is gone)
in_pidns() {
  unshare --pid --fork --mount-proc true 2>/dev/null || skip "needs unshare --pid --mount-proc (root)"
  cat >"$BATS_TEST_TMPDIR/ns.sh" <<'EOF'
fake_training() {
  local trap_term=""
  [[ ${3:-} == ignore-term ]] && trap_term='trap "" TERM;'
  env JOB_ID="$1" bash -c "$trap_term exec -a 'python -m jobkit.launch $2' sleep 300" >/dev/null 2>&1 &
  FAKE_PID=$!
  local i
  for ((i = 0; i < 100; i++)); do
    grep -qa jobkit.launch "/proc/$FAKE_PID/cmdline" 2>/dev/null && return 0
    sleep 0.02
  done
  echo "fake training process did not start" >&2
  return 1
}
state_of() {
  local s=""
  read -r s 2>/dev/null <"/proc/$1/stat" || { echo gone; return; }
  s=${s##*) }
  if [[ ${s:0:1} == Z ]]; then echo gone; else echo alive; fi
}
EOF
  printf '%s\n' "$1" >>"$BATS_TEST_TMPDIR/ns.sh"
  T=$BATS_TEST_TMPDIR unshare --pid --fork --mount-proc --kill-child bash "$BATS_TEST_TMPDIR/ns.sh"
}
