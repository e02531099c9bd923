"""Decide, once per run, whether and against which peak MFU is reported.

MFU = MaxText's per-device TFLOP/s / dense peak TFLOP/s of this accelerator at
the run's compute dtype x 100.
"""

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from jobkit.core.config import load_yaml_keys, parse_overrides
from jobkit.launch import gpu
from jobkit.launch.peaks import peak_for

ENV_PEAK = "HARDWARE_PEAK_TFLOPS"
_HINT = f"set {ENV_PEAK}=<dense peak per device> to enable"

_ALIASES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
}


def normalize_dtype(value: object) -> str | None:
    """bfloat16 -> bf16, float32 -> fp32, any fp8 recipe -> fp8; else None."""
    text = str(value if value is not None else "").strip().strip("'\"").lower()
    if "fp8" in text:  # fp8, nanoo_fp8, fp8_full, fp8_gpu, te_fp8_*, te_mxfp8 ...
        return "fp8"
    return _ALIASES.get(text)


def resolve_dtype(overrides: Mapping[str, str], yml: Mapping) -> str:
    """Compute dtype for MFU.

    An fp8 quantization recipe decides the matmul dtype whatever `dtype` says,
    so the effective quantization (command line, else yml) is checked first;
    then the effective `dtype` (command line, else yml); bf16 is MaxText's default.
    """
    quant = overrides["quantization"] if "quantization" in overrides else yml.get("quantization")
    if normalize_dtype(quant) == "fp8":
        return "fp8"
    dtype = overrides["dtype"] if "dtype" in overrides else yml.get("dtype")
    return normalize_dtype(dtype) or "bf16"


@dataclass(frozen=True)
class MfuSetup:
    """The outcome: `peak` is None when MFU is not reported (`reason` says why)."""

    peak: float | None
    dtype: str
    model: str | None = None
    source: str = ""
    reason: str = ""

    def banner(self) -> str:
        if self.peak is None:
            return f"[MFU] not reported: {self.reason} ({_HINT})"
        return (
            f"[MFU] tracking: gpu={self.model or '-'} dtype={self.dtype} "
            f"peak={self.peak:g} TFLOP/s (source={self.source})"
        )


def _env_peak(env: Mapping[str, str]) -> tuple[float | None, str]:
    raw = env.get(ENV_PEAK, "").strip()
    if raw.lower() in ("", "0", "auto"):
        return None, ""
    try:
        value = float(raw)
    except ValueError:
        return None, f"ignoring {ENV_PEAK}={raw!r} (not a number)"
    if value <= 0 or value != value or value == float("inf"):
        return None, f"ignoring {ENV_PEAK}={raw!r} (must be > 0)"
    return value, ""


def _cpu_only(env: Mapping[str, str]) -> bool:
    platforms = [p.strip().lower() for p in env.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    return bool(platforms) and all(p == "cpu" for p in platforms)


def decide(
    args: Sequence[str],
    config_path: str | None = None,
    env: Mapping[str, str] | None = None,
    detect: Callable[[], gpu.Accelerator | None] = gpu.detect,
) -> MfuSetup:
    """MFU setup for a run given its MaxText args, its yml and the environment."""
    env = os.environ if env is None else env
    dtype = resolve_dtype(parse_overrides(args), load_yaml_keys(config_path))
    peak, env_problem = _env_peak(env)
    if peak is not None:
        return MfuSetup(peak, dtype, source=f"env {ENV_PEAK}")
    prefix = f"{env_problem}; " if env_problem else ""
    # On the CPU backend a GPU peak would be the wrong denominator.
    if _cpu_only(env):
        return MfuSetup(None, dtype, reason=f"{prefix}CPU backend (JAX_PLATFORMS={env['JAX_PLATFORMS']})")
    found = detect()
    if found is None:
        return MfuSetup(None, dtype, reason=f"{prefix}no known accelerator")
    if found.model is None:
        return MfuSetup(None, dtype, reason=f"{prefix}unknown accelerator {found.raw!r} (via {found.tool})")
    value, used = peak_for(found.model, dtype)
    source = "auto" if used == dtype else f"auto, no {dtype} peak for {found.model}, using {used}"
    return MfuSetup(value, used, found.model, source)


def mfu_percent(tflops_per_device: float, peak: float) -> float:
    """MFU in percent."""
    return tflops_per_device / peak * 100.0
