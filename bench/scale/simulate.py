#!/usr/bin/env python3
"""Usage: bench/scale/simulate.py log|workspace|stacks|tsdb ...
Summary: Real-shaped artefacts of an N-node job for bench/scale/report.sh: its log, a TSDB, hang stacks, a workspace

  log OUT --nodes N --steps S [--status SUCCESS|HANG|none]
      The job log every rank writes into under `srun -l`: the KEY=VALUE header, every rank's start-up lines,
      MaxText's `Config param` lines (rank 0), every rank's `completed step` lines (absl timestamps, MFU field,
      1 s a step) and the JOB SUMMARY (none: a running job). Streamed: memory stays flat at any size. Also
      the job dir's step summary (OUT without .log: steps.tsv), rank 0's lines as `jobkit launch` writes it;
      --no-summary: none (a job from before it). --hole: the middle steps' lines are a sparse hole of their
      size (a 24 h log's ends, and its summary, on a small disk).
  workspace DIR --jobs J [--nodes 8] [--steps 30]
      J finished job logs side by side (what `jobkit jobs`, `dashboard` and a monitor poll read), plus a
      squeue stub in DIR/bin that lists them all RUNNING.
  stacks JOBDIR --nodes N
      What a hang leaves: hang/HANG and one py-spy-shaped stacks file per host (about 40 KB, 64 threads).
  tsdb WORKSPACE --nodes N --hours H [--id ID]
      bench/make_synthetic_job.py's TSDB (the series an 8-GPU node exports) plus its log.
Shapes follow tests/fixtures/jobkit/maxtext-2proc-srun-l.log and launch-tiny-20steps-mfu.log. Not part of CI.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
START = 1_764_000_000.0  # absl timestamps carry no year; the log's mtime is set to its end
NOOP = (
    "[NO-OP] gcs_storage dependency missing; using stubs.",
    (
        "[transformers] PyTorch was not found. Models won't be available and only tokenizers, configuration and "
        "file/data utilities can be used."
    ),
    "[NO-OP] mldiagnostics: dependency missing; using stub. (ModuleNotFoundError)",
)
CONFIG = {"steps": None, "per_device_batch_size": "4", "max_target_length": "8192", "profiler": "''"}
HOLE_HEAD, HOLE_TAIL = 300, 100  # steps written whole around a hole (the readers' head and 4 MB end at 512 ranks)
TOKENS_PER_STEP = 8 * 4 * 8192  # per device: batch 4 x 8192; one rank's line reports its own device's rate


def absl(t: float) -> str:
    lt = time.gmtime(t)
    return time.strftime("%m%d %H:%M:%S", lt) + f".{int((t % 1) * 1e6):06d}"


def header(job_id: str, name: str, nodes: int, steps: int) -> list[str]:
    names = ",".join(f"node{i + 1}" for i in range(nodes))
    return [
        f"JOB_ID={job_id}",
        f"JOB_NAME={name}",
        f"NNODES={nodes}",
        f"JOB_NODELIST=node[1-{nodes}]",
        f"NODELIST_EXPANDED={names}",
        "MODEL_NAME=llama3.1-70b",
        f"EXP_TAG=steps_{steps}",
        f'PASSTHROUGH_ARGS="steps={steps}"',
        "RAY=0",
        "== Preflight END (3s) ==",
        "== Training BEGIN (no timeout) ==",
    ]


def write_log(
    out: Path,
    nodes: int,
    steps: int,
    status: str,
    job_id: str = "900001",
    name: str = "",
    summary: bool = True,
    hole: bool = False,
) -> int:
    """Streams the log to OUT; returns its size in bytes. SUMMARY: also the job dir's step summary (beside OUT,
    OUT without .log), rank 0's lines through jobkit.core.step_summary, as `jobkit launch` on global rank 0 writes it.
    HOLE: only the first HOLE_HEAD and last HOLE_TAIL steps' lines are written, the steps between are a hole of
    their size (a sparse file: NUL bytes on reading, no disk), so a 24 h log's ends can be read on a small disk; a
    reader that scans the middle meets GBs without a newline and shows it."""
    name = name or f"scale-{nodes}n"
    tap, written = _summary_writer(out) if summary else (None, None)
    if tap is None and summary:
        print(f"simulate.py: this jobkit has no step summary: {out} gets none", file=sys.stderr)
    with open(out, "w", encoding="utf-8", buffering=8 << 20) as fh:
        fh.write("\n".join(header(job_id, name, nodes, steps)) + "\n")
        for r in range(nodes):
            fh.write("".join(f"{r}: {line}\n" for line in NOOP))
        t = START
        for key, value in CONFIG.items():
            fh.write(f"0: I{absl(t)} 140041392098176 pyconfig.py:301] Config param {key}: {value or steps}\n")
        for r in range(nodes):
            fh.write(f"{r}: I{absl(t + 30)} 140041392098176 max_utils.py:788] Memstats: After params initialized:\n")
        t += 90.0
        step_bytes = 0
        for step in range(steps):
            sec = 1.0 + 0.01 * ((step * 7919) % 13 - 6) / 6 + (20.0 if step == 0 else 0.0)
            t += sec
            ts = absl(t)
            tgs = TOKENS_PER_STEP / 8 / sec
            loss = 2.2 + 8.6 * 2.718281828 ** (-step / max(steps / 6, 1))
            tail = (
                f" metric_logger.py:265] completed step: {step}, seconds: {sec:.3f}, TFLOP/s/device: "
                f"{400 / sec:.3f}, MFU: {40 / sec:.2f}%, Tokens/s/device: {tgs:.3f}, total_weights: 262144, "
                f"loss: {loss:.3f}, lm_loss: {loss:.3f}, perplexity: {2.718281828**loss:.3f}\n"
            )
            if tap is not None:
                tap.write(f"I{ts} 140500714300000{tail}")
            if hole and HOLE_HEAD <= step < steps - HOLE_TAIL:
                if step == steps - HOLE_TAIL - 1:  # the middle's bytes, as the last whole step's size says
                    fh.flush()
                    fh.buffer.seek(step_bytes * (steps - HOLE_TAIL - HOLE_HEAD), os.SEEK_CUR)
                continue
            lines = "".join(f"{r}: I{ts} 1405007143{r:05d}{tail}" for r in range(nodes))
            step_bytes = len(lines)
            fh.write(lines)
        if status != "none":
            wall = int(t - START) + 20
            fh.write(
                f"== Training END ({wall - 10}s) ==\n==== JOB SUMMARY ====\n  Job:    {job_id} ({name})\n"
                f"  Model:  llama3.1-70b\n  Nodes:  {nodes}\n  Wall:   {wall // 3600}h {wall % 3600 // 60}m "
                f"{wall % 60}s\n  Status: {status} (exit {0 if status == 'SUCCESS' else 1})\n=====================\n"
            )
    os.utime(out, (t, t))
    if written is not None:
        written.close()
    return out.stat().st_size


class _Sink:
    def write(self, text: str) -> int:
        return len(text)


def _summary_writer(out: Path):
    """A StepTap onto the job dir's steps.tsv (a fresh one), as global rank 0's `jobkit launch` opens it."""
    try:
        from jobkit.core import step_summary  # the jobkit of this checkout (PYTHONPATH) or the measured venv's
    except ImportError:  # a jobkit from before it (SCALE_PYTHON of an older checkout), which would not read it
        return None, None

    job_dir = out.with_suffix("")
    job_dir.mkdir(exist_ok=True)
    (job_dir / step_summary.NAME).unlink(missing_ok=True)
    summary = step_summary.open_summary({"JOB_WORKSPACE": str(job_dir.parent), "JOB_DIR": job_dir.name})
    return step_summary.StepTap(_Sink(), summary), summary


def write_workspace(ws: Path, jobs: int, nodes: int, steps: int) -> None:
    ws.mkdir(parents=True, exist_ok=True)
    for j in range(jobs):
        log = ws / f"{800000 + j}-ws-{nodes}n.log"
        write_log(log, nodes, steps, "SUCCESS", str(800000 + j), f"ws-{nodes}n", summary=False)
    stub = ws / "bin" / "squeue"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text("#!/bin/sh\ncat <<'EOF'\n" + "".join(f"{800000 + j}|RUNNING\n" for j in range(jobs)) + "EOF\n")
    stub.chmod(0o755)


def write_stacks(job_dir: Path, nodes: int, job_id: str = "900001") -> None:
    hang = job_dir / "hang"
    hang.mkdir(parents=True, exist_ok=True)
    (hang / "HANG").write_text(f"training: no step for 612s after step 4211\njob={job_id}\n")
    frames = "".join(
        f"    {fn} ({mod}.py:{100 + i})\n"
        for i, (fn, mod) in enumerate([("_pjit_call_impl", "pjit"), ("train_step", "train"), ("wait", "threading")] * 6)
    )
    for r in range(nodes):
        body = "".join(f'Thread {140000 + t} (idle): "Thread-{t}"\n{frames}\n' for t in range(64))
        (hang / f"node{r + 1}.txt").write_text(f"== stacks of node{r + 1} (py-spy dump --native) ==\n{body}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="simulate.py", description=__doc__.split("\n")[1].removeprefix("Summary: "))
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("log")
    p.add_argument("out", type=Path)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--status", default="SUCCESS", choices=("SUCCESS", "HANG", "none"))
    p.add_argument("--no-summary", dest="summary", action="store_false")
    p.add_argument("--hole", action="store_true", help="a sparse middle: only the first and last steps written")
    p = sub.add_parser("workspace")
    p.add_argument("dir", type=Path)
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p = sub.add_parser("stacks")
    p.add_argument("job_dir", type=Path)
    p.add_argument("--nodes", type=int, required=True)
    p = sub.add_parser("tsdb")
    p.add_argument("workspace", type=Path)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--hours", type=float, required=True)
    p.add_argument("--id", default="424242")
    args = ap.parse_args(argv)
    if args.what == "log":
        print(write_log(args.out, args.nodes, args.steps, args.status, summary=args.summary, hole=args.hole))
    elif args.what == "workspace":
        write_workspace(args.dir, args.jobs, args.nodes, args.steps)
    elif args.what == "stacks":
        write_stacks(args.job_dir, args.nodes)
    else:
        steps = max(int(args.hours * 3600 / 5), 30)  # the synthetic job's log: a step per 5 s keeps it small
        cmd = [sys.executable, str(HERE.parent / "make_synthetic_job.py"), str(args.workspace), "--nodes",
               str(args.nodes), "--hours", str(args.hours), "--steps", str(steps), "--id", args.id]  # fmt: skip
        return subprocess.run(cmd, check=False).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
