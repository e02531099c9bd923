"""`jobkit dashboard --serve`: the workspace page on 127.0.0.1 only, rebuilt when it is asked for.

The first free port from --port is taken by binding it (a port found free and bound later could be taken in
between). The page is rebuilt on a request for it, at most every REBUILD_EVERY_S, so new jobs show up on
reload; the server also serves the jobs' logs and report.html files the page links to, and nothing else of
the workspace: only regular files of this user's, found inside the workspace once links are resolved.
"""

from __future__ import annotations

import http.server
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

import click

from jobkit.core.errors import JobkitError
from jobkit.core.tunnel import tunnel_hint
from jobkit.ops import jobs

PORT_TRIES = 20
REBUILD_EVERY_S = 2.0  # a burst of reloads (or several tabs) rebuilds the page once


def read_own_file(root: Path, path: Path) -> bytes | None:
    """PATH's bytes when, links resolved, it is a regular file inside ROOT that this user owns; else None.

    A shared workspace is writable by teammates: a link planted there under a job log's name must not make
    this server hand out a file from elsewhere (a key of the user's), nor another user's file."""
    try:
        real = path.resolve(strict=True)
        if not real.is_relative_to(root.resolve()):
            return None
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW)  # a link swapped in after resolve() is refused
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return None
        return fh.read()


def _handler(ws: Path, output: Path, rebuild):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the name http.server calls)
            path = unquote(urlparse(self.path).path)
            if path in ("/", f"/{output.name}"):
                rebuild()
                return self._send(output, "text/html; charset=utf-8", root=output.parent)  # -o may be elsewhere
            # Only what the page links to: a job's log and its report.html. The page's relative links
            # (../<job>.log) resolve to /<job>.log on this server, the same files as on disk.
            parts = [p for p in path.split("/") if p]
            if len(parts) == 1 and jobs.JOB_LOG.match(parts[0]):
                return self._send(ws / parts[0], "text/plain; charset=utf-8")
            if len(parts) == 3 and parts[1:] == ["analysis", "report.html"] and jobs.JOB_LOG.match(parts[0] + ".log"):
                return self._send(ws / parts[0] / "analysis" / "report.html", "text/html; charset=utf-8")
            self.send_error(404)

        def _send(self, path: Path, ctype: str, root: Path = ws):
            data = read_own_file(root, path)
            if data is None:
                return self.send_error(404)
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format, *args):  # noqa: A002 (http.server's signature)
            pass  # one line per request would bury the URL and the tunnel line

    return Handler


def _bind(first: int, handler) -> tuple[http.server.ThreadingHTTPServer, int]:
    # Binding is the check: a port found free and then bound could be taken in between.
    last = min(first + PORT_TRIES, 65536) - 1  # no port above 65535: -p 65535 tries that one alone
    for port in range(first, last + 1):
        try:
            return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler), port
        except OSError:
            continue
    tried = f"port {first} on 127.0.0.1 is" if last == first else f"ports {first}-{last} on 127.0.0.1 are all"
    raise JobkitError("dashboard", f"{tried} taken; pass --port PORT")


def serve_page(ws: Path, output: Path, first_port: int, rebuild_page: Callable[[], str | None]) -> None:
    """Serve OUTPUT (and the logs and reports it links to) until a signal; REBUILD_PAGE() remakes OUTPUT and
    returns None, or a line saying why it could not (then the last page is served)."""
    lock = threading.Lock()
    last = [time.monotonic()]

    def rebuild():
        with lock:
            if time.monotonic() - last[0] < REBUILD_EVERY_S and output.is_file():
                return
            problem = rebuild_page()
            if problem:
                click.echo(
                    f"jobkit dashboard: WARNING: could not rebuild the page ({problem}); serving the last one", err=True
                )
            last[0] = time.monotonic()

    server, port = _bind(first_port, _handler(ws, output, rebuild))
    if port != first_port:
        click.echo(f"jobkit dashboard: port {first_port} was taken; using {port}", err=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    click.echo(
        f"jobkit dashboard for {ws}\n"
        f"  URL:        http://127.0.0.1:{port}/\n"
        f"  from your laptop:  {tunnel_hint(port)}   then open http://localhost:{port}/\n"
        f"  page:       {output} (rebuilt when it is loaded)\n"
        "Ctrl-C stops it."
    )
    sys.stdout.flush()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.shutdown()
        server.server_close()
    click.echo("jobkit dashboard: stopped", err=True)
