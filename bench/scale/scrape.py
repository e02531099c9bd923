#!/usr/bin/env python3
"""Usage: bench/scale/scrape.py WORKDIR [--nodes 8,64,256,512] [--seconds 100] [--warmup 20] [--interval 5s,auto]
Summary: Live scrape at scale: the job's own Prometheus scraping N simulated 8-GPU nodes' exporter pages on loopback

1. Records one real exporter page: utils/metrics_exporter.sh with the repo's plugins (utils/plugins) runs once on
   127.0.0.1 over an 8-GPU node's tree built in WORKDIR from the recorded fixtures: 8 MI300X (the mi300x fixture's
   GPU 0 copied to 8 PCI addresses, GPU_METRICS_ROOT) and the host fixture with 8 RDMA NICs (its mlx5_0 copied to
   mlx5_0..7, HOST_METRICS_ROOT). The page is taken after the exporter's second cycle.
2. For each N: one child process (this file, --serve) listens on N ports of 127.0.0.1 and answers every GET with
   that page, host="nodeK" per port, counters advanced and gauges jittered on every scrape (so the TSDB compresses
   real-looking data, not constants); HTTP/1.0 and no gzip, like the exporter. The job's Prometheus is started by
   utils/lib/prometheus.sh's prometheus_start (the job's own config generator; --nodes N, so the interval is the
   one a job of N nodes gets) with one file_sd file of N targets. --interval: the intervals to measure, each
   a duration (passed as --scrape-interval) or "auto" (the job's own by node count; an N whose auto interval was
   measured already as a duration is not run again). Default 5s,auto: as before the rule, then with it.
3. After WARMUP s (every target up), for SECONDS s: Prometheus's CPU s/s and RSS (/proc/<pid>), samples/s
   (prometheus_tsdb_head_samples_appended_total), scrape duration (avg and max of scrape_duration_seconds over
   the window; prometheus_target_interval_length_seconds p99), WAL growth. Then Prometheus is stopped
   (prometheus_stop) and a throwaway Prometheus (jobkit.observe.promserver), on a copy of the TSDB, snapshots its head
   into a block: chunk bytes per sample and index bytes per series, the on-disk cost once the head is compacted.
   TSDB bytes/h = samples/h x chunk B/sample + series x index B/series / 2 (one index per 2 h block); WAL bytes/h
   is the WAL growth over the window x 3600/SECONDS (the WAL holds the last ~2-3 h, then is truncated).
Prints one JSON line per N on stdout (report.sh and table.py's --scrape read them), progress on stderr.
Everything binds 127.0.0.1 only, every process started is stopped by its PID, WORKDIR is left for the caller.
Not part of CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "py"))  # this checkout's jobkit
from jobkit.observe import promserver  # noqa: E402

FIX = REPO / "tests" / "fixtures" / "metrics"
PROM_LIB = REPO / "utils" / "lib" / "prometheus.sh"
GPUS, NICS = 8, 8
TICK = os.sysconf("SC_CLK_TCK")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)( \d+)?$")


def log(msg: str) -> None:
    print(f"[scrape] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(port: int, path: str, data: bytes | None = None, timeout: float = 10) -> bytes:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=timeout) as r:
        return r.read()


def query(port: int, promql: str) -> float | None:
    doc = json.loads(http(port, "/api/v1/query?query=" + urllib.request.quote(promql)))
    result = doc["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def stop_pid(proc: subprocess.Popen, grace: float = 20) -> None:
    """TERM, wait GRACE s, KILL: by the PID of a process this script started."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- the 8-GPU node and its recorded page ---------------------------------------------------------------
