#!/usr/bin/env bats
# Node utilities: cluster IP, free port, NCCL/RCCL env detection (recorded `ip` output and sysfs trees), the ECC
# check (recorded rocm-smi / nvidia-smi output) and preflight (real processes in a private PID namespace).

load test_helper
load node_utils_helper

teardown() {
  stop_listener
}

# --- utils/lib/cluster_ip.sh ---------------------------------------------------------------------------------------

@test "cluster IP: a RoCE node's 10/8 frontend wins over 192.168 NICs and docker, podman, k3s, libvirt bridges" {
  source "$REPO_DIR/utils/lib/cluster_ip.sh"
  ip_from "$NET_FIX/roce-bnxt/ip-4-o-addr.txt"
  network_spies
  run detect_cluster_ip
  [ "$status" -eq 0 ]
  [ "$output" = 10.20.30.41 ]
  [ ! -e "$BATS_TEST_TMPDIR/network.calls" ]
  run cluster_ipv4_candidates
  [[ $output != *docker0* && $output != *podman0* && $output != *cni0* && $output != *flannel* ]]
  [[ $output != *virbr0* && $output != *br-3f2a* && $output != *" lo "* ]]
  [ "${lines[0]}" = "1 ens50f0np0 10.20.30.41" ]
  [ "${#lines[@]}" -eq 10 ]
}

@test "cluster IP: 172.16/12 comes before 192.168/16, whatever the interface order" {
  source "$REPO_DIR/utils/lib/cluster_ip.sh"
  ip_from "$NET_FIX/ib-mlx5/ip-4-o-addr.txt"
  run detect_cluster_ip
  [ "$status" -eq 0 ]
  [ "$output" = 172.24.8.17 ]
}

@test "cluster IP: two 10/8 interfaces are decided by name, not by the kernel's listing order" {
  source "$REPO_DIR/utils/lib/cluster_ip.sh"
  ip_from "$NET_FIX/no-ib/ip-4-o-addr.txt"
  [[ $(head -2 "$NET_FIX/no-ib/ip-4-o-addr.txt") == *eth0* ]]
  run detect_cluster_ip
  [ "$output" = 10.1.0.7 ]
}

@test "cluster IP: only public or container addresses is an error that names CLUSTER_IP, and asks no one" {
  source "$REPO_DIR/utils/lib/cluster_ip.sh"
  network_spies
  ip_from "$NET_FIX/ip-4-o-addr-public-only.txt"
  run detect_cluster_ip
  [ "$status" -eq 1 ]
  [[ $output == *"203.0.113.25"* && $output == *"CLUSTER_IP="* ]]
  ip_from "$NET_FIX/ip-4-o-addr-in-container.txt"
  run detect_cluster_ip
  [ "$status" -eq 1 ]
  [[ $output == *"eth0 172.17.0.5"* ]]
  [ ! -e "$BATS_TEST_TMPDIR/network.calls" ]
}

@test "cluster IP: a docker0 moved into 10/8 (daemon.json \"bip\") is still skipped, by its name" {
  source "$REPO_DIR/utils/lib/cluster_ip.sh"
  ip_from "$NET_FIX/ip-4-o-addr-docker-bip-10.txt"
  run detect_cluster_ip
  [ "$output" = 192.168.10.5 ]
}

@test "cluster IP: CLUSTER_IP wins without running ip; a malformed one is refused" {
  source "$REPO_DIR/utils/lib/cluster_ip.sh"
  ip_from "$NET_FIX/roce-bnxt/ip-4-o-addr.txt"
  CLUSTER_IP=10.9.8.7 run detect_cluster_ip
  [ "$status" -eq 0 ]
  [ "$output" = 10.9.8.7 ]
  [ ! -e "$BATS_TEST_TMPDIR/ip.calls" ]
  CLUSTER_IP=10.9.8.300 run detect_cluster_ip
  [ "$status" -eq 1 ]
  [[ $output == *"CLUSTER_IP=10.9.8.300 is not an IPv4 address"* ]]
}

@test "cluster IP: ip_of_interface, and a clear error when iproute2 is missing" {
  source "$REPO_DIR/utils/lib/cluster_ip.sh"
  ip_from "$NET_FIX/roce-bnxt/ip-4-o-addr.txt"
  run ip_of_interface ens13np0
  [ "$output" = 192.168.13.41 ]
  run ip_of_interface ens99
  [ "$status" -eq 1 ]
  [[ $output == *"ens99 has no global IPv4 address"* ]]
  rm "$BATS_TEST_TMPDIR/stubs/ip"
  PATH=$(sandbox_path cat) run detect_cluster_ip
  [ "$status" -eq 1 ]
  [[ $output == *"ip command (iproute2) is not installed"* ]]
}

