#!/usr/bin/env python3
"""Metrics exporter plugin: GPU temperature, power, clocks, memory, busy %, RAS/ECC and PCIe AER counts.

Usage: gpu_metrics_plugin.py <short hostname>

Run by the exporter engine (utils/metrics_exporter.sh) inside one long-lived worker process that calls collect()
once per cycle (py/jobkit/observe/plugin_worker.py); run as a script it prints one cycle's output and exits as the
engine would see it. Prints Prometheus text exposition, every sample labelled host="<host>" and gpu="<index>". Its
output is, byte for byte, that of the bash plugin it replaced (tests/fixtures/metrics/golden/).
  AMD:    read from sysfs (stdlib only, no command started). GPU_METRICS_ROOT prefixes /sys.
          GPUs = /sys/class/drm/card*/device with vendor 0x1002 and gpu_busy_percent or a hwmon dir;
          index = position in the sorted list of PCI addresses.
  NVIDIA: only when no AMD GPU was found and nvidia-smi is on PATH: ONE nvidia-smi call per cycle,
          mapped onto the same names; "N/A"-style values are left out. index = nvidia-smi's index.
Exit 99 (exporter never calls again) when there is no GPU: no AMD card, and nvidia-smi absent or failing
on the first call. After one good nvidia-smi call the plugin prints "# STATE nvidia", and a later
failure is a plain failure of that cycle (exit 1), not a permanent stop.

Metrics ((+) = name of our own; the rest match the reference dashboards):
  hw_gpu_temperature_celsius        hwmon temp2_input (junction), else temp3, else temp1; m°C/1000 | temperature.gpu
  hw_gpu_power_watts                hwmon power1_input, else power1_average; µW/1e6 | power.draw
  hw_gpu_clock_mhz{type=sclk|mclk}  pp_dpm_sclk / pp_dpm_mclk line marked "*", else hwmon freq1/freq2_input Hz/1e6
                                    | clocks.sm / clocks.mem
  hw_gpu_vram_used_bytes, hw_gpu_vram_total_bytes   mem_info_vram_used/_total | memory.used/.total MiB x 1048576
  hw_gpu_busy_percent (+)           gpu_busy_percent | utilization.gpu
  hw_gpu_ras_<block>_{ue,ce}_total  ras/aca_<block> or ras/<block>_err_count lines "ue: N" / "ce: N"
                                    (xgmi_wafl is named xgmi: hw_gpu_ras_{umc,xgmi,gfx,mmhub,sdma,...}_*)
  hw_gpu_pcie_correctable_total, hw_gpu_pcie_nonfatal_total, hw_gpu_pcie_fatal_total
                                    aer_dev_correctable/_nonfatal/_fatal lines TOTAL_ERR_COR/_NONFATAL/_FATAL
  hw_gpu_ecc_corrected_total, hw_gpu_ecc_uncorrected_total (+)   NVIDIA only: ecc.errors.*.volatile.total
"""

import os
import re
import shutil
import subprocess
import sys

# The shared helpers live in this checkout's py/ (a plugin runs by file path, in a worker or as a script).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "py"))
from jobkit.observe.plugin_text import Families, first_word, listing, read_text  # noqa: E402

_INT = re.compile(r"-?[0-9]+").fullmatch
_UINT = re.compile(r"[0-9]+").fullmatch
_BLOCK = re.compile(r"[a-z0-9_]+").fullmatch
_LEADING_DIGITS = re.compile(r"[0-9]*").match
DISABLE = 99
NVIDIA_QUERY = (
    "--query-gpu=index,temperature.gpu,power.draw,clocks.sm,clocks.mem,memory.used,memory.total,utilization.gpu,"
    "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total"
)
H_TEMP = "GPU temperature (junction when available), degrees C"
H_POWER = "GPU power draw, watts"
H_CLOCK = "GPU clock, MHz (sclk = shader/core, mclk = memory)"
H_USED = "GPU memory (VRAM) in use, bytes"
H_TOTAL = "GPU memory (VRAM) size, bytes"
H_BUSY = "GPU busy, percent"