def build_node(root: Path) -> tuple[Path, Path]:
    """(GPU_METRICS_ROOT, HOST_METRICS_ROOT) of an 8-GPU, 8-NIC node made from the recorded fixtures."""
    gpu, host = root / "gpu", root / "host"
    src = FIX / "mi300x" / "sys" / "devices" / "pci0000:00" / "0000:00:01.1" / "0000:0c:00.0"
    for i in range(GPUS):
        pci = f"0000:{0x0C + 0x10 * i:02x}:00.0"
        dev = gpu / "sys" / "devices" / "pci0000:00" / f"0000:00:0{i + 1}.1" / pci
        shutil.copytree(src, dev, symlinks=True)
        (dev / "uevent").write_text((dev / "uevent").read_text().replace("0000:0c:00.0", pci))
        card = gpu / "sys" / "class" / "drm" / f"card{i + 1}"
        card.mkdir(parents=True)
        (card / "device").symlink_to(dev)
    shutil.copytree(FIX / "host", host, symlinks=True)
    ib = host / "sys" / "class" / "infiniband"
    shutil.rmtree(ib / "ionic_0")  # one NIC kind per node: 8 ConnectX (mlx5), as on an 8-GPU IB node
    for i in range(1, NICS):
        shutil.copytree(ib / "mlx5_0", ib / f"mlx5_{i}", symlinks=True)
    return gpu, host


def record_page(work: Path) -> str:
    gpu, host = build_node(work / "node")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_RANK", "OUTPUT_PATH", "JOB_DIR")}
    env.update(GPU_METRICS_ROOT=str(gpu), HOST_METRICS_ROOT=str(host))
    cmd = [str(REPO / "utils" / "metrics_exporter.sh"), "--address", "127.0.0.1", "--port", str(port)]
    cmd += ["--interval", "1", "--plugins-dir", str(REPO / "utils" / "plugins")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(work / "exporter.log", "w"))
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                page = http(port, "/metrics", timeout=2).decode()
                m = re.search(r"^hw_exporter_cycles_total\{[^}]*\} (\d+)", page, re.M)
                if m and int(m.group(1)) >= 2 and "hw_gpu_power_watts" in page and "hw_rdma_rx_bytes_total" in page:
                    return page
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"scrape.py: the exporter gave no page with GPU and RDMA families; see {work}/exporter.log")
    finally:
        stop_pid(proc)


# --- the N endpoints ------------------------------------------------------------------------------------
class Page:
    """One node's page as a format string. On every render a counter advances by 0.005-1.5 % of its recorded
    value (whole numbers: a small one, such as an error count, mostly stays as recorded) and a gauge lies within
    +-0.5 % of max(|recorded value|, 1) of its recorded value: real-looking data for the TSDB's compression."""

    def __init__(self, page: str, host: str, rng: random.Random):
        types: dict[str, str] = {}
        parts, self.values, self.kinds = [], [], []
        for line in page.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ", 3)
                types[name] = kind
            m = SAMPLE.match(line)
            if not line or line.startswith("#") or not m:
                parts.append(line.replace("%", "%%"))
                continue
            name, labels, value = m.group(1), m.group(2) or "", m.group(3)
            labels = re.sub(r'host="[^"]*"', f'host="{host}"', labels)
            parts.append(f"{name}{labels} ".replace("%", "%%") + "%s")
            base = name.removesuffix("_total").removesuffix("_created")
            counter = types.get(name) == "counter" or types.get(base) == "counter" or name.endswith("_total")
            try:
                v = float(value)
            except ValueError:
                v = 0.0
            self.values.append(v)
            self.kinds.append(("c" if counter else "g", max(abs(v), 1.0) * rng.uniform(1e-4, 1e-2)))
        self.fmt = "\n".join(parts) + "\n"
        self.rng = rng

    def render(self) -> bytes:
        out, r = [], self.rng.random
        for i, (kind, step) in enumerate(self.kinds):
            v = self.values[i]
            if kind == "c":
                v = self.values[i] = v + int(step * (0.5 + r()))
                out.append(int(v))
            else:
                out.append(round(v + step * (r() - 0.5), 3))
        return (self.fmt % tuple(out)).encode()


async def serve(page_file: str, n: int, ports_file: str) -> None:
    text = Path(page_file).read_text()
    rng = random.Random(24)

    def handler(page: Page):
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.readuntil(b"\r\n\r\n")
                body = page.render()
                head = f"HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {len(body)}\r\n\r\n"
                writer.write(head.encode() + body)
                await writer.drain()
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                pass
            finally:
                writer.close()

        return handle

    servers, ports = [], []
    for k in range(n):
        srv = await asyncio.start_server(handler(Page(text, f"node{k:04d}", rng)), "127.0.0.1", 0, backlog=64)
        servers.append(srv)
        ports.append(srv.sockets[0].getsockname()[1])
    Path(ports_file + ".tmp").write_text("\n".join(map(str, ports)) + "\n")
    os.replace(ports_file + ".tmp", ports_file)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


