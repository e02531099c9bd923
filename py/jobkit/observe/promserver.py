"""A throwaway Prometheus on an existing TSDB dir: started on 127.0.0.1, waited for, stopped by PID.

Used where a Prometheus must open a TSDB for a moment or for browsing, never for scraping: the backfill's
persist-head step (jobkit.observe.tb_backfill), ``jobkit tsdb view`` (utils/prometheus.sh view) and analyze's
PromQL over a view of a job's TSDB (jobkit.analysis.tsdb_query, private=True: password, no admin API). The per-job
Prometheus that scrapes during a job is the shell's (utils/lib/prometheus.sh).

Start-up failures are told apart from Prometheus's log: a port someone else took in the meantime -> the next
port; the TSDB locked or held by another Prometheus -> "in use"; anything else -> one line with Prometheus's own
error. With admin_api=True (the backfill's snapshot), the admin API is open only behind basic auth with a random
password that lives in this process and a 0600 web config in a private temp dir: loopback is shared by every user
of the node, and the admin API deletes series. A start that fails removes exactly the files and dirs it added to the TSDB (Prometheus creates lock,
queries.active, wal/, chunks_head/ ... before it gives up), so a failed start leaves the TSDB as it found it.
"""

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

from jobkit.core import procfs

NO_TARGETS_CONFIG = (
    "# a throwaway Prometheus (jobkit.observe.promserver): no scrape targets\n"
    "global:\n  scrape_interval: 999h\n  evaluation_interval: 999h\nscrape_configs: []\n"
)
# Retention counts from today: anything shorter would delete an old job's data at start-up.
RETENTION = "10y"


class PromServerError(Exception):
    """A one-line, user-facing error."""


def find_tool(name, given=None, env_var=None):
    """A Prometheus tool (prometheus, promtool): GIVEN, else $ENV_VAR, else PATH, else /usr/bin/NAME (where
    Debian's package puts it); None if none. A GIVEN or $ENV_VAR that is not executable is an error."""
    for candidate in (given, os.environ.get(env_var) if env_var else None):
        if candidate:
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
            raise PromServerError(f"{name} {candidate} is not an executable file; pass a {name} binary")
    found = shutil.which(name)
    if found:
        return found
    return f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None


def find_binary(given=None):
    """The prometheus binary: GIVEN, else $PROMETHEUS_BIN, else PATH, else /usr/bin/prometheus; None if none."""
    return find_tool("prometheus", given, "PROMETHEUS_BIN")


def serving_pid(tsdb):
    """PID of a running Prometheus whose --storage.tsdb.path is TSDB, else None (2.42 keeps no lock file by
    default, so its command line is the only sign)."""
    want = os.path.realpath(tsdb)
    for pid in procfs.pids():
        argv = procfs.cmdline(pid)
        if not argv or os.path.basename(argv[0]) != "prometheus":
            continue
        for i, arg in enumerate(argv):
            if arg.startswith("--storage.tsdb.path="):
                path = arg.split("=", 1)[1]
            elif arg == "--storage.tsdb.path" and i + 1 < len(argv):
                path = argv[i + 1]
            else:
                continue
            if os.path.realpath(os.path.join(f"/proc/{pid}/cwd", path)) == want:
                return pid
    return None


def port_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def kernel_port():
    """A port free right now, chosen by the kernel."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bcrypt_hash(password):
    """PASSWORD's bcrypt hash ($2b$, what Prometheus's web config takes), from the system's libcrypt (libxcrypt
    on current distributions); None where libcrypt has no bcrypt."""
    import ctypes  # here, as urllib below: a backfill imports this module and needs neither (~25 ms)
    import ctypes.util

    name = ctypes.util.find_library("crypt")
    if not name:
        return None
    try:
        lib = ctypes.CDLL(name)
        lib.crypt_gensalt.restype = lib.crypt.restype = ctypes.c_char_p
        lib.crypt_gensalt.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int]
        lib.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        # Cost 2^5: the password is 256 random bits, so the hash's slowness protects nothing; start-up speed does.
        salt = lib.crypt_gensalt(b"$2b$", 5, None, 0)
        hashed = lib.crypt(password.encode(), salt) if salt else None
    except (OSError, AttributeError):
        return None
    return hashed.decode() if hashed and hashed.startswith(b"$2b$") else None


def _admin_web_config(workdir):
    """A web config with one random basic-auth user in WORKDIR (0600); (path, Authorization value), or (None,
    None) where no bcrypt is available."""
    import base64  # here: only the admin API needs them (secrets' hmac and hashlib, ~10 ms of every backfill)
    import secrets

    password = secrets.token_urlsafe(32)
    hashed = bcrypt_hash(password)
    if hashed is None:
        return None, None
    path = os.path.join(workdir, "web.yml")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"basic_auth_users:\n  jobkit: '{hashed}'\n")
    return path, "Basic " + base64.b64encode(f"jobkit:{password}".encode()).decode()


def _ready(port, auth=None):
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/-/ready", headers={"Authorization": auth} if auth else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _tree(root):
    """Every path under ROOT, relative to it."""
    found = set()
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        found.update(os.path.normpath(os.path.join(rel, name)) for name in dirs + files)
    return found


def _remove_added(root, before):
    """Removes the paths under ROOT that are not in BEFORE (a new dir with all it holds)."""
    for rel in sorted(_tree(root) - before):
        path = os.path.join(root, rel)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)


def startup_error(log_text):
    """Prometheus's own reason for exiting at start-up: the err="..." of its last error line."""
    lines = [ln for ln in log_text.splitlines() if "level=error" in ln or "level=fatal" in ln or "err=" in ln]
    if not lines:
        tail = log_text.strip().splitlines()
        return tail[-1] if tail else "no output"
    found = re.search(r'err="((?:[^"\\]|\\.)*)"', lines[-1]) or re.search(r"err=(\S+)", lines[-1])
    return found.group(1) if found else lines[-1]