# --- utils/lib/free_port.sh ---------------------------------------------------------------------------------------

@test "free port: a port with a real IPv4 listener is never chosen" {
  source "$REPO_DIR/utils/lib/free_port.sh"
  start_listener 4
  local p=$LISTENER_PORT
  FREE_PORT_RANGE=$p-$p run pick_free_port
  [ "$status" -eq 1 ]
  [[ $output == *"no free TCP port found in $p-$p"* ]]
  FREE_PORT_RANGE=$p-$((p + 1)) run pick_free_port
  [ "$status" -eq 0 ]
  [ "$output" -eq $((p + 1)) ]
}

@test "free port: IPv6 listeners (/proc/net/tcp6) count too" {
  source "$REPO_DIR/utils/lib/free_port.sh"
  start_listener 6
  grep -q ":$(printf '%04X' "$LISTENER_PORT") " /proc/net/tcp6
  FREE_PORT_RANGE=$LISTENER_PORT-$LISTENER_PORT run pick_free_port
  [ "$status" -eq 1 ]
}

@test "free port: tcp_ports_in_use sees every state, --listening only listeners (recorded table shape)" {
  source "$REPO_DIR/utils/lib/free_port.sh"
  local proc=$BATS_TEST_TMPDIR/net
  mkdir -p "$proc"
  # Lines as Linux writes them: 2024 listening, 2025 established, 2026 in TIME_WAIT; tcp6 with one listener (8265).
  cat >"$proc/tcp" <<'TABLE'
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1129 1 0000000032ac6954 100 0 0 10 0
   1: 0100007F:07E9 0100007F:9C41 01 00000000:00000000 00:00000000 00000000     0        0 5521 1 00000000a1b2c3d4 20 4 30 10 -1
   2: 0100007F:07EA 0100007F:9C42 06 00000000:00000000 03:000016F2 00000000     0        0 0 3 0000000000000000
TABLE
  cat >"$proc/tcp6" <<'TABLE'
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:2049 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 8812 1 00000000deadbeef 100 0 0 10 0
TABLE
  FREE_PORT_PROC=$proc run tcp_ports_in_use
  [ "$output" = $'2024\n2025\n2026\n8265' ]
  FREE_PORT_PROC=$proc run tcp_ports_in_use --listening
  [ "$output" = $'2024\n8265' ]
  FREE_PORT_PROC=$proc run tcp_port_in_use 2026
  [ "$status" -eq 0 ]
  FREE_PORT_PROC=$proc run tcp_port_in_use 2026 --listening
  [ "$status" -eq 1 ]
  FREE_PORT_PROC=$proc run tcp_port_in_use 8265 --listening
  [ "$status" -eq 0 ]
}

@test "free port: a closed port is chosen unless excluded" {
  source "$REPO_DIR/utils/lib/free_port.sh"
  start_listener 4
  local p=$LISTENER_PORT
  stop_listener
  FREE_PORT_RANGE=$p-$p run pick_free_port
  [ "$status" -eq 0 ]
  [ "$output" -eq "$p" ]
  FREE_PORT_RANGE=$p-$((p + 1)) run pick_free_port "" "$((p + 1))" "$p"
  [ "$status" -eq 1 ]
  [[ $output == *"excluded:"*"$p"* ]]
}

@test "free port: the default range is 20000-59999 and draws are random" {
  source "$REPO_DIR/utils/lib/free_port.sh"
  local -A seen=()
  local i port
  for ((i = 0; i < 30; i++)); do
    port=$(pick_free_port)
    [[ $port =~ ^[0-9]+$ ]]
    ((port >= 20000 && port <= 59999))
    seen[$port]=1
  done
  [ "${#seen[@]}" -gt 20 ]
}

@test "free port: malformed settings are refused with a fix" {
  source "$REPO_DIR/utils/lib/free_port.sh"
  FREE_PORT_RANGE=30000 run pick_free_port
  [ "$status" -eq 1 ]
  [[ $output == *"is not LOW-HIGH"* ]]
  FREE_PORT_RANGE=50000-40000 run pick_free_port
  [ "$status" -eq 1 ]
  FREE_PORT_RANGE=1-70000 run pick_free_port
  [ "$status" -eq 1 ]
  FREE_PORT_ATTEMPTS=0 run pick_free_port
  [ "$status" -eq 1 ]
}

# --- utils/lib/nccl_env.sh ---------------------------------------------------------------------------------------