# --- one measured run -----------------------------------------------------------------------------------
def cpu_s(pid: int) -> float:
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICK


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def self_metric(port: int, name: str) -> float:
    for line in http(port, "/metrics").decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def bash_lib(script: str, *args: str) -> str:
    out = subprocess.run(
        ["bash", "-c", f"source {PROM_LIB} && {script}", "bash", *args], capture_output=True, text=True
    )
    if out.returncode:
        raise SystemExit(f"scrape.py: {script.split()[0]} failed: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout.strip()


def copy_tsdb(tsdb: Path, dest: Path) -> Path:
    """A copy of TSDB's data (a live WAL copies with at most a torn last record, which a replay drops)."""
    shutil.copytree(tsdb, dest, ignore=shutil.ignore_patterns("prometheus.*", "targets", "lock"))
    return dest


def head_block(copy: Path) -> tuple[int, int]:
    """(chunk bytes, index bytes) of the head of COPY written out as one block: a throwaway Prometheus
    (jobkit.observe.promserver: admin API behind a random password) snapshots it; the job's own is never touched."""
    server = promserver.start(str(copy), promserver.find_binary(), tries=3, admin_api=True, ready_timeout=300)
    try:
        req = server.request("/api/v1/admin/tsdb/snapshot?skip_head=false", "POST")
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=600) as resp:
            name = json.loads(resp.read())["data"]["name"]
    finally:
        server.stop(grace=60)
    snap = copy / "snapshots" / name
    chunks = sum(dir_bytes(b / "chunks") for b in snap.iterdir() if b.is_dir())
    index = sum((b / "index").stat().st_size for b in snap.iterdir() if (b / "index").exists())
    shutil.rmtree(copy)
    return chunks, index


def measure(port: int, pid: int, srv_pid: int, tsdb: Path, run: Path, n: int, every: str, seconds: int):
    """The window's row, the TSDB copied at its start, and the samples appended at its start and end."""
    appended = "prometheus_tsdb_head_samples_appended_total"
    s_a = self_metric(port, appended)
    copy_a = copy_tsdb(tsdb, run / "copy_a")
    s_a = (s_a + self_metric(port, appended)) / 2
    t0, c0, s0, w0, l0 = time.time(), cpu_s(pid), self_metric(port, appended), dir_bytes(tsdb / "wal"), loadavg()
    srv_c0 = cpu_s(srv_pid)
    time.sleep(seconds)
    t1, c1, s1, w1, l1 = time.time(), cpu_s(pid), self_metric(port, appended), dir_bytes(tsdb / "wal"), loadavg()
    srv_c1 = cpu_s(srv_pid)
    win, dt = f"{int(t1 - t0)}s", t1 - t0
    scrape = 'scrape_duration_seconds{job="exporters"}'
    row = {
        "op": "prometheus scrape",
        "nodes": n,
        "interval": every,
        "seconds": round(dt, 1),
        "series": int(self_metric(port, "prometheus_tsdb_head_series")),
        "samples_per_scrape": query(port, 'avg(scrape_samples_scraped{job="exporters"})'),
        "cpu_per_s": (c1 - c0) / dt,
        "rss_mb": status_kb(pid, "VmRSS") / 1024,
        "hwm_mb": status_kb(pid, "VmHWM") / 1024,
        "samples_per_s": (s1 - s0) / dt,
        "scrape_avg_s": query(port, f"avg(avg_over_time({scrape}[{win}]))"),
        "scrape_max_s": query(port, f"max(max_over_time({scrape}[{win}]))"),
        "interval_p99_s": query(
            port, f'max(prometheus_target_interval_length_seconds{{quantile="0.99",interval="{every}"}})'
        ),
        "wal_bytes_per_h": (w1 - w0) / dt * 3600,
        "server_cpu_per_s": (srv_c1 - srv_c0) / dt,
        "load": [l0, l1],
    }
    return row, copy_a, s_a, s1


