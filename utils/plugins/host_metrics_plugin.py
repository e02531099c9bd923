#!/usr/bin/env python3
"""Metrics exporter plugin: host network, TCP, RDMA, scheduler, memory and pressure counters.

Usage: host_metrics_plugin.py <short hostname>

Run by the exporter engine (utils/metrics_exporter.sh) inside one long-lived worker process that calls collect()
once per cycle (py/jobkit/observe/plugin_worker.py); run as a script it prints one cycle's output. Prints
Prometheus text exposition; every sample carries host="<host>". Reads /proc and /sys only (stdlib, no command is
started). HOST_METRICS_ROOT prefixes /proc and /sys (test fixtures). No state is kept between calls (everything
exported is a counter or a gauge), so no "# STATE" line. Its output is, byte for byte, that of the bash plugin it
replaced (tests/fixtures/metrics/golden/).

Metrics (names shared with the reference dashboards where it has one; (+) = name of our own):
  hw_net_{rx,tx}_{bytes,errors,drop}_total{device}          /proc/net/dev (lo, docker0, veth* skipped)
  hw_net_{rx,tx}_packets_total{device} (+)                  /proc/net/dev
  hw_tcp_retransmits_total                                   /proc/net/snmp Tcp RetransSegs
  hw_tcp_estab_resets_total                                  /proc/net/snmp Tcp EstabResets
  hw_tcp_out_resets_total (+)                                /proc/net/snmp Tcp OutRsts
  hw_tcp_listen_overflows_total, hw_tcp_listen_drops_total,
  hw_tcp_abort_on_timeout_total                              /proc/net/netstat TcpExt
  hw_rdma_{rx,tx}_{bytes,pkts}_total{device,port}            ports/<p>/counters (data x4), else hw_counters
  hw_rdma_rx_errors_total, hw_rdma_tx_discards_total,
  hw_rdma_symbol_errors_total, hw_rdma_link_downed_total (+) ports/<p>/counters
  hw_rdma_tx_retx_{bytes,pkts}_total, hw_rdma_tx_ack_timeout_total, hw_rdma_{rx_ecn,rx_cnp,tx_cnp}_pkts_total,
  hw_rdma_req_rx_cqe_err_total, hw_rdma_req_tx_retry_excd_err_total, hw_rdma_ccl_*_total,
  hw_rdma_rx_dup_{response,request}_total                   ports/<p>/hw_counters (ionic and the like)
  hw_rdma_port_state{device,port}                            1 when ports/<p>/state says ACTIVE
  hw_procs_running, hw_procs_blocked, hw_context_switches_total   /proc/stat
  hw_oom_kills_total                                         /proc/vmstat oom_kill
  hw_mem_dirty_bytes, hw_mem_writeback_bytes                 /proc/meminfo (kB x 1024)
  hw_io_pressure_{some,full}_pct (avg10), hw_io_pressure_{some,full}_avg300_pct,
  hw_io_pressure_full_total_us, hw_io_pressure_some_total_us (+)            /proc/pressure/io
  hw_memory_pressure_{some,full}_pct (avg10), hw_memory_pressure_{some,full}_avg300_pct (+),
  hw_memory_pressure_{some,full}_total_us (+)                               /proc/pressure/memory
  hw_gpu_user_processes                                      entries of /sys/class/kfd/kfd/proc (0 if absent)
Not collected (reference has it): hw_dmesg_gpu_errors_total (would need a /dev/kmsg reader process).
"""

import os
import re
import sys

# The shared helpers live in this checkout's py/ (a plugin runs by file path, in a worker or as a script).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "py"))
from jobkit.observe.plugin_text import Families, first_word, listing, read_text  # noqa: E402

_INT = re.compile(r"-?[0-9]+").fullmatch


def wrap64(n):
    """Signed 64-bit wrap-around, as shell arithmetic does it."""
    return (n + (1 << 63)) % (1 << 64) - (1 << 63)


