"""The code the bridge would run for this repository's own programs (submit.sh, utils/, jobkit), pinned when
the server starts: a request for one of them is refused once any of that code changed, since an agent that can
write the checkout could otherwise edit a script and have the bridge run it on the host.

The pin is a snapshot of stat() (size, mtime, inode) of every code file the launchers and jobkit run on the
host, and of the names in their directories (a new file there, a sourced `*.local.sh`, shows too). Checking
it is a few hundred stat() calls: milliseconds, done per request that runs a repository program.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

CODE_SUFFIXES = (".sh", ".py", ".sbatch", ".bash")
# what runs on the host for submit.sh / jobkit / utils: not tests/, bench/, skills/ (an agent may edit those)
CODE_DIRS = ("utils", "py/jobkit", "configs")
EXTRA = (".venv/bin/jobkit", ".venv/bin/python", ".venv/pyvenv.cfg")


def _code_files(repo: Path) -> list[str]:
    try:
        listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True,
                                timeout=30).stdout.decode().split("\0")  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        listed = [str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts]
    keep = []
    for name in filter(None, listed):
        top = "/" not in name
        if (top or name.startswith(tuple(f"{d}/" for d in CODE_DIRS))) and name.endswith(CODE_SUFFIXES):
            keep.append(name)
    return sorted(keep) + list(EXTRA)


def _stat(path: Path) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode)


class Pin:
    def __init__(self, repo: Path):
        self.repo = repo
        self.files = _code_files(repo)
        self.dirs = sorted({os.path.dirname(f) for f in self.files if not f.startswith(".venv")})
        self.snapshot = self._take()

    def _take(self) -> dict[str, object]:
        snap: dict[str, object] = {f: _stat(self.repo / f) for f in self.files}
        for d in self.dirs:
            try:
                names = sorted(n for n in os.listdir(self.repo / d) if n.endswith(CODE_SUFFIXES))
            except OSError:
                names = None
            snap[f"{d or '.'}/"] = names
        return snap

    def changed(self) -> str | None:
        """The first file (or dir whose code files came or went) that differs from the pin; None if none."""
        now = self._take()
        for key, value in now.items():
            if self.snapshot.get(key) != value:
                return key
        return None
