"""`jobkit image-info`: the in-image probe on recorded file shapes (ROCm, CUDA, RCCL/NCCL libraries, git
checkouts), and the command's errors. The real image is read in tests/py/test_containers.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobkit.cli import main
from jobkit.core.errors import EXIT_SETUP
from jobkit.image import info as image_info
from jobkit.image import probe as image_probe

PROBE = Path(image_probe.__file__)
REPO = Path(__file__).resolve().parents[2]


def write(root: Path, path: str, text: str = "") -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


@pytest.fixture
def rocm_root(tmp_path):
    """A ROCm image's files as ROCm 6.3 lays them out: .info/version '6.3.1-48', RCCL's versioned library."""
    write(tmp_path, "/etc/os-release", 'NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 22.04.5 LTS"\nID=ubuntu\n')
    write(tmp_path, "/opt/rocm/.info/version", "6.3.1-48\n")
    write(tmp_path, "/opt/rocm/lib/librccl.so.1.0.60301")
    write(tmp_path, "/opt/rocm/lib/librccl.so.1")
    # A MaxText source checkout on a branch whose ref lives only in packed-refs.
    write(tmp_path, "/workspace/maxtext/.git/HEAD", "ref: refs/heads/main\n")
    write(tmp_path, "/workspace/maxtext/.git/packed-refs",
          "# pack-refs with: peeled fully-peeled sorted\n"
          "1111111111111111111111111111111111111111 refs/heads/other\n"
          "0123456789abcdef0123456789abcdef01234567 refs/heads/main\n")  # fmt: skip
    write(tmp_path, "/workspace/maxtext/pyproject.toml", "[project]\nname = 'MaxText'\n")
    return tmp_path


def run_probe_script(root: Path, **env: str) -> dict:
    """The probe exactly as image-info runs it: its source on a python's stdin, JSON on stdout."""
    result = subprocess.run(
        [sys.executable, "-"],
        input=PROBE.read_text(),
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "IMAGE_PROBE_ROOT": str(root), **env},
        check=True,
    )
    return json.loads(result.stdout)


def test_rocm_image_shapes(rocm_root):
    found = run_probe_script(rocm_root, XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true",
                             MAXTEXT_COMMIT="abc123", NCCL_DEBUG="WARN", UNRELATED="x")  # fmt: skip
    assert found["os"] == "Ubuntu 22.04.5 LTS"
    assert found["rocm"] == "6.3.1-48"
    assert found["rccl"] == "1.0.60301"
    assert found["cuda"] is None and found["nccl"] is None and found["cudnn"] is None
    assert found["maxtext"] == {
        "source": "checkout /workspace/maxtext",
        "version": found["packages"].get("maxtext"),
        "commit": "0123456789abcdef0123456789abcdef01234567",
    }
    assert found["commits"] == {"MAXTEXT_COMMIT": "abc123"}
    assert found["env"] == {"NCCL_DEBUG": "WARN", "XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=true"}
    assert found["python"]["version"] == sys.version.split()[0]
    # The interpreter's own packages: this venv holds the lock's pins.
    pins = dict(line.split("==") for line in (REPO / "requirements.lock").read_text().splitlines() if "==" in line)
    assert found["packages"]["jax"] == pins["jax"] and found["packages"]["maxtext"] == pins["maxtext"]
    assert found["package_count"] >= len(pins)


def test_therock_layout_and_version_header(tmp_path):
    write(tmp_path, "/opt/rocm/core-7.14.0/.info/version", "7.14.0\n")
    assert run_probe_script(tmp_path)["rocm"] == "7.14.0"
    other = tmp_path / "hdr"
    write(other, "/opt/rocm/include/rocm-core/rocm_version.h",
          "#define ROCM_VERSION_MAJOR   6\n#define ROCM_VERSION_MINOR   4\n#define ROCM_VERSION_PATCH   1\n")  # fmt: skip
    assert run_probe_script(other)["rocm"] == "6.4.1"


def test_cuda_image_shapes(tmp_path, monkeypatch):
    # version.json as the CUDA toolkit writes it; NVIDIA's images also set NCCL_VERSION / CUDNN_VERSION.
    write(tmp_path, "/usr/local/cuda/version.json",
          json.dumps({"cuda": {"name": "CUDA SDK", "version": "12.8.1"},
                      "cuda_cudart": {"name": "CUDA Runtime (cudart)", "version": "12.8.90"}}))  # fmt: skip
    write(tmp_path, "/usr/lib/x86_64-linux-gnu/libnccl.so.2.25.1")
    write(tmp_path, "/usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5")
    monkeypatch.setenv("IMAGE_PROBE_ROOT", str(tmp_path))
    found = image_probe.probe({"CUDNN_VERSION": "9.8.0.87", "JAX_COMMIT": "deadbeef"})
    assert found["cuda"] == "12.8.1"
    assert found["nccl"] == "2.25.1", "the newest library file wins"
    assert found["cudnn"] == "9.8.0.87"
    assert found["rocm"] is None and found["rccl"] is None
    assert found["commits"] == {"JAX_COMMIT": "deadbeef"}
    # An older toolkit with only version.txt, and an image that only sets CUDA_VERSION.
    (tmp_path / "usr/local/cuda/version.json").unlink()
    write(tmp_path, "/usr/local/cuda/version.txt", "CUDA Version 11.8.0\n")
    assert image_probe.probe({})["cuda"] == "11.8.0"
    (tmp_path / "usr/local/cuda/version.txt").unlink()
    assert image_probe.probe({"CUDA_VERSION": "12.4.1"})["cuda"] == "12.4.1"
    assert image_probe.probe({"NCCL_VERSION": "2.23.4-1"})["nccl"] == "2.23.4-1"


