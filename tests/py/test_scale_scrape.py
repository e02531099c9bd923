"""bench/scale/scrape.py's own parts: the 8-GPU node's recorded page and the endpoints' pages (no Prometheus)."""

import importlib.util
import random
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("scale_scrape", REPO / "bench" / "scale" / "scrape.py")
scrape = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scrape)

PAGE = """# HELP hw_gpu_power_watts GPU power.
# TYPE hw_gpu_power_watts gauge
hw_gpu_power_watts{host="real",gpu="0"} 187.5
# TYPE hw_rdma_rx_bytes_total counter
hw_rdma_rx_bytes_total{host="real",device="mlx5_0",port="1"} 1000000
hw_exporter_cycles_total{host="real"} 2.0
"""


def values(text):
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line and not line.startswith("#")]


def test_an_endpoints_page_names_its_node_moves_counters_up_and_keeps_every_sample():
    page = scrape.Page(PAGE, "node0007", random.Random(1))
    first, second = page.render().decode(), page.render().decode()
    assert 'host="real"' not in first and first.count('host="node0007"') == 3
    assert first.count("# TYPE") == 2 and len(values(first)) == 3
    (g1, c1, k1), (g2, c2, k2) = values(first), values(second)
    assert c2 > c1 >= 1_000_000  # a big counter goes up on every scrape
    assert k2 >= k1 == 2  # a small one (error counts) never goes down
    assert abs(g2 - 187.5) < 187.5 * 0.01 and g1 != g2  # gauges move a little


def test_the_recorded_page_is_an_8_gpu_8_nic_node_from_the_real_exporter(tmp_path):
    page = scrape.record_page(tmp_path)
    gpus = set(re.findall(r'^hw_gpu_power_watts\{[^}]*gpu="(\d+)"', page, re.M))
    nics = set(re.findall(r'^hw_rdma_rx_bytes_total\{[^}]*device="([^"]+)"', page, re.M))
    assert gpus == {str(i) for i in range(8)}
    assert nics == {f"mlx5_{i}" for i in range(8)}
    assert re.search(r"^hw_exporter_cycles_total\{[^}]*\} [2-9]", page, re.M)
