#!/usr/bin/env bash
# Summary: metrics exporter plugin: host network, TCP, RDMA, scheduler, memory and pressure counters.
# Usage: host_metrics_plugin.sh <short hostname>
#
# Called once per exporter cycle (see utils/metrics_exporter.sh). Prints Prometheus text exposition on
# stdout; every sample carries host="<$1>". Reads /proc and /sys with bash builtins only: no command is
# started, so a cycle costs a few ms of CPU. HOST_METRICS_ROOT prefixes /proc and /sys (test fixtures).
# No state is kept between calls (everything exported is a counter or a gauge), so no "# STATE" line.
#
# Metrics (names shared with the reference dashboards where it has one; (+) = name of our own):
#   hw_net_{rx,tx}_{bytes,errors,drop}_total{device}          /proc/net/dev (lo, docker0, veth* skipped)
#   hw_net_{rx,tx}_packets_total{device} (+)                  /proc/net/dev
#   hw_tcp_retransmits_total                                   /proc/net/snmp Tcp RetransSegs
#   hw_tcp_estab_resets_total                                  /proc/net/snmp Tcp EstabResets
#   hw_tcp_out_resets_total (+)                                /proc/net/snmp Tcp OutRsts
#   hw_tcp_listen_overflows_total, hw_tcp_listen_drops_total,
#   hw_tcp_abort_on_timeout_total                              /proc/net/netstat TcpExt
#   hw_rdma_{rx,tx}_{bytes,pkts}_total{device,port}            ports/<p>/counters (data x4), else hw_counters
#   hw_rdma_rx_errors_total, hw_rdma_tx_discards_total,
#   hw_rdma_symbol_errors_total, hw_rdma_link_downed_total (+) ports/<p>/counters
#   hw_rdma_tx_retx_{bytes,pkts}_total, hw_rdma_tx_ack_timeout_total, hw_rdma_{rx_ecn,rx_cnp,tx_cnp}_pkts_total,
#   hw_rdma_req_rx_cqe_err_total, hw_rdma_req_tx_retry_excd_err_total, hw_rdma_ccl_*_total,
#   hw_rdma_rx_dup_{response,request}_total                   ports/<p>/hw_counters (ionic and the like)
#   hw_rdma_port_state{device,port}                            1 when ports/<p>/state says ACTIVE
#   hw_procs_running, hw_procs_blocked, hw_context_switches_total   /proc/stat
#   hw_oom_kills_total                                         /proc/vmstat oom_kill
#   hw_mem_dirty_bytes, hw_mem_writeback_bytes                 /proc/meminfo (kB x 1024)
#   hw_io_pressure_{some,full}_pct (avg10), hw_io_pressure_{some,full}_avg300_pct,
#   hw_io_pressure_full_total_us, hw_io_pressure_some_total_us (+)            /proc/pressure/io
#   hw_memory_pressure_{some,full}_pct (avg10), hw_memory_pressure_{some,full}_avg300_pct (+),
#   hw_memory_pressure_{some,full}_total_us (+)                               /proc/pressure/memory
#   hw_gpu_user_processes                                      entries of /sys/class/kfd/kfd/proc (0 if absent)
# Not collected (reference has it): hw_dmesg_gpu_errors_total (would need a /dev/kmsg reader process).
set -u

HOST=${1:-}
if [[ -z $HOST ]]; then
  echo "Usage: host_metrics_plugin.sh <short hostname>" >&2
  exit 2
fi
[[ $HOST == -h || $HOST == --help ]] && { echo "Usage: host_metrics_plugin.sh <short hostname>"; exit 0; }
ROOT=${HOST_METRICS_ROOT:-}
PROC=$ROOT/proc
SYS=$ROOT/sys
shopt -s nullglob

