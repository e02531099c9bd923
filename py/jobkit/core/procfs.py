"""Processes, read from /proc: the Python twin of utils/lib/process.sh.

Everything that finds or stops processes in jobkit goes through here, so it means the same as in the shell:
by PID only (never by name), and a PID counts as "the same process" only while its start time is unchanged.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Stat:
    pid: int
    state: str
    ppid: int
    pgid: int
    start: int  # clock ticks since boot

    @property
    def running(self) -> bool:
        return self.state not in ("Z", "X")


def stat(pid: int) -> Stat | None:
    """The process's /proc/PID/stat fields, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses: the fields start after the last ") ".
    fields = raw[raw.rindex(b")") + 2 :].split()
    return Stat(pid, fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]))


def alive(pid: int, start: int | None = None) -> bool:
    """True while PID runs (not a zombie) and, when START is given, is still the process that had it."""
    found = stat(pid)
    return found is not None and found.running and (start is None or found.start == start)


def pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def cmdline(pid: int) -> list[str]:
    """argv of PID, or [] when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            data = f.read()
    except OSError:
        return []
    return [os.fsdecode(arg) for arg in data.split(b"\0")[:-1]] if data else []


def environ(pid: int) -> dict[str, str] | None:
    """The environment PID started with, or None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    pairs = (item.partition(b"=") for item in data.split(b"\0"))
    return {os.fsdecode(key): os.fsdecode(value) for key, sep, value in pairs if sep and key}


def descendants(root: int) -> list[int]:
    """Every process below ROOT (children, grandchildren, ...), parents before children."""
    children: dict[int, list[int]] = {}
    for pid in pids():
        found = stat(pid)
        if found is not None:
            children.setdefault(found.ppid, []).append(pid)
    result, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(0), []):
            result.append(pid)
            todo.append(pid)
    return result


def stop(targets: Iterable[int], grace: float, group: bool = False) -> list[int]:
    """TERM every PID (with GROUP, the whole group of a PID that leads one), wait up to GRACE seconds, KILL the
    rest, wait up to 5 s more. Returns the PIDs still alive at the end (normally none)."""
    known = {}
    for pid in targets:
        found = stat(pid)
        if found is not None and found.running:
            known[pid] = found
    if not known:
        return []

    def send(sig):
        for pid, found in known.items():
            if not alive(pid, found.start):
                continue
            try:
                if group and found.pgid == pid:
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def wait_gone(seconds):
        deadline = time.monotonic() + seconds
        while True:
            left = [pid for pid, found in known.items() if alive(pid, found.start)]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.1)

    send(signal.SIGTERM)
    if not wait_gone(grace):
        return []
    send(signal.SIGKILL)
    return wait_gone(5)
