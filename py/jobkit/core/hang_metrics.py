"""A hang judged from each host's metrics during the stall (a RAY=1 job's TSDB), as the blog's RCCL hang was.

The reader (observe.hang_tsdb) turns the TSDB's samples into one HostWindow per host: what its GPUs, network and
CPU did from the last progress to the HANG, and, for comparison, in the minutes of training before it. This
module only judges those numbers (it reads nothing), so every caller of failures.classify gets the same verdict:

1. A GPU fault on a host during the stall (an uncorrectable ECC/RAS or fatal PCIe counter that rose, or a GPU
   fault line of the catalogue's gpu-hardware class that the log ties to that host): that host is blamed, and
   the cause is the node's own (retry without it).
2. One host unlike the others: its GPUs idle while every other host's are busy. Training on it stopped using
   its GPUs (a stopped or lost process, a GPU gone), and the others spin waiting for it: blamed, node-local.
   Where no host has GPU metrics (a CPU job), the same reading from the CPU: one host's CPU idle while every
   other host's is busy (the others spin in their collective, the odd one does nothing).
3. Every host's GPUs busy at standby power with (almost) no network traffic: a collective deadlock. The GPUs
   report 100 % busy because the collective kernel spins, but they do no arithmetic (power is what tells), and
   nothing is sent because no rank has anything left to send. Job-wide: no node is blamed or excluded.
4. Anything else is said as numbers and decides nothing.

"Standby" is a GPU's power at most STANDBY_FRACTION of its own level while training (the job's minutes
before the last progress): a card's idle draw differs by model, its own training draw is the yardstick.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BUSY_PERCENT = 90.0  # a GPU this busy or more is "busy" (a spinning collective reads ~100 %)
IDLE_PERCENT = 10.0  # a GPU this busy or less is "idle"
CPU_IDLE_PERCENT = 1.0  # a host's CPU this busy or less did nothing (a stopped or blocked process)
CPU_BUSY_PERCENT = 5.0  # ... while a host this busy or more still runs (spinning, polling)
STANDBY_FRACTION = 0.5  # power at most this fraction of its training level is standby
QUIET_BYTES_S = 1e6  # network below 1 MB/s (rx+tx) is quiet: scrapes and heartbeats, no collective
QUIET_FRACTION = 0.05  # ... or below 5 % of the host's own training rate
SHOWN_HOSTS = 4  # hosts spelled out in the evidence line; the rest are counted


@dataclass(frozen=True)
class HostWindow:
    """One host's metrics in the stall (from the last progress to the HANG) and while training before it."""

    host: str
    gpu_busy: float | None = None  # percent, mean over its GPUs in the stall
    gpu_power: float | None = None  # watts per GPU in the stall
    gpu_power_train: float | None = None  # watts per GPU while training
    net: float | None = None  # bytes/s, rx+tx over its interfaces (IP and RDMA) in the stall
    net_train: float | None = None  # the same while training
    cpu: float | None = None  # percent busy in the stall (Ray's node metric)
    faults: tuple[str, ...] = ()  # GPU faults during the stall, in words

    @property
    def busy(self) -> bool:
        return self.gpu_busy is not None and self.gpu_busy >= BUSY_PERCENT

    @property
    def idle(self) -> bool:
        return self.gpu_busy is not None and self.gpu_busy <= IDLE_PERCENT

    @property
    def standby(self) -> bool | None:
        """GPU power at standby level; None when there is no training level to compare with."""
        if self.gpu_power is None or not self.gpu_power_train:
            return None
        return self.gpu_power <= STANDBY_FRACTION * self.gpu_power_train

    @property
    def quiet(self) -> bool | None:
        """Next to no network traffic; None when the network was not measured."""
        if self.net is None:
            return None
        if self.net_train and self.net_train > QUIET_BYTES_S:
            return self.net <= max(QUIET_BYTES_S, QUIET_FRACTION * self.net_train)
        return self.net <= QUIET_BYTES_S

    def said(self) -> str:
        """`node1 GPU 100% busy at 290 W (905 W training), net 0.0 MB/s (850 MB/s training), CPU 3%`."""
        parts = []
        if self.gpu_busy is not None:
            gpu = f"GPU {self.gpu_busy:.0f}% busy"
            if self.gpu_power is not None:
                gpu += f" at {self.gpu_power:.0f} W"
                if self.gpu_power_train:
                    gpu += f" ({self.gpu_power_train:.0f} W training)"
            parts.append(gpu)
        if self.net is not None:
            net = f"net {self.net / 1e6:.1f} MB/s"
            if self.net_train is not None:
                net += f" ({self.net_train / 1e6:.1f} MB/s training)"
            parts.append(net)
        if self.cpu is not None:
            parts.append(f"CPU {self.cpu:.0f}%")
        parts.extend(f"GPU fault: {f}" for f in self.faults)
        return f"{self.host} " + ", ".join(parts) if parts else f"{self.host} no samples"


@dataclass(frozen=True)
class Window:
    """What the reader found: the stall's bounds (unix seconds) and each host's numbers."""

    start: float
    end: float
    hosts: tuple[HostWindow, ...] = ()
    note: str = ""  # why some of it could not be read


