#!/usr/bin/env python3
"""Usage: bench/scale/measure.py WORKDIR [--nodes 8,64,256,512] [--steps 1000] [--big-steps 4000] [--jobs 5000] [--ops OP,..] [--day-steps S]
Summary: Time and peak memory of every per-job operation at N nodes, and the model fitted to them (report.sh prints it)

For each N: simulate.py's job log of N ranks x STEPS steps in a workspace of its own, then each operation as a
child process (wall time, and peak RSS from wait4): the end-of-run verdict (`jobkit tgs --line`, as
_job.sbatch runs it), `tgs`, `why`, `jobs`, `tag` (--dry-run), `metrics-state --summary` (as every job's end
runs it), `analyze` (the log part: no TSDB), `compare` (the job with itself), `dashboard`, `dashboard-hang` (the
dashboard over one failed job of N ranks that hung, with N stacks files in its job dir: its row reads them, as
`jobkit why` does; only when --ops names it), a monitor poll (the first, which reads up to READ_LIMIT of the
running log, and a steady one: once the polls have caught up with the log, the poll after one more step of
every rank),
a hang-watchdog look (CPU per look over one look's new lines: two steps of every rank), and the stacks
collection (the first watchdog counting N stacks files). Then the largest point, N=512 x BIG_STEPS, for the
log operations, and the workspace operations over JOBS finished 8-node jobs. The jobkit measured is the one
of $SCALE_PYTHON (another checkout's venv python, to compare; default this venv's, this checkout's jobkit). Each result is one JSON line on stdout.
Side by side: SCALE_BEFORE=<another checkout's py/ dir> runs each log operation first with that jobkit (its
PYTHONPATH) on the same log, just before this one, its rows marked "side": "before" (table.py shows them as
`before -> after`). --ops tgs,analyze,...: only those log operations, and nothing else (no watchdog, stacks or
workspace; the monitor's polls only when --ops names `monitor`); --ops tsdb: only analyze's TSDB part. That part
(`analyze (TSDB)`, --tsdb-nodes 8,64 x --tsdb-hours 1 by default): make_synthetic_job.py's TSDB of N 8-GPU nodes
at the job's scrape interval for N nodes (5 s up to 64, 10 s up to 256, 15 s above; --tsdb-interval another),
read as analyze reads it in a child, by PromQL through a throwaway Prometheus (after) and by `promtool tsdb
dump` or, with --tsdb-base CHECKOUT, by that checkout's PromQL read (side "before").
--day-steps 86400: the log operations also on a log of that many steps at the largest N,
written with a sparse middle (simulate.py --hole: its ends and its step summary are real, its middle a hole of
the right size), this jobkit only: it shows what a reader of a 24 h log's ends and summary costs, measured.
Not part of CI. Everything is written under WORKDIR.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
simulate = importlib.import_module("simulate")  # bench/scale/simulate.py, beside this file

PYTHON = os.environ.get("SCALE_PYTHON") or sys.executable  # its venv's editable jobkit is the one measured
BEFORE = os.environ.get("SCALE_BEFORE")  # another checkout's py/ dir, measured side by side
LOOK_S = 2.0  # the watchdog's --interval
STEP_S = 1.0  # the simulated step time


def child(cmd: list[str], env: dict | None = None) -> tuple[float, float, float, str]:
    """(wall s, peak RSS MB, CPU s, stdout) of CMD run as a child."""
    full = dict(os.environ, **(env or {}))
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - began
    if proc.returncode not in (0, 1):
        print(f"measure.py: {' '.join(cmd)} exited {proc.returncode}: {out[-500:]}", file=sys.stderr)
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, out


def jobkit(*args: str) -> list[str]:
    return [PYTHON, "-m", "jobkit", *args]


def emit(op: str, nodes: int, steps: int, wall: float, rss: float, cpu: float, **extra) -> None:
    row = {"op": op, "nodes": nodes, "steps": steps, "wall": round(wall, 3), "rss": round(rss, 1)}
    row.update({"cpu": round(cpu, 3), **extra})
    print(json.dumps(row), flush=True)


def log_ops(
    root: Path, nodes: int, steps: int, quick: bool = False, only: list[str] | None = None, hole: bool = False
) -> None:
    ws = root / f"ws-{nodes}n-{steps}s"
    ws.mkdir(parents=True)
    log = ws / f"900001-scale-{nodes}n.log"
    size = simulate.write_log(log, nodes, steps, "SUCCESS", hole=hole)
    out = root / "out"
    ops = {
        "verdict": jobkit("tgs", "--line", str(log), "--status", "SUCCESS", "--exit-code", "0"),
        "tgs": jobkit("tgs", str(log)),
        "why": jobkit("why", str(log), "--status", "FAILED", "--exit-code", "1"),
        "jobs": jobkit("jobs", "--workspace", str(ws)),
        "tag": jobkit("tag", "900001", "--workspace", str(ws), "--dry-run"),
        "metrics-state": jobkit("metrics-state", "--summary", str(log)),
        "analyze": jobkit("analyze", str(log), "--workspace", str(ws), "--output", str(out / "analysis")),
        "compare": jobkit("compare", str(log), str(log), "--workspace", str(ws), "--html", str(out / "c.html")),
        "dashboard": jobkit("dashboard", "--workspace", str(ws), "-o", str(out / "d.html")),
        "dashboard-hang": jobkit("dashboard", "--workspace", str(ws / "hang"), "-o", str(out / "dh.html")),
    }
    if only and "dashboard-hang" in only:
        hang_job(ws / "hang", nodes, steps)
    for op, cmd in ops.items():
        if op == "dashboard-hang" and not (only and op in only):
            continue
        # the big point: analyze, compare and the dashboard only when --ops names them (minutes each, before)
        if (quick and not only and op in ("analyze", "compare", "dashboard")) or (only and op not in only):
            continue
        if BEFORE and not hole:  # a reader of every line would scan the hole's GBs of NULs
            wall, rss, cpu, _ = child(cmd, {"PYTHONPATH": BEFORE})
            emit(op, nodes, steps, wall, rss, cpu, log_bytes=size, side="before")
        wall, rss, cpu, _ = child(cmd)
        emit(op, nodes, steps, wall, rss, cpu, log_bytes=size, **({"hole": True} if hole else {}))
    if (only and "monitor" not in only) or hole:
        log.unlink()
        return
    # The monitor over the same job, still running (no JOB SUMMARY): its first poll reads up to READ_LIMIT.
    running = ws / f"900002-scale-{nodes}n.log"
    simulate.write_log(running, nodes, steps, "none", job_id="900002", summary=False)
    wall, rss, cpu, text = child([PYTHON, str(HERE / "measure.py"), "--monitor", str(ws), str(nodes)])
    first, steady, catch_up = text.split()[-3:]
    emit("monitor poll (first)", nodes, steps, float(first), rss, float(first))
    emit("monitor poll (steady)", nodes, steps, float(steady), rss, float(steady), catch_up_polls=int(catch_up))
    for path in (log, running):
        path.unlink()


def hang_job(ws: Path, nodes: int, steps: int) -> None:
    """A workspace of one job of NODES ranks that hung after STEPS steps: the watchdog's HANG line and a HANG
    summary in its log, every node's stacks in its job dir."""
    ws.mkdir()
    log = ws / "900003-scale-hang.log"
    simulate.write_log(log, nodes, steps, "none", job_id="900003", name="scale-hang", summary=False)
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(
            f"0: == HANG detected (phase training, last step {steps - 1}, 612 s since) ==\n==== JOB SUMMARY ====\n"
            f"  Job:    900003 (scale-hang)\n  Nodes:  {nodes}\n  Status: HANG (exit 124)\n=====================\n"
        )
    # The recorded 2-node run's files (tests/fixtures/hang/slurm-2node-frozen-wchan): node2 stopped (T), every
    # other node waiting as its node1 does, so the row's verdict is the real one (hang@node2 from the stacks).
    rec = HERE.parent.parent / "tests" / "fixtures" / "hang" / "slurm-2node-frozen-wchan"
    hang = log.with_suffix("") / "hang"
    hang.mkdir(parents=True)
    (hang / "HANG").write_text((rec / "HANG").read_text().replace("job=333", "job=900003"))
    waiting = (rec / "node1.txt").read_text()
    for r in range(nodes):
        text = (
            (rec / "node2.txt").read_text()
            if r == 1
            else waiting.replace("node1 (rank 0):", f"node{r + 1} (rank {r}):")
        )
        (hang / f"node{r + 1}.txt").write_text(text)


