"""The ssh command a user runs on a laptop to reach a dashboard that listens on this host's loopback."""

import getpass
import os
import socket


def tunnel_hint(port: int) -> str:
    """`ssh -N -L PORT:127.0.0.1:PORT user@host`: PORT on this host's 127.0.0.1 as the same port on a laptop."""
    host = socket.getfqdn() or socket.gethostname()
    user = os.environ.get("USER") or getpass.getuser()
    return f"ssh -N -L {port}:127.0.0.1:{port} {user}@{host}"
