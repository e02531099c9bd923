"""A real HTTP receiver on 127.0.0.1 for notification tests: apprise's `json://` target posts here.

with Receiver() as hook:
    send(..., Targets([hook.url], "test"))
    assert hook.wait(1)[0]["message"] == "..."
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, status: int = 200):
        self.status = status  # what the receiver answers: 500 makes apprise report a failed delivery
        self.posts: list[dict] = []
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.paths.append(self.path)
                outer.posts.append(json.loads(body or b"{}"))
                self.send_response(outer.status)
                self.end_headers()

            def log_message(self, *args):  # keep pytest's output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"json://127.0.0.1:{self.port}/hook"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def wait(self, count: int, timeout: float = 20) -> list[dict]:
        """The posts, once there are at least COUNT (or what came by the deadline)."""
        deadline = time.monotonic() + timeout
        while len(self.posts) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return list(self.posts)