def monitor_poll(ws: Path, nodes: int) -> None:
    """(In a child) the CPU seconds of the first poll, and of a steady one: the polls go on until they have read
    the whole log (each reads at most READ_LIMIT), then one step of every rank is appended and one poll timed.
    Prints both and how many polls it took to catch up."""
    from jobkit.ops.monitor import Monitor

    stub = ws / "bin" / "squeue"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text("#!/bin/sh\necho '900002|RUNNING'\n")
    stub.chmod(0o755)
    os.environ["PATH"] = f"{stub.parent}:{os.environ['PATH']}"
    mon = Monitor(ws, ws / "state.json", ["900002"], None, stall=1e9, tgs_drop=20)
    t0 = time.process_time()
    mon.poll()
    first = time.process_time() - t0
    log = ws / f"900002-scale-{nodes}n.log"
    catch_up = 1
    while (offset := mon.state["jobs"]["900002"]["offset"]) < log.stat().st_size:
        mon.poll()
        catch_up += 1
        if mon.state["jobs"]["900002"]["offset"] == offset:
            sys.exit("measure.py: a monitor poll read nothing new (a line longer than READ_LIMIT?)")
    with open(log, "a") as fh:
        fh.write("".join(_step_line(r, 10**6) for r in range(nodes)))
    t0 = time.process_time()
    mon.poll()
    steady = time.process_time() - t0
    assert mon.state["jobs"]["900002"]["offset"] == log.stat().st_size, "the steady poll read the new step whole"
    print(first, steady, catch_up)


