"""Was a job's observability on? The one place that decides "RAY=1 asked for it, is there a TSDB, and why not".

A `RAY=1` job (its log header says so) starts Prometheus on rank 0 with the TSDB in `<job dir>/prometheus/`
(utils/lib/observability.sh). When that cannot happen the job trains on and its log says why, in one of two
`[observability]` lines: `metrics are off: <why> (training goes on)` (no Prometheus binary, Prometheus would not
start) or `<why>: training without observability` (no address to bind, an unsafe job dir). Every reader (the
JOB SUMMARY through `jobkit metrics-state`, `jobkit jobs`, `jobkit monitor`, `utils/prometheus.sh list`) asks
here, so they cannot disagree.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

# RAY's values that turn it on: the same test as _train.sh and _job.sbatch (`^(1|true|yes)$`).
RAY_ON = ("1", "true", "yes")
_OFF = re.compile(
    r"\[observability\] (?:\[!\] )?"
    r"(?:metrics are off: (?P<off>.*?) \(training goes on\)|(?P<init>.*?): training without observability\b.*)\s*$"
)
BLOCK_NAME = re.compile(r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$", re.IGNORECASE)  # a TSDB block dir's ULID name


def ray_asked(header: dict[str, str]) -> bool:
    """Whether the log header asked for observability (RAY=1, true or yes)."""
    return header.get("RAY", "") in RAY_ON


def off_reason(line: str) -> str | None:
    """The reason an `[observability]` LINE gives for metrics being off, else None."""
    if "[observability]" not in line:
        return None
    m = _OFF.search(line)
    if not m:
        return None
    return m.group("off") if m.group("off") is not None else f"{m.group('init')}: training without observability"


def is_tsdb(path: str) -> bool:
    """A dir holding a Prometheus TSDB: a wal/ dir or a block (ULID-named dir with meta.json), as
    utils/lib/prometheus.sh's _prom_is_tsdb. A dir that cannot be listed counts as one: "off" is never said
    of what could not be looked at (utils/prometheus.sh list says "cannot read" for it)."""
    if not os.path.isdir(path):
        return False
    if os.path.isdir(os.path.join(path, "wal")):
        return True
    try:
        names = os.listdir(path)
    except OSError:
        return True
    return any(BLOCK_NAME.match(n) and os.path.isfile(os.path.join(path, n, "meta.json")) for n in names)


@dataclass(frozen=True)
class Metrics:
    """A job's observability. asked: RAY=1; tsdb: its TSDB dir when there is one; why: the log's reason for
    metrics being off; ended: the job has ended (no TSDB by then is final)."""

    asked: bool
    tsdb: str | None
    why: str | None
    ended: bool

    @property
    def off(self) -> bool:
        """RAY=1 and no TSDB, and either the log said why or the job is over (a TSDB can no longer come)."""
        return self.asked and self.tsdb is None and (self.why is not None or self.ended)

    @property
    def word(self) -> str:
        """`on`, `off`, `-` (not asked), or `?` (running, no TSDB yet and no word on why)."""
        if not self.asked:
            return "-"
        if self.tsdb is not None:
            return "on"
        return "off" if self.off else "?"

    @property
    def reason(self) -> str:
        """Why metrics are off, for a person: the log's reason, else that it gave none."""
        return self.why or "no TSDB, and the log says no reason"

    def summary_value(self) -> str:
        """The JOB SUMMARY's `Metrics:` value: the TSDB, or `off (<reason>)`; "" for a job that did not ask."""
        if not self.asked:
            return ""
        return self.tsdb if self.tsdb is not None else f"off ({self.reason})"


def job_dir_of(log_path: str) -> str:
    """A job log's job dir: `<workspace>/<stem>.log` -> `<workspace>/<stem>` (a tagged log's dir is renamed with it)."""
    return log_path[: -len(".log")] if log_path.endswith(".log") else log_path


def state(header: dict[str, str], why: str | None, job_dir: str, ended: bool) -> Metrics:
    """The Metrics of a job whose log has HEADER and gave WHY (logparse.JobLog.metrics_off), its dir JOB_DIR."""
    asked = ray_asked(header)
    tsdb = os.path.join(job_dir, "prometheus")
    return Metrics(asked, tsdb if asked and is_tsdb(tsdb) else None, why if asked else None, ended)
