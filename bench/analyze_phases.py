#!/usr/bin/env python3
"""Usage: bench/analyze_phases.py LOG PROMTOOL

Summary: where one `jobkit analyze` of LOG spends its time, each step timed in this one process (for
bench/analyze_speed.sh); nothing is written.
"""

import importlib
import json
import resource
import sys
import time
from pathlib import Path

t0 = time.perf_counter()
# imported here, not at the top, on purpose: the import (matplotlib) is the first phase timed
anomalies, build, hosts, job, report = (
    importlib.import_module(f"jobkit.analysis.{name}") for name in ("anomalies", "build", "hosts", "job", "report")
)
tsdb_dump = importlib.import_module("jobkit.observe.tsdb_dump")

phases = [("import jobkit.analysis (matplotlib)", time.perf_counter() - t0)]


def timed(name, fn, *args):
    start = time.perf_counter()
    value = fn(*args)
    phases.append((name, time.perf_counter() - start))
    return value


facts = timed("read the log (job.load)", job.load, Path(sys.argv[1]))
tsdb = str(facts.job_dir / "prometheus")
data = timed(
    "promtool tsdb dump, parsed as it streams (tsdb_dump.read)",
    tsdb_dump.read,
    tsdb,
    hosts.hosts_families(),
    sys.argv[2],
)
lines = timed("per-host lines (hosts.host_lines)", lambda: {r.key: hosts.host_lines(data, r) for r in hosts.RESOURCES})
errors = timed("error counters (hosts.error_increases)", hosts.error_increases, data)
timed("anomalies (anomalies.find)", anomalies.find, facts, lines, errors)
del lines
tsdb_dump.read = lambda *args, **kwargs: data  # build.build's own read: already timed above
result = timed("the rest of build.build (document)", build.build, facts)
timed("analysis.json (json.dumps)", lambda: json.dumps(result.doc, indent=1, allow_nan=False))
timed("report.html (report.render)", report.render, result)
for name, seconds in phases:
    print(f"  {name:<42} {seconds:7.2f} s")
print(f"  {'max RSS of this process':<42} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:7.0f} MB")
