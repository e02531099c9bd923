"""Core dumps of a job (COREDUMP=1, utils/lib/coredump.sh) for `jobkit why`: where the core is and how to open it.

The training tier logs, per node (with srun's `N: ` prefix under Slurm):

    [coredump] cores go to: <where> (core_pattern ...)          at start: this node's destination for cores
    [coredump] executable: <python>                             the interpreter, for gdb
    [coredump] training killed by SIGSEGV (exit 139) on <host>  after a signal that dumps core
    == CORE DUMP <path> (<size>) ==                             the core it found, or
    == NO CORE DUMP (SIGSEGV) on <host>: cores go to <where>; core limit <n> ==

Cores also count when they only sit in `<job dir>/cores/` (job dir = the log path without `.log`), e.g. a
log cut short. A path logged inside a container (/outputs/...) is looked up in that dir by its name.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

# Signals whose default action is to dump core (signal(7)).
DUMPING_SIGNALS = frozenset(
    {"SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE", "SIGSEGV", "SIGXCPU", "SIGXFSZ", "SIGSYS"}
)
_PREFIX = r"^(?:\s*\d+: )?"
CORE_LINE = re.compile(_PREFIX + r"== CORE DUMP (?P<path>.+) \((?P<size>[^()]*)\) ==[ \t]*$", re.M)
NO_CORE_LINE = re.compile(
    _PREFIX + r"== NO CORE DUMP \((SIG\w+)\) on \S+: cores go to (?P<where>.+?); core limit (?P<limit>\S+) ==", re.M
)
WHERE_LINE = re.compile(_PREFIX + r"\[coredump\] cores go to: (?P<where>.+?)(?: \(core_pattern [^\n]*)?$", re.M)
EXE_LINE = re.compile(_PREFIX + r"\[coredump\] executable: (?P<exe>.+?)[ \t]*$", re.M)
FALLBACK_EXE = "python3"


@dataclass(frozen=True)
class Core:
    path: str
    size: str
    exists: bool


def job_dir_of(log_path: str | Path) -> Path:
    """The job dir of a log: `<workspace>/<job>.log` -> `<workspace>/<job>`; the job dir's `log` link resolves
    to the same."""
    resolved = Path(log_path).resolve()
    return resolved.with_suffix("") if resolved.suffix == ".log" else resolved.parent


def _human(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{size}B"  # unreachable


def cores(text: str, job_dir: Path) -> list[Core]:
    """The cores the log names, then any other core file in the job dir's cores/."""
    found: list[Core] = []
    seen: set[Path] = set()
    for m in CORE_LINE.finditer(text):
        path = Path(m.group("path"))
        local = job_dir / "cores" / path.name
        if not path.is_file() and local.is_file():
            path = local  # logged inside a container (/outputs/...) or on another mount
        found.append(Core(str(path), m.group("size"), path.is_file()))
        seen.add(path.resolve() if path.is_file() else path)
    cores_dir = job_dir / "cores"
    if cores_dir.is_dir():
        for path in sorted(cores_dir.glob("core*")):
            if path.is_file() and path.resolve() not in seen:
                found.append(Core(str(path), _human(path.stat().st_size), True))
    return found


def executable(text: str) -> str:
    m = EXE_LINE.search(text)
    return m.group("exe") if m else FALLBACK_EXE


def where_cores_go(text: str) -> str | None:
    """Where the node sends cores, as the training tier said it (the first node that said so), with the core
    limit when it was 0 (no cores at all)."""
    m = NO_CORE_LINE.search(text)
    if m:
        return m.group("where") + ("; core limit 0, so none are written" if m.group("limit") == "0" else "")
    m = WHERE_LINE.search(text)
    return m.group("where") if m else None


def report(text: str, log_path: str | Path, signal_name: str | None) -> list[str]:
    """Lines for `jobkit why`: each core with the commands to open it; for a death by a signal that dumps core
    and no core, where this job's nodes send cores (or how to keep one next time)."""
    job_dir = job_dir_of(log_path)
    found = cores(text, job_dir)
    lines = []
    exe = executable(text)
    for core in found:
        path = shlex.quote(core.path)
        lines.append(f"  core: {core.path} ({core.size})" + ("" if core.exists else " (not on this machine)"))
        lines.append(f"    native stacks: gdb -batch -ex 'thread apply all bt' {shlex.quote(exe)} {path}")
        lines.append(f"    python stacks: py-spy dump --core {path}")
    if found or signal_name not in DUMPING_SIGNALS:
        return lines
    where = where_cores_go(text)
    if where:
        lines.append(f"  core: none found; cores go to {where}")
    else:
        lines.append(f"  core: none kept (COREDUMP=0); run again with COREDUMP=1 to keep one in {job_dir / 'cores'}/")
    return lines
