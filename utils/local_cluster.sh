#!/usr/bin/env bash
# Usage: utils/local_cluster.sh up [-N n] | down | status | env | -h
# Summary: A real Slurm cluster of n "nodes" on this one machine, each node in its own network namespace
#
#   up [-N n]   start munged, slurmctld and n slurmd (default 2, at most 32), wait until every node is
#               idle, and print `export SLURM_CONF=...` as the last stdout line (progress goes to stderr).
#               Installs slurmctld slurmd slurm-client munge with apt-get when they are missing, and
#               Prometheus (`utils/prometheus.sh install`), which a RAY=1 job on these nodes needs and never
#               installs itself. Running it again while the cluster is up with the same n only prints the
#               export line.
#   down        stop every process it started (by recorded PID), cancel jobs, remove its namespaces,
#               veths, bridge and /run/netns mount. Safe after a crash and when nothing is up.
#   status      daemons alive?, then sinfo; exit 0 when up, 1 when not
#   env         print `export SLURM_CONF=...` (use: eval "$(utils/local_cluster.sh env)"); exit 1 when down
#
# Every Slurm command needs SLURM_CONF (there is no /etc/slurm/slurm.conf):
#   eval "$(utils/local_cluster.sh up -N 2)"; sbatch -N 2 --wrap 'srun -l hostname'; sacct -c
#
# Topology (root only: it creates network namespaces):
#   mxlc-br0     a bridge with NO uplink; this host has 10.77.0.254/24 on it, so sbatch/squeue/scontrol
#                run from the host reach the controller. Nothing is routed anywhere else.
#   mxlc-ctl     namespace of slurmctld, hostname mxlc-ctl, 10.77.0.1
#   mxlc-nodeI   namespace of slurmd for node I (I = 1..n): hostname nodeI, 10.77.0.(10+I), one partition
#                `local` holding them all. Every namespace has `lo` up and no default route.
#   All namespaces share this machine's filesystem, so the repo (and a JOB_WORKSPACE under it) is shared
#   storage for the nodes. Jobs run as root. One munged (user munge) serves all namespaces on a private
#   socket in the state dir; no daemon listens on this machine's own interfaces.
#
# Environment:
#   LOCAL_CLUSTER_DIR   state dir (default /tmp/mxlc; keep it short, unix sockets live there): slurm.conf,
#                       log/, spool/<node>/, state/, jobcomp.txt (read by `sacct -c`), pids/. `down` keeps
#                       logs, controller state (job ids keep counting) and jobcomp.txt; delete the dir
#                       after `down` for a clean slate. It must be root's and not writable by group or
#                       others (`up` creates it 0755): any other dir there is refused with one line.
#   LOCAL_CLUSTER_TIMEOUT   seconds `up` waits for all nodes idle (default 30)
#
# srun and salloc listen for call-backs on all addresses of the namespace they run in: run them inside a
# job (sbatch) or a namespace (`nsenter --net=/run/netns/mxlc-ctl srun ...`), not on the host.
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

_PROG=local_cluster.sh
# shellcheck source=utils/lib/process.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/process.sh"
# shellcheck source=utils/lib/workspace.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/workspace.sh"
# The daemons, ip and mungekey live in sbin, which a CI runner's PATH may lack.
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin
_DIR=${LOCAL_CLUSTER_DIR:-/tmp/mxlc}
_DIR=${_DIR%/}
_CONF=$_DIR/slurm.conf
_STATE=$_DIR/cluster.state      # NODES=n while a cluster (or its leftovers) may exist
_PIDS=$_DIR/pids                # <name>.pid: "PID STARTTIME" of each daemon we started
_MUNGE_DIR=$_DIR/munge
_MUNGE_SOCKET=$_MUNGE_DIR/munge.sock
_MUNGE_KEY=/etc/munge/munge.key

_PREFIX=mxlc
_BRIDGE=$_PREFIX-br0
_CTL=$_PREFIX-ctl               # namespace and hostname of slurmctld
_NET=10.77.0
_CTL_IP=$_NET.1
_HOST_IP=$_NET.254
_MAX_NODES=32
_PARTITION=local

_die() { echo "$_PROG: $*" >&2; exit 1; }
_say() { echo "[local_cluster] $*" >&2; }
_usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

