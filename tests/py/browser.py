"""Open pages in real headless Chromium from a test: the rendered DOM, console errors, a screenshot.

    from browser import load, open_tab, artifact_path

    page = load(path_or_url, artifact_path(request))   # one shot: navigate, let scripts run, snapshot
    assert not page.errors, page.errors                # console.error, uncaught exceptions, failed loads
    page.count("tr", **{"data-job-id": None})          # elements by tag / class / attribute
    page.rows("jobs")                                   # text of the cells of <table id="jobs">

    with open_tab(path_or_url) as tab:                  # to drive the page: clicks, typing, JS
        tab.click("th[data-key=tgs]")
        tab.type("#filter", "tiny")
        page = tab.snapshot(artifact_path(request, "filtered"))

Chromium is Debian's `chromium` package; ensure_chromium() installs it with the repo's apt helper
(utils/lib/apt_install.sh) when it is missing and it can (root and apt-get), and skips the test only when
it cannot. The browser is driven over the Chrome DevTools Protocol with a minimal WebSocket client from the
standard library, because --dump-dom and --enable-logging cannot tell when scripts are done, do not see
an exception thrown by an inline script reliably, and cannot click; a DevTools client gets every console
message and exception as an event and needs no new Python dependency.

Network: the browser may reach 127.0.0.1 only. Every other host resolves to nothing and any other
address goes through a proxy on a closed loopback port, so a page that pulls a CDN script shows up as a
failed request in page.errors (and page.requests lists every URL the page asked for).

Screenshots go to $JOBKIT_TEST_ARTIFACTS, or tests/.artifacts/ in the repo, named after the test, and
their path is printed so it shows in pytest's output (-s, or the captured stdout of a failure).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlparse

import pytest

REPO = Path(__file__).resolve().parents[2]
APT_HELPER = REPO / "utils" / "lib" / "apt_install.sh"
WIDTH, HEIGHT = 1280, 900
# A full-page screenshot of a very long page is mostly noise and megabytes; cap it.
MAX_SHOT_HEIGHT = 8000


# ---------------------------------------------------------------------------------------------------------
# Finding (installing) Chromium


def ensure_chromium() -> str:
    """Path of Debian's chromium; installs it when missing (root + apt-get), else skips the test."""
    found = _chromium_path()
    if found:
        return found
    if not shutil.which("apt-get") or os.geteuid() != 0:
        pytest.skip("chromium is not installed and cannot be here (needs root and apt-get): apt-get install chromium")
    # The repo's helper refreshes stale package lists and retries once; it prints why when it fails.
    proc = subprocess.run(
        ["bash", "-c", 'source "$1" && apt_install chromium', "bash", str(APT_HELPER)],
        check=False,  # its status is read below, with its message
        capture_output=True,
        text=True,
        timeout=900,
    )
    found = _chromium_path()
    if proc.returncode != 0 or not found:
        # Root with apt-get (as in CI) must be able to install it: that is a failure, not a skip.
        pytest.fail(f"could not install chromium with {APT_HELPER}: {proc.stderr.strip()[-2000:]}")
    return found


def _chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def artifact_dir() -> Path:
    d = Path(os.environ.get("JOBKIT_TEST_ARTIFACTS") or REPO / "tests" / ".artifacts")
    d.mkdir(parents=True, exist_ok=True)
    return d


def artifact_path(request_or_name, suffix: str = "") -> Path:
    """<artifact dir>/<test name>[-suffix].png for a pytest `request` (or a plain name)."""
    name = getattr(getattr(request_or_name, "node", None), "name", None) or str(request_or_name)
    if suffix:
        name = f"{name}-{suffix}"
    return artifact_dir() / (re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") + ".png")


# ---------------------------------------------------------------------------------------------------------
# The rendered page and questions about its DOM


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: str = ""
    children: list[Element] = field(default_factory=list)

    @property
    def classes(self) -> list[str]:
        return (self.attrs.get("class") or "").split()

    def matches(self, tag: str | None = None, cls: str | None = None, **attrs) -> bool:
        """attrs use _ for -, a value of None means "present with any value"."""
        if tag and self.tag != tag:
            return False
        if cls and cls not in self.classes:
            return False
        for key, want in attrs.items():
            key = key.replace("_", "-")
            if key not in self.attrs or (want is not None and self.attrs[key] != str(want)):
                return False
        return True

    def iter(self):
        yield self
        for child in self.children:
            yield from child.iter()

    def find_all(self, tag: str | None = None, cls: str | None = None, **attrs) -> list[Element]:
        return [e for e in self.iter() if e.matches(tag, cls, **attrs)]

    def all_text(self) -> str:
        return " ".join(" ".join(e.text for e in self.iter()).split())


_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _TreeBuilder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        el = Element(tag, {k: (v if v is not None else "") for k, v in attrs})
        self.stack[-1].children.append(el)
        if tag not in _VOID:
            self.stack.append(el)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Element(tag, {k: (v if v is not None else "") for k, v in attrs}))

    def handle_endtag(self, tag):
        # Close up to the matching open tag; a stray end tag (none open) is ignored, as a browser does.
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        self.stack[-1].text += data


