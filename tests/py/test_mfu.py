"""Peak table, accelerator detection (PATH stubs over recorded tool output), dtype, MFU injection."""

import io
import re
import sys
import time

import pytest
from conftest import FIXTURES, REPO, TOOLS

from jobkit.launch import gpu, mfu, mfu_stream, peaks

REQUIRED = [
    "MI210",
    "MI250",
    "MI250X",
    "MI300A",
    "MI300X",
    "MI325X",
    "MI350X",
    "MI355X",
    "A100",
    "H100",
    "H200",
    "B200",
]
# A real step line, taken from the recorded CPU run.
REAL_STEP_LINE = next(
    line
    for line in (FIXTURES / "logs" / "maxtext-cpu-tiny-20steps.log").read_text().splitlines()
    if "completed step: 2," in line
)


# ---- peak table ----------------------------------------------------------


@pytest.mark.parametrize("model", REQUIRED)
def test_every_required_accelerator_has_bf16_fp16_fp32(model):
    row = peaks.PEAK_TFLOPS[model]
    assert {"bf16", "fp16", "fp32"} <= set(row)
    assert row["fp32"] < row["bf16"]


@pytest.mark.parametrize("model", ["MI300X", "MI325X", "MI355X", "H100", "H200", "B200"])
def test_fp8_parts_have_twice_the_bf16_peak(model):
    row = peaks.PEAK_TFLOPS[model]
    assert row["fp8"] == pytest.approx(2 * row["bf16"], rel=0.01)


@pytest.mark.parametrize("model", ["A100", "MI210", "MI250", "MI250X"])
def test_pre_fp8_parts_fall_back_to_bf16(model):
    assert "fp8" not in peaks.PEAK_TFLOPS[model]
    assert peaks.peak_for(model, "fp8") == (peaks.PEAK_TFLOPS[model]["bf16"], "bf16")


def test_known_figures():
    assert peaks.peak_for("MI300X", "bf16") == (1307.4, "bf16")
    assert peaks.peak_for("H100", "fp8") == (1978.9, "fp8")
    # MI250X is two GCDs = two JAX devices: the row is per GCD.
    assert peaks.PEAK_TFLOPS["MI250X"]["bf16"] == pytest.approx(383 / 2, abs=0.1)


# ---- device-string matching ----------------------------------------------


@pytest.mark.parametrize(
    "text, model",
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA L40S", "L40S"),
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI300X VF", "MI300X"),
        ("AMD Instinct MI250X/MI250", "MI250X"),
        ("AMD Instinct MI355X", "MI355X"),
        ("NVIDIA GB200", None),  # not a B200; no row rather than a wrong one
        ("NVIDIA GeForce RTX 4070 Ti SUPER", None),
        ("Intel(R) Xeon(R) Platinum 8470", None),
        ("", None),
    ],
)
def test_match_model(text, model):
    assert gpu.match_model(text) == model


# ---- parsers on recorded output --------------------------------------------


def test_rocminfo_mi300x_skips_cpu_agent_and_uses_marketing_name():
    found = gpu.parse_rocminfo((TOOLS / "rocminfo-mi300x.txt").read_text())
    assert found == gpu.Accelerator("MI300X", "AMD Instinct MI300X", "rocminfo")


def test_rocminfo_without_marketing_name_uses_gfx_id():
    found = gpu.parse_rocminfo((TOOLS / "rocminfo-lumi-gfx90a-no-marketing-name.txt").read_text())
    assert found.model == "MI250X"
    assert found.raw == "gfx90a"


def test_rocminfo_with_only_cpu_agents_finds_nothing():
    text = (TOOLS / "rocminfo-mi300x.txt").read_text().split("Agent 3")[0]
    assert gpu.parse_rocminfo(text) is None


def test_amd_smi_json():
    found = gpu.parse_amd_smi((TOOLS / "amd-smi-static-mi210.json").read_text())
    assert found == gpu.Accelerator("MI210", "AMD Instinct MI210", "amd-smi")


@pytest.mark.parametrize(
    "fixture, model",
    [
        ("nvidia-smi-h100.txt", "H100"),
        ("nvidia-smi-a100.txt", "A100"),
        ("nvidia-smi-h200.txt", "H200"),
        ("nvidia-smi-rtx4070tisuper.txt", None),
    ],
)
def test_nvidia_smi_names(fixture, model):
    found = gpu.parse_nvidia_smi((TOOLS / fixture).read_text())
    assert found.model == model
    assert found.raw.startswith("NVIDIA ")


def test_gfx_ids():
    assert gpu.model_for_gfx("gfx950") == "MI355X"
    assert gpu.model_for_gfx("gfx942:sramecc+:xnack-") == "MI300X"
    assert gpu.model_for_gfx("gfx908") == "MI100"
    assert gpu.model_for_gfx("gfx1100") is None


