"""Shared test helpers: repo paths and PATH stubs for accelerator tools."""

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PY_DIR = REPO / "py"
FIXTURES = REPO / "tests" / "fixtures"
JOBKIT_LOGS = FIXTURES / "jobkit"
TOOLS = FIXTURES / "tools"

# jobkit itself is installed (editable) in the venv that tests/run.sh sets up.


@pytest.fixture
def tool_path(tmp_path, monkeypatch):
    """Make PATH hold only stub tools; returns add(name, fixture=None, rc=0, sleep=None)."""
    bindir = tmp_path / "stub-bin"
    bindir.mkdir()
    cat, sleep_bin = shutil.which("cat"), shutil.which("sleep")
    monkeypatch.setenv("PATH", str(bindir))

    def add(name: str, fixture: Path | None = None, rc: int = 0, sleep: float | None = None) -> Path:
        lines = ["#!/bin/sh"]
        if sleep is not None:
            lines.append(f"exec {sleep_bin} {sleep}")
        if fixture is not None:
            lines.append(f"{cat} '{fixture}'")
        lines.append(f"exit {rc}")
        stub = bindir / name
        stub.write_text("\n".join(lines) + "\n")
        stub.chmod(0o755)
        return stub

    return add


@pytest.fixture
def clean_env(monkeypatch):
    """No MFU-related variables leak in from the developer's shell."""
    for name in ("HARDWARE_PEAK_TFLOPS", "JAX_PLATFORMS", "MAXTEXT_FAST_EXIT"):
        monkeypatch.delenv(name, raising=False)
    return os.environ