_PLUGIN_DIR=${BASH_SOURCE[0]%/*}
[[ $_PLUGIN_DIR == "${BASH_SOURCE[0]}" ]] && _PLUGIN_DIR=.   # run as "bash <plugin>" from its own dir
# shellcheck source=utils/lib/metrics_exposition.sh
source "$_PLUGIN_DIR/../lib/metrics_exposition.sh"

# --- /proc/net/dev ------------------------------------------------------------------------------------
collect_netdev() {
  local -a L f
  local line dev lbl i
  [[ -r $PROC/net/dev ]] || return 0
  mapfile -t L <"$PROC/net/dev"
  set -f  # no pathname expansion in the word splits below
  for ((i = 2; i < ${#L[@]}; i++)); do
    line=${L[i]}
    dev=${line%%:*} dev=${dev##* }
    # shellcheck disable=SC2206  # deliberate word split of a numbers-only line (noglob is set)
    f=(${line#*:})
    [[ -z $dev || $dev == lo || $dev == docker0 || $dev == veth* || ${#f[@]} -lt 16 ]] && continue
    lbl=",device=\"$dev\""
    add hw_net_rx_bytes_total counter "Bytes received on the interface" "$lbl" "${f[0]}"
    add hw_net_rx_packets_total counter "Packets received on the interface" "$lbl" "${f[1]}"
    add hw_net_rx_errors_total counter "Receive errors on the interface" "$lbl" "${f[2]}"
    add hw_net_rx_drop_total counter "Received packets dropped on the interface" "$lbl" "${f[3]}"
    add hw_net_tx_bytes_total counter "Bytes sent on the interface" "$lbl" "${f[8]}"
    add hw_net_tx_packets_total counter "Packets sent on the interface" "$lbl" "${f[9]}"
    add hw_net_tx_errors_total counter "Transmit errors on the interface" "$lbl" "${f[10]}"
    add hw_net_tx_drop_total counter "Transmitted packets dropped on the interface" "$lbl" "${f[11]}"
  done
  set +f
}

# --- /proc/net/snmp and /proc/net/netstat: "Proto: names" line followed by "Proto: values" line -------
declare -A KV=()
# read_pairs FILE KEY...: KV[<Proto:><Name>] for each wanted "Proto:Name" KEY. The column of a name is the
# number of spaces before it on the names line plus one (string operations only: no per-column loop).
read_pairs() {
  local -a L vals
  local file=$1 key proto name j pre sp
  shift
  [[ -r $file ]] || return 0
  mapfile -t L <"$file"
  for key; do
    proto=${key%%:*}: name=${key#*:}
    for ((j = 0; j + 1 < ${#L[@]}; j += 2)); do
      [[ ${L[j]} == "$proto "* && "${L[j]} " == *" $name "* ]] || continue
      pre="${L[j]} " pre=${pre%% "$name" *}
      sp=${pre//[! ]/}
      set -f
      # shellcheck disable=SC2206  # deliberate word split of a numbers line (noglob set)
      vals=(${L[j + 1]})
      set +f
      KV[$key]=${vals[${#sp} + 1]:-}
      break
    done
  done
}
collect_tcp() {
  read_pairs "$PROC/net/snmp" Tcp:RetransSegs Tcp:EstabResets Tcp:OutRsts
  read_pairs "$PROC/net/netstat" TcpExt:ListenOverflows TcpExt:ListenDrops TcpExt:TCPAbortOnTimeout
  add hw_tcp_retransmits_total counter "TCP segments retransmitted (Tcp RetransSegs)" "" "${KV[Tcp:RetransSegs]:-}"
  add hw_tcp_estab_resets_total counter "TCP connections reset from ESTABLISHED or CLOSE-WAIT (Tcp EstabResets)" "" "${KV[Tcp:EstabResets]:-}"
  add hw_tcp_out_resets_total counter "TCP segments sent with the RST flag (Tcp OutRsts)" "" "${KV[Tcp:OutRsts]:-}"
  add hw_tcp_listen_overflows_total counter "TCP accept queue overflows (TcpExt ListenOverflows)" "" "${KV[TcpExt:ListenOverflows]:-}"
  add hw_tcp_listen_drops_total counter "TCP SYNs dropped at listen (TcpExt ListenDrops)" "" "${KV[TcpExt:ListenDrops]:-}"
  add hw_tcp_abort_on_timeout_total counter "TCP connections aborted on timeout (TcpExt TCPAbortOnTimeout)" "" "${KV[TcpExt:TCPAbortOnTimeout]:-}"
}

# --- RDMA: /sys/class/infiniband/<dev>/ports/<p>/{counters,hw_counters,state} ---------------------------
# hw_counters file -> metric (ionic-style extended counters)
RDMA_HW=(
  tx_rdma_retx_bytes:hw_rdma_tx_retx_bytes_total tx_rdma_retx_pkts:hw_rdma_tx_retx_pkts_total
  tx_rdma_ack_timeout:hw_rdma_tx_ack_timeout_total rx_rdma_ecn_pkts:hw_rdma_rx_ecn_pkts_total
  rx_rdma_cnp_pkts:hw_rdma_rx_cnp_pkts_total tx_rdma_cnp_pkts:hw_rdma_tx_cnp_pkts_total
  req_rx_cqe_err:hw_rdma_req_rx_cqe_err_total req_tx_retry_excd_err:hw_rdma_req_tx_retry_excd_err_total
  tx_rdma_ccl_cts_retx_pkts:hw_rdma_ccl_tx_retx_pkts_total tx_rdma_ccl_cts_retx_bytes:hw_rdma_ccl_tx_retx_bytes_total
  tx_rdma_ccl_cts_ack_timeout:hw_rdma_ccl_tx_ack_timeout_total
  tx_rdma_ccl_cts_pkts:hw_rdma_ccl_tx_pkts_total tx_rdma_ccl_cts_bytes:hw_rdma_ccl_tx_bytes_total
  rx_rdma_ccl_cts_pkts:hw_rdma_ccl_rx_pkts_total rx_rdma_ccl_cts_bytes:hw_rdma_ccl_rx_bytes_total
  req_rx_dup_response:hw_rdma_rx_dup_response_total resp_rx_dup_request:hw_rdma_rx_dup_request_total
)
collect_rdma() {
  local d p c h lbl e st
  for d in "$SYS"/class/infiniband/*; do
    for p in "$d"/ports/*; do
      lbl=",device=\"${d##*/}\",port=\"${p##*/}\""
      c=$p/counters h=$p/hw_counters
      if [[ -d $c ]]; then
        # port_rcv_data / port_xmit_data count 4-byte words (IBTA PortCounters)
        readval "$c/port_rcv_data"; [[ -n $REPLY ]] && add hw_rdma_rx_bytes_total counter "RDMA bytes received" "$lbl" "$((REPLY * 4))"
        readval "$c/port_xmit_data"; [[ -n $REPLY ]] && add hw_rdma_tx_bytes_total counter "RDMA bytes sent" "$lbl" "$((REPLY * 4))"
        readval "$c/port_rcv_packets"; add hw_rdma_rx_pkts_total counter "RDMA packets received" "$lbl" "$REPLY"
        readval "$c/port_xmit_packets"; add hw_rdma_tx_pkts_total counter "RDMA packets sent" "$lbl" "$REPLY"
        readval "$c/port_rcv_errors"; add hw_rdma_rx_errors_total counter "RDMA packets received with errors" "$lbl" "$REPLY"
        readval "$c/port_xmit_discards"; add hw_rdma_tx_discards_total counter "RDMA outbound packets discarded" "$lbl" "$REPLY"
        readval "$c/symbol_error"; add hw_rdma_symbol_errors_total counter "RDMA link symbol errors" "$lbl" "$REPLY"
        readval "$c/link_downed"; add hw_rdma_link_downed_total counter "RDMA link down events" "$lbl" "$REPLY"
      elif [[ -d $h ]]; then
        readval "$h/rx_rdma_ucast_bytes"; add hw_rdma_rx_bytes_total counter "RDMA bytes received" "$lbl" "$REPLY"
        readval "$h/tx_rdma_ucast_bytes"; add hw_rdma_tx_bytes_total counter "RDMA bytes sent" "$lbl" "$REPLY"
        readval "$h/rx_rdma_ucast_pkts"; add hw_rdma_rx_pkts_total counter "RDMA packets received" "$lbl" "$REPLY"
        readval "$h/tx_rdma_ucast_pkts"; add hw_rdma_tx_pkts_total counter "RDMA packets sent" "$lbl" "$REPLY"
      fi
      if [[ -d $h ]]; then
        for e in "${RDMA_HW[@]}"; do
          [[ -e $h/${e%%:*} ]] || continue
          readval "$h/${e%%:*}"; add "${e#*:}" counter "RDMA hw_counters ${e%%:*}" "$lbl" "$REPLY"
        done
      fi
      if [[ -r $p/state ]]; then
        read -r st <"$p/state"
        [[ $st == *ACTIVE* ]] && st=1 || st=0
        add hw_rdma_port_state gauge "RDMA port state (1 = ACTIVE)" "$lbl" "$st"
      fi
    done
  done
}

