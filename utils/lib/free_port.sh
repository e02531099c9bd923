# shellcheck shell=bash
# Summary: Pick a random free TCP port for a coordinator or service, from the kernel's socket tables (sourced library)
#
# pick_free_port [EXCLUDE ...]   prints a random TCP port that is in the range, not in EXCLUDE and not in use
# tcp_ports_in_use, tcp_port_in_use   the kernel's view of ports in use (see below)
#
# "In use" means the port is the local port of any IPv4 or IPv6 TCP socket in /proc/net/tcp or /proc/net/tcp6, in
# any state: a listener, but also a connection or a TIME_WAIT remnant, either of which can make a later bind fail.
# No `ss` or `netstat` is needed. The answer is only a good guess (another program may take the port before the
# caller binds it), so callers should bind soon after asking.
#
#   FREE_PORT_RANGE     LOW-HIGH to choose from (default 20000-59999)
#   FREE_PORT_ATTEMPTS  random draws before giving up (default 100); each draw costs no system call
#   FREE_PORT_PROC      where the tcp/tcp6 tables are read from (default /proc/net)

# tcp_ports_in_use [--listening]
#     Prints the local port of every IPv4 and IPv6 TCP socket (only listeners with --listening), one per line,
#     duplicates possible. The one reader of the kernel's tables for every port check of the project.
# The tables are slurped with mapfile: `read` on a /proc file costs a system call per byte (0.1 s a table).
tcp_ports_in_use() {
  local listening_only=0 table line _sl local_addr _rem state _rest
  local -a lines
  [[ ${1:-} == --listening ]] && listening_only=1
  for table in "${FREE_PORT_PROC:-/proc/net}/tcp" "${FREE_PORT_PROC:-/proc/net}/tcp6"; do
    [[ -r $table ]] || continue
    mapfile -t -s 1 lines <"$table" # -s 1: the header line
    for line in "${lines[@]}"; do
      read -r _sl local_addr _rem state _rest <<<"$line"
      [[ $local_addr == *:* ]] || continue
      ((listening_only)) && [[ $state != 0A ]] && continue # 0A: TCP_LISTEN
      echo $((16#${local_addr##*:}))
    done
  done
}

# tcp_port_in_use PORT [--listening]
#     True when PORT is the local port of some TCP socket (of a listener, with --listening).
tcp_port_in_use() {
  local want=$((10#$1)) port found=1
  shift
  # Reads to the end: leaving early would make the writer's echo fail with EPIPE, which a caller that ignores
  # SIGPIPE (bats, some batch shells) sees as "write error: Broken pipe" on its stderr.
  while read -r port; do ((port == want)) && found=0; done < <(tcp_ports_in_use "$@")
  return "$found"
}

pick_free_port() {
  local range=${FREE_PORT_RANGE:-20000-59999} attempts=${FREE_PORT_ATTEMPTS:-100}
  local low high
  if [[ ! $range =~ ^([0-9]{1,5})-([0-9]{1,5})$ ]]; then
    echo "pick_free_port: FREE_PORT_RANGE=$range is not LOW-HIGH; use e.g. FREE_PORT_RANGE=20000-59999" >&2
    return 1
  fi
  low=$((10#${BASH_REMATCH[1]})) high=$((10#${BASH_REMATCH[2]}))
  if ((low < 1 || high > 65535 || low > high)); then
    echo "pick_free_port: FREE_PORT_RANGE=$range is outside 1-65535 or reversed; use e.g. FREE_PORT_RANGE=20000-59999" >&2
    return 1
  fi
  if [[ ! $attempts =~ ^[1-9][0-9]{0,4}$ ]]; then
    echo "pick_free_port: FREE_PORT_ATTEMPTS=$attempts is not a positive number; use e.g. FREE_PORT_ATTEMPTS=100" >&2
    return 1
  fi

  local -A taken=()
  local port
  for port in "$@"; do
    [[ $port =~ ^[0-9]+$ ]] && taken[$((10#$port))]=1
  done
  while read -r port; do taken[$port]=1; done < <(tcp_ports_in_use)

  local span=$((high - low + 1)) i
  for ((i = 0; i < attempts; i++)); do
    port=$((low + ((RANDOM << 15) | RANDOM) % span))
    if [[ -z ${taken[$port]:-} ]]; then
      echo "$port"
      return 0
    fi
  done
  echo "pick_free_port: no free TCP port found in $low-$high after $attempts random tries (excluded: ${*:-none}); widen FREE_PORT_RANGE or raise FREE_PORT_ATTEMPTS" >&2
  return 1
}