def test_git_commit_detached_loose_and_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("IMAGE_PROBE_ROOT", str(tmp_path))
    write(tmp_path, "/src/a/.git/HEAD", "89abcdef0123456789abcdef0123456789abcdef\n")
    write(tmp_path, "/src/b/.git/HEAD", "ref: refs/heads/dev\n")
    write(tmp_path, "/src/b/.git/refs/heads/dev", "fedcba9876543210fedcba9876543210fedcba98\n")
    assert image_probe.git_commit("/src/a") == "89abcdef0123456789abcdef0123456789abcdef"
    assert image_probe.git_commit("/src/b") == "fedcba9876543210fedcba9876543210fedcba98"
    assert image_probe.git_commit("/src/none") is None


def test_table_marks_missing_versions_and_keeps_labels():
    info = {
        "image": "rocm/jax-training:x", "engine": "docker", "id": "abc", "created": "2026-01-01", "size_bytes": 2**31,
        "architecture": "amd64", "labels": {"org.opencontainers.image.revision": "r1"}, "os": "Ubuntu",
        "python": {"version": "3.12.3", "executable": "/usr/bin/python3"},
        "packages": {"jax": "0.6.0", "maxtext": "0.2.5"}, "package_count": 200,
        "maxtext": {"source": "checkout /workspace/maxtext", "version": None, "commit": "c0ffee"},
        "rocm": "6.3.1-48", "rccl": "1.0.60301", "cuda": None, "nccl": None, "cudnn": None,
        "commits": {}, "env": {"XLA_FLAGS": "--a"},
    }  # fmt: skip
    table = dict(image_info.rows(info))
    assert table["size / arch"] == "2.00 GiB / amd64"
    assert table["maxtext"] == "(checkout /workspace/maxtext)" and table["maxtext commit"] == "c0ffee"
    assert table["jax"] == "0.6.0" and "0.2.5" not in table.values(), "maxtext shows once, in its own row"
    assert table["rocm"] == "6.3.1-48" and table["cuda"] == "-"
    assert table["label org.opencontainers.image.revision"] == "r1"
    assert table["env XLA_FLAGS"] == "--a"


def test_an_image_the_engine_does_not_have_is_one_line_exit_1(tool_path):
    tool_path("podman", rc=1)
    tool_path("bash", rc=0)
    result = CliRunner().invoke(main, ["image-info", "--engine", "podman", "team/jax:1"])
    assert result.exit_code == 1
    assert result.output.strip() == (
        "jobkit image-info: image team/jax:1 is not on this host (podman image inspect failed); pull it, load its "
        "tarball, or build the CPU image with utils/build_image.sh"
    )


def test_no_engine_and_a_missing_tarball(tool_path, tmp_path):
    result = CliRunner().invoke(main, ["image-info", "x:1"])
    assert result.exit_code == EXIT_SETUP
    assert "no container engine answers" in result.output
    tool_path("podman")
    result = CliRunner().invoke(main, ["image-info", "--engine", "podman", str(tmp_path / "gone.tar")])
    assert result.exit_code == 1
    assert result.output.strip().endswith("gone.tar is not a file; give an image tarball or an image name")


def test_an_empty_name_and_a_directory_are_refused_before_the_engine_is_asked(tool_path, tmp_path):
    tool_path("podman")
    for image, said in (("", "no image given"), (str(tmp_path), f"{tmp_path} is a directory")):
        result = CliRunner().invoke(main, ["image-info", "--engine", "podman", image])
        assert result.exit_code == 1
        assert said in result.output and len(result.output.strip().splitlines()) == 1


def test_a_failed_load_names_the_engines_own_summary_not_a_cut_tail(tool_path, tmp_path):
    """podman load's stderr for a tarball that is no image (recorded shape): its summary is the `Error:` line;
    the last 300 characters of the whole text began mid-word ("ge.tar/index.json ...") and lost it."""
    stub = tool_path("podman")
    lines = [
        "Error: payload does not match any of the supported image formats:",
        f" * oci: open {tmp_path}/garbage.tar/index.json: not a directory",
        " * oci-archive: loading index: open /var/tmp/oci123/index.json: no such file or directory",
        " * docker-archive: loading tar component manifest.json: file does not exist",
        f" * dir: open {tmp_path}/garbage.tar/manifest.json: not a directory",
    ]
    stub.write_text("#!/bin/sh\nprintf '%s\\n' " + " ".join(f"'{line}'" for line in lines) + " >&2\nexit 125\n")
    (tmp_path / "garbage.tar").write_bytes(b"\x00garbage")
    result = CliRunner().invoke(main, ["image-info", "--engine", "podman", str(tmp_path / "garbage.tar")])
    assert result.exit_code == 1
    # ... and says what to give instead (bad-input img8-img10: the line ended on podman's dangling colon)
    assert result.output.strip().endswith(
        "failed: Error: payload does not match any of the supported image formats; "
        "give an image tarball written by 'podman save', or an image name"
    ), result.output
    assert len(result.output.strip().splitlines()) == 1
