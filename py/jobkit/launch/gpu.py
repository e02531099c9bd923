"""Find which accelerator this host has, from vendor tools.

Order: rocminfo (marketing name, else gfx id), amd-smi, nvidia-smi. Every tool
is optional: a missing binary, a non-zero exit or a timeout just moves on.
"""

import re
import subprocess
from dataclasses import dataclass

from jobkit.launch.peaks import GFX_TO_MODEL, PEAK_TFLOPS

TOOL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Accelerator:
    """What detection found: `model` is a PEAK_TFLOPS key or None if unknown."""

    model: str | None
    raw: str  # the device string as the tool printed it
    tool: str


def _key_pattern(key: str) -> re.Pattern[str]:
    # Not glued to a preceding letter/digit ("GB200" is not a B200) and not
    # followed by a digit ("A1000" is not an A100); a following letter is
    # allowed so "MI250X/MI250" can still be seen as containing MI250.
    body = r"[\s_-]*".join(re.escape(part) for part in key.split())
    return re.compile(rf"(?<![A-Za-z0-9]){body}(?![0-9])", re.IGNORECASE)


_KEY_PATTERNS = {key: _key_pattern(key) for key in PEAK_TFLOPS}


def match_model(text: str) -> str | None:
    """The longest known model name inside a device string, or None."""
    hits = [key for key, pat in _KEY_PATTERNS.items() if pat.search(text or "")]
    return max(hits, key=len) if hits else None


def model_for_gfx(gfx: str) -> str | None:
    """Map `gfx942` (or `gfx942:sramecc+:xnack-`) to a known model."""
    return GFX_TO_MODEL.get(gfx.split(":")[0].strip().lower())


def parse_rocminfo(text: str) -> Accelerator | None:
    """First GPU agent in `rocminfo` output; CPU agents are skipped."""
    for agent in re.split(r"^\s*Agent \d+\s*$", text, flags=re.MULTILINE)[1:]:
        fields = {}
        for line in agent.splitlines():
            key, sep, value = line.strip().partition(":")
            # First occurrence only: ISA sub-sections repeat "Name:".
            if sep and key not in fields:
                fields[key] = value.strip()
        if fields.get("Device Type") != "GPU":
            continue
        marketing, gfx = fields.get("Marketing Name", ""), fields.get("Name", "")
        model = match_model(marketing) or model_for_gfx(gfx)
        return Accelerator(model, marketing or gfx, "rocminfo")
    return None


def parse_amd_smi(text: str) -> Accelerator | None:
    """`amd-smi static --gpu 0 --asic --json`; the JSON layout varies by version."""
    name = re.search(r'"market_name"\s*:\s*"([^"]*)"', text)
    gfx = re.search(r'"target_graphics_version"\s*:\s*"(gfx[0-9a-z]+)"', text)
    if not name and not gfx:
        return None
    raw = name.group(1) if name else gfx.group(1)
    model = (match_model(name.group(1)) if name else None) or (model_for_gfx(gfx.group(1)) if gfx else None)
    return Accelerator(model, raw, "amd-smi")


def parse_nvidia_smi(text: str) -> Accelerator | None:
    """`nvidia-smi --query-gpu=name --format=csv,noheader`: one name per line."""
    for line in text.splitlines():
        if line.strip():
            return Accelerator(match_model(line), line.strip(), "nvidia-smi")
    return None


def _run(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


_PROBES = (
    (["rocminfo"], parse_rocminfo),
    (["amd-smi", "static", "--gpu", "0", "--asic", "--json"], parse_amd_smi),
    (["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], parse_nvidia_smi),
)


def detect() -> Accelerator | None:
    """The first accelerator any tool reports (known or not), else None."""
    unknown = None
    for cmd, parse in _PROBES:
        out = _run(cmd)
        found = parse(out) if out else None
        if found and found.model:
            return found
        unknown = unknown or found
    return unknown