def _step_line(rank: int, step: int) -> str:
    return (
        f"{rank}: I1124 16:18:29.991666 140500714300511 metric_logger.py:265] completed step: {step}, seconds: 1.005, "
        "TFLOP/s/device: 398.010, MFU: 39.80%, Tokens/s/device: 32604.975, total_weights: 262144, loss: 2.221, "
        "lm_loss: 2.221, perplexity: 9.221\n"
    )


def watchdog_look(root: Path, nodes: int) -> None:
    """(In a child) the CPU of one watchdog look: the new lines of LOOK_S / STEP_S steps of every rank, followed
    by rank nodes-1's watchdog (the last prefix: every other line is read and dropped). Mean over 200 looks."""
    from jobkit.ops import hang_watchdog as hw

    log = root / f"dog-{nodes}.log"
    log.write_text("")
    follower = hw.LogFollower(log)
    progress = hw.Progress(str(nodes - 1), changed_at=0.0)
    per_look = int(LOOK_S / STEP_S)
    looks, spent, step = 200, 0.0, 0
    with open(log, "a") as fh:
        for _ in range(looks):
            fh.write("".join(_step_line(r, step + k) for k in range(per_look) for r in range(nodes)))
            fh.flush()
            step += per_look
            t0 = time.process_time()
            if hasattr(follower, "feed"):
                follower.feed(progress, time.monotonic())
            else:
                for line in follower.new_lines():
                    progress.feed(line, time.monotonic())
            spent += time.process_time() - t0
    assert progress.last_step == step - 1, progress.last_step
    print(spent / looks)
    log.unlink()