_since() {                                # seconds since an $EPOCHREALTIME value, one decimal
  local us=$(( ${EPOCHREALTIME/./} - ${1/./} ))
  printf '%d.%d' $((us / 1000000)) $((us % 1000000 / 100000))
}
_node_ns() { echo "$_PREFIX-node$1"; }
_node_ip() { echo "$_NET.$((10 + $1))"; }
_env_line() { printf 'export SLURM_CONF=%q\n' "$_CONF"; }

_need_root() {
  (( EUID == 0 )) || _die "$1 needs root (network namespaces, daemons); run it as root (e.g. sudo $0 $1)"
}

# The state dir holds root's slurm.conf, hosts, pid files (down signals those PIDs) and Slurm state, under a
# fixed name in /tmp by default: one another user made first would let them steer root's cluster. It is
# used only when it is root's, no link, and not writable by group or others; `up` creates it 0755, not 0700:
# munged runs as user munge and must reach its socket inside. CREATE: make it when absent (up only).
_check_state_dir() {
  local why
  [[ -n ${1:-} || -e $_DIR || -L $_DIR ]] || return 0
  why=$(workspace_private_dir "$_DIR" 0 0755) ||
    _die "state dir $why: another user could steer root's cluster through it; remove it (check what it holds first) or set LOCAL_CLUSTER_DIR to a dir of root's"
}

# ---------------------------------------------------------------------------------------------- PIDs
# A PID file holds "PID STARTTIME" (field 22 of /proc/PID/stat), so a PID reused by an unrelated
# process after a crash is never mistaken for ours.

_record_pid() {                           # _record_pid NAME PID
  local start
  start=$(proc_start_time "$2") || return 1
  echo "$2 $start" >"$_PIDS/$1.pid"
}

# Prints the PID recorded under NAME when that very process is still alive.
_live_pid() {
  local pid start now
  [[ -r $_PIDS/$1.pid ]] || return 1
  read -r pid start <"$_PIDS/$1.pid" || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  now=$(proc_start_time "$pid") || return 1
  [[ $now == "$start" ]] || return 1
  echo "$pid"
}

# _stop_pids SECONDS PID...: proc_stop, with a word when something survives SIGKILL.
_stop_pids() {
  proc_stop "$@" || _say "warning: could not stop PID(s) ${PROC_STOP_LEFT[*]}"
}

_daemons() {                              # names of the daemons of an N-node cluster
  local i
  echo munged slurmctld
  for (( i = 1; i <= $1; i++ )); do echo "slurmd-node$i"; done
}

_state_nodes() {                          # N from the state file, or nothing
  local line
  [[ -r $_STATE ]] || return 1
  line=$(grep -m1 '^NODES=' "$_STATE") || return 1
  echo "${line#NODES=}"
}

# True when a cluster is recorded and every daemon of it is alive.
_is_up() {
  local n name
  n=$(_state_nodes) || return 1
  for name in $(_daemons "$n"); do _live_pid "$name" >/dev/null || return 1; done
}

# ------------------------------------------------------------------------------------------ packages

# A RAY=1 job's Prometheus must be there before the job (it never installs anything at run time). The cluster
# is still useful without it, so a failure is said, with its consequence, and `up` goes on.
_install_prometheus() {
  local said
  said=$("$(dirname "${BASH_SOURCE[0]}")/prometheus.sh" install 2>&1 >/dev/null 9>&-) ||
    _say "warning: no Prometheus (${said##*$'\n'}): RAY=1 jobs on this cluster will run with metrics off"
}