@dataclass(frozen=True)
class HangMetrics:
    """The metrics' verdict: one evidence line and what it adds to the blame."""

    line: str  # the evidence line `why` prints after `metrics:`
    verdict: str  # gpu-fault | odd-host | collective-deadlock | none
    host: str = ""  # the host blamed (gpu-fault, odd-host)
    because: str = ""  # why, in words, for `blamed because` / `blamed`
    node_local: bool = False  # the cause is the host's own: retry without it
    faults: tuple[str, ...] = field(default_factory=tuple)


def _hosts_said(hosts: list[HostWindow]) -> str:
    shown = "; ".join(h.said() for h in hosts[:SHOWN_HOSTS])
    more = len(hosts) - SHOWN_HOSTS
    return shown + (f"; and {more} more host{'s' if more > 1 else ''}" if more > 0 else "")


def _odd_host(odd: HostWindow, hosts: list[HostWindow], because: str, span: str, note: str) -> HangMetrics:
    """The verdict for one host unlike the others (by its GPUs or, on a CPU job, its CPU): blamed, node-local,
    said first in the line."""
    rest = [h for h in hosts if h is not odd]
    return HangMetrics(
        f"{span}{_hosts_said([odd, *rest])}: {odd.host} unlike the others{note}", "odd-host", odd.host, because, True
    )


def judge(window: Window | None, log_faults: dict[str, list[str]] | None = None) -> HangMetrics | None:
    """The verdict of WINDOW's per-host numbers plus the GPU fault lines the log ties to a host (LOG_FAULTS,
    {host: [line, ...]}); None when there is nothing to judge (no window and no fault line)."""
    log_faults = log_faults or {}
    hosts = list(window.hosts) if window else []
    known = {h.host for h in hosts}
    hosts += [HostWindow(host) for host in log_faults if host not in known]
    hosts = [
        HostWindow(**{**h.__dict__, "faults": (*h.faults, *log_faults.get(h.host, ()))}) if h.host in log_faults else h
        for h in hosts
    ]
    span = ""
    if window:
        span = f"{window.end - window.start:.0f} s from the last progress to the HANG: "
    if not hosts:  # a TSDB without a host's sample in the stall (or that could not be read): say so, decide nothing
        return HangMetrics(f"{span}{window.note or 'the TSDB holds no host sample in it'}", "none") if window else None
    note = f" ({window.note})" if window and window.note else ""

    faulty = [h for h in hosts if h.faults]
    if faulty and (len(faulty) < len(hosts) or len(hosts) == 1):
        bad = faulty[0]
        also = f" (also {', '.join(h.host for h in faulty[1:])})" if faulty[1:] else ""
        because = f"metrics: a GPU fault on {bad.host} during the stall: {bad.faults[0]}{also}"
        line = f"{span}{_hosts_said(faulty + [h for h in hosts if not h.faults])}: a GPU fault on {bad.host}{note}"
        return HangMetrics(line, "gpu-fault", bad.host, because, True, bad.faults)
    measured = [h for h in hosts if h.gpu_busy is not None]
    idle = [h for h in measured if h.idle]
    if len(measured) >= 2 and len(idle) == 1 and all(h.busy for h in measured if h is not idle[0]):
        odd = idle[0]
        because = (
            f"metrics: {odd.host}'s GPUs were idle ({odd.gpu_busy:.0f}% busy) while every other host's were busy: "
            f"training there stopped using its GPUs (a stopped or lost process, a GPU gone) and the others wait for it"
        )
        return _odd_host(odd, hosts, because, span, note)
    cpus = [h for h in hosts if h.cpu is not None]
    cpu_idle = [h for h in cpus if h.cpu <= CPU_IDLE_PERCENT]
    if not measured and len(cpus) >= 2 and len(cpu_idle) == 1:
        odd = cpu_idle[0]
        if all(h.cpu >= CPU_BUSY_PERCENT for h in cpus if h is not odd):
            because = (
                f"metrics: {odd.host}'s CPU was idle ({odd.cpu:.0f}%) while every other host's was busy: training "
                f"there did nothing (a stopped or blocked process) and the others wait for it"
            )
            return _odd_host(odd, hosts, because, span, note)
    if measured and len(measured) == len(hosts) and all(h.busy and h.standby and h.quiet for h in hosts) and not faulty:
        because = (
            "metrics: every host's GPUs busy at standby power with no network traffic: a collective deadlock "
            "(each GPU spins in a collective that no rank completes); job-wide, no node is excluded"
        )
        line = f"{span}{_hosts_said(hosts)}: GPUs busy at standby power, no network: a collective deadlock{note}"
        return HangMetrics(line, "collective-deadlock", "", because, False)
    said = "no host stands out, and it does not read as a collective deadlock"
    if faulty:
        said = f"GPU faults on every host ({', '.join(h.host for h in faulty)}): no single node is blamed"
    return HangMetrics(f"{span}{_hosts_said(hosts)}: {said}{note}", "none")