# ---- detect() through PATH stubs --------------------------------------------


def test_detect_nvidia_only(tool_path):
    tool_path("nvidia-smi", TOOLS / "nvidia-smi-h100.txt")
    assert gpu.detect() == gpu.Accelerator("H100", "NVIDIA H100 80GB HBM3", "nvidia-smi")


def test_detect_prefers_rocminfo(tool_path):
    tool_path("rocminfo", TOOLS / "rocminfo-mi300x.txt")
    tool_path("nvidia-smi", TOOLS / "nvidia-smi-h100.txt")
    assert gpu.detect().model == "MI300X"


def test_detect_failing_rocminfo_falls_through_to_amd_smi(tool_path):
    tool_path("rocminfo", TOOLS / "rocminfo-mi300x.txt", rc=1)
    tool_path("amd-smi", TOOLS / "amd-smi-static-mi210.json")
    assert gpu.detect() == gpu.Accelerator("MI210", "AMD Instinct MI210", "amd-smi")


def test_detect_no_tools(tool_path):
    assert gpu.detect() is None


def test_detect_unknown_gpu_is_reported_not_guessed(tool_path):
    tool_path("nvidia-smi", TOOLS / "nvidia-smi-rtx4070tisuper.txt")
    found = gpu.detect()
    assert found.model is None and "4070" in found.raw


def test_detect_hung_tool_times_out(tool_path, monkeypatch):
    monkeypatch.setattr(gpu, "TOOL_TIMEOUT_S", 0.5)
    tool_path("rocminfo", sleep=30)
    tool_path("nvidia-smi", TOOLS / "nvidia-smi-a100.txt")
    start = time.monotonic()
    assert gpu.detect().model == "A100"
    assert time.monotonic() - start < 5


# ---- dtype --------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("bfloat16", "bf16"),
        ("bf16", "bf16"),
        ("float16", "fp16"),
        ("float32", "fp32"),
        ("fp8", "fp8"),
        ("nanoo_fp8", "fp8"),
        ("fp8_full", "fp8"),
        ("'bfloat16'", "bf16"),
        ("int8", None),
        ("", None),
        (None, None),
    ],
)
def test_normalize_dtype(raw, norm):
    assert mfu.normalize_dtype(raw) == norm


@pytest.mark.parametrize(
    "args, yml, expected",
    [
        ([], {}, "bf16"),
        (["dtype=float32"], {}, "fp32"),
        (["quantization=fp8", "dtype=float32"], {}, "fp8"),
        (["dtype=float16"], {"dtype": "float32"}, "fp16"),
        ([], {"dtype": "float32"}, "fp32"),
        ([], {"quantization": "nanoo_fp8", "dtype": "bfloat16"}, "fp8"),
        (["quantization="], {"quantization": "fp8"}, "bf16"),  # command line switches it off
        (["quantization=int8"], {}, "bf16"),
    ],
)
def test_resolve_dtype_precedence(args, yml, expected):
    assert mfu.resolve_dtype(mfu.parse_overrides(args), yml) == expected


def test_dtype_from_yml_file(tmp_path):
    yml = tmp_path / "m.yml"
    yml.write_text("base_config: base.yml\ndtype: float32\nsteps: 3\n")
    assert mfu.decide([], str(yml), env={"HARDWARE_PEAK_TFLOPS": "10"}).dtype == "fp32"
    yml.write_text("quantization: 'fp8_full'\n")
    assert mfu.decide([], str(yml), env={"HARDWARE_PEAK_TFLOPS": "10"}).dtype == "fp8"
    assert mfu.decide([], str(REPO / "configs" / "tiny.yml"), env={"HARDWARE_PEAK_TFLOPS": "10"}).dtype == "bf16"


