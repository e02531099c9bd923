"""`jobkit tsdb await-scrape --port P --after EPOCH [--timeout S]`: wait until the job's own Prometheus has scraped
every active target once after EPOCH (the moment training ended), so that a job's last seconds reach its TSDB.

Prometheus scrapes each target at its own phase within the scrape interval. A job that stopped its Prometheus right
after training lost up to one interval of every target (15 s at 512 nodes): the seconds before a crash, which are
the ones a diagnosis needs. A job that lasted less than about two intervals lost whole series, since a rate needs
two samples: on a fast machine the tiny model's RAY=1 job is over in ~10 s.

Reads GET /api/v1/targets?state=active on 127.0.0.1:PORT (the job's Prometheus listens on loopback only) every
0.2 s. A target's lastScrape is the time of its last attempt, so a target that is down (its node already stopped
its exporter) counts once it was tried; nothing can keep the wait past TIMEOUT.

Exit status: 0 once every target was scraped after EPOCH, or when there is none; 1 after TIMEOUT or when the
Prometheus does not answer (one line says which); 2 for bad usage (click). Standard library only.
"""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import datetime

POLL_SECONDS = 0.2


def parse_time(text: str) -> float:
    """Prometheus's RFC 3339 time (nanoseconds, "Z" or an offset) as epoch seconds; 0 for its zero time."""
    if text.startswith("0001-01-01"):
        return 0.0
    head, dot, rest = text.partition(".")
    if dot:  # datetime takes at most microseconds
        digits = len(rest) - len(rest.lstrip("0123456789"))
        rest = rest[:digits][:6] + rest[digits:]
        text = f"{head}.{rest}"
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def active_targets(port: int, timeout: float = 2.0) -> list[dict]:
    """The active targets of the Prometheus on 127.0.0.1:PORT: [{"scrapeUrl", "lastScrape" (epoch s)}]."""
    url = f"http://127.0.0.1:{port}/api/v1/targets?state=active"
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback, fixed scheme)
        doc = json.load(response)
    return [
        {"scrapeUrl": t.get("scrapeUrl", "?"), "lastScrape": parse_time(t.get("lastScrape", "0001-01-01T00:00:00Z"))}
        for t in doc.get("data", {}).get("activeTargets", [])
    ]


def await_scrape(port: int, after: float, timeout: float) -> tuple[bool, str]:
    """(done, what to say): done once every active target's last scrape is later than AFTER (epoch s)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            late = [t["scrapeUrl"] for t in active_targets(port) if t["lastScrape"] <= after]
        except (OSError, ValueError) as exc:
            return False, f"no final scrape: the Prometheus on 127.0.0.1:{port} did not answer ({exc})"
        if not late:
            return True, ""
        if time.monotonic() >= deadline:
            shown = ", ".join(late[:3]) + (f" and {len(late) - 3} more" if len(late) > 3 else "")
            return False, f"no scrape after training ended within {timeout:g} s: {shown}"
        time.sleep(POLL_SECONDS)
