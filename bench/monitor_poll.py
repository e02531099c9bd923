#!/usr/bin/env python3
"""Usage: bench/monitor_poll.py [JOBS,...] [STEPS]
Summary: What one `jobkit monitor` poll costs: CPU and wall per poll for N running jobs with STEPS-step logs

Makes a workspace of N running 2-node jobs (real-shaped logs: header, STEPS step lines per rank), a squeue
stub that lists them RUNNING (the poll's scheduler call, without a cluster's latency), then times, in
this process, the first poll (everything is news) and the mean of 5 later polls (nothing new, the cost
paid every --interval). CPU is this process's plus its children's (squeue). Defaults: 10,50,200 jobs,
2000 steps. Not part of CI.
"""

import os
import resource
import sys
import tempfile
import time
from pathlib import Path

STEP = "{r}: I1124 07:31:08.338372 1 metric_logger.py:265] completed step: {n}, seconds: 0.130, TFLOP/s/device: 0.001, Tokens/s/device: 1930.167, total_weights: 512, loss: 5.979, lm_loss: 5.979, perplexity: 394.899\n"


def make_workspace(root: Path, jobs: int, steps: int) -> Path:
    ws = root / "ws"
    ws.mkdir()
    body = "".join(STEP.format(r=r, n=n) for n in range(steps) for r in (0, 1))
    for j in range(jobs):
        head = f"JOB_ID={1000 + j}\nJOB_NAME=tiny\nNNODES=2\nJOB_NODELIST=node[1-2]\nMODEL_NAME=tiny\n"
        (ws / f"{1000 + j}-tiny.log").write_text(head + body)
    stub = root / "bin" / "squeue"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\n" + "".join(f"echo '{1000 + j}|RUNNING'\n" for j in range(jobs)))
    stub.chmod(0o755)
    os.environ["PATH"] = f"{stub.parent}:{os.environ['PATH']}"
    return ws


def cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn) -> tuple[float, float]:
    c0, w0 = cpu(), time.perf_counter()
    fn()
    return cpu() - c0, time.perf_counter() - w0


def main() -> None:
    from jobkit.ops.monitor import Monitor

    sizes = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "10,50,200").split(",")]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    print(f"{'jobs':>5} {'steps':>6} {'log MB':>7} {'first poll CPU s':>17} {'wall s':>7} {'later poll CPU s':>17} {'wall s':>7} {'CPU ms/job':>11}")
    for jobs in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            ws = make_workspace(Path(tmp), jobs, steps)
            size = sum(p.stat().st_size for p in ws.glob("*.log")) / 1e6
            mon = Monitor(ws, Path(tmp) / "state.json", [], None, stall=1e9, tgs_drop=20)
            first = timed(mon.poll)
            later = [timed(mon.poll) for _ in range(5)]
            c = sum(x[0] for x in later) / len(later)
            w = sum(x[1] for x in later) / len(later)
            print(f"{jobs:>5} {steps:>6} {size:>7.1f} {first[0]:>17.3f} {first[1]:>7.3f} {c:>17.3f} {w:>7.3f} {1000 * c / jobs:>11.2f}")


if __name__ == "__main__":
    main()