_install_packages() {
  local -a missing=()
  command -v slurmctld >/dev/null 2>&1 || missing+=(slurmctld)
  command -v slurmd >/dev/null 2>&1 || missing+=(slurmd)
  command -v sinfo >/dev/null 2>&1 || missing+=(slurm-client)
  command -v munged >/dev/null 2>&1 || missing+=(munge)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  (( ${#missing[@]} )) || return 0
  command -v apt-get >/dev/null 2>&1 ||
    _die "missing ${missing[*]} and no apt-get; install Slurm (slurmctld, slurmd, client) and munge by hand"
  _say "installing ${missing[*]} with apt-get"
  local -a apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y -q
    --no-install-recommends "${missing[@]}")
  # 9>&-: a service a postinst script might start must not inherit (and hold) our lock.
  if ! "${apt[@]}" >&2 9>&-; then
    _say "install failed; refreshing the package lists and trying once more"
    env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 update -q >&2 9>&- || true
    "${apt[@]}" >&2 9>&- ||
      _die "apt-get could not install ${missing[*]}; check the apt sources and network, or install them by hand"
  fi
}

_check_munge_key() {
  id munge >/dev/null 2>&1 || _die "user munge does not exist; reinstall the munge package"
  if [[ ! -s $_MUNGE_KEY ]]; then
    _say "creating $_MUNGE_KEY"
    mungekey --create --keyfile="$_MUNGE_KEY" >&2 || _die "could not create $_MUNGE_KEY; run mungekey --create"
  fi
  chown munge:munge "$_MUNGE_KEY"
  chmod 0400 "$_MUNGE_KEY"
}

# ------------------------------------------------------------------------------------------- config

_write_conf() {                           # _write_conf N
  local n=$1 i cpus
  cpus=$(nproc)
  {
    cat <<EOF
# Written by utils/local_cluster.sh up -N $n; rewritten on every up.
ClusterName=$_PREFIX
SlurmctldHost=$_CTL($_CTL_IP)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$_MUNGE_SOCKET
StateSaveLocation=$_DIR/state
SlurmdSpoolDir=$_DIR/spool/%n
SlurmctldPidFile=$_DIR/run/slurmctld.pid
SlurmdPidFile=$_DIR/run/slurmd.%n.pid
SlurmctldLogFile=$_DIR/log/slurmctld.log
SlurmdLogFile=$_DIR/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$_DIR/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
# A job whose node died ends (NODE_FAIL) instead of silently running again; sbatch --requeue still works.
JobRequeue=0
SlurmdParameters=config_overrides
PropagateResourceLimits=NONE
# Quick reactions: a one-machine cluster has no slow network to wait for (MessageTimeout stays at its
# default: RPCs must survive 2 cores busy with training).
KillWait=10
MessageTimeout=10
TCPTimeout=2
SlurmdTimeout=60
InactiveLimit=0
# Finished jobs leave squeue after 5 s (sacct -c keeps them). At most 5 also keeps sbatch --wait
# polling every 2 s (it backs off to 8 s when MinJobAge/2 > 2).
MinJobAge=5
CompleteWait=0
# Schedule a submitted batch job at once (Slurm waits up to 3 s by default to batch up submissions).
SchedulerParameters=batch_sched_delay=0
EOF
    for (( i = 1; i <= n; i++ )); do
      echo "NodeName=node$i NodeAddr=$(_node_ip "$i") CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 State=UNKNOWN"
    done
    echo "PartitionName=$_PARTITION Nodes=node[1-$n] Default=YES MaxTime=INFINITE State=UP"
  } >"$_CONF.tmp"
  mv "$_CONF.tmp" "$_CONF"
  # Node names must resolve on the nodes, as on a real cluster (gloo, JAX's CPU collectives, looks up its
  # own hostname). Each daemon sees this file as /etc/hosts in a private mount namespace (_spawn); the
  # host's /etc/hosts is never touched.
  {
    cat /etc/hosts
    echo "# local_cluster.sh nodes"
    echo "$_CTL_IP $_CTL"
    for (( i = 1; i <= n; i++ )); do echo "$(_node_ip "$i") node$i"; done
  } >"$_DIR/hosts"
}

# ------------------------------------------------------------------------------------------ network

_make_ns() {                              # _make_ns NS HOST_VETH ADDRESS
  local ns=$1 veth=$2 addr=$3
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip link add "$veth" type veth peer name eth0 netns "$ns"
  ip link set "$veth" master "$_BRIDGE"
  ip link set "$veth" up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
}

_make_network() {                         # _make_network N
  local n=$1 i
  # Remember whether /run/netns (a bind mount `ip netns add` makes) predates us, so down removes only ours.
  if [[ ! -e $_PIDS/netns.made ]]; then
    if [[ ! -d /run/netns ]]; then echo dir >"$_PIDS/netns.made"
    elif ! mountpoint -q /run/netns; then echo mount >"$_PIDS/netns.made"
    else echo none >"$_PIDS/netns.made"; fi
  fi
  ip link add "$_BRIDGE" type bridge
  ip addr add "$_HOST_IP/24" dev "$_BRIDGE"
  ip link set "$_BRIDGE" up
  _make_ns "$_CTL" "$_PREFIX-vctl" "$_CTL_IP"
  for (( i = 1; i <= n; i++ )); do
    _make_ns "$(_node_ns "$i")" "$_PREFIX-vn$i" "$(_node_ip "$i")"
  done
}

_our_namespaces() { ip netns list 2>/dev/null | awk -v p="^$_PREFIX-" '$1 ~ p {print $1}'; }
_our_links() { ip -o link show 2>/dev/null | awk -F': ' -v p="^$_PREFIX-" '{sub(/@.*/, "", $2)} $2 ~ p {print $2}'; }

_remove_network() {
  local ns link how
  for ns in $(_our_namespaces); do
    ip netns delete "$ns" 2>/dev/null ||
      { umount -l "/run/netns/$ns" 2>/dev/null || true; rm -f "/run/netns/$ns"; }
  done
  for link in $(_our_links); do ip link delete "$link" 2>/dev/null || true; done
  # Namespace files left without a mount (a crash inside `ip netns add`).
  rm -f /run/netns/"$_PREFIX"-* 2>/dev/null || true
  how=$(cat "$_PIDS/netns.made" 2>/dev/null || echo none)
  if [[ $how != none && -d /run/netns && -z $(ls -A /run/netns 2>/dev/null) ]]; then
    if mountpoint -q /run/netns; then umount /run/netns 2>/dev/null || umount -l /run/netns || true; fi
    [[ $how == dir ]] && rmdir /run/netns 2>/dev/null || true
  fi
  rm -f "$_PIDS/netns.made"
}

# PIDs of every process inside one of our namespaces (jobs, slurmstepd, daemons): all of them are ours.
_ns_pids() {
  local ns
  for ns in $(_our_namespaces); do ip netns pids "$ns" 2>/dev/null || true; done
}

# ------------------------------------------------------------------------------------------ daemons

# _spawn NAME NS HOSTNAME COMMAND...: run COMMAND in namespace NS with its own hostname, detached, stdio
# to log/NAME.out, and record its PID. nsenter, unshare and sh all exec, so $! is the daemon itself. The
# private mount namespace (unshare's default propagation is private) only carries the /etc/hosts bind.
_spawn() {
  local name=$1 ns=$2 host=$3 pid
  shift 3
  # shellcheck disable=SC2016  # $0 and $@ belong to the inner sh
  SLURM_CONF=$_CONF _HOSTS_FILE=$_DIR/hosts setsid nsenter --net="/run/netns/$ns" unshare --uts --mount \
    sh -c 'hostname "$0" && mount --bind "$_HOSTS_FILE" /etc/hosts && exec "$@"' "$host" "$@" \
    </dev/null >>"$_DIR/log/$name.out" 2>&1 9>&- &
  pid=$!
  _record_pid "$name" "$pid" || _die "$name exited at once; see $_DIR/log/$name.out"
}

_start_munged() {
  install -d -o munge -g munge -m 0755 "$_MUNGE_DIR"
  setsid setpriv --reuid=munge --regid=munge --init-groups \
    munged -F --socket="$_MUNGE_SOCKET" --key-file="$_MUNGE_KEY" --pid-file="$_MUNGE_DIR/munged.pid" \
    --seed-file="$_MUNGE_DIR/munged.seed" --log-file="$_MUNGE_DIR/munged.log" \
    </dev/null >>"$_DIR/log/munged.out" 2>&1 9>&- &
  _record_pid munged $! || _die "munged exited at once; see $_DIR/log/munged.out and $_MUNGE_DIR/munged.log"
  local i
  for (( i = 0; i < 100; i++ )); do
    if munge -n -S "$_MUNGE_SOCKET" 2>/dev/null | unmunge -S "$_MUNGE_SOCKET" >/dev/null 2>&1; then return 0; fi
    _live_pid munged >/dev/null || break
    sleep 0.1
  done
  _die "munged did not answer on $_MUNGE_SOCKET; see $_MUNGE_DIR/munged.log and $_DIR/log/munged.out"
}

_wait_idle() {                            # _wait_idle N
  local n=$1 limit=${LOCAL_CLUSTER_TIMEOUT:-30} name idle end
  end=$((SECONDS + limit))
  while (( SECONDS < end )); do
    for name in $(_daemons "$n"); do
      _live_pid "$name" >/dev/null || _die "$name died during start-up; see $_DIR/log/$name.out and the .log beside it"
    done
    idle=$(SLURM_CONF=$_CONF timeout 5 sinfo -h -N -p "$_PARTITION" -t idle -o '%N' 2>/dev/null |
      sort -u | grep -c . || true)
    (( idle == n )) && return 0
    sleep 0.25
  done
  SLURM_CONF=$_CONF timeout 5 sinfo -N >&2 || true
  _die "not all $n nodes became idle within ${limit}s; see $_DIR/log/slurmctld.log and slurmd.node*.log"
}

# Jobs the controller recovered from its state right after start-up are what a crashed cluster left
# (down cancels jobs before it stops anything): cancel them so they do not start again.
_cancel_leftover_jobs() {
  local jobs
  jobs=$(SLURM_CONF=$_CONF timeout 5 squeue -h -o '%i' 2>/dev/null) || return 0
  [[ -n $jobs ]] || return 0
  _say "cancelling jobs left over from before a crash: $(echo "$jobs" | tr '\n' ' ')"
  # shellcheck disable=SC2086  # one id per word
  SLURM_CONF=$_CONF timeout 5 scancel $jobs 2>/dev/null || true
}

# --------------------------------------------------------------------------------------- commands

cmd_up() {
  local n=2
  while (( $# )); do
    case $1 in
      -N) (( $# >= 2 )) || _die "-N needs a number; e.g. up -N 2"; n=$2; shift ;;
      -N*) n=${1#-N} ;;
      -h|--help) _usage; exit 0 ;;
      *) _die "unknown argument to up: '$1'; usage: up [-N n]" ;;
    esac
    shift
  done
  if [[ ! $n =~ ^[0-9]+$ ]] || (( n < 1 || n > _MAX_NODES )); then
    _die "-N must be a whole number 1..$_MAX_NODES, not '$n'; e.g. up -N 2"
  fi
  _need_root up
  (( ${#_MUNGE_SOCKET} <= 100 )) ||
    _die "state dir path too long for a unix socket ($_MUNGE_SOCKET); set a shorter LOCAL_CLUSTER_DIR"

  _check_state_dir create
  exec 9>"$_DIR/.lock"
  flock -w 120 9 || _die "another up/down holds $_DIR/.lock; wait for it, or remove the lock if it is stale"

  local have i
  if _is_up; then
    have=$(_state_nodes)
    (( have == n )) || _die "already up with $have nodes, asked for $n; run utils/local_cluster.sh down first"
    _say "already up with $n nodes"
    _env_line
    return 0
  fi
  if [[ -e $_STATE ]]; then
    _say "cleaning up what a previous cluster in $_DIR left behind"
    _teardown
  elif [[ -n $(_our_namespaces) || -n $(_our_links) ]]; then
    _die "namespaces/links named $_PREFIX-* exist but $_DIR has no record of them (another" \
      "LOCAL_CLUSTER_DIR?); run utils/local_cluster.sh down with that LOCAL_CLUSTER_DIR (or this one:" \
      "down removes them)"
  fi

  _install_packages
  _install_prometheus
  _check_munge_key
  local t0=$EPOCHREALTIME
  mkdir -p "$_PIDS" "$_DIR/log" "$_DIR/state" "$_DIR/run"
  for (( i = 1; i <= n; i++ )); do mkdir -p "$_DIR/spool/node$i"; done
  _write_conf "$n"
  echo "NODES=$n" >"$_STATE"
  # From here on a failure tears down what was made, so nothing half-made stays behind.
  trap '_say "start-up failed; tearing down (logs stay in $_DIR/log)"; _teardown' EXIT

  _say "network: bridge $_BRIDGE ($_HOST_IP), $_CTL ($_CTL_IP), node1..node$n ($_NET.11..)"
  _make_network "$n"
  _start_munged
  _say "starting slurmctld and $n slurmd"
  _spawn slurmctld "$_CTL" "$_CTL" slurmctld -D -i -f "$_CONF"
  for (( i = 1; i <= n; i++ )); do
    _spawn "slurmd-node$i" "$(_node_ns "$i")" "node$i" slurmd -D -N "node$i" -f "$_CONF"
  done
  _wait_idle "$n"
  _cancel_leftover_jobs
  trap - EXIT
  _say "up: $n nodes idle in partition $_PARTITION after $(_since "$t0") s; state in $_DIR"
  _env_line
}

# Cancel jobs, stop our daemons and every process in our namespaces, remove the network. Keeps logs.
_teardown() {
  trap - EXIT
  set +e
  local name pid
  if _live_pid slurmctld >/dev/null 2>&1; then
    local jobs i
    jobs=$(SLURM_CONF=$_CONF timeout 5 squeue -h -o '%i' 2>/dev/null)
    if [[ -n $jobs ]]; then
      _say "cancelling jobs: $(echo "$jobs" | tr '\n' ' ')"
      # shellcheck disable=SC2086  # one id per word
      SLURM_CONF=$_CONF timeout 5 scancel $jobs 2>/dev/null
      for (( i = 0; i < 40; i++ )); do
        [[ -z $(SLURM_CONF=$_CONF timeout 5 squeue -h -t running,completing -o '%i' 2>/dev/null) ]] && break
        sleep 0.25
      done
    fi
  fi
  local -a pids=()
  # slurmd first (no new steps), then the controller (it saves its state on SIGTERM).
  for name in "$_PIDS"/slurmd-*.pid; do
    [[ -e $name ]] || continue
    name=${name##*/}
    pid=$(_live_pid "${name%.pid}") && pids+=("$pid")
  done
  _stop_pids 5 "${pids[@]}"
  pids=()
  pid=$(_live_pid slurmctld) && pids+=("$pid")
  _stop_pids 10 "${pids[@]}"
  # Whatever still runs in our namespaces: job processes, slurmstepd, strays after a crash.
  mapfile -t pids < <(_ns_pids)
  (( ${#pids[@]} )) && _say "stopping ${#pids[@]} leftover process(es) in $_PREFIX-* namespaces"
  _stop_pids 3 "${pids[@]}"
  pids=()
  pid=$(_live_pid munged) && pids+=("$pid")
  _stop_pids 5 "${pids[@]}"
  _remove_network
  rm -f "$_PIDS"/*.pid "$_STATE" "$_MUNGE_SOCKET" "$_MUNGE_SOCKET.lock" "$_DIR"/run/*.pid 2>/dev/null
  set -e
}

cmd_down() {
  (( $# == 0 )) || _die "down takes no arguments; run utils/local_cluster.sh down"
  _need_root down
  _check_state_dir
  if [[ -d $_DIR ]]; then
    exec 9>"$_DIR/.lock"
    flock -w 120 9 || _die "another up/down holds $_DIR/.lock; wait for it, or remove the lock if it is stale"
  fi
  if [[ ! -e $_STATE && -z $(_our_namespaces) && -z $(_our_links) ]]; then
    _say "nothing is up"
    return 0
  fi
  _teardown
  _say "down"
}

cmd_status() {
  (( $# == 0 )) || _die "status takes no arguments"
  _check_state_dir
  local n name pid up=1 where
  if ! n=$(_state_nodes); then
    echo "local cluster: down (no cluster recorded in $_DIR)"
    return 1
  fi
  echo "local cluster in $_DIR ($n nodes):"
  for name in $(_daemons "$n"); do
    case $name in
      munged) where="munge socket $_MUNGE_SOCKET" ;;
      slurmctld) where="netns $_CTL, $_CTL_IP" ;;
      slurmd-node*) where="netns $(_node_ns "${name#slurmd-node}"), $(_node_ip "${name#slurmd-node}")" ;;
    esac
    if pid=$(_live_pid "$name"); then
      printf '  %-14s alive  pid %-8s %s\n' "$name" "$pid" "$where"
    else
      printf '  %-14s DEAD   %-12s %s\n' "$name" "" "$where"; up=0
    fi
  done
  if _live_pid slurmctld >/dev/null; then
    echo "sinfo:"
    SLURM_CONF=$_CONF timeout 5 sinfo 2>&1 | sed 's/^/  /' || true
  fi
  if (( up )); then
    echo "up; use it with: eval \"\$($0 env)\""
    return 0
  fi
  echo "not up (some daemons are dead); run $0 down, then up"
  return 1
}

cmd_env() {
  (( $# == 0 )) || _die "env takes no arguments"
  _check_state_dir
  _is_up || _die "no local cluster is up in $_DIR; start one with utils/local_cluster.sh up"
  _env_line
}

main() {
  (( $# )) || { _usage >&2; exit 2; }
  local cmd=$1
  shift
  case $cmd in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    env) cmd_env "$@" ;;
    -h|--help|help) _usage ;;
    *) echo "$_PROG: unknown command '$cmd'; use up, down, status or env (-h for help)" >&2; exit 2 ;;
  esac
}

main "$@"