def read_lines(path):
    """Stripped newline-terminated lines (a `while read -r line` loop), None when unreadable."""
    text = read_text(path)
    return None if text is None else [line.strip(" \t") for line in text.split("\n")[:-1]]


def scaled(value, digits):
    """INT / 10^DIGITS as a decimal string (45500 3 -> 45.5), '' when value is not an integer."""
    if not _INT(value):
        return ""
    neg = "-" if value[0] == "-" else ""
    v = value.lstrip("-") if neg else value
    if len(v) <= digits:
        v = "0" * (digits + 1 - len(v)) + v
    whole, frac = v[:-digits], v[-digits:].rstrip("0")
    return neg + whole + ("." + frac if frac else "")


def find_amd(sys_dir):
    """[(pci address, device dir)] of the AMD GPUs, sorted by PCI address."""
    found = []
    drm = sys_dir + "/class/drm"
    for card in listing(drm, "card"):
        if "-" in card:
            continue  # connectors (card0-DP-1)
        d = f"{drm}/{card}/device"
        if first_word(d + "/vendor") != "0x1002":
            continue
        if not (os.path.exists(d + "/gpu_busy_percent") or listing(d + "/hwmon", "hwmon")):
            continue
        pci = card
        for line in read_lines(d + "/uevent") or ():
            if line.startswith("PCI_SLOT_NAME="):
                pci = line.split("=", 1)[1]
        found.append(f"{pci} {d}")
    return [entry.split(" ", 1) for entry in sorted(found)]


def dpm_current(path):
    """MHz of the line marked "*" ("1: 2100Mhz *"), '' when none."""
    for line in read_lines(path) or ():
        if "*" in line:
            head, sep, tail = line.partition(": ")
            return _LEADING_DIGITS(tail if sep else line).group()
    return ""


def collect_amd_one(fam, d, lbl):
    hw = listing(d + "/hwmon", "hwmon")
    h = f"{d}/hwmon/{hw[0]}" if hw else ""
    if h:
        for f in ("temp2_input", "temp3_input", "temp1_input"):
            if os.access(f"{h}/{f}", os.R_OK):
                fam.add("hw_gpu_temperature_celsius", "gauge", H_TEMP, lbl, scaled(first_word(f"{h}/{f}"), 3))
                break
        for f in ("power1_input", "power1_average"):
            if os.access(f"{h}/{f}", os.R_OK):
                fam.add("hw_gpu_power_watts", "gauge", H_POWER, lbl, scaled(first_word(f"{h}/{f}"), 6))
                break
    for kind, freq in (("sclk", "freq1"), ("mclk", "freq2")):
        mhz = dpm_current(f"{d}/pp_dpm_{kind}")
        if not mhz and h:
            mhz = scaled(first_word(f"{h}/{freq}_input"), 6)
        fam.add("hw_gpu_clock_mhz", "gauge", H_CLOCK, f'{lbl},type="{kind}"', mhz)
    fam.add("hw_gpu_vram_used_bytes", "gauge", H_USED, lbl, first_word(d + "/mem_info_vram_used"))
    fam.add("hw_gpu_vram_total_bytes", "gauge", H_TOTAL, lbl, first_word(d + "/mem_info_vram_total"))
    fam.add("hw_gpu_busy_percent", "gauge", H_BUSY, lbl, first_word(d + "/gpu_busy_percent"))
    ras = listing(d + "/ras")
    for f in [n for n in ras if n.startswith("aca_")] + [n for n in ras if n.endswith("_err_count")]:
        blk = f.removeprefix("aca_").removesuffix("_err_count").removesuffix("_wafl")
        lines = read_lines(f"{d}/ras/{f}") if _BLOCK(blk) else None
        if lines is None:
            continue
        ue = ce = ""
        for line in lines:
            if line.startswith("ue:"):
                ue = line[3:]
            elif line.startswith("ce:"):
                ce = line[3:]
        fam.add(
            f"hw_gpu_ras_{blk}_ue_total",
            "counter",
            f"Uncorrectable RAS errors in the {blk} block",
            lbl,
            ue.replace(" ", ""),
        )
        fam.add(
            f"hw_gpu_ras_{blk}_ce_total",
            "counter",
            f"Correctable RAS errors in the {blk} block",
            lbl,
            ce.replace(" ", ""),
        )
    for kind, want in (
        ("correctable", "TOTAL_ERR_COR"),
        ("nonfatal", "TOTAL_ERR_NONFATAL"),
        ("fatal", "TOTAL_ERR_FATAL"),
    ):
        lines = read_lines(f"{d}/aer_dev_{kind}")
        if lines is None:
            continue
        total = ""
        for line in lines:
            words = line.split(None, 1)
            if words and words[0] == want:
                total = words[1].rstrip() if len(words) > 1 else ""
                break
        fam.add(f"hw_gpu_pcie_{kind}_total", "counter", f"PCIe AER {kind} errors reported by the GPU", lbl, total)


