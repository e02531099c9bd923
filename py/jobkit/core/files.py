"""Files jobkit writes for the user (reports, pages): whole or not at all, with the mode the umask gives.

A report is read by a browser or a server while it may be rewritten, so it is written to a fresh temp name
beside it and renamed over it. Its mode is what a plain `open(..., "w")` would give under the process's
umask (JOB_UMASK for a job's own files): private by default, a team's when it shares a workspace on purpose.
"""

import os
import tempfile
from pathlib import Path


def current_umask() -> int:
    """This process's umask, read without changing it (os.umask can only be read by setting it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o077)  # no /proc: set and restore (this process writes no other file meanwhile)
    os.umask(old)
    return old


def write_atomic(path: Path, text: str) -> Path:
    """TEXT into PATH: a reader sees the old file or the new one, never half of it; mode 0666 minus the umask."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600, a name nobody else has
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)  # rename is atomic
    except BaseException:
        os.unlink(tmp)
        raise
    return path
