"""Why did a failed run fail? An ordered table of log patterns -> reason.

Order matters: a failing run usually shows several symptoms (an OOM inside a
Python traceback, a coordination timeout that ends in SIGABRT, a GPU fault that
ends in a collective error), and the first matching rule names the root cause.
What Slurm says about the end (time limit, node failure, preemption) comes first,
since those jobs also end as CANCELLED. Only meant for runs already known to have
failed; successful runs can contain harmless matches (retried allocations).
The patterns are written from the messages the vendors and projects print (see
tests/fixtures/failures/, one recorded line per pattern). README has the table.
"""

import re
import signal
from dataclasses import dataclass

TAIL_BYTES = 4 << 20  # failures show at the end; bounded read for huge logs

_I = re.IGNORECASE | re.MULTILINE
# What the scheduler says about how the job ended. Read before anything else, since these jobs also end with
# status CANCELLED (exit 143), which on its own means "someone cancelled it".
SCHEDULER_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("time-limit", re.compile(r"CANCELLED AT \S+ DUE TO TIME LIMIT", re.M)),
    ("node-fail", re.compile(r"CANCELLED AT \S+ DUE TO NODE FAIL|^srun: error: Node failure on \S+", re.M)),
    ("preempted", re.compile(r"CANCELLED AT \S+ DUE TO PREEMPTION", re.M)),
]
# (reason, pattern); first match wins.
# The hang watchdog's own line (py/jobkit/ops/hang_watchdog.py). It stops training with TERM, so the exit code
# alone would read as a cancel; only a job that a person cancelled (status CANCELLED) is not called a hang.
HANG_RULE = ("hang", re.compile(r"^(?:\s*\d+: )?== HANG detected \(phase (\w+)", re.M))
RULES: list[tuple[str, re.Pattern[str]]] = [
    *SCHEDULER_RULES,
    HANG_RULE,
    ("cancelled", re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT", re.M)),
    (
        # The GPU itself failed: ROCm's runtime aborting a queue (HSA_STATUS_ERROR_*), a GPU memory access
        # fault, NVIDIA's Xid events, a GPU that fell off the bus, an uncorrectable ECC error.
        "gpu-hardware",
        re.compile(
            r"\bHSA_STATUS_ERROR_\w+|rocdevice\.cpp.{0,80}aborting|Memory access fault by GPU node"
            r"|\bNVRM: Xid\b|\bXid \(PCI:|fallen off the bus|uncorrectable ECC|ECC error.{0,40}uncorrectable"
            r"|CUDA_ERROR_ECC_UNCORRECTABLE|hipErrorECCNotCorrectable",
            _I,
        ),
    ),
    ("disk-full", re.compile(r"No space left on device|\bENOSPC\b|Disk quota exceeded|\bEDQUOT\b", re.M)),
    ("oom", re.compile(r"RESOURCE_EXHAUSTED|out of memory|OutOfMemory|OUT_OF_MEMORY|oom[-_]kill", _I)),
    (
        "distributed-timeout",
        re.compile(
            r"DEADLINE_EXCEEDED|Barrier timed out|JAX distributed service detected fatal errors"
            r"|coordination service\W.{0,80}(?:unavailable|timed? ?out|failed)"
            r"|stopped sending heartbeats|heartbeat (?:timeout|timed out)|missed heartbeat",
            _I,
        ),
    ),
    ("unknown-xla-flag", re.compile(r"Unknown flags? in XLA_FLAGS|\bUnknown flag\b", re.M)),
    (
        "collective-error",
        re.compile(
            r"\b[NR]CCL\b.{0,60}\b(?:error|failure|failed)\b|\bnccl(?:System|Internal|Unhandled\w*|Invalid\w*|Remote)Error\b"
            r"|NET/IB\w* ?: Got completion from peer .{0,80}(?:status=|with error )[1-9]",
            _I,
        ),
    ),
    (
        "config-error",
        re.compile(
            r"MAXTEXT CONFIG ERROR|validation errors? for MaxTextConfig|pydantic_core\._pydantic_core\.ValidationError"
            r"|not in base config"
            r"|Number of devices(?: per slice)? \d+ does not match the product of the \w+ parallelism"
            r"|^(?:\d+: )?(?:\w+\.)*(?:ValueError|AssertionError): .{0,160}\b(?:parallelism|mesh|devices)\b"
            # The launcher's own refusals before training starts (train_env.sh, _train.sh's _die).
            r"|^(?:\s*\d+: )?(?:\[train_env\] ERROR: |_train\.sh: )",
            re.M,
        ),
    ),
    (
        "killed-by-signal",
        re.compile(
            r"Training subprocess killed by SIG\w+|Fatal Python error: (?:Aborted|Segmentation fault|Bus error"
            r"|Floating-point exception|Illegal instruction)|\[coredump\] training killed by SIG\w+"
            r"|^\s*(?:\d+: )?Killed\s*$|Segmentation fault|core dumped|received signal SIG\w+",
            re.M,
        ),
    ),
    ("python-exception", re.compile(r"^.*Traceback \(most recent call last\):", re.M)),
]
# Where a line names the host at fault: a rank prefix (`1: ...`, srun -l), a JAX task (`/task:1`, the node of
# that process rank: one process per node), or Slurm naming the node.
_RANK_PREFIX = re.compile(r"^\s*(\d+): ")
_JAX_TASK = re.compile(r"/task:(\d+)\b")
_NAMED_NODE = re.compile(r"Node failure on (\S+)|\bNODE_EXIT host=(\S+)")
_EXC_LINE = re.compile(r"^(?:\s*\d+: )?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning))\b", re.M)
_SIGNAME = re.compile(r"SIG[A-Z]+")
# The signal behind a message that does not name it (faulthandler's, the shell's); else the training tier's
# own line (COREDUMP=1), which names it even when the job's exit code is not training's.
_SIGNAL_WORDS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                 "Floating-point exception": "SIGFPE", "Illegal instruction": "SIGILL"}  # fmt: skip
_SIGNAL_WORD = re.compile("|".join(_SIGNAL_WORDS))
_KILLED_BY = re.compile(r"^(?:\s*\d+: )?\[coredump\] training killed by (SIG[A-Z]+)", re.M)
CANCEL_EXIT_CODES = (130, 143)  # SIGINT, SIGTERM: Ctrl-C / scancel


