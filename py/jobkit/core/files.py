"""Files jobkit writes and trusts in a workspace that others may write to: the one place for how.

Writing. A file that is replaced (a report, a state file, a marker) is written to a fresh temp name beside it
(mkstemp: O_CREAT|O_EXCL, a name nobody could have planted) and renamed over it, so a reader sees the old file
or the new one, and a symlink planted at the target's name is replaced, never followed. A file that is
appended to (a daemon's log) is opened with O_NOFOLLOW. Modes are what a plain `open(..., "w")` would give
under the process's umask (JOB_UMASK for a job's own files): private by default, a team's when it shares a
workspace on purpose.

Trusting. In a team workspace (group-writable) a teammate can plant any name. A file whose mere presence or
content steers a job (the hang watchdog's markers) is believed only when `read_own` finds it a regular file of
this uid with one link (no symlink: O_NOFOLLOW; no hard link to one of our files), and, where it asks, in a dir
of this uid that nobody else can write (`own_dir`). Anything else raises Untrusted, whose message says why.
"""

import os
import stat
import tempfile
from pathlib import Path


class Untrusted(Exception):
    """A file or dir that is not this user's own (planted by someone else): the message says which and why."""


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


def write_atomic(path: Path | str, text: str | bytes, mode: int = 0o666) -> Path:
    """TEXT into PATH: a reader sees the old file or the new one, never half of it; MODE minus the umask.
    A symlink planted at PATH (or at any temp name) is replaced, not followed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600, a name nobody else has
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8") if isinstance(text, str) else text)
        os.chmod(tmp, mode & ~current_umask())
        os.replace(tmp, path)  # rename is atomic
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def open_append(path: Path, mode: int = 0o600) -> int:
    """A descriptor appending to PATH (created with MODE minus the umask); a symlink at PATH is refused
    (OSError ELOOP), not followed to a file of the caller's."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, mode)


def own_dir(path: Path) -> None:
    """Raises Untrusted unless PATH is a real dir (no symlink) of this uid that group and others cannot write;
    FileNotFoundError when it is absent."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise Untrusted(f"{path} is not a directory (a {'symlink' if stat.S_ISLNK(st.st_mode) else 'file'})")
    if st.st_uid != os.getuid():
        raise Untrusted(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})")
    if st.st_mode & 0o022:
        raise Untrusted(f"{path} is writable by group or others (mode {st.st_mode & 0o777:o})")


def make_own_dir(path: Path) -> Path:
    """PATH as a dir of this user that only this user can write (created 0755 minus the umask if absent);
    Untrusted when it already exists as someone else's, a symlink, or writable by others."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    own_dir(path)
    return path


def read_own(path: Path, *, in_own_dir: bool = False, private: bool = False, limit: int = 1 << 20) -> str:
    """The text of PATH when it is a regular file of this uid with one link, opened without following a
    symlink; PRIVATE: group and others must not be able to write it either; IN_OWN_DIR: its dir must also
    pass own_dir. FileNotFoundError when absent, Untrusted otherwise."""
    path = Path(path)
    if in_own_dir:
        own_dir(path.parent)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # NONBLOCK: a planted fifo cannot hang us
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        if os.path.islink(path):
            raise Untrusted(f"{path} is a symlink") from None
        raise Untrusted(f"{path} cannot be opened ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(f"{path} is not a regular file")
        if st.st_uid != os.getuid():
            raise Untrusted(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})")
        if private and st.st_mode & 0o022:
            raise Untrusted(f"{path} is writable by group or others (mode {st.st_mode & 0o777:o})")
        if st.st_nlink != 1:
            raise Untrusted(f"{path} has {st.st_nlink} links (a hard link to another file)")
        return fh.read(limit).decode("utf-8", errors="replace")