# nccl_on NODE_DIR: runs detect_nccl_env in a clean environment against that recorded node; prints the NCCL_*
# variables it exported (stdout) after its stderr.
nccl_on() {
  ip_from "$1/ip-4-o-addr.txt"
  run env -u NCCL_IB_HCA -u NCCL_IB_GID_INDEX -u NCCL_SOCKET_IFNAME NCCL_SYSFS_ROOT="$1" "${@:2}" \
    bash -c 'source "$REPO_DIR/utils/lib/nccl_env.sh"; detect_nccl_env 2>&1; env | grep "^NCCL_[A-Z_]*=" | grep -v SYSFS | sort'
}

@test "nccl env: 8 Broadcom RoCE ports give the HCA list, RoCE v2 IPv4 GID 3 and the 10/8 frontend" {
  nccl_on "$NET_FIX/roce-bnxt"
  [ "$status" -eq 0 ]
  [[ $output == *$'\nNCCL_IB_HCA=bnxt_re0,bnxt_re1,bnxt_re2,bnxt_re3,bnxt_re4,bnxt_re5,bnxt_re6,bnxt_re7\n'* ]]
  [[ $output == *$'\nNCCL_IB_GID_INDEX=3\n'* ]]
  [[ $output == *$'\nNCCL_SOCKET_IFNAME=ens50f0np0' ]]
  [ "$(grep -c '^nccl_env: NCCL_IB_HCA=.*; NCCL_IB_GID_INDEX=3 (RoCE v2 IPv4 GID.*; NCCL_SOCKET_IFNAME=ens50f0np0 (10.20.30.41, 10/8)$' <<<"$output")" -eq 1 ]
}

@test "nccl env: a DOWN port's device is left out of NCCL_IB_HCA and out of the GID vote" {
  nccl_on "$NET_FIX/roce-bnxt-one-down"
  [[ $output == *$'\nNCCL_IB_HCA=bnxt_re0,bnxt_re1,bnxt_re2,bnxt_re4,bnxt_re5,bnxt_re6,bnxt_re7\n'* ]]
  [[ $output == *$'\nNCCL_IB_GID_INDEX=3\n'* ]]
  [[ $output == *"7 of 8 devices have an ACTIVE port"* ]]
}

@test "nccl env: an InfiniBand node needs no GID index" {
  nccl_on "$NET_FIX/ib-mlx5"
  [[ $output == *$'\nNCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_2,mlx5_3\n'* ]]
  [[ $output != *$'\nNCCL_IB_GID_INDEX='* ]]
  [[ $output == *"NCCL_IB_GID_INDEX unset (InfiniBand link layer needs none)"* ]]
  [[ $output == *$'\nNCCL_SOCKET_IFNAME=enp170s0f0np0' ]]
}

@test "nccl env: IPv6 GIDs listed first do not push NCCL off IPv4 (index 5, not the first RoCE v2 at 3)" {
  nccl_on "$NET_FIX/roce-mlx5-ipv6"
  [ "$(cat "$NET_FIX/roce-mlx5-ipv6/sys/class/infiniband/mlx5_0/ports/1/gid_attrs/types/3")" = "RoCE v2" ]
  [[ $output == *$'\nNCCL_IB_GID_INDEX=5\n'* ]]
}

@test "nccl env: ports that disagree on the GID index leave it unset, with a warning naming them" {
  local node=$BATS_TEST_TMPDIR/node port
  cp -r "$NET_FIX/roce-bnxt" "$node"
  port=$node/sys/class/infiniband/bnxt_re6/ports/1
  cp "$port/gids/2" "$port/gids/4"; cp "$port/gid_attrs/types/2" "$port/gid_attrs/types/4"
  cp "$port/gids/3" "$port/gids/5"; cp "$port/gid_attrs/types/3" "$port/gid_attrs/types/5"
  echo 0000:0000:0000:0000:0000:0000:0000:0000 | tee "$port/gids/2" >"$port/gids/3"
  rm "$port/gid_attrs/types/2" "$port/gid_attrs/types/3"
  nccl_on "$node"
  [[ $output != *$'\nNCCL_IB_GID_INDEX='* ]]
  [[ $output == *"nccl_env: warning: active RoCE ports have no common usable GID index"*"bnxt_re6/1=5"* ]]
  [[ $output == *$'\nNCCL_IB_HCA=bnxt_re0,'* ]]
}

