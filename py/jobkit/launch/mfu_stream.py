"""Append `, MFU: X.XX%` after every `TFLOP/s/device: <T>` written to a stream.

MaxText prints its per-step line through absl logging (stderr); wrapping both
stdout and stderr catches it wherever a MaxText version sends it. The wrapper
is line-safe: text after the last newline that could still grow into a
`TFLOP/s/device: <T>` match is held back until its line completes.
"""

import re
import sys
import threading
from typing import TextIO

MARK = "TFLOP/s/device:"
_NUMBER = r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?"
_PATTERN = re.compile(rf"{re.escape(MARK)}[ \t]*(?P<num>{_NUMBER})")
_ALREADY = re.compile(r"\s*,\s*MFU:")


def inject(text: str, peak: float) -> str:
    """Insert MFU after each TFLOP/s/device number in `text` (idempotent)."""

    def add(m: re.Match[str]) -> str:
        if _ALREADY.match(m.string, m.end()):
            return m.group(0)
        return f"{m.group(0)}, MFU: {float(m.group('num')) / peak * 100:.2f}%"

    return _PATTERN.sub(add, text) if MARK in text else text


def _may_grow_into_match(tail: str) -> bool:
    # The marker is present (its number may be cut short) or the tail ends
    # with the start of the marker.
    if MARK in tail:
        return True
    return any(tail.endswith(MARK[:n]) for n in range(1, len(MARK)))


class MfuStream:
    """A text-stream proxy; everything but write/writelines/flush is delegated."""

    def __init__(self, stream: TextIO, peak: float):
        self._stream = stream
        self._peak = peak
        self._held = ""
        self._lock = threading.Lock()

    @property
    def wrapped(self) -> TextIO:
        return self._stream

    def write(self, text: str) -> int:
        with self._lock:
            data = self._held + text
            cut = data.rfind("\n") + 1
            done, tail = data[:cut], data[cut:]
            self._held = ""
            if tail and _may_grow_into_match(tail):
                self._held, tail = tail, ""
            out = done + tail
            if out:
                self._stream.write(inject(out, self._peak))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        # A held partial line stays held: flushing it now could split a
        # step line before its number is complete.
        self._stream.flush()

    def drain(self) -> None:
        """Write out any held partial line (at exit) and flush."""
        with self._lock:
            held, self._held = self._held, ""
            if held:
                self._stream.write(inject(held, self._peak))
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def install(peak: float) -> tuple[MfuStream, MfuStream]:
    """Replace sys.stdout and sys.stderr with MFU-injecting wrappers."""
    sys.stdout = MfuStream(sys.stdout, peak)
    sys.stderr = MfuStream(sys.stderr, peak)
    return sys.stdout, sys.stderr


def uninstall() -> None:
    """Drain and restore the original streams (tests use this)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, MfuStream):
            stream.drain()
            setattr(sys, name, stream.wrapped)
