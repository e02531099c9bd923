# shellcheck shell=bash
# Summary: NCCL/RCCL network settings for this node, detected from sysfs and `ip` (sourced library)
#
# detect_nccl_env exports, each only when it is not already set (a value from the user or _env_ wins):
#   NCCL_IB_HCA         comma list of /sys/class/infiniband devices with at least one ACTIVE port
#   NCCL_IB_GID_INDEX   the RoCE GID index to use, when every active RoCE port agrees on one. Per port the lowest
#                       index wins among, in order: RoCE v2 GIDs holding an IPv4 address (what NCCL's default
#                       address family, AF_INET, wants), then any RoCE v2 GID, then any other GID; all-zero and
#                       link-local (fe80::) GIDs never count. InfiniBand ports need no GID index and are left out.
#                       Disagreeing ports get a warning and the variable stays unset.
#   NCCL_SOCKET_IFNAME  the interface for NCCL's bootstrap/socket traffic, chosen the same way on every node:
#                       interfaces with a global IPv4 address, without loopback, container/overlay interfaces and
#                       networks (see cluster_ip.sh) or links whose operstate is down; 10/8 before 172.16/12 before
#                       192.168/16 before anything else, then by interface name. A preset value that names such a
#                       virtual interface is replaced, with a warning; an exclusion list ("^docker,lo") is kept.
# It prints one summary line to stderr saying what it chose and why, plus a line per warning, and returns 0.
#
#   NCCL_SYSFS_ROOT   prefix for /sys paths (default empty); tests point it at a recorded tree
#   `ip` is looked up on PATH (a stub in tests)

# shellcheck source=utils/lib/cluster_ip.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster_ip.sh"

# True when the port directory reports ACTIVE (the file reads "4: ACTIVE").
_nccl_port_active() {
  local state=""
  read -r state 2>/dev/null <"$1/state" || true
  [[ $state == *ACTIVE* ]]
}