@test "nccl env: a node without RDMA devices only gets NCCL_SOCKET_IFNAME" {
  nccl_on "$NET_FIX/no-ib"
  [[ $output != *$'\nNCCL_IB_HCA='* && $output != *$'\nNCCL_IB_GID_INDEX='* ]]
  [[ $output == *"NCCL_IB_HCA unset (no RDMA devices"* ]]
  [[ $output == *$'\nNCCL_SOCKET_IFNAME=bond0' ]]
}

@test "nccl env: values already set (user or _env_) are kept" {
  nccl_on "$NET_FIX/roce-bnxt" NCCL_IB_HCA=mlx5_9 NCCL_IB_GID_INDEX=1 NCCL_SOCKET_IFNAME=ens11np0
  [[ $output == *$'\nNCCL_IB_GID_INDEX=1\nNCCL_IB_HCA=mlx5_9\nNCCL_SOCKET_IFNAME=ens11np0' ]]
  [[ $output == *"NCCL_IB_HCA=mlx5_9 (already set)"* ]]
}

@test "nccl env: a preset NCCL_SOCKET_IFNAME naming docker0 or lo is replaced; an exclusion list is kept" {
  nccl_on "$NET_FIX/roce-bnxt" NCCL_SOCKET_IFNAME=docker0
  [[ $output == *"warning: NCCL_SOCKET_IFNAME=docker0 names a loopback/container interface"* ]]
  [[ $output == *$'\nNCCL_SOCKET_IFNAME=ens50f0np0' ]]
  nccl_on "$NET_FIX/roce-bnxt" NCCL_SOCKET_IFNAME==lo
  [[ $output == *$'\nNCCL_SOCKET_IFNAME=ens50f0np0' ]]
  nccl_on "$NET_FIX/roce-bnxt" NCCL_SOCKET_IFNAME=^docker,lo
  [[ $output == *$'\nNCCL_SOCKET_IFNAME=^docker,lo' ]]
  [[ $output != *warning* ]]
}

@test "nccl env: an interface whose link is down is not chosen for sockets" {
  local node=$BATS_TEST_TMPDIR/node
  cp -r "$NET_FIX/roce-bnxt" "$node"
  echo down >"$node/sys/class/net/ens50f0np0/operstate"
  nccl_on "$node"
  [[ $output == *"ens50f0np0 (10.20.30.41) skipped for NCCL_SOCKET_IFNAME: its link is down"* ]]
  [[ $output == *$'\nNCCL_SOCKET_IFNAME=eno1' ]]
}

# --- utils/ecc_check.sh ---------------------------------------------------------------------------------------

ecc() {
  run env SLURMD_NODENAME=gpu-node-3 GPU_DETECT_ROOT="$BATS_TEST_TMPDIR/empty" "$@" "$REPO_DIR/utils/ecc_check.sh"
}

@test "ecc: --help prints the usage; an argument is a usage error" {
  run "$REPO_DIR/utils/ecc_check.sh" --help
  [ "$status" -eq 0 ]
  [[ ${lines[0]} == "Usage: utils/ecc_check.sh"* ]]
  run "$REPO_DIR/utils/ecc_check.sh" node[1-4]
  [ "$status" -eq 2 ]
  [[ $output == "ecc_check.sh: unexpected argument 'node[1-4]'; "* ]]
}

@test "ecc: a clean MI300X node is one OK line; rocm-smi is asked for --showrasinfo" {
  tool_prints rocm-smi "$GPU_FIX/rocm-smi-showrasinfo-mi300x-clean.txt"
  ecc
  [ "$status" -eq 0 ]
  [ "$output" = "gpu-node-3: OK (no uncorrectable/correctable ECC errors)" ]
  [ "$(cat "$BATS_TEST_TMPDIR/rocm-smi.calls")" = "--showrasinfo" ]
}

@test "ecc: MI300X GPUs with UMC errors get one line each, and the exit status stays 0" {
  tool_prints rocm-smi "$GPU_FIX/rocm-smi-showrasinfo-mi300x-errors.txt"
  ecc
  [ "$status" -eq 0 ]
  [ "${#lines[@]}" -eq 2 ]
  [ "${lines[0]}" = "gpu-node-3: GPU[2] UMC CE=4 UE=0" ]
  [ "${lines[1]}" = "gpu-node-3: GPU[5] UMC CE=12 UE=2" ]
}

@test "ecc: an older rocm-smi with swapped column titles is still read by position" {
  tool_prints rocm-smi "$GPU_FIX/rocm-smi-showrasinfo-old-column-titles.txt"
  grep -q 'uncorrectable err  correctable err' "$GPU_FIX/rocm-smi-showrasinfo-old-column-titles.txt"
  ecc
  [ "$output" = "gpu-node-3: GPU[1] UMC CE=3 UE=0" ]
}