def test_unreadable_yml_is_ignored(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("dtype: [unclosed\n")
    assert mfu.decide([], str(bad), env={"HARDWARE_PEAK_TFLOPS": "1"}).dtype == "bf16"
    assert mfu.decide([], str(tmp_path / "missing.yml"), env={"HARDWARE_PEAK_TFLOPS": "1"}).dtype == "bf16"


# ---- decide() -------------------------------------------------------------------


def _never():
    raise AssertionError("detection must not run")


def test_env_override_wins_without_detection():
    setup = mfu.decide([], None, env={"HARDWARE_PEAK_TFLOPS": "312.5"}, detect=_never)
    assert setup.peak == 312.5
    assert setup.banner() == "[MFU] tracking: gpu=- dtype=bf16 peak=312.5 TFLOP/s (source=env HARDWARE_PEAK_TFLOPS)"


@pytest.mark.parametrize("value", ["0", "auto", "AUTO", ""])
def test_env_zero_or_auto_means_detect(value):
    acc = gpu.Accelerator("MI300X", "AMD Instinct MI300X", "rocminfo")
    setup = mfu.decide([], None, env={"HARDWARE_PEAK_TFLOPS": value}, detect=lambda: acc)
    assert setup.banner() == "[MFU] tracking: gpu=MI300X dtype=bf16 peak=1307.4 TFLOP/s (source=auto)"


def test_env_garbage_is_reported_and_ignored():
    setup = mfu.decide([], None, env={"HARDWARE_PEAK_TFLOPS": "fast"}, detect=lambda: None)
    assert setup.peak is None
    assert "ignoring HARDWARE_PEAK_TFLOPS='fast'" in setup.banner()


def test_cpu_backend_is_not_reported_even_with_a_gpu_present():
    setup = mfu.decide([], None, env={"JAX_PLATFORMS": "cpu"}, detect=_never)
    assert setup.peak is None
    assert setup.banner().startswith("[MFU] not reported: CPU backend")
    assert "HARDWARE_PEAK_TFLOPS=<dense peak per device>" in setup.banner()


def test_no_accelerator_banner():
    banner = mfu.decide([], None, env={}, detect=lambda: None).banner()
    assert (
        banner
        == "[MFU] not reported: no known accelerator (set HARDWARE_PEAK_TFLOPS=<dense peak per device> to enable)"
    )


def test_unknown_accelerator_banner_names_it():
    acc = gpu.Accelerator(None, "NVIDIA GeForce RTX 4070 Ti SUPER", "nvidia-smi")
    banner = mfu.decide([], None, env={}, detect=lambda: acc).banner()
    assert "unknown accelerator 'NVIDIA GeForce RTX 4070 Ti SUPER' (via nvidia-smi)" in banner


def test_fp8_on_mi250x_falls_back_and_says_so():
    acc = gpu.Accelerator("MI250X", "gfx90a", "rocminfo")
    setup = mfu.decide(["quantization=fp8"], None, env={}, detect=lambda: acc)
    assert (setup.peak, setup.dtype) == (191.5, "bf16")
    assert "no fp8 peak for MI250X" in setup.source


def test_decide_with_stubbed_tools(tool_path, clean_env):
    tool_path("nvidia-smi", TOOLS / "nvidia-smi-h200.txt")
    setup = mfu.decide(["quantization=fp8"], None)
    assert (setup.model, setup.dtype, setup.peak) == ("H200", "fp8", 1978.9)


# ---- injection --------------------------------------------------------------------


def test_inject_real_line():
    out = mfu_stream.inject(REAL_STEP_LINE, peak=0.1)
    assert "TFLOP/s/device: 0.021, MFU: 21.00%, Tokens/s/device: 30541.637" in out
    assert out.replace(", MFU: 21.00%", "") == REAL_STEP_LINE


def test_inject_is_idempotent_and_leaves_other_text():
    once = mfu_stream.inject(REAL_STEP_LINE, 1.0)
    assert mfu_stream.inject(once, 1.0) == once
    assert mfu_stream.inject("Total TFLOPs: 0.00 \n", 1.0) == "Total TFLOPs: 0.00 \n"


def test_stream_is_line_safe_for_every_split_point():
    line = REAL_STEP_LINE + "\n"
    expected = mfu_stream.inject(line, 0.5)
    for cut in range(1, len(line)):
        sink = io.StringIO()
        stream = mfu_stream.MfuStream(sink, 0.5)
        stream.write(line[:cut])
        stream.flush()
        stream.write(line[cut:])
        assert sink.getvalue() == expected, cut


def test_stream_passes_unrelated_partial_lines_straight_through():
    sink = io.StringIO()
    stream = mfu_stream.MfuStream(sink, 1.0)
    stream.write("progress 50%")
    assert sink.getvalue() == "progress 50%"
    stream.write(" TFLOP/s/device: 2.5")  # could still grow: held
    assert sink.getvalue() == "progress 50%"
    stream.drain()
    assert sink.getvalue() == "progress 50% TFLOP/s/device: 2.5, MFU: 250.00%"


def test_stream_delegates_attributes():
    sink = io.StringIO()
    stream = mfu_stream.MfuStream(sink, 1.0)
    assert stream.isatty() is False
    assert stream.writelines(["a\n", "b\n"]) is None and sink.getvalue() == "a\nb\n"


def test_install_wraps_both_streams(monkeypatch):
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    mfu_stream.install(2.0)
    try:
        print("x TFLOP/s/device: 1.0, y")
        print("completed step: 1, seconds: 0.1, TFLOP/s/device: 0.5, Tokens", file=sys.stderr)
    finally:
        mfu_stream.uninstall()
    assert sys.stdout is out and sys.stderr is err
    assert out.getvalue() == "x TFLOP/s/device: 1.0, MFU: 50.00%, y\n"
    assert re.search(r"TFLOP/s/device: 0\.5, MFU: 25\.00%, Tokens", err.getvalue())