def stacks(root: Path, nodes: int) -> None:
    """(In a child) the first watchdog's wait for every node's stacks: one count of hang/*.txt, and the bytes."""
    job_dir = root / f"stacks-{nodes}"
    simulate.write_stacks(job_dir, nodes)
    t0 = time.perf_counter()
    for _ in range(20):
        found = len(list((job_dir / "hang").glob("*.txt")))
    took = (time.perf_counter() - t0) / 20
    size = sum(p.stat().st_size for p in (job_dir / "hang").iterdir())
    print(took, size, found)
    subprocess.run(["rm", "-rf", str(job_dir)], check=True)


def tsdb_read(tsdb: str, via: str) -> None:
    """One read of TSDB as analyze does it (in a child, for its RSS): VIA promql (tsdb_query) or dump
    (tsdb_dump, every sample); prints series and points handed to the analysis, the step and the point budget."""
    from jobkit.analysis import hosts, tsdb_query
    from jobkit.observe import tsdb_dump

    if via == "promql":
        data, step = tsdb_query.read(tsdb)
    else:
        data, step = tsdb_dump.read(tsdb, hosts.hosts_families()), 0
    series = [s for group in data.values() for s in group]
    budget = getattr(tsdb_query, "POINT_BUDGET", 0) if via == "promql" else 0  # 0: none (a checkout before it)
    print(len(series), sum(len(s.points) for s in series), step, budget)