# Prints "<index> <kind>" for the GID this RoCE port should use, or nothing. Reads gids/<i> and gid_attrs/types/<i>.
_nccl_port_gid_index() {
  local port=$1 f i gid type low v2_ipv4="" v2_any="" other=""
  local -a indices=()
  for f in "$port"/gids/*; do
    i=${f##*/}
    [[ $i =~ ^[0-9]+$ ]] && indices+=("$i")
  done
  ((${#indices[@]})) || return 0
  mapfile -t indices < <(printf '%s\n' "${indices[@]}" | sort -n)
  for i in "${indices[@]}"; do
    gid="" type=""
    read -r gid 2>/dev/null <"$port/gids/$i" || true
    low=${gid,,}
    [[ -n ${low//[0:]/} ]] || continue     # empty slot: all zero
    [[ $low == fe80:* ]] && continue       # link-local: no routable address behind it
    read -r type 2>/dev/null <"$port/gid_attrs/types/$i" || true
    if [[ $type == "RoCE v2" ]]; then
      if [[ $low == 0000:0000:0000:0000:0000:ffff:* || $low == ::ffff:* ]]; then
        v2_ipv4=$i
        break
      fi
      [[ -n $v2_any ]] || v2_any=$i
    else
      [[ -n $other ]] || other=$i
    fi
  done
  if [[ -n $v2_ipv4 ]]; then echo "$v2_ipv4 RoCE-v2-IPv4"
  elif [[ -n $v2_any ]]; then echo "$v2_any RoCE-v2"
  elif [[ -n $other ]]; then echo "$other RoCE-v1"
  fi
}

# True when /sys/class/net/IFNAME/operstate says the link is down.
_nccl_link_down() {
  local state=""
  read -r state 2>/dev/null <"${NCCL_SYSFS_ROOT:-}/sys/class/net/$1/operstate" || return 1
  [[ $state == down || $state == lowerlayerdown ]]
}

# Prints "<ifname> <ipv4> <why>" for the interface NCCL_SOCKET_IFNAME should name, or nothing.
_nccl_pick_socket_if() {
  local rank ifname addr lines why
  lines=$(cluster_ipv4_candidates --any) || return 0
  while read -r rank ifname addr; do
    [[ -n $ifname ]] || continue
    if _nccl_link_down "$ifname"; then
      echo "nccl_env: note: $ifname ($addr) skipped for NCCL_SOCKET_IFNAME: its link is down" >&2
      continue
    fi
    case $rank in
      1) why="10/8" ;; 2) why="172.16/12" ;; 3) why="192.168/16" ;; *) why="no private address; first by name" ;;
    esac
    echo "$ifname $addr $why"
    return 0
  done <<<"$lines"
  return 0
}

detect_nccl_env() {
  local dev port name link idx why addr
  local ib_dir=${NCCL_SYSFS_ROOT:-}/sys/class/infiniband
  local -a summary=() hcas=() roce_ports=() ib_ports=() choices=()

  # NCCL_IB_HCA and the active ports behind it.
  local -a devices=()
  if [[ -d $ib_dir ]]; then
    for dev in "$ib_dir"/*; do [[ -d $dev/ports ]] && devices+=("${dev##*/}"); done
  fi
  if ((${#devices[@]})); then
    mapfile -t devices < <(printf '%s\n' "${devices[@]}" | sort -V)
  fi
  for name in "${devices[@]}"; do
    local active=0
    for port in "$ib_dir/$name"/ports/*; do
      _nccl_port_active "$port" || continue
      active=1
      link=""
      read -r link 2>/dev/null <"$port/link_layer" || true
      if [[ $link == InfiniBand ]]; then ib_ports+=("$name/${port##*/}"); else roce_ports+=("$name/${port##*/}"); fi
    done
    ((active)) && hcas+=("$name")
  done

  if [[ -n ${NCCL_IB_HCA:-} ]]; then
    summary+=("NCCL_IB_HCA=$NCCL_IB_HCA (already set)")
  elif ((${#hcas[@]})); then
    local joined
    joined=$(IFS=,; echo "${hcas[*]}")
    export NCCL_IB_HCA=$joined
    why="${#hcas[@]} of ${#devices[@]} devices have an ACTIVE port"
    summary+=("NCCL_IB_HCA=$NCCL_IB_HCA ($why)")
  elif ((${#devices[@]})); then
    summary+=("NCCL_IB_HCA unset (${#devices[@]} RDMA devices, none with an ACTIVE port)")
    echo "nccl_env: warning: no RDMA device has an ACTIVE port (${devices[*]}); NCCL will fall back to sockets; check \`ibv_devinfo\` or the cabling" >&2
  else
    summary+=("NCCL_IB_HCA unset (no RDMA devices under /sys/class/infiniband)")
  fi

  # NCCL_IB_GID_INDEX from the active RoCE ports.
  if [[ -n ${NCCL_IB_GID_INDEX:-} ]]; then
    summary+=("NCCL_IB_GID_INDEX=$NCCL_IB_GID_INDEX (already set)")
  elif ((${#roce_ports[@]})); then
    local first="" kinds="" agree=1 p kind
    for p in "${roce_ports[@]}"; do
      idx="" kind=""
      read -r idx kind < <(_nccl_port_gid_index "$ib_dir/${p%/*}/ports/${p##*/}")
      choices+=("$p=${idx:-none}")
      [[ -n $first ]] || first=${idx:-none}
      [[ ${idx:-none} == "$first" ]] || agree=0
      [[ " $kinds " == *" ${kind//-/ } "* ]] || kinds+="${kinds:+/}${kind//-/ }"
    done
    if ((agree)) && [[ $first != none ]]; then
      export NCCL_IB_GID_INDEX=$first
      summary+=("NCCL_IB_GID_INDEX=$first ($kinds GID at this index on all ${#roce_ports[@]} active RoCE ports)")
    else
      summary+=("NCCL_IB_GID_INDEX unset (active RoCE ports disagree)")
      echo "nccl_env: warning: active RoCE ports have no common usable GID index (${choices[*]}); NCCL_IB_GID_INDEX left unset; set it with _env_NCCL_IB_GID_INDEX=<n> after checking \`show_gids\`" >&2
    fi
  elif ((${#ib_ports[@]})); then
    summary+=("NCCL_IB_GID_INDEX unset (InfiniBand link layer needs none)")
  else
    summary+=("NCCL_IB_GID_INDEX unset (no active RoCE port)")
  fi

  # NCCL_SOCKET_IFNAME.
  local preset=${NCCL_SOCKET_IFNAME:-} pick="" bad="" entry
  if [[ -n $preset && $preset != ^* ]]; then
    local -a entries=()
    IFS=, read -r -a entries <<<"${preset#=}"
    for entry in "${entries[@]}"; do
      cluster_ip_virtual_if "$entry" && bad+="${bad:+,}$entry"
    done
  fi
  if [[ -n $preset && -z $bad ]]; then
    summary+=("NCCL_SOCKET_IFNAME=$preset (already set)")
  else
    pick=$(_nccl_pick_socket_if)
    if [[ -n $pick ]]; then
      read -r name addr why <<<"$pick"
      if [[ -n $bad ]]; then
        echo "nccl_env: warning: NCCL_SOCKET_IFNAME=$preset names a loopback/container interface ($bad) that other nodes cannot reach; using $name instead" >&2
      fi
      export NCCL_SOCKET_IFNAME=$name
      summary+=("NCCL_SOCKET_IFNAME=$name ($addr, $why)")
    elif [[ -n $bad ]]; then
      echo "nccl_env: warning: NCCL_SOCKET_IFNAME=$preset names a loopback/container interface ($bad), and no better interface was found; kept as set" >&2
      summary+=("NCCL_SOCKET_IFNAME=$preset (kept: no alternative)")
    else
      summary+=("NCCL_SOCKET_IFNAME unset (no interface with a usable global IPv4 address)")
      echo "nccl_env: warning: no interface with a usable global IPv4 address; NCCL picks one itself, which can differ between nodes; set _env_NCCL_SOCKET_IFNAME=<ifname>" >&2
    fi
  fi

  local line="" part
  for part in "${summary[@]}"; do line+="${line:+; }$part"; done
  echo "nccl_env: $line" >&2
  return 0
}