@test "ecc: H100 volatile counters: clean is OK, DRAM and SRAM errors are named with the bus id" {
  tool_prints nvidia-smi "$GPU_FIX/nvidia-smi-q-d-ecc-h100-clean.txt"
  ecc
  [ "$output" = "gpu-node-3: OK (no uncorrectable/correctable ECC errors)" ]
  [ "$(cat "$BATS_TEST_TMPDIR/nvidia-smi.calls")" = "-q -d ECC" ]
  tool_prints nvidia-smi "$GPU_FIX/nvidia-smi-q-d-ecc-h100-errors.txt"
  ecc
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "gpu-node-3: GPU[3] DRAM CE=7 UE=2 (bus 00000000:5D:00.0)" ]
  [ "${lines[1]}" = "gpu-node-3: GPU[6] SRAM CE=0 UE=1 (bus 00000000:BA:00.0)" ]
  [ "${#lines[@]}" -eq 2 ]
}

@test "ecc: the pre-535 four-counter layout (A100, 177 corrected DRAM errors) is read too" {
  tool_prints nvidia-smi "$GPU_FIX/nvidia-smi-q-d-ecc-a100-ce.txt"
  ecc
  [ "$output" = "gpu-node-3: GPU[0] DRAM CE=177 UE=0 (bus 00000000:10:1C.0)" ]
}

@test "ecc: GPUs without ECC (all N/A) are reported as skipped, not as OK" {
  tool_prints nvidia-smi "$GPU_FIX/nvidia-smi-q-d-ecc-rtx4060ti-na.txt"
  ecc
  [ "$status" -eq 0 ]
  [[ $output == "gpu-node-3: nvidia-smi -q -d ECC printed no ECC counters"*"ECC check skipped" ]]
}

@test "ecc: the node's vendor picks the tool when both are installed" {
  tool_prints rocm-smi "$GPU_FIX/rocm-smi-showrasinfo-mi300x-errors.txt"
  tool_prints nvidia-smi "$GPU_FIX/nvidia-smi-q-d-ecc-h100-clean.txt"
  ecc GPU_DETECT_ROOT="$REPO_DIR/tests/fixtures/sysfs/h100"
  [ "$output" = "gpu-node-3: OK (no uncorrectable/correctable ECC errors)" ]
  [ ! -e "$BATS_TEST_TMPDIR/rocm-smi.calls" ]
  ecc GPU_DETECT_ROOT="$REPO_DIR/tests/fixtures/sysfs/mi300x"
  [[ $output == *"GPU[5] UMC CE=12 UE=2" ]]
}

@test "ecc: no tool is a skip line; a hung tool is cut off and reported; the host defaults to hostname -s" {
  local path
  path=$(sandbox_path bash dirname hostname uname timeout awk sed grep cat)
  run env -u SLURMD_NODENAME PATH="$path" "$REPO_DIR/utils/ecc_check.sh"
  [ "$status" -eq 0 ]
  [ "$output" = "$(hostname -s): no GPU tool (rocm-smi/nvidia-smi): ECC check skipped" ]
  make_stub rocm-smi 'exec sleep 30'
  SECONDS=0
  ecc ECC_TOOL_TIMEOUT=1
  [ "$status" -eq 0 ]
  [ "$SECONDS" -lt 10 ]
  [ "$output" = "gpu-node-3: rocm-smi --showrasinfo did not answer within 1s: ECC check inconclusive" ]
}

# --- utils/preflight.sh ---------------------------------------------------------------------------------------

# Stubs every preflight run gets: docker/podman without an engine, squeue that knows job 4242 as running, has
# never heard of 4141, and cannot reach its controller for 4343.
preflight_stubs() {
  make_stub docker "echo \"\$*\" >>\"$BATS_TEST_TMPDIR/docker.calls\"; exit 1"
  make_stub podman "echo \"\$*\" >>\"$BATS_TEST_TMPDIR/podman.calls\"; exit 125"
  make_stub squeue '
case " $* " in
  *" -j 4242 "*) echo RUNNING ;;
  *" -j 4141 "*) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
  *) echo "slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2; exit 1 ;;
esac'
  mkdir -p "$BATS_TEST_TMPDIR/ws" "$BATS_TEST_TMPDIR/empty"
  export SLURMD_NODENAME=node07 JOB_WORKSPACE=$BATS_TEST_TMPDIR/ws GPU_DETECT_ROOT=$BATS_TEST_TMPDIR/empty
  export PREFLIGHT_SYSFS_ROOT=$BATS_TEST_TMPDIR/empty
}

