"""`jobkit image-info IMAGE`: what a training image holds that matters for a run, as a table or --json.

Steps: 1. pick the engine (podman, else docker: the first whose `info` answers); 2. load IMAGE first when it
is a tarball (as DOCKER_IMAGE=<file.tar> does); 3. `image inspect` for what the engine records (id,
creation, size, labels); 4. run image_probe.py inside a throwaway container of the image (no network, the
same host settings _container.sh uses) for Python, packages, MaxText, ROCm/RCCL, CUDA/NCCL/cuDNN, commits.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import click

from jobkit.core.errors import EXIT_BAD_INPUT, EXIT_SETUP, JobkitError
from jobkit.core.paths import UTILS_DIR
from jobkit.image import probe as image_probe

RUNTIME_LIB = UTILS_DIR / "lib" / "container_runtime.sh"
LABEL_PREFIXES = ("maxtext-launcher.", "org.opencontainers.image.", "com.amd.", "com.nvidia.")


class ImageInfoError(Exception):
    """A problem that ends the command with one line (exit code in .code)."""

    def __init__(self, message: str, code: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.code = code


def _run(argv: list[str], timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ImageInfoError(f"'{' '.join(argv[:3])} ...' did not answer within {timeout:.0f}s", EXIT_SETUP) from exc


def find_engine(wanted: str | None) -> str:
    """1. The engine: WANTED when given (it must be on PATH), else podman or docker, whichever answers first."""
    if wanted:
        if not shutil.which(wanted):
            raise ImageInfoError(f"{wanted} is not on PATH; install it or pick another with --engine", EXIT_SETUP)
        return wanted
    for engine in ("podman", "docker"):
        if shutil.which(engine) and _run([engine, "info"], timeout=30).returncode == 0:
            return engine
    raise ImageInfoError(
        "no container engine answers (podman info, docker info); install podman or start docker", EXIT_SETUP
    )


def resolve_image(engine: str, image: str) -> str:
    """2. A tarball is loaded and the name it loaded is used; anything else is taken as an image reference."""
    if not image.strip():
        raise ImageInfoError("no image given; give an image name (e.g. localhost/maxtext-cpu:latest) or a .tar")
    if Path(image).is_dir():
        raise ImageInfoError(f"{image} is a directory; give an image tarball (.tar) or an image name")
    if not image.endswith(".tar"):
        return image
    if not Path(image).is_file():
        raise ImageInfoError(f"{image} is not a file; give an image tarball or an image name")
    loaded = _run([engine, "load", "-i", image], timeout=1800)
    names = [line.split(": ", 1)[1] for line in loaded.stdout.splitlines() if line.startswith("Loaded image")]
    if loaded.returncode != 0 or not names:
        raise ImageInfoError(
            f"'{engine} load -i {image}' failed: {engine_reason(loaded.stderr)}; "
            f"give an image tarball written by '{engine} save', or an image name"
        )
    return names[-1].split(",")[0].strip()


def engine_reason(stderr: str, limit: int = 300) -> str:
    """The engine's own reason for a failure, in one line: its last `Error: ...` line (podman and docker put the
    summary there), else its last line; whole words, cut at the end rather than mid-word at the start."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith("error")]
    reason = (errors or lines or ["no output"])[-1].rstrip(":")  # podman's summary ends on the list it introduces
    return reason if len(reason) <= limit else reason[: limit - 3].rsplit(" ", 1)[0] + "..."


def inspect(engine: str, image: str) -> dict:
    """3. What the engine records about IMAGE."""
    result = _run([engine, "image", "inspect", image])
    if result.returncode != 0:
        raise ImageInfoError(
            f"image {image} is not on this host ({engine} image inspect failed); pull it, load its tarball, "
            "or build the CPU image with utils/build_image.sh"
        )
    data = json.loads(result.stdout)[0]
    config = data.get("Config") or {}
    labels = data.get("Labels") or config.get("Labels") or {}
    return {
        "id": (data.get("Id") or "")[:12],
        "created": data.get("Created"),
        "size_bytes": data.get("Size"),
        "architecture": data.get("Architecture"),
        "labels": {k: v for k, v in sorted(labels.items()) if k.startswith(LABEL_PREFIXES)},
    }


