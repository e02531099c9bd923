"""Why did a failed run fail? An ordered table of log patterns -> reason.

Order matters: a failing run usually shows several symptoms (an OOM inside a
Python traceback, a coordination timeout that ends in SIGABRT), and the first
matching rule names the root cause. Only meant for runs already known to have
failed; successful runs can contain harmless matches (retried allocations).
"""

import re
import signal
from dataclasses import dataclass

TAIL_BYTES = 4 << 20  # failures show at the end; bounded read for huge logs

_I = re.IGNORECASE | re.MULTILINE
# (reason, pattern); first match wins.
RULES: list[tuple[str, re.Pattern[str]]] = [
    ("time-limit", re.compile(r"CANCELLED AT \S+ DUE TO TIME LIMIT", re.M)),
    ("cancelled", re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT", re.M)),
    ("oom", re.compile(r"RESOURCE_EXHAUSTED|out of memory|OutOfMemory|OUT_OF_MEMORY|oom[-_]kill", _I)),
    (
        "distributed-timeout",
        re.compile(
            r"DEADLINE_EXCEEDED|Barrier timed out|JAX distributed service detected fatal errors"
            r"|coordination service\W.{0,80}(?:unavailable|timed? ?out|failed)",
            _I,
        ),
    ),
    ("unknown-xla-flag", re.compile(r"Unknown flags? in XLA_FLAGS|\bUnknown flag\b", re.M)),
    (
        "collective-error",
        re.compile(
            r"\b[NR]CCL\b.{0,60}\b(?:error|failure|failed)\b|\bnccl(?:System|Internal|Unhandled\w*|Invalid\w*|Remote)Error\b",
            _I,
        ),
    ),
    (
        "config-error",
        re.compile(
            r"MAXTEXT CONFIG ERROR|validation errors? for MaxTextConfig|pydantic_core\._pydantic_core\.ValidationError"
            r"|not in base config",
            re.M,
        ),
    ),
    (
        "killed-by-signal",
        re.compile(
            r"Training subprocess killed by SIG\w+|Fatal Python error: (?:Aborted|Segmentation fault)"
            r"|^\s*(?:\d+: )?Killed\s*$|Segmentation fault|core dumped|received signal SIG\w+",
            re.M,
        ),
    ),
    ("python-exception", re.compile(r"^.*Traceback \(most recent call last\):", re.M)),
]
_EXC_LINE = re.compile(r"^(?:\s*\d+: )?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning))\b", re.M)
_SIGNAME = re.compile(r"SIG[A-Z]+")
CANCEL_EXIT_CODES = (130, 143)  # SIGINT, SIGTERM: Ctrl-C / scancel


@dataclass(frozen=True)
class Failure:
    reason: str
    detail: str = ""
    evidence: str = ""  # the log line that decided it (trimmed)

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


def classify(
    text: str, status: str | None = None, exit_code: int | None = None, has_steps: bool | None = None
) -> Failure:
    """Reason a run failed, from its log text plus what the caller knows."""
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
            sig = _SIGNAME.search(m.group(0))
            detail = sig.group(0) if sig else (_signal_name(exit_code - 128) if exit_code and exit_code > 128 else "")
        elif reason == "python-exception":
            names = _EXC_LINE.findall(text, m.end())
            detail = names[-1].rsplit(".", 1)[-1] if names else ""
        return Failure(reason, detail, evidence)
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