@test "preflight: --help prints the usage; an argument is a usage error" {
  run "$REPO_DIR/utils/preflight.sh" --help
  [ "$status" -eq 0 ]
  [[ ${lines[0]} == "Usage: utils/preflight.sh"* ]]
  run "$REPO_DIR/utils/preflight.sh" --all
  [ "$status" -eq 2 ]
}

@test "preflight: a stale training process of an earlier job is terminated and logged; others are untouched" {
  preflight_stubs
  in_pidns '
    fake_training old-job fake; stale=$FAKE_PID
    fake_training new-job current; current=$FAKE_PID
    sleep 300 >/dev/null 2>&1 & other=$!
    JOB_ID=new-job PREFLIGHT_KILL_WAIT=5 "$REPO_DIR/utils/preflight.sh" >"$T/out" 2>"$T/err"; echo $? >"$T/rc"
    echo "stale=$(state_of $stale) current=$(state_of $current) other=$(state_of $other)" >"$T/states"
    echo "$stale $current" >"$T/pids"
    kill "$other" "$current"'
  read -r stale current <"$BATS_TEST_TMPDIR/pids"
  cat "$BATS_TEST_TMPDIR/out" "$BATS_TEST_TMPDIR/err"
  [ "$(cat "$BATS_TEST_TMPDIR/rc")" -eq 0 ]
  [ "$(cat "$BATS_TEST_TMPDIR/states")" = "stale=gone current=alive other=alive" ]
  grep -qx "\[preflight node07\] stale training process PID $stale of job old-job (python -m jobkit.launch fake 300): sending SIGTERM" "$BATS_TEST_TMPDIR/out"
  grep -qx "\[preflight node07\] PID $stale (job old-job) ended after SIGTERM" "$BATS_TEST_TMPDIR/out"
  grep -qx "\[preflight node07\] PID $current runs training (python -m jobkit.launch current 300) and belongs to this job: left alone" "$BATS_TEST_TMPDIR/out"
  [ "$(grep -cv '^\[preflight node07\] ' "$BATS_TEST_TMPDIR/out")" -eq 0 ]
  [ ! -s "$BATS_TEST_TMPDIR/err" ]
}

@test "preflight: a stale job's process per device (LOCAL_WORLD_SIZE=2) goes whole: its jobkit procs and both processes" {
  preflight_stubs
  in_pidns '
    env JOB_ID=old-job bash -c "exec -a \"python jobkit procs -- python jobkit launch tiny.yml\" sleep 300" >/dev/null 2>&1 &
    supervisor=$!
    fake_training old-job local0; p0=$FAKE_PID
    fake_training old-job local1; p1=$FAKE_PID
    JOB_ID=new-job PREFLIGHT_KILL_WAIT=5 "$REPO_DIR/utils/preflight.sh" >"$T/out" 2>&1
    echo "$(state_of $supervisor) $(state_of $p0) $(state_of $p1)" >"$T/states"
    echo "$supervisor $p0 $p1" >"$T/pids"'
  read -r supervisor p0 p1 <"$BATS_TEST_TMPDIR/pids"
  cat "$BATS_TEST_TMPDIR/out"
  [ "$(cat "$BATS_TEST_TMPDIR/states")" = "gone gone gone" ]
  for pid in "$supervisor" "$p0" "$p1"; do
    grep -q "stale training process PID $pid of job old-job" "$BATS_TEST_TMPDIR/out"
  done
}

@test "preflight: a stale process that ignores SIGTERM gets SIGKILL" {
  preflight_stubs
  in_pidns '
    fake_training old-job stubborn ignore-term; stale=$FAKE_PID
    JOB_ID=new-job PREFLIGHT_KILL_WAIT=1 "$REPO_DIR/utils/preflight.sh" >"$T/out" 2>&1
    echo "$stale $(state_of $stale)" >"$T/state"'
  read -r stale state <"$BATS_TEST_TMPDIR/state"
  cat "$BATS_TEST_TMPDIR/out"
  [ "$state" = gone ]
  grep -q "PID $stale (job old-job) ignored SIGTERM for 1s: killed with SIGKILL" "$BATS_TEST_TMPDIR/out"
}

