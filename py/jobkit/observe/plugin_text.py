"""Text helpers shared by the Python exporter plugins (utils/plugins/*_metrics_plugin.py): the exposition text
they print, and the reads of /proc and /sys they make the way their bash forerunners did (whose output the
plugins keep byte for byte: tests/fixtures/metrics/golden/).

Standard library only: a plugin runs in its own worker process (plugin_worker) or as a script, where nothing but
this checkout's py/ is on the path.
"""

import os
import re

_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?").fullmatch


class Families:
    """Samples grouped per family, families in first-seen order, each with HELP and TYPE; host on every sample."""

    def __init__(self, host):
        self.host, self.meta, self.body = host, {}, {}

    def add(self, name, kind, help_text, labels, value):
        if not _NUMBER(value):
            return  # absent or not a number: left out
        body = self.body.get(name)
        if body is None:
            self.meta[name] = f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"
            body = self.body[name] = []
        body.append(f'{name}{{host="{self.host}"{labels}}} {value}\n')

    def text(self):
        return "".join(self.meta[n] + "".join(b) for n, b in self.body.items())


def read_text(path):
    """The whole file, or None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = []
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            chunks.append(data)
    except OSError:
        return None if not chunks else b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def first_word(path):
    """The first word of the file's first line, '' when unreadable or empty (the shell plugins' readval)."""
    text = read_text(path)
    if not text:
        return ""
    words = text.split("\n", 1)[0].split()
    return words[0] if words else ""


def listing(path, prefix=""):
    """Sorted entries of a directory starting with prefix, hidden ones left out (a shell glob); [] if none."""
    try:
        return sorted(n for n in os.listdir(path) if n[0] != "." and n.startswith(prefix))
    except OSError:
        return []