def parse_html(html: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    return builder.root


@dataclass
class Page:
    url: str
    html: str  # document.documentElement.outerHTML after the scripts ran
    errors: list[str]  # console.error/assert, uncaught exceptions, failed requests, other error-level logs
    console: list[str]  # every console message, "level: text"
    requests: list[str]  # every URL the page requested
    screenshot: Path | None

    @property
    def dom(self) -> Element:
        if not hasattr(self, "_dom"):
            self._dom = parse_html(self.html)
        return self._dom

    def find_all(self, tag: str | None = None, cls: str | None = None, **attrs) -> list[Element]:
        return self.dom.find_all(tag, cls, **attrs)

    def count(self, tag: str | None = None, cls: str | None = None, **attrs) -> int:
        return len(self.find_all(tag, cls, **attrs))

    def by_id(self, element_id: str) -> Element | None:
        found = self.dom.find_all(id=element_id)
        return found[0] if found else None

    def rows(self, table_id: str | None = None, **attrs) -> list[list[str]]:
        """Text of the cells of each <tr> with a <td> (of the table with that id), optionally filtered by attrs."""
        scope = self.by_id(table_id) if table_id else self.dom
        if scope is None:
            return []
        return [
            [td.all_text() for td in tr.children if td.tag in ("td", "th")]
            for tr in scope.find_all("tr", **attrs)
            if any(td.tag == "td" for td in tr.children)
        ]

    def text(self) -> str:
        body = self.dom.find_all("body")
        return (body[0] if body else self.dom).all_text()


# ---------------------------------------------------------------------------------------------------------
# A minimal WebSocket client (RFC 6455, client side, no extensions) for the DevTools endpoint


class _WebSocket:
    def __init__(self, url: str, timeout: float):
        u = urlparse(url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        # No Origin header: Chromium only checks origins that are sent (--remote-allow-origins otherwise).
        self.sock.sendall(
            (
                f"GET {u.path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("DevTools closed the connection during the WebSocket handshake")
            head += chunk
        head, rest = head.split(b"\r\n\r\n", 1)
        self.buf = bytearray(rest)
        self.parts: list[bytes] = []  # fragments of a message not complete yet
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"DevTools refused the WebSocket: {head.decode(errors='replace')}")

    def _take_frame(self) -> tuple[int, int, bytes] | None:
        """(fin+opcode byte, opcode, payload) of the first complete frame in the buffer, or None."""
        buf = self.buf
        if len(buf) < 2:
            return None
        n, pos = buf[1] & 0x7F, 2
        if n == 126:
            if len(buf) < 4:
                return None
            (n,), pos = struct.unpack_from("!H", buf, 2), 4
        elif n == 127:
            if len(buf) < 10:
                return None
            (n,), pos = struct.unpack_from("!Q", buf, 2), 10
        masked = buf[1] & 0x80
        end = pos + (4 if masked else 0) + n
        if len(buf) < end:
            return None
        payload = bytes(buf[end - n : end])
        if masked:  # servers do not mask; kept for completeness
            mask = buf[pos : pos + 4]
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        b0 = buf[0]
        del buf[:end]
        return b0, b0 & 0x0F, payload

    def _frame(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        # Clients must mask every frame; XOR through an int keeps it fast for large payloads.
        rep = (mask * (n // 4 + 1))[:n]
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes(rep, "big")).to_bytes(n, "big") if n else b""
        self.sock.sendall(head + mask + masked)

    def send(self, text: str) -> None:
        self._frame(0x1, text.encode())

    def recv(self) -> str:
        # Bytes stay in the buffer until a whole frame is there, so a socket timeout loses nothing and the
        # next recv() picks up where this one stopped.
        while True:
            frame = self._take_frame()
            if frame is None:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionError("DevTools closed the connection")
                self.buf += chunk
                continue
            b0, opcode, payload = frame
            if opcode == 0x8:
                raise ConnectionError("DevTools closed the WebSocket")
            if opcode == 0x9:
                self._frame(0xA, payload)
            elif opcode in (0x0, 0x1, 0x2):
                self.parts.append(payload)
                if b0 & 0x80:
                    text = b"".join(self.parts).decode()
                    self.parts = []
                    return text

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._frame(0x8, b"")
        self.sock.close()


# ---------------------------------------------------------------------------------------------------------
# Chromium driven over the DevTools Protocol


class BrowserError(Exception):
    pass


class Tab:
    """One page in a fresh headless Chromium; collects console messages, exceptions and requests as they come."""

    def __init__(self, ws: _WebSocket, session: str, timeout: float):
        self.ws, self.session, self.timeout = ws, session, timeout
        self.next_id = 0
        self.url = ""
        self.errors: list[str] = []
        self.console: list[str] = []
        self.requests: list[str] = []
        self.loaded = False

    # -- protocol ------------------------------------------------------------------------------------------
    def call(self, method: str, params: dict | None = None, timeout: float | None = None) -> dict:
        self.next_id += 1
        msg_id = self.next_id
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params or {}, "sessionId": self.session}))
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            msg = self._next(deadline, method)
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error'].get('message')}")
                return msg.get("result", {})
            self._event(msg)

    def _next(self, deadline: float, what: str) -> dict:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BrowserError(f"Chromium did not answer {what} in time")
        self.ws.sock.settimeout(left)
        try:
            return json.loads(self.ws.recv())
        except TimeoutError as e:
            raise BrowserError(f"Chromium did not answer {what} in time") from e

    def _event(self, msg: dict) -> None:
        method, p = msg.get("method"), msg.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(_remote_text(a) for a in p.get("args", []))
            self.console.append(f"{p.get('type')}: {text}")
            if p.get("type") in ("error", "assert"):
                self.errors.append(f"console.{p.get('type')}: {text}")
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            desc = (d.get("exception") or {}).get("description") or d.get("text", "exception")
            self.errors.append(f"uncaught: {desc.splitlines()[0]} ({d.get('url', '')}:{d.get('lineNumber', '?')})")
        elif method == "Log.entryAdded":
            e = p.get("entry", {})
            self.console.append(f"{e.get('level')}: {e.get('text')}")
            if e.get("level") == "error":
                self.errors.append(f"{e.get('source')}: {e.get('text')} {e.get('url', '')}".strip())
        elif method == "Network.requestWillBeSent":
            self.requests.append(p.get("request", {}).get("url", ""))
        elif method == "Network.loadingFailed" and not p.get("canceled"):
            self.errors.append(f"request failed: {p.get('errorText')} ({p.get('type', '')})")
        elif method == "Page.loadEventFired":
            self.loaded = True

    def wait_events(self, seconds: float) -> None:
        """Let events that are already on their way arrive (timers, late console messages)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                msg = self._next(deadline, "events")
            except BrowserError:
                return
            self._event(msg)

    # -- page ----------------------------------------------------------------------------------------------
    def goto(self, url_or_path) -> None:
        self.url = _to_url(url_or_path)
        self.loaded = False
        nav = self.call("Page.navigate", {"url": self.url})
        if nav.get("errorText"):
            raise BrowserError(f"could not open {self.url}: {nav['errorText']}")
        deadline = time.monotonic() + self.timeout
        while not self.loaded:
            self._event(self._next(deadline, f"the load of {self.url}"))
        self.settle()

    def settle(self) -> None:
        # Two animation frames: layout and whatever the load handlers scheduled have run.
        self.eval("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(1))))")
        self.wait_events(0.05)

    def eval(self, expression: str):
        """Value of a JS expression (promises awaited); a JS exception is raised as BrowserError."""
        res = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True})
        if "exceptionDetails" in res:
            d = res["exceptionDetails"]
            raise BrowserError(f"{expression[:60]}: {(d.get('exception') or {}).get('description') or d.get('text')}")
        return res.get("result", {}).get("value")

    def click(self, selector: str) -> None:
        """A real mouse click in the middle of the element (scrolled into view)."""
        box = self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        if box is None:
            raise BrowserError(f"no element matches {selector}")
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})
        self.settle()

    def type(self, selector: str, text: str, clear: bool = True) -> None:
        """Focus the field and type text as keystrokes, so the page's input handlers fire."""
        reset = "e.value = '';" if clear else ""
        ok = self.eval(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return false;"
            f" e.focus(); {reset} return true; }})()"
        )
        if not ok:
            raise BrowserError(f"no element matches {selector}")
        self.call("Input.insertText", {"text": text})
        self.settle()

    def visible(self, selector: str) -> list[dict]:
        """Attributes of the elements matching selector that are rendered (not display:none)."""
        return self.eval(
            f"Array.from(document.querySelectorAll({json.dumps(selector)}))"
            ".filter(e => e.getClientRects().length > 0)"
            ".map(e => Object.fromEntries(Array.from(e.attributes).map(a => [a.name, a.value])))"
        )

    def screenshot(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        size = self.call("Page.getLayoutMetrics").get("cssContentSize") or {}
        width = max(WIDTH, int(size.get("width", WIDTH)))
        height = min(MAX_SHOT_HEIGHT, max(HEIGHT, int(size.get("height", HEIGHT))))
        shot = self.call(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
            },
        )
        path.write_bytes(base64.b64decode(shot["data"]))
        print(f"screenshot: {path}")
        return path

    def snapshot(self, screenshot_path=None) -> Page:
        self.wait_events(0.05)
        html = self.eval("document.documentElement.outerHTML")
        shot = self.screenshot(screenshot_path) if screenshot_path else None
        return Page(self.url, html, list(self.errors), list(self.console), list(self.requests), shot)


def _remote_text(obj: dict) -> str:
    if "value" in obj:
        return str(obj["value"])
    return obj.get("description") or obj.get("unserializableValue") or obj.get("type", "")


def _to_url(url_or_path) -> str:
    s = str(url_or_path)
    if re.match(r"^[a-z]+:", s):
        return s
    return Path(s).resolve().as_uri()


@contextlib.contextmanager
def open_tab(url_or_path=None, timeout: float = 30.0):
    """A fresh headless Chromium (throwaway profile) with one tab, stopped (by its PID) on exit."""
    binary = ensure_chromium()
    with tempfile.TemporaryDirectory(prefix="jobkit-chromium-") as tmp:
        profile = Path(tmp) / "profile"
        args = [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--window-size={WIDTH},{HEIGHT}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--hide-scrollbars",
            "--mute-audio",
            # Nothing but loopback: names other than localhost do not resolve, and any other address goes
            # to a proxy on a port where nothing listens (loopback bypasses proxies implicitly).
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
            "--proxy-server=http://127.0.0.1:9",
            "about:blank",
        ]
        # Own session: the Debian wrapper execs the real binary, whose helpers (renderer, GPU, zygote)
        # are stopped with it through the process group this test created and nothing else.
        # stderr to a file, not a pipe: nobody reads a pipe while the test runs, and a full one blocks Chromium.
        with open(Path(tmp) / "stderr.log", "w+") as err:
            proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        ws = None
        try:
            ws = _connect(proc, profile, Path(tmp) / "stderr.log", timeout)
            tab = _attach(ws, timeout)
            if url_or_path is not None:
                tab.goto(url_or_path)
            yield tab
        finally:
            if ws is not None:
                ws.close()
            _stop(proc)


def _connect(proc: subprocess.Popen, profile: Path, stderr_log: Path, timeout: float) -> _WebSocket:
    # Chromium writes the port it picked and the browser endpoint's path to DevToolsActivePort.
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BrowserError(f"chromium exited with status {proc.returncode}: {stderr_log.read_text()[-2000:]}")
        lines = port_file.read_text().split() if port_file.exists() else []
        if len(lines) >= 2:
            return _WebSocket(f"ws://127.0.0.1:{lines[0]}{lines[1]}", timeout)
        time.sleep(0.05)
    raise BrowserError("chromium did not open its DevTools port in time")


def _attach(ws: _WebSocket, timeout: float) -> Tab:
    targets = _browser_call(ws, "Target.getTargets", {})["targetInfos"]
    page_id = next((t["targetId"] for t in targets if t["type"] == "page"), None)
    if page_id is None:
        page_id = _browser_call(ws, "Target.createTarget", {"url": "about:blank"})["targetId"]
    session = _browser_call(ws, "Target.attachToTarget", {"targetId": page_id, "flatten": True})["sessionId"]
    tab = Tab(ws, session, timeout)
    tab.next_id = 1_000_000  # above the browser-level ids on the same connection
    for domain in ("Page", "Runtime", "Log", "Network"):
        tab.call(f"{domain}.enable")
    tab.call(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
    )
    return tab


def _browser_call(ws: _WebSocket, method: str, params: dict) -> dict:
    msg_id = next(_BROWSER_IDS)
    ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
    while True:
        msg = json.loads(ws.recv())
        if msg.get("id") == msg_id:
            if "error" in msg:
                raise BrowserError(f"{method}: {msg['error'].get('message')}")
            return msg["result"]


_BROWSER_IDS = itertools.count(1)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(timeout=10)


def load(url_or_path, screenshot_path=None, timeout: float = 30.0) -> Page:
    """Open the page in headless Chromium, let its scripts run, return the DOM, errors and a screenshot."""
    with open_tab(url_or_path, timeout=timeout) as tab:
        return tab.snapshot(screenshot_path)