@test "preflight: processes of a job Slurm still runs (or cannot vouch for, or run_local.sh's) are left alone; a finished one's go" {
  preflight_stubs
  in_pidns '
    fake_training 4242 running; running=$FAKE_PID
    fake_training 4343 unreachable; unknown=$FAKE_PID
    fake_training 4141 finished; finished=$FAKE_PID
    fake_training local_20261123_101010_abcd by-hand; by_hand=$FAKE_PID
    JOB_ID=5000 PREFLIGHT_KILL_WAIT=5 "$REPO_DIR/utils/preflight.sh" >"$T/out" 2>&1
    echo "$(state_of $running) $(state_of $unknown) $(state_of $finished) $(state_of $by_hand)" >"$T/states"
    kill "$by_hand"'
  cat "$BATS_TEST_TMPDIR/out"
  [ "$(cat "$BATS_TEST_TMPDIR/states")" = "alive alive gone alive" ]
  # a run_local.sh job on the same host is someone'"'"'s live run: Slurm knowing nothing of it proves nothing
  grep -q "belongs to run_local.sh job local_20261123_101010_abcd, which Slurm cannot vouch for: left alone" "$BATS_TEST_TMPDIR/out"
  grep -q "belongs to job 4242, which Slurm still runs: left alone" "$BATS_TEST_TMPDIR/out"
  grep -q "belongs to job 4343, and Slurm could not be asked whether it still runs: left alone" "$BATS_TEST_TMPDIR/out"
  grep -q "stale training process PID [0-9]* of job 4141" "$BATS_TEST_TMPDIR/out"
}

@test "preflight: another user's training process is reported and left alone" {
  preflight_stubs
  in_pidns '
    setpriv --reuid=65534 --regid=65534 --clear-groups env JOB_ID=old-job \
      bash -c "exec -a \"python -m jobkit.launch theirs\" sleep 300" >/dev/null 2>&1 &
    theirs=$!
    # until the exec is done: bash -c'"'"'s own command line names jobkit.launch too, inside its -c string
    for i in $(seq 500); do tr "\0" " " </proc/$theirs/cmdline | grep -q "^python -m jobkit.launch" && break; sleep 0.02; done
    JOB_ID=new-job "$REPO_DIR/utils/preflight.sh" >"$T/out" 2>&1
    echo "$theirs $(state_of $theirs)" >"$T/state"'
  read -r pid state <"$BATS_TEST_TMPDIR/state"
  cat "$BATS_TEST_TMPDIR/out"
  [ "$state" = alive ]
  grep -q "PID $pid of user nobody runs training (python -m jobkit.launch theirs 300): not ours, left alone" "$BATS_TEST_TMPDIR/out"
}

@test "preflight: only label-filtered containers of an earlier job are stopped" {
  preflight_stubs
  make_stub docker "
echo \"\$*\" >>\"$BATS_TEST_TMPDIR/docker.calls\"
case \"\$*\" in
  'ps -q --filter label=maxtext-launcher=1') printf '%s\n' aaa111 bbb222 ccc333 ;;
  'ps --format {{.ID}} {{.Names}}') printf '%s\n' 'aaa111 old' 'bbb222 new' 'ccc333 live' 'ext444 web' 'ext555 db' ;;
  'container inspect --format'*)
    case \"\${*: -1}\" in aaa111) echo old-job ;; bbb222) echo new-job ;; ccc333) echo 4242 ;; esac ;;
  'stop -t 10 '*) ;;
  *) exit 1 ;;
esac"
  in_pidns 'JOB_ID=new-job "$REPO_DIR/utils/preflight.sh" >"$T/out" 2>&1'
  cat "$BATS_TEST_TMPDIR/out" "$BATS_TEST_TMPDIR/docker.calls"
  [ "$(grep -c '^stop' "$BATS_TEST_TMPDIR/docker.calls")" -eq 1 ]
  grep -qx 'stop -t 10 aaa111' "$BATS_TEST_TMPDIR/docker.calls"
  [ "$(grep -v '^ps --format' "$BATS_TEST_TMPDIR/docker.calls" | grep -c ext4)" -eq 0 ]
  grep -q "stopped docker container aaa111" "$BATS_TEST_TMPDIR/out"
  grep -q "docker container bbb222 (our label) belongs to this job: left alone" "$BATS_TEST_TMPDIR/out"
  grep -q "docker container ccc333 (our label) belongs to job 4242, which Slurm still runs: left alone" "$BATS_TEST_TMPDIR/out"
  grep -q "docker: 2 other running container(s) not started by this launcher, left alone: web db" "$BATS_TEST_TMPDIR/out"
  grep -q "podman: no engine answering" "$BATS_TEST_TMPDIR/out"
}