def scrape_interval(nodes: int) -> int:
    """The job's own scrape interval for NODES nodes, seconds (utils/lib/prometheus.sh prometheus_scrape_interval)."""
    lib = HERE.parent.parent / "utils" / "lib" / "prometheus.sh"
    out = subprocess.run(
        ["bash", "-c", 'source "$1" && prometheus_scrape_interval "$2"', "-", str(lib), str(nodes)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return int(out.strip().rstrip("s"))


def tsdb_ops(root: Path, nodes: int, hours: float, interval: int = 0, base: Path | None = None) -> None:
    """analyze's TSDB part on make_synthetic_job.py's N-node TSDB of HOURS at the job's scrape interval for N
    nodes (INTERVAL: another), read in a child by PromQL through a throwaway Prometheus (after) and, as side
    "before", by `promtool tsdb dump` or, with BASE (another checkout), by BASE's jobkit; steps = the run's
    seconds (1 s steps), so the table's fit is in node-seconds."""
    interval = interval or scrape_interval(nodes)
    ws = root / f"tsdb-{nodes}n-{hours}h-{interval}s"
    made = subprocess.run(
        [PYTHON, str(HERE.parent / "make_synthetic_job.py"), str(ws), "--nodes", str(nodes), "--hours", str(hours),
         "--steps", "200", "--id", "900003", "--interval", str(interval)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    samples = int(made.stdout.split("samples ")[1].split()[0])
    (tsdb,) = ws.glob("900003-*/prometheus")
    size = sum(p.stat().st_size for p in tsdb.rglob("*") if p.is_file())
    if base is None:
        sides = [([PYTHON, str(HERE / "measure.py"), "--tsdb", str(tsdb), "dump"], None, {"side": "before"})]
    else:
        cmd = [PYTHON, str(base / "bench" / "scale" / "measure.py"), "--tsdb", str(tsdb), "promql"]
        sides = [(cmd, {"PYTHONPATH": str(base / "py")}, {"side": "before", "base": str(base)})]
    sides.append(([PYTHON, str(HERE / "measure.py"), "--tsdb", str(tsdb), "promql"], None, {}))
    for cmd, env, side in sides:
        wall, rss, cpu, text = child(cmd, env)
        series, points, step, *budget = (int(x) for x in text.strip().splitlines()[-1].split())
        emit("analyze (TSDB)", nodes, int(hours * 3600), wall, rss, cpu, samples=samples, tsdb_bytes=size,
             series_out=series, points_out=points, step_s=step, interval_s=interval,
             point_budget=budget[0] if budget else 0, load=os.getloadavg()[0], **side)  # fmt: skip
    subprocess.run(["rm", "-rf", str(ws)], check=True)


def in_child(flag: str, *args) -> tuple[float, float, str]:
    wall, rss, _, text = child([PYTHON, str(HERE / "measure.py"), flag, *map(str, args)])
    return wall, rss, text


def main() -> int:
    if sys.argv[1:2] == ["--monitor"]:
        monitor_poll(Path(sys.argv[2]), int(sys.argv[3]))
        return 0
    if sys.argv[1:2] == ["--watchdog"]:
        watchdog_look(Path(sys.argv[2]), int(sys.argv[3]))
        return 0
    if sys.argv[1:2] == ["--tsdb"]:
        tsdb_read(sys.argv[2], sys.argv[3])
        return 0
    if sys.argv[1:2] == ["--stacks"]:
        stacks(Path(sys.argv[2]), int(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(prog="measure.py")
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--nodes", default="8,64,256,512")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--big-steps", type=int, default=4000)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--day-steps", type=int, default=0, help="also a sparse log (simulate --hole) of this many steps")
    ap.add_argument("--ops", default="", help="only these log operations (comma-separated), nothing else")
    ap.add_argument("--tsdb-nodes", default="8,64", help="node counts of analyze's TSDB part (empty: none)")
    ap.add_argument("--tsdb-hours", type=float, default=1.0)
    ap.add_argument("--tsdb-interval", type=int, default=0, help="scrape interval, s (default: the job's for N nodes)")
    ap.add_argument("--tsdb-base", type=Path, help="another checkout: its PromQL read is side 'before', not the dump")
    args = ap.parse_args()
    only = [op for op in args.ops.split(",") if op]
    if not only or "tsdb" in only:
        for nodes in [int(n) for n in args.tsdb_nodes.split(",") if n]:
            tsdb_ops(args.workdir, nodes, args.tsdb_hours, args.tsdb_interval, args.tsdb_base)
        if only == ["tsdb"]:
            return 0
    root = args.workdir
    root.mkdir(parents=True, exist_ok=True)
    nodes_list = [int(n) for n in args.nodes.split(",")]
    for nodes in nodes_list if args.steps else []:  # --steps 0: only the big and day points
        log_ops(root, nodes, args.steps, only=only)
        if only:
            continue
        _, rss, text = in_child("--watchdog", root, nodes)
        cpu = float(text.split()[-1])
        emit(
            "watchdog look",
            nodes,
            args.steps,
            cpu,
            rss,
            cpu,
            cpu_ms=round(1000 * cpu, 3),
            core_pct=round(100 * cpu / LOOK_S, 4),
        )
        _, rss, text = in_child("--stacks", root, nodes)
        took, size, _ = text.split()[-3:]
        emit("stacks collection", nodes, 0, float(took), rss, float(took), stack_bytes=int(size))
    if args.big_steps:
        log_ops(root, max(nodes_list), args.big_steps, quick=True, only=only)
    if args.day_steps:
        log_ops(root, max(nodes_list), args.day_steps, only=only, hole=True)
    if args.jobs and not only:
        ws = root / "ws-many"
        simulate.write_workspace(ws, args.jobs, 8, 30)
        for op, cmd in {
            "jobs (workspace)": jobkit("jobs", "--workspace", str(ws)),
            "dashboard (workspace)": jobkit("dashboard", "--workspace", str(ws), "-o", str(root / "dw.html")),
        }.items():
            wall, rss, cpu, _ = child(cmd)
            emit(op, 8, 30, wall, rss, cpu, jobs=args.jobs)
        subprocess.run(["rm", "-rf", str(ws)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