def host_run_args(engine: str) -> list[str]:
    """The `run` options this host needs (utils/lib/container_runtime.sh decides, as for training)."""
    script = 'source "$1"; container_host_run_args "$2"; n=$(container_nofile); printf "%s\\n" --ulimit "nofile=$n:$n"'
    result = _run(["bash", "-c", script, "_", str(RUNTIME_LIB), engine], timeout=60)
    return result.stdout.split() if result.returncode == 0 else []


def run_probe(engine: str, image: str) -> dict:
    """4. image_probe.py on the image's own python3 (else python), fed on stdin, in a container with no network."""
    source = Path(image_probe.__file__).read_text()
    base = [engine, "run", "--rm", "-i", "--network=none", *host_run_args(engine)]
    errors = []
    for python in ("python3", "python"):
        result = _run([*base, "--entrypoint", python, image, "-"], timeout=300, stdin=source)
        if result.returncode == 0:
            try:
                return json.loads(result.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                errors.append(f"{python}: unreadable output {result.stdout.strip()[-200:]!r}")
                continue
        errors.append(f"{python}: {result.stderr.strip()[-300:]}")
    raise ImageInfoError(f"could not run the probe in {image}: " + " | ".join(errors), EXIT_SETUP)


def collect(image: str, engine: str | None = None) -> dict:
    engine = find_engine(engine)
    reference = resolve_image(engine, image)
    info = {"image": reference, "engine": engine, **inspect(engine, reference)}
    info.update(run_probe(engine, reference))
    return info


def _size(size: int | None) -> str:
    return f"{size / 2**30:.2f} GiB" if size else "?"


def rows(info: dict) -> list[tuple[str, str]]:
    """The table: what, value. Absent versions show as '-' so a missing CUDA or ROCm is visible."""
    mt = info.get("maxtext") or {}
    maxtext = " ".join(p for p in (mt.get("version"), f"({mt['source']})" if mt.get("source") else None) if p)
    table = [
        ("image", info["image"]),
        ("id / created", f"{info.get('id') or '?'} / {info.get('created') or '?'}"),
        ("size / arch", f"{_size(info.get('size_bytes'))} / {info.get('architecture') or '?'}"),
        ("os", info.get("os") or "-"),
        ("python", f"{info['python']['version']} ({info['python']['executable']})"),
        ("maxtext", maxtext or "-"),
        ("maxtext commit", mt.get("commit") or "-"),
    ]
    table += [(name, version) for name, version in info.get("packages", {}).items() if name != "maxtext"]
    table += [(key, info.get(key) or "-") for key in ("rocm", "rccl", "cuda", "nccl", "cudnn")]
    table += [(f"label {k}", v) for k, v in info.get("labels", {}).items()]
    table += [(f"commit {k}", v) for k, v in info.get("commits", {}).items()]
    table += [(f"env {k}", v) for k, v in info.get("env", {}).items()]
    table.append(("packages seen", str(info.get("package_count", "?"))))
    return table


def format_table(info: dict) -> str:
    table = rows(info)
    width = max(len(what) for what, _ in table)
    return "\n".join(f"{what:<{width}}  {value}" for what, value in table)


@click.command("image-info")
@click.argument("image")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--engine", type=click.Choice(["podman", "docker"]), help="Container engine (default: detect).")
def command(image, as_json, engine):
    """What IMAGE (a name, or an image tarball) holds for a run: Python, JAX, MaxText, ROCm/CUDA, RCCL/NCCL."""
    try:
        info = collect(image, engine)
    except ImageInfoError as exc:
        raise JobkitError("image-info", str(exc), exc.code) from None
    click.echo(json.dumps(info, indent=2) if as_json else format_table(info))
