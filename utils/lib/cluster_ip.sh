# shellcheck shell=bash
# Summary: This node's cluster-private IPv4 address, read from `ip -4 -o addr show` only (sourced library)
#
# detect_cluster_ip           prints the address other nodes of the job should use to reach this one
# ip_of_interface IFNAME      prints IFNAME's first global IPv4 address
# cluster_ipv4_candidates [--any]
#                             prints "<rank> <ifname> <ipv4>" for every usable address, best first
#
# Nothing here sends a packet: the answer comes from the kernel's address list, never from an IP-echo service.
# A usable address has global scope and is not on loopback, on a container/overlay interface (docker*, cni*,
# flannel*, veth*, virbr*, podman*, br-*) or in a default container/overlay network (docker 172.17.0.0/16,
# podman 10.88.0.0/16, k3s 10.42.0.0/16 and 10.43.0.0/16). Rank 1 is 10/8, 2 is 172.16/12, 3 is 192.168/16;
# --any adds other addresses as rank 9. Ties go by interface name, then address, so nodes whose interfaces are
# named alike choose alike. CLUSTER_IP, when set, is the answer and nothing is probed.

# True when IFNAME is loopback or a container/overlay/bridge-of-VMs interface.
cluster_ip_virtual_if() {
  case $1 in
    lo | docker* | cni* | flannel* | veth* | virbr* | podman* | br-*) return 0 ;;
  esac
  return 1
}

# Prints the rank of an IPv4 address (see the header); 0 for a container/overlay network or loopback.
cluster_ip_rank() {
  local a b _rest
  IFS=. read -r a b _rest <<<"$1"
  if ((a == 127)) || [[ $a.$b == 172.17 || $a.$b == 10.88 || $a.$b == 10.42 || $a.$b == 10.43 ]]; then
    echo 0
  elif ((a == 10)); then
    echo 1
  elif ((a == 172 && b >= 16 && b <= 31)); then
    echo 2
  elif ((a == 192 && b == 168)); then
    echo 3
  else
    echo 9
  fi
}

# True when $1 is a dotted-quad IPv4 address.
cluster_ip_is_ipv4() {
  local re='^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$' i
  [[ $1 =~ $re ]] || return 1
  for i in 1 2 3 4; do ((BASH_REMATCH[i] <= 255)) || return 1; done
}

# Prints "<ifname> <ipv4>" for each global-scope IPv4 address, in the kernel's order. Fails when `ip` is missing.
_cluster_ip_global_addrs() {
  if ! command -v ip >/dev/null 2>&1; then
    echo "cluster_ip: the ip command (iproute2) is not installed; install iproute2, or set CLUSTER_IP (and NCCL_SOCKET_IFNAME) by hand" >&2
    return 2
  fi
  local _idx ifname family cidr rest
  while read -r _idx ifname family cidr rest; do
    [[ $family == inet && " $rest " == *" scope global "* ]] || continue
    echo "${ifname%:} ${cidr%%/*}"
  done < <(ip -4 -o addr show 2>/dev/null)
}

cluster_ipv4_candidates() {
  local any=0 ifname addr rank lines
  [[ ${1:-} == --any ]] && any=1
  lines=$(_cluster_ip_global_addrs) || return
  while read -r ifname addr; do
    [[ -n $ifname ]] || continue
    cluster_ip_virtual_if "$ifname" && continue
    cluster_ip_is_ipv4 "$addr" || continue
    rank=$(cluster_ip_rank "$addr")
    ((rank == 0)) && continue
    ((rank == 9 && any == 0)) && continue
    echo "$rank $ifname $addr"
  done <<<"$lines" | sort -k1,1n -k2,2 -k3,3V
}

ip_of_interface() {
  local want=${1:?ip_of_interface needs an interface name} ifname addr lines
  lines=$(_cluster_ip_global_addrs) || return
  while read -r ifname addr; do
    if [[ $ifname == "$want" ]]; then echo "$addr"; return 0; fi
  done <<<"$lines"
  echo "ip_of_interface: $want has no global IPv4 address; check \`ip -4 addr show dev $want\`" >&2
  return 1
}

detect_cluster_ip() {
  if [[ -n ${CLUSTER_IP:-} ]]; then
    if cluster_ip_is_ipv4 "$CLUSTER_IP"; then echo "$CLUSTER_IP"; return 0; fi
    echo "detect_cluster_ip: CLUSTER_IP=$CLUSTER_IP is not an IPv4 address; set it to this node's cluster address, e.g. CLUSTER_IP=10.1.2.3" >&2
    return 1
  fi
  local best seen
  best=$(cluster_ipv4_candidates) || return 1
  if [[ -n $best ]]; then
    best=${best%%$'\n'*}
    echo "${best##* }"
    return 0
  fi
  seen=$(_cluster_ip_global_addrs 2>/dev/null | tr '\n' ',' | sed 's/,$//; s/,/, /g')
  echo "detect_cluster_ip: no cluster-private IPv4 address (10/8, 172.16/12, 192.168/16 outside container networks) on this node (global addresses seen: ${seen:-none}); set CLUSTER_IP=<this node's address>" >&2
  return 1
}
