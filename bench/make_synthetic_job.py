#!/usr/bin/env python3
"""Usage: bench/make_synthetic_job.py WORKSPACE [--nodes 8] [--steps 2000] [--hours 1] [--interval 5] [--id N]
Summary: A synthetic finished RAY=1 job for bench/analyze_speed.sh: a job log and a TSDB of an N-node run

Writes into WORKSPACE:
  <id>-<name>.log               a job log that parses like a real one: the KEY=VALUE header, provenance and stage
                                lines, every rank's `completed step` lines (srun -l prefix, absl timestamps,
                                steps spread evenly over the run) and the JOB SUMMARY footer (SUCCESS)
  <id>-<name>/prometheus/       a TSDB made with `promtool tsdb create-blocks-from openmetrics` (and an empty
                                wal/, as a Prometheus data dir has): every
                                --interval seconds over the run, per host the series an 8-GPU node has
                                (ray_node_* gauges; hw_net_* of 4 devices; hw_rdma_* bytes, packets and
                                error counters of 8 ports; hw_gpu_* of 8 GPUs; hw_tcp_*, pressure and
                                process gauges), labelled host, instance and job ("exporters" or "ray");
                                and the tb_* scalars of every step on node1 (what the TensorBoard bridge
                                scrapes or backfills)
The run ends 10 minutes before now, or at --end (absl timestamps carry no year: the log's mtime, set to the end,
gives it). promtool cuts blocks at 2-hour boundaries of the epoch, so a run across one is two blocks.
A few things for the analysis to find: step 60% of the way in is 4x slower while one host's CPU stands apart,
and one host's RDMA symbol error counter rises. Everything else is smooth noise (seeded: the same arguments
give the same values). Prints the job's id, the log, and the numbers of series and samples written.
No TensorBoard event files. Not part of CI.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from pathlib import Path

GPUS = 8
NET_DEVICES = ("eth0", "ib0", "ib1", "bond0")
RDMA_PORTS = tuple(f"mlx5_{i}" for i in range(8))
MB, GIB = 1e6, 1 << 30
STARTUP_S = 90.0  # first step this long after the job starts (init, compile)
TAIL_S = 20.0  # last step this long before the run's end

# Ray's per-node gauges: name -> (base, relative noise); per-GPU ones carry GpuIndex.
RAY_GAUGES = {
    "ray_node_cpu_count": (192, 0),
    "ray_node_mem_total": (2.0e12, 0),
    "ray_node_mem_available": (1.4e12, 0.01),
    "ray_node_mem_shared_bytes": (3.2e10, 0.02),
    "ray_node_disk_usage": (1.1e12, 0.001),
    "ray_node_disk_free": (2.4e12, 0.001),
    "ray_node_disk_utilization_percentage": (31.0, 0.001),
    "ray_node_disk_io_read": (4.1e11, 0.001),
    "ray_node_disk_io_write": (8.3e11, 0.001),
    "ray_node_disk_io_read_count": (2.1e7, 0.001),
    "ray_node_disk_io_write_count": (5.3e7, 0.001),
    "ray_node_disk_io_read_speed": (2.0e6, 0.5),
    "ray_node_disk_io_write_speed": (9.0e6, 0.5),
    "ray_node_disk_read_iops": (40, 0.5),
    "ray_node_disk_write_iops": (300, 0.5),
    "ray_node_network_received": (7.7e11, 0.001),
    "ray_node_network_sent": (7.5e11, 0.001),
    "ray_node_network_receive_speed": (1.2e8, 0.2),
    "ray_node_network_send_speed": (1.1e8, 0.2),
    "ray_node_gpus_available": (8, 0),
}
RAY_GPU_GAUGES = {"ray_node_gpus_utilization": (97.0, 0.02), "ray_node_gram_used": (1.6e5, 0.01)}
HOST_GAUGES = {
    "hw_procs_running": (12, 0.5),
    "hw_procs_blocked": (0.5, 1.0),
    "hw_mem_dirty_bytes": (2.0e8, 0.5),
    "hw_mem_writeback_bytes": (1.0e6, 1.0),
    "hw_io_pressure_some_pct": (0.4, 1.0),
    "hw_io_pressure_full_pct": (0.2, 1.0),
    "hw_io_pressure_some_avg300_pct": (0.3, 0.2),
    "hw_io_pressure_full_avg300_pct": (0.1, 0.2),
    "hw_memory_pressure_some_pct": (0.0, 0),
    "hw_memory_pressure_full_pct": (0.0, 0),
    "hw_memory_pressure_some_avg300_pct": (0.0, 0),
    "hw_memory_pressure_full_avg300_pct": (0.0, 0),
    "hw_gpu_user_processes": (8, 0),
    "hw_scrape_duration_seconds": (0.012, 0.3),
    "hw_plugin_up": (1, 0),
}
# Counters: family (no _total) -> increase per second (0: an error counter that stays flat).
HOST_COUNTERS = {
    "hw_context_switches": 4.0e5,
    "hw_oom_kills": 0,
    "hw_tcp_retransmits": 0,
    "hw_tcp_estab_resets": 0.02,
    "hw_tcp_out_resets": 0.05,
    "hw_tcp_listen_overflows": 0,
    "hw_tcp_listen_drops": 0,
    "hw_tcp_abort_on_timeout": 0,
    "hw_io_pressure_some_total_us": 4000,
    "hw_io_pressure_full_total_us": 2000,
    "hw_memory_pressure_some_total_us": 0,
    "hw_memory_pressure_full_total_us": 0,
    "hw_exporter_cycles": 0.2,
}
NET_COUNTERS = {
    "hw_net_rx_bytes": 1.2e8,
    "hw_net_tx_bytes": 1.1e8,
    "hw_net_rx_packets": 9.0e4,
    "hw_net_tx_packets": 8.5e4,
    "hw_net_rx_errors": 0,
    "hw_net_tx_errors": 0,
    "hw_net_rx_drop": 0,
    "hw_net_tx_drop": 0,
}
RDMA_COUNTERS = {
    "hw_rdma_rx_bytes": 2.2e10,
    "hw_rdma_tx_bytes": 2.2e10,
    "hw_rdma_rx_pkts": 5.4e6,
    "hw_rdma_tx_pkts": 5.4e6,
    "hw_rdma_rx_errors": 0,
    "hw_rdma_tx_discards": 0,
    "hw_rdma_symbol_errors": 0,
    "hw_rdma_link_downed": 0,
    "hw_rdma_tx_retx_pkts": 0,
    "hw_rdma_tx_ack_timeout": 0,
    "hw_rdma_req_rx_cqe_err": 0,
    "hw_rdma_req_tx_retry_excd_err": 0,
    "hw_rdma_rx_ecn_pkts": 30,
    "hw_rdma_rx_cnp_pkts": 25,
    "hw_rdma_tx_cnp_pkts": 25,
}
GPU_COUNTERS = ("hw_gpu_pcie_correctable", "hw_gpu_ecc_corrected", "hw_gpu_ecc_uncorrected")
# MaxText's TensorBoard scalars as the bridge names them (tb_step besides); value per step from
# (loss, step seconds, lr).
MODEL_TFLOPS_PER_STEP = 700.0
TOKENS_PER_STEP = 16384.0
TB_SCALARS = {
    "tb_learning_loss": lambda p: p["loss"],
    "tb_learning_lm_loss": lambda p: p["loss"],
    "tb_learning_perplexity": lambda p: 2.718281828 ** p["loss"],
    "tb_learning_total_weights": lambda p: 262144.0,
    "tb_learning_moe_lb_loss": lambda p: 0.01 + p["loss"] * 1e-4,
    "tb_learning_current_learning_rate": lambda p: p["lr"],
    "tb_learning_grad_norm": lambda p: p["grad"],
    "tb_learning_raw_grad_norm": lambda p: p["grad"] * 1.07,
    "tb_learning_param_norm": lambda p: 310.0 + p["step"] * 0.01,
    "tb_perf_step_time_seconds": lambda p: p["seconds"],
    "tb_perf_per_device_tflops": lambda p: MODEL_TFLOPS_PER_STEP,
    "tb_perf_per_device_tflops_per_sec": lambda p: MODEL_TFLOPS_PER_STEP / p["seconds"],
    "tb_perf_per_device_tokens": lambda p: TOKENS_PER_STEP,
    "tb_perf_per_device_tokens_per_sec": lambda p: TOKENS_PER_STEP / p["seconds"],
    "tb_learning_mfu": lambda p: 100 * MODEL_TFLOPS_PER_STEP / p["seconds"] / 989.0,
    "tb_checkpointing_save_seconds": lambda p: 0.0,
    "tb_megascale_step_seconds": lambda p: p["seconds"] * 0.98,
}


class Writer:
    """OpenMetrics text into FH, counting series and samples."""

    def __init__(self, fh):
        self.fh, self.series, self.samples = fh, 0, 0

    def family(self, name: str, kind: str):
        self.fh.write(f"# TYPE {name} {kind}\n")

    def series_of(self, name: str, labels: str, times: list[str], values):
        prefix = f"{name}{{{labels}}} "
        self.fh.writelines(f"{prefix}{v!r} {t}\n" for t, v in zip(times, values, strict=True))
        self.series += 1
        self.samples += len(times)


def gauge_values(rng: random.Random, n: int, base: float, noise: float) -> list[float]:
    if not noise:
        return [float(base)] * n
    return [round(base * (1 + noise * (rng.random() - 0.5)), 3) for _ in range(n)]


def counter_values(rng: random.Random, n: int, per_s: float, interval: float, start: float = 0.0) -> list[float]:
    out, total = [], start
    for _ in range(n):
        out.append(float(round(total)))
        total += per_s * interval * (0.8 + 0.4 * rng.random())
    return out


def plan_steps(rng: random.Random, steps: int, start: float, end: float) -> list[dict]:
    """Each step's time (rank 0's line), seconds, loss, lr and grad norm; one slow step 60% of the way."""
    weights = [1 + 0.05 * (rng.random() - 0.5) for _ in range(steps)]
    slow = int(steps * 0.6)
    weights[0] = 20.0  # the first step compiles
    if steps > 10:
        weights[slow] *= 4
    span = end - start
    unit = span / sum(weights)
    out, t = [], start
    warmup = max(steps // 20, 1)
    for i, w in enumerate(weights):
        t += w * unit
        loss = 2.2 + 8.6 * 2.718281828 ** (-i / (steps / 6)) + 0.03 * (rng.random() - 0.5)
        lr = 3e-4 * min(1.0, (i + 1) / warmup) * (1 - 0.9 * i / steps)
        grad = 0.4 + 2.5 * 2.718281828 ** (-i / (steps / 10)) + 0.05 * rng.random()
        out.append({"step": i, "time": t, "seconds": w * unit, "loss": loss, "lr": lr, "grad": grad})
    return out


def absl(t: float) -> str:
    lt = time.localtime(t)
    return time.strftime("%m%d %H:%M:%S", lt) + f".{int((t % 1) * 1e6):06d}"


def write_log(path: Path, job_id: str, name: str, nodes: int, start: float, end: float, plan: list[dict]):
    names = [f"node{i + 1}" for i in range(nodes)]
    step_tflops = MODEL_TFLOPS_PER_STEP
    lines = [
        f"JOB_ID={job_id}",
        f"JOB_NAME={name}",
        f"NNODES={nodes}",
        f"JOB_NODELIST=node[1-{nodes}]",
        f"NODELIST_EXPANDED={','.join(names)}",
        "JAX_COORDINATOR_IP=10.77.0.11",
        "JAX_COORDINATOR_PORT=40385",
        "MODEL_NAME=llama3.1-70b",
        "MODEL_NAME_ALIAS=bench",
        f"EXP_TAG=steps_{len(plan)}",
        f"PASSTHROUGH_ARGS=steps={len(plan)}",
        "RAY=1",
        "TENSORBOARD=1",
        f"JOB_WORKSPACE={path.parent}",
        "== SOURCE ==",
        "/work/main",
        "== BRANCH ==",
        "## main",
        "== COMMIT ==",
        "0000000000000000000000000000000000000000",
        "synthetic job (bench/make_synthetic_job.py)",
        time.strftime("%a %b %d %H:%M:%S %Y +0000", time.gmtime(start)) + " bench",
        "== Preflight END (3s) ==",
        "== Image pull SKIPPED (native runtime) ==",
        "== ECC check END (1s) ==",
        "== Training BEGIN (no timeout) ==",
    ]
    for r in range(nodes):
        lines.append(
            f"{r}: I{absl(start + 2 + r * 0.01)} 140500714363776 train.py:412] Starting training on {names[r]}"
        )
    for p in plan:
        for r in range(nodes):
            t = p["time"] + r * 0.0007
            sec = p["seconds"] * (1 + 0.002 * r)
            lines.append(
                f"{r}: I{absl(t)} 1405007143637{76 + r} metric_logger.py:265] completed step: {p['step']}, "
                f"seconds: {sec:.3f}, TFLOP/s/device: {step_tflops / sec:.3f}, "
                f"Tokens/s/device: {TOKENS_PER_STEP / sec:.3f}, total_weights: 262144, loss: {p['loss']:.3f}, "
                f"lm_loss: {p['loss']:.3f}, perplexity: {2.718281828 ** p['loss']:.3f}"
            )
    wall = int(end - start)
    lines += [
        f"== Training END ({wall - 10}s) ==",
        "==== JOB SUMMARY ====",
        f"  Job:    {job_id} ({name})",
        "  Model:  llama3.1-70b",
        f"  Nodes:  {nodes}",
        f"  Wall:   {wall // 3600}h {wall % 3600 // 60}m {wall % 60}s",
        "  Status: SUCCESS (exit 0)",
        "=====================",
    ]
    path.write_text("\n".join(lines) + "\n")
    os.utime(path, (end, end))


def write_openmetrics(fh, nodes: int, start: float, end: float, interval: float, plan: list[dict], seed: int):
    """Every family's series for every host, family by family (OpenMetrics groups a family's samples)."""
    rng = random.Random(seed)
    out = Writer(fh)
    n = int((end - start) // interval) + 1
    hosts = [f"node{i + 1}" for i in range(nodes)]
    # One scrape stamps all of a target's samples alike; each target scrapes at its own offset.
    times = {
        (h, job): [f"{start + k * interval + off:.3f}" for k in range(n)]
        for i, h in enumerate(hosts)
        for job, off in (("exporters", 0.113 * i % interval), ("ray", (0.071 * i + 1.7) % interval))
    }
    slow_step = plan[int(len(plan) * 0.6)] if len(plan) > 10 else None
    odd_host = hosts[min(4, nodes - 1)]  # its CPU stands apart around the slow step
    err_host = hosts[min(2, nodes - 1)]  # its mlx5_3 symbol errors rise

    def labels(h, job, extra=""):
        port = 9190 if job == "exporters" else 44217
        return f'host="{h}",instance="{h}:{port}",job="{job}"{extra}'

    # Ray: CPU and memory with a per-host shape, the rest noise around a base.
    out.family("ray_node_cpu_utilization", "gauge")
    for h in hosts:
        vals = gauge_values(rng, n, 38.0, 0.2)
        if slow_step and h == odd_host:
            for k in range(n):
                if abs(start + k * interval - slow_step["time"]) < 120:
                    vals[k] = round(96.0 + rng.random(), 3)
        out.series_of("ray_node_cpu_utilization", labels(h, "ray"), times[h, "ray"], vals)
    out.family("ray_node_mem_used", "gauge")
    for h in hosts:
        vals = [round(5.6e11 + 4e10 * k / n + 1e9 * rng.random()) * 1.0 for k in range(n)]
        out.series_of("ray_node_mem_used", labels(h, "ray"), times[h, "ray"], vals)
    for name, (base, noise) in RAY_GAUGES.items():
        out.family(name, "gauge")
        for h in hosts:
            out.series_of(name, labels(h, "ray"), times[h, "ray"], gauge_values(rng, n, base, noise))
    for name, (base, noise) in RAY_GPU_GAUGES.items():
        out.family(name, "gauge")
        for h in hosts:
            for g in range(GPUS):
                lbl = labels(h, "ray", f',GpuIndex="{g}",GpuDeviceName="NVIDIA H100 80GB HBM3"')
                out.series_of(name, lbl, times[h, "ray"], gauge_values(rng, n, base, noise))

    # Exporter: host gauges and counters.
    for name, (base, noise) in HOST_GAUGES.items():
        out.family(name, "gauge")
        for h in hosts:
            lbl = labels(h, "exporters", ',plugin="host"' if name == "hw_plugin_up" else "")
            out.series_of(name, lbl, times[h, "exporters"], gauge_values(rng, n, base, noise))
    for family, per_s in HOST_COUNTERS.items():
        out.family(family, "counter")
        for h in hosts:
            vals = counter_values(rng, n, per_s, interval, 1e9 * per_s)
            out.series_of(f"{family}_total", labels(h, "exporters"), times[h, "exporters"], vals)
    for family, per_s in NET_COUNTERS.items():
        out.family(family, "counter")
        for h in hosts:
            for dev in NET_DEVICES:
                vals = counter_values(rng, n, per_s if dev != "eth0" else per_s / 50, interval, 3e4 * per_s)
                lbl = labels(h, "exporters", f',device="{dev}"')
                out.series_of(f"{family}_total", lbl, times[h, "exporters"], vals)
    for family, per_s in RDMA_COUNTERS.items():
        out.family(family, "counter")
        for h in hosts:
            for dev in RDMA_PORTS:
                vals = counter_values(rng, n, per_s, interval, 3e4 * per_s)
                if family == "hw_rdma_symbol_errors" and h == err_host and dev == "mlx5_3":
                    vals = [float(max(0, (k - n // 2) // 10)) for k in range(n)]
                lbl = labels(h, "exporters", f',device="{dev}",port="1"')
                out.series_of(f"{family}_total", lbl, times[h, "exporters"], vals)
    out.family("hw_rdma_port_state", "gauge")
    for h in hosts:
        for dev in RDMA_PORTS:
            lbl = labels(h, "exporters", f',device="{dev}",port="1"')
            out.series_of("hw_rdma_port_state", lbl, times[h, "exporters"], [1.0] * n)

    # Exporter: GPUs.
    gpu_gauges = {
        "hw_gpu_busy_percent": (97.0, 0.04),
        "hw_gpu_vram_total_bytes": (80 * GIB, 0),
        "hw_gpu_temperature_celsius": (62.0, 0.08),
        "hw_gpu_power_watts": (640.0, 0.1),
    }
    for name, (base, noise) in gpu_gauges.items():
        out.family(name, "gauge")
        for h in hosts:
            for g in range(GPUS):
                lbl = labels(h, "exporters", f',gpu="{g}"')
                out.series_of(name, lbl, times[h, "exporters"], gauge_values(rng, n, base, noise))
    out.family("hw_gpu_vram_used_bytes", "gauge")
    for h in hosts:
        for g in range(GPUS):
            vals = [float(round(71 * GIB + 0.5 * GIB * rng.random())) for _ in range(n)]
            out.series_of("hw_gpu_vram_used_bytes", labels(h, "exporters", f',gpu="{g}"'), times[h, "exporters"], vals)
    out.family("hw_gpu_clock_mhz", "gauge")
    for h in hosts:
        for g in range(GPUS):
            for kind, base in (("sclk", 1980.0), ("mclk", 2619.0)):
                lbl = labels(h, "exporters", f',gpu="{g}",type="{kind}"')
                out.series_of("hw_gpu_clock_mhz", lbl, times[h, "exporters"], gauge_values(rng, n, base, 0.01))
    for family in GPU_COUNTERS:
        out.family(family, "counter")
        for h in hosts:
            for g in range(GPUS):
                lbl = labels(h, "exporters", f',gpu="{g}"')
                out.series_of(f"{family}_total", lbl, times[h, "exporters"], [0.0] * n)

    # TensorBoard scalars of rank 0, one sample per step at the step's time.
    tb_times = [f"{p['time']:.3f}" for p in plan]
    tb_labels = labels(hosts[0], "exporters")
    out.family("tb_step", "gauge")
    out.series_of("tb_step", tb_labels, tb_times, [float(p["step"]) for p in plan])
    for name, fn in TB_SCALARS.items():
        out.family(name, "gauge")
        out.series_of(name, tb_labels, tb_times, [float(fn(p)) for p in plan])
    fh.write("# EOF\n")
    return out.series, out.samples


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="make_synthetic_job.py",
        description=__doc__.split("\n", 3)[1].removeprefix("Summary: "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n", 3)[3],
    )
    ap.add_argument("workspace", type=Path)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--interval", type=float, default=5.0, help="scrape interval, seconds (default 5)")
    ap.add_argument("--id", default="424242", help="job id (default 424242)")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--promtool", default=os.environ.get("PROMTOOL", "promtool"))
    ap.add_argument("--end", type=int, help="when the run ended, seconds since the epoch (default: 10 minutes ago)")
    args = ap.parse_args(argv)
    if args.nodes < 1 or args.steps < 1 or args.hours <= 0 or args.interval <= 0:
        ap.error("--nodes and --steps must be 1 or more, --hours and --interval above 0")

    end = float(args.end if args.end is not None else int(time.time()) - 600)
    start = end - args.hours * 3600
    name = f"bench-synthetic-{args.nodes}node-steps_{args.steps}"
    job_dir = args.workspace / f"{args.id}-{name}"
    tsdb = job_dir / "prometheus"
    if job_dir.exists():
        ap.error(f"{job_dir} exists; pass another --id or an empty workspace")
    tsdb.mkdir(parents=True)
    rng = random.Random(args.seed)
    plan = plan_steps(rng, args.steps, start + STARTUP_S, end - TAIL_S)

    began = time.monotonic()
    om = job_dir / "synthetic.om"
    with open(om, "w", encoding="utf-8", buffering=1 << 20) as fh:
        series, samples = write_openmetrics(fh, args.nodes, start, end, args.interval, plan, args.seed)
    text_s = time.monotonic() - began
    began = time.monotonic()
    proc = subprocess.run(
        [args.promtool, "tsdb", "create-blocks-from", "openmetrics", "-q", str(om), str(tsdb)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        print(f"make_synthetic_job.py: promtool failed: {proc.stderr.strip()[-2000:]}", file=sys.stderr)
        return 1
    blocks_s = time.monotonic() - began
    # A Prometheus's data dir always has a WAL, and promtool 2.42's dump fails without one ("read WAL: find last
    # checkpoint"): an empty one, as after a clean shutdown that persisted the head into a block.
    (tsdb / "wal").mkdir(exist_ok=True)
    om_bytes = om.stat().st_size
    om.unlink()
    log = args.workspace / f"{args.id}-{name}.log"
    write_log(log, args.id, name, args.nodes, start, end, plan)
    print(f"job {args.id}: {log}")
    print(f"series {series} samples {samples} openmetrics_bytes {om_bytes} text_s {text_s:.2f} blocks_s {blocks_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
