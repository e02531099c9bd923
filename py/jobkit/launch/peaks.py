"""Dense (no sparsity) peak TFLOP/s per JAX device, by accelerator and dtype.

Figures are the vendors' published dense matrix-engine peaks. Two conventions
matter for MFU and are applied throughout:

* "Per JAX device": MI250X and MI250 carry two GCDs and JAX sees each GCD as
  its own device, so their rows hold half the per-card figure. MaxText reports
  TFLOP/s per device, so this is the matching denominator.
* fp32: the FP32 *matrix* figure on AMD CDNA parts (which have FP32 matrix
  units); on NVIDIA the plain FP32 figure (TF32 tensor-core rates excluded).

A missing dtype (fp8 before Hopper / MI300) is absent from the row; callers
fall back to bf16.
"""

DTYPES = ("bf16", "fp16", "fp8", "fp32")


def _row(bf16: float, fp16: float, fp8: float | None, fp32: float) -> dict[str, float]:
    row = {"bf16": bf16, "fp16": fp16, "fp32": fp32}
    if fp8 is not None:
        row["fp8"] = fp8
    return row


# Keys are the model names as they appear inside vendor device strings
# ("AMD Instinct MI300X", "NVIDIA H100 80GB HBM3"); longest match wins, so
# "H100 PCIe" beats "H100" and "MI250X" beats "MI250".
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # AMD Instinct
    "MI355X": _row(2516.6, 2516.6, 5033.2, 157.3),
    "MI350X": _row(2306.9, 2306.9, 4613.7, 144.2),
    "MI325X": _row(1307.4, 1307.4, 2614.9, 163.4),
    "MI300X": _row(1307.4, 1307.4, 2614.9, 163.4),
    "MI300A": _row(980.6, 980.6, 1961.2, 122.6),
    "MI250X": _row(191.5, 191.5, None, 47.9),  # per GCD (card: 383)
    "MI250": _row(181.0, 181.0, None, 45.3),  # per GCD (card: 362)
    "MI210": _row(181.0, 181.0, None, 45.3),
    "MI100": _row(92.3, 184.6, None, 46.1),
    # NVIDIA
    "B300": _row(2250.0, 2250.0, 4500.0, 75.0),
    "B200": _row(2250.0, 2250.0, 4500.0, 75.0),
    "H200": _row(989.4, 989.4, 1978.9, 66.9),
    "H200 NVL": _row(835.5, 835.5, 1670.5, 60.0),
    "H100": _row(989.4, 989.4, 1978.9, 66.9),  # SXM
    "H100 NVL": _row(835.5, 835.5, 1670.5, 60.0),
    "H100 PCIe": _row(756.5, 756.5, 1513.0, 51.2),
    "H800": _row(989.4, 989.4, 1978.9, 66.9),
    "L40S": _row(362.1, 362.1, 733.0, 91.6),
    "A100": _row(312.0, 312.0, None, 19.5),
    "A800": _row(312.0, 312.0, None, 19.5),
}

# gfx target -> model, used only when rocminfo gives no marketing name.
# A gfx id names a family, so the most common training part is chosen
# (gfx90a is MI210/MI250/MI250X; gfx942 is MI300X/MI300A/MI325X).
GFX_TO_MODEL: dict[str, str] = {
    "gfx950": "MI355X",
    "gfx942": "MI300X",
    "gfx941": "MI300X",
    "gfx940": "MI300A",
    "gfx90a": "MI250X",
    "gfx908": "MI100",
}


def peak_for(model: str, dtype: str) -> tuple[float, str]:
    """Peak for `model` at `dtype`, falling back to bf16: (tflops, dtype used)."""
    row = PEAK_TFLOPS[model]
    if dtype in row:
        return row[dtype], dtype
    return row["bf16"], "bf16"


def format_row(model: str) -> str:
    """One human line: `MI300X  bf16=1307.4 fp16=1307.4 fp8=2614.9 fp32=163.4`."""
    row = PEAK_TFLOPS[model]
    cells = " ".join(f"{d}={row[d]:g}" if d in row else f"{d}=-" for d in DTYPES)
    return f"{model:<10} {cells}"