def run_one(work: Path, page_file: Path, n: int, seconds: int, warmup: int, interval: str) -> dict:
    run = work / f"n{n}-{interval}"
    (run / "job").mkdir(parents=True)
    sd = run / "sd"
    sd.mkdir()
    ports_file = run / "ports"
    srv = subprocess.Popen([sys.executable, __file__, "--serve", str(page_file), str(n), str(ports_file)])
    prom_job = run / "job"
    started = False
    try:
        while not ports_file.exists():
            if srv.poll() is not None:
                raise SystemExit("scrape.py: the endpoint server died; see above")
            time.sleep(0.1)
        ports = ports_file.read_text().split()
        doc = [{"targets": [f"127.0.0.1:{p}"], "labels": {"host": f"node{k:04d}"}} for k, p in enumerate(ports)]
        (sd / "nodes.json").write_text(json.dumps(doc))
        opts = ["--port", str(free_port()), "--sd-dir", str(sd), "--nodes", str(n)]
        if interval != "auto":
            opts += ["--scrape-interval", interval]
        port = int(bash_lib('prometheus_start "$@"', str(prom_job), *opts))
        started = True
        tsdb = prom_job / "prometheus"
        pid = int((tsdb / "prometheus.pid").read_text())
        conf = (tsdb / "prometheus.yml").read_text()
        every = re.search(r"scrape_interval: (\S+)", conf).group(1)
        deadline = time.time() + max(warmup, 5) + 60
        time.sleep(warmup)
        while (query(port, 'count(up{job="exporters"} == 1)') or 0) < n and time.time() < deadline:
            time.sleep(1)
        up = int(query(port, 'count(up{job="exporters"} == 1)') or 0)
        row, copy_a, s_a, s1 = measure(port, pid, srv.pid, tsdb, run, n, every, seconds)
        row["up"] = up
        row["rule"] = "auto" if interval == "auto" else "fixed"
        bash_lib('prometheus_stop "$1"', str(prom_job))
        started = False
        chunks_a, _ = head_block(copy_a)
        chunks, index = head_block(copy_tsdb(tsdb, run / "copy_b"))
        # what one more sample costs in a chunk (the two blocks differ by the window's samples), plus a chunk's
        # own ~25 B (header, first timestamp and value, CRC) over the 120 samples a chunk holds when it is cut
        row["chunk_b_per_sample"] = (chunks - chunks_a) / max(s1 - s_a, 1) + 25 / 120
        row["index_b_per_series"] = index / max(row["series"], 1)
        row["tsdb_bytes_per_h"] = row["samples_per_s"] * 3600 * row["chunk_b_per_sample"] + index / 2
        return row
    finally:
        if started:
            bash_lib('prometheus_stop "$1"', str(prom_job))
        stop_pid(srv)


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        asyncio.run(serve(sys.argv[2], int(sys.argv[3]), sys.argv[4]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--nodes", default="8,64,256,512")
    ap.add_argument("--seconds", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--interval", default="5s,auto", help="scrape intervals; 'auto': the one the job picks for N nodes")
    a = ap.parse_args()
    if promserver.find_binary() is None:
        print("scrape.py: no prometheus binary on PATH; install it with 'utils/prometheus.sh install'", file=sys.stderr)
        return 2
    a.workdir.mkdir(parents=True, exist_ok=True)
    page = record_page(a.workdir)
    page_file = a.workdir / "page.prom"
    page_file.write_text(page)
    n_samples = sum(1 for line in page.splitlines() if line and not line.startswith("#"))
    log(f"recorded page: {len(page)} bytes, {n_samples} samples ({page_file})")
    for interval in a.interval.split(","):
        for n in (int(x) for x in a.nodes.split(",")):
            if interval == "auto" and bash_lib('prometheus_scrape_interval "$1"', str(n)) in a.interval.split(","):
                continue  # the job's interval for N nodes was measured already
            log(f"N={n}, interval {interval}: serving, scraping {a.warmup}+{a.seconds} s ...")
            row = run_one(a.workdir, page_file, n, a.seconds, a.warmup, interval)
            print(json.dumps(row), flush=True)
            log(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