@test "preflight: GPU count, a Slurm/kernel mismatch and a process holding the GPUs are reported, not touched" {
  preflight_stubs
  cp -r "$REPO_DIR/tests/fixtures/sysfs/mi300x" "$BATS_TEST_TMPDIR/gpu"
  in_pidns '
    sleep 300 >/dev/null 2>&1 & holder=$!
    mkdir -p "$T/gpu/sys/class/kfd/kfd/proc/$holder"
    GPU_DETECT_ROOT=$T/gpu SLURM_GPUS_ON_NODE=8 JOB_ID=new-job "$REPO_DIR/utils/preflight.sh" >"$T/out" 2>&1
    echo "$holder $(state_of $holder)" >"$T/state"'
  read -r pid state <"$BATS_TEST_TMPDIR/state"
  cat "$BATS_TEST_TMPDIR/out"
  [ "$state" = alive ]
  grep -q '\] GPUs: 2 amd$' "$BATS_TEST_TMPDIR/out"
  grep -q "warning: Slurm allocated 8 GPU(s) on this node but the kernel shows 2" "$BATS_TEST_TMPDIR/out"
  grep -q "PID $pid of user root has the AMD GPUs open (sleep 300): not started by this job, left alone" "$BATS_TEST_TMPDIR/out"
}

@test "preflight: on an NVIDIA node the compute processes nvidia-smi lists are reported, not touched" {
  preflight_stubs
  make_stub nvidia-smi "echo \"\$*\" >>\"$BATS_TEST_TMPDIR/nvidia-smi.calls\"; printf '%s\\n' '48213, /usr/bin/python3, 61234 MiB' '48377, /opt/tool/bin/bench, 812 MiB'"
  in_pidns 'GPU_DETECT_ROOT=$REPO_DIR/tests/fixtures/sysfs/h100 JOB_ID=j "$REPO_DIR/utils/preflight.sh" >"$T/out" 2>&1'
  cat "$BATS_TEST_TMPDIR/out"
  grep -q '\] GPUs: 2 nvidia$' "$BATS_TEST_TMPDIR/out"
  grep -q "GPU process 48213, /usr/bin/python3, 61234 MiB: not started by this job, left alone" "$BATS_TEST_TMPDIR/out"
  grep -q "GPU process 48377, /opt/tool/bin/bench, 812 MiB: not started by this job, left alone" "$BATS_TEST_TMPDIR/out"
  [ "$(cat "$BATS_TEST_TMPDIR/nvidia-smi.calls")" = "--query-compute-apps=pid,process_name,used_memory --format=csv,noheader" ]
}

@test "preflight: THP, NUMA balancing and free space are reported; an unwritable JOB_WORKSPACE is fatal" {
  preflight_stubs
  local sys=$BATS_TEST_TMPDIR/sys
  mkdir -p "$sys/sys/kernel/mm/transparent_hugepage" "$sys/proc/sys/kernel"
  echo 'always [madvise] never' >"$sys/sys/kernel/mm/transparent_hugepage/enabled"
  echo 'always defer defer+madvise [madvise] never' >"$sys/sys/kernel/mm/transparent_hugepage/defrag"
  echo 1 >"$sys/proc/sys/kernel/numa_balancing"
  in_pidns 'PREFLIGHT_SYSFS_ROOT=$T/sys JOB_ID=j "$REPO_DIR/utils/preflight.sh" >"$T/out" 2>&1; echo $? >"$T/rc"'
  cat "$BATS_TEST_TMPDIR/out"
  [ "$(cat "$BATS_TEST_TMPDIR/rc")" -eq 0 ]
  grep -q "transparent hugepages: enabled=madvise defrag=madvise" "$BATS_TEST_TMPDIR/out"
  grep -q "NUMA balancing: on (1); " "$BATS_TEST_TMPDIR/out"
  grep -q "\] $BATS_TEST_TMPDIR/ws: [0-9]* GiB free$" "$BATS_TEST_TMPDIR/out"
  : >"$BATS_TEST_TMPDIR/afile"
  in_pidns 'JOB_WORKSPACE=$T/afile/ws PREFLIGHT_MIN_FREE_GB=999999999 JOB_ID=j "$REPO_DIR/utils/preflight.sh" >"$T/out" 2>"$T/err"; echo $? >"$T/rc"'
  cat "$BATS_TEST_TMPDIR/out" "$BATS_TEST_TMPDIR/err"
  [ "$(cat "$BATS_TEST_TMPDIR/rc")" -eq 1 ]
  grep -q "^preflight.sh: JOB_WORKSPACE=$BATS_TEST_TMPDIR/afile/ws cannot be written by .*; fix its permissions" "$BATS_TEST_TMPDIR/err"
  grep -q "warning: /tmp has only [0-9]* GiB free" "$BATS_TEST_TMPDIR/out"
}
