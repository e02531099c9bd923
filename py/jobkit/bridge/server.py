"""The bridge server: serves requests that arrive as files in <bridge dir>/<node>/requests/.

Who may talk: the server's own user only. Its dirs are created 0700 and checked on every pass (a dir that
changed owner or mode stops the server); a request is refused, and removed, when its name is not
`<id>.json` with an id of [A-Za-z0-9_-]{1,64}, when it is a symlink, not a regular file, another uid's, a hard
link, or bigger than limits.request_bytes, and when its id was seen before (a replay).

Exactly once: a request is taken by renaming it into taken/ before anything runs, and its id is recorded in
`ids`; the result is written (atomically) to results/<id>.json and only then is the taken file removed. A
server that dies mid-command leaves the taken file: the next start reports that request `lost` and never
runs it again. Every request is one line in `audit.log` (JSON: time, node, id, cwd, command, verdict, rule);
a lost one gets its `lost` line when it is found. Results are removed after limits.keep_results_hours.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

from jobkit.bridge import runner
from jobkit.bridge.pin import Pin
from jobkit.bridge.policy import Context, Policy, decide
from jobkit.bridge.shellwords import Refused
from jobkit.core.files import open_append, write_atomic

ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
TEMP = re.compile(r"\.[A-Za-z0-9_-]{1,64}\.tmp")  # utils/host_cmd.py writes here, then renames to <id>.json
REQUEST_KEYS = {"version", "id", "command", "cwd", "timeout", "roots", "ping"}
POLL_S = 0.02
MAX_PARALLEL = 8
NODES_TTL_S = 60.0


class BridgeError(Exception):
    """The server cannot start or go on: the message names the dir or file and the fix."""


def node_name() -> str:
    name = os.environ.get("BRIDGE_NODE") or socket.gethostname().split(".")[0]
    if not ID.fullmatch(name):
        raise BridgeError(f"node name {name!r} is not [A-Za-z0-9_-]{{1,64}}; set BRIDGE_NODE to one that is")
    return name


def bridge_root(workspace: Path) -> Path:
    return Path(os.environ.get("BRIDGE_DIR") or workspace / ".bridge")


def _own_private_dir(path: Path, create: bool) -> None:
    """PATH is a real dir of this uid with mode 0700 (created so, or tightened if ours); BridgeError if not."""
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise BridgeError(f"{path} is not a directory of this user (uid {os.getuid()}); remove it or set BRIDGE_DIR")
    if st.st_mode & 0o077:
        if not create:
            raise BridgeError(f"{path} became mode {st.st_mode & 0o777:o}; the server stops (restart it)")
        os.chmod(path, 0o700)


class Server:
    def __init__(self, root: Path, node: str, policy: Policy, repo: Path, workspace: Path, env: dict | None = None):
        self.root, self.node, self.policy = root, node, policy
        self.repo, self.workspace = repo.resolve(), workspace.resolve()
        self.dir = root / node
        self.requests, self.taken, self.results = self.dir / "requests", self.dir / "taken", self.dir / "results"
        base = dict(os.environ if env is None else env)
        self.env = {k: base[k] for k in policy.pass_env if k in base}
        self.env["PATH"] = base.get("PATH", "/usr/bin:/bin")
        self.env.setdefault("JOB_WORKSPACE", str(self.workspace))
        self.seen: set[str] = set()
        self.ignored: set[str] = set()
        self.active: dict[str, threading.Thread] = {}
        self.lock = threading.Lock()
        self._nodes: tuple[float, set[str]] = (0.0, set())
        self._lock_fd: int | None = None
        self.pin: Pin | None = None

    # --- starting ---------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Dirs, the one-server lock, the ids seen so far, and the requests a dead server left taken: lost."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        _own_private_dir(self.root, create=True)
        _own_private_dir(self.dir, create=True)
        for d in (self.requests, self.taken, self.results):
            _own_private_dir(d, create=True)
        self._lock_fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise BridgeError(f"a bridge server already serves {self.dir}; `jobkit bridge status` says which") from None
        try:
            with open(self.dir / "ids", encoding="ascii", errors="replace") as fh:
                self.seen = {line.strip() for line in fh}
        except FileNotFoundError:
            pass
        for name in sorted(os.listdir(self.taken)):
            rid = name.removesuffix(".json")
            self._remember(rid)
            self._result(rid, {"status": "lost", "exit_code": None,
                               "reason": "the bridge server stopped while this request ran; it was not run again"})  # fmt: skip
            self._audit(rid, "", "", "lost", "crash", "server stopped mid-command; not rerun")
            os.unlink(self.taken / name)
        self.pin = Pin(self.repo)
        info = {"pid": os.getpid(), "node": self.node, "host": socket.gethostname(), "started": time.time(),
                "policy": self.policy.files, "repo": str(self.repo), "workspace": str(self.workspace)}  # fmt: skip
        write_atomic(self.dir / "server.json", json.dumps(info) + "\n", 0o600)
        self.cleanup()

    # --- the loop ---------------------------------------------------------------------------------------
    def serve(self, stop: threading.Event) -> None:
        last_cleanup = time.monotonic()
        while not stop.is_set():
            self.check_dirs()
            if not self.serve_once():
                stop.wait(POLL_S)
            if time.monotonic() - last_cleanup > 60:
                self.cleanup()
                last_cleanup = time.monotonic()
        for thread in list(self.active.values()):
            thread.join()

    def check_dirs(self) -> None:
        for d in (self.root, self.dir, self.requests, self.taken, self.results):
            _own_private_dir(d, create=False)

    def serve_once(self, wait: bool = False) -> int:
        """Takes every pending request (at most MAX_PARALLEL running); WAIT: until they are done (tests)."""
        count = 0
        for name in sorted(os.listdir(self.requests)):
            if TEMP.fullmatch(name) or name in self.ignored:
                continue  # a client's temp file, renamed into place when whole
            if len(self.active) >= MAX_PARALLEL:
                break
            count += 1
            self._intake(name)
        if wait:
            for thread in list(self.active.values()):
                thread.join()
        return count

    # --- one request ------------------------------------------------------------------------------------
    def _refuse_file(self, name: str, rid: str, rule: str, reason: str, result: bool = True) -> None:
        self._audit(rid, "", "", "refused", rule, reason)
        path = self.requests / name
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError:
            self.ignored.add(name)  # cannot remove it: never look at it again (one audit line)
        if result and ID.fullmatch(rid) and rid not in self.seen:
            self._remember(rid)
            self._result(rid, {"status": "refused", "exit_code": None, "rule": rule, "reason": reason,
                               "ask": "write the request with utils/host_cmd.py, as the server's user"})  # fmt: skip

    def _intake(self, name: str) -> None:
        rid = name.removesuffix(".json")
        if not name.endswith(".json") or not ID.fullmatch(rid):
            return self._refuse_file(
                name, name[:80], "request-id", "request name is not <id>.json with [A-Za-z0-9_-]{1,64}"
            )
        try:
            st = os.lstat(self.requests / name)
        except FileNotFoundError:
            return None
        problem = None
        if stat.S_ISLNK(st.st_mode):
            problem = ("request-symlink", "the request is a symlink")
        elif not stat.S_ISREG(st.st_mode):
            problem = ("request-type", "the request is not a regular file")
        elif st.st_uid != os.getuid():
            problem = ("request-owner", f"the request belongs to uid {st.st_uid}, not the server's ({os.getuid()})")
        elif st.st_nlink != 1:
            problem = ("request-owner", "the request is a hard link to another file")
        elif st.st_size > self.policy.limits["request_bytes"]:
            problem = ("request-size", f"the request is {st.st_size} bytes, over {self.policy.limits['request_bytes']}")
        elif rid in self.seen:
            return self._refuse_file(name, rid, "replay", "this id was used before; a request id is used once", False)
        if problem:
            return self._refuse_file(name, rid, *problem)
        try:
            os.rename(self.requests / name, self.taken / name)  # taken: from here on it never runs twice
        except FileNotFoundError:
            return None
        self._remember(rid)
        try:
            request = self._read_taken(name, rid)
        except Refused as exc:
            self._audit(rid, "", "", "refused", exc.rule, str(exc))
            self._result(
                rid, {"status": "refused", "exit_code": None, "rule": exc.rule, "reason": str(exc), "ask": exc.ask}
            )
            os.unlink(self.taken / name)
            return None
        thread = threading.Thread(target=self._handle, args=(name, rid, request), daemon=True)
        with self.lock:
            self.active[rid] = thread
        thread.start()
        return None

    def _read_taken(self, name: str, rid: str) -> dict:
        bad = "write requests with utils/host_cmd.py"
        try:
            fd = os.open(self.taken / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            raise Refused("request-symlink" if exc.errno == errno.ELOOP else "request-type", str(exc), bad) from None
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_nlink != 1:
                raise Refused("request-owner", "the request changed between its check and its reading", bad)
            raw = fh.read(self.policy.limits["request_bytes"] + 1)
        if len(raw) > self.policy.limits["request_bytes"]:
            raise Refused("request-size", f"the request is over {self.policy.limits['request_bytes']} bytes", bad)
        try:
            request = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise Refused("request-malformed", "the request is not UTF-8 JSON", bad) from None
        if not isinstance(request, dict) or set(request) - REQUEST_KEYS or request.get("id") != rid:
            raise Refused(
                "request-malformed", f"the request is not an object of {sorted(REQUEST_KEYS)} with id {rid}", bad
            )
        checks = {"command": str, "cwd": str, "timeout": (int, float), "roots": dict, "ping": bool, "version": int}
        for key, kind in checks.items():
            if key in request and request[key] is not None and not isinstance(request[key], kind):
                raise Refused("request-malformed", f"request field {key!r} has the wrong type", bad)
        if not request.get("ping") and not isinstance(request.get("command"), str):
            raise Refused("request-malformed", "the request has no command", bad)
        timeout = request.get("timeout", 300)
        if timeout is not None and not (0 < timeout < 1e9):
            raise Refused("request-malformed", f"timeout {timeout!r} is not a positive number of seconds", bad)
        roots = request.get("roots") or {}
        if set(roots) - {"repo", "workspace"} or not all(
            isinstance(v, str) and v.startswith("/") for v in roots.values()
        ):
            raise Refused("request-malformed", "roots must be {repo, workspace} absolute paths", bad)
        return request

    def _translate(self, roots: dict):
        pairs = [(roots[k].rstrip("/") or "/", str(h)) for k, h in (("repo", self.repo), ("workspace", self.workspace))
                 if k in roots]  # fmt: skip
        pairs.sort(key=lambda p: -len(p[0]))  # the longer prefix first (a workspace inside the repo)

        def translate(path: str) -> str:
            for theirs, ours in pairs:
                if path == theirs or path.startswith(theirs + "/"):
                    return ours + path[len(theirs) :]
            return path

        return translate

    def _handle(self, name: str, rid: str, request: dict) -> None:
        try:
            self._decide_and_run(rid, request)
        finally:
            try:
                os.unlink(self.taken / name)
            except FileNotFoundError:
                pass
            with self.lock:
                self.active.pop(rid, None)

    def _decide_and_run(self, rid: str, request: dict) -> None:
        command = request.get("command") or ""
        cwd_given = request.get("cwd") or str(self.repo)
        if request.get("ping"):
            self._audit(rid, cwd_given, "", "ping", "", "")
            return self._result(rid, {"status": "alive", "exit_code": 0, "stdout": "ALIVE\n", "node": self.node})
        translate = self._translate(request.get("roots") or {})
        started = time.time()
        try:
            cwd = Path(os.path.realpath(translate(cwd_given)))
            denied = any(f"/{d.strip('/')}/" in f"{cwd}/" for d in self.policy.deny_paths)
            if denied or not any(cwd == r or r in cwd.parents for r in (self.repo, self.workspace)) or not cwd.is_dir():
                raise Refused("cwd", f"--cwd {cwd_given}: not a directory under the repository or the workspace",
                              "run from the repository or $JOB_WORKSPACE (or a directory under them)")  # fmt: skip
            ctx = Context(self.repo, self.workspace, cwd, self.nodes, self.which, translate)
            plan = decide(self.policy, command, ctx)
            if any(step.repo_program for _, steps in plan.pipelines for step in steps) and self.pin:
                changed = self.pin.changed()
                if changed:
                    raise Refused("code-changed", f"{changed} changed since the bridge server started",
                                  "ask the person to review the change and restart `jobkit bridge serve`")  # fmt: skip
        except Refused as exc:
            self._audit(rid, cwd_given, command, "refused", exc.rule, str(exc))
            return self._result(rid, {"status": "refused", "exit_code": None, "rule": exc.rule, "reason": str(exc),
                                      "ask": exc.ask, "started": started, "ended": time.time()})  # fmt: skip
        self._audit(rid, cwd_given, command, "allowed", "", "")
        timeout = min(float(request.get("timeout") or 300), self.policy.limits["timeout_max_s"])
        out = runner.run(plan, str(cwd), self.env, timeout, self.policy.limits["output_bytes"])
        return self._result(rid, {
            "status": "timeout" if out.timed_out else "done", "exit_code": out.exit_code,
            "stdout": out.stdout, "stderr": out.stderr, "stdout_cut": out.stdout_cut, "stderr_cut": out.stderr_cut,
            "started": out.started, "ended": out.ended, "timeout": timeout,
        })  # fmt: skip

    # --- helpers ----------------------------------------------------------------------------------------
    def which(self, name: str) -> str | None:
        return shutil.which(name, path=self.env["PATH"])

    def nodes(self) -> set[str]:
        """This cluster's node names (sinfo), asked at most once a minute."""
        when, names = self._nodes
        if time.monotonic() - when < NODES_TTL_S and names:
            return names
        sinfo = self.which("sinfo")
        names = set()
        if sinfo:
            try:
                out = subprocess.run([sinfo, "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=20,
                                     env=self.env).stdout  # fmt: skip
                names = {line.strip() for line in out.splitlines() if line.strip()}
            except (OSError, subprocess.SubprocessError):
                pass
        self._nodes = (time.monotonic(), names)
        return names

    def _remember(self, rid: str) -> None:
        self.seen.add(rid)
        fd = open_append(self.dir / "ids")
        try:
            os.write(fd, f"{rid}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _result(self, rid: str, result: dict) -> None:
        result = {"id": rid, "node": self.node, **result}
        write_atomic(self.results / f"{rid}.json", json.dumps(result) + "\n", 0o600)

    def _audit(self, rid: str, cwd: str, command: str, verdict: str, rule: str, reason: str) -> None:
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "node": self.node, "id": rid, "cwd": cwd,
                "command": command[:1000], "verdict": verdict, "rule": rule, "reason": reason}  # fmt: skip
        with self.lock:
            fd = open_append(self.dir / "audit.log")
            try:
                os.write(fd, (json.dumps(line) + "\n").encode())
            finally:
                os.close(fd)

    def cleanup(self) -> int:
        """Removes results older than keep_results_hours and client temp files older than an hour."""
        now, removed = time.time(), 0
        keep = self.policy.limits["keep_results_hours"] * 3600
        for d, age in ((self.results, keep), (self.requests, 3600)):
            for entry in os.scandir(d):
                if d == self.requests and not TEMP.fullmatch(entry.name):
                    continue
                try:
                    if now - entry.stat(follow_symlinks=False).st_mtime > age:
                        os.unlink(entry.path)
                        removed += 1
                except OSError:
                    pass
        return removed
