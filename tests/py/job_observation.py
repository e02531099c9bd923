"""What end-to-end tests observe about a job: its log header, and the processes it left running."""

import re
from pathlib import Path


def header(log_text: str) -> dict[str, str]:
    """The KEY=VALUE lines at the top of a job log."""
    values = {}
    for line in log_text.splitlines():
        m = re.fullmatch(r"([A-Z_]+)=(.*)", line)
        if not m:
            break
        values[m.group(1)] = m.group(2)
    return values


# How the training process shows in /proc/PID/cmdline (arguments are NUL-separated): `... jobkit launch ...`.
TRAINING_CMDLINE = b"jobkit\0launch\0"


def live_processes_of(job_id: str, cmdline_contains: bytes | None = None) -> list[int]:
    """PIDs whose environment carries JOB_ID=<job_id> (every process a job starts inherits it),
    optionally only those whose command line contains CMDLINE_CONTAINS."""
    needle = f"JOB_ID={job_id}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            if cmdline_contains is not None and cmdline_contains not in (proc / "cmdline").read_bytes():
                continue
        except OSError:
            continue
        found.append(int(proc.name))
    return found