# --- /proc/stat, /proc/vmstat, /proc/meminfo ----------------------------------------------------------
collect_sched_mem() {
  local -a L
  local line i
  if [[ -r $PROC/stat ]]; then
    mapfile -t L <"$PROC/stat"
    for line in "${L[@]}"; do
      case $line in
        "ctxt "*) add hw_context_switches_total counter "Context switches since boot" "" "${line#* }" ;;
        "procs_running "*) add hw_procs_running gauge "Runnable tasks" "" "${line#* }" ;;
        "procs_blocked "*) add hw_procs_blocked gauge "Tasks blocked on I/O" "" "${line#* }" ;;
      esac
    done
  fi
  if [[ -r $PROC/vmstat ]]; then
    mapfile -t L <"$PROC/vmstat"
    for ((i = ${#L[@]} - 1; i >= 0; i--)); do  # oom_kill sits near the end
      [[ ${L[i]} == "oom_kill "* ]] && { add hw_oom_kills_total counter "Processes killed by the OOM killer" "" "${L[i]#* }"; break; }
    done
  fi
  if [[ -r $PROC/meminfo ]]; then
    mapfile -t L <"$PROC/meminfo"
    for line in "${L[@]}"; do
      case $line in
        Dirty:*) line=${line#Dirty:} line=${line% kB}; add hw_mem_dirty_bytes gauge "Memory waiting to be written back to disk" "" "$((${line// /} * 1024))" ;;
        Writeback:*) line=${line#Writeback:} line=${line% kB}; add hw_mem_writeback_bytes gauge "Memory being written back to disk" "" "$((${line// /} * 1024))" ;;
      esac
    done
  fi
}

# --- /proc/pressure/{io,memory}: "some avg10=.. avg60=.. avg300=.. total=.." ---------------------------
collect_psi() {
  local res kind a10 a300 tot
  for res in io memory; do
    [[ -r $PROC/pressure/$res ]] || continue
    while read -r kind a10 _ a300 tot; do
      [[ $kind == some || $kind == full ]] || continue
      add "hw_${res}_pressure_${kind}_pct" gauge "Share of time ($kind) stalled on $res, 10 s average, percent" "" "${a10#avg10=}"
      add "hw_${res}_pressure_${kind}_avg300_pct" gauge "Share of time ($kind) stalled on $res, 300 s average, percent" "" "${a300#avg300=}"
      add "hw_${res}_pressure_${kind}_total_us" counter "Total time ($kind) stalled on $res, microseconds" "" "${tot#total=}"
    done <"$PROC/pressure/$res"
  done
}

collect_kfd() {
  local -a p=("$SYS"/class/kfd/kfd/proc/[0-9]*)
  add hw_gpu_user_processes gauge "Processes holding the AMD GPU compute driver (kfd) open" "" "${#p[@]}"
}

collect_netdev
collect_tcp
collect_rdma
collect_sched_mem
collect_psi
collect_kfd
flush