@dataclass(frozen=True)
class Failure:
    reason: str
    detail: str = ""
    evidence: str = ""  # the log line that decided it (trimmed)
    host: str = ""  # the node the log blames, when it names one

    @property
    def label(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


def _line_at(text: str, pos: int, width: int = 200) -> str:
    """The line holding `pos`, cut to `width` chars around the match."""
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    line = text[start : end if end >= 0 else len(text)]
    if len(line) > width:
        left = max(0, min(pos - start - width // 4, len(line) - width))
        line = ("..." if left else "") + line[left : left + width] + "..."
    return line.strip()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def host_in_line(line: str, nodes: list[str] | None = None) -> str | None:
    """The host LINE blames: a node Slurm names, else rank N's or JAX task N's node (the N-th of NODES)."""
    named = _NAMED_NODE.search(line)
    if named:
        return (named.group(1) or named.group(2)).rstrip(".,;")
    for pattern in (_RANK_PREFIX, _JAX_TASK):
        m = pattern.search(line)
        if m and nodes and int(m.group(1)) < len(nodes):
            return nodes[int(m.group(1))]
    return None


def _blamed_host(reason: str, text: str, pos: int, nodes: list[str] | None) -> str:
    """The host at fault for the rule that matched at POS. A coordination error names the silent task on
    the lines after the message, and that task, not the rank that reported it, is at fault; a node failure
    is named by srun anywhere in the log; otherwise the matched line's own host."""
    line = _line_at(text, pos, width=10_000)
    if reason == "distributed-timeout":
        following = text[pos : pos + 2000].split("\n")[:4]
        for candidate in following:
            m = _JAX_TASK.search(candidate)
            if m and nodes and int(m.group(1)) < len(nodes):
                return nodes[int(m.group(1))]
    host = host_in_line(line, nodes)
    if host is None and reason == "node-fail":
        m = re.search(r"^srun: error: Node failure on (\S+)", text, re.M)
        host = m.group(1) if m else None
    return host or ""


def classify(
    text: str,
    status: str | None = None,
    exit_code: int | None = None,
    has_steps: bool | None = None,
    nodes: list[str] | None = None,
) -> Failure:
    """Reason a run failed, from its log text plus what the caller knows. NODES (rank order) lets the
    failure name the host a rank- or task-numbered line blames."""
    early = SCHEDULER_RULES if (status or "").upper() == "CANCELLED" else [*SCHEDULER_RULES, HANG_RULE]
    for reason, pattern in early:
        m = pattern.search(text)
        if m:
            detail = m.group(1) if reason == "hang" else ""
            evidence = _line_at(text, m.start())
            return Failure(reason, detail, evidence, host=_blamed_host(reason, text, m.start(), nodes))
    if (status or "").upper() == "CANCELLED" or exit_code in CANCEL_EXIT_CODES:
        return Failure(
            "cancelled", evidence=f"exit code {exit_code}" if exit_code in CANCEL_EXIT_CODES else f"status {status}"
        )
    for reason, pattern in RULES:
        m = pattern.search(text)
        if m is None:
            if reason == "killed-by-signal" and exit_code is not None and exit_code > 128:
                return Failure(reason, _signal_name(exit_code - 128), f"exit code {exit_code}")
            continue
        evidence = _line_at(text, m.start())
        detail = ""
        if reason == "killed-by-signal":
            sig, word, killed_by = _SIGNAME.search(m.group(0)), _SIGNAL_WORD.search(m.group(0)), _KILLED_BY.search(text)
            if sig:
                detail = sig.group(0)
            elif word:
                detail = _SIGNAL_WORDS[word.group(0)]
            elif killed_by:
                detail = killed_by.group(1)
            elif exit_code and exit_code > 128:
                detail = _signal_name(exit_code - 128)
        elif reason == "hang":
            detail = m.group(1)
        elif reason == "python-exception":
            names = _EXC_LINE.findall(text, m.end())
            detail = names[-1].rsplit(".", 1)[-1] if names else ""
        return Failure(reason, detail, evidence, _blamed_host(reason, text, m.start(), nodes))
    if has_steps is None:
        has_steps = "completed step:" in text
    if not has_steps:
        return Failure("no-steps")
    return Failure("unknown", f"exit {exit_code}" if exit_code is not None else "")


def read_tail(path: str, max_bytes: int = TAIL_BYTES) -> str:
    """The last `max_bytes` of a file as text."""
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        size = fh.tell()
        fh.seek(max(0, size - max_bytes))
        return fh.read().decode("utf-8", errors="replace")