def collect_nvidia(fam):
    """True after one good nvidia-smi call mapped onto fam, False when it failed or printed nothing."""
    try:
        done = subprocess.run(
            ["nvidia-smi", NVIDIA_QUERY, "--format=csv,noheader,nounits"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            check=False,
        )
    except OSError:
        return False
    out = done.stdout.decode("utf-8", "replace").rstrip("\n")
    if done.returncode != 0 or not out:
        return False
    for line in out.split("\n"):
        v = [field.replace(" ", "") for field in line.split(",")]
        if v and v[-1] == "":
            v.pop()  # `IFS=, read -a` makes no empty last field
        if len(v) < 10 or not _UINT(v[0]):
            continue
        lbl = f',gpu="{v[0]}"'
        fam.add("hw_gpu_temperature_celsius", "gauge", H_TEMP, lbl, v[1])
        fam.add("hw_gpu_power_watts", "gauge", H_POWER, lbl, v[2])
        fam.add("hw_gpu_clock_mhz", "gauge", H_CLOCK, f'{lbl},type="sclk"', v[3])
        fam.add("hw_gpu_clock_mhz", "gauge", H_CLOCK, f'{lbl},type="mclk"', v[4])
        if _UINT(v[5]):
            fam.add("hw_gpu_vram_used_bytes", "gauge", H_USED, lbl, str(int(v[5]) * 1048576))
        if _UINT(v[6]):
            fam.add("hw_gpu_vram_total_bytes", "gauge", H_TOTAL, lbl, str(int(v[6]) * 1048576))
        fam.add("hw_gpu_busy_percent", "gauge", H_BUSY, lbl, v[7])
        fam.add("hw_gpu_ecc_corrected_total", "counter", "Corrected ECC errors since driver load (volatile)", lbl, v[8])
        fam.add(
            "hw_gpu_ecc_uncorrected_total", "counter", "Uncorrected ECC errors since driver load (volatile)", lbl, v[9]
        )
    return True


def collect(host, state=None):
    """One cycle's exposition text; SystemExit(99) when there is no GPU, SystemExit(1) when nvidia-smi broke."""
    sys_dir = os.environ.get("GPU_METRICS_ROOT", "") + "/sys"
    fam = Families(host)
    amd = find_amd(sys_dir)
    if amd:
        for g, (_pci, d) in enumerate(amd):
            collect_amd_one(fam, d, f',gpu="{g}"')
        return fam.text()
    if shutil.which("nvidia-smi"):
        if collect_nvidia(fam):
            return fam.text() + "# STATE nvidia\n"
        if state == "nvidia":
            raise SystemExit(1)
    raise SystemExit(DISABLE)


if __name__ == "__main__":
    if len(sys.argv) < 2 or not sys.argv[1]:
        print("Usage: gpu_metrics_plugin.py <short hostname>", file=sys.stderr)
        sys.exit(2)
    if sys.argv[1] in ("-h", "--help"):
        print("Usage: gpu_metrics_plugin.py <short hostname>")
        sys.exit(0)
    sys.stdout.write(collect(sys.argv[1], os.environ.get("_PLUGIN_STATE")))