def _lines(text):
    """Lines as `mapfile -t` gives them: a trailing newline makes no empty last line."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def collect_netdev(fam, proc):
    text = read_text(proc + "/net/dev")
    if text is None:
        return
    for line in _lines(text)[2:]:
        head, sep, rest = line.partition(":")
        dev = head.rsplit(" ", 1)[-1]
        f = rest.split() if sep else line.split()
        if not dev or dev in ("lo", "docker0") or dev.startswith("veth") or len(f) < 16:
            continue
        lbl = f',device="{dev}"'
        fam.add("hw_net_rx_bytes_total", "counter", "Bytes received on the interface", lbl, f[0])
        fam.add("hw_net_rx_packets_total", "counter", "Packets received on the interface", lbl, f[1])
        fam.add("hw_net_rx_errors_total", "counter", "Receive errors on the interface", lbl, f[2])
        fam.add("hw_net_rx_drop_total", "counter", "Received packets dropped on the interface", lbl, f[3])
        fam.add("hw_net_tx_bytes_total", "counter", "Bytes sent on the interface", lbl, f[8])
        fam.add("hw_net_tx_packets_total", "counter", "Packets sent on the interface", lbl, f[9])
        fam.add("hw_net_tx_errors_total", "counter", "Transmit errors on the interface", lbl, f[10])
        fam.add("hw_net_tx_drop_total", "counter", "Transmitted packets dropped on the interface", lbl, f[11])


def read_pairs(kv, path, *keys):
    """kv["Proto:Name"] from a "Proto: names" line followed by its "Proto: values" line (/proc/net/snmp)."""
    text = read_text(path)
    if text is None:
        return
    lines = _lines(text)
    for key in keys:
        proto, name = key.split(":", 1)
        for j in range(0, len(lines) - 1, 2):
            names = lines[j] + " "
            if not (lines[j].startswith(proto + ": ") and f" {name} " in names):
                continue
            column = names[: names.find(f" {name} ")].count(" ") + 1
            values = lines[j + 1].split()
            kv[key] = values[column] if column < len(values) else ""
            break


_TCP = (
    ("hw_tcp_retransmits_total", "TCP segments retransmitted (Tcp RetransSegs)", "Tcp:RetransSegs"),
    (
        "hw_tcp_estab_resets_total",
        "TCP connections reset from ESTABLISHED or CLOSE-WAIT (Tcp EstabResets)",
        "Tcp:EstabResets",
    ),
    ("hw_tcp_out_resets_total", "TCP segments sent with the RST flag (Tcp OutRsts)", "Tcp:OutRsts"),
    ("hw_tcp_listen_overflows_total", "TCP accept queue overflows (TcpExt ListenOverflows)", "TcpExt:ListenOverflows"),
    ("hw_tcp_listen_drops_total", "TCP SYNs dropped at listen (TcpExt ListenDrops)", "TcpExt:ListenDrops"),
    (
        "hw_tcp_abort_on_timeout_total",
        "TCP connections aborted on timeout (TcpExt TCPAbortOnTimeout)",
        "TcpExt:TCPAbortOnTimeout",
    ),
)


def collect_tcp(fam, proc):
    kv = {}
    read_pairs(kv, proc + "/net/snmp", "Tcp:RetransSegs", "Tcp:EstabResets", "Tcp:OutRsts")
    read_pairs(kv, proc + "/net/netstat", "TcpExt:ListenOverflows", "TcpExt:ListenDrops", "TcpExt:TCPAbortOnTimeout")
    for name, help_text, key in _TCP:
        fam.add(name, "counter", help_text, "", kv.get(key, ""))


# ports/<p>/counters file -> (metric, help); port_rcv_data / port_xmit_data count 4-byte words (IBTA PortCounters)
_RDMA_COUNTERS = (
    ("port_rcv_packets", "hw_rdma_rx_pkts_total", "RDMA packets received"),
    ("port_xmit_packets", "hw_rdma_tx_pkts_total", "RDMA packets sent"),
    ("port_rcv_errors", "hw_rdma_rx_errors_total", "RDMA packets received with errors"),
    ("port_xmit_discards", "hw_rdma_tx_discards_total", "RDMA outbound packets discarded"),
    ("symbol_error", "hw_rdma_symbol_errors_total", "RDMA link symbol errors"),
    ("link_downed", "hw_rdma_link_downed_total", "RDMA link down events"),
)
_RDMA_HW_BASIC = (
    ("rx_rdma_ucast_bytes", "hw_rdma_rx_bytes_total", "RDMA bytes received"),
    ("tx_rdma_ucast_bytes", "hw_rdma_tx_bytes_total", "RDMA bytes sent"),
    ("rx_rdma_ucast_pkts", "hw_rdma_rx_pkts_total", "RDMA packets received"),
    ("tx_rdma_ucast_pkts", "hw_rdma_tx_pkts_total", "RDMA packets sent"),
)
# hw_counters file -> metric (ionic-style extended counters)
_RDMA_HW = (
    ("tx_rdma_retx_bytes", "hw_rdma_tx_retx_bytes_total"),
    ("tx_rdma_retx_pkts", "hw_rdma_tx_retx_pkts_total"),
    ("tx_rdma_ack_timeout", "hw_rdma_tx_ack_timeout_total"),
    ("rx_rdma_ecn_pkts", "hw_rdma_rx_ecn_pkts_total"),
    ("rx_rdma_cnp_pkts", "hw_rdma_rx_cnp_pkts_total"),
    ("tx_rdma_cnp_pkts", "hw_rdma_tx_cnp_pkts_total"),
    ("req_rx_cqe_err", "hw_rdma_req_rx_cqe_err_total"),
    ("req_tx_retry_excd_err", "hw_rdma_req_tx_retry_excd_err_total"),
    ("tx_rdma_ccl_cts_retx_pkts", "hw_rdma_ccl_tx_retx_pkts_total"),
    ("tx_rdma_ccl_cts_retx_bytes", "hw_rdma_ccl_tx_retx_bytes_total"),
    ("tx_rdma_ccl_cts_ack_timeout", "hw_rdma_ccl_tx_ack_timeout_total"),
    ("tx_rdma_ccl_cts_pkts", "hw_rdma_ccl_tx_pkts_total"),
    ("tx_rdma_ccl_cts_bytes", "hw_rdma_ccl_tx_bytes_total"),
    ("rx_rdma_ccl_cts_pkts", "hw_rdma_ccl_rx_pkts_total"),
    ("rx_rdma_ccl_cts_bytes", "hw_rdma_ccl_rx_bytes_total"),
    ("req_rx_dup_response", "hw_rdma_rx_dup_response_total"),
    ("resp_rx_dup_request", "hw_rdma_rx_dup_request_total"),
)


def _words_times4(fam, path, name, help_text, lbl):
    value = first_word(path)
    if value:
        fam.add(name, "counter", help_text, lbl, str(wrap64(int(value) * 4)) if _INT(value) else "")


def collect_rdma(fam, sys_dir):
    base = sys_dir + "/class/infiniband"
    for dev in listing(base):
        ports = f"{base}/{dev}/ports"
        for port in listing(ports):
            p = f"{ports}/{port}"
            lbl = f',device="{dev}",port="{port}"'
            c, h = p + "/counters", p + "/hw_counters"
            has_h = os.path.isdir(h)
            if os.path.isdir(c):
                _words_times4(fam, c + "/port_rcv_data", "hw_rdma_rx_bytes_total", "RDMA bytes received", lbl)
                _words_times4(fam, c + "/port_xmit_data", "hw_rdma_tx_bytes_total", "RDMA bytes sent", lbl)
                for f, name, help_text in _RDMA_COUNTERS:
                    fam.add(name, "counter", help_text, lbl, first_word(f"{c}/{f}"))
            elif has_h:
                for f, name, help_text in _RDMA_HW_BASIC:
                    fam.add(name, "counter", help_text, lbl, first_word(f"{h}/{f}"))
            if has_h:
                present = set(listing(h))
                for f, name in _RDMA_HW:
                    if f in present:
                        fam.add(name, "counter", f"RDMA hw_counters {f}", lbl, first_word(f"{h}/{f}"))
            state = read_text(p + "/state")
            if state is not None:
                fam.add(
                    "hw_rdma_port_state",
                    "gauge",
                    "RDMA port state (1 = ACTIVE)",
                    lbl,
                    "1" if "ACTIVE" in state.split("\n", 1)[0] else "0",
                )


def _kb_bytes(line, prefix):
    value = line[len(prefix) :].removesuffix(" kB").replace(" ", "")
    return str(wrap64(int(value) * 1024)) if _INT(value) else ""


def collect_sched_mem(fam, proc):
    text = read_text(proc + "/stat")
    if text is not None:
        for line in _lines(text):
            if line.startswith("ctxt "):
                fam.add("hw_context_switches_total", "counter", "Context switches since boot", "", line[5:])
            elif line.startswith("procs_running "):
                fam.add("hw_procs_running", "gauge", "Runnable tasks", "", line[14:])
            elif line.startswith("procs_blocked "):
                fam.add("hw_procs_blocked", "gauge", "Tasks blocked on I/O", "", line[14:])
    text = read_text(proc + "/vmstat")
    if text is not None:
        for line in reversed(_lines(text)):  # oom_kill sits near the end
            if line.startswith("oom_kill "):
                fam.add("hw_oom_kills_total", "counter", "Processes killed by the OOM killer", "", line[9:])
                break
    text = read_text(proc + "/meminfo")
    if text is not None:
        for line in _lines(text):
            if line.startswith("Dirty:"):
                fam.add(
                    "hw_mem_dirty_bytes",
                    "gauge",
                    "Memory waiting to be written back to disk",
                    "",
                    _kb_bytes(line, "Dirty:"),
                )
            elif line.startswith("Writeback:"):
                fam.add(
                    "hw_mem_writeback_bytes",
                    "gauge",
                    "Memory being written back to disk",
                    "",
                    _kb_bytes(line, "Writeback:"),
                )


def collect_psi(fam, proc):
    for res in ("io", "memory"):
        text = read_text(f"{proc}/pressure/{res}")
        if text is None:
            continue
        for line in text.split("\n")[:-1]:  # `while read` leaves out an unterminated last line
            words = line.split(None, 4)
            kind = words[0] if words else ""
            if kind not in ("some", "full"):
                continue
            a10, a300, tot = (words[1:2] or [""])[0], (words[3:4] or [""])[0], (words[4:5] or [""])[0].rstrip()
            fam.add(
                f"hw_{res}_pressure_{kind}_pct",
                "gauge",
                f"Share of time ({kind}) stalled on {res}, 10 s average, percent",
                "",
                a10.removeprefix("avg10="),
            )
            fam.add(
                f"hw_{res}_pressure_{kind}_avg300_pct",
                "gauge",
                f"Share of time ({kind}) stalled on {res}, 300 s average, percent",
                "",
                a300.removeprefix("avg300="),
            )
            fam.add(
                f"hw_{res}_pressure_{kind}_total_us",
                "counter",
                f"Total time ({kind}) stalled on {res}, microseconds",
                "",
                tot.removeprefix("total="),
            )


def collect_kfd(fam, sys_dir):
    n = sum(1 for name in listing(sys_dir + "/class/kfd/kfd/proc") if name[0] in "0123456789")
    fam.add("hw_gpu_user_processes", "gauge", "Processes holding the AMD GPU compute driver (kfd) open", "", str(n))


def collect(host, state=None):
    """One cycle's exposition text."""
    root = os.environ.get("HOST_METRICS_ROOT", "")
    proc, sys_dir = root + "/proc", root + "/sys"
    fam = Families(host)
    collect_netdev(fam, proc)
    collect_tcp(fam, proc)
    collect_rdma(fam, sys_dir)
    collect_sched_mem(fam, proc)
    collect_psi(fam, proc)
    collect_kfd(fam, sys_dir)
    return fam.text()


if __name__ == "__main__":
    if len(sys.argv) < 2 or not sys.argv[1]:
        print("Usage: host_metrics_plugin.py <short hostname>", file=sys.stderr)
        sys.exit(2)
    if sys.argv[1] in ("-h", "--help"):
        print("Usage: host_metrics_plugin.py <short hostname>")
        sys.exit(0)
    sys.stdout.write(collect(sys.argv[1], os.environ.get("_PLUGIN_STATE")))