class Server:
    """A running throwaway Prometheus: pid, port, log path; stop() ends it."""

    def __init__(self, proc, port, log_path, workdir, auth=None):
        self.proc, self.pid, self.port, self.log_path, self._workdir = proc, proc.pid, port, log_path, workdir
        self.auth = auth  # the Authorization header value its requests need (admin_api), else None

    def request(self, path, method="GET"):
        """A urllib Request for PATH on this server, with its credentials."""
        import urllib.request

        return urllib.request.Request(
            self.url + path, method=method, headers={"Authorization": self.auth} if self.auth else {}
        )

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self, grace=20):
        """TERM, up to GRACE s, then KILL (procfs.stop); reaps it; returns its exit status."""
        procfs.stop([self.pid], grace)
        rc = self.proc.wait()
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
        return rc


def start(
    tsdb,
    prometheus,
    first_port=None,
    tries=10,
    extra_args=(),
    ready_timeout=30,
    on_port_taken=None,
    admin_api=False,
    private=False,
):
    """Starts prometheus on TSDB, listening on 127.0.0.1: FIRST_PORT or the next free one of TRIES (None: a
    port the kernel picks, TRIES times). Returns a ready Server; raises PromServerError (TSDB as found).
    PRIVATE (implied by ADMIN_API): every request needs this process's random password, since loopback is
    shared by every user of the node and the TSDB's data may be theirs to read only through us."""
    busy = serving_pid(tsdb)
    if busy:
        raise PromServerError(f"{tsdb} is in use by a running Prometheus (pid {busy}): stop it first")
    workdir = tempfile.mkdtemp(prefix="promserver.")  # config and log; removed by stop()
    log_path = os.path.join(workdir, "prometheus.log")
    config = os.path.join(workdir, "prometheus.yml")
    with open(config, "w") as f:
        f.write(NO_TARGETS_CONFIG)
    auth = None
    if admin_api or private:
        web_config, auth = _admin_web_config(workdir)
        if admin_api:
            extra_args = [*extra_args, "--web.enable-admin-api"]
        if web_config:
            extra_args = [*extra_args, f"--web.config.file={web_config}"]
        elif private:
            shutil.rmtree(workdir, ignore_errors=True)
            raise PromServerError("this system's libcrypt has no bcrypt, so a private Prometheus cannot start")
    before = _tree(tsdb)
    port = first_port
    try:
        for attempt in range(tries):
            if first_port is None:
                port = kernel_port()
            elif attempt:
                port += 1
            if first_port is not None and not port_free(port):
                continue
            server = _launch(tsdb, prometheus, port, config, log_path, extra_args, ready_timeout, workdir, auth)
            if server:
                if first_port is not None and port != first_port and on_port_taken:
                    on_port_taken(first_port, port)
                return server
        last = f"{first_port}-{first_port + tries - 1}" if first_port is not None else f"{tries} tries"
        raise PromServerError(f"no free port for Prometheus on 127.0.0.1 ({last}); free one or pass another port")
    except BaseException:
        _remove_added(tsdb, before)
        shutil.rmtree(workdir, ignore_errors=True)
        raise


def _launch(tsdb, prometheus, port, config, log_path, extra_args, ready_timeout, workdir, auth=None):
    """A ready Server, or None when the port was taken under us; PromServerError for every other failure."""
    mark = os.path.getsize(log_path) if os.path.exists(log_path) else 0
    with open(log_path, "a") as log:
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tsdb}",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--storage.tsdb.retention.time={RETENTION}",
                *extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in a terminal reaches our handler, which stops it in order
        )
    deadline = time.monotonic() + ready_timeout
    while proc.poll() is None:
        if _ready(port, auth):
            return Server(proc, port, log_path, workdir, auth)
        if time.monotonic() >= deadline:
            procfs.stop([proc.pid], 10)
            proc.wait()
            with open(log_path, errors="replace") as f:
                last = startup_error(f.read())
            raise PromServerError(
                f"Prometheus on {tsdb} was not ready after {ready_timeout}s (its last words: {last}); "
                "retry with a longer timeout"
            )
        time.sleep(0.1)
    with open(log_path, errors="replace") as f:
        f.seek(mark)
        text = f.read()
    if "address already in use" in text:
        return None
    if "lock DB directory" in text or "resource temporarily unavailable" in text:
        raise PromServerError(f"{tsdb} is in use by another Prometheus: stop it first")
    raise PromServerError(
        f"Prometheus exited at start-up on {tsdb}: {startup_error(text)} "
        "(a TSDB written by another Prometheus version must be opened with that version)"
    )
